"""Issue 39 part 4: after a run whose commit search checked out commits of the deployed repo, the
tracked files it rewrote get their mtimes back, with their bytes, HEAD and branch: the whole tree is
identical, mtimes included (tree_fingerprint). A file with uncommitted changes of the operator's is
never touched."""
from __future__ import annotations

import pytest

from test_bisect_sim import INNOCENT, plant, scenario, tree_fingerprint  # noqa: F401 - fixture
from test_commits_sim import _pull_of_five, _with_version_rule

pytestmark = [pytest.mark.sim, pytest.mark.slow]


def test_a_commit_search_puts_back_the_mtimes_of_the_files_its_checkouts_rewrote(scenario, sshd):
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    _with_version_rule(s)
    s.baseline()
    _pull_of_five(s, 3)
    plant(s.sim, INNOCENT[:2], restart=False)
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="e2e")
    assert r.commit is not None and r.commit.commit is not None, r.notes
    assert r.state_left == "original"
    after = tree_fingerprint(s.sim)
    changed = sorted(k for k in before if before[k] != after.get(k))
    assert changed == [], [(k, before[k], after.get(k)) for k in changed]
