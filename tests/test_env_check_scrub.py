"""The post-write check (hostops env_check) evaluates an env file in the service's start environment
less every key the file assigns, as the snapshot's evaluation does (collect.assigned_keys): a line
with several assignments (``export A=1 B=...``) scrubs each of them, so a self-appending value
(``LD_LIBRARY_PATH=/opt/x/lib:$LD_LIBRARY_PATH``) is not appended twice and the check does not stop
a good trial with a false mismatch. Runs the real agent script locally (bash, no ssh needed)."""
from __future__ import annotations

import ast
from pathlib import Path

import envbisect.hosts.agent as agent
from envbisect.hosts.agent_calls import agent_source, run_ops
from envbisect.hosts.transport import LocalTransport


def _check(tmp_path, text: str, env: dict, expect: list[dict]) -> dict:
    path = tmp_path / "decode.serve-env"
    path.write_text(text)
    op = {"op": "env_check", "path": str(path), "env": env, "expect": expect, "refs": {}, "skipped": {}}
    return run_ops(LocalTransport(), [op])[0]


def test_a_self_appending_value_on_a_line_of_several_assignments_is_evaluated_as_a_fresh_start(tmp_path):
    start_env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "/opt/x/lib:/usr/lib", "A": "1"}
    for text in ("export A=1 LD_LIBRARY_PATH=/opt/x/lib:$LD_LIBRARY_PATH\n",
                 "export A=1\nexport LD_LIBRARY_PATH=/opt/x/lib:$LD_LIBRARY_PATH\n",
                 "A=1 LD_LIBRARY_PATH+=:/opt/y\n"):
        want = "/opt/x/lib:" if "/opt/x/lib" in text else ":/opt/y"
        r = _check(tmp_path, text, start_env, [{"key": "LD_LIBRARY_PATH", "side": "current", "value": want,
                                                 "ref": None, "source": "test"}])
        assert r["error"] is None and r["checked"] == ["LD_LIBRARY_PATH"], (text, r)
        assert r["mismatches"] == [], (text, r["mismatches"])


def test_a_key_the_file_does_not_assign_keeps_its_start_value(tmp_path):
    r = _check(tmp_path, "export A=1 B=2\nC=${KEEP}x\n", {"PATH": "/usr/bin:/bin", "KEEP": "k"},
               [{"key": "C", "side": "current", "value": "kx", "ref": None, "source": "test"}])
    assert r["mismatches"] == [] and r["checked"] == ["C"], r


def test_the_assignments_of_a_line_are_read_as_bash_reads_them():
    # the agent script reads its request from stdin and runs its ops at the end: take only its functions
    src = agent_source("hostops.py").replace("req = json.load(sys.stdin)", "req = None")
    ns: dict = {"__name__": "hostops_functions"}
    exec(compile(src[:src.index("\nOPS = {")], "hostops.py", "exec"), ns)  # noqa: S102 - our own agent script
    keys = ns["assigned_keys"]
    assert keys("export A=1 B=2\n") == {"A", "B"}
    assert keys("A='x\\' B=1\n") == {"A", "B"}  # a backslash is literal inside single quotes
    assert keys('A="x B=1" C=$(echo D=1 E=2) F=${G:-H=1}\n') == {"A", "C", "F"}
    assert keys("export A=1 # B=2\n  export  C+=x D=`echo E=1`\n") == {"A", "C", "D"}
    assert keys("echo A=1\nA=1 cmd B=2\n") == {"A"}


SCRUB_NAMES = {"HELD_ENV", "DROPPED_ENV", "EVAL_SCRIPT", "EVAL_DONE", "EVAL_UNREADABLE", "EVAL_UNREACHABLE", "scrub"}


def _defined(source: str) -> set[str]:
    tree = ast.parse(source)
    names = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
             if isinstance(t, ast.Name)}
    return names | {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_the_scrub_is_defined_once_and_both_scripts_that_eval_in_bash_are_sent_with_it():
    folder = Path(agent.__file__).parent
    scrub_text = (folder / "scrub.py").read_text()
    assert SCRUB_NAMES <= _defined(scrub_text)
    defining = {p.name for p in folder.glob("*.py") if _defined(p.read_text()) & SCRUB_NAMES}
    assert defining == {"scrub.py"}, defining
    for name in ("collect.py", "hostops.py"):
        sent = agent_source(name)
        assert sent.count(scrub_text) == 1 and "from scrub import" not in sent, name
        # the names the script reads are the shared module's: defined in what is sent, once
        assert {"EVAL_SCRIPT", "scrub"} <= _defined(sent), name
        namespace: dict = {}
        exec(compile(scrub_text, "scrub.py", "exec"), namespace)  # noqa: S102 - our own agent module
        keep, back = namespace["scrub"]({"PATH": "/bin", "LD_PRELOAD": "/x.so", "IFS": " ", "PS4": "$(id)"})
        assert keep == {"PATH": "/bin"} and back == ["LD_PRELOAD", "/x.so", "PS4", "$(id)"]


def test_a_held_variable_reaches_the_file_in_the_post_write_check_through_the_shared_scrub(tmp_path):
    """A held variable (PYTHONPATH) is kept out of bash's environment and given back to the file as a
    plain shell variable: the file builds a value from it."""
    r = _check(tmp_path, "export X=$PYTHONPATH/y\n", {"PATH": "/usr/bin:/bin", "PYTHONPATH": "/keep"},
               [{"key": "X", "side": "current", "value": "/keep/y", "ref": None, "source": "test"}])
    assert r["error"] is None and r["checked"] == ["X"] and r["mismatches"] == [], r
