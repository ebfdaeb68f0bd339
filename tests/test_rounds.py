"""Fleet rounds (search/rounds.py): R trials per round by speculation, on an oracle."""
from __future__ import annotations

import math

import pytest

from envbisect.search import POLICIES, Observation, Verdict
from envbisect.search.rounds import observe_round, plan_round


def _run(n: int, bad: str, replicas: int):
    units = [f"u{i}" for i in range(n)]
    s = POLICIES["confirm"].search(units, confidence=0.95, max_trials=None, base_probes=1)
    rounds, plans = 0, []
    while True:
        plan = plan_round(s, replicas)
        if isinstance(plan, Verdict):
            return plan, rounds, plans
        rounds += 1
        plans.append(plan)
        observe_round(s, [Observation(r.config, passes=0 if bad in r.config else r.probes, failed=bad in r.config)
                          for r in plan])


@pytest.mark.parametrize("n", [8, 16, 32])
def test_more_replicas_take_fewer_rounds_and_never_blame_another_delta(n):
    mean = {}
    for replicas in (1, 2, 4):
        rounds = []
        for pos in range(n):
            verdict, r, plans = _run(n, f"u{pos}", replicas)
            assert verdict.kind == "culprit" and verdict.culprits == (f"u{pos}",)
            assert all(len(p) <= replicas and len({q.config for q in p}) == len(p) for p in plans)
            rounds.append(r)
        mean[replicas] = sum(rounds) / n
    assert mean[2] < mean[1] * 0.75 and mean[4] < mean[2], mean
    # about log_{R+1} n rounds of search on top of the fixed premise and confirmation rounds
    assert mean[2] - mean[1] * math.log(2) / math.log(3) < 1.5, mean


def test_one_replica_is_the_sequential_search():
    verdict, rounds, plans = _run(16, "u5", 1)
    units = [f"u{i}" for i in range(16)]
    s = POLICIES["confirm"].search(units, confidence=0.95, max_trials=None, base_probes=1)
    seq = []
    while not isinstance(nxt := s.next(), Verdict):
        seq.append(nxt.config)
        s.observe(Observation(nxt.config, passes=0 if "u5" in nxt.config else nxt.probes, failed="u5" in nxt.config))
    assert [p[0].config for p in plans] == seq and rounds == len(seq)


def test_the_first_round_of_two_checks_both_premises():
    units = [f"u{i}" for i in range(8)]
    s = POLICIES["confirm"].search(units, confidence=0.95, max_trials=None, base_probes=1)
    plan = plan_round(s, 2)
    assert {p.kind.value for p in plan} == {"premise-current", "premise-baseline"}
