"""Slower or not: the three-valued decision of a perf probe, after Chromium Pinpoint's compare.

A configuration's samples are compared with the baseline's (both measured in the same run). Two
tests of "same distribution" are run, as Pinpoint does: Mann–Whitney U (a shift of the middle) and
Kolmogorov–Smirnov (any difference of shape, e.g. a new slow tail); ``p`` is the smaller of the
two. The effect is the relative change of the median, signed so that **negative is worse** (fewer
tokens/s, or more seconds of latency). Then the candidate is moved to where the allowance ends (tokens/s divided by ``1 - regression``,
seconds multiplied by it) and tested against the baseline, one-sided, with the same rank test:

* **worse**: the moved candidate is still below the baseline (``p < 0.10``), and the unmoved one
  differs from it (``min(p_MWU, p_KS) < 0.10``): measurably worse by more than the allowance;
* **same**: the moved candidate is above the baseline (``p < 0.05``): whatever the difference
  is, it is within the allowance (a speed-up is *same* for the search -- not a regression -- and
  the effect says it is faster);
* **unknown** otherwise: take more samples (``next_samples``: about half as many again, up to a
  cap); an undecided comparison is never turned into a pass or a fail.

Because the allowance sits inside the test, a configuration exactly at the allowance is called
worse in at most 10% of comparisons, one just inside it far less often, and one that is no slower
almost never (measured in tests/test_perf_decision.py: 0-1% at equal distributions; a 3% slowdown
with 5% allowed: at most 4% at 3% noise). The baseline is the reference: 8 samples
(``REFERENCE_SAMPLES``), since it cannot be sampled again once the stack has moved on; a
candidate starts with 3. A bootstrap of the median ratio (seeded) gives the ``±`` shown.
Stdlib only, deterministic.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from statistics import median
from typing import Sequence

ALPHA_WORSE = 0.10
ALPHA_SAME = 0.05
CI_LEVEL = 0.90
BOOTSTRAP = 600
REFERENCE_SAMPLES = 8  # the baseline's samples: it cannot be sampled again once the stack moved on


class PerfOutcome(str, Enum):
    SAME = "same"
    WORSE = "worse"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class PerfDecision:
    outcome: PerfOutcome
    effect: float  # relative change of the median, negative = worse
    effect_ci: tuple[float, float]  # its CI_LEVEL interval (same sign convention)
    change: float  # the metric's own relative change (tokens/s down = negative; latency up = positive)
    baseline_median: float
    candidate_median: float
    p_mann_whitney: float
    p_kolmogorov_smirnov: float
    n_baseline: int
    n_candidate: int
    reason: str


# --- the two tests ---------------------------------------------------------------------------

def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


@lru_cache(maxsize=256)
def _u_counts(n1: int, n2: int) -> tuple[int, ...]:
    """How many arrangements give each U (0..n1*n2), no ties: the exact null distribution."""
    # f[i][j][u]: arrangements of i x's and j y's with U = u, built one element at a time
    prev = [[1] for _ in range(n2 + 1)]  # i = 0: U is 0 whatever j
    for i in range(1, n1 + 1):
        cur = [[1]]  # j = 0
        for j in range(1, n2 + 1):
            size = i * j + 1
            row = [0] * size
            a = cur[j - 1]  # the last element is a y: U unchanged
            for u, c in enumerate(a):
                row[u] += c
            b = prev[j]  # the last element is an x: it beats all j y's
            for u, c in enumerate(b):
                row[u + j] += c
            cur.append(row)
        prev = cur
    return tuple(prev[n2])


def _u_of(x: Sequence[float], y: Sequence[float]) -> float:
    """U of y: the pairs (x_i, y_j) with y_j > x_i (a tie counts one half)."""
    ranks = _ranks(list(x) + list(y))
    ny = len(y)
    return sum(ranks[len(x):]) - ny * (ny + 1) / 2


def _p_u_at_most(u: float, n1: int, n2: int, values: Sequence[float]) -> float:
    """P(U <= u) under the null: exact without ties for small samples, else normal with tie and
    continuity corrections."""
    if len(set(values)) == n1 + n2 and n1 + n2 <= 30:
        counts = _u_counts(n1, n2)
        return sum(counts[: int(math.floor(u + 1e-9)) + 1]) / sum(counts)
    n = n1 + n2
    groups: dict[float, int] = {}
    for v in values:
        groups[v] = groups.get(v, 0) + 1
    tie_term = sum(t ** 3 - t for t in groups.values()) / (n * (n - 1))
    var = n1 * n2 / 12 * ((n + 1) - tie_term)
    if var <= 0:
        return 1.0
    z = (u + 0.5 - n1 * n2 / 2) / math.sqrt(var)
    return min(1.0, 0.5 * math.erfc(-z / math.sqrt(2)))


def mann_whitney_u(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the Mann–Whitney U test: exact without ties for small samples, else
    the normal approximation with tie and continuity corrections."""
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        return 1.0
    u = _u_of(a, b)
    lo = min(u, n1 * n2 - u)
    return min(1.0, 2 * _p_u_at_most(lo, n1, n2, list(a) + list(b)))


def mann_whitney_less(x: Sequence[float], y: Sequence[float]) -> float:
    """One-sided p-value for "y tends to be smaller than x" (Mann–Whitney)."""
    if not x or not y:
        return 1.0
    return _p_u_at_most(_u_of(x, y), len(x), len(y), list(x) + list(y))


def _ks_statistic(a: Sequence[float], b: Sequence[float]) -> float:
    xs = sorted(set(a) | set(b))
    sa, sb = sorted(a), sorted(b)
    d = 0.0
    ia = ib = 0
    for x in xs:
        while ia < len(sa) and sa[ia] <= x:
            ia += 1
        while ib < len(sb) and sb[ib] <= x:
            ib += 1
        d = max(d, abs(ia / len(sa) - ib / len(sb)))
    return d


def kolmogorov_smirnov(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the two-sample Kolmogorov–Smirnov test: exact (lattice paths that stay
    inside the band) for small samples, else Kolmogorov's asymptotic with Stephens' correction."""
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        return 1.0
    d = _ks_statistic(a, b)
    if d == 0:
        return 1.0
    if n1 * n2 <= 10_000:
        eps = 1e-9
        row = [1.0] + [0.0] * n2
        for j in range(1, n2 + 1):  # i = 0
            row[j] = row[j - 1] if abs(0 - j / n2) < d - eps else 0.0
        for i in range(1, n1 + 1):
            new = [row[0] if abs(i / n1) < d - eps else 0.0] + [0.0] * n2
            for j in range(1, n2 + 1):
                new[j] = (row[j] + new[j - 1]) if abs(i / n1 - j / n2) < d - eps else 0.0
            row = new
        inside = row[n2] / math.comb(n1 + n2, n1)
        return min(1.0, max(0.0, 1.0 - inside))
    en = math.sqrt(n1 * n2 / (n1 + n2))
    lam = (en + 0.12 + 0.11 / en) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return min(1.0, max(0.0, p))


# --- the decision ----------------------------------------------------------------------------

def _effect(base_med: float, cand_med: float, higher_is_better: bool) -> float:
    if base_med == 0:
        return 0.0
    change = (cand_med - base_med) / abs(base_med)
    return change if higher_is_better else -change


def _bootstrap_ci(baseline: Sequence[float], candidate: Sequence[float], higher_is_better: bool) -> tuple[float, float]:
    rng = random.Random(20261203 + 7 * len(baseline) + len(candidate))  # deterministic per sample counts
    effects = []
    for _ in range(BOOTSTRAP):
        b = [baseline[rng.randrange(len(baseline))] for _ in baseline]
        c = [candidate[rng.randrange(len(candidate))] for _ in candidate]
        effects.append(_effect(median(b), median(c), higher_is_better))
    effects.sort()
    lo = effects[int((1 - CI_LEVEL) / 2 * (BOOTSTRAP - 1))]
    hi = effects[int((1 + CI_LEVEL) / 2 * (BOOTSTRAP - 1))]
    return lo, hi


def decide(baseline: Sequence[float], candidate: Sequence[float], *, higher_is_better: bool, regression: float,
           alpha_worse: float = ALPHA_WORSE, alpha_same: float = ALPHA_SAME, metric: str = "") -> PerfDecision:
    b, c = [float(x) for x in baseline], [float(x) for x in candidate]
    if not b or not c:
        raise ValueError("decide needs samples on both sides")
    bm, cm = median(b), median(c)
    effect = _effect(bm, cm, higher_is_better)
    ci = _bootstrap_ci(b, c, higher_is_better)
    p_u, p_ks = mann_whitney_u(b, c), kolmogorov_smirnov(b, c)
    # The allowance is built into the tests: the candidate, moved by the allowed regression towards
    # "better", must still be below the baseline (worse), or, moved towards "worse", still above
    # it (same). So a slowdown just inside the allowance is rarely called worse, whatever the noise.
    # The candidate is moved to where the allowance ends: divided by (1 - regression) for a metric
    # where higher is better. Worse: still below the baseline; same: above it.
    edge = 1 / (1 - regression) if higher_is_better else 1 - regression
    good = (lambda v: v) if higher_is_better else (lambda v: -v)  # larger = better, in both metrics
    c_edge = [good(v * edge) for v in c]
    gb = [good(v) for v in b]
    p_worse = mann_whitney_less(gb, c_edge)  # the candidate at the edge tends to be smaller
    p_same = mann_whitney_less(c_edge, gb)  # the baseline tends to be smaller than it
    if p_worse < alpha_worse and min(p_u, p_ks) < alpha_worse:
        outcome, why = PerfOutcome.WORSE, f"worse than the {regression:.0%} allowed"
    elif p_same < alpha_same:
        outcome = PerfOutcome.SAME
        why = "faster than the baseline" if ci[0] > 0 else f"within the {regression:.0%} allowed"
    else:
        outcome, why = PerfOutcome.UNKNOWN, f"not yet distinguishable from a {regression:.0%} regression"
    change = (cm - bm) / abs(bm) if bm else 0.0
    text = format_effect(bm, cm, change, ci, higher_is_better, metric)
    reason = f"{text}: {why} (Mann–Whitney p={p_u:.3f}, KS p={p_ks:.3f}; {len(c)} vs {len(b)} samples)"
    return PerfDecision(outcome, effect, ci, change, bm, cm, p_u, p_ks, len(b), len(c), reason)


def next_samples(decision: PerfDecision, n_so_far: int, cap: int) -> int:
    """More samples for an unknown decision: about half as many again (at least 2), up to the cap."""
    if decision.outcome is not PerfOutcome.UNKNOWN or n_so_far >= cap:
        return 0
    return min(cap - n_so_far, max(2, n_so_far // 2))


def format_effect(base_med: float, cand_med: float, change: float, ci: tuple[float, float],
                  higher_is_better: bool, metric: str = "") -> str:
    """ "1843 → 1634 tok/s, −11.3% ± 2.1%": the medians and the metric's own change, with the
    half-width of the effect's interval."""
    unit = {"output_tokens_per_s": " tok/s"}.get(metric, " s" if metric.endswith("_s") else "")
    half = (ci[1] - ci[0]) / 2 * 100
    sign = "+" if change >= 0 else "−"
    return f"{base_med:.4g} → {cand_med:.4g}{unit}, {sign}{abs(change) * 100:.1f}% ± {half:.1f}%"
