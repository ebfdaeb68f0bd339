"""Deltas: what changed between a known-good baseline and now, as discrete, applicable units.

Pure: takes snapshots (the current one carrying fallback material for TIME), returns a `Diff`.
Every delta says where its old value came from (`baseline_source`), because "old value from a
.bak file of unknown age" and "old value from a snapshot taken at 11:58" are different evidence.

Each delta kind is one function over one host (`HostSides` -> `Found`: deltas and notes), in its
sibling module: env files (`delta_env.env_file_deltas`), deployed repos (`delta_files.repo_deltas`),
watched paths (`delta_files.watched_deltas`). `compute_diff` runs them in that order; the finer
splits of env deltas (flags, knobs) are applied to the diff after it (`delta_flags`). The types
they share are in `delta.py`; every public name stays importable from here.

An env delta is a change of *shell meaning*: each side keeps the exact shell text of its value
word (`Delta.old_word` / `new_word`, written back byte for byte by a trial) and, when the host
evaluated the file in bash (`snapshot.ProcessState.file_eval`), what bash made of it
(`old_eval` / `new_eval`): drift compares a process with that, and the post-apply check of a trial
compares the host's evaluation of the edited file with it.
"""
from __future__ import annotations

from typing import Callable, Iterable

from envbisect.state.delta import (CHANGES, SNAPSHOT_HINT, Delta, DeltaKind, Diff, Drift, Found, HostSides,
                                   all_literal_equal, fallback_note, fallback_sources, iso_time, link_name,
                                   parse_env_bytes, same_change, sha256_hex, shown_value)
from envbisect.state.delta_env import env_file_deltas, unexplained_evaluations
from envbisect.state.delta_files import REPO_FILE_MARK, is_repo_file, per_key, repo_deltas, watched_deltas
from envbisect.state.delta_flags import engine_names, split_flags, with_knobs
from envbisect.state.snapshot import Snapshot

__all__ = ["CHANGES", "SNAPSHOT_HINT", "REPO_FILE_MARK", "Delta", "DeltaKind", "Diff", "Drift", "Found", "HostSides",
           "KINDS", "all_literal_equal", "compute_diff", "engine_names", "env_file_deltas", "fallback_note",
           "fallback_sources", "is_repo_file", "iso_time", "link_name", "linked_units", "parse_env_bytes",
           "per_key", "repo_deltas", "same_change", "sha256_hex", "shown_value", "split_flags",
           "unexplained_evaluations", "watched_deltas", "with_knobs"]

_unexplained_evaluations = unexplained_evaluations  # the name tests of the shell-meaning rules use

# Every delta kind over one host, in the order their deltas and notes are listed.
KINDS: tuple[Callable[[HostSides], Found], ...] = (env_file_deltas, repo_deltas, watched_deltas)


def compute_diff(current: Snapshot, baseline: Snapshot | None, *, since: float | None) -> Diff:
    """Every delta kind over every host of `current` against `baseline` (or, without one, the
    fallback sources `current` carries for `since`)."""
    deltas: list[Delta] = []
    drift: list[Drift] = []
    notes: list[str] = []
    unknown: list[str] = []
    contents: dict[str, bytes] = {}
    base_id = baseline.id if baseline else None
    for hname, cur in current.hosts.items():
        base = baseline.hosts.get(hname) if baseline else None
        sides = HostSides(hname, cur, base, base_id, since, contents)
        for kind in KINDS:
            found = kind(sides)
            deltas.extend(found.deltas)
            drift.extend(found.drift)
            notes.extend(found.notes)
            unknown.extend(found.unknown_processes)
    return Diff(since, baseline, current, tuple(deltas), tuple(drift), tuple(unknown), tuple(notes), contents)


def linked_units(deltas: Iterable[Delta], link_keys: Iterable[str] = ()) -> dict[str, tuple[str, ...]]:
    """Group deltas into bisection units: by default every delta alone, `--link KEY` pins all deltas of
    that variable into one unit (every flag of an argument string too), `KEY[--flag]` those of one flag.
    Returns unit id -> delta ids."""
    deltas = list(deltas)
    keys = set(link_keys)
    units: dict[str, tuple[str, ...]] = {}
    grouped: dict[str, list[str]] = {}
    for d in deltas:
        if d.kind == "env" and d.key in keys:
            grouped.setdefault(f"linked:{d.key}", []).append(d.id)
        elif d.kind in ("env", "flag") and d.knob is not None and d.knob in keys:
            grouped.setdefault(f"linked:{d.knob}", []).append(d.id)
        elif d.kind in ("env", "flag") and d.flag is not None and link_name(d) in keys:
            grouped.setdefault(f"linked:{link_name(d)}", []).append(d.id)
        else:
            units[d.id] = (d.id,)
    for uid, ids in grouped.items():
        units[uid] = tuple(ids)
    return units

