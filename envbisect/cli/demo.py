"""`envbisect demo`: a simulated SGLang PD deployment on this machine, a planted bad change among
innocent ones, and the whole pipeline (snapshot -> diff -> bisect -> verdict) run against it.

The router is the real `sglang-router`; prefill and decode are small simulated workers whose
faults are driven by the environment they were started with (see envbisect/sim/).
"""
from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from envbisect.errors import UsageError

# (service, variable, new value): what "somebody" changed this afternoon.
INNOCENT_CHANGES = [
    ("prefill", "NCCL_DEBUG", "INFO"),
    ("decode", "SGLANG_ENABLE_JIT_DEEPGEMM", "1"),
    ("router", "ROUTER_LOG_LEVEL", "debug"),
    ("decode", "NCCL_IB_GID_INDEX", "5"),
    ("prefill", "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE", "8"),
]
# In the simulation, decode hangs on every request with this value (see sim DEFAULT_RULES).
BAD_CHANGE = ("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")
BAD_DELTA_ID = f"{BAD_CHANGE[0]}:{BAD_CHANGE[1]}"  # the id envbisect diff gives it

# `demo --perf`: nothing fails, the stack got slower. The speed-up is the incident's knob (innocent,
# and worth keeping); the slowdown is the one to find (sim PERF_RULES).
PERF_SPEEDUP = ("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "512")
PERF_SLOWDOWN = ("decode", "SGLANG_CUDA_GRAPH_MAX_BS", "8")
PERF_NOOP = ("decode", "SGLANG_SCHEDULER_INTERVAL", "2")
PERF_BAD_ID = f"{PERF_SLOWDOWN[0]}:{PERF_SLOWDOWN[1]}"


@dataclass
class Demo:
    root: Path
    sim: object  # envbisect.sim.stack.SimDeployment
    playbook: Path
    store: Path

    def cleanup(self, keep: bool = False) -> None:
        self.sim.stop_all()  # type: ignore[attr-defined]
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)


def deployment_name(root: Path) -> str:
    """The demo deployment's name, one per root: the lock and journal on the host are named by
    the deployment, and two demos at once on one machine are two deployments."""
    digest = hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:10]
    return f"envbisect-demo-{digest}"


def prepare(root: Path | None = None, perf: bool = False) -> Demo:
    """Build and start the simulated deployment (known-good state). `perf`: decode's per-token
    time follows the speed knobs (sim PERF_RULES)."""
    try:
        from envbisect.sim.stack import PERF_RULES, build
    except ImportError as e:  # pragma: no cover - the sim ships with the package
        raise UsageError(f"the simulated deployment is unavailable: {e}") from None
    beside_python = Path(__import__("sys").executable).parent / "sglang-router"
    if shutil.which("sglang-router") is None and not beside_python.exists():
        raise UsageError("the demo needs the real router: pip install 'sglang-router==0.3.2' (or scripts/demo.sh)")
    root = Path(root) if root else Path(tempfile.mkdtemp(prefix="envbisect-demo-"))
    sim = build(root / "deployment", ssh="local", rules=PERF_RULES if perf else None)
    text = sim.playbook.read_text().replace('name = "sim-pd"', f'name = "{deployment_name(root)}"')
    sim.playbook.write_text(text)
    sim.start_all()
    return Demo(root, sim, sim.playbook, root / "store")


def plant_changes(demo: Demo, perf: bool = False) -> list[tuple[str, str, str]]:
    """Edit the serve-env files like an afternoon of tuning would, then restart everything."""
    changes = INNOCENT_CHANGES[:3] + [BAD_CHANGE] + INNOCENT_CHANGES[3:]
    if perf:
        changes = INNOCENT_CHANGES[:2] + [PERF_SPEEDUP, PERF_SLOWDOWN, PERF_NOOP] + INNOCENT_CHANGES[2:4]
    for service, key, value in changes:
        demo.sim.set_env(service, key, value)  # type: ignore[attr-defined]
    extra = demo.sim.root / "conf" / "extra" / "deploy-notes.txt"  # type: ignore[attr-defined]
    if extra.exists():
        extra.write_text(extra.read_text() + "afternoon: tuned decode kernels, more NCCL logging\n")
    demo.sim.co_restart()  # type: ignore[attr-defined]
    return changes
