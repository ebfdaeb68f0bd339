"""Simulated SGLang prefill/decode worker for envbisect's simulated PD deployment.

Run as ``python -m envbisect.sim.worker --role prefill|decode --port P ...`` (or by file path:
the module only uses the standard library and imports nothing from envbisect).

It answers what the real ``sglang-router`` asks of a worker (``/health``, ``/server_info``,
``/model_info``, ``/v1/models`` ...) and serves ``POST /v1/chat/completions``,
``/v1/completions`` and ``/generate``.  Prefill/decode transfer is simulated: the prefill side runs
a bootstrap HTTP server; for each request it stores the "KV" of ``bootstrap_room`` with its layout
fingerprint and instance id, and decode fetches it from ``bootstrap_host:bootstrap_port``.

Faults are decided once at start from this process's environment and the JSON rules file named by
``ENVBISECT_SIM_RULES`` (see :func:`load_rules`).  Every request and fault decision is logged to
stdout, which the start script sends to the service log.

Long on purpose: the simulator (not part of the product's pipeline): one self-contained worker script, run as its own process.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import math
import os
import random
import re
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAULT_KINDS = ("hang", "5xx", "slow", "fail_after_reused", "intermittent", "crash", "speed", "ignore_sigterm",
               "wrong")
# the buckets SGLang's collector gives these histograms (sglang/srt/metrics/collector.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                15.0, 20.0, 25.0, 30.0)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
GEN_THROUGHPUT_WINDOW_S = 5.0  # sglang:gen_throughput: tokens/s of the recent decode batches
DEFAULT_KV_LAYOUT_VARS = ("SGLANG_KV_PAGE_SIZE", "SGLANG_KV_CACHE_DTYPE")
SIM_VERSION = "0.5.4-sim"

_log_lock = threading.Lock()


def log(msg: str) -> None:
    ts = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    ms = int((time.time() % 1) * 1000)
    with _log_lock:
        sys.stdout.write(f"[{ts}.{ms:03d}] {msg}\n")
        sys.stdout.flush()


# --------------------------------------------------------------------------------------------
# Rules and faults
# --------------------------------------------------------------------------------------------

def load_rules(path: str | None) -> dict[str, Any]:
    """Load the rules file.  Format::

        {"rules": [
            {"service": "decode", "when": {"SGLANG_X": "256"}, "fault": "hang"},
            {"service": "prefill", "when": {"A": "1", "B": "1"}, "fault": "5xx"},
            {"service": ["prefill", "decode"], "when": {"C": "*"}, "fault": "slow", "delay_s": 2},
            {"service": "decode", "when_file": {"path": "/abs/VERSION", "contains": "v2-bad"},
             "fault": "crash"}],
         "kv_layout_vars": ["SGLANG_KV_PAGE_SIZE", "SGLANG_KV_CACHE_DTYPE"],
         "typed": {"SGLANG_KV_PAGE_SIZE": {"type": "int", "default": "1"}},
         "aliases": {"SGL_KV_PAGE_SIZE": "SGLANG_KV_PAGE_SIZE"}}

    A ``"speed"`` rule (``"factor": 1.2`` = 20% more time per token; 0.88 = 12% faster) scales the
    simulated per-token time, ``"token_s"`` in the rules file (default 0: no timing, short replies);
    with a per-token time, decode answers ``max_tokens`` tokens and takes ``max_tokens * token_s *
    factor`` (with ``"jitter"``, default 2%, of multiplicative noise per request), so a throughput
    probe sees tokens/s move with the configuration, and every matching rule's factor multiplies.

    A ``"wrong"`` rule (``"rate": 0.4``, optional ``"seed"``) makes decode answer that share of the
    prompts it can answer (arithmetic, see `solve`) wrongly but well-formed (HTTP 200); several
    wrong rules combine as independent chances.

    ``when`` matches when every listed variable has that value ("*" = set to anything,
    null = unset). ``when_flag`` matches the server flags on the worker's command line the same way
    (``{"--attention-backend": "triton"}``; a switch's value is "", a flag's several values are
    joined by one blank, the last occurrence of a repeated flag wins): the start script passes
    ``$SGLANG_EXTRA_ARGS`` there, word-split, as a real start script does.  ``when_peer`` (decode
    only) matches the same way against the prefill it handshakes with at start: a start-time fault
    of a pair split across the two, e.g. decode exits when prefill sets ``SGLANG_ENABLE_X=1`` and
    decode lacks ``SGLANG_X_PATH``::

        {"service": "decode", "when": {"SGLANG_X_PATH": null}, "when_peer": {"SGLANG_ENABLE_X": "1"},
         "fault": "crash", "message": "prefill enables X; decode has no SGLANG_X_PATH"}

    ``when_file`` (one object or a list) matches when the file exists and contains the string
    (``"contains": null`` = just exists; ``"exists": false`` = absent).
    ``file_key`` (one object or a list) matches when a structured file (YAML, JSON or TOML, by its
    extension) parses and the value at a key path equals ``"value"``
    (``{"path": "/abs/flags.yaml", "key": "decode.overlap", "value": true}``; ``"a.b[2]"`` indexes a
    list), as a server reading its ``--config`` YAML would; the file's bytes are logged at start.
    Fault parameters sit either on the rule or in ``"params"``.

    An ``"ignore_sigterm"`` rule makes the worker ignore SIGTERM (a service stuck releasing GPU
    memory, or one that never installed a handler): a stop that only sends TERM (``kill $(cat
    PIDFILE)``) leaves it running and answering; only SIGKILL ends it.
    """
    if not path:
        return {"rules": [], "kv_layout_vars": list(DEFAULT_KV_LAYOUT_VARS)}
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    data.setdefault("rules", [])
    data.setdefault("kv_layout_vars", list(DEFAULT_KV_LAYOUT_VARS))
    return data


def effective_env(environ: dict[str, str], rules: dict[str, Any]) -> dict[str, str]:
    """The environment as the simulated server reads it: deprecated aliases resolved and typed
    variables with invalid values replaced by their default (with a warning), like SGLang's
    typed registry does."""
    env = dict(environ)
    for old, new in (rules.get("aliases") or {}).items():
        if old in env and new not in env:
            log(f"WARNING: environment variable {old} is deprecated, please use {new}")
            env[new] = env[old]
    for name, spec in (rules.get("typed") or {}).items():
        if name not in env:
            continue
        kind = spec.get("type", "str")
        raw = env[name]
        ok = True
        try:
            if kind == "int":
                int(raw)
            elif kind == "float":
                float(raw)
            elif kind == "bool":
                ok = raw.strip().lower() in ("1", "0", "true", "false", "yes", "no", "on", "off")
            elif kind == "choice":
                ok = raw in spec.get("choices", [])
        except ValueError:
            ok = False
        if not ok:
            default = spec.get("default")
            log(f"WARNING: invalid value {raw!r} for {name} (expected {kind}); "
                f"using default {default!r}")
            if default is None:
                env.pop(name, None)
            else:
                env[name] = str(default)
    return env


def _file_cond_matches(cond: dict[str, Any]) -> bool:
    path = cond.get("path", "")
    exists = os.path.exists(path)
    if cond.get("exists") is False:
        return not exists
    if not exists:
        return False
    needle = cond.get("contains")
    if needle is None:
        return True
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return needle in fh.read()
    except OSError:
        return False


_MISSING = object()


def read_file_key(path: str, key: str) -> Any:
    """The value at key path `key` ("a.b[2]") of a YAML, JSON or TOML file, or _MISSING. YAML is
    read with ruamel.yaml (envbisect's own dependency, in the interpreter that runs the worker)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return _MISSING
    log(f"config file {path} read at start: {json.dumps(data.decode('utf-8', 'replace'))}")
    try:
        if path.endswith(".json"):
            doc = json.loads(data)
        elif path.endswith(".toml"):
            import tomllib

            doc = tomllib.loads(data.decode("utf-8"))
        else:
            from ruamel.yaml import YAML

            doc = YAML(typ="safe").load(data.decode("utf-8"))
    except Exception as exc:  # noqa: BLE001 - a config the server cannot read is logged, not a crash here
        log(f"WARNING: cannot parse {path}: {exc}")
        return _MISSING
    for part in re.findall(r"\[(\d+)\]|([^.\[\]]+)", key):
        index, name = part
        try:
            doc = doc[int(index)] if index else doc[name]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return doc


def server_flags(words: list[str]) -> dict[str, str]:
    """The flags among a command line's extra words, by shape: ``--k=v``, ``--k v1 v2`` (every word
    up to the next flag), ``--switch`` (value "")."""
    out: dict[str, str] = {}
    name = None
    for w in words:
        if w.startswith("-") and w not in ("-", "--") and not re.fullmatch(r"-[\d.]+", w):
            name, _, inline = w.partition("=")
            out[name] = inline
        elif name is not None:
            out[name] = f"{out[name]} {w}".strip()
    return out


def _matches(want: dict[str, Any], have_all: dict[str, str]) -> bool:
    for name, want_v in want.items():
        have = have_all.get(name)
        if want_v is None:
            if have is not None:
                return False
        elif want_v == "*":
            if have is None:
                return False
        elif have != str(want_v):
            return False
    return True


def peer_vars(rules: dict[str, Any]) -> list[str]:
    """The variables a prefill tells its decode at the handshake (every rule's ``when_peer``)."""
    return sorted({k for r in rules.get("rules", []) for k in (r.get("when_peer") or {})})


def rule_matches(rule: dict[str, Any], service: str, env: dict[str, str],
                 flags: dict[str, str] | None = None, peer: dict[str, str] | None = None) -> bool:
    svc = rule.get("service", "*")
    services = [svc] if isinstance(svc, str) else list(svc)
    if "*" not in services and service not in services:
        return False
    if not _matches(rule.get("when_flag") or {}, flags or {}):
        return False
    if rule.get("when_peer") and (peer is None or not _matches(rule["when_peer"], peer)):
        return False
    for name, want in (rule.get("when") or {}).items():
        have = env.get(name)
        if want is None:
            if have is not None:
                return False
        elif want == "*":
            if have is None:
                return False
        elif have != str(want):
            return False
    conds = rule.get("when_file")
    if conds:
        if isinstance(conds, dict):
            conds = [conds]
        if not all(_file_cond_matches(c) for c in conds):
            return False
    keys = rule.get("file_key")
    if keys:
        for c in [keys] if isinstance(keys, dict) else keys:
            if read_file_key(c.get("path", ""), c.get("key", "")) != c.get("value"):
                return False
    return True


def active_faults(rules: dict[str, Any], service: str, env: dict[str, str],
                  flags: dict[str, str] | None = None,
                  peer: dict[str, str] | None = None) -> list[dict[str, Any]]:
    out = []
    for i, rule in enumerate(rules.get("rules", [])):
        if not rule_matches(rule, service, env, flags, peer):
            continue
        kind = rule.get("fault")
        if kind not in FAULT_KINDS:
            log(f"WARNING: rule #{i} has unknown fault {kind!r}; ignored")
            continue
        params = {k: v for k, v in rule.items()
                  if k not in ("service", "when", "when_flag", "when_peer", "when_file", "file_key", "fault",
                               "params")}
        params.update(rule.get("params") or {})
        out.append({"index": i, "fault": kind, "params": params, "rule": rule})
    return out


def layout_fingerprint(env: dict[str, str], layout_vars: list[str]) -> str:
    parts = [f"{name}={env.get(name, '<unset>')}" for name in sorted(layout_vars)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


# --------------------------------------------------------------------------------------------
# State
# --------------------------------------------------------------------------------------------

class Sim:
    def __init__(self, args: argparse.Namespace):
        self.role: str = args.role
        self.service: str = os.environ.get("ENVBISECT_SIM_SERVICE") or args.role
        self.port: int = args.port
        self.host: str = args.host
        self.bootstrap_port: int | None = args.bootstrap_port
        self.prefill_bootstrap: str | None = args.prefill_bootstrap
        self.model_path: str = os.path.abspath(args.model_path)
        self.served_model_name: str = args.served_model_name or self.model_path
        self.shutdown = threading.Event()
        self.loaded = threading.Event()
        self.started_at = time.time()
        self.instance_id = uuid.uuid4().hex[:12]
        self.rules_path = os.environ.get("ENVBISECT_SIM_RULES")
        self.rules = load_rules(self.rules_path)
        self.env = effective_env(dict(os.environ), self.rules)
        self.layout_vars = list(self.rules.get("kv_layout_vars") or DEFAULT_KV_LAYOUT_VARS)
        self.fingerprint = layout_fingerprint(self.env, self.layout_vars)
        self.flags = server_flags(list(getattr(args, "extra", []) or []))
        self.faults = active_faults(self.rules, self.service, self.env, self.flags)
        self.waiting_timeout = float(self.env.get("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "30") or 30)
        self.load_seconds = float(os.environ.get("SIM_LOAD_SECONDS", "0.3") or 0.3)
        self.rng: random.Random | None = None
        for f in self.faults:
            if f["fault"] == "intermittent":
                self.rng = random.Random(f["params"].get("seed", 0))
        self.rng_lock = threading.Lock()
        # per-token time (speed knobs): decode sleeps max_tokens * token_s * speed per request
        self.token_s = float(self.rules.get("token_s", 0) or 0)
        self.speed = 1.0
        for f in self.faults:
            if f["fault"] == "speed":
                self.speed *= float(f["params"].get("factor", 1.0))
        self.jitter = float(self.rules.get("jitter", 0.02))
        wrong = [f for f in self.faults if f["fault"] == "wrong"]
        self.wrong_rate = 1.0 - math.prod(1.0 - float(f["params"].get("rate", 0.5)) for f in wrong)
        self.wrong_rng = random.Random(wrong[0]["params"].get("seed")) if wrong else random.Random()
        self.hist = {"ttft": Histogram(TTFT_BUCKETS), "e2e": Histogram(E2E_BUCKETS)}
        self.recent_tokens: list[tuple[float, int]] = []  # (time, tokens) of the recent answers
        self.speed_rng = random.Random()
        # prefill: room -> kv record
        self.kv: dict[str, dict[str, Any]] = {}
        self.kv_lock = threading.Lock()
        # decode: instance id of the prefill it handshook with at start
        self.peer_instance: str | None = None
        self.peer_lock = threading.Lock()
        self.counters = {"requests": 0, "generate_requests": 0, "errors": 0, "hung": 0,
                         "kv_transfer_timeouts": 0, "kv_transfers": 0, "prompt_tokens": 0, "generation_tokens": 0}
        self.running = 0
        self.counter_lock = threading.Lock()

    def count(self, name: str, n: int = 1) -> None:
        with self.counter_lock:
            self.counters[name] = self.counters.get(name, 0) + n

    def fault(self, kind: str, prompt: str | None = None) -> dict[str, Any] | None:
        """The active fault of `kind`. A rule with `prompt_contains` fires only on requests whose
        prompt holds that text (a fault one probe sees and another does not)."""
        for f in self.faults:
            if f["fault"] != kind:
                continue
            needle = f["params"].get("prompt_contains")
            if needle is not None and (prompt is None or str(needle) not in prompt):
                continue
            return f
        return None

    def wait_forever(self) -> None:
        self.shutdown.wait()

    def server_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "served_model_name": self.served_model_name,
            "host": self.host,
            "port": self.port,
            "disaggregation_mode": self.role,
            "disaggregation_transfer_backend": "sim",
            "disaggregation_bootstrap_port": self.bootstrap_port or 8998,
            "page_size": self.env.get("SGLANG_KV_PAGE_SIZE"),
            "kv_cache_dtype": self.env.get("SGLANG_KV_CACHE_DTYPE", "auto"),
            "tp_size": 1,
            "dp_size": 1,
            "version": SIM_VERSION,
            "sim": {
                "service": self.service,
                "instance_id": self.instance_id,
                "layout_fingerprint": self.fingerprint,
                "layout_vars": {v: self.env.get(v) for v in self.layout_vars},
                "faults": [{"fault": f["fault"], "rule": f["index"], **f["params"]} for f in self.faults],
                "peer_prefill_instance": self.peer_instance,
                "started_at": self.started_at,
                "pid": os.getpid(),
            },
            "internal_states": [{"last_gen_throughput": 0.0}],
        }
        if os.environ.get("SGLANG_EXPOSE_OWN_ENV_VARS") in ("1", "true", "True"):
            info["environ"] = {k: v for k, v in sorted(os.environ.items())
                               if k.startswith(("SGLANG_", "SGL_"))}
        return info

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "served_model_name": self.served_model_name,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "sim",
            "architectures": ["SimForCausalLM"],
        }

    def answered(self, started: float, prompt_tokens: int, generation_tokens: int) -> None:
        """What SGLang's collector records of a finished request (prefill: its prompt tokens;
        decode: its generated tokens, TTFT -- the first token is the answer here -- and latency)."""
        now = time.monotonic()
        with self.counter_lock:
            if self.role == "prefill":
                self.counters["prompt_tokens"] += prompt_tokens
            else:
                self.counters["generation_tokens"] += generation_tokens
                self.hist["ttft"].observe(now - started)
                self.recent_tokens.append((now, generation_tokens))
                cut = now - GEN_THROUGHPUT_WINDOW_S
                while self.recent_tokens and self.recent_tokens[0][0] < cut:
                    self.recent_tokens.pop(0)
            self.hist["e2e"].observe(now - started)

    def metrics_text(self) -> str:
        lbl = f'role="{self.role}",model_name="{self.served_model_name}"'
        c = dict(self.counters)
        with self.counter_lock:
            now = time.monotonic()
            recent = sum(n for t, n in self.recent_tokens if t >= now - GEN_THROUGHPUT_WINDOW_S)
            ttft, e2e = self.hist["ttft"].lines("sglang:time_to_first_token_seconds", lbl), \
                self.hist["e2e"].lines("sglang:e2e_request_latency_seconds", lbl)
        lines = [
            "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE sglang:prompt_tokens_total counter",
            f"sglang:prompt_tokens_total{{{lbl}}} {float(c['prompt_tokens'])}",
            "# HELP sglang:generation_tokens_total Number of generation tokens processed.",
            "# TYPE sglang:generation_tokens_total counter",
            f"sglang:generation_tokens_total{{{lbl}}} {float(c['generation_tokens'])}",
            "# HELP sglang:gen_throughput The generation throughput (token/s).",
            "# TYPE sglang:gen_throughput gauge",
            f"sglang:gen_throughput{{{lbl}}} {recent / GEN_THROUGHPUT_WINDOW_S}",
            "# HELP sglang:num_queue_reqs The number of requests in the waiting queue.",
            "# TYPE sglang:num_queue_reqs gauge",
            f"sglang:num_queue_reqs{{{lbl}}} 0.0",
            "# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.",
            "# TYPE sglang:time_to_first_token_seconds histogram",
            *ttft,
            "# HELP sglang:e2e_request_latency_seconds Histogram of End-to-end request latency in seconds",
            "# TYPE sglang:e2e_request_latency_seconds histogram",
            *e2e,
            "# HELP sglang:num_requests_total Number of requests received.",
            "# TYPE sglang:num_requests_total counter",
            f"sglang:num_requests_total{{{lbl}}} {c['generate_requests']}",
            "# HELP sglang:http_requests_total HTTP requests of any kind.",
            "# TYPE sglang:http_requests_total counter",
            f"sglang:http_requests_total{{{lbl}}} {c['requests']}",
            "# HELP sglang:num_errors_total Requests answered with an error.",
            "# TYPE sglang:num_errors_total counter",
            f"sglang:num_errors_total{{{lbl}}} {c['errors']}",
            "# HELP sglang:num_hung_requests_total Requests the simulator chose to never answer.",
            "# TYPE sglang:num_hung_requests_total counter",
            f"sglang:num_hung_requests_total{{{lbl}}} {c['hung']}",
            "# HELP sglang:kv_transfers_total KV transfers completed.",
            "# TYPE sglang:kv_transfers_total counter",
            f"sglang:kv_transfers_total{{{lbl}}} {c['kv_transfers']}",
            "# HELP sglang:kv_transfer_timeouts_total KV transfers that timed out.",
            "# TYPE sglang:kv_transfer_timeouts_total counter",
            f"sglang:kv_transfer_timeouts_total{{{lbl}}} {c['kv_transfer_timeouts']}",
            "# HELP sglang:num_running_reqs Requests running now.",
            "# TYPE sglang:num_running_reqs gauge",
            f"sglang:num_running_reqs{{{lbl}}} {self.running}",
            "# HELP sglang:sim_info Simulator identity.",
            "# TYPE sglang:sim_info gauge",
            f'sglang:sim_info{{{lbl},instance_id="{self.instance_id}",'
            f'layout_fingerprint="{self.fingerprint}",faults="{",".join(f["fault"] for f in self.faults)}"}} 1',
            "# HELP process_start_time_seconds Start time of the process.",
            "# TYPE process_start_time_seconds gauge",
            f"process_start_time_seconds {self.started_at:.3f}",
        ]
        return "\n".join(lines) + "\n"


SIM: Sim  # set in main()


class Histogram:
    """A Prometheus histogram's cumulative buckets (callers hold the Sim's lock)."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last is +Inf
        self.total = 0.0

    def observe(self, v: float) -> None:
        i = next((i for i, b in enumerate(self.bounds) if v <= b), len(self.bounds))
        self.counts[i] += 1
        self.total += v

    def lines(self, name: str, lbl: str) -> list[str]:
        out, acc = [], 0
        for b, n in zip([*map(repr, self.bounds), "+Inf"], self.counts):
            acc += n
            out.append(f'{name}_bucket{{{lbl},le="{b}"}} {float(acc)}')
        return [*out, f"{name}_sum{{{lbl}}} {self.total}", f"{name}_count{{{lbl}}} {float(acc)}"]


_ARITH = re.compile(r"(-?\d+)\s*([-+*x\u00d7])\s*(-?\d+)")
_OPTION = re.compile(r"\b([A-J])\)\s*(-?\d+)")


def solve(prompt: str) -> tuple[str, str] | None:
    """(right, wrong) answers to an arithmetic prompt ("What is 17 + 25?"), or, with lettered
    options ("A) 41 B) 42"), the letters; None for a prompt the simulator cannot answer."""
    m = _ARITH.search(prompt)
    if m is None:
        return None
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    value = a + b if op == "+" else a - b if op == "-" else a * b
    options = _OPTION.findall(prompt[m.end():])
    if options:
        right = next((letter for letter, v in options if int(v) == value), None)
        wrong = next((letter for letter, v in options if int(v) != value), None)
        if right is None or wrong is None:
            return None
        return f"The answer is {right}.", f"The answer is {wrong}."
    return f"The answer is {value}.", f"The answer is {value + 1}."


# --------------------------------------------------------------------------------------------
# HTTP helpers
# --------------------------------------------------------------------------------------------

def http_get_json(host: str, port: int, path: str, timeout: float = 2.0) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        try:
            return resp.status, json.loads(body or b"null")
        except ValueError:
            return resp.status, None
    finally:
        conn.close()


def split_url(url: str) -> tuple[str, int]:
    m = re.match(r"^(?:https?://)?\[?([^\]/]+?)\]?:(\d+)/?$", url.strip())
    if not m:
        raise ValueError(f"bad bootstrap url {url!r}")
    return m.group(1), int(m.group(2))


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request, client_address):  # noqa: D401 - keep the log short
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, BrokenPipeError, socket.timeout)):
            return
        log(f"error handling request from {client_address}: {exc!r}")


class BaseHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sglang-sim"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # silence default stderr logging
        pass

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def send_bytes(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def send_json(self, status: int, obj: Any) -> None:
        self.send_bytes(status, json.dumps(obj).encode())

    def send_text(self, status: int, text: str, ctype: str = "text/plain; charset=utf-8") -> None:
        self.send_bytes(status, text.encode(), ctype)


# --------------------------------------------------------------------------------------------
# Bootstrap server (prefill side)
# --------------------------------------------------------------------------------------------

class BootstrapHandler(BaseHandler):
    def do_GET(self) -> None:
        sim = SIM
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/"):
            self.send_text(200, "OK")
        elif path in ("/instance", "/route"):
            self.send_json(200, {"instance_id": sim.instance_id, "layout_fingerprint": sim.fingerprint,
                                 "role": sim.role, "pid": os.getpid(),
                                 "env": {k: sim.env.get(k) for k in peer_vars(sim.rules)}})
        elif path.startswith("/kv/"):
            room = path[len("/kv/"):]
            with sim.kv_lock:
                rec = sim.kv.get(room)
            if rec is None:
                self.send_json(404, {"error": "room not ready", "room": room})
            else:
                self.send_json(200, rec)
        else:
            self.send_json(404, {"error": f"not found: {path}"})


# --------------------------------------------------------------------------------------------
# Main HTTP server
# --------------------------------------------------------------------------------------------

GEN_PATHS = ("/v1/chat/completions", "/v1/completions", "/generate")


class WorkerHandler(BaseHandler):
    # one handler instance per TCP connection: used by fail_after_reused
    conn_seq = 0
    _conn_lock = threading.Lock()

    def setup(self) -> None:
        super().setup()
        with WorkerHandler._conn_lock:
            WorkerHandler.conn_seq += 1
            self.conn_id = WorkerHandler.conn_seq
        self.gen_on_conn = 0

    # ---- GET ------------------------------------------------------------------------------
    def do_GET(self) -> None:
        sim = SIM
        sim.count("requests")
        path = self.path.split("?", 1)[0]
        if path not in ("/health", "/metrics"):
            log(f"GET {path} conn={self.conn_id}")
        if path in ("/health", "/health_generate"):
            if sim.loaded.is_set():
                self.send_bytes(200, b"", "text/plain")
            else:
                self.send_json(503, {"error": "server is starting (loading model)"})
        elif path in ("/server_info", "/get_server_info"):
            self.send_json(200, sim.server_info())
        elif path in ("/model_info", "/get_model_info"):
            self.send_json(200, sim.model_info())
        elif path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{
                "id": sim.served_model_name, "object": "model", "created": int(sim.started_at),
                "owned_by": "sglang", "root": sim.model_path, "max_model_len": 4096}]})
        elif path == "/metrics":
            self.send_text(200, sim.metrics_text(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/get_load":
            self.send_json(200, [{"dp_rank": 0, "num_reqs": sim.running, "num_waiting_reqs": 0,
                                  "num_tokens": 0}])
        elif path == "/ping":
            self.send_text(200, "pong")
        else:
            self.send_json(404, {"detail": "Not Found"})

    # ---- POST -----------------------------------------------------------------------------
    def do_POST(self) -> None:
        sim = SIM
        sim.count("requests")
        path = self.path.split("?", 1)[0]
        raw = self.read_body()
        if path in ("/flush_cache",):
            log(f"POST {path}")
            self.send_text(200, "Cache flushed.")
            return
        if path not in GEN_PATHS:
            log(f"POST {path} -> 404")
            self.send_json(404, {"detail": "Not Found"})
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self.send_json(400, {"error": {"message": "invalid JSON body"}})
            return
        self.gen_on_conn += 1
        self.started = time.monotonic()
        sim.count("generate_requests")
        with sim.counter_lock:
            sim.running += 1
        try:
            self.generate(path, body)
        finally:
            with sim.counter_lock:
                sim.running -= 1

    def hang(self, why: str) -> None:
        SIM.count("hung")
        log(f"FAULT hang: {why}; this request will never be answered")
        SIM.wait_forever()
        self.close_connection = True

    def error(self, status: int, message: str) -> None:
        SIM.count("errors")
        room = getattr(self, "room", None)
        if SIM.role == "prefill" and room is not None:
            # like a real prefill aborting a request: the decode waiting on this room is told
            # the transfer failed (it answers an error instead of waiting for its timeout)
            with SIM.kv_lock:
                SIM.kv[str(room)] = {"room": str(room), "failed": True, "reason": message,
                                     "instance_id": SIM.instance_id,
                                     "layout_fingerprint": SIM.fingerprint, "stored_at": time.time()}
        self.send_json(status, {"error": {"message": message, "type": "sim_fault", "code": status},
                                "object": "error", "message": message})

    def generate(self, path: str, body: dict[str, Any]) -> None:
        sim = SIM
        room = body.get("bootstrap_room")
        if isinstance(room, list):
            room = room[0] if room else None
        bhost = body.get("bootstrap_host")
        if isinstance(bhost, list):
            bhost = bhost[0] if bhost else None
        bport = body.get("bootstrap_port")
        if isinstance(bport, list):
            bport = bport[0] if bport else None
        self.room = room
        rid = f"room={room}" if room is not None else "room=-"
        log(f"POST {path} {rid} conn={self.conn_id} req#{self.gen_on_conn}-on-conn "
            f"bootstrap={bhost}:{bport} stream={bool(body.get('stream'))}")
        if not sim.loaded.is_set():
            self.error(503, "server is starting")
            return

        # ---- faults, in a fixed order -----------------------------------------------------
        f = sim.fault("fail_after_reused")
        if f is not None:
            n = int(f["params"].get("n", 1))
            if self.gen_on_conn > n:
                self.hang(f"fail_after_reused n={n}: request #{self.gen_on_conn} on reused "
                          f"connection {self.conn_id} (rule #{f['index']})")
                return
        f = sim.fault("intermittent")
        if f is not None and sim.rng is not None:
            p = float(f["params"].get("p", 0.5))
            mode = str(f["params"].get("mode", "mixed"))
            with sim.rng_lock:
                roll = sim.rng.random()
                pick = sim.rng.random()
            if roll < p:
                as_hang = mode == "hang" or (mode == "mixed" and pick < 0.5)
                if as_hang:
                    self.hang(f"intermittent p={p} roll={roll:.3f} (rule #{f['index']})")
                else:
                    log(f"FAULT intermittent 500: p={p} roll={roll:.3f} (rule #{f['index']})")
                    self.error(500, "intermittent simulated failure")
                return
            log(f"intermittent: roll={roll:.3f} >= p={p}: ok")
        prompt = prompt_text(path, body)
        f = sim.fault("5xx", prompt)
        if f is not None:
            status = int(f["params"].get("status", 500))
            log(f"FAULT 5xx: answering {status} (rule #{f['index']})")
            self.error(status, "simulated internal server error")
            return
        f = sim.fault("hang", prompt)
        if f is not None:
            self.hang(f"hang rule #{f['index']}")
            return
        f = sim.fault("slow", prompt)
        if f is not None:
            delay = float(f["params"].get("delay_s", 2.0))
            log(f"FAULT slow: sleeping {delay}s (rule #{f['index']})")
            if sim.shutdown.wait(delay):
                return

        if sim.role == "prefill":
            if room is not None:
                rec = {"room": str(room), "layout_fingerprint": sim.fingerprint,
                       "instance_id": sim.instance_id, "prompt_tokens": len(prompt.split()),
                       "stored_at": time.time()}
                with sim.kv_lock:
                    sim.kv[str(room)] = rec
                    if len(sim.kv) > 20000:
                        for k in list(sim.kv)[:10000]:
                            sim.kv.pop(k, None)
                log(f"prefill: stored KV for room={room} fp={sim.fingerprint} instance={sim.instance_id}")
            text = ""
            self.answer(path, body, text, prompt)
            return

        # decode
        if room is None or bhost is None or bport is None:
            log("decode: no bootstrap info in request; answering without a KV transfer")
        else:
            ok = self.fetch_kv(str(bhost), int(bport), str(room))
            if not ok:
                return
        text = f"sim-decode reply: {' '.join(prompt.split()[-8:])}".strip()
        if sim.token_s > 0:
            n = max(1, int(body.get("max_tokens") or body.get("max_new_tokens") or 16))
            with sim.rng_lock:
                noise = max(0.5, sim.speed_rng.gauss(1.0, sim.jitter))
            if sim.shutdown.wait(n * sim.token_s * sim.speed * noise):
                return
            text = "sim-decode reply: " + " ".join(f"t{i}" for i in range(max(0, n - 2)))
        solved = solve(prompt)
        if solved is not None:
            with sim.rng_lock:
                wrong = sim.wrong_rate > 0 and sim.wrong_rng.random() < sim.wrong_rate
            if wrong:
                log(f"FAULT wrong: answering {solved[1]!r} instead of {solved[0]!r}")
            text = solved[1] if wrong else solved[0]
        self.answer(path, body, text, prompt)

    def fetch_kv(self, bhost: str, bport: int, room: str) -> bool:
        """Poll the prefill's bootstrap server for the KV of *room*.  Returns False when the
        request was already dealt with (timed out / hung)."""
        sim = SIM
        deadline = time.time() + sim.waiting_timeout
        warned: set[str] = set()
        with sim.peer_lock:
            if sim.peer_instance is None:
                try:
                    st, data = http_get_json(bhost, bport, "/instance")
                    if st == 200 and data:
                        sim.peer_instance = data["instance_id"]
                        log(f"decode: handshake with prefill instance {sim.peer_instance} "
                            f"at {bhost}:{bport}")
                except (OSError, ValueError, KeyError):
                    pass
        while not sim.shutdown.is_set():
            rec = None
            try:
                st, data = http_get_json(bhost, bport, f"/kv/{room}")
                if st == 200:
                    rec = data
            except OSError as exc:
                if "conn" not in warned:
                    warned.add("conn")
                    log(f"decode: bootstrap {bhost}:{bport} unreachable ({exc}); still waiting")
            if rec is not None and rec.get("failed"):
                log(f"decode: prefill aborted room={room} ({rec.get('reason')}); KV transfer failed")
                try:
                    self.error(500, f"KV transfer failed: prefill aborted the request ({rec.get('reason')})")
                except OSError:
                    pass
                return False
            if rec is not None:
                if rec.get("layout_fingerprint") != sim.fingerprint:
                    if "fp" not in warned:
                        warned.add("fp")
                        log(f"decode: KV layout mismatch for room={room}: prefill fingerprint "
                            f"{rec.get('layout_fingerprint')} != decode {sim.fingerprint}; "
                            f"transfer cannot complete, waiting")
                elif sim.peer_instance is not None and rec.get("instance_id") != sim.peer_instance:
                    if "inst" not in warned:
                        warned.add("inst")
                        log(f"decode: KV for room={room} comes from prefill instance "
                            f"{rec.get('instance_id')} but this decode handshook with "
                            f"{sim.peer_instance} (prefill restarted alone?); waiting")
                else:
                    sim.count("kv_transfers")
                    log(f"decode: received KV for room={room} from prefill {rec.get('instance_id')}")
                    return True
            if time.time() >= deadline:
                sim.count("kv_transfer_timeouts")
                log(f"decode: KV transfer for room={room} timed out after "
                    f"{sim.waiting_timeout:g}s (SGLANG_DISAGGREGATION_WAITING_TIMEOUT); aborting")
                try:
                    self.error(500, "KV transfer timed out (disaggregation waiting timeout)")
                except OSError:
                    pass
                return False
            sim.shutdown.wait(0.05)
        self.close_connection = True
        return False

    def answer(self, path: str, body: dict[str, Any], text: str, prompt: str) -> None:
        sim = SIM
        created = int(time.time())
        rid = "chatcmpl-" + uuid.uuid4().hex[:16]
        ptoks = len(prompt.split())
        ctoks = len(text.split())
        usage = {"prompt_tokens": ptoks, "completion_tokens": ctoks, "total_tokens": ptoks + ctoks}
        sim.answered(getattr(self, "started", time.monotonic()), ptoks, ctoks)
        model = body.get("model") or sim.served_model_name
        if body.get("stream"):
            self.stream_answer(path, rid, created, model, text, usage)
            log(f"answered (stream) {path} with {ctoks} tokens")
            return
        if path == "/v1/chat/completions":
            obj = {"id": rid, "object": "chat.completion", "created": created, "model": model,
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                "logprobs": None, "finish_reason": "stop", "matched_stop": None}],
                   "usage": usage, "system_fingerprint": sim.role}
        elif path == "/v1/completions":
            obj = {"id": rid, "object": "text_completion", "created": created, "model": model,
                   "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}],
                   "usage": usage}
        else:
            obj = {"text": text, "meta_info": {"id": rid, "finish_reason": {"type": "stop"},
                                               "prompt_tokens": ptoks, "completion_tokens": ctoks,
                                               "cached_tokens": 0, "e2e_latency": 0.001}}
        self.send_json(200, obj)
        log(f"answered {path} 200 ({ctoks} tokens)")

    def stream_answer(self, path: str, rid: str, created: int, model: str, text: str,
                      usage: dict[str, int]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(obj: Any) -> None:
            data = ("data: " + (obj if isinstance(obj, str) else json.dumps(obj)) + "\n\n").encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        words = text.split(" ") if text else []
        acc = ""
        for i, w in enumerate(words):
            piece = w if i == 0 else " " + w
            acc += piece
            if path == "/v1/chat/completions":
                chunk({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [{"index": 0, "delta": {"role": "assistant", "content": piece},
                                    "finish_reason": None}]})
            elif path == "/v1/completions":
                chunk({"id": rid, "object": "text_completion", "created": created, "model": model,
                       "choices": [{"index": 0, "text": piece, "finish_reason": None}]})
            else:
                chunk({"text": acc, "meta_info": {"id": rid, "finish_reason": None}})
        if path == "/v1/chat/completions":
            chunk({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage})
        elif path == "/v1/completions":
            chunk({"id": rid, "object": "text_completion", "created": created, "model": model,
                   "choices": [{"index": 0, "text": "", "finish_reason": "stop"}], "usage": usage})
        else:
            chunk({"text": acc, "meta_info": {"id": rid, "finish_reason": {"type": "stop"}}})
        chunk("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def prompt_text(path: str, body: dict[str, Any]) -> str:
    if path == "/v1/chat/completions":
        parts = []
        for m in body.get("messages") or []:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                parts.append(c)
            elif isinstance(c, list):
                parts.extend(str(p.get("text", "")) for p in c if isinstance(p, dict))
        return " ".join(parts)
    t = body.get("prompt") if path == "/v1/completions" else body.get("text")
    if isinstance(t, list):
        t = " ".join(str(x) for x in t)
    return str(t or "")


# --------------------------------------------------------------------------------------------
# Startup
# --------------------------------------------------------------------------------------------

def learn_prefill_instance(sim: Sim) -> None:
    """Decode: handshake with the prefill's bootstrap server at start, retrying until it is up."""
    host, port = split_url(sim.prefill_bootstrap or "")
    announced = False
    while not sim.shutdown.is_set():
        with sim.peer_lock:
            if sim.peer_instance is not None:
                return
            try:
                st, data = http_get_json(host, port, "/instance", timeout=1.0)
                if st == 200 and data and data.get("instance_id"):
                    sim.peer_instance = data["instance_id"]
                    log(f"decode: handshake with prefill instance {sim.peer_instance} at {host}:{port} "
                        f"(prefill layout fingerprint {data.get('layout_fingerprint')})")
                    return
            except (OSError, ValueError):
                pass
        if not announced:
            announced = True
            log(f"decode: prefill bootstrap {host}:{port} not reachable yet; retrying")
        sim.shutdown.wait(0.2)


def peer_environment(sim: Sim, wait_s: float = 10.0) -> dict[str, str] | None:
    """Decode, at start: what the prefill says of the variables the rules ask about (None when it
    cannot be reached within ``wait_s``: then no ``when_peer`` rule matches)."""
    host, port = split_url(sim.prefill_bootstrap or "")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            st, data = http_get_json(host, port, "/instance", timeout=1.0)
            if st == 200 and isinstance(data, dict):
                return {k: v for k, v in (data.get("env") or {}).items() if v is not None}
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="envbisect.sim.worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--role", choices=("prefill", "decode"), required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--bootstrap-port", type=int, default=None,
                   help="prefill: port of the bootstrap server (default 8998)")
    p.add_argument("--prefill-bootstrap", default=None,
                   help="decode: http://HOST:PORT of the prefill bootstrap server to handshake with at start")
    p.add_argument("--model-path", required=True)
    p.add_argument("--served-model-name", default=None)
    args, extra = p.parse_known_args(argv)  # server flags the simulator only matches rules on
    args.extra = extra
    return args


def main(argv: list[str] | None = None) -> int:
    global SIM
    args = parse_args(argv)
    if args.role == "prefill" and args.bootstrap_port is None:
        args.bootstrap_port = 8998
    sim = Sim(args)
    SIM = sim
    log(f"sim {sim.role} worker starting: service={sim.service} pid={os.getpid()} port={sim.port} "
        f"bootstrap_port={sim.bootstrap_port} model_path={sim.model_path} instance={sim.instance_id}")
    log(f"rules file: {sim.rules_path or '<none>'}; kv layout vars: "
        + ", ".join(f"{v}={sim.env.get(v, '<unset>')}" for v in sim.layout_vars)
        + f"; layout fingerprint {sim.fingerprint}")
    if sim.flags:
        log("server flags: " + " ".join(f"{k}={v}" if v else k for k, v in sim.flags.items()))
    if sim.faults:
        for f in sim.faults:
            log(f"fault decision: rule #{f['index']} matches -> {f['fault']} {f['params'] or ''} "
                f"(rule: {json.dumps(f['rule'], sort_keys=True)})")
    else:
        log("fault decision: no rule matches; behaving normally")
    if sim.role == "decode" and sim.prefill_bootstrap and any(r.get("when_peer") for r in sim.rules["rules"]):
        peer = peer_environment(sim)
        for f in active_faults(sim.rules, sim.service, sim.env, sim.flags, peer):
            if f["rule"].get("when_peer") and f not in sim.faults:
                log(f"fault decision: rule #{f['index']} matches with the prefill's "
                    f"{json.dumps(peer, sort_keys=True)} -> {f['fault']}")
                sim.faults.append(f)
    crash = sim.fault("crash")
    if crash is not None:
        time.sleep(min(float(crash["params"].get("after_s", 0.1)), 5.0))
        msg = crash["params"].get("message") or "simulated start failure"
        log(f"FATAL: {msg} (crash fault, rule #{crash['index']}); exiting with status 1")
        return 1

    servers: list[ThreadingHTTPServer] = []
    try:
        main_srv = QuietServer((args.host, args.port), WorkerHandler)
        servers.append(main_srv)
        if sim.role == "prefill":
            boot_srv = QuietServer((args.host, sim.bootstrap_port), BootstrapHandler)
            servers.append(boot_srv)
    except OSError as exc:
        log(f"FATAL: cannot bind: {exc}")
        for s in servers:
            s.server_close()
        return 1

    def on_signal(signum: int, _frame: Any) -> None:
        if sim.shutdown.is_set():
            return
        log(f"received signal {signum}; shutting down")
        sim.shutdown.set()
        for s in servers:
            threading.Thread(target=s.shutdown, daemon=True).start()

    stubborn = sim.fault("ignore_sigterm")
    if stubborn is not None:
        log(f"ignoring SIGTERM (ignore_sigterm fault, rule #{stubborn['index']}): only SIGKILL stops this process")
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    threads = []
    for s in servers[1:]:
        t = threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        t.start()
        threads.append(t)
        log(f"bootstrap server listening on {args.host}:{sim.bootstrap_port}")
    if sim.role == "decode" and sim.prefill_bootstrap:
        threading.Thread(target=learn_prefill_instance, args=(sim,), daemon=True).start()

    def load() -> None:
        log(f"loading model weights ({sim.load_seconds:g}s)")
        if not sim.shutdown.wait(sim.load_seconds):
            sim.loaded.set()
            log(f"model loaded; the server is fired up and ready to roll "
                f"(http://{args.host}:{args.port})")

    threading.Thread(target=load, daemon=True).start()
    log(f"HTTP server listening on {args.host}:{args.port}")
    main_srv.serve_forever(poll_interval=0.2)
    for s in servers:
        s.server_close()
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
