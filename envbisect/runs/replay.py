"""Correcting the record: `envbisect log` prints a bisection's trials as an editable text, and
`envbisect replay` recomputes the verdict from an edited one without touching the hosts.

The search is a pure function of its observations, so an edited log is replayed by showing a
fresh search the trials that are left, in order, with the outcomes the operator gave them
(runs/corrected_evidence.py). The search then either decides (the verdict the remaining evidence
supports) or asks for its next trial: `envbisect bisect --resume` runs it, and only what follows.

The log (one line a trial; `#` starts a comment, on its own line or after a trial)::

    run 20261204T101500-ab12cd
    deployment sim-pd
    1  fail  decode:A decode:B decode:C  # premise-current: premise: current must fail; 0/1 runs passed; ...
    2  pass  baseline                    # premise-baseline: ...

A trial line is NUMBER OUTCOME CONFIGURATION: the configuration is the units applied on top of
the baseline (`baseline` for none; a unit with spaces is quoted as in a shell). Deleting a line
drops the trial from the evidence (retracts it); changing its outcome to `pass` or `fail` says what
it really was. A configuration is what ran, so it cannot be edited, and a trial that is no
evidence of the verdict (a guard, a final probe) or a perf run's reference cannot be corrected.
The record is never rewritten: corrections are appended to the run folder (state/corrections.py).
"""
from __future__ import annotations

import dataclasses
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from envbisect.errors import ExitStatus, StoreError, UsageError
from envbisect.inputs.masking import SecretMasker, printable
from envbisect.outcome import Leave, Outcome, VerdictKind
from envbisect.runs.baseline_proof import not_reproduced, proof_from_record, unresolved_causes
from envbisect.runs.symptom import dependency_records, fault_records, incident_for, stack_state_text
from envbisect.runs.drift import verdict_drift
from envbisect.runs.plan import judge_apart, linked_to_refine, observation
from envbisect.runs.result import VERDICT_EXIT, BisectResult, GuardResult
from envbisect.runs.corrected_evidence import NOT_SEARCHED, check_correctable, feed, perf_reference, recorded_refine
from envbisect.search import Policy, TrialKind, TrialRequest, Verdict, default_budget, parse_policy
from envbisect.search.hints import Hints
from envbisect.state import rundir
from envbisect.state.corrections import (AS_RECORDED, CHANGEABLE, RETRACTED, Correction, Corrections,
                                         append_corrections, read_corrections)
from envbisect.state.rundir import RunDir, Runs
from envbisect.trials.runner import Trial

BASELINE = "baseline"  # the configuration of no units
PENDING = "pending"  # the verdict kind of a replay whose evidence does not decide yet


# ----------------------------------------------------------------------------- the record

@dataclass(frozen=True)
class RunEvidence:
    """What a bisection recorded, as the search needs it: its question and its trials."""

    run: RunDir
    doc: Mapping[str, Any]
    trials: tuple[Trial, ...]
    corrections: Corrections

    @property
    def run_id(self) -> str:
        return str(self.doc.get("run_id") or self.run.run_id)

    @property
    def deployment(self) -> str:
        return str(self.doc.get("deployment") or "")

    @property
    def units(self) -> dict[str, tuple[str, ...]]:
        return {u: tuple(v) for u, v in (self.doc.get("units") or {}).items()}


def load_evidence(rd: RunDir) -> RunEvidence:
    doc = rd.doc
    if str(doc.get("kind", "bisect")) != "bisect":
        raise UsageError(f"run {rd.run_id} is a {doc.get('kind')} run; only a bisection has trials to correct")
    try:
        trials = tuple(Trial.from_json(rec) for rec in rd.read_lines(rundir.TRIALS))
        units = doc["units"]
        if not isinstance(units, dict):
            raise TypeError("units is not an object")
    except (KeyError, TypeError, ValueError) as e:
        raise StoreError(f"{rd.path}: damaged run file ({e})") from None
    return RunEvidence(rd, doc, trials, read_corrections(rd))


def find_run(runs_root: Path, run_id: str | None, deployment: str | None = None) -> RunDir:
    """A bisection by id, or the newest one (of ``deployment`` when given)."""
    runs = Runs(runs_root)
    if run_id:
        return runs.get(run_id)
    rd = runs.newest(kind="bisect", deployment=deployment)
    if rd is None:
        raise UsageError(f"no bisection in {runs_root}" + (f" for deployment {deployment}" if deployment else "")
                         + " (see `envbisect runs`)")
    return rd


# ----------------------------------------------------------------------------- the log

def _unit_word(unit: str) -> str:
    """A unit as the log shows it: on one line, control characters made visible (a delta id holds a
    host's file name), quoted as a shell word; parse_log reads it back as this same text."""
    return printable(unit, keep_newlines=False)


def _config_text(units: Sequence[str]) -> str:
    return " ".join(shlex.quote(_unit_word(u)) for u in sorted(units)) if units else BASELINE


def _one_line(masker: SecretMasker, text: str) -> str:
    return printable(masker.redact_text(text), keep_newlines=False)


def render_log(ev: RunEvidence, masker: SecretMasker | None = None) -> str:
    """The run's trials as an editable text (see the module docstring), secrets masked. A trial
    the record already holds retracted is printed commented out (remove the `#` to count it again);
    one whose outcome was corrected shows the corrected outcome and, in its comment, what it ran with."""
    m = masker or SecretMasker()
    doc = ev.doc
    o = doc.get("options") or {}
    ref = perf_reference(doc, ev.trials)
    out = [
        f"# envbisect log of run {ev.run_id} (deployment {ev.deployment}, probe {doc.get('probe')}, "
        f"policy {o.get('policy', 'confirm')}, confidence {o.get('confidence', 0.95)})",
        "# One line a trial: NUMBER OUTCOME CONFIGURATION  # what it was for; what the probe said",
        "# To correct the record: delete the line of a contaminated trial (it is retracted), or change its",
        "# outcome to pass or fail. Lines starting with # are comments. Then: envbisect replay FILE",
        "# (nothing on the hosts changes; `envbisect bisect --resume` then runs the trials still needed).",
    ]
    grouped = {u: ds for u, ds in ev.units.items() if ds != (u,)}
    if grouped:
        out.append("# units of several deltas:")
        out += [f"#   {_unit_word(u)} = {' '.join(_unit_word(d) for d in ds)}" for u, ds in sorted(grouped.items())]
    out += [f"run {ev.run_id}", f"deployment {ev.deployment}"]
    width = max((len(_config_text(t.units)) for t in ev.trials), default=8)
    for t in ev.trials:
        standing = ev.corrections.state(t.n)
        outcome = standing if standing not in (None, RETRACTED) else str(t.outcome)
        runs = "" if "probe runs" in t.reason else f"; {t.passes}/{len(t.probe_runs)} probe runs passed"
        comment = f"{t.purpose}; {t.reason}{runs}" + ("; the running stack, no restart" if t.free else "")
        if standing not in (None, RETRACTED):
            comment = f"corrected (ran: {t.outcome}); " + comment
        if t.n == ref:
            comment = "the perf reference (cannot be corrected); " + comment
        line = f"{t.n:>3}  {outcome:<13}  {_config_text(t.units):<{width}}  # {_one_line(m, comment)}"
        if t.kind in (TrialKind.GUARD, TrialKind.FINAL):
            line = f"# {line}  (not evidence of the verdict)"
        elif standing == RETRACTED:
            line = f"# {line}  (retracted)"
        out.append(line)
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class LogLine:
    """One trial line of an edited log."""

    trial: int
    outcome: Outcome
    units: tuple[str, ...]
    line: int  # where it is in the file, for error messages


@dataclass(frozen=True)
class EditedLog:
    source: str
    run_id: str
    deployment: str
    lines: tuple[LogLine, ...]


def parse_log(text: str, source: str = "-") -> EditedLog:
    """Read an (edited) log. A malformed line is one UsageError naming FILE:LINE."""
    run_id = deployment = None
    lines: list[LogLine] = []
    seen: dict[int, int] = {}
    for i, raw in enumerate(text.splitlines(), 1):
        where = f"{source}:{i}"
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        try:
            words = shlex.split(raw, comments=True)
        except ValueError as e:
            raise UsageError(f"{where}: cannot read this line ({e})") from None
        if not words:
            continue
        head = words[0]
        if head in ("run", "deployment"):
            if len(words) != 2:
                raise UsageError(f"{where}: expected `{head} NAME`")
            if (run_id if head == "run" else deployment) is not None:
                raise UsageError(f"{where}: a second `{head}` line")
            if head == "run":
                run_id = words[1]
            else:
                deployment = words[1]
            continue
        if not head.isdigit():
            raise UsageError(f"{where}: expected a trial line (NUMBER OUTCOME CONFIGURATION), `run ID` or "
                             f"`deployment NAME`; got {printable(head, keep_newlines=False)!r}")
        if run_id is None or deployment is None:
            raise UsageError(f"{where}: a trial line before the `run ID` and `deployment NAME` lines")
        n = int(head)
        if len(words) < 3:
            raise UsageError(f"{where}: trial {n}: expected NUMBER OUTCOME CONFIGURATION (`baseline` for no units)")
        try:
            outcome = Outcome(words[1])
        except ValueError:
            raise UsageError(f"{where}: trial {n}: unknown outcome {printable(words[1], keep_newlines=False)!r} "
                             "(pass or fail)") from None
        if n in seen:
            raise UsageError(f"{where}: trial {n} appears twice (first on line {seen[n]})")
        seen[n] = i
        units = () if words[2:] == [BASELINE] else tuple(words[2:])
        lines.append(LogLine(n, outcome, units, i))
    if run_id is None or deployment is None:
        raise UsageError(f"{source}: not an envbisect log (no `run ID` and `deployment NAME` lines; "
                         "see `envbisect log`)")
    return EditedLog(source, run_id, deployment, tuple(lines))


# ----------------------------------------------------------------------------- replay

@dataclass(frozen=True)
class NeededTrial:
    """A trial the corrected evidence still needs: the search's next request (or a member of an
    auto-linked culprit to test apart)."""

    kind: TrialKind
    units: tuple[str, ...]
    deltas: tuple[str, ...]
    purpose: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "units": list(self.units), "deltas": list(self.deltas),
                "purpose": self.purpose}


@dataclass(frozen=True)
class Replay:
    """The verdict an edited log supports. ``result`` is shaped as `bisect --json` (its verdict kind
    is "pending" while the evidence does not decide); ``needs`` the trials still needed (empty when
    decided); ``changes`` the corrections the edit makes to the record; ``unused`` trials the
    corrected search decided without."""

    source: str
    result: BisectResult
    needs: tuple[NeededTrial, ...]
    changes: tuple[Correction, ...]
    unused: tuple[int, ...]
    recorded: bool = False
    superseded: str | None = None  # the name the verdict it replaced was kept under

    @property
    def run_id(self) -> str:
        return self.result.run_id

    @property
    def decided(self) -> bool:
        return not self.needs

    @property
    def exit_status(self) -> ExitStatus:
        return self.result.exit_status if self.decided else ExitStatus.INCONCLUSIVE

    def to_json(self) -> dict[str, Any]:
        return {**self.result.to_json(),
                "replay": {"source": self.source, "decided": self.decided,
                           "changes": [c.to_json() for c in self.changes],
                           "needs": [n.to_json() for n in self.needs], "unused": list(self.unused),
                           "recorded": self.recorded, "superseded": self.superseded}}


def _changes(ev: RunEvidence, edited: EditedLog, by: str, now: float) -> tuple[Correction, ...]:
    """The corrections that make the record's standing what the edited log says."""
    src = edited.source
    if edited.run_id != ev.run_id:
        raise UsageError(f"{src}: the log is of run {edited.run_id}, not {ev.run_id}")
    if edited.deployment != ev.deployment:
        raise UsageError(f"{src}: run {ev.run_id} is of deployment {ev.deployment}, the log says {edited.deployment}")
    given: dict[int, LogLine] = {}
    for ln in edited.lines:
        where = f"{src}:{ln.line}"
        try:
            t = check_correctable(ev.run_id, ev.doc, ev.trials, ln.trial, "correct")
        except UsageError as e:
            raise UsageError(f"{where}: {e}") from None
        if set(ln.units) != {_unit_word(u) for u in t.units}:
            raise UsageError(f"{where}: trial {t.n} ran {_config_text(t.units)}, the log says "
                             f"{_config_text(ln.units)}; "
                             "a configuration is what ran and cannot be edited (delete the line to drop the trial)")
        if ln.outcome != t.outcome and ln.outcome not in CHANGEABLE:
            raise UsageError(f"{where}: trial {t.n} ran {t.outcome}; an outcome can only be corrected to pass or fail")
        given[t.n] = ln
    ref = perf_reference(ev.doc, ev.trials)
    out = []
    for t in ev.trials:
        if t.kind in (TrialKind.GUARD, TrialKind.FINAL):
            continue
        ln = given.get(t.n)
        want = RETRACTED if ln is None else (None if ln.outcome == t.outcome else ln.outcome.value)
        if t.n == ref and want is not None:
            raise UsageError(f"{src}: trial {t.n} is the perf reference every later trial was judged against; it "
                             "cannot be dropped or changed (start a new bisection instead)")
        if want != ev.corrections.state(t.n):
            out.append(Correction(t.n, want or AS_RECORDED, str(t.outcome), by, now))
    return tuple(out)


def _search_settings(ev: RunEvidence, base_probes: int | None) -> dict[str, Any]:
    s = ev.doc.get("search") or {}
    probes = s.get("base_probes", base_probes)
    if not isinstance(probes, int) or probes < 1:
        raise UsageError(f"run {ev.run_id} does not record its probe's `repeat`; replay it with its playbook (-p)")
    o = ev.doc.get("options") or {}
    text = str(o.get("policy", Policy.CONFIRM.value))
    try:
        policy = parse_policy(text)
    except ValueError:
        raise StoreError(f"{ev.run.file(rundir.RUN)}: damaged run file (unknown policy {text!r})") from None
    return {"policy": policy, "confidence": float(o.get("confidence", 0.95)), "max_trials": o.get("max_trials"),
            "base_probes": probes, "retries": int(s.get("retries", 1)), "link": tuple(o.get("link") or ())}


def replay_evidence(ev: RunEvidence, corrections: Corrections, *, base_probes: int | None = None,
                    source: str = "-", changes: tuple[Correction, ...] = ()) -> Replay:
    """The verdict the record supports as ``corrections`` leave it, or the trials it still needs.
    Pure: reads nothing, touches no host."""
    cfg = _search_settings(ev, base_probes)
    units = ev.units
    hints = Hints.from_json((ev.doc.get("search") or {}).get("hints"))  # the run's twins and suspicion
    settings = dict(confidence=cfg["confidence"], base_probes=cfg["base_probes"], retries=cfg["retries"])
    search = incident_for(list(units), cfg["policy"].search, cfg["max_trials"] or default_budget(len(units)),
                          options={**settings, **hints.search_options()})
    try:
        unused = feed(search, ev.trials, corrections, observation)
    except ValueError as e:  # a unit the run does not know, a pass without a passed run
        raise StoreError(f"{ev.run.file(rundir.TRIALS)}: damaged run file ({e})") from None
    nxt = search.next()
    needs: list[NeededTrial] = []
    notes: list[str] = []
    refined: dict[str, tuple[str, ...]] = {}
    delta_ids = lambda us, table={**units, **hints.member_units()}: tuple(  # noqa: E731
        sorted(d for u in us for d in table[u]))
    if isinstance(nxt, TrialRequest):
        sus = tuple(sorted(search.marginals().items(), key=lambda kv: -kv[1]))
        verdict = Verdict(PENDING, (), 0.0, sus, f"The corrected evidence does not decide yet: it needs trial "
                                                  f"{len(ev.trials) + 1}, {nxt.purpose}.")
        needs.append(NeededTrial(nxt.kind, tuple(sorted(nxt.config)), delta_ids(nxt.config), nxt.purpose))
    else:
        verdict, split, split_notes = hints.conclude(nxt, search.evidence)
        refined.update(split)
        notes.extend(split_notes)
        apart: list[str] = []
        for test in linked_to_refine(verdict, {u: m for u, m in units.items() if u not in split}, cfg["link"]):
            table = {**units, **test.member_units}
            tested: list[tuple[str, Trial]] | None = []
            missing = []
            for m in test.keys:
                config = delta_ids(test.config(m), table)
                t = recorded_refine(ev.trials, corrections, config)
                if t is None:
                    missing.append(NeededTrial(TrialKind.REFINE, tuple(test.config(m)), config, test.purpose(m)))
                elif t.outcome is Outcome.UNRESOLVED:
                    tested = None
                elif tested is not None:
                    tested.append((m, t))
            if missing:
                needs += missing
            else:
                judge_apart(test, tested, refined, apart, notes)
        if apart:
            verdict = dataclasses.replace(verdict, explanation=verdict.explanation
                                          + " Observed, testing auto-linked members apart: " + "; ".join(apart) + ".")
    old = ev.run.read_optional(rundir.VERDICT) or {}
    state_left = str(old.get("state_left", Leave.UNKNOWN.value))
    notes.insert(0, "recomputed from the corrected record without touching the hosts"
                 + (f" ({'; '.join(c.describe() for c in changes)})" if changes else ""))
    if unused:
        notes.append(f"not needed by the corrected search (it decided before them): trials "
                     f"{', '.join(map(str, unused))}")
    guard = None
    if verdict.kind in (VerdictKind.CULPRIT, VerdictKind.INTERACTION) and old.get("guard"):
        g = old["guard"]
        if sorted(old.get("culprit_units") or ()) == sorted(verdict.culprits) and not refined:
            guard = GuardResult(str(g.get("probe")), str(g.get("metric")), g.get("safe_to_revert"), str(g.get("text")),
                                tuple(g.get("trials") or ()))
        else:
            notes.append("--guard: what reverting these culprits costs in speed was not measured (it needs the hosts)")
    proof = None
    evidence = [t for t in ev.trials if not corrections.retracted(t.n)]
    if verdict.kind == VerdictKind.NOT_CONFIG:  # gated as the live run's: the record must prove the baseline trial
        proof = proof_from_record(ev.doc, evidence, old.get("baseline_proof"))
        if not proof.reproduced:
            verdict = not_reproduced(verdict, proof)
    verdict = unresolved_causes(verdict, evidence)
    if verdict.kind == VerdictKind.NOT_CONFIG:
        notes.append("the layered check of the request path was not repeated (it needs the hosts)")
    verdict, drift = verdict_drift(verdict, ev.doc.get("diff") or {}, any(not t.free for t in ev.trials))
    final = next((t for t in reversed(ev.trials) if t.kind is TrialKind.FINAL), None)
    result = BisectResult(ev.run_id, verdict, ev.trials, state_left, units, None, drift, final, tuple(notes),
                          refined, guard, corrections, ev.doc.get("symptom"),
                          tuple(dependency_records(verdict, units, ev.trials)), proof,
                          faults=tuple(fault_records(verdict, units, refined)), stack_state=stack_state_text(verdict))
    return Replay(source, result, tuple(needs), changes, unused)


def replay_log(ev: RunEvidence, edited: EditedLog, *, base_probes: int | None = None,
               by: str | None = None) -> Replay:
    """`envbisect replay`: the verdict an edited log supports (nothing recorded; see `record_replay`)."""
    changes = _changes(ev, edited, by or f"replay {edited.source}", time.time())
    corrections = Corrections(ev.corrections.entries + changes)
    return replay_evidence(ev, corrections, base_probes=base_probes, source=edited.source, changes=changes)


def record_replay(ev: RunEvidence, rp: Replay, masker: SecretMasker | None = None) -> Replay:
    """Keep a replay's corrections in the run folder: appended to corrections.jsonl, the verdict they
    supersede kept as verdict.superseded-K.json, and the new verdict written when the evidence
    decides (otherwise the run is unfinished again: `bisect --resume` runs what it needs)."""
    if not rp.changes:
        return rp
    append_corrections(ev.run, rp.changes)
    kept = ev.run.supersede_verdict()
    if rp.decided:
        ev.run.write(rundir.VERDICT, (masker or SecretMasker()).redact_json(rp.result.to_json()))
    return dataclasses.replace(rp, recorded=True, superseded=kept)


__all__ = ["EditedLog", "LogLine", "NeededTrial", "Replay", "RunEvidence", "find_run", "load_evidence", "parse_log",
           "record_replay", "render_log", "replay_evidence", "replay_log", "NOT_SEARCHED", "VERDICT_EXIT"]
