"""Issue 8, item 4: one redaction path for every output, and nothing a value holds reaches a terminal raw.

The reproductions run the real CLI (`python -m envbisect.cli.app`) against a real directory tree (`ssh =
"local"`), a real HTTP health endpoint and a `command` probe that prints every planted secret, then
check that not one byte of any planted secret is in stdout, stderr (progress lines, `-vv` debug
logs) or the run records (run.json, trials.jsonl, events.jsonl, verdict.json, environment.json), and
in the bundle's members.
"""
from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path

import pytest

from clistack import CliStack, health_endpoint
from hosttree import DECODE

GH = "ghp_" + "Z9y8X7w6V5u4T3s2R1q0P9o8N7m6L5k4J3i2"
AWS = "AKIA" + "Q2W3E4R5T6Y7U8I9"
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJvcHMtYm90IiwiZXhwIjo0MTAyNDQ0ODAwfQ"
       ".hT3l0M4x2gS9pQ7vW1yZ5cA8bN6dE0fK2jL4mR7sU9w")
HEX40 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b"
# name -> (value as written in the env file, pieces that must never appear anywhere)
PLANTED = {
    "GITHUB_PAT": ("plainpatvalue4711xyz", ["plainpatvalue4711xyz"]),  # no shape: name rule + learned value
    "MY_SERVICE_PAT": ("anotherpat0815qq", ["anotherpat0815qq"]),
    "ENCRYPTION_KEY": ("enc-key-material-0042", ["enc-key-material-0042"]),
    "SIGNING_KEY": ("sig-key-material-0043", ["sig-key-material-0043"]),
    "SENTRY_DSN": ("https://pubkey99:sentry@pw@o1.ingest.sentry.io/5", ["pubkey99", "sentry@pw"]),
    "DB_URL": ("postgres://app:dbp@ss@w0rd@db:5432/x", ["dbp@ss@w0rd", "ss@w0rd"]),  # password with "@"
    "GH_CLI_ARG": (GH, [GH, GH[4:]]),
    "AWS_KEY_ID": (AWS, [AWS, AWS[4:]]),
    "SESSION": (JWT, [JWT, JWT.split(".")[1], JWT.split(".")[2]]),
    "WEBHOOK": (HEX40, [HEX40]),
    # issue 22, F8: a password with "/" and a Slack webhook under names that say nothing
    "DATABASE_URL": ("postgres://app:s3cr/t+pw@db:5432/x", ["s3cr/t+pw", "s3cr/t"]),
    "NOTIFY_URL": ("https://hooks.slack.com/services/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",
                   ["T0AB12CDE/B0FG34HIJ", "q1w2e3r4t5y6u7i8o9p0AbCd"]),
}
SECRETS = sorted({p for _v, pieces in PLANTED.values() for p in pieces})


@pytest.fixture(scope="module")
def health():
    with health_endpoint() as url:
        yield url


class Stack(CliStack):
    """The stack, with a command probe that prints every planted secret and fails while decode has BAD=1."""

    def __init__(self, root: Path, health_url: str):
        decode = "{decode}"
        probe = (f'[probes.p]\nkind = "command"\ncommand = """. {decode}; '
                 'echo "leak $' + ' $'.join(PLANTED) + f'"; ! grep -q BAD {decode}"""\ntimeout_s = 10\n')
        super().__init__(root, health_url, probe, name="redact")

    def plant(self, extra: str = "") -> None:
        lines = "".join(f"export {k}='{v}'\n" for k, (v, _p) in PLANTED.items())
        self.tree.edit("decode", DECODE + lines + "export SGLANG_MAX_TOKEN_LEN=8192\nexport BAD=1\n" + extra)


@pytest.fixture
def stack(tmp_path, health) -> Stack:
    return Stack(tmp_path, health)


def leaks(data: bytes) -> list[str]:
    return [s for s in SECRETS if s.encode() in data]


def run_files(store: Path) -> dict[str, bytes]:
    return {str(p.relative_to(store)): p.read_bytes() for p in (store / "runs").rglob("*")
            if p.is_file() and p.name != "journal.json"}  # the journal holds the bytes restore puts back


def test_secrets_are_masked_in_every_output_and_run_record(stack):
    stack.cli("snapshot", "--label", "noon", check=0)
    stack.plant()
    outputs: dict[str, bytes] = {}

    r = stack.cli("-vv", "diff", "--against", "noon", check=1)
    outputs["diff"] = r.stdout + r.stderr
    assert b"SGLANG_MAX_TOKEN_LEN=8192" in r.stdout  # a count of tokens, not a token: not masked
    for name in PLANTED:
        assert f"{name}=".encode() in r.stdout, name  # every delta is still shown, masked
    r = stack.cli("diff", "--against", "noon", "--json", check=1)
    outputs["diff --json"] = r.stdout + r.stderr
    new = {d["id"]: d["new"] for d in json.loads(r.stdout)["deltas"]}
    assert new["decode:SGLANG_MAX_TOKEN_LEN"] == "8192"

    r = stack.cli("-vv", "bisect", "--against", "noon", "--json", check=0)
    outputs["bisect --json -vv"] = r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "culprit" and doc["culprits"] == ["decode:BAD"]
    assert b"DEBUG envbisect.hosts.transport" in r.stderr and b"trial 1" in r.stderr  # debug logs and progress ran
    assert any("leak" in q["excerpt"] for t in doc["trials"] for pr in t["probe"]["runs"] for q in pr["requests"])
    run_id = doc["run"]

    r = stack.cli("bisect", "--against", "noon", check=0)  # human: verdict on stdout, progress on stderr
    outputs["bisect"] = r.stdout + r.stderr
    for args in (["runs"], ["runs", "--json"], ["show", run_id], ["show", run_id, "--json"]):
        r = stack.cli(*args, check=0)
        outputs[" ".join(args)] = r.stdout + r.stderr
    bundle = stack.store.parent / "b.tar.gz"
    stack.cli("bundle", "--run", run_id, "--out", str(bundle), check=0)

    found = {name: leaks(data) for name, data in outputs.items()}
    found.update({name: leaks(data) for name, data in run_files(stack.store).items()})
    with tarfile.open(bundle) as tar:
        for m in tar.getmembers():
            if m.isfile():
                found["bundle:" + m.name] = leaks(tar.extractfile(m).read())
    assert {k: v for k, v in found.items() if v} == {}
    for name in ("run.json", "trials.jsonl", "events.jsonl", "verdict.json", "environment.json"):
        assert (stack.store / "runs" / run_id / name).exists(), name
    # and the masked form still tells that a secret changed: hint + hash of the value
    assert b"ghp_\xe2\x80\xa2\xe2\x80\xa2\xe2\x80\xa2\xe2\x80\xa2(masked, sha256:" in outputs["diff"]


def test_a_resumed_run_and_revert_read_the_raw_deltas_from_the_store(stack):
    # run.json holds its deltas masked; the values a trial writes come from the private blob it names
    stack.cli("snapshot", "--label", "noon", check=0)
    stack.plant()
    r = stack.cli("bisect", "--against", "noon", "--json", check=0)
    run_id = json.loads(r.stdout)["run"]
    run_doc = json.loads((stack.store / "runs" / run_id / "run.json").read_text())
    assert run_doc["deltas_blob"] and not leaks(json.dumps(run_doc).encode())
    r = stack.cli("revert", "decode:GITHUB_PAT", "--run", run_id, "--keep-on-fail", "--json")
    assert r.returncode in (0, 1) and not leaks(r.stdout + r.stderr), r.stderr
    assert "GITHUB_PAT" not in stack.tree.env("decode").read_text()  # the revert did happen
    r = stack.cli("apply", "decode:GITHUB_PAT", "--run", run_id, "--json")
    assert not leaks(r.stdout + r.stderr), r.stderr
    assert "export GITHUB_PAT='plainpatvalue4711xyz'" in stack.tree.env("decode").read_text()  # exact value back
    assert not {k: v for k, v in ((k, leaks(v)) for k, v in run_files(stack.store).items()) if v}


EVIL = {
    "OSC_TITLE": "\x1b]0;pwned\x07",
    "CSI_CLEAR": "\x1b[2J\x1b[31mred",
    "HYPERLINK": "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\",
    "CR_OVERWRITE": "innocent\rSGLANG_FAKE=1",
    "BIDI": "abc\u202edcba",
    "MARKUP": "[/x] [bold red]not bold[/] [link=http://e]x[/link]",
    "EMOJI": ":x: :warning:",
}


def test_terminal_injection_escapes_and_markup_are_shown_not_obeyed(stack):
    stack.cli("snapshot", "--label", "noon", check=0)
    evil = "".join(f"export {k}='{v}'\n" for k, v in EVIL.items())  # the raw bytes, single-quoted
    evil += 'export FAKE_LINE="a\n  + SGLANG_INJECTED=1   [decode:SGLANG_INJECTED; from snapshot:x]"\n'
    stack.tree.edit("decode", DECODE + evil)
    r = stack.cli("diff", "--against", "noon", check=1)
    out = r.stdout.decode()
    assert "Traceback" not in r.stderr.decode()
    for bad in ("\x1b", "\x07", "\r", "\u202e", "\x9b"):
        assert bad not in out + r.stderr.decode(), repr(bad)
    assert "OSC_TITLE=\\x1b]0;pwned\\x07" in out
    assert "CSI_CLEAR=\\x1b[2J\\x1b[31mred" in out
    assert "CR_OVERWRITE=innocent\\rSGLANG_FAKE=1" in out
    assert "BIDI=abc\\u202edcba" in out
    assert "MARKUP=[/x] [bold red]not bold[/] [link=http://e]x[/link]" in out  # markup is text
    assert "EMOJI=:x: :warning:" in out  # no emoji substitution
    assert not any(line.startswith("  + SGLANG_INJECTED") for line in out.splitlines())  # no forged line
    assert "FAKE_LINE=a\\n  + SGLANG_INJECTED=1" in out
    # the same values through --json: valid JSON, every control character escaped
    r = stack.cli("diff", "--against", "noon", "--json", check=1)
    assert not re.search(rb"[\x00-\x1f\x7f]", r.stdout.replace(b"\n", b""))
    new = {d["key"]: d["new"] for d in json.loads(r.stdout)["deltas"]}
    assert new["OSC_TITLE"] == EVIL["OSC_TITLE"]  # exact data for machines


def test_render_verdict_and_progress_survive_markup_and_escapes_in_any_field(monkeypatch):
    # rich markup in a value ("[/x]") crashed render_diff/render_verdict; escapes reached the terminal
    from envbisect.runs.bisect import BisectResult
    from envbisect.trials.diagnose import Layer, PathReport
    from envbisect.search import Verdict
    from envbisect.trials.runner import Trial

    from envbisect.cli import render
    from envbisect.cli.environment import Environment

    buf, ebuf = io.StringIO(), io.StringIO()
    env = Environment(stdout=buf, stderr=ebuf)
    evil = "[/x] [bold]b[/bold] \x1b]0;pwned\x07 \x1b[2J :x: \u202e HF_TOKEN=abcdefgh123 " + GH
    trial = Trial(1, "premise " + evil, ("u",), ("u",), "fail", "reason " + evil)
    for kind in ("not-config", "not-reproduced", "inconclusive", "culprit"):
        v = Verdict(kind, ("u",) if kind == "culprit" else (), 0.9, (("u", 0.5),), "why " + evil)
        report = PathReport((Layer("layer " + evil, "http://x/[/y]", False, "reason " + evil),), "x", "end " + evil)
        result = BisectResult("r1", v, (trial,), "original", {"u": ("u[/x]",)}, report, ("drift " + evil,), None,
                              ("note " + evil,))
        render.render_verdict(env, result)
    progress = render.Progress(env, quiet=False)
    progress("trial-start", {"n": 1, "purpose": evil, "config": [evil], "total_deltas": 2})
    progress("trial-end", {"trial": trial})
    progress("step", {"message": evil})
    progress("warning", {"message": evil})
    text = buf.getvalue() + ebuf.getvalue()
    for bad in ("\x1b", "\x07", "\u202e", "abcdefgh123", GH[4:]):
        assert bad not in text, repr(bad)
    assert "[/x]" in text and "\\x1b]0;pwned" in text and "HF_TOKEN=••••(masked" in text


def test_debug_logs_are_redacted(monkeypatch, tmp_path):
    # -vv logs (ours and paramiko's) pass through the same masker as everything else
    import logging

    from envbisect.cli.environment import Environment, RedactingFormatter

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(RedactingFormatter(Environment(), "%(levelname)s %(name)s: %(message)s"))
    log = logging.getLogger("envbisect.test-redaction")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        log.debug("round trip 1: HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123 curl https://u:p@ss@h/ %s", GH)
        try:
            raise RuntimeError(f"boom {AWS}")
        except RuntimeError:
            log.exception("failed \x1b[31m")
    finally:
        log.removeHandler(handler)
    text = stream.getvalue()
    assert "hf_abcdefghij" not in text and "p@ss" not in text and GH not in text and AWS not in text
    assert "\x1b" not in text and "\\x1b[31m" in text and "RuntimeError" in text
