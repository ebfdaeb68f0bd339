"""The bisection search: a pure state machine over trial outcomes.

No I/O, no clock, no randomness.  A :class:`Search` is told what happened
(:meth:`Search.observe`) and says what to do next (:meth:`Search.next`): either
a :class:`TrialRequest` (apply the baseline plus these units, restart every
service once, run the probe up to ``probes`` times, stop at the first failure)
or a :class:`Verdict`.

Model (see docs/search.md for the user-facing description):

* A *unit* is an opaque id for one delta (or a group of linked deltas) since the
  known-good baseline.  A *config* is the set of units applied on top of the
  baseline.
* Failure is monotone in the config and described by a set of *terms*: the
  config is bad iff it contains every unit of at least one term.  Within a
  *frame* the hypotheses are: one culprit ``{x}``; an interaction ``{x, y}`` (bad
  only with both); "not the config" (every config, the baseline included, is
  bad); and "no fault".  Several independent culprits are found one frame after
  the other: once a term is accepted and current-minus-the-terms still fails, a
  new frame keeps the accepted terms and looks for one more.  Whether there is
  one more is itself judged by the next frame's belief ("no more" against "one
  more", with prior odds ``Prior.multiple``).
* Noise is one-sided: a bad config passes one probe run with unknown
  probability ``q`` (intermittent fault), a good config never fails.  The belief
  is kept over hypotheses x a small grid of ``q`` values and updated exactly.
* The configs to test come from a structured prefix bisection (explainable, it
  proves each blamed unit is needed).  The posterior decides when to stop, how
  many probe runs a trial needs, when a pass is too weak to build on (re-test),
  and which check to run when the structure alone does not settle the question.
* When the posterior is confident but a claim rests on the prior (e.g. the
  culprit was never tested alone) and one more restart stays within
  :func:`restart_bound`, that restart is spent to observe the claim.

Restarts are the expensive unit; probe runs are cheap.  :func:`restart_bound`
is the promise for deterministic faults (premise checks included);
docs/search.md explains it, and why seeing a culprit fail alone and seeing the
fix pass are the restarts that separate a verdict from a guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Sequence

from .outcome import Outcome

__all__ = [
    "Outcome",
    "Observation",
    "TrialRequest",
    "Verdict",
    "Prior",
    "Policy",
    "POLICIES",
    "Hypothesis",
    "Search",
    "restart_bound",
]


# --------------------------------------------------------------------------- public types


@dataclass(frozen=True)
class Observation:
    """What happened in one trial (normally one co-restart of all services).

    ``passes`` counts the probe runs that passed; ``failures`` the runs that failed
    (runs normally stop at the first failure, so it is 0 or 1, but a request with
    ``stop_after > 1`` keeps probing a failing config to learn how often it fails).
    ``failed=True`` alone means one failure.  A service that died at start because
    of the config is a failure with ``passes=0``.  ``unresolved`` marks a trial that
    produced no evidence at all; ``passes`` and ``failures`` are then ignored.
    ``free`` marks an observation that cost no restart: the running stack probed as
    it was, because every process verifiably runs the current files.
    """

    config: frozenset[str]
    passes: int = 0
    failed: bool = False
    unresolved: bool = False
    failures: int = 0
    free: bool = False

    def __post_init__(self) -> None:
        if self.failed and self.failures == 0:
            object.__setattr__(self, "failures", 1)
        if self.failures > 0 and not self.failed:
            object.__setattr__(self, "failed", True)

    @property
    def outcome(self) -> Outcome:
        if self.unresolved:
            return Outcome.UNRESOLVED
        return Outcome.FAIL if self.failed else Outcome.PASS

    @classmethod
    def of(cls, config: Iterable[str], outcome: Outcome, passes: int = 0) -> "Observation":
        """Build an observation from an :class:`Outcome` (``passes``: runs passed before the end)."""
        return cls(
            frozenset(config),
            passes=passes,
            failed=outcome.failed,
            unresolved=outcome is Outcome.UNRESOLVED,
        )


class TrialKind(str, Enum):
    """What a trial is for. The search decides it; the runner, the ETA and the report read it
    (never the purpose text, which is for people)."""

    PREMISE_CURRENT = "premise-current"  # current (all deltas) must fail
    PREMISE_BASELINE = "premise-baseline"  # baseline (no deltas) must pass
    BISECT = "bisect"
    RETEST = "retest"  # a pass too weak to build on, probed again
    CONFIRM = "confirm"  # a claim of the verdict observed: alone, the fix, after a co-restart
    CHECK = "check"  # the most informative trial when the structured steps are spent
    RETRY = "retry"  # the last trial was unresolved
    REFINE = "refine"  # a member of an auto-linked unit tested apart (bisect.py)
    FINAL = "final"  # --leave fixed: current minus the culprits (bisect.py)


@dataclass(frozen=True)
class TrialRequest:
    """Apply the baseline plus ``config``, co-restart, run the probe at most ``probes``
    times in that started configuration, stop after ``stop_after`` failed runs.

    ``free``: the caller may answer it without a restart when the running stack
    verifiably runs exactly this config (then report ``Observation(free=True)``)."""

    config: frozenset[str]
    probes: int
    purpose: str
    stop_after: int = 1  # failed runs after which probing stops (>1: learn the failure rate)
    free: bool = False  # may be answered by probing the running stack without a restart
    kind: TrialKind = TrialKind.CHECK
    suspects_left: int | None = None  # bisect: units still suspected in this bisection


@dataclass(frozen=True)
class Verdict:
    """Final answer.

    ``kind`` is one of ``"culprit"`` (each unit of ``culprits`` breaks the stack on
    its own; all must be reverted), ``"interaction"`` (the units of a term fail
    only together; ``terms`` gives the exact structure), ``"not-config"`` (the
    baseline fails too: no delta is to blame), ``"not-reproduced"`` (the current
    config passed) or ``"inconclusive"`` (budget exhausted or infrastructure
    trouble before reaching ``confidence``; see ``suspects``).
    """

    kind: str
    culprits: tuple[str, ...]
    confidence: float
    suspects: tuple[tuple[str, float], ...]
    explanation: str
    terms: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class Hypothesis:
    """One hypothesis of the posterior, for reports (see :meth:`Search.hypotheses`)."""

    kind: str  # "culprit" | "interaction" | "not-config" | "no-fault"
    terms: tuple[tuple[str, ...], ...]
    probability: float


@dataclass(frozen=True)
class Prior:
    """Prior belief over the cause of the failure.

    ``single``: mass of "one unit breaks the stack on its own" (spread evenly over
    the units).  ``interaction``: mass of "two units break it only together"
    (spread evenly over the pairs).  ``multiple``: odds of "one more independent
    culprit" against "no more", applied each time a culprit is found (so two
    independent culprits are ``multiple`` times as likely as one).  ``not_config``
    and ``no_fault``: masses of "the deltas are not the cause" and "nothing is
    broken"; both are settled by the premise checks.

    The default says a single culprit is 60 times as likely as an interaction and
    as two independent culprits.  That is what lets the search claim a single
    culprit without spending a restart to test it alone (policy ``fast``; see
    docs/search.md); the verdict then says the claim was inferred, not observed.  :meth:`cautious` makes interactions and
    second culprits as likely as single ones: every claim is then checked (one or
    two more restarts) and interactions and second culprits are always found.

    ``q`` is the grid of per-run pass probabilities of a bad config, with prior
    weights; ``q = 0`` is a deterministic fault.
    """

    single: float = 1.0
    interaction: float = 1.0 / 60.0
    multiple: float = 1.0 / 60.0
    not_config: float = 0.05
    no_fault: float = 0.02
    later_interaction: float | None = None  # interaction mass for a further culprit (None: ``interaction``)
    q: tuple[tuple[float, float], ...] = ((0.0, 0.9), (0.2, 0.05), (0.4, 0.03), (0.6, 0.015), (0.8, 0.005))

    def __post_init__(self) -> None:
        for name in ("single", "interaction", "multiple", "not_config", "no_fault"):
            if getattr(self, name) < 0:
                raise ValueError(f"Prior.{name} must be >= 0")
        if self.single <= 0:
            raise ValueError("Prior.single must be > 0")
        if not self.q or any(not (0.0 <= q < 1.0) or w < 0 for q, w in self.q):
            raise ValueError("Prior.q must be (q, weight) pairs with 0 <= q < 1, weight >= 0")
        if sum(w for _, w in self.q) <= 0:
            raise ValueError("Prior.q weights must not all be 0")

    @classmethod
    def cautious(cls) -> "Prior":
        """Interactions and second culprits are considered likely enough that every
        culprit is tested alone and the fix (current minus culprits) is checked."""
        return cls(interaction=1.0, multiple=1.0)


@dataclass(frozen=True)
class Policy:
    """How much of a verdict must be observed rather than inferred (``envbisect bisect --policy``)."""

    prior: Prior
    require_fix: bool  # "these are all the culprits" only once current-minus-culprits passed

    def search(self, units: Sequence[str], **kw) -> "Search":
        return Search(units, prior=self.prior, require_fix=self.require_fix, **kw)


POLICIES: dict[str, Policy] = {
    # a culprit is seen failing alone (so an interaction is never called a single culprit) and the
    # fix is seen passing (so a second independent culprit is never inferred away)
    "confirm": Policy(Prior(interaction=1.0, multiple=1.0 / 60.0, later_interaction=1.0 / 60.0), require_fix=True),
    # trust the prior: fewest restarts; interactions and second culprits are inferred unlikely
    "fast": Policy(Prior(), require_fix=False),
    # interactions and second culprits as likely as a single culprit: every claim checked
    "thorough": Policy(Prior.cautious(), require_fix=True),
}


def restart_bound(n: int, kind: str = "culprit") -> int:
    """Restarts (premise checks included) promised for a deterministic fault among ``n`` units.

    ``"culprit"``: ``ceil(log2 n) + 3``; ``"interaction"``: ``2 * ceil(log2 n) + 3``;
    ``"several"`` (two independent culprits): ``2 * ceil(log2 n) + 4``.  The premise checks
    are included; the first (current must fail) is free when the running stack verifiably
    runs its files, else each bound is one more.
    """
    k = math.ceil(math.log2(n)) if n > 1 else 0
    if kind == "culprit":
        return k + 3
    if kind == "interaction":
        return 2 * k + 3
    if kind == "several":
        return 2 * k + 4
    raise ValueError(f"unknown kind {kind!r}")


# --------------------------------------------------------------------------- belief

_NONE, _NOTHING, _S, _AND = range(4)


def _bits(mask: int) -> Iterable[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class _Belief:
    """Exact posterior over (hypothesis, q) for one frame, computed from scratch.

    A frame has accepted terms ``terms`` (culprits found earlier, part of every
    hypothesis) and looks for at most one more term among ``frame_units``: none,
    one unit, or a pair that fails only together.  Frame 0 (no accepted terms)
    also has "not the config" (every config bad) and "no fault".

    Units that were in exactly the same observed configs form an *atom*;
    hypotheses that differ only by swapping units within atoms have the same
    likelihood and are handled as one class with a multiplicity.  That keeps the
    cost at O(atoms^2 x observations) while staying exact.
    """

    def __init__(
        self,
        *,
        frame_units: Sequence[int],
        terms: Sequence[int],
        obs: Sequence[tuple[int, int, int]],  # (config, passes, failures)
        prior: Prior,
    ) -> None:
        qw = [w for _, w in prior.q]
        tot = sum(qw)
        self.qs = [q for q, _ in prior.q]
        self.pq = [w / tot for w in qw]
        self.terms = list(terms)
        frame0 = not self.terms
        nobs = len(obs)
        ks = [k for _, k, _ in obs]
        fs = [f for _, _, f in obs]
        failed_vec = 0
        ebad = 0
        for i, (c, _, f) in enumerate(obs):
            if f:
                failed_vec |= 1 << i
            if any(t & c == t for t in self.terms):
                ebad |= 1 << i
        groups: dict[int, list[int]] = {}
        for u in frame_units:
            bit = 1 << u
            sig = 0
            for i, (c, _, _) in enumerate(obs):
                if c & bit:
                    sig |= 1 << i
            groups.setdefault(sig, []).append(u)
        self.atoms: list[tuple[int, int, int, list[int]]] = []  # (signature, mask, size, members)
        for sig, members in groups.items():
            m = 0
            for u in members:
                m |= 1 << u
            self.atoms.append((sig, m, len(members), members))
        v = len(frame_units)
        pairs = v * (v - 1) // 2
        cache: dict[int, list[float] | None] = {}

        def weights(bad: int) -> list[float] | None:
            if bad in cache:
                return cache[bad]
            if failed_vec & ~bad:  # a good config never fails
                cache[bad] = None
                return None
            s = f = 0
            for i in _bits(bad):
                s += ks[i]
                f += fs[i]
            w = [p * (q**s) * ((1.0 - q) ** f) for q, p in zip(self.qs, self.pq)]
            cache[bad] = w
            return w

        # class: (kind, atom a, atom b, multiplicity, q-vector of posterior mass, mass)
        self.classes: list[tuple[int, int, int, float, list[float], float]] = []

        def add(kind: int, a: int, b: int, mult: float, each: float, ext_bad: int) -> None:
            if mult <= 0 or each <= 0:
                return
            w = weights(ebad | ext_bad)
            if w is None:
                return
            scale = mult * each
            qv = [scale * x for x in w]
            mass = sum(qv)
            if mass > 0:
                self.classes.append((kind, a, b, mult, qv, mass))

        if frame0:
            p_nothing, p_single, p_pair = prior.no_fault, prior.single, prior.interaction
            add(_NONE, -1, -1, 1, prior.not_config, (1 << nobs) - 1)
        else:  # one more culprit, or none
            p_nothing, p_single = prior.single, prior.multiple
            inter = prior.interaction if prior.later_interaction is None else prior.later_interaction
            p_pair = prior.multiple * inter / prior.single
        add(_NOTHING, -1, -1, 1, p_nothing, 0)
        if v:
            for ai, (sig, _, size, _) in enumerate(self.atoms):
                add(_S, ai, -1, size, p_single / v, sig)
        if pairs:
            each = p_pair / pairs
            na = len(self.atoms)
            for ai in range(na):
                sa, _, za, _ = self.atoms[ai]
                add(_AND, ai, ai, za * (za - 1) / 2, each, sa)
                for bi in range(ai + 1, na):
                    sb, _, zb, _ = self.atoms[bi]
                    add(_AND, ai, bi, za * zb, each, sa & sb)
        self.z = sum(c[5] for c in self.classes)

    # -- predictions ------------------------------------------------------------

    def _frac(self, cls: tuple, mask: int) -> float:
        """Fraction of the class's unit-level hypotheses under which ``mask`` is bad."""
        kind, a, b = cls[0], cls[1], cls[2]
        if kind == _NONE or any(t & mask == t for t in self.terms):
            return 1.0
        if kind == _NOTHING:
            return 0.0
        _, am, za, _ = self.atoms[a]
        ca = (mask & am).bit_count()
        if kind == _S:
            return ca / za
        if a == b:
            return ca * (ca - 1) / (za * (za - 1))
        _, bm, zb, _ = self.atoms[b]
        return (ca / za) * ((mask & bm).bit_count() / zb)

    def p_bad(self, mask: int) -> float:
        if self.z <= 0:
            return 0.5
        return sum(c[5] * self._frac(c, mask) for c in self.classes) / self.z

    def q_given_bad(self, mask: int) -> list[float]:
        acc = [0.0] * len(self.qs)
        for c in self.classes:
            f = self._frac(c, mask)
            if f:
                for j, x in enumerate(c[4]):
                    acc[j] += f * x
        s = sum(acc)
        return [x / s for x in acc] if s > 0 else list(self.pq)

    def q_belief(self) -> list[float]:
        acc = [0.0] * len(self.qs)
        for c in self.classes:
            for j, x in enumerate(c[4]):
                acc[j] += x
        s = sum(acc)
        return [x / s for x in acc] if s > 0 else list(self.pq)

    def eig(self, mask: int, runs: int) -> float:
        """Expected information gain (nats) about the unit-level hypothesis from one
        trial of ``mask`` with at most ``runs`` probe runs (outcome: a failure, or all pass)."""
        if self.z <= 0:
            return 0.0
        parts0: list[tuple[float, float]] = []
        fail: list[tuple[float, float]] = []
        pas: list[tuple[float, float]] = []
        for c in self.classes:
            mult, qv, mass = c[3], c[4], c[5]
            parts0.append((mass, mult))
            f = self._frac(c, mask)
            if f > 0:
                phi = sum(x * (1.0 - q**runs) for q, x in zip(self.qs, qv)) / mass
                fail.append((mass * f * phi, mult * f))
                pas.append((mass * f * (1.0 - phi), mult * f))
            if f < 1:
                pas.append((mass * (1.0 - f), mult * (1.0 - f)))

        def ent(parts: list[tuple[float, float]]) -> tuple[float, float]:
            tot = sum(m for m, _ in parts)
            h = 0.0
            if tot > 0:
                for m, k in parts:
                    if m > 0 and k > 0:
                        p = m / tot
                        h -= p * math.log(p / k)
            return h, tot

        h0, _ = ent(parts0)
        hf, tf = ent(fail)
        hp, tp = ent(pas)
        return max(0.0, h0 - (tf / self.z) * hf - (tp / self.z) * hp)

    # -- hypotheses -------------------------------------------------------------

    def ranked(self) -> list[tuple[float, tuple]]:
        """Classes ranked by the probability of one of their unit-level hypotheses."""
        if self.z <= 0:
            return []
        out = [(c[5] / self.z / c[3], c) for c in self.classes]
        out.sort(key=lambda t: -t[0])
        return out

    def p_nothing(self) -> float:
        if self.z <= 0:
            return 0.0
        return sum(c[5] for c in self.classes if c[0] == _NOTHING) / self.z

    def term(self, cls: tuple) -> int:
        """The new term (mask) of the first unit-level hypothesis of a class (0 if none)."""
        kind, a, b = cls[0], cls[1], cls[2]
        if kind in (_NONE, _NOTHING):
            return 0
        ma = self.atoms[a][3]
        if kind == _S:
            return 1 << ma[0]
        y = ma[1] if a == b else self.atoms[b][3][0]
        return (1 << ma[0]) | (1 << y)

    def expand(self, cls: tuple, limit: int) -> list[int]:
        """Up to ``limit`` new terms of the unit-level hypotheses of a class."""
        kind, a, b = cls[0], cls[1], cls[2]
        if kind in (_NONE, _NOTHING):
            return [0]
        ma = self.atoms[a][3]
        if kind == _S:
            return [1 << u for u in ma[:limit]]
        out: list[int] = []
        mb = self.atoms[b][3]
        for i, x in enumerate(ma):
            for y in ma[i + 1 :] if a == b else mb:
                if len(out) >= limit:
                    return out
                out.append((1 << x) | (1 << y))
        return out

    def marginals(self) -> dict[int, float]:
        out: dict[int, float] = {}
        if self.z <= 0:
            return out
        for kind, a, b, _, _, mass in self.classes:
            if kind in (_NONE, _NOTHING):
                continue
            p = mass / self.z
            za = self.atoms[a][2]
            if kind == _S:
                share = {a: p / za}
            elif a == b:
                share = {a: 2 * p / za}
            else:
                share = {a: p / za, b: p / self.atoms[b][2]}
            for ai, x in share.items():
                for u in self.atoms[ai][3]:
                    out[u] = out.get(u, 0.0) + x
        return out

    def p_has_term(self, term: int) -> float:
        """Posterior probability that ``term`` is the frame's new term."""
        if self.z <= 0:
            return 0.0
        tot = 0.0
        units = list(_bits(term))
        for kind, a, b, _, _, mass in self.classes:
            if kind not in (_S, _AND):
                continue
            ma, za = self.atoms[a][1], self.atoms[a][2]
            if kind == _S and len(units) == 1 and term & ma:
                tot += mass / za
            elif kind == _AND and len(units) == 2:
                x, y = (1 << units[0]), (1 << units[1])
                if a == b:
                    if x & ma and y & ma:
                        tot += mass / (za * (za - 1) / 2)
                else:
                    mb, zb = self.atoms[b][1], self.atoms[b][2]
                    if (x & ma and y & mb) or (y & ma and x & mb):
                        tot += mass / (za * zb)
        return tot / self.z


# --------------------------------------------------------------------------- search


@dataclass
class _Evidence:
    passes: int = 0
    failed: bool = False
    resolved: int = 0
    restarted_fail: bool = False  # a failure seen after a co-restart (not only on the running stack)
    restarted_passes: int = 0
    trials: list[int] = field(default_factory=list)  # 1-based trial numbers, for "observed in trial N"
    failed_trials: list[int] = field(default_factory=list)
    passed_trials: list[int] = field(default_factory=list)  # trials of this config with no failed run


class Search:
    """Bisect ``units`` (deltas since the baseline) on live hosts.

    >>> s = Search(["A", "B"])
    >>> s.next().purpose
    'premise: current must fail'

    ``confidence``: posterior probability the verdict must reach.  ``max_trials``:
    restart budget (premise checks and unresolved trials included); when it runs
    out below ``confidence`` the verdict is ``inconclusive``.
    ``base_probes``/``max_probes``: probe runs per trial for a deterministic fault,
    and the cap for intermittent ones.  The premise checks always use
    ``max_probes`` (a failing config stops at its first failed run, so this is
    cheap when the fault is deterministic).
    """

    _AGAIN = object()

    def __init__(
        self,
        units: Sequence[str],
        *,
        confidence: float = 0.95,
        max_trials: int | None = None,
        base_probes: int = 3,
        max_probes: int = 40,
        prior: Prior | None = None,
        require_fix: bool = False,
        premise_probes: int = 12,
        premise_failures: int = 5,
    ) -> None:
        units = tuple(units)
        if len(set(units)) != len(units):
            raise ValueError("units must be unique")
        if not 0.5 <= confidence < 1.0:
            raise ValueError("confidence must be in [0.5, 1)")
        if base_probes < 1 or max_probes < base_probes:
            raise ValueError("need 1 <= base_probes <= max_probes")
        if premise_failures < 1:
            raise ValueError("premise_failures must be >= 1")
        if max_trials is not None and max_trials < 1:
            raise ValueError("max_trials must be >= 1")
        self._units = units
        self._index = {u: i for i, u in enumerate(units)}
        self._n = len(units)
        self._all = (1 << self._n) - 1
        self.confidence = confidence
        self.max_trials = max_trials
        self.base_probes = base_probes
        self.max_probes = max_probes
        self.prior = prior or Prior()
        self.require_fix = require_fix
        self.premise_probes = min(max(premise_probes, base_probes), max_probes)
        self.premise_failures = premise_failures
        # Doubt accepted for one pass before building on it.  A bisection builds on about
        # log2(n) passes, and a verdict resting on one lucky pass blames an innocent delta, so
        # each pass must be much surer than the verdict as a whole.
        self._tau = (1.0 - confidence) / 20.0
        self._retest_cap = 3 * max_probes  # passes of one config beyond which it is not re-tested
        self._obs: list[Observation] = []
        self._resolved: list[tuple[int, int, int]] = []
        self._evidence: dict[int, _Evidence] = {}
        self._terms: list[int] = []  # accepted terms (masks), one per closed frame
        self._term_conf: list[float] = []
        self._order: list[int] = list(range(self._n))  # units of the current frame, in bisection order
        self._stage: tuple = ("A",)
        self._last_request: TrialRequest | None = None
        self._pending: TrialRequest | Verdict = self._decide()
        if isinstance(self._pending, TrialRequest):
            self._last_request = self._pending

    # -- public API -------------------------------------------------------------

    @property
    def units(self) -> tuple[str, ...]:
        return self._units

    @property
    def trials(self) -> int:
        """Restarts consumed so far (resolved and unresolved; a free probe of the running stack is none)."""
        return sum(1 for o in self._obs if not o.free)

    @property
    def observations(self) -> tuple[Observation, ...]:
        return tuple(self._obs)

    def next(self) -> TrialRequest | Verdict:
        """What to do next.  Pure: the same answer until the next :meth:`observe`."""
        return self._pending

    def observe(self, obs: Observation) -> None:
        """Record the outcome of one trial (normally of the request from :meth:`next`)."""
        if isinstance(self._pending, Verdict):
            raise RuntimeError("the search is finished; no more observations expected")
        unknown = [u for u in obs.config if u not in self._index]
        if unknown:
            raise ValueError(f"unknown units in observation: {sorted(unknown)}")
        if obs.passes < 0:
            raise ValueError("passes must be >= 0")
        if not obs.unresolved and not obs.failed and obs.passes == 0:
            raise ValueError("a passing observation needs at least one passed probe run")
        self._obs.append(obs)
        if not obs.unresolved:
            mask = self._mask(obs.config)
            self._resolved.append((mask, obs.passes, obs.failures))
            ev = self._evidence.setdefault(mask, _Evidence())
            ev.passes += obs.passes
            ev.failed = ev.failed or obs.failed
            ev.restarted_fail = ev.restarted_fail or (obs.failed and not obs.free)
            ev.restarted_passes += 0 if obs.free else obs.passes
            ev.resolved += 1
            ev.trials.append(len(self._obs))
            (ev.failed_trials if obs.failed else ev.passed_trials).append(len(self._obs))
        self._pending = self._decide()
        if isinstance(self._pending, TrialRequest):
            self._last_request = self._pending

    def marginals(self) -> dict[str, float]:
        """Posterior probability that each unit is part of the cause (units found in
        earlier rounds carry the confidence they were accepted with)."""
        return dict(self._marginals(self._belief()))

    def hypotheses(self, limit: int = 10) -> tuple[Hypothesis, ...]:
        """The most probable hypotheses (unit level), most probable first."""
        post = self._belief()
        conf = self._accepted_conf()
        out: list[Hypothesis] = []
        for p, cls in post.ranked():
            for t in post.expand(cls, limit - len(out)):
                out.append(self._hypothesis(cls[0], self._terms + ([t] if t else []), p * conf))
            if len(out) >= limit:
                break
        return tuple(out)

    def pass_runs(self) -> int:
        """Probe runs after which a pass of a config that may well be bad (even odds) is
        believable, given what the search has learnt of the fault's intermittency."""
        post = self._belief()
        return self._runs_for(0.5, post.q_given_bad(self._all), post.qs)

    def q_belief(self) -> dict[float, float]:
        """Posterior over q, the probability that a bad config passes one probe run."""
        post = self._belief()
        return dict(zip(post.qs, post.q_belief()))

    # -- helpers ----------------------------------------------------------------

    def _mask(self, units: Iterable[str]) -> int:
        m = 0
        for u in units:
            m |= 1 << self._index[u]
        return m

    def _names(self, mask: int) -> tuple[str, ...]:
        return tuple(self._units[i] for i in _bits(mask))

    def _fmt(self, mask: int) -> str:
        names = self._names(mask)
        if not names:
            return "the baseline"
        if len(names) <= 4:
            return "{" + ", ".join(names) + "}"
        return "{" + ", ".join(names[:3]) + f", ... ({len(names)} units)" + "}"

    def _prefix(self, k: int, seq: Sequence[int], base: int = 0) -> int:
        m = base
        for u in seq[:k]:
            m |= 1 << u
        return m

    def _belief(self, exclude: int | None = None, extra: int = 0) -> _Belief:
        """Belief of the current frame; ``extra``: of the next frame, with ``extra``
        accepted too; ``exclude``: ignoring the observations of that config."""
        obs = self._resolved if exclude is None else [o for o in self._resolved if o[0] != exclude]
        return _Belief(
            frame_units=[u for u in self._order if not (extra >> u) & 1],
            terms=self._terms + ([extra] if extra else []),
            obs=obs,
            prior=self.prior,
        )

    def _accepted_conf(self) -> float:
        c = 1.0
        for x in self._term_conf:
            c *= x
        return c

    def _vars(self) -> int:
        m = 0
        for t in self._terms:
            m |= t
        return m

    def _fix_mask(self, term: int) -> int:
        """Current minus every culprit found so far and ``term``."""
        return self._all & ~(self._vars() | term)

    def _status(self, mask: int, post: _Belief) -> str:
        ev = self._evidence.get(mask)
        if ev is None or ev.resolved == 0:
            return "untested"
        if ev.failed:
            return "fail"
        if ev.passes >= self._retest_cap or post.p_bad(mask) <= self._tau:
            return "pass"
        return "weak"

    def _probes(self, mask: int, post: _Belief) -> int:
        """Fewest runs (>= base_probes) after which a pass leaves P(config bad) <= tau."""
        pb = post.p_bad(mask)
        if pb <= 0:
            return self.base_probes
        if pb >= 1:
            return self.max_probes
        return self._runs_for(pb, post.q_given_bad(mask), post.qs)

    def _runs_for(self, pb: float, qd: Sequence[float], qs: Sequence[float]) -> int:
        for r in range(self.base_probes, self.max_probes + 1):
            lucky = sum(p * q**r for q, p in zip(qs, qd))
            if pb * lucky / (pb * lucky + (1 - pb)) <= self._tau:
                return r
        return self.max_probes

    def _request(self, mask: int, purpose: str, post: _Belief, kind: TrialKind,
                 suspects_left: int | None = None) -> TrialRequest:
        return TrialRequest(frozenset(self._names(mask)), self._probes(mask, post), purpose, kind=kind,
                            suspects_left=suspects_left)

    def _retest(self, mask: int, post: _Belief) -> TrialRequest:
        ev = self._evidence[mask]
        return self._request(
            mask, f"retest: {self._fmt(mask)} passed {ev.passes} runs, too few to rule out an intermittent fault", post,
            TrialKind.RETEST)

    def _assess(self, post: _Belief) -> tuple[float, tuple, float]:
        """(probability of the top class's first hypothesis, the class, verdict confidence).

        The verdict confidence multiplies the confidence of earlier culprits, the
        top hypothesis of this frame, and the probability that there is no further
        independent culprit (judged in the next frame)."""
        p_top, top = post.ranked()[0]
        conf = p_top * self._accepted_conf()
        if top[0] in (_S, _AND):
            conf *= self._belief(extra=post.term(top)).p_nothing()
        return p_top, top, conf

    # -- the state machine ---------------------------------------------------------

    def _decide(self) -> TrialRequest | Verdict:
        # 1. an unresolved trial is retried once, then the search gives up
        if self._obs and self._obs[-1].unresolved and self._last_request is not None:
            last = self._last_request
            streak = 0
            for o in reversed(self._obs):
                if not (o.unresolved and o.config == last.config):
                    break
                streak += 1
            if streak >= 2:
                return self._final("infrastructure")
            if streak == 1:
                if self.max_trials is not None and self.trials >= self.max_trials:
                    return self._final("budget")
                purpose = last.purpose
                if last.kind is not TrialKind.RETRY:
                    purpose = "retry (last trial unresolved): " + purpose
                return TrialRequest(last.config, last.probes, purpose, kind=TrialKind.RETRY)
        if self.max_trials is not None and self.trials >= self.max_trials:
            return self._final("budget")
        # 2. premise checks
        cur = self._evidence.get(self._all)
        if cur is None:
            # Probing a failing config past its first failure is cheap and measures how often it
            # fails: the estimate of q every later pass is judged by.
            what = "current (no deltas: the baseline)" if self._n == 0 else "current"
            return TrialRequest(frozenset(self._units), self.premise_probes, f"premise: {what} must fail",
                                stop_after=self.premise_failures, free=True, kind=TrialKind.PREMISE_CURRENT)
        if not cur.failed or (not cur.restarted_fail and cur.restarted_passes >= self.premise_probes):
            return self._not_reproduced()
        if self._n == 0:
            if not cur.restarted_fail:
                # the running stack failed as it ran; a co-restart may clear it (a service restarted
                # alone holds more than its files), so "not the config" needs a failure after one
                return TrialRequest(frozenset(), self.premise_probes,
                                    "confirm after a co-restart: current (no deltas: the baseline) failed as it "
                                    "was running", stop_after=self.premise_failures, kind=TrialKind.CONFIRM)
            return self._not_config()
        base = self._evidence.get(0)
        if base is None:
            post = self._belief()
            runs = max(self.premise_probes, self._runs_for(0.5, post.q_given_bad(self._all), post.qs))
            return TrialRequest(frozenset(), runs, "premise: baseline must pass", kind=TrialKind.PREMISE_BASELINE)
        if base.failed:
            return self._not_config()
        # 3. structured search, stopped by the posterior
        for _ in range(4 * self._n + 16):
            if self._transition():
                continue
            post = self._belief()
            if post.z <= 0:
                return self._final("contradiction")
            if self._settle(post):
                continue
            p_top, top, conf = self._assess(post)
            if conf >= self.confidence:
                fluke = self._fluke_check(post, top)
                if fluke == "contradiction":
                    return self._final("contradiction")
                if fluke is not None:
                    return fluke  # type: ignore[return-value]
                fix = self._fix_observed(post, top) or self._restart_proof(post, top)
                if fix is not None:
                    return fix
                spare = self._spare_check(post, top)
                return spare if spare is not None else self._verdict(post, top, conf)
            step = self._stage_step(post)
            if step is self._AGAIN:
                continue
            if step is None:
                step = self._fallback(post)
            if step is None:
                return self._final("exhausted")
            return step  # type: ignore[return-value]
        return self._final("exhausted")  # pragma: no cover - defensive

    def _new_frame(self, term: int, fix: int) -> None:
        # How sure we are that ``term`` is a culprit.  The frame cannot express
        # "this term plus another culprit", so this is judged on the evidence from
        # before the failed fix check.
        conf = self._belief(exclude=fix).p_has_term(term)
        self._terms.append(term)
        self._term_conf.append(min(1.0, conf))
        self._order = [u for u in self._order if not (term >> u) & 1]
        self._stage = ("A",) if self._order else ("X",)

    def _failed(self, mask: int) -> bool:
        ev = self._evidence.get(mask)
        return ev is not None and ev.failed

    def _transition(self) -> bool:
        """Apply a stage transition that an observed failure settles.  Runs before the
        posterior is judged: after a failed fix check the frame must change first."""
        kind = self._stage[0]
        if kind == "B":
            x = self._order[self._stage[1]]
            va, vf = 1 << x, self._fix_mask(1 << x)
            if self._failed(va):
                self._stage = ("D", va)
                return True
            if self._failed(vf):
                self._new_frame(va, vf)
                return True
        elif kind == "D":
            term = self._stage[1]
            vf = self._fix_mask(term)
            if self._failed(vf):
                self._new_frame(term, vf)
                return True
        return False

    def _settle(self, post: _Belief) -> bool:
        """Apply a stage transition the evidence settles given the posterior (a bisection
        that has converged, a unit that passed alone)."""
        kind = self._stage[0]
        if kind in ("A", "C"):
            return self._stage_step(post) is self._AGAIN
        if kind == "B":
            x = self._order[self._stage[1]]
            if self._status(1 << x, post) == "pass":
                self._stage = ("C", self._stage[1])
                return True
        return False

    def _fluke_check(self, post: _Belief, top: tuple) -> TrialRequest | str | None:
        """Before concluding: if the leading hypothesis needs an observed pass to have
        been luck (a bad config passing every run), re-test that config first."""
        if top[0] == _NOTHING and not self._terms:
            return None
        t = post.term(top)
        terms = self._terms + ([t] if t else [])
        worst: tuple[int, int] | None = None
        for mask, ev in self._evidence.items():
            if ev.failed or not (top[0] == _NONE or any(tt & mask == tt for tt in terms)):
                continue
            if ev.passes >= self._retest_cap:
                return "contradiction"  # it would need a bad config to pass this many runs
            if worst is None or ev.passes < worst[1]:
                worst = (mask, ev.passes)
        if worst is None:
            return None
        mask, passes = worst
        return self._request(
            mask, f"retest: {self._fmt(mask)} passed {passes} runs, but the leading hypothesis says it is bad", post,
            TrialKind.RETEST)

    def _stage_step(self, post: _Belief) -> object:
        kind = self._stage[0]
        order = self._order
        if kind == "A":  # prefix bisection for a unit the failure needs
            res = self._bisect(post, len(order), lambda k: self._prefix(k, order), "bisect: {n} suspects left")
            if not isinstance(res, int):
                return res
            self._stage = ("B", res - 1)
            return self._AGAIN
        if kind == "B":  # x found: does it break alone?  is it the only culprit?
            g = self._stage[1]
            x = order[g]
            va, vf = 1 << x, self._fix_mask(1 << x)
            sa, sf = self._status(va, post), self._status(vf, post)
            if sa == "fail":
                self._stage = ("D", va)
                return self._AGAIN
            if sf == "fail":
                self._new_frame(va, vf)
                return self._AGAIN
            if sa == "pass":
                self._stage = ("C", g)
                return self._AGAIN
            name = self._units[x]
            if sa in ("untested", "weak"):  # alone first: it decides culprit vs interaction
                return self._request(va, f"confirm: does {name} break the stack alone?", post, TrialKind.CONFIRM)
            if sf in ("untested", "weak"):
                return self._request(vf, f"confirm: current without {name} (the fix) must pass", post,
                                     TrialKind.CONFIRM)
            return None
        if kind == "C":  # x needs a partner: bisect it among the units that passed without x
            g = self._stage[1]
            x = order[g]
            gseq = order[:g]
            res = self._bisect(
                post,
                g,
                lambda k: self._prefix(k, gseq, 1 << x),
                f"bisect partner of {self._units[x]}: {{n}} candidates left",
            )
            if not isinstance(res, int):
                return res
            self._stage = ("D", (1 << x) | ((1 << gseq[res - 1]) if res else 0))
            return self._AGAIN
        if kind == "D":  # a term is found: is it the whole story?
            term = self._stage[1]
            vf = self._fix_mask(term)
            if self._status(vf, post) == "fail":
                self._new_frame(term, vf)
                return self._AGAIN
            return self._confirm(post, term, need_surprise=True)
        return None

    def _bisect(self, post: _Belief, length: int, cfg, label: str) -> object:
        """Prefix bisection over ``cfg(0) .. cfg(length)``: ``cfg(length)`` failed and
        ``cfg(0)`` passed.  Returns the minimal failing prefix length (an int) once
        settled, else the next request.  Rebuilt from the evidence every time, so a
        re-test that turns a pass into a failure is taken into account."""
        hi = length
        for k in range(length, -1, -1):
            if self._status(cfg(k), post) == "fail":
                hi = k
        lo = 0
        for k in range(hi):
            if self._status(cfg(k), post) in ("pass", "weak"):
                lo = k
        while True:
            if hi == 0:
                return 0
            if self._status(cfg(lo), post) == "weak":
                return self._retest(cfg(lo), post)
            if hi - lo <= 1:
                return hi
            mid = lo + (hi - lo + 1) // 2
            st = self._status(cfg(mid), post)
            if st == "fail":
                hi = mid
            elif st == "pass":
                lo = mid
            elif st == "weak":
                return self._retest(cfg(mid), post)
            else:
                return self._request(cfg(mid), label.format(n=hi - lo), post, TrialKind.BISECT, hi - lo)

    def _confirm(self, post: _Belief, term: int, need_surprise: bool = False) -> TrialRequest | None:
        """Check the claim about ``term`` most likely to be overturned: that it breaks
        the stack alone (without the other deltas), or that current without it passes."""
        names = self._names(term)
        cands: list[tuple[float, int, str]] = []
        if self._status(term, post) in ("untested", "weak"):
            surprise = 1.0 - post.p_bad(term)
            what = (f"does {names[0]} break the stack alone?" if len(names) == 1
                    else f"do {' + '.join(names)} break the stack together, alone?")
            cands.append((surprise, term, "confirm: " + what))
        vf = self._fix_mask(term)
        if self._status(vf, post) in ("untested", "weak"):
            surprise = self._belief(extra=term).p_bad(vf)
            cands.append((surprise, vf, f"confirm: current without {', '.join(self._names(self._vars() | term))} "
                                        "(the fix) must pass"))
        if need_surprise:
            cands = [c for c in cands if c[0] > 1e-6]
        if not cands:
            return None
        cands.sort(key=lambda c: -c[0])  # stable: "alone" first on ties
        return self._request(cands[0][1], cands[0][2], post, TrialKind.CONFIRM)

    def _fix_observed(self, post: _Belief, top: tuple) -> TrialRequest | None:
        """With ``require_fix``, "these are all the culprits" is observed, never inferred:
        current minus every culprit must have passed before the verdict is given."""
        if not self.require_fix or top[0] not in (_S, _AND):
            return None
        term = post.term(top)
        vf = self._fix_mask(term)
        if self._status(vf, post) == "pass":
            return None
        names = ", ".join(self._names(self._vars() | term))
        return self._request(vf, f"confirm: current without {names} (the fix) must pass", post, TrialKind.CONFIRM)

    def _restart_proof(self, post: _Belief, top: tuple) -> TrialRequest | None:
        """A culprit is never blamed on the running stack's word alone: its state may hold more
        than its files (a service restarted alone).  Each blamed term must have failed in some
        config after a full co-restart; if only the free probe saw it, co-restart current."""
        if top[0] not in (_S, _AND):
            return None
        t = post.term(top)
        for term in self._terms + ([t] if t else []):
            if not any(ev.restarted_fail and (m & term) == term for m, ev in self._evidence.items()):
                return TrialRequest(frozenset(self._units), self.premise_probes,
                                    "confirm after a co-restart: current failed as it was running",
                                    kind=TrialKind.CONFIRM)
        return None

    def _spare_check(self, post: _Belief, top: tuple) -> TrialRequest | None:
        """Confident already; but if a claim rests on the prior and checking it stays
        within the restart bound promised for this kind of answer, check it."""
        if top[0] not in (_S, _AND):
            return None
        if self._terms:  # a further culprit: its own claims within the bound for several culprits
            if self.trials + 1 > restart_bound(self._n, "several"):
                return None
        elif self.trials + 1 > restart_bound(self._n, "culprit" if top[0] == _S else "interaction"):
            return None
        return self._confirm(post, post.term(top))

    def _fallback(self, post: _Belief) -> TrialRequest | None:
        """The structured steps are spent and the posterior is not confident: run the
        most informative check (a unit or pair alone, a fix check, or a re-test)."""
        cands: dict[int, str] = {}
        for _, cls in post.ranked()[:6]:
            t = post.term(cls)
            if t:
                cands.setdefault(t, f"check: does {' + '.join(self._names(t))} break the stack alone?")
        for mask, ev in self._evidence.items():
            if not ev.failed:
                cands.setdefault(mask, f"retest: {self._fmt(mask)} passed {ev.passes} runs")
        best: tuple[float, int, str, int] | None = None
        for mask, purpose in cands.items():
            ev = self._evidence.get(mask)
            if ev is not None and (ev.failed or ev.passes >= self._retest_cap):
                continue
            r = self._probes(mask, post)
            gain = post.eig(mask, r)
            if best is None or gain > best[0] + 1e-12:
                best = (gain, mask, purpose, r)
        top_term = post.term(post.ranked()[0][1])
        if top_term:
            vf = self._fix_mask(top_term)
            ev = self._evidence.get(vf)
            if ev is None or (not ev.failed and ev.passes < self._retest_cap):
                nxt = self._belief(extra=top_term)
                r = self._probes(vf, nxt)
                gain = nxt.eig(vf, r)
                if best is None or gain > best[0] + 1e-12:
                    best = (gain, vf, f"check: current without {', '.join(self._names(self._vars() | top_term))}", r)
        if best is None or best[0] < 0.01:
            return None
        kind = TrialKind.RETEST if best[2].startswith("retest") else TrialKind.CHECK
        return TrialRequest(frozenset(self._names(best[1])), best[3], best[2], kind=kind)

    # -- verdicts ---------------------------------------------------------------

    def _marginals(self, post: _Belief) -> list[tuple[str, float]]:
        conf = self._accepted_conf()
        marg = {u: p * conf for u, p in post.marginals().items()}
        for t, c in zip(self._terms, self._term_conf):
            for u in _bits(t):
                marg[u] = c
        items = sorted(marg.items(), key=lambda t: (-t[1], t[0]))
        return [(self._units[u], p) for u, p in items]

    def _suspects(self, post: _Belief) -> tuple[tuple[str, float], ...]:
        return tuple((u, round(p, 4)) for u, p in self._marginals(post) if p >= 1e-3)[:20]

    def _not_reproduced(self) -> Verdict:
        ev = self._evidence[self._all]
        trials = ", ".join(str(t) for t in ev.trials)
        if ev.failed:  # it failed as it was running, and passed after a full co-restart
            return Verdict(
                "not-reproduced", (), 1.0, (),
                f"Observed: the running stack failed (trial {ev.trials[0]}), but after a full ordered co-restart "
                f"the same config passed {ev.restarted_passes} probe runs (trial {ev.trials[-1]}): the files are "
                "not the cause; the running state was (a service restarted alone, or a stale process).",
            )
        conf = 1.0 - self._belief().p_bad(self._all)
        return Verdict(
            "not-reproduced",
            (),
            conf,
            (),
            f"Observed: the current config passed all {ev.passes} probe runs (trial {trials}): the failure did "
            "not reproduce, so nothing was bisected (check the probe, or run again while the fault shows).",
        )

    def _not_config(self) -> Verdict:
        what = "The config (there are no deltas)" if self._n == 0 else "The baseline, with none of the deltas applied,"
        return Verdict(
            "not-config",
            (),
            1.0,
            (),
            f"{what} fails too, so the deltas are not the cause: look outside the config "
            "(clients, proxies, network, hardware, data).",
        )

    def _final(self, reason: str) -> Verdict:
        post = self._belief()
        if post.z > 0 and reason != "contradiction":
            p_top, top, conf = self._assess(post)
            if conf >= self.confidence:
                return self._verdict(post, top, conf)
        why = {
            "budget": f"The restart budget ({self.max_trials}) ran out",
            "infrastructure": "A trial was unresolved twice in a row (infrastructure trouble, which is no evidence)",
            "exhausted": "No further trial would be informative",
            "contradiction": "The observations fit none of the modelled hypotheses (e.g. three deltas that fail "
            "only together, or a fault that comes and goes between restarts)",
        }[reason]
        lead, conf, sus = "", 0.0, ()
        if post.z > 0:
            p_top, top, conf = self._assess(post)
            sus = self._suspects(post)
            if top[0] == _NONE:
                lead = f"; most likely the deltas are not the cause ({conf:.0%})"
            elif sus:
                lead = "; suspects: " + ", ".join(f"{u} {p:.0%}" for u, p in sus[:6])
        return Verdict("inconclusive", (), conf, sus, f"{why} before reaching {self.confidence:.0%} confidence{lead}.")

    def _hypothesis(self, kind: int, terms: list[int], p: float) -> Hypothesis:
        if kind == _NONE:
            return Hypothesis("not-config", (), p)
        if not terms:
            return Hypothesis("no-fault", (), p)
        tt = tuple(self._names(t) for t in terms)
        return Hypothesis("interaction" if any(len(t) > 1 for t in tt) else "culprit", tt, p)

    def _verdict(self, post: _Belief, cls: tuple, conf: float) -> Verdict:
        if cls[0] == _NONE:
            return Verdict("not-config", (), conf, self._suspects(post),
                           "Configs failed with and without the deltas: they are not the cause.")
        t = post.term(cls)
        terms = self._terms + ([t] if t else [])
        if not terms:
            return Verdict("not-reproduced", (), conf, (), "The failure stopped reproducing.")
        h = self._hypothesis(cls[0], terms, conf)
        culprits: list[str] = []
        for tt in h.terms:
            culprits.extend(u for u in tt if u not in culprits)
        return Verdict(h.kind, tuple(culprits), conf, self._suspects(post), self._explain(post, terms), h.terms)

    def _explain(self, post: _Belief, terms: list[int]) -> str:
        facts: list[str] = []
        inferred: list[str] = []
        allv = 0
        for t in terms:
            allv |= t
        for t in terms:
            names = self._names(t)
            alone = self._status(t, post) == "fail"
            if len(names) == 1:
                x = names[0]
                if alone:
                    facts.append(f"{x} alone failed{self._cite(t)}")
                else:
                    facts.append(self._necessity(t, 0))
                    inferred.append(f"{x} breaks the stack on its own, not only together with another delta "
                                    f"({x} was not tested alone; interactions are rare a priori)")
            else:
                details = []
                solo = [u for u in _bits(t) if self._status(1 << u, post) == "pass"]
                if solo:
                    details.append(f"{', '.join(self._units[u] + self._cite(1 << u) for u in solo)} alone passed")
                if alone:
                    details.append(f"{' + '.join(names)} alone failed{self._cite(t)}")
                else:
                    rest = [u for u in _bits(t) if u not in solo]
                    if solo and rest:
                        details.append(self._necessity(1 << rest[0], 1 << solo[0]))
                    inferred.append(f"no third delta is needed ({' + '.join(names)} was not tested alone)")
                facts.append(f"{' and '.join(names)} fail only together" + (f" ({'; '.join(details)})" if details else ""))
        label = ", ".join(self._names(allv))
        if self._status(self._all & ~allv, post) == "pass":
            facts.append(f"current without {label} passed{self._cite(self._all & ~allv)}")
        else:
            inferred.append(f"no other delta breaks the stack too (current without {label} was not tested; "
                            "several independent culprits are rare a priori)")
        premises = []
        if self._all in self._evidence:
            premises.append(f"current failed{self._cite(self._all)}")
        if 0 in self._evidence and self._n:
            premises.append(f"the baseline passed{self._cite(0)}")
        text = "Observed: " + "; ".join(premises + facts) + "."
        if inferred:
            text += " Inferred, not observed: " + "; ".join(inferred) + "."
        qb = post.q_belief()
        mean_q = sum(q * p for q, p in zip(post.qs, qb))
        if mean_q > 0.15:
            text += (f" Estimated from the probe runs: the fault is intermittent, a bad config passes about "
                     f"{mean_q:.0%} of them.")
        return text

    def _cite(self, mask: int) -> str:
        """' (trial 4)' / ' (trials 4, 7)': the trials of exactly this config that showed what the
        sentence says (its failures when it failed, else its passes)."""
        ev = self._evidence.get(mask)
        if ev is None:
            return ""
        ts = ev.failed_trials if ev.failed else ev.passed_trials
        if not ts:
            return ""
        return f" (trial{'s' if len(ts) > 1 else ''} {', '.join(map(str, ts))})"

    def _cite_pair(self, passed: int, failed: int) -> str:
        a, b = self._evidence.get(passed), self._evidence.get(failed)
        if a is None or b is None or not a.passed_trials or not b.failed_trials:
            return ""
        return f" (without it passed in trial {a.passed_trials[-1]}, with it failed in trial {b.failed_trials[0]})"

    def _necessity(self, t: int, with_: int) -> str:
        """Describe the observed pair 'C passed, C + t failed' (C containing ``with_``)."""
        (u,) = list(_bits(t))
        best = None
        for mask, ev in self._evidence.items():
            if ev.failed or (mask >> u) & 1 or (mask & with_) != with_:
                continue
            other = self._evidence.get(mask | t)
            if other is not None and other.failed and (best is None or mask.bit_count() > best.bit_count()):
                best = mask
        x = self._units[u]
        if best is None:
            return f"{x} is needed for the failure (from the bisection's passes and failures as a whole)"
        k = (best & ~with_).bit_count()
        cite = self._cite_pair(best, best | t)
        if with_:
            w = ", ".join(self._names(with_))
            return (f"adding {x} to {w}" + (f" and {k} other delta{'s' if k != 1 else ''}" if k else "")
                    + f" made it fail{cite}")
        if k == 0:
            return f"{x} alone failed{self._cite(t)}"
        return f"adding {x} to {k} other delta{'s' if k != 1 else ''} that passed made it fail{cite}"
