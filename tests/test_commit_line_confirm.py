"""The commit line's confirmation over a pure oracle (runs/commit_line.search_line with injected
trials): a commit the confirmation refuses is never the range's passing end."""
from __future__ import annotations

from envbisect.outcome import Outcome
from envbisect.runs.commit_line import Lines, search_line
from envbisect.search import TrialKind
from envbisect.state.commitline import LineCommit
from envbisect.state.delta import Delta, DeltaKind
from envbisect.trials.runner import Trial

SHAS = [f"{i:02d}" * 20 for i in range(7)]  # SHAS[0]: the baseline commit; 1..6 the pull
LINE = tuple(LineCommit(SHAS[i], f"pull commit {i}", "a", (f"f{i}.txt",)) for i in range(1, 7))
G = Delta(id="git:node1:/dep/src", kind=DeltaKind.GIT, host="node1", service=None, path="/dep/src", key=None,
          change="changed", old=SHAS[0], new=SHAS[6], baseline_source="git:" + SHAS[0])


def _trial(n: int, at: str, outcome: Outcome, symptom: str | None, reason: str) -> Trial:
    return Trial(n, f"at {at[:6]}", (G.id,), (f"{G.id}@{at[:12]}",), outcome, reason,
                 kind=TrialKind.REFINE, symptom=symptom)


def _world(index: int) -> tuple[Outcome, str | None, str]:
    """c2: HTTP 500 (the symptom) from c2 on; c3..c5 cannot start (c6 fixes it); c4 hangs (masked)."""
    if 3 <= index <= 5:
        return Outcome.START_FAILURE, "other", "decode did not start"
    if index >= 2:
        return Outcome.FAIL, "same", "request: HTTP 500, expected 200"
    return Outcome.PASS, None, "9/9 probe runs passed"


def test_a_refused_commit_leaves_the_range_from_the_last_commit_seen_passing():
    trials: list[Trial] = [Trial(5, "alone", (G.id,), (G.id,), Outcome.FAIL, "HTTP 500", symptom="same")]
    seen: dict[str, Outcome] = {}

    def trial_at(c: LineCommit, purpose: str, kind: TrialKind) -> Trial:
        outcome, symptom, reason = _world(SHAS.index(c.sha))
        seen[c.sha] = outcome
        t = _trial(len(trials) + 5, c.sha, outcome, symptom, reason)
        trials.append(t)
        return t

    def confirm(c: LineCommit) -> tuple[Trial | None, str]:
        # the deployed HEAD without c2 still has c4's hang (the 500 gone, the hang shows)
        assert c.sha == SHAS[2]
        t = _trial(99, c.sha, Outcome.FAIL, "other", "request: no answer within 1.5 s (hang)")
        return t, ""

    notes: list[str] = []
    v = search_line(G, Lines(LINE, LINE), trials[:1], trial_at, notes, confirm)
    assert v is not None and v.commit is None
    assert seen[SHAS[2]] is Outcome.FAIL and seen[SHAS[1]] is Outcome.PASS  # c2 failed, c1 passed
    assert v.passed == SHAS[1], "the range starts at the last commit observed passing, never at c2"
    assert seen[v.passed] is Outcome.PASS
    assert v.to_json()["revert_to"] == SHAS[1] and v.to_json()["last_passing"] == SHAS[1]
    assert v.failed == SHAS[6]  # to HEAD: the later commits hold a second problem
    assert v.unconfirmed == SHAS[2]
    assert v.to_json()["unconfirmed"] == SHAS[2]
    assert "hang" in v.why and "trial 99" in v.why and "another way" in v.why
    assert f"{SHAS[1][:12]}..{SHAS[6][:12]}" in v.text
    assert SHAS[2][:12] in v.text and "unconfirmed" in v.text
