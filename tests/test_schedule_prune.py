"""Baselines that exist (issue 12, part 3): `envbisect schedule` (systemd user units or a crontab
line whose command really takes a snapshot over a real sshd), `envbisect prune` (thinning, blob
garbage collection, crash safety), and the `diff --since` fallback note."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from clistack import health_endpoint
from hosttree import DECODE, make_tree

from envbisect.state import prune as prune_mod
from envbisect.state.store import Store

ENVBISECT = [sys.executable, "-m", "envbisect.cli.app"]


def run(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*ENVBISECT, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def one_line_error(r: subprocess.CompletedProcess, status: int = 2) -> str:
    assert r.returncode == status, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("envbisect: error: "), r.stderr
    return lines[0]


@pytest.fixture
def host(tmp_path, sshd):
    """A host tree reached through the real sshd; (tree, playbook, ssh_config)."""
    tree = make_tree(tmp_path / "host")
    pb = tree.playbook(sshd.alias, name=f"sched-{uuid.uuid4().hex[:8]}")
    return tree, pb, str(sshd.ssh_config)


FAKE_CRONTAB = """#!/bin/sh
# a stand-in for crontab(1): -l prints the table, - replaces it from stdin
f={table}
case "$1" in
  -l) if [ -f "$f" ]; then cat "$f"; else echo "no crontab for $(id -un)" >&2; exit 1; fi ;;
  -) cat > "$f" ;;
  *) echo "usage: crontab -l | -" >&2; exit 1 ;;
esac
"""


def test_cron_line_is_installed_once_and_takes_a_snapshot_over_sshd(tmp_path, host):
    tree, pb, cfg = host
    table = tmp_path / "crontab.txt"
    table.write_text("MAILTO=ops@example.com\n5 4 * * * /usr/local/bin/backup-db\n")  # the user's own lines stay
    fake = tmp_path / "crontab"
    fake.write_text(FAKE_CRONTAB.format(table=shlex.quote(str(table))))
    fake.chmod(0o755)
    env = {"ENVBISECT_CRONTAB": str(fake)}
    work = tmp_path / "elsewhere"
    work.mkdir()
    # relative paths on the command line: the cron line must hold them absolute
    rel_pb = os.path.relpath(pb, work)
    args = ["-p", rel_pb, "--store", "store", "--ssh-config", os.path.relpath(cfg, work)]
    r = run(*args, "schedule", "--every", "1h", "--cron", env=env, cwd=work)
    assert r.returncode == 0, r.stderr
    assert "0 * * * * " in r.stdout and "snapshot --label auto" in r.stdout
    assert "snapshot --label deploy-$(git rev-parse --short HEAD)" in r.stdout  # the deploy hook hint
    assert table.read_text().count("\n") == 2  # printing installs nothing

    for _ in range(2):  # installing twice leaves one entry
        r = run(*args, "schedule", "--every", "1h", "--cron", "--install", "--json", env=env, cwd=work)
        assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["kind"] == "cron" and doc["installed"] == {"changed": [], "unchanged": ["crontab"], "next_steps": []}
    lines = table.read_text().splitlines()
    assert lines[:2] == ["MAILTO=ops@example.com", "5 4 * * * /usr/local/bin/backup-db"]
    jobs = [ln for ln in lines if "envbisect" in ln and not ln.startswith("#")]
    assert len(jobs) == 1 and sum(ln.startswith("# envbisect schedule:") for ln in lines) == 1
    job = jobs[0]
    assert job.startswith("0 * * * * ")
    assert str(pb) in job and str(work / "store") in job and cfg in job  # absolute
    # a different interval replaces the entry instead of adding one
    r = run(*args, "schedule", "--every", "15m", "--cron", "--install", env=env, cwd=work)
    assert r.returncode == 0 and "added to your crontab" in r.stdout, r.stderr
    jobs = [ln for ln in table.read_text().splitlines() if "envbisect" in ln and not ln.startswith("#")]
    assert len(jobs) == 1 and jobs[0].startswith("*/15 * * * * ")

    # run the job as cron would: sh -c, from another folder, a minimal environment
    command = jobs[0].split(None, 5)[5]
    cron_env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "SHELL": "/bin/sh"}
    p = subprocess.run(["sh", "-c", command], cwd="/", env=cron_env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout, p.stderr, (work / "store" / "schedule.log").read_text())
    snaps = Store(work / "store").list()
    assert [s.label for s in snaps] == ["auto"] and str(tree.env("decode")) in snaps[0].hosts["node1"].files


def test_systemd_units_are_written_and_their_command_takes_a_snapshot(tmp_path, host):
    tree, pb, cfg = host
    xdg = tmp_path / "xdg"
    env = {"XDG_CONFIG_HOME": str(xdg)}
    store = tmp_path / "store with space"
    args = ["-p", str(pb), "--store", str(store), "--ssh-config", cfg]
    r = run(*args, "schedule", "--every", "30m", "--systemd", env=env)
    assert r.returncode == 0, r.stderr
    assert "[Timer]" in r.stdout and "systemctl --user daemon-reload && systemctl --user enable --now" in r.stdout
    assert not xdg.exists()  # printed only
    r = run(*args, "schedule", "--every", "30m", "--systemd", "--install", "--json", env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    units = xdg / "systemd" / "user"
    service = units / f"{doc['unit']}.service"
    timer = units / f"{doc['unit']}.timer"
    assert sorted(doc["installed"]["changed"]) == sorted([str(service), str(timer)])
    assert doc["enable"] == f"systemctl --user daemon-reload && systemctl --user enable --now {doc['unit']}.timer"
    assert any("enable --now" in s for s in doc["installed"]["next_steps"])
    t = timer.read_text()
    assert "OnUnitActiveSec=30min" in t and "OnActiveSec=" in t and "WantedBy=timers.target" in t
    s = service.read_text()
    assert "Type=oneshot" in s
    # again: nothing to change
    r = run(*args, "schedule", "--every", "30m", "--systemd", "--install", env=env)
    assert r.returncode == 0 and r.stdout.count("unchanged ") == 2, r.stdout

    # ExecStart= as systemd would run it (quotes; $$ and %% unescaped), from / with a bare environment
    exec_start = next(ln for ln in s.splitlines() if ln.startswith("ExecStart=")).split("=", 1)[1]
    argv = [a.replace("$$", "$").replace("%%", "%") for a in shlex.split(exec_start)]
    assert argv[argv.index("--store") + 1] == str(store)
    p = subprocess.run(argv, cwd="/", env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")},
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert [x.label for x in Store(store).list()] == ["auto"]


def test_schedule_refuses_what_cannot_work(tmp_path, host):
    tree, pb, cfg = host
    base = ["-p", str(pb), "--store", str(tmp_path / "s")]
    assert "cron cannot repeat that evenly" in one_line_error(run(*base, "schedule", "--every", "7h", "--cron"))
    assert "--every" in one_line_error(run(*base, "schedule", "--every", "often"))
    assert "at least 1m" in one_line_error(run(*base, "schedule", "--every", "30s"))
    assert "no stdin" in one_line_error(run(*base, "--inventory", "-", "schedule", "--every", "1h"))
    assert "no such file" in one_line_error(run(*base, "--ssh-config", str(tmp_path / "nope"), "schedule", "--every", "1h"))
    missing = one_line_error(run("-p", str(tmp_path / "none.toml"), "schedule", "--every", "1h"))
    assert "none.toml" in missing
    # no crontab command at all: the line to add by hand is in the one error line
    nocron = tmp_path / "bin"
    nocron.mkdir()
    r = subprocess.run([*ENVBISECT, *base, "schedule", "--every", "1h", "--cron", "--install"], capture_output=True,
                       text=True, env={k: v for k, v in os.environ.items() if k != "ENVBISECT_CRONTAB"} | {"PATH": str(nocron)})
    line = one_line_error(r)
    assert "crontab is not installed" in line and "snapshot --label auto" in line


# --- prune -----------------------------------------------------------------------------------

def blob_path(store: Path, data: bytes) -> Path:
    sha = hashlib.sha256(data).hexdigest()
    return store / "blobs" / sha[:2] / sha


def age_blobs(store: Path, seconds: float = 3600) -> None:
    when = time.time() - seconds
    for p in (store / "blobs").rglob("*"):
        if p.is_file():
            os.utime(p, (when, when))


def snapshot_ids(store: Path) -> set[str]:
    return {p.stem for p in (store / "snapshots").glob("*.json")}


def test_prune_thins_the_store_and_keeps_what_runs_need(tmp_path, sshd):
    tree = make_tree(tmp_path / "host")
    store = tmp_path / "store"
    with health_endpoint() as health:
        probe = f'[probes.p]\nkind = "command"\ncommand = "! grep -q BAD {tree.env("decode")}"\ntimeout_s = 10\n'
        pb = tree.playbook(sshd.alias, name=f"prune-{uuid.uuid4().hex[:8]}", extra=probe)
        pb.write_text(re.sub(r"http://127\.0\.0\.1:\d/health", health, pb.read_text())
                      .replace("[restart]\n", "[restart]\npoll_interval_s = 0.1\nhealth_timeout_s = 10\n"))
        cli = lambda *a: run("-p", str(pb), "--store", str(store), "--ssh-config", str(sshd.ssh_config), *a)  # noqa: E731

        def snap(label: str | None) -> str:
            r = cli("snapshot", *(["--label", label] if label else []), "--json")
            assert r.returncode == 0, r.stderr
            time.sleep(1.05)  # snapshot ids have a resolution of one second
            return json.loads(r.stdout)["id"]

        friday = snap("friday")            # labelled, used by no run
        noon = snap("noon")                # labelled, the baseline of the run below
        tree.edit("decode", DECODE + "export BAD=1\n")
        auto1, auto2 = snap("auto"), snap("auto")  # the same contents: they share blobs
        unique = DECODE + "export BAD=1\nexport ONLY_IN_THE_UNLABELLED_ONE=1\n"
        tree.edit("decode", unique)
        plain = snap(None)
        tree.edit("decode", DECODE + "export BAD=1\n")
        r = cli("bisect", "--against", "noon", "--json")
        assert r.returncode == 0, r.stderr
        run_doc = json.loads(r.stdout)
        run_json = json.loads((store / "runs" / run_doc["run"] / "run.json").read_text())
        assert run_json["baseline"] == noon and run_json["current"] not in (friday, noon, auto1, auto2, plain)
        current = run_json["current"]  # the snapshot the bisection's diff took (label "diff")
        newest = snap("auto")
    age_blobs(store)  # written an hour ago: past the grace period
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}

    r = cli("prune", "--keep", "1s", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    dry = json.loads(r.stdout)
    assert {e["id"] for e in dry["snapshots"]["deleted"]} == {friday, auto1, auto2, plain}
    why = {e["id"]: e["kept_because"] for e in dry["snapshots"]["kept"]}
    assert why[noon] == [f"used by run {run_doc['run']}"] and why[current] == [f"used by run {run_doc['run']}"]
    assert why[newest] == ["newest of its deployment"]
    assert dry["blobs"]["deleted"] >= 1 and dry["dry_run"] is True
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == before  # nothing moved

    r = cli("prune", "--keep", "1s", "--keep-labelled", "--dry-run")
    assert r.returncode == 0 and "would remove 3 snapshot(s)" in r.stdout and "labelled 'friday'" in r.stdout, r.stdout
    assert "dry run: nothing was removed" in r.stdout

    r = cli("prune", "--keep", "1s", "--keep-labelled", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {e["id"] for e in doc["snapshots"]["deleted"]} == {auto1, auto2, plain}
    assert snapshot_ids(store) == {friday, noon, current, newest}
    assert not blob_path(store, unique.encode()).exists()  # only the unlabelled snapshot had it
    assert doc["blobs"]["deleted"] >= 1
    # everything kept is whole: snapshots load (a missing blob is an error), the run can be shown,
    # bundled and diffed against
    s = Store(store)
    for sid in (friday, noon, current, newest):
        s.find(sid)
    assert s.run_deltas(run_json)
    assert all(s.get_blob(b) is not None for b in run_json["contents"].values())
    assert cli("show", run_doc["run"]).returncode == 0
    r = cli("bundle", "--run", run_doc["run"], "--out", str(tmp_path / "b.tar.gz"))
    assert r.returncode == 0, r.stderr
    r = cli("prune", "--keep", "1s", "--keep-labelled")  # again: nothing left to do
    assert r.returncode == 0 and "no snapshot to remove" in r.stdout and "blobs: removed 0 " in r.stdout, r.stdout
    assert newest in r.stdout and friday in r.stdout  # ids in full, never cut short
    assert cli("diff", "--against", "noon").returncode == 1


def _store_with(tmp_path: Path, docs: dict[str, tuple[float, str | None, dict[str, bytes]]]) -> Store:
    """A store with hand-made snapshots: id -> (taken_at, label, {path: content})."""
    store = Store(tmp_path / "store")
    store._ensure()
    for sid, (when, label, files) in docs.items():
        hosts = {"n": {"name": "n", "hostname": "n", "clock_epoch": when, "files": {
            p: {"path": p, "exists": True, "blob": store.put_blob(c)} for p, c in files.items()}}}
        (store.snapshots_dir / f"{sid}.json").write_text(json.dumps(
            {"format": 1, "id": sid, "label": label, "taken_at": when, "playbook": "dep", "hosts": hosts}))
    age_blobs(store.root)
    return store


def test_prune_removes_snapshots_before_their_blobs_and_survives_a_crash_between(tmp_path, monkeypatch):
    now = time.time()
    old = now - 30 * 86400
    store = _store_with(tmp_path, {"a": (old, "auto", {"/f": b"only-a"}), "b": (old + 1, None, {"/f": b"only-b"}),
                                   "c": (now, "auto", {"/f": b"shared"}), "d": (old + 2, "auto", {"/f": b"shared"})})
    order: list[str] = []
    real_unlink = Path.unlink

    def unlink(self: Path, *a, **kw):
        if "blobs" in self.parts:
            order.append("blob")
            if len([o for o in order if o == "blob"]) == 1:
                raise KeyboardInterrupt  # killed in the middle of the blob collection
        else:
            order.append("snapshot")
        return real_unlink(self, *a, **kw)

    monkeypatch.setattr(Path, "unlink", unlink)
    with pytest.raises(KeyboardInterrupt):
        prune_mod.prune(store, keep_s=14 * 86400)
    assert order == ["snapshot"] * 3 + ["blob"]  # every snapshot went before the first blob
    monkeypatch.setattr(Path, "unlink", real_unlink)
    assert snapshot_ids(store.root) == {"c"}
    store.find("c")  # what is left is whole
    res = prune_mod.prune(store, keep_s=14 * 86400)  # the next prune finishes the job
    assert res.deleted == [] and res.blobs_deleted == 2
    assert not blob_path(store.root, b"only-a").exists() and not blob_path(store.root, b"only-b").exists()
    assert blob_path(store.root, b"shared").exists()


def test_prune_never_guesses(tmp_path):
    now = time.time()
    old = now - 30 * 86400
    store = _store_with(tmp_path, {"a": (old, "auto", {"/f": b"a"}), "z": (now, "auto", {"/f": b"z"})})
    orphan_old = store.put_blob(b"orphan, old")
    age_blobs(store.root)
    orphan_new = store.put_blob(b"orphan, written just now")  # a snapshot being saved right now
    reused = store.put_blob(b"a")  # an old blob reused just now: fresh again
    res = prune_mod.prune(store, keep_s=86400)
    assert [e.id for e in res.deleted] == ["a"]
    assert store.get_blob(orphan_old) is None and store.get_blob(orphan_new) is not None
    assert store.get_blob(reused) is not None and res.blobs_young == 2

    # a run names a snapshot: it stays, however old; its deltas blob and contents stay
    store2 = _store_with(tmp_path / "2", {"old": (old, "auto", {"/f": b"o"}), "new": (now, "auto", {"/f": b"n"})})
    deltas = store2.put_run_deltas([{"id": "x"}])
    content = store2.put_blob(b"file content of a delta")
    rd = store2.runs_dir / "20260101T000000-abc123"
    rd.mkdir(parents=True)
    (rd / "run.json").write_text(json.dumps({"baseline": "old", "current": "new", "deltas_blob": deltas,
                                             "contents": {"sha": content}}))
    (store2.runs_dir / "20260101T000001-crashed").mkdir()  # crashed before writing run.json: names nothing
    age_blobs(store2.root)
    res = prune_mod.prune(store2, keep_s=60)
    assert res.deleted == [] and store2.get_blob(deltas) and store2.get_blob(content)

    # a damaged run.json: its references are unknown, so no blob goes (and it says so)
    (rd / "run.json").write_text("{not json")
    stray = store2.put_blob(b"stray")
    age_blobs(store2.root)
    res = prune_mod.prune(store2, keep_s=60)
    assert not res.blob_gc and store2.get_blob(stray) is not None
    assert any("run.json" in n for n in res.notes) and any("no blob was removed" in n for n in res.notes)


def test_prune_waits_for_a_snapshot_being_saved(tmp_path):
    store = _store_with(tmp_path, {"z": (time.time(), "auto", {"/f": b"z"})})
    released = threading.Event()
    t_release = []

    def hold():
        with store.writing():
            time.sleep(0.6)
            t_release.append(time.monotonic())
        released.set()

    th = threading.Thread(target=hold)
    th.start()
    time.sleep(0.1)
    prune_mod.prune(store, keep_s=60)
    t_done = time.monotonic()
    th.join()
    assert released.is_set() and t_done >= t_release[0]


def test_prune_cli_errors_are_one_line(tmp_path):
    assert "no snapshot store" in one_line_error(run("--store", str(tmp_path / "none"), "prune", "--keep", "14d"))
    (tmp_path / "s").mkdir()
    assert "--keep" in one_line_error(run("--store", str(tmp_path / "s"), "prune", "--keep", "forever"))
    assert "--keep" in one_line_error(run("--store", str(tmp_path / "s"), "prune"))


def test_diff_since_without_a_snapshot_says_its_source_and_how_to_have_one(tmp_path, sshd):
    tree = make_tree(tmp_path / "host")
    bak = Path(str(tree.env("decode")) + ".bak")
    bak.write_text(DECODE.replace("MAX_TOTAL_TOKENS=65536", "MAX_TOTAL_TOKENS=32768"))
    two_hours_ago = time.time() - 7200
    os.utime(bak, (two_hours_ago, two_hours_ago))
    pb = tree.playbook(sshd.alias, name=f"fb-{uuid.uuid4().hex[:8]}", backups=["{path}.bak"])
    base = ["-p", str(pb), "--store", str(tmp_path / "store"), "--ssh-config", str(sshd.ssh_config)]
    r = run(*base, "diff", "--since", "1 hour ago")
    assert r.returncode == 1, r.stderr
    assert "baseline: no snapshot old enough; fallback sources: backup" in r.stdout
    out = " ".join(r.stdout.split())  # the note may wrap
    assert "there is no snapshot of this deployment in the store" in out
    assert "backup copies ([baseline] backups) (1 delta)" in out
    assert "envbisect schedule --every 1h --install" in out and "envbisect snapshot --label NAME" in out
    r = run(*base, "diff", "--since", "1 hour ago", "--json")
    doc = json.loads(r.stdout)
    assert doc["baseline"]["snapshot"] is None and "backup" in doc["baseline"]["sources"]
    assert "envbisect schedule" in doc["baseline"]["hint"]
    note = next(n for n in doc["notes"] if "no snapshot taken at or before" in n)
    assert "the oldest snapshot of this deployment" in note  # the first diff saved one (after the time)
