"""The start command line itself, end to end over the real sshd and the simulated PD deployment:
decode's start script (watched) holds its server flags; the simulated decode worker gets them on its
command line and hangs when `--attention-backend triton`. Of four flag changes on that line, the
guilty one is named alone (`file:node1:PATH[--attention-backend]`), every trial's script differs
from the baseline's in its chosen flags only, `revert --verdict` takes out that flag and keeps the
other three, and the hosts are byte-identical after the bisection and after a SIGKILL during a
trial followed by `restore`."""
from __future__ import annotations

import dataclasses
import json
import os
import signal

import pytest

from test_bisect_sim import scenario, tree_fingerprint  # noqa: F401 - fixture
from test_fault_injection import all_healthy, edit_playbook, newest_run
from test_flags_sim import RULES

pytestmark = [pytest.mark.sim, pytest.mark.slow]

SCRIPT = """#!/usr/bin/env bash
# decode's start: its server flags live on this command line
if [ "$1" != decode ]; then exec {bin} "$@"; fi
exec {bin} decode \\
    --attention-backend flashinfer \\
    --mem-fraction-static 0.8 \\
    --enable-metrics
"""
CHANGED = {"flashinfer": "triton", "0.8 \\": "0.85 \\", "--enable-metrics": "--disable-radix-cache"}
FLAGS = ("--attention-backend", "--mem-fraction-static", "--enable-metrics", "--disable-radix-cache")


def script_scenario(scenario, sshd):
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config), rules=RULES)
    path = s.sim.root / "conf" / "extra" / "start-decode.sh"
    old = SCRIPT.format(bin=s.sim.start_script)
    new = old
    for a, b in CHANGED.items():
        new = new.replace(a, b)
    path.write_text(old)
    path.chmod(0o755)
    edit_playbook(s, f'start = "{s.sim.start_script} decode"', f'start = "{path} decode"')
    s.sim = dataclasses.replace(s.sim, start_script=path)  # the sim's own restarts go through it too
    s.sim.co_restart()
    s.baseline()
    path.write_text(new)
    t = path.stat().st_mtime - 5
    os.utime(path, (t, t))
    s.sim.age_files()
    s.sim.co_restart()
    return s, path, old, new


def started_flags(s) -> list[str]:
    """The decode worker's command line at each start, from its log."""
    return [line.split(": ", 1)[1] for line in s.sim.log_text("decode").splitlines()
            if line.startswith("=== ") and "bin/start decode: " in line]


def test_a_flag_of_the_start_scripts_command_line_is_named_alone(scenario, sshd):
    s, path, old, new = script_scenario(scenario, sshd)
    guilty = f"file:node1:{path}[--attention-backend]"
    with s.deployment() as dep:
        diff = dep.diff(against="good")
    ids = {d.id for d in diff.deltas if str(path) in d.id}
    assert ids == {f"file:node1:{path}[{f}]" for f in FLAGS}, (ids, diff.notes)
    out = s.cli("diff", "--against", "good")
    assert f"~ {path} --attention-backend flashinfer → triton" in out.stdout, out.stdout
    before = tree_fingerprint(s.sim)
    seen = len(started_flags(s))
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit" and r.culprit_deltas == (guilty,), (r.verdict, r.notes)
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before
    # each start of a trial had every flag as the baseline or the current line has it, and mixes ran
    starts = started_flags(s)[seen:]
    olds = {"--attention-backend flashinfer", "--mem-fraction-static 0.8", "--enable-metrics"}
    news = {"--attention-backend triton", "--mem-fraction-static 0.85", "--disable-radix-cache"}
    mixed = 0
    for line in starts:
        have_old = {f for f in olds if f in line}
        have_new = {f for f in news if f in line}
        assert len(have_old) + len(have_new) >= 2, line
        mixed += bool(have_old and have_new)
    assert mixed, starts
    out = s.cli("revert", "--verdict", "--json", timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["deltas"] == [guilty]
    assert path.read_text() == new.replace("triton", "flashinfer")  # that flag alone, every other byte kept
    assert all_healthy(s.sim)
    out = s.cli("apply", guilty, "--json", timeout=180)
    assert json.loads(out.stdout)["deltas"] == [guilty], out.stderr[-2000:]
    assert path.read_text() == new


def test_sigkill_during_a_command_line_trial_then_restore_is_byte_identical(scenario, sshd):
    s, path, old, new = script_scenario(scenario, sshd)
    before = tree_fingerprint(s.sim)
    # trial 1 probes the running stack, trial 2 (the baseline) starts the three services (start:1-3);
    # start:5 is in trial 3, whose script holds some of the flag changes and not others
    r = s.cli("bisect", "--against", "good", "--probe", "e2e",
              env={**os.environ, "ENVBISECT_TEST_CRASH_AT": "start:5"}, timeout=180)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-2000:])
    assert path.read_text() not in (old, new)  # a mixed line was written and is live
    r = s.cli("restore", "--run", newest_run(s), "--json", timeout=180)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["restored"] is True
    assert tree_fingerprint(s.sim) == before and path.read_text() == new
    assert all_healthy(s.sim)


def test_the_script_a_start_command_runs_is_watched_without_being_named(scenario, sshd):
    # bin/start is not in [watch] paths; a flag added to decode's line in it is still a delta
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    s.baseline()
    script = s.sim.start_script
    text = script.read_text()
    new = text.replace("--prefill-bootstrap http", "--attention-backend triton --prefill-bootstrap http")
    assert new != text
    script.write_text(new)
    with s.deployment() as dep:
        diff = dep.diff(against="good")
        assert dep.round_trips() == {"node1": 1}
    ids = {d.id for d in diff.deltas}
    assert any(i.startswith(f"file:node1:{script}") for i in ids), (ids, diff.notes)
