"""The bisection run: deltas -> units -> trials (via the pure Search) -> verdict -> end state.

State is persisted after every trial (runs/RUN/): `run.json` (the question), `trials.jsonl` (the
answers so far), `journal.json` (the original state of the hosts), `verdict.json` (the end).
Because the search is a pure function of its observations, `--resume` replays the finished
trials into a fresh Search and continues exactly where the run stopped; as the operator corrected
them (state/corrections.py: `--retract N`, `envbisect replay`), fed by runs/corrected_evidence.feed.

This module runs trials, records them and puts the hosts back; what the trials are and what they
mean is runs/plan.py's (units, refinement, the running-stack check, the guard's verdict), and the
result's shape is runs/result.py's.
"""
from __future__ import annotations

import dataclasses
import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from envbisect.errors import EnvbisectError, LockLost, ProbeBroken, RemoteError, StoreError, UsageError
from envbisect.hosts.journal import HostEditor, describe_conflict, find_journal
from envbisect.hosts.restart import co_restart, service_states
from envbisect.inputs.playbook import Probe
from envbisect.outcome import Cause, Leave, Outcome, VerdictKind
from envbisect.runs.baseline_proof import (BaselineProof, baseline_trial, build_proof, not_reproduced, restart_facts,
                                          unresolved_causes)
from envbisect.runs.commit_line import read_lines, search_line, undo_on_host
from envbisect.runs.corrected_evidence import check_correctable, feed, recorded_refine
from envbisect.runs.deployment import Deployment, capture_environment
from envbisect.runs.drift import verdict_drift
from envbisect.runs.plan import (ApartTest, BisectOptions, check_original_is_current, culprit_deltas, dry_run_plan,
                                 git_culprit, guard_configs, guard_verdict, judge_apart, linked_to_refine, make_units,
                                 observation, parse_policy, remaining_restarts, running_stack_unverified, seen_ids,
                                 select_deltas)
from envbisect.runs.result import VERDICT_EXIT, BisectResult, CommitVerdict, GuardResult
from envbisect.runs.restore import restore_deployment
from envbisect.runs.signals import install_signal_handlers, shield_signals
from envbisect.runs.symptom import (SymptomWatch, dependency_records, fault_records, incident_for, leave_pairs_whole,
                                    stack_state_text)
from envbisect.search import POLICIES, Search, TrialKind, TrialRequest, Verdict, default_budget
from envbisect.search.hints import Hints, twins_of
from envbisect.state import rundir
from envbisect.state.commitline import LineCommit, NotALine
from envbisect.state.configuration import check_applicable, touched
from envbisect.state.corrections import Correction, Corrections, append_corrections, read_corrections
from envbisect.state.deltas import Delta, Diff
from envbisect.state.rundir import RunDir, Runs
from envbisect.state.sourced import verdict_notes
from envbisect.state.structured import key_secrets
from envbisect.trials.diagnose import check_path, failing_engines
from envbisect.trials.probe_check import broken_line, refuse_broken_probe
from envbisect.trials.runner import Trial, TrialRunner

# an undecided perf trial is a start too few, not broken infrastructure: up to 3 more starts of it
# (pooled, search/perf.py) before the search gives up on that configuration
PERF_RETRIES = 3
REFERENCE_PURPOSE = ("perf reference: the baseline started again (the reference's own start is what leaves the "
                     "last comparison undecided; its samples join the reference)")


@dataclass(frozen=True)
class Session:
    """What one session of a run works on: the deltas and their contents, the units, the probe, the
    hosts' editor and the original state it journaled; the diff (None when resumed: its record is
    ``diff_doc``)."""

    deltas: list[Delta]
    contents: dict[str, bytes]
    units: Mapping[str, tuple[str, ...]]
    probe: Probe
    editor: HostEditor
    original: Any  # state.configuration.OriginalState
    diff: Diff | None = None
    diff_doc: Mapping[str, Any] | None = None

    @property
    def diff_notes(self) -> Sequence[str]:
        return self.diff.notes if self.diff else (self.diff_doc or {}).get("notes", ())


@dataclass(frozen=True)
class Concluded:
    """The verdict once the search has decided, and what was learned after it."""

    verdict: Verdict
    refined: Mapping[str, tuple[str, ...]]
    guard: GuardResult | None
    commit: CommitVerdict | None
    proof: BaselineProof | None
    dependencies: tuple[Mapping[str, Any], ...]


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
        self.hints = Hints()  # twins and suspicion for the search (search/hints.py), recorded with the run

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
        """`bisect --dry-run`: what the run would test (runs/plan.dry_run_plan)."""
        deltas = select_deltas(diff, self.opts.only, self.opts.exclude)
        units, notes = make_units(deltas, self.declared_links, self.opts.auto_link)
        return dry_run_plan(diff, self.playbook, self.opts, deltas, units, notes, self.probe())

    # --- persistence ---------------------------------------------------------------------------
    def _save_run(self, diff: Diff, deltas: Sequence[Delta], units: Mapping[str, tuple[str, ...]],
                  probe: Probe) -> None:
        store = self.dep.store
        o = self.opts
        doc = {
            "format": 1, "run_id": self.run_id, "deployment": self.playbook.name, "playbook": str(self.playbook.path),
            "created_at": time.time(), "probe": probe.name,
            "options": {"only": list(o.only), "exclude": list(o.exclude), "link": list(self.declared_links),
                        "confidence": o.confidence, "max_trials": o.max_trials, "leave": o.leave,
                        "auto_link": o.auto_link, "policy": o.policy, "guard": o.guard,
                        "split_merges": o.split_merges},
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
        doc["search"] = {"base_probes": probe.repeat, "retries": PERF_RETRIES if probe.is_perf else 1,
                         "hints": self.hints.to_json()}
        RunDir(self.run_dir).write(rundir.RUN, self.dep.masker.redact_json(doc))

    def _save_symptom(self, watch: SymptomWatch) -> None:
        """run.json keeps the symptom's fingerprint once the premise has shown it."""
        rd = RunDir(self.run_dir)
        doc = dict(rd.doc)
        doc["symptom"] = watch.to_json()
        rd.write(rundir.RUN, self.dep.masker.redact_json(doc))

    def _append_trial(self, trial: Trial) -> None:
        RunDir(self.run_dir).append_line(rundir.TRIALS, self.dep.masker.redact_json(trial.to_json(), indent=None))

    def _record(self, trial: Trial, *, evidence: bool = True) -> Trial:
        """A finished trial: kept among the run's trials (``evidence`` False: the final probe, which
        the result holds apart), appended to trials.jsonl, and told to the listener."""
        if evidence:
            self.trials.append(trial)
        self._append_trial(trial)
        self.on_event("trial-end", {"trial": trial})
        return trial

    # --- the run -------------------------------------------------------------------------------
    def start(self, diff: Diff) -> BisectResult:
        probe = self.probe()
        deltas = select_deltas(diff, self.opts.only, self.opts.exclude)
        check_applicable(deltas)
        refuse_broken_probe(probe, self.playbook, self.dep.transports)  # before any edit or restart
        units, notes = make_units(deltas, self.declared_links, self.opts.auto_link)
        failing = (failing_engines(self.playbook, self.dep.transports, probe) if twins_of(units, self.declared_links)
                   and running_stack_unverified(diff, self.playbook, deltas) is None else [])  # orders twins' sides
        self.hints = Hints.of(units, self.declared_links, failing)
        self.run_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
        self.run_dir = Runs(self.dep.store.runs_dir).new(self.run_id).path
        self._save_run(diff, deltas, units, probe)
        RunDir(self.run_dir).write(rundir.ENVIRONMENT, self.dep.masker.redact_json(
            capture_environment(self.playbook, self.dep.transports)))
        editor = self.editor_factory(self.playbook, self.dep.transports, self.run_dir, self.run_id)
        lock_notes = editor.lock(break_lock=self.break_lock)
        try:
            for note in lock_notes:
                self.on_event("warning", {"message": note})
            files, repos = touched(deltas)
            original = editor.begin(files, repos)  # refuses here when an owner could not be kept
            check_original_is_current(original, diff.current, deltas)
            session = Session(deltas, dict(diff.contents), units, probe, editor, original, diff)
        except BaseException:
            editor.abandon()  # nothing was edited: the journal is closed, the lock released
            raise
        return self._loop(session, [], notes)

    def resume(self, run_id: str | None, retract: Sequence[int] = ()) -> BisectResult:
        """Continue a run from its record (as the operator corrected it). ``retract``: trials to drop
        from the evidence first (recorded in the run folder; the search then asks again what it
        decided on them). A finished run can be resumed only so."""
        store = self.dep.store
        rd = Runs(store.runs_dir).bisection(run_id, self.playbook.name, finished=None if retract else False)
        doc = rd.doc
        self.run_id, self.run_dir = doc["run_id"], rd.path
        run_dir = rd.path
        finished = rd.finished("bisect")
        if finished and not retract:
            raise UsageError(f"run {self.run_id} already finished (see `envbisect show {self.run_id}`)")
        # a verdict it reached before a correction: the hosts were restored (or fixed) since
        last = rd.read(rundir.VERDICT) if finished else (rd.superseded_verdicts() or [None])[-1]
        if last is not None and last.get("state_left") == Leave.FIXED:
            raise UsageError(f"run {self.run_id} left the hosts fixed (culprits reverted), not as its trials found "
                             f"them: replay the correction without the hosts (`envbisect log {self.run_id}`, "
                             "`envbisect replay FILE`), or bisect again")
        raw = store.run_deltas(doc, rd.file(rundir.RUN))
        deltas = [Delta(**{**d, "detail": tuple(d.get("detail", ()))}) for d in raw]
        self.dep.masker.learn_env((d.key, v) for d in deltas if d.kind == "env" and d.key for v in (d.old, d.new))
        self.dep.masker.learn_env(key_secrets(deltas))
        contents = {sha: store.get_blob(ref) or b"" for sha, ref in doc["contents"].items()}
        units = {u: tuple(v) for u, v in doc["units"].items()}
        self.hints = Hints.from_json(doc.get("search", {}).get("hints"))
        o = doc["options"]
        self.opts = BisectOptions(probe=doc["probe"], only=tuple(o["only"]), exclude=tuple(o["exclude"]),
                                  link=tuple(o["link"]), confidence=o["confidence"], max_trials=o["max_trials"],
                                  leave=o["leave"], auto_link=o.get("auto_link", True), guard=o.get("guard"),
                                  policy=o.get("policy", "confirm"), split_merges=bool(o.get("split_merges")))
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
                    check_original_is_current(original, store.find(doc["current"]), deltas)
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
        return self._loop(Session(deltas, contents, units, probe, editor, original, None, diff_doc), done, [])

    def _perf_reference(self, probe: Probe, runner: TrialRunner, done: list[Trial], notes: list[str],
                        n_deltas: int, n_units: int) -> Trial | None:
        """A perf probe judges every configuration against the baseline's samples, so the baseline
        is measured first (in this run: a speed is never taken from memory); the search's baseline
        premise is then answered by that trial. Resumed: the judge is rebuilt from the run's record."""
        if not probe.needs_reference:
            return None
        old = next((t for t in done if not t.config and t.kind is TrialKind.PREMISE_BASELINE), None)
        if old is not None:
            runner.perf.resume((t.config, tuple(r.value for r in t.probe_runs if r.value is not None),
                                t.outcome is Outcome.PASS) for t in done)
            return None  # the replay of the record has shown it to the search already
        measure = "accuracy" if probe.kind == "answers" else "perf"
        purpose = (f"premise: baseline must pass (measured first: the {measure} "
                   "reference every configuration is judged against)")
        self.on_event("trial-start", {"n": 1, "purpose": purpose, "config": [], "eta_s": None, "units": n_units,
                                      "total_deltas": n_deltas})
        trial = self._record(runner.run(1, [], probe.samples, purpose, kind=TrialKind.PREMISE_BASELINE))
        allowed = (f"below its accuracy less {probe.tolerance:.0%} beyond chance" if probe.kind == "answers" else
                   f"worse by more than {probe.regression:.0%}")
        notes.append(f"{probe.kind} probe {probe.name}: the baseline was measured first (trial 1); every "
                     f"configuration's {probe.metric} is compared with its samples ({allowed} = fail)")
        return trial

    def _loop(self, s: Session, done: list[Trial], notes: list[str]) -> BisectResult:
        """Run the search's trials to a verdict, refine and guard it, leave the hosts as asked; any
        interruption puts the hosts back first."""
        runner = self.runner_factory(self.playbook, self.dep.transports, s.editor, s.original, s.deltas, s.contents,
                                     s.probe, s.units, on_step=lambda m: self.on_event("step", {"message": m}),
                                     evidence_dir=RunDir(self.run_dir).file(rundir.EVIDENCE))
        stop = install_signal_handlers()
        try:  # an interrupt before the first trial: nothing of this session to undo
            search = self._new_search(s)
            runner.units = {**runner.units, **self.hints.member_units()}  # a twin's sides, tested apart
            self.watch = SymptomWatch(list(s.units), enabled=not s.probe.is_perf)
            runner.tolerate = self.watch.tolerates
            self.trials = [self.watch.see(t) for t in done]
            feed(search, self.trials, self.corrections, observation)
        except BaseException as exc:
            stop()
            self._restore_interrupted(s.editor, exc) if s.editor.edited else s.editor.abandon()
            raise
        try:  # the perf reference is a trial like the others: an interrupt during it puts the hosts back
            reference = self._perf_reference(s.probe, runner, done, notes, len(s.deltas), len(s.units))
            verdict = self._search(search, runner, s, reference, notes)
            found = self._conclude(verdict, search, runner, s, notes)
            state_left, final = self._leave(found, runner, s, notes)
        except BaseException as exc:
            self._restore_interrupted(s.editor, exc)
            raise
        finally:
            stop()
        return self._finish(found, state_left, final, s, notes)

    def _new_search(self, s: Session) -> Search:
        unit_ids = list(s.units)
        self.playbook_units = unit_ids
        make_search = self.search_factory or parse_policy(self.opts.policy).search
        extra = {"retries": PERF_RETRIES} if s.probe.is_perf else {}
        if self.search_factory is None:
            extra.update(self.hints.search_options())
        budget = self.opts.max_trials or default_budget(len(unit_ids))
        if self.opts.max_trials is None:
            self.on_event("step", {"message": f"restart budget: {budget} (the default for {len(unit_ids)} unit(s); "
                                              "--max-trials overrides)"})
        return incident_for(unit_ids, make_search, budget, judged=not s.probe.is_perf,  # type: ignore[return-value]
                            options={"confidence": self.opts.confidence, "base_probes": s.probe.repeat, **extra})

    def _search(self, search: Search, runner: TrialRunner, s: Session, reference: Trial | None,
                notes: list[str]) -> Verdict:
        """The trials the search asks for, each observed, until it decides."""
        while True:
            nxt = search.next()
            if isinstance(nxt, Verdict):
                return nxt
            if reference is not None and nxt.kind is TrialKind.PREMISE_BASELINE and not nxt.config:
                search.observe(observation(reference))  # measured first, recorded as trial 1
                reference = None
                continue
            trial = self._search_trial(nxt, runner, s, notes)
            if trial.aborted:
                raise UsageError(f"probe asked to abort the bisection: {trial.reason}")
            if trial.cause is Cause.PROBE_BROKEN:  # no evidence: stop (and restore, in _loop)
                raise ProbeBroken(broken_line(s.probe, f"trial {trial.n}: {trial.reason}", restored=True))
            search.observe(observation(trial))
            refined = getattr(search, "symptom", None)
            if getattr(search, "stack_state", None) is not None and self.watch and self.watch.fingerprint != refined:
                self.watch.fingerprint, self.watch.learnt_from = refined, trial.n  # learnt from a fresh start
                self._save_symptom(self.watch)
            if trial.cause is Cause.CANNOT_TEST and getattr(runner.perf, "wants_reference", False):
                self._reference_start(runner, search, s)
            if trial.cause is Cause.SSH_LOST:
                self.on_event("step", {"message": "the ssh connection was lost: reconnecting"})
                self.dep.reconnect()  # ConnectionFailed here ends the run (and restores if it can)

    def _reference_start(self, runner: TrialRunner, search: Search, s: Session) -> None:
        """A perf comparison left undecided by the reference's own start (trials/perf.PerfJudge):
        the baseline is started again before the search's retry; its samples join the reference."""
        if isinstance(search.next(), Verdict):
            return
        n = len(self.trials) + 1
        self.on_event("trial-start", {"n": n, "purpose": REFERENCE_PURPOSE, "config": [], "eta_s": None,
                                      "units": len(s.units), "total_deltas": len(s.deltas)})
        ref = self._record(runner.run(n, [], s.probe.samples, REFERENCE_PURPOSE, kind=TrialKind.PREMISE_BASELINE))
        search.observe(observation(ref))

    def _search_trial(self, req: TrialRequest, runner: TrialRunner, s: Session, notes: list[str]) -> Trial:
        """One trial the search asked for: the running stack probed as it runs when that is a fair
        observation of the current configuration (plan.running_stack_unverified), else restarted."""
        n = len(self.trials) + 1
        self.on_event("trial-start", {"n": n, "purpose": req.purpose, "config": runner.delta_ids(sorted(req.config)),
                                      "eta_s": self._eta(req), "units": len(s.units),
                                      "expected_total": n - 1 + self._remaining(req),
                                      "total_deltas": len(s.deltas)})
        why_not: str | None = "not the first trial"
        if req.free and not self.trials:
            why_not = running_stack_unverified(s.diff, self.playbook, s.deltas)
            if why_not is not None:
                notes.append(f"trial 1 co-restarted the stack instead of probing it as it ran: {why_not}")
        if why_not is None:
            trial = runner.probe_running(n, sorted(req.config), req.probes,
                                         req.purpose + " (the running stack, no restart)", req.stop_after, req.kind)
        else:
            trial = runner.run(n, sorted(req.config), req.probes, req.purpose, req.stop_after, req.kind)
        watch = self.watch
        assert watch is not None
        known = watch.fingerprint
        trial = watch.see(trial)
        if known is None and watch.fingerprint is not None:
            self._save_symptom(watch)
        return self._record(trial)

    def _conclude(self, verdict: Verdict, search: Search, runner: TrialRunner, s: Session,
                  notes: list[str]) -> Concluded:
        """After the search: the verdict refined (auto-linked members apart, a HEAD move commit by
        commit), the revert guarded, a not-config verdict's premise proven, unresolved causes named."""
        verdict, split, split_notes = self.hints.conclude(verdict, search.evidence)
        notes.extend(split_notes)
        refined, apart = self._refine_links(verdict, {u: m for u, m in s.units.items() if u not in split}, runner,
                                            search, notes)
        refined.update(split)
        if apart:  # the verdict's own explanation says which members were tested apart, and by which trial
            verdict = dataclasses.replace(verdict, explanation=verdict.explanation
                                          + " Observed, testing auto-linked members apart: " + "; ".join(apart) + ".")
        commit = self._refine_commits(verdict, s.units, refined, runner, search, notes)
        if commit is not None:
            verdict = dataclasses.replace(verdict, explanation=verdict.explanation + " " + commit.text + ".")
        guard = self._guard_revert(verdict, s.units, refined, runner, notes)
        proof = None
        evidence = [t for t in self.trials if not self.corrections.retracted(t.n)]
        if verdict.kind == VerdictKind.NOT_CONFIG:  # only with proof that the baseline trial was the baseline
            proof = build_proof(seen=seen_ids(s.diff, s.diff_doc), deltas=s.deltas, original=s.original,
                                contents=s.contents, playbook=self.playbook, probe=s.probe, trials=evidence,
                                diff_notes=s.diff_notes, conflicts=s.editor.conflicts,
                                restart_facts=restart_facts(baseline_trial(evidence)))
            if not proof.reproduced:
                verdict = not_reproduced(verdict, proof)
        verdict = unresolved_causes(verdict, evidence)
        second = self.watch.second_problem(evidence) if self.watch is not None else None
        if second:  # the baseline's own failure, beside the verdict on the symptom
            verdict = dataclasses.replace(verdict, explanation=verdict.explanation.rstrip() + " " + second)
        if verdict.kind == VerdictKind.NOT_CONFIG:
            # "the baseline fails too" clears only what envbisect saw: a file an env file
            # sources that it could not snapshot is named (state/sourced.py)
            notes.extend(n for n in verdict_notes(s.diff_notes) if n not in notes)
        dependencies = dependency_records(verdict, s.units, self.trials)
        return Concluded(verdict, refined, guard, commit, proof, tuple(dependencies))

    def _leave(self, found: Concluded, runner: TrialRunner, s: Session,
               notes: list[str]) -> tuple[str, Trial | None]:
        """(the state left, the final trial): `--leave fixed` keeps current minus the culprits when
        that passes; otherwise the hosts are restored."""
        final = None
        if found.verdict.kind in (VerdictKind.CULPRIT, VerdictKind.INTERACTION) and self.opts.leave == Leave.FIXED:
            culprits = culprit_deltas(found.verdict, s.units, found.refined)
            keep = [u for u in s.units if not set(s.units[u]) & culprits]
            keep, pair_notes = leave_pairs_whole(keep, set(culprits), list(found.dependencies), s.units)
            notes.extend(pair_notes)
            final = self._record(runner.run(len(self.trials) + 1, keep, s.probe.repeat,
                                            "final: current minus the culprits must pass", kind=TrialKind.FINAL),
                                 evidence=False)
            if final.outcome is Outcome.PASS:
                with shield_signals(self._note_signal):  # the fix stands: close the journal, let go
                    s.editor.finish()
                    s.editor.unlock()
                return Leave.FIXED, final
            notes.append("current minus the culprits still fails, so at least one more delta breaks it: "
                         "restored the original state; re-run with --policy thorough to find them all")
        # nothing restarted (the running stack was only probed): restoring files is all there is
        restarted = any(not t.free for t in self.trials[self._restarted_from:])
        # the verdict is reached: a first signal while the hosts go back is noted, and the verdict kept
        with shield_signals(self._note_signal):
            return self._restore(s.editor, notes, restart=restarted), final

    def _note_signal(self, message: str) -> None:
        self.on_event("warning", {"message": message})

    def _restore_interrupted(self, editor: HostEditor, exc: BaseException) -> None:
        """Ctrl-C, SIGTERM, lost connection, someone else's change, bug: the hosts go back to where
        they were (what is provably envbisect's own), and the lock is kept until they are."""
        self.on_event("interrupted", {"error": str(exc) or type(exc).__name__, "run": self.run_id})
        try:
            with shield_signals(self._note_signal):
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

    def _finish(self, found: Concluded, state_left: str, final: Trial | None, s: Session,
                notes: list[str]) -> BisectResult:
        """The result, written as the run's verdict.json."""
        verdict, path_report = found.verdict, None
        if verdict.kind == VerdictKind.NOT_CONFIG:  # on the configuration it speaks about: _leave put current back
            self.on_event("step", {"message": "checking the request path layer by layer"})
            path_report = check_path(self.playbook, self.dep.transports, s.probe)
        if verdict.kind == VerdictKind.NOT_REPRODUCED and not any(not t.free for t in self.trials):
            notes.append(f"the running stack passes the probe as it runs (trial 1, no restart): nothing to find "
                         f"with probe {s.probe.name!r}; nothing was changed or restarted")
        elif verdict.kind == VerdictKind.NOT_REPRODUCED:
            notes.append("after a full ordered co-restart the current configuration passes; the hosts were left at "
                         "it, co-restarted - which is itself the fix for a stack restarted piecemeal")
        recorded = s.diff.to_json(self.dep.masker) if s.diff else s.diff_doc or {}
        verdict, drift_hint = verdict_drift(verdict, recorded, any(not t.free for t in self.trials))
        watch = self.watch
        result = BisectResult(self.run_id, verdict, tuple(self.trials), state_left, s.units, path_report,
                              drift_hint, final, tuple(notes), found.refined, found.guard, self.corrections,
                              watch.to_json() if watch else None, found.dependencies, found.proof, found.commit,
                              tuple(fault_records(verdict, s.units, found.refined)), stack_state_text(verdict))
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
            for m in test.keys:
                runner.units = {**runner.units, **test.member_units}
                trial = recorded_refine(self.trials, self.corrections, runner.delta_ids(test.config(m)))
                if trial is None:
                    n = len(self.trials) + 1
                    self.on_event("trial-start", {"n": n, "purpose": test.purpose(m), "eta_s": None,
                                                  "config": runner.delta_ids(test.config(m))})
                    trial = runner.run(n, test.config(m), search.pass_runs(), test.purpose(m), kind=TrialKind.REFINE)
                    if self.watch is not None:
                        trial = self.watch.see(trial)
                    self._record(trial)
                if trial.outcome is Outcome.UNRESOLVED:
                    tested = None
                    break
                tested.append((m, trial))
            judge_apart(test, tested, refined, apart, notes)
        return refined, apart

    def _refine_commits(self, verdict: Verdict, units: Mapping[str, tuple[str, ...]],
                        refined: Mapping[str, tuple[str, ...]], runner: TrialRunner, search,  # noqa: ANN001
                        notes: list[str]) -> CommitVerdict | None:
        """A HEAD move named alone, searched along its first-parent commits (search/commits.py). A
        step is the culprit alone with the repo at commit c: the other deltas at their baseline, one
        co-restart and the probe; the current HEAD alone is confirmed failing first if not yet seen."""
        g = git_culprit(verdict, units, refined, runner.deltas)
        if g is None:
            return None
        self.on_event("step", {"message": f"{g.id}: reading its first-parent commits from a local mirror"})
        try:
            lines = read_lines(self.dep.transports[g.host], g, self.opts.split_merges)
        except (NotALine, RemoteError) as e:
            notes.append(f"{g.id}: not searched commit by commit: {e}")
            return None
        pass_runs = search.pass_runs()
        asked: dict[tuple[str, TrialKind], int] = {}

        def trial_at(c: LineCommit, purpose: str, kind: TrialKind) -> Trial:
            step = dataclasses.replace(g, id=f"{g.id}@{c.sha[:12]}", new=c.sha)
            nth = asked[(step.id, kind)] = asked.get((step.id, kind), -1) + 1
            t = recorded_refine(self.trials, self.corrections, [step.id], kind, nth)  # --resume: replayed, not re-run
            if t is None:
                unit, n = f"commit:{c.sha[:12]}", len(self.trials) + 1
                commit_runner = self.runner_factory(self.playbook, self.dep.transports, runner.editor, runner.original,
                                                    [d for d in runner.deltas if d.id != g.id] + [step],
                                                    runner.contents, runner.probe, {unit: (step.id,)},
                                                    on_step=runner.on_step, evidence_dir=runner.evidence_dir)
                commit_runner.starts, commit_runner.tolerate = runner.starts, runner.tolerate  # the run's evidence
                self.on_event("trial-start", {"n": n, "purpose": purpose, "config": [step.id], "eta_s": None,
                                              "units": len(units), "total_deltas": len(runner.deltas)})
                t = commit_runner.run(n, [unit], pass_runs, purpose, kind=kind)
                t = self._record(self.watch.see(t) if self.watch is not None else t)
            return t

        def confirm(c: LineCommit) -> tuple[Trial | None, str]:
            made = undo_on_host(self.dep.transports[g.host], g, c)
            if isinstance(made, str):
                return None, made
            return trial_at(made, f"confirm: the deployed HEAD without commit {c.sha[:12]} must pass",
                            TrialKind.CONFIRM), ""

        return search_line(g, lines, self.trials, trial_at, notes, confirm)

    def _guard_revert(self, verdict: Verdict, units: Mapping[str, tuple[str, ...]],
                      refined: Mapping[str, tuple[str, ...]], runner: TrialRunner,
                      notes: list[str]) -> GuardResult | None:
        """--guard: before a culprit is called safe to revert, measure what reverting it costs.
        The current configuration is started and sampled (the reference: what the stack does
        now), then current minus the culprits, judged against it with the perf decision. Two
        restarts, spent only once there is a verdict to act on (runs/plan.guard_verdict judges)."""
        g = self.guard_probe()
        if g is None or verdict.kind not in (VerdictKind.CULPRIT, VerdictKind.INTERACTION):
            return None
        culprits = culprit_deltas(verdict, units, refined)
        configs = guard_configs(g, units, culprits)
        guard_runner = self.runner_factory(self.playbook, self.dep.transports, runner.editor, runner.original,
                                           runner.deltas, runner.contents, g, runner.units, on_step=runner.on_step,
                                           evidence_dir=runner.evidence_dir,
                                           reference_config=runner.delta_ids(configs[0][0]))
        guard_runner.starts = runner.starts  # which start commands this run saw work
        numbers = []
        last = None
        for config, purpose in configs:
            n = len(self.trials) + 1
            self.on_event("trial-start", {"n": n, "purpose": purpose, "config": guard_runner.delta_ids(config),
                                          "eta_s": None, "units": len(units)})
            last = self._record(guard_runner.run(n, config, g.samples, purpose, kind=TrialKind.GUARD))
            numbers.append(n)
            if last.outcome is not Outcome.PASS:
                break
        assert last is not None
        safe, text = guard_verdict(g, culprits, numbers, last)
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
                            keep_survivors=self._pids_before_the_run(), best_effort=True)
        editor.finish()
        editor.unlock()
        if rs is not None and not rs.ok:
            self.on_event("warning", {"message": f"restored files, but the co-restart failed: {rs.message}; "
                                                 f"each service: {service_states(rs)}"})
        return Leave.ORIGINAL

    def _pids_before_the_run(self) -> frozenset[int]:
        """The services' processes as the run found them: the old pids the first restarting trial
        stopped (Trial.restart_proof). A process of a trial's configuration is never among them."""
        first = next((t for t in self.trials if not t.free and t.restart_proof), None)
        return frozenset(f.old_pid for f in (first.restart_proof if first else ()) if f.old_pid)

    def _remaining(self, req: TrialRequest) -> int:
        return remaining_restarts(req, self.opts.policy, len(self.playbook_units))

    def _eta(self, req: TrialRequest) -> float | None:
        resolved = [t for t in self.trials if t.restart_s > 0]
        if not resolved:
            return None
        per = sum(t.restart_s + t.probe_s for t in resolved) / len(resolved)
        return per * self._remaining(req)


__all__ = ["ApartTest", "BisectRun", "BisectOptions", "BisectResult", "CommitVerdict", "GuardResult", "PERF_RETRIES",
           "REFERENCE_PURPOSE", "POLICIES", "VERDICT_EXIT", "capture_environment", "judge_apart", "make_units",
           "restore_deployment"]
