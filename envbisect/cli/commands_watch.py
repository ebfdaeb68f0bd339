"""`envbisect watch`: probe the running stack on an interval and bisect on its own when it turns red
(or when an Alertmanager alert named in the playbook fires); --install writes it as a service."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.text import Text

from envbisect.cli import render
from envbisect.cli.base import app, env_of, opts_of
from envbisect.errors import ExitStatus, UsageError
from envbisect.outcome import Leave


@app.command()
def watch(ctx: typer.Context,
          every: str = typer.Option("5m", "--every", help="How often to probe the running stack: 30s, 5m, 1h."),
          probe: Optional[str] = typer.Option(None, "--probe", help="The pass/fail probe to watch with and bisect "
                                                                    "with (default: the playbook's first)."),
          guard: Optional[str] = typer.Option(None, "--guard", help="As bisect --guard: a perf probe a culprit's "
                                                                    "revert must not cost."),
          leave: str = typer.Option("original", "--leave", help="As bisect --leave: original | fixed."),
          policy: str = typer.Option("confirm", "--policy", help="As bisect --policy: confirm | fast | thorough."),
          confidence: float = typer.Option(0.95, "--confidence", min=0.5, max=0.9999),
          max_trials: Optional[int] = typer.Option(None, "--max-trials", min=2, help="Restart budget per bisection."),
          notify: Optional[str] = typer.Option(None, "--notify", metavar="CMD",
                                               help="Run `bash -c CMD` with the verdict JSON (as bisect --json, "
                                                    "masked) on stdin; its failure is logged, never fatal."),
          notify_timeout: str = typer.Option("60s", "--notify-timeout", help="Kill --notify after this long."),
          listen: Optional[str] = typer.Option(None, "--listen", metavar="HOST:PORT",
                                               help="Also take Alertmanager webhooks (POST, version 4) here; only "
                                                    "firing alerts named in [watch] alerts trigger."),
          listen_remote: bool = typer.Option(False, "--listen-remote", help="Allow --listen on a non-loopback "
                                                                            "address."),
          bundle_dir: Optional[str] = typer.Option(None, "--bundle-dir", help="Where bundles go (default "
                                                                              "STORE/watch/bundles)."),
          once: bool = typer.Option(False, "--once", help="One cycle, then exit (what the crontab line runs)."),
          max_cycles: Optional[int] = typer.Option(None, "--max-cycles", min=1, help="Stop after N cycles."),
          install: bool = typer.Option(False, "--install", help="Write the systemd user service (or add the crontab "
                                                                "line) instead of watching."),
          print_service: bool = typer.Option(False, "--print", help="Print the service (or crontab line); write "
                                                                    "nothing."),
          cron: bool = typer.Option(False, "--cron", help="With --install/--print: a crontab line (`watch --once`) "
                                                          "even where systemd runs."),
          systemd: bool = typer.Option(False, "--systemd", help="With --install/--print: a systemd user service "
                                                                "even where systemd is not detected."),
          as_json: bool = typer.Option(False, "--json",
                                       help="With --install/--print: machine-readable output.")) -> ExitStatus:
    """Probe the running stack on an interval; when it turns from pass to fail twice in a row (or a named alert
    fires), bisect against the last good snapshot, write the bundle and run --notify."""
    env = env_of(ctx)
    from envbisect.runs.plan import BisectOptions, parse_leave, parse_policy
    from envbisect.runs.watch import WatchOptions, parse_listen
    from envbisect.state.prune import parse_duration

    leave, policy = parse_leave(leave), parse_policy(policy)
    if cron and systemd:
        raise typer.BadParameter("give --cron or --systemd, not both", param_hint="--cron")
    every_s = parse_duration(every, "--every")
    timeout_s = parse_duration(notify_timeout, "--notify-timeout")
    where = parse_listen(listen, allow_remote=listen_remote) if listen else None
    o = opts_of(ctx)
    if o.is_fleet():
        raise UsageError("watch is not available for a [fleet] playbook yet: watch one replica's playbook")
    if install or print_service:
        passed = [*(["--probe", probe] if probe else []), *(["--guard", guard] if guard else []),
                  *(["--leave", leave.value] if leave is not Leave.ORIGINAL else []),
                  *(["--policy", policy] if policy != "confirm" else []),
                  *(["--confidence", str(confidence)] if confidence != 0.95 else []),
                  *(["--max-trials", str(max_trials)] if max_trials else []),
                  *(["--notify", notify, "--notify-timeout", notify_timeout] if notify else []),
                  *(["--listen", listen] if listen else []), *(["--listen-remote"] if listen_remote else []),
                  *(["--bundle-dir", bundle_dir] if bundle_dir else [])]
        return _service(env, o, every, passed, "cron" if cron else ("systemd" if systemd else None), install, as_json)
    if as_json:
        raise UsageError("--json goes with --install or --print; a running watch writes --events FILE|- instead")
    o.masker()
    opts = WatchOptions(probe="", every_s=every_s,
                        bisect=BisectOptions(probe=probe, confidence=confidence, max_trials=max_trials, leave=leave,
                                             policy=policy, guard=guard),
                        notify=notify, notify_timeout_s=timeout_s, max_cycles=1 if once else max_cycles,
                        bundle_dir=None if bundle_dir is None else Path(bundle_dir).absolute(),
                        listen=where)
    return _run_watch(env, o, opts, probe)


def _run_watch(env, o, opts, probe: Optional[str]) -> ExitStatus:  # noqa: ANN001
    """Watch until stopped (or --once, --max-cycles); SIGTERM (systemctl stop) behaves like Ctrl-C."""
    import dataclasses

    from envbisect.runs.signals import install_signal_handlers
    from envbisect.runs.watch import Watcher

    pb = o.deployment().playbook  # the probe's name, before the watch takes its lock
    name = probe or next(iter(pb.probes), None)
    if name is None:
        raise UsageError(f"{pb.path}: no [probes.NAME] defined; watch needs a pass/fail probe")
    opts = dataclasses.replace(opts, probe=name, bisect=dataclasses.replace(opts.bisect, probe=name))
    progress = env.listener(render.Progress(env, quiet=env.quiet))

    def say(line: str) -> None:
        if not env.quiet:
            env.err.print(Text(line), soft_wrap=True)

    stop = install_signal_handlers()
    try:
        summary = Watcher(o.deployment, o.store, opts, on_event=progress, say=say).run()
    finally:
        stop()
    verdicts = [b for b in summary.bisections if "verdict" in b]
    env.out.print(f"watch: {summary.cycles} cycle(s), {len(summary.bisections)} bisection(s)"
                  + "".join(f"; {b['verdict']}" + (f" {', '.join(b['culprits'])}" if b.get("culprits") else "")
                            + f" (bundle {b['watch']['bundle']})" for b in verdicts))
    return ExitStatus.OK


def _service(env, o, every: str, passed: list[str], kind: Optional[str], install: bool,  # noqa: ANN001
             as_json: bool) -> ExitStatus:
    from envbisect.runs.schedule import install as do_install
    from envbisect.runs.watch import make_service

    o.masker()
    sch = make_service(playbook=o.playbook, store=o.store, ssh_config=o.ssh_config, inventory=o.inventory,
                       watch_args=passed, every=every, kind=kind)
    done = do_install(sch) if install else None
    if as_json:
        env.emit_json({**sch.to_json(), "installed": done.to_json() if done else None})
        return ExitStatus.OK
    render.render_timer(env, sch, done, write_hint="write it with --install", add_hint="add it with --install",
                        soft_wrap=True)
    return ExitStatus.OK


__all__ = ["watch"]
