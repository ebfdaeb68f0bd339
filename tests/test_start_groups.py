"""Parallel start groups (issue 38, item 1): `[restart] order = [["a", "b"], "c"]` starts a and b at
once, waits until both are healthy, then starts c; stop is the reverse, group by group. A start
failure in a group stops its siblings' waits at once and is reported per service; the restart proof
holds per service. Real sshd, real processes: small loopback HTTP servers that take LOAD seconds
before they answer, as an engine loads its weights."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from envbisect.errors import PlaybookError
from envbisect.hosts.restart import co_restart
from envbisect.hosts.transport import SSHTransport
from envbisect.inputs.playbook import Host, load_playbook
from envbisect.sim.ports import free_port

LOAD = 1.5

# VALUE from the env file; answers /health after LOAD seconds; "die" exits while loading
SERVER = r'''
import http.server, os, sys, time
time.sleep(float(sys.argv[2]))
if os.environ.get("MODE") == "die":
    sys.exit(3)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = os.environ.get("VALUE", "unset").encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''


def services(tmp_path: Path, sshd, names: tuple[str, ...], order: str, *, health_timeout: float = 20) -> tuple:
    """A playbook of `names` on the sshd host, each a loopback server with its env file, pid file and
    a start/stop log line (`events`: "start NAME" / "stop NAME" in the order the commands ran)."""
    d = tmp_path / "svcs"
    d.mkdir()
    (d / "server.py").write_text(SERVER)
    events = d / "events"
    out = [f'[hosts.h]\nssh = "{sshd.alias}"\n']
    for n in names:
        port = free_port()
        (d / f"{n}.env").write_text("VALUE=old\n")
        run = (f"echo start {n} >> {events}; set -a; . {d}/{n}.env; set +a; setsid nohup python3 {d}/server.py "
               f"{port} {LOAD} >{d}/{n}.log 2>&1 </dev/null & echo $! > {d}/{n}.pid")
        # a killed server is reparented to a pid 1 that may never reap it: a zombie counts as gone
        stop = (f"echo stop {n} >> {events}; pid=$(cat {d}/{n}.pid); kill $pid 2>/dev/null; i=0; "
                f"while [ -r /proc/$pid/stat ] && [ \"$(sed 's/.*) //' /proc/$pid/stat | cut -d' ' -f1)\" != Z ] "
                f"&& [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done; true")
        out.append(f"""[services.{n}]
host = "h"
env_file = "{d}/{n}.env"
start = '''{run}'''
stop = '''{stop}'''
health = "http://127.0.0.1:{port}/health"
pid_file = "{d}/{n}.pid"
""")
    out.append(f"[restart]\norder = {order}\nhealth_timeout_s = {health_timeout}\npoll_interval_s = 0.1\n"
               "stop_wait_s = 5\n")
    (d / "envbisect.toml").write_text("\n".join(out))
    return d, load_playbook(d / "envbisect.toml")


def pid_of(d: Path, n: str) -> int | None:
    try:
        return int((d / f"{n}.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def kill_all(d: Path, names: tuple[str, ...]) -> None:
    for n in names:
        pid = pid_of(d, n)
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def ssh_to(sshd):
    made = []

    def connect():
        t = SSHTransport(Host("h", sshd.alias), ssh_config=str(sshd.ssh_config))
        made.append(t)
        return {"h": t}

    yield connect
    for t in made:
        t.close()


NAMES = ("prefill", "decode", "router")


def test_a_group_starts_at_once_and_the_next_waits_for_all_of_it(tmp_path, sshd, ssh_to):
    d, pb = services(tmp_path, sshd, NAMES, '[["prefill", "decode"], "router"]')
    assert pb.restart.start_groups == (("prefill", "decode"), ("router",))
    assert pb.restart.order == NAMES
    transports = ssh_to()
    try:
        first = co_restart(pb, transports)  # nothing running yet: starts everything
        assert first.ok, first.message
        old = {n: pid_of(d, n) for n in NAMES}
        (d / "events").write_text("")
        for n in NAMES:
            (d / f"{n}.env").write_text("VALUE=new\n")
        steps: list[str] = []
        t0 = time.monotonic()
        rs = co_restart(pb, transports, on_step=steps.append, expect_env={n: {"VALUE": "new"} for n in NAMES})
        took = time.monotonic() - t0
        assert rs.ok, rs.message
        # two load times (the group, then the router), less than the three of one after another
        assert 2 * LOAD <= took < sum(rs.durations.values()), (took, rs.durations)
        assert steps == ["stopping router, decode, prefill", "starting prefill + decode", "starting router"]
        events = (d / "events").read_text().split("\n")
        assert events[:3] == ["stop router", "stop decode", "stop prefill"]
        assert sorted(events[3:5]) == ["start decode", "start prefill"] and events[5] == "start router"
        assert [f.service for f in rs.services] == list(NAMES)
        for f in rs.services:  # the proof, per service
            assert f.proven and f.old_pid == old[f.service] and f.old_gone
            assert f.new_pid == pid_of(d, f.service) != old[f.service]
            assert f.env_checked == ("VALUE",)
        # the router started after both engines were healthy: its start is at least a load time later
        by = {f.service: f.started_after_stop_s for f in rs.services}
        assert abs(by["prefill"] - by["decode"]) < LOAD / 2
        assert by["router"] >= max(by["prefill"], by["decode"]) + LOAD * 0.9
    finally:
        kill_all(d, NAMES)


def test_a_start_failure_in_a_group_stops_its_siblings_wait_and_is_reported_per_service(tmp_path, sshd, ssh_to):
    d, pb = services(tmp_path, sshd, NAMES, '[["prefill", "decode"], "router"]', health_timeout=60)
    transports = ssh_to()
    try:
        assert co_restart(pb, transports).ok
        (d / "events").write_text("")
        (d / "prefill.env").write_text("VALUE=new\nMODE=die\n")
        # decode never becomes healthy in time: its wait is what the failure must cut short
        (d / "decode.env").write_text("VALUE=new\n")
        slow = (d / "server.py").read_text().replace("time.sleep(float(sys.argv[2]))",
                                                     "time.sleep(float(sys.argv[2]) * (20 if os.environ.get("
                                                     "'VALUE') == 'new' and not os.environ.get('MODE') else 1))")
        (d / "server.py").write_text(slow)
        t0 = time.monotonic()
        rs = co_restart(pb, transports)
        took = time.monotonic() - t0
        assert not rs.ok and rs.failure == "start-failure" and rs.service == "prefill", rs.message
        assert rs.message.startswith("prefill died while starting"), rs.message
        assert "decode: its health wait was stopped" in rs.message, rs.message
        assert took < LOAD + 8, took  # not decode's 30 s load, nor the 60 s health timeout
        facts = {f.service: f for f in rs.services}
        assert facts["prefill"].problem == "prefill died while starting" and not facts["prefill"].proven
        assert facts["decode"].problem == "decode: its health wait was stopped" and not facts["decode"].proven
        assert not facts["router"].proven and facts["router"].new_pid is None
        assert "start router" not in (d / "events").read_text()  # the next group never started
    finally:
        kill_all(d, NAMES)


def test_order_items_are_services_or_lists_of_them(tmp_path, sshd):
    d, pb = services(tmp_path, sshd, NAMES, '["prefill", "decode", "router"]')
    assert pb.restart.start_groups == (("prefill",), ("decode",), ("router",))  # a flat list stays valid
    text = (d / "envbisect.toml").read_text()
    for bad, says in (('[["prefill", "decode"], []]', "non-empty list of services"),
                      ('[["prefill", 3], "decode", "router"]', "non-empty list of services"),
                      ('[["prefill", "decode"], ["decode", "router"]]', "lists a service twice"),
                      ('[["prefill", "decode"]]', "does not list service(s) router")):
        (d / "envbisect.toml").write_text(text.replace('order = ["prefill", "decode", "router"]', f"order = {bad}"))
        with pytest.raises(PlaybookError, match=r"restart\.order") as e:
            load_playbook(d / "envbisect.toml")
        assert says in str(e.value), str(e.value)
