"""envbisect(1), generated from the CLI itself: the Typer app's click commands and their options
(names, metavars, help, defaults) as click sees them, and the exit-status table of errors.py. The
page is deterministic (no date, no terminal width), so `scripts/manpage.py --check` and the test
can tell a stale docs/envbisect.1 from a true one."""
from __future__ import annotations

from typing import Any, Iterable

from envbisect import __version__
from envbisect.errors import EVERY, EXIT_STATUS_DOC

_TYPES = {"str": "TEXT", "int": "INT", "float": "FLOAT", "Path": "PATH", "bool": "BOOL"}

ENVIRONMENT = (
    ("NO_COLOR", "Any non-empty value: no colour or other terminal styling (https://no-color.org); as --no-color."),
    ("FORCE_COLOR", "Style the output even when it is not a terminal (rich's convention); NO_COLOR wins."),
    ("_ENVBISECT_COMPLETE", "Set by the completion script (--show-completion) when the shell asks for completions."),
    ("ENVBISECT_CRONTAB", "The crontab command `schedule --cron --install` runs (default: crontab)."),
)


def esc(text: Any) -> str:
    """Text for roff: backslashes and hyphens escaped, and no line starting with a control character."""
    out = str(text).replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(("\\&" + ln) if ln[:1] in (".", "'") else ln for ln in out.split("\n"))


def _metavar(p: Any) -> str:
    if getattr(p, "is_flag", False) or getattr(p, "count", False):
        return ""
    if p.metavar:
        return p.metavar
    import typing

    ann = getattr(getattr(p, "type_descriptor", None), "annotation", None)
    while typing.get_args(ann):  # Optional[str], List[str]: the type of one value
        ann = next(a for a in typing.get_args(ann) if a is not type(None))
    name = getattr(ann, "__name__", "str")
    return _TYPES.get(name, name.upper())


def _option(p: Any) -> list[str]:
    names = ", ".join(esc(o) for o in [*p.opts, *p.secondary_opts])
    mv = _metavar(p)
    head = f"\\fB{names}\\fR" + (f" \\fI{esc(mv)}\\fR" if mv else "")
    text = " ".join((p.help or "").split())
    default = p.default
    if (default not in (None, False, "", (), []) and not getattr(p, "count", False)
            and not getattr(p, "is_flag", False) and not callable(default)):
        text += f" [default: {default}]"
    return [".TP", head, esc(text)]


def _params(cmd: Any) -> tuple[list[Any], list[Any]]:
    opts = [p for p in cmd.params if p.param_type_name == "option" and not p.hidden]
    args = [p for p in cmd.params if p.param_type_name == "argument"]
    return opts, args


def _usage(name: str, cmd: Any) -> str:
    _, args = _params(cmd)
    words = [f"\\fBenvbisect {esc(name)}\\fR", "[\\fIOPTIONS\\fR]"]
    for a in args:
        mv = esc((a.metavar or a.name).upper())
        words.append(f"[\\fI{mv}\\fR...]" if a.nargs == -1 and not a.required else
                     f"\\fI{mv}\\fR..." if a.nargs == -1 else f"\\fI{mv}\\fR")
    return " ".join(words)


def _lines(items: Iterable[str]) -> str:
    return "\n".join(items) + "\n"


def man_page() -> str:
    from typer.main import get_command

    from envbisect.cli.app import app

    group = get_command(app)
    out = [f'.TH ENVBISECT 1 "" "envbisect {esc(__version__)}" "User Commands"',
           ".SH NAME", "envbisect \\- " + esc(group.help or ""),
           ".SH SYNOPSIS",
           "\\fBenvbisect\\fR [\\fIGLOBAL OPTIONS\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR] [\\fIARGS\\fR]",
           ".SH DESCRIPTION",
           esc("envbisect snapshots a serving stack's hosts over SSH, diffs them against a known-good baseline, "
               "and bisects the deltas on the live hosts with full ordered co-restarts and a probe, after checking "
               "its premises (the baseline must pass, the current state must fail). Verdicts: culprit, "
               "interaction, not-config, not-reproduced, inconclusive. Errors are one line on stderr; every "
               "reporting command takes --json; secrets are masked in every output."),
           ".SH GLOBAL OPTIONS"]
    opts, _ = _params(group)
    for p in opts:
        out += _option(p)
    out.append(".SH COMMANDS")
    for name, cmd in group.commands.items():
        out += [f'.SS "envbisect {esc(name)}"', _usage(name, cmd), ".PP", esc(" ".join((cmd.help or "").split()))]
        c_opts, args = _params(cmd)
        for a in args:
            text = " ".join((getattr(a, "help", "") or "").split())
            out += [".TP", f"\\fI{esc((a.metavar or a.name).upper())}\\fR", esc(text)]
        for p in c_opts:
            out += _option(p)
    out.append(".SH ENVIRONMENT")
    for var, text in ENVIRONMENT:
        out += [".TP", f"\\fB{esc(var)}\\fR", esc(text)]
    out += [".SH EXIT STATUS", esc("One table for every command (README.md and docs/guide.md hold the same):")]
    for st, (meaning, cmds) in EXIT_STATUS_DOC.items():
        who = "every command" if cmds == EVERY else ", ".join(cmds)
        out += [".TP", f"\\fB{int(st)}\\fR ({esc(st.name)})", esc(f"{meaning.replace('`', '')} ({who})")]
    out += [".SH FILES", ".TP", "\\fIenvbisect.toml\\fR", esc("The playbook (--playbook): hosts, services, probes."),
            ".TP", "\\fIsnapshots/\\fR", esc("The store (--store): snapshots, blobs, runs, crash logs (private)."),
            ".SH SEE ALSO", esc("docs/guide.md, docs/playbook.md, docs/search.md, docs/safety.md in the source tree; "
                                "ssh_config(5), systemd.timer(5), crontab(5)")]
    return _lines(out)


__all__ = ["man_page"]
