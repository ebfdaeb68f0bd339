"""The symptom of a bisection run: its fingerprint, each failing trial judged against it, and the
dependencies the search found, as sentences in delta ids.

The fingerprint is taken from the premise (the current configuration, every delta applied, must
fail): how *that* fails is the symptom. From then on each failing trial is judged (trials/symptom.py):
the same failure, or another one (`Trial.symptom`), and another failure reaches the search as
`Observation(other=True)`: no evidence about the symptom. A perf probe has no symptom to compare
(its failure is "slower"), and a run whose premise did not fail has none either: then nothing is
judged and every failure counts, as before.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

from envbisect.outcome import Outcome
from envbisect.search import Incident, Search, TrialKind, Verdict
from envbisect.trials.probe_request import ProbeRun
from envbisect.trials.runner import Trial
from envbisect.trials.symptom import Fingerprint, as_background, beyond, of_run, of_trial, shows


class SymptomWatch:
    """Learns the symptom from the first failing trial of the current configuration (the premise)
    and marks every later failing trial "same" or "other".

    A baseline that fails only further along a multi-round probe than the symptom ever does (the
    seed's proxy hangs the 4th request of a reused connection; the current state hangs at the
    first) does not fail "too": the symptom's rounds passed. Its failure is kept as the stack's
    second problem, not in the configuration (`background`), and a trial that fails only that way
    is marked "background": the symptom is absent from it, which the search takes as a pass."""

    def __init__(self, units: Sequence[str], enabled: bool = True):
        self.units = frozenset(units)
        self.enabled = enabled
        self.fingerprint: Fingerprint | None = None
        self.learnt_from: int | None = None
        self.background: Fingerprint | None = None  # how the baseline fails on its own
        self.background_from: int | None = None

    def see(self, trial: Trial) -> Trial:
        """The trial, marked against the symptom (learning it first when this is the premise)."""
        if not self.enabled or not trial.outcome.failed or trial.kind is TrialKind.GUARD:
            return trial
        if self.fingerprint is None:
            if frozenset(trial.units) == self.units and trial.kind in (TrialKind.PREMISE_CURRENT, TrialKind.CONFIRM):
                self.fingerprint = self._learn(trial)
                self.learnt_from = trial.n if self.fingerprint is not None else None
                return dataclasses.replace(trial, symptom="same") if self.fingerprint is not None else trial
            return trial
        if self.background is None and not trial.units and trial.outcome is Outcome.FAIL:
            self.background = beyond(self.fingerprint, trial.probe_runs)
            self.background_from = trial.n if self.background is not None else None
        if self.background is not None and trial.outcome is Outcome.FAIL:
            own = [r for r in trial.probe_runs if r.outcome == Outcome.FAIL and not as_background(self.background, r)]
            if not own:
                return dataclasses.replace(trial, symptom="background")
            trial_own = dataclasses.replace(trial, probe_runs=tuple(own))
            return dataclasses.replace(trial, symptom="same" if shows(self.fingerprint, trial_own) else "other")
        same = shows(self.fingerprint, trial)
        if same is None:
            return trial
        return dataclasses.replace(trial, symptom="same" if same else "other")

    @staticmethod
    def _learn(trial: Trial) -> Fingerprint | None:
        """The premise's fingerprint; along a multi-round probe, at the earliest round any of its
        failed runs failed."""
        fp = of_trial(trial)
        rounds = [f.at for f in (of_run(r) for r in trial.probe_runs) if f is not None and f.at is not None]
        return dataclasses.replace(fp, at=min(rounds)) if fp is not None and rounds else fp

    def tolerates(self, run: ProbeRun) -> bool:
        """A probe run that failed only as the baseline does on its own (the runner probes on)."""
        return self.background is not None and run.outcome == Outcome.FAIL and as_background(self.background, run)

    def second_problem(self, trials: Sequence[Trial]) -> str | None:
        """The sentence a verdict carries about the baseline's own failure, if it showed one."""
        if self.background is None:
            return None
        like = [str(t.n) for t in trials if t.symptom == "background"]
        return (f"Beside it, a second problem, not in the configuration: the baseline fails too, further along "
                f"the probe ({self.background.describe()}, trial {self.background_from}), where the symptom "
                f"fails at the {self.fingerprint.layer if self.fingerprint else 'an earlier round'}; "
                f"trial{'s' if len(like) > 1 else ''} {', '.join(like)} failed only that way, past the symptom's "
                "round, and count above as passing (free of the symptom).")

    def to_json(self) -> dict | None:
        if self.fingerprint is None:
            return None
        out = {**self.fingerprint.to_json(), "trial": self.learnt_from}
        if self.background is not None:
            out["baseline_failure"] = {**self.background.to_json(), "trial": self.background_from}
        return out


def dependency_records(verdict: Verdict, units: Mapping[str, Sequence[str]],
                       trials: Sequence[Trial]) -> list[dict]:
    """The verdict's dependencies in delta ids, each with its sentence: "`decode:SGLANG_ENABLE_X`
    needs `decode:SGLANG_X_PATH` (fails to start without it: decode died while starting, trial 5;
    ...)"."""
    by_n = {t.n: t for t in trials}
    out = []
    for d in verdict.dependencies:
        needy = [x for x in units.get(d.needy, (d.needy,))]
        partners = [x for p in d.partners for x in units.get(p, (p,))]
        how = "fails differently from the symptom without it"
        t = by_n.get(d.trials[0]) if d.trials else None
        fp = of_trial(t) if t is not None else None
        if fp is not None and fp.kind == "start-failure":
            how = f"fails to start without it: {t.reason}"
        elif fp is not None:
            how = f"fails differently without it: {fp.describe()}"
        n = " + ".join(f"`{x}`" for x in needy)
        p = " + ".join(f"`{x}`" for x in partners)
        if d.observed and len(d.trials) == 3:
            a, b, c = d.trials
            seen = (f"trial {a}; without {n.replace('`', '')} it did not ({f'trial {b}' if b else 'the baseline'}), "
                    f"with {p.replace('`', '')} it did not (trial {c})")
        else:
            seen = "inferred: not every side of it was run"
        out.append({"needy": needy, "partners": partners, "observed": d.observed, "trials": list(d.trials),
                    "text": f"{n} needs {p} ({how}; {seen}). Neither is a culprit of the symptom unless the "
                            "verdict names it."})
    return out


def leave_pairs_whole(keep: Sequence[str], dropped: set[str], dependencies: Sequence[dict],
                      units: Mapping[str, Sequence[str]]) -> tuple[list[str], list[str]]:
    """Units to keep for `--leave fixed` without leaving a delta without the partner it needs:
    a kept unit whose partner is dropped is dropped too, with the sentence that says why."""
    keep = list(keep)
    notes = []
    changed = True
    while changed:
        changed = False
        for d in dependencies:
            gone = [p for p in d["partners"] if p in dropped]
            if not gone:
                continue
            for u in list(keep):
                if set(units[u]) & set(d["needy"]):
                    keep.remove(u)
                    dropped.update(units[u])
                    notes.append(f"also left out {', '.join(units[u])}: it needs {', '.join(gone)} "
                                 "(it fails to start without it), which the verdict takes out")
                    changed = True
    return keep, notes


def same_failure(a: object, b: object) -> bool:
    """Two fingerprints are the same failure (None: nothing describes it, taken at its word)."""
    if a is None or b is None:
        return True
    return a.same(b) if isinstance(a, Fingerprint) and isinstance(b, Fingerprint) else a == b


def incident_for(units: Sequence[str], make_search: Callable[..., Search], budget: int | None, *,
                 judged: bool = True, options: Mapping[str, object] | None = None) -> Incident:
    """The run's search: one problem per fingerprint (search/incident.py). ``make_search(units,
    max_trials=, **options)`` builds one problem's search, the twins and suspicion of ``options``
    narrowed to its units; ``judged``: the probe has a symptom to compare (a perf probe's failure
    is "slower", one kind)."""
    options = dict(options or {})
    narrowed = ("twins", "suspicion")  # unit -> ...: only the problem's own units

    def problem(us: list[str], max_trials: int | None) -> Search:
        kw = {k: ({u: w for u, w in v.items() if u in us} if k in narrowed else v) for k, v in options.items()}
        return make_search(us, max_trials=max_trials, **kw)

    twins: Mapping[str, Sequence[str]] = options.get("twins") or {}  # type: ignore[assignment]
    return Incident(list(units), problem, max_trials=budget, same=same_failure if judged else (lambda a, b: True),
                    owners=twins, describe=lambda fp: fp.describe() if isinstance(fp, Fingerprint) else "a failure")


def fault_records(verdict: Verdict, units: Mapping[str, Sequence[str]],
                  refined: Mapping[str, Sequence[str]]) -> list[dict]:
    """Each fault of the incident in delta ids with its fingerprint, as the CLI and the report say it:
    "`prefill:X` hangs requests; `decode:Y` returns HTTP 500 once the first is fixed"."""
    out = []
    for i, f in enumerate(verdict.faults):
        if not f.culprits:
            continue
        ids = [d for u in f.culprits for d in refined.get(u, units.get(u, (u,)))]
        fp = f.sign if isinstance(f.sign, Fingerprint) else None
        what = fp.describe() if fp is not None else "the symptom"
        when = "" if i == 0 else " once the faults before it are reverted"
        out.append({"culprits": ids, "fingerprint": fp.to_json() if fp is not None else None,
                    "text": f"{' + '.join(f'`{d}`' for d in ids)}: {what}{when}"})
    return out


def stack_state_text(verdict: Verdict) -> str | None:
    """A fingerprint only the running stack showed, said as the stack's state."""
    fp = verdict.stack_state
    if not isinstance(fp, Fingerprint):
        return None
    return (f"the running stack answered {fp.describe()} (trial 1): the stack's state, not the configuration's "
            "symptom; no fresh start of any configuration failed that way")


__all__ = ["SymptomWatch", "dependency_records", "leave_pairs_whole", "same_failure", "incident_for",
           "fault_records", "stack_state_text"]
