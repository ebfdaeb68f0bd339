"""A knob renamed in place with the same value (issue 37): an env var's old name at noon and its new
name now, or a flag's one spelling then and another now, is one knob with no change in meaning. Both
deltas leave the diff (no trial can tell them apart, so none is spent on them) and a note says so; a
different value, or a different place, stays a change. The registry is the real sglang 0.5.8's;
tests/test_knobs_sim.py shows the same over the real sshd with a real release's files."""
from __future__ import annotations

from envbisect.state.delta_flags import split_flags
from envbisect.state.deltas import with_knobs

from test_knob_links import script_flags
from test_knobs import delta, diff_of, registry


def test_an_env_alias_renamed_with_the_same_value_is_no_change():
    old = delta("decode", "SGLANG_GC_LOG", "1", None, "removed")
    new = delta("decode", "SGLANG_LOG_GC", None, "true", "added")  # 1 and true: the same boolean
    other = delta("decode", "SGLANG_TEST_RETRACT", None, "1", "added")
    d = with_knobs(diff_of(old, new, other), {"gpu1": registry()})
    assert [x.id for x in d.deltas] == [other.id]
    assert ("decode: SGLANG_GC_LOG became SGLANG_LOG_GC in /srv/decode.env, the same knob (SGLANG_LOG_GC) with "
            "the same value true: no change in meaning, not tested (decode:SGLANG_GC_LOG + decode:SGLANG_LOG_GC)"
            ) in d.notes, d.notes


def test_a_rename_with_another_value_or_elsewhere_stays_a_change():
    old = delta("decode", "SGLANG_GC_LOG", "1", None, "removed")
    new = delta("decode", "SGLANG_LOG_GC", None, "0", "added")
    d = with_knobs(diff_of(old, new), {"gpu1": registry()})
    assert {x.id for x in d.deltas} == {old.id, new.id} and not any("no change in meaning" in n for n in d.notes)
    elsewhere = delta("prefill", "SGLANG_LOG_GC", None, "1", "added")
    d = with_knobs(diff_of(old, elsewhere), {"gpu1": registry()})
    assert {x.id for x in d.deltas} == {old.id, elsewhere.id}
    assert {x.id for x in with_knobs(diff_of(old, delta("decode", "SGLANG_LOG_GC", None, "1", "added")),
                                     {"gpu1": None}).deltas} == {old.id, "decode:SGLANG_LOG_GC"}  # no registry


def test_a_flag_alias_renamed_in_an_argument_string_is_no_change():
    whole = delta("decode", "DECODE_ARGS", "--tp-size 2 --page-size 16", "--tensor-parallel-size=2 --page-size 32")
    split = split_flags(diff_of(whole))
    assert {x.flag for x in split.deltas} == {"--tp-size", "--tensor-parallel-size", "--page-size"}
    d = with_knobs(split, {"gpu1": registry()})
    assert [x.flag for x in d.deltas] == ["--page-size"]
    assert any("--tp-size became --tensor-parallel-size" in n and "(flag:tp_size) with the same value 2" in n
               for n in d.notes), d.notes


def test_a_flag_alias_renamed_on_a_start_line_is_no_change():
    deltas = script_flags("decode", "python -m sglang.launch_server --tp-size 2",
                          "python -m sglang.launch_server --tensor-parallel-size 2")
    d = with_knobs(diff_of(*deltas), {"gpu1": registry()})
    assert d.deltas == () and any("no change in meaning" in n for n in d.notes), d.notes
    changed = script_flags("decode", "python -m sglang.launch_server --tp-size 2",
                           "python -m sglang.launch_server --tensor-parallel-size 4")
    assert len(with_knobs(diff_of(*changed), {"gpu1": registry()}).deltas) == 2
