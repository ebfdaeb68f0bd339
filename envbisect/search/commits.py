"""The commit line of a HEAD move, searched as `git bisect --first-parent` does: pure, no I/O.

A guilty git delta moved HEAD over k first-parent commits c_1..c_k (oldest first). Its two ends are
already observed: the baseline commit c_0 passes (the premise) and c_k fails with nothing else
changed (the delta alone). Commits of a pull are ordered and cumulative, so the search is a binary
search for the first failing index between the last commit seen passing and the first seen failing:
at most ceil(log2 k) trials beyond those two. The commit named is one whose parent on the line was
observed passing and which was itself observed failing, so it is never a guess.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class CommitStep:
    """Check out commit `index` (1..k) of the line and probe it."""
    index: int


@dataclass(frozen=True)
class CommitFound:
    """`index` is the first failing commit when `found`; else the line could not be narrowed below
    (`passed`, `failed`]: a trial there was unresolved."""
    index: int
    passed: int  # the last index observed passing (0: the baseline commit)
    found: bool


class CommitLineSearch:
    def __init__(self, k: int):
        if k < 1:
            raise ValueError("a HEAD move has at least one commit")
        self.k = k
        self.passed, self.failed = 0, k  # the premises: c_0 passes, c_k fails
        self.unresolved = False

    def next(self) -> CommitStep | CommitFound:
        if self.unresolved:
            return CommitFound(self.failed, self.passed, False)
        if self.failed - self.passed <= 1:
            return CommitFound(self.failed, self.passed, True)
        return CommitStep((self.passed + self.failed) // 2)

    def observe(self, index: int, failed: bool | None) -> None:
        """`failed` None: the trial was unresolved (infrastructure); the search stops with a range."""
        if not self.passed < index < self.failed:
            raise ValueError(f"commit {index} is outside the open range ({self.passed}, {self.failed})")
        if failed is None:
            self.unresolved = True
        elif failed:
            self.failed = index
        else:
            self.passed = index


def commit_trial_bound(k: int) -> int:
    """Trials the commit line costs beyond its premises: ceil(log2 k)."""
    return math.ceil(math.log2(k)) if k > 1 else 0
