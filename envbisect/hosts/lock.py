"""The deployment lock's holder: who a lock record names (`controller_id`), whether that holder is
provably gone (`holder_gone_here`), how it is described to the operator (`describe_holder`), and the
heartbeat that keeps a held lock fresh (`Heartbeat`). Taking and releasing the lock on the hosts is
`HostEditor.lock`'s (journal.py): it is refused over another run's active journal.
"""
from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

from envbisect.errors import LockLost
from envbisect.hosts.agent_calls import run_ops
from envbisect.hosts.transport import Transport

HEARTBEAT_S = 20.0  # the lock holder refreshes its lock this often
STALE_AFTER_S = 300.0  # a lock of another controller with no heartbeat for this long is stale


def boot_id() -> str:
    """This machine's boot id ("" where there is none): with the host name, it says whether a pid in a
    lock record is a pid of this machine, this boot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def pid_namespace() -> str:
    """This process's pid namespace (`pid:[4026531836]`; "" where it cannot be read). A container that
    shares the machine's host name and boot id has pids of its own: a pid means something only in the
    namespace that gave it out."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def controller_id() -> dict[str, Any]:
    return {"controller": socket.gethostname(), "boot_id": boot_id(), "pid_ns": pid_namespace(), "pid": os.getpid()}


def holder_gone_here(held: Mapping[str, Any]) -> bool:
    """A lock holder is provably gone when its record names this machine, this boot and this pid
    namespace, and its pid is not running here. Any other record (another machine, a container with
    pids of its own, an older record without a namespace) is judged by its heartbeat alone. Only the
    controller can tell: on a host, the controller's pid means nothing."""
    me = controller_id()
    if not me["boot_id"] or not me["pid_ns"] or any(held.get(k) != me[k] for k in ("controller", "boot_id", "pid_ns")):
        return False
    try:
        pid = int(held.get("pid"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    if pid <= 0 or pid == me["pid"]:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False


def describe_holder(held: Mapping[str, Any], age_s: float | None) -> str:
    """The controller and pid a lock record names, and how old its heartbeat is."""
    beat = f", last heartbeat {int(age_s)} s ago" if age_s is not None else ""
    return f"controller {held.get('controller')}, pid {held.get('pid')}{beat}"



class Heartbeat:
    """Refreshes the lock on every host every `interval` s while the run holds it (each refresh is
    `refresh_op`, which also asserts the lock is still the run's); a lock broken by someone else is
    passed to `on_lost` (the next mutation batch then stops the run)."""

    def __init__(self, transports: Mapping[str, Transport], refresh_op: Mapping[str, Any],
                 on_lost: Callable[[str], None], interval: float, name: str):
        self.transports, self.refresh_op, self.on_lost = transports, dict(refresh_op), on_lost
        self.interval = interval
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop_event.wait(self.interval):
            for _h, t in list(self.transports.items()):
                if self.stop_event.is_set():
                    return
                try:
                    run_ops(t, [dict(self.refresh_op)], timeout=max(10.0, self.interval))
                except LockLost as e:
                    self.on_lost(str(e))
                except Exception:  # noqa: BLE001 - a lost connection is the main thread's business
                    pass

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=30)
