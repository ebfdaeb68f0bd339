"""The perf decision (search/perf.py): the two tests against known values, and the three-valued
rule on known distributions (seeded), with the false-alarm rate measured."""
from __future__ import annotations

import math
import random

import pytest

from envbisect.search.perf import (REFERENCE_SAMPLES, PerfOutcome, decide, format_effect, kolmogorov_smirnov,
                                   mann_whitney_u, next_samples)


def test_mann_whitney_exact_and_approximate_against_known_values():
    assert mann_whitney_u([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / 252)  # C(10,5) = 252
    assert mann_whitney_u([1, 2, 3], [4, 5, 6, 7, 8]) == pytest.approx(2 / 56)
    assert mann_whitney_u([1, 2, 3], [1, 2, 3]) == 1.0  # identical (ties: the normal approximation)
    # the classic textbook example (Mann and Whitney's sample): U = 3 for 4 vs 5 -> two-sided 0.111
    assert mann_whitney_u([1.1, 3.4, 5.0, 6.2], [2.3, 7.0, 8.1, 9.4, 10.2]) == pytest.approx(2 * 7 / 126)
    # large samples (normal approximation): half-overlapping ranges are far apart, equal ones are not
    big_a, big_b = list(range(40)), [x + 0.5 for x in range(20, 60)]
    assert 0 < mann_whitney_u(big_a, big_b) < 1e-4 and mann_whitney_u(big_a, list(big_a)) == pytest.approx(1.0)


def test_kolmogorov_smirnov_exact_small_and_asymptotic_large():
    assert kolmogorov_smirnov([1, 2, 3], [1, 2, 3]) == 1.0
    # fully separated 5 vs 5: only the 2 extreme paths leave the band of D = 1
    assert kolmogorov_smirnov([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / 252)
    rng = random.Random(1)
    a = [rng.gauss(0, 1) for _ in range(150)]
    b = [rng.gauss(0, 1) for _ in range(150)]
    c = [rng.gauss(1, 1) for _ in range(150)]
    assert kolmogorov_smirnov(a, b) > 0.01 and kolmogorov_smirnov(a, c) < 1e-6


def draw(rng: random.Random, n: int, mean: float, noise: float = 0.03) -> list[float]:
    """Throughput samples: normal noise plus the occasional slow outlier of a shared machine."""
    out = []
    for _ in range(n):
        v = rng.gauss(mean, mean * noise)
        if rng.random() < 0.05:
            v *= rng.uniform(0.8, 0.92)  # a sample that shared its cores with something else
        out.append(v)
    return out


def run_to_verdict(rng: random.Random, shift: float, *, regression: float = 0.05, cap: int = 16,
                   higher: bool = True) -> tuple[PerfOutcome, int]:
    """As a trial does: the reference's 8 samples, 3 of the candidate, more while unknown."""
    base = draw(rng, REFERENCE_SAMPLES, 1000.0)
    cand = draw(rng, 3, 1000.0 * (1 + shift))
    while True:
        d = decide(base, cand, higher_is_better=higher, regression=regression)
        more = next_samples(d, len(cand), cap)
        if not more:
            return d.outcome, len(cand)
        cand += draw(rng, more, 1000.0 * (1 + shift))


@pytest.mark.parametrize("shift", [-0.30, -0.20, -0.10])
def test_clear_slowdowns_are_worse(shift):
    rng = random.Random(7)
    got = [run_to_verdict(rng, shift) for _ in range(200)]
    worse = sum(o is PerfOutcome.WORSE for o, _ in got) / len(got)
    # 3% noise and shared-machine outliers: a 10% slowdown is 5.3% past a 5% allowance, so a few
    # end undecided at the cap (their trial is then restarted, never guessed)
    assert worse >= (0.98 if shift <= -0.2 else 0.90), (shift, worse)
    assert not any(o is PerfOutcome.SAME for o, _ in got)  # a real slowdown is never "same"
    mean_n = sum(n for _, n in got) / len(got)
    assert mean_n <= (3.5 if shift <= -0.2 else 7), mean_n


@pytest.mark.parametrize("shift", [-0.03, 0.0, 0.03, 0.10, 0.30])
def test_small_slowdowns_and_speedups_are_never_worse_and_false_alarms_stay_rare(shift):
    rng = random.Random(11)
    got = [run_to_verdict(rng, shift) for _ in range(300)]
    worse = sum(o is PerfOutcome.WORSE for o, _ in got) / len(got)
    assert worse <= 0.05, (shift, worse)  # the false-alarm rate at equal distributions included
    if shift >= 0.10:
        assert worse == 0.0
    same = sum(o is PerfOutcome.SAME for o, _ in got) / len(got)
    assert same >= (0.5 if shift >= 0 else 0.3), (shift, same)  # mostly decided, not left unknown


def test_latency_lower_is_better_and_the_effect_text():
    rng = random.Random(3)
    base = draw(rng, 5, 0.200)
    slow = draw(rng, 4, 0.260)
    d = decide(base, slow, higher_is_better=False, regression=0.05, metric="latency_p95_s")
    assert d.outcome is PerfOutcome.WORSE and d.effect < -0.2 and d.change > 0.2
    assert "→" in d.reason and "%" in d.reason and "Mann–Whitney" in d.reason
    assert format_effect(1843, 1634, (1634 - 1843) / 1843, (-0.134, -0.092), True, "output_tokens_per_s") == \
        "1843 → 1634 tok/s, −11.3% ± 2.1%"
    assert math.isclose(d.effect_ci[0], d.effect_ci[0]) and d.effect_ci[0] <= d.effect <= d.effect_ci[1]


def test_next_samples_grows_and_stops_at_the_cap():
    base = [1000.0, 1010.0, 990.0, 1005.0, 995.0, 1002.0, 998.0, 1001.0]
    d = decide(base, [955.0, 957.0, 953.0], higher_is_better=True, regression=0.05)
    assert d.outcome is PerfOutcome.UNKNOWN, d.reason  # 4.5% down against a 5% allowance, 3 samples
    assert next_samples(d, 3, 12) == 2 and next_samples(d, 8, 12) == 4 and next_samples(d, 12, 12) == 0
    same = decide([1000.0, 1003.0, 998.0, 1001.0, 997.0], [1000.5, 1001.5, 999.5], higher_is_better=True,
                  regression=0.05)
    assert same.outcome is PerfOutcome.SAME and next_samples(same, 3, 12) == 0


def _starts(rng, shift, k, n, start_sigma=0.02, sample_sigma=0.03):
    out = []
    for _ in range(k):
        off = rng.lognormvariate(0, start_sigma)
        out.append([100 * (1 - shift) * off * rng.lognormvariate(0, sample_sigma) for _ in range(n)])
    return out


def test_start_to_start_noise_does_not_make_an_unchanged_configuration_worse():
    """Each start has its own offset (2%), which its samples cannot see: with start_noise the
    decision does not call an unchanged or an inside-the-allowance configuration worse."""
    import random

    rng = random.Random(11)
    for shift, limit in ((0.0, 0.01), (0.03, 0.05)):  # at the edge (5%) it would be 10%: Z_WORSE
        worse = 0
        for _ in range(300):
            d = decide(_starts(rng, 0.0, 1, 8), _starts(rng, shift, 1, 3), higher_is_better=True, regression=0.05,
                       start_noise=0.02)
            worse += d.outcome is PerfOutcome.WORSE
        assert worse / 300 <= limit, (shift, worse)
    # without the start term the same data are called worse far more often: what it is for
    rng = random.Random(11)
    naive = sum(decide(_starts(rng, 0.0, 1, 8), _starts(rng, 0.03, 1, 3), higher_is_better=True,
                       regression=0.05).outcome is PerfOutcome.WORSE for _ in range(300))
    assert naive / 300 > 0.05, naive


def test_a_clear_slowdown_is_worse_at_once_and_an_edge_case_is_decided_by_more_starts():
    import random

    rng = random.Random(5)
    assert all(decide(_starts(rng, 0.0, 1, 8), _starts(rng, 0.20, 1, 3), higher_is_better=True, regression=0.05,
                      start_noise=0.02).outcome is PerfOutcome.WORSE for _ in range(50))
    # a 12% slowdown: one start is often undecided (the start offset may explain part of it);
    # pooling four starts of it decides more often than one does
    one = four = 0
    for _ in range(100):
        ref = _starts(rng, 0.0, 1, 8)
        starts = _starts(rng, 0.12, 4, 3)
        one += decide(ref, starts[:1], higher_is_better=True, regression=0.05,
                      start_noise=0.02).outcome is PerfOutcome.WORSE
        four += decide(ref, starts, higher_is_better=True, regression=0.05,
                       start_noise=0.02).outcome is PerfOutcome.WORSE
    assert four > one, (one, four)
    # more samples of one start stop helping once the start term dominates (a restart can)
    d = decide([[100.0, 100.5, 99.5, 100.2, 99.8, 100.1, 99.9, 100.0]], [[91.0, 91.2, 90.8, 91.1, 90.9, 91.0]],
               higher_is_better=True, regression=0.05, start_noise=0.02)
    assert d.sampling_share < 0.25 and next_samples(d, 6, 16) == 0
