"""Flags are deltas (issue 24, part 1) on the simulated PD deployment over the real sshd: one flag
among five flag changes of decode's SGLANG_EXTRA_ARGS is named alone, `revert --verdict` takes out
exactly that flag and keeps the other four, and the hosts are byte-identical after the bisection and
after a SIGKILL during a trial followed by `restore`. The simulated decode worker gets the string on
its command line (word-split by its start script) and hangs when `--attention-backend triton`."""
from __future__ import annotations

import json
import os
import shlex
import signal
import tarfile

import pytest

from envbisect.inputs.envfile import parse_env
from envbisect.sim.stack import DEFAULT_RULES

from test_bisect_sim import INNOCENT, plant, scenario, tree_fingerprint  # noqa: F401 - fixture
from test_fault_injection import all_healthy, newest_run

pytestmark = [pytest.mark.sim, pytest.mark.slow]

BASE = "--attention-backend flashinfer --mem-fraction-static 0.8 --enable-metrics --chunked-prefill-size 4096"
CUR = "--attention-backend triton --mem-fraction-static 0.85 --chunked-prefill-size=8192 --disable-radix-cache"
GUILTY = "decode:SGLANG_EXTRA_ARGS[--attention-backend]"
FLAG_IDS = {GUILTY, "decode:SGLANG_EXTRA_ARGS[--mem-fraction-static]", "decode:SGLANG_EXTRA_ARGS[--enable-metrics]",
            "decode:SGLANG_EXTRA_ARGS[--chunked-prefill-size]", "decode:SGLANG_EXTRA_ARGS[--disable-radix-cache]"}
RULES = {**DEFAULT_RULES,
         "rules": [*DEFAULT_RULES["rules"],
                   {"service": "decode", "when_flag": {"--attention-backend": "triton"}, "fault": "hang"}]}


def flag_scenario(scenario, sshd):
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config), rules=RULES,
                 env={"decode": {"SGLANG_EXTRA_ARGS": BASE}})
    s.baseline()
    # five flag changes: one that hangs decode, two other changes (one now written --k=v), one flag
    # removed, one added; and two innocent variables of other keys
    plant(s.sim, INNOCENT[:2] + [("decode", "SGLANG_EXTRA_ARGS", CUR)])
    return s


def extra_args(s) -> list[str]:
    env = parse_env(s.sim.env_file("decode").read_text())
    a = env.get("SGLANG_EXTRA_ARGS")
    assert a is not None
    return shlex.split(a.value)


def test_one_flag_named_alone_and_revert_keeps_the_others(scenario, sshd):
    s = flag_scenario(scenario, sshd)
    before = tree_fingerprint(s.sim)
    with s.deployment() as dep:
        diff = dep.diff(against="good")
    flags = {d.id: d for d in diff.deltas if d.flag is not None}
    assert set(flags) == FLAG_IDS, sorted(flags)
    assert "decode:SGLANG_EXTRA_ARGS" not in {d.id for d in diff.deltas}
    g = flags[GUILTY]
    assert (g.change, g.old, g.new) == ("changed", "--attention-backend flashinfer", "--attention-backend triton")
    assert flags["decode:SGLANG_EXTRA_ARGS[--enable-metrics]"].change == "removed"
    assert flags["decode:SGLANG_EXTRA_ARGS[--disable-radix-cache]"].change == "added"

    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit", r.verdict
    assert r.culprit_deltas == (GUILTY,)
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before

    # the CLI's diff names each flag with its id
    out = s.cli("diff", "--against", "good")
    assert "~ SGLANG_EXTRA_ARGS --attention-backend flashinfer → triton" in out.stdout, out.stdout
    assert f"[{GUILTY};" in out.stdout

    # the bundle's report names the flag, with its values on each side
    tgz = s.store.parent / "b.tar.gz"
    out = s.cli("bundle", "--out", str(tgz))
    assert out.returncode == 0, out.stderr
    with tarfile.open(tgz) as tar:
        md = next(tar.extractfile(m).read().decode() for m in tar.getmembers() if m.name.endswith("report.md"))
    from markdown_it import MarkdownIt  # as a viewer shows it (the brackets of the id are escaped in the source)

    html = MarkdownIt("commonmark").enable("table").render(md)
    assert (f"culprit <strong>{GUILTY}</strong>: <code>--attention-backend flashinfer</code> → "
            "<code>--attention-backend triton</code>") in html, md[:3000]

    out = s.cli("revert", "--verdict", "--json", timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert doc["ok"] and doc["deltas"] == [GUILTY]
    # exactly the guilty flag is back to the baseline; every other flag change is kept
    assert extra_args(s) == ["--attention-backend", "flashinfer", "--mem-fraction-static", "0.85",
                             "--chunked-prefill-size=8192", "--disable-radix-cache"]
    assert all_healthy(s.sim)
    # and `apply` of the flag id puts it back (the probe then fails: that is what it is)
    out = s.cli("apply", GUILTY, "--json", timeout=180)
    assert json.loads(out.stdout)["deltas"] == [GUILTY], out.stderr[-2000:]
    assert shlex.split(CUR) == extra_args(s)


def test_sigkill_during_a_flag_trial_then_restore_is_byte_identical(scenario, sshd):
    s = flag_scenario(scenario, sshd)
    before = tree_fingerprint(s.sim)
    # trial 1 probes the running stack, trial 2 (the baseline) starts the three services (start:1-3);
    # start:5 is in trial 3, whose configuration holds some of the flag changes and not others
    r = s.cli("bisect", "--against", "good", "--probe", "e2e", env={**os.environ, "ENVBISECT_TEST_CRASH_AT": "start:5"},
              timeout=180)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-2000:])
    live = extra_args(s)
    assert live not in (shlex.split(BASE), shlex.split(CUR)), live  # a mixed string was written and is live
    r = s.cli("restore", "--run", newest_run(s), "--json", timeout=180)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["restored"] is True
    assert tree_fingerprint(s.sim) == before
    assert all_healthy(s.sim)


def test_a_value_quoted_anew_is_a_change_the_engine_may_see(scenario, sshd):
    """The sim's start script expands SGLANG_EXTRA_ARGS unquoted, so `--attention-backend "flashinfer"`
    reaches decode with its quote characters, and decode hangs on that word. The respelling is a
    delta of its own and is named alone; the two innocent value changes beside it are not (blind
    red-team, exact changes: no delta for it, and INTERACTION 1.00 of the two innocent flags)."""
    base = "--attention-backend flashinfer --mem-fraction-static 0.8 --chunked-prefill-size 4096"
    cur = '--attention-backend "flashinfer" --mem-fraction-static 0.85 --chunked-prefill-size 8192'
    rules = {**DEFAULT_RULES, "rules": [*DEFAULT_RULES["rules"], {
        "service": "decode", "when_flag": {"--attention-backend": '"flashinfer"'}, "fault": "hang"}]}
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config), rules=rules,
                 env={"decode": {"SGLANG_EXTRA_ARGS": base}})
    s.baseline()
    plant(s.sim, [("decode", "SGLANG_EXTRA_ARGS", cur)])
    before = tree_fingerprint(s.sim)
    with s.deployment() as dep:
        diff = dep.diff(against="good")
    flags = {d.id: d for d in diff.deltas if d.flag is not None}
    respelled = "decode:SGLANG_EXTRA_ARGS[--attention-backend]"
    assert flags[respelled].new == '--attention-backend "flashinfer"', sorted(flags)
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit" and r.culprit_deltas == (respelled,), (r.verdict, r.culprit_deltas)
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before
