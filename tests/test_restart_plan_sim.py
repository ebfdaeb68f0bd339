"""Restart plans and start groups end to end (issue 38): the simulated PD deployment over a real
sshd, each engine loading for LOAD seconds. The same bisection twice: today's sequential full
co-restarts (`order` flat, `always_all`) and `order = [["prefill", "decode"], "router"]` with the
restart plan. Same verdict, hosts byte-identical after each, less restart time with groups and
plans; a router-only trial restarts only the router (the report says so), and after a failed
probe the next trial restarts everything."""
from __future__ import annotations

import pytest

from envbisect.report.markdown import render_markdown
from envbisect.report.record import load_run
from envbisect.outcome import Outcome
from envbisect.sim.stack import SERVICES

from test_bisect_sim import INNOCENT, plant, scenario, tree_fingerprint  # noqa: F401 - fixture

pytestmark = [pytest.mark.sim, pytest.mark.slow]
LOAD = 2.0
# the router refuses every request body over 16 bytes (HTTP 413): the probe fails
CULPRIT = ("router", "ROUTER_EXTRA_ARGS", "--max-payload-size 16")
CULPRIT_ID = "router:ROUTER_EXTRA_ARGS"
# innocent: one engine change and two router changes (most of what the search then tries differs
# from the trial before it by router deltas alone)
PLANTED = [INNOCENT[0], INNOCENT[2], ("router", "ROUTER_REQUEST_TIMEOUT_SECS", "30"), CULPRIT]


def bisect_once(scenario, sshd, grouped: bool):
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config), load_seconds=LOAD)
    text = s.sim.playbook.read_text()
    old = 'order = ["prefill", "decode", "router"]'
    assert old in text
    new = 'order = [["prefill", "decode"], "router"]' if grouped else old + "\nalways_all = true"
    s.sim.playbook.write_text(text.replace(old, new, 1))
    s.baseline()
    plant(s.sim, PLANTED)
    before = tree_fingerprint(s.sim)
    res = s.bisect(probe="e2e")
    assert tree_fingerprint(s.sim) == before  # every byte, mode and mtime back
    assert all(s.sim.is_healthy(svc) for svc in SERVICES)
    return s, res


def test_groups_and_plans_cut_restart_time_with_the_same_verdict(scenario, sshd, capsys):
    seq_s, seq = bisect_once(scenario, sshd, grouped=False)
    grp_s, grp = bisect_once(scenario, sshd, grouped=True)
    for res in (seq, grp):
        assert res.verdict.kind == "culprit", res.verdict
        assert [d.split("[")[0] for d in res.culprit_deltas] == [CULPRIT_ID], res.culprit_deltas
    seq_total = sum(t.restart_s for t in seq.trials if not t.free)
    grp_total = sum(t.restart_s for t in grp.trials if not t.free)
    with capsys.disabled():
        print(f"\ntotal restart time: sequential full co-restarts {seq_total:.1f} s over {seq.restarts} restarts; "
              f"start groups and restart plans {grp_total:.1f} s over {grp.restarts} restarts")
    assert grp_total < 0.8 * seq_total, (grp_total, seq_total)
    # sequential: every restarted trial restarted everything, as the playbook says
    assert all(t.restart_plan.full and t.restart_plan.why == "[restart] always_all" for t in seq.trials if not t.free)
    restarted = [t for t in grp.trials if not t.free]
    alone = [t for t in restarted if not t.restart_plan.full]
    assert alone, "\n".join(f"{t.n} {t.config} {t.outcome} {t.restart_plan.why}" for t in grp.trials if not t.free)
    for t in alone:  # the router alone: its proof only, after a passing probe of engines it did not touch
        assert t.restart_plan.services == ("router",)
        assert [f.service for f in t.restart_proof] == ["router"] and t.restart_proof[0].proven
        assert set(t.restart_durations) == {"router"}
        earlier = restarted[restarted.index(t) - 1]
        assert earlier.outcome is Outcome.PASS
    # after a failed probe, the next trial restarts everything
    after_fail = [b for a, b in zip(restarted, restarted[1:]) if a.outcome is not Outcome.PASS]
    assert after_fail
    for t in after_fail:
        assert t.restart_plan.full and t.restart_plan.services == tuple(SERVICES)
        assert t.restart_plan.why == "the previous probe failed (an engine may be left wedged)"
        assert {f.service for f in t.restart_proof} == set(SERVICES)
    # the report says, per trial, what restarted and why
    md = render_markdown(load_run(grp_s.store / "runs" / grp.run_id))
    assert "restarted router only — only router changed" in md
    assert "restarted every service (prefill, decode, router) — the previous probe failed" in md
