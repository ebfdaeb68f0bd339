"""Issue 39 part 2, end to end over a real sshd and the simulated PD deployment: the seed's
client-side proxy (it hangs the 4th request of a reused connection: not config) plus a guilty
change, decode SGLANG_SM120_MMA_TARGET_CTAS=256, which hangs every request, and 2 innocent
changes. The probe goes through the proxy, 6 rounds on one connection: the current state fails at
round 1, the baseline at round 4. The baseline fails differently, so it is not "the baseline
fails too": the culprit is named, and the proxy is reported beside it as a second problem that is
not in the configuration."""
from __future__ import annotations

import json

import pytest

from envbisect.report.markdown import render_markdown
from envbisect.report.record import load_run
from test_bisect_sim import INNOCENT, plant, scenario, tree_fingerprint  # noqa: F401 - fixture

pytestmark = [pytest.mark.sim, pytest.mark.slow]
CULPRIT = ("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")


def test_a_guilty_change_behind_the_seeds_proxy_is_named_and_the_proxy_is_a_second_problem(scenario, sshd):
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config), with_proxy_hang_after=3)
    s.baseline()
    plant(s.sim, [INNOCENT[0], CULPRIT, INNOCENT[3]])
    before = tree_fingerprint(s.sim)
    p = s.cli("bisect", "--against", "good", "--probe", "client", "--json")
    doc = json.loads(p.stdout)
    trials = [(t["n"], t["purpose"], t["outcome"], t["symptom"], t["reason"]) for t in doc["trials"]]
    assert doc["verdict"] == "culprit", (doc["verdict"], doc["explanation"], trials)
    assert p.returncode == 0 and doc["culprits"] == ["decode:SGLANG_SM120_MMA_TARGET_CTAS"], (doc, trials)
    assert doc["symptom"]["kind"] == "hang" and doc["symptom"]["at"] == 1, doc["symptom"]
    second = doc["symptom"]["baseline_failure"]
    assert second["kind"] == "hang" and second["at"] == 4, second
    assert "a second problem, not in the configuration" in doc["explanation"], doc["explanation"]
    assert "round 4" in doc["explanation"], doc["explanation"]
    assert doc["state_left"] == "original" and tree_fingerprint(s.sim) == before
    md = render_markdown(load_run(s.store / "runs" / doc["run"]))
    assert "a second problem, not in the configuration" in md
