#!/usr/bin/env python3
"""Measure the package's structure, as issue 23 counts it: import cycles, private names imported
across modules, long functions, long modules, verdict kinds spelled as strings, long lines.

    python scripts/structure.py            # the counts and every offender
    python scripts/structure.py --json     # the same, for tests and scripts

It reads the source with ``ast`` (imports inside functions count too) and skips ``envbisect/sim``
and the agent scripts, which are sent to hosts alone.
"""

from __future__ import annotations

import ast
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "envbisect"
SKIPPED = ("envbisect/sim/", "envbisect/hosts/agent/")
VERDICT_KINDS = ("culprit", "interaction", "not-config", "not-reproduced", "inconclusive")
LIMITS = {"long_functions": 5, "private_imports": 5, "module_lines": 700, "function_lines": 80,
          "verdict_modules": 2, "line_length": 120}


@dataclass
class Structure:
    cycles: list[list[str]] = field(default_factory=list)
    private_imports: list[str] = field(default_factory=list)
    long_functions: list[str] = field(default_factory=list)
    long_modules: list[str] = field(default_factory=list)
    verdict_modules: list[str] = field(default_factory=list)
    long_lines: list[str] = field(default_factory=list)


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def sources() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if any(rel.startswith(s) for s in SKIPPED) or "__pycache__" in rel:
            continue
        found[module_name(path)] = path
    return found


def imports_of(name: str, tree: ast.AST, modules: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """(imported module, imported names) for every import in the module, at any depth."""
    is_package = modules[name].name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_package else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            names = [a.name for a in node.names]
            # "from pkg import module" imports a module, not a name
            subs = [n for n in names if f"{base}.{n}" in modules]
            for n in subs:
                out.append((f"{base}.{n}", []))
            rest = [n for n in names if n not in subs]
            if rest or not subs:
                out.append((base, rest))
    return out


def owning_module(target: str, modules: dict[str, Path]) -> str | None:
    while target:
        if target in modules:
            return target
        target = target.rpartition(".")[0]
    return None


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def module_graph(modules: dict[str, Path]) -> tuple[dict[str, set[str]], dict[str, list[tuple[str, list[str]]]]]:
    graph: dict[str, set[str]] = {}
    raw: dict[str, list[tuple[str, list[str]]]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        raw[name] = imports_of(name, tree, modules)
        deps = set()
        for target, _names in raw[name]:
            owner = owning_module(target, modules)
            # a package's __init__ re-exporting its own modules is not a cycle edge back up
            if owner and owner != name and not name.startswith(owner + ".") and not (
                    modules[name].name == "__init__.py" and owner.startswith(name + ".")):
                deps.add(owner)
        graph[name] = deps
    return graph, raw


def measure() -> Structure:
    modules = sources()
    result = Structure()
    graph, raw = module_graph(modules)
    result.cycles = find_cycles(graph)
    for name, imported in raw.items():
        for target, names in imported:
            owner = owning_module(target, modules)
            if not owner or owner == name:
                continue
            for n in names:
                if n.startswith("_") and not n.startswith("__"):
                    result.private_imports.append(f"{name} imports {owner}.{n}")
    for name, path in modules.items():
        text = path.read_text()
        lines = text.splitlines()
        rel = path.relative_to(ROOT).as_posix()
        if len(lines) > LIMITS["module_lines"]:
            result.long_modules.append(f"{rel} {len(lines)}")
        for i, line in enumerate(lines, 1):
            if len(line) > LIMITS["line_length"]:
                result.long_lines.append(f"{rel}:{i} {len(line)}")
        tree = ast.parse(text, str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > LIMITS["function_lines"]:
                    result.long_functions.append(f"{rel}:{node.lineno} {node.name} {size}")
            if isinstance(node, ast.Constant) and node.value in VERDICT_KINDS:
                if rel not in result.verdict_modules:
                    result.verdict_modules.append(rel)
    return result


def main(argv: list[str]) -> int:
    result = measure()
    if "--json" in argv:
        print(json.dumps(asdict(result), indent=1))
        return 0
    for key, values in asdict(result).items():
        print(f"{key}: {len(values)}")
        for v in values:
            print(f"    {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
