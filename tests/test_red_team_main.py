"""The low-severity findings of the blind red team of main, each through the real CLI (a subprocess; one
line on stderr, the exit status) or the real store: private folders, durations and ports that are bad
input, a store path that is a file, error reasons that name a path ending in a secret word, and the
refusal that points at another store's run."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ENVBISECT = [sys.executable, "-m", "envbisect.cli.app"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ENVBISECT, *args], capture_output=True, text=True, timeout=120)


def _one_line_error(r: subprocess.CompletedProcess, status: int = 2) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == status, (r.returncode, r.stdout, r.stderr)
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def _playbook(tmp_path: Path, ssh: str = "local") -> Path:
    env = tmp_path / "decode.serve-env"
    env.write_text("A=1\n")
    pb = tmp_path / "pd.toml"
    pb.write_text(textwrap.dedent(f"""
        [deployment]
        name = "pd"

        [hosts.node1]
        ssh = "{ssh}"

        [services.decode]
        host = "node1"
        env_file = "{env}"
        start = "true"
        stop = "true"
        health = "http://127.0.0.1:1/health"
        """))
    return pb


# --- 5: every folder of the store is 0700, the evidence folder too --------------------------------

def test_evidence_folders_are_private_under_umask_022(tmp_path):
    """Red team: `runs/RUN/evidence/` was 0755 under umask 022 (`mkdir(parents=True, mode=0o700)` gives
    the mode to the last folder only). capture_evidence writes `evidence/trial-NNN/SERVICE.log.txt`
    with write_private, as here."""
    from envbisect.state.rundir import Runs
    from envbisect.state.store import Store, write_private

    old = os.umask(0o022)
    try:
        store = tmp_path / "a" / "store"
        Store(store).list()  # makes the store
        rd = Runs(store / "runs").new("run-1")
        write_private(rd.path / "evidence" / "trial-001" / "decode.log.txt", b"x")
    finally:
        os.umask(old)
    made = [tmp_path / "a", store, store / "runs", rd.path, rd.path / "evidence", rd.path / "evidence" / "trial-001"]
    for d in made:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, (d, oct(d.stat().st_mode))
    assert stat.S_IMODE((rd.path / "evidence" / "trial-001" / "decode.log.txt").stat().st_mode) == 0o600


# --- 7: durations and ports are bounded, as bad input ---------------------------------------------

@pytest.mark.parametrize("kind", ["--systemd", "--cron"])
def test_a_huge_schedule_interval_is_refused_in_one_line(tmp_path, kind):
    """Red team: `--every 99999999999999d --systemd` wrote OnUnitActiveSec=8639999999999913984s, exit 0;
    --cron gave the wrong reason."""
    pb = _playbook(tmp_path)
    line = _one_line_error(_cli("-p", str(pb), "--store", str(tmp_path / "s"), "schedule", "--every",
                                "99999999999999d", kind))
    assert "at most 365d" in line, line
    ok = _cli("-p", str(pb), "--store", str(tmp_path / "s"), "schedule", "--every", "1d", kind)
    assert ok.returncode == 0, ok.stderr


def test_an_ssh_port_out_of_range_is_bad_input(tmp_path):
    """Red team: `ssh = "u@h:99999"` said `port '99999' is not a number`, exit 3 (a connection error)."""
    pb = _playbook(tmp_path, ssh="u@h:99999")
    line = _one_line_error(_cli("-p", str(pb), "--store", str(tmp_path / "s"), "snapshot"))
    assert "port must be 1-65535" in line and "99999" in line, line
    pb = _playbook(tmp_path, ssh="u@h:ssh")
    assert "port must be 1-65535" in _one_line_error(_cli("-p", str(pb), "--store", str(tmp_path / "s"), "snapshot"))


# --- 8: a store path that is a regular file ---------------------------------------------------------

@pytest.mark.parametrize("command", [["snapshots"], ["runs"], ["snapshot"], ["prune", "--keep", "1d"]])
def test_a_store_that_is_a_regular_file_is_one_line_exit_2(tmp_path, command):
    """Red team: `--store FILE snapshots` / `runs` exited 0 with "No snapshots"."""
    pb = _playbook(tmp_path)
    f = tmp_path / "storefile"
    f.write_text("not a store\n")
    line = _one_line_error(_cli("-p", str(pb), "--store", str(f), *command))
    assert "storefile" in line and "not a folder" in line, line
    assert f.read_text() == "not a store\n"


# --- 4: a path that ends in a secret word is not a secret ---------------------------------------------

def test_an_error_about_a_path_ending_in_a_secret_word_keeps_its_reason(tmp_path):
    """Red team: `-p secrets/db_password snapshot` (broken TOML) printed `secrets/db_password: ••••(masked…)`;
    `bundle --check /etc/passwd` printed `FAIL /etc/passwd: ••••(masked…)`."""
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "db_password").write_text("[deployment\nname = 1\n")
    r = subprocess.run([*ENVBISECT, "-p", "secrets/db_password", "--store", str(tmp_path / "s"), "snapshot"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    line = _one_line_error(r)
    assert "secrets/db_password: " in line and "••••" not in line, line
    r = _cli("bundle", "--check", "/etc/passwd")
    assert r.returncode != 0 and "FAIL /etc/passwd: " in r.stdout + r.stderr, (r.stdout, r.stderr)
    assert "••••" not in r.stdout + r.stderr, (r.stdout, r.stderr)


# --- 6: a run of another store is restored from that store --------------------------------------------

def test_a_refusal_for_another_stores_run_points_at_that_store(tmp_path, sshd):
    """Red team: a run of another store (another controller) left its journal on the host; this store's
    refusal said "run `envbisect restore --run ID` first", a command that refuses too (the journal is not
    authenticated by this store). It now says to restore it with the store that ran it; this store's own
    run is still sent to `restore --run ID`."""
    from test_host_safety import Site, cleanup_host_files

    from envbisect.errors import LockHeld
    from envbisect.hosts.journal import HostEditor

    site = Site(tmp_path, sshd.alias, str(sshd.ssh_config))
    try:
        ed = site.editor("run-a", heartbeat_s=0)
        ed.lock()
        ed.begin({("node1", str(site.tree.env("decode")))}, set())
        ed.unlock()  # its lock is gone, its journal is active: as after a crash once the lock went stale
        other = HostEditor(site.dep.playbook, site.dep.transports, tmp_path / "store2" / "runs" / "run-b", "run-b",
                           heartbeat_s=0)
        with pytest.raises(LockHeld) as e:
            other.lock()
        msg = str(e.value)
        assert "run run-a" in msg and "another store" in msg and "with the store (on the controller) that ran it" \
            in msg, msg
        with pytest.raises(LockHeld, match=r"run `envbisect restore --run run-a` first"):
            site.editor("run-c", heartbeat_s=0).lock()  # this store ran it: restore from here
        # and with this store's local journal gone, the host copy it can authenticate still counts
        for p in (site.store / "runs" / "run-a").glob("journal.json"):
            p.unlink()
        with pytest.raises(LockHeld, match=r"run `envbisect restore --run run-a` first"):
            site.editor("run-c", heartbeat_s=0).lock()
    finally:
        site.dep.close()
        cleanup_host_files(site.name)


# --- 3: a header credential masks the credential, not the rest of the diff line -----------------------

def test_diff_of_an_authorization_header_keeps_the_delta_id(tmp_path):
    """Red team: `+ HDR=Authorization: ••••(masked…)••••(masked…)` swallowed `[decode:HDR; …]`."""
    pb = _playbook(tmp_path)
    store = str(tmp_path / "s")
    assert _cli("-p", str(pb), "--store", store, "snapshot", "--label", "good").returncode == 0
    (tmp_path / "decode.serve-env").write_text('A=1\nHDR="Authorization: Basic ZGVwbG95Okh1bnRlcjJQdzl4"\n')
    r = _cli("-p", str(pb), "--store", store, "diff", "--against", "good")
    line = next(ln for ln in r.stdout.splitlines() if "HDR=" in ln)
    assert "ZGVwbG95Okh1bnRlcjJQdzl4" not in r.stdout + r.stderr
    assert line.strip().startswith("+ HDR=Authorization: Basic ••••(masked, sha256:"), line
    assert line.count("••••") == 1 and "[decode:HDR; from snapshot:" in line, line
