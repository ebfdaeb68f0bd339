"""The one vocabulary of results, shared by probe runs, trials and the search.

A str-valued Enum: members compare equal to their text ("fail") and serialise as it, so run
records written by older versions read back unchanged.
"""
from __future__ import annotations

from enum import Enum


class Outcome(str, Enum):
    PASS = "pass"  # every probe run passed
    FAIL = "fail"  # a probe run failed
    # a service died at start because of the config: a failure to the search when that is the symptom,
    # else another failure, no evidence about the symptom (runs/symptom.py, search/dependency.py)
    START_FAILURE = "start-failure"
    UNRESOLVED = "unresolved"  # no evidence: infrastructure trouble (see Cause)
    CANNOT_TEST = "cannot-test"  # a probe run said it cannot test this config (exit 125, like git bisect)
    ABORT = "abort"  # a probe run asked to stop the whole bisection
    BROKEN = "broken-probe"  # the probe itself cannot run (exit 126/127): no evidence, the run stops

    def __str__(self) -> str:  # f"{o}" gives "fail", as the plain strings did
        return self.value

    @property
    def failed(self) -> bool:
        return self in (Outcome.FAIL, Outcome.START_FAILURE)


class Cause(str, Enum):
    """Why a trial is unresolved: infrastructure, never evidence about the config."""

    SSH_LOST = "ssh-lost"
    APPLY_FAILED = "apply-failed"
    RESTART_FAILED = "restart-failed"
    PROBE_ERROR = "probe-error"
    CANNOT_TEST = "cannot-test"
    ABORTED = "aborted"
    PROBE_BROKEN = "probe-broken"  # the probe could not run at all (exit 126/127): the run stops

    def __str__(self) -> str:
        return self.value


class Leave(str, Enum):
    """The state a bisection leaves the hosts in. Serialised as its text (verdict.json "state_left")."""

    ORIGINAL = "original"  # put back as the run found them
    FIXED = "fixed"  # --leave fixed: current minus the culprits, which passed the probe
    UNKNOWN = "unknown"  # the run did not finish: `envbisect restore` puts them back

    def __str__(self) -> str:
        return self.value


class VerdictKind(str, Enum):
    """What a bisection concludes. Serialised as its text, as run records always held it."""

    CULPRIT = "culprit"  # each named unit breaks the stack on its own; all must be reverted
    INTERACTION = "interaction"  # the units of a term fail only together
    NOT_CONFIG = "not-config"  # the baseline fails too, under the same probe: no delta is to blame
    NOT_REPRODUCED = "not-reproduced"  # the current configuration passed after a co-restart
    INCONCLUSIVE = "inconclusive"  # budget, infrastructure or an unproven premise: nothing is named

    def __str__(self) -> str:
        return self.value

    @property
    def names_changes(self) -> bool:
        """Whether the verdict names deltas (to revert, to report as guilty)."""
        return self in (VerdictKind.CULPRIT, VerdictKind.INTERACTION)

    @classmethod
    def parse(cls, text: object) -> VerdictKind | None:
        """The kind a record holds; None for none, or for a kind this version does not know."""
        try:
            return cls(text)
        except ValueError:
            return None
