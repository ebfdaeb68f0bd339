"""Hints order the tests and never replace an observation (search/hints.py, Judge._middle): with
an adversarial prior the verdict is the same and the worst case bound holds; with a right one the
bisection spends no more. Pure: an oracle answers the search's requests."""
from __future__ import annotations

import random

import pytest

from search_oracle import answer

from envbisect.search import POLICIES, Verdict, restart_bound
from envbisect.search.hints import KnobClass, knob_class, suspicion_of


def play(policy, units, bad, suspicion=None, detection=1.0, seed=0):
    rng = random.Random(seed)
    s = POLICIES[policy].search(units, suspicion=suspicion)
    for _ in range(200):
        step = s.next()
        if isinstance(step, Verdict):
            return step, s.trials
        s.observe(answer(step, bad(step.config), rng, detection))
    raise AssertionError("no verdict")


def names(n):
    return [f"u{i}" for i in range(n)]


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("n", [5, 7, 8, 12, 16])
def test_an_adversarial_prior_changes_no_verdict_and_keeps_the_bound(policy, n):
    """Every unit but the culprit 400 times as suspect (and, the other way, only the culprit): the
    verdict is the one without a prior, the restarts stay within restart_bound(n), and neither the
    worst case nor the total over the culprit's positions grows with the right prior."""
    plain, wrong, right = [], [], []
    for c in range(n):
        culprit = f"u{c}"
        v0, r0 = play(policy, names(n), lambda cfg: culprit in cfg)
        adversarial = {u: (0.01 if u == culprit else 4.0) for u in names(n)}
        v1, r1 = play(policy, names(n), lambda cfg: culprit in cfg, adversarial)
        helpful = {u: (4.0 if u == culprit else 0.25) for u in names(n)}
        v2, r2 = play(policy, names(n), lambda cfg: culprit in cfg, helpful)
        for v in (v0, v1, v2):
            assert v.kind == "culprit" and v.culprits == (culprit,), (policy, n, c, v)
        assert r1 <= restart_bound(n) and r2 <= restart_bound(n), (policy, n, c, r1, r2)
        plain.append(r0), wrong.append(r1), right.append(r2)
    assert max(wrong) <= max(plain) and max(right) <= max(plain), (plain, wrong, right)
    assert sum(right) <= sum(plain), (plain, right)


@pytest.mark.parametrize("policy", ["confirm", "thorough"])
def test_an_adversarial_prior_on_a_pair_keeps_the_interaction_bound(policy):
    n = 8
    for a in range(n):
        for b in range(a + 1, n):
            pair = {f"u{a}", f"u{b}"}
            adversarial = {u: (0.01 if u in pair else 4.0) for u in names(n)}
            v, r = play(policy, names(n), lambda cfg: pair <= set(cfg), adversarial)
            v0, _ = play(policy, names(n), lambda cfg: pair <= set(cfg))
            assert v.kind == v0.kind == "interaction" and set(v.culprits) == pair, (a, b, v)
            assert r <= restart_bound(n, "interaction"), (a, b, r)


def test_an_adversarial_prior_never_blames_an_innocent_when_the_fault_is_intermittent():
    n = 8
    for seed in range(60):
        culprit = f"u{seed % n}"
        adversarial = {u: (0.01 if u == culprit else 4.0) for u in names(n)}
        v, _ = play("confirm", names(n), lambda cfg: culprit in cfg, adversarial, detection=0.5, seed=seed)
        assert v.kind in ("culprit", "inconclusive") and set(v.culprits) <= {culprit}, (seed, v)


def test_a_prior_weight_must_be_positive():
    with pytest.raises(ValueError):
        POLICIES["confirm"].search(names(3), suspicion={"u0": 0.0})


def test_knob_classes_and_suspicion():
    assert knob_class("NCCL_DEBUG") is KnobClass.LOGGING and knob_class("ROUTER_LOG_LEVEL") is KnobClass.LOGGING
    assert knob_class("SGLANG_MODEL_PATH") is KnobClass.PATH and knob_class("SGLANG_TP_SIZE") is KnobClass.LAYOUT
    assert knob_class("SGLANG_SM120_MMA_TARGET_CTAS") is KnobClass.TUNING
    units = {"prefill:NCCL_DEBUG": ("prefill:NCCL_DEBUG",), "decode:SGLANG_X": ("decode:SGLANG_X",),
             "prefill:SGLANG_Y": ("prefill:SGLANG_Y",)}
    assert suspicion_of(units, failing=["decode"]) == {"prefill:NCCL_DEBUG": 0.25, "decode:SGLANG_X": 4.0,
                                                       "prefill:SGLANG_Y": 1.0}
