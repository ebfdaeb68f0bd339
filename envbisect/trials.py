"""Trials: apply a configuration, co-restart, probe. The I/O half of the bisection.

The search (search.py) says which configuration to try and how many probe runs it deserves; this
module makes it so on the hosts and reports what happened as a `Trial`. Infrastructure trouble
(SSH lost, a start command that cannot run) makes a trial `unresolved`, never `fail`: blaming a
delta for a broken network is exactly the wrong-culprit mistake this tool exists to prevent.
"""
from __future__ import annotations

import time
from pathlib import Path
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

from .configuration import OriginalState, target_state
from .deltas import Delta
from .errors import RemoteError
from .journal import HostEditor
from .playbook import Playbook, Probe
from .probe import ABORT, CANNOT_TEST, FAIL, PASS, ProbeRun, run_probe
from .restart import RestartResult, co_restart
from .transport import Transport

OUTCOMES = ("pass", "fail", "start-failure", "unresolved")


@dataclass(frozen=True)
class Trial:
    n: int
    purpose: str
    units: tuple[str, ...]
    config: tuple[str, ...]  # delta ids applied on top of the baseline
    outcome: str  # pass | fail | start-failure | unresolved
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

    @property
    def passes(self) -> int:
        return sum(1 for r in self.probe_runs if r.outcome == PASS)

    @property
    def failures(self) -> int:
        return sum(1 for r in self.probe_runs if r.outcome == FAIL)

    def to_json(self) -> dict:
        return {"n": self.n, "purpose": self.purpose, "units": list(self.units), "config": list(self.config),
                "outcome": self.outcome, "reason": self.reason, "restart_s": round(self.restart_s, 3),
                "probe_s": round(self.probe_s, 3), "restart_durations": {k: round(v, 3) for k, v in self.restart_durations.items()},
                "started_at": self.started_at, "probe": {"runs": [r.to_json() for r in self.probe_runs],
                                                          "passes": self.passes},
                "log_tail": self.log_tail[-2000:], "aborted": self.aborted, "free": self.free}


def probe_repeatedly(probe: Probe, transports: Mapping[str, Transport], runs: int,
                     stop_after: int = 1) -> tuple[str, tuple[ProbeRun, ...], str]:
    """Up to `runs` probe runs in the started configuration, stopping after `stop_after` failures
    (more than one on a premise: it measures how often the fault shows, which every later pass
    is judged by). Probes are cheap next to restarts, so this is where intermittent faults are caught."""
    done: list[ProbeRun] = []
    failed: list[ProbeRun] = []
    for _ in range(max(1, runs)):
        r = run_probe(probe, transports)
        done.append(r)
        if r.outcome == FAIL:
            failed.append(r)
            if len(failed) >= stop_after:
                break
            continue
        if r.outcome == CANNOT_TEST:
            return "unresolved", tuple(done), "probe said it cannot test (exit 125)"
        if r.outcome == ABORT:
            return "abort", tuple(done), r.reason
    if failed:
        return "fail", tuple(done), (f"{len(failed)}/{len(done)} probe runs failed; first: {failed[0].reason}"
                                     if len(done) > 1 else failed[0].reason)
    return "pass", tuple(done), f"{len(done)}/{len(done)} probe runs passed"


class TrialRunner:
    def __init__(self, playbook: Playbook, transports: Mapping[str, Transport], editor: HostEditor,
                 original: OriginalState, deltas: Sequence[Delta], contents: Mapping[str, bytes], probe: Probe,
                 units: Mapping[str, tuple[str, ...]], on_step: Callable[[str], None] | None = None,
                 evidence_dir: Path | None = None):
        self.playbook, self.transports, self.editor = playbook, transports, editor
        self.original, self.deltas, self.contents, self.probe = original, list(deltas), contents, probe
        self.units = units
        self.on_step = on_step or (lambda _m: None)
        self.evidence_dir = evidence_dir

    def delta_ids(self, unit_ids: Sequence[str]) -> tuple[str, ...]:
        return tuple(sorted(d for u in unit_ids for d in self.units[u]))

    def apply(self, delta_ids: Sequence[str]) -> None:
        self.editor.apply(target_state(self.original, self.deltas, delta_ids, self.contents))

    def run(self, n: int, unit_ids: Sequence[str], probes: int, purpose: str, stop_after: int = 1) -> Trial:
        trial = self._run(n, unit_ids, probes, purpose, stop_after)
        dead = [h for h, t in self.transports.items() if not t.alive()]
        if dead and trial.outcome != "unresolved":
            # A failure seen through a dropped connection is evidence of nothing.
            trial = replace(trial, outcome="unresolved",
                            reason=f"lost the ssh connection to {', '.join(dead)} during the trial ({trial.reason})")
        if self.evidence_dir is not None:
            capture_evidence(self.playbook, self.transports, self.evidence_dir / f"trial-{n:03d}")
        return trial

    def probe_running(self, n: int, unit_ids: Sequence[str], probes: int, purpose: str, stop_after: int = 1) -> Trial:
        """Probe the stack as it runs, with no edit and no restart: only for the current
        configuration, and only when every process verifiably runs its files (the caller checks)."""
        config = self.delta_ids(unit_ids)
        started = time.time()
        self.on_step(f"probing the running stack, no restart ({self.probe.name}, up to {probes} run(s))")
        p0 = time.monotonic()
        try:
            self.editor.guard()  # the files must still be what the diff saw
            outcome, runs, reason = probe_repeatedly(self.probe, self.transports, probes, stop_after)
            self.editor.guard()
        except RemoteError as e:
            trial = Trial(n, purpose, tuple(unit_ids), config, "unresolved", f"probe could not run: {e}",
                          started_at=started, free=True)
        else:
            aborted = outcome == "abort"
            trial = Trial(n, purpose, tuple(unit_ids), config, "unresolved" if aborted else outcome, reason, runs,
                          0.0, time.monotonic() - p0, {}, started, aborted=aborted, free=True)
        if self.evidence_dir is not None:
            capture_evidence(self.playbook, self.transports, self.evidence_dir / f"trial-{n:03d}")
        return trial

    def _run(self, n: int, unit_ids: Sequence[str], probes: int, purpose: str, stop_after: int = 1) -> Trial:
        config = self.delta_ids(unit_ids)
        started = time.time()
        t0 = time.monotonic()
        try:
            self.on_step(f"applying {len(config)} of {len(self.deltas)} deltas")
            self.apply(config)
        except RemoteError as e:
            return Trial(n, purpose, tuple(unit_ids), config, "unresolved", f"could not apply: {e}", started_at=started)
        # a HostConflict (someone else changed a host) is not a trial outcome: it stops the run
        rs: RestartResult = co_restart(self.playbook, self.transports, on_step=self.on_step, guard=self.editor.guard)
        restart_s = time.monotonic() - t0
        if not rs.ok:
            outcome = "start-failure" if rs.failure == "start-failure" else "unresolved"
            return Trial(n, purpose, tuple(unit_ids), config, outcome, rs.message, restart_s=restart_s,
                         restart_durations=rs.durations, started_at=started, log_tail=rs.log_tail)
        self.on_step(f"probing ({self.probe.name}, up to {probes} run(s))")
        p0 = time.monotonic()
        try:
            outcome, runs, reason = probe_repeatedly(self.probe, self.transports, probes, stop_after)
        except RemoteError as e:
            return Trial(n, purpose, tuple(unit_ids), config, "unresolved", f"probe could not run: {e}",
                         restart_s=restart_s, restart_durations=rs.durations, started_at=started)
        # the configuration probed must still be the one asked for (someone may have edited a file meanwhile)
        try:
            self.editor.guard()
        except RemoteError:
            pass  # a lost connection: run() makes the trial unresolved
        aborted = outcome == "abort"
        if aborted:
            outcome = "unresolved"
        return Trial(n, purpose, tuple(unit_ids), config, outcome, reason, runs, restart_s, time.monotonic() - p0,
                     rs.durations, started, aborted=aborted)


def capture_evidence(playbook: Playbook, transports: Mapping[str, Transport], out: Path) -> None:
    """Log tail and /metrics of every service, right after a trial. Best effort: evidence must
    never turn a trial into a failure. Written raw (0600); the bundle redacts secrets."""
    from .restart import fetch, log_tail
    from .store import write_private

    for name, s in playbook.services.items():
        t = transports.get(s.host)
        if t is None:
            continue
        try:
            if s.log:
                write_private(out / f"{name}.log.txt", log_tail(t, s, 16384).encode())
            if s.metrics:
                write_private(out / f"{name}.metrics.txt", fetch(t, s.metrics).text.encode())
        except (RemoteError, OSError, Exception) as e:  # noqa: BLE001 - evidence is best effort
            write_private(out / f"{name}.error.txt", f"{type(e).__name__}: {e}".encode())
