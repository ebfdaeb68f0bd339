"""Several faults in one incident, each with its own fingerprint.

A `Search` bisects one symptom: a failure of another kind is no evidence about it. But when current
without the culprits found still fails, in another way, that is a second problem of the same
incident (a hang masked the 500 that now shows), and its culprits are as guilty as the first's.
An `Incident` runs one search per fingerprint, in the order the faults show, within one restart
budget:

1. problem 1's symptom is the fingerprint of the current configuration's failure. Learnt from the
   running stack (a free probe) it is provisional: the first failure of the current configuration
   after a co-restart refines it, and a fingerprint only the running stack showed (a router breaker's
   503) is reported as the stack's state (`stack_state`). A co-restarted trial that fails another way
   while the symptom is still provisional asks for current co-restarted first;
2. when problem k's verdict names culprits, and a trial without them failed with another
   fingerprint, problem k+1 opens over the deltas left, its symptom that fingerprint; every trial
   run so far that holds none of the culprits is evidence for it (replayed into its search);
3. the verdict names every problem's culprits, each with its fingerprint (`Verdict.faults`).

The searches are pure, so a problem's search is rebuilt from the recorded observations whenever its
symptom changes. Pure: no I/O, no clock, no randomness; fingerprints are opaque values compared with
``same``.
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Callable, Hashable, Mapping, Sequence

from envbisect.outcome import VerdictKind
from envbisect.search import dependency, explain
from envbisect.search.strategy import Search
from envbisect.search.types import Fault, Observation, TrialKind, TrialRequest, Verdict

MakeSearch = Callable[[list[str], "int | None"], Search]


def start_layer(sign: Hashable) -> int:
    """0 for a start failure (a service that did not start), 1 for any failure of a request."""
    return 0 if getattr(sign, "kind", sign) in ("start", "start-failure") else 1


class Incident:
    """Bisect ``units`` for every fault the incident shows. ``make_search(units, max_trials)`` builds
    one problem's search; ``same(a, b)``: whether two fingerprints are the same failure."""

    def __init__(self, units: Sequence[str], make_search: MakeSearch, *, max_trials: int | None = None,
                 same: Callable[[Hashable, Hashable], bool] = operator.eq, max_faults: int = 4,
                 owners: Mapping[str, Sequence[str]] | None = None,
                 describe: Callable[[Hashable], str] = str, layer: Callable[[Hashable], int] = start_layer) -> None:
        self.units = tuple(units)
        self.owners = {u: tuple(m) for u, m in (owners or {}).items()}  # a twin -> its members
        self.describe = describe
        self.layer = layer  # where along a trial a failure happens: a start failure comes before any request
        self.make_search = make_search
        self.max_trials = max_trials
        self.same = same
        self.max_faults = max_faults
        self.history: list[tuple[Observation, Hashable | None]] = []
        self.marked: list[bool] = []  # the caller judged it another failure (a record without fingerprints)
        self.faults: list[Fault] = []
        self.stack_state: Hashable | None = None  # a fingerprint only the running stack showed
        self.symptom: Hashable | None = None
        self.provisional = False  # the symptom was learnt from the running stack only
        self._corestart: TrialRequest | None = None
        self.search = make_search(list(self.units), max_trials)

    # -- public API ----------------------------------------------------------------------------

    @property
    def trials(self) -> int:
        """Restarts spent (a free probe of the running stack is none)."""
        return sum(0 if o.free else 1 for o, _ in self.history)

    def next(self) -> TrialRequest | Verdict:
        nxt = self._corestart or self.search.next()
        if isinstance(nxt, Verdict):
            return self._verdict(nxt)
        if self.max_trials is not None and self.trials >= self.max_trials and not nxt.free:
            return self._verdict(explain.final(self.search.evidence, "budget", confident=False))
        return nxt

    def observe(self, obs: Observation, sign: Hashable | None = None) -> None:
        """One trial: ``obs`` as run (a failure of any kind failed; ``other`` is read as failed too),
        ``sign`` the fingerprint of its failure (None: ``obs.sign``; a pass, or nothing describes it)."""
        sign = obs.sign if sign is None else sign
        failed = obs.failed or obs.other
        raw = dataclasses.replace(obs, other=False, failed=failed, failures=max(obs.failures, int(failed)),
                                  trial=obs.trial if obs.trial is not None else len(self.history) + 1)
        self.history.append((raw, sign if failed else None))
        self.marked.append(obs.other)
        self._corestart = None
        current = frozenset(self._current())
        if failed and raw.config == current and not self.faults and self._learn(raw, sign):
            return
        if not isinstance(self.search.next(), Verdict):
            self.search.observe(self._judged(raw, sign))
        if self.provisional and failed and not raw.free and not self._same(sign, self.symptom):
            if raw.config != current:
                self._corestart = TrialRequest(current, self.search.premise_probes,
                                               "confirm after a co-restart: the symptom was learnt from the running "
                                               "stack, and a fresh start failed another way",
                                               stop_after=self.search.premise_failures, kind=TrialKind.CONFIRM)
                return
        self._maybe_next_problem()

    @property
    def evidence(self):  # noqa: ANN201 - judge.Judge
        """The active problem's evidence (what `Search.evidence` is for one symptom)."""
        return self.search.evidence

    def pass_runs(self) -> int:
        return self.search.pass_runs()

    def marginals(self) -> dict[str, float]:
        return self.search.marginals()

    def __getattr__(self, name: str):  # noqa: ANN204 - the rest of `Search`'s API, of the active problem
        if name == "search":
            raise AttributeError(name)
        return getattr(self.search, name)

    def invariant_holds(self, verdict: Verdict) -> bool:
        """The culprits named are a set whose removal from current was observed to pass, and each
        delta that trial left out besides them is named or seen innocent (in a trial that passed
        with it)."""
        if verdict.kind not in (VerdictKind.CULPRIT, VerdictKind.INTERACTION):
            return True
        named = set(verdict.culprits)
        passed = [o for o, _ in self.history if not o.failed and not o.unresolved]
        for o in passed:
            if o.config & named:
                continue
            extra = set(self.units) - set(o.config) - named
            if all(any(u in p.config for p in passed) for u in extra):
                return True
        return False

    # -- problems ------------------------------------------------------------------------------

    def _excluded(self) -> set[str]:
        out: set[str] = set()
        for f in self.faults:
            out.update(f.culprits)
            out.update(f.left_out)
        for twin, members in self.owners.items():  # a twin goes with a side of it
            if twin in out or out & set(members):
                out.update((twin,) + members)
        return out

    def _holds(self, config: frozenset[str], gone: set[str]) -> bool:
        return bool(config & gone)

    def _current(self) -> list[str]:
        gone = self._excluded()
        return [u for u in self.units if u not in gone]

    def _same(self, a: Hashable | None, b: Hashable | None) -> bool:
        return a is None or b is None or self.same(a, b)

    def _learn(self, raw: Observation, sign: Hashable | None) -> bool:
        """The symptom from a failure of the current configuration; True when the search was rebuilt."""
        if self.symptom is None:
            self.symptom, self.provisional = sign, raw.free
            return False
        if self.provisional and not raw.free:
            self.provisional = False
            if not self._same(sign, self.symptom):
                self.stack_state, self.symptom = self.symptom, sign
                self._rebuild()
                return True
        return False

    def _judged(self, raw: Observation, sign: Hashable | None) -> Observation:
        """``raw`` as the active problem's search reads it: a failure of another kind is `other`.
        Where the fingerprints cannot tell (a record without them), the caller's own judgement
        against the first symptom stands for the first problem."""
        if not raw.failed:
            return raw
        if sign is None or self.symptom is None:
            i = next((k for k, (o, _) in enumerate(self.history) if o is raw), None)
            marked = i is not None and self.marked[i] and not self.faults
            before = sign is not None and self.layer(sign) < (1 if self.symptom is None else self.layer(self.symptom))
            return dataclasses.replace(raw, other=True, before=before) if marked else raw
        if self._same(sign, self.symptom):
            return raw
        return dataclasses.replace(raw, other=True, before=self.layer(sign) < self.layer(self.symptom))

    def _feed(self, search: Search, gone: set[str]) -> None:
        for raw, sign in self.history:
            if self._holds(raw.config, gone) or isinstance(search.next(), Verdict):
                continue
            if raw.free and self.stack_state is not None and sign == self.stack_state:
                continue  # the stack's state, not the configuration's
            search.observe(self._judged(raw, sign))

    def _budget_left(self, fed: int) -> int | None:
        if self.max_trials is None:
            return None
        return max(1, self.max_trials - (self.trials - fed))

    def _rebuild(self) -> None:
        gone = self._excluded()
        fed = sum(1 for o, _ in self.history if not o.free and not self._holds(o.config, gone))
        self.search = self.make_search(self._current(), self._budget_left(fed))
        self._feed(self.search, gone)

    def _maybe_next_problem(self) -> None:
        """The active search named culprits, and a trial without them failed another way: open the
        next problem over the deltas left, its symptom that failure."""
        v = self.search.next()
        if not isinstance(v, Verdict) or v.kind not in (VerdictKind.CULPRIT, VerdictKind.INTERACTION):
            return
        if len(self.faults) + 1 >= self.max_faults:
            return
        named = set(v.culprits)
        j = self.search.evidence
        fix = j.down(j.all & ~j.mask(n for n in named if n in j.index))
        left_out = set(j.names(j.all & ~fix)) - named
        gone = self._excluded() | named | left_out
        for twin, members in self.owners.items():
            if twin in gone or gone & set(members):
                gone.update((twin,) + members)
        fixed = frozenset(j.names(fix))
        if any(o.config == fixed and not o.failed and not o.unresolved for o, _ in self.history):
            return  # current without the culprits passed: nothing else is broken
        # a failure of another kind without the culprits, that no dependency explains (a delta
        # without the partner it needs to start is no fault of its own)
        second = [(o, s) for o, s in self.history
                  if o.failed and not self._holds(o.config, gone) and not self._same(s, self.symptom)
                  and all(u in j.index for u in o.config) and j.down(j.mask(o.config)) == j.mask(o.config)]
        if not second:
            return
        # the next problem is what current without the culprits shows, when it was run
        second.sort(key=lambda os: os[0].config != fixed)
        self.faults.append(Fault(tuple(v.culprits), v.terms, self.symptom, v, tuple(sorted(left_out))))
        self.symptom, self.provisional = second[0][1], False
        self._rebuild()
        self._maybe_next_problem()  # the trials run so far may settle the new problem too

    def _verdict(self, last: Verdict) -> Verdict:
        v = self._verdict_of(last)
        deps = dependency.checked(self.history, v.dependencies, v.culprits)
        return v if deps == v.dependencies else dataclasses.replace(v, dependencies=deps)

    def _verdict_of(self, last: Verdict) -> Verdict:
        if not self.faults:
            if self.symptom is None and self.stack_state is None:
                return last
            return dataclasses.replace(last, faults=self._own(last), stack_state=self.stack_state)
        faults = tuple(self.faults) + self._own(last)
        found = [f for f in faults if f.verdict.kind in (VerdictKind.CULPRIT, VerdictKind.INTERACTION)]
        texts = " ".join(f"Fault {i} ({self.describe(f.sign)}): {f.verdict.explanation}"
                         for i, f in enumerate(faults, 1))
        deps = tuple(d for f in faults for d in f.verdict.dependencies)
        conf = 1.0
        for f in faults:
            conf *= f.verdict.confidence
        if len(found) < len(faults):  # the last problem found nothing it can name: the run is not done
            return Verdict(VerdictKind.INCONCLUSIVE, (), conf, last.suspects,
                           texts + " The later failure could not be pinned down; the earlier culprits are "
                                   "named in their faults.", (), deps, faults, self.stack_state)
        terms = tuple(t for f in faults for t in f.terms)
        culprits = tuple(dict.fromkeys(u for f in faults for u in f.culprits))
        kind = VerdictKind.INTERACTION if any(len(t) > 1 for t in terms) else VerdictKind.CULPRIT
        suspects = tuple(s for f in faults for s in f.verdict.suspects)
        return Verdict(kind, culprits, conf, suspects, texts, terms, deps, faults, self.stack_state)

    def _own(self, last: Verdict) -> tuple[Fault, ...]:
        if last.kind not in (VerdictKind.CULPRIT, VerdictKind.INTERACTION) and self.faults:
            return (Fault((), (), self.symptom, last),)
        if last.kind not in (VerdictKind.CULPRIT, VerdictKind.INTERACTION):
            return ()
        return (Fault(tuple(last.culprits), last.terms, self.symptom, last),)


__all__ = ["Incident", "MakeSearch"]
