"""The OpenSSH client config read like ssh reads it (envbisect/sshconfig.py), checked against
`ssh -G` itself, and connections through it over real sshd instances (Include'd files, a 2-hop
ProxyJump chain, UserKnownHostsFile, HostKeyAlias, IdentitiesOnly, ProxyCommand)."""
from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from envbisect.hosts import sshconfig
from envbisect.runs.deployment import ConnectOptions, Deployment
from envbisect.errors import ConnectionFailed, HostKeyError
from envbisect.inputs.playbook import Host, load_playbook
from envbisect.state.store import Store
from envbisect.hosts.transport import SSHTransport, resolve_target

from hosttree import DECODE, make_tree

ENVBISECT = [sys.executable, "-m", "envbisect.cli.app"]
# the lines of `ssh -G` envbisect's resolution must reproduce exactly
KEYS = ("user", "hostname", "port", "identityfile", "identitiesonly", "proxyjump", "proxycommand",
        "userknownhostsfile", "globalknownhostsfile", "hostkeyalias", "connecttimeout", "batchmode")
needs_ssh = pytest.mark.skipif(shutil.which("ssh") is None, reason="the OpenSSH client (ssh) is not installed")


def ssh_G(config: Path, host: str, env: dict | None = None) -> dict[str, list[str]]:
    """OpenSSH's own answer: `ssh -G -F CONFIG HOST`, the lines of KEYS."""
    p = subprocess.run(["ssh", "-G", "-F", str(config), host], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, env=env, timeout=30)
    assert p.returncode == 0, p.stderr
    out: dict[str, list[str]] = {}
    for line in p.stdout.splitlines():
        k, _, v = line.partition(" ")
        if k in KEYS:
            out.setdefault(k, []).append(v)
    return out


def ours(config: Path, host: str) -> dict[str, list[str]]:
    return {k: v for k, v in sshconfig.resolve(host, config=config).ssh_g().items() if k in KEYS and v}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    path.chmod(0o600)
    return path


@pytest.fixture
def real_home(monkeypatch):
    """ssh expands ~ with the passwd entry's home, envbisect with $HOME: make them the same."""
    monkeypatch.setenv("HOME", pwd.getpwuid(os.getuid()).pw_dir)


def tricky_config(d: Path) -> Path:
    write(d / "conf.d" / "10-jumps.conf", """\
        Host bastion
            HostName 127.0.0.1
            Port 2201
            User jumper
            IdentityFile {d}/keys/bastion
        Host inner
            HostName 10.0.0.2
            ProxyJump jumper@bastion:2201
        # a Match in an included file applies to the rest of *this* file only
        Match host nothing-is-called-this
            User never
        """.replace("{d}", str(d)))
    write(d / "conf.d" / "20-gpu.conf", """\
        Host gpu* !gpu-legacy !gpu9
            HostName %h.cluster.example
            ProxyJump bastion,inner
            UserKnownHostsFile {d}/kh/cluster {d}/kh/cluster2
            HostKeyAlias GPU-Fleet
            IdentitiesOnly yes
        Match originalhost gpu-legacy
            ProxyCommand ssh -W %h:%p -l %r bastion
            User legacy
        """.replace("{d}", str(d)))
    write(d / "conf.d" / "README", "Host *\n    User not-a-conf-file\n")  # not matched by the glob
    write(d / "inc" / "mismatch.inc", "Match host nothing-else\n    Port 1\n")
    write(d / "inc" / "inactive.inc", "User from-an-inactive-include\nMatch all\n    Port 1999\n")
    return write(d / "config", """\
        # a config only OpenSSH's own rules read right
        Include {d}/conf.d/*.conf {d}/missing/*.conf
        Host gpu-legacy
            HostName Legacy.Example
        Match host *.cluster.example user *,!nobody
            IdentityFile {d}/keys/id_%h_%u_%r
            ConnectTimeout 1m5s
            Port 2022
        Match host *.cluster.example user !nobody
            # a list of negations alone never matches
            Port 1
        Match final host gpu1.cluster.example
            BatchMode yes
        Match exec "test %n = execme"
            User fromexec
        Host lonely
            Include {d}/inc/mismatch.inc
            # the include's Match must not switch this block off
            Port 2400
        Host other-only
            Include {d}/inc/inactive.inc
        Host bastion
            IdentityFile {d}/keys/second
            User not-first
        Host=*
            User = default
            IdentityFile %d/.ssh/fallback
            ConnectTimeout 3
        """.replace("{d}", str(d)))


TRICKY_HOSTS = ["gpu1", "gpu2", "gpu-legacy", "gpu9", "GPU3", "bastion", "inner", "execme", "lonely", "other-only",
                "10.1.2.3"]


@needs_ssh
@pytest.mark.parametrize("host", TRICKY_HOSTS)
def test_resolution_equals_ssh_G_field_by_field(tmp_path, real_home, host):
    cfg = tricky_config(tmp_path)
    want = ssh_G(cfg, host)
    got = ours(cfg, host)
    for k in KEYS:
        assert got.get(k) == want.get(k), f"{host}: {k}: envbisect {got.get(k)} != ssh -G {want.get(k)}"


def test_tricky_config_reads_as_intended(tmp_path, real_home):
    """What the comparison above proves, spelled out (so a wrong `ssh -G` could not hide a bug)."""
    cfg = tricky_config(tmp_path)
    g = sshconfig.resolve("gpu1", config=cfg)
    assert (g.hostname, g.port, g.user) == ("gpu1.cluster.example", 2022, "default")
    assert [j.spec for j in g.proxy_jump] == ["bastion", "inner"] and g.proxy_command is None
    assert g.user_known_hosts == (f"{tmp_path}/kh/cluster", f"{tmp_path}/kh/cluster2")
    assert g.host_key_alias == "gpu-fleet" and g.known_hosts_name == "gpu-fleet"
    assert g.identities_only and g.batch_mode and g.connect_timeout == 65
    user = pwd.getpwuid(os.getuid()).pw_name
    assert g.identity_files == (f"{tmp_path}/keys/id_gpu1.cluster.example_{user}_default",
                                f"{os.environ['HOME']}/.ssh/fallback")
    assert sshconfig.resolve("gpu9", config=cfg).hostname == "gpu9"          # negated pattern
    legacy = sshconfig.resolve("gpu-legacy", config=cfg)
    assert (legacy.hostname, legacy.user, legacy.proxy_jump) == ("legacy.example", "legacy", ())
    assert legacy.expanded_proxy_command() == "ssh -W legacy.example:22 -l legacy bastion"
    b = sshconfig.resolve("bastion", config=cfg)
    assert (b.user, b.port, b.identity_files_raw[:2]) == ("jumper", 2201, (f"{tmp_path}/keys/bastion",
                                                                          f"{tmp_path}/keys/second"))
    assert [(j.user, j.host, j.port) for j in sshconfig.resolve("inner", config=cfg).proxy_jump] == [
        ("jumper", "bastion", 2201)]
    assert sshconfig.resolve("execme", config=cfg).user == "fromexec"
    assert sshconfig.resolve("lonely", config=cfg).port == 2400
    assert (sshconfig.resolve("other-only", config=cfg).user, sshconfig.resolve("gpu1", config=cfg).port) == (
        "from-an-inactive-include", 2022)


@needs_ssh
def test_relative_include_is_relative_to_dot_ssh(tmp_path, monkeypatch):
    home = tmp_path / "home"
    write(home / ".ssh" / "conf.d" / "a.conf", "Host rel\n    Port 2300\nMatch all\n    User fromrel\n")
    write(home / ".ssh" / "conf.d" / "b.conf", "Host rel\n    Port 9\n    HostName Second.Example\n")
    cfg = write(tmp_path / "elsewhere" / "config", f"""\
        Host rel
            Include conf.d/*.conf
            HostName never-first.example
        Host *
            UserKnownHostsFile {tmp_path}/kh
        """)
    monkeypatch.setenv("HOME", str(home))
    want = ssh_G(cfg, "rel", env={**os.environ, "HOME": str(home)})
    assert ours(cfg, "rel") == {k: v for k, v in want.items() if k in KEYS}
    r = sshconfig.resolve("rel", config=cfg)
    assert (r.port, r.user, r.hostname) == (2300, "fromrel", "second.example")


# --- the rules, one by one --------------------------------------------------------------------

def test_command_line_options_come_first_and_identity_files_accumulate(tmp_path):
    cfg = write(tmp_path / "cfg", """\
        Host h
            User cfguser
            Port 2000
            IdentityFile /k/one
        Host *
            IdentityFile /k/two
            IdentityFile /k/one
            User late
        """)
    r = sshconfig.resolve("h", config=cfg, options=[("User", "inv"), ("IdentityFile", "/k/zero")])
    assert (r.user, r.port) == ("inv", 2000)
    assert r.identity_files == ("/k/zero", "/k/one", "/k/two")  # in order, no duplicate
    assert sshconfig.resolve("h", config=cfg, user="spec", port=2222).user == "spec"


def test_proxy_jump_and_proxy_command_first_one_wins(tmp_path):
    cfg = write(tmp_path / "cfg", """\
        Host pj
            ProxyJump a,b
        Host pc
            ProxyCommand nc %h %p
        Host pjnone
            ProxyJump none
        Host *
            ProxyCommand ssh -W %h:%p fallback
            ProxyJump later
        """)
    assert [j.host for j in sshconfig.resolve("pj", config=cfg).proxy_jump] == ["a", "b"]
    assert sshconfig.resolve("pj", config=cfg).proxy_command is None
    pc = sshconfig.resolve("pc", config=cfg)
    assert pc.proxy_jump == () and pc.expanded_proxy_command() == "nc pc 22"
    none = sshconfig.resolve("pjnone", config=cfg)  # "none" is obtained too: the later ones do not apply
    assert none.proxy_jump == () and none.proxy_command is None
    # a ProxyJump given on the command line (an inventory's -J) beats the config's ProxyCommand
    cmd = sshconfig.resolve("pc", config=cfg, options=[("ProxyJump", "u@[::1]:2022,ssh://v@w:23")])
    assert [(j.user, j.host, j.port) for j in cmd.proxy_jump] == [("u", "::1", 2022), ("v", "w", 23)]


def test_tokens_tilde_and_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KEYDIR", "/keys")
    cfg = write(tmp_path / "cfg", """\
        Host t
            HostName %h.example
            User remote
            Port 2022
            HostKeyAlias Alias-T
            IdentityFile ~/.ssh/id_%h_%u_%r_%p_%n_%k_%%
            IdentityFile %d/x
            IdentityFile ${KEYDIR}/k
            UserKnownHostsFile ~/kh/%h:%p
            ProxyCommand connect %h %p %r %n %k %%
        """)
    r = sshconfig.resolve("t", config=cfg)
    home, me = str(tmp_path / "home"), pwd.getpwuid(os.getuid()).pw_name
    assert r.identity_files == (f"{home}/.ssh/id_t.example_{me}_remote_2022_t_alias-t_%", f"{home}/x", "/keys/k")
    assert r.user_known_hosts == (f"{home}/kh/t.example:2022",)
    assert r.expanded_proxy_command() == "connect t.example 2022 remote t alias-t %"
    bad = write(tmp_path / "bad", "Host t\n    IdentityFile ~/id_%z\n")
    with pytest.raises(ConnectionFailed, match=r"unknown token %z"):
        sshconfig.resolve("t", config=bad)
    unset = write(tmp_path / "unset", "Host t\n    IdentityFile ${ENVBISECT_SURELY_UNSET}/k\n")
    with pytest.raises(ConnectionFailed, match=r"ENVBISECT_SURELY_UNSET\} has no value"):
        sshconfig.resolve("t", config=unset)


def test_defaults_like_ssh(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    r = sshconfig.resolve("plain", config=write(tmp_path / "cfg", "# nothing\n"))
    assert (r.hostname, r.port, r.connect_timeout, r.identities_only) == ("plain", 22, None, False)
    assert r.user_known_hosts == (f"{tmp_path}/.ssh/known_hosts", f"{tmp_path}/.ssh/known_hosts2")
    assert r.global_known_hosts == ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
    assert f"{tmp_path}/.ssh/id_ed25519" in r.identity_files
    none = sshconfig.resolve("n", config=write(tmp_path / "none", "Host n\n  UserKnownHostsFile none\n  IdentityFile none\n"))
    assert none.user_known_hosts == () and none.identity_files == ()


def test_default_files_are_user_config_then_system_config(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    write(tmp_path / ".ssh" / "config", "Host u\n    Port 2345\n")
    assert sshconfig.resolve("u").port == 2345
    assert [p for p, _ in sshconfig.default_config_files()] == [f"{tmp_path}/.ssh/config", "/etc/ssh/ssh_config"]


@pytest.mark.parametrize("text,needle", [
    ('Host x\n    HostName "unbalanced\n', "line 2: invalid quotes"),
    ("Host x\n    Port 70000\n", "line 2: bad port '70000'"),
    ("Host x\n    ConnectTimeout soon\n", "invalid time value 'soon'"),
    ("Match localnetwork 10.0.0.0/8\n", "unsupported Match attribute 'localnetwork'"),
    ("Match all host x\n", "cannot be combined"),
    ("Host x\n    IdentitiesOnly maybe\n", "unsupported option 'maybe'"),
    ("Host x\n    ProxyJump a,b:notaport\n", "invalid ProxyJump"),
    ("Host x\n    UserKnownHostsFile none /other\n", "must appear alone"),
])
def test_config_errors_are_one_line_naming_file_and_line(tmp_path, text, needle):
    cfg = write(tmp_path / "cfg", text)
    with pytest.raises(ConnectionFailed) as e:
        sshconfig.resolve("x", config=cfg)
    assert needle in str(e.value) and str(cfg) in str(e.value) and "\n" not in str(e.value)


def test_include_loop_and_group_writable_include_are_refused(tmp_path):
    loop = write(tmp_path / "loop", f"Include {tmp_path}/loop\n")
    with pytest.raises(ConnectionFailed, match="too many recursive configuration includes"):
        sshconfig.resolve("x", config=loop)
    inc = write(tmp_path / "inc.conf", "Host x\n    Port 2\n")
    inc.chmod(0o666)
    with pytest.raises(ConnectionFailed, match="bad owner or permissions"):
        sshconfig.resolve("x", config=write(tmp_path / "cfg", f"Include {inc}\n"))
    missing = tmp_path / "nope"
    with pytest.raises(ConnectionFailed, match="no such ssh config"):
        sshconfig.resolve("x", config=missing)


def test_parse_ssh_args_like_the_ssh_command_line():
    opts = sshconfig.parse_ssh_args("-C -o ControlMaster=auto -o 'ProxyCommand=ssh -W %h:%p -q bastion' "
                                    "-oUserKnownHostsFile=/kh -J a,b -p 2200 -l bob -i ~/k -4", "test")
    assert opts == [("controlmaster", "auto"), ("proxycommand", "ssh -W %h:%p -q bastion"),
                    ("userknownhostsfile", "/kh"), ("proxyjump", "a,b"), ("port", "2200"), ("user", "bob"),
                    ("identityfile", "~/k")]
    assert sshconfig.parse_ssh_args('-o "ProxyJump jump1"', "t") == [("proxyjump", "jump1")]
    with pytest.raises(ConnectionFailed, match="-F cfg is not supported here; pass --ssh-config cfg"):
        sshconfig.parse_ssh_args("-F cfg", "t")


def test_jump_loop_is_found_before_any_connection(tmp_path):
    cfg = write(tmp_path / "cfg", "Host bastion\n    HostName 127.0.0.1\nHost *\n    ProxyJump bastion\n")
    with pytest.raises(ConnectionFailed, match="ProxyJump chain longer than 8 hops"):
        SSHTransport(Host("node1", "target"), ssh_config=str(cfg), attempts=1)
    same = write(tmp_path / "same", "Host *\n    ProxyJump self\n")
    with pytest.raises(ConnectionFailed, match="jumphost loop via self"):
        resolve_target("self", str(same))


# --- over real sshd instances -----------------------------------------------------------------

def host_block(server, alias: str, known_hosts: Path, *extra: str) -> str:
    lines = [f"Host {alias}", "    HostName 127.0.0.1", f"    Port {server.port}", f"    User {server.user}",
             f"    IdentityFile {server.client_key}", "    IdentitiesOnly yes", f"    UserKnownHostsFile {known_hosts}",
             "    GlobalKnownHostsFile /dev/null", "    ConnectTimeout 10", *[f"    {e}" for e in extra]]
    return "\n".join(lines) + "\n"


def accepted(server) -> int:
    return server.log.read_text(errors="replace").count("Accepted publickey")


@pytest.fixture
def fake_home(tmp_path, monkeypatch):
    """A home with an empty ~/.ssh, and no agent: nothing but the config under test decides."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


def two_hop_config(tmp_path: Path, sshd, sshd2) -> Path:
    """target = sshd2, reached as us -> hop1 (sshd2) -> hop2 (sshd) -> target, every block in an Include'd file;
    the target's key is known under its HostKeyAlias only, in its own UserKnownHostsFile."""
    d = tmp_path / "ssh"
    hops_kh = write(d / "known_hosts.hops", sshd.known_hosts_line + "\n" + sshd2.known_hosts_line + "\n")
    target_kh = write(d / "known_hosts.target", f"target-alias {sshd2.host_key_pub}\n")
    write(d / "conf.d" / "10-hops.conf", host_block(sshd2, "hop1", hops_kh) + host_block(sshd, "hop2", hops_kh))
    write(d / "conf.d" / "20-target.conf",
          host_block(sshd2, "target", target_kh, "ProxyJump hop1,hop2", "HostKeyAlias target-alias"))
    return write(d / "config", f"# the real config is in the included files\nInclude {d}/conf.d/*.conf\n")


@pytest.mark.sshd
def test_two_hop_proxy_jump_across_two_sshds_with_included_config(tmp_path, sshd, sshd2, fake_home):
    cfg = two_hop_config(tmp_path, sshd, sshd2)
    if shutil.which("ssh"):
        for h in ("target", "hop1", "hop2"):  # OpenSSH reads the same config the same way
            assert ours(cfg, h) == ssh_G(cfg, h, env=dict(os.environ))
        # ... and really connects through it (ssh -J runs `ssh -W` per hop with the same -F)
        p = subprocess.run(["ssh", "-F", str(cfg), "-o", "BatchMode=yes", "target", "echo", "via-ssh"],
                           capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
        assert p.stdout.strip() == "via-ssh", p.stderr
    t = resolve_target("target", str(cfg))
    assert [j.host for j in t.proxy_jump] == ["hop1", "hop2"] and t.known_hosts_name == "target-alias"
    before = accepted(sshd), accepted(sshd2)
    tree = make_tree(tmp_path / "host")
    pb = tree.playbook("target")
    r = subprocess.run([*ENVBISECT, "-p", str(pb), "--store", str(tmp_path / "s"), "--ssh-config", str(cfg),
                        "snapshot", "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["hosts"]["node1"]["round_trips"] == 1
    snap = Store(tmp_path / "s").find(json.loads(r.stdout)["id"])
    assert snap.hosts["node1"].files[str(tree.env("decode"))].content == DECODE.encode()
    # hop1 and the target are sshd2 (2 logins), hop2 is sshd (1 login): the chain was really taken
    assert (accepted(sshd) - before[0], accepted(sshd2) - before[1]) == (1, 2)


@pytest.mark.sshd
def test_a_broken_hop_is_named_in_one_line(tmp_path, sshd, sshd2, fake_home):
    cfg = two_hop_config(tmp_path, sshd, sshd2)
    text = (tmp_path / "ssh" / "conf.d" / "10-hops.conf").read_text()
    (tmp_path / "ssh" / "conf.d" / "10-hops.conf").write_text(text.replace(str(sshd.client_key), str(tmp_path / "nokey")))
    tree = make_tree(tmp_path / "host")
    r = subprocess.run([*ENVBISECT, "-p", str(tree.playbook("target")), "--store", str(tmp_path / "s"),
                        "--ssh-config", str(cfg), "snapshot"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "node1: jump host hop2" in r.stderr and "authentication failed" in r.stderr


@pytest.mark.sshd
def test_user_known_hosts_file_replaces_the_default_one(tmp_path, sshd, fake_home):
    (fake_home / ".ssh" / "known_hosts").write_text(sshd.known_hosts_line + "\n")  # right key, but not consulted
    empty = write(tmp_path / "kh.empty", "")
    cfg = write(tmp_path / "cfg", host_block(sshd, "h", empty))
    with pytest.raises(HostKeyError, match="unknown host key") as e:
        SSHTransport(Host("node1", "h"), ssh_config=str(cfg), attempts=1)
    assert str(empty) in str(e.value)
    # and the other way round: a wrong key in ~/.ssh/known_hosts does not matter
    (fake_home / ".ssh" / "known_hosts").write_text(f"[127.0.0.1]:{sshd.port} " + other_key(tmp_path) + "\n")
    good = write(tmp_path / "kh.good", sshd.known_hosts_line + "\n")
    cfg = write(tmp_path / "cfg2", host_block(sshd, "h", good))
    with SSHTransport(Host("node1", "h"), ssh_config=str(cfg), attempts=1) as t:
        assert t.run("echo ok").stdout == b"ok\n"
    # no UserKnownHostsFile at all: the default is ~/.ssh/known_hosts (here the wrong key: refused as changed)
    cfg = write(tmp_path / "cfg3", host_block(sshd, "h", good).replace(f"    UserKnownHostsFile {good}\n", ""))
    with pytest.raises(HostKeyError, match="HOST KEY CHANGED"):
        SSHTransport(Host("node1", "h"), ssh_config=str(cfg), attempts=1)


def other_key(tmp_path: Path) -> str:
    """"ssh-ed25519 AAAA..." of a fresh key that no sshd has."""
    k = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(k)], check=True)
    return " ".join(k.with_name("other_key.pub").read_text().split()[:2])


@pytest.mark.sshd
def test_host_key_alias_is_the_name_looked_up_and_recorded(tmp_path, sshd, fake_home):
    kh = write(tmp_path / "kh", f"Other-Name,gpu-*,!gpu-bad {sshd.host_key_pub}\n")  # patterns, as ssh reads them
    cfg = write(tmp_path / "cfg", host_block(sshd, "h", kh, "HostKeyAlias GPU-7"))
    with SSHTransport(Host("node1", "h"), ssh_config=str(cfg), attempts=1) as t:
        assert t.run("echo ok").ok
    bad = write(tmp_path / "cfg.bad", host_block(sshd, "h", kh, "HostKeyAlias gpu-bad"))  # negated: not trusted
    with pytest.raises(HostKeyError, match="unknown host key .* for gpu-bad"):
        SSHTransport(Host("node1", "h"), ssh_config=str(bad), attempts=1)
    # --accept-new-host-key records the key under the alias, in the first UserKnownHostsFile
    new = write(tmp_path / "kh.new", "")
    cfg = write(tmp_path / "cfg.new", host_block(sshd, "h", new, "HostKeyAlias fresh-alias"))
    with SSHTransport(Host("node1", "h"), ssh_config=str(cfg), accept_new_host_key=True, attempts=1):
        pass
    assert new.read_text() == f"fresh-alias {sshd.host_key_pub}\n"
    with SSHTransport(Host("node1", "h"), ssh_config=str(cfg), attempts=1) as t:
        assert t.run("true").ok
    # HashKnownHosts yes: recorded hashed, like ssh does it, and found again
    hashed = write(tmp_path / "kh.hashed", "")
    cfg = write(tmp_path / "cfg.hashed", host_block(sshd, "h", hashed, "HashKnownHosts yes"))
    with SSHTransport(Host("node1", "h"), ssh_config=str(cfg), accept_new_host_key=True, attempts=1):
        pass
    assert hashed.read_text().startswith("|1|") and str(sshd.port) not in hashed.read_text().split()[0]
    with SSHTransport(Host("node1", "h"), ssh_config=str(cfg), attempts=1) as t:
        assert t.run("true").ok


@pytest.mark.sshd
def test_identities_only_leaves_agent_keys_out(tmp_path, sshd, fake_home, monkeypatch):
    agent = subprocess.run(["ssh-agent", "-s"], capture_output=True, text=True, check=True).stdout
    sock = re.search(r"SSH_AUTH_SOCK=([^;]+);", agent).group(1)
    pid = int(re.search(r"SSH_AGENT_PID=(\d+);", agent).group(1))
    try:
        subprocess.run(["ssh-add", "-q", str(sshd.client_key)], env={**os.environ, "SSH_AUTH_SOCK": sock},
                       check=True, capture_output=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", sock)
        wrong = tmp_path / "wrong_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
        kh = write(tmp_path / "kh", sshd.known_hosts_line + "\n")
        block = host_block(sshd, "h", kh).replace(str(sshd.client_key), str(wrong))
        with pytest.raises(ConnectionFailed, match="authentication failed"):  # the agent's right key is not offered
            SSHTransport(Host("node1", "h"), ssh_config=str(write(tmp_path / "only", block)), attempts=1)
        relaxed = block.replace("IdentitiesOnly yes", "IdentitiesOnly no")
        with SSHTransport(Host("node1", "h"), ssh_config=str(write(tmp_path / "relaxed", relaxed)), attempts=1) as t:
            assert t.run("true").ok
    finally:
        os.kill(pid, 15)


@pytest.mark.sshd
@pytest.mark.skipif(shutil.which("ssh") is None, reason="the OpenSSH client (ssh) is not installed")
def test_proxy_command_runs_in_a_shell_with_tokens(tmp_path, sshd, sshd2, fake_home):
    kh = write(tmp_path / "kh", sshd.known_hosts_line + "\n" + sshd2.known_hosts_line + "\n")
    cfg = tmp_path / "cfg"
    write(cfg, host_block(sshd, "bastion", kh) + host_block(
        sshd2, "inner", kh, f"ProxyCommand ssh -F {cfg} -W %h:%p -l %r bastion 2>>{tmp_path}/proxy.err"))
    before = accepted(sshd)
    with SSHTransport(Host("node1", "inner"), ssh_config=str(cfg), attempts=1) as t:
        assert t.run("echo through").stdout == b"through\n"
    assert accepted(sshd) == before + 1  # the bastion carried it
    failing = write(tmp_path / "cfg.fail", host_block(
        sshd2, "inner", kh, "ProxyCommand sh -c \"echo 'no route to %h, sorry' >&2; exit 3\""))
    with pytest.raises(ConnectionFailed) as e:
        SSHTransport(Host("node1", "inner"), ssh_config=str(failing), attempts=1)
    assert "no route to 127.0.0.1, sorry" in str(e.value) and "status 3" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.sshd
def test_deployment_over_a_jump_chain_reconnects(tmp_path, sshd, sshd2, fake_home):
    """The chain is rebuilt on reconnect and closed with the deployment (no hop left open)."""
    cfg = two_hop_config(tmp_path, sshd, sshd2)
    tree = make_tree(tmp_path / "host")
    with Deployment(load_playbook(tree.playbook("target")), Store(tmp_path / "s"),
                    ConnectOptions(ssh_config=str(cfg), attempts=1)) as dep:
        first = dep.transports["node1"]
        hop2 = first._jump
        hop1 = hop2._jump if hop2 is not None else None
        assert hop1 is not None and hop1._jump is None  # target <- hop2 <- hop1
        assert (hop2.target.port, hop1.target.port) == (sshd.port, sshd2.port)
        dep.reconnect()
        assert dep.transports["node1"] is not first and dep.snapshot(save=False).hosts["node1"].repos
        assert not first.alive() and not hop2.alive() and not hop1.alive()
