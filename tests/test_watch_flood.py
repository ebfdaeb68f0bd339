"""The webhook under a flood from a peer without the secret (runs/webhook.py), over real sockets:
idle unauthenticated connections cannot keep Alertmanager out, and refusals do not flood the log."""
from __future__ import annotations

import json
import socket
import threading
import time

from test_watch import SECRET, WEBHOOK, _post

from envbisect.inputs.masking import SecretMasker
from envbisect.runs.webhook import AlertListener


def _legit(port: int) -> bytes:
    body = json.dumps(WEBHOOK).encode()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {SECRET}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            s.settimeout(5)
            return s.recv(200).split(b"\r\n")[0] or b"<closed, no answer>"
    except OSError as e:
        return repr(e).encode()


def test_idle_unauthenticated_connections_do_not_keep_an_authenticated_sender_out():
    """The red-team's attack, bounded: 40 threads open connections that send nothing and reconnect
    as soon as one is cut. An authenticated POST during the attack is answered 200 each time; the
    log says connections were evicted, in few lines."""
    seen: list[str] = []
    lis = AlertListener("127.0.0.1", 0, seen.append, secret=SECRET, alerts=("Down",))
    port = lis.address[1]
    stop = time.monotonic() + 8
    opened = [0]

    def holder() -> None:
        while time.monotonic() < stop:
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=3)
                opened[0] += 1
            except OSError:
                time.sleep(0.05)
                continue
            try:
                s.settimeout(max(0.1, min(15, stop - time.monotonic())))
                s.recv(1)
            except OSError:
                pass
            s.close()

    attackers = [threading.Thread(target=holder, daemon=True) for _ in range(40)]
    try:
        for t in attackers:
            t.start()
        time.sleep(1.5)
        answers = []
        for _ in range(4):
            answers.append(_legit(port))
            time.sleep(1)
        assert all(a.startswith(b"HTTP/1.0 200") for a in answers), answers
        assert opened[0] >= 40
    finally:
        for t in attackers:
            t.join(timeout=20)
        lis.close()
    assert any("evicted" in line for line in seen), seen
    assert sum("evicted" in line for line in seen) <= 4, seen  # one line per interval, not one per connection


def test_refusals_are_logged_once_per_interval_not_once_per_request():
    seen: list[str] = []
    lis = AlertListener("127.0.0.1", 0, seen.append, secret=SECRET, alerts=("Down",))
    url = f"http://127.0.0.1:{lis.address[1]}/"
    try:
        for _ in range(60):
            assert _post(url, b"{}", secret=None)[0] == 401
        assert _post(url, json.dumps(WEBHOOK).encode())[0] == 200
    finally:
        lis.close()
    refusals = [line for line in seen if "refus" in line]
    assert 1 <= len(refusals) <= 3, seen
    assert any("59 more" in line for line in refusals), refusals  # the count is said, at the latest at close


def test_the_401_line_names_the_header_and_survives_the_masker():
    seen: list[str] = []
    lis = AlertListener("127.0.0.1", 0, seen.append, secret=SECRET, alerts=("Down",))
    try:
        code, text = _post(f"http://127.0.0.1:{lis.address[1]}/", b"{}", secret=None)
    finally:
        lis.close()
    line = next(line for line in seen if "(401)" in line)
    assert code == 401 and "Authorization" in line and "Authorization" in text
    masker = SecretMasker()
    assert masker.redact_text(line) == line and masker.redact_text(text) == text, masker.redact_text(line)


def test_a_secret_file_readable_by_group_or_others_is_refused(tmp_path):
    import pytest

    from envbisect.errors import UsageError
    from envbisect.runs.webhook import load_secret

    f = tmp_path / "secret"
    f.write_text(SECRET + "\n")
    for mode in (0o644, 0o640, 0o604, 0o660):
        f.chmod(mode)
        with pytest.raises(UsageError, match=r"readable by group or others \(mode 0o?6[0-6]{2}\).*chmod 600") as e:
            load_secret(str(f), "pb", {})
        assert "\n" not in str(e.value) and SECRET not in str(e.value)
    f.chmod(0o600)
    assert load_secret(str(f), "pb", {}) == SECRET
    f.chmod(0o400)
    assert load_secret(str(f), "pb", {}) == SECRET


def test_the_watch_takes_its_secret_out_of_the_environment_its_children_see(monkeypatch, tmp_path):
    import os
    import subprocess

    from envbisect.runs.watch import Watcher, WatchOptions
    from envbisect.runs.webhook import SECRET_ENV, load_secret

    monkeypatch.setenv(SECRET_ENV, SECRET)
    w = Watcher(lambda: None, tmp_path, WatchOptions(probe="e2e", every_s=60, bisect=None, listen=("127.0.0.1", 0)),
                on_event=lambda k, d: None, say=lambda line: None)
    assert SECRET_ENV not in os.environ
    child = subprocess.run(["env"], capture_output=True, text=True, check=True).stdout
    assert SECRET not in child and SECRET_ENV not in child
    assert load_secret(None, "pb", w.environ) == SECRET  # every cycle still has it
    assert load_secret(None, "pb", w.environ) == SECRET
