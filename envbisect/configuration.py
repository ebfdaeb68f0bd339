"""Trial configurations: the baseline plus a chosen subset of the deltas, as concrete host state.

Pure: from the original (journaled) state of each touched resource and the set of applied deltas,
compute the bytes each file must hold and the commit each repo must be at. Env deltas are made by
rewriting only the affected line of the *current* file (`EnvFile.with_value` / `without`), so a
trial differs from what the operator wrote by exactly the reverted variables.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from .deltas import Delta
from .envfile import parse_env
from .errors import UsageError

Key = tuple[str, str]  # (host, path)


@dataclass(frozen=True)
class FileOriginal:
    exists: bool
    content: bytes | None = None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    mtime_ns: int | None = None
    atime_ns: int | None = None


@dataclass(frozen=True)
class RepoOriginal:
    head: str
    ref: str | None  # "refs/heads/main", or None when detached


@dataclass(frozen=True)
class OriginalState:
    files: Mapping[Key, FileOriginal]
    repos: Mapping[Key, RepoOriginal]


@dataclass(frozen=True)
class RepoTarget:
    commit: str
    ref: str | None


@dataclass(frozen=True)
class TargetState:
    files: Mapping[Key, bytes | None]  # None: the file must not exist
    repos: Mapping[Key, RepoTarget]


def touched(deltas: Iterable[Delta]) -> tuple[set[Key], set[Key]]:
    """Files and repos a run over these deltas may change (what the journal must record)."""
    files, repos = set(), set()
    for d in deltas:
        (repos if d.kind == "git" else files).add((d.host, d.path))
    return files, repos


def check_applicable(deltas: Sequence[Delta]) -> None:
    bad = [d for d in deltas if not d.applicable or (d.kind == "env" and not d.key)]
    if bad:
        raise UsageError(f"cannot re-create the baseline of {bad[0].id}: its old content is unknown "
                         f"({'; '.join(bad[0].detail) or bad[0].baseline_source}); exclude it with --exclude {bad[0].id}")


def target_state(original: OriginalState, deltas: Sequence[Delta], applied: Iterable[str],
                 contents: Mapping[str, bytes]) -> TargetState:
    """The state with exactly `applied` deltas in their new state and every other delta in its
    old state, computed from `original` (whatever mix is live now). A key already holding the
    wanted value is not touched, so a file changes by exactly the lines that must change."""
    applied = set(applied)
    unknown = applied - {d.id for d in deltas}
    if unknown:
        raise UsageError(f"unknown delta id {sorted(unknown)[0]!r}")
    files: dict[Key, bytes | None] = {k: (o.content if o.exists else None) for k, o in original.files.items()}
    repos: dict[Key, RepoTarget] = {k: RepoTarget(o.head, o.ref) for k, o in original.repos.items()}
    for d in deltas:
        want_new = d.id in applied
        key = (d.host, d.path)
        if d.kind == "env":
            continue
        if d.kind == "git":
            commit = d.new if want_new else d.old
            orig = original.repos.get(key)
            # back on the branch when the original checkout was at this commit on a branch
            ref = orig.ref if orig is not None and orig.head == commit else None
            repos[key] = RepoTarget(commit or "", ref)
            continue
        sha = d.new if want_new else d.old
        live = files.get(key)
        if sha is None:
            files[key] = None
        elif sha in contents:
            files[key] = contents[sha]
        elif live is not None and hashlib.sha256(live).hexdigest() == sha:
            pass  # already holds it (e.g. a large file recorded by hash only)
        else:
            raise UsageError(f"{d.id}: content {sha[:12]} is not in the store")
    for key in {(d.host, d.path) for d in deltas if d.kind == "env"}:
        data = files.get(key)
        text = (data or b"").decode("utf-8", "surrogateescape")
        for d in (d for d in deltas if d.kind == "env" and (d.host, d.path) == key):
            value = d.new if d.id in applied else d.old
            env = parse_env(text)
            current = env.values().get(d.key or "")
            if value == current:
                continue
            text = env.without(d.key or "") if value is None else env.with_value(d.key or "", value)
        files[key] = text.encode("utf-8", "surrogateescape")
    return TargetState(files, repos)
