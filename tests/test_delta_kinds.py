"""DeltaKind names every kind of delta the diff produces, over the real sshd: each delta's kind is a
member (also when read back from a record), and it is serialised as the text records always held."""
from __future__ import annotations

import json

import pytest

from envbisect.inputs.masking import SecretMasker
from envbisect.runs.deployment import ConnectOptions, Deployment
from envbisect.inputs.playbook import load_playbook
from envbisect.state.deltas import Delta, DeltaKind
from envbisect.state.store import Store

from hosttree import DECODE, make_tree

SCRIPT_OLD = "#!/bin/sh\n# start decode\nexec python -m sglang.launch_server --tp 2 --page-size 16\n"
SCRIPT_NEW = "#!/bin/sh\n# start decode\nexec python -m sglang.launch_server --tp 4 --page-size 16\n"


def every_kind_diff(tmp_path, sshd):
    """A diff with one change of each kind: an env variable, an argument-string flag, a HEAD move, a
    whole watched file, a key of a YAML file, an uncommitted hotfix, a flag of a start script."""
    tree = make_tree(tmp_path / "host", n_watched=2)
    tree.edit("decode", DECODE + 'export SGLANG_EXTRA_ARGS="--attention-backend flashinfer"\n')
    (tree.watch / "notes.txt").write_text("one\n")
    (tree.watch / "start-decode.sh").write_text(SCRIPT_OLD)
    dep = Deployment(load_playbook(tree.playbook(sshd.alias)), Store(tmp_path / "store"),
                     ConnectOptions(ssh_config=str(sshd.ssh_config), attempts=1))
    with dep:
        dep.snapshot("good")
        tree.edit("decode", DECODE.replace("PAGE_SIZE=64", "PAGE_SIZE=128")
                  + 'export SGLANG_EXTRA_ARGS="--attention-backend triton"\n')
        tree.commit("v2", "v2\n")
        (tree.repo / "VERSION").write_text("v2-hotfix\n")  # tracked, not committed
        (tree.watch / "notes.txt").write_text("two\n")
        (tree.watch / "sub" / "cfg00.yaml").write_text("setting_0: 1\n")
        (tree.watch / "start-decode.sh").write_text(SCRIPT_NEW)
        return tree, dep.diff(against="good")


def test_every_kind_produced_is_a_member_serialised_as_its_text(tmp_path, sshd):
    tree, diff = every_kind_diff(tmp_path, sshd)
    by_kind: dict[DeltaKind, list[str]] = {}
    for d in diff.deltas:
        assert type(d.kind) is DeltaKind, (d.id, type(d.kind))
        by_kind.setdefault(d.kind, []).append(d.id)
    assert set(by_kind) == set(DeltaKind), by_kind  # every member is produced, nothing outside them
    assert "decode:SGLANG_EXTRA_ARGS[--attention-backend]" in by_kind[DeltaKind.ENV]  # a flag of a variable
    assert by_kind[DeltaKind.GIT] == [f"git:node1:{tree.repo}"]
    assert f"file:node1:{tree.watch}/notes.txt" in by_kind[DeltaKind.FILE]
    assert f"file:node1:{tree.repo}/VERSION" in by_kind[DeltaKind.FILE]  # the hotfix
    assert by_kind[DeltaKind.KEY] == [f"file:node1:{tree.watch}/sub/cfg00.yaml#setting_0"]
    assert by_kind[DeltaKind.FLAG] == [f"file:node1:{tree.watch}/start-decode.sh[--tp]"]
    doc = json.loads(json.dumps(diff.to_json(SecretMasker())))
    assert {d["kind"] for d in doc["deltas"]} == {"env", "git", "file", "key", "flag"}
    # a record read back (revert, bisect --resume) holds members again, equal to what was written
    fields = set(Delta.__dataclass_fields__)
    for raw, d in zip(doc["deltas"], diff.deltas):
        back = Delta(**{k: (tuple(v) if k == "detail" else v) for k, v in raw.items() if k in fields})
        assert type(back.kind) is DeltaKind and back.kind is d.kind and str(back.kind) == raw["kind"]


@pytest.mark.parametrize("kind", list(DeltaKind))
def test_a_member_is_its_text(kind):
    assert kind == kind.value and str(kind) == kind.value and f"{kind}" == kind.value
    assert json.dumps({"kind": kind}) == json.dumps({"kind": kind.value})
    assert DeltaKind(kind.value) is kind
