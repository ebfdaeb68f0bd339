"""The oracle harness: one simulated fault, one set of probe rules, every method.

A *case* is a ground truth over the deltas of a diff (which deltas break the stack, alone or
only together) and a per-probe detection rate.  A :class:`Lab` answers trials against it:

* a trial is one started configuration: the baseline plus a set of deltas, co-restarted once
  (it counts one **restart**), then probed up to ``runs`` times, stopping after ``stop_after``
  failed runs (every method stops at its first failure: one failure proves the config bad);
* a config that contains every delta of some term of the truth is bad: each probe run of it fails
  with probability ``detection`` (1.0 = deterministic); a good config never fails;
* the current configuration is already running and has been seen failing.  Probing it as it
  runs costs no restart, for every method (envbisect asks for that with ``TrialRequest.free``;
  the classic methods take "current fails" as given without probing it at all).

Every method below is driven by the same Lab and judged the same way: its answer is a set of
terms over deltas (or none); it is *right* when that set equals the truth, and it *names an
innocent* when it blames a delta outside the truth.
"""
from __future__ import annotations

import functools
import inspect
import itertools
import math
import random
import sys
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterable, Mapping

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envbisect.outcome import VerdictKind  # noqa: E402
from envbisect.runs.bisect import BisectRun, make_units  # noqa: E402
from envbisect.runs.symptom import incident_for  # noqa: E402
from envbisect.state.corrections import Corrections  # noqa: E402
from envbisect.state.deltas import Delta  # noqa: E402
from envbisect.search import POLICIES, Observation, Search, Verdict  # noqa: E402
from restart_cost import Meter  # noqa: E402

NS = (4, 8, 16, 32, 64, 128)
DETECTIONS = (1.0, 0.7, 0.5, 0.3)
DETERMINISTIC = ("culprit", "pair", "two", "linked")
SCENARIOS = DETERMINISTIC + tuple(f"flaky-{d}" for d in DETECTIONS)
SCENARIO_TITLES = {
    "culprit": "one culprit",
    "pair": "a pair that fails only together",
    "two": "two independent culprits",
    "linked": "same-key change (prefill+decode), innocent on one side",
    **{f"flaky-{d}": f"one culprit, per-probe detection {d}" for d in DETECTIONS},
}
HAND_PROBES = 3  # probe runs per trial for toggling and ddmin: the playbook's `repeat`, envbisect's base_probes
MAX_K = 40  # fixed-repeat bisection tries k = 1 .. MAX_K (the search's own cap on probe runs per trial)
LINK_KEY = "SGLANG_SHARED_KNOB"

ENVBISECT_METHODS = tuple(f"envbisect-{p}" for p in POLICIES)
METHODS = ENVBISECT_METHODS + ("toggle", "bisect", "bisect-verify", "bisect-k", "ddmin")
METHOD_TITLES = {
    "envbisect-confirm": "envbisect, policy confirm (the default)",
    "envbisect-fast": "envbisect, policy fast",
    "envbisect-thorough": "envbisect, policy thorough",
    "toggle": f"one-at-a-time: revert each delta alone from current, stop at first pass ({HAND_PROBES} runs/trial)",
    "bisect": "classic bisection (git bisect run): 1 probe run per step, no premise checks",
    "bisect-verify": (f"classic bisection plus the checks of a careful operator: the baseline first, then the "
                      f"culprit alone and its revert ({HAND_PROBES} runs each)"),
    "bisect-k": "classic bisection, k probe runs per step, k tuned to envbisect's accuracy",
    "ddmin": f"Zeller's ddmin, results cached ({HAND_PROBES} runs/trial)",
}


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    scenario: str
    n: int  # deltas in the diff
    index: int
    terms: tuple[tuple[str, ...], ...]  # the truth: a config is bad iff it holds every delta of a term
    detection: float
    seed: int
    linked: tuple[str, ...] = ()  # two deltas with the same key and change (envbisect links them)
    # deltas that fail differently from the symptom without a partner: (needy, its partners)
    needs: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # several faults (issue 34, 39): the fingerprint each term fails with, in precedence order (the
    # first term a config holds shows: a hang masks a 500); empty: one symptom for all
    signs: tuple[str, ...] = ()
    # per term, how often it shows per probe run (empty: ``detection`` for every term)
    detections: tuple[float, ...] = ()
    # failures that are no culprit's (term, fingerprint), after the terms: a must-match pair's side
    # alone breaks the layout another way
    apart: tuple[tuple[tuple[str, ...], str], ...] = ()
    running: str | None = None  # what the running stack answers instead (a router breaker's 503)

    @property
    def deltas(self) -> list[str]:
        return delta_ids(self.n, self.linked_at)

    @property
    def linked_at(self) -> int | None:
        if not self.linked:
            return None
        return int(self.linked[0].split("@")[1])

    @property
    def truth(self) -> frozenset:
        return frozenset(frozenset(t) for t in self.terms)

    @property
    def k(self) -> int:
        return len({d for t in self.terms for d in t})


_SERVICES = ("prefill", "decode", "router")


def delta_ids(n: int, linked_at: int | None = None) -> list[str]:
    """The diff's deltas, in its order.  With ``linked_at`` the deltas at positions
    ``linked_at`` and ``linked_at + 1`` are the same key changed the same way in prefill and decode."""
    out = []
    for i in range(n):
        if linked_at is not None and i in (linked_at, linked_at + 1):
            out.append(f"{'prefill' if i == linked_at else 'decode'}:{LINK_KEY}@{linked_at}")
        else:
            out.append(f"{_SERVICES[i % 3]}:K{i:03d}")
    return out


def _key(delta: str) -> tuple[str, str]:
    svc, key = delta.split(":", 1)
    return svc, key.split("@")[0]


def as_delta(delta: str) -> Delta:
    svc, key = _key(delta)
    return Delta(id=delta, kind="env", host="node1", service=svc, path=f"/srv/{svc}.serve-env", key=key,
                 change="changed", old="0", new="1", baseline_source="snapshot:bench")


def stable_seed(*parts: object) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


def sample_pairs(n: int, cap: int, seed: int, every: int = 500) -> list[tuple[int, int]]:
    """Every pair while there are at most ``every`` of them, else ``cap`` seeded samples."""
    pairs = list(itertools.combinations(range(n), 2))
    if len(pairs) <= every:
        return pairs
    rng = random.Random(seed)
    return sorted(rng.sample(pairs, cap))


def cases(scenario: str, n: int, *, pair_cap: int = 200, pair_every: int = 500, flaky_min: int = 200) -> list[Case]:
    """Every position; pairs: every pair while there are at most ``pair_every``, else ``pair_cap``
    seeded samples; intermittent faults: max(n, ``flaky_min``) cases, each with its own seed,
    going round the positions (so every position at least once, and all about equally often)."""
    ids = delta_ids(n)
    out: list[Case] = []
    if scenario == "culprit":
        for i, x in enumerate(ids):
            out.append(Case(scenario, n, i, ((x,),), 1.0, 0))
    elif scenario in ("pair", "two"):
        for i, (a, b) in enumerate(sample_pairs(n, pair_cap, stable_seed("pairs", n), pair_every)):
            terms = ((ids[a], ids[b]),) if scenario == "pair" else ((ids[a],), (ids[b],))
            out.append(Case(scenario, n, i, terms, 1.0, 0))
    elif scenario == "linked":
        for p in range(n - 1):
            lids = delta_ids(n, p)
            linked = (lids[p], lids[p + 1])
            guilty = linked[p % 2]  # the prefill side at even positions, the decode side at odd ones
            out.append(Case(scenario, n, p, ((guilty,),), 1.0, 0, linked))
    elif scenario.startswith("depends"):
        # one culprit, and 1-3 random dependencies among all the deltas (the culprit may be half of
        # one): a needy delta without its partner fails differently from the symptom
        d = float(scenario.split("-", 1)[1]) if "-" in scenario else 1.0
        for idx in range(max(n, flaky_min)):
            rng = random.Random(stable_seed(scenario, n, idx))
            needs: list[tuple[str, tuple[str, ...]]] = []
            edges: dict[int, int] = {}
            for e in rng.sample(range(n), rng.randint(1, 3)):
                # no cycle: two deltas that each need the other only ever run together, and which of
                # them is the culprit cannot be told by any trial (bench/README.md)
                def reaches(a: int, b: int) -> bool:
                    while a in edges:
                        a = edges[a]
                        if a == b:
                            return True
                    return False
                p = rng.choice([i for i in range(n) if i != e and not reaches(i, e)])
                edges[e] = p
                needs.append((ids[e], (ids[p],)))
            out.append(Case(scenario, n, idx, ((ids[rng.randrange(n)],),), d, stable_seed(scenario, n, idx, "q"),
                            needs=tuple(needs)))
    elif scenario.startswith("flaky-"):
        d = float(scenario.split("-", 1)[1])
        for idx in range(max(n, flaky_min)):
            out.append(Case(scenario, n, idx, ((ids[idx % n],),), d, stable_seed(scenario, n, idx)))
    else:
        raise ValueError(f"unknown scenario {scenario!r}")
    return out


def info_bound(n: int, k: int) -> int:
    """ceil(log2 C(n, k)): restarts any method needs in the worst case to tell k culprits among n
    apart with pass/fail answers (deterministic), premise checks not included."""
    return math.ceil(math.log2(math.comb(n, k))) if math.comb(n, k) > 1 else 0


@functools.lru_cache(maxsize=None)
def _confirm_cost(k: int) -> float:
    """The fewest expected tests, over a culprit uniformly among ``k`` candidates of a diff of
    more than 2 deltas, that identify it *and* observe it fail alone (baseline + it) and observe
    its revert pass (current - it).  Only the test "baseline + {x}" shows x failing alone, and
    only "current - {x}" shows its revert passing; for n > 2 no test is both for two deltas, so a
    test that splits the candidates k -> (j, k - j) can settle one of those two observations only
    for the candidate it isolates (j = 1).  Exact by recursion over the split sizes."""
    if k == 1:
        return 2.0  # identified by a test that was neither of its two: both still to make
    best = math.inf
    for j in range(1, k // 2 + 1):
        if j == 1:  # isolate one candidate with its own alone test: one of its two observations made
            rest = 2.0 if k == 2 else _confirm_cost(k - 1)
            cost = 1 + (1 / k) * 1.0 + ((k - 1) / k) * rest
        else:
            cost = 1 + (j / k) * _confirm_cost(j) + ((k - j) / k) * _confirm_cost(k - j)
        best = min(best, cost)
    return best


def evidence_bound(n: int) -> float:
    """The fewest mean restarts, over every position of one culprit among ``n`` deltas, of *any*
    method that observes what envbisect's default policy observes before it names the culprit:
    the baseline passing (one restart), the culprit failing alone and its revert passing (current,
    already running and failing, is free).  Classic bisection observes none of these; toggling
    observes only the revert.  For n a power of 2 this is log2 n + 2.5."""
    if n < 3:
        raise ValueError("n >= 3")
    return 1 + _confirm_cost(n)


# --------------------------------------------------------------------------- the lab


class Lab:
    def __init__(self, case: Case):
        self.case = case
        self.rng = random.Random(case.seed)
        self.restarts = 0
        self.probes = 0
        self.free = 0  # trials of the running stack answered without a restart
        self.spent: Counter = Counter()  # restarts by what they were for (run_envbisect fills it)
        self.meter = Meter()  # restart-seconds (restart_cost.py); run_envbisect plans its restarts
        self._terms = [frozenset(t) for t in case.terms]
        # whether every process of the running stack verifiably runs its files: only then may a
        # request for current be answered by probing the stack as it runs, without a restart
        self.running_verified = getattr(case, "runs_its_files", True)

    def bad(self, config: frozenset) -> bool:
        return any(t <= config for t in self._terms)

    def fails_when(self, config: frozenset, running: bool) -> bool:
        """Whether probe runs of ``config`` can fail: ``running`` is the stack probed as it runs
        (no restart), else ``config`` co-restarted.  On this oracle both are ``bad(config)``."""
        return self.bad(config)

    def other(self, config: Iterable[str]) -> bool:
        """Fails differently from the symptom: a needy delta without its partners (a service that
        does not start, deterministically)."""
        config = frozenset(config)
        return any(e in config and not set(ps) <= config for e, ps in self.case.needs)

    def signed(self, config: Iterable[str], runs: int, stop_after: int = 1,
               free: bool = False, kind: str = "") -> tuple[int, int, str | None]:
        """(passes, failures, the fingerprint of the first failure) of one trial of ``config`` in a
        world of several faults (`Case.signs`): each run shows the first term it holds that fires."""
        c = self.case
        several = any(getattr(c, k, None) for k in ("signs", "detections", "apart", "running"))
        if not several:  # one symptom: the families as they were (an incident mix's case has none of these)
            passes, failures = self.trial(config, runs, stop_after, free, kind)
            return passes, failures, ("symptom" if failures else None)
        config = frozenset(config)
        if free:
            self.free += 1
        else:
            self.restarts += 1
            self.meter.restart(config, kind)
        if free and c.running is not None and self.bad(config):
            self.probes += 1
            return 0, 1, c.running
        modes = [(t, c.signs[i] if c.signs else "symptom", c.detections[i] if c.detections else c.detection)
                 for i, t in enumerate(self._terms)] + [(frozenset(t), sg, 1.0) for t, sg in c.apart]
        passes = failures = 0
        sign = None
        for _ in range(max(1, runs)):
            self.probes += 1
            got = next((sg for t, sg, rate in modes if t <= config and self.rng.random() < rate), None)
            if got is None:
                passes += 1
                continue
            sign, failures = sign or got, failures + 1
            if failures >= stop_after:
                break
        self.meter.probed(failures == 0)
        return passes, failures, sign

    def trial(self, config: Iterable[str], runs: int, stop_after: int = 1, free: bool = False,
              kind: str = "") -> tuple[int, int]:
        """(passes, failures) of one trial of ``config``; counts a restart unless ``free``."""
        config = frozenset(config)
        if free:
            self.free += 1
        else:
            self.restarts += 1
            self.meter.restart(config, kind)
        bad = self.fails_when(config, running=free)
        passes = failures = 0
        for _ in range(max(1, runs)):
            self.probes += 1
            if bad and self.rng.random() < self.case.detection:
                failures += 1
                if failures >= stop_after:
                    break
            else:
                passes += 1
        self.meter.probed(failures == 0)
        return passes, failures


@dataclass(frozen=True)
class Answer:
    terms: frozenset | None  # frozenset of frozensets of deltas; None: no culprit named
    kind: str


def score(case: Case, lab: Lab, ans: Answer) -> tuple[int, int, bool, bool, str]:
    """(restarts, probes, right, innocent named, verdict kind)."""
    truth = case.truth
    right = ans.terms is not None and ans.terms == truth
    named = {d for t in (ans.terms or ()) for d in t}
    innocent = bool(named - {d for t in truth for d in t})
    return lab.restarts, lab.probes, right, innocent, ans.kind


# --------------------------------------------------------------------------- methods


try:  # the shared result vocabulary (a str Enum: compares equal to "pass"/"fail")
    from envbisect.outcome import Outcome as _Outcome  # noqa: E402

    _PASS, _FAIL = _Outcome.PASS, _Outcome.FAIL
except ImportError:  # older envbisect: plain strings
    _PASS, _FAIL = "pass", "fail"


class _RefineRunner:
    """What BisectRun._refine_links needs from a TrialRunner, answered by the lab."""

    def __init__(self, lab: Lab, units: dict[str, tuple[str, ...]]):
        self.lab, self.units = lab, dict(units)

    def delta_ids(self, unit_ids) -> tuple[str, ...]:  # noqa: ANN001
        return tuple(sorted(d for u in unit_ids for d in self.units[u]))

    def run(self, n: int, unit_ids, probes: int, purpose: str,  # noqa: ANN001
            stop_after: int = 1, *_a, **_kw):  # noqa: ANN002, ANN003
        config = {d for u in unit_ids for d in self.units[u]}
        _, failures = self.lab.trial(config, probes, stop_after)
        return SimpleNamespace(n=n, outcome=_FAIL if failures else _PASS, free=False, purpose=purpose,
                               kind=_kw.get("kind"), config=self.delta_ids(unit_ids), symptom=None)


def takes_twins() -> bool:
    """Whether the Search splits auto-linked units itself (``Search(units, twins=...)``): then the
    harness hands it the twins as search/hints.py builds them, and no restart is spent after the
    verdict to test their sides apart."""
    return "twins" in inspect.signature(Search.__init__).parameters


def twins_of(units: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """The twins the search splits itself (search/hints.twins_of: auto-linked units of two deltas,
    each -> its member unit ids); none when the Search does not take them."""
    if not takes_twins():
        return {}
    from envbisect.search.hints import twins_of as hint_twins

    return hint_twins(units)


def _deltas_of(units: Mapping[str, tuple[str, ...]], unit_ids: Iterable[str]) -> set[str]:
    """The deltas of a search config; a member unit of a twin (``member:DELTA``) names its delta."""
    return {d for u in unit_ids for d in units.get(u, (u.removeprefix("member:"),))}


def _split_after(lab: Lab, verdict: Verdict, units: Mapping[str, tuple[str, ...]], search: Search) -> dict:
    """BisectRun._refine_links on the linked units the search did not split itself (each side tested
    with the rest of its term, one restart each); ``lab.spent["refine"]`` counts those restarts."""
    if not any(len(v) > 1 for v in units.values()):
        return {}
    before = lab.restarts
    fake_run = SimpleNamespace(opts=SimpleNamespace(link=()), declared_links=(), trials=[],
                               corrections=Corrections(), watch=None,
                               _append_trial=lambda _t: None, on_event=lambda _k, _d: None)
    fake_run._record = lambda t, evidence=True: (fake_run.trials.append(t), t)[1]
    refined, _apart = BisectRun._refine_links(fake_run, verdict, units, _RefineRunner(lab, dict(units)), search, [])
    lab.spent["refine"] += lab.restarts - before
    return refined


def run_envbisect(lab: Lab, policy: str, auto_link: bool = True, split_twins: bool = True) -> Answer:
    """envbisect as `envbisect bisect --policy P` runs it: the diff's deltas grouped into units by
    bisect.make_units (same key, same change in several services: one auto-linked unit), the pure
    Search driven through next()/observe().  A Search that takes ``twins`` splits a guilty twin
    itself, and its verdict is folded back into these units (search/hints.fold); a linked unit it
    did not split goes to bisect.BisectRun._refine_links (each side tested with the rest of its
    term, one restart each); ``split_twins`` False: every linked unit is split after the verdict.
    ``lab.spent`` counts the restarts by the trial's kind."""
    deltas = [as_delta(d) for d in lab.case.deltas]
    units, _notes = make_units(deltas, (), auto_link)
    twins = twins_of(units) if split_twins else {}
    # as BisectRun runs it: one search per fingerprint (search/incident.py), no budget here, so the
    # bench can check the default budget (search.default_budget) against every run's restarts
    search = incident_for(list(units), POLICIES[policy].search, None, options={"twins": twins} if twins else {})
    lab.meter = Meter(planned=True)
    while True:
        step = search.next()
        if isinstance(step, Verdict):
            break
        before = lab.restarts
        config = _deltas_of(units, step.config)
        # the running stack is probed as it runs only when it verifiably runs its files (as
        # BisectRun asks running_stack_unverified); otherwise current is co-restarted
        free = step.free and lab.running_verified
        kind = str(getattr(step.kind, "value", step.kind))
        if lab.other(config):  # a start failure: another failure, its own fingerprint
            if not free:
                lab.restarts += 1
                lab.meter.restart(config, kind)
            lab.meter.probed(False)
            search.observe(Observation(step.config, other=True, free=free, sign="start"))
        else:
            passes, failures, sign = lab.signed(config, step.probes, step.stop_after, free=free, kind=kind)
            search.observe(Observation(step.config, passes, failures=failures, free=free, sign=sign))
        lab.spent[kind] += lab.restarts - before
    lab.faults = len(step.faults) or 1
    verdict, refined = step, {}
    if twins:
        from envbisect.search.hints import fold

        verdict, refined = fold(verdict, twins)
    # a twin the search folded back (its sides passed alone and together) is split after the verdict, as BisectRun does
    refined = {**refined, **_split_after(lab, verdict, {u: m for u, m in units.items() if u not in refined}, search)}
    if not VerdictKind(verdict.kind).names_changes:
        return Answer(None, verdict.kind)
    terms = frozenset(frozenset(_deltas_of({**units, **refined}, t)) for t in verdict.terms)
    return Answer(terms, verdict.kind)


def run_toggle(lab: Lab, runs: int = HAND_PROBES) -> Answer:
    """Revert each delta alone from the current config; the first revert that passes is blamed."""
    ids = lab.case.deltas
    full = frozenset(ids)
    for d in ids:
        _, failures = lab.trial(full - {d}, runs)
        if not failures:
            return Answer(frozenset({frozenset({d})}), VerdictKind.CULPRIT)
    return Answer(None, VerdictKind.INCONCLUSIVE)


def run_bisect(lab: Lab, k: int = 1) -> Answer:
    """Classic bisection over the diff's order, as `git bisect run` does: the baseline is taken as
    good and current as bad without testing them; each step co-restarts the midpoint once and
    probes it k times (stopping at a failure); the first delta whose prefix failed is blamed."""
    ids = lab.case.deltas
    lo, hi = 0, len(ids)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        _, failures = lab.trial(ids[:mid], k)
        if failures:
            hi = mid
        else:
            lo = mid
    return Answer(frozenset({frozenset({ids[hi - 1]})}), VerdictKind.CULPRIT)


def run_bisect_verify(lab: Lab, runs: int = HAND_PROBES) -> Answer:
    """What a careful operator adds to `git bisect run`, following mozregression's habit of
    testing both ends first: the baseline must pass, then the bisection (one probe run per step,
    as `git bisect run` runs its script once), then the named delta must break the stack alone
    and its revert from current must pass.  A config already tried is not restarted again.  If
    the baseline fails, or the delta passes alone, or its revert fails, the operator has no verdict
    (the bisection assumed one culprit, and the checks say otherwise)."""
    ids = lab.case.deltas
    tried: dict[frozenset, bool] = {frozenset(ids): True}  # current: running, seen failing

    def fails(cfg, k: int) -> bool:
        key = frozenset(cfg)
        if key not in tried:
            tried[key] = lab.trial(key, k)[1] > 0
        return tried[key]

    if fails((), runs):
        return Answer(None, VerdictKind.NOT_CONFIG)
    lo, hi = 0, len(ids)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fails(ids[:mid], 1):
            hi = mid
        else:
            lo = mid
    x = ids[hi - 1]
    if not fails({x}, runs) or fails(set(ids) - {x}, runs):
        return Answer(None, VerdictKind.INCONCLUSIVE)
    return Answer(frozenset({frozenset({x})}), VerdictKind.CULPRIT)


def run_ddmin(lab: Lab, runs: int = HAND_PROBES) -> Answer:
    """Zeller & Hildebrandt's ddmin (minimizing delta debugging) over the deltas: test subsets,
    then complements, else refine the granularity; outcomes are cached so no config is restarted
    twice; the empty config (baseline) is taken as passing and current as failing, untested.
    The 1-minimal failing set it returns is read as one term: a single delta is a culprit, two or
    more fail only together."""
    ids = list(lab.case.deltas)
    full = frozenset(ids)
    cache: dict[frozenset, bool] = {}

    def fails(cfg: list[str]) -> bool:
        key = frozenset(cfg)
        if not key:
            return False
        if key == full:
            return True
        if key not in cache:
            _, failures = lab.trial(key, runs)
            cache[key] = failures > 0
        return cache[key]

    c, gran = ids, 2
    while len(c) >= 2:
        size = len(c) / gran
        parts = [c[round(i * size):round((i + 1) * size)] for i in range(gran)]
        parts = [p for p in parts if p]
        for p in parts:
            if fails(p):
                c, gran = p, 2
                break
        else:
            for p in parts:
                comp = [x for x in c if x not in p]
                if fails(comp):
                    c, gran = comp, max(gran - 1, 2)
                    break
            else:
                if gran >= len(c):
                    break
                gran = min(len(c), 2 * gran)
    kind = VerdictKind.CULPRIT if len(c) == 1 else VerdictKind.INTERACTION
    return Answer(frozenset({frozenset(c)}), kind)


def runner(method: str, k: int = 1) -> Callable[[Lab], Answer]:
    if method.startswith("envbisect-"):
        policy = method.split("-", 1)[1]
        return lambda lab: run_envbisect(lab, policy)
    if method == "toggle":
        return run_toggle
    if method == "bisect":
        return lambda lab: run_bisect(lab, 1)
    if method == "bisect-k":
        return lambda lab: run_bisect(lab, k)
    if method == "bisect-verify":
        return run_bisect_verify
    if method == "ddmin":
        return run_ddmin
    raise ValueError(f"unknown method {method!r}")


def run_case(case: Case, method: str, k: int = 1) -> tuple[int, int, bool, bool, str]:
    lab = Lab(case)
    ans = runner(method, k)(lab)
    return score(case, lab, ans)
