"""One table of exit codes and the typed errors that map onto them.

Everything below the CLI raises an `EnvbisectError` subclass; `cli.main` is the single place
that turns them into a one-line message and an exit status (httpie's ExitStatus habit).
"""
from __future__ import annotations

from enum import IntEnum


class ExitStatus(IntEnum):
    OK = 0                 # diff: no deltas; bisect: verdict culprit/interaction
    DELTAS = 1             # diff found deltas (like `diff(1)`)
    USAGE = 2              # bad input: playbook, arguments, store
    CONNECTION = 3         # host unreachable, auth failure, host-key refusal
    NOT_CONFIG = 4         # bisect: the baseline fails too; the config is not the cause
    NOT_REPRODUCED = 5     # bisect: the current config passes after a proper co-restart
    INCONCLUSIVE = 6       # bisect: budget spent before the confidence threshold
    CONFLICT = 7           # someone else changed a host during the run; their change was left in place
    INTERNAL = 70          # a bug (EX_SOFTWARE): one line on stderr, the masked traceback in a 0600 crash log
    INTERRUPTED = 130      # Ctrl-C or SIGTERM (the hosts were restored, or `envbisect restore` is printed)


# The one exit-status table every command follows: status -> (meaning, the commands that return it;
# "every" for all). README.md and docs/guide.md hold `exit_status_table()` word for word, and the man
# page's EXIT STATUS section is made from it (tests/test_cli_conventions.py checks both).
EVERY = ("every",)
EXIT_STATUS_DOC: dict[ExitStatus, tuple[str, tuple[str, ...]]] = {
    ExitStatus.OK: ("success; `diff`: no deltas; `bisect`: a culprit or interaction was found; a --dry-run that "
                    "could be done", EVERY),
    ExitStatus.DELTAS: ("`diff`: deltas found; `verify`, `revert`, `apply`: the check failed (not fixed); "
                        "`snapshot --probe`: the probe did not pass (the snapshot is saved); `demo`: the planted "
                        "change was not found; `bundle --check`: the archive has a problem",
                        ("diff", "verify", "revert", "apply", "snapshot", "demo", "bundle")),
    ExitStatus.USAGE: ("bad input: the playbook, an argument, a time, a damaged store or run file; a lock held by "
                       "another run; `--since last-good` with no snapshot whose probe passed", EVERY),
    ExitStatus.CONNECTION: ("a host is unreachable, authentication failed, or its host key is unknown, changed "
                            "or @revoked; `restore`: the co-restart failed",
                            ("init", "snapshot", "diff", "bisect", "restore", "verify", "revert", "apply")),
    ExitStatus.NOT_CONFIG: ("verdict not-config: the baseline fails too", ("bisect", "replay")),
    ExitStatus.NOT_REPRODUCED: ("verdict not-reproduced: the current configuration passes after a co-restart",
                                ("bisect", "replay")),
    ExitStatus.INCONCLUSIVE: ("verdict inconclusive: the budget was spent before the confidence; `replay`: the "
                              "corrected record needs more trials", ("bisect", "replay")),
    ExitStatus.CONFLICT: ("someone else changed a host during the run (their change was kept)",
                          ("bisect", "revert", "apply", "restore")),
    ExitStatus.INTERNAL: ("a bug in envbisect: one line naming a private crash log (secrets masked)", EVERY),
    ExitStatus.INTERRUPTED: ("Ctrl-C or SIGTERM; the hosts were put back, or the `restore` command is printed",
                             EVERY),
}


def exit_status_table() -> str:
    """EXIT_STATUS_DOC as the markdown table README.md and docs/guide.md show."""
    rows = ["| status | name | meaning | commands |", "| --- | --- | --- | --- |"]
    for st, (meaning, cmds) in EXIT_STATUS_DOC.items():
        who = "every" if cmds == EVERY else ", ".join(f"`{c}`" for c in cmds)
        rows.append(f"| {int(st)} | `{st.name}` | {meaning} | {who} |")
    return "\n".join(rows) + "\n"


class EnvbisectError(Exception):
    """A problem the user can act on; `str(err)` is the whole one-line message."""

    exit_status: ExitStatus = ExitStatus.USAGE


class UsageError(EnvbisectError):
    exit_status = ExitStatus.USAGE


class PlaybookError(UsageError):
    def __init__(self, path: object, key: str | None, problem: str):
        where = f"{path}: {key}: " if key else f"{path}: "
        super().__init__(where + problem)
        self.path, self.key, self.problem = path, key, problem


class StoreError(UsageError):
    pass


class EnvCheckFailed(UsageError):
    """After an edit, before any restart: bash makes of an edited env file something else than the
    configuration under test should give (the baseline cannot be re-created as it was). The run stops
    and the hosts are restored; the message names host, file, key, expected and got (masked)."""

    def __init__(self, message: str, host: str = "", path: str = "", key: str = ""):
        super().__init__(message)
        self.host, self.path, self.key = host, path, key


class ProbeBroken(UsageError):
    """The probe cannot run (a command that exits 126 or 127: not executable, not found): it says
    nothing about the configuration, so the run stops (restoring what it changed) instead of
    counting it as a failure. The message names the probe and what it printed, on one line."""


class ConnectionFailed(EnvbisectError):
    exit_status = ExitStatus.CONNECTION


class HostKeyError(ConnectionFailed):
    pass


class RemoteError(EnvbisectError):
    """A command on a host failed for reasons that are not the configuration under test."""

    exit_status = ExitStatus.CONNECTION


class LockHeld(UsageError):
    pass


class HostConflict(EnvbisectError):
    """A host is not in the state envbisect journaled or last made: someone else changed it. The run
    stops, that change is left in place, and only what is provably envbisect's own is restored."""

    exit_status = ExitStatus.CONFLICT

    def __init__(self, host: str, info: dict, message: str):
        super().__init__(message)
        self.host, self.info = host, info
        self.path = info.get("path")


class LockLost(HostConflict):
    """The deployment lock is no longer this run's (broken with --break-lock by someone else)."""
