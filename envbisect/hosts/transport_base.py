"""The one narrow door to a host, as everything above the hosts sees it: run a command, reach a TCP
port as seen from that host, run an agent script through the persistent agent. `Transport` is the
protocol; `LocalTransport` is the demo's `ssh = "local"` (the SSH one is envbisect.hosts.transport).
"""
from __future__ import annotations

import contextlib
import logging
import os
import select
import shlex
import signal
import subprocess
import threading
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterator

from envbisect.errors import RemoteError
from envbisect.hosts.session import AgentSession, PendingCall, SessionDied, agent_source

# the transports' one log (the SSH transport, its target and its host keys log here too): the name
# users filter on
log = logging.getLogger("envbisect.hosts.transport")


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def stderr_line(self) -> str:
        text = self.stderr.decode("utf-8", "replace").strip().splitlines()
        return text[-1] if text else f"exit status {self.exit_code}"


class Transport:
    """A host envbisect can act on. `round_trips` counts commands sent (the cost that matters on a WAN)."""

    host: str
    python: str = "python3"

    def __init__(self) -> None:
        self.round_trips = 0

    def run(self, command: str, *, stdin: bytes | None = None, timeout: float | None = None) -> CommandResult:
        self.round_trips += 1
        log.debug("%s: round trip %d: %s", self.host, self.round_trips, command[:120])
        return self._run(command, stdin=stdin, timeout=timeout)

    def run_python(self, script: str, *args: str, stdin: bytes | None = None,
                   timeout: float | None = None) -> CommandResult:
        """Run a Python script on the host in one round trip; data goes on stdin, never through a shell."""
        cmd = " ".join([shlex.quote(self.python), "-c", shlex.quote(script), *map(shlex.quote, args)])
        return self.run(cmd, stdin=stdin, timeout=timeout)

    def run_agent_script(self, name: str, source: str, *, stdin: bytes = b"",
                         timeout: float | None = None) -> CommandResult:
        """Run one of envbisect's agent scripts (stdlib Python, JSON on stdin) as `run_python`
        would, through this connection's persistent agent when it has one: one message on an
        open channel instead of a new channel and a Python start-up on the host."""
        if self._agent_session() is None:
            return self.run_python(source, stdin=stdin, timeout=timeout)
        return self.send_agent_script(name, source, stdin=stdin, timeout=timeout).result()

    def send_agent_script(self, name: str, source: str, *, stdin: bytes = b"",
                          timeout: float | None = None) -> "AgentCall":
        """`run_agent_script`, sent now and answered by `AgentCall.result()`: the requests to many
        hosts go out before any answer is awaited, and one thread reads the answers."""
        session = self._agent_session()
        if session is None:
            return AgentCall(self, thread=_Worker(lambda: self.run_python(source, stdin=stdin, timeout=timeout)))
        self.round_trips += 1
        log.debug("%s: round trip %d: agent %s", self.host, self.round_trips, name)
        try:
            return AgentCall(self, pending=session.begin(name, source, stdin, timeout))
        except SessionDied as e:
            return AgentCall(self, died=e)

    def _agent_session(self) -> AgentSession | None:
        """The persistent agent, started on first use; None: run each script as its own command."""
        if os.environ.get("ENVBISECT_ONE_SHOT_AGENT"):  # for measuring what the session saves
            return None
        if getattr(self, "_session", None) is None:
            self._session = AgentSession(self.host, self._open_agent_stream)
        return self._session

    def _agent_command(self) -> str:
        return " ".join([shlex.quote(self.python), "-u", "-c", shlex.quote(agent_source("server.py"))])

    def _open_agent_stream(self):  # noqa: ANN202 - an AgentStream
        raise NotImplementedError

    def _close_agent(self) -> None:
        session = getattr(self, "_session", None)
        if session is not None:
            session.close()

    def check(self, command: str, *, stdin: bytes | None = None, timeout: float | None = None,
              what: str = "") -> CommandResult:
        res = self.run(command, stdin=stdin, timeout=timeout)
        if not res.ok:
            raise RemoteError(f"{self.host}: {what or command[:60]} failed: {res.stderr_line()}")
        return res

    def _run(self, command: str, *, stdin: bytes | None, timeout: float | None) -> CommandResult:
        raise NotImplementedError

    @contextlib.contextmanager
    def forward(self, host: str, port: int) -> Iterator[tuple[str, int]]:
        """Yield a local (host, port) whose TCP connections arrive at host:port as seen from this host."""
        yield host, port

    def alive(self) -> bool:
        """Is the connection still up? A probe that failed over a dead connection proves nothing."""
        return True

    def close(self) -> None:
        pass

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Worker:
    """A one-shot agent script (no persistent agent) run on a thread of its own."""

    def __init__(self, fn: Callable[[], CommandResult]):
        self._fn = fn
        self._result: CommandResult | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._fn()
        except BaseException as e:  # noqa: BLE001 - raised again by result()
            self._error = e

    def result(self) -> CommandResult:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


class AgentCall:
    """An agent script sent to a host (Transport.send_agent_script); `result()` waits for it."""

    def __init__(self, transport: Transport, *, pending: PendingCall | None = None, died: SessionDied | None = None,
                 thread: _Worker | None = None):
        self.transport, self._pending, self._died, self._thread = transport, pending, died, thread

    def result(self) -> CommandResult:
        if self._thread is not None:
            return self._thread.result()
        try:
            if self._died is not None:
                raise self._died
            assert self._pending is not None
            reply = self._pending.result()
        except SessionDied as e:
            if not self.transport.alive():
                raise RemoteError(f"{self.transport.host}: lost the ssh connection") from None
            return CommandResult(e.reply.exit_code, e.reply.stdout, e.reply.stderr)
        return CommandResult(reply.exit_code, reply.stdout, reply.stderr)

    def abandon(self) -> None:
        """Its answer is not wanted (an earlier host failed): it is dropped when it comes."""
        if self._pending is not None:
            self._pending.abandon()


class StderrTail:
    """The last bytes an agent wrote to stderr (read on a thread: a full pipe would stall it)."""

    def __init__(self, read: Callable[[int], bytes]) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0

        def drain() -> None:
            try:
                while True:
                    try:
                        chunk = read(65536)
                    except TimeoutError:  # a channel's one timeout, set for its other stream
                        continue
                    if not chunk:
                        return
                    self._chunks.append(chunk)
                    self._size += len(chunk)
                    while self._size > 65536 and len(self._chunks) > 1:
                        self._size -= len(self._chunks.popleft())
            except Exception:  # noqa: BLE001 - a closed stream ends the drain
                return

        self._thread = threading.Thread(target=drain, daemon=True)
        self._thread.start()

    def get(self, wait_s: float = 0.5) -> bytes:
        self._thread.join(wait_s)
        return b"".join(self._chunks)


class _ProcessStream:
    """The persistent agent as a local process (LocalTransport)."""

    def __init__(self, command: str):
        self.p = subprocess.Popen(["bash", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, start_new_session=True)
        self._err = StderrTail(self.p.stderr.read1)  # type: ignore[union-attr]

    def send(self, data: bytes, timeout: float | None) -> None:  # a local pipe: the agent reads it at once
        assert self.p.stdin is not None
        self.p.stdin.write(data)
        self.p.stdin.flush()

    def recv(self, limit: int, timeout: float | None) -> bytes:
        assert self.p.stdout is not None
        fd = self.p.stdout.fileno()
        if not select.select([fd], [], [], timeout)[0]:
            raise TimeoutError
        return os.read(fd, limit)

    def stderr_tail(self) -> bytes:
        return self._err.get()

    def exit_status(self, wait_s: float) -> int | None:
        try:
            return self.p.wait(wait_s)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.p.stdin.close()  # type: ignore[union-attr]
        try:
            self.p.wait(1.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(self.p.pid, 9)
            self.p.wait(5)


class LocalTransport(Transport):
    def __init__(self, host: str = "local", python: str = "python3"):
        super().__init__()
        self.host, self.python = host, python

    def _open_agent_stream(self) -> _ProcessStream:
        return _ProcessStream(self._agent_command())

    def close(self) -> None:
        self._close_agent()

    def _run(self, command: str, *, stdin: bytes | None, timeout: float | None) -> CommandResult:
        # its own process group: past the timeout the whole command goes (bash and what it started,
        # `sleep 1000 &` included), not bash alone; a child still holding the pipes would otherwise
        # keep the read going forever. A service started detached (setsid) is in a group of its own.
        p = subprocess.Popen(["bash", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = p.communicate(stdin or b"", timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(p.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.communicate(timeout=5)
            raise RemoteError(f"{self.host}: command timed out after {timeout}s: {command[:60]}") from None
        except BaseException:
            _kill_group(p.pid)
            raise
        return CommandResult(p.returncode, out, err)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)

