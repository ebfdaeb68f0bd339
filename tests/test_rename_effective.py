"""A rename is "no change in meaning" only when the knob's effective value is provably the same on
both sides (red-team F1, F2). Real SGLang reads the new name first and the old one only when the new
one is unset, so a line that renames the old spelling can change what the engine runs with when the
new spelling is set elsewhere (a sourced file, the start environment). And a rename is judged by the
release each side runs: 0.5.18 does not read 0.5.23's new name at all. The registries are the real
releases' (tests/test_sglang_releases.py caches their files)."""
from __future__ import annotations

from envbisect.runs.plan import make_units
from envbisect.state.deltas import Diff, with_knobs
from envbisect.state.knobs import parse_sglang_files
from envbisect.state.snapshot import FileState, HostState, ProcessState, Snapshot, SourcedFile

from test_knobs import delta
from test_sglang_releases import release_files

OLD, NEW = "SGLANG_EPLB_ROCM_P2P_BATCH_CHUNK_SIZE", "SGLANG_EPLB_P2P_BATCH_CHUNK_SIZE"
SWA_OLD, SWA_NEW = "SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW", "SGLANG_OPT_RELEASE_PREFILL_SWA"
ENV, COMMON = "/srv/decode.env", "/srv/common.env"


def reg(version):
    return parse_sglang_files(release_files(version))


def host(proc=None, common=None):
    files = {COMMON: FileState(COMMON, True, content=common.encode())} if common is not None else {}
    sourced = {ENV: (SourcedFile(1, COMMON, COMMON),)} if common is not None else {}
    return HostState("gpu1", "gpu1", 0.0, None, 0, files, {}, {"decode": proc} if proc else {}, {"decode": ENV}, {},
                     sourced=sourced)


def proc(environ, file_keys, sglang=None):
    return ProcessState("decode", "ok", 1, 0.0, environ, file_eval={k: environ[k] for k in file_keys},
                        file_eval_keys=tuple(file_keys), packages={"sglang": sglang} if sglang else None)


def diff(base_host, cur_host, *deltas):
    base = Snapshot("noon", "noon", 0.0, "dep", {"gpu1": base_host})
    cur = Snapshot("now", None, 1.0, "dep", {"gpu1": cur_host})
    return Diff(None, base, cur, tuple(deltas), ())


def rename(old_key, new_key, value):
    return (delta("decode", old_key, value, None, "removed"), delta("decode", new_key, None, value, "added"))


def test_a_rename_over_the_new_name_set_in_a_sourced_file_is_a_change():
    # noon: common.env sets NEW=16 (read), the env file OLD=64 (ignored); now: the env file NEW=64
    base = proc({NEW: "16", OLD: "64"}, [OLD])
    cur = proc({NEW: "64"}, [NEW])
    d = with_knobs(diff(host(base, f"export {NEW}=16\n"), host(cur, f"export {NEW}=16\n"), *rename(OLD, NEW, "64")),
                   {"gpu1": reg("0.5.23")})
    assert {x.id for x in d.deltas} == {f"decode:{OLD}", f"decode:{NEW}"}, d.notes
    assert {x.knob for x in d.deltas} == {NEW}
    assert not any("no change in meaning" in n for n in d.notes), d.notes
    assert any(f"{OLD} became {NEW}" in n and f"{NEW} is set elsewhere at the baseline" in n for n in d.notes), d.notes


def test_the_other_spelling_in_a_sourced_file_alone_is_seen_without_a_process():
    d = with_knobs(diff(host(None, f"export {NEW}=16\n"), host(None, f"export {NEW}=16\n"), *rename(OLD, NEW, "64")),
                   {"gpu1": reg("0.5.23")})
    assert len(d.deltas) == 2 and not any("no change in meaning" in n for n in d.notes), d.notes


def test_the_old_spelling_left_in_the_start_environment_now_is_a_change():
    base = proc({OLD: "64"}, [OLD])
    cur = proc({OLD: "16", NEW: "64"}, [NEW])  # the old name now comes from the start environment
    d = with_knobs(diff(host(base), host(cur), *rename(OLD, NEW, "64")), {"gpu1": reg("0.5.23")})
    assert len(d.deltas) == 2, d.notes


def test_a_clean_rename_with_the_whole_environment_known_is_still_no_change():
    base = proc({OLD: "64", "PATH": "/usr/bin"}, [OLD])
    cur = proc({NEW: "64", "PATH": "/usr/bin"}, [NEW])
    d = with_knobs(diff(host(base, "export OTHER=1\n"), host(cur, "export OTHER=1\n"), *rename(OLD, NEW, "64")),
                   {"gpu1": reg("0.5.23")})
    assert d.deltas == () and any(f"{OLD} became {NEW}" in n and "no change in meaning" in n for n in d.notes)


def test_a_rename_across_an_upgrade_is_judged_by_the_baseline_release():
    # 0.5.18 reads only the old name: switched back to 0.5.18 with the new name, the setting is lost
    base = proc({SWA_OLD: "1"}, [SWA_OLD], sglang="0.5.18")
    cur = proc({SWA_NEW: "1"}, [SWA_NEW], sglang="0.5.23")
    pair = rename(SWA_OLD, SWA_NEW, "1")
    releases = {"0.5.18": reg("0.5.18"), "0.5.23": reg("0.5.23")}
    d = with_knobs(diff(host(base), host(cur), *pair), {"gpu1": reg("0.5.23")}, releases=releases)
    assert {x.id for x in d.deltas} == {p.id for p in pair}, d.notes
    assert any(f"{SWA_OLD} became {SWA_NEW}" in n and "sglang 0.5.18 at the baseline does not read" in n
               for n in d.notes), d.notes
    unknown = with_knobs(diff(host(base), host(cur), *pair), {"gpu1": reg("0.5.23")}, releases={})
    assert len(unknown.deltas) == 2  # the baseline's registry unknown: not provable


def test_a_rename_both_releases_read_is_no_change_across_an_upgrade():
    base = proc({OLD: "64"}, [OLD], sglang="0.5.18")
    cur = proc({NEW: "64"}, [NEW], sglang="0.5.23")
    releases = {"0.5.18": reg("0.5.18"), "0.5.23": reg("0.5.23")}
    d = with_knobs(diff(host(base), host(cur), *rename(OLD, NEW, "64")), {"gpu1": reg("0.5.23")}, releases=releases)
    assert d.deltas == () and any("no change in meaning" in n for n in d.notes), d.notes


def test_a_rename_that_stays_a_change_is_one_unit():
    base = proc({NEW: "16", OLD: "64"}, [OLD])
    cur = proc({NEW: "64"}, [NEW])
    d = with_knobs(diff(host(base, f"export {NEW}=16\n"), host(cur, f"export {NEW}=16\n"), *rename(OLD, NEW, "64"),
                        delta("decode", "NCCL_DEBUG", "WARN", "INFO")), {"gpu1": reg("0.5.23")})
    units, notes = make_units(d.deltas, (), auto_link=True)
    assert sorted(units.values()) == [("decode:NCCL_DEBUG",), (f"decode:{OLD}", f"decode:{NEW}")], units
    assert f"decode: {OLD} → {NEW}, one knob ({NEW}): tested as one linked unit" in notes
    assert len(make_units(d.deltas, (), auto_link=False)[0]) == 3


def test_a_rename_across_a_switchable_upgrade_is_tested_with_it():
    base = proc({SWA_OLD: "1"}, [SWA_OLD], sglang="0.5.18")
    cur = proc({SWA_NEW: "1"}, [SWA_NEW], sglang="0.5.23")
    switch = delta("decode", "SGLANG_SITE", "/opt/0.5.18", None, "removed")
    switch = type(switch)(**{**switch.__dict__, "id": "decode:pkg:sglang", "baseline_source": "upgrade:0.5.18"})
    releases = {"0.5.18": reg("0.5.18"), "0.5.23": reg("0.5.23")}
    d = with_knobs(diff(host(base), host(cur), *rename(SWA_OLD, SWA_NEW, "1"), switch,
                        delta("decode", "SGLANG_SM120_MMA_TARGET_CTAS", "128", "256")),
                   {"gpu1": reg("0.5.23")}, releases=releases)
    units, notes = make_units(d.deltas, (), auto_link=True)
    assert sorted(units.values()) == [("decode:SGLANG_SM120_MMA_TARGET_CTAS",),
                                      ("decode:pkg:sglang", f"decode:{SWA_OLD}", f"decode:{SWA_NEW}")], units
    assert f"decode: {SWA_NEW} renamed across the upgrade: tested with decode:pkg:sglang" in notes, notes
