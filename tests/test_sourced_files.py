"""Files an env file sources (`. FILE`, `source FILE`) are part of the configuration (red-team S04).

decode.serve-env sourcing conf/common.env, which [watch] does not list: the operator's breaking
edit was in common.env, the diff showed only an innocent delta, the baseline trial kept the broken
common.env and still failed, and the verdict was a false not-config with no hint that a file the
serve-env sources was never looked at. The collector now follows each env file's source lines
(hosts/agent/collect.py) and snapshots the files they name like [watch] files; what it cannot
resolve is said in a note of the diff and of a not-config verdict.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envbisect.runs.bisect import BisectOptions, BisectRun
from envbisect.sim.stack import DEFAULT_RULES
from test_bisect_sim import plant, scenario, tree_fingerprint  # noqa: F401 - scenario is a fixture

COLLECT = Path(__file__).resolve().parents[1] / "envbisect" / "hosts" / "agent" / "collect.py"


def collect(req: dict, home: Path) -> dict:
    """The real collector script, run as the agent runs it: JSON in, JSON out."""
    env = dict(os.environ, HOME=str(home))
    p = subprocess.run([sys.executable, str(COLLECT)], input=json.dumps(req).encode(), capture_output=True, env=env,
                       check=True)
    return json.loads(p.stdout)


def test_collector_resolves_source_lines(tmp_path):
    conf, other, home = tmp_path / "conf", tmp_path / "other", tmp_path / "home"
    for d in (conf, other, home):
        d.mkdir()
    (other / "a.env").write_text(f"export A=1\n. {other}/nested.env\n")
    (other / "nested.env").write_text("export N=1\n")
    (other / "b.env").write_text("export B=1\n")
    (home / "c.env").write_text("export C=1\n")
    (home / "d.env").write_text("export D=1\n")
    (conf / "rel.env").write_text("export R=1\n")
    (other / "f.env").write_text("export F=1\n")
    env = conf / "decode.serve-env"
    env.write_text("\n".join([
        "# decode.serve-env",
        "export SGLANG_X=1",
        f"CONF={other}",
        f". {other}/a.env",                     # 4: a literal path
        'source "$CONF/b.env"',                 # 5: a variable the file set before
        ". ~/c.env",                            # 6: ~
        ". ${HOME}/d.env",                      # 7: $HOME
        ". ./rel.env",                          # 8: relative: against the env file's folder
        ". $LATER/e.env",                       # 9: set only after this line: unknown here
        f". {other}/missing.env",               # 10: does not exist
        '. "$(pwd)/x.env"',                     # 11: a command substitution
        f"[ -r {other}/f.env ] && . {other}/f.env",  # 12: after &&
        f"# . {other}/commented.env",           # 13: a comment
        'echo "no . source here"',              # 14: not a source line
        f"LATER={other}",
        '. "${BASH_SOURCE%/*}/rel.env"',        # 16: red-team R06, the "next to this file" idiom
        "",
    ]))
    raw = collect({"env_files": [str(env)], "watch": [], "repos": [], "processes": []}, home)
    got = {e["line"]: e for e in raw["sourced"][str(env)] if not e.get("via")}
    assert sorted(got) == [4, 5, 6, 7, 8, 9, 10, 11, 12, 16]
    assert got[16]["path"] == f"{conf}/rel.env" and not got[16]["relative"] and not got[16].get("why")
    assert got[4]["path"] == f"{other}/a.env" and not got[4].get("why")
    assert got[5]["path"] == f"{other}/b.env" and got[5]["word"] == '"$CONF/b.env"'
    assert got[6]["path"] == f"{home}/c.env" and got[7]["path"] == f"{home}/d.env"
    assert got[8]["path"] == f"{conf}/rel.env" and got[8]["relative"]
    assert got[9]["path"] is None and "LATER" in got[9]["why"]
    assert got[10]["path"] == f"{other}/missing.env"  # watched as absent: its appearance is a delta
    assert got[11]["path"] is None and "command" in got[11]["why"]
    assert got[12]["path"] == f"{other}/f.env"
    # one level: a.env's own source line is reported, not followed
    nested = [e for e in raw["sourced"][str(env)] if e.get("via")]
    assert [(e["via"], e["line"], e["path"]) for e in nested] == [(f"{other}/a.env", 2, None)]
    # each resolved file is snapshotted and watched exactly as a [watch] path naming it would be
    for line in (4, 5, 6, 7, 8, 10, 12):
        p = got[line]["path"]
        assert raw["watched"][p] == [p]
        assert raw["files"][p]["exists"] is (line != 10)
    assert raw["files"][f"{other}/a.env"]["content_b64"]
    assert f"{other}/nested.env" not in raw["files"]


def test_collector_keeps_watching_a_file_the_baseline_sourced(tmp_path):
    """A source line removed since the baseline: the file is still snapshotted, so the diff sees
    its real state instead of a false "removed" file delta."""
    env, common = tmp_path / "decode.serve-env", tmp_path / "common.env"
    env.write_text("export X=1\n")
    common.write_text("export Y=1\n")
    raw = collect({"env_files": [str(env)], "watch": [], "repos": [], "processes": [],
                   "keep_sourced": {str(env): [str(common)]}}, tmp_path)
    assert raw["watched"][str(common)] == [str(common)] and raw["files"][str(common)]["exists"]
    assert [e["line"] for e in raw["sourced"][str(env)]] == [None]


def _sources_common(sim, line: str, content: str):
    common = sim.root / "conf" / "common.env"
    common.write_text(content)
    f = sim.env_file("decode")
    f.write_text(f.read_text() + line + "\n")
    return common


RULES = {**DEFAULT_RULES, "rules": DEFAULT_RULES["rules"] + [
    {"service": "decode", "when": {"SGLANG_MOE_RUNNER": "cutlass"}, "fault": "hang"}]}


@pytest.mark.sim
def test_culprit_in_a_sourced_file_is_found_and_put_back(scenario):  # noqa: F811
    s = scenario(rules=RULES)
    s.sim.stop_all()
    # sourced through a variable the env file sets before the line
    common = _sources_common(s.sim, f'SIM_CONF={s.sim.root / "conf"}\n. "$SIM_CONF/common.env"',
                             "export SGLANG_MOE_RUNNER=triton\n")
    s.sim.age_files()
    s.sim.start_all()
    s.baseline()
    common.write_text("export SGLANG_MOE_RUNNER=cutlass\n")  # the culprit
    plant(s.sim, [("prefill", "NCCL_DEBUG", "INFO"), ("decode", "NCCL_IB_GID_INDEX", "5")])
    before = tree_fingerprint(s.sim)
    with s.deployment() as dep:
        diff = dep.diff(against="good")
        cid = f"file:{next(iter(dep.playbook.hosts))}:{common}"
        assert {d.id for d in diff.deltas} == {"prefill:NCCL_DEBUG", "decode:NCCL_IB_GID_INDEX", cid}
        assert not [n for n in diff.notes if "common.env" in n], diff.notes
        r = BisectRun(dep, BisectOptions(probe="e2e")).start(diff)
    assert r.verdict.kind == "culprit", r.verdict
    assert r.culprit_deltas == (cid,)
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before


@pytest.mark.sim
def test_a_sourced_file_it_cannot_see_makes_the_verdict_inconclusive(scenario):  # noqa: F811
    """Red-team W2: the guilty value sat in a file sourced through a variable of the start script; the
    baseline trial kept it and failed, and the verdict was a false not-config. A file envbisect cannot
    see may have stayed: the baseline was not reproduced, so the verdict is inconclusive, naming it."""
    s = scenario(rules=RULES)
    s.sim.stop_all()
    # $ROOT is a variable of the start script (bin/start), not of the env file: envbisect cannot know it
    common = _sources_common(s.sim, '. "$ROOT/conf/common.env"', "export SGLANG_MOE_RUNNER=triton\n")
    s.sim.age_files()
    s.sim.start_all()
    s.baseline()
    common.write_text("export SGLANG_MOE_RUNNER=cutlass\n")
    plant(s.sim, [("prefill", "NCCL_DEBUG", "INFO")])
    before = tree_fingerprint(s.sim)
    p = s.cli("diff", "--against", "good", "--json")
    doc = json.loads(p.stdout)
    want = 'decode.serve-env sources "$ROOT/conf/common.env"'
    assert [d["id"] for d in doc["deltas"]] == ["prefill:NCCL_DEBUG"]
    assert any(want in n and "which envbisect cannot see: add it to [watch] paths" in n for n in doc["notes"]), doc
    p = s.cli("bisect", "--against", "good", "--probe", "e2e", "--json")
    doc = json.loads(p.stdout)
    assert doc["verdict"] == "inconclusive", doc
    assert p.returncode != 0
    problems = [x for v in doc.values() if isinstance(v, dict) for x in v.get("problems") or ()]
    assert any(want in x and "cannot see" in x for x in problems), doc  # the proof names what stayed
    # the library's verdict carries it, not only the CLI's output: the run's record has it too
    record = (s.store / "runs" / doc["run"] / "verdict.json").read_text()
    assert json.dumps(want)[1:-1] in record and "cannot see" in record, record
    assert tree_fingerprint(s.sim) == before


@pytest.mark.sim
def test_a_source_line_added_since_the_baseline_makes_the_env_file_one_delta(scenario):  # noqa: F811
    """Adding `. common.env` to decode.serve-env is no assignment: per-key deltas would keep the
    line in the baseline trial (a false not-config). The env file is compared as a whole file."""
    s = scenario(rules=RULES)
    common = s.sim.root / "conf" / "common.env"
    common.write_text("export SGLANG_MOE_RUNNER=cutlass\n")
    s.baseline()
    f = s.sim.env_file("decode")
    f.write_text(f.read_text() + f". {common}\n")  # the culprit: the line that sources the bad value
    plant(s.sim, [("prefill", "NCCL_DEBUG", "INFO")])
    before = tree_fingerprint(s.sim)
    with s.deployment() as dep:
        diff = dep.diff(against="good")
        assert any("source lines changed" in n and "whole file" in n for n in diff.notes), diff.notes
        want = f"file:{next(iter(dep.playbook.hosts))}:{f}"
        r = BisectRun(dep, BisectOptions(probe="e2e")).start(diff)
    assert r.verdict.kind == "culprit", r.verdict
    assert r.culprit_deltas == (want,), r.culprit_deltas
    assert r.state_left == "original" and tree_fingerprint(s.sim) == before


def test_notes_of_a_snapshot_pair():
    """sourced_notes alone: what cannot be seen, a relative guess, a baseline that did not look."""
    from envbisect.state.snapshot import FileState, HostState, Snapshot, SourcedFile
    from envbisect.state.sourced import sourced_notes

    def snap(sid, sourced, files):
        h = HostState("h", "h", 0.0, None, 0, files, {}, {}, {"decode": "/c/decode.serve-env"}, {}, None, sourced)
        return Snapshot(sid, None, 0.0, "p", {"h": h})

    env = "/c/decode.serve-env"
    cur = snap("cur", {env: (SourcedFile(3, "$X/a.env", None, "X is not set by the file before line 3"),
                             SourcedFile(4, "b.env", "/c/b.env", relative=True),
                             SourcedFile(5, "/d/new.env", "/d/new.env"))},
               {"/c/b.env": FileState("/c/b.env", True), "/d/new.env": FileState("/d/new.env", True)})
    base = snap("base", {env: (SourcedFile(4, "b.env", "/c/b.env", relative=True),)},
                {"/c/b.env": FileState("/c/b.env", True)})
    notes = sourced_notes(cur, base)
    assert any(n.startswith("h:/c/decode.serve-env sources $X/a.env") and "cannot see" in n for n in notes), notes
    assert any("b.env" in n and "working directory" in n for n in notes), notes
    assert any("/d/new.env" in n and "base" in n and "did not look" in n for n in notes), notes
    assert any("source lines" in n and "/d/new.env" in n for n in notes), notes
