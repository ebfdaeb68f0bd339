"""The bisection run: deltas -> units -> trials (via the pure Search) -> verdict -> end state.

State is persisted after every trial (runs/RUN/): `run.json` (the question), `trials.jsonl` (the
answers so far), `journal.json` (the original state of the hosts), `verdict.json` (the end).
Because the search is a pure function of its observations, `--resume` replays the finished
trials into a fresh Search and continues exactly where the run stopped; as the operator corrected
them (state/corrections.py: `--retract N`, `envbisect replay`), fed by runs/corrections.feed.

Size (777 lines): the bisection run's orchestration (setup, the loop, refining auto-linked units, the guard, restore, resume); its collaborators (search, runner, editor) live elsewhere. Next to move out: the link refinement and the guard (runs/refine.py).
"""
from __future__ import annotations

import dataclasses

import contextlib
import json
import math
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from envbisect.state.configuration import check_applicable, touched
from envbisect.state.commitline import LineCommit, NotALine, first_parent_line, mirror
from envbisect.search.commits import CommitFound, CommitLineSearch
from envbisect.state.structured import key_secrets
from envbisect.state.deltas import Delta, Diff, linked_units, same_change
from envbisect.state.sourced import verdict_notes
from envbisect.runs.baseline_proof import (BaselineProof, baseline_trial, build_proof, not_reproduced, restart_facts,
                                          unresolved_causes)
from envbisect.runs.deployment import Deployment
from envbisect.runs.drift import drift_hints, with_drift
from envbisect.trials.diagnose import PathReport, check_path
from envbisect.errors import EnvbisectError, ExitStatus, LockLost, ProbeBroken, RemoteError, UsageError
from envbisect.hosts.journal import HostEditor, describe_conflict, find_journal, journal_dir
from envbisect.inputs.playbook import Probe
from envbisect.hosts.restart import co_restart
from envbisect.outcome import Cause, Outcome
from envbisect.search import POLICIES, Observation, Search, TrialKind, TrialRequest, Verdict, restart_bound
from envbisect.state import rundir
from envbisect.errors import StoreError
from envbisect.state.rundir import RunDir, Runs
from envbisect.state.corrections import Correction, Corrections, append_corrections, read_corrections
from envbisect.runs.corrections import check_correctable, feed, recorded_refine
from envbisect.state.store import Store, private_dir
from envbisect.runs.symptom import SymptomWatch, dependency_records, leave_pairs_whole
from envbisect.trials.probe_check import broken_line, refuse_broken_probe
from envbisect.trials.runner import Trial, TrialRunner

# an undecided perf trial is a start too few, not broken infrastructure: up to 3 more starts of it
# (pooled, search/perf.py) before the search gives up on that configuration
PERF_RETRIES = 3
REFERENCE_PURPOSE = ("perf reference: the baseline started again (the reference's own start is what leaves the "
                     "last comparison undecided; its samples join the reference)")

VERDICT_EXIT = {"culprit": ExitStatus.OK, "interaction": ExitStatus.OK, "not-config": ExitStatus.NOT_CONFIG,
                "not-reproduced": ExitStatus.NOT_REPRODUCED, "inconclusive": ExitStatus.INCONCLUSIVE}


@dataclass(frozen=True)
class BisectOptions:
    probe: str | None = None
    only: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    link: tuple[str, ...] = ()
    confidence: float = 0.95
    max_trials: int | None = None
    leave: str = "original"  # original | fixed
    auto_link: bool = True  # same key, same change in several services -> one unit
    policy: str = "confirm"  # confirm | fast | thorough (see POLICIES)
    guard: str | None = None  # a perf probe: is reverting the culprits safe for speed? (_guard_revert)


@dataclass(frozen=True)
class BisectResult:
    run_id: str
    verdict: Verdict
    trials: tuple[Trial, ...]
    state_left: str  # original | fixed | unknown
    units: Mapping[str, tuple[str, ...]]
    path_report: PathReport | None = None
    drift_hint: tuple[str, ...] = ()
    final_probe: Trial | None = None
    notes: tuple[str, ...] = ()
    refined: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # auto-linked unit -> guilty members
    guard: "GuardResult | None" = None  # --guard: what reverting the culprits costs in speed
    corrections: Corrections = Corrections()  # the operator's (state/corrections.py): retracted trials stay listed
    symptom: Mapping[str, Any] | None = None  # how the current configuration fails (runs/symptom.py)
    dependencies: tuple[Mapping[str, Any], ...] = ()  # deltas that fail differently without a partner
    baseline_proof: BaselineProof | None = None  # not-config (or inconclusive for want of it): runs/baseline_proof.py
    commit: "CommitVerdict | None" = None  # a guilty HEAD move searched commit by commit (_refine_commits)

    @property
    def culprit_deltas(self) -> tuple[str, ...]:
        return tuple(d for u in self.verdict.culprits for d in self.refined.get(u, self.units.get(u, (u,))))

    @property
    def restarts(self) -> int:
        """Co-restarts the trials cost (a probe of the running stack costs none)."""
        return sum(1 for t in self.trials if not t.free)

    @property
    def exit_status(self) -> ExitStatus:
        return VERDICT_EXIT.get(self.verdict.kind, ExitStatus.INCONCLUSIVE)

    def to_json(self) -> dict[str, Any]:
        v = self.verdict
        return {
            "run": self.run_id, "verdict": v.kind, "culprits": list(self.culprit_deltas),
            "culprit_units": list(v.culprits), "confidence": round(v.confidence, 4),
            "suspects": [{"unit": u, "p": round(p, 4)} for u, p in v.suspects], "explanation": v.explanation,
            "units": {u: list(ds) for u, ds in self.units.items()},
            "trials": [self._trial_json(t) for t in self.trials],
            "restarts": self.restarts,
            "path": self.path_report.to_json() if self.path_report else None,
            "drift_hint": list(self.drift_hint),
            "final_probe": self.final_probe.to_json() if self.final_probe else None,
            "state_left": self.state_left, "notes": list(self.notes),
            "guard": self.guard.to_json() if self.guard else None,
            "corrections": [c.to_json() for c in self.corrections.entries],
            "symptom": dict(self.symptom) if self.symptom else None,
            "dependencies": [dict(d) for d in self.dependencies],
            "baseline_proof": self.baseline_proof.to_json() if self.baseline_proof else None,
            "commit": self.commit.to_json() if self.commit else None,
        }

    def _trial_json(self, t: Trial) -> dict[str, Any]:
        doc = t.to_json()
        standing = self.corrections.state(t.n)
        if standing == "retracted":
            doc["retracted"] = True
        elif standing is not None:
            doc["corrected_outcome"] = standing
        return doc


@dataclass(frozen=True)
class CommitVerdict:
    """A guilty HEAD move searched along its first-parent line (search/commits.py). `commit` is the
    first commit observed failing whose parent on the line was observed passing; None when a trial
    was unresolved (then `passed`..`failed` is as far as the line was narrowed)."""

    delta: str  # the git delta's id
    line: tuple[LineCommit, ...]  # oldest first
    commit: LineCommit | None
    passed: str  # the last commit seen passing (the baseline commit at first)
    failed: str  # the first commit seen failing
    trials: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"delta": self.delta, "commit": self.commit.to_json() if self.commit else None,
                "last_passing": self.passed, "first_failing": self.failed, "trials": list(self.trials),
                "line": [c.to_json() for c in self.line]}

    @property
    def text(self) -> str:
        if self.commit is None:
            return (f"{self.delta}: the line of {len(self.line)} commits was narrowed to {self.passed[:12]}.."
                    f"{self.failed[:12]} (a trial was unresolved); no single commit is named")
        return (f"{self.delta}: commit {self.commit.short} is the first of {len(self.line)} commits (first-parent) "
                f"that fails (trials {', '.join(map(str, self.trials)) or 'none needed'})")


@dataclass(frozen=True)
class GuardResult:
    """`bisect --guard PERF_PROBE`: the current configuration and current-minus-the-culprits,
    each started and sampled, compared as a revert would be. `safe` is True when reverting costs
    no more than the probe's `regression`, False when it measurably does, None when it could
    not be told (then nobody should call the revert free)."""

    probe: str
    metric: str
    safe: bool | None
    text: str
    trials: tuple[int, ...]  # the guard's trial numbers (current, then current minus the culprits)

    def to_json(self) -> dict[str, Any]:
        return {"probe": self.probe, "metric": self.metric, "safe_to_revert": self.safe, "text": self.text,
                "trials": list(self.trials)}


def select_deltas(diff: Diff, only: Sequence[str], exclude: Sequence[str]) -> list[Delta]:
    ids = {d.id for d in diff.deltas}
    for ref in [*only, *exclude]:
        if ref not in ids:
            raise UsageError(f"no delta {ref!r} (see `envbisect diff`; ids look like decode:SGLANG_X)")
    chosen = [d for d in diff.deltas if (not only or d.id in only) and d.id not in exclude]
    return chosen


def make_units(deltas: Sequence[Delta], link: Iterable[str], auto_link: bool) -> tuple[dict[str, tuple[str, ...]], list[str]]:
    """Bisection units. Same variable, same new value in several services: prefill and decode must
    usually agree, so testing one side without the other would test a mismatch nobody deployed
    ("the same change": deltas.same_change, by what bash makes of the value)."""
    keys = set(link)
    notes = []
    if auto_link:
        by_key: dict[tuple[str | None, str, str | None], set[str]] = {}
        for d in deltas:
            if d.kind == "env":
                by_key.setdefault(same_change(d), set()).add(d.service or "")
        for (key, _c, _n), services in by_key.items():
            if key and len(services) > 1 and key not in keys:
                keys.add(key)
                notes.append(f"{key} changed the same way in {', '.join(sorted(services))}: tested as one linked unit")
    return linked_units(deltas, link_keys=keys), notes


@dataclass(frozen=True)
class ApartTest:
    """An auto-linked unit found guilty, to be tested member by member (each with the rest of its term)."""
    unit: str
    members: tuple[str, ...]
    rest: tuple[str, ...]

    @property
    def member_units(self) -> dict[str, tuple[str, ...]]:
        return {f"member:{m}": (m,) for m in self.members}

    def config(self, member: str) -> list[str]:
        return sorted(self.rest) + [f"member:{member}"]

    def purpose(self, member: str) -> str:
        return f"refine linked {self.unit}: does {member} break it without the other side?"


def linked_to_refine(verdict: Verdict, units: Mapping[str, tuple[str, ...]], declared) -> list[ApartTest]:  # noqa: ANN001
    """The auto-linked units of a culprit/interaction verdict (never a group the user declared)."""
    if verdict.kind not in ("culprit", "interaction"):
        return []
    out = []
    for term in verdict.terms:
        for u in term:
            members = units.get(u, ())
            if len(members) >= 2 and u.startswith("linked:") and u[len("linked:"):] not in set(declared):
                out.append(ApartTest(u, tuple(members), tuple(v for v in term if v != u)))
    return out


def judge_apart(test: ApartTest, tested: "Sequence[tuple[str, Trial]] | None", refined: dict[str, tuple[str, ...]],
                apart: list[str], notes: list[str]) -> None:
    """Keep the smallest set the observations support. One member fails and another passes: only
    the failing ones are guilty. Every member fails alone (a value both sides must agree on) or none
    does (they are needed together): the group. ``tested`` None: a member's trial was unresolved."""
    u, members = test.unit, test.members
    if not tested:
        notes.append(f"{u}: its members could not be tested apart (infrastructure); reported whole")
        return
    # a member that fails another way than the symptom (Trial.symptom "other", runs/symptom.py) is
    # no evidence that it carries the symptom: it is not blamed on that failure
    failing = [m for m, t in tested if t.outcome.failed and t.symptom != "other"]
    other = [m for m, t in tested if t.outcome.failed and t.symptom == "other"]

    def said(m: str) -> str:
        return "failed" if m in failing else "failed another way" if m in other else "passed"

    how = "; ".join(f"{m} {said(m)} in trial {t.n}" for m, t in tested)
    apart.append(f"{u} is {' + '.join(members)}: " + ", ".join(
        f"{m} {said(m)} without the other side (trial {t.n})" for m, t in tested))
    if other and not failing:
        notes.append(f"{u} was auto-linked for the search; tested apart: {how}; a member failing another way than "
                     "the symptom is no evidence about it: reported as the group")
        return
    if failing and other:  # one side shows the symptom, the rest fail another way without it: none
        # can go alone (reverting the failing side would leave the others failing their own way)
        notes.append(f"{u} was auto-linked for the search; tested apart: {how}; each side breaks it alone (a value "
                     f"that must match across services: {', '.join(other)} fails another way without the rest): "
                     "reported as the group")
        return
    if failing and len(failing) < len(members):
        refined[u] = tuple(failing)
        notes.append(f"{u} was auto-linked for the search; tested apart: {how}; only {', '.join(failing)} is to blame")
    else:
        why = ("each side breaks it alone (a value that must match across services)" if failing
               else "no side breaks it alone: they are needed together")
        notes.append(f"{u} was auto-linked for the search; tested apart: {how}; {why}: reported as the group")


class BisectRun:
    def __init__(self, dep: Deployment, opts: BisectOptions, *, on_event: Callable[[str, dict], None] | None = None,
                 break_lock: bool = False, editor_factory: type[HostEditor] = HostEditor,
                 runner_factory: Callable[..., TrialRunner] = TrialRunner,
                 search_factory: Callable[..., Search] | None = None):
        """The collaborators are injectable (a test drives the real lock, journal and records with a
        runner that answers from an oracle instead of restarting; the bench swaps the search):
        `editor_factory` is HostEditor's signature (and `resume_from`), `runner_factory` TrialRunner's,
        `search_factory(unit_ids, confidence=, max_trials=, base_probes=)` the policy's search."""
        self.dep, self.opts = dep, opts
        self.editor_factory, self.runner_factory, self.search_factory = editor_factory, runner_factory, search_factory
        self.break_lock = break_lock  # --break-lock: take a live lock of another controller (says whose)
        self._listener = on_event or (lambda _kind, _data: None)
        self.playbook = dep.playbook
        self.run_id = ""
        self.run_dir = Path()
        self.trials: list[Trial] = []
        self.corrections = Corrections()  # a resumed run's (state/corrections.py)
        self.watch: SymptomWatch | None = None  # set by _loop: how the current configuration fails
        self._restarted_from = 0  # trials before this are another session's: restarting for them is not ours

    def on_event(self, kind: str, data: dict) -> None:
        """Tell the listener, and keep a timestamped line in the run's events.jsonl: the report's timeline."""
        self._listener(kind, data)
        if self.run_dir != Path() and self.run_dir.exists():
            rec = {"ts": time.time(), "kind": kind}
            for k, v in data.items():
                rec[k] = v.to_json() if hasattr(v, "to_json") else v
            line = self.dep.masker.redact_json(json.loads(json.dumps(rec, default=str)), indent=None)
            RunDir(self.run_dir).append_line(rundir.EVENTS, line)

    @property
    def declared_links(self) -> tuple[str, ...]:
        """Variables the user declared one unit (--link, the playbook's [bisect] link): never split."""
        return tuple(dict.fromkeys([*self.opts.link, *self.playbook.link_keys]))

    # --- setup ---------------------------------------------------------------------------------
    def refuse_unrestored(self) -> None:
        """Before the diff: would the lock be refused? Then the hosts may hold another run's trial
        state (a crashed run's baseline trial looks like "no deltas"), so no diff is taken now."""
        HostEditor(self.playbook, self.dep.transports, self.dep.store.runs_dir / "-", "", heartbeat_s=0).lock(
            break_lock=self.break_lock, dry=True)

    def probe(self) -> Probe:
        probes = self.playbook.probes
        if not probes:
            raise UsageError(f"{self.playbook.path}: no [probes.NAME] defined; bisect needs a pass/fail probe")
        name = self.opts.probe or next(iter(probes))
        if name not in probes:
            raise UsageError(f"no probe {name!r} in {self.playbook.path} (known: {', '.join(probes)})")
        self.guard_probe()  # a wrong --guard is refused before anything is locked
        return probes[name]

    def guard_probe(self) -> Probe | None:
        name = self.opts.guard
        if name is None:
            return None
        g = self.playbook.probes.get(name)
        if g is None:
            raise UsageError(f"no probe {name!r} for --guard in {self.playbook.path} (known: "
                             f"{', '.join(self.playbook.probes)})")
        if not g.is_perf:
            raise UsageError(f"--guard {name}: probe {name!r} is kind {g.kind!r}; a guard measures what a revert "
                             "costs, so it must be kind = \"perf\"")
        return g

    def plan(self, diff: Diff) -> dict[str, Any]:
        deltas = select_deltas(diff, self.opts.only, self.opts.exclude)
        units, notes = make_units(deltas, self.declared_links, self.opts.auto_link)
        n = len(units)
        why_not = running_stack_unverified(diff, self.playbook, deltas)
        extra = 0 if why_not is None else 1
        return {"deltas": [d.id for d in deltas], "units": {u: list(v) for u, v in units.items()}, "notes": notes,
                "probe": self.probe().name,
                "premise_checks": ["current configuration (all deltas) must fail",
                                   "baseline configuration (no deltas) must pass"],
                "first_premise": ("probe the running stack (no restart)" if why_not is None
                                  else f"co-restart first: {why_not}"),
                "expected_restarts": {"single culprit": restart_bound(max(n, 1)) + extra,
                                      "interacting pair": restart_bound(max(n, 2), "interaction") + extra,
                                      "two independent culprits": restart_bound(max(n, 2), "several") + extra},
                "policy": self.opts.policy,
                "guard": (f"{self.opts.guard}: 2 more restarts once there is a culprit (current, and current "
                          "minus the culprits, sampled)") if self.opts.guard else None,
                "restart_order": list(self.playbook.restart.order),
                "not_applicable": [d.id for d in deltas if not d.applicable]}

    # --- persistence ---------------------------------------------------------------------------
    def _save_run(self, diff: Diff, deltas: Sequence[Delta], units: Mapping[str, tuple[str, ...]], probe: Probe) -> None:
        store = self.dep.store
        doc = {
            "format": 1, "run_id": self.run_id, "deployment": self.playbook.name, "playbook": str(self.playbook.path),
            "created_at": time.time(), "probe": probe.name,
            "options": {"only": list(self.opts.only), "exclude": list(self.opts.exclude), "link": list(self.declared_links),
                        "confidence": self.opts.confidence, "max_trials": self.opts.max_trials, "leave": self.opts.leave,
                        "auto_link": self.opts.auto_link, "policy": self.opts.policy, "guard": self.opts.guard},
            "baseline": diff.baseline.id if diff.baseline else None, "current": diff.current.id,
            "since": diff.since,
            # masked like every run record; the raw values (needed to apply and resume) in a blob
            "deltas": [d.to_json(self.dep.masker) for d in deltas],
            "deltas_blob": store.put_run_deltas([{**d.__dict__, "detail": list(d.detail)} for d in deltas]),
            "contents": {sha: store.put_blob(data) for sha, data in diff.contents.items()},
            "units": {u: list(v) for u, v in units.items()},
            "diff": diff.to_json(self.dep.masker),
        }
        perf = probe if probe.is_perf else self.guard_probe()
        if perf is not None:  # what the report's samples chart is drawn against
            doc["perf"] = {"probe": perf.name, "metric": perf.metric, "regression": perf.regression,
                           "higher_is_better": perf.higher_is_better, "guard": perf is not probe}
        # what `envbisect replay` needs to build the same search without the playbook
        doc["search"] = {"base_probes": probe.repeat, "retries": PERF_RETRIES if probe.is_perf else 1}
        RunDir(self.run_dir).write(rundir.RUN, self.dep.masker.redact_json(doc))

    def _save_symptom(self, watch: SymptomWatch) -> None:
        """run.json keeps the symptom's fingerprint once the premise has shown it."""
        rd = RunDir(self.run_dir)
        doc = dict(rd.doc)
        doc["symptom"] = watch.to_json()
        rd.write(rundir.RUN, self.dep.masker.redact_json(doc))

    def _append_trial(self, trial: Trial) -> None:
        RunDir(self.run_dir).append_line(rundir.TRIALS, self.dep.masker.redact_json(trial.to_json(), indent=None))

    # --- the run -------------------------------------------------------------------------------
    def start(self, diff: Diff) -> BisectResult:
        probe = self.probe()
        deltas = select_deltas(diff, self.opts.only, self.opts.exclude)
        check_applicable(deltas)
        refuse_broken_probe(probe, self.playbook, self.dep.transports)  # before any edit or restart
        units, notes = make_units(deltas, self.declared_links, self.opts.auto_link)
        self.run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
        self.run_dir = Runs(self.dep.store.runs_dir).new(self.run_id).path
        self._save_run(diff, deltas, units, probe)
        RunDir(self.run_dir).write(rundir.ENVIRONMENT, self.dep.masker.redact_json(
            capture_environment(self.playbook, self.dep.transports)))
        editor = self.editor_factory(self.playbook, self.dep.transports, self.run_dir, self.run_id)
        for note in editor.lock(break_lock=self.break_lock):
            self.on_event("warning", {"message": note})
        try:
            files, repos = touched(deltas)
            original = editor.begin(files, repos)  # refuses here when an owner could not be kept
            self._check_original_is_current(original, diff.current, deltas)
        except BaseException:
            editor.abandon()  # nothing was edited: the journal is closed, the lock released
            raise
        return self._loop(diff, deltas, dict(diff.contents), units, probe, editor, original, [], notes)

    def resume(self, run_id: str | None, retract: Sequence[int] = ()) -> BisectResult:
        """Continue a run from its record (as the operator corrected it). ``retract``: trials to drop
        from the evidence first (recorded in the run folder; the search then asks again what it
        decided on them). A finished run can be resumed only so."""
        store = self.dep.store
        rd = _find_run_dir(store, run_id, self.playbook.name, finished=None if retract else False)
        doc = rd.doc
        self.run_id, self.run_dir = doc["run_id"], rd.path
        run_dir = rd.path
        finished = rd.finished("bisect")
        if finished and not retract:
            raise UsageError(f"run {self.run_id} already finished (see `envbisect show {self.run_id}`)")
        # a verdict it reached before a correction: the hosts were restored (or fixed) since
        last = rd.read(rundir.VERDICT) if finished else (rd.superseded_verdicts() or [None])[-1]
        if last is not None and last.get("state_left") == "fixed":
            raise UsageError(f"run {self.run_id} left the hosts fixed (culprits reverted), not as its trials found "
                             f"them: replay the correction without the hosts (`envbisect log {self.run_id}`, "
                             "`envbisect replay FILE`), or bisect again")
        raw = store.run_deltas(doc, rd.file(rundir.RUN))
        deltas = [Delta(**{**d, "detail": tuple(d.get("detail", ()))}) for d in raw]
        self.dep.masker.learn_env((d.key, v) for d in deltas if d.kind == "env" and d.key for v in (d.old, d.new))
        self.dep.masker.learn_env(key_secrets(deltas))
        contents = {sha: store.get_blob(ref) or b"" for sha, ref in doc["contents"].items()}
        units = {u: tuple(v) for u, v in doc["units"].items()}
        o = doc["options"]
        self.opts = BisectOptions(probe=doc["probe"], only=tuple(o["only"]), exclude=tuple(o["exclude"]),
                                  link=tuple(o["link"]), confidence=o["confidence"], max_trials=o["max_trials"],
                                  leave=o["leave"], auto_link=o.get("auto_link", True),
                                  policy=o.get("policy", "confirm"), guard=o.get("guard"))
        probe = self.probe()
        try:
            done = [Trial.from_json(rec) for rec in rd.read_lines(rundir.TRIALS)]
        except (KeyError, TypeError, ValueError) as e:
            raise StoreError(f"{rd.file(rundir.TRIALS)}: damaged run file ({e})") from None
        self.corrections = read_corrections(rd)
        retracting = []
        for n in dict.fromkeys(retract):
            check_correctable(self.run_id, doc, done, n)
            if self.corrections.retracted(n):
                raise UsageError(f"trial {n} of run {self.run_id} is already retracted (see `envbisect log "
                                 f"{self.run_id}`)")
            was = next(t.outcome for t in done if t.n == n)
            retracting.append(Correction(n, "retracted", str(was), "bisect --retract", time.time()))
        journal = find_journal(self.playbook, self.dep.transports, store.runs_dir, self.run_id)
        if journal is not None:
            # the run's own journal: its edits may be live, and are (only) this run's to go on from
            editor = self.editor_factory.resume_from(self.playbook, self.dep.transports, run_dir, journal)
        else:
            editor = self.editor_factory(self.playbook, self.dep.transports, run_dir, self.run_id)
        for note in editor.lock(break_lock=self.break_lock):
            self.on_event("warning", {"message": note})
        if journal is not None:
            original = journal.original
        else:
            self._restarted_from = len(done)  # the hosts are as found: only this session's trials need a restore
            try:
                files, repos = touched(deltas)
                original = editor.begin(files, repos)
                if last is not None:  # the deltas are still what the hosts hold, or the record no longer applies
                    self._check_original_is_current(original, store.find(doc["current"]), deltas)
            except BaseException:
                editor.abandon()
                raise
        if retracting:  # recorded once the hosts are ours: a refused resume leaves the record as it was
            append_corrections(rd, retracting)
            self.corrections = Corrections(self.corrections.entries + tuple(retracting))
            kept = rd.supersede_verdict()
            self.on_event("retracted", {"run": self.run_id, "trials": [c.trial for c in retracting],
                                        "superseded": kept})
        diff_doc = doc.get("diff", {})
        self.on_event("resumed", {"run": self.run_id, "trials_done": len(done)})
        return self._loop(None, deltas, contents, units, probe, editor, original, done, [], diff_doc=diff_doc)

    def _check_original_is_current(self, original, current, deltas: Sequence[Delta]) -> None:  # noqa: ANN001
        """The hosts must still be in the state the diff saw (``current``: its snapshot); otherwise the
        deltas are stale."""
        for d in deltas:
            if d.kind == "git":
                r = original.repos.get((d.host, d.path))
                if r and r.head != d.new:
                    raise UsageError(f"{d.id}: HEAD is now {r.head[:10]}, the diff saw {str(d.new)[:10]}; re-run")
                continue
            f = original.files.get((d.host, d.path))
            cur = current.hosts[d.host].files.get(d.path)
            if f is None or cur is None:
                continue
            import hashlib

            now_sha = hashlib.sha256(f.content).hexdigest() if f.exists and f.content is not None else None
            if now_sha != (cur.sha256 if cur.exists else None):
                raise UsageError(f"{d.host}:{d.path} changed since the diff was taken; run the bisection again")

    def _perf_reference(self, probe: Probe, runner: TrialRunner, done: list[Trial], notes: list[str],
                        n_deltas: int, n_units: int) -> Trial | None:
        """A perf probe judges every configuration against the baseline's samples, so the baseline
        is measured first (in this run: a speed is never taken from memory); the search's baseline
        premise is then answered by that trial. Resumed: the reference comes from the run's record."""
        if not probe.needs_reference:
            return None
        old = next((t for t in done if not t.config and t.kind is TrialKind.PREMISE_BASELINE), None)
        if old is not None:
            if old.outcome is Outcome.PASS:
                runner.perf.reference = [tuple(r.value for r in old.probe_runs if r.value is not None)]
            return None  # the replay of the record has shown it to the search already
        purpose = (f"premise: baseline must pass (measured first: the {'accuracy' if probe.kind == 'answers' else 'perf'} "
                   "reference every configuration is judged against)")
        self.on_event("trial-start", {"n": 1, "purpose": purpose, "config": [], "eta_s": None, "units": n_units,
                                      "total_deltas": n_deltas})
        trial = runner.run(1, [], probe.samples, purpose, kind=TrialKind.PREMISE_BASELINE)
        self.trials.append(trial)
        self._append_trial(trial)
        self.on_event("trial-end", {"trial": trial})
        allowed = (f"below its accuracy less {probe.tolerance:.0%} beyond chance" if probe.kind == "answers" else
                   f"worse by more than {probe.regression:.0%}")
        notes.append(f"{probe.kind} probe {probe.name}: the baseline was measured first (trial 1); every configuration's "
                     f"{probe.metric} is compared with its samples ({allowed} = fail)")
        return trial

    def _reference_start(self, runner: TrialRunner, search, probe: Probe, n_units: int,  # noqa: ANN001
                         n_deltas: int) -> None:
        """A perf comparison left undecided by the reference's own start (trials/perf.PerfJudge):
        the baseline is started again before the search's retry; its samples join the reference."""
        if isinstance(search.next(), Verdict):
            return
        n = len(self.trials) + 1
        self.on_event("trial-start", {"n": n, "purpose": REFERENCE_PURPOSE, "config": [], "eta_s": None,
                                      "units": n_units, "total_deltas": n_deltas})
        ref = runner.run(n, [], probe.samples, REFERENCE_PURPOSE, kind=TrialKind.PREMISE_BASELINE)
        self.trials.append(ref)
        self._append_trial(ref)
        self.on_event("trial-end", {"trial": ref})
        search.observe(_observation(ref))

    def _loop(self, diff: Diff | None, deltas: list[Delta], contents: dict[str, bytes],
              units: Mapping[str, tuple[str, ...]], probe: Probe, editor: HostEditor, original,  # noqa: ANN001
              done: list[Trial], notes: list[str], diff_doc: Mapping[str, Any] | None = None) -> BisectResult:
        transports = self.dep.transports
        runner = self.runner_factory(self.playbook, transports, editor, original, deltas, contents, probe, units,
                             on_step=lambda m: self.on_event("step", {"message": m}),
                             evidence_dir=RunDir(self.run_dir).file(rundir.EVIDENCE))
        unit_ids = list(units)
        self.playbook_units = unit_ids
        if self.opts.policy not in POLICIES:
            raise UsageError(f"unknown policy {self.opts.policy!r} (one of {', '.join(POLICIES)})")
        make_search = self.search_factory or POLICIES[self.opts.policy].search
        extra = {"retries": PERF_RETRIES} if probe.is_perf else {}
        search = make_search(unit_ids, confidence=self.opts.confidence, max_trials=self.opts.max_trials,
                             base_probes=probe.repeat, **extra)
        watch = SymptomWatch(unit_ids, enabled=not probe.is_perf)
        self.watch = watch  # the refine trials are judged against the symptom too (_refine_links)
        self.trials = [watch.see(t) for t in done]
        feed(search, self.trials, self.corrections, _observation)
        reference = self._perf_reference(probe, runner, done, notes, len(deltas), len(unit_ids))
        stop = _install_signal_handlers()
        state_left = "unknown"
        verdict: Verdict | None = None
        path_report = None
        final = None
        try:
            while True:
                nxt = search.next()
                if isinstance(nxt, Verdict):
                    verdict = nxt
                    break
                if reference is not None and nxt.kind is TrialKind.PREMISE_BASELINE and not nxt.config:
                    search.observe(_observation(reference))  # measured first, recorded as trial 1
                    reference = None
                    continue
                n = len(self.trials) + 1
                self.on_event("trial-start", {"n": n, "purpose": nxt.purpose, "config": runner.delta_ids(sorted(nxt.config)),
                                              "eta_s": self._eta(nxt), "units": len(unit_ids),
                                              "expected_total": n - 1 + self._remaining(nxt),
                                              "total_deltas": len(deltas)})
                why_not = "not the first trial"
                if nxt.free and not self.trials:
                    why_not = running_stack_unverified(diff, self.playbook, deltas)
                    if why_not is not None:
                        notes.append(f"trial 1 co-restarted the stack instead of probing it as it ran: {why_not}")
                if why_not is None:
                    trial = runner.probe_running(n, sorted(nxt.config), nxt.probes,
                                                 nxt.purpose + " (the running stack, no restart)", nxt.stop_after,
                                                 nxt.kind)
                else:
                    trial = runner.run(n, sorted(nxt.config), nxt.probes, nxt.purpose, nxt.stop_after, nxt.kind)
                known = watch.fingerprint
                trial = watch.see(trial)
                if known is None and watch.fingerprint is not None:
                    self._save_symptom(watch)
                self.trials.append(trial)
                self._append_trial(trial)
                self.on_event("trial-end", {"trial": trial})
                if trial.aborted:
                    raise UsageError(f"probe asked to abort the bisection: {trial.reason}")
                if trial.cause is Cause.PROBE_BROKEN:  # no evidence: stop (and restore, below)
                    raise ProbeBroken(broken_line(probe, f"trial {trial.n}: {trial.reason}", restored=True))
                search.observe(_observation(trial))
                if trial.cause is Cause.CANNOT_TEST and getattr(runner.perf, "wants_reference", False):
                    self._reference_start(runner, search, probe, len(unit_ids), len(deltas))
                if trial.cause is Cause.SSH_LOST:
                    self.on_event("step", {"message": "the ssh connection was lost: reconnecting"})
                    self.dep.reconnect()  # ConnectionFailed here ends the run (and restores if it can)
            refined, apart = self._refine_links(verdict, units, runner, search, notes)
            if apart:  # the verdict's own explanation says which members were tested apart, and by which trial
                verdict = dataclasses.replace(verdict, explanation=verdict.explanation
                                              + " Observed, testing auto-linked members apart: " + "; ".join(apart) + ".")
            commit = self._refine_commits(verdict, units, refined, runner, search, notes)
            if commit is not None:
                verdict = dataclasses.replace(verdict, explanation=verdict.explanation + " " + commit.text + ".")
            guard = self._guard_revert(verdict, units, refined, runner, notes)
            proof = None
            evidence = [t for t in self.trials if not self.corrections.retracted(t.n)]
            if verdict.kind == "not-config":  # only with proof that the baseline trial was the baseline
                proof = build_proof(seen=_seen_ids(diff, diff_doc), deltas=deltas, original=original,
                                    contents=contents, playbook=self.playbook, probe=probe, trials=evidence,
                                    diff_notes=diff.notes if diff else (diff_doc or {}).get("notes", ()),
                                    conflicts=editor.conflicts,
                                    restart_facts=restart_facts(baseline_trial(evidence)))
                if not proof.reproduced:
                    verdict = not_reproduced(verdict, proof)
            verdict = unresolved_causes(verdict, evidence)
            if verdict.kind == "not-config":
                # "the baseline fails too" clears only what envbisect saw: a file an env file
                # sources that it could not snapshot is named (state/sourced.py)
                diff_notes = diff.notes if diff else (diff_doc or {}).get("notes", ())
                notes.extend(n for n in verdict_notes(diff_notes) if n not in notes)
                self.on_event("step", {"message": "checking the request path layer by layer"})
                path_report = check_path(self.playbook, transports, probe)
            dependencies = dependency_records(verdict, units, self.trials)
            if verdict.kind in ("culprit", "interaction") and self.opts.leave == "fixed":
                culprits = {d for u in verdict.culprits for d in refined.get(u, units[u])}
                keep = [u for u in unit_ids if not set(units[u]) & culprits]
                keep, pair_notes = leave_pairs_whole(keep, set(culprits), dependencies, units)
                notes.extend(pair_notes)
                final = runner.run(len(self.trials) + 1, keep, probe.repeat,
                                   "final: current minus the culprits must pass", kind=TrialKind.FINAL)
                self._append_trial(final)
                self.on_event("trial-end", {"trial": final})
                if final.outcome is Outcome.PASS:
                    state_left = "fixed"
                    editor.finish()
                    editor.unlock()
                else:
                    notes.append("current minus the culprits still fails, so at least one more delta breaks it: "
                                 "restored the original state; re-run with --policy thorough to find them all")
            if state_left != "fixed":
                # nothing restarted (the running stack was only probed): restoring files is all there is
                state_left = self._restore(editor, notes, restart=any(
                    not t.free for t in self.trials[self._restarted_from:]))
        except BaseException as exc:
            # Ctrl-C, SIGTERM, lost connection, someone else's change, bug: the hosts go back to where
            # they were (what is provably envbisect's own), and the lock is kept until they are.
            self.on_event("interrupted", {"error": str(exc) or type(exc).__name__, "run": self.run_id})
            try:
                with shield_signals(lambda m: self.on_event("warning", {"message": m})):
                    try:
                        self._restore(editor)
                    except LockLost:
                        raise
                    except (RemoteError, EnvbisectError):
                        self.on_event("step", {"message": "restore failed; reconnecting and trying once more"})
                        self.dep.reconnect()
                        self._restore(editor)
            except BaseException as e2:  # noqa: BLE001 - report, keep the journal (and the lock) for `restore`
                editor.stop_heartbeat()
                self.on_event("restore-failed", {"error": f"{e2}; the journal is kept: run "
                                                          f"`envbisect restore --run {self.run_id}`"})
            raise
        finally:
            stop()
        drift_hint = ()
        if verdict.kind == "not-reproduced" and not any(not t.free for t in self.trials):
            notes.append(f"the running stack passes the probe as it runs (trial 1, no restart): nothing to find "
                         f"with probe {probe.name!r}; nothing was changed or restarted")
        elif verdict.kind == "not-reproduced":
            notes.append("after a full ordered co-restart the current configuration passes; the hosts were left at "
                         "it, co-restarted - which is itself the fix for a stack restarted piecemeal")
            recorded = diff.to_json(self.dep.masker) if diff else diff_doc or {}
            drift_hint = tuple(drift_hints(recorded))
            verdict = with_drift(verdict, recorded, list(drift_hint))
        result = BisectResult(self.run_id, verdict, tuple(self.trials), state_left, units, path_report, drift_hint,
                              final, tuple(notes), refined, guard, self.corrections, watch.to_json(),
                              tuple(dependencies), proof, commit)
        RunDir(self.run_dir).write(rundir.VERDICT, self.dep.masker.redact_json(result.to_json()))
        return result

    def _refine_links(self, verdict: Verdict, units: Mapping[str, tuple[str, ...]], runner: TrialRunner,
                      search, notes: list[str]) -> tuple[dict[str, tuple[str, ...]], list[str]]:  # noqa: ANN001
        """An auto-linked unit is a search device, not a verdict: when one is guilty, test its members
        apart (see `linked_to_refine`, `judge_apart`), one trial each."""
        refined: dict[str, tuple[str, ...]] = {}
        apart: list[str] = []  # observed sentences for the verdict's explanation
        for test in linked_to_refine(verdict, units, self.declared_links):
            tested: list[tuple[str, Trial]] | None = []
            for m in test.members:
                runner.units = {**runner.units, **test.member_units}
                trial = recorded_refine(self.trials, self.corrections, runner.delta_ids(test.config(m)))
                if trial is None:
                    trial = runner.run(len(self.trials) + 1, test.config(m), search.pass_runs(), test.purpose(m),
                                       kind=TrialKind.REFINE)
                    if self.watch is not None:
                        trial = self.watch.see(trial)
                    self.trials.append(trial)
                    self._append_trial(trial)
                    self.on_event("trial-end", {"trial": trial})
                if trial.outcome is Outcome.UNRESOLVED:
                    tested = None
                    break
                tested.append((m, trial))
            judge_apart(test, tested, refined, apart, notes)
        return refined, apart

    def _refine_commits(self, verdict: Verdict, units: Mapping[str, tuple[str, ...]],
                        refined: Mapping[str, tuple[str, ...]], runner: TrialRunner, search,  # noqa: ANN001
                        notes: list[str]) -> CommitVerdict | None:
        """A HEAD move named alone is searched along its first-parent commits (search/commits.py).
        Each step is the culprit-alone configuration with the repo at commit c: every other delta at
        its baseline, one co-restart and the probe. Its premises: the baseline commit passes (the
        search's baseline trial) and the current HEAD fails alone (observed by the search or, if
        the search did not try it alone, one confirmation trial here)."""
        g = git_culprit(verdict, units, refined, runner.deltas)
        if g is None:
            return None
        self.on_event("step", {"message": f"{g.id}: reading its first-parent commits from a local mirror"})
        try:
            with mirror(self.dep.transports[g.host], g.path or "", g.new or "") as m:
                line = first_parent_line(m, g.old or "", g.new or "")
        except (NotALine, RemoteError) as e:
            notes.append(f"{g.id}: not searched commit by commit: {e}")
            return None
        pass_runs = search.pass_runs()
        used: list[int] = []

        def trial_at(c: LineCommit, purpose: str, kind: TrialKind) -> Trial:
            step = dataclasses.replace(g, id=f"{g.id}@{c.sha[:12]}", new=c.sha)
            unit = f"commit:{c.sha[:12]}"
            commit_runner = self.runner_factory(self.playbook, self.dep.transports, runner.editor, runner.original,
                                                [d for d in runner.deltas if d.id != g.id] + [step], runner.contents,
                                                runner.probe, {unit: (step.id,)}, on_step=runner.on_step,
                                                evidence_dir=runner.evidence_dir)
            n = len(self.trials) + 1
            self.on_event("trial-start", {"n": n, "purpose": purpose, "config": [step.id], "eta_s": None,
                                          "units": len(units), "total_deltas": len(runner.deltas)})
            t = commit_runner.run(n, [unit], pass_runs, purpose, kind=kind)
            self.trials.append(t)
            self._append_trial(t)
            self.on_event("trial-end", {"trial": t})
            used.append(n)
            return t

        alone = [t for t in self.trials if tuple(t.config) == (g.id,) and t.outcome.failed]
        if not alone and len(line) > 1:
            t = trial_at(line[-1], f"{g.id} alone at {line[-1].sha[:12]} (the current HEAD) must fail: the commit "
                                   "line's premise", TrialKind.CONFIRM)
            if not t.outcome.failed:
                notes.append(f"{g.id}: alone at the current HEAD it did not fail (trial {t.n}: {t.reason}); "
                             "not searched commit by commit")
                return None
        search_line = CommitLineSearch(len(line))
        while True:
            nxt = search_line.next()
            if isinstance(nxt, CommitFound):
                break
            c = line[nxt.index - 1]
            t = trial_at(c, f"commit line of {g.id}: does it fail at commit {nxt.index} of {len(line)} "
                            f"({c.sha[:12]} {c.subject!r})?", TrialKind.REFINE)
            search_line.observe(nxt.index, None if t.outcome is Outcome.UNRESOLVED else t.outcome.failed)
        passed = g.old or "" if nxt.passed == 0 else line[nxt.passed - 1].sha
        found = line[nxt.index - 1]
        return CommitVerdict(g.id, tuple(line), found if nxt.found else None, passed, found.sha, tuple(used))

    def _guard_revert(self, verdict: Verdict, units: Mapping[str, tuple[str, ...]],
                      refined: Mapping[str, tuple[str, ...]], runner: TrialRunner,
                      notes: list[str]) -> GuardResult | None:
        """--guard: before a culprit is called safe to revert, measure what reverting it costs.
        The current configuration is started and sampled (the reference: what the stack does
        now), then current minus the culprits, judged against it with the perf decision. Two
        restarts, spent only once there is a verdict to act on."""
        g = self.guard_probe()
        if g is None or verdict.kind not in ("culprit", "interaction"):
            return None
        culprits = {d for u in verdict.culprits for d in refined.get(u, units[u])}
        everything = sorted(units)
        keep = [u for u in everything if not set(units[u]) & culprits]
        guard_runner = self.runner_factory(self.playbook, self.dep.transports, runner.editor, runner.original,
                                           runner.deltas, runner.contents, g, runner.units, on_step=runner.on_step,
                                           evidence_dir=runner.evidence_dir,
                                           reference_config=runner.delta_ids(everything))
        numbers = []
        last = None
        for config, purpose in ((everything, f"guard {g.name}: the current configuration's {g.metric} "
                                             "(the reference a revert is judged against)"),
                                (keep, f"guard {g.name}: current minus the culprits ({', '.join(sorted(culprits))})")):
            n = len(self.trials) + 1
            self.on_event("trial-start", {"n": n, "purpose": purpose, "config": guard_runner.delta_ids(config),
                                          "eta_s": None, "units": len(units)})
            last = guard_runner.run(n, config, g.samples, purpose, kind=TrialKind.GUARD)
            self.trials.append(last)
            self._append_trial(last)
            self.on_event("trial-end", {"trial": last})
            numbers.append(n)
            if last.outcome is not Outcome.PASS:
                break
        assert last is not None
        who = ", ".join(sorted(culprits))
        if len(numbers) < 2:
            safe, text = None, (f"could not measure {g.metric} of the current configuration (trial {numbers[0]}: "
                                f"{last.reason}): whether reverting {who} costs speed is not known")
        elif last.outcome is Outcome.PASS:
            safe, text = True, (f"reverting {who} costs no more than the {g.regression:.0%} allowed "
                                f"(trials {numbers[0]} and {numbers[1]}): {last.reason}")
        elif last.outcome is Outcome.FAIL:
            safe, text = False, (f"reverting {who} costs {g.metric} by more than the {g.regression:.0%} allowed "
                                 f"(trials {numbers[0]} and {numbers[1]}): {last.reason}; not safe to revert "
                                 "without weighing that")
        else:
            safe, text = None, (f"what reverting {who} costs could not be decided (trials {numbers[0]} and "
                                f"{numbers[1]}): {last.reason}")
        return GuardResult(g.name, g.metric, safe, text, tuple(numbers))

    def _restore(self, editor: HostEditor, notes: list[str] | None = None, restart: bool = True) -> str:
        self.on_event("step", {"message": "restoring the original files" + (" and co-restarting" if restart else "")})
        for c in editor.restore():
            self.on_event("warning", {"message": describe_conflict(c)})
            if notes is not None:
                notes.append(describe_conflict(c))
        rs = None
        if restart:
            rs = co_restart(self.playbook, self.dep.transports,
                            on_step=lambda m: self.on_event("step", {"message": m}), guard=editor.guard,
                            keep_survivors=self._pids_before_the_run())
        editor.finish()
        editor.unlock()
        if rs is not None and not rs.ok:
            self.on_event("warning", {"message": f"restored files, but the co-restart failed: {rs.message}"})
        return "original"

    def _pids_before_the_run(self) -> frozenset[int]:
        """The services' processes as the run found them: the old pids the first restarting trial
        stopped (Trial.restart_proof). A process of a trial's configuration is never among them."""
        first = next((t for t in self.trials if not t.free and t.restart_proof), None)
        return frozenset(f.old_pid for f in (first.restart_proof if first else ()) if f.old_pid)

    def _remaining(self, req: TrialRequest) -> int:
        """Restarts still expected, this one included: an estimate for the ETA, nothing decides on it.
        A bisection over the units the search still suspects, plus the confirmations the policy asks
        for, plus the premise checks not yet done."""
        confirm = 0 if self.opts.policy == "fast" else 2
        if req.kind is TrialKind.BISECT and req.suspects_left:
            return max(1, math.ceil(math.log2(max(1, req.suspects_left)))) + confirm
        if req.kind in (TrialKind.PREMISE_CURRENT, TrialKind.PREMISE_BASELINE):
            n = len(self.playbook_units)
            premises = 1 if req.kind is TrialKind.PREMISE_BASELINE else (1 if req.free else 2)
            return premises + (math.ceil(math.log2(n)) if n > 1 else 0) + confirm
        return 1

    def _eta(self, req: TrialRequest) -> float | None:
        resolved = [t for t in self.trials if t.restart_s > 0]
        if not resolved:
            return None
        per = sum(t.restart_s + t.probe_s for t in resolved) / len(resolved)
        return per * self._remaining(req)


# A process's start time is read from /proc as boot time (whole seconds, rounded down) plus its
# start ticks, so it is never later than the real start: a file whose mtime is before it is older
# than the process. No margin is added; a clock stepped back since would only make this stricter
# for files written before the step.
_START_MARGIN_S = 0.0


def git_culprit(verdict: Verdict, units: Mapping[str, tuple[str, ...]], refined: Mapping[str, tuple[str, ...]],
                deltas: Sequence[Delta]) -> Delta | None:
    """The git delta a culprit verdict names alone, if it does."""
    if verdict.kind != "culprit" or len(verdict.culprits) != 1:
        return None
    ids = refined.get(verdict.culprits[0], units.get(verdict.culprits[0], ()))
    found = [d for d in deltas if d.id in ids]
    if len(found) != 1 or len(ids) != 1 or found[0].kind != "git":
        return None
    return found[0]


def running_stack_unverified(diff: Diff | None, playbook, deltas: Sequence[Delta]) -> str | None:  # noqa: ANN001
    """Why probing the running stack would not be a fair observation of the current configuration
    (None: it would be). Fair only when every service's process runs what its files say now:
    its environment equals what bash makes of its env file (evaluated on the host: no drift) or,
    where the environment cannot be read (sglang-router rewrites its process title over it), the
    process started after its env file was last written; every watched file that changed is
    older than the processes on its host; and no git HEAD moved (the code on disk is not provably
    the code that runs: Python imports lazily)."""
    if diff is None:
        return "a resumed run (the processes were not seen by this run's diff)"
    if diff.drift:
        d = diff.drift[0]
        return f"{d.service} runs with {d.key} different from its env file (drift)"
    hosts = diff.current.hosts
    started: dict[str, list[float]] = {}
    for name, svc in playbook.services.items():
        host = hosts.get(svc.host)
        proc = host.processes.get(name) if host else None
        if proc is None or proc.started_at is None or proc.status not in ("ok", "unknown"):
            return f"{name}: its process was not seen running"
        f = host.files.get(svc.env_file)
        if f is None or not f.exists:
            return f"{name}: its env file {svc.env_file} was not read"
        if proc.status == "ok" and proc.evaluated(f.sha256) is None:
            return f"{name}: what bash makes of {svc.env_file} was not evaluated on the host"
        if proc.status != "ok" and (f.mtime is None or f.mtime > proc.started_at - _START_MARGIN_S):
            return (f"{name}: its start environment cannot be read and {svc.env_file} is not provably older "
                    "than the process")
        started.setdefault(svc.host, []).append(proc.started_at)
    for d in deltas:
        if d.kind == "git":
            return f"{d.id}: a git HEAD moved (the running code may predate it)"
        if d.kind in ("file", "key"):
            f = hosts[d.host].files.get(d.path) if d.host in hosts else None
            first = min(started.get(d.host, [0.0]))
            if f is None or f.mtime is None or f.mtime > first - _START_MARGIN_S:
                return f"{d.path} on {d.host} may have changed after a process there started"
    return None


def capture_environment(playbook, transports) -> dict[str, Any]:  # noqa: ANN001
    """Versions for the postmortem: envbisect, and each host's kernel and Python."""
    import platform

    from envbisect import __version__

    hosts = {}
    for h, t in transports.items():
        try:
            r = t.run_python("import platform,sys;print(platform.release());print(platform.python_version());"
                             "print(platform.node())", timeout=30)
            kernel, py, node = (r.stdout.decode().splitlines() + ["?", "?", "?"])[:3]
            hosts[h] = {"kernel": kernel, "python": py, "hostname": node}
        except RemoteError as e:
            hosts[h] = {"error": str(e)}
    return {"envbisect": __version__, "controller": {"python": platform.python_version(), "kernel": platform.release(),
                                                     "hostname": platform.node()}, "hosts": hosts}


def _observation(t: Trial) -> Observation:
    if t.symptom == "other":  # failed differently from the symptom: no evidence about it (runs/symptom.py)
        return Observation(frozenset(t.units), other=True, free=t.free, trial=t.n)
    if t.outcome is Outcome.UNRESOLVED:
        return Observation(frozenset(t.units), passes=0, failed=False, unresolved=True, free=t.free, trial=t.n)
    failed = t.outcome.failed
    return Observation(frozenset(t.units), passes=t.passes, failed=failed, failures=max(t.failures, int(failed)),
                       free=t.free, trial=t.n)


def _seen_ids(diff: Diff | None, diff_doc: Mapping[str, Any] | None) -> list[str]:
    """Every delta the diff saw (the run's and those it left out); a resumed run reads its record."""
    if diff is not None:
        return [d.id for d in diff.deltas]
    return [d["id"] for d in (diff_doc or {}).get("deltas", [])]


_drift_hint = drift_hints  # the name runs/replay.py imports (the sentences live in runs/drift.py)


def _find_run_dir(store: Store, run_id: str | None, deployment: str, finished: bool | None = False) -> RunDir:
    """The run to resume: by id, or this deployment's newest bisection (``finished`` None: finished
    or not, as `--retract` corrects the newest run whatever its state)."""
    runs = Runs(store.runs_dir)
    if run_id:
        return runs.get(run_id)
    # only bisections can be resumed
    rd = runs.newest(kind="bisect", deployment=deployment, finished=finished)
    if rd is None:
        raise UsageError("no unfinished run to resume for this deployment" if finished is False
                         else "no bisection of this deployment to correct")
    return rd


def _install_signal_handlers() -> Callable[[], None]:
    """SIGTERM behaves like Ctrl-C (KeyboardInterrupt), so both restore the hosts."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_term(signum, frame):  # noqa: ANN001
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, on_term)
    return lambda: signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def shield_signals(say: Callable[[str], None]) -> Iterator[None]:
    """While the hosts are being put back: a first Ctrl-C or SIGTERM is noted, not obeyed (an
    interrupted restore leaves hosts half-restored); a second one interrupts (the journal is kept)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen = []

    def on_signal(signum, frame):  # noqa: ANN001
        seen.append(signum)
        if len(seen) > 1:
            raise KeyboardInterrupt(f"signal {signum} during restore")
        say("putting the hosts back first; signal again to abandon that (the journal is kept for `envbisect restore`)")

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def restore_deployment(dep: Deployment, *, run_id: str | None = None, break_lock: bool = False,
                       on_event: Callable[[str, dict], None] | None = None, dry_run: bool = False) -> dict[str, Any]:
    """`envbisect restore [--run ID]`: undo an interrupted or crashed run from its journal, then
    co-restart. The lock is taken first; refused while the run that owns the journal is alive.
    Resources someone else changed meanwhile are left as found and listed under "conflicts".
    `dry_run`: say what would be put back, and whether the lock could be taken; write nothing."""
    ev = on_event or (lambda _k, _d: None)
    journal = find_journal(dep.playbook, dep.transports, dep.store.runs_dir, run_id)
    if journal is None:
        why = f"run {run_id} has no active journal" if run_id else "no active journal for this deployment"
        return {"restored": False, "reason": f"{why}: nothing to undo", **({"dry_run": True} if dry_run else {})}
    if dry_run:
        HostEditor(dep.playbook, dep.transports, dep.store.runs_dir / "-", "", heartbeat_s=0).lock(
            restoring=journal.run_id, break_lock=break_lock, dry=True)
        return {"restored": False, "dry_run": True, "run": journal.run_id,
                "files": [{"host": h, "path": p, "existed": f.exists}
                          for (h, p), f in sorted(journal.original.files.items())],
                "repos": [{"host": h, "path": p, "head": r.head}
                          for (h, p), r in sorted(journal.original.repos.items())],
                "restart_order": list(dep.playbook.restart.order)}
    run_dir = journal_dir(dep.store.runs_dir, journal.run_id, dep.playbook.name)
    private_dir(run_dir)
    editor = HostEditor.resume_from(dep.playbook, dep.transports, run_dir, journal, runs_root=dep.store.runs_dir)
    for note in editor.lock(restoring=journal.run_id, break_lock=break_lock):
        ev("warning", {"message": note})
    try:
        with shield_signals(lambda m: ev("warning", {"message": m})):
            ev("step", {"message": f"restoring {len(journal.original.files)} file(s) and "
                                   f"{len(journal.original.repos)} repo(s) from run {journal.run_id}"})
            conflicts = editor.restore()
            for c in conflicts:
                ev("warning", {"message": describe_conflict(c)})
            rs = co_restart(dep.playbook, dep.transports, on_step=lambda m: ev("step", {"message": m}),
                            guard=editor.guard)
            editor.finish()
    except BaseException:
        editor.stop_heartbeat()  # the lock stays until the hosts are consistent; restore again
        raise
    editor.unlock()
    return {"restored": True, "run": journal.run_id, "files": len(journal.original.files),
            "repos": len(journal.original.repos), "co_restart_ok": rs.ok, "co_restart": rs.message or "ok",
            "conflicts": conflicts}


__all__ = ["BisectRun", "BisectOptions", "BisectResult", "POLICIES", "restore_deployment"]
