"""Fast checks of issue 21's pure parts: the not-config proof (runs/baseline_proof.py), what a
not-reproduced verdict says about drift (runs/drift.py), and a command probe's exit statuses
(trials/probe.py, run for real on this machine)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from envbisect.inputs.playbook import load_playbook
from envbisect.outcome import Cause, Outcome
from envbisect.runs.baseline_proof import build_proof, not_reproduced, probe_reached
from envbisect.runs.drift import drift_hints, with_drift
from envbisect.search import TrialKind, Verdict
from envbisect.state.configuration import FileOriginal, OriginalState
from envbisect.state.deltas import Delta
from envbisect.trials.probe import ProbeRun, RequestRecord, run_probe
from envbisect.trials.runner import Trial, probe_repeatedly

PLAYBOOK = """
[deployment]
name = "t"
[hosts.node1]
ssh = "local"
[services.decode]
host = "node1"
env_file = "{root}/decode.serve-env"
start = "true"
stop = "true"
health = "http://127.0.0.1:30001/health"
[restart]
order = ["decode"]
[probes.e2e]
kind = "http"
url = "http://127.0.0.1:{port}/v1/chat/completions"
[probes.cmd]
kind = "command"
command = {command}
"""


def _playbook(tmp_path: Path, port: int = 30001, command: str = "true"):
    (tmp_path / "decode.serve-env").write_text("export X=1\n")
    p = tmp_path / "envbisect.toml"
    p.write_text(PLAYBOOK.format(root=tmp_path, port=port, command=json.dumps(command)))
    return load_playbook(p)


def _delta(path: str) -> Delta:
    return Delta("file:node1:" + path, "file", "node1", None, path, None, "changed", "a" * 64, "b" * 64,
                 "snapshot:x")


def _baseline_trial(outcome=Outcome.FAIL, runs=()) -> Trial:
    return Trial(2, "premise: baseline must pass", (), (), outcome, "x", tuple(runs), restart_s=3.0,
                 kind=TrialKind.PREMISE_BASELINE)


def _run(error: str | None, status: int | None = None) -> ProbeRun:
    return ProbeRun("e2e", "http", Outcome.FAIL, error or "", (RequestRecord(1, False, status, 0.1, error),), 0.1)


def _proof(tmp_path, *, seen, deltas, trials, port=30001, notes=(), conflicts=()):
    pb = _playbook(tmp_path, port)
    original = OriginalState({("node1", d.path): FileOriginal(True, b"new") for d in deltas}, {})
    contents = {"a" * 64: b"old"}
    return build_proof(seen=seen, deltas=deltas, original=original, contents=contents, trials=trials, playbook=pb,
                       probe=pb.probes["e2e"], diff_notes=notes, conflicts=conflicts)


def test_proof_holds_when_every_delta_seen_was_put_back(tmp_path):
    d = _delta("/srv/a.yaml")
    p = _proof(tmp_path, seen=[d.id], deltas=[d], trials=[_baseline_trial(runs=[_run(None, 200)])])
    assert p.reproduced, p.problems()
    assert p.files[0].baseline == __import__("hashlib").sha256(b"old").hexdigest()
    assert [s.service for s in p.services] == ["decode"] and p.services[0].restarted_in == 2
    assert any("baseline proof (trial 2)" in line for line in p.lines())


def test_an_excluded_delta_an_unreadable_file_or_a_conflict_is_named_and_makes_it_inconclusive(tmp_path):
    d, other = _delta("/srv/a.yaml"), _delta("/srv/hotfix.yaml")
    p = _proof(tmp_path, seen=[d.id, other.id], deltas=[d], trials=[_baseline_trial(runs=[_run(None, 200)])],
               notes=["node1:/srv/x.env: cannot read (Permission denied); its deltas are unknown"],
               conflicts=[{"host": "node1", "path": "/srv/b", "why": "changed by someone else"}])
    assert not p.reproduced
    assert any(other.id in s and "left out" in s for s in p.stayed)
    assert any("/srv/x.env" in s for s in p.stayed) and any("/srv/b" in s for s in p.stayed)
    v = not_reproduced(Verdict("not-config", (), 1.0, (), "Observed: ..."), p)
    assert v.kind == "inconclusive" and other.id in v.explanation and "could not be reproduced" in v.explanation


def test_a_free_probe_of_the_running_stack_is_no_baseline_trial(tmp_path):
    d = _delta("/srv/a.yaml")
    free = Trial(1, "premise", (), (), Outcome.FAIL, "x", (_run(None, 200),), free=True,
                 kind=TrialKind.PREMISE_CURRENT)
    p = _proof(tmp_path, seen=[d.id], deltas=[d], trials=[free])
    assert not p.reproduced and p.trial is None


def test_a_restart_that_kept_the_old_process_breaks_the_proof(tmp_path):
    """The hook the restart proof fills (hosts/restart.py): an old pid still alive is no new process."""
    d = _delta("/srv/a.yaml")
    pb = _playbook(tmp_path)
    original = OriginalState({("node1", d.path): FileOriginal(True, b"new")}, {})
    p = build_proof(seen=[d.id], deltas=[d], original=original, contents={"a" * 64: b"old"},
                    trials=[_baseline_trial(runs=[_run(None, 200)])], playbook=pb, probe=pb.probes["e2e"],
                    diff_notes=(), conflicts=(), restart_facts={"decode": {"old_pid": 10, "new_pid": 10,
                                                                           "old_pid_gone": False}})
    assert not p.reproduced and any("decode" in x for x in p.problems())


def test_probe_reached_the_stack(tmp_path):
    pb = _playbook(tmp_path, port=30001)
    probe = pb.probes["e2e"]
    assert probe_reached(probe, _baseline_trial(runs=[_run("HTTP 500, expected 200", 500)]), pb)
    assert probe_reached(probe, _baseline_trial(runs=[_run("no answer within 1.5 s (hang)")]), pb)
    # refused by a port a service listens on: the stack answered (it is down)
    assert probe_reached(probe, _baseline_trial(runs=[_run("ConnectError: [Errno 111] refused")]), pb)
    pb2 = _playbook(tmp_path, port=39999)  # no service listens there: never reached the stack
    assert not probe_reached(pb2.probes["e2e"], _baseline_trial(runs=[_run("ConnectError: refused")]), pb2)


def test_drift_of_a_value_no_file_sets_is_named_in_the_verdict():
    doc = {"drift": [{"service": "decode", "key": "SGLANG_SM120_MMA_TARGET_CTAS", "file": "128", "process": "1024",
                      "pid": 4242}],
           "deltas": [{"kind": "env", "service": "prefill", "key": "NCCL_DEBUG", "old": "WARN", "new": "INFO"}]}
    hints = drift_hints(doc)
    assert "SGLANG_SM120_MMA_TARGET_CTAS=1024, which no file sets" in hints[0], hints
    v = with_drift(Verdict("not-reproduced", (), 0.99, (), "Observed: passed (check the probe, or run again while "
                                                          "the fault shows)."), doc, hints)
    assert "check the probe" not in v.explanation and "decode (pid 4242)" in v.explanation
    stale = {"drift": [{"service": "decode", "key": "K", "file": "2", "process": "1", "pid": 1}],
             "deltas": [{"kind": "env", "service": "decode", "key": "K", "old": "1", "new": "2"}]}
    assert "the baseline's value" in drift_hints(stale)[0]
    assert with_drift(Verdict("not-reproduced", (), 1.0, (), "x"), {"drift": []}, []).explanation == "x"


@pytest.mark.parametrize("command,want", [
    ("exit 0", Outcome.PASS), ("exit 1", Outcome.FAIL), ("exit 124", Outcome.FAIL), ("exit 125", Outcome.CANNOT_TEST),
    ("exit 126", Outcome.BROKEN), ("curlx-no-such-command", Outcome.BROKEN), ("exit 137", Outcome.FAIL),
])
def test_command_probe_exit_statuses(tmp_path, command, want):
    pb = _playbook(tmp_path, command=command)
    assert run_probe(pb.probes["cmd"], {}).outcome is want
    outcome, _runs, reason = probe_repeatedly(pb.probes["cmd"], {}, 3)
    assert outcome is (want if want is not Outcome.PASS else Outcome.PASS)
    if want is Outcome.BROKEN:
        assert "127" in reason or "126" in reason


def test_a_broken_probe_trial_reads_back():
    t = Trial(3, "bisect", (), (), Outcome.UNRESOLVED, "exit status 127 (command not found)",
              cause=Cause.PROBE_BROKEN)
    assert Trial.from_json(t.to_json()).cause is Cause.PROBE_BROKEN


def test_an_http_probe_whose_host_name_is_unknown_is_broken(tmp_path):
    """A name that cannot resolve (.invalid never does) never reached the stack: broken, not a failure."""
    pb = _playbook(tmp_path)
    probe = pb.probes["e2e"].__class__(**{**pb.probes["e2e"].__dict__, "url": "http://no-such-host.invalid:8000/v1"})
    r = run_probe(probe, {})
    assert r.outcome is Outcome.BROKEN and "no-such-host.invalid" in r.reason, r.reason


def test_an_http_probe_refused_by_a_port_no_service_listens_on_never_reached_the_stack(tmp_path):
    import socket

    from envbisect.trials.probe_check import unreached

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    closed = s.getsockname()[1]
    s.close()  # nothing listens there now
    pb = _playbook(tmp_path, port=closed)
    r = run_probe(pb.probes["e2e"], {})
    assert r.outcome is Outcome.FAIL  # one run: a failure to the probe itself ...
    why = unreached(pb.probes["e2e"], (r,), pb)  # ... which the runner turns into a broken probe
    assert why and str(closed) in why, why
    served = _playbook(tmp_path / "svc", port=30001) if (tmp_path / "svc").mkdir() is None else None
    assert unreached(served.probes["e2e"], (_run("ConnectError: [Errno 111] Connection refused"),), served) is None


def test_a_moved_head_with_a_hotfix_in_the_same_repo_is_refused_before_anything_is_touched():
    """A checkout never runs over uncommitted changes: with both, the trials could not make the
    baseline (or the restore could leave HEAD moved), so the run is refused with the way out."""
    from envbisect.errors import UsageError
    from envbisect.state.configuration import check_applicable

    git_d = Delta("git:node1:/srv/src", "git", "node1", None, "/srv/src", None, "changed", "a" * 40, "b" * 40,
                  "snapshot:x")
    hotfix = Delta("file:node1:/srv/src/configs/f.yaml", "file", "node1", None, "/srv/src/configs/f.yaml", None,
                   "changed", "a" * 64, "b" * 64, "git:aaaa",
                   ("uncommitted change to configs/f.yaml in the deployed repo /srv/src (tracked, not committed)",))
    with pytest.raises(UsageError, match="--exclude git:node1:/srv/src"):
        check_applicable([git_d, hotfix])
    check_applicable([hotfix])  # HEAD did not move: fine
    check_applicable([git_d, _delta("/srv/other/a.yaml")])  # a watched file elsewhere: fine


# --- the restart's own proof, cited by the not-config proof ------------------------------------------

def _restarted_trial(fact) -> Trial:  # noqa: ANN001
    import dataclasses

    return dataclasses.replace(_baseline_trial(runs=[_run(None, 200)]), restart_proof=(fact,))


def _proof_of(tmp_path, trial: Trial):
    from envbisect.runs.baseline_proof import restart_facts

    d = _delta("/srv/a.yaml")
    pb = _playbook(tmp_path)
    original = OriginalState({("node1", d.path): FileOriginal(True, b"new")}, {})
    return build_proof(seen=[d.id], deltas=[d], original=original, contents={"a" * 64: b"old"}, trials=[trial],
                       playbook=pb, probe=pb.probes["e2e"], diff_notes=(), conflicts=(),
                       restart_facts=restart_facts(trial))


def test_the_proof_cites_what_the_baseline_trials_restart_proved(tmp_path):
    """Each service's facts come from the baseline trial's `restart_proof`: the old pid gone, the new
    pid, its start after the stop, the environment keys checked."""
    from envbisect.hosts.restart import ServiceRestart

    fact = ServiceRestart("decode", "node1", 812, True, 907, 0.84, ("SGLANG_X",), proven=True)
    p = _proof_of(tmp_path, _restarted_trial(fact))
    assert p.reproduced, p.problems()
    sv = p.to_json()["services"][0]
    assert (sv["old_pid"], sv["old_pid_gone"], sv["new_pid"], sv["env_checked"]) == (812, True, 907, ["SGLANG_X"])
    text = "\n".join(p.lines())
    assert "decode: pid 812 gone, new pid 907, started 0.8 s after the stop, environment checked: SGLANG_X" in text


def test_a_service_without_a_pid_file_is_said_not_proven_and_does_not_block(tmp_path):
    from envbisect.hosts.restart import ServiceRestart

    fact = ServiceRestart("decode", "node1", problem="decode: no pid_file in the playbook: the restart of its "
                                                     "process is not proven")
    p = _proof_of(tmp_path, _restarted_trial(fact))
    assert p.reproduced, p.problems()
    assert "decode: not proven: no pid file" in "\n".join(p.lines())
    assert p.to_json()["services"][0]["proven"] is False


def test_an_old_pid_that_survived_blocks_not_config(tmp_path):
    from envbisect.hosts.restart import ServiceRestart

    fact = ServiceRestart("decode", "node1", 812, False, problem="decode pid 812 still running 1 s after its stop")
    p = _proof_of(tmp_path, _restarted_trial(fact))
    assert not p.reproduced and any("decode pid 812 still running" in x for x in p.problems()), p.problems()


def test_an_inconclusive_verdict_names_the_failed_restart():
    from envbisect.runs.baseline_proof import unresolved_causes

    bad = Trial(3, "premise: baseline must pass", (), (), Outcome.UNRESOLVED,
                "decode pid 812 still running 1 s after its stop command (kill 812); nothing was started",
                cause=Cause.RESTART_FAILED, kind=TrialKind.PREMISE_BASELINE)
    again = Trial(4, "retry", (), (), Outcome.UNRESOLVED, bad.reason, cause=Cause.RESTART_FAILED,
                  kind=TrialKind.RETRY)
    v = unresolved_causes(Verdict("inconclusive", (), 0.0, (), "A trial stayed unresolved when retried."),
                          [bad, again])
    assert "trials 3, 4 restart-failed: decode pid 812 still running" in v.explanation, v.explanation
    culprit = Verdict("culprit", ("a",), 1.0, (), "x")
    assert unresolved_causes(culprit, [bad]) is culprit


def test_an_auto_linked_member_failing_another_way_keeps_the_group_whole():
    """A refine trial (a member of an auto-linked unit tested alone) that fails another way than the
    symptom is no evidence that member carries it (runs/symptom.py); but the side that does fail with
    the symptom cannot go alone either (the other would be left failing its own way): the group is
    reported, saying why. With the other side passing, nothing is blamed on the other failure."""
    from envbisect.runs.bisect import ApartTest, judge_apart

    test = ApartTest("linked:X", ("prefill:X", "decode:X"), ())
    same = Trial(7, "refine", ("prefill:X",), ("prefill:X",), Outcome.FAIL, "hang", symptom="same",
                 kind=TrialKind.REFINE)
    other = Trial(8, "refine", ("decode:X",), ("decode:X",), Outcome.START_FAILURE, "decode died while starting",
                  symptom="other", kind=TrialKind.REFINE)
    refined, apart, notes = {}, [], []
    judge_apart(test, [("prefill:X", same), ("decode:X", other)], refined, apart, notes)
    # neither side can go alone: reverting prefill:X would leave decode:X failing its own way
    assert refined == {}, (refined, notes)
    assert "decode:X failed another way without the other side (trial 8)" in apart[0]
    assert "reported as the group" in notes[0] and "decode:X fails another way" in notes[0], notes
    passed = Trial(9, "refine", ("prefill:X",), ("prefill:X",), Outcome.PASS, "ok", kind=TrialKind.REFINE)
    refined, apart, notes = {}, [], []
    judge_apart(test, [("prefill:X", passed), ("decode:X", other)], refined, apart, notes)
    assert refined == {} and "no evidence about it" in notes[0], notes


def _refine(n, key, failed, symptom=None):
    return Trial(n, "refine", (key,), (key,), Outcome.FAIL if failed else Outcome.PASS, "oracle",
                 symptom=symptom or ("same" if failed else None), kind=TrialKind.REFINE)


def test_three_linked_sides_two_needed_together_name_those_two_not_the_third():
    """One change in prefill, decode and router, the fault needing prefill's and decode's sides: each
    side alone passes, the link without router fails, without prefill or decode it passes. Only the two
    needed sides are blamed; router's is innocent and never named."""
    from envbisect.runs.plan import ApartTest, judge_apart

    sides = ("prefill:T", "decode:T", "router:T")
    test = ApartTest("linked:T", sides, ())
    assert test.keys == sides + tuple("without:" + m for m in sides)
    assert test.config("without:router:T") == ["member:prefill:T", "member:decode:T"]
    fails = {"without:router:T"}
    tested = [(k, _refine(i, k, k in fails)) for i, k in enumerate(test.keys, 5)]
    refined, apart, notes = {}, [], []
    judge_apart(test, tested, refined, apart, notes)
    assert refined == {"linked:T": ("prefill:T", "decode:T")}, notes
    assert "linked:T without router:T failed (trial 10)" in apart[0]


def test_three_linked_sides_name_one_only_when_the_link_without_it_was_seen_to_pass():
    from envbisect.runs.plan import ApartTest, judge_apart

    sides = ("prefill:T", "decode:T", "router:T")
    test = ApartTest("linked:T", sides, ())
    # decode alone fails; the link without decode (prefill + router) passes: decode alone is to blame
    fails = {"decode:T", "without:prefill:T", "without:router:T"}
    refined, apart, notes = {}, [], []
    judge_apart(test, [(k, _refine(i, k, k in fails)) for i, k in enumerate(test.keys)], refined, apart, notes)
    assert refined == {"linked:T": ("decode:T",)}, notes
    # ... but when prefill + router fail together too, naming decode alone would leave them: the group
    fails |= {"without:decode:T"}
    refined, apart, notes = {}, [], []
    judge_apart(test, [(k, _refine(i, k, k in fails)) for i, k in enumerate(test.keys)], refined, apart, notes)
    assert refined == {} and "not decided" in notes[0], notes


def test_three_linked_sides_any_two_of_which_break_it_are_reported_whole_with_a_note():
    from envbisect.runs.plan import ApartTest, judge_apart

    sides = ("prefill:T", "decode:T", "router:T")
    test = ApartTest("linked:T", sides, ())
    fails = {"without:" + m for m in sides}
    refined, apart, notes = {}, [], []
    judge_apart(test, [(k, _refine(i, k, k in fails)) for i, k in enumerate(test.keys)], refined, apart, notes)
    assert refined == {} and "not decided" in notes[0], notes
