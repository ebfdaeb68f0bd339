"""Full, ordered co-restart: stop in reverse order, start in order, each healthy before the next.

Why all of them: after replacing prefill or decode alone, both can report ready while requests
hang until both are restarted. Why health is not the verdict: a PD worker's /health does not
exercise the prefill->decode transfer and a router's /health is liveness only; the probe decides.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional
from urllib.parse import urlsplit

import httpx
from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_fixed

from envbisect.hosts import faults
from envbisect.errors import RemoteError
from envbisect.hosts.hostops import run_ops, unb64
from envbisect.inputs.playbook import Playbook, Service
from envbisect.hosts.transport import Transport


@dataclass(frozen=True)
class RestartResult:
    ok: bool
    failure: str | None = None  # "start-failure" (the config broke a service) | "infra" (not the config's fault)
    service: str | None = None
    message: str = ""
    durations: Mapping[str, float] = field(default_factory=dict)  # per service: start + health wait
    total_s: float = 0.0
    log_tail: str = ""


class _Died(Exception):
    pass


def split_url(url: str) -> tuple[str, int, str]:
    u = urlsplit(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    path = u.path or "/"
    if u.query:
        path += "?" + u.query
    return u.hostname or "127.0.0.1", port, path


def fetch(transport: Transport, url: str, timeout: float = 5.0) -> httpx.Response:
    """GET a URL as seen from the host (through its forward); raises httpx.HTTPError."""
    host, port, path = split_url(url)
    with transport.forward(host, port) as (h, p):
        return _response(h, p, path, url, timeout)


def health_ok(transport: Transport, url: str, timeout: float = 5.0) -> tuple[bool, str]:
    host, port, path = split_url(url)
    with transport.forward(host, port) as (h, p):
        return _get(h, p, path, url, timeout)


def _response(h: str, p: int, path: str, url: str, timeout: float) -> httpx.Response:
    scheme = urlsplit(url).scheme or "http"
    return httpx.get(f"{scheme}://{h}:{p}{path}", timeout=timeout, headers={"Host": urlsplit(url).netloc}, verify=False)


def _get(h: str, p: int, path: str, url: str, timeout: float) -> tuple[bool, str]:
    """Health as (ok, why) over an already open forward."""
    try:
        r = _response(h, p, path, url, timeout)
        return r.status_code == 200, f"HTTP {r.status_code}"
    except httpx.HTTPError as e:
        return False, type(e).__name__


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
        return RestartResult(False, "infra", s.name, f"{s.name}: start command failed: {res.stderr_line()}",
                             log_tail=log_tail(t, s))
    host, port, path = split_url(s.health)
    last = ["no answer"]
    with t.forward(host, port) as (fh, fp):
        def healthy() -> bool:
            ok, why = _get(fh, fp, path, s.health, timeout=min(5.0, max(1.0, poll * 5)))
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


def co_restart(playbook: Playbook, transports: Mapping[str, Transport], *,
               on_step: Callable[[str], None] | None = None, guard: Guard | None = None) -> RestartResult:
    """Stop every service (reverse order), then start each in order and wait for its health.
    `guard(host or None)` runs before the stops and before each start (compare-and-swap: it raises
    HostConflict when someone else changed a host; that is not a restart failure, it stops the run)."""
    t0 = time.monotonic()
    step = on_step or (lambda _msg: None)
    try:
        step("stopping " + ", ".join(reversed(playbook.restart.order)))
        stop_all(playbook, transports, guard=guard)
        durations: dict[str, float] = {}
        for name in playbook.restart.order:
            step(f"starting {name}")
            r = start_one(playbook, transports, playbook.services[name], guard=guard)
            durations.update(r.durations)
            if not r.ok:
                return RestartResult(False, r.failure, r.service, r.message, durations, time.monotonic() - t0, r.log_tail)
    except RemoteError as e:
        return RestartResult(False, "infra", None, str(e), {}, time.monotonic() - t0)
    return RestartResult(True, durations=durations, total_s=time.monotonic() - t0)
