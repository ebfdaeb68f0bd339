"""Twins inside the plan: a unit that holds one change in two services is split by the trial that
asks whether it breaks the stack alone, not by extra restarts after the verdict (search/hints.py,
stages.SplitTwin). Pure: an oracle over deltas answers the search's requests."""
from __future__ import annotations

import random

import pytest

from envbisect.search import POLICIES, Observation, Verdict
from envbisect.search.hints import fold, member_units, twins_of

INNOCENT = [f"u{i}" for i in range(6)]
TWIN = "linked:X"
SIDES = ("decode:X", "prefill:X")


def play(policy, units, bad, twins=None, detection=1.0, seed=0):
    """(verdict, restarts, requests) of a search whose trials an oracle over deltas answers."""
    rng = random.Random(seed)
    table = {TWIN: SIDES, **member_units(twins or {})}
    s = POLICIES[policy].search(units, twins=twins)
    requests = []
    for _ in range(100):
        step = s.next()
        if isinstance(step, Verdict):
            return step, s.trials, requests
        requests.append((sorted(step.config), step.probes, step.purpose))
        deltas = frozenset(d for u in step.config for d in table.get(u, (u,)))
        failures = passes = 0
        for _ in range(step.probes):
            if bad(deltas) and rng.random() < detection:
                failures += 1
                if failures >= step.stop_after:
                    break
            else:
                passes += 1
        s.observe(Observation(step.config, passes, failures=failures, free=step.free))
    raise AssertionError("no verdict")


def with_twin(pos):
    return INNOCENT[:pos] + [TWIN] + INNOCENT[pos:]


def without_twin(pos):
    return INNOCENT[:pos] + list(SIDES) + INNOCENT[pos:]


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("side", SIDES)
def test_a_twin_among_8_deltas_costs_no_more_restarts_than_8_separate_deltas(policy, side):
    """The side the hints favour is asked first. With the hint right, over every position of the
    twin: no more restarts at worst, nor in total, than the same 8 deltas without the link; with
    it wrong, one more at worst (a refinement after the verdict cost two). The verdict names the
    same delta either way, and says the other side passed without it."""
    plain, right, wrong = [], [], []
    for pos in range(len(INNOCENT) + 1):
        v, restarts, _ = play(policy, without_twin(pos), lambda d: side in d)
        assert v.kind == "culprit" and v.culprits == (side,)
        plain.append(restarts)
        for failing, costs in ((service_of(side), right), (service_of(other(side)), wrong)):
            twins = twins_of({TWIN: SIDES}, failing=[failing])
            v, restarts, _ = play(policy, with_twin(pos), lambda d: side in d, twins)
            folded, refined = fold(v, twins)
            assert v.kind == "culprit" and v.culprits == (f"member:{side}",), (policy, pos, failing, v)
            assert folded.culprits == (TWIN,) and refined == {TWIN: (side,)}
            if policy != "fast":  # fast infers "no other culprit" (the explanation says so)
                assert f"current without member:{side} passed" in v.explanation, v.explanation
            costs.append(restarts)
    assert max(right) <= max(plain) and sum(right) <= sum(plain), (plain, right)
    assert max(wrong) <= max(plain) + 1, (plain, wrong)


def service_of(delta):
    return delta.split(":")[0]


def other(side):
    return SIDES[1 - SIDES.index(side)]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_an_innocent_twin_is_never_split_and_changes_no_request(policy):
    for pos in range(len(INNOCENT) + 1):
        for culprit in ("u0", "u3", "u5"):
            twins = twins_of({TWIN: SIDES})
            v, _, asked = play(policy, with_twin(pos), lambda d: culprit in d, twins)
            v0, _, asked0 = play(policy, with_twin(pos), lambda d: culprit in d)
            assert asked == asked0 and v == v0 and v.culprits == (culprit,)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_sides_that_must_match_are_both_named(policy):
    """A value both services must agree on: the new value breaks it, and so does either side alone
    (a mismatch). Each side is seen failing alone; the twin is reported whole."""
    twins = twins_of({TWIN: SIDES})
    v, _, _ = play(policy, with_twin(3), lambda d: bool(d & set(SIDES)), twins)
    folded, refined = fold(v, twins)
    assert set(v.culprits) == {f"member:{s}" for s in SIDES}, v
    assert folded.kind == "culprit" and folded.culprits == (TWIN,) and set(refined[TWIN]) == set(SIDES)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_sides_needed_together_are_the_twin(policy):
    twins = twins_of({TWIN: SIDES})
    v, _, _ = play(policy, with_twin(2), lambda d: set(SIDES) <= d, twins)
    folded, refined = fold(v, twins)
    assert v.kind == "interaction" and set(v.culprits) == {f"member:{s}" for s in SIDES}, v
    assert folded.kind == "culprit" and folded.culprits == (TWIN,) and set(refined[TWIN]) == set(SIDES)


def test_an_intermittent_side_never_gets_the_other_side_blamed():
    """Detection 0.5 and a wrong hint: the innocent side is never named, and the twin search is wrong
    no more often than the search that keeps the twin whole."""
    twins = twins_of({TWIN: SIDES}, failing=["prefill"])
    wrong = {True: 0, False: 0}
    for seed in range(100):
        for split in (True, False):
            v, _, _ = play("confirm", with_twin(seed % 7), lambda d: "decode:X" in d, twins if split else None,
                           detection=0.5, seed=seed)
            assert "member:prefill:X" not in v.culprits, (seed, v)
            folded, _ = fold(v, twins)
            wrong[split] += folded.kind != "inconclusive" and folded.culprits != (TWIN,)
    assert wrong[True] <= wrong[False] <= 2, wrong


def test_twins_of_keeps_declared_links_whole_and_puts_the_failing_side_first():
    units = {TWIN: SIDES, "linked:Y": ("decode:Y", "prefill:Y"), "linked:Z": ("a:Z", "b:Z", "c:Z"), "u0": ("u0",)}
    assert twins_of(units, declared=["Y"], failing=["prefill"]) == {TWIN: ("member:prefill:X", "member:decode:X")}
    assert twins_of(units, declared=["Y"]) == {TWIN: ("member:decode:X", "member:prefill:X")}
    assert member_units(twins_of(units)) == {"member:decode:X": ("decode:X",), "member:prefill:X": ("prefill:X",),
                                             "member:decode:Y": ("decode:Y",), "member:prefill:Y": ("prefill:Y",)}


def play_partial_restart(policy, units, twins=None):
    """(verdict, restarts) on a partial restart: the running stack fails (the free probe of current),
    every co-restarted config passes."""
    s = POLICIES[policy].search(units, twins=twins)
    for _ in range(200):
        step = s.next()
        if isinstance(step, Verdict):
            return step, s.trials
        failures = step.stop_after if step.free else 0
        s.observe(Observation(step.config, 0 if failures else step.probes, failures=failures, free=step.free))
    raise AssertionError("no verdict")


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_partial_restart_with_a_twin_costs_no_more_than_the_twin_kept_whole(policy):
    """Every co-restarted config passes, so the bisection ends on the last unit. When that unit is
    a twin whose sides pass alone and together, current is co-restarted next (only the running
    stack failed with it), never one trial per (side, unit) pair. Policy fast, the twin kept
    whole, co-restarts current right after the bisection (confident at once); split, it first
    asks the sides (alone, together: with a retest, four trials)."""
    units = [f"u{i}" for i in range(15)]
    for pos in (0, 7, 15):
        with_link = units[:pos] + [TWIN] + units[pos:]
        v, restarts = play_partial_restart(policy, with_link, twins_of({TWIN: SIDES}))
        v0, restarts0 = play_partial_restart(policy, with_link)
        assert v.kind == v0.kind == "not-reproduced" and not v.culprits, (pos, v)
        assert restarts <= restarts0 + (4 if policy == "fast" else 0), (policy, pos, restarts, restarts0)


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("needs", [set(SIDES), {"decode:X"}], ids=["both-sides", "one-side"])
def test_a_twin_that_needs_a_partner_is_searched_whole_and_its_partner_named(policy, needs):
    """The twin (or one side of it) breaks the stack only with u2. Its sides pass alone and
    together, so its partner is bisected with the twin as one unit: the verdict names u2 and the
    twin (never an innocent unit paired with a side), at most three trials (the sides alone,
    together) over the twin kept whole."""
    twins = twins_of({TWIN: SIDES})
    for pos in (3, 6):
        v, restarts, _ = play(policy, with_twin(pos), lambda d: needs | {"u2"} <= d, twins)
        v0, restarts0, _ = play(policy, with_twin(pos), lambda d: needs | {"u2"} <= d)
        assert v.kind == v0.kind == "interaction" and set(v.culprits) == {"u2", TWIN}, (policy, pos, v)
        assert restarts <= restarts0 + 3, (policy, pos, restarts, restarts0)
