"""Ordered co-restart: stop in reverse order, start in order, each start group healthy before the next.

`[restart] order` lists services and start groups (`[["prefill", "decode"], "router"]`): a group's
services start at once, and the next group starts when every one of them is healthy and proven
new; stop is the reverse, group by group. A trial's restart plan (trials/restart_plan.py) may
restart fewer services (`co_restart(only=...)`); what it restarts follows the same order.

Why the engines together: after replacing prefill or decode alone, both can report ready while
requests hang until both are restarted. Why health is not the verdict: a PD worker's /health does not
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

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping, Optional

from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_fixed

from envbisect.hosts import faults
from envbisect.errors import RemoteError
from envbisect.hosts.agent_calls import run_ops, unb64
from envbisect.inputs.playbook import Playbook, Service
from envbisect.hosts.transport import Transport
from envbisect.hosts.urls import forwarded_health as _get, split_url


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


class _Cancelled(Exception):
    pass


Guard = Callable[[Optional[str]], None]


def stop_all(playbook: Playbook, transports: Mapping[str, Transport], timeout: float | None = None,
             guard: Guard | None = None, names: Collection[str] | None = None) -> None:
    """Stop the services (`names`, default all) in the reverse of the start order: the last group
    first, and within a group the reverse of the order it lists them in."""
    if guard:
        guard(None)  # compare-and-swap: every host still holds what envbisect made
    for name in reversed(playbook.restart.order):
        if names is not None and name not in names:
            continue
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
              timeout: float | None = None, poll: float | None = None, guard: Guard | None = None,
              cancel: threading.Event | None = None) -> RestartResult:
    """Run `s`'s start command and wait for its health. `cancel` set (a sibling of its start group
    failed) ends the wait at once, as a failure naming no cause of its own."""
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
            if cancel is not None and cancel.is_set():
                raise _Cancelled()
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
            Retrying(stop=stop_after_delay(timeout), wait=wait_fixed(poll), retry=retry_if_result(lambda ok: not ok),
                     sleep=cancel.wait if cancel is not None else time.sleep)(healthy)
        except _Cancelled:
            return RestartResult(False, None, s.name, f"{s.name}: its health wait was stopped",
                                 {s.name: time.monotonic() - t0})
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


def _wait_gone(playbook: Playbook, transports: Mapping[str, Transport], before: _Before,
               order: tuple[str, ...]) -> dict[str, float]:
    """Wait (on each host, up to restart.stop_wait_s) until every process named before the stop is
    gone; {service: pid} of those still running."""
    wait = playbook.restart.stop_wait_s
    left: dict[str, float] = {}
    for host in dict.fromkeys(playbook.services[n].host for n in order):
        mine = {n: before.procs[n] for n in order
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
               keep_survivors: Collection[int] = (), only: Collection[str] | None = None,
               best_effort: bool = False) -> RestartResult:
    """Stop every service (reverse order, group by group), wait for their processes to be gone, then
    start each start group at once, wait until all its services are healthy and prove each is a new
    process (module docstring) before the next group starts. `only`: restart just these services
    (a trial's restart plan, runs/restart_plan.py); the others are left running untouched.
    `expect_env` (service -> key -> value, None: unset): what the trial's environment gives each
    service, compared with the new process's /proc/PID/environ where it can be read.
    `guard(host or None)` runs before the stops and before each group's starts (compare-and-swap: it
    raises HostConflict when someone else changed a host; that is not a restart failure, it stops the run).
    `keep_survivors`: pids of the processes that ran before envbisect changed anything. When every
    process that outlives its stop is one of them, the other services are started anyway and it is
    left running. Only for putting the original back: the files are then what that old process
    already runs, so the stack ends as it was found; a trial never does this (it would probe a
    process of another configuration). The result is still a failure, naming the survivor.
    `best_effort`: a group that fails to start does not stop the later groups (putting the original
    back starts every service it can; a trial stops at the first failure); the result is the first
    failure, and `service_states` says each service's state."""
    t0 = time.monotonic()
    step = on_step or (lambda _msg: None)
    order = tuple(n for n in playbook.restart.order if only is None or n in only)
    groups = tuple(g for g in (tuple(n for n in grp if n in order) for grp in playbook.restart.start_groups) if g)
    facts: dict[str, ServiceRestart] = {}
    durations: dict[str, float] = {}

    def failed(r: RestartResult) -> RestartResult:
        return RestartResult(False, r.failure, r.service, r.message, durations, time.monotonic() - t0, r.log_tail,
                             tuple(facts[n] for n in order if n in facts))

    try:
        now, procs = _identify(playbook, transports, names=order)
        before = _Before(now, procs)
        step("stopping " + ", ".join(reversed(order)))
        stop_all(playbook, transports, guard=guard, names=order)
        left = _wait_gone(playbook, transports, before, order)
        for n in order:
            old = before.procs.get(n)
            facts[n] = ServiceRestart(n, playbook.services[n].host, old["pid"] if old else None,
                                      (n not in left) if old else None)
        if left:
            return failed(_survivors(playbook, transports, groups, left, keep_survivors, facts, durations,
                                     guard, step))
        first_bad: RestartResult | None = None
        for group in groups:
            bad = _start_group(playbook, transports, group, facts, durations, guard, step,
                               (before, expect_env or {}))
            if bad is not None and not best_effort:
                return failed(bad)
            first_bad = first_bad or bad
        if first_bad is not None:
            return failed(first_bad)
    except RemoteError as e:
        return failed(RestartResult(False, "infra", None, str(e)))
    return RestartResult(True, durations=durations, total_s=time.monotonic() - t0,
                         services=tuple(facts[n] for n in order))


def service_states(rs: RestartResult) -> str:
    """Each service's state after a co-restart, in restart order: "a: running (pid 12); bad: not up
    (why)"; a service whose start ran but never became healthy may be running, unhealthy."""
    def one(f: ServiceRestart) -> str:
        if f.new_pid is not None:
            return f"{f.service}: running (pid {f.new_pid})"
        return f"{f.service}: not up ({f.problem})" if f.problem else f"{f.service}: not started"
    return "; ".join(one(f) for f in rs.services)


def _survivors(playbook: Playbook, transports: Mapping[str, Transport], groups: tuple[tuple[str, ...], ...],
               left: Mapping[str, float], keep_survivors: Collection[int], facts: dict[str, ServiceRestart],
               durations: dict[str, float], guard: Guard | None, step: Callable[[str], None]) -> RestartResult:
    """Some process outlived its stop: nothing is started, unless every survivor is an original
    process kept on purpose (co_restart's `keep_survivors`); then the others start around it."""
    order = [n for g in groups for n in g]
    n = next(n for n in order if n in left)
    wait = playbook.restart.stop_wait_s
    msg = (f"{n} pid {left[n]} still running {wait:g} s after its stop command "
           f"({playbook.services[n].stop}); nothing was started")
    more = [f"{m} pid {left[m]}" for m in order if m in left and m != n]
    facts[n] = _replace(facts[n], problem=msg)
    if not set(left.values()) <= set(keep_survivors):
        return RestartResult(False, "infra", n, msg + (f" (also still running: {', '.join(more)})" if more else ""))
    started = []
    for group in groups:
        rest = tuple(m for m in group if m not in left)
        if not rest:
            continue
        kept = ", ".join(f"{m} pid {left[m]}" for m in left)
        bad = _start_group(playbook, transports, rest, facts, durations, guard,
                           lambda msg: step(f"{msg} ({kept} left running)"), None)
        if bad is not None:
            return bad
        started += rest
    kept = ", ".join(f"{m} pid {left[m]}" for m in order if m in left)
    return RestartResult(False, "infra", n, f"{kept} never stopped ({wait:g} s after its stop command) and was left "
                         f"running, with the original files it already runs; started {', '.join(started) or 'none'}"
                         " around it")


def _start_group(playbook: Playbook, transports: Mapping[str, Transport], group: tuple[str, ...],
                 facts: dict[str, ServiceRestart], durations: dict[str, float], guard: Guard | None,
                 step: Callable[[str], None],
                 proof: tuple[_Before, Mapping[str, Mapping[str, str | None]]] | None) -> RestartResult | None:
    """Start a group's services at once and wait until every one is healthy (and, with `proof`,
    proven a new process running the trial's environment). The first failure stops the siblings'
    waits; None when all are up. Each service's own result lands in `facts` (its problem, if any)."""
    if guard:
        for host in dict.fromkeys(playbook.services[n].host for n in group):
            guard(host)
    step("starting " + " + ".join(group))
    cancel = threading.Event()

    def one(name: str) -> tuple[RestartResult, ServiceRestart | None]:
        try:
            r = start_one(playbook, transports, playbook.services[name], cancel=cancel)
            fact = None
            if r.ok and proof is not None:
                fact = _prove_new(playbook, transports, name, proof[0], proof[1].get(name, {}))
                if not fact.proven and playbook.services[name].pid_file:
                    r = RestartResult(False, "infra", name, fact.problem, r.durations)
            if not r.ok:
                cancel.set()
            return r, fact
        except BaseException:
            cancel.set()
            raise

    if len(group) == 1:
        results = [one(group[0])]
    else:
        with ThreadPoolExecutor(max_workers=len(group), thread_name_prefix="start") as pool:
            futures = [pool.submit(one, n) for n in group]
        results = [f.result() for f in futures]
    for name, (r, fact) in zip(group, results):
        durations.update(r.durations)
        if fact is not None:
            facts[name] = fact
        if not r.ok:
            facts[name] = _replace(facts[name], problem=r.message)
    bad = [r for r, _ in results if not r.ok]
    if not bad:
        return None
    first = next((r for r in bad if r.failure is not None), bad[0])
    others = [r.message for r in bad if r is not first]
    return RestartResult(False, first.failure, first.service,
                         first.message + (f" ({'; '.join(others)})" if others else ""), log_tail=first.log_tail)
