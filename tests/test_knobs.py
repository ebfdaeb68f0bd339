"""The installed engine's knob registry without hosts (issue 24, part 4): what the diff does with it
(state/deltas.with_knobs): aliases and a variable with its replacing flag as one knob, linked across
services; a name the engine does not read marked; a removed knob shown with its default. The registry
is the real sglang 0.5.8's (its files cached by scripts/sglang_wheels.py; every release's reading is
tests/test_sglang_releases.py). Nothing here imports sglang: the files are parsed as text."""
from __future__ import annotations

import pytest

from envbisect.runs.bisect import make_units
from envbisect.state.deltas import Delta, Diff, with_knobs
from envbisect.state.knobs import KnobRegistry, UnknownLayout, parse_sglang, parse_sglang_files, parse_version
from envbisect.state.snapshot import Snapshot

from test_sglang_releases import release_files


def registry():
    return parse_sglang_files(release_files("0.5.8"))


def test_registry_interface():
    reg: KnobRegistry = registry()
    k = reg.knob("SGL_TEST_RETRACT")
    assert k is not None and k == reg.knob("SGLANG_TEST_RETRACT") and k.name == "SGLANG_TEST_RETRACT"
    assert set(reg.aliases(k)) == {"SGLANG_TEST_RETRACT", "SGL_TEST_RETRACT"}
    assert reg.knob("SGLANG_GC_LOG").name == "SGLANG_LOG_GC"  # _print_deprecated_env(new_name, old_name)
    fp8 = reg.knob("SGLANG_ENABLE_FLASHINFER_FP8_GEMM")
    assert fp8 is not None and fp8 == reg.flag("--fp8-gemm-backend") and reg.default(fp8) == "auto"
    assert "SGLANG_ENABLE_FLASHINFER_FP8_GEMM" in reg.aliases(fp8)
    assert reg.flag("--tp") is None and reg.flag("--tp-size") == reg.flag("--tensor-parallel-size")
    assert reg.default(reg.flag("--tp-size")) == "1"
    assert reg.knob("SGLANG_TYPO_X") is None and reg.owns("SGLANG_TYPO_X") and not reg.owns("HF_HOME")


@pytest.mark.parametrize("environ, server_args, why", [
    ("X = 1\n", "class ServerArgs:\n    a: int = 1\n", "no Envs class"),
    ("class Envs:\n    A = EnvInt(1)\n", "def f(:\n", "does not parse"),
    ("class Envs:\n    A = EnvInt(1)\n", "x = 1\n", "no ServerArgs"),
])
def test_an_unknown_layout_is_refused_with_why(environ, server_args, why):
    with pytest.raises(UnknownLayout, match=why):
        parse_sglang("0.5.3", environ, server_args)


def test_version_from_version_files():
    assert parse_version('__version__ = "0.5.3"\n') == "0.5.3"
    assert parse_version("__version__: str\n__version__ = version = '0.5.23'\n", "try:\n    pass\nexcept Exception:\n"
                         "    pass\n") == "0.5.23"
    assert parse_version("from sglang.version import __version__\n", '__version__ = "0.4.9.post2"\n') == "0.4.9.post2"
    assert parse_version("", "") is None


def delta(service, key, old, new, change="changed", host="gpu1", **kw):
    return Delta(f"{service}:{key}" + (f"[{kw['flag']}]" if "flag" in kw else ""), "env", host, service,
                 f"/srv/{service}.env", key, change, old, new, "snapshot:s1", **kw)


def diff_of(*deltas):
    return Diff(None, None, Snapshot("cur", None, 0.0, "dep", {}), tuple(deltas), ())


def test_alias_pair_across_services_is_one_linked_unit():
    d = with_knobs(diff_of(delta("prefill", "SGL_TEST_RETRACT", None, "1", "added"),
                           delta("decode", "SGLANG_TEST_RETRACT", None, "1", "added"),
                           delta("decode", "SGLANG_OTHER", "a", "b")), {"gpu1": registry()})
    assert d.links() == [["prefill:SGL_TEST_RETRACT", "decode:SGLANG_TEST_RETRACT"]]
    units, notes = make_units(d.deltas, (), auto_link=True)
    assert units["linked:SGLANG_TEST_RETRACT"] == ("prefill:SGL_TEST_RETRACT", "decode:SGLANG_TEST_RETRACT")
    assert "prefill:SGL_TEST_RETRACT" not in units and "decode:SGLANG_TEST_RETRACT" not in units
    assert any("SGLANG_TEST_RETRACT changed the same way in decode, prefill" in n for n in notes), notes
    # without a registry (today): not linked, each side its own unit
    today = with_knobs(diff_of(delta("prefill", "SGL_TEST_RETRACT", None, "1", "added"),
                               delta("decode", "SGLANG_TEST_RETRACT", None, "1", "added")), {"gpu1": None})
    units, _ = make_units(today.deltas, (), auto_link=True)
    assert set(units) == {"prefill:SGL_TEST_RETRACT", "decode:SGLANG_TEST_RETRACT"}


def test_settings_that_must_match_are_linked_by_meaning():
    # --tp-size in prefill's PREFILL_ARGS and --tensor-parallel-size in decode's DECODE_ARGS: one knob
    p = delta("prefill", "PREFILL_ARGS", "--tp-size 2", "--tp-size 4", flag="--tp-size",
              args_old="--tp-size 2", args_new="--tp-size 4")
    q = delta("decode", "DECODE_ARGS", "--tensor-parallel-size 2", "--tensor-parallel-size=4",
              flag="--tensor-parallel-size", args_old="--tensor-parallel-size 2", args_new="--tensor-parallel-size=4")
    # a variable that gave way to a flag, and that flag as a bare value
    e = delta("prefill", "SGLANG_ENABLE_FLASHINFER_FP8_GEMM", None, "flashinfer_trtllm", "added")
    f = delta("decode", "DECODE_ARGS", None, "--fp8-gemm-backend flashinfer_trtllm", "added",
              flag="--fp8-gemm-backend", args_old="", args_new="--fp8-gemm-backend flashinfer_trtllm")
    d = with_knobs(diff_of(p, q, e, f), {"gpu1": registry()})
    assert sorted(map(sorted, d.links())) == sorted([sorted([p.id, q.id]), sorted([e.id, f.id])])
    units, _ = make_units(d.deltas, (), auto_link=True)
    assert units["linked:flag:tp_size"] == (p.id, q.id)
    assert units["linked:flag:fp8_gemm_runner_backend"] == (e.id, f.id)  # the flag's dest in 0.5.8


def test_a_different_new_value_is_not_linked():
    d = with_knobs(diff_of(delta("prefill", "SGL_TEST_RETRACT", None, "1", "added"),
                           delta("decode", "SGLANG_TEST_RETRACT", None, "0", "added")), {"gpu1": registry()})
    assert d.links() == []


def test_not_read_by_the_installed_version_and_default_when_removed():
    d = with_knobs(diff_of(delta("decode", "SGLANG_TYPO_X", None, "1", "added"),
                           delta("decode", "HF_HOME", "/a", "/b"),
                           delta("decode", "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "600", None, "removed"),
                           delta("decode", "DECODE_ARGS", "--tp-size 2", None, "removed", flag="--tp-size",
                                 args_old="--tp-size 2", args_new="")), {"gpu1": registry()})
    by = {x.key if x.flag is None else x.flag: x for x in d.deltas}
    assert by["SGLANG_TYPO_X"].detail == ("SGLANG_TYPO_X is not read by the installed sglang 0.5.8: typo or stale?",)
    assert by["HF_HOME"].detail == () and by["HF_HOME"].knob is None
    assert by["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"].detail == ("removed: back to the default 300",)
    assert by["--tp-size"].detail == ("removed: back to the default 1",)


def test_no_registry_keeps_todays_behaviour_with_the_note():
    base = diff_of(delta("decode", "SGLANG_TYPO_X", None, "1", "added"))
    d = with_knobs(base, {"gpu1": None}, ["gpu1: the installed engine's knobs could not be read (x)"])
    assert d.deltas == base.deltas and d.notes == ("gpu1: the installed engine's knobs could not be read (x)",)
