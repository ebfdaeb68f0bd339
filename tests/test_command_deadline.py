"""A command's timeout is a total deadline, over SSH as locally, and past it the whole command goes:
its process group on the host, children included, not bash alone (issue 22, F10). A line from the
host agent is capped (F11). Real sshd, real processes. See docs/safety.md."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest

from envbisect.errors import RemoteError
from envbisect.hosts.transport import LocalTransport, SSHTransport
from envbisect.inputs.playbook import Host


@pytest.fixture
def ssh(sshd):
    t = SSHTransport(Host("h", sshd.alias), ssh_config=str(sshd.ssh_config))
    yield t
    t.close()


def gone(marker: str, wait_s: float = 3.0) -> bool:
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        if subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode != 0:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def n():
    """A number this test's processes carry in their command lines, and no other test's: the [ssh]
    and [local] runs of one test, on two xdist workers at once, must not find or kill each other's."""
    return random.randrange(10**6, 10**7) * 10


@pytest.fixture(params=["ssh", "local"])
def transport(request):
    if request.param == "local":
        return LocalTransport()
    return request.getfixturevalue("ssh")


def test_a_command_past_its_timeout_returns_at_the_deadline_and_its_children_are_gone(transport, n):
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match="timed out after 1"):
        transport.run(f"sleep {n + 1} & bash -c 'sleep {n + 2}'; wait", timeout=1)
    assert time.monotonic() - t0 < 2.5
    assert gone(f"sleep {n + 1}") and gone(f"sleep {n + 2}"), "the command's children were left running on the host"


def test_a_command_that_trickles_output_is_still_bounded(transport, n):
    """A timeout per read never fires for a command that prints a line every 0.2 s."""
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match="timed out after 1"):
        transport.run(f"for i in $(seq 1000); do echo tick-{n}; sleep 0.2; done", timeout=1)
    assert time.monotonic() - t0 < 2.5
    assert gone(f"tick-{n}")


def test_a_command_still_runs_as_before(transport, n):
    """Output, stderr, exit status and stdin pass unchanged through the wrapper; a detached child
    (setsid, as a start command leaves a service) outlives the command."""
    r = transport.run("cat; echo to-err >&2; exit 3", stdin=b"in\n", timeout=10)
    assert (r.exit_code, r.stdout, r.stderr) == (3, b"in\n", b"to-err\n")
    r = transport.run(f"setsid sleep {n} >/dev/null 2>&1 </dev/null & echo started", timeout=10)
    assert r.ok and r.stdout == b"started\n"
    try:
        assert not gone(f"sleep {n}", wait_s=0.5)
    finally:
        for pid in subprocess.run(["pgrep", "-f", f"sleep {n}"], capture_output=True, text=True).stdout.split():
            os.kill(int(pid), signal.SIGKILL)  # the one this test started


# --- F11: an answer from the host agent is capped -------------------------------------------------------

def test_an_over_long_line_from_the_agent_is_one_clear_error(ssh, monkeypatch):
    """A host (compromised, or a script gone wrong) answering more than the cap: refused from the
    answer's header, never read into the controller's memory; the next request starts a new agent."""
    from envbisect.hosts import session

    monkeypatch.setattr(session, "MAX_ANSWER", 1 << 20, raising=False)
    with pytest.raises(RemoteError, match=r"h: the agent answered flood.py with an answer over 1 MiB: refused"):
        ssh.run_agent_script("flood.py", "import sys\nsys.stdout.write('x' * (3 << 20))\n", timeout=30)
    r = ssh.run_agent_script("ok.py", "print('fine')\n", timeout=30)
    assert r.ok and r.stdout == b"fine\n" and ssh._session.started == 2


def test_a_flood_of_command_output_over_ssh_is_refused_and_killed(ssh, monkeypatch, n):
    from envbisect.hosts import transport

    monkeypatch.setattr(transport, "MAX_OUTPUT", 1 << 20, raising=False)
    with pytest.raises(RemoteError, match=r"h: command printed more than 1 MiB: refused, and killed"):
        ssh.run(f"while :; do head -c 65536 /dev/zero; done; : flood-{n}", timeout=30)
    assert gone(f"flood-{n}")
