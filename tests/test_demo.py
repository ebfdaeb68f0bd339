"""`envbisect demo` and `envbisect demo --perf`: the README's first command, end to end (the
simulated PD deployment behind the real sglang-router; a planted change among innocent ones)."""
from __future__ import annotations

import json
import subprocess

import pytest

from test_bisect_sim import ENVBISECT

pytestmark = pytest.mark.sim


@pytest.mark.parametrize("perf", [False, True], ids=["hang", "perf"])
def test_demo_finds_the_planted_change_and_blames_nothing_else(perf):
    args = [*ENVBISECT, "demo", "--json"] + (["--perf"] if perf else [])
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    b = doc["bisect"]
    assert b["verdict"] == "culprit" and b["culprits"] == [doc["planted"]["bad"]], (b["verdict"], b["culprits"])
    assert b["state_left"] == "original"
    kinds = [t["kind"] for t in b["trials"]]
    assert "premise-baseline" in kinds and "premise-current" in kinds  # both premises observed
    if not perf:  # issue 25: one culprit among 7 deltas within ceil(log2 n + 2.5) restarts
        assert b["restarts"] <= 6, [(t["kind"], t["purpose"]) for t in b["trials"]]
    if perf:
        assert doc["planted"]["bad"] == "decode:SGLANG_CUDA_GRAPH_MAX_BS"
        assert kinds[0] == "premise-baseline" and all(run["value"] for run in b["trials"][0]["probe"]["runs"])
        assert "decode:SGLANG_SM120_MMA_TARGET_CTAS" not in b["culprits"]  # the speed-up is kept


def test_two_demos_on_one_machine_are_two_deployments(tmp_path, monkeypatch):
    """Two demos at once (the two cases above, under xdist) each lock their own deployment: a
    shared name made the second wait for the first's lock and exit 2."""
    from envbisect.cli import demo as demo_mod
    from envbisect.hosts.journal_records import remote_paths

    names = [demo_mod.deployment_name(tmp_path / "one"), demo_mod.deployment_name(tmp_path / "two")]
    assert names[0] != names[1] and all(n.startswith("envbisect-demo-") for n in names)
    assert remote_paths(names[0])[0] != remote_paths(names[1])[0]
    assert demo_mod.deployment_name(tmp_path / "one") == names[0]  # one root, one name
