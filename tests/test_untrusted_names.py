"""Host and user names that would reach a shell (issue 22, F2; CVE-2023-51385), and an ansible.cfg
in a world-writable working directory (F3).

`%h`/`%r`/`%n` in a ProxyCommand or a ``Match exec`` are substituted unquoted into a shell command,
as OpenSSH substitutes them. OpenSSH 9.6 refuses shell metacharacters in a host or user name given on
the command line (ssh.c valid_hostname / valid_ruser); envbisect refuses them the same way, before any
ssh config is read, whether the name comes from a playbook's ``ssh = ...`` or an inventory."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envbisect.errors import UsageError
from envbisect.hosts import sshconfig
from envbisect.hosts.inventory import parse_inventory_json, read_ansible_cfg
from envbisect.hosts.transport import resolve_target

from hosttree import make_tree

ENVBISECT = [sys.executable, "-m", "envbisect.cli.app"]


@pytest.fixture(autouse=True)
def quiet_env(tmp_path, monkeypatch):
    """An empty ~/.ssh, no ANSIBLE_* of the machine, no agent."""
    for v in list(os.environ):
        if v.startswith("ANSIBLE_"):
            monkeypatch.delenv(v)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


def shell_config(tmp_path: Path) -> Path:
    """A config whose Match exec and ProxyCommand put %h and %r into a shell unquoted, as a user's config may."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Match exec \"test -n %h%r\"\n  ConnectTimeout 2\n"
                   "Host *\n  ProxyCommand nc %h %p\n")
    return cfg


# --- what OpenSSH refuses, and what it allows ---------------------------------------------------

@pytest.mark.parametrize("host", [
    "gpu1$(touch X)", "gpu1`touch X`", "gpu1;touch X", "gpu1&&x", "gpu1|x", "gpu1>x", "gpu1<x", "gpu1'x", 'gpu1"x',
    "gpu1\\x", "gpu1(x)", "gpu1{x}", "gpu1,x", "gpu 1", "gpu1\tx", "gpu1\nx", "gpu1\x1bx", "-oProxyCommand=x",
])
def test_a_host_name_with_shell_metacharacters_is_refused(tmp_path, host):
    mark = tmp_path / "X"
    with pytest.raises(UsageError) as e:
        sshconfig.resolve(host.replace("X", str(mark)), config=shell_config(tmp_path))
    assert "\n" not in str(e.value) and "invalid characters" in str(e.value)
    assert not mark.exists()


@pytest.mark.parametrize("user", ["a;touch X", "a`x`", "a|b", "a&b", "a>b", "a'b", 'a"b', "a(b)",
                                  "a{b}", "-la", "a -b", "a\\", "a\x01b"])
def test_a_user_name_with_shell_metacharacters_is_refused(tmp_path, user):
    mark = tmp_path / "X"
    user = user.replace("X", str(mark))
    for kw in ({"user": user}, {"options": [("User", sshconfig.quote_value(user))]}):
        with pytest.raises(UsageError) as e:
            sshconfig.resolve("gpu1", config=shell_config(tmp_path), **kw)
        assert "\n" not in str(e.value) and "invalid characters" in str(e.value)
    assert not mark.exists()


@pytest.mark.parametrize("spec,user,host", [
    ("gpu-1.example.com", None, "gpu-1.example.com"), ("gpu_1", None, "gpu_1"), ("10.0.0.7", None, "10.0.0.7"),
    ("deploy@gpu1", "deploy", "gpu1"), ("a@b@gpu1", "a@b", "gpu1"), ("svc.user-1@gpu1:2222", "svc.user-1", "gpu1"),
    ("[::1]:2222", None, "::1"), ("root@[fe80::1%eth0]:22", "root", "fe80::1%eth0"), ("GPU1", None, "gpu1"),
])
def test_legitimate_names_still_resolve(tmp_path, spec, user, host):
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host *\n  ConnectTimeout 2\n")
    t = resolve_target(spec, cfg)
    assert t.hostname == host and (user is None or t.user == user)


def test_the_refusal_matches_openssh_itself(tmp_path):
    """Where the ssh client on this machine carries the CVE-2023-51385 fix, it refuses exactly what envbisect does."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host *\n  ConnectTimeout 2\n")
    probe = subprocess.run(["ssh", "-G", "-F", str(cfg), "a$(true)"], capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=30)
    if "invalid characters" not in probe.stderr:
        pytest.skip("this ssh client predates the CVE-2023-51385 fix")
    for host in ("gpu1$(x)", "gpu1;x", "gpu,1", "-gpu", "gpu 1", "gpu-1.example.com", "gpu_1", "gpu1%h", "gpu*1"):
        theirs = subprocess.run(["ssh", "-G", "-F", str(cfg), "--", host], capture_output=True, text=True,
                                stdin=subprocess.DEVNULL, timeout=30).returncode == 0
        try:
            sshconfig.resolve(host, config=cfg)
            mine = True
        except UsageError:
            mine = False
        assert mine == theirs, host
    for user in ("a;b", "a`b`", "-l", "deploy", "a@b", "svc.user-1"):
        theirs = subprocess.run(["ssh", "-G", "-F", str(cfg), "-l", user, "gpu1"], capture_output=True, text=True,
                                stdin=subprocess.DEVNULL, timeout=30).returncode == 0
        try:
            sshconfig.resolve("gpu1", config=cfg, user=user)
            mine = True
        except UsageError:
            mine = False
        assert mine == theirs, user


# --- through the CLI: a playbook and an inventory ------------------------------------------------

def run_cli(*args, cwd=None, **kw):
    return subprocess.run([*ENVBISECT, *args], capture_output=True, text=True, timeout=120, cwd=cwd, **kw)


def inventory_playbook(tree, target: str) -> Path:
    pb = tree.playbook("PLACEHOLDER")
    pb.write_text(pb.read_text().replace('ssh = "PLACEHOLDER"', f'inventory = "{target}"'))
    return pb


@pytest.mark.parametrize("hostvars,what", [
    ({"ansible_host": "gpu1$(>MARK)"}, "ansible_host"),
    ({"ansible_host": "127.0.0.1", "ansible_user": "root;>MARK"}, "ansible_user"),
])
def test_an_inventory_name_that_would_run_a_command_is_refused_in_one_line(tmp_path, hostvars, what):
    mark = tmp_path / "MARK"
    hostvars = {k: v.replace("MARK", str(mark)) for k, v in hostvars.items()}
    inv = tmp_path / "inventory.json"
    inv.write_text(json.dumps({"_meta": {"hostvars": {"gpu-a": hostvars}}, "all": {"children": ["g"]},
                               "g": {"hosts": ["gpu-a"]}}))
    tree = make_tree(tmp_path / "host")
    r = run_cli("-p", str(inventory_playbook(tree, "gpu-a")), "--store", str(tmp_path / "s"), "--inventory", str(inv),
                "--ssh-config", str(shell_config(tmp_path)), "snapshot")
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and what in r.stderr and "invalid characters" in r.stderr
    assert not mark.exists()


@pytest.mark.parametrize("ssh", ["gpu1$(>MARK)", "root;>MARK@127.0.0.1"])
def test_a_playbook_name_that_would_run_a_command_is_refused_in_one_line(tmp_path, ssh):
    mark = tmp_path / "MARK"
    tree = make_tree(tmp_path / "host")
    pb = tree.playbook(ssh.replace("MARK", str(mark)))
    r = run_cli("-p", str(pb), "--store", str(tmp_path / "s"), "--ssh-config", str(shell_config(tmp_path)), "snapshot")
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "invalid characters" in r.stderr
    assert not mark.exists()


def test_inventory_connection_names_the_variable():
    inv = parse_inventory_json({"_meta": {"hostvars": {"gpu-a": {"ansible_host": "gpu1`id`"}}},
                                "all": {"hosts": ["gpu-a"]}}, "inv.json")
    with pytest.raises(UsageError, match=r"host gpu-a: ansible_host 'gpu1`id`' contains invalid characters"):
        inv.connection("gpu-a", ansible_cfg=read_ansible_cfg())


# --- F3: ./ansible.cfg in a world-writable working directory ---------------------------------------

def proxy_cfg_dir(tmp_path: Path, mode: int) -> tuple[Path, Path, Path, Path]:
    """A working directory with an ansible.cfg whose ssh_args run a ProxyCommand that creates MARK, an
    inventory host on a closed port, and the playbook."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    mark = tmp_path / "MARK"
    (cwd / "ansible.cfg").write_text(f"[ssh_connection]\nssh_args = -o 'ProxyCommand=touch {mark}' "
                                     "-o ConnectTimeout=2\n")
    cwd.chmod(mode)
    inv = tmp_path / "inventory.json"
    inv.write_text(json.dumps({"_meta": {"hostvars": {"gpu-a": {"ansible_host": "127.0.0.1", "ansible_port": 9}}},
                               "all": {"hosts": ["gpu-a"]}}))
    tree = make_tree(tmp_path / "host")
    return cwd, mark, inventory_playbook(tree, "gpu-a"), inv


def test_ansible_cfg_in_a_world_writable_cwd_is_skipped_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    empty = tmp_path / "ssh_config"
    empty.write_text("# nothing\n")
    cwd, mark, pb, inv = proxy_cfg_dir(tmp_path, 0o777)
    r = run_cli("-p", str(pb), "--store", str(tmp_path / "s"), "--inventory", str(inv), "--ssh-config", str(empty),
                "snapshot", cwd=cwd)
    assert not mark.exists(), r.stderr
    assert f"world writable directory ({cwd}), ignoring it as an ansible.cfg source" in r.stderr
    assert "Traceback" not in r.stderr
    # the same directory, writable by its owner only: read as Ansible reads it (the ProxyCommand runs)
    cwd.chmod(0o755)
    r = run_cli("-p", str(pb), "--store", str(tmp_path / "s"), "--inventory", str(inv), "--ssh-config", str(empty),
                "snapshot", cwd=cwd)
    assert mark.exists(), r.stderr
    assert "world writable" not in r.stderr


def test_read_ansible_cfg_follows_ansibles_order(tmp_path, monkeypatch):
    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "ansible.cfg").write_text("[defaults]\nremote_user = fromcwd\n")
    monkeypatch.chdir(cwd)
    assert read_ansible_cfg().get("defaults", "remote_user") == "fromcwd"
    cwd.chmod(0o1777)  # sticky or not, world-writable is enough (as in Ansible)
    assert not read_ansible_cfg().has_option("defaults", "remote_user")
    home_cfg = Path(os.environ["HOME"]) / ".ansible.cfg"
    home_cfg.write_text("[defaults]\nremote_user = fromhome\n")
    assert read_ansible_cfg().get("defaults", "remote_user") == "fromhome"
    # ANSIBLE_CONFIG names a file on purpose: it is read wherever it is
    monkeypatch.setenv("ANSIBLE_CONFIG", str(cwd / "ansible.cfg"))
    assert read_ansible_cfg().get("defaults", "remote_user") == "fromcwd"
    cwd.chmod(0o755)
