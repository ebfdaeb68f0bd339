"""An engine upgrade under the deployment's own settings (issue 37, part 2), from the knob registries of
two real releases (0.5.18 -> 0.5.23, their files cached by scripts/sglang_wheels.py): the defaults that
changed for knobs the deployment does not set, the variables it sets that the new release no longer
reads or reads under a new name, the flags it passes that the new release removed; and the settings of
a service read from its env file and command line."""
from __future__ import annotations

import re

import pytest

from envbisect.errors import PlaybookError
from envbisect.inputs.playbook import parse_playbook
from envbisect.state.knobs import parse_sglang_files
from envbisect.state.upgrades import UNTESTED_UPGRADE, Upgrade, settings_of, upgrade_deltas, upgrade_effects, \
    with_effects

from test_sglang_releases import release_files


def regs():
    return parse_sglang_files(release_files("0.5.18")), parse_sglang_files(release_files("0.5.23"))


def test_what_an_upgrade_changes_under_the_settings():
    old, new = regs()
    effects = upgrade_effects(old, new, {"SGLANG_ENABLE_NVTX", "SGLANG_DSPARK_FAST_SAMPLING", "HF_HOME",
                                         "SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW", "SGLANG_HACK_FLASHMLA_BACKEND"},
                              {"--tp-size", "--cuda-graph-max-bs"})
    assert "SGLANG_ENABLE_NVTX is set here and sglang 0.5.23 no longer reads it: ignored now" in effects
    assert ("SGLANG_DSPARK_FAST_SAMPLING is set here and sglang 0.5.23 no longer reads it (deprecated without a "
            "replacement): ignored now") in effects
    assert ("SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW is read as SGLANG_OPT_RELEASE_PREFILL_SWA by sglang "
            "0.5.23 (was SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW)") in effects
    assert "--cuda-graph-max-bs is passed here and sglang 0.5.23 removed it (not a flag any more)" in effects
    assert "default of SGLANG_ENABLE_FAILED_SESSION_PROBE: false → true (not set here)" in effects
    assert "default of --encoder-transfer-backend: (no default) → auto (not passed here)" in effects
    # a knob it sets is no changed default under it; a name outside the engine says nothing
    assert not any("SGLANG_HACK_FLASHMLA_BACKEND" in e for e in effects)
    assert not any("HF_HOME" in e or "--tp-size" in e for e in effects)


def test_settings_of_an_env_file_and_a_command_line():
    envs, flags = settings_of('export SGLANG_X=1\nSGLANG_EXTRA_ARGS="--page-size 16 --enable-metrics"\n',
                              "/venv/bin/python -m sglang.launch_server --tp-size=2 --model m")
    assert envs == {"SGLANG_X", "SGLANG_EXTRA_ARGS"}
    assert flags == {"--page-size", "--enable-metrics", "--tp-size", "--model"}


def test_unknown_registries_say_so_and_other_packages_carry_no_effects():
    old, new = regs()
    ups = (Upgrade("n1", "decode", "sglang", "0.5.18", "0.5.23"), Upgrade("n1", "decode", "sglang", "0.5.9", "0.5.23"),
           Upgrade("n1", "decode", "torch", "2.8.0", "2.9.0"))
    a, b, c = with_effects(ups, {"0.5.18": old, "0.5.23": new}, {("n1", "decode"): ({"SGLANG_ENABLE_NVTX"}, set())})
    assert "SGLANG_ENABLE_NVTX is set here and sglang 0.5.23 no longer reads it: ignored now" in a.effects
    assert b.effects == ("what it changed under this deployment's settings is unknown: the store holds no knob "
                         "registry of sglang 0.5.9 (one is kept when a snapshot or diff reads a release)",)
    assert c.effects == () and c.id == "decode:pkg:torch" and c.line() == "decode:pkg:torch 2.8.0 → 2.9.0"
    assert UNTESTED_UPGRADE in a.note() and a.note().startswith("n1: decode:pkg:sglang 0.5.18 → 0.5.23: ")


def test_with_a_versions_table_the_upgrade_and_its_changed_defaults_are_deltas():
    old, new = regs()
    u = Upgrade("n1", "decode", "sglang", "0.5.18", "0.5.23")
    versions = {"0.5.18": "/opt/venvs/0.5.18", "0.5.23": "/opt/venvs/0.5.23"}
    ds = upgrade_deltas(u, "/srv/decode.env", {"SGLANG_HACK_FLASHMLA_BACKEND": "auto"}, "ENGINE_ENV", versions, old, new)
    by = {d.id: d for d in ds}
    switch = by["decode:pkg:sglang"]
    assert (switch.key, switch.change, switch.old, switch.new) == ("ENGINE_ENV", "removed", "/opt/venvs/0.5.18", None)
    pinned = by["decode:pkg:sglang[SGLANG_ENABLE_FAILED_SESSION_PROBE]"]
    assert (pinned.key, pinned.change, pinned.old, pinned.new) == ("SGLANG_ENABLE_FAILED_SESSION_PROBE", "removed",
                                                                   "false", None)
    assert "decode:pkg:sglang[SGLANG_HACK_FLASHMLA_BACKEND]" not in by  # set in the file: its default is moot
    assert "decode:pkg:sglang[SGLANG_DISAGGREGATION_SAMPLING_MASK_MAX_TOKENS]" in by  # 0 → no default
    # the file already runs the new release by the switch: it switches back to the old value
    again = upgrade_deltas(u, "/srv/decode.env", {"ENGINE_ENV": "/opt/venvs/0.5.23"}, "ENGINE_ENV", versions, old, new)
    assert {(d.change, d.new) for d in again if d.key == "ENGINE_ENV"} == {("changed", "/opt/venvs/0.5.23")}
    # a release the table does not name: nothing to switch to
    assert upgrade_deltas(u, "/srv/decode.env", {}, "ENGINE_ENV", {"0.5.23": "/x"}, old, new) == ()


def test_the_playbook_engine_table(tmp_path):
    base = {"hosts": {"n": {"ssh": "local"}}, "services": {"decode": {
        "host": "n", "env_file": "/x.env", "start": "true", "stop": "true", "health": "http://127.0.0.1:1/h"}}}
    pb = parse_playbook({**base, "engine": {"switch": "ENGINE_ENV", "versions": {"0.5.18": "/a", "0.5.23": "/b"}}},
                        tmp_path / "p.toml")
    assert pb.engine_switch == "ENGINE_ENV" and pb.engine_versions == {"0.5.18": "/a", "0.5.23": "/b"}
    for bad, why in (({"switch": "X"}, "engine.versions: is required with"),
                     ({"versions": {"1": "a"}}, "engine.switch: is required with"),
                     ({"switch": "1X", "versions": {"1": "a"}}, "is not a variable name"),
                     ({"switch": "X", "versions": {"1": ""}}, "engine.versions.1: must be a non-empty string")):
        with pytest.raises(PlaybookError, match=re.escape(why)):
            parse_playbook({**base, "engine": bad}, tmp_path / "p.toml")


def test_a_changed_default_set_by_another_spelling_or_elsewhere_is_not_pinned():
    """Pinning the old default in the env file would override what the service really runs with: an
    alias of the knob in the file (the engine reads SGL_X as SGLANG_X), or the knob set by a sourced
    file or the start environment. The baseline trial would then not run the baseline."""
    old, new = regs()
    u = Upgrade("n1", "decode", "sglang", "0.5.18", "0.5.23")
    versions = {"0.5.18": "/opt/venvs/0.5.18", "0.5.23": "/opt/venvs/0.5.23"}
    knob = "decode:pkg:sglang[SGLANG_ENABLE_FAILED_SESSION_PROBE]"
    by_alias = upgrade_deltas(u, "/srv/decode.env", {"SGL_ENABLE_FAILED_SESSION_PROBE": "1"}, "E", versions, old, new)
    assert knob not in {d.id for d in by_alias} and "decode:pkg:sglang" in {d.id for d in by_alias}
    elsewhere = upgrade_deltas(u, "/srv/decode.env", {}, "E", versions, old, new,
                               set_elsewhere={"SGLANG_ENABLE_FAILED_SESSION_PROBE"})
    assert knob not in {d.id for d in elsewhere}
    assert "decode:pkg:sglang[SGLANG_HACK_FLASHMLA_BACKEND]" in {d.id for d in elsewhere}
