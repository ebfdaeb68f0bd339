"""The package's structure, checked by reading the code (pure: no network, no hosts, a few seconds).

- ruff, configured in pyproject.toml, finds nothing in envbisect/;
- every import (inside functions too) goes down the layer table of docs/architecture.md: a package
  imports only what its row's "may import" cell names;
- the limits of issue 23, as scripts/structure.py measures them: no import cycle, few private names
  imported across modules, few long functions, no long module, verdict kinds spelled as strings in
  the enum alone, no line over 120 characters.
"""
from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _load_structure():
    spec = importlib.util.spec_from_file_location("envbisect_structure", ROOT / "scripts" / "structure.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


structure = _load_structure()


@pytest.fixture(scope="module")
def measured():
    return structure.measure()


# --- the linter ------------------------------------------------------------------------------------

def _ruff() -> list[str]:
    """How to run ruff: the test extra installs it beside this Python (scripts/test.sh does)."""
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    found = shutil.which("ruff")
    if found:
        return [found]
    pytest.fail("ruff is not installed: it is in the test extra (pip install -e '.[test]', as scripts/test.sh does)")


def test_ruff_finds_nothing_in_the_package():
    p = subprocess.run([*_ruff(), "check", "--no-cache", "envbisect"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]


# --- the layer table -------------------------------------------------------------------------------

def layer_table(text: str) -> dict[str, set[str]]:
    """package -> the packages it may import, from the table under "## Layers". A row names one or
    more packages (`envbisect.errors`, `envbisect.outcome`); its last cell is "nothing", a list of
    package names, "everything above" (every package of the rows before it) or "everything"."""
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows: list[tuple[list[str], str]] = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`envbisect."):
            continue
        rows.append((re.findall(r"`envbisect\.(\w+)`", cells[0]), cells[-1]))
    allowed: dict[str, set[str]] = {}
    everything = {p for names, _ in rows for p in names}
    above: set[str] = set()
    for names, cell in rows:
        if cell == "nothing":
            may = set()
        elif cell == "everything above":
            may = set(above)
        elif cell == "everything":
            may = everything - set(names)
        else:
            may = {w.strip().strip("`") for w in cell.split(",")}
            unknown = may - everything
            assert not unknown, f"the layer table's row {names} names unknown packages {sorted(unknown)}"
        for p in names:
            allowed[p] = may
        above |= set(names)
    return allowed


def _package(module: str) -> str:
    """envbisect.runs.bisect -> runs; envbisect.errors -> errors; envbisect -> '' (the version only)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def package_imports() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> the module imports behind it, for every import of
    another envbisect package anywhere in a module's code (function bodies and TYPE_CHECKING too)."""
    modules = structure.sources()
    _graph, raw = structure.module_graph(modules)
    out: dict[tuple[str, str], list[str]] = {}
    for name, imported in raw.items():
        for target, _names in imported:
            if target != "envbisect" and not target.startswith("envbisect."):
                continue
            a, b = _package(name), _package(target)
            if b and a != b:
                out.setdefault((a, b), []).append(f"{name} imports {target}")
    return out


def test_the_layer_table_names_every_package():
    allowed = layer_table(ARCHITECTURE.read_text())
    packages = {p.stem if p.is_file() else p.name for p in (ROOT / "envbisect").iterdir()
                if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
    packages.discard("__main__")
    missing = packages - set(allowed) - {"sim"}
    assert not missing, f"docs/architecture.md's layer table has no row for {sorted(missing)}"


def test_every_import_goes_down_the_layer_table():
    allowed = layer_table(ARCHITECTURE.read_text())
    allowed["sim"] = set()  # the simulated deployment: only the demo (cli) imports it
    wrong = []
    for (a, b), where in sorted(package_imports().items()):
        if b == "sim":
            if a != "cli":
                wrong.extend(where)
        elif b not in allowed.get(a, set()):
            wrong.extend(f"{w} ({a} may import: {', '.join(sorted(allowed.get(a, ()))) or 'nothing'})"
                         for w in where)
    assert not wrong, "imports against docs/architecture.md's layer table:\n" + "\n".join(wrong)


def test_the_layer_check_sees_imports_inside_functions(tmp_path):
    """The reader the layer check stands on finds an import in a function body, as one of bisect's."""
    tree = structure.ast.parse("def f():\n    from envbisect.report.bundle import make_bundle\n")
    modules = {"envbisect.runs.x": tmp_path / "x.py", "envbisect.report.bundle": tmp_path / "bundle.py"}
    assert structure.imports_of("envbisect.runs.x", tree, modules) == [("envbisect.report.bundle", ["make_bundle"])]


def test_the_agent_scripts_import_nothing_of_the_package():
    """hosts/agent/*.py run alone on a host's python3: stdlib only."""
    wrong = []
    for path in sorted((ROOT / "envbisect" / "hosts" / "agent").glob("*.py")):
        for node in structure.ast.walk(structure.ast.parse(path.read_text(), str(path))):
            mods = ([a.name for a in node.names] if isinstance(node, structure.ast.Import) else
                    [node.module or ""] if isinstance(node, structure.ast.ImportFrom) and not node.level else [])
            wrong.extend(f"{path.name}: {m}" for m in mods if m == "envbisect" or m.startswith("envbisect."))
    assert not wrong, wrong


# --- the limits of issue 23 ------------------------------------------------------------------------

LIMITS = structure.LIMITS


def test_no_import_cycle(measured):
    assert measured.cycles == [], measured.cycles


def test_few_private_names_are_imported_across_modules(measured):
    assert len(measured.private_imports) <= LIMITS["private_imports"], "\n".join(measured.private_imports)


def test_few_functions_are_over_80_lines(measured):
    assert len(measured.long_functions) <= LIMITS["long_functions"], "\n".join(measured.long_functions)


def test_no_module_is_over_700_lines(measured):
    # structure.py skips envbisect/sim (the simulator) and hosts/agent (scripts sent to hosts alone)
    assert measured.long_modules == [], measured.long_modules


def test_verdict_kinds_are_spelled_in_the_enum_alone(measured):
    assert len(measured.verdict_modules) <= LIMITS["verdict_modules"], measured.verdict_modules


def test_no_line_is_over_120_characters(measured):
    assert measured.long_lines == [], "\n".join(measured.long_lines)


def test_the_url_helpers_have_one_home():
    """split_url, fetch and health_ok live in hosts/urls.py, beside bounded_http, and are imported from there
    (the simulator, envbisect/sim, is test scaffolding with names of its own)."""
    helpers, wrong = {"split_url", "fetch", "health_ok"}, []
    for path in sorted((ROOT / "envbisect").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("envbisect/sim/"):
            continue
        for node in structure.ast.walk(structure.ast.parse(path.read_text(), rel)):
            ast = structure.ast
            if isinstance(node, ast.FunctionDef) and node.name in helpers and rel != "envbisect/hosts/urls.py":
                wrong.append(f"{rel}: defines {node.name}")
            if isinstance(node, structure.ast.ImportFrom) and node.module and node.module != "envbisect.hosts.urls" \
                    and node.module.startswith("envbisect.") and helpers & {a.name for a in node.names}:
                wrong.append(f"{rel}: imports {sorted(helpers & {a.name for a in node.names})} from {node.module}")
    assert not wrong, wrong


def test_bounded_http_reaches_httpx_and_httpcore_through_their_public_api():
    """No `obj._name` on an object not its own (httpx's client `_transport`/`_mounts`, a pool's backend)."""
    path = ROOT / "envbisect" / "hosts" / "bounded_http.py"
    ast = structure.ast
    private = [f"line {n.lineno}: .{n.attr}" for n in ast.walk(ast.parse(path.read_text()))
               if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__")
               and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "_deadline"))]
    assert not private, private


# a file name used in two rooms, and why it may be for now
SHARED_FILE_NAMES = {"symptom.py": "runs/ and trials/: renamed after the verdict work (issue 36) lands"}


def test_no_file_name_appears_in_two_rooms():
    """A module's file name says what it is once in the package (Python's own __init__/__main__ aside)."""
    rooms: dict[str, list[str]] = {}
    for path in sorted((ROOT / "envbisect").rglob("*.py")):
        if not (path.name.startswith("__") and path.name.endswith("__.py")):
            rooms.setdefault(path.name, []).append(path.relative_to(ROOT / "envbisect").as_posix())
    twice = {name: where for name, where in rooms.items() if len(where) > 1 and name not in SHARED_FILE_NAMES}
    assert not twice, twice
    assert all(len(rooms.get(name, ())) > 1 for name in SHARED_FILE_NAMES), "a name allowed twice is unique now"
