"""Verdict truth end to end (issue 7) on the simulated PD deployment (real sglang-router, workers
whose faults come from the environment they were started with, over the local transport): a
value both sides must agree on, two independent culprits, a fault on 30% of requests, and zero
deltas on a failing stack. Each run must name no innocent delta and leave the hosts as it found them."""
from __future__ import annotations

import copy
import json

import pytest

from envbisect.inputs.envfile import EnvFileError, parse_env
from envbisect.search import restart_bound
from envbisect.sim.stack import DEFAULT_RULES
from test_bisect_sim import INNOCENT, plant, scenario, tree_fingerprint  # noqa: F401 - fixture

pytestmark = pytest.mark.sim


def rules(*extra: dict) -> dict:
    r = copy.deepcopy(DEFAULT_RULES)
    r["rules"] += list(extra)
    return r


def test_kv_layout_value_on_both_sides_is_reported_as_the_group(scenario):
    """SGLANG_KV_CACHE_DTYPE is part of the KV layout: prefill and decode must agree on it, so each
    side alone breaks the stack (layout mismatch) and, here, the new value breaks decode too.
    Tested apart, both members fail alone: the auto-linked group is the verdict."""
    s = scenario(rules=rules({"service": "decode", "when": {"SGLANG_KV_CACHE_DTYPE": "bf16"}, "fault": "5xx"}))
    s.baseline()
    plant(s.sim, INNOCENT[:3] + [("prefill", "SGLANG_KV_CACHE_DTYPE", "bf16"),
                                 ("decode", "SGLANG_KV_CACHE_DTYPE", "bf16")])
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit", r.verdict
    assert set(r.culprit_deltas) == {"prefill:SGLANG_KV_CACHE_DTYPE", "decode:SGLANG_KV_CACHE_DTYPE"}, r.notes
    note = next(n for n in r.notes if "tested apart" in n)
    assert "each side breaks it alone" in note and "reported as the group" in note
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before


def test_two_independent_culprits_are_both_named(scenario):
    """Two deltas each break the stack alone. The default policy sees the fix fail after the
    first culprit and goes on: both are named, the fix (current minus both) is observed."""
    s = scenario(rules=rules({"service": "prefill", "when": {"SGLANG_ENABLE_TORCH_COMPILE": "1"}, "fault": "5xx"},
                             {"service": "decode", "when": {"SGLANG_MOE_A2A_BACKEND": "deepep"}, "fault": "5xx"}))
    s.baseline()
    plant(s.sim, INNOCENT[:2] + [("prefill", "SGLANG_ENABLE_TORCH_COMPILE", "1")] + INNOCENT[2:4]
          + [("decode", "SGLANG_MOE_A2A_BACKEND", "deepep")] + INNOCENT[4:])
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit", r.verdict
    assert set(r.culprit_deltas) == {"prefill:SGLANG_ENABLE_TORCH_COMPILE", "decode:SGLANG_MOE_A2A_BACKEND"}
    fix = [t for t in r.trials if t.purpose.startswith("confirm: current without") and t.outcome == "pass"]
    assert fix and set(fix[-1].units).isdisjoint(r.culprit_deltas)
    assert "Inferred" not in r.verdict.explanation, r.verdict.explanation
    assert r.restarts <= restart_bound(len(r.units), "several"), [t.purpose for t in r.trials]
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before


def test_fault_on_30_percent_of_requests_is_found_without_false_blame(scenario):
    """A hang on 30% of requests (a 5xx would be retried away by the router)."""
    s = scenario(rules=rules({"service": "decode", "when": {"NCCL_IB_GID_INDEX": "5"}, "fault": "intermittent",
                              "p": 0.3, "seed": 11, "mode": "hang"}))
    s.baseline()
    plant(s.sim, INNOCENT)
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit", r.verdict
    assert r.culprit_deltas == ("decode:NCCL_IB_GID_INDEX",)
    assert r.verdict.confidence >= 0.95 and "intermittent" in r.verdict.explanation
    # the premise kept probing past the first failure: the failure rate is measured where it is cheap
    assert r.trials[0].failures >= 2
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before


def test_zero_deltas_on_a_failing_stack_is_not_config_after_a_co_restart(scenario):
    """Nothing changed since the baseline, but the client path hangs on reused connections (the
    incident). The running stack is probed first (free), then co-restarted (a running process may
    hold more than its files), and only a failure after the co-restart makes the verdict."""
    s = scenario(with_proxy_hang_after=3)
    s.baseline()
    before = tree_fingerprint(s.sim)
    p = s.cli("bisect", "--against", "good", "--probe", "client", "--json")
    doc = json.loads(p.stdout)
    assert p.returncode == 4 and doc["verdict"] == "not-config", (p.stdout, p.stderr)
    t1, t2 = doc["trials"]
    assert t1["free"] and t1["outcome"] == "fail" and not t2["free"] and t2["outcome"] == "fail"
    assert doc["restarts"] == 1
    assert doc["path"]["broken_at"] == "client path"
    assert tree_fingerprint(s.sim) == before


def test_a_matched_kv_change_written_differently_on_each_side_stays_linked_and_is_not_named(scenario):
    """Red-team S16b: the KV page size goes 64 -> 128 on both sides, prefill as `128` and decode as
    `${KV_PAGE:-128}` (bash makes 128 of it). Together the two are innocent; each alone is a layout
    mismatch. They must be linked by what bash makes of them, not by their text, or the search
    splits them and names both as culprits next to the real one (decode CTAS)."""
    s = scenario()
    s.baseline()
    plant(s.sim, [("prefill", "NCCL_DEBUG", "INFO"), ("prefill", "SGLANG_KV_PAGE_SIZE", "128"),
                  ("router", "ROUTER_LOG_LEVEL", "debug")], restart=False)
    decode = s.sim.env_file("decode")
    text = decode.read_text()
    assert text.count("export SGLANG_KV_PAGE_SIZE=64\n") == 1
    decode.write_text(text.replace("export SGLANG_KV_PAGE_SIZE=64\n", "export SGLANG_KV_PAGE_SIZE=${KV_PAGE:-128}\n"))
    plant(s.sim, [("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")])
    with s.deployment() as dep:
        diff = dep.diff(against="good")
    kv = {d.id: d for d in diff.deltas if d.key == "SGLANG_KV_PAGE_SIZE"}
    assert set(kv) == {"prefill:SGLANG_KV_PAGE_SIZE", "decode:SGLANG_KV_PAGE_SIZE"}
    assert kv["decode:SGLANG_KV_PAGE_SIZE"].new_eval == "128" != kv["decode:SGLANG_KV_PAGE_SIZE"].new
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit", r.verdict
    assert r.culprit_deltas == ("decode:SGLANG_SM120_MMA_TARGET_CTAS",), (r.culprit_deltas, r.verdict.explanation)
    assert any(n.startswith("SGLANG_KV_PAGE_SIZE changed the same way") for n in r.notes), r.notes
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before


def _edit(sim, service: str, old: str, new: str) -> None:
    p = sim.env_file(service)
    text = p.read_text()
    assert text.count(old) == 1, (old, text)
    p.write_text(text.replace(old, new))


def _whole_file_found(s, before) -> None:
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit", (r.verdict, r.notes)
    path = str(s.sim.env_file("decode"))
    assert len(r.culprit_deltas) == 1 and r.culprit_deltas[0].startswith("file:") and \
        r.culprit_deltas[0].endswith(path), r.culprit_deltas
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before


def test_a_moved_line_that_changes_what_bash_makes_is_a_delta(scenario):
    """Red-team S15: SGLANG_DATA_ROOT is moved below the line that reads it. No assignment's text
    changed, but bash now makes SGLANG_KV_DIR=/kv and decode hangs. The diff must not be empty
    (it was, and the verdict was a false not-config): the file is compared as a whole."""
    s = scenario(rules=rules({"service": "decode", "when": {"SGLANG_KV_DIR": "/kv"}, "fault": "hang"}))
    _edit(s.sim, "decode", "# --- kernels ---\n",
          "# --- kernels ---\nexport SGLANG_DATA_ROOT=/data\nexport SGLANG_KV_DIR=\"$SGLANG_DATA_ROOT/kv\"\n")
    s.sim.age_files()
    s.sim.co_restart()
    s.baseline()
    _edit(s.sim, "decode", "export SGLANG_DATA_ROOT=/data\n", "")
    p = s.sim.env_file("decode")
    p.write_text(p.read_text() + "export SGLANG_DATA_ROOT=/data\n")
    plant(s.sim, [("prefill", "NCCL_DEBUG", "INFO")])
    with s.deployment() as dep:
        diff = dep.diff(against="good")
    assert any("SGLANG_KV_DIR" in n and "whole file" in n for n in diff.notes), diff.notes
    _whole_file_found(s, tree_fingerprint(s.sim))


def test_an_edit_of_a_shadowed_copy_that_a_line_reads_is_a_delta(scenario):
    """Red-team S18: the early copy of a key assigned twice is edited; the last copy (which wins)
    is not, but a line between the two reads the early one."""
    s = scenario(rules=rules({"service": "decode", "when": {"SGLANG_DECODE_BACKEND": "triton"}, "fault": "hang"}))
    _edit(s.sim, "decode", "# --- kernels ---\n", "# --- kernels ---\nexport SGLANG_ATTN_BACKEND=fa3\n"
          "export SGLANG_DECODE_BACKEND=\"$SGLANG_ATTN_BACKEND\"\n")
    p = s.sim.env_file("decode")
    p.write_text(p.read_text() + "export SGLANG_ATTN_BACKEND=flashinfer\n")
    s.sim.age_files()
    s.sim.co_restart()
    s.baseline()
    _edit(s.sim, "decode", "export SGLANG_ATTN_BACKEND=fa3\n", "export SGLANG_ATTN_BACKEND=triton\n")
    plant(s.sim, [("prefill", "NCCL_DEBUG", "INFO")])
    _whole_file_found(s, tree_fingerprint(s.sim))


def test_a_baseline_that_is_not_parseable_per_key_is_compared_as_a_whole_file(scenario):
    """The baseline has two statements on one line (`export A=1; export B=2`: valid bash, refused by the
    per-key parser, which reads only assignments on a line). Its deltas must not be dropped with a note
    (a false not-config): the file is compared as a whole, and the whole file is the culprit."""
    s = scenario()
    one_line = "export NCCL_DEBUG=WARN; export NCCL_DEBUG_SUBSYS=INIT"
    with pytest.raises(EnvFileError):
        parse_env(one_line + "\n")
    _edit(s.sim, "decode", "export NCCL_DEBUG=WARN", one_line)
    s.sim.age_files()
    s.sim.co_restart()
    s.baseline()
    _edit(s.sim, "decode", one_line, "export NCCL_DEBUG=WARN\nexport NCCL_DEBUG_SUBSYS=INIT")
    _edit(s.sim, "decode", "export SGLANG_SM120_MMA_TARGET_CTAS=128", "export SGLANG_SM120_MMA_TARGET_CTAS=256")
    plant(s.sim, [("prefill", "NCCL_DEBUG", "INFO")])
    _whole_file_found(s, tree_fingerprint(s.sim))


def test_not_config_with_a_hanging_engine_names_that_engine(scenario):
    """Red-team S10b: nothing changed, but decode hangs on every request (a GPU fault) while its
    health check passes. The path check sends the request straight to each engine when the router
    fails, and says to look at decode, not at "the transfer and routing"."""
    s = scenario()
    s.baseline()
    s.sim.set_rules(rules({"service": "decode", "when": {}, "fault": "hang"}))
    s.sim.co_restart()
    p = s.cli("bisect", "--against", "good", "--probe", "e2e", "--json")
    doc = json.loads(p.stdout)
    assert p.returncode == 4 and doc["verdict"] == "not-config", (p.stdout, p.stderr)
    path = doc["path"]
    assert path["broken_at"].startswith("router"), path
    direct = {l["layer"]: l["ok"] for l in path["layers"] if l["informational"]}
    assert direct == {"direct: prefill": True, "direct: decode": False}, path["layers"]
    assert "decode also fails when asked directly" in path["conclusion"], path["conclusion"]


def test_a_hang_masking_a_500_names_both_each_with_its_fingerprint(scenario):
    """Issue 34: prefill's SGLANG_CHUNKED_PREFILL_SIZE makes requests hang; decode's
    SGLANG_DISAGGREGATION_NUM_RESERVED_DECODE_TOKENS makes them fail with HTTP 500 once the hang is
    gone. Current hangs (the 500 is masked); current without the hang answers 500: a second fault,
    bisected in the same run, never a dependency of the first. `revert --verdict --verify` passes."""
    s = scenario(rules=rules(
        {"service": "prefill", "when": {"SGLANG_CHUNKED_PREFILL_SIZE": "16384"}, "fault": "hang"},
        {"service": "decode", "when": {"SGLANG_DISAGGREGATION_NUM_RESERVED_DECODE_TOKENS": "4096"}, "fault": "5xx"}))
    s.baseline()
    plant(s.sim, INNOCENT[:2] + [("prefill", "SGLANG_CHUNKED_PREFILL_SIZE", "16384")] + INNOCENT[2:4]
          + [("decode", "SGLANG_DISAGGREGATION_NUM_RESERVED_DECODE_TOKENS", "4096")] + INNOCENT[4:]
          + [("router", "ROUTER_EXTRA", "1"), ("decode", "NCCL_SOCKET_IFNAME", "eth1")])
    before = tree_fingerprint(s.sim)
    r = s.cli("bisect", "--against", "good", "--probe", "e2e")
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "faults (each with its own fingerprint):" in r.stdout and "dependencies" not in r.stdout, r.stdout
    assert "`prefill:SGLANG_CHUNKED_PREFILL_SIZE`: hang" in r.stdout, r.stdout
    assert ("`decode:SGLANG_DISAGGREGATION_NUM_RESERVED_DECODE_TOKENS`: HTTP 5" in r.stdout
            and "once the faults before it are reverted" in r.stdout), r.stdout
    assert "restart budget: " in r.stderr
    assert tree_fingerprint(s.sim) == before
    rv = s.cli("revert", "--verdict", "--verify", "--json")
    assert rv.returncode == 0, rv.stdout + rv.stderr
    doc = json.loads(rv.stdout)
    assert set(doc["deltas"]) == {"prefill:SGLANG_CHUNKED_PREFILL_SIZE",
                                  "decode:SGLANG_DISAGGREGATION_NUM_RESERVED_DECODE_TOKENS"} and doc["ok"], doc


def test_a_must_match_pair_whose_sides_alone_hang_is_named_as_one_culprit(scenario):
    """Issue 34: SGLANG_KV_PAGE_SIZE 64 -> 128 in prefill and decode: together HTTP 500 (the
    symptom), either side alone a layout mismatch (a hang). The auto-linked pair is the culprit;
    splitting it refines a verdict, never erases it (it was inconclusive at 50/50)."""
    s = scenario(rules=rules({"service": "decode", "when": {"SGLANG_KV_PAGE_SIZE": "128"},
                              "when_peer": {"SGLANG_KV_PAGE_SIZE": "128"}, "fault": "5xx"}))
    s.baseline()
    plant(s.sim, INNOCENT[:3] + [("prefill", "SGLANG_KV_PAGE_SIZE", "128"), ("decode", "SGLANG_KV_PAGE_SIZE", "128")]
          + INNOCENT[3:])
    before = tree_fingerprint(s.sim)
    r = s.cli("bisect", "--against", "good", "--probe", "e2e")
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "culprit(s), which must all go: prefill:SGLANG_KV_PAGE_SIZE, decode:SGLANG_KV_PAGE_SIZE" in r.stdout, r.stdout
    assert "dependencies" not in r.stdout, r.stdout
    assert tree_fingerprint(s.sim) == before


def test_traffic_that_trips_the_real_routers_breaker_still_gives_the_culprit(scenario):
    """Issue 39: decode's SGLANG_ENABLE_TORCH_COMPILE=1 answers HTTP 500; user traffic before the
    bisection opens the real sglang-router's circuit breaker, so the running stack answers 503. The
    503 is the stack's state; every fresh start answers 500. It once looped on "confirm after a
    co-restart" without end; now the culprit, within the restart budget, exit 0."""
    import urllib.error
    import urllib.request

    from envbisect.search import default_budget

    s = scenario(rules=rules({"service": "decode", "when": {"SGLANG_ENABLE_TORCH_COMPILE": "1"}, "fault": "5xx"}))
    s.baseline()
    plant(s.sim, INNOCENT[:1] + [("decode", "SGLANG_ENABLE_TORCH_COMPILE", "1")] + INNOCENT[1:2])
    statuses = []
    for _ in range(30):  # user requests hit the broken stack until the breaker opens
        req = urllib.request.Request(s.sim.chat_url, method="POST", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                      "max_tokens": 4}).encode())
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                statuses.append(resp.status)
        except urllib.error.HTTPError as e:
            statuses.append(e.code)
        if statuses[-1] == 503:
            break
    assert statuses[-1] == 503, statuses  # the breaker is open: the running stack answers 503
    before = tree_fingerprint(s.sim)
    r = s.cli("bisect", "--against", "good", "--probe", "e2e", "--json", timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["culprits"] == ["decode:SGLANG_ENABLE_TORCH_COMPILE"], doc["explanation"]
    assert doc["restarts"] <= default_budget(3)
    assert "503" in (doc["stack_state"] or ""), doc["stack_state"]
    assert tree_fingerprint(s.sim) == before
