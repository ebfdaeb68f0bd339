"""Slower or not: the three-valued decision of a perf probe, after Chromium Pinpoint's compare.

A configuration's samples are compared with the baseline's (both measured in the same run). Two
tests of "same distribution" are run, as Pinpoint does: Mann–Whitney U (a shift of the middle) and
Kolmogorov–Smirnov (any difference of shape, e.g. a new slow tail); ``p`` is the smaller of the
two. The effect is the relative change of the median, signed so that **negative is worse** (fewer
tokens/s, or more seconds of latency). Then the candidate is moved to where the allowance ends
(tokens/s divided by ``1 - regression``, seconds multiplied by it) and tested against the
baseline, one-sided, with the same rank test:

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

That fixed-sample rule (``decide``) judges a guard's or a revert's cost. A bisection, whose
"worse" names a delta, is judged by ``decide_sequential`` (sequential probability ratio tests on
the starts, below): samples within a start while they can still decide, then ``next_step`` says
which new start helps most, of the candidate or of the reference.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from statistics import median
from typing import Sequence, Union

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
    sampling_share: float = 1.0  # the part of the uncertainty more samples of this start can shrink


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


Samples = Union[Sequence[float], Sequence[Sequence[float]]]  # flat, or one group per process start


def _groups(x: Samples) -> list[list[float]]:
    items = list(x)
    if items and isinstance(items[0], (list, tuple)):
        return [[float(v) for v in g] for g in items if len(g)]
    return [[float(v) for v in items]] if items else []


@dataclass(frozen=True)
class StartAware:
    """The comparison at the level of process starts: each start's mean log-metric, their mean per
    side; its standard error counts ``start_noise`` once per start and the samples' own spread."""

    goodness: float  # log ratio candidate/baseline, signed so that negative is worse
    edge: float  # the allowance on the same scale
    se: float
    z: float  # (goodness - edge) / se: below -Z_WORSE is worse beyond the allowance
    sampling_share: float  # the part of se^2 more samples of this start could still shrink


Z_WORSE = 1.2816  # one-sided 10%, as ALPHA_WORSE
# "same" at the start level needs the configuration inside the allowance by this many standard
# errors: a bad configuration called same misleads the search (it reads as an exonerating pass),
# so this side is not at zero either; what is left between the two is unknown (a new start)
Z_SAME = 0.5
# "worse" from a single start of the candidate needs it beyond the allowance by this many standard
# errors. Between Z_WORSE and this, one start is not enough: a start that was unlucky (a loaded host,
# a start noise above the declared one) would otherwise name an innocent delta on one measurement
# (seen: an innocent measured -8% at -1.7 se on a loaded machine, named beside the real culprit).
# The trial is left undecided and retried on a new start, pooled with this one.
Z_WORSE_ONE_START = 2.5


def start_aware(b: list[list[float]], c: list[list[float]], *, higher_is_better: bool, regression: float,
                start_noise: float) -> StartAware | None:
    if any(v <= 0 for g in b + c for v in g):
        return None  # a log scale needs positive values (a metric of 0 is a broken stack, not a speed)
    lb = [[math.log(v) for v in g] for g in b]
    lc = [[math.log(v) for v in g] for g in c]
    means_b = [sum(g) / len(g) for g in lb]
    means_c = [sum(g) / len(g) for g in lc]
    ss = sum((v - m) ** 2 for gs, ms in ((lb, means_b), (lc, means_c)) for g, m in zip(gs, ms) for v in g)
    df = sum(len(g) - 1 for g in lb + lc)
    within = max(0.005, math.sqrt(ss / df)) if df > 0 else 0.03  # sample noise, log scale (floored)

    def var(groups: list[list[float]]) -> tuple[float, float]:
        k = len(groups)
        return (k * start_noise ** 2 / k ** 2, sum(within ** 2 / len(g) for g in groups) / k ** 2)

    (sb, wb), (sc, wc) = var(lb), var(lc)
    se = math.sqrt(sb + wb + sc + wc)
    d = sum(means_c) / len(means_c) - sum(means_b) / len(means_b)
    goodness = d if higher_is_better else -d
    edge = math.log(1 - regression) if higher_is_better else -math.log(1 + regression)
    return StartAware(goodness, edge, se, (goodness - edge) / se if se > 0 else 0.0,
                      (wb + wc) / (se ** 2) if se > 0 else 0.0)


def decide(baseline: Samples, candidate: Samples, *, higher_is_better: bool, regression: float,
           alpha_worse: float = ALPHA_WORSE, alpha_same: float = ALPHA_SAME, metric: str = "",
           start_noise: float = 0.0, one_start_z: float | None = None) -> PerfDecision:
    """`baseline`, `candidate`: the samples, flat (one start) or grouped by process start.
    `start_noise`: the relative spread of the metric between starts of one configuration. The
    samples of one start cannot see it (they share the start's luck), so with it "worse" also needs
    the start-level comparison to be beyond the allowance by Z_WORSE standard errors, and more
    samples are only asked for while they can still help; otherwise a new start (a retry) can.
    `one_start_z` (a bisection passes Z_WORSE_ONE_START: its "worse" names a delta): a candidate
    measured in one start only is called worse only that many standard errors beyond the allowance;
    closer, it is undecided until a second start."""
    gb, gc = _groups(baseline), _groups(candidate)
    b, c = [v for g in gb for v in g], [v for g in gc for v in g]
    if not b or not c:
        raise ValueError("decide needs samples on both sides")
    bm, cm = median(b), median(c)
    effect = _effect(bm, cm, higher_is_better)
    ci = _bootstrap_ci(b, c, higher_is_better)
    p_u, p_ks = mann_whitney_u(b, c), kolmogorov_smirnov(b, c)
    # The allowance is built into the tests: the candidate, moved to where the allowance ends
    # (divided by (1 - regression) for a metric where higher is better), must still be below the
    # baseline (worse), or above it (same). So a slowdown just inside the allowance is rarely called
    # worse, whatever the noise.
    edge = 1 / (1 - regression) if higher_is_better else 1 - regression
    good = (lambda v: v) if higher_is_better else (lambda v: -v)  # larger = better, in both metrics
    c_edge = [good(v * edge) for v in c]
    gbv = [good(v) for v in b]
    p_worse = mann_whitney_less(gbv, c_edge)  # the candidate at the edge tends to be smaller
    p_same = mann_whitney_less(c_edge, gbv)  # the baseline tends to be smaller than it
    sa = start_aware(gb, gc, higher_is_better=higher_is_better, regression=regression,
                     start_noise=start_noise) if start_noise > 0 else None
    rank_worse = p_worse < alpha_worse and min(p_u, p_ks) < alpha_worse
    share = sa.sampling_share if sa is not None else 1.0
    if rank_worse and sa is not None and one_start_z is not None and len(gc) == 1 and -one_start_z <= sa.z < -Z_WORSE:
        outcome = PerfOutcome.UNKNOWN
        why = (f"worse in this one start, but by less than {one_start_z:g} se beyond the {regression:.0%} "
               "allowed: a second start decides")
        share = 0.0  # more samples of this start cannot settle its luck: a new start can
    elif rank_worse and (sa is None or sa.z < -Z_WORSE):
        outcome, why = PerfOutcome.WORSE, f"worse than the {regression:.0%} allowed"
    elif (p_same < alpha_same and (sa is None or sa.z > 0)) or (sa is not None and sa.z > Z_SAME and not rank_worse):
        outcome = PerfOutcome.SAME
        why = "faster than the baseline" if ci[0] > 0 else f"within the {regression:.0%} allowed"
    else:
        outcome, why = PerfOutcome.UNKNOWN, f"not yet distinguishable from a {regression:.0%} regression"
    change = (cm - bm) / abs(bm) if bm else 0.0
    text = format_effect(bm, cm, change, ci, higher_is_better, metric)
    starts = ""
    if sa is not None:
        starts = (f"; {len(gc)} vs {len(gb)} start(s) at {start_noise:.0%} start noise: {sa.z:+.1f} se from the "
                  "allowance")
    reason = f"{text}: {why} (Mann–Whitney p={p_u:.3f}, KS p={p_ks:.3f}; {len(c)} vs {len(b)} samples{starts})"
    return PerfDecision(outcome, effect, ci, change, bm, cm, p_u, p_ks, len(b), len(c), reason, share)


# --- the sequential rule of a bisection --------------------------------------------------------
#
# A bisection's "worse" names a delta, and a sample within a start costs seconds where a new start
# costs minutes. So its judge runs sequential probability ratio tests (Wald) on the start-level
# comparison, d ~ N(goodness, se^2), d the difference of the starts' mean log-metric:
#
# * worse: "twice the allowance down" (as far beyond the allowance as "no change" is inside it)
#   against "no change", log-likelihood ratio 2 w (edge - d) / se^2 with w = -edge, at or above
#   log(1 / SEQ_ALPHA_WORSE);
# * same: "the slowdown searched for" against "no change", at or below log(SEQ_ALPHA_SAME). The
#   slowdown searched for is the one current (the largest configuration judged worse) measured,
#   less one standard error (it was judged worse because it looked slow: its estimate leans
#   large), and at least twice the allowance: a bisection looks for that effect, so a configuration is
#   cleared once it is surely not that slow (Pinpoint's "same" threshold likewise grows with the
#   size of the regression looked for). A slowdown beyond the allowance but well below current's
#   may be called either way; one near current's is not called same.
#
# The ratios grow with every sample and every start, and each test stops at its boundary. Between
# them more samples of this start are taken while they can still cross one; when the starts' own
# spread is what is left, a new start is asked for: of the reference (the baseline) when that
# shrinks the uncertainty at least as much as one more of the candidate, since every later
# comparison shares it, else of the candidate.
SEQ_ALPHA_WORSE = 0.002  # per comparison: a run judges a few innocent configurations, against one reference
SEQ_ALPHA_SAME = 0.005  # a configuration with the slowdown called same: the search reads it as a pass
MAX_REFERENCE_STARTS = 4  # starts of the reference a bisection may take (the first included)


@dataclass(frozen=True)
class Sequential:
    """Where a start-level comparison stands in the sequential tests."""

    goodness: float  # the estimate: log ratio candidate/reference, negative = worse
    se: float
    llr_worse: float  # >= upper: worse
    llr_same: float  # <= lower: same
    upper: float
    lower: float
    samples_can_decide: bool  # more samples of the candidate's last start could cross a boundary
    reference_var: float  # the parts of se^2 from the reference's starts and from the candidate's
    candidate_var: float
    reference_starts: int
    candidate_starts: int

    @property
    def start_to_take(self) -> str:
        """"reference" or "candidate": the new start that shrinks the uncertainty more (the
        reference on a tie: every later comparison shares it)."""
        ref_gain = self.reference_var / (self.reference_starts + 1)
        cand_gain = self.candidate_var / (self.candidate_starts + 1)
        if self.reference_starts < MAX_REFERENCE_STARTS and ref_gain >= cand_gain:
            return "reference"
        return "candidate"


def _llr(g: float, bad: float, var: float) -> float:
    """Log-likelihood ratio of goodness ``bad`` over 0 for an estimate ``g`` of variance ``var``."""
    return bad * (2 * g - bad) / (2 * var) if var > 0 else 0.0


def sequential(b: list[list[float]], c: list[list[float]], *, higher_is_better: bool, regression: float,
               start_noise: float, max_samples: int, target: float | None = None) -> Sequential | None:
    """The sequential tests on grouped samples (one group per start); ``target``: the goodness
    (log ratio, negative) current measured. None without a log scale."""
    if any(v <= 0 for g in b + c for v in g) or not b or not c:
        return None
    lb = [[math.log(v) for v in g] for g in b]
    lc = [[math.log(v) for v in g] for g in c]
    within = _within(lb + lc)
    kb, kc = len(lb), len(lc)
    ref_var = start_noise ** 2 / kb + sum(within ** 2 / len(g) for g in lb) / kb ** 2
    cand_var = start_noise ** 2 / kc + sum(within ** 2 / len(g) for g in lc) / kc ** 2
    d = sum(sum(g) / len(g) for g in lc) / kc - sum(sum(g) / len(g) for g in lb) / kb
    goodness = d if higher_is_better else -d
    edge = math.log(1 - regression) if higher_is_better else -math.log(1 + regression)
    searched = min(2 * edge, target if target is not None else 0.0)
    upper, lower = math.log(1 / SEQ_ALPHA_WORSE), math.log(SEQ_ALPHA_SAME)
    var = ref_var + cand_var
    m = len(lc[-1])
    left = within ** 2 * max(0.0, 1 / m - 1 / max(m, max_samples)) / kc ** 2  # what more samples remove
    # more samples can decide if, at the smallest se they allow and with the estimate moved by two
    # standard errors of what they add, a boundary is crossed (samples cost seconds)
    move = 2 * math.sqrt(left)
    can = left > 0 and (_llr(goodness - move, 2 * edge, var - left) >= upper
                        or _llr(goodness + move, searched, var - left) <= lower)
    return Sequential(goodness, math.sqrt(var), _llr(goodness, 2 * edge, var), _llr(goodness, searched, var), upper,
                      lower, can,
                      ref_var, cand_var, kb, kc)


def _within(groups: list[list[float]]) -> float:
    """The samples' own spread within a start (log scale, pooled over the starts; floored)."""
    ss = sum((v - sum(g) / len(g)) ** 2 for g in groups for v in g)
    df = sum(len(g) - 1 for g in groups)
    return max(0.005, math.sqrt(ss / df)) if df > 0 else 0.03


def decide_sequential(baseline: Samples, candidate: Samples, *, higher_is_better: bool, regression: float,
                      start_noise: float, max_samples: int, target: float | None = None, metric: str = ""
                      ) -> tuple[PerfDecision, Sequential | None]:
    """A bisection's decision (see above): worse, same, or unknown while the sequential test is
    between its boundaries. Worse also needs the rank tests to see a difference at all (min of the
    Mann–Whitney and KS p below ALPHA_WORSE), so that a few outlying samples cannot name a delta."""
    gb, gc = _groups(baseline), _groups(candidate)
    b, c = [v for g in gb for v in g], [v for g in gc for v in g]
    if not b or not c:
        raise ValueError("decide needs samples on both sides")
    seq = sequential(gb, gc, higher_is_better=higher_is_better, regression=regression,
                     start_noise=max(start_noise, 1e-4), max_samples=max_samples, target=target)
    if seq is None:  # no log scale: the rank rule alone
        return decide(baseline, candidate, higher_is_better=higher_is_better, regression=regression,
                      metric=metric), None
    bm, cm = median(b), median(c)
    ci = _bootstrap_ci(b, c, higher_is_better)
    p_u, p_ks = mann_whitney_u(b, c), kolmogorov_smirnov(b, c)
    share = 1.0 if seq.samples_can_decide else 0.0
    if seq.llr_worse >= seq.upper and min(p_u, p_ks) < ALPHA_WORSE:
        outcome, why = PerfOutcome.WORSE, f"worse than the {regression:.0%} allowed"
    elif seq.llr_same <= seq.lower:
        outcome = PerfOutcome.SAME
        why = "faster than the baseline" if ci[0] > 0 else f"within the {regression:.0%} allowed"
    else:
        outcome, why = PerfOutcome.UNKNOWN, f"not yet distinguishable from a {regression:.0%} regression"
    change = (cm - bm) / abs(bm) if bm else 0.0
    reason = (f"{format_effect(bm, cm, change, ci, higher_is_better, metric)}: {why} (Mann–Whitney p={p_u:.3f}, "
              f"KS p={p_ks:.3f}; {len(c)} vs {len(b)} samples; {len(gc)} vs {len(gb)} start(s) at {start_noise:.0%} "
              f"start noise: log-likelihood ratios {seq.llr_worse:+.1f} (worse at {seq.upper:+.1f}), "
              f"{seq.llr_same:+.1f} (same at {seq.lower:+.1f}))")
    return PerfDecision(outcome, _effect(bm, cm, higher_is_better), ci, change, bm, cm, p_u, p_ks, len(b), len(c),
                        reason, share), seq


class Step(str, Enum):
    DONE = "done"  # decided
    SAMPLE = "sample"  # more samples of this start
    START_CANDIDATE = "start-candidate"  # undecided: a new start of the candidate (the search's retry)
    START_REFERENCE = "start-reference"  # undecided: a new start of the reference first

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class NextStep:
    step: Step
    samples: int = 0


def next_step(decision: PerfDecision, seq: Sequential | None, n_so_far: int, cap: int) -> NextStep:
    """What a bisection's judge does after a decision: nothing more (decided), more samples of this
    start (about half as many again, up to the cap) while they can still decide, else a new start."""
    if decision.outcome is not PerfOutcome.UNKNOWN:
        return NextStep(Step.DONE)
    if seq is None:
        more = next_samples(decision, n_so_far, cap)
        return NextStep(Step.SAMPLE, more) if more else NextStep(Step.START_CANDIDATE)
    if seq.samples_can_decide and n_so_far < cap:
        return NextStep(Step.SAMPLE, min(cap - n_so_far, max(2, n_so_far // 2)))
    return NextStep(Step.START_REFERENCE if seq.start_to_take == "reference" else Step.START_CANDIDATE)


def next_samples(decision: PerfDecision, n_so_far: int, cap: int) -> int:
    """More samples for an unknown decision: about half as many again (at least 2), up to the cap;
    none when what is left undecided is the starts' own spread (more samples of this start cannot
    shrink it: a new start can, so the trial is left unresolved and retried)."""
    if decision.outcome is not PerfOutcome.UNKNOWN or n_so_far >= cap or decision.sampling_share < 0.25:
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
