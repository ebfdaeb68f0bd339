"""TEST ONLY: kill this controller with SIGKILL right before its Nth host mutation of a kind.

    ENVBISECT_TEST_CRASH_AT=write:2      # before the 2nd file write (also: checkout, stop, start, journal)

Used by tests/test_fault_injection.py to prove that `envbisect restore` undoes a run killed at any
mutation point. Unset (always, in real use) it costs one environment lookup per mutation.
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Sequence

VAR = "ENVBISECT_TEST_CRASH_AT"
KINDS = ("write", "checkout", "stop", "start", "journal")
_counts: dict[str, int] = {}
_lock = threading.Lock()


def crash_index(kinds: Sequence[str | None]) -> int | None:
    """Count the mutations about to be sent (in order; None = not a mutation); the index of the one
    the hook says to die before, else None. The caller sends the ones before it, then calls kill()."""
    spec = os.environ.get(VAR)
    if not spec:
        return None
    with _lock:
        for i, kind in enumerate(kinds):
            if kind is None:
                continue
            _counts[kind] = _counts.get(kind, 0) + 1
            if spec == f"{kind}:{_counts[kind]}":
                return i
    return None


def before(kind: str) -> None:
    """Right before one mutation of `kind` is sent."""
    if crash_index([kind]) is not None:
        kill()


def kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
