"""Bisect end to end on the simulated PD deployment (real sglang-router in front of simulated
workers whose faults come from the environment they were started with)."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from envbisect.runs.bisect import BisectOptions, BisectRun
from envbisect.runs.deployment import ConnectOptions, Deployment
from envbisect.inputs.playbook import load_playbook
from envbisect.runs.replay import load_evidence, parse_log, render_log, replay_log
from envbisect.search import TrialKind, restart_bound
from envbisect.sim.stack import build
from envbisect.state.rundir import Runs
from envbisect.state.store import Store

pytestmark = pytest.mark.sim
ENVBISECT = [sys.executable, "-m", "envbisect.cli.app"]


def tree_fingerprint(sim) -> dict:
    """Every byte, mode and mtime of the files envbisect may touch, and the repo HEAD/branch."""
    out = {}
    for p in sorted((sim.root / "conf").rglob("*")) + sorted(sim.src_dir.rglob("*")):
        if p.is_file() and ".git" not in p.parts:
            st = p.stat()
            out[str(p)] = (hashlib.sha256(p.read_bytes()).hexdigest(), st.st_mode, st.st_uid, st.st_mtime_ns)
    git = lambda *a: subprocess.run(["git", "-C", str(sim.src_dir), *a], capture_output=True, text=True).stdout.strip()
    out["HEAD"] = (git("rev-parse", "HEAD"), git("symbolic-ref", "-q", "HEAD"))
    return out


class Scenario:
    def __init__(self, tmp_path: Path, ssh: str = "local", ssh_config: str | None = None, **build_kw):
        self.sim = build(tmp_path / "dep", ssh=ssh, **build_kw)
        self.name = "sim-" + uuid.uuid4().hex[:8]  # the lock and host journal are per deployment name
        text = self.sim.playbook.read_text().replace('name = "sim-pd"', f'name = "{self.name}"')
        # A hang shows as a probe timeout; 1.5 s (instead of 5) keeps the suite quick (a failing
        # premise waits out 5 of them) and is still 30x the simulated stack's normal answer time.
        text = text.replace("timeout_s = 5\n", "timeout_s = 1.5\n")
        self.sim.playbook.write_text(text)
        self.store = tmp_path / "store"
        self.ssh_config = ssh_config
        self.sim.age_files()  # written before the stack started: the running stack may be probed as is
        self.sim.start_all()

    def deployment(self) -> Deployment:
        return Deployment(load_playbook(self.sim.playbook), Store(self.store),
                          ConnectOptions(ssh_config=self.ssh_config, attempts=1))

    def baseline(self) -> None:
        with self.deployment() as dep:
            dep.snapshot("good")

    def bisect(self, **opts):
        with self.deployment() as dep:
            diff = dep.diff(against="good")
            return BisectRun(dep, BisectOptions(**opts)).start(diff)

    def cli(self, *args, **kw):
        base = [*ENVBISECT, "-p", str(self.sim.playbook), "--store", str(self.store)]
        if self.ssh_config:
            base += ["--ssh-config", self.ssh_config]
        return subprocess.run(base + list(args), capture_output=True, text=True, **kw)


@pytest.fixture
def scenario(tmp_path):
    made = []

    def make(**kw) -> Scenario:
        s = Scenario(tmp_path / f"s{len(made)}", **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.sim.stop_all()


INNOCENT = [("prefill", "NCCL_DEBUG", "INFO"), ("decode", "SGLANG_ENABLE_JIT_DEEPGEMM", "1"),
            ("router", "ROUTER_LOG_LEVEL", "debug"), ("decode", "NCCL_IB_GID_INDEX", "5"),
            ("prefill", "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE", "8")]


def plant(sim, changes, restart: bool = True) -> None:
    for service, key, value in changes:
        sim.set_env(service, key, value)
    if restart:
        sim.age_files()
        sim.co_restart()


def test_single_culprit_among_innocent_changes(scenario, request):
    s = scenario()
    s.baseline()
    plant(s.sim, INNOCENT[:3] + [("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")] + INNOCENT[3:])
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit", r.verdict
    assert r.culprit_deltas == ("decode:SGLANG_SM120_MMA_TARGET_CTAS",)
    # the first premise probes the running stack (every process runs its files: no restart), then
    # ceil(log2 6) + 1 premise check + 1 to see the culprit fail alone + 1 to see the fix pass
    assert r.trials[0].free and r.trials[0].restart_s == 0
    assert r.restarts <= restart_bound(6), [t.purpose for t in r.trials]
    assert any(t.purpose.startswith("confirm: current without") and t.outcome == "pass" for t in r.trials)
    assert any(t.units == ("decode:SGLANG_SM120_MMA_TARGET_CTAS",) and t.outcome == "fail" for t in r.trials)
    assert r.trials[0].outcome == "fail" and r.trials[1].outcome == "pass"  # premises checked first
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before


def test_interacting_pair_fails_only_together(scenario):
    s = scenario()
    s.baseline()
    plant(s.sim, INNOCENT[:2] + [("prefill", "SGLANG_ENABLE_TRANSFER_COALESCE", "1")] + INNOCENT[2:4]
          + [("prefill", "MC_FORCE_TCP", "1")])
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "interaction", r.verdict
    assert set(r.culprit_deltas) == {"prefill:SGLANG_ENABLE_TRANSFER_COALESCE", "prefill:MC_FORCE_TCP"}
    assert len(r.trials) <= 2 * 3 + 2 + 1
    alone = {t.units[0]: t.outcome for t in r.trials if len(t.units) == 1}
    assert "pass" in alone.values()  # one of the pair was seen to be harmless alone


def test_intermittent_culprit_is_found_with_repeated_probes(scenario):
    rules = {"rules": [{"service": "decode", "when": {"SGLANG_ENABLE_JIT_DEEPGEMM": "1"}, "fault": "intermittent",
                        "p": 0.5, "seed": 7, "mode": "5xx"}],
             "kv_layout_vars": ["SGLANG_KV_PAGE_SIZE", "SGLANG_KV_CACHE_DTYPE"]}
    s = scenario(rules=rules)
    s.baseline()
    plant(s.sim, INNOCENT)
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit", r.verdict
    assert r.culprit_deltas == ("decode:SGLANG_ENABLE_JIT_DEEPGEMM",)
    assert r.verdict.confidence >= 0.95


def test_git_head_culprit_and_leave_fixed(scenario):
    s = scenario()
    rules = json.loads(s.sim.rules_path.read_text())
    rules["rules"].append({"service": "decode", "when_file": {"path": str(s.sim.src_dir / "VERSION"),
                                                              "contains": "v2-bad"}, "fault": "crash"})
    s.sim.set_rules(rules)
    s.sim.co_restart()
    s.baseline()
    (s.sim.src_dir / "VERSION").write_text("v2-bad\n")
    subprocess.run(["git", "-C", str(s.sim.src_dir), "commit", "-qam", "v2: new kernels"], check=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@x"})
    plant(s.sim, INNOCENT[:3], restart=False)  # decode would crash now; the premise check will see it
    r = s.bisect(probe="e2e", leave="fixed")
    assert r.verdict.kind == "culprit", r.verdict
    assert r.culprit_deltas == (f"git:node1:{s.sim.src_dir}",)
    assert any(t.outcome == "start-failure" for t in r.trials)  # decode died at start: counted as a failure
    # left at current minus the culprit: the innocent knobs stay, the repo is back at the old commit
    assert r.state_left == "fixed" and r.final_probe.outcome == "pass"
    assert "NCCL_DEBUG=INFO" in s.sim.env_file("prefill").read_text()
    assert (s.sim.src_dir / "VERSION").read_text() != "v2-bad\n"


def test_not_config_when_the_client_path_breaks(scenario):
    """The incident: a client-side proxy hangs on reused keep-alive connections; the one config
    delta must not be blamed."""
    s = scenario(with_proxy_hang_after=3)
    s.baseline()
    plant(s.sim, [("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "512")])
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="client")
    assert r.verdict.kind == "not-config", r.verdict
    assert r.culprit_deltas == ()
    assert r.path_report is not None and r.path_report.broken_at == "client path"
    assert all(l.ok for l in r.path_report.layers if l.name != "client path")
    assert "not in the deployment's configuration" in r.path_report.conclusion
    assert tree_fingerprint(s.sim) == before


def test_not_reproduced_points_at_drift(scenario):
    s = scenario()
    s.baseline()
    # The operator edits decode's file but restarts prefill alone: decode still runs the old
    # environment (drift) and the restarted prefill breaks the PD pair.
    s.sim.set_env("decode", "NCCL_DEBUG", "INFO")
    s.sim.restart("prefill")
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "not-reproduced", r.verdict
    assert any("decode" in h and "NCCL_DEBUG" in h for h in r.drift_hint)
    assert r.exit_status == 5


def test_cli_bisect_json_and_dry_run(scenario):
    s = scenario()
    s.baseline()
    plant(s.sim, INNOCENT[:2] + [("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")])
    before = tree_fingerprint(s.sim)
    r = s.cli("bisect", "--against", "good", "--dry-run")
    assert r.returncode == 0 and "dry run: no host was touched" in r.stdout
    assert tree_fingerprint(s.sim) == before
    r = s.cli("bisect", "--against", "good", "--probe", "e2e", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "culprit" and doc["culprits"] == ["decode:SGLANG_SM120_MMA_TARGET_CTAS"]
    assert doc["state_left"] == "original" and doc["confidence"] >= 0.95
    assert [t["n"] for t in doc["trials"]] == list(range(1, len(doc["trials"]) + 1))
    assert all({"config", "outcome", "probe", "restart_s", "probe_s"} <= set(t) for t in doc["trials"])
    assert "trial 1" in r.stderr  # progress goes to stderr
    assert tree_fingerprint(s.sim) == before


def bisect_until(s: Scenario, marker: str, probe: str = "e2e", *extra: str,
                 wait_s: float = 60) -> tuple[subprocess.Popen, str]:
    """Start `envbisect bisect` in a child process and read its progress until `marker` shows."""
    p = subprocess.Popen([*ENVBISECT, "-p", str(s.sim.playbook), "--store", str(s.store), "bisect", "--against",
                          "good", "--probe", probe, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = ""
    deadline = time.time() + wait_s
    while marker not in seen:
        line = p.stderr.readline()
        assert line and time.time() < deadline, f"bisect ended before {marker!r}: {seen}"
        seen += line
    return p, seen


@pytest.mark.parametrize("sig,after", [(signal.SIGINT, "trial 2"), (signal.SIGTERM, "trial 3")])
def test_interrupt_restores_hosts_and_prints_resume(scenario, sig, after):
    s = scenario()
    s.baseline()
    plant(s.sim, INNOCENT[:3] + [("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")])
    before = tree_fingerprint(s.sim)
    p, seen = bisect_until(s, after)
    time.sleep(0.5)  # mid-trial: files edited, services restarting
    p.send_signal(sig)
    _, rest = p.communicate(timeout=60)
    seen += rest
    assert p.returncode != 0
    assert "To resume, run: envbisect" in seen and "--resume" in seen
    assert tree_fingerprint(s.sim) == before
    # resume finishes the run without repeating the finished trials
    runs = sorted((s.store / "runs").iterdir())
    done = len((runs[-1] / "trials.jsonl").read_text().splitlines())
    r = s.cli("bisect", "--resume", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["culprits"] == ["decode:SGLANG_SM120_MMA_TARGET_CTAS"]
    assert len(doc["trials"]) >= done and f"after {done} finished trial(s)" in r.stderr
    assert tree_fingerprint(s.sim) == before


def test_kill_9_then_restore_is_byte_identical(scenario):
    s = scenario()
    s.baseline()
    plant(s.sim, INNOCENT[:3] + [("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")])
    before = tree_fingerprint(s.sim)
    p, _ = bisect_until(s, "trial 3")
    time.sleep(0.3)
    p.kill()
    p.wait()
    assert tree_fingerprint(s.sim) != before  # a trial configuration is live
    # a second run is refused while the dead run's lock is there... unless recognised as stale
    r = s.cli("restore", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["restored"] is True
    assert tree_fingerprint(s.sim) == before
    r = s.cli("restore", "--json")
    assert json.loads(r.stdout)["restored"] is False  # nothing left to undo


def test_bisect_over_real_sshd(scenario, sshd):
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    s.baseline()
    plant(s.sim, INNOCENT[:2] + [("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")] + INNOCENT[2:3])
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="multi_round")
    assert r.verdict.kind == "culprit" and r.culprit_deltas == ("decode:SGLANG_SM120_MMA_TARGET_CTAS",)
    assert tree_fingerprint(s.sim) == before


def test_lost_ssh_connection_is_unresolved_not_blamed(scenario, sshd):
    """The ssh connection dies while a trial is probing: that trial proves nothing (unresolved),
    envbisect reconnects, the search goes on, and the verdict and the restore are still right."""
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    s.baseline()
    plant(s.sim, INNOCENT[:2] + [("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")] + INNOCENT[2:3])
    before = tree_fingerprint(s.sim)
    state = {"armed": False, "cut": False}

    def cut_connections(kind, data):
        if kind == "trial-start" and data["n"] == 3:
            state["armed"] = True
        if kind == "step" and data["message"].startswith("probing") and state["armed"] and not state["cut"]:
            children = subprocess.run(["pgrep", "-P", str(sshd.proc.pid)], capture_output=True, text=True).stdout.split()
            for pid in children:  # the per-connection sshd processes: the connection drops
                os.kill(int(pid), signal.SIGKILL)
            state["cut"] = bool(children)

    with s.deployment() as dep:
        r = BisectRun(dep, BisectOptions(probe="e2e"), on_event=cut_connections).start(dep.diff(against="good"))
    assert state["cut"]
    assert r.trials[2].outcome == "unresolved" and "lost the ssh connection" in r.trials[2].reason
    assert r.verdict.kind == "culprit" and r.culprit_deltas == ("decode:SGLANG_SM120_MMA_TARGET_CTAS",)
    assert tree_fingerprint(s.sim) == before


def test_zero_deltas_probes_the_stack(scenario):
    """Nothing changed since the baseline: the verdict is observed, never assumed (issue 7)."""
    s = scenario()
    s.baseline()
    pids = {svc: s.sim.pid(svc) for svc in ("prefill", "decode", "router")}
    before = tree_fingerprint(s.sim)
    p = s.cli("bisect", "--against", "good", "--probe", "e2e", "--json")
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "not-reproduced", (p.stdout, p.stderr)
    assert tree_fingerprint(s.sim) == before
    # every process verifiably runs its files, so the running stack itself was probed: no restart
    assert doc["restarts"] == 0 and doc["trials"][0]["free"] and doc["trials"][0]["probe"]["passes"] >= 12
    assert "trial 1" in doc["explanation"]
    assert p.returncode == 5
    assert {svc: s.sim.pid(svc) for svc in pids} == pids  # nothing was restarted
    # drift (decode's file edited, decode not restarted) and a baseline taken after the edit: still
    # zero deltas, but the running stack is not its files, so the first premise co-restarts
    s.sim.set_env("decode", "NCCL_DEBUG", "INFO")
    with s.deployment() as dep:
        dep.snapshot("after-edit")
    p = s.cli("bisect", "--against", "after-edit", "--probe", "e2e", "--json")
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "not-reproduced" and not doc["trials"][0]["free"] and doc["restarts"] == 1, p.stdout
    assert any("drift" in n for n in doc["notes"]), doc["notes"]
    assert "Observed: the current config passed" in doc["explanation"] and "(trial 1)" in doc["explanation"]


def test_auto_linked_twin_innocent_on_one_side(scenario, sshd):
    """The same knob raised in prefill and decode; only the decode side breaks the stack. The search
    splits the auto-linked unit with the trial it runs anyway (search/hints.py): decode's side is
    asked alone first (decode fails when asked directly), and its fix check, which keeps prefill's
    side, clears it. Only decode's delta is blamed, with no refinement trial after the verdict, and
    the note says which trials showed it. Over the real sshd."""
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    s.baseline()
    plant(s.sim, [("prefill", "NCCL_DEBUG", "INFO"), ("prefill", "SGLANG_SM120_MMA_TARGET_CTAS", "256"),
                  ("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")])
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit", r.verdict
    assert r.culprit_deltas == ("decode:SGLANG_SM120_MMA_TARGET_CTAS",), (r.culprit_deltas, r.notes)
    assert not [t for t in r.trials if t.kind is TrialKind.REFINE]
    alone = next(t for t in r.trials if t.units == ("member:decode:SGLANG_SM120_MMA_TARGET_CTAS",))
    fix = next(t for t in r.trials if "member:prefill:SGLANG_SM120_MMA_TARGET_CTAS" in t.units
               and "member:decode:SGLANG_SM120_MMA_TARGET_CTAS" not in t.units)
    assert alone.outcome == "fail" and fix.outcome == "pass"
    note = next(n for n in r.notes if "tested apart inside the search" in n)
    assert f"decode:SGLANG_SM120_MMA_TARGET_CTAS failed alone in trial {alone.n}" in note, note
    assert f"prefill:SGLANG_SM120_MMA_TARGET_CTAS passed without the other side in trial {fix.n}" in note, note
    assert "only decode:SGLANG_SM120_MMA_TARGET_CTAS is to blame" in note
    assert f"decode:SGLANG_SM120_MMA_TARGET_CTAS alone failed (trial {alone.n})" in r.verdict.explanation
    assert "member:" not in r.verdict.explanation, r.verdict.explanation
    assert r.restarts <= restart_bound(2), [t.purpose for t in r.trials]
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before
    # the record replays to the same verdict: the run recorded the search's twins (run.json)
    ev = load_evidence(Runs(Store(s.store).runs_dir).get(r.run_id))
    rp = replay_log(ev, parse_log(render_log(ev), "as-recorded.log"))
    assert not rp.needs and rp.result.verdict.culprits == r.verdict.culprits == ("linked:SGLANG_SM120_MMA_TARGET_CTAS",)
    assert rp.result.culprit_deltas == r.culprit_deltas and rp.result.refined == r.refined


def test_a_twin_among_8_deltas_costs_no_more_restarts_than_a_bisection_without_it(scenario):
    """Issue 25: 8 deltas with the bad value set in prefill and decode (one auto-linked twin, only
    decode's side to blame) against 8 deltas with it in decode alone: the same verdict, and no
    more restarts."""
    extra = [("router", "RUST_BACKTRACE", "full")]
    found = {}
    for twin in (True, False):
        s = scenario()
        s.baseline()
        bad = [("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")]
        if twin:
            bad = [("prefill", "SGLANG_SM120_MMA_TARGET_CTAS", "256")] + bad
        else:
            extra = extra + [("prefill", "SGLANG_SCHEDULER_INTERVAL", "2")]
        plant(s.sim, INNOCENT[:3] + bad + INNOCENT[3:] + extra)
        r = s.bisect(probe="e2e")
        assert len({d for ds in r.units.values() for d in ds}) == 8, r.units
        assert r.verdict.kind == "culprit", r.verdict
        found[twin] = (r.culprit_deltas, r.restarts)
        s.sim.stop_all()
    assert found[True][0] == found[False][0] == ("decode:SGLANG_SM120_MMA_TARGET_CTAS",), found
    assert found[True][1] <= found[False][1], found


def test_a_link_declared_in_the_playbook_stays_whole(scenario):
    """[bisect] link = [KEY]: the user says both sides form one unit; the verdict names the group and
    no member is tested apart (the same for --link)."""
    s = scenario()
    s.sim.playbook.write_text(s.sim.playbook.read_text() + '\n[bisect]\nlink = ["SGLANG_SM120_MMA_TARGET_CTAS"]\n')
    s.baseline()
    plant(s.sim, [("prefill", "NCCL_DEBUG", "INFO"), ("prefill", "SGLANG_SM120_MMA_TARGET_CTAS", "256"),
                  ("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")])
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit", r.verdict
    assert set(r.culprit_deltas) == {"decode:SGLANG_SM120_MMA_TARGET_CTAS", "prefill:SGLANG_SM120_MMA_TARGET_CTAS"}
    assert not [t for t in r.trials if t.kind is TrialKind.REFINE] and "apart" not in r.verdict.explanation
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before


@pytest.mark.parametrize("nth", [1, 2, 3])  # the lock, and the journal's first writes
def test_sigterm_before_the_first_trial_ends_the_run_as_ctrl_c_does(scenario, nth):
    """SIGTERM while the run reads the hosts, takes the lock and writes its journal (before any
    trial): one line, exit 130, and no lock or journal left on the host (blind red-team, signals:
    the process died of the signal, exit -15 and nothing said, its lock and once its journal left)."""
    s = scenario()
    s.baseline()
    plant(s.sim, INNOCENT[:2] + [("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")])
    before = tree_fingerprint(s.sim)
    p = subprocess.Popen([*ENVBISECT, "-vv", "-p", str(s.sim.playbook), "--store", str(s.store), "bisect",
                          "--against", "good", "--probe", "e2e"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    seen, trips, deadline = "", 0, time.time() + 60
    while trips < nth:
        line = p.stderr.readline()
        assert line and time.time() < deadline, f"bisect ended first: {seen[-3000:]}"
        seen += line
        trips += "agent hostops" in line
    p.send_signal(signal.SIGTERM)
    _, rest = p.communicate(timeout=120)
    seen += rest
    assert p.returncode == 130 and "envbisect: interrupted" in seen, (p.returncode, seen[-2000:])
    state = Path.home() / ".envbisect"
    left = sorted(x.name for x in state.glob(f"{s.name}*") if not x.name.endswith(".guard")) if state.is_dir() else []
    assert left == [], left
    assert tree_fingerprint(s.sim) == before


def test_a_first_sigterm_during_the_final_restore_is_noted_and_the_verdict_kept(scenario):
    """The verdict is reached and the hosts are going back: a first SIGTERM there is noted, not
    obeyed, and the run ends with its verdict (blind red-team, signals: the restore was cut off,
    redone, and the run exited 130 with no verdict.json, to be resumed)."""
    s = scenario()
    s.baseline()
    plant(s.sim, INNOCENT[:2] + [("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")])
    before = tree_fingerprint(s.sim)
    p, seen = bisect_until(s, "restoring the original files", "e2e", "--json", wait_s=300)
    p.send_signal(signal.SIGTERM)
    out, rest = p.communicate(timeout=120)
    seen += rest
    assert p.returncode == 0 and "putting the hosts back first" in seen, (p.returncode, seen[-2000:])
    doc = json.loads(out)
    assert doc["culprits"] == ["decode:SGLANG_SM120_MMA_TARGET_CTAS"] and doc["state_left"] == "original"
    assert (s.store / "runs" / doc["run"] / "verdict.json").is_file()
    assert tree_fingerprint(s.sim) == before
