"""Who can make `envbisect watch` act, and what it does before acting (docs/safety.md, "The watch's
trust boundary"): the webhook takes only a POST that names the listener in `Host`, carries the
shared secret as Alertmanager's http_config sends it and is application/json; an alert is a
reason to probe, not evidence; at most one bisection per `[watch] cooldown`; the listener is
bounded (read deadline, connection cap, alert queue). The same over a real Alertmanager is in
tests/test_watch_sim.py."""
from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import threading
import time

import pytest
from test_cli_inprocess import base, cli, health, stack  # noqa: F401 - fixtures
from test_watch import SECRET, WEBHOOK, F, P, U, _events, _post, stack_cli

from hosttree import DECODE

from envbisect.errors import ExitStatus, UsageError
from envbisect.runs.watch import Act, Alert, AlertListener, WatchState, acted, decide, parse_webhook
from envbisect.runs.webhook import SECRET_ENV, authorized, load_secret

DOWN = Alert("Down", "firing", fingerprint="abc", starts_at="2026-12-04T17:00:00Z")


# --- the request: Host, secret, content type -----------------------------------------------------

def _listener(seen: list[str], **kw) -> tuple[AlertListener, str]:
    lis = AlertListener("127.0.0.1", 0, seen.append, secret=SECRET, alerts=("Down",), **kw)
    return lis, f"http://127.0.0.1:{lis.address[1]}/"


def test_the_webhook_takes_only_a_json_post_with_the_secret_that_names_the_listener():
    seen: list[str] = []
    lis, url = _listener(seen)
    body = json.dumps(WEBHOOK).encode()
    try:
        assert _post(url, body, secret=None)[0] == 401
        assert _post(url, body, secret="not-the-secret-at-all-no")[0] == 401
        # a page's form: no secret, a form's content type, the page's Origin
        assert _post(url, b"alerts=1", secret=None, content_type="application/x-www-form-urlencoded",
                     Origin="https://evil.example")[0] == 401
        assert _post(url, body, content_type="text/plain")[0] == 415  # the secret, but not JSON
        assert _post(url, body, Host="evil.example")[0] == 400  # DNS rebinding: the page's own name
        # the three 401s in one line (refusals are summarised per interval), the 415 and the 400 in theirs
        assert lis.alerts.empty() and len(seen) == 3 and all("refused" in line for line in seen), seen
        assert _post(url, body)[0] == 200  # Bearer, as http_config's authorization sends it
        basic = base64.b64encode(f"alertmanager:{SECRET}".encode()).decode()
        assert _post(url, body, secret=None, Authorization=f"Basic {basic}")[0] == 200  # http_config basic_auth
        assert _post(url, body, content_type="application/json; charset=utf-8")[0] == 200
        assert [lis.alerts.get(timeout=2).alertname for _ in range(3)] == ["Down"] * 3
    finally:
        lis.close()


def test_authorized_compares_the_whole_secret():
    assert authorized(f"Bearer {SECRET}", SECRET) and authorized(f"bearer  {SECRET} ", SECRET)
    for bad in (None, "", f"Bearer {SECRET[:-1]}", f"Bearer {SECRET}x", f"Token {SECRET}", "Basic !!",
                "Basic " + base64.b64encode(b"user-without-password").decode()):
        assert not authorized(bad, SECRET), bad


def test_a_secret_file_owned_by_another_user_is_refused_as_ssh_does(tmp_path):
    """Red-team 2 LOW-3: a 0600 secret file owned by another user (who can rewrite it and so decide
    who may make the watch act) was accepted. Only the watch's own user or root may own it."""
    assert os.geteuid() == 0, "the suite runs as root here: making a file another user owns needs chown"
    f = tmp_path / "secret"
    f.write_text(SECRET + "\n")
    f.chmod(0o600)
    os.chown(f, 65534, 65534)
    with pytest.raises(UsageError, match="owned by uid 65534"):
        load_secret(str(f), "pb", {})
    os.chown(f, 0, 0)
    assert load_secret(str(f), "pb", {}) == SECRET


def test_the_secret_comes_from_a_file_or_the_environment_and_is_long_enough(tmp_path):
    f = tmp_path / "secret"
    f.write_text(SECRET + "\n")
    f.chmod(0o600)
    assert load_secret(str(f), "pb", {}) == SECRET
    assert load_secret(None, "pb", {SECRET_ENV: SECRET}) == SECRET
    with pytest.raises(UsageError, match="secret_file.*ENVBISECT_WATCH_SECRET.*never on the command line"):
        load_secret(None, "pb", {})
    f.write_text("short\n")
    with pytest.raises(UsageError, match="at least 16"):
        load_secret(str(f), "pb", {})
    with pytest.raises(UsageError, match="No such file"):
        load_secret(str(tmp_path / "nope"), "pb", {})


# --- an alert is a reason to probe; one bisection per cooldown ------------------------------------

def test_an_alert_is_acted_on_only_after_the_watchs_own_probe_fails():
    state = WatchState(armed=True, last_pass="s0")
    _, d = decide(state, DOWN, alerts=("Down",))
    assert d.act is Act.CONFIRM and d.trigger == "alert"
    for probe in (P, U):
        _, d = decide(state, DOWN, alerts=("Down",), confirmed=probe)
        assert d.act is Act.NOTHING and "not acted on" in d.reason
    _, d = decide(state, DOWN, alerts=("Down",), confirmed=F)
    assert d.act is Act.BISECT and "the probe confirms it" in d.reason


def test_one_bisection_per_cooldown_an_alert_in_it_is_logged_and_dropped():
    state = acted(WatchState(armed=True, last_pass="s0"), "probe:s0", now=1000.0)
    state = decide(state, P, now=1010.0, cooldown_s=3600)[0]  # armed again (--leave fixed)
    later = Alert("Down", "firing", fingerprint="def", starts_at="2026-12-04T17:30:00Z")
    new, d = decide(state, later, alerts=("Down",), now=1100.0, cooldown_s=3600)
    assert d.act is Act.NOTHING and "cooldown" in d.reason and "not acted on" in d.reason and new == state
    assert decide(state, later, alerts=("Down",), now=4601.0, cooldown_s=3600)[1].act is Act.CONFIRM
    # a probe streak in the cooldown is kept and acts once the cooldown is over
    state, d1 = decide(state, F, now=1200.0, cooldown_s=3600)
    state, d2 = decide(state, F, now=1300.0, cooldown_s=3600)
    assert (d1.act, d2.act) == (Act.NOTHING, Act.NOTHING) and "cooldown" in d2.reason
    assert decide(state, F, now=4700.0, cooldown_s=3600)[1].act is Act.BISECT
    assert WatchState.from_json(json.loads(json.dumps(state.to_json()))).bisected_at == 1000.0


# --- the listener is bounded --------------------------------------------------------------------

def test_idle_connections_are_capped_and_dropped_at_the_read_deadline():
    seen: list[str] = []
    lis, url = _listener(seen, read_deadline_s=3.0, max_connections=4)
    port = lis.address[1]
    held = []
    try:
        head = (f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {SECRET}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {1 << 20}\r\n\r\n{{").encode()
        threads_before = len(threading.enumerate())
        for _ in range(40):  # each announces 1 MiB and sends one byte
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(head)
            held.append(s)
        deadline = time.monotonic() + 2
        while lis.refused_connections + lis.evicted_connections < 36 and time.monotonic() < deadline:
            time.sleep(0.05)
        # closed unanswered, no thread (or, arriving before an older one's head was read, evicting it)
        assert lis.refused_connections + lis.evicted_connections == 36
        assert len(threading.enumerate()) - threads_before <= 8  # per served connection: its handler, its deadline
        time.sleep(3.5)  # past the deadline: each served one is closed by the listener
        for s in held:
            s.settimeout(2)
            try:
                assert s.recv(100) == b""
            except ConnectionResetError:
                pass
        assert _post(url, json.dumps(WEBHOOK).encode())[0] == 200  # and it still serves
        assert any("did not arrive within 3 s" in line for line in seen), seen
    finally:
        for s in held:
            s.close()
        lis.close()


def test_a_request_trickled_a_byte_at_a_time_is_cut_off_at_the_deadline():
    seen: list[str] = []
    lis, url = _listener(seen, read_deadline_s=1.5)
    try:
        with socket.create_connection(("127.0.0.1", lis.address[1]), timeout=10) as s:
            start = time.monotonic()
            closed = False
            for c in b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100:
                try:
                    s.sendall(bytes([c]))
                except OSError:
                    closed = True
                    break
                time.sleep(0.2)
                if time.monotonic() - start > 4:
                    break
            if not closed:
                s.settimeout(3)
                try:
                    closed = s.recv(100) == b""
                except ConnectionResetError:
                    closed = True
            assert closed and time.monotonic() - start < 5
        assert _post(url, json.dumps(WEBHOOK).encode())[0] == 200
    finally:
        lis.close()


def test_the_alert_queue_is_bounded_and_a_request_is_one_log_line():
    seen: list[str] = []
    lis, url = _listener(seen, max_queued=8)
    many = {**WEBHOOK, "alerts": [{**WEBHOOK["alerts"][0], "fingerprint": f"{i:016x}"} for i in range(3000)]
            + [{**WEBHOOK["alerts"][0], "labels": {"alertname": "Other"}}]}
    try:
        code, text = _post(url, json.dumps(many).encode())
        assert code == 200 and "3001 alert(s) received, 8 queued, 1 ignored" in text and "2992 dropped" in text, text
        assert lis.alerts.qsize() == 8 and len(seen) == 1, seen
        assert _post(url, json.dumps(WEBHOOK).encode())[0] == 503  # full: Alertmanager retries later
    finally:
        lis.close()


def test_a_deeply_nested_body_is_a_one_line_refusal():
    deep = b'{"alerts": ' + b"[" * 200000 + b"]" * 200000 + b"}"
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_webhook(deep)
    seen: list[str] = []
    lis, url = _listener(seen)
    try:
        code, text = _post(url, deep)
        assert code == 400 and "nested too deeply" in text and len(seen) == 1 and "\n" not in seen[0]
    finally:
        lis.close()


# --- the watch over the CLI stack ---------------------------------------------------------------

def test_watch_listen_needs_a_secret_from_a_file_or_the_environment(stack, tmp_path, monkeypatch):  # noqa: F811
    b = base(stack)
    stack.playbook.write_text(stack.playbook.read_text().replace("[watch]\n", '[watch]\nalerts = ["Down"]\n', 1))
    monkeypatch.delenv(SECRET_ENV, raising=False)
    rc, c = cli(*b, "watch", "--once", "--listen", "127.0.0.1:0")
    assert rc == ExitStatus.USAGE and c.err.count("\n") == 1 and "[watch] secret_file" in c.err, c.err
    stack.playbook.write_text(stack.playbook.read_text().replace("[watch]\n", '[watch]\ncooldown = "soon"\n', 1))
    monkeypatch.setenv(SECRET_ENV, SECRET)
    rc, c = cli(*b, "watch", "--once", "--listen", "127.0.0.1:0")
    assert rc == ExitStatus.USAGE and "[watch] cooldown 'soon'" in c.err, c.err


def test_an_alert_bisects_only_after_the_probe_confirms_and_once_per_cooldown(stack, tmp_path, free_port):  # noqa: F811
    b = base(stack)
    secret = tmp_path / "webhook.secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    stack.playbook.write_text(stack.playbook.read_text().replace(
        "[watch]\n", f'[watch]\nalerts = ["Down"]\nsecret_file = "{secret}"\n', 1))
    got, ev = tmp_path / "notified", tmp_path / "events.jsonl"
    assert cli(*b, "watch", "--once")[0] == ExitStatus.OK  # a pass: armed
    url = f"http://127.0.0.1:{free_port}/"
    p = subprocess.Popen([*stack_cli(stack), "--events", str(ev), "watch", "--every", "1h", "--leave", "fixed",
                          "--listen", f"127.0.0.1:{free_port}", "--notify", f"cat >> {got}; echo >> {got}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def decisions() -> list[dict]:
        return [e for e in _events(ev) if e["event"] == "watch-decision"]

    def wait(what, cond, timeout=60):  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while not cond():
            assert p.poll() is None, p.stderr.read()
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.1)

    try:
        wait("the listener", lambda: any(e["event"] == "watch-listen" for e in _events(ev)))
        body = json.dumps(WEBHOOK).encode()
        assert _post(url, body)[0] == 200  # the stack passes: the probe does not confirm it
        wait("its decision", lambda: len(decisions()) >= 2)
        assert "the watch's probe says pass" in decisions()[-1]["reason"], decisions()
        stack.tree.edit("decode", DECODE + "export BAD=1\n")
        assert _post(url, body, secret=None)[0] == 401 and _post(url, body, content_type="text/plain")[0] == 415
        assert _post(url, body)[0] == 200  # now it does
        wait("the verdict", lambda: any(e["event"] == "verdict" for e in _events(ev)), 180)
        second = {**WEBHOOK, "alerts": [{**WEBHOOK["alerts"][0], "startsAt": "2026-12-04T18:00:00.000Z"}]}
        n = len(decisions())
        assert _post(url, json.dumps(second).encode())[0] == 200
        wait("the second alert's decision", lambda: len(decisions()) > n)
        assert "cooldown" in decisions()[-1]["reason"] and decisions()[-1]["act"] == "nothing", decisions()[-1]
    finally:
        p.terminate()
        p.wait(timeout=60)
    kinds = [e["event"] for e in _events(ev)]
    assert kinds.count("watch-bisect") == 1, kinds
    confirming = [e for e in _events(ev) if e["event"] == "watch-observation" and e.get("because")]
    assert [e["outcome"] for e in confirming] == ["pass", "fail"]  # the second alert was not even probed
    assert kinds.index("watch-bisect") > _events(ev).index(confirming[-1])
    (doc,) = [json.loads(x) for x in got.read_text().split("\n\n") if x.strip()]
    assert doc["verdict"] == "culprit" and doc["culprits"] == ["decode:BAD"] and doc["watch"]["trigger"] == "alert"


def test_an_alerts_fields_are_bounded_before_they_are_remembered():
    """An incident id (fingerprint and startsAt) is kept in STORE/watch/NAME.json: a 1 MiB
    fingerprint must not become 1 MiB of state per incident."""
    from envbisect.runs.webhook import MAX_FIELD

    big = {**WEBHOOK, "alerts": [{**WEBHOOK["alerts"][0], "fingerprint": "f" * 500_000, "startsAt": ["x"] * 1000}]}
    (a,) = parse_webhook(json.dumps(big).encode())
    assert len(a.fingerprint) == MAX_FIELD and len(a.starts_at) <= MAX_FIELD and len(a.incident) < 3 * MAX_FIELD
