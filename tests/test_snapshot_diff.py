"""Snapshot and diff end to end, through `ssh = "local"` and through a real sshd."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envbisect.runs.deployment import ConnectOptions, Deployment
from envbisect.errors import ConnectionFailed, PlaybookError
from envbisect.inputs.playbook import load_playbook
from envbisect.state.store import Store

from hosttree import DECODE, PREFILL, git, make_tree

ENVBISECT = [sys.executable, "-m", "envbisect.cli.app"]


@pytest.fixture(params=["local", "ssh"])
def via(request):
    """(ssh spec, ssh_config) for the same machine, without or with a real sshd in between."""
    if request.param == "local":
        return "local", None
    server = request.getfixturevalue("sshd")
    return server.alias, str(server.ssh_config)


def open_dep(tree, via, store, **kw) -> Deployment:
    ssh, cfg = via
    return Deployment(load_playbook(tree.playbook(ssh, **kw)), Store(store), ConnectOptions(ssh_config=cfg, attempts=1))


def deltas_by_id(diff) -> dict:
    return {d.id: d for d in diff.deltas}


def test_snapshot_records_everything_in_one_round_trip(tmp_path, via):
    tree = make_tree(tmp_path / "host")
    with open_dep(tree, via, tmp_path / "store") as dep:
        snap = dep.snapshot("noon")
        assert dep.round_trips() == {"node1": 1}
    h = snap.hosts["node1"]
    env = h.files[str(tree.env("decode"))]
    assert env.content == DECODE.encode() and env.mode == 0o644 and env.sha256
    assert h.repos[str(tree.repo)].branch == "main" and not h.repos[str(tree.repo)].dirty
    members = h.watched[str(tree.watch)]
    assert len([m for m in members if m.endswith(".yaml")]) == 20
    assert not any("/.git/" in m or m.endswith("secret.txt") for m in members)  # no .git, no symlink followed
    assert h.files[str(tree.watch / "linkdir")].kind == "symlink"
    assert h.tz is not None or h.utc_offset_s is not None
    # stored 0600, content-addressed
    store = Store(tmp_path / "store")
    files = list((tmp_path / "store").rglob("*"))
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in files if p.is_file())
    assert store.find("noon").hosts["node1"].files[str(tree.env("decode"))].content == DECODE.encode()


def test_diff_against_snapshot_reports_exactly_the_planted_deltas(tmp_path, via):
    tree = make_tree(tmp_path / "host")
    with open_dep(tree, via, tmp_path / "store") as dep:
        dep.snapshot("noon")
        tree.edit("decode", DECODE.replace("export MAX_TOTAL_TOKENS=65536\n", "")
                  + "export SGLANG_SM120_MMA_TARGET_CTAS=512\n")
        tree.edit("prefill", PREFILL.replace("SGLANG_KV_PAGE_SIZE=64", "SGLANG_KV_PAGE_SIZE=128"))
        old_head = git(tree.repo, "rev-parse", "HEAD")
        new_head = tree.commit("v2: faster", "v2\n")
        (tree.watch / "cfg03.yaml").write_text("setting_3: 333\n")
        (tree.watch / "new.yaml").write_text("x: 1\n")
        os.unlink(tree.watch / "sub" / "cfg04.yaml")
        diff = dep.diff(against="noon")
        # the snapshot, the diff's own snapshot, then the installed engine's knobs (SGLANG_* deltas changed)
        assert dep.round_trips() == {"node1": 3}
    got = deltas_by_id(diff)
    assert set(got) == {
        "decode:SGLANG_SM120_MMA_TARGET_CTAS", "decode:MAX_TOTAL_TOKENS", "prefill:SGLANG_KV_PAGE_SIZE",
        f"git:node1:{tree.repo}", f"file:node1:{tree.watch}/cfg03.yaml#setting_3", f"file:node1:{tree.watch}/new.yaml",
        f"file:node1:{tree.watch}/sub/cfg04.yaml",
    }
    ctas = got["decode:SGLANG_SM120_MMA_TARGET_CTAS"]
    assert (ctas.change, ctas.old, ctas.new) == ("added", None, "512")
    assert ctas.baseline_source.startswith("snapshot:")
    assert (got["decode:MAX_TOTAL_TOKENS"].change, got["decode:MAX_TOTAL_TOKENS"].old) == ("removed", "65536")
    kv = got["prefill:SGLANG_KV_PAGE_SIZE"]
    assert (kv.change, kv.old, kv.new) == ("changed", "64", "128")
    g = got[f"git:node1:{tree.repo}"]
    assert (g.old, g.new) == (old_head, new_head) and any("v2: faster" in line for line in g.detail)
    assert got[f"file:node1:{tree.watch}/new.yaml"].change == "added"
    assert got[f"file:node1:{tree.watch}/sub/cfg04.yaml"].change == "removed"
    cfg03 = got[f"file:node1:{tree.watch}/cfg03.yaml#setting_3"]  # a YAML file: per key (state/structured.py)
    assert (cfg03.kind, cfg03.key, cfg03.old, cfg03.new) == ("key", "setting_3", "3", "333")
    assert diff.contents[cfg03.old_file] == b"setting_3: 3\n"


def test_diff_since_noon_cli_json_and_exit_status(tmp_path, via):
    tree = make_tree(tmp_path / "host")
    ssh, cfg = via
    pb = tree.playbook(ssh)
    base = [*ENVBISECT, "-p", str(pb), "--store", str(tmp_path / "store")] + (["--ssh-config", cfg] if cfg else [])
    r = subprocess.run(base + ["snapshot", "--label", "good", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    good_time = str(time.time() + 0.5)  # after "good", before any snapshot the diffs below save
    time.sleep(1.1)
    # No change yet: exit 0, no deltas
    r = subprocess.run(base + ["diff", "--since", good_time, "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["deltas"] == []
    tree.edit("decode", DECODE + "export SGLANG_SM120_MMA_TARGET_CTAS=512\n"
              + "export HF_TOKEN=hf_ZYXWVUTSRQPONMLKJIHGFEDCBA987\n")
    r = subprocess.run(base + ["diff", "--since", good_time, "--json"], capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["baseline"]["label"] == "good"
    ids = {d["id"]: d for d in doc["deltas"]}
    assert set(ids) == {"decode:SGLANG_SM120_MMA_TARGET_CTAS", "decode:HF_TOKEN"}
    assert ids["decode:SGLANG_SM120_MMA_TARGET_CTAS"]["new"] == "512"
    assert "hf_ZYXW" not in r.stdout and "hf_abcdefghij" not in r.stdout  # masked, both old and new
    assert ids["decode:HF_TOKEN"]["old"] != ids["decode:HF_TOKEN"]["new"]  # the hash hint still shows it changed
    # human output masks too, and says where each baseline came from
    r = subprocess.run(base + ["diff", "--since", good_time], capture_output=True, text=True)
    assert r.returncode == 1 and "+ SGLANG_SM120_MMA_TARGET_CTAS=512" in r.stdout and "hf_ZYXW" not in r.stdout


def test_fallback_baselines_without_any_snapshot(tmp_path, via):
    """No snapshot old enough: .bak copies, git history of the file, the reflog, then mtime-only."""
    tree = make_tree(tmp_path / "host")
    # The conf folder is tracked in its own git repo; the router file is committed, then edited.
    git(tree.conf, "init", "-q", "-b", "main")
    git(tree.conf, "add", "router.serve-env")
    git(tree.conf, "commit", "-qm", "router conf", env={"GIT_COMMITTER_DATE": "@1000000000 +0000"})
    old = time.time() - 3600
    # decode: a .bak copy made before TIME
    bak = Path(str(tree.env("decode")) + ".bak")
    bak.write_text(DECODE)
    os.utime(bak, (old, old))
    since = time.time() - 60
    for f in [tree.env("prefill"), tree.env("router"), tree.env("decode")] + list(tree.watch.rglob("*.yaml")):
        os.utime(f, (old, old))
    os.utime(tree.repo / "VERSION", (old, old))
    # the deployed checkout's HEAD as of an hour ago, in the reflog
    git(tree.repo, "commit", "-q", "--amend", "-m", "v1", env={"GIT_COMMITTER_DATE": f"@{int(old)} +0000"})
    old_head = git(tree.repo, "rev-parse", "HEAD")
    tree.edit("decode", DECODE.replace("CUDA_VISIBLE_DEVICES=4,5,6,7", "CUDA_VISIBLE_DEVICES=4,5"))
    tree.edit("router", "# router\nexport RUST_LOG=debug\nexport ROUTER_REQUEST_TIMEOUT_SECS=600\n")
    tree.commit("v2", "v2\n")
    (tree.watch / "cfg05.yaml").write_text("setting_5: 55\n")  # no old copy anywhere: mtime only
    with open_dep(tree, via, tmp_path / "store", backups=["{path}.bak"]) as dep:
        diff = dep.diff(since=str(int(since)))
    got = deltas_by_id(diff)
    cuda = got["decode:CUDA_VISIBLE_DEVICES"]
    assert (cuda.old, cuda.new, cuda.baseline_source) == ("4,5,6,7", "4,5", f"backup:{bak}")
    rl = got["router:RUST_LOG"]
    assert (rl.old, rl.new) == ("info", "debug") and rl.baseline_source.startswith("git:")
    g = got[f"git:node1:{tree.repo}"]
    assert (g.old, g.baseline_source) == (old_head, "reflog")
    f5 = got[f"file:node1:{tree.watch}/cfg05.yaml"]
    assert (f5.baseline_source, f5.old) == ("mtime", None) and "old content unknown" in f5.detail[0]
    assert not any(d.service == "prefill" for d in diff.deltas)  # untouched since before TIME
    assert diff.baseline is None


def test_process_environment_fallback_and_drift(tmp_path, via):
    tree = make_tree(tmp_path / "host")
    env = {"PATH": os.environ["PATH"], "CUDA_VISIBLE_DEVICES": "4,5,6,7", "SGLANG_KV_PAGE_SIZE": "64",
           "NCCL_IB_HCA": "mlx5_0,mlx5_1", "MAX_TOTAL_TOKENS": "65536", "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123"}
    proc = subprocess.Popen(["sleep", "60"], env=env)
    try:
        (tree.root / "run" / "decode.pid").write_text(f"{proc.pid}\n")
        time.sleep(1.2)
        since = time.time()
        time.sleep(0.05)
        tree.edit("decode", DECODE.replace("SGLANG_KV_PAGE_SIZE=64", "SGLANG_KV_PAGE_SIZE=32"))
        with open_dep(tree, via, tmp_path / "store", pid_files=True) as dep:
            diff = dep.diff(since=str(since))
    finally:
        proc.kill()
    got = deltas_by_id(diff)
    kv = got["decode:SGLANG_KV_PAGE_SIZE"]
    assert (kv.old, kv.new, kv.baseline_source) == ("64", "32", "process:decode")
    assert [(d.service, d.key, d.file_value, d.process_value) for d in diff.drift] == [
        ("decode", "SGLANG_KV_PAGE_SIZE", "32", "64")]
    assert "prefill" not in diff.unknown_processes  # no pid -> not-running, not "unknown"


def test_overwritten_environ_is_unknown_not_drift(tmp_path, via):
    """A program that rewrites its process title (sglang-router does) overwrites the memory that
    /proc/PID/environ shows: that must read as 'unknown', never as drift."""
    tree = make_tree(tmp_path / "host")
    code = ("import time\n"
            "f = open('/proc/self/stat').read().rsplit(')', 1)[1].split()\n"
            "start, end = int(f[47]), int(f[48])\n"  # env_start/env_end: fields 50 and 51 of stat
            "m = open('/proc/self/mem', 'r+b'); m.seek(start); m.write(b'\\0' * (end - start)); m.flush()\n"
            "print('ready', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], env={"PATH": os.environ["PATH"], "RUST_LOG": "warn"},
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        (tree.root / "run" / "router.pid").write_text(f"{proc.pid}\n")
        with open_dep(tree, via, tmp_path / "store", pid_files=True) as dep:
            snap = dep.snapshot()
            diff = dep.diff(since="1s ago")
    finally:
        proc.kill()
    assert snap.hosts["node1"].processes["router"].status == "unknown"
    assert diff.unknown_processes == ("router",)
    assert [d for d in diff.drift if d.service == "router"] == []


def test_two_hosts_in_parallel(tmp_path, sshd, sshd2):
    from hosttree import make_tree as mk
    import textwrap

    from sshd import write_ssh_config

    t1, t2 = mk(tmp_path / "h1"), mk(tmp_path / "h2")
    cfg = write_ssh_config(tmp_path / "ssh_config", [sshd, sshd2])
    pb = tmp_path / "two.toml"
    pb.write_text(textwrap.dedent(f"""
        [deployment]
        name = "two"
        [hosts.a]
        ssh = "{sshd.alias}"
        python = "{sys.executable}"
        [hosts.b]
        ssh = "{sshd2.alias}"
        python = "{sys.executable}"
        [services.prefill]
        host = "a"
        env_file = "{t1.env('prefill')}"
        start = "true"
        stop = "true"
        health = "http://127.0.0.1:1/health"
        [services.decode]
        host = "b"
        env_file = "{t2.env('decode')}"
        start = "true"
        stop = "true"
        health = "http://127.0.0.1:2/health"
        [restart]
        order = ["prefill", "decode"]
        [[repos]]
        host = "b"
        path = "{t2.repo}"
        [watch.hosts]
        a = ["{t1.watch}"]
    """))
    with Deployment(load_playbook(pb), Store(tmp_path / "s"), ConnectOptions(ssh_config=str(cfg))) as dep:
        dep.snapshot("good")
        t2.edit("decode", DECODE + "export SGLANG_X=1\n")
        diff = dep.diff(against="good")
        assert dep.round_trips() == {"a": 2, "b": 3}  # b: and its installed engine's knobs (SGLANG_X changed)
    assert [(d.host, d.id) for d in diff.deltas] == [("b", "decode:SGLANG_X")]


# --- error paths -------------------------------------------------------------------------------

def run_cli(*args, **kw):
    return subprocess.run([*ENVBISECT, *args], capture_output=True, text=True, **kw)


def test_unknown_host_key_is_refused_with_fingerprint_and_fix(tmp_path, sshd):
    tree = make_tree(tmp_path / "host")
    empty_kh = tmp_path / "known_hosts"
    empty_kh.write_text("")
    cfg = tmp_path / "cfg"
    cfg.write_text(sshd.ssh_config.read_text().replace(str(sshd.known_hosts), str(empty_kh)))
    pb = tree.playbook(sshd.alias)
    r = run_cli("-p", str(pb), "--store", str(tmp_path / "s"), "--ssh-config", str(cfg), "snapshot")
    assert r.returncode == 3
    assert sshd.host_key_fingerprint in r.stderr and "--accept-new-host-key" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    # explicit opt-in: accepted and recorded, then it works without the flag
    r = run_cli("-p", str(pb), "--store", str(tmp_path / "s"), "--ssh-config", str(cfg), "--accept-new-host-key", "snapshot")
    assert r.returncode == 0, r.stderr
    assert "ssh-ed25519" in empty_kh.read_text()
    r = run_cli("-p", str(pb), "--store", str(tmp_path / "s"), "--ssh-config", str(cfg), "snapshot")
    assert r.returncode == 0, r.stderr


def test_changed_host_key_is_refused_even_with_accept_new(tmp_path, sshd):
    tree = make_tree(tmp_path / "host")
    kh = tmp_path / "known_hosts"
    other = tmp_path / "otherkey"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kh.write_text(f"[127.0.0.1]:{sshd.port} " + " ".join(other.with_suffix(".pub").read_text().split()[:2]) + "\n")
    cfg = tmp_path / "cfg"
    cfg.write_text(sshd.ssh_config.read_text().replace(str(sshd.known_hosts), str(kh)))
    r = run_cli("-p", str(tree.playbook(sshd.alias)), "--store", str(tmp_path / "s"), "--ssh-config", str(cfg),
                "--accept-new-host-key", "snapshot")
    assert r.returncode == 3 and "CHANGED" in r.stderr and "ssh-keygen -R" in r.stderr


def test_unreachable_host_fails_in_one_line(tmp_path):
    import socket

    tree = make_tree(tmp_path / "host")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    r = run_cli("-p", str(tree.playbook(f"root@127.0.0.1:{port}")), "--store", str(tmp_path / "s"),
                "--connect-attempts", "2", "snapshot")
    assert r.returncode == 3
    assert "cannot connect after 2 attempt(s)" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("text,needle", [
    ("[hosts.a]\nssh = 1\n", "hosts.a.ssh: must be str"),
    ("[hosts.a]\nssh = 'local'\n[services.x]\nhost = 'b'\n", "services.x.host: names unknown host 'b'"),
    ("[hosts.a]\nssh = 'local'\n[services.x]\nhost='a'\nenv_file='rel'\nstart='s'\nstop='s'\nhealth='http://x'\n",
     "services.x.env_file: must be an absolute path"),
    ("[hosts.a]\nssh = 'local'\nbogus = 1\n", "hosts.a.bogus: unknown key"),
    ("not toml [", "invalid TOML"),
])
def test_bad_playbook_is_one_clear_line(tmp_path, text, needle):
    pb = tmp_path / "bad.toml"
    pb.write_text(text)
    with pytest.raises(PlaybookError):
        load_playbook(pb)
    r = run_cli("-p", str(pb), "snapshot")
    assert r.returncode == 2 and needle in r.stderr and str(pb) in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_missing_playbook_and_bad_time(tmp_path):
    r = run_cli("-p", str(tmp_path / "nope.toml"), "diff", "--since", "noon")
    assert r.returncode == 2 and "no such playbook" in r.stderr
    tree = make_tree(tmp_path / "host")
    r = run_cli("-p", str(tree.playbook()), "--store", str(tmp_path / "s"), "diff", "--since", "tomorrow-ish")
    assert r.returncode == 2 and "tomorrow-ish" in r.stderr and "Traceback" not in r.stderr


def test_unreadable_env_file_is_reported_not_crashed(tmp_path, via):
    tree = make_tree(tmp_path / "host")
    with open_dep(tree, via, tmp_path / "store") as dep:
        dep.snapshot("good")
        os.unlink(tree.env("router"))
        tree.env("router").mkdir()  # not a regular file: cannot be read as one, even by root
        diff = dep.diff(against="good")
    assert any("router.serve-env" in n and "cannot read" in n for n in diff.notes)


def test_large_watched_file_recorded_by_hash_only(tmp_path, via):
    tree = make_tree(tmp_path / "host")
    big = tree.watch / "weights.bin"
    big.write_bytes(os.urandom(2 << 20))
    with open_dep(tree, via, tmp_path / "store") as dep:
        snap = dep.snapshot()
    f = snap.hosts["node1"].files[str(big)]
    assert f.content is None and f.too_large and f.size == 2 << 20 and len(f.sha256) == 64


def test_proxy_jump_through_a_bastion(tmp_path, sshd, sshd2):
    """ProxyJump from the OpenSSH config: reach sshd2 only through sshd (both on loopback here)."""
    tree = make_tree(tmp_path / "host")
    cfg = tmp_path / "ssh_config"
    kh = tmp_path / "known_hosts"
    kh.write_text(sshd.known_hosts.read_text() + sshd2.known_hosts.read_text())
    cfg.write_text(sshd.config_block("bastion").replace(str(sshd.known_hosts), str(kh)) + "\n"
                   + sshd2.config_block("inner").replace(str(sshd2.known_hosts), str(kh))
                   + "    ProxyJump bastion\n")
    with Deployment(load_playbook(tree.playbook("inner")), Store(tmp_path / "s"),
                    ConnectOptions(ssh_config=str(cfg), attempts=1)) as dep:
        snap = dep.snapshot()
    assert snap.hosts["node1"].files[str(tree.env("decode"))].content == DECODE.encode()
    assert f"127.0.0.1:{sshd2.port}" in sshd2.log.read_text() or "Accepted publickey" in sshd2.log.read_text()


def test_agent_keys_work_without_identity_file(tmp_path, sshd, monkeypatch):
    """A key held by ssh-agent (no IdentityFile in the config) authenticates too."""
    import re

    tree = make_tree(tmp_path / "host")
    agent = subprocess.run(["ssh-agent", "-s"], capture_output=True, text=True, check=True).stdout
    sock = re.search(r"SSH_AUTH_SOCK=([^;]+);", agent).group(1)
    pid = int(re.search(r"SSH_AGENT_PID=(\d+);", agent).group(1))
    try:
        env = {**os.environ, "SSH_AUTH_SOCK": sock}
        subprocess.run(["ssh-add", "-q", str(sshd.client_key)], env=env, check=True, capture_output=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", sock)
        monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/id_* to fall back on
        cfg = tmp_path / "cfg"
        cfg.write_text("\n".join(l for l in sshd.config_block().splitlines()
                                 if "IdentityFile" not in l and "IdentitiesOnly" not in l) + "\n")
        with Deployment(load_playbook(tree.playbook(sshd.alias)), Store(tmp_path / "s"),
                        ConnectOptions(ssh_config=str(cfg), attempts=1)) as dep:
            assert dep.snapshot().hosts["node1"].repos[str(tree.repo)].head
        # and without the agent, the same config is refused in one clear line
        monkeypatch.delenv("SSH_AUTH_SOCK")
        with pytest.raises(ConnectionFailed, match="authentication failed"):
            with Deployment(load_playbook(tree.playbook(sshd.alias)), Store(tmp_path / "s"),
                            ConnectOptions(ssh_config=str(cfg), attempts=1)) as dep:
                dep.snapshot()
    finally:
        os.kill(pid, 15)


@pytest.mark.parametrize("tz", ["Asia/Tokyo", "America/New_York"])
def test_since_is_read_in_the_hosts_timezone(tmp_path, monkeypatch, tz):
    """`noon` means the host's most recent noon, whatever the controller's timezone."""
    from datetime import datetime, timedelta
    from zoneinfo import ZoneInfo

    monkeypatch.setenv("TZ", tz)  # the "host" (a local transport) inherits it; the collector reports it
    tree = make_tree(tmp_path / "host")
    with Deployment(load_playbook(tree.playbook()), Store(tmp_path / "s")) as dep:
        since = dep.resolve_since("noon")["node1"]
        clock = dep.snapshot(save=False).hosts["node1"]
    assert clock.tz == tz
    now = datetime.now(ZoneInfo(tz))
    noon = now.replace(hour=12, minute=0, second=0, microsecond=0)
    if noon > now:
        noon = (noon - timedelta(days=1)).replace(hour=12)
    assert abs(since - noon.timestamp()) < 1


def test_two_snapshots_with_the_same_second_and_label_do_not_overwrite_each_other(tmp_path):
    """Replicas of a fleet share a store and snapshot in the same second: ids must stay unique."""
    from envbisect.state.snapshot import Snapshot
    from envbisect.state.store import Store

    store = Store(tmp_path / "store")
    a = store.save(Snapshot(id="20261203T120000Z-noon", label="noon", taken_at=1.0, playbook="pd-a", hosts={}))
    b = store.save(Snapshot(id="20261203T120000Z-noon", label="noon", taken_at=1.0, playbook="pd-b", hosts={}))
    assert a.id == "20261203T120000Z-noon" and b.id == "20261203T120000Z-noon-2"
    assert {s.playbook for s in store.list()} == {"pd-a", "pd-b"}
    # a label means the deployment's own snapshot with it
    assert store.find("noon", deployment="pd-a").playbook == "pd-a"
    assert store.find("noon", deployment="pd-b").playbook == "pd-b"
