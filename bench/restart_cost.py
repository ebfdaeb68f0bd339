"""What a restart costs in seconds (issue 38): a per-service cost model for the oracle benchmarks.

On a real PD stack a co-restart's cost is model loading: minutes for prefill and decode, seconds for
the router. A restart costs:

  sequential  every service one after another (today's `order = [...]`, and what a classic
              method's script does: restart everything in order): the sum of the services' costs;
  grouped     `order = [["prefill", "decode"], "router"]`: a start group costs its slowest member,
              the groups one after another;
  planned     envbisect's restart plan (trials/restart_plan.py) over the grouped start: a
              router-only change after a proven restart whose probe passed restarts the router
              alone; everything else restarts every service, grouped.

Defaults: prefill 300 s, decode 300 s, router 10 s. `from_run` replaces them with the medians of
the `restart_durations` a real run recorded (trials.jsonl).
"""
from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envbisect.inputs.playbook import Playbook, parse_playbook  # noqa: E402
from envbisect.trials.restart_plan import RestartPlan, Running, plan_restart  # noqa: E402

DEFAULT_COSTS = {"prefill": 300.0, "decode": 300.0, "router": 10.0}
GROUPS = (("prefill", "decode"), ("router",))


def pd_playbook(groups: tuple[tuple[str, ...], ...] = GROUPS) -> Playbook:
    """The PD stack the incidents run on: three services, one host, the engines in one start group."""
    names = [n for g in groups for n in g]
    services = {n: {"host": "h", "env_file": f"/srv/{n}.serve-env", "start": "true", "stop": "true",
                    "health": "http://127.0.0.1:1/health"} for n in names}
    return parse_playbook({"hosts": {"h": {"ssh": "local"}}, "services": services,
                           "restart": {"order": [list(g) if len(g) > 1 else g[0] for g in groups]}},
                          Path("/bench/envbisect.toml"))


@dataclass(frozen=True)
class CostModel:
    seconds: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_COSTS))
    groups: tuple[tuple[str, ...], ...] = GROUPS
    source: str = "defaults"

    @property
    def sequential(self) -> float:
        return sum(self.seconds[n] for g in self.groups for n in g)

    def grouped(self, names: Iterable[str] | None = None) -> float:
        chosen = set(names) if names is not None else {n for g in self.groups for n in g}
        return sum(max((self.seconds[n] for n in g if n in chosen), default=0.0) for g in self.groups)

    def describe(self) -> str:
        each = ", ".join(f"{n} {self.seconds[n]:g} s" for g in self.groups for n in g)
        return (f"{each} ({self.source}); a full co-restart {self.sequential:g} s one after another, "
                f"{self.grouped():g} s with {' then '.join('+'.join(g) for g in self.groups)}")


def from_run(path: str | Path, base: CostModel | None = None) -> CostModel:
    """The medians of `restart_durations` per service over a run's trials.jsonl (a run folder or
    the file); a service the run never restarted keeps its cost from `base`."""
    p = Path(path)
    p = p / "trials.jsonl" if p.is_dir() else p
    seen: dict[str, list[float]] = {}
    for line in p.read_text().splitlines():
        if line.strip():
            for name, s in (json.loads(line).get("restart_durations") or {}).items():
                seen.setdefault(name, []).append(float(s))
    base = base or CostModel()
    costs = {**base.seconds, **{n: statistics.median(v) for n, v in seen.items() if n in base.seconds}}
    return CostModel(costs, base.groups, f"medians of {sum(map(len, seen.values()))} measured starts in {p}")


MODEL = CostModel()  # run.py --restart-durations replaces it before the workers fork
_PLAYBOOK = pd_playbook()


def service_of(delta_id: str) -> str | None:
    head = delta_id.split(":", 1)[0]
    return head if head in _PLAYBOOK.services else None


class Meter:
    """Restart-seconds of one method on one incident: `sequential` (every restart a full co-restart,
    one service after another) and `spent` (this method's way: planned and grouped for envbisect,
    sequential for the classic methods). `plans` counts the planned restarts by what restarted."""

    def __init__(self, planned: bool = False):
        self.planned = planned
        self.sequential = 0.0
        self.spent = 0.0
        self.partial = 0
        self._running: Running | None = None

    def restart(self, config: Iterable[str], kind: str = "") -> RestartPlan | None:
        config = frozenset(config)
        self.sequential += MODEL.sequential
        if not self.planned:
            self.spent += MODEL.sequential
            return None
        plan = plan_restart(_PLAYBOOK, config, {d: service_of(d) for d in config | (self._running.config
                                                                                      if self._running else set())},
                            self._running, "a baseline premise" if kind == "premise-baseline" else "")
        self.spent += MODEL.grouped(plan.services)
        self.partial += not plan.full
        self._running = Running(config, proven=True, probe_passed=False)
        return plan

    def probed(self, passed: bool) -> None:
        """The last restarted configuration's probe (or the running stack's, when nothing restarted yet)."""
        if self._running is not None:
            self._running = Running(self._running.config, True, passed)
