"""Fleets: rounds to a verdict with R replicas running trials side by side (oracle, no network).

The real default-policy search and the real round planner (envbisect/search/rounds.py) against a
deterministic oracle: one culprit among n deltas, every position; and a flaky one (each probe run
of a bad configuration fails with probability 0.5; 96 seeded cases). A round costs one restart's
wall time however many replicas take part, so the wall time of a verdict is rounds x restart time
(`RESTART_MIN` minutes of model loading, the figure users quote), next to restarts (the replicas'
restarts summed: what the fleet spends).
"""
from __future__ import annotations

import math
import random
import statistics

from envbisect.search import POLICIES, Observation, Verdict
from envbisect.search.rounds import observe_round, plan_round

REPLICAS = (1, 2, 4)
NS_FULL, NS_QUICK = (8, 16, 32, 64), (8, 16, 32)
RESTART_MIN = 5.0


def _play(n: int, culprit: int, replicas: int, detection: float, seed: int) -> tuple[bool, bool, int, int]:
    units = [f"d{i:03d}" for i in range(n)]
    bad = units[culprit]
    rng = random.Random(seed)
    s = POLICIES["confirm"].search(units)  # the defaults, as bench_compare (base_probes 3)
    rounds = restarts = 0
    while True:
        plan = plan_round(s, replicas)
        if isinstance(plan, Verdict):
            break
        rounds += 1
        restarts += len(plan)
        obs = []
        for req in plan:
            # as probe_repeatedly runs them: up to `probes` runs, stopping after `stop_after` failures
            # (a premise keeps probing a failing config: it measures how often the fault shows)
            passes = failures = 0
            for _ in range(req.probes):
                if bad in req.config and rng.random() < detection:
                    failures += 1
                    if failures >= req.stop_after:
                        break
                    continue
                passes += 1
            obs.append(Observation(req.config, passes=passes, failed=failures > 0, failures=failures))
        observe_round(s, obs)
        if rounds > 300:
            break
    return plan.culprits == (bad,), any(c != bad for c in plan.culprits), rounds, restarts


def measure(quick: bool = False, log=print) -> dict:  # noqa: ANN001
    cells = []
    for detection in (1.0, 0.5):
        for n in (NS_QUICK if quick else NS_FULL):
            for r in REPLICAS:
                cases = range(n) if detection == 1.0 else range(48 if quick else 96)
                got = [_play(n, c % n, r, detection, 1000 * n + c) for c in cases]
                rounds = [g[2] for g in got]
                cells.append({"detection": detection, "n": n, "replicas": r, "cases": len(got),
                              "right": sum(g[0] for g in got) / len(got), "innocent": sum(g[1] for g in got) / len(got),
                              "mean_rounds": statistics.mean(rounds), "worst_rounds": max(rounds),
                              "mean_restarts": statistics.mean(g[3] for g in got),
                              "wall_min": statistics.mean(rounds) * RESTART_MIN})
                log(f"fleet: detection {detection} n={n} R={r} done")
    return {"cells": cells, "restart_min": RESTART_MIN}


def cell(res: dict, detection: float, n: int, r: int) -> dict | None:
    return next((c for c in res["cells"] if c["detection"] == detection and c["n"] == n and c["replicas"] == r), None)


def table(res: dict) -> str:
    lines = ["detect   n  R  cases  right innocent  rounds worst restarts  wall (x %.0f min)" % res["restart_min"]]
    for c in res["cells"]:
        lines.append(f"{c['detection']:>6} {c['n']:>3} {c['replicas']:>2} {c['cases']:>6} {c['right']:>6.1%} "
                     f"{c['innocent']:>8.1%} {c['mean_rounds']:>7.2f} {c['worst_rounds']:>5} {c['mean_restarts']:>8.2f}"
                     f"  {c['wall_min']:>6.0f} min")
    lines.append("R: replicas running trials side by side; rounds: the verdict's wall time in restarts; restarts: "
                 "summed over the replicas; log_{R+1} n is the ideal ratio of rounds for the search part.")
    return "\n".join(lines)


def targets(res: dict, add) -> None:  # noqa: ANN001 - add(ok, target, measured)
    bad = [c for c in res["cells"] if c["innocent"] > 0.01 or (c["detection"] == 1.0 and c["right"] < 1.0)]
    add(not bad, "[fleet] every R: no innocent named (deterministic: every verdict right)",
        "ok" if not bad else "; ".join(f"detection {c['detection']} n={c['n']} R={c['replicas']}: right "
                                         f"{c['right']:.1%} innocent {c['innocent']:.1%}" for c in bad))
    for r in (2, 4):
        rows = []
        ok = True
        for c1 in (c for c in res["cells"] if c["detection"] == 1.0 and c["replicas"] == 1 and c["n"] >= 16):
            cr = cell(res, 1.0, c1["n"], r)
            ideal = math.log(2) / math.log(r + 1)
            # the premise and confirmation rounds do not split: ask for half the ideal saving
            want = c1["mean_rounds"] * (1 - (1 - ideal) / 2)
            ok &= cr["mean_rounds"] <= want + 1e-9
            rows.append(f"n={c1['n']} {cr['mean_rounds']:.2f} vs {c1['mean_rounds']:.2f} (<= {want:.2f})")
        add(ok, f"[fleet] R={r}: mean rounds at most R=1's x (1 - (1 - log 2/log {r + 1})/2), n >= 16", "; ".join(rows))
