"""`envbisect watch` end to end over the real sshd, the simulated PD deployment (the e2e HTTP probe
through the real sglang-router) and a real Prometheus Alertmanager: the watch sees the stack turn red
(a fault planted after a passing observation) or receives the alert, bisects on its own, names the
planted culprit, leaves the stack as configured, writes the bundle and runs --notify exactly once."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from alertmanager import ALERTMANAGER_YML
from clistack import ENVBISECT
from test_bisect_sim import INNOCENT, Scenario, plant, tree_fingerprint

CULPRIT = ("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")
ALERT = "SGLangRequestsFailing"
EARLY, LATER = "SGLangTTFTHigh", "SGLangDecodeStalled"
SECRET = "test-webhook-secret-0123456789abcdef"
GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guide.md"


def events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written
            pass
    return out


def wait_for(what, cond, timeout: float, proc: subprocess.Popen):  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        if proc.poll() is not None:
            raise AssertionError(f"the watch exited ({proc.returncode}) while waiting for {what}: "
                                 f"{proc.stderr.read()[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def notified(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().split("\n\n") if x.strip()] if path.exists() else []


class Watch:
    def __init__(self, s: Scenario, tmp: Path, *args: str):
        self.events, self.notify = tmp / "events.jsonl", tmp / "notified"
        cmd = [*ENVBISECT, "-p", str(s.sim.playbook), "--store", str(s.store), "--ssh-config", s.ssh_config,
               "--events", str(self.events), "watch", "--probe", "e2e",
               "--notify", f"cat >> {self.notify}; echo >> {self.notify}", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def observations(self) -> list[str]:
        return [e["outcome"] for e in events(self.events) if e["event"] == "watch-observation"]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode


def check_bundle(doc: dict) -> None:
    bundle = Path(doc["watch"]["bundle"])
    assert bundle.is_file() and bundle.parent.name == "bundles"
    with tarfile.open(bundle) as t:
        names = t.getnames()
    assert "manifest.json" in names and "report.md" in names and "verdict.json" in names


@pytest.mark.sim
@pytest.mark.slow
def test_sim_watch_turns_red_bisects_on_its_own_and_notifies_once(sshd, tmp_path):
    s = Scenario(tmp_path / "s", ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    w = None
    try:
        first = Watch(s, tmp_path, "--once")  # as the crontab line runs it: one observation, a pass
        assert first.proc.wait(timeout=120) == 0, first.proc.stderr.read()
        assert first.observations() == ["pass"]
        # the fault, co-restarted while no watch runs (a watch probing every 0.5 s would see the restart
        # itself fail twice); the watch remembers its state in the store across restarts
        plant(s.sim, INNOCENT[:2] + [CULPRIT])
        w = Watch(s, tmp_path, "--every", "0.5s")
        planted = tree_fingerprint(s.sim)
        texts = {svc: s.sim.env_file(svc).read_text() for svc in ("prefill", "decode", "router")}
        wait_for("a failing observation", lambda: "fail" in w.observations(), 60, w.proc)
        second = s.cli("watch", "--once", timeout=60)  # one watch per deployment
        assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
        assert f"another watch is watching {s.name!r} (pid {w.proc.pid} on this host" in second.stderr
        docs = wait_for("the verdict on --notify", lambda: notified(w.notify), 400, w.proc)
        assert {svc: s.sim.env_file(svc).read_text() for svc in texts} == texts, w.proc.stderr
        n_obs = len(w.observations())
        wait_for("two more failing cycles", lambda: w.observations()[n_obs:].count("fail") >= 2, 120, w.proc)
        assert w.stop() == 130  # SIGTERM, as `systemctl stop` sends it
        assert len(notified(w.notify)) == 1  # the further failing cycles did not act again
        (doc,) = docs
        assert doc["verdict"] == "culprit" and doc["culprits"] == ["decode:SGLANG_SM120_MMA_TARGET_CTAS"], doc
        assert doc["watch"]["trigger"] == "probe" and doc["watch"]["event"] == "verdict"
        assert doc["state_left"] == "original" and tree_fingerprint(s.sim) == planted  # put back as it was
        assert doc["last_good"]["snapshot"] == doc["watch"]["incident"].removeprefix("probe:")
        check_bundle(doc)
        kinds = [e["event"] for e in events(w.events)]
        assert kinds.count("watch-bisect") == 1 and kinds.count("verdict") == 1 and "trial-end" in kinds, kinds
        assert not list((s.store / "watch").glob("*.lock"))  # the lock went with the watch
    finally:
        if w is not None:
            w.stop()
        s.sim.stop_all()


@pytest.mark.sim
@pytest.mark.slow
def test_sim_watch_acts_on_a_real_alertmanager_webhook_once_and_leaves_it_fixed(sshd, tmp_path, alertmanager_for,
                                                                                free_port):
    """Alertmanager with the webhook secret (http_config authorization, credentials_file): an alert
    the watch's probe does not confirm starts nothing; the planted fault's alert starts one
    bisection after the probe confirms it; the same POST without the secret, with a wrong content
    type or as a page's form gets 401/415; a second alert inside the cooldown starts nothing."""
    s = Scenario(tmp_path / "s", ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    secret = tmp_path / "webhook.secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    pb = s.sim.playbook.read_text()
    s.sim.playbook.write_text(pb.replace(
        "max_file_size = 1048576\n", f'max_file_size = 1048576\nalerts = ["{ALERT}", "{EARLY}", "{LATER}"]\n'
                                     f'secret_file = "{secret}"\n', 1))
    url = f"http://127.0.0.1:{free_port}/"
    am = alertmanager_for(url, str(secret))
    w = None
    try:
        # a long interval: the alert, not the probe's cycle, is what triggers here
        w = Watch(s, tmp_path, "--every", "1h", "--listen", f"127.0.0.1:{free_port}", "--leave", "fixed")
        wait_for("a passing observation", lambda: "pass" in w.observations(), 120, w.proc)
        wait_for("the listener", lambda: any(e["event"] == "watch-listen" for e in events(w.events)), 30, w.proc)
        am.push(EARLY, job="sglang")  # the stack still passes: the probe does not confirm it
        wait_for("its decision", lambda: decided(w, EARLY, "not acted on"), 120, w.proc)
        plant(s.sim, INNOCENT[:2] + [CULPRIT])
        am.push("SomethingElse", job="sglang")  # not in [watch] alerts: no action
        am.push(ALERT, job="sglang", severity="page")
        docs = wait_for("the verdict on --notify", lambda: notified(w.notify), 400, w.proc)
        (doc,) = docs
        assert doc["verdict"] == "culprit" and doc["culprits"] == ["decode:SGLANG_SM120_MMA_TARGET_CTAS"], doc
        assert doc["watch"]["trigger"] == "alert" and doc["watch"]["incident"].startswith("alert:"), doc["watch"]
        assert doc["state_left"] == "fixed" and doc["final_probe"]["outcome"] == "pass"
        decode = s.sim.env_file("decode").read_text()
        assert "SGLANG_SM120_MMA_TARGET_CTAS=128" in decode and "SGLANG_ENABLE_JIT_DEEPGEMM=1" in decode
        check_bundle(doc)
        got = [e for e in events(w.events) if e["event"] == "watch-alert"]
        mine = next(e for e in got if e["alertname"] == ALERT)
        assert mine["receiver"] == "envbisect" and mine["fingerprint"] and mine["startsAt"] and mine["groupKey"]
        assert "SomethingElse" not in {e["alertname"] for e in got}  # never queued
        confirming = [e for e in events(w.events) if e["event"] == "watch-observation" and e.get("because")]
        assert [(e["because"], e["outcome"]) for e in confirming] == [(f"alert {EARLY}", "pass"),
                                                                      (f"alert {ALERT}", "fail")], confirming
        kinds = [e["event"] for e in events(w.events)]
        assert kinds.index("watch-bisect") > events(w.events).index(confirming[-1])
        # the same POST without the secret, with a wrong content type, or as a page's form
        again = {"receiver": "envbisect", "status": "firing", "version": "4", "groupKey": mine["groupKey"],
                 "alerts": [{"status": "firing", "labels": {"alertname": ALERT}, "fingerprint": mine["fingerprint"],
                             "startsAt": mine["startsAt"] + "1"}]}
        body = json.dumps(again).encode()
        assert post(url, body, auth=None) == 401
        assert post(url, body, content_type="text/plain") == 415
        assert post(url, b"alerts=1", auth=None, content_type="application/x-www-form-urlencoded",
                    Origin="https://evil.example") == 401
        # Alertmanager's repeat of the same alert (same fingerprint and startsAt): never a second bisection
        again["alerts"][0]["startsAt"] = mine["startsAt"]
        assert post(url, json.dumps(again).encode()) == 200
        wait_for("the repeat's decision", lambda: len([e for e in events(w.events) if e["event"] == "watch-decision"
                                                       and e.get("incident") == mine_incident(mine)]) >= 2, 30, w.proc)
        # a second alert inside the cooldown, through Alertmanager: logged, nothing started, not even a probe
        am.push(LATER, job="sglang")
        wait_for("the cooldown's decision", lambda: decided(w, LATER, "cooldown"), 120, w.proc)
        assert w.stop() == 130
        assert len(notified(w.notify)) == 1
        assert [e["event"] for e in events(w.events)].count("watch-bisect") == 1
        assert len([e for e in events(w.events) if e["event"] == "watch-observation" and e.get("because")]) == 2
    finally:
        if w is not None:
            w.stop()
        s.sim.stop_all()


def decided(w: Watch, alertname: str, words: str) -> bool:
    return any(e["event"] == "watch-decision" and f"alert {alertname}" in e["reason"] and words in e["reason"]
               and e["act"] == "nothing" for e in events(w.events))


def post(url: str, body: bytes, auth: str | None = SECRET, content_type: str = "application/json",
         **headers: str) -> int:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": content_type, **({"Authorization": f"Bearer {auth}"} if auth else {}), **headers})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def mine_incident(alert_event: dict) -> str:
    return f"alert:{alert_event['fingerprint']}@{alert_event['startsAt']}"


def test_the_guide_shows_the_alertmanager_config_and_the_unit_as_tested():
    guide = GUIDE.read_text()
    assert ALERTMANAGER_YML.format(url="http://127.0.0.1:9798/",
                                   secret_file="/etc/prometheus/envbisect-webhook.secret") in guide
    for line in ("Type=simple", "Restart=on-failure", "RestartSec=30s", "TimeoutStopSec=15min",
                 "WantedBy=default.target"):
        assert line in guide, line
    assert f'alerts = ["{ALERT}"]' in guide
    assert os.path.isfile(GUIDE)


@pytest.mark.sim
@pytest.mark.slow
def test_sim_watch_waits_for_an_unrestored_journal_then_acts(sshd, tmp_path):
    s = Scenario(tmp_path / "s", ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    try:
        first = Watch(s, tmp_path, "--once")
        assert first.proc.wait(timeout=120) == 0 and first.observations() == ["pass"], first.proc.stderr.read()
        plant(s.sim, INNOCENT[:2] + [CULPRIT])
        # a bisection killed (SIGKILL) at its first host write: its journal is active on the host
        crashed = s.cli("bisect", "--since", "last-good", "--probe", "e2e", timeout=300,
                        env={**os.environ, "ENVBISECT_TEST_CRASH_AT": "write:1"})
        assert crashed.returncode == -9, crashed.stderr[-2000:]
        runs_before = sorted(p.name for p in (s.store / "runs").iterdir())
        w = Watch(s, tmp_path, "--every", "0.5s", "--max-cycles", "3")
        assert w.proc.wait(timeout=300) == 0, w.proc.stderr.read()
        err = w.proc.stderr.read()
        assert w.observations()[-3:] == ["fail", "fail", "fail"], w.observations()
        assert "cannot start" in err and "not undone yet" in err, err
        assert sorted(p.name for p in (s.store / "runs").iterdir()) == runs_before  # no bisection started
        (blocked,) = notified(w.notify)
        assert blocked["watch"]["event"] == "blocked" and "envbisect restore --run" in blocked["watch"]["reason"]
        r = s.cli("restore", timeout=300)
        assert r.returncode == 0 and "restored" in r.stdout, r.stdout + r.stderr
        w = Watch(s, tmp_path, "--every", "0.5s", "--max-cycles", "1")  # the trigger still stands: it acts now
        assert w.proc.wait(timeout=400) == 0, w.proc.stderr.read()
        docs = notified(w.notify)
        assert [d["watch"]["event"] for d in docs] == ["blocked", "verdict"]
        assert docs[1]["verdict"] == "culprit" and docs[1]["culprits"] == ["decode:SGLANG_SM120_MMA_TARGET_CTAS"]
    finally:
        s.sim.stop_all()
