"""Correcting the record (issue 21, part 3): `envbisect log` prints a bisection's trials as an
editable text, `envbisect replay` recomputes the verdict from an edited one without touching the
hosts, and `bisect --resume --retract N` drops a trial and goes on from what the search then asks.

The recorded runs are made by the real BisectRun (real lock, journal and run records, through
`ssh = "local"` on a host tree: tests/clistack.py) with a runner that answers from an oracle, as
tests/test_cli_inprocess.py does; a contaminated trial is one the oracle answers wrongly on purpose
(someone restarted the stack by hand during its probe)."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from clistack import CliStack, health_endpoint
from hosttree import DECODE

from envbisect.cli.app import run as cli_run
from envbisect.cli.environment import Environment
from envbisect.errors import ExitStatus, UsageError
from envbisect.inputs.playbook import load_playbook
from envbisect.outcome import Outcome
from envbisect.runs.bisect import BisectOptions, BisectRun
from envbisect.runs.deployment import Deployment
from envbisect.runs.replay import load_evidence, parse_log, record_replay, render_log, replay_log
from envbisect.search import POLICIES, Observation, TrialKind, TrialRequest
from envbisect.search.hints import Hints
from envbisect.state.rundir import Runs
from envbisect.state.store import Store
from envbisect.trials.probe import ProbeRun
from envbisect.trials.runner import Trial, TrialRunner

PROBE = '[probes.p]\nkind = "command"\ncommand = "! grep -q BAD {decode}"\n'
TOKEN = "hf_zyxwvutsrqponmlkjihgfedcba9876"
GUILTY = "decode:BAD"


def oracle(guilty: set[str], contaminated: dict[int, Outcome] | None = None, asked: list | None = None):
    """A TrialRunner that answers from the truth (a configuration fails when it holds every delta of
    ``guilty``), except the trials of ``contaminated`` (number -> the outcome the probe wrongly saw)."""
    wrong = contaminated or {}

    class OracleRunner(TrialRunner):
        def run(self, n, unit_ids, probes, purpose, stop_after=1, kind=None, *a, **kw):  # noqa: ANN001
            config = self.delta_ids(unit_ids)
            if asked is not None:
                asked.append((n, config))
            outcome = wrong.get(n, Outcome.FAIL if guilty <= set(config) else Outcome.PASS)
            bad = outcome is Outcome.FAIL
            runs = tuple(ProbeRun(self.probe.name, "oracle", outcome, "oracle", (), 0.01)
                         for _ in range(1 if bad else probes))
            return Trial(n, purpose, tuple(unit_ids), config, outcome, f"oracle (seen with HF_TOKEN={TOKEN})", runs,
                         restart_s=0.01,
                         kind=kind or Trial.kind)

        probe_running = run

    return OracleRunner


class Captured:
    def __init__(self, stdin: str = "") -> None:
        self.stdout, self.stderr = io.StringIO(), io.StringIO()
        self.env = Environment(stdout=self.stdout, stderr=self.stderr, stdin=io.StringIO(stdin), width=200)

    @property
    def out(self) -> str:
        return self.stdout.getvalue()

    @property
    def err(self) -> str:
        return self.stderr.getvalue()


@pytest.fixture(scope="module")
def health():
    with health_endpoint() as url:
        yield url


class Recorded:
    """A deployment with four env deltas in decode (BAD guilty) and its bisections."""

    def __init__(self, root: Path, health: str):
        self.stack = CliStack(root, health, PROBE, name="replay")
        rc, c = self.cli("snapshot", "--label", "noon")
        assert rc == 0, c.err
        self.stack.tree.edit("decode", DECODE.replace("hf_abcdefghijklmnopqrstuvwxyz0123", TOKEN)
                             + "export BAD=1\nexport OTHER=2\nexport THIRD=3\nexport FOURTH=4\n")
        self.files = self.host_files()

    def host_files(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in self.stack.tree.conf.iterdir()}

    def deployment(self) -> Deployment:
        return Deployment(load_playbook(self.stack.playbook), Store(self.stack.store))

    def bisect(self, runner, **opts):
        with self.deployment() as dep:
            return BisectRun(dep, BisectOptions(**opts), runner_factory=runner).start(dep.diff(against="noon"))

    def resume(self, runner, run_id: str, retract=()):
        with self.deployment() as dep:
            return BisectRun(dep, BisectOptions(), runner_factory=runner).resume(run_id, retract=retract)

    def evidence(self, run_id: str):
        return load_evidence(Runs(Store(self.stack.store).runs_dir).get(run_id))

    def cli(self, *args: str, stdin: str = "") -> tuple[int, Captured]:
        c = Captured(stdin)
        return cli_run(["-p", str(self.stack.playbook), "--store", str(self.stack.store), *args], c.env), c


@pytest.fixture
def rec(tmp_path, health):
    return Recorded(tmp_path, health)


def without(log: str, n: int) -> str:
    return "\n".join(l for l in log.splitlines() if not l.lstrip().startswith(f"{n} ")) + "\n"


def flipped(log: str, n: int, to: str) -> str:
    out = []
    for line in log.splitlines():
        words = line.split()
        if words and words[0] == str(n):
            line = line.replace(words[1], to, 1)
        out.append(line)
    return "\n".join(out) + "\n"


def predicted(trials, retracted: set[int], guilty: set[str], units, base_probes: int = 1,
              hints: Hints | None = None) -> list[frozenset]:
    """The configurations a fresh search asks for once it has seen the record without ``retracted``,
    answered from the truth (a configuration fails when it holds every delta of ``guilty``).
    ``hints``: the run's (run.json), so the search is the run's."""
    hints = hints or Hints()
    search = POLICIES["confirm"].search(list(units), base_probes=base_probes, **hints.search_options())
    table = {**units, **hints.member_units()}
    for t in trials:
        if t.n in retracted or t.kind in (TrialKind.REFINE, TrialKind.GUARD, TrialKind.FINAL):
            continue
        failed = t.outcome.failed
        search.observe(Observation(frozenset(t.units), passes=t.passes, failed=failed,
                                   failures=max(t.failures, int(failed)), free=t.free, trial=t.n))
    asked = []
    while isinstance(req := search.next(), TrialRequest):
        asked.append(req.config)
        bad = guilty <= {d for u in req.config for d in table.get(u, (u,))}
        search.observe(Observation(req.config, passes=0 if bad else req.probes, failed=bad,
                                   failures=min(req.stop_after, req.probes) if bad else 0))
    return asked


# --- replay: pure, on recorded runs --------------------------------------------------------------

def test_dropping_a_contaminated_trial_replays_what_the_rest_supports(rec):
    """Trial 3 passed because the stack was restarted by hand during its probe: the recorded verdict
    names an innocent (OTHER) beside the culprit. Dropped from the log, the rest of the evidence no
    longer decides, and the replay says which trial it needs next, without touching the hosts."""
    r = rec.bisect(oracle({GUILTY}, {3: Outcome.PASS}))
    assert r.verdict.kind == "interaction" and "decode:OTHER" in r.culprit_deltas  # the contamination's harm
    ev = rec.evidence(r.run_id)
    rp = replay_log(ev, parse_log(without(render_log(ev), 3), "edited.log"))
    assert [(c.trial, c.now, c.was) for c in rp.changes] == [(3, "retracted", "pass")]
    assert not rp.decided and rp.result.verdict.kind == "pending" and rp.exit_status is ExitStatus.INCONCLUSIVE
    want = predicted(ev.trials, {3}, {GUILTY}, ev.units)
    assert [set(n.units) for n in rp.needs] == [set(want[0])]
    assert rp.needs[0].kind is TrialKind.BISECT
    assert rec.host_files() == rec.files  # nothing on the hosts changed
    # a trial that was not needed: the remaining evidence still decides, the same culprit
    r = rec.bisect(oracle({GUILTY}, {5: Outcome.PASS}))
    ev = rec.evidence(r.run_id)
    rp = replay_log(ev, parse_log(without(render_log(ev), 5), "edited.log"))
    assert rp.decided and rp.result.verdict.kind == "culprit" and rp.result.culprit_deltas == (GUILTY,)
    assert rp.exit_status is ExitStatus.OK and "(trial 7)" in rp.result.verdict.explanation


def test_flipping_an_outcome_changes_the_verdict_and_says_what_is_still_needed(rec):
    """The fix's trial failed because a node rebooted during its probe: the recorded verdict is wrong
    (one failure proves a config bad: a pair of innocents is named beside the culprit, or the run is
    inconclusive). Flipped to pass, the record decides: decode:BAD, with the trials that came after
    listed as not needed. Flipping a pass to fail asks for the trial the new evidence needs."""
    r = rec.bisect(oracle({GUILTY}, {6: Outcome.FAIL}))
    assert r.verdict.kind in ("inconclusive", "interaction") and set(r.culprit_deltas) != {GUILTY}
    ev = rec.evidence(r.run_id)
    rp = replay_log(ev, parse_log(flipped(render_log(ev), 6, "pass"), "edited.log"))
    assert [(c.trial, c.now, c.was) for c in rp.changes] == [(6, "pass", "fail")]
    assert rp.decided and rp.result.verdict.kind == "culprit" and rp.result.culprit_deltas == (GUILTY,)
    assert rp.unused == tuple(range(7, len(ev.trials) + 1))
    doc = rp.to_json()
    assert doc["verdict"] == "culprit" and doc["trials"][5]["corrected_outcome"] == "pass"
    assert doc["replay"]["needs"] == [] and doc["replay"]["changes"][0]["trial"] == 6

    r = rec.bisect(oracle({GUILTY}, {3: Outcome.PASS}))
    ev = rec.evidence(r.run_id)
    rp = replay_log(ev, parse_log(flipped(render_log(ev), 3, "fail"), "edited.log"))
    assert rp.result.verdict.kind == "pending" and "decode:OTHER" not in rp.result.culprit_deltas
    assert [n.kind for n in rp.needs] == [TrialKind.CONFIRM]
    assert set(rp.needs[0].deltas) == {"decode:FOURTH", "decode:HF_TOKEN", "decode:OTHER", "decode:THIRD"}


def test_a_replay_is_recorded_beside_the_untouched_record_and_can_be_undone(rec):
    r = rec.bisect(oracle({GUILTY}, {6: Outcome.FAIL}))
    ev = rec.evidence(r.run_id)
    rd = ev.run
    trials_before = rd.file("trials.jsonl").read_bytes()
    log = render_log(ev)
    rp = record_replay(ev, replay_log(ev, parse_log(flipped(log, 6, "pass"), "a.log")))
    assert rp.recorded and rp.superseded == "verdict.superseded-1.json"
    assert rd.file("trials.jsonl").read_bytes() == trials_before  # history is never rewritten
    assert rd.read("verdict.json")["verdict"] == "culprit"
    assert rd.read("verdict.superseded-1.json")["verdict"] in ("inconclusive", "interaction")
    ev = rec.evidence(r.run_id)
    assert ev.corrections.state(6) == "pass"
    again = render_log(ev)
    assert "  6  pass" in again and "corrected (ran: fail)" in again
    # the original log put back: the correction is undone by another one, the verdict recomputed
    rp = record_replay(ev, replay_log(ev, parse_log(log, "b.log")))
    assert [(c.trial, c.now) for c in rp.changes] == [(6, "as-recorded")]
    assert rd.read("verdict.json")["verdict"] == r.verdict.kind and rd.has("verdict.superseded-2.json")
    assert [json.loads(l)["now"] for l in rd.file("corrections.jsonl").read_text().splitlines()] == ["pass",
                                                                                                   "as-recorded"]


# --- --retract through the real lock, journal and records ------------------------------------------

def test_retract_repeats_only_what_the_search_needs_without_the_trial(rec, tmp_path):
    """`bisect --resume --retract 3` on a finished run whose trial 3 was contaminated: the trial
    stays in the record, marked retracted; the search, shown the rest, asks exactly the trials a
    fresh search would; the verdict names only the culprit; the hosts are as they were."""
    r = rec.bisect(oracle({GUILTY}, {3: Outcome.PASS}))
    ev = rec.evidence(r.run_id)
    want = predicted(ev.trials, {3}, {GUILTY}, ev.units)
    asked: list = []
    r2 = rec.resume(oracle({GUILTY}, asked=asked), r.run_id, retract=[3])
    assert [set(c) for _n, c in asked] == [set(w) for w in want]
    assert [n for n, _c in asked] == list(range(len(ev.trials) + 1, len(ev.trials) + 1 + len(want)))
    assert r2.verdict.kind == "culprit" and r2.culprit_deltas == (GUILTY,)
    doc = r2.to_json()
    assert doc["trials"][2]["retracted"] is True and doc["corrections"][0]["by"] == "bisect --retract"
    assert len(doc["trials"]) == len(ev.trials) + len(want)
    rd = ev.run
    assert rd.read("verdict.superseded-1.json")["verdict"] == "interaction"
    assert rec.host_files() == rec.files
    log = render_log(rec.evidence(r.run_id))
    assert "#   3  pass" in log and "(retracted)" in log
    rc, c = rec.cli("show", r.run_id)
    assert rc == 0 and "verdict culprit" in c.out
    # the postmortem bundle carries the corrections and the superseded verdict, and the report shows them
    import tarfile

    rc, c = rec.cli("bundle", "--run", r.run_id, "--out", str(tmp_path), "--json")
    assert rc == 0, c.err
    path = json.loads(c.out)["bundle"]
    with tarfile.open(path) as tar:
        names = tar.getnames()
        md = tar.extractfile("report.md").read().decode()
        blob = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())
    assert "corrections.jsonl" in names and "verdict.superseded-1.json" in names
    assert "Corrections of the record" in md and "trial 3 (pass) retracted" in md and "(retracted: not evidence)" in md
    assert TOKEN.encode() not in blob
    assert rec.cli("bundle", "--check", path)[0] == 0


def test_retracting_a_premise_asks_the_premise_again(rec):
    """A premise trial may be retracted (decided so: it is a trial like any other): the search asks
    for it again and goes on from there."""
    r = rec.bisect(oracle({GUILTY}))
    asked: list = []
    r2 = rec.resume(oracle({GUILTY}, asked=asked), r.run_id, retract=[2])
    assert asked and asked[0][1] == ()  # the baseline, again
    assert r2.verdict.kind == "culprit" and r2.culprit_deltas == (GUILTY,)
    assert rec.host_files() == rec.files


# --- the CLI --------------------------------------------------------------------------------------

def test_cli_log_edit_replay_then_resume_runs_only_what_is_needed(rec, tmp_path):
    r = rec.bisect(oracle({GUILTY}, {3: Outcome.PASS}))
    rc, c = rec.cli("log", r.run_id)
    assert rc == ExitStatus.OK, c.err
    assert f"run {r.run_id}\n" in c.out and "deployment replay-" in c.out and TOKEN not in c.out
    assert "HF_TOKEN=" in c.out  # the reason is there, its value masked
    edited = tmp_path / "edited.log"
    edited.write_text(without(c.out, 3))
    rc, c = rec.cli("replay", str(edited), "--dry-run", "--json")
    assert rc == ExitStatus.INCONCLUSIVE, c.err
    doc = json.loads(c.out)
    assert doc["verdict"] == "pending" and not doc["replay"]["recorded"] and TOKEN not in c.out
    assert set(doc) >= {"run", "verdict", "culprits", "confidence", "suspects", "explanation", "units", "trials",
                        "restarts", "notes", "state_left"}
    assert not (Runs(Store(rec.stack.store).runs_dir).get(r.run_id).path / "corrections.jsonl").exists()
    rc, c = rec.cli("replay", str(edited))
    assert rc == ExitStatus.INCONCLUSIVE, c.err
    assert "correction: trial 3 (pass) retracted" in c.out and "still needed: bisect: 4 suspects left" in c.out
    assert f"bisect --resume --run {r.run_id}" in c.out and "verdict.superseded-1.json" in c.out
    rc, c = rec.cli("runs")
    assert "unfinished" in c.out
    # the real runner now: the command probe fails while decode's file holds BAD
    rc, c = rec.cli("bisect", "--resume", "--run", r.run_id, "--json")
    assert rc == ExitStatus.OK, c.err
    doc = json.loads(c.out)
    assert doc["verdict"] == "culprit" and doc["culprits"] == [GUILTY]
    ev = rec.evidence(r.run_id)
    new = [t for t in ev.trials if t.n > 8]
    assert [set(t.units) for t in new] == [set(w) for w in predicted(ev.trials[:8], {3}, {GUILTY}, ev.units)]
    assert doc["trials"][2]["retracted"] is True
    assert rec.host_files() == rec.files


def one_line_error(rc: int, c: Captured, *words: str) -> None:
    assert rc == ExitStatus.USAGE, (rc, c.out, c.err)
    assert c.out == "" and c.err.count("\n") == 1 and "Traceback" not in c.err, c.err
    for w in words:
        assert w in c.err, c.err


def test_bad_input_is_one_line_and_exit_2(rec, tmp_path):
    r = rec.bisect(oracle({GUILTY}))
    rc, c = rec.cli("log", r.run_id)
    log = c.out
    rd = Runs(Store(rec.stack.store).runs_dir).get(r.run_id)
    f = tmp_path / "e.log"

    def replay(text: str, *extra: str):
        f.write_text(text)
        return rec.cli("replay", str(f), *extra)

    one_line_error(*rec.cli("log", "nosuchrun"), "no run 'nosuchrun'")
    one_line_error(*rec.cli("replay", str(tmp_path / "missing.log")), "missing.log: cannot read")
    one_line_error(*replay(log.replace(f"run {r.run_id}", "run 20990101T000000-ffffff")), "no run '20990101T")
    one_line_error(*replay(log.replace("  2  pass", "  2  maybe")), "e.log:", "trial 2: unknown outcome 'maybe'")
    one_line_error(*replay(log.replace("  2  pass", "  2  unresolved")), "an outcome can only be corrected to pass")
    one_line_error(*replay(log + "  2  pass  baseline\n"), "trial 2 appears twice")
    one_line_error(*replay(log.replace("  5  fail           decode:BAD", "  5  fail  decode:OTHER")),
                   "trial 5 ran decode:BAD", "cannot be edited")
    one_line_error(*replay(log + " 99  pass  baseline\n"), "has no trial 99")
    one_line_error(*replay(log + "garbage here\n"), "expected a trial line")
    one_line_error(*replay(log.replace("deployment ", "deployment other-")), "the log says other-")
    one_line_error(*replay("just text\n"), "expected a trial line")
    one_line_error(*replay("# nothing\n"), "not an envbisect log")
    one_line_error(*replay(log.replace("  2  pass  ", "  2  pass 'unclosed ")), "cannot read this line")
    one_line_error(*rec.cli("bisect", "--retract", "3"), "--retract N corrects a recorded run")
    one_line_error(*rec.cli("bisect", "--resume", "--run", r.run_id, "--retract", "99"), "has no trial 99")
    assert not rd.has("corrections.jsonl") and rd.has("verdict.json")  # nothing recorded by a refusal
    rec.resume(oracle({GUILTY}), r.run_id, retract=[5])
    one_line_error(*rec.cli("bisect", "--resume", "--run", r.run_id, "--retract", "5"), "already retracted")
    assert rec.host_files() == rec.files


def test_the_record_of_a_finished_run_is_refused_when_the_hosts_moved_on(rec):
    """A finished run's deltas are what the hosts held then: when decode's file changed since, a
    retraction is refused (one line) and nothing is recorded."""
    r = rec.bisect(oracle({GUILTY}))
    rec.stack.tree.edit("decode", DECODE + "export BAD=1\n")
    moved = rec.host_files()
    with pytest.raises(UsageError, match="changed since the diff was taken"):
        rec.resume(oracle({GUILTY}), r.run_id, retract=[5])
    rd = Runs(Store(rec.stack.store).runs_dir).get(r.run_id)
    assert not rd.has("corrections.jsonl") and rd.has("verdict.json") and rec.host_files() == moved


def test_an_auto_linked_culprit_split_by_the_search_replays_and_repeats_only_a_retracted_trial(rec):
    """The same change in prefill and decode is one unit for the search until the bisection finds
    it; then the search asks one side alone (search/hints.py), with no refinement trial after the
    verdict. Replay builds the same search from run.json and reaches the same verdict; retracting
    the trial that showed decode's side failing alone repeats what the search then needs, nothing
    else."""
    from hosttree import PREFILL

    rec.stack.tree.edit("prefill", PREFILL + "export LINKED=1\n")
    rec.stack.tree.edit("decode", DECODE + "export LINKED=1\nexport OTHER=2\n")
    rec.files = rec.host_files()
    r = rec.bisect(oracle({"decode:LINKED"}))
    assert r.verdict.kind == "culprit" and r.culprit_deltas == ("decode:LINKED",), (r.verdict, r.notes)
    assert not [t for t in r.trials if t.kind is TrialKind.REFINE]
    alone = next(t for t in r.trials if t.units == ("member:decode:LINKED",))
    ev = rec.evidence(r.run_id)
    rp = replay_log(ev, parse_log(render_log(ev), "same.log"))
    assert rp.decided and rp.result.culprit_deltas == ("decode:LINKED",) and not rp.changes
    hints = Hints.from_json(ev.doc["search"]["hints"])
    assert hints.twins == {"linked:LINKED": ("member:decode:LINKED", "member:prefill:LINKED")} or \
        hints.twins == {"linked:LINKED": ("member:prefill:LINKED", "member:decode:LINKED")}
    want = predicted(ev.trials, {alone.n}, {"decode:LINKED"}, ev.units, hints=hints)
    assert want
    rp = replay_log(ev, parse_log(without(render_log(ev), alone.n), "edited.log"))
    assert not rp.decided and [set(n.units) for n in rp.needs] == [set(want[0])]
    asked: list = []
    r2 = rec.resume(oracle({"decode:LINKED"}, asked=asked), r.run_id, retract=[alone.n])
    table = {**ev.units, **hints.member_units()}
    assert [set(c) for _n, c in asked] == [{d for u in w for d in table[u]} for w in want]
    assert r2.culprit_deltas == ("decode:LINKED",) and rec.host_files() == rec.files


def test_what_cannot_be_corrected_is_refused_with_one_line():
    """Guard and final trials are no evidence of the verdict; a perf bisection's reference is what
    every later trial was judged against. A premise trial can be corrected (the search asks again)."""
    from envbisect.runs.corrected_evidence import check_correctable

    def trial(n, kind, config=()):
        return Trial(n, "p", tuple(config), tuple(config), Outcome.PASS, "r", kind=kind)

    trials = [trial(1, TrialKind.PREMISE_BASELINE), trial(2, TrialKind.PREMISE_CURRENT, ["a"]),
              trial(3, TrialKind.GUARD, ["a"]), trial(4, TrialKind.FINAL)]
    perf = {"perf": {"probe": "tps", "guard": False}}
    with pytest.raises(UsageError, match="perf reference"):
        check_correctable("R", perf, trials, 1)
    assert check_correctable("R", {}, trials, 1).n == 1  # not a perf run: a premise like any
    assert check_correctable("R", {"perf": {"guard": True}}, trials, 1).n == 1  # a guard's probe: no reference
    assert check_correctable("R", perf, trials, 2).n == 2
    for n, what in ((3, "guard"), (4, "final")):
        with pytest.raises(UsageError, match=f"it is a {what} trial"):
            check_correctable("R", perf, trials, n)
    with pytest.raises(UsageError, match="has no trial 5"):
        check_correctable("R", perf, trials, 5)


def test_a_replayed_not_config_is_gated_by_the_baseline_proof_of_the_record(rec):
    """Replay recomputes the verdict from the record; a not-config it reaches stands only on a proof
    built from the run folder, as the live one did. A run that left a delta out (--exclude) cannot
    prove its baseline trial was the baseline: live and replayed, the verdict is inconclusive."""
    from envbisect.runs.replay import replay_evidence

    live = rec.bisect(oracle(set()), exclude=("decode:OTHER",))  # every configuration fails
    assert live.verdict.kind == "inconclusive" and "decode:OTHER" in live.verdict.explanation, live.verdict
    ev = rec.evidence(live.run_id)
    rp = replay_evidence(ev, ev.corrections)
    assert rp.result.verdict.kind == "inconclusive", rp.result.verdict
    why = rp.result.verdict.explanation
    assert "decode:OTHER" in why and "could not be reproduced" in why
    assert rp.result.baseline_proof is not None and not rp.result.baseline_proof.reproduced


def test_a_replayed_not_config_keeps_the_proof_of_its_baseline_trial(rec):
    from envbisect.runs.replay import replay_evidence

    live = rec.bisect(oracle(set()))
    assert live.verdict.kind == "not-config" and live.baseline_proof.reproduced, live.verdict
    ev = rec.evidence(live.run_id)
    rp = replay_evidence(ev, ev.corrections)
    assert rp.result.verdict.kind == "not-config", rp.result.verdict
    p = rp.result.baseline_proof
    assert p.reproduced and p.trial == live.baseline_proof.trial
    assert {f.delta for f in p.files} == {f.delta for f in live.baseline_proof.files}
    assert [f.baseline for f in p.files] == [f.baseline for f in live.baseline_proof.files]


def symptom_oracle():
    """decode:BAD is the symptom (the command probe exits 1); decode:OTHER with decode:THIRD (without
    BAD) keeps decode from starting: another failure, no evidence about the symptom (runs/symptom.py)."""
    from envbisect.trials.probe import RequestRecord

    class SymptomRunner(TrialRunner):
        def run(self, n, unit_ids, probes, purpose, stop_after=1, kind=None, *a, **kw):  # noqa: ANN001
            config = set(self.delta_ids(unit_ids))
            base = dict(restart_s=0.01, kind=kind or Trial.kind)
            if GUILTY in config:
                runs = (ProbeRun(self.probe.name, "command", Outcome.FAIL, "exit status 1",
                                 (RequestRecord(1, False, 1, 0.01, "exit status 1"),), 0.01),)
                return Trial(n, purpose, tuple(unit_ids), tuple(sorted(config)), Outcome.FAIL, "exit 1", runs, **base)
            if "decode:OTHER" in config and "decode:THIRD" in config:
                return Trial(n, purpose, tuple(unit_ids), tuple(sorted(config)), Outcome.START_FAILURE,
                             "decode died while starting", **base)
            runs = tuple(ProbeRun(self.probe.name, "command", Outcome.PASS, "ok", (), 0.01) for _ in range(probes))
            return Trial(n, purpose, tuple(unit_ids), tuple(sorted(config)), Outcome.PASS, "ok", runs, **base)

        probe_running = run

    return SymptomRunner


def test_another_failure_in_the_record_is_fed_as_such_on_replay_and_resume(rec):
    """A trial recorded as "another failure" (Trial.symptom == "other") reaches the search as
    Observation.other on replay and on resume, so both reach the live run's verdict."""
    live = rec.bisect(symptom_oracle(), auto_link=False)
    others = [t.n for t in live.trials if t.symptom == "other"]
    assert others, [(t.n, t.config, t.outcome, t.symptom) for t in live.trials]
    assert live.verdict.kind == "culprit" and live.culprit_deltas == (GUILTY,), live.verdict
    ev = rec.evidence(live.run_id)
    assert [t.symptom for t in ev.trials] == [t.symptom for t in live.trials]
    rp = replay_log(ev, parse_log(render_log(ev)))
    assert (rp.result.verdict.kind, rp.result.verdict.culprits) == (live.verdict.kind, live.verdict.culprits)
    assert rp.result.verdict.explanation == live.verdict.explanation
    # resume after retracting a trial that is not the other failure: the other failure is still no evidence
    keep = next(t.n for t in live.trials if t.n not in others and t.config)
    again = rec.resume(symptom_oracle(), live.run_id, retract=[keep])
    assert (again.verdict.kind, again.culprit_deltas) == ("culprit", (GUILTY,)), again.verdict
    assert all(t.symptom == "other" for t in again.trials if t.n in others)
