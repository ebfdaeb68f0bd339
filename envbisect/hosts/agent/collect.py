# Runs ON THE HOST (sent as `python3 -c`, stdlib only, Python >= 3.6): gathers everything a
# snapshot needs in one round trip. Input is JSON on stdin, output is JSON on stdout.
# Never follows symlinks when walking, never descends into .git. The one thing it executes is
# what the start script executes anyway: each running service's env file, sourced by bash in the
# environment that service was started with (eval_env_file), to learn what bash makes of it --
# scrubbed of what would run code, and as root with the privileges of the user the service runs as.
import base64
import grp
import hashlib
import json
import os
import pwd
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from scrub import BASH, EVAL_DONE, EVAL_SCRIPT, EVAL_UNREACHABLE, EVAL_UNREADABLE, scrub  # sent as scrub.py's text

req = json.load(sys.stdin)
MAX = int(req.get("max_size", 1 << 20))
SINCE = req.get("since")  # epoch seconds or None: then fallback baselines are gathered too


def b64(data):
    return base64.b64encode(data).decode("ascii")


def owner(uid, gid):
    try:
        u = pwd.getpwuid(uid).pw_name
    except KeyError:
        u = str(uid)
    try:
        g = grp.getgrgid(gid).gr_name
    except KeyError:
        g = str(gid)
    return u + ":" + g


def file_state(path, with_content=True):
    out = {"path": path}
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        out["exists"] = False
        return out
    except OSError as e:
        out["exists"] = None
        out["error"] = e.strerror or str(e)
        return out
    out.update(exists=True, size=st.st_size, mode=stat.S_IMODE(st.st_mode), uid=st.st_uid, gid=st.st_gid,
               owner=owner(st.st_uid, st.st_gid), mtime=st.st_mtime)
    if stat.S_ISLNK(st.st_mode):
        out["kind"] = "symlink"
        target = os.readlink(path)
        out["link_target"] = target
        out["sha256"] = hashlib.sha256(("symlink:" + target).encode()).hexdigest()
        return out
    if not stat.S_ISREG(st.st_mode):
        out["kind"] = "dir" if stat.S_ISDIR(st.st_mode) else "special"
        return out
    out["kind"] = "file"
    h = hashlib.sha256()
    keep = with_content and st.st_size <= MAX
    chunks = []
    try:
        with open(path, "rb") as f:
            while True:
                b = f.read(1 << 16)
                if not b:
                    break
                h.update(b)
                if keep:
                    chunks.append(b)
    except OSError as e:
        out["error"] = e.strerror or str(e)
        return out
    out["sha256"] = h.hexdigest()
    if keep:
        out["content_b64"] = b64(b"".join(chunks))
    else:
        out["too_large"] = st.st_size > MAX
    return out


def walk(root):
    """Files under root, without following symlinks and without descending into .git."""
    try:
        st = os.lstat(root)
    except OSError:
        return [root]
    if not stat.S_ISDIR(st.st_mode):
        return [root]
    found = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d != ".git" and not os.path.islink(os.path.join(dirpath, d)))
        found.extend(os.path.join(dirpath, f) for f in sorted(filenames))
        # symlinks to directories are listed (as symlinks) but not entered
        found.extend(os.path.join(dirpath, d) for d in sorted(os.listdir(dirpath))
                     if d != ".git" and os.path.islink(os.path.join(dirpath, d))
                     and os.path.isdir(os.path.join(dirpath, d)))
    return found


# A snapshot only reads: without this, `git status` refreshes .git/index (its stat cache) and so
# writes into the operator's checkout, and takes index.lock, racing a `git pull` running there.
GIT_ENV = dict(os.environ, GIT_OPTIONAL_LOCKS="0")


def git(repo, *args):
    p = subprocess.run(["git", "-C", repo] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=GIT_ENV)
    return p.returncode, p.stdout.decode("utf-8", "replace").strip(), p.stderr.decode("utf-8", "replace").strip()


def repo_state(path, log_from, keep=()):
    rc, head, err = git(path, "rev-parse", "--verify", "HEAD")
    if rc != 0:
        return {"path": path, "error": (err.splitlines() or ["not a git repository"])[-1]}
    out = {"path": path, "head": head}
    rc, branch, _ = git(path, "symbolic-ref", "--short", "-q", "HEAD")
    out["branch"] = branch if rc == 0 else None
    entries = dirty_entries(path)
    status = bool(entries)
    out["dirty"] = status
    out["dirty_files"] = sorted({p for e in entries for p in (e["path"], e["orig"]) if p})[:MAX_DIRTY]
    out["dirty_entries"] = entries[:MAX_DIRTY]
    # not `describe --dirty`: it refreshes the index whatever GIT_OPTIONAL_LOCKS says
    rc, desc, _ = git(path, "describe", "--always", "--tags")
    out["describe"] = (desc + ("-dirty" if status else "")) if rc == 0 else None
    if log_from and log_from != head:
        rc, log, _ = git(path, "log", "--format=%H %s", "--max-count=50", log_from + ".." + head)
        out["log_since"] = {"from": log_from, "commits": log.splitlines() if rc == 0 else []}
        rc, back, _ = git(path, "log", "--format=%H %s", "--max-count=50", head + ".." + log_from)
        out["log_since"]["rewound"] = back.splitlines() if rc == 0 else []
        # the files the move changed (relative to the top): a watched file among them is the move's
        rc, moved, _ = git(path, "diff", "--name-only", "-z", "--no-renames", log_from, head)
        out["log_since"]["files"] = [f for f in moved.split("\0") if f][:MAX_MOVED] if rc == 0 else None
    if SINCE is not None:
        # HEAD at TIME from the reflog: the newest entry at or before TIME.
        rc, reflog, _ = git(path, "reflog", "show", "--format=%H %ct %gd", "--date=unix", "HEAD")
        at = None
        if rc == 0:
            for line in reflog.splitlines():
                parts = line.split()
                if len(parts) >= 3:
                    sel = parts[2]
                    try:
                        when = int(sel[sel.index("{") + 1:sel.index("}")])
                    except ValueError:
                        continue
                    if when <= SINCE:
                        at = parts[0]
                        break
        out["head_at_since"] = at
    snapshot_dirty(path, out, log_from, keep)
    return out


# --- uncommitted changes to tracked files of a deployed repo ---------------------------------
# A hotfix edited in place and never committed is part of the configuration as much as an env file
# is: each such file is snapshotted like a watched file (result["files"], by absolute path), and,
# for a diff, its bytes at the baseline HEAD are read from git (result["fallback"]["repo_base"]),
# so the baseline trial can put the baseline's bytes back.
MAX_DIRTY = 50
MAX_MOVED = 5000  # files a HEAD move changed, named (beyond: none is taken for the move's)


def dirty_entries(repo):
    """Tracked files with uncommitted changes, parsed from `git status --porcelain=v1 -z` by its
    format: "XY PATH\0", and for a rename or copy the original path as the next field. Paths are
    relative to the top of the repository, never quoted, never cut."""
    p = subprocess.run(["git", "-C", repo, "status", "--porcelain=v1", "-z", "--untracked-files=no"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=GIT_ENV)
    if p.returncode != 0:
        return []
    fields = p.stdout.split(b"\0")
    out, i = [], 0
    while i < len(fields):
        f = fields[i]
        i += 1
        if len(f) < 4 or f[2:3] != b" ":
            continue
        xy = f[:2].decode("ascii", "replace")
        orig = None
        if "R" in xy or "C" in xy:
            orig = fields[i].decode("utf-8", "surrogateescape") if i < len(fields) else None
            i += 1
        out.append({"xy": xy, "path": f[3:].decode("utf-8", "surrogateescape"), "orig": orig})
    return out


def git_blob(repo, rev, rel):
    """The file `rel` at commit `rev`: {sha256, content_b64} or {absent: True}."""
    p = subprocess.run(["git", "-C", repo, "show", rev + ":" + rel], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=GIT_ENV)
    if p.returncode != 0:
        return {"commit": rev, "absent": True}
    out = {"commit": rev, "sha256": hashlib.sha256(p.stdout).hexdigest()}
    if len(p.stdout) <= MAX:
        out["content_b64"] = b64(p.stdout)
    return out


def snapshot_dirty(repo, out, log_from, keep):
    """Each dirty file (and each file a baseline saw dirty: `keep`) into result["files"]; for a
    diff, its bytes at the baseline HEAD (log_from, else HEAD at TIME from the reflog, else HEAD)."""
    rc, top, _ = git(repo, "rev-parse", "--show-toplevel")
    top = top if rc == 0 and top else repo
    out["top"] = top
    rels = sorted(set(out["dirty_files"]) | set(keep))
    base = log_from or out.get("head_at_since") or out["head"]
    for rel in rels:
        path = os.path.join(top, rel)
        if path not in result["files"]:
            result["files"][path] = file_state(path)
        if SINCE is not None:
            repo_base[path] = dict(git_blob(repo, base, rel), repo=repo, rel=rel)


repo_base = {}


def top_of_repo(path):
    d = os.path.dirname(path)
    rc, top, _ = git(d, "rev-parse", "--show-toplevel")
    return top if rc == 0 else None


def git_fallback(path):
    top = top_of_repo(path)
    if not top:
        return None
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(top))
    rc, commit, _ = git(top, "log", "-1", "--format=%H", "--until=@%d" % int(SINCE), "--", rel)
    if rc != 0 or not commit:
        return {"repo": top, "commit": None}
    p = subprocess.run(["git", "-C", top, "show", commit + ":" + rel], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=GIT_ENV)
    if p.returncode != 0:
        return {"repo": top, "commit": commit, "absent": True}
    return {"repo": top, "commit": commit, "content_b64": b64(p.stdout[:MAX]),
            "sha256": hashlib.sha256(p.stdout).hexdigest()}


def backup_candidates(path):
    import glob
    cands = []
    for pattern in req.get("backups", []):
        pat = pattern.replace("{path}", path).replace("{name}", os.path.basename(path)).replace(
            "{dir}", os.path.dirname(path))
        for match in sorted(glob.glob(pat)):
            if os.path.realpath(match) == os.path.realpath(path):
                continue
            st = file_state(match)
            if st.get("kind") == "file" and st.get("mtime", 0) <= SINCE:
                cands.append(st)
    cands.sort(key=lambda s: s["mtime"], reverse=True)
    return cands[:1]


def boot_time():
    """The boot instant on this host's clock, never later than the truth: /proc/stat's btime is whole
    seconds (floored: up to 1 s early), so it is the wall clock now less /proc/uptime (1/100 s,
    floored), read in that order, less the rounding."""
    now = time.time()
    try:
        with open("/proc/uptime") as f:
            return now - float(f.read().split()[0]) - 0.01
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def process_state(service, pid_file):
    out = {"service": service, "pid_file": pid_file}
    if not pid_file:
        out["status"] = "no-pid-file"
        return out
    try:
        with open(pid_file) as f:
            pid = int(f.read().strip().split()[0])
    except (OSError, ValueError, IndexError):
        out["status"] = "not-running"
        return out
    out["pid"] = pid
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of stat: starttime, in clock ticks since boot
        bt = boot_time()
        if bt is not None:
            out["started_at"] = bt + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        out["status"] = "not-running"
        return out
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            out["cmdline"] = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:500]
        with open("/proc/%d/environ" % pid, "rb") as f:
            raw = f.read()
    except OSError as e:
        out["status"] = "unknown"
        out["why"] = e.strerror or str(e)
        return out
    entries = [e for e in raw.split(b"\0") if e]
    env = {}
    garbled = 0
    for e in entries:
        k, sep, v = e.partition(b"=")
        try:
            key = k.decode("ascii")
        except UnicodeDecodeError:
            garbled += 1
            continue
        if not sep or not key or not (key[0].isalpha() or key[0] == "_") \
                or not all(c.isalnum() or c == "_" for c in key):
            garbled += 1
            continue
        env[key] = v.decode("utf-8", "replace")
    # Programs that rewrite their process title (sglang-router does) overwrite this memory:
    # what is left is not what the process started with, so it is unknown, never drift.
    if not env or garbled > max(1, len(entries) // 10):
        out["status"] = "unknown"
        out["why"] = "environ empty or overwritten (process title rewritten?)"
        return out
    out["status"] = "ok"
    out["environ"] = env
    return out


ASSIGN_RE = re.compile(r"^[ \t]*(?:export[ \t]+)?([A-Za-z_][A-Za-z0-9_]*)\+?=", re.M)
EVAL_TIMEOUT_S = 10


def proc_ids(pid):
    """(real uid, real gid) of a process: the user who chose its start environment."""
    uid = gid = None
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("Uid:"):
                    uid = int(line.split()[1])
                elif line.startswith("Gid:"):
                    gid = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None if uid is None or gid is None else (uid, gid)


def user_name(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "uid %d" % uid


def dropper(uid, gid):
    """A preexec_fn that gives the child the privileges of uid (its groups, else gid alone)."""
    try:
        groups = os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except (KeyError, OSError):
        groups = [gid]

    def drop():
        os.setgroups(groups)
        os.setgid(gid)
        os.setuid(uid)
    return drop


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


def run_bash(path, env, as_ids):
    """Source path in env (scrubbed), as as_ids (uid, gid) or as this process: (stdout, exit status) or
    a string saying why it did not finish."""
    keep, back = scrub(env)
    preexec = dropper(*as_ids) if as_ids is not None else None
    try:
        p = subprocess.Popen([BASH, "--noprofile", "--norc", "-c", EVAL_SCRIPT, "envbisect-eval", path] + back,
                             env=keep, cwd=os.path.dirname(path) or "/", stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
                             preexec_fn=preexec)
    except (OSError, subprocess.SubprocessError) as e:
        return "cannot run bash: %s" % (getattr(e, "strerror", None) or e)
    try:
        stdout, _ = p.communicate(timeout=EVAL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.communicate()
        return "sourcing %s with bash took more than %d s" % (path, EVAL_TIMEOUT_S)
    return stdout, p.returncode


def eval_env_file(path, environ, pid=None):
    """What bash makes of the env file, the way the start script sources it (set -a; . FILE), in the
    environment the process inherited: its start environment minus the keys the file assigns.
    As root, with the privileges of the user the service runs as (that user chose the environment);
    as root after all only for a file that user cannot read and only root can have written."""
    out = {}
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        out["file_eval_error"] = "cannot read %s: %s" % (path, e.strerror or e)
        return out
    keys = assigned_keys(data.decode("utf-8", "surrogateescape"))
    env = dict((k, v) for k, v in environ.items() if k not in keys)
    out["file_eval_keys"] = keys
    out["file_eval_sha256"] = hashlib.sha256(data).hexdigest()
    me = os.geteuid()
    ids = proc_ids(pid) if pid is not None else None
    as_ids = ids if me == 0 and ids is not None and ids[0] != 0 else None
    out["file_eval_as"] = user_name(as_ids[0] if as_ids else me)
    got = run_bash(path, env, as_ids)
    if not isinstance(got, str) and got[0] in (EVAL_UNREADABLE, EVAL_UNREACHABLE) and as_ids is not None:
        try:
            st = os.stat(path)
            guarded = got[0] == EVAL_UNREACHABLE and root_guarded(path)
        except OSError as e:
            got = "cannot read %s: %s" % (path, e.strerror or e)
        else:
            if (st.st_uid == 0 and not st.st_mode & 0o022) or guarded:
                out["file_eval_as"] = "root (%s cannot read it)" % user_name(as_ids[0])
                got = run_bash(path, env, None)
            else:
                got = ("not evaluated: the service's user %s (uid %d) cannot read %s, and it is not a file only "
                       "root can have written" % (user_name(as_ids[0]), as_ids[0], path))
    if isinstance(got, str):
        out["file_eval_error"] = got
        return out
    stdout, status = got
    if stdout in (EVAL_UNREADABLE, EVAL_UNREACHABLE):
        out["file_eval_error"] = "%s cannot read %s" % (out["file_eval_as"], path)
        return out
    if not stdout.endswith(EVAL_DONE):
        out["file_eval_error"] = "sourcing %s with bash did not finish (exit status %s)" % (path, status)
        return out
    values = {}
    for entry in stdout[: -len(EVAL_DONE)].split(b"\0"):
        k, sep, v = entry.partition(b"=")
        if sep and k.decode("ascii", "replace") in keys:
            values[k.decode("ascii")] = v.decode("utf-8", "replace")
    out["file_eval"] = values
    return out


# --- files an env file sources (`. FILE`, `source FILE`) -------------------------------------
# They are part of the configuration as much as the env file is: an edit in a sourced common.env
# that no [watch] path covers would be invisible, and a bisection over the other deltas would end in
# a false not-config. Each source line is resolved here without running anything: a literal
# path, or one built only from ~, $HOME and variables the env file itself set on an earlier line.
# Anything else (a variable of the start script, $(...), a glob) is reported with why, and the
# controller says so in a note. The file named is snapshotted and watched exactly as a [watch] path
# naming it would be (its own root in "watched"), so a change in it is an ordinary file delta, which
# a trial writes and the journal puts back like any watched file.
MAX_SOURCED = 8  # resolved files per env file ("a handful"); later lines are reported, not followed
SOURCE_RE = re.compile(r"(?:^|[;&|({]|\b(?:then|do|else|elif)\b)[ \t]*(?:\.|source)[ \t]+(?=[^ \t])")
ASSIGN_LINE_RE = re.compile(r"^[ \t]*(?:export[ \t]+)?([A-Za-z_][A-Za-z0-9_]*)=")
NEXT_ASSIGN_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")
NEXT_ASSIGN_OR_APPEND_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\+?=")
UNSET_RE = re.compile(r"^[ \t]*unset[ \t]+([A-Za-z_][A-Za-z0-9_ \t]*)")
WORD_END = " \t;&|)<>"


def logical_lines(text):
    """(first line number, text) per logical line: backslash-newline continuations joined, comments cut."""
    out = []
    buf, first = "", None
    for n, line in enumerate(text.split("\n"), 1):
        if first is None:
            first = n
        if line.endswith("\\") and (len(line) - len(line.rstrip("\\"))) % 2 == 1:
            buf += line[:-1]
            continue
        out.append((first, cut_comment(buf + line)))
        buf, first = "", None
    return out


def cut_comment(line):
    """The line up to an unquoted # that starts a word."""
    i, n, q = 0, len(line), None
    while i < n:
        c = line[i]
        if q:
            if c == "\\" and q == '"':
                i += 2
                continue
            if c == q:
                q = None
        elif c in "'\"":
            q = c
        elif c == "\\":
            i += 2
            continue
        elif c == "#" and (i == 0 or line[i - 1] in " \t;&|("):
            return line[:i]
        i += 1
    return line


def lex_word(s, i):
    """The shell word at s[i:] as parts: ("lit", text), ("var", NAME) or ("tilde", USER). Returns
    (end, parts, why): why is set when the word holds something that is not evaluated here."""
    parts, why, n = [], None, len(s)

    def note(w):
        return why or w

    if i < n and s[i] == "~":  # a tilde prefix: unquoted, at the start, up to the first /
        j = i + 1
        while j < n and (s[j].isalnum() or s[j] in "._-"):
            j += 1
        if j == n or s[j] == "/" or s[j] in WORD_END:
            parts.append(("tilde", s[i + 1:j]))
            i = j
    quoted = False
    while i < n:
        c = s[i]
        if not quoted and c in WORD_END:
            break
        if c == '"':
            quoted = not quoted
            i += 1
        elif c == "'" and not quoted:
            j = s.find("'", i + 1)
            if j < 0:
                return n, parts, note("an unterminated quote")
            parts.append(("lit", s[i + 1:j]))
            i = j + 1
        elif c == "\\":
            if i + 1 < n and (not quoted or s[i + 1] in '$`"\\'):
                parts.append(("lit", s[i + 1]))
            elif i + 1 < n:
                parts.append(("lit", s[i:i + 2]))
            i += 2
        elif c == "`":
            j = s.find("`", i + 1)
            why = note("a command substitution (`...`)")
            i = n if j < 0 else j + 1
        elif c == "$":
            i, part, w = lex_dollar(s, i)
            if w:
                why = note(w)
            elif part:
                parts.append(part)
        elif not quoted and c in "*?[":
            why = note("a glob pattern (%s)" % c)
            parts.append(("lit", c))
            i += 1
        else:
            parts.append(("lit", c))
            i += 1
    return i, parts, why


def lex_dollar(s, i):
    n = len(s)
    if i + 1 >= n:
        return i + 1, ("lit", "$"), None
    c = s[i + 1]
    if c == "(":
        depth, j = 0, i + 1
        while j < n:
            depth += {"(": 1, ")": -1}.get(s[j], 0)
            j += 1
            if depth == 0:
                break
        return j, None, "a command substitution ($(...))"
    if c == "{":
        j = s.find("}", i + 2)
        if j < 0:
            return n, None, "an unterminated ${"
        inner = s[i + 2:j]
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", inner):
            return j + 1, ("var", inner), None
        if re.match(r"^BASH_SOURCE(\[0\])?%/\*$", inner):
            # the idiom for "next to this file": in a sourced env file, its own folder
            return j + 1, ("var", BASH_SOURCE_DIR), None
        return j + 1, None, "a parameter expansion envbisect does not evaluate (${%s})" % inner
    m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", s[i + 1:])
    if m:
        return i + 1 + m.end(), ("var", m.group(0)), None
    if c in "'":
        return n, None, "$'...' quoting"
    if c.isdigit() or c in "@*#?$!-":
        return i + 2, None, "a positional or special parameter ($%s)" % c
    return i + 1, ("lit", "$"), None


BASH_SOURCE_DIR = "BASH_SOURCE%/*"  # a name no assignment can have: `known` maps it to the env file's folder


def expand(parts, known, lineno):
    """The value of a lexed word, or (None, why). known: NAME -> value, or None when the file set it
    to something not evaluated here."""
    out = []
    for kind, v in parts:
        if kind == "lit":
            out.append(v)
        elif kind == "var":
            if v not in known:
                return None, "$%s is not set by the env file before line %d" % (v, lineno)
            if known[v] is None:
                return None, "$%s is set by the env file to something envbisect does not evaluate" % v
            out.append(known[v])
        else:  # tilde: bash uses $HOME for ~, the password database for ~user
            if not v:
                if known.get("HOME") is None:
                    return None, "~ with HOME unknown"
                out.append(known["HOME"])
            else:
                try:
                    out.append(pwd.getpwnam(v).pw_dir)
                except KeyError:
                    return None, "~%s: no such user" % v
    return "".join(out), None


def resolve_path(value, env_dir, search_path):
    """Where bash reads `. value`: (absolute path, relative?). A name without a slash is looked up in
    PATH first (bash's sourcepath), then in the working directory, like any relative path. That
    directory is the start script's, which envbisect does not know; the env file's own folder is
    tried instead: start scripts commonly cd there, an operator who writes `. common.env` next to
    the env file means that folder, and the collector's own evaluation of the env file
    (eval_env_file) runs bash there too. The guess is marked `relative` and said in a note."""
    if value.startswith("/"):
        return value, False
    if "/" not in value:
        for d in (search_path or "").split(":"):
            cand = os.path.join(d, value)
            if d.startswith("/") and os.path.isfile(cand) and os.access(cand, os.R_OK):
                return cand, False
    joined = os.path.join(env_dir, value)
    return (joined if ".." in joined.split("/") else os.path.normpath(joined)), True


def assigned_keys(text):
    """The names the file assigns, every assignment of a line (``export A=1 B=2`` assigns A and B)."""
    keys = set(ASSIGN_RE.findall(text))
    for _lineno, line in logical_lines(text):
        a = ASSIGN_RE.match(line)
        while a:
            keys.add(a.group(1))
            end = lex_word(line, a.end())[0]
            rest = end + len(line[end:]) - len(line[end:].lstrip(" \t"))
            a = NEXT_ASSIGN_OR_APPEND_RE.match(line, rest) if rest > end else None
    return sorted(keys)


def source_lines(text, known):
    """(line, word, value or None, why) for each source line of `text`, in order; `known` is
    updated by the assignments met on the way (only those before a line count for it)."""
    out = []
    for lineno, line in logical_lines(text):
        for m in SOURCE_RE.finditer(line):
            end, parts, why = lex_word(line, m.end())
            word = line[m.end():end]
            value = None
            if not why:
                value, why = expand(parts, known, lineno)
                if value == "":
                    value, why = None, "an empty path"
            out.append((lineno, word, value, why))
        a = ASSIGN_LINE_RE.match(line)
        while a:  # ``export A=1 B=2``: each assignment of the line, left to right, as bash makes them
            end, parts, why = lex_word(line, a.end())
            value, _why = (None, why) if why else expand(parts, known, lineno)
            known[a.group(1)] = value
            rest = end + len(line[end:]) - len(line[end:].lstrip(" \t"))
            a = NEXT_ASSIGN_RE.match(line, rest) if rest > end else None
        u = UNSET_RE.match(line)
        if u:
            for name in u.group(1).split():
                known.pop(name, None)
    return out


def read_text(path):
    try:
        with open(path, "rb") as f:
            data = f.read(MAX + 1)
    except OSError:
        return None
    return None if len(data) > MAX else data.decode("utf-8", "surrogateescape")


def follow_sources(env_path, start_env, keep, covered):
    """The source lines of one env file (entries for the snapshot's "sourced"), and the files they
    name: file_state'd into result["files"] and each made a watch root of its own. `keep`: files a
    baseline saw this env file source; still snapshotted when the line is gone, so that the diff
    sees their real state instead of a false "removed" (their line is None). `covered`: paths a
    [watch] root or an env file already snapshots."""
    home = start_env.get("HOME") or os.environ.get("HOME") or os.path.expanduser("~")
    search_path = start_env.get("PATH") or os.environ.get("PATH", "")
    text = read_text(env_path)
    entries, watch = [], []
    if text is not None:
        for lineno, word, value, why in source_lines(text, {"HOME": home,
                                                            BASH_SOURCE_DIR: os.path.dirname(env_path)}):
            e = {"line": lineno, "word": word, "path": None, "why": why, "relative": False}
            if value is not None:
                if len(watch) >= MAX_SOURCED:
                    e["why"] = "more than %d sourced files: envbisect follows the first %d" % (MAX_SOURCED, MAX_SOURCED)
                else:
                    e["path"], e["relative"] = resolve_path(value, os.path.dirname(env_path), search_path)
                    watch.append(e["path"])
            entries.append(e)
    for path in keep:
        if path not in watch:
            entries.append({"line": None, "word": path, "path": path, "why": None, "relative": False})
            watch.append(path)
    nested = []
    for path in list(watch):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            # bash reads the target: watched too, so that an edit there is a delta (the link's own
            # state, its target's name, stays watched as well)
            real = os.path.realpath(path)
            if real not in watch:
                watch.append(real)
                entries.append({"line": next(e["line"] for e in entries if e["path"] == path),
                                "word": next(e["word"] for e in entries if e["path"] == path), "path": real,
                                "why": None, "relative": False})
        # one level only: a file that a sourced file sources in turn is reported, never followed
        inner = read_text(path) if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode) else None
        for lineno, word, _v, _why in source_lines(inner or "", {"HOME": home}):
            nested.append({"line": lineno, "word": word, "path": None, "via": path, "relative": False,
                           "why": "sourced by %s, whose own source lines envbisect does not follow" % path})
    for path in watch:
        if path in covered:
            continue
        if path not in result["files"]:
            result["files"][path] = file_state(path)
        result["watched"][path] = [path]
    return entries + nested


def clock():
    now = time.time()
    lt = time.localtime(now)
    tzname = os.environ.get("TZ") or None
    if not tzname:
        try:
            with open("/etc/timezone") as f:
                tzname = f.read().strip() or None
        except OSError:
            pass
    if not tzname:
        try:
            link = os.readlink("/etc/localtime")
            if "zoneinfo/" in link:
                tzname = link.split("zoneinfo/", 1)[1]
        except OSError:
            pass
    return {"epoch": now, "tz": tzname, "tz_abbrev": lt.tm_zone, "utc_offset_s": lt.tm_gmtoff}


def norm_dist(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def interpreter(pid, environ):
    """The python a process runs: its argv[0] as started (a venv's bin/python keeps the venv, which
    /proc/PID/exe, the resolved binary, loses), else /proc/PID/exe; None when it is no python."""
    cands = []
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv0 = f.read().split(b"\0")[0].decode("utf-8", "replace")
    except OSError:
        argv0 = ""
    if argv0 and "/" not in argv0:
        cands.extend(os.path.join(d, argv0) for d in (environ.get("PATH") or "").split(":") if d)
    elif argv0:
        try:
            cands.append(argv0 if os.path.isabs(argv0) else os.path.join(os.readlink("/proc/%d/cwd" % pid), argv0))
        except OSError:
            pass
    try:
        cands.append(os.readlink("/proc/%d/exe" % pid))
    except OSError:
        pass
    for c in cands:
        if re.match(r"python[0-9.]*$", os.path.basename(c)) and os.path.isfile(c):
            return c
    return None


def site_dirs(interp, environ):
    """Where that python finds distributions, without running it: the process's PYTHONPATH, then the
    site-packages of its venv (and of the base python when the venv includes them) or of its prefix."""
    dirs = [p for p in (environ.get("PYTHONPATH") or "").split(":") if p]
    real = os.path.basename(os.path.realpath(interp))
    ver = real[len("python"):] if re.match(r"python[0-9]+\.[0-9]+$", real) else "3*"
    root = os.path.dirname(os.path.dirname(interp))
    prefixes = [root]
    cfg = os.path.join(root, "pyvenv.cfg")
    if os.path.isfile(cfg):
        text = read_text(cfg) or ""
        if re.search(r"include-system-site-packages\s*=\s*true", text, re.I):
            prefixes.append(os.path.dirname(os.path.dirname(os.path.realpath(interp))))
    import glob
    for pre in prefixes:
        for pat in ("lib/python%s/site-packages", "lib/python%s/dist-packages", "local/lib/python%s/dist-packages"):
            dirs.extend(sorted(glob.glob(os.path.join(pre, pat % ver))))
        dirs.append(os.path.join(pre, "lib", "python3", "dist-packages"))
    return [d for d in dirs if os.path.isdir(d)]


def packages_of(pid, environ, names):
    """name -> version of the wanted distributions the process's python sees, read with
    importlib.metadata from the files alone (no interpreter started, no package code run)."""
    interp = interpreter(pid, environ)
    if interp is None or not names:
        return None, interp
    try:
        import importlib.metadata as md
    except ImportError:  # python < 3.8 on the host
        return None, interp
    wanted = set(norm_dist(n) for n in names)
    out = {}
    try:
        for dist in md.distributions(path=site_dirs(interp, environ)):
            name = norm_dist(dist.metadata["Name"] or "")
            if name in wanted and name not in out:  # the first on the path is the one imported
                out[name] = dist.version
    except Exception:  # noqa: BLE001 - a broken dist-info is no reason to lose the snapshot
        pass
    return out, interp


result = {"clock": clock(), "hostname": socket.gethostname(), "files": {}, "repos": {}, "processes": {}, "watched": {}}
if req.get("clock_only"):
    json.dump(result, sys.stdout)
    sys.exit(0)
for path in req.get("env_files", []):
    st = file_state(path)
    if st.get("exists") and st.get("kind") != "file":
        st["error"] = "not a regular file (%s)" % st.get("kind")
    result["files"][path] = st
for root in req.get("watch", []):
    members = walk(root)
    result["watched"][root] = members
    for path in members:
        if path not in result["files"]:
            result["files"][path] = file_state(path)
for item in req.get("repos", []):
    result["repos"][item["path"]] = repo_state(item["path"], item.get("log_from"), item.get("keep") or ())
for item in req.get("processes", []):
    ps = process_state(item["service"], item.get("pid_file"))
    if ps.get("status") == "ok" and item.get("env_file"):
        ps.update(eval_env_file(item["env_file"], ps["environ"], ps.get("pid")))
    if ps.get("status") == "ok" and req.get("packages"):
        ps["packages"], ps["python"] = packages_of(ps["pid"], ps["environ"], req["packages"])
    result["processes"][item["service"]] = ps
result["sourced"] = {}
covered = set(result["files"])  # env files and the members of [watch] roots
for path in req.get("env_files", []):
    proc = next((result["processes"].get(i["service"]) for i in req.get("processes", [])
                 if i.get("env_file") == path), None) or {}
    start_env = proc.get("environ") or {}
    result["sourced"][path] = follow_sources(path, start_env, (req.get("keep_sourced") or {}).get(path, []), covered)
if SINCE is not None:
    fb = {"backups": {}, "git": {}}
    for path, st in result["files"].items():
        if st.get("kind") not in ("file", None) or path in repo_base:
            continue  # a deployed repo's dirty file: its baseline is the repo's, in repo_base
        cands = backup_candidates(path)
        if cands:
            fb["backups"][path] = cands[0]
        g = git_fallback(path) if (st.get("exists") or st.get("exists") is False) else None
        if g:
            fb["git"][path] = g
    fb["repo_base"] = repo_base
    result["fallback"] = fb
json.dump(result, sys.stdout)
