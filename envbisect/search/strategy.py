"""The search state machine: premise checks, the structured bisection (stages), confirmations,
re-tests and the fallback, stopped by the posterior (belief.py). Pure: next() and observe() only.

Size (578 lines): premise checks, fluke re-tests, confirmations and the verdict all read the same posterior and evidence; the stages are in stages.py, the maths in belief.py, the sentences in explain.py.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from envbisect.search.belief import PAIR, NONE, NOTHING, SINGLE, Belief, bits
from envbisect.search.explain import VerdictWriter
from envbisect.search import dependency
from envbisect.search.stages import AGAIN, Exhausted, FindUnit, Stage
from envbisect.search.types import Hypothesis, Observation, Prior, TrialKind, TrialRequest, Verdict, restart_bound




@dataclass
class _Evidence:
    passes: int = 0
    failed: bool = False
    resolved: int = 0
    restarted_fail: bool = False  # a failure seen after a co-restart (not only on the running stack)
    restarted_passes: int = 0
    trials: list[int] = field(default_factory=list)  # 1-based trial numbers, for "observed in trial N"
    failed_trials: list[int] = field(default_factory=list)
    passed_trials: list[int] = field(default_factory=list)  # trials of this config with no failed run


class Search(VerdictWriter):
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

    _AGAIN = AGAIN

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
        self._units = units
        self._index = {u: i for i, u in enumerate(units)}
        self._n = len(units)
        self._all = (1 << self._n) - 1
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
        # Doubt accepted for one pass before building on it.  A bisection builds on about
        # log2(n) passes, and a verdict resting on one lucky pass blames an innocent delta, so
        # each pass must be much surer than the verdict as a whole.
        self._tau = (1.0 - confidence) / 20.0
        self._retest_cap = 3 * max_probes  # passes of one config beyond which it is not re-tested
        self._obs: list[Observation] = []
        self._resolved: list[tuple[int, int, int]] = []
        self._evidence: dict[int, _Evidence] = {}
        self._terms: list[int] = []  # accepted terms (masks), one per closed frame
        self._term_conf: list[float] = []
        self._order: list[int] = list(range(self._n))  # units of the current frame, in bisection order
        self._stage: Stage = FindUnit()
        # another failure (search/dependency.py): configs that failed differently from the symptom
        # (mask -> trial numbers), and what was learnt from them: a unit -> the partners it needs
        self._other: dict[int, list[int]] = {}
        self._needs: dict[int, int] = {}
        self._needs_found: list[tuple[int, int]] = []
        self._dep_given_up = False
        self._last_request: TrialRequest | None = None
        self._pending: TrialRequest | Verdict = self._decide()
        if isinstance(self._pending, TrialRequest):
            self._last_request = self._pending

    # -- public API -------------------------------------------------------------

    @property
    def units(self) -> tuple[str, ...]:
        return self._units

    @property
    def trials(self) -> int:
        """Restarts consumed so far (resolved and unresolved; a free probe of the running stack is none)."""
        return sum(1 for o in self._obs if not o.free)

    @property
    def observations(self) -> tuple[Observation, ...]:
        return tuple(self._obs)

    def next(self) -> TrialRequest | Verdict:
        """What to do next.  Pure: the same answer until the next :meth:`observe`."""
        return self._pending

    def observe(self, obs: Observation) -> None:
        """Record the outcome of one trial (normally of the request from :meth:`next`)."""
        if isinstance(self._pending, Verdict):
            raise RuntimeError("the search is finished; no more observations expected")
        unknown = [u for u in obs.config if u not in self._index]
        if unknown:
            raise ValueError(f"unknown units in observation: {sorted(unknown)}")
        if obs.passes < 0:
            raise ValueError("passes must be >= 0")
        if not obs.unresolved and not obs.other and not obs.failed and obs.passes == 0:
            raise ValueError("a passing observation needs at least one passed probe run")
        self._obs.append(obs)
        if obs.other:
            self._other.setdefault(self._mask(obs.config), []).append(
                obs.trial if obs.trial is not None else len(self._obs))
        elif not obs.unresolved:
            mask = self._mask(obs.config)
            self._resolved.append((mask, obs.passes, obs.failures))
            ev = self._evidence.setdefault(mask, _Evidence())
            ev.passes += obs.passes
            ev.failed = ev.failed or obs.failed
            ev.restarted_fail = ev.restarted_fail or (obs.failed and not obs.free)
            ev.restarted_passes += 0 if obs.free else obs.passes
            ev.resolved += 1
            n = obs.trial if obs.trial is not None else len(self._obs)
            ev.trials.append(n)
            (ev.failed_trials if obs.failed else ev.passed_trials).append(n)
        self._pending = self._decide()
        if isinstance(self._pending, TrialRequest):
            m = self._mask(self._pending.config)
            if m in self._other and self._status(m, self._belief()) == "other":
                # it would fail differently again: no evidence to gain (the dependency search gave up),
                # and a verdict needing it (the fix, under require_fix) was not observed: inconclusive
                self._pending = self._final("other", confident=False)
            else:
                self._last_request = self._pending
        if isinstance(self._pending, Verdict) and self._needs:
            self._pending = dataclasses.replace(self._pending, dependencies=self.dependencies)

    def marginals(self) -> dict[str, float]:
        """Posterior probability that each unit is part of the cause (units found in
        earlier rounds carry the confidence they were accepted with)."""
        return dict(self._marginals(self._belief()))

    def hypotheses(self, limit: int = 10) -> tuple[Hypothesis, ...]:
        """The most probable hypotheses (unit level), most probable first."""
        post = self._belief()
        conf = self._accepted_conf()
        out: list[Hypothesis] = []
        for p, cls in post.ranked():
            for t in post.expand(cls, limit - len(out)):
                out.append(self._hypothesis(cls.kind, self._terms + ([t] if t else []), p * conf))
            if len(out) >= limit:
                break
        return tuple(out)

    def pass_runs(self) -> int:
        """Probe runs after which a pass of a config that may well be bad (even odds) is
        believable, given what the search has learnt of the fault's intermittency."""
        post = self._belief()
        return self._runs_for(0.5, post.q_given_bad(self._all), post.qs)

    def q_belief(self) -> dict[float, float]:
        """Posterior over q, the probability that a bad config passes one probe run."""
        post = self._belief()
        return dict(zip(post.qs, post.q_belief()))

    # -- helpers ----------------------------------------------------------------

    def _mask(self, units: Iterable[str]) -> int:
        m = 0
        for u in units:
            m |= 1 << self._index[u]
        return m

    def _names(self, mask: int) -> tuple[str, ...]:
        return tuple(self._units[i] for i in bits(mask))

    def _fmt(self, mask: int) -> str:
        names = self._names(mask)
        if not names:
            return "the baseline"
        if len(names) <= 4:
            return "{" + ", ".join(names) + "}"
        return "{" + ", ".join(names[:3]) + f", ... ({len(names)} units)" + "}"

    def _prefix(self, k: int, seq: Sequence[int], base: int = 0) -> int:
        m = base
        for u in seq[:k]:
            m |= 1 << u
        return self._up(m)

    # -- another failure: deltas that need a partner (search/dependency.py) ---------------------

    def _up(self, mask: int) -> int:
        """``mask`` with the partners of every unit in it that needs one (never e without p)."""
        if not self._needs:
            return mask
        while True:
            m = mask
            for e, partners in self._needs.items():
                if (m >> e) & 1:
                    m |= partners
            if m == mask:
                return m
            mask = m

    def _down(self, mask: int) -> int:
        """``mask`` without every unit whose partner it lacks (a fix never leaves e without p)."""
        if not self._needs:
            return mask
        while True:
            m = mask
            for e, partners in self._needs.items():
                if (m >> e) & 1 and (m & partners) != partners:
                    m &= ~(1 << e)
            if m == mask:
                return m
            mask = m

    def _ranked(self, mask: int) -> list[int]:
        """The units of ``mask`` in the search's order (frame order, then the others by index)."""
        pos = {u: i for i, u in enumerate(self._order)}
        return sorted(bits(mask), key=lambda u: (pos.get(u, self._n), u))

    def _learn_need(self, e: int, partners: int) -> None:
        """Record that unit ``e`` needs ``partners``; move them before it in the bisection order,
        so no prefix holds e without them (the stage's unit keeps its identity)."""
        self._needs[e] = self._needs.get(e, 0) | partners
        self._needs_found.append((e, partners))
        old = list(self._order)
        if e in old:
            order = [u for u in old if not ((partners >> u) & 1 and old.index(u) > old.index(e))]
            moved = [u for u in old if (partners >> u) & 1 and old.index(u) > old.index(e)]
            i = order.index(e)
            order[i:i] = moved
            if order != old:
                g = getattr(self._stage, "g", None)
                self._order = order
                if g is not None:
                    self._stage = dataclasses.replace(self._stage, g=order.index(old[g]))

    @property
    def dependencies(self):  # noqa: ANN201 - tuple[Dependency, ...]
        """The deltas found to fail differently from the symptom without a partner."""
        return dependency.describe(self)

    def _belief(self, exclude: int | None = None, extra: int = 0) -> Belief:
        """Belief of the current frame; ``extra``: of the next frame, with ``extra``
        accepted too; ``exclude``: ignoring the observations of that config."""
        obs = self._resolved if exclude is None else [o for o in self._resolved if o[0] != exclude]
        # a unit that needs an accepted culprit never runs without it: whether it breaks the stack
        # too cannot be seen, so it is no suspect (search/dependency.py; the verdict names the pair)
        held = self._vars() | extra if self._needs else 0
        return Belief(
            frame_units=[u for u in self._order if not (extra >> u) & 1
                         and not (self._up(1 << u) & ~(1 << u) & held)],
            terms=self._terms + ([extra] if extra else []),
            obs=obs,
            prior=self.prior,
            same=[(e, p) for e in self._needs for p in bits(self._up(1 << e) & ~(1 << e))],
        )

    def _accepted_conf(self) -> float:
        c = 1.0
        for x in self._term_conf:
            c *= x
        return c

    def _vars(self) -> int:
        m = 0
        for t in self._terms:
            m |= t
        return m

    def _fix_mask(self, term: int) -> int:
        """Current minus every culprit found so far and ``term`` (and what needs them)."""
        return self._down(self._all & ~(self._vars() | term))

    def _status(self, mask: int, post: Belief) -> str:
        ev = self._evidence.get(mask)
        if ev is None or ev.resolved == 0:
            return "other" if mask in self._other else "untested"
        if ev.failed:
            return "fail"
        if ev.passes >= self._retest_cap or post.p_bad(mask) <= self._tau:
            return "pass"
        return "weak"

    def _probes(self, mask: int, post: Belief) -> int:
        """Fewest runs (>= base_probes) after which a pass leaves P(config bad) <= tau."""
        pb = post.p_bad(mask)
        if pb <= 0:
            return self.base_probes
        if pb >= 1:
            return self.max_probes
        return self._runs_for(pb, post.q_given_bad(mask), post.qs)

    @staticmethod
    def _doubt_after(pb: float, qd: Sequence[float], qs: Sequence[float], r: int) -> float:
        """P(config bad | it passed r runs), for a prior pb of bad and the belief qd over q."""
        lucky = sum(p * q**r for q, p in zip(qs, qd))
        return pb * lucky / (pb * lucky + (1 - pb))

    def _runs_for(self, pb: float, qd: Sequence[float], qs: Sequence[float]) -> int:
        for r in range(self.base_probes, self.max_probes + 1):
            if self._doubt_after(pb, qd, qs, r) <= self._tau:
                return r
        return self.max_probes

    def _request(self, mask: int, purpose: str, post: Belief, kind: TrialKind,
                 suspects_left: int | None = None) -> TrialRequest:
        return TrialRequest(frozenset(self._names(mask)), self._probes(mask, post), purpose, kind=kind,
                            suspects_left=suspects_left)

    def _retest(self, mask: int, post: Belief) -> TrialRequest:
        ev = self._evidence[mask]
        return self._request(
            mask, f"retest: {self._fmt(mask)} passed {ev.passes} runs, too few to rule out an intermittent fault", post,
            TrialKind.RETEST)

    def _assess(self, post: Belief) -> tuple[float, tuple, float]:
        """(probability of the top class's first hypothesis, the class, verdict confidence).

        The verdict confidence multiplies the confidence of earlier culprits, the
        top hypothesis of this frame, and the probability that there is no further
        independent culprit (judged in the next frame)."""
        p_top, top = post.ranked()[0]
        conf = p_top * self._accepted_conf()
        if top.kind in (SINGLE, PAIR):
            conf *= self._belief(extra=post.term(top)).p_nothing()
        return p_top, top, conf

    # -- the state machine ---------------------------------------------------------

    def _decide(self) -> TrialRequest | Verdict:
        # 1. an unresolved trial is retried (once, or `retries` times), then the search gives up
        if self._obs and self._obs[-1].unresolved and self._last_request is not None:
            last = self._last_request
            streak = 0
            for o in reversed(self._obs):
                if not (o.unresolved and o.config == last.config):
                    break
                streak += 1
            if streak > self.retries:
                return self._final("infrastructure")
            if streak >= 1:
                if self.max_trials is not None and self.trials >= self.max_trials:
                    return self._final("budget")
                purpose = last.purpose
                if last.kind is not TrialKind.RETRY:
                    purpose = "retry (last trial unresolved): " + purpose
                return TrialRequest(last.config, last.probes, purpose, kind=TrialKind.RETRY)
        if self.max_trials is not None and self.trials >= self.max_trials:
            return self._final("budget")
        # 2. premise checks
        cur = self._evidence.get(self._all)
        if cur is None:
            # Probing a failing config past its first failure is cheap and measures how often it
            # fails: the estimate of q every later pass is judged by.
            what = "current (no deltas: the baseline)" if self._n == 0 else "current"
            return TrialRequest(frozenset(self._units), self.premise_probes, f"premise: {what} must fail",
                                stop_after=self.premise_failures, free=True, kind=TrialKind.PREMISE_CURRENT)
        if not cur.failed or (not cur.restarted_fail and cur.restarted_passes >= self.premise_probes):
            return self._not_reproduced()
        if self._n == 0:
            if not cur.restarted_fail:
                # the running stack failed as it ran; a co-restart may clear it (a service restarted
                # alone holds more than its files), so "not the config" needs a failure after one
                return TrialRequest(frozenset(), self.premise_probes,
                                    "confirm after a co-restart: current (no deltas: the baseline) failed as it "
                                    "was running", stop_after=self.premise_failures, kind=TrialKind.CONFIRM)
            return self._not_config()
        base = self._evidence.get(0)
        if base is None and 0 in self._other:
            return self._final("baseline-other")
        if base is None:
            post = self._belief()
            runs = max(self.premise_probes, self._runs_for(0.5, post.q_given_bad(self._all), post.qs))
            return TrialRequest(frozenset(), runs, "premise: baseline must pass", kind=TrialKind.PREMISE_BASELINE)
        if base.failed:
            return self._not_config()
        # 3. structured search, stopped by the posterior
        for _ in range(4 * self._n + 16):
            if self._transition():
                continue
            post = self._belief()
            if post.z <= 0:
                return self._final("contradiction")
            if self._other:  # a config that failed differently: find the delta that needs a partner first
                dep = dependency.step(self, post)
                if dep is self._AGAIN:
                    continue
                if dep is not None:
                    return dep  # type: ignore[return-value]
            if self._settle(post):
                continue
            p_top, top, conf = self._assess(post)
            if conf >= self.confidence:
                fluke = self._fluke_check(post, top)
                if fluke == "contradiction":
                    return self._final("contradiction")
                if fluke is not None:
                    return fluke  # type: ignore[return-value]
                solo = self._solo_pass_check(post, top)
                if solo is not None:
                    return solo
                fix = self._fix_observed(post, top) or self._restart_proof(post, top)
                if fix is not None:
                    return fix
                spare = self._spare_check(post, top)
                return spare if spare is not None else self._verdict(post, top, conf)
            step = self._stage_step(post)
            if step is self._AGAIN:
                continue
            if step is None:
                step = self._fallback(post)
            if step is None:
                final = self._belief()
                if final.z > 0:
                    _p, ftop, fconf = self._assess(final)
                    solo = self._solo_pass_check(final, ftop) if fconf >= self.confidence else None
                    if solo is not None:
                        return solo
                return self._final("exhausted")
            return step  # type: ignore[return-value]
        return self._final("exhausted")  # pragma: no cover - defensive

    def _new_frame(self, term: int, fix: int) -> None:
        # How sure we are that ``term`` is a culprit.  The frame cannot express
        # "this term plus another culprit", so this is judged on the evidence from
        # before the failed fix check.
        conf = self._belief(exclude=fix).p_has_term(term)
        self._terms.append(term)
        self._term_conf.append(min(1.0, conf))
        self._order = [u for u in self._order if not (term >> u) & 1]
        self._stage = FindUnit() if self._order else Exhausted()

    def _failed(self, mask: int) -> bool:
        ev = self._evidence.get(mask)
        return ev is not None and ev.failed

    def _transition(self) -> bool:
        """Apply a stage transition that an observed failure settles (stages.py)."""
        return self._stage.after_failure(self)

    def _settle(self, post: Belief) -> bool:
        """Apply a stage transition the evidence settles given the posterior (stages.py)."""
        return self._stage.settle(self, post)

    def _fluke_check(self, post: Belief, top: tuple) -> TrialRequest | str | None:
        """Before concluding: if the leading hypothesis needs an observed pass to have
        been luck (a bad config passing every run), re-test that config first."""
        if top.kind == NOTHING and not self._terms:
            return None
        t = post.term(top)
        terms = self._terms + ([t] if t else [])
        worst: tuple[int, int] | None = None
        for mask, ev in self._evidence.items():
            if ev.failed or not (top.kind == NONE or any(tt & mask == tt for tt in terms)):
                continue
            if ev.passes >= self._retest_cap:
                return "contradiction"  # it would need a bad config to pass this many runs
            if worst is None or ev.passes < worst[1]:
                worst = (mask, ev.passes)
        if worst is None:
            return None
        mask, passes = worst
        return self._request(
            mask, f"retest: {self._fmt(mask)} passed {passes} runs, but the leading hypothesis says it is bad", post,
            TrialKind.RETEST)

    def _stage_step(self, post: Belief) -> object:
        return self._stage.step(self, post)

    def _bisect(self, post: Belief, length: int, cfg, label: str) -> object:
        """Prefix bisection over ``cfg(0) .. cfg(length)``: ``cfg(length)`` failed and
        ``cfg(0)`` passed.  Returns the minimal failing prefix length (an int) once
        settled, else the next request.  Rebuilt from the evidence every time, so a
        re-test that turns a pass into a failure is taken into account."""
        hi = length
        for k in range(length, -1, -1):
            if self._status(cfg(k), post) == "fail":
                hi = k
        lo = 0
        for k in range(hi):
            if self._status(cfg(k), post) in ("pass", "weak"):
                lo = k
        while True:
            if hi == 0:
                return 0
            if self._status(cfg(lo), post) == "weak":
                return self._retest(cfg(lo), post)
            if hi - lo <= 1:
                return hi
            mid = lo + (hi - lo + 1) // 2
            st = self._status(cfg(mid), post)
            if st == "fail":
                hi = mid
            elif st == "pass":
                lo = mid
            elif st == "weak":
                return self._retest(cfg(mid), post)
            else:
                return self._request(cfg(mid), label.format(n=hi - lo), post, TrialKind.BISECT, hi - lo)

    def _confirm(self, post: Belief, term: int, need_surprise: bool = False) -> TrialRequest | None:
        """Check the claim about ``term`` most likely to be overturned: that it breaks
        the stack alone (without the other deltas), or that current without it passes."""
        names = self._names(term)
        cands: list[tuple[float, int, str]] = []
        alone = self._up(term)  # with the partners it needs to start (search/dependency.py)
        if self._status(alone, post) in ("untested", "weak"):
            surprise = 1.0 - post.p_bad(alone)
            what = (f"does {names[0]} break the stack alone?" if len(names) == 1
                    else f"do {' + '.join(names)} break the stack together, alone?")
            if alone != term:
                what = what[:-1] + f" (with {', '.join(self._names(alone & ~term))}, which it needs)?"
            cands.append((surprise, alone, "confirm: " + what))
        vf = self._fix_mask(term)
        if self._status(vf, post) in ("untested", "weak"):
            surprise = self._belief(extra=term).p_bad(vf)
            cands.append((surprise, vf, f"confirm: current without {', '.join(self._names(self._vars() | term))} "
                                        "(the fix) must pass"))
        if need_surprise:
            cands = [c for c in cands if c[0] > 1e-6]
        if not cands:
            return None
        cands.sort(key=lambda c: -c[0])  # stable: "alone" first on ties
        if cands[0][1] == vf:
            return self.fix_request(vf, cands[0][2], post)
        return self._request(cands[0][1], cands[0][2], post, TrialKind.CONFIRM)

    def fix_request(self, mask: int, purpose: str, post: Belief) -> TrialRequest:
        """The fix (current minus the culprits) must pass believably on its own: as many runs as a
        pass of a config at even odds of being bad needs, given the intermittency learnt so far.
        The posterior alone would accept it after base_probes runs (a further culprit is a priori
        unlikely), and with a fault that shows in 30% of runs a bad config passes 3 runs a third
        of the time: a second culprit would be missed that often (red-team S08). Probe runs are
        cheap next to restarts; a deterministic fault keeps base_probes."""
        req = self._request(mask, purpose, post, TrialKind.CONFIRM)
        runs = max(req.probes, self._runs_for(0.5, post.q_given_bad(self._all), post.qs))
        return dataclasses.replace(req, probes=runs) if runs != req.probes else req

    def _solo_pass_check(self, post: Belief, top: tuple) -> TrialRequest | None:
        """"They fail only together" rests on each member having passed without the other: in a
        config that held it but not the whole pair. Under the pair hypothesis those passes look
        certain, so the posterior never doubts them; with an intermittent fault a single culprit
        passes by luck, and the verdict would name an innocent partner. So, for each member, the
        passes of all such configs together must be believable at even odds (P(bad | passes) <= tau
        with a prior of 1/2, as if it were a culprit alone), else it is probed alone (again)."""
        if top.kind != PAIR:
            return None
        term = post.term(top)
        qd = list(post.q_given_bad(self._all))
        if qd and qd[0] < 0.5 and post.qs[0] == 0.0:
            # Evidently intermittent. The estimate of q comes from few runs and leans low exactly
            # when bad configs passed by luck, so every rate on the grid keeps some weight here.
            qd = [max(p, 0.1) if q > 0 else p for q, p in zip(post.qs, qd)]
            total = sum(qd)
            qd = [p / total for p in qd]
        runs = max(self._runs_for(0.5, qd, post.qs), self.base_probes)
        for u in bits(term):
            name = self._units[u]
            passes = sum(ev.passes for m, ev in self._evidence.items()
                         if (m >> u) & 1 and (m & term) != term and not ev.failed)
            solo = self._up(1 << u)
            if self._status(solo, post) == "other":
                continue  # it cannot run without its partner: nothing to learn alone
            if passes == 0:
                if not self.require_fix:
                    continue  # policy fast: inferred, and the explanation says so
                return TrialRequest(frozenset(self._names(solo)), runs, f"confirm: does {name} break the stack alone?",
                                    kind=TrialKind.CONFIRM)
            if self._doubt_after(0.5, qd, post.qs, passes) > self._tau:
                ev = self._evidence.get(1 << u)
                if ev is not None and ev.passes >= self._retest_cap:
                    continue
                return TrialRequest(frozenset(self._names(solo)), runs,
                                    f"retest: {name} passed {passes} runs without its partner, too few to rule out "
                                    "that it breaks the stack alone, intermittently", kind=TrialKind.RETEST)
        return None

    def _fix_observed(self, post: Belief, top: tuple) -> TrialRequest | None:
        """With ``require_fix``, "these are all the culprits" is observed, never inferred:
        current minus every culprit must have passed before the verdict is given."""
        if not self.require_fix or top.kind not in (SINGLE, PAIR):
            return None
        term = post.term(top)
        vf = self._fix_mask(term)
        if self._status(vf, post) == "pass":
            return None
        names = ", ".join(self._names(self._vars() | term))
        return self.fix_request(vf, f"confirm: current without {names} (the fix) must pass", post)

    def _restart_proof(self, post: Belief, top: tuple) -> TrialRequest | None:
        """A culprit is never blamed on the running stack's word alone: its state may hold more
        than its files (a service restarted alone).  Each blamed term must have failed in some
        config after a full co-restart; if only the free probe saw it, co-restart current."""
        if top.kind not in (SINGLE, PAIR):
            return None
        t = post.term(top)
        for term in self._terms + ([t] if t else []):
            if not any(ev.restarted_fail and (m & term) == term for m, ev in self._evidence.items()):
                return TrialRequest(frozenset(self._units), self.premise_probes,
                                    "confirm after a co-restart: current failed as it was running",
                                    kind=TrialKind.CONFIRM)
        return None

    def _spare_check(self, post: Belief, top: tuple) -> TrialRequest | None:
        """Confident already; but if a claim rests on the prior and checking it stays
        within the restart bound promised for this kind of answer, check it."""
        if top.kind not in (SINGLE, PAIR):
            return None
        if self._terms:  # a further culprit: its own claims within the bound for several culprits
            if self.trials + 1 > restart_bound(self._n, "several"):
                return None
        elif self.trials + 1 > restart_bound(self._n, "culprit" if top.kind == SINGLE else "interaction"):
            return None
        return self._confirm(post, post.term(top))

    def _fallback(self, post: Belief) -> TrialRequest | None:
        """The structured steps are spent and the posterior is not confident: run the
        most informative check (a unit or pair alone, a fix check, or a re-test)."""
        cands: dict[int, str] = {}
        for _, cls in post.ranked()[:6]:
            t = self._up(post.term(cls))
            if t:
                cands.setdefault(t, f"check: does {' + '.join(self._names(t))} break the stack alone?")
        for mask, ev in self._evidence.items():
            if not ev.failed:
                cands.setdefault(mask, f"retest: {self._fmt(mask)} passed {ev.passes} runs")
        best: tuple[float, int, str, int] | None = None
        for mask, purpose in cands.items():
            ev = self._evidence.get(mask)
            if ev is not None and (ev.failed or ev.passes >= self._retest_cap):
                continue
            if ev is None and mask in self._other:
                continue  # it fails differently: no evidence about the symptom to gain
            r = self._probes(mask, post)
            gain = post.eig(mask, r)
            if best is None or gain > best[0] + 1e-12:
                best = (gain, mask, purpose, r)
        top_term = post.term(post.ranked()[0][1])
        if top_term:
            vf = self._fix_mask(top_term)
            ev = self._evidence.get(vf)
            if (ev is None and vf not in self._other) or (ev is not None and not ev.failed
                                                          and ev.passes < self._retest_cap):
                nxt = self._belief(extra=top_term)
                r = self._probes(vf, nxt)
                gain = nxt.eig(vf, r)
                if best is None or gain > best[0] + 1e-12:
                    best = (gain, vf, f"check: current without {', '.join(self._names(self._vars() | top_term))}", r)
        if best is None or best[0] < 0.01:
            return None
        kind = TrialKind.RETEST if best[2].startswith("retest") else TrialKind.CHECK
        return TrialRequest(frozenset(self._names(best[1])), best[3], best[2], kind=kind)
