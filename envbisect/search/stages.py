"""The stages of the structured search, one small class each.

The search (strategy.py) walks a frame: find a unit the failure needs, ask whether it breaks the
stack alone, find its partner if it does not, then check that the term found is the whole story.
A stage is a value (frozen, so the search's state is just "which stage, over which units"); it
reads the evidence through `EvidenceReader` and says what to do next, never changing anything:

- ``step(ev, post)``: a TrialRequest, a `Move` (another stage; `NewFrame`: a culprit accepted;
  `Split`: a twin found, to be tested member by member; `Fold`: a split twin one unit again;
  after each the caller re-judges the posterior), or None when the stage has nothing to ask;
- ``after_failure(ev)``: a Move an observed failure settles, applied before the posterior is
  judged (after a failed fix check the frame must change first), or None;
- ``settle(ev, post)``: a Move the posterior settles (a converged bisection, a unit that passed
  alone), or None.

Units are bit positions; masks are ints (``1 << unit``), as in belief.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence, Union

from envbisect.search.belief import Belief, bits
from envbisect.search.types import TrialKind, TrialRequest


class EvidenceReader(Protocol):
    """What a stage reads of the search's evidence (judge.Judge is one)."""

    units: tuple[str, ...]
    order: tuple[int, ...]

    def status(self, mask: int, post: Belief) -> str: ...
    def splittable(self, unit: int) -> bool: ...
    def foldable(self, unit: int) -> bool: ...
    def failed_restarted(self, term: int) -> bool: ...
    def corestart_current(self) -> TrialRequest: ...
    def failed(self, mask: int) -> bool: ...
    def up(self, mask: int) -> int: ...
    def fix_mask(self, term: int) -> int: ...
    def prefix(self, k: int, seq: Sequence[int], base: int = 0) -> int: ...
    def bisect(self, post: Belief, length: int, cfg: Callable[[int], int], label: str,
               seq: Sequence[int] = ()) -> int | TrialRequest: ...
    def request(self, mask: int, purpose: str, post: Belief, kind: TrialKind,
                suspects_left: int | None = None) -> TrialRequest: ...
    def fix_request(self, mask: int, purpose: str, post: Belief) -> TrialRequest: ...
    def solo_doubt(self, term: int) -> int | None: ...
    def solo_request(self, u: int, term: int, post: Belief, why: str) -> TrialRequest: ...
    def confirm(self, post: Belief, term: int, need_surprise: bool = False) -> TrialRequest | None: ...


@dataclass(frozen=True)
class NewFrame:
    """``term`` is a culprit and ``fix`` (current without it) failed: accept it, look for one more."""

    term: int
    fix: int


@dataclass(frozen=True)
class Split:
    """The bisection found twin ``unit`` (order[g]): replace it by its members, then `SplitTwin`."""

    unit: int
    g: int


@dataclass(frozen=True)
class Fold:
    """Split twin ``unit`` passed alone, each member and all together: it is one unit again, at
    order[g], and its partner is searched for as the partner of any unit that passes alone."""

    unit: int
    g: int


class _Stage:
    """The defaults: no failure moves the stage on, nor does the posterior alone."""

    def after_failure(self, ev: EvidenceReader) -> "Move | None":
        return None

    def settle(self, ev: EvidenceReader, post: Belief) -> "Move | None":
        return None


class _Bisecting(_Stage):
    """A stage that is a prefix bisection: settled when the bisection has converged."""

    def step(self, ev: EvidenceReader, post: Belief) -> "Move | TrialRequest | None":  # pragma: no cover
        raise NotImplementedError

    def settle(self, ev: EvidenceReader, post: Belief) -> "Move | None":
        nxt = self.step(ev, post)
        return nxt if is_move(nxt) else None


@dataclass(frozen=True)
class FindUnit(_Bisecting):
    """Prefix bisection over the search order for a unit the failure needs (the stack fails with
    the whole prefix and passes without it)."""

    def step(self, ev: EvidenceReader, post: Belief) -> "Move | TrialRequest | None":
        order = ev.order
        res = ev.bisect(post, len(order), lambda k: ev.prefix(k, order), "bisect: {n} suspects left", order)
        if not isinstance(res, int):
            return res
        if res and ev.splittable(order[res - 1]):
            return Split(order[res - 1], res - 1)
        return CheckAlone(res - 1)


@dataclass(frozen=True)
class CheckAlone(_Stage):
    """Unit ``order[g]`` was found: does it break the stack alone (a culprit), and does current
    without it pass (the fix)? Failing alone makes it a culprit; passing alone, an interaction."""

    g: int

    def _masks(self, ev: EvidenceReader) -> tuple[int, int, int, int]:
        """(unit, its term, the config that tests it alone: with the partners it needs to start,
        the fix: current without it and what needs it)."""
        x = ev.order[self.g]
        return x, 1 << x, ev.up(1 << x), ev.fix_mask(1 << x)

    def step(self, ev: EvidenceReader, post: Belief) -> "Move | TrialRequest | None":
        x, term, va, vf = self._masks(ev)
        sa, sf = ev.status(va, post), ev.status(vf, post)
        if sa == "fail":
            return CheckTerm(term)
        if sf == "fail":
            return NewFrame(term, vf)
        if sa == "pass":
            return FindPartner(self.g)
        name = ev.units[x]
        if sa in ("untested", "weak"):  # alone first: it decides culprit vs interaction
            return ev.request(va, f"confirm: does {name} break the stack alone?", post, TrialKind.CONFIRM)
        if sf in ("untested", "weak"):
            return ev.fix_request(vf, f"confirm: current without {name} (the fix) must pass", post)
        return None

    def after_failure(self, ev: EvidenceReader) -> "Move | None":
        _x, term, va, vf = self._masks(ev)
        if ev.failed(va):
            return CheckTerm(term)
        if ev.failed(vf):
            return NewFrame(term, vf)
        return None

    def settle(self, ev: EvidenceReader, post: Belief) -> "Move | None":
        _x, _term, va, _vf = self._masks(ev)
        return FindPartner(self.g) if ev.status(va, post) == "pass" else None


@dataclass(frozen=True)
class SplitTwin(_Stage):
    """Twin ``twin`` (one change in several services) was found and split: its members are
    order[g : g + count], the one to test first first. The test that would ask whether the twin
    breaks the stack alone asks it of one member at a time instead: the first that fails alone is
    the term (its fix, current without it, then shows whether the other side is innocent). When
    every member passes alone, the members together alone: failing, they fail only together;
    passing, the twin needs a partner, and the twin is folded back into one unit first, so the
    partner is bisected among units (a side and its partner are not terms the search can hold:
    over the sides, the checks would test one (side, unit) pair per trial). Before that, if only
    the running stack has failed with the twin, current is co-restarted: on a partial restart it
    passes, and the search ends there (not reproduced) instead of searching for a partner."""

    twin: int
    g: int
    count: int

    def _members(self, ev: EvidenceReader) -> tuple[int, ...]:
        return ev.order[self.g:self.g + self.count]

    def step(self, ev: EvidenceReader, post: Belief) -> "Move | TrialRequest | None":
        for m in self._members(ev):
            alone = ev.up(1 << m)
            st = ev.status(alone, post)
            if st == "fail":
                return CheckTerm(1 << m)
            if st in ("untested", "weak"):
                return ev.request(alone, f"confirm: does {ev.units[m]} break the stack alone, without the other "
                                         f"side of {ev.units[self.twin]}?", post, TrialKind.CONFIRM)
        moved = self._apart(ev, post) or self._together(ev, post)
        if moved is not None:
            return moved
        together = ev.up(self._term(ev))
        if ev.status(together, post) == "pass":
            return ev.corestart_current()
        names = " + ".join(ev.units[m] for m in self._members(ev))
        return ev.request(together, f"confirm: do {names} break the stack together, alone?", post, TrialKind.CONFIRM)

    def _term(self, ev: EvidenceReader) -> int:
        term = 0
        for m in self._members(ev):
            term |= 1 << m
        return term

    def _apart(self, ev: EvidenceReader, post: Belief) -> "Move | None":
        """A side alone failed another way (a must-match pair: either side alone breaks the layout)
        and none alone showed the symptom: the sides cannot be told apart, so the twin is one unit
        again. Splitting refines a verdict, never erases it."""
        sts = [ev.status(ev.up(1 << m), post) for m in self._members(ev)]
        if "other" not in sts or "fail" in sts or any(st in ("untested", "weak") for st in sts):
            return None
        return Fold(self.twin, self.g) if ev.foldable(self.twin) else CheckTerm(self._term(ev))

    def _together(self, ev: EvidenceReader, post: Belief) -> "Move | None":
        """Every member passed alone: they fail only together, or (passing together too) the
        twin, one unit again, needs a partner; None while a trial is to tell (the members together
        alone, or current after a co-restart)."""
        if not ev.foldable(self.twin):
            return CheckTerm(self._term(ev))
        st = ev.status(ev.up(self._term(ev)), post)
        if st == "pass":
            return Fold(self.twin, self.g) if ev.failed_restarted(self._term(ev)) else None
        return CheckTerm(self._term(ev)) if st == "fail" else None

    def after_failure(self, ev: EvidenceReader) -> "Move | None":
        for m in self._members(ev):
            if ev.failed(ev.up(1 << m)):
                return CheckTerm(1 << m)
        return None

    def settle(self, ev: EvidenceReader, post: Belief) -> "Move | None":
        if all(ev.status(ev.up(1 << m), post) == "pass" for m in self._members(ev)):
            return self._together(ev, post)
        return None


@dataclass(frozen=True)
class FindPartner(_Bisecting):
    """Unit ``order[g]`` passes alone: it needs a partner, bisected among the units before it in
    the order (the ones that passed without it)."""

    g: int

    def step(self, ev: EvidenceReader, post: Belief) -> "Move | TrialRequest | None":
        x = ev.order[self.g]
        gseq = ev.order[: self.g]
        res = ev.bisect(post, self.g, lambda k: ev.prefix(k, gseq, 1 << x),
                        f"bisect partner of {ev.units[x]}: {{n}} candidates left", gseq)
        if not isinstance(res, int):
            return res
        return CheckTerm((1 << x) | ((1 << gseq[res - 1]) if res else 0))


@dataclass(frozen=True)
class CheckTerm(_Stage):
    """A term (a culprit, or a pair that fails together) was found: is it the whole story? Its
    fix failing means another culprit remains: a new frame without it."""

    term: int

    def step(self, ev: EvidenceReader, post: Belief) -> "Move | TrialRequest | None":
        vf = ev.fix_mask(self.term)
        if ev.status(vf, post) == "fail":
            u = ev.solo_doubt(self.term)
            why = f"Current without {' + '.join(ev.units[x] for x in bits(self.term))} still fails"
            if u is not None:
                return ev.solo_request(u, self.term, post, why)
            if self.term.bit_count() > 1 and not ev.failed(ev.up(self.term)):
                # another culprit is in current: the failures that made the pair look guilty may be
                # its own, so the pair is seen failing alone before it is accepted
                together = ev.up(self.term)
                if ev.status(together, post) == "pass":
                    return FindUnit()
                return ev.solo_request(-1, self.term, post, why)
            return NewFrame(self.term, vf)
        return ev.confirm(post, self.term, need_surprise=True)

    def after_failure(self, ev: EvidenceReader) -> "Move | None":
        """A member of a pair that failed alone is the term; the fix failing opens a new frame,
        once no member of a pair is left in doubt (`Judge.solo_doubt`)."""
        vf = ev.fix_mask(self.term)
        if self.term.bit_count() > 1:
            for u in bits(self.term):
                if ev.failed(ev.up(1 << u)):
                    return CheckTerm(1 << u)
        settled = ev.solo_doubt(self.term) is None and (self.term.bit_count() < 2 or ev.failed(ev.up(self.term)))
        return NewFrame(self.term, vf) if ev.failed(vf) and settled else None


@dataclass(frozen=True)
class Exhausted(_Stage):
    """Every unit is in a term already: nothing left to structure (the fallback decides)."""

    def step(self, ev: EvidenceReader, post: Belief) -> "Move | TrialRequest | None":
        return None


Stage = Union[FindUnit, CheckAlone, SplitTwin, FindPartner, CheckTerm, Exhausted]
Move = Union[Stage, NewFrame, Split, Fold]


def is_move(x: object) -> bool:
    return isinstance(x, (_Stage, NewFrame, Split, Fold))


__all__ = ["EvidenceReader", "NewFrame", "Split", "Fold", "Stage", "Move", "is_move", "FindUnit", "CheckAlone",
           "SplitTwin", "FindPartner", "CheckTerm", "Exhausted"]
