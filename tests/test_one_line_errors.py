"""Issue 8, item 5: one clear line and a documented exit status, never a traceback.

Every reproduction from the issue runs the real CLI and checks its stdout/stderr: one line on
stderr, no "Traceback", the status from `envbisect.errors.ExitStatus`. It runs in this process
(`envbisect.cli.app.run` with in-memory streams) unless the process is the point: Ctrl-C and
kill -9 of a running bisection, main()'s crash handler, and TZ or HOME read by a fresh process.
The last-resort handler (a bug) writes a private crash log with secrets masked and prints one line
pointing to it; `--traceback` shows the traceback instead.
"""
from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from test_cli_inprocess import Captured

from envbisect.cli.app import run
from envbisect.errors import ExitStatus, PlaybookError
from envbisect.inputs.playbook import PROBE_REPEAT_MAX, load_playbook
from envbisect.search import Search

def in_process(*args: str) -> subprocess.CompletedProcess:
    """The CLI run in this process (`envbisect.cli.app.run`, tests/test_cli_inprocess.py), its streams
    (the log's included) in memory, as a CompletedProcess with str streams."""
    c = Captured()
    rc = run(list(args), c.env)
    return subprocess.CompletedProcess(list(args), rc, c.out, c.err)


def one_line(r: subprocess.CompletedProcess) -> str:
    """The whole stderr, which must be exactly one line and no traceback."""
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("envbisect: "), lines[0]
    return lines[0]


# --- playbook: probe settings are checked at load ------------------------------------------------

PROBE_HEAD = """
[hosts.a]
ssh = "local"
[services.x]
host = "a"
env_file = "/tmp/x.env"
start = "true"
stop = "true"
health = "http://127.0.0.1:1/health"
[probes.p]
"""


@pytest.mark.parametrize("probe,needle", [
    ('kind = "concurrent"\nurl = "http://127.0.0.1:1/"\nconcurrency = 0', "probes.p.concurrency: must be between 1 and"),
    ('kind = "multi_round"\nurl = "http://127.0.0.1:1/"\nrounds = 0', "probes.p.rounds: must be between 1 and"),
    ('kind = "http"\nurl = "http://127.0.0.1:1/"\nexpect_body = "(unclosed"',
     "probes.p.expect_body: is not a valid regular expression"),
    (f'kind = "command"\ncommand = "true"\nrepeat = {PROBE_REPEAT_MAX + 1}', "probes.p.repeat: must be between 1 and"),
    ('kind = "command"\ncommand = "true"\nrepeat = 0', "probes.p.repeat: must be between 1 and"),
    ('kind = "http"\nurl = "http://127.0.0.1:1/"\ntimeout_s = 0', "probes.p.timeout_s: must be > 0"),
    ('kind = "http"\nurl = "http://127.0.0.1:1/"\nexpect_status = 20', "probes.p.expect_status: must be an HTTP status"),
    ('kind = "http"\nurl = "http://127.0.0.1:1/"\nmethod = "GET /x"', "probes.p.method: must be an HTTP method"),
    ('kind = "http"\nurl = "127.0.0.1:1/"', "probes.p.url: must be an http(s) URL"),
])
def test_bad_probe_settings_are_refused_at_load(tmp_path, probe, needle):
    pb = tmp_path / "pb.toml"
    pb.write_text(PROBE_HEAD + probe + "\n")
    with pytest.raises(PlaybookError, match="probes.p"):
        load_playbook(pb)
    r = in_process("-p", str(pb), "--store", str(tmp_path / "store"), "bisect", "--since", "noon")
    assert r.returncode == ExitStatus.USAGE
    assert needle in one_line(r)
    assert not (tmp_path / "store" / "runs").exists()  # refused before any run, lock or journal


def test_probe_repeat_limit_is_the_search_cap():
    # a probe repeated more often than the search may probe a trial was found only mid-run (after
    # the lock and the journal were taken, leaving the hosts locked): the playbook refuses it now
    assert PROBE_REPEAT_MAX == inspect.signature(Search).parameters["max_probes"].default
    Search(["a"], base_probes=PROBE_REPEAT_MAX)  # the largest accepted value is one the search takes


# --- a live stack for the CLI reproductions -------------------------------------------------------

import contextlib  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import stat  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from clistack import ENVBISECT as _CLI, CliStack, health_endpoint  # noqa: E402
from hosttree import DECODE, make_tree  # noqa: E402

FAILS_ON_BAD = '[probes.p]\nkind = "command"\ncommand = "! grep -q BAD {decode}"\n'


@pytest.fixture(scope="module")
def health():
    with health_endpoint() as url:
        yield url


@pytest.fixture
def stack(tmp_path, health):
    return CliStack(tmp_path, health, FAILS_ON_BAD, name="oneline")


def text(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """The same result with str streams (CliStack returns bytes)."""
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(errors="replace"),
                                       r.stderr.decode(errors="replace"))


def cli(stack, *args: str, check: int | None = None) -> subprocess.CompletedProcess:
    """A command on the stack, in this process."""
    r = in_process("-p", str(stack.playbook), "--store", str(stack.store), *args)
    if check is not None:
        assert r.returncode == check, r.stderr
    return r


def bisected(stack) -> str:
    """A finished bisection (decode:BAD is the culprit); its run id."""
    cli(stack, "snapshot", "--label", "noon", check=0)
    stack.tree.edit("decode", DECODE + "export BAD=1\nexport OTHER=2\n")
    r = cli(stack, "bisect", "--against", "noon", "--json", check=0)
    return json.loads(r.stdout)["run"]


def test_damaged_run_files_are_one_line_in_runs_show_and_revert(stack):
    run_id = bisected(stack)
    run_dir = stack.store / "runs" / run_id
    verdict = run_dir / "verdict.json"
    for damage in ('{"verdict": ', "[1, 2]", '{"trials": 5}', "\x00\xff garbage"):
        verdict.write_bytes(damage.encode())
        r = cli(stack, "runs")
        assert r.returncode == 0 and "damaged" in r.stdout and "Traceback" not in r.stderr, r.stderr
        r = cli(stack, "runs", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)[0]["status"] == "damaged verdict.json"
        r = cli(stack, "show", run_id)
        assert r.returncode == ExitStatus.USAGE and str(verdict) in one_line(r) and "damaged run file" in r.stderr
        r = cli(stack, "revert", "--verdict")
        line = one_line(r)  # the file named, or (valid JSON without a verdict) that there is none
        assert r.returncode == ExitStatus.USAGE and (str(verdict) in line or "verdict none" in line), line
    run_json = run_dir / "run.json"
    doc = json.loads(run_json.read_text())
    for damaged in ({**doc, "deltas_blob": "0" * 64}, {**doc, "deltas_blob": None, "deltas": "x"}):
        run_json.write_text(json.dumps(damaged))
        r = cli(stack, "revert", "decode:BAD", "--run", run_id)
        assert r.returncode == ExitStatus.USAGE and "run.json" in one_line(r), r.stderr
    run_json.write_text('{"created_at": "yesterday", "kind": 7}')  # wrong types: still listed, not a traceback
    r = cli(stack, "runs")
    assert r.returncode == 0 and run_id[:10] in r.stdout and "Traceback" not in r.stderr
    r = cli(stack, "show", "../../etc")
    assert r.returncode == ExitStatus.USAGE and "no run" in one_line(r)


def test_since_year_one_in_a_timezone_east_of_utc(stack):
    env = {**os.environ, "TZ": "Asia/Tokyo"}  # a subprocess: TZ is read by a fresh process
    r = text(stack.cli("diff", "--since", "0001-01-01", env=env))
    assert r.returncode == ExitStatus.USAGE and "time out of range" in one_line(r)
    r = cli(stack, "diff", "--since", "0001-01-01T00:00+09:00")
    assert r.returncode == ExitStatus.USAGE and "time out of range" in one_line(r)


def test_a_nul_in_a_value_is_shown_and_bisected_without_a_traceback(stack):
    stack.tree.edit("decode", DECODE + "export NULV='a\x00b'\n")
    cli(stack, "snapshot", "--label", "noon", check=0)
    stack.tree.edit("decode", DECODE + "export NULV='c\x00d'\nexport BAD=1\n")
    r = cli(stack, "diff", "--against", "noon")
    assert r.returncode == ExitStatus.DELTAS and "Traceback" not in r.stderr, r.stderr
    assert "\x00" not in r.stdout and "decode:BAD" in r.stdout
    assert "\\x00" in r.stdout, r.stdout  # shown as an escape, not dropped
    r = cli(stack, "bisect", "--against", "noon", "--json")
    assert "Traceback" not in r.stderr and r.returncode == ExitStatus.OK, r.stderr
    assert json.loads(r.stdout)["culprits"] == ["decode:BAD"]
    assert "\x00" in stack.tree.env("decode").read_text()  # the operator's file, as it was
    assert not (stack.store / "crash").exists()


def test_5000_nested_command_substitutions(stack):
    cli(stack, "snapshot", "--label", "noon", check=0)
    stack.tree.edit("decode", DECODE + "export DEEP=" + "$(" * 5000 + "\n")
    r = cli(stack, "diff", "--against", "noon")
    assert r.returncode == ExitStatus.DELTAS and "Traceback" not in r.stderr and "RecursionError" not in r.stdout
    assert "not parseable as a serve-env file" in r.stdout  # compared as a whole file, with the reason
    assert not (stack.store / "crash").exists()


def test_bundle_with_a_non_utf8_value(stack, tmp_path):
    cli(stack, "snapshot", "--label", "noon", check=0)
    stack.tree.env("decode").write_bytes(DECODE.encode() + b"export LATIN='caf\xe9'\nexport BAD=1\n")
    run = json.loads(cli(stack, "bisect", "--against", "noon", "--json", check=0).stdout)["run"]
    r = cli(stack, "bundle", "--run", run, "--out", str(tmp_path / "b.tar.gz"))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    r = cli(stack, "bundle", "--check", str(tmp_path / "b.tar.gz"))
    assert r.returncode == 0, r.stdout
    import tarfile

    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        md = tar.extractfile("report.md").read()
    md.decode("utf-8")  # valid UTF-8 ...
    assert b"caf\\xe9" in md  # ... with the byte that was not, visible


def _wait_for(path: Path, needle: str, timeout: float = 60) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if path.exists() and needle in path.read_text(errors="replace"):
            return
        time.sleep(0.1)
    raise AssertionError(f"{needle!r} never appeared in {path}: {path.read_text(errors='replace')[-2000:]}")


def _bisect_child(stack, tmp_path) -> tuple[subprocess.Popen, Path]:
    """A bisection whose probe hangs (sleep) on a slow-probe playbook; stderr to a file."""
    text_ = stack.playbook.read_text().replace('command = "! grep -q BAD', 'command = "sleep 20; ! grep -q BAD')
    stack.playbook.write_text(text_)
    cli(stack, "snapshot", "--label", "noon", check=0)
    stack.tree.edit("decode", DECODE + "export BAD=1\n")
    errf = tmp_path / "bisect.err"
    with open(errf, "wb") as e:
        proc = subprocess.Popen(stack.argv("bisect", "--against", "noon"), stdout=subprocess.DEVNULL, stderr=e,
                                start_new_session=True)
    return proc, errf


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: itself and its probe's sleep


def test_ctrl_c_is_exit_130_and_one_line(stack, tmp_path):
    # typer turned KeyboardInterrupt into a silent exit; main()'s handler was dead code
    proc, errf = _bisect_child(stack, tmp_path)
    try:
        _wait_for(errf, "probing")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == ExitStatus.INTERRUPTED
    finally:
        _kill_group(proc)
    lines = errf.read_text().strip().splitlines()
    assert lines[-1] == "envbisect: interrupted" and "Traceback" not in errf.read_text()
    assert any(line.startswith("To resume, run: envbisect") for line in lines)
    assert "BAD=1" in stack.tree.env("decode").read_text()  # the hosts were put back as they were


def test_restore_when_the_journal_names_a_host_no_longer_in_the_playbook(stack, tmp_path):
    proc, errf = _bisect_child(stack, tmp_path)
    try:
        _wait_for(errf, "probing")
        _kill_group(proc)  # kill -9: the journal stays active
        proc.wait(timeout=30)
    finally:
        _kill_group(proc)
    good = stack.playbook.read_text()
    stack.playbook.write_text(good.replace("node1", "node9"))
    r = cli(stack, "restore")
    assert r.returncode == ExitStatus.USAGE and "node1" in one_line(r), r.stderr
    stack.playbook.write_text(good)
    r = cli(stack, "restore")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "BAD=1" in stack.tree.env("decode").read_text()


# --- the last resort ------------------------------------------------------------------------------

BUG = """
import sys
import envbisect.cli.app as cli
import envbisect.state.store as store
def boom(self):
    raise RuntimeError("bug while holding HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123 and postgres://u:pw9@h/x")
store.Store.list = boom
sys.argv = ["envbisect", *sys.argv[1:]]
cli.main()
"""


def test_a_bug_is_one_line_and_a_private_masked_crash_log(tmp_path):
    r = subprocess.run([sys.executable, "-c", BUG, "--store", str(tmp_path / "s"), "snapshots"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == ExitStatus.INTERNAL == 70
    line = one_line(r)
    assert "internal error (a bug): RuntimeError" in line and "--traceback" in line
    assert "hf_abcdefghij" not in line and "pw9" not in line
    logs = list((tmp_path / "s" / "crash").glob("crash-*.log"))
    assert len(logs) == 1 and str(logs[0]) in line
    assert stat.S_IMODE(logs[0].stat().st_mode) == 0o600
    assert stat.S_IMODE(logs[0].parent.stat().st_mode) == 0o700
    log = logs[0].read_text()
    assert "Traceback (most recent call last)" in log and "RuntimeError" in log and "in boom" in log
    assert "hf_abcdefghij" not in log and "pw9" not in log
    # --traceback: the (masked) traceback on stderr instead, same status
    r = subprocess.run([sys.executable, "-c", BUG, "--store", str(tmp_path / "s"), "--traceback", "snapshots"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 70 and "Traceback (most recent call last)" in r.stderr and "in boom" in r.stderr
    assert "hf_abcdefghij" not in r.stderr and "pw9" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("envbisect: internal error (a bug): RuntimeError")
    assert len(list((tmp_path / "s" / "crash").glob("crash-*.log"))) == 1


@pytest.mark.parametrize("args,needle", [
    (["bogus"], "No such command 'bogus'"),
    (["diff", "--bogus"], "No such option: --bogus"),
    (["bisect", "--leave", "x"], "Invalid value for --leave"),
    (["--connect-attempts", "0", "snapshots"], "--connect-attempts"),
])
def test_bad_arguments_are_one_line_status_2(tmp_path, args, needle):
    r = in_process("--store", str(tmp_path / "s"), *args)
    assert r.returncode == ExitStatus.USAGE and needle in one_line(r)


def test_version_needs_no_command():
    r = in_process("--version")
    assert r.returncode == 0 and r.stdout.startswith("envbisect ") and r.stderr == ""


# --- known_hosts marker lines (a real sshd) -------------------------------------------------------

OTHER_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"


@pytest.mark.parametrize("lines,status,needle", [
    # OpenSSH trusts the plain line and uses the CA for certificates; paramiko cannot check those,
    # so the line is skipped with a warning and the host's own key decides
    (["@cert-authority *.example.com " + OTHER_KEY, "{plain}"], ExitStatus.OK, "@cert-authority lines are not supported"),
    (["@cert-authority * not-a-key", "@bogus-marker x y z", "{plain}"], ExitStatus.OK, "line ignored"),
    # a revoked key is refused, even when a plain line lists it too
    (["@revoked * {key}", "{plain}"], ExitStatus.CONNECTION, "is marked @revoked"),
    (["{plain}", "@revoked [127.0.0.1]:* {key}"], ExitStatus.CONNECTION, "is marked @revoked"),
    # a revocation of some other key changes nothing
    (["@revoked * " + OTHER_KEY, "{plain}"], ExitStatus.OK, None),
])
def test_known_hosts_markers(sshd, tmp_path, lines, status, needle):
    tree = make_tree(tmp_path / "host")
    known = tmp_path / "known_hosts"
    known.write_text("\n".join(l.format(plain=sshd.known_hosts_line, key=sshd.host_key_pub) for l in lines) + "\n")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(re.sub(r"(?m)^(\s*UserKnownHostsFile ).*$", lambda m: m.group(1) + str(known), sshd.config_block()))
    env = {**os.environ, "HOME": str(tmp_path)}  # no ~/.ssh/known_hosts of the real user
    env.pop("SSH_AUTH_SOCK", None)
    r = subprocess.run([*_CLI, "-p", str(tree.playbook(sshd.alias, name="kh-" + os.urandom(4).hex())), "--store",
                        str(tmp_path / "s"), "--ssh-config", str(cfg), "--connect-attempts", "1", "snapshot"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == status, r.stderr
    assert "Traceback" not in r.stderr
    if status == ExitStatus.CONNECTION:
        assert needle in one_line(r) and sshd.host_key_fingerprint in r.stderr
    elif needle:
        assert needle in r.stderr and all(l.startswith("WARNING envbisect.hosts.transport") for l in r.stderr.splitlines())
