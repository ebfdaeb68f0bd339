"""Issue 34 section 0 and issue 39 section 1 through the library seam: a real `BisectRun` (the real
lock, journal, records, search) over a host tree, with a TrialRunner that answers from a known truth
with real fingerprints (a hang, an HTTP 500, a router breaker's 503) instead of restarting and
probing. What only the real stack shows is in tests/test_verdict_truth_sim.py."""
from __future__ import annotations

import json

import pytest

from clistack import CliStack, health_endpoint
from hosttree import DECODE

from envbisect.outcome import Outcome
from envbisect.trials.probe import ProbeRun, RequestRecord
from envbisect.trials.runner import Trial, TrialRunner

FAILS_ON_BAD = '[probes.p]\nkind = "command"\ncommand = "! grep -q BAD {decode}"\n'
HANG = "no answer within 1.5 s (hang)"


def failing(probe: str, status: int | None, error: str, excerpt: str = "") -> ProbeRun:
    return ProbeRun(probe, "http", Outcome.FAIL, f"request: {error}", (RequestRecord(1, False, status, 0.1, error,
                                                                                    excerpt),), 0.1, "http://r/v1")


def oracle_runner(truth, running=None, asked=None):
    """A runner whose trials fail as ``truth(config)`` says: None (pass) or a ProbeRun factory."""

    class Oracle(TrialRunner):
        def run(self, n, unit_ids, probes, purpose, stop_after=1, kind=None, *a, **kw):  # noqa: ANN001
            config = self.delta_ids(unit_ids)
            if asked is not None:
                asked.append((config, purpose))
            fail = truth(set(config))
            if fail is None:
                runs = tuple(ProbeRun(self.probe.name, "http", Outcome.PASS, "ok", (), 0.01) for _ in range(probes))
                return Trial(n, purpose, tuple(unit_ids), config, Outcome.PASS, "ok", runs, kind=kind or Trial.kind)
            run = fail(self.probe.name)
            return Trial(n, purpose, tuple(unit_ids), config, Outcome.FAIL, run.reason, (run,), kind=kind or Trial.kind)

        def probe_running(self, n, unit_ids, probes, purpose, stop_after=1, kind=None, *a, **kw):  # noqa: ANN001
            if running is None:
                return self.run(n, unit_ids, probes, purpose, stop_after, kind)
            trial = self.run(n, unit_ids, probes, purpose, stop_after, kind)
            run = running(self.probe.name)
            import dataclasses
            return dataclasses.replace(trial, outcome=Outcome.FAIL, reason=run.reason, probe_runs=(run,), free=True)

    return Oracle


@pytest.fixture(scope="module")
def health():
    with health_endpoint() as url:
        yield url


@pytest.fixture
def stack(tmp_path, health):
    return CliStack(tmp_path, health, FAILS_ON_BAD, name="faults")


def bisect(stack, lines: str, runner, **opts):
    from envbisect.cli.app import run as cli_run
    from envbisect.cli.environment import Environment
    from envbisect.inputs.playbook import load_playbook
    from envbisect.runs.bisect import BisectOptions, BisectRun
    from envbisect.runs.deployment import Deployment
    from envbisect.state.store import Store
    import io

    env = Environment(stdout=io.StringIO(), stderr=io.StringIO(), stdin=io.StringIO(), width=200)
    assert cli_run(["-p", str(stack.playbook), "--store", str(stack.store), "snapshot", "--label", "noon"], env) == 0
    stack.tree.edit("decode", DECODE + lines)
    edited = {p.name: p.read_bytes() for p in stack.tree.conf.iterdir()}
    events: list[tuple[str, dict]] = []
    with Deployment(load_playbook(stack.playbook), Store(stack.store)) as dep:
        result = BisectRun(dep, BisectOptions(**opts), runner_factory=runner,
                           on_event=lambda k, d: events.append((k, d))).start(dep.diff(against="noon"))
    assert {p.name: p.read_bytes() for p in stack.tree.conf.iterdir()} == edited  # hosts as found
    return result, events


NINE = "".join(f"export K{i}={i}\n" for i in range(7)) + "export CHUNK=1\nexport RESERVED=2\n"


def test_two_independent_culprits_a_hang_masking_a_500_are_both_named_each_with_its_fingerprint(stack):
    def truth(cfg):
        if "decode:CHUNK" in cfg:
            return lambda p: failing(p, None, HANG)
        if "decode:RESERVED" in cfg:
            return lambda p: failing(p, 500, "HTTP 500, expected 200", '{"error": "reserved tokens"}')
        return None

    result, _ = bisect(stack, NINE, oracle_runner(truth))
    assert result.verdict.kind == "culprit"
    assert set(result.culprit_deltas) == {"decode:CHUNK", "decode:RESERVED"}, result.verdict.explanation
    assert not result.dependencies  # nothing passed with the pair: no "needs"
    texts = [f["text"] for f in result.faults]
    assert texts[0].startswith("`decode:CHUNK`: hang") and texts[1].startswith("`decode:RESERVED`: HTTP 500")
    assert "once the faults before it are reverted" in texts[1]
    doc = json.loads((stack.store / "runs" / result.run_id / "verdict.json").read_text())
    assert [f["culprits"] for f in doc["faults"]] == [["decode:CHUNK"], ["decode:RESERVED"]]


def test_a_breaker_503_on_the_running_stack_is_its_state_and_the_500_of_a_fresh_start_the_symptom(stack):
    """Issue 39: the free probe of the running stack answered 503 (the router's circuit breaker);
    every fresh start with TORCH_COMPILE answers 500. The loop asked the same co-restart 117 times."""
    def truth(cfg):
        if "decode:TORCH_COMPILE" in cfg:
            return lambda p: failing(p, 500, "HTTP 500, expected 200", '{"error": "compile failed"}')
        return None

    breaker = lambda p: failing(p, 503, "HTTP 503, expected 200",  # noqa: E731
                                '{"error": "No available prefill workers (all circuits open)"}')
    lines = "export TORCH_COMPILE=1\nexport A=1\nexport B=2\n"
    from envbisect.runs import bisect as bisect_mod
    free = bisect_mod.running_stack_unverified
    bisect_mod.running_stack_unverified = lambda *a, **k: None  # the running stack runs its files
    try:
        result, events = bisect(stack, lines, oracle_runner(truth, running=breaker))
    finally:
        bisect_mod.running_stack_unverified = free
    assert result.verdict.kind == "culprit" and result.culprit_deltas == ("decode:TORCH_COMPILE",)
    assert result.trials[0].free and "503" in (result.stack_state or "")
    budget = next(d["message"] for k, d in events if k == "step" and "restart budget" in d["message"])
    assert result.restarts <= int(budget.split(":")[1].split()[0])
    assert result.symptom["status"] == 500


def test_bisect_without_max_trials_shows_its_default_budget_and_keeps_to_it(stack):
    from envbisect.search import default_budget

    def truth(cfg):  # fails another way whatever is applied: no answer can teach anything
        if cfg:
            return lambda p: failing(p, 500 if len(cfg) % 2 else 502, "HTTP 5xx")
        return None

    result, events = bisect(stack, "export A=1\nexport B=2\nexport C=3\n", oracle_runner(truth))
    msgs = [d["message"] for k, d in events if k == "step"]
    assert f"restart budget: {default_budget(3)} (the default for 3 unit(s); --max-trials overrides)" in msgs
    assert result.restarts <= default_budget(3)
