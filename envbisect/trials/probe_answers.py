"""The accuracy probe (`kind = "answers"`): `requests` prompts of the playbook's JSONL (in order,
cycled), each sent as a chat completion, and the share answered right. A run's value is that
accuracy; a run fails as a request when the stack answers with an error (broken, not wrong).

Judged by `AnswersJudge` against the baseline's accuracy measured in the same run (search/accuracy.py):
a wrong answer returns 200 and passes every HTTP-level probe, so only this comparison sees it.
"""
from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Mapping, Sequence
from urllib.parse import urlsplit

import httpx

from envbisect.hosts import bounded_http
from envbisect.hosts.urls import split_url
from envbisect.hosts.transport import Transport
from envbisect.inputs.playbook import Probe
from envbisect.outcome import Outcome
from envbisect.search.accuracy import decide_accuracy
from envbisect.trials.probe_request import EXCERPT, ProbeRun, RequestRecord, vantage_transport

_PUNCT = " \t\r\n.,;:!?\"'()[]{}*`"


def is_right(reply: str, kind: str, expected: str) -> bool:
    """exact: the reply, or its last word, equals the answer (punctuation and case around it aside);
    regex: the pattern is found in the reply; choice: the first standalone letter A-J is the answer."""
    if kind == "regex":
        return re.search(expected, reply) is not None
    if kind == "choice":
        m = re.search(r"(?<![A-Za-z])([A-J])(?![A-Za-z])", reply)
        return m is not None and m.group(1) == expected
    want = expected.strip(_PUNCT).casefold()
    words = reply.split()
    return reply.strip(_PUNCT).casefold() == want or (bool(words) and words[-1].strip(_PUNCT).casefold() == want)


def reply_text(body: str) -> str | None:
    """The text of an OpenAI-style answer (chat or completion); None when it is not one."""
    try:
        doc = json.loads(body)
        choice = doc["choices"][0]
        text = choice.get("message", {}).get("content") if "message" in choice else choice.get("text")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError):
        return None
    return text if isinstance(text, str) else None


def run_answers(probe: Probe, transport: Transport, url: str, t0: float) -> ProbeRun:
    host, port, path = split_url(url)
    netloc = urlsplit(url).netloc
    items = probe.answer_items
    headers = {"Host": netloc, "Content-Type": "application/json", **dict(probe.headers)}

    def one(c: httpx.Client, base: str, n: int) -> tuple[RequestRecord, bool]:
        prompt, kind, expected = items[n % len(items)]
        body = {"model": probe.model, "max_tokens": probe.max_tokens, "temperature": 0,
                "messages": [{"role": "user", "content": prompt}]}
        s0 = time.monotonic()
        try:
            resp = bounded_http.request(c, "POST", base + path, content=json.dumps(body), headers=headers,
                                        deadline_s=probe.timeout_s, max_body=bounded_http.PROBE_MAX_BODY)
        except httpx.TimeoutException:
            return RequestRecord(n + 1, False, None, time.monotonic() - s0,
                                 f"no answer within {probe.timeout_s:g} s (hang)"), False
        except httpx.HTTPError as e:
            return RequestRecord(n + 1, False, None, time.monotonic() - s0, f"{type(e).__name__}: {e}"[:200]), False
        latency = time.monotonic() - s0
        text = reply_text(resp.text) if resp.status_code == probe.expect_status else None
        if text is None:
            return RequestRecord(n + 1, False, resp.status_code, latency, f"HTTP {resp.status_code}: not an answer",
                                 resp.text[:EXCERPT]), False
        right = is_right(text, kind, expected)
        # a request that was answered is ok as a request; whether the answer was right is the run's value
        return RequestRecord(n + 1, True, resp.status_code, latency, None if right else
                             f"wrong answer to {prompt[:60]!r} (expected {expected!r})", text[:EXCERPT]), right

    limits = httpx.Limits(max_connections=probe.concurrency, max_keepalive_connections=probe.concurrency)
    with transport.forward(host, port) as (fh, fp):
        base = f"{urlsplit(url).scheme or 'http'}://{fh}:{fp}"
        with bounded_http.client(insecure=probe.insecure, limits=limits) as c, \
                ThreadPoolExecutor(max_workers=probe.concurrency) as pool:
            got = list(pool.map(lambda n: one(c, base, n), range(probe.requests)))
    recs = tuple(r for r, _ in got)
    broken = [r for r in recs if not r.ok]
    if broken:
        return ProbeRun(probe.name, "answers", Outcome.FAIL, f"{len(broken)} of {len(recs)} requests got no answer: "
                        f"{broken[0].error}", recs, time.monotonic() - t0, url)
    right = sum(1 for _, ok in got if ok)
    acc = right / len(got)
    outcome = Outcome.PASS if acc >= probe.min_accuracy else Outcome.FAIL
    reason = f"accuracy {acc:.1%} ({right}/{len(got)})" + (
        "" if outcome is Outcome.PASS else f", below min_accuracy {probe.min_accuracy:.0%}")
    return ProbeRun(probe.name, "answers", outcome, reason, recs, time.monotonic() - t0, url, value=acc)


def counts(probe: Probe, groups: Sequence[Sequence[float]]) -> tuple[int, int]:
    """(right, total) of runs given by their accuracies (each run asks `requests` prompts)."""
    runs = [a for g in groups for a in g]
    return sum(round(a * probe.requests) for a in runs), probe.requests * len(runs)


class AnswersJudge:
    """The accuracy counterpart of trials/perf.PerfJudge (same interface, so the runner and the
    bisection treat both alike): the reference configuration's first start measures the reference
    accuracy; every other configuration's runs (pooled over its starts) are judged against it."""

    def __init__(self, probe: Probe, reference_config: Sequence[str] = ()):
        self.probe = probe
        self.reference_config = tuple(sorted(reference_config))
        self.reference: list[tuple[float, ...]] | None = None
        self.starts: dict[tuple[str, ...], list[tuple[float, ...]]] = {}

    def resume(self, starts: Iterable[tuple[Sequence[str], Sequence[float], bool]]) -> None:
        """The judge as a run's recorded starts left it (trials/perf.PerfJudge.resume): the reference
        configuration's first start joins the reference when it passed, its later starts always, as
        `judge_start` keeps them; any other start with values joins its configuration's starts."""
        for config, values, passed in starts:
            key, values = tuple(sorted(config)), tuple(values)
            if not values:
                continue
            if key != self.reference_config:
                self.starts.setdefault(key, []).append(values)
            elif passed or self.reference is not None:
                self.reference = [*(self.reference or []), values]

    def judge_start(self, transports: Mapping[str, Transport], config: Sequence[str], runs: int = 1
                    ) -> tuple[Outcome, tuple[ProbeRun, ...], str]:
        """`runs` runs of `requests` prompts (as many as the search asks for: a run is cheap beside a
        restart), decided together; a run with no answer at all stops the trial as a failure."""
        from dataclasses import replace

        key = tuple(sorted(config))
        mine = key == self.reference_config
        done: list[ProbeRun] = []
        for _ in range(max(1, runs)):
            run = run_answers(self.probe, vantage_transport(self.probe, transports), self.probe.url or "",
                              time.monotonic())
            done.append(run)
            if run.value is None or (mine and self.reference is None and run.outcome is not Outcome.PASS):
                return (Outcome.FAIL if run.outcome is Outcome.PASS else run.outcome), tuple(done), run.reason
            if not mine and self.reference is not None:  # measurably worse already: more runs cannot undo it
                so_far = tuple(r.value for r in done if r.value is not None)
                ref_right, ref_total = counts(self.probe, self.reference)
                right, total = counts(self.probe, [*self.starts.get(key, []), so_far])
                if decide_accuracy(ref_right, ref_total, right, total, tolerance=self.probe.tolerance).worse:
                    break
        values = tuple(r.value for r in done if r.value is not None)
        right, total = counts(self.probe, [values])
        if mine:
            first = self.reference is None
            self.reference = [*(self.reference or []), values]
            if first:
                return Outcome.PASS, tuple(done), f"the reference: accuracy {right / total:.1%} ({right}/{total})"
            return (Outcome.PASS if all(r.outcome is Outcome.PASS for r in done) else Outcome.FAIL), tuple(done), \
                f"accuracy {right / total:.1%} ({right}/{total})"
        if self.reference is None:
            return (Outcome.CANNOT_TEST, tuple(done), "no baseline accuracy to judge against (the baseline did not "
                    "measure)")
        self.starts.setdefault(key, []).append(values)
        ref_right, ref_total = counts(self.probe, self.reference)
        right, total = counts(self.probe, self.starts[key])
        d = decide_accuracy(ref_right, ref_total, right, total, tolerance=self.probe.tolerance)
        if d.worse:  # every run of a configuration measurably less accurate than the baseline is a failing run
            return Outcome.FAIL, tuple(replace(r, outcome=Outcome.FAIL, reason=f"{r.reason}; worse than the baseline")
                                       for r in done), d.text
        return Outcome.PASS, tuple(done), d.text
