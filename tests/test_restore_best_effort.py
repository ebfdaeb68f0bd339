"""The final restore starts every service even when an earlier one fails to start (best effort),
and says each one's state; a trial's co-restart still stops at the first failure. Over the real
sshd, three loopback HTTP services ordered a, bad, c; `bad`'s start command exits 1."""
from __future__ import annotations

import urllib.request
from pathlib import Path

from envbisect.hosts.restart import co_restart, service_states
from envbisect.inputs.playbook import load_playbook
from envbisect.sim.ports import free_port
from test_restart_proof import SERVER, kill, ssh_to  # noqa: F401 - fixture


def three(tmp_path: Path, sshd) -> tuple:  # noqa: ANN001
    (tmp_path / "server.py").write_text(SERVER)
    ports = {n: free_port() for n in ("a", "bad", "c")}
    text = f'[hosts.h]\nssh = "{sshd.alias}"\n'
    for n, port in ports.items():
        (tmp_path / f"{n}.env").write_text("VALUE=x\n")
        run = (f"set -a; . {tmp_path}/{n}.env; set +a; setsid nohup python3 {tmp_path}/server.py {port} plain "
               f">{tmp_path}/{n}.log 2>&1 </dev/null & echo $! > {tmp_path}/{n}.pid")
        start = "echo 'bad: engine exited during start' >&2; exit 1" if n == "bad" else run
        text += (f'[services.{n}]\nhost = "h"\nenv_file = "{tmp_path}/{n}.env"\nstart = """{start}"""\n'
                 f'stop = "kill $(cat {tmp_path}/{n}.pid) 2>/dev/null; true"\n'
                 f'health = "http://127.0.0.1:{port}/health"\npid_file = "{tmp_path}/{n}.pid"\n')
    text += ('[restart]\norder = ["a", "bad", "c"]\nhealth_timeout_s = 3\npoll_interval_s = 0.1\n'
             'stop_wait_s = 1\n')
    (tmp_path / "envbisect.toml").write_text(text)
    return ports, load_playbook(tmp_path / "envbisect.toml")


def up(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
        return True
    except OSError:
        return False


def pids(tmp_path: Path) -> list[int]:
    return [int(p.read_text().split()[0]) for p in tmp_path.glob("*.pid") if p.read_text().strip()]


def test_a_trial_stops_at_the_first_start_failure(tmp_path, sshd, ssh_to):  # noqa: F811
    ports, pb = three(tmp_path, sshd)
    try:
        rs = co_restart(pb, ssh_to())
        assert not rs.ok and rs.service == "bad"
        assert up(ports["a"]) and not up(ports["c"])
    finally:
        for pid in pids(tmp_path):
            kill(pid)


def test_the_restore_starts_every_service_after_one_fails_and_says_each_state(tmp_path, sshd, ssh_to):  # noqa: F811
    ports, pb = three(tmp_path, sshd)
    try:
        rs = co_restart(pb, ssh_to(), best_effort=True)
        assert not rs.ok and rs.service == "bad" and "engine exited during start" in rs.message
        assert up(ports["a"]) and up(ports["c"]), "c is started although bad failed before it"
        states = service_states(rs)
        assert "a: running" in states and "c: running" in states, states
        assert "bad: not up (" in states and "engine exited during start" in states, states
    finally:
        for pid in pids(tmp_path):
            kill(pid)
