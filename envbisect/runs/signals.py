"""Signals while a run holds the hosts: SIGTERM is made to behave like Ctrl-C, so both end a run
through its restore; while the hosts are being put back, a first signal is noted, not obeyed.
Used by every command that edits hosts (runs/bisect.py, runs/fleet.py, runs/revert.py).

The first signal interrupts; a signal after it, before the restore has begun (two SIGTERMs a few
ms apart, one to the process group and one to the process, or a quick double Ctrl-C), is held and
counted by the restore as the one it notes, so it can never skip the restore.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable, Iterator

# the run in progress: whether its first signal has interrupted it, and the signals held since
_latch = {"interrupted": False, "held": 0}


def install_signal_handlers() -> Callable[[], None]:
    """SIGTERM behaves like Ctrl-C (KeyboardInterrupt), so both restore the hosts; a signal after
    the first is held for the restore (`shield_signals`). Returns what puts the old handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    saved = dict(_latch)
    _latch.update(interrupted=False, held=0)

    def on_signal(signum, frame):  # noqa: ANN001
        if _latch["interrupted"]:
            _latch["held"] += 1
            return
        _latch["interrupted"] = True
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise KeyboardInterrupt(f"signal {signum}")

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

    def stop() -> None:
        for s, h in old.items():
            signal.signal(s, h)
        _latch.update(saved)

    return stop


@contextlib.contextmanager
def shield_signals(say: Callable[[str], None]) -> Iterator[None]:
    """While the hosts are being put back: a first Ctrl-C or SIGTERM is noted, not obeyed (an
    interrupted restore leaves hosts half-restored); a second one interrupts (the journal is kept).
    Signals held since the run's first one count here."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen = [0] * _latch["held"]
    _latch["held"] = 0
    note = "putting the hosts back first; signal again to abandon that (the journal is kept for `envbisect restore`)"

    def on_signal(signum, frame):  # noqa: ANN001
        seen.append(signum)
        if len(seen) > 1:
            raise KeyboardInterrupt(f"signal {signum} during restore")
        say(note)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if len(seen) > 1:
            raise KeyboardInterrupt("signals during restore")
        if seen:
            say(note)
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


__all__ = ["install_signal_handlers", "shield_signals"]
