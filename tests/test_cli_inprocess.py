"""The CLI in-process: `envbisect.cli.app.run(args, env)` against an injected `Environment`
(httpie's model), so the command paths are tested without a subprocess each. The deployment is
real (tests/clistack.py: a host tree through `ssh = "local"`, a real health endpoint, a command
probe that fails while decode's env file holds BAD); only the streams are in memory."""
from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from clistack import CliStack, health_endpoint
from hosttree import DECODE

from envbisect import __version__
from envbisect.cli.app import run
from envbisect.cli.environment import Environment
from envbisect.errors import ExitStatus

FAILS_ON_BAD = '[probes.p]\nkind = "command"\ncommand = "! grep -q BAD {decode}"\n'
TOKEN = "hf_zyxwvutsrqponmlkjihgfedcba9876"  # DECODE holds another one


class Captured:
    def __init__(self) -> None:
        self.stdout, self.stderr = io.StringIO(), io.StringIO()
        self.env = Environment(stdout=self.stdout, stderr=self.stderr, stdin=io.StringIO(), width=200)

    @property
    def out(self) -> str:
        return self.stdout.getvalue()

    @property
    def err(self) -> str:
        return self.stderr.getvalue()


def cli(*args: str) -> tuple[int, Captured]:
    c = Captured()
    return run(list(args), c.env), c


@pytest.fixture(scope="module")
def health():
    with health_endpoint() as url:
        yield url


@pytest.fixture
def stack(tmp_path, health):
    return CliStack(tmp_path, health, FAILS_ON_BAD, name="inproc")


def base(stack: CliStack) -> list[str]:
    return ["-p", str(stack.playbook), "--store", str(stack.store)]


def test_version_help_and_bad_usage_go_to_the_injected_streams():
    rc, c = cli("--version")
    assert rc == 0 and c.out.strip() == f"envbisect {__version__}" and c.err == ""
    rc, c = cli("bogus")
    assert rc == ExitStatus.USAGE and c.out == ""
    assert c.err.count("\n") == 1 and "No such command 'bogus'" in c.err
    rc, c = cli()
    assert rc == ExitStatus.USAGE and "Usage:" in c.err


def test_snapshot_diff_bisect_show_in_process_with_exit_statuses(stack):
    b = base(stack)
    rc, c = cli(*b, "snapshots")
    assert rc == ExitStatus.OK and "no snapshots" in c.out
    rc, c = cli(*b, "snapshot", "--label", "noon", "--json")
    assert rc == ExitStatus.OK, c.err
    assert json.loads(c.out)["label"] == "noon"
    rc, c = cli(*b, "diff", "--against", "noon")
    assert rc == ExitStatus.OK and "no deltas" in c.out, c.err

    stack.tree.edit("decode", DECODE.replace("hf_abcdefghijklmnopqrstuvwxyz0123", TOKEN) + "export BAD=1\nexport OTHER=2\n")
    rc, c = cli(*b, "diff", "--against", "noon")
    assert rc == ExitStatus.DELTAS and "+ BAD=1" in c.out and TOKEN not in c.out, c.out
    rc, c = cli(*b, "diff", "--against", "noon", "--json")
    doc = json.loads(c.out)
    assert rc == ExitStatus.DELTAS and {d["key"] for d in doc["deltas"]} == {"BAD", "OTHER", "HF_TOKEN"}, doc
    assert TOKEN not in c.out

    rc, c = cli(*b, "bisect", "--against", "noon", "--dry-run")
    assert rc == ExitStatus.OK and "dry run: no host was touched" in c.out and "plan: probe p" in c.out

    rc, c = cli(*b, "bisect", "--against", "noon", "--json")
    assert rc == ExitStatus.OK, c.err
    verdict = json.loads(c.out)
    assert verdict["verdict"] == "culprit" and verdict["culprits"] == ["decode:BAD"], verdict
    assert "trial 1" in c.err and TOKEN not in c.out + c.err  # progress lines on the injected stderr

    rc, c = cli(*b, "runs")
    assert rc == ExitStatus.OK and verdict["run"] in c.out and "culprit" in c.out
    rc, c = cli(*b, "show", verdict["run"])
    assert rc == ExitStatus.OK and "verdict culprit" in c.out and "decode:BAD" in c.out


def test_an_error_is_one_line_and_a_bug_writes_a_masked_crash_log(stack, tmp_path, monkeypatch):
    rc, c = cli("-p", str(tmp_path / "missing.toml"), "--store", str(stack.store), "diff")
    assert rc == ExitStatus.USAGE and c.out == "" and c.err.count("\n") == 1 and "envbisect: error:" in c.err

    import envbisect.state.store as store

    def boom(self):  # noqa: ANN001
        raise RuntimeError(f"bug while holding HF_TOKEN={TOKEN}")

    monkeypatch.setattr(store.Store, "list", boom)
    rc, c = cli("--store", str(tmp_path / "s"), "snapshots")
    assert rc == ExitStatus.INTERNAL and c.err.count("\n") == 1 and "internal error (a bug): RuntimeError" in c.err
    assert TOKEN not in c.err
    logs = list((tmp_path / "s" / "crash").glob("crash-*.log"))
    assert len(logs) == 1 and "in boom" in logs[0].read_text() and TOKEN not in logs[0].read_text()
    rc, c = cli("--store", str(tmp_path / "s"), "--traceback", "snapshots")
    assert rc == ExitStatus.INTERNAL and "Traceback (most recent call last)" in c.err and TOKEN not in c.err


def test_the_process_streams_are_untouched_by_an_in_process_run(stack, capsys):
    rc, c = cli(*base(stack), "snapshot", "--json")
    assert rc == 0 and json.loads(c.out)["hosts"]["node1"]["files"] >= 3
    got = capsys.readouterr()
    assert got.out == "" and got.err == ""  # everything went to the injected environment


def test_main_applies_the_exit_status(stack, monkeypatch):
    import envbisect.cli.app as app

    monkeypatch.setattr(sys, "argv", ["envbisect", *base(stack), "diff", "--against", "nosuch"])
    with pytest.raises(SystemExit) as e:
        app.main()
    assert e.value.code == ExitStatus.USAGE
    assert Path(stack.playbook).exists()


def test_bisect_run_takes_its_collaborators_a_runner_that_answers_from_an_oracle(stack):
    """The library seam behind the CLI: BisectRun with the real lock, journal, records and search,
    and a TrialRunner that answers from a known truth (OTHER and BAD fail only together) instead of
    editing, restarting and probing. No host file is touched; the verdict and records are right."""
    from envbisect.inputs.playbook import load_playbook
    from envbisect.outcome import Outcome
    from envbisect.runs.bisect import BisectOptions, BisectRun
    from envbisect.runs.deployment import Deployment
    from envbisect.state.store import Store
    from envbisect.trials.probe import ProbeRun
    from envbisect.trials.runner import Trial, TrialRunner

    asked: list[tuple[str, ...]] = []

    class OracleRunner(TrialRunner):
        def run(self, n, unit_ids, probes, purpose, stop_after=1, kind=None, *a, **kw):  # noqa: ANN001
            config = self.delta_ids(unit_ids)
            asked.append(config)
            bad = {"decode:BAD", "decode:OTHER"} <= set(config)
            outcome = Outcome.FAIL if bad else Outcome.PASS
            runs = tuple(ProbeRun(self.probe.name, "oracle", outcome, "oracle", (), 0.01) for _ in range(1 if bad else probes))
            return Trial(n, purpose, tuple(unit_ids), config, outcome, "oracle", runs, kind=kind or Trial.kind)

        probe_running = run

    before = {p.name: p.read_bytes() for p in stack.tree.conf.iterdir()}
    rc, c = cli(*base(stack), "snapshot", "--label", "noon")
    assert rc == 0, c.err
    stack.tree.edit("decode", DECODE + "export BAD=1\nexport OTHER=2\nexport THIRD=3\n")
    edited = {p.name: p.read_bytes() for p in stack.tree.conf.iterdir()}
    with Deployment(load_playbook(stack.playbook), Store(stack.store)) as dep:
        result = BisectRun(dep, BisectOptions(), runner_factory=OracleRunner).start(dep.diff(against="noon"))
    assert result.verdict.kind == "interaction" and set(result.culprit_deltas) == {"decode:BAD", "decode:OTHER"}
    # the premises were asked for (current fails, baseline passes), every trial went through the oracle
    assert ("decode:BAD", "decode:OTHER", "decode:THIRD") in asked and () in asked
    assert len(asked) == len(result.trials)
    assert {p.name: p.read_bytes() for p in stack.tree.conf.iterdir()} == edited != before  # hosts as found
    rc, c = cli(*base(stack), "show", result.run_id)
    assert rc == 0 and "verdict interaction" in c.out


def test_an_interrupt_during_the_perf_reference_trial_puts_the_hosts_back(tmp_path, health):
    """A perf probe's first trial (the baseline, measured before the search starts) edits the hosts
    like any other trial: Ctrl-C during it restores them and releases the lock, as during any trial."""
    from envbisect.inputs.playbook import load_playbook
    from envbisect.runs.bisect import BisectOptions, BisectRun
    from envbisect.runs.deployment import Deployment
    from envbisect.state.store import Store
    from envbisect.trials.runner import TrialRunner

    perf = f'[probes.speed]\nkind = "perf"\nurl = "{health}"\n'
    stack = CliStack(tmp_path, health, FAILS_ON_BAD + perf, name="inproc-ref")
    applied: list[tuple[str, ...]] = []

    class InterruptedRunner(TrialRunner):
        def run(self, n, unit_ids, probes, purpose, stop_after=1, kind=None, *a, **kw):  # noqa: ANN001
            config = self.delta_ids(unit_ids)
            self.apply(config)  # the baseline trial's edit, journaled by the real editor
            applied.append(config)
            raise KeyboardInterrupt

        probe_running = run

    rc, c = cli(*base(stack), "snapshot", "--label", "noon")
    assert rc == 0, c.err
    stack.tree.edit("decode", DECODE + "export BAD=1\nexport OTHER=2\n")
    edited = {p.name: p.read_bytes() for p in stack.tree.conf.iterdir()}
    with Deployment(load_playbook(stack.playbook), Store(stack.store)) as dep:
        run = BisectRun(dep, BisectOptions(probe="speed"), runner_factory=InterruptedRunner)
        with pytest.raises(KeyboardInterrupt):
            run.start(dep.diff(against="noon"))
        assert applied == [()]  # the interrupt came during the reference trial, after its edit
        assert {p.name: p.read_bytes() for p in stack.tree.conf.iterdir()} == edited  # put back
        run.refuse_unrestored()  # the lock is free: nothing is left for `envbisect restore`


def test_every_trial_a_bisection_records_is_announced_first_the_refine_trials_too(stack):
    """A twin that fails only with a partner is named whole with it, and its sides are then tested
    apart (`_refine_links`): those trials are announced with trial-start like every other, so the
    progress shows each as `trial N · ...`, never a bare result line."""
    from hosttree import PREFILL

    from envbisect.inputs.playbook import load_playbook
    from envbisect.outcome import Outcome
    from envbisect.runs.bisect import BisectOptions, BisectRun
    from envbisect.runs.deployment import Deployment
    from envbisect.state.store import Store
    from envbisect.trials.probe import ProbeRun
    from envbisect.trials.runner import Trial, TrialRunner

    class OracleRunner(TrialRunner):
        def run(self, n, unit_ids, probes, purpose, stop_after=1, kind=None, *a, **kw):  # noqa: ANN001
            config = self.delta_ids(unit_ids)
            bad = {"prefill:TWIN", "decode:TWIN", "decode:BAD"} <= set(config)
            outcome = Outcome.FAIL if bad else Outcome.PASS
            runs = tuple(ProbeRun(self.probe.name, "oracle", outcome, "oracle", (), 0.01)
                         for _ in range(1 if bad else probes))
            return Trial(n, purpose, tuple(unit_ids), config, outcome, "oracle", runs, kind=kind or Trial.kind)

        probe_running = run

    rc, c = cli(*base(stack), "snapshot", "--label", "noon")
    assert rc == 0, c.err
    stack.tree.edit("decode", DECODE + "export TWIN=1\nexport BAD=1\nexport THIRD=3\n")
    stack.tree.edit("prefill", PREFILL + "export TWIN=1\n")
    events: list[tuple[str, dict]] = []
    with Deployment(load_playbook(stack.playbook), Store(stack.store)) as dep:
        run = BisectRun(dep, BisectOptions(), runner_factory=OracleRunner,
                        on_event=lambda kind, data: events.append((kind, data)))
        result = run.start(dep.diff(against="noon"))
    assert result.verdict.kind == "interaction", result.verdict
    assert set(result.culprit_deltas) == {"prefill:TWIN", "decode:TWIN", "decode:BAD"}
    refine = [t.n for t in result.trials if t.kind.value == "refine"]
    assert refine, [t.kind for t in result.trials]  # the sides were tested apart after the verdict
    started = [d["n"] for k, d in events if k == "trial-start"]
    ended = [d["trial"].n for k, d in events if k == "trial-end"]
    assert ended and all(n in started for n in ended), (started, ended)


def test_a_change_in_three_services_of_which_two_are_needed_names_those_two(stack):
    """The same change in prefill, decode and router, auto-linked; the fault needs prefill's and
    decode's sides together. Router's side is innocent: it is not named, and the explanation shows the
    trial that left it out."""
    from hosttree import PREFILL, ROUTER

    from envbisect.inputs.playbook import load_playbook
    from envbisect.outcome import Outcome
    from envbisect.runs.bisect import BisectOptions, BisectRun
    from envbisect.runs.deployment import Deployment
    from envbisect.state.store import Store
    from envbisect.trials.probe import ProbeRun
    from envbisect.trials.runner import Trial, TrialRunner

    class OracleRunner(TrialRunner):
        def run(self, n, unit_ids, probes, purpose, stop_after=1, kind=None, *a, **kw):  # noqa: ANN001
            config = self.delta_ids(unit_ids)
            bad = {"prefill:TRI", "decode:TRI"} <= set(config)
            outcome = Outcome.FAIL if bad else Outcome.PASS
            runs = tuple(ProbeRun(self.probe.name, "oracle", outcome, "oracle", (), 0.01)
                         for _ in range(1 if bad else probes))
            return Trial(n, purpose, tuple(unit_ids), config, outcome, "oracle", runs, kind=kind or Trial.kind)

        probe_running = run

    rc, c = cli(*base(stack), "snapshot", "--label", "noon")
    assert rc == 0, c.err
    stack.tree.edit("decode", DECODE + "export TRI=1\nexport OTHER=2\n")
    stack.tree.edit("prefill", PREFILL + "export TRI=1\n")
    stack.tree.edit("router", ROUTER + "export TRI=1\n")
    with Deployment(load_playbook(stack.playbook), Store(stack.store)) as dep:
        result = BisectRun(dep, BisectOptions(), runner_factory=OracleRunner).start(dep.diff(against="noon"))
    assert result.verdict.kind in ("culprit", "interaction"), result.verdict
    assert set(result.culprit_deltas) == {"prefill:TRI", "decode:TRI"}, (result.culprit_deltas, result.notes)
    assert "without router:TRI failed" in result.verdict.explanation
