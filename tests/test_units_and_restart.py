"""Bisection units (linked deltas) and how a co-restart classifies failures: the config's fault
(start-failure) versus the infrastructure's (unresolved, never blamed on a delta)."""
from __future__ import annotations

import textwrap
import time

from envbisect.runs.bisect import make_units
from envbisect.state.deltas import Delta
from envbisect.inputs.playbook import load_playbook
from envbisect.hosts.restart import co_restart
from envbisect.hosts.transport import LocalTransport


def env(service: str, key: str, new: str, old: str = "1") -> Delta:
    return Delta(f"{service}:{key}", "env", "h", service, f"/{service}.env", key, "changed", old, new, "snapshot:x")


def test_same_change_in_several_services_is_one_linked_unit():
    deltas = [env("prefill", "SGLANG_KV_PAGE_SIZE", "128"), env("decode", "SGLANG_KV_PAGE_SIZE", "128"),
              env("decode", "NCCL_DEBUG", "INFO")]
    units, notes = make_units(deltas, link=(), auto_link=True)
    assert units == {"decode:NCCL_DEBUG": ("decode:NCCL_DEBUG",),
                     "linked:SGLANG_KV_PAGE_SIZE": ("prefill:SGLANG_KV_PAGE_SIZE", "decode:SGLANG_KV_PAGE_SIZE")}
    assert "SGLANG_KV_PAGE_SIZE changed the same way in decode, prefill" in notes[0]
    # without auto-linking each side is its own unit...
    units, _ = make_units(deltas, link=(), auto_link=False)
    assert len(units) == 3
    # ...and --link pins a variable even when the two sides got different values
    deltas[1] = env("decode", "SGLANG_KV_PAGE_SIZE", "256")
    assert "linked:SGLANG_KV_PAGE_SIZE" not in make_units(deltas, link=(), auto_link=True)[0]
    assert "linked:SGLANG_KV_PAGE_SIZE" in make_units(deltas, link=("SGLANG_KV_PAGE_SIZE",), auto_link=True)[0]


def playbook(tmp_path, start: str):
    pb = tmp_path / "pb.toml"
    pb.write_text(textwrap.dedent(f"""
        [hosts.h]
        ssh = "local"
        [services.engine]
        host = "h"
        env_file = "{tmp_path}/engine.env"
        start = '''{start}'''
        stop = "true"
        health = "http://127.0.0.1:1/health"
        pid_file = "{tmp_path}/engine.pid"
        [restart]
        order = ["engine"]
        health_timeout_s = 30
        poll_interval_s = 0.1
    """))
    return load_playbook(pb)


def test_a_service_that_dies_at_start_is_a_start_failure_noticed_at_once(tmp_path):
    pb = playbook(tmp_path, f"sh -c 'sleep 0.2 & echo $! > {tmp_path}/engine.pid'")
    t0 = time.monotonic()
    r = co_restart(pb, {"h": LocalTransport("h")})
    assert not r.ok and r.failure == "start-failure" and r.service == "engine"
    assert "died while starting" in r.message
    assert time.monotonic() - t0 < 10  # not the 30 s health timeout


def test_a_start_command_that_cannot_run_is_reported_as_a_start_exit(tmp_path):
    """Not "start-failure": whether a non-zero exit is the configuration's is the run's evidence to
    decide (trials/start_evidence.py; its first start in a run is unresolved)."""
    pb = playbook(tmp_path, "/nonexistent/start-engine")
    r = co_restart(pb, {"h": LocalTransport("h")})
    assert not r.ok and r.failure == "start-exit" and "start command failed" in r.message


def test_resume_picks_the_unfinished_bisection_not_a_later_revert(tmp_path):
    import json
    import os

    from envbisect.state.rundir import Runs
    from envbisect.state.store import Store

    store = Store(tmp_path)
    for name, kind, t in (("r1-bisect", None, 1.0), ("r2-revert", "revert", 2.0)):
        d = store.runs_dir / name
        d.mkdir(parents=True)
        doc = {"deployment": "dep", "created_at": t, **({"kind": kind} if kind else {})}
        (d / "run.json").write_text(json.dumps(doc))
        os.utime(d, (t + 1000, t + 1000))
    assert Runs(store.runs_dir).bisection(None, "dep").run_id == "r1-bisect"
