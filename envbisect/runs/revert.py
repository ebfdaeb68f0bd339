"""`envbisect revert` / `envbisect apply`: act on a verdict, safely.

Take chosen deltas out of (or put them back into) the live configuration with the same journaled,
atomic, shell-safe edits and full co-restart as a bisection, then prove the result with the probe
(and the layered verify). A revert that does not make the probe pass is put back by default: the
incident this tool exists for lost a +12.8% throughput knob by leaving an innocent revert in place.
"""
from __future__ import annotations

import dataclasses

import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from envbisect.runs.signals import install_signal_handlers, shield_signals
from envbisect.state.configuration import OriginalState, holds, target_state, touched
from envbisect.state.delta_cmdline import flag_holds
from envbisect.state.structured import key_secrets
from envbisect.state.deltas import Delta
from envbisect.runs.deployment import Deployment
from envbisect.errors import StoreError, UsageError
from envbisect.outcome import VerdictKind
from envbisect.hosts.journal import HostEditor, describe_conflict
from envbisect.inputs.playbook import Probe
from envbisect.hosts.restart import RestartResult, co_restart
from envbisect.state import rundir
from envbisect.state.rundir import Runs
from envbisect.trials.runner import probe_repeatedly
from envbisect.trials.verify import VerifyReport, verify


@dataclass(frozen=True)
class RunDeltas:
    """The deltas (with old/new contents) recorded by a bisection run, and what it concluded."""

    run_id: str
    deltas: tuple[Delta, ...]
    contents: Mapping[str, bytes]
    probe: str
    culprits: tuple[str, ...]
    verdict: str | None
    guard: Mapping[str, Any] | None = None  # bisect --guard: is reverting the culprits safe for speed?
    # deltas that fail differently without a partner: ({"needy": [...], "partners": [...], "text"}, ...)
    dependencies: tuple[Mapping[str, Any], ...] = ()
    commit: Mapping[str, Any] | None = None  # a guilty HEAD move's first failing commit (verdict.json "commit")


def at_named_commit(source: RunDeltas) -> tuple[RunDeltas, list[str]]:
    """`revert --verdict` after a commit-level verdict: the HEAD move is reverted to just before the
    named commit (its first parent, the last commit the search saw passing), keeping the pull's
    earlier commits; the delta's id stays, its baseline side becomes that parent."""
    doc = source.commit or {}
    named = doc.get("commit") if isinstance(doc.get("commit"), dict) else None
    if not named or not doc.get("last_passing") or doc.get("delta") not in source.culprits:
        return source, []
    parent = str(doc.get("revert_to") or doc["last_passing"])
    deltas = tuple(dataclasses.replace(d, old=parent) if d.id == doc["delta"] and d.kind == "git" else d
                   for d in source.deltas)
    merge = str(named.get("merged_by") or "")
    if merge:  # a commit of a merged branch: the merge goes, the first-parent commits before it stay
        note = (f"{doc['delta']}: back to {parent[:12]}, just before the merge {merge[:12]} that brought in commit "
                f"{str(named.get('sha'))[:12]} {named.get('subject')!r}; the first-parent commits before the "
                "merge are kept")
    else:
        note = (f"{doc['delta']}: back to {parent[:12]}, just before commit {str(named.get('sha'))[:12]} "
                f"{named.get('subject')!r}; the earlier commits of the HEAD move are kept")
    return dataclasses.replace(source, deltas=deltas), [note]


def load_run_deltas(dep: Deployment, run_id: str | None) -> RunDeltas:
    runs = Runs(dep.store.runs_dir)
    if run_id:
        rd = runs.get(run_id)
        if rd.kind != "bisect" or rd.doc.get("deployment") != dep.playbook.name:
            raise UsageError(f"no bisect run {run_id!r} for deployment {dep.playbook.name!r} (see `envbisect runs`)")
    else:
        rd = runs.newest(kind="bisect", deployment=dep.playbook.name)
        if rd is None:
            raise UsageError("no bisect run recorded for this deployment: run `envbisect bisect` first, "
                             "or name the deltas' run with --run")
    path, doc = rd.path, rd.doc
    try:  # a damaged run file is one line naming it, never a traceback
        raw = dep.store.run_deltas(doc, rd.file(rundir.RUN))
        deltas = tuple(Delta(**{**d, "detail": tuple(d.get("detail", ()))}) for d in raw)
        contents = {sha: dep.store.get_blob(ref) or b"" for sha, ref in dict(doc.get("contents", {})).items()}
        culprits: tuple[str, ...] = ()
        verdict = None
        guard = None
        dependencies: tuple[Mapping[str, Any], ...] = ()
        commit = None
        v = rd.read_optional(rundir.VERDICT)
        if v is not None:
            culprits, verdict = tuple(map(str, v.get("culprits", ()))), v.get("verdict")
            guard = v.get("guard") if isinstance(v.get("guard"), dict) else None
            dependencies = tuple(d for d in v.get("dependencies") or () if isinstance(d, dict))
            commit = v.get("commit") if isinstance(v.get("commit"), dict) else None
    except (TypeError, ValueError, AttributeError) as e:
        raise StoreError(f"{rd.file(rundir.RUN)}: damaged run file ({e})") from None
    dep.masker.learn_env((d.key, v) for d in deltas if d.kind == "env" and d.key for v in (d.old, d.new))
    dep.masker.learn_env(key_secrets(deltas))
    return RunDeltas(path.name, deltas, contents, str(doc.get("probe", "")), culprits, verdict, guard, dependencies,
                     commit)


def keep_pairs_whole(action: str, ids: Sequence[str], source: RunDeltas, *,
                     from_verdict: bool) -> tuple[list[str], list[str]]:
    """A revert never leaves a delta without the partner it needs (the bisection saw it fail
    differently without it). `revert --verdict` takes the needy delta too, with the sentence that
    says why; a revert of chosen ids that would break such a pair is refused, naming both."""
    ids = list(ids)
    notes: list[str] = []
    if action != "revert":
        return ids, notes
    changed = True
    while changed:
        changed = False
        for d in source.dependencies:
            needy, partners = list(d.get("needy", ())), list(d.get("partners", ()))
            gone = [p for p in partners if p in ids]
            left = [n for n in needy if n not in ids]
            if not gone or not left:
                continue
            if not from_verdict:
                raise UsageError(f"reverting {', '.join(gone)} would leave {', '.join(left)} without the partner it "
                                 f"needs (run {source.run_id}: {d.get('text', 'it fails differently without it')}); "
                                 f"revert both: envbisect revert {' '.join(ids + left)}")
            ids.extend(left)
            notes.append(f"also reverted {', '.join(left)}: it needs {', '.join(gone)}, which the verdict reverts "
                         f"(run {source.run_id}: {d.get('text', 'it fails differently without it')})")
            changed = True
    return ids, notes


def applied_now(original: OriginalState, deltas: Sequence[Delta]) -> dict[str, bool | None]:
    """Is each delta in its new state (True), its old state (False), or neither (None: moved on)?"""
    from envbisect.inputs.envfile import EnvFileError, parse_env

    out: dict[str, bool | None] = {}
    for d in deltas:
        key = (d.host, d.path)
        if d.kind == "git":
            r = original.repos.get(key)
            head = r.head if r else None
            out[d.id] = True if head == d.new else False if head == d.old else None
            continue
        f = original.files.get(key)
        data = f.content if f is not None and f.exists else None
        if d.kind == "key":  # by the key's value, as the delta was found (state/structured.py)
            from envbisect.state.structured import format_of, value_at

            fmt = format_of(d.path)
            parsed, value = value_at(fmt, data, d.key or "") if fmt else (False, None)
            out[d.id] = None if not parsed else True if value == d.new else False if value == d.old else None
            continue
        if d.kind == "flag":  # by the flag's values on the command line (state/delta_cmdline.py)
            out[d.id] = flag_holds(data, d)
            continue
        if d.kind == "env":
            # by shell meaning, as the deltas were found (configuration.holds)
            try:
                env = parse_env((data or b"").decode("utf-8", "surrogateescape"))
                out[d.id] = True if holds(env, d, "new") else False if holds(env, d, "old") else None
            except EnvFileError:
                out[d.id] = None
            continue
        else:
            value = hashlib.sha256(data).hexdigest() if data is not None else None
        out[d.id] = True if value == d.new else False if value == d.old else None
    return out


@dataclass(frozen=True)
class ActionResult:
    action: str  # revert | apply
    run_id: str
    deltas: tuple[str, ...]
    restart: RestartResult
    probe_outcome: str | None  # pass | fail | unresolved | None (no probe)
    probe_reason: str
    verify: VerifyReport | None = None
    put_back: bool = False
    after_put_back: str | None = None  # probe outcome after putting the deltas back
    notes: tuple[str, ...] = field(default_factory=tuple)
    perf: dict[str, Any] | None = None  # a perf probe: the samples before and after, and the effect

    @property
    def ok(self) -> bool:
        return self.restart.ok and self.probe_outcome in (None, "pass") and (self.verify is None or self.verify.ok) \
            and not self.put_back

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "run": self.run_id, "deltas": list(self.deltas), "ok": self.ok,
                "restart": {"ok": self.restart.ok, "message": self.restart.message,
                            "seconds": round(self.restart.total_s, 2)},
                "probe": {"outcome": self.probe_outcome, "reason": self.probe_reason},
                "verify": self.verify.to_json() if self.verify else None,
                "put_back": self.put_back, "after_put_back": self.after_put_back, "notes": list(self.notes),
                "perf": self.perf}


@dataclass(frozen=True)
class ChangeRequest:
    """What `revert`/`apply` is asked: the deltas (``from_verdict``: the culprits of the run's verdict),
    the bisect run they come from (None: the newest), the probe that must pass afterwards (None: the
    run's), a perf probe to measure the cost with, and whether a guard's measured cost is accepted."""

    action: str  # revert | apply
    ids: tuple[str, ...] = ()
    from_verdict: bool = False
    run_id: str | None = None
    probe: str | None = None
    run_verify: bool = False
    guard: str | None = None
    accept_cost: bool = False


@dataclass(frozen=True)
class PreparedChange:
    """A ChangeRequest resolved against the run's record and the playbook."""

    source: RunDeltas
    ids: tuple[str, ...]
    probe_name: str | None
    probe: Probe | None
    perf_guard: Probe | None


def prepare_change(dep: Deployment, req: ChangeRequest,
                   on_note: Callable[[str], None] = lambda _m: None) -> PreparedChange:
    """The deltas, the probe and the perf guard a change runs with. `--verdict` takes the verdict's
    culprits (a revert after a commit-level verdict goes back to just before the named commit, said
    through ``on_note``) and is refused when the verdict names none, or when the bisection's guard
    measured that reverting costs speed (unless the cost is accepted)."""
    src = load_run_deltas(dep, req.run_id)
    ids = list(req.ids)
    if req.from_verdict:
        kind = VerdictKind.parse(src.verdict)
        if kind is None or not kind.names_changes:
            raise UsageError(f"run {src.run_id} has verdict {src.verdict or 'none'}: no culprits to {req.action}")
        ids = list(src.culprits)
        if req.action == "revert":
            src, commit_notes = at_named_commit(src)
            for note in commit_notes:
                on_note(note)
        g = src.guard or {}
        if g.get("safe_to_revert") is False and not req.accept_cost:
            raise UsageError(f"run {src.run_id}'s guard {g.get('probe')} measured that {g.get('text')}; "
                             "pass --accept-cost to revert anyway")
    pname = req.probe or src.probe
    pr = dep.playbook.probes.get(pname) if pname else None
    if pname and pr is None:
        raise UsageError(f"no probe {pname!r} in {dep.playbook.path}")
    gp = None
    if req.guard is not None:
        gp = dep.playbook.probes.get(req.guard)
        if gp is None or not gp.is_perf:
            raise UsageError(f"--guard {req.guard}: " + (f"no probe {req.guard!r} in {dep.playbook.path}" if gp is None
                                                         else f"probe {req.guard!r} is kind {gp.kind!r}, not perf"))
    elif req.run_verify and not (pr is not None and pr.is_perf):
        # --verify reports what the change costs in speed when the playbook can measure it
        gp = next((p for p in dep.playbook.probes.values() if p.is_perf), None)
    return PreparedChange(src, tuple(ids), pname, pr, gp)


def change(dep: Deployment, action: str, ids: Sequence[str], source: RunDeltas, *, probe: Probe | None,
           run_verify: bool = False, put_back_on_fail: Callable[[ActionResult], bool] | bool = True,
           on_event: Callable[[str, dict], None] | None = None, break_lock: bool = False,
           perf_guard: Probe | None = None, from_verdict: bool = False) -> ActionResult:
    """`perf_guard`: a perf probe measured before and after the change, whatever `probe` says:
    what the change costs or buys in speed, reported with its uncertainty. When `probe` is itself
    a perf probe it is its own guard, and its decision is the outcome."""
    if action not in ("revert", "apply"):
        raise ValueError(action)
    if probe is not None and probe.is_perf:
        perf_guard = probe
    ev = on_event or (lambda _k, _d: None)
    by_id = _chosen(source, ids, action)
    ids, pair_notes = keep_pairs_whole(action, ids, source, from_verdict=from_verdict)
    run_id = time.strftime("%Y%m%dT%H%M%S") + f"-{action}-" + uuid.uuid4().hex[:4]
    rd = Runs(dep.store.runs_dir).new(run_id)
    rd.write(rundir.RUN, json.dumps({
        "format": 1, "kind": action, "run_id": run_id, "deployment": dep.playbook.name, "created_at": time.time(),
        "from_run": source.run_id, "deltas": list(ids), "probe": probe.name if probe else None}).encode())
    editor = HostEditor(dep.playbook, dep.transports, rd.path, run_id)
    stop = install_signal_handlers()  # SIGTERM behaves like Ctrl-C: the hosts are put back
    try:
        for note in editor.lock(break_lock=break_lock):  # refused or interrupted: lets go of what it took
            ev("warning", {"message": note})
        job = _begin(dep, editor, action, run_id, [by_id[i] for i in ids], source, probe, perf_guard, ev)
        result = job.run(run_verify, tuple(pair_notes))
        failed = not result.restart.ok or result.probe_outcome == "fail" or (
            result.verify is not None and not result.verify.ok)
        if action == "revert" and failed:
            decide = put_back_on_fail(result) if callable(put_back_on_fail) else put_back_on_fail
            if decide:
                result = job.put_back(result)
        with shield_signals(lambda m: ev("warning", {"message": m})):  # the change stands: close it, say so
            editor.finish()
            editor.unlock()
    except BaseException as exc:
        _undo_interrupted(dep, editor, run_id, ev, exc)
        raise
    finally:
        stop()
    rd.write(rundir.RESULT, dep.masker.redact_json(result.to_json()))
    return result


@dataclass(frozen=True)
class _Change:
    """One revert or apply under way: the hosts locked and journaled, the original state read."""

    dep: Deployment
    editor: HostEditor
    action: str
    run_id: str
    ids: tuple[str, ...]
    source: RunDeltas
    related: tuple[Delta, ...]  # every delta in a file the chosen ones touch: their state is kept
    original: OriginalState
    want: frozenset[str]  # the deltas in their new state once the change is made
    probe: Probe | None
    perf_guard: Probe | None
    ev: Callable[[str, dict], None]

    def restart(self) -> RestartResult:
        return co_restart(self.dep.playbook, self.dep.transports, on_step=lambda m: self.ev("step", {"message": m}),
                          guard=self.editor.guard)

    def run(self, run_verify: bool, pair_notes: tuple[str, ...]) -> ActionResult:
        """Measure (a perf guard), make the change, co-restart, probe and verify."""
        action, probe, perf_guard, dep = self.action, self.probe, self.perf_guard, self.dep
        before = None
        unmeasured = None
        if perf_guard is not None:
            # what the change costs or buys is measured, not assumed: the running stack first
            self.ev("step", {"message": f"measuring {perf_guard.metric} before the {action} ({perf_guard.name})"})
            try:
                before = perf_samples(perf_guard, dep.transports)
            except UsageError as e:
                if perf_guard is probe:
                    raise
                unmeasured = f"{perf_guard.name} could not measure the stack before the {action}: {e}"
        self.ev("step", {"message": f"{action}: {', '.join(self.ids)}"})
        self.editor.apply(target_state(self.original, self.related, set(self.want), self.source.contents))
        rs = self.restart()
        perf = None
        if before is not None and rs.ok and perf_guard is probe:
            outcome, reason, perf = perf_change(probe, dep.transports, before, action)
        else:
            outcome, reason = _probe(dep, probe, rs)
            if before is not None and rs.ok:
                _o, _r, perf = perf_change(perf_guard, dep.transports, before, action)
        extra_notes: list[str] = [unmeasured] if unmeasured else []
        if perf is not None and perf_guard is not probe and perf.get("decision") == "worse" and outcome == "pass":
            extra_notes.append(f"the {action} made {probe.name if probe else 'the stack'} pass and costs "
                               f"{perf_guard.metric}: {perf['effect_text']}; weigh that before keeping it")
        vr = verify(dep.playbook, dep.transports) if run_verify and rs.ok else None
        return ActionResult(action, self.run_id, self.ids, rs, outcome, reason, vr,
                            notes=pair_notes + tuple(extra_notes), perf=perf)

    def put_back(self, result: ActionResult) -> ActionResult:
        """A revert that did not make the probe pass: the deltas go back in, co-restarted and probed."""
        ids, perf, probe = self.ids, result.perf, self.probe
        self.ev("step", {"message": "the revert did not make the probe pass, so the delta(s) go back in"})
        self.editor.apply(target_state(self.original, self.related, set(self.want) | set(ids), self.source.contents))
        after, _ = _probe(self.dep, probe, self.restart())
        why = f"{', '.join(ids)} did not fix it and were put back: do not blame them"
        if perf is not None and perf.get("effect_text"):
            metric = self.perf_guard.metric if self.perf_guard else ""
            why = (f"{', '.join(ids)} were put back: the revert did not fix {probe.name if probe else 'it'}, "
                   f"and it would have cost {metric}: {perf['effect_text']}"
                   if perf.get("decision") == "worse" else
                   f"{', '.join(ids)} were put back: do not blame them ({metric} during the "
                   f"revert: {perf['effect_text']})")
        return dataclasses.replace(result, put_back=True, after_put_back=after, notes=(*result.notes, why))


def _begin(dep: Deployment, editor: HostEditor, action: str, run_id: str, deltas: Sequence[Delta],
           source: RunDeltas, probe: Probe | None, perf_guard: Probe | None,
           ev: Callable[[str, dict], None]) -> _Change:
    """Journal the files and repos the change touches (refused, with nothing edited, when a chosen
    delta's live value is neither side of it)."""
    ids = tuple(d.id for d in deltas)
    paths = {(d.host, d.path) for d in deltas}
    related = [d for d in source.deltas if (d.host, d.path) in paths]
    files, repos = touched(related)
    try:
        original = editor.begin(files, repos)
        state = applied_now(original, related)
        moved = [d.id for d in deltas if state[d.id] is None]
        if moved:
            raise UsageError(f"{moved[0]}: the live value is neither the baseline's nor the run's; "
                             "the deployment changed since that run - run diff/bisect again")
    except BaseException:
        editor.abandon()  # nothing was edited
        raise
    want = {i for i, on in state.items() if on}
    want = want - set(ids) if action == "revert" else want | set(ids)
    return _Change(dep, editor, action, run_id, ids, source, tuple(related), original, frozenset(want), probe,
                   perf_guard, ev)


def _undo_interrupted(dep: Deployment, editor: HostEditor, run_id: str, ev: Callable[[str, dict], None],
                      exc: BaseException) -> None:
    """Ctrl-C, SIGTERM, lost connection, someone else's change: back to the state before this
    command, keeping the lock until the hosts are consistent."""
    if editor.journal is None or editor.journal.state != "active":
        with shield_signals(lambda m: ev("warning", {"message": m})):
            editor.unlock()  # nothing of this command on the hosts to undo: let go of the lock
        return
    ev("interrupted", {"error": str(exc) or type(exc).__name__, "run": run_id})
    try:
        with shield_signals(lambda m: ev("warning", {"message": m})):
            for c in editor.restore():
                ev("warning", {"message": describe_conflict(c)})
            co_restart(dep.playbook, dep.transports, on_step=lambda m: ev("step", {"message": m}), guard=editor.guard)
            editor.finish()
        editor.unlock()
    except BaseException as e2:  # noqa: BLE001 - report; the journal and the lock stay
        editor.stop_heartbeat()
        ev("restore-failed", {"error": f"{e2}; the journal is kept: run `envbisect restore --run {run_id}`"})


def _chosen(source: RunDeltas, ids: Sequence[str], action: str) -> dict[str, Delta]:
    """The run's deltas by id, once the chosen `ids` are known to be among them."""
    by_id = {d.id: d for d in source.deltas}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise UsageError(f"no delta {missing[0]!r} in run {source.run_id} (known: {', '.join(sorted(by_id)[:6])}...)")
    if not ids:
        raise UsageError(f"name the deltas to {action} (or use --verdict)")
    return by_id


@dataclass(frozen=True)
class ChangePlan:
    """`revert`/`apply --dry-run`: what the change would write on which host, read from the hosts as
    they are now (nothing written, no lock taken, no run recorded)."""

    action: str
    run_id: str  # the bisect run the deltas come from
    deltas: tuple[str, ...]
    changes: tuple[dict[str, Any], ...]  # {host, path, kind, deltas: [...], what: [...]}
    already: tuple[str, ...]  # chosen deltas already in the state the action would put them in
    restart_order: tuple[str, ...]
    probe: str | None

    def to_json(self) -> dict[str, Any]:
        return {"dry_run": True, "action": self.action, "run": self.run_id, "deltas": list(self.deltas),
                "changes": list(self.changes), "already": list(self.already),
                "restart_order": list(self.restart_order), "probe": self.probe}


def plan_change(dep: Deployment, action: str, ids: Sequence[str], source: RunDeltas, *,
                probe: Probe | None, from_verdict: bool = False) -> ChangePlan:
    """What `change` would do, from the hosts' state now, touching nothing: the files and repos it
    would write (each with the chosen deltas in it and their values, masked), then the co-restart and
    the probe. Raises as `change` would before its first edit (a delta whose live value moved on, a
    lock it could not take)."""
    from envbisect.hosts.journal import read_original

    if action not in ("revert", "apply"):
        raise ValueError(action)
    by_id = _chosen(source, ids, action)
    ids, _notes = keep_pairs_whole(action, ids, source, from_verdict=from_verdict)  # as `change` would
    # would the lock be refused? (asked without taking it: nothing is written)
    HostEditor(dep.playbook, dep.transports, dep.store.runs_dir / "-", "", heartbeat_s=0).lock(dry=True)
    deltas = [by_id[i] for i in ids]
    paths = {(d.host, d.path) for d in deltas}
    related = [d for d in source.deltas if (d.host, d.path) in paths]
    files, repos = touched(related)
    original = read_original(dep.playbook, dep.transports, files, repos)
    state = applied_now(original, related)
    moved = [d.id for d in deltas if state[d.id] is None]
    if moved:
        raise UsageError(f"{moved[0]}: the live value is neither the baseline's nor the run's; "
                         "the deployment changed since that run - run diff/bisect again")
    want = {i for i, on in state.items() if on}
    want = want - set(ids) if action == "revert" else want | set(ids)
    target = target_state(original, related, want, source.contents)
    already = tuple(d.id for d in deltas if state[d.id] is (action == "apply"))
    changes = []
    for key, data in sorted(target.files.items()):
        now = original.files[key]
        if (now.content if now.exists else None) == data:
            continue
        mine = [d for d in deltas if (d.host, d.path) == key and d.id not in already]
        changes.append({"host": key[0], "path": key[1], "kind": "file", "deltas": [d.id for d in mine],
                        "what": [_what(d, action, dep) for d in mine] or ["rewritten"]})
    for key, rt in sorted(target.repos.items()):
        if original.repos[key].head == rt.commit:
            continue
        mine = [d for d in deltas if (d.host, d.path) == key]
        changes.append({"host": key[0], "path": key[1], "kind": "repo", "deltas": [d.id for d in mine],
                        "what": [f"HEAD {original.repos[key].head[:10]} → {rt.commit[:10]}"]})
    return ChangePlan(action, source.run_id, tuple(ids), tuple(changes), already, tuple(dep.playbook.restart.order),
                      probe.name if probe else None)


def _what(d: Delta, action: str, dep: Deployment) -> str:
    """One delta's change as the action would make it: KEY old → new (masked), or the file's."""
    j = d.to_json(dep.masker)
    old, new = j.get("old_shown", j.get("old")), j.get("new_shown", j.get("new"))
    if action == "revert":
        old, new = new, old
    name = d.key if d.kind == "env" and d.key else f"{d.path} {d.key}" if d.kind == "key" else d.path
    def show(v: object) -> str:
        return "unset" if v is None else str(v)[:12] if d.kind not in ("env", "key", "flag") else str(v)

    return f"{name}: {show(old)} → {show(new)}"


def perf_samples(probe: Probe, transports) -> tuple[float, ...]:  # noqa: ANN001
    from envbisect.trials.perf_trial import reference_count, sample

    runs, broken = sample(probe, transports, reference_count(probe))
    if broken:
        raise UsageError(f"probe {probe.name} cannot measure the running stack ({broken}): fix that first, "
                         "or revert with a pass/fail probe")
    return tuple(r.value for r in runs if r.value is not None)


def perf_change(probe: Probe, transports, before: tuple[float, ...], action: str  # noqa: ANN001
                ) -> tuple[str, str, dict[str, Any]]:
    """The metric after the change against before it: a change that makes it measurably worse by
    more than `regression` fails (and a revert is put back); otherwise it passes. The effect
    (with its uncertainty) is reported either way: what the change cost or bought."""
    from envbisect.trials.perf_trial import compare, sample

    runs, broken = sample(probe, transports, probe.samples)
    d = None
    if not broken:
        d, runs, broken = compare(probe, transports, before, runs)
    after = [r.value for r in runs if r.value is not None]
    if broken or d is None:
        return "fail", f"after the {action}: {broken}", {"before": list(before), "after": after}
    outcome = {"worse": "fail", "same": "pass"}.get(d.outcome.value, "unresolved")
    doc = {"metric": probe.metric, "before": list(before), "after": after, "decision": d.outcome.value,
           "effect": d.effect, "effect_ci": list(d.effect_ci) if d.effect_ci else None, "effect_text": d.reason,
           "p_mann_whitney": d.p_mann_whitney, "p_kolmogorov_smirnov": d.p_kolmogorov_smirnov}
    said = d.reason.replace("than the baseline", "than before")  # the reference here is the stack before
    doc["effect_text"] = said
    return outcome, f"{probe.metric} before → after the {action}: {said}", doc


def _probe(dep: Deployment, probe: Probe | None, rs: RestartResult) -> tuple[str | None, str]:
    if not rs.ok:
        return ("fail" if rs.failure == "start-failure" else "unresolved"), rs.message
    if probe is None:
        return None, "no probe"
    outcome, _runs, reason = probe_repeatedly(probe, dep.transports, probe.repeat)
    return outcome, reason


__all__ = ["change", "plan_change", "prepare_change", "load_run_deltas", "applied_now", "ActionResult", "ChangePlan",
           "ChangeRequest", "PreparedChange", "RunDeltas", "Path"]
