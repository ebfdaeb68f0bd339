"""Reading the installed engine's registry on a host (hosts/engine.read_sglang) through a real local
transport and python: found on the services' PYTHONPATH, parsed, kept in the store per version (a known
version's files are not sent again); an unknown layout or no package is a note, never an error."""
from __future__ import annotations

import json

from envbisect.hosts.engine import READER, read_sglang
from envbisect.hosts.transport import LocalTransport
from envbisect.sim.installed import VERSION, write_installed_sglang

from test_sglang_releases import release_files


def test_found_parsed_and_cached_per_version(tmp_path):
    release_files(VERSION)
    site = write_installed_sglang(tmp_path / "dep")  # the simulated deployment's: a real release's files
    store = tmp_path / "store"
    t = LocalTransport("node1")
    reg, note = read_sglang(t, "node1", [str(site)], store)
    assert note is None and reg is not None and reg.version == VERSION
    assert reg.knob("SGL_TEST_RETRACT").name == "SGLANG_TEST_RETRACT"
    assert json.loads((store / "knobs" / f"sglang-{VERSION}.json").read_text())["registry"]["version"] == VERSION
    # the same version again: the files are not sent (even if they became unreadable), the cache answers
    (site / "sglang" / "srt" / "environ.py").write_text("garbage(\n")
    again, note = read_sglang(t, "node1", [str(site)], store)
    assert note is None and again == reg


def test_unknown_layout_and_no_package_are_notes(tmp_path):
    release_files(VERSION)
    site = write_installed_sglang(tmp_path / "dep")
    (site / "sglang" / "srt" / "environ.py").write_text("X = 1\n")
    reg, note = read_sglang(LocalTransport("node1"), "node1", [str(site)], tmp_path / "store")
    assert reg is None and "an unknown layout (environ.py has no Envs class" in note, note
    assert "today's behaviour" in note
    reg, note = read_sglang(LocalTransport("node1"), "node1", [str(tmp_path / "nothing")], tmp_path / "store")
    assert reg is None and "no sglang package found" in note, note


def test_real_releases_read_on_the_host_and_kept_per_reader(tmp_path):
    """The files of real releases (the newest, whose flags live in arg_groups/fields/*.py, and 0.4.10,
    which has no environ.py) found on a PYTHONPATH and read by the host-side script; a registry kept
    by an older reader is read again, not trusted."""
    from envbisect.sim import sglang_release as rel

    store = tmp_path / "store"
    for version in ("0.5.23", "0.4.10"):
        release_files(version)
        site = rel.install(version, tmp_path / version / "site-packages")
        reg, note = read_sglang(LocalTransport("node1"), "node1", [str(site)], store)
        assert reg is not None and reg.version == version
        assert reg.flag("--tp-size") == reg.flag("--tensor-parallel-size") is not None
        if version == "0.5.23":
            assert note is None and len(reg.flags) > 500 and reg.knob("SGL_LOG_GC").name == "SGLANG_LOG_GC"
        else:
            assert note == ("node1: sglang 0.4.10 has no srt/environ.py: it reads its SGLANG_*/SGL_* variables ad "
                            "hoc, so they are linked by their names only, without defaults; its flags are read")
    kept = store / "knobs" / "sglang-0.5.23.json"
    kept.write_text(json.dumps({"version": "0.5.23", "envs": {}, "renamed": {}, "env_to_flag": {},
                                "flags": {}, "fields": {}}))  # the shape an older reader kept
    reg, _ = read_sglang(LocalTransport("node1"), "node1", [str(tmp_path / "0.5.23" / "site-packages")], store)
    assert len(reg.flags) > 500 and json.loads(kept.read_text())["reader"] == READER
