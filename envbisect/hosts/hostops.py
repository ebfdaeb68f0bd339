"""Local side of envbisect/remote/hostops.py: batched host operations in one round trip."""
from __future__ import annotations

import base64
import json
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping, Sequence

from envbisect.errors import HostConflict, LockLost, RemoteError
from envbisect.hosts.transport import Transport


@lru_cache(maxsize=1)
def _source() -> str:
    return resources.files("envbisect").joinpath("hosts/agent/hostops.py").read_text()


def run_ops(transport: Transport, ops: Sequence[Mapping[str, Any]], *, timeout: float = 120) -> list[dict[str, Any]]:
    """Run ops in order on the host; raises RemoteError with the host's one-line reason on the first failure."""
    if not ops:
        return []
    res = transport.run_python(_source(), stdin=json.dumps({"ops": list(ops)}).encode(), timeout=timeout)
    if not res.ok:
        raise RemoteError(f"{transport.host}: host operation failed: {res.stderr_line()}")
    try:
        doc = json.loads(res.stdout)
    except ValueError:
        raise RemoteError(f"{transport.host}: unexpected output from host operation: {res.stdout[:80]!r}") from None
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
