"""`envbisect restore [--run ID]`: undo an interrupted or crashed run from the journal it left on
the hosts, then co-restart; what is put back is only what is provably envbisect's own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from envbisect.hosts.journal import HostEditor, describe_conflict, find_journal, journal_dir
from envbisect.hosts.restart import co_restart, service_states
from envbisect.runs.deployment import Deployment
from envbisect.runs.signals import shield_signals
from envbisect.state.store import private_dir


@dataclass(frozen=True)
class RestoreResult:
    """What `restore` did, or with ``dry_run`` would do. ``run`` None: no journal, nothing to undo
    (``reason`` says why). ``files``/``repos``: the journaled resources, each {host, path, existed}
    or {host, path, head}. ``conflicts``: resources someone else changed, left as found."""

    restored: bool
    run: str | None = None
    reason: str = ""
    dry_run: bool = False
    files: tuple[Mapping[str, Any], ...] = ()
    repos: tuple[Mapping[str, Any], ...] = ()
    restart_order: tuple[str, ...] = ()
    co_restart_ok: bool = True
    co_restart: str = "ok"
    conflicts: tuple[Mapping[str, Any], ...] = ()
    error: bool = False  # a fleet replica that could not be restored (``reason``: the error)

    def to_json(self) -> dict[str, Any]:
        if self.run is None or self.error:
            return {"restored": False, "reason": self.reason, **({"dry_run": True} if self.dry_run else {}),
                    **({"error": True} if self.error else {})}
        if self.dry_run:
            return {"restored": False, "dry_run": True, "run": self.run, "files": [dict(f) for f in self.files],
                    "repos": [dict(r) for r in self.repos], "restart_order": list(self.restart_order)}
        return {"restored": True, "run": self.run, "files": len(self.files), "repos": len(self.repos),
                "co_restart_ok": self.co_restart_ok, "co_restart": self.co_restart,
                "conflicts": [dict(c) for c in self.conflicts]}


def restore_deployment(dep: Deployment, *, run_id: str | None = None, break_lock: bool = False,
                       on_event: Callable[[str, dict], None] | None = None, dry_run: bool = False) -> RestoreResult:
    """`envbisect restore [--run ID]`: undo an interrupted or crashed run from its journal, then
    co-restart. The lock is taken first; refused while the run that owns the journal is alive.
    Resources someone else changed meanwhile are left as found and listed under "conflicts".
    `dry_run`: say what would be put back, and whether the lock could be taken; write nothing."""
    ev = on_event or (lambda _k, _d: None)
    stale: list[str] = []
    journal = find_journal(dep.playbook, dep.transports, dep.store.runs_dir, run_id, notes=stale)
    for note in stale:
        ev("warning", {"message": note})
    if journal is None:
        why = f"run {run_id} has no active journal" if run_id else "no active journal for this deployment"
        return RestoreResult(False, reason=f"{why}: nothing to undo", dry_run=dry_run)
    files = tuple({"host": h, "path": p, "existed": f.exists} for (h, p), f in sorted(journal.original.files.items()))
    repos = tuple({"host": h, "path": p, "head": r.head} for (h, p), r in sorted(journal.original.repos.items()))
    if dry_run:
        HostEditor(dep.playbook, dep.transports, dep.store.runs_dir / "-", "", heartbeat_s=0).lock(
            restoring=journal.run_id, break_lock=break_lock, dry=True)
        return RestoreResult(False, journal.run_id, dry_run=True, files=files, repos=repos,
                             restart_order=tuple(dep.playbook.restart.order))
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
                            guard=editor.guard, best_effort=True)
            editor.finish()
    except BaseException:
        editor.stop_heartbeat()  # the lock stays until the hosts are consistent; restore again
        raise
    editor.unlock()
    return RestoreResult(True, journal.run_id, files=files, repos=repos, co_restart_ok=rs.ok,
                         co_restart=(f"{rs.message}; each service: {service_states(rs)}" if not rs.ok else "ok"),
                         conflicts=tuple(conflicts))


__all__ = ["RestoreResult", "restore_deployment"]
