"""The persistent agent (hosts/agent/server.py, hosts/session.py): one Python process per host
connection runs the agent scripts, with the semantics of one `python3 -c` per request (exit
status, stdout, stderr, a fresh namespace, nothing left behind for the next request), a timeout
that ends the session, and no process left on the host once envbisect has gone."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from envbisect.errors import RemoteError
from envbisect.hosts.agent_calls import run_agent, run_ops
from envbisect.hosts.transport import LocalTransport, SSHTransport
from envbisect.inputs.playbook import Host

PID = "import os, sys\nsys.stdout.write(str(os.getpid()))\n"


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def local():
    t = LocalTransport("node1", sys.executable)
    yield t
    t.close()


def test_each_request_runs_like_its_own_python_c(local, tmp_path):
    r = local.run_agent_script("a.py", "import sys\nprint(sys.stdin.read().upper())\nsys.exit(3)\n", stdin=b"hi")
    assert (r.exit_code, r.stdout, r.stderr) == (3, b"HI\n", b"")
    r = local.run_agent_script("b.py", "raise ValueError('bad input')\n")
    assert r.exit_code == 1 and r.stderr_line() == "ValueError: bad input"
    r = local.run_agent_script("c.py", "import sys\nsys.exit('a message')\n")
    assert r.exit_code == 1 and r.stderr_line() == "a message"
    # what one request changes (namespace, cwd, environment) the next one does not see
    r = local.run_agent_script("d.py", f"import os\nos.chdir({str(tmp_path)!r})\nos.environ['LEFT'] = '1'\nX = 1\n")
    assert r.ok
    r = local.run_agent_script("e.py", "import os, sys\nprint(os.getcwd(), os.environ.get('LEFT'), 'X' in globals())\n")
    assert r.stdout.decode().split() == [os.getcwd(), "None", "False"]
    # a child process that writes to its inherited stdout cannot corrupt the protocol
    r = local.run_agent_script("f.py", "import subprocess, sys\nsubprocess.run(['echo', 'stray'])\nprint('mine')\n")
    assert r.ok and r.stdout == b"mine\n"
    assert local.run_agent_script("g.py", PID).ok
    assert local._session.started == 1  # all of it in one agent process


def test_a_request_that_outlives_its_timeout_ends_the_session_and_the_next_starts_afresh(local):
    first = int(local.run_agent_script("pid.py", PID).stdout)
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match="timed out after 0.5s"):
        local.run_agent_script("hang.py", "import time\ntime.sleep(30)\n", timeout=0.5)
    assert time.monotonic() - t0 < 5
    assert wait_gone(first), "the hung agent is still running"
    second = int(local.run_agent_script("pid.py", PID).stdout)
    assert second != first and local._session.started == 2


def test_the_host_operations_through_the_session_match_one_shot_runs(local, tmp_path, monkeypatch):
    f = tmp_path / "x.serve-env"
    f.write_text("export A=1\n")
    ops = [{"op": "read_state", "path": str(f)}]
    via_session = run_ops(local, ops)
    monkeypatch.setenv("ENVBISECT_ONE_SHOT_AGENT", "1")
    one_shot = run_ops(local, ops)
    assert via_session == one_shot and via_session[0]
    with pytest.raises(RemoteError, match="node1: host operation failed"):
        run_agent(local, "hostops.py", {"ops": [{"op": "no-such-op"}]}, what="host operation")


def test_a_missing_python_is_the_same_one_line_error():
    t = LocalTransport("node1", "/nonexistent/python3")
    try:
        with pytest.raises(RemoteError) as e:
            run_ops(t, [{"op": "alive", "pid_files": []}])
        assert "node1: host operation failed (/nonexistent/python3)" in str(e.value)
        assert "No such file" in str(e.value) and "\n" not in str(e.value)
    finally:
        t.close()


def test_over_ssh_the_agent_ends_with_the_connection(sshd):
    t = SSHTransport(Host("node1", sshd.alias, sys.executable), ssh_config=str(sshd.ssh_config), attempts=1)
    pid = int(t.run_agent_script("pid.py", PID).stdout)
    assert pid_alive(pid)
    rt = t.round_trips
    for _ in range(5):
        assert run_ops(t, [{"op": "alive", "pid_files": []}]) == [{}]
    assert t.round_trips == rt + 5 and int(t.run_agent_script("pid.py", PID).stdout) == pid
    t.close()
    assert wait_gone(pid), "the agent outlived its connection"


CONTROLLER = textwrap.dedent("""\
    import sys, time
    from envbisect.hosts.transport import SSHTransport
    from envbisect.inputs.playbook import Host
    t = SSHTransport(Host("node1", sys.argv[1], sys.executable), ssh_config=sys.argv[2], attempts=1)
    print(t.run_agent_script("pid.py", "import os, sys\\nsys.stdout.write(str(os.getpid()))\\n").stdout.decode(), flush=True)
    time.sleep(600)
    """)


def test_a_controller_killed_with_sigkill_leaves_no_agent_behind(sshd, tmp_path):
    script = tmp_path / "controller.py"
    script.write_text(CONTROLLER)
    p = subprocess.Popen([sys.executable, str(script), sshd.alias, str(sshd.ssh_config)], stdout=subprocess.PIPE,
                         text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        pid = int(p.stdout.readline())
        assert pid_alive(pid)
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        assert wait_gone(pid, 15), "the agent outlived a killed controller"
    finally:
        if p.poll() is None:
            p.kill()
