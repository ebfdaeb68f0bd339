# Runs ON THE HOST (sent as `python3 -c`, stdlib only): the few operations envbisect performs on a
# host, batched so one round trip carries a whole step. Input: {"ops": [...]} as JSON on stdin.
# Output: {"results": [...], "error": null | "one line"}; processing stops at the first error.
# Contents travel base64-encoded in JSON and are written with os.replace: nothing is ever passed
# through a shell, so a value containing $(...) or backticks is only ever bytes in a file.
# Every change is compare-and-swap: an op carries the state(s) envbisect expects to find (sha256 of a
# file, HEAD and branch of a repo) and refuses with {"conflict": {...}} when someone else changed it.
#
# Long on purpose: one self-contained script sent to a host (stdlib only, old Pythons): it cannot
# import the package, so what it needs lives here.
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import time
from scrub import BASH, EVAL_DONE, EVAL_SCRIPT, EVAL_UNREACHABLE, EVAL_UNREADABLE, scrub  # sent as scrub.py's text

req = json.load(sys.stdin)


class OpError(Exception):
    pass


class LockLost(OpError):
    pass


class Conflict(OpError):
    """The host is not in the state envbisect journaled or last made: someone else changed it."""

    def __init__(self, path, expected, found, why):
        OpError.__init__(self, "%s: %s" % (path, why))
        self.info = {"path": path, "expected": expected, "found": found, "why": why}


def file_sha(path):
    """sha256 of a regular file, None when it does not exist."""
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except FileNotFoundError:
        return None


def repo_state(repo):
    head = git(repo, "rev-parse", "--verify", "HEAD")
    p = subprocess.run(["git", "-C", repo, "symbolic-ref", "-q", "HEAD"], stdout=subprocess.PIPE, env=GIT_ENV)
    return [head, p.stdout.decode().strip() or None]


def short(sha):
    return "absent" if sha is None else sha[:12]


def owner_problem(path, st):
    """Why the ssh user could not put this file back with its owner and group (None: it can).
    Edits are atomic renames of a file envbisect creates, so the new file must be given the old
    owner: only root can give a file away, and only a member of a group can give it that group."""
    d = os.path.dirname(path) or "."
    if not os.access(d, os.W_OK | os.X_OK):
        return "uid %d cannot create files in %s (edits are atomic renames there)" % (os.geteuid(), d)
    if os.geteuid() == 0 or st is None:
        return None
    if st.st_uid != os.geteuid():
        return ("owned by uid %d and the ssh user is uid %d: a rewritten file would change owner; "
                "connect as root or as uid %d" % (st.st_uid, os.geteuid(), st.st_uid))
    if st.st_gid != os.getegid() and st.st_gid not in os.getgroups():
        return ("group gid %d, which the ssh user (uid %d) is not a member of: a rewritten file would change group"
                % (st.st_gid, os.geteuid()))
    return None


def hard_link_problem(st):
    """Why a file with other names cannot be edited (None: it has one). An edit is an atomic rename:
    the path would get a new file and its other names would keep the old content (a service started
    through one of them would run the old configuration), and restore could not join them again. A
    write in place keeps the links but can be torn by a crash, and then neither the journal's original
    nor a state envbisect made is on the host: the exact restore is what envbisect will not give up."""
    if st.st_nlink > 1:
        return ("has %d hard links (inode %d): an edit (an atomic rename) would split it from its other names, "
                "which would keep the old content; give it a file of its own (cp --remove-destination) or point the "
                "service at one name" % (st.st_nlink, st.st_ino))
    return None


# reads (rev-parse, status) must not refresh the operator's index; a checkout still takes its lock
GIT_ENV = dict(os.environ, GIT_OPTIONAL_LOCKS="0")


def git(repo, *args):
    p = subprocess.run(["git", "-C", repo] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=GIT_ENV)
    if p.returncode != 0:
        last = (p.stderr.decode("utf-8", "replace").strip().splitlines() or ["failed"])[-1]
        raise OpError("git %s in %s: %s" % (args[0], repo, last))
    return p.stdout.decode("utf-8", "replace").strip()


def read_state(op):
    """Everything needed to put a path or repo back exactly as it is now."""
    out = {"files": {}, "repos": {}}
    for path in op.get("paths", []):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            out["files"][path] = {"exists": False}
            continue
        if not stat.S_ISREG(st.st_mode):
            raise OpError("%s is not a regular file; envbisect will not edit it" % path)
        with open(path, "rb") as f:
            data = f.read()
        out["files"][path] = {"exists": True, "content_b64": base64.b64encode(data).decode(),
                              "mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid, "gid": st.st_gid,
                              "mtime_ns": st.st_mtime_ns, "atime_ns": st.st_atime_ns}
    for path, f in out["files"].items():
        st = os.lstat(path) if f["exists"] else None
        why = owner_problem(path, st) or (hard_link_problem(st) if st is not None else None)
        if why:
            out.setdefault("problems", []).append("%s: %s" % (path, why))
    for repo in op.get("repos", []):
        head, ref = repo_state(repo)
        out["repos"][repo] = {"head": head, "ref": ref}
        st = os.stat(repo)
        if st.st_uid != os.geteuid():
            out.setdefault("problems", []).append(
                "%s: repository owned by uid %d and the ssh user is uid %d: a checkout would leave files it "
                "writes owned by uid %d; connect as uid %d" % (repo, st.st_uid, os.geteuid(), os.geteuid(), st.st_uid))
    return out


def expect_file(op, path):
    """Compare-and-swap: refuse when the file is not in a state envbisect expects."""
    if "expect" not in op:
        return None
    found = file_sha(path)
    if found not in op["expect"]:
        raise Conflict(path, op["expect"], found, "changed by someone else during the run (expected %s, found %s)"
                       % (" or ".join(short(e) for e in op["expect"]), short(found)))
    return found


def meta_changed(op, st):
    """{"mode" | "uid" | "gid": (expected, found)} where the live file's mode or owner is not what
    envbisect left it (op["meta"]: the journaled original's, which every write of envbisect's keeps):
    someone else changed it during the run."""
    want = op.get("meta")
    if not want or st is None:
        return {}
    found = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
    return dict((k, (w, f)) for k, w, f in zip(("mode", "uid", "gid"), want, found) if w is not None and w != f)


def meta_text(changed):
    return ", ".join("%s %s -> %s" % ((k, "%04o" % w, "%04o" % f) if k == "mode" else (k, w, f))
                     for k, (w, f) in sorted(changed.items()))


def write_file(op):
    path = op["path"]
    expect_file(op, path)
    try:
        live = os.stat(path)
    except FileNotFoundError:
        live = None
    changed = meta_changed(op, live)
    if changed and not op.get("keep_meta"):  # a trial's write: stop, as for a changed content
        raise Conflict(path, op.get("expect", []), file_sha(path), "had its %s changed by someone else during the "
                       "run (%s); not rewritten" % ("/".join(sorted(changed)), meta_text(changed)))
    if op.get("delete"):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return {"path": path, "deleted": True}
    data = base64.b64decode(op["content_b64"])
    d = os.path.dirname(path) or "."
    if live is not None:
        if live.st_nlink > 1:  # linked since the journal was read (begin refuses a linked file)
            raise Conflict(path, op.get("expect", []), file_sha(path), "hard-linked during the run (%s); not rewritten"
                           % hard_link_problem(live))
        mode, uid, gid = stat.S_IMODE(live.st_mode), live.st_uid, live.st_gid
    else:
        mode, uid, gid = 0o644, None, None
    mode = op.get("mode", mode)
    uid = op.get("uid", uid)
    gid = op.get("gid", gid)
    if changed:  # the restore: envbisect's bytes go back, the mode or owner someone set stays
        mode, uid, gid = [changed[k][1] if k in changed else v for k, v in (("mode", mode), ("uid", uid), ("gid", gid))]
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".envbisect-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # owner first: chown clears setuid/setgid bits, chmod puts them back
        if uid is not None or gid is not None:
            try:
                os.chown(tmp, -1 if uid is None else uid, -1 if gid is None else gid)
            except PermissionError:
                pass
            got = os.stat(tmp)
            if (uid is not None and got.st_uid != uid) or (gid is not None and got.st_gid != gid):
                raise OpError("%s: uid %d cannot keep its owner %s:%s; not edited" % (path, os.geteuid(), uid, gid))
        os.chmod(tmp, mode)
        if "mtime_ns" in op:
            os.utime(tmp, ns=(op.get("atime_ns", op["mtime_ns"]), op["mtime_ns"]))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    out = {"path": path, "bytes": len(data)}
    if changed:
        out["kept_meta"] = meta_text(changed)
    return out


def dirty_paths(repo):
    """Tracked files with uncommitted changes, from `git status --porcelain=v1 -z` by its format
    ("XY PATH\\0", a rename's original path as the next field), never by cutting stripped lines."""
    p = subprocess.run(["git", "-C", repo, "status", "--porcelain=v1", "-z", "--untracked-files=no"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=GIT_ENV)
    if p.returncode != 0:
        raise OpError("git status in %s: %s" % (repo, (p.stderr.decode("utf-8", "replace").strip().splitlines()
                                                      or ["failed"])[-1]))
    fields, out, i = p.stdout.split(b"\0"), [], 0
    while i < len(fields):
        f = fields[i]
        i += 1
        if len(f) < 4:
            continue
        out.append(f[3:].decode("utf-8", "replace"))
        if f[:1] in (b"R", b"C") or f[1:2] in (b"R", b"C"):
            i += 1  # the original path of a rename or copy
    return out


def checkout(op):
    repo = op["repo"]
    if "expect" in op:
        found = repo_state(repo)
        if found not in op["expect"]:
            raise Conflict(repo, op["expect"], found, "HEAD moved during the run (expected %s, found %s %s)" % (
                " or ".join("%s %s" % (e[0][:12], e[1] or "detached") for e in op["expect"]), found[0][:12],
                found[1] or "detached"))
    times = op.get("mtimes")
    if repo_state(repo) == [op["commit"], op.get("ref")]:
        # already there: nothing to check out, so uncommitted changes (a hotfix on the box) are no obstacle
        if times and times.get("restore"):
            put_back_mtimes(repo, times)
        return {"repo": repo, "head": op["commit"]}
    status = dirty_paths(repo)
    if status and op.get("skip_conflict"):  # restore: someone's uncommitted work is theirs; left alone
        raise Conflict(repo, op.get("expect", []), repo_state(repo), "has uncommitted changes (%s); not touched"
                       % ", ".join(status[:5]))
    if status:
        raise OpError("%s has uncommitted changes (%s); commit or stash them before envbisect checks out another commit"
                      % (repo, ", ".join(status[:5])))
    if op.get("ref"):
        # back onto the branch it was on, at the exact commit it had. envbisect never moves a branch:
        # a branch whose tip is not that commit was advanced by someone else, and stays where it is.
        tip = git(repo, "rev-parse", "--verify", "-q", op["ref"] + "^{commit}")
        if tip != op["commit"]:
            why = "branch %s moved from %s to %s during the run; not moving it back" % (
                op["ref"], op["commit"][:12], tip[:12])
            if op.get("skip_conflict"):
                # restore: HEAD is envbisect's own move, the branch is not - back at the original
                # commit, detached, so the code is as it was and their branch stays where they put it
                git(repo, "checkout", "-q", "--detach", op["commit"])
                why += "; HEAD left detached at %s (the original commit)" % op["commit"][:12]
            raise Conflict(repo, op.get("expect", []), repo_state(repo), why)
        branch = op["ref"][len("refs/heads/"):] if op["ref"].startswith("refs/heads/") else op["ref"]
        if times and not times.get("restore"):
            keep_mtimes(repo, times, op["commit"])
        git(repo, "checkout", "-q", branch)
    else:
        if times and not times.get("restore"):
            keep_mtimes(repo, times, op["commit"])
        git(repo, "checkout", "-q", "--detach", op["commit"])
    if times and times.get("restore"):
        put_back_mtimes(repo, times)
    return {"repo": repo, "head": git(repo, "rev-parse", "HEAD")}


def undo_commit(op):
    """A commit object: `head` with `commit`'s change (against its first parent) undone, for the
    trial that confirms a named commit. Built with a private temporary index, so the work tree, the
    repo's index and every ref stay as they are; only objects are added, reachable from no ref.
    {"sha": SHA} or {"conflict": why} when the change does not undo cleanly on `head`."""
    repo, head, commit = op["repo"], op["head"], op["commit"]
    fd, index = tempfile.mkstemp(prefix="envbisect-index-")
    os.close(fd)
    env = dict(GIT_ENV, GIT_INDEX_FILE=index, GIT_AUTHOR_NAME="envbisect", GIT_AUTHOR_EMAIL="envbisect@localhost",
               GIT_COMMITTER_NAME="envbisect", GIT_COMMITTER_EMAIL="envbisect@localhost",
               GIT_AUTHOR_DATE="@0 +0000", GIT_COMMITTER_DATE="@0 +0000")  # the same sha each time: a resume finds it

    def run(*args, stdin=None):
        return subprocess.run(["git", "-C", repo] + list(args), input=stdin, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env)
    try:
        os.unlink(index)  # read-tree writes it anew
        if run("read-tree", head).returncode != 0:
            raise OpError("git read-tree %s in %s failed" % (head[:12], repo))
        patch = run("diff-tree", "-p", "--binary", "--full-index", "--no-renames", commit, commit + "^1")
        if patch.returncode != 0:
            raise OpError("git diff-tree %s in %s failed" % (commit[:12], repo))
        if patch.stdout:
            applied = run("apply", "--cached", "--3way", stdin=patch.stdout)
            if applied.returncode != 0:
                said = applied.stderr.decode("utf-8", "replace").strip().splitlines() or ["conflict"]
                files = [ln[2:] for ln in said if ln.startswith("U ")]
                return {"conflict": "conflicts in " + ", ".join(files) if files else said[-1]}
        tree = run("write-tree")
        if tree.returncode != 0:
            return {"conflict": (tree.stderr.decode("utf-8", "replace").strip().splitlines() or ["conflict"])[-1]}
        made = run("commit-tree", tree.stdout.decode().strip(), "-p", head,
                   "-m", "envbisect: %s without the change of %s (confirmation trial)" % (head[:12], commit[:12]))
        if made.returncode != 0:
            raise OpError("git commit-tree in %s failed" % repo)
        return {"sha": made.stdout.decode().strip()}
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(index)


# --- the mtimes of the files a run's checkouts rewrite ---------------------------------------
# Git rewrites every file a checkout changes, and checking the original commit out again writes its
# bytes back with a new mtime. Before each checkout away from the original HEAD (times["base"]), the
# mtimes of the files that differ between the two and were not recorded yet are written to
# times["path"] (host-side, private, per run), so a restore after a crash finds them too; a restore's
# checkout puts them back once HEAD is the original again. A file with uncommitted changes is the
# operator's and is not touched.

def _changed_between(repo, a, b):
    top = git(repo, "rev-parse", "--show-toplevel")
    names = git(repo, "diff", "--name-only", "-z", "--no-renames", a, b)
    return [os.path.join(top, n) for n in names.split("\0") if n]


def keep_mtimes(repo, times, target):
    path = os.path.expanduser(times["path"])
    doc = read_json(path) or {}
    if doc.get("run_id") != times["run_id"]:
        doc = {"run_id": times["run_id"], "repos": {}}
    entry = doc["repos"].setdefault(repo, {"base": times["base"], "files": {}})
    if entry["base"] != times["base"]:
        return
    new = False
    for full in _changed_between(repo, times["base"], target):
        if full in entry["files"]:
            continue
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            entry["files"][full] = [st.st_atime_ns, st.st_mtime_ns]
            new = True
    if new:
        put({"path": times["path"], "content_b64": base64.b64encode(json.dumps(doc).encode()).decode()})


def put_back_mtimes(repo, times):
    path = os.path.expanduser(times["path"])
    doc = read_json(path) or {}
    entry = doc.get("repos", {}).get(repo) if doc.get("run_id") == times["run_id"] else None
    if not entry or git(repo, "rev-parse", "HEAD") != entry["base"]:
        return
    top = git(repo, "rev-parse", "--show-toplevel")
    theirs = {os.path.join(top, p) for p in dirty_paths(repo)}
    for full, (atime_ns, mtime_ns) in entry["files"].items():
        if full not in theirs and os.path.isfile(full) and not os.path.islink(full):
            os.utime(full, ns=(atime_ns, mtime_ns))
    del doc["repos"][repo]
    put({"path": times["path"], "content_b64": base64.b64encode(json.dumps(doc).encode()).decode()})


@contextlib.contextmanager
def lock_guard(path):
    """Lock decisions (take, take over, break, refresh, release) are made one at a time per host."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(path + ".guard", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}


def write_lock(path, owner):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".lock-")
    with os.fdopen(fd, "w") as f:
        json.dump(owner, f)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def same_process(held, me):
    """The holder record names this very controller process (host name, boot id, pid namespace and pid)."""
    return bool(held.get("boot_id")) and bool(held.get("pid_ns")) and all(
        held.get(k) == me.get(k) for k in ("controller", "boot_id", "pid_ns", "pid"))


def holder_state(held, age, me, stale_after_s, dead_token=None):
    """"dead" only when provably so: no heartbeat for stale_after_s, or the controller that wrote the
    record found its pid gone on its own machine (`dead_token`, the record's token). A pid means
    nothing on this host (the controller is another machine), so none is looked up here."""
    if dead_token and held.get("token") == dead_token:
        return "dead"
    if same_process(held, me):
        return "alive"  # another editor of this very controller process
    return "dead" if age > stale_after_s else "alive"


def lock(op):
    """Take the deployment lock. Never while another run's journal is active on this host (its changes
    are not undone). A lock whose holder is provably dead is taken over; a live one only with `break`."""
    path = os.path.expanduser(op["path"])
    me = op["owner"]
    with lock_guard(path):
        held = read_json(path)
        if held and held.get("token") and held.get("token") == me.get("token"):
            return {"locked": True, "again": True}
        state, age = None, None
        if held is not None:
            age = time.time() - os.stat(path).st_mtime
            state = holder_state(held, age, me, op.get("stale_after_s", 300), op.get("dead_token"))
            if op.get("restoring") and held.get("run_id") == op["restoring"] and same_process(held, me):
                state = "dead"  # this very process ran it and gave up: restoring it is what is left to do
        journal = read_json(os.path.expanduser(op["journal"])) if op.get("journal") else None
        journal_run = None
        if journal and journal.get("state", "active") == "active" and journal.get("run_id") not in (
                me.get("run_id"), op.get("restoring"), op.get("stale_journal")):
            journal_run = journal.get("run_id")
        if state == "alive":
            if op.get("restoring") and held.get("run_id") == op["restoring"]:
                return {"locked": False, "held_by": held, "age_s": age, "running": True}
            if not op.get("break"):
                return {"locked": False, "held_by": held, "age_s": age, "journal_run": journal_run}
        if journal_run:  # never over changes that are not undone, not even with --break-lock
            return {"locked": False, "journal_run": journal_run}
        if op.get("dry"):  # would be taken: the caller only asked
            return {"locked": True, "dry": True}
        write_lock(path, me)
        if held is None:
            return {"locked": True}
        return {"locked": True, ("broke" if state == "alive" else "took_over"): held, "age_s": age}


def assert_lock(op):
    """Heartbeat and guard of every mutation batch: the lock must still be this run's (refreshes it)."""
    path = os.path.expanduser(op["path"])
    with lock_guard(path):
        held = read_json(path)
        if not held or held.get("token") != op["token"]:
            held = held or {}
            raise LockLost("the deployment lock is no longer this run's (%s); stopping without further changes"
                          % ("held by run %s, controller %s, pid %s" % (held.get("run_id"), held.get("controller"),
                                                                        held.get("pid")) if held else "removed"))
        os.utime(path)
    return {}


def unlock(op):
    path = os.path.expanduser(op["path"])
    with lock_guard(path):
        held = read_json(path)
        if not held:
            return {"unlocked": False}
        if (op.get("token") and held.get("token") == op["token"]) or op.get("force"):
            os.unlink(path)
            return {"unlocked": True}
    return {"unlocked": False, "held_by": held}


def check(op):
    """The state of files and repos now; with `expect`, a Conflict unless each is in an expected state."""
    out = {"files": {}, "repos": {}}
    for path, want in op.get("files", {}).items():
        found = out["files"][path] = file_sha(path)
        if found not in want:
            why = op.get("why", "changed by someone else during the run")
            raise Conflict(path, want, found, "%s (expected %s, found %s)" % (why,
                           " or ".join(short(e) for e in want), short(found)))
    for repo, want in op.get("repos", {}).items():
        found = out["repos"][repo] = repo_state(repo)
        if found not in want:
            raise Conflict(repo, want, found, "HEAD %s (expected %s, found %s %s)" % (
                op.get("why", "moved by someone else during the run"), " or ".join(e[0][:12] for e in want),
                found[0][:12], found[1] or "detached"))
    return out


def put(op):
    """A small private file (the host-side copy of the journal). With `run_id`, never over another
    run's active journal."""
    path = os.path.expanduser(op["path"])
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    if op.get("run_id"):
        old = read_json(path)
        if old and old.get("state", "active") == "active" and old.get("run_id") != op["run_id"]:
            raise OpError("%s holds the active journal of run %s; not overwriting it" % (path, old.get("run_id")))
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64decode(op["content_b64"]))
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return {}


def get(op):
    try:
        with open(os.path.expanduser(op["path"]), "rb") as f:
            return {"content_b64": base64.b64encode(f.read()).decode()}
    except FileNotFoundError:
        return {"content_b64": None}


def remove(op):
    """With `run_id`: only that run's file (a journal), never another run's."""
    path = os.path.expanduser(op["path"])
    if op.get("run_id"):
        old = read_json(path)
        if old and old.get("run_id") not in (None, op["run_id"]):
            return {"kept": old.get("run_id")}
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return {}


def alive(op):
    """Is the process of each pid file alive? {pid_file: pid or null}"""
    out = {}
    for pf in op["pid_files"]:
        try:
            with open(pf) as f:
                pid = int(f.read().split()[0])
            os.kill(pid, 0)
            with open("/proc/%d/stat" % pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            out[pf] = None if state == "Z" else pid
        except (OSError, ValueError, IndexError):
            out[pf] = None
    return out


# --- process identity (the proof that a co-restart replaced each process; hosts/restart.py) ------
def uptime_s():
    """Seconds since boot: the clock of /proc/PID/stat start times, on this host (no clock skew)."""
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


def proc_start_ticks(pid):
    """(state, start time in clock ticks since boot) of a process, or None when there is none."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def proc_running(pid, ticks):
    """Is process `pid` that started at `ticks` still there (not a zombie, not a reused pid)?"""
    st = proc_start_ticks(pid)
    return st is not None and st[0] != "Z" and st[1] == ticks


def proc_ids(op):
    """The process each pid file names: {"now_s": uptime, "hz": ticks per second, "procs": {pid_file:
    {"pid", "ticks", "start_s" (seconds since boot), "env" (the op["env_keys"][pid_file] keys of its
    /proc/PID/environ, null when unreadable), "env_why"} or null: no live process}}."""
    hz = os.sysconf("SC_CLK_TCK")
    out = {"now_s": uptime_s(), "hz": hz, "procs": {}}
    for pf in op["pid_files"]:
        try:
            with open(pf) as f:
                pid = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            out["procs"][pf] = None
            continue
        st = proc_start_ticks(pid)
        if st is None or st[0] == "Z":
            out["procs"][pf] = None
            continue
        got = {"pid": pid, "ticks": st[1], "start_s": st[1] / float(hz), "env": None, "env_why": None}
        keys = (op.get("env_keys") or {}).get(pf)
        if keys:
            try:
                with open("/proc/%d/environ" % pid, "rb") as f:
                    raw = f.read()
                env = {}
                for entry in raw.split(b"\0"):
                    k, sep, v = entry.partition(b"=")
                    if sep:
                        env[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
                if not env:
                    got["env_why"] = "its /proc/%d/environ is empty (process title rewritten?)" % pid
                else:
                    got["env"] = dict((k, env.get(k)) for k in keys)
            except OSError as e:
                got["env_why"] = "cannot read /proc/%d/environ: %s" % (pid, e.strerror or e)
        out["procs"][pf] = got
    return out


def wait_gone(op):
    """Wait up to op["timeout_s"] until each [pid, ticks] of op["procs"] is gone; {"left": [those
    still running], "waited_s"}."""
    t0 = time.monotonic()
    left = [p for p in op["procs"] if proc_running(p[0], p[1])]
    while left and time.monotonic() - t0 < op["timeout_s"]:
        time.sleep(0.1)
        left = [p for p in left if proc_running(p[0], p[1])]
    return {"left": left, "waited_s": time.monotonic() - t0}


def tail(op):
    out = {}
    for path in op["paths"]:
        try:
            with open(path, "rb") as f:
                f.seek(0, 2)
                size = f.tell()
                f.seek(max(0, size - op.get("bytes", 16384)))
                out[path] = base64.b64encode(f.read()).decode()
        except OSError:
            out[path] = None
    return out


# --- env_check: what bash makes of an env file (the post-apply check) --------------------------
ASSIGN_RE = NEXT_ASSIGN_RE = None  # compiled on first use (re is only needed by this op)
MINIMAL_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "SHELL")


class EvalError(Exception):
    pass


class Unreachable(EvalError):
    pass


def root_guarded(path):
    """Whether the folders on the way to path are root's alone: each is root's, the file's own folder is
    writable by root alone, and one above it that others can write is sticky with a root-owned entry
    next on the path (/tmp/x). A user these folders keep out cannot have written what is there now."""
    real = os.path.realpath(path)
    folder = os.path.dirname(real)
    d = "/"
    for name in [p for p in folder.split("/") if p]:
        st, nxt = os.stat(d), os.path.join(d, name)
        if st.st_uid != 0 or (st.st_mode & 0o022 and not (st.st_mode & stat.S_ISVTX and os.stat(nxt).st_uid == 0)):
            return False
        d = nxt
    st = os.stat(folder)
    return st.st_uid == 0 and not st.st_mode & 0o022


def eval_identity(path):
    """(uid, gid, groups) to evaluate path as: as root, its owner when that is not root (the start
    environment and the file are that user's to choose); else None (as this process)."""
    import pwd
    if os.geteuid() != 0:
        return None
    st = os.stat(path)
    if st.st_uid == 0:
        return None
    try:
        pw = pwd.getpwuid(st.st_uid)
        return st.st_uid, pw.pw_gid, os.getgrouplist(pw.pw_name, pw.pw_gid)
    except (KeyError, OSError):
        return st.st_uid, st.st_gid, [st.st_gid]


def assigned_keys(text):
    """The names the file assigns, every assignment of a line: ``export A=1 B=2`` assigns A and B, as
    the collector's assigned_keys reads it (collect.py; each agent script is sent alone)."""
    import re
    global ASSIGN_RE, NEXT_ASSIGN_RE
    if ASSIGN_RE is None:
        ASSIGN_RE = re.compile(r"^[ \t]*(?:export[ \t]+)?([A-Za-z_][A-Za-z0-9_]*)\+?=", re.M)
        NEXT_ASSIGN_RE = re.compile(r"[ \t]+([A-Za-z_][A-Za-z0-9_]*)\+?=")
    keys = set()
    for line in text.split("\n"):
        a = ASSIGN_RE.match(line)
        while a:
            keys.add(a.group(1))
            a = NEXT_ASSIGN_RE.match(line, word_end(line, a.end()))
    return keys


def word_end(s, i):
    """Where the shell word at s[i:] ends: at an unquoted blank or ;&|<>(); quotes, backslashes and
    $(...) / ${...} / backquotes are stepped over whole."""
    n, depth, quote = len(s), 0, None
    while i < n:
        c = s[i]
        if quote == "'":  # nothing is special inside single quotes but the closing one
            quote = None if c == "'" else quote
        elif c == "\\":
            i += 2
            continue
        elif c == "'" and quote is None:
            quote = "'"
        elif c == '"':
            quote = None if quote == '"' else (quote or '"')
        elif c == "`":
            j = s.find("`", i + 1)
            i = n if j < 0 else j
        elif c == "$" and i + 1 < n and s[i + 1] in "({":
            depth += 1
            i += 1
        elif c in ")}" and depth:
            depth -= 1
        elif quote is None and not depth and c in " \t;&|<>()":
            return i
        i += 1
    return n


def bash_eval(path, env, cwd, timeout, ident=None):
    """Source `path` with bash the way the start script does (set -a; . FILE) in `env` minus the keys
    the file assigns (scrubbed), as `ident` (uid, gid, groups) or this process; returns the resulting
    environment."""
    import signal
    with open(path, "rb") as f:
        keys = assigned_keys(f.read().decode("utf-8", "surrogateescape"))
    keep, back = scrub(dict((k, v) for k, v in env.items() if k not in keys))

    def drop():
        os.setgroups(ident[2])
        os.setgid(ident[1])
        os.setuid(ident[0])
    try:
        p = subprocess.Popen([BASH, "--noprofile", "--norc", "-c", EVAL_SCRIPT, "envbisect-eval", path] + back,
                             env=keep, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, start_new_session=True,
                             preexec_fn=drop if ident is not None else None)
    except (OSError, subprocess.SubprocessError) as e:
        raise EvalError("cannot run bash: %s" % (getattr(e, "strerror", None) or e))
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.communicate()
        raise EvalError("sourcing it with bash took more than %d s" % timeout)
    if out == EVAL_UNREACHABLE:
        raise Unreachable("uid %d cannot reach it" % (ident[0] if ident is not None else os.geteuid()))
    if out == EVAL_UNREADABLE:
        raise EvalError("uid %d cannot read it" % (ident[0] if ident is not None else os.geteuid()))
    if not out.endswith(EVAL_DONE):
        raise EvalError("sourcing it with bash did not finish (exit status %s)" % p.returncode)
    got = {}
    for entry in out[: -len(EVAL_DONE)].split(b"\0"):
        k, sep, v = entry.partition(b"=")
        if sep:
            got[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return got


def env_check(op):
    """After a write, before any restart: what bash makes of the env file (sourced like the start
    script, in op["env"], the service's recorded start environment, else a minimal one) for each
    expected key, against what the target configuration should give: op["expect"] items carry a
    recorded "value" (null: unset) or name a reference text ("ref": "old" | "new", in op["refs"],
    evaluated the same way). A key whose value differs between two evaluations is skipped (a clock,
    $RANDOM...). Never fails the batch for a mismatch: the result lists them and the controller stops."""
    path = op["path"]
    env = op.get("env")
    if env is None:
        env = dict((k, os.environ[k]) for k in MINIMAL_ENV if k in os.environ)
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    timeout = op.get("timeout_s", 10)
    cwd = os.path.dirname(path) or "/"
    out = {"path": path, "checked": [], "skipped": dict(op.get("skipped") or {}), "mismatches": [], "error": None}
    try:
        ident = eval_identity(path)
        try:
            first = bash_eval(path, env, cwd, timeout, ident)
        except Unreachable:
            # folders only root can write keep its owner out: root's evaluation (scrubbed) runs only what
            # root alone can have put there
            if ident is None or not root_guarded(path):
                raise
            ident = None
            first = bash_eval(path, env, cwd, timeout, ident)
        second = bash_eval(path, env, cwd, timeout, ident)
        refs = {}
        for side, text in sorted((op.get("refs") or {}).items()):
            fd, tmp = tempfile.mkstemp(prefix=".envbisect-ref-")
            try:
                if ident is not None:  # the reference text is read by the same user as the file
                    os.fchown(fd, ident[0], ident[1])
                with os.fdopen(fd, "wb") as f:
                    f.write(base64.b64decode(text))
                refs[side] = bash_eval(tmp, env, cwd, timeout, ident)
            finally:
                os.unlink(tmp)
    except (EvalError, OSError) as e:
        out["error"] = str(e)
        return out
    for e in op["expect"]:
        k = e["key"]
        got = first.get(k)
        if second.get(k) != got:
            out["skipped"][k] = "not the same on two evaluations (a clock, $RANDOM, $$...)"
            continue
        want = refs[e["ref"]].get(k) if e.get("ref") else e.get("value")
        out["checked"].append(k)
        if got != want:
            out["mismatches"].append({"key": k, "side": e.get("side"), "expected": want, "got": got,
                                      "source": e.get("source", "")})
    return out


OPS = {"read_state": read_state, "write": write_file, "checkout": checkout, "undo_commit": undo_commit,
       "lock": lock, "unlock": unlock,
       "assert_lock": assert_lock, "check": check, "put": put, "get": get, "remove": remove, "alive": alive,
       "tail": tail}
OPS["env_check"] = env_check
OPS["proc_ids"] = proc_ids
OPS["wait_gone"] = wait_gone
results = []
error = None
conflict = None
for op in req["ops"]:
    try:
        results.append(OPS[op["op"]](op))
    except Conflict as e:
        if op.get("skip_conflict"):  # restore: leave it, say so, go on with the rest
            results.append({"conflict": e.info})
            continue
        error, conflict = str(e), e.info
        break
    except LockLost as e:
        error, conflict = str(e), {"lock_lost": True}
        break
    except OpError as e:
        error = str(e)
        break
    except OSError as e:
        error = "%s: %s" % (getattr(e, "filename", None) or op.get("path", ""), e.strerror or e)
        break
json.dump({"results": results, "error": error, "conflict": conflict, "host": socket.gethostname()}, sys.stdout)
