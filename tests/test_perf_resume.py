"""A resumed perf bisection judges with what the interrupted run had measured (pure: no hosts).

The speeds a run has seen live in its PerfJudge: every start of the baseline (the reference) and
every earlier start of each configuration judged. A resumed run rebuilds that judge from the run's
record, so the comparisons after the resume pool the same samples the uninterrupted run would."""
from __future__ import annotations

from types import SimpleNamespace

from envbisect.inputs.playbook import Probe
from envbisect.outcome import Outcome
from envbisect.runs.bisect import REFERENCE_PURPOSE, BisectRun
from envbisect.search.types import TrialKind
from envbisect.trials.perf_trial import PerfJudge
from envbisect.trials.probe_request import ProbeRun
from envbisect.trials.runner import Trial


def _trial(n: int, config: tuple[str, ...], values: tuple[float, ...], outcome: Outcome,
           kind: TrialKind = TrialKind.BISECT, purpose: str = "bisect", free: bool = False) -> Trial:
    runs = tuple(ProbeRun("tps", "perf", "pass", "", (), 0.1, value=v) for v in values)
    return Trial(n, purpose, config, config, outcome, "", runs, kind=kind, free=free)


def _probe() -> Probe:
    return Probe("tps", "perf", url="http://127.0.0.1:1/v1/chat/completions", body='{"x": 1}', timeout_s=1.0)


def test_a_resumed_perf_run_keeps_every_reference_start_and_each_configs_earlier_starts():
    probe = _probe()
    assert probe.needs_reference
    done = [
        _trial(1, (), (100.0, 101.0, 99.0), Outcome.PASS, TrialKind.PREMISE_BASELINE, "premise: baseline"),
        _trial(2, ("a", "b"), (90.0, 91.0), Outcome.FAIL, free=True, kind=TrialKind.PREMISE_CURRENT),
        _trial(3, ("a",), (97.0, 98.0), Outcome.UNRESOLVED),
        _trial(4, (), (102.0, 100.0, 98.0), Outcome.PASS, TrialKind.PREMISE_BASELINE, REFERENCE_PURPOSE),
        _trial(5, ("a",), (96.0, 99.0), Outcome.PASS),
        _trial(6, ("b",), (), Outcome.START_FAILURE),
    ]
    runner = SimpleNamespace(perf=PerfJudge(probe))
    assert BisectRun._perf_reference(SimpleNamespace(), probe, runner, done, [], 2, 2) is None
    assert runner.perf.reference == [(100.0, 101.0, 99.0), (102.0, 100.0, 98.0)]
    assert runner.perf.starts == {("a", "b"): [(90.0, 91.0)], ("a",): [(97.0, 98.0), (96.0, 99.0)]}
    assert runner.perf.reference_asks == 1  # one reference start asked for already: the bound counts it


def test_a_resumed_perf_run_whose_baseline_failed_has_no_reference():
    probe = _probe()
    done = [_trial(1, (), (50.0,), Outcome.FAIL, TrialKind.PREMISE_BASELINE, "premise: baseline")]
    runner = SimpleNamespace(perf=PerfJudge(probe))
    BisectRun._perf_reference(SimpleNamespace(), probe, runner, done, [], 1, 1)
    assert runner.perf.reference is None


def test_a_judge_rebuilt_from_the_record_is_the_judge_the_live_run_had(monkeypatch):
    """Live: a PerfJudge fed seeded samples (one start's speed drawn per start, as a restart does)
    through a sequence of starts, 20% slower with 'a'; resumed: a new judge given the same starts as
    recorded. Reference, each configuration's starts and the slowdown searched for are equal."""
    import random

    import envbisect.trials.perf_trial as perf

    rng = random.Random(7)
    speed = {(): 100.0, ("a",): 80.0, ("b",): 100.0, ("a", "b"): 80.0}
    state: dict = {}

    def fake_sample(probe, transports, n):  # noqa: ANN001 - the one start's samples, noisy
        level = state["level"]
        return [ProbeRun("tps", "perf", "pass", "", (), 0.1, value=level * rng.gauss(1, 0.03)) for _ in range(n)], None

    monkeypatch.setattr(perf, "sample", fake_sample)
    probe = _probe()
    live = PerfJudge(probe)
    recorded = []
    for config in [(), ("a", "b"), ("b",), ("a",), (), ("a",), ("b",)]:
        state["level"] = speed[config] * rng.gauss(1, 0.02)
        outcome, runs, _reason = live.judge_start({}, config)
        recorded.append((config, tuple(r.value for r in runs if r.value is not None), outcome is Outcome.PASS))
    assert live.target is not None and len(live.reference) == 2  # a slowdown was found; the baseline started twice
    resumed = PerfJudge(probe)
    resumed.resume(recorded)
    assert resumed.reference == live.reference
    assert resumed.starts == live.starts
    assert resumed.target == live.target
