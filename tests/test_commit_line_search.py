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
