"""The proof a not-config verdict stands on: the baseline trial really was the baseline.

"The baseline fails too, so the configuration is not the cause" holds only when the trial called
the baseline had the baseline's configuration. A hotfix left in place, an excluded delta or a file
envbisect could not read makes that trial something else, and its failure says nothing: such a
verdict was a guilty change exonerated (issue 21). So a not-config verdict carries this proof, and
without it the verdict is inconclusive, naming what stayed:

- every file and HEAD envbisect saw differ was at its baseline bytes in the baseline trial: each
  delta of the diff is one the run applied (none excluded, none unreadable, none left as found),
  and the bytes each file had to hold (sha256) were checked on the host by the trial's apply (in
  the same batch as the write) and again before and after the probe (`HostEditor.guard`);
- every service was started after the edit: the baseline trial co-restarted the stack (a probe of
  the running stack proves nothing about the baseline). Whether each started process is a new one
  and the old one is gone is the restart's own proof (hosts/restart.py): `ServiceProof.old_pid`,
  `new_pid` and `old_pid_gone` are the facts it fills (`restart_facts`); None means not checked
  here, which the proof shows and does not count against the verdict;
- the probe reached the stack: a command probe ran (not exit 126/127, trials/probe_check.py); an
  HTTP probe got an answer, or hung on an open connection, or was refused by a port a service of
  the playbook listens on.

Pure: built from the run's deltas, trials and notes; no I/O.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

from envbisect.inputs.playbook import Playbook, Probe
from envbisect.outcome import Cause, Outcome
from envbisect.search import TrialKind, Verdict
from envbisect.state.configuration import OriginalState, target_state
from envbisect.state.deltas import Delta
from envbisect.trials.probe_check import service_ports
from envbisect.hosts.restart import split_url

# the diff's notes that name a part of the configuration seen to differ (or unreadable) that no
# delta covers, so a baseline trial cannot have put it back (state/deltas.py writes them)
UNSEEN_MARKS = ("its deltas are unknown", "its delta is unknown", ": cannot read (")


@dataclass(frozen=True)
class FileProof:
    """One delta of the run, in the baseline trial: the state it had to be in, and whether that was checked."""

    delta: str
    host: str
    path: str
    baseline: str | None  # sha256 of the bytes the file had to hold (None: absent); a commit for a repo
    verified: bool  # held after the apply, checked by hash on the host

    def to_json(self) -> dict[str, Any]:
        return {"delta": self.delta, "host": self.host, "path": self.path, "baseline": self.baseline,
                "verified": self.verified}


@dataclass(frozen=True)
class ServiceProof:
    """One service in the baseline trial. `restarted_in`: the trial whose co-restart started it after
    the edit. The pid facts are the restart's (hosts/restart.py fills them through `restart_facts`);
    None: not checked by this version."""

    service: str
    host: str
    restarted_in: int | None
    old_pid: int | None = None
    new_pid: int | None = None
    old_pid_gone: bool | None = None

    @property
    def ok(self) -> bool:
        if self.restarted_in is None or self.old_pid_gone is False:
            return False
        return not (self.old_pid is not None and self.new_pid is not None and self.old_pid == self.new_pid)

    def to_json(self) -> dict[str, Any]:
        return {"service": self.service, "host": self.host, "restarted_in_trial": self.restarted_in,
                "old_pid": self.old_pid, "new_pid": self.new_pid, "old_pid_gone": self.old_pid_gone, "ok": self.ok}


@dataclass(frozen=True)
class BaselineProof:
    trial: int | None  # the baseline trial the proof is about (None: there was none with a restart)
    files: tuple[FileProof, ...]
    services: tuple[ServiceProof, ...]
    probe_reached: bool
    stayed: tuple[str, ...]  # what was seen to differ and was not put back, each with why

    @property
    def reproduced(self) -> bool:
        return (self.trial is not None and not self.stayed and all(f.verified for f in self.files)
                and all(s.ok for s in self.services) and self.probe_reached)

    def problems(self) -> list[str]:
        """Why the baseline trial was not the baseline (empty when it was)."""
        out = list(self.stayed)
        if self.trial is None:
            out.append("no baseline trial co-restarted the stack")
        out += [f"{f.delta}: not verified at its baseline bytes" for f in self.files if not f.verified]
        out += [f"{s.service}: not shown to be a new process started after the edit" for s in self.services
                if not s.ok and self.trial is not None]
        if not self.probe_reached:
            out.append("the probe never reached the stack")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"reproduced": self.reproduced, "trial": self.trial, "files": [f.to_json() for f in self.files],
                "services": [s.to_json() for s in self.services], "probe_reached": self.probe_reached,
                "stayed": list(self.stayed), "problems": self.problems()}

    def lines(self) -> list[str]:
        """For people: what the proof shows, one fact a line."""
        if not self.reproduced:  # the verdict's explanation names what stayed
            return []
        n = self.trial
        out = [f"baseline proof (trial {n}): {len(self.files)} delta(s) at their baseline bytes, sha256 checked "
               "on the host after the write and after the probe"]
        for f in self.files:
            out.append(f"  {f.delta}: {'absent' if f.baseline is None else f.baseline[:12]}")
        out.append("  services started after the edit: " + ", ".join(
            s.service + (f" (pid {s.old_pid} -> {s.new_pid})" if s.new_pid is not None else "")
            for s in self.services))
        out.append("  the probe reached the stack")
        return out


def baseline_trial(trials: Sequence[Any]) -> Any | None:
    """The last resolved baseline trial that restarted the stack (a premise or re-test with no delta)."""
    for t in reversed(trials):
        if not t.config and not t.free and t.kind not in (TrialKind.GUARD, TrialKind.FINAL, TrialKind.REFINE) \
                and t.outcome is not Outcome.UNRESOLVED:
            return t
    return None


def probe_reached(probe: Probe, trial: Any, playbook: Playbook) -> bool:
    """Did the baseline trial's probe reach the stack (see the module docstring)?"""
    runs = list(trial.probe_runs)
    if not runs:
        return trial.outcome is Outcome.START_FAILURE  # a service of the stack died: the stack answered
    if any(r.outcome is Outcome.BROKEN or r.outcome == "broken-probe" for r in runs):
        return False
    if probe.kind == "command":
        return True
    ports = {p for _h, p in service_ports(playbook)}
    port = split_url(probe.url)[1] if probe.url else None
    for r in runs:
        for q in r.requests:
            if q.status is not None or (q.error or "").startswith("no answer within") or q.ok:
                return True
            if "ConnectError" in (q.error or "") and port in ports:
                return True
    return False


def build_proof(*, seen: Iterable[str], deltas: Sequence[Delta], original: OriginalState,
                contents: Mapping[str, bytes], trials: Sequence[Any], playbook: Playbook, probe: Probe,
                diff_notes: Iterable[str], conflicts: Iterable[Mapping[str, Any]],
                restart_facts: Mapping[str, Mapping[str, Any]] | None = None) -> BaselineProof:
    """The proof for a run's baseline trial. `seen`: the id of every delta of the diff (the run's and
    those it left out); `restart_facts`: per service, what the restart proved ({old_pid, new_pid,
    old_pid_gone}; hosts/restart.py), when it did."""
    run_ids = {d.id for d in deltas}
    stayed = [f"{i}: left out of the run (--only/--exclude), so the baseline trial kept its current state"
              for i in sorted(set(seen) - run_ids)]
    stayed += [f"not put back: {n}" for n in diff_notes if any(m in n for m in UNSEEN_MARKS)]
    stayed += [f"{c.get('host')}:{c.get('path')}: {c.get('why', 'changed by someone else')}: left as found"
               for c in conflicts]
    t = baseline_trial(trials)
    files: list[FileProof] = []
    if deltas:
        target = target_state(original, deltas, [], contents)
        for d in deltas:
            key = (d.host, d.path)
            if d.kind == "git":
                rt = target.repos.get(key)
                files.append(FileProof(d.id, d.host, d.path, rt.commit if rt else None, t is not None))
                continue
            data = target.files.get(key)
            sha = None if data is None else hashlib.sha256(data).hexdigest()
            files.append(FileProof(d.id, d.host, d.path, sha, t is not None))
    facts = restart_facts or {}
    services = tuple(
        ServiceProof(name, svc.host, t.n if t is not None else None,
                     **{k: facts.get(name, {}).get(k) for k in ("old_pid", "new_pid", "old_pid_gone")})
        for name, svc in playbook.services.items())
    reached = t is not None and probe_reached(probe, t, playbook)
    return BaselineProof(t.n if t is not None else None, tuple(files), services, reached, tuple(stayed))


def not_reproduced(verdict: Verdict, proof: BaselineProof) -> Verdict:
    """A not-config verdict whose baseline trial was not the baseline becomes inconclusive, and says
    what stayed: "the config is not the cause" was never shown."""
    what = "; ".join(proof.problems())
    return replace(verdict, kind="inconclusive", culprits=(), terms=(), explanation=(
        f"The baseline could not be reproduced, so its failure says nothing about the configuration: {what}. "
        "Not a not-config verdict: bisect again with every delta (no --exclude/--only), or put back what "
        "stayed by hand first."))


__all__ = ["BaselineProof", "FileProof", "ServiceProof", "build_proof", "not_reproduced", "baseline_trial"]
