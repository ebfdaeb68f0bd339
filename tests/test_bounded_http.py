"""Every probe, health check and evidence fetch has a total deadline and a body cap; TLS is verified
unless the playbook says `insecure = true` (issue 22, F6 and F9). Real servers on loopback, in their
own processes: one that trickles a byte every 0.2 s (headers or body), a chunked flood, and a
self-signed https server. See docs/safety.md."""
from __future__ import annotations

import datetime
import ipaddress
import resource
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from envbisect.errors import RemoteError
from envbisect.hosts.urls import fetch, health_ok
from envbisect.hosts.transport import LocalTransport
from envbisect.inputs.playbook import Probe
from envbisect.sim.ports import free_port
from envbisect.trials.probe import FAIL, PASS, run_probe

SERVER = r'''
import socket, ssl, sys, threading, time
mode, port = sys.argv[1], int(sys.argv[2])
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port)); srv.listen(16)
ctx = None
if mode == "tls":
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain(sys.argv[3], sys.argv[4])
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 23\r\nConnection: close\r\n\r\n"
def read_request(c):
    # the whole request: a close with unread bytes is a reset, which can lose the answer on its way
    data = b""
    while b"\r\n\r\n" not in data:
        got = c.recv(65536)
        if not got:
            return
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(body) < length:
        got = c.recv(65536)
        if not got:
            return
        body += got
def serve(c):
    try:
        if ctx is not None:
            c = ctx.wrap_socket(c, server_side=True)
        read_request(c)
        if mode == "trickle-body":
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
            for _ in range(200):
                c.sendall(b"1\r\nx\r\n"); time.sleep(0.2)
        elif mode == "trickle-headers":
            for b in OK:
                c.sendall(bytes([b])); time.sleep(0.2)
        elif mode == "flood":
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b"%x\r\n" % 65536 + b"choices " * 8192 + b"\r\n"
            for _ in range(32768):  # 2 GiB
                c.sendall(chunk)
        else:  # ok, tls
            c.sendall(OK + b'{"choices": ["hello!"]}')
    except OSError:
        pass
    finally:
        c.close()
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
'''


@pytest.fixture
def server(tmp_path):
    procs = []

    def start(mode: str, *extra: str) -> int:
        port = free_port()
        (tmp_path / "server.py").write_text(SERVER)
        procs.append(subprocess.Popen([sys.executable, str(tmp_path / "server.py"), mode, str(port), *extra]))
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return port
            except OSError:
                time.sleep(0.05)
        raise AssertionError("test server did not start")

    yield start
    for p in procs:
        p.kill()
        p.wait()


def probe(port: int, scheme: str = "http", **kw) -> Probe:
    return Probe("p", kw.pop("kind", "http"), url=f"{scheme}://127.0.0.1:{port}/v1/chat/completions",
                 body='{"x": 1}', expect_body="choices", timeout_s=1.0, **kw)


T = {"local": LocalTransport()}


@pytest.mark.parametrize("mode", ["trickle-body", "trickle-headers"])
def test_a_trickling_server_is_a_hang_at_the_deadline(server, mode):
    port = server(mode)
    t0 = time.monotonic()
    r = run_probe(probe(port), T)
    took = time.monotonic() - t0
    assert r.outcome == FAIL and "no answer within 1 s (hang)" in r.reason, r.reason
    assert 0.9 < took < 2.5, took  # the whole 40 s of the trickle before (per-read timeouts)


def test_a_multi_round_and_a_perf_probe_are_bounded_too(server):
    port = server("trickle-body")
    t0 = time.monotonic()
    r = run_probe(probe(port, kind="multi_round", rounds=3), T)
    assert r.outcome == FAIL and "hang" in r.reason and time.monotonic() - t0 < 2.5
    t0 = time.monotonic()
    r = run_probe(probe(port, kind="perf", requests=2, concurrency=2, warmup=0), T)
    assert r.outcome == FAIL and "hang" in r.reason and time.monotonic() - t0 < 2.6


def test_a_health_check_is_bounded(server):
    port = server("trickle-body")
    t0 = time.monotonic()
    ok, why = health_ok(LocalTransport(), f"http://127.0.0.1:{port}/health", timeout=1.0)
    assert not ok and why == "no answer within 1 s (hang)"
    assert time.monotonic() - t0 < 2.5


def test_a_chunked_flood_is_cut_at_the_cap_and_said_so(server):
    port = server("flood")
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    r = run_probe(replace(probe(port), timeout_s=30), T)
    assert r.outcome == FAIL and "body cut at 8 MiB (over the cap)" in r.reason, r.reason
    got = fetch(LocalTransport(), f"http://127.0.0.1:{port}/metrics", timeout=30)
    assert got.cut and len(got.body) == 4 << 20 and got.cut_note() == "body cut at 4 MiB (over the cap)"
    assert time.monotonic() - t0 < 20
    grew_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    assert grew_mib < 200, grew_mib  # a 2 GiB flood; the caps are 8 and 4 MiB


# --- F9: TLS verified by default -------------------------------------------------------------------------

@pytest.fixture
def self_signed(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    c, k = tmp_path / "cert.pem", tmp_path / "key.pem"
    c.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    return str(c), str(k)


def test_https_probe_verifies_tls_by_default_and_insecure_is_explicit(server, self_signed):
    port = server("tls", *self_signed)
    slow = {"timeout_s": 10.0}  # a TLS handshake on a loaded 2-core machine: no hang is tested here
    with pytest.raises(RemoteError, match=r"probe p: TLS verification failed: self[- ]signed certificate .*"
                                          r"`insecure = true` in \[probes.p\]"):
        run_probe(replace(probe(port, "https"), **slow), T)
    r = run_probe(replace(probe(port, "https", insecure=True), **slow), T)
    assert r.outcome == PASS, r.reason
    ok, why = health_ok(LocalTransport(), f"https://127.0.0.1:{port}/health", timeout=10.0)
    assert not ok and why.startswith("TLS verification failed: self"), why
    assert health_ok(LocalTransport(), f"https://127.0.0.1:{port}/health", timeout=10.0, insecure=True)[0]


def test_insecure_is_read_from_the_playbook(tmp_path):
    from envbisect.inputs.playbook import load_playbook

    pb = tmp_path / "p.toml"
    pb.write_text("""
[hosts.h]
ssh = "local"
[services.s]
host = "h"
env_file = "/x.env"
start = "true"
stop = "true"
health = "https://127.0.0.1:1/health"
insecure = true
[probes.a]
kind = "http"
url = "https://127.0.0.1:1/"
insecure = true
[probes.b]
kind = "http"
url = "https://127.0.0.1:1/"
""")
    p = load_playbook(pb)
    assert p.services["s"].insecure and p.probes["a"].insecure and not p.probes["b"].insecure
    pb.write_text(pb.read_text().replace("insecure = true\n[probes.a]", 'insecure = "yes"\n[probes.a]'))
    from envbisect.errors import PlaybookError

    with pytest.raises(PlaybookError, match="services.s.insecure: must be bool"):
        load_playbook(pb)


def test_clients_share_one_tls_context_per_mode(monkeypatch):
    """Building a TLS context loads the CA bundle (~35 ms of CPU); a run builds a client for every
    health check and probe request, so the context is built once per process and mode."""
    from envbisect.hosts import bounded_http

    bounded_http.tls_context.cache_clear()
    built = []
    real = httpx.create_ssl_context
    monkeypatch.setattr(httpx, "create_ssl_context", lambda *a, **k: built.append(k.get("verify")) or real(*a, **k))
    for _ in range(3):
        bounded_http.client().close()
        bounded_http.client(insecure=True).close()
    assert sorted(built) == [False, True], built
    verified, unverified = bounded_http.tls_context(False), bounded_http.tls_context(True)
    assert verified.verify_mode == ssl.CERT_REQUIRED and verified.check_hostname
    assert unverified.verify_mode == ssl.CERT_NONE and not unverified.check_hostname


def test_a_proxy_the_environment_names_is_used_unless_no_proxy_says_otherwise(monkeypatch):
    """The client is built from httpcore's public pools: the environment's proxy still carries a
    request (as httpx's own transport would), and NO_PROXY still sends it direct."""
    import socket
    import threading

    from envbisect.hosts import bounded_http

    seen: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_once() -> None:
        conn, _ = listener.accept()
        with conn:
            seen.append(conn.recv(65536).split(b"\r\n", 1)[0])
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    threading.Thread(target=answer_once, daemon=True).start()
    for key in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{listener.getsockname()[1]}")
    with bounded_http.client() as c:
        a = bounded_http.request(c, "GET", "http://engine.invalid:8081/health", deadline_s=5, max_body=64)
    assert (a.status_code, a.body) == (200, b"ok") and seen == [b"GET http://engine.invalid:8081/health HTTP/1.1"]
    monkeypatch.setenv("NO_PROXY", "engine.invalid")
    with bounded_http.client() as c, pytest.raises(httpx.ConnectError):
        bounded_http.request(c, "GET", "http://engine.invalid:8081/health", deadline_s=5, max_body=64)
    listener.close()
    assert len(seen) == 1  # the second request went direct (and found no such host)
