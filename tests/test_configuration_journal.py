"""Trial configurations (pure) and the journal/restore cycle on a real tree, locally and over sshd."""
from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

import pytest

from envbisect.state.configuration import FileOriginal, OriginalState, RepoOriginal, target_state, touched
from envbisect.state.deltas import Delta
from envbisect.runs.deployment import ConnectOptions, Deployment
from envbisect.errors import LockHeld, RemoteError
from envbisect.hosts.journal import HostEditor, find_journal
from envbisect.inputs.playbook import load_playbook
from envbisect.state.store import Store

from hosttree import DECODE, git, make_tree

ENV = b"# decode\nexport A=1   # keep me\nB='x y'\nexport C=3\n"


def d(id_, kind="env", change="changed", old=None, new=None, key=None, path="/e", host="h") -> Delta:
    return Delta(id_, kind, host, "decode" if kind == "env" else None, path, key, change, old, new, "snapshot:x")


def test_target_state_rewrites_only_reverted_lines():
    orig = OriginalState({("h", "/e"): FileOriginal(True, ENV)}, {})
    deltas = [d("decode:A", key="A", old="0", new="1"), d("decode:B", key="B", change="added", new="x y"),
              d("decode:Z", key="Z", change="removed", old="$(touch /tmp/pwned)")]
    # everything applied: the current file, byte for byte
    assert target_state(orig, deltas, {"decode:A", "decode:B", "decode:Z"}, {}).files[("h", "/e")] == ENV
    # nothing applied: the baseline, every untouched byte kept, the removed value quoted safely
    base = target_state(orig, deltas, set(), {}).files[("h", "/e")].decode()
    assert base == "# decode\nexport A=0   # keep me\nexport C=3\nexport Z='$(touch /tmp/pwned)'\n"
    only_a = target_state(orig, deltas, {"decode:A"}, {}).files[("h", "/e")].decode()
    assert only_a == "# decode\nexport A=1   # keep me\nexport C=3\nexport Z='$(touch /tmp/pwned)'\n"


def sha(b: bytes) -> str:
    import hashlib

    return hashlib.sha256(b).hexdigest()


def test_target_state_git_and_file_deltas():
    orig = OriginalState({("h", "/f"): FileOriginal(True, b"new"), ("h", "/n"): FileOriginal(True, b"added")},
                         {("h", "/r"): RepoOriginal("bbb", "refs/heads/main")})
    deltas = [d("git:h:/r", kind="git", old="aaa", new="bbb", path="/r"),
              d("file:h:/f", kind="file", old=sha(b"old"), new=sha(b"new"), path="/f"),
              d("file:h:/n", kind="file", change="added", new=sha(b"added"), path="/n")]
    t = target_state(orig, deltas, set(), {sha(b"old"): b"old"})
    assert t.repos[("h", "/r")].commit == "aaa" and t.repos[("h", "/r")].ref is None
    assert t.files[("h", "/f")] == b"old" and t.files[("h", "/n")] is None
    t = target_state(orig, deltas, {"git:h:/r", "file:h:/f", "file:h:/n"}, {sha(b"old"): b"old"})
    assert t.repos[("h", "/r")].ref == "refs/heads/main" and t.files[("h", "/f")] == b"new"
    assert t.files[("h", "/n")] == b"added"
    # from a partly reverted live state, putting one delta back touches only that delta
    live = OriginalState({("h", "/f"): FileOriginal(True, b"old"), ("h", "/n"): FileOriginal(False)},
                         {("h", "/r"): RepoOriginal("aaa", None)})
    t = target_state(live, deltas, {"file:h:/f"}, {sha(b"old"): b"old", sha(b"new"): b"new"})
    assert t.files == {("h", "/f"): b"new", ("h", "/n"): None} and t.repos[("h", "/r")].commit == "aaa"
    assert touched(deltas) == ({("h", "/f"), ("h", "/n")}, {("h", "/r")})


def test_target_state_from_partly_reverted_env_file():
    live = OriginalState({("h", "/e"): FileOriginal(True, b"export A=0   # keep me\nexport C=3\n")}, {})
    deltas = [d("decode:A", key="A", old="0", new="1"), d("decode:B", key="B", change="added", new="x y")]
    t = target_state(live, deltas, {"decode:A", "decode:B"}, {})
    assert t.files[("h", "/e")] == b"export A=1   # keep me\nexport C=3\nexport B='x y'\n"


@pytest.fixture(params=["local", "ssh"])
def dep_and_tree(request, tmp_path):
    tree = make_tree(tmp_path / "host")
    if request.param == "local":
        ssh, cfg = "local", None
    else:
        server = request.getfixturevalue("sshd")
        ssh, cfg = server.alias, str(server.ssh_config)
    # a name of its own: the lock and the host journal live in the (shared) ~/.envbisect
    name = "testdep-" + uuid.uuid4().hex[:8]
    dep = Deployment(load_playbook(tree.playbook(ssh, name=name)), Store(tmp_path / "store"),
                     ConnectOptions(ssh_config=cfg))
    yield dep, tree
    dep.close()
    for p in Path(os.path.expanduser("~/.envbisect")).glob(name + ".*"):
        p.unlink()


def fingerprint(path):
    st = os.stat(path)
    return path.read_bytes(), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns


def test_apply_then_restore_is_byte_identical(dep_and_tree, tmp_path):
    dep, tree = dep_and_tree
    env = tree.env("decode")
    os.chmod(env, 0o640)
    before = fingerprint(env)
    head = git(tree.repo, "rev-parse", "HEAD")
    new_head = tree.commit("v2", "v2\n")
    # runs_root: the store is tmp_path (its journal key authenticates the host copy read back below)
    editor = HostEditor(dep.playbook, dep.transports, tmp_path / "run", "run-1", runs_root=tmp_path / "runs")
    editor.lock()
    orig = editor.begin({("node1", str(env))}, {("node1", str(tree.repo))})
    assert (tmp_path / "run" / "journal.json").exists()
    assert oct(os.stat(tmp_path / "run" / "journal.json").st_mode & 0o777) == "0o600"
    deltas = [d("decode:SGLANG_KV_PAGE_SIZE", key="SGLANG_KV_PAGE_SIZE", old="32", new="64", path=str(env), host="node1"),
              d(f"git:node1:{tree.repo}", kind="git", old=head, new=new_head, path=str(tree.repo), host="node1")]
    editor.apply(target_state(orig, deltas, set(), {}))
    assert env.read_text() == DECODE.replace("SGLANG_KV_PAGE_SIZE=64", "SGLANG_KV_PAGE_SIZE=32")
    assert stat.S_IMODE(os.stat(env).st_mode) == 0o640  # mode kept through the atomic rewrite
    assert git(tree.repo, "rev-parse", "HEAD") == head
    # a second envbisect is refused while this run holds the lock
    other = HostEditor(dep.playbook, dep.transports, tmp_path / "run2", "run-2")
    with pytest.raises(LockHeld, match="locked by run run-1"):
        other.lock()
    # the journal is on the host too, so a crashed controller can still be undone
    j = find_journal(dep.playbook, dep.transports, tmp_path / "nowhere")
    assert j is not None and j.run_id == "run-1"
    editor.restore()
    editor.finish()
    editor.unlock()
    assert fingerprint(env) == before
    assert git(tree.repo, "rev-parse", "HEAD") == new_head
    assert git(tree.repo, "symbolic-ref", "HEAD") == "refs/heads/main"
    assert find_journal(dep.playbook, dep.transports, tmp_path / "nowhere") is None


def test_dirty_repo_is_refused_clearly(dep_and_tree, tmp_path):
    dep, tree = dep_and_tree
    head = git(tree.repo, "rev-parse", "HEAD")
    new_head = tree.commit("v2", "v2\n")
    (tree.repo / "VERSION").write_text("local edit\n")
    editor = HostEditor(dep.playbook, dep.transports, tmp_path / "run", "run-1")
    orig = editor.begin(set(), {("node1", str(tree.repo))})
    deltas = [d("git:x", kind="git", old=head, new=new_head, path=str(tree.repo), host="node1")]
    with pytest.raises(RemoteError, match="uncommitted changes"):
        editor.apply(target_state(orig, deltas, set(), {}))
    assert (tree.repo / "VERSION").read_text() == "local edit\n"
    editor.finish()  # an active journal on the host would (rightly) refuse the next run


def test_stale_lock_of_dead_controller_is_recognized(dep_and_tree, tmp_path):
    dep, tree = dep_and_tree
    import json
    import socket

    lock = os.path.expanduser(f"~/.envbisect/{dep.playbook.name}.lock")
    os.makedirs(os.path.dirname(lock), exist_ok=True)
    from envbisect.hosts.journal import boot_id, pid_namespace

    with open(lock, "w") as f:  # a controller on this machine (this boot, this pid namespace) whose pid is gone
        json.dump({"run_id": "dead-run", "controller": socket.gethostname(), "boot_id": boot_id(),
                   "pid_ns": pid_namespace(),
                   "pid": 2 ** 22 + 12345, "token": "dead-token"}, f)
    editor = HostEditor(dep.playbook, dep.transports, tmp_path / "run", "run-3")
    editor.lock()
    editor.unlock()
    assert not os.path.exists(lock)


def test_restoring_a_dirty_repo_whose_head_never_moved_leaves_no_conflict(dep_and_tree, tmp_path):
    """A deployed repo with a hotfix edited in place (uncommitted), journaled by a run whose trials
    never moved its HEAD: restore's checkout has nothing to do, so it must not refuse ("has
    uncommitted changes; not touched: left as found") and record the hotfix as someone's conflict."""
    dep, tree = dep_and_tree
    head = git(tree.repo, "rev-parse", "HEAD")
    (tree.repo / "VERSION").write_text("hotfix on the box\n")
    editor = HostEditor(dep.playbook, dep.transports, tmp_path / "run", "run-1")
    editor.begin(set(), {("node1", str(tree.repo))})
    assert editor.restore() == []
    editor.finish()
    assert (tree.repo / "VERSION").read_text() == "hotfix on the box\n"
    assert git(tree.repo, "rev-parse", "HEAD") == head
