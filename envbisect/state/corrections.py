"""Corrections to a bisection's record: trials the operator retracted, outcomes the operator changed.

A trial can be contaminated (someone restarted the stack by hand during a probe, a node rebooted).
The operator corrects the record with `envbisect replay` (an edited `envbisect log`) or
`envbisect bisect --resume --retract N`. History is never rewritten: `trials.jsonl` keeps every
trial as it ran, and `corrections.jsonl` appends what the operator changed, when and by which
command. The state of a trial is its latest correction (or as recorded when it has none), so a
correction is undone by another one that puts the trial back (`now` = "as-recorded"); a verdict a
correction superseded is kept beside the new one (`RunDir.supersede_verdict`).

Pure data and the run folder's file: what the corrected evidence makes of a trial for the search
is runs/corrected_evidence.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from envbisect.errors import StoreError
from envbisect.outcome import Outcome
from envbisect.state import rundir
from envbisect.state.rundir import RunDir

RETRACTED = "retracted"
AS_RECORDED = "as-recorded"  # a correction undone: the trial counts as it ran
CHANGEABLE = (Outcome.PASS, Outcome.FAIL)  # what an operator may say a trial's outcome really was


@dataclass(frozen=True)
class Correction:
    """One change of one trial's standing in the evidence. ``now``: "retracted", "as-recorded" or
    the outcome the operator says the trial had (pass or fail); ``was``: the outcome recorded."""

    trial: int
    now: str
    was: str
    by: str  # the command that made it: "replay FILE", "bisect --retract"
    at: float

    def to_json(self) -> dict[str, Any]:
        return {"trial": self.trial, "now": self.now, "was": self.was, "by": self.by, "at": self.at}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Correction":
        now = str(d["now"])
        if now not in (RETRACTED, AS_RECORDED, *(o.value for o in CHANGEABLE)):
            raise ValueError(f"unknown correction {now!r}")
        return cls(int(d["trial"]), now, str(d["was"]), str(d.get("by", "")), float(d.get("at", 0.0)))

    def describe(self) -> str:
        if self.now == RETRACTED:
            return f"trial {self.trial} ({self.was}) retracted"
        if self.now == AS_RECORDED:
            return f"trial {self.trial} counts again as recorded ({self.was})"
        return f"trial {self.trial}: outcome {self.was} corrected to {self.now}"


@dataclass(frozen=True)
class Corrections:
    """Every correction of a run, oldest first."""

    entries: tuple[Correction, ...] = ()

    def state(self, n: int) -> str | None:
        """The standing of trial ``n``: "retracted", an outcome the operator gave, or None (as recorded)."""
        now = None
        for c in self.entries:
            if c.trial == n:
                now = None if c.now == AS_RECORDED else c.now
        return now

    def retracted(self, n: int) -> bool:
        return self.state(n) == RETRACTED

    def outcome(self, n: int) -> Outcome | None:
        """The outcome the operator gave trial ``n`` (None: as recorded, or retracted)."""
        s = self.state(n)
        return None if s in (None, RETRACTED) else Outcome(s)

    def current(self) -> dict[int, str]:
        """Trial number -> its standing, for every trial whose standing is not as recorded."""
        out = {}
        for n in dict.fromkeys(c.trial for c in self.entries):
            s = self.state(n)
            if s is not None:
                out[n] = s
        return out

    def __bool__(self) -> bool:
        return bool(self.entries)


def read_corrections(rd: RunDir) -> Corrections:
    """The run's corrections (none when it has no corrections.jsonl); a damaged line is one StoreError."""
    out = []
    for i, rec in enumerate(rd.read_lines(rundir.CORRECTIONS), 1):
        try:
            out.append(Correction.from_json(rec))
        except (KeyError, TypeError, ValueError) as e:
            raise StoreError(f"{rd.file(rundir.CORRECTIONS)}: damaged run file (correction {i}: {e})") from None
    return Corrections(tuple(out))


def append_corrections(rd: RunDir, entries: Iterable[Correction]) -> None:
    import json

    for c in entries:
        rd.append_line(rundir.CORRECTIONS, json.dumps(c.to_json()))
