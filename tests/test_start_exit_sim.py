"""Issue 34 part 1, end to end over a real sshd and the simulated PD deployment: a start command
that exits non-zero when the engine dies at start (a wrapper, `docker compose up --wait`, a
Type=notify unit) is a start failure of that configuration once the run has evidence that the
command itself works; without that evidence it stays infrastructure trouble, and the verdict says
why it cannot tell.

7 deltas: the culprit moves prefill's KV transfer backend from mooncake to nixl (requests hang);
an innocent pair: decode's SGLANG_SPECULATIVE_ALGORITHM=EAGLE cannot start without
SGLANG_SPECULATIVE_DRAFT_MODEL_PATH. The deltas are placed so that the first bisection step holds
the algorithm without its draft path (the split is forced). Both start modes of the simulator run
the same case: "detached" (bin/start exits 0, the engine dies afterwards) and "checked" (bin/start
exits 1 when the engine dies at start).
"""
from __future__ import annotations

import copy
import json

import pytest

from envbisect.report.markdown import md_text, render_markdown
from envbisect.report.record import load_run
from envbisect.sim.stack import DEFAULT_RULES
from test_bisect_sim import INNOCENT, plant, scenario, tree_fingerprint  # noqa: F401 - fixture

pytestmark = [pytest.mark.sim, pytest.mark.slow]

BACKEND = "SGLANG_DISAGGREGATION_TRANSFER_BACKEND"
CULPRIT = ("prefill", BACKEND, "nixl")
ALGORITHM = ("decode", "SGLANG_SPECULATIVE_ALGORITHM", "EAGLE")
DRAFT = ("decode", "SGLANG_SPECULATIVE_DRAFT_MODEL_PATH", "/models/eagle-draft")
RULES = copy.deepcopy(DEFAULT_RULES)
RULES["rules"] += [
    {"service": "prefill", "when": {BACKEND: "nixl"}, "fault": "hang"},
    {"service": "decode", "when": {"SGLANG_SPECULATIVE_ALGORITHM": "EAGLE", "SGLANG_SPECULATIVE_DRAFT_MODEL_PATH": None},
     "fault": "crash", "message": "speculative algorithm EAGLE needs SGLANG_SPECULATIVE_DRAFT_MODEL_PATH"},
]
SEVEN = [INNOCENT[0], CULPRIT, INNOCENT[3], ALGORITHM, DRAFT, INNOCENT[2], ("router", "RUST_BACKTRACE", "full")]


def _deployment(scenario, sshd, mode: str):  # noqa: ANN001, ANN202
    return scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config), rules=RULES, start_mode=mode,
                    env={"prefill": {BACKEND: "mooncake"}})


@pytest.mark.parametrize("mode", ["detached", "checked"])
def test_a_start_command_that_exits_non_zero_names_only_the_culprit_and_the_pair_as_a_dependency(
        scenario, sshd, mode):
    s = _deployment(scenario, sshd, mode)
    s.baseline()
    plant(s.sim, SEVEN)
    with s.deployment() as dep:
        order = [d.id for d in dep.diff(against="good").deltas]
    assert len(order) == 7
    assert order.index("decode:SGLANG_SPECULATIVE_ALGORITHM") < 4 <= order.index(
        "decode:SGLANG_SPECULATIVE_DRAFT_MODEL_PATH"), order
    before = tree_fingerprint(s.sim)
    p = s.cli("bisect", "--against", "good", "--probe", "e2e", "--json")
    doc = json.loads(p.stdout)
    trials = [(t["n"], t["purpose"], t["outcome"], t["symptom"], t["reason"]) for t in doc["trials"]]
    assert p.returncode == 0, (doc["explanation"], trials)
    assert doc["verdict"] == "culprit" and doc["culprits"] == [f"prefill:{BACKEND}"], (doc["explanation"], trials)
    starts = [t for t in doc["trials"] if t["outcome"] == "start-failure"]
    assert starts and all(t["symptom"] == "other" for t in starts), trials
    assert all("decode" in t["reason"] for t in starts), trials
    if mode == "checked":
        assert all("start command failed" in t["reason"] for t in starts), trials
        assert all("EAGLE needs SGLANG_SPECULATIVE_DRAFT_MODEL_PATH" in t["log_tail"] for t in starts)
        # the first failure of a configuration is retried before it is taken as its start failure
        unresolved = [t for t in doc["trials"] if t["outcome"] == "unresolved"]
        assert unresolved and all(t["cause"] == "restart-failed" for t in unresolved), trials
        assert all(any(u["config"] == t["config"] and u["n"] < t["n"] for u in unresolved) for t in starts), trials
    deps = doc["dependencies"]
    assert [(d["needy"], d["partners"]) for d in deps] == [(["decode:SGLANG_SPECULATIVE_ALGORITHM"],
                                                            ["decode:SGLANG_SPECULATIVE_DRAFT_MODEL_PATH"])], deps
    assert deps[0]["observed"] and "fails to start without it" in deps[0]["text"], deps
    assert doc["state_left"] == "original" and tree_fingerprint(s.sim) == before
    md = render_markdown(load_run(s.store / "runs" / doc["run"]))
    assert md_text("`decode:SGLANG_SPECULATIVE_ALGORITHM` needs `decode:SGLANG_SPECULATIVE_DRAFT_MODEL_PATH`") in md


@pytest.mark.parametrize("mode", ["detached", "checked"])
def test_when_the_first_start_of_the_run_is_the_failing_one_the_verdict_says_why_and_blames_nothing(
        scenario, sshd, mode):
    """The known-good already holds EAGLE without its draft path (decode was running from before
    the edit): the run's first co-restart, of the baseline, cannot start decode. Nothing in the run
    shows decode's start command works, so nothing is blamed, and the verdict says why."""
    s = _deployment(scenario, sshd, mode)
    # the known-good snapshot holds EAGLE without its draft path: taken from files edited by hand
    # while the running decode still had the old ones
    s.sim.set_env(*ALGORITHM)
    with s.deployment() as dep:
        dep.snapshot("good")
    plant(s.sim, [INNOCENT[0], CULPRIT, INNOCENT[3], DRAFT, INNOCENT[2], ("router", "RUST_BACKTRACE", "full")])
    before = tree_fingerprint(s.sim)
    p = s.cli("bisect", "--against", "good", "--probe", "e2e", "--json")
    doc = json.loads(p.stdout)
    trials = [(t["n"], t["purpose"], t["outcome"], t["cause"], t["reason"]) for t in doc["trials"]]
    assert doc["verdict"] == "inconclusive" and p.returncode != 0, (doc["verdict"], doc["explanation"], trials)
    assert doc["culprits"] == [] and not doc["dependencies"], doc
    assert "SGLANG_SPECULATIVE" not in doc["explanation"].split("Unresolved:")[0], doc["explanation"]
    if mode == "checked":
        assert "first start of decode in this run" in doc["explanation"], doc["explanation"]
        assert "no evidence" in doc["explanation"], doc["explanation"]
    else:
        assert "baseline failed differently" in doc["explanation"], doc["explanation"]
    assert doc["state_left"] == "original" and tree_fingerprint(s.sim) == before


def test_my_edit_and_now_decode_will_not_start_names_the_edit(scenario, sshd):  # noqa: F811
    """The most common incident, with a start command that exits non-zero: the operator's restart
    after the guilty edit already failed (decode is down, the router started by hand). Current's
    first starts are the first of decode in the run (unresolved), so the baseline runs next; it
    starts decode with the same command, current's next start is evidence, and the edit is named."""
    rules = copy.deepcopy(DEFAULT_RULES)
    rules["rules"] += [{"service": "decode", "when": {"SGLANG_ATTENTION_BACKEND": "flashmla"}, "fault": "crash",
                        "message": "flashmla kernel not built for sm120"}]
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config), rules=rules, start_mode="checked")
    s.baseline()
    plant(s.sim, [INNOCENT[0], ("decode", "SGLANG_ATTENTION_BACKEND", "flashmla"), INNOCENT[2], INNOCENT[3]],
          restart=False)
    s.sim.age_files()
    with pytest.raises(RuntimeError):
        s.sim.co_restart()  # the operator's restart: decode exits at start
    s.sim.start("router", wait=False)
    assert "decode" not in s.sim.running_pids()
    before = tree_fingerprint(s.sim)
    p = s.cli("bisect", "--against", "good", "--probe", "e2e", "--json")
    doc = json.loads(p.stdout)
    trials = [(t["n"], t["purpose"], t["outcome"], t["cause"], t["reason"][:120]) for t in doc["trials"]]
    assert p.returncode == 0, (doc["explanation"], trials)
    assert doc["verdict"] == "culprit" and doc["culprits"] == ["decode:SGLANG_ATTENTION_BACKEND"], (
        doc["explanation"], trials)
    first_base = next(t for t in doc["trials"] if t["config"] == [])
    assert first_base["outcome"] == "pass", trials
    assert all(t["outcome"] == "unresolved" for t in doc["trials"] if t["n"] < first_base["n"]), trials
    assert tree_fingerprint(s.sim) == before
    # the final restore starts every service that ran before, although decode fails before the router
    assert {"prefill", "router"} <= set(s.sim.running_pids()), s.sim.running_pids()
    assert "each service: prefill: running" in p.stderr and "router: " in p.stderr, p.stderr[-1500:]


def test_leave_fixed_keeps_the_pair_together_when_its_partner_is_the_culprit(scenario, sshd):
    """Checked start mode: the draft path itself makes decode hang (the culprit), and EAGLE needs
    it to start. `--leave fixed` takes the culprit out and EAGLE with it, and the stack it leaves
    passes."""
    rules = copy.deepcopy(RULES)
    rules["rules"].append({"service": "decode", "when": {DRAFT[1]: DRAFT[2]}, "fault": "hang"})
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config), rules=rules, start_mode="checked")
    s.baseline()
    plant(s.sim, [INNOCENT[0], ALGORITHM, INNOCENT[3], DRAFT, INNOCENT[2]])
    p = s.cli("bisect", "--against", "good", "--probe", "e2e", "--leave", "fixed", "--json")
    doc = json.loads(p.stdout)
    trials = [(t["n"], t["purpose"], t["outcome"], t["symptom"], t["reason"]) for t in doc["trials"]]
    assert p.returncode == 0 and doc["culprits"] == [f"decode:{DRAFT[1]}"], (doc["explanation"], trials)
    assert [(d["needy"], d["partners"]) for d in doc["dependencies"]] == [([f"decode:{ALGORITHM[1]}"],
                                                                          [f"decode:{DRAFT[1]}"])]
    assert doc["state_left"] == "fixed", doc["notes"]
    assert any(n.startswith(f"also left out decode:{ALGORITHM[1]}") for n in doc["notes"]), doc["notes"]
    text = s.sim.env_file("decode").read_text()
    assert ALGORITHM[1] not in text and DRAFT[1] not in text and "NCCL_IB_GID_INDEX=5" in text
    assert s.sim.is_healthy("decode")


def test_a_commit_line_step_that_cannot_start_is_judged_on_the_runs_evidence(scenario, sshd):
    """The commit line's trials (their own runners) judge a start command's exit on the bisection's
    evidence: decode's checked start command worked at the baseline, so commit 2, whose files keep
    decode from starting, is a start failure once its retry fails the same way (another failure
    than the guilty commit 5's hang: skipped), and commit 5 is named."""
    import json as _json

    from test_commits_sim import _pull_of_five

    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config), start_mode="checked")
    rules = _json.loads(s.sim.rules_path.read_text())
    src = s.sim.src_dir
    rules["rules"] += [{"service": "decode", "when_file": {"path": str(src / "VERSION"), "contains": "v2-bad"},
                        "fault": "hang"},
                       {"service": "decode", "fault": "crash", "message": "notes2 without notes3",
                        "when_file": [{"path": str(src / "notes2.txt"), "contains": None},
                                      {"path": str(src / "notes3.txt"), "exists": False}]}]
    s.sim.set_rules(rules)
    s.sim.co_restart()
    s.baseline()
    shas = _pull_of_five(s, 5)
    plant(s.sim, INNOCENT[:2], restart=False)
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="e2e")
    trials = [(t.n, t.purpose, t.outcome, t.symptom, t.reason[:100]) for t in r.trials]
    assert r.verdict.kind == "culprit", (r.verdict, trials)
    assert r.commit is not None and r.commit.commit is not None, (r.commit, r.notes, trials)
    assert r.commit.commit.sha == shas[4] and r.commit.confirmed_by is not None, r.commit.to_json()
    assert any(t.outcome == "start-failure" and t.symptom == "other" and "@" in t.config[0] for t in r.trials), trials
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before
