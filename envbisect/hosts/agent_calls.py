"""Controller side of the agent scripts (envbisect/hosts/agent/): one round trip each, JSON in and
out; and batched host operations (agent/hostops.py) in one round trip."""
from __future__ import annotations

import base64
import json
from typing import Any, Callable, Mapping, Sequence, TypeVar

from envbisect.errors import ConnectionFailed, EnvbisectError, HostConflict, LockLost, RemoteError
from envbisect.hosts.session import agent_source
from envbisect.hosts.transport import Transport
from envbisect.hosts.transport_base import AgentCall, CommandResult

__all__ = ["agent_source", "run_agent", "run_agent_on_each", "run_ops", "b64", "unb64"]

T = TypeVar("T")


def run_agent(transport: Transport, name: str, request: Mapping[str, Any], *, what: str,
              timeout: float = 120) -> dict[str, Any]:
    """Run agent script `name` on the host with `request` as JSON on stdin; its JSON answer. A
    failure or an answer that is not a JSON object is a RemoteError naming the host and `what`."""
    res = transport.run_agent_script(name, agent_source(name), stdin=_request_bytes(request), timeout=timeout)
    return _answer(transport, res, what)


def run_agent_on_each(transports: Mapping[str, Transport], name: str, requests: Mapping[str, Mapping[str, Any]], *,
                      what: str, timeout: float = 120) -> dict[str, dict[str, Any]]:
    """`run_agent` on every host of `requests` at once, in one round trip each: every request is sent
    before any answer is awaited, and this thread reads the answers (no thread per host). The first
    host (in `requests`' order) that fails raises its error; a connection error is ConnectionFailed."""
    source = agent_source(name)
    calls: dict[str, AgentCall] = {}
    try:
        for host, request in requests.items():
            calls[host] = _each(host, lambda: transports[host].send_agent_script(
                name, source, stdin=_request_bytes(request), timeout=timeout))
        answers: dict[str, dict[str, Any]] = {}
        for host in list(calls):
            call = calls.pop(host)
            answers[host] = _each(host, lambda: _answer(transports[host], call.result(), what))
        return answers
    finally:
        for call in calls.values():  # not read: an earlier host failed
            call.abandon()


def _each(host: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except EnvbisectError:
        raise
    except OSError as e:
        raise ConnectionFailed(f"{host}: {e}") from None


def _request_bytes(request: Mapping[str, Any]) -> bytes:
    return json.dumps(request, separators=(",", ":")).encode()


def _answer(transport: Transport, res: CommandResult, what: str) -> dict[str, Any]:
    if not res.ok:
        raise RemoteError(f"{transport.host}: {what} failed ({transport.python}): {res.stderr_line()}")
    try:
        doc = json.loads(res.stdout)
    except (ValueError, RecursionError):  # a host's answer is data: nested past the parser's depth is not JSON
        raise RemoteError(f"{transport.host}: {what} printed something that is not JSON: {res.stdout[:80]!r}") from None
    if not isinstance(doc, dict):
        raise RemoteError(f"{transport.host}: {what} answered an unexpected document")
    return doc


def run_ops(transport: Transport, ops: Sequence[Mapping[str, Any]], *, timeout: float = 120) -> list[dict[str, Any]]:
    """Run ops in order on the host; raises RemoteError with the host's one-line reason on the first failure."""
    if not ops:
        return []
    doc = run_agent(transport, "hostops.py", {"ops": list(ops)}, what="host operation", timeout=timeout)
    if doc.get("conflict"):
        c = doc["conflict"]
        cls = LockLost if c.get("lock_lost") else HostConflict
        raise cls(transport.host, c, f"{transport.host}: {doc['error']}")
    if doc.get("error"):
        raise RemoteError(f"{transport.host}: {doc['error']}")
    return doc["results"]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)
