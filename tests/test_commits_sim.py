"""Issue 24 part 3, end to end over the real sshd and the simulated PD deployment: a guilty HEAD move
is searched along its first-parent commits and the first failing commit is named (sha, subject,
author, files), within ceil(log2 k) trials beyond the premises and confirmations; the hosts are
byte-identical after, HEAD back where it was."""
from __future__ import annotations

import json
import math
import subprocess

import pytest

from envbisect.search import TrialKind
from test_bisect_sim import INNOCENT, plant, scenario, tree_fingerprint  # noqa: F401 - fixture

pytestmark = [pytest.mark.sim, pytest.mark.slow]


def _git(repo, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=Rita Dev", "-c", "user.email=rita@x",
                           "-c", "commit.gpgsign=false", *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def _pull_of_five(s, guilty: int) -> list[str]:
    """Five commits on the deployed repo; commit `guilty` (1-based) writes the VERSION the rule
    crashes decode on, and the later ones keep it."""
    shas = []
    for i in range(1, 6):
        if i == guilty:
            (s.sim.src_dir / "VERSION").write_text("v2-bad\n")
        else:
            (s.sim.src_dir / f"notes{i}.txt").write_text(f"note {i}\n")
        _git(s.sim.src_dir, "add", "-A")
        _git(s.sim.src_dir, "commit", "-qm", f"pull commit {i}")
        shas.append(_git(s.sim.src_dir, "rev-parse", "HEAD"))
    return shas


def _bytes(sim) -> dict:
    """tree_fingerprint without mtimes: a checkout re-creates the files it switches (git keeps no
    mtimes), so bytes, modes, owners, HEAD and branch are what can be identical after."""
    return {k: v[:3] if k != "HEAD" else v for k, v in tree_fingerprint(sim).items()}


def _with_version_rule(s) -> None:
    rules = json.loads(s.sim.rules_path.read_text())
    rules["rules"].append({"service": "decode", "when_file": {"path": str(s.sim.src_dir / "VERSION"),
                                                              "contains": "v2-bad"}, "fault": "crash"})
    s.sim.set_rules(rules)
    s.sim.co_restart()


@pytest.mark.parametrize("guilty", [3, 5])
def test_the_guilty_commit_among_five_is_named_over_ssh(scenario, sshd, guilty):
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    _with_version_rule(s)
    s.baseline()
    shas = _pull_of_five(s, guilty)
    plant(s.sim, INNOCENT[:2], restart=False)
    before = _bytes(s.sim)
    r = s.bisect(probe="e2e")
    repo_id = f"git:node1:{s.sim.src_dir}"
    assert r.verdict.kind == "culprit" and r.culprit_deltas == (repo_id,), (r.verdict, r.notes)
    assert r.commit is not None, r.notes
    c = r.commit.commit
    assert c is not None and c.sha == shas[guilty - 1], r.commit.to_json()
    assert c.subject == f"pull commit {guilty}" and c.author == "Rita Dev <rita@x>" and c.files == ("VERSION",)
    line_trials = [t for t in r.trials if t.n in r.commit.trials and t.kind is TrialKind.REFINE]
    assert len(line_trials) <= math.ceil(math.log2(5)), [t.purpose for t in line_trials]
    assert r.commit.passed == shas[guilty - 2]
    assert c.sha[:12] in r.verdict.explanation
    assert r.state_left == "original" and _bytes(s.sim) == before
    doc = r.to_json()
    assert doc["commit"]["commit"]["sha"] == shas[guilty - 1]
    # revert --verdict goes back to just before the named commit, keeping the pull's earlier commits
    p = s.cli("revert", "--verdict", "--json")
    assert p.returncode == 0, (p.stdout[-1500:], p.stderr[-1500:])
    res = json.loads(p.stdout)
    assert res["probe"]["outcome"] == "pass", res
    assert _git(s.sim.src_dir, "rev-parse", "HEAD") == shas[guilty - 2]
    assert "just before commit" in p.stderr and shas[guilty - 1][:12] in p.stderr


def test_a_commit_that_fails_differently_is_skipped_not_named(scenario, sshd):
    """The symptom is decode not starting (commit 5's VERSION). At commit 2 only, prefill hangs
    instead: another failure, as a stall of a loaded machine is. The line search skips commit 2, as
    `git bisect skip` does, and names commit 5; counted as the symptom it named commit 2 (CI, a
    load stall at an innocent commit)."""
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    _with_version_rule(s)
    rules = json.loads(s.sim.rules_path.read_text())
    rules["rules"].append({"service": "prefill", "fault": "hang",
                           "when_file": [{"path": str(s.sim.src_dir / "notes2.txt"), "contains": None},
                                         {"path": str(s.sim.src_dir / "notes3.txt"), "exists": False}]})
    s.sim.set_rules(rules)
    s.baseline()
    shas = _pull_of_five(s, 5)
    before = _bytes(s.sim)
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit" and r.commit is not None, (r.verdict, r.notes)
    assert r.commit.commit is not None and r.commit.commit.sha == shas[4], r.commit.to_json()
    assert r.commit.passed == shas[3]
    at_two = [t for t in r.trials if t.config == (f"git:node1:{s.sim.src_dir}@{shas[1][:12]}",)]
    assert at_two and all(t.symptom == "other" for t in at_two), [(t.n, t.symptom, t.reason) for t in r.trials]
    assert any("failed differently from the symptom" in n and shas[1][:12] in n for n in r.notes), r.notes
    assert r.state_left == "original" and _bytes(s.sim) == before


def test_a_watched_config_inside_the_repo_changed_by_a_pull_is_searched_with_the_pull(scenario, sshd):
    """[watch] names the deployed repo's configs/ folder, and two commits of a pull change its
    feature_flags.yaml (the second commit's key is guilty). The file's change is the pull's: one
    git delta searched commit by commit, no file delta beside it (blind red-team, exact changes: the
    change was counted twice, a trial wrote the file and then refused its own checkout, and the
    verdict was INCONCLUSIVE without a baseline trial)."""
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    configs = s.sim.src_dir / "configs"
    text = s.sim.playbook.read_text()
    extra = str(s.sim.root / "conf" / "extra")
    assert f'paths = ["{extra}"]' in text
    s.sim.playbook.write_text(text.replace(f'paths = ["{extra}"]', f'paths = ["{extra}", "{configs}"]'))
    rules = json.loads(s.sim.rules_path.read_text())
    rules["rules"].append(s.sim.flag_rule("enable_overlap_schedule"))
    s.sim.set_rules(rules)
    s.sim.co_restart()
    s.baseline()
    s.sim.set_flag("enable_mixed_chunk", "true")
    _git(s.sim.src_dir, "commit", "-qam", "mixed chunk on")
    s.sim.set_flag("enable_overlap_schedule", "true")
    _git(s.sim.src_dir, "commit", "-qam", "overlap on")
    (s.sim.src_dir / "notes.txt").write_text("n\n")
    _git(s.sim.src_dir, "add", "-A")
    _git(s.sim.src_dir, "commit", "-qm", "notes")
    plant(s.sim, INNOCENT[:1])
    before = _bytes(s.sim)
    with s.deployment() as dep:
        diff = dep.diff(against="good")
    ids = sorted(d.id for d in diff.deltas)
    assert not [i for i in ids if "feature_flags" in i], ids
    assert any(i.startswith("git:") for i in ids) and any("changed by the HEAD move" in n for n in diff.notes), \
        (ids, diff.notes)
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit" and r.culprit_deltas[0].startswith("git:"), (r.verdict, r.culprit_deltas)
    assert r.commit is not None and r.commit.commit is not None and r.commit.commit.subject == "overlap on"
    assert r.state_left == "original" and _bytes(s.sim) == before
