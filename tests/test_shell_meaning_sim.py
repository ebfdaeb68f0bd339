"""The baseline trial is the baseline (issue 7, item 3), end to end on the simulated PD deployment
(real sglang-router, workers whose faults come from the environment they were started with):
baseline values with ``${X%pat}``, ``$(...)`` and ``~`` that break the stack when written back as
literal text, a quoting-only change, and the post-apply check stopping a trial whose baseline
cannot be re-created."""
from __future__ import annotations

import copy
import hashlib
import subprocess
import uuid
from pathlib import Path

import pytest

from envbisect.runs.bisect import BisectOptions, BisectRun
from envbisect.runs.deployment import ConnectOptions, Deployment
from envbisect.errors import EnvCheckFailed
from envbisect.inputs.playbook import load_playbook
from envbisect.sim.stack import DEFAULT_RULES, build
from envbisect.state.store import Store

pytestmark = pytest.mark.sim

# Lines whose value bash computes. Written back as literal text ('${HF_HOME%/*}/kv'...) they make
# the decode worker hang (the rules below), so a "baseline" trial that re-quotes them fails.
NOON_LINES = """
# --- paths and threads (computed by the shell) ---
export HF_HOME=/data/hf
export MODEL_CACHE="${HF_HOME%/*}/cache"
export SGLANG_KV_DIR="${HF_HOME%/*}/kv"
export OMP_NUM_THREADS=$(nproc)
export SGLANG_CACHE_DIR=~/cache
export SIM_T='$HOME/t'
"""
LITERAL = {"MODEL_CACHE": "${HF_HOME%/*}/cache", "SGLANG_KV_DIR": "${HF_HOME%/*}/kv",
           "OMP_NUM_THREADS": "$(nproc)", "SGLANG_CACHE_DIR": "~/cache"}


def rules(extra: tuple[dict, ...] = ()) -> dict:
    r = copy.deepcopy(DEFAULT_RULES)
    r["rules"] += [{"service": "decode", "when": {k: v}, "fault": "hang"} for k, v in LITERAL.items()]
    r["rules"] += list(extra)
    return r


def tree_fingerprint(sim) -> dict:
    """Every byte, mode and mtime of the files envbisect may touch, and the repo HEAD/branch
    (as in tests/test_bisect_sim.py)."""
    out = {}
    for p in sorted((sim.root / "conf").rglob("*")) + sorted(sim.src_dir.rglob("*")):
        if p.is_file() and ".git" not in p.parts:
            st = p.stat()
            out[str(p)] = (hashlib.sha256(p.read_bytes()).hexdigest(), st.st_mode, st.st_uid, st.st_mtime_ns)
    git = lambda *a: subprocess.run(["git", "-C", str(sim.src_dir), *a], capture_output=True, text=True).stdout.strip()  # noqa: E731
    out["HEAD"] = (git("rev-parse", "HEAD"), git("symbolic-ref", "-q", "HEAD"))
    return out


class Sim:
    def __init__(self, root: Path, extra_decode: str, extra_rules: tuple[dict, ...] = ()):
        self.sim = build(root / "dep", rules=rules(extra_rules))
        name = "sim-" + uuid.uuid4().hex[:8]
        text = self.sim.playbook.read_text().replace('name = "sim-pd"', f'name = "{name}"')
        self.sim.playbook.write_text(text)
        self.store = root / "store"
        decode = self.sim.env_file("decode")
        decode.write_text(decode.read_text() + extra_decode)
        self.sim.start_all()

    def deployment(self) -> Deployment:
        return Deployment(load_playbook(self.sim.playbook), Store(self.store), ConnectOptions(attempts=1))

    def edit(self, service: str, old: str, new: str) -> None:
        p = self.sim.env_file(service)
        text = p.read_text()
        assert text.count(old) == 1, old
        p.write_text(text.replace(old, new))


@pytest.fixture
def make_sim(tmp_path):
    made: list[Sim] = []

    def make(extra_decode: str = NOON_LINES, extra_rules: tuple[dict, ...] = ()) -> Sim:
        s = Sim(tmp_path / f"s{len(made)}", extra_decode, extra_rules)
        made.append(s)
        return s

    yield make
    for s in made:
        s.sim.stop_all()


def test_baseline_with_shell_computed_values_is_restored_as_it_was(make_sim):
    s = make_sim()
    with s.deployment() as dep:
        dep.snapshot("good")
        # the untouched computed lines are no drift: the workers were started from this very file
        clean = dep.diff(against="good")
        assert clean.deltas == () and clean.drift == (), (clean.deltas, clean.drift)
    s.edit("decode", 'export SGLANG_KV_DIR="${HF_HOME%/*}/kv"', "export SGLANG_KV_DIR=/srv/kv")
    s.edit("decode", "export OMP_NUM_THREADS=$(nproc)", "export OMP_NUM_THREADS=8")
    s.edit("decode", "export SGLANG_CACHE_DIR=~/cache", "export SGLANG_CACHE_DIR=/var/cache/sg")
    s.edit("decode", "export SIM_T='$HOME/t'", 'export SIM_T="$HOME/t"')  # quoting only: a delta
    s.edit("decode", "export SGLANG_SM120_MMA_TARGET_CTAS=128", "export SGLANG_SM120_MMA_TARGET_CTAS=256")  # culprit
    s.edit("router", "export ROUTER_LOG_LEVEL=info", "export ROUTER_LOG_LEVEL=debug")
    s.edit("prefill", "export NCCL_SOCKET_IFNAME=eth0", 'export NCCL_SOCKET_IFNAME="eth0"')  # same meaning: no delta
    s.sim.co_restart()
    before = tree_fingerprint(s.sim)
    with s.deployment() as dep:
        diff = dep.diff(against="good")
        assert {d.id for d in diff.deltas} == {
            "decode:SGLANG_KV_DIR", "decode:OMP_NUM_THREADS", "decode:SGLANG_CACHE_DIR", "decode:SIM_T",
            "decode:SGLANG_SM120_MMA_TARGET_CTAS", "router:ROUTER_LOG_LEVEL"}
        assert diff.drift == ()
        kv = next(d for d in diff.deltas if d.key == "SGLANG_KV_DIR")
        assert (kv.old_word, kv.old_eval) == ('"${HF_HOME%/*}/kv"', "/data/kv")
        r = BisectRun(dep, BisectOptions(probe="e2e")).start(diff)
    assert r.verdict.kind == "culprit", r.verdict
    assert r.culprit_deltas == ("decode:SGLANG_SM120_MMA_TARGET_CTAS",)
    # the baseline trial ran the noon configuration, and passed
    assert any(t.config == () and t.outcome == "pass" for t in r.trials), [(t.config, t.outcome) for t in r.trials]
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before


def test_post_apply_check_stops_a_baseline_that_cannot_be_recreated(make_sim, tmp_path):
    rev = tmp_path / "rev"
    rev.write_text("r1\n")
    s = make_sim(NOON_LINES + f'export MODEL_REV="$(cat {rev})"\n')
    with s.deployment() as dep:
        dep.snapshot("good")
    s.edit("decode", f'export MODEL_REV="$(cat {rev})"', "export MODEL_REV=r3")
    s.edit("decode", "export SGLANG_SM120_MMA_TARGET_CTAS=128", "export SGLANG_SM120_MMA_TARGET_CTAS=256")
    s.sim.co_restart()
    rev.write_text("r2\n")  # what the noon line computes is not what it computed at noon
    before = tree_fingerprint(s.sim)
    events: list[tuple[str, dict]] = []
    with s.deployment() as dep:
        diff = dep.diff(against="good")
        with pytest.raises(EnvCheckFailed) as ei:
            BisectRun(dep, BisectOptions(probe="e2e"), on_event=lambda k, d: events.append((k, d))).start(diff)
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(f"node1: {s.sim.env_file('decode')}: MODEL_REV: ") and "'r2'" in msg and "'r1'" in msg
    # nothing was restarted between the edit that failed its check and the error
    last = max(i for i, (k, _d) in enumerate(events) if k == "trial-start")
    stop = next(i for i, (k, _d) in enumerate(events) if k == "interrupted" and i > last)
    steps = [d.get("message", "") for k, d in events[last:stop] if k == "step"]
    assert not any(m.startswith(("stopping", "starting")) for m in steps), steps
    # and the run restored the hosts exactly
    assert tree_fingerprint(s.sim) == before


def test_a_deleted_line_that_a_later_line_reads_is_named_as_the_culprit(make_sim):
    """red-team S05: SGLANG_DATA_ROOT deleted; the line below it builds SGLANG_KV_DIR from it, so bash
    now gives /kv and decode hangs. The baseline trial must put the line back where it stood (above
    its reader), not at the end of the file: there the "baseline" still gave /kv, failed, and the
    verdict was a false not-config."""
    root_line = "export SGLANG_DATA_ROOT=/data\n"
    s = make_sim("\n# --- data ---\n" + root_line + 'export SGLANG_KV_DIR="${SGLANG_DATA_ROOT}/kv"\n',
                 ({"service": "decode", "when": {"SGLANG_KV_DIR": "/kv"}, "fault": "hang"},))
    with s.deployment() as dep:
        dep.snapshot("good")
    s.edit("decode", root_line, "")  # the only change, and the culprit
    s.sim.age_files()
    s.sim.co_restart()
    before = tree_fingerprint(s.sim)
    with s.deployment() as dep:
        diff = dep.diff(against="good")
        assert [(d.id, d.change) for d in diff.deltas] == [("decode:SGLANG_DATA_ROOT", "removed")]
        r = BisectRun(dep, BisectOptions(probe="e2e")).start(diff)
    assert r.verdict.kind == "culprit", r.verdict
    assert r.culprit_deltas == ("decode:SGLANG_DATA_ROOT",)
    assert any(t.config == () and t.outcome == "pass" for t in r.trials), [(t.config, t.outcome) for t in r.trials]
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before
