"""Shared pytest fixtures.

Keep each feature's fixtures in its own delimited section; append new sections
below.  (Do not define pytest hooks in more than one section: a second
definition with the same name silently replaces the first.)
"""

from __future__ import annotations

# ============================================================================
# BEGIN sshd fixtures (real OpenSSH sshd; see tests/sshd.py)
# ============================================================================
import os as _sshd_os
from pathlib import Path as _SshdPath

import signal as _signal

import pytest

# A suite started in the background (`pytest ... &` from a script) inherits SIGINT as ignored, and
# so would every CLI it starts: the Ctrl-C tests would then wait for a signal that never lands.
# A Python handler here makes the children start with the default disposition again.
if _signal.getsignal(_signal.SIGINT) is _signal.SIG_IGN:
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)

try:  # tests/ on sys.path (default rootdir/prepend import mode)
    from sshd import SSHD as _SSHD, SshServer, sshd_available as _sshd_available, start_sshd
except ImportError:  # tests/ became a package, or --import-mode=importlib
    from tests.sshd import SSHD as _SSHD, SshServer, sshd_available as _sshd_available, start_sshd


def _sshd_required() -> bool:
    # In CI (or when scripts/test.sh runs the suite) a missing sshd is an error.
    return any(_sshd_os.environ.get(v, "").strip().lower() not in ("", "0", "false", "no")
               for v in ("CI", "ENVBISECT_REQUIRE_SSHD"))


def _start_sshd_or_skip(tmp_path_factory: pytest.TempPathFactory, name: str, alias: str):
    if not _sshd_available():
        msg = f"{_SSHD} is missing (apt-get install openssh-server, or run scripts/test.sh)"
        if _sshd_required():
            pytest.fail(msg + " -- required because CI/ENVBISECT_REQUIRE_SSHD is set", pytrace=False)
        pytest.skip(msg)
    server = start_sshd(tmp_path_factory.mktemp(name), alias=alias)
    return server


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory):
    """A real sshd on 127.0.0.1 (alias "testhost"), shared by the whole session."""
    server = _start_sshd_or_skip(tmp_path_factory, "sshd", "testhost")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def sshd2(tmp_path_factory: pytest.TempPathFactory):
    """A second, independent sshd (alias "testhost2"; own port and keys)."""
    server = _start_sshd_or_skip(tmp_path_factory, "sshd2", "testhost2")
    yield server
    server.stop()


@pytest.fixture
def ssh_env(sshd: SshServer, tmp_path: _SshdPath) -> dict[str, str]:
    """Environment for code that resolves "testhost" via ~/.ssh/config.

    Returns a copy of os.environ with HOME pointing at a fresh fake home whose
    ~/.ssh/config holds the `testhost` block and ~/.ssh/known_hosts the
    server's host key; SSH_AUTH_SOCK is removed so agent keys don't interfere.
    Nothing is changed globally: pass it as `env=` to subprocesses, or
    `monkeypatch.setenv("HOME", ssh_env["HOME"])` for in-process code.
    Note: the `ssh` binary reads ~/.ssh from the passwd entry, not $HOME --
    use `ssh -F sshd.ssh_config` (or `sshd.ssh_cmd(...)`) for it.
    """
    home = tmp_path / "home"
    dot_ssh = home / ".ssh"
    dot_ssh.mkdir(parents=True)
    dot_ssh.chmod(0o700)
    (dot_ssh / "config").write_text(sshd.config_block())
    (dot_ssh / "known_hosts").write_text(sshd.known_hosts_line + "\n")
    for p in dot_ssh.iterdir():
        p.chmod(0o600)
    env = dict(_sshd_os.environ)
    env["HOME"] = str(home)
    env.pop("SSH_AUTH_SOCK", None)
    return env


# ============================================================================
# END sshd fixtures
# ============================================================================


# ============================================================================
# BEGIN alertmanager fixtures (real Prometheus Alertmanager; see tests/alertmanager.py)
# ============================================================================
try:
    from alertmanager import Alertmanager, alertmanager_binary as _alertmanager_binary, free_port as _free_port, \
        start_alertmanager as _start_alertmanager
except ImportError:  # tests/ became a package, or --import-mode=importlib
    from tests.alertmanager import Alertmanager, alertmanager_binary as _alertmanager_binary, \
        free_port as _free_port, start_alertmanager as _start_alertmanager


@pytest.fixture
def alertmanager_for(tmp_path_factory: pytest.TempPathFactory):
    """start(webhook_url) -> a real Alertmanager on a free loopback port, its one receiver a webhook to
    webhook_url (group_wait 5s). Missing binary: a failure under scripts/test.sh (CI or
    ENVBISECT_REQUIRE_SSHD set), a skip elsewhere."""
    started: list[Alertmanager] = []

    def start(webhook_url: str) -> Alertmanager:
        if _alertmanager_binary() is None:
            msg = "prometheus-alertmanager is missing (apt-get install prometheus-alertmanager, or run scripts/test.sh)"
            if _sshd_required():
                pytest.fail(msg + " -- required because CI/ENVBISECT_REQUIRE_SSHD is set", pytrace=False)
            pytest.skip(msg)
        am = _start_alertmanager(tmp_path_factory.mktemp("alertmanager"), webhook_url)
        started.append(am)
        return am

    yield start
    for am in started:
        am.stop()


@pytest.fixture
def free_port() -> int:
    """A loopback TCP port nobody listens on now (for `watch --listen`)."""
    return _free_port()


# ============================================================================
# END alertmanager fixtures
# ============================================================================
