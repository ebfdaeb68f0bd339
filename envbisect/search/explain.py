"""Verdicts and their explanations: every sentence observed (with its trial) or marked inferred.

A mixin of `Search`: it reads the search's evidence and belief, never changes them."""
from __future__ import annotations


from envbisect.search.belief import NONE, Belief, bits
from envbisect.search.types import Hypothesis, Verdict


class VerdictWriter:
    """The verdict half of `Search` (see strategy.py)."""



    def _marginals(self, post: Belief) -> list[tuple[str, float]]:
        conf = self._accepted_conf()
        marg = {u: p * conf for u, p in post.marginals().items()}
        for t, c in zip(self._terms, self._term_conf):
            for u in bits(t):
                marg[u] = c
        items = sorted(marg.items(), key=lambda t: (-t[1], t[0]))
        return [(self._units[u], p) for u, p in items]

    def _suspects(self, post: Belief) -> tuple[tuple[str, float], ...]:
        return tuple((u, round(p, 4)) for u, p in self._marginals(post) if p >= 1e-3)[:20]

    def _not_reproduced(self) -> Verdict:
        ev = self._evidence[self._all]
        trials = ", ".join(str(t) for t in ev.trials)
        if ev.failed:  # it failed as it was running, and passed after a full co-restart
            return Verdict(
                "not-reproduced", (), 1.0, (),
                f"Observed: the running stack failed (trial {ev.trials[0]}), but after a full ordered co-restart "
                f"the same config passed {ev.restarted_passes} probe runs (trial {ev.trials[-1]}): the files are "
                "not the cause; the running state was (a service restarted alone, or a stale process).",
            )
        conf = 1.0 - self._belief().p_bad(self._all)
        return Verdict(
            "not-reproduced",
            (),
            conf,
            (),
            f"Observed: the current config passed all {ev.passes} probe runs (trial {trials}): the failure did "
            "not reproduce, so nothing was bisected (check the probe, or run again while the fault shows).",
        )

    def _not_config(self) -> Verdict:
        what = ("the config (there are no deltas) failed" if self._n == 0
                else "the baseline, with none of the deltas applied, failed")
        cite = self._cite(0)
        if cite:
            text = f"Observed: {what}{cite}"
            if self._n and self._all in self._evidence:
                text += f"; current failed{self._cite(self._all)}"
            text += "."
        else:  # not reached by the search (a not-config verdict needs a failing baseline); kept honest anyway
            text = f"Inferred, not observed: {what} (no failing trial of it is recorded)."
        return Verdict("not-config", (), 1.0, (),
                       text + " So the deltas are not the cause: look outside the config "
                              "(clients, proxies, network, hardware, data).")

    def _final(self, reason: str, confident: bool = True) -> Verdict:
        post = self._belief()
        # a verdict stands on both premises: with the baseline never resolved (its restart failed,
        # say), "current fails" alone names whichever delta the prior favours
        premised = self._n == 0 or self._evidence.get(0) is not None
        if post.z > 0 and reason != "contradiction" and confident and premised:
            p_top, top, conf = self._assess(post)
            if conf >= self.confidence:
                return self._verdict(post, top, conf)
        why = {
            "budget": f"The restart budget ({self.max_trials}) ran out",
            "infrastructure": "A trial stayed unresolved when retried (infrastructure trouble, which is no evidence, or a perf comparison still undecided after several starts)",
            "exhausted": "No further trial would be informative",
            "baseline-other": "The baseline failed differently from the symptom (it is not the symptom, so it says "
            "nothing about the deltas; the configuration without them cannot be tested against it)",
            "other": "Configurations the search needed failed differently from the symptom, and which delta needs "
            "a partner could not be told",
            "contradiction": "The observations fit none of the modelled hypotheses (e.g. three deltas that fail "
            "only together, or a fault that comes and goes between restarts)",
        }[reason]
        lead, conf, sus = "", 0.0, ()
        if not premised:
            lead = ("; the baseline (no deltas) never gave an answer, so no delta is blamed and the config is "
                    "not cleared")
        elif post.z > 0:
            p_top, top, conf = self._assess(post)
            sus = self._suspects(post)
            if top.kind == NONE:
                lead = f"; most likely the deltas are not the cause ({conf:.0%})"
            elif sus:
                lead = "; suspects: " + ", ".join(f"{u} {p:.0%}" for u, p in sus[:6])
        return Verdict("inconclusive", (), conf, sus, f"{why} before reaching {self.confidence:.0%} confidence{lead}.")

    def _hypothesis(self, kind: int, terms: list[int], p: float) -> Hypothesis:
        if kind == NONE:
            return Hypothesis("not-config", (), p)
        if not terms:
            return Hypothesis("no-fault", (), p)
        tt = tuple(self._names(t) for t in terms)
        return Hypothesis("interaction" if any(len(t) > 1 for t in tt) else "culprit", tt, p)

    def _verdict(self, post: Belief, cls: tuple, conf: float) -> Verdict:
        if cls.kind == NONE:
            failed = [self._units_label(m) + self._cite(m) for m, ev in sorted(self._evidence.items())
                      if ev.failed and m != self._all][:4]
            seen = f"Observed: {'; '.join(failed)} failed" if failed else "Inferred, not observed: configs fail"
            if self._all in self._evidence and self._evidence[self._all].failed:
                seen += f"; current failed{self._cite(self._all)}"
            return Verdict("not-config", (), conf, self._suspects(post),
                           f"{seen}. Configs fail with and without the deltas ({conf:.0%} posterior): they are not "
                           "the cause.")
        t = post.term(cls)
        terms = self._terms + ([t] if t else [])
        if not terms:
            ev = self._evidence.get(self._all)
            seen = (f"Observed: current passed{self._cite(self._all)}" if ev is not None and ev.passes
                    else "Inferred, not observed: the current config would pass")
            return Verdict("not-reproduced", (), conf, (), f"{seen}. The failure stopped reproducing.")
        h = self._hypothesis(cls.kind, terms, conf)
        culprits: list[str] = []
        for tt in h.terms:
            culprits.extend(u for u in tt if u not in culprits)
        return Verdict(h.kind, tuple(culprits), conf, self._suspects(post), self._explain(post, terms), h.terms)

    def _explain(self, post: Belief, terms: list[int]) -> str:
        facts: list[str] = []
        inferred: list[str] = []
        allv = 0
        for t in terms:
            allv |= t
        for t in terms:
            names = self._names(t)
            solo = self._up(t)  # alone, with the partners it needs to start (search/dependency.py)
            alone = self._status(solo, post) == "fail"
            if len(names) == 1:
                x = names[0]
                if alone and solo != t:
                    facts.append(f"{x} alone (with {', '.join(self._names(solo & ~t))}, which it needs) "
                                 f"failed{self._cite(solo)}")
                elif alone:
                    facts.append(f"{x} alone failed{self._cite(t)}")
                else:
                    seen, sentence = self._necessity(t, 0)
                    (facts if seen else inferred).append(sentence)
                    inferred.append(f"{x} breaks the stack on its own, not only together with another delta "
                                    f"({x} was not tested alone; interactions are rare a priori)")
            else:
                # "X and Y fail only together" is observed only when each member alone passed and
                # the members together failed (alone, or added to what passed); else each missing
                # piece is said to be inferred.
                details = []
                # a weak pass (fewer runs than would settle it on their own) is still what was seen:
                # said with its run count; the verdict's confidence weighs it
                solo = [u for u in bits(t) if self._status(1 << u, post) in ("pass", "weak")]
                untested = [u for u in bits(t) if u not in solo]
                if solo:
                    details.append(", ".join(
                        f"{self._units[u]} alone passed"
                        + (f" {self._evidence[1 << u].passes} probe runs" if self._status(1 << u, post) == "weak" else "")
                        + self._cite(1 << u) for u in solo))
                together = alone
                if alone:
                    details.append(f"{' + '.join(names)} alone failed{self._cite(t)}")
                else:
                    if solo and untested:
                        seen, sentence = self._necessity(1 << untested[0], 1 << solo[0])
                        (details if seen else inferred).append(sentence)
                        together = seen
                    inferred.append(f"no third delta is needed ({' + '.join(names)} was not tested alone)")
                for u in untested:
                    inferred.append(f"{self._units[u]} alone passes ({self._units[u]} was not tested alone)")
                claim = f"{' and '.join(names)} fail only together"
                if together and not untested:
                    facts.append(claim + f" ({'; '.join(details)})")
                else:
                    facts.extend(details)
                    inferred.append(claim)
        fix = self._down(self._all & ~allv)
        label = ", ".join(self._names(self._all & ~fix))
        if self._status(fix, post) == "pass":
            facts.append(f"current without {label} passed{self._cite(fix)}")
        else:
            inferred.append(f"no other delta breaks the stack too (current without {label} was not tested; "
                            "several independent culprits are rare a priori)")
        premises = []
        if self._all in self._evidence:
            premises.append(f"current failed{self._cite(self._all)}")
        if 0 in self._evidence and self._n:
            premises.append(f"the baseline passed{self._cite(0)}")
        text = "Observed: " + "; ".join(premises + facts) + "." if premises + facts else ""
        if inferred:
            text += (" " if text else "") + "Inferred, not observed: " + "; ".join(inferred) + "."
        qb = post.q_belief()
        mean_q = sum(q * p for q, p in zip(post.qs, qb))
        if mean_q > 0.15:
            text += (f" Estimated from the probe runs: the fault is intermittent, a bad config passes about "
                     f"{mean_q:.0%} of them.")
        return text

    def _cite(self, mask: int) -> str:
        """' (trial 4)' / ' (trials 4, 7)': the trials of exactly this config that showed what the
        sentence says (its failures when it failed, else its passes)."""
        ev = self._evidence.get(mask)
        if ev is None:
            return ""
        ts = ev.failed_trials if ev.failed else ev.passed_trials
        if not ts:
            return ""
        return f" (trial{'s' if len(ts) > 1 else ''} {', '.join(map(str, ts))})"

    def _cite_pair(self, passed: int, failed: int) -> str:
        a, b = self._evidence.get(passed), self._evidence.get(failed)
        if a is None or b is None or not a.passed_trials or not b.failed_trials:
            return ""
        return f" (without it passed in trial {a.passed_trials[-1]}, with it failed in trial {b.failed_trials[0]})"

    def _units_label(self, mask: int) -> str:
        if mask == 0:
            return "the baseline"
        names = self._names(mask)
        return "+".join(names) if len(names) <= 3 else f"{len(names)} of the deltas"

    def _necessity(self, t: int, with_: int) -> tuple[bool, str]:
        """(observed?, sentence): the observed pair 'C passed, C + t failed' (C containing ``with_``),
        or -- when no such pair was run -- the inference from the bisection as a whole."""
        (u,) = list(bits(t))
        best = None
        for mask, ev in self._evidence.items():
            if ev.failed or (mask >> u) & 1 or (mask & with_) != with_:
                continue
            other = self._evidence.get(mask | t)
            if other is not None and other.failed and (best is None or mask.bit_count() > best.bit_count()):
                best = mask
        x = self._units[u]
        if best is None:
            return False, (f"{x} is needed for the failure (from the bisection's passes and failures as a whole; "
                           "no config was run both with and without it alone)")
        k = (best & ~with_).bit_count()
        cite = self._cite_pair(best, best | t)
        if with_:
            w = ", ".join(self._names(with_))
            return True, (f"adding {x} to {w}" + (f" and {k} other delta{'s' if k != 1 else ''}" if k else "")
                          + f" made it fail{cite}")
        if k == 0:
            return True, f"{x} alone failed{self._cite(t)}"
        return True, f"adding {x} to {k} other delta{'s' if k != 1 else ''} that passed made it fail{cite}"

