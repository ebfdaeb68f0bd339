"""A trial's restart plan (issue 38, item 2): the pure rules of trials/restart_plan.py, each case of
the issue: prefill and decode always together, a router-only change restarts only the router and
only after a proven restart whose probe passed, restart_alone, always_all, a caller's reason."""
from __future__ import annotations

from pathlib import Path

import pytest

from envbisect.errors import PlaybookError
from envbisect.inputs.playbook import parse_playbook
from envbisect.trials.restart_plan import RestartPlan, Running, may_restart_alone, plan_restart

ALL = ("prefill", "decode", "router")
SERVICE_OF = {"prefill:A": "prefill", "decode:B": "decode", "router:C": "router", "router:D": "router",
              "git:node1:/srv/src": None}


def playbook(restart: dict | None = None, names=ALL, **service_keys: dict):
    services = {n: {"host": "h", "env_file": f"/srv/{n}.env", "start": "true", "stop": "true",
                    "health": "http://127.0.0.1:1/health", **service_keys.get(n, {})} for n in names}
    return parse_playbook({"hosts": {"h": {"ssh": "local"}}, "services": services,
                           "restart": {"order": [["prefill", "decode"], *names[2:]], **(restart or {})}},
                          Path("/x/envbisect.toml"))


PASSED = Running(frozenset({"prefill:A", "decode:B"}), proven=True, probe_passed=True)


def test_a_router_only_change_after_a_proven_passing_restart_restarts_only_the_router():
    plan = plan_restart(playbook(), {"prefill:A", "decode:B", "router:C"}, SERVICE_OF, PASSED)
    assert plan.services == ("router",) and not plan.full
    assert plan.why.startswith("only router changed")
    # removing a router delta is a router-only change too
    back = Running(frozenset({"router:C", "router:D"}), proven=True, probe_passed=True)
    assert plan_restart(playbook(), {"router:C"}, SERVICE_OF, back).services == ("router",)


def test_an_engine_change_restarts_both_engines_and_everything_with_them():
    for config in ({"prefill:A"}, {"prefill:A", "router:C"}, {"router:C"}):  # decode removed, router added
        plan = plan_restart(playbook(), config, SERVICE_OF, PASSED)
        assert plan.services == ALL and plan.full, config
        assert "prefill and decode restart together" in plan.why


def test_after_a_failed_probe_everything_restarts():
    failed = Running(PASSED.config, proven=True, probe_passed=False)
    plan = plan_restart(playbook(), PASSED.config | {"router:C"}, SERVICE_OF, failed)
    assert plan.services == ALL and plan.why == "the previous probe failed (an engine may be left wedged)"


def test_without_a_proven_restart_everything_restarts():
    assert plan_restart(playbook(), {"router:C"}, SERVICE_OF, None).services == ALL
    unproven = Running(PASSED.config, proven=False, probe_passed=True)
    plan = plan_restart(playbook(), PASSED.config | {"router:C"}, SERVICE_OF, unproven)
    assert plan.services == ALL and "did not prove" in plan.why


def test_a_retest_of_the_same_configuration_and_a_shared_delta_restart_everything():
    assert plan_restart(playbook(), PASSED.config, SERVICE_OF, PASSED).why.startswith("the same configuration")
    plan = plan_restart(playbook(), PASSED.config | {"git:node1:/srv/src", "router:C"}, SERVICE_OF, PASSED)
    assert plan.services == ALL and plan.why == "git:node1:/srv/src is not one service's environment"
    # a delta the map does not know is not one service's either
    assert plan_restart(playbook(), PASSED.config | {"file:x"}, SERVICE_OF, PASSED).services == ALL


def test_always_all_and_a_callers_reason_win():
    assert plan_restart(playbook({"always_all": True}), PASSED.config | {"router:C"}, SERVICE_OF,
                        PASSED) == RestartPlan(ALL, "[restart] always_all")
    plan = plan_restart(playbook(), PASSED.config | {"router:C"}, SERVICE_OF, PASSED, "a baseline premise")
    assert plan == RestartPlan(ALL, "a baseline premise")


def test_restart_alone_is_the_playbooks_to_give_or_take():
    names = ALL + ("cache",)
    pb = playbook(names=names, router={"restart_alone": False}, cache={"restart_alone": True})
    assert [may_restart_alone(pb, n) for n in names] == [False, False, False, True]
    of = SERVICE_OF | {"cache:E": "cache"}
    assert plan_restart(pb, PASSED.config | {"router:C"}, of, PASSED).services == names
    plan = plan_restart(pb, {"prefill:A", "decode:B", "cache:E"}, of, PASSED)
    assert plan.services == ("cache",) and not plan.full
    assert [may_restart_alone(playbook(), n) for n in ALL] == [False, False, True]  # by default: the router


def test_every_reason_a_plan_gives_survives_the_masker_unchanged():
    # records and reports pass through the masker; 'did not pass: ...' read as a password assignment
    # and the report showed the reason as '••••(masked, …)' (blind red-team, restart plans, F4)
    from envbisect.inputs.masking import SecretMasker

    failed = Running(PASSED.config, proven=True, probe_passed=False)
    unproven = Running(PASSED.config, proven=False, probe_passed=True)
    plans = [plan_restart(playbook(), PASSED.config | {"router:C"}, SERVICE_OF, PASSED),
             plan_restart(playbook(), {"prefill:A"}, SERVICE_OF, PASSED),
             plan_restart(playbook(), PASSED.config | {"router:C"}, SERVICE_OF, failed),
             plan_restart(playbook(), PASSED.config | {"router:C"}, SERVICE_OF, unproven),
             plan_restart(playbook(), {"router:C"}, SERVICE_OF, None),
             plan_restart(playbook(), PASSED.config, SERVICE_OF, PASSED),
             plan_restart(playbook(), PASSED.config | {"git:node1:/srv/src"}, SERVICE_OF, PASSED),
             plan_restart(playbook({"always_all": True}), PASSED.config | {"router:C"}, SERVICE_OF, PASSED)]
    masker = SecretMasker()
    assert len({p.why for p in plans}) == len(plans)
    for p in plans:
        assert masker.redact_text(p.why) == p.why


@pytest.mark.parametrize("name, keys", [
    ("decode", {}), ("prefill", {}), ("Decode-0", {}),
    ("engine-a", {"start": "python -m sglang.launch_server --disaggregation-mode prefill"}),
])
def test_restart_alone_on_an_engine_of_a_pd_pair_is_refused_at_load(name, keys):
    names = ("prefill", "decode", "router") if name in ALL else ("prefill", "decode", name)
    with pytest.raises(PlaybookError) as e:
        playbook(names=names, **{name: {"restart_alone": True, **keys}})
    assert f"services.{name}.restart_alone" in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert "prefill and decode restart together" in str(e.value)
    playbook(names=names, **{name: {"restart_alone": False, **keys}})  # false says what is true anyway
