"""A bisection's perf decision (search/perf.py decide_sequential and next_step): sequential tests on
the start-level comparison, samples within a start while they can still decide, then a new start
of the reference or of the candidate. Played on known distributions (seeded): one start's offset
(lognormal, 2%) shared by its samples (lognormal, 3%), as bench/bench_perf.py draws them."""
from __future__ import annotations

import random

from envbisect.search.perf import (MAX_REFERENCE_STARTS, REFERENCE_SAMPLES, PerfOutcome, Step, decide_sequential,
                                   next_step)

START, SAMPLE = 0.02, 0.03
MAX_SAMPLES = 16


class Stack:
    """A configuration's speed: each start draws its offset, each sample its own noise."""

    def __init__(self, rng: random.Random, slowdown: float):
        self.rng, self.slowdown = rng, slowdown
        self.offset = 1.0

    def start(self) -> None:
        self.offset = self.rng.lognormvariate(0, START)

    def samples(self, n: int) -> list[float]:
        return [1843.0 * (1 - self.slowdown) * self.offset * self.rng.lognormvariate(0, SAMPLE) for _ in range(n)]


def judge(rng: random.Random, slowdown: float, *, regression: float = 0.05, target: float | None = None,
          max_starts: int = 4) -> tuple[PerfOutcome, int, int]:
    """One configuration judged as trials/perf.PerfJudge does it: the reference's first start,
    then starts of the candidate (3 samples, more while next_step says so) and of the reference when
    next_step asks for one. (outcome, candidate starts, reference starts)."""
    base, cand = Stack(rng, 0.0), Stack(rng, slowdown)
    base.start()
    reference = [base.samples(REFERENCE_SAMPLES)]
    starts: list[list[float]] = []
    while len(starts) < max_starts:
        cand.start()
        starts.append(cand.samples(3))
        while True:
            d, seq = decide_sequential(reference, starts, higher_is_better=True, regression=regression,
                                       start_noise=START, max_samples=MAX_SAMPLES, target=target)
            step = next_step(d, seq, len(starts[-1]), MAX_SAMPLES)
            if step.step is Step.SAMPLE:
                starts[-1] += cand.samples(step.samples)
                continue
            break
        if step.step is Step.DONE:
            return d.outcome, len(starts), len(reference)
        if step.step is Step.START_REFERENCE:
            base.start()
            reference.append(base.samples(REFERENCE_SAMPLES))
    return PerfOutcome.UNKNOWN, len(starts), len(reference)


def test_a_ten_percent_slowdown_against_five_allowed_is_found_and_an_unchanged_one_cleared():
    """The hard case of issue 25: 10% down is as far beyond a 5% allowance as no change is inside
    it, and one start of each side cannot tell them apart often enough (its offsets alone are 2.8%)."""
    rng = random.Random(25)
    slow = [judge(rng, 0.10) for _ in range(200)]
    same = [judge(rng, 0.0) for _ in range(200)]
    assert sum(o is PerfOutcome.WORSE for o, *_ in slow) / 200 >= 0.95
    assert sum(o is PerfOutcome.SAME for o, *_ in slow) / 200 <= 0.01
    assert sum(o is PerfOutcome.SAME for o, *_ in same) / 200 >= 0.95
    assert sum(o is PerfOutcome.WORSE for o, *_ in same) / 200 <= 0.005  # an innocent delta named
    # the reference was started again where its own start was what kept the comparison open
    assert any(refs > 1 for *_, refs in slow + same)
    assert all(refs <= MAX_REFERENCE_STARTS for *_, refs in slow + same)


def test_a_clear_slowdown_is_worse_on_its_first_start_and_current_s_size_clears_the_others_at_once():
    rng = random.Random(20)
    slow = [judge(rng, 0.20) for _ in range(100)]
    assert all(o is PerfOutcome.WORSE for o, *_ in slow)
    assert sum(starts == 1 for _, starts, _ in slow) / 100 >= 0.97
    # a bisection of a 20% slowdown: current measured it; a configuration without it is cleared on
    # its first start (without the size, "same" needs the margin a 10% slowdown needs: often a restart more)
    target = -0.20
    sized = [judge(rng, 0.0, target=target) for _ in range(100)]
    plain = [judge(rng, 0.0) for _ in range(100)]
    assert all(o is PerfOutcome.SAME for o, *_ in sized)
    one_start = sum(starts == 1 and refs == 1 for _, starts, refs in sized) / 100
    assert one_start >= 0.97 and one_start > sum(starts == 1 and refs == 1 for _, starts, refs in plain) / 100
    # the size never clears a configuration near it (half of it may go either way: the indifference zone)
    for slowdown in (0.16, 0.20):
        got = [judge(rng, slowdown, target=target) for _ in range(60)]
        assert not any(o is PerfOutcome.SAME for o, *_ in got), slowdown


def test_samples_stop_when_only_a_new_start_can_help_and_the_reference_is_started_on_a_tie():
    # tight samples, 4.5% down against 5% allowed: the starts' offsets (2% each) are what is left
    ref = [[1000.0, 1001.0, 999.0, 1000.5, 999.5, 1000.2, 999.8, 1000.0]]
    cand = [[955.0, 955.4, 954.6, 955.2, 954.8, 955.1, 955.0, 954.9]]
    d, seq = decide_sequential(ref, cand, higher_is_better=True, regression=0.05, start_noise=0.02, max_samples=16)
    assert d.outcome is PerfOutcome.UNKNOWN and not seq.samples_can_decide
    step = next_step(d, seq, 8, 16)
    assert step.step is Step.START_REFERENCE  # one start a side: the reference's, which every comparison shares
    # with the reference started more often than the candidate, the candidate's start is the one to take
    more_ref = ref * 3
    d2, seq2 = decide_sequential(more_ref, cand, higher_is_better=True, regression=0.05, start_noise=0.02,
                                 max_samples=16)
    assert next_step(d2, seq2, 8, 16).step is Step.START_CANDIDATE
    # noisy samples of one start: more of them can still decide, so they come first (seconds, not minutes)
    noisy = [[1003.0, 900.0, 860.0]]
    d3, seq3 = decide_sequential(ref, noisy, higher_is_better=True, regression=0.05, start_noise=0.02,
                                 max_samples=16)
    assert d3.outcome is PerfOutcome.UNKNOWN and seq3.samples_can_decide
    assert next_step(d3, seq3, 3, 16).step is Step.SAMPLE and next_step(d3, seq3, 3, 16).samples == 2
    assert next_step(d3, seq3, 16, 16).step is not Step.SAMPLE  # the cap


def test_an_unchanged_configuration_against_a_lucky_reference_start_asks_for_the_reference_again():
    """CI's inconclusive run (test_perf_sim, a 25% slowdown among 8 deltas, 3% allowed, 1% start
    noise): the baseline's one start measured high (673.6 tok/s), an innocent configuration came out
    2.6% below it in four starts, and every retry restarted the candidate: the reference's own start
    was what kept it open. The reference is started again, and with it the configuration is cleared."""
    ref = [[705.0, 660.0, 715.0, 669.0, 662.0, 706.0, 670.0, 677.0]]
    starts = [[618.0, 694.0, 704.0, 633.0, 660.0, 652.0, 649.0, 642.0, 711.0, 685.0, 700.0, 630.0, 652.0, 615.0,
               687.0, 617.0]]
    d, seq = decide_sequential(ref, starts, higher_is_better=True, regression=0.03, start_noise=0.01, max_samples=16)
    assert d.outcome is PerfOutcome.UNKNOWN
    assert next_step(d, seq, 16, 16).step is Step.START_REFERENCE
    again = ref + [[648.0, 655.0, 661.0, 642.0, 659.0, 650.0, 663.0, 646.0]]
    d2, _seq = decide_sequential(again, starts, higher_is_better=True, regression=0.03, start_noise=0.01,
                                 max_samples=16, target=-0.17)
    assert d2.outcome is PerfOutcome.SAME, d2.reason


def test_latency_lower_is_better_and_the_reason_gives_the_ratios():
    ref = [[0.200, 0.203, 0.198, 0.201, 0.199, 0.202, 0.200, 0.197]]
    slow = [[0.262, 0.258, 0.265]]
    d, seq = decide_sequential(ref, slow, higher_is_better=False, regression=0.05, start_noise=0.02, max_samples=16)
    assert d.outcome is PerfOutcome.WORSE and d.change > 0.2 and seq.llr_worse >= seq.upper
    assert "log-likelihood ratios" in d.reason and "1 vs 1 start(s)" in d.reason
    assert next_step(d, seq, 3, 16).step is Step.DONE
