# Runs ON THE HOST (sent as `python3 -c`, stdlib only, Python >= 3.6) for `envbisect init`: finds
# the running SGLang servers and routers and what can be seen of how they were started. Input is
# JSON on stdin (the process matchers), output is JSON on stdout.
#
# It only reads: /proc, the start scripts and env files it finds, unit files, pid files, git
# metadata (.git/HEAD, refs, config: read as files, git is never run). It writes nothing, starts
# nothing, sends no request to any server. Process environments are compared with env files HERE:
# only counts (equal / different / missing keys) leave the host, never a value.
#
# Long on purpose: one self-contained script sent to a host (stdlib only, old Pythons): it cannot
# import the package, so what it needs lives here.
import glob
import json
import os
import pwd
import re
import shlex
import socket
import stat
import sys
import time

req = json.load(sys.stdin)
MATCHERS = req.get("matchers", [])
MAX_SCRIPT = int(req.get("max_script", 256 * 1024))
MAX_ENV = int(req.get("max_env", 1 << 20))
LOG_TAIL = int(req.get("log_tail", 2 << 20))
for m in MATCHERS:
    m["_re"] = re.compile(m["regex"])
SHELLS = ("sh", "bash", "dash", "zsh", "ksh")


def read(path, limit=None, mode="rb"):
    try:
        with open(path, mode) as f:
            return f.read() if limit is None else f.read(limit)
    except (OSError, ValueError):
        return None


def text(path, limit=MAX_SCRIPT):
    data = read(path, limit + 1)
    if data is None or len(data) > limit or b"\0" in data[:4096]:
        return None
    return data.decode("utf-8", "replace")


def readlink(path):
    try:
        return os.readlink(path)
    except OSError:
        return None


def is_file(path):
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def argv_of(pid):
    raw = read("/proc/%s/cmdline" % pid)
    if not raw:
        return []
    parts = raw.split(b"\0")
    while parts and parts[-1] == b"":
        parts.pop()
    return [p.decode("utf-8", "replace") for p in parts]


def stat_of(pid):
    raw = read("/proc/%s/stat" % pid, mode="r")
    if not raw:
        return None
    try:
        rest = raw.rsplit(")", 1)[1].split()
        return {"ppid": int(rest[1]), "start_ticks": int(rest[19])}
    except (IndexError, ValueError):
        return None


def boot_time():
    """The boot instant on this host's clock, never later than the truth: /proc/stat's btime is whole
    seconds (floored: up to 1 s early), so it is the wall clock now less /proc/uptime (1/100 s,
    floored), read in that order, less the rounding."""
    now = time.time()
    try:
        return now - float((read("/proc/uptime", mode="r") or "").split()[0]) - 0.01
    except (ValueError, IndexError):
        pass
    for line in (read("/proc/stat", mode="r") or "").splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return None


BOOT = boot_time()
try:
    HZ = os.sysconf(os.sysconf_names["SC_CLK_TCK"])
except (KeyError, ValueError, OSError):
    HZ = 100


def environ_of(pid):
    raw = read("/proc/%s/environ" % pid)
    if raw is None:
        return None
    env = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            env[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return env


def user_of(uid):
    try:
        p = pwd.getpwuid(uid)
        return p.pw_name, p.pw_dir
    except KeyError:
        return str(uid), None


def uid_of(pid):
    try:
        return os.stat("/proc/%s" % pid).st_uid
    except OSError:
        return None


# --- listening sockets ----------------------------------------------------------------------

def _addr(hexaddr):
    ip, port = hexaddr.split(":")
    port = int(port, 16)
    if len(ip) == 8:
        b = bytes.fromhex(ip)[::-1]
        return socket.inet_ntop(socket.AF_INET, b), port
    b = b"".join(bytes.fromhex(ip[i:i + 8])[::-1] for i in range(0, 32, 8))
    return socket.inet_ntop(socket.AF_INET6, b), port


LISTEN = {}
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in (read(table, mode="r") or "").splitlines()[1:]:
        f = line.split()
        if len(f) > 9 and f[3] == "0A":
            try:
                LISTEN[f[9]] = _addr(f[1])
            except (ValueError, OSError):
                pass


def listening(pid):
    out = []
    try:
        fds = os.listdir("/proc/%s/fd" % pid)
    except OSError:
        return None
    for fd in fds:
        link = readlink("/proc/%s/fd/%s" % (pid, fd)) or ""
        if link.startswith("socket:["):
            a = LISTEN.get(link[8:-1])
            if a and list(a) not in out:
                out.append(list(a))
    return sorted(out, key=lambda a: a[1])


# --- shell scripts: what they source ----------------------------------------------------------

ASSIGN = re.compile(r"^\s*(?:export\s+|local\s+|readonly\s+|declare\s+(?:-\w+\s+)*)?([A-Za-z_][A-Za-z0-9_]*)=(\S.*|)$")
SOURCE = re.compile(r"(?:^|[;&|{(]|\bthen\b|\bdo\b|\belse\b|&&|\|\|)\s*(?:\.|source)\s+(\"[^\"]*\"|'[^']*'|[^\s;&|)]+)")
VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*|[0-9])(?:(:?[-=])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*|[0-9])")
POS = "\0P%s\0"
UNK = "\0U\0"


def strip_comment(line):
    out, q = [], None
    for i, c in enumerate(line):
        if q:
            if c == q:
                q = None
        elif c in "'\"":
            q = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t;"):
            break
        out.append(c)
    return "".join(out)


def script_vars(body):
    found = {}
    for line in body.splitlines():
        m = ASSIGN.match(strip_comment(line))
        if m:
            found.setdefault(m.group(1), []).append(m.group(2).strip())
    return found


def unquote(word):
    try:
        parts = shlex.split(word, posix=True)
    except ValueError:
        return None
    return parts[0] if len(parts) == 1 else ("" if not parts else None)


def script_dir_idiom(value, script):
    if "dirname" in value and ("$0" in value or "BASH_SOURCE" in value):
        d = os.path.dirname(os.path.abspath(script))
        for _ in range(value.count("/..")):
            d = os.path.dirname(d)
        return d
    if re.fullmatch(r"[\"']?\$\{(?:0|BASH_SOURCE(?:\[0\])?)%/\*\}[\"']?", value.strip()):
        return os.path.dirname(os.path.abspath(script))
    return None


def expand(word, ctx, depth=0):
    """A shell word with what can be known substituted; positional parameters become POS
    placeholders, anything unknown UNK."""
    if depth > 6:
        return UNK
    idiom = script_dir_idiom(word, ctx["script"])
    if idiom is not None:
        return idiom
    w = unquote(word) if word[:1] in "\"'" or " " in word else word
    if w is None:
        return UNK
    if "$(" in w or "`" in w:
        return UNK
    if w.startswith("~/"):
        w = (ctx.get("home") or "~") + w[1:]

    def sub(m):
        name = m.group(1) or m.group(4)
        default = m.group(3)
        if name.isdigit():
            if name == "0":
                return ctx["script"]
            return POS % name
        if name == "BASH_SOURCE":
            return ctx["script"]
        vals = ctx["vars"].get(name)
        if vals:
            distinct = set(vals)
            if len(distinct) == 1:
                return expand(vals[0], ctx, depth + 1)
            return UNK
        env = ctx.get("environ") or {}
        if name in env:
            return env[name]
        if name == "HOME" and ctx.get("home"):
            return ctx["home"]
        if default is not None:
            return expand(default, ctx, depth + 1) if default else ""
        return UNK
    return VAR.sub(sub, w)


def glob_of(pattern):
    parts = re.split(r"(\0P\d\0|\0U\0)", pattern)
    g, rx = "", ""
    for p in parts:
        if not p:
            continue
        m = re.fullmatch(r"\0P(\d)\0", p)
        if m:
            g += "*"
            rx += "(?P<p%s>[^/]*)" % m.group(1) if ("(?P<p%s>" % m.group(1)) not in rx else "(?P=p%s)" % m.group(1)
        elif p == UNK:
            g += "*"
            rx += "[^/]*"
        else:
            g += glob.escape(p)
            rx += re.escape(p)
    return g, re.compile(rx + r"\Z")


def sourced(script, body, ctx):
    """Every `. FILE` / `source FILE` of a script, expanded and globbed on this host."""
    out = []
    for n, line in enumerate(body.splitlines(), 1):
        line_nc = strip_comment(line)
        for m in SOURCE.finditer(line_nc):
            word = m.group(1)
            pattern = expand(word, ctx)
            item = {"line": n, "text": m.group(0).strip().lstrip(";&|{(").strip()[:200], "word": word, "matches": []}
            bases = [""] if pattern.startswith("/") else [os.path.dirname(os.path.abspath(script)) + "/",
                                                          (ctx.get("cwd") or "/") + "/"]
            for base in bases:
                g, rx = glob_of(base + pattern)
                for raw in sorted(glob.glob(g))[:50]:
                    if not is_file(raw):
                        continue
                    mm = rx.match(raw)
                    path = os.path.normpath(raw)
                    args = {k[1:]: v for k, v in (mm.groupdict() if mm else {}).items() if v is not None}
                    if not any(x["path"] == path for x in item["matches"]):
                        item["matches"].append({"path": path, "args": args})
            item["positional"] = "\0P" in pattern
            item["unknown"] = UNK in pattern
            item["pattern"] = pattern.replace("\0U\0", "*").replace("\0", "$").replace("$P", "$")
            out.append(item)
    return out


def script_info(path, how, ctx, argv=None):
    body = text(path)
    if body is None:
        return None
    first = body.splitlines()[0] if body else ""
    if not (first.startswith("#!") and re.search(r"\b(ba|da|z|k)?sh\b", first)) and not path.endswith(".sh") \
            and how != "shell-c":
        return None
    sctx = dict(ctx, script=path, vars=script_vars(body))
    d = os.path.dirname(path)
    try:
        siblings = sorted(n for n in os.listdir(d) if re.search(r"stop|kill|halt|down", n, re.I)
                          and is_file(os.path.join(d, n)))[:20]
    except OSError:
        siblings = []
    return {"path": path, "how": how, "argv": argv, "sources": sourced(path, body, sctx),
            "uses_positional": bool(re.search(r"\$\{?[1-9]", body)),
            "detaches": bool(re.search(r"\bnohup\b|\bsetsid\b|\bdisown\b|&\s*$|--daemon|start-stop-daemon",
                                       body, re.M)),
            "cases": sorted(set(re.findall(r"^\s*([A-Za-z0-9_.-]+)\)", body, re.M)))[:40],
            "siblings": siblings, "markers": [mk for mk in ctx["markers"] if mk in body],
            "mentions_ports": sorted(set(int(p) for p in re.findall(r"--port[= ]+[\"']?(\d{2,5})", body)))[:20],
            "mentions_metrics_ports": sorted(set(
                int(p) for p in re.findall(r"--prometheus-port[= ]+[\"']?(\d{2,5})", body)))[:20]}


def inline_info(cmd, ctx):
    """A `sh -c '...; . FILE; exec python ...'` parent: its text is the script."""
    sctx = dict(ctx, script=ctx.get("cwd") or "/", vars=script_vars(cmd.replace(";", "\n")))
    return {"path": None, "how": "shell-c", "sources": sourced(ctx.get("cwd") or "/", cmd.replace(";", "\n"), sctx),
            "uses_positional": False, "detaches": False, "cases": [], "siblings": [], "markers": [],
            "mentions_ports": [], "mentions_metrics_ports": []}


# --- env files compared with the process environment -------------------------------------------

def env_assignments(path):
    body = text(path, MAX_ENV)
    if body is None:
        return None
    out = {}
    for line in body.splitlines():
        m = ASSIGN.match(strip_comment(line))
        if m and not m.group(2).startswith("("):
            v = unquote(m.group(2).strip()) if m.group(2).strip() else ""
            if v is not None and "$" not in v and "`" not in v:
                out[m.group(1)] = v
    return out


def compare_env(path, environ):
    a = env_assignments(path)
    if a is None:
        return {"path": path, "readable": False}
    res = {"path": path, "readable": True, "keys": len(a)}
    if environ:
        res["equal"] = sum(1 for k, v in a.items() if environ.get(k) == v)
        res["differ"] = sum(1 for k, v in a.items() if k in environ and environ[k] != v)
        res["missing"] = sum(1 for k in a if k not in environ)
    return res


def backups_of(path, cwd):
    name, d = os.path.basename(path), os.path.dirname(path)
    pats = []
    for suffix in (".bak", ".orig", "~"):
        if is_file(path + suffix):
            pats.append("{path}" + suffix)
    for bdir in (os.path.join(d, "backups"), os.path.join(os.path.dirname(d), "backups"),
                 os.path.join(cwd or "/nonexistent", "backups")):
        if glob.glob(os.path.join(glob.escape(bdir), "*", glob.escape(name))):
            p = os.path.join(bdir, "*", "{name}")
            if p not in pats:
                pats.append(p)
    return pats


# --- git checkouts, read as files ----------------------------------------------------------------

def git_dir(top):
    g = os.path.join(top, ".git")
    if os.path.isdir(g):
        return g
    if is_file(g):
        t = (text(g, 4096) or "").strip()
        if t.startswith("gitdir:"):
            p = t[7:].strip()
            return p if os.path.isabs(p) else os.path.normpath(os.path.join(top, p))
    return None


def ref_sha(gd, ref):
    for base in (gd, os.path.join(gd, (text(os.path.join(gd, "commondir"), 4096) or ".").strip())):
        v = text(os.path.join(base, ref), 4096)
        if v and re.fullmatch(r"[0-9a-f]{40,64}", v.strip()):
            return v.strip()
        for line in (text(os.path.join(base, "packed-refs"), 8 << 20) or "").splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == ref:
                return parts[0]
    return None


def repo_info(top, found_from):
    gd = git_dir(top)
    head = (text(os.path.join(gd, "HEAD"), 4096) or "").strip() if gd else ""
    branch, sha = None, None
    if head.startswith("ref:"):
        ref = head[4:].strip()
        branch = ref[len("refs/heads/"):] if ref.startswith("refs/heads/") else ref
        sha = ref_sha(gd, ref)
    elif re.fullmatch(r"[0-9a-f]{40,64}", head):
        sha = head
    remote = None
    cfg = text(os.path.join(gd, "config"), 1 << 20) if gd else None
    if cfg:
        m = re.search(r'\[remote "origin"\][^\[]*?\burl\s*=\s*(\S+)', cfg)
        if m:
            remote = re.sub(r"//[^/@\s]*@", "//", m.group(1))  # no credentials
    return {"path": top, "found_from": found_from, "head": sha, "branch": branch, "remote": remote}


def walk_up(path):
    p = os.path.abspath(path)
    if not os.path.isdir(p):
        p = os.path.dirname(p)
    while True:
        if os.path.basename(p) in ("site-packages", "dist-packages"):
            return None  # an installed package, not a checkout
        if p != "/" and git_dir(p):
            return p
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent


def module_path(mod, argv0, exe, cwd, environ):
    """Where `python -m MOD` finds MOD's top-level package, without importing anything."""
    top = mod.split(".")[0]
    dirs = [cwd] if cwd else []
    dirs += [p for p in (environ or {}).get("PYTHONPATH", "").split(":") if p]
    prefixes = []
    for x in (argv0, exe):
        if x and os.path.isabs(x):
            prefixes.append(os.path.dirname(os.path.dirname(x)))
    site = []
    for pre in prefixes:
        site += glob.glob(os.path.join(glob.escape(pre), "lib", "python3*", "site-packages"))
        site += glob.glob(os.path.join(glob.escape(pre), "lib", "python3*", "dist-packages"))
        site += glob.glob(os.path.join(glob.escape(pre), "local", "lib", "python3*", "dist-packages"))
    for sp in site:
        for pth in glob.glob(os.path.join(glob.escape(sp), "*.pth")):
            for line in (text(pth, 1 << 16) or "").splitlines():
                line = line.strip()
                if line and not line.startswith(("#", "import")) and os.path.isdir(line):
                    dirs.append(line)
        for finder in glob.glob(os.path.join(glob.escape(sp), "__editable__*finder.py")):
            m = re.search(r"['\"]%s['\"]\s*:\s*['\"]([^'\"]+)['\"]" % re.escape(top), text(finder, 1 << 20) or "")
            if m:
                return m.group(1)
        for du in glob.glob(os.path.join(glob.escape(sp), "*.dist-info", "direct_url.json")):
            try:
                d = json.loads(text(du, 1 << 16) or "{}")
            except ValueError:
                continue
            dist = os.path.basename(os.path.dirname(du)).split("-")[0].lower().replace("-", "_")
            if d.get("dir_info", {}).get("editable") and dist == top.lower() and str(d.get("url", "")).startswith("file://"):
                return d["url"][7:]
        dirs.append(sp)
    for d in dirs:
        for cand in (os.path.join(d, top), os.path.join(d, top + ".py")):
            if os.path.exists(cand):
                return cand
    return None


# --- systemd --------------------------------------------------------------------------------------

def unit_of(pid):
    for line in (read("/proc/%s/cgroup" % pid, mode="r") or "").splitlines():
        path = line.split(":", 2)[-1]
        parts = [p for p in path.split("/") if p]
        for p in reversed(parts):
            if p.endswith(".service") and not p.startswith("user@"):
                return p, any(q.startswith("user@") for q in parts)
    return None, False


def unit_file(unit, user, home):
    dirs = ([os.path.join(home or "~", ".config/systemd/user"), "/etc/systemd/user", "/usr/lib/systemd/user"]
            if user else ["/etc/systemd/system", "/run/systemd/system", "/usr/lib/systemd/system",
                          "/lib/systemd/system"])
    found = None
    for d in dirs:
        p = os.path.join(d, unit)
        if is_file(p):
            found = p
            break
    if not found:
        return None
    body = text(found) or ""
    for dropin in sorted(glob.glob(os.path.join(glob.escape(found) + ".d", "*.conf"))):
        body += "\n" + (text(dropin) or "")
    info = {"path": found, "environment_files": [], "exec_start": None, "working_directory": None}
    for line in body.splitlines():
        k, _, v = line.strip().partition("=")
        if k == "EnvironmentFile":
            info["environment_files"].append(v.strip().lstrip("-"))
        elif k == "ExecStart" and v.strip():
            info["exec_start"] = v.strip().lstrip("@-:+!")
        elif k == "WorkingDirectory":
            info["working_directory"] = v.strip().lstrip("-")
    return info


# --- the processes ---------------------------------------------------------------------------

WRAPPERS = SHELLS + ("sudo", "su", "runuser", "doas", "tmux", "screen", "nohup", "setsid", "timeout", "env")
# what may stand between a start script and the server it starts
PASS_THROUGH = WRAPPERS + ("stdbuf", "numactl", "taskset", "nice", "ionice", "chrt", "tini", "dumb-init",
                           "start-stop-daemon", "flock", "script")


def match(argv):
    """The matcher a process's command line fits; a wrapper that is still around (a shell running
    `-c "... python -m sglang.launch_server"`, sudo, tmux) is not the server: its child is."""
    if os.path.basename(argv[0]).rstrip("0123456789.") in WRAPPERS:
        return None
    joined = " ".join(argv)
    for m in MATCHERS:
        if m["_re"].search(joined):
            return m
    return None


def scan_dirs(cwd):
    if not cwd:
        return []
    out = []
    for d in (cwd, os.path.join(cwd, "bin"), os.path.join(cwd, "scripts"), os.path.join(cwd, "sbin"),
              os.path.dirname(cwd)):
        if os.path.isdir(d) and d not in out:
            out.append(d)
    return out


def candidate_scripts(cwd, markers, exclude):
    found = []
    for d in scan_dirs(cwd):
        try:
            names = sorted(os.listdir(d))[:400]
        except OSError:
            continue
        for n in names:
            p = os.path.join(d, n)
            if p in exclude or not is_file(p):
                continue
            try:
                st = os.stat(p)
            except OSError:
                continue
            if st.st_size > MAX_SCRIPT or not (st.st_mode & 0o111 or n.endswith(".sh")):
                continue
            body = text(p)
            if body and any(mk in body for mk in markers) and not re.search(r"stop|kill|halt", n, re.I):
                found.append(p)
    return found[:10]


def pid_files(pid, cwd, uid):
    deep = ["/run", "/var/run"]  # and one level below: /run/sglang/prefill.pid
    dirs = deep + ["/run/user/%s" % uid, "/tmp"]
    if cwd:
        dirs = [cwd, os.path.join(cwd, "run"), os.path.join(cwd, "pids"), os.path.join(cwd, "var", "run")] + dirs
    out = []
    for d in dirs:
        pats = [os.path.join(glob.escape(d), "*.pid")]
        pats += [os.path.join(glob.escape(d), "*", "*.pid")] if d in deep else []
        for p in sorted(x for pat in pats for x in glob.glob(pat))[:200]:
            v = text(p, 64)
            if v is not None and v.strip() == str(pid) and p not in out:
                out.append(p)
    return out


def log_addresses(path, regex):
    if not path or not regex or not is_file(path):
        return []
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            f.seek(max(0, size - LOG_TAIL))
            data = f.read(LOG_TAIL).decode("utf-8", "replace")
    except OSError:
        return []
    data = re.sub(r"\x1b\[[0-9;]*m", "", data)
    return [[h, int(p)] for h, p in re.findall(regex, data)][-3:]


def process(pid, m, all_matched):
    argv = argv_of(pid)
    st = stat_of(pid) or {}
    uid = uid_of(pid)
    user, home = user_of(uid) if uid is not None else (None, None)
    cwd = readlink("/proc/%s/cwd" % pid)
    environ = environ_of(pid)
    exe = readlink("/proc/%s/exe" % pid)
    out = {"pid": pid, "ppid": st.get("ppid"), "matcher": m["name"], "kind": m["kind"], "argv": argv,
           "title_only": len(argv) == 1 and "::" in argv[0], "user": user, "cwd": cwd, "exe": exe,
           "started_at": (BOOT + st["start_ticks"] / float(HZ)) if BOOT and "start_ticks" in st else None,
           "listen": listening(pid), "environ_readable": bool(environ), "notes": []}
    if cwd is None:
        out["notes"].append("its working directory cannot be read (a process of %s): run init as that user" % user)
    fds = {}
    for fd in ("1", "2"):
        link = readlink("/proc/%s/fd/%s" % (pid, fd))
        fds[fd] = link if link and link.startswith("/") and is_file(link) else None
    out["stdout"], out["stderr"] = fds["1"], fds["2"]
    out["log_addresses"] = log_addresses(out["stdout"] or out["stderr"], m.get("log_listen"))
    ctx = {"cwd": cwd, "home": home, "environ": environ, "markers": m.get("markers", []), "script": cwd or "/"}
    scripts, seen = [], set()
    # 1. parents still running: a shell that runs a script, or sh -c '...'
    anc, p = [], st.get("ppid")
    for _ in range(6):
        if not p or p <= 1:
            break
        a = argv_of(p)
        if p in all_matched:
            out["child_of"] = p
        anc.append({"pid": p, "argv0": os.path.basename(a[0]) if a else None})
        base = os.path.basename(a[0]).rstrip("0123456789.") if a else ""
        if base not in PASS_THROUGH:
            # a program that is neither a shell nor a wrapper (a CI harness, a supervisor written
            # in Python) started what is below it: the shells above it did not start the server
            break
        if base in SHELLS:
            rest = [x for x in a[1:] if not x.startswith("-") or x == "-c"]
            if "-c" in a[1:]:
                i = a.index("-c")
                if i + 1 < len(a):
                    scripts.append(inline_info(a[i + 1], ctx))
            elif rest:
                sp = rest[0] if os.path.isabs(rest[0]) else os.path.join(readlink("/proc/%s/cwd" % p) or "/", rest[0])
                info = script_info(sp, "parent", ctx, a[1:])
                if info:
                    info["running_pid"] = p
                    scripts.append(info)
                    seen.add(sp)
        p = (stat_of(p) or {}).get("ppid")
    out["ancestors"] = anc
    # 2. systemd
    unit, user_unit = unit_of(pid)
    if unit:
        out["unit"] = {"name": unit, "user": user_unit, "file": unit_file(unit, user_unit, home)}
        uf = out["unit"]["file"]
        if uf and uf.get("exec_start"):
            try:
                first = shlex.split(uf["exec_start"])[0]
            except (ValueError, IndexError):
                first = None
            if first and first not in seen and is_file(first):
                info = script_info(first, "unit", ctx)
                if info:
                    scripts.append(info)
                    seen.add(first)
    # 3. scripts near its working directory that launch this kind of process
    for sp in candidate_scripts(cwd, m.get("markers", []), seen):
        info = script_info(sp, "nearby", ctx)
        if info:
            scripts.append(info)
    out["scripts"] = scripts
    # env files: what the scripts source, the unit's EnvironmentFile=, else files that look like one
    paths = []
    for s in scripts:
        for src in s["sources"]:
            paths += [x["path"] for x in src["matches"]]
    if unit and out["unit"]["file"]:
        paths += [x for x in out["unit"]["file"]["environment_files"] if is_file(x)]
    if not paths and cwd:
        for d in (cwd, os.path.join(cwd, "conf"), os.path.join(cwd, "config"), os.path.join(cwd, "etc"),
                  os.path.join(cwd, "env")):
            found = glob.glob(os.path.join(glob.escape(d), "*env*")) + glob.glob(os.path.join(glob.escape(d), ".env"))
            for pth in sorted(found)[:50]:
                if is_file(pth) and pth not in paths:
                    paths.append(pth)
    out["env_files"] = []
    for pth in dict.fromkeys(paths):
        c = compare_env(pth, environ)
        c["backups"] = backups_of(pth, cwd)
        out["env_files"].append(c)
    out["pid_files"] = pid_files(pid, cwd, uid)
    # git checkouts: above its working directory, above the code it runs, directly below its cwd
    repos = []

    def add(path, why):
        if path and not any(r["path"] == path for r in repos):
            repos.append(repo_info(path, why))
    if cwd:
        add(walk_up(cwd), "above its working directory")
    mod = None
    if "-m" in argv[1:]:
        i = argv.index("-m")
        if i + 1 < len(argv):
            mod = argv[i + 1]
    if mod:
        mp = module_path(mod, argv[0] if argv else None, exe, cwd, environ)
        if mp:
            out["module_path"] = mp
            add(walk_up(mp), "the checkout of module " + mod.split(".")[0])
    for a in argv[1:3]:
        if a.endswith(".py"):
            pth = a if os.path.isabs(a) else os.path.join(cwd or "/", a)
            if is_file(pth):
                add(walk_up(pth), "the checkout of " + os.path.basename(a))
    for s in scripts:
        if s.get("path"):
            add(walk_up(s["path"]), "above its start script")
    if cwd:
        for g in sorted(glob.glob(os.path.join(glob.escape(cwd), "*", ".git")))[:20]:
            add(os.path.dirname(g), "in its working directory")
    out["repos"] = repos
    return out


matched = {}
for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) == os.getpid():
        continue
    argv = argv_of(name)
    if not argv:
        continue
    m = match(argv)
    if m:
        matched[int(name)] = m
procs = [process(pid, m, matched) for pid, m in sorted(matched.items())]
home = user_of(os.getuid())[1]
json.dump({"hostname": socket.gethostname(), "user": user_of(os.getuid())[0], "home": home, "uid": os.getuid(),
           "python": sys.executable, "python_version": "%d.%d" % sys.version_info[:2], "now": time.time(),
           "systemd": os.path.isdir("/run/systemd/system"), "processes": procs}, sys.stdout)
