"""Issue 12 part 5 end to end: a bisection over a fleet of 2 simulated PD replicas (each its own
deployment: real sglang-router, its own files and ports), reached over the real sshd, trials
side by side, each replica locked and journaled on its own."""
from __future__ import annotations

import json
import subprocess

import pytest

from test_bisect_sim import ENVBISECT, INNOCENT, Scenario, plant, tree_fingerprint

from envbisect.sim.stack import DEFAULT_RULES

pytestmark = [pytest.mark.sim, pytest.mark.slow]

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


# --- replicas as inventory groups: one replica playbook, an Ansible inventory ----------------------

def _template_and_inventory(tmp_path, sshd, scenarios):
    """Replica a's playbook with its root and ports turned into {{ variables }}, its host into an
    inventory role; an inventory whose groups pd_a and pd_b each hold one host with those vars."""
    from test_inventory import sshd_hostvars

    a = scenarios[0]
    text = a.sim.playbook.read_text()
    text = text.replace(str(a.sim.root), "{{ sim_root }}")
    for name, port in sorted(a.sim.ports.items(), key=lambda kv: -len(str(kv[1]))):
        text = text.replace(f":{port}/", f":{{{{ port_{name} }}}}/")
    head, _, rest = text.partition("[hosts.node1]\n")
    rest = rest.split("\n", 1)[1]  # drop its ssh = ... line: the host comes from the replica's group
    text = head + '[hosts.node1]\ninventory = "sim"\n' + rest
    text = text.replace(f'name = "{a.name}"', f'name = "{a.name}-fleet"')  # its own lock/journal per test
    assert "{{ sim_root }}" in text and "{{ port_router }}" in text and f'"{a.sim.root}' not in text
    template = tmp_path / "replica.toml"
    template.write_text(text)
    kh = tmp_path / "kh"
    kh.write_text(sshd.known_hosts_line + "\n")
    hostvars = {f"node-{n}": {**sshd_hostvars(sshd, kh), "sim_root": str(s.sim.root),
                              **{f"port_{k}": p for k, p in s.sim.ports.items()}}
                for n, s in zip("ab", scenarios)}
    inv = {"_meta": {"hostvars": hostvars}, "all": {"children": ["pd_a", "pd_b", "sim"]},
           "pd_a": {"hosts": ["node-a"]}, "pd_b": {"hosts": ["node-b"]}, "sim": {"hosts": ["node-a", "node-b"]}}
    (tmp_path / "inventory.json").write_text(json.dumps(inv))
    fleet = tmp_path / "groups-fleet.toml"
    fleet.write_text('[fleet]\nplaybook = "replica.toml"\ninventory = "inventory.json"\nreplicas = ["pd_a", "pd_b"]\n')
    return fleet, inv


def test_replicas_given_as_inventory_groups_bisect_like_replica_playbooks(fleet, sshd, tmp_path):
    (a, b), _ = fleet()
    path, _ = _template_and_inventory(tmp_path, sshd, (a, b))
    store = tmp_path / "store"
    snap = _cli(path, store, sshd, "snapshot", "--label", "good", "--json")
    assert snap.returncode == 0, snap.stderr
    assert set(json.loads(snap.stdout)["replicas"]) == {"pd_a", "pd_b"}
    for s in (a, b):
        plant(s.sim, [INNOCENT[0], BAD, INNOCENT[1], INNOCENT[2]])
    before = {s.name: tree_fingerprint(s.sim) for s in (a, b)}
    r = _cli(path, store, sshd, "bisect", "--against", "good", "--probe", "e2e", "--json")
    assert r.stdout, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["culprits"] == ["decode:SGLANG_SM120_MMA_TARGET_CTAS"], (r.stderr[-3000:], doc)
    assert doc["fleet"]["replicas"] == ["pd_a", "pd_b"] and not doc["fleet"]["excluded"]
    assert {t["replica"] for t in doc["trials"]} == {"pd_a", "pd_b"}
    assert doc["fleet"]["rounds"] < len(doc["trials"])
    assert {s.name: tree_fingerprint(s.sim) for s in (a, b)} == before


def test_a_fleet_run_killed_mid_trial_is_undone_replica_by_replica_from_the_fleet_file(fleet, sshd, tmp_path):
    """SIGKILL at a start of the first round (after that replica's edits); `restore -p fleet.toml` puts
    every replica back byte for byte from its own journal (and a new run is refused until then)."""
    import os
    import signal

    from test_fault_injection import all_healthy, fingerprint

    (a, b), _ = fleet()
    path, _ = _template_and_inventory(tmp_path, sshd, (a, b))
    store = tmp_path / "store"
    assert _cli(path, store, sshd, "snapshot", "--label", "good").returncode == 0
    for s in (a, b):
        plant(s.sim, [INNOCENT[0], BAD, INNOCENT[1]])
    before = {s.name: fingerprint(s.sim) for s in (a, b)}
    r = subprocess.run([*ENVBISECT, "-p", str(path), "--store", str(store), "--ssh-config", str(sshd.ssh_config),
                        "bisect", "--against", "good", "--probe", "e2e"], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "ENVBISECT_TEST_CRASH_AT": "start:2"})
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-2000:])
    assert {s.name: fingerprint(s.sim) for s in (a, b)} != before, r.stderr[-3000:]  # it died half-applied
    run_id = max((store / "runs").iterdir(), key=lambda p: p.stat().st_mtime).name
    again = _cli(path, store, sshd, "bisect", "--against", "good", "--probe", "e2e")
    assert again.returncode == 2 and f"envbisect restore --run {run_id}" in again.stderr, again.stderr[-2000:]
    r = _cli(path, store, sshd, "restore", "--run", run_id, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    reps = json.loads(r.stdout)["replicas"]
    assert set(reps) == {"pd_a", "pd_b"} and any(v["restored"] for v in reps.values()), reps
    assert {s.name: fingerprint(s.sim) for s in (a, b)} == before
    assert all(all_healthy(s.sim) for s in (a, b))


def test_a_fleet_tests_an_auto_linked_twin_apart_side_by_side(fleet, sshd, tmp_path):
    """Issue 7 item 1 holds for fleets too: the knob raised in prefill and decode, only decode's side
    breaks the stack; the search's rounds test the sides apart (search/hints.py) and only the
    guilty side is named."""
    (a, b), path = fleet()
    store = tmp_path / "store"
    assert _cli(path, store, sshd, "snapshot", "--label", "good").returncode == 0
    twin = [("prefill", "NCCL_DEBUG", "INFO"), ("prefill", "SGLANG_SM120_MMA_TARGET_CTAS", "256"), BAD]
    for s in (a, b):
        plant(s.sim, twin)
    before = {s.name: tree_fingerprint(s.sim) for s in (a, b)}
    r = _cli(path, store, sshd, "bisect", "--against", "good", "--probe", "e2e", "--json")
    assert r.stdout, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["culprits"] == ["decode:SGLANG_SM120_MMA_TARGET_CTAS"], (doc["culprits"], doc["notes"])
    assert not [t for t in doc["trials"] if t["kind"] == "refine"]  # split inside the search's rounds
    note = next(n for n in doc["notes"] if "tested apart inside the search" in n)
    assert "decode:SGLANG_SM120_MMA_TARGET_CTAS failed alone" in note and "only decode:" in note, note
    assert {s.name: tree_fingerprint(s.sim) for s in (a, b)} == before


def test_a_fleet_judges_its_trials_against_the_symptom(fleet, sshd, tmp_path):
    """The culprit makes decode hang; an innocent pair (SGLANG_ENABLE_X=1 needs SGLANG_X_PATH) keeps
    decode from starting when split. The fleet's rounds judge each failing trial against the
    symptom as a single deployment's run does: the start failures are another failure (no evidence),
    and only the culprit is named."""
    from test_another_failure_sim import CULPRIT, SAME_SERVICE, rules

    (a, b), path = fleet(rules_b=rules(SAME_SERVICE))
    for s in (a, b):
        s.sim.set_rules(rules(SAME_SERVICE))
    store = tmp_path / "store"
    assert _cli(path, store, sshd, "snapshot", "--label", "good").returncode == 0
    for s in (a, b):
        plant(s.sim, [INNOCENT[0], INNOCENT[4], ("decode", "SGLANG_ENABLE_X", "1"), INNOCENT[3], CULPRIT,
                      ("decode", "SGLANG_X_PATH", "/models/x"), INNOCENT[2]])
    r = _cli(path, store, sshd, "bisect", "--against", "good", "--probe", "e2e", "--json")
    assert r.stdout, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    trials = [(t["n"], t["config"], t["outcome"], t.get("symptom")) for t in doc["trials"]]
    assert doc["verdict"] == "culprit" and doc["culprits"] == ["decode:SGLANG_SM120_MMA_TARGET_CTAS"], \
        (doc["verdict"], doc["culprits"], doc["explanation"], trials)
    assert doc["symptom"] and doc["symptom"]["kind"] == "hang", doc["symptom"]
    other = [t for t in doc["trials"] if t.get("symptom") == "other"]
    assert all(t["outcome"] == "start-failure" for t in other), trials


def test_a_fleet_run_sent_sigterm_mid_trial_puts_every_replica_back_itself(fleet, sshd, tmp_path):
    """SIGTERM (a timer's stop, `timeout`, systemd) ends a fleet run as Ctrl-C does: every replica is
    put back byte for byte and unlocked by the run itself, before it exits non-zero."""
    import os
    import signal
    import time

    from test_fault_injection import fingerprint

    (a, b), path = fleet()
    store = tmp_path / "store"
    assert _cli(path, store, sshd, "snapshot", "--label", "good").returncode == 0
    for s in (a, b):
        plant(s.sim, [INNOCENT[0], BAD, INNOCENT[1]])
    before = {s.name: fingerprint(s.sim) for s in (a, b)}
    p = subprocess.Popen([*ENVBISECT, "-p", str(path), "--store", str(store), "--ssh-config", str(sshd.ssh_config),
                          "bisect", "--against", "good", "--probe", "e2e"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})
    seen, deadline = "", time.time() + 300
    while "trial 3" not in seen:  # the second round: the replicas' files are edited
        line = p.stderr.readline()
        assert line and time.time() < deadline, f"the fleet run ended first: {seen[-3000:]}"
        seen += line
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    _, rest = p.communicate(timeout=120)
    seen += rest
    assert p.returncode == 130, (p.returncode, seen[-3000:])  # ExitStatus.INTERRUPTED, not killed by the signal
    assert "restoring every replica" in seen, seen[-3000:]
    assert {s.name: fingerprint(s.sim) for s in (a, b)} == before, seen[-3000:]
    again = _cli(path, store, sshd, "bisect", "--against", "good", "--probe", "e2e", "--json")
    assert "restore" not in again.stderr.lower() or again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["culprits"] == ["decode:SGLANG_SM120_MMA_TARGET_CTAS"], again.stderr[-2000:]
