"""An env file line with several assignments (``export A=1 B=2``, as bash reads it: each is set and
exported) gives one delta per key, not a whole-file delta; a trial's edits of such a line (a value
changed, a key removed or put back) touch only that key and keep every other byte."""
from __future__ import annotations

import pytest

from envbisect.inputs.envfile import EnvFileError, parse_env

from hosttree import DECODE, make_tree
from test_snapshot_diff import deltas_by_id, open_dep


def test_each_assignment_of_a_line_is_read():
    env = parse_env("export A=1 B='two words' # note\nC=3 D=$C\n")
    assert env.values() == {"A": "1", "B": "two words", "C": "3", "D": "$C"}
    assert [a.exported for a in env.assignments] == [True, True, False, False]
    assert env.resolved()["D"] == "3"


def test_a_command_after_assignments_stays_an_error():
    with pytest.raises(EnvFileError):
        parse_env("A=1 B=2 python serve.py\n")


def test_edits_of_a_shared_line_touch_only_their_key():
    text = "# decode\nexport A=1 B=2 C=3  # three\nD=4\n"
    env = parse_env(text)
    assert env.with_value("B", "9") == "# decode\nexport A=1 B=9 C=3  # three\nD=4\n"
    assert env.without("A") == "# decode\nexport B=2 C=3  # three\nD=4\n"
    assert env.without("B") == "# decode\nexport A=1 C=3  # three\nD=4\n"
    assert env.without("C") == "# decode\nexport A=1 B=2  # three\nD=4\n"
    ref = parse_env(text)
    put_back = parse_env(env.without("B")).with_lines_of("B", ref)
    assert parse_env(put_back).values() == ref.values()
    assert [a.exported for a in parse_env(put_back).assignments if a.key == "B"] == [True]


def test_a_shared_line_is_one_delta_per_key_over_sshd(tmp_path, sshd):
    tree = make_tree(tmp_path / "host")
    tree.edit("decode", DECODE + "export SGLANG_A=1 SGLANG_B=2\n")
    with open_dep(tree, (sshd.alias, str(sshd.ssh_config)), tmp_path / "store") as dep:
        dep.snapshot("noon")
        tree.edit("decode", DECODE + "export SGLANG_A=1 SGLANG_B=3 SGLANG_C=4\n")
        diff = dep.diff(against="noon")
    got = deltas_by_id(diff)
    assert set(got) == {"decode:SGLANG_B", "decode:SGLANG_C"}, (sorted(got), diff.notes)
    assert (got["decode:SGLANG_B"].old, got["decode:SGLANG_B"].new) == ("2", "3")
    assert got["decode:SGLANG_C"].change == "added"
    assert not any("whole file" in n for n in diff.notes)
