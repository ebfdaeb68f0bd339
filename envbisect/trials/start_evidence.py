"""Whether a start command that exited non-zero is the configuration's fault or the infrastructure's.

Many start commands report an engine that dies at start themselves: a wrapper that checks the
engine is still alive a moment later, `docker compose up --wait`, `systemctl start` of a
Type=notify or forking unit. Their non-zero exit is then the same fact as a health check that
finds the engine dead (`Outcome.START_FAILURE`, hosts/restart.py), but a non-zero exit also comes
from a start command that cannot run at all (a missing script, a full disk, a broken unit file),
which says nothing about the configuration. The run's own evidence tells them apart:

- the same command started this service earlier in this run, for another configuration (the
  baseline at least): the command works;
- and the latest earlier trial of the same configuration failed the same way (the same service, the
  same stderr line once the numbers that vary between runs, pids and times, are masked): it is this
  configuration. Other configurations may run in between: current's first starts fail before
  anything shows the command works, the baseline then starts it, and current's next start counts.

Only then is the exit a start failure of the configuration. Otherwise it stays infrastructure
trouble (unresolved, no evidence), and its reason says which evidence was missing: the first start
of the service in this run, or a retry that failed differently. The first failure of a
configuration is always unresolved, so the search retries it; a transient failure (fails once,
then starts) is therefore never evidence. A timeout of the command or a lost SSH session never
reaches here: the co-restart reports those as infrastructure failures of their own.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from envbisect.hosts.restart import RestartResult
from envbisect.outcome import Outcome

_NUMBERS = re.compile(r"\d+")  # pids, times and ports differ between two runs of one failure


@dataclass(frozen=True)
class _Exit:
    n: int
    config: tuple[str, ...]
    service: str
    message: str


class StartEvidence:
    """What this run's co-restarts showed about each service's start command (one per run)."""

    def __init__(self, order: Sequence[str]):
        self.order = tuple(order)
        self.started: dict[str, int] = {}  # service -> the first trial whose co-restart started it
        # configuration -> its latest trial, when that trial's start command exited non-zero
        self.last_exit: dict[tuple[str, ...], _Exit] = {}

    def saw(self, n: int, config: tuple[str, ...], rs: RestartResult) -> tuple[Outcome, str] | None:
        """Learn from trial `n`'s co-restart; for a start command that exited non-zero, how the
        trial counts: (START_FAILURE, reason) or (UNRESOLVED, reason). None: not such a failure."""
        ran = self.order if rs.ok else tuple(s for s in rs.durations if s != rs.service)
        for s in ran:
            self.started.setdefault(s, n)
        prev = self.last_exit.pop(config, None)
        if rs.ok or rs.failure != "start-exit" or rs.service is None:
            return None
        this = _Exit(n, config, rs.service, rs.message)
        self.last_exit[config] = this
        return self._judge(this, prev)

    def _judge(self, this: _Exit, prev: _Exit | None) -> tuple[Outcome, str]:
        s = this.service
        first = self.started.get(s)
        if first is None:
            return Outcome.UNRESOLVED, (f"{this.message} (the first start of {s} in this run: nothing in this run "
                                        "shows its start command works, so this is infrastructure trouble, no "
                                        "evidence about the configuration)")
        if prev is None or prev.config != this.config:
            return Outcome.UNRESOLVED, (f"{this.message} (the same command started {s} in trial {first} of this "
                                        "run; retried: a start failure of this configuration fails the same way "
                                        "again)")
        if prev.service != s or _NUMBERS.sub("#", prev.message) != _NUMBERS.sub("#", this.message):
            return Outcome.UNRESOLVED, (f"{this.message} (trial {prev.n}, the same configuration, failed "
                                        f"differently: {prev.message}; infrastructure trouble, no evidence about "
                                        "the configuration)")
        return Outcome.START_FAILURE, (f"{this.message} (a start failure of this configuration: the same command "
                                       f"started {s} in trial {first} of this run, and trial {prev.n} of this "
                                       "configuration failed the same way)")


__all__ = ["StartEvidence"]
