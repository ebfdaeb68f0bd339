"""Several faults, several fingerprints (issues 34 and 39): envbisect's default policy against the
oracle of harness.py, each trial reaching the search with its failure's fingerprint, as `bisect`
gives it (`Observation.sign`, one search per fingerprint: search/incident.py).

    python bench/bench_faults.py [--quick]

Families:
- masked: two or three culprits, each with its own fingerprint, the first one a configuration
  holds is the one it shows (a hang masks a 500, a 500 masks a reset);
- must-match: a value changed the same way in prefill and decode (auto-linked), together the
  symptom (HTTP 500), either side alone another failure (a hang: the layout no longer matches);
- breaker: one culprit (HTTP 500 after a fresh start), the running stack answering 503 (a router's
  circuit breaker opened by traffic before the bisection);
- behind: a deterministic culprit and an intermittent one (30% of runs) behind it, one symptom.

right: exactly the culprits named; guilty unnamed: a culprit left out; innocent: another delta
named; over budget: a run that took more restarts than its default budget (search.default_budget).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]

import harness  # noqa: E402

from envbisect.search import default_budget  # noqa: E402

SCENARIOS = ("masked", "must-match", "breaker", "behind")
NS = (8, 16)
SIGNS = ("hang", "500", "reset")


def cases(scenario: str, n: int, count: int) -> list[harness.Case]:
    ids = harness.delta_ids(n)
    out = []
    if scenario == "must-match":
        for p in range(n - 1):
            lids = harness.delta_ids(n, p)
            a, b = lids[p], lids[p + 1]
            out.append(harness.Case(scenario, n, p, ((a, b),), 1.0, harness.stable_seed(scenario, n, p), (a, b),
                                    signs=("500",), apart=(((a,), "hang"), ((b,), "hang"))))
        return out
    for i in range(max(n, count)):
        rng = random.Random(harness.stable_seed(scenario, n, i))
        seed = harness.stable_seed(scenario, "run", n, i)
        if scenario == "masked":
            picks = rng.sample(ids, rng.choice((2, 2, 3)))
            out.append(harness.Case(scenario, n, i, tuple((x,) for x in picks), 1.0, seed,
                                    signs=SIGNS[:len(picks)]))
        elif scenario == "breaker":
            out.append(harness.Case(scenario, n, i, ((ids[i % n],),), 1.0, seed, signs=("500",), running="503"))
        elif scenario == "behind":
            a, b = rng.sample(ids, 2)
            out.append(harness.Case(scenario, n, i, ((a,), (b,)), 1.0, seed, signs=("hang", "hang"),
                                    detections=(1.0, 0.3)))
    return out


def _one(case: harness.Case):  # noqa: ANN201
    lab = harness.Lab(case)
    ans = harness.run_envbisect(lab, "confirm")
    restarts, _probes, right, innocent, kind = harness.score(case, lab, ans)
    named = {d for t in (ans.terms or ()) for d in t}
    unnamed = bool({d for t in case.terms for d in t} - named)
    units, _ = harness.make_units([harness.as_delta(d) for d in case.deltas], (), True)
    return case.scenario, case.n, restarts, right, unnamed, innocent, restarts > default_budget(len(units)), kind


def measure(quick: bool = False, workers: int = 2, log=print) -> dict:  # noqa: ANN001
    count = 100 if quick else 200
    jobs = [c for sc in SCENARIOS for n in NS for c in cases(sc, n, count)]
    log(f"several faults: {len(jobs)} cases")
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        got = list(pool.map(_one, jobs, chunksize=8))
    cells: dict[str, dict] = {}
    for sc, n, restarts, right, unnamed, innocent, over, kind in got:
        c = cells.setdefault(f"{sc}/{n}", {"scenario": sc, "n": n, "runs": 0, "right": 0, "unnamed": 0,
                                           "innocent": 0, "over_budget": 0, "restarts": 0, "worst": 0,
                                           "budget": 0, "verdicts": {}})
        c["runs"] += 1
        c["right"] += right
        c["unnamed"] += unnamed
        c["innocent"] += innocent
        c["over_budget"] += over
        c["restarts"] += restarts
        c["worst"] = max(c["worst"], restarts)
        c["verdicts"][kind] = c["verdicts"].get(kind, 0) + 1
    for c in cells.values():
        for k in ("right", "unnamed", "innocent"):
            c[k] /= c["runs"]
        c["mean_restarts"] = c.pop("restarts") / c["runs"]
        c["budget"] = default_budget(c["n"] - (1 if c["scenario"] == "must-match" else 0))
    return {"config": {"ns": list(NS), "scenarios": list(SCENARIOS)}, "cells": list(cells.values())}


def table(res: dict) -> str:
    lines = [f"{'scenario':<11} {'n':>3} {'runs':>5} {'right':>7} {'unnamed':>7} {'innocent':>8} {'restarts':>8} "
             f"{'worst':>5} {'budget':>6}  verdicts"]
    for c in res["cells"]:
        lines.append(f"{c['scenario']:<11} {c['n']:>3} {c['runs']:>5} {c['right']:>7.1%} {c['unnamed']:>7.1%} "
                     f"{c['innocent']:>8.1%} {c['mean_restarts']:>8.2f} {c['worst']:>5} {c['budget']:>6}  "
                     + ", ".join(f"{k} {v}" for k, v in sorted(c["verdicts"].items())))
    lines.append("masked: 2-3 culprits, each its own fingerprint, the first held shows; must-match: a twin, "
                 "together a 500, either side alone a hang; breaker: the running stack answers 503, a fresh "
                 "start 500; behind: a deterministic culprit and a 30% one")
    return "\n".join(lines)


def targets(res: dict, add) -> None:  # noqa: ANN001
    for sc in SCENARIOS:
        cells = [c for c in res["cells"] if c["scenario"] == sc]
        bad = [f"n={c['n']} right {c['right']:.1%} unnamed {c['unnamed']:.1%} innocent {c['innocent']:.1%} "
               f"over budget {c['over_budget']}" for c in cells
               if c["right"] < 0.99 or c["unnamed"] > 0.005 or c["innocent"] > 0.005 or c["over_budget"]]
        runs = sum(c["runs"] for c in cells)
        add(not bad, f"[several faults: {sc}] default policy: right >= 99%, guilty unnamed <= 0.5%, innocent "
            "named <= 0.5%, no run over its budget", "fails at " + "; ".join(bad) if bad else
            f"right >= {min(c['right'] for c in cells):.1%}, unnamed <= {max(c['unnamed'] for c in cells):.1%}, "
            f"innocent <= {max(c['innocent'] for c in cells):.1%}, worst {max(c['worst'] for c in cells)} restarts "
            f"(budget {min(c['budget'] for c in cells)}+) ({runs} cases)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    r = measure(a.quick)
    print(json.dumps(r, indent=1) if a.json else table(r))
    targets(r, lambda ok, t, m: print(f"{'PASS' if ok else 'FAIL'} {t}: {m}"))
