"""Fleets end to end: the same planted change bisected on 1 and on 2 simulated PD replicas (each
its own deployment: real sglang-router, its own files and ports) over a real sshd on 127.0.0.1.
Wall time and rounds, one replica against two. On this 2-core machine two replicas also share the
CPU, so the saving in wall time is smaller than the saving in rounds."""
from __future__ import annotations

import logging
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

from envbisect.runs.bisect import BisectOptions  # noqa: E402
from envbisect.runs.deployment import ConnectOptions, Deployment  # noqa: E402
from envbisect.runs.fleet import FleetRun  # noqa: E402
from envbisect.inputs.playbook import load_playbook  # noqa: E402
from envbisect.sim.stack import build  # noqa: E402
from envbisect.state.store import Store  # noqa: E402
from sshd import start_sshd  # noqa: E402

CHANGES = [("prefill", "NCCL_DEBUG", "INFO"), ("decode", "SGLANG_ENABLE_JIT_DEEPGEMM", "1"),
           ("router", "ROUTER_LOG_LEVEL", "debug"), ("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256"),
           ("decode", "NCCL_IB_GID_INDEX", "5"), ("prefill", "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE", "8"),
           ("decode", "SGLANG_SCHEDULER_INTERVAL", "2"), ("router", "ROUTER_EXTRA", "1")]
BAD = "decode:SGLANG_SM120_MMA_TARGET_CTAS"  # decode hangs with it (sim DEFAULT_RULES)


def _run(root: Path, server, replicas: int) -> dict:  # noqa: ANN001
    sims = []
    opts = ConnectOptions(ssh_config=str(server.ssh_config), attempts=1)
    try:
        for i in range(replicas):
            sim = build(root / f"r{i}", ssh=server.alias)
            text = sim.playbook.read_text().replace('name = "sim-pd"', f'name = "fleet-{uuid.uuid4().hex[:6]}"')
            sim.playbook.write_text(text.replace("timeout_s = 5\n", "timeout_s = 2.5\n"))
            sim.start_all()
            sims.append(sim)
        store = Store(root / "store")
        deps = [(f"pd-{i}", Deployment(load_playbook(s.playbook), store, opts)) for i, s in enumerate(sims)]
        for _n, dep in deps:
            dep.__enter__()
        try:
            for _n, dep in deps:
                dep.snapshot("good")
            for s in sims:
                for service, key, value in CHANGES:
                    s.set_env(service, key, value)
                s.co_restart()
            t0 = time.perf_counter()
            res = FleetRun(deps, store, BisectOptions(probe="e2e")).start(against="good")
            wall = time.perf_counter() - t0
        finally:
            for _n, dep in deps:
                dep.__exit__(None, None, None)
    finally:
        for s in sims:
            s.stop_all()
    r = res.result
    return {"replicas": replicas, "verdict": r.verdict.kind, "culprits": list(r.culprit_deltas),
            "right": list(r.culprit_deltas) == [BAD], "rounds": res.rounds, "trials": len(r.trials),
            "wall_s": wall}


def measure(log=print) -> dict:  # noqa: ANN001
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    rows = []
    with tempfile.TemporaryDirectory(prefix="envbisect-bench-fleet-") as d:
        d = Path(d)
        server = start_sshd(d / "sshd", alias="benchfleet")
        try:
            for r in (1, 2):
                rows.append(_run(d / f"R{r}", server, r))
                log(f"  fleet e2e R={r}: {rows[-1]}")
        finally:
            server.stop()
    return {"rows": rows, "n": len(CHANGES)}


def table(res: dict) -> str:
    lines = [f"replicas  verdict    right  rounds  trials  wall   ({res['n']} deltas, one culprit, real sshd)"]
    for r in res["rows"]:
        lines.append(f"{r['replicas']:>8}  {r['verdict']:<9} {'yes' if r['right'] else 'NO':>5} {r['rounds']:>7} "
                     f"{r['trials']:>7} {r['wall_s']:>5.0f} s")
    return "\n".join(lines)


def targets(res: dict, add) -> None:  # noqa: ANN001
    one, two = res["rows"][0], res["rows"][1]
    add(one["right"] and two["right"] and two["rounds"] < one["rounds"],
        "[fleet e2e] 2 replicas: the right verdict in fewer rounds than 1",
        f"{two['rounds']} rounds / {two['wall_s']:.0f} s vs {one['rounds']} rounds / {one['wall_s']:.0f} s "
        f"({two['verdict']} {two['culprits']} vs {one['verdict']} {one['culprits']})")
