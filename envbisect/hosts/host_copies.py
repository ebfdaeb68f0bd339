"""The hosts' copies of a run's journal: each host gets the part about its own resources, naming the
host and the deployment and authenticated with the store's key (`host_copy`). A copy is used only
when the local journal is lost, and only when its HMAC verifies (`verified_copy`, `find_journal`).
"""
from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any, Mapping

from envbisect.errors import UsageError
from envbisect.hosts.agent_calls import run_ops, unb64
from envbisect.hosts.journal_records import Journal, local_journal_paths, made_path, remote_paths
from envbisect.hosts.transport import Transport
from envbisect.inputs.playbook import Playbook
from envbisect.state import rundir
from envbisect.state.configuration import FileOriginal, Key, OriginalState, RepoOriginal
from envbisect.state.store import Store

# A host is trusted for itself only. Its copy of the journal holds its own resources, names the host
# and the deployment, and carries an HMAC-SHA256 with the key in the local store (Store.journal_key):
# a copy someone else wrote (or one host's copy put on another) is refused, never used.

def _mac(key: bytes, doc: Mapping[str, Any]) -> str:
    body = json.dumps({k: v for k, v in doc.items() if k != "mac"}, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def host_copy(key: bytes, host: str, deployment: str, kind: str, doc: Mapping[str, Any]) -> bytes:
    """`doc` (a journal or made.json of `host`'s resources only) as that host's authenticated copy."""
    signed = {**doc, "kind": kind, "host": host, "deployment": deployment}
    return json.dumps({**signed, "mac": _mac(key, signed)}).encode()


def verified_copy(key: bytes | None, host: str, deployment: str, kind: str, raw: bytes,
                  run_id: str | None = None) -> dict[str, Any]:
    """The document of `host`'s copy when this controller wrote it for this host and deployment;
    otherwise a one-line UsageError (nothing of it is used)."""
    where = f"{host}: the {'journal' if kind == 'journal' else 'made.json'} copy on the host"
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        raise UsageError(f"{where} is damaged ({e}); not used") from None
    mac = doc.get("mac")
    if key is None or not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(key, doc)):
        raise UsageError(f"{where} is not authenticated by this controller (no valid HMAC with the key in its "
                         "store); it is not used: remove it from the host, or restore from the store that ran it")
    if doc.get("kind") != kind or doc.get("host") != host or doc.get("deployment") != deployment:
        raise UsageError(f"{where} was written for {doc.get('kind')} of host {doc.get('host')!r}, deployment "
                         f"{doc.get('deployment')!r}; not used")
    if set(doc.get("hosts", {})) - {host}:
        raise UsageError(f"{where} speaks for other hosts too; not used")
    rundir.check_run_id(doc.get("run_id"), f"{where} names run")
    if run_id is not None and doc.get("run_id") != run_id:
        raise UsageError(f"{where} is of run {doc.get('run_id')}, not {run_id}; not used")
    return doc


def closed_locally(runs_dir: Path, deployment: str, run_id: str) -> bool:
    """Does the store hold run `run_id`'s journal of `deployment`, closed? Then a host copy of that
    run saying "active" is stale (a copy taken during the run and put back after it): the local
    journal is authoritative."""
    try:
        paths = local_journal_paths(runs_dir, run_id)
    except UsageError:
        return False
    for p in paths:
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("deployment") == deployment and doc.get("run_id") == run_id \
                and doc.get("state") == "closed":
            return True
    return False


def stale_note(host: str, run_id: str) -> str:
    return (f"{host}: the host's journal copy of run {run_id} is stale: this store's journal of that run is closed "
            "(its changes were undone); ignored")


def find_journal(playbook: Playbook, transports: Mapping[str, Transport], runs_dir: Path,
                 run_id: str | None = None, *, notes: list[str] | None = None) -> Journal | None:
    """The newest active journal for this deployment (or run `run_id`'s). The local store's is
    authoritative: when it has one, the host copies are not read. Only when it has none (the store
    lost it) are the hosts' copies used, each for its own host's resources and only when its HMAC
    verifies with this store's key (`verified_copy`; otherwise one line, nothing used), and never
    for a run whose journal the store holds closed (said in `notes`)."""
    if run_id is not None:
        rundir.check_run_id(run_id)
    cands = []
    if runs_dir.exists():
        for p in local_journal_paths(runs_dir, run_id):
            try:
                doc = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            if doc.get("deployment") == playbook.name and doc.get("state") == "active":
                j = Journal.from_json(doc)
                try:
                    j = j.with_made(json.loads((p.parent / rundir.MADE).read_text()))
                except (OSError, ValueError):
                    pass
                cands.append(j)
    if cands:
        return max(cands, key=lambda j: j.created_at)
    key = Store(runs_dir.parent).journal_key(create=False)
    remote, remote_made = remote_paths(playbook.name)[1], made_path(playbook.name)
    per_host: dict[str, tuple[Journal, dict | None]] = {}
    for h, t in transports.items():
        got = run_ops(t, [{"op": "get", "path": remote}, {"op": "get", "path": remote_made}])
        raw = unb64(got[0].get("content_b64"))
        if not raw:
            continue
        doc = verified_copy(key, h, playbook.name, "journal", raw, run_id)
        try:
            j = Journal.from_json(doc)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise UsageError(f"{h}: the journal on the host is damaged ({e})") from None
        if j.state != "active":
            continue
        if closed_locally(runs_dir, playbook.name, j.run_id):
            if notes is not None:
                notes.append(stale_note(h, j.run_id))
            continue
        made_raw = unb64(got[1].get("content_b64"))
        made = verified_copy(key, h, playbook.name, "made", made_raw, j.run_id) if made_raw else None
        per_host[h] = (j, made)
    if not per_host:
        return None
    newest = max(per_host.values(), key=lambda jm: jm[0].created_at)[0]
    files: dict[Key, FileOriginal] = {}
    repos: dict[Key, RepoOriginal] = {}
    for j, _ in per_host.values():
        if j.run_id == newest.run_id:
            files.update(j.original.files)
            repos.update(j.original.repos)
    found = Journal(newest.run_id, playbook.name, min(j.created_at for j, _ in per_host.values()
                                                      if j.run_id == newest.run_id), OriginalState(files, repos))
    for j, made in per_host.values():
        if j.run_id == newest.run_id:
            found = found.with_made(made)
    return found
