"""Probes that read what on-call engineers watch: an engine's Prometheus `/metrics` (`metrics`) or a
Prometheus server (`promql`), while the probe loads the stack for `load_s` seconds.

A sample is one load window and one number: for `metrics`, the page is read before and after the
window (prometheus-client's text parser) and the number is a counter's rate over the window, a
histogram's quantile over the observations made in it (the bucket counts' increase, interpolated as
Prometheus' histogram_quantile does), or a gauge's mean over readings taken while loaded; for
`promql`, the query (with `$window` replaced by the window, e.g. "3s") is evaluated at the window's
end, once the server has scraped past it. The perf judge (trials/perf_trial.py) compares the samples with
the baseline's. Prometheus has no annotation API: the window is reported in the sample's reason and
in the run's record, and no Grafana annotation is written.
"""
from __future__ import annotations

import json

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families

from envbisect.hosts import bounded_http
from envbisect.hosts.transport import Transport
from envbisect.inputs.masking import printable
from envbisect.inputs.playbook import Probe
from envbisect.outcome import Outcome
from envbisect.trials.probe_request import ProbeRun, RequestRecord, send

SCRAPE_WAIT_S = 15.0  # how long a promql sample waits for the server to scrape past the window


# --- pure: reading a metrics page --------------------------------------------------------------

@dataclass(frozen=True)
class Reading:
    """One family's samples on one page, matching the label filter: name -> labels -> value."""
    total: float  # counter: the sum over series; gauge: the sum; histogram: the observation count
    buckets: tuple[tuple[float, float], ...] = ()  # histogram: (le, cumulative count) summed over series


def read_family(text: str, series: str, labels: Iterable[tuple[str, str]] = ()) -> Reading | None:
    """The family `series` of a Prometheus text page (None when the page does not have it). A
    counter is named without its `_total` by the parser; either spelling is accepted."""
    want = dict(labels)
    base = series[:-6] if series.endswith("_total") else series
    for fam in text_string_to_metric_families(text):
        if fam.name not in (series, base):
            continue
        total = 0.0
        buckets: dict[float, float] = {}
        for s in fam.samples:
            if any(s.labels.get(k) != v for k, v in want.items()):
                continue
            if not math.isfinite(s.value):
                raise ValueError(f"{s.name}: its sample {s.value} is not a finite number")
            if fam.type == "histogram":
                if s.name.endswith("_bucket"):
                    if "le" not in s.labels:  # a page is a server's answer: malformed is "cannot read", not a crash
                        raise ValueError(f"{s.name}: a histogram bucket without an le label")
                    le = float(s.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + s.value
                elif s.name.endswith("_count"):
                    total += s.value
            elif fam.type == "counter":
                if s.name.endswith("_total") or s.name == fam.name:
                    total += s.value
            elif s.name == fam.name:
                total += s.value
        return Reading(total, tuple(sorted(buckets.items())))
    return None


def rate(before: Reading, after: Reading, seconds: float) -> float:
    """A counter's increase per second (a restart in between resets it: the after-value is the increase)."""
    inc = after.total - before.total
    return (after.total if inc < 0 else inc) / seconds if seconds > 0 else float("nan")


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile: the bucket that holds the q-th observation, linearly
    interpolated; NaN without observations; the highest finite bound when it falls in +Inf."""
    bs = sorted(buckets)
    if not bs or bs[-1][1] <= 0:
        return float("nan")
    total = bs[-1][1]
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in bs:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return bs[-1][0]


def increase(before: Reading, after: Reading) -> tuple[tuple[float, float], ...]:
    """The buckets' increase over the window (the observations made in it)."""
    old = dict(before.buckets)
    return tuple((le, c - old.get(le, 0.0)) for le, c in after.buckets)


# --- I/O: load and read -------------------------------------------------------------------------

def load_for(probe: Probe, base: str, path: str, netloc: str, seconds: float) -> list[RequestRecord]:
    """`concurrency` clients sending the probe's request back to back until `seconds` have passed
    (the requests under way finish)."""
    # warm-up first, untimed and unread (as a perf sample's): the first requests after a restart
    # open connections and warm caches, which is not the configuration's speed
    warm = probe.concurrency if probe.warmup is None else probe.warmup
    if warm:
        from concurrent.futures import ThreadPoolExecutor

        limits = httpx.Limits(max_connections=probe.concurrency, max_keepalive_connections=probe.concurrency)
        with bounded_http.client(insecure=probe.insecure, limits=limits) as c, \
                ThreadPoolExecutor(max_workers=probe.concurrency) as pool:
            list(pool.map(lambda i: send(c, probe, base, path, netloc, -i - 1), range(warm)))
    deadline = time.monotonic() + seconds
    recs: list[RequestRecord] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        n = 0
        with bounded_http.client(insecure=probe.insecure) as c:
            while time.monotonic() < deadline:
                n += 1
                rec = send(c, probe, base, path, netloc, n, conn=i)
                with lock:
                    recs.append(rec)
                if not rec.ok:
                    return
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(probe.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return recs


def _failed(probe: Probe, recs: list[RequestRecord], t0: float, target: str) -> ProbeRun | None:
    bad = [r for r in recs if not r.ok]
    if not bad:
        return None
    return ProbeRun(probe.name, probe.kind, Outcome.FAIL, f"{len(bad)} of {len(recs)} load requests failed: "
                    f"{bad[0].error}", tuple(recs), time.monotonic() - t0, target)


def metrics_sample(probe: Probe, transport, url_base: tuple[str, str, str], metrics_base: tuple[str, str],
                   t0: float) -> ProbeRun:
    """One `metrics` sample: read, load for load_s (reading a gauge every half second), read."""
    base, path, netloc = url_base
    mbase, mpath = metrics_base
    target = probe.metrics_url or ""

    def page(c: httpx.Client) -> Reading | None:
        ans = bounded_http.request(c, "GET", mbase + mpath, deadline_s=probe.timeout_s,
                                   max_body=bounded_http.EVIDENCE_MAX_BODY)
        if ans.status_code >= 400 or ans.cut:
            raise ValueError(f"HTTP {ans.status_code}" if ans.status_code >= 400 else ans.cut_note())
        return read_family(ans.text, probe.series or "", probe.labels)

    gauges: list[float] = []
    stop = threading.Event()

    def poll(c: httpx.Client) -> None:
        while not stop.wait(0.5):
            try:
                r = page(c)
            except (httpx.HTTPError, ValueError):
                continue
            if r is not None:
                gauges.append(r.total)
    with bounded_http.client(insecure=probe.insecure) as c:
        try:
            before = page(c)
        except (httpx.HTTPError, ValueError) as e:
            return ProbeRun(probe.name, probe.kind, Outcome.CANNOT_TEST, f"cannot read {target}: {e}"[:300], (),
                            time.monotonic() - t0, target)
        if before is None:
            return ProbeRun(probe.name, probe.kind, Outcome.CANNOT_TEST, f"{target} has no {probe.series}", (),
                            time.monotonic() - t0, target)
        poller = threading.Thread(target=poll, args=(bounded_http.client(insecure=probe.insecure),), daemon=True)
        if probe.reading == "gauge":
            poller.start()
        w0 = time.monotonic()
        recs = load_for(probe, base, path, netloc, probe.load_s)
        stop.set()
        try:
            after = page(c)
        except (httpx.HTTPError, ValueError) as e:
            return ProbeRun(probe.name, probe.kind, Outcome.FAIL, f"cannot read {target} after the load: {e}"[:300],
                            tuple(recs), time.monotonic() - t0, target)
        wall = time.monotonic() - w0
    failed = _failed(probe, recs, t0, target)
    if failed is not None:
        return failed
    if after is None:
        return ProbeRun(probe.name, probe.kind, Outcome.FAIL, f"{target} lost {probe.series} under load",
                        tuple(recs), time.monotonic() - t0, target)
    if probe.reading == "rate":
        value = rate(before, after, wall)
        shown = f"{value:.4g}/s"
    elif probe.reading == "quantile":
        value = histogram_quantile(probe.quantile, increase(before, after))
        shown = f"p{probe.quantile * 100:g} {value:.4g}"
    else:
        value = sum(gauges) / len(gauges) if gauges else after.total
        shown = f"mean {value:.4g} over {len(gauges) or 1} readings"
    if math.isnan(value):
        return ProbeRun(probe.name, probe.kind, Outcome.CANNOT_TEST, f"no {probe.series} observations in the "
                        f"{wall:.1f} s window", tuple(recs), time.monotonic() - t0, target)
    return ProbeRun(probe.name, probe.kind, Outcome.PASS, f"{probe.metric}: {shown} over {wall:.1f} s of load "
                    f"({len(recs)} requests at {probe.concurrency})", tuple(recs), time.monotonic() - t0, target,
                    value=value)


def window_text(seconds: float) -> str:
    """A PromQL duration inside the window (whole seconds, rounded down, at least 1): rounded up, the
    range would reach back before the load began and dilute the rate by the idle part."""
    return f"{max(1, math.floor(seconds))}s"


def sample_number(v: Any) -> float | None:
    """A sample's value as the Prometheus API sends it (a string; a number is taken too) when it is a
    finite number; None for "+Inf", "-Inf", "NaN", a bool or anything else: no number to test."""
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        return None
    try:
        f = float(v)
    except ValueError:
        return None
    return f if math.isfinite(f) else None


def promql_value(doc: Any) -> float | None:
    """The number of an /api/v1/query answer: a scalar, or a vector of exactly one sample; None for
    anything else, whatever its shape (an answer is data from a server, not a promise)."""
    if not isinstance(doc, Mapping) or doc.get("status") != "success" or not isinstance(doc.get("data"), Mapping):
        return None
    data = doc["data"]
    res = data.get("result")
    try:
        if data.get("resultType") == "scalar" and isinstance(res, list) and len(res) == 2:
            return sample_number(res[1])
        if data.get("resultType") == "vector" and isinstance(res, list) and len(res) == 1:
            return sample_number(res[0]["value"][1])
    except (TypeError, KeyError, IndexError):
        return None
    return None


def _no_number(doc: Any) -> str:
    """Why an answer holds no number, on one line."""
    error = doc.get("error") if isinstance(doc, Mapping) else None
    why = str(error) if error else "the answer is not one number: " + json.dumps(
        doc.get("data") if isinstance(doc, Mapping) else doc, default=str)[:160]
    return printable(why, keep_newlines=False)[:300]


def promql_sample(probe: Probe, url_base: tuple[str, str, str], prom_base: str, t0: float) -> ProbeRun:
    """One `promql` sample: load for load_s, wait for a scrape past the window's end, query at the end."""
    base, path, netloc = url_base
    target = probe.prometheus or ""
    start = time.time()
    recs = load_for(probe, base, path, netloc, probe.load_s)
    end = time.time()
    failed = _failed(probe, recs, t0, target)
    if failed is not None:
        return failed
    query = (probe.query or "").replace("$window", window_text(end - start))
    with bounded_http.client(insecure=probe.insecure) as c:
        deadline = time.monotonic() + SCRAPE_WAIT_S
        try:
            while True:  # every target scraped after the window ended: its last samples are in
                doc = _prom_query(c, prom_base, {"query": "min(timestamp(up))"}, probe.timeout_s)
                last = promql_value(doc)
                if last is not None and last >= end:
                    break
                if time.monotonic() > deadline:
                    return ProbeRun(probe.name, probe.kind, Outcome.CANNOT_TEST, f"{target} did not scrape past the "
                                    f"window's end within {SCRAPE_WAIT_S:g} s", tuple(recs), time.monotonic() - t0,
                                    target)
                time.sleep(0.25)
            doc = _prom_query(c, prom_base, {"query": query, "time": f"{end:.3f}"}, probe.timeout_s)
        except (httpx.HTTPError, ValueError) as e:
            return ProbeRun(probe.name, probe.kind, Outcome.CANNOT_TEST, f"cannot query {target}: {e}"[:300],
                            tuple(recs), time.monotonic() - t0, target)
    value = promql_value(doc)
    if value is None or math.isnan(value):
        return ProbeRun(probe.name, probe.kind, Outcome.CANNOT_TEST, f"{query}: {_no_number(doc)}", tuple(recs),
                        time.monotonic() - t0, target)
    window = f"{time.strftime('%H:%M:%S', time.gmtime(start))}-{time.strftime('%H:%M:%S', time.gmtime(end))} UTC"
    return ProbeRun(probe.name, probe.kind, Outcome.PASS, f"{query} = {value:.4g} over {window} ({len(recs)} "
                    f"requests at {probe.concurrency})", tuple(recs), time.monotonic() - t0, target, value=value)


def run_prometheus_probe(probe: Probe, transport: Transport, url: str, t0: float) -> ProbeRun:
    """A metrics or promql sample from the probe's vantage: the load target, and the /metrics page
    or the Prometheus server, each through its own forward (loopback-bound servers are reachable)."""
    from urllib.parse import urlsplit

    from envbisect.hosts.urls import split_url

    def based(u: str, fh: str, fp: int) -> str:
        return f"{urlsplit(u).scheme or 'http'}://{fh}:{fp}"

    host, port, path = split_url(url)
    with transport.forward(host, port) as (fh, fp):
        load = (based(url, fh, fp), path, urlsplit(url).netloc)
        other = probe.metrics_url if probe.kind == "metrics" else probe.prometheus
        oh, op, opath = split_url(other or "")
        with transport.forward(oh, op) as (gh, gp):
            if probe.kind == "metrics":
                return metrics_sample(probe, transport, load, (based(other or "", gh, gp), opath), t0)
            return promql_sample(probe, load, based(other or "", gh, gp) + opath.rstrip("/"), t0)


def _prom_query(c: httpx.Client, prom_base: str, params: dict[str, str], deadline_s: float) -> dict:
    """One /api/v1/query answer, read within the probe's deadline and the evidence cap."""
    url = httpx.URL(prom_base + "/api/v1/query", params=params)
    ans = bounded_http.request(c, "GET", str(url), deadline_s=deadline_s, max_body=bounded_http.EVIDENCE_MAX_BODY)
    if ans.cut:
        raise ValueError(ans.cut_note())
    try:
        return json.loads(ans.body)
    except RecursionError:
        raise ValueError("the answer is JSON nested too deeply") from None
