"""What the deployed engine says about its knobs (issue 24, part 4), on the simulated PD deployment
over the real sshd: the workers' python sees the files of a real SGLang release (sim/installed.py,
copied from the cache of downloaded wheels), which envbisect reads as text on the host. An alias pair written SGL_... in
prefill and SGLANG_... in decode is one linked unit, never named on its own while the real culprit is
elsewhere; `diff` marks a variable the installed version does not read, and a removed knob shows its
documented default. An alias renamed in an env file or a flag renamed in an argument string, with the
same value, is no change and spends no restart (issue 37). Without a readable package, today's
behaviour stays, with a note."""
from __future__ import annotations

import shutil

import pytest

from test_bisect_sim import plant, scenario, tree_fingerprint  # noqa: F401 - fixture
from test_sglang_releases import release_files

from envbisect.sim.installed import VERSION

pytestmark = [pytest.mark.sim, pytest.mark.slow]

ALIAS = [("prefill", "SGL_TEST_RETRACT", "1"), ("decode", "SGLANG_TEST_RETRACT", "1")]
GUILTY = "decode:SGLANG_SM120_MMA_TARGET_CTAS"


def knob_scenario(scenario, sshd):
    release_files(VERSION)  # the real release is cached (under scripts/test.sh a missing one fails)
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
    assert f"SGLANG_TYPO_X is not read by the installed sglang {VERSION}: typo or stale?" in out.stdout, out.stdout
    assert "removed: back to the default 5.0" in out.stdout, out.stdout
    # a known variable is not marked
    assert "SGL_TEST_RETRACT is not read" not in out.stdout
    # the simulated worker's own variable is one the real release does not read, and the diff says so
    assert f"SGLANG_SM120_MMA_TARGET_CTAS is not read by the installed sglang {VERSION}" in out.stdout


# 0.5.23 declares SGLANG_EPLB_P2P_BATCH_CHUNK_SIZE = EnvIntWithAlias(32, deprecated_name="SGLANG_EPLB_ROCM_...")
RENAMED_ENV = ("SGLANG_EPLB_ROCM_P2P_BATCH_CHUNK_SIZE", "SGLANG_EPLB_P2P_BATCH_CHUNK_SIZE")


def test_a_renamed_alias_with_the_same_value_spends_no_restart(scenario, sshd):
    """Noon: the old env name and --tp-size in the argument string; now: the new name and
    --tensor-parallel-size, same values, next to the real culprit. Neither rename is a delta: the
    bisection tests the culprit alone, and the notes say why the renames are no change."""
    release_files(VERSION)
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    plant(s.sim, [("decode", RENAMED_ENV[0], "64"), ("decode", "SGLANG_EXTRA_ARGS", "--tp-size 1")])
    s.baseline()
    plant(s.sim, [("decode", RENAMED_ENV[0], None), ("decode", RENAMED_ENV[1], "64"),
                  ("decode", "SGLANG_EXTRA_ARGS", "--tensor-parallel-size=1"),
                  ("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")])
    before = tree_fingerprint(s.sim)
    with s.deployment() as dep:
        diff = dep.diff(against="good")
    assert [d.id for d in diff.deltas] == [GUILTY], [d.id for d in diff.deltas]
    notes = "\n".join(diff.notes)
    assert (f"decode: {RENAMED_ENV[0]} became {RENAMED_ENV[1]}" in notes
            and f"the same knob ({RENAMED_ENV[1]}) with the same value 64: no change in meaning" in notes), notes
    assert "--tp-size became --tensor-parallel-size" in notes and "(flag:tp_size) with the same value 1" in notes

    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit" and r.culprit_deltas == (GUILTY,), r.verdict
    # the renamed lines are never written back: each trial's configuration holds the culprit or not
    assert all(set(t.config) <= {GUILTY} for t in r.trials), [t.config for t in r.trials]
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before


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


def test_a_rename_over_a_sourced_new_name_is_tested_and_named(scenario, sshd):
    """Noon: a sourced common.env sets the new name to 16 (what the engine reads) and the env file the
    old name to 64 (ignored: the new name is set). Now the old-name line says the new name, 64: the
    value the engine runs with goes 16 -> 64, the fault. The pair is no rename "with the same value":
    it is tested, and named, never the config exonerated."""
    release_files(VERSION)
    old, new = RENAMED_ENV
    rules = {"rules": [{"service": "decode", "when": {new: "64"}, "fault": "hang"}], "aliases": {old: new}}
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config), rules=rules)
    common = s.sim.root / "conf" / "common.env"
    common.write_text(f"export {new}=16\n")
    env = s.sim.env_file("decode")
    env.write_text(f". {common}\n" + env.read_text())
    plant(s.sim, [("decode", old, "64")])
    s.baseline()
    plant(s.sim, [("decode", old, None), ("decode", new, "64"), ("prefill", "NCCL_DEBUG", "INFO")])
    before = tree_fingerprint(s.sim)
    with s.deployment() as dep:
        diff = dep.diff(against="good")
    assert {f"decode:{old}", f"decode:{new}"} <= {d.id for d in diff.deltas}, diff.notes
    assert not any("no change in meaning" in n for n in diff.notes), diff.notes
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit", r.verdict
    assert f"decode:{new}" in r.culprit_deltas and "prefill:NCCL_DEBUG" not in r.culprit_deltas, r.culprit_deltas
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before
