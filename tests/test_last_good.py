"""An observed known-good: `snapshot --probe P` probes the running stack (no edit, no restart) and
records pass or fail in the snapshot; `snapshots` shows it; `diff`/`bisect --since last-good` picks
the newest snapshot whose probe passed and says which. In-process over the CLI stack of
tests/clistack.py (a command probe that fails while decode's env file holds BAD), and end to end
over the real sshd and the simulated PD deployment (the e2e HTTP probe through the real router)."""
from __future__ import annotations

import json

import pytest

from hosttree import DECODE
from test_cli_inprocess import FAILS_ON_BAD, base, cli, health, stack  # noqa: F401 - fixtures

from envbisect.errors import ExitStatus
from envbisect.inputs.timespec import TimeSpecError, is_last_good, parse_time
from envbisect.state.snapshot import ObservedProbe
from envbisect.state.store import Store


def test_last_good_is_a_since_form_and_never_a_time():
    from datetime import datetime, timezone

    assert is_last_good("last-good") and is_last_good(" Last_Good ") and not is_last_good("noon")
    with pytest.raises(TimeSpecError, match="names a snapshot"):
        parse_time("last-good", datetime.now(timezone.utc))


def test_snapshot_probe_pass_then_fail_and_last_good_skips_the_failed_one(stack):
    b = base(stack)
    rc, c = cli(*b, "snapshot", "--label", "old")  # a snapshot without a probe, as before
    assert rc == ExitStatus.OK, c.err
    raw = next((stack.store / "snapshots").glob("*-old.json")).read_text()
    assert '"probe"' not in raw  # written as it always was

    rc, c = cli(*b, "snapshot", "--label", "good", "--probe", "p")
    assert rc == ExitStatus.OK, c.err
    assert "probe p on the running stack: PASS" in c.out
    good = next(s for s in Store(stack.store).list() if s.label == "good")
    assert good.probe is not None and good.probe.passed and good.probe.runs == 1

    stack.tree.edit("decode", DECODE + "export BAD=1\n")
    rc, c = cli(*b, "snapshot", "--label", "bad", "--probe", "p", "--json")
    assert rc == ExitStatus.DELTAS, c.err  # the snapshot is saved, the probe did not pass
    doc = json.loads(c.out)
    assert doc["probe"]["outcome"] == "fail" and doc["probe"]["name"] == "p"

    rc, c = cli(*b, "snapshots")
    assert rc == ExitStatus.OK
    lines = {label: next(ln for ln in c.out.splitlines() if f"-{label} " in ln) for label in ("old", "good", "bad")}
    assert "p pass" in lines["good"] and "p FAIL" in lines["bad"], c.out
    assert lines["old"].rstrip(" │").endswith("-"), c.out
    rc, c = cli(*b, "snapshots", "--json")
    probes = {r["label"]: r["probe"] for r in json.loads(c.out)}
    assert probes["old"] is None and probes["good"]["outcome"] == "pass" and probes["bad"]["outcome"] == "fail"

    rc, c = cli(*b, "diff", "--since", "last-good")
    assert rc == ExitStatus.DELTAS, c.err
    first = c.out.splitlines()[0]
    assert first.startswith(f"last-good: snapshot {good.id}, the newest whose probe passed") and "1 newer" in first
    assert "+ BAD=1" in c.out
    rc, c = cli(*b, "diff", "--since", "last-good", "--json")
    doc = json.loads(c.out)
    assert doc["last_good"]["snapshot"] == good.id and doc["baseline"]["snapshot"] == good.id
    assert doc["last_good"]["skipped_failed"] == 1

    rc, c = cli(*b, "bisect", "--since", "last-good", "--json")
    assert rc == ExitStatus.OK, c.err
    doc = json.loads(c.out)
    assert doc["verdict"] == "culprit" and doc["culprits"] == ["decode:BAD"]
    assert doc["last_good"]["snapshot"] == good.id
    assert f"last-good: snapshot {good.id}" in c.err  # the human line, beside the progress


def test_no_snapshot_passed_is_one_line_and_exit_2(stack):
    b = base(stack)
    rc, c = cli(*b, "diff", "--since", "last-good")
    assert rc == ExitStatus.USAGE and c.out == "" and c.err.count("\n") == 1
    assert "no snapshot whose probe passed" in c.err and "snapshot --probe" in c.err
    stack.tree.edit("decode", DECODE + "export BAD=1\n")
    assert cli(*b, "snapshot", "--probe", "p")[0] == ExitStatus.DELTAS
    rc, c = cli(*b, "bisect", "--since", "last-good")
    assert rc == ExitStatus.USAGE and c.err.count("\n") == 1 and "1 probed, none passed" in c.err, c.err
    rc, c = cli(*b, "snapshot", "--probe", "nosuch")
    assert rc == ExitStatus.USAGE and "no probe 'nosuch'" in c.err and c.err.count("\n") == 1


def test_schedule_probe_is_in_the_scheduled_command(stack):
    rc, c = cli(*base(stack), "schedule", "--every", "15m", "--probe", "p", "--cron", "--json")
    assert rc == ExitStatus.OK, c.err
    cmd = json.loads(c.out)["command"]
    assert cmd[-5:] == ["snapshot", "--label", "auto", "--probe", "p"]
    rc, c = cli(*base(stack), "schedule", "--every", "15m", "--probe", "p", "--cron")
    assert "--probe p" in c.out and "after a deploy, from its hook:" in c.out
    assert "snapshot --label deploy-" in c.out and "--probe p snapshot" not in c.out
    rc, c = cli(*base(stack), "schedule", "--every", "15m", "--probe", "nosuch", "--cron")
    assert rc == ExitStatus.USAGE and "--probe nosuch" in c.err


def test_an_observed_probe_reads_back_and_a_perf_one_keeps_its_figures(tmp_path):
    p = ObservedProbe("tput", "perf", "pass", "3 samples", 1.0, runs=3, passes=3, metric="output_tokens_per_s",
                      values=(10.0, 12.0, 11.0))
    assert ObservedProbe.from_json(json.loads(json.dumps(p.to_json()))) == p
    assert p.median == 11.0 and p.summary() == "tput pass (median 11)"


# --- end to end: the real sshd, the simulated deployment, the real router --------------------------

@pytest.mark.sim
def test_sim_snapshot_probe_pass_and_fail_and_bisect_since_last_good(sshd, tmp_path):
    from test_bisect_sim import INNOCENT, Scenario, plant

    s = Scenario(tmp_path / "s", ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    try:
        # a perf probe on the running stack: its figures are kept (no reference here to judge them by)
        r = s.cli("snapshot", "--label", "auto", "--probe", "throughput", "--json", timeout=300)
        assert r.returncode == 0, r.stderr
        perf = json.loads(r.stdout)["probe"]
        assert perf["outcome"] == "pass" and perf["metric"] == "output_tokens_per_s", perf
        assert len(perf["values"]) >= 3 and perf["median"] > 0 and perf["runs"] == len(perf["values"])
        r = s.cli("snapshot", "--label", "auto", "--probe", "e2e", "--json", timeout=120)
        assert r.returncode == 0, r.stderr
        good = json.loads(r.stdout)
        assert good["probe"]["outcome"] == "pass" and good["probe"]["unverified"] is None, good["probe"]
        plant(s.sim, INNOCENT[:2] + [("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")])
        r = s.cli("snapshot", "--label", "auto", "--probe", "e2e", timeout=120)
        assert r.returncode == 1 and "probe e2e on the running stack: FAIL" in r.stdout, r.stdout + r.stderr
        r = s.cli("snapshots", "--json")
        outcomes = [x["probe"]["outcome"] for x in json.loads(r.stdout)]
        assert outcomes == ["pass", "pass", "fail"]
        r = s.cli("bisect", "--since", "last-good", "--probe", "e2e", "--json", timeout=300)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["last_good"]["snapshot"] == good["id"] and doc["last_good"]["skipped_failed"] == 1
        assert doc["verdict"] == "culprit" and doc["culprits"] == ["decode:SGLANG_SM120_MMA_TARGET_CTAS"]
        # the premise stays: the baseline was observed again in this run, not taken from the snapshot
        assert any(t["kind"] == "premise-baseline" and t["outcome"] == "pass" for t in doc["trials"]), doc["trials"]
    finally:
        s.sim.stop_all()


def test_prune_keeps_the_newest_snapshot_whose_probe_passed(stack):
    """A stack failing for longer than --keep must not lose its last-good to `prune`."""
    import os

    b = base(stack)
    assert cli(*b, "snapshot", "--label", "auto", "--probe", "p")[0] == ExitStatus.OK
    stack.tree.edit("decode", DECODE + "export BAD=1\n")
    assert cli(*b, "snapshot", "--label", "auto", "--probe", "p")[0] == ExitStatus.DELTAS
    assert cli(*b, "snapshot", "--label", "auto", "--probe", "p")[0] == ExitStatus.DELTAS
    good = next(s for s in Store(stack.store).list() if s.probe and s.probe.passed)
    # all three are older than --keep (their taken_at moved 30 days back)
    for p in (stack.store / "snapshots").glob("*.json"):
        doc = json.loads(p.read_text())
        doc["taken_at"] -= 30 * 86400
        p.write_text(json.dumps(doc))
    rc, c = cli(*b, "prune", "--keep", "14d", "--json")
    assert rc == ExitStatus.OK, c.err
    kept = {e["id"]: e["kept_because"] for e in json.loads(c.out)["snapshots"]["kept"]}
    assert good.id in kept and kept[good.id] == ["newest whose probe passed (--since last-good)"], kept
    assert len(json.loads(c.out)["snapshots"]["deleted"]) == 1  # the older failing one
    rc, c = cli(*b, "diff", "--since", "last-good", "--json")
    assert rc == ExitStatus.DELTAS and json.loads(c.out)["last_good"]["snapshot"] == good.id
    assert os.path.exists(stack.store / "snapshots" / f"{good.id}.json")
