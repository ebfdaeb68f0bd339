"""Verdicts and their explanations: every sentence observed (with its trial) or marked inferred.

Each function reads a frozen `Judge` (the search's evidence, see judge.py) and the posterior; none
changes anything."""
from __future__ import annotations

from envbisect.outcome import VerdictKind
from envbisect.search.belief import NONE, Belief, HypClass, bits
from envbisect.search.judge import Judge
from envbisect.search.types import Hypothesis, Verdict


def marginals(j: Judge, post: Belief) -> list[tuple[str, float]]:
    conf = j.accepted_conf()
    marg = {u: p * conf for u, p in post.marginals().items()}
    for t, c in zip(j.terms, j.term_conf):
        for u in bits(t):
            marg[u] = c
    items = sorted(marg.items(), key=lambda t: (-t[1], t[0]))
    return [(j.units[u], p) for u, p in items]

def suspects(j: Judge, post: Belief) -> tuple[tuple[str, float], ...]:
    return tuple((u, round(p, 4)) for u, p in marginals(j, post) if p >= 1e-3)[:20]

def not_reproduced(j: Judge) -> Verdict:
    ev = j.configs[j.all]
    trials = ", ".join(str(t) for t in ev.trials)
    if ev.failed:  # it failed as it was running, and passed after a full co-restart
        return Verdict(
            VerdictKind.NOT_REPRODUCED, (), 1.0, (),
            f"Observed: the running stack failed (trial {ev.trials[0]}), but after a full ordered co-restart "
            f"the same config passed {ev.restarted_passes} probe runs (trial {ev.trials[-1]}): the files are "
            "not the cause; the running state was (a service restarted alone, or a stale process).",
        )
    conf = 1.0 - j.belief().p_bad(j.all)
    return Verdict(
        VerdictKind.NOT_REPRODUCED,
        (),
        conf,
        (),
        f"Observed: the current config passed all {ev.passes} probe runs (trial {trials}): the failure did "
        "not reproduce, so nothing was bisected (check the probe, or run again while the fault shows).",
    )

def not_config(j: Judge) -> Verdict:
    what = ("the config (there are no deltas) failed" if j.n == 0
            else "the baseline, with none of the deltas applied, failed")
    seen_in = cite(j, 0)
    if seen_in:
        text = f"Observed: {what}{seen_in}"
        if j.n and j.all in j.configs:
            text += f"; current failed{cite(j, j.all)}"
        text += "."
    else:  # not reached by the search (a not-config verdict needs a failing baseline); kept honest anyway
        text = f"Inferred, not observed: {what} (no failing trial of it is recorded)."
    return Verdict(VerdictKind.NOT_CONFIG, (), 1.0, (),
                   text + " So the deltas are not the cause: look outside the config "
                          "(clients, proxies, network, hardware, data).")

def final(j: Judge, reason: str, confident: bool = True, ran: str = "") -> Verdict:
    """`ran`: what of the premises was run and stayed unresolved, said instead of "never gave an
    answer" when the baseline was run."""
    post = j.belief()
    # a verdict stands on both premises: with the baseline never resolved (its restart failed,
    # say), "current fails" alone names whichever delta the prior favours
    premised = j.n == 0 or j.configs.get(0) is not None
    if post.z > 0 and reason != "contradiction" and confident and premised:
        p_top, top, conf = j.assess(post)
        if conf >= j.rules.confidence:
            return verdict(j, post, top, conf)
    why = {
        "budget": f"The restart budget ({j.rules.max_trials}) ran out",
        "infrastructure": "A trial stayed unresolved when retried (infrastructure trouble, which is no evidence, "
        "or a perf comparison still undecided after several starts)",
        "exhausted": "No further trial would be informative",
        "baseline-other": "The baseline failed differently from the symptom (it is not the symptom, so it says "
        "nothing about the deltas; the configuration without them cannot be tested against it)",
        "other": "Configurations the search needed failed differently from the symptom, and which delta needs "
        "a partner could not be told",
        "repeated": "The same trial was asked again after it failed differently from the symptom, which "
        "no answer to it can change (nothing new to learn)",
        "contradiction": "The observations fit none of the modelled hypotheses (e.g. three deltas that fail "
        "only together, or a fault that comes and goes between restarts)",
    }[reason]
    lead, conf, sus = "", 0.0, ()
    if not premised:
        lead = (f"; {ran or 'the baseline (no deltas) never gave an answer'}, so no delta is blamed and the "
                "config is not cleared")
    elif post.z > 0:
        p_top, top, conf = j.assess(post)
        sus = suspects(j, post)
        if top.kind == NONE:
            lead = f"; most likely the deltas are not the cause ({conf:.0%})"
        elif sus:
            lead = "; suspects: " + ", ".join(f"{u} {p:.0%}" for u, p in sus[:6])
    return Verdict(VerdictKind.INCONCLUSIVE, (), conf, sus,
                   f"{why} before reaching {j.rules.confidence:.0%} confidence{lead}.")

def hypothesis(j: Judge, kind: int, terms: list[int], p: float) -> Hypothesis:
    if kind == NONE:
        return Hypothesis(VerdictKind.NOT_CONFIG, (), p)
    if not terms:
        return Hypothesis("no-fault", (), p)
    tt = tuple(j.names(t) for t in terms)
    return Hypothesis(VerdictKind.INTERACTION if any(len(t) > 1 for t in tt) else VerdictKind.CULPRIT, tt, p)

def verdict(j: Judge, post: Belief, cls: HypClass, conf: float) -> Verdict:
    if cls.kind == NONE:
        failed = [units_label(j, m) + cite(j, m) for m, ev in sorted(j.configs.items())
                  if ev.failed and m != j.all][:4]
        seen = f"Observed: {'; '.join(failed)} failed" if failed else "Inferred, not observed: configs fail"
        if j.all in j.configs and j.configs[j.all].failed:
            seen += f"; current failed{cite(j, j.all)}"
        return Verdict(VerdictKind.NOT_CONFIG, (), conf, suspects(j, post),
                       f"{seen}. Configs fail with and without the deltas ({conf:.0%} posterior): they are not "
                       "the cause.")
    t = post.term(cls)
    terms = list(j.terms) + ([t] if t else [])
    if not terms:
        ev = j.configs.get(j.all)
        seen = (f"Observed: current passed{cite(j, j.all)}" if ev is not None and ev.passes
                else "Inferred, not observed: the current config would pass")
        return Verdict(VerdictKind.NOT_REPRODUCED, (), conf, (), f"{seen}. The failure stopped reproducing.")
    h = hypothesis(j, cls.kind, terms, conf)
    culprits: list[str] = []
    for tt in h.terms:
        culprits.extend(u for u in tt if u not in culprits)
    return Verdict(h.kind, tuple(culprits), conf, suspects(j, post), explain(j, post, terms), h.terms)

def explain(j: Judge, post: Belief, terms: list[int]) -> str:
    facts: list[str] = []
    inferred: list[str] = []
    allv = 0
    for t in terms:
        allv |= t
    for t in terms:
        names = j.names(t)
        solo = j.up(t)  # alone, with the partners it needs to start (search/dependency.py)
        alone = j.status(solo, post) == "fail"
        if len(names) == 1:
            x = names[0]
            if alone and solo != t:
                facts.append(f"{x} with only {', '.join(j.names(solo & ~t))} beside it failed{cite(j, solo)}")
            elif alone:
                facts.append(f"{x} alone failed{cite(j, t)}")
            else:
                seen, sentence = necessity(j, t, 0)
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
            solo = [u for u in bits(t) if j.status(1 << u, post) in ("pass", "weak")]
            untested = [u for u in bits(t) if u not in solo]
            if solo:
                details.append(", ".join(
                    f"{j.units[u]} alone passed"
                    + (f" {j.configs[1 << u].passes} probe runs" if j.status(1 << u, post) == "weak" else "")
                    + cite(j, 1 << u) for u in solo))
            together = alone
            if alone:
                details.append(f"{' + '.join(names)} alone failed{cite(j, t)}")
            else:
                if solo and untested:
                    seen, sentence = necessity(j, 1 << untested[0], 1 << solo[0])
                    (details if seen else inferred).append(sentence)
                    together = seen
                inferred.append(f"no third delta is needed ({' + '.join(names)} was not tested alone)")
            for u in untested:
                inferred.append(f"{j.units[u]} alone passes ({j.units[u]} was not tested alone)")
            claim = f"{' and '.join(names)} fail only together"
            if together and not untested:
                facts.append(claim + f" ({'; '.join(details)})")
            else:
                facts.extend(details)
                inferred.append(claim)
    fix = j.down(j.all & ~allv)
    label = ", ".join(j.names(j.all & ~fix))
    if j.status(fix, post) == "pass":
        facts.append(f"current without {label} passed{cite(j, fix)}")
    elif j.another_fault(fix):
        facts.append(f"current without {label} failed another way (trial {j.other[fix][0]}): a fault of its own")
    else:
        inferred.append(f"no other delta breaks the stack too (current without {label} was not tested; "
                        "several independent culprits are rare a priori)")
    premises = []
    if j.all in j.configs:
        premises.append(f"current failed{cite(j, j.all)}")
    if 0 in j.configs and j.n:
        premises.append(f"the baseline passed{cite(j, 0)}")
    text = "Observed: " + "; ".join(premises + facts) + "." if premises + facts else ""
    if inferred:
        text += (" " if text else "") + "Inferred, not observed: " + "; ".join(inferred) + "."
    qb = post.q_belief()
    mean_q = sum(q * p for q, p in zip(post.qs, qb))
    if mean_q > 0.15:
        text += (f" Estimated from the probe runs: the fault is intermittent, a bad config passes about "
                 f"{mean_q:.0%} of them.")
    return text

def cite(j: Judge, mask: int) -> str:
    """' (trial 4)' / ' (trials 4, 7)': the trials of exactly this config that showed what the
    sentence says (its failures when it failed, else its passes)."""
    ev = j.configs.get(mask)
    if ev is None:
        return ""
    ts = ev.failed_trials if ev.failed else ev.passed_trials
    if not ts:
        return ""
    return f" (trial{'s' if len(ts) > 1 else ''} {', '.join(map(str, ts))})"

def cite_pair(j: Judge, passed: int, failed: int) -> str:
    a, b = j.configs.get(passed), j.configs.get(failed)
    if a is None or b is None or not a.passed_trials or not b.failed_trials:
        return ""
    return f" (without it passed in trial {a.passed_trials[-1]}, with it failed in trial {b.failed_trials[0]})"

def units_label(j: Judge, mask: int) -> str:
    if mask == 0:
        return "the baseline"
    names = j.names(mask)
    return "+".join(names) if len(names) <= 3 else f"{len(names)} of the deltas"

def necessity(j: Judge, t: int, with_: int) -> tuple[bool, str]:
    """(observed?, sentence): the observed pair 'C passed, C + t failed' (C containing ``with_``),
    or -- when no such pair was run -- the inference from the bisection as a whole."""
    (u,) = list(bits(t))
    best = None
    for mask, ev in j.configs.items():
        if ev.failed or (mask >> u) & 1 or (mask & with_) != with_:
            continue
        other = j.configs.get(mask | t)
        if other is not None and other.failed and (best is None or mask.bit_count() > best.bit_count()):
            best = mask
    x = j.units[u]
    if best is None:
        return False, (f"{x} is needed for the failure (from the bisection's passes and failures as a whole; "
                       "no config was run both with and without it alone)")
    k = (best & ~with_).bit_count()
    pair = cite_pair(j, best, best | t)
    if with_:
        w = ", ".join(j.names(with_))
        return True, (f"adding {x} to {w}" + (f" and {k} other delta{'s' if k != 1 else ''}" if k else "")
                      + f" made it fail{pair}")
    if k == 0:
        return True, f"{x} alone failed{cite(j, t)}"
    return True, f"adding {x} to {k} other delta{'s' if k != 1 else ''} that passed made it fail{pair}"

