"""Rounds for a fleet of identical replicas: R trials at once, one per replica.

The search is sequential (one request, one observation). A round asks it for R requests by
speculation: the first is the search's own; for each further one a copy of the search is told
the more likely outcome of the previous request (from the posterior) and asked again. For a
bisection that puts the second replica on the half the first is expected to keep, the premise
checks and the two confirmations (alone, and the fix) run side by side, and so on. Every real
observation is then fed to the real search in order: an observation the speculation got wrong is
still evidence (the posterior is exact, and the strategy rebuilds its stage from the evidence), so
a round can cost restarts but never a wrong verdict.
"""
from __future__ import annotations

import copy
from typing import Sequence

from envbisect.search.types import Observation, TrialRequest, Verdict


def plan_round(search, replicas: int) -> list[TrialRequest] | Verdict:  # noqa: ANN001 - a Search
    """Up to `replicas` requests for this round (distinct configurations), or the verdict."""
    first = search.next()
    if isinstance(first, Verdict):
        return first
    out = [first]
    if replicas <= 1:
        return out
    spec = copy.deepcopy(search)
    req = first
    while len(out) < replicas:
        post = spec.evidence.belief()
        likely_fail = post.p_bad(spec.evidence.mask(req.config)) >= 0.5 if post.z > 0 else True
        spec.observe(Observation(req.config, passes=0 if likely_fail else max(1, req.probes), failed=likely_fail))
        nxt = spec.next()
        if isinstance(nxt, Verdict) or any(nxt.config == r.config for r in out):
            break
        out.append(nxt)
        req = nxt
    return out


def observe_round(search, observations: Sequence[Observation]) -> None:  # noqa: ANN001 - a Search
    for obs in observations:
        if isinstance(search.next(), Verdict):
            return  # the verdict came before the round was spent: the rest is recorded, not needed
        search.observe(obs)


__all__ = ["plan_round", "observe_round"]
