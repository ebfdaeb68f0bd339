"""Journal and lock: every change envbisect makes on a host is recorded before it is made.

`HostEditor.begin` takes the deployment lock on every host, reads the exact original state of
everything the run may touch (bytes, mode, owner, mtime, HEAD and branch), and writes it to the
local store AND to the host before the first edit. `restore` puts all of it back from either
copy, so a run killed with -9 can still be undone exactly (`envbisect restore`).
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from .configuration import FileOriginal, Key, OriginalState, RepoOriginal, RepoTarget, TargetState
from .errors import LockHeld, RemoteError, UsageError
from .hostops import b64, run_ops, unb64
from .playbook import Playbook
from .snapshot import for_each_host
from .store import write_private
from .transport import Transport


def remote_paths(deployment: str) -> tuple[str, str]:
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in deployment)
    return f"~/.envbisect/{safe}.lock", f"~/.envbisect/{safe}.journal.json"


@dataclass(frozen=True)
class Journal:
    run_id: str
    deployment: str
    created_at: float
    original: OriginalState
    state: str = "active"  # active | restored

    def to_json(self) -> dict[str, Any]:
        hosts: dict[str, dict[str, Any]] = {}
        for (h, p), f in self.original.files.items():
            d = {"exists": f.exists, "mode": f.mode, "uid": f.uid, "gid": f.gid, "mtime_ns": f.mtime_ns,
                 "atime_ns": f.atime_ns, "content_b64": b64(f.content) if f.content is not None else None}
            hosts.setdefault(h, {"files": {}, "repos": {}})["files"][p] = d
        for (h, p), r in self.original.repos.items():
            hosts.setdefault(h, {"files": {}, "repos": {}})["repos"][p] = {"head": r.head, "ref": r.ref}
        return {"format": 1, "run_id": self.run_id, "deployment": self.deployment, "created_at": self.created_at,
                "state": self.state, "hosts": hosts}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Journal":
        files: dict[Key, FileOriginal] = {}
        repos: dict[Key, RepoOriginal] = {}
        for h, hd in doc["hosts"].items():
            for p, f in hd.get("files", {}).items():
                files[(h, p)] = FileOriginal(f["exists"], unb64(f.get("content_b64")), f.get("mode"), f.get("uid"),
                                             f.get("gid"), f.get("mtime_ns"), f.get("atime_ns"))
            for p, r in hd.get("repos", {}).items():
                repos[(h, p)] = RepoOriginal(r["head"], r.get("ref"))
        return cls(doc["run_id"], doc["deployment"], doc["created_at"], OriginalState(files, repos),
                   doc.get("state", "active"))


def controller_id() -> dict[str, Any]:
    return {"controller": socket.gethostname(), "pid": os.getpid()}


class HostEditor:
    """Applies target states to the hosts, journaled, and undoes them."""

    def __init__(self, playbook: Playbook, transports: Mapping[str, Transport], run_dir: Path, run_id: str):
        self.playbook, self.transports, self.run_dir, self.run_id = playbook, transports, run_dir, run_id
        self.lock_path, self.remote_journal = remote_paths(playbook.name)
        self.journal: Journal | None = None
        self.live: dict[Key, bytes | None] = {}
        self.live_repos: dict[Key, tuple[str, str | None]] = {}

    @property
    def local_journal(self) -> Path:
        return self.run_dir / "journal.json"

    # --- lock ----------------------------------------------------------------------------------
    def lock(self, *, force: bool = False, stale_after_s: float = 3600) -> None:
        me = {"run_id": self.run_id, "started_at": time.time(), **controller_id()}
        locked: list[str] = []
        try:
            for h, t in self.transports.items():
                res = run_ops(t, [{"op": "lock", "path": self.lock_path, "owner": me, "force": force,
                                   "stale_after_s": stale_after_s}])[0]
                if not res.get("locked"):
                    held = res.get("held_by", {})
                    raise LockHeld(
                        f"{h}: deployment {self.playbook.name!r} is locked by run {held.get('run_id')} "
                        f"(controller {held.get('controller')}, pid {held.get('pid')}, {int(res.get('age_s', 0))} s ago); "
                        "wait for it, or if it crashed run `envbisect restore`")
                locked.append(h)
        except BaseException:
            for h in locked:
                self._unlock_host(h)
            raise

    def _unlock_host(self, host: str) -> None:
        try:
            run_ops(self.transports[host], [{"op": "unlock", "path": self.lock_path, "run_id": self.run_id}])
        except RemoteError:
            pass

    def unlock(self) -> None:
        for h in self.transports:
            self._unlock_host(h)

    # --- journal -------------------------------------------------------------------------------
    def begin(self, files: Iterable[Key], repos: Iterable[Key]) -> OriginalState:
        files, repos = sorted(set(files)), sorted(set(repos))

        def read(h: str, t: Transport) -> dict[str, Any]:
            paths = [p for hh, p in files if hh == h]
            rps = [p for hh, p in repos if hh == h]
            return run_ops(t, [{"op": "read_state", "paths": paths, "repos": rps}])[0]

        states = for_each_host(self.playbook, self.transports, read)
        fo: dict[Key, FileOriginal] = {}
        ro: dict[Key, RepoOriginal] = {}
        for h, st in states.items():
            for p, f in st["files"].items():
                fo[(h, p)] = FileOriginal(f["exists"], unb64(f.get("content_b64")), f.get("mode"), f.get("uid"),
                                          f.get("gid"), f.get("mtime_ns"), f.get("atime_ns"))
            for p, r in st["repos"].items():
                ro[(h, p)] = RepoOriginal(r["head"], r["ref"])
        original = OriginalState(fo, ro)
        self.journal = Journal(self.run_id, self.playbook.name, time.time(), original)
        data = json.dumps(self.journal.to_json()).encode()
        # Local copy first (fsync'd), then the host copy, and only then any edit.
        write_private(self.local_journal, data)
        for h, t in self.transports.items():
            run_ops(t, [{"op": "put", "path": self.remote_journal, "content_b64": b64(data)}])
        self.live = {k: (v.content if v.exists else None) for k, v in fo.items()}
        self.live_repos = {k: (v.head, v.ref) for k, v in ro.items()}
        return original

    # --- apply ---------------------------------------------------------------------------------
    def apply(self, target: TargetState, *, exact_metadata: bool = False) -> dict[str, int]:
        """Make the hosts hold `target`; only what differs from the live state is written.
        Returns the number of edits per host."""
        assert self.journal is not None, "begin() first"
        original = self.journal.original
        per_host: dict[str, list[dict[str, Any]]] = {h: [] for h in self.transports}
        for key, data in target.files.items():
            if not exact_metadata and self.live.get(key, b"\0missing") == data:
                continue
            h, p = key
            orig = original.files.get(key)
            if data is None:
                op: dict[str, Any] = {"op": "write", "path": p, "delete": True}
            else:
                op = {"op": "write", "path": p, "content_b64": b64(data)}
                if orig is not None and orig.exists:
                    op.update(mode=orig.mode, uid=orig.uid, gid=orig.gid)
                    if exact_metadata and data == orig.content:
                        op.update(mtime_ns=orig.mtime_ns, atime_ns=orig.atime_ns)
            per_host[h].append(op)
        for key, rt in target.repos.items():
            if not exact_metadata and self.live_repos.get(key) == (rt.commit, rt.ref):
                continue
            h, p = key
            per_host[h].append({"op": "checkout", "repo": p, "commit": rt.commit, "ref": rt.ref})

        def do(h: str, t: Transport) -> int:
            run_ops(t, per_host[h])
            return len(per_host[h])

        counts = for_each_host(self.playbook, self.transports, do)
        self.live.update(target.files)
        self.live_repos.update({k: (v.commit, v.ref) for k, v in target.repos.items()})
        return counts

    def restore(self) -> None:
        """Put every journaled resource back exactly: bytes, mode, owner, mtime, HEAD and branch."""
        assert self.journal is not None
        o = self.journal.original
        self.apply(TargetState({k: (v.content if v.exists else None) for k, v in o.files.items()},
                               {k: RepoTarget(v.head, v.ref) for k, v in o.repos.items()}), exact_metadata=True)

    def finish(self) -> None:
        """After a verified restore (or a deliberate --leave fixed): the journal is history now."""
        if self.journal is None:
            return
        self.journal = Journal(**{**self.journal.__dict__, "state": "closed"})
        write_private(self.local_journal, json.dumps(self.journal.to_json()).encode())
        for h, t in self.transports.items():
            try:
                run_ops(t, [{"op": "remove", "path": self.remote_journal}])
            except RemoteError:
                pass

    @classmethod
    def resume_from(cls, playbook: Playbook, transports: Mapping[str, Transport], run_dir: Path,
                    journal: Journal) -> "HostEditor":
        ed = cls(playbook, transports, run_dir, journal.run_id)
        ed.journal = journal
        # After a crash the live state is unknown: force every resource to be rewritten.
        ed.live, ed.live_repos = {}, {}
        return ed


def find_journal(playbook: Playbook, transports: Mapping[str, Transport], runs_dir: Path) -> Journal | None:
    """The newest active journal for this deployment: the local store first, then the hosts."""
    cands = []
    if runs_dir.exists():
        for p in runs_dir.glob("*/journal.json"):
            try:
                doc = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            if doc.get("deployment") == playbook.name and doc.get("state") == "active":
                cands.append(Journal.from_json(doc))
    if cands:
        return max(cands, key=lambda j: j.created_at)
    _, remote = remote_paths(playbook.name)
    for h, t in transports.items():
        res = run_ops(t, [{"op": "get", "path": remote}])[0]
        if res.get("content_b64"):
            try:
                return Journal.from_json(json.loads(unb64(res["content_b64"]) or b"{}"))
            except (ValueError, KeyError) as e:
                raise UsageError(f"{h}: the journal on the host is damaged ({e})") from None
    return None
