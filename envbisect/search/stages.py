"""The stages of the structured search, one small class each.

The search (strategy.py) walks a frame: find a unit the failure needs, ask whether it breaks the
stack alone, find its partner if it does not, then check that the term found is the whole story.
A stage is a value (frozen, so the search's state is just "which stage, over which units"); it
asks the search's evidence what is settled and says what to do next:

- ``step(search, post)``: the next TrialRequest, ``AGAIN`` after moving the search to another
  stage (the caller re-judges the posterior), or None when the stage has nothing to ask;
- ``after_failure(search)``: a stage change an observed failure settles, applied before the
  posterior is judged (after a failed fix check the frame must change first);
- ``settle(search, post)``: a stage change the posterior settles (a converged bisection, a unit
  that passed alone).

Units are bit positions; masks are ints (``1 << unit``), as in belief.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from envbisect.search.types import TrialKind

if TYPE_CHECKING:  # pragma: no cover
    from envbisect.search.belief import Belief
    from envbisect.search.strategy import Search

AGAIN = object()  # "the stage changed: judge again"


class _Stage:
    """The defaults: no failure moves the stage on, nor does the posterior alone."""

    def after_failure(self, s: "Search") -> bool:
        return False

    def settle(self, s: "Search", post: "Belief") -> bool:
        return False


class _Bisecting(_Stage):
    """A stage that is a prefix bisection: settled when the bisection has converged."""

    def step(self, s: "Search", post: "Belief") -> object:  # pragma: no cover - abstract
        raise NotImplementedError

    def settle(self, s: "Search", post: "Belief") -> bool:
        return self.step(s, post) is AGAIN


@dataclass(frozen=True)
class FindUnit(_Bisecting):
    """Prefix bisection over the search order for a unit the failure needs (the stack fails with
    the whole prefix and passes without it)."""

    def step(self, s: "Search", post: "Belief") -> object:
        order = s._order
        res = s._bisect(post, len(order), lambda k: s._prefix(k, order), "bisect: {n} suspects left")
        if not isinstance(res, int):
            return res
        s._stage = CheckAlone(res - 1)
        return AGAIN


@dataclass(frozen=True)
class CheckAlone(_Stage):
    """Unit ``order[g]`` was found: does it break the stack alone (a culprit), and does current
    without it pass (the fix)? Failing alone makes it a culprit; passing alone, an interaction."""

    g: int

    def _masks(self, s: "Search") -> tuple[int, int, int, int]:
        """(unit, its term, the config that tests it alone: with the partners it needs to start,
        the fix: current without it and what needs it)."""
        x = s._order[self.g]
        return x, 1 << x, s._up(1 << x), s._fix_mask(1 << x)

    def step(self, s: "Search", post: "Belief") -> object:
        x, term, va, vf = self._masks(s)
        sa, sf = s._status(va, post), s._status(vf, post)
        if sa == "fail":
            s._stage = CheckTerm(term)
            return AGAIN
        if sf == "fail":
            s._new_frame(term, vf)
            return AGAIN
        if sa == "pass":
            s._stage = FindPartner(self.g)
            return AGAIN
        name = s._units[x]
        if sa in ("untested", "weak"):  # alone first: it decides culprit vs interaction
            return s._request(va, f"confirm: does {name} break the stack alone?", post, TrialKind.CONFIRM)
        if sf in ("untested", "weak"):
            return s.fix_request(vf, f"confirm: current without {name} (the fix) must pass", post)
        return None

    def after_failure(self, s: "Search") -> bool:
        _x, term, va, vf = self._masks(s)
        if s._failed(va):
            s._stage = CheckTerm(term)
            return True
        if s._failed(vf):
            s._new_frame(term, vf)
            return True
        return False

    def settle(self, s: "Search", post: "Belief") -> bool:
        _x, _term, va, _vf = self._masks(s)
        if s._status(va, post) == "pass":
            s._stage = FindPartner(self.g)
            return True
        return False


@dataclass(frozen=True)
class FindPartner(_Bisecting):
    """Unit ``order[g]`` passes alone: it needs a partner, bisected among the units before it in
    the order (the ones that passed without it)."""

    g: int

    def step(self, s: "Search", post: "Belief") -> object:
        x = s._order[self.g]
        gseq = s._order[: self.g]
        res = s._bisect(post, self.g, lambda k: s._prefix(k, gseq, 1 << x),
                        f"bisect partner of {s._units[x]}: {{n}} candidates left")
        if not isinstance(res, int):
            return res
        s._stage = CheckTerm((1 << x) | ((1 << gseq[res - 1]) if res else 0))
        return AGAIN


@dataclass(frozen=True)
class CheckTerm(_Stage):
    """A term (a culprit, or a pair that fails together) was found: is it the whole story? Its
    fix failing means another culprit remains: a new frame without it."""

    term: int

    def step(self, s: "Search", post: "Belief") -> object:
        vf = s._fix_mask(self.term)
        if s._status(vf, post) == "fail":
            s._new_frame(self.term, vf)
            return AGAIN
        return s._confirm(post, self.term, need_surprise=True)

    def after_failure(self, s: "Search") -> bool:
        vf = s._fix_mask(self.term)
        if s._failed(vf):
            s._new_frame(self.term, vf)
            return True
        return False


@dataclass(frozen=True)
class Exhausted(_Stage):
    """Every unit is in a term already: nothing left to structure (the fallback decides)."""

    def step(self, s: "Search", post: "Belief") -> object:
        return None


Stage = Union[FindUnit, CheckAlone, FindPartner, CheckTerm, Exhausted]
