"""Issue 34 part 2: a named commit is confirmed alone. The confirmation trial is the deployed HEAD
with only the named commit's change undone (a commit object built on the host without touching its
work tree, index or refs, then checked out like any trial's commit); it must pass for the commit to
be named.

The line: five commits; commit 2 is innocent but makes decode crash while it is checked out (a file
it adds, which commit 3 supersedes), the same fingerprint as the guilty commit 5's (decode does not
start). The line search alone names commit 2."""
from __future__ import annotations

import json

import pytest

from test_bisect_sim import INNOCENT, plant, scenario, tree_fingerprint  # noqa: F401 - fixture
from test_commits_sim import _git, _pull_of_five, _with_version_rule

pytestmark = [pytest.mark.sim, pytest.mark.slow]


def _innocent_commit_two(s) -> None:  # noqa: ANN001
    rules = json.loads(s.sim.rules_path.read_text())
    rules["rules"].append({"service": "decode", "fault": "crash", "message": "notes2 without notes3",
                           "when_file": [{"path": str(s.sim.src_dir / "notes2.txt"), "contains": None},
                                         {"path": str(s.sim.src_dir / "notes3.txt"), "exists": False}]})
    s.sim.set_rules(rules)


def test_an_innocent_commit_failing_only_while_checked_out_is_refused_and_the_guilty_one_confirmed(scenario, sshd):
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    _with_version_rule(s)
    _innocent_commit_two(s)
    s.baseline()
    shas = _pull_of_five(s, 5)
    plant(s.sim, INNOCENT[:2], restart=False)
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="e2e")
    repo_id = f"git:node1:{s.sim.src_dir}"
    assert r.verdict.kind == "culprit" and r.culprit_deltas == (repo_id,), (r.verdict, r.notes)
    assert r.commit is not None and r.commit.commit is not None, (r.commit, r.notes)
    assert r.commit.commit.sha == shas[4], (r.commit.to_json(), r.notes)
    confirms = [t for t in r.trials if "confirm" in t.purpose and "without commit" in t.purpose]
    # the innocent commit is either refused by its confirmation or, when its failure's fingerprint (a start
    # failure's last line) differs from the symptom's, skipped before any confirmation; never named
    assert confirms and confirms[-1].outcome == "pass", [(t.n, t.purpose, t.outcome) for t in r.trials]
    if len(confirms) > 1:
        assert [t.outcome.failed for t in confirms] == [True, False], [(t.n, t.purpose, t.outcome) for t in r.trials]
        assert any(shas[1][:12] in n and "not named" in n for n in r.notes), r.notes
    assert r.commit.confirmed_by == confirms[-1].n and "confirmed" in r.commit.text, r.commit.text
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before
    assert _git(s.sim.src_dir, "status", "--porcelain") == ""


def test_a_commit_whose_revert_conflicts_is_not_named_the_range_is(scenario, sshd):
    """Commit 4 rewrites the VERSION that commit 3 (guilty) wrote: undoing commit 3 alone on HEAD
    conflicts, so no confirmation can be built and the range is named, with that reason."""
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    _with_version_rule(s)
    s.baseline()
    shas = []
    for i, version in enumerate(["v1.1\n", "v1.2\n", "v2-bad\n", "v2-bad still\n", None], start=1):
        if version is None:
            (s.sim.src_dir / "notes5.txt").write_text("note 5\n")
        else:
            (s.sim.src_dir / "VERSION").write_text(version)
        _git(s.sim.src_dir, "add", "-A")
        _git(s.sim.src_dir, "commit", "-qm", f"pull commit {i}")
        shas.append(_git(s.sim.src_dir, "rev-parse", "HEAD"))
    plant(s.sim, INNOCENT[:2], restart=False)
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit", (r.verdict, r.notes)
    assert r.commit is not None and r.commit.commit is None, r.commit
    assert r.commit.failed == shas[2] and r.commit.passed == shas[1], r.commit.to_json()
    assert "does not undo cleanly" in r.commit.text and shas[2][:12] in r.commit.text, r.commit.text
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before


def test_a_refused_commit_leaves_the_range_from_the_last_commit_seen_passing(scenario, sshd):
    """Six commits: c2 returns HTTP 500 (the symptom), c4 hangs (masked by the 500), c3 crashes decode
    at start until c6. c2 is refused (HEAD without it hangs); the range runs from c1, seen passing,
    to HEAD, never from c2, which was seen failing."""
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    src = s.sim.src_dir
    rules = json.loads(s.sim.rules_path.read_text())
    rules["rules"] += [
        {"service": "decode", "when_file": {"path": str(src / "kv_fast.txt"), "contains": None}, "fault": "5xx"},
        {"service": "decode", "when_file": {"path": str(src / "sched.txt"), "contains": None}, "fault": "hang"},
        {"service": "decode", "fault": "crash", "message": "notes3 without notes6",
         "when_file": [{"path": str(src / "notes3.txt"), "contains": None},
                       {"path": str(src / "notes6.txt"), "exists": False}]}]
    s.sim.set_rules(rules)
    s.baseline()
    shas = []
    for i, f in enumerate(("notes1.txt", "kv_fast.txt", "notes3.txt", "sched.txt", "notes5.txt", "notes6.txt"), 1):
        (src / f).write_text(f"c{i}\n")
        _git(src, "add", "-A")
        _git(src, "commit", "-qm", f"pull commit {i}")
        shas.append(_git(src, "rev-parse", "HEAD").strip())
    plant(s.sim, INNOCENT[:2])
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="e2e")
    assert r.commit is not None and r.commit.commit is None, (r.commit, r.notes)
    doc = r.commit.to_json()
    assert doc["last_passing"] == shas[0] and doc["revert_to"] == shas[0], doc
    assert doc["first_failing"] == shas[5] and doc["unconfirmed"] == shas[1], doc
    assert "failed another way" in r.commit.text and "hang" in r.commit.text, r.commit.text
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before
