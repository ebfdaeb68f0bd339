"""Revert-and-verify and the layered verify, on the simulated PD deployment."""
from __future__ import annotations

import json

import pytest

from test_bisect_sim import INNOCENT, Scenario, plant, scenario, tree_fingerprint  # noqa: F401 - fixture

pytestmark = pytest.mark.sim
BAD = ("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")


def test_verify_layers_healthy_then_broken(scenario):
    s = scenario()
    r = s.cli("verify", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    names = [l["layer"] for l in doc["layers"]]
    assert names[:3] == ["health: prefill", "health: decode", "health: router"]
    assert "16 concurrent via router" in names and any("keep-alive" in n for n in names)
    assert {"direct: prefill", "direct: decode"} <= set(names)
    assert doc["ok"] and all(l["ok"] for l in doc["layers"])
    plant(s.sim, [BAD])
    r = s.cli("verify", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["failed_at"] == "one request via router"
    later = [l for l in doc["layers"] if l["layer"].startswith("16 concurrent")]
    assert later[0]["ok"] is None  # stops at the first failing layer
    direct = {l["layer"]: l["ok"] for l in doc["layers"] if l["informational"]}
    assert direct == {"direct: prefill": True, "direct: decode": False}
    assert "decode" in doc["summary"]
    r = s.cli("verify")
    assert "FAIL" in r.stdout and "verify" in r.stdout


def test_bisect_then_revert_verdict_verify_keeps_innocent_deltas(scenario):
    s = scenario()
    s.baseline()
    # the same knob raised on both sides, only the decode side breaks the stack (issue 7): the
    # auto-linked pair is tested apart and `revert --verdict` reverts only the guilty side
    plant(s.sim, INNOCENT[:2] + [BAD, ("prefill", BAD[1], BAD[2])] + INNOCENT[2:3])
    r = s.cli("bisect", "--against", "good", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["culprits"] == ["decode:SGLANG_SM120_MMA_TARGET_CTAS"], r.stdout
    r = s.cli("revert", "--verdict", "--verify", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["deltas"] == ["decode:SGLANG_SM120_MMA_TARGET_CTAS"] and doc["ok"]
    assert doc["probe"]["outcome"] == "pass" and doc["verify"]["ok"]
    decode = s.sim.env_file("decode").read_text()
    assert "SGLANG_SM120_MMA_TARGET_CTAS=128" in decode  # back to the baseline value
    assert "SGLANG_ENABLE_JIT_DEEPGEMM=1" in decode  # the innocent knob on the same file stays
    prefill = s.sim.env_file("prefill").read_text()
    assert "NCCL_DEBUG=INFO" in prefill and "SGLANG_SM120_MMA_TARGET_CTAS=256" in prefill  # innocent side kept
    r = s.cli("runs", "--json")
    kinds = [(row["kind"], row["status"]) for row in json.loads(r.stdout)]
    assert ("bisect", "culprit") in kinds and ("revert", "ok") in kinds
    # ... and the evidence for the postmortem, from the CLI
    out = s.store.parent / "pm.tar.gz"
    r = s.cli("bundle", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["members"] > 10 and out.exists()
    r = s.cli("bundle", "--check", str(out))
    assert r.returncode == 0 and "manifest OK" in r.stdout
    import tarfile

    with tarfile.open(out) as tar:
        html = tar.extractfile("report.html").read().decode()
    assert 'id="trials-chart"' in html and "SGLANG_SM120_MMA_TARGET_CTAS" in html


def test_revert_of_innocent_delta_is_put_back(scenario):
    s = scenario()
    s.baseline()
    plant(s.sim, INNOCENT[:2] + [BAD])
    r = s.cli("bisect", "--against", "good", "--json")
    assert r.returncode == 0, r.stderr
    before = tree_fingerprint(s.sim)
    r = s.cli("revert", "prefill:NCCL_DEBUG", "--json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["probe"]["outcome"] == "fail" and doc["put_back"] and not doc["ok"]
    assert "do not blame" in doc["notes"][0]
    after = tree_fingerprint(s.sim)
    # same bytes and mode as before the revert (mtimes move: the file was really rewritten twice)
    assert {k: v[:3] for k, v in after.items() if k != "HEAD"} == {k: v[:3] for k, v in before.items() if k != "HEAD"}
    # apply is the inverse of revert
    r = s.cli("revert", "decode:SGLANG_SM120_MMA_TARGET_CTAS", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["probe"]["outcome"] == "pass"
    r = s.cli("apply", "decode:SGLANG_SM120_MMA_TARGET_CTAS", "--json")
    assert json.loads(r.stdout)["probe"]["outcome"] == "fail"
    assert "SGLANG_SM120_MMA_TARGET_CTAS=256" in s.sim.env_file("decode").read_text()
    r = s.cli("show", json.loads(s.cli("runs", "--json").stdout)[0]["run"])
    assert r.returncode == 0 and "culprit" in r.stdout


def test_revert_bad_input(scenario):
    s = scenario()
    r = s.cli("revert", "decode:NOPE")
    assert r.returncode == 2 and "no bisect run" in r.stderr
