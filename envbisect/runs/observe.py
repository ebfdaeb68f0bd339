"""`snapshot --probe P`: probe the stack as it runs (no edit, no restart) and say what was seen, so a
snapshot is an *observed* known-good (or not), and `--since last-good` can pick one.

The probing is the trial runner's own (trials/runner.probe_repeatedly for a pass/fail probe,
trials/perf_trial.judge for a perf probe, as the runner's probe of the running stack does); what is not
here is an editor: nothing is edited, so nothing is journaled or locked. Whether the processes
verifiably run the files the snapshot recorded is the bisection's own test
(runs/plan.running_stack_unverified); when they may not, the result says so.
"""
from __future__ import annotations

import time
from typing import Mapping

from envbisect.errors import RemoteError
from envbisect.hosts.transport import Transport
from envbisect.inputs.playbook import Playbook, Probe
from envbisect.outcome import Outcome
from envbisect.state.deltas import compute_diff
from envbisect.state.snapshot import ObservedProbe, Snapshot


def observe_running(playbook: Playbook, transports: Mapping[str, Transport], snap: Snapshot,
                    probe: Probe) -> ObservedProbe:
    """Probe the running stack once (a pass/fail probe: its `repeat` runs, stopping at the first
    failure; a perf probe: a reference's worth of samples). A probe that cannot tell (exit 125, an
    abort, a lost connection) is `unresolved`: never a known-good."""
    from envbisect.runs.plan import running_stack_unverified
    from envbisect.trials.perf_trial import judge
    from envbisect.trials.runner import probe_repeatedly

    values: tuple[float, ...] = ()
    try:
        if probe.is_perf:
            outcome, runs, reason, values = judge(probe, transports, None, is_reference=True)
        else:
            outcome, runs, reason = probe_repeatedly(probe, transports, probe.repeat)
    except RemoteError as e:
        return ObservedProbe(probe.name, probe.kind, "unresolved", f"probe could not run: {e}", time.time(),
                             metric=probe.metric if probe.is_perf else None)
    word = {Outcome.PASS: "pass", Outcome.FAIL: "fail"}.get(outcome, "unresolved")
    dead = [h for h, t in transports.items() if not t.alive()]
    if dead:  # a failure seen through a dropped connection is evidence of nothing
        word, reason = "unresolved", f"lost the ssh connection to {', '.join(dead)} while probing ({reason})"
    # the same snapshot on both sides: no deltas, only whether each process runs what its files say
    unverified = running_stack_unverified(compute_diff(snap, snap, since=snap.taken_at), playbook, ())
    return ObservedProbe(probe.name, probe.kind, word, reason, time.time(), runs=len(runs),
                         passes=sum(1 for r in runs if r.outcome == Outcome.PASS),
                         metric=probe.metric if probe.is_perf else None, values=tuple(values), unverified=unverified)


__all__ = ["observe_running"]
