"""The Typer app, its global options and the context every command reads them from.

Command line: a thin layer over `envbisect.runs.deployment` and friends.

Each command parses its options, calls the library, hands the result to `cli.render` (people) or
`Environment.emit_json` (machines), and returns an `ExitStatus`. `run(args, env)` is the one place
that maps errors to exit statuses and one-line messages (see errors.py); everything a command
writes goes through the `Environment` it was given (cli/environment.py), so it runs in-process
against any streams. See docs/safety.md for what the environment's masker guarantees.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import typer

from envbisect import __version__
from envbisect.cli.environment import Environment
from envbisect.runs.deployment import ConnectOptions, Deployment
from envbisect.errors import EnvbisectError, ExitStatus
from envbisect.inputs.masking import SecretMasker
from envbisect.inputs.playbook import load_playbook
from envbisect.state.store import Store

from typer.completion import completion_init

completion_init()  # typer's completion classes answer _ENVBISECT_COMPLETE (see --show-completion)

try:  # typer >= 0.20 vendors click; older ones use click itself
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
except ImportError:  # pragma: no cover
    from click.exceptions import ClickException, NoArgsIsHelpError

__all__ = ["app", "Options", "opts_of", "env_of", "ClickException", "NoArgsIsHelpError"]

app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
    help="Which change broke the serving stack, exactly, and is it a change at all?",
)


@dataclass
class Options:
    playbook: Path
    store: Path
    ssh_config: Optional[str]
    accept_new_host_key: bool
    connect_attempts: int
    inventory: Optional[str] = None
    env: Environment = field(default_factory=Environment)

    def deployment(self) -> Deployment:
        dep = Deployment(load_playbook(self.playbook), Store(self.store),
                         ConnectOptions(self.ssh_config, self.accept_new_host_key, self.connect_attempts,
                                        inventory=self.inventory))
        self.env.masker = dep.masker  # every output from now on learns what the deployment learns
        return dep

    def is_fleet(self) -> bool:
        from envbisect.runs.fleet import is_fleet

        return self.playbook.exists() and is_fleet(self.playbook)

    def fleet(self) -> list:
        """The replicas of a `[fleet]` playbook: (name, Deployment), one playbook each."""
        from envbisect.runs.fleet import load_fleet

        reps = load_fleet(self.playbook, Store(self.store),
                          ConnectOptions(self.ssh_config, self.accept_new_host_key, self.connect_attempts,
                                         inventory=self.inventory))
        if reps:  # replicas are identical deployments: the first one's secrets rules speak for the fleet
            self.env.masker = reps[0][1].masker
        return reps

    def masker(self, *, strict: bool = False) -> SecretMasker:
        """For commands that need no hosts (runs, show, bundle): the playbook's [secrets] when it
        can be read, the built-in rules otherwise. ``strict``: a playbook that exists but cannot be
        read is an error (its [secrets] would be missing from what is handed out)."""
        if self.playbook.exists():
            try:
                pb = load_playbook(self.playbook)
                self.env.masker = SecretMasker(pb.secret_names, pb.secret_values, key=Store(self.store).mask_key())
            except EnvbisectError:
                if strict:
                    raise
        return self.env.masker


def opts_of(ctx: typer.Context) -> Options:
    return ctx.ensure_object(Options)  # type: ignore[return-value]


def env_of(ctx: typer.Context) -> Environment:
    """The Environment `run()` was given (before the callback: the context's obj itself)."""
    obj = ctx.find_root().obj
    return obj.env if isinstance(obj, Options) else obj if isinstance(obj, Environment) else Environment()


SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")


def _check_shell(value: Optional[str]) -> Optional[str]:
    if value is not None and value not in SHELLS:
        raise typer.BadParameter(f"{value!r}: one of {', '.join(SHELLS)}")
    return value


def _show_completion(ctx: typer.Context, value: Optional[str]) -> None:
    """typer's completion script for SHELL, on the Environment's stdout (eager: no command needed).
    The script calls envbisect back with _ENVBISECT_COMPLETE set; click answers that in `app()`."""
    if value is None or ctx.resilient_parsing:
        return
    from typer._completion_shared import get_completion_script

    env_of(ctx).write_raw(get_completion_script(prog_name="envbisect", complete_var=COMPLETE_VAR,
                                                shell=_check_shell(value) or "bash").rstrip("\n") + "\n")
    raise typer.Exit(ExitStatus.OK)


def _install_completion(ctx: typer.Context, value: Optional[str]) -> None:
    if value is None or ctx.resilient_parsing:
        return
    from typer._completion_shared import install

    shell, path = install(shell=_check_shell(value), prog_name="envbisect", complete_var=COMPLETE_VAR)
    env_of(ctx).out.print(f"{shell} completion installed in {path}; it takes effect in a new shell")
    raise typer.Exit(ExitStatus.OK)


COMPLETE_VAR = "_ENVBISECT_COMPLETE"


def _print_version(ctx: typer.Context, value: bool) -> None:
    if value:  # eager: works without a command
        env_of(ctx).out.print(f"envbisect {__version__}")
        raise typer.Exit(ExitStatus.OK)


@app.callback()
def _main(
    ctx: typer.Context,
    playbook: Path = typer.Option(Path("envbisect.toml"), "--playbook", "-p", help="Deployment description (TOML)."),
    store: Path = typer.Option(Path("snapshots"), "--store", help="Local store of snapshots and runs."),
    ssh_config: Optional[str] = typer.Option(None, "--ssh-config", help="OpenSSH client config, like ssh -F (default "
                                             "~/.ssh/config, then /etc/ssh/ssh_config)."),
    inventory: Optional[str] = typer.Option(None, "--inventory", "-i",
                                            help="Ansible inventory for [hosts.NAME] inventory = ...: the JSON of "
                                                 "`ansible-inventory --list` (- for stdin), or any inventory when "
                                                 "ansible-inventory is on PATH."),
    accept_new_host_key: bool = typer.Option(False, "--accept-new-host-key",
                                             help="Trust and record an unknown host key (a changed key is still "
                                                  "refused)."),
    connect_attempts: int = typer.Option(3, "--connect-attempts", min=1, help="SSH connection attempts per host."),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="-v info, -vv debug (shows SSH round trips)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only the result line(s) and errors: no progress, tables "
                                                            "or notes."),
    no_color: bool = typer.Option(False, "--no-color", help="No colour or other terminal styling (also: the NO_COLOR "
                                                            "environment variable, any non-empty value)."),
    events: Optional[str] = typer.Option(None, "--events", metavar="FILE|-",
                                         help="Write what happens (trial start and end, verdict, ...) as JSON lines, "
                                              "one object each with `event` and `time`, to FILE (appended) or to "
                                              "stdout with - (human output then goes to stderr)."),
    traceback: bool = typer.Option(False, "--traceback",
                                   help="On an internal error, print the traceback (secrets masked) instead of "
                                        "pointing to the crash log."),
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print the version and exit."),
    show_completion: Optional[str] = typer.Option(None, "--show-completion", metavar="SHELL", is_eager=True,
                                                  callback=_show_completion, expose_value=False,
                                                  help="Print the completion script for SHELL (bash, zsh, fish, "
                                                       "powershell): eval \"$(envbisect --show-completion bash)\"."),
    install_completion: Optional[str] = typer.Option(None, "--install-completion", metavar="SHELL", is_eager=True,
                                                     callback=_install_completion, expose_value=False,
                                                     help="Install the completion script for SHELL in its rc file."),
) -> None:
    env = env_of(ctx)
    env.store, env.traceback = store, traceback or env.traceback
    env.quiet = quiet or env.quiet
    if no_color:
        env.set_color(False)
    if events is not None:
        env.open_events(events)
    env.configure_logging(verbose)
    ctx.obj = Options(playbook, store, ssh_config, accept_new_host_key, connect_attempts, inventory, env)
