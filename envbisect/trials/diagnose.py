"""Layered path check: where along client -> router -> engines does the request break?

This is what an on-call engineer does by hand after the configuration has been cleared (or
before blaming it): each engine's health, then the same probe against the router directly, then
through the configured client path. When the router passes and the client path fails, the answer
is "not the config: look at the client, the proxy, connection reuse" - the incident's real fault.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping
from urllib.parse import urlsplit, urlunsplit

from envbisect.inputs.playbook import Playbook, Probe
from envbisect.trials.probe import PASS, ProbeRun, run_probe
from envbisect.hosts.urls import health_ok
from envbisect.hosts.transport import Transport


@dataclass(frozen=True)
class Layer:
    """One step along the request path (also the rows of `envbisect verify`)."""

    name: str  # "health: prefill", "router (router) directly", "client path", "direct: decode"
    target: str
    ok: bool | None  # None: not run because an earlier layer failed
    reason: str
    run: ProbeRun | None = None
    seconds: float = 0.0
    informational: bool = False  # reported, but never the layer that "fails" the check

    def to_json(self) -> dict:
        return {"layer": self.name, "target": self.target, "ok": self.ok, "reason": self.reason,
                "seconds": round(self.seconds, 3), "informational": self.informational,
                "probe": self.run.to_json() if self.run else None}


@dataclass(frozen=True)
class PathReport:
    layers: tuple[Layer, ...]
    broken_at: str | None
    conclusion: str

    def to_json(self) -> dict:
        return {"layers": [l.to_json() for l in self.layers], "broken_at": self.broken_at,
                "conclusion": self.conclusion}


def rebase(url: str, base: str) -> str:
    """The path of `url` on the scheme://host:port of `base`."""
    u, b = urlsplit(url), urlsplit(base)
    return urlunsplit((b.scheme, b.netloc, u.path, u.query, ""))


def entry_service(playbook: Playbook) -> str:
    """The service clients talk to: the last one started (the router in a PD deployment)."""
    return playbook.restart.order[-1]


def engine_layers(playbook: Playbook, transports: Mapping[str, Transport], base: Probe) -> list[Layer]:
    """The same request sent straight to each engine (every service but the entry one):
    informational layers that tell "an engine is broken" from "routing, the transfer or the
    client path" (a PD engine asked directly may not do the whole job, so they never fail a check)."""
    out = []
    entry = entry_service(playbook)
    for name in playbook.restart.order:
        if name == entry:
            continue
        s = playbook.services[name]
        p = replace(base, name=f"direct: {name}", kind="http", url=rebase(base.url or "", s.health), vantage=s.host)
        r = run_probe(p, transports)
        out.append(Layer(p.name, r.target, r.outcome == PASS, r.reason, r, r.duration_s, informational=True))
    return out


def failing_engines(playbook: Playbook, transports: Mapping[str, Transport], probe: Probe) -> list[str]:
    """The engines that fail ``probe`` asked directly (none for a command or perf probe): a hint of
    which side of a change made in several services to test first (search/hints.py)."""
    if probe.kind == "command" or not probe.url or probe.is_perf:
        return []
    return [layer.name.split(": ", 1)[1] for layer in engine_layers(playbook, transports, probe) if layer.ok is False]


def check_path(playbook: Playbook, transports: Mapping[str, Transport], probe: Probe) -> PathReport:
    layers: list[Layer] = []
    for name in playbook.restart.order:
        s = playbook.services[name]
        ok, why = health_ok(transports[s.host], s.health, insecure=s.insecure)
        layers.append(Layer(f"health: {name}", s.health, ok, why))
    if probe.kind != "command" and probe.url:
        entry = playbook.services[entry_service(playbook)]
        router_probe = replace(probe, url=rebase(probe.url, entry.health), vantage=entry.host)
        r = run_probe(router_probe, transports)
        layers.append(Layer(f"router ({entry.name}) directly", router_probe.url or "", r.outcome == PASS, r.reason, r))
        if r.outcome != PASS:  # which engine? (a hanging decode must not read as "look at routing")
            layers.extend(engine_layers(playbook, transports, replace(probe, url=router_probe.url)))
        targets = {router_probe.url}
        if playbook.client_url:
            client_probe = replace(probe, url=rebase(probe.url, playbook.client_url))
            targets.add(client_probe.url)
        if probe.url not in targets:
            r = run_probe(probe, transports)
            layers.append(Layer("probe target", probe.url, r.outcome == PASS, r.reason, r))
        if playbook.client_url and client_probe.url != router_probe.url:
            r = run_probe(client_probe, transports)
            layers.append(Layer("client path", client_probe.url or "", r.outcome == PASS, r.reason, r))
    else:
        r = run_probe(probe, transports)
        layers.append(Layer("probe command", probe.command or "", r.outcome == PASS, r.reason, r))
    broken = next((l for l in layers if not l.ok and not l.informational), None)
    return PathReport(tuple(layers), broken.name if broken else None, _conclude(layers, broken))


def _conclude(layers: list[Layer], broken: Layer | None) -> str:
    if broken is None:
        return ("every layer passed this time: the failure is intermittent or depends on load or on the client's "
                "own connections; re-run with more probe repeats")
    if broken.name.startswith("health:"):
        return f"{broken.name[8:]} is not healthy ({broken.reason}): look at that engine and its log first"
    if broken.name.startswith("router"):
        bad = [l.name[len("direct: "):] for l in layers if l.informational and l.ok is False]
        if bad:
            return (f"the router fails when called directly, and {', '.join(bad)} also fails when asked directly "
                    "although its health check passes: look at that engine and its log first")
        return ("the router fails even when called directly while every engine reports healthy and answers a "
                "request sent straight to it: look at the prefill->decode transfer and routing (per-worker "
                "health does not exercise the transfer)")
    return (f"the router answers correctly but the {broken.name} fails ({broken.reason}): the fault is on the path "
            "between the client and the router - the client, a proxy, connection reuse (keep-alive) - not in the "
            "deployment's configuration")
