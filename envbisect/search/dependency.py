"""Another failure: a trial that fails differently from the symptom, and the delta behind it.

A configuration that fails differently (a service that will not start when the symptom is a
hang, another HTTP status) says nothing about the symptom: it is skipped, as `git bisect skip`
does. It usually means a delta needs a partner (a flag that requires another flag, a feature
switch without its model path). The search finds the pair from the configuration that failed
differently, X, with two prefix bisections, rebuilt from the evidence every time (as the
structured stages are), and a check:

1. the *needy* delta: the shortest prefix of X (in the search's order) that fails differently;
   its last delta e fails differently without something X lacks;
2. its *partner*: added to that prefix, the fewest of the other deltas (in order) with which it
   no longer fails differently; the last of them is p;
3. the check: the prefix plus p alone must not fail differently. Then e needs p: seen failing
   differently without it, not without e, and not with p.

From then on the search never asks for e without p (`Judge.up`), a fix that takes p out takes
e too (`Judge.down`), and p is moved before e in the bisection order, so no prefix splits them.
`step` reads a frozen `Judge` and answers with a request or a finding (`Need`, `GIVE_UP`), which
the search records. Pure: no I/O, no clock, no randomness.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

from envbisect.search.belief import Belief
from envbisect.search.judge import Judge
from envbisect.search.types import Dependency, Observation, TrialKind, TrialRequest


@dataclass(frozen=True)
class Need:
    """Found: unit ``needy`` fails differently without ``partners`` (a mask)."""

    needy: int
    partners: int


@dataclass(frozen=True)
class Skip:
    """Configuration ``mask`` failed differently and no delta of it is cured by a partner: its
    failure is not a dependency (a second fault, masked where the symptom shows). Skipped from now
    on, as `git bisect skip` does; an `Incident` bisects it as a problem of its own."""

    mask: int
    needy: int


@dataclass(frozen=True)
class GiveUp:
    """The configurations that failed differently cannot be explained: skip them from now on."""


GIVE_UP = GiveUp()


def clean(s: Judge, mask: int) -> bool | None:
    """True: seen not failing differently (it passed, or showed the symptom); False: seen failing
    differently, and never clean; None: not run."""
    ev = s.configs.get(mask)
    if ev is not None and ev.resolved:
        return True
    if mask == 0:
        return None
    return False if mask in s.other else None


def passed(s: Judge, mask: int) -> bool:
    """Seen passing. A trial that failed with the symptom shows nothing about a delta that fails
    differently: the symptom can mask its failure, so only a pass shows it is cured."""
    ev = s.configs.get(mask)
    return ev is not None and ev.resolved > 0 and not ev.failed


def unexplained(s: Judge) -> int | None:
    """The first configuration that failed differently which no known dependency explains."""
    for mask in s.other:
        if clean(s, mask) is True or s.down(mask) != mask or mask in s.skipped or mask & s.masking:
            continue
        return mask
    return None


def _bisect_edge(s: Judge, length: int, cfg: Callable[[int], int], want_clean_low: bool) -> tuple[int, int | None]:
    """Bisection for the boundary between clean and failing-differently along cfg(0..length).
    want_clean_low: cfg(0) is clean and cfg(length) fails differently (find the first that fails);
    else cfg(0) fails differently and cfg(length) is clean (find the first clean one).
    Returns (boundary, None) once settled, or (-1, mask to run)."""
    low_state = want_clean_low  # clean() value at the low end
    lo, hi = 0, length
    for k in range(1, length):
        c = clean(s, cfg(k))
        if c is None:
            continue
        if c == low_state:
            lo = max(lo, k)
        elif k < hi:
            hi = k
    # keep lo < hi consistent when the evidence is not monotone (several dependencies)
    if lo >= hi:
        lo = max(k for k in range(hi) if k == 0 or clean(s, cfg(k)) == low_state)
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        c = clean(s, cfg(mid))
        if c is None:
            return -1, cfg(mid)
        if c == low_state:
            lo = mid
        else:
            hi = mid
    return hi, None


def step(s: Judge, post: Belief) -> TrialRequest | Need | Skip | GiveUp | None:
    """The next request of the dependency search, a `Need` found, `GIVE_UP`, or None when every
    configuration that failed differently is explained (or the search gave up on it)."""
    if s.dependency_given_up:
        return None
    x = unexplained(s)
    if x is None:
        return None
    if len(s.needs_found) > 2 * s.n:  # defensive: dependencies that keep moving; skip instead
        return GIVE_UP
    seq = s.ranked(x)
    needy_cfg = lambda k: s.up(_mask(seq[:k]))  # noqa: E731
    k, run = _bisect_edge(s, len(seq), needy_cfg, want_clean_low=True)
    if run is not None:
        return s.request(run, f"dependency: which delta of {s.fmt(x)} fails differently from the symptom "
                               "without a partner?", post, TrialKind.DEPENDENCY)
    e = seq[k - 1]
    base = needy_cfg(k)
    if any((m >> e) & 1 and m & ~x for m in s.split.values()):
        return Skip(x, e)  # a side of an auto-linked unit without the other: the unit is judged whole
    name = s.units[e]
    cands = s.ranked(s.all & ~base)
    collected = 0  # cures found that were not all it needs: they stay while the rest is searched
    while cands:
        fixed = base | collected
        cure_cfg = lambda j: s.up(fixed | _mask(cands[:j]))  # noqa: E731
        every = clean(s, cure_cfg(len(cands)))
        if every is False:
            break  # every candidate added, it still fails differently: no cure among them
        if every is None:
            return s.request(cure_cfg(len(cands)), f"dependency: does {name} fail differently with every other "
                                                    "delta that did not show the symptom?", post, TrialKind.DEPENDENCY)
        j, run = _bisect_edge(s, len(cands), cure_cfg, want_clean_low=False)
        if run is not None:
            return s.request(run, f"dependency: which delta does {name} need?", post, TrialKind.DEPENDENCY)
        p = cands[j - 1]
        check = s.up(base | (1 << p))
        c = clean(s, check)
        if c is None:
            return s.request(check, f"dependency: does {name} start with {s.units[p]}?", post, TrialKind.DEPENDENCY)
        if c and not passed(s, check) and base in s.early:
            return Need(e, 1 << p)  # it did not start without p, and with p it started: the symptom masks nothing
        if c and not passed(s, check):
            found = _masked_cure(s, e, p, post)
            if found is not None:
                return found
            cands = [u for u in cands if u != p]
            continue
        if c:
            return Need(e, 1 << p)
        # p cured something the deltas before it needed (another needy delta), or is not all e needs:
        # keep it and look for e's partner among the deltas before it
        collected |= 1 << p
        cands = cands[: j - 1]
    if collected and (base in s.early or passed(s, s.up(base | collected))):
        return Need(e, collected)
    return Skip(x, e)


def _masked_cure(s: Judge, e: int, p: int, post: Belief) -> TrialRequest | Need | None:
    """The prefix with p showed the symptom, which can mask what e does: p cures e only if e and p
    passed without the rest, or p shows no symptom without e (then the symptom with both is e's own
    fault, once it starts). Sides of one auto-linked unit are no dependency: the unit is judged
    whole (a must-match pair fails differently apart). None: p is no cure seen."""
    if any((m >> e) & 1 and (m >> p) & 1 for m in s.split.values()):
        return None
    if passed(s, s.up((1 << e) | (1 << p))):
        return Need(e, 1 << p)
    solo = s.up(1 << p)
    if solo == 0 or (solo >> e) & 1:
        return None
    if passed(s, solo):
        return Need(e, 1 << p)
    if clean(s, solo) is None:
        return s.request(solo, f"dependency: does {s.units[p]} show the symptom without {s.units[e]}?", post,
                         TrialKind.DEPENDENCY)
    return None


def _mask(units: Sequence[int]) -> int:
    m = 0
    for u in units:
        m |= 1 << u
    return m


def describe(s: Judge) -> tuple[Dependency, ...]:
    """The dependencies found, each with the trials that show it when all three were run."""
    out = []
    for e, partners in s.needs.items():
        name = s.units[e]
        pnames = s.names(partners)
        cite: tuple[int, ...] = ()
        for a in s.other:
            if not (a >> e) & 1 or (a & partners) == partners or clean(s, a) is True:
                continue
            without = a & ~(1 << e)
            with_ = s.up(a | partners)
            if clean(s, without) is True or without == 0:
                if a in s.early and clean(s, with_):  # with the partners it started
                    cite = (s.other[a][0], s.trial_of(without), s.trial_of(with_))
                    break
                if not passed(s, with_) and passed(s, s.up((1 << e) | partners)):
                    with_ = s.up((1 << e) | partners)
                if passed(s, with_) or (clean(s, with_) and passed(s, partners)):
                    cite = (s.other[a][0], s.trial_of(without), s.trial_of(with_))
                    break
        who = " + ".join(pnames)
        if cite:
            text = (f"{name} needs {who}: without it the stack failed differently from the symptom (trial {cite[0]}), "
                    f"without {name} too it did not ({_said(cite[1])}), with {who} it did not (trial {cite[2]})")
        else:
            text = (f"{name} needs {who} (inferred from the trials that failed differently from the symptom; "
                    "not every side of it was run)")
        out.append(Dependency(name, pnames, text, bool(cite), cite))
    return tuple(out)


def shown(history: Sequence[tuple[Observation, Hashable | None]], dep: Dependency, culprits: set[str]) -> bool:
    """Whether a trial shows ``dep``: one with the needy delta and its partners, and without every
    culprit, that passed; or, where the needy delta without them does not start, one with them that
    started (failed only later, whatever it held). A trial that failed with the symptom shows nothing
    else about it: the symptom masks another failure (a 500 behind a hang)."""
    need = {dep.needy, *dep.partners}
    apart = [sign for o, sign in history if o.failed and sign is not None and dep.needy in o.config
             and not set(dep.partners) <= o.config]
    at_start = bool(apart) and all(_at_start(sign) for sign in apart)
    for o, sign in history:
        if o.unresolved or o.free or not need <= o.config:
            continue
        if not o.failed and not o.config & culprits:
            return True
        # a start failure apart: a trial with both that failed only after the start got past it
        if at_start and o.failed and sign is not None and not _at_start(sign):
            return True
    return False


def _at_start(sign: Hashable | None) -> bool:
    return getattr(sign, "kind", sign) in ("start", "start-failure")


def checked(history: Sequence[tuple[Observation, Hashable | None]], deps: Sequence[Dependency],
            culprits: Sequence[str]) -> tuple[Dependency, ...]:
    """The verdict's dependencies, each shown by a trial (`shown`). One with a culprit on either side
    is dropped: nothing without the culprits can hold it, and the culprit's own fault explains the
    failure. Another is kept as inferred, saying that no trial showed it."""
    named = set(culprits)
    out = []
    for d in deps:
        if shown(history, d, named):
            out.append(d)
        elif d.needy not in named and not named & set(d.partners):
            who = " + ".join(d.partners)
            out.append(Dependency(d.needy, d.partners, f"{d.needy} needs {who} (inferred from the trials that "
                                  "failed differently from the symptom; no trial with both, and without the "
                                  "culprits, passed)", False, ()))
    return tuple(out)


def _said(trial: int) -> str:
    return f"trial {trial}" if trial else "the baseline"


__all__ = ["step", "describe", "shown", "checked", "unexplained", "clean", "passed", "Need", "Skip", "GiveUp",
           "GIVE_UP"]
