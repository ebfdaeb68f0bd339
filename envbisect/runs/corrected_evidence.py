"""The evidence a corrected record gives the search (state/corrections.py holds the corrections).

The search is a pure function of its observations, so a corrected record is replayed by showing a
fresh search the trials in order, each as its correction says: a retracted trial not at all, a
trial whose outcome the operator changed as the plainest observation of that outcome (a pass: the
probe runs it made, each passed; a fail: one failed run). `bisect --resume` and `envbisect replay`
both feed the search through `feed`, so they reach the same verdict from the same record.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping, Sequence

from envbisect.errors import UsageError
from envbisect.outcome import Outcome
from envbisect.search import Observation, Search, TrialKind, Verdict
from envbisect.state.corrections import Corrections
from envbisect.trials.runner import Trial

# trials the search never saw: a guard measures what a revert costs, a final probe checks the fix
# the verdict implies, a refine trial tests an auto-linked unit's members apart after the verdict
NOT_SEARCHED = (TrialKind.GUARD, TrialKind.FINAL, TrialKind.REFINE)


def corrected_observation(t: Trial, corrections: Corrections,
                          observe: Callable[[Trial], Observation]) -> Observation | None:
    """What trial ``t`` tells the search once corrected; None when it was retracted."""
    if corrections.retracted(t.n):
        return None
    given = corrections.outcome(t.n)
    base = observe(t)
    if given is None or given == t.outcome:
        return base
    if given is Outcome.PASS:
        runs = t.passes if not t.outcome.failed and t.passes else len(t.probe_runs)
        return Observation(base.config, passes=max(1, runs), free=t.free, trial=t.n)
    return Observation(base.config, passes=0, failed=True, failures=1, free=t.free, trial=t.n)


def corrected_trial(t: Trial, corrections: Corrections) -> Trial:
    """The trial with the outcome the operator gave it (for judging refine trials; the record keeps
    the outcome it ran with)."""
    given = corrections.outcome(t.n)
    if given is None or given == t.outcome:
        return t
    return dataclasses.replace(t, outcome=given, reason=f"corrected to {given} by the operator (ran: {t.outcome}; "
                                                        f"{t.reason})")


def feed(search: Search, trials: Iterable[Trial], corrections: Corrections,
         observe: Callable[[Trial], Observation]) -> tuple[int, ...]:
    """Show ``search`` the corrected evidence of ``trials``, in order. Returns the numbers of the
    trials it did not need (the corrected evidence decided before them)."""
    unused = []
    for t in trials:
        if t.kind in NOT_SEARCHED:
            continue
        obs = corrected_observation(t, corrections, observe)
        if obs is None:
            continue
        if isinstance(search.next(), Verdict):
            unused.append(t.n)
            continue
        search.observe(obs)
    return tuple(unused)


def recorded_refine(trials: Sequence[Trial], corrections: Corrections, config: Sequence[str],
                    kind: TrialKind = TrialKind.REFINE, nth: int | None = None) -> Trial | None:
    """A refine (or `kind`) trial of exactly these deltas in the record (not retracted; as corrected):
    testing an auto-linked unit's members apart, or a commit of a HEAD move's line, again would repeat
    an observation already made. The latest, or with `nth` the nth oldest (a commit tried again after
    it failed differently: its second trial is another observation)."""
    same = [t for t in trials if t.kind is kind and tuple(t.config) == tuple(config) and not corrections.retracted(t.n)]
    if not same:
        return None
    if nth is None:
        return corrected_trial(same[-1], corrections)
    return corrected_trial(same[nth], corrections) if nth < len(same) else None


def perf_reference(run_doc: Mapping[str, Any], trials: Sequence[Trial]) -> int | None:
    """The trial a perf bisection measured first: every later trial was judged against its samples."""
    perf = run_doc.get("perf") or {}
    if not perf or perf.get("guard"):
        return None
    return next((t.n for t in trials if not t.config and t.kind is TrialKind.PREMISE_BASELINE), None)


def check_correctable(run_id: str, run_doc: Mapping[str, Any], trials: Sequence[Trial], n: int,
                      what: str = "retract") -> Trial:
    """Trial ``n`` of the record, or a one-line UsageError saying why it cannot be corrected: it
    does not exist; it is not evidence of the verdict (a guard or final probe); or it is a perf
    run's reference (every later trial was judged against it: correcting it voids them all).
    A premise trial may be corrected: the search then asks for it again."""
    by_n = {t.n: t for t in trials}
    t = by_n.get(n)
    if t is None:
        have = f"trials 1-{max(by_n)}" if by_n else "no trials"
        raise UsageError(f"run {run_id} has no trial {n} (it has {have}; see `envbisect log {run_id}`)")
    if t.kind in (TrialKind.GUARD, TrialKind.FINAL):
        raise UsageError(f"cannot {what} trial {n} of run {run_id}: it is a {t.kind.value} trial, not evidence the "
                         "verdict rests on")
    if n == perf_reference(run_doc, trials):
        raise UsageError(f"cannot {what} trial {n} of run {run_id}: it is the perf reference every later trial was "
                         "judged against; start a new bisection instead")
    return t
