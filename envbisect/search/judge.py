"""What the search has seen, frozen, and the rules it is judged by.

A `Judge` is a value: the observations per configuration, the culprits accepted so far, the
bisection order, the dependencies learnt from trials that failed differently, and the settings
that turn a posterior into a request (how many probe runs, when a pass is too weak to build on).
`Search` (strategy.py) replaces its judge after every observation and every accepted culprit; the
stages (stages.py), the dependency search (dependency.py) and the explainer (explain.py) only read
one. Units are bit positions and configurations are masks (``1 << unit``), as in belief.py.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Callable, Iterable, Mapping, Sequence

from envbisect.search.belief import PAIR, SINGLE, Belief, HypClass, bits
from envbisect.search.types import Observation, Prior, TrialKind, TrialRequest


# the failure rate a fix check rules out at the verdict's confidence: an intermittent culprit left
# behind a deterministic one fails about this often (issue 39: a 30% pool-size hang behind CTAS)
FIX_RATE = 0.3


@dataclass(frozen=True)
class ConfigEvidence:
    """Every resolved trial of one configuration, pooled."""

    passes: int = 0
    failed: bool = False
    resolved: int = 0
    restarted_fail: bool = False  # a failure seen after a co-restart (not only on the running stack)
    restarted_passes: int = 0
    trials: tuple[int, ...] = ()  # 1-based trial numbers, for "observed in trial N"
    failed_trials: tuple[int, ...] = ()
    passed_trials: tuple[int, ...] = ()  # trials of this config with no failed run

    def add(self, obs: Observation, trial: int) -> "ConfigEvidence":
        return ConfigEvidence(
            passes=self.passes + obs.passes,
            failed=self.failed or obs.failed,
            resolved=self.resolved + 1,
            restarted_fail=self.restarted_fail or (obs.failed and not obs.free),
            restarted_passes=self.restarted_passes + (0 if obs.free else obs.passes),
            trials=self.trials + (trial,),
            failed_trials=self.failed_trials + ((trial,) if obs.failed else ()),
            passed_trials=self.passed_trials + (() if obs.failed else (trial,)),
        )


@dataclass(frozen=True)
class Rules:
    """The search's settings (see `Search`), and the doubt a pass may leave before it is built on."""

    confidence: float
    max_trials: int | None
    base_probes: int
    max_probes: int
    prior: Prior
    require_fix: bool
    premise_probes: int
    premise_failures: int
    retries: int

    @property
    def tau(self) -> float:
        # A bisection builds on about log2(n) passes, and a verdict resting on one lucky pass blames
        # an innocent delta, so each pass must be much surer than the verdict as a whole.
        return (1.0 - self.confidence) / 20.0

    @property
    def retest_cap(self) -> int:
        """Passes of one config beyond which it is not re-tested."""
        return 3 * self.max_probes


def _frozen(d: dict) -> Mapping:
    return MappingProxyType(d)


@dataclass(frozen=True)
class Judge:
    """The evidence of one search and the rules it is read by; never changed, replaced."""

    units: tuple[str, ...]  # the search's units, then the members of its twins (see hints.py)
    rules: Rules
    size: int = 0  # the search's units (the twins' members come after them)
    configs: Mapping[int, ConfigEvidence] = field(default_factory=lambda: _frozen({}))
    resolved: tuple[tuple[int, int, int], ...] = ()  # (config, passes, failures) per resolved trial
    restarts: int = 0  # trials that cost a restart (a free probe of the running stack is none)
    terms: tuple[int, ...] = ()  # accepted terms (masks), one per closed frame
    term_conf: tuple[float, ...] = ()
    order: tuple[int, ...] = ()  # units of the current frame, in bisection order
    # configs that failed differently from the symptom (mask -> trial numbers), and what was learnt
    # from them: a unit -> the partners it needs (search/dependency.py)
    other: Mapping[int, tuple[int, ...]] = field(default_factory=lambda: _frozen({}))
    needs: Mapping[int, int] = field(default_factory=lambda: _frozen({}))
    needs_found: tuple[tuple[int, int], ...] = ()
    dependency_given_up: bool = False
    skipped: frozenset[int] = frozenset()  # configs that failed differently with no dependency behind it
    masking: int = 0  # the deltas behind them: a config holding one fails another way unless masked
    early: frozenset[int] = frozenset()  # configs that failed differently before the symptom could show
    # twins (hints.py): a unit -> its members (bits, the one to test first first), until it is split;
    # then split: the unit -> its members' mask (every config that held the unit holds them)
    twins: Mapping[int, tuple[int, ...]] = field(default_factory=lambda: _frozen({}))
    split: Mapping[int, int] = field(default_factory=lambda: _frozen({}))
    # how much more suspect each unit is than the others (hints.py), per bit; empty: all alike.
    # It orders the bisection and places its splits, never changes the belief (see `bisect`)
    weights: tuple[float, ...] = ()

    def __deepcopy__(self, memo: dict) -> "Judge":
        return self  # a value: a copy of a search shares it

    @classmethod
    def start(cls, units: Sequence[str], rules: Rules, twins: Mapping[str, Sequence[str]] | None = None,
              suspicion: Mapping[str, float] | None = None) -> "Judge":
        """``twins``: a unit -> the member units it stands for, to be tested apart; ``suspicion``: a
        unit -> how much more suspect it is than the others (1: as suspect as any). See hints.py."""
        names = list(units)
        found: dict[int, tuple[int, ...]] = {}
        for unit, members in (twins or {}).items():
            found[names.index(unit)] = tuple(range(len(names), len(names) + len(members)))
            names.extend(members)
        order = tuple(range(len(units)))
        weights: tuple[float, ...] = ()
        if suspicion:
            weights = tuple(float(suspicion.get(u, 1.0)) for u in names)
            order = tuple(sorted(order, key=lambda u: -weights[u]))  # stable: the given order on ties
        return cls(tuple(names), rules, size=len(units), order=order, twins=_frozen(found), weights=weights)

    # -- the next value --------------------------------------------------------------------------

    def observe(self, obs: Observation, trial: int) -> "Judge":
        """With one more observation (``trial``: its number, as the explanation cites it)."""
        restarts = self.restarts + (0 if obs.free else 1)
        mask = self.mask(obs.config)
        if obs.other:
            other = dict(self.other)
            other[mask] = other.get(mask, ()) + (trial,)
            early = self.early | {mask} if obs.before else self.early
            return dataclasses.replace(self, restarts=restarts, other=_frozen(other), early=early)
        if obs.unresolved:
            return dataclasses.replace(self, restarts=restarts)
        configs = dict(self.configs)
        configs[mask] = configs.get(mask, ConfigEvidence()).add(obs, trial)
        return dataclasses.replace(self, restarts=restarts, configs=_frozen(configs),
                                   resolved=self.resolved + ((mask, obs.passes, obs.failures),))

    def with_term(self, term: int, fix: int) -> "Judge":
        """``term`` accepted as a culprit and a new frame opened without it (``fix`` failed)."""
        # The frame cannot express "this term plus another culprit", so how sure the search is of
        # ``term`` is judged on the evidence from before the failed fix check.
        conf = self.belief(exclude=fix).p_has_term(term)
        if self.failed(self.up(term)):
            # seen failing alone: its guilt is observed (a good config never fails), whatever a frame
            # of one more culprit makes of the failures of the others (issue 39: behind a 30% one)
            conf = 1.0
        return dataclasses.replace(self, terms=self.terms + (term,), term_conf=self.term_conf + (min(1.0, conf),),
                                   order=tuple(u for u in self.order if not (term >> u) & 1))

    def void_term(self) -> int | None:
        """An accepted culprit whose proof is gone (`lost_proof`), or None."""
        return next((t for t in self.terms if self.lost_proof(t)), None)

    def lost_proof(self, term: int) -> bool:
        """Whether ``term`` was found on a pass that failed since, and nothing else proves it.
        A unit x of a term is found on "P passed, P + x failed" (P without x), or the term failed
        alone; a pass of P read with the intermittency learnt from current may be the luck of
        another, intermittent, culprit in P, and when P fails later nothing is left to blame x for
        (issue 39: behind a deterministic culprit, a 30% one in P got the unit after it named)."""
        if self.failed(self.up(term)):
            return False
        fails = [m for m, ev in self.configs.items() if ev.failed and m & term == term]
        for u in bits(term):
            def proves(p: int) -> bool:
                return not (p >> u) & 1 and any(f & ~self.up(p | (1 << u)) == 0 for f in fails)  # noqa: B023
            if any(proves(p) for p, ev in self.configs.items() if not ev.failed and ev.passes):
                continue
            if any(proves(p) for p, ev in self.configs.items() if ev.failed and ev.passed_trials):
                return True
        return False

    def without_term(self, term: int) -> "Judge":
        """Accepted ``term`` dropped (`void_term`): its units are suspects again, last in the order."""
        i = self.terms.index(term)
        return dataclasses.replace(self, terms=self.terms[:i] + self.terms[i + 1:],
                                   term_conf=self.term_conf[:i] + self.term_conf[i + 1:],
                                   order=self.order + tuple(u for u in bits(term) if u not in self.order))

    def with_need(self, e: int, partners: int) -> "Judge":
        """Unit ``e`` needs ``partners``: they move before it in the bisection order, so no prefix
        holds e without them."""
        needs = dict(self.needs)
        needs[e] = needs.get(e, 0) | partners
        old = list(self.order)
        order = old
        if e in old:
            order = [u for u in old if not ((partners >> u) & 1 and old.index(u) > old.index(e))]
            moved = [u for u in old if (partners >> u) & 1 and old.index(u) > old.index(e)]
            i = order.index(e)
            order[i:i] = moved
        return dataclasses.replace(self, needs=_frozen(needs), needs_found=self.needs_found + ((e, partners),),
                                   order=tuple(order))

    def with_skip(self, mask: int, e: int) -> "Judge":
        """``mask`` failed differently and no partner cures it: skipped (another fault's failure).
        ``e``, the delta behind it, moves to the end of the bisection order, so the prefixes that
        look for the symptom's culprit leave it out as long as they can (a twin's side stays)."""
        order = self.order
        if e in order and not any((m >> e) & 1 for m in self.split.values()):
            order = tuple(u for u in order if u != e) + (e,)
        return dataclasses.replace(self, skipped=self.skipped | {mask}, order=order, masking=self.masking | (1 << e))

    def another_fault(self, mask: int) -> bool:
        """``mask`` failed differently, and no dependency is behind it: another fault shows there."""
        return mask in self.other and mask not in self.configs and (mask in self.skipped or bool(mask & self.masking))

    def without_dependency_search(self) -> "Judge":
        return dataclasses.replace(self, dependency_given_up=True)

    def splittable(self, unit: int) -> bool:
        """A twin not yet split, and in no dependency (a need is learnt over whole units)."""
        if unit not in self.twins or unit in self.needs:
            return False
        return not any((partners >> unit) & 1 for partners in self.needs.values())

    def with_split(self, unit: int) -> "Judge":
        """Twin ``unit`` replaced by its members everywhere: in the order (in its place, the member to
        test first first) and in every observed config (a config that held the unit held them all)."""
        members = self.twins[unit]
        split = dict(self.split)
        split[unit] = sum(1 << m for m in members)
        twins = {u: ms for u, ms in self.twins.items() if u != unit}
        grown = dataclasses.replace(self, split=_frozen(split), twins=_frozen(twins))
        order = [u for x in self.order for u in (members if x == unit else (x,))]
        return dataclasses.replace(
            grown, order=tuple(order),
            configs=_frozen({grown.expand(m): ev for m, ev in self.configs.items()}),
            resolved=tuple((grown.expand(m), k, f) for m, k, f in self.resolved),
            other=_frozen({grown.expand(m): ts for m, ts in self.other.items()}),
            skipped=frozenset(grown.expand(m) for m in self.skipped),
            early=frozenset(grown.expand(m) for m in self.early))

    def failed_restarted(self, term: int) -> bool:
        """A config that holds ``term`` failed after a co-restart (not only as the stack was running)."""
        return any(ev.restarted_fail and m & term == term for m, ev in self.configs.items())

    def corestart_current(self) -> TrialRequest:
        """Current co-restarted: whether the failure comes back after a full ordered co-restart."""
        return TrialRequest(frozenset(self.names(self.all)), self.rules.premise_probes,
                            "confirm after a co-restart: current failed as it was running", kind=TrialKind.CONFIRM)

    def foldable(self, unit: int) -> bool:
        """Split twin ``unit`` can be one unit again: none of its members is in a dependency."""
        members = self.split.get(unit, 0)
        return bool(members) and not any((members >> e) & 1 or partners & members
                                         for e, partners in self.needs.items())

    def with_fold(self, unit: int) -> "Judge":
        """Split twin ``unit`` one unit again (never split again): its members, in the order, give
        way to it in the place of the first; a config that held every member holds the unit, one
        that held some of them only is dropped (the units of the search cannot say it: each of
        them passed alone, which the unit passing alone implies)."""
        members = self.split[unit]
        split = {u: m for u, m in self.split.items() if u != unit}

        def back(m: int) -> int | None:
            if m & members == members:
                return (m & ~members) | (1 << unit)
            return m if not m & members else None

        order: list[int] = []
        for u in self.order:
            if not (members >> u) & 1:
                order.append(u)
            elif unit not in order:
                order.append(unit)
        kept = {back(m): ev for m, ev in self.configs.items() if back(m) is not None}
        return dataclasses.replace(
            self, split=_frozen(split), order=tuple(order), configs=_frozen(kept),
            resolved=tuple((back(m), k, f) for m, k, f in self.resolved if back(m) is not None),
            other=_frozen({back(m): ts for m, ts in self.other.items() if back(m) is not None}),
            skipped=frozenset(b for b in map(back, self.skipped) if b is not None),
            early=frozenset(b for b in map(back, self.early) if b is not None))

    def expand(self, mask: int) -> int:
        """``mask`` with every split twin replaced by its members."""
        for unit, members in self.split.items():
            if (mask >> unit) & 1:
                mask = (mask & ~(1 << unit)) | members
        return mask

    # -- units and masks ---------------------------------------------------------------------------

    @property
    def n(self) -> int:
        """The search's units (a twin counts once)."""
        return self.size

    @cached_property
    def all(self) -> int:
        """Current: every unit (a split twin as its members)."""
        return self.expand((1 << self.size) - 1)

    @cached_property
    def index(self) -> dict[str, int]:
        return {u: i for i, u in enumerate(self.units)}

    def mask(self, units: Iterable[str]) -> int:
        m = 0
        for u in units:
            m |= 1 << self.index[u]
        return self.expand(m)

    def names(self, mask: int) -> tuple[str, ...]:
        return tuple(self.units[i] for i in bits(mask))

    def fmt(self, mask: int) -> str:
        names = self.names(mask)
        if not names:
            return "the baseline"
        if len(names) <= 4:
            return "{" + ", ".join(names) + "}"
        return "{" + ", ".join(names[:3]) + f", ... ({len(names)} units)" + "}"

    def prefix(self, k: int, seq: Sequence[int], base: int = 0) -> int:
        m = base
        for u in seq[:k]:
            m |= 1 << u
        return self.up(m)

    def up(self, mask: int) -> int:
        """``mask`` with the partners of every unit in it that needs one (never e without p)."""
        if not self.needs:
            return mask
        while True:
            m = mask
            for e, partners in self.needs.items():
                if (m >> e) & 1:
                    m |= partners
            if m == mask:
                return m
            mask = m

    def down(self, mask: int) -> int:
        """``mask`` without every unit whose partner it lacks (a fix never leaves e without p)."""
        if not self.needs:
            return mask
        while True:
            m = mask
            for e, partners in self.needs.items():
                if (m >> e) & 1 and (m & partners) != partners:
                    m &= ~(1 << e)
            if m == mask:
                return m
            mask = m

    def ranked(self, mask: int) -> list[int]:
        """The units of ``mask`` in the search's order (frame order, then the others by index)."""
        pos = {u: i for i, u in enumerate(self.order)}
        return sorted(bits(mask), key=lambda u: (pos.get(u, len(self.units)), u))

    def accepted(self) -> int:
        """Every unit of an accepted term."""
        m = 0
        for t in self.terms:
            m |= t
        return m

    def fix_mask(self, term: int) -> int:
        """Current minus every culprit found so far and ``term`` (and what needs them)."""
        return self.down(self.all & ~(self.accepted() | term))

    # -- the posterior ---------------------------------------------------------------------------

    def belief(self, exclude: int | None = None, extra: int = 0) -> Belief:
        """Belief of the current frame; ``extra``: of the next frame, with ``extra``
        accepted too; ``exclude``: ignoring the observations of that config."""
        obs = self.resolved if exclude is None else [o for o in self.resolved if o[0] != exclude]
        # a unit that needs an accepted culprit never runs without it: whether it breaks the stack
        # too cannot be seen, so it is no suspect (search/dependency.py; the verdict names the pair)
        held = self.accepted() | extra if self.needs else 0
        return Belief(
            frame_units=[u for u in self.order if not (extra >> u) & 1
                         and not (self.up(1 << u) & ~(1 << u) & held)],
            terms=list(self.terms) + ([extra] if extra else []),
            obs=obs,
            prior=self.rules.prior,
            same=[(e, p) for e in self.needs for p in bits(self.up(1 << e) & ~(1 << e))],
        )

    def accepted_conf(self) -> float:
        c = 1.0
        for x in self.term_conf:
            c *= x
        return c

    def assess(self, post: Belief) -> tuple[float, HypClass, float]:
        """(probability of the top class's first hypothesis, the class, verdict confidence).

        The verdict confidence multiplies the confidence of earlier culprits, the
        top hypothesis of this frame, and the probability that there is no further
        independent culprit (judged in the next frame)."""
        p_top, top = post.ranked()[0]
        conf = p_top * self.accepted_conf()
        # current without the term failing another way is another fault's: whether the symptom has a
        # further culprit is asked there, once that fault is found (search/incident.py)
        if top.kind in (SINGLE, PAIR) and not self.another_fault(self.fix_mask(post.term(top))):
            conf *= self.belief(extra=post.term(top)).p_nothing()
        return p_top, top, conf

    # -- what a configuration's trials settle ----------------------------------------------------

    def status(self, mask: int, post: Belief) -> str:
        """untested | other (it failed differently) | fail | pass | weak (a pass too few runs to build on)."""
        ev = self.configs.get(mask)
        if ev is None or ev.resolved == 0:
            return "other" if mask in self.other else "untested"
        if ev.failed:
            return "fail"
        if ev.passes >= self.rules.retest_cap or post.p_bad(mask) <= self.rules.tau:
            return "pass"
        return "weak"

    def failed(self, mask: int) -> bool:
        ev = self.configs.get(mask)
        return ev is not None and ev.failed

    def trial_of(self, mask: int) -> int:
        """The first trial of ``mask`` (0: none)."""
        ev = self.configs.get(mask)
        return ev.trials[0] if ev is not None and ev.trials else 0

    def fix_floor(self, doubt: float | None = None) -> int:
        """Runs that rule out a fault showing in `FIX_RATE` of them, leaving ``doubt`` (the verdict's:
        1 - confidence, unless given)."""
        doubt = 1.0 - self.rules.confidence if doubt is None else doubt
        floor = math.ceil(math.log(doubt) / math.log(1.0 - FIX_RATE))
        return min(self.rules.max_probes, max(self.rules.base_probes, floor))

    def solo_doubt(self, term: int) -> int | None:
        """A member of pair ``term`` whose passes without its partner do not rule out a fault of
        its own showing in `FIX_RATE` of the runs at tau (None: every member's do, or ``term`` is
        no pair). Asked when another culprit is in current (the pair's fix failed the same way, or
        the pair is a later frame's): the intermittency learnt from current's failures may be that
        culprit's, so a few passes of a member do not clear it (issue 39: a 30% culprit passing 3
        runs read as innocent, and an innocent partner named with it)."""
        if term.bit_count() < 2:
            return None
        need = self.fix_floor(self.rules.tau)
        for u in bits(term):
            solo = self.up(1 << u)
            if solo in self.other or solo & term == term:
                continue  # it cannot run without its partner: nothing to learn alone
            passes = sum(ev.passes for m, ev in self.configs.items()
                         if (m >> u) & 1 and (m & term) != term and not ev.failed)
            alone = self.configs.get(solo)
            if passes < need and not (alone is not None and alone.passes >= self.rules.retest_cap):
                return u
        return None

    def solo_request(self, u: int, term: int, post: Belief, why: str) -> TrialRequest:
        """Unit ``u`` of pair ``term`` alone (-1: the pair together, alone), with the runs
        `solo_doubt` asks for; ``why``: what makes the intermittency learnt so far no guide."""
        what = f"does {self.units[u]} break the stack alone" if u >= 0 else \
            f"do {' + '.join(self.names(term))} break the stack together, alone"
        req = self.request(self.up(1 << u if u >= 0 else term), f"confirm: {what}? {why}", post, TrialKind.CONFIRM)
        return dataclasses.replace(req, probes=max(req.probes, self.fix_floor(self.rules.tau)))

    def probes(self, mask: int, post: Belief) -> int:
        """Fewest runs (>= base_probes) after which a pass leaves P(config bad) <= tau. After a
        culprit was accepted, a configuration without it asks about a further culprit whose rate the
        first one taught nothing about: at least the runs that rule out `FIX_RATE` at tau. So does
        current without one unit, under ``require_fix``: its pass is the fix check of that unit when
        it is the culprit, and a fix check rules out a second culprit whatever the first taught."""
        if self.terms and not mask & self.accepted():  # a pass built on: as sure as any (tau)
            return max(self._probes(mask, post), self.fix_floor(self.rules.tau))
        if self.rules.require_fix and self.fix_of_one(mask):
            return max(self._probes(mask, post), self.fix_floor(self.rules.tau))
        return self._probes(mask, post)

    def fix_of_one(self, mask: int) -> bool:
        """Whether ``mask`` is the fix of one unit: current without it and every culprit found."""
        rest = self.all & ~self.accepted() & ~mask
        return rest.bit_count() == 1 and self.fix_mask(rest) == mask

    def _probes(self, mask: int, post: Belief) -> int:
        pb = post.p_bad(mask)
        if pb <= 0:
            return self.rules.base_probes
        if pb >= 1:
            return self.rules.max_probes
        return self.runs_for(pb, post.q_given_bad(mask), post.qs)

    @staticmethod
    def doubt_after(pb: float, qd: Sequence[float], qs: Sequence[float], r: int) -> float:
        """P(config bad | it passed r runs), for a prior pb of bad and the belief qd over q."""
        lucky = sum(p * q**r for q, p in zip(qs, qd))
        return pb * lucky / (pb * lucky + (1 - pb))

    def runs_for(self, pb: float, qd: Sequence[float], qs: Sequence[float]) -> int:
        for r in range(self.rules.base_probes, self.rules.max_probes + 1):
            if self.doubt_after(pb, qd, qs, r) <= self.rules.tau:
                return r
        return self.rules.max_probes

    def pass_runs(self, post: Belief) -> int:
        """Runs after which a pass of a config at even odds of being bad is believable."""
        return self.runs_for(0.5, post.q_given_bad(self.all), post.qs)

    # -- requests --------------------------------------------------------------------------------

    def request(self, mask: int, purpose: str, post: Belief, kind: TrialKind,
                suspects_left: int | None = None) -> TrialRequest:
        return TrialRequest(frozenset(self.names(mask)), self.probes(mask, post), purpose, kind=kind,
                            suspects_left=suspects_left)

    def retest(self, mask: int, post: Belief) -> TrialRequest:
        ev = self.configs[mask]
        return self.request(
            mask, f"retest: {self.fmt(mask)} passed {ev.passes} runs, too few to rule out an intermittent fault", post,
            TrialKind.RETEST)

    def fix_request(self, mask: int, purpose: str, post: Belief) -> TrialRequest:
        """The fix (current minus the culprits) must pass believably on its own, whatever the
        culprits taught about intermittency: a deterministic culprit says nothing about how often a
        second one fails. So it runs at least as many probes as rule out a fault that shows in
        `FIX_RATE` of the runs as surely as any pass built on, at tau (0.7^17 < 0.0025: 17 runs at
        95%; the verdict's own doubt, 9 runs, left 4% of such culprits unnamed), and as
        many as a pass of a config at even odds of being bad needs, given the intermittency learnt
        so far. Probe runs are cheap next to restarts."""
        req = self.request(mask, purpose, post, TrialKind.CONFIRM)
        runs = min(self.rules.max_probes, max(req.probes, self.pass_runs(post), self.fix_floor(self.rules.tau)))
        return dataclasses.replace(req, probes=runs) if runs != req.probes else req

    def bisect(self, post: Belief, length: int, cfg: Callable[[int], int], label: str,
               seq: Sequence[int] = ()) -> int | TrialRequest:
        """Prefix bisection over ``cfg(0) .. cfg(length)``: ``cfg(length)`` failed and
        ``cfg(0)`` passed.  Returns the minimal failing prefix length (an int) once
        settled, else the next request.  Rebuilt from the evidence every time, so a
        re-test that turns a pass into a failure is taken into account. ``seq``: the unit
        each prefix adds (``cfg(k)`` adds ``seq[k - 1]``), for the split point (`_middle`)."""
        hi = length
        for k in range(length, -1, -1):
            if self.status(cfg(k), post) == "fail":
                hi = k
        lo = 0
        for k in range(hi):
            if self.status(cfg(k), post) in ("pass", "weak"):
                lo = k
        while True:
            if hi == 0:
                return 0
            if self.status(cfg(lo), post) == "weak":
                return self.retest(cfg(lo), post)
            if hi - lo <= 1:
                return hi
            mid = self._middle(lo, hi, seq)
            st = self.status(cfg(mid), post)
            if st == "fail":
                hi = mid
            elif st == "pass":
                lo = mid
            elif st == "weak":
                return self.retest(cfg(mid), post)
            else:
                return self.request(cfg(mid), label.format(n=hi - lo), post, TrialKind.BISECT, hi - lo)

    def _middle(self, lo: int, hi: int, seq: Sequence[int]) -> int:
        """Where to split the suspects of prefixes lo+1 .. hi: at the middle, or, with suspicion
        weights, where the suspicion is halved among the splits that leave each side at most
        2^(ceil(log2 n) - 1) suspects. So a wrong hint costs no step: the worst case stays
        ceil(log2 n) steps whatever the weights say."""
        mid = lo + (hi - lo + 1) // 2
        if not self.weights or len(seq) < hi:
            return mid
        cap = 1 << ((hi - lo - 1).bit_length() - 1)  # 2^(ceil(log2 (hi - lo)) - 1)
        w = [self.weights[u] for u in seq[lo:hi]]
        total = sum(w)
        best, best_gap = mid, None
        for m in range(max(lo + 1, hi - cap), min(hi - 1, lo + cap) + 1):
            gap = abs(2 * sum(w[:m - lo]) - total)
            if best_gap is None or gap < best_gap - 1e-12 or (abs(gap - best_gap) <= 1e-12 and m == mid):
                best, best_gap = m, gap
        return best

    def confirm(self, post: Belief, term: int, need_surprise: bool = False) -> TrialRequest | None:
        """Check the claim about ``term`` most likely to be overturned: that it breaks
        the stack alone (without the other deltas), or that current without it passes."""
        names = self.names(term)
        cands: list[tuple[float, int, str]] = []
        alone = self.up(term)  # with the partners it needs to start (search/dependency.py)
        if self.status(alone, post) in ("untested", "weak"):
            surprise = 1.0 - post.p_bad(alone)
            what = (f"does {names[0]} break the stack alone?" if len(names) == 1
                    else f"do {' + '.join(names)} break the stack together, alone?")
            if alone != term:
                what = what[:-1] + f" (with {', '.join(self.names(alone & ~term))}, which it needs)?"
            cands.append((surprise, alone, "confirm: " + what))
        vf = self.fix_mask(term)
        if self.status(vf, post) in ("untested", "weak"):
            surprise = self.belief(extra=term).p_bad(vf)
            cands.append((surprise, vf, f"confirm: current without {', '.join(self.names(self.accepted() | term))} "
                                        "(the fix) must pass"))
        if need_surprise:
            cands = [c for c in cands if c[0] > 1e-6]
        if not cands:
            return None
        cands.sort(key=lambda c: -c[0])  # stable: "alone" first on ties
        if cands[0][1] == vf:
            return self.fix_request(vf, cands[0][2], post)
        return self.request(cands[0][1], cands[0][2], post, TrialKind.CONFIRM)


__all__ = ["ConfigEvidence", "Judge", "Rules"]
