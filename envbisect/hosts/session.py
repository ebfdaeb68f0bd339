"""One persistent agent process per host connection (agent/server.py), so that a host operation
is one message on an open channel, not a new channel, a login shell and a Python start-up.

A trial sends a couple of dozen small operations to each host (the compare-and-swap guard before
every stop and start, the journaled edits, the evidence); started one by one each cost ~0.2 s of
Python start-up on the host, most of envbisect's own time per trial. The session keeps the
one-shot semantics: each script runs in a fresh namespace with its own stdin and argv, gets its
exit status and stderr back, and a request that outlives its timeout ends the session (as the
one-shot command's channel would be closed), the next request starts a new one.
"""
from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Callable, Protocol

from envbisect.errors import RemoteError

log = logging.getLogger("envbisect.hosts.session")

# the longest line the controller reads from a host's agent (one answer: a snapshot's files, base64, in
# JSON): a host is trusted for itself only, and a line without end must not take the controller's memory
MAX_LINE = 128 << 20
_TOO_LONG = b"\0too long"  # what the reader thread hands on for a line over MAX_LINE (never valid JSON)


@lru_cache(maxsize=None)
def agent_source(name: str) -> str:
    """The text of agent script `name` (e.g. "collect.py"), sent to a host as `python3 -c`."""
    return resources.files("envbisect").joinpath("hosts/agent", name).read_text()


class AgentStream(Protocol):
    """The two ends of a started `python3 -u -c SERVER` on the host."""

    def send(self, data: bytes) -> None: ...
    def readline(self, limit: int) -> bytes: ...  # b"" at end of stream; at most `limit` bytes
    def stderr_tail(self) -> bytes: ...
    def exit_status(self, wait_s: float) -> int | None: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class AgentReply:
    exit_code: int
    stdout: bytes
    stderr: bytes


class SessionDied(Exception):
    """The agent process ended before answering; `reply` is what a one-shot run would have returned."""

    def __init__(self, reply: AgentReply):
        super().__init__(reply.stderr.decode("utf-8", "replace")[-200:])
        self.reply = reply


class AgentSession:
    """Requests to one host's agent, one at a time (threads of one run share the connection)."""

    def __init__(self, host: str, open_stream: Callable[[], AgentStream]):
        self.host = host
        self._open = open_stream
        self._stream: AgentStream | None = None
        self._lines: queue.Queue[bytes] | None = None
        self._lock = threading.Lock()
        self._next_id = 0
        self._known: set[str] = set()  # scripts the running agent has compiled
        self.started = 0  # agent processes started (one per connection unless one timed out or died)

    def call(self, name: str, source: str, stdin: str, timeout: float | None) -> AgentReply:
        sha = hashlib.sha256(source.encode()).hexdigest()
        with self._lock:
            if self._stream is None:
                self._start()
            self._next_id += 1
            req = {"id": self._next_id, "name": name, "sha": sha, "stdin": stdin, "argv": []}
            if sha not in self._known:
                req["source"] = source
            ans = self._exchange(req, timeout, name)
            if ans.get("need_source"):  # the agent was restarted since it last saw this script
                ans = self._exchange(dict(req, source=source), timeout, name)
            self._known.add(sha)
            return AgentReply(int(ans.get("rc", 1)), str(ans.get("stdout", "")).encode(),
                              str(ans.get("stderr", "")).encode())

    def close(self) -> None:
        with self._lock:
            self._stop()

    # -------------------------------------------------------------------------------------
    def _start(self) -> None:
        self._stream = self._open()
        self._known = set()
        self.started += 1
        lines: queue.Queue[bytes] = queue.Queue()
        stream = self._stream

        def pump() -> None:
            try:
                while True:
                    line = stream.readline(MAX_LINE + 1)
                    if len(line) > MAX_LINE:
                        lines.put(_TOO_LONG)  # the rest is not read: the session ends
                        return
                    lines.put(line)
                    if not line:
                        return
            except Exception as e:  # a dead connection: seen by the caller as the end of the stream
                log.debug("%s: agent stream ended: %s", self.host, e)
                lines.put(b"")

        threading.Thread(target=pump, name=f"agent-{self.host}", daemon=True).start()
        self._lines = lines

    def _stop(self) -> None:
        if self._stream is not None:
            try:
                self._stream.close()
            except Exception:  # noqa: BLE001 - closing a broken stream must not mask the real error
                pass
        self._stream, self._lines = None, None

    def _exchange(self, req: dict, timeout: float | None, name: str) -> dict:
        assert self._stream is not None and self._lines is not None
        try:
            self._stream.send((json.dumps(req) + "\n").encode())
        except Exception:  # noqa: BLE001 - the agent (or the connection) is gone
            self._died()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self._stop()  # as a one-shot command's channel would be: the next call starts afresh
                raise RemoteError(f"{self.host}: command timed out after {timeout}s: {name}") from None
            if line == _TOO_LONG:
                self._stop()
                raise RemoteError(f"{self.host}: the agent answered {name} with a line over {MAX_LINE >> 20} MiB: "
                                  "refused (the session is closed)")
            if not line:
                self._died()
            try:
                ans = json.loads(line)
            except ValueError:
                log.debug("%s: agent said %r", self.host, line[:200])
                continue
            if ans.get("id") == req["id"]:
                return ans

    def _died(self) -> None:
        stream = self._stream
        assert stream is not None
        rc = stream.exit_status(2.0)
        err = stream.stderr_tail()
        self._stop()
        raise SessionDied(AgentReply(rc if rc is not None else 255, b"", err))
