"""The baseline trial is the baseline (issue 7, item 3), without the simulated stack: deltas by shell
meaning, drift against what bash makes of the file on the host, exact shell text written back, and
the post-apply check of HostEditor.apply. Real files, real bash, real processes, `ssh = "local"`."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from envbisect.state.configuration import target_state
from envbisect.runs.deployment import ConnectOptions, Deployment
from envbisect.errors import EnvCheckFailed, UsageError
from envbisect.inputs.envfile import parse_env
from envbisect.hosts.journal import HostEditor
from envbisect.inputs.playbook import load_playbook
from envbisect.state.store import Store, snapshot_from_json, snapshot_to_json

from hosttree import DECODE, make_tree

ENVBISECT = [sys.executable, "-m", "envbisect.cli.app"]
pytestmark = pytest.mark.skipif(not shutil.which("bash"), reason="bash missing")

NOON = DECODE + """\
export HF_HOME=/data/hf
export MODEL_CACHE="${HF_HOME%/*}/cache"
export KV_DIR="${HF_HOME%/*}/kv"
export WORKERS=$(nproc)
export SCRATCH=~/scratch
export TARGET_CTAS=512
export T='$HOME/t'
"""


def open_dep(tree, store, **kw) -> Deployment:
    return Deployment(load_playbook(tree.playbook("local", pid_files=True, name=tree.name, **kw)), Store(store),
                      ConnectOptions(attempts=1))


def start_from_file(tree, service: str, home: str = "/home/op", extra: dict | None = None) -> subprocess.Popen:
    """A process started the way a start script does it: a clean environment, `set -a; . FILE`."""
    env = {"PATH": os.environ["PATH"], "HOME": home, **(extra or {})}
    proc = subprocess.Popen(["bash", "-c", 'set -a; . "$1"; set +a; exec sleep 120', "start", str(tree.env(service))],
                            env=env, cwd="/")
    (tree.root / "run" / f"{service}.pid").write_text(f"{proc.pid}\n")
    for _ in range(100):  # until exec'd (its environ is then the sourced one)
        try:
            if "sleep" in open(f"/proc/{proc.pid}/cmdline").read():
                break
        except OSError:
            pass
        time.sleep(0.02)
    return proc


@pytest.fixture
def tree(tmp_path):
    t = make_tree(tmp_path / "host", n_watched=2)
    t.edit("decode", NOON)
    procs: list[subprocess.Popen] = []
    t.procs = procs
    t.name = "sm-" + uuid.uuid4().hex[:8]  # the lock and host journal (~/.envbisect) are per deployment name
    yield t
    for p in procs:
        p.kill()
        p.wait()


def test_untouched_expansion_is_not_drift_and_snapshot_records_what_bash_made(tree, tmp_path):
    tree.procs.append(start_from_file(tree, "decode"))
    with open_dep(tree, tmp_path / "store") as dep:
        snap = dep.snapshot("noon")
        assert dep.round_trips() == {"node1": 1}  # the evaluation is in the same round trip
        diff = dep.diff(against="noon")
    ps = snap.hosts["node1"].processes["decode"]
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    assert ps.file_eval["MODEL_CACHE"] == "/data/cache" and ps.file_eval["KV_DIR"] == "/data/kv"
    assert ps.file_eval["WORKERS"] == nproc and ps.file_eval["SCRATCH"] == "/home/op/scratch"
    assert ps.file_eval["T"] == "$HOME/t"
    assert ps.file_eval_sha256 == snap.hosts["node1"].files[str(tree.env("decode"))].sha256
    # the file's text `${HF_HOME%/*}/cache` against the process's /data/cache is no drift
    assert diff.deltas == () and diff.drift == ()


def test_drift_shows_the_text_and_the_value(tree, tmp_path):
    tree.procs.append(start_from_file(tree, "decode"))
    with open_dep(tree, tmp_path / "store") as dep:
        dep.snapshot("noon")
        # edited after the process started, never restarted: the process still has /data/cache
        tree.edit("decode", NOON.replace("HF_HOME=/data/hf", "HF_HOME=/srv/hf"))
        diff = dep.diff(against="noon")
        masker = dep.masker
    drift = {d.key: d for d in diff.drift}
    assert set(drift) == {"HF_HOME", "MODEL_CACHE", "KV_DIR"}
    mc = drift["MODEL_CACHE"]
    assert (mc.file_value, mc.process_value, mc.file_text, mc.evaluated) == (
        "/srv/cache", "/data/cache", '"${HF_HOME%/*}/cache"', True)
    assert mc.shown(masker) == '"${HF_HOME%/*}/cache"  (= /srv/cache)'
    j = mc.to_json(masker)
    assert (j["file"], j["file_text"], j["process"]) == ("/srv/cache", '"${HF_HOME%/*}/cache"', "/data/cache")
    assert drift["HF_HOME"].shown(masker) == "/srv/hf"  # a plain literal: the value alone


def test_quoting_changes_by_meaning_cli_json_and_human(tree, tmp_path):
    pb = tree.playbook("local", pid_files=True, name=tree.name)
    base = [*ENVBISECT, "-p", str(pb), "--store", str(tmp_path / "store")]
    r = subprocess.run(base + ["snapshot", "--label", "noon"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = (NOON.replace("export TARGET_CTAS=512", 'export TARGET_CTAS="512"')  # same meaning: no delta
            .replace("export T='$HOME/t'", 'export T="$HOME/t"')  # quoting only, other meaning: a delta
            .replace('export KV_DIR="${HF_HOME%/*}/kv"', "export KV_DIR='${HF_HOME%/*}/kv'"))
    tree.edit("decode", text)
    r = subprocess.run(base + ["diff", "--against", "noon", "--json"], capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    got = {d["id"]: d for d in doc["deltas"]}
    assert set(got) == {"decode:T", "decode:KV_DIR"}
    t = got["decode:T"]
    assert (t["old"], t["new"], t["old_word"], t["new_word"]) == ("$HOME/t", "$HOME/t", "'$HOME/t'", '"$HOME/t"')
    kv = got["decode:KV_DIR"]
    assert (kv["old_word"], kv["new_word"]) == ('"${HF_HOME%/*}/kv"', "'${HF_HOME%/*}/kv'")
    r = subprocess.run(base + ["diff", "--against", "noon"], capture_output=True, text=True)
    assert r.returncode == 1
    assert "~ T '$HOME/t' → \"$HOME/t\"" in r.stdout, r.stdout
    assert "TARGET_CTAS" not in r.stdout


def test_delta_words_and_evaluations_and_secrets_masked(tree, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("hf_QWERTYUIOPASDFGHJKLZXCVBNM012345\n")
    tree.edit("decode", NOON + f'export HF_TOKEN="$(cat {token_file})"\n')
    tree.procs.append(start_from_file(tree, "decode"))
    with open_dep(tree, tmp_path / "store") as dep:
        dep.snapshot("noon")
        tree.edit("decode", NOON.replace('KV_DIR="${HF_HOME%/*}/kv"', "KV_DIR=/tmp/kv")
                  + "export HF_TOKEN=hf_ZYXWVUTSRQPONMLKJIHGFEDCBA987\n")
        diff = dep.diff(against="noon")
        masker = dep.masker
    got = {d.id: d for d in diff.deltas}
    kv = got["decode:KV_DIR"]
    assert (kv.old_word, kv.new_word, kv.old_eval, kv.new_eval) == ('"${HF_HOME%/*}/kv"', "/tmp/kv", "/data/kv", "/tmp/kv")
    assert kv.word("old") == '"${HF_HOME%/*}/kv"'
    assert kv.start_env is not None and kv.start_env["HOME"] == "/home/op" and "KV_DIR" not in kv.start_env
    assert kv.shown("old", masker) == '"${HF_HOME%/*}/kv"  (= /data/kv)'
    tok = got["decode:HF_TOKEN"]
    assert tok.old_eval == "hf_QWERTYUIOPASDFGHJKLZXCVBNM012345"
    text = json.dumps(diff.to_json(masker))
    assert "hf_QWERTY" not in text and "hf_ZYXW" not in text


def test_old_snapshots_without_evaluation_still_load_and_fall_back(tree, tmp_path):
    tree.procs.append(start_from_file(tree, "decode"))
    with open_dep(tree, tmp_path / "store") as dep:
        snap = dep.snapshot("noon", save=False)
    store = Store(tmp_path / "store2")
    doc = snapshot_to_json(snap, store.put_blob)
    for p in doc["hosts"]["node1"]["processes"].values():
        for k in ("file_eval", "file_eval_keys", "file_eval_sha256", "file_eval_error"):
            p.pop(k, None)
    old = snapshot_from_json(json.loads(json.dumps(doc)), store.get_blob)
    ps = old.hosts["node1"].processes["decode"]
    assert ps.file_eval is None and ps.status == "ok"
    from envbisect.state.deltas import compute_diff

    diff = compute_diff(old, None, since=None)
    # envbisect's own reading cannot compute ${X%pat}: without the host's evaluation that is drift
    assert {d.key for d in diff.drift} == {"MODEL_CACHE", "KV_DIR", "WORKERS"}
    assert not any(d.evaluated for d in diff.drift)


# ------------------------------------------------------------------------ trials and the check

def _edit_and_diff(tree, tmp_path, **proc_kw):
    tree.procs.append(start_from_file(tree, "decode", **proc_kw))
    dep = open_dep(tree, tmp_path / "store")
    dep.__enter__()
    dep.snapshot("noon")
    tonight = (NOON.replace('KV_DIR="${HF_HOME%/*}/kv"', "KV_DIR=/tmp/kv").replace("WORKERS=$(nproc)", "WORKERS=4")
               .replace("SCRATCH=~/scratch", "SCRATCH=/scratch").replace("TARGET_CTAS=512", "TARGET_CTAS=256"))
    tree.edit("decode", tonight)
    return dep, dep.diff(against="noon"), tonight


def test_baseline_trial_writes_the_exact_noon_text_and_the_check_passes(tree, tmp_path):
    dep, diff, tonight = _edit_and_diff(tree, tmp_path)
    try:
        assert {d.id for d in diff.deltas} == {"decode:KV_DIR", "decode:WORKERS", "decode:SCRATCH", "decode:TARGET_CTAS"}
        ed = HostEditor(dep.playbook, dep.transports, tmp_path / "run", "run-1")
        ed.lock()
        orig = ed.begin({("node1", str(tree.env("decode")))}, set())
        base = target_state(orig, diff.deltas, set(), diff.contents)
        assert base.files[("node1", str(tree.env("decode")))] == NOON.encode()
        chk = base.checks[("node1", str(tree.env("decode")))]
        assert {e.key: e.value for e in chk.expect}["KV_DIR"] == "/data/kv"
        ed.apply(base)  # the host's bash agrees: no error
        assert tree.env("decode").read_text() == NOON
        # a mixed trial: only TARGET_CTAS new
        mixed = target_state(orig, diff.deltas, {"decode:TARGET_CTAS"}, diff.contents)
        ed.apply(mixed)
        assert tree.env("decode").read_text() == NOON.replace("TARGET_CTAS=512", "TARGET_CTAS=256")
        ed.restore()
        assert tree.env("decode").read_text() == tonight
        ed.finish()
        ed.unlock()
    finally:
        dep.__exit__(None, None, None)


def test_check_skips_a_key_that_reads_a_delta_on_the_other_side(tree, tmp_path):
    tree.procs.append(start_from_file(tree, "decode"))
    with open_dep(tree, tmp_path / "store") as dep:
        dep.snapshot("noon")
        tree.edit("decode", NOON.replace("HF_HOME=/data/hf", "HF_HOME=/srv/hf")
                  .replace('KV_DIR="${HF_HOME%/*}/kv"', 'KV_DIR="${HF_HOME%/*}/kv2"'))
        diff = dep.diff(against="noon")
        ed = HostEditor(dep.playbook, dep.transports, tmp_path / "run", "run-1")
        ed.lock()
        try:
            orig = ed.begin({("node1", str(tree.env("decode")))}, set())
            t = target_state(orig, diff.deltas, {"decode:HF_HOME"}, diff.contents)
            chk = t.checks[("node1", str(tree.env("decode")))]
            assert [e.key for e in chk.expect] == ["HF_HOME"]
            assert "reads HF_HOME" in chk.skipped["KV_DIR"]
            ed.apply(t)
            ed.restore()
            ed.finish()
        finally:
            ed.unlock()


def test_post_apply_check_catches_a_baseline_that_cannot_be_recreated(tree, tmp_path):
    """The noon value came from a file outside the env file; it changed since. Writing the noon text
    back would not give the noon configuration: one clear error, before anything is restarted."""
    rev = tmp_path / "rev"
    rev.write_text("r1\n")
    tree.edit("decode", NOON + f'export MODEL_REV="$(cat {rev})"\n')
    tree.procs.append(start_from_file(tree, "decode"))
    with open_dep(tree, tmp_path / "store") as dep:
        dep.snapshot("noon")
        tree.edit("decode", NOON + "export MODEL_REV=r3\n")
        rev.write_text("r2\n")
        diff = dep.diff(against="noon")
        (d,) = diff.deltas
        assert (d.id, d.old_word, d.old_eval) == ("decode:MODEL_REV", f'"$(cat {rev})"', "r1")
        ed = HostEditor(dep.playbook, dep.transports, tmp_path / "run", "run-1")
        ed.lock()
        try:
            orig = ed.begin({("node1", str(tree.env("decode")))}, set())
            with pytest.raises(EnvCheckFailed) as ei:
                ed.apply(target_state(orig, diff.deltas, set(), diff.contents))
            msg = str(ei.value)
            assert "\n" not in msg and isinstance(ei.value, UsageError)
            assert msg.startswith(f"node1: {tree.env('decode')}: MODEL_REV: ")
            assert "'r2'" in msg and "'r1'" in msg and "nothing was restarted" in msg
            # the new side is checked too, and passes
            ed.apply(target_state(orig, diff.deltas, {"decode:MODEL_REV"}, diff.contents))
            ed.restore()
            ed.finish()
        finally:
            ed.unlock()


def test_check_masks_secrets_and_uses_the_reference_text_when_nothing_was_recorded(tree, tmp_path):
    tok = tmp_path / "tok"
    tok.write_text("hf_AAAABBBBCCCCDDDDEEEEFFFFGGGG1234\n")
    # no process: nothing recorded (old_eval None), so the expectation is the reference text
    tree.edit("decode", NOON + f'export HF_TOKEN="$(cat {tok})"\n')
    with open_dep(tree, tmp_path / "store") as dep:
        dep.snapshot("noon")
        tree.edit("decode", NOON + "export HF_TOKEN=hf_ZZZZYYYYXXXXWWWWVVVVUUUUTTTT9876\n")
        diff = dep.diff(against="noon")
        (d,) = [x for x in diff.deltas if x.key == "HF_TOKEN"]
        assert d.old_eval is None and d.start_env is None
        ed = HostEditor(dep.playbook, dep.transports, tmp_path / "run", "run-1")
        ed.lock()
        try:
            orig = ed.begin({("node1", str(tree.env("decode")))}, set())
            t = target_state(orig, diff.deltas, set(), diff.contents)
            (e,) = t.checks[("node1", str(tree.env("decode")))].expect
            assert (e.key, e.ref) == ("HF_TOKEN", "old")
            ed.apply(t)  # the reference text gives the same: passes
            # now make the recorded expectation wrong: the error must not show either token
            from dataclasses import replace

            bad = [replace(d, old_eval="hf_AAAABBBBCCCCDDDDEEEEFFFFGGGG0000")]
            ed.apply(target_state(orig, bad, {"decode:HF_TOKEN"}, diff.contents))
            with pytest.raises(EnvCheckFailed) as ei:
                ed.apply(target_state(orig, bad, set(), diff.contents))
            assert "hf_AAAA" not in str(ei.value) and "HF_TOKEN" in str(ei.value)
            ed.restore()
            ed.finish()
        finally:
            ed.unlock()


def test_revert_tells_the_sides_of_a_quoting_only_change_apart():
    from envbisect.state.configuration import FileOriginal, OriginalState
    from envbisect.state.deltas import Delta
    from envbisect.runs.revert import applied_now

    d = Delta("decode:T", "env", "h", "decode", "/e", "T", "changed", "$HOME/t", "$HOME/t", "snapshot:x",
              old_word="'$HOME/t'", new_word='"$HOME/t"')
    state = lambda text: applied_now(OriginalState({("h", "/e"): FileOriginal(True, text)}, {}), [d])[d.id]  # noqa: E731
    assert state(b'export T="$HOME/t"\n') is True
    assert state(b"export T=$HOME/t\n") is True  # the same meaning
    assert state(b"export T='$HOME/t'\n") is False
    assert state(b"export T=\\$HOME/t\n") is False  # the same meaning as the old side
    assert state(b"export T=/x\n") is None


def test_human_diff_shows_the_text_and_what_bash_made_of_it(tree, tmp_path):
    """issue 7 item 3: where a value's shell text and its value differ, `diff` (for people) shows
    both: TEXT  (= VALUE)."""
    tree.procs.append(start_from_file(tree, "decode"))
    pb = tree.playbook("local", pid_files=True, name=tree.name)
    base = [*ENVBISECT, "-p", str(pb), "--store", str(tmp_path / "store")]
    r = subprocess.run(base + ["snapshot", "--label", "noon"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    tree.edit("decode", NOON.replace('KV_DIR="${HF_HOME%/*}/kv"', "KV_DIR=/tmp/kv"))
    r = subprocess.run(base + ["diff", "--against", "noon"], capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    assert '~ KV_DIR "${HF_HOME%/*}/kv"  (= /data/kv) → /tmp/kv' in r.stdout, r.stdout


# --------------------------------------- a removed line goes back where it stood (red-team S05)

# The operator deleted SGLANG_DATA_ROOT; a later line reads it, so bash now gives SGLANG_KV_DIR=/kv.
S05_BASELINE = """\
# decode.serve-env -- sourced by bin/start decode (set -a; . FILE; set +a)
export SGLANG_KV_PAGE_SIZE=64

# --- kernels ---
export SGLANG_DATA_ROOT=/data   # the shared volume
export SGLANG_KV_DIR="${SGLANG_DATA_ROOT}/kv"
export SGLANG_SM120_MMA_TARGET_CTAS=128
"""
S05_CURRENT = S05_BASELINE.replace("export SGLANG_DATA_ROOT=/data   # the shared volume\n", "")
S05_PATH = "/srv/conf/decode.serve-env"


def bash_eval(text: str, tmp_path) -> dict[str, str]:
    """What bash makes of `text` sourced the way the start script does (set -a; . FILE) in an
    empty environment: the values the collector records as `ProcessState.file_eval`."""
    f = tmp_path / f"eval-{uuid.uuid4().hex[:6]}.serve-env"
    f.write_text(text)
    out = subprocess.run(["env", "-i", "bash", "--noprofile", "--norc", "-c", 'set -a; . "$1"; env -0', "x", str(f)],
                         capture_output=True, check=True).stdout
    got = dict(e.decode().partition("=")[::2] for e in out.split(b"\0") if b"=" in e)
    return {k: v for k, v in got.items() if k in {a.key for a in parse_env(text).assignments}}


def s05_snapshot(text: str, tmp_path, label: str):
    """A snapshot of one host whose decode process was started from `text` (no network: the
    collector's answer built by hand, what bash made of the file evaluated by the local bash)."""
    import hashlib

    from envbisect.state.snapshot import FileState, HostState, ProcessState, Snapshot

    data = text.encode()
    sha = hashlib.sha256(data).hexdigest()
    ev = bash_eval(text, tmp_path)
    proc = ProcessState("decode", "ok", pid=4242, started_at=1.0, environ={"PATH": "/usr/bin", **ev},
                        file_eval=ev, file_eval_keys=tuple(ev), file_eval_sha256=sha)
    host = HostState("node1", "node1", 2.0, "UTC", 0, files={S05_PATH: FileState(S05_PATH, True, sha256=sha,
                                                                                    size=len(data), content=data)},
                     repos={}, processes={"decode": proc}, env_files={"decode": S05_PATH}, watched={})
    return Snapshot(f"snap-{label}", label, 2.0, "pb", {"node1": host})


def s05_diff(tmp_path, current: str = S05_CURRENT):
    from envbisect.state.deltas import compute_diff

    return compute_diff(s05_snapshot(current, tmp_path, "now"), s05_snapshot(S05_BASELINE, tmp_path, "good"),
                        since=None)


def test_baseline_trial_puts_a_removed_line_back_where_it_stood(tmp_path):
    from envbisect.state.configuration import FileOriginal, OriginalState

    diff = s05_diff(tmp_path)
    assert [(d.id, d.change, d.old_word) for d in diff.deltas] == [("decode:SGLANG_DATA_ROOT", "removed", "/data")]
    assert bash_eval(S05_CURRENT, tmp_path)["SGLANG_KV_DIR"] == "/kv"  # the culprit
    key = ("node1", S05_PATH)
    original = OriginalState({key: FileOriginal(True, S05_CURRENT.encode())}, {})
    base = target_state(original, diff.deltas, set(), diff.contents)
    # the baseline configuration is the baseline file, byte for byte, and bash agrees
    assert base.files[key] == S05_BASELINE.encode()
    assert bash_eval(base.files[key].decode(), tmp_path)["SGLANG_KV_DIR"] == "/data/kv"
    # the post-apply check also covers the line that reads the re-added key
    expect = {e.key: e.value for e in base.checks[key].expect}
    assert expect == {"SGLANG_DATA_ROOT": "/data", "SGLANG_KV_DIR": "/data/kv"}
    # current: untouched, and the reader is checked against the current snapshot's evaluation
    cur = target_state(original, diff.deltas, {"decode:SGLANG_DATA_ROOT"}, diff.contents)
    assert cur.files[key] == S05_CURRENT.encode()
    assert {e.key: e.value for e in cur.checks[key].expect} == {"SGLANG_DATA_ROOT": None, "SGLANG_KV_DIR": "/kv"}


def test_a_mixed_trial_re_adds_the_line_above_its_reader_and_the_reverse_edit_adds_it_back(tmp_path):
    """Another delta of the file in its new state: not the baseline bytes, but the re-added line is
    the exact old line, after the line that preceded it at noon (so its reader sees it again); the
    symmetric edit (applying the removal on top of the baseline text, as `apply` after a `revert`
    does) and an added line applied on top of the baseline go where they stand in the current file."""
    from envbisect.inputs.envfile import parse_env as parse
    from envbisect.state.configuration import FileOriginal, OriginalState

    current = (S05_CURRENT.replace("SGLANG_SM120_MMA_TARGET_CTAS=128", "SGLANG_SM120_MMA_TARGET_CTAS=256")
               .replace("# --- kernels ---\n", "# --- kernels ---\nexport SGLANG_KV_ROOT=/kv-new\n"))
    diff = s05_diff(tmp_path, current)
    assert {(d.id, d.change) for d in diff.deltas} == {("decode:SGLANG_DATA_ROOT", "removed"),
                                                       ("decode:SGLANG_KV_ROOT", "added"),
                                                       ("decode:SGLANG_SM120_MMA_TARGET_CTAS", "changed")}
    key = ("node1", S05_PATH)
    on_current = OriginalState({key: FileOriginal(True, current.encode())}, {})
    t = target_state(on_current, diff.deltas, {"decode:SGLANG_SM120_MMA_TARGET_CTAS"}, diff.contents)
    want = S05_BASELINE.replace("SGLANG_SM120_MMA_TARGET_CTAS=128", "SGLANG_SM120_MMA_TARGET_CTAS=256")
    assert t.files[key] == want.encode()
    assert bash_eval(want, tmp_path)["SGLANG_KV_DIR"] == "/data/kv"
    # a mixed configuration has no recorded evaluation: only the keys of its deltas are checked
    assert {e.key for e in t.checks[key].expect} == {"SGLANG_DATA_ROOT", "SGLANG_KV_ROOT",
                                                     "SGLANG_SM120_MMA_TARGET_CTAS"}
    # all reverted: the baseline bytes
    assert target_state(on_current, diff.deltas, set(), diff.contents).files[key] == S05_BASELINE.encode()
    # from the baseline text: all applied is the current bytes; the added line alone goes where it is now
    on_base = OriginalState({key: FileOriginal(True, S05_BASELINE.encode())}, {})
    ids = {d.id for d in diff.deltas}
    assert target_state(on_base, diff.deltas, ids, diff.contents).files[key] == current.encode()
    added = target_state(on_base, diff.deltas, {"decode:SGLANG_KV_ROOT"}, diff.contents).files[key].decode()
    assert added == S05_BASELINE.replace("# --- kernels ---\n", "# --- kernels ---\nexport SGLANG_KV_ROOT=/kv-new\n")
    # the edit itself: every copy of the key from the reference, as exactly its bytes
    assert parse(S05_CURRENT).with_lines_of("SGLANG_DATA_ROOT", parse(S05_BASELINE)) == S05_BASELINE
    top = "export A=1\nexport B=$A\n"
    assert parse("export B=$A\n").with_lines_of("A", parse(top)) == top


def test_post_apply_check_catches_a_reader_of_a_re_added_key_that_bash_now_evaluates_differently(tree, tmp_path):
    """The noon file, written back byte for byte, no longer gives what it gave at noon for a line
    that reads the reverted key (it also reads a file that changed since): one clear error, before
    anything is restarted."""
    sub = tmp_path / "sub"
    sub.write_text("r1\n")
    root_line = "export SGLANG_DATA_ROOT=/data\n"
    noon = NOON + root_line + f'export SGLANG_KV_DIR="${{SGLANG_DATA_ROOT}}/$(cat {sub})"\n'
    tree.edit("decode", noon)
    tree.procs.append(start_from_file(tree, "decode"))
    with open_dep(tree, tmp_path / "store") as dep:
        dep.snapshot("noon")
        tree.edit("decode", noon.replace(root_line, ""))
        sub.write_text("r2\n")
        diff = dep.diff(against="noon")
        assert [d.id for d in diff.deltas] == ["decode:SGLANG_DATA_ROOT"]
        ed = HostEditor(dep.playbook, dep.transports, tmp_path / "run", "run-1")
        ed.lock()
        try:
            orig = ed.begin({("node1", str(tree.env("decode")))}, set())
            t = target_state(orig, diff.deltas, set(), diff.contents)
            assert t.files[("node1", str(tree.env("decode")))] == noon.encode()
            with pytest.raises(EnvCheckFailed) as ei:
                ed.apply(t)
            msg = str(ei.value)
            assert "\n" not in msg and msg.startswith(f"node1: {tree.env('decode')}: SGLANG_KV_DIR: ")
            assert "'/data/r2'" in msg and "'/data/r1'" in msg and "nothing was restarted" in msg
            ed.restore()
            ed.finish()
        finally:
            ed.unlock()


def test_what_counts_as_an_unexplained_evaluation():
    """A whole-file fallback only for a line whose value can only have changed by the file's own
    order (red-team S15/S18); never for one that runs a command or expands ~, also inside a
    default word (red-team round 2, R10/R13: `${TAG:-$(date +%s%N)}` made every diff coarse)."""
    from envbisect.inputs.envfile import parse_env
    from envbisect.state.deltas import _unexplained_evaluations

    old = parse_env('export ROOT=/data\nexport KV="$ROOT/kv"\nexport TAG=\nexport RUN=${TAG:-$(date +%s)}\n'
                    'export C=${TAG:-~/c}\n')
    new = parse_env('export KV="$ROOT/kv"\nexport TAG=\nexport RUN=${TAG:-$(date +%s)}\nexport C=${TAG:-~/c}\n'
                    'export ROOT=/data\n')
    old_eval = {"ROOT": "/data", "KV": "/data/kv", "TAG": "", "RUN": "1", "C": "/root/c"}
    new_eval = {"ROOT": "/data", "KV": "/kv", "TAG": "", "RUN": "2", "C": "/home/x/c"}
    assert _unexplained_evaluations(old, new, old_eval, new_eval, set()) == ["KV"]
    # a delta on what it reads explains it
    assert _unexplained_evaluations(old, new, old_eval, new_eval, {"ROOT"}) == []


def test_same_change_works_out_the_value_when_the_host_could_not():
    """Red-team R01: the culprit kept decode from starting, so the host evaluated nothing, and the
    KV twins (`128` in prefill, `${KV_PAGE:-128}` in decode) were compared by text and split."""
    from envbisect.state.deltas import Delta, same_change

    def delta(service, word, ev, env=None):
        return Delta(f"{service}:SGLANG_KV_PAGE_SIZE", "env", "n1", service, f"/{service}.env", "SGLANG_KV_PAGE_SIZE",
                     "changed", "64", word.strip('"'), "snapshot:x", new_word=word, new_eval=ev, start_env=env)

    prefill = delta("prefill", "128", "128")
    assert same_change(delta("decode", "${KV_PAGE:-128}", None, {})) == same_change(prefill)
    assert same_change(delta("decode", "${KV_PAGE:-128}", None, {"KV_PAGE": "64"})) != same_change(prefill)
    assert same_change(delta("decode", "$(echo 128)", None, {})) != same_change(prefill)


def test_every_key_of_a_multi_assignment_line_is_evaluated_and_none_is_drift(tree, tmp_path):
    tree.edit("decode", NOON + "export SGLANG_FOO=1 SGLANG_BAR=2 SGLANG_BAZ=$HF_HOME\n")
    tree.procs.append(start_from_file(tree, "decode"))
    with open_dep(tree, tmp_path / "store") as dep:
        snap = dep.snapshot("noon")
        diff = dep.diff(against="noon")
    ps = snap.hosts["node1"].processes["decode"]
    assert ps.environ["SGLANG_BAR"] == "2" and ps.environ["SGLANG_BAZ"] == "/data/hf"
    assert diff.deltas == () and diff.drift == ()
