"""Tests for envbisect.inputs.envfile: shell-faithful parsing and byte-surgical edits of serve-env files."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbisect.inputs.envfile import EnvAssignment, EnvFile, EnvFileError, parse_env, shell_quote

SAMPLE = (
    "# decode tuning\n"
    "export SGLANG_SM120_MMA_TARGET_CTAS=512\n"
    'export NCCL_IB_HCA="mlx5_0,mlx5_1"\n'
    "CUDA_VISIBLE_DEVICES=4,5,6,7\n"
    "export HF_TOKEN='hf_abc'\n"
    'export LONG="a \\\n'
    'b"\n'
    "export PATHLIKE=${HOME}/x\n"
)

BASH = shutil.which("bash")
ENV = shutil.which("env")
PRINTENV = shutil.which("printenv")
needs_bash = pytest.mark.skipif(not (BASH and ENV and PRINTENV), reason="bash/env/printenv missing")


def vals(text: str) -> dict[str, str]:
    return parse_env(text).values()


# ------------------------------------------------------------------------------ parsing

def test_sample_file():
    f = parse_env(SAMPLE)
    assert f.values() == {
        "SGLANG_SM120_MMA_TARGET_CTAS": "512",
        "NCCL_IB_HCA": "mlx5_0,mlx5_1",
        "CUDA_VISIBLE_DEVICES": "4,5,6,7",
        "HF_TOKEN": "hf_abc",
        "LONG": "a b",
        "PATHLIKE": "${HOME}/x",
    }
    by_key = {a.key: a for a in f.assignments}
    assert [a.lineno for a in f.assignments] == [2, 3, 4, 5, 6, 8]
    assert not by_key["CUDA_VISIBLE_DEVICES"].exported
    assert all(a.exported for k, a in by_key.items() if k != "CUDA_VISIBLE_DEVICES")
    assert by_key["PATHLIKE"].refs == ("HOME",)
    assert by_key["HF_TOKEN"].refs == ()
    long = by_key["LONG"]
    assert SAMPLE[long.start : long.end] == 'export LONG="a \\\nb"'
    first = f.assignments[0]
    assert SAMPLE[first.start : first.end] == "export SGLANG_SM120_MMA_TARGET_CTAS=512"
    assert SAMPLE[first.value_start : first.value_end] == "512"
    assert f.duplicates() == {}
    assert isinstance(f, EnvFile) and isinstance(first, EnvAssignment)


def test_span_includes_leading_blanks_and_trailing_comment_but_not_newline():
    text = "A=1\n  \texport B='x'   # why\nC=3"
    f = parse_env(text)
    b = f.get("B")
    assert text[b.start : b.end] == "  \texport B='x'   # why"
    assert text[b.value_start : b.value_end] == "'x'"
    c = f.get("C")
    assert (c.start, c.end, c.lineno) == (len(text) - 3, len(text), 3)


def test_blank_lines_comments_and_whitespace():
    text = "\n   \n# A=1\n  # B=2\n\t C=3\nD=4 # E=5\n#!/bin/sh\n"
    assert vals(text) == {"C": "3", "D": "4"}


def test_hash_inside_a_word_is_not_a_comment():
    assert vals("A=a#b\nB=#x\nC='x # y'\nD=\"x # y\"\nE=  # c\nF=x#y # z\n") == {
        "A": "a#b", "B": "#x", "C": "x # y", "D": "x # y", "E": "", "F": "x#y",
    }


def test_export_forms():
    f = parse_env("export A=1\nexport\tB=2\n  export   C=3\nexportD=4\nexport=5\nexport E\nexport -n F\n")
    assert f.values() == {"A": "1", "B": "2", "C": "3", "exportD": "4", "export": "5"}
    assert [a.exported for a in f.assignments] == [True, True, True, False, False]


def test_non_assignment_lines_are_ignored():
    text = (
        "set -a\n"
        "export E\n"
        "declare -x D=1\n"
        ": ${X:=1}\n"
        "if [ -n \"$Y\" ]; then true; fi\n"
        "source /etc/other.env\n"
        "1A=2\n"
        "K=real\n"
        "set +a\n"
    )
    assert vals(text) == {"K": "real"}


def test_quotes_spanning_lines_in_ignored_statements_hide_nothing():
    text = "true 'x\nFAKE=1\n' \"y\nFAKE2=2\"\nREAL=1\n"
    assert vals(text) == {"REAL": "1"}


def test_single_quotes_are_literal_and_may_span_lines():
    f = parse_env("A='$HOME \\ \" `x` $(y)'\nB='multi\nline'\nC=''\n")
    assert f.values() == {"A": '$HOME \\ " `x` $(y)', "B": "multi\nline", "C": ""}
    assert f.get("A").refs == ()
    assert f.get("C").lineno == 4


def test_double_quote_escapes():
    text = 'A="q\\"b\\\\c\\$d\\`e\\nf\\xg"\n'
    assert vals(text) == {"A": 'q"b\\c$d`e\\nf\\xg'}


def test_unquoted_backslash_escapes():
    assert vals("A=a\\ b\\\"c\\'d\\$e\\\\f\\#g\n") == {"A": "a b\"c'd$e\\f#g"}


def test_continuations():
    text = "A=ab\\\ncd\nB=\"x\\\ny\"\nC='p\\\nq'\nD=1\n"
    f = parse_env(text)
    assert f.values() == {"A": "abcd", "B": "xy", "C": "p\\\nq", "D": "1"}
    assert [a.lineno for a in f.assignments] == [1, 3, 5, 7]
    a = f.get("A")
    assert text[a.start : a.end] == "A=ab\\\ncd"


def test_trailing_backslash_at_eof_is_literal_like_bash():
    assert vals("A=abc\\") == {"A": "abc\\"}
    assert vals("A=abc\\\n") == {"A": "abc"}


def test_mixed_quoting_in_one_word():
    assert vals("A=a'b c'\"d $e\"f\\ g\n") == {"A": "ab cd $ef g"}


def test_command_substitution_and_backquotes_kept_literally():
    f = parse_env('A=$(cat /etc/x | tr a b)\nB=`date +%s`\nC="$(echo ")") $((1+2))"\nD=x$(a "b c")y\n')
    assert f.values() == {
        "A": "$(cat /etc/x | tr a b)",
        "B": "`date +%s`",
        "C": '$(echo ")") $((1+2))',
        "D": 'x$(a "b c")y',
    }
    assert all(a.refs == () for a in f.assignments)


def test_references_and_refs_tuple():
    f = parse_env("A=$X${Y}'$Z'\\$W\"$V ${U}\"$X\nB=${P:-$Q}/${R:-x y}\nC=$1$$\n")
    assert f.get("A").value == "$X${Y}$Z$W$V ${U}$X"
    assert f.get("A").refs == ("X", "Y", "V", "U")
    assert f.get("B").value == "${P:-$Q}/${R:-x y}"
    assert f.get("B").refs == ("P", "Q", "R")
    assert f.get("C").value == "$1$$"
    assert f.get("C").refs == ()


def test_tilde():
    f = parse_env("A=~/x:~/y:a~\nB='~'\nC=~user\n")
    assert f.values() == {"A": "~/x:~/y:a~", "B": "~", "C": "~user"}
    assert f.resolved({"HOME": "/h"}) == {"A": "/h/x:/h/y:a~", "B": "~", "C": "~user"}


def test_duplicates_get_and_values():
    f = parse_env("A=1\nB=2\nexport A=3\nA='4'\n")
    assert f.values() == {"A": "4", "B": "2"}
    assert f.duplicates() == {"A": [1, 3, 4]}
    assert f.get("A").lineno == 4 and not f.get("A").exported
    assert f.get("missing") is None
    assert [a.key for a in f.assignments] == ["A", "B", "A", "A"]


def test_crlf_keeps_carriage_return_like_sh():
    assert vals("A=1\r\nB='x'\r\n") == {"A": "1\r", "B": "x\r"}


def test_empty_file():
    f = parse_env("")
    assert f.assignments == () and f.values() == {} and f.resolved() == {}


# ------------------------------------------------------------------------------ errors

@pytest.mark.parametrize(
    "text, lineno, fragment",
    [
        ("A=1\nB='oops\n\n", 2, "unterminated single quote"),
        ('A=1\n\nB="x\ny\n', 3, "unterminated double quote"),
        ("A=1\necho 'x\n", 2, "unterminated single quote"),
        ("A=`date\n", 1, "unterminated backquote"),
        ("A=$(date\n", 1, "unterminated $("),
        ("A=${X\n", 1, "unterminated ${"),
        ("A=1\nB=2 C=3 serve\n", 2, "after the value of C"),
        ("A=1 cmd\n", 1, "after the value of A"),
        ("A=1;\n", 1, "after the value of A"),
        ("A=(a b)\n", 1, "after the value of A"),
        ("\n\nPATH+=:/x\n", 3, "append"),
        ("A=1\ncat <<EOF\nB=2\nEOF\n", 2, "here-document"),
        ("A=$'x\\ty'\n", 1, "$'...'"),
    ],
)
def test_errors_name_the_line(text, lineno, fragment):
    with pytest.raises(EnvFileError) as ei:
        parse_env(text)
    msg = str(ei.value)
    assert msg.startswith(f"line {lineno}: ")
    assert fragment in msg
    assert "\n" not in msg
    assert ei.value.lineno == lineno
    assert isinstance(ei.value, ValueError)


# ------------------------------------------------------------------------------ with_value

def test_with_value_rewrites_only_the_value():
    out = parse_env(SAMPLE).with_value("NCCL_IB_HCA", "mlx5_2")
    assert out == SAMPLE.replace('NCCL_IB_HCA="mlx5_0,mlx5_1"', "NCCL_IB_HCA=mlx5_2")


def test_with_value_keeps_export_prefix_blanks_and_trailing_comment():
    text = "A=1\n  export\t B=\"old\"   # tuned 2024-05\nC=3\n"
    assert parse_env(text).with_value("B", "new value") == (
        "A=1\n  export\t B='new value'   # tuned 2024-05\nC=3\n"
    )


def test_with_value_keeps_missing_export():
    assert parse_env("A=1\nB=2\n").with_value("A", "x y") == "A='x y'\nB=2\n"


def test_with_value_only_touches_last_duplicate():
    text = "A=1 # first\nB=2\nexport A=3 # second\nC=4"
    assert parse_env(text).with_value("A", "9") == "A=1 # first\nB=2\nexport A=9 # second\nC=4"


def test_with_value_replaces_multiline_value():
    out = parse_env(SAMPLE).with_value("LONG", "z")
    assert out == SAMPLE.replace('LONG="a \\\nb"', "LONG=z")


def test_with_value_empty_and_dangerous_values_are_quoted():
    f = parse_env("A=1 # c\n")
    assert f.with_value("A", "") == "A='' # c\n"
    assert f.with_value("A", "it's") == "A='it'\\''s' # c\n"
    assert f.with_value("A", "$(rm -rf /)") == "A='$(rm -rf /)' # c\n"
    assert f.with_value("A", "a\nb") == "A='a\nb' # c\n"


def test_with_value_empty_value_span():
    assert parse_env("A=\nB= # c\n").with_value("B", "1") == "A=\nB=1 # c\n"


def test_with_value_appends_when_absent():
    assert parse_env("A=1\n").with_value("B", "x y") == "A=1\nexport B='x y'\n"
    assert parse_env("A=1").with_value("B", "2") == "A=1\nexport B=2\n"
    assert parse_env("").with_value("B", "2") == "export B=2\n"
    assert parse_env("# only a comment").with_value("B", "2") == "# only a comment\nexport B=2\n"


def test_with_value_append_survives_dangling_continuation():
    text = "export A=abc\\\n"
    out = parse_env(text).with_value("B", "2")
    assert out == text + "\nexport B=2\n"
    assert vals(out) == {"A": "abc", "B": "2"}


def test_with_value_refuses_when_no_safe_append_exists():
    with pytest.raises(EnvFileError):
        parse_env("A=abc\\").with_value("B", "2")


def test_with_value_rejects_bad_key_and_nul():
    f = parse_env("A=1\n")
    for bad in ("", "1A", "A-B", "A B", "é"):
        with pytest.raises(ValueError):
            f.with_value(bad, "x")
    with pytest.raises(ValueError):
        f.with_value("A", "a\0b")


# ------------------------------------------------------------------------------ without

def test_without_removes_whole_lines():
    text = "# head\nA=1 # c\nB=2\n  export A='x\ny'\nC=3\n"
    assert parse_env(text).without("A") == "# head\nB=2\nC=3\n"


def test_without_last_line_without_newline():
    assert parse_env("A=1\nB=2").without("B") == "A=1\n"
    assert parse_env("B=2").without("B") == ""


def test_without_absent_key_is_identity():
    assert parse_env(SAMPLE).without("NOPE") == SAMPLE


def test_without_multiline():
    out = parse_env(SAMPLE).without("LONG")
    assert out == SAMPLE.replace('export LONG="a \\\nb"\n', "")


# ------------------------------------------------------------------------------ resolved

def test_resolved_file_order_then_environ_then_empty():
    text = "A=$X\nX=file\nB=${X}/b\nC=\"$Y-$UNSET\"\nX=late\n"
    assert parse_env(text).resolved({"X": "env", "Y": "y"}) == {
        "A": "env", "X": "late", "B": "file/b", "C": "y-",
    }


def test_resolved_does_not_expand_single_quoted_or_escaped():
    text = "A='$HOME'\nB=\\$HOME\nC=\"\\$HOME $HOME\"\n"
    assert parse_env(text).resolved({"HOME": "/h"}) == {"A": "$HOME", "B": "$HOME", "C": "$HOME /h"}


def test_resolved_sample():
    assert parse_env(SAMPLE).resolved({"HOME": "/root"})["PATHLIKE"] == "/root/x"
    assert parse_env(SAMPLE).resolved()["PATHLIKE"] == "/x"


def test_resolved_default_forms():
    text = (
        "E=\n"
        "A=${U:-d}${E:-d}${E-d}${U-d}\n"
        "B=${U:+a}${E:+a}${E+a}${S:+a}\n"
        "C=${N:=set}$N\n"
        "D=${S:-$S$S}\n"
        "F=${U:-'q'}\n"
        "G=${#S}$(echo hi)`x`\n"
    )
    assert parse_env(text).resolved({"S": "s"}) == {
        "E": "",
        "A": "ddd",
        "B": "aa",
        "C": "setset",
        "D": "s",
        "F": "${U:-'q'}",
        "G": "${#S}$(echo hi)`x`",
    }


# ------------------------------------------------------------------------------ shell_quote

@pytest.mark.parametrize(
    "value, quoted",
    [
        ("512", "512"),
        ("mlx5_0,mlx5_1", "mlx5_0,mlx5_1"),
        ("a=b:c/d.e+f@g%h^i-j", "a=b:c/d.e+f@g%h^i-j"),
        ("", "''"),
        ("a b", "'a b'"),
        ("~", "'~'"),
        ("it's", "'it'\\''s'"),
        ("$(x)", "'$(x)'"),
        ("é", "'é'"),
    ],
)
def test_shell_quote(value, quoted):
    assert shell_quote(value) == quoted


# ------------------------------------------------------------------------------ generated files

KEYS = ["EB_A", "EB_B", "EB_C", "eb_low", "EB_9", "EB_LONG_NAME"]
SAFE = "ABCXYZabcxyz0129_./:,+=@%^-"
NOTHING_TO_EXECUTE = ["set -a", "export EB_A", "true 'x  y' \"z\" # it's", ": ${EB_ZZ:-q}"]

no_nul = st.characters(codec="utf-8", exclude_characters="\x00")
one_line = st.characters(codec="utf-8", exclude_characters="\x00\n")


def _units_with_continuations(draw, units: list[str]) -> str:
    """Join rendered units, sometimes putting a backslash-newline between them."""
    out = []
    for u in units:
        if draw(st.integers(0, 5)) == 0:
            out.append("\\\n")
        out.append(u)
    return "".join(out)


@st.composite
def segments(draw, refs_allowed: list[str]):
    """(rendered shell text, literal value, ref key or None) for one piece of a value word."""
    styles = ["bare", "single", "double", "escaped"] + (["ref"] if refs_allowed else [])
    style = draw(st.sampled_from(styles))
    if style == "bare":
        v = draw(st.text(SAFE, max_size=8))
        return v, v, None
    if style == "single":
        v = draw(st.text(no_nul.filter(lambda c: c != "'"), max_size=8))
        return f"'{v}'", v, None
    if style == "double":
        v = draw(st.text(no_nul, max_size=8))
        units = ["\\" + c if c in '"\\$`' else c for c in v]
        return '"' + _units_with_continuations(draw, units) + '"', v, None
    if style == "escaped":
        v = draw(st.text(one_line, max_size=8))
        units = [c if c in SAFE else "\\" + c for c in v]
        return _units_with_continuations(draw, units), v, None
    ref = draw(st.sampled_from(refs_allowed))
    raw = "${%s}" % ref
    return raw, raw, ref


@st.composite
def env_files(draw):
    """(text, expected literal values, expected resolved values with an empty environ)."""
    lines: list[str] = []
    values: dict[str, str] = {}
    resolved: dict[str, str] = {}
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["assign", "assign", "assign", "blank", "comment", "noop"]))
        indent = draw(st.sampled_from(["", "", "  ", "\t"]))
        if kind == "blank":
            lines.append(indent)
        elif kind == "comment":
            lines.append(indent + "#" + draw(st.text(one_line, max_size=10)))
        elif kind == "noop":
            lines.append(indent + draw(st.sampled_from(NOTHING_TO_EXECUTE)))
        else:
            key = draw(st.sampled_from(KEYS))
            segs = draw(st.lists(segments(list(values)), min_size=1, max_size=3))
            word = "".join(s[0] for s in segs)
            value = "".join(s[1] for s in segs)
            res = "".join(resolved.get(s[2], "") if s[2] else s[1] for s in segs)
            prefix = draw(st.sampled_from(["", "export ", "export\t"]))
            comment = draw(st.one_of(st.none(), st.text(one_line, max_size=10)))
            trailer = "" if comment is None else draw(st.sampled_from([" ", "\t", "   "])) + "#" + comment
            lines.append(f"{indent}{prefix}{key}={word}{trailer}")
            values[key] = value
            resolved[key] = res
    text = "\n".join(lines)
    if lines and draw(st.booleans()):
        text += "\n"
    return text, values, resolved


PAYLOADS = [
    "$(touch @S@)",
    "`touch @S@`",
    "'; touch @S@; '",
    '"; touch @S@; "',
    "\ntouch @S@\n",
    "${EB_Q:=$(touch @S@)}",
    "\\'$(touch @S@)'",
    "'\"$(touch @S@)\"'",
    "\\\ntouch @S@",
]

new_values = st.one_of(
    st.text(no_nul, max_size=30),
    st.text(SAFE, max_size=10),
    st.builds(lambda a, p, b: a + p + b, st.text(no_nul, max_size=5), st.sampled_from(PAYLOADS),
              st.text(no_nul, max_size=5)),
)
target_keys = st.sampled_from(KEYS + ["EB_NEW"])


@settings(max_examples=200, deadline=None)
@given(env_files())
def test_generated_files_parse_to_expected_values(file):
    text, values, resolved = file
    f = parse_env(text)
    assert f.values() == values
    assert f.resolved() == resolved


@settings(max_examples=200, deadline=None)
@given(env_files(), target_keys, new_values)
def test_with_value_round_trip(file, key, value):
    text, values, _ = file
    f = parse_env(text)
    new = f.with_value(key, value)
    g = parse_env(new)
    got = g.values()
    assert got[key] == value
    assert {k: v for k, v in got.items() if k != key} == {k: v for k, v in values.items() if k != key}
    old = f.get(key)
    if old is not None:
        head, tail = text[: old.value_start], text[old.value_end :]
        assert new.startswith(head) and new.endswith(tail)
        assert new[len(head) : len(new) - len(tail)] == shell_quote(value)
        assert len(g.assignments) == len(f.assignments)
        assert g.get(key).exported == old.exported
    else:
        assert new.startswith(text)
        sep = "" if text == "" or text.endswith("\n") else "\n"
        assert new[len(text):] in (f"{sep}export {key}={shell_quote(value)}\n",
                                   f"{sep}\nexport {key}={shell_quote(value)}\n")
        assert g.get(key).exported
    # the edit is stable: setting the same value again changes nothing
    assert g.with_value(key, value) == new


@settings(max_examples=100, deadline=None)
@given(env_files(), target_keys)
def test_without_round_trip(file, key):
    text, values, _ = file
    f = parse_env(text)
    new = f.without(key)
    got = parse_env(new).values()
    assert got == {k: v for k, v in values.items() if k != key}
    # removed bytes are exactly the assignment lines (with their newline)
    kept, pos = [], 0
    for a in f.assignments:
        if a.key == key:
            kept.append(text[pos : a.start])
            pos = min(a.end + 1, len(text))
    kept.append(text[pos:])
    assert new == "".join(kept)


# ------------------------------------------------------------------------------ real bash

def _source(path: str, *tail: str) -> subprocess.CompletedProcess:
    script = 'set -a; . "$1"; shift; exec "$@"'
    # cwd: a stray redirection in a generated file must land in the temp dir, never in the repo
    return subprocess.run([ENV, "-i", BASH, "-c", script, "bash", path, *tail],
                          capture_output=True, timeout=10, cwd=os.path.dirname(os.path.abspath(path)))


@needs_bash
def test_sentinel_detection_works():
    # Guards the property test below: an unsafe file really does create the sentinel.
    with tempfile.TemporaryDirectory() as d:
        sentinel = os.path.join(d, "pwned")
        path = os.path.join(d, "f.serve-env")
        with open(path, "w") as fh:
            fh.write(f"export EB_A=$(touch {sentinel})\n")
        _source(path, PRINTENV, "EB_A")
        assert os.path.exists(sentinel)


@needs_bash
def test_bash_agrees_on_sample():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "f.serve-env")
        with open(path, "w") as fh:
            fh.write(SAMPLE)
        proc = _source(path, ENV, "HOME=/root", BASH, "-c", 'set -a; . "$0"; exec env -0', path)
    assert proc.returncode == 0, proc.stderr
    env = dict(item.split("=", 1) for item in proc.stdout.decode().split("\0") if item)
    expected = parse_env(SAMPLE).resolved({"HOME": "/root"})
    assert {k: env.get(k) for k in expected} == expected


@needs_bash
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env_files(), target_keys, new_values)
def test_bash_sources_written_value_exactly_and_runs_nothing(file, key, value):
    text, _, _ = file
    with tempfile.TemporaryDirectory() as d:
        sentinel = os.path.join(d, "pwned")
        value = value.replace("@S@", sentinel)
        new = parse_env(text).with_value(key, value)
        path = os.path.join(d, "f.serve-env")
        with open(path, "wb") as fh:
            fh.write(new.encode())
        proc = _source(path, PRINTENV, key)
        assert not os.path.exists(sentinel), "sourcing the file executed part of the value"
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""
    assert proc.stdout == value.encode() + b"\n"


@needs_bash
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env_files())
def test_parser_agrees_with_bash_on_generated_files(file):
    text, _, _ = file
    expected = parse_env(text).resolved()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "f.serve-env")
        with open(path, "wb") as fh:
            fh.write(text.encode())
        proc = _source(path, ENV, "-0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""
    env = dict(item.split("=", 1) for item in proc.stdout.decode().split("\0") if item)
    assert {k: env.get(k) for k in expected} == expected


def test_exported_flag_reflects_only_the_export_keyword():
    # `set -a`/`set +a` are not modelled: whether a plain K=V reaches the process depends on them.
    f = parse_env("set +a\nA=1\nset -a\nB=2\nexport C=3\n")
    assert [(a.key, a.exported) for a in f.assignments] == [("A", False), ("B", False), ("C", True)]


# ------------------------------------------------------------------------------ shell meaning

from envbisect.inputs.envfile import word_meaning  # noqa: E402


@pytest.mark.parametrize("a,b", [
    ("512", '"512"'), ("512", "'512'"), ("'a b'", '"a b"'), ("'a b'", "a\\ b"), ('"$HOME"', "$HOME"),
    ('"${HOME}/x"', "$HOME/x"), ("'$HOME'", "\\$HOME"), ("'$HOME'", '"\\$HOME"'), ("", "''"), ('""', "''"),
    ('"$(nproc)"', "$(nproc)"),
])
def test_same_shell_meaning(a, b):
    assert word_meaning(a) == word_meaning(b)
    assert parse_env(f"X={a}\n").meanings() == parse_env(f"X={b}\n").meanings()


@pytest.mark.parametrize("a,b", [
    ("'$HOME/t'", '"$HOME/t"'), ("'$(nproc)'", "$(nproc)"), ("'`nproc`'", "`nproc`"), ("'~/x'", "~/x"),
    ("'${HF_HOME%/*}/kv'", '"${HF_HOME%/*}/kv"'), ("\\~/x", "~/x"), ("'$((1+2))'", "$((1+2))"),
])
def test_different_shell_meaning_same_unquoted_value(a, b):
    # EnvAssignment.value (the unquoted text) cannot tell these apart; the meaning can
    ea, eb = parse_env(f"X={a}\n").get("X"), parse_env(f"X={b}\n").get("X")
    assert ea.value == eb.value
    assert ea.meaning != eb.meaning


def test_command_substitution_is_its_own_part_and_resolved_keeps_its_text():
    f = parse_env("A=$(nproc)\nB='$(nproc)'\nC=\"x`hostname`y\"\n")
    assert f.get("A").meaning == (("cmd", "$(nproc)"),)
    assert f.get("B").meaning == (("lit", "$(nproc)"),)
    assert f.get("C").meaning == (("lit", "x"), ("cmd", "`hostname`"), ("lit", "y"))
    assert f.resolved() == {"A": "$(nproc)", "B": "$(nproc)", "C": "x`hostname`y"}


def test_word_is_the_exact_value_text():
    text = "export DIR=\"${HF_HOME%/*}/kv\"   # kv cache\nN=$(nproc)\nexport T=~/x\nQ='a b'\\\n'c'\n"
    f = parse_env(text)
    assert [a.word for a in f.assignments] == ['"${HF_HOME%/*}/kv"', "$(nproc)", "~/x", "'a b'\\\n'c'"]
    for a in f.assignments:
        assert text[a.value_start:a.value_end] == a.word


def test_with_word_writes_the_word_byte_for_byte():
    text = "# noon\nexport DIR=/tmp/other   # kv cache\nexport N=8\nexport T=/abs\n"
    f = parse_env(text)
    new = parse_env(f.with_word("DIR", '"${HF_HOME%/*}/kv"')).with_word("N", "$(nproc)")
    new = parse_env(new).with_word("T", "~/x")
    assert new == '# noon\nexport DIR="${HF_HOME%/*}/kv"   # kv cache\nexport N=$(nproc)\nexport T=~/x\n'
    # absent key: appended as export KEY=WORD
    assert f.with_word("NEW", "'$HOME'") == text + "export NEW='$HOME'\n"
    # a literal value is still written so that nothing runs
    assert f.with_value("N", "$(nproc)") == text.replace("N=8", "N='$(nproc)'")


@pytest.mark.parametrize("word", ["a b", "x # c", "'open", "a;b", "$(", "a\nb"])
def test_with_word_refuses_what_is_not_one_value_word(word):
    with pytest.raises(EnvFileError):
        parse_env("export A=1\n").with_word("A", word)


def test_edits_keep_others_by_meaning():
    # the safety re-parse compares meanings: an edit that would turn another key's quoted text into
    # a live expansion (or the other way round) is refused, not just one that changes its value
    g = parse_env("export A=1\nexport B='$HOME'\n")
    out = g.with_word("A", '"$HOME"')
    assert parse_env(out).get("B").meaning == (("lit", "$HOME"),)
    assert parse_env(out).get("A").meaning == (("ref", "$HOME"),)


@needs_bash
def test_written_back_words_give_the_noon_values_in_bash():
    # The baseline trial is the baseline: the words a noon file held, written back into tonight's
    # file, make bash give exactly the noon values (not the literal text).
    noon = ('export HF_HOME=/data/hf\nexport DIR="${HF_HOME%/*}/kv"\nexport WORKERS=$(nproc)\n'
            "export CACHE=~/x\nexport STAMP=`echo ok`\n")
    tonight = "export HF_HOME=/data/hf\nexport DIR=/tmp/kv\nexport WORKERS=4\nexport CACHE=/var/cache\nexport STAMP=no\n"
    words = {a.key: a.word for a in parse_env(noon).assignments}
    text = tonight
    for key in ("DIR", "WORKERS", "CACHE", "STAMP"):
        text = parse_env(text).with_word(key, words[key])
    assert text == noon
    # the same, the old way (literal values) would not be the noon configuration
    literal = tonight
    for key in ("DIR", "WORKERS", "CACHE", "STAMP"):
        literal = parse_env(literal).with_value(key, parse_env(noon).get(key).value)
    with tempfile.TemporaryDirectory() as d:
        def env_of(t):
            path = os.path.join(d, "f.serve-env")
            with open(path, "w") as fh:
                fh.write(t)
            proc = _source(path, ENV, "HOME=/home/op", BASH, "-c", 'set -a; . "$0"; exec env -0', path)
            assert proc.returncode == 0, proc.stderr
            return dict(item.split("=", 1) for item in proc.stdout.decode().split("\0") if item)
        got = env_of(text)
        lit = env_of(literal)
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    assert got["DIR"] == "/data/kv" and got["WORKERS"] == nproc and got["CACHE"] == "/home/op/x"
    assert got["STAMP"] == "ok"
    assert lit["DIR"] == "${HF_HOME%/*}/kv" and lit["WORKERS"] == "$(nproc)" and lit["CACHE"] == "~/x"
