"""Signals while a run holds the hosts: SIGTERM is made to behave like Ctrl-C, so both end a run
through its restore; while the hosts are being put back, a first signal is noted, not obeyed.
Used by every command that edits hosts (runs/bisect.py, runs/fleet.py, runs/revert.py).
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable, Iterator


def install_signal_handlers() -> Callable[[], None]:
    """SIGTERM behaves like Ctrl-C (KeyboardInterrupt), so both restore the hosts."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_term(signum, frame):  # noqa: ANN001
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, on_term)
    return lambda: signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def shield_signals(say: Callable[[str], None]) -> Iterator[None]:
    """While the hosts are being put back: a first Ctrl-C or SIGTERM is noted, not obeyed (an
    interrupted restore leaves hosts half-restored); a second one interrupts (the journal is kept)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen = []

    def on_signal(signum, frame):  # noqa: ANN001
        seen.append(signum)
        if len(seen) > 1:
            raise KeyboardInterrupt(f"signal {signum} during restore")
        say("putting the hosts back first; signal again to abandon that (the journal is kept for `envbisect restore`)")

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


__all__ = ["install_signal_handlers", "shield_signals"]
