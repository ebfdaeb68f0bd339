"""Loopback ports for simulated services, handed out so two never get the same one.

A port found by binding port 0 and closing the socket comes from the kernel's ephemeral range, the
same range every outgoing connection's source port is drawn from. A simulated service that binds
it seconds later (and again at every co-restart) can find it taken by a client connection or by a
concurrent test's service: "Address already in use". So ports here come from below the ephemeral
range (`/proc/sys/net/ipv4/ip_local_port_range`), handed out in turn from one counter that every
process on the machine shares through a locked file, and each is checked free by a bind before it
is given. A port comes round again only after the whole range has been handed out.
"""
from __future__ import annotations

import fcntl
import os
import socket
import tempfile
from pathlib import Path

FIRST_PORT = 10000  # below: the well-known and registered ports that local daemons tend to hold
MIN_SPAN = 2000


def port_range() -> range:
    """The loopback ports to hand out: below the ephemeral range when there is room, else above it."""
    try:
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        lo, hi = 32768, 60999
    if lo - FIRST_PORT >= MIN_SPAN:
        return range(FIRST_PORT, lo)
    if 65535 - hi >= MIN_SPAN:
        return range(hi + 1, 65536)
    return range(FIRST_PORT, 65536)  # no room outside it: the bind check below still holds


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int) -> list[int]:
    """`n` distinct loopback ports that are free now and were not handed out recently."""
    ports = port_range()
    counter = Path(tempfile.gettempdir()) / f"envbisect-sim-ports-{ports.start}-{ports.stop}"
    fd = os.open(counter, os.O_RDWR | os.O_CREAT, 0o666)
    with os.fdopen(fd, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            at = int(f.read().strip() or ports.start)
        except ValueError:
            at = ports.start
        out: list[int] = []
        for _ in range(len(ports)):
            port = ports.start + (at - ports.start) % len(ports)
            at = port + 1
            if _bindable(port):
                out.append(port)
                if len(out) == n:
                    break
        f.seek(0)
        f.truncate()
        f.write(str(at))
    if len(out) < n:
        raise OSError(f"no {n} free loopback ports in {ports.start}-{ports.stop - 1}")
    return out


def free_port() -> int:
    return free_ports(1)[0]


__all__ = ["free_port", "free_ports", "port_range"]
