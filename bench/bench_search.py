"""Benchmark of the bisection search against a simulated oracle.

    python bench/bench_search.py            # full table, n up to 128 (a few minutes)
    python bench/bench_search.py --quick    # n <= 16 only

For every scenario and n it runs the search against every culprit position (or
pair of positions; for the largest n a deterministic sample of pairs, see the
``runs`` column) and prints the worst and mean number of restarts (premise checks
included), the promised bound, whether the worst case meets it, how often the
verdict was exactly right, and how often it blamed a unit outside the truth.

Scenarios
  single       one unit breaks the stack on its own (deterministic)
  and-pair     two units break it only together (deterministic)
  two-culprits two units each break it on their own (deterministic)
  intermittent one culprit whose fault shows on half of the probe runs (3 seeds
               per position); the bound is printed for reference only
Each runs under the three policies of `envbisect bisect --policy` (envbisect.search.POLICIES):
  confirm   the default: a culprit must be seen failing alone and the fix (current minus the
            culprits) must be seen passing before a verdict says "these are all": single within
            ceil(log2 n)+3, and-pair within 2 ceil(log2 n)+3, two independent culprits within
            2 ceil(log2 n)+4 restarts, premise checks included (envbisect.search.restart_bound)
  fast      trusts the prior (second culprits rare): may infer "nothing else is broken", and its
            explanation says so ("Inferred, not observed")
  thorough  confirm with a cautious prior (interactions and second culprits not assumed rare)
The first premise (current must fail) is free when the running stack verifiably runs its files
(docs/search.md); the figures assume it is.
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envbisect.search import POLICIES, Observation, Policy, Verdict  # noqa: E402

NS = (2, 4, 8, 13, 16, 32, 64, 128)
MAX_PAIRS = 700  # per (scenario, n): pairs beyond this are sampled with a fixed stride


def run(units: list[str], bad: Callable[[frozenset], bool], policy: Policy, show: float, seed: int,
        free_current: bool = True) -> tuple[Verdict, int]:
    """One search against an oracle. A bad config fails each probe run with probability ``show``.
    ``free_current``: the first request (current) is answered by probing the running stack, as
    envbisect does when every process verifiably runs its files (no restart)."""
    rng = random.Random(seed)
    s = policy.search(units)
    while True:
        step = s.next()
        if isinstance(step, Verdict):
            return step, s.trials
        passes = failures = 0
        is_bad = bad(step.config)
        for _ in range(step.probes):
            if is_bad and rng.random() < show:
                failures += 1
                if failures >= step.stop_after:
                    break
            else:
                passes += 1
        s.observe(Observation(step.config, passes, failures=failures, free=step.free and free_current))


def sample(items: list, limit: int) -> list:
    if len(items) <= limit:
        return items
    stride = math.ceil(len(items) / limit)
    return items[::stride]


Oracle = Callable[[frozenset], bool]


def cases(scenario: str, units: list[str]) -> Iterable[tuple[Oracle, tuple[tuple[str, ...], ...], float, int]]:
    """(oracle, true terms, probability that a bad config fails a run, seed)."""
    if scenario == "single":
        for x in units:
            yield (lambda c, x=x: x in c), ((x,),), 1.0, 0
    elif scenario.startswith("intermittent"):
        show = float(scenario.split("-")[1]) if "-" in scenario else 0.5
        seeds = max(3, 200 // len(units) + 1)
        for i, x in enumerate(units):
            for k in range(seeds):
                yield (lambda c, x=x: x in c), ((x,),), show, 1000 * i + k
    else:
        for a, b in sample(list(itertools.combinations(units, 2)), MAX_PAIRS):
            if scenario == "and-pair":
                yield (lambda c, a=a, b=b: a in c and b in c), ((a, b),), 1.0, 0
            else:
                yield (lambda c, a=a, b=b: a in c or b in c), ((a,), (b,)), 1.0, 0


def target(scenario: str, n: int) -> int | None:
    lg = math.ceil(math.log2(n)) if n > 1 else 0
    if scenario == "single" or scenario.startswith("intermittent"):
        return lg + 3
    if scenario == "and-pair":
        return 2 * lg + 3
    if scenario == "two-culprits":
        return 2 * lg + 4
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="n <= 16 only")
    ap.add_argument("--scenario", default="")
    ap.add_argument("--policy", default="")
    ap.add_argument("--n", default="")
    args = ap.parse_args()
    ns = [n for n in NS if n <= 16] if args.quick else list(NS)
    if args.n:
        ns = [int(x) for x in args.n.split(",")]
    t0 = time.perf_counter()
    head = (f"{'scenario':<13} {'policy':<9} {'n':>3} {'runs':>5} {'worst':>5} {'mean':>6} {'target':>6} "
            f"{'restarts':>8} {'correct':>8} {'wrong-blame':>11}")
    print(head)
    print("-" * len(head))
    ap_scen = (args.scenario.split(",") if args.scenario else
               ["single", "and-pair", "two-culprits", "intermittent-0.5", "intermittent-0.3"])
    ap_pol = args.policy.split(",") if args.policy else list(POLICIES)
    for scenario in ap_scen:
        for label in ap_pol:
            prior = POLICIES[label]
            for n in ns:
                units = [f"u{i}" for i in range(n)]
                worst, total, runs, right, outside = 0, 0, 0, 0, 0
                for bad, terms, show, seed in cases(scenario, units):
                    v, trials = run(units, bad, prior, show, seed)
                    runs += 1
                    total += trials
                    worst = max(worst, trials)
                    truth = {u for t in terms for u in t}
                    right += v.kind in ("culprit", "interaction") and set(v.terms) == set(terms)
                    outside += bool(set(v.culprits) - truth)
                if not runs:
                    continue
                tgt = target(scenario, n)
                if tgt is None:
                    tgt_s, ok = "-", "-"
                elif scenario.startswith("intermittent"):
                    tgt_s, ok = f"({tgt})", "-"
                else:
                    tgt_s, ok = str(tgt), "OK" if worst <= tgt else "MISS"
                print(
                    f"{scenario:<13} {label:<9} {n:>3} {runs:>5} {worst:>5} {total / runs:>6.2f} {tgt_s:>6} "
                    f"{ok:>8} {right / runs:>8.0%} {outside:>11}"
                )
        print()
    print(f"runtime {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
