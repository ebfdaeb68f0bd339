"""An engine upgrade as a change (issue 37, part 2), on the simulated PD deployment over the real sshd:
the workers' python sees the real files and dist-info of sglang 0.5.18 at noon and of 0.5.23 now (a
`pip install -U` with nothing else to show for it). The snapshot records each service's package
versions; the diff shows the upgrade as `decode:pkg:sglang 0.5.18 → 0.5.23` with what it changed under
the deployment's settings (read from both releases' registries, the old one kept by the baseline
snapshot); without a playbook versions table the bisection runs over the other deltas and, the
baseline trial failing too, is INCONCLUSIVE naming the untested upgrade, never NOT-CONFIG."""
from __future__ import annotations

import json
import shutil

import pytest

from test_bisect_sim import plant, scenario, tree_fingerprint  # noqa: F401 - fixture
from test_sglang_releases import release_files

from envbisect.sim import sglang_release

pytestmark = [pytest.mark.sim, pytest.mark.slow]

OLD, NEW = "0.5.18", "0.5.23"


def install(sim, version: str) -> None:
    """`pip install sglang==VERSION` into the workers' site-packages: the files and the dist-info."""
    site = sim.root / "site-packages"
    shutil.rmtree(site / "sglang", ignore_errors=True)
    for info in site.glob("sglang-*.dist-info"):
        shutil.rmtree(info)
    sglang_release.install(version, site)


def test_an_untested_upgrade_is_shown_with_its_effects_and_blocks_not_config(scenario, sshd):
    release_files(OLD), release_files(NEW)
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    rules = json.loads(s.sim.rules_path.read_text())
    rules["rules"].append({"service": "decode", "fault": "5xx", "when_file": {
        "path": str(s.sim.root / "site-packages" / f"sglang-{NEW}.dist-info" / "METADATA"), "exists": True}})
    s.sim.set_rules(rules)
    install(s.sim, OLD)
    plant(s.sim, [("decode", "SGLANG_ENABLE_NVTX", "1")])  # read by 0.5.18 (an alias), not by 0.5.23
    with s.deployment() as dep:
        good = dep.snapshot("good")
    assert good.hosts["node1"].processes["decode"].packages["sglang"] == OLD
    assert (s.store / "knobs" / f"sglang-{OLD}.json").is_file()  # the baseline's registry, kept

    install(s.sim, NEW)
    plant(s.sim, [("prefill", "NCCL_DEBUG", "INFO")])  # an innocent change beside the upgrade
    before = tree_fingerprint(s.sim)
    with s.deployment() as dep:
        diff = dep.diff(against="good")
    by = {u.id: u for u in diff.upgrades}
    assert set(by) == {"prefill:pkg:sglang", "decode:pkg:sglang"}, diff.upgrades
    up = by["decode:pkg:sglang"]
    assert (up.old, up.new, up.line()) == (OLD, NEW, f"decode:pkg:sglang {OLD} → {NEW}")
    assert f"SGLANG_ENABLE_NVTX is set here and sglang {NEW} no longer reads it: ignored now" in up.effects
    assert "default of SGLANG_ENABLE_FAILED_SESSION_PROBE: false → true (not set here)" in up.effects
    assert [d.id for d in diff.deltas] == ["prefill:NCCL_DEBUG"]

    out = s.cli("diff", "--against", "good")
    assert f"~ decode:pkg:sglang {OLD} → {NEW}   [node1]" in out.stdout, out.stdout
    assert "default of SGLANG_ENABLE_FAILED_SESSION_PROBE: false → true (not set here)" in out.stdout

    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "inconclusive", r.verdict
    assert f"decode:pkg:sglang {OLD} → {NEW}" in r.verdict.explanation, r.verdict.explanation
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before


def test_a_switchable_upgrade_names_the_default_inside_it(scenario, sshd):
    """Two engine environments side by side (0.5.18 kept in site-0.5.18, 0.5.23 installed in place over
    the default one) and a playbook naming both: the upgrade is a delta, each default it changed is one
    too, and decode failing only on 0.5.23 with SGLANG_ENABLE_FAILED_SESSION_PROBE at its new default
    (true) is pinned on the upgrade and that default; the hosts end byte-identical."""
    release_files(OLD), release_files(NEW)
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    site, side = s.sim.root / "site-packages", s.sim.root / f"site-{OLD}"
    sglang_release.install(OLD, side)
    rules = json.loads(s.sim.rules_path.read_text())
    rules["rules"].append({"service": "decode", "fault": "5xx",
                           "when": {"SGLANG_SITE": None, "SGLANG_ENABLE_FAILED_SESSION_PROBE": None},
                           "when_file": {"path": str(site / f"sglang-{NEW}.dist-info" / "METADATA"), "exists": True}})
    s.sim.set_rules(rules)
    s.sim.playbook.write_text(s.sim.playbook.read_text() + f'\n[engine]\nswitch = "SGLANG_SITE"\n'
                              f'[engine.versions]\n"{OLD}" = "{side}"\n"{NEW}" = "{site}"\n')
    install(s.sim, OLD)
    s.sim.co_restart()
    s.baseline()
    install(s.sim, NEW)  # pip install -U in place; the old release stays in site-0.5.18
    plant(s.sim, [("prefill", "NCCL_DEBUG", "INFO")])
    before = tree_fingerprint(s.sim)
    with s.deployment() as dep:
        diff = dep.diff(against="good")
    ids = {d.id for d in diff.deltas}
    assert {"decode:pkg:sglang", "decode:pkg:sglang[SGLANG_ENABLE_FAILED_SESSION_PROBE]", "prefill:NCCL_DEBUG"} <= ids
    assert not any("no trial switched back" in n for n in diff.notes), diff.notes

    r = s.bisect(probe="e2e")
    assert r.verdict.kind in ("culprit", "interaction"), r.verdict
    named = set(r.culprit_deltas)
    assert {"decode:pkg:sglang", "decode:pkg:sglang[SGLANG_ENABLE_FAILED_SESSION_PROBE]"} <= named, r.verdict
    assert "prefill:NCCL_DEBUG" not in named
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before
