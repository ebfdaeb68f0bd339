"""Controller side of the agent scripts (envbisect/hosts/agent/): one round trip each, JSON in and
out; and batched host operations (agent/hostops.py) in one round trip."""
from __future__ import annotations

import base64
import json
from typing import Any, Mapping, Sequence

from envbisect.errors import HostConflict, LockLost, RemoteError
from envbisect.hosts.session import agent_source
from envbisect.hosts.transport import Transport

__all__ = ["agent_source", "run_agent", "run_ops", "b64", "unb64"]


def run_agent(transport: Transport, name: str, request: Mapping[str, Any], *, what: str,
              timeout: float = 120) -> dict[str, Any]:
    """Run agent script `name` on the host with `request` as JSON on stdin; its JSON answer. A
    failure or an answer that is not a JSON object is a RemoteError naming the host and `what`."""
    res = transport.run_agent_script(name, agent_source(name), stdin=json.dumps(request).encode(), timeout=timeout)
    if not res.ok:
        raise RemoteError(f"{transport.host}: {what} failed ({transport.python}): {res.stderr_line()}")
    try:
        doc = json.loads(res.stdout)
    except ValueError:
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
