"""Thin the snapshot store (`envbisect prune`): old automatic snapshots go, then the blobs nothing
refers to any more.

What is kept, whatever its age:

* every snapshot newer than ``keep`` seconds;
* with ``keep_labelled``, every snapshot a person named (a label other than the automatic ones:
  ``auto`` from `envbisect schedule`, ``diff`` from every `diff`/`bisect`, or none);
* every snapshot a run names (run.json ``baseline``/``current``): a run must stay resumable,
  revertable and bundlable;
* the newest snapshot of each deployment;
* the newest snapshot of each deployment whose probe passed (`snapshot --probe`): what
  `--since last-good` picks, however long the stack has been failing since.

Blobs (``STORE/blobs/ab/abcd...``, content-addressed) are then kept when a remaining snapshot file
names them (``files.*.blob``) or a run.json does (``deltas_blob``, the values of ``contents``).

Crash and concurrency safety, in this order:

1. Snapshot files are removed first (one ``unlink`` each, atomic; the folder is fsync'd). A crash
   after that leaves blobs nothing names: the next prune collects them.
2. The references are then read again *from disk* (every remaining snapshot file, every run.json),
   so a snapshot or run written meanwhile counts.
3. A blob is removed only when nothing names it *and* it was not written or reused within
   ``GRACE_S`` (`Store.put_blob` refreshes the mtime of a blob it reuses): a snapshot or run being
   written right now has put its blobs before the file that names them.
4. A snapshot or run.json that cannot be read means its references are unknown: no blob is
   removed at all (the notes say which file), never a guess.

Two prunes do not run at once (an exclusive lock on ``STORE/.prune.lock``).
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from envbisect.errors import StoreError, UsageError
from envbisect.state.store import PRUNE_LOCK, Store

AUTO_LABELS = frozenset({"auto", "diff"})  # labels envbisect gives by itself; None (no label) is automatic too
GRACE_S = 15 * 60.0  # a blob (or temp file) younger than this is never collected
_HEX = re.compile(r"[0-9a-f]{64}")
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*")
_UNITS = {**dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
          **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
          **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
          **dict.fromkeys(("d", "day", "days"), 86400),
          **dict.fromkeys(("w", "wk", "wks", "week", "weeks"), 7 * 86400)}


MAX_DURATION_S = 36500 * 86400  # a century: longer is a typo (and no clock, unit file or cron line holds it)


def parse_duration(text: str, what: str = "duration", *, most: float = MAX_DURATION_S) -> float:
    """``14d``, ``36h``, ``90m``, ``2w``, ``1h30m`` -> seconds, at most `most`; UsageError (one line)
    otherwise."""
    s = (text or "").strip().lower()
    total, pos = 0.0, 0
    for m in _DURATION.finditer(s):
        if m.start() != pos or not m.group(0).strip():
            break
        unit = m.group(2) or ""
        if unit not in _UNITS:
            raise UsageError(f"{what} {text!r}: unknown unit {unit or '(none)'!r} (use s, m, h, d or w: 14d, 36h, 90m)")
        total += float(m.group(1)) * _UNITS[unit]
        pos = m.end()
    if not s or pos != len(s):
        raise UsageError(f"{what} {text!r}: not a duration (use s, m, h, d or w: 14d, 36h, 90m)")
    if total <= 0:
        raise UsageError(f"{what} {text!r}: must be more than 0")
    if total > most:
        raise UsageError(f"{what} {text!r}: at most {int(most // 86400)}d")
    return total


def is_labelled(label: str | None) -> bool:
    return bool(label) and label not in AUTO_LABELS


@dataclass
class SnapshotEntry:
    id: str
    path: Path
    label: str | None
    taken_at: float
    deployment: str
    blobs: set[str]
    keep: list[str] = field(default_factory=list)  # why it stays; empty: it goes
    passed: bool = False  # its probe passed on the running stack (a last-good candidate)

    def to_json(self) -> dict[str, Any]:
        from datetime import datetime, timezone

        return {"id": self.id, "label": self.label, "deployment": self.deployment,
                "taken_at": datetime.fromtimestamp(self.taken_at, timezone.utc).isoformat(timespec="seconds"),
                "kept_because": list(self.keep)}


@dataclass
class PruneResult:
    dry_run: bool
    keep_s: float
    keep_labelled: bool
    kept: list[SnapshotEntry]
    deleted: list[SnapshotEntry]
    blobs_deleted: int = 0
    blob_bytes_deleted: int = 0
    blobs_kept: int = 0
    blobs_young: int = 0  # unreferenced, but within the grace period
    temp_files_deleted: int = 0
    blob_gc: bool = True  # False: references could not all be read; no blob was touched
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run, "keep_s": self.keep_s, "keep_labelled": self.keep_labelled,
            "snapshots": {"kept": [e.to_json() for e in self.kept], "deleted": [e.to_json() for e in self.deleted]},
            "blobs": {"deleted": self.blobs_deleted, "bytes_deleted": self.blob_bytes_deleted, "kept": self.blobs_kept,
                      "unreferenced_but_recent": self.blobs_young, "collected": self.blob_gc},
            "temp_files_deleted": self.temp_files_deleted,
            "notes": list(self.notes),
        }


# --- reading references ------------------------------------------------------------------------

def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as e:
        raise StoreError(f"{path}: unreadable ({getattr(e, 'strerror', None) or e})") from None


def snapshot_blobs(doc: Any) -> set[str]:
    """The blobs a stored snapshot document names."""
    out: set[str] = set()
    for h in (doc.get("hosts") or {}).values():
        for f in (h.get("files") or {}).values():
            b = f.get("blob") if isinstance(f, dict) else None
            if isinstance(b, str):
                out.add(b)
    return out


def run_refs(doc: Any) -> tuple[set[str], set[str]]:
    """(snapshot ids, blobs) a run.json names."""
    snaps = {str(doc[k]) for k in ("baseline", "current") if isinstance(doc.get(k), str)}
    blobs: set[str] = set()
    if isinstance(doc.get("deltas_blob"), str):
        blobs.add(doc["deltas_blob"])
    contents = doc.get("contents")
    if isinstance(contents, dict):
        blobs.update(v for v in contents.values() if isinstance(v, str))
    return snaps, blobs


def _snapshot_files(store: Store) -> list[Path]:
    d = store.snapshots_dir
    return sorted(p for p in d.glob("*.json") if p.is_file()) if d.is_dir() else []


def _run_files(store: Store) -> Iterator[Path]:
    d = store.runs_dir
    if d.is_dir():
        for p in sorted(d.iterdir()):
            if p.is_dir() and not p.name.startswith("."):
                yield p / "run.json"


class _Refs:
    """Every reference on disk right now: snapshot entries, and what runs name."""

    def __init__(self, store: Store):
        self.snapshots: list[SnapshotEntry] = []
        self.run_snapshots: dict[str, list[str]] = {}  # snapshot id -> runs naming it
        self.run_blobs: set[str] = set()
        self.unreadable: list[str] = []
        for p in _snapshot_files(store):
            try:
                doc = _read_json(p)
                if not isinstance(doc, dict):
                    raise StoreError(f"{p}: not a snapshot document")
                self.snapshots.append(SnapshotEntry(
                    str(doc.get("id") or p.stem), p, doc.get("label") if isinstance(doc.get("label"), str) else None,
                    float(doc["taken_at"]), str(doc.get("playbook", "")), snapshot_blobs(doc),
                    passed=isinstance(doc.get("probe"), dict) and doc["probe"].get("outcome") == "pass"))
            except FileNotFoundError:
                continue  # removed meanwhile
            except (StoreError, KeyError, TypeError, ValueError, AttributeError) as e:
                self.unreadable.append(f"{p}: {e}" if not isinstance(e, StoreError) else str(e))
        for p in _run_files(store):
            try:
                doc = _read_json(p)
            except FileNotFoundError:
                continue  # a run that crashed before writing its question names nothing usable
            except StoreError as e:
                self.unreadable.append(str(e))
                continue
            if not isinstance(doc, dict):
                self.unreadable.append(f"{p}: not a JSON object")
                continue
            snaps, blobs = run_refs(doc)
            for s in snaps:
                self.run_snapshots.setdefault(s, []).append(p.parent.name)
            self.run_blobs |= blobs

    def referenced_blobs(self, without: set[str] = frozenset()) -> set[str]:  # type: ignore[assignment]
        out = set(self.run_blobs)
        for e in self.snapshots:
            if e.id not in without:
                out |= e.blobs
        return out


# --- deciding ----------------------------------------------------------------------------------

def decide(entries: list[SnapshotEntry], run_snapshots: dict[str, list[str]], *, keep_s: float,
           keep_labelled: bool, now: float) -> None:
    """Fill each entry's `keep` reasons (an entry without one is to be removed)."""
    newest: dict[str, SnapshotEntry] = {}
    newest_good: dict[str, SnapshotEntry] = {}
    for e in entries:
        e.keep = []
        for best, counts in ((newest, True), (newest_good, e.passed)):
            if counts and (e.deployment not in best
                           or (e.taken_at, e.id) > (best[e.deployment].taken_at, best[e.deployment].id)):
                best[e.deployment] = e
    for e in entries:
        if e.taken_at >= now - keep_s:
            e.keep.append("newer than --keep")
        if keep_labelled and is_labelled(e.label):
            e.keep.append(f"labelled {e.label!r}")
        if e.id in run_snapshots:
            runs = run_snapshots[e.id]
            more = f" (+{len(runs) - 3})" if len(runs) > 3 else ""
            e.keep.append("used by run " + ", ".join(sorted(runs)[:3]) + more)
        if newest.get(e.deployment) is e:
            e.keep.append("newest of its deployment")
        if newest_good.get(e.deployment) is e:
            e.keep.append("newest whose probe passed (--since last-good)")


def _blob_files(store: Store) -> Iterator[Path]:
    d = store.blobs_dir
    if not d.is_dir():
        return
    for sub in sorted(d.iterdir()):
        if sub.is_dir():
            yield from sorted(sub.iterdir())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _Lock:
    """Exclusive: no snapshot is being saved (`Store.writing` holds it shared) and no other prune runs."""

    def __init__(self, store: Store, wait_s: float = 60.0):
        self.path = store.root / PRUNE_LOCK
        self.wait_s = wait_s
        self.fd: int | None = None

    def __enter__(self) -> "_Lock":
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise StoreError(f"{self.path}: cannot lock the store: {e.strerror}") from None
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise StoreError(f"{self.path}: the store is still busy after {self.wait_s:.0f} s (a snapshot "
                                     "being saved, or another prune); try again") from None
                time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)


def prune(store: Store, *, keep_s: float, keep_labelled: bool = False, dry_run: bool = False,
          now: float | None = None, grace_s: float = GRACE_S) -> PruneResult:
    now = time.time() if now is None else now
    if not store.root.is_dir():
        raise StoreError(f"{store.root}: no snapshot store here (see --store)")
    if dry_run:
        return _prune(store, keep_s, keep_labelled, True, now, grace_s)
    with _Lock(store):
        return _prune(store, keep_s, keep_labelled, False, now, grace_s)


def _prune(store: Store, keep_s: float, keep_labelled: bool, dry_run: bool, now: float, grace_s: float) -> PruneResult:
    refs = _Refs(store)
    decide(refs.snapshots, refs.run_snapshots, keep_s=keep_s, keep_labelled=keep_labelled, now=now)
    kept = [e for e in refs.snapshots if e.keep]
    doomed = [e for e in refs.snapshots if not e.keep]
    res = PruneResult(dry_run, keep_s, keep_labelled, kept, doomed)
    res.notes.extend(f"kept as is: {u}" for u in refs.unreadable)
    # 1. the snapshots
    if not dry_run and doomed:
        # a run started since the first read may name one of them: read the runs once more
        again = _Refs(store)
        for e in doomed:
            if e.id in again.run_snapshots:
                e.keep.append("used by run " + ", ".join(sorted(again.run_snapshots[e.id])[:3]))
        res.kept += [e for e in doomed if e.keep]
        res.deleted = doomed = [e for e in doomed if not e.keep]
        for e in doomed:
            try:
                e.path.unlink()
            except FileNotFoundError:
                pass
            except OSError as ex:
                raise StoreError(f"{e.path}: cannot remove: {ex.strerror}") from None
        _fsync_dir(store.snapshots_dir)
    res.kept.sort(key=lambda e: (e.taken_at, e.id))
    res.deleted.sort(key=lambda e: (e.taken_at, e.id))
    # 2. what is still named, read again from disk (a snapshot or run written meanwhile counts)
    if dry_run:
        unreadable, referenced = refs.unreadable, refs.referenced_blobs(without={e.id for e in doomed})
    else:
        after = _Refs(store)
        unreadable, referenced = after.unreadable, after.referenced_blobs()
    if unreadable:
        res.blob_gc = False
        for u in unreadable:
            if f"kept as is: {u}" not in res.notes:
                res.notes.append(f"kept as is: {u}")
        res.notes.append("no blob was removed: the references of the file(s) above are unknown")
        res.blobs_kept = sum(1 for _ in _blob_files(store))
        return res
    # 3. the blobs
    for p in _blob_files(store):
        name = p.name
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        young = st.st_mtime > now - grace_s
        if name.startswith(".tmp-"):  # a write that never finished
            if not young:
                res.temp_files_deleted += 1
                if not dry_run:
                    _unlink(p)
            continue
        if not _HEX.fullmatch(name) or name in referenced:
            res.blobs_kept += 1
            continue
        if young:
            res.blobs_young += 1
            res.blobs_kept += 1
            continue
        res.blobs_deleted += 1
        res.blob_bytes_deleted += st.st_size
        if not dry_run:
            _unlink(p)
    if store.snapshots_dir.is_dir():
        for p in store.snapshots_dir.glob(".tmp-*"):
            try:
                if p.stat().st_mtime <= now - grace_s:
                    res.temp_files_deleted += 1
                    if not dry_run:
                        _unlink(p)
            except FileNotFoundError:
                continue
    return res


def _unlink(p: Path) -> None:
    try:
        p.unlink()
    except FileNotFoundError:
        pass
    except OSError as e:
        raise StoreError(f"{p}: cannot remove: {e.strerror}") from None
