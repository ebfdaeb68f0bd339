"""When a process started, as the host agents read it: the running-stack check (runs/plan.py) takes a
file written before a process started as already in effect, so the start time must not read early.
/proc/stat's btime is whole seconds (the boot instant floored): started_at built on it reads up to
a second early, and a file written half a second before a co-restart looked newer than the process."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

AGENT = Path(__file__).resolve().parents[1] / "envbisect" / "hosts" / "agent"

pytestmark = pytest.mark.local


def _started_at_seen_by_collect(pid_file: Path) -> float:
    req = {"processes": [{"service": "svc", "pid_file": str(pid_file)}]}
    out = subprocess.run([sys.executable, str(AGENT / "collect.py")], input=json.dumps(req),
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)["processes"]["svc"]["started_at"]


def test_collect_reads_a_process_start_within_a_tick_of_the_truth(tmp_path):
    for _ in range(3):  # three starts: one lucky reading does not pass
        before = time.time()
        p = subprocess.Popen(["sleep", "30"])
        after = time.time()
        try:
            (tmp_path / "pid").write_text(str(p.pid))
            started = _started_at_seen_by_collect(tmp_path / "pid")
        finally:
            p.kill()
            p.wait()
        # never later than the truth (the check must stay conservative), and not early by more
        # than the clock-tick and /proc/uptime rounding (10 ms each) and a margin
        assert started <= after + 0.001, (started, after)
        assert started >= before - 0.06, (before - started, "s early")


def test_discover_reads_a_process_start_within_a_tick_of_the_truth():
    marker = f"envbisect-start-time-{time.time_ns()}"
    req = {"matchers": [{"name": "probe", "kind": "engine", "regex": marker}]}
    before = time.time()
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", marker])
    after = time.time()
    try:
        out = subprocess.run([sys.executable, str(AGENT / "discover.py")], input=json.dumps(req),
                             capture_output=True, text=True, timeout=60, check=True)
    finally:
        p.kill()
        p.wait()
    (proc,) = [x for x in json.loads(out.stdout)["processes"] if x["pid"] == p.pid]
    assert proc["started_at"] <= after + 0.001, (proc["started_at"], after)
    assert proc["started_at"] >= before - 0.06, (before - proc["started_at"], "s early")
