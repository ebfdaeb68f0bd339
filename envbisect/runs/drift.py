"""What a verdict says about the running state it saw (the diff's drift).

The current configuration failed as it ran, or was co-restarted first because a process did not
run its files (drift); after a full ordered co-restart from the files it passes. Then the fault was
in the running state, not in the files, and the verdict names it: which service ran with which
value, and whether that value was the baseline's (not restarted after an edit) or one no file sets,
neither today's nor the baseline's (a hand start with it, or a file edited back since). Without
drift the verdict keeps its "check the probe, or run again while the fault shows". A verdict of
any other kind names the keys a process was started by hand with, which no file sets: its trials
never had them.

Pure: reads the diff as recorded (`Diff.to_json`, masked), so a resumed run says the same.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from envbisect.outcome import VerdictKind
from envbisect.search import Verdict


def _baseline_values(diff_doc: Mapping[str, Any]) -> dict[tuple[str, str], str | None]:
    """(service, key) -> the key's value in the baseline's file, for every env delta."""
    return {(d.get("service") or "", d.get("key") or ""): d.get("old") for d in diff_doc.get("deltas", [])
            if d.get("kind") == "env"}


def _shown(value: str | None) -> str:
    """A value as a sentence prints it: an unset key is "(unset)"."""
    return "(unset)" if value is None else value


def _hint(dr: Mapping[str, Any], base: Mapping[tuple[str, str], str | None]) -> str:
    """The sentence for one drifting key."""
    svc, key, proc, file = dr["service"], dr["key"], dr["process"], dr["file"]
    who = f"{svc} (pid {dr['pid']}) was running with {key}={_shown(proc)}"
    changed = (svc, key) in base
    old = base.get((svc, key), file)
    if dr.get("where"):
        return (f"{who}, which no file sets (not in {dr['where']}, nor at the baseline, and the baseline's "
                f"{svc} process did not have it): started by hand with it exported")
    if proc is not None and proc != file and proc != old:
        said = f"today's file says {_shown(file)}" + (f", the baseline's {_shown(old)}" if changed
                                                       else ", as at the baseline")
        if file is None:
            said = "no file sets it"
        return f"{who}, which no file sets ({said}): started by hand with it, or its file was edited back since"
    if changed and proc == old:
        return f"{who}, the baseline's value, while its file says {_shown(file)}: not restarted after the edit"
    return f"{who} while its file says {_shown(file)}: it was not restarted after an edit, or restarted alone"


def drift_hints(diff_doc: Mapping[str, Any]) -> list[str]:
    """One sentence per drifting key (and per service whose start environment is unknown)."""
    base = _baseline_values(diff_doc)
    hints = [_hint(dr, base) for dr in diff_doc.get("drift", [])]
    for s in diff_doc.get("unknown_processes", []):
        hints.append(f"{s}: start environment unknown (overwritten by the program); cannot tell whether it was stale")
    if not hints:
        hints.append("no drift was recorded; the failure may have needed a co-restart, load, or time to appear")
    return hints


def hand_started_hints(diff_doc: Mapping[str, Any]) -> list[str]:
    """One sentence per key a running process had that no file sets (started by hand with it)."""
    base = _baseline_values(diff_doc)
    return [_hint(dr, base) for dr in diff_doc.get("drift", []) if dr.get("where")]


def with_drift(verdict: Verdict, diff_doc: Mapping[str, Any], hints: list[str]) -> Verdict:
    """The not-reproduced verdict naming the drift it saw (unchanged when there was none)."""
    if verdict.kind != VerdictKind.NOT_REPRODUCED or not diff_doc.get("drift"):
        return verdict
    text = verdict.explanation.replace(" (check the probe, or run again while the fault shows)", "")
    named = "; ".join(h for h in hints if "start environment unknown" not in h)
    return dataclasses.replace(verdict, explanation=(
        f"{text} The running processes did not run their files: {named}. The running state was the fault, not "
        "the files: a full ordered co-restart from the files is the fix (the hosts were left co-restarted)."))


def verdict_drift(verdict: Verdict, diff_doc: Mapping[str, Any], co_restarted: bool
                  ) -> tuple[Verdict, tuple[str, ...]]:
    """The verdict with the drift it must name, and the drift hints it carries. A not-reproduced
    verdict after a co-restart names all drift (the running state was the fault); one that never
    restarted names none. Any other verdict names the keys started by hand that no file sets: the
    trials started every service from its files, so a restart from the shell that exported them
    brings them back, whatever the verdict blames."""
    if verdict.kind == VerdictKind.NOT_REPRODUCED:
        if not co_restarted:
            return verdict, ()
        hints = drift_hints(diff_doc)
        return with_drift(verdict, diff_doc, hints), tuple(hints)
    hand = hand_started_hints(diff_doc)
    if not hand:
        return verdict, ()
    return dataclasses.replace(verdict, explanation=(
        f"{verdict.explanation} Started by hand, outside the files (every trial started from the files, without "
        f"it; a restart from the shell that exported it brings it back): {'; '.join(hand)}.")), tuple(hand)


__all__ = ["drift_hints", "hand_started_hints", "with_drift", "verdict_drift"]
