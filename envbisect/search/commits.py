"""The commit line of a HEAD move, searched as `git bisect --first-parent` does: pure, no I/O.

A guilty git delta moved HEAD over k first-parent commits c_1..c_k (oldest first). Its two ends are
already observed: the baseline commit c_0 passes (the premise) and c_k fails with nothing else
changed (the delta alone). Commits of a pull are ordered and cumulative, so the search is a binary
search for the first failing index between the last commit seen passing and the first seen failing:
at most ceil(log2 k) trials beyond those two. The commit named is one whose parent on the line was
observed passing and which was itself observed failing *with the symptom*, so it is never a guess.

A commit that fails differently from the symptom (another service does not start, a stall under
load where the symptom is a crash) says nothing about the symptom: it is skipped, as `git bisect
skip` does, and the search tests the commit nearest the middle among the rest. When only skipped
commits are left between the ends, each is tried once more (a stall is usually transient); a
commit that fails differently twice stays skipped, and the line ends as a range, not a name.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable


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


SKIP_RETRIES = 1  # a commit that failed differently is tried once more before it stays skipped


class CommitLineSearch:
    def __init__(self, k: int):
        if k < 1:
            raise ValueError("a HEAD move has at least one commit")
        self.k = k
        self.passed, self.failed = 0, k  # the premises: c_0 passes, c_k fails
        self.unresolved = False
        self.skipped: dict[int, int] = {}  # index -> times it failed differently from the symptom

    def next(self) -> CommitStep | CommitFound:
        if self.unresolved:
            return CommitFound(self.failed, self.passed, False)
        between = range(self.passed + 1, self.failed)
        if not between:
            return CommitFound(self.failed, self.passed, True)
        middle = (self.passed + self.failed) / 2
        untested = [i for i in between if i not in self.skipped]
        again = [i for i in between if self.skipped.get(i, 0) <= SKIP_RETRIES]
        pick = untested or again
        if not pick:
            return CommitFound(self.failed, self.passed, False)
        return CommitStep(min(pick, key=lambda i: (abs(i - middle), i)))

    def observe(self, index: int, failed: bool | None, other: bool = False) -> None:
        """`failed` None: the trial was unresolved (infrastructure); the search stops with a range.
        `other`: it failed differently from the symptom; the commit is skipped."""
        if not self.passed < index < self.failed:
            raise ValueError(f"commit {index} is outside the open range ({self.passed}, {self.failed})")
        if failed is None:
            self.unresolved = True
        elif other:
            self.skipped[index] = self.skipped.get(index, 0) + 1
        elif failed:
            self.failed = index
        else:
            self.passed = index


def walk_line(k: int, observe: Callable[[int], tuple[bool | None, bool]]) -> CommitFound:
    """The line searched to its end: `observe(index)` runs commit `index` and says (failed, other),
    `failed` None when the trial was unresolved, `other` when it failed differently from the symptom."""
    line = CommitLineSearch(k)
    while not isinstance(nxt := line.next(), CommitFound):
        line.observe(nxt.index, *observe(nxt.index))
    return nxt


def commit_trial_bound(k: int) -> int:
    """Trials the commit line costs beyond its premises: ceil(log2 k)."""
    return math.ceil(math.log2(k)) if k > 1 else 0
