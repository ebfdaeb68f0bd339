"""Issue 26 parts 3 and 4 end to end, over the real sshd, the simulated PD deployment (real
sglang-router) and a real Prometheus server scraping it every second:

- a `promql` probe and a `metrics` probe each find a planted 20% throughput regression among a few
  deltas (the hosts left byte-identical);
- an `answers` probe finds a planted accuracy drop (95% -> 60%) that the HTTP-level probes pass.
"""
from __future__ import annotations

import json

import pytest

from prometheus import start_prometheus
from test_bisect_sim import Scenario, plant, tree_fingerprint

from envbisect.sim.stack import PERF_RULES

pytestmark = [pytest.mark.sim, pytest.mark.sshd, pytest.mark.slow]

# 34% more time per token on decode: about 20% fewer generated tokens/s (measured: 1.45 gave -25%)
SLOW = ("decode", "SGLANG_CUDA_GRAPH_MAX_BS", "8")
NOOP = ("decode", "SGLANG_SCHEDULER_INTERVAL", "2")
OTHERS = [("prefill", "NCCL_DEBUG", "INFO"), ("router", "ROUTER_LOG_LEVEL", "debug"),
          ("decode", "NCCL_IB_GID_INDEX", "5")]
WRONG = ("decode", "SGLANG_ENABLE_JIT_DEEPGEMM", "1")


def _rules_20_percent() -> dict:
    rules = json.loads(json.dumps(PERF_RULES))
    for r in rules["rules"]:
        if r["when"] == {"SGLANG_CUDA_GRAPH_MAX_BS": "8"}:
            r["factor"] = 1.34
    return rules


@pytest.fixture
def stack(tmp_path, sshd):
    made = []

    def make(rules: dict) -> Scenario:
        s = Scenario(tmp_path / f"s{len(made)}", ssh=sshd.alias, ssh_config=str(sshd.ssh_config), rules=rules)
        made.append(s)
        return s

    yield make
    for s in made:
        s.sim.stop_all()


def _add_probe(s: Scenario, text: str) -> None:
    s.sim.playbook.write_text(s.sim.playbook.read_text() + "\n" + text.strip() + "\n")


def _chat(s: Scenario) -> str:
    return f"{s.sim.router_url}/v1/chat/completions"


PERF_BODY = ('{"model": "default", "messages": [{"role": "user", "content": "Write a haiku."}], '
             '"max_tokens": 32}')


def _bisect_finds_the_slowdown(s: Scenario, probe: str) -> None:
    s.baseline()
    plant(s.sim, [OTHERS[0], SLOW, NOOP, OTHERS[1]])
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe=probe)
    trials = [(t.n, t.purpose, t.outcome, t.reason, [run.value for run in t.probe_runs]) for t in r.trials]
    assert r.verdict.kind == "culprit", (r.verdict, trials)
    assert r.culprit_deltas == ("decode:SGLANG_CUDA_GRAPH_MAX_BS",), trials
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before
    first = r.trials[0]
    assert first.kind.value == "premise-baseline" and first.outcome == "pass" and len(first.probe_runs) >= 8
    assert all(run.value and run.value > 0 for t in r.trials for run in t.probe_runs)
    cur = [t for t in r.trials if len(t.config) == 4]
    assert cur[-1].outcome == "fail" and "worse" in cur[-1].reason, [t.reason for t in cur]


def test_a_promql_probe_finds_a_20_percent_throughput_regression(stack, tmp_path):
    s = stack(_rules_20_percent())
    ports = s.sim.ports
    prom = start_prometheus(tmp_path / "prom", [f"127.0.0.1:{ports[k]}" for k in ("prefill", "decode",
                                                                                "router_metrics")])
    try:
        _add_probe(s, f"""
[probes.decode_tps]
kind = "promql"
vantage = "node1"
url = "{_chat(s)}"
body = '{PERF_BODY}'
prometheus = "{prom.url}"
query = 'sum(rate(sglang:generation_tokens_total{{role="decode"}}[$window]))'
higher_is_better = true
load_s = 3
concurrency = 8
regression = "5%"
start_noise = "1%"
timeout_s = 5
""")
        _bisect_finds_the_slowdown(s, "decode_tps")
        # the real router is scraped too (its own series are in the server beside the workers')
        router = f'127.0.0.1:{ports["router_metrics"]}'
        got = prom.query(f'count({{instance="{router}", __name__!="up", __name__!~"scrape_.*"}})')
        assert got["data"]["result"] and float(got["data"]["result"][0]["value"][1]) > 0, got
    finally:
        prom.stop()


def test_a_metrics_probe_finds_a_20_percent_throughput_regression(stack):
    s = stack(_rules_20_percent())
    _add_probe(s, f"""
[probes.decode_tokens]
kind = "metrics"
vantage = "node1"
url = "{_chat(s)}"
body = '{PERF_BODY}'
metrics_url = "{s.sim.worker_url('decode')}/metrics"
series = "sglang:generation_tokens_total"
reading = "rate"
labels = {{role = "decode"}}
load_s = 2
concurrency = 8
regression = "5%"
start_noise = "1%"
timeout_s = 5
""")
    _bisect_finds_the_slowdown(s, "decode_tokens")


def test_the_simulated_metrics_show_speed_faults_as_sglang_would(stack):
    """`metrics` probes on decode's gen_throughput gauge and its TTFT histogram: a speed rule (PERF_RULES'
    kind) lowers the gauge, a slow rule (0.3 s more before the first token) moves TTFT's p50 up a bucket."""
    rules = _rules_20_percent()
    rules["rules"].append({"service": "decode", "when": {"SGLANG_SCHEDULER_INTERVAL": "2"}, "fault": "slow",
                           "delay_s": 0.3})
    s = stack(rules)
    common = f"""vantage = "node1"
url = "{_chat(s)}"
body = '{PERF_BODY}'
metrics_url = "{s.sim.worker_url('decode')}/metrics"
concurrency = 4
timeout_s = 5
"""
    _add_probe(s, f"""
[probes.ttft]
kind = "metrics"
{common}series = "sglang:time_to_first_token_seconds"
reading = "quantile"
quantile = 0.5
load_s = 1.5

[probes.gauge]
kind = "metrics"
{common}series = "sglang:gen_throughput"
reading = "gauge"
higher_is_better = true
load_s = 3
""")
    from envbisect.trials.probe import run_probe

    def measure() -> tuple[float, float]:
        with s.deployment() as dep:
            runs = [run_probe(dep.playbook.probes[p], dep.transports) for p in ("ttft", "gauge")]
        assert all(r.outcome == "pass" for r in runs), [r.reason for r in runs]
        return runs[0].value, runs[1].value

    ttft0, gauge0 = measure()
    plant(s.sim, [SLOW])
    ttft1, gauge1 = measure()
    plant(s.sim, [NOOP])
    ttft2, _ = measure()
    # 34% more time per token: about 25% fewer tokens/s on idle cores; with the suite's 4 workers on 2
    # cores the simulated stack is CPU-bound and the drop shrank to 6% in one CI run (193 -> 182)
    assert gauge1 < 0.97 * gauge0, (gauge0, gauge1)
    # a 16-token decode (the router asks max_new_tokens) takes 0.13-0.19 s: bucket (0.1, 0.25]; 0.3 s more: (0.25, 0.5]
    assert 0.1 < ttft0 <= 0.25 and 0.1 < ttft1 <= 0.25 and 0.25 < ttft2 <= 0.5, (ttft0, ttft1, ttft2)


QA = [f'{{"prompt": "What is {a} + {b}?", "answer": "{a + b}"}}' for a, b in
      ((2, 3), (17, 25), (40, 2), (9, 9), (11, 30), (7, 8), (100, 1), (12, 12), (5, 60), (33, 44),
       (21, 21), (3, 4), (8, 80), (14, 15), (6, 7), (50, 50), (1, 1), (19, 23))]
QA += ['{"prompt": "What is 6 * 7? A) 41 B) 42 C) 43", "choice": "B"}',
       '{"prompt": "What is the capital of France?", "regex": "(?i)paris"}']  # the stack does not know: 95%


def test_an_answers_probe_finds_an_accuracy_drop_every_http_probe_passes(stack):
    rules = {"rules": [{"service": "decode", "when": {"SGLANG_ENABLE_JIT_DEEPGEMM": "1"}, "fault": "wrong",
                        "rate": 0.37, "seed": 7}]}  # 95% of the prompts right -> 95% x 63% = 60%
    s = stack(rules)
    (s.sim.playbook.parent / "qa.jsonl").write_text("\n".join(QA) + "\n")
    _add_probe(s, f"""
[probes.accuracy]
kind = "answers"
vantage = "node1"
url = "{_chat(s)}"
answers = "qa.jsonl"
requests = 200
concurrency = 8
tolerance = "10%"
timeout_s = 5
""")
    s.baseline()
    plant(s.sim, [OTHERS[0], WRONG, OTHERS[2]])
    # every HTTP-level probe passes on the broken configuration: the wrong answers are well-formed 200s
    # (snapshot --probe: probed as it runs, no edit, no restart)
    for probe in ("e2e", "multi_round", "burst"):
        r = s.cli("snapshot", "--label", f"http-{probe}", "--probe", probe, "--json", timeout=120)
        assert r.returncode == 0 and json.loads(r.stdout)["probe"]["outcome"] == "pass", (probe, r.stdout[-600:],
                                                                                           r.stderr[-600:])
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="accuracy")
    trials = [(t.n, t.purpose, t.outcome, t.reason) for t in r.trials]
    assert r.verdict.kind == "culprit", (r.verdict, trials)
    assert r.culprit_deltas == ("decode:SGLANG_ENABLE_JIT_DEEPGEMM",), trials
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before
    base = r.trials[0]
    assert base.kind.value == "premise-baseline" and base.outcome == "pass"
    assert 0.9 <= base.probe_runs[0].value <= 0.97, base.reason  # 19 of 20 prompts answerable
    cur = [t for t in r.trials if len(t.config) == 3]
    assert cur[-1].outcome == "fail" and "beyond chance" in cur[-1].reason, cur[-1].reason
    assert 0.5 <= cur[-1].probe_runs[0].value <= 0.7, cur[-1].reason
    innocent = [t for t in r.trials if t.config and "decode:SGLANG_ENABLE_JIT_DEEPGEMM" not in t.config]
    assert innocent and all(t.outcome == "pass" for t in innocent), trials
