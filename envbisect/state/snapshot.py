"""Snapshot: the state of every host of a playbook at one moment. Pure data (and its parsing from
the collector's answer); collecting it over SSH is envbisect.hosts.collector.
"""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping


@dataclass(frozen=True)
class FileState:
    path: str
    exists: bool | None  # None: could not tell (e.g. permission denied on the folder)
    kind: str = "file"  # file | symlink | dir | special
    sha256: str | None = None
    size: int | None = None
    mode: int | None = None
    owner: str | None = None
    uid: int | None = None
    gid: int | None = None
    mtime: float | None = None
    content: bytes | None = None  # None when too large, unreadable or absent
    too_large: bool = False
    link_target: str | None = None
    error: str | None = None

    def text(self) -> str | None:
        return None if self.content is None else self.content.decode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class RepoState:
    path: str
    head: str | None
    branch: str | None = None
    dirty: bool = False
    dirty_files: tuple[str, ...] = ()
    describe: str | None = None
    error: str | None = None
    commits_since: tuple[str, ...] = ()  # "sha subject" from the baseline HEAD to this one
    commits_rewound: tuple[str, ...] = ()  # in the baseline but not here (HEAD moved back)
    head_at_since: str | None = None  # from the reflog, when asked for a time
    # the top of the working tree (dirty_files are relative to it); its dirty files' bytes are in
    # HostState.files by absolute path (`dirty_paths`), snapshotted like watched files
    top: str | None = None
    # `git status --porcelain=v1 -z`, parsed: {"xy": " M", "path": ..., "orig": rename source or None}
    dirty_entries: tuple[Mapping[str, Any], ...] = ()
    # the files the HEAD move since the baseline changed, relative to the top (None: not known)
    moved_files: tuple[str, ...] | None = None

    def dirty_paths(self) -> dict[str, str]:
        """Absolute path -> path relative to the top of the working tree, of each dirty file
        (a rename's original path too)."""
        top = self.top or self.path
        return {top.rstrip("/") + "/" + rel: rel for rel in self.dirty_files}


@dataclass(frozen=True)
class ProcessState:
    service: str
    status: str  # ok | unknown | not-running | no-pid-file
    pid: int | None = None
    started_at: float | None = None
    environ: Mapping[str, str] | None = None
    cmdline: str | None = None
    why: str | None = None
    # What bash makes of the service's env file, evaluated on the host the way the start script
    # sources it (``set -a; . FILE``) in this process's inherited environment (`environ` minus the
    # keys the file assigns, `file_eval_keys`): key -> value for those keys (a key missing from it is
    # unset after sourcing). None: not evaluated (no process, bash missing or failing: then
    # `file_eval_error` says why). `file_eval_sha256` names the file bytes that were evaluated.
    file_eval: Mapping[str, str] | None = None
    file_eval_keys: tuple[str, ...] = ()
    file_eval_sha256: str | None = None
    file_eval_error: str | None = None
    # The versions of the engine's distributions (`collector.ENGINE_PACKAGES`) that the process's own
    # python sees (normalised name -> version), read with importlib.metadata from the files; None: not
    # read (no python, or a host python without importlib.metadata). `python`: that interpreter.
    packages: Mapping[str, str] | None = None
    python: str | None = None

    def start_environ(self, extra_keys: Iterable[str] = ()) -> dict[str, str] | None:
        """The environment the env file was sourced in: `environ` minus the keys the file assigns
        (and `extra_keys`). None when the start environment is not known."""
        if self.status != "ok" or self.environ is None:
            return None
        drop = set(self.file_eval_keys) | set(extra_keys)
        return {k: v for k, v in self.environ.items() if k not in drop}

    def evaluated(self, sha256: str | None) -> Mapping[str, str] | None:
        """`file_eval`, when it was made of the file with this sha256 (else None)."""
        if self.file_eval is None or not sha256 or self.file_eval_sha256 != sha256:
            return None
        return self.file_eval


@dataclass(frozen=True)
class FallbackSources:
    """Old contents found on the host for a time, used when no stored snapshot is old enough."""

    backups: Mapping[str, FileState] = field(default_factory=dict)  # path -> newest backup copy at/before TIME
    git: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # path -> {repo, commit, content}
    # a deployed repo's dirty file (absolute path) -> its bytes at the baseline HEAD:
    # {repo, rel, commit, sha256, content} or {repo, rel, commit, absent: True}
    repo_base: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class SourcedFile:
    """One ``. FILE`` / ``source FILE`` line of an env file, as the collector resolved it on the host
    (hosts/agent/collect.py). The file it names is part of the configuration as much as the env file
    is, so a resolved `path` is snapshotted and watched like a `[watch]` path naming it (a root of
    its own in `HostState.watched`), and a change in it is an ordinary file delta."""

    line: int | None  # 1-based, in the env file (or in `via`); None: no longer sourced, kept from the baseline
    word: str  # the path as written (shell text)
    path: str | None  # the absolute path snapshotted; None: not resolved (`why` says why)
    why: str | None = None  # why envbisect cannot see what bash reads there
    relative: bool = False  # a relative path, resolved against the env file's folder (a guess: see collect.py)
    via: str | None = None  # a source line of this already sourced file: reported, not followed


@dataclass(frozen=True)
class HostState:
    name: str
    hostname: str
    clock_epoch: float
    tz: str | None
    utc_offset_s: int
    files: Mapping[str, FileState]
    repos: Mapping[str, RepoState]
    processes: Mapping[str, ProcessState]
    env_files: Mapping[str, str]  # service -> env file path
    watched: Mapping[str, tuple[str, ...]]  # watch root -> member paths
    fallback: FallbackSources | None = None
    # env file path -> its source lines (empty for a snapshot taken before they were followed)
    sourced: Mapping[str, tuple[SourcedFile, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class ObservedProbe:
    """A probe run on the stack as it was running when the snapshot was taken (`snapshot --probe`):
    no edit, no restart. It makes a snapshot an observed known-good (or not); `--since last-good`
    picks the newest that passed. `outcome` is pass, fail or unresolved (the probe could not tell:
    exit 125, an abort, a lost connection): only pass makes a known-good. A perf probe has no
    reference here (nothing else was measured in the same run), so it passes when every sample was
    served, and its figures (`metric`, `values`) are kept for the record, never judged."""

    name: str
    kind: str
    outcome: str  # pass | fail | unresolved
    reason: str
    at: float  # epoch seconds when the probe finished
    runs: int = 0
    passes: int = 0
    metric: str | None = None  # perf: what `values` measure (output_tokens_per_s, latency_p50_s, ...)
    values: tuple[float, ...] = ()  # perf: one per sample
    # why the running processes may not be running this snapshot's files (drift, a process started
    # before its env file was written): the probe saw what ran, not necessarily what the files say
    unverified: str | None = None

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    @property
    def median(self) -> float | None:
        v = sorted(self.values)
        return v[len(v) // 2] if v else None

    def summary(self) -> str:
        """One short cell: `e2e pass`, `throughput pass (median 812.3)`, `e2e FAIL`."""
        word = self.outcome if self.passed else self.outcome.upper()
        med = f" (median {self.median:.4g})" if self.median is not None else ""
        return f"{self.name} {word}{med}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "outcome": self.outcome, "reason": self.reason,
                "at": self.at, "runs": self.runs, "passes": self.passes, "metric": self.metric,
                "values": list(self.values), "median": self.median, "unverified": self.unverified}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ObservedProbe":
        return cls(name=str(d["name"]), kind=str(d.get("kind", "")), outcome=str(d["outcome"]),
                   reason=str(d.get("reason", "")), at=float(d.get("at", 0.0)), runs=int(d.get("runs", 0)),
                   passes=int(d.get("passes", 0)), metric=d.get("metric"),
                   values=tuple(float(v) for v in d.get("values") or ()), unverified=d.get("unverified"))


@dataclass(frozen=True)
class Snapshot:
    id: str
    label: str | None
    taken_at: float  # epoch seconds (the local clock of envbisect)
    playbook: str
    hosts: Mapping[str, HostState]
    probe: ObservedProbe | None = None  # `snapshot --probe`: what the probe said of the running stack

    @property
    def taken_at_iso(self) -> str:
        return datetime.fromtimestamp(self.taken_at, timezone.utc).isoformat(timespec="seconds")


def _file_state(d: Mapping[str, Any]) -> FileState:
    content = binascii.a2b_base64(d["content_b64"]) if "content_b64" in d else None
    get = d.get
    # FileState's own __init__ sets each of its 14 fields through object.__setattr__ (frozen):
    # most of the controller's CPU for a snapshot's files. The same fields, in the same order,
    # are set at once; the object is as __init__ makes it (no __post_init__, no slots).
    f = _NEW(FileState)
    f.__dict__.update(
        path=d["path"], exists=get("exists"), kind=get("kind", "file"), sha256=get("sha256"), size=get("size"),
        mode=get("mode"), owner=get("owner"), uid=get("uid"), gid=get("gid"), mtime=get("mtime"),
        content=content, too_large=bool(get("too_large")), link_target=get("link_target"), error=get("error"))
    return f


_NEW = object.__new__


def host_state_from_raw(host: str, raw: Mapping[str, Any], env_files: Mapping[str, str]) -> HostState:
    fb = raw.get("fallback")
    fallback = None
    if fb is not None:
        git = {}
        for path, g in fb.get("git", {}).items():
            g = dict(g)
            if "content_b64" in g:
                g["content"] = base64.b64decode(g.pop("content_b64"))
            git[path] = g
        repo_base = {}
        for path, g in (fb.get("repo_base") or {}).items():
            g = dict(g)
            if "content_b64" in g:
                g["content"] = base64.b64decode(g.pop("content_b64"))
            repo_base[path] = g
        fallback = FallbackSources({p: _file_state(d) for p, d in fb.get("backups", {}).items()}, git, repo_base)
    repos = {}
    for p, r in raw.get("repos", {}).items():
        log = r.get("log_since") or {}
        repos[p] = RepoState(
            path=p, head=r.get("head"), branch=r.get("branch"), dirty=bool(r.get("dirty")),
            dirty_files=tuple(r.get("dirty_files", ())), describe=r.get("describe"), error=r.get("error"),
            commits_since=tuple(log.get("commits", ())), commits_rewound=tuple(log.get("rewound", ())),
            head_at_since=r.get("head_at_since"), top=r.get("top"),
            dirty_entries=tuple(r.get("dirty_entries") or ()),
            moved_files=tuple(log["files"]) if log.get("files") is not None else None,
        )
    procs = {
        s: ProcessState(service=s, status=p.get("status", "unknown"), pid=p.get("pid"), started_at=p.get("started_at"),
                        environ=p.get("environ"), cmdline=p.get("cmdline"), why=p.get("why"),
                        file_eval=p.get("file_eval"), file_eval_keys=tuple(p.get("file_eval_keys") or ()),
                        file_eval_sha256=p.get("file_eval_sha256"), file_eval_error=p.get("file_eval_error"),
                        packages=p.get("packages"), python=p.get("python"))
        for s, p in raw.get("processes", {}).items()
    }
    clock = raw["clock"]
    return HostState(
        name=host, hostname=raw.get("hostname", host), clock_epoch=clock["epoch"], tz=clock.get("tz"),
        utc_offset_s=int(clock.get("utc_offset_s", 0)),
        files={p: _file_state(d) for p, d in raw.get("files", {}).items()}, repos=repos, processes=procs,
        env_files=dict(env_files), watched={k: tuple(v) for k, v in raw.get("watched", {}).items()}, fallback=fallback,
        sourced=sourced_from_raw(raw.get("sourced") or {}),
    )


def sourced_from_raw(raw: Mapping[str, Any]) -> dict[str, tuple[SourcedFile, ...]]:
    """The collector's (and the store's) `sourced` mapping, typed."""
    names = {f for f in SourcedFile.__dataclass_fields__}
    return {env: tuple(SourcedFile(**{k: v for k, v in e.items() if k in names}) for e in entries)
            for env, entries in raw.items()}


def new_snapshot_id(label: str | None, when: float) -> str:
    stamp = datetime.fromtimestamp(when, timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in label)[:40] if label else ""
    return f"{stamp}-{safe}" if safe else stamp


def without_fallback(snap: Snapshot) -> Snapshot:
    """The fallback material is evidence for one diff, not part of the host's state."""
    return replace(snap, hosts={h: replace(s, fallback=None) for h, s in snap.hosts.items()})
