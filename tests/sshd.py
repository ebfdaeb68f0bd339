"""A real OpenSSH ``sshd`` for tests.

``start_sshd(workdir)`` generates a host key and a client key, writes an
``sshd_config`` that only listens on 127.0.0.1 on a free port and only accepts
the generated client key, starts ``/usr/sbin/sshd -D -e`` and waits until it
serves an SSH banner.  It also writes a ``known_hosts`` file and an OpenSSH
client config (``Host <alias>``) so both the ``ssh`` binary and paramiko can
connect with strict host-key checking.

Several servers can run at once (each call picks its own port and workdir
files).  Call ``SshServer.stop()`` (or use the server as a context manager)
to shut it down.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable

from envbisect.sim.ports import free_port

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")
START_TIMEOUT = 10.0

# Options that only some OpenSSH versions know.  They are tried first and
# dropped (one by one) if ``sshd -t`` rejects them.
#  - PerSourcePenalties (OpenSSH >= 9.8) would otherwise start refusing
#    127.0.0.1 after a handful of unauthenticated connections (our readiness
#    probe, host-key-rejection tests, ...).
_OPTIONAL_OPTIONS = [("PerSourcePenalties", "no")]


class SshdError(RuntimeError):
    """sshd could not be configured or started."""


def sshd_available() -> bool:
    return os.access(SSHD, os.X_OK)


def current_user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise SshdError(
            f"command failed ({proc.returncode}): {' '.join(cmd)}\n"
            f"stdout: {proc.stdout.strip()}\nstderr: {proc.stderr.strip()}"
        )
    return proc


def _keygen(path: Path) -> str:
    """Generate an ed25519 key pair at ``path`` (+ ``.pub``); return "ssh-ed25519 AAAA..."."""
    for p in (path, path.with_name(path.name + ".pub")):
        if p.exists():
            p.unlink()
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)])
    os.chmod(path, 0o600)
    pub = path.with_name(path.name + ".pub")
    os.chmod(pub, 0o600)
    return " ".join(pub.read_text().split()[:2])


def _fingerprint(pub_path: Path) -> str:
    # "256 SHA256:xxxx comment (ED25519)"
    out = _run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub_path)]).stdout
    return out.split()[1]


def _cfg_value(value: str | Path) -> str:
    value = str(value)
    return f'"{value}"' if any(c.isspace() for c in value) else value


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class SshServer:
    host: str  # "127.0.0.1"
    port: int
    user: str  # the current user (root in CI)
    client_key: Path  # ed25519 private key, authorized by this server
    host_key_pub: str  # "ssh-ed25519 AAAA..." of the server
    host_key_fingerprint: str  # "SHA256:..." as ssh-keygen -lf prints
    known_hosts: Path  # contains "[127.0.0.1]:PORT ssh-ed25519 AAAA..."
    ssh_config: Path  # OpenSSH client config with "Host <alias>"
    alias: str
    log: Path  # sshd's stderr (LogLevel VERBOSE)
    # --- extras -----------------------------------------------------------
    workdir: Path | None = None
    client_key_pub: str = ""  # "ssh-ed25519 AAAA..." of client_key
    host_key: Path | None = None  # server's private host key
    authorized_keys: Path | None = None
    sshd_config: Path | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)
    _log_fh: IO[bytes] | None = field(default=None, repr=False)

    # "user@127.0.0.1:PORT" (the playbook's explicit ssh form)
    @property
    def target(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    @property
    def known_hosts_line(self) -> str:
        return f"[{self.host}]:{self.port} {self.host_key_pub}"

    def config_block(self, alias: str | None = None) -> str:
        """The ``Host`` block of :attr:`ssh_config` (optionally under another alias)."""
        return (
            f"Host {alias or self.alias}\n"
            f"    HostName {self.host}\n"
            f"    Port {self.port}\n"
            f"    User {self.user}\n"
            f"    IdentityFile {_cfg_value(self.client_key)}\n"
            f"    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {_cfg_value(self.known_hosts)}\n"
            f"    GlobalKnownHostsFile /dev/null\n"
            f"    StrictHostKeyChecking yes\n"
            f"    UpdateHostKeys no\n"
            f"    BatchMode yes\n"
            f"    PasswordAuthentication no\n"
            f"    KbdInteractiveAuthentication no\n"
            f"    ConnectTimeout 10\n"
            f"    LogLevel ERROR\n"
        )

    def ssh_cmd(self, *remote: str) -> list[str]:
        """argv for the real ssh client: ``ssh -F ssh_config ALIAS [remote...]``."""
        return ["ssh", "-F", str(self.ssh_config), self.alias, *remote]

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log, lines)

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Stop the listener (idempotent).  Already-open sessions are left to die with their clients."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def __enter__(self) -> "SshServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def write_ssh_config(path: Path, servers: Iterable[SshServer]) -> Path:
    """Write one OpenSSH client config containing the Host blocks of several servers."""
    path = Path(path)
    path.write_text("\n".join(s.config_block() for s in servers))
    os.chmod(path, 0o600)
    return path


def _ensure_privsep_dir() -> None:
    if PRIVSEP_DIR.is_dir():
        return
    try:
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    except PermissionError:
        # Only needed when sshd runs as root; a non-root sshd does not chroot.
        if os.geteuid() == 0:
            raise


def _sshd_config_text(workdir: Path, port: int, host_key: Path, authorized_keys: Path,
                      extra: list[tuple[str, str]]) -> str:
    lines = [
        ("ListenAddress", "127.0.0.1"),
        ("Port", str(port)),
        ("HostKey", _cfg_value(host_key)),
        ("AuthorizedKeysFile", _cfg_value(authorized_keys)),
        ("PidFile", _cfg_value(workdir / "sshd.pid")),
        ("PubkeyAuthentication", "yes"),
        ("PasswordAuthentication", "no"),
        ("KbdInteractiveAuthentication", "no"),
        ("HostbasedAuthentication", "no"),
        ("UsePAM", "no"),
        ("StrictModes", "no"),
        ("PermitRootLogin", "prohibit-password"),
        ("AllowTcpForwarding", "yes"),
        ("AllowStreamLocalForwarding", "yes"),
        ("GatewayPorts", "no"),
        ("X11Forwarding", "no"),
        ("PrintMotd", "no"),
        ("PrintLastLog", "no"),
        ("UseDNS", "no"),
        ("MaxStartups", "100:30:200"),
        ("MaxSessions", "64"),
        ("MaxAuthTries", "10"),
        ("LoginGraceTime", "30"),
        ("Subsystem", "sftp internal-sftp"),
        ("LogLevel", "VERBOSE"),
        # bash sources ~/.bashrc before a command sshd runs when SHLVL says it is the top shell; a
        # developer's ~/.bashrc (pyenv init: ~15 processes, ~150 ms of CPU) then costs every command
        # envbisect sends, which a production host's service account does not. SHLVL=1 makes the
        # session's bash level 2, so the command runs in the environment sshd gives it, and nothing else.
        ("SetEnv", "SHLVL=1"),
        *extra,
    ]
    return "".join(f"{k} {v}\n" for k, v in lines)


def _check_config(config: Path, workdir: Path, port: int, host_key: Path,
                  authorized_keys: Path) -> None:
    """Write ``config``, validated with ``sshd -t``; drop unsupported optional options."""
    extra = list(_OPTIONAL_OPTIONS)
    while True:
        config.write_text(_sshd_config_text(workdir, port, host_key, authorized_keys, extra))
        proc = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, text=True)
        if proc.returncode == 0:
            return
        out = proc.stdout + proc.stderr
        bad = [kv for kv in extra if kv[0].lower() in out.lower()]
        if not bad:
            raise SshdError(f"sshd -t rejected {config}:\n{out.strip()}\n--- config ---\n{config.read_text()}")
        extra = [kv for kv in extra if kv not in bad]


def _read_banner(host: str, port: int, timeout: float) -> bytes | None:
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            data = b""
            while b"\n" not in data and len(data) < 1024:
                chunk = s.recv(256)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return None
    return data if data.startswith(b"SSH-") else None


def start_sshd(workdir: Path, alias: str = "testhost") -> SshServer:
    """Start a real sshd on 127.0.0.1:<free port> with freshly generated keys.

    All files (keys, configs, log, pid file) live in ``workdir`` (created if
    missing); use a distinct ``workdir`` per server.
    """
    if not sshd_available():
        raise SshdError(f"{SSHD} not found (install openssh-server)")
    if shutil.which("ssh-keygen") is None:
        raise SshdError("ssh-keygen not found (install openssh-client)")
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    _ensure_privsep_dir()

    host_key = workdir / "ssh_host_ed25519_key"
    client_key = workdir / "client_ed25519"
    authorized_keys = workdir / "authorized_keys"
    known_hosts = workdir / "known_hosts"
    ssh_config = workdir / "ssh_config"
    sshd_config = workdir / "sshd_config"
    log = workdir / "sshd.log"

    host_key_pub = _keygen(host_key)
    host_key_fingerprint = _fingerprint(host_key.with_name(host_key.name + ".pub"))
    client_key_pub = _keygen(client_key)
    authorized_keys.write_text(client_key_pub + "\n")
    os.chmod(authorized_keys, 0o600)

    last_error = ""
    for _attempt in range(5):  # retry if someone grabs the port in between
        port = free_port()
        _check_config(sshd_config, workdir, port, host_key, authorized_keys)
        log_fh = open(log, "ab")
        proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(sshd_config)],
            stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT,
            start_new_session=True,  # keep terminal signals (Ctrl-C) away from it
        )
        server = SshServer(
            host="127.0.0.1", port=port, user=current_user(), client_key=client_key,
            host_key_pub=host_key_pub, host_key_fingerprint=host_key_fingerprint,
            known_hosts=known_hosts, ssh_config=ssh_config, alias=alias, log=log,
            workdir=workdir, client_key_pub=client_key_pub, host_key=host_key,
            authorized_keys=authorized_keys, sshd_config=sshd_config,
            proc=proc, _log_fh=log_fh,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            banner = _read_banner(server.host, port, timeout=1.0)
            if banner is not None:
                known_hosts.write_text(server.known_hosts_line + "\n")
                os.chmod(known_hosts, 0o600)
                write_ssh_config(ssh_config, [server])
                return server
            time.sleep(0.05)
        exit_code = proc.poll()
        server.stop()
        tail = _tail(log)
        if exit_code is not None and ("Address already in use" in tail
                                            or "Cannot bind any address" in tail):
            last_error = tail
            continue
        state = (f"exited with code {exit_code}" if exit_code is not None
                 else f"did not serve an SSH banner on 127.0.0.1:{port} within {START_TIMEOUT:.0f}s")
        raise SshdError(f"sshd {state}; log {log}:\n{tail}")
    raise SshdError(f"sshd could not bind a free port after several attempts:\n{last_error}")
