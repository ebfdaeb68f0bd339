"""Issue 11 end to end: a speed regression bisected on the simulated PD deployment (real
sglang-router; simulated decode whose per-token time follows its environment: envbisect.sim's
PERF_RULES), with the perf probe `throughput` (tokens/s of 24 requests at concurrency 8) and
the statistical decision of search/perf.py. The timing noise is this machine's own."""
from __future__ import annotations

import json

import pytest

from test_bisect_sim import Scenario, plant

from envbisect.sim.deployment import PERF_RULES

pytestmark = pytest.mark.sim

SLOW = ("decode", "SGLANG_CUDA_GRAPH_MAX_BS", "8")  # 30% more time per token: about -20% tokens/s
FAST = ("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "512")  # the incident's +12.8% knob: innocent
NOOP = ("decode", "SGLANG_SCHEDULER_INTERVAL", "2")
OTHERS = [("prefill", "NCCL_DEBUG", "INFO"), ("router", "ROUTER_LOG_LEVEL", "debug"),
          ("decode", "NCCL_IB_GID_INDEX", "5"), ("prefill", "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE", "8"),
          ("decode", "SGLANG_ENABLE_JIT_DEEPGEMM", "1")]


@pytest.fixture
def perf_scenario(tmp_path):
    made = []

    def make() -> Scenario:
        s = Scenario(tmp_path / f"p{len(made)}", rules=PERF_RULES)
        made.append(s)
        return s

    yield make
    for s in made:
        s.sim.stop_all()


def test_a_20_percent_slowdown_among_8_deltas_is_found_and_the_speedup_kept(perf_scenario):
    s = perf_scenario()
    s.baseline()
    plant(s.sim, OTHERS[:2] + [FAST, SLOW, NOOP] + OTHERS[2:])
    r = s.bisect(probe="throughput")
    assert r.verdict.kind == "culprit", (r.verdict, [(t.purpose, t.outcome, t.reason) for t in r.trials])
    assert r.culprit_deltas == ("decode:SGLANG_CUDA_GRAPH_MAX_BS",)  # the speed-up knob is not blamed
    first = r.trials[0]
    assert first.kind.value == "premise-baseline" and not first.config and not first.free  # measured first
    assert all(run.value is not None and run.value > 0 for t in r.trials for run in t.probe_runs if run.outcome)
    # current (slower by the slowdown, faster by the speed-up) was measured worse than the baseline
    # (after a retry if its first start was undecided: never guessed)
    cur = [t for t in r.trials if len(t.config) == 8]
    assert cur and cur[-1].outcome == "fail" and "worse" in cur[-1].reason, [t.reason for t in cur]
    assert all(t.outcome in ("fail", "unresolved") for t in cur)
    assert all(len(t.probe_runs) >= 3 for t in r.trials)  # a started configuration is sampled several times
    fix = [t for t in r.trials if len(t.config) == 7 and "decode:SGLANG_CUDA_GRAPH_MAX_BS" not in t.config]
    assert fix and fix[-1].outcome == "pass"  # the fix keeps the speed-up


def test_no_regression_is_not_reproduced_with_both_distributions_measured(perf_scenario):
    s = perf_scenario()
    s.baseline()
    plant(s.sim, [FAST, NOOP, OTHERS[0]])
    r = s.cli("bisect", "--against", "good", "--probe", "throughput", "--json", timeout=600)
    doc = json.loads(r.stdout)
    assert r.returncode == 5 and doc["verdict"] == "not-reproduced", (r.stderr, doc.get("verdict"))
    base, cur = doc["trials"][0], doc["trials"][1]
    assert base["config"] == [] and len(cur["config"]) == 3
    assert all(run["value"] for t in (base, cur) for run in t["probe"]["runs"])  # both distributions kept
