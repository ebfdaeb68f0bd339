"""File, repo and watched-path deltas: a whole file (watched, or an uncommitted change in a deployed
repo), a repo's HEAD, a structured file's keys (`per_key`, by state/structured.py) and a start
script's or unit file's command line per flag (`delta_cmdline.per_flag`).

Each kind is one function over one host (`HostSides`) returning a `Found`. Pure: no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from envbisect.state.delta import Delta, DeltaKind, Found, HostSides, iso_time, sha256_hex
from envbisect.state.delta_cmdline import per_flag
from envbisect.state.snapshot import FileState, HostState, RepoState
from envbisect.state.structured import Unfaithful, format_of, key_changes

@dataclass
class OldFile:
    """The baseline state of one file: content (or known absence) and where it came from."""

    source: str
    content: bytes | None
    absent: bool = False
    sha: str | None = None  # known even when the content is not (large files, symlinks)


def old_file_state(path: str, base_host: HostState | None, base_id: str | None, cur: HostState,
              since: float | None) -> OldFile | None:
    if base_host is not None:
        bf = base_host.files.get(path)
        if bf is not None:
            if bf.exists is False:
                return OldFile(f"snapshot:{base_id}", None, absent=True)
            if bf.content is not None or bf.sha256:
                return OldFile(f"snapshot:{base_id}", bf.content, sha=bf.sha256)
        elif covered_by(path, base_host):
            return OldFile(f"snapshot:{base_id}", None, absent=True)
    fb = cur.fallback
    if fb is not None:
        bk = fb.backups.get(path)
        if bk is not None and bk.content is not None:
            return OldFile(f"backup:{bk.path}", bk.content)
        g = fb.git.get(path)
        if g is not None and g.get("commit"):
            if g.get("absent"):
                return OldFile(f"git:{g['commit'][:12]}", None, absent=True)
            if "content" in g:
                return OldFile(f"git:{g['commit'][:12]}", g["content"])
    return None


def covered_by(path: str, host: HostState) -> bool:
    """Was path inside something the baseline looked at (so its absence there is meaningful)?"""
    return (any(path == root or path.startswith(root.rstrip("/") + "/") for root in host.watched)
            or path in host.env_files.values())



def _baseline_head(repo: RepoState, base: RepoState | None, base_id: str | None) -> tuple[str, str] | None:
    """(the repo's HEAD at the baseline, where that was read): the baseline snapshot's, else the
    reflog's at the time asked for; None when neither is known."""
    if base is not None and base.head:
        return base.head, f"snapshot:{base_id}"
    if repo.head_at_since:
        return repo.head_at_since, "reflog"
    return None


def _repo_delta(host: str, path: str, repo: RepoState, base: RepoState | None, base_id: str | None) -> Delta | None:
    then = _baseline_head(repo, base, base_id)
    if then is None:
        return None
    old, source = then
    if old == repo.head:
        return None  # HEAD did not move; uncommitted changes are file deltas of their own (_dirty_deltas)
    detail: list[str] = []
    if repo.dirty:
        detail.append(f"working tree has uncommitted changes: {', '.join(repo.dirty_files[:10])}")
    detail.extend(f"+ {c}" for c in repo.commits_since)
    detail.extend(f"- {c}" for c in repo.commits_rewound)
    return Delta(f"git:{host}:{path}", DeltaKind.GIT, host, None, path, None, "changed", old, repo.head, source,
                 tuple(detail))


REPO_FILE_MARK = "in the deployed repo"  # in the first detail of a file delta made by _dirty_deltas


def is_repo_file(d: Delta) -> bool:
    """Is this file delta an uncommitted change to a tracked file of a deployed repo (a hotfix)?"""
    return d.kind in ("file", "key", "flag") and bool(d.detail) and REPO_FILE_MARK in d.detail[0]


def _dirty_deltas(host: str, rpath: str, repo: RepoState, cur: HostState, base: HostState | None,
                  base_id: str | None, since: float | None, contents: dict[str, bytes], covered: set[str],
                  notes: list[str]) -> list[Delta]:
    """Uncommitted changes to tracked files of a deployed repo (a hotfix edited on the box), one
    file delta each, like a watched file's. The baseline side is the baseline snapshot's copy when
    the file was dirty there too, else the file at the baseline HEAD (read from git on the host by
    the collector). A file a watch root or an env file covers is compared there."""
    base_repo = base.repos.get(rpath) if base is not None else None
    now, then = repo.dirty_paths(), base_repo.dirty_paths() if base_repo is not None else {}
    repo_base = cur.fallback.repo_base if cur.fallback is not None else {}
    out: list[Delta] = []
    for path in sorted(set(now) | set(then)):
        if path in covered:
            continue
        rel = now.get(path) or then.get(path)
        f = cur.files.get(path)
        if f is None or f.error or f.exists is None:
            notes.append(f"{host}:{path}: an uncommitted change in {rpath} that could not be read "
                         f"({f.error if f is not None and f.error else 'not snapshotted'}); its delta is unknown")
            continue
        old: OldFile | None = None
        if path in then and base is not None:
            bf = base.files.get(path)
            if bf is not None and bf.exists is False:
                old = OldFile(f"snapshot:{base_id}", None, absent=True)
            elif bf is not None and (bf.content is not None or bf.sha256):
                old = OldFile(f"snapshot:{base_id}", bf.content, sha=bf.sha256)
        else:
            g = repo_base.get(path)
            if base is None and since is not None and path in now and f.mtime is not None and f.mtime <= since:
                continue  # edited before TIME: part of the baseline
            if g is not None:
                old = OldFile(f"git:{str(g.get('commit'))[:12]}", g.get("content"), absent=bool(g.get("absent")),
                           sha=g.get("sha256"))
        why = (f"uncommitted change to {rel} {REPO_FILE_MARK} {rpath} (tracked, not committed: a hotfix on the box?)"
               if path in now else f"{rel} {REPO_FILE_MARK} {rpath} had uncommitted changes at the baseline")
        out.extend(replace(d, detail=(why, *d.detail)) for d in file_delta(host, path, f, old, since, contents))
    return out


def file_delta(host: str, path: str, f: FileState, old: OldFile | None, since: float | None,
                contents: dict[str, bytes]) -> list[Delta]:
    did = f"file:{host}:{path}"
    new_sha = f.sha256 if f.exists else None
    if f.content is not None and new_sha:
        contents[new_sha] = f.content
    if old is None:
        # No old content anywhere: like `find -newermt TIME`, still list what was modified after TIME.
        if since is not None and f.exists and f.mtime is not None and f.mtime > since:
            return [Delta(did, DeltaKind.FILE, host, None, path, None, "changed", None, new_sha, "mtime",
                          (f"modified at {iso_time(f.mtime)}, after {iso_time(since)}; old content unknown",))]
        return []
    old_sha = None if old.absent else (sha256_hex(old.content) if old.content is not None else old.sha)
    if old.content is not None and old_sha:
        contents[old_sha] = old.content
    if old.absent and not f.exists:
        return []
    if old.absent:
        return [Delta(did, DeltaKind.FILE, host, None, path, None, "added", None, new_sha, old.source)]
    if not f.exists:
        return [Delta(did, DeltaKind.FILE, host, None, path, None, "removed", old_sha, None, old.source)]
    if old_sha == new_sha:
        return []
    detail = () if old.content is not None else ("old content unknown",)
    return [Delta(did, DeltaKind.FILE, host, None, path, None, "changed", old_sha, new_sha, old.source, detail)]


def per_key(file_deltas: list[Delta], contents: Mapping[str, bytes], notes: list[str]) -> list[Delta]:
    """A changed structured file (YAML, JSON, TOML by its extension) as one delta per key path, when
    both sides are known and that is faithful (state/structured.py); else as it is, with a note
    saying why it stays whole. Other deltas pass through."""
    out: list[Delta] = []
    for d in file_deltas:
        fmt = format_of(d.path)
        old, new = contents.get(d.old or ""), contents.get(d.new or "")
        if d.kind != "file" or d.change != "changed" or fmt is None or old is None or new is None:
            out.append(d)
            continue
        changes = key_changes(fmt, old, new)
        if isinstance(changes, Unfaithful):
            notes.append(f"{d.host}:{d.path}: compared as a whole file, not per key: {changes.reason}")
            out.append(d)
            continue
        out.extend(Delta(f"{d.id}#{c.key}", DeltaKind.KEY, d.host, d.service, d.path, c.key, c.change, c.old, c.new,
                         d.baseline_source, d.detail, old_file=d.old, new_file=d.new) for c in changes)
    return out



def repo_deltas(h: HostSides) -> Found:
    """Each deployed repo's HEAD move (one git delta), and its uncommitted changes (file deltas; a
    structured file per key, as a watched one)."""
    deltas: list[Delta] = []
    notes: list[str] = []
    cur, base = h.cur, h.base
    covered = set(cur.env_files.values()) | {p for ms in cur.watched.values() for p in ms}
    for rpath, repo in cur.repos.items():
        if repo.error:
            notes.append(f"{h.name}:{rpath}: {repo.error}")
            continue
        d = _repo_delta(h.name, rpath, repo, base.repos.get(rpath) if base else None, h.base_id)
        if d:
            deltas.append(d)
        dirty = _dirty_deltas(h.name, rpath, repo, cur, base, h.base_id, h.since, h.contents, covered, notes)
        deltas.extend(per_flag(per_key(dirty, h.contents, notes), h.contents, notes))
    return Found(tuple(deltas), tuple(notes))


def _moved_by_head(path: str, h: HostSides) -> str | None:
    """The deployed repo whose HEAD move changed the watched file `path`, when that move explains the
    whole change: the file is among the files the move changed and had no uncommitted change on
    either side. Its change is then the git delta's (one change, searched commit by commit); as a
    file delta too, a trial would write it and then refuse its own checkout."""
    for rpath, repo in h.cur.repos.items():
        top = (repo.top or repo.path).rstrip("/") + "/"
        if not path.startswith(top) or repo.moved_files is None:
            continue
        base = h.base.repos.get(rpath) if h.base is not None else None
        then = _baseline_head(repo, base, h.base_id)
        moved = then is not None and then[0] != repo.head
        dirty_then = base is not None and path in base.dirty_paths()
        if moved and path[len(top):] in repo.moved_files and path not in repo.dirty_paths() and not dirty_then:
            return rpath
    return None


def watched_deltas(h: HostSides) -> Found:
    """Each file under a watched path that changed, was added, or is gone since the baseline (a
    structured file per key)."""
    deltas: list[Delta] = []
    notes: list[str] = []
    cur, base = h.cur, h.base
    env_paths = set(cur.env_files.values())
    members = sorted({p for ms in cur.watched.values() for p in ms} - env_paths)
    gone = set()
    if base is not None:
        gone = {p for ms in base.watched.values() for p in ms} - set(members) - env_paths
    for path in members:
        moved_by = _moved_by_head(path, h)
        if moved_by is not None:
            notes.append(f"{h.name}:{path}: changed by the HEAD move of {moved_by} (committed, clean on both "
                         f"sides): searched with that move, commit by commit, not as a file of its own")
            continue
        f = cur.files[path]
        if f.error:
            notes.append(f"{h.name}:{path}: cannot read ({f.error})")
        old = old_file_state(path, base, h.base_id, cur, h.since)
        found = per_key(file_delta(h.name, path, f, old, h.since, h.contents), h.contents, notes)
        deltas.extend(per_flag(found, h.contents, notes))  # a start script's or unit's command line per flag
    for path in sorted(gone):
        bf = base.files.get(path) if base else None
        if bf is None or _moved_by_head(path, h) is not None:
            continue
        if bf.content is not None:
            h.contents[bf.sha256 or sha256_hex(bf.content)] = bf.content
        deltas.append(Delta(f"file:{h.name}:{path}", DeltaKind.FILE, h.name, None, path, None, "removed",
                            bf.sha256, None, f"snapshot:{h.base_id}",
                            () if bf.content is not None else ("old content too large to restore",)))
    return Found(tuple(deltas), tuple(notes))
