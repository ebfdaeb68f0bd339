"""A co-restart proves its work (issue 22, F7): every stopped process is gone, every started one is
new and runs the trial's environment; otherwise the trial is unresolved (restart-failed), never a
pass or fail of the configuration that was still running. Real sshd, real processes, the simulated
PD deployment with a decode that ignores SIGTERM. See docs/safety.md."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from envbisect.hosts.restart import co_restart
from envbisect.hosts.transport import SSHTransport
from envbisect.inputs.playbook import Host, load_playbook
from envbisect.outcome import Cause, Outcome
from envbisect.sim.ports import free_port
from envbisect.sim.stack import IGNORE_SIGTERM_RULE

from test_bisect_sim import INNOCENT, plant, scenario, tree_fingerprint  # noqa: F401 - fixture

BAD = ("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")
BAD_ID = "decode:SGLANG_SM120_MMA_TARGET_CTAS"

# a service that ignores SIGTERM: a tiny HTTP server on loopback answering /health
SERVER = r'''
import http.server, os, signal, sys
if sys.argv[2] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = os.environ.get("VALUE", "unset").encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''


def one_service(tmp_path: Path, sshd, *, start: str, stop: str, stubborn: bool) -> tuple:
    """A playbook of one service `svc` on the sshd host: a loopback HTTP server (ignoring SIGTERM
    when `stubborn`), its pid file, and the given start/stop commands ({run} = its start line)."""
    d = tmp_path / "svc"
    d.mkdir()
    port = free_port()
    (d / "server.py").write_text(SERVER)
    (d / "svc.env").write_text("VALUE=old\n")
    run = (f"set -a; . {d}/svc.env; set +a; setsid nohup python3 {d}/server.py {port} "
           f"{'stubborn' if stubborn else 'plain'} >{d}/log 2>&1 </dev/null & echo $! > {d}/svc.pid")
    pb = d / "envbisect.toml"
    pb.write_text(f"""
[hosts.h]
ssh = "{sshd.alias}"
[services.svc]
host = "h"
env_file = "{d}/svc.env"
start = '''{start.format(run=run, d=d)}'''
stop = '''{stop.format(d=d)}'''
health = "http://127.0.0.1:{port}/health"
pid_file = "{d}/svc.pid"
[restart]
order = ["svc"]
health_timeout_s = 5
poll_interval_s = 0.1
stop_wait_s = 1
""")
    subprocess.run(["bash", "-c", run], check=True)
    return d, port, load_playbook(pb)


def pid_of(d: Path) -> int:
    return int((d / "svc.pid").read_text().split()[0])


def kill(pid: int) -> None:
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


def wait_healthy(port: int) -> None:
    import urllib.request

    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("the test service never answered")


def test_co_restart_refuses_when_the_old_pid_survives_the_stop(tmp_path, sshd, ssh_to):
    d, port, pb = one_service(tmp_path, sshd, stubborn=True,
                              start="[ -s {d}/svc.pid ] && kill -0 $(cat {d}/svc.pid) 2>/dev/null && exit 0; {run}",
                              stop="kill $(cat {d}/svc.pid)")
    wait_healthy(port)
    old = pid_of(d)
    try:
        (d / "svc.env").write_text("VALUE=new\n")
        t0 = time.monotonic()
        rs = co_restart(pb, ssh_to(), expect_env={"svc": {"VALUE": "new"}})
        assert not rs.ok and rs.failure == "infra" and rs.service == "svc"
        assert f"svc pid {old} still running 1 s after its stop command" in rs.message, rs.message
        assert "nothing was started" in rs.message
        assert time.monotonic() - t0 < 10
        (fact,) = rs.services
        assert fact.old_pid == old and fact.old_gone is False and not fact.proven and fact.new_pid is None
        assert pid_of(d) == old  # nothing else was started beside it
    finally:
        kill(pid_of(d))


def test_co_restart_refuses_when_the_new_process_is_the_old_one(tmp_path, sshd, ssh_to):
    """No pid file before the restart (someone deleted it), and a start command that adopts the
    process it finds running: healthy, but not a process this restart started."""
    d, port, pb = one_service(tmp_path, sshd, stubborn=False,
                              start="pgrep -o -f '{d}/[s]erver.py' > {d}/svc.pid || {{ {run}; }}",
                              stop="true")
    wait_healthy(port)
    old = pid_of(d)
    (d / "svc.pid").unlink()
    try:
        rs = co_restart(pb, ssh_to())
        assert not rs.ok and rs.failure == "infra" and rs.service == "svc"
        assert f"svc pid {old} answering after the start was started" in rs.message
        assert "before the stop began: not a process this restart started" in rs.message, rs.message
        (fact,) = rs.services
        assert fact.new_pid == old and fact.started_after_stop_s < 0 and not fact.proven
    finally:
        kill(old)


def test_co_restart_refuses_a_new_process_without_the_trials_environment(tmp_path, sshd, ssh_to):
    """A new process, but started from a copy of the env file the trial did not edit."""
    d, port, pb = one_service(tmp_path, sshd, stubborn=False, start="{run}",
                              stop="kill $(cat {d}/svc.pid); while kill -0 $(cat {d}/svc.pid) 2>/dev/null; "
                                   "do sleep 0.05; done")
    wait_healthy(port)
    try:
        rs = co_restart(pb, ssh_to(), expect_env={"svc": {"VALUE": "new"}})  # the file still says old
        assert not rs.ok and "svc pid" in rs.message
        assert "was started with VALUE not as this trial sets it" in rs.message
        assert "old" not in rs.message.split("VALUE")[1][:20]  # names the key, never the value
    finally:
        kill(pid_of(d))


def test_co_restart_proves_a_real_restart(tmp_path, sshd, ssh_to):
    d, port, pb = one_service(tmp_path, sshd, stubborn=False, start="{run}",
                              stop="kill $(cat {d}/svc.pid); while kill -0 $(cat {d}/svc.pid) 2>/dev/null; "
                                   "do sleep 0.05; done")
    wait_healthy(port)
    old = pid_of(d)
    try:
        (d / "svc.env").write_text("VALUE=new\n")
        rs = co_restart(pb, ssh_to(), expect_env={"svc": {"VALUE": "new"}})
        assert rs.ok, rs.message
        (fact,) = rs.services
        assert fact.proven and fact.old_pid == old and fact.old_gone and fact.new_pid == pid_of(d) != old
        assert fact.started_after_stop_s is not None and fact.started_after_stop_s >= 0
        assert fact.env_checked == ("VALUE",)
    finally:
        kill(pid_of(d))


# --- end to end: the simulated deployment over the real sshd ---------------------------------------------

@pytest.mark.sim
def test_a_decode_that_ignores_sigterm_never_passes_the_old_configuration(scenario, sshd):
    """The review's reproduction: a decode that ignores SIGTERM, stopped by `kill $(cat decode.pid)`,
    among 10 deltas with one guilty. The old decode (current configuration) must never answer for
    the baseline: the trials are unresolved (restart-failed, naming decode and its pid) and the
    verdict is not the false not-config."""
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    rules = json.loads(s.sim.rules_path.read_text())
    rules["rules"].append(IGNORE_SIGTERM_RULE)
    s.sim.set_rules(rules)
    root = s.sim.root
    text = s.sim.playbook.read_text()
    text = text.replace(f'stop = "{root}/bin/stop decode"', f'stop = "kill $(cat {root}/run/decode.pid)"')
    text = text.replace("poll_interval_s = 0.2", "poll_interval_s = 0.2\nstop_wait_s = 1")
    s.sim.playbook.write_text(text)
    s.sim.co_restart()  # decode now runs with the rule (bin/stop KILLs it after 5 s)
    s.baseline()
    changes = INNOCENT + [BAD] + [("prefill", "NCCL_IB_GID_INDEX", "4"), ("router", "ROUTER_POLICY", "round_robin"),
                                  ("decode", "NCCL_SOCKET_IFNAME", "eth1"), ("prefill", "MC_TE_METRIC", "0")]
    plant(s.sim, changes)
    assert len(changes) == 10
    decode_pid = s.sim.pid("decode")
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="e2e")
    baseline = [t for t in r.trials if not t.config]
    assert baseline, [t.purpose for t in r.trials]
    assert all(t.outcome == Outcome.UNRESOLVED and t.cause is Cause.RESTART_FAILED for t in baseline), baseline
    assert f"decode pid {decode_pid} still running" in baseline[0].reason, baseline[0].reason
    assert not any(t.outcome == Outcome.PASS and not t.free for t in r.trials)  # the old decode never passed
    assert r.verdict.kind != "not-config" and r.culprit_deltas in ((), (BAD_ID,)), r.verdict
    proof = baseline[0].restart_proof
    assert any(f.service == "decode" and f.old_pid == decode_pid and f.old_gone is False for f in proof)
    assert tree_fingerprint(s.sim) == before
    # the files are back at the original, which the old decode already runs: the final restore starts
    # what it stopped around it, so the stack ends as it was found (not prefill and router left down)
    assert s.sim.is_healthy("prefill") and s.sim.is_healthy("router"), r.notes
    assert s.sim.pid("decode") == decode_pid


@pytest.mark.sim
def test_a_not_config_shaped_run_whose_decode_ignores_sigterm_is_inconclusive_naming_the_restart(scenario, sshd):
    """The client path hangs (every configuration fails: a not-config shape) and decode ignores the
    SIGTERM of `kill $(cat decode.pid)`. The baseline trial's restart leaves the old decode running,
    so "the baseline fails too" was never shown: the verdict is INCONCLUSIVE, and it names the failed
    restart (cause, service, pid) in the CLI output and verdict.json, never NOT-CONFIG."""
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config), with_proxy_hang_after=3)
    rules = json.loads(s.sim.rules_path.read_text())
    rules["rules"].append(IGNORE_SIGTERM_RULE)
    s.sim.set_rules(rules)
    root = s.sim.root
    text = s.sim.playbook.read_text()
    text = text.replace(f'stop = "{root}/bin/stop decode"', f'stop = "kill $(cat {root}/run/decode.pid)"')
    text = text.replace("poll_interval_s = 0.2", "poll_interval_s = 0.2\nstop_wait_s = 1")
    s.sim.playbook.write_text(text)
    s.sim.co_restart()
    s.baseline()
    plant(s.sim, [("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "512")])
    decode_pid = s.sim.pid("decode")
    p = s.cli("bisect", "--against", "good", "--probe", "client")
    assert p.returncode == 6, (p.stdout[-3000:], p.stderr[-2000:])  # INCONCLUSIVE, not NOT-CONFIG (4)
    assert f"restart-failed: decode pid {decode_pid} still running" in p.stdout, p.stdout[-3000:]
    run = sorted((s.store / "runs").iterdir())[-1]
    doc = json.loads((run / "verdict.json").read_text())
    assert doc["verdict"] == "inconclusive", doc["explanation"]
    assert f"restart-failed: decode pid {decode_pid} still running" in doc["explanation"], doc["explanation"]
