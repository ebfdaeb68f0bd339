"""Structured watched files per key, end to end over the real sshd and the simulated PD deployment:
decode reads a feature-flag YAML at start and hangs when one key has one value (the sim's
`file_key` rule). The key is named, its file's other changes are innocent, every byte besides the
keys (its comments above all) is as it was in every trial, and revert/apply act on the key alone."""
from __future__ import annotations

import copy
import json
import os
import signal
import tarfile

import pytest

from envbisect.errors import ExitStatus
from envbisect.sim.stack import DEFAULT_RULES

from test_bisect_sim import scenario, tree_fingerprint  # noqa: F401 - fixture
from test_fault_injection import fingerprint, newest_run

pytestmark = [pytest.mark.sim]

OLD = """# feature flags read by decode at start (--config)
# owner: serving team; keep these comments
decode_overlap_schedule: false   # overlap the scheduler with the GPU (risky on sm120)
max_running_requests: 256
router:
  policy: 'cache_aware'   # quoted on purpose
  health_interval_s: 10
"""
NEW = (OLD.replace("schedule: false", "schedule: true").replace("requests: 256", "requests: 512")
       .replace("'cache_aware'", "'round_robin'").replace("  health_interval_s: 10\n",
                                                          "  health_interval_s: 10\n  enable_metrics: true\n"))
KEY_LINES = ("decode_overlap_schedule:", "max_running_requests:", "  policy:", "  enable_metrics:")


def yaml_scenario(scenario, sshd):
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    path = s.sim.root / "conf" / "extra" / "feature_flags.yaml"
    path.write_text(OLD)
    rules = copy.deepcopy(DEFAULT_RULES)
    rules["rules"].append({"service": "decode", "fault": "hang",
                           "file_key": {"path": str(path), "key": "decode_overlap_schedule", "value": True}})
    s.sim.set_rules(rules)
    s.sim.co_restart()
    s.baseline()
    path.write_text(NEW)
    t = path.stat().st_mtime - 5
    os.utime(path, (t, t))
    s.sim.age_files()
    s.sim.co_restart()
    return s, path


def test_yaml_key_named_others_innocent_comments_kept_revert_apply(scenario, sshd, tmp_path):
    s, path = yaml_scenario(scenario, sshd)
    r = s.cli("diff", "--against", "good")
    assert r.returncode == ExitStatus.DELTAS, r.stderr
    guilty = f"file:node1:{path}#decode_overlap_schedule"
    assert f"~ {path} decode_overlap_schedule false → true" in r.stdout and guilty in r.stdout, r.stdout
    assert f"+ {path} router.enable_metrics = true" in r.stdout, r.stdout
    before = tree_fingerprint(s.sim)
    res = s.bisect(probe="e2e")
    assert res.verdict.kind == "culprit", res.verdict
    assert res.culprit_deltas == (guilty,)
    assert tree_fingerprint(s.sim) == before  # hosts byte-identical (mtimes too) after the bisect
    # every file decode started with: the comments and every other byte as they were, each key line
    # its old or its new line, byte for byte
    seen = [json.loads(line.split(" read at start: ", 1)[1]) for line in s.sim.log_text("decode").splitlines()
            if f"config file {path} read at start: " in line]
    assert len(set(seen)) >= 3, seen  # the baseline, the current file and mixes were started

    def rest(text):
        return [x for x in text.splitlines(keepends=True) if not x.startswith(KEY_LINES)]

    old_lines, new_lines = set(OLD.splitlines(keepends=True)), set(NEW.splitlines(keepends=True))
    for text in seen:
        assert rest(text) == rest(OLD), text
        assert all(x in old_lines | new_lines for x in text.splitlines(keepends=True)), text
    # the report and the bundle name the key
    out = tmp_path / "b.tar.gz"
    r = s.cli("bundle", "--out", str(out))
    assert r.returncode == 0, r.stderr
    with tarfile.open(out) as tar:
        md = next(tar.extractfile(m).read().decode() for m in tar.getmembers() if m.name.endswith("report.md"))
    assert guilty in md
    # revert --verdict takes out the key alone and keeps the file's three other changes
    r = s.cli("revert", "--verdict", "--dry-run", "--json", timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    [change] = json.loads(r.stdout)["changes"]
    assert change["deltas"] == [guilty] and change["what"] == [f"{path} decode_overlap_schedule: true → false"]
    assert path.read_text() == NEW
    r = s.cli("revert", "--verdict", "--probe", "e2e", "--json", timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert path.read_text() == NEW.replace("schedule: true", "schedule: false")
    # apply puts the one key back: the probe fails again, the file is the current one, byte for byte
    r = s.cli("apply", guilty, "--probe", "e2e", "--json", timeout=120)
    assert r.returncode == ExitStatus.DELTAS, (r.stdout, r.stderr)
    assert path.read_text() == NEW


@pytest.mark.parametrize("point", ["write:2", "start:4"])  # after a trial wrote the file per key
def test_sigkill_during_a_key_trial_then_restore_is_byte_identical(scenario, sshd, point):
    s, path = yaml_scenario(scenario, sshd)
    before = fingerprint(s.sim)
    r = s.cli("bisect", "--against", "good", "--probe", "e2e",
              env={**os.environ, "ENVBISECT_TEST_CRASH_AT": point}, timeout=120)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-2000:])
    assert path.read_text() != NEW  # killed after the trial's write
    r = s.cli("restore", "--run", newest_run(s), "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["restored"] is True
    assert fingerprint(s.sim) == before and path.read_text() == NEW
