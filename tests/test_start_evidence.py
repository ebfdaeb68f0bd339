"""A start command that exits non-zero (issue 34 part 1): a start failure of the configuration
only when this run saw the same command start the service for another configuration and a retry
of the same configuration failed the same way; otherwise infrastructure trouble, saying which
evidence was missing. Pure: co-restart results in, trial outcomes out."""
from __future__ import annotations

from envbisect.hosts.restart import RestartResult
from envbisect.outcome import Outcome
from envbisect.trials.start_evidence import StartEvidence

ORDER = ("prefill", "decode", "router")
OK = RestartResult(True, durations={"prefill": 1.0, "decode": 1.0, "router": 1.0})
BASE: tuple[str, ...] = ()
EAGLE = ("decode:SGLANG_SPECULATIVE_ALGORITHM",)


def exit_of(service: str = "decode", pid: int = 812, line: str = "engine exited during start") -> RestartResult:
    started = {s: 1.0 for s in ORDER[:ORDER.index(service)]}
    return RestartResult(False, "start-exit", service,
                         f"{service}: start command failed: {service}: {line} (pid {pid}) at 23:0{pid % 10}",
                         durations=started)


def test_the_first_start_of_a_service_in_the_run_is_no_evidence_and_says_so():
    ev = StartEvidence(ORDER)
    for n in (2, 3):  # the baseline, and its retry
        outcome, why = ev.saw(n, BASE, exit_of(pid=800 + n))
        assert outcome is Outcome.UNRESOLVED
        assert "the first start of decode in this run" in why and "no evidence" in why, why
    # prefill did start in those co-restarts: its own later exit is judged on that evidence
    assert ev.started == {"prefill": 2}


def test_a_configuration_that_fails_the_same_way_on_its_retry_is_a_start_failure():
    ev = StartEvidence(ORDER)
    assert ev.saw(2, BASE, OK) is None
    outcome, why = ev.saw(3, EAGLE, exit_of(pid=901))
    assert outcome is Outcome.UNRESOLVED and "started decode in trial 2" in why and "retried" in why, why
    outcome, why = ev.saw(4, EAGLE, exit_of(pid=957))  # another pid and time: the same failure
    assert outcome is Outcome.START_FAILURE, why
    assert why.startswith("decode: start command failed: decode: engine exited during start")
    assert "started decode in trial 2" in why and "trial 3 of this configuration failed the same way" in why


def test_a_retry_that_fails_differently_stays_infrastructure_trouble():
    ev = StartEvidence(ORDER)
    ev.saw(2, BASE, OK)
    ev.saw(3, EAGLE, exit_of())
    outcome, why = ev.saw(4, EAGLE, exit_of(line="cannot write /run/decode.pid: No space left on device"))
    assert outcome is Outcome.UNRESOLVED and "trial 3, the same configuration, failed differently" in why, why
    outcome, why = ev.saw(5, EAGLE, exit_of(service="router"))
    assert outcome is Outcome.UNRESOLVED and "failed differently" in why, why


def test_a_transient_start_failure_is_retried_and_is_no_evidence():
    """Fails once, then starts: the failure stays unresolved (the search retries it), the retry is
    an ordinary start, and a later exit of the same configuration is not paired with the old one."""
    ev = StartEvidence(ORDER)
    ev.saw(2, BASE, OK)
    outcome, _ = ev.saw(3, EAGLE, exit_of())
    assert outcome is Outcome.UNRESOLVED
    assert ev.saw(4, EAGLE, OK) is None
    outcome, why = ev.saw(5, EAGLE, exit_of())
    assert outcome is Outcome.UNRESOLVED and "retried" in why, why


def test_another_configuration_between_the_two_exits_is_not_a_retry():
    ev = StartEvidence(ORDER)
    ev.saw(2, BASE, OK)
    ev.saw(3, EAGLE, exit_of())
    outcome, _ = ev.saw(4, EAGLE + ("decode:NCCL_IB_GID_INDEX",), exit_of())
    assert outcome is Outcome.UNRESOLVED


def test_other_restart_failures_are_not_judged_here():
    ev = StartEvidence(ORDER)
    died = RestartResult(False, "start-failure", "decode", "decode died while starting", durations={"prefill": 1.0,
                                                                                                   "decode": 2.0})
    assert ev.saw(2, BASE, died) is None
    assert ev.started == {"prefill": 2}  # the service that died did not start
    assert ev.saw(3, BASE, RestartResult(False, "infra", None, "lost the ssh connection")) is None


def test_current_retried_after_the_baseline_started_it_is_a_start_failure():
    """The operator's edit and now decode will not start: current's first two starts are the first
    of decode in the run (unresolved); the baseline then starts decode with the same command, and
    current's next start failing the same way as its earlier one is its start failure."""
    ev = StartEvidence(ORDER)
    current = ("decode:SGLANG_ATTENTION_BACKEND", "prefill:NCCL_DEBUG")
    for n in (1, 2):
        outcome, why = ev.saw(n, current, exit_of(pid=800 + n))
        assert outcome is Outcome.UNRESOLVED and "first start of decode" in why, why
    assert ev.saw(3, BASE, OK) is None
    outcome, why = ev.saw(4, current, exit_of(pid=804))
    assert outcome is Outcome.START_FAILURE, why
    assert "trial 3" in why and "trial 2" in why, why
