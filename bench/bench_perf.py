"""Perf-regression bisection on a simulated, noisy machine: is a speed regression found, and is a
stack that did not slow down left alone?

    python bench/bench_perf.py            # full: n = 8 and 16, 10% and 20% slowdowns, no regression
    python bench/bench_perf.py --quick    # n = 8 only, fewer cases
    python bench/bench_perf.py --quick --restart-sigma 0   # the same without the per-start offset

No network, seeded, deterministic. A case is a diff of n deltas and a truth: one culprit that
slows output tokens/s by 10% or 20% in every configuration holding it (the cases go round every
position, each with its own seed), or none (`none`: every configuration runs at the same speed).

The noise is that of a shared 2-core machine: every started configuration (a co-restart) gets its
own multiplicative offset, lognormal with sigma 2% (page cache, CPU placement, the neighbours of
that minute), and every sample within it a further lognormal 3%. Probing a configuration again
within the same start does not average the offset away; only a new start draws a new one.

The bisection is played as `envbisect bisect` plays one with a perf probe (runs/bisect.py
`_perf_reference` and `_loop`): the baseline is started and measured first (trial 1, its samples
the reference), then the default-policy `Search` is driven through `next()`/`observe()`; its
baseline premise is answered by that trial, every other request is one start of that
configuration. A started configuration is judged by envbisect's own `trials.perf_trial.PerfJudge` (the
probe's 3 samples, more while `search.perf.next_step` says they can still decide, up to 16, else
unresolved, which the search retries with a new start, after a new start of the baseline when the
judge asks for one, as runs/bisect.py does), whose only simulated part is
`run_probe`: one sample of the running configuration. The judged trial goes through
`TrialRunner._probed` and `plan.observation` to the search, as in a live run. The probe is
the playbook's default perf probe (`Probe(kind="perf")`: 3 samples, up to 16, 5% allowed).
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

import envbisect.trials.perf_trial as trial_perf  # noqa: E402
from envbisect.inputs.playbook import Probe  # noqa: E402
from envbisect.outcome import Outcome  # noqa: E402
from envbisect.runs.plan import make_units, observation as _observation  # noqa: E402
from envbisect.runs.bisect import PERF_RETRIES, REFERENCE_PURPOSE  # noqa: E402
from envbisect.search import POLICIES, TrialKind, Verdict  # noqa: E402
from envbisect.trials.probe import ProbeRun  # noqa: E402
from envbisect.trials.runner import Trial, TrialRunner  # noqa: E402
from harness import as_delta, delta_ids, stable_seed  # noqa: E402

POLICY = "confirm"  # the default (`envbisect bisect --policy`)
PROBE = Probe(name="throughput", kind="perf", metric="output_tokens_per_s", regression=0.05)
BASE_TOKENS_PER_S = 1843.0
RESTART_SIGMA = 0.02  # per started configuration
SAMPLE_SIGMA = 0.03  # per sample within it
SLOWDOWNS = (0.20, 0.10)
FULL = {"ns": (8, 16), "cases": 160, "none_cases": 200}
QUICK = {"ns": (8,), "cases": 64, "none_cases": 80}
CHUNK = 16


@dataclass(frozen=True)
class PerfCase:
    scenario: str  # "slow-0.2", "slow-0.1", "none"
    n: int
    index: int
    culprit: str | None  # the delta that slows the stack down; None: nothing does
    slowdown: float
    seed: int


def scenario_name(slowdown: float | None) -> str:
    return "none" if not slowdown else f"slow-{slowdown:g}"


def cases(scenario: str, n: int, count: int) -> list[PerfCase]:
    """``count`` cases going round every position (each with its own seed); ``none``: no culprit."""
    ids = delta_ids(n)
    slowdown = 0.0 if scenario == "none" else float(scenario.split("-", 1)[1])
    return [PerfCase(scenario, n, i, None if scenario == "none" else ids[i % n], slowdown,
                     stable_seed("perf", scenario, n, i)) for i in range(count)]


class Machine:
    """The simulated stack: what one started configuration measures."""

    def __init__(self, case: PerfCase):
        self.case = case
        self.rng = random.Random(case.seed)
        self.starts = 0
        self.samples = 0
        self.speed = 0.0

    def start(self, config: set[str]) -> None:
        """A co-restart into ``config``: its true speed times this start's own offset."""
        self.starts += 1
        slow = self.case.culprit is not None and self.case.culprit in config
        self.speed = BASE_TOKENS_PER_S * (1 - self.case.slowdown if slow else 1.0) * self.rng.lognormvariate(
            0.0, RESTART_SIGMA)

    def sample(self) -> float:
        self.samples += 1
        return self.speed * self.rng.lognormvariate(0.0, SAMPLE_SIGMA)


def _sim_run_probe(probe: Probe, transports) -> ProbeRun:  # noqa: ANN001 - the judge passes them through
    """`trials.probe.run_probe` for the simulation: one sample of the started configuration."""
    value = transports["sim"].sample()
    return ProbeRun(probe.name, probe.kind, Outcome.PASS, f"{value:.1f} tok/s", (), 0.0, value=value)


def _trial(machine: Machine, n: int, units: tuple[str, ...], config: set[str], purpose: str, kind: TrialKind,
           judge: trial_perf.PerfJudge) -> Trial:
    """One start of ``config`` judged as TrialRunner._probe judges a perf trial (the same PerfJudge:
    the reference's starts, and each configuration pooled with its own earlier starts)."""
    machine.start(config)
    outcome, runs, reason = judge.judge_start({"sim": machine}, sorted(config))
    base = Trial(n, purpose, units, tuple(sorted(config)), Outcome.UNRESOLVED, "", kind=kind)
    return TrialRunner._probed(base, outcome, runs, reason, 0.0)


def play(case: PerfCase) -> dict:
    """One perf bisection; what it cost and what it concluded."""
    machine = Machine(case)
    deltas = [as_delta(d) for d in delta_ids(case.n)]
    units, _notes = make_units(deltas, (), True)
    search = POLICIES[POLICY].search(list(units), base_probes=PROBE.repeat, retries=PERF_RETRIES)  # as runs/bisect
    trials: list[Trial] = []
    # _perf_reference: the baseline is measured first; its samples are the reference
    judge = trial_perf.PerfJudge(PROBE)
    ref_trial = _trial(machine, 1, (), set(), "premise: baseline must pass (the perf reference)",
                       TrialKind.PREMISE_BASELINE, judge)
    trials.append(ref_trial)
    pending_ref: Trial | None = ref_trial
    judged = []  # (holds the culprit, outcome) per judged trial
    while True:
        step = search.next()
        if isinstance(step, Verdict):
            break
        if pending_ref is not None and step.kind is TrialKind.PREMISE_BASELINE and not step.config:
            search.observe(_observation(pending_ref))
            pending_ref = None
            continue
        config = {d for u in step.config for d in units[u]}
        t = _trial(machine, len(trials) + 1, tuple(sorted(step.config)), config, step.purpose, step.kind, judge)
        trials.append(t)
        judged.append((case.culprit is not None and case.culprit in config, str(t.outcome)))
        search.observe(_observation(t))
        if t.outcome is Outcome.UNRESOLVED and judge.wants_reference and not isinstance(search.next(), Verdict):
            # as runs/bisect._loop: the baseline started again before the retry (its samples join the reference)
            ref = _trial(machine, len(trials) + 1, (), set(), REFERENCE_PURPOSE, TrialKind.PREMISE_BASELINE, judge)
            trials.append(ref)
            search.observe(_observation(ref))
    v = step
    named = {d for u in v.culprits for d in units[u]}
    truth = {case.culprit} if case.culprit else set()
    if case.culprit is None:
        right = v.kind == "not-reproduced" and not named
    else:
        named_terms = [sorted(d for u in term for d in units[u]) for term in v.terms]
        right = v.kind == "culprit" and named_terms == [[case.culprit]]
    return {"restarts": machine.starts, "samples": machine.samples, "right": bool(right),
            "innocent": bool(named - truth), "kind": v.kind,
            "unresolved": sum(t.outcome is Outcome.UNRESOLVED for t in trials),
            # judged trials of configurations without the culprit called worse, and with it called same
            "false_worse": sum(1 for bad, o in judged if not bad and o == "fail"),
            "good_judged": sum(1 for bad, _ in judged if not bad),
            "missed": sum(1 for bad, o in judged if bad and o == "pass"),
            "bad_judged": sum(1 for bad, _ in judged if bad),
            # the judge misled the search at least once (a good configuration worse, or a bad one same)
            "misjudged": any((not bad and o == "fail") or (bad and o == "pass") for bad, o in judged)}


def _work(task: tuple) -> tuple:
    scenario, n, count, lo, hi = task
    with mock.patch.object(trial_perf, "run_probe", _sim_run_probe):
        return scenario, n, lo, [play(c) for c in cases(scenario, n, count)[lo:hi]]


def summarize(scenario: str, n: int, recs: list[dict]) -> dict:
    runs = len(recs)
    tot = lambda k: sum(r[k] for r in recs)  # noqa: E731
    return {
        "scenario": scenario, "n": n, "runs": runs,
        "right": tot("right") / runs, "innocent": tot("innocent") / runs,
        "mean_restarts": tot("restarts") / runs, "worst_restarts": max(r["restarts"] for r in recs),
        "mean_samples": tot("samples") / runs,
        "false_alarm": (sum(r["kind"] != "not-reproduced" or r["innocent"] for r in recs) / runs
                        if scenario == "none" else None),
        "unresolved_per_run": tot("unresolved") / runs,
        "false_worse_rate": tot("false_worse") / max(1, tot("good_judged")),
        "missed_rate": tot("missed") / max(1, tot("bad_judged")),
        "named": sum(bool(r["innocent"]) for r in recs) / runs,  # none: a culprit was named
        # the runs in which the judge called a configuration without the culprit worse, or one with it
        # same, at least once; and the right % of the others (what the search makes of correct answers)
        "misjudged_runs": tot("misjudged") / runs,
        "right_when_judged_right": (sum(r["right"] for r in recs if not r["misjudged"])
                                    / max(1, sum(not r["misjudged"] for r in recs))),
        "verdicts": dict(Counter(r["kind"] for r in recs)),
    }


def measure(quick: bool = False, workers: int = 2, log=print) -> dict:  # noqa: ANN001
    cfg = QUICK if quick else FULL
    t0 = time.perf_counter()
    plan = [(scenario_name(s), n, cfg["cases"]) for s in SLOWDOWNS for n in cfg["ns"]]
    plan.append(("none", 8, cfg["none_cases"]))
    tasks = [(s, n, count, lo, min(count, lo + CHUNK)) for s, n, count in plan for lo in range(0, count, CHUNK)]
    tasks.sort(key=lambda t: -t[1])  # the larger n first, so the workers finish together
    parts: dict[tuple, list] = {}
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(max(1, workers)) as pool:
        for done, (scenario, n, lo, recs) in enumerate(pool.imap_unordered(_work, tasks), 1):
            parts.setdefault((scenario, n), []).append((lo, recs))
            if done % 20 == 0:
                log(f"  perf: {done}/{len(tasks)} chunks, {time.perf_counter() - t0:.0f} s")
    cells = []
    for scenario, n, _count in plan:
        recs = [r for _, rs in sorted(parts[(scenario, n)], key=lambda p: p[0]) for r in rs]
        cells.append(summarize(scenario, n, recs))
    return {"config": {"ns": list(cfg["ns"]), "cases": cfg["cases"], "none_cases": cfg["none_cases"],
                       "slowdowns": list(SLOWDOWNS), "policy": POLICY, "restart_sigma": RESTART_SIGMA,
                       "sample_sigma": SAMPLE_SIGMA, "regression": PROBE.regression, "samples": PROBE.samples,
                       "max_samples": PROBE.max_samples, "reference_samples": trial_perf.reference_count(PROBE),
                       "quick": quick, "workers": workers},
            "cells": cells, "runtime_s": time.perf_counter() - t0}


def cell(res: dict, scenario: str, n: int) -> dict | None:
    return next((c for c in res["cells"] if c["scenario"] == scenario and c["n"] == n), None)


def restart_target(n: int) -> int:
    return math.ceil(math.log2(n)) + 4


def table(res: dict) -> str:
    head = (f"{'scenario':<9} {'n':>3} {'runs':>5} {'right':>6} {'innocent':>8} {'restarts':>8} {'worst':>5} "
            f"{'samples':>7} {'unres':>5} {'good->worse':>11} {'bad->same':>9} {'misled':>6} {'right|ok':>8}  verdicts")
    out = [head, "-" * len(head)]
    for c in res["cells"]:
        verdicts = ", ".join(f"{k} {v}" for k, v in sorted(c["verdicts"].items(), key=lambda kv: -kv[1]))
        out.append(f"{c['scenario']:<9} {c['n']:>3} {c['runs']:>5} {c['right']:>6.1%} {c['innocent']:>8.1%} "
                   f"{c['mean_restarts']:>8.2f} {c['worst_restarts']:>5} {c['mean_samples']:>7.1f} "
                   f"{c['unresolved_per_run']:>5.2f} {c['false_worse_rate']:>11.1%} {c['missed_rate']:>9.1%} "
                   f"{c['misjudged_runs']:>6.1%} {c['right_when_judged_right']:>8.1%}  {verdicts}")
    k = res["config"]
    out.append(f"slow-D: one culprit slows tokens/s by D; none: no culprit (right = not-reproduced). restarts: "
               f"started configurations per run, the baseline reference included; samples: perf samples per run; "
               f"unres: unresolved trials per run (undecided after {k['max_samples']} samples); good->worse: judged "
               f"trials without the culprit called worse; bad->same: with it, called same; misled: runs with at "
               f"least one of those; right|ok: right % of the other runs. Noise: "
               f"{k['restart_sigma']:.0%} per start, {k['sample_sigma']:.0%} per sample; "
               f"{k['regression']:.0%} allowed.")
    out.append(f"runtime {res['runtime_s']:.0f} s")
    return "\n".join(out)


def main() -> None:
    global RESTART_SIGMA, SAMPLE_SIGMA
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--restart-sigma", type=float, default=RESTART_SIGMA,
                    help=f"lognormal sigma of a start's offset (default {RESTART_SIGMA:g})")
    ap.add_argument("--sample-sigma", type=float, default=SAMPLE_SIGMA,
                    help=f"lognormal sigma of a sample within a start (default {SAMPLE_SIGMA:g})")
    args = ap.parse_args()
    RESTART_SIGMA, SAMPLE_SIGMA = args.restart_sigma, args.sample_sigma  # the forked workers inherit them
    res = measure(args.quick, args.workers, log=lambda m: print(m, file=sys.stderr))
    print(json.dumps(res, indent=2) if args.json else table(res))


if __name__ == "__main__":
    main()
