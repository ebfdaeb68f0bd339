"""Collect a snapshot over the transports: the agent script (envbisect/hosts/agent/collect.py) runs
on every host in one round trip and its answer becomes the typed state (envbisect.state.snapshot)."""
from __future__ import annotations

import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping

from envbisect.errors import ConnectionFailed, EnvbisectError
from envbisect.hosts.agent_calls import run_agent, run_agent_on_each
from envbisect.hosts.transport import Transport
from envbisect.inputs.playbook import Playbook
from envbisect.state.snapshot import HostState, Snapshot, host_state_from_raw, new_snapshot_id


def collect_request(playbook: Playbook, host: str, *, since: float | None = None,
                    log_from: Mapping[str, str] | None = None, clock_only: bool = False,
                    keep_sourced: Mapping[str, list[str]] | None = None,
                    keep_dirty: Mapping[str, list[str]] | None = None) -> dict[str, Any]:
    """What the collector on `host` is asked for. `keep_sourced`: env file -> files a baseline saw it
    source (state/sourced.keep_sourced), snapshotted even if no longer sourced. `keep_dirty`: repo ->
    files a baseline saw dirty there, snapshotted even if clean now."""
    services = playbook.services_on(host)
    return {
        "max_size": playbook.max_file_size,
        "env_files": [s.env_file for s in services],
        "watch": list(playbook.watch_paths.get(host, ())) + start_scripts(playbook, host),
        "repos": [{"path": r.path, "log_from": (log_from or {}).get(r.path),
                   "keep": list((keep_dirty or {}).get(r.path, ()))} for r in playbook.repos_on(host)],
        "processes": [{"service": s.name, "pid_file": s.pid_file, "env_file": s.env_file} for s in services],
        "since": since,
        "backups": list(playbook.backups),
        "clock_only": clock_only,
        "keep_sourced": {e: list(ps) for e, ps in (keep_sourced or {}).items()},
        "packages": list(ENGINE_PACKAGES),
    }


# The distributions whose versions each service's interpreter is snapshotted with (a `pip install -U` of
# one is a change no file shows): the engine, its kernels and router, and what they stand on.
ENGINE_PACKAGES = ("sglang", "sgl-kernel", "sglang-router", "torch", "flashinfer-python", "transformers",
                   "mooncake-transfer-engine", "nixl", "vllm")


# Programs a package manager installs: what a start command runs from here is no deployment's script.
_SYSTEM_DIRS = ("/bin/", "/sbin/", "/usr/bin/", "/usr/sbin/", "/usr/lib/", "/usr/libexec/")


def start_scripts(playbook: Playbook, host: str) -> list[str]:
    """The scripts the services' start commands run (an absolute first word outside the system's
    program folders) that no [watch] path covers: a change in one is a change of how the service
    starts, so it is snapshotted as a watched file of its own, in the same round trip."""
    roots = [r.rstrip("/") for r in playbook.watch_paths.get(host, ())]
    out: list[str] = []
    for s in playbook.services_on(host):
        try:
            words = shlex.split(s.start)
        except ValueError:
            continue
        first = words[0] if words else ""
        if not first.startswith("/") or first.startswith(_SYSTEM_DIRS) or first in out:
            continue
        if not any(first == r or first.startswith(r + "/") for r in roots):
            out.append(first)
    return out


def _env_files(playbook: Playbook, host: str) -> dict[str, str]:
    return {s.name: s.env_file for s in playbook.services_on(host)}


def collect_host(playbook: Playbook, host: str, transport: Transport, *, since: float | None = None,
                 log_from: Mapping[str, str] | None = None, clock_only: bool = False,
                 keep_sourced: Mapping[str, list[str]] | None = None,
                 keep_dirty: Mapping[str, list[str]] | None = None) -> HostState:
    """One round trip: run the collector on `host` and parse what it saw (see `collect_request`)."""
    req = collect_request(playbook, host, since=since, log_from=log_from, clock_only=clock_only,
                          keep_sourced=keep_sourced, keep_dirty=keep_dirty)
    raw = run_agent(transport, "collect.py", req, what="snapshot collector")
    return host_state_from_raw(host, raw, _env_files(playbook, host))


def for_each_host(playbook: Playbook, transports: Mapping[str, Transport],
                  fn: Callable[[str, Transport], Any]) -> dict[str, Any]:
    """Run fn on every host in parallel; the first EnvbisectError wins (hosts are independent)."""
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(transports)))) as pool:
        futures = {h: pool.submit(fn, h, transports[h]) for h in playbook.hosts}
        out = {}
        for h, fut in futures.items():
            try:
                out[h] = fut.result()
            except EnvbisectError:
                raise
            except OSError as e:
                raise ConnectionFailed(f"{h}: {e}") from None
        return out


def take_snapshot(playbook: Playbook, transports: Mapping[str, Transport], *, label: str | None = None,
                  since_by_host: Mapping[str, float] | None = None,
                  log_from: Mapping[str, Mapping[str, str]] | None = None,
                  keep_sourced: Mapping[str, Mapping[str, list[str]]] | None = None,
                  keep_dirty: Mapping[str, Mapping[str, list[str]]] | None = None) -> Snapshot:
    """Every host's state, one round trip per host: all the requests go out at once, then this
    thread reads the answers as they come (run_agent_on_each)."""
    now = time.time()
    requests = {h: collect_request(playbook, h, since=(since_by_host or {}).get(h), log_from=(log_from or {}).get(h),
                                   keep_sourced=(keep_sourced or {}).get(h), keep_dirty=(keep_dirty or {}).get(h))
                for h in playbook.hosts}
    raws = run_agent_on_each(transports, "collect.py", requests, what="snapshot collector")
    states = {h: host_state_from_raw(h, raw, _env_files(playbook, h)) for h, raw in raws.items()}
    return Snapshot(id=new_snapshot_id(label, now), label=label, taken_at=now, playbook=playbook.name, hosts=states)
