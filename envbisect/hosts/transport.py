"""The one narrow door to a host: run a command, and reach a TCP port as seen from that host.

Two implementations: `LocalTransport` (the demo's `ssh = "local"`) and `SSHTransport` (paramiko,
resolved through the user's OpenSSH config, known_hosts enforced). Everything above this module
is written against `Transport` and never knows which one it holds.

Size (819 lines): the SSH and local transports share one connection lifecycle (retries, ProxyJump chains, host-key policy, the persistent agent's channel).
"""
from __future__ import annotations

import base64
import contextlib
import logging
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import paramiko
from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from envbisect.hosts import sshconfig
from envbisect.errors import ConnectionFailed, HostKeyError, RemoteError, UsageError
from envbisect.inputs.playbook import Host
from envbisect.hosts.sshconfig import Jump
from envbisect.hosts.session import AgentSession, SessionDied, agent_source

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

    def run_python(self, script: str, *args: str, stdin: bytes | None = None, timeout: float | None = None) -> CommandResult:
        """Run a Python script on the host in one round trip; data goes on stdin, never through a shell."""
        cmd = " ".join([shlex.quote(self.python), "-c", shlex.quote(script), *map(shlex.quote, args)])
        return self.run(cmd, stdin=stdin, timeout=timeout)

    def run_agent_script(self, name: str, source: str, *, stdin: bytes = b"", timeout: float | None = None) -> CommandResult:
        """Run one of envbisect's agent scripts (stdlib Python, JSON on stdin) as `run_python`
        would, through this connection's persistent agent when it has one: one message on an
        open channel instead of a new channel and a Python start-up on the host."""
        session = self._agent_session()
        if session is None:
            return self.run_python(source, stdin=stdin, timeout=timeout)
        self.round_trips += 1
        log.debug("%s: round trip %d: agent %s", self.host, self.round_trips, name)
        try:
            reply = session.call(name, source, stdin.decode("utf-8"), timeout)
        except SessionDied as e:
            if not self.alive():
                raise RemoteError(f"{self.host}: lost the ssh connection") from None
            return CommandResult(e.reply.exit_code, e.reply.stdout, e.reply.stderr)
        return CommandResult(reply.exit_code, reply.stdout, reply.stderr)

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

    def check(self, command: str, *, stdin: bytes | None = None, timeout: float | None = None, what: str = "") -> CommandResult:
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


class _StderrTail:
    """The last bytes an agent wrote to stderr (read on a thread: a full pipe would stall it)."""

    def __init__(self, read: "callable") -> None:  # type: ignore[valid-type]
        self._chunks: deque[bytes] = deque()
        self._size = 0

        def drain() -> None:
            try:
                while True:
                    chunk = read(65536)
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
        self._err = _StderrTail(self.p.stderr.read1)  # type: ignore[union-attr]

    def send(self, data: bytes) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(data)
        self.p.stdin.flush()

    def readline(self, limit: int) -> bytes:
        assert self.p.stdout is not None
        return self.p.stdout.readline(limit)

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


# --- SSH ------------------------------------------------------------------------------------

class _OnlyWhenDebugging(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return logging.getLogger().isEnabledFor(logging.DEBUG)


# paramiko logs a failed handshake (a proxy command or jump host that gave up, a banner that never
# came) as ERROR tracebacks from its own thread; envbisect says what failed in one line instead
_PARAMIKO_LOG = logging.getLogger("envbisect.paramiko")
_PARAMIKO_LOG.addFilter(_OnlyWhenDebugging())

_POLL_S = 0.2  # how often a command's reads look at its deadline
MAX_OUTPUT = 256 << 20  # a command's stdout (a snapshot's one-shot collector prints every file, base64)
_ERR_KEEP = 1 << 20  # of its stderr, the last MiB
_GROUP_MARK = b"\0envbisect-pgid="
# each command runs as a process group of its own (a job of a bash with job control on: `set -m`), and
# the group is said first on stderr, so a command past its deadline can be killed whole on the host
# (`sleep 1000 &` inside it included, not bash alone); the wrapper's own job messages go nowhere
_GROUP_WRAPPER = ("exec bash -c 'set -m; bash -c \"$1\" 2>&3 3>&- & printf \"\\0envbisect-pgid=%d\\n\" \"$!\" >&3; "
                  "wait \"$!\"' envbisect-run ")
_GROUP_REDIRECTS = " 3>&2 2>/dev/null"

MAX_JUMP_HOPS = 8  # a longer chain is a loop (say `Host *` with a ProxyJump that matches the jump host too)


@dataclass(frozen=True)
class SSHTarget:
    """Where and how to connect, after the user's OpenSSH config has been applied (see sshconfig.py)."""

    alias: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    known_hosts_files: tuple[str, ...]  # UserKnownHostsFile: an unknown key accepted with --accept-new-host-key goes to the first
    proxy_jump: tuple[Jump, ...] = ()   # hops, nearest first
    proxy_command: str | None = None    # tokens expanded
    connect_timeout: float = 10.0
    global_known_hosts_files: tuple[str, ...] = ()
    host_key_alias: str | None = None
    identities_only: bool = False
    allow_agent: bool = True
    hash_known_hosts: bool = False  # HashKnownHosts: a key accepted with --accept-new-host-key is recorded hashed

    @property
    def display(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        """The name looked up in known_hosts: HostKeyAlias, else host or [host]:port (as ssh does)."""
        if self.host_key_alias:
            return self.host_key_alias
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def parse_spec(spec: str) -> tuple[str | None, str, int | None]:
    """"alias", "user@host", "user@host:port", "[v6addr]:port" -> (user, host, port)."""
    user = None
    port = None
    rest = spec
    if "@" in rest:
        user, rest = rest.rsplit("@", 1)
    p = None
    if rest.startswith("[") and "]" in rest:
        host, _, tail = rest[1:].partition("]")
        if tail:
            if not tail.startswith(":"):
                raise UsageError(f"bad ssh target {spec!r}")
            p = tail[1:]
        rest = host
    elif rest.count(":") == 1:
        rest, p = rest.split(":")
    if p is not None:
        if not p.isdigit() or not 0 < int(p) < 65536:
            raise UsageError(f"bad ssh target {spec!r}: port {p!r}: port must be 1-65535")
        port = int(p)
    if not rest:
        raise UsageError(f"bad ssh target {spec!r}: no host")
    return user, rest, port


def resolve_target(spec: str, ssh_config: str | Path | None, options: tuple[tuple[str, str], ...] = ()) -> SSHTarget:
    """Resolve "alias", "user@host" or "user@host:port" through the OpenSSH config like `ssh` would
    (`ssh -F ssh_config`, or ~/.ssh/config then /etc/ssh/ssh_config); ``options`` are `-o KEY VALUE`
    options, which come first (an inventory's ansible_user, ansible_port...)."""
    user, host, port = parse_spec(spec)
    c = sshconfig.resolve(host, config=ssh_config, options=options, user=user, port=port)
    log.debug("%s: ssh config: %s", spec, sshconfig.describe(c))
    if c.identity_agent not in (None, "none", "SSH_AUTH_SOCK"):
        log.warning("%s: IdentityAgent %s is not supported (the agent at $SSH_AUTH_SOCK is used)", spec, c.identity_agent)
    return SSHTarget(
        alias=host, hostname=c.hostname, port=c.port, user=c.user, identity_files=c.identity_files,
        known_hosts_files=c.user_known_hosts, proxy_jump=c.proxy_jump, proxy_command=c.expanded_proxy_command(),
        connect_timeout=float(c.connect_timeout) if c.connect_timeout else 10.0,
        global_known_hosts_files=c.global_known_hosts, host_key_alias=c.host_key_alias,
        identities_only=c.identities_only, allow_agent=c.identity_agent != "none",
        hash_known_hosts=(c.raw.get("hashknownhosts") or ("no",))[0].lower() in ("yes", "true"),
    )


class _ProxyCommand:
    """A socket-like pipe to a ProxyCommand, run like ssh runs it (``$SHELL -c "exec COMMAND"``, so
    quotes, pipes and variables mean what they mean to ssh; paramiko's own splits words instead).
    Its stderr is kept (last lines) for the error message, never sent to the terminal."""

    def __init__(self, command: str):
        self.command = command
        shell = os.environ.get("SHELL") or "/bin/sh"
        self.process = subprocess.Popen([shell, "-c", "exec " + command], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
                                        start_new_session=True)
        self.timeout: float | None = None
        self._err = bytearray()
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()

    def _drain(self) -> None:
        while True:
            chunk = self.process.stderr.read(4096)
            if not chunk:
                break
            self._err = (self._err + chunk)[-4096:]

    def outcome(self, wait_s: float = 1.0) -> tuple[int | None, str]:
        """(exit status or None while it runs, last line of its stderr), for an error message: a
        command that closed its output is given a moment to exit and finish its stderr."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(wait_s)
        self._drainer.join(wait_s if self.process.returncode is not None else 0)
        lines = self._err.decode("utf-8", "replace").strip().splitlines()
        return self.process.returncode, lines[-1] if lines else ""

    def send(self, data: bytes) -> int:
        try:
            self.process.stdin.write(data)
        except OSError as e:
            raise paramiko.ProxyCommandFailure(self.command, e.strerror or str(e)) from None
        return len(data)

    def recv(self, size: int) -> bytes:
        import select

        try:
            r, _, _ = select.select([self.process.stdout], [], [], self.timeout)
            if not r:
                raise socket.timeout()
            return os.read(self.process.stdout.fileno(), size)  # b"" at EOF: paramiko sees the end
        except (ValueError, OSError) as e:  # closed under paramiko's reader thread: the end, too
            if isinstance(e, socket.timeout):
                raise
            return b""

    def settimeout(self, timeout: float | None) -> None:
        self.timeout = timeout

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                self.process.terminate()
            try:
                self.process.wait(2)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(2)
        for f in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                f.close()

    @property
    def closed(self) -> bool:
        return self.process.returncode is not None

    _closed = closed


def fingerprint(key: paramiko.PKey) -> str:
    digest = __import__("hashlib").sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _RefuseUnknown(paramiko.MissingHostKeyPolicy):
    """RejectPolicy that keeps the offered key so the refusal can show its fingerprint."""

    def __init__(self) -> None:
        self.offered: paramiko.PKey | None = None

    def missing_host_key(self, client, hostname, key):  # noqa: ANN001 - paramiko's signature
        self.offered = key
        raise paramiko.SSHException(f"unknown host key for {hostname}")


class _AcceptNew(paramiko.MissingHostKeyPolicy):
    """OpenSSH's StrictHostKeyChecking=accept-new: trust an unknown key and record it (under the name
    ssh looks up: HostKeyAlias or [host]:port, in the first UserKnownHostsFile); a *changed* key is
    still refused by paramiko."""

    def __init__(self, known_hosts_file: str | None, name: str, hashed: bool = False):
        self.file, self.name, self.hashed = known_hosts_file, name, hashed

    def missing_host_key(self, client, hostname, key):  # noqa: ANN001
        client.get_host_keys().add(hostname, key.get_name(), key)
        if self.file is None:  # UserKnownHostsFile none: ssh accepts and cannot record either
            log.warning("accepted new host key for %s: %s (not recorded: UserKnownHostsFile is none)",
                        self.name, fingerprint(key))
            return
        path = Path(self.file)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with path.open("a") as f:
            recorded = paramiko.HostKeys.hash_host(self.name) if self.hashed else self.name
            f.write(f"{recorded} {key.get_name()} {key.get_base64()}\n")
        log.warning("accepted new host key for %s: %s (saved to %s)", self.name, fingerprint(key), path)


@dataclass(frozen=True)
class _Revoked:
    patterns: tuple[str, ...]
    key: paramiko.PKey
    where: str  # FILE:LINE


def _host_matches(patterns: tuple[str, ...], name: str) -> bool:
    """OpenSSH known_hosts host patterns: * and ? wildcards (brackets are literal: "[host]:port"),
    negations (!), hashed names (|1|...)."""
    import re

    hit = False
    for p in patterns:
        neg = p.startswith("!")
        p = p[1:] if neg else p
        if p.startswith("|1|"):
            m = paramiko.HostKeys.hash_host(name, p) == p
        else:
            glob = re.escape(p.lower()).replace(r"\*", ".*").replace(r"\?", ".")
            m = re.fullmatch(glob, name.lower()) is not None
        if m and neg:
            return False
        hit = hit or m
    return hit


def load_known_hosts(path: str) -> tuple[list[tuple[tuple[str, ...], paramiko.PKey]], list[_Revoked]]:
    """Read an OpenSSH known_hosts file the way OpenSSH does, as far as paramiko can: plain lines
    are trusted (host patterns, key) pairs (matched with `_host_matches`, so wildcards, negations
    and hashed names work as in ssh); ``@revoked`` lines are returned apart (such a key is refused, even
    when a plain line lists it too); ``@cert-authority`` lines are skipped with a warning (paramiko
    cannot check host certificates: the host's own key must be listed to connect). A line that
    cannot be parsed is skipped, like OpenSSH does. (paramiko's own loader raised on marker lines.)"""
    trusted: list[tuple[tuple[str, ...], paramiko.PKey]] = []
    revoked: list[_Revoked] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            marker = None
            if line.startswith("@"):
                marker, _, line = line.partition(" ")
                line = line.strip()
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
            except Exception:  # noqa: BLE001 - InvalidHostKey, SSHException, bad base64: skipped like OpenSSH
                entry = None
            if marker == "@revoked":
                if entry is None:
                    log.warning("%s:%d: cannot read the @revoked key: line ignored", path, lineno)
                else:
                    revoked.append(_Revoked(tuple(entry.hostnames), entry.key, f"{path}:{lineno}"))
            elif marker is not None:
                log.warning("%s:%d: %s lines are not supported (host certificates cannot be checked): line "
                            "ignored; the host's own key must be listed to connect", path, lineno, marker)
            elif entry is not None:
                trusted.append((tuple(entry.hostnames), entry.key))
    return trusted, revoked


def _revoked(revoked: list[_Revoked], hostname: str, key: paramiko.PKey) -> _Revoked | None:
    return next((r for r in revoked if r.key == key and _host_matches(r.patterns, hostname)), None)


class _RefuseRevoked(paramiko.MissingHostKeyPolicy):
    """Before the real policy: a key marked @revoked for this host is refused, never accepted."""

    def __init__(self, inner: paramiko.MissingHostKeyPolicy, revoked: list[_Revoked], who: str, name: str):
        self.inner, self.revoked, self.who, self.name = inner, revoked, who, name

    def missing_host_key(self, client, hostname, key):  # noqa: ANN001
        r = _revoked(self.revoked, self.name, key)
        if r is not None:
            client.close()
            raise _revoked_error(self.who, key, r)
        return self.inner.missing_host_key(client, hostname, key)


def _revoked_error(who: str, key: paramiko.PKey, r: _Revoked) -> HostKeyError:
    return HostKeyError(f"{who}: host key {key.get_name()} {fingerprint(key)} is marked @revoked in {r.where}; "
                        "refusing to connect")


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, (OSError, EOFError, paramiko.ssh_exception.NoValidConnectionsError)) and not isinstance(
        exc, (paramiko.AuthenticationException, paramiko.BadHostKeyException)
    )


class SSHTransport(Transport):
    def __init__(self, host: Host, *, ssh_config: str | Path | None = None, accept_new_host_key: bool = False,
                 attempts: int = 3, backoff_s: float = 1.0, _hops: int = 0, _root: str | None = None):
        super().__init__()
        self.host, self.python = host.name, host.python
        self.ssh_config = ssh_config
        self.accept_new = accept_new_host_key
        self._hops, self._root = _hops, _root or host.name
        self._jump: SSHTransport | None = None
        self._proxy: _ProxyCommand | None = None
        self.target = resolve_target(host.ssh, ssh_config, host.ssh_options)
        self.client = self._connect_with_retry(attempts, backoff_s)

    # connection ---------------------------------------------------------------------------
    def _connect_with_retry(self, attempts: int, backoff_s: float) -> paramiko.SSHClient:
        try:
            for attempt in Retrying(stop=stop_after_attempt(attempts), wait=wait_exponential(multiplier=backoff_s, max=10),
                                    retry=retry_if_exception(_transient), reraise=True):
                with attempt:
                    return self._connect_once()
        except (HostKeyError, ConnectionFailed):
            self._close_path()
            raise
        except paramiko.AuthenticationException as e:
            self._close_path()
            raise ConnectionFailed(f"{self.host} ({self.target.display}): authentication failed: {e} "
                                   "(check IdentityFile in your ssh config or your ssh-agent)") from None
        except (OSError, EOFError, paramiko.SSHException, RetryError) as e:
            reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
            proxy = self._proxy_failure()
            self._close_path()
            raise ConnectionFailed(f"{self.host} ({self.target.display}): " + (proxy or (
                f"cannot connect after {attempts} attempt(s): {reason}"))) from None
        raise AssertionError("unreachable")

    def _proxy_failure(self) -> str | None:
        """"ProxyCommand CMD exited with status N: LAST STDERR LINE" when the proxy command has died."""
        p = self._proxy
        if p is None:
            return None
        code, said = p.outcome()
        if code is None:
            return None
        return f"ProxyCommand {p.command!r} exited with status {code}" + (f": {said}" if said else " (no message)")

    def _close_path(self) -> None:
        """Close what carried the last attempt: the jump chain or the proxy command."""
        jump, self._jump = self._jump, None
        if jump is not None:
            jump.close()
        proxy, self._proxy = self._proxy, None
        if proxy is not None:
            proxy.close()

    def _sock(self) -> object | None:
        """The path to the host: direct (None), through a chain of jump hosts (ProxyJump a,b: a
        transport to the last hop, itself reached through the hops before it -- each hop resolved
        through the ssh config like `ssh -J` does -- opening a direct-tcpip channel to the host), or
        through a ProxyCommand."""
        self._close_path()
        t = self.target
        if t.proxy_jump:
            *earlier, last = t.proxy_jump
            if self._hops + 1 > MAX_JUMP_HOPS:
                raise ConnectionFailed(
                    f"{self._root}: ProxyJump chain longer than {MAX_JUMP_HOPS} hops at {t.alias}: a loop? (a `Host *` "
                    "ProxyJump applies to the jump host too: exclude it, e.g. `Host * !bastion`)")
            opts: list[tuple[str, str]] = []  # what `ssh -l USER -p PORT -J EARLIER LAST` gives the hop
            if last.user:
                opts.append(("User", sshconfig.quote_value(last.user)))
            if last.port:
                opts.append(("Port", str(last.port)))
            if earlier:
                opts.append(("ProxyJump", ",".join(j.spec for j in earlier)))
            hop = Host(f"{self._root}: jump host {last.host}", last.host, self.python, ssh_options=tuple(opts))
            self._jump = SSHTransport(hop, ssh_config=self.ssh_config, accept_new_host_key=self.accept_new,
                                      attempts=1, _hops=self._hops + 1, _root=self._root)
            try:
                return self._jump.client.get_transport().open_channel(
                    "direct-tcpip", (t.hostname, t.port), ("127.0.0.1", 0), timeout=t.connect_timeout)
            except (paramiko.SSHException, OSError, EOFError) as e:
                reason = getattr(e, "text", None) or str(e) or type(e).__name__
                raise ConnectionFailed(
                    f"{self.host} ({t.display}): jump host {last.host} cannot open a connection to "
                    f"{t.hostname}:{t.port}: {reason} (is it reachable from there, and does the jump host's sshd "
                    "allow TCP forwarding?)") from None
        if t.proxy_command:
            self._proxy = _ProxyCommand(t.proxy_command)
            return self._proxy
        return None

    def _connect_once(self) -> paramiko.SSHClient:
        t = self.target
        client = paramiko.SSHClient()
        client.set_log_channel(_PARAMIKO_LOG.name)  # its tracebacks only with -vv: the error is reported in one line
        trusted: list[tuple[tuple[str, ...], paramiko.PKey, str]] = []
        revoked: list[_Revoked] = []
        # exactly the files ssh reads: UserKnownHostsFile (default ~/.ssh/known_hosts, ~/.ssh/known_hosts2)
        # *instead of* the default, then GlobalKnownHostsFile
        for f in dict.fromkeys([*t.known_hosts_files, *t.global_known_hosts_files]):
            if os.path.isfile(f):
                try:
                    tr, rv = load_known_hosts(f)
                except OSError as e:
                    raise ConnectionFailed(f"{f}: cannot read known_hosts: {e.strerror or e}") from None
                trusted += [(patterns, key, f) for patterns, key in tr]
                revoked += rv
        name = t.known_hosts_name  # what ssh looks up: HostKeyAlias, else [host]:port
        paramiko_name = t.hostname if t.port == 22 else f"[{t.hostname}]:{t.port}"  # what paramiko looks up
        source: dict[bytes, str] = {}
        for patterns, key, f in trusted:  # a revoked key is never trusted, even when a plain line lists it too
            if _host_matches(patterns, name) and _revoked(revoked, name, key) is None:
                client.get_host_keys().add(paramiko_name, key.get_name(), key)
                source.setdefault(key.asbytes(), f)
        refuse = _RefuseUnknown()
        record_in = t.known_hosts_files[0] if t.known_hosts_files else None
        inner = _AcceptNew(record_in, name, t.hash_known_hosts) if self.accept_new else refuse
        client.set_missing_host_key_policy(_RefuseRevoked(inner, revoked, f"{self.host} ({t.display})", name))
        sock = self._sock()
        try:
            self._connect_client(client, sock, name, source, refuse)
        except BaseException:
            with contextlib.suppress(Exception):
                client.close()
            raise
        # a hashed plain line can hide a key revoked for this host by name: check what was accepted
        server_key = client.get_transport().get_remote_server_key()
        r = _revoked(revoked, name, server_key)
        if r is not None:
            client.close()
            raise _revoked_error(f"{self.host} ({t.display})", server_key, r)
        return client

    def _connect_client(self, client: paramiko.SSHClient, sock: object | None, name: str, source: dict[bytes, str],
                        refuse: _RefuseUnknown) -> None:
        t = self.target
        try:
            client.connect(
                t.hostname, port=t.port, username=t.user, key_filename=[f for f in t.identity_files if os.path.isfile(f)] or None,
                timeout=t.connect_timeout, banner_timeout=t.connect_timeout, auth_timeout=t.connect_timeout,
                allow_agent=t.allow_agent and not t.identities_only, look_for_keys=False, sock=sock,
            )
        except paramiko.BadHostKeyException as e:
            f = source.get(e.expected_key.asbytes())
            where = f" in {f}" if f else ""
            opt = f" -f {shlex.quote(f)}" if f and f != os.path.expanduser("~/.ssh/known_hosts") else ""
            raise HostKeyError(
                f"{self.host} ({t.display}): HOST KEY CHANGED: offered {fingerprint(e.key)}, known_hosts has "
                f"{fingerprint(e.expected_key)} for {name}{where}; refusing (possible man-in-the-middle). If the host "
                f"was reinstalled, verify the new key and run: ssh-keygen -R '{name}'{opt}") from None
        except paramiko.SSHException as e:
            if refuse.offered is not None:
                files = ", ".join(t.known_hosts_files) or "no UserKnownHostsFile (none)"
                raise HostKeyError(
                    f"{self.host} ({t.display}): unknown host key {refuse.offered.get_name()} {fingerprint(refuse.offered)} "
                    f"for {name} (looked up in {files}); refusing. Verify it, then connect once with ssh to record it, "
                    "or re-run with --accept-new-host-key") from None
            if isinstance(e, paramiko.AuthenticationException):
                raise
            if "No authentication methods" in str(e):
                raise ConnectionFailed(f"{self.host} ({t.display}): authentication failed: no usable key (no readable "
                                       "IdentityFile in the ssh config and no key in ssh-agent)") from None
            raise ConnectionFailed(f"{self.host} ({t.display}): {self._proxy_failure() or f'ssh error: {e}'}") from None

    # commands -----------------------------------------------------------------------------
    def _open_agent_stream(self) -> "_ChannelStream":
        if not self.alive():
            raise RemoteError(f"{self.host}: lost the ssh connection")
        try:
            chan = self.client.get_transport().open_session(timeout=self.target.connect_timeout)
            chan.exec_command(self._agent_command())
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise RemoteError(f"{self.host}: lost the ssh connection: {e or type(e).__name__}") from None
        return _ChannelStream(chan)

    def alive(self) -> bool:
        t = self.client.get_transport()
        return t is not None and t.is_active()

    def _run(self, command: str, *, stdin: bytes | None, timeout: float | None) -> CommandResult:
        """Run `command` on the host within `timeout` seconds in all (not per read): past it the
        channel is closed and the command's whole process group is killed on the host (it runs as a
        process group of its own, `_GROUP_WRAPPER`), children included."""
        if not self.alive():
            raise RemoteError(f"{self.host}: lost the ssh connection")
        deadline = None if not timeout else time.monotonic() + timeout
        chan = None
        try:
            chan = self.client.get_transport().open_session(timeout=self.target.connect_timeout)
            chan.settimeout(_POLL_S)  # reads wake up to look at the deadline
            chan.exec_command(_GROUP_WRAPPER + shlex.quote(command) + _GROUP_REDIRECTS)
            if stdin:
                chan.settimeout(timeout or None)
                chan.sendall(stdin)
                chan.settimeout(_POLL_S)
            chan.shutdown_write()
            # stderr is drained on a thread: both streams share one flow-control window,
            # so a chatty stderr left unread would stall stdout.
            err = bytearray()
            group: list[int] = []
            known = threading.Event()  # the command's process group is known (it has started)
            done = threading.Event()

            def drain_stderr() -> None:
                while not done.is_set():
                    try:
                        chunk = chan.recv_stderr(65536)
                    except socket.timeout:
                        continue
                    except Exception:  # noqa: BLE001 - a closed channel ends the drain
                        return
                    if not chunk:
                        return
                    err.extend(chunk)
                    if len(err) > 2 * _ERR_KEEP:  # the tail is what is reported (stderr_line)
                        del err[:-_ERR_KEEP]
                    if not group and _GROUP_MARK in err:  # the wrapper's first line: its process group
                        head, _, rest = bytes(err).partition(_GROUP_MARK)
                        num, nl, rest = rest.partition(b"\n")
                        if nl and num.isdigit():
                            group.append(int(num))
                            err[:] = head + rest
                            known.set()

            t = threading.Thread(target=drain_stderr, daemon=True)
            t.start()
            out = bytearray()
            while True:
                if deadline is not None and time.monotonic() >= deadline:
                    self._kill_remote_group(group, known)
                    done.set()
                    raise socket.timeout()
                try:
                    chunk = chan.recv(65536)
                except socket.timeout:
                    continue
                if not chunk:
                    break
                out += chunk
                if len(out) > MAX_OUTPUT:  # a host is trusted for itself only: its output cannot take our memory
                    self._kill_remote_group(group, known)
                    done.set()
                    raise RemoteError(f"{self.host}: command printed more than {MAX_OUTPUT >> 20} MiB: refused, and "
                                      f"killed: {command[:60]}")
            while not chan.status_event.wait(_POLL_S):
                if deadline is not None and time.monotonic() >= deadline:
                    self._kill_remote_group(group, known)
                    done.set()
                    raise socket.timeout()
            t.join(_POLL_S * 5 if deadline is None else max(0.0, min(_POLL_S * 5, deadline - time.monotonic())))
            done.set()
            status = chan.recv_exit_status()
            return CommandResult(status, bytes(out), bytes(err).replace(_GROUP_MARK, b""))
        except socket.timeout:
            raise RemoteError(f"{self.host}: command timed out after {timeout}s: {command[:60]}") from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise RemoteError(f"{self.host}: lost the ssh connection: {e or type(e).__name__}") from None
        finally:
            if chan is not None:
                with contextlib.suppress(Exception):
                    chan.close()

    def _kill_remote_group(self, group: list[int], known: threading.Event) -> None:
        """SIGKILL a timed-out command's process group on the host (best effort, on a channel of its own).
        A command the host has not even started yet (a loaded host, a slow login) is waited for a
        little: closing its channel alone would not stop it from starting afterwards."""
        if not known.wait(self.target.connect_timeout):
            log.warning("%s: a timed-out command had not started after %g s more; its channel is closed",
                        self.host, self.target.connect_timeout)
            return
        try:
            chan = self.client.get_transport().open_session(timeout=self.target.connect_timeout)
            try:
                chan.settimeout(self.target.connect_timeout)
                chan.exec_command(f"kill -KILL -- -{group[0]}")
                chan.recv_exit_status()
            finally:
                chan.close()
        except Exception as e:  # noqa: BLE001 - the timeout is what gets reported
            log.warning("%s: could not kill the timed-out command (process group %d): %s", self.host, group[0], e)

    @contextlib.contextmanager
    def forward(self, host: str, port: int) -> Iterator[tuple[str, int]]:
        """A local listener whose connections become direct-tcpip channels, so a loopback-bound server on
        the host is reachable and each client TCP connection maps to exactly one upstream connection
        (keep-alive behaviour is preserved, which the multi-round probe depends on)."""
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        stop = threading.Event()
        transport = self.client.get_transport()

        def pump(a, b) -> None:  # noqa: ANN001
            try:
                while True:
                    data = a.recv(65536)
                    if not data:
                        break
                    b.sendall(data)
            except (OSError, EOFError, paramiko.SSHException):
                pass
            finally:
                for s in (a, b):
                    with contextlib.suppress(Exception):
                        s.close()

        def accept_loop() -> None:
            listener.settimeout(0.2)
            while not stop.is_set():
                try:
                    conn, addr = listener.accept()
                except socket.timeout:
                    continue
                except OSError:
                    break
                try:
                    chan = transport.open_channel("direct-tcpip", (host, port), addr, timeout=10)
                except Exception as e:  # connection refused on the far side, channel failure
                    log.debug("forward to %s:%s failed: %s", host, port, e)
                    conn.close()
                    continue
                threading.Thread(target=pump, args=(conn, chan), daemon=True).start()
                threading.Thread(target=pump, args=(chan, conn), daemon=True).start()

        t = threading.Thread(target=accept_loop, daemon=True)
        t.start()
        try:
            yield listener.getsockname()
        finally:
            stop.set()
            listener.close()

    def close(self) -> None:
        self._close_agent()
        with contextlib.suppress(Exception):
            self.client.close()
        self._close_path()


class _ChannelStream:
    """The persistent agent on an SSH exec channel."""

    def __init__(self, chan: paramiko.Channel):
        self.chan = chan
        self._out = chan.makefile("rb")
        self._err = _StderrTail(chan.recv_stderr)

    def send(self, data: bytes) -> None:
        self.chan.sendall(data)

    def readline(self, limit: int) -> bytes:
        return self._out.readline(limit)

    def stderr_tail(self) -> bytes:
        return self._err.get()

    def exit_status(self, wait_s: float) -> int | None:
        if self.chan.status_event.wait(wait_s):
            return self.chan.exit_status
        return None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.chan.shutdown_write()  # end of input: the agent exits
        with contextlib.suppress(Exception):
            self.chan.close()


def connect(host: Host, *, ssh_config: str | Path | None = None, accept_new_host_key: bool = False,
            attempts: int = 3, backoff_s: float = 1.0) -> Transport:
    if host.is_local:
        return LocalTransport(host.name, host.python)
    return SSHTransport(host, ssh_config=ssh_config, accept_new_host_key=accept_new_host_key,
                        attempts=attempts, backoff_s=backoff_s)
