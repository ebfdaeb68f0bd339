"""Checks that the real-sshd fixtures (tests/sshd.py, conftest.py) work."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import paramiko
import pytest

try:
    from sshd import SshServer, write_ssh_config
except ImportError:
    from tests.sshd import SshServer, write_ssh_config

pytestmark = pytest.mark.sshd


def _client(server: SshServer, known_hosts: Path | None = None) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts or server.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        server.host, port=server.port, username=server.user,
        key_filename=str(server.client_key), look_for_keys=False, allow_agent=False,
        timeout=10, banner_timeout=10, auth_timeout=10,
    )
    return client


def _exec(client: paramiko.SSHClient, cmd: str) -> tuple[int, str]:
    _stdin, stdout, _stderr = client.exec_command(cmd, timeout=10)
    out = stdout.read().decode()
    return stdout.channel.recv_exit_status(), out


class _Listener:
    """A tiny TCP server on 127.0.0.1 answering each line with b"pong:" + line."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(10)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(10)
            buf = b""
            while b"\n" not in buf:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                buf += chunk
            self.received.append(buf)
            conn.sendall(b"pong:" + buf)

    def close(self) -> None:
        self.sock.close()
        self.thread.join(timeout=5)


def test_server_fields(sshd: SshServer):
    assert sshd.host == "127.0.0.1"
    assert sshd.is_running()
    assert sshd.host_key_pub.startswith("ssh-ed25519 AAAA")
    assert len(sshd.host_key_pub.split()) == 2
    assert sshd.host_key_fingerprint.startswith("SHA256:")
    assert sshd.known_hosts.read_text().strip() == f"[127.0.0.1]:{sshd.port} {sshd.host_key_pub}"
    assert oct(sshd.client_key.stat().st_mode & 0o777) == oct(0o600)
    cfg = sshd.ssh_config.read_text()
    assert f"Host {sshd.alias}\n" in cfg and f"Port {sshd.port}\n" in cfg
    # The fingerprint is the one of the key the server presents.
    raw = base64.b64decode(sshd.host_key_pub.split()[1])
    expected = "SHA256:" + base64.b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")
    assert sshd.host_key_fingerprint == expected


def test_paramiko_strict_connect_exec_and_direct_tcpip(sshd: SshServer):
    client = _client(sshd)
    try:
        transport = client.get_transport()
        assert transport is not None and transport.is_authenticated()
        served_key = transport.get_remote_server_key()
        assert f"{served_key.get_name()} {served_key.get_base64()}" == sshd.host_key_pub

        assert _exec(client, "echo hi") == (0, "hi\n")

        listener = _Listener()
        try:
            chan = transport.open_channel(
                "direct-tcpip", ("127.0.0.1", listener.port), ("127.0.0.1", 0), timeout=10
            )
            chan.settimeout(10)
            chan.sendall(b"ping 123\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = chan.recv(4096)
                if not chunk:
                    break
                data += chunk
            chan.close()
            assert data == b"pong:ping 123\n"
            assert listener.received == [b"ping 123\n"]
        finally:
            listener.close()
    finally:
        client.close()


def test_paramiko_sftp(sshd: SshServer):
    client = _client(sshd)
    try:
        with client.open_sftp() as sftp:
            assert "sshd_config" in sftp.listdir(str(sshd.workdir))
    finally:
        client.close()


def test_paramiko_rejects_unknown_host(sshd: SshServer, tmp_path: Path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(paramiko.SSHException):
        _client(sshd, known_hosts=empty).close()


def test_paramiko_rejects_wrong_host_key(sshd: SshServer, sshd2: SshServer, tmp_path: Path):
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{sshd.port} {sshd2.host_key_pub}\n")
    with pytest.raises(paramiko.BadHostKeyException):
        _client(sshd, known_hosts=wrong).close()


def test_two_servers_coexist(sshd: SshServer, sshd2: SshServer):
    assert sshd.port != sshd2.port
    assert sshd.alias != sshd2.alias
    assert sshd.host_key_pub != sshd2.host_key_pub
    for server in (sshd, sshd2):
        client = _client(server)
        try:
            assert _exec(client, "echo $((40+2))") == (0, "42\n")
        finally:
            client.close()


def _require_ssh_client() -> str:
    ssh = shutil.which("ssh")
    if ssh is None:
        if os.environ.get("CI") or os.environ.get("ENVBISECT_REQUIRE_SSHD"):
            pytest.fail("ssh client missing (install openssh-client)")
        pytest.skip("ssh client missing (install openssh-client)")
    return ssh


def test_openssh_client_with_generated_config(sshd: SshServer):
    _require_ssh_client()
    proc = subprocess.run(
        ["ssh", "-F", str(sshd.ssh_config), sshd.alias, "true"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, f"{proc.stderr}\n--- sshd log ---\n{sshd.log_tail()}"
    proc = subprocess.run(sshd.ssh_cmd("echo", "hi"), capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL)
    assert (proc.returncode, proc.stdout) == (0, "hi\n"), proc.stderr


def test_openssh_client_combined_config(sshd: SshServer, sshd2: SshServer, tmp_path: Path):
    _require_ssh_client()
    cfg = write_ssh_config(tmp_path / "ssh_config", [sshd, sshd2])
    for server in (sshd, sshd2):
        proc = subprocess.run(["ssh", "-F", str(cfg), server.alias, "true"],
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, f"{server.alias}: {proc.stderr}\n{server.log_tail()}"


def test_openssh_client_rejects_unknown_host(sshd: SshServer, tmp_path: Path):
    _require_ssh_client()
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    proc = subprocess.run(
        ["ssh", "-F", str(sshd.ssh_config), "-o", f"UserKnownHostsFile={empty}", sshd.alias, "true"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 255


def test_ssh_env_home_config(ssh_env: dict[str, str], sshd: SshServer):
    cfg_path = Path(ssh_env["HOME"]) / ".ssh" / "config"
    cfg = paramiko.SSHConfig.from_path(str(cfg_path)).lookup(sshd.alias)
    assert cfg["hostname"] == "127.0.0.1"
    assert int(cfg["port"]) == sshd.port
    assert cfg["user"] == sshd.user
    assert cfg["identityfile"] == [str(sshd.client_key)]
    assert "SSH_AUTH_SOCK" not in ssh_env


def test_a_command_runs_without_the_developers_bashrc(sshd: SshServer):
    """The session's bash is not the top shell (SetEnv SHLVL=1), so it does not source ~/.bashrc
    before the command: whatever this machine's ~/.bashrc sets (pyenv's PATH, here) is absent, and
    a command costs what it costs on a host whose service account has no interactive setup."""
    _require_ssh_client()
    proc = subprocess.run(sshd.ssh_cmd("echo", "$SHLVL:$PATH"), capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    level, path = proc.stdout.strip().split(":", 1)
    assert level == "2", proc.stdout
    assert ".pyenv" not in path, path
