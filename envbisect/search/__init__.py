"""The bisection search: a pure state machine over trial outcomes.

No I/O, no clock, no randomness.  A :class:`Search` is told what happened
(:meth:`Search.observe`) and says what to do next (:meth:`Search.next`): either
a :class:`TrialRequest` (apply the baseline plus these units, restart every
service once, run the probe up to ``probes`` times, stop at the first failure)
or a :class:`Verdict`.

Model (see docs/search.md for the user-facing description):

* A *unit* is an opaque id for one delta (or a group of linked deltas) since the
  known-good baseline.  A *config* is the set of units applied on top of the
  baseline.
* Failure is monotone in the config and described by a set of *terms*: the
  config is bad iff it contains every unit of at least one term.  Within a
  *frame* the hypotheses are: one culprit ``{x}``; an interaction ``{x, y}`` (bad
  only with both); "not the config" (every config, the baseline included, is
  bad); and "no fault".  Several independent culprits are found one frame after
  the other: once a term is accepted and current-minus-the-terms still fails, a
  new frame keeps the accepted terms and looks for one more.  Whether there is
  one more is itself judged by the next frame's belief ("no more" against "one
  more", with prior odds ``Prior.multiple``).
* Noise is one-sided: a bad config passes one probe run with unknown
  probability ``q`` (intermittent fault), a good config never fails.  The belief
  is kept over hypotheses x a small grid of ``q`` values and updated exactly.
* The configs to test come from a structured prefix bisection (explainable, it
  proves each blamed unit is needed).  The posterior decides when to stop, how
  many probe runs a trial needs, when a pass is too weak to build on (re-test),
  and which check to run when the structure alone does not settle the question.
* When the posterior is confident but a claim rests on the prior (e.g. the
  culprit was never tested alone) and one more restart stays within
  :func:`restart_bound`, that restart is spent to observe the claim.

Restarts are the expensive unit; probe runs are cheap.  :func:`restart_bound`
is the promise for deterministic faults (premise checks included);
docs/search.md explains it, and why seeing a culprit fail alone and seeing the
fix pass are the restarts that separate a verdict from a guess.
"""

from __future__ import annotations

from envbisect.outcome import Outcome
from envbisect.search.policy import POLICIES, Policy, parse_policy
from envbisect.search.incident import Incident
from envbisect.search.strategy import Search
from envbisect.search.types import (Dependency, Fault, Hypothesis, Observation, Prior, TrialKind, TrialRequest, Verdict,
                                    default_budget, restart_bound)

__all__ = [
    "Outcome",
    "Observation",
    "TrialKind",
    "TrialRequest",
    "Verdict",
    "Dependency",
    "Prior",
    "Policy",
    "POLICIES",
    "parse_policy",
    "Hypothesis",
    "Search",
    "Incident",
    "Fault",
    "restart_bound",
    "default_budget",
]
