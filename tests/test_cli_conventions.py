"""The conventions of the tools on-call engineers use (kubectl, git, httpie, ansible; clig.dev), each
through the CLI: shell completion, NO_COLOR / --no-color, -q/--quiet, --dry-run on revert, apply and
restore (hosts byte-identical, no lock, no journal, no run recorded), --events FILE|- (one JSON
object a line), the generated man page, and the one exit-status table. The deployment is the real
CLI stack of tests/clistack.py (a host tree through `ssh = "local"`, a command probe that fails
while decode's env file holds BAD)."""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from clistack import ENVBISECT
from hosttree import DECODE
from test_cli_inprocess import FAILS_ON_BAD, Captured, base, cli, health, stack  # noqa: F401 - fixtures

from envbisect.cli.app import run
from envbisect.cli.environment import Environment
from envbisect.errors import ExitStatus
from envbisect.hosts.journal import made_path, remote_paths

ROOT = Path(__file__).resolve().parent.parent
ANSI = "\x1b["


def cli_env(*args: str, **env_kw) -> tuple[int, Captured]:
    c = Captured()
    c.env = Environment(stdout=c.stdout, stderr=c.stderr, stdin=io.StringIO(), width=200, **env_kw)
    return run(list(args), c.env), c


def fingerprint(root: Path) -> dict[str, tuple[str, int, int]]:
    """Every file under root: bytes, mode and mtime."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p)] = (hashlib.sha256(p.read_bytes()).hexdigest(), st.st_mode, st.st_mtime_ns)
    return out


def host_lock_state(name: str) -> dict[str, bytes | None]:
    """The deployment's lock, journal and made-record on the (local) host."""
    paths = [*remote_paths(name), made_path(name)]
    return {p: (Path(os.path.expanduser(p)).read_bytes() if Path(os.path.expanduser(p)).exists() else None)
            for p in paths}


def runs_in(store: Path) -> list[str]:
    return sorted(p.name for p in (store / "runs").iterdir()) if (store / "runs").exists() else []


def culprit_found(stack) -> str:  # noqa: ANN001
    """noon snapshot, BAD planted, a bisection that names decode:BAD (hosts left as found)."""
    b = base(stack)
    assert cli(*b, "snapshot", "--label", "noon")[0] == 0
    stack.tree.edit("decode", DECODE + "export BAD=1\nexport OTHER=2\n")
    rc, c = cli(*b, "bisect", "--against", "noon", "--json")
    assert rc == 0, c.err
    doc = json.loads(c.out)
    assert doc["culprits"] == ["decode:BAD"]
    return doc["run"]


# --- completion ----------------------------------------------------------------------------------

def test_show_completion_bash_completes_commands_and_options_in_a_real_bash(tmp_path):
    r = subprocess.run([*ENVBISECT, "--show-completion", "bash"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "_ENVBISECT_COMPLETE=complete_bash" in r.stdout, r.stderr
    script = tmp_path / "envbisect.bash"
    script.write_text(r.stdout)
    # `envbisect` on PATH is this interpreter's console script, as an installed envbisect would be
    binj = Path(sys.executable).parent
    assert (binj / "envbisect").exists()
    words = {"envbisect sna": 1, "envbisect revert --dr": 2}
    for line, cword in words.items():
        out = subprocess.run(["bash", "-c", f'source {script}; COMP_WORDS=({line}); COMP_CWORD={cword}; '
                              '_envbisect_completion envbisect; printf "%s\\n" "${COMPREPLY[@]}"'],
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PATH": f"{binj}:{os.environ['PATH']}"})
        got = set(out.stdout.split())
        assert got == ({"snapshot", "snapshots"} if "sna" in line else {"--dry-run"}), (line, out.stdout, out.stderr)
    r = subprocess.run([*ENVBISECT, "--show-completion", "zsh"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("#compdef envbisect")
    rc, c = cli("--show-completion", "tcsh")
    assert rc == ExitStatus.USAGE and c.err.count("\n") == 1 and "one of bash" in c.err


def test_install_completion_writes_the_script_under_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    r = subprocess.run([*ENVBISECT, "--install-completion", "bash"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "HOME": str(home)})
    assert r.returncode == 0 and "bash completion installed in" in r.stdout, r.stderr
    script = home / ".bash_completions" / "envbisect.sh"
    assert "_ENVBISECT_COMPLETE=complete_bash" in script.read_text()
    assert str(script) in (home / ".bashrc").read_text()


def test_show_completion_writes_to_the_injected_stdout():
    rc, c = cli("--show-completion", "fish")
    assert rc == 0 and "complete --command envbisect" in c.out and c.err == ""


# --- NO_COLOR / --no-color ---------------------------------------------------------------------------

def test_no_color_and_the_no_color_flag_leave_no_ansi_escapes(stack):
    b = base(stack)
    assert cli(*b, "snapshot", "--label", "noon")[0] == 0
    stack.tree.edit("decode", DECODE + "export BAD=1\n")
    # control: on a terminal, the diff is styled
    rc, c = cli_env(*b, "diff", "--against", "noon", force_terminal=True, environ={})
    assert rc == ExitStatus.DELTAS and ANSI in c.out
    rc, c = cli_env(*b, "diff", "--against", "noon", force_terminal=True, environ={"NO_COLOR": ""})
    assert ANSI in c.out  # NO_COLOR set but empty: no-color.org says colour stays
    for how in ({"environ": {"NO_COLOR": "1"}}, {"environ": {"NO_COLOR": "anything"}}):
        rc, c = cli_env(*b, "diff", "--against", "noon", force_terminal=True, **how)
        assert rc == ExitStatus.DELTAS and "+ BAD=1" in c.out and ANSI not in c.out + c.err, how
    rc, c = cli_env(*b, "--no-color", "bisect", "--against", "noon", force_terminal=True, environ={})
    assert rc == ExitStatus.OK and "CULPRIT" in c.out and "trial 1" in c.err
    assert ANSI not in c.out + c.err
    rc, c = cli_env(*b, "--no-color", "diff", "--against", "nosuch", force_terminal=True, environ={})
    assert rc == ExitStatus.USAGE and ANSI not in c.err
    # the real process: FORCE_COLOR makes rich style a pipe; NO_COLOR wins over it
    r = stack.cli("snapshots", env={**os.environ, "FORCE_COLOR": "1", "NO_COLOR": ""})
    assert ANSI in r.stdout.decode()
    r = stack.cli("snapshots", env={**os.environ, "FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert r.returncode == 0 and ANSI not in r.stdout.decode() + r.stderr.decode()


# --- -q / --quiet --------------------------------------------------------------------------------------

def test_quiet_prints_only_the_result_lines(stack):
    b = base(stack)
    rc, c = cli(*b, "-q", "snapshot", "--label", "noon", "--probe", "p")
    assert rc == 0 and c.err == ""
    assert [ln.split()[0] for ln in c.out.splitlines()] == ["snapshot", "probe"], c.out
    stack.tree.edit("decode", DECODE + "export BAD=1\nexport OTHER=2\n")
    rc, c = cli(*b, "--quiet", "diff", "--against", "noon")
    assert rc == ExitStatus.DELTAS and c.out.split() == ["decode:BAD", "decode:OTHER"] and c.err == ""
    rc, c = cli(*b, "-q", "bisect", "--against", "noon")
    assert rc == ExitStatus.OK and c.err == "", c.err  # no progress lines
    lines = c.out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("verdict: CULPRIT") and lines[1].endswith("decode:BAD"), c.out
    rc, c = cli(*b, "-q", "diff", "--against", "nosuch")
    assert rc == ExitStatus.USAGE and c.out == "" and c.err.count("\n") == 1  # errors still show


# --- --dry-run on revert, apply, restore -----------------------------------------------------------

def test_revert_and_apply_dry_run_touch_no_host_lock_journal_or_run(stack):
    b = base(stack)
    culprit_found(stack)
    tree, lock, runs = fingerprint(stack.tree.root), host_lock_state(stack.name), runs_in(stack.store)
    decode = str(stack.tree.env("decode"))
    rc, c = cli(*b, "revert", "decode:BAD", "--dry-run")
    assert rc == 0, c.err
    assert f"would revert decode:BAD on node1: {decode} (BAD: 1 → unset)" in c.out, c.out
    assert "then co-restart: stop" in c.out and "dry run: no host was touched" in c.out
    rc, c = cli(*b, "revert", "--verdict", "--dry-run", "--json")
    plan = json.loads(c.out)
    assert rc == 0 and plan["dry_run"] and plan["changes"][0]["path"] == decode and plan["deltas"] == ["decode:BAD"]
    rc, c = cli(*b, "apply", "decode:BAD", "--dry-run")
    assert rc == 0 and "decode:BAD: already applied on the hosts (no change)" in c.out, c.out
    assert (fingerprint(stack.tree.root), host_lock_state(stack.name), runs_in(stack.store)) == (tree, lock, runs)

    rc, c = cli(*b, "revert", "decode:BAD")  # for real: now apply has something to put back
    assert rc == 0, c.err
    tree, lock, runs = fingerprint(stack.tree.root), host_lock_state(stack.name), runs_in(stack.store)
    rc, c = cli(*b, "apply", "decode:BAD", "--dry-run")
    assert rc == 0 and f"would apply decode:BAD on node1: {decode} (BAD: unset → 1)" in c.out, c.out
    rc, c = cli(*b, "apply", "nosuch", "--dry-run")
    assert rc == ExitStatus.USAGE and "no delta 'nosuch'" in c.err
    assert (fingerprint(stack.tree.root), host_lock_state(stack.name), runs_in(stack.store)) == (tree, lock, runs)


def test_restore_dry_run_after_a_crash_says_what_it_would_put_back_and_touches_nothing(stack):
    b = base(stack)
    assert cli(*b, "snapshot", "--label", "noon")[0] == 0
    stack.tree.edit("decode", DECODE + "export BAD=1\n")
    before_run = fingerprint(stack.tree.conf)
    r = stack.cli("bisect", "--against", "noon", env={**os.environ, "ENVBISECT_TEST_CRASH_AT": "write:1"})
    assert r.returncode == -9, r.stderr.decode()[-500:]  # SIGKILLed mid-edit: the journal is active
    tree, lock, runs = fingerprint(stack.tree.root), host_lock_state(stack.name), runs_in(stack.store)
    assert lock[remote_paths(stack.name)[1]] is not None
    rc, c = cli(*b, "restore", "--dry-run")
    assert rc == 0, c.err
    assert f"would restore node1:{stack.tree.env('decode')} from run {runs[-1]}" in c.out, c.out
    assert "dry run: no host was touched" in c.out
    rc, c = cli(*b, "restore", "--dry-run", "--json")
    doc = json.loads(c.out)
    assert doc["dry_run"] and doc["run"] == runs[-1] and not doc["restored"]
    assert (fingerprint(stack.tree.root), host_lock_state(stack.name), runs_in(stack.store)) == (tree, lock, runs)
    rc, c = cli(*b, "restore")  # the real one still has everything it needs
    assert rc == 0 and "restored" in c.out, c.err
    assert fingerprint(stack.tree.conf) == before_run
    rc, c = cli(*b, "restore", "--dry-run")
    assert rc == 0 and "nothing to undo" in c.out


# --- --events FILE|- ---------------------------------------------------------------------------------

def test_events_to_stdout_are_one_json_object_a_line_with_trials_and_the_verdict(stack):
    b = base(stack)
    assert cli(*b, "snapshot", "--label", "noon")[0] == 0
    stack.tree.edit("decode", DECODE + "export BAD=1\n")
    rc, c = cli(*b, "--events", "-", "bisect", "--against", "noon")
    assert rc == 0, c.err
    events = [json.loads(line) for line in c.out.splitlines()]  # every line parses
    assert events and all({"event", "time"} <= set(e) for e in events)
    kinds = [e["event"] for e in events]
    assert {"trial-start", "trial-end", "verdict"} <= set(kinds) and kinds[-1] == "verdict"
    assert kinds.index("trial-start") < kinds.index("trial-end")
    ends = [e for e in events if e["event"] == "trial-end"]
    assert all(e["trial"]["outcome"] in ("pass", "fail") for e in ends)
    assert events[-1]["culprits"] == ["decode:BAD"] and events[-1]["exit_status"] == 0
    assert "verdict: CULPRIT" in c.err and "trial 1" in c.err  # people read stderr meanwhile

    # a file (appended), beside --json on stdout; the events are masked like every output
    path = stack.store.parent / "events.jsonl"
    rc, c = cli(*b, "--events", str(path), "bisect", "--against", "noon", "--json")
    assert rc == 0 and json.loads(c.out)["verdict"] == "culprit"
    lines = path.read_text().splitlines()
    assert [json.loads(x)["event"] for x in lines][-1] == "verdict"
    rc, c = cli(*b, "--events", "-", "diff", "--against", "noon", "--json")
    assert rc == ExitStatus.USAGE and "--events - and --json" in c.err and c.out == ""
    rc, c = cli(*b, "--events", str(stack.store.parent / "no" / "such" / "dir"), "snapshots")
    assert rc == ExitStatus.USAGE and c.err.count("\n") == 1


# --- the man page and the exit-status table -------------------------------------------------------

def test_the_man_page_is_what_the_cli_generates():
    from envbisect.cli.manpage import man_page

    committed = (ROOT / "docs" / "envbisect.1").read_text()
    assert man_page() == committed, "docs/envbisect.1 is stale: run scripts/manpage.py"
    for cmd in ("snapshot", "diff", "bisect", "revert", "apply", "restore"):
        assert f'.SS "envbisect {cmd}' in committed
    assert "NO_COLOR" in committed and ".SH EXIT STATUS" in committed and "\\-\\-dry\\-run" in committed
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "manpage.py"), "--check"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def _table(text: str, heading: str) -> list[list[str]]:
    """The first markdown table after `heading`, as rows of cells (header and rule dropped)."""
    part = text[text.index(heading):]
    rows = []
    for line in part.splitlines()[1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    return rows[2:]


def test_one_exit_status_table_every_command_follows():
    from envbisect.cli.app import app
    from envbisect.errors import EXIT_STATUS_DOC, exit_status_table
    from typer.main import get_command

    commands = set(get_command(app).commands)
    readme, guide = (ROOT / "README.md").read_text(), (ROOT / "docs" / "guide.md").read_text()
    # the table is errors.py's, word for word, in both
    assert exit_status_table() in readme and exit_status_table() in guide
    rows = _table(readme, "## Exit status")
    assert [int(r[0]) for r in rows] == [int(s) for s in EXIT_STATUS_DOC]  # every ExitStatus, in order
    for r in rows:
        from envbisect.errors import ExitStatus as ES

        assert ES(int(r[0])).name == r[1].strip("`")
        for cmd in re.findall(r"`([a-z]+)", r[3]):
            assert cmd in commands or cmd == "every", (cmd, r)
    # the per-command statuses of the commands table name only statuses of the enum
    valid = {int(s) for s in ExitStatus}
    documented = set()
    for r in _table(readme, "## Commands"):
        for seg in re.findall(r"`([^`]+)`", r[0]):  # `envbisect runs` / `show RUN`: runs and show
            words = [w for w in seg.split() if w != "envbisect"]
            words = words[2:] if words[:1] == ["-p"] else words
            if words and words[0] in commands:
                documented.add(words[0])
        nums = {int(n) for n in re.findall(r"\b(\d+)\b", r[2])}
        assert (nums and nums <= valid) or r[2] == "as bisect", r
    assert commands <= documented, commands - documented


def test_an_events_file_is_created_private_and_a_symlink_is_refused(stack, tmp_path):  # noqa: F811
    """--events FILE holds what a run did (hosts, paths, reasons): created 0600, never followed
    through a symlink (one planted in a shared folder would make envbisect write where it points)."""
    import os
    import stat

    ev = tmp_path / "events.jsonl"
    rc, c = cli(*base(stack), "--events", str(ev), "snapshots")
    assert rc == ExitStatus.OK, c.err
    assert stat.S_IMODE(os.stat(ev).st_mode) == 0o600
    target = tmp_path / "elsewhere"
    target.write_text("")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    rc, c = cli(*base(stack), "--events", str(link), "snapshots")
    assert rc == ExitStatus.USAGE and c.err.count("\n") == 1 and "symlink" in c.err, c.err
    assert target.read_text() == ""
