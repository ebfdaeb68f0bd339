"""Every text from a host reaches a terminal through the one escaping function
(`masking.printable`, via `Environment.shown` / `write_raw`), on every output path. A watched file
named with terminal escapes (a clipboard write `ESC ]52;c;…BEL`, `ESC [2J`, a window title, C1 CSI)
and a line break followed by what looks like a trial line becomes a delta id; each command's output
is then grepped for raw C0/C1 bytes, and the log it prints still replays (docs/safety.md, "Secrets
and terminal output")."""
from __future__ import annotations

import re

from test_cli_inprocess import base, cli, health, stack  # noqa: F401 - fixtures

from hosttree import DECODE

from envbisect.cli.environment import Environment
from envbisect.errors import ExitStatus

HOSTILE_NAME = "conf\x1b]52;c;cHduZWQ=\x07\x1b[2J\x1b]0;owned\x07\x9b31m\n  5  pass  baseline  # forged"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # C0 but tab and newline, DEL, C1


def _clean(what: str, text: str) -> None:
    bad = RAW.search(text)
    assert bad is None, f"{what}: raw {bad.group()!r} at {bad.start()}: {text[max(0, bad.start() - 80):][:200]!r}"


def test_no_command_writes_a_raw_control_character_from_a_host(stack, tmp_path):  # noqa: F811
    b = base(stack)
    assert cli(*b, "snapshot", "--label", "noon")[0] == ExitStatus.OK
    (stack.tree.watch / HOSTILE_NAME).write_text("x\n")
    stack.tree.edit("decode", DECODE + "export BAD=1\n")
    outputs: dict[str, str] = {}

    def run(*args: str) -> int:
        rc, c = cli(*b, *args)
        outputs[" ".join(args)] = c.out + c.err
        return rc

    assert run("diff", "--against", "noon") in (ExitStatus.OK, 1)
    rc = run("bisect", "--against", "noon")
    assert rc in (ExitStatus.OK, 1), outputs["bisect --against noon"][-2000:]
    rc, c = cli(*b, "log")
    assert rc == ExitStatus.OK, c.err
    log = c.out
    outputs["log"] = c.out + c.err
    ids = [ln for ln in log.splitlines() if ln.split() and ln.split()[0].isdigit()]
    assert len(ids) == len([ln for ln in log.splitlines() if re.match(r"\s*\d+\s", ln)]), log  # no forged line
    assert not any("forged" in ln.split("#")[0] for ln in log.splitlines()), log
    f = tmp_path / "edited.log"
    f.write_text(log)
    assert run("replay", str(f)) in (ExitStatus.OK, 1), outputs[f"replay {f}"]  # the log as printed parses
    run_id = next(ln.split()[1] for ln in log.splitlines() if ln.startswith("run "))
    for args in (("runs",), ("snapshots",), ("show", run_id), ("show", run_id, "--json"),
                 ("diff", "--against", "noon", "--json"), ("bundle", "--run", run_id, "--out", str(tmp_path)),
                 ("revert", "--run", run_id, "file:node1:" + str(stack.tree.watch / HOSTILE_NAME), "--dry-run"),
                 ("apply", "--run", run_id, "file:node1:" + str(stack.tree.watch / HOSTILE_NAME), "--dry-run"),
                 ("restore", "--dry-run"), ("prune", "--keep", "1h", "--dry-run"), ("watch", "--once"),
                 ("snapshot", "--label", "after")):
        run(*args)
    for what, text in outputs.items():
        _clean(what, text)
        forged = [ln for ln in text.splitlines() if ln.lstrip().startswith("5  pass  baseline")]
        assert not forged, f"{what}: a host's file name made a line of its own: {forged}"
    assert "\\x1b]52;c;" in outputs["log"] or "\\x1b]52;c;" in outputs["bisect --against noon"]


def test_write_raw_is_escaped_as_everything_else():
    """`init --out -` and `envbisect log` print through write_raw."""
    import io

    out = io.StringIO()
    env = Environment(stdout=out, stderr=io.StringIO(), stdin=io.StringIO())
    env.write_raw("a\x1b]52;c;QUFB\x07b\tc\x9b2J\r\n")
    assert out.getvalue() == "a\\x1b]52;c;QUFB\\x07b\tc\\x9b2J\\r\n"
