# Runs ON THE HOST (sent as `python3 -c`, stdlib only): the few operations envbisect performs on a
# host, batched so one round trip carries a whole step. Input: {"ops": [...]} as JSON on stdin.
# Output: {"results": [...], "error": null | "one line"}; processing stops at the first error.
# Contents travel base64-encoded in JSON and are written with os.replace: nothing is ever passed
# through a shell, so a value containing $(...) or backticks is only ever bytes in a file.
import base64
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import time

req = json.load(sys.stdin)


class OpError(Exception):
    pass


def git(repo, *args):
    p = subprocess.run(["git", "-C", repo] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if p.returncode != 0:
        raise OpError("git %s in %s: %s" % (args[0], repo, (p.stderr.decode("utf-8", "replace").strip().splitlines() or ["failed"])[-1]))
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
        out["files"][path] = {"exists": True, "content_b64": base64.b64encode(data).decode(), "mode": stat.S_IMODE(st.st_mode),
                              "uid": st.st_uid, "gid": st.st_gid, "mtime_ns": st.st_mtime_ns, "atime_ns": st.st_atime_ns}
    for repo in op.get("repos", []):
        head = git(repo, "rev-parse", "--verify", "HEAD")
        p = subprocess.run(["git", "-C", repo, "symbolic-ref", "-q", "HEAD"], stdout=subprocess.PIPE)
        out["repos"][repo] = {"head": head, "ref": p.stdout.decode().strip() or None}
    return out


def write_file(op):
    path = op["path"]
    if op.get("delete"):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return {"path": path, "deleted": True}
    data = base64.b64decode(op["content_b64"])
    d = os.path.dirname(path) or "."
    try:
        st = os.stat(path)
        mode, uid, gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
    except FileNotFoundError:
        mode, uid, gid = 0o644, None, None
    mode = op.get("mode", mode)
    uid = op.get("uid", uid)
    gid = op.get("gid", gid)
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".envbisect-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        if uid is not None and (os.geteuid() == 0 or uid == os.geteuid()):
            try:
                os.chown(tmp, uid, gid if gid is not None else -1)
            except PermissionError:
                pass
        if "mtime_ns" in op:
            os.utime(tmp, ns=(op.get("atime_ns", op["mtime_ns"]), op["mtime_ns"]))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return {"path": path, "bytes": len(data)}


def checkout(op):
    repo = op["repo"]
    status = git(repo, "status", "--porcelain", "--untracked-files=no")
    if status:
        raise OpError("%s has uncommitted changes (%s); commit or stash them before envbisect checks out another commit"
                      % (repo, ", ".join(l[3:] for l in status.splitlines()[:5])))
    if op.get("ref"):
        # back onto the branch it was on, at the exact commit it had
        branch = op["ref"][len("refs/heads/"):] if op["ref"].startswith("refs/heads/") else op["ref"]
        git(repo, "checkout", "-q", branch)
        if git(repo, "rev-parse", "HEAD") != op["commit"]:
            git(repo, "reset", "-q", "--keep", op["commit"])
    else:
        git(repo, "checkout", "-q", "--detach", op["commit"])
    return {"repo": repo, "head": git(repo, "rev-parse", "HEAD")}


def lock(op):
    path = os.path.expanduser(op["path"])
    me = op["owner"]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        try:
            with open(path) as f:
                held = json.load(f)
        except (OSError, ValueError):
            held = {}
        if held.get("run_id") == me.get("run_id"):
            return {"locked": True, "again": True}
        age = time.time() - os.stat(path).st_mtime
        stale = False
        if held.get("controller") == me.get("controller") and held.get("pid"):
            try:
                os.kill(int(held["pid"]), 0)
            except ProcessLookupError:
                stale = True
            except PermissionError:
                pass
        if age > op.get("stale_after_s", 3600):
            stale = True
        if not stale and not op.get("force"):
            return {"locked": False, "held_by": held, "age_s": age}
        os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(me, f)
    return {"locked": True}


def unlock(op):
    path = os.path.expanduser(op["path"])
    try:
        with open(path) as f:
            held = json.load(f)
    except (OSError, ValueError):
        return {"unlocked": False}
    if held.get("run_id") == op.get("run_id") or op.get("force"):
        os.unlink(path)
        return {"unlocked": True}
    return {"unlocked": False, "held_by": held}


def put(op):
    """A small private file (the host-side copy of the journal)."""
    path = os.path.expanduser(op["path"])
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
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
    try:
        os.unlink(os.path.expanduser(op["path"]))
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


OPS = {"read_state": read_state, "write": write_file, "checkout": checkout, "lock": lock, "unlock": unlock,
       "put": put, "get": get, "remove": remove, "alive": alive, "tail": tail}
results = []
error = None
for op in req["ops"]:
    try:
        results.append(OPS[op["op"]](op))
    except OpError as e:
        error = str(e)
        break
    except OSError as e:
        error = "%s: %s" % (getattr(e, "filename", None) or op.get("path", ""), e.strerror or e)
        break
json.dump({"results": results, "error": error, "host": socket.gethostname()}, sys.stdout)
