"""The proof a not-config verdict stands on: the baseline trial really was the baseline.

"The baseline fails too, so the configuration is not the cause" holds only when the trial called
the baseline had the baseline's configuration. A hotfix left in place, an excluded delta or a file
envbisect could not read makes that trial something else, and its failure says nothing: such a
verdict would exonerate a guilty change. So a not-config verdict carries this proof, and
without it the verdict is inconclusive, naming what stayed:

- every file and HEAD envbisect saw differ was at its baseline bytes in the baseline trial: each
  delta of the diff is one the run applied (none excluded, none unreadable, none left as found),
  and the bytes each file had to hold (sha256) were checked on the host by the trial's apply (in
  the same batch as the write) and again before and after the probe (`HostEditor.guard`);
- every service was started after the edit: the baseline trial co-restarted the stack (a probe of
  the running stack proves nothing about the baseline). Whether each started process is a new one,
  started after the stop, running the baseline's environment, and the old one is gone, is the
  restart's own proof (hosts/restart.py, `Trial.restart_proof`): `restart_facts(trial)` gives it
  per service, and the proof cites it. A service whose playbook gives no pid_file cannot be proven
  so: its line says "not proven: no pid file", and that does not block the verdict (pid_file is
  optional in a playbook: blocking would make not-config impossible there; docs/safety.md). A fact
  that contradicts the restart (the old pid survived, the same process answered) blocks it;
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
from envbisect.outcome import Outcome, VerdictKind
from envbisect.search import TrialKind, Verdict
from envbisect.state.configuration import OriginalState, target_state
from envbisect.state.deltas import Delta
from envbisect.state.sourced import CANNOT_SEE, NOT_LOOKED
from envbisect.state.upgrades import UNTESTED_UPGRADE
from envbisect.trials.probe_check import service_ports
from envbisect.hosts.urls import split_url

# the diff's notes that name a part of the configuration seen to differ (or unreadable) that no
# delta covers, so a baseline trial cannot have put it back (state/deltas.py writes them), and a file
# an env file sources that envbisect cannot see or the baseline did not look at (state/sourced.py):
# it may hold the cause and have stayed
UNSEEN_MARKS = ("its deltas are unknown", "its delta is unknown", ": cannot read (", CANNOT_SEE, NOT_LOOKED,
                UNTESTED_UPGRADE)


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
    started_after_stop_s: float | None = None
    env_checked: tuple[str, ...] = ()  # keys of the new process's environment found at the baseline's values
    env_unchecked: str = ""  # why its environment could not be compared
    proven: bool | None = None  # the restart proved it (None: no facts, a record of an older version)
    problem: str = ""  # why not proven, as the restart said it

    @property
    def unprovable(self) -> bool:
        """No pid file: envbisect cannot tell the process apart (said, not held against the verdict)."""
        return "no pid_file" in self.problem

    @property
    def ok(self) -> bool:
        if self.restarted_in is None or self.old_pid_gone is False:
            return False
        if self.proven is False and not self.unprovable:
            return False
        return not (self.old_pid is not None and self.new_pid is not None and self.old_pid == self.new_pid)

    def describe(self) -> str:
        """One service's restart as the proof cites it."""
        if self.unprovable:
            return f"{self.service}: not proven: no pid file (a co-restart ran; the process is not told apart)"
        if self.proven is None:
            return f"{self.service}: restarted (this record holds no pid facts)"
        if not self.ok:
            return f"{self.service}: not proven: {self.problem or 'not a new process'}"
        old = (f"pid {self.old_pid} gone" if self.old_pid is not None and self.old_pid_gone
               else "no process before")
        after = ("" if self.started_after_stop_s is None
                 else f", started {self.started_after_stop_s:.1f} s after the stop")
        env = (f", environment checked: {', '.join(self.env_checked)}" if self.env_checked
               else f", environment not checked: {self.env_unchecked}" if self.env_unchecked
               else ", no environment key to check")
        return f"{self.service}: {old}, new pid {self.new_pid}{after}{env}"

    def to_json(self) -> dict[str, Any]:
        return {"service": self.service, "host": self.host, "restarted_in_trial": self.restarted_in,
                "old_pid": self.old_pid, "new_pid": self.new_pid, "old_pid_gone": self.old_pid_gone,
                "started_after_stop_s": self.started_after_stop_s, "env_checked": list(self.env_checked),
                "env_unchecked": self.env_unchecked, "proven": self.proven, "problem": self.problem,
                "ok": self.ok, "text": self.describe()}


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
        out += [f"{s.service}: not shown to be a new process started after the edit"
                + (f" ({s.problem})" if s.problem else "")
                for s in self.services if not s.ok and self.trial is not None]
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
        out.append(f"  every service co-restarted after the edit (trial {n}):")
        out += [f"    {s.describe()}" for s in self.services]
        out.append("  the probe reached the stack")
        return out


FACT_KEYS = ("old_pid", "new_pid", "old_pid_gone", "started_after_stop_s", "env_checked", "env_unchecked",
             "proven", "problem")


def restart_facts(trial: Any | None) -> dict[str, dict[str, Any]]:
    """Per service, what the co-restart of `trial` proved (`Trial.restart_proof`), as `build_proof`
    takes it; empty for no trial, a free trial or a record of an older version."""
    out: dict[str, dict[str, Any]] = {}
    for f in getattr(trial, "restart_proof", ()) or ():
        out[f.service] = {"old_pid": f.old_pid, "new_pid": f.new_pid, "old_pid_gone": f.old_gone,
                          "started_after_stop_s": f.started_after_stop_s, "env_checked": tuple(f.env_checked),
                          "env_unchecked": f.env_unchecked, "proven": f.proven, "problem": f.problem}
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
                     **{k: v for k, v in facts.get(name, {}).items() if k in FACT_KEYS})
        for name, svc in playbook.services.items())
    reached = t is not None and probe_reached(probe, t, playbook)
    return BaselineProof(t.n if t is not None else None, tuple(files), services, reached, tuple(stayed))


def not_reproduced(verdict: Verdict, proof: BaselineProof) -> Verdict:
    """A not-config verdict whose baseline trial was not the baseline becomes inconclusive, and says
    what stayed: "the config is not the cause" was never shown."""
    what = "; ".join(proof.problems())
    return replace(verdict, kind=VerdictKind.INCONCLUSIVE.value, culprits=(), terms=(), explanation=(
        f"The baseline could not be reproduced, so its failure says nothing about the configuration: {what}. "
        "Not a not-config verdict: bisect again with every delta (no --exclude/--only), or put back what "
        "stayed by hand first."))


__all__ = ["BaselineProof", "FileProof", "ServiceProof", "build_proof", "not_reproduced", "baseline_trial",
           "restart_facts", "unresolved_causes", "proof_from_record"]


def unresolved_causes(verdict: Verdict, trials: Sequence[Any], limit: int = 3) -> Verdict:
    """An inconclusive verdict names what left its trials unresolved, from each trial's own reason
    ("trial 4 restart-failed: decode pid 812 still running 1 s after its stop command ..."): "a trial
    stayed unresolved" alone sends the operator to the log for the one fact that matters."""
    if verdict.kind != VerdictKind.INCONCLUSIVE:
        return verdict
    seen: dict[str, list[int]] = {}
    for t in trials:
        if t.outcome is Outcome.UNRESOLVED and t.cause is not None and t.kind is not TrialKind.GUARD:
            seen.setdefault(f"{t.cause}: {t.reason}", []).append(t.n)
    if not seen:
        return verdict
    named = [f"trial{'s' if len(ns) > 1 else ''} {', '.join(map(str, ns))} {why}"
             for why, ns in list(seen.items())[-limit:]]
    more = len(seen) - len(named)
    return replace(verdict, explanation=verdict.explanation.rstrip() + " Unresolved: " + "; ".join(named)
                   + (f" (and {more} other cause(s); see the trials)" if more else "") + ".")


def _reached_in_record(trial: Any) -> bool:
    """`probe_reached` from a record alone (no playbook): a command probe ran, an HTTP probe got an
    answer or hung on an open connection. A refusal is not counted here (which port a service
    listens on is the playbook's), so a record proves less than the live run, never more."""
    runs = list(trial.probe_runs)
    if not runs:
        return trial.outcome is Outcome.START_FAILURE
    if any(r.outcome is Outcome.BROKEN or r.outcome == "broken-probe" for r in runs):
        return False
    for r in runs:
        if not r.requests:
            return True  # a command probe (or one that reports no requests) ran
        if any(q.status is not None or q.ok or (q.error or "").startswith("no answer within") for q in r.requests):
            return True
    return False


def proof_from_record(run_doc: Mapping[str, Any], trials: Sequence[Any],
                      live: Mapping[str, Any] | None) -> BaselineProof:
    """The proof for a replayed not-config (runs/replay.py): the same questions as `build_proof`,
    answered from the run folder: the diff it recorded (every delta seen, its notes), the trials as
    corrected (the baseline trial and its restart facts) and the live run's proof (`live`: the
    conflicts it met, the bytes each delta had to hold, the services it restarted). Without the
    hosts nothing is checked again: a baseline trial the live run did not prove (another trial, or
    a record without a proof) proves no file at its baseline bytes."""
    live = live or {}
    diff_doc = run_doc.get("diff") or {}
    run_ids = [d["id"] for d in run_doc.get("deltas") or ()]
    seen = [d["id"] for d in diff_doc.get("deltas") or ()] or run_ids
    stayed = [f"{i}: left out of the run (--only/--exclude), so the baseline trial kept its current state"
              for i in sorted(set(seen) - set(run_ids))]
    stayed += [f"not put back: {n}" for n in diff_doc.get("notes") or () if any(m in n for m in UNSEEN_MARKS)]
    stayed += [s for s in live.get("stayed") or () if s.endswith(": left as found") and s not in stayed]
    t = baseline_trial(trials)
    same = t is not None and live.get("trial") == t.n
    shas = {f["delta"]: f.get("baseline") for f in live.get("files") or ()}
    hosts = {d["id"]: (d.get("host", ""), d.get("path", "")) for d in run_doc.get("deltas") or ()}
    files = tuple(FileProof(i, hosts[i][0], hosts[i][1], shas.get(i),
                            t is not None and i in shas) for i in run_ids)
    facts = restart_facts(t)
    names = list(facts) or [s["service"] for s in live.get("services") or ()]
    where = {s["service"]: s.get("host", "") for s in live.get("services") or ()}
    services = tuple(ServiceProof(n, where.get(n, ""), t.n if t is not None else None,
                                  **{k: v for k, v in facts.get(n, {}).items() if k in FACT_KEYS}) for n in names)
    if t is not None and not names:
        stayed.append(f"the record names no service trial {t.n} restarted")
    if t is not None and run_ids and not shas:
        stayed.append(f"the record holds no proof that trial {t.n} put the deltas at their baseline bytes "
                      "(recorded without a not-config proof)")
    reached = t is not None and (live.get("probe_reached") if same and "probe_reached" in live
                                 else _reached_in_record(t))
    return BaselineProof(t.n if t is not None else None, files, services, bool(reached), tuple(stayed))
