"""One persistent agent process per host connection (agent/server.py), so that a host operation
is one message on an open channel, not a new channel, a login shell and a Python start-up.

A trial sends a couple of dozen small operations to each host (the compare-and-swap guard before
every stop and start, the journaled edits, the evidence); started one by one each cost ~0.2 s of
Python start-up on the host, most of envbisect's own time per trial. The session keeps the
one-shot semantics: each script runs in a fresh namespace with its own stdin and argv, gets its
exit status and stderr back, and a request that outlives its timeout ends the session (as the
one-shot command's channel would be closed), the next request starts a new one.

A request can be sent and its answer read later (`begin`, then `PendingCall.result`): a snapshot
sends every host its request before it waits for any answer, and one thread reads them all. The
answers are read by the thread that waits for them, from the stream itself (no reader thread, no
queue between them): an answer is a header line and the bytes it announces, never re-parsed.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Callable, Protocol

from envbisect.errors import RemoteError

log = logging.getLogger("envbisect.hosts.session")

# the most the controller reads from a host's agent as one answer (a snapshot's files, base64, in
# JSON): a host is trusted for itself only, and its answer must not take the controller's memory
MAX_ANSWER = 128 << 20
MAX_HEADER = 64 << 10  # an answer's header line (a few numbers)
_CHUNK = 1 << 20


# agent modules the scripts share: a script names one in a `from NAME import ...` line, and the
# line is sent as that module's text (a script runs alone on the host, as `python3 -c`)
SHARED_AGENT_MODULES = ("scrub",)


def _agent_file(name: str) -> str:
    return resources.files("envbisect").joinpath("hosts/agent", name).read_text()


@lru_cache(maxsize=None)
def agent_source(name: str) -> str:
    """The text of agent script `name` (e.g. "collect.py"), sent to a host as `python3 -c`, with
    each shared module it imports written in its place."""
    text = _agent_file(name)
    for module in SHARED_AGENT_MODULES:
        shared = _agent_file(f"{module}.py")
        text = re.sub(rf"^from {module} import [^\n]*$", lambda _m, shared=shared: shared, text, flags=re.M)
    return text


@lru_cache(maxsize=64)
def _source_sha(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


class AgentStream(Protocol):
    """The two ends of a started `python3 -u -c SERVER` on the host."""

    def send(self, data: bytes, timeout: float | None) -> None: ...  # TimeoutError past `timeout`
    def recv(self, limit: int, timeout: float | None) -> bytes: ...  # b"" at end of stream; TimeoutError
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


class _Refused(Exception):
    """An answer the controller will not read (too long, or not the protocol): the session ends."""


@dataclass
class PendingCall:
    """A request sent to the agent; `result()` waits for its answer (once)."""

    session: "AgentSession"
    id: int
    name: str
    head: dict[str, Any]
    stdin: bytes
    source: str
    timeout: float | None
    deadline: float | None
    generation: int  # which agent process it was sent to

    def result(self) -> AgentReply:
        return self.session.finish(self)

    def abandon(self) -> None:
        """Its answer is not wanted: when it comes it is dropped."""
        self.session.abandon(self)


class AgentSession:
    """Requests to one host's agent. Threads of one run share the connection: a request is written
    whole under the lock, and whoever reads keeps the answers others wait for."""

    def __init__(self, host: str, open_stream: Callable[[], AgentStream]):
        self.host = host
        self._open = open_stream
        self._stream: AgentStream | None = None
        self._buf = bytearray()
        self._lock = threading.Lock()
        self._next_id = 0
        self._known: set[str] = set()  # scripts the running agent has compiled
        self._awaiting: set[int] = set()  # requests sent whose answer someone will ask for
        self._early: dict[int, tuple[dict[str, Any], bytes]] = {}  # answers read for another caller
        self.started = 0  # agent processes started (one per connection unless one timed out or died)

    def call(self, name: str, source: str, stdin: bytes, timeout: float | None) -> AgentReply:
        return self.begin(name, source, stdin, timeout).result()

    def begin(self, name: str, source: str, stdin: bytes, timeout: float | None) -> PendingCall:
        """Send the request now; its answer is read by `PendingCall.result()`."""
        sha = _source_sha(source)
        with self._lock:
            if self._stream is None:
                self._start()
            self._next_id += 1
            head = {"id": self._next_id, "name": name, "sha": sha, "stdin": len(stdin), "argv": []}
            call = PendingCall(self, self._next_id, name, head, stdin, source, timeout, None, self.started)
            self._send(call, with_source=sha not in self._known)
            self._awaiting.add(call.id)
            return call

    def finish(self, call: PendingCall) -> AgentReply:
        with self._lock:
            try:
                head, payload = self._answer(call)
                if head.get("need_source"):  # the agent was restarted since it last saw this script
                    self._send(call, with_source=True)
                    head, payload = self._answer(call)
            finally:
                self._awaiting.discard(call.id)
            self._known.add(call.head["sha"])
            out = int(head.get("stdout") or 0)
            return AgentReply(int(head.get("rc", 1)), payload[:out], payload[out:])

    def abandon(self, call: PendingCall) -> None:
        with self._lock:
            self._awaiting.discard(call.id)
            self._early.pop(call.id, None)

    def close(self) -> None:
        with self._lock:
            self._stop()

    # -------------------------------------------------------------------------------------
    def _start(self) -> None:
        self._stream = self._open()
        self._known = set()
        self._buf = bytearray()
        self.started += 1

    def _stop(self) -> None:
        if self._stream is not None:
            try:
                self._stream.close()
            except Exception:  # noqa: BLE001 - closing a broken stream must not mask the real error
                pass
        self._stream = None
        self._buf = bytearray()
        self._early.clear()

    def _send(self, call: PendingCall, *, with_source: bool) -> None:
        assert self._stream is not None
        head = dict(call.head, source=call.source) if with_source else call.head
        data = json.dumps(head, separators=(",", ":")).encode() + b"\n" + call.stdin
        call.deadline = None if call.timeout is None else time.monotonic() + call.timeout
        try:
            self._stream.send(data, call.timeout)
        except TimeoutError:
            self._timed_out(call)
        except Exception:  # noqa: BLE001 - the agent (or the connection) is gone
            self._died()

    def _answer(self, call: PendingCall) -> tuple[dict[str, Any], bytes]:
        """The answer to `call`, reading (and keeping for their callers) the answers before it."""
        while True:
            if call.generation != self.started or self._stream is None:  # its agent is gone
                raise SessionDied(AgentReply(255, b"", b"envbisect: the agent ended before answering"))
            early = self._early.pop(call.id, None)
            if early is not None:
                return early
            try:
                head, payload = self._read_answer(call)
            except _Refused as e:
                self._stop()
                raise RemoteError(f"{self.host}: the agent answered {call.name} with {e}: refused "
                                  "(the session is closed)") from None
            if head.get("id") == call.id:
                return head, payload
            if head.get("id") in self._awaiting:
                self._early[head["id"]] = (head, payload)
            else:
                log.debug("%s: agent said %r", self.host, head)

    def _read_answer(self, call: PendingCall) -> tuple[dict[str, Any], bytes]:
        while True:
            end = self._buf.find(b"\n")
            if end >= 0:
                break
            if len(self._buf) > MAX_HEADER:
                raise _Refused(f"a header over {MAX_HEADER >> 10} KiB")
            self._fill(call)
        line = bytes(self._buf[:end])
        del self._buf[:end + 1]
        try:
            head = json.loads(line)
            lengths = (0, 0) if head.get("need_source") else \
                (int(head.get("stdout") or 0), int(head.get("stderr") or 0))
        except (ValueError, TypeError, AttributeError, RecursionError):
            lengths = (-1, -1)
        if min(lengths) < 0:
            raise _Refused(f"something that is not its protocol: {line[:80]!r}")
        size = sum(lengths)
        if size > MAX_ANSWER:
            raise _Refused(f"an answer over {MAX_ANSWER >> 20} MiB")
        while len(self._buf) < size:
            self._fill(call)
        payload = bytes(self._buf[:size])
        del self._buf[:size]
        return head, payload

    def _fill(self, call: PendingCall) -> None:
        assert self._stream is not None
        wait = None if call.deadline is None else call.deadline - time.monotonic()
        if wait is not None and wait <= 0:
            self._timed_out(call)
        try:
            chunk = self._stream.recv(_CHUNK, wait)
        except TimeoutError:
            self._timed_out(call)
        except Exception as e:  # noqa: BLE001 - a dead connection: the end of the stream
            log.debug("%s: agent stream ended: %s", self.host, e)
            chunk = b""
        if not chunk:
            self._died()
        self._buf += chunk

    def _timed_out(self, call: PendingCall) -> None:
        self._stop()  # as a one-shot command's channel would be: the next call starts afresh
        raise RemoteError(f"{self.host}: command timed out after {call.timeout}s: {call.name}")

    def _died(self) -> None:
        stream = self._stream
        assert stream is not None
        rc = stream.exit_status(2.0)
        err = stream.stderr_tail()
        self._stop()
        raise SessionDied(AgentReply(rc if rc is not None else 255, b"", err))
