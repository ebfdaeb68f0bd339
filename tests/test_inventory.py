"""Hosts from an Ansible inventory (envbisect/inventory.py): the JSON of `ansible-inventory --list`
mapped like pytest-testinfra maps it, groups, templates, and snapshots of inventory hosts over a
real sshd (JSON file, stdin, [inventory] file, a ProxyJump from ansible_ssh_common_args, and an INI
inventory through ansible-inventory when it is installed)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envbisect.hosts import inventory as inv_mod
from envbisect.runs.deployment import ConnectOptions, Deployment
from envbisect.errors import PlaybookError, UsageError
from envbisect.hosts.inventory import bind_inventory, load_inventory, parse_inventory_json
from envbisect.inputs.playbook import load_playbook
from envbisect.state.store import Store
from envbisect.hosts.transport import resolve_target

from hosttree import DECODE, PREFILL, make_tree

ENVBISECT = [sys.executable, "-m", "envbisect.cli.app"]
ANSIBLE_VARS = ("ANSIBLE_REMOTE_USER", "ANSIBLE_REMOTE_PORT", "ANSIBLE_PRIVATE_KEY_FILE", "ANSIBLE_SSH_ARGS",
                "ANSIBLE_SSH_COMMON_ARGS", "ANSIBLE_SSH_EXTRA_ARGS", "ANSIBLE_PYTHON_INTERPRETER", "ANSIBLE_TRANSPORT")


@pytest.fixture(autouse=True)
def clean_ansible_env(tmp_path, monkeypatch):
    """No ANSIBLE_* of the machine running the tests, an empty ansible.cfg, an empty ~/.ssh and no agent."""
    for v in ANSIBLE_VARS:
        monkeypatch.delenv(v, raising=False)
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("")
    monkeypatch.setenv("ANSIBLE_CONFIG", str(cfg))
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return cfg


def doc(hostvars: dict, groups: dict | None = None) -> dict:
    """An `ansible-inventory --list` document."""
    groups = groups if groups is not None else {"ungrouped": {"hosts": sorted(hostvars)}}
    return {"_meta": {"hostvars": hostvars}, "all": {"children": sorted(groups)}, **groups}


def write_json(path: Path, d: dict) -> Path:
    path.write_text(json.dumps(d, indent=2))
    return path


def empty_ssh_config(tmp_path: Path) -> Path:
    p = tmp_path / "ssh_config.empty"
    p.write_text("# nothing\n")
    return p


# --- mapping ----------------------------------------------------------------------------------

def test_hostvars_map_to_ssh_like_testinfra(tmp_path):
    inv = parse_inventory_json(doc({"gpu1": {
        "ansible_host": "10.0.0.5", "ansible_port": 2222, "ansible_user": "ops",
        "ansible_ssh_private_key_file": "~/.ssh/fleet key", "unrelated": "{{ not used, not checked }}"}}), "inv")
    c = inv.connection("gpu1")
    assert c.ssh == "10.0.0.5"
    assert c.options == (("Port", "2222"), ("IdentityFile", f'"{os.environ["HOME"]}/.ssh/fleet key"'), ("User", "ops"))
    t = resolve_target(c.ssh, empty_ssh_config(tmp_path), c.options)
    assert (t.hostname, t.port, t.user) == ("10.0.0.5", 2222, "ops")
    assert t.identity_files == (f"{os.environ['HOME']}/.ssh/fleet key",)


@pytest.mark.parametrize("hostvars,want", [
    ({"ansible_private_key_file": "/k/a"}, "/k/a"),
    ({"ansible_private_key_file": "/k/a", "ansible_ssh_private_key_file": "/k/b"}, "/k/b"),  # as testinfra
    ({"ansible_host": "x", "ansible_ssh_host": "y"}, None),
])
def test_spellings_the_ansible_ssh_one_wins(tmp_path, hostvars, want):
    c = parse_inventory_json(doc({"h": hostvars}), "inv").connection("h")
    if want:
        assert ("IdentityFile", want) in c.options
    else:
        assert c.ssh == "y"


@pytest.mark.parametrize("args,hops,command", [
    ("-J bastion", ["bastion"], None),
    ("-o ProxyJump=ops@jump1:2200,jump2", ["jump1", "jump2"], None),
    ("-o 'ProxyJump jump1'", ["jump1"], None),
    ('-o ProxyCommand="ssh -W %h:%p -q bastion"', [], "ssh -W 10.0.0.5:22 -q bastion"),
    ("-C -o ControlMaster=auto -o ControlPersist=60s", [], None),
])
def test_ssh_common_args_proxyjump_and_proxycommand(tmp_path, args, hops, command):
    inv = parse_inventory_json(doc({"gpu1": {"ansible_host": "10.0.0.5", "ansible_ssh_common_args": args}}), "inv")
    c = inv.connection("gpu1")
    t = resolve_target(c.ssh, empty_ssh_config(tmp_path), c.options)
    assert [j.host for j in t.proxy_jump] == hops
    assert t.proxy_command == command


def test_the_ssh_config_still_applies_below_the_inventory(tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host 10.0.0.*\n    User from-config\n    Port 2022\n    ProxyJump bastion\n"
                   "    UserKnownHostsFile /kh/fleet\nHost bastion\n    HostName 192.0.2.1\n")
    inv = parse_inventory_json(doc({"gpu1": {"ansible_host": "10.0.0.5", "ansible_user": "ops"}}), "inv")
    c = inv.connection("gpu1")
    t = resolve_target(c.ssh, cfg, c.options)
    assert (t.user, t.port, [j.host for j in t.proxy_jump], t.known_hosts_files) == ("ops", 2022, ["bastion"],
                                                                                     ("/kh/fleet",))
    # extra args come after common args: the first value wins, as on ssh's command line
    inv = parse_inventory_json(doc({"gpu1": {"ansible_ssh_common_args": "-o Port=1", "ansible_ssh_extra_args": "-p 2",
                                             "ansible_port": 3}}), "inv")
    assert resolve_target("gpu1", cfg, inv.connection("gpu1").options).port == 3


def test_environment_and_ansible_cfg_are_the_fallbacks(tmp_path, monkeypatch, clean_ansible_env):
    clean_ansible_env.write_text("[defaults]\nremote_user = from-cfg\nremote_port = 2200\n"
                                 "[ssh_connection]\nssh_common_args = -J cfg-bastion\n")
    inv = parse_inventory_json(doc({"a": {}, "b": {"ansible_user": "from-vars"}}), "inv")
    assert dict(inv.connection("a").options)["User"] == "from-cfg"
    assert dict(inv.connection("a").options)["Port"] == "2200"
    assert ("proxyjump", "cfg-bastion") in inv.connection("a").options
    monkeypatch.setenv("ANSIBLE_REMOTE_USER", "from-env")
    assert dict(inv.connection("a").options)["User"] == "from-env"
    assert dict(inv.connection("b").options)["User"] == "from-vars"  # host vars beat both, as in Ansible


def test_group_vars_of_an_export_document_merge_like_ansible():
    """`ansible-inventory --list --export` (or a dynamic inventory script) keeps group vars in the groups."""
    d = {
        "_meta": {"hostvars": {"g1": {"ansible_user": "host-level"}, "g2": {}}},
        "all": {"children": ["gpu"], "vars": {"ansible_port": 1, "ansible_user": "all-level"}},
        "gpu": {"children": ["decode"], "vars": {"ansible_port": 2}},
        "decode": {"hosts": ["g1", "g2"], "vars": {"ansible_port": 3, "ansible_host": "10.9.9.9"}},
    }
    inv = parse_inventory_json(d, "inv")
    assert dict(inv.connection("g1").options) == {"Port": "3", "User": "host-level"}
    assert dict(inv.connection("g2").options) == {"Port": "3", "User": "all-level"}
    assert inv.connection("g2").ssh == "10.9.9.9"


def test_connection_types():
    inv = parse_inventory_json(doc({"l": {"ansible_connection": "local"}, "p": {"ansible_connection": "paramiko"},
                                    "d": {"ansible_connection": "community.docker.docker"}}), "inv")
    assert inv.connection("l").ssh == "local"
    assert inv.connection("p").ssh == "p"
    with pytest.raises(UsageError, match="ansible_connection = 'community.docker.docker' is not supported"):
        inv.connection("d")


@pytest.mark.parametrize("var", ["ansible_host", "ansible_user", "ansible_port", "ansible_ssh_common_args",
                                 "ansible_ssh_private_key_file", "ansible_python_interpreter"])
def test_a_template_still_in_a_value_is_an_error_naming_the_variable(var):
    inv = parse_inventory_json(doc({"gpu1": {var: "{{ hostvars['bastion'].ip }}"}}), "fleet.json")
    with pytest.raises(UsageError) as e:
        inv.connection("gpu1")
    assert f"fleet.json: host gpu1: {var} = " in str(e.value) and "Jinja2 template" in str(e.value)


def test_bad_documents_are_one_clear_error(tmp_path):
    for text, needle in [("[1, 2]", "not an ansible-inventory --list document"),
                         ('{"_meta": {"hostvars": []}}', "_meta.hostvars must map"),
                         ('{"gpu": {"hosts": "g1"}}', "group 'gpu': hosts must be a list")]:
        p = tmp_path / "bad.json"
        p.write_text(text)
        with pytest.raises(UsageError, match=needle):
            load_inventory(p)
    with pytest.raises(UsageError, match="no such inventory"):
        load_inventory(tmp_path / "nope.json")


def test_an_ini_inventory_without_ansible_inventory_says_what_to_do(tmp_path, monkeypatch):
    ini = tmp_path / "hosts.ini"
    ini.write_text("[gpu]\ngpu1 ansible_host=10.0.0.5\n")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(UsageError) as e:
        load_inventory(ini)
    assert "ansible-inventory is not on PATH" in str(e.value) and "pip install ansible-core" in str(e.value)
    assert f"ansible-inventory -i {ini} --list > inventory.json" in str(e.value)


# --- binding playbook hosts -------------------------------------------------------------------

def inventory_playbook(tree, target: str | None = "prefill", *, extra: str = "", python: bool = True) -> Path:
    """The host tree's playbook with its one host taken from the inventory (`inventory = TARGET`, or no ssh)."""
    pb = tree.playbook("PLACEHOLDER", extra=extra)
    line = f'inventory = "{target}"' if target else ""
    text = pb.read_text().replace('ssh = "PLACEHOLDER"', line)
    if not python:
        text = "\n".join(ln for ln in text.splitlines() if not ln.startswith("python = "))
    pb.write_text(text)
    return pb


FLEET = doc({"gpu-a": {"ansible_host": "10.0.0.1"}, "gpu-b": {"ansible_host": "10.0.0.2"},
             "node1": {"ansible_host": "10.0.0.9", "ansible_python_interpreter": "/opt/py/bin/python3"}},
            {"prefill": {"hosts": ["gpu-a"]}, "decode": {"children": ["decode_a", "decode_b"]},
             "decode_a": {"hosts": ["gpu-b"]}, "decode_b": {"hosts": ["gpu-a"]}, "empty": {"hosts": []},
             "ungrouped": {"hosts": ["node1"]}})


def test_a_group_with_one_host_binds_and_a_bigger_group_is_an_error(tmp_path):
    tree = make_tree(tmp_path / "host")
    inv = write_json(tmp_path / "fleet.json", FLEET)
    pb = bind_inventory(load_playbook(inventory_playbook(tree, "prefill")), str(inv))
    assert (pb.hosts["node1"].ssh, pb.hosts["node1"].inventory) == ("10.0.0.1", "prefill")
    with pytest.raises(PlaybookError) as e:
        bind_inventory(load_playbook(inventory_playbook(tree, "decode")), str(inv))
    assert "hosts.node1.inventory: group 'decode' of" in str(e.value) and "has 2 hosts (gpu-a, gpu-b)" in str(e.value)
    with pytest.raises(PlaybookError, match="'gpu-z' is no host or group of .* \\(it has: decode, decode_a"):
        bind_inventory(load_playbook(inventory_playbook(tree, "gpu-z")), str(inv))
    with pytest.raises(PlaybookError, match="group 'empty' of .* has no hosts"):
        bind_inventory(load_playbook(inventory_playbook(tree, "empty")), str(inv))


def test_a_host_without_ssh_is_looked_up_by_its_name_and_takes_the_inventory_python(tmp_path):
    tree = make_tree(tmp_path / "host")
    inv = write_json(tmp_path / "fleet.json", FLEET)
    pb = bind_inventory(load_playbook(inventory_playbook(tree, None, python=False)), str(inv))
    assert (pb.hosts["node1"].ssh, pb.hosts["node1"].python) == ("10.0.0.9", "/opt/py/bin/python3")
    pb = bind_inventory(load_playbook(inventory_playbook(tree, None)), str(inv))
    assert pb.hosts["node1"].python == sys.executable  # the playbook's python wins
    with pytest.raises(PlaybookError, match="hosts.node1: has no ssh, and there is no inventory"):
        bind_inventory(load_playbook(inventory_playbook(tree, None)), None)


def test_ssh_and_inventory_together_is_an_error(tmp_path):
    pb = tmp_path / "pb.toml"
    pb.write_text('[hosts.a]\nssh = "x"\ninventory = "y"\n')
    with pytest.raises(PlaybookError, match="hosts.a: give ssh or inventory, not both"):
        load_playbook(pb)


# --- end to end over a real sshd --------------------------------------------------------------

def sshd_hostvars(server, known_hosts: Path, *common: str) -> dict:
    return {"ansible_host": "127.0.0.1", "ansible_port": server.port, "ansible_user": server.user,
            "ansible_ssh_private_key_file": str(server.client_key),
            "ansible_ssh_common_args": " ".join([f"-o UserKnownHostsFile={known_hosts}", "-o IdentitiesOnly=yes",
                                                 "-o GlobalKnownHostsFile=/dev/null", *common])}


def run_cli(*args, **kw):
    return subprocess.run([*ENVBISECT, *args], capture_output=True, text=True, timeout=120, **kw)


@pytest.mark.sshd
def test_snapshot_of_a_host_from_an_inventory_json_file(tmp_path, sshd):
    kh = tmp_path / "kh"
    kh.write_text(sshd.known_hosts_line + "\n")
    inv = write_json(tmp_path / "inventory.json", doc({"gpu-a": sshd_hostvars(sshd, kh)}, {"prefill": {"hosts": ["gpu-a"]}}))
    tree = make_tree(tmp_path / "host")
    pb = inventory_playbook(tree, "prefill")
    # no --ssh-config: ~/.ssh/config is absent (fake home) and /etc/ssh/ssh_config changes nothing here
    r = run_cli("-p", str(pb), "--store", str(tmp_path / "s"), "--inventory", str(inv), "snapshot", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    snap = Store(tmp_path / "s").find(out["id"])
    assert snap.hosts["node1"].files[str(tree.env("decode"))].content == DECODE.encode()
    assert out["hosts"]["node1"]["round_trips"] == 1
    # the same from stdin, and from the playbook's [inventory] file (relative to the playbook)
    r = run_cli("-p", str(pb), "--store", str(tmp_path / "s"), "--inventory", "-", "snapshot", "--json",
                input=inv.read_text())
    assert r.returncode == 0, r.stderr
    shutil.copy(inv, tree.root / "fleet.json")
    pb2 = inventory_playbook(tree, "gpu-a", extra='\n[inventory]\nfile = "fleet.json"\n')
    with Deployment(load_playbook(pb2), Store(tmp_path / "s2"), ConnectOptions(attempts=1)) as dep:
        assert dep.snapshot().hosts["node1"].files[str(tree.env("prefill"))].content == PREFILL.encode()


@pytest.mark.sshd
def test_inventory_host_behind_a_jump_host_from_ssh_common_args(tmp_path, sshd, sshd2):
    """ansible_ssh_common_args='-J hop' with the hop in the ssh config: sshd2 carries the connection to sshd."""
    kh = tmp_path / "kh"
    kh.write_text(sshd.known_hosts_line + "\n" + sshd2.known_hosts_line + "\n")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(sshd2.config_block("hop").replace(str(sshd2.known_hosts), str(kh)))
    inv = write_json(tmp_path / "inventory.json", doc({"gpu-a": sshd_hostvars(sshd, kh, "-J hop")}))
    tree = make_tree(tmp_path / "host")
    before = sshd2.log.read_text(errors="replace").count("Accepted publickey")
    r = run_cli("-p", str(inventory_playbook(tree, "gpu-a")), "--store", str(tmp_path / "s"), "--inventory", str(inv),
                "--ssh-config", str(cfg), "snapshot")
    assert r.returncode == 0, r.stderr
    assert sshd2.log.read_text(errors="replace").count("Accepted publickey") == before + 1


def test_inventory_errors_through_the_cli_are_one_line(tmp_path):
    tree = make_tree(tmp_path / "host")
    inv = write_json(tmp_path / "inventory.json", doc({"gpu-a": {"ansible_host": "{{ groups['x'][0] }}"}}))
    r = run_cli("-p", str(inventory_playbook(tree, "gpu-a")), "--store", str(tmp_path / "s"), "--inventory", str(inv),
                "snapshot")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "host gpu-a: ansible_host = " in r.stderr
    r = run_cli("-p", str(inventory_playbook(tree, "gpu-a")), "--store", str(tmp_path / "s"), "snapshot")
    assert r.returncode == 2 and "has no ssh, and there is no inventory" in r.stderr
    r = run_cli("-p", str(inventory_playbook(tree, "gpu-a")), "--store", str(tmp_path / "s"), "--inventory", "-",
                "snapshot", input="[gpu]\ngpu-a\n")
    assert r.returncode == 2 and "stdin is not JSON" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def _ansible_inventory() -> str | None:
    found = shutil.which("ansible-inventory")
    beside = Path(sys.executable).parent / "ansible-inventory"
    return found or (str(beside) if beside.exists() else None)


@pytest.mark.sshd
# scripts/test.sh installs ansible-core (the `test` extra) and sets ENVBISECT_REQUIRE_SSHD: there a
# missing ansible-inventory is a failure, not a skip; a bare `pytest` elsewhere may skip it
@pytest.mark.skipif(_ansible_inventory() is None and not os.environ.get("ENVBISECT_REQUIRE_SSHD"),
                    reason="ansible-inventory (ansible-core) is not installed")
def test_ini_inventory_through_ansible_inventory(tmp_path, sshd):
    assert _ansible_inventory(), "ansible-inventory is missing: pip install -e '.[test]' installs ansible-core"
    kh = tmp_path / "kh"
    kh.write_text(sshd.known_hosts_line + "\n")
    ini = tmp_path / "hosts.ini"
    ini.write_text(f"""\
[prefill]
gpu-a ansible_host=127.0.0.1 ansible_port={sshd.port}

[gpu:children]
prefill

[gpu:vars]
ansible_user={sshd.user}
ansible_ssh_private_key_file={sshd.client_key}
ansible_ssh_common_args='-o UserKnownHostsFile={kh} -o IdentitiesOnly=yes'
""")
    env = {**os.environ, "PATH": str(Path(_ansible_inventory()).parent) + os.pathsep + os.environ.get("PATH", "")}
    tree = make_tree(tmp_path / "host")
    r = run_cli("-p", str(inventory_playbook(tree, "gpu")), "--store", str(tmp_path / "s"), "--inventory", str(ini),
                "snapshot", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["hosts"]["node1"]["files"] > 0
    # an inventory ansible-inventory cannot parse is an error, not an empty inventory
    bad = tmp_path / "bad.ini"
    bad.write_text("[gpu\ngpu-a ansible_host\n")
    r = run_cli("-p", str(inventory_playbook(tree, "gpu")), "--store", str(tmp_path / "s"), "--inventory", str(bad),
                "snapshot", env=env)
    assert r.returncode == 2 and "ansible-inventory could not read it" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_stdin_is_read_once(monkeypatch):
    import io

    monkeypatch.setattr(inv_mod, "_stdin_cache", {})
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(doc({"h": {"ansible_host": "10.1.1.1"}}))))
    assert load_inventory("-").connection("h").ssh == "10.1.1.1"
    assert load_inventory("-").connection("h").ssh == "10.1.1.1"  # a second Deployment sees the same
