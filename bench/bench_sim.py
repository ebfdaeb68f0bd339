"""Restarts per verdict on the simulated PD deployment (real sglang-router), next to the targets.

The search bench (bench_search.py) measures the pure search on an oracle over every position;
this one runs the whole pipeline - journaled edits, ordered co-restarts, HTTP probes through the
real router - for a few representative cases, and prints wall time per restart too.

    python bench/bench_sim.py          # about 5 minutes on 2 cores
"""
from __future__ import annotations

import math
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envbisect.bisect import BisectOptions, BisectRun  # noqa: E402
from envbisect.deployment import Deployment  # noqa: E402
from envbisect.playbook import load_playbook  # noqa: E402
from envbisect.sim.deployment import build  # noqa: E402
from envbisect.store import Store  # noqa: E402

INNOCENT = [("prefill", "NCCL_DEBUG", "INFO"), ("decode", "SGLANG_ENABLE_JIT_DEEPGEMM", "1"),
            ("router", "ROUTER_LOG_LEVEL", "debug"), ("decode", "NCCL_IB_GID_INDEX", "5"),
            ("prefill", "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE", "8"), ("decode", "NCCL_DEBUG", "INFO"),
            ("prefill", "NCCL_IB_GID_INDEX", "4")]
SINGLE = [("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")]
PAIR = [("prefill", "SGLANG_ENABLE_TRANSFER_COALESCE", "1"), ("prefill", "MC_FORCE_TCP", "1")]


def case(root: Path, bad: list, n: int, policy: str) -> tuple[str, tuple, int, float]:
    sim = build(root, ssh="local")
    text = sim.playbook.read_text().replace('name = "sim-pd"', f'name = "bench-{uuid.uuid4().hex[:6]}"')
    sim.playbook.write_text(text.replace("timeout_s = 5\n", "timeout_s = 2.5\n"))
    try:
        sim.start_all()
        with Deployment(load_playbook(sim.playbook), Store(root / "store")) as dep:
            dep.snapshot("good")
            changes = INNOCENT[: n - len(bad)]
            half = len(changes) // 2
            for service, key, value in changes[:half] + bad + changes[half:]:
                sim.set_env(service, key, value)
            sim.co_restart()
            t0 = time.monotonic()
            r = BisectRun(dep, BisectOptions(probe="e2e", policy=policy)).start(dep.diff(against="good"))
            wall = time.monotonic() - t0
        return r.verdict.kind, r.culprit_deltas, len(r.trials), wall
    finally:
        sim.stop_all()


def main() -> None:
    print(f"{'case':<8} {'n':>2} {'policy':<8} {'restarts':>8} {'target':>6} {'verdict':<12} {'right':<5} {'s/restart':>9}")
    with tempfile.TemporaryDirectory() as d:
        for name, bad, kind in (("single", SINGLE, "culprit"), ("pair", PAIR, "interaction")):
            for n in (4, 8):
                lg = math.ceil(math.log2(n))
                target = lg + 2 if kind == "culprit" else 2 * lg + 2
                for policy in ("confirm", "fast"):
                    root = Path(d) / f"{name}-{n}-{policy}"
                    verdict, culprits, restarts, wall = case(root, bad, n, policy)
                    want = {f"{s}:{k}" for s, k, _ in bad}
                    right = verdict == kind and set(culprits) == want
                    print(f"{name:<8} {n:>2} {policy:<8} {restarts:>8} {target:>6} {verdict:<12} "
                          f"{'yes' if right else 'NO':<5} {wall / restarts:>9.1f}", flush=True)
    print("targets: single ceil(log2 n)+2, pair 2 ceil(log2 n)+2 (premise checks included); the default policy "
          "'confirm' pays up to one more restart to see the culprit fail alone (docs/search.md)")


if __name__ == "__main__":
    main()
