"""Baselines that exist: `envbisect schedule` runs `envbisect snapshot --label auto` on a timer.

Where systemd runs (``/run/systemd/system`` exists and ``systemctl`` is on PATH) it is a systemd
*user* timer + service (``~/.config/systemd/user/envbisect-snapshot-NAME.{service,timer}``);
elsewhere a crontab line. ``install`` writes the units (the `systemctl --user enable --now`
command is printed, never run) or adds the line to the user's crontab through ``crontab -l`` /
``crontab -`` (``ENVBISECT_CRONTAB`` names another crontab command: tests use a fake one).

The scheduled command carries the same playbook, store, ssh config and inventory as the
`schedule` command was given, as absolute paths: it does not depend on the folder it runs in.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbisect import __version__
from envbisect.errors import UsageError
from envbisect.inputs.playbook import load_playbook
from envbisect.state.prune import parse_duration
from envbisect.state.store import private_dir, write_file

CRONTAB_ENV = "ENVBISECT_CRONTAB"
MAX_EVERY_S = 365 * 86400  # a snapshot less often than yearly is a typo (99999999999999d made a 19-digit timer)
MARKER = "# envbisect schedule:"  # the crontab comment line above our job line


def envbisect_command() -> list[str]:
    """How to run this envbisect from a timer: the console script next to this interpreter, or
    ``python -m envbisect.cli`` (both absolute; a venv keeps working without being activated)."""
    script = Path(sys.executable).parent / "envbisect"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "envbisect.cli"]


def systemd_present() -> bool:
    return Path("/run/systemd/system").is_dir() and shutil.which("systemctl") is not None


def unit_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def absolute_path(path: str | Path) -> Path:
    """The path a timer or cron job must be given: absolute, ~ expanded (it runs elsewhere)."""
    return Path(os.path.abspath(os.path.expanduser(str(path))))


def slug(name: str) -> str:
    """A deployment name as a file or unit name can hold it."""
    s = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")
    return (s or "deployment")[:60]


def _span(seconds: float) -> str:
    s = int(seconds)
    for unit, n in (("d", 86400), ("h", 3600), ("min", 60)):
        if s % n == 0:
            return f"{s // n}{unit}"
    return f"{s}s"


def cron_expression(seconds: float) -> str:
    """Every N minutes/hours as cron can say it (a divisor of an hour or of a day, a day, a week)."""
    s = int(seconds)
    if s != seconds or s < 60 or s % 60:
        raise UsageError(f"--every {_span(seconds)}: cron runs jobs on whole minutes (at least 1m)")
    m = s // 60
    if m < 60 and 60 % m == 0:
        return "* * * * *" if m == 1 else f"*/{m} * * * *"
    if m % 60 == 0:
        h = m // 60
        if h < 24 and 24 % h == 0:
            return "0 * * * *" if h == 1 else f"0 */{h} * * *"
        if h == 24:
            return "0 0 * * *"
        if h == 24 * 7:
            return "0 0 * * 0"
    raise UsageError(f"--every {_span(seconds)}: cron cannot repeat that evenly; use a divisor of an hour "
                     "(15m, 30m) or of a day (1h, 2h, 6h, 12h), 1d or 1w, or a systemd timer")


def one_line_word(word: str) -> None:
    """A crontab entry and a unit setting are one line each: a line break (or another control
    character) in a path would end it and start a line of its own, a job or a setting nobody wrote."""
    if re.search(r"[\x00-\x1f\x7f]", word):
        raise UsageError(f"{word!r}: a path with a line break or control character cannot go in a crontab line "
                         "or a systemd unit; rename it")


def systemd_word(arg: str) -> str:
    """One ExecStart= argument: quoted where needed; % and $ escaped (specifiers, variables)."""
    a = arg.replace("%", "%%").replace("$", "$$")
    if a and not re.search(r"[\s\"'\\;]", a):
        return a
    return '"' + a.replace("\\", "\\\\").replace('"', '\\"') + '"'


def cron_word(arg: str) -> str:
    """One argument of a crontab command, shell-quoted."""
    return shlex.quote(arg).replace("%", "\\%")  # an unescaped % ends a cron command


@dataclass
class Schedule:
    kind: str  # systemd | cron
    every_s: float
    label: str
    deployment: str
    command: list[str]
    unit: str  # envbisect-snapshot-NAME
    files: dict[str, str] = field(default_factory=dict)  # systemd: path -> content
    cron_line: str = ""
    cron_marker: str = ""
    log: str = ""  # cron: where the job's output goes

    @property
    def enable_command(self) -> str:
        return f"systemctl --user daemon-reload && systemctl --user enable --now {self.unit}.timer"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "every_s": self.every_s, "label": self.label, "deployment": self.deployment,
                "command": self.command, "unit": self.unit if self.kind == "systemd" else None,
                "files": self.files, "cron_line": self.cron_line or None,
                "enable": self.enable_command if self.kind == "systemd" else None}


def make_schedule(*, every: str, label: str, playbook: Path, store: Path, ssh_config: str | None,
                  inventory: str | None, kind: str | None = None, probe: str | None = None) -> Schedule:
    """`probe`: each snapshot also probes the running stack (`snapshot --probe`), so the timer
    records observed known-goods for `--since last-good`."""
    every_s = parse_duration(every, "--every", most=MAX_EVERY_S)
    if every_s < 60:
        raise UsageError(f"--every {every}: at least 1m (a snapshot is one SSH round trip per host, not free)")
    if not label or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}", label):
        raise UsageError(f"--label {label!r}: letters, digits, '_', '.', '-' (at most 40)")
    pb_path = absolute_path(playbook)
    pb = load_playbook(pb_path)  # a scheduled run of a broken playbook would fail every hour, silently
    if probe is not None and probe not in pb.probes:
        raise UsageError(f"--probe {probe}: no such probe in {pb_path} (known: {', '.join(pb.probes) or 'none'})")
    args = ["-p", str(pb_path), "--store", str(absolute_path(store))]
    if ssh_config:
        p = absolute_path(ssh_config)
        if not p.is_file():
            raise UsageError(f"--ssh-config {ssh_config}: no such file")
        args += ["--ssh-config", str(p)]
    if inventory:
        if inventory == "-":
            raise UsageError("--inventory -: a scheduled snapshot has no stdin; give the inventory file")
        p = absolute_path(inventory)
        if not p.exists():
            raise UsageError(f"--inventory {inventory}: no such file")
        args += ["--inventory", str(p)]
    command = envbisect_command() + args + ["snapshot", "--label", label] + (["--probe", probe] if probe else [])
    for word in [*command, str(absolute_path(store) / "schedule.log")]:
        one_line_word(word)
    if kind is None:
        kind = "systemd" if systemd_present() else "cron"
    unit = f"envbisect-snapshot-{slug(pb.name)}"
    sch = Schedule(kind, every_s, label, pb.name, command, unit)
    if kind == "systemd":
        d = unit_dir()
        exec_start = " ".join(systemd_word(a) for a in command)
        path_env = ":".join(dict.fromkeys([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"]))
        head = f"# Written by `envbisect schedule` (envbisect {__version__}) for {pb_path}\n"
        sch.files[str(d / f"{unit}.service")] = (
            head
            + "[Unit]\n"
            + f"Description=envbisect snapshot of {pb.name} (a baseline for `envbisect diff --since`)\n\n"
            + "[Service]\nType=oneshot\n"
            + f"Environment={systemd_word('PATH=' + path_env)}\n"
            + f"ExecStart={exec_start}\n")
        sch.files[str(d / f"{unit}.timer")] = (
            head
            + "[Unit]\n"
            + f"Description=envbisect snapshot of {pb.name} every {_span(every_s)}\n\n"
            + "[Timer]\n"
            + "OnActiveSec=1min\n"  # once soon after enabling (and after each boot/login)
            + f"OnUnitActiveSec={_span(every_s)}\n"
            + "AccuracySec=1min\n\n"
            + "[Install]\nWantedBy=timers.target\n")
    elif kind == "cron":
        log = str(absolute_path(store) / "schedule.log")
        sch.log = log
        sch.cron_marker = f"{MARKER} {pb.name} {pb_path}"
        sch.cron_line = (f"{cron_expression(every_s)} " + " ".join(cron_word(a) for a in command)
                         + f" >> {cron_word(log)} 2>&1")
    else:
        raise UsageError(f"unknown scheduler {kind!r}")
    return sch


@dataclass
class Installed:
    changed: list[str]  # files written / "crontab"
    unchanged: list[str]
    next_steps: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"changed": self.changed, "unchanged": self.unchanged, "next_steps": self.next_steps}


def install(sch: Schedule) -> Installed:
    if sch.kind == "systemd":
        return _install_systemd(sch)
    return _install_cron(sch)


def _install_systemd(sch: Schedule) -> Installed:
    changed, unchanged = [], []
    for path, text in sch.files.items():
        p = Path(path)
        try:
            if p.is_file() and not p.is_symlink() and p.read_text() == text:
                unchanged.append(path)
                continue
            p.parent.mkdir(parents=True, exist_ok=True)
            write_file(p, text.encode(), 0o644)
        except OSError as e:
            raise UsageError(f"{path}: cannot write the unit: {e.strerror or e}") from None
        changed.append(path)
    steps = [sch.enable_command, f"loginctl enable-linger {_user()}   # so it also runs while you are logged out"]
    return Installed(changed, unchanged, steps)


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def crontab_command() -> list[str] | None:
    override = os.environ.get(CRONTAB_ENV)
    if override:
        return shlex.split(override)
    found = shutil.which("crontab")
    return [found] if found else None


def _install_cron(sch: Schedule) -> Installed:
    cmd = crontab_command()
    if cmd is None:
        raise UsageError("crontab is not installed here: add this line with the scheduler you have: "
                         + sch.cron_line)
    try:
        cur = subprocess.run([*cmd, "-l"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UsageError(f"{' '.join(cmd)} -l: {e}") from None
    if cur.returncode != 0:
        if "no crontab" not in (cur.stderr or "").lower():
            last = (cur.stderr or "").strip().splitlines()
            raise UsageError(f"{' '.join(cmd)} -l failed: {last[-1] if last else f'exit status {cur.returncode}'}")
        lines: list[str] = []
    else:
        lines = cur.stdout.splitlines()
    kept: list[str] = []
    skip_next = False
    for line in lines:  # our earlier entry for the same playbook is replaced, not repeated
        if skip_next:
            skip_next = False
            continue
        if line.strip() == sch.cron_marker:
            skip_next = True
            continue
        kept.append(line)
    new = kept + [sch.cron_marker, sch.cron_line]
    try:  # the job's `>> STORE/schedule.log` needs the folder before the first snapshot makes it
        private_dir(Path(sch.log).parent)
    except OSError as e:
        raise UsageError(f"{Path(sch.log).parent}: cannot create the store: {e.strerror or e}") from None
    if new == lines:
        return Installed([], ["crontab"], [])
    try:
        w = subprocess.run([*cmd, "-"], input="\n".join(new) + "\n", capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UsageError(f"{' '.join(cmd)} -: {e}") from None
    if w.returncode != 0:
        last = (w.stderr or "").strip().splitlines()
        raise UsageError(f"{' '.join(cmd)} - failed: {last[-1] if last else f'exit status {w.returncode}'}")
    return Installed(["crontab"], [], [f"crontab -l   # to see it; its output goes to {sch.log}"])
