"""The journal's records: the original state of everything a run may touch (`Journal`), the states
envbisect made or was about to make (`made_json`), and where they live, on the hosts
(`remote_paths`, `made_path`) and in the local store (`local_journal_paths`, `journal_dir`).
"""
from __future__ import annotations

import glob
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from envbisect.hosts.agent_calls import b64, unb64
from envbisect.state import rundir
from envbisect.state.configuration import FileOriginal, Key, OriginalState, RepoOriginal

RepoState = tuple[str, "str | None"]  # (HEAD commit, "refs/heads/main" or None when detached)



def remote_paths(deployment: str) -> tuple[str, str]:
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in deployment)
    return f"~/.envbisect/{safe}.lock", f"~/.envbisect/{safe}.journal.json"


def made_path(deployment: str) -> str:
    return remote_paths(deployment)[1][: -len(".journal.json")] + ".made.json"


def mtimes_path(deployment: str) -> str:
    """Host-side: the original mtimes of the tracked files a run's checkouts rewrite (hostops.keep_mtimes)."""
    return remote_paths(deployment)[1][: -len(".journal.json")] + ".mtimes.json"


def sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Journal:
    run_id: str
    deployment: str
    created_at: float
    original: OriginalState
    state: str = "active"  # active | closed
    conflicts: tuple[dict, ...] = ()
    # the states envbisect made (or was about to make) on each resource: kept in made.json
    made_files: Mapping[Key, frozenset] = field(default_factory=dict, compare=False)
    made_repos: Mapping[Key, frozenset] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str, Any]:
        hosts: dict[str, dict[str, Any]] = {}
        for (h, p), f in self.original.files.items():
            d = {"exists": f.exists, "mode": f.mode, "uid": f.uid, "gid": f.gid, "mtime_ns": f.mtime_ns,
                 "atime_ns": f.atime_ns, "content_b64": b64(f.content) if f.content is not None else None}
            hosts.setdefault(h, {"files": {}, "repos": {}})["files"][p] = d
        for (h, p), r in self.original.repos.items():
            hosts.setdefault(h, {"files": {}, "repos": {}})["repos"][p] = {"head": r.head, "ref": r.ref}
        return {"format": 1, "run_id": self.run_id, "deployment": self.deployment, "created_at": self.created_at,
                "state": self.state, "hosts": hosts, "conflicts": list(self.conflicts)}

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
                   doc.get("state", "active"), tuple(doc.get("conflicts", ())))

    def for_host(self, host: str) -> "Journal":
        """The journal of one host's resources only: what that host's copy holds."""
        o = self.original
        return Journal(**{**self.__dict__, "original": OriginalState(
            {k: v for k, v in o.files.items() if k[0] == host}, {k: v for k, v in o.repos.items() if k[0] == host}),
            "made_files": {}, "made_repos": {}})

    def with_made(self, doc: Mapping[str, Any] | None) -> "Journal":
        """Add the states recorded in a made.json document (of this run) to what is known."""
        if not doc or doc.get("run_id") != self.run_id:
            return self
        mf = {k: set(v) for k, v in self.made_files.items()}
        mr = {k: set(v) for k, v in self.made_repos.items()}
        for h, hd in doc.get("hosts", {}).items():
            for p, shas in hd.get("files", {}).items():
                mf.setdefault((h, p), set()).update(shas)
            for p, states in hd.get("repos", {}).items():
                mr.setdefault((h, p), set()).update((s[0], s[1]) for s in states)
        return Journal(**{**self.__dict__, "made_files": {k: frozenset(v) for k, v in mf.items()},
                          "made_repos": {k: frozenset(v) for k, v in mr.items()}})


def made_json(run_id: str, files: Mapping[Key, Iterable], repos: Mapping[Key, Iterable]) -> dict[str, Any]:
    hosts: dict[str, dict[str, Any]] = {}
    for (h, p), v in files.items():
        hosts.setdefault(h, {"files": {}, "repos": {}})["files"][p] = sorted(v, key=lambda x: (x is None, x or ""))
    for (h, p), v in repos.items():
        hosts.setdefault(h, {"files": {}, "repos": {}})["repos"][p] = sorted([list(s) for s in v], key=str)
    return {"format": 1, "run_id": run_id, "hosts": hosts}


def local_journal_paths(runs_dir: Path, run_id: str | None = None) -> list[Path]:
    """Every local journal in the store (or run ``run_id``'s): a run's own, and a fleet run's one
    per replica (``runs/ID/REPLICA/journal.json``)."""
    if run_id is not None:
        rundir.check_run_id(run_id)
    if not runs_dir.exists():
        return []
    pattern = "*" if run_id is None else glob.escape(run_id)
    return sorted(runs_dir.glob(f"{pattern}/{rundir.JOURNAL}")) + sorted(runs_dir.glob(f"{pattern}/*/{rundir.JOURNAL}"))


def journal_dir(runs_dir: Path, run_id: str, deployment: str) -> Path:
    """Where deployment ``deployment``'s journal of run ``run_id`` lives (or will, when only the
    hosts still have it): a fleet run keeps one folder per replica, so two replicas never share one."""
    rundir.check_run_id(run_id)
    for p in local_journal_paths(runs_dir, run_id):
        try:
            if json.loads(p.read_text()).get("deployment") == deployment:
                return p.parent
        except (OSError, ValueError):
            continue
    base = runs_dir / run_id
    return base / deployment if (base / rundir.JOURNAL).exists() or "-fleet-" in run_id else base


