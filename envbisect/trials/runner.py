"""Trials: apply a configuration, co-restart, probe. The I/O half of the bisection.

The search (search.py) says which configuration to try and how many probe runs it deserves; this
module makes it so on the hosts and reports what happened as a `Trial`. Infrastructure trouble
(SSH lost, a start command that cannot run) makes a trial `unresolved`, never `fail`: blaming a
delta for a broken network is exactly the wrong-culprit mistake this tool exists to prevent. A
start command that exits non-zero is a start failure of the configuration only on the run's
evidence that the command works (trials/start_evidence.py).
"""
from __future__ import annotations

import time
from pathlib import Path
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

from envbisect.state.configuration import OriginalState, TargetState, target_state
from envbisect.state.deltas import Delta, DeltaKind
from envbisect.errors import RemoteError
from envbisect.hosts.journal import HostEditor
from envbisect.outcome import Cause, Outcome
from envbisect.inputs.playbook import Playbook, Probe
from envbisect.trials.probe import ABORT, BROKEN, CANNOT_TEST, FAIL, PASS, ProbeRun, run_probe
from envbisect.trials.probe_check import unreached
from envbisect.trials.start_evidence import StartEvidence
from envbisect.hosts.restart import RestartResult, ServiceRestart, co_restart
from envbisect.trials.restart_plan import RestartPlan, Running, plan_restart
from envbisect.search import TrialKind
from envbisect.hosts.transport import Transport


@dataclass(frozen=True)
class Trial:
    n: int
    purpose: str
    units: tuple[str, ...]
    config: tuple[str, ...]  # delta ids applied on top of the baseline
    outcome: Outcome  # PASS | FAIL | START_FAILURE | UNRESOLVED
    reason: str
    probe_runs: tuple[ProbeRun, ...] = ()
    restart_s: float = 0.0
    probe_s: float = 0.0
    restart_durations: Mapping[str, float] = field(default_factory=dict)
    started_at: float = 0.0
    log_tail: str = ""
    aborted: bool = False
    # probed as it was running, without a restart (see bisect.running_stack_unverified): costs no
    # restart, and is never the only evidence a culprit is blamed on (search._restart_proof)
    free: bool = False
    kind: TrialKind = TrialKind.CHECK
    cause: Cause | None = None  # why it is unresolved (infrastructure), None otherwise
    # a failure against the symptom's fingerprint (trials/symptom.py; set by the run): "same", or
    # "other" (it failed differently: no evidence about the symptom); None: not a failure, or not judged
    symptom: str | None = None
    # what the trial's co-restart proved, per service in restart order (hosts/restart.ServiceRestart:
    # old pid gone, new pid, its start after the stop, the environment keys checked): the proof that
    # the configuration probed is the one named; empty for a free trial (no restart)
    restart_proof: tuple[ServiceRestart, ...] = ()
    # what its co-restart restarted and why (trials/restart_plan.py); None for a free trial
    restart_plan: RestartPlan | None = None

    @property
    def passes(self) -> int:
        return sum(1 for r in self.probe_runs if r.outcome == PASS)

    @property
    def failures(self) -> int:
        return sum(1 for r in self.probe_runs if r.outcome == FAIL)

    def to_json(self) -> dict:
        return {"n": self.n, "purpose": self.purpose, "units": list(self.units), "config": list(self.config),
                "outcome": self.outcome, "reason": self.reason, "restart_s": round(self.restart_s, 3),
                "probe_s": round(self.probe_s, 3),
                "restart_durations": {k: round(v, 3) for k, v in self.restart_durations.items()},
                "started_at": self.started_at, "probe": {"runs": [r.to_json() for r in self.probe_runs],
                                                          "passes": self.passes},
                "log_tail": self.log_tail[-2000:], "aborted": self.aborted, "free": self.free,
                "kind": self.kind.value, "cause": self.cause.value if self.cause else None,
                "symptom": self.symptom,
                "restart_proof": [f.to_json() for f in self.restart_proof],
                "restart_plan": self.restart_plan.to_json() if self.restart_plan else None}

    @classmethod
    def from_json(cls, d: Mapping) -> "Trial":
        """Read back a record of to_json (also of older versions: no kind, cause or free)."""
        from envbisect.trials.probe import RequestRecord

        runs = tuple(ProbeRun(r["probe"], r["kind"], Outcome(r["outcome"]), r["reason"],
                              tuple(RequestRecord(q["n"], q["ok"], q["status"], q["latency_s"], q.get("error"),
                                                  q.get("excerpt", "")) for q in r["requests"]),
                              r["duration_s"], r.get("target", ""), r.get("value"))
                     for r in d["probe"]["runs"])
        kind = TrialKind(d["kind"]) if d.get("kind") else _kind_from_purpose(d["purpose"])
        cause = Cause(d["cause"]) if d.get("cause") else None
        if cause is None and d["outcome"] == "unresolved":
            cause = Cause.SSH_LOST if "ssh connection" in d["reason"] else Cause.RESTART_FAILED
        return cls(d["n"], d["purpose"], tuple(d["units"]), tuple(d["config"]), Outcome(d["outcome"]), d["reason"],
                   runs, d["restart_s"], d["probe_s"], d.get("restart_durations", {}), d.get("started_at", 0.0),
                   d.get("log_tail", ""), d.get("aborted", False), d.get("free", False), kind, cause,
                   d.get("symptom"),
                   tuple(ServiceRestart.from_json(f) for f in d.get("restart_proof") or ()),
                   RestartPlan.from_json(d.get("restart_plan")))


def _kind_from_purpose(purpose: str) -> TrialKind:
    """The kind of a trial recorded before trials carried one (run records of older versions)."""
    for prefix, kind in (("premise: current", TrialKind.PREMISE_CURRENT),
                         ("premise: baseline", TrialKind.PREMISE_BASELINE),
                         ("bisect", TrialKind.BISECT), ("retest", TrialKind.RETEST), ("confirm", TrialKind.CONFIRM),
                         ("retry", TrialKind.RETRY), ("refine", TrialKind.REFINE), ("final", TrialKind.FINAL),
                         ("guard", TrialKind.GUARD), ("dependency", TrialKind.DEPENDENCY)):
        if purpose.startswith(prefix):
            return kind
    return TrialKind.CHECK


def probe_repeatedly(probe: Probe, transports: Mapping[str, Transport], runs: int,
                     stop_after: int = 1, tolerate: Callable[[ProbeRun], bool] | None = None
                     ) -> tuple[Outcome, tuple[ProbeRun, ...], str]:
    """Up to `runs` probe runs in the started configuration, stopping after `stop_after` failures
    (more than one on a premise: it measures how often the fault shows, which every later pass
    is judged by). Probes are cheap next to restarts, so this is where intermittent faults are caught.
    `tolerate(run)`: a failed run that fails only as the baseline does on its own (runs/symptom.py);
    it neither stops the runs nor counts as a failure, and a trial with no other failure is FAIL
    with a reason that says so (the symptom watch judges it).
    Returns PASS, FAIL, CANNOT_TEST or ABORT, the runs, and a reason."""
    done: list[ProbeRun] = []
    failed: list[ProbeRun] = []
    tolerated: list[ProbeRun] = []
    for _ in range(max(1, runs)):
        r = run_probe(probe, transports)
        done.append(r)
        if r.outcome == FAIL and tolerate is not None and tolerate(r):
            tolerated.append(r)
            continue
        if r.outcome == FAIL:
            failed.append(r)
            if len(failed) >= stop_after:
                break
            continue
        if r.outcome == CANNOT_TEST:
            return Outcome.CANNOT_TEST, tuple(done), "probe said it cannot test (exit 125)"
        if r.outcome == ABORT:
            return Outcome.ABORT, tuple(done), r.reason
        if r.outcome == BROKEN:
            return Outcome.BROKEN, tuple(done), r.reason
    if failed:
        return Outcome.FAIL, tuple(done), (f"{len(failed)}/{len(done)} probe runs failed; first: {failed[0].reason}"
                                           if len(done) > 1 else failed[0].reason)
    if tolerated:
        return Outcome.FAIL, tuple(done), (f"{len(tolerated)}/{len(done)} probe runs failed only as the baseline "
                                           f"does; first: {tolerated[0].reason}")
    return Outcome.PASS, tuple(done), f"{len(done)}/{len(done)} probe runs passed"


class TrialRunner:
    def __init__(self, playbook: Playbook, transports: Mapping[str, Transport], editor: HostEditor,
                 original: OriginalState, deltas: Sequence[Delta], contents: Mapping[str, bytes], probe: Probe,
                 units: Mapping[str, tuple[str, ...]], on_step: Callable[[str], None] | None = None,
                 evidence_dir: Path | None = None, reference_config: tuple[str, ...] = ()):
        self.playbook, self.transports, self.editor = playbook, transports, editor
        self.original, self.deltas, self.contents, self.probe = original, list(deltas), contents, probe
        self.units = units
        self.starts = StartEvidence(playbook.restart.order)  # which start commands this run saw work
        # a failed probe run that fails only as the baseline does on its own (set by the run once
        # the baseline showed such a failure; runs/symptom.SymptomWatch.tolerates)
        self.tolerate: Callable[[ProbeRun], bool] | None = None
        self.on_step = on_step or (lambda _m: None)
        self.evidence_dir = evidence_dir
        # perf probes: the reference's samples, measured in this run (never taken from memory). The
        # reference is the baseline for a bisection; a guard (does reverting the culprits cost
        # speed?) compares with the current configuration instead (reference_config: its delta ids)
        # (trials/perf.PerfJudge)
        self.perf = None
        if probe.is_perf:
            from envbisect.trials.perf_trial import PerfJudge

            self.perf = PerfJudge(probe, reference_config)
        elif probe.needs_reference:
            from envbisect.trials.probe_answers import AnswersJudge

            self.perf = AnswersJudge(probe, reference_config)
        # what the last co-restart of this runner left running (None: none yet): a restart plan's premise
        self.running: Running | None = None
        self.service_of = {d.id: d.service if d.kind is DeltaKind.ENV and d.service in playbook.services else None
                           for d in self.deltas}

    def delta_ids(self, unit_ids: Sequence[str]) -> tuple[str, ...]:
        return tuple(sorted(d for u in unit_ids for d in self.units[u]))

    def apply(self, delta_ids: Sequence[str]) -> TargetState:
        target = target_state(self.original, self.deltas, delta_ids, self.contents)
        self.editor.apply(target)
        return target

    def expected_env(self, target: TargetState) -> dict[str, dict[str, str | None]]:
        """service -> key -> the value the trial's env file gives it (a value a snapshot recorded;
        keys only known by evaluating a reference text on the host are left out): what the new
        process's environment must hold (hosts/restart.co_restart)."""
        out: dict[str, dict[str, str | None]] = {}
        for s in self.playbook.services.values():
            chk = target.checks.get((s.host, s.env_file))
            if chk is None:
                continue
            known = {e.key: e.value for e in chk.expect if e.ref is None and e.key not in chk.skipped}
            if known:
                out[s.name] = known
        return out

    def run(self, n: int, unit_ids: Sequence[str], probes: int, purpose: str, stop_after: int = 1,
            kind: TrialKind = TrialKind.CHECK) -> Trial:
        """Apply the baseline plus `unit_ids`, co-restart (what its restart plan says), probe."""
        trial = self._finish(self._run(n, unit_ids, probes, purpose, stop_after, kind))
        restarted = trial.restart_proof and trial.outcome is not Outcome.START_FAILURE and trial.cause not in (
            Cause.APPLY_FAILED, Cause.RESTART_FAILED)
        if restarted:
            self.running = Running(frozenset(trial.config), all(f.proven for f in trial.restart_proof),
                                   trial.outcome is Outcome.PASS)
        return trial

    def probe_running(self, n: int, unit_ids: Sequence[str], probes: int, purpose: str, stop_after: int = 1,
                      kind: TrialKind = TrialKind.PREMISE_CURRENT) -> Trial:
        """Probe the stack as it runs, with no edit and no restart: only for the current
        configuration, and only when every process verifiably runs its files (the caller checks)."""
        config = self.delta_ids(unit_ids)
        base = Trial(n, purpose, tuple(unit_ids), config, Outcome.UNRESOLVED, "", started_at=time.time(), free=True,
                     kind=kind)
        self.on_step(f"probing the running stack, no restart ({self.probe.name}, up to {probes} run(s))")
        p0 = time.monotonic()
        try:
            self.editor.guard()  # the files must still be what the diff saw
            outcome, runs, reason = self._probe(config, probes, stop_after)
            self.editor.guard()
        except RemoteError as e:
            self.running = None
            return self._finish(replace(base, reason=f"probe could not run: {e}", cause=Cause.PROBE_ERROR))
        trial = self._probed(base, outcome, runs, reason, time.monotonic() - p0)
        if self.running is not None:  # a probe that did not pass may leave an engine wedged
            self.running = replace(self.running, probe_passed=trial.outcome is Outcome.PASS)
        return self._finish(trial)

    def _probe(self, config: tuple[str, ...], probes: int, stop_after: int
               ) -> tuple[Outcome, tuple[ProbeRun, ...], str]:
        """Pass/fail probe runs; for a perf probe, samples judged against the baseline's (perf.py). A
        probe whose every request was refused by a port no service listens on never reached the
        stack: broken, not a failure (trials/probe_check.py)."""
        if self.perf is not None and self.probe.kind == "answers":  # runs as asked, judged together
            outcome, runs, reason = self.perf.judge_start(self.transports, config, runs=probes)
        elif self.perf is not None:
            outcome, runs, reason = self.perf.judge_start(self.transports, config)
        else:
            outcome, runs, reason = probe_repeatedly(self.probe, self.transports, probes, stop_after, self.tolerate)
        why = unreached(self.probe, runs, self.playbook) if outcome is Outcome.FAIL else None
        return (Outcome.BROKEN, runs, why) if why else (outcome, runs, reason)

    def _finish(self, trial: Trial) -> Trial:
        dead = [h for h, t in self.transports.items() if not t.alive()]
        if dead and trial.cause is not Cause.SSH_LOST:
            # A failure seen through a dropped connection is evidence of nothing.
            trial = replace(trial, outcome=Outcome.UNRESOLVED, cause=Cause.SSH_LOST,
                            reason=f"lost the ssh connection to {', '.join(dead)} during the trial ({trial.reason})")
        if self.evidence_dir is not None:
            capture_evidence(self.playbook, self.transports, self.evidence_dir / f"trial-{trial.n:03d}")
        return trial

    @staticmethod
    def _probed(base: Trial, outcome: Outcome, runs: tuple[ProbeRun, ...], reason: str, probe_s: float) -> Trial:
        if outcome is Outcome.CANNOT_TEST:
            return replace(base, outcome=Outcome.UNRESOLVED, cause=Cause.CANNOT_TEST, reason=reason, probe_runs=runs,
                           probe_s=probe_s)
        if outcome is Outcome.ABORT:
            return replace(base, outcome=Outcome.UNRESOLVED, cause=Cause.ABORTED, reason=reason, probe_runs=runs,
                           probe_s=probe_s, aborted=True)
        if outcome is Outcome.BROKEN:  # no evidence at all: the bisection stops (bisect.py)
            return replace(base, outcome=Outcome.UNRESOLVED, cause=Cause.PROBE_BROKEN, reason=reason,
                           probe_runs=runs, probe_s=probe_s)
        return replace(base, outcome=outcome, reason=reason, probe_runs=runs, probe_s=probe_s)

    def _run(self, n: int, unit_ids: Sequence[str], probes: int, purpose: str, stop_after: int,
             kind: TrialKind) -> Trial:
        config = self.delta_ids(unit_ids)
        base = Trial(n, purpose, tuple(unit_ids), config, Outcome.UNRESOLVED, "", started_at=time.time(), kind=kind)
        t0 = time.monotonic()
        plan = self.plan(config, kind)
        base = replace(base, restart_plan=plan)
        self.running = None  # until this trial's co-restart has proved what runs (run())
        try:
            self.on_step(f"applying {len(config)} of {len(self.deltas)} deltas")
            target = self.apply(config)
        except RemoteError as e:
            return replace(base, reason=f"could not apply: {e}", cause=Cause.APPLY_FAILED)
        if not plan.full:
            self.on_step(f"restarting {', '.join(plan.services)} only: {plan.why}")
        # a HostConflict (someone else changed a host) is not a trial outcome: it stops the run
        rs: RestartResult = co_restart(self.playbook, self.transports, on_step=self.on_step, guard=self.editor.guard,
                                       expect_env=self.expected_env(target), only=plan.services)
        base = replace(base, restart_s=time.monotonic() - t0, restart_durations=rs.durations,
                       restart_proof=rs.services)
        start_exit = self.starts.saw(n, config, rs)
        if start_exit is not None:
            outcome, why = start_exit
            return replace(base, outcome=outcome, reason=why, log_tail=rs.log_tail,
                           cause=Cause.RESTART_FAILED if outcome is Outcome.UNRESOLVED else None)
        if not rs.ok:
            if rs.failure == "start-failure":
                return replace(base, outcome=Outcome.START_FAILURE, reason=rs.message, log_tail=rs.log_tail)
            return replace(base, reason=rs.message, log_tail=rs.log_tail, cause=Cause.RESTART_FAILED)
        self.on_step(f"probing ({self.probe.name}, up to {probes} run(s))")
        p0 = time.monotonic()
        try:
            outcome, runs, reason = self._probe(config, probes, stop_after)
        except RemoteError as e:
            return replace(base, reason=f"probe could not run: {e}", cause=Cause.PROBE_ERROR)
        # the configuration probed must still be the one asked for (someone may have edited a file meanwhile)
        try:
            self.editor.guard()
        except RemoteError:
            pass  # a lost connection: _finish makes the trial unresolved
        return self._probed(base, outcome, runs, reason, time.monotonic() - p0)

    def plan(self, config: Sequence[str], kind: TrialKind) -> RestartPlan:
        """What a trial of `config` restarts (trials/restart_plan.py)."""
        why = ""
        if not config:
            why = "the baseline: a not-config verdict stands on every service restarted in it"
        elif self.perf is not None:
            why = f"a {self.probe.kind} probe judges each configuration by its own process starts"
        elif kind is TrialKind.PREMISE_BASELINE:
            why = "a premise restarts every service"
        return plan_restart(self.playbook, config, self.service_of, self.running, why)


def capture_evidence(playbook: Playbook, transports: Mapping[str, Transport], out: Path) -> None:
    """Log tail and /metrics of every service, right after a trial. Best effort: evidence must
    never turn a trial into a failure. Written raw (0600); the bundle redacts secrets. The log
    tails of one host come in one round trip."""
    from envbisect.hosts.agent_calls import run_ops, unb64
    from envbisect.hosts.urls import fetch
    from envbisect.state.store import write_private

    def failed(name: str, e: BaseException) -> None:
        write_private(out / f"{name}.error.txt", f"{type(e).__name__}: {e}".encode())

    by_host: dict[str, list[str]] = {}
    for name, s in playbook.services.items():
        if s.log and s.host in transports:
            by_host.setdefault(s.host, []).append(name)
    for host, names in by_host.items():
        paths = sorted({playbook.services[n].log for n in names})
        try:
            got = run_ops(transports[host], [{"op": "tail", "paths": paths, "bytes": 16384}])[0]
        except Exception as e:  # noqa: BLE001 - evidence is best effort
            for n in names:
                failed(n, e)
            continue
        for n in names:
            data = unb64(got.get(playbook.services[n].log)) or b""
            try:
                write_private(out / f"{n}.log.txt", data.decode("utf-8", "replace").encode())
            except OSError as e:
                failed(n, e)
    for name, s in playbook.services.items():
        t = transports.get(s.host)
        if t is None or not s.metrics:
            continue
        try:
            got = fetch(t, s.metrics, insecure=s.insecure)
            note = f"\n# envbisect: {got.cut_note()}\n".encode() if got.cut else b""
            write_private(out / f"{name}.metrics.txt", got.body + note)
        except Exception as e:  # noqa: BLE001 - evidence is best effort
            failed(name, e)
