"""Flag deltas (issue 24, part 1) without hosts: an argument string's env delta split per flag
(deltas.split_flags), the trial file with exactly the chosen flags (configuration.target_state),
a flag held or not (configuration.holds, what revert/apply read), twins linked across services, and
what stays one whole value, with its note."""
from __future__ import annotations

import shlex

from envbisect.inputs.envfile import parse_env
from envbisect.inputs.masking import SecretMasker
from envbisect.runs.bisect import make_units
from envbisect.state.configuration import FileOriginal, OriginalState, holds, target_state
from envbisect.state.deltas import Delta, Diff, split_flags
from envbisect.state.snapshot import Snapshot

PATH = "/srv/decode.serve-env"


def env_delta(service: str, key: str, old_word: str, new_word: str, path: str = PATH, **kw) -> Delta:
    old = parse_env(f"X={old_word}\n").get("X").value
    new = parse_env(f"X={new_word}\n").get("X").value
    return Delta(f"{service}:{key}", "env", "gpu1", service, path, key, "changed", old, new, "snapshot:s1",
                 old_word=old_word, new_word=new_word, **kw)


def diff_of(*deltas: Delta, arg_keys=()) -> Diff:
    snap = Snapshot("cur", None, 0.0, "dep", {})
    return split_flags(Diff(None, None, snap, tuple(deltas), ()), arg_keys)


OLD = "'--tp 2 --attention-backend flashinfer --enable-metrics --stop \"a b\"'"
NEW = "'--tp 4 --attention-backend triton --stop \"a b\" --disable-radix-cache'"


def test_an_argument_string_is_one_delta_per_flag():
    diff = diff_of(env_delta("decode", "SGLANG_EXTRA_ARGS", OLD, NEW), env_delta("decode", "SGLANG_X", "1", "2"))
    got = {d.id: (d.change, d.old, d.new) for d in diff.deltas}
    assert got == {
        "decode:SGLANG_EXTRA_ARGS[--tp]": ("changed", "--tp 2", "--tp 4"),
        "decode:SGLANG_EXTRA_ARGS[--attention-backend]": ("changed", "--attention-backend flashinfer",
                                                           "--attention-backend triton"),
        "decode:SGLANG_EXTRA_ARGS[--disable-radix-cache]": ("added", None, "--disable-radix-cache"),
        "decode:SGLANG_EXTRA_ARGS[--enable-metrics]": ("removed", "--enable-metrics", None),
        "decode:SGLANG_X": ("changed", "1", "2"),
    }
    assert diff.notes == ()
    shown = [d.to_json(SecretMasker()) for d in diff.deltas if d.flag == "--attention-backend"][0]
    assert (shown["flag"], shown["old_shown"], shown["new_shown"]) == (
        "--attention-backend", "--attention-backend flashinfer", "--attention-backend triton")


def test_a_playbook_named_key_is_split_and_others_are_not():
    d = env_delta("decode", "SGLANG_OPTS", "'--tp 2'", "'--tp 4'")
    assert [x.id for x in diff_of(d).deltas] == ["decode:SGLANG_OPTS"]
    assert [x.id for x in diff_of(d, arg_keys=("SGLANG_OPTS",)).deltas] == ["decode:SGLANG_OPTS[--tp]"]


def test_what_cannot_be_split_stays_whole_with_a_note():
    cases = [
        ("'--tp 2'", "'--tp \"4'", "not a list of flags (an unbalanced double quote)"),
        ("'model-a --tp 2'", "'model-b --tp 2'", "positional arguments"),
        ("'--tp 2'", "\"--tp $(nproc)\"", "runs a command substitution"),
        ("'--tp 2 --x 1'", "'--x 1 --tp=2'", "only the order or spelling of its flags changed"),
    ]
    for old, new, why in cases:
        diff = diff_of(env_delta("decode", "SGLANG_EXTRA_ARGS", old, new))
        assert [d.id for d in diff.deltas] == ["decode:SGLANG_EXTRA_ARGS"], (old, new)
        assert len(diff.notes) == 1 and why in diff.notes[0] and "compared as one value" in diff.notes[0], diff.notes


def test_a_value_reading_a_changed_key_stays_whole():
    d = env_delta("decode", "SGLANG_EXTRA_ARGS", '"--tp $TP"', '"--tp $TP --x"', old_eval="--tp 2",
                  new_eval="--tp 4 --x")
    diff = diff_of(d, env_delta("decode", "TP", "2", "4"))
    assert "decode:SGLANG_EXTRA_ARGS" in {x.id for x in diff.deltas}
    assert "reads TP, which changed too" in diff.notes[0]
    # reading a key that did not change: split on what bash made of it
    alone = diff_of(d)
    assert {x.id for x in alone.deltas} == {"decode:SGLANG_EXTRA_ARGS[--tp]", "decode:SGLANG_EXTRA_ARGS[--x]"}


def file_text(word: str) -> bytes:
    return f"# decode\nexport SGLANG_X=1\nexport SGLANG_EXTRA_ARGS={word}\nexport B=2\n".encode()


def trial(applied: set[str]) -> str:
    diff = diff_of(env_delta("decode", "SGLANG_EXTRA_ARGS", OLD, NEW))
    orig = OriginalState({("gpu1", PATH): FileOriginal(True, file_text(NEW))}, {})
    t = target_state(orig, diff.deltas, applied, {})
    return t.files[("gpu1", PATH)].decode()


def test_a_trial_writes_the_baseline_string_with_exactly_the_chosen_flags():
    a = "decode:SGLANG_EXTRA_ARGS[--attention-backend]"
    assert trial(set()) == file_text(OLD).decode()  # the baseline's shell text, byte for byte
    every = {f"decode:SGLANG_EXTRA_ARGS[{f}]" for f in ("--tp", "--attention-backend", "--enable-metrics",
                                                          "--disable-radix-cache")}
    assert trial(every) == file_text(NEW).decode()
    text = trial({a, "decode:SGLANG_EXTRA_ARGS[--disable-radix-cache]"})
    value = parse_env(text).get("SGLANG_EXTRA_ARGS").value
    assert value == '--tp 2 --attention-backend triton --enable-metrics --stop "a b" --disable-radix-cache'
    assert shlex.split(value)[-3:] == ["--stop", "a b", "--disable-radix-cache"]
    lines = text.splitlines()
    assert lines[:2] == ["# decode", "export SGLANG_X=1"] and lines[3] == "export B=2"  # nothing else moved
    # what revert/apply read: each flag held in its own state, whatever the other flags are
    env = parse_env(text)
    diff = diff_of(env_delta("decode", "SGLANG_EXTRA_ARGS", OLD, NEW))
    state = {d.flag: holds(env, d, "new") for d in diff.deltas}
    assert state == {"--tp": False, "--attention-backend": True, "--disable-radix-cache": True,
                     "--enable-metrics": False}
    assert all(holds(env, d, "old") != state[d.flag] for d in diff.deltas)


def test_a_flag_left_out_of_the_run_keeps_its_current_state():
    diff = diff_of(env_delta("decode", "SGLANG_EXTRA_ARGS", OLD, NEW))
    chosen = [d for d in diff.deltas if d.flag != "--tp"]  # bisect --exclude 'decode:SGLANG_EXTRA_ARGS[--tp]'
    orig = OriginalState({("gpu1", PATH): FileOriginal(True, file_text(NEW))}, {})
    baseline = target_state(orig, chosen, set(), {}).files[("gpu1", PATH)].decode()
    assert parse_env(baseline).get("SGLANG_EXTRA_ARGS").value == \
        '--tp 4 --attention-backend flashinfer --enable-metrics --stop "a b"'
    current = target_state(orig, chosen, {d.id for d in chosen}, {}).files[("gpu1", PATH)].decode()
    assert current == file_text(NEW).decode()


def test_the_same_flag_change_in_prefill_and_decode_is_linked():
    diff = diff_of(env_delta("decode", "SGLANG_EXTRA_ARGS", "'--page-size 16 --tp 2'", "'--page-size=64 --tp 4'"),
                   env_delta("prefill", "SGLANG_EXTRA_ARGS", "'--page-size 16'", "'--page-size 64'",
                             path="/srv/prefill.serve-env"))
    assert diff.links() == [["decode:SGLANG_EXTRA_ARGS[--page-size]", "prefill:SGLANG_EXTRA_ARGS[--page-size]"]]
    units, notes = make_units(diff.deltas, (), auto_link=True)
    assert units["linked:SGLANG_EXTRA_ARGS[--page-size]"] == ("decode:SGLANG_EXTRA_ARGS[--page-size]",
                                                              "prefill:SGLANG_EXTRA_ARGS[--page-size]")
    assert units["decode:SGLANG_EXTRA_ARGS[--tp]"] == ("decode:SGLANG_EXTRA_ARGS[--tp]",)
    assert len(notes) == 1


def test_a_secret_flag_value_is_masked():
    diff = diff_of(env_delta("decode", "SGLANG_EXTRA_ARGS", "'--tp 2 --api-key sk-abcdefghijklmnopqrstuv1234'",
                             "'--tp 2 --api-key sk-zzzzzzzzzzzzzzzzzzzzzz9876'"))
    (d,) = diff.deltas
    j = d.to_json(SecretMasker())
    assert d.id == "decode:SGLANG_EXTRA_ARGS[--api-key]"
    text = repr(j)
    assert "sk-abcdefghij" not in text and "sk-zzzzzzzz" not in text, text


def test_playbook_deltas_args_is_read_and_checked(tmp_path):
    from pathlib import Path

    import pytest

    from envbisect.inputs.playbook import PlaybookError, load_playbook

    text = (Path(__file__).resolve().parent.parent / "playbooks" / "sglang-pd.toml").read_text()
    assert load_playbook(Path(__file__).resolve().parent.parent / "playbooks" / "sglang-pd.toml").arg_keys == \
        ("SGLANG_OPTS",)
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace('args = ["SGLANG_OPTS"]', 'args = ["SGLANG OPTS"]'))
    with pytest.raises(PlaybookError, match="deltas.args.*not a variable name"):
        load_playbook(bad)
