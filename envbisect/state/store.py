"""The local store (`--store`, default ./snapshots/): snapshots as JSON, file contents content-addressed.

Everything is written 0600 (folders 0700): serve-env files hold tokens. Writes are atomic (temp
file + rename) so an interrupted envbisect never leaves half a snapshot behind.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import functools
import hashlib
import hmac
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Iterator

from envbisect.errors import StoreError
from envbisect.state.snapshot import (FileState, HostState, ObservedProbe, ProcessState, RepoState, Snapshot,
                                      sourced_from_raw)

PRUNE_LOCK = ".prune.lock"  # see Store.writing
JOURNAL_KEY = "journal.key"  # see Store.journal_key
_HEX = frozenset("0123456789abcdef")

PutBlob = Callable[[bytes], str]  # content in, its sha256 out (Store.put_blob)
GetBlob = Callable[[str], "bytes | None"]  # sha256 in, the content or None (Store.get_blob)


def read_json_or_none(path: Path) -> Any:
    """A JSON file's value, or None when it is missing, unreadable or not JSON: for readers (the
    report, the bundle) that show what is there and say what is not, rather than stop."""
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError):
        return None


def private_dir(path: Path) -> None:
    """`path` and every missing folder above it, each made 0700 (`mkdir(parents=True, mode=…)` gives
    the mode to the last folder only: the ones above it got the umask's 0755). Folders that exist are
    left as they are."""
    path = Path(path)
    missing = []
    while not path.is_dir():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            if not d.is_dir():
                raise
            continue
        os.chmod(d, 0o700)  # a umask such as 0o277 would take the owner's bits too


def write_private(path: Path, data: bytes) -> None:
    private_dir(path.parent)
    write_file(path, data, 0o600)


def write_file(path: Path, data: bytes, mode: int) -> None:
    """Atomically (re)place `path` with `data`: the temp file is one mkstemp creates (O_EXCL, so a
    symlink planted at a guessable name is never followed), and a destination that is a symlink is
    refused, never written through nor silently replaced."""
    if path.is_symlink():
        raise OSError(errno.ELOOP, "it is a symlink; not writing through it", str(path))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class Store:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():  # every command: never "no snapshots" for a file
            raise StoreError(f"{self.root}: not a folder; a snapshot store is a folder (see --store)")

    @property
    def snapshots_dir(self) -> Path:
        return self.root / "snapshots"

    @property
    def blobs_dir(self) -> Path:
        return self.root / "blobs"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    def _ensure(self) -> None:
        try:
            for d in (self.root, self.snapshots_dir, self.blobs_dir, self.runs_dir):
                private_dir(d)
        except OSError as e:
            raise StoreError(f"{self.root}: cannot create the snapshot store: {e.strerror}") from None

    # the journal key --------------------------------------------------------------------------
    def journal_key(self, *, create: bool = True) -> bytes | None:
        """The secret with which this controller authenticates the journal copies it leaves on the
        hosts (envbisect.hosts.journal): 32 random bytes in STORE/journal.key, 0600, made on first
        use. None when it does not exist and `create` is false: no host copy can then be trusted."""
        path = self.root / JOURNAL_KEY
        try:
            key = path.read_bytes()
        except FileNotFoundError:
            if not create:
                return None
            self._ensure()
            key = os.urandom(32)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:  # another envbisect of this store made it first
                return self.journal_key(create=False)
            with os.fdopen(fd, "wb") as f:
                f.write(key)
                f.flush()
                os.fsync(f.fileno())
            return key
        except OSError as e:
            raise StoreError(f"{path}: cannot read the journal key: {e.strerror}") from None
        if len(key) < 32:
            raise StoreError(f"{path}: damaged journal key ({len(key)} bytes, expected 32)")
        return key

    def mask_key(self) -> bytes | None:
        """The key of the hash a masked value shows (inputs/masking.py), derived from the journal key
        so that every output of this store hashes a secret alike, and no bundle's hash can be matched
        against a dictionary. None when the store does not exist yet or its key cannot be read (the
        masker then uses a key of its process)."""
        try:
            key = self.journal_key(create=self.root.is_dir())
        except StoreError:
            return None
        return None if key is None else hmac.new(key, b"envbisect: the hash of a masked value", "sha256").digest()

    # blobs --------------------------------------------------------------------------------
    def put_blob(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        path = f"{os.fspath(self.root)}/blobs/{sha[:2]}/{sha}"  # a str: pathlib's joins were most of a save
        try:  # reused: made fresh again, so `envbisect prune` leaves it to what is being written
            os.utime(path)
        except FileNotFoundError:
            write_private(Path(path), data)
        except OSError:
            pass
        return sha

    def _put_blob_once(self) -> PutBlob:
        """put_blob for one document: a content it already put (the same file on many hosts) is
        neither hashed into the store nor refreshed again."""
        done: dict[bytes, str] = {}

        def put(data: bytes) -> str:
            sha = done.get(data)
            if sha is None:
                sha = done[data] = self.put_blob(data)
            return sha

        return put

    def get_blob(self, sha: str) -> bytes | None:
        path = self.blobs_dir / sha[:2] / sha
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None

    def read_blob(self, sha: object) -> bytes | None:
        """As get_blob for a reference read from a record: None when it is not a hex digest (so it
        never names a path outside blobs/), or the blob is missing or unreadable."""
        if not isinstance(sha, str) or not sha or not _HEX.issuperset(sha):
            return None
        try:
            return self.get_blob(sha)
        except OSError:
            return None

    def snapshot_doc(self, snap_id: object) -> dict[str, Any] | None:
        """The stored JSON of a snapshot (file contents are blob references), or None when the id
        could not be a snapshot's file name or the document is missing or damaged."""
        if not isinstance(snap_id, str) or not snap_id or "/" in snap_id or snap_id.startswith("."):
            return None
        doc = read_json_or_none(self.snapshots_dir / f"{snap_id}.json")
        return doc if isinstance(doc, dict) else None

    # snapshots ----------------------------------------------------------------------------
    def save(self, snap: Snapshot) -> Snapshot:
        """Store `snap`; returns it as saved. Ids are a second's time stamp and the label, so two
        deployments sharing a store (the replicas of a fleet) can take one in the same second: the
        later one gets a suffix (-2, -3, ...) instead of overwriting the other."""
        self._ensure()
        with self.writing():
            base, k = snap.id, 1
            while (self.snapshots_dir / f"{snap.id}.json").exists():
                k += 1
                snap = dataclasses.replace(snap, id=f"{base}-{k}")
            doc = snapshot_to_json(snap, self._put_blob_once())
            path = self.snapshots_dir / f"{snap.id}.json"
            # compact: json's C encoder (an indent falls back to the pure-Python one, which takes
            # most of the controller's CPU in a 16-host snapshot)
            write_private(path, json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
        return snap

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Blobs and the file naming them are written under a shared lock that `envbisect prune`
        takes exclusively (envbisect.state.prune): a prune never runs between the two."""
        try:
            fd = os.open(self.root / PRUNE_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            yield  # a read-only or odd store: writing fails on its own, with its own message
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    def list(self) -> list[Snapshot]:
        """All snapshots, oldest first."""
        if not self.snapshots_dir.exists():
            return []
        snaps = []
        for p in sorted(self.snapshots_dir.glob("*.json")):
            try:
                snaps.append(self.load_path(p))
            except StoreError:
                continue  # one damaged file must not hide the others; `snapshots` reports it
        return sorted(snaps, key=lambda s: s.taken_at)

    def load_path(self, path: Path) -> Snapshot:
        try:
            doc = json.loads(path.read_text())
            return snapshot_from_json(doc, self.get_blob)
        except FileNotFoundError:
            raise StoreError(f"{path}: no such snapshot") from None
        except (ValueError, KeyError, TypeError) as e:
            raise StoreError(f"{path}: damaged snapshot file ({e})") from None

    def find(self, ref: str, deployment: str | None = None) -> Snapshot:
        """A snapshot by id, id prefix, label (newest with it) or path. `deployment`: a label means
        that deployment's snapshot with it (a store may hold several deployments, e.g. replicas of a
        fleet, each with its own 'noon')."""
        p = Path(ref)
        if p.suffix == ".json" and p.exists():
            return self.load_path(p)
        snaps = self.list()
        exact = [s for s in snaps if s.id == ref]
        if exact:
            return exact[0]
        labelled = [s for s in snaps if s.label == ref]
        if deployment is not None and any(s.playbook == deployment for s in labelled):
            labelled = [s for s in labelled if s.playbook == deployment]
        if labelled:
            return labelled[-1]
        prefixed = [s for s in snaps if s.id.startswith(ref)]
        if len(prefixed) == 1:
            return prefixed[0]
        if len(prefixed) > 1:
            raise StoreError(f"snapshot {ref!r} is ambiguous: {', '.join(s.id for s in prefixed[:5])}")
        raise StoreError(f"no snapshot {ref!r} in {self.root} (see `envbisect snapshots`)")

    def put_run_deltas(self, deltas: list[dict[str, Any]]) -> str:
        """The raw deltas of a run (old/new values, secrets included) as a private blob: run.json
        itself holds them masked, like every run record, and names this blob."""
        return self.put_blob(json.dumps(deltas, sort_keys=True).encode())

    def run_deltas(self, doc: dict[str, Any], path: Path | str = "run.json") -> list[dict[str, Any]]:
        """The raw deltas of a run.json (from its `deltas_blob`; runs recorded before it existed
        hold them inline). StoreError when they cannot be read."""
        ref = doc.get("deltas_blob")
        try:
            if ref:
                blob = self.get_blob(str(ref)) if all(c in "0123456789abcdef" for c in str(ref)) else None
                if blob is None:
                    raise StoreError(f"{path}: the run's deltas (blob {str(ref)[:12]}) are missing from the store")
                deltas = json.loads(blob)
            else:
                deltas = doc["deltas"]
            if not isinstance(deltas, list) or not all(isinstance(d, dict) for d in deltas):
                raise TypeError("deltas is not a list of objects")
            return deltas
        except (KeyError, TypeError, ValueError) as e:
            raise StoreError(f"{path}: damaged run file (deltas: {e})") from None

    def last_good(self, playbook: str) -> "LastGood":
        """`--since last-good`: the newest snapshot of `playbook` whose probe passed on the running
        stack (`snapshot --probe`), and what was passed over to get to it."""
        mine = [s for s in self.list() if s.playbook == playbook]
        failed = 0
        for s in reversed(mine):
            if s.probe is not None and s.probe.passed:
                return LastGood(s, failed, sum(1 for m in mine if m.probe is not None), len(mine))
            if s.probe is not None:
                failed += 1
        return LastGood(None, failed, probed=failed, total=len(mine))

    def newest_at_or_before(self, playbook: str, when: float) -> Snapshot | None:
        cands = [s for s in self.list() if s.playbook == playbook and s.taken_at <= when]
        return cands[-1] if cands else None


@dataclasses.dataclass(frozen=True)
class LastGood:
    """The choice `--since last-good` makes: `snapshot` (None: no snapshot's probe passed), the
    newer snapshots skipped because their probe did not pass, and how many were probed at all."""

    snapshot: Snapshot | None
    skipped_failed: int
    probed: int
    total: int = 0

    def describe(self) -> str:
        """The one line saying which snapshot was picked, and why (or why none could be)."""
        s = self.snapshot
        if s is None:
            how = (f"{self.probed} probed, none passed" if self.probed else
                   "none was probed: take them with `envbisect snapshot --probe P` (or `schedule --probe P`)")
            return f"last-good: no snapshot whose probe passed ({self.total} snapshot(s) of this deployment; {how})"
        assert s.probe is not None
        p = s.probe
        line = f"last-good: snapshot {s.id}, the newest whose probe passed ({p.name}: {p.reason}"
        line += f"; {self.skipped_failed} newer snapshot(s) whose probe did not pass skipped)" if self.skipped_failed \
            else ")"
        if p.unverified:
            line += f"; note: its processes may not have run its files ({p.unverified})"
        return line

    def to_json(self) -> dict[str, Any]:
        return {"snapshot": self.snapshot.id if self.snapshot else None,
                "probe": self.snapshot.probe.to_json() if self.snapshot and self.snapshot.probe else None,
                "skipped_failed": self.skipped_failed, "probed": self.probed, "line": self.describe()}


# --- JSON mapping ------------------------------------------------------------------------------

_PLAIN = (type(None), str, int, float, bool, bytes, tuple)  # never a Mapping: no isinstance check against the ABC


def _fields(obj: Any) -> dict[str, Any]:
    """A flat dataclass's fields as a dict: what dataclasses.asdict gives for these snapshot types
    (no nested dataclasses; mappings become dicts), without its deep copy of every value (file
    contents included), which cost more than the rest of a snapshot's controller side."""
    names = _field_names(type(obj))
    d = dict(vars(obj))  # a dataclass's __dict__ holds its fields, set in order by __init__
    if len(d) != len(names):  # something else besides: read the fields one by one
        d = {name: getattr(obj, name) for name in names}
    for k, v in d.items():
        if type(v) not in _PLAIN and isinstance(v, Mapping):
            d[k] = dict(v)
    return d


@functools.lru_cache(maxsize=None)
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _file_to_json(f: FileState, put_blob: PutBlob) -> dict[str, Any]:
    # a FileState's fields are plain values (no mapping to copy): its __dict__ is what _fields gives
    d = {k: v for k, v in vars(f).items() if v not in _UNSET}
    content = d.pop("content", None)
    if content is not None:
        d["blob"] = put_blob(content)
    return d


_UNSET = (None, False, ())  # what a stored FileState leaves out (and reads back as its default)


def _file_from_json(d: dict[str, Any], get_blob: GetBlob) -> FileState:
    d = dict(d)
    blob = d.pop("blob", None)
    content = get_blob(blob) if blob else None
    if blob and content is None:
        raise StoreError(f"missing blob {blob} for {d.get('path')}")
    d.setdefault("exists", None)
    return FileState(content=content, **d)


def snapshot_to_json(snap: Snapshot, put_blob: PutBlob) -> dict[str, Any]:
    hosts = {}
    for name, h in snap.hosts.items():
        hd = {
            "name": h.name, "hostname": h.hostname, "clock_epoch": h.clock_epoch, "tz": h.tz,
            "utc_offset_s": h.utc_offset_s, "env_files": dict(h.env_files),
            "watched": {k: list(v) for k, v in h.watched.items()},
            "sourced": {env: [_fields(e) for e in entries] for env, entries in h.sourced.items()},
            "files": {p: _file_to_json(f, put_blob) for p, f in h.files.items()},
            # tuples are written as JSON lists by json.dumps itself
            "repos": {p: _fields(r) for p, r in h.repos.items()},
            "processes": {s: _fields(p) for s, p in h.processes.items()},
        }
        hosts[name] = hd
    doc = {"format": 1, "id": snap.id, "label": snap.label, "taken_at": snap.taken_at, "playbook": snap.playbook,
           "hosts": hosts}
    if snap.probe is not None:  # only then: a snapshot without a probe is written as before
        doc["probe"] = snap.probe.to_json()
    return doc


def snapshot_from_json(doc: dict[str, Any], get_blob: GetBlob) -> Snapshot:
    if doc.get("format") != 1:
        raise StoreError(f"unsupported snapshot format {doc.get('format')!r}")
    hosts = {}
    for name, hd in doc["hosts"].items():
        repos = {}
        for p, r in hd.get("repos", {}).items():
            r = dict(r)
            for k in ("dirty_files", "commits_since", "commits_rewound", "dirty_entries"):
                r[k] = tuple(r.get(k) or ())
            r["moved_files"] = tuple(r["moved_files"]) if r.get("moved_files") is not None else None
            repos[p] = RepoState(**r)
        hosts[name] = HostState(
            name=hd["name"], hostname=hd["hostname"], clock_epoch=hd["clock_epoch"], tz=hd.get("tz"),
            utc_offset_s=hd.get("utc_offset_s", 0),
            files={p: _file_from_json(f, get_blob) for p, f in hd.get("files", {}).items()},
            repos=repos, processes={s: ProcessState(**p) for s, p in hd.get("processes", {}).items()},
            env_files=hd.get("env_files", {}), watched={k: tuple(v) for k, v in hd.get("watched", {}).items()},
            fallback=None, sourced=sourced_from_raw(hd.get("sourced") or {}),
        )
    probe = ObservedProbe.from_json(doc["probe"]) if doc.get("probe") else None
    return Snapshot(id=doc["id"], label=doc.get("label"), taken_at=doc["taken_at"], playbook=doc["playbook"],
                    hosts=hosts, probe=probe)
