"""A SIGKILL during a commit-line trial (issue 24, part 3), over the real sshd and the simulated PD
deployment: `restore` leaves the hosts byte-identical (HEAD and branch back), and `bisect --resume`
replays the commit steps already recorded instead of running them again, naming the same commit
after the same steps as a run that was never interrupted."""
from __future__ import annotations

import json
import os
import signal

import pytest

from envbisect.hosts import faults
from envbisect.runs.bisect import BisectOptions, BisectRun
from test_bisect_sim import INNOCENT, plant, scenario  # noqa: F401 - fixture
from test_commits_sim import _bytes, _git, _pull_of_five
from test_fault_injection import all_healthy, newest_run

pytestmark = [pytest.mark.sim, pytest.mark.slow]

GUILTY = 3


def _setup(scenario, sshd):
    """Five commits, the third writes the VERSION decode hangs on (healthy, but it answers no request)."""
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    rules = json.loads(s.sim.rules_path.read_text())
    rules["rules"].append({"service": "decode", "when_file": {"path": str(s.sim.src_dir / "VERSION"),
                                                              "contains": "v2-bad"}, "fault": "hang"})
    s.sim.set_rules(rules)
    s.sim.co_restart()
    s.baseline()
    shas = _pull_of_five(s, GUILTY)
    plant(s.sim, INNOCENT[:2], restart=False)
    return s, shas


def _subject(shas: list[str], sha12: str) -> str:
    return next(f"pull commit {i + 1}" for i, sha in enumerate(shas) if sha.startswith(sha12))


def test_sigkill_in_a_commit_trial_then_restore_is_byte_identical_and_resume_replays(scenario, sshd, monkeypatch):
    # the uninterrupted run: which trials walk the commit line, and how many starts came before each
    # (the crash hook counts them whenever it is set: set here to a point never reached)
    monkeypatch.setenv(faults.VAR, "start:100000")
    monkeypatch.setattr(faults, "_counts", {})
    ref, ref_shas = _setup(scenario, sshd)
    starts_before: dict[int, int] = {}

    def seen(kind: str, data: dict) -> None:
        if kind == "trial-start":
            starts_before[data["n"]] = faults._counts.get("start", 0)

    with ref.deployment() as dep:
        r = BisectRun(dep, BisectOptions(probe="e2e"), on_event=seen).start(dep.diff(against="good"))
    monkeypatch.delenv(faults.VAR)
    assert r.commit is not None and r.commit.commit is not None, r.notes
    steps = [t for t in r.trials if t.n in r.commit.trials]
    assert len(steps) >= 2, [t.purpose for t in steps]
    ref_walk = [_subject(ref_shas, t.config[0].rsplit("@", 1)[1]) for t in steps]
    # killed at the second start of the second commit trial: after its checkout, amid its co-restart
    point = starts_before[steps[1].n] + 2

    s, shas = _setup(scenario, sshd)
    before = _bytes(s.sim)
    p = s.cli("bisect", "--against", "good", "--probe", "e2e",
              env={**os.environ, "ENVBISECT_TEST_CRASH_AT": f"start:{point}"}, timeout=240)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr[-2000:])
    assert _git(s.sim.src_dir, "rev-parse", "HEAD") in shas[:-1]  # killed with the repo at a commit of the line
    run = newest_run(s)
    p = s.cli("restore", "--run", run, "--json", timeout=180)
    assert p.returncode == 0 and json.loads(p.stdout)["restored"] is True, (p.stdout[-2000:], p.stderr[-2000:])
    assert _bytes(s.sim) == before and all_healthy(s.sim)  # bytes, modes, owners, HEAD and branch

    recorded = [json.loads(x) for x in (s.store / "runs" / run / "trials.jsonl").read_text().splitlines()]
    first_step = next(t for t in recorded if t["config"] and "@" in t["config"][0])
    p = s.cli("bisect", "--resume", "--run", run, "--json", timeout=240)
    assert p.returncode in (0, 1, 3), (p.returncode, p.stderr[-2000:])
    doc = json.loads(p.stdout)
    assert doc["commit"]["commit"]["sha"] == shas[GUILTY - 1], doc["commit"]
    trials = [json.loads(x) for x in (s.store / "runs" / run / "trials.jsonl").read_text().splitlines()]
    walked = [t for t in trials if t["n"] in doc["commit"]["trials"]]
    # the step recorded before the kill is replayed (its trial, not a new one), and none is run twice
    assert first_step["n"] in doc["commit"]["trials"]
    configs = [t["config"][0] for t in walked]
    assert len(configs) == len(set(configs)), configs
    assert [_subject(shas, c.rsplit("@", 1)[1]) for c in configs] == ref_walk
    assert _bytes(s.sim) == before
