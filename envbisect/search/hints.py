"""What the search may be told besides the observations: twins, and the order to try things in.

A *twin* is a unit that holds the same change in two services (auto-linked: prefill and decode
usually must agree, so the bisection keeps them together). The verdict must still name the side
that breaks the stack, so `Search(units, twins=...)` splits a twin the moment the bisection has
found it: the trial that asks whether it breaks the stack alone asks it of one member (the one
the hints favour) instead, and the fix check that follows shows whether the other side is
innocent (stages.SplitTwin). No restart is spent after the verdict to test the sides apart.

Hints only ORDER the tests: which member of a twin is asked first, and where the bisection splits
its suspects (`suspicion_of`: a delta of an engine that fails when asked directly is more
suspect, a logging-only knob less). They never stand in for an observation and never enter the
belief: the same claims are observed (or marked inferred) whatever the hints say, a split never
leaves more than 2^(ceil(log2 n) - 1) suspects on either side, so the worst case stays
ceil(log2 n) steps, and a wrong twin hint costs at most the one trial it reordered. Pure: no I/O.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterable, Mapping, Sequence

from envbisect.outcome import VerdictKind
from envbisect.search.judge import Judge
from envbisect.search.types import Verdict

MEMBER = "member:"  # the unit id of one delta of a twin, tested apart (the runner maps it to the delta)
LINKED = "linked:"  # the unit id of auto-linked deltas (state/deltas.linked_units)


def member_id(delta: str) -> str:
    return MEMBER + delta


def service_of(delta: str) -> str:
    """The service of a delta id (``decode:SGLANG_X`` -> ``decode``)."""
    return delta.split(":", 1)[0]


def twins_of(units: Mapping[str, Sequence[str]], declared: Iterable[str] = (),
             failing: Iterable[str] = ()) -> dict[str, tuple[str, ...]]:
    """The auto-linked units of two deltas (never a group the user declared), each -> its member
    unit ids, the member to test first first: a delta of a service in ``failing`` (it failed when
    asked directly) before the others, else in the unit's own order."""
    declared_units = {LINKED + k for k in declared}
    bad = set(failing)
    out: dict[str, tuple[str, ...]] = {}
    for unit, deltas in units.items():
        if unit.startswith(LINKED) and unit not in declared_units and len(deltas) == 2:
            ranked = sorted(deltas, key=lambda d: service_of(d) not in bad)  # stable: the unit's order on ties
            out[unit] = tuple(member_id(d) for d in ranked)
    return out


class KnobClass(str, Enum):
    """What kind of setting a knob is, as far as the prior goes."""

    LOGGING = "logging-only"  # what is logged, not what is served: rarely breaks a request
    PATH = "path"  # where something is read from or sent to
    LAYOUT = "must-match layout"  # parallelism, page and cache layout: sides must agree
    TUNING = "tuning"  # everything else: kernels, batch sizes, timeouts


_CLASS_BY_NAME = (
    (KnobClass.LOGGING, re.compile(r"(^|_)(LOG|LOGS|LOGGING|LOG_LEVEL|DEBUG|VERBOSE|VERBOSITY|TRACE)(_|$)")),
    (KnobClass.PATH, re.compile(r"(^|_)(PATH|DIR|FILE|URL|ENDPOINT|HOST|ADDR|ADDRESS|PORT)(_|$)")),
    (KnobClass.LAYOUT, re.compile(r"(^|_)(TP|PP|DP|EP|TP_SIZE|PAGE_SIZE|KV_CACHE_DTYPE|DTYPE|TENSOR_PARALLEL)(_|$)")),
)

# How much more suspect than a tuning knob, before anything is observed. Only the order of the
# tests follows it (Judge._middle); no claim of a verdict rests on it.
SUSPICION = {KnobClass.LOGGING: 0.25, KnobClass.PATH: 1.0, KnobClass.LAYOUT: 1.0, KnobClass.TUNING: 1.0}
FAILING_ENGINE = 4.0  # a delta of a service that failed when asked directly


def knob_class(key: str) -> KnobClass:
    """The class of a knob by its name (the engine registry's class, when it has one, comes first)."""
    name = key.upper().split("[", 1)[0]
    for cls, pattern in _CLASS_BY_NAME:
        if pattern.search(name):
            return cls
    return KnobClass.TUNING


def suspicion_of(units: Mapping[str, Sequence[str]], failing: Iterable[str] = (),
                 classes: Mapping[str, KnobClass] | None = None) -> dict[str, float]:
    """A unit -> how much more suspect it is than a tuning knob: the most suspect of its deltas, a
    delta of a failing service ``FAILING_ENGINE`` times more, a logging-only knob a quarter. A delta
    id is ``service:KEY``; ``classes`` (delta id -> class) overrides the class read from its key."""
    bad = set(failing)
    out: dict[str, float] = {}
    for unit, deltas in units.items():
        weights = []
        for d in deltas:
            cls = (classes or {}).get(d) or knob_class(d.split(":", 1)[-1])
            weights.append(SUSPICION[cls] * (FAILING_ENGINE if service_of(d) in bad else 1.0))
        out[unit] = max(weights, default=1.0)
    return out


def member_units(twins: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    """The member unit ids -> the one delta each stands for (for the runner's unit table)."""
    return {m: (m[len(MEMBER):],) for members in twins.values() for m in members}


def fold(verdict: Verdict, twins: Mapping[str, Sequence[str]]) -> tuple[Verdict, dict[str, tuple[str, ...]]]:
    """The verdict in the caller's units: a member named is its twin, refined to the deltas named
    (twin -> guilty deltas, as a refinement after the verdict would report it)."""
    owner = {m: t for t, members in twins.items() for m in members}
    if not any(u in owner for u in verdict.culprits):
        return verdict, {}
    refined: dict[str, tuple[str, ...]] = {}
    for u in verdict.culprits:
        if u in owner:
            refined[owner[u]] = refined.get(owner[u], ()) + (u[len(MEMBER):],)

    def unit(u: str) -> str:
        return owner.get(u, u)

    terms = tuple(dict.fromkeys(tuple(dict.fromkeys(unit(u) for u in term)) for term in verdict.terms))
    culprits = tuple(dict.fromkeys(unit(u) for u in verdict.culprits))
    kind = verdict.kind
    if kind == VerdictKind.INTERACTION and all(len(t) == 1 for t in terms):
        kind = VerdictKind.CULPRIT  # a twin whose sides fail only together: the twin is the culprit
    best: dict[str, float] = {}
    for u, p in verdict.suspects:
        best[unit(u)] = max(p, best.get(unit(u), 0.0))
    suspects = tuple(best.items())
    folded = Verdict(kind, culprits, verdict.confidence, suspects, verdict.explanation, terms, verdict.dependencies)
    return folded, refined


@dataclass(frozen=True)
class Hints:
    """What a bisection run tells its search besides the observations, recorded with the run so a
    resume and a replay build the same search: the twins (unit -> members, the one to ask first
    first) and the suspicion per unit."""

    twins: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    suspicion: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, units: Mapping[str, Sequence[str]], declared: Iterable[str] = (),
           failing: Iterable[str] = ()) -> "Hints":
        failing = tuple(failing)
        return cls(twins_of(units, declared, failing), suspicion_of(units, failing))

    def search_options(self) -> dict[str, Any]:
        """The keyword arguments of `Search` (none when there is nothing to say)."""
        out: dict[str, Any] = {}
        if self.twins:
            out["twins"] = dict(self.twins)
        if any(w != 1.0 for w in self.suspicion.values()):
            out["suspicion"] = dict(self.suspicion)
        return out

    def member_units(self) -> dict[str, tuple[str, ...]]:
        return member_units(self.twins)

    def to_json(self) -> dict[str, Any]:
        return {"twins": {u: list(m) for u, m in self.twins.items()}, "suspicion": dict(self.suspicion)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any] | None) -> "Hints":
        doc = doc or {}
        return cls({u: tuple(m) for u, m in (doc.get("twins") or {}).items()}, dict(doc.get("suspicion") or {}))

    def conclude(self, verdict: Verdict, evidence: Judge) -> tuple[Verdict, dict[str, tuple[str, ...]], list[str]]:
        """(the verdict in the run's units, twin -> the deltas to blame, one note per twin split):
        a member named is its twin, refined to the side named; member ids in the explanation are
        the deltas they stand for."""
        folded, refined = fold(verdict, self.twins)
        text = folded.explanation
        for member in sorted(self.member_units(), key=len, reverse=True):
            text = text.replace(member, member[len(MEMBER):])
        folded = dataclasses.replace(folded, explanation=text)
        notes = []
        for twin, deltas in list(refined.items()):
            blamed = [member_id(d) for d in deltas]
            seen = "; ".join(_seen(evidence, m, blamed) for m in self.twins[twin])
            # a side that fails another way without the blamed one cannot be left alone either
            # (reverting the blamed side would leave it failing its own way): the group
            other = {m[len(MEMBER):]: _other_without(evidence, m, blamed) for m in self.twins[twin] if m not in blamed}
            other = {d: ts for d, ts in other.items() if ts}
            if other:
                refined[twin] = deltas = tuple(m[len(MEMBER):] for m in self.twins[twin])
                seen += "; " + "; ".join(f"{d} failed another way without the other side in trial "
                                         f"{', '.join(map(str, ts))}" for d, ts in other.items())
            verdict_text = ("each side breaks it alone: reported as the group" if len(deltas) == len(self.twins[twin])
                            else f"only {', '.join(deltas)} is to blame")
            notes.append(f"{twin} was auto-linked for the search; tested apart inside the search ({seen}): "
                         f"{verdict_text}")
        return folded, refined, notes


def _other_without(j: Judge, member: str, blamed: Sequence[str]) -> tuple[int, ...]:
    """The trials of configs that held `member` but none of `blamed` and failed another way."""
    bit, guilty = j.mask([member]), j.mask([b for b in blamed if b != member])
    return tuple(sorted(t for m, ts in j.other.items() if m & bit and not m & guilty for t in ts))


def _seen(j: Judge, member: str, blamed: Sequence[str]) -> str:
    """What the trials showed of one side: failing alone, or passing without the blamed side."""
    delta = member[len(MEMBER):]
    ev = j.configs.get(j.up(j.mask([member])))
    if ev is not None and ev.failed:
        return f"{delta} failed alone in trial {', '.join(map(str, ev.failed_trials))}"
    bit, guilty = j.mask([member]), j.mask([b for b in blamed if b != member])
    passed = sorted(t for m, e in j.configs.items() if m & bit and not m & guilty and not e.failed
                    for t in e.passed_trials)
    if passed:
        return f"{delta} passed without the other side in trial {', '.join(map(str, passed))}"
    return f"{delta} was not tested without the other side"


__all__ = ["Hints", "MEMBER", "LINKED", "KnobClass", "SUSPICION", "FAILING_ENGINE", "member_id", "service_of",
           "twins_of",
           "knob_class", "suspicion_of", "member_units", "fold"]
