"""Issue 21, parts 0 and 2, end to end over the real sshd and the simulated PD deployment.

Part 0: an uncommitted edit to a tracked file of a deployed repo (a hotfix on the box) is part of
the configuration: a delta of its own, applied, journaled and put back byte for byte; a HEAD that
did not move is no delta; and a not-config verdict is only given with proof that the baseline
trial was the baseline (else: inconclusive, naming what stayed).

Part 2: a command probe that cannot run (exit 126/127) says nothing about the configuration: the
run stops before any restart when it shows on the running stack, or at the trial where it shows,
restores, and exits 2 with one line."""
from __future__ import annotations

import copy
import json
import subprocess

import pytest

from envbisect.hosts.agent_calls import run_agent
from envbisect.hosts.transport import LocalTransport
from envbisect.sim.stack import DEFAULT_RULES
from test_bisect_sim import INNOCENT, plant, scenario, tree_fingerprint  # noqa: F401 - fixture

FLAG = "enable_overlap_schedule"


def _flag_id(s, flag: str = FLAG) -> str:
    """A hotfix to the repo's feature-flag YAML is a delta per key (state/structured.py)."""
    return f"file:node1:{s.sim.flags_file}#{flag}"


def _git(repo, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@x",
                           "-c", "commit.gpgsign=false", *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def _with_flag_rule(s, *extra: dict) -> None:
    rules = copy.deepcopy(DEFAULT_RULES)
    rules["rules"] += [s.sim.flag_rule(FLAG), *extra]
    s.sim.set_rules(rules)
    s.sim.co_restart()


def _hotfix(s, value: str = "true") -> None:
    """The hotfix: the flag edited in place in the deployed repo, never committed."""
    s.sim.set_flag(FLAG, value)


# --- porcelain -----------------------------------------------------------------------------------

def test_dirty_paths_are_parsed_by_their_format_not_by_position(tmp_path):
    """`git status --porcelain` output was stripped, then cut at [3:]: the first path lost its first
    letter (`onfigs/feature_flags.yaml`). A path with spaces and a rename keep their names."""
    repo = tmp_path / "repo"
    (repo / "configs").mkdir(parents=True)
    (repo / "configs" / "feature_flags.yaml").write_text("a: false\n")
    (repo / "my notes.txt").write_text("x\n")
    (repo / "old name.cfg").write_text("y\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "one")
    (repo / "configs" / "feature_flags.yaml").write_text("a: true\n")  # " M": unstaged, first in the list
    (repo / "my notes.txt").write_text("z\n")
    _git(repo, "mv", "old name.cfg", "new name.cfg")
    raw = run_agent(LocalTransport(), "collect.py", {"repos": [{"path": str(repo)}]}, what="collector")
    r = raw["repos"][str(repo)]
    assert sorted(r["dirty_files"]) == ["configs/feature_flags.yaml", "my notes.txt", "new name.cfg",
                                        "old name.cfg"], r["dirty_files"]
    # each dirty file's bytes are snapshotted like a watched file
    f = raw["files"][str(repo / "configs" / "feature_flags.yaml")]
    assert f["exists"] and f["sha256"]
    assert raw["files"][str(repo / "old name.cfg")]["exists"] is False


# --- part 0: a hotfix in the deployed repo ------------------------------------------------------

def test_a_guilty_hotfix_in_the_deployed_repo_is_named(scenario, sshd):
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    _with_flag_rule(s)
    s.baseline()
    head = _git(s.sim.src_dir, "rev-parse", "HEAD")
    _hotfix(s)
    plant(s.sim, INNOCENT[:3])
    hotfix_bytes = s.sim.flags_file.read_bytes()
    before = tree_fingerprint(s.sim)
    with s.deployment() as dep:
        diff = dep.diff(against="good")
    ids = [d.id for d in diff.deltas]
    flag_id = _flag_id(s)
    assert flag_id in ids, ids
    assert not any(d.kind == "git" for d in diff.deltas), ids  # HEAD did not move: no HEAD delta
    assert not any("onfigs/" in n and "configs/" not in n for n in diff.notes), diff.notes
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit", (r.verdict, r.notes)
    assert r.culprit_deltas == (flag_id,), r.culprit_deltas
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before
    assert s.sim.flags_file.read_bytes() == hotfix_bytes
    assert _git(s.sim.src_dir, "rev-parse", "HEAD") == head


def test_an_innocent_hotfix_is_not_named_next_to_a_guilty_env_change(scenario, sshd):
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    _with_flag_rule(s)
    s.baseline()
    s.sim.set_flag("enable_mixed_chunk", "true")  # a hotfix no rule cares about
    plant(s.sim, INNOCENT[:2] + [("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")])
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit", (r.verdict, r.notes)
    assert r.culprit_deltas == ("decode:SGLANG_SM120_MMA_TARGET_CTAS",), r.culprit_deltas
    assert _flag_id(s, "enable_mixed_chunk") in {d for ds in r.units.values() for d in ds}
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before


def test_a_baseline_that_kept_a_change_is_inconclusive_never_not_config(scenario):
    """The guilty hotfix excluded from the run (--exclude): the baseline trial keeps it and fails.
    That is not "the config is not the cause": the baseline could not be reproduced."""
    s = scenario()
    _with_flag_rule(s)
    s.baseline()
    _hotfix(s)
    plant(s.sim, INNOCENT[:3])
    flag_id = _flag_id(s)
    before = tree_fingerprint(s.sim)
    p = s.cli("bisect", "--against", "good", "--probe", "e2e", "--exclude", flag_id, "--json")
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "inconclusive" and p.returncode == 6, (p.stdout[-2000:], p.stderr)
    proof = doc["baseline_proof"]
    assert proof["reproduced"] is False
    assert any(flag_id in s_ for s_ in proof["stayed"]), proof
    assert flag_id in doc["explanation"] and "could not be reproduced" in doc["explanation"]
    assert tree_fingerprint(s.sim) == before
    human = s.cli("bisect", "--against", "good", "--probe", "e2e", "--exclude", flag_id)
    assert human.returncode == 6 and "could not be reproduced" in human.stdout and flag_id in human.stdout, \
        (human.stdout, human.stderr)


def test_not_config_shows_its_proof(scenario):
    """A real not-config (the client path hangs) carries the proof that the baseline trial was
    the baseline: every delta at its baseline bytes, every service restarted, the probe reached
    the stack."""
    s = scenario(with_proxy_hang_after=3)
    s.baseline()
    plant(s.sim, [("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "512")])
    p = s.cli("bisect", "--against", "good", "--probe", "client", "--json")
    doc = json.loads(p.stdout)
    assert p.returncode == 4 and doc["verdict"] == "not-config", (p.stdout[-2000:], p.stderr)
    proof = doc["baseline_proof"]
    assert proof["reproduced"] is True and proof["stayed"] == []
    assert {f["delta"] for f in proof["files"]} == {"decode:SGLANG_SM120_MMA_TARGET_CTAS"}
    assert all(f["verified"] for f in proof["files"])
    assert {sv["service"] for sv in proof["services"]} == {"prefill", "decode", "router"}
    assert proof["probe_reached"] is True


# --- part 2: a broken probe is not a verdict -------------------------------------------------------

def _command_probe(s, command: str) -> None:
    text = s.sim.playbook.read_text()
    text += f'\n[probes.cmd]\nkind = "command"\ncommand = {json.dumps(command)}\ntimeout_s = 10\n'
    s.sim.playbook.write_text(text)


def test_a_probe_with_a_typo_stops_before_any_restart(scenario):
    s = scenario()
    _command_probe(s, "curlx -sf http://127.0.0.1:1/ >/dev/null")
    s.baseline()
    plant(s.sim, INNOCENT[:3])
    pids = s.sim.running_pids()
    before = tree_fingerprint(s.sim)
    p = s.cli("bisect", "--against", "good", "--probe", "cmd")
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cmd" in lines[0] and "127" in lines[0], p.stderr
    assert "not-config" not in p.stdout and "verdict" not in p.stdout.lower(), p.stdout
    assert tree_fingerprint(s.sim) == before
    assert s.sim.running_pids() == pids  # nothing was restarted


def test_a_probe_that_breaks_mid_run_stops_restores_and_exits_2(scenario, tmp_path):
    s = scenario()
    script = tmp_path / "probe.sh"
    script.write_text(f"#!/bin/sh\ncurl -s -m 1.5 -o /dev/null -w '%{{http_code}}' -X POST "
                      f"-H 'Content-Type: application/json' -d '{{\"model\":\"m\",\"messages\":[{{\"role\":\"user\","
                      f"\"content\":\"hi\"}}],\"max_tokens\":4}}' {s.sim.chat_url} | grep -q 200\n")
    script.chmod(0o755)
    _command_probe(s, str(script))
    s.baseline()
    plant(s.sim, INNOCENT[:3] + [("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")])
    before = tree_fingerprint(s.sim)
    seen = []

    from envbisect.runs.bisect import BisectOptions, BisectRun
    from envbisect.errors import ExitStatus, ProbeBroken

    def on_event(kind, data):
        if kind == "trial-end":
            seen.append(data["trial"].n)
            if len(seen) == 1:
                script.unlink()  # the probe's script is gone from trial 2 on: exit 127

    with s.deployment() as dep:
        diff = dep.diff(against="good")
        with pytest.raises(ProbeBroken) as err:
            BisectRun(dep, BisectOptions(probe="cmd"), on_event=on_event).start(diff)
    assert err.value.exit_status is ExitStatus.USAGE
    assert "cmd" in str(err.value) and "127" in str(err.value) and "\n" not in str(err.value)
    assert tree_fingerprint(s.sim) == before


# --- part 0: a not-reproduced verdict names the drift it saw ------------------------------------

def test_not_reproduced_names_a_value_no_file_sets(scenario):
    """decode was started by hand with SGLANG_SM120_MMA_TARGET_CTAS=256 (it hangs with it), and its
    file says 128 today as at the baseline: the running state was the fault, not the files. The
    verdict must say so, not "check the probe"."""
    s = scenario()
    s.baseline()
    plant(s.sim, INNOCENT[:2])
    s.sim.set_env("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")
    s.sim.restart("decode")
    s.sim.set_env("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "128")
    s.sim.age_files()
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "not-reproduced", r.verdict
    text = r.verdict.explanation
    assert "check the probe" not in text, text
    assert "decode" in text and "SGLANG_SM120_MMA_TARGET_CTAS=256" in text and "no file sets" in text, text
    assert any("no file sets" in h for h in r.drift_hint), r.drift_hint
