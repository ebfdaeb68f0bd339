"""Issue 21 part 1, end to end over a real sshd and the simulated PD deployment: a trial that fails
differently from the symptom is not the symptom.

The culprit makes decode hang (decode SGLANG_SM120_MMA_TARGET_CTAS=256). Beside it, an innocent
pair: SGLANG_ENABLE_X=1 needs SGLANG_X_PATH, and a worker started with the first and not the
second exits at start (a simulated rule; across services, decode checks what the prefill it
handshakes with enables). The current configuration has both, so it starts and hangs: the
symptom is a hang, and a trial that does not start is another failure. The deltas are placed so
that the first bisection step holds ENABLE_X without X_PATH (the split is forced): counted as the
symptom, that start failure names the innocent half of the pair.
"""
from __future__ import annotations

import copy
import json

import pytest

from envbisect.report.markdown import md_text
from envbisect.report.markdown import render_markdown
from envbisect.report.record import load_run
from envbisect.sim.stack import DEFAULT_RULES
from test_bisect_sim import INNOCENT, plant, scenario, tree_fingerprint  # noqa: F401 - fixture

pytestmark = [pytest.mark.sim, pytest.mark.slow]
CULPRIT = ("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")


def rules(*extra: dict) -> dict:
    r = copy.deepcopy(DEFAULT_RULES)
    r["rules"] += list(extra)
    return r


SAME_SERVICE = {"service": "decode", "when": {"SGLANG_ENABLE_X": "1", "SGLANG_X_PATH": None}, "fault": "crash",
                "message": "SGLANG_ENABLE_X=1 needs SGLANG_X_PATH"}
ACROSS = {"service": "decode", "when": {"SGLANG_X_PATH": None}, "when_peer": {"SGLANG_ENABLE_X": "1"},
          "fault": "crash", "message": "prefill enables X; decode has no SGLANG_X_PATH"}


def _check(s, r, needy: str, partner: str, before) -> None:  # noqa: ANN001
    assert r.verdict.kind == "culprit", (r.verdict, [(t.n, t.purpose, t.outcome, t.symptom) for t in r.trials])
    assert r.culprit_deltas == ("decode:SGLANG_SM120_MMA_TARGET_CTAS",), (r.verdict.explanation, r.notes)
    other = [t for t in r.trials if t.symptom == "other"]
    assert other and all(t.outcome == "start-failure" for t in other)
    assert r.symptom and r.symptom["kind"] == "hang", r.symptom
    deps = r.dependencies
    assert len(deps) == 1 and deps[0]["needy"] == [needy] and deps[0]["partners"] == [partner], deps
    assert deps[0]["observed"] and "fails to start without it" in deps[0]["text"], deps
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before
    doc = json.loads((s.store / "runs" / r.run_id / "run.json").read_text())
    assert doc["symptom"]["kind"] == "hang"
    v = json.loads((s.store / "runs" / r.run_id / "verdict.json").read_text())
    assert v["dependencies"][0]["needy"] == [needy]
    md = render_markdown(load_run(s.store / "runs" / r.run_id))
    assert "**Symptom: **hang" in md and "another failure, not the symptom" in md, md[:3000]
    assert "Dependencies (another failure, not the symptom)." in md and md_text(f"`{needy}` needs `{partner}`") in md


def test_an_innocent_pair_that_fails_to_start_apart_is_a_dependency_not_the_culprit(scenario, sshd):
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config), rules=rules(SAME_SERVICE))
    s.baseline()
    # diff order: prefill's, decode's, router's, each by key: ENABLE_X is in the first half of the
    # bisection order and X_PATH in the second, so the first step (a prefix of 4) splits them
    plant(s.sim, [INNOCENT[0], INNOCENT[4], ("decode", "SGLANG_ENABLE_X", "1"), INNOCENT[3], CULPRIT,
                  ("decode", "SGLANG_X_PATH", "/models/x"), INNOCENT[2]])
    with s.deployment() as dep:
        order = [d.id for d in dep.diff(against="good").deltas]
    assert order.index("decode:SGLANG_ENABLE_X") < len(order) // 2 + 1 <= order.index("decode:SGLANG_X_PATH"), order
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="e2e")
    _check(s, r, "decode:SGLANG_ENABLE_X", "decode:SGLANG_X_PATH", before)


def test_the_pair_split_across_prefill_and_decode(scenario, sshd):
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config), rules=rules(ACROSS))
    s.baseline()
    plant(s.sim, [INNOCENT[0], ("prefill", "SGLANG_ENABLE_X", "1"), INNOCENT[4], CULPRIT, INNOCENT[3],
                  ("decode", "SGLANG_X_PATH", "/models/x"), INNOCENT[2]])
    with s.deployment() as dep:
        order = [d.id for d in dep.diff(against="good").deltas]
    assert order.index("prefill:SGLANG_ENABLE_X") < len(order) // 2 + 1 <= order.index("decode:SGLANG_X_PATH"), order
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="e2e")
    _check(s, r, "prefill:SGLANG_ENABLE_X", "decode:SGLANG_X_PATH", before)


def test_revert_verdict_takes_the_needy_half_with_its_partner_and_a_chosen_revert_that_breaks_it_is_refused(scenario):
    """The culprit is the partner: decode SGLANG_X_PATH=/models/x makes decode hang, and
    SGLANG_ENABLE_X=1 (innocent) needs it to start. Reverting the culprit alone would leave ENABLE_X
    without its partner: `revert --verdict` takes both and says why; `revert X_PATH` is refused."""
    s = scenario(rules=rules(SAME_SERVICE, {"service": "decode", "when": {"SGLANG_X_PATH": "/models/x"},
                                            "fault": "hang"}))
    s.baseline()
    plant(s.sim, [INNOCENT[0], ("decode", "SGLANG_ENABLE_X", "1"), INNOCENT[3],
                  ("decode", "SGLANG_X_PATH", "/models/x"), INNOCENT[2]])
    p = s.cli("bisect", "--against", "good", "--probe", "e2e", "--json")
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "culprit" and doc["culprits"] == ["decode:SGLANG_X_PATH"], (doc["explanation"], p.stderr)
    assert [(d["needy"], d["partners"]) for d in doc["dependencies"]] == [(["decode:SGLANG_ENABLE_X"],
                                                                          ["decode:SGLANG_X_PATH"])]
    refused = s.cli("revert", "decode:SGLANG_X_PATH")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "would leave decode:SGLANG_ENABLE_X without the partner it needs" in refused.stderr
    r = s.cli("revert", "--verdict", "--json")
    res = json.loads(r.stdout)
    assert r.returncode == 0 and set(res["deltas"]) == {"decode:SGLANG_X_PATH", "decode:SGLANG_ENABLE_X"}, r.stdout
    assert any(n.startswith("also reverted decode:SGLANG_ENABLE_X: it needs decode:SGLANG_X_PATH")
               for n in res["notes"])
    text = s.sim.env_file("decode").read_text()
    assert "SGLANG_X_PATH" not in text and "SGLANG_ENABLE_X=" not in text and "NCCL_IB_GID_INDEX=5" in text
