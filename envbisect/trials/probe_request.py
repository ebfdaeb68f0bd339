"""What every HTTP probe kind shares: the records of a probe run, one judged request, the refusal of
a certificate that does not verify, and the transport a probe runs from. Its own module so that the
probe kinds (probe.py, probe_answers.py, probe_metrics.py) import it and not each other."""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Mapping
from urllib.parse import urlsplit

import httpx

from envbisect.errors import RemoteError
from envbisect.hosts import bounded_http
from envbisect.hosts.transport import LocalTransport, Transport
from envbisect.inputs.playbook import LOCAL, Probe

EXCERPT = 160


@dataclass(frozen=True)
class RequestRecord:
    n: int
    ok: bool
    status: int | None
    latency_s: float
    error: str | None = None
    excerpt: str = ""
    connection: int = 0  # which client connection carried it (multi_round: all the same)


@dataclass(frozen=True)
class ProbeRun:
    probe: str
    kind: str
    outcome: str  # pass | fail | cannot-test | abort
    reason: str
    requests: tuple[RequestRecord, ...]
    duration_s: float
    target: str = ""
    value: float | None = None  # perf: the sample's metric (tokens/s, seconds)

    def to_json(self) -> dict:
        return {"probe": self.probe, "kind": self.kind, "outcome": self.outcome, "reason": self.reason,
                "target": self.target, "duration_s": round(self.duration_s, 3), "value": self.value,
                "requests": [{"n": r.n, "ok": r.ok, "status": r.status, "latency_s": round(r.latency_s, 4),
                              "error": r.error, "excerpt": r.excerpt} for r in self.requests]}


def check(probe: Probe, n: int, resp: bounded_http.Answer | None, latency: float, error: str | None,
           conn: int = 0) -> RequestRecord:
    if resp is None:
        return RequestRecord(n, False, None, latency, error, "", conn)
    body = resp.text
    excerpt = body[:EXCERPT].replace("\n", " ")
    problem = None
    if resp.cut:  # a flood, not an answer: judged like a hang, and said so
        problem = f"{resp.cut_note()}: an answer is not that big"
    elif resp.status_code != probe.expect_status:
        problem = f"HTTP {resp.status_code}, expected {probe.expect_status}"
    elif probe.expect_body and not re.search(probe.expect_body, body):
        problem = f"body does not match {probe.expect_body!r}"
    elif probe.latency_budget_s is not None and latency > probe.latency_budget_s:
        problem = f"took {latency:.2f} s, over the {probe.latency_budget_s:g} s budget"
    return RequestRecord(n, problem is None, resp.status_code, latency, problem, excerpt, conn)


def send(client: httpx.Client, probe: Probe, base: str, path: str, netloc: str, n: int,
         conn: int = 0) -> RequestRecord:
    """One request of an HTTP probe through `client`, judged by the probe's expectations."""
    headers = {"Host": netloc, **dict(probe.headers)}
    if probe.body is not None:
        headers.setdefault("Content-Type", "application/json")
    t0 = time.monotonic()
    try:
        resp = bounded_http.request(client, probe.method, base + path, content=probe.body, headers=headers,
                                    deadline_s=probe.timeout_s, max_body=bounded_http.PROBE_MAX_BODY,
                                    sni_host=urlsplit("//" + netloc).hostname)
        return check(probe, n, resp, time.monotonic() - t0, None, conn)
    except httpx.HTTPError as e:
        refuse_unverified(probe, e)
        return check(probe, n, None, time.monotonic() - t0, bounded_http.describe(e, probe.timeout_s), conn)


def refuse_unverified(probe: Probe, e: BaseException) -> None:
    """A certificate that does not verify says nothing about the configuration: the probe cannot run."""
    tls = bounded_http.tls_problem(e)
    if tls:
        raise RemoteError(f"probe {probe.name}: {tls} for {probe.url} (when that is meant, say "
                          f"`insecure = true` in [probes.{probe.name}] to skip verification)") from None


def vantage_transport(probe: Probe, transports: Mapping[str, Transport]) -> Transport:
    """Where the probe runs from: its vantage host's transport, this machine for `local`."""
    transport = transports.get(probe.vantage) if probe.vantage != LOCAL else None
    return transport or LocalTransport()
