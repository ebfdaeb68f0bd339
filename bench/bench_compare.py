"""Search efficiency side by side: envbisect against the classic methods, on a simulated oracle.

No network: every method answers the same cases through the same Lab (bench/harness.py): a
restart is one started configuration, probe runs within it are cheap, every method stops probing
a config at its first failure, and the running current config costs no restart.

Scenarios (n deltas, n in 4 8 16 32 64 128):
  culprit     one delta breaks the stack alone; every position
  pair        two deltas break it only together; every pair up to 500 (n <= 32), else 200 seeded pairs
  two         two deltas each break it alone; the same pairs
  linked      the same key changed the same way in prefill and decode (envbisect auto-links
              the two into one unit, then tests the sides apart); only one side is guilty
  flaky-D     one culprit whose bad configs fail each probe run with probability D
              (1.0 0.7 0.5 0.3); max(n, 200) seeded cases going round every position
Methods: envbisect-{confirm,fast,thorough} (each --policy), toggle (one at a time), bisect
(git bisect run: 1 probe, no premise checks), bisect-k (k probe runs per step, smallest k in
1..40 whose right % reaches envbisect-confirm's on the same cases; flaky scenarios only), ddmin.

    python bench/bench_compare.py            # full (a few minutes on 2 cores)
    python bench/bench_compare.py --quick    # n <= 32, fewer samples
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import (  # noqa: E402
    DETECTIONS, MAX_K, METHODS, NS, SCENARIO_TITLES, SCENARIOS, cases, evidence_bound, info_bound, run_case,
)

FULL = {"ns": NS, "pair_cap": 200, "pair_every": 500, "flaky_min": 200}
QUICK = {"ns": (4, 8, 16, 32), "pair_cap": 60, "pair_every": 120, "flaky_min": 60}
CHUNK = 40


def _cases(cfg: dict, scenario: str, n: int):  # noqa: ANN202
    return cases(scenario, n, pair_cap=cfg["pair_cap"], pair_every=cfg["pair_every"], flaky_min=cfg["flaky_min"])


def _work(task: tuple) -> tuple:
    cfg, scenario, n, method, lo, hi = task
    cs = _cases(cfg, scenario, n)[lo:hi]
    return scenario, n, method, lo, [run_case(c, method) for c in cs]


def _tune(task: tuple) -> tuple:
    """Smallest k whose right % reaches ``target`` (envbisect-confirm's), on the same cases."""
    cfg, scenario, n, target = task
    cs = _cases(cfg, scenario, n)
    curve = []
    recs: list = []
    for k in range(1, MAX_K + 1):
        recs = [run_case(c, "bisect-k", k) for c in cs]
        right = sum(r[2] for r in recs) / len(recs)
        curve.append((k, right))
        if right >= target - 1e-12:
            return scenario, n, k, True, curve, recs
    return scenario, n, MAX_K, False, curve, recs


def summarize(scenario: str, n: int, method: str, recs: list, k: int | None = None) -> dict:
    runs = len(recs)
    c0 = _cases_k(scenario, n)
    return {
        "scenario": scenario, "n": n, "method": method, "runs": runs,
        "mean_restarts": sum(r[0] for r in recs) / runs, "worst_restarts": max(r[0] for r in recs),
        "mean_probes": sum(r[1] for r in recs) / runs,
        "right": sum(r[2] for r in recs) / runs, "innocent": sum(r[3] for r in recs) / runs,
        "verdicts": dict(Counter(r[4] for r in recs)), "info_bound": info_bound(n, c0), "k": k,
        # one culprit: the fewest mean restarts of any method that observes what envbisect observes
        "evidence_bound": evidence_bound(n) if scenario == "culprit" else None,
    }


def _cases_k(scenario: str, n: int) -> int:
    return 2 if scenario in ("pair", "two") else 1


def measure(quick: bool = False, workers: int = 2, log=print) -> dict:  # noqa: ANN001
    cfg = QUICK if quick else FULL
    t0 = time.perf_counter()
    tasks = []
    for scenario in SCENARIOS:
        for n in cfg["ns"]:
            size = len(_cases(cfg, scenario, n))
            for method in METHODS:
                if method == "bisect-k":
                    continue
                for lo in range(0, size, CHUNK):
                    tasks.append((cfg, scenario, n, method, lo, min(size, lo + CHUNK)))
    # biggest first, so the two workers finish together
    tasks.sort(key=lambda t: -(t[2] ** 1.5) * (t[5] - t[4]) * (1 if t[3].startswith("envbisect") else 0.05))
    parts: dict[tuple, list] = {}
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers) as pool:
        done = 0
        for scenario, n, method, lo, recs in pool.imap_unordered(_work, tasks):
            parts.setdefault((scenario, n, method), []).append((lo, recs))
            done += 1
            if done % 100 == 0:
                log(f"  search: {done}/{len(tasks)} chunks, {time.perf_counter() - t0:.0f} s")
        cells = []
        for (scenario, n, method), chunks in parts.items():
            recs = [r for _, rs in sorted(chunks) for r in rs]
            cells.append(summarize(scenario, n, method, recs))
        target = {(c["scenario"], c["n"]): c["right"] for c in cells if c["method"] == "envbisect-confirm"}
        tune = [(cfg, s, n, target[(s, n)]) for s in SCENARIOS if s.startswith("flaky-") for n in cfg["ns"]]
        tuning = []
        for scenario, n, k, reached, curve, recs in pool.imap_unordered(_tune, tune):
            cell = summarize(scenario, n, "bisect-k", recs, k)
            cell["k_reached"] = reached
            cells.append(cell)
            tuning.append({"scenario": scenario, "n": n, "k": k, "reached": reached, "curve": curve})
    order = {m: i for i, m in enumerate(METHODS)}
    cells.sort(key=lambda c: (SCENARIOS.index(c["scenario"]), c["n"], order[c["method"]]))
    return {"config": {"ns": list(cfg["ns"]), "pair_cap": cfg["pair_cap"], "pair_every": cfg["pair_every"],
                       "flaky_min": cfg["flaky_min"],
                       "detections": list(DETECTIONS), "max_k": MAX_K, "quick": quick, "workers": workers},
            "cells": cells, "tuning": sorted(tuning, key=lambda t: (t["scenario"], t["n"])),
            "runtime_s": time.perf_counter() - t0}


def cell(res: dict, scenario: str, n: int, method: str) -> dict | None:
    for c in res["cells"]:
        if c["scenario"] == scenario and c["n"] == n and c["method"] == method:
            return c
    return None


def table(res: dict) -> str:
    out = []
    head = (f"{'n':>4} {'bound':>5} {'method':<19} {'runs':>5} {'restarts':>8} {'worst':>5} {'probes':>7} "
            f"{'right':>6} {'innocent':>8} {'k':>3}")
    for scenario in SCENARIOS:
        rows = [c for c in res["cells"] if c["scenario"] == scenario]
        if not rows:
            continue
        out.append(f"{scenario}: {SCENARIO_TITLES[scenario]}")
        out.append(head)
        out.append("-" * len(head))
        last = None
        for c in rows:
            if last is not None and c["n"] != last:
                out.append("")
            last = c["n"]
            k = "" if c["k"] is None else f"{c['k']}{'' if c.get('k_reached', True) else '!'}"
            out.append(f"{c['n']:>4} {c['info_bound']:>5} {c['method']:<19} {c['runs']:>5} {c['mean_restarts']:>8.2f} "
                       f"{c['worst_restarts']:>5} {c['mean_probes']:>7.1f} {c['right']:>6.1%} {c['innocent']:>8.1%} "
                       f"{k:>3}")
        out.append("")
    out.append("restarts: mean per case (premise checks included; the running current config is free for every "
               "method); bound = ceil(log2 C(n,k)), the fewest restarts that can tell k culprits among n apart; "
               "for one culprit, any method that observes the baseline pass, the culprit fail alone and its revert "
               "pass needs at least evidence_bound(n) mean restarts (log2 n + 2.5 for n a power of 2; "
               "bench/README.md); "
               "right = verdict equals the truth; innocent = a delta outside the truth was named; k = probe runs per "
               "step of bisect-k (! = envbisect's accuracy not reached with k <= 40)")
    out.append(f"runtime {res['runtime_s']:.0f} s")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = measure(args.quick, args.workers, log=lambda m: print(m, file=sys.stderr))
    print(json.dumps(res, indent=2) if args.json else table(res))


if __name__ == "__main__":
    main()
