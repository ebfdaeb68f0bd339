"""End to end on the simulated PD deployment over a real sshd: what envbisect itself costs per trial.

The simulated deployment (envbisect.sim.stack: real sglang-router, simulated prefill and
decode workers) runs behind a real OpenSSH sshd on 127.0.0.1 (tests/sshd.py); envbisect connects
to it with paramiko like to any host.  A culprit (or an interacting pair) is planted among
innocent changes, a baseline snapshot is taken before, and `BisectRun(...).start(diff)` runs the
whole pipeline: lock, journal, ordered co-restarts, HTTP probes through the router, evidence
capture, restore.

Each part of the run is timed by wrapping envbisect's own functions in this process (nothing in
envbisect is changed); a wrapped call's time excludes the wrapped calls inside it:

  restart   co_restart minus the compare-and-swap guards inside it (stop, start, health waits)
  probe     probe_repeatedly (the probe runs), and failing_engines before the first trial (the
            probe sent to each engine directly, which waits out the probe's timeout on a hanging one)
  apply     HostEditor.apply: the journaled edits plus the post-apply check (hashes, and bash's
            evaluation of every edited env file), in one round trip per host
  guard     HostEditor.guard: "the host still holds what envbisect made" before every stop/start
  evidence  capture_evidence: log tails and /metrics after each trial
  records   BisectRun._append_trial / on_event: trials.jsonl and events.jsonl
  search    Search.observe (the posterior update and the next decision)
  setup     lock, journal begin, environment capture; restore: the final restore (files)
  other     the rest of BisectRun.start's wall time

envbisect's own time = the run's wall time minus restart and probe.  Target: <= 0.5 s per trial.

    python bench/bench_sim.py            # 2 cases, about 2-3 minutes on 2 cores
    python bench/bench_sim.py --quick    # 1 case
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import envbisect.runs.bisect as eb_bisect  # noqa: E402
import envbisect.hosts.journal as eb_journal  # noqa: E402
import envbisect.search as eb_search  # noqa: E402
import envbisect.trials.runner as eb_trials  # noqa: E402
import envbisect.hosts.transport as eb_transport  # noqa: E402
from envbisect.runs.bisect import BisectOptions, BisectRun  # noqa: E402
from envbisect.runs.deployment import ConnectOptions, Deployment  # noqa: E402
from envbisect.inputs.playbook import load_playbook  # noqa: E402
from envbisect.sim.stack import build  # noqa: E402
from envbisect.state.store import Store  # noqa: E402
from sshd import start_sshd  # noqa: E402

MAX_OVERHEAD_S = 0.5

INNOCENT = [("prefill", "NCCL_DEBUG", "INFO"), ("decode", "SGLANG_ENABLE_JIT_DEEPGEMM", "1"),
            ("router", "ROUTER_LOG_LEVEL", "debug"), ("decode", "NCCL_IB_GID_INDEX", "5"),
            ("prefill", "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE", "8"), ("decode", "NCCL_DEBUG", "INFO"),
            ("prefill", "NCCL_IB_GID_INDEX", "4")]
SINGLE = [("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")]  # the decode hangs (DEFAULT_RULES)
PAIR = [("prefill", "SGLANG_ENABLE_TRANSFER_COALESCE", "1"), ("prefill", "MC_FORCE_TCP", "1")]  # 5xx only together
CASES = {"single-8": (SINGLE, 8, "culprit"), "pair-6": (PAIR, 6, "interaction")}
QUICK_CASES = ("single-8",)
CATEGORIES = ("restart", "probe", "apply", "guard", "evidence", "records", "search", "setup", "restore", "other")


class Profiler:
    """Exclusive wall time and SSH round trips per category of the wrapped functions (timed on
    the main thread only: the lock heartbeat thread runs beside the run, not on its path; round
    trips of every thread, the heartbeat's included, go to the category running at the time)."""

    def __init__(self) -> None:
        self.totals = dict.fromkeys(CATEGORIES, 0.0)
        self.calls = dict.fromkeys(CATEGORIES, 0)
        self.trips = dict.fromkeys(CATEGORIES, 0)
        self._stack: list[list] = []
        self._main = threading.main_thread()
        self._rt = 0
        self._rt_lock = threading.Lock()

    def count_trip(self, fn, when=lambda: True):  # noqa: ANN001
        prof = self

        @functools.wraps(fn)
        def wrapper(*a, **kw):  # noqa: ANN002, ANN003
            if when():
                with prof._rt_lock:
                    prof._rt += 1
            return fn(*a, **kw)
        return wrapper

    def wrap(self, category: str, fn):  # noqa: ANN001
        prof = self

        @functools.wraps(fn)
        def wrapper(*a, **kw):  # noqa: ANN002, ANN003
            if threading.current_thread() is not prof._main:
                return fn(*a, **kw)
            prof._stack.append([0.0, 0])
            t0, r0 = time.perf_counter(), prof._rt
            try:
                return fn(*a, **kw)
            finally:
                dt, dr = time.perf_counter() - t0, prof._rt - r0
                inner, inner_rt = prof._stack.pop()
                prof.totals[category] += dt - inner
                prof.trips[category] += dr - inner_rt
                prof.calls[category] += 1
                if prof._stack:
                    prof._stack[-1][0] += dt
                    prof._stack[-1][1] += dr
        return wrapper

    @contextlib.contextmanager
    def installed(self):
        patches = [
            (eb_trials, "co_restart", "restart"), (eb_bisect, "co_restart", "restart"),
            (eb_trials, "probe_repeatedly", "probe"), (eb_bisect, "failing_engines", "probe"),
            (eb_journal.HostEditor, "apply", "apply"), (eb_journal.HostEditor, "guard", "guard"),
            (eb_trials, "capture_evidence", "evidence"),
            (eb_bisect.BisectRun, "_append_trial", "records"), (eb_bisect.BisectRun, "on_event", "records"),
            (eb_search.Search, "observe", "search"),
            (eb_journal.HostEditor, "lock", "setup"), (eb_journal.HostEditor, "begin", "setup"),
            (eb_bisect, "capture_environment", "setup"), (eb_bisect.BisectRun, "_save_run", "setup"),
            (eb_journal.HostEditor, "restore", "restore"),
        ]
        saved = [(eb_transport.Transport, "run", eb_transport.Transport.__dict__["run"]),
                 (eb_transport.Transport, "run_agent_script", eb_transport.Transport.__dict__["run_agent_script"])]
        eb_transport.Transport.run = self.count_trip(eb_transport.Transport.run)
        # a message to the persistent agent is a round trip too (without one, the script's own
        # run() is counted instead)
        eb_transport.Transport.run_agent_script = self.count_trip(
            eb_transport.Transport.run_agent_script, when=lambda: not os.environ.get("ENVBISECT_ONE_SHOT_AGENT"))
        for owner, name, cat in patches:
            orig = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
            saved.append((owner, name, orig))
            setattr(owner, name, self.wrap(cat, orig))
        try:
            yield self
        finally:
            for owner, name, orig in reversed(saved):
                setattr(owner, name, orig)


def run_case(root: Path, server, name: str, policy: str = "confirm", log=print) -> dict:  # noqa: ANN001
    bad, n, kind = CASES[name]
    sim = build(root, ssh=server.alias)
    text = sim.playbook.read_text().replace('name = "sim-pd"', f'name = "bench-{uuid.uuid4().hex[:6]}"')
    sim.playbook.write_text(text.replace("timeout_s = 5\n", "timeout_s = 2.5\n"))
    opts = ConnectOptions(ssh_config=str(server.ssh_config), attempts=1)
    try:
        sim.start_all()
        with Deployment(load_playbook(sim.playbook), Store(root / "store"), opts) as dep:
            dep.snapshot("good")
            changes = INNOCENT[: n - len(bad)]
            half = len(changes) // 2
            for service, key, value in changes[:half] + bad + changes[half:]:
                sim.set_env(service, key, value)
            sim.co_restart()
            diff = dep.diff(against="good")
            rt0 = sum(dep.round_trips().values())
            prof = Profiler()
            with prof.installed():
                t0, r0 = time.perf_counter(), prof._rt
                r = BisectRun(dep, BisectOptions(probe="e2e", policy=policy)).start(diff)
                wall = time.perf_counter() - t0
                other_rt = prof._rt - r0 - sum(prof.trips.values())
            trips = sum(dep.round_trips().values()) - rt0
            prof.trips["other"] += other_rt
    finally:
        sim.stop_all()
    trials = len(r.trials)  # a probe of the running stack (Trial.free) is a trial without a restart
    restarts = sum(1 for tr in r.trials if not getattr(tr, "free", False))
    t = prof.totals
    t["other"] = wall - sum(v for k, v in t.items() if k != "other")
    own = wall - t["restart"] - t["probe"]
    in_trials = own - t["setup"] - t["restore"]
    want = {f"{s}:{k}" for s, k, _ in bad}
    right = r.verdict.kind == kind and set(r.culprit_deltas) == want
    row = {"case": name, "deltas": len(diff.deltas), "policy": policy, "trials": trials, "restarts": restarts,
           "verdict": r.verdict.kind,
           "culprits": list(r.culprit_deltas), "right": right, "wall_s": wall,
           "own_s_per_trial": own / trials, "own_in_trials_s_per_trial": in_trials / trials,
           "restart_s_per_trial": t["restart"] / trials, "probe_s_per_trial": t["probe"] / trials,
           "round_trips_per_trial": trips / trials, "breakdown_s": dict(t), "round_trips": dict(prof.trips),
           "trial_log": [{"purpose": tr.purpose, "outcome": tr.outcome, "restart_s": round(tr.restart_s, 3),
                       "probe_s": round(tr.probe_s, 3), "probe_runs": len(tr.probe_runs),
                       "free": getattr(tr, "free", False)} for tr in r.trials],
           "calls": dict(prof.calls)}
    log(f"  {name}: {trials} trials, {restarts} restarts, verdict {r.verdict.kind} {list(r.culprit_deltas)}, "
        f"{row['own_s_per_trial']:.3f} s own time per trial, {wall:.0f} s")
    return row


def calibrate(server, repeats: int = 10) -> dict:  # noqa: ANN001
    """Median wall time of one SSH round trip on this machine now: a bare `true`, and a Python
    start (envbisect's host operations run a small Python program per round trip)."""
    import statistics

    from envbisect.inputs.playbook import Host
    from envbisect.hosts.transport import connect

    t = connect(Host("calib", server.alias, sys.executable), ssh_config=str(server.ssh_config), attempts=1)
    try:
        out = {}
        for what, fn in (("true", lambda: t.run("true")), ("python", lambda: t.run_python("pass")),
                         ("agent", lambda: t.run_agent_script("pass.py", "pass"))):
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            out[what] = statistics.median(times)
        return out
    finally:
        t.close()


def measure(names=tuple(CASES), log=print) -> dict:  # noqa: ANN001
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)  # "channel open failed" while a service is down
    rows = []
    with tempfile.TemporaryDirectory(prefix="envbisect-bench-sim-") as d:
        d = Path(d)
        server = start_sshd(d / "sshd", alias="benchsim")
        try:
            calib = calibrate(server)
            log(f"  one SSH round trip now: {calib['true'] * 1000:.0f} ms (true), {calib['python'] * 1000:.0f} ms "
                f"(python start), {calib['agent'] * 1000:.1f} ms (a message to the persistent agent)")
            for name in names:
                rows.append(run_case(d / name, server, name, log=log))
        finally:
            server.stop()
    total_trials = sum(r["trials"] for r in rows)
    agg = {c: sum(r["breakdown_s"][c] for r in rows) / total_trials for c in CATEGORIES}
    own = sum(r["own_s_per_trial"] * r["trials"] for r in rows) / total_trials
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    return {"rows": rows, "trials": total_trials, "own_s_per_trial": own, "breakdown_s_per_trial": agg,
            "round_trip_s": calib, "loadavg_1min_after": float(load)}


def table(res: dict) -> str:
    cols = ("apply", "guard", "evidence", "records", "search", "setup", "restore", "other")
    head = (f"{'case':<9} {'deltas':>6} {'trials':>6} {'restarts':>8} {'verdict':<12} {'right':<5} {'restart s':>9} "
            f"{'probe s':>7} {'own s':>6} " + " ".join(f"{c:>8}" for c in cols) + f" {'RTs':>5}")
    out = [head, "-" * len(head)]
    for r in res["rows"]:
        b = r["breakdown_s"]
        out.append(f"{r['case']:<9} {r['deltas']:>6} {r['trials']:>6} {r['restarts']:>8} {r['verdict']:<12} "
                   f"{'yes' if r['right'] else 'NO':<5} {r['restart_s_per_trial']:>9.2f} "
                   f"{r['probe_s_per_trial']:>7.2f} {r['own_s_per_trial']:>6.3f} "
                   + " ".join(f"{b[c] / r['trials']:>8.3f}" for c in cols) + f" {r['round_trips_per_trial']:>5.1f}")
    for r in res["rows"]:
        rt = r["round_trips"]
        out.append(f"{r['case']:<9} SSH round trips per trial: " + ", ".join(
            f"{c} {rt[c] / r['trials']:.1f}" for c in CATEGORIES if rt[c]))
    out.append("per trial (seconds, SSH round trips; a probe of the running stack is a trial without a restart); "
               "own = wall - restart - probe; setup/restore are once per run, spread over its trials")
    rt = res["round_trip_s"]
    out.append(f"one SSH round trip on this machine during the run: {rt['true'] * 1000:.0f} ms for `true`, "
               f"{rt['python'] * 1000:.0f} ms for a Python start, {rt['agent'] * 1000:.1f} ms for a message to the "
               f"persistent agent (what host operations use); load average {res['loadavg_1min_after']:.1f} "
               f"on {os.cpu_count()} cores")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = measure(QUICK_CASES if args.quick else tuple(CASES), log=lambda m: print(m, file=sys.stderr))
    print(json.dumps(res, indent=2) if args.json else table(res))


if __name__ == "__main__":
    main()
