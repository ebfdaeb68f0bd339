"""Journal and lock: every change envbisect makes on a host is recorded before it is made.

`HostEditor.lock` takes the deployment lock on every host (never over another run's active journal;
kept fresh by a heartbeat). `HostEditor.begin` reads the exact original state of everything the run
may touch (bytes, mode, owner, mtime, HEAD and branch), refuses when the ssh user could not put an
owner back, and writes it to the local store AND to the hosts before the first edit: each host gets
the part about its own resources, authenticated with the store's key (`host_copy`), and a host copy
is used only when the local journal is lost and its HMAC verifies (`find_journal`, `verified_copy`).
Before each edit, the state envbisect is about to make is recorded too ("made"), so after a crash the
host can only hold the original or a state envbisect made; anything else is someone else's change.

Every write, checkout, stop and start is compare-and-swap: it first checks that the host holds the
state envbisect journaled or last made, and stops the run with a `HostConflict` if not. `restore`
puts back every resource that is provably envbisect's own and leaves the others as it found them,
recording each conflict in the run (`conflicts.json`). A run killed with -9 can still be undone
exactly (`envbisect restore`).

The journal's records are `journal_records.py`'s, the hosts' authenticated copies `host_copies.py`'s,
and the lock holder and its heartbeat `lock.py`'s; this module holds the editor that takes the lock,
journals, applies and restores, and re-exports their public names.
"""
from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from envbisect.errors import EnvbisectError, HostConflict, LockHeld, LockLost, RemoteError, UsageError
from envbisect.hosts import faults
from envbisect.hosts.collector import for_each_host
from envbisect.hosts.host_copies import closed_locally, find_journal, host_copy, stale_note, verified_copy
from envbisect.hosts.agent_calls import b64, run_ops, unb64
from envbisect.hosts.journal_records import (Journal, RepoState, journal_dir, local_journal_paths, made_json,
                                             made_path, mtimes_path, remote_paths, sha)
from envbisect.hosts.lock import (HEARTBEAT_S, STALE_AFTER_S, Heartbeat, boot_id, controller_id, describe_holder,
                                  holder_gone_here, pid_namespace)
from envbisect.hosts.transport import Transport
from envbisect.inputs.masking import SecretMasker
from envbisect.inputs.playbook import Playbook
from envbisect.state import rundir
from envbisect.state.configuration import (FileOriginal, Key, OriginalState, RepoOriginal, TargetState, env_check_ops,
                                           raise_on_env_check)
from envbisect.state.store import Store, write_private

__all__ = [
    "HostEditor", "read_original", "describe_conflict", "Journal", "RepoState", "made_json", "sha", "remote_paths",
    "made_path", "local_journal_paths", "journal_dir", "find_journal", "host_copy", "verified_copy",
    "HEARTBEAT_S", "STALE_AFTER_S", "boot_id", "pid_namespace", "controller_id", "holder_gone_here",
]


def describe_conflict(c: Mapping[str, Any]) -> str:
    """One line for a resource someone else changed during the run."""
    if c.get("kept_meta"):
        return f"{c['host']}:{c['path']} {c['why']}"
    keep = f"; its original is in {c['original_copy']}" if c.get("original_copy") else ""
    return f"{c['host']}:{c['path']} {c['why']}: left as found{keep}"


_KIND = {"write": "write", "checkout": "checkout", "put": "journal", "remove": "journal"}


def _send(t: Transport, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """run_ops, with the test-only crash hook (envbisect/faults.py) at each mutation."""
    cut = faults.crash_index([_KIND.get(op["op"]) for op in ops])
    if cut is not None:
        if cut:
            run_ops(t, ops[:cut])
        faults.kill()
    return run_ops(t, ops)



class HostEditor:
    """Applies target states to the hosts, journaled and compare-and-swap, and undoes them."""

    def __init__(self, playbook: Playbook, transports: Mapping[str, Transport], run_dir: Path, run_id: str, *,
                 heartbeat_s: float = HEARTBEAT_S, stale_after_s: float = STALE_AFTER_S, runs_root: Path | None = None):
        self.playbook, self.transports, self.run_dir, self.run_id = playbook, transports, run_dir, run_id
        self.runs_root = runs_root or run_dir.parent  # the store's runs/ (a fleet replica's run_dir is one deeper)
        self.lock_path, self.remote_journal = remote_paths(playbook.name)
        self.remote_made = made_path(playbook.name)
        self.remote_mtimes = mtimes_path(playbook.name)
        self.heartbeat_s, self.stale_after_s = heartbeat_s, stale_after_s
        self.owner = {"run_id": run_id, **controller_id(), "token": uuid.uuid4().hex}
        self.journal: Journal | None = None
        self.live: dict[Key, bytes | None] = {}  # exact content known to be on the host
        self.live_repos: dict[Key, tuple[str, str | None]] = {}
        # compare-and-swap: the state(s) each resource may be in now (two after a failed batch: the
        # edit is atomic, so the old or the new). Missing: unknown (after a crash) -> original or made.
        self.expect: dict[Key, set[str | None]] = {}
        self.expect_repos: dict[Key, set[RepoState]] = {}
        self.made: dict[Key, set[str | None]] = {}
        self.made_repos: dict[Key, set[RepoState]] = {}
        self.conflicts: list[dict[str, Any]] = []
        self.edited = False  # has any edit been sent (after begin)?
        self.lock_lost: str | None = None
        self._locked = False
        self._beat: Heartbeat | None = None
        self._key: bytes | None = None

    @property
    def key(self) -> bytes:
        """The store's journal key (made on first use)."""
        if self._key is None:
            self._key = Store(self.runs_root.parent).journal_key()
        return self._key  # type: ignore[return-value]

    @property
    def local_journal(self) -> Path:
        return self.run_dir / rundir.JOURNAL

    @property
    def local_made(self) -> Path:
        return self.run_dir / rundir.MADE

    # --- lock ----------------------------------------------------------------------------------
    def lock(self, *, break_lock: bool = False, restoring: str | None = None, dry: bool = False) -> list[str]:
        """Take the lock on every host. Refused while another run's journal is active on a host (its
        changes must be undone first), and while a live run holds it (unless `break_lock`). A lock
        whose holder is provably dead is taken over. `restoring`: the run whose journal `restore`
        undoes (refused while that run is alive). `dry`: only say whether it could be taken (raises
        as the real one would; writes nothing). Returns notes on locks taken over or broken."""
        me = {**self.owner, "started_at": time.time(), "heartbeat_s": self.heartbeat_s}
        locked: list[str] = []
        notes: list[str] = []
        asked: list[str] = []  # a host asked, whose answer an interrupt may have cut off: its lock may stand
        try:
            for h, t in self.transports.items():
                asked.append(h)
                op = {"op": "lock", "path": self.lock_path, "journal": self.remote_journal, "owner": me,
                      "break": break_lock, "restoring": restoring, "dry": dry, "stale_after_s": self.stale_after_s}
                res = run_ops(t, [op])[0]
                held = res.get("held_by") or {}
                if not res.get("locked") and held.get("token") and holder_gone_here(held):
                    # a run of this machine whose process is gone: the host takes that record (by its
                    # token, so a lock taken meanwhile by someone else is judged afresh) as dead
                    op = {**op, "dead_token": held["token"]}
                    res = run_ops(t, [op])[0]
                jr = res.get("journal_run")
                if not res.get("locked") and jr and closed_locally(self.runs_root, self.playbook.name, jr):
                    notes.append(stale_note(h, jr))  # the store closed that run: the host's copy is stale
                    res = run_ops(t, [{**op, "stale_journal": jr}])[0]
                if not res.get("locked"):
                    raise self._refusal(h, t, res)
                if not dry:
                    locked.append(h)
                if res.get("broke"):
                    b = res["broke"]
                    notes.append(f"{h}: broke the lock of run {b.get('run_id')} "
                                 f"({describe_holder(b, res.get('age_s'))})")
                elif res.get("took_over"):
                    b = res["took_over"]
                    notes.append(f"{h}: took over the stale lock of run {b.get('run_id')} "
                                 f"({describe_holder(b, res.get('age_s'))}: its holder is gone)")
            if restoring is None:
                self._refuse_local_journals()
        except BaseException:
            for h in (asked if not dry else ()):  # by this run's token: another's lock is never touched
                self._unlock_host(h)
            raise
        if dry:
            return notes
        self._locked = True
        if self.heartbeat_s > 0 and self._beat is None:
            self._beat = Heartbeat(self.transports, self._lock_op(), self._lost_lock, self.heartbeat_s,
                                   name=f"envbisect-heartbeat-{self.run_id}")
        return notes

    def _refusal(self, h: str, t: Transport, res: Mapping[str, Any]) -> LockHeld:
        """Why the lock on host h was not taken: another run's active journal, a running run, or a
        holder that may still be alive."""
        if res.get("journal_run") and not res.get("held_by"):
            jr = res["journal_run"]
            if not self._restorable_here(h, t, jr):
                return LockHeld(f"{h}: run {jr} left changes on this host that are not undone yet (its "
                                "journal is active) and was run from another store: its journal is not "
                                "authenticated by this one; run `envbisect restore --run "
                                f"{jr}` with the store (on the controller) that ran it")
            return LockHeld(f"{h}: run {jr} left changes on this host that are not undone "
                            f"yet (its journal is active); run `envbisect restore --run {jr}` first")
        held = res.get("held_by", {})
        who = describe_holder(held, res.get("age_s"))
        if res.get("running"):
            return LockHeld(f"{h}: run {held.get('run_id')} is still running ({who}); "
                            "stop it (Ctrl-C or SIGTERM puts the hosts back) instead of restoring under it")
        return LockHeld(
            f"{h}: deployment {self.playbook.name!r} is locked by run {held.get('run_id')} "
            f"({who}); wait for it, or if that controller is gone for good, "
            "run again with --break-lock")

    def _restorable_here(self, host: str, t: Transport, run_id: str) -> bool:
        """Can `envbisect restore --run RUN_ID` with this store undo that run? Yes when the store holds
        its journal, or when the host's copy verifies with this store's key; a copy another store wrote
        is refused by restore, so sending the operator there would be a dead end."""
        try:
            rundir.check_run_id(run_id)
        except UsageError:
            return False
        if local_journal_paths(self.runs_root, run_id):
            return True
        key = Store(self.runs_root.parent).journal_key(create=False)
        try:
            raw = unb64(run_ops(t, [{"op": "get", "path": self.remote_journal}])[0].get("content_b64"))
            verified_copy(key, host, self.playbook.name, "journal", raw or b"", run_id)
        except (UsageError, RemoteError):
            return False
        return True

    def _refuse_local_journals(self) -> None:
        """A run of this controller that died before its journal reached the hosts is known here only."""
        runs_dir = self.runs_root
        for p in local_journal_paths(runs_dir):
            if p.parent == self.run_dir:
                continue
            try:
                doc = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            if doc.get("deployment") == self.playbook.name and doc.get("state") == "active":
                raise LockHeld(f"run {doc.get('run_id')} left an active journal in {runs_dir} (its changes may be "
                               f"live on the hosts); run `envbisect restore --run {doc.get('run_id')}` first")

    def _lost_lock(self, why: str) -> None:
        self.lock_lost = why

    def _lock_op(self) -> dict[str, Any]:
        return {"op": "assert_lock", "path": self.lock_path, "token": self.owner["token"]}

    def _guarded(self, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A mutation batch starts by checking (and refreshing) that the lock is still this run's."""
        if self.lock_lost:
            raise LockLost("", {"lock_lost": True}, self.lock_lost)
        return ([self._lock_op()] if self._locked else []) + ops

    def _unlock_host(self, host: str) -> None:
        try:
            run_ops(self.transports[host], [{"op": "unlock", "path": self.lock_path, "token": self.owner["token"]}])
        except RemoteError:
            pass

    def stop_heartbeat(self) -> None:
        if self._beat is not None:
            self._beat.stop()
            self._beat = None

    def unlock(self) -> None:
        self.stop_heartbeat()
        for h in self.transports:
            self._unlock_host(h)
        self._locked = False

    # --- journal -------------------------------------------------------------------------------
    def begin(self, files: Iterable[Key], repos: Iterable[Key]) -> OriginalState:
        original = read_original(self.playbook, self.transports, files, repos)
        self.journal = Journal(self.run_id, self.playbook.name, time.time(), original)
        data = json.dumps(self.journal.to_json()).encode()
        # Local copy first (fsync'd), then the host copy, and only then any edit.
        faults.before("journal")
        write_private(self.local_journal, data)
        for h, t in self.transports.items():
            copy = host_copy(self.key, h, self.playbook.name, "journal", self.journal.for_host(h).to_json())
            _send(t, self._guarded([{"op": "put", "path": self.remote_journal, "content_b64": b64(copy),
                                     "run_id": self.run_id}]))
        self.live = {k: (v.content if v.exists else None) for k, v in original.files.items()}
        self.live_repos = {k: (v.head, v.ref) for k, v in original.repos.items()}
        self.expect = {k: {sha(v)} for k, v in self.live.items()}
        self.expect_repos = {k: {v} for k, v in self.live_repos.items()}
        return original

    def _original_sha(self, key: Key) -> str | None:
        o = self.journal.original.files[key]  # type: ignore[union-attr]
        return sha(o.content) if o.exists else None

    def expected(self, key: Key) -> set[str | None]:
        """What the file may hold now: what envbisect last made, or (after a crash) the original or
        any state envbisect recorded it was about to make."""
        if key in self.expect:
            return set(self.expect[key])
        return {self._original_sha(key)} | set(self.made.get(key, ()))

    def expected_repo(self, key: Key) -> set[RepoState]:
        if key in self.expect_repos:
            return set(self.expect_repos[key])
        o = self.journal.original.repos[key]  # type: ignore[union-attr]
        return {(o.head, o.ref)} | set(self.made_repos.get(key, ()))

    def _record_made(self, files: Mapping[Key, str | None], repos: Mapping[Key, RepoState]) -> list[str]:
        """Write-ahead: before a state is made, it is recorded as envbisect's own (locally, fsync'd; the
        host copy goes first in the same batch as the edit). Returns the hosts whose record changed."""
        changed = set()
        for k, v in files.items():
            if v not in self.made.setdefault(k, set()):
                self.made[k].add(v)
                changed.add(k[0])
        for k, r in repos.items():
            if r not in self.made_repos.setdefault(k, set()):
                self.made_repos[k].add(r)
                changed.add(k[0])
        if changed:
            faults.before("journal")
            write_private(self.local_made, json.dumps(made_json(self.run_id, self.made, self.made_repos)).encode())
        return sorted(changed)

    def _made_copy(self, host: str) -> str:
        """`host`'s authenticated made.json: the states envbisect made of that host's resources only."""
        doc = made_json(self.run_id, {k: v for k, v in self.made.items() if k[0] == host},
                        {k: v for k, v in self.made_repos.items() if k[0] == host})
        return b64(host_copy(self.key, host, self.playbook.name, "made", doc))

    def _check_op(self, host: str, files: Mapping[Key, Iterable], repos: Mapping[Key, Iterable], **kw: Any) -> dict:
        return {"op": "check", "files": {p: list(v) for (h, p), v in files.items() if h == host},
                "repos": {p: [list(s) for s in v] for (h, p), v in repos.items() if h == host}, **kw}

    def _each_host(self, fn: Callable[[str, Transport], Any], hosts: Sequence[str]) -> dict[str, Any]:
        """fn on each host in parallel; every host's result or exception (a batch that failed on one
        host says nothing about the others, whose edits did happen)."""
        def safe(h: str) -> Any:
            try:
                return fn(h, self.transports[h])
            except Exception as e:  # noqa: BLE001 - sorted out by the caller
                return e
        if len(hosts) <= 1:
            return {h: safe(h) for h in hosts}
        with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
            futs = {h: pool.submit(safe, h) for h in hosts}
            return {h: f.result() for h, f in futs.items()}

    @staticmethod
    def _first_error(outcomes: Mapping[str, Any]) -> None:
        errors = [e for e in outcomes.values() if isinstance(e, Exception)]
        if not errors:
            return
        # someone else's change outranks a lost connection: it must stop the run
        for e in errors:
            if isinstance(e, HostConflict):
                raise e
        for e in errors:
            if isinstance(e, EnvbisectError):
                raise e
        if isinstance(errors[0], OSError):
            raise RemoteError(str(errors[0])) from errors[0]
        raise errors[0]

    # --- apply ---------------------------------------------------------------------------------
    def apply(self, target: TargetState, *, exact_metadata: bool = False) -> dict[str, int]:
        """Make the hosts hold `target`; only what differs from the live state is written. Each edit
        is compare-and-swap against the state envbisect last made; afterwards each host's state is
        checked against the target (same round trip). Returns the number of edits per host."""
        assert self.journal is not None, "begin() first"
        original = self.journal.original
        per_host: dict[str, list[dict[str, Any]]] = {h: [] for h in self.transports}
        for key, data in target.files.items():
            if not exact_metadata and key in self.live and self.live[key] == data:
                continue
            h, p = key
            orig = original.files.get(key)
            if data is None:
                op: dict[str, Any] = {"op": "write", "path": p, "delete": True}
            else:
                op = {"op": "write", "path": p, "content_b64": b64(data)}
                if orig is not None and orig.exists:
                    op.update(mode=orig.mode, uid=orig.uid, gid=orig.gid, meta=[orig.mode, orig.uid, orig.gid])
                    if exact_metadata and data == orig.content:
                        op.update(mtime_ns=orig.mtime_ns, atime_ns=orig.atime_ns)
            op["expect"] = list(self.expected(key))
            per_host[h].append(op)
        for key, rt in target.repos.items():
            if not exact_metadata and self.live_repos.get(key) == (rt.commit, rt.ref):
                continue
            h, p = key
            op = {"op": "checkout", "repo": p, "commit": rt.commit, "ref": rt.ref,
                  "expect": [list(s) for s in self.expected_repo(key)]}
            base = original.repos.get(key)
            if base is not None and base.head:  # the files it rewrites get their mtimes back at the restore
                op["mtimes"] = {"path": self.remote_mtimes, "run_id": self.run_id, "base": base.head}
            per_host[h].append(op)
        want_files = {k: sha(v) for k, v in target.files.items()}
        want_repos = {k: (v.commit, v.ref) for k, v in target.repos.items()}
        sent = {h for h, ops in per_host.items() if ops}
        made_hosts = self._record_made({k: want_files[k] for h in sent for k in want_files if k[0] == h},
                                       {k: want_repos[k] for h in sent for k in want_repos if k[0] == h})
        def do(h: str, t: Transport) -> int:
            if not per_host[h]:
                return 0
            batch = [{"op": "put", "path": self.remote_made, "content_b64": self._made_copy(h)}] \
                if h in made_hosts else []
            batch += per_host[h]
            # verify the applied state (hashes) before anything is restarted on it
            batch.append(self._check_op(h, {k: [v] for k, v in want_files.items()},
                                        {k: [v] for k, v in want_repos.items()},
                                        why="is not what envbisect just wrote: changed by someone else"))
            # and what bash makes of each edited env file (configuration.env_check_ops)
            env_ops = env_check_ops(target, h, per_host[h])
            res = _send(t, self._guarded(batch + env_ops))
            env_results[h] = res[len(res) - len(env_ops):]
            return len(per_host[h])

        env_results: dict[str, list[dict[str, Any]]] = {}
        if sent:
            self.edited = True
        outcomes = self._each_host(do, sorted(sent))
        for h in self.transports:
            ok = not isinstance(outcomes.get(h, 0), Exception)
            for key, data in target.files.items():
                if key[0] != h:
                    continue
                if ok:
                    self.live[key], self.expect[key] = data, {want_files[key]}
                else:  # unknown which edits of this host's batch happened: the old state or the new
                    self.live.pop(key, None)
                    self.expect[key] = self.expected(key) | {want_files[key]}
            for key, rt in target.repos.items():
                if key[0] != h:
                    continue
                if ok:
                    self.live_repos[key], self.expect_repos[key] = want_repos[key], {want_repos[key]}
                else:
                    self.live_repos.pop(key, None)
                    self.expect_repos[key] = self.expected_repo(key) | {want_repos[key]}
        self._first_error(outcomes)
        raise_on_env_check(env_results, SecretMasker(self.playbook.secret_names, self.playbook.secret_values,
                                                     key=Store(self.runs_root.parent).mask_key()))
        return {h: (0 if isinstance(v, Exception) else v) for h, v in outcomes.items()} | \
            {h: 0 for h in self.transports if h not in outcomes}

    def guard(self, host: str | None = None) -> None:
        """Before a stop or start: the host(s) must hold what envbisect last made (and the lock)."""
        if self.journal is None:
            return
        hosts = [host] if host else list(self.transports)
        o = self.journal.original
        files = {k: self.expected(k) for k in o.files}
        repos = {k: self.expected_repo(k) for k in o.repos}
        self._first_error(self._each_host(
            lambda h, t: run_ops(t, self._guarded([self._check_op(h, files, repos)])), hosts))

    def restore(self) -> list[dict[str, Any]]:
        """Put every journaled resource back exactly (bytes, mode, owner, mtime, HEAD and branch) when
        it is provably envbisect's own: it holds the original or a state envbisect made. Anything else
        is someone else's change: left as found and recorded. Returns the new conflicts."""
        assert self.journal is not None
        o = self.journal.original
        per_host: dict[str, list[dict[str, Any]]] = {h: [] for h in self.transports}
        for key, f in o.files.items():
            h, p = key
            if f.exists and f.content is not None:
                op: dict[str, Any] = {"op": "write", "path": p, "content_b64": b64(f.content), "mode": f.mode,
                                      "uid": f.uid, "gid": f.gid, "mtime_ns": f.mtime_ns, "atime_ns": f.atime_ns,
                                      "meta": [f.mode, f.uid, f.gid], "keep_meta": True}
            else:
                op = {"op": "write", "path": p, "delete": True}
            op.update(expect=list(self.expected(key) | {self._original_sha(key)}), skip_conflict=True)
            per_host[h] += [op, self._check_op(h, {key: [self._original_sha(key)]}, {}, skip_conflict=True)]
        for key, r in o.repos.items():
            h, p = key
            per_host[h] += [{"op": "checkout", "repo": p, "commit": r.head, "ref": r.ref, "skip_conflict": True,
                             "expect": [list(s) for s in self.expected_repo(key) | {(r.head, r.ref)}],
                             "mtimes": {"path": self.remote_mtimes, "run_id": self.run_id, "restore": True}},
                            self._check_op(h, {}, {key: [(r.head, r.ref)]}, skip_conflict=True)]

        def do(h: str, t: Transport) -> list[dict[str, Any]]:
            return _send(t, self._guarded(per_host[h])) if per_host[h] else []

        outcomes = self._each_host(do, [h for h in self.transports if per_host[h]])
        new: list[dict[str, Any]] = []
        for h, res in outcomes.items():
            if isinstance(res, Exception):
                for key in o.files:
                    if key[0] == h:
                        self.live.pop(key, None)
                        self.expect[key] = self.expected(key) | {self._original_sha(key)}
                for key, r in o.repos.items():
                    if key[0] == h:
                        self.live_repos.pop(key, None)
                        self.expect_repos[key] = self.expected_repo(key) | {(r.head, r.ref)}
                continue
            results = res[1:] if self._locked else res
            seen: set[str] = set()
            for r in results:
                c = r.get("conflict")
                if c and c["path"] not in seen:
                    seen.add(c["path"])
                    new.append({"host": h, **c})
            for r in results:  # the bytes are back; the mode or owner someone set during the run stays
                if r.get("kept_meta") and r["path"] not in seen:
                    sha = self._original_sha((h, r["path"]))
                    new.append({"host": h, "path": r["path"], "expected": [sha], "found": sha, "kept_meta": True,
                                "why": f"had its mode or owner changed during the run ({r['kept_meta']}): its bytes "
                                       "were put back and that change was kept"})
            for key, f in o.files.items():
                if key[0] != h:
                    continue
                if key[1] in seen:
                    found = next(c["found"] for c in new if c["host"] == h and c["path"] == key[1])
                    self.live.pop(key, None)
                    self.expect[key] = {found}
                else:
                    self.live[key] = f.content if f.exists else None
                    self.expect[key] = {self._original_sha(key)}
            for key, r in o.repos.items():
                if key[0] != h:
                    continue
                if key[1] in seen:
                    found = next(c["found"] for c in new if c["host"] == h and c["path"] == key[1])
                    self.live_repos.pop(key, None)
                    self.expect_repos[key] = {(found[0], found[1])}
                else:
                    self.live_repos[key] = (r.head, r.ref)
                    self.expect_repos[key] = {(r.head, r.ref)}
        if new:
            self._record_conflicts(new)
        self._first_error(outcomes)
        return new

    def _record_conflicts(self, new: list[dict[str, Any]]) -> None:
        """conflicts.json in the run, and each original next to it, for the operator to compare."""
        assert self.journal is not None
        self.conflicts.extend(new)
        for c in new:
            f = self.journal.original.files.get((c["host"], c["path"]))
            if f is not None and f.exists and f.content is not None:
                name = c["host"] + "-" + c["path"].strip("/").replace("/", "_") + ".original"
                write_private(self.run_dir / "conflicts" / name, f.content)
                c["original_copy"] = str(self.run_dir / "conflicts" / name)
        write_private(self.run_dir / "conflicts.json", json.dumps(self.conflicts, indent=1).encode())

    def finish(self) -> None:
        """After a verified restore (or a deliberate --leave fixed): the journal is history now."""
        if self.journal is None:
            return
        self.journal = Journal(**{**self.journal.__dict__, "state": "closed", "conflicts": tuple(self.conflicts)})
        faults.before("journal")
        write_private(self.local_journal, json.dumps(self.journal.to_json()).encode())
        for h, t in self.transports.items():
            try:
                _send(t, [{"op": "remove", "path": self.remote_journal, "run_id": self.run_id},
                          {"op": "remove", "path": self.remote_made, "run_id": self.run_id},
                          {"op": "remove", "path": self.remote_mtimes, "run_id": self.run_id}])
            except RemoteError:
                pass

    def abandon(self) -> None:
        """The run stops before its first edit: nothing to undo, so the journal is closed and the lock released."""
        if not self.edited:
            self.finish()
        self.unlock()

    @classmethod
    def resume_from(cls, playbook: Playbook, transports: Mapping[str, Transport], run_dir: Path,
                    journal: Journal, **kw: Any) -> "HostEditor":
        gone = sorted({h for h, _ in [*journal.original.files, *journal.original.repos]} - set(transports))
        if gone:
            raise UsageError(f"the journal of run {journal.run_id} names host(s) {', '.join(gone)} that are not in "
                             f"{playbook.path} any more; put them back in the playbook to restore them")
        ed = cls(playbook, transports, run_dir, journal.run_id, **kw)
        ed.journal = journal
        ed.conflicts = list(journal.conflicts)
        # After a crash the live state is unknown: every resource is rewritten, and may hold the
        # original or any state recorded as made.
        ed.live, ed.live_repos, ed.expect, ed.expect_repos = {}, {}, {}, {}
        ed.made = {k: set(v) for k, v in journal.made_files.items()}
        ed.made_repos = {k: set(v) for k, v in journal.made_repos.items()}
        ed.edited = True
        return ed


def read_original(playbook: Playbook, transports: Mapping[str, Transport], files: Iterable[Key],
                  repos: Iterable[Key]) -> OriginalState:
    """The files' and repos' state now (bytes, mode, owner, times; HEAD and branch), read without
    changing anything: what `begin` journals, and what a --dry-run compares against. Refused when
    an owner or group could not be put back by this ssh user."""
    files, repos = sorted(set(files)), sorted(set(repos))

    def read(h: str, t: Transport) -> dict[str, Any]:
        paths = [p for hh, p in files if hh == h]
        rps = [p for hh, p in repos if hh == h]
        return run_ops(t, [{"op": "read_state", "paths": paths, "repos": rps}])[0]

    states = for_each_host(playbook, transports, read)
    # Premise: every owner and group can be put back by this ssh user. Refused before any edit.
    for h, st in states.items():
        if st.get("problems"):
            more = f" (and {len(st['problems']) - 1} more)" if len(st["problems"]) > 1 else ""
            raise UsageError(f"{h}:{st['problems'][0]}{more}; refusing before any edit")
    fo: dict[Key, FileOriginal] = {}
    ro: dict[Key, RepoOriginal] = {}
    for h, st in states.items():
        for p, f in st["files"].items():
            fo[(h, p)] = FileOriginal(f["exists"], unb64(f.get("content_b64")), f.get("mode"), f.get("uid"),
                                      f.get("gid"), f.get("mtime_ns"), f.get("atime_ns"))
        for p, r in st["repos"].items():
            ro[(h, p)] = RepoOriginal(r["head"], r["ref"])
    return OriginalState(fo, ro)


