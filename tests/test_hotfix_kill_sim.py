"""A SIGKILL during a trial of an uncommitted hotfix (issue 24's "done when": hosts byte-identical after
a SIGKILL during each kind of trial followed by `restore`), over the real sshd and the simulated PD
deployment: the hotfix to the deployed repo's feature-flag YAML is a key delta, written back by the
trials; killed amid a trial's co-restart, `restore` puts every file and the repo back as they were."""
from __future__ import annotations

import json
import os
import signal

import pytest

from test_bisect_sim import INNOCENT, plant, scenario, tree_fingerprint  # noqa: F401 - fixture
from test_fault_injection import all_healthy, fingerprint, newest_run
from test_hotfix_sim import _flag_id, _git, _hotfix, _with_flag_rule

pytestmark = [pytest.mark.sim, pytest.mark.slow]


def test_sigkill_during_a_hotfix_trial_then_restore_is_byte_identical(scenario, sshd):
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    _with_flag_rule(s)
    s.baseline()
    head = _git(s.sim.src_dir, "rev-parse", "HEAD")
    _hotfix(s)
    plant(s.sim, INNOCENT[:3])
    hotfix_bytes = s.sim.flags_file.read_bytes()
    with s.deployment() as dep:
        assert _flag_id(s) in {d.id for d in dep.diff(against="good").deltas}
    before = fingerprint(s.sim)
    # the 5th start is in the baseline trial or the one after it: after their writes (the hotfix undone)
    r = s.cli("bisect", "--against", "good", "--probe", "e2e",
              env={**os.environ, "ENVBISECT_TEST_CRASH_AT": "start:5"}, timeout=180)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-2000:])
    assert fingerprint(s.sim) != before  # a trial's files were live when it was killed
    r = s.cli("restore", "--run", newest_run(s), "--json", timeout=180)
    assert r.returncode == 0 and json.loads(r.stdout)["restored"] is True, (r.stdout[-1500:], r.stderr[-1500:])
    assert fingerprint(s.sim) == before
    assert s.sim.flags_file.read_bytes() == hotfix_bytes and _git(s.sim.src_dir, "rev-parse", "HEAD") == head
    assert all_healthy(s.sim)
