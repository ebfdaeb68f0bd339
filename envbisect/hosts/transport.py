"""The one narrow door to a host over SSH: `SSHTransport` (paramiko, resolved through the user's
OpenSSH config, known_hosts enforced), and `connect`, which gives the transport a playbook host
asks for. Everything above the hosts is written against `Transport` (envbisect.hosts.transport_base)
and never knows which one it holds; the names it imports from here stay importable from here.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shlex
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

import paramiko
from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from envbisect.errors import ConnectionFailed, HostKeyError, RemoteError
from envbisect.hosts import sshconfig
from envbisect.hosts.hostkeys import (AcceptNew, KnownKeys, RefuseRevoked, RefuseUnknown, Revoked, fingerprint,
                                      host_matches, load_known_hosts, read_known_hosts, revoked_entry, revoked_error)
from envbisect.hosts.sshtarget import ProxyCommand, SSHTarget, parse_spec, resolve_target
from envbisect.hosts.transport_base import CommandResult, LocalTransport, StderrTail, Transport, log
from envbisect.inputs.playbook import Host

__all__ = ["AcceptNew", "CommandResult", "KnownKeys", "LocalTransport", "MAX_JUMP_HOPS", "MAX_OUTPUT", "ProxyCommand",
           "RefuseRevoked", "RefuseUnknown", "Revoked", "SSHTarget", "SSHTransport", "Transport", "connect",
           "fingerprint", "host_matches", "load_known_hosts", "parse_spec", "read_known_hosts", "resolve_target",
           "revoked_entry", "revoked_error"]


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
_AGENT_WINDOW = 8 << 20  # the agent channel's flow-control window

MAX_JUMP_HOPS = 8  # a longer chain is a loop (say `Host *` with a ProxyJump that matches the jump host too)


class _QuietTransport(paramiko.Transport):
    """paramiko's Transport, whose reader thread wakes once a second instead of ten times to see
    whether the connection was closed or a rekey is due: a deployment keeps a connection open to
    every host, and their wake-ups were a tenth of the controller's CPU in a 16-host snapshot. AES-GCM
    comes first among the ciphers a server may choose (then paramiko's order): an AEAD cipher has no
    separate MAC, which paramiko checks byte by byte in Python for every packet it reads."""

    _active_check_timeout = 1.0
    _preferred_ciphers = tuple(sorted(paramiko.Transport._preferred_ciphers, key=lambda c: "-gcm@" not in c))


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
        self._proxy: ProxyCommand | None = None
        self.target = resolve_target(host.ssh, ssh_config, host.ssh_options)
        self.client = self._connect_with_retry(attempts, backoff_s)

    # connection ---------------------------------------------------------------------------
    def _connect_with_retry(self, attempts: int, backoff_s: float) -> paramiko.SSHClient:
        try:
            for attempt in Retrying(stop=stop_after_attempt(attempts),
                                    wait=wait_exponential(multiplier=backoff_s, max=10),
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
            self._proxy = ProxyCommand(t.proxy_command)
            return self._proxy
        return None

    def _connect_once(self) -> paramiko.SSHClient:
        t = self.target
        client = paramiko.SSHClient()
        client.set_log_channel(_PARAMIKO_LOG.name)  # its tracebacks only with -vv: the error is reported in one line
        keys = read_known_hosts([*t.known_hosts_files, *t.global_known_hosts_files])
        revoked = keys.revoked
        name = t.known_hosts_name  # what ssh looks up: HostKeyAlias, else [host]:port
        paramiko_name = t.hostname if t.port == 22 else f"[{t.hostname}]:{t.port}"  # what paramiko looks up
        source = keys.trust(client, name, paramiko_name)
        refuse = RefuseUnknown()
        record_in = t.known_hosts_files[0] if t.known_hosts_files else None
        inner = AcceptNew(record_in, name, t.hash_known_hosts) if self.accept_new else refuse
        client.set_missing_host_key_policy(RefuseRevoked(inner, revoked, f"{self.host} ({t.display})", name))
        sock = self._sock()
        try:
            self._connect_client(client, sock, name, source, refuse)
        except BaseException:
            with contextlib.suppress(Exception):
                client.close()
            raise
        # a hashed plain line can hide a key revoked for this host by name: check what was accepted
        server_key = client.get_transport().get_remote_server_key()
        r = revoked_entry(revoked, name, server_key)
        if r is not None:
            client.close()
            raise revoked_error(f"{self.host} ({t.display})", server_key, r)
        return client

    def _connect_client(self, client: paramiko.SSHClient, sock: object | None, name: str, source: dict[bytes, str],
                        refuse: RefuseUnknown) -> None:
        t = self.target
        try:
            client.connect(
                t.hostname, port=t.port, username=t.user,
                key_filename=[f for f in t.identity_files if os.path.isfile(f)] or None,
                timeout=t.connect_timeout, banner_timeout=t.connect_timeout, auth_timeout=t.connect_timeout,
                allow_agent=t.allow_agent and not t.identities_only, look_for_keys=False, sock=sock,
                transport_factory=_QuietTransport,
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
                    f"{self.host} ({t.display}): unknown host key {refuse.offered.get_name()} "
                    f"{fingerprint(refuse.offered)} "
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
            # a larger window than paramiko's 2 MiB: a large answer (a snapshot's files) needs fewer window
            # adjustments; bounded, as what a host sends unasked waits in the controller's memory
            chan = self.client.get_transport().open_session(window_size=_AGENT_WINDOW,
                                                            timeout=self.target.connect_timeout)
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
            err = _StderrDrain(chan)
            out = self._read_stdout(chan, err, deadline, command)
            while not chan.status_event.wait(_POLL_S):
                if deadline is not None and time.monotonic() >= deadline:
                    self._give_up(err)
                    raise socket.timeout()
            err.finish(deadline)
            return CommandResult(chan.recv_exit_status(), out, err.text())
        except socket.timeout:
            raise RemoteError(f"{self.host}: command timed out after {timeout}s: {command[:60]}") from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise RemoteError(f"{self.host}: lost the ssh connection: {e or type(e).__name__}") from None
        finally:
            if chan is not None:
                with contextlib.suppress(Exception):
                    chan.close()

    def _read_stdout(self, chan: paramiko.Channel, err: "_StderrDrain", deadline: float | None,
                     command: str) -> bytes:
        out = bytearray()
        while True:
            if deadline is not None and time.monotonic() >= deadline:
                self._give_up(err)
                raise socket.timeout()
            try:
                chunk = chan.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                return bytes(out)
            out += chunk
            if len(out) > MAX_OUTPUT:  # a host is trusted for itself only: its output cannot take our memory
                self._give_up(err)
                raise RemoteError(f"{self.host}: command printed more than {MAX_OUTPUT >> 20} MiB: refused, and "
                                  f"killed: {command[:60]}")

    def _give_up(self, err: "_StderrDrain") -> None:
        self._kill_remote_group(err)
        err.stop()

    def _kill_remote_group(self, err: "_StderrDrain") -> None:
        """SIGKILL a timed-out command's process group on the host (best effort, on a channel of its own).
        A command the host has not even started yet (a loaded host, a slow login) is waited for a
        little: closing its channel alone would not stop it from starting afterwards."""
        if not err.known.wait(self.target.connect_timeout):
            log.warning("%s: a timed-out command had not started after %g s more; its channel is closed",
                        self.host, self.target.connect_timeout)
            return
        try:
            chan = self.client.get_transport().open_session(timeout=self.target.connect_timeout)
            try:
                chan.settimeout(self.target.connect_timeout)
                chan.exec_command(f"kill -KILL -- -{err.group}")
                chan.recv_exit_status()
            finally:
                chan.close()
        except Exception as e:  # noqa: BLE001 - the timeout is what gets reported
            log.warning("%s: could not kill the timed-out command (process group %d): %s", self.host, err.group, e)

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


class _StderrDrain:
    """A command's stderr, read on a thread: both streams share one flow-control window, so a chatty
    stderr left unread would stall stdout. The wrapper's first line on it names the command's process
    group (`group`, once `known` is set), which is taken out of what is reported."""

    def __init__(self, chan: paramiko.Channel):
        self.chan = chan
        self.err = bytearray()
        self.group: int | None = None
        self.known = threading.Event()  # the command's process group is known (it has started)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        err = self.err
        while not self._done.is_set():
            try:
                chunk = self.chan.recv_stderr(65536)
            except socket.timeout:
                continue
            except Exception:  # noqa: BLE001 - a closed channel ends the drain
                return
            if not chunk:
                return
            err.extend(chunk)
            if len(err) > 2 * _ERR_KEEP:  # the tail is what is reported (stderr_line)
                del err[:-_ERR_KEEP]
            if self.group is None and _GROUP_MARK in err:  # the wrapper's first line: its process group
                head, _, rest = bytes(err).partition(_GROUP_MARK)
                num, nl, rest = rest.partition(b"\n")
                if nl and num.isdigit():
                    self.group = int(num)
                    err[:] = head + rest
                    self.known.set()

    def finish(self, deadline: float | None) -> None:
        """The command has exited: what it wrote last is read, within the deadline."""
        wait = _POLL_S * 5 if deadline is None else max(0.0, min(_POLL_S * 5, deadline - time.monotonic()))
        self._thread.join(wait)
        self._done.set()

    def stop(self) -> None:
        self._done.set()

    def text(self) -> bytes:
        return bytes(self.err).replace(_GROUP_MARK, b"")


class _ChannelStream:
    """The persistent agent on an SSH exec channel."""

    def __init__(self, chan: paramiko.Channel):
        self.chan = chan
        self._err = StderrTail(chan.recv_stderr)

    def send(self, data: bytes, timeout: float | None) -> None:
        self.chan.settimeout(timeout)
        self.chan.sendall(data)

    def recv(self, limit: int, timeout: float | None) -> bytes:
        self.chan.settimeout(timeout)
        return self.chan.recv(limit)

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
