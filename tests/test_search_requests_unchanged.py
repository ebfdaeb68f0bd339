"""The search's requests and verdicts over seeded oracle cases, as one hash: a change to the search
that is meant to leave cases without "another failure" alone must leave this unchanged (the same
kind of check as the 600-case fingerprint of the stages refactor, cfcfbe7 / a38ad70)."""
from __future__ import annotations

import hashlib
import random

from search_oracle import answer

from envbisect.search import POLICIES, Verdict

# computed with the fix check and the later frames' trials sized to rule out a fault that shows in
# 30% of runs (judge.FIX_RATE; a later frame's at tau: 327e1a159794...a4c4a4 with fix_floor() there); with FIX_RATE at 0.99 (no floor) it is f8ce89c8d368...ccb150, the hash
# of 8246623..cc23e47 (before "another failure" existed), so nothing else changed here; then a pair
# member that fails alone is a term at once (stages.CheckTerm), which changes 2 of the 1800 runs (thorough,
# a 50% culprit): the same restarts and verdict, its fix check asked as one (10 and 13 runs, not 9);
# then an accepted culprit whose proof failed since is a suspect again (Judge.void_term): 1 run (fast,
# a 50% culprit, n=16) names u2 alone instead of u2 and the innocent u3, one restart fewer
# then the fix check rules out 30% at the per-pass doubt tau (17 runs at 95%, was 9): 1524 of the 1800
# runs change only in the fix check's probe count, none in its requests, restarts or verdict
# then, under require_fix, a trial of current without one unit (that unit's fix check, should it be the
# culprit) runs those 17 too: 492 runs change only in probe counts, none in requests or culprits
EXPECTED = "240ab7ca45c19583721540e642bb883e38051804c960d1780f69b50381db4c0c"


def _cases(count: int = 600):
    rng = random.Random(877)
    for i in range(count):
        n = rng.choice((3, 4, 5, 6, 8, 11, 16))
        units = [f"u{j}" for j in range(n)]
        kind = rng.choice(("culprit", "pair", "two", "flaky"))
        a, b = rng.sample(units, 2)
        terms = [{a}] if kind in ("culprit", "flaky") else [{a, b}] if kind == "pair" else [{a}, {b}]
        yield i, units, terms, (0.5 if kind == "flaky" else 1.0)


def _play(policy, units, terms, detection, seed) -> list[str]:
    rng = random.Random(seed)
    s = policy.search(units)
    out = []
    for _ in range(200):
        step = s.next()
        if isinstance(step, Verdict):
            out.append(f"V {step.kind} {sorted(step.culprits)} {step.confidence:.6f} {step.explanation}")
            return out
        out.append(f"R {sorted(step.config)} {step.probes} {step.stop_after} {step.kind.value} {step.purpose}")
        bad = any(t <= set(step.config) for t in terms)
        s.observe(answer(step, bad, rng, detection))
    return out


def digest() -> str:
    h = hashlib.sha256()
    for i, units, terms, detection in _cases():
        for name in sorted(POLICIES):
            for line in _play(POLICIES[name], units, terms, detection, 1000 + i):
                h.update(line.encode() + b"\n")
    return h.hexdigest()


def test_requests_and_verdicts_without_another_failure_are_unchanged():
    assert digest() == EXPECTED
