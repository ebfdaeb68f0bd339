"""The one narrow door to a host: run a command, and reach a TCP port as seen from that host.

Two implementations: `LocalTransport` (the demo's `ssh = "local"`) and `SSHTransport` (paramiko,
resolved through the user's OpenSSH config, known_hosts enforced). Everything above this module
is written against `Transport` and never knows which one it holds.
"""
from __future__ import annotations

import base64
import contextlib
import getpass
import logging
import os
import shlex
import socket
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import paramiko
from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from .errors import ConnectionFailed, HostKeyError, RemoteError
from .playbook import Host

log = logging.getLogger("envbisect.transport")


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


class LocalTransport(Transport):
    def __init__(self, host: str = "local", python: str = "python3"):
        super().__init__()
        self.host, self.python = host, python

    def _run(self, command: str, *, stdin: bytes | None, timeout: float | None) -> CommandResult:
        try:
            p = subprocess.run(["bash", "-c", command], input=stdin or b"", capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise RemoteError(f"{self.host}: command timed out after {timeout}s: {command[:60]}") from e
        return CommandResult(p.returncode, p.stdout, p.stderr)


# --- SSH ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SSHTarget:
    """Where and how to connect, after the user's OpenSSH config has been applied."""

    alias: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    known_hosts_files: tuple[str, ...]
    proxy_jump: str | None
    proxy_command: str | None
    connect_timeout: float

    @property
    def display(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def resolve_target(spec: str, ssh_config: str | Path | None) -> SSHTarget:
    """Resolve "alias", "user@host" or "user@host:port" through the OpenSSH config like `ssh` would."""
    user = None
    port = None
    rest = spec
    if "@" in rest:
        user, rest = rest.rsplit("@", 1)
    if rest.count(":") == 1:
        rest, p = rest.split(":")
        if not p.isdigit():
            raise ConnectionFailed(f"bad ssh target {spec!r}: port {p!r} is not a number")
        port = int(p)
    cfg = paramiko.SSHConfig()
    cfg_path = Path(os.path.expanduser(str(ssh_config))) if ssh_config else Path.home() / ".ssh" / "config"
    if cfg_path.exists():
        try:
            cfg = paramiko.SSHConfig.from_path(str(cfg_path))
        except Exception as e:  # paramiko raises assorted errors on malformed configs
            raise ConnectionFailed(f"{cfg_path}: cannot parse OpenSSH config: {e}") from None
    elif ssh_config:
        raise ConnectionFailed(f"{cfg_path}: no such ssh config")
    entry = cfg.lookup(rest)
    known = entry.get("userknownhostsfile")
    known_files = tuple(os.path.expanduser(k) for k in known.split()) if known else (
        os.path.expanduser("~/.ssh/known_hosts"),
    )
    return SSHTarget(
        alias=rest,
        hostname=entry.get("hostname", rest),
        port=port or int(entry.get("port", 22)),
        user=user or entry.get("user") or getpass.getuser(),
        identity_files=tuple(os.path.expanduser(f) for f in entry.get("identityfile", [])),
        known_hosts_files=known_files,
        proxy_jump=entry.get("proxyjump"),
        proxy_command=entry.get("proxycommand"),
        connect_timeout=float(entry.get("connecttimeout", 10)),
    )


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
    """OpenSSH's StrictHostKeyChecking=accept-new: trust an unknown key and record it; a *changed* key is still refused by paramiko."""

    def __init__(self, known_hosts_file: str):
        self.file = known_hosts_file

    def missing_host_key(self, client, hostname, key):  # noqa: ANN001
        client.get_host_keys().add(hostname, key.get_name(), key)
        path = Path(self.file)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with path.open("a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        log.warning("accepted new host key for %s: %s (saved to %s)", hostname, fingerprint(key), path)


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


def load_known_hosts(path: str) -> tuple[list[tuple[str, paramiko.PKey]], list[_Revoked]]:
    """Read an OpenSSH known_hosts file the way OpenSSH does, as far as paramiko can: plain lines
    are trusted (name, key) pairs; ``@revoked`` lines are returned apart (such a key is refused, even
    when a plain line lists it too); ``@cert-authority`` lines are skipped with a warning (paramiko
    cannot check host certificates: the host's own key must be listed to connect). A line that
    cannot be parsed is skipped, like OpenSSH does. (paramiko's own loader raised on marker lines.)"""
    trusted: list[tuple[str, paramiko.PKey]] = []
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
                trusted += [(name, entry.key) for name in entry.hostnames]
    return trusted, revoked


def _revoked(revoked: list[_Revoked], hostname: str, key: paramiko.PKey) -> _Revoked | None:
    return next((r for r in revoked if r.key == key and _host_matches(r.patterns, hostname)), None)


class _RefuseRevoked(paramiko.MissingHostKeyPolicy):
    """Before the real policy: a key marked @revoked for this host is refused, never accepted."""

    def __init__(self, inner: paramiko.MissingHostKeyPolicy, revoked: list[_Revoked], who: str):
        self.inner, self.revoked, self.who = inner, revoked, who

    def missing_host_key(self, client, hostname, key):  # noqa: ANN001
        r = _revoked(self.revoked, hostname, key)
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
                 attempts: int = 3, backoff_s: float = 1.0):
        super().__init__()
        self.host, self.python = host.name, host.python
        self.target = resolve_target(host.ssh, ssh_config)
        self.ssh_config = ssh_config
        self.accept_new = accept_new_host_key
        self.client = self._connect_with_retry(attempts, backoff_s)

    # connection ---------------------------------------------------------------------------
    def _connect_with_retry(self, attempts: int, backoff_s: float) -> paramiko.SSHClient:
        try:
            for attempt in Retrying(stop=stop_after_attempt(attempts), wait=wait_exponential(multiplier=backoff_s, max=10),
                                    retry=retry_if_exception(_transient), reraise=True):
                with attempt:
                    return self._connect_once()
        except (HostKeyError, ConnectionFailed):
            raise
        except paramiko.AuthenticationException as e:
            raise ConnectionFailed(f"{self.host} ({self.target.display}): authentication failed: {e} "
                                   "(check IdentityFile in your ssh config or your ssh-agent)") from None
        except (OSError, EOFError, paramiko.SSHException, RetryError) as e:
            reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
            raise ConnectionFailed(f"{self.host} ({self.target.display}): cannot connect after {attempts} attempt(s): {reason}") from None
        raise AssertionError("unreachable")

    def _sock(self) -> object | None:
        t = self.target
        if t.proxy_jump and t.proxy_jump.lower() != "none":
            jump_spec = t.proxy_jump.split(",")[0]
            jump = SSHTransport(Host(f"{self.host}-jump", jump_spec), ssh_config=self.ssh_config,
                                accept_new_host_key=self.accept_new, attempts=1)
            self._jump = jump
            return jump.client.get_transport().open_channel("direct-tcpip", (t.hostname, t.port), ("127.0.0.1", 0),
                                                              timeout=t.connect_timeout)
        if t.proxy_command and t.proxy_command.lower() != "none":
            cmd = t.proxy_command.replace("%h", t.hostname).replace("%p", str(t.port)).replace("%r", t.user)
            return paramiko.ProxyCommand(cmd)
        return None

    def _connect_once(self) -> paramiko.SSHClient:
        t = self.target
        client = paramiko.SSHClient()
        trusted: list[tuple[str, paramiko.PKey]] = []
        revoked: list[_Revoked] = []
        for f in dict.fromkeys([os.path.expanduser("~/.ssh/known_hosts"), *t.known_hosts_files]):
            if os.path.exists(f):
                try:
                    tr, rv = load_known_hosts(f)
                except OSError as e:
                    raise ConnectionFailed(f"{f}: cannot read known_hosts: {e.strerror or e}") from None
                trusted += tr
                revoked += rv
        for name, key in trusted:  # a revoked key is never trusted, even when a plain line lists it too
            if _revoked(revoked, name, key) is None:
                client.get_host_keys().add(name, key.get_name(), key)
        refuse = _RefuseUnknown()
        inner = _AcceptNew(t.known_hosts_files[0]) if self.accept_new else refuse
        client.set_missing_host_key_policy(_RefuseRevoked(inner, revoked, f"{self.host} ({t.display})"))
        try:
            client.connect(
                t.hostname, port=t.port, username=t.user, key_filename=[f for f in t.identity_files if os.path.exists(f)] or None,
                timeout=t.connect_timeout, banner_timeout=t.connect_timeout, auth_timeout=t.connect_timeout,
                allow_agent=True, look_for_keys=not t.identity_files, sock=self._sock(),
            )
        except paramiko.BadHostKeyException as e:
            raise HostKeyError(
                f"{self.host} ({t.display}): HOST KEY CHANGED: offered {fingerprint(e.key)}, known_hosts has "
                f"{fingerprint(e.expected_key)}; refusing (possible man-in-the-middle). If the host was reinstalled, "
                f"verify the new key and run: ssh-keygen -R '{t.known_hosts_name}'") from None
        except paramiko.SSHException as e:
            if refuse.offered is not None:
                raise HostKeyError(
                    f"{self.host} ({t.display}): unknown host key {refuse.offered.get_name()} {fingerprint(refuse.offered)}; "
                    f"refusing. Verify it, then `ssh -p {t.port} {t.user}@{t.hostname}` once to record it, "
                    "or re-run with --accept-new-host-key") from None
            if isinstance(e, paramiko.AuthenticationException):
                raise
            if "No authentication methods" in str(e):
                raise ConnectionFailed(f"{self.host} ({t.display}): authentication failed: no usable key (no readable "
                                       "IdentityFile in the ssh config and no key in ssh-agent)") from None
            raise ConnectionFailed(f"{self.host} ({t.display}): ssh error: {e}") from None
        # a hashed plain line can hide a key revoked for this host by name: check what was accepted
        server_key = client.get_transport().get_remote_server_key()
        r = _revoked(revoked, t.known_hosts_name, server_key)
        if r is not None:
            client.close()
            raise _revoked_error(f"{self.host} ({t.display})", server_key, r)
        return client

    # commands -----------------------------------------------------------------------------
    def alive(self) -> bool:
        t = self.client.get_transport()
        return t is not None and t.is_active()

    def _run(self, command: str, *, stdin: bytes | None, timeout: float | None) -> CommandResult:
        if not self.alive():
            raise RemoteError(f"{self.host}: lost the ssh connection")
        try:
            chan = self.client.get_transport().open_session(timeout=self.target.connect_timeout)
            if timeout:
                chan.settimeout(timeout)
            chan.exec_command(command)
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            # stderr is drained on a thread: both streams share one flow-control window,
            # so a chatty stderr left unread would stall stdout.
            err = bytearray()
            def drain_stderr() -> None:
                while True:
                    chunk = chan.recv_stderr(65536)
                    if not chunk:
                        break
                    err.extend(chunk)
            t = threading.Thread(target=drain_stderr, daemon=True)
            t.start()
            out = bytearray()
            while True:
                chunk = chan.recv(65536)
                if not chunk:
                    break
                out += chunk
            t.join(timeout)
            status = chan.recv_exit_status()
            chan.close()
            return CommandResult(status, bytes(out), bytes(err))
        except socket.timeout:
            raise RemoteError(f"{self.host}: command timed out after {timeout}s: {command[:60]}") from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise RemoteError(f"{self.host}: lost the ssh connection: {e or type(e).__name__}") from None

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
        with contextlib.suppress(Exception):
            self.client.close()
        jump = getattr(self, "_jump", None)
        if jump:
            jump.close()


def connect(host: Host, *, ssh_config: str | Path | None = None, accept_new_host_key: bool = False,
            attempts: int = 3, backoff_s: float = 1.0) -> Transport:
    if host.is_local:
        return LocalTransport(host.name, host.python)
    return SSHTransport(host, ssh_config=ssh_config, accept_new_host_key=accept_new_host_key,
                        attempts=attempts, backoff_s=backoff_s)
