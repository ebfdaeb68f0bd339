"""The playbook: one deployment described in TOML (see docs/playbook.md).

Parsing is strict on purpose: a typo in a key of a file that drives restarts on a production
cluster must be an error naming the file, the key and the problem, not a silently ignored line.
"""
from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from envbisect.errors import PlaybookError
from envbisect.inputs.probe_keys import parse_answers, parse_reading
from envbisect.inputs.tables import VARIABLE_NAME, TableReader, check_absolute

LOCAL = "local"
PROBE_KINDS = ("http", "multi_round", "concurrent", "command", "perf", "metrics", "promql", "answers")
# kinds judged like a perf probe: samples of a number, compared with the baseline's (trials/perf_trial.py)
PERF_KINDS = ("perf", "metrics", "promql")
PROBE_REPEAT_MAX = 40  # = Search(max_probes=...): a trial is never probed more often than that
PROBE_CONCURRENCY_MAX = 1024  # one thread and one connection each


@dataclass(frozen=True)
class Host:
    name: str
    ssh: str  # alias of the OpenSSH config, "user@host:port", or "local" ("" until an inventory host is bound)
    python: str = "python3"  # "" for an inventory host that does not say (its ansible_python_interpreter, else python3)
    inventory: str | None = None  # the inventory host or group it comes from (see inventory.py)
    ssh_options: tuple[tuple[str, str], ...] = ()  # `ssh -o KEY VALUE` options that come first (from the inventory)

    @property
    def is_local(self) -> bool:
        return self.ssh == LOCAL


@dataclass(frozen=True)
class Service:
    name: str
    host: str
    env_file: str
    start: str
    stop: str
    health: str
    pid_file: str | None = None
    log: str | None = None
    metrics: str | None = None
    insecure: bool = False  # https health / metrics: skip TLS verification (said in the playbook, never implied)
    # restarted on its own when only its environment changed (None: when its name says router;
    # trials/restart_plan.py, docs/search.md#restart-plans)
    restart_alone: bool | None = None


@dataclass(frozen=True)
class Repo:
    host: str
    path: str

    @property
    def id(self) -> str:
        return f"{self.host}:{self.path}"


@dataclass(frozen=True)
class Probe:
    name: str
    kind: str
    vantage: str = LOCAL
    url: str | None = None
    method: str = "POST"
    body: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    expect_status: int = 200
    expect_body: str | None = None
    timeout_s: float = 30.0
    latency_budget_s: float | None = None
    repeat: int = 1
    rounds: int = 6  # multi_round
    concurrency: int = 16  # concurrent
    command: str | None = None  # command
    # perf: a sample is `requests` requests at `concurrency` after `warmup` untimed ones; the
    # metric of a configuration's samples is compared with the baseline's (search/perf.py)
    requests: int = 64
    metric: str = "output_tokens_per_s"
    regression: float = 0.05  # worse than the baseline by more than this fraction = fail
    samples: int = 3  # samples per started configuration (more when undecided, up to max_samples)
    max_samples: int = 16
    # the metric's relative spread between process starts of one configuration: the samples of one
    # start cannot see it, so "worse" must clear it too (search/perf.py); 0 trusts one start fully
    start_noise: float = 0.02
    warmup: int | None = None  # untimed requests first (default: concurrency)
    insecure: bool = False  # https: skip TLS verification (the headers may carry API keys: verified by default)
    # metrics / promql: a sample is `load_s` seconds of load (the request above at `concurrency`)
    # and one number read from Prometheus metrics over that window (trials/probe_metrics.py)
    load_s: float = 3.0
    metrics_url: str | None = None  # metrics: the /metrics page read before and after the load
    series: str | None = None  # metrics: the metric family (e.g. sglang:generation_tokens_total)
    reading: str = "rate"  # metrics: rate (counter), quantile (histogram), gauge (mean while loaded)
    quantile: float = 0.5  # metrics, reading = quantile
    labels: tuple[tuple[str, str], ...] = ()  # metrics: only the series with these label values
    prometheus: str | None = None  # promql: the server's base URL
    query: str | None = None  # promql: $window becomes the load window ("3s"), evaluated at its end
    higher: bool | None = None  # metrics/promql: whether a higher number is better
    # answers: prompts with their expected answers (from a JSONL file), `requests` of them per run
    answer_items: tuple[tuple[str, str, str], ...] = ()  # (prompt, exact|regex|choice, expected)
    model: str = "default"
    max_tokens: int = 64
    tolerance: float = 0.10  # accuracy points a configuration may lose against the baseline
    min_accuracy: float = 0.0  # the baseline (or a lone run) must reach this accuracy to pass

    @property
    def is_perf(self) -> bool:
        return self.kind in PERF_KINDS

    @property
    def needs_reference(self) -> bool:
        """Judged against the baseline measured first in the same run (perf-like and answers)."""
        return self.is_perf or self.kind == "answers"

    @property
    def higher_is_better(self) -> bool:
        return PERF_METRICS[self.metric] if self.kind == "perf" else bool(self.higher)


@dataclass(frozen=True)
class Restart:
    order: tuple[str, ...]  # every service, in start order (a group's services in the order listed)
    health_timeout_s: float = 600.0
    poll_interval_s: float = 2.0
    command_timeout_s: float = 300.0  # a stop or start command that runs longer is killed (infra failure)
    # after the stop commands, how long each stopped process may take to be gone (a GPU process
    # releasing its memory); one still running then makes the co-restart fail (hosts/restart.py)
    stop_wait_s: float = 30.0
    # start groups, in order: a group's services start at once and are all healthy before the
    # next group starts; stop is the reverse, group by group (default: one service per group)
    groups: tuple[tuple[str, ...], ...] = ()
    always_all: bool = False  # every trial restarts every service (no restart plan)

    @property
    def start_groups(self) -> tuple[tuple[str, ...], ...]:
        return self.groups or tuple((n,) for n in self.order)


@dataclass(frozen=True)
class Playbook:
    path: Path
    name: str
    hosts: Mapping[str, Host]
    services: Mapping[str, Service]
    restart: Restart
    repos: tuple[Repo, ...] = ()
    watch_paths: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # host -> paths
    max_file_size: int = 1 << 20
    backups: tuple[str, ...] = ()
    secret_names: tuple[str, ...] = ()
    secret_values: tuple[str, ...] = ()
    probes: Mapping[str, Probe] = field(default_factory=dict)
    client_url: str | None = None  # the client path (e.g. a proxy), for layered diagnosis
    inventory_file: str | None = None  # [inventory] file: an Ansible inventory (resolved against the playbook's folder)
    link_keys: tuple[str, ...] = ()  # [bisect] link: variables whose deltas across services are one unit, never split
    arg_keys: tuple[str, ...] = ()  # [deltas] args: variables holding argument strings, besides *_ARGS / *_FLAGS
    watch_alerts: tuple[str, ...] = ()  # [watch] alerts: Alertmanager alertnames that trigger `envbisect watch`
    # [engine] switch: the env-file variable the services' start command picks the engine's environment by;
    # [engine.versions]: the value it takes for each release installed side by side (an upgrade is then a delta)
    engine_switch: str | None = None
    engine_versions: Mapping[str, str] = field(default_factory=dict)
    watch_cooldown: str = "1h"  # [watch] cooldown: the least time between two bisections of `envbisect watch`
    watch_secret_file: str | None = None  # [watch] secret_file: the webhook's shared secret (absolute path)

    def services_on(self, host: str) -> list[Service]:
        return [s for s in self.services.values() if s.host == host]

    def repos_on(self, host: str) -> list[Repo]:
        return [r for r in self.repos if r.host == host]


# A deployment's name reaches file names on the hosts and the lines of a crontab or systemd unit
# (runs/schedule.py): no line breaks, spaces, quotes or shell characters.
DEPLOYMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


# --- parsing -------------------------------------------------------------------------------

def load_playbook(path: str | Path) -> Playbook:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise PlaybookError(path, None, "no such playbook (use --playbook/-p, default ./envbisect.toml)") from None
    except OSError as e:
        raise PlaybookError(path, None, f"cannot read: {e.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise PlaybookError(path, None, "is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise PlaybookError(path, None, f"invalid TOML: {e}") from None
    return parse_playbook(data, path)


def parse_playbook(data: Mapping[str, Any], path: Path) -> Playbook:
    top = TableReader(path, "", dict(data))
    name = _deployment_name(TableReader(path, "deployment", top.get("deployment", dict, {})))
    hosts = _hosts(path, top.get("hosts", dict, required=True))
    services = _services(path, top.get("services", dict, required=True), hosts)
    restart = _restart(TableReader(path, "restart", top.get("restart", dict, {})), services)
    repos = _repos(path, top.get("repos", list, []), hosts)
    wr = TableReader(path, "watch", top.get("watch", dict, {}))
    watch = _watch_paths(wr, hosts)
    max_file_size = wr.get("max_file_size", int, 1 << 20)
    watch_alerts = wr.str_list("alerts")
    if any(not a.strip() for a in watch_alerts):
        raise PlaybookError(path, "watch.alerts", "an alert name must not be empty")
    watch_cooldown = wr.get("cooldown", str, "1h")
    watch_secret_file = wr.get("secret_file", str, None)
    if watch_secret_file is not None and not watch_secret_file.startswith("/"):
        raise PlaybookError(path, "watch.secret_file", f"must be an absolute path on this machine, got "
                                                       f"{watch_secret_file!r}")
    wr.finish()
    backups = _one_key(TableReader(path, "baseline", top.get("baseline", dict, {})), "backups", TableReader.str_list)
    sr = TableReader(path, "secrets", top.get("secrets", dict, {}))
    secret_names, secret_values = sr.str_list("names"), sr.str_list("values")
    sr.finish()
    probes = {pname: _parse_probe(path, pname, ptable, hosts)
              for pname, ptable in top.get("probes", dict, {}).items()}
    client_url = _one_key(TableReader(path, "client", top.get("client", dict, {})), "url", _optional_str)
    inventory_file = _one_key(TableReader(path, "inventory", top.get("inventory", dict, {})), "file", _optional_str)
    link_keys = _one_key(TableReader(path, "bisect", top.get("bisect", dict, {})), "link", TableReader.variable_names)
    arg_keys = _one_key(TableReader(path, "deltas", top.get("deltas", dict, {})), "args", TableReader.variable_names)
    engine_switch, engine_versions = _engine(TableReader(path, "engine", top.get("engine", dict, {})))
    top.finish()
    return Playbook(
        path=path, name=name, hosts=hosts, services=services, restart=restart, repos=tuple(repos),
        watch_paths=watch, max_file_size=max_file_size, backups=backups, secret_names=secret_names,
        secret_values=secret_values, probes=probes, client_url=client_url, inventory_file=inventory_file,
        link_keys=link_keys, arg_keys=arg_keys, watch_alerts=watch_alerts, engine_switch=engine_switch,
        engine_versions=engine_versions, watch_cooldown=watch_cooldown, watch_secret_file=watch_secret_file,
    )


def _engine(r: TableReader) -> tuple[str | None, dict[str, str]]:
    """``[engine] switch = "VAR"`` and ``[engine.versions] "0.5.18" = "VALUE"``: both or neither."""
    switch = r.get("switch", str, None)
    versions = r.get("versions", dict, {})
    r.finish()
    if switch is not None and not VARIABLE_NAME.fullmatch(switch):
        raise PlaybookError(r.path, r.key("switch"), f"{switch!r} is not a variable name")
    for v, value in versions.items():
        if not isinstance(value, str) or not value.strip():
            raise PlaybookError(r.path, r.key(f"versions.{v}"), f"must be a non-empty string, got {value!r}")
    if bool(switch) != bool(versions):
        raise PlaybookError(r.path, r.key("switch" if versions else "versions"),
                            "is required with " + ("[engine.versions]" if versions else "[engine] switch"))
    return switch, dict(versions)


def _optional_str(r: TableReader, k: str) -> str | None:
    return r.get(k, str, None)


def _one_key(r: TableReader, k: str, read: Callable[[TableReader, str], Any]) -> Any:
    """A table of one key: its value, read by `read`; any other key is an error."""
    value = read(r, k)
    r.finish()
    return value


def _deployment_name(dep: TableReader) -> str:
    name = dep.get("name", str, dep.path.stem)
    if not DEPLOYMENT_NAME.fullmatch(name):
        given = "" if "name" in dep.table else " (taken from the file name; set [deployment] name)"
        raise PlaybookError(dep.path, "deployment.name", f"{name!r} is not a deployment name{given}: letters, "
                            "digits, '_', '.', '-', starting with a letter or digit, at most 64 (it names the "
                            "lock, the journal and the scheduled job)")
    dep.finish()
    return name


def _hosts(path: Path, table: Mapping[str, Any]) -> dict[str, Host]:
    hosts: dict[str, Host] = {}
    for hname, htable in table.items():
        r = TableReader(path, f"hosts.{hname}", htable)
        inv = r.get("inventory", str, None)
        if inv is None and "ssh" not in r.table:
            inv = hname  # no ssh: the host of that name in the inventory
        if inv is not None:  # bound to the inventory by inventory.bind_inventory (Deployment does it)
            if "ssh" in r.table:
                raise PlaybookError(path, f"hosts.{hname}", "give ssh or inventory, not both")
            if not inv.strip():
                raise PlaybookError(path, f"hosts.{hname}.inventory", "must not be empty")
            hosts[hname] = Host(hname, "", r.get("python", str, ""), inventory=inv.strip())
            r.finish()
            continue
        ssh = r.get("ssh", str, required=True).strip()
        if not ssh:
            raise PlaybookError(path, f"hosts.{hname}.ssh", "must not be empty")
        hosts[hname] = Host(hname, ssh, r.get("python", str, "python3"))
        r.finish()
    if not hosts:
        raise PlaybookError(path, "hosts", "at least one host is required")
    return hosts


def _services(path: Path, table: Mapping[str, Any], hosts: Mapping[str, Host]) -> dict[str, Service]:
    services: dict[str, Service] = {}
    for sname, stable in table.items():
        r = TableReader(path, f"services.{sname}", stable)
        host = r.get("host", str, required=True)
        if host not in hosts:
            raise PlaybookError(path, r.key("host"), f"names unknown host {host!r} (known: {', '.join(hosts)})")
        env_file = r.absolute("env_file", r.get("env_file", str, required=True))
        health = r.get("health", str, required=True)
        if not health.startswith(("http://", "https://")):
            raise PlaybookError(path, r.key("health"), f"must be an http(s) URL, got {health!r}")
        start, alone = r.get("start", str, required=True), r.get("restart_alone", bool, None)
        if alone and _pd_engine(sname, start):
            raise PlaybookError(path, r.key("restart_alone"), "must not be true on an engine of a PD pair: prefill "
                                "and decode restart together (a pair restarted apart hangs while both report ready)")
        services[sname] = Service(
            sname, host, env_file, start, r.get("stop", str, required=True), health,
            pid_file=r.get("pid_file", str, None), log=r.get("log", str, None), metrics=r.get("metrics", str, None),
            insecure=r.get("insecure", bool, False), restart_alone=alone,
        )
        r.finish()
    if not services:
        raise PlaybookError(path, "services", "at least one service is required")
    return services


def _pd_engine(name: str, start: str) -> bool:
    """Is the service an engine of a prefill/decode pair: its name says prefill or decode (as the
    drafted playbooks name them), or its start command passes ``--disaggregation-mode``?"""
    return any(role in name.lower() for role in ("prefill", "decode")) or "--disaggregation-mode" in start


def _restart(rr: TableReader, services: Mapping[str, Service]) -> Restart:
    path = rr.path
    groups = _start_groups(rr) or tuple((s,) for s in services)
    order = tuple(n for g in groups for n in g)
    for s in order:
        if s not in services:
            raise PlaybookError(path, "restart.order", f"names unknown service {s!r}")
    missing = [s for s in services if s not in order]
    if missing:
        raise PlaybookError(path, "restart.order",
                            f"does not list service(s) {', '.join(missing)}: a co-restart must cover every service")
    if len(set(order)) != len(order):
        raise PlaybookError(path, "restart.order", "lists a service twice")
    restart = Restart(order, rr.get("health_timeout_s", float, 600.0), rr.get("poll_interval_s", float, 2.0),
                      rr.get("command_timeout_s", float, 300.0), rr.get("stop_wait_s", float, 30.0),
                      groups, rr.get("always_all", bool, False))
    if restart.command_timeout_s <= 0:
        raise PlaybookError(path, "restart.command_timeout_s", "must be > 0")
    if not 0 < restart.stop_wait_s <= 3600:
        raise PlaybookError(path, "restart.stop_wait_s",
                            f"must be > 0 seconds (at most an hour), got {restart.stop_wait_s!r}")
    rr.finish()
    return restart


def _start_groups(rr: TableReader) -> tuple[tuple[str, ...], ...]:
    """`order`: each item a service, or a list of services that start at once."""
    groups: list[tuple[str, ...]] = []
    for item in rr.get("order", list, []):
        names = item if isinstance(item, list) else [item]
        if not names or not all(isinstance(n, str) for n in names):
            raise PlaybookError(rr.path, rr.key("order"),
                                f"each item must be a service or a non-empty list of services, got {item!r}")
        groups.append(tuple(names))
    return tuple(groups)


def _repos(path: Path, tables: list[Any], hosts: Mapping[str, Host]) -> list[Repo]:
    repos = []
    for i, rtable in enumerate(tables):
        r = TableReader(path, f"repos[{i}]", rtable)
        host = r.get("host", str, required=True)
        if host not in hosts:
            raise PlaybookError(path, r.key("host"), f"names unknown host {host!r}")
        rpath = r.absolute("path", r.get("path", str, required=True))
        repos.append(Repo(host, rpath.rstrip("/") or "/"))
        r.finish()
    return repos


def _watch_paths(wr: TableReader, hosts: Mapping[str, Host]) -> dict[str, tuple[str, ...]]:
    path = wr.path
    watch: dict[str, tuple[str, ...]] = {}
    plain = wr.str_list("paths")
    for p in plain:
        check_absolute(path, "watch.paths", p)
    # A single-host playbook may list plain paths; several hosts name theirs per host.
    if plain:
        if len(hosts) == 1:
            watch[next(iter(hosts))] = plain
        else:
            raise PlaybookError(path, "watch.paths", "with several hosts, use [watch.hosts] HOST = [paths]")
    if "hosts" in wr.table:
        per = TableReader(path, "watch.hosts", wr.get("hosts", dict))
        for h in list(per.table):
            if h not in hosts:
                raise PlaybookError(path, f"watch.hosts.{h}", "names unknown host")
            watch[h] = watch.get(h, ()) + per.str_list(h)
        per.finish()
    return watch


# name -> higher is better (what a perf probe can measure; search/perf.py decides on it)
PERF_METRICS = {"output_tokens_per_s": True, "latency_p50_s": False, "latency_p95_s": False, "ttft_p50_s": False}


def _parse_probe(path: Path, name: str, table: Any, hosts: Mapping[str, Host]) -> Probe:
    # Every setting is checked here, at load: a bad one found mid-run would stop a bisection after
    # the lock and journal were taken.
    r = TableReader(path, f"probes.{name}", table)
    kind = r.get("kind", str, required=True)
    if kind not in PROBE_KINDS:
        raise PlaybookError(path, r.key("kind"), f"must be one of {', '.join(PROBE_KINDS)}, got {kind!r}")
    vantage = r.get("vantage", str, LOCAL)
    if vantage != LOCAL and vantage not in hosts:
        raise PlaybookError(path, r.key("vantage"), f"names unknown host {vantage!r} (or use \"local\")")
    request = _probe_request(r, kind)
    if kind in PERF_KINDS:
        measured = _perf_keys(r, kind)
    elif kind == "answers":
        measured = parse_answers(r)
    else:
        measured = {}
    p = Probe(name=name, kind=kind, vantage=vantage, insecure=r.get("insecure", bool, False), **request, **measured)
    r.finish()
    return p


def _probe_request(r: TableReader, kind: str) -> dict[str, Any]:
    """The keys of what a probe sends and expects (every kind): Probe fields."""
    body = r.get("body", (str, dict), None)
    if isinstance(body, dict):
        body = json.dumps(body)
    headers = r.get("headers", dict, {})
    url = r.get("url", str, None)
    command = r.get("command", str, None)
    if kind == "command":
        if not command:
            raise PlaybookError(r.path, r.key("command"), "is required for kind = \"command\"")
    elif not url:
        raise PlaybookError(r.path, r.key("url"), f"is required for kind = \"{kind}\"")
    out = dict(
        url=url, body=body, command=command, headers=tuple((str(k), str(v)) for k, v in headers.items()),
        repeat=r.in_range("repeat", int, 1, 1, PROBE_REPEAT_MAX, f"between 1 and {PROBE_REPEAT_MAX} "
                          "(probe runs per trial; the search adds runs for intermittent faults itself)"),
        rounds=r.in_range("rounds", int, 6, 1, 10_000, "between 1 and 10000"),
        concurrency=r.in_range("concurrency", int, 16, 1, PROBE_CONCURRENCY_MAX,
                               f"between 1 and {PROBE_CONCURRENCY_MAX}"),
        expect_status=r.in_range("expect_status", int, 200, 100, 599, "an HTTP status (100-599)"),
        timeout_s=r.in_range("timeout_s", float, 30.0, 0.001, 86_400, "> 0 seconds (at most a day)"),
        latency_budget_s=r.in_range("latency_budget_s", float, None, 0.001, 86_400, "> 0 seconds"),
    )
    method = r.get("method", str, "POST").upper()
    if not re.fullmatch(r"[A-Z]+", method):
        raise PlaybookError(r.path, r.key("method"), f"must be an HTTP method such as GET or POST, got {method!r}")
    expect_body = r.get("expect_body", str, None)
    if expect_body is not None:
        try:
            re.compile(expect_body)
        except re.error as e:
            raise PlaybookError(r.path, r.key("expect_body"), f"is not a valid regular expression: {e}") from None
    if url is not None and not url.startswith(("http://", "https://")):
        raise PlaybookError(r.path, r.key("url"), f"must be an http(s) URL, got {url!r}")
    return dict(out, method=method, expect_body=expect_body)


def _perf_keys(r: TableReader, kind: str) -> dict[str, Any]:
    """The keys of a probe judged like perf (perf, metrics, promql): Probe fields."""
    perf: dict[str, Any] = {}
    if kind == "perf":
        metric = r.get("metric", str, "output_tokens_per_s")
        if metric not in PERF_METRICS:
            raise PlaybookError(r.path, r.key("metric"),
                                f"must be one of {', '.join(PERF_METRICS)}, got {metric!r}")
    else:
        reading = parse_reading(r, kind)
        metric = reading.pop("metric")
        perf.update(reading)
    regression = r.fraction("regression", "5%")
    start_noise = r.fraction("start_noise", "2%", allow_zero=True)
    samples = r.in_range("samples", int, 3, 2, 50, "between 2 and 50 (samples per started configuration)")
    perf.update(metric=metric, regression=regression, samples=samples, start_noise=start_noise,
                requests=r.in_range("requests", int, 64, 1, 100_000, "between 1 and 100000 (requests per sample)"),
                max_samples=r.in_range("max_samples", int, max(16, samples), samples, 200,
                                       f"between samples ({samples}) and 200"),
                warmup=r.in_range("warmup", int, None, 0, 100_000, "between 0 and 100000"))
    return perf
