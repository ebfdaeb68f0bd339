"""The test groups of tests/conftest.py (markers unit, local, sshd, sim): `pytest -m unit` collects no
test that needs a process, an sshd or the simulated deployment, and a unit-marked test that starts a
process all the same fails."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SSHD_OR_SIM_FIXTURES = {"sshd", "sshd2", "ssh_env", "scenario", "perf_scenario", "fleet", "make_sim"}

_DUMP_PLUGIN = """
import json, os

def pytest_collection_finish(session):
    with open(os.environ["GROUPS_DUMP"], "w") as f:
        json.dump([{"id": it.nodeid, "marks": sorted({m.name for m in it.iter_markers()}),
                    "own_marks": sorted({m.name for m in getattr(it.module, "pytestmark", [])}
                                        if isinstance(getattr(it.module, "pytestmark", None), list)
                                        else {getattr(getattr(it.module, "pytestmark", None), "name", "")}),
                    "fixtures": list(it.fixturenames)} for it in session.items], f)
"""


def _pytest(tmp_path: Path, *args: str, cwd: Path) -> tuple[subprocess.CompletedProcess, list[dict]]:
    (tmp_path / "groups_dump.py").write_text(_DUMP_PLUGIN)
    dump = tmp_path / "items.json"
    env = {"PYTHONPATH": f"{tmp_path}:{TESTS}:{TESTS.parent}", "GROUPS_DUMP": str(dump), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "groups_dump",
                        "-n", "0", *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env)
    return r, json.loads(dump.read_text()) if dump.exists() else []


def test_the_unit_group_of_the_suite_needs_no_sshd_no_simulation_and_no_process(tmp_path):
    r, items = _pytest(tmp_path, "--collect-only", "-m", "unit", str(TESTS), cwd=TESTS.parent)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert len(items) >= 300, len(items)  # the pure tests (parsers, search, masking, time specs) are most
    for it in items:
        assert "unit" in it["marks"] and not {"local", "sshd", "sim"} & set(it["marks"]), it
        assert not {"sshd", "sim"} & set(it["own_marks"]), it
        assert not SSHD_OR_SIM_FIXTURES & set(it["fixtures"]), it


def test_a_test_is_grouped_by_what_its_code_reaches_and_a_hidden_process_fails_the_unit_test(tmp_path):
    """The groups of a small test file, run with tests/conftest.py as a plugin: a test that names
    subprocess is `local`, one over the sshd fixture is `sshd`; one that hides its process from the
    reading (the module's name built at run time) is read as unit, and the check fails it."""
    work = tmp_path / "probe_tests"
    work.mkdir()
    (work / "test_probe_groups.py").write_text(textwrap.dedent("""
        import subprocess

        def _helper():
            return subprocess.run(["true"], check=True)

        def test_pure():
            assert sorted([3, 1]) == [1, 3]

        def test_through_a_helper():
            _helper()

        def test_over_sshd(sshd):
            pass

        def test_hides_a_process():
            getattr(__import__("sub" + "process"), "run")(["true"], check=True)
        """))
    r, items = _pytest(tmp_path, "--collect-only", "-p", "conftest", "--rootdir", str(work), str(work), cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    groups = {it["id"].split("::")[1]: {"unit", "local", "sshd", "sim"} & set(it["marks"]) for it in items}
    assert groups == {"test_pure": {"unit"}, "test_through_a_helper": {"local"}, "test_over_sshd": {"sshd"},
                      "test_hides_a_process": {"unit"}}, groups
    r, _ = _pytest(tmp_path, "-m", "unit", "-rA", "-p", "conftest", "--rootdir", str(work), str(work), cwd=work)
    assert r.returncode == 1, r.stdout[-3000:]
    assert "PASSED test_probe_groups.py::test_pure" in r.stdout, r.stdout[-3000:]
    assert "ERROR test_probe_groups.py::test_hides_a_process" in r.stdout, r.stdout[-3000:]
    assert "a unit-marked test started 1 process(es), first: subprocess.Popen" in r.stdout, r.stdout[-3000:]
    assert "2 deselected" in r.stdout, r.stdout[-3000:]
