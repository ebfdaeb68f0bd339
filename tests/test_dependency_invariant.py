"""Issue 34: "X needs Y" only when a trial with X and Y and without every culprit of the symptom
passed (or, for a start failure, got past the start). Red-team scen_d: a 500 masked by a hang and
an intermittent hang made the search claim "TORCH_COMPILE needs THREAD_POOL_SIZE" (and explain
"TORCH_COMPILE alone (with THREAD_POOL_SIZE, which it needs) failed") with no pass behind it."""
from __future__ import annotations

import itertools

from tests.search_oracle import World, play_incident


def _shown(inc, dep, culprits) -> bool:
    need = {dep.needy, *dep.partners}
    for obs, sign in inc.history:
        if obs.unresolved or obs.free or not need <= set(obs.config) or set(obs.config) & culprits:
            continue
        if not obs.failed or sign not in (None, "start"):
            return True
    return False


def _worlds():
    units = [f"u{i}" for i in range(5)]
    for h, e in itertools.permutations(range(5), 2):
        for rate in (1.0, 0.4):
            for running in (None, "503"):
                yield units, World(faults=(({f"u{h}"}, "hang"), ({f"u{e}"}, "500")),
                                   detection={f"u{h}": rate}, running=running)


def test_every_dependency_in_a_verdict_has_a_trial_that_got_past_it_without_the_culprits():
    bad = []
    for units, world in _worlds():
        for seed in range(3):
            v, inc = play_incident(world, units, seed=seed)
            culprits = set(v.culprits)
            for d in v.dependencies:
                if d.observed and not _shown(inc, d, culprits):
                    bad.append((world.faults, world.detection, world.running, seed, d.text))
                if not d.observed and (d.needy in culprits or culprits & set(d.partners)):
                    bad.append((world.faults, world.detection, world.running, seed, d.text))
            if "which it needs" in v.explanation:
                bad.append((world.faults, seed, v.explanation))
    assert not bad, bad[:3]
