"""A trial's restart plan: which services its co-restart restarts, and why (docs/search.md#restart-plans).

A trial restarts every service unless all of these hold, in this order:
- the playbook does not say `[restart] always_all = true`;
- the trial is not one the caller needs a full co-restart for (a baseline premise: the not-config
  proof stands on every service restarted, runs/baseline_proof.py);
- a co-restart of this run started what runs, and proved every service's restart (old process
  gone, a new one, the trial's environment): only then is what runs known to be that configuration;
- that configuration's probe passed: a failed probe may leave an engine wedged (a KV transfer
  half done, a scheduler stuck), and a process that is not restarted would carry it into the next trial;
- something changed since (a retest of the same configuration restarts everything: a new start is
  part of what it tests), and every changed delta is one service's own environment (code, a shared
  file, a start script or a watched file may reach any service);
- every service whose environment changed may restart alone (`restart_alone`: by default a
  service whose name says router; prefill and decode never do: a pair restarted apart is the
  classic PD failure, both report ready while requests hang).
Then only those services restart; the others keep running the configuration their proven restart
started. The free probe of the running stack restarts nothing and is not planned here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Mapping

from envbisect.inputs.playbook import Playbook


@dataclass(frozen=True)
class RestartPlan:
    services: tuple[str, ...]  # what restarts, in start order
    why: str  # one line for people: the rule that decided
    full: bool = True  # every service restarts

    def to_json(self) -> dict[str, Any]:
        return {"services": list(self.services), "why": self.why, "full": self.full}

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "RestartPlan | None":
        return None if not d else cls(tuple(d.get("services") or ()), str(d.get("why") or ""), bool(d.get("full")))


@dataclass(frozen=True)
class Running:
    """What the last co-restart of this run left running, as far as a plan needs it."""

    config: frozenset[str]  # the delta ids of the configuration it started
    proven: bool  # every service's restart proven (hosts/restart.ServiceRestart.proven)
    probe_passed: bool  # that configuration's last probe passed


def may_restart_alone(playbook: Playbook, name: str) -> bool:
    s = playbook.services[name]
    return s.restart_alone if s.restart_alone is not None else "router" in name.lower()


def plan_restart(playbook: Playbook, config: Collection[str], service_of: Mapping[str, str | None],
                 running: Running | None, full_because: str = "") -> RestartPlan:
    """The restart plan of a trial of `config` (delta ids). `service_of`: delta id -> the one service
    whose environment it changes (None: not one service's, e.g. code or a watched file);
    `running`: what the last co-restart left (None: none yet); `full_because`: the caller's reason
    to restart everything ("" when it has none)."""
    everything = tuple(playbook.restart.order)

    def full(why: str) -> RestartPlan:
        return RestartPlan(everything, why)

    if playbook.restart.always_all:
        return full("[restart] always_all")
    if full_because:
        return full(full_because)
    if running is None:
        return full("the first co-restart of this run: what runs now was not started by it")
    if not running.proven:
        return full("the last co-restart did not prove every service's restart")
    if not running.probe_passed:
        return full("the previous probe failed (an engine may be left wedged)")
    moved = sorted(set(config) ^ running.config)
    if not moved:
        return full("the same configuration again: a retest restarts everything")
    shared = [d for d in moved if service_of.get(d) is None]
    if shared:
        return full(f"{shared[0]} is not one service's environment")
    changed = {service_of[d] for d in moved}
    held = sorted(n for n in changed if not may_restart_alone(playbook, n))
    if held:
        return full(f"{', '.join(held)} changed: " + ("prefill and decode restart together, and every service with "
                                                        "them" if len(everything) > 1 else "its co-restart"))
    names = tuple(n for n in everything if n in changed)
    return RestartPlan(names, f"only {', '.join(names)} changed; the others run the configuration their proven "
                              "restart started and passed its probe", full=False)
