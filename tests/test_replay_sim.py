"""`bisect --resume --retract N` on the simulated PD deployment over the real sshd (issue 21,
part 3): the retracted trial's decision is repeated, and only what the search then needs is run."""
from __future__ import annotations

import pytest

from test_bisect_sim import INNOCENT, Scenario, plant, tree_fingerprint
from test_replay import predicted

from envbisect.report import build_story, load_run, render_markdown
from envbisect.runs.bisect import BisectOptions, BisectRun
from envbisect.runs.replay import load_evidence, parse_log, render_log, replay_log
from envbisect.search import TrialKind
from envbisect.search.hints import Hints
from envbisect.state.rundir import Runs
from envbisect.state.store import Store

pytestmark = pytest.mark.sim
CULPRIT = "decode:SGLANG_SM120_MMA_TARGET_CTAS"


@pytest.fixture
def scenario(tmp_path):
    made = []

    def make(**kw) -> Scenario:
        s = Scenario(tmp_path / f"s{len(made)}", **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.sim.stop_all()


def test_retract_over_real_sshd_repeats_only_the_dropped_trials_decision(scenario, sshd):
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    s.baseline()
    plant(s.sim, INNOCENT[:2] + [("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")] + INNOCENT[2:3])
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit" and r.culprit_deltas == (CULPRIT,)
    # the trial that saw the culprit fail alone: say a node rebooted during its probe
    alone = next(t for t in r.trials if t.units == (CULPRIT,) and t.outcome.failed)
    rd = Runs(Store(s.store).runs_dir).get(r.run_id)
    ev = load_evidence(rd)
    want = predicted(ev.trials, {alone.n}, {CULPRIT}, ev.units, hints=Hints.from_json(ev.doc["search"]["hints"]))
    assert want  # the search needs at least that decision again
    # what `envbisect replay` says of the same edit, before anything runs
    rp = replay_log(ev, parse_log("\n".join(l for l in render_log(ev).splitlines()
                                            if not l.lstrip().startswith(f"{alone.n} ")), "edited.log"))
    assert [set(n.units) for n in rp.needs] == [set(want[0])]
    starts = []
    with s.deployment() as dep:
        r2 = BisectRun(dep, BisectOptions(), on_event=lambda k, d: starts.append(d["n"]) if k == "trial-start" else None
                       ).resume(r.run_id, retract=[alone.n])
    new = r2.trials[len(r.trials):]
    assert [set(t.units) for t in new] == [set(w) for w in want]  # exactly the trials the search needs
    assert all(not t.free for t in new) and starts == [t.n for t in new]
    assert r2.verdict.kind == "culprit" and r2.culprit_deltas == (CULPRIT,)
    assert tree_fingerprint(s.sim) == before  # hosts byte-identical after the run
    # the record keeps the retracted trial, marked; the report shows it
    assert rd.read("verdict.json")["trials"][alone.n - 1]["retracted"] is True
    assert rd.read("verdict.superseded-1.json")["verdict"] == "culprit"
    md = render_markdown(build_story(load_run(rd.path)))
    assert f"trial {alone.n}" in md and "retracted" in md, md
