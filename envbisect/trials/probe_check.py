"""Is the probe a probe at all? Checked once against the running stack before any edit or restart.

A command probe that exits 126 (cannot execute) or 127 (not found), or an HTTP probe whose URL
cannot be reached for a reason outside the stack (its host name is unknown; a connection refused on
a host and port that no service of the playbook listens on), says nothing about the configuration:
counted as a failure, a typo would make the baseline "fail" and the verdict a false not-config. Such
a probe is refused here with one line (`ProbeBroken`, exit 2); at a trial, the runner marks it
`Cause.PROBE_BROKEN` and the bisection stops and restores (runs/bisect.py).
"""
from __future__ import annotations

from typing import Mapping, Sequence

from envbisect.errors import ProbeBroken, RemoteError
from envbisect.hosts.urls import split_url
from envbisect.hosts.transport import LocalTransport, Transport
from envbisect.inputs.playbook import LOCAL, Playbook, Probe
from envbisect.outcome import Outcome
from envbisect.trials.probe import ProbeRun, run_probe

# Run where the probe runs from: can the URL's host be resolved, and does its port accept a connection?
_REACH = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
except socket.gaierror as e:
    print("dns " + str(e))
    raise SystemExit(0)
try:
    socket.create_connection((host, port), 3).close()
    print("ok")
except ConnectionRefusedError as e:
    print("refused " + str(e))
except OSError as e:
    print("other " + str(e))
"""


def broken_line(probe: Probe, what: str, *, restored: bool) -> str:
    """The one line a broken probe stops a run with."""
    done = ("the run stops here and puts the hosts back as it found them" if restored
            else "nothing was changed or restarted")
    return (f"probe {probe.name!r} did not run, so it says nothing about the configuration: {what}; {done}. "
            "Fix the probe and run again")


def service_ports(playbook: Playbook) -> set[tuple[str, int]]:
    """(host as written, port) of every service's health URL: what "the stack" listens on."""
    out = set()
    for svc in playbook.services.values():
        if svc.health and "://" in svc.health:
            host, port, _ = split_url(svc.health)
            out.add((host, port))
    return out


def unreached(probe: Probe, runs: Sequence[ProbeRun], playbook: Playbook) -> str | None:
    """Why an HTTP probe's runs never reached the stack, or None: every request of every run was
    refused a connection on a port no service of the playbook listens on (a probe aimed at the wrong
    place, or at a client-side path that is down), so no request was ever answered by the stack."""
    if probe.kind == "command" or not probe.url or not runs:
        return None
    port = split_url(probe.url)[1]
    if port in {p for _h, p in service_ports(playbook)}:
        return None
    recs = [q for r in runs for q in r.requests]
    if recs and all(q.status is None and "ConnectError" in (q.error or "") and "refused" in (q.error or "").lower()
                    for q in recs):
        return (f"{probe.url}: connection refused on port {port}, which no service of the playbook listens on "
                f"({recs[0].error})")
    return None


def refuse_broken_probe(probe: Probe, playbook: Playbook, transports: Mapping[str, Transport]) -> None:
    """Raise `ProbeBroken` when the probe cannot reach the stack at all, seen without any edit or
    restart: a command probe is run once against the running stack (exit 126/127 means stop);
    an HTTP probe's host must resolve where the probe runs from, and a refused connection is
    only the stack's answer when one of its services listens on that port."""
    if probe.kind == "command":
        r = run_probe(probe, transports)
        if r.outcome is Outcome.BROKEN:
            raise ProbeBroken(broken_line(probe, f"`{probe.command}` gave {r.reason}", restored=False))
        return
    if not probe.url:
        return
    transport = transports.get(probe.vantage) if probe.vantage != LOCAL else None
    transport = transport or LocalTransport()
    # a promql probe's Prometheus server is never part of the stack: a refusal there is the probe's
    urls = [(probe.url, False)] + ([(probe.prometheus, True)] if probe.kind == "promql" and probe.prometheus else [])
    for url, outside in urls:
        host, port, _ = split_url(url)
        try:
            res = transport.run_python(_REACH, host, str(port), timeout=15)
        except RemoteError:
            return  # the vantage host itself is the trouble: the trials report that as infrastructure
        said = res.stdout.decode("utf-8", "replace").strip()
        where = "this machine" if probe.vantage == LOCAL else probe.vantage
        if said.startswith("dns "):
            raise ProbeBroken(broken_line(probe, f"{url}: the host name {host!r} is unknown on {where} "
                                                 f"({said[4:]})", restored=False))
        ports = set() if outside else {p for _h, p in service_ports(playbook)}
        if said.startswith("refused ") and port not in ports:
            raise ProbeBroken(broken_line(probe, f"{url}: connection refused on {host}:{port} from {where}, "
                                                 + ("the Prometheus server is not there" if outside else
                                                    "which is no service of the playbook (no health URL there)"),
                                          restored=False))


__all__ = ["refuse_broken_probe", "broken_line", "service_ports", "unreached"]
