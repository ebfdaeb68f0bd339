"""Command line entry point: `run(args, env)` runs one command against an Environment and maps
every way out to an exit status and at most one line on stderr; `main()` applies it.

The commands live in cli/commands_*.py (registered on the Typer app of cli/base.py when imported
here), what they print in cli/render.py, and the streams and masker they print through in
cli/environment.py.
"""
from __future__ import annotations

import signal
import sys

import typer

from envbisect import __version__
# importing them registers the commands, in the order `--help` lists them (the pipeline's)
from envbisect.cli import commands_state  # noqa: F401  init snapshot snapshots schedule prune diff
from envbisect.cli import commands_change  # noqa: F401  bisect restore demo verify revert apply
from envbisect.cli import commands_history  # noqa: F401  runs show bundle
from envbisect.cli import commands_watch  # noqa: F401  watch
from envbisect.cli.base import ClickException, NoArgsIsHelpError, Options, app
from envbisect.cli.environment import Environment
from envbisect.errors import EnvbisectError, ExitStatus
from envbisect.inputs.masking import printable

__all__ = ["app", "run", "main", "Options", "Environment", "commands_state", "commands_change", "commands_history",
           "commands_watch"]


def _internal_error(env: Environment, exc: BaseException) -> int:
    """The last resort: a bug. One line pointing to a private crash log (secrets masked), or, with
    --traceback, the masked traceback itself."""
    import platform

    text = env.masker.redact_text(f"envbisect {__version__} (Python {platform.python_version()}) "
                                  f"argv: {sys.argv[1:]}\n") + env.masked_traceback(exc)
    summary = f"{type(exc).__name__}: {exc}".splitlines()[0][:300] if str(exc) else type(exc).__name__
    if env.traceback:
        env.stderr.write(printable(text))
        env.err.print(f"envbisect: internal error (a bug): {summary}")
    else:
        path = env.crash_log(text)
        where = f"traceback in {path} (secrets masked)" if path else "could not write a crash log"
        env.err.print(f"envbisect: internal error (a bug): {summary}; {where}; --traceback prints it")
    return int(ExitStatus.INTERNAL)


def run(args: list[str], env: Environment | None = None) -> int:
    """Run the CLI with `args` against `env` (default: this process's streams); every way out is an
    exit status and at most one line on stderr. Nothing here exits the process: `main()` does."""
    env = env or Environment()
    env.traceback = env.traceback or "--traceback" in args
    try:
        return _dispatch(args, env)
    finally:
        env.close_events()


def _dispatch(args: list[str], env: Environment) -> int:
    try:
        # standalone_mode=False: click's handlers would print "Aborted!" / multi-line usage errors,
        # and typer turns Ctrl-C into a silent exit 130; here each becomes one line. The command's
        # return value (an ExitStatus) comes back as rc.
        rc = app(args=args, prog_name="envbisect", standalone_mode=False, obj=env)
    except NoArgsIsHelpError as e:
        e.show(file=env.stderr)
        return int(ExitStatus.USAGE)
    except ClickException as e:  # bad option or argument (typer.BadParameter too)
        env.err.print(f"envbisect: error: {e.format_message()} (see `envbisect --help`)")
        return int(e.exit_code) if e.exit_code else int(ExitStatus.USAGE)
    except (typer.Abort, KeyboardInterrupt):  # EOF at a prompt, Ctrl-C
        env.err.print("envbisect: interrupted")
        return int(ExitStatus.INTERRUPTED)
    except EnvbisectError as e:
        if env.traceback:
            env.stderr.write(printable(env.masked_traceback(e)))
        env.err.print("envbisect: error: " + printable(str(e), keep_newlines=False))  # a path may hold a \n
        return int(e.exit_status)
    except BrokenPipeError:  # `envbisect runs | head`
        return int(ExitStatus.OK)
    except OSError as e:
        if e.filename is None and e.strerror is None:
            return _internal_error(env, e)
        env.err.print("envbisect: error: " + printable(f"{e.filename or ''}: {e.strerror or e}", keep_newlines=False))
        return int(ExitStatus.USAGE)
    except Exception as e:  # noqa: BLE001 - the last resort
        return _internal_error(env, e)
    rc = int(rc or 0)
    if rc == ExitStatus.INTERRUPTED:  # typer's Exit(130) for Ctrl-C/SIGTERM inside a command
        env.err.print("envbisect: interrupted")
    return rc




def _term_as_interrupt(signum, frame) -> None:  # noqa: ANN001
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    # SIGTERM (a timer's stop, `timeout`, systemd) ends every command as Ctrl-C does, from its first
    # line: one line and exit 130, and a command that holds hosts lets go of them first (the lock it
    # took, the journal it began), as it does for Ctrl-C
    signal.signal(signal.SIGTERM, _term_as_interrupt)
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
