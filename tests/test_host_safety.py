"""Host safety (issue 8, items 1-3): compare-and-swap on every host change, locks and journals that
survive crashes and other controllers, owners and modes kept. Real trees through the local transport
and a real sshd, real git, real child processes killed with -9. See docs/safety.md."""
from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from envbisect.state.configuration import TargetState, target_state
from envbisect.state.deltas import Delta
from envbisect.runs.deployment import ConnectOptions, Deployment
from envbisect.errors import ExitStatus, HostConflict, LockHeld, LockLost, RemoteError
from envbisect.hosts.journal import HostEditor, find_journal, remote_paths
from envbisect.inputs.playbook import load_playbook
from envbisect.state.store import Store

from hosttree import DECODE, PREFILL, git, make_tree

ROOT = os.geteuid() == 0


def env_delta(tree, service: str, key: str, old: str | None, new: str | None) -> Delta:
    path = str(tree.env(service))
    change = "added" if old is None else "removed" if new is None else "changed"
    return Delta(f"{service}:{key}", "env", "node1", service, path, key, change, old, new, "snapshot:x")


def git_delta(tree, old: str, new: str) -> Delta:
    return Delta(f"git:node1:{tree.repo}", "git", "node1", None, str(tree.repo), None, "changed", old, new, "snapshot:x")


def meta(path: Path) -> tuple:
    st = os.stat(path)
    return path.read_bytes(), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns


def cleanup_host_files(name: str) -> None:
    lock, journal = (Path(os.path.expanduser(p)) for p in remote_paths(name))
    for p in (lock, journal, Path(str(lock) + ".guard"), Path(str(journal)[: -len(".journal.json")] + ".made.json")):
        p.unlink(missing_ok=True)


class Site:
    def __init__(self, tmp_path: Path, ssh: str, ssh_config: str | None):
        self.tree = make_tree(tmp_path / "host")
        self.name = "safety-" + uuid.uuid4().hex[:8]  # lock and host journal are per deployment name
        self.playbook = self.tree.playbook(ssh, name=self.name)
        self.ssh_config = ssh_config
        self.store = tmp_path / "store"
        self.dep = Deployment(load_playbook(self.playbook), Store(self.store), ConnectOptions(ssh_config=ssh_config))
        self.lock_file = Path(os.path.expanduser(remote_paths(self.name)[0]))

    def editor(self, run_id: str, **kw) -> HostEditor:
        return HostEditor(self.dep.playbook, self.dep.transports, self.store / "runs" / run_id, run_id, **kw)

    def child(self, code: str, **env) -> subprocess.Popen:
        """A separate controller process (same machine) running `code` with `ed`, `site` names bound."""
        prelude = textwrap.dedent(f"""
            import os, sys, time, signal
            from pathlib import Path
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            from envbisect.runs.deployment import ConnectOptions, Deployment
            from envbisect.hosts.journal import HostEditor
            from envbisect.state.configuration import TargetState
            from envbisect.inputs.playbook import load_playbook
            from envbisect.state.store import Store
            dep = Deployment(load_playbook({str(self.playbook)!r}), Store({str(self.store)!r}),
                             ConnectOptions(ssh_config={self.ssh_config!r}))
            DECODE, PREFILL = {str(self.tree.env('decode'))!r}, {str(self.tree.env('prefill'))!r}
            """)
        return subprocess.Popen([sys.executable, "-c", prelude + textwrap.dedent(code)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, **env})


@pytest.fixture(params=["local", "ssh"])
def site(request, tmp_path):
    if request.param == "local":
        s = Site(tmp_path, "local", None)
    else:
        server = request.getfixturevalue("sshd")
        s = Site(tmp_path, server.alias, str(server.ssh_config))
    yield s
    s.dep.close()
    cleanup_host_files(s.name)


def kv_deltas(tree) -> list[Delta]:
    # both files hold SGLANG_KV_PAGE_SIZE=64 now; the baseline had 32
    return [env_delta(tree, "decode", "SGLANG_KV_PAGE_SIZE", "32", "64"),
            env_delta(tree, "prefill", "SGLANG_KV_PAGE_SIZE", "32", "64")]


def keys(tree, *services: str) -> set:
    return {("node1", str(tree.env(s))) for s in services}


# --- 1. compare-and-swap ---------------------------------------------------------------------------

def test_operator_edit_during_a_run_is_kept_and_stops_the_run(site):
    """Reproduction: an operator adds `export SGLANG_HOTFIX=1` to decode.serve-env while a bisection
    runs; the next write and the final restore used to replace the file without a word."""
    tree = site.tree
    before_prefill = meta(tree.env("prefill"))
    ed = site.editor("run-cas")
    ed.lock()
    orig = ed.begin(keys(tree, "decode", "prefill"), set())
    deltas = kv_deltas(tree)
    ed.apply(target_state(orig, deltas, set(), {}))  # a trial: both files at the baseline value
    operator = tree.env("decode").read_text() + "export SGLANG_HOTFIX=1\n"
    tree.env("decode").write_text(operator)
    # every stop/start checks first: one clear line naming the file
    with pytest.raises(HostConflict, match=r"decode\.serve-env: changed by someone else during the run"):
        ed.guard()
    with pytest.raises(HostConflict, match=r"decode\.serve-env") as exc:
        ed.apply(target_state(orig, deltas, {"decode:SGLANG_KV_PAGE_SIZE", "prefill:SGLANG_KV_PAGE_SIZE"}, {}))
    assert exc.value.exit_status == ExitStatus.CONFLICT == 7
    assert tree.env("decode").read_text() == operator  # their change is left in place
    conflicts = ed.restore()
    assert [(c["host"], c["path"]) for c in conflicts] == [("node1", str(tree.env("decode")))]
    assert tree.env("decode").read_text() == operator
    assert meta(tree.env("prefill")) == before_prefill  # what is provably envbisect's own is restored
    ed.guard()  # the restored state is now what envbisect expects (the co-restart may proceed)
    ed.finish()
    ed.unlock()
    # the conflict is recorded in the run, with the original for the operator to compare
    run = site.store / "runs" / "run-cas"
    recorded = json.loads((run / "conflicts.json").read_text())
    assert recorded[0]["path"] == str(tree.env("decode")) and "changed by someone else" in recorded[0]["why"]
    assert Path(recorded[0]["original_copy"]).read_text() == DECODE
    assert json.loads((run / "journal.json").read_text())["conflicts"][0]["path"] == str(tree.env("decode"))
    assert find_journal(site.dep.playbook, site.dep.transports, site.store / "runs") is None


def test_branch_advanced_during_a_run_is_not_reset(site):
    """Reproduction: checkout did `reset --keep` to the journaled commit, dropping a branch advance
    made meanwhile. Now the branch stays; HEAD goes back to the original commit, detached."""
    tree = site.tree
    old = git(tree.repo, "rev-parse", "HEAD")
    new = tree.commit("v2", "v2\n")
    ed = site.editor("run-branch")
    ed.lock()
    orig = ed.begin(set(), {("node1", str(tree.repo))})
    delta = git_delta(tree, old, new)
    ed.apply(target_state(orig, [delta], set(), {}))  # trial: detached at the old commit
    assert git(tree.repo, "rev-parse", "HEAD") == old
    # someone advances main meanwhile (a deploy tool updating the branch)
    hotfix = git(tree.repo, "commit-tree", f"{new}^{{tree}}", "-p", new, "-m", "hotfix")
    git(tree.repo, "update-ref", "refs/heads/main", hotfix)
    # a trial that would go back onto main refuses without touching anything
    with pytest.raises(HostConflict, match="branch refs/heads/main moved"):
        ed.apply(target_state(orig, [delta], {delta.id}, {}))
    assert git(tree.repo, "rev-parse", "HEAD") == old and git(tree.repo, "rev-parse", "main") == hotfix
    conflicts = ed.restore()
    assert len(conflicts) == 1 and "not moving it back" in conflicts[0]["why"]
    assert git(tree.repo, "rev-parse", "main") == hotfix  # their advance is kept
    assert git(tree.repo, "rev-parse", "HEAD") == new  # the code is as it was before the run
    ed.finish()
    ed.unlock()


def test_applied_state_is_verified_before_anything_restarts_on_it(site, monkeypatch):
    """issue 8 part 1: after every apply the state on the host is checked (hashes) in the same batch,
    before any restart. Here a writer lands between envbisect's write and that check (simulated by
    splitting the batch there): the apply raises a conflict naming the file, nothing is restarted
    on a configuration that is not the one asked for, and the writer's bytes are left in place."""
    import envbisect.hosts.journal as J

    tree = site.tree
    ed = site.editor("run-verify")
    ed.lock()
    orig = ed.begin(keys(tree, "decode", "prefill"), set())
    deltas = kv_deltas(tree)
    theirs = "export SGLANG_KV_PAGE_SIZE=128  # written by someone else mid-apply\n"
    real = J.run_ops

    def racing(t, ops, **kw):
        kinds = [op["op"] for op in ops]
        if "write" in kinds and "check" in kinds:
            cut = kinds.index("check")
            head = real(t, ops[:cut], **kw)
            tree.env("decode").write_text(theirs)  # lands after the write, before the check
            return head + real(t, ops[cut:], **kw)
        return real(t, ops, **kw)

    monkeypatch.setattr(J, "run_ops", racing)
    with pytest.raises(HostConflict, match=r"decode\.serve-env: is not what envbisect just wrote") as exc:
        ed.apply(target_state(orig, deltas, set(), {}))
    assert exc.value.exit_status == ExitStatus.CONFLICT
    monkeypatch.setattr(J, "run_ops", real)
    with pytest.raises(HostConflict):  # and no stop/start would go ahead on it
        ed.guard()
    conflicts = ed.restore()
    assert [c["path"] for c in conflicts] == [str(tree.env("decode"))]
    assert tree.env("decode").read_text() == theirs and tree.env("prefill").read_text() == PREFILL
    ed.finish()
    ed.unlock()


def test_head_moved_by_someone_is_a_conflict(site):
    tree = site.tree
    old = git(tree.repo, "rev-parse", "HEAD")
    new = tree.commit("v2", "v2\n")
    ed = site.editor("run-head")
    ed.lock()
    orig = ed.begin(set(), {("node1", str(tree.repo))})
    delta = git_delta(tree, old, new)
    ed.apply(target_state(orig, [delta], set(), {}))
    git(tree.repo, "checkout", "-q", "main")  # someone puts the checkout back on main
    with pytest.raises(HostConflict, match="HEAD"):
        ed.guard()
    git(tree.repo, "checkout", "-q", "--detach", old)
    ed.guard()
    ed.restore()
    assert git(tree.repo, "symbolic-ref", "HEAD") == "refs/heads/main" and git(tree.repo, "rev-parse", "HEAD") == new
    ed.finish()
    ed.unlock()


def test_partly_failed_apply_does_not_leave_the_edit_cache_wrong(tmp_path, sshd):
    """Reproduction: host 1's write succeeded, host 2's failed; the next trial made zero edits and
    ran with host 2 still on the old value. Two hosts: node1 local, node2 over a real sshd whose
    connection is cut right before the edit."""
    t1, t2 = make_tree(tmp_path / "h1"), make_tree(tmp_path / "h2")
    name = "safety-" + uuid.uuid4().hex[:8]
    pb = tmp_path / "two.toml"
    pb.write_text(textwrap.dedent(f"""
        [deployment]
        name = "{name}"
        [hosts.node1]
        ssh = "local"
        python = "{sys.executable}"
        [hosts.node2]
        ssh = "{sshd.alias}"
        python = "{sys.executable}"
        [services.decode]
        host = "node1"
        env_file = "{t1.env('decode')}"
        start = "true"
        stop = "true"
        health = "http://127.0.0.1:1/health"
        [services.prefill]
        host = "node2"
        env_file = "{t2.env('prefill')}"
        start = "true"
        stop = "true"
        health = "http://127.0.0.1:2/health"
        """))
    dep = Deployment(load_playbook(pb), Store(tmp_path / "store"), ConnectOptions(ssh_config=str(sshd.ssh_config)))
    try:
        k1, k2 = ("node1", str(t1.env("decode"))), ("node2", str(t2.env("prefill")))
        before = meta(t1.env("decode")), meta(t2.env("prefill"))
        ed = HostEditor(dep.playbook, dep.transports, tmp_path / "store" / "runs" / "r", "run-partial")
        ed.lock()
        orig = ed.begin({k1, k2}, set())
        deltas = [Delta("decode:SGLANG_KV_PAGE_SIZE", "env", "node1", "decode", k1[1], "SGLANG_KV_PAGE_SIZE",
                        "changed", "32", "64", "x"),
                  Delta("prefill:SGLANG_KV_PAGE_SIZE", "env", "node2", "prefill", k2[1], "SGLANG_KV_PAGE_SIZE",
                        "changed", "32", "64", "x")]
        baseline = target_state(orig, deltas, set(), {})
        for pid in subprocess.run(["pgrep", "-P", str(sshd.proc.pid)], capture_output=True, text=True).stdout.split():
            os.kill(int(pid), signal.SIGKILL)  # node2's connection drops
        time.sleep(0.3)
        with pytest.raises(RemoteError, match="node2"):
            ed.apply(baseline)
        assert "SGLANG_KV_PAGE_SIZE=32" in t1.env("decode").read_text()  # host 1 was written
        assert "SGLANG_KV_PAGE_SIZE=64" in t2.env("prefill").read_text()  # host 2 was not
        assert k1 in ed.live and k2 not in ed.live  # host 2's state is unknown, not assumed
        dep.reconnect()
        counts = ed.apply(baseline)  # the same configuration again: host 2 is written now
        assert counts == {"node1": 0, "node2": 1}
        assert "SGLANG_KV_PAGE_SIZE=32" in t2.env("prefill").read_text()
        ed.guard()
        ed.restore()
        ed.finish()
        ed.unlock()
        assert (meta(t1.env("decode")), meta(t2.env("prefill"))) == before
    finally:
        dep.close()
        cleanup_host_files(name)


# --- 2. locks and journals -------------------------------------------------------------------------

CRASHING_RUN = """
    ed = HostEditor(dep.playbook, dep.transports, Path({run_dir!r}), "crashed-run")
    ed.lock()
    ed.begin({{("node1", DECODE), ("node1", PREFILL)}}, set())
    ed.apply(TargetState({{("node1", DECODE): b"export TRIAL=1\\n", ("node1", PREFILL): b"export TRIAL=1\\n"}}, {{}}))
    print("applied", flush=True)
    time.sleep(120)
"""


def test_crashed_run_is_never_taken_over_and_its_journal_never_overwritten(site):
    """Reproduction: after kill -9, a second run on the same controller took the lock (dead pid),
    journaled the half-applied state as "original" and overwrote the host journal; `restore` then
    found nothing. Killed here between its two writes (the test-only crash hook)."""
    tree = site.tree
    before = meta(tree.env("decode")), meta(tree.env("prefill"))
    p = site.child(CRASHING_RUN.format(run_dir=str(site.store / "runs" / "crashed-run")),
                   ENVBISECT_TEST_CRASH_AT="write:2")
    _, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL, err
    written = [s for s in ("decode", "prefill") if tree.env(s).read_text() == "export TRIAL=1\n"]
    assert len(written) == 1  # half applied
    ed = site.editor("run-2")
    with pytest.raises(LockHeld, match=r"run crashed-run left changes on this host that are not undone yet.*"
                                       r"envbisect restore --run crashed-run"):
        ed.lock()
    with pytest.raises(LockHeld, match="crashed-run"):
        ed.lock(break_lock=True)  # not even --break-lock takes over an active journal
    j = find_journal(site.dep.playbook, site.dep.transports, site.store / "runs", "crashed-run")
    assert j is not None and j.state == "active"
    r = HostEditor.resume_from(site.dep.playbook, site.dep.transports, site.store / "runs" / "crashed-run", j)
    notes = r.lock(restoring="crashed-run")
    assert any("took over the stale lock of run crashed-run" in n for n in notes)
    assert r.restore() == []
    r.finish()
    r.unlock()
    assert (meta(tree.env("decode")), meta(tree.env("prefill"))) == before
    assert ed.lock() == []  # now a new run may start
    ed.unlock()


def test_restore_refuses_while_the_owning_run_is_alive_and_locks_first(site):
    """Reproduction: `restore` edited the hosts before taking the lock, then force-took it."""
    tree = site.tree
    before = meta(tree.env("decode"))
    p = site.child(CRASHING_RUN.format(run_dir=str(site.store / "runs" / "crashed-run")))
    assert p.stdout.readline().strip() == "applied"
    try:
        j = find_journal(site.dep.playbook, site.dep.transports, site.store / "runs")
        r = HostEditor.resume_from(site.dep.playbook, site.dep.transports, site.store / "runs" / j.run_id, j)
        with pytest.raises(LockHeld, match=rf"run crashed-run is still running \(controller {socket.gethostname()}, "
                                           rf"pid {p.pid}"):
            r.lock(restoring=j.run_id)
        assert tree.env("decode").read_text() == "export TRIAL=1\n"  # nothing was touched
        # the same through what a user runs: the library's restore_deployment and `envbisect restore`
        from envbisect.runs.bisect import restore_deployment

        with pytest.raises(LockHeld, match="is still running"):
            restore_deployment(site.dep, run_id=j.run_id)
        cli = [sys.executable, "-m", "envbisect.cli.app", "-p", str(site.playbook), "--store", str(site.store)]
        if site.ssh_config:
            cli += ["--ssh-config", site.ssh_config]
        out = subprocess.run(cli + ["restore", "--run", j.run_id], capture_output=True, text=True, timeout=60)
        assert out.returncode == ExitStatus.USAGE and "is still running" in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
        assert tree.env("decode").read_text() == "export TRIAL=1\n"  # still nothing touched
    finally:
        p.kill()
        p.wait()
    r.lock(restoring=j.run_id)
    r.restore()
    r.finish()
    r.unlock()
    assert meta(tree.env("decode")) == before


def test_heartbeat_keeps_a_live_lock_older_than_an_hour(site):
    """Reproduction: a live run older than one hour lost its lock to a newcomer (nothing refreshed it)."""
    a = site.editor("run-long", heartbeat_s=0.2)
    a.lock()
    old = time.time() - 7200
    os.utime(site.lock_file, (old, old))  # as if taken two hours ago
    # a few heartbeats (each is an ssh round trip: on a loaded machine they may take a while)
    deadline = time.time() + 15
    while time.time() - site.lock_file.stat().st_mtime >= 2 and time.time() < deadline:
        time.sleep(0.1)
    assert time.time() - site.lock_file.stat().st_mtime < 2
    b = site.editor("run-new", stale_after_s=1)
    b.owner["controller"] = "another-controller"  # pid liveness cannot be checked: only the heartbeat counts
    with pytest.raises(LockHeld, match=r"locked by run run-long \(controller .*, last heartbeat 0 s ago\).*--break-lock"):
        b.lock()
    # a holder whose heartbeat stopped (its controller vanished) is stale after stale_after_s
    a.stop_heartbeat()
    time.sleep(1.3)
    notes = b.lock()
    assert any("took over the stale lock of run run-long" in n for n in notes)
    with pytest.raises(LockLost, match="no longer this run's"):
        a.begin(keys(site.tree, "decode"), set())  # its next mutation stops: the lock is not its own
    b.unlock()


def test_break_lock_says_whose_and_the_holder_stops(site):
    a = site.editor("run-a", heartbeat_s=0.2)
    a.lock()
    b = site.editor("run-b")
    b.owner["controller"] = "another-controller"
    with pytest.raises(LockHeld, match="locked by run run-a"):
        b.lock()
    notes = b.lock(break_lock=True)
    assert notes == [f"node1: broke the lock of run run-a (controller {socket.gethostname()}, pid {os.getpid()}, "
                     f"last heartbeat 0 s ago)"]
    time.sleep(0.6)
    assert a.lock_lost and "held by run run-b" in a.lock_lost  # the heartbeat noticed
    with pytest.raises(LockLost):
        a.begin(keys(site.tree, "decode"), set())
    a.unlock()  # does not remove b's lock
    assert json.loads(site.lock_file.read_text())["run_id"] == "run-b"
    b.unlock()
    assert not site.lock_file.exists()


RACER = """
    ed = HostEditor(dep.playbook, dep.transports, Path({run_dir!r}), {run_id!r}, heartbeat_s=0)
    while not os.path.exists({go!r}):
        time.sleep(0.001)
    try:
        ed.lock()
        print("won", flush=True)
        time.sleep(1.5)
        ed.unlock()
    except Exception as e:
        print("lost:", e, flush=True)
"""


def test_two_controllers_race_for_the_lock(site, tmp_path):
    for rnd in range(3):
        go = tmp_path / f"go{rnd}"
        racers = [site.child(RACER.format(run_dir=str(tmp_path / f"r{rnd}{i}"), run_id=f"racer-{rnd}-{i}", go=str(go)))
                  for i in range(2)]
        time.sleep(1.5)  # both connected and waiting
        go.touch()
        outs = [p.communicate(timeout=60)[0].strip() for p in racers]
        assert sorted(o.split(":")[0] for o in outs) == ["lost", "won"], outs
        assert "is locked by run racer-" in [o for o in outs if o.startswith("lost")][0]
    assert not site.lock_file.exists()


# --- 3. ownership and permissions ------------------------------------------------------------------

@pytest.mark.skipif(not ROOT, reason="needs root to give files other owners")
def test_owner_group_and_mode_kept_through_edits_and_restore(site):
    tree = site.tree
    env = tree.env("decode")
    os.chown(env, 1234, 1234)
    os.chmod(env, 0o2640)  # setgid too: chown would clear it if done after chmod
    before = meta(env)
    ed = site.editor("run-owner")
    ed.lock()
    orig = ed.begin(keys(tree, "decode"), set())
    ed.apply(target_state(orig, kv_deltas(tree)[:1], set(), {}))
    st = os.stat(env)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 1234, 0o2640)
    ed.restore()
    ed.finish()
    ed.unlock()
    assert meta(env) == before


NOBODY = 65534
AS_NOBODY = r"""
import json, os, sys
from pathlib import Path
import envbisect.hosts.agent_calls as H
from envbisect.state.configuration import TargetState
from envbisect.errors import UsageError
from envbisect.hosts.journal import HostEditor
from envbisect.inputs.playbook import load_playbook
from envbisect.hosts.transport import LocalTransport
pb_path, path, run_dir, home = sys.argv[1:5]
H.agent_source("hostops.py"), H.agent_source("server.py")  # everything read from the (root-only) install is read before the uid changes
pb = load_playbook(pb_path)
os.environ["HOME"] = home
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
ed = HostEditor(pb, {"node1": LocalTransport("node1", "/usr/bin/python3")}, Path(run_dir), "nobody-run", heartbeat_s=0)
ed.lock()
try:
    ed.begin({("node1", path)}, set())
except UsageError as e:
    ed.abandon()
    print(json.dumps({"refused": str(e)}))
    sys.exit(0)
ed.apply(TargetState({("node1", path): b"export EDITED=1\n"}, {}))
st = os.stat(path)
after = [st.st_uid, st.st_gid, st.st_mode & 0o7777]
ed.restore()
ed.finish()
ed.unlock()
print(json.dumps({"after_apply": after}))
"""


@pytest.fixture
def nobody_site():
    """A tree that uid 65534 can reach (pytest's tmp dirs are root-only)."""
    base = Path(tempfile.mkdtemp(prefix="envbisect-nobody-", dir="/tmp"))
    os.chmod(base, 0o755)
    for d in ("conf", "run", "home"):
        (base / d).mkdir()
        os.chown(base / d, NOBODY, NOBODY)
    name = "safety-" + uuid.uuid4().hex[:8]
    pb = base / "pb.toml"
    pb.write_text(textwrap.dedent(f"""
        [deployment]
        name = "{name}"
        [hosts.node1]
        ssh = "local"
        python = "/usr/bin/python3"
        [services.decode]
        host = "node1"
        env_file = "{base}/conf/decode.serve-env"
        start = "true"
        stop = "true"
        health = "http://127.0.0.1:1/health"
        """))
    yield base, pb
    subprocess.run(["rm", "-rf", str(base)])


@pytest.mark.skipif(not ROOT or not os.path.exists("/usr/bin/python3"), reason="needs root to switch to uid 65534")
@pytest.mark.parametrize("owner,ok", [((1234, 1234), False), ((NOBODY, 1234), False), ((NOBODY, NOBODY), True)],
                         ids=["other-owner", "other-group", "own-file"])
def test_non_root_ssh_user_is_refused_before_the_first_edit(nobody_site, owner, ok):
    """Reproduction: with a non-root ssh user, the rename of the file it created changed the owner
    (1234:1234 became 65534:65534, after restore too, silently). The ssh user here is uid 65534
    (the controller drops to it before connecting, the host side runs as it too)."""
    base, pb = nobody_site
    env = base / "conf" / "decode.serve-env"
    env.write_text(DECODE)
    os.chown(env, *owner)
    os.chmod(env, 0o664)
    before = meta(env)
    run_dir = base / "run" / "runs" / "r"  # the store (base/run, with its journal key) is nobody's
    r = subprocess.run([sys.executable, "-c", AS_NOBODY, str(pb), str(env), str(run_dir), str(base / "home")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    if ok:
        assert doc["after_apply"] == [NOBODY, NOBODY, 0o664]
    else:
        assert "refusing before any edit" in doc["refused"]
        assert ("owned by uid 1234" if owner[0] == 1234 else "group gid 1234") in doc["refused"]
        journals = list((base / "home").rglob("*.journal.json"))
        assert journals == []  # refused before anything was journaled or edited
    assert meta(env) == before


def test_a_closed_local_journal_makes_a_host_copy_of_that_run_stale(tmp_path):
    """Reproduction (issue 35, M4): a genuine host copy of the journal, taken during a run and put
    back after the run closed, blocked the next bisect ("run restore first"), and `restore`
    re-opened the closed run and co-restarted the deployment. The local journal is authoritative: a
    closed one there makes a host copy of the same run stale, said and ignored."""
    from envbisect.runs.restore import restore_deployment
    from envbisect.state.configuration import TargetState

    s = Site(tmp_path, "local", None)
    decode = s.tree.env("decode")
    copies = [Path(os.path.expanduser(remote_paths(s.name)[1]))]
    copies.append(Path(str(copies[0])[: -len(".journal.json")] + ".made.json"))
    try:
        before = meta(decode)
        ed = s.editor("run-1", heartbeat_s=0)
        ed.lock()
        ed.begin({("node1", str(decode))}, set())
        ed.apply(TargetState({("node1", str(decode)): b"export TRIAL=1\n"}, {}))
        taken = [p.read_bytes() for p in copies]  # the copy someone takes while the run is under way
        assert ed.restore() == []
        ed.finish()
        ed.unlock()
        assert meta(decode) == before
        for p, raw in zip(copies, taken):  # ... and puts back after it closed
            p.write_bytes(raw)
        ed2 = s.editor("run-2", heartbeat_s=0)
        notes = ed2.lock()  # bisect is not blocked
        assert any("stale" in n and "run-1" in n and "closed" in n for n in notes), notes
        ed2.unlock()
        said: list[str] = []
        assert find_journal(s.dep.playbook, s.dep.transports, s.store / "runs", notes=said) is None
        assert len(said) == 1 and "run-1" in said[0] and "stale" in said[0], said
        events: list[tuple[str, dict]] = []
        res = restore_deployment(s.dep, on_event=lambda k, d: events.append((k, d)))
        assert not res.restored and "nothing to undo" in res.reason  # no run re-opened, nothing restarted
        assert any(k == "warning" and "stale" in d["message"] for k, d in events), events
        assert json.loads((s.store / "runs" / "run-1" / "journal.json").read_text())["state"] == "closed"
        assert meta(decode) == before
    finally:
        s.dep.close()
        cleanup_host_files(s.name)
