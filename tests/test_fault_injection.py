"""Fault injection on the simulated PD deployment (issue 8, item 6): a controller SIGKILLed at every
kind of mutation point, sshd down mid-trial, a probe that hangs forever, a service that never becomes
healthy, stop/start commands that hang, an operator editing a file mid-run, two controllers racing
for the lock, 64-concurrent probes over several trials. Each ends in a bounded, clear outcome with
nothing lost. The SIGKILL points use the test-only hook ENVBISECT_TEST_CRASH_AT (envbisect/hosts/faults.py).
See docs/safety.md."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from envbisect.runs.bisect import BisectOptions, BisectRun
from envbisect.runs.deployment import ConnectOptions, Deployment
from envbisect.errors import ExitStatus, HostConflict
from envbisect.inputs.playbook import load_playbook
from envbisect.sim.stack import SERVICES
from envbisect.state.store import Store

from sshd import SSHD, start_sshd
from test_bisect_sim import ENVBISECT, INNOCENT, Scenario, plant, scenario, tree_fingerprint  # noqa: F401 - fixture

pytestmark = [pytest.mark.sim, pytest.mark.slow]
BAD = ("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "256")
BAD_ID = "decode:SGLANG_SM120_MMA_TARGET_CTAS"


def commit(sim, text: str) -> None:
    (sim.src_dir / "VERSION").write_text(text)
    subprocess.run(["git", "-C", str(sim.src_dir), "commit", "-qam", text.strip()], check=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@x"})


def fingerprint(sim) -> dict:
    """Every byte, mode, owner and mtime, the repo's work-tree files' too (the files a checkout
    rewrote get their recorded mtimes back at the restore, also after a SIGKILL), HEAD and branch."""
    return tree_fingerprint(sim)


def all_healthy(sim) -> bool:
    return all(sim.is_healthy(svc) for svc in SERVICES)


def edit_playbook(s: Scenario, old: str, new: str) -> None:
    text = s.sim.playbook.read_text()
    assert old in text, old
    s.sim.playbook.write_text(text.replace(old, new, 1))


def newest_run(s: Scenario) -> str:
    return max((s.store / "runs").iterdir(), key=lambda p: p.stat().st_mtime).name


def no_process(marker: str) -> bool:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode != 0


# --- SIGKILL at every kind of mutation point, then `restore` ---------------------------------------
# The run: 3 env deltas + 1 git delta. Trial 1 (current) edits nothing and restarts everything
# (stop:1-3, start:1-3); trial 2 (baseline) records what it will make (journal:3 local, journal:4 on
# the host), writes two files (write:1, write:2) and checks out the old commit (checkout:1).
# journal:1 / journal:2 are the local and host copies of the journal itself.
POINTS = ["journal:1", "journal:2", "journal:4", "write:1", "write:2", "checkout:1", "stop:2", "start:2", "start:4"]


@pytest.mark.parametrize("point", POINTS)
def test_sigkill_at_a_mutation_point_then_restore_is_byte_identical(scenario, point):
    s = scenario()
    s.baseline()
    commit(s.sim, "v2\n")
    plant(s.sim, INNOCENT[:2] + [BAD])
    before = fingerprint(s.sim)
    r = s.cli("bisect", "--against", "good", "--probe", "e2e", env={**os.environ, "ENVBISECT_TEST_CRASH_AT": point},
              timeout=120)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-2000:])
    run_id = newest_run(s)
    if point != "journal:1":
        # nobody takes over a run that may have left changes: a new run is refused with the way out
        r = s.cli("bisect", "--against", "good", "--probe", "e2e", timeout=120)
        assert r.returncode == ExitStatus.USAGE and f"envbisect restore --run {run_id}" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    r = s.cli("restore", "--run", run_id, "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["restored"] is (point != "journal:1")
    assert fingerprint(s.sim) == before
    assert all_healthy(s.sim)
    r = s.cli("restore", "--json", timeout=60)
    assert json.loads(r.stdout)["restored"] is False  # nothing left to undo


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(kv.split("=", 1) for kv in raw.decode("utf-8", "replace").split("\0") if "=" in kv)


def test_sigkill_during_a_parallel_start_then_restore_runs_the_original_everywhere(scenario, sshd):
    """issue 38: prefill and decode start at once; the controller dies while one engine of the
    group is starting and the other's start is about to be sent. `restore` puts every byte back and
    leaves every service running the original configuration (its planted values in its environ)."""
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    edit_playbook(s, 'order = ["prefill", "decode", "router"]', 'order = [["prefill", "decode"], "router"]')
    s.baseline()
    planted = INNOCENT[:2] + [BAD]
    plant(s.sim, planted)
    before = fingerprint(s.sim)
    # trial 1 starts prefill + decode (start:1, start:2) and the router (start:3); trial 2's group
    # sends start:4 and start:5 side by side: the kill comes between them
    r = s.cli("bisect", "--against", "good", "--probe", "e2e", env={**os.environ, "ENVBISECT_TEST_CRASH_AT": "start:5"},
              timeout=120)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-2000:])
    r = s.cli("restore", "--run", newest_run(s), "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["restored"] is True and json.loads(r.stdout)["co_restart_ok"] is True
    assert fingerprint(s.sim) == before
    assert all_healthy(s.sim)
    pids = s.sim.running_pids()
    assert set(pids) >= set(SERVICES)
    for service, key, value in planted:
        assert environ(pids[service]).get(key) == value, (service, key)


# --- SSH and sshd ------------------------------------------------------------------------------------

def restart_sshd_later(server, delay: float) -> threading.Timer:
    def start() -> None:
        server.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(server.sshd_config)], stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    t = threading.Timer(delay, start)
    t.start()
    return t


def take_sshd_down(server) -> None:
    """Listener and every connection gone: the host is unreachable."""
    children = subprocess.run(["pgrep", "-P", str(server.proc.pid)], capture_output=True, text=True).stdout.split()
    server.stop()
    for pid in children:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_sshd_down_for_a_few_seconds_mid_trial(scenario, tmp_path):
    """sshd (listener and connections) gone for 3 s while trial 3 probes: that trial is unresolved,
    envbisect reconnects within its retries, finds the culprit and restores."""
    server = start_sshd(tmp_path / "own-sshd", alias="downhost")
    try:
        s = scenario(ssh=server.alias, ssh_config=str(server.ssh_config))
        s.baseline()
        plant(s.sim, INNOCENT[:2] + [BAD])
        before = tree_fingerprint(s.sim)
        state = {"armed": False, "timer": None}

        def on_event(kind, data):
            if kind == "trial-start" and data["n"] == 3:
                state["armed"] = True
            if kind == "step" and data["message"].startswith("probing") and state["armed"] and not state["timer"]:
                take_sshd_down(server)
                state["timer"] = restart_sshd_later(server, 3)

        dep = Deployment(load_playbook(s.sim.playbook), Store(s.store),
                         ConnectOptions(ssh_config=str(server.ssh_config), attempts=5, backoff_s=0.5))
        t0 = time.monotonic()
        with dep:
            r = BisectRun(dep, BisectOptions(probe="e2e"), on_event=on_event).start(dep.diff(against="good"))
        assert r.trials[2].outcome == "unresolved" and "lost the ssh connection" in r.trials[2].reason
        assert r.verdict.kind == "culprit" and r.culprit_deltas == (BAD_ID,)
        assert time.monotonic() - t0 < 120
        state["timer"].join()
        assert tree_fingerprint(s.sim) == before
    finally:
        server.stop()


def test_sshd_down_longer_than_the_retries_then_restore(scenario, tmp_path):
    """sshd gone for 8 s mid-trial and `envbisect bisect --connect-attempts 1`: the run ends with one
    line (exit 3) and keeps the journal; once sshd is back, `restore` makes the tree byte-identical."""
    server = start_sshd(tmp_path / "own-sshd", alias="downhost")
    try:
        s = scenario(ssh=server.alias, ssh_config=str(server.ssh_config))
        s.baseline()
        plant(s.sim, INNOCENT[:2] + [BAD])
        before = tree_fingerprint(s.sim)
        p = subprocess.Popen([*ENVBISECT, "-p", str(s.sim.playbook), "--store", str(s.store), "--ssh-config",
                              str(server.ssh_config), "--connect-attempts", "1", "bisect", "--against", "good",
                              "--probe", "e2e"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen = ""
        while "probing" not in seen.split("trial 3", 1)[-1] or "trial 3" not in seen:
            line = p.stderr.readline()
            assert line, seen
            seen += line
        take_sshd_down(server)
        timer = restart_sshd_later(server, 8)
        _, rest = p.communicate(timeout=120)
        assert p.returncode == ExitStatus.CONNECTION, rest
        errors = [l for l in rest.splitlines() if l.startswith("envbisect: error:")]
        assert len(errors) == 1 and "cannot connect" in errors[0]
        assert "the journal is kept" in rest
        timer.join()
        time.sleep(0.5)
        r = s.cli("restore", "--json", timeout=120)
        assert r.returncode == 0 and json.loads(r.stdout)["restored"] is True, r.stderr
        assert tree_fingerprint(s.sim) == before
    finally:
        server.stop()


# --- hangs and a service that never becomes healthy ---------------------------------------------------

def test_probe_that_hangs_forever_is_a_bounded_failure(scenario):
    s = scenario()
    decode = s.sim.env_file("decode")
    edit_playbook(s, "[probes.e2e]", f"""[probes.hangs]
kind = "command"
vantage = "node1"
command = "grep -q SGLANG_SM120_MMA_TARGET_CTAS=256 {decode} && exec sleep 987651; exit 0"
timeout_s = 1.5

[probes.e2e]""")
    s.baseline()
    plant(s.sim, INNOCENT[:2] + [BAD])
    before = tree_fingerprint(s.sim)
    t0 = time.monotonic()
    r = s.bisect(probe="hangs")
    assert r.verdict.kind == "culprit" and r.culprit_deltas == (BAD_ID,)
    hung = [t for t in r.trials if t.outcome == "fail"]
    assert hung and all("no exit within 1.5 s (hang)" in t.reason for t in hung)
    assert time.monotonic() - t0 < 90
    assert no_process("sleep 987651")  # the hung probe was killed, not left behind
    assert tree_fingerprint(s.sim) == before


def test_service_that_never_becomes_healthy_is_a_start_failure(scenario):
    s = scenario()
    edit_playbook(s, "health_timeout_s = 30", "health_timeout_s = 3")
    s.baseline()
    plant(s.sim, INNOCENT[:2] + [("decode", "SIM_LOAD_SECONDS", "100000")], restart=False)
    before = tree_fingerprint(s.sim)
    r = s.bisect(probe="e2e")
    assert r.verdict.kind == "culprit" and r.culprit_deltas == ("decode:SIM_LOAD_SECONDS",)
    failed = [t for t in r.trials if t.outcome == "start-failure"]
    assert failed and all("decode not healthy after 3 s" in t.reason for t in failed)
    assert tree_fingerprint(s.sim) == before


@pytest.mark.parametrize("which,service", [("stop", "router"), ("start", "decode")])
def test_stop_or_start_command_that_hangs_is_bounded(scenario, which, service):
    s = scenario()
    flag = s.sim.root / f"hang-{which}"
    root = s.sim.root
    hung = f"sleep {987652 if which == 'stop' else 987653}"  # each case its own: they may run at once
    edit_playbook(s, "poll_interval_s = 0.2", "poll_interval_s = 0.2\ncommand_timeout_s = 2")
    edit_playbook(s, f'{which} = "{root}/bin/{which} {service}"',
                  f'{which} = "if [ -e {flag} ]; then rm -f {flag}; exec {hung}; fi; {root}/bin/{which} {service}"')
    s.baseline()
    plant(s.sim, INNOCENT[:2] + [BAD])
    before = tree_fingerprint(s.sim)

    def on_event(kind, data):
        if kind == "trial-start" and data["n"] == 2:
            flag.touch()  # trial 2's (only) stop/start of that service hangs

    with s.deployment() as dep:
        r = BisectRun(dep, BisectOptions(probe="e2e"), on_event=on_event).start(dep.diff(against="good"))
    assert r.trials[1].outcome == "unresolved" and "timed out after 2" in r.trials[1].reason, r.trials[1]
    assert r.verdict.kind == "culprit" and r.culprit_deltas == (BAD_ID,)
    assert no_process(hung)
    assert tree_fingerprint(s.sim) == before and all_healthy(s.sim)


# --- people and other controllers ---------------------------------------------------------------------

def test_operator_edits_a_file_mid_run(scenario):
    """The operator adds a hotfix line to decode.serve-env while trial 3 restarts the stack: the run
    stops with one line naming the file, their edit stays, everything else is put back and
    co-restarted, the conflict is recorded in the run, and no trial ran on their configuration."""
    s = scenario()
    s.baseline()
    plant(s.sim, INNOCENT[:3] + [BAD])
    before = tree_fingerprint(s.sim)
    decode = s.sim.env_file("decode")
    seen = {"n": 0, "left": None}

    def on_event(kind, data):
        if kind == "trial-start":
            seen["n"] = data["n"]
        if kind == "step" and data["message"] == "starting decode" and seen["n"] == 3 and seen["left"] is None:
            seen["left"] = decode.read_text() + "export SGLANG_HOTFIX=1\n"
            decode.write_text(seen["left"])

    with s.deployment() as dep:
        run = BisectRun(dep, BisectOptions(probe="e2e"), on_event=on_event)
        with pytest.raises(HostConflict) as exc:
            run.start(dep.diff(against="good"))
    line = str(exc.value)
    assert "\n" not in line and f"{decode}: changed by someone else during the run" in line
    assert exc.value.exit_status == ExitStatus.CONFLICT
    assert decode.read_text() == seen["left"]  # their change is left in place
    after = tree_fingerprint(s.sim)
    assert {k: v for k, v in after.items() if k != str(decode)} == {k: v for k, v in before.items() if k != str(decode)}
    assert all_healthy(s.sim)  # the rest was put back and co-restarted
    run_dir = s.store / "runs" / run.run_id
    conflicts = json.loads((run_dir / "conflicts.json").read_text())
    assert [c["path"] for c in conflicts] == [str(decode)]
    assert len((run_dir / "trials.jsonl").read_text().splitlines()) == 2  # trial 3 never counted
    events = (run_dir / "events.jsonl").read_text()
    assert "left as found" in events and "decode.serve-env" in events
    assert json.loads((run_dir / "journal.json").read_text())["state"] == "closed"


def test_operator_chmods_a_file_mid_run(scenario):
    """The operator makes decode.serve-env 0600 while trial 3 restarts the stack: the run stops as
    for an edit, the file's bytes go back to the original and their mode stays, and the conflict is
    recorded (blind red-team, signals: the restore put the mode back to 0644 and said nothing)."""
    s = scenario()
    s.baseline()
    plant(s.sim, INNOCENT[:3] + [BAD])
    before = tree_fingerprint(s.sim)
    decode = s.sim.env_file("decode")
    original = decode.read_bytes()
    assert decode.stat().st_mode & 0o777 != 0o600
    seen = {"n": 0, "done": False}

    def on_event(kind, data):
        if kind == "trial-start":
            seen["n"] = data["n"]
        if kind == "step" and data["message"] == "starting decode" and seen["n"] == 3 and not seen["done"]:
            seen["done"] = True
            os.chmod(decode, 0o600)

    with s.deployment() as dep:
        run = BisectRun(dep, BisectOptions(probe="e2e"), on_event=on_event)
        try:
            run.start(dep.diff(against="good"))
            stopped = None
        except HostConflict as e:
            stopped = e
    assert seen["done"]
    assert decode.read_bytes() == original and decode.stat().st_mode & 0o777 == 0o600
    after = tree_fingerprint(s.sim)
    assert {k: v for k, v in after.items() if k != str(decode)} == {k: v for k, v in before.items() if k != str(decode)}
    assert all_healthy(s.sim)
    run_dir = s.store / "runs" / run.run_id
    conflicts = json.loads((run_dir / "conflicts.json").read_text())
    assert [c["path"] for c in conflicts][-1:] == [str(decode)], conflicts
    events = (run_dir / "events.jsonl").read_text()
    assert "mode" in events and "0600" in events, events[-2000:]
    assert stopped is None or stopped.exit_status == ExitStatus.CONFLICT


@pytest.mark.parametrize("command, sig", [("revert", signal.SIGTERM), ("revert", signal.SIGINT),
                                          ("apply", signal.SIGTERM), ("apply", signal.SIGINT)])
def test_revert_interrupted_puts_the_hosts_back_before_releasing_the_lock(scenario, command, sig):
    """Reproduction: `revert`/`apply` released the lock on Ctrl-C while their edits were live, and had
    no SIGTERM handling. Interrupted mid co-restart, the change is undone, then the lock released;
    the exit is 130 (interrupted)."""
    s = scenario()
    s.baseline()
    plant(s.sim, INNOCENT[:1] + [BAD])
    r = s.cli("bisect", "--against", "good", "--probe", "e2e", "--json", timeout=180)
    assert r.returncode == 0, r.stderr
    if command == "apply":  # apply puts back a delta that was reverted: revert it first, for good
        r = s.cli("revert", BAD_ID, "--keep-on-fail", "--json", timeout=180)
        assert r.returncode == 0, r.stderr
    before = tree_fingerprint(s.sim)
    p = subprocess.Popen([*ENVBISECT, "-p", str(s.sim.playbook), "--store", str(s.store), command, BAD_ID],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = ""
    while "starting decode" not in seen:
        line = p.stderr.readline()
        assert line, seen
        seen += line
    assert tree_fingerprint(s.sim) != before  # the revert is live
    p.send_signal(sig)
    _, rest = p.communicate(timeout=120)
    assert p.returncode == ExitStatus.INTERRUPTED and "interrupted" in seen + rest, (p.returncode, rest[-2000:])
    assert tree_fingerprint(s.sim) == before and all_healthy(s.sim)
    run_id = newest_run(s)
    assert json.loads((s.store / "runs" / run_id / "journal.json").read_text())["state"] == "closed"
    r = s.cli("restore", "--json", timeout=60)
    assert json.loads(r.stdout)["restored"] is False  # nothing left to undo, and the lock is free:
    r = s.cli(command, BAD_ID, "--json", *(["--keep-on-fail"] if command == "revert" else []), timeout=120)
    assert r.returncode != ExitStatus.USAGE and "ok" in json.loads(r.stdout), r.stderr  # not refused: lock free


def test_two_controllers_race_for_the_lock(scenario):
    s = scenario()
    s.baseline()
    plant(s.sim, INNOCENT[:1] + [BAD])
    before = tree_fingerprint(s.sim)
    base = [*ENVBISECT, "-p", str(s.sim.playbook), "--store", str(s.store), "bisect", "--against", "good",
            "--probe", "e2e", "--json"]
    procs = [subprocess.Popen(base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [ExitStatus.OK, ExitStatus.USAGE], [o[1][-500:] for o in outs]
    loser = next(o for p, o in zip(procs, outs) if p.returncode == ExitStatus.USAGE)[1].strip()
    assert len(loser.splitlines()) == 1 and "is locked by run" in loser and "pid" in loser, loser
    winner = json.loads(next(o for p, o in zip(procs, outs) if p.returncode == 0)[0])
    assert winner["culprits"] == [BAD_ID]
    assert tree_fingerprint(s.sim) == before


# --- 64 concurrent probes: nothing leaks ---------------------------------------------------------------

def resources(server) -> dict:
    fds = os.listdir("/proc/self/fd")
    socks = 0
    for fd in fds:
        try:
            socks += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    conns = subprocess.run(["pgrep", "-P", str(server.proc.pid)], capture_output=True, text=True).stdout.split()
    return {"fds": len(fds), "sockets": socks, "threads": threading.active_count(), "ssh_connections": len(conns)}


def settled(server, want: dict | None = None, timeout: float = 15.0) -> dict:
    """The counts once closing connections and finishing threads are done: equal to `want`, or (no
    `want`) the same three readings in a row; whatever they are at the timeout."""
    deadline = time.monotonic() + timeout
    last: list[dict] = []
    while True:
        got = resources(server)
        last = (last + [got])[-3:]
        if (got == want if want is not None else len(last) == 3 and last[0] == last[1] == last[2]):
            return got
        if time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_64_concurrent_probes_over_several_trials_leak_nothing(scenario, sshd):
    s = scenario(ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    edit_playbook(s, "concurrency = 16", "concurrency = 64")
    # 64 requests at once on a loaded 2-core machine take longer than the suite's short hang timeout
    head, burst = s.sim.playbook.read_text().split("[probes.burst]", 1)
    s.sim.playbook.write_text(head + "[probes.burst]" + burst.replace("timeout_s = 1.5", "timeout_s = 5", 1))
    s.baseline()
    plant(s.sim, INNOCENT[:3] + [BAD])
    before = tree_fingerprint(s.sim)
    at_start = settled(sshd)  # nothing of this test open yet
    after_trial: list[dict] = []
    with s.deployment() as dep:
        diff = dep.diff(against="good")

        def on_event(kind, data):
            if kind == "trial-end":
                after_trial.append(settled(sshd, after_trial[0] if after_trial else None))

        r = BisectRun(dep, BisectOptions(probe="burst"), on_event=on_event).start(diff)
        assert r.verdict.kind == "culprit" and r.culprit_deltas == (BAD_ID,)
        assert len(r.trials) >= 4 and any(t.outcome == "fail" for t in r.trials)
        assert all(len(t.probe_runs[0].requests) == 64 for t in r.trials if t.probe_runs)
        # the same after every trial as after the first: no growth with the number of trials
        assert all(a == after_trial[0] for a in after_trial), after_trial
    assert settled(sshd, at_start) == at_start  # closed: back to exactly what was open before
    assert tree_fingerprint(s.sim) == before


@pytest.mark.parametrize("nth", [1])  # the lock's round trip (each case bisects first: ~30 s)
def test_revert_sent_sigterm_while_it_takes_the_lock_lets_go_of_it(scenario, nth):
    """SIGTERM during revert's first round trips (the lock, the journal): exit 130 with one line, and
    no lock or journal of it left on the host (blind red-team, signals: exit -15, nothing said)."""
    s = scenario()
    s.baseline()
    plant(s.sim, INNOCENT[:1] + [BAD])
    r = s.cli("bisect", "--against", "good", "--probe", "e2e", "--json", timeout=180)
    assert r.returncode == 0, r.stderr
    before = tree_fingerprint(s.sim)
    p = subprocess.Popen([*ENVBISECT, "-vv", "-p", str(s.sim.playbook), "--store", str(s.store), "revert", BAD_ID],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen, trips = "", 0
    while trips < nth:
        line = p.stderr.readline()
        assert line, seen[-3000:]
        seen += line
        trips += "agent hostops" in line
    p.send_signal(signal.SIGTERM)
    _, rest = p.communicate(timeout=120)
    assert p.returncode == ExitStatus.INTERRUPTED and "envbisect: interrupted" in seen + rest, (p.returncode, rest[-2000:])
    state = Path.home() / ".envbisect"
    left = sorted(x.name for x in state.glob(f"{s.name}*") if not x.name.endswith(".guard"))
    assert left == [], left
    assert tree_fingerprint(s.sim) == before and all_healthy(s.sim)
