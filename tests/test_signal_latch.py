"""Signals while a run holds the hosts (runs/signals.py), in this process (pure: no hosts).

The first Ctrl-C or SIGTERM ends the run through its restore. A second one that comes before the
restore has begun (two SIGTERMs a few ms apart: a process group's and the unit's own, or a
double Ctrl-C) must not skip the restore: it counts as the signal the restore notes, not obeys.
A blind red-team's double SIGTERM 2-3 ms apart left decode and the router down with the trial's
files in place and no word of `envbisect restore`."""
from __future__ import annotations

import os
import signal
import time

import pytest

from envbisect.runs.signals import install_signal_handlers, shield_signals


def _signal_self(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.05)  # the handler runs in this (main) thread at the next instruction


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_before_the_restore_begins_is_noted_by_it_not_obeyed(sig):
    said: list[str] = []
    restored = []
    stop = install_signal_handlers()
    try:
        with pytest.raises(KeyboardInterrupt):
            _signal_self(sig)
        _signal_self(sig)  # between the interrupt and the restore: must not raise
        with shield_signals(said.append):
            restored.append("files")
            restored.append("co-restart")
        assert restored == ["files", "co-restart"]
        assert len(said) == 1 and "putting the hosts back first" in said[0]
    finally:
        stop()


def test_a_third_signal_abandons_the_restore_and_the_latch_ends_with_the_run():
    stop = install_signal_handlers()
    try:
        with pytest.raises(KeyboardInterrupt):
            _signal_self(signal.SIGTERM)
        _signal_self(signal.SIGTERM)
        _signal_self(signal.SIGTERM)  # two more before the restore: abandon it, the journal stays
        with pytest.raises(KeyboardInterrupt):
            with shield_signals(lambda _m: None):
                pytest.fail("the restore ran after a third signal")
    finally:
        stop()
    # after the run, Ctrl-C is Python's own again
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        _signal_self(signal.SIGINT)


def test_one_signal_during_the_restore_is_noted_and_a_second_abandons_it():
    said: list[str] = []
    stop = install_signal_handlers()
    try:
        with pytest.raises(KeyboardInterrupt):
            _signal_self(signal.SIGTERM)
        with pytest.raises(KeyboardInterrupt):
            with shield_signals(said.append):
                _signal_self(signal.SIGTERM)
                assert len(said) == 1
                _signal_self(signal.SIGTERM)
                pytest.fail("a second signal during the restore did not abandon it")
    finally:
        stop()
