"""Shared pytest fixtures.

Keep each feature's fixtures in its own delimited section; append new sections
below.  (Do not define pytest hooks in more than one section: a second
definition with the same name silently replaces the first.)
"""

from __future__ import annotations

# ============================================================================
# BEGIN sshd fixtures (real OpenSSH sshd; see tests/sshd.py)
# ============================================================================
import os as _sshd_os
from pathlib import Path as _SshdPath

import signal as _signal

import pytest

# A suite started in the background (`pytest ... &` from a script) inherits SIGINT as ignored, and
# so would every CLI it starts: the Ctrl-C tests would then wait for a signal that never lands.
# A Python handler here makes the children start with the default disposition again.
if _signal.getsignal(_signal.SIGINT) is _signal.SIG_IGN:
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)

try:  # tests/ on sys.path (default rootdir/prepend import mode)
    from sshd import SSHD as _SSHD, SshServer, sshd_available as _sshd_available, start_sshd
except ImportError:  # tests/ became a package, or --import-mode=importlib
    from tests.sshd import SSHD as _SSHD, SshServer, sshd_available as _sshd_available, start_sshd


def _sshd_required() -> bool:
    # In CI (or when scripts/test.sh runs the suite) a missing sshd is an error.
    return any(_sshd_os.environ.get(v, "").strip().lower() not in ("", "0", "false", "no")
               for v in ("CI", "ENVBISECT_REQUIRE_SSHD"))


def _start_sshd_or_skip(tmp_path_factory: pytest.TempPathFactory, name: str, alias: str):
    if not _sshd_available():
        msg = f"{_SSHD} is missing (apt-get install openssh-server, or run scripts/test.sh)"
        if _sshd_required():
            pytest.fail(msg + " -- required because CI/ENVBISECT_REQUIRE_SSHD is set", pytrace=False)
        pytest.skip(msg)
    server = start_sshd(tmp_path_factory.mktemp(name), alias=alias)
    return server


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory):
    """A real sshd on 127.0.0.1 (alias "testhost"), shared by the whole session."""
    server = _start_sshd_or_skip(tmp_path_factory, "sshd", "testhost")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def sshd2(tmp_path_factory: pytest.TempPathFactory):
    """A second, independent sshd (alias "testhost2"; own port and keys)."""
    server = _start_sshd_or_skip(tmp_path_factory, "sshd2", "testhost2")
    yield server
    server.stop()


@pytest.fixture
def ssh_env(sshd: SshServer, tmp_path: _SshdPath) -> dict[str, str]:
    """Environment for code that resolves "testhost" via ~/.ssh/config.

    Returns a copy of os.environ with HOME pointing at a fresh fake home whose
    ~/.ssh/config holds the `testhost` block and ~/.ssh/known_hosts the
    server's host key; SSH_AUTH_SOCK is removed so agent keys don't interfere.
    Nothing is changed globally: pass it as `env=` to subprocesses, or
    `monkeypatch.setenv("HOME", ssh_env["HOME"])` for in-process code.
    Note: the `ssh` binary reads ~/.ssh from the passwd entry, not $HOME --
    use `ssh -F sshd.ssh_config` (or `sshd.ssh_cmd(...)`) for it.
    """
    home = tmp_path / "home"
    dot_ssh = home / ".ssh"
    dot_ssh.mkdir(parents=True)
    dot_ssh.chmod(0o700)
    (dot_ssh / "config").write_text(sshd.config_block())
    (dot_ssh / "known_hosts").write_text(sshd.known_hosts_line + "\n")
    for p in dot_ssh.iterdir():
        p.chmod(0o600)
    env = dict(_sshd_os.environ)
    env["HOME"] = str(home)
    env.pop("SSH_AUTH_SOCK", None)
    return env


# ============================================================================
# END sshd fixtures
# ============================================================================


# ============================================================================
# BEGIN alertmanager fixtures (real Prometheus Alertmanager; see tests/alertmanager.py)
# ============================================================================
try:
    from alertmanager import Alertmanager, alertmanager_binary as _alertmanager_binary, free_port as _free_port, \
        start_alertmanager as _start_alertmanager
except ImportError:  # tests/ became a package, or --import-mode=importlib
    from tests.alertmanager import Alertmanager, alertmanager_binary as _alertmanager_binary, \
        free_port as _free_port, start_alertmanager as _start_alertmanager


@pytest.fixture
def alertmanager_for(tmp_path_factory: pytest.TempPathFactory):
    """start(webhook_url, secret_file) -> a real Alertmanager on a free loopback port, its one receiver
    a webhook to webhook_url with the bearer token in secret_file (group_wait 5s). Missing binary: a
    failure under scripts/test.sh (CI or ENVBISECT_REQUIRE_SSHD set), a skip elsewhere."""
    started: list[Alertmanager] = []

    def start(webhook_url: str, secret_file: str) -> Alertmanager:
        if _alertmanager_binary() is None:
            msg = "prometheus-alertmanager is missing (apt-get install prometheus-alertmanager, or run scripts/test.sh)"
            if _sshd_required():
                pytest.fail(msg + " -- required because CI/ENVBISECT_REQUIRE_SSHD is set", pytrace=False)
            pytest.skip(msg)
        am = _start_alertmanager(tmp_path_factory.mktemp("alertmanager"), webhook_url, secret_file)
        started.append(am)
        return am

    yield start
    for am in started:
        am.stop()


@pytest.fixture
def free_port() -> int:
    """A loopback TCP port nobody listens on now (for `watch --listen`)."""
    return _free_port()


# ============================================================================
# END alertmanager fixtures
# ============================================================================


# ============================================================================
# BEGIN test groups (markers unit / local / sshd / sim; see README "Tests")
# ============================================================================
# Each test is put in groups by what it needs, so that no file moves:
#   sshd   a real OpenSSH sshd (tests/sshd.py);
#   sim    the simulated PD deployment (real sglang-router and workers, envbisect.sim);
#   local  other real processes of this machine (the CLI in a subprocess, an agent over the local
#          transport, git on a host tree) but neither of the above;
#   unit   none of these: in-process code only, the group a newcomer runs in seconds.
# A test needs what its code, or its fixtures' code, reaches: the names a function's code uses are
# looked up in its module, and functions and classes of tests/ and of envbisect are followed, to one
# of the roots below. A string naming a fixture (`request.getfixturevalue("sshd")`) reaches that
# fixture. A mark written in a test file (`pytestmark = pytest.mark.sim`) counts too, for what code
# does not show. The reading over-approximates (a name used as a method may be read as a module's
# function), which only moves a test out of `unit`; a unit test that starts a process all the same
# fails (`_unit_tests_start_no_process`), so the unit group stays what it says.
# (each section of this file keeps its imports: E402 is expected below the first section)
import os as _groups_os  # noqa: E402
import subprocess as _groups_subprocess  # noqa: E402
import sys as _groups_sys  # noqa: E402
import types as _groups_types  # noqa: E402

import envbisect.sim.stack as _sim_deployment  # noqa: E402

try:
    import sshd as _sshd_module  # noqa: E402
except ImportError:  # tests/ became a package, or --import-mode=importlib
    import tests.sshd as _sshd_module

GROUPS = ("unit", "local", "sshd", "sim")
_PROCESS_ROOTS = tuple(getattr(m, n) for m, names in (
    (_groups_subprocess, ("Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput")),
    (_groups_os, ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "spawnv", "spawnve",
                  "spawnl", "spawnle", "spawnvp", "spawnlp", "execv", "execve", "execvp", "execl", "execlp")),
) for n in names if hasattr(m, n))
_GROUP_ROOTS = {  # what starts the thing a group needs
    "sshd": (_sshd_module.start_sshd,),
    "sim": (_sim_deployment.build, _sim_deployment.SimDeployment),
    "local": _PROCESS_ROOTS,
}
_REPO = _SshdPath(__file__).resolve().parent.parent
_FOLLOWED: dict[str, bool] = {}  # module name -> its functions and classes are followed
_edges: dict[int, tuple[object, ...]] = {}
_root_of: dict[int, str] = {id(r): g for g, roots in _GROUP_ROOTS.items() for r in roots}


def _followed(obj: object) -> bool:
    """Functions and classes written in this repository (envbisect, tests/, bench/) are followed;
    nothing else (the standard library, site-packages) is."""
    name = obj.__name__ if isinstance(obj, _groups_types.ModuleType) else getattr(obj, "__module__", None)
    if not isinstance(name, str):
        return False
    if name not in _FOLLOWED:
        path = getattr(_groups_sys.modules.get(name), "__file__", None)
        real = _SshdPath(path).resolve() if path else None
        _FOLLOWED[name] = real is not None and real.is_relative_to(_REPO) and ".venv" not in real.parts
    return _FOLLOWED[name]


def _codes(code: _groups_types.CodeType):
    yield code
    for c in code.co_consts:
        if isinstance(c, _groups_types.CodeType):
            yield from _codes(c)


def _unwrapped(f: object) -> object:
    """The test function under a decorator's wrapper (hypothesis's @given, functools.wraps)."""
    inner = getattr(getattr(f, "hypothesis", None), "inner_test", None)
    while inner is None and getattr(f, "__wrapped__", None) is not None:
        f = f.__wrapped__
    return inner if inner is not None else f


def _named(obj: object, fixtures: dict[str, list[object]]) -> tuple[object, ...]:
    """What the code of a function (or of a class's bases, methods and properties) names: its module's
    globals by those names, a module's attributes by the attribute names the code uses, and the
    fixtures named by a string in it."""
    members = [getattr(v, "fget", v) for v in vars(obj).values()] if isinstance(obj, type) else [obj]
    out: list[object] = list(obj.__bases__) if isinstance(obj, type) else []
    for f in members:
        f = _unwrapped(getattr(f, "__func__", f))
        code, glob = getattr(f, "__code__", None), getattr(f, "__globals__", None)
        if code is None or glob is None:
            continue
        codes = list(_codes(code))
        names = {n for c in codes for n in c.co_names}
        for n in names:
            v = glob.get(n, _groups_sys.modules.get(n))  # a dotted name: an import inside the function
            if isinstance(v, _groups_types.ModuleType):
                out.extend(getattr(v, a) for a in names if hasattr(v, a))
            elif v is not None:
                out.append(v)
        out.extend(fx for c in codes for k in c.co_consts if isinstance(k, str) for fx in fixtures.get(k, ()))
    return tuple(out)


def _reaches(start: list[object], fixtures: dict[str, list[object]]) -> frozenset[str]:
    """The groups (other than unit) whose roots the objects reach, following tests/ and envbisect code."""
    found: set[str] = set()
    todo, seen = list(start), set()
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if id(obj) in _root_of:
            found.add(_root_of[id(obj)])
            continue
        if (callable(obj) or isinstance(obj, type)) and _followed(obj):
            if id(obj) not in _edges:
                _edges[id(obj)] = _named(obj, fixtures)
            todo.extend(_edges[id(obj)])
    return frozenset(found)


def groups_of(item: pytest.Item) -> frozenset[str]:
    """The groups of a collected test (see this section's head)."""
    module = getattr(item, "module", None)
    if module is not None:
        _FOLLOWED[module.__name__] = True  # a test file outside the repository (tests of this reading)
    found = {g for g in ("local", "sshd", "sim") if item.get_closest_marker(g) is not None}
    info = getattr(item, "_fixtureinfo", None)
    manager = item.session._fixturemanager
    fixtures = {n: [fd.func for fd in defs] for n in ("sshd", "sshd2", "ssh_env")
                if (defs := manager.getfixturedefs(n, item))}
    used = [fd.func for defs in (info.name2fixturedefs.values() if info else ()) for fd in defs]
    found |= _reaches([_unwrapped(o) for o in [getattr(item, "obj", None), *used] if o is not None], fixtures)
    if found & {"sshd", "sim"}:
        found.discard("local")
    return frozenset(found or {"unit"})


# seconds a test of each group takes when tests/durations.json does not list it
_GROUP_SECONDS = {"sim": 40.0, "sshd": 3.0, "local": 0.5, "unit": 0.01}


def _durations() -> dict[str, float]:
    """tests/durations.json (scripts/durations.py writes it from a whole run's JUnit XML)."""
    import json as _json

    try:
        return {str(k): float(v) for k, v in _json.loads((_SshdPath(__file__).parent / "durations.json")
                                                        .read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


# test files whose tests share one expensive module fixture, and what it is: the xdist scheduler below
# hands each such file's tests to one worker together, which builds the fixture once, not on every worker
SHARED_MODULE_FIXTURES = {"tests/test_bundle.py": "one bisection on the simulated stack (`run`)"}


def expensive_module_fixture(item: pytest.Item, groups: frozenset[str]) -> str | None:
    """The name of a module-scoped fixture of this sim or sshd test's own file, if it uses one."""
    info = getattr(item, "_fixtureinfo", None)
    path = getattr(item, "path", None)
    if info is None or path is None or not groups & {"sim", "sshd"}:
        return None
    for name, defs in info.name2fixturedefs.items():
        for fd in defs:
            code = getattr(fd.func, "__code__", None)
            if fd.scope == "module" and code is not None and _SshdPath(code.co_filename) == _SshdPath(path):
                return name
    return None


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist load`, except that the tests of a file in SHARED_MODULE_FIXTURES are one work unit,
    handed out where the file's first test stands in the longest-first order (with
    `--no-loadscope-reorder`). xdist's own `--dist loadgroup` does not group under pytest 9.2: it
    renames node ids through `_nodeid`, which pytest no longer reads (pytest-xdist issue 1386)."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if path in SHARED_MODULE_FIXTURES else nodeid

        def _reschedule(self, node: object) -> None:
            if not node.shutting_down and self.workqueue and self._pending_of(self.assigned_work[node]) >= 2:  # type: ignore[attr-defined,index]
                return  # two tests pending at most, as `--dist load --maxschedchunk 1` keeps
            super()._reschedule(node)

    return SharedFixtureScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its groups, and run the longest tests first (as recorded in
    tests/durations.json, else by group: a sim test takes tens of seconds, a unit test
    milliseconds). scripts/test.sh hands tests to the xdist workers one at a time in this order
    (`--maxschedchunk 1`), so no long test starts last and finishes alone while the other workers
    idle; the tests of a file with an expensive module fixture (SHARED_MODULE_FIXTURES, checked
    here) are handed out together. The sort is stable and the same on every worker, as xdist
    requires."""
    seconds = _durations()
    estimate: dict[str, float] = {}
    for item in items:
        groups = groups_of(item)
        for group in sorted(groups):
            if item.get_closest_marker(group) is None:
                item.add_marker(group)
        fixture = expensive_module_fixture(item, groups)
        where = item.nodeid.split("::", 1)[0]
        if fixture and where not in SHARED_MODULE_FIXTURES:
            raise pytest.UsageError(f"{where} shares the module fixture {fixture!r} across sim/sshd tests: "
                                    "name it in SHARED_MODULE_FIXTURES (tests/conftest.py)")
        if where in ALONE_FILES:
            item.add_marker("alone")
        estimate[item.nodeid] = seconds.get(item.nodeid, max(_GROUP_SECONDS[g] for g in groups))
    items.sort(key=lambda it: -estimate[it.nodeid])


# Files whose tests judge speed (tokens/s, latency, a metrics page) on the simulated deployment: beside
# four other workers on two cores their measurements carry the others' load, and a 20% slowdown can read
# as an interaction with an innocent change. scripts/test.sh runs them after the rest, one at a time.
ALONE_FILES = ("tests/test_prom_probes_sim.py", "tests/test_perf_sim.py")


_running_unit: list[str] = []  # the unit test running now, and what it started
_PROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.posix_spawn", "os.fork", "os.forkpty", "os.exec",
                   "os.spawn", "os.popen")


def _audit(event: str, args: tuple) -> None:
    if _running_unit and event in _PROCESS_EVENTS:
        _running_unit.append(f"{event} {str(args[:2])[:200]}")


_groups_sys.addaudithook(_audit)


@pytest.fixture(autouse=True)
def _unit_tests_start_no_process(request: pytest.FixtureRequest):
    """A unit-marked test that starts a process fails: the group reading above missed what it needs."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    _running_unit[:] = [request.node.nodeid]
    try:
        yield
    finally:
        started = _running_unit[1:]
        _running_unit.clear()
    if started:
        pytest.fail(f"a unit-marked test started {len(started)} process(es), first: {started[0]}; the test "
                    "groups in tests/conftest.py did not see it: mark the test local, sshd or sim", pytrace=False)


# ============================================================================
# END test groups
# ============================================================================
