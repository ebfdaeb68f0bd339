"""Issue 21 part 1: the symptom's fingerprint and the judgement of each failing trial (pure), and
the search given trials that fail differently (an oracle with pairs that need each other)."""
from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from envbisect.outcome import Outcome
from envbisect.search import POLICIES, Observation, TrialKind, Verdict
from envbisect.runs.symptom import SymptomWatch, leave_pairs_whole
from envbisect.trials.probe import ProbeRun, RequestRecord
from envbisect.trials.runner import Trial
from envbisect.trials.symptom import Fingerprint, masked, of_trial, shows


def http_fail(status=None, error=None, excerpt="", kind="http", n=1, latency=0.1) -> ProbeRun:
    rec = RequestRecord(n, False, status, latency, error, excerpt)
    ok = tuple(RequestRecord(i, True, 200, 0.01) for i in range(1, n))
    return ProbeRun("e2e", kind, Outcome.FAIL, f"request: {error}", ok + (rec,), latency, "http://r/v1")


def trial(n, *runs, outcome=Outcome.FAIL, reason="", units=("a",), kind=TrialKind.BISECT) -> Trial:
    return Trial(n, "p", tuple(units), tuple(units), outcome, reason, tuple(runs), kind=kind)


HANG = "no answer within 1.5 s (hang)"


def test_the_same_hang_with_other_timings_and_rounds_is_the_symptom():
    sym = of_trial(trial(1, http_fail(error=HANG, kind="multi_round", n=3, latency=1.5)))
    assert sym == Fingerprint("hang", layer="round 3 on one reused connection", at=3)
    later = trial(2, http_fail(error="no answer within 1.5 s (hang)", kind="multi_round", n=5, latency=1.7))
    assert shows(sym, later) is True


def test_the_same_status_with_other_request_ids_and_numbers_is_the_symptom():
    a = of_trial(trial(1, http_fail(500, "HTTP 500, expected 200",
                                    '{"error": "KV transfer timed out after 30.2 s", "id": "req-9f3a2c1d7e"}')))
    b = trial(2, http_fail(500, "HTTP 500, expected 200",
                           '{"error": "KV transfer timed out after 31.9 s", "id": "req-0b1c2d3e4f"}'))
    assert a.kind == "status" and shows(a, b) is True
    assert masked("took 3.25 s, id 4f9a2b7c11") == masked("took 9.5 s, id 0a1b2c3d44")


def test_another_status_is_another_failure_another_error_line_behind_the_same_status_is_not():
    sym = of_trial(trial(1, http_fail(503, "HTTP 503, expected 200", '{"error": "no healthy worker"}')))
    assert shows(sym, trial(2, http_fail(500, "HTTP 500, expected 200", '{"error": "no healthy worker"}'))) is False
    # two independent culprits behind one status answer with different lines (which engine answers
    # first decides): the line is recorded, never judged on, or the second culprit would be exonerated
    other_line = trial(3, http_fail(503, "HTTP 503, expected 200", '{"error": "model not loaded"}'))
    assert shows(sym, other_line) is True and not sym.same_line(of_trial(other_line))


def test_a_start_failure_when_the_symptom_is_a_hang_is_another_failure_and_the_reverse():
    hang = of_trial(trial(1, http_fail(error=HANG)))
    dead = trial(2, outcome=Outcome.START_FAILURE, reason="decode died while starting")
    assert shows(hang, dead) is False
    start = of_trial(dead)
    assert start == Fingerprint("start-failure", service="decode", layer="start of decode")
    assert shows(start, trial(3, http_fail(error=HANG))) is False


def test_a_start_failure_of_the_same_service_is_the_symptom_as_before_another_service_is_not():
    start = of_trial(trial(1, outcome=Outcome.START_FAILURE, reason="decode not healthy after 30 s (HTTP 503 ...)"))
    assert shows(start, trial(2, outcome=Outcome.START_FAILURE, reason="decode died while starting")) is True
    assert shows(start, trial(3, outcome=Outcome.START_FAILURE, reason="prefill died while starting")) is False


def test_layers_reset_refused_and_hang_differ_and_a_command_compares_its_exit_status():
    hang = of_trial(trial(1, http_fail(error=HANG)))
    assert shows(hang, trial(2, http_fail(error="RemoteProtocolError: Server disconnected"))) is False
    assert of_trial(trial(3, http_fail(error="ConnectError: [Errno 111] refused"))).kind == "refused"
    cmd = lambda code: ProbeRun("c", "command", Outcome.FAIL, f"exit status {code}",  # noqa: E731
                                (RequestRecord(1, False, code, 0.1, f"exit status {code}", "x"),), 0.1)
    one = of_trial(trial(4, cmd(1)))
    assert shows(one, trial(5, cmd(1))) is True and shows(one, trial(6, cmd(3))) is False
    # a trial with the symptom in one of its runs shows it, whatever its first failed run was
    assert shows(hang, trial(7, http_fail(500, "HTTP 500, expected 200", "x"), http_fail(error=HANG))) is True


def test_the_watch_learns_the_symptom_from_the_premise_and_marks_later_trials():
    w = SymptomWatch(["a", "b"])
    first = w.see(trial(1, http_fail(error=HANG), units=("a", "b"), kind=TrialKind.PREMISE_CURRENT))
    assert first.symptom == "same" and w.to_json()["kind"] == "hang" and w.to_json()["trial"] == 1
    other = w.see(trial(2, outcome=Outcome.START_FAILURE, reason="decode died while starting", units=("a",)))
    assert other.symptom == "other"
    assert w.see(trial(3, http_fail(error=HANG), units=("b",))).symptom == "same"
    assert SymptomWatch(["a"], enabled=False).see(trial(1, http_fail(error=HANG))).symptom is None
    again = Trial.from_json(other.to_json())
    assert again.symptom == "other"


def test_leave_fixed_takes_a_needy_delta_out_with_the_partner_the_verdict_takes_out():
    units = {u: (u,) for u in ("a", "b", "c")}
    deps = [{"needy": ["a"], "partners": ["b"]}]
    keep, notes = leave_pairs_whole(["a", "c"], {"b"}, deps, units)
    assert keep == ["c"] and "a" in notes[0] and "needs b" in notes[0]


# --- the search, against an oracle with deltas that need a partner ------------------------------


def play(n, culprits, deps, policy="confirm", detection=1.0, seed=0):
    from tests.search_oracle import World, play_incident

    world = World(faults=tuple((set(t), "hang") for t in culprits), deps=tuple((e, p) for e, ps in deps for p in ps),
                  detection={u: detection for t in culprits for u in t})
    v, inc = play_incident(world, [f"u{i}" for i in range(n)], policy=policy, seed=seed)
    return v, inc.search


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_culprit_and_innocent_pair_position_names_only_the_culprit(policy):
    n = 6
    for c, e, p in itertools.permutations(range(n), 3):
        v, s = play(n, [{f"u{c}"}], [(f"u{e}", {f"u{p}"})], policy)
        assert v.kind == "culprit" and v.culprits == (f"u{c}",), (c, e, p, v)
        if s.evidence.other:  # it met the pair: it reports it, with the three trials that show it
            assert [(d.needy, d.partners) for d in v.dependencies] == [(f"u{e}", (f"u{p}",))], (c, e, p, v)
            assert v.dependencies[0].observed and len(v.dependencies[0].trials) == 3


@pytest.mark.parametrize("role", ["needy", "partner"])
def test_a_culprit_that_is_half_of_a_pair_is_named_alone(role):
    """The needy half: named alone, the pair reported. The partner half: the needy delta is never
    seen passing with it (the symptom masks), so no dependency is said; it fails to start without
    the culprit, and is named as a fault of its own with that fingerprint (issue 34: a dependency
    needs a pass)."""
    from tests.search_oracle import World, play_incident

    n = 6
    for e, p in itertools.permutations(range(n), 2):
        c = e if role == "needy" else p
        world = World(faults=(({f"u{c}"}, "hang"),), deps=((f"u{e}", f"u{p}"),))
        for policy in sorted(POLICIES):
            v, _inc = play_incident(world, [f"u{i}" for i in range(n)], policy=policy)
            assert v.kind == "culprit" and v.faults[0].culprits == (f"u{c}",), (policy, e, p, v)
            if role == "needy":
                assert v.culprits == (f"u{c}",), (policy, e, p, v)
            else:  # the fix, when observed, shows the start failure: its own fault
                assert [(f.culprits, f.sign) for f in v.faults[1:]] in ([], [((f"u{e}",), "start")]), (policy, v)


def test_a_baseline_that_fails_differently_is_inconclusive_never_not_config():
    s = POLICIES["confirm"].search(["a", "b"])
    s.observe(Observation(frozenset(["a", "b"]), failed=True, free=True))
    s.observe(Observation(frozenset(), other=True))
    v = s.next()
    assert isinstance(v, Verdict) and v.kind == "inconclusive" and "baseline failed differently" in v.explanation


def test_a_revert_keeps_pairs_whole():
    from envbisect.errors import UsageError
    from envbisect.runs.revert import RunDeltas, keep_pairs_whole

    src = RunDeltas("r1", (), {}, "e2e", ("b",), "culprit",
                    dependencies=({"needy": ["a"], "partners": ["b"], "text": "a needs b"},))
    ids, notes = keep_pairs_whole("revert", ["b"], src, from_verdict=True)
    assert ids == ["b", "a"] and notes[0].startswith("also reverted a: it needs b")
    with pytest.raises(UsageError, match="would leave a without the partner it needs"):
        keep_pairs_whole("revert", ["b"], src, from_verdict=False)
    assert keep_pairs_whole("revert", ["a"], src, from_verdict=False) == (["a"], [])  # the needy alone: fine
    assert keep_pairs_whole("revert", ["a", "b"], src, from_verdict=False) == (["a", "b"], [])


def test_a_failure_nothing_describes_is_taken_at_its_word():
    """A probe run that failed with no request saying how (a runner that only says "fail") cannot
    be told apart from the symptom: it is the symptom, as before, either way round."""
    bare = ProbeRun("e2e", "oracle", Outcome.FAIL, "oracle", (), 0.01)
    unknown = of_trial(trial(1, bare))
    assert unknown.kind == "unknown"
    assert shows(unknown, trial(2, http_fail(error=HANG))) is True
    assert shows(of_trial(trial(3, http_fail(error=HANG))), trial(4, bare)) is True


# --- issue 39 part 2: a baseline that fails further along a multi-round probe -----------------

def _multi(n: int) -> ProbeRun:
    return http_fail(error=HANG, kind="multi_round", n=n)


def test_a_baseline_that_fails_further_along_the_probe_is_a_second_problem_not_the_symptom():
    """The seed's proxy hangs round 4 of a reused connection; the guilty change hangs round 1. The
    baseline's round-4 hang is not "the baseline fails too": its rounds 1-3 passed."""
    w = SymptomWatch(["a", "b"])
    cur = w.see(trial(1, *(_multi(1) for _ in range(5)), units=("a", "b"), kind=TrialKind.PREMISE_CURRENT))
    assert cur.symptom == "same" and w.fingerprint is not None and w.fingerprint.at == 1
    base = w.see(trial(2, _multi(4), units=(), kind=TrialKind.PREMISE_BASELINE))
    assert base.symptom == "background" and w.background is not None and w.background.at == 4
    assert w.to_json()["baseline_failure"]["at"] == 4
    # later trials: round 4 only is the baseline's failure; round 1 is the symptom; round 2 is neither
    assert w.see(trial(3, _multi(4), _multi(4), units=("a",))).symptom == "background"
    assert w.see(trial(4, _multi(4), _multi(1), units=("b",))).symptom == "same"
    assert w.see(trial(5, _multi(2), units=("a",))).symptom == "same"  # the same kind, another round: judged
    assert w.tolerates(_multi(4)) and not w.tolerates(_multi(1))
    text = w.second_problem([base])
    assert text is not None and "a second problem, not in the configuration" in text and "round 4" in text


def test_a_baseline_that_fails_at_the_symptoms_round_or_earlier_fails_too():
    """Failing where the symptom does (or before it) is "the baseline fails too", as before: the seed's
    own case, where the current state also hangs only at round 4, stays not-config."""
    for base_round in (4, 2):
        w = SymptomWatch(["a"])
        w.see(trial(1, _multi(4), units=("a",), kind=TrialKind.PREMISE_CURRENT))
        base = w.see(trial(2, _multi(base_round), units=(), kind=TrialKind.PREMISE_BASELINE))
        assert base.symptom == "same" and w.background is None and w.second_problem([base]) is None


def test_a_background_trial_is_a_pass_to_the_search():
    from envbisect.runs.plan import observation

    t = trial(3, _multi(4), _multi(4), _multi(4), units=("a",))
    import dataclasses

    o = observation(dataclasses.replace(t, symptom="background"))
    assert not o.failed and o.passes == 3 and not o.other


def _dead(n, line, service="decode", reason=None, tail_before="fault decision: no rule matches\n") -> Trial:
    t = trial(n, outcome=Outcome.START_FAILURE, reason=reason or f"{service} died while starting")
    return replace(t, log_tail=f"{tail_before}{line}\n\n")


def test_two_start_failures_of_one_service_with_different_last_lines_are_different_faults():
    # red-team scen_c: a guilty crash and an innocent cross-service pair both kill decode at start
    aiter = of_trial(_dead(1, "[2026-12-08 00:29:53.555] FATAL: aiter kernels unavailable on this GPU "
                              "(crash fault, rule #2); exiting with status 1"))
    assert aiter.kind == "start-failure" and aiter.service == "decode" and "aiter" in aiter.first_line
    pair = _dead(3, "[2026-12-08 00:29:56.743] FATAL: prefill enables X; decode has no SGLANG_X_PATH "
                    "(crash fault, rule #3); exiting with status 1")
    assert shows(aiter, pair) is False
    assert "aiter" in aiter.describe()
    # the same fault again, other timestamps, pids, ports and tmp paths: the same fingerprint
    again = _dead(5, "[2026-12-08 00:31:02.001] FATAL: aiter kernels unavailable on this GPU "
                     "(crash fault, rule #2); exiting with status 1")
    assert shows(aiter, again) is True
    a = of_trial(_dead(6, "pid 4121 port 30001 lock /tmp/sgl-ab12/x.lock 0xdeadbeef: bind failed"))
    assert shows(a, _dead(7, "pid 977 port 30417 lock /tmp/sgl-zz9q/y.lock 0x1234abcd: bind failed")) is True
    # a fingerprint kept from a start without a log (or an older record) still compares by service
    bare = of_trial(trial(8, outcome=Outcome.START_FAILURE, reason="decode died while starting"))
    assert shows(bare, pair) is True and shows(aiter, trial(9, outcome=Outcome.START_FAILURE,
                                                                reason="decode died while starting")) is True
    assert Fingerprint.from_json(aiter.to_json()) == aiter


def test_a_start_command_exit_is_fingerprinted_by_its_stderr_line_without_a_log():
    r1 = ("decode: start command failed: engine pid 311 exited: no SGLANG_X_PATH (a start failure of this "
          "configuration: the same command started decode in trial 2 of this run, and trial 3 failed the same way)")
    r2 = ("decode: start command failed: engine pid 4477 exited: aiter kernels unavailable (a start failure "
          "of this configuration: the same command started decode in trial 2 of this run, and trial 5 failed "
          "the same way)")
    one = of_trial(trial(1, outcome=Outcome.START_FAILURE, reason=r1))
    assert one.service == "decode" and "SGLANG_X_PATH" in one.first_line and "trial 2" not in one.first_line
    assert shows(one, trial(2, outcome=Outcome.START_FAILURE, reason=r2)) is False
    assert shows(one, trial(3, outcome=Outcome.START_FAILURE, reason=r1.replace("311", "9"))) is True
