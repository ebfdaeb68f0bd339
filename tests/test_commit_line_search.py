"""The commit-line search (search/commits.py): first failing commit at every position, within ceil(log2 k)."""
import math

import pytest

from envbisect.search.commits import CommitFound, CommitLineSearch, CommitStep, commit_trial_bound


def run(k: int, first_bad: int) -> tuple[CommitFound, int]:
    s = CommitLineSearch(k)
    trials = 0
    while True:
        nxt = s.next()
        if isinstance(nxt, CommitFound):
            return nxt, trials
        assert isinstance(nxt, CommitStep) and 1 <= nxt.index < k
        trials += 1
        s.observe(nxt.index, nxt.index >= first_bad)


@pytest.mark.parametrize("k", range(1, 9))
def test_first_failing_commit_at_every_position(k):
    for first_bad in range(1, k + 1):
        found, trials = run(k, first_bad)
        assert found.found and found.index == first_bad and found.passed == first_bad - 1
        assert trials <= math.ceil(math.log2(k)) if k > 1 else trials == 0
        assert trials <= commit_trial_bound(k)


def test_unresolved_trial_stops_with_the_range_not_a_name():
    s = CommitLineSearch(5)
    step = s.next()
    assert isinstance(step, CommitStep)
    s.observe(step.index, None)
    found = s.next()
    assert isinstance(found, CommitFound) and not found.found
    assert (found.passed, found.index) == (0, 5)


def test_observation_outside_the_open_range_is_refused():
    s = CommitLineSearch(4)
    with pytest.raises(ValueError):
        s.observe(4, True)
    with pytest.raises(ValueError):
        CommitLineSearch(0)


@pytest.mark.local  # GitPython runs `git version` on import
def test_what_git_says_is_its_stderr_line_not_the_wrappers_closing_quote():
    import git

    from envbisect.state.commitline import git_says

    e = git.GitCommandError(["git", "rev-list", "a..b"], 128, stderr=b"fatal: Invalid revision range a..b\n")
    assert git_says(e) == "fatal: Invalid revision range a..b"  # was "'" (blind red-team, exact changes)
    assert git_says(RuntimeError("no git here\\nmore")) == "no git here\\nmore"


def run_with_other(k: int, first_bad: int, other: dict[int, int]) -> tuple[CommitFound, list[int]]:
    """`other[i]` = how many times commit i fails differently from the symptom before it shows
    what it really does (a load stall once: 1; a commit that never starts: a large number)."""
    s = CommitLineSearch(k)
    seen = []
    while True:
        nxt = s.next()
        if isinstance(nxt, CommitFound):
            return nxt, seen
        seen.append(nxt.index)
        if other.get(nxt.index, 0) > 0:
            other[nxt.index] -= 1
            s.observe(nxt.index, True, other=True)
        else:
            s.observe(nxt.index, nxt.index >= first_bad)


@pytest.mark.parametrize("k", range(2, 9))
def test_a_commit_failing_differently_once_is_skipped_and_never_named(k):
    for first_bad in range(1, k + 1):
        for stalled in range(1, k):
            found, seen = run_with_other(k, first_bad, {stalled: 1})
            assert found.found and found.index == first_bad and found.passed == first_bad - 1, (first_bad, stalled)
            assert len(seen) <= math.ceil(math.log2(k)) + 2, seen


@pytest.mark.parametrize("k", range(2, 9))
def test_a_commit_that_always_fails_differently_leaves_a_range_that_holds_the_culprit(k):
    for first_bad in range(1, k + 1):
        for broken in range(1, k):
            found, _ = run_with_other(k, first_bad, {broken: 99})
            if found.found:
                assert found.index == first_bad and found.passed == first_bad - 1
            else:
                assert found.passed < first_bad <= found.index and found.passed < broken < found.index


def test_other_failure_is_not_evidence_the_old_way_named_an_innocent():
    s = CommitLineSearch(5)
    assert s.next() == CommitStep(2)
    s.observe(2, True, other=True)  # the culprit is commit 5; commit 2 stalled once under load
    assert s.next() != CommitFound(2, 1, True)
    assert isinstance(s.next(), CommitStep) and s.next().index != 2


@pytest.mark.local  # git
def test_a_baseline_commit_the_head_does_not_reach_is_said_plainly(tmp_path):
    """A reset, rebase or force-push leaves the baseline commit out of the mirror (it holds what HEAD
    reaches); the note said git's raw 'fatal: Invalid revision range' (blind red-team)."""
    import subprocess

    from envbisect.state.commitline import NotALine, first_parent_line

    repo = tmp_path / "r"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=a", "-c", "user.email=a@x", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "a"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    gone = "1234567890" * 4
    with pytest.raises(NotALine, match=r"^123456789012 \(the baseline commit\) is not an ancestor of the current HEAD "
                                       + head[:12] + r" \(a reset, a rebase or a force-push\?\)"):
        first_parent_line(repo, gone, head)
