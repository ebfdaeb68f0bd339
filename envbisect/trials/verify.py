"""`envbisect verify`: the layered check an engineer runs by hand after any change, automated.

Layers, stopping at the first that fails: every service's health; one request through the
router; a concurrent batch (default 16); a multi-round run on one reused keep-alive connection.
The same single request is also sent straight to each engine (informational, never stops the
run) so an engine fault can be told apart from a routing or client-path fault.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from envbisect.trials.diagnose import Layer, engine_layers, entry_service, rebase
from envbisect.errors import UsageError
from envbisect.inputs.playbook import Playbook, Probe
from envbisect.trials.probe import PASS, ProbeRun, run_probe
from envbisect.hosts.urls import health_ok
from envbisect.hosts.transport import Transport


@dataclass(frozen=True)
class VerifyReport:
    layers: tuple[Layer, ...]
    failed_at: str | None
    summary: str

    @property
    def ok(self) -> bool:
        return self.failed_at is None

    def to_json(self) -> dict:
        return {"ok": self.ok, "failed_at": self.failed_at, "summary": self.summary,
                "layers": [l.to_json() for l in self.layers]}


def request_probe(playbook: Playbook) -> Probe:
    """The playbook's first probe that sends a request (not a command): the template for the layers."""
    for p in playbook.probes.values():
        if p.kind != "command" and p.url:
            return p
    raise UsageError(f"{playbook.path}: verify needs at least one [probes.NAME] with a url")


def default_layers(playbook: Playbook, concurrency: int = 16, rounds: int = 6) -> list[Probe]:
    base = request_probe(playbook)
    entry = playbook.services[entry_service(playbook)]
    url = rebase(base.url or "", entry.health)
    one = replace(base, name="one request via router", kind="http", url=url, vantage=entry.host)
    return [one,
            replace(one, name=f"{concurrency} concurrent via router", kind="concurrent", concurrency=concurrency),
            replace(one, name=f"{rounds} rounds on one keep-alive connection", kind="multi_round", rounds=rounds)]


def verify(playbook: Playbook, transports: Mapping[str, Transport], probes: Sequence[Probe] | None = None, *,
           concurrency: int = 16) -> VerifyReport:
    layers: list[Layer] = []
    failed: str | None = None
    for name in playbook.restart.order:
        s = playbook.services[name]
        t0 = time.monotonic()
        ok, why = health_ok(transports[s.host], s.health, insecure=s.insecure)
        layers.append(Layer(f"health: {name}", s.health, ok, why, seconds=time.monotonic() - t0))
        if not ok and failed is None:
            failed = f"health: {name}"
    for p in (probes if probes else default_layers(playbook, concurrency)):
        if failed is not None:
            layers.append(Layer(p.name, p.url or p.command or "", None, "not run: an earlier layer failed"))
            continue
        r = _perf_layer(p, transports) if p.is_perf else run_probe(p, transports)
        layers.append(Layer(p.name, r.target, r.outcome == PASS, r.reason, r, r.duration_s))
        if r.outcome != PASS:
            failed = p.name
    # Straight to each engine: separates "an engine is broken" from "routing / client path".
    layers.extend(engine_layers(playbook, transports, request_probe(playbook)))
    return VerifyReport(tuple(layers), failed, _summary(layers, failed))


def _perf_layer(p: Probe, transports: Mapping[str, Transport]) -> ProbeRun:
    """A perf probe as a layer: `samples` samples, the median and its spread (one sample is
    no measurement of a speed)."""
    import statistics

    from envbisect.trials.perf_trial import sample

    t0 = time.monotonic()
    runs, broken = sample(p, transports, p.samples)
    last = runs[-1]
    if broken:
        return replace(last, reason=broken, duration_s=time.monotonic() - t0)
    values = sorted(r.value for r in runs if r.value is not None)
    med = statistics.median(values)
    spread = (values[-1] - values[0]) / 2 / med * 100 if med else 0.0
    return replace(last, reason=f"{p.metric} median {med:.4g} (±{spread:.1f}% over {len(values)} samples: "
                                f"{', '.join(f'{v:.4g}' for v in values)})", duration_s=time.monotonic() - t0)


def _summary(layers: list[Layer], failed: str | None) -> str:
    engines_ok = all(l.ok for l in layers if l.informational)
    if failed is None:
        return "every layer passed"
    if failed.startswith("health:"):
        return f"{failed[8:]} is not healthy: fix that service first"
    if engines_ok:
        return (f"'{failed}' fails while every engine answers directly: the fault is in routing, the "
                "prefill->decode transfer, or the client path, not in a single engine")
    bad = ", ".join(l.name[8:] for l in layers if l.informational and not l.ok)
    return f"'{failed}' fails and {bad} also fails when asked directly: look at that engine"
