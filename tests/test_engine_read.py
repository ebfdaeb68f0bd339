"""Reading the installed engine's registry on a host (hosts/engine.read_sglang) through a real local
transport and python: found on the services' PYTHONPATH, parsed, kept in the store per version (a known
version's files are not sent again); an unknown layout or no package is a note, never an error."""
from __future__ import annotations

import json

from envbisect.hosts.engine import read_sglang
from envbisect.hosts.transport import LocalTransport
from envbisect.sim.installed import write_installed_sglang


def test_found_parsed_and_cached_per_version(tmp_path):
    site = write_installed_sglang(tmp_path / "dep")
    store = tmp_path / "store"
    t = LocalTransport("node1")
    reg, note = read_sglang(t, "node1", [str(site)], store)
    assert note is None and reg is not None and reg.version == "0.5.3"
    assert reg.knob("SGL_TEST_RETRACT").name == "SGLANG_TEST_RETRACT"
    assert json.loads((store / "knobs" / "sglang-0.5.3.json").read_text())["version"] == "0.5.3"
    # the same version again: the files are not sent (even if they became unreadable), the cache answers
    (site / "sglang" / "srt" / "environ.py").write_text("garbage(\n")
    again, note = read_sglang(t, "node1", [str(site)], store)
    assert note is None and again == reg


def test_unknown_layout_and_no_package_are_notes(tmp_path):
    site = write_installed_sglang(tmp_path / "dep")
    (site / "sglang" / "srt" / "environ.py").write_text("X = 1\n")
    reg, note = read_sglang(LocalTransport("node1"), "node1", [str(site)], tmp_path / "store")
    assert reg is None and "an unknown layout (environ.py has no Envs class" in note, note
    assert "today's behaviour" in note
    reg, note = read_sglang(LocalTransport("node1"), "node1", [str(tmp_path / "nothing")], tmp_path / "store")
    assert reg is None and "no sglang package found" in note, note
