"""The search state machine: premise checks, the structured bisection (stages.py), the checks
before a verdict (checks.py), stopped by the posterior (belief.py). Pure: next() and observe() only.

The search's only state is a frozen `Judge` (judge.py: the evidence and the rules), the current
stage and the pending answer. Every reader (stages, checks, dependency.py, explain.py) gets the
judge; only this module replaces it, with the moves those readers return.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from envbisect.search import checks, dependency, explain
from envbisect.search.belief import NONE
from envbisect.search.judge import Judge, Rules
from envbisect.search.stages import (CheckAlone, CheckTerm, Exhausted, FindUnit, Fold, Move, NewFrame, Split,
                                     SplitTwin, Stage, is_move)
from envbisect.search.types import Hypothesis, Observation, Prior, TrialKind, TrialRequest, Verdict


class Search:
    """Bisect ``units`` (deltas since the baseline) on live hosts.

    >>> s = Search(["A", "B"])
    >>> s.next().purpose
    'premise: current must fail'

    ``confidence``: posterior probability the verdict must reach.  ``max_trials``:
    restart budget (premise checks and unresolved trials included); when it runs
    out below ``confidence`` the verdict is ``inconclusive``.
    ``base_probes``/``max_probes``: probe runs per trial for a deterministic fault,
    and the cap for intermittent ones.  The premise checks always use
    ``max_probes`` (a failing config stops at its first failed run, so this is
    cheap when the fault is deterministic).
    """

    def __init__(
        self,
        units: Sequence[str],
        *,
        confidence: float = 0.95,
        max_trials: int | None = None,
        base_probes: int = 3,
        max_probes: int = 40,
        prior: Prior | None = None,
        require_fix: bool = False,
        premise_probes: int = 12,
        premise_failures: int = 5,
        retries: int = 1,
        twins: Mapping[str, Sequence[str]] | None = None,
        suspicion: Mapping[str, float] | None = None,
    ) -> None:
        units = tuple(units)
        if len(set(units)) != len(units):
            raise ValueError("units must be unique")
        if not 0.5 <= confidence < 1.0:
            raise ValueError("confidence must be in [0.5, 1)")
        if base_probes < 1 or max_probes < base_probes:
            raise ValueError("need 1 <= base_probes <= max_probes")
        if premise_failures < 1:
            raise ValueError("premise_failures must be >= 1")
        if max_trials is not None and max_trials < 1:
            raise ValueError("max_trials must be >= 1")
        twins = dict(twins or {})
        members = [m for ms in twins.values() for m in ms]
        if any(u not in units for u in twins) or len(set(members)) != len(members) or set(members) & set(units):
            raise ValueError("twins: each a unit, its members new unit ids, used once")
        if any(len(ms) != 2 for ms in twins.values()):
            raise ValueError("twins: two members each (a change in two services)")
        self.confidence = confidence
        self.max_trials = max_trials
        self.base_probes = base_probes
        self.max_probes = max_probes
        self.prior = prior or Prior()
        self.require_fix = require_fix
        self.premise_probes = min(max(premise_probes, base_probes), max_probes)
        self.premise_failures = premise_failures
        # retries of an unresolved trial before giving up: 1 for infrastructure trouble; a perf
        # probe's undecided start asks for more (each new start is pooled with the earlier ones)
        self.retries = max(1, retries)
        rules = Rules(confidence, max_trials, base_probes, max_probes, self.prior, require_fix,
                      self.premise_probes, premise_failures, self.retries)
        if suspicion and any(not w > 0 for w in suspicion.values()):
            raise ValueError("suspicion: weights must be > 0 (a hint orders the tests, it rules nothing out)")
        self._judge = Judge.start(units, rules, twins, suspicion)
        self._obs: list[Observation] = []
        self._stage: Stage = FindUnit()
        self._last_request: TrialRequest | None = None
        self._pending: TrialRequest | Verdict = self._decide()
        if isinstance(self._pending, TrialRequest):
            self._last_request = self._pending

    # -- public API -------------------------------------------------------------

    @property
    def units(self) -> tuple[str, ...]:
        return self._judge.units[:self._judge.n]

    @property
    def trials(self) -> int:
        """Restarts consumed so far (resolved and unresolved; a free probe of the running stack is none)."""
        return self._judge.restarts

    @property
    def observations(self) -> tuple[Observation, ...]:
        return tuple(self._obs)

    @property
    def evidence(self) -> Judge:
        """What the search has seen so far, frozen (a later observation does not change it)."""
        return self._judge

    def next(self) -> TrialRequest | Verdict:
        """What to do next.  Pure: the same answer until the next :meth:`observe`."""
        return self._pending

    def observe(self, obs: Observation) -> None:
        """Record the outcome of one trial (normally of the request from :meth:`next`)."""
        if isinstance(self._pending, Verdict):
            raise RuntimeError("the search is finished; no more observations expected")
        unknown = [u for u in obs.config if u not in self._judge.index]
        if unknown:
            raise ValueError(f"unknown units in observation: {sorted(unknown)}")
        if obs.passes < 0:
            raise ValueError("passes must be >= 0")
        if not obs.unresolved and not obs.other and not obs.failed and obs.passes == 0:
            raise ValueError("a passing observation needs at least one passed probe run")
        self._obs.append(obs)
        self._judge = self._judge.observe(obs, obs.trial if obs.trial is not None else len(self._obs))
        self._pending = self._decide()
        j = self._judge
        if isinstance(self._pending, TrialRequest):
            m = j.mask(self._pending.config)
            last = self._last_request
            if (obs.other and last is not None and self._pending.config == last.config == obs.config
                    and self._pending.purpose == last.purpose):
                # the same question, answered by a failure of another kind: asking again cannot change
                # the posterior (a restart loop on production otherwise)
                self._pending = explain.final(j, "repeated", confident=False)
            elif m in j.other and j.status(m, j.belief()) == "other":
                # it would fail differently again: no evidence to gain (the dependency search gave up),
                # and a verdict needing it (the fix, under require_fix) was not observed: inconclusive
                self._pending = explain.final(j, "other", confident=False)
            else:
                self._last_request = self._pending
        if isinstance(self._pending, Verdict) and j.needs:
            self._pending = dataclasses.replace(self._pending, dependencies=self.dependencies)

    def marginals(self) -> dict[str, float]:
        """Posterior probability that each unit is part of the cause (units found in
        earlier rounds carry the confidence they were accepted with)."""
        return dict(explain.marginals(self._judge, self._judge.belief()))

    def hypotheses(self, limit: int = 10) -> tuple[Hypothesis, ...]:
        """The most probable hypotheses (unit level), most probable first."""
        j = self._judge
        post = j.belief()
        conf = j.accepted_conf()
        out: list[Hypothesis] = []
        for p, cls in post.ranked():
            for t in post.expand(cls, limit - len(out)):
                out.append(explain.hypothesis(j, cls.kind, list(j.terms) + ([t] if t else []), p * conf))
            if len(out) >= limit:
                break
        return tuple(out)

    def pass_runs(self) -> int:
        """Probe runs after which a pass of a config that may well be bad (even odds) is
        believable, given what the search has learnt of the fault's intermittency."""
        return self._judge.pass_runs(self._judge.belief())

    def q_belief(self) -> dict[float, float]:
        """Posterior over q, the probability that a bad config passes one probe run."""
        post = self._judge.belief()
        return dict(zip(post.qs, post.q_belief()))

    @property
    def dependencies(self):  # noqa: ANN201 - tuple[Dependency, ...]
        """The deltas found to fail differently from the symptom without a partner."""
        return dependency.describe(self._judge)

    # -- moves: the only changes to the search's state ------------------------------------------

    def _apply(self, move: Move) -> None:
        if isinstance(move, Split):
            count = len(self._judge.twins[move.unit])
            self._judge = self._judge.with_split(move.unit)
            self._stage = SplitTwin(move.unit, move.g, count)
        elif isinstance(move, Fold):
            self._judge = self._judge.with_fold(move.unit)
            self._stage = CheckAlone(move.g)  # it passed alone: settles to its partner search
        elif isinstance(move, NewFrame):
            self._judge = self._judge.with_term(move.term, move.fix)
            self._stage = FindUnit() if self._judge.order else Exhausted()
        else:
            self._stage = move

    def _learn(self, need: dependency.Need) -> None:
        """Record a dependency; a stage that points into the order keeps pointing at its unit."""
        old = self._judge
        self._judge = old.with_need(need.needy, need.partners)
        g = getattr(self._stage, "g", None)
        if g is not None and self._judge.order != old.order:
            self._stage = dataclasses.replace(self._stage, g=self._judge.order.index(old.order[g]))

    # -- the state machine ---------------------------------------------------------

    def _decide(self) -> TrialRequest | Verdict:
        retry = self._retry()
        if retry is not None:
            return retry
        if self.max_trials is not None and self.trials >= self.max_trials:
            return self._at_budget()
        premise = self._premises()
        if premise is not None:
            return premise
        return self._structured()

    def _at_budget(self) -> Verdict:
        """Out of restarts: the confident verdict, unless a check its policy requires (the fix seen
        passing, a failure after a co-restart, a pass re-tested) is still a trial away."""
        j = self._judge
        premise = self._premises()
        if isinstance(premise, Verdict):
            return premise
        post = j.belief()
        if premise is None and post.z > 0:
            _p, top, conf = j.assess(post)
            if conf >= self.confidence:
                pending = (checks.fluke_check(j, post, top) or checks.solo_pass_check(j, post, top)
                           or checks.fix_observed(j, post, top) or checks.restart_proof(j, post, top))
                if pending is None:
                    return explain.verdict(j, post, top, conf)
        return explain.final(j, "budget", confident=False)

    def _retry(self) -> TrialRequest | Verdict | None:
        """An unresolved trial is retried (once, or `retries` times), then the search gives up."""
        if not (self._obs and self._obs[-1].unresolved and self._last_request is not None):
            return None
        last = self._last_request
        streak = 0
        for o in reversed(self._obs):
            if not (o.unresolved and o.config == last.config):
                break
            streak += 1
        if streak > self.retries:
            return self._premise_unresolved(last.config) or explain.final(
                self._judge, "infrastructure", ran=self._unresolved_premises())
        if streak < 1:
            return None
        if self.max_trials is not None and self.trials >= self.max_trials:
            return explain.final(self._judge, "budget")
        purpose = last.purpose
        if last.kind is not TrialKind.RETRY:
            purpose = "retry (last trial unresolved): " + purpose
        return TrialRequest(last.config, last.probes, purpose, kind=TrialKind.RETRY)

    def _premise_unresolved(self, config: frozenset[str]) -> TrialRequest | None:
        """Current unresolved when retried (its start command exited non-zero, say, and nothing yet
        shows the command works): the baseline runs next, as it shows whether the same start commands
        work in this run; once it has, current is tried again and its failure is evidence."""
        j = self._judge
        if j.n == 0 or config != frozenset(j.names(j.all)) or any(o.config == frozenset() for o in self._obs):
            return None
        if self.max_trials is not None and self.trials >= self.max_trials:
            return None
        return TrialRequest(frozenset(), self.premise_probes, "premise: baseline must pass (current stayed "
                            "unresolved: does the same start command work in this run?)",
                            kind=TrialKind.PREMISE_BASELINE)

    def _unresolved_premises(self) -> str:
        """What was run of the premises and stayed unresolved, for the explanation ("" when the
        baseline gave an answer)."""
        j = self._judge
        if j.configs.get(0) is not None:
            return ""
        cur, base = frozenset(j.names(j.all)), frozenset()
        seen = {c: [str(o.trial if o.trial is not None else i) for i, o in enumerate(self._obs, 1)
                    if o.config == c and o.unresolved] for c in (cur, base)}
        parts = [f"{what} (trials {', '.join(seen[c])})" for what, c in (("current", cur), ("the baseline", base))
                 if seen[c]]
        return " and ".join(parts) + " were unresolved" if len(parts) > 1 else (
            parts[0] + " was unresolved" if parts else "")

    def _premises(self) -> TrialRequest | Verdict | None:
        """Current must fail and the baseline must pass before anything is bisected."""
        j = self._judge
        cur = j.configs.get(j.all)
        if cur is None:
            # Probing a failing config past its first failure is cheap and measures how often it
            # fails: the estimate of q every later pass is judged by.
            what = "current (no deltas: the baseline)" if j.n == 0 else "current"
            return TrialRequest(frozenset(j.names(j.all)), self.premise_probes, f"premise: {what} must fail",
                                stop_after=self.premise_failures, free=True, kind=TrialKind.PREMISE_CURRENT)
        if not cur.failed or (not cur.restarted_fail and cur.restarted_passes >= self.premise_probes):
            return explain.not_reproduced(j)
        if j.n == 0:
            if not cur.restarted_fail:
                # the running stack failed as it ran; a co-restart may clear it (a service restarted
                # alone holds more than its files), so "not the config" needs a failure after one
                return TrialRequest(frozenset(), self.premise_probes,
                                    "confirm after a co-restart: current (no deltas: the baseline) failed as it "
                                    "was running", stop_after=self.premise_failures, kind=TrialKind.CONFIRM)
            return explain.not_config(j)
        base = j.configs.get(0)
        if base is None and 0 in j.other:
            return explain.final(j, "baseline-other")
        if base is None:
            post = j.belief()
            runs = max(self.premise_probes, j.pass_runs(post))
            return TrialRequest(frozenset(), runs, "premise: baseline must pass", kind=TrialKind.PREMISE_BASELINE)
        if base.failed:
            return explain.not_config(j)
        return None

    def _structured(self) -> TrialRequest | Verdict:
        """The structured search, stopped by the posterior."""
        for _ in range(4 * self._judge.n + 16):
            void = self._judge.void_term()
            if void is not None:  # a culprit accepted on a pass that failed since: a suspect again
                self._judge = self._judge.without_term(void)
                self._stage = FindUnit()
                continue
            if isinstance(self._stage, CheckTerm) and self._judge.lost_proof(self._stage.term):
                self._stage = FindUnit()  # the term found rests on a pass that failed since
                continue
            moved = self._stage.after_failure(self._judge)
            if moved is not None:
                self._apply(moved)
                continue
            j = self._judge
            post = j.belief()
            if post.z <= 0:
                return explain.final(j, "contradiction")
            if j.other:  # a config that failed differently: find the delta that needs a partner first
                dep = dependency.step(j, post)
                if isinstance(dep, dependency.Need):
                    self._learn(dep)
                    continue
                if isinstance(dep, dependency.Skip):
                    old = j
                    self._judge = j = j.with_skip(dep.mask, dep.needy)
                    g = getattr(self._stage, "g", None)
                    if g is not None and j.order != old.order:
                        self._stage = dataclasses.replace(self._stage, g=j.order.index(old.order[g]))
                    continue
                if isinstance(dep, dependency.GiveUp):
                    self._judge = j = j.without_dependency_search()
                elif dep is not None:
                    return dep
            moved = self._stage.settle(j, post)
            if moved is not None:
                self._apply(moved)
                continue
            p_top, top, conf = j.assess(post)
            step = self._stage.step(j, post)
            # "not the config" after the baseline passed its premise is a frame that cannot hold what
            # it saw (two culprits, one of them intermittent, before the first is accepted): while
            # the structured search still has a question, it is asked first
            if conf >= self.confidence and not (top.kind == NONE and isinstance(step, TrialRequest)
                                                and 0 in j.configs and not j.failed(0)):
                return self._conclude(post, top, conf)
            if is_move(step):
                self._apply(step)  # type: ignore[arg-type]
                continue
            if step is None:
                step = checks.fallback(j, post)
            if step is None:
                return self._exhausted()
            return step  # type: ignore[return-value]
        return explain.final(self._judge, "exhausted")  # pragma: no cover - defensive

    def _conclude(self, post, top, conf: float) -> TrialRequest | Verdict:  # noqa: ANN001 - Belief, HypClass
        """Confident: the checks a verdict must pass first, each a trial when it fails, then the verdict."""
        j = self._judge
        fluke = checks.fluke_check(j, post, top)
        if fluke == checks.CONTRADICTION:
            return explain.final(j, "contradiction")
        if fluke is not None:
            return fluke  # type: ignore[return-value]
        solo = checks.solo_pass_check(j, post, top)
        if solo is not None:
            return solo
        fix = checks.fix_observed(j, post, top) or checks.restart_proof(j, post, top)
        if fix is not None:
            return fix
        spare = checks.spare_check(j, post, top)
        return spare if spare is not None else explain.verdict(j, post, top, conf)

    def _exhausted(self) -> TrialRequest | Verdict:
        """Nothing more to ask: a last look for a pair member never seen alone, else inconclusive."""
        j = self._judge
        final = j.belief()
        if final.z > 0:
            _p, ftop, fconf = j.assess(final)
            solo = checks.solo_pass_check(j, final, ftop) if fconf >= self.confidence else None
            if solo is not None:
                return solo
        return explain.final(j, "exhausted")
