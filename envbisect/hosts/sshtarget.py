"""Where an SSH host is and how to reach it: an ssh target ("alias", "user@host:port") resolved
through the user's OpenSSH config as `ssh` would (envbisect.hosts.sshconfig), and a ProxyCommand
run as ssh runs it, as the socket paramiko talks through.
"""
from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import paramiko

from envbisect.errors import UsageError
from envbisect.hosts import sshconfig
from envbisect.hosts.sshconfig import Jump

log = logging.getLogger("envbisect.hosts.transport")  # the transports' one log


@dataclass(frozen=True)
class SSHTarget:
    """Where and how to connect, after the user's OpenSSH config has been applied (see sshconfig.py)."""

    alias: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    # UserKnownHostsFile: an unknown key accepted with --accept-new-host-key goes to the first
    known_hosts_files: tuple[str, ...]
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


def resolve_target(spec: str, ssh_config: str | Path | None,
                   options: tuple[tuple[str, str], ...] = ()) -> SSHTarget:
    """Resolve "alias", "user@host" or "user@host:port" through the OpenSSH config like `ssh` would
    (`ssh -F ssh_config`, or ~/.ssh/config then /etc/ssh/ssh_config); ``options`` are `-o KEY VALUE`
    options, which come first (an inventory's ansible_user, ansible_port...)."""
    user, host, port = parse_spec(spec)
    c = sshconfig.resolve(host, config=ssh_config, options=options, user=user, port=port)
    log.debug("%s: ssh config: %s", spec, sshconfig.describe(c))
    if c.identity_agent not in (None, "none", "SSH_AUTH_SOCK"):
        log.warning("%s: IdentityAgent %s is not supported (the agent at $SSH_AUTH_SOCK is used)", spec,
                    c.identity_agent)
    return SSHTarget(
        alias=host, hostname=c.hostname, port=c.port, user=c.user, identity_files=c.identity_files,
        known_hosts_files=c.user_known_hosts, proxy_jump=c.proxy_jump, proxy_command=c.expanded_proxy_command(),
        connect_timeout=float(c.connect_timeout) if c.connect_timeout else 10.0,
        global_known_hosts_files=c.global_known_hosts, host_key_alias=c.host_key_alias,
        identities_only=c.identities_only, allow_agent=c.identity_agent != "none",
        hash_known_hosts=(c.raw.get("hashknownhosts") or ("no",))[0].lower() in ("yes", "true"),
    )


class ProxyCommand:
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
