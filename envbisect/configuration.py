"""Trial configurations: the baseline plus a chosen subset of the deltas, as concrete host state.

Pure: from the original (journaled) state of each touched resource and the set of applied deltas,
compute the bytes each file must hold and the commit each repo must be at. Env deltas are made by
rewriting only the affected line of the *current* file (`EnvFile.with_value` / `without`), so a
trial differs from what the operator wrote by exactly the reverted variables.
"""
from __future__ import annotations

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
    applied = set(applied)
    unknown = applied - {d.id for d in deltas}
    if unknown:
        raise UsageError(f"unknown delta id {sorted(unknown)[0]!r}")
    files: dict[Key, bytes | None] = {}
    repos: dict[Key, RepoTarget] = {}
    for key, orig in original.files.items():
        files[key] = orig.content if orig.exists else None
    for key, orig in original.repos.items():
        repos[key] = RepoTarget(orig.head, orig.ref)
    # Env deltas not applied are reverted one line at a time, in file order of the keys.
    by_file: dict[Key, list[Delta]] = {}
    for d in deltas:
        if d.id in applied:
            continue
        key = (d.host, d.path)
        if d.kind == "env":
            by_file.setdefault(key, []).append(d)
        elif d.kind == "git":
            repos[key] = RepoTarget(d.old or "", None)
        else:
            if d.change == "added":
                files[key] = None
            else:
                if d.old not in contents:
                    raise UsageError(f"{d.id}: old content {str(d.old)[:12]} is not in the store")
                files[key] = contents[d.old]
    for key, ds in by_file.items():
        data = files.get(key)
        text = (data or b"").decode("utf-8", "surrogateescape")
        for d in ds:
            env = parse_env(text)
            if d.change == "added":
                text = env.without(d.key or "")
            else:
                text = env.with_value(d.key or "", d.old or "")
        files[key] = text.encode("utf-8", "surrogateescape")
    return TargetState(files, repos)
