"""The checks a confident posterior still has to pass before a verdict, and the fallback when the
structured steps are spent. Each reads a frozen `Judge` and the current `Belief`, and answers with
the trial to run (or None: nothing to check)."""
from __future__ import annotations

from envbisect.outcome import VerdictKind
from envbisect.search.belief import NONE, NOTHING, PAIR, SINGLE, Belief, HypClass, bits
from envbisect.search.judge import Judge
from envbisect.search.types import TrialKind, TrialRequest, restart_bound

CONTRADICTION = "contradiction"


def fluke_check(j: Judge, post: Belief, top: HypClass) -> TrialRequest | str | None:
    """Before concluding: if the leading hypothesis needs an observed pass to have
    been luck (a bad config passing every run), re-test that config first."""
    if top.kind == NOTHING and not j.terms:
        return None
    t = post.term(top)
    terms = list(j.terms) + ([t] if t else [])
    worst: tuple[int, int] | None = None
    for mask, ev in j.configs.items():
        if ev.failed or not (top.kind == NONE or any(tt & mask == tt for tt in terms)):
            continue
        if ev.passes >= j.rules.retest_cap:
            return CONTRADICTION  # it would need a bad config to pass this many runs
        if worst is None or ev.passes < worst[1]:
            worst = (mask, ev.passes)
    if worst is None:
        return None
    mask, passes = worst
    return j.request(
        mask, f"retest: {j.fmt(mask)} passed {passes} runs, but the leading hypothesis says it is bad", post,
        TrialKind.RETEST)


def _solo_runs(j: Judge, post: Belief) -> tuple[list[float], int]:
    qd = list(post.q_given_bad(j.all))
    if qd and qd[0] < 0.5 and post.qs[0] == 0.0:
        # Evidently intermittent. The estimate of q comes from few runs and leans low exactly
        # when bad configs passed by luck, so every rate on the grid keeps some weight here.
        qd = [max(p, 0.1) if q > 0 else p for q, p in zip(post.qs, qd)]
        total = sum(qd)
        qd = [p / total for p in qd]
    return qd, max(j.runs_for(0.5, qd, post.qs), j.rules.base_probes)


def solo_pass_check(j: Judge, post: Belief, top: HypClass) -> TrialRequest | None:
    """"They fail only together" rests on each member having passed without the other: in a
    config that held it but not the whole pair. Under the pair hypothesis those passes look
    certain, so the posterior never doubts them; with an intermittent fault a single culprit
    passes by luck, and the verdict would name an innocent partner. So, for each member, the
    passes of all such configs together must be believable at even odds (P(bad | passes) <= tau
    with a prior of 1/2, as if it were a culprit alone), else it is probed alone (again)."""
    if top.kind != PAIR:
        return None
    term = post.term(top)
    if j.terms:  # a later frame's pair: the intermittency learnt is the culprits' found before
        u = j.solo_doubt(term)
        if u is not None:
            return j.solo_request(u, term, post, f"{', '.join(j.names(j.accepted()))} broke the stack too")
    qd, runs = _solo_runs(j, post)
    for u in bits(term):
        name = j.units[u]
        passes = sum(ev.passes for m, ev in j.configs.items()
                     if (m >> u) & 1 and (m & term) != term and not ev.failed)
        solo = j.up(1 << u)
        if j.status(solo, post) == "other":
            continue  # it cannot run without its partner: nothing to learn alone
        if passes == 0:
            if not j.rules.require_fix:
                continue  # policy fast: inferred, and the explanation says so
            return TrialRequest(frozenset(j.names(solo)), runs, f"confirm: does {name} break the stack alone?",
                                kind=TrialKind.CONFIRM)
        if j.doubt_after(0.5, qd, post.qs, passes) > j.rules.tau:
            ev = j.configs.get(1 << u)
            if ev is not None and ev.passes >= j.rules.retest_cap:
                continue
            return TrialRequest(frozenset(j.names(solo)), runs,
                                f"retest: {name} passed {passes} runs without its partner, too few to rule out "
                                "that it breaks the stack alone, intermittently", kind=TrialKind.RETEST)
    return None


def fix_observed(j: Judge, post: Belief, top: HypClass) -> TrialRequest | None:
    """With ``require_fix``, "these are all the culprits" is observed, never inferred:
    current minus every culprit must have passed before the verdict is given."""
    if not j.rules.require_fix or top.kind not in (SINGLE, PAIR):
        return None
    term = post.term(top)
    vf = j.fix_mask(term)
    if j.status(vf, post) == "pass" or j.another_fault(vf):
        return None  # skipped: it failed another way, a fault of its own (search/incident.py)
    names = ", ".join(j.names(j.accepted() | term))
    return j.fix_request(vf, f"confirm: current without {names} (the fix) must pass", post)


def restart_proof(j: Judge, post: Belief, top: HypClass) -> TrialRequest | None:
    """A culprit is never blamed on the running stack's word alone: its state may hold more
    than its files (a service restarted alone).  Each blamed term must have failed in some
    config after a full co-restart; if only the free probe saw it, co-restart current."""
    if top.kind not in (SINGLE, PAIR):
        return None
    t = post.term(top)
    for term in list(j.terms) + ([t] if t else []):
        if not any(ev.restarted_fail and (m & term) == term for m, ev in j.configs.items()):
            return TrialRequest(frozenset(j.names(j.all)), j.rules.premise_probes,
                                "confirm after a co-restart: current failed as it was running",
                                kind=TrialKind.CONFIRM)
    return None


def spare_check(j: Judge, post: Belief, top: HypClass) -> TrialRequest | None:
    """Confident already; but if a claim rests on the prior and checking it stays
    within the restart bound promised for this kind of answer, check it."""
    if top.kind not in (SINGLE, PAIR):
        return None
    if j.terms:  # a further culprit: its own claims within the bound for several culprits
        if j.restarts + 1 > restart_bound(j.n, "several"):
            return None
    elif j.restarts + 1 > restart_bound(j.n, VerdictKind.CULPRIT if top.kind == SINGLE else VerdictKind.INTERACTION):
        return None
    return j.confirm(post, post.term(top))


def fallback(j: Judge, post: Belief) -> TrialRequest | None:
    """The structured steps are spent and the posterior is not confident: run the
    most informative check (a unit or pair alone, a fix check, or a re-test)."""
    cands: dict[int, str] = {}
    for _, cls in post.ranked()[:6]:
        t = j.up(post.term(cls))
        if t:
            cands.setdefault(t, f"check: does {' + '.join(j.names(t))} break the stack alone?")
    for mask, ev in j.configs.items():
        if not ev.failed:
            cands.setdefault(mask, f"retest: {j.fmt(mask)} passed {ev.passes} runs")
    best: tuple[float, int, str, int] | None = None
    for mask, purpose in cands.items():
        ev = j.configs.get(mask)
        if ev is not None and (ev.failed or ev.passes >= j.rules.retest_cap):
            continue
        if ev is None and mask in j.other:
            continue  # it fails differently: no evidence about the symptom to gain
        r = j.probes(mask, post)
        gain = post.eig(mask, r)
        if best is None or gain > best[0] + 1e-12:
            best = (gain, mask, purpose, r)
    top_term = post.term(post.ranked()[0][1])
    if top_term:
        vf = j.fix_mask(top_term)
        ev = j.configs.get(vf)
        if (ev is None and vf not in j.other) or (ev is not None and not ev.failed
                                                  and ev.passes < j.rules.retest_cap):
            nxt = j.belief(extra=top_term)
            r = j.probes(vf, nxt)
            gain = nxt.eig(vf, r)
            if best is None or gain > best[0] + 1e-12:
                best = (gain, vf, f"check: current without {', '.join(j.names(j.accepted() | top_term))}", r)
    if best is None or best[0] < 0.01:
        return None
    kind = TrialKind.RETEST if best[2].startswith("retest") else TrialKind.CHECK
    return TrialRequest(frozenset(j.names(best[1])), best[3], best[2], kind=kind)


__all__ = ["CONTRADICTION", "fluke_check", "solo_pass_check", "fix_observed", "restart_proof", "spare_check",
           "fallback"]
