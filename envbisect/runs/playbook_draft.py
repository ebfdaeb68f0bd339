"""`envbisect init --host HOST`: a commented playbook draft from what runs on a host.

The host side is the agent script `envbisect/hosts/agent/discover.py` (one round trip, reads only:
/proc, start scripts, env files, unit files, pid files, git metadata). This module decides what the
findings mean and writes the draft (docs/playbook.md format):

* **Processes.** `MATCHERS`: ``python -m sglang.launch_server`` (role from
  ``--disaggregation-mode``), the router (``sglang-router``, ``python -m sglang_router.launch_router``,
  and the process title ``sglang::router`` it rewrites itself to, which hides its arguments), and
  envbisect's own simulated worker (``envbisect/sim/worker.py --role prefill|decode``, so the
  simulated deployment can be discovered). ``--match REGEX`` adds a launcher of your own.
* **Env files.** What the start scripts source (``. FILE``/``source FILE``, variables expanded,
  ``$1`` recovered from the file that matched), a systemd unit's ``EnvironmentFile=``, scored by the
  service's role and by how many of the file's variables the running process carries.
* **Start/stop.** A systemd unit (``systemctl start/stop``), or the start script with the argument
  that selected this service's env file and its ``stop`` sibling.

What it cannot infer is written as ``# TODO (required)`` (the draft does not load until it is
filled) or ``# TODO (optional)``; a guess that should be read says ``check:``.

The draft writer is most of the module: one commented TOML block per kind of finding, and the TODO
for each thing it could not infer.
"""
from __future__ import annotations

import json
import re
import shlex
import time
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from envbisect.errors import RemoteError, UsageError
from envbisect.hosts.agent_calls import run_agent
from envbisect.hosts.transport import Transport
from envbisect.runs.discover_answer import checked
from envbisect.state.store import write_file

MATCHERS: tuple[dict[str, Any], ...] = (
    {"name": "sglang.launch_server", "kind": "server",
     "regex": r"(?:^|\s)-m\s+sglang\.launch_server(?:\s|$)|(?:^|[\s/])sglang/launch_server\.py(?:\s|$)",
     "markers": ["sglang.launch_server", "sglang/launch_server.py"], "role_flags": ["--disaggregation-mode"],
     "default_port": 30000, "health": "/health", "metrics": "flag:--enable-metrics",
     "log_listen": r"Uvicorn running on https?://([^\s:/]+):(\d+)"},
    {"name": "sglang-router", "kind": "router",
     "regex": r"^sglang::router(?:\s|$)|(?:^|[\s/])sglang-router(?:\s|$)"
              r"|(?:^|\s)-m\s+sglang_router\.launch_router(?:\s|$)"
              r"|sglang_router/launch_router\.py(?:\s|$)",
     "markers": ["sglang-router", "sglang_router", "launch_router"], "default_port": 30000, "health": "/readiness",
     "metrics": "router", "log_listen": r"Starting router on ([\w.\[\]:-]+?):(\d+)"},
    {"name": "envbisect simulator worker", "kind": "server",
     "regex": r"(?:^|[\s/])envbisect/sim/worker\.py\s(?:.*\s)?--role\s+(?:prefill|decode)(?:\s|$)",
     "markers": ["envbisect/sim/worker.py"], "role_flags": ["--role"], "default_port": 30000, "health": "/health",
     "metrics": "always", "log_listen": r"HTTP server listening on ([\w.\[\]:-]+?):(\d+)"},
)
ROLE_ORDER = {"prefill": 0, "decode": 1, "server": 2, "router": 3}
ANY_ADDR = ("0.0.0.0", "::", "", "*", "[::]")


def matchers(extra: Sequence[str] = ()) -> list[dict[str, Any]]:
    out = [dict(m) for m in MATCHERS]
    for i, rx in enumerate(extra):
        try:
            re.compile(rx)
        except re.error as e:
            raise UsageError(f"--match {rx!r}: not a regular expression ({e})") from None
        out.append({"name": f"--match {rx}", "kind": "server", "regex": rx, "markers": [], "default_port": 30000,
                    "role_flags": ["--disaggregation-mode", "--role"], "health": "/health", "metrics": "none",
                    "log_listen": MATCHERS[0]["log_listen"]})
    return out


def scan(transport: Transport, extra_match: Sequence[str] = ()) -> dict[str, Any]:
    """One round trip: the agent's findings on the host (see envbisect/hosts/agent/discover.py)."""
    req = {"matchers": [{k: v for k, v in m.items() if k in ("name", "kind", "regex", "markers", "log_listen")}
                        for m in matchers(extra_match)]}
    doc = run_agent(transport, "discover.py", req, what="discovery")
    if not isinstance(doc, dict) or not isinstance(doc.get("processes"), list):
        raise RemoteError(f"{transport.host}: discovery answered an unexpected document")
    return checked(doc)


def masked(doc: Any, masker: Any) -> Any:
    """The findings with every string through the masker (runs.deployment's SecretMasker): before
    the draft is written, so that what is masked is a host string, never the TOML quoting around it
    (masking the draft's text could end a quoted string early)."""
    if isinstance(doc, str):
        return masker.redact_text(doc)
    if isinstance(doc, dict):
        return {k: masked(v, masker) for k, v in doc.items()}
    if isinstance(doc, list):
        return [masked(v, masker) for v in doc]
    return doc


# --- what the findings mean ----------------------------------------------------------------------

@dataclass
class Value:
    """One key of the draft: a value (with why), or a TODO."""

    value: Any = None
    why: str = ""
    check: bool = False  # a guess to read
    todo: str = ""  # no value: what to fill in
    example: Any = None  # shown commented under the TODO

    @property
    def known(self) -> bool:
        return self.value is not None


@dataclass
class Service:
    name: str
    role: str
    pid: int
    matcher: str
    cwd: str | None
    keys: dict[str, Value] = field(default_factory=dict)
    backups: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    http: tuple[str, int] | None = None
    served_model: str | None = None


def _flag(argv: Sequence[str], *names: str) -> str | None:
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None


def _local_host(h: str | None, port: int, listen: Sequence[Sequence[Any]] | None) -> str:
    """The address to reach a port from the host itself."""
    bound = [a for a, p in (listen or []) if p == port]
    if bound and not any(a in ANY_ADDR or a.startswith("127.") or a == "::1" for a in bound):
        h = bound[0]
    if not h or h in ANY_ADDR or h == "localhost":
        return "127.0.0.1"
    return f"[{h}]" if ":" in h and not h.startswith("[") else h


def _role(p: Mapping[str, Any], m: Mapping[str, Any]) -> str:
    if m["kind"] == "router":
        return "router"
    v = _flag(p.get("argv") or [], *m.get("role_flags", ()))
    return v if v in ("prefill", "decode") else "server"


def _http(p: Mapping[str, Any], m: Mapping[str, Any], scripts: Sequence[Mapping[str, Any]]) -> Value:
    argv = p.get("argv") or []
    listen = [tuple(a) for a in (p.get("listen") or [])]
    ports = [pt for _a, pt in listen]
    if not p.get("title_only"):
        port_s = _flag(argv, "--port")
        host = _flag(argv, "--host")
        try:
            port = int(port_s) if port_s else int(m.get("default_port", 30000))
        except ValueError:
            return Value(todo=f"the port of pid {p['pid']} (--port {port_s!r} is not a number)")
        why = f"--port {port}" if port_s else f"the default port of {m['name']}"
        v = Value((_local_host(host, port, listen), port), why)
        if listen and port not in ports:
            v.check, v.why = True, why + f", but it listens on {', '.join(map(str, ports))} now"
        return v
    # the process title hid the arguments: its log, then what it listens on, then its start script
    logged = [(h, pt) for h, pt in (p.get("log_addresses") or []) if pt in ports]
    if logged:
        h, pt = logged[-1]
        return Value((_local_host(h, pt, listen), pt), f"its log says it serves on {h}:{pt}")
    if len(ports) == 1:
        return Value((_local_host(listen[0][0], ports[0], listen), ports[0]), "the one port it listens on", check=True)
    named = sorted({pt for s in scripts for pt in s.get("mentions_ports", ()) if pt in ports})
    if len(named) == 1:
        return Value((_local_host(None, named[0], listen), named[0]), "its start script passes --port "
                     f"{named[0]}", check=True)
    return Value(todo=f"the HTTP port of pid {p['pid']} (its title hides its arguments; it listens on "
                      f"{', '.join(map(str, ports)) or 'nothing visible'})")


def _metrics(p: Mapping[str, Any], m: Mapping[str, Any], http: Value, scripts: Sequence[Mapping[str, Any]]) -> Value:
    kind = m.get("metrics", "none")
    argv = p.get("argv") or []
    if not http.known:
        return Value()
    host, port = http.value
    if kind == "always":
        return Value(f"http://{host}:{port}/metrics", f"{m['name']} serves /metrics on its HTTP port")
    if kind == "flag:--enable-metrics":
        if "--enable-metrics" in argv:
            return Value(f"http://{host}:{port}/metrics", "started with --enable-metrics")
        return Value()
    if kind == "router":
        listen = [tuple(a) for a in (p.get("listen") or [])]
        if not p.get("title_only"):
            mp = _flag(argv, "--prometheus-port")
            mh = _flag(argv, "--prometheus-host")
            if mp and mp.isdigit():
                return Value(f"http://{_local_host(mh, int(mp), listen)}:{mp}/metrics", f"--prometheus-port {mp}")
        others = sorted({pt for _a, pt in listen if pt != port})
        named = sorted({pt for s in scripts for pt in s.get("mentions_metrics_ports", ()) if pt in others})
        if len(named) == 1:
            return Value(f"http://{_local_host(None, named[0], listen)}:{named[0]}/metrics",
                         f"its start script passes --prometheus-port {named[0]}")
        if len(others) == 1:
            return Value(f"http://{_local_host(None, others[0], listen)}:{others[0]}/metrics",
                         "the router's other listening port (its Prometheus exporter)", check=True)
    return Value()


def _env_file(p: Mapping[str, Any], role: str) -> tuple[Value, list[str], Mapping[str, Any] | None, dict[str, str]]:
    """(env_file, its backup patterns, the script that sources it, the script arguments that chose it)."""
    compare = {c["path"]: c for c in p.get("env_files") or []}
    environ = bool(p.get("environ_readable"))
    cands: dict[str, dict[str, Any]] = {}

    def evidence(path: str) -> tuple[float, str]:
        c = compare.get(path) or {}
        if not environ or not c.get("keys"):
            return 0.0, ""
        eq, differ, keys = c.get("equal", 0), c.get("differ", 0), c["keys"]
        score = 4.0 * eq / keys - 4.0 * differ / keys
        what = f"{eq} of its {keys} variables are in the running process's environment"
        return score, what + (f", {differ} with another value" if differ else "")

    unit = (p.get("unit") or {}).get("file") or {}
    for path in unit.get("environment_files") or []:
        if path in compare:
            cands[path] = {"score": 6.0, "why": f"EnvironmentFile= of {p['unit']['name']}", "script": None, "args": {}}
    for s in p.get("scripts") or []:
        rank = {"parent": 2.0, "unit": 2.0, "shell-c": 2.0, "nearby": 0.0}.get(s.get("how"), 0.0)
        for src in s.get("sources") or []:
            matches = src.get("matches") or []
            for x in matches:
                score = rank + (3.0 if len(matches) == 1 else 0.0)
                args = {k: v for k, v in (x.get("args") or {}).items()}
                if any(v == role for v in args.values()):
                    score += 5.0
                if role in Path(x["path"]).name:
                    score += 2.0
                where = s.get("path") or "its parent shell's command line"
                why = f"sourced by {where} (line {src['line']}: {src['text'][:60]})"
                if args:
                    why += " with " + ", ".join(f"${k}={v}" for k, v in sorted(args.items()))
                if x["path"] not in cands or cands[x["path"]]["score"] < score:
                    cands[x["path"]] = {"score": score, "why": why, "script": s, "args": args}
    if not cands:  # nothing sources anything visible: files that look like env files near its cwd
        for path, c in compare.items():
            if environ and c.get("keys") and c.get("equal", 0) * 2 >= c["keys"] and not c.get("differ"):
                cands[path] = {"score": 1.0, "why": "found near its working directory", "script": None, "args": {}}
    for path, c in cands.items():
        s, what = evidence(path)
        c["score"] += s
        if what:
            c["why"] += "; " + what
    if not cands:
        return (Value(todo="the env file the start script sources for this service (set -a; . FILE): none found",
                      example="/path/to/" + role + ".serve-env"), [], None, {})
    best_path = max(cands, key=lambda k: (cands[k]["score"], k))
    best = cands[best_path]
    rivals = [k for k in cands if k != best_path and cands[k]["score"] >= best["score"] - 1.0]
    v = Value(best_path, best["why"], check=bool(rivals) or best["score"] < 3.0)
    if rivals:
        v.why += "; also possible: " + ", ".join(rivals[:3])
    return v, list((compare.get(best_path) or {}).get("backups") or []), best["script"], best["args"]


def _start_stop(p: Mapping[str, Any], role: str, script: Mapping[str, Any] | None,
                args: Mapping[str, str], pid_file: str | None) -> tuple[Value, Value]:
    unit = p.get("unit")
    if unit and unit.get("name"):
        ctl = "systemctl --user" if unit.get("user") else "systemctl"
        note = "" if unit.get("user") else "; check: a system unit needs root (or sudo) to start and stop"
        name = shlex.quote(str(unit["name"]))
        return (Value(f"{ctl} start {name}", f"it runs as the systemd unit {unit['name']}{note}",
                      check=not unit.get("user")),
                Value(f"{ctl} stop {name}", f"the systemd unit {unit['name']}", check=not unit.get("user")))
    scripts = [s for s in p.get("scripts") or [] if s.get("path")]
    if script is None or not script.get("path"):
        script = next((s for s in scripts if s.get("markers")), scripts[0] if scripts else None)
    kill = f'kill "$(cat {pid_file})"' if pid_file else "..."
    if script is None:
        return (Value(todo="a command that starts this service and returns once it is launched", example="..."),
                Value(todo="a command that stops this service and returns once it is stopped", example=kill))
    path = script["path"]
    if script.get("how") == "parent" and script.get("running_pid"):
        fg = f"setsid nohup {shlex.quote(path)} >/dev/null 2>&1 < /dev/null &"
        start = Value(todo=f"{path} runs in the foreground (pid {script['running_pid']} is still running it), and "
                           "start must return once the service is launched: run it detached", example=fg)
    else:
        words = [path]
        why = f"{path} launches it"
        check = not script.get("detaches")
        if script.get("uses_positional"):
            if args:
                words += [args[k] for k in sorted(args)]
                why += " (" + ", ".join(f"${k}={v}" for k, v in sorted(args.items())) + " selects its env file)"
            elif role in (script.get("cases") or ()):
                words.append(role)
                why += f" (it has a case for {role!r})"
                check = True
            else:
                start = Value(todo=f"the arguments {path} takes for this service", example=f"{path} ...")
                return start, Value(todo="a command that stops this service", example=kill)
        if check:
            why += "; check: it must return once the service is launched"
        start = Value(" ".join(shlex.quote(w) for w in words), why, check=check)
    sibs = script.get("siblings") or []
    base = Path(path).name
    want = [re.sub(r"start|launch|run|up", "stop", base, count=1, flags=re.I)]
    pick = next((s for s in sibs if s in want), None) or next((s for s in sibs if "stop" in s.lower()), None)
    if pick is None:
        return start, Value(todo="a command that stops this service and returns once it is stopped", example=kill)
    stop_path = str(Path(path).parent / pick)
    extra = start.value.split()[1:] if start.known else []
    return start, Value(" ".join([shlex.quote(stop_path), *extra]), f"the stop script next to {base}",
                        check=pick not in want)


def interpret(doc: Mapping[str, Any], *, under: str | None = None, extra_match: Sequence[str] = (),
              masker: Any = None) -> tuple[list[Service], list[dict[str, Any]], list[str]]:
    """(services, repos, notes) from the agent's findings; with `masker`, the processes' strings
    masked once they are picked (`under` is matched on the working directory as it is)."""
    by_name = {m["name"]: m for m in matchers(extra_match)}
    doc = checked(doc)
    notes: list[str] = list(doc["answer_notes"])
    procs = [p for p in doc["processes"] if not p.get("child_of") and p["matcher"] in by_name]
    if len(procs) < len([p for p in doc["processes"] if not p.get("child_of")]):
        notes.append("a process found by a matcher this controller did not send was left out")
    if under:
        root = under.rstrip("/") or "/"
        procs = [p for p in procs if p.get("cwd") and (p["cwd"] == root or p["cwd"].startswith(root + "/"))]
    if masker is not None:
        doc, procs = masked(doc, masker), masked(procs, masker)
    if not procs:
        looked = ", ".join(m["name"] for m in by_name.values())
        where = f" under {under}" if under else ""
        raise UsageError(f"{doc.get('hostname', 'the host')}: no SGLang server or router is running{where} (looked for "
                         f"{looked}); start the stack, or name your launcher with --match REGEX")
    stacks: dict[str, list[str]] = {}
    for p in procs:
        stacks.setdefault(p.get("cwd") or "?", []).append(_role(p, by_name[p["matcher"]]))
    if len(stacks) > 1:
        shown = "; ".join(f"in {cwd}: {', '.join(sorted(r, key=ROLE_ORDER.get))}" for cwd, r in sorted(stacks.items()))
        raise UsageError(f"{doc.get('hostname', 'the host')} runs {len(procs)} SGLang processes in {len(stacks)} "
                         f"working directories ({shown}); pick one stack with --under DIR")
    services: list[Service] = []
    for p in sorted(procs, key=lambda p: (ROLE_ORDER.get(_role(p, by_name[p["matcher"]]), 9), p["pid"])):
        m = by_name[p["matcher"]]
        role = _role(p, m)
        svc = Service(role, role, p["pid"], m["name"], p.get("cwd"))
        svc.notes += p.get("notes") or []
        env, backups, script, args = _env_file(p, role)
        svc.backups = backups
        scripts = p.get("scripts") or []
        http = _http(p, m, scripts)
        svc.http = http.value if http.known else None
        pid_files = p.get("pid_files") or []
        pid_file = next((f for f in pid_files if role in Path(f).name), pid_files[0] if pid_files else None)
        start, stop = _start_stop(p, role, script, args, pid_file)
        svc.keys["env_file"] = env
        svc.keys["start"] = start
        svc.keys["stop"] = stop
        if http.known:
            h, pt = http.value
            svc.keys["health"] = Value(f"http://{h}:{pt}{m['health']}", http.why, check=http.check)
        else:
            svc.keys["health"] = Value(todo=http.todo, example=f"http://127.0.0.1:30000{m['health']}")
        svc.keys["pid_file"] = (Value(pid_file, f"holds its pid {p['pid']}") if pid_file else
                                Value(todo="a file holding its pid (for drift checks and its start environment)"))
        svc.keys["log"] = (Value(p["stdout"], "where its output goes") if p.get("stdout") else
                           Value(todo="its log file (its tail is kept as evidence)"))
        metrics = _metrics(p, m, http, scripts)
        svc.keys["metrics"] = metrics if metrics.known else Value(todo="its /metrics URL, if it has one")
        svc.served_model = _flag(p.get("argv") or [], "--served-model-name")
        services.append(svc)
    counts: dict[str, int] = {}
    for s in services:
        counts[s.role] = counts.get(s.role, 0) + 1
    taken: set[str] = set()
    for s in services:  # two prefills: prefill-30000, prefill-30001; two on one port: server-30000-2
        if counts[s.role] > 1:
            s.name = f"{s.role}-{s.http[1]}" if s.http else f"{s.role}-{s.pid}"
        base, n = s.name, 1
        while s.name in taken:
            n += 1
            s.name = f"{base}-{n}"
        taken.add(s.name)
    repos: list[dict[str, Any]] = []
    for p in procs:
        for r in p.get("repos") or []:
            if not any(x["path"] == r["path"] for x in repos):
                repos.append(dict(r))
    return services, repos, notes


# --- the draft -----------------------------------------------------------------------------------

def start_order(services: list[Service]) -> list[str | list[str]]:
    """The `[restart] order` a draft proposes: the engines (prefill and decode) as one start group
    when there are both, since neither waits for the other at start (a decode reaches its prefill's
    bootstrap server per request); every other service alone, after them, as listed."""
    engines = [s.name for s in services if s.role in ("prefill", "decode")]
    if not {"prefill", "decode"} <= {s.role for s in services}:
        return [s.name for s in services]
    return [engines, *(s.name for s in services if s.name not in engines)]


_UNSHOWN = re.compile(r"[\x80-\x9f\u2028\u2029]")  # left raw by TOML's quoting; a terminal acts on them


def _toml(v: Any) -> str:
    """`v` as a TOML value, through tomlkit's quoting: a string is one line whatever it holds (C0
    controls and DEL escaped by tomlkit, C1 controls and line separators by \\uXXXX here)."""
    import tomlkit

    if isinstance(v, str):
        return _UNSHOWN.sub(lambda m: f"\\u{ord(m.group(0)):04x}", tomlkit.string(v).as_string())
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    raise TypeError(type(v))


def _controls(text: str) -> bool:
    return any(unicodedata.category(c) == "Cc" or c in "\u2028\u2029" for c in text)


def _comment(text: str) -> str:
    """Text for a comment, on one line; dropped when it holds control characters (a host string
    with a line break would end the comment and start TOML of its own)."""
    text = str(text)
    if _controls(text):
        return "(not shown: it holds control characters)"
    return " ".join(text.split())


def _shown(text: Any) -> str:
    """A host string inside a comment: quoted as a TOML string, or dropped when it holds control
    characters."""
    return "(a name holding control characters)" if _controls(str(text)) else _toml(str(text))


class _Draft:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.required = 0
        self.optional = 0

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def key(self, key: str, v: Value, *, required: bool) -> None:
        if v.known:
            why = ("check: " if v.check and not v.why.startswith("check") else "") + _comment(v.why)
            self.lines.append(f"{key} = {_toml(v.value)}" + (f"   # {why}" if why else ""))
            return
        if not v.todo and not required:
            return
        if required:
            self.required += 1
        else:
            self.optional += 1
        self.lines.append(f"# TODO ({'required' if required else 'optional'}): {_comment(v.todo)}")
        self.lines.append(f"# {key} = {_toml(v.example if v.example is not None else '...')}")

    def text(self) -> str:
        return "\n".join(self.lines).rstrip() + "\n"


def _bare(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else _toml(name)


def host_key(spec: str) -> str:
    """[hosts.KEY] for an ssh target: gpu1 for "ops@gpu1.example.com:2222"."""
    if spec == "local":
        return "localhost"  # "local" means this machine as a probe's vantage
    h = spec.rsplit("@", 1)[-1]
    h = re.sub(r":\d+$", "", h).strip("[]")
    h = h.split(".")[0] if not re.fullmatch(r"[\d.]+", h) else h
    return re.sub(r"[^A-Za-z0-9_-]+", "-", h).strip("-") or "host"


def draft(doc: Mapping[str, Any], services: Sequence[Service], repos: Sequence[Mapping[str, Any]], *,
          host: str, ssh: str | None, inventory_host: str | None, inventory_file: str | None, python: str,
          name: str | None = None, command: str = "") -> tuple[str, int, int]:
    """(TOML text, required TODOs, optional TODOs)."""
    d = _Draft()
    doc = checked(doc)
    when = datetime.fromtimestamp(doc.get("now") or time.time(), timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    pd = any(s.role in ("prefill", "decode") for s in services)
    dep_name = name or f"{host}-sglang{'-pd' if pd else ''}"
    d.add(f"# envbisect playbook draft: `envbisect {_comment(command)}` read what runs on "
          f"{_shown(doc.get('hostname', host))} "
          f"at {when}",
          f"# ({len(services)} SGLang process(es): {', '.join(f'{s.name} pid {s.pid}' for s in services)}).",
          "# Nothing was changed on the host. Reference: docs/playbook.md.",
          "# Lines marked TODO (required) must be filled in (uncomment the key below each) before envbisect",
          "# can load this file; TODO (optional) ones may be; a comment saying check: marks a guess to read.",
          "# The process matcher that found each service is named in its table (docs/guide.md, init).",
          *(f"# note: {_comment(n)}" for n in doc["answer_notes"]),
          "", "[deployment]", f"name = {_toml(dep_name)}", "")
    if inventory_file and inventory_file != "-":
        d.add("[inventory]", f"file = {_toml(inventory_file)}", "")
    d.add(f"[hosts.{_bare(host)}]")
    if inventory_host:
        d.add(f"inventory = {_toml(inventory_host)}" + ("" if inventory_file and inventory_file != "-" else
                                                         "   # pass the inventory with --inventory FILE"))
    else:
        d.add(f"ssh = {_toml(ssh)}")
    d.add(f"python = {_toml(python)}   # ran the discovery there (Python {_comment(doc.get('python_version', '?'))})",
          "")
    for s in services:
        d.add(f"# {s.role}: pid {s.pid}, found as {s.matcher}" + (f", working directory {_shown(s.cwd)}" if s.cwd
                                                                  else ""))
        for n in s.notes:
            d.add(f"# note: {_comment(n)}")
        d.add(f"[services.{_bare(s.name)}]", f"host = {_toml(host)}")
        for k in ("env_file", "start", "stop", "health"):
            d.key(k, s.keys[k], required=True)
        for k in ("pid_file", "log", "metrics"):
            d.key(k, s.keys[k], required=False)
        d.add("")
    order = start_order(services)
    grouped = any(isinstance(item, list) for item in order)
    d.add("[restart]", f"order = {_toml(order)}   # " + (
        "prefill and decode start at once (neither waits for the other at start: the KV transfer is set up per "
        "request), the router once both are healthy; " if grouped else
        "prefill before decode before the router; " if pd else "") + "stop is the reverse",
          "health_timeout_s = 600", "poll_interval_s = 2.0", "")
    for r in repos:
        head = (r.get("branch") or "detached") + ("@" + r["head"][:10] if r.get("head") else "")
        d.add("[[repos]]", f"host = {_toml(host)}",
              f"path = {_toml(r['path'])}   # " + _comment(f"{r.get('found_from', '')}; {head}"
                                                          + (f"; origin {r['remote']}" if r.get("remote") else "")),
              "")
    if not repos:
        d.add("# TODO (optional): the deployed git checkouts (none found above the services' working directories",
              "# or the code they run)", "# [[repos]]", f"# host = {_toml(host)}", '# path = "/srv/sglang/src"', "")
        d.optional += 1
    env_dirs = sorted({str(Path(s.keys["env_file"].value).parent) for s in services if s.keys["env_file"].known})
    d.add("[watch]",
          "# TODO (optional): other files and folders whose changes matter (folders are walked, .git skipped),",
          f"# e.g. the folder of the env files: paths = {_toml(env_dirs) if env_dirs else '[...]'}",
          "paths = []", "")
    d.optional += 1
    backups = sorted({b for s in services for b in s.backups})
    if backups:
        d.add("[baseline]", f"backups = {_toml(backups)}   # old copies of the env files found there", "")
    else:
        d.add("# TODO (optional): where old copies of the env files are kept, for diff --since without a snapshot",
              '# [baseline]', '# backups = ["{path}.bak"]', "")
        d.optional += 1
    d.add("[secrets]", "names = []   # more variable names to mask, on top of the built-in rules (tokens, keys...)",
          "values = []", "")
    entry = next((s for s in services if s.role == "router" and s.http), None) or \
        next((s for s in services if s.http), None)
    if entry:
        h, pt = entry.http  # type: ignore[misc]
        model = next((s.served_model for s in services if s.served_model), None) or "default"
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8})
        d.add("[probes.e2e]   # the first probe is the default for bisect; verify builds its layers from it",
              'kind = "http"', f"vantage = {_toml(host)}   # requests are made from the host",
              f"url = {_toml(f'http://{h}:{pt}/v1/chat/completions')}   # through the {entry.name}",
              'method = "POST"', f"body = {_toml(body)}" + ("" if model != "default" else
                                                            "   # check: the model name the server expects"),
              "expect_status = 200", 'expect_body = "choices"', "timeout_s = 30", "repeat = 3", "")
    else:
        d.add("# TODO (optional): a probe (no HTTP port was found to send a request to)",
              "# [probes.e2e]", '# kind = "http"', '# url = "http://127.0.0.1:30000/v1/chat/completions"', "")
        d.optional += 1
    return d.text(), d.required, d.optional


def summary(services: Iterable[Service], repos: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {
        "services": {s.name: {"role": s.role, "pid": s.pid, "matcher": s.matcher, "cwd": s.cwd,
                              **{k: (v.value if v.known else None) for k, v in s.keys.items()},
                              "todo": [k for k, v in s.keys.items() if not v.known and v.todo],
                              "check": [k for k, v in s.keys.items() if v.known and v.check]}
                     for s in services},
        "repos": [dict(r) for r in repos],
    }


def write_draft(path: Path, text: str, *, force: bool) -> None:
    if path.exists() and not force:
        raise UsageError(f"{path} exists: give --force to replace it, or --out FILE (--out - prints the draft)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path, text.encode(), 0o644)
    except OSError as e:
        raise UsageError(f"{path}: cannot write the draft: {e.strerror or e}") from None
