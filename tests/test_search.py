"""Tests of the pure search state machine, against a simulated oracle."""

from __future__ import annotations

import itertools
import math
import random
from typing import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envbisect.search import (
    POLICIES,
    Observation,
    Outcome,
    Prior,
    Search,
    TrialRequest,
    Verdict,
    restart_bound,
)

Truth = Callable[[frozenset], bool]


def names(n: int) -> list[str]:
    return [f"u{i}" for i in range(n)]


def run(search: Search, bad: Truth, *, show: float = 1.0, seed: int = 0, log: list | None = None,
        free_current: bool = True) -> Verdict:
    """Drive ``search`` against an oracle, as the trial runner does: a bad config fails each probe
    run with probability ``show`` (1.0 = deterministic), a good config never fails; runs stop after
    ``stop_after`` failures. ``free_current``: a request marked free (the first premise) is answered
    by probing the running stack (the runner does so when every process runs its files)."""
    rng = random.Random(seed)
    for _ in range(500):
        step = search.next()
        assert step is search.next()  # next() is pure
        if isinstance(step, Verdict):
            return step
        assert isinstance(step, TrialRequest)
        assert 1 <= step.probes <= search.max_probes
        passes = failures = 0
        if bad(step.config):
            for _ in range(step.probes):
                if rng.random() < show:
                    failures += 1
                    if failures >= step.stop_after:
                        break
                else:
                    passes += 1
        else:
            passes = step.probes
        obs = Observation(step.config, passes, failures > 0, failures=failures, free=step.free and free_current)
        if log is not None:
            log.append((step, obs))
        search.observe(obs)
    raise AssertionError("search did not finish")


def single(x: str) -> Truth:
    return lambda c: x in c


def both(x: str, y: str) -> Truth:
    return lambda c: x in c and y in c


def either(*xs: str) -> Truth:
    return lambda c: any(x in c for x in xs)


# --------------------------------------------------------------------------- bounds


@pytest.mark.parametrize("n", range(1, 65))
def test_single_culprit_every_position_within_bound(n: int) -> None:
    """Every position, every n up to 64, the default policy: the culprit, nothing else, within
    ceil(log2 n) + 3 restarts with the first premise free (one more when it is not)."""
    units = names(n)
    for x in units:
        s = POLICIES["confirm"].search(units)
        v = run(s, single(x))
        assert v.kind == "culprit" and v.culprits == (x,), (n, x, v)
        assert v.confidence >= 0.95
        assert s.trials <= restart_bound(n), (n, x, s.trials)
        assert "Inferred" not in v.explanation, v.explanation
        s = POLICIES["confirm"].search(units)
        run(s, single(x), free_current=False)
        assert s.trials <= restart_bound(n) + 1, (n, x, s.trials)


@pytest.mark.parametrize("policy", ["fast", "thorough"])
@pytest.mark.parametrize("n", [2, 3, 7, 16, 33, 64])
def test_single_culprit_other_policies(policy: str, n: int) -> None:
    units = names(n)
    for x in units:
        s = POLICIES[policy].search(units)
        v = run(s, single(x))
        assert v.kind == "culprit" and v.culprits == (x,), (n, x, v)
        assert s.trials <= restart_bound(n), (n, x, s.trials)


@pytest.mark.parametrize("n", [4, 8, 13, 16, 32, 64])
def test_pairs_and_two_culprits_default_policy(n: int) -> None:
    """A pair that fails only together, and two independent culprits: every pair of positions up
    to n = 16, a seeded sample of 60 beyond; right, nothing innocent named, within the bounds."""
    units = names(n)
    pairs = list(itertools.combinations(units, 2))
    if len(pairs) > 120:
        pairs = random.Random(n).sample(pairs, 60)
    for a, b in pairs:
        s = POLICIES["confirm"].search(units)
        v = run(s, both(a, b))
        assert v.kind == "interaction" and set(v.culprits) == {a, b}, (a, b, v)
        assert s.trials <= restart_bound(n, "interaction"), (a, b, s.trials)
        s = POLICIES["confirm"].search(units)
        v = run(s, either(a, b))
        assert v.kind == "culprit" and set(v.culprits) == {a, b}, (a, b, v)
        assert s.trials <= restart_bound(n, "several"), (a, b, s.trials)


def test_restart_bound_values() -> None:
    assert [restart_bound(n) for n in (1, 2, 3, 4, 5, 8, 13, 16, 64)] == [3, 4, 5, 5, 6, 6, 7, 7, 9]
    assert [restart_bound(n, "interaction") for n in (1, 2, 4, 13, 64)] == [3, 5, 7, 11, 15]
    assert [restart_bound(n, "several") for n in (2, 8, 64)] == [6, 10, 16]


@pytest.mark.parametrize("n", range(2, 13))
def test_and_pair_default_prior_bound_and_no_wrong_blame(n: int) -> None:
    """With the default prior a pair that fails only together is never blamed on an
    outside unit.  When the bisection has no restart to spare, the pair looks exactly
    like a single culprit (its later member: it is proven needed) and the verdict
    says that it was not tested alone (see docs/search.md, "What the bounds can and
    cannot promise").  When it is found, the prior (interactions are rare) asks for
    up to three more checks than the pair bound."""
    units = names(n)
    found = 0
    for a, b in itertools.combinations(units, 2):
        s = Search(units)
        v = run(s, both(a, b))
        assert set(v.culprits) <= {a, b}, (a, b, v)
        assert s.trials <= restart_bound(n, "interaction") + 3, (a, b, s.trials)
        if v.kind == "interaction":
            assert set(v.culprits) == {a, b}
            found += 1
        else:
            assert v.kind == "culprit" and len(v.culprits) == 1
            assert "was not tested alone" in v.explanation
    if n in (5, 10):
        assert found > 0


@pytest.mark.parametrize("n", range(2, 13))
def test_and_pair_cautious_prior_always_found(n: int) -> None:
    units = names(n)
    k = math.ceil(math.log2(n))
    for a, b in itertools.combinations(units, 2):
        s = Search(units, prior=Prior.cautious())
        v = run(s, both(a, b))
        assert v.kind == "interaction" and set(v.culprits) == {a, b}, (a, b, v)
        assert v.terms == (tuple(sorted((a, b), key=units.index)),)
        # x alone (1) + the fix check (1) on top of the two bisections
        assert s.trials <= 2 * k + 4, (a, b, s.trials)


def test_pair_that_looks_like_a_single_culprit_n2() -> None:
    """n = 2, {u0, u1} fail only together: after trial 3 ({u0} passed) this is
    indistinguishable from 'u1 alone'.  The bound ceil(log2 2)+3 = 4 leaves a restart to
    test u1 alone, so even the prior-trusting search finds the pair (observed, not inferred)."""
    s = Search(names(2))
    v = run(s, both("u0", "u1"))
    assert v.kind == "interaction" and set(v.culprits) == {"u0", "u1"}
    assert "Inferred" not in v.explanation
    s = Search(names(2), prior=Prior.cautious())
    v = run(s, both("u0", "u1"))
    assert v.kind == "interaction" and s.trials == 4


# --------------------------------------------------------------------------- several culprits


def test_two_independent_culprits_of_ten() -> None:
    units = names(10)
    default_both = 0
    for a, b in itertools.combinations(units, 2):
        v = run(Search(units, prior=Prior.cautious()), either(a, b))
        assert v.kind == "culprit" and set(v.culprits) == {a, b}, (a, b, v)
        assert "current without" in v.explanation
        v = run(Search(units), either(a, b))
        assert set(v.culprits) <= {a, b}
        default_both += set(v.culprits) == {a, b}
    # with the default prior the second culprit is found only when a restart is to
    # spare and the fix check is the likelier surprise (docs/search.md)
    assert default_both >= 5


def test_example_two_culprits_found_with_default_prior() -> None:
    v = run(Search(names(10)), either("u2", "u6"))
    assert v.kind == "culprit" and v.culprits == ("u2", "u6")
    assert v.terms == (("u2",), ("u6",))


def test_three_culprits_and_mixed() -> None:
    units = names(10)
    v = run(Search(units, prior=Prior.cautious()), either("u1", "u4", "u8"))
    assert v.kind == "culprit" and set(v.culprits) == {"u1", "u4", "u8"}
    mixed = lambda c: ("u1" in c and "u4" in c) or "u8" in c  # noqa: E731
    v = run(Search(units, prior=Prior.cautious()), mixed)
    assert v.kind == "interaction" and set(v.terms) == {("u1", "u4"), ("u8",)}


# --------------------------------------------------------------------------- intermittent


@pytest.mark.parametrize("n", [4, 8, 13])
def test_intermittent_culprit_mostly_found(n: int) -> None:
    """The fault shows on half of the probe runs of a bad config."""
    units = names(n)
    right = confident_wrong = 0
    seeds = range(20)
    for seed in seeds:
        x = units[(seed * 7) % n]
        s = Search(units)
        v = run(s, single(x), show=0.5, seed=seed)
        if v.kind == "culprit" and v.culprits == (x,):
            right += 1
            assert v.confidence >= 0.95
        elif v.kind != "inconclusive" and v.confidence >= 0.95:
            confident_wrong += 1
    assert right >= 16, right
    assert confident_wrong <= 2, confident_wrong


def test_intermittency_raises_probes() -> None:
    units = names(8)
    log: list = []
    run(Search(units), single("u5"), log=log)
    assert [r.probes for r, _ in log[:2]] == [12, 12]  # premise checks
    # a deterministic fault: bisection passes need only a few runs (at most 4 with the strict per-pass doubt)
    assert all(3 <= r.probes <= 4 for r, _ in log[2:] if r.purpose.startswith("bisect"))
    s = Search(units)
    s.observe(Observation(frozenset(units), passes=3, failed=True))  # failed at run 4: intermittent
    s.observe(Observation(frozenset(), passes=12))
    req = s.next()
    assert isinstance(req, TrialRequest) and req.purpose.startswith("bisect")
    assert req.probes > 4
    assert s.q_belief()[0.0] == 0.0


def test_lucky_pass_is_retested() -> None:
    """A bad config that passed by luck is re-tested before being built on."""
    units = names(8)
    s = Search(units)
    s.observe(Observation(frozenset(units), passes=0, failed=True))
    s.observe(Observation(frozenset(), passes=12))
    first = s.next()
    assert isinstance(first, TrialRequest)
    s.observe(Observation(first.config, passes=first.probes))  # lucky pass (u1 is in it)
    seen = set()
    for _ in range(30):
        step = s.next()
        if isinstance(step, Verdict):
            break
        seen.add(step.purpose.split(":")[0])
        bad = "u1" in step.config
        # the fault now shows after one good run
        s.observe(Observation(step.config, passes=min(1, step.probes - 1) if bad else step.probes, failed=bad))
    assert isinstance(step, Verdict)
    assert "retest" in seen
    assert step.kind == "culprit" and step.culprits == ("u1",)


# --------------------------------------------------------------------------- premises and edges


def test_not_reproduced() -> None:
    s = Search(names(5))
    v = run(s, lambda c: False)
    assert v.kind == "not-reproduced" and s.trials == 0 and len(s.observations) == 1 and v.culprits == ()


def test_not_config() -> None:
    s = Search(names(5))
    v = run(s, lambda c: True)
    # current failed on the running stack (free), the baseline after a co-restart: one restart
    assert v.kind == "not-config" and s.trials == 1 and v.confidence == 1.0
    assert "not the cause" in v.explanation


def test_zero_units_needs_a_failure_after_a_co_restart() -> None:
    """No deltas: a failure of the running stack alone is not "not the config" (a service restarted
    alone holds more than its files); after a co-restart it is, and a pass is not-reproduced."""
    s = Search([])
    first = s.next()
    assert isinstance(first, TrialRequest) and first.free and first.config == frozenset()
    s.observe(Observation(frozenset(), 0, True, free=True))
    again = s.next()
    assert isinstance(again, TrialRequest) and not again.free and "co-restart" in again.purpose
    s.observe(Observation(frozenset(), 0, True))
    v = s.next()
    assert isinstance(v, Verdict) and v.kind == "not-config" and s.trials == 1
    s = Search([])
    s.observe(Observation(frozenset(), 0, True, free=True))
    s.observe(Observation(frozenset(), 12))
    v = s.next()
    assert isinstance(v, Verdict) and v.kind == "not-reproduced" and "trial 1" in v.explanation
    s = Search([])
    s.observe(Observation(frozenset(), 12, free=True))
    v = s.next()
    assert isinstance(v, Verdict) and v.kind == "not-reproduced" and s.trials == 0


def test_explanations_cite_trials() -> None:
    s = POLICIES["confirm"].search(names(8))
    v = run(s, single("u5"))
    assert v.explanation.startswith("Observed: current failed (trial 1); the baseline passed (trial 2); ")
    assert "u5 alone failed (trial " in v.explanation and "current without u5 passed (trial " in v.explanation
    v = run(POLICIES["fast"].search(names(4)), both("u0", "u3"))  # fast infers "no other culprit"
    assert v.kind == "interaction" and "no other delta breaks" in v.explanation.partition("Inferred, not observed:")[2]
    assert "u0 + u3 alone failed (trial " in v.explanation


def test_premise_order_and_probes() -> None:
    s = Search(names(3), max_probes=9)
    r1 = s.next()
    assert r1.config == frozenset(names(3)) and r1.probes == 9 and r1.purpose == "premise: current must fail"
    s.observe(Observation.of(r1.config, Outcome.FAIL, passes=0))
    r2 = s.next()
    assert r2.config == frozenset() and r2.probes == 9 and r2.purpose == "premise: baseline must pass"


def test_no_units() -> None:
    s = Search([])
    assert s.next().config == frozenset()
    v = run(s, lambda c: True)
    assert v.kind == "not-config" and s.trials == 1
    s = Search([])
    assert run(s, lambda c: False).kind == "not-reproduced"


def test_one_unit() -> None:
    s = Search(["A"])
    v = run(s, single("A"))
    assert v.kind == "culprit" and v.culprits == ("A",) and s.trials == 2
    assert "A alone failed" in v.explanation and "current without A passed" in v.explanation


def test_max_trials_inconclusive_with_suspects() -> None:
    units = names(16)
    s = Search(units, max_trials=4)
    v = run(s, single("u11"))
    assert v.kind == "inconclusive" and s.trials == 4
    assert v.culprits == ()
    sus = dict(v.suspects)
    assert "u11" in sus and sus["u11"] == max(sus.values())
    assert 0 < v.confidence < 0.95
    assert "budget" in v.explanation


def test_unresolved_retried_once_then_gives_up() -> None:
    """A trial unresolved twice ends the search, once the premises had their chance: current
    unresolved runs the baseline next (does anything start in this run?); the baseline unresolved
    too ends it, and the explanation says both were run."""
    units = names(8)
    s = Search(units)
    r = s.next()
    s.observe(Observation(r.config, unresolved=True))
    r2 = s.next()
    assert isinstance(r2, TrialRequest) and r2.config == r.config and r2.purpose.startswith("retry")
    assert s.trials == 1
    s.observe(Observation.of(r2.config, Outcome.UNRESOLVED))
    b = s.next()
    assert isinstance(b, TrialRequest) and b.config == frozenset() and "baseline" in b.purpose
    s.observe(Observation(b.config, unresolved=True))
    b2 = s.next()
    assert isinstance(b2, TrialRequest) and b2.config == frozenset() and b2.purpose.startswith("retry")
    s.observe(Observation(b2.config, unresolved=True))
    v = s.next()
    assert isinstance(v, Verdict) and v.kind == "inconclusive" and "unresolved" in v.explanation
    assert "never gave an answer" not in v.explanation
    assert "current (trials 1, 2) and the baseline (trials 3, 4) were unresolved" in v.explanation


def test_current_unresolved_runs_the_baseline_then_current_again() -> None:
    """The operator's edit and now a service will not start: current's start is unresolved (no
    evidence yet that the start command works), so the baseline runs next; once it passes, current is
    tried again and its failure is evidence: the search goes on and names the culprit."""
    units = names(8)
    s = Search(units)
    cur = frozenset(units)
    for _ in range(2):
        r = s.next()
        assert isinstance(r, TrialRequest) and r.config == cur
        s.observe(Observation(r.config, unresolved=True))
    b = s.next()
    assert isinstance(b, TrialRequest) and b.config == frozenset()
    s.observe(Observation(b.config, passes=b.probes))
    again = s.next()
    assert isinstance(again, TrialRequest) and again.config == cur, again
    v = run(s, single("u5"))
    assert v.kind == "culprit" and v.culprits == ("u5",), v


def test_unresolved_costs_budget_but_no_evidence() -> None:
    units = names(8)
    s = Search(units)
    s.observe(Observation(frozenset(units), failed=True))
    s.observe(Observation(frozenset(), passes=12))
    before = s.marginals()
    req = s.next()
    s.observe(Observation(req.config, passes=3, failed=True, unresolved=True))  # ignored fields
    assert s.marginals() == before
    assert s.trials == 3
    retry = s.next()
    assert retry.config == req.config
    v = run(s, single("u6"))
    assert v.culprits == ("u6",)
    assert s.trials <= restart_bound(8) + 1


def test_unresolved_respects_max_trials() -> None:
    s = Search(names(4), max_trials=1)
    r = s.next()
    s.observe(Observation(r.config, unresolved=True))
    v = s.next()
    assert isinstance(v, Verdict) and v.kind == "inconclusive"


def test_validation() -> None:
    with pytest.raises(ValueError):
        Search(["a", "a"])
    with pytest.raises(ValueError):
        Search(["a"], base_probes=5, max_probes=3)
    s = Search(["a", "b"])
    with pytest.raises(ValueError):
        s.observe(Observation(frozenset({"zz"}), failed=True))
    with pytest.raises(ValueError):
        s.observe(Observation(frozenset({"a"}), passes=0, failed=False))
    done = Search([])
    run(done, lambda c: True)
    with pytest.raises(RuntimeError):
        done.observe(Observation(frozenset(), failed=True))


def test_introspection() -> None:
    units = names(8)
    s = Search(units)
    s.observe(Observation(frozenset(units), failed=True))
    s.observe(Observation(frozenset(), passes=12))
    marg = s.marginals()
    assert set(marg) == set(units) and all(0 < p < 1 for p in marg.values())
    hyps = s.hypotheses(5)
    assert len(hyps) == 5 and hyps[0].kind == "culprit"
    assert [h.probability for h in hyps] == sorted((h.probability for h in hyps), reverse=True)
    assert abs(sum(s.q_belief().values()) - 1) < 1e-9
    assert s.observations[0].outcome is Outcome.FAIL


def test_explanations_are_honest() -> None:
    units = names(8)
    v = run(Search(units), single("u7"))  # last position: tested alone with the restart the bound leaves
    assert v.culprits == ("u7",) and "u7 alone failed" in v.explanation
    # with one restart less to spare, the claim is inferred and the explanation says so
    v = run(Search(units, max_trials=5), single("u7"))
    assert v.culprits == ("u7",) and "u7 was not tested alone" in v.explanation
    v = run(Search(units), single("u0"))
    assert "u0 alone failed" in v.explanation and "not tested alone" not in v.explanation


# --------------------------------------------------------------------------- property


@settings(max_examples=120, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=20),
    data=st.data(),
    cautious=st.booleans(),
)
def test_never_a_wrong_deterministic_blame(n: int, data: st.DataObject, cautious: bool) -> None:
    units = names(n)
    pair = n >= 2 and data.draw(st.booleans())
    if pair:
        a, b = data.draw(st.lists(st.sampled_from(units), min_size=2, max_size=2, unique=True))
        truth, members = both(a, b), {a, b}
    else:
        x = data.draw(st.sampled_from(units))
        truth, members = single(x), {x}
    s = Search(units, prior=Prior.cautious() if cautious else None)
    v = run(s, truth)
    assert v.kind in ("culprit", "interaction")
    assert set(v.culprits) <= members
    if v.kind == "interaction" or not pair:
        assert set(v.culprits) == members
    if not pair:
        assert v.kind == "culprit"
        if not cautious:
            assert s.trials <= restart_bound(n)
    elif cautious:
        assert v.kind == "interaction"


# --------------------------------------------------------------------------- every sentence accounted for

def _unaccounted(explanation: str) -> list[str]:
    """The clauses of an explanation that are neither in its "Inferred, not observed:" part nor
    cite the trial that showed them (issue 7: every sentence observed, by which trial, or inferred)."""
    observed, _, _inferred = explanation.partition("Inferred, not observed:")
    head, sep, body = observed.partition("Observed:")
    if not sep:
        return [observed.strip()] if observed.strip() and not observed.strip().startswith("Estimated") else []
    body = body.split(". ")[0]  # the observed list ends at its full stop; what follows is the conclusion
    return [c.strip() for c in body.rstrip(".").split(";") if c.strip() and "(trial" not in c and "trials " not in c
            and "in trial" not in c]


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("truth", ["single", "pair", "two", "none-bad", "healthy", "flaky"])
def test_every_verdict_sentence_is_cited_or_marked_inferred(policy: str, truth: str) -> None:
    n = 8
    oracles = {"single": single("u5"), "pair": both("u1", "u6"), "two": either("u2", "u7"),
               "none-bad": lambda c: True, "healthy": lambda c: False, "flaky": single("u3")}
    seen = 0
    for seed in range(12):
        v = run(POLICIES[policy].search(names(n)), oracles[truth], show=0.5 if truth == "flaky" else 1.0, seed=seed)
        if v.kind == "inconclusive":
            continue
        seen += 1
        assert not _unaccounted(v.explanation), (truth, policy, seed, v.explanation)
        if v.kind in ("culprit", "interaction"):
            assert "Observed: current failed (trial" in v.explanation
    assert seen, "no verdict to check"
    # zero deltas: the stack is probed and the verdict says which trial showed it
    for bad, kind in ((lambda c: True, "not-config"), (lambda c: False, "not-reproduced")):
        v = run(POLICIES[policy].search([]), bad)
        assert v.kind == kind and "(trial" in v.explanation and not _unaccounted(v.explanation), v.explanation


def test_a_pair_member_never_tested_alone_is_said_to_be_inferred() -> None:
    """fast policy, n=2, an AND pair: the search may conclude the interaction without running each
    member alone; what it did not run is in the inferred part, never stated as observed."""
    for seed in range(6):
        log: list = []
        v = run(POLICIES["fast"].search(names(2)), both("u0", "u1"), seed=seed, log=log)
        alone = {next(iter(s.config)) for s, o in log if len(s.config) == 1 and not o.failed}
        for u in ("u0", "u1"):
            if u not in alone:
                assert f"{u} alone passes ({u} was not tested alone)" in v.explanation.split("Inferred")[-1], v.explanation
        assert not _unaccounted(v.explanation), v.explanation


@pytest.mark.parametrize("show", [0.5, 0.3])
def test_intermittent_targets_of_the_default_policy(show: float) -> None:
    """issue 7 item 5 on the oracle: a culprit that shows in 50% / 30% of probe runs, the default
    policy, 320 seeded runs (20 at every position of n = 16): right >= 95%, an innocent named <= 1%."""
    n, runs = 16, 320
    right = wrong = 0
    for seed in range(runs):
        x = f"u{seed % n}"
        v = run(POLICIES["confirm"].search(names(n)), single(x), show=show, seed=1000 + seed)
        named = set(v.culprits)
        right += named == {x}
        wrong += bool(named - {x})
    assert right >= 0.95 * runs and wrong <= 0.01 * runs, (show, right, wrong)
