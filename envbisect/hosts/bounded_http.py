"""HTTP requests with a total deadline and a body cap: every probe, health check and evidence fetch.

httpx's timeouts bound each read, not the request: a server that sends one byte every half second
keeps a request with a 1-second timeout alive for as long as it likes, and a body is read whole,
however large. Here the deadline is enforced under httpx, in the network stream itself (every
connect, read, write and TLS handshake is given at most the time left, and none is started once it
has passed), so a trickle of headers is cut as surely as a trickle of body; and the body is read
in chunks up to a cap, the rest left unread and the connection closed.

TLS is verified unless the playbook says `insecure = true` for that probe or service; the name
verified (and sent as SNI) is the URL's host, not the address of the SSH forward it travels through.
"""
from __future__ import annotations

import contextlib
import functools
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping

import httpcore
import httpx

HEALTH_MAX_BODY = 64 << 10  # a health answer's status is what counts
EVIDENCE_MAX_BODY = 4 << 20  # /metrics
PROBE_MAX_BODY = 8 << 20  # an LLM answer bigger than this is a flood, not an answer

_deadline = threading.local()  # the calling thread's deadline (sync httpx reads in the calling thread)


class DeadlinePassed(httpcore.ReadTimeout):
    """The request's total deadline passed (httpx raises it as an httpx.ReadTimeout)."""


def _left(timeout: float | None) -> float | None:
    """`timeout` (httpx's per-operation one) cut to what is left of this thread's deadline."""
    end = getattr(_deadline, "at", None)
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise DeadlinePassed("the request's total deadline passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):  # noqa: ANN001, ANN201
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, _left(timeout)))

    def get_extra_info(self, info: str):  # noqa: ANN201
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):  # noqa: ANN001, ANN201
        return _Stream(self._inner.connect_tcp(host, port, _left(timeout), local_address, socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):  # noqa: ANN001, ANN201
        return _Stream(self._inner.connect_unix_socket(path, _left(timeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


@functools.cache
def tls_context(insecure: bool) -> ssl.SSLContext:
    """One TLS context per process and mode, shared by every client: building one loads the CA
    bundle (about 35 ms of CPU), and a run builds a client for every health check and probe request.
    Built on first use, so SSL_CERT_FILE / SSL_CERT_DIR set before then are honoured as httpx does."""
    return httpx.create_ssl_context(verify=not insecure)


def client(*, insecure: bool = False, limits: httpx.Limits | None = None) -> httpx.Client:
    """An httpx client whose requests `request` can bound; TLS verified unless `insecure`; through
    the proxy the environment names (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, NO_PROXY), as httpx would."""
    return httpx.Client(transport=_Transport(tls_context(insecure), limits or httpx.Limits()))


@contextlib.contextmanager
def _as_httpx_errors() -> Iterator[None]:
    """httpcore's errors raised as httpx's of the same name (a ReadTimeout as httpx.ReadTimeout)."""
    try:
        yield
    except httpcore.TimeoutException as e:
        raise _httpx_class(type(e), httpx.TimeoutException)(str(e)) from e
    except (httpcore.ProxyError, httpcore.UnsupportedProtocol, httpcore.ProtocolError, httpcore.NetworkError) as e:
        raise _httpx_class(type(e), httpx.TransportError)(str(e)) from e


def _httpx_class(cls: type, fallback: type) -> type:
    for c in cls.__mro__:
        if getattr(httpcore, c.__name__, None) is c and isinstance(getattr(httpx, c.__name__, None), type):
            return getattr(httpx, c.__name__)
    return fallback


class _Body(httpx.SyncByteStream):
    def __init__(self, stream: Iterable[bytes]):
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        with _as_httpx_errors():
            yield from self._stream

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()


class _Transport(httpx.BaseTransport):
    """httpx's HTTP/1.1 transport, built from httpcore's public pools with our network backend (every
    socket operation given at most the deadline's time left); a proxy pool per proxy URL in use."""

    def __init__(self, tls: ssl.SSLContext, limits: httpx.Limits):
        self._tls, self._limits = tls, limits
        self._pools: dict[str, httpcore.ConnectionPool] = {}
        self._lock = threading.Lock()

    def _pool(self, url: httpx.URL) -> httpcore.ConnectionPool:
        proxy = _proxy_for(url)
        with self._lock:
            if proxy not in self._pools:
                kw = dict(ssl_context=self._tls, max_connections=self._limits.max_connections,
                          max_keepalive_connections=self._limits.max_keepalive_connections,
                          keepalive_expiry=self._limits.keepalive_expiry, network_backend=_Backend())
                if proxy:
                    p = httpx.Proxy(proxy)
                    target = httpcore.URL(scheme=p.url.raw_scheme, host=p.url.raw_host, port=p.url.port,
                                          target=p.url.raw_path)
                    if p.url.scheme.startswith("socks"):  # needs socksio, as httpx's own SOCKS transport
                        self._pools[proxy] = httpcore.SOCKSProxy(proxy_url=target, proxy_auth=p.raw_auth, **kw)
                    else:
                        self._pools[proxy] = httpcore.HTTPProxy(proxy_url=target, proxy_auth=p.raw_auth,
                                                                proxy_headers=p.headers.raw, **kw)
                else:
                    self._pools[proxy] = httpcore.ConnectionPool(**kw)
            return self._pools[proxy]

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        req = httpcore.Request(method=request.method, headers=request.headers.raw, extensions=request.extensions,
                               url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port,
                                                target=url.raw_path),
                               content=request.stream)  # type: ignore[arg-type]
        with _as_httpx_errors():
            resp = self._pool(url).handle_request(req)
        return httpx.Response(resp.status, headers=resp.headers, stream=_Body(resp.stream),  # type: ignore[arg-type]
                              extensions=resp.extensions)

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()


def _proxy_for(url: httpx.URL) -> str:
    """The proxy URL the environment names for `url` ("" for none), read as the standard library does."""
    import urllib.request

    proxies = urllib.request.getproxies()
    proxy = proxies.get(url.scheme) or proxies.get("all") or ""
    if proxy and urllib.request.proxy_bypass(url.netloc.decode("ascii", "replace")):
        return ""
    if proxy and "://" not in proxy:
        proxy = "http://" + proxy
    return proxy


@dataclass(frozen=True)
class Answer:
    """A response read within the deadline: status, the body up to the cap, whether it was cut."""

    status_code: int
    body: bytes
    cut: bool  # the body went on past the cap: what is here is its beginning
    first_byte_s: float | None  # seconds from sending to the first body bytes (a stream's TTFT)
    seconds: float

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def cut_note(self) -> str:
        return f"body cut at {_size(len(self.body))} (over the cap)" if self.cut else ""


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n >> 10} KiB" if n >= 1024 else f"{n} bytes"


def request(c: httpx.Client, method: str, url: str, *, deadline_s: float, max_body: int,
            headers: Mapping[str, str] | None = None, content: str | bytes | None = None,
            sni_host: str | None = None) -> Answer:
    """One request, finished (or cut) within `deadline_s` seconds in all: connect, TLS, headers and
    body. Raises httpx.TimeoutException when the deadline passes (a hang), httpx.HTTPError for the
    rest. A body longer than `max_body` is cut there (`Answer.cut`): the rest is never read.
    `sni_host`: the name TLS verifies (and sends), when `url` points at a forward of it."""
    t0 = time.monotonic()
    _deadline.at = t0 + deadline_s
    ext = {"sni_hostname": sni_host} if sni_host and url.startswith("https:") else None
    try:
        with c.stream(method, url, headers={"Accept-Encoding": "identity", **dict(headers or {})}, content=content,
                      timeout=deadline_s, extensions=ext) as resp:
            chunks: list[bytes] = []
            size, cut, first = 0, False, None
            for chunk in resp.iter_raw():
                if first is None and chunk:
                    first = time.monotonic() - t0
                if size + len(chunk) > max_body:
                    chunks.append(chunk[: max_body - size])
                    size, cut = max_body, True
                    break
                chunks.append(chunk)
                size += len(chunk)
            body = b"".join(chunks)
            if not cut and resp.headers.get("content-encoding"):
                body = _decoded(resp, body, max_body)
            return Answer(resp.status_code, body, cut, first, time.monotonic() - t0)
    finally:
        _deadline.at = None


def _decoded(resp: httpx.Response, raw: bytes, max_body: int) -> bytes:
    """A gzip/deflate body (sent although identity was asked for), decoded up to the cap: a small
    compressed body must not expand without bound either. Other encodings stay as they came."""
    import zlib

    if resp.headers.get("content-encoding", "").strip().lower() not in ("gzip", "deflate"):
        return raw
    try:
        return zlib.decompressobj(zlib.MAX_WBITS | 32).decompress(raw, max_body)
    except zlib.error:
        return raw


def tls_problem(e: BaseException) -> str | None:
    """"TLS verification failed: WHY" when `e` is a certificate that did not verify, else None."""
    import ssl

    chain: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and all(cur is not c for c in chain):
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    for c in chain:
        if isinstance(c, ssl.SSLCertVerificationError):
            return f"TLS verification failed: {c.verify_message or c.reason or c}"
    if any("CERTIFICATE_VERIFY_FAILED" in str(c) for c in chain):
        return f"TLS verification failed: {e}"
    return None


def describe(e: BaseException, deadline_s: float) -> str:
    """One line for a request that did not finish."""
    if isinstance(e, httpx.TimeoutException):
        return f"no answer within {deadline_s:g} s (hang)"
    tls = tls_problem(e)
    if tls:
        return tls
    return f"{type(e).__name__}: {e}"[:200]

