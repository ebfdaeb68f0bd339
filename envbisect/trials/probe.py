"""Probes: the pass/fail question asked of a started configuration.

HTTP probes run with httpx from the probe's vantage point: for a host, through an SSH direct-tcpip
forward, so loopback-bound servers are reachable and each client connection is one upstream
connection (the multi-round probe's keep-alive reuse is real, which is where the incident's hang
lived). A `command` probe follows `git bisect run`'s exit-code protocol.
"""
from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping
from urllib.parse import urlsplit

import httpx

from envbisect.hosts import bounded_http
from envbisect.hosts.urls import split_url
from envbisect.hosts.transport import Transport
from envbisect.inputs.playbook import Probe
from envbisect.outcome import Outcome
from envbisect.trials.probe_answers import run_answers
from envbisect.trials.probe_metrics import run_prometheus_probe
from envbisect.trials.probe_request import (EXCERPT, ProbeRun, RequestRecord, refuse_unverified, send,
                                            vantage_transport)

__all__ = ["ABORT", "BROKEN", "BROKEN_EXITS", "CANNOT_TEST", "DNS_FAILURE", "EXCERPT", "FAIL", "PASS", "ProbeRun",
           "RequestRecord", "run_probe"]

# a probe run's outcomes (the shared vocabulary: envbisect.outcome)
PASS, FAIL, CANNOT_TEST, ABORT = Outcome.PASS, Outcome.FAIL, Outcome.CANNOT_TEST, Outcome.ABORT
BROKEN = Outcome.BROKEN
# A command probe's exit status, as `git bisect run` reads it: 0 pass; 125 cannot test this
# configuration; 126 (cannot execute) and 127 (not found) a probe that did not run at all, which says
# nothing about the configuration (git's bisect run double-checks them too); every other status,
# 1-124 and 128 and above (a probe killed by a signal: a crash, the OOM killer) is a failure.
BROKEN_EXITS = {126: "cannot execute", 127: "command not found"}
# an HTTP probe's host name that does not resolve where it runs from (getaddrinfo's messages)
DNS_FAILURE = re.compile(r"Name or service not known|nodename nor servname|Temporary failure in name resolution|"
                         r"No address associated with hostname|getaddrinfo failed")
def run_probe(probe: Probe, transports: Mapping[str, Transport], *, url: str | None = None) -> ProbeRun:
    """One run of the probe (its `repeat` is the caller's business: runs stop at the first failure)."""
    t0 = time.monotonic()
    transport = vantage_transport(probe, transports)
    if probe.kind == "command":
        return _run_command(probe, transport, t0)
    target = url or probe.url or ""
    if probe.kind in ("metrics", "promql"):
        return run_prometheus_probe(probe, transport, target, t0)
    if probe.kind == "answers":
        return run_answers(probe, transport, target, t0)
    host, port, path = split_url(target)
    scheme = urlsplit(target).scheme or "http"
    netloc = urlsplit(target).netloc
    with transport.forward(host, port) as (fh, fp):
        base = f"{scheme}://{fh}:{fp}"
        if probe.kind == "perf":
            return _perf_sample(probe, base, path, netloc, target, t0)
        if probe.kind == "http":
            with bounded_http.client(insecure=probe.insecure) as c:
                recs = [send(c, probe, base, path, netloc, 1)]
        elif probe.kind == "multi_round":
            # One connection, reused: the rounds after the first ride a keep-alive connection.
            limits = httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=600)
            recs = []
            with bounded_http.client(insecure=probe.insecure, limits=limits) as c:
                for i in range(probe.rounds):
                    rec = send(c, probe, base, path, netloc, i + 1)
                    recs.append(rec)
                    if not rec.ok:
                        break
        else:  # concurrent
            def one(i: int) -> RequestRecord:
                with bounded_http.client(insecure=probe.insecure) as c:
                    return send(c, probe, base, path, netloc, i + 1, conn=i)
            with ThreadPoolExecutor(max_workers=probe.concurrency) as pool:
                recs = list(pool.map(one, range(probe.concurrency)))
    bad = [r for r in recs if not r.ok]
    if bad and len(bad) == len(recs) and all(r.error and DNS_FAILURE.search(r.error) for r in bad):
        # no request left this machine: a probe whose host name is unknown never reached the stack
        return ProbeRun(probe.name, probe.kind, BROKEN, f"the host name {host!r} is unknown (DNS): {bad[0].error}",
                        tuple(recs), time.monotonic() - t0, target)
    if bad:
        first = bad[0]
        where = f"round {first.n} of {probe.rounds} on one reused connection" if probe.kind == "multi_round" else (
            f"{len(bad)} of {len(recs)} concurrent requests" if probe.kind == "concurrent" else "request")
        reason = f"{where}: {first.error}"
        return ProbeRun(probe.name, probe.kind, FAIL, reason, tuple(recs), time.monotonic() - t0, target)
    slowest = max(r.latency_s for r in recs)
    return ProbeRun(probe.name, probe.kind, PASS, f"{len(recs)} request(s) ok, max {slowest:.2f} s",
                    tuple(recs), time.monotonic() - t0, target)


def _run_command(probe: Probe, transport: Transport, t0: float) -> ProbeRun:
    from envbisect.errors import RemoteError

    try:
        res = transport.run(probe.command or "false", timeout=probe.timeout_s)
    except RemoteError as e:
        if "timed out" in str(e):
            rec = RequestRecord(1, False, None, time.monotonic() - t0, f"no exit within {probe.timeout_s:g} s (hang)")
            return ProbeRun(probe.name, "command", FAIL, rec.error or "", (rec,), time.monotonic() - t0,
                            probe.command or "")
        raise
    code = res.exit_code
    text = (res.stdout + res.stderr).decode("utf-8", "replace")
    if code in BROKEN_EXITS:
        said = " ".join(text.split())[-EXCERPT:]
        reason = f"exit status {code} ({BROKEN_EXITS[code]})" + (f": {said}" if said else "")
        rec = RequestRecord(1, False, code, time.monotonic() - t0, reason, said)
        return ProbeRun(probe.name, "command", BROKEN, reason, (rec,), time.monotonic() - t0, probe.command or "")
    outcome = PASS if code == 0 else CANNOT_TEST if code == 125 else FAIL
    rec = RequestRecord(1, code == 0, code, time.monotonic() - t0, None if code == 0 else f"exit status {code}",
                        text[-EXCERPT:].replace("\n", " "))
    return ProbeRun(probe.name, "command", outcome, f"exit status {code}", (rec,), time.monotonic() - t0,
                    probe.command or "")


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _perf_sample(probe: Probe, base: str, path: str, netloc: str, target: str, t0: float) -> ProbeRun:
    """One sample of a perf probe: `warmup` untimed requests, then `requests` at `concurrency`
    over a pool of keep-alive connections (as a load generator would); the metric of the timed
    part. A request that fails makes the sample FAIL (the stack is broken, not slow)."""
    stream = probe.metric == "ttft_p50_s"
    headers = {"Host": netloc, "Content-Type": "application/json", **dict(probe.headers)}
    body = probe.body
    if stream and body:
        import json

        doc = json.loads(body)
        doc["stream"] = True
        body = json.dumps(doc)
    limits = httpx.Limits(max_connections=probe.concurrency, max_keepalive_connections=probe.concurrency)

    def one(c: httpx.Client, n: int) -> tuple[RequestRecord, int, float | None]:
        s0 = time.monotonic()
        try:
            resp = bounded_http.request(c, probe.method, base + path, content=body, headers=headers,
                                        deadline_s=probe.timeout_s, max_body=bounded_http.PROBE_MAX_BODY,
                                        sni_host=urlsplit(target).hostname)
        except httpx.HTTPError as e:
            refuse_unverified(probe, e)
            why = bounded_http.describe(e, probe.timeout_s)
            return RequestRecord(n, False, None, time.monotonic() - s0, why), 0, None
        latency = time.monotonic() - s0
        text = resp.text
        if resp.cut:
            return RequestRecord(n, False, resp.status_code, latency, f"{resp.cut_note()}: an answer is not that big",
                                 text[:EXCERPT]), 0, resp.first_byte_s
        if resp.status_code != probe.expect_status:
            return (RequestRecord(n, False, resp.status_code, latency, f"HTTP {resp.status_code}, expected "
                                  f"{probe.expect_status}", text[:EXCERPT]), 0, resp.first_byte_s)
        return RequestRecord(n, True, resp.status_code, latency, None, ""), _completion_tokens(text), resp.first_byte_s

    with bounded_http.client(insecure=probe.insecure, limits=limits) as c, \
            ThreadPoolExecutor(max_workers=probe.concurrency) as pool:
        warm = probe.concurrency if probe.warmup is None else probe.warmup
        list(pool.map(lambda i: one(c, -i), range(warm)))
        w0 = time.monotonic()
        got = list(pool.map(lambda i: one(c, i + 1), range(probe.requests)))
        wall = time.monotonic() - w0
    recs = tuple(r for r, _, _ in got)
    bad = [r for r in recs if not r.ok]
    if bad:
        return ProbeRun(probe.name, "perf", FAIL, f"{len(bad)} of {len(recs)} requests failed: {bad[0].error}",
                        recs, time.monotonic() - t0, target)
    lat = [r.latency_s for r in recs]
    if probe.metric == "output_tokens_per_s":
        value = sum(t for _, t, _ in got) / wall if wall > 0 else 0.0
        shown = f"{value:.1f} tok/s"
    elif probe.metric == "ttft_p50_s":
        value = _quantile([f for _, _, f in got if f is not None], 0.5)
        shown = f"TTFT p50 {value * 1000:.1f} ms"
    else:
        value = _quantile(lat, 0.5 if probe.metric == "latency_p50_s" else 0.95)
        shown = f"{probe.metric[8:11]} latency {value * 1000:.1f} ms"
    return ProbeRun(probe.name, "perf", PASS, f"{shown} ({probe.requests} requests at {probe.concurrency})",
                    recs, time.monotonic() - t0, target, value=value)


def _completion_tokens(text: str) -> int:
    """usage.completion_tokens of an answer (the last usage block of a stream)."""
    m = list(re.finditer(r'"completion_tokens"\s*:\s*(\d+)', text))
    return int(m[-1].group(1)) if m else 0
