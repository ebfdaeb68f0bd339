"""`bisect --split-merges` (issue 24, part 3): a merge on a HEAD move's first-parent line is one step
unless asked; asked, its second-parent commits (the merged branch, oldest first, along that branch's
first parents) are steps before the merge itself. The mirror is fetched over the real sshd."""
from __future__ import annotations

import json

import pytest

from envbisect.hosts.transport import SSHTransport
from envbisect.inputs.playbook import Host
from envbisect.runs.plan import BisectOptions
from envbisect.state.commitline import first_parent_line, mirror

from test_bisect_sim import scenario  # noqa: F401 - fixture
from test_commitline_mirror import _git


def _merged_branch(tmp_path):
    """base, then c1 on main; a branch from base with b1, b2; merged (no fast-forward), then c2."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "VERSION").write_text("v1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-qb", "feature")
    for name in ("b1", "b2"):
        (repo / name).write_text(name + "\n")
        _git(repo, "add", ".")
        _git(repo, "commit", "-qm", f"branch {name}")
    _git(repo, "checkout", "-q", "main")
    (repo / "c1").write_text("c1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "main c1")
    _git(repo, "merge", "-q", "--no-ff", "-m", "merge feature", "feature")
    (repo / "c2").write_text("c2\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "main c2")
    return repo, base, _git(repo, "rev-parse", "HEAD")


@pytest.fixture
def line_of(tmp_path, sshd):
    repo, base, head = _merged_branch(tmp_path)
    transport = SSHTransport(Host("node1", sshd.alias), ssh_config=str(sshd.ssh_config))

    def line(**kw):
        with mirror(transport, str(repo), head) as m:
            return first_parent_line(m, base, head, **kw)

    yield line
    transport.close()


def test_a_merge_is_one_step_unless_asked(line_of):
    line = line_of()
    assert [c.subject for c in line] == ["main c1", "merge feature", "main c2"]
    assert line[1].merge and set(line[1].files) == {"b1", "b2"}


def test_split_merges_puts_the_merged_commits_before_the_merge(line_of):
    line = line_of(split_merges=True)
    assert [c.subject for c in line] == ["main c1", "branch b1", "branch b2", "merge feature", "main c2"]
    b1, b2, merge = line[1], line[2], line[3]
    assert b1.files == ("b1",) and b2.files == ("b2",) and not b1.merge
    assert b1.merged_by == b2.merged_by == merge.sha and merge.merge and merge.merged_by is None
    assert b1.to_json()["merged_by"] == merge.sha and "merged_by" not in line[0].to_json()


def test_the_option_is_off_by_default():
    assert BisectOptions().split_merges is False


def _merge_of_a_branch(s) -> dict[str, str]:
    """On the deployed repo: c1 on main, then a merged branch whose second commit writes the VERSION
    decode hangs on, then c2. Returns subject -> sha."""
    src = s.sim.src_dir
    branch_from = _git(src, "rev-parse", "HEAD")
    (src / "c1.txt").write_text("c1\n")
    _git(src, "add", "-A")
    _git(src, "commit", "-qm", "main c1")
    main = _git(src, "symbolic-ref", "--short", "HEAD")
    _git(src, "checkout", "-qb", "feature", branch_from)
    (src / "b1.txt").write_text("b1\n")
    _git(src, "add", "-A")
    _git(src, "commit", "-qm", "branch b1")
    (src / "VERSION").write_text("v2-bad\n")
    _git(src, "add", "-A")
    _git(src, "commit", "-qm", "branch b2")
    _git(src, "checkout", "-q", main)
    _git(src, "merge", "-q", "--no-ff", "-m", "merge feature", "feature")
    _git(src, "branch", "-qD", "feature")
    (src / "c2.txt").write_text("c2\n")
    _git(src, "add", "-A")
    _git(src, "commit", "-qm", "main c2")
    log = _git(src, "log", "--all", "--format=%H %s").splitlines()
    return {line.split(" ", 1)[1]: line.split(" ", 1)[0] for line in log}


def _good_with_a_version_fault(scenario, sshd, fault: str):
    """A scenario over the sshd whose decode has `fault` while the repo's VERSION says v2-bad; its
    known-good snapshot taken."""
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    rules = json.loads(s.sim.rules_path.read_text())
    rules["rules"].append({"service": "decode", "when_file": {"path": str(s.sim.src_dir / "VERSION"),
                                                              "contains": "v2-bad"}, "fault": fault})
    s.sim.set_rules(rules)
    s.sim.co_restart()
    s.baseline()
    return s


@pytest.mark.sim
@pytest.mark.parametrize("split", [False, True])
def test_a_guilty_branch_commit_is_named_only_when_merges_are_split(scenario, sshd, split):
    s = _good_with_a_version_fault(scenario, sshd, "hang")
    sha = _merge_of_a_branch(s)
    r = s.bisect(probe="e2e", split_merges=split)
    assert r.verdict.kind == "culprit" and r.commit is not None and r.commit.commit is not None, (r.verdict, r.notes)
    c = r.commit.commit
    if split:
        assert (c.subject, c.sha, c.merged_by) == ("branch b2", sha["branch b2"], sha["merge feature"])
        assert [x.subject for x in r.commit.line] == ["main c1", "branch b1", "branch b2", "merge feature", "main c2"]
    else:
        assert (c.subject, c.merge) == ("merge feature", True)
        assert [x.subject for x in r.commit.line] == ["main c1", "merge feature", "main c2"]
    assert r.state_left == "original" and _git(s.sim.src_dir, "log", "-1", "--format=%s") == "main c2"


def test_the_cli_verdict_says_which_merge_brought_a_guilty_branch_commit():
    import io

    from envbisect.cli import render
    from envbisect.cli.environment import Environment
    from envbisect.runs.bisect import BisectResult
    from envbisect.runs.result import CommitVerdict
    from envbisect.search import Verdict
    from envbisect.state.commitline import LineCommit

    merge_sha, b2_sha = "m" * 40, "b" * 40
    line = (LineCommit("1" * 40, "main c1", "A <a@x>", ("c1.txt",)),
            LineCommit(b2_sha, "branch b2", "B <b@x>", ("VERSION",), merged_by=merge_sha),
            LineCommit(merge_sha, "merge feature", "A <a@x>", ("VERSION",), merge=True))
    for guilty, split in ((line[1], True), (line[2], False)):
        buf = io.StringIO()
        env = Environment(stdout=buf, stderr=io.StringIO(), width=200)
        v = Verdict("culprit", ("git:node1:/srv/repo",), 1.0, (("git:node1:/srv/repo", 1.0),), "why")
        commit = CommitVerdict("git:node1:/srv/repo", line if split else (line[0], line[2]), guilty, line[0].sha,
                               guilty.sha, (4, 5))
        render.render_verdict(env, BisectResult("r1", v, (), "original", {"git:node1:/srv/repo": ("git:x",)},
                                                commit=commit))
        text = buf.getvalue()
        assert f"commit: {guilty.sha} {guilty.subject!r}" in text
        if split:
            assert f"brought in by the merge {merge_sha[:12]} 'merge feature'" in text, text
            assert "first failing of 3 commits on the first-parent line, merges split" in text, text
        else:
            assert "brought in by" not in text and "(a merge: one step)" in text
            assert "first failing of 2 first-parent commits" in text, text


@pytest.mark.sim
def test_a_guilty_main_commit_before_a_split_merge_is_named_not_the_merge(scenario, sshd):
    """The guilty commit is on main between the branch point and the merge. Checked out as committed,
    the branch commits lack it and pass, so a search over the flattened line read "passes again" and
    named the innocent merge (blind red-team); revert --verdict then dropped the guilty commit while
    saying the earlier commits were kept. The first-parent line is searched first; a merge's branch
    only when the merge itself is the first failing commit."""
    s = _good_with_a_version_fault(scenario, sshd, "crash")
    src = s.sim.src_dir
    main = _git(src, "symbolic-ref", "--short", "HEAD")
    for name in ("m1",):
        (src / f"{name}.txt").write_text(name + "\n")
        _git(src, "add", "-A")
        _git(src, "commit", "-qm", f"main {name}")
    _git(src, "checkout", "-qb", "feature")
    for name in ("f1", "f2", "f3"):
        (src / f"{name}.txt").write_text(name + "\n")
        _git(src, "add", "-A")
        _git(src, "commit", "-qm", f"feature {name}")
    _git(src, "checkout", "-q", main)
    (src / "VERSION").write_text("v2-bad\n")
    _git(src, "add", "-A")
    _git(src, "commit", "-qm", "main 2 (guilty)")
    guilty = _git(src, "rev-parse", "HEAD")
    _git(src, "merge", "-q", "--no-ff", "-m", "merge feature", "feature")
    _git(src, "branch", "-qD", "feature")
    (src / "m3.txt").write_text("m3\n")
    _git(src, "add", "-A")
    _git(src, "commit", "-qm", "main m3")
    r = s.bisect(probe="e2e", split_merges=True)
    assert r.verdict.kind == "culprit" and r.commit is not None and r.commit.commit is not None, (r.verdict, r.notes)
    c = r.commit.commit
    assert (c.sha, c.subject, c.merged_by) == (guilty, "main 2 (guilty)", None), r.commit.to_json()
    assert r.state_left == "original" and _git(src, "log", "-1", "--format=%s") == "main m3"
    p = s.cli("revert", "--verdict", "--json")
    assert p.returncode == 0, (p.stdout[-1500:], p.stderr[-1500:])
    assert json.loads(p.stdout)["probe"]["outcome"] == "pass"
    assert _git(src, "log", "-1", "--format=%s") == "main m1"


@pytest.mark.sim
def test_a_branch_commit_whose_change_the_branch_undid_is_not_named(scenario, sshd):
    """Blind red-team: on the branch, f2 writes the bad VERSION and f3 undoes it; the merge fails
    through another pair of files (main's m2 with the branch's f1). As committed f2 fails and f1
    passes, so the branch search named f2 'brought in by the merge', though the merge does not
    bring its change (VERSION is not in the merge's diff against its first parent). The merge stays
    named, with a note."""
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    src = s.sim.src_dir
    rules = json.loads(s.sim.rules_path.read_text())
    rules["rules"] += [
        {"service": "decode", "when_file": {"path": str(src / "VERSION"), "contains": "v2-bad"}, "fault": "crash"},
        {"service": "decode", "when_file": [{"path": str(src / "m2.txt"), "contains": None},
                                            {"path": str(src / "f1.txt"), "contains": None}], "fault": "crash"}]
    s.sim.set_rules(rules)
    s.sim.co_restart()
    s.baseline()
    main = _git(src, "symbolic-ref", "--short", "HEAD")
    version = (src / "VERSION").read_text()
    _git(src, "checkout", "-qb", "feature")
    for subject, path, body in (("feature 1", "f1.txt", "f1\n"), ("feature 2 (bad)", "VERSION", "v2-bad\n"),
                                ("feature 3 (undoes 2)", "VERSION", version)):
        (src / path).write_text(body)
        _git(src, "add", "-A")
        _git(src, "commit", "-qm", subject)
    _git(src, "checkout", "-q", main)
    (src / "m2.txt").write_text("m2\n")
    _git(src, "add", "-A")
    _git(src, "commit", "-qm", "main 2")
    _git(src, "merge", "-q", "--no-ff", "-m", "merge feature", "feature")
    _git(src, "branch", "-qD", "feature")
    r = s.bisect(probe="e2e", split_merges=True)
    assert r.verdict.kind == "culprit" and r.commit is not None and r.commit.commit is not None, (r.verdict, r.notes)
    c = r.commit.commit
    assert (c.subject, c.merge) == ("merge feature", True), r.commit.to_json()
    assert any("not in the merge" in n for n in r.notes), r.notes
    assert r.state_left == "original"
