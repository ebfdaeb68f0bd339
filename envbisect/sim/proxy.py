"""Client-side HTTP/1.1 keep-alive reverse proxy for the simulated PD deployment.

``python -m envbisect.sim.proxy --listen-port P --upstream http://127.0.0.1:ROUTER
[--hang-after-reused N]``

It stands for the real client's HTTP stack in front of the router.  Each client connection gets its
own keep-alive connection to the upstream.  With ``--hang-after-reused N``, on one client
connection every request after the N-th is never answered (fresh connections keep working): the
culprit of the real incident, which no probe that opens a new connection per request can see.

Standard library only; it imports nothing from envbisect, so it also runs by file path.
"""

from __future__ import annotations

import argparse
import http.client
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
              "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length"}

_log_lock = threading.Lock()
SHUTDOWN = threading.Event()


def log(msg: str) -> None:
    ts = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    ms = int((time.time() % 1) * 1000)
    with _log_lock:
        sys.stdout.write(f"[{ts}.{ms:03d}] proxy: {msg}\n")
        sys.stdout.flush()


class Config:
    upstream_host = "127.0.0.1"
    upstream_port = 30000
    hang_after: int | None = None
    upstream_timeout: float = 600.0


class ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, BrokenPipeError, socket.timeout)):
            return
        log(f"error handling request from {client_address}: {exc!r}")


class ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sim-client-proxy"
    sys_version = ""
    conn_seq = 0
    _seq_lock = threading.Lock()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with ProxyHandler._seq_lock:
            ProxyHandler.conn_seq += 1
            self.conn_id = ProxyHandler.conn_seq
        self.n_on_conn = 0
        self.upstream: http.client.HTTPConnection | None = None

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            if self.upstream is not None:
                self.upstream.close()

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def do_GET(self) -> None:
        self.forward()

    def do_POST(self) -> None:
        self.forward()

    def do_PUT(self) -> None:
        self.forward()

    def do_DELETE(self) -> None:
        self.forward()

    def forward(self) -> None:
        body = self.read_body()
        self.n_on_conn += 1
        n = self.n_on_conn
        log(f"{self.command} {self.path} conn={self.conn_id} request#{n}-on-conn")
        if Config.hang_after is not None and n > Config.hang_after:
            log(f"HANG: request #{n} on reused client connection {self.conn_id} "
                f"(--hang-after-reused {Config.hang_after}); never answering")
            SHUTDOWN.wait()
            self.close_connection = True
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["Host"] = f"{Config.upstream_host}:{Config.upstream_port}"
        if body or self.command in ("POST", "PUT"):
            headers["Content-Length"] = str(len(body))
        resp = None
        for attempt in (1, 2):
            if self.upstream is None:
                self.upstream = http.client.HTTPConnection(Config.upstream_host, Config.upstream_port,
                                                           timeout=Config.upstream_timeout)
            try:
                self.upstream.request(self.command, self.path, body=body or None, headers=headers)
                resp = self.upstream.getresponse()
                break
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine) as exc:
                # a stale pooled upstream connection: reconnect once
                self.upstream.close()
                self.upstream = None
                if attempt == 2:
                    log(f"upstream error: {exc!r}")
                    self.send_error_json(502, f"upstream error: {exc}")
                    return
            except (socket.timeout, OSError) as exc:
                self.upstream.close()
                self.upstream = None
                log(f"upstream error: {exc!r}")
                self.send_error_json(504 if isinstance(exc, socket.timeout) else 502,
                                     f"upstream error: {exc}")
                return
        assert resp is not None
        self.send_response(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in HOP_BY_HOP:
                self.send_header(k, v)
        chunked = resp.getheader("Content-Length") is None and self.command != "HEAD"
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while True:
                data = resp.read1(65536)
                if not data:
                    break
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        else:
            data = resp.read()
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        self.wfile.flush()
        if resp.will_close:
            self.upstream.close()
            self.upstream = None
        log(f"{self.command} {self.path} conn={self.conn_id} -> {resp.status}")

    def send_error_json(self, status: int, message: str) -> None:
        import json
        data = json.dumps({"error": {"message": message, "code": status}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="envbisect.sim.proxy", description=__doc__.split("\n\n")[0])
    p.add_argument("--listen-port", type=int, required=True)
    p.add_argument("--listen-host", default="127.0.0.1")
    p.add_argument("--upstream", required=True, help="http://HOST:PORT of the router")
    p.add_argument("--hang-after-reused", type=int, default=None, metavar="N",
                   help="on one client connection, never answer the requests after the N-th")
    p.add_argument("--upstream-timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    u = urlsplit(args.upstream if "://" in args.upstream else "http://" + args.upstream)
    Config.upstream_host = u.hostname or "127.0.0.1"
    Config.upstream_port = u.port or 80
    Config.hang_after = args.hang_after_reused
    Config.upstream_timeout = args.upstream_timeout
    try:
        srv = ProxyServer((args.listen_host, args.listen_port), ProxyHandler)
    except OSError as exc:
        log(f"FATAL: cannot bind {args.listen_host}:{args.listen_port}: {exc}")
        return 1

    def on_signal(signum: int, _frame: Any) -> None:
        if SHUTDOWN.is_set():
            return
        log(f"received signal {signum}; shutting down")
        SHUTDOWN.set()
        threading.Thread(target=srv.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log(f"listening on {args.listen_host}:{args.listen_port} -> {Config.upstream_host}:{Config.upstream_port}"
        + (f"; hang after {Config.hang_after} requests on a reused connection"
           if Config.hang_after is not None else ""))
    srv.serve_forever(poll_interval=0.2)
    srv.server_close()
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
