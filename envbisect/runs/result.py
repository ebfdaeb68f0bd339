"""What a bisection ends with: the verdict and every trial behind it, the state it left the hosts
in, and the refinements after the search (members tested apart, a guilty HEAD move searched commit
by commit, a --guard's cost of the revert). `to_json` is the run's verdict.json.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from envbisect.errors import ExitStatus
from envbisect.outcome import Leave, VerdictKind
from envbisect.runs.baseline_proof import BaselineProof
from envbisect.search import Verdict
from envbisect.state.commitline import LineCommit
from envbisect.state.corrections import Corrections
from envbisect.trials.diagnose import PathReport
from envbisect.trials.runner import Trial

VERDICT_EXIT = {VerdictKind.CULPRIT: ExitStatus.OK, VerdictKind.INTERACTION: ExitStatus.OK,
                VerdictKind.NOT_CONFIG: ExitStatus.NOT_CONFIG, VerdictKind.NOT_REPRODUCED: ExitStatus.NOT_REPRODUCED,
                VerdictKind.INCONCLUSIVE: ExitStatus.INCONCLUSIVE}



@dataclass(frozen=True)
class BisectResult:
    run_id: str
    verdict: Verdict
    trials: tuple[Trial, ...]
    state_left: Leave
    units: Mapping[str, tuple[str, ...]]
    path_report: PathReport | None = None
    drift_hint: tuple[str, ...] = ()
    final_probe: Trial | None = None
    notes: tuple[str, ...] = ()
    refined: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # auto-linked unit -> guilty members
    guard: "GuardResult | None" = None  # --guard: what reverting the culprits costs in speed
    corrections: Corrections = Corrections()  # the operator's (state/corrections.py): retracted trials stay listed
    symptom: Mapping[str, Any] | None = None  # how the current configuration fails (runs/symptom.py)
    dependencies: tuple[Mapping[str, Any], ...] = ()  # deltas that fail differently without a partner
    baseline_proof: BaselineProof | None = None  # not-config (or inconclusive for want of it): runs/baseline_proof.py
    commit: "CommitVerdict | None" = None  # a guilty HEAD move searched commit by commit (_refine_commits)
    faults: tuple[Mapping[str, Any], ...] = ()  # several faults: each one's culprits and fingerprint
    stack_state: str | None = None  # a fingerprint only the running stack showed (runs/symptom.py)

    @property
    def culprit_deltas(self) -> tuple[str, ...]:
        return tuple(d for u in self.verdict.culprits for d in self.refined.get(u, self.units.get(u, (u,))))

    @property
    def restarts(self) -> int:
        """Co-restarts the trials cost (a probe of the running stack costs none)."""
        return sum(1 for t in self.trials if not t.free)

    @property
    def exit_status(self) -> ExitStatus:
        return VERDICT_EXIT.get(self.verdict.kind, ExitStatus.INCONCLUSIVE)

    def to_json(self) -> dict[str, Any]:
        v = self.verdict
        return {
            "run": self.run_id, "verdict": v.kind, "culprits": list(self.culprit_deltas),
            "culprit_units": list(v.culprits), "confidence": round(v.confidence, 4),
            "suspects": [{"unit": u, "p": round(p, 4)} for u, p in v.suspects], "explanation": v.explanation,
            "units": {u: list(ds) for u, ds in self.units.items()},
            "trials": [self._trial_json(t) for t in self.trials],
            "restarts": self.restarts,
            "path": self.path_report.to_json() if self.path_report else None,
            "drift_hint": list(self.drift_hint),
            "final_probe": self.final_probe.to_json() if self.final_probe else None,
            "state_left": self.state_left, "notes": list(self.notes),
            "guard": self.guard.to_json() if self.guard else None,
            "corrections": [c.to_json() for c in self.corrections.entries],
            "symptom": dict(self.symptom) if self.symptom else None,
            "dependencies": [dict(d) for d in self.dependencies],
            "baseline_proof": self.baseline_proof.to_json() if self.baseline_proof else None,
            "commit": self.commit.to_json() if self.commit else None,
            "faults": [dict(f) for f in self.faults], "stack_state": self.stack_state,
        }

    def _trial_json(self, t: Trial) -> dict[str, Any]:
        doc = t.to_json()
        standing = self.corrections.state(t.n)
        if standing == "retracted":
            doc["retracted"] = True
        elif standing is not None:
            doc["corrected_outcome"] = standing
        return doc


@dataclass(frozen=True)
class CommitVerdict:
    """A guilty HEAD move searched along its first-parent line (search/commits.py). `commit` is the
    first commit observed failing whose parent on the line was observed passing; None when a trial
    was unresolved (then `passed`..`failed` is as far as the line was narrowed)."""

    delta: str  # the git delta's id
    line: tuple[LineCommit, ...]  # oldest first
    commit: LineCommit | None
    passed: str  # the last commit seen passing (the baseline commit at first)
    failed: str  # the first commit seen failing
    trials: tuple[int, ...]
    # where `revert --verdict` takes the repo: the named commit's first parent, or for a commit of a
    # merged branch the merge's first parent (no first-parent commit dropped); "" = `passed`
    revert_to: str = ""
    confirmed_by: int | None = None  # the trial of the deployed HEAD without the named commit, which passed
    why: str = ""  # why no commit is named although the line was narrowed to one (its confirmation)
    # the commit first seen failing with the symptom whose confirmation refused it ("" when none was):
    # then `passed`..`failed` runs from the last commit seen passing to the deployed HEAD
    unconfirmed: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"delta": self.delta, "commit": self.commit.to_json() if self.commit else None,
                "last_passing": self.passed, "first_failing": self.failed, "trials": list(self.trials),
                "revert_to": self.revert_to or self.passed, "line": [c.to_json() for c in self.line],
                "confirmed_by": self.confirmed_by, "why": self.why, "unconfirmed": self.unconfirmed or None}

    @property
    def text(self) -> str:
        if self.commit is None:
            why = self.why or ("a trial was unresolved, or a commit between failed differently from the symptom")
            if self.unconfirmed:
                why = (f"{self.unconfirmed[:12]} is the first commit seen failing with the symptom, unconfirmed: "
                       + why.removeprefix(f"{self.unconfirmed[:12]} is not named: "))
            return (f"{self.delta}: the line of {len(self.line)} commits was narrowed to {self.passed[:12]}.."
                    f"{self.failed[:12]} ({why}); no single commit is named")
        confirmed = (f"; confirmed alone: the deployed HEAD without it passed (trial {self.confirmed_by})"
                     if self.confirmed_by is not None else "")
        return (f"{self.delta}: commit {self.commit.short} is the first of {len(self.line)} commits (first-parent) "
                f"that fails (trials {', '.join(map(str, self.trials)) or 'none needed'}){confirmed}")


@dataclass(frozen=True)
class GuardResult:
    """`bisect --guard PERF_PROBE`: the current configuration and current-minus-the-culprits,
    each started and sampled, compared as a revert would be. `safe` is True when reverting costs
    no more than the probe's `regression`, False when it measurably does, None when it could
    not be told (then nobody should call the revert free)."""

    probe: str
    metric: str
    safe: bool | None
    text: str
    trials: tuple[int, ...]  # the guard's trial numbers (current, then current minus the culprits)

    def to_json(self) -> dict[str, Any]:
        return {"probe": self.probe, "metric": self.metric, "safe_to_revert": self.safe, "text": self.text,
                "trials": list(self.trials)}



__all__ = ["BisectResult", "CommitVerdict", "GuardResult", "VERDICT_EXIT"]
