"""Issue 12 part 5 end to end: a bisection over a fleet of 2 simulated PD replicas (each its own
deployment: real sglang-router, its own files and ports), reached over the real sshd, trials
side by side, each replica locked and journaled on its own."""
from __future__ import annotations

import json
import subprocess

import pytest

from test_bisect_sim import ENVBISECT, INNOCENT, Scenario, plant, tree_fingerprint

from envbisect.sim.deployment import DEFAULT_RULES

pytestmark = pytest.mark.sim

BAD = ("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")  # decode hangs (sim DEFAULT_RULES)


@pytest.fixture
def fleet(tmp_path, sshd):
    made: list[Scenario] = []

    def make(rules_b=None):
        for name, rules in (("a", None), ("b", rules_b)):
            kw = {"rules": rules} if rules is not None else {}
            made.append(Scenario(tmp_path / f"pd-{name}", ssh=sshd.alias, ssh_config=str(sshd.ssh_config), **kw))
        path = tmp_path / "fleet.toml"
        path.write_text("[fleet]\nreplicas = { " + ", ".join(
            f'pd-{n} = "{s.sim.playbook}"' for n, s in zip("ab", made)) + " }\n")
        return made, path

    yield make
    for s in made:
        s.sim.stop_all()


def _cli(path, store, sshd, *args, timeout=900):
    return subprocess.run([*ENVBISECT, "-p", str(path), "--store", str(store), "--ssh-config", str(sshd.ssh_config),
                           *args], capture_output=True, text=True, timeout=timeout)


def test_two_replicas_find_the_culprit_in_fewer_rounds_than_trials(fleet, sshd, tmp_path):
    (a, b), path = fleet()
    store = tmp_path / "store"
    snap = _cli(path, store, sshd, "snapshot", "--label", "good", "--json")
    assert snap.returncode == 0, snap.stderr
    assert set(json.loads(snap.stdout)["replicas"]) == {"pd-a", "pd-b"}
    changes = INNOCENT[:3] + [BAD] + INNOCENT[3:]
    for s in (a, b):
        plant(s.sim, changes)
    before = {s.name: tree_fingerprint(s.sim) for s in (a, b)}
    r = _cli(path, store, sshd, "bisect", "--against", "good", "--probe", "e2e", "--json")
    assert r.stdout, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["verdict"] == "culprit", (r.stderr[-3000:], doc.get("verdict"))
    assert doc["culprits"] == ["decode:SGLANG_SM120_MMA_TARGET_CTAS"]
    f = doc["fleet"]
    assert f["replicas"] == ["pd-a", "pd-b"] and not f["excluded"]
    trials = doc["trials"]
    assert {t["replica"] for t in trials} == {"pd-a", "pd-b"}
    # the premise was checked on every replica, side by side, and the rounds ran two at a time
    assert sorted(t["replica"] for t in trials if t["kind"] == "premise-baseline" and not t["config"])[:2] == \
        ["pd-a", "pd-b"]
    assert f["rounds"] < len(trials), (f, len(trials))
    # every replica is back as it was (files, HEADs) and unlocked
    assert {s.name: tree_fingerprint(s.sim) for s in (a, b)} == before
    again = _cli(path, store, sshd, "bisect", "--against", "good", "--probe", "e2e", "--max-trials", "2", "--json")
    assert "lock" not in again.stderr.lower() or again.returncode in (0, 4, 5, 6), again.stderr


def test_a_replica_whose_baseline_fails_is_excluded_with_its_evidence_and_never_blamed(fleet, sshd, tmp_path):
    broken = json.loads(json.dumps(DEFAULT_RULES))  # pd-b answers 500 whatever its config: a broken replica
    broken["rules"].append({"service": "decode", "when": {"NCCL_SOCKET_IFNAME": "*"}, "fault": "5xx"})
    (a, b), path = fleet(rules_b=broken)
    store = tmp_path / "store"
    assert _cli(path, store, sshd, "snapshot", "--label", "good").returncode == 0
    for s in (a, b):
        plant(s.sim, [INNOCENT[0], BAD, INNOCENT[1]])
    r = _cli(path, store, sshd, "bisect", "--against", "good", "--probe", "e2e", "--json")
    assert r.stdout, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["culprits"] == ["decode:SGLANG_SM120_MMA_TARGET_CTAS"], (r.stderr[-3000:], doc)
    assert list(doc["fleet"]["excluded"]) == ["pd-b"] and "baseline failed" in doc["fleet"]["excluded"]["pd-b"]
    b_trials = [t for t in doc["trials"] if t["replica"] == "pd-b"]
    assert len(b_trials) == 1 and b_trials[0]["outcome"] == "fail" and b_trials[0]["probe"]["runs"]  # its evidence
    assert any("pd-b excluded" in n for n in doc["notes"])
