"""The search's vocabulary: what the caller observes (Observation), what the search asks for
(TrialRequest, of a TrialKind), what it concludes (Verdict), what it assumes (Prior) and what it
promises (restart_bound). Pure data, no I/O. The policies, which name priors, are in policy.py."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Iterable

from envbisect.outcome import Outcome, VerdictKind


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
    ``other`` marks a trial that failed *differently* from the symptom (a service that would not
    start when the symptom is a hang, another HTTP status, ...): no evidence for or against the
    symptom, as `git bisect skip`; the search plans around it and looks for the delta that needs
    a partner (search/dependency.py). ``passes`` and ``failures`` are then ignored.
    """

    config: frozenset[str]
    passes: int = 0
    failed: bool = False
    unresolved: bool = False
    failures: int = 0
    free: bool = False
    other: bool = False
    # the caller's number for this trial, which the explanation cites; None: the order observed
    # (they differ when a trial was run before the search asked for it, as a perf reference is)
    trial: int | None = None
    # the fingerprint of its failure (opaque; None: a pass, or nothing describes it), which an
    # `Incident` judges against each problem's symptom; a `Search` never reads it
    sign: object = field(default=None, compare=False)
    # with ``other``: it failed before the symptom could show (a service did not start): a config that
    # then shows the symptom with a partner added has started, so the partner cured it (no mask)
    before: bool = False

    def __post_init__(self) -> None:
        if self.other:
            object.__setattr__(self, "failed", False)
            object.__setattr__(self, "failures", 0)
            return
        if self.failed and self.failures == 0:
            object.__setattr__(self, "failures", 1)
        if self.failures > 0 and not self.failed:
            object.__setattr__(self, "failed", True)

    @property
    def outcome(self) -> Outcome:
        if self.unresolved or self.other:  # another failure: no evidence about the symptom either
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
    GUARD = "guard"  # --guard: what reverting the culprits costs in speed (bisect.py; never searched on)
    DEPENDENCY = "dependency"  # which delta fails differently without which partner (search/dependency.py)


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
    dependencies: tuple["Dependency", ...] = ()  # deltas that fail differently without a partner
    # the incident's faults, one per fingerprint, in the order they showed (search/incident.py)
    faults: tuple["Fault", ...] = ()
    stack_state: object = None  # a fingerprint only the running stack showed (a breaker's 503)


@dataclass(frozen=True)
class Fault:
    """One problem of an incident: the culprits whose configurations fail with ``sign`` (an opaque
    fingerprint), as the problem's own search concluded (``verdict``). ``left_out``: deltas the fix
    of this problem left out besides the culprits (they need one of them to start)."""

    culprits: tuple[str, ...]
    terms: tuple[tuple[str, ...], ...]
    sign: object
    verdict: "Verdict"
    left_out: tuple[str, ...] = ()


@dataclass(frozen=True)
class Dependency:
    """``needy`` fails differently from the symptom (usually: a service does not start) without
    ``partners``, and does not with them. ``observed``: the three trials that show it are cited
    in ``text`` (without it, with neither, with both); else ``text`` says what was inferred."""

    needy: str
    partners: tuple[str, ...]
    text: str
    observed: bool = True
    # (failed differently: needy without the partners, passed or showed the symptom: the same
    # without needy, and: the same with the partners); empty when not all three were run
    trials: tuple[int, ...] = ()


@dataclass(frozen=True)
class Hypothesis:
    """One hypothesis of the posterior, for reports (see :meth:`Search.hypotheses`)."""

    kind: str  # a VerdictKind (culprit, interaction, not-config), or no-fault
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
    docs/search.md); the verdict then says the claim was inferred, not observed.
    :meth:`cautious` makes interactions and second culprits as likely as single
    ones: every claim is then checked (one or two more restarts) and interactions
    and second culprits are always found.

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
        for f in fields(self):
            if f.name not in ("q", "later_interaction") and getattr(self, f.name) < 0:
                raise ValueError(f"Prior.{f.name} must be >= 0")
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


def restart_bound(n: int, kind: str = VerdictKind.CULPRIT) -> int:
    """Restarts (premise checks included) promised for a deterministic fault among ``n`` units.

    ``"culprit"``: ``ceil(log2 n) + 3``; ``"interaction"``: ``2 * ceil(log2 n) + 3``;
    ``"several"`` (two independent culprits): ``2 * ceil(log2 n) + 4``.  The premise checks
    are included; the first (current must fail) is free when the running stack verifiably
    runs its files, else each bound is one more.
    """
    k = math.ceil(math.log2(n)) if n > 1 else 0
    if kind == VerdictKind.CULPRIT:
        return k + 3
    if kind == VerdictKind.INTERACTION:
        return 2 * k + 3
    if kind == "several":
        return 2 * k + 4
    raise ValueError(f"unknown kind {kind!r}")




def default_budget(n: int) -> int:
    """The restart budget of a bisection that was given none: three times the bound for two
    independent culprits, plus the premises' restart and three. The bench's worst cases (masked
    second and third faults, intermittent culprits, a must-match pair, a running stack in a bad
    state) stay within it (bench/run.py checks "no run over its budget"); an unattended run never
    restarts production without end."""
    return 3 * restart_bound(max(n, 2), "several") + 4
