"""Build a simulated SGLang prefill/decode-disaggregated deployment on this machine.

The router is the REAL ``sglang-router`` (PyPI ``sglang-router``); prefill and decode are the small
simulated workers of :mod:`envbisect.sim.worker`, whose faults are decided by the environment they
were started with (``conf/SERVICE.serve-env``) and ``rules.json``.

Layout written under *root*::

    envbisect.toml            playbook (docs/playbook.md format)
    conf/{prefill,decode,router}.serve-env
    conf/extra/               watched files
    bin/start SERVICE         starts one service detached (prefill|decode|router|proxy): returns at once,
                              or with start_mode="checked" once it listens, exit 1 if it died
    bin/stop SERVICE          TERM, up to 5 s, then KILL; idempotent
    rules.json                fault rules (named by ENVBISECT_SIM_RULES, set by bin/start)
    model/                    tiny tokenizer the router loads
    src/                      a git repository (VERSION, configs/feature_flags.yaml) when with_repo
    backups/<date>/           dated copies of the default serve-env files (when backups)
    log/SERVICE.log, run/SERVICE.pid

Usage in tests::

    dep = build(tmp_path, env={"decode": {"SGLANG_SM120_MMA_TARGET_CTAS": "256"}})
    dep.start_all()
    try: ...
    finally: dep.stop_all()

Long on purpose: the simulator (not part of the product's pipeline): the simulated deployment's files, scripts and playbook in one place.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbisect.sim.installed import write_installed_sglang
from envbisect.sim.ports import free_ports

SERVICES = ("prefill", "decode", "router")
RESTART_ORDER = ("prefill", "decode", "router")
SIM_DIR = Path(__file__).resolve().parent
TOKENIZER_DIR = SIM_DIR / "tokenizer"
BACKUP_DATE = "2025-01-15"
FAKE_HF_TOKEN = "hf_SimFakeTokenDoNotUse0123456789abcdEF"
FAKE_CLUSTER_PASS = "s1m-cluster-pass-42"

DEFAULT_RULES: dict[str, Any] = {
    "rules": [
        {"service": "decode", "when": {"SGLANG_SM120_MMA_TARGET_CTAS": "256"}, "fault": "hang"},
        {"service": "prefill", "when": {"SGLANG_ENABLE_TRANSFER_COALESCE": "1", "MC_FORCE_TCP": "1"},
         "fault": "5xx"},
    ],
    "kv_layout_vars": ["SGLANG_KV_PAGE_SIZE", "SGLANG_KV_CACHE_DTYPE"],
    "typed": {"SGLANG_KV_PAGE_SIZE": {"type": "int", "default": "1"}},
}

# The deployed repo's feature flags (src/configs/feature_flags.yaml, committed). A worker reads the
# file at start when a rule names it (SimDeployment.flag_rule): `enable_overlap_schedule: true` set
# by an edit in place is a hotfix on the box.
FEATURE_FLAGS = ("# feature flags of the deployed serving code (read at start)\n"
                 "enable_overlap_schedule: false\n"
                 "enable_mixed_chunk: false\n"
                 "disaggregation_decode_polling: 1\n")

# A decode that ignores SIGTERM (worker fault "ignore_sigterm"): append it to a scenario's rules; a
# stop that only sends TERM then leaves the old process serving (bin/stop sends KILL after 5 s).
IGNORE_SIGTERM_RULE: dict[str, Any] = {"service": "decode", "fault": "ignore_sigterm"}

# Speed knobs (issue 11): with a per-token time, decode's tokens/s follows these values. Part of
# each request is not decode (router, prefill, the KV hand-off), so the factors are calibrated on
# what the throughput probe measures on 2 cores (5 samples each: factor 1.0 647 tok/s, 0.887 706,
# 0.75 805, 1.3 542, 1.6 485): the incident's CTAS=512 knob buys about +13% tokens/s (0.82), a
# CUDA-graph batch cap of 8 costs about 25% (1.6: enough that with the +13% knob beside it the
# current configuration is still clearly slower on a loaded machine, where the part of a request
# that is not decode grows); the scheduler-interval knob does nothing.
PERF_RULES: dict[str, Any] = {
    "token_s": 0.008,
    "jitter": 0.03,
    "rules": [
        {"service": "decode", "when": {"SGLANG_SM120_MMA_TARGET_CTAS": "512"}, "fault": "speed", "factor": 0.82},
        {"service": "decode", "when": {"SGLANG_CUDA_GRAPH_MAX_BS": "8"}, "fault": "speed", "factor": 1.6},
        {"service": "decode", "when": {"SGLANG_SCHEDULER_INTERVAL": "*"}, "fault": "speed", "factor": 1.0},
    ],
    "kv_layout_vars": ["SGLANG_KV_PAGE_SIZE", "SGLANG_KV_CACHE_DTYPE"],
    "typed": {"SGLANG_KV_PAGE_SIZE": {"type": "int", "default": "1"}},
}

# (name, value, comment) ; a None name is a comment/blank line
_COMMON_WORKER_ENV: list[tuple[str | None, str, str]] = [
    (None, "", "# --- GPUs / NCCL ---"),
    ("CUDA_VISIBLE_DEVICES", "0,1,2,3", ""),
    ("NCCL_IB_DISABLE", "0", ""),
    ("NCCL_SOCKET_IFNAME", "eth0", ""),
    ("NCCL_DEBUG", "WARN", ""),
    ("NCCL_IB_GID_INDEX", "3", ""),
    (None, "", ""),
    (None, "", "# --- KV cache layout: MUST match between prefill and decode ---"),
    ("SGLANG_KV_PAGE_SIZE", "64", ""),
    ("SGLANG_KV_CACHE_DTYPE", "fp8_e4m3", ""),
    (None, "", ""),
    (None, "", "# --- kernels ---"),
    ("SGLANG_SM120_MMA_TARGET_CTAS", "128", ""),
    ("SGLANG_ENABLE_JIT_DEEPGEMM", "0", ""),
    ("SGLANG_ENABLE_TRANSFER_COALESCE", "0", ""),
    (None, "", ""),
    (None, "", "# --- Mooncake transfer engine ---"),
    ("MC_TE_METRIC", "1", ""),
    ("MC_FORCE_TCP", "0", ""),
    (None, "", ""),
    (None, "", "# --- model download ---"),
    ("HF_HUB_OFFLINE", "1", ""),
    ("HF_TOKEN", FAKE_HF_TOKEN, ""),
]

_DEFAULT_ENV_LINES: dict[str, list[tuple[str | None, str, str]]] = {
    "prefill": [
        (None, "", "# prefill.serve-env -- sourced by bin/start prefill (set -a; . FILE; set +a)"),
        (None, "", "# Edit by hand; keep a dated copy under backups/ first."),
        (None, "", ""),
        *_COMMON_WORKER_ENV,
        ("SIM_CLUSTER_PASS", FAKE_CLUSTER_PASS, ""),
        (None, "", ""),
        (None, "", "# --- disaggregation ---"),
        ("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "300", ""),
        ("SGLANG_DISAGGREGATION_THREAD_POOL_SIZE", "4", ""),
    ],
    "decode": [
        (None, "", "# decode.serve-env -- sourced by bin/start decode (set -a; . FILE; set +a)"),
        (None, "", "# Edit by hand; keep a dated copy under backups/ first."),
        (None, "", ""),
        *_COMMON_WORKER_ENV,
        (None, "", ""),
        (None, "", "# --- disaggregation ---"),
        (None, "", "# seconds a decode waits for its KV transfer before aborting (upstream default 300)"),
        ("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "30", ""),
        ("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "5", ""),
    ],
    "router": [
        (None, "", "# router.serve-env -- sourced by bin/start router (set -a; . FILE; set +a)"),
        (None, "", "# bin/start turns ROUTER_* into sglang-router flags."),
        (None, "", ""),
        ("ROUTER_POLICY", "cache_aware", ""),
        ("ROUTER_REQUEST_TIMEOUT_SECS", "10", ""),
        ("ROUTER_HEALTH_CHECK_INTERVAL_SECS", "1", ""),
        ("ROUTER_LOG_LEVEL", "info", ""),
        ("RUST_BACKTRACE", "1", ""),
    ],
}


def _fmt_value(value: str) -> str:
    if value == "" or any(c in value for c in " \t\"'$`\\!#&;|<>(){}*?[]~"):
        return shlex.quote(value)
    return value


_SERVICE_DEFAULTS = {"decode": {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}}


def render_env(service: str, overrides: dict[str, str | None] | None = None) -> str:
    """The text of SERVICE.serve-env: the defaults with *overrides* applied (None removes)."""
    overrides = dict(overrides or {})
    lines: list[str] = []
    for name, value, comment in _DEFAULT_ENV_LINES[service]:
        if name is None:
            lines.append(comment)
            continue
        value = _SERVICE_DEFAULTS.get(service, {}).get(name, value)
        if name in overrides:
            new = overrides.pop(name)
            if new is None:
                continue
            value = str(new)
        lines.append(f"export {name}={_fmt_value(value)}")
    added = [(k, v) for k, v in overrides.items() if v is not None]
    if added:
        lines.append("")
        lines.append("# --- added ---")
        lines.extend(f"export {k}={_fmt_value(str(v))}" for k, v in added)
    return "\n".join(lines) + "\n"


def set_env_var(path: Path, name: str, value: str | None) -> None:
    """Edit one variable of a serve-env file in place like an operator would (None removes it)."""
    import re

    pat = re.compile(r"^\s*(?:export\s+)?" + re.escape(name) + r"=")
    lines = path.read_text().splitlines()
    out, done = [], False
    for line in lines:
        if pat.match(line):
            if value is not None and not done:
                out.append(f"export {name}={_fmt_value(str(value))}")
            done = True
            continue
        out.append(line)
    if not done and value is not None:
        out.append(f"export {name}={_fmt_value(str(value))}")
    path.write_text("\n".join(out) + "\n")


def _router_bin() -> str:
    cand = Path(sys.executable).parent / "sglang-router"
    if cand.exists():
        return str(cand)
    found = shutil.which("sglang-router")
    if found:
        return found
    raise FileNotFoundError("sglang-router not found next to sys.executable nor on PATH; "
                            "pip install 'envbisect[sim]'")


def _q(s: str | Path) -> str:
    return shlex.quote(str(s))


def _toml_str(s: str | Path) -> str:
    return json.dumps(str(s))


@dataclass(frozen=True)
class SimDeployment:
    root: Path
    playbook: Path
    ports: dict[str, int]
    rules_path: Path
    model_dir: Path
    src_dir: Path | None
    start_script: Path
    stop_script: Path
    python: str
    router_bin: str
    has_proxy: bool = False
    services: tuple[str, ...] = SERVICES
    timeouts: dict[str, float] = field(default_factory=lambda: {"health": 30.0})

    # ---- paths / urls ------------------------------------------------------------------------
    def env_file(self, service: str) -> Path:
        return self.root / "conf" / f"{service}.serve-env"

    def log_file(self, service: str) -> Path:
        return self.root / "log" / f"{service}.log"

    def pid_file(self, service: str) -> Path:
        return self.root / "run" / f"{service}.pid"

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['router']}"

    @property
    def chat_url(self) -> str:
        return f"{self.router_url}/v1/chat/completions"

    @property
    def proxy_url(self) -> str | None:
        return f"http://127.0.0.1:{self.ports['proxy']}" if self.has_proxy else None

    def health_url(self, service: str) -> str:
        if service == "router":
            return f"{self.router_url}/readiness"
        return f"http://127.0.0.1:{self.ports[service]}/health"

    def worker_url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}"

    # ---- process control ---------------------------------------------------------------------
    def _run(self, script: Path, service: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(script), service], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)

    def start(self, service: str, *, wait: bool = True, timeout: float | None = None) -> None:
        cp = self._run(self.start_script, service)
        if cp.returncode != 0:
            raise RuntimeError(f"bin/start {service} failed ({cp.returncode}): {cp.stdout}{cp.stderr}")
        if wait:
            self.wait_ready(service, timeout=timeout)

    def stop(self, service: str) -> None:
        cp = self._run(self.stop_script, service)
        if cp.returncode != 0:
            raise RuntimeError(f"bin/stop {service} failed ({cp.returncode}): {cp.stdout}{cp.stderr}")

    def restart(self, service: str, *, wait: bool = True) -> None:
        self.stop(service)
        self.start(service, wait=wait)

    def pid(self, service: str) -> int | None:
        try:
            return int(self.pid_file(service).read_text().strip())
        except (OSError, ValueError):
            return None

    def is_running(self, service: str) -> bool:
        pid = self.pid(service)
        if pid is None:
            return False
        try:
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
            return state != "Z"
        except (OSError, IndexError):
            return False

    def log_text(self, service: str) -> str:
        try:
            return self.log_file(service).read_text(errors="replace")
        except OSError:
            return ""

    def is_healthy(self, service: str, timeout: float = 1.0) -> bool:
        if service == "proxy":
            try:
                with socket.create_connection(("127.0.0.1", self.ports["proxy"]), timeout=timeout):
                    return True
            except OSError:
                return False
        try:
            with urllib.request.urlopen(self.health_url(service), timeout=timeout) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def wait_ready(self, service: str, timeout: float | None = None) -> float:
        """Wait until *service* is healthy; returns the seconds waited.  Raises RuntimeError with
        the log tail if the process died or the timeout passed."""
        timeout = self.timeouts["health"] if timeout is None else timeout
        t0 = time.monotonic()
        while True:
            if self.is_healthy(service):
                return time.monotonic() - t0
            if not self.is_running(service):
                time.sleep(0.1)
                if not self.is_running(service):
                    tail = "\n".join(self.log_text(service).splitlines()[-15:])
                    raise RuntimeError(f"{service} is not running; log tail:\n{tail}")
            if time.monotonic() - t0 > timeout:
                tail = "\n".join(self.log_text(service).splitlines()[-15:])
                raise RuntimeError(f"{service} not healthy after {timeout}s; log tail:\n{tail}")
            time.sleep(0.05)

    def start_all(self, *, timeout: float | None = None) -> float:
        """Start prefill, decode, router (each waited for), then the client proxy if any.
        Returns the total seconds taken."""
        t0 = time.monotonic()
        for svc in RESTART_ORDER:
            self.start(svc, wait=True, timeout=timeout)
        if self.has_proxy:
            self.start_proxy()
        return time.monotonic() - t0

    def stop_all(self) -> None:
        """Stop proxy, router, decode, prefill; never raises, keeps going on errors."""
        errors = []
        for svc in (("proxy",) if self.has_proxy else ()) + tuple(reversed(RESTART_ORDER)):
            try:
                self.stop(svc)
            except Exception as exc:  # noqa: BLE001 - teardown must go on
                errors.append(f"{svc}: {exc}")
        if errors:
            print("stop_all: " + "; ".join(errors), file=sys.stderr)

    def co_restart(self) -> float:
        """The safe co-restart: stop router, decode, prefill; start them in order."""
        for svc in reversed(RESTART_ORDER):
            self.stop(svc)
        t0 = time.monotonic()
        for svc in RESTART_ORDER:
            self.start(svc, wait=True)
        return time.monotonic() - t0

    def start_proxy(self, *, wait: bool = True) -> None:
        if not self.has_proxy:
            raise RuntimeError("this deployment was built without a client proxy")
        self.start("proxy", wait=wait)

    def stop_proxy(self) -> None:
        if self.has_proxy:
            self.stop("proxy")

    # ---- configuration -----------------------------------------------------------------------
    def age_files(self, seconds: float = 3.0) -> None:
        """Date the serve-env files `seconds` back, as if written that long before the next start.
        A real operator's edit is seconds to minutes older than the restart that follows it; the
        simulated one is milliseconds older, too close to tell from a process's start time."""
        when = time.time() - seconds
        for svc in SERVICES:
            os.utime(self.env_file(svc), (when, when))

    def set_env(self, service: str, name: str, value: str | None) -> None:
        """Change (or with None remove) one variable in SERVICE.serve-env; restart to apply."""
        set_env_var(self.env_file(service), name, value)

    def set_rules(self, rules: dict) -> None:
        self.rules_path.write_text(json.dumps(rules, indent=2) + "\n")

    @property
    def flags_file(self) -> Path:
        """The deployed repo's feature flags (committed), read by a worker at start through a
        `flag_rule`: a hotfix edited there in place is part of the configuration."""
        assert self.src_dir is not None, "built with_repo=False"
        return self.src_dir / "configs" / "feature_flags.yaml"

    def flag_rule(self, flag: str, service: str = "decode", fault: str = "hang") -> dict[str, Any]:
        """A fault rule that fires when `flag: true` is in the repo's feature flags at start."""
        return {"service": service, "when_file": {"path": str(self.flags_file), "contains": f"{flag}: true"},
                "fault": fault}

    def set_flag(self, flag: str, value: str) -> None:
        """Edit one flag of configs/feature_flags.yaml in place (not committed: a hotfix on the box)."""
        lines = self.flags_file.read_text().splitlines(keepends=True)
        hit = [i for i, line in enumerate(lines) if line.split(":", 1)[0].strip() == flag]
        if not hit:
            raise ValueError(f"no flag {flag!r} in {self.flags_file}")
        lines[hit[0]] = f"{flag}: {value}\n"
        self.flags_file.write_text("".join(lines))

    def running_pids(self) -> dict[str, int]:
        return {s: p for s in self.services + (("proxy",) if self.has_proxy else ())
                if (p := self.pid(s)) is not None and self.is_running(s)}


# --------------------------------------------------------------------------------------------
# build
# --------------------------------------------------------------------------------------------

def _start_check(mode: str) -> str:
    """What bin/start does after launching the engine. "detached": nothing, it returns at once and
    an engine that dies at start is noticed by its health check. "checked": as a wrapper script,
    `docker compose up --wait` or `systemctl start` of a Type=notify unit do, it waits until the
    engine listens (or SIM_START_CHECK_SECONDS pass with it alive) and exits 1 when the engine died."""
    if mode == "detached":
        return ""
    if mode != "checked":
        raise ValueError(f"unknown start mode {mode!r} (detached|checked)")
    return """  end=$((SECONDS + ${SIM_START_CHECK_SECONDS:-5}))
  while [ "$SECONDS" -lt "$end" ]; do
    if ! alive "$pid"; then
      echo "$svc: engine exited during start (pid $pid); last log line: $(tail -n 1 "$logf")" >&2
      exit 1
    fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
    sleep 0.1
  done
"""


def _start_script(root: Path, ports: dict[str, int], python: str, router_cmd: list[str],
                  load_seconds: float, proxy_hang_after: int | None, has_proxy: bool,
                  start_mode: str = "detached") -> str:
    P, B, D, R, M = (ports[k] for k in ("prefill", "prefill_bootstrap", "decode", "router", "router_metrics"))
    check = _start_check(start_mode)
    router_cmd = " ".join(_q(w) for w in router_cmd)
    worker = SIM_DIR / "worker.py"
    proxy = SIM_DIR / "proxy.py"
    proxy_case = ""
    proxy_port_case = ""
    if has_proxy:
        X = ports["proxy"]
        hang = f" --hang-after-reused {int(proxy_hang_after)}" if proxy_hang_after is not None else ""
        proxy_port_case = f"  proxy) port={X} ;;\n"
        proxy_case = (f'    proxy)\n      set -- "$PY" {_q(proxy)} --listen-port {X} '
                      f'--upstream http://127.0.0.1:{R}{hang} ;;\n')
    return f"""#!/usr/bin/env bash
# Start one service of the simulated SGLang PD deployment, detached.
# usage: start prefill|decode|router{'|proxy' if has_proxy else ''} [SERVER FLAGS of prefill or decode]
# Idempotent: a service whose pid file names a live process is left alone.
ROOT={_q(root)}
PY={_q(python)}
ROUTER_CMD=({router_cmd})  # the real router: the package's CLI, or its Rust core through router_launch.py

svc="${{1:-}}"
shift 2>/dev/null || true
passed=("$@")  # server flags after the service name: a start script that holds its command line
case "$svc" in
  prefill) port={P} ;;
  decode) port={D} ;;
  router) port={R} ;;
{proxy_port_case}  *) echo "usage: $0 prefill|decode|router{'|proxy' if has_proxy else ''}" >&2; exit 2 ;;
esac
mkdir -p "$ROOT/run" "$ROOT/log"
pidf="$ROOT/run/$svc.pid"
logf="$ROOT/log/$svc.log"
envf="$ROOT/conf/$svc.serve-env"

alive() {{
  [ -r "/proc/$1/stat" ] || return 1
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
  [ -n "$st" ] && [ "$st" != Z ]
}}

if [ -s "$pidf" ]; then
  old=$(cat "$pidf")
  if alive "$old"; then
    echo "$svc already running (pid $old)"
    exit 0
  fi
  rm -f "$pidf"
fi

(
  # a clean environment, as under systemd: the process sees the serve-env file plus the few
  # variables set below, not whatever the caller (ssh session, test runner) had exported
  for v in $(compgen -e); do
    case "$v" in
      PATH|HOME|USER|LOGNAME|LANG|LC_ALL|LC_CTYPE|TZ|TMPDIR|SHELL) ;;
      *) unset "$v" 2>/dev/null ;;
    esac
  done
  if [ "$svc" != proxy ]; then
    if [ ! -r "$envf" ]; then echo "missing env file $envf" >&2; exit 1; fi
    set -a
    . "$envf" || {{ echo "error sourcing $envf" >&2; exit 1; }}
    set +a
  fi
  export ENVBISECT_SIM_RULES="$ROOT/rules.json"
  export ENVBISECT_SIM_SERVICE="$svc"
  # the installed sglang the workers' python would import; SGLANG_SITE (from the env file) picks another
  # installed side by side, as a venv per release does ([engine] switch in a playbook)
  export PYTHONPATH="${{SGLANG_SITE:-$ROOT/site-packages}}"
  export SIM_LOAD_SECONDS="${{SIM_LOAD_SECONDS:-{load_seconds}}}"
  case "$svc" in
    prefill)
      set -- "$PY" {_q(worker)} --role prefill --host 127.0.0.1 --port {P} --bootstrap-port {B} --model-path "$ROOT/model" ;;
    decode)
      set -- "$PY" {_q(worker)} --role decode --host 127.0.0.1 --port {D} --prefill-bootstrap http://127.0.0.1:{B} --model-path "$ROOT/model" ;;
  esac
  case "$svc" in
    prefill|decode)
      # the engine's extra server flags, word-split as a start script's `... $SGLANG_EXTRA_ARGS` is
      if [ -n "${{SGLANG_EXTRA_ARGS:-}}" ]; then set -f; set -- "$@" $SGLANG_EXTRA_ARGS; set +f; fi
      if [ "${{#passed[@]}}" -gt 0 ]; then set -- "$@" "${{passed[@]}}"; fi ;;
    router)
      set -- "${{ROUTER_CMD[@]}}" launch --pd-disaggregation \\
        --prefill http://127.0.0.1:{P} {B} --decode http://127.0.0.1:{D} \\
        --host 127.0.0.1 --port {R} --prometheus-host 127.0.0.1 --prometheus-port {M} \\
        --worker-startup-check-interval 1 \\
        --health-check-interval-secs "${{ROUTER_HEALTH_CHECK_INTERVAL_SECS:-1}}" \\
        --request-timeout-secs "${{ROUTER_REQUEST_TIMEOUT_SECS:-10}}" \\
        --shutdown-grace-period-secs 2 \\
        --log-level "${{ROUTER_LOG_LEVEL:-info}}"
      if [ -n "${{ROUTER_POLICY:-}}" ]; then set -- "$@" --policy "$ROUTER_POLICY"; fi
      if [ -n "${{ROUTER_PREFILL_POLICY:-}}" ]; then set -- "$@" --prefill-policy "$ROUTER_PREFILL_POLICY"; fi
      if [ -n "${{ROUTER_DECODE_POLICY:-}}" ]; then set -- "$@" --decode-policy "$ROUTER_DECODE_POLICY"; fi
      if [ -n "${{ROUTER_EXTRA_ARGS:-}}" ]; then set -- "$@" $ROUTER_EXTRA_ARGS; fi
      ;;
{proxy_case}  esac
  echo "=== $(date '+%Y-%m-%d %H:%M:%S') bin/start $svc: $* ===" >> "$logf"
  cd "$ROOT" || exit 1
  setsid nohup "$@" >> "$logf" 2>&1 < /dev/null &
  pid=$!
  echo $pid > "$pidf"
{check}  echo "started $svc (pid $pid)"
)
"""


def _stop_script(root: Path, ports: dict[str, int], has_proxy: bool) -> str:
    P, D, R = ports["prefill"], ports["decode"], ports["router"]
    proxy_case = f"  proxy) marker='--listen-port {ports['proxy']}' ;;\n" if has_proxy else ""
    return f"""#!/usr/bin/env bash
# Stop one service of the simulated SGLang PD deployment: TERM, wait up to 5 s, then KILL.
# usage: stop prefill|decode|router{'|proxy' if has_proxy else ''}     (idempotent)
ROOT={_q(root)}
svc="${{1:-}}"
case "$svc" in
  prefill) marker='--port {P}' ;;
  decode) marker='--port {D}' ;;
  router) marker='--port {R}' ;;
{proxy_case}  *) echo "usage: $0 prefill|decode|router{'|proxy' if has_proxy else ''}" >&2; exit 2 ;;
esac
pidf="$ROOT/run/$svc.pid"

alive() {{
  [ -r "/proc/$1/stat" ] || return 1
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
  [ -n "$st" ] && [ "$st" != Z ]
}}

if [ ! -s "$pidf" ]; then
  echo "$svc not running (no pid file)"
  exit 0
fi
pid=$(cat "$pidf")
if ! alive "$pid"; then
  echo "$svc not running (stale pid $pid)"
  rm -f "$pidf"
  exit 0
fi
# the router rewrites its process title to "sglang::router" (and blanks /proc/PID/environ)
cmd=$(tr '\\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null)
case "$cmd" in
  *"$marker"*|*sglang::router*) ;;
  *) echo "pid $pid is not $svc ($cmd); removing stale pid file"; rm -f "$pidf"; exit 0 ;;
esac
kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
i=0
while alive "$pid" && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
if alive "$pid"; then
  echo "$svc (pid $pid) did not stop after TERM; sending KILL"
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
  i=0
  while alive "$pid" && [ $i -lt 20 ]; do sleep 0.1; i=$((i+1)); done
fi
rm -f "$pidf"
echo "stopped $svc (pid $pid)"
"""


def _playbook(root: Path, ssh: str, ports: dict[str, int], python: str, with_repo: bool,
              has_proxy: bool, backups: bool) -> str:
    body = ('{"model": "default", "messages": [{"role": "user", "content": "Say hi"}], '
            '"max_tokens": 8}')
    perf_body = ('{"model": "default", "messages": [{"role": "user", "content": "Write a haiku."}], '
                 '"max_tokens": 32}')
    chat = f"http://127.0.0.1:{ports['router']}/v1/chat/completions"
    out = [
        "# Playbook of the simulated SGLang PD deployment (envbisect.sim.stack.build).",
        "[deployment]",
        'name = "sim-pd"',
        "",
        "[hosts.node1]",
        f"ssh = {_toml_str(ssh)}",
        f"python = {_toml_str(python)}",
        "",
    ]
    for svc in SERVICES:
        if svc == "router":
            health = f"http://127.0.0.1:{ports['router']}/readiness"
            metrics = f"http://127.0.0.1:{ports['router_metrics']}/metrics"
        else:
            health = f"http://127.0.0.1:{ports[svc]}/health"
            metrics = f"http://127.0.0.1:{ports[svc]}/metrics"
        out += [
            f"[services.{svc}]",
            'host = "node1"',
            f"env_file = {_toml_str(root / 'conf' / f'{svc}.serve-env')}",
            f"start = {_toml_str(f'{root}/bin/start {svc}')}",
            f"stop = {_toml_str(f'{root}/bin/stop {svc}')}",
            f"health = {_toml_str(health)}",
            f"pid_file = {_toml_str(root / 'run' / f'{svc}.pid')}",
            f"log = {_toml_str(root / 'log' / f'{svc}.log')}",
            f"metrics = {_toml_str(metrics)}",
            "",
        ]
    out += [
        "[restart]",
        'order = ["prefill", "decode", "router"]',
        "health_timeout_s = 30",
        "poll_interval_s = 0.2",
        "",
    ]
    if with_repo:
        out += ["[[repos]]", 'host = "node1"', f"path = {_toml_str(root / 'src')}", ""]
    out += ["[watch]", f"paths = [{_toml_str(root / 'conf' / 'extra')}]", "max_file_size = 1048576", ""]
    if backups:
        out += ["[baseline]",
                f'backups = ["{{path}}.bak", {_toml_str(str(root / "backups") + "/*/{name}")}]', ""]
    out += ["[secrets]", 'names = ["SIM_CLUSTER_PASS"]', "values = []", ""]
    client_url = f"http://127.0.0.1:{ports['proxy']}/v1/chat/completions" if has_proxy else ""
    if has_proxy:
        out += ["[client]", f"url = {_toml_str(client_url)}", ""]
    out += [
        "[probes.e2e]",
        'kind = "http"',
        'vantage = "node1"',
        f"url = {_toml_str(chat)}",
        'method = "POST"',
        f"body = '{body}'",
        "expect_status = 200",
        'expect_body = "choices"',
        "timeout_s = 5",
        "latency_budget_s = 3",
        "repeat = 3",
        "",
        "[probes.multi_round]",
        'kind = "multi_round"',
        'vantage = "node1"',
        f"url = {_toml_str(chat)}",
        'method = "POST"',
        f"body = '{body}'",
        "expect_status = 200",
        'expect_body = "choices"',
        "rounds = 6",
        "timeout_s = 5",
        "",
        "[probes.throughput]",
        'kind = "perf"',
        'vantage = "node1"',
        f"url = {_toml_str(chat)}",
        'method = "POST"',
        f"body = '{perf_body}'",
        "requests = 32",
        "concurrency = 8",
        'metric = "output_tokens_per_s"',
        # the simulated workers start reproducibly (5 samples after each of two restarts of one
        # configuration: medians 646.9 and 646.6 tok/s; a real stack's starts vary more, default 2%),
        # so a tighter allowance than the default 5% is measurable here
        'regression = "3%"',
        "samples = 3",
        'start_noise = "1%"',
        "timeout_s = 5",
        "",
        "[probes.burst]",
        'kind = "concurrent"',
        'vantage = "node1"',
        f"url = {_toml_str(chat)}",
        'method = "POST"',
        f"body = '{body}'",
        "expect_status = 200",
        'expect_body = "choices"',
        "concurrency = 16",
        "timeout_s = 5",
        "",
    ]
    if has_proxy:
        out += [
            "[probes.client]",
            'kind = "multi_round"',
            'vantage = "local"',
            f"url = {_toml_str(client_url)}",
            'method = "POST"',
            f"body = '{body}'",
            "expect_status = 200",
            'expect_body = "choices"',
            "rounds = 6",
            "timeout_s = 5",
            "",
        ]
    return "\n".join(out)


def _git(src: Path, *args: str) -> None:
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_AUTHOR_NAME="sim", GIT_AUTHOR_EMAIL="sim@example.invalid",
               GIT_COMMITTER_NAME="sim", GIT_COMMITTER_EMAIL="sim@example.invalid",
               GIT_AUTHOR_DATE="2025-01-15T12:00:00+00:00", GIT_COMMITTER_DATE="2025-01-15T12:00:00+00:00")
    subprocess.run(["git", "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false",
                    "-c", "core.hooksPath=/dev/null", *args], cwd=src, env=env, check=True,
                   capture_output=True, timeout=30)


def build(root: Path, *, ssh: str = "local", env: dict[str, dict[str, str]] | None = None,
          rules: dict | None = None, with_repo: bool = True, with_proxy_hang_after: int | None = None,
          load_seconds: float = 0.1, with_proxy: bool | None = None, backups: bool = True,
          router_cli: bool | None = None, start_mode: str = "detached") -> SimDeployment:
    """Write a simulated PD deployment under *root* and return its handle (nothing is started).

    env: per-service overrides/additions to the default serve-env files ({"decode": {"X": "1"}};
         a None value removes the variable).
    rules: the fault rules (see envbisect.sim.worker.load_rules); default DEFAULT_RULES, whose
         rules only fire on non-default values.
    with_proxy_hang_after: add the client-side proxy (not a restarted service) whose reused
         connections hang after that many requests; with_proxy=True adds a proxy that never hangs.
    backups: write backups/<date>/SERVICE.serve-env copies of the DEFAULT env files (before
         *env* overrides) and name them in [baseline].
    router_cli: start the router with the package's `sglang-router` command (default: SIM_ROUTER_CLI=1
         in the environment) rather than its Rust core through sim/router_launch.py, which skips
         the CLI's 0.6 s import of its Python debugging balancer.
    start_mode: "detached" (bin/start returns at once, exit 0) or "checked" (bin/start exits 1
         when the engine dies at start, as many real start commands do; see _start_check).
    """
    root = Path(root).resolve()
    env = env or {}
    unknown = set(env) - set(SERVICES)
    if unknown:
        raise ValueError(f"unknown services in env: {sorted(unknown)}")
    has_proxy = with_proxy if with_proxy is not None else with_proxy_hang_after is not None
    python = sys.executable
    router_bin = _router_bin()
    if router_cli is None:
        router_cli = os.environ.get("SIM_ROUTER_CLI", "") not in ("", "0")
    router_cmd = [router_bin] if router_cli else [python, str(SIM_DIR / "router_launch.py")]
    for d in ("conf", "conf/extra", "bin", "log", "run", "model"):
        (root / d).mkdir(parents=True, exist_ok=True)

    names = ["prefill", "prefill_bootstrap", "decode", "router", "router_metrics"] + (["proxy"] if has_proxy else [])
    ports = dict(zip(names, free_ports(len(names))))

    for svc in SERVICES:
        (root / "conf" / f"{svc}.serve-env").write_text(render_env(svc, env.get(svc)))
    if backups:
        bdir = root / "backups" / BACKUP_DATE
        bdir.mkdir(parents=True, exist_ok=True)
        for svc in SERVICES:
            (bdir / f"{svc}.serve-env").write_text(render_env(svc))
    (root / "conf" / "extra" / "sampling_defaults.json").write_text(
        json.dumps({"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 2048}, indent=2) + "\n")
    (root / "conf" / "extra" / "deploy-notes.txt").write_text(
        "prefill on node1 GPUs 0-3, decode on node1 GPUs 4-7 (simulated)\n"
        "co-restart order: prefill -> decode -> router\n")

    for f in TOKENIZER_DIR.iterdir():
        if f.is_file():
            shutil.copy2(f, root / "model" / f.name)

    rules_path = root / "rules.json"
    rules_path.write_text(json.dumps(rules if rules is not None else DEFAULT_RULES, indent=2) + "\n")

    src_dir: Path | None = None
    if with_repo:
        src_dir = root / "src"
        src_dir.mkdir(exist_ok=True)
        (src_dir / "VERSION").write_text("v1.0.0\n")
        (src_dir / "README.md").write_text("Simulated serving code deployed on node1.\n")
        (src_dir / "configs").mkdir(exist_ok=True)
        (src_dir / "configs" / "feature_flags.yaml").write_text(FEATURE_FLAGS)
        if not (src_dir / ".git").exists():
            _git(src_dir, "init", "-q")
            _git(src_dir, "add", "VERSION", "README.md", "configs/feature_flags.yaml")
            _git(src_dir, "commit", "-q", "-m", "release v1.0.0")

    write_installed_sglang(root)

    start = root / "bin" / "start"
    stop = root / "bin" / "stop"
    start.write_text(_start_script(root, ports, python, router_cmd, load_seconds,
                                   with_proxy_hang_after, has_proxy, start_mode))
    stop.write_text(_stop_script(root, ports, has_proxy))
    start.chmod(0o755)
    stop.chmod(0o755)

    playbook = root / "envbisect.toml"
    playbook.write_text(_playbook(root, ssh, ports, python, with_repo, has_proxy, backups))

    return SimDeployment(root=root, playbook=playbook, ports=ports, rules_path=rules_path,
                         model_dir=root / "model", src_dir=src_dir, start_script=start,
                         stop_script=stop, python=python, router_bin=router_bin, has_proxy=has_proxy)
