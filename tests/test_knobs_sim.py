"""What the deployed engine says about its knobs (issue 24, part 4), on the simulated PD deployment
over the real sshd: the workers' python sees a tiny installed sglang (sim/installed.py) whose
environ.py and server_args.py envbisect reads as text on the host. An alias pair written SGL_... in
prefill and SGLANG_... in decode is one linked unit, never named on its own while the real culprit is
elsewhere; `diff` marks a variable the installed version does not read, and a removed knob shows its
documented default. Without a readable package, today's behaviour stays, with a note."""
from __future__ import annotations

import shutil

import pytest

from test_bisect_sim import plant, scenario, tree_fingerprint  # noqa: F401 - fixture

pytestmark = [pytest.mark.sim, pytest.mark.slow]

ALIAS = [("prefill", "SGL_TEST_RETRACT", "1"), ("decode", "SGLANG_TEST_RETRACT", "1")]
GUILTY = "decode:SGLANG_SM120_MMA_TARGET_CTAS"


def knob_scenario(scenario, sshd):
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    s.baseline()
    plant(s.sim, ALIAS + [("decode", "SGLANG_TYPO_X", "1"),
                          ("decode", "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", None),
                          ("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")])
    return s


def test_alias_pair_is_linked_and_never_named_alone(scenario, sshd):
    s = knob_scenario(scenario, sshd)
    before = tree_fingerprint(s.sim)
    with s.deployment() as dep:
        diff = dep.diff(against="good")
    by = {d.id: d for d in diff.deltas}
    assert by["prefill:SGL_TEST_RETRACT"].knob == by["decode:SGLANG_TEST_RETRACT"].knob == "SGLANG_TEST_RETRACT"
    assert ["prefill:SGL_TEST_RETRACT", "decode:SGLANG_TEST_RETRACT"] in diff.links()

    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit", r.verdict
    assert r.culprit_deltas == (GUILTY,)
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before

    out = s.cli("diff", "--against", "good")
    assert "prefill:SGL_TEST_RETRACT + decode:SGLANG_TEST_RETRACT" in out.stdout, out.stdout
    assert "SGLANG_TYPO_X is not read by the installed sglang 0.5.3: typo or stale?" in out.stdout, out.stdout
    assert "removed: back to the default 5.0" in out.stdout, out.stdout
    # a known variable is not marked
    assert "SGL_TEST_RETRACT is not read" not in out.stdout
    assert "SGLANG_SM120_MMA_TARGET_CTAS is not read" not in out.stdout


def test_unreadable_package_keeps_todays_behaviour_with_a_note(scenario, sshd):
    s = knob_scenario(scenario, sshd)
    shutil.rmtree(s.sim.root / "site-packages")  # the workers run; their PYTHONPATH names nothing now
    with s.deployment() as dep:
        diff = dep.diff(against="good")
    assert all(d.knob is None for d in diff.deltas)
    assert ["prefill:SGL_TEST_RETRACT", "decode:SGLANG_TEST_RETRACT"] not in diff.links()
    assert not any("not read by the installed" in x for d in diff.deltas for x in d.detail)
    assert any("node1: the installed engine's knobs could not be read (no sglang package found" in n
               for n in diff.notes), diff.notes
