"""Alertmanager's webhook for `envbisect watch --listen`: the trust boundary of the only part of
envbisect that a network peer can make act.

A request is read only when it names this listener in its `Host` header (a page whose name
resolves to 127.0.0.1 names its own), carries the shared secret as Alertmanager's `http_config`
sends it (`Authorization: Bearer SECRET`, or basic auth whose password is SECRET), and is
`application/json`; every other request is refused before its body is read (400, 401, 415).
The secret is read from the playbook's `[watch] secret_file` or the environment
(`ENVBISECT_WATCH_SECRET`), never from the command line (which every local user can read).

The listener is bounded so that a peer cannot reach a running bisection through it, nor keep
Alertmanager out: a request's head (request line and headers) has HEAD_DEADLINE_S to arrive and
the whole request READ_DEADLINE_S; at most MAX_CONNECTIONS are served at once, and a connection
over the cap evicts the oldest one that has not presented a valid request head (the Host, the
secret, JSON), so that idle peers without the secret cannot starve one with it; only when every
served connection has presented one is the new one closed unanswered. At most MAX_QUEUED alerts
wait for the watch loop; only firing alerts named in `[watch] alerts` are queued, the rest are
counted in the request's one log line. What a peer can repeat at will (refusals, evictions) is
logged once per LOG_INTERVAL_S with a count. An alert is only a reason to probe: the watch acts
on it after its own probe confirms the failure (runs/watch.py).
"""
from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import json
import os
import queue
import re
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Sequence

from envbisect.errors import UsageError

MAX_BODY = 1 << 20  # bytes: an Alertmanager group notification is a few KiB; more is refused (413)
MAX_CONNECTIONS = 16  # served at once; Alertmanager sends one notification at a time per receiver
MAX_QUEUED = 32  # alerts waiting for the watch loop; more are dropped and said
READ_DEADLINE_S = 10.0  # the whole request (headers and body) arrives within this
HEAD_DEADLINE_S = 2.0  # its request line and headers arrive within this
LOG_INTERVAL_S = 10.0  # a kind of refusal is logged at most once per interval, with a count
MIN_SECRET = 16  # characters: a shared secret shorter than this is refused
SECRET_ENV = "ENVBISECT_WATCH_SECRET"


@dataclass(frozen=True)
class Alert:
    """One alert of an Alertmanager webhook notification (version "4")."""

    alertname: str
    status: str  # firing | resolved
    fingerprint: str = ""
    starts_at: str = ""
    group_key: str = ""
    receiver: str = ""

    @property
    def incident(self) -> str:
        if self.fingerprint:
            return f"alert:{self.fingerprint}@{self.starts_at}"
        return f"alert-group:{self.group_key}@{self.starts_at}"


def parse_webhook(body: bytes) -> list[Alert]:
    """The alerts of an Alertmanager webhook notification (version "4"). ValueError: not one."""
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from None
    except RecursionError:
        raise ValueError("not an Alertmanager webhook notification (JSON nested too deeply)") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("alerts"), list):
        raise ValueError("not an Alertmanager webhook notification (no alerts list)")
    if str(doc.get("version", "4")) != "4":
        raise ValueError(f"webhook version {str(doc.get('version'))[:20]!r}: envbisect reads version 4")
    out = []
    for a in doc["alerts"]:
        if not isinstance(a, dict) or not isinstance(a.get("labels"), dict):
            raise ValueError("an alert without labels")
        out.append(Alert(alertname=_text(a["labels"].get("alertname", "")),
                         status=_text(a.get("status") or doc.get("status") or ""),
                         fingerprint=_text(a.get("fingerprint") or ""), starts_at=_text(a.get("startsAt") or ""),
                         group_key=_text(doc.get("groupKey") or ""), receiver=_text(doc.get("receiver") or "")))
    return out


MAX_FIELD = 512  # characters kept of a label or an id: an incident id is remembered in the watch's state


def _text(v: Any) -> str:
    return (v if isinstance(v, str) else json.dumps(v))[:MAX_FIELD]


def parse_listen(spec: str, *, allow_remote: bool) -> tuple[str, int]:
    """HOST:PORT for --listen; a non-loopback HOST only with `allow_remote`."""
    m = re.fullmatch(r"\[?([^\]]*?)\]?:(\d{1,5})", spec.strip())
    if not m or not m.group(1) or int(m.group(2)) > 65535:
        raise UsageError(f"--listen {spec}: give HOST:PORT, e.g. 127.0.0.1:9798")
    host, port = m.group(1), int(m.group(2))
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        raise UsageError(f"--listen {spec}: HOST must be an IP address or localhost") from None
    if not loopback and not allow_remote:
        raise UsageError(f"--listen {spec}: {host} is not a loopback address; anyone who reaches it could start a "
                         "bisection: add --listen-remote to mean it (and put it behind your firewall)")
    return host, port


# --- who may make the watch act ------------------------------------------------------------------

def load_secret(secret_file: str | None, where: str, environ: dict[str, str] | None = None) -> str:
    """The webhook's shared secret: the playbook's `[watch] secret_file` (its content, one line;
    refused when group or others can read it, or another user than this one or root owns it), or
    ENVBISECT_WATCH_SECRET (the watch takes it out of its environment: see `take_secret_env`).
    UsageError (one line) when neither holds one of MIN_SECRET characters."""
    environ = os.environ if environ is None else environ  # type: ignore[assignment]
    if secret_file:
        try:
            with open(secret_file, "rb") as f:
                st = os.fstat(f.fileno())
                mode = st.st_mode & 0o777
                if mode & 0o077:  # as ssh refuses a private key others can read
                    raise UsageError(f"{where}: [watch] secret_file {secret_file} is readable by group or others "
                                     f"(mode 0{mode:o}): chmod 600 it") from None
                if st.st_uid not in (os.geteuid(), 0):  # its owner could rewrite it: as ssh refuses
                    raise UsageError(f"{where}: [watch] secret_file {secret_file} is owned by uid {st.st_uid}, "
                                     f"not by this user (uid {os.geteuid()}) or root: chown it") from None
                text = f.read().decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"{where}: [watch] secret_file {secret_file}: {getattr(e, 'strerror', None) or e}") \
                from None
        source = f"[watch] secret_file {secret_file}"
    else:
        text, source = environ.get(SECRET_ENV, ""), SECRET_ENV
        if not text:
            raise UsageError(f"--listen needs a shared secret, as Alertmanager's http_config sends it: put it in a "
                             f"file named by [watch] secret_file in {where}, or in {SECRET_ENV} (never on the "
                             "command line)")
    secret = text.strip()
    if len(secret) < MIN_SECRET or not secret.isprintable() or any(c.isspace() for c in secret):
        raise UsageError(f"{source}: the webhook secret must be one word of at least {MIN_SECRET} printable "
                         "characters (e.g. `openssl rand -hex 24`)")
    return secret


def take_secret_env() -> dict[str, str]:
    """ENVBISECT_WATCH_SECRET taken out of this process's environment (so that no probe command,
    notify command or other child sees it), as an environ for `load_secret`."""
    return {SECRET_ENV: os.environ.pop(SECRET_ENV)} if SECRET_ENV in os.environ else {}


def authorized(header: str | None, secret: str) -> bool:
    """`Authorization: Bearer SECRET`, or `Basic` whose password is SECRET (any user name)."""
    scheme, _, value = (header or "").strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer":
        return hmac.compare_digest(value.encode(), secret.encode())
    if scheme.lower() == "basic":
        try:
            _, _, password = base64.b64decode(value, validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return False
        return hmac.compare_digest(password.encode(), secret.encode())
    return False


def host_names(host: str, port: int) -> frozenset[str]:
    """The `Host` header values that name a listener bound to HOST:PORT."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    names = {host} if ip is None or ip.version == 4 else {f"[{host}]"}
    if host == "localhost" or (ip is not None and ip.is_loopback):
        names |= {"127.0.0.1", "localhost", "[::1]"}
    elif ip is None or ip.is_unspecified or not ip.is_loopback:
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    out = {f"{n.lower()}:{port}" for n in names}
    return frozenset(out | ({n.lower() for n in names} if port == 80 else set()))


def host_matches(header: str | None, host: str, port: int, names: frozenset[str]) -> bool:
    got = (header or "").strip().lower()
    if got in names:
        return True
    try:  # a listener on 0.0.0.0 / :: is reached by any of the machine's addresses
        unspecified = ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False
    m = re.fullmatch(r"\[?([0-9a-f.:]+)\]?:(\d+)", got)
    if not (unspecified and m and int(m.group(2)) == port):
        return False
    try:
        ipaddress.ip_address(m.group(1))
    except ValueError:
        return False
    return True


def content_is_json(value: str | None) -> bool:
    return (value or "").split(";", 1)[0].strip().lower() == "application/json"


# --- the listener --------------------------------------------------------------------------------

class _Summarised:
    """`log` for what a peer can repeat at will: the first line of a kind at once, then at most one
    per interval, saying how many more there were; `flush` says the rest."""

    def __init__(self, log: Callable[[str], None], interval_s: float = LOG_INTERVAL_S):
        self.log, self.interval_s = log, interval_s
        self.lock = threading.Lock()
        self.kinds: dict[str, list[Any]] = {}  # kind -> [count since the last line, when that line was]

    def __call__(self, kind: str, line: str) -> None:
        now = time.monotonic()
        with self.lock:
            k = self.kinds.setdefault(kind, [0, -self.interval_s])
            if now - k[1] < self.interval_s:
                k[0] += 1
                return
            more, k[0], k[1] = k[0], 0, now
        self.log(line + (f" (and {more} more like it in the last {self.interval_s:g} s)" if more else ""))

    def flush(self) -> None:
        with self.lock:
            left = [(kind, k[0]) for kind, k in self.kinds.items() if k[0]]
            for k in self.kinds.values():
                k[0] = 0
        for kind, n in left:
            self.log(f"webhook: {n} more {kind} since the last line about them")


class _Connections:
    """The connections being served, oldest first, each marked once it presented a valid request head."""

    def __init__(self, cap: int):
        self.cap = cap
        self.lock = threading.Lock()
        self.open: dict[Any, bool] = {}

    def admit(self, sock: Any) -> str:
        """"ok", "evicted" (the oldest one without a valid head was cut for it), or "refused"."""
        with self.lock:
            if len(self.open) < self.cap:
                self.open[sock] = False
                return "ok"
            victim = next((c for c, valid in self.open.items() if not valid), None)
            if victim is None:
                return "refused"
            del self.open[victim]
            self.open[sock] = False
        try:
            victim.shutdown(socket.SHUT_RDWR)  # its handler's read ends; the thread exits
        except OSError:
            pass
        return "evicted"

    def valid(self, sock: Any) -> None:
        with self.lock:
            if sock in self.open:
                self.open[sock] = True

    def release(self, sock: Any) -> None:
        with self.lock:
            self.open.pop(sock, None)


class AlertListener:
    """A small HTTP server for Alertmanager's webhook: each accepted POST's alerts that may act
    (firing, named in `alerts`) go on `alerts`, a bounded queue the watch loop reads between
    cycles. `log(line)` gets one line per refused or accepted request."""

    def __init__(self, host: str, port: int, log: Callable[[str], None], *, secret: str,
                 alerts: Sequence[str], read_deadline_s: float = READ_DEADLINE_S,
                 head_deadline_s: float = HEAD_DEADLINE_S, max_connections: int = MAX_CONNECTIONS,
                 max_queued: int = MAX_QUEUED):
        self.alerts: "queue.Queue[Alert]" = queue.Queue(maxsize=max_queued)
        self.refused_connections = 0
        self.evicted_connections = 0
        self.summarised = summarised = _Summarised(log)
        self.connections = conns = _Connections(max_connections)
        handler = _handler(self, log, secret, tuple(alerts), read_deadline_s, min(head_deadline_s, read_deadline_s))
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        me = self

        class Server(ThreadingHTTPServer):
            address_family = family
            daemon_threads = True
            request_queue_size = 64  # accepted and refused at once rather than left to the kernel's backlog

            def process_request(self, request: Any, client_address: Any) -> None:
                got = conns.admit(request)
                if got == "refused":  # every served one presented a valid head: closed unanswered, no thread
                    me.refused_connections += 1
                    summarised("refused connections", f"webhook from {client_address[0]}: connection refused: "
                               f"{conns.cap} connections with a valid request head are being served")
                    self.shutdown_request(request)
                    return
                if got == "evicted":
                    me.evicted_connections += 1
                    summarised("evicted connections", f"webhook: {conns.cap} connections open; the oldest one "
                               f"without a valid request head was evicted for one from {client_address[0]}")
                super().process_request(request, client_address)

            def process_request_thread(self, request: Any, client_address: Any) -> None:
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    conns.release(request)

            def handle_error(self, request: Any, client_address: Any) -> None:
                import sys

                e = sys.exc_info()[1]
                summarised("dropped connections",
                           f"webhook from {client_address[0]}: connection dropped ({type(e).__name__}: {e})"[:300])

        try:
            self.server = Server((host, port), handler)
        except OSError as e:
            raise UsageError(f"--listen {host}:{port}: {e.strerror or e}") from None
        self.address = self.server.server_address[:2]
        self.server.host_names = host_names(host, self.address[1]) | host_names(self.address[0], self.address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, name="envbisect-watch-listen", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.summarised.flush()


def _handler(listener: AlertListener, log: Callable[[str], None], secret: str, names: tuple[str, ...],
             read_deadline_s: float, head_deadline_s: float) -> type[BaseHTTPRequestHandler]:
    summarised = listener.summarised

    class Handler(BaseHTTPRequestHandler):
        timeout = head_deadline_s  # each read of the head; `cutoff` bounds the whole head, then the request

        def setup(self) -> None:
            super().setup()
            self.deadline = time.monotonic() + read_deadline_s
            # the head: a peer sending a byte now and then is cut off at the head's deadline
            self.cutoff = threading.Timer(head_deadline_s, self._cut)
            self.cutoff.daemon = True
            self.cutoff.start()

        def _head_is_valid(self) -> None:
            """The rest of the request has until the whole request's deadline; the connection is no
            longer one to evict."""
            self.cutoff.cancel()
            self.cutoff = threading.Timer(max(0.0, self.deadline - time.monotonic()), self._cut)
            self.cutoff.daemon = True
            self.cutoff.start()
            listener.connections.valid(self.request)

        def _cut(self) -> None:
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def finish(self) -> None:
            self.cutoff.cancel()
            try:
                super().finish()
            except OSError:
                pass

        def do_POST(self) -> None:  # noqa: N802
            refused = self._refusal()
            if refused:
                code, why = refused
                summarised(f"refusals ({code})", f"webhook from {self.client_address[0]} refused ({code}): {why}")
                self.close_connection = True
                return self._answer(code, why)
            self._head_is_valid()
            try:
                n = int(self.headers.get("Content-Length") or "-1")
            except ValueError:
                n = -1
            if n < 0:
                self.close_connection = True
                return self._answer(411, "Content-Length required")
            if n > MAX_BODY:
                self.close_connection = True
                return self._answer(413, f"body over {MAX_BODY} bytes")
            body = self._read(n)
            if body is None:
                summarised("dropped bodies", f"webhook from {self.client_address[0]} dropped: the body did not "
                           f"arrive within {read_deadline_s:g} s")
                self.close_connection = True
                return None
            try:
                got = parse_webhook(body)
            except ValueError as e:
                summarised("refusals (400)", f"webhook from {self.client_address[0]} refused: {e}"[:300])
                return self._answer(400, str(e)[:300])
            return self._queue(got)

        def _refusal(self) -> tuple[int, str] | None:
            host, port = self.server.server_address[:2]
            if not host_matches(self.headers.get("Host"), host, port, self.server.host_names):  # type: ignore
                return 400, "the Host header does not name this listener"
            if not authorized(self.headers.get("Authorization"), secret):
                return 401, ("the webhook secret is missing or wrong: send it in the Authorization header, as a "
                             "bearer token or as basic auth's password")
            if not content_is_json(self.headers.get("Content-Type")):
                return 415, "Content-Type must be application/json"
            return None

        def _read(self, n: int) -> bytes | None:
            chunks, left = [], n
            while left > 0:
                remaining = self.deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.connection.settimeout(remaining)
                try:
                    chunk = self.rfile.read1(min(left, 65536))  # type: ignore[attr-defined]
                except (TimeoutError, OSError):
                    return None
                if not chunk:
                    return None
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)

        def _queue(self, got: list[Alert]) -> None:
            acting = [a for a in got if a.status == "firing" and a.alertname in names]
            queued = dropped = 0
            for a in acting:
                try:
                    listener.alerts.put_nowait(a)
                    queued += 1
                except queue.Full:
                    dropped += 1
            ignored = len(got) - len(acting)
            line = f"{len(got)} alert(s) received, {queued} queued"
            if ignored:
                line += f", {ignored} ignored (resolved, or not in [watch] alerts)"
            if dropped:
                line += f", {dropped} dropped (the queue holds {listener.alerts.maxsize})"
                log(f"webhook from {self.client_address[0]}: {line}")
            return self._answer(503 if dropped and not queued else 200, line)

        def do_GET(self) -> None:  # noqa: N802
            self._answer(200, "envbisect watch: POST Alertmanager webhook notifications here")

        def _answer(self, code: int, text: str) -> None:
            data = (text + "\n").encode()
            self.send_response(code)
            if code == 401:
                self.send_header("WWW-Authenticate", 'Bearer realm="envbisect watch"')
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a: Any) -> None:
            pass

    return Handler


__all__ = ["Alert", "parse_webhook", "parse_listen", "load_secret", "take_secret_env", "authorized", "host_names",
           "host_matches", "content_is_json", "AlertListener", "MAX_BODY", "MAX_CONNECTIONS", "MAX_QUEUED",
           "READ_DEADLINE_S", "HEAD_DEADLINE_S", "SECRET_ENV"]
