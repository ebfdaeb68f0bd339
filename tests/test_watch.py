"""`envbisect watch`: the decision state machine (pure, runs/watch.decide), the webhook parsing and
listener, the lock, and the watch over the in-process CLI stack of tests/clistack.py (a command probe
that fails while decode's env file holds BAD): it bisects on its own once, notifies once, refuses to
start a bisection over an un-restored journal, and a second watch on the same deployment is refused.
The simulated deployment and real Alertmanager cases are in tests/test_watch_sim.py."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from hosttree import DECODE
from test_cli_inprocess import FAILS_ON_BAD, base, cli, health, stack  # noqa: F401 - fixtures

from envbisect.errors import ExitStatus, LockHeld, UsageError
from envbisect.runs.watch import (Act, Alert, AlertListener, Observation, WatchLock, WatchState, acted, decide,
                                  notify, parse_listen, parse_webhook)

P, F, U = Observation("pass", "s-pass"), Observation("fail", "s-fail"), Observation("unresolved")


def feed(events, state=WatchState(armed=True, last_pass="s0"), journal_open=False, alerts=("Down",), probe=F):
    """Every decision for `events`, the state acted on after each BISECT (as the loop does); an
    alert's CONFIRM answered with `probe`, the watch's own observation."""
    acts = []
    for e in events:
        state, d = decide(state, e, journal_open=journal_open, alerts=alerts)
        if d.act is Act.CONFIRM:
            state, d = decide(state, e, journal_open=journal_open, alerts=alerts, confirmed=probe)
        acts.append(d.act)
        if d.act is Act.BISECT:
            state = acted(state, d.incident)
    return acts, state


# --- the decision ---------------------------------------------------------------------------------

def test_two_fails_in_a_row_after_a_pass_act_once_and_not_again_until_a_pass():
    acts, state = feed([P, F, F, F, F])
    assert acts == [Act.NOTHING, Act.NOTHING, Act.BISECT, Act.NOTHING, Act.NOTHING]
    assert state.incidents == ("probe:s-pass",) and not state.armed
    acts, state = feed([Observation("pass", "s-pass-2"), F, F], state)  # re-armed by a pass: a new incident
    assert acts == [Act.NOTHING, Act.NOTHING, Act.BISECT]
    assert not state.armed and len(state.incidents) == 2


def test_a_flap_is_no_action():
    acts, _ = feed([P, F, P, F, P, F, P])
    assert Act.BISECT not in acts


def test_fail_unresolved_fail_is_not_twice_in_a_row():
    acts, state = feed([P, F, U, F])
    assert Act.BISECT not in acts and state.fails == 1
    acts, _ = feed([P, F, U, F, F])
    assert acts[-1] is Act.BISECT


def test_no_pass_seen_no_action():
    acts, _ = feed([F, F, F], state=WatchState())
    assert Act.BISECT not in acts


def test_a_repeated_alert_is_acted_on_once():
    a = Alert("Down", "firing", fingerprint="abc", starts_at="2026-12-04T17:00:00Z", group_key="{}:{}")
    acts, state = feed([a, a, a])
    assert acts == [Act.BISECT, Act.NOTHING, Act.NOTHING]
    # a pass re-arms, but the same alert (fingerprint and startsAt) is still the same incident
    acts, state = feed([P, a], state)
    assert acts == [Act.NOTHING, Act.NOTHING]
    later = Alert("Down", "firing", fingerprint="abc", starts_at="2026-12-04T18:00:00Z")
    assert feed([later], state)[0] == [Act.BISECT]


def test_alerts_not_named_or_resolved_are_ignored():
    assert feed([Alert("Other", "firing", "x", "t")])[0] == [Act.NOTHING]
    assert feed([Alert("Down", "resolved", "x", "t")])[0] == [Act.NOTHING]


def test_an_open_journal_waits_says_so_once_and_acts_once_it_is_restored():
    state = WatchState(armed=True, last_pass="s0")
    state, d1 = decide(state, F, journal_open=True)
    state, d2 = decide(state, F, journal_open=True)
    state, d3 = decide(state, F, journal_open=True)
    assert (d1.act, d2.act, d3.act) == (Act.NOTHING, Act.WAIT, Act.WAIT) and d2.say and not d3.say
    state, d4 = decide(state, F, journal_open=False)
    assert d4.act is Act.BISECT and d4.incident == d2.incident


def test_a_waiting_alert_is_said_once_across_passing_observations():
    a = Alert("Down", "firing", fingerprint="abc", starts_at="t")
    state = WatchState(armed=True, last_pass="s0")
    said = []
    for e in (a, P, a, P, a):
        state, d = decide(state, e, journal_open=True, alerts=("Down",), confirmed=F)
        if d.act is Act.WAIT:
            said.append(d.say)
    assert said == [True, False, False]
    assert decide(state, a, alerts=("Down",), confirmed=F)[1].act is Act.BISECT


def test_the_state_reads_back():
    s = acted(WatchState(armed=True, fails=2, last_pass="x"), "probe:x")
    assert WatchState.from_json(json.loads(json.dumps(s.to_json()))) == s


# --- the webhook, the listen address, notify, the lock --------------------------------------------------

WEBHOOK = {"receiver": "envbisect", "status": "firing", "alerts": [
    {"status": "firing", "labels": {"alertname": "Down", "job": "sglang"}, "annotations": {},
     "startsAt": "2026-12-04T17:00:00.000Z", "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "",
     "fingerprint": "1a30ba71cca2921f"}], "groupLabels": {"alertname": "Down"}, "commonLabels": {},
    "commonAnnotations": {}, "externalURL": "http://am:9093", "version": "4",
    "groupKey": "{}:{alertname=\"Down\"}", "truncatedAlerts": 0}


def test_parse_webhook_reads_alertmanager_version_4():
    (a,) = parse_webhook(json.dumps(WEBHOOK).encode())
    assert (a.alertname, a.status, a.fingerprint, a.starts_at, a.receiver) == (
        "Down", "firing", "1a30ba71cca2921f", "2026-12-04T17:00:00.000Z", "envbisect")
    assert a.incident == "alert:1a30ba71cca2921f@2026-12-04T17:00:00.000Z"
    for bad in (b"{", b"[]", json.dumps({**WEBHOOK, "version": "3"}).encode(), b"\xff"):
        with pytest.raises(ValueError):
            parse_webhook(bad)


def test_listen_is_loopback_unless_allowed():
    assert parse_listen("127.0.0.1:9798", allow_remote=False) == ("127.0.0.1", 9798)
    assert parse_listen("[::1]:9798", allow_remote=False) == ("::1", 9798)
    with pytest.raises(UsageError, match="not a loopback address.*--listen-remote"):
        parse_listen("0.0.0.0:9798", allow_remote=False)
    assert parse_listen("0.0.0.0:9798", allow_remote=True) == ("0.0.0.0", 9798)
    for bad in ("9798", "host:99999", "example.com:80"):
        with pytest.raises(UsageError):
            parse_listen(bad, allow_remote=True)


SECRET = "s3cret-for-the-watch-webhook-tests"


def _post(url: str, body: bytes, secret: str | None = SECRET, content_type: str = "application/json",
          **headers: str) -> tuple[int, str]:
    auth = {"Authorization": f"Bearer {secret}"} if secret else {}
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type, **auth, **headers},
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_listener_queues_alerts_and_bounds_the_body():
    seen: list[str] = []
    lis = AlertListener("127.0.0.1", 0, seen.append, secret=SECRET, alerts=("Down",))
    try:
        url = f"http://127.0.0.1:{lis.address[1]}/"
        assert _post(url, json.dumps(WEBHOOK).encode())[0] == 200
        assert lis.alerts.get(timeout=2).alertname == "Down"
        assert _post(url, b"not json")[0] == 400 and "refused" in seen[0]
        with socket.create_connection(("127.0.0.1", lis.address[1]), timeout=5) as sock:  # refused unread
            sock.sendall(f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{lis.address[1]}\r\nAuthorization: Bearer {SECRET}\r\n"
                         "Content-Type: application/json\r\nContent-Length: 1048577\r\n\r\n".encode())
            assert sock.recv(100).startswith(b"HTTP/1.0 413")
        assert lis.alerts.empty()
    finally:
        lis.close()


def test_notify_gets_stdin_and_its_failure_is_reported_not_raised(tmp_path):
    out = tmp_path / "got"
    assert notify(f"cat >> {out}", {"verdict": "culprit"}, 5).ok
    assert json.loads(out.read_text()) == {"verdict": "culprit"}
    bad = notify("echo broken >&2; exit 3", {}, 5)
    assert not bad.ok and "status 3: broken" in bad.detail
    slow = notify("sleep 5", {}, 0.3)
    assert not slow.ok and "within 0.3 s" in slow.detail


def test_the_watch_lock_refuses_a_live_holder_and_takes_over_a_dead_one(tmp_path):
    a = WatchLock(tmp_path, "dep")
    assert a.acquire() is None
    with pytest.raises(LockHeld, match=r"another watch is watching 'dep' \(pid \d+ on this host"):
        WatchLock(tmp_path, "dep").acquire()
    a.release()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    from envbisect.hosts.journal import boot_id, pid_namespace

    mine = {"host": socket.gethostname(), "boot_id": boot_id(), "pid_ns": pid_namespace(), "started_at": 1}
    if boot_id() and pid_namespace():  # a pid of this boot and pid namespace that is gone
        a.path.write_text(json.dumps({**mine, "pid": int(dead.stdout)}))
        b = WatchLock(tmp_path, "dep")
        assert "stale" in (b.acquire() or "")
        b.release()
        # red team of main (the deployment lock's defect, here too): a watch in a container with this host
        # name and boot id but pids of its own is not judged by a pid looked up in another namespace
        for ns in ({"pid_ns": "pid:[1]"}, {"pid_ns": ""}):
            a.path.write_text(json.dumps({**mine, "pid": int(dead.stdout), **ns}))
            with pytest.raises(LockHeld, match="another watch is watching 'dep'.*only if that watch is gone"):
                WatchLock(tmp_path, "dep").acquire()

    if boot_id():  # a live pid written in an earlier boot is someone else's process now
        a.path.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "boot_id": "earlier",
                                      "started_at": 1}))
        c = WatchLock(tmp_path, "dep")
        assert "stale" in (c.acquire() or "")
        c.release()
    a.path.write_text(json.dumps({"pid": int(dead.stdout), "host": "elsewhere", "started_at": 1}))
    with pytest.raises(LockHeld, match="on host elsewhere"):  # another machine's pid cannot be checked here
        WatchLock(tmp_path, "dep").acquire()


# --- the watch over the CLI stack ------------------------------------------------------------------------

def _events(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_watch_turns_red_bisects_once_notifies_once(stack, tmp_path):
    b = base(stack)
    got, ev = tmp_path / "notified", tmp_path / "events.jsonl"
    args = [*b, "-q", "--events", str(ev), "watch", "--every", "0.1s", "--notify", f"cat >> {got}; echo >> {got}"]
    rc, c = cli(*args, "--once")  # the first observation: a pass
    assert rc == ExitStatus.OK, c.err
    stack.tree.edit("decode", DECODE + "export BAD=1\n")
    rc, c = cli(*args, "--max-cycles", "4")  # fail, fail -> bisect; fail, fail -> nothing more
    assert rc == ExitStatus.OK, c.err
    assert "4 cycle(s), 1 bisection(s); culprit decode:BAD" in c.out, c.out
    docs = [json.loads(x) for x in got.read_text().split("\n\n") if x.strip()]
    assert len(docs) == 1 and docs[0]["verdict"] == "culprit" and docs[0]["culprits"] == ["decode:BAD"]
    assert docs[0]["watch"]["trigger"] == "probe" and docs[0]["state_left"] == "original"
    assert os.path.isfile(docs[0]["watch"]["bundle"])
    assert docs[0]["last_good"]["snapshot"] == docs[0]["watch"]["incident"].split(":", 1)[1]
    kinds = [e["event"] for e in _events(ev)]
    assert kinds.count("watch-bisect") == 1 and kinds.count("verdict") == 1 and kinds.count("watch-notify") == 1
    outcomes = [e["outcome"] for e in _events(ev) if e["event"] == "watch-observation"]
    assert outcomes == ["pass", "fail", "fail", "fail", "fail"]
    # a restart of the watch remembers: still no pass since, so nothing
    rc, c = cli(*args, "--max-cycles", "2")
    assert rc == ExitStatus.OK and "0 bisection(s)" in c.out and len(got.read_text().split("\n\n")) == 2


def test_watch_never_starts_a_bisection_over_an_unrestored_journal(stack, tmp_path):
    b = base(stack)
    got = tmp_path / "notified"
    args = [*b, "watch", "--every", "0.1s", "--notify", f"cat >> {got}"]
    assert cli(*args, "--once")[0] == ExitStatus.OK
    assert cli(*b, "snapshot", "--label", "noon")[0] == ExitStatus.OK
    stack.tree.edit("decode", DECODE + "export BAD=1\n")
    r = stack.cli("bisect", "--against", "noon", env={**os.environ, "ENVBISECT_TEST_CRASH_AT": "write:1"})
    assert r.returncode == -9, r.stderr.decode()[-500:]  # SIGKILLed mid-edit: the journal is active
    stack.tree.edit("decode", DECODE + "export BAD=1\n")
    runs_before = sorted(p.name for p in (stack.store / "runs").iterdir())
    rc, c = cli(*args, "--max-cycles", "3")
    assert rc == ExitStatus.OK, c.err
    assert "0 bisection(s)" in c.out and "not undone yet" in c.err and "cannot start" in c.err, c.err
    assert sorted(p.name for p in (stack.store / "runs").iterdir()) == runs_before  # no run was started
    blocked = json.loads(got.read_text())
    assert blocked["watch"]["event"] == "blocked" and "envbisect restore" in blocked["watch"]["reason"]
    assert cli(*b, "restore")[0] == ExitStatus.OK
    stack.tree.edit("decode", DECODE + "export BAD=1\n")  # restore put back the file as the crash found it
    rc, c = cli(*args, "--max-cycles", "1")
    assert rc == ExitStatus.OK and "1 bisection(s); culprit decode:BAD" in c.out, c.out + c.err


def test_a_second_watch_on_the_same_deployment_is_refused(stack):
    b = base(stack)
    p = subprocess.Popen([*stack_cli(stack), "watch", "--every", "1h"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        lock = next((stack.store / "watch").glob("*.lock"), None) if (stack.store / "watch").exists() else None
        deadline = time.monotonic() + 30
        while lock is None and time.monotonic() < deadline:
            time.sleep(0.1)
            lock = next((stack.store / "watch").glob("*.lock"), None) if (stack.store / "watch").exists() else None
        assert lock is not None, p.stderr.read() if p.poll() is not None else "no lock"
        rc, c = cli(*b, "watch", "--once")
        assert rc == ExitStatus.USAGE and c.err.count("\n") == 1, c.err
        assert f"another watch is watching {stack.name!r} (pid {p.pid} on this host" in c.err
    finally:
        p.terminate()
        p.wait(timeout=30)
    assert not lock.exists()  # SIGTERM: the lock goes with the watch
    assert cli(*b, "watch", "--once")[0] == ExitStatus.OK


def stack_cli(stack) -> list[str]:
    from clistack import ENVBISECT

    return [*ENVBISECT, *base(stack)]


def test_service_forms(stack, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.setenv("ENVBISECT_WATCH_SECRET", SECRET)  # a service does not see the shell's environment
    rc, c = cli(*base(stack), "watch", "--print", "--systemd", "--listen", "127.0.0.1:9798")
    assert rc == ExitStatus.USAGE and c.err.count("\n") == 1 and "[watch] secret_file" in c.err, c.err
    secret = tmp_path / "webhook.secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    pb = stack.playbook.read_text()
    stack.playbook.write_text(pb.replace("[watch]\n", f'[watch]\nsecret_file = "{secret}"\n', 1))
    rc, c = cli(*base(stack), "watch", "--print", "--systemd", "--every", "5m", "--leave", "fixed",
                "--notify", "cat > /tmp/x", "--listen", "127.0.0.1:9798", "--json")
    assert rc == ExitStatus.OK, c.err
    doc = json.loads(c.out)
    (text,) = doc["files"].values()
    assert "Type=simple" in text and "Restart=on-failure" in text and "--leave fixed" in text
    assert doc["command"][-11:] == ["watch", "--every", "5m", "--leave", "fixed", "--notify", "cat > /tmp/x",
                                    "--notify-timeout", "60s", "--listen", "127.0.0.1:9798"]
    i = doc["command"].index("--store")  # absolute paths, as schedule writes them
    assert doc["command"][i + 1] == str(stack.store.absolute()) and doc["command"][i - 1] == str(stack.playbook)
    assert 'ExecStart=' in text and '"cat > /tmp/x"' in text
    assert doc["enable"].endswith(f"enable --now envbisect-watch-{stack.name}.service")
    rc, c = cli(*base(stack), "watch", "--print", "--cron", "--every", "15m")
    assert rc == ExitStatus.OK and c.out.splitlines()[1].startswith("*/15 * * * * ") and "watch --once" in c.out
    rc, c = cli(*base(stack), "watch", "--print", "--cron", "--listen", "127.0.0.1:9798")
    assert rc == ExitStatus.USAGE and "systemd service" in c.err
    for kind in ("--cron", "--systemd"):  # a line break in --notify would add a job (or a setting) of its own
        rc, c = cli(*base(stack), "watch", "--print", kind, "--notify", "true\n* * * * * rm -rf ~")
        assert rc == ExitStatus.USAGE and c.out == "" and c.err.count("\n") == 1 and "line break" in c.err


def test_watch_events_to_stdout_and_listen_refusals(stack):
    b = base(stack)
    rc, c = cli(*b, "--events", "-", "watch", "--every", "0.1s", "--max-cycles", "2")
    assert rc == ExitStatus.OK, c.err
    lines = [json.loads(x) for x in c.out.splitlines()]  # stdout is only the stream
    kinds = [e["event"] for e in lines]
    assert kinds[0] == "watch-start" and kinds[-1] == "watch-stop" and kinds.count("watch-observation") == 2
    assert all("time" in e for e in lines) and "watch: 2 cycle(s)" in c.err
    rc, c = cli(*b, "watch", "--once", "--listen", "127.0.0.1:9798")
    assert rc == ExitStatus.USAGE and "names no alerts" in c.err and "[watch] alerts" in c.err, c.err
    rc, c = cli(*b, "watch", "--once", "--listen", "0.0.0.0:9798")
    assert rc == ExitStatus.USAGE and c.err.count("\n") == 1 and "--listen-remote" in c.err
    rc, c = cli(*b, "watch", "--once", "--probe", "nosuch")
    assert rc == ExitStatus.USAGE and "no probe 'nosuch'" in c.err


def test_the_guides_slack_hook_posts_slack_text(monkeypatch):
    """The one line of shell docs/guide.md shows for Slack, run as --notify runs it, against a local
    endpoint standing in for the incoming webhook."""
    import re
    import shutil
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from pathlib import Path

    if not (shutil.which("jq") and shutil.which("curl")):
        pytest.skip("jq and curl are needed to run the guide's Slack line")
    guide = (Path(__file__).resolve().parent.parent / "docs" / "guide.md").read_text()
    line = next(ln for ln in guide.splitlines() if ln.startswith("envbisect watch --notify '") and "SLACK" in ln)
    cmd = re.fullmatch(r"envbisect watch --notify '(.*)'", line).group(1)
    got: list[bytes] = []

    class Slack(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            got.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Slack)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("SLACK_WEBHOOK_URL", f"http://127.0.0.1:{srv.server_address[1]}/hook")
    try:
        res = notify(cmd, {"verdict": "culprit", "culprits": ["decode:BAD"], "watch": {"event": "verdict"}}, 20)
    finally:
        srv.shutdown()
        srv.server_close()
    assert res.ok, res.detail
    assert json.loads(got[0]) == {"text": "envbisect: culprit decode:BAD"}


def test_an_alert_that_came_over_an_unrestored_journal_is_acted_on_once_it_is_restored(stack, tmp_path, free_port,
                                                                                      monkeypatch):
    b = base(stack)
    text = stack.playbook.read_text()
    assert "[watch]\n" in text
    stack.playbook.write_text(text.replace("[watch]\n", '[watch]\nalerts = ["Down"]\n', 1))
    monkeypatch.setenv("ENVBISECT_WATCH_SECRET", SECRET)
    got, ev = tmp_path / "notified", tmp_path / "events.jsonl"
    assert cli(*b, "watch", "--once")[0] == ExitStatus.OK  # a pass: armed
    assert cli(*b, "snapshot", "--label", "noon")[0] == ExitStatus.OK
    stack.tree.edit("decode", DECODE + "export BAD=1\n")
    r = stack.cli("bisect", "--against", "noon", env={**os.environ, "ENVBISECT_TEST_CRASH_AT": "write:1"})
    assert r.returncode == -9, r.stderr.decode()[-500:]  # the journal is active
    # one cycle an hour: the alert, confirmed by the probe (BAD is in decode's file), is the trigger
    p = subprocess.Popen([*stack_cli(stack), "--events", str(ev), "watch", "--every", "1h",
                          "--listen", f"127.0.0.1:{free_port}", "--notify", f"cat >> {got}; echo >> {got}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "ENVBISECT_WATCH_SECRET": SECRET})  # the watch above took it out
    try:
        deadline = time.monotonic() + 30
        while not any(e["event"] == "watch-listen" for e in _events(ev)):
            assert time.monotonic() < deadline and p.poll() is None, p.stderr.read() if p.poll() is not None else ""
            time.sleep(0.1)
        assert _post(f"http://127.0.0.1:{free_port}/", json.dumps(WEBHOOK).encode())[0] == 200
        while not got.exists() or not got.read_text().strip():
            assert time.monotonic() < deadline + 30 and p.poll() is None
            time.sleep(0.1)
        blocked = json.loads(got.read_text())
        assert blocked["watch"]["event"] == "blocked" and blocked["watch"]["trigger"] == "alert"
        assert not any(e["event"] == "watch-bisect" for e in _events(ev))
        assert cli(*b, "restore")[0] == ExitStatus.OK  # it puts BAD back, as the crash found the file
        # Alertmanager's repeat of the same alert: the same incident, acted on now
        assert _post(f"http://127.0.0.1:{free_port}/", json.dumps(WEBHOOK).encode())[0] == 200
        while not any(e["event"] == "verdict" for e in _events(ev)):
            assert time.monotonic() < deadline + 120 and p.poll() is None, p.stderr.read() if p.poll() else ""
            time.sleep(0.2)
        time.sleep(1)
    finally:
        p.terminate()
        p.wait(timeout=60)
    docs = [json.loads(x) for x in got.read_text().split("\n\n") if x.strip()]
    assert [d["watch"]["event"] for d in docs] == ["blocked", "verdict"]
    assert docs[1]["watch"]["trigger"] == "alert" and docs[1]["watch"]["incident"] == blocked["watch"]["incident"]
    assert docs[1]["verdict"] == "culprit" and docs[1]["culprits"] == ["decode:BAD"]
    assert [e["event"] for e in _events(ev)].count("watch-bisect") == 1
