"""`init` writes a playbook from what a host reports: every host string (working directory, host
name, argv, env names and values, paths, unit names, notes) reaches the draft through the TOML
writer's quoting, or is dropped when it holds control characters; it is never pasted into a
comment or a key where a line break would start a table of its own (docs/safety.md).

The clean discovery is the real agent's (envbisect/hosts/agent/discover.py, run here through
LocalTransport) over a stand-in `python -m sglang.launch_server` started by a script; the hostile
one is the same document with every host string carrying a newline, quotes, `#`, `[`, terminal
escapes and other control characters. The agent sends no process environment (it compares it
with the env files on the host and reports counts), so env names and values reach the draft only
inside the strings that hold them (paths, argv, notes)."""
from __future__ import annotations

import json
import tomllib
from typing import Any

from test_init_discovery import stacks  # noqa: F401 - fixture

from envbisect.hosts.transport_base import LocalTransport
from envbisect.runs import playbook_draft as disc

INJECT = ('\n[probes.aaa]\nkind = "command"\ncommand = "touch /tmp/pwned"\n#"\'#[x]\r\x00\x07\x1b]52;c;QUFB\x07'
          '\x1b[2J\x7f\x85\x9b31m\u2028')
NOT_HOST_STRINGS = {"matcher", "kind", "how"}  # what the agent names from the controller's own request


def hostile(v: Any, key: str = "") -> Any:
    if isinstance(v, dict):
        return {(k if k in NOT_HOST_STRINGS or not isinstance(k, str) or key != "environ" else k + INJECT):
                (x if k in NOT_HOST_STRINGS else hostile(x, k)) for k, x in v.items()}
    if isinstance(v, list):
        return [hostile(x, key) for x in v]
    if isinstance(v, str):
        return v + ("/" if v.startswith("/") else "") + INJECT
    return v


def tables(doc: dict, prefix: str = "") -> dict[str, set[str]]:
    """Every table's dotted name -> its keys (arrays of tables by index)."""
    out: dict[str, set[str]] = {prefix: set(doc)}
    for k, v in doc.items():
        if isinstance(v, dict):
            out |= tables(v, f"{prefix}.{k}" if prefix else k)
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for i, x in enumerate(v):
                out |= tables(x, f"{prefix}.{k}[{i}]" if prefix else f"{k}[{i}]")
    return out


def drafted(doc: dict, under: str) -> str:
    services, repos, _ = disc.interpret(doc, under=under)
    text, _, _ = disc.draft(doc, services, repos, host="gpu1", ssh="ops@gpu1", inventory_host=None,
                            inventory_file=None, python="python3", command="init --host ops@gpu1")
    return text


def with_unit(doc: dict, root: str) -> dict:
    """The same process run by a systemd unit, with a note, a pid file and a log: the fields the
    script-started stand-in does not have."""
    p = {**doc["processes"][0], "unit": {"name": "sglang-server.service", "user": True, "file": {
        "path": "/etc/systemd/user/sglang-server.service", "environment_files": [f"{root}/conf/server.env"],
        "exec_start": f"{root}/start-server.sh", "working_directory": root}},
        "notes": ["SGLANG_KV_PAGE_SIZE differs between the process and its env file"],
        "pid_files": [f"{root}/run/server.pid"], "stdout": f"{root}/log/server.log"}
    return {**doc, "python_version": "3.11.7", "processes": [p]}


def scanned_under(root: str) -> dict:
    """The real agent's discovery on this machine, with only the processes under `root`."""
    t = LocalTransport()
    try:
        doc = disc.scan(t)
    finally:
        t.close()
    return {**doc, "processes": [p for p in doc["processes"] if (p.get("cwd") or "").startswith(root)]}


def test_every_host_string_of_a_discovery_is_quoted_or_dropped_never_a_table(stacks):  # noqa: F811
    root = str(stacks[0]["root"])
    doc = scanned_under(root)
    mine = doc["processes"]
    assert mine and mine[0].get("argv") and mine[0].get("scripts") and mine[0].get("repos"), json.dumps(mine)[:2000]
    scanned = {**doc, "processes": mine}
    for clean_doc in (scanned, with_unit(scanned, root)):
        clean = drafted(clean_doc, root)
        bad_doc = hostile(clean_doc)
        assert bad_doc["hostname"].endswith(INJECT) and bad_doc["processes"][0]["cwd"].endswith(INJECT)
        bad = drafted(bad_doc, root)
        want, got = tables(tomllib.loads(clean)), tables(tomllib.loads(bad))
        assert set(got) == set(want), sorted(set(got) ^ set(want))
        for name, keys in got.items():
            assert keys <= want[name], (name, keys - want[name])
        assert "probes.aaa" not in got and list(tomllib.loads(bad)["probes"]) == ["e2e"]
        for line in bad.splitlines():  # no raw control character on any line (a terminal shows the draft)
            assert not any(ord(c) < 0x20 and c != "\t" or 0x7f <= ord(c) <= 0x9f or c == "\u2028" for c in line), line
        assert 'command = \\"touch /tmp/pwned\\"' in bad  # the strings are there, quoted, not lost


EVIL_DIR = ('stack\n[probes.aaa]\nkind = "command"\ncommand = "touch /tmp/pwned"\n# PASSWORD="hunter2" '
            'HF_TOKEN=\\"hf_abcdefghijklmnopqrstuvwxyz12\\" \x1b]0;title\x07')


def test_init_over_a_real_server_in_a_hostile_folder_drafts_no_table_of_its_own(tmp_path):
    """End to end, as the operator runs it (`envbisect init --host local --out -`, the real agent,
    the CLI's masking): a server started from a folder whose name holds a line break, a table, a
    secret-named assignment with escaped quotes and a title escape."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from test_init_discovery import FAKE_SERVER, run

    root = tmp_path / EVIL_DIR
    pkg = root / "python" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(FAKE_SERVER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (root / "server.env").write_text(f"export FAKE_PORT={port}\n")
    start = root / "start-server.sh"
    start.write_text('#!/usr/bin/env bash\ncd "$(dirname "$0")"\nset -a\n. ./server.env\nset +a\n'
                     f'export PYTHONPATH="$PWD/python"\n{sys.executable} -m sglang.launch_server --host 127.0.0.1 '
                     '--port "$FAKE_PORT" --served-model-name tiny-model\n')
    start.chmod(0o755)
    p = subprocess.Popen(["bash", str(start)], cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline and p.poll() is None, "the stand-in server did not start"
                time.sleep(0.1)
        r = run("init", "--host", "local", "--under", str(root), "--out", "-", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        draft = tomllib.loads(r.stdout)
        assert list(draft["probes"]) == ["e2e"] and set(draft["services"]) == {"server"}, r.stdout
        assert "hunter2" not in r.stdout and "hf_abcdefghijklmnopqrstuvwxyz12" not in r.stdout
        assert not any(ord(c) < 0x20 and c not in "\t\n" or 0x7f <= ord(c) <= 0x9f for c in r.stdout + r.stderr)
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=10)


# A pid that closes the draft's comment and opens a multi-line string: the second line that shows
# it closes the string, and what is between is a command probe ahead of the others.
PID_INJECT = "1\n[probes.aaa]\nkind = \"command\"\ncommand = '''#"
WRONG = (INJECT, PID_INJECT, {"pid": INJECT}, [INJECT], 1e300, float("nan"), float("-inf"), -1, 0, True, 2 ** 80)


def leaves(v: Any, path: tuple = ()) -> list[tuple]:
    """Every field's path, tables and lists included."""
    out = [path] if path else []
    if isinstance(v, dict):
        for k, x in v.items():
            out += leaves(x, (*path, k))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            out += leaves(x, (*path, i))
    return out


def replaced(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    if isinstance(doc, dict):
        return {k: (replaced(x, path[1:], value) if k == path[0] else x) for k, x in doc.items()}
    return [replaced(x, path[1:], value) if i == path[0] else x for i, x in enumerate(doc)]


def test_every_field_of_a_discovery_of_the_wrong_type_is_left_out_never_drafted(stacks):  # noqa: F811
    """Every field, numbers and flags too (pid, ports, now, start times, counts), fed a value of
    another type: a string with a table in it, a table, a list, an infinite or huge number, NaN, a
    bool. The field is left out (a process without a valid pid is left out whole, with a note);
    the draft has no table the clean one lacks, and init never ends in an internal error."""
    from envbisect.errors import UsageError

    root = str(stacks[0]["root"])
    scanned = with_unit(scanned_under(root), root)
    scanned["processes"][0]["ancestors"] = [{"pid": 1, "argv0": "bash"}]
    scanned["processes"][0]["env_files"] = [{"path": f"{root}/conf/server.env", "readable": True, "keys": 3,
                                             "equal": 3, "differ": 0, "missing": 0, "backups": ["{path}.bak"]}]
    want = tables(tomllib.loads(drafted(scanned, root)))
    identity = {("processes",), ("processes", 0), ("processes", 0, "pid"), ("processes", 0, "matcher"),
                ("processes", 0, "kind"), ("processes", 0, "cwd")}  # cwd: what --under picks by
    tried = 0
    for path in leaves(scanned):
        for value in WRONG:
            bad_doc = replaced(scanned, path, value)
            try:
                bad = drafted(bad_doc, root)
            except UsageError as e:
                assert path in identity and "\n" not in str(e), (path, value, e)
                continue
            tried += 1
            got = tables(tomllib.loads(bad))
            assert set(got) <= set(want), (path, value, sorted(set(got) - set(want)))
            for name, keys in got.items():
                assert keys <= want[name], (path, value, name, keys - want[name])
            for line in bad.splitlines():
                assert not any(ord(c) < 0x20 and c != "\t" or 0x7f <= ord(c) <= 0x9f for c in line), (path, line)
            assert list(tomllib.loads(bad).get("probes", {"e2e": 0})) == ["e2e"], (path, value)
    assert tried > 500


def test_a_process_whose_pid_is_not_a_number_is_left_out_with_a_note(stacks):  # noqa: F811
    """The red-team's case: the pid a host reports holds a line break and a multi-line string
    opener. That process is left out, said in a note; the other one drafts exactly as before; with
    every pid hostile, init says there is nothing to draft in one line."""
    from envbisect.errors import UsageError

    root = str(stacks[0]["root"])
    clean_doc = scanned_under(root)
    clean = drafted(clean_doc, root)
    evil = {**clean_doc["processes"][0], "pid": PID_INJECT}
    bad = drafted({**clean_doc, "processes": [*clean_doc["processes"], evil, evil]}, root)
    assert tables(tomllib.loads(bad)) == tables(tomllib.loads(clean))
    assert "# note: process 2 of the host's answer was left out: its pid is not valid" in bad
    assert "probes.aaa" not in bad and "'''" not in bad
    for value in (PID_INJECT, {"x": 1}, 1.5, -3, True, None):
        try:
            drafted({**clean_doc, "processes": [{**evil, "pid": value}]}, root)
        except UsageError as e:
            assert "no SGLang server or router is running" in str(e) and "\n" not in str(e)
        else:
            raise AssertionError(f"a process with pid {value!r} was drafted")


def test_two_servers_reported_on_one_port_get_two_service_names_and_a_draft_that_parses(stacks):  # noqa: F811
    """The red-team's dup.py: a host reports the same server twice (another pid, same folder and
    --port). Each gets its own service table (a suffix), never one declared twice (a TOMLDecodeError,
    init's exit 70)."""
    root = str(stacks[0]["root"])
    doc = scanned_under(root)
    twin = {**doc["processes"][0], "pid": doc["processes"][0]["pid"] + 100000}
    services, _, _ = disc.interpret({**doc, "processes": [*doc["processes"], twin, dict(twin, pid=twin["pid"] + 1)]},
                                    under=root)
    names = [s.name for s in services]
    assert len(names) == len(set(names)) == len(doc["processes"]) + 2, names
    text = drafted({**doc, "processes": [*doc["processes"], twin]}, root)
    got = tomllib.loads(text)["services"]
    assert len(got) == len(doc["processes"]) + 1, sorted(got)


HOSTILE_PYTHON = """#!{python}
# A compromised host's python (the red-team's /tmp/rt-sec/hostpy): runs envbisect's agent, but
# answers discovery with the document in {answer}.
import os, sys
args = sys.argv[1:]
if len(args) >= 3 and args[0] == "-u" and args[1] == "-c":
    hook = '''
def _evil(out):
    import json
    try:
        d = json.loads(out)
    except Exception:
        return out
    if isinstance(d, dict) and isinstance(d.get("processes"), list):
        return open({answer!r}).read()
    return out
def answer(proto_out, rid, rc, out, err):
    out = _evil(out)
'''
    src = args[2].replace("def answer(proto_out, rid, rc, out, err):\\n", hook, 1)
    os.execv({python!r}, ["python", "-u", "-c", src] + args[3:])
os.execv({python!r}, ["python"] + args)
"""


def test_init_over_a_host_whose_discovery_answer_is_hostile_never_ends_in_an_internal_error(tmp_path):
    """End to end, as the red-team ran it (`init --host local --python HOSTILE`): a discovery answer
    with "now": 1e300 and a process whose pid holds a table drafts the other process; one whose
    every pid is hostile is a one-line error. Never exit 70, never a traceback."""
    import sys

    from test_init_discovery import run

    proc = {"ppid": 1, "matcher": "sglang.launch_server", "kind": "server", "title_only": False, "user": "root",
            "argv": ["python", "-m", "sglang.launch_server", "--host", "127.0.0.1", "--port", "30000"],
            "cwd": "/srv/sglang", "started_at": 1e300, "listen": [["127.0.0.1", 1e300], ["127.0.0.1", 30000]],
            "environ_readable": True, "notes": [], "log_addresses": [["127.0.0.1", "x\n[a]"]], "ancestors": [],
            "scripts": [], "env_files": [], "pid_files": [], "repos": []}
    answers = {"one good": [{**proc, "pid": 4242}, {**proc, "pid": {"t": PID_INJECT}}, {**proc, "pid": PID_INJECT}],
               "none good": [{**proc, "pid": PID_INJECT}, {**proc, "pid": -1}, {**proc, "pid": 1.5}]}
    for what, procs in answers.items():
        answer = tmp_path / f"{what}.json"
        answer.write_text(json.dumps({"hostname": "vm", "now": 1e300, "python_version": ["3", "11"], "uid": "0",
                                      "processes": procs}))
        py = tmp_path / f"python-{what.replace(' ', '-')}"
        py.write_text(HOSTILE_PYTHON.format(answer=str(answer), python=sys.executable))
        py.chmod(0o755)
        r = run("init", "--host", "local", "--python", str(py), "--out", "-", cwd=tmp_path)
        assert "Traceback" not in r.stderr and r.returncode != 70, (what, r.returncode, r.stderr[-2000:])
        if what == "one good":
            assert r.returncode == 0, r.stderr
            draft = tomllib.loads(r.stdout)
            assert list(draft["services"]) == ["server"] and list(draft["probes"]) == ["e2e"], r.stdout
            assert "pid 4242" in r.stdout and "process 2 of the host's answer was left out" in r.stdout
        else:
            assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
            assert "no SGLang server or router is running" in r.stderr
