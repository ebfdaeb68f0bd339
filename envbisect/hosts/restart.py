"""Full, ordered co-restart: stop in reverse order, start in order, each healthy before the next.

Why all of them: after replacing prefill or decode alone, both can report ready while requests
hang until both are restarted. Why health is not the verdict: a PD worker's /health does not
exercise the prefill->decode transfer and a router's /health is liveness only; the probe decides.

A co-restart proves its work (`ServiceRestart`): every process its pid file named before the stop
is gone within `restart.stop_wait_s` after the stop commands, and every process answering after the
start is a new one (another pid or start time, started after the stop began, on the host's own
clock) whose /proc/PID/environ holds the trial's values for the keys the trial sets. Otherwise the
co-restart fails (an infrastructure failure: the trial is unresolved, never pass or fail): a
service that ignores SIGTERM, or a stop of the `kill $(cat PIDFILE)` kind, would otherwise leave
the old process answering the health check and the probe, and the trial would test the old
configuration under the new one's name.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping, Optional
from urllib.parse import urlsplit

import httpx
from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_fixed

from envbisect.hosts import bounded_http, faults
from envbisect.errors import RemoteError
from envbisect.hosts.hostops import run_ops, unb64
from envbisect.inputs.playbook import Playbook, Service
from envbisect.hosts.transport import Transport


@dataclass(frozen=True)
class ServiceRestart:
    """What one co-restart proved about one service's process: the facts a verdict cites to show a
    trial ran the configuration it names (a baseline trial really ran the baseline). Pids and times
    are the host's; `started_after_stop_s` is measured on the host's boot clock, so no clock skew
    between controller and host enters it."""

    service: str
    host: str
    old_pid: int | None = None  # the process its pid file named before the stop (None: none running)
    old_gone: bool | None = None  # that process was gone after the stop (None: there was none to wait for)
    new_pid: int | None = None  # the process answering after the start
    started_after_stop_s: float | None = None  # its start time, in seconds after the stop began
    env_checked: tuple[str, ...] = ()  # keys of its /proc/PID/environ found holding the trial's values
    env_unchecked: str = ""  # why its environment could not be compared ("" when it was, or nothing to compare)
    proven: bool = False  # old process gone, a new process, its environment the trial's where readable
    problem: str = ""  # why not proven ("no pid_file ..." or the restart failure)

    def to_json(self) -> dict[str, Any]:
        return {"service": self.service, "host": self.host, "old_pid": self.old_pid, "old_gone": self.old_gone,
                "new_pid": self.new_pid, "started_after_stop_s": (None if self.started_after_stop_s is None
                                                                  else round(self.started_after_stop_s, 3)),
                "env_checked": list(self.env_checked), "env_unchecked": self.env_unchecked,
                "proven": self.proven, "problem": self.problem}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ServiceRestart":
        return cls(d["service"], d.get("host", ""), d.get("old_pid"), d.get("old_gone"), d.get("new_pid"),
                   d.get("started_after_stop_s"), tuple(d.get("env_checked") or ()), d.get("env_unchecked", ""),
                   bool(d.get("proven")), d.get("problem", ""))


@dataclass(frozen=True)
class RestartResult:
    ok: bool
    # "start-failure" (the config broke a service) | "infra" (not the config's fault) | "start-exit" (a
    # start command exited non-zero: either, as the run's evidence tells; trials/start_evidence.py)
    failure: str | None = None
    service: str | None = None
    message: str = ""
    durations: Mapping[str, float] = field(default_factory=dict)  # per service: start + health wait
    total_s: float = 0.0
    log_tail: str = ""
    # per service, in restart order, as far as the co-restart got: what it proved (ServiceRestart)
    services: tuple[ServiceRestart, ...] = ()


class _Died(Exception):
    pass


def split_url(url: str) -> tuple[str, int, str]:
    u = urlsplit(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    path = u.path or "/"
    if u.query:
        path += "?" + u.query
    return u.hostname or "127.0.0.1", port, path


def fetch(transport: Transport, url: str, timeout: float = 5.0, *, insecure: bool = False,
          max_body: int = bounded_http.EVIDENCE_MAX_BODY) -> bounded_http.Answer:
    """GET a URL as seen from the host (through its forward), within `timeout` seconds in all and
    `max_body` bytes; raises httpx.HTTPError (httpx.TimeoutException past the deadline)."""
    host, port, path = split_url(url)
    with transport.forward(host, port) as (h, p), bounded_http.client(insecure=insecure) as c:
        return _response(c, h, p, path, url, timeout, max_body)


def health_ok(transport: Transport, url: str, timeout: float = 5.0, *, insecure: bool = False) -> tuple[bool, str]:
    host, port, path = split_url(url)
    with transport.forward(host, port) as (h, p):
        return _get(h, p, path, url, timeout, insecure)


def _response(c: httpx.Client, h: str, p: int, path: str, url: str, timeout: float,
              max_body: int) -> bounded_http.Answer:
    u = urlsplit(url)
    return bounded_http.request(c, "GET", f"{u.scheme or 'http'}://{h}:{p}{path}", deadline_s=timeout,
                                max_body=max_body, headers={"Host": u.netloc}, sni_host=u.hostname)


def _get(h: str, p: int, path: str, url: str, timeout: float, insecure: bool = False) -> tuple[bool, str]:
    """Health as (ok, why) over an already open forward, within `timeout` seconds in all."""
    try:
        with bounded_http.client(insecure=insecure) as c:
            r = _response(c, h, p, path, url, timeout, bounded_http.HEALTH_MAX_BODY)
        return r.status_code == 200, f"HTTP {r.status_code}"
    except httpx.HTTPError as e:
        return False, bounded_http.describe(e, timeout)


Guard = Callable[[Optional[str]], None]


def stop_all(playbook: Playbook, transports: Mapping[str, Transport], timeout: float | None = None,
             guard: Guard | None = None) -> None:
    if guard:
        guard(None)  # compare-and-swap: every host still holds what envbisect made
    for name in reversed(playbook.restart.order):
        s = playbook.services[name]
        faults.before("stop")
        res = transports[s.host].run(s.stop, timeout=timeout or playbook.restart.command_timeout_s)
        if not res.ok:
            raise RemoteError(f"{name}: stop command failed: {res.stderr_line()}")


def log_tail(transport: Transport, service: Service, nbytes: int = 4096) -> str:
    if not service.log:
        return ""
    try:
        got = run_ops(transport, [{"op": "tail", "paths": [service.log], "bytes": nbytes}])[0]
    except RemoteError:
        return ""
    return (unb64(got.get(service.log)) or b"").decode("utf-8", "replace")


def start_one(playbook: Playbook, transports: Mapping[str, Transport], s: Service, *,
              timeout: float | None = None, poll: float | None = None, guard: Guard | None = None) -> RestartResult:
    t = transports[s.host]
    timeout = playbook.restart.health_timeout_s if timeout is None else timeout
    poll = playbook.restart.poll_interval_s if poll is None else poll
    t0 = time.monotonic()
    if guard:
        guard(s.host)
    faults.before("start")
    res = t.run(s.start, timeout=playbook.restart.command_timeout_s)
    if not res.ok:
        return RestartResult(False, "start-exit", s.name, f"{s.name}: start command failed: {res.stderr_line()}",
                             log_tail=log_tail(t, s))
    host, port, path = split_url(s.health)
    last = ["no answer"]
    with t.forward(host, port) as (fh, fp):
        def healthy() -> bool:
            # each check within its own deadline, never past the health timeout's end
            left = max(0.2, timeout - (time.monotonic() - t0))
            ok, why = _get(fh, fp, path, s.health, min(5.0, max(1.0, poll * 5), left), s.insecure)
            last[0] = why
            if ok:
                return True
            if s.pid_file:
                # A dead process is noticed at once, not at the health timeout.
                alive = run_ops(t, [{"op": "alive", "pid_files": [s.pid_file]}])[0]
                if alive.get(s.pid_file) is None:
                    raise _Died()
            return False

        try:
            Retrying(stop=stop_after_delay(timeout), wait=wait_fixed(poll),
                     retry=retry_if_result(lambda ok: not ok))(healthy)
        except _Died:
            return RestartResult(False, "start-failure", s.name, f"{s.name} died while starting",
                                 {s.name: time.monotonic() - t0}, log_tail=log_tail(t, s))
        except RetryError:
            return RestartResult(False, "start-failure", s.name,
                                 f"{s.name} not healthy after {timeout:.0f} s ({last[0]} from {s.health})",
                                 {s.name: time.monotonic() - t0}, log_tail=log_tail(t, s))
    return RestartResult(True, durations={s.name: time.monotonic() - t0})


# --- the proof that the processes were replaced -----------------------------------------------

@dataclass(frozen=True)
class _Before:
    """Per host, before the stop commands: the host's boot clock and the process of each pid file."""

    now_s: Mapping[str, float]  # host -> seconds since boot when the stop began
    procs: Mapping[str, Mapping[str, Any] | None]  # service -> {"pid", "ticks", "start_s"} or None


def _identify(playbook: Playbook, transports: Mapping[str, Transport],
              env_keys: Mapping[str, tuple[str, ...]] | None = None, names: tuple[str, ...] | None = None
              ) -> tuple[dict[str, float], dict[str, Mapping[str, Any] | None]]:
    """(host -> seconds since boot, service -> its pid file's live process or None), one round trip
    per host; `env_keys` (service -> keys): read those keys of each process's environment too."""
    now: dict[str, float] = {}
    procs: dict[str, Mapping[str, Any] | None] = {}
    chosen = [playbook.services[n] for n in (names or playbook.restart.order)]
    for host in dict.fromkeys(sv.host for sv in chosen):
        mine = [sv for sv in chosen if sv.host == host and sv.pid_file]
        if not mine:
            continue
        op = {"op": "proc_ids", "pid_files": sorted({sv.pid_file for sv in mine}),
              "env_keys": {sv.pid_file: list((env_keys or {}).get(sv.name, ())) for sv in mine}}
        got = run_ops(transports[host], [op])[0]
        now[host] = float(got["now_s"])
        for sv in mine:
            procs[sv.name] = got["procs"].get(sv.pid_file)
    return now, procs


def _wait_gone(playbook: Playbook, transports: Mapping[str, Transport], before: _Before) -> dict[str, float]:
    """Wait (on each host, up to restart.stop_wait_s) until every process named before the stop is
    gone; {service: pid} of those still running."""
    wait = playbook.restart.stop_wait_s
    left: dict[str, float] = {}
    for host in dict.fromkeys(playbook.services[n].host for n in playbook.restart.order):
        mine = {n: before.procs[n] for n in playbook.restart.order
                if playbook.services[n].host == host and before.procs.get(n)}
        if not mine:
            continue
        got = run_ops(transports[host], [{"op": "wait_gone", "timeout_s": wait,
                                          "procs": [[p["pid"], p["ticks"]] for p in mine.values()]}],
                      timeout=wait + 60)[0]
        still = {(int(a), int(b)) for a, b in got["left"]}
        for n, p in mine.items():
            if (p["pid"], p["ticks"]) in still:
                left[n] = p["pid"]
    return left


def _prove_new(playbook: Playbook, transports: Mapping[str, Transport], name: str, before: _Before,
               expect_env: Mapping[str, str | None]) -> ServiceRestart:
    """What the process answering for `name` after its start is: new, and running the trial's values."""
    s = playbook.services[name]
    old = before.procs.get(name)
    fact = ServiceRestart(name, s.host, old_pid=old["pid"] if old else None, old_gone=True if old else None)
    if not s.pid_file:
        return _replace(fact, problem=f"{name}: no pid_file in the playbook: the restart of its process is not proven")
    _, procs = _identify(playbook, transports, {name: tuple(sorted(expect_env))}, (name,))
    new = procs.get(name)
    if new is None:
        return _replace(fact, problem=f"{name}: healthy, but no live process in its pid file {s.pid_file} "
                                      "after the start")
    since = float(new["start_s"]) - before.now_s[s.host]
    fact = _replace(fact, new_pid=new["pid"], started_after_stop_s=since)
    if old is not None and (new["pid"], new["ticks"]) == (old["pid"], old["ticks"]):
        return _replace(fact, problem=f"{name} pid {new['pid']} answering after the start is the process from before "
                                      "the stop (the start command found it running and started nothing)")
    if since < 0:
        return _replace(fact, problem=f"{name} pid {new['pid']} answering after the start was started "
                                      f"{-since:.1f} s before the stop began: not a process this restart started")
    if not expect_env:
        return _replace(fact, proven=True)
    env = new.get("env")
    if env is None:
        return _replace(fact, proven=True, env_unchecked=new.get("env_why") or "its environment is not readable")
    wrong = sorted(k for k, v in expect_env.items() if env.get(k) != v)
    if wrong:
        # names only: the values may be secrets
        return _replace(fact, env_checked=tuple(sorted(set(expect_env) - set(wrong))),
                        problem=f"{name} pid {new['pid']} was started with {', '.join(wrong)} not as this trial sets "
                                f"{'them' if len(wrong) > 1 else 'it'} (/proc/{new['pid']}/environ): its start "
                                "command did not read the edited file")
    return _replace(fact, env_checked=tuple(sorted(expect_env)), proven=True)


def _replace(fact: ServiceRestart, **kw: Any) -> ServiceRestart:
    from dataclasses import replace

    return replace(fact, **kw)


def co_restart(playbook: Playbook, transports: Mapping[str, Transport], *,
               on_step: Callable[[str], None] | None = None, guard: Guard | None = None,
               expect_env: Mapping[str, Mapping[str, str | None]] | None = None,
               keep_survivors: Collection[int] = ()) -> RestartResult:
    """Stop every service (reverse order), wait for their processes to be gone, then start each in
    order, wait for its health and prove it is a new process (module docstring).
    `expect_env` (service -> key -> value, None: unset): what the trial's environment gives each
    service, compared with the new process's /proc/PID/environ where it can be read.
    `guard(host or None)` runs before the stops and before each start (compare-and-swap: it raises
    HostConflict when someone else changed a host; that is not a restart failure, it stops the run).
    `keep_survivors`: pids of the processes that ran before envbisect changed anything. When every
    process that outlives its stop is one of them, the other services are started anyway and it is
    left running. Only for putting the original back: the files are then what that old process
    already runs, so the stack ends as it was found; a trial never does this (it would probe a
    process of another configuration). The result is still a failure, naming the survivor."""
    t0 = time.monotonic()
    step = on_step or (lambda _msg: None)
    facts: dict[str, ServiceRestart] = {}

    def failed(failure: str | None, service: str | None, message: str, durations: Mapping[str, float],
               tail: str = "") -> RestartResult:
        return RestartResult(False, failure, service, message, durations, time.monotonic() - t0, tail,
                             tuple(facts[n] for n in playbook.restart.order if n in facts))

    durations: dict[str, float] = {}
    try:
        now, procs = _identify(playbook, transports)
        before = _Before(now, procs)
        step("stopping " + ", ".join(reversed(playbook.restart.order)))
        stop_all(playbook, transports, guard=guard)
        left = _wait_gone(playbook, transports, before)
        for n in playbook.restart.order:
            old = before.procs.get(n)
            facts[n] = ServiceRestart(n, playbook.services[n].host, old["pid"] if old else None,
                                      (n not in left) if old else None)
        if left:
            n = next(n for n in playbook.restart.order if n in left)
            wait = playbook.restart.stop_wait_s
            msg = (f"{n} pid {left[n]} still running {wait:g} s after its stop command "
                   f"({playbook.services[n].stop}); nothing was started")
            more = [f"{m} pid {left[m]}" for m in playbook.restart.order if m in left and m != n]
            facts[n] = _replace(facts[n], problem=msg)
            if not set(left.values()) <= set(keep_survivors):
                return failed("infra", n, msg + (f" (also still running: {', '.join(more)})" if more else ""), {})
            started = []
            for name in playbook.restart.order:
                if name in left:
                    continue
                step(f"starting {name} ({', '.join(f'{m} pid {left[m]}' for m in left)} left running)")
                r = start_one(playbook, transports, playbook.services[name], guard=guard)
                durations.update(r.durations)
                if not r.ok:
                    return failed(r.failure, r.service, r.message, durations, r.log_tail)
                started.append(name)
            kept = ", ".join(f"{m} pid {left[m]}" for m in playbook.restart.order if m in left)
            return failed("infra", n, f"{kept} never stopped ({wait:g} s after its stop command) and was left "
                          f"running, with the original files it already runs; started {', '.join(started) or 'none'}"
                          " around it", durations)
        for name in playbook.restart.order:
            step(f"starting {name}")
            r = start_one(playbook, transports, playbook.services[name], guard=guard)
            durations.update(r.durations)
            if not r.ok:
                return failed(r.failure, r.service, r.message, durations, r.log_tail)
            fact = _prove_new(playbook, transports, name, before, (expect_env or {}).get(name, {}))
            facts[name] = fact
            if not fact.proven and playbook.services[name].pid_file:
                return failed("infra", name, fact.problem, durations)
    except RemoteError as e:
        return failed("infra", None, str(e), durations)
    return RestartResult(True, durations=durations, total_s=time.monotonic() - t0,
                         services=tuple(facts[n] for n in playbook.restart.order))
