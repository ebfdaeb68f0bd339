"""The answer an oracle gives a search's request: the request's probes run against a known truth
(`bad`: the configuration holds the fault), each failing with probability `detection`, stopping at
the request's `stop_after` failures. Shared by the pure search tests."""
from __future__ import annotations

import random

from envbisect.search import Observation, TrialRequest


def answer(step: TrialRequest, bad: bool, rng: random.Random, detection: float = 1.0) -> Observation:
    failures = passes = 0
    for _ in range(step.probes):
        if bad and rng.random() < detection:
            failures += 1
            if failures >= step.stop_after:
                break
        else:
            passes += 1
    return Observation(step.config, passes, failures=failures, free=step.free)
