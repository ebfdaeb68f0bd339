"""What a bisection plans and judges, without touching a host: the deltas chosen and the units
they are tested as, an auto-linked unit's members tested apart and what those trials show, whether
probing the running stack is a fair observation of the current configuration, a trial as the
search sees it, and what a --guard's two measurements say. runs/bisect.py, runs/fleet.py and
runs/replay.py run trials; this module decides what those trials mean.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from envbisect.errors import UsageError
from envbisect.inputs.playbook import Probe
from envbisect.outcome import Leave, Outcome, VerdictKind
from envbisect.search import Observation, Policy, TrialKind, TrialRequest, Verdict, restart_bound
from envbisect.search import parse_policy as search_policy
from envbisect.state.deltas import Delta, Diff, linked_units, same_change
from envbisect.trials.runner import Trial
from envbisect.trials.symptom import of_trial


@dataclass(frozen=True)
class BisectOptions:
    """The question a bisection asks, as the CLI or a resumed run's record gives it."""

    probe: str | None = None
    only: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    link: tuple[str, ...] = ()
    confidence: float = 0.95
    max_trials: int | None = None
    leave: Leave = Leave.ORIGINAL  # ORIGINAL | FIXED (parse_leave)
    auto_link: bool = True  # same key, same change in several services -> one unit
    policy: Policy = Policy.CONFIRM  # parse_policy; a text given by a record or a caller becomes its member
    guard: str | None = None  # a perf probe: is reverting the culprits safe for speed? (guard_verdict)
    split_merges: bool = False  # a guilty HEAD move: a merge on its line is its second-parent commits, then itself

    def __post_init__(self) -> None:
        if not isinstance(self.leave, Leave) and self.leave in LEAVE_CHOICES:  # the text a record or caller gives
            object.__setattr__(self, "leave", Leave(self.leave))
        if not isinstance(self.policy, Policy) and self.policy in POLICY_CHOICES:
            object.__setattr__(self, "policy", Policy(self.policy))


LEAVE_CHOICES = (Leave.ORIGINAL.value, Leave.FIXED.value)
POLICY_CHOICES = tuple(p.value for p in Policy)


def parse_leave(text: str) -> Leave:
    """--leave: original | fixed (the one check: bisect and watch both ask it)."""
    if text not in LEAVE_CHOICES:
        raise UsageError(f"Invalid value for --leave: {text!r} (one of {', '.join(LEAVE_CHOICES)})")
    return Leave(text)


def parse_policy(text: str) -> Policy:
    """--policy for bisect, watch and a resumed run's record: search.parse_policy's answer, its
    refusal as one line (a UsageError)."""
    try:
        return search_policy(text)
    except ValueError as e:
        raise UsageError(f"Invalid value for --policy: {e}") from None


def select_deltas(diff: Diff, only: Sequence[str], exclude: Sequence[str]) -> list[Delta]:
    ids = {d.id for d in diff.deltas}
    for ref in [*only, *exclude]:
        if ref not in ids:
            raise UsageError(f"no delta {ref!r} (see `envbisect diff`; ids look like decode:SGLANG_X)")
    chosen = [d for d in diff.deltas if (not only or d.id in only) and d.id not in exclude]
    return chosen


def make_units(deltas: Sequence[Delta], link: Iterable[str],
               auto_link: bool) -> tuple[dict[str, tuple[str, ...]], list[str]]:
    """Bisection units. Same variable, same new value in several services: prefill and decode must
    usually agree, so testing one side without the other would test a mismatch nobody deployed
    ("the same change": deltas.same_change, by what bash makes of the value)."""
    keys = set(link)
    notes = []
    if auto_link:
        by_key: dict[tuple[str | None, str, str | None], set[str]] = {}
        for d in deltas:
            if d.kind in ("env", "flag"):  # a start line's flag: its file is its side
                by_key.setdefault(same_change(d), set()).add(d.service or d.path)
        for (key, _c, _n), services in by_key.items():
            if key and len(services) > 1 and key not in keys:
                keys.add(key)
                notes.append(f"{key} changed the same way in {', '.join(sorted(services))}: tested as one linked unit")
        renamed = _renamed_knobs(deltas, keys)
        notes += [n for n, _s in renamed.values()]
        units = linked_units(deltas, link_keys=keys)
        notes += _with_upgrade(units, {k: s for k, (_n, s) in renamed.items()})
        return units, notes
    return linked_units(deltas, link_keys=keys), notes


def _with_upgrade(units: dict[str, tuple[str, ...]], renamed: Mapping[str, str]) -> list[str]:
    """A renamed knob that stayed a change in a service whose engine was upgraded (and is switched back
    by a delta, ``SERVICE:pkg:sglang``) is tested with the upgrade: the baseline's release may not read
    the new spelling, so the old release with the new spelling is a configuration nobody ran."""
    notes = []
    for knob, service in renamed.items():
        upgrade = f"{service}:pkg:sglang"
        home = next((u for u, ids in units.items() if upgrade in ids), None)
        uid = f"linked:{knob}"
        if home is None or uid not in units or home == uid:
            continue
        units[home] = units[home] + units.pop(uid)
        notes.append(f"{service}: {knob} renamed across the upgrade: tested with {upgrade}")
    return notes


def _renamed_knobs(deltas: Sequence[Delta], keys: set[str]) -> dict[str, tuple[str, str]]:
    """A knob whose one spelling was removed and another added in the same place, and which stayed
    deltas (state/rename_proof.py: not provably the same): one setting, so one unit; apart, a trial
    would run with both spellings or neither, which nobody deployed. Adds the knob to `keys`; returns
    knob -> (the note, its service)."""
    place = lambda d: (d.host, d.service, d.path, d.knob)  # noqa: E731
    removed = {place(d): d for d in deltas if d.kind == "env" and d.flag is None and d.knob and d.change == "removed"}
    out = {}
    for d in deltas:
        r = removed.get(place(d)) if d.kind == "env" and d.flag is None and d.change == "added" else None
        if r is not None and d.knob and r.key != d.key and d.knob not in keys:
            keys.add(d.knob)
            out[d.knob] = (f"{d.service or d.host}: {r.key} → {d.key}, one knob ({d.knob}): tested as one linked unit",
                           d.service or d.host)
    return out


@dataclass(frozen=True)
class ApartTest:
    """An auto-linked unit found guilty, to be tested member by member (each with the rest of its term).
    With more than two members, a member alone says nothing of a pair among them, so each member is
    also left out of the whole link once (`keys` "without:M"): the sides needed together are those
    whose absence makes it pass."""
    unit: str
    members: tuple[str, ...]
    rest: tuple[str, ...]

    @property
    def member_units(self) -> dict[str, tuple[str, ...]]:
        return {f"member:{m}": (m,) for m in self.members}

    @property
    def keys(self) -> tuple[str, ...]:
        """The trials to run: each member alone, then (more than two members) the link without each."""
        return self.members + (tuple(WITHOUT + m for m in self.members) if len(self.members) > 2 else ())

    def config(self, key: str) -> list[str]:
        kept = [m for m in self.members if m != key[len(WITHOUT):]] if key.startswith(WITHOUT) else [key]
        return sorted(self.rest) + [f"member:{m}" for m in kept]

    def purpose(self, key: str) -> str:
        if key.startswith(WITHOUT):
            return f"refine linked {self.unit}: does it still break without {key[len(WITHOUT):]}?"
        return f"refine linked {self.unit}: does {key} break it without the other side?"


WITHOUT = "without:"


def linked_to_refine(verdict: Verdict, units: Mapping[str, tuple[str, ...]],
                     declared: Iterable[str]) -> list[ApartTest]:
    """The auto-linked units of a culprit/interaction verdict (never a group the user declared)."""
    if verdict.kind not in (VerdictKind.CULPRIT, VerdictKind.INTERACTION):
        return []
    out = []
    for term in verdict.terms:
        for u in term:
            members = units.get(u, ())
            if len(members) >= 2 and u.startswith("linked:") and u[len("linked:"):] not in set(declared):
                out.append(ApartTest(u, tuple(members), tuple(v for v in term if v != u)))
    return out


def judge_apart(test: ApartTest, tested: "Sequence[tuple[str, Trial]] | None", refined: dict[str, tuple[str, ...]],
                apart: list[str], notes: list[str]) -> None:
    """Keep the smallest set the observations support. One member fails and another passes: only
    the failing ones are guilty. Every member fails alone (a value both sides must agree on) or none
    does (they are needed together): the group. ``tested`` None: a member's trial was unresolved.
    More than two members: a narrower set is kept only when the link without it was seen to pass and
    the set itself (alone, or as the link without the others) was seen to fail."""
    u, members = test.unit, test.members
    if not tested:
        notes.append(f"{u}: its members could not be tested apart (infrastructure); reported whole")
        return
    alone = [(m, t) for m, t in tested if not m.startswith(WITHOUT)]
    left_out = {m[len(WITHOUT):]: t for m, t in tested if m.startswith(WITHOUT)}
    # a member that fails another way than the symptom (Trial.symptom "other", runs/symptom.py) is
    # no evidence that it carries the symptom: it is not blamed on that failure
    failing = [m for m, t in alone if t.outcome.failed and t.symptom != "other"]
    other = [m for m, t in alone if t.outcome.failed and t.symptom == "other"]

    def said(m: str) -> str:
        return "failed" if m in failing else "failed another way" if m in other else "passed"

    how = "; ".join(f"{m} {said(m)} in trial {t.n}" for m, t in alone)
    sentences = [f"{m} {said(m)} without the other side (trial {t.n})" for m, t in alone]
    sentences += [f"{u} without {m} {'failed' if t.outcome.failed else 'passed'} (trial {t.n})"
                  for m, t in left_out.items()]
    apart.append(f"{u} is {' + '.join(members)}: " + ", ".join(sentences))
    if other and not failing:
        notes.append(f"{u} was auto-linked for the search; tested apart: {how}; a member failing another way than "
                     "the symptom is no evidence about it: reported as the group")
        return
    if failing and other:  # one side shows the symptom, the rest fail another way without it: none
        # can go alone (reverting the failing side would leave the others failing their own way)
        notes.append(f"{u} was auto-linked for the search; tested apart: {how}; each side breaks it alone (a value "
                     f"that must match across services: {', '.join(other)} fails another way without the rest): "
                     "reported as the group")
        return
    blamed = _blamed_members(members, failing, alone, left_out)
    if blamed is not None and len(blamed) < len(members):
        refined[u] = blamed
        notes.append(f"{u} was auto-linked for the search; tested apart: {how}; only {', '.join(blamed)} "
                     f"{'is' if len(blamed) == 1 else 'are'} to blame")
    elif blamed is None:
        notes.append(f"{u} was auto-linked for the search; tested apart: {how}; which of its {len(members)} sides "
                     "are needed is not decided by what was observed: reported as the group")
    else:
        why = ("each side breaks it alone (a value that must match across services)" if failing
               else "no side breaks it alone: they are needed together")
        notes.append(f"{u} was auto-linked for the search; tested apart: {how}; {why}: reported as the group")


def _blamed_members(members: Sequence[str], failing: Sequence[str], alone: Sequence[tuple[str, Trial]],
                    left_out: Mapping[str, Trial]) -> tuple[str, ...] | None:
    """The members to blame, as observed; the whole link when every side fails alone or all are
    needed; None when the observations do not decide (then the link is reported whole, with a note)."""
    if len(members) <= 2:  # the trials alone are the link without the other side: they decide
        return tuple(failing) if failing else tuple(members)
    if failing and len(failing) == len(members):
        return tuple(members)
    passed_alone = {m for m, t in alone if not t.outcome.failed}
    if failing:  # only these break it: the link without them must have been seen to pass
        rest = [m for m in members if m not in failing]
        seen_pass = ((len(failing) == 1 and _passed(left_out.get(failing[0])))
                     or (len(rest) == 1 and rest[0] in passed_alone))
        return tuple(failing) if seen_pass else None
    needed = [m for m in members if _passed(left_out.get(m))]
    if len(needed) == len(members):
        return tuple(members)
    spare = [m for m in members if m not in needed]
    # the needed sides without the spare one must have been seen to fail: the link without it
    seen_fail = len(spare) == 1 and left_out[spare[0]].outcome.failed and left_out[spare[0]].symptom != "other"
    return tuple(needed) if needed and seen_fail else None


def _passed(trial: Trial | None) -> bool:
    return trial is not None and trial.outcome is Outcome.PASS


# A process's start time is read from /proc as boot time (whole seconds, rounded down) plus its
# start ticks, so it is never later than the real start: a file whose mtime is before it is older
# than the process. No margin is added; a clock stepped back since would only make this stricter
# for files written before the step.
START_MARGIN_S = 0.0


def git_culprit(verdict: Verdict, units: Mapping[str, tuple[str, ...]], refined: Mapping[str, tuple[str, ...]],
                deltas: Sequence[Delta]) -> Delta | None:
    """The git delta a culprit verdict names alone, if it does."""
    if verdict.kind != VerdictKind.CULPRIT or len(verdict.culprits) != 1:
        return None
    ids = refined.get(verdict.culprits[0], units.get(verdict.culprits[0], ()))
    found = [d for d in deltas if d.id in ids]
    if len(found) != 1 or len(ids) != 1 or found[0].kind != "git":
        return None
    return found[0]


def running_stack_unverified(diff: Diff | None, playbook, deltas: Sequence[Delta]) -> str | None:  # noqa: ANN001
    """Why probing the running stack would not be a fair observation of the current configuration
    (None: it would be). Fair only when every service's process runs what its files say now:
    its environment equals what bash makes of its env file (evaluated on the host: no drift) or,
    where the environment cannot be read (sglang-router rewrites its process title over it), the
    process started after its env file was last written; every watched file that changed is
    older than the processes on its host; and no git HEAD moved (the code on disk is not provably
    the code that runs: Python imports lazily)."""
    if diff is None:
        return "a resumed run (the processes were not seen by this run's diff)"
    if diff.drift:
        d = diff.drift[0]
        return f"{d.service} runs with {d.key} different from its env file (drift)"
    hosts = diff.current.hosts
    started: dict[str, list[float]] = {}
    for name, svc in playbook.services.items():
        host = hosts.get(svc.host)
        proc = host.processes.get(name) if host else None
        if proc is None or proc.started_at is None or proc.status not in ("ok", "unknown"):
            return f"{name}: its process was not seen running"
        f = host.files.get(svc.env_file)
        if f is None or not f.exists:
            return f"{name}: its env file {svc.env_file} was not read"
        if proc.status == "ok" and proc.evaluated(f.sha256) is None:
            return f"{name}: what bash makes of {svc.env_file} was not evaluated on the host"
        if proc.status != "ok" and (f.mtime is None or f.mtime > proc.started_at - START_MARGIN_S):
            return (f"{name}: its start environment cannot be read and {svc.env_file} is not provably older "
                    "than the process")
        started.setdefault(svc.host, []).append(proc.started_at)
    for d in deltas:
        if d.kind == "git":
            return f"{d.id}: a git HEAD moved (the running code may predate it)"
        if d.kind in ("file", "key", "flag"):
            f = hosts[d.host].files.get(d.path) if d.host in hosts else None
            first = min(started.get(d.host, [0.0]))
            if f is None or f.mtime is None or f.mtime > first - START_MARGIN_S:
                return f"{d.path} on {d.host} may have changed after a process there started"
    return None


def check_original_is_current(original, current, deltas: Sequence[Delta]) -> None:  # noqa: ANN001
    """The hosts, as the run's editor read them (``original``), must still be in the state the diff
    saw (``current``: its snapshot); otherwise the deltas are stale."""
    for d in deltas:
        if d.kind == "git":
            r = original.repos.get((d.host, d.path))
            if r and r.head != d.new:
                raise UsageError(f"{d.id}: HEAD is now {r.head[:10]}, the diff saw {str(d.new)[:10]}; re-run")
            continue
        f = original.files.get((d.host, d.path))
        cur = current.hosts[d.host].files.get(d.path)
        if f is None or cur is None:
            continue
        now_sha = hashlib.sha256(f.content).hexdigest() if f.exists and f.content is not None else None
        if now_sha != (cur.sha256 if cur.exists else None):
            raise UsageError(f"{d.host}:{d.path} changed since the diff was taken; run the bisection again")


def observation(t: Trial) -> Observation:
    """A trial as the search sees it, with the fingerprint of its failure (search/incident.py
    judges it against each problem's symptom)."""
    sign = of_trial(t) if t.outcome.failed else None
    if t.symptom == "other":  # failed differently from the symptom: no evidence about it (runs/symptom.py)
        return Observation(frozenset(t.units), other=True, free=t.free, trial=t.n, sign=sign)
    if t.symptom == "background":  # failed only as the baseline does, past the symptom's round: free of it
        return Observation(frozenset(t.units), passes=len(t.probe_runs), failed=False, free=t.free, trial=t.n)
    if t.outcome is Outcome.UNRESOLVED:
        return Observation(frozenset(t.units), passes=0, failed=False, unresolved=True, free=t.free, trial=t.n)
    failed = t.outcome.failed
    return Observation(frozenset(t.units), passes=t.passes, failed=failed, failures=max(t.failures, int(failed)),
                       free=t.free, trial=t.n, sign=sign)


def culprit_deltas(verdict: Verdict, units: Mapping[str, tuple[str, ...]],
                   refined: Mapping[str, tuple[str, ...]]) -> set[str]:
    """The deltas a verdict blames: its culprit units' members, as narrowed by testing them apart."""
    return {d for u in verdict.culprits for d in refined.get(u, units[u])}


def guard_configs(guard: Probe, units: Mapping[str, tuple[str, ...]],
                  culprits: set[str]) -> list[tuple[list[str], str]]:
    """A --guard's two trials, (units applied, purpose): the current configuration (the reference a
    revert is judged against), then current minus the culprits."""
    everything = sorted(units)
    keep = [u for u in everything if not set(units[u]) & culprits]
    return [(everything, f"guard {guard.name}: the current configuration's {guard.metric} "
                         "(the reference a revert is judged against)"),
            (keep, f"guard {guard.name}: current minus the culprits ({', '.join(sorted(culprits))})")]


def guard_verdict(guard: Probe, culprits: Iterable[str], numbers: Sequence[int],
                  last: Trial) -> tuple[bool | None, str]:
    """What a --guard's trials say: (safe to revert: None when it could not be told, the sentence).
    ``numbers``: the guard's trial numbers (one when the current configuration could not be
    measured); ``last``: the last of those trials."""
    who = ", ".join(sorted(culprits))
    if len(numbers) < 2:
        return None, (f"could not measure {guard.metric} of the current configuration (trial {numbers[0]}: "
                      f"{last.reason}): whether reverting {who} costs speed is not known")
    if last.outcome is Outcome.PASS:
        return True, (f"reverting {who} costs no more than the {guard.regression:.0%} allowed "
                      f"(trials {numbers[0]} and {numbers[1]}): {last.reason}")
    if last.outcome is Outcome.FAIL:
        return False, (f"reverting {who} costs {guard.metric} by more than the {guard.regression:.0%} allowed "
                       f"(trials {numbers[0]} and {numbers[1]}): {last.reason}; not safe to revert "
                       "without weighing that")
    return None, (f"what reverting {who} costs could not be decided (trials {numbers[0]} and "
                  f"{numbers[1]}): {last.reason}")


def dry_run_plan(diff: Diff, playbook, opts: BisectOptions, deltas: Sequence[Delta],  # noqa: ANN001
                 units: Mapping[str, tuple[str, ...]], notes: Sequence[str], probe: Probe) -> dict[str, Any]:
    """`bisect --dry-run`: what the run would test, and the restarts it is expected to cost."""
    n = len(units)
    why_not = running_stack_unverified(diff, playbook, deltas)
    extra = 0 if why_not is None else 1
    return {"deltas": [d.id for d in deltas], "units": {u: list(v) for u, v in units.items()}, "notes": list(notes),
            "probe": probe.name,
            "premise_checks": ["current configuration (all deltas) must fail",
                               "baseline configuration (no deltas) must pass"],
            "first_premise": ("probe the running stack (no restart)" if why_not is None
                              else f"co-restart first: {why_not}"),
            "expected_restarts": {"single culprit": restart_bound(max(n, 1)) + extra,
                                  "interacting pair": restart_bound(max(n, 2), VerdictKind.INTERACTION) + extra,
                                  "two independent culprits": restart_bound(max(n, 2), "several") + extra},
            "policy": opts.policy,
            "guard": (f"{opts.guard}: 2 more restarts once there is a culprit (current, and current "
                      "minus the culprits, sampled)") if opts.guard else None,
            "restart_order": list(playbook.restart.order),
            "start_groups": [list(g) for g in playbook.restart.start_groups],
            "not_applicable": [d.id for d in deltas if not d.applicable]}


def remaining_restarts(req: TrialRequest, policy: Policy, n_units: int) -> int:
    """Restarts still expected, this one included: an estimate for the ETA, nothing decides on it.
    A bisection over the units the search still suspects, plus the confirmations the policy asks
    for, plus the premise checks not yet done."""
    confirm = 0 if policy == Policy.FAST else 2
    if req.kind is TrialKind.BISECT and req.suspects_left:
        return max(1, math.ceil(math.log2(max(1, req.suspects_left)))) + confirm
    if req.kind in (TrialKind.PREMISE_CURRENT, TrialKind.PREMISE_BASELINE):
        premises = 1 if req.kind is TrialKind.PREMISE_BASELINE else (1 if req.free else 2)
        return premises + (math.ceil(math.log2(n_units)) if n_units > 1 else 0) + confirm
    return 1


def seen_ids(diff: Diff | None, diff_doc: Mapping[str, Any] | None) -> list[str]:
    """Every delta the diff saw (the run's and those it left out); a resumed run reads its record."""
    if diff is not None:
        return [d.id for d in diff.deltas]
    return [d["id"] for d in (diff_doc or {}).get("deltas", [])]


__all__ = ["ApartTest", "BisectOptions", "LEAVE_CHOICES", "START_MARGIN_S", "check_original_is_current",
           "culprit_deltas", "dry_run_plan", "git_culprit", "guard_configs", "guard_verdict", "judge_apart",
           "linked_to_refine", "make_units", "observation", "parse_leave", "parse_policy", "remaining_restarts",
           "running_stack_unverified", "seen_ids", "select_deltas"]
