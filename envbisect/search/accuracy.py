"""The accuracy decision of an `answers` probe: is a configuration's accuracy below the baseline's?

The baseline's accuracy is measured in the same run (k0 of n0 prompts answered right). A
configuration passes unless an exact one-sided binomial test rejects, at `alpha`, that its accuracy
is at least the threshold: the baseline's accuracy minus `tolerance`. The tolerance absorbs the
baseline's own sampling noise and the alpha the candidate's, so that equal accuracies are not told
apart by luck (an innocent change is never named), while a drop well beyond the tolerance (95% to
60% over 100 prompts) is far below alpha. Pure: no I/O, no randomness.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import exp, lgamma, log

ALPHA_WORSE = 1e-3  # a bisection asks several configurations: each "worse" must be very unlikely by luck


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), exactly."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    # in logs: comb(n, i) overflows a float long before n is large
    lp, lq = log(p), log(1 - p)
    head = lgamma(n + 1)
    return min(1.0, sum(exp(head - lgamma(i + 1) - lgamma(n - i + 1) + i * lp + (n - i) * lq) for i in range(k + 1)))


@dataclass(frozen=True)
class AccuracyDecision:
    worse: bool
    accuracy: float  # the configuration's
    reference: float  # the baseline's
    threshold: float  # reference - tolerance
    p_value: float  # P(this few right or fewer | accuracy = threshold)
    text: str


def decide_accuracy(ref_right: int, ref_total: int, right: int, total: int, *, tolerance: float,
                    alpha: float = ALPHA_WORSE) -> AccuracyDecision:
    if ref_total <= 0 or total <= 0:
        raise ValueError("an accuracy needs at least one answer on each side")
    ref = ref_right / ref_total
    acc = right / total
    threshold = max(0.0, ref - tolerance)
    p = binom_cdf(right, total, threshold)
    worse = p < alpha
    text = (f"accuracy {acc:.1%} ({right}/{total}) against the baseline's {ref:.1%} ({ref_right}/{ref_total}): "
            + (f"below {threshold:.1%} (the baseline less {tolerance:.0%}) beyond chance (binomial p = {p:.2g} < "
               f"{alpha:g})" if worse else
               f"not shown below {threshold:.1%} (the baseline less {tolerance:.0%}; binomial p = {p:.2g})"))
    return AccuracyDecision(worse, acc, ref, threshold, p, text)
