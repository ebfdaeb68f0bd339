"""The incident mix (bench/bench_incidents.py): each method's logic and verdict on incidents whose
answer is known, the mix's proportions, and how a verdict is judged right."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import bench_incidents as bi  # noqa: E402
import harness  # noqa: E402
import run as bench_run  # noqa: E402

from envbisect.outcome import VerdictKind  # noqa: E402


def _of(family: str, n: int = 8, **kw) -> bi.Incident:  # noqa: ANN003
    """The first incident of ``family`` in the mix of n deltas (optionally with more conditions)."""
    for i in range(10 * bi.CYCLE):
        inc = bi.incident(n, i)
        if inc.family == family and all(getattr(inc, k) == v for k, v in kw.items()):
            return inc
    raise AssertionError(f"no {family} incident")


def _run(inc: bi.Incident, method: str) -> tuple[harness.Answer, harness.Lab]:
    lab = bi.IncidentLab(inc)
    return bi.answer(method, lab), lab


def test_every_cycle_of_the_mix_holds_the_proportions():
    for start in (0, 50, 150):  # every cycle from a multiple of CYCLE
        fams = [bi.family_of(i) for i in range(start, start + bi.CYCLE)]
        assert {f: fams.count(f) for f in bi.FAMILIES} == dict(bi.SLOTS)
    incs = [bi.incident(16, i) for i in range(500)]
    not_config = [x for x in incs if x.family == "not-config"]
    partial = [x for x in incs if x.family == "not-reproduced"]
    assert len(not_config) == 100 and len(partial) == 50
    # half the failing baselines fail intermittently; half the partial restarts leave older files running
    assert sum(x.detection < 1.0 for x in not_config) == 50
    assert sum(x.runs_its_files for x in partial) == 25


def test_incidents_are_seeded_and_culprits_are_never_logging_knobs():
    for i in range(200):
        inc = bi.incident(32, i)
        assert inc == bi.incident(32, i) and len(set(inc.deltas)) == 32
        guilty = {d for t in inc.terms for d in t}
        assert not any("_LOG_" in d for d in guilty)
        if inc.family == "twin":
            assert len(guilty) == 1 and guilty <= set(inc.linked)
        else:
            assert not guilty & set(inc.linked)
        if inc.family in ("not-config", "not-reproduced"):
            assert not inc.terms


def test_ddmin_on_a_known_oracle():
    # one culprit at position 0 of 8: halves [0..3] fails, then [0, 1], then [0]: 3 restarts
    case = harness.cases("culprit", 8)[0]
    lab = harness.Lab(case)
    ans = harness.run_ddmin(lab)
    assert ans.kind == VerdictKind.CULPRIT and ans.terms == case.truth and lab.restarts == 3
    # a pair that fails only together: no subset fails at first, a complement does; the
    # 1-minimal set is the pair, named as an interaction
    for case in harness.cases("pair", 8)[:12]:
        lab = harness.Lab(case)
        ans = harness.run_ddmin(lab)
        assert ans.kind == VerdictKind.INTERACTION and ans.terms == case.truth


def test_ddmin_never_tests_the_baseline_so_a_failing_one_makes_it_name_a_delta():
    inc = _of("not-config")
    ans, lab = _run(inc, "ddmin")
    right, innocent = bi.judge(inc, ans)
    assert ans.kind == VerdictKind.CULPRIT and not right and innocent
    assert lab.restarts == 3  # halving down to one delta, each half failing


def test_toggle_has_no_verdict_on_a_not_config_incident():
    inc = _of("not-config")
    ans, lab = _run(inc, "toggle")
    assert ans.kind == VerdictKind.INCONCLUSIVE and ans.terms is None
    assert bi.judge(inc, ans) == (False, False)
    assert lab.restarts == inc.n  # every revert, each failing


def test_toggle_and_git_bisect_blame_an_innocent_for_a_partial_restart():
    inc = _of("not-reproduced")
    ans, lab = _run(inc, "toggle")  # the first revert passes: blamed
    assert ans.terms == frozenset({frozenset({inc.deltas[0]})}) and lab.restarts == 1
    assert bi.judge(inc, ans) == (False, True)
    ans, _lab = _run(inc, "bisect")  # every prefix passes: the last delta is blamed
    assert ans.terms == frozenset({frozenset({inc.deltas[-1]})})
    assert bi.judge(inc, ans) == (False, True)


def test_bisect_verify_checks_the_baseline_and_says_not_config():
    inc = _of("not-config")
    ans, lab = _run(inc, "bisect-verify")
    assert ans.kind == VerdictKind.NOT_CONFIG and lab.restarts == 1
    assert bi.judge(inc, ans) == (True, False)


def test_envbisect_tells_the_causes_outside_the_config():
    inc = _of("not-config")
    ans, lab = _run(inc, "envbisect")
    assert ans.kind == VerdictKind.NOT_CONFIG and lab.restarts == 1  # current free, the baseline restarted
    # a service runs older files: current is co-restarted first, and passes
    inc = _of("not-reproduced", runs_its_files=False)
    ans, lab = _run(inc, "envbisect")
    assert ans.kind == VerdictKind.NOT_REPRODUCED and lab.restarts == 1
    # a service restarted alone: the running stack fails; only a co-restart of current shows it passing
    inc = _of("not-reproduced", runs_its_files=True)
    ans, lab = _run(inc, "envbisect")
    assert ans.kind == VerdictKind.NOT_REPRODUCED and ans.terms is None and lab.restarts >= 2
    assert bi.judge(inc, ans) == (True, False)


@pytest.mark.parametrize("family", ["single", "pair", "two", "intermittent", "twin"])
def test_envbisect_is_right_on_each_config_family(family):
    for n in (8, 16):
        inc = _of(family, n)
        ans, _lab = _run(inc, "envbisect")
        assert bi.judge(inc, ans) == (True, False), (inc, ans)


def test_a_verdict_names_the_truth_to_be_right():
    pair = _of("pair")
    (x, y), = pair.terms
    assert bi.judge(pair, harness.Answer(frozenset({frozenset({x})}), VerdictKind.CULPRIT)) == (False, False)
    assert bi.judge(pair, harness.Answer(frozenset({frozenset({x, y})}), VerdictKind.INTERACTION)) == (True, False)
    assert bi.judge(_of("not-config"), harness.Answer(None, VerdictKind.INCONCLUSIVE)) == (False, False)
    assert bi.judge(_of("not-reproduced"), harness.Answer(None, VerdictKind.NOT_REPRODUCED)) == (True, False)


def test_the_quick_mix_measures_every_method_and_prints_its_lines():
    # the search not given the twins: with them, a partial restart on a stack that runs its files
    # costs main's search one check per pair (dozens of restarts, seconds of CPU each at n = 32)
    res = bi.measure(quick=True, workers=1, log=lambda _m: None, split_twins=False)
    assert {(c["n"], c["method"]) for c in res["cells"]} == {(n, m) for n in bi.QUICK["ns"] for m in bi.METHODS}
    lines: list[tuple] = []
    bi.targets(res, lambda ok, target, measured, info=False: lines.append((ok, target, measured, info)))
    assert len(lines) == 7
    assert lines[0][0], lines[0]  # envbisect names no innocent change
    seconds = {line[1]: line for line in lines if "restart-seconds" in line[1]}
    assert len(seconds) == 2 and all(line[0] for line in seconds.values()), seconds
    assert lines[-1][1].startswith("[twins]") and lines[-1][3]  # an INFO line with its figures
    assert "linked n=8" in lines[-1][2] and "culprit-twin n=8" in lines[-1][2]
    pair_twin = next(line for line in lines if line[1].startswith("[pair+twin]"))
    assert pair_twin[3] and "sides apart: " in pair_twin[2] and "refine 2.00" in pair_twin[2]
    rows = {r["way"]: r for r in res["pair_twin"]}
    # the twin's sides searched apart stay within the pair bound; linked, the split and confirmations add
    assert rows["sides apart"]["over"] == 0 and rows["sides apart"]["right"] == 1.0
    assert rows["twins to the search"]["mean_restarts"] > rows["sides apart"]["mean_restarts"] + 2
    e = bi.cell(res, 8, "envbisect")
    assert e["right"] == 1.0 and e["families"]["not-config"]["mean_restarts"] == 1.0
    assert "bisect-verify" in bi.table(res) and "split after the verdict" in bi.table(res)


def test_information_lines_are_printed_but_not_counted(capsys):
    t = bench_run.Targets()
    t.add(False, "a target", "measured")
    t.add(False, "infeasible", "measured", info=True)
    t.add(True, "another", "measured")
    assert t.failed == 1 and t.counted == 2
    assert "INFO infeasible" in capsys.readouterr().out


def test_envbisect_restarts_on_a_twin_are_split_by_what_they_were_for():
    # a side of the twin guilty: the probe of current is free (the stack runs its files), the
    # baseline and the bisection find the linked unit; a Search that takes twins splits it in its plan,
    # else two restarts after the verdict do
    for case in harness.cases("linked", 8):
        lab = harness.Lab(case)
        ans = harness.run_envbisect(lab, "confirm")
        assert ans.terms == case.truth
        assert lab.free == 1 and sum(lab.spent.values()) == lab.restarts
        assert lab.spent["premise-baseline"] == 1
        assert lab.spent["refine"] == (0 if harness.takes_twins() else 2)
    # an innocent twin is never split
    for case in bi.twin_cases(8)["culprit-twin"]:
        lab = harness.Lab(case)
        assert harness.run_envbisect(lab, "confirm").terms == case.truth and lab.spent["refine"] == 0


def test_the_search_splits_a_guilty_twin_itself_and_the_verdict_names_the_side():
    # the Search takes twins (search/hints.twins_of): the harness hands them over, no restart is
    # spent after the verdict, and over every position the twin costs no more than the same deltas
    # searched unlinked
    assert harness.takes_twins()
    linked, unlinked = 0, 0
    for case in harness.cases("linked", 8):
        lab = harness.Lab(case)
        assert harness.run_envbisect(lab, "confirm").terms == case.truth
        assert lab.spent["refine"] == 0 and lab.spent["confirm"] >= 2
        apart = harness.Lab(case)
        assert harness.run_envbisect(apart, "confirm", auto_link=False).terms == case.truth
        linked, unlinked = linked + lab.restarts, unlinked + apart.restarts
    assert linked <= unlinked
    units = {"linked:K": ("prefill:K", "decode:K"), "router:R": ("router:R",)}
    assert harness.twins_of(units) == {"linked:K": ("member:prefill:K", "member:decode:K")}
    assert harness._deltas_of(units, ["member:prefill:K", "router:R"]) == {"prefill:K", "router:R"}
    assert harness._deltas_of(units, ["linked:K"]) == {"prefill:K", "decode:K"}


def test_the_twin_table_says_where_the_restarts_above_the_bound_go():
    rows = bi.measure_twins((8,))
    by = {(r["family"], r["method"]): r for r in rows}
    e = by[("linked", "envbisect")]
    assert e["free"] == 1.0 and abs(sum(e["spent"].values()) - e["mean_restarts"]) < 1e-9
    assert by[("culprit-twin", "envbisect")]["spent"]["split"] == 0.0
    # the references: the twin's sides as two units, and one culprit without a twin
    assert by[("linked", "envbisect-unlinked")]["right"] == 1.0 and ("culprit", "envbisect") in by
    text = "\n".join(bi.twin_table({"config": {"ns": [8]}, "twins": rows, "cells": []}))
    assert "sides apart" in text and "culprit-twin" in text


def test_the_issue_9_lines_no_method_with_the_premises_can_meet_are_info_lines():
    # figures where envbisect loses every comparison: only the lines that no method observing the
    # baseline, the culprit alone and its revert can win (and `linked` against bisect-verify, which
    # the [twins] line replaces) are INFO; every other line is counted, and fails
    methods = ("envbisect-confirm", "toggle", "bisect", "bisect-k", "bisect-verify")
    scenarios = harness.DETERMINISTIC + ("flaky-0.5", "flaky-0.3")
    cells = [{"scenario": s, "n": n, "method": m, "mean_restarts": 3.0 if m != "envbisect-confirm" else 99.0,
              "right": 0.5 if m == "envbisect-confirm" else 1.0, "innocent": 0.5, "evidence_bound": 5.5,
              "worst_restarts": 99, "runs": 10, "k": 4, "k_reached": True}
             for s in scenarios for n in (8, 16) for m in methods]
    t = bench_run.Targets()
    bench_run.search_targets({"config": {"ns": [8, 16]}, "cells": cells}, t)
    info = {line["target"] for line in t.lines if line["info"]}
    counted = [line for line in t.lines if not line["info"]]
    assert len(info) == 4 + 4 + 2 + 1
    assert all("one-at-a-time" in x or "classic bisection + 2" in x or "k runs/step" in x
               or x.startswith("[linked]") for x in info)
    assert counted and not any(line["pass"] for line in counted) and t.failed == len(counted)


def test_restart_seconds_follow_the_plan_and_the_groups(tmp_path):
    import restart_cost as rc

    m = rc.Meter(planned=True)
    engines = {"prefill:A", "decode:B"}
    m.restart(engines)  # the first: everything, the engines at once (300) then the router (10)
    m.probed(True)
    m.restart(engines | {"router:C"})  # router only, after a passing probe: the router alone
    m.probed(False)
    m.restart(engines)  # router only again, but the previous probe failed: everything
    m.probed(True)
    m.restart(engines - {"decode:B"}, "premise-baseline")
    assert (m.spent, m.sequential, m.partial) == (310 + 10 + 310 + 310, 4 * 610, 1)
    classic = rc.Meter()
    classic.restart(engines)
    classic.probed(True)
    classic.restart(engines | {"router:C"})
    assert classic.spent == classic.sequential == 2 * 610
    run = tmp_path / "trials.jsonl"
    run.write_text('{"restart_durations": {"prefill": 100, "decode": 120, "router": 2}}\n'
                   '{"restart_durations": {"prefill": 110, "decode": 140, "router": 4}}\n{"free": true}\n')
    model = rc.from_run(tmp_path)
    assert dict(model.seconds) == {"prefill": 105, "decode": 130, "router": 3}
    assert model.sequential == 238 and model.grouped() == 133 and model.grouped({"router"}) == 3
