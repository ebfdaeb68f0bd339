"""Issue 12 part 5: replicas given as inventory groups -- the binding of one replica playbook to
each group (pure: no network)."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from envbisect.errors import PlaybookError, UsageError
from envbisect.hosts.inventory import parse_inventory_json, replica_playbook
from envbisect.runs.fleet import load_fleet
from envbisect.state.store import Store

TEMPLATE = '''
[deployment]
name = "pd"

[hosts.prefill]
inventory = "prefill"

[hosts.decode]
inventory = "decode"

[services.prefill]
host = "prefill"
env_file = "{{ root }}/prefill.serve-env"
start = "systemctl start sglang-prefill"
stop = "systemctl stop sglang-prefill"
health = "http://127.0.0.1:{{ port }}/health"

[services.decode]
host = "decode"
env_file = "{{ root }}/decode.serve-env"
start = "systemctl start sglang-decode"
stop = "systemctl stop sglang-decode"
health = "http://127.0.0.1:{{port}}/health"

[restart]
order = ["prefill", "decode"]
'''


def inventory(**over):
    groups = {"all": {"children": ["pd_a", "pd_b", "prefill", "decode"]},
              "pd_a": {"hosts": ["a1", "a2"], "vars": {"root": "/srv/a", "port": 30000}},
              "pd_b": {"hosts": ["b1", "b2"], "vars": {"root": "/srv/b", "port": 30000}},
              "prefill": {"hosts": ["a1", "b1"]}, "decode": {"hosts": ["a2", "b2"]}}
    groups.update(over)
    hostvars = {h: {"ansible_host": f"10.0.0.{i}"} for i, h in enumerate(["a1", "a2", "b1", "b2"], 1)}
    return parse_inventory_json({"_meta": {"hostvars": hostvars}, **groups}, "inv.json")


def test_each_group_binds_its_own_hosts_values_and_deployment_name():
    doc = tomllib.loads(TEMPLATE)
    a = replica_playbook(doc, Path("replica.toml"), inventory(), "pd_a")
    b = replica_playbook(doc, Path("replica.toml"), inventory(), "pd_b")
    assert (a.name, b.name) == ("pd-pd_a", "pd-pd_b")  # its own lock and journal
    assert a.hosts["prefill"].ssh == "10.0.0.1" and a.hosts["decode"].ssh == "10.0.0.2"
    assert b.hosts["prefill"].ssh == "10.0.0.3" and b.hosts["decode"].ssh == "10.0.0.4"
    assert a.services["decode"].env_file == "/srv/a/decode.serve-env"
    assert b.services["prefill"].env_file == "/srv/b/prefill.serve-env"
    assert b.services["decode"].health == "http://127.0.0.1:30000/health"


@pytest.mark.parametrize("over, group, message", [
    ({"pd_b": {"hosts": ["b1", "b2"], "vars": {"port": 1}}}, "pd_b", "{{ root }}: not set for host b1"),
    ({"pd_b": {"hosts": ["b1", "b2"]}, "b_root": {"hosts": ["b1"], "vars": {"root": "/x", "port": 1}},
      "b_root2": {"hosts": ["b2"], "vars": {"root": "/y", "port": 1}}}, "pd_b", "differs between the hosts"),
    ({"pd_b": {"hosts": ["b1"], "vars": {"root": "/b", "port": 1}}}, "pd_b", "must hold exactly one host of 'decode'"),
    ({"pd_b": {"hosts": ["b1", "b2", "a2"], "vars": {"root": "/b", "port": 1}}}, "pd_b", "holds 2 (a2, b2)"),
    ({"pd_b": {"hosts": ["b1", "b2"], "vars": {"root": "{{ base }}/b", "port": 1}}}, "pd_b", "still a Jinja2 template"),
    ({"pd_b": {"hosts": ["b1", "b2"], "vars": {"root": ["/b"], "port": 1}}}, "pd_b", "not a string or number"),
    ({}, "pd_c", "no group 'pd_c'"),
])
def test_what_a_group_cannot_give_is_one_error_naming_it(over, group, message):
    with pytest.raises((PlaybookError, UsageError)) as e:
        replica_playbook(tomllib.loads(TEMPLATE), Path("replica.toml"), inventory(**over), group)
    assert message in str(e.value)


def test_only_plain_variables_and_only_inventory_hosts():
    doc = tomllib.loads(TEMPLATE.replace("{{ port }}", "{{ port | int }}"))
    with pytest.raises(PlaybookError, match="only {{ variable }} is understood"):
        replica_playbook(doc, Path("replica.toml"), inventory(), "pd_a")
    doc = tomllib.loads(TEMPLATE.replace('[hosts.decode]\ninventory = "decode"', '[hosts.decode]\nssh = "gpu9"'))
    with pytest.raises(PlaybookError, match="every host comes from its replica's group"):
        replica_playbook(doc, Path("replica.toml"), inventory(), "pd_a")


def _fleet_files(tmp_path: Path, inv: dict, template: str = TEMPLATE, replicas=("pd_a", "pd_b")) -> Path:
    (tmp_path / "replica.toml").write_text(template)
    (tmp_path / "inv.json").write_text(json.dumps(inv))
    f = tmp_path / "fleet.toml"
    f.write_text('[fleet]\nplaybook = "replica.toml"\ninventory = "inv.json"\nreplicas = '
                 + json.dumps(list(replicas)) + "\n")
    return f


def _inv_doc(**vars_b):
    return {"_meta": {"hostvars": {h: {"ansible_host": "10.0.0.1"} for h in ["a1", "a2", "b1", "b2"]}},
            "pd_a": {"hosts": ["a1", "a2"], "vars": {"root": "/srv/a", "port": 1}},
            "pd_b": {"hosts": ["b1", "b2"], "vars": {"root": "/srv/b", "port": 2, **vars_b}},
            "prefill": {"hosts": ["a1", "b1"]}, "decode": {"hosts": ["a2", "b2"]}}


def test_load_fleet_from_groups_and_replicas_sharing_a_machine_but_not_a_file(tmp_path):
    reps = load_fleet(_fleet_files(tmp_path, _inv_doc()), Store(tmp_path / "s"))
    assert [n for n, _ in reps] == ["pd_a", "pd_b"]
    assert reps[1][1].playbook.services["decode"].env_file == "/srv/b/decode.serve-env"
    with pytest.raises(UsageError, match="replicas pd_a and pd_b both use /srv/a/prefill.serve-env on 10.0.0.1"):
        load_fleet(_fleet_files(tmp_path, _inv_doc(root="/srv/a")), Store(tmp_path / "s"))


@pytest.mark.parametrize("fleet, message", [
    ('[fleet]\nplaybook = "replica.toml"\nreplicas = "pd_a"\n', "must be a list of inventory group names"),
    ('[fleet]\nplaybook = "replica.toml"\nreplicas = ["pd_a"]\nreplica = 1\n', "replica: unknown key"),
    ('[fleet]\nplaybook = "replica.toml"\nreplicas = ["pd_a"]\n', "needs an inventory"),
])
def test_bad_fleet_files_are_one_clear_error(tmp_path, fleet, message):
    (tmp_path / "replica.toml").write_text(TEMPLATE)
    f = tmp_path / "fleet.toml"
    f.write_text(fleet)
    with pytest.raises(UsageError, match=message):
        load_fleet(f, Store(tmp_path / "s"))
