"""A perf probe's trial: samples of the started configuration, judged against the baseline's.

A sample is one run of the perf probe (warm-up, then `requests` at `concurrency`; its metric). The
baseline trial's samples are the reference; every other configuration is sampled and compared
with them by `search.perf.decide` (Mann-Whitney U and Kolmogorov-Smirnov with the effect size
against `regression`, as Chromium's Pinpoint does): *worse* is a failing trial, *same* a passing
one, and *unknown* takes more samples, up to `max_samples`, then leaves the trial unresolved (the
search retries it with a new start) -- an undecided comparison is never a pass or a fail.

A bisection's judge (`PerfJudge` with the baseline as reference) uses `search.perf.decide_sequential`
instead: samples within a start while more of them can still decide (seconds), then a new start
(minutes): of the baseline first when the reference's own start is what keeps the comparison open
(`wants_reference`; runs/bisect.py starts it before the search's retry), else of the candidate.
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Iterable, Mapping, Sequence

from envbisect.inputs.playbook import Probe
from envbisect.outcome import Outcome
from envbisect.hosts.transport import Transport
from envbisect.search.perf import (MAX_REFERENCE_STARTS, REFERENCE_SAMPLES, PerfDecision, PerfOutcome, Samples,
                                   Sequential, Step, decide, decide_sequential, next_samples, next_step)
from envbisect.trials.probe import ProbeRun, run_probe


def sample(probe: Probe, transports: Mapping[str, Transport], n: int) -> tuple[list[ProbeRun], str | None]:
    """n samples; stops at the first that failed as a request (the stack is broken, not slow)."""
    runs: list[ProbeRun] = []
    for _ in range(n):
        r = run_probe(probe, transports)
        runs.append(r)
        if r.outcome != Outcome.PASS or r.value is None:
            return runs, f"sample {len(runs)}: {r.reason}"
    return runs, None


def reference_count(probe: Probe) -> int:
    """Samples of a reference (the baseline, or the stack before a revert): a few more than a
    candidate's, so that the rank test can tell fully separated samples apart at 3 a side."""
    return max(probe.samples, REFERENCE_SAMPLES)


def compare(probe: Probe, transports: Mapping[str, Transport], reference: Samples,
            runs: list[ProbeRun], prior: Sequence[Sequence[float]] = ()):  # noqa: ANN201
    """Returns (PerfDecision | None, runs, broken).

    Decide `runs` (samples of the started configuration, with `prior`: the samples of its
    earlier starts in this run) against `reference` (flat: one start; or grouped by start), taking
    more samples while the decision is unknown and more samples can still help."""
    higher = probe.higher_is_better
    runs = list(runs)
    while True:
        values = tuple(r.value for r in runs if r.value is not None)
        d = decide(reference, [*map(tuple, prior), values], higher_is_better=higher, regression=probe.regression,
                   metric=probe.metric, start_noise=probe.start_noise)
        more = next_samples(d, len(values), probe.max_samples)
        if d.outcome is not PerfOutcome.UNKNOWN or more <= 0:
            return d, runs, None
        extra, broken = sample(probe, transports, more)
        runs += extra
        if broken:
            return None, runs, broken


def _decide(probe: Probe, reference: Sequence[Sequence[float]], starts: Samples, target: float | None
            ) -> tuple[PerfDecision, Sequential | None]:
    """A bisection's decision on a configuration's starts against the reference (decide_sequential
    with the probe's settings)."""
    return decide_sequential(reference, starts, higher_is_better=probe.higher_is_better, regression=probe.regression,
                             start_noise=probe.start_noise, max_samples=probe.max_samples, target=target,
                             metric=probe.metric)


def compare_sequential(probe: Probe, transports: Mapping[str, Transport], reference: Sequence[Sequence[float]],
                       runs: list[ProbeRun], prior: Sequence[Sequence[float]] = (), target: float | None = None
                       ) -> tuple[PerfDecision | None, Sequential | None, Step, list[ProbeRun], str | None]:
    """A bisection's comparison (search.perf.decide_sequential): more samples of this start while
    they can still decide; undecided, the step says which new start would help most."""
    runs = list(runs)
    while True:
        values = tuple(r.value for r in runs if r.value is not None)
        d, seq = _decide(probe, reference, [*map(tuple, prior), values], target)
        step = next_step(d, seq, len(values), probe.max_samples)
        if step.step is not Step.SAMPLE:
            return d, seq, step.step, runs, None
        extra, broken = sample(probe, transports, step.samples)
        runs += extra
        if broken:
            return None, None, Step.DONE, runs, broken


def _outcome(d: PerfDecision, runs: list[ProbeRun], values: tuple[float, ...]
             ) -> tuple[Outcome, tuple[ProbeRun, ...], str, tuple[float, ...]]:
    if d.outcome is PerfOutcome.WORSE:
        # each sample of a configuration measurably worse than the baseline is a failing run
        marked = tuple(replace(r, outcome=Outcome.FAIL, reason=f"{r.reason}; worse than the baseline") for r in runs)
        return Outcome.FAIL, marked, d.reason, values
    if d.outcome is PerfOutcome.SAME:
        return Outcome.PASS, tuple(runs), d.reason, values
    return Outcome.CANNOT_TEST, tuple(runs), f"undecided after {len(values)} samples: {d.reason}", values


def judge(probe: Probe, transports: Mapping[str, Transport], reference: Samples | None, *,
          is_reference: bool = False, prior: Sequence[Sequence[float]] = ()
          ) -> tuple[Outcome, tuple[ProbeRun, ...], str, tuple[float, ...]]:
    """(outcome, samples, reason, values of this start). `is_reference`: these samples become the
    reference (the baseline trial keeps them); otherwise they are judged against `reference`,
    pooled with `prior` (the configuration's earlier starts: a retry of an undecided trial adds a
    start instead of starting over)."""
    runs, broken = sample(probe, transports, reference_count(probe) if is_reference else probe.samples)
    values = tuple(r.value for r in runs if r.value is not None)
    if broken:
        return Outcome.FAIL, tuple(runs), broken, values
    if reference is None and not is_reference:
        return (Outcome.CANNOT_TEST, tuple(runs), "no baseline reference to judge the samples against (the "
                "baseline did not measure)", values)
    if reference is None:
        med = statistics.median(values)
        return Outcome.PASS, tuple(runs), (f"the reference: {probe.metric} median {med:.4g} over {len(values)} "
                                           "samples"), values
    d, runs, broken = compare(probe, transports, reference, runs, prior)
    values = tuple(r.value for r in runs if r.value is not None)
    if broken or d is None:
        return Outcome.FAIL, tuple(runs), broken or "no sample", values
    return _outcome(d, runs, values)


class PerfJudge:
    """What a run knows about speeds: the reference (the reference configuration's starts: the
    baseline for a bisection, the current configuration for a guard) and the earlier starts of every
    other configuration. `judge_start` judges the started configuration and remembers its samples:
    the first start of the reference configuration becomes the reference, a later one adds a start
    to it, and any other configuration is pooled with its own earlier starts.

    A bisection (no reference_config: the reference is the baseline) judges with the sequential
    rule, and a later start of the baseline joins the reference as it is (the baseline is what
    "same" means; its starts are not judged against each other). `wants_reference` says that the
    last undecided comparison needs another start of the reference more than one of the candidate
    (bisect.py then starts the baseline before the retry)."""

    def __init__(self, probe: Probe, reference_config: Sequence[str] = ()):
        self.probe = probe
        self.reference_config = tuple(sorted(reference_config))
        self.reference: list[tuple[float, ...]] | None = None  # one group of samples per start
        self.starts: dict[tuple[str, ...], list[tuple[float, ...]]] = {}
        # a bisection's "worse" names a delta: the sequential rule (a guard's reference is the current
        # configuration; its "worse" is a cost, named as measured, by the fixed-sample rule)
        self.sequential = not self.reference_config
        self.wants_reference = False
        self.reference_asks = 0  # bounded, so that a baseline that will not start cannot loop the run
        # the slowdown searched for: current's (the largest configuration judged worse), log scale
        self.target: tuple[int, float] | None = None

    def resume(self, starts: Iterable[tuple[Sequence[str], Sequence[float], bool]]) -> None:
        """The judge as a run's recorded starts left it, in their order: (config, the samples' values,
        whether it passed). A start of the reference configuration that passed joins the reference;
        any other start with samples joins its configuration's starts; and the slowdown searched for
        (`target`) is decided again from them, as `_candidate_start` decided it, so a resumed run
        judges what comes next as the uninterrupted run would."""
        for config, values, passed in starts:
            key, values = tuple(sorted(config)), tuple(values)
            if not values:
                continue
            if key == self.reference_config:
                if passed:
                    self.reference_asks += self.reference is not None and self.sequential
                    self.reference = [*(self.reference or []), values]
                continue
            prior = self.starts.get(key, [])
            self.starts.setdefault(key, []).append(values)
            if not (self.sequential and self.reference):
                continue
            d, seq = _decide(self.probe, self.reference, [*prior, values], self.target and self.target[1])
            if not passed:
                self._note_worse(key, d, seq)

    def judge_start(self, transports: Mapping[str, Transport], config: Sequence[str]
                    ) -> tuple[Outcome, tuple[ProbeRun, ...], str]:
        key = tuple(sorted(config))
        mine = key == self.reference_config
        if self.sequential and self.reference is not None:
            return self._reference_start(transports) if mine else self._candidate_start(transports, key)
        outcome, runs, reason, values = judge(self.probe, transports, self.reference,
                                              is_reference=mine and self.reference is None,
                                              prior=() if mine else self.starts.get(key, ()))
        if values and mine and outcome is Outcome.PASS:
            self.reference = [*(self.reference or []), values]
        elif values and not mine:
            self.starts.setdefault(key, []).append(values)
        return outcome, runs, reason

    def _candidate_start(self, transports: Mapping[str, Transport], key: tuple[str, ...]
                         ) -> tuple[Outcome, tuple[ProbeRun, ...], str]:
        """A bisection's configuration, pooled with its earlier starts, by the sequential rule."""
        self.wants_reference = False
        runs, broken = sample(self.probe, transports, self.probe.samples)
        d, seq, step = None, None, Step.DONE
        if not broken:
            d, seq, step, runs, broken = compare_sequential(self.probe, transports, self.reference or [], runs,
                                                       self.starts.get(key, ()), self.target and self.target[1])
        values = tuple(r.value for r in runs if r.value is not None)
        if values:
            self.starts.setdefault(key, []).append(values)
        if broken or d is None:
            return Outcome.FAIL, tuple(runs), broken or "no sample"
        self.wants_reference = step is Step.START_REFERENCE and self.reference_asks < MAX_REFERENCE_STARTS - 1
        self.reference_asks += self.wants_reference
        self._note_worse(key, d, seq)
        outcome, runs_out, reason, _values = _outcome(d, runs, values)
        return outcome, runs_out, reason

    def _note_worse(self, key: tuple[str, ...], d: PerfDecision, seq: Sequential | None) -> None:
        """A configuration judged worse: the largest such sets the slowdown searched for."""
        if d.outcome is PerfOutcome.WORSE and seq is not None and (self.target is None or len(key) >= self.target[0]):
            self.target = (len(key), seq.goodness + seq.se)

    def _reference_start(self, transports: Mapping[str, Transport]) -> tuple[Outcome, tuple[ProbeRun, ...], str]:
        """Another start of the baseline: its samples join the reference."""
        runs, broken = sample(self.probe, transports, reference_count(self.probe))
        values = tuple(r.value for r in runs if r.value is not None)
        self.wants_reference = False
        if broken:
            return Outcome.FAIL, tuple(runs), broken
        self.reference = [*(self.reference or []), values]
        med = statistics.median(values)
        return Outcome.PASS, tuple(runs), (f"another start of the reference: {self.probe.metric} median {med:.4g} "
                                           f"over {len(values)} samples ({len(self.reference)} starts now)")
