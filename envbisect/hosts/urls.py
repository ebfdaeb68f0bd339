"""A service's URL as seen from its host: split into (host, port, path), fetched or health-checked
through the host's forward, within a total deadline and a body cap (bounded_http)."""
from __future__ import annotations

from urllib.parse import urlsplit

import httpx

from envbisect.hosts import bounded_http
from envbisect.hosts.transport import Transport


def split_url(url: str) -> tuple[str, int, str]:
    u = urlsplit(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    path = u.path or "/"
    if u.query:
        path += "?" + u.query
    return u.hostname or "127.0.0.1", port, path


def fetch(transport: Transport, url: str, timeout: float = 5.0, *, insecure: bool = False,
          max_body: int = bounded_http.EVIDENCE_MAX_BODY) -> bounded_http.Answer:
    """GET a URL as seen from the host (through its forward), within `timeout` seconds in all and
    `max_body` bytes; raises httpx.HTTPError (httpx.TimeoutException past the deadline)."""
    host, port, path = split_url(url)
    with transport.forward(host, port) as (h, p), bounded_http.client(insecure=insecure) as c:
        return _response(c, h, p, path, url, timeout, max_body)


def health_ok(transport: Transport, url: str, timeout: float = 5.0, *, insecure: bool = False) -> tuple[bool, str]:
    host, port, path = split_url(url)
    with transport.forward(host, port) as (h, p):
        return forwarded_health(h, p, path, url, timeout, insecure)


def _response(c: httpx.Client, h: str, p: int, path: str, url: str, timeout: float,
              max_body: int) -> bounded_http.Answer:
    u = urlsplit(url)
    return bounded_http.request(c, "GET", f"{u.scheme or 'http'}://{h}:{p}{path}", deadline_s=timeout,
                                max_body=max_body, headers={"Host": u.netloc}, sni_host=u.hostname)


def forwarded_health(h: str, p: int, path: str, url: str, timeout: float, insecure: bool = False) -> tuple[bool, str]:
    """Health as (ok, why) over an already open forward, within `timeout` seconds in all."""
    try:
        with bounded_http.client(insecure=insecure) as c:
            r = _response(c, h, p, path, url, timeout, bounded_http.HEALTH_MAX_BODY)
        return r.status_code == 200, f"HTTP {r.status_code}"
    except httpx.HTTPError as e:
        return False, bounded_http.describe(e, timeout)
