"""The symptom's fingerprint, and whether a failing trial shows it or fails another way.

The current configuration starts and fails in one particular way: the symptom. A trial of a
subset of the deltas that fails *differently* (a service that does not start when the symptom is
a hang, another HTTP status, a hang where the symptom is a reset) is another fault, usually a
delta that needs a partner; counted as the symptom it can name the innocent half of such a pair.

A fingerprint says how a trial failed:

- ``start-failure`` of which service (the co-restart stopped there), with its last words;
- ``hang`` (no answer within the probe's timeout), ``reset`` (the connection broke), ``refused``
  (no connection), ``error`` (another transport error);
- ``status``: the HTTP status and the first line of the error body; ``body`` (the answer did not
  match ``expect_body``); ``latency`` (over the probe's budget);
- ``exit``: a command probe's exit status, or its ``hang``.

The layer, where along the probe it failed ("request", "round 3 of 6 on one reused connection"),
and the first body line (with what legitimately varies, numbers, ids and timings, masked by
`masked`) are kept for people. Two fingerprints are the same symptom when their kind matches and,
for a start failure, the service and what the start said last (its start command's stderr line, its
log's last line, masked: one service dies at start from a guilty key and from an innocent pair, and
only its last words tell them apart); for a status, the status; for a command, the exit status. The
first line is not judged on: behind one status, two independent culprits give different lines
(which engine answers first decides), and calling the second culprit "another failure" would
exonerate it. A trial shows the symptom when one of its failed probe runs does. Pure: it reads
trials, never a host.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from envbisect.outcome import Outcome
from envbisect.trials.probe_request import ProbeRun, RequestRecord
from envbisect.trials.runner import Trial

_START = re.compile(r"^(\S+?):? (?:died while starting|not healthy after|start command failed)")
# a start command's stderr line in its trial's reason, before what trials/start_evidence.py adds
_STDERR = re.compile(r"^\S+: start command failed: (.*?)(?: \((?:a start failure of this configuration|the same "
                     r"command started|the first start of|trial \d+, the same configuration)\b.*)?$", re.S)
# what varies between two runs of one fault: scratch paths, uuids and hex ids, numbers (timings,
# ports, pids, counts)
_VARIES = (re.compile(r"(?<![\w.])/(?:var/)?tmp/\S*"),
           re.compile(r"\b0x[0-9a-f]+\b", re.I),
           re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I),
           re.compile(r"\b(?=[0-9a-f]*\d)[0-9a-f]{6,}\b", re.I),
           re.compile(r"\d+(?:\.\d+)?"))


def masked(line: str) -> str:
    """A line with what legitimately varies between runs of one fault masked, for comparison."""
    out = line.strip().lower()
    for rx in _VARIES:
        out = rx.sub("#", out)
    return re.sub(r"\s+", " ", out)


@dataclass(frozen=True)
class Fingerprint:
    kind: str  # start-failure | hang | reset | refused | error | status | body | latency | exit | unknown
    service: str | None = None  # start-failure: the service that did not start
    status: int | None = None  # HTTP status, or a command's exit status
    first_line: str = ""  # the error body's first line (status), as seen
    layer: str = ""  # where along the trial: "start of decode", "request", "round 3 of 6 on ..."
    at: int | None = None  # a multi-round probe: the request (round) that failed, 1 = the first

    def same(self, other: "Fingerprint") -> bool:
        """The same fault, with tolerance for what varies between its runs (timings, ids, rounds).
        A failure nothing describes ("unknown") is taken at its word, as before: it matches."""
        if "unknown" in (self.kind, other.kind):
            return True
        if self.kind != other.kind:
            return False
        if self.kind == "start-failure":
            # one service dies at start from two faults (a guilty key, an innocent pair): its last
            # words tell them apart; a start that left no line (or an older record) compares by service
            return self.service == other.service and (not self.first_line or not other.first_line
                                                      or self.same_line(other))
        if self.kind in ("status", "exit"):
            return self.status == other.status
        return True

    def same_line(self, other: "Fingerprint") -> bool:
        """The same first body line once what varies is masked (said in the record, not judged on:
        with two culprits behind one status, which engine answers first decides the line)."""
        return masked(self.first_line) == masked(other.first_line)

    def describe(self) -> str:
        if self.kind == "start-failure":
            return f"{self.service} does not start" + (f": {self.first_line[:80]!r}" if self.first_line else "")
        what = {"hang": "hang, no answer", "reset": "connection reset", "refused": "connection refused",
                "error": "transport error", "body": "answer does not match", "latency": "over the latency budget",
                "exit": f"exit status {self.status}", "unknown": "a failure nothing describes"}.get(self.kind)
        if self.kind == "status":
            what = f"HTTP {self.status}" + (f" {self.first_line[:80]!r}" if self.first_line else "")
        return f"{what} ({self.layer})" if self.layer else str(what)

    def to_json(self) -> dict:
        return {"kind": self.kind, "service": self.service, "status": self.status, "first_line": self.first_line,
                "layer": self.layer, "at": self.at, "text": self.describe()}

    @classmethod
    def from_json(cls, d: Mapping) -> "Fingerprint":
        return cls(d["kind"], d.get("service"), d.get("status"), d.get("first_line", ""), d.get("layer", ""),
                   d.get("at"))


def _layer(run: ProbeRun, n: int) -> str:
    if run.kind == "multi_round":
        return "first request" if n <= 1 else f"round {n} on one reused connection"
    if run.kind == "concurrent":
        return "concurrent requests"
    return "command" if run.kind == "command" else "request"


def of_run(run: ProbeRun) -> Fingerprint | None:
    """How one failed probe run failed (None: it did not fail)."""
    if run.outcome != Outcome.FAIL:
        return None
    bad = [r for r in run.requests if not r.ok]
    if not bad:
        return Fingerprint("unknown", layer=run.kind)  # nothing says how: it cannot be told apart
    r = bad[0]
    fp = _of_request(run, r)
    return replace(fp, at=r.n) if run.kind == "multi_round" else fp


def _of_request(run: ProbeRun, r: RequestRecord) -> Fingerprint:
    layer = _layer(run, r.n)
    err = r.error or ""
    if run.kind == "command":
        if "(hang)" in err:
            return Fingerprint("hang", layer=layer)
        return Fingerprint("exit", status=r.status, layer=layer)
    if r.status is None:
        if "(hang)" in err or "Timeout" in err:
            return Fingerprint("hang", layer=layer)
        if err.startswith("ConnectError"):
            return Fingerprint("refused", layer=layer)
        if any(w in err for w in ("ReadError", "RemoteProtocolError", "reset", "WriteError", "closed")):
            return Fingerprint("reset", layer=layer)
        return Fingerprint("error", layer=layer)
    if err.startswith("HTTP "):
        return Fingerprint("status", status=r.status, first_line=(r.excerpt or "").strip()[:160], layer=layer)
    if err.startswith("body does not match"):
        return Fingerprint("body", status=r.status, layer=layer)
    if "budget" in err:
        return Fingerprint("latency", status=r.status, layer=layer)
    return Fingerprint("error", status=r.status, layer=layer)


def of_trial(trial: Trial) -> Fingerprint | None:
    """How a failed trial failed: its start failure, or its first failed probe run (None: it did
    not fail, or nothing says how)."""
    if trial.outcome is Outcome.START_FAILURE:
        m = _START.match(trial.reason or "")
        service = m.group(1) if m else None
        return Fingerprint("start-failure", service=service, first_line=_last_words(trial),
                           layer=f"start of {service or 'a service'}")
    if trial.outcome is not Outcome.FAIL:
        return None
    for run in trial.probe_runs:
        fp = of_run(run)
        if fp is not None:
            return fp
    return None


def _last_words(trial: Trial) -> str:
    """What a failed start said last: its start command's stderr line (a command that reports the
    failure itself) and its log's last line, as seen."""
    words = []
    m = _STDERR.match(trial.reason or "")
    if m and m.group(1).strip():
        words.append(m.group(1).strip())
    tail = [ln.strip() for ln in (trial.log_tail or "").splitlines() if ln.strip()]
    if tail:
        words.append(tail[-1])
    return " | ".join(words)[:240]


def shows(symptom: Fingerprint, trial: Trial) -> bool | None:
    """True: the trial failed with the symptom (one of its failed runs, or its start failure, is
    it); False: it failed another way; None: it did not fail."""
    if not trial.outcome.failed:
        return None
    if trial.outcome is Outcome.START_FAILURE:
        fp = of_trial(trial)
        return fp is not None and symptom.same(fp)
    seen = [fp for fp in (of_run(r) for r in trial.probe_runs) if fp is not None]
    if not seen:
        return True  # a failure nothing describes is taken at its word, as before
    return any(symptom.same(fp) for fp in seen)


def beyond(symptom: Fingerprint, runs: Sequence[ProbeRun]) -> Fingerprint | None:
    """How a trial's probe runs failed when every failed run got further along a multi-round probe
    than the symptom ever does (same fingerprint in each, at a later round), so the symptom's round
    passed in each: a failure of its own, not the symptom (None otherwise). The symptom's round is
    the earliest its premise showed; a failure later along the connection says nothing about the
    rounds after it, which the symptom's own runs never needed to reach."""
    if symptom.at is None:
        return None
    seen = [fp for fp in (of_run(r) for r in runs) if fp is not None]
    if not seen or any(fp.at is None or fp.at <= symptom.at for fp in seen):
        return None
    first = seen[0]
    return first if all(first.same(fp) and fp.at == first.at for fp in seen) else None


def as_background(background: Fingerprint, run: ProbeRun) -> bool:
    """A failed run that fails exactly as the baseline does (same fingerprint, same round)."""
    fp = of_run(run)
    return fp is not None and fp.kind != "unknown" and background.same(fp) and fp.at == background.at


__all__ = ["Fingerprint", "of_run", "of_trial", "shows", "masked", "beyond", "as_background"]
