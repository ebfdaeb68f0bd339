"""Trust boundaries (issue 22: F1, F5, F12, F13, F14, F15): the operator's machine, the playbook and
the inventory are trusted; each host is trusted for itself only, and values from the hosts are data."""
from __future__ import annotations

import gzip
import json
import os
import shlex
import socket
import stat
import subprocess
import sys
import tarfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from envbisect.report.blocks import Code, Heading, Paragraph, Story, Table, text
from envbisect.report.markdown import render_markdown

HOSTILE_VALUES = ["a`b", "``x``", "`lead", "trail`", "x ``` y", "` `", "a|b`c", "line1\n# heading\n```", " ` "]


def _code_spans(md: str) -> list[str]:
    markdown_it = pytest.importorskip("markdown_it")
    tokens = markdown_it.MarkdownIt("commonmark").enable("table").parse(md)
    out = []
    for tok in tokens:
        for child in tok.children or ():
            if child.type == "code_inline":
                out.append(child.content)
    return out


@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_markdown_code_span_holds_a_backtick_value_intact(value):
    """F15: a value with backticks (or a line break) stays inside its code span, in a paragraph and in a table."""
    story = Story("t", (Heading(1, text("Report")),
                        Paragraph((text("culprit ", Code(text(value)), " then **after**"),)),
                        Table(("key", "value"), ((text("k"), text(Code(text(value)))),))))
    md = render_markdown(story)
    shown = value.replace("\n", " ")
    assert _code_spans(md) == [shown, shown], md
    assert [line for line in md.splitlines() if line.startswith("#")] == ["# Report"], md  # no new block
    markdown_it = pytest.importorskip("markdown_it")  # the text after the span is text, not code
    texts = [c.content for t in markdown_it.MarkdownIt("commonmark").parse(md) for c in (t.children or ())
             if c.type == "text"]
    assert " then **after**" in texts, (md, texts)


# --- F14: names and paths that reach a crontab line or a systemd unit --------------------------

def _cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "envbisect.cli.app", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def _one_line_error(r: subprocess.CompletedProcess, status: int = 2) -> str:
    assert r.returncode == status, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("envbisect: error: "), r.stderr
    return lines[0]


def _playbook_text(name_line: str, env_file: Path) -> str:
    return textwrap.dedent(f"""
        [deployment]
        {name_line}

        [hosts.node1]
        ssh = "local"

        [services.decode]
        host = "node1"
        env_file = "{env_file}"
        start = "true"
        stop = "true"
        health = "http://127.0.0.1:1/health"
        """)


@pytest.mark.parametrize("kind", ["cron", "systemd"])
def test_a_line_break_in_the_deployment_name_is_refused_in_one_line(tmp_path, kind):
    """F14: `[deployment] name = "pd\\n* * * * * touch …"` would have added its own crontab job (or
    unit setting); it is refused when the playbook is loaded: one line, exit 2, nothing printed."""
    (tmp_path / "decode.serve-env").write_text("A=1\n")
    pb = tmp_path / "pd.toml"
    env_file = tmp_path / "decode.serve-env"
    pb.write_text(_playbook_text(r'name = "pd\n* * * * * touch /tmp/pwned-by-envbisect"', env_file))
    r = _cli("-p", str(pb), "--store", str(tmp_path / "store"), "schedule", "--every", "1h", f"--{kind}")
    line = _one_line_error(r)
    assert "deployment.name" in line and "not a deployment name" in line, line
    assert "pwned" not in r.stdout


def test_a_default_name_from_an_odd_file_name_says_where_it_came_from(tmp_path):
    (tmp_path / "decode.serve-env").write_text("A=1\n")
    pb = tmp_path / "my pd;x.toml"
    pb.write_text(_playbook_text("", tmp_path / "decode.serve-env"))
    line = _one_line_error(_cli("-p", str(pb), "--store", str(tmp_path / "store"), "schedule", "--every", "1h"))
    assert "taken from the file name; set [deployment] name" in line, line


def test_a_line_break_in_a_path_of_the_scheduled_command_is_refused(tmp_path):
    """F14: the playbook, store and inventory paths are words of the same crontab/unit line."""
    (tmp_path / "decode.serve-env").write_text("A=1\n")
    odd = tmp_path / "x\n* * * * * touch pwned"
    odd.mkdir()
    pb = odd / "pd.toml"
    pb.write_text(_playbook_text('name = "pd"', tmp_path / "decode.serve-env"))
    for kind in ("--cron", "--systemd"):
        line = _one_line_error(_cli("-p", str(pb), "--store", str(tmp_path / "store"), "schedule", "--every", "1h",
                                    kind))
        assert "line break or control character" in line, line


# --- F12: `bundle --check` of a gzip bomb ------------------------------------------------------

def _gz(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9, mtime=0)


def _bomb(path: Path, members: int, member_bytes: int, claimed: int | None = None) -> Path:
    """A .tar.gz of `members` members of zeros, each a gzip member of its own (concatenated gzip members
    are one stream): a few MB on disk, `members * member_bytes` unpacked. `claimed`: a header that
    says more than what follows."""
    zeros = _gz(bytes(member_bytes))
    with path.open("wb") as out:
        manifest = json.dumps({"members": []}).encode()
        ti = tarfile.TarInfo("manifest.json")
        ti.size, ti.mode = len(manifest), 0o600
        out.write(_gz(ti.tobuf(format=tarfile.GNU_FORMAT) + manifest + bytes(-len(manifest) % 512)))
        for i in range(members):
            ti = tarfile.TarInfo(f"evidence/trial-{i:03d}/zeros.log")
            ti.size, ti.mode = claimed or member_bytes, 0o600
            out.write(_gz(ti.tobuf(format=tarfile.GNU_FORMAT)))
            out.write(zeros)
        out.write(_gz(bytes(1024)))
    return path


def _check_in_child(bundle: Path, limit_bytes: int) -> tuple[subprocess.CompletedProcess, float]:
    """`envbisect bundle --check` in a child whose address space is limited (a check that held the
    members would take the machine's memory) and which reports its resident set before the check and
    its peak after it. The peak is the child's own (VmHWM of its address space), not ru_maxrss: after a
    vfork and exec, Linux carries the parent's peak into the child's ru_maxrss, so a large pytest
    worker would be measured instead of the check."""
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, ({limit_bytes}, {limit_bytes}))
        from envbisect.cli.app import run

        def status_kb(field):
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))

        before = status_kb("VmRSS")
        rc = run(["bundle", "--check", {str(bundle)!r}])
        print("RSS_BEFORE_KB", before, "PEAK_KB", status_kb("VmHWM"), file=sys.stderr)
        sys.exit(rc)
        """)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=bundle.parent)
    return r, time.monotonic() - t0


def _memory_kb(r: subprocess.CompletedProcess) -> tuple[int, int]:
    """(resident before the check, peak of the child) as `_check_in_child`'s child reported them."""
    words = r.stderr.split("RSS_BEFORE_KB")[1].split()
    return int(words[0]), int(words[2])


def test_bundle_check_refuses_a_gzip_bomb_quickly_in_bounded_memory(tmp_path):
    """20 members of 64 MiB of zeros (1.25 GiB unpacked, ~3 MB on disk): refused at the total
    cap, in one line, without holding the members in memory (peak RSS far below one member)."""
    from envbisect.report.bundle import MAX_TOTAL_BYTES

    bomb = _bomb(tmp_path / "bomb.tar.gz", 20, 64 * 1024 * 1024)
    assert bomb.stat().st_size < 8 * 1024 * 1024 and 20 * 64 * 1024 * 1024 > MAX_TOTAL_BYTES
    r, took = _check_in_child(bomb, 1024 * 1024 * 1024)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr[-2000:])
    fails = [line for line in r.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and "refused" in fails[0] and f"more than {MAX_TOTAL_BYTES} bytes" in fails[0], r.stdout
    before_kb, peak_kb = _memory_kb(r)
    assert peak_kb - before_kb < 32 * 1024 and peak_kb < 200 * 1024, (before_kb, peak_kb)
    assert took < 60, took


def test_bundle_check_refuses_a_member_claiming_a_huge_size_at_its_header(tmp_path):
    """A member whose header claims 100 GiB is refused before a byte of it is unpacked."""
    from envbisect.report.bundle import MAX_MEMBER_BYTES

    bomb = _bomb(tmp_path / "claims.tar.gz", 1, 1024 * 1024, claimed=100 * 1024 ** 3)
    r, took = _check_in_child(bomb, 1024 * 1024 * 1024)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr[-2000:])
    fails = [line for line in r.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and f"over the cap of {MAX_MEMBER_BYTES}" in fails[0], r.stdout
    assert took < 30, took


# --- F5: a live lock of a controller on another machine ----------------------------------------

def _gone_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid  # reaped: no process has it (until the kernel hands it out again, long after the test)


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@pytest.fixture
def lock_site(tmp_path, sshd):
    from test_host_safety import Site, cleanup_host_files

    s = Site(tmp_path, sshd.alias, str(sshd.ssh_config))
    yield s
    s.dep.close()
    cleanup_host_files(s.name)


def _plant_holder(site, *, controller: str, boot_id: str, age_s: float = 0.0, run_id: str = "live-run",
                  pid_ns: str = "") -> dict:
    """The lock record a controller on another machine (or another boot) wrote, its heartbeat `age_s` old."""
    held = {"run_id": run_id, "controller": controller, "boot_id": boot_id, "pid_ns": pid_ns, "pid": _gone_pid(),
            "token": uuid.uuid4().hex, "started_at": time.time() - 60, "heartbeat_s": 20}
    site.lock_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    site.lock_file.write_text(json.dumps(held))
    when = time.time() - age_s
    os.utime(site.lock_file, (when, when))
    return held


@pytest.mark.parametrize("where", ["another host name", "same host name, another boot"])
def test_a_live_lock_of_a_controller_on_another_machine_is_not_taken_over(lock_site, where):
    """F5: the holder's pid means nothing on this host or after a reboot of its controller: a fresh
    heartbeat keeps the lock (before: `os.kill(pid)` on the host found no such pid and took it over),
    and `restore` of that run is refused while it runs."""
    from envbisect.errors import LockHeld

    controller = "bastion-2" if where == "another host name" else socket.gethostname()
    other_boot = "0" * 8 + boot_id()[8:] if boot_id() else "another-boot"
    held = _plant_holder(lock_site, controller=controller, boot_id=other_boot)
    ed = lock_site.editor("run-new", heartbeat_s=0)
    with pytest.raises(LockHeld, match=r"locked by run live-run .*--break-lock"):
        ed.lock()
    restorer = lock_site.editor("run-restore", heartbeat_s=0)
    with pytest.raises(LockHeld, match=r"run live-run is still running"):
        restorer.lock(restoring="live-run")
    assert json.loads(lock_site.lock_file.read_text())["token"] == held["token"]  # still the holder's
    # a stale heartbeat is taken over as before
    when = time.time() - 10
    os.utime(lock_site.lock_file, (when, when))
    ed = lock_site.editor("run-new", heartbeat_s=0, stale_after_s=2)
    notes = ed.lock()
    assert any("took over the stale lock of run live-run" in n for n in notes), notes
    ed.unlock()


def test_a_lock_of_this_machine_and_boot_whose_pid_is_gone_is_taken_over_at_once(lock_site):
    """F5: only a record naming this controller's host name, boot id and pid namespace has its pid
    checked, here."""
    if not boot_id() or not _pid_ns():
        pytest.skip("no /proc/sys/kernel/random/boot_id or /proc/self/ns/pid here")
    _plant_holder(lock_site, controller=socket.gethostname(), boot_id=boot_id(), pid_ns=_pid_ns())
    ed = lock_site.editor("run-new", heartbeat_s=0)
    notes = ed.lock()
    assert any("took over the stale lock of run live-run" in n for n in notes), notes
    ed.unlock()


# --- F1: a forged journal on one host ----------------------------------------------------------

class TwoHosts:
    """A deployment on two real sshd servers, each with a HOME of its own (as two machines would
    have: the host copies of the journal and lock live under ~/.envbisect): prefill on host a,
    decode on host b."""

    def __init__(self, tmp_path: Path, sshd, sshd2, health: str):
        from hosttree import make_tree
        from sshd import write_ssh_config

        self.tmp = tmp_path
        self.t1, self.t2 = make_tree(tmp_path / "a"), make_tree(tmp_path / "b")
        self.home = {h: tmp_path / f"home-{h}" for h in ("a", "b")}
        python = {}
        for h, home in self.home.items():
            home.mkdir()
            py = tmp_path / f"python-{h}"
            py.write_text(f"#!/bin/sh\nHOME={shlex.quote(str(home))} exec {shlex.quote(sys.executable)} \"$@\"\n")
            py.chmod(0o755)
            python[h] = py
        self.cfg = write_ssh_config(tmp_path / "ssh_config", [sshd, sshd2])
        self.name = "trust-" + uuid.uuid4().hex[:8]
        self.store = tmp_path / "store"
        self.playbook = tmp_path / "two.toml"
        self.playbook.write_text(textwrap.dedent(f"""
            [deployment]
            name = "{self.name}"
            [hosts.a]
            ssh = "{sshd.alias}"
            python = "{python['a']}"
            [hosts.b]
            ssh = "{sshd2.alias}"
            python = "{python['b']}"
            [services.prefill]
            host = "a"
            env_file = "{self.t1.env('prefill')}"
            start = "true"
            stop = "true"
            health = "{health}"
            [services.decode]
            host = "b"
            env_file = "{self.t2.env('decode')}"
            start = "true"
            stop = "true"
            health = "{health}"
            [restart]
            order = ["prefill", "decode"]
            poll_interval_s = 0.1
            health_timeout_s = 10
            """))

    def journal_file(self, host: str) -> Path:
        return self.home[host] / ".envbisect" / f"{self.name}.journal.json"

    def made_file(self, host: str) -> Path:
        return self.home[host] / ".envbisect" / f"{self.name}.made.json"

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "envbisect.cli.app", "-p", str(self.playbook), "--store",
                               str(self.store), "--ssh-config", str(self.cfg), *args], capture_output=True, text=True,
                              timeout=120, cwd=self.tmp)

    def child(self, code: str, **env: str) -> subprocess.Popen:
        prelude = textwrap.dedent(f"""
            from pathlib import Path
            from envbisect.runs.deployment import ConnectOptions, Deployment
            from envbisect.hosts.journal import HostEditor
            from envbisect.state.configuration import TargetState
            from envbisect.inputs.playbook import load_playbook
            from envbisect.state.store import Store
            dep = Deployment(load_playbook({str(self.playbook)!r}), Store({str(self.store)!r}),
                             ConnectOptions(ssh_config={str(self.cfg)!r}))
            PREFILL, DECODE = {str(self.t1.env('prefill'))!r}, {str(self.t2.env('decode'))!r}
            """)
        return subprocess.Popen([sys.executable, "-c", prelude + textwrap.dedent(code)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, **env}, cwd=self.tmp)


@pytest.fixture
def two_hosts(tmp_path, sshd, sshd2):
    from clistack import health_endpoint

    with health_endpoint() as health:
        yield TwoHosts(tmp_path, sshd, sshd2, health)


def _forge(site: TwoHosts, run_id: str, target: Path) -> None:
    """What a compromised host a leaves behind: a journal in envbisect's format (no valid HMAC: a
    forger has no key) that claims host b's `target` existed, and a made.json whose null entry says
    "absent" is a state envbisect made, so the compare-and-swap passes for a file not there yet."""
    import base64

    payload = b"* * * * * root touch /tmp/pwned-by-a-forged-journal\n"
    doc = {"format": 1, "run_id": run_id, "deployment": site.name, "created_at": time.time(), "state": "active",
           "kind": "journal", "host": "a", "mac": "0" * 64, "conflicts": [],
           "hosts": {"b": {"files": {str(target): {"exists": True, "mode": 0o644, "uid": os.getuid(),
                                                   "gid": os.getgid(), "mtime_ns": 0, "atime_ns": 0,
                                                   "content_b64": base64.b64encode(payload).decode()}},
                           "repos": {}}}}
    made = {"format": 1, "run_id": run_id, "hosts": {"b": {"files": {str(target): [None]}, "repos": {}}}}
    site.journal_file("a").parent.mkdir(mode=0o700, exist_ok=True)
    site.journal_file("a").write_text(json.dumps(doc))
    site.made_file("a").write_text(json.dumps(made))


@pytest.mark.parametrize("run_id", ["20261204T120000-abc123", "../../../outside-the-store"])
def test_a_forged_journal_on_one_host_writes_nothing_on_the_other_nor_outside_the_store(two_hosts, run_id):
    """F1 (HIGH): with no journal in the local store, `restore` used the first host copy it found for
    every host: a journal forged on host a wrote a file on host b (a stand-in for /etc/cron.d/pwn),
    and a run id `../../…` made a folder outside the store. Now: one line, exit 2, nothing written."""
    site = two_hosts
    target = site.t2.root / "cron.d" / "pwn"
    target.parent.mkdir()
    _forge(site, run_id, target)
    outside = (site.store / "runs" / run_id).resolve()
    before_a, before_b = site.t1.env("prefill").read_bytes(), site.t2.env("decode").read_bytes()
    for args in (["restore"], ["restore", "--run", run_id]):
        r = site.cli(*args)
        line = _one_line_error(r)
        assert "not authenticated" in line or "is not a run id" in line, line
        assert not target.exists(), f"{args}: restore wrote on host b from host a's journal"
        assert not outside.exists() or outside.is_relative_to(site.store.resolve()), outside
    assert not (site.tmp / "outside-the-store").exists()
    r = site.cli("restore")
    assert "a: the journal copy on the host is not authenticated" in r.stderr, r.stderr
    assert (site.t1.env("prefill").read_bytes(), site.t2.env("decode").read_bytes()) == (before_a, before_b)


CRASHING_TWO_HOST_RUN = """
    ed = HostEditor(dep.playbook, dep.transports, Path({run_dir!r}), "crashed-run")
    ed.lock()
    ed.begin({{("a", PREFILL), ("b", DECODE)}}, set())
    ed.apply(TargetState({{("a", PREFILL): b"export TRIAL=1\\n", ("b", DECODE): b"export TRIAL=2\\n"}}, {{}}))
    print("applied", flush=True)
    import os
    os.kill(os.getpid(), 9)  # killed after its edits, before anything is put back
"""


def _meta(path: Path) -> tuple:
    st = os.stat(path)
    return path.read_bytes(), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns


def test_a_genuine_crash_restores_from_the_authenticated_host_copies(two_hosts):
    """F1: a run killed with SIGKILL after its edits, whose local store then lost the journal, is still
    undone byte-identically from the host copies: each host's copy holds its own files only (no
    other host's originals, secrets included) and carries an HMAC with the store's key (0600)."""
    site = two_hosts
    before = _meta(site.t1.env("prefill")), _meta(site.t2.env("decode"))
    run_dir = site.store / "runs" / "crashed-run"
    p = site.child(CRASHING_TWO_HOST_RUN.format(run_dir=str(run_dir)))
    out, err = p.communicate(timeout=120)
    assert p.returncode == -9 and "applied" in out, err
    assert site.t1.env("prefill").read_bytes() == b"export TRIAL=1\n"
    assert site.t2.env("decode").read_bytes() == b"export TRIAL=2\n"
    key = site.store / "journal.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
    for h, mine, other in (("a", site.t1.env("prefill"), site.t2.env("decode")),
                           ("b", site.t2.env("decode"), site.t1.env("prefill"))):
        doc = json.loads(site.journal_file(h).read_text())
        assert set(doc["hosts"]) == {h} and str(mine) in doc["hosts"][h]["files"], doc
        assert str(other) not in site.journal_file(h).read_text()
        assert doc["host"] == h and len(doc["mac"]) == 64
        assert set(json.loads(site.made_file(h).read_text())["hosts"]) <= {h}
    # the local store lost the journal (a disk replaced, a store folder deleted): only the hosts have it
    for f in ("journal.json", "made.json"):
        (run_dir / f).unlink()
    # host a's genuine copy put on host b does not speak for b: refused, nothing restored
    b_copy = site.journal_file("b").read_bytes()
    site.journal_file("b").write_bytes(site.journal_file("a").read_bytes())
    line = _one_line_error(site.cli("restore"))
    assert "b: the journal copy on the host was written for journal of host 'a'" in line, line
    assert site.t2.env("decode").read_bytes() == b"export TRIAL=2\n"
    site.journal_file("b").write_bytes(b_copy)
    r = site.cli("restore")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert (_meta(site.t1.env("prefill")), _meta(site.t2.env("decode"))) == before
    assert not site.journal_file("a").exists() and not site.journal_file("b").exists()


def test_the_local_journal_is_authoritative_over_host_copies(two_hosts):
    """F1: with the run's journal in the local store, a host copy (here forged) is not even read."""
    site = two_hosts
    before = _meta(site.t1.env("prefill")), _meta(site.t2.env("decode"))
    run_dir = site.store / "runs" / "crashed-run"
    p = site.child(CRASHING_TWO_HOST_RUN.format(run_dir=str(run_dir)))
    _, err = p.communicate(timeout=120)
    assert p.returncode == -9, err
    target = site.t2.root / "cron.d" / "pwn"
    target.parent.mkdir()
    _forge(site, "crashed-run", target)  # over host a's genuine copy
    r = site.cli("restore")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert (_meta(site.t1.env("prefill")), _meta(site.t2.env("decode"))) == before
    assert not target.exists()


# --- F13: a hard-linked env file ---------------------------------------------------------------

@pytest.fixture
def ssh_site(tmp_path, sshd):
    from test_host_safety import Site, cleanup_host_files

    s = Site(tmp_path, sshd.alias, str(sshd.ssh_config))
    yield s
    s.dep.close()
    cleanup_host_files(s.name)


def test_a_hard_linked_env_file_is_refused_before_any_edit(ssh_site):
    """F13: the atomic rename gave the edited name a new file while its other name (the one a service
    may start from) kept the old content, and restore could not join them again. Refused before the
    first edit, naming the links; both names still one file, unchanged."""
    from envbisect.errors import UsageError
    from envbisect.state.configuration import TargetState

    env = ssh_site.tree.env("decode")
    other = env.with_name("decode.serve-env.current")
    os.link(env, other)
    before = _meta(env)
    ed = ssh_site.editor("run-linked", heartbeat_s=0)
    ed.lock()
    try:
        with pytest.raises(UsageError, match=r"decode.serve-env: has 2 hard links .*refusing before any edit"):
            ed.begin({("node1", str(env))}, set())
            ed.apply(TargetState({("node1", str(env)): b"export TRIAL=1\n"}, {}))
    finally:
        ed.abandon()
    assert _meta(env) == before and os.stat(env).st_ino == os.stat(other).st_ino
    assert os.stat(env).st_nlink == 2


def test_a_file_hard_linked_during_the_run_stops_it_and_restore_leaves_it(ssh_site):
    """F13: linked after the journal was read: the next edit is someone else's change (a conflict),
    and restore leaves it as found (listed), never splitting the names."""
    from envbisect.errors import HostConflict
    from envbisect.state.configuration import TargetState

    env = ssh_site.tree.env("decode")
    ed = ssh_site.editor("run-linked-later", heartbeat_s=0)
    ed.lock()
    ed.begin({("node1", str(env))}, set())
    ed.apply(TargetState({("node1", str(env)): b"export TRIAL=1\n"}, {}))
    other = env.with_name("decode.serve-env.current")
    os.link(env, other)
    with pytest.raises(HostConflict, match="hard-linked during the run"):
        ed.apply(TargetState({("node1", str(env)): b"export TRIAL=2\n"}, {}))
    conflicts = ed.restore()
    assert [c["path"] for c in conflicts] == [str(env)] and "hard-linked" in conflicts[0]["why"]
    ed.finish()
    ed.unlock()
    assert os.stat(env).st_ino == os.stat(other).st_ino and env.read_bytes() == b"export TRIAL=1\n"


# --- a controller in another pid namespace of the same machine ----------------------------------

def _pid_ns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def test_a_fresh_lock_of_another_pid_namespace_is_not_taken_over(lock_site):
    """Red team: a record naming this host name and boot id, whose pid is not visible here, was read as
    a dead holder, though a container with the host's UTS and boot id but private pids wrote it. Its
    pid is checked only when it names this pid namespace too; otherwise the heartbeat decides."""
    from envbisect.errors import LockHeld

    if not boot_id() or not _pid_ns():
        pytest.skip("no boot id or pid namespace link here")
    held = _plant_holder(lock_site, controller=socket.gethostname(), boot_id=boot_id(), pid_ns="pid:[1]")
    with pytest.raises(LockHeld, match=r"locked by run live-run .*--break-lock"):
        lock_site.editor("run-new", heartbeat_s=0).lock()
    with pytest.raises(LockHeld, match=r"run live-run is still running"):
        lock_site.editor("run-restore", heartbeat_s=0).lock(restoring="live-run")
    assert json.loads(lock_site.lock_file.read_text())["token"] == held["token"]
    # a record of an older controller without a pid namespace is judged by its heartbeat as well
    del held["pid_ns"]
    lock_site.lock_file.write_text(json.dumps(held))
    with pytest.raises(LockHeld, match=r"locked by run live-run"):
        lock_site.editor("run-new", heartbeat_s=0).lock()
    assert json.loads(lock_site.lock_file.read_text())["token"] == held["token"]


def test_restore_from_another_pid_namespace_is_refused_while_the_run_lives(tmp_path):
    """Red team (HIGH): `unshare -p -f --mount-proc envbisect restore` (same store, host name and boot id,
    private pids) undid a live run: it took the live lock over and rewrote the hosts mid-run."""
    import shutil

    from test_host_safety import CRASHING_RUN, Site, cleanup_host_files

    if not shutil.which("unshare") or os.geteuid() != 0:
        pytest.skip("needs root and util-linux unshare")
    probe = subprocess.run(["unshare", "-p", "-f", "--mount-proc", "true"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"unshare -p is not allowed here: {probe.stderr.decode().strip()}")
    site = Site(tmp_path, "local", None)
    with open(site.playbook, "a") as f:
        f.write('\n[probes.p]\nkind = "command"\ncommand = "true"\n')
    p = site.child(CRASHING_RUN.format(run_dir=str(site.store / "runs" / "crashed-run")))
    try:
        assert p.stdout.readline().strip() == "applied"
        cli = ["unshare", "-p", "-f", "--mount-proc", sys.executable, "-m", "envbisect.cli.app",
               "-p", str(site.playbook), "--store", str(site.store)]
        for args in (["restore", "--dry-run"], ["restore"], ["restore", "--run", "crashed-run"]):
            out = subprocess.run(cli + args, capture_output=True, text=True, timeout=120)
            assert out.returncode == 2, (args, out.stdout, out.stderr)
            assert len(out.stderr.strip().splitlines()) == 1, out.stderr
            assert "run crashed-run is still running" in out.stderr, out.stderr
            assert site.tree.env("decode").read_text() == "export TRIAL=1\n"  # the live run's trial stays
            assert json.loads(site.lock_file.read_text())["run_id"] == "crashed-run"
        # a bisect from there names the live run as the lock's holder (before: "left changes ... not undone
        # yet; run `envbisect restore --run crashed-run` first", as if it had crashed)
        out = subprocess.run(cli + ["bisect"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, (out.stdout, out.stderr)
        assert "is locked by run crashed-run" in out.stderr and "restore" not in out.stderr, out.stderr
        assert site.tree.env("decode").read_text() == "export TRIAL=1\n"
    finally:
        p.kill()
        p.wait()
        site.dep.close()
        cleanup_host_files(site.name)
