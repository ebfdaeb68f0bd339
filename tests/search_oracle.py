"""The answer an oracle gives a search's request: the request's probes run against a known truth
(`bad`: the configuration holds the fault), each failing with probability `detection`, stopping at
the request's `stop_after` failures. Shared by the pure search tests."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Mapping

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


@dataclass(frozen=True)
class World:
    """A known truth with several faults: ``faults`` in precedence order, each (term, its
    fingerprint); a configuration shows the first whose term it holds (a hang masks a 500).
    ``deps``: (e, p), e does not start without p (a start failure, before any request).
    ``detection``: a unit -> how often the fault of a term holding it shows per probe run.
    ``owners``: a twin -> its members (a configuration holding the twin holds them).
    ``running``: what the running stack answers instead (a breaker's 503), on a free probe."""

    faults: tuple = ()
    deps: tuple = ()
    detection: Mapping[str, float] = field(default_factory=dict)
    owners: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    running: str | None = None

    def expand(self, config) -> set[str]:
        out = set()
        for u in config:
            out.update(self.owners.get(u, (u,)))
        return out

    def guilty(self) -> set[str]:
        return {u for term, _sign in self.faults for u in term}

    def run(self, config, rng: random.Random) -> str | None:
        """One probe run: the fingerprint it fails with, or None (it passed)."""
        cfg = self.expand(config)
        if any(e in cfg and p not in cfg for e, p in self.deps):
            return "start"
        for term, sign in self.faults:
            if set(term) <= cfg:
                rate = min(self.detection.get(u, 1.0) for u in term)
                if rng.random() < rate:
                    return sign
        return None


def play_incident(world: World, units, policy: str = "confirm", seed: int = 0, twins=None,
                  max_trials: int | None = None, limit: int = 200):
    """Run an `Incident` against ``world`` to its verdict: (verdict, incident)."""
    from envbisect.search import POLICIES, Incident, Verdict

    twins = dict(twins or {})

    def make(us, budget):
        kept = {u: m for u, m in twins.items() if u in us}
        return POLICIES[policy].search(us, max_trials=budget, twins=kept)

    inc = Incident(units, make, max_trials=max_trials, owners=twins)
    rng = random.Random(seed)
    for _ in range(limit):
        step = inc.next()
        if isinstance(step, Verdict):
            return step, inc
        if step.free and world.running is not None:
            inc.observe(Observation(step.config, failed=True, free=True), world.running)
            continue
        failures = passes = 0
        sign = None
        for _ in range(step.probes):
            got = world.run(step.config, rng)
            if got is None:
                passes += 1
                continue
            sign = sign or got
            failures += 1
            if got == "start" or failures >= step.stop_after:
                break
        inc.observe(Observation(step.config, passes, failures=failures, free=step.free), sign)
    raise AssertionError("no verdict")
