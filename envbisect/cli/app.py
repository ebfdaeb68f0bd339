"""Command line: a thin layer over `envbisect.runs.deployment` and friends.

Each command parses its options, calls the library, hands the result to `cli.render` (people) or
`Environment.emit_json` (machines), and returns an `ExitStatus`. `run(args, env)` is the one place
that maps errors to exit statuses and one-line messages (see errors.py); everything a command
writes goes through the `Environment` it was given (cli/environment.py), so it runs in-process
against any streams. See docs/safety.md for what the environment's masker guarantees.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table
from rich.text import Text

from envbisect import __version__
from envbisect.cli import render
from envbisect.cli.environment import Environment
from envbisect.cli.render import bold, when
from envbisect.runs.deployment import ConnectOptions, Deployment
from envbisect.errors import EnvbisectError, ExitStatus, StoreError, UsageError
from envbisect.inputs.masking import SecretMasker, printable
from envbisect.inputs.playbook import load_playbook
from envbisect.state.rundir import Runs
from envbisect.state.store import Store

try:  # typer >= 0.20 vendors click; older ones use click itself
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
except ImportError:  # pragma: no cover
    from click.exceptions import ClickException, NoArgsIsHelpError

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

    def masker(self, *, strict: bool = False) -> SecretMasker:
        """For commands that need no hosts (runs, show, bundle): the playbook's [secrets] when it
        can be read, the built-in rules otherwise. ``strict``: a playbook that exists but cannot be
        read is an error (its [secrets] would be missing from what is handed out)."""
        if self.playbook.exists():
            try:
                pb = load_playbook(self.playbook)
                self.env.masker = SecretMasker(pb.secret_names, pb.secret_values)
            except EnvbisectError:
                if strict:
                    raise
        return self.env.masker


def _opts(ctx: typer.Context) -> Options:
    return ctx.ensure_object(Options)  # type: ignore[return-value]


def _env(ctx: typer.Context) -> Environment:
    """The Environment `run()` was given (before the callback: the context's obj itself)."""
    obj = ctx.find_root().obj
    return obj.env if isinstance(obj, Options) else obj if isinstance(obj, Environment) else Environment()


def _print_version(ctx: typer.Context, value: bool) -> None:
    if value:  # eager: works without a command
        _env(ctx).out.print(f"envbisect {__version__}")
        raise typer.Exit(0)


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
                                             help="Trust and record an unknown host key (a changed key is still refused)."),
    connect_attempts: int = typer.Option(3, "--connect-attempts", min=1, help="SSH connection attempts per host."),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="-v info, -vv debug (shows SSH round trips)."),
    traceback: bool = typer.Option(False, "--traceback",
                                   help="On an internal error, print the traceback (secrets masked) instead of "
                                        "pointing to the crash log."),
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print the version and exit."),
) -> None:
    env = _env(ctx)
    env.store, env.traceback = store, traceback or env.traceback
    env.configure_logging(verbose)
    ctx.obj = Options(playbook, store, ssh_config, accept_new_host_key, connect_attempts, inventory, env)


# --- init --------------------------------------------------------------------------------------

@app.command()
def init(ctx: typer.Context,
         host: str = typer.Option(..., "--host", help="ssh target to look at (as a playbook's ssh = ...; with "
                                                     "--inventory, an inventory host)."),
         out_path: Optional[str] = typer.Option(None, "--out", help="Where to write the draft (default: the "
                                                                   "--playbook path; - prints it)."),
         name: Optional[str] = typer.Option(None, "--name", help="[deployment] name (default HOST-sglang[-pd])."),
         python: str = typer.Option("python3", "--python", help="Interpreter on the host."),
         under: Optional[str] = typer.Option(None, "--under", help="Only processes whose working directory is "
                                                                   "DIR or below it (one stack of several)."),
         match: List[str] = typer.Option([], "--match", help="Also count processes whose command line matches "
                                                             "this regex as SGLang servers (your own launcher)."),
         force: bool = typer.Option(False, "--force", help="Replace an existing file."),
         as_json: bool = typer.Option(False, "--json")) -> int:
    """Write a commented playbook draft from the SGLang servers and routers running on HOST (changes nothing there)."""
    env = _env(ctx)
    import tomllib

    from envbisect.hosts.inventory import bind_inventory
    from envbisect.hosts.transport import connect
    from envbisect.inputs.playbook import Host, Playbook, Restart
    from envbisect.runs import discover as disc

    o = _opts(ctx)
    key = disc.host_key(host)
    dest = None if out_path == "-" else Path(out_path or o.playbook)
    if dest is not None and dest.exists() and not force:  # before connecting: nothing to lose but time
        raise UsageError(f"{dest} exists: give --force to replace it, or --out FILE (--out - prints the draft)")
    inventory_file = None
    if o.inventory:
        stub = Playbook(path=(dest or Path("envbisect.toml")).absolute(), name="init",
                        hosts={key: Host(key, "", "" if python == "python3" else python, inventory=host)},
                        services={}, restart=Restart(()))
        target = bind_inventory(stub, o.inventory).hosts[key]
        inventory_file = o.inventory if o.inventory == "-" else str(Path(o.inventory).absolute())
    else:
        target = Host(key, host, python)
    transport = connect(target, ssh_config=o.ssh_config, accept_new_host_key=o.accept_new_host_key,
                        attempts=o.connect_attempts)
    try:
        doc = disc.scan(transport, match)
    finally:
        transport.close()
    services, repos, _notes = disc.interpret(doc, under=under, extra_match=match)
    text, required, optional = disc.draft(
        doc, services, repos, host=key, ssh=None if o.inventory else host, inventory_host=host if o.inventory else None,
        inventory_file=inventory_file, python=target.python or "python3", name=name,
        command=f"init --host {host}" + (f" --under {under}" if under else ""))
    text = env.masker.redact_text(text)
    tomllib.loads(text)  # a draft that is not TOML would be a bug
    if dest is not None:
        disc.write_draft(dest, text, force=force)
    if as_json:
        env.emit_json({"host": host, "hostname": doc.get("hostname"), "draft": str(dest) if dest else None,
                   "text": None if dest else text, "todo_required": required, "todo_optional": optional,
                   **disc.summary(services, repos)})
        return
    if dest is None:
        env.write_raw(text)
        return
    env.out.print(Text.assemble("wrote ", bold(dest), f": {len(services)} service(s) found on {doc.get('hostname', host)}, "
                            f"{len(repos)} repo(s); nothing was changed there"))
    t = Table("service", "env file", "start", "health")
    for s in services:
        t.add_row(s.name, *(str(s.keys[k].value) if s.keys[k].known else "TODO" for k in ("env_file", "start", "health")))
    env.out.print(t)
    if required:
        env.out.print(Text(f"{required} TODO (required) to fill in before envbisect can load it "
                       f"(and {optional} optional); then: envbisect -p {dest} snapshot --label known-good", style="yellow"))
    else:
        env.out.print(f"{optional} TODO (optional) to look at; read the lines marked check:, then: "
                  f"envbisect -p {dest} snapshot --label known-good")


# --- snapshot ----------------------------------------------------------------------------------

@app.command()
def snapshot(ctx: typer.Context, label: Optional[str] = typer.Option(None, "--label", "-l", help="A name to find it by."),
             as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> int:
    """Record the state of every host: env files, watched files, repo HEADs, process environments."""
    env = _env(ctx)
    o = _opts(ctx)
    with o.deployment() as dep:
        snap = dep.snapshot(label)
        trips = dep.round_trips()
    summary = {
        "id": snap.id, "label": snap.label, "taken_at": snap.taken_at_iso, "store": str(o.store),
        "hosts": {h: {"files": len(s.files), "repos": {p: r.describe or r.head for p, r in s.repos.items()},
                      "processes": {n: p.status for n, p in s.processes.items()}, "round_trips": trips.get(h)}
                  for h, s in snap.hosts.items()},
    }
    if as_json:
        env.emit_json(summary)
        return
    env.out.print(Text.assemble("snapshot ", bold(snap.id), f" saved in {o.store}"))
    t = Table("host", "files", "repos", "processes", "ssh round trips")
    for h, s in summary["hosts"].items():
        t.add_row(h, str(s["files"]), ", ".join(f"{Path(p).name}@{d}" for p, d in s["repos"].items()) or "-",
                  ", ".join(f"{n}: {st}" for n, st in s["processes"].items()) or "-", str(s["round_trips"]))
    env.out.print(t)


@app.command()
def snapshots(ctx: typer.Context, as_json: bool = typer.Option(False, "--json")) -> int:
    """List stored snapshots, oldest first."""
    env = _env(ctx)
    o = _opts(ctx)
    snaps = Store(o.store).list()
    rows = [{"id": s.id, "label": s.label, "taken_at": s.taken_at_iso, "deployment": s.playbook,
             "hosts": sorted(s.hosts)} for s in snaps]
    if as_json:
        env.emit_json(rows)
        return
    if not rows:
        env.out.print(f"no snapshots in {o.store} (take one with `envbisect snapshot`)")
        return
    t = Table("id", "label", "taken at", "deployment", "hosts")
    for s, r in zip(snaps, rows):
        t.add_row(r["id"], r["label"] or "", when(s.taken_at), r["deployment"], ", ".join(r["hosts"]))
    env.out.print(t)


@app.command()
def schedule(ctx: typer.Context,
             every: str = typer.Option(..., "--every", help="How often: 15m, 1h, 6h, 1d."),
             label: str = typer.Option("auto", "--label", help="Label of the scheduled snapshots (prune treats "
                                                              "'auto' as automatic)."),
             install: bool = typer.Option(False, "--install", help="Write the systemd user units (or add the "
                                                                   "crontab line) instead of printing them."),
             cron: bool = typer.Option(False, "--cron", help="A crontab line even where systemd runs."),
             systemd: bool = typer.Option(False, "--systemd", help="systemd user units even where systemd is "
                                                                  "not detected."),
             as_json: bool = typer.Option(False, "--json")) -> int:
    """Take `snapshot --label auto` on a timer: a systemd user timer, or a crontab line without systemd."""
    env = _env(ctx)
    from envbisect.runs.schedule import install as do_install, make_schedule

    if cron and systemd:
        raise typer.BadParameter("give --cron or --systemd, not both", param_hint="--cron")
    o = _opts(ctx)
    o.masker()
    sch = make_schedule(every=every, label=label, playbook=o.playbook, store=o.store, ssh_config=o.ssh_config,
                        inventory=o.inventory, kind="cron" if cron else ("systemd" if systemd else None))
    done = do_install(sch) if install else None
    if as_json:
        env.emit_json({**sch.to_json(), "installed": done.to_json() if done else None})
        return
    import shlex

    again = f"envbisect schedule --every {every}" + (f" --label {label}" if label != "auto" else "") \
        + (" --cron" if cron else "") + (" --systemd" if systemd else "") + " --install"
    deploy_hook = ("after a deploy, from its hook: " + " ".join(shlex.quote(a) for a in sch.command[:-3])
                   + " snapshot --label deploy-$(git rev-parse --short HEAD)")
    if sch.kind == "systemd":
        if done is None:
            for path, text in sch.files.items():
                env.out.print(Text(f"# {path}", style="bold"))
                env.out.print(text)
            env.out.print(f"write them with `{again}`, then run: {sch.enable_command}")
        else:
            for p in done.changed:
                env.out.print(f"wrote {p}")
            for p in done.unchanged:
                env.out.print(f"unchanged {p}")
            env.out.print("now run:")
            for step in done.next_steps:
                env.out.print(f"  {step}")
    else:
        if done is None:
            env.out.print(sch.cron_marker)
            env.out.print(sch.cron_line)
            env.out.print(f"add it with `{again}` (or `crontab -e`)")
        elif done.changed:
            env.out.print(f"added to your crontab: {sch.cron_line}")
            for step in done.next_steps:
                env.out.print(f"  {step}")
        else:
            env.out.print(f"your crontab already has it: {sch.cron_line}")
    env.out.print(Text(deploy_hook, style="dim"))


@app.command()
def prune(ctx: typer.Context,
          keep: str = typer.Option(..., "--keep", help="Keep snapshots newer than this: 14d, 36h, 2w."),
          keep_labelled: bool = typer.Option(False, "--keep-labelled",
                                             help="Keep every snapshot with a label other than 'auto'/'diff'."),
          dry_run: bool = typer.Option(False, "--dry-run", help="List what would go; remove nothing."),
          as_json: bool = typer.Option(False, "--json")) -> int:
    """Thin the store: old automatic snapshots go (never one a run uses, never the newest), then unused blobs."""
    env = _env(ctx)
    from rich.table import Column

    from envbisect.state.prune import parse_duration, prune as do_prune

    o = _opts(ctx)
    o.masker()
    res = do_prune(Store(o.store), keep_s=parse_duration(keep, "--keep"), keep_labelled=keep_labelled, dry_run=dry_run)
    if as_json:
        env.emit_json(res.to_json())
        return
    word = "would remove" if dry_run else "removed"
    if res.deleted:
        t = Table(Column("snapshot", no_wrap=True), "label", "taken at",  # ids never cut short
                  title=f"{word} {len(res.deleted)} snapshot(s)")
        for e in res.deleted:
            t.add_row(e.id, e.label or "", when(e.taken_at))
        env.out.print(t)
    else:
        env.out.print(f"no snapshot to remove ({len(res.kept)} kept)")
    if res.kept:
        t = Table(Column("snapshot", no_wrap=True), "label", "taken at", "kept because",
                  title=f"kept {len(res.kept)} snapshot(s)")
        for e in res.kept:
            t.add_row(e.id, e.label or "", when(e.taken_at), "; ".join(e.keep))
        env.out.print(t)
    if res.blob_gc:
        env.out.print(f"blobs: {word} {res.blobs_deleted} ({res.blob_bytes_deleted} bytes), kept {res.blobs_kept}"
                  + (f" ({res.blobs_young} unused but written in the last 15 min)" if res.blobs_young else ""))
    for n in res.notes:
        env.out.print(Text(f"note: {n}", style="yellow"))
    if dry_run:
        env.out.print("dry run: nothing was removed")


# --- diff --------------------------------------------------------------------------------------

@app.command()
def diff(ctx: typer.Context,
         since: Optional[str] = typer.Option(None, "--since", "-s",
                                             help="Known-good TIME: noon, midnight, 'today 12:00', 'yesterday 18:00', '2h ago', ISO 8601, epoch."),
         against: Optional[str] = typer.Option(None, "--against", "-a", help="A snapshot label, id or file."),
         as_json: bool = typer.Option(False, "--json")) -> int:
    """What changed since the last known-good state? Exit 0: nothing, 1: deltas found."""
    env = _env(ctx)
    o = _opts(ctx)
    with o.deployment() as dep:
        result = dep.diff(since=since, against=against)
        masker = dep.masker
    if as_json:
        env.emit_json(result.to_json(masker))
    else:
        render.render_diff(env, result, masker)
    return int(ExitStatus.DELTAS if result.deltas else ExitStatus.OK)




# --- bisect ------------------------------------------------------------------------------------

@app.command()
def bisect(ctx: typer.Context,
           since: Optional[str] = typer.Option(None, "--since", "-s", help="Known-good TIME (see `diff`)."),
           against: Optional[str] = typer.Option(None, "--against", "-a", help="Known-good snapshot label or id."),
           probe: Optional[str] = typer.Option(None, "--probe", help="Probe name from the playbook (default: the first)."),
           only: List[str] = typer.Option([], "--only", help="Bisect only these delta ids."),
           exclude: List[str] = typer.Option([], "--exclude", help="Leave these delta ids out (kept as they are now)."),
           link: List[str] = typer.Option([], "--link", help="Treat every delta of this variable as one unit."),
           confidence: float = typer.Option(0.95, "--confidence", min=0.5, max=0.9999),
           max_trials: Optional[int] = typer.Option(None, "--max-trials", min=2, help="Restart budget."),
           leave: str = typer.Option("original", "--leave", help="original | fixed (current minus the culprits)."),
           policy: str = typer.Option("confirm", "--policy",
                                      help="confirm: see each culprit fail alone (default); fast: trust the prior, "
                                           "fewest restarts; thorough: also prove no other culprit remains."),
           no_auto_link: bool = typer.Option(False, "--no-auto-link",
                                             help="Do not pin a variable changed the same way in several services."),
           dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; touch nothing."),
           resume: bool = typer.Option(False, "--resume", help="Continue the last interrupted run."),
           run_id: Optional[str] = typer.Option(None, "--run", help="With --resume: which run."),
           break_lock: bool = typer.Option(False, "--break-lock",
                                 help="Take the deployment lock even from a live run of another controller "
                                      "(prints whose it was). Never over an active journal."),
           as_json: bool = typer.Option(False, "--json")) -> int:
    """Find the guilty delta(s) on the live deployment, after checking the premises."""
    env = _env(ctx)
    from envbisect.runs.bisect import BisectOptions, BisectRun

    if leave not in ("original", "fixed"):
        raise typer.BadParameter("must be 'original' or 'fixed'", param_hint="--leave")
    if policy not in ("confirm", "fast", "thorough"):
        raise typer.BadParameter("must be 'confirm', 'fast' or 'thorough'", param_hint="--policy")
    o = _opts(ctx)
    opts = BisectOptions(probe=probe, only=tuple(only), exclude=tuple(exclude), link=tuple(link), confidence=confidence,
                         max_trials=max_trials, leave=leave, policy=policy, auto_link=not no_auto_link)
    progress = render.Progress(env, quiet=False)
    with o.deployment() as dep:
        run = BisectRun(dep, opts, on_event=progress, break_lock=break_lock)
        if resume:
            try:
                result = run.resume(run_id)
            except KeyboardInterrupt:
                _print_resume(o, run.run_id)
                raise
        else:
            run.probe()  # a bad --probe is reported before any host is contacted
            if not dry_run:
                run.refuse_unrestored()  # a crashed run's trial state is not the current state
            diff = dep.diff(since=since, against=against)
            # No deltas is no verdict: the stack is still co-restarted and probed, so "not-config"
            # (it fails) or "not-reproduced" (it passes) is observed, never assumed.
            if dry_run:
                plan = run.plan(diff)
                if as_json:
                    env.emit_json(plan)
                else:
                    render.render_diff(env, diff, dep.masker)
                    render.render_plan(env, plan)
                return ExitStatus.OK
            try:
                result = run.start(diff)
            except KeyboardInterrupt:
                _print_resume(o, run.run_id)
                raise
    if as_json:
        env.emit_json(result.to_json())
    else:
        render.render_verdict(env, result)
    return int(result.exit_status)


def _print_resume(o: Options, run_id: str) -> None:
    if run_id:
        import shlex

        cfg = f" --ssh-config {shlex.quote(o.ssh_config)}" if o.ssh_config else ""
        cfg += f" --inventory {shlex.quote(o.inventory)}" if o.inventory else ""
        o.env.err.print(f"To resume, run: envbisect -p {shlex.quote(str(o.playbook))} --store {shlex.quote(str(o.store))}{cfg} "
                  f"bisect --resume --run {run_id}", soft_wrap=True)


@app.command()
def restore(ctx: typer.Context,
            run_id: Optional[str] = typer.Option(None, "--run", help="The run to undo (default: the newest with an "
                                                                     "active journal)."),
            break_lock: bool = typer.Option(False, "--break-lock",
                                 help="Take the deployment lock even from a live run of another controller "
                                      "(prints whose it was). Never over an active journal."),
            as_json: bool = typer.Option(False, "--json")) -> int:
    """Undo an interrupted or crashed run from its journal (exact bytes, mode, owner, mtime, HEAD), then co-restart.
    Files someone else changed meanwhile are left as found and listed."""
    env = _env(ctx)
    from envbisect.runs.bisect import restore_deployment

    o = _opts(ctx)
    with o.deployment() as dep:
        res = restore_deployment(dep, run_id=run_id, break_lock=break_lock, on_event=render.Progress(env, quiet=as_json))
    if as_json:
        env.emit_json(res)
    elif res["restored"]:
        env.out.print(f"restored {res['files']} file(s) and {res['repos']} repo(s) from run {res['run']}; "
                  f"co-restart: {res['co_restart']}")
        if res["conflicts"]:
            env.out.print("left as found (changed by someone else during the run): "
                      + ", ".join(f"{c['host']}:{c['path']}" for c in res["conflicts"]))
    else:
        env.out.print(res["reason"])
    return 0 if res.get("co_restart_ok", True) else int(ExitStatus.CONNECTION)



@app.command()
def demo(ctx: typer.Context,
         keep: bool = typer.Option(False, "--keep", help="Leave the demo deployment's files in place."),
         as_json: bool = typer.Option(False, "--json")) -> int:
    """Run snapshot -> diff -> bisect on a built-in simulated SGLang PD deployment (real sglang-router)."""
    env = _env(ctx)
    import time as _time

    from envbisect.cli import demo as demo_mod
    from envbisect.runs.bisect import BisectOptions, BisectRun
    from envbisect.runs.deployment import Deployment

    t0 = _time.monotonic()
    say = (lambda *_a, **_k: None) if as_json else env.out.print
    say(Text.assemble(bold("envbisect demo"), ": simulated prefill + decode workers behind the real sglang-router"))
    d = demo_mod.prepare()
    try:
        say(f"  deployment in {d.root} (playbook {d.playbook})")
        with Deployment(load_playbook(d.playbook), Store(d.store)) as dep:
            env.masker = dep.masker
            snap = dep.snapshot("noon")
            say(Text.assemble("1. known-good snapshot ", bold(snap.id), " (label 'noon'): the stack serves requests"))
            changes = demo_mod.plant_changes(d)
            say(f"2. an afternoon of changes: {len(changes)} variables edited, a note file touched, everything restarted;"
                " requests through the router now hang")
            say("3. envbisect diff --against noon")
            diff = dep.diff(against="noon")
            if not as_json:
                render.render_diff(env, diff, dep.masker)
            say("\n4. envbisect bisect --against noon --probe e2e")
            result = BisectRun(dep, BisectOptions(probe="e2e"), on_event=render.Progress(env, quiet=as_json)).start(diff)
        if as_json:
            env.emit_json({"diff": diff.to_json(dep.masker), "bisect": result.to_json(),
                       "planted": {"bad": demo_mod.BAD_DELTA_ID},
                       "seconds": round(_time.monotonic() - t0, 1)})
        else:
            render.render_verdict(env, result)
            planted = demo_mod.BAD_DELTA_ID
            ok = result.culprit_deltas == (planted,)
            say(f"\nplanted bad change: {planted} -> envbisect {'found it' if ok else 'DID NOT find it'}"
                f" in {result.restarts} restarts ({_time.monotonic() - t0:.0f} s in all)")
    finally:
        d.cleanup(keep)
    return 0 if result.culprit_deltas == (demo_mod.BAD_DELTA_ID,) else 1



# --- verify / revert / apply ---------------------------------------------------------------------

@app.command("verify")
def verify_cmd(ctx: typer.Context,
               probe: List[str] = typer.Option([], "--probe", help="Probes to run as the layers (default: one request, "
                                                                   "16 concurrent, multi-round, all via the router)."),
               concurrency: int = typer.Option(16, "--concurrency", min=1),
               as_json: bool = typer.Option(False, "--json")) -> int:
    """Layered health check: services, one request, a concurrent batch, a multi-round keep-alive run."""
    env = _env(ctx)
    from envbisect.trials.verify import verify

    o = _opts(ctx)
    with o.deployment() as dep:
        pb = dep.playbook
        for name in probe:
            if name not in pb.probes:
                raise UsageError(f"no probe {name!r} in {pb.path} (known: {', '.join(pb.probes)})")
        report = verify(pb, dep.transports, [pb.probes[n] for n in probe] or None, concurrency=concurrency)
    if as_json:
        env.emit_json(report.to_json())
    else:
        render.render_verify(env, report)
    return 0 if report.ok else 1


def _change(ctx: typer.Context, action: str, ids: List[str], verdict: bool, run_id: Optional[str],
            probe: Optional[str], run_verify: bool, keep_on_fail: bool, as_json: bool,
            break_lock: bool = False) -> int:
    env = _env(ctx)
    from envbisect.runs.revert import change, load_run_deltas

    o = _opts(ctx)
    with o.deployment() as dep:
        src = load_run_deltas(dep, run_id)
        if verdict:
            if src.verdict not in ("culprit", "interaction"):
                raise UsageError(f"run {src.run_id} has verdict {src.verdict or 'none'}: no culprits to {action}")
            ids = list(src.culprits)
        pname = probe or src.probe
        pr = dep.playbook.probes.get(pname) if pname else None
        if pname and pr is None:
            raise UsageError(f"no probe {pname!r} in {dep.playbook.path}")

        def decide(result) -> bool:  # noqa: ANN001
            if keep_on_fail:
                return False
            if env.stdin_isatty and not as_json:
                return typer.confirm(f"the revert of {', '.join(result.deltas)} did not make '{pname}' pass; "
                                     "put it back?", default=True)
            return True

        res = change(dep, action, ids, src, probe=pr, run_verify=run_verify, put_back_on_fail=decide,
                     on_event=render.Progress(env, quiet=as_json), break_lock=break_lock)
    if as_json:
        env.emit_json(res.to_json())
    else:
        word = "reverted" if action == "revert" else "applied"
        env.out.print(f"{word}: {', '.join(res.deltas)} (co-restart {'ok' if res.restart.ok else 'FAILED: ' + res.restart.message})")
        if res.probe_outcome:
            env.out.print(Text(f"probe {pname}: {res.probe_outcome.upper()} - {res.probe_reason}",
                           style="green" if res.probe_outcome == "pass" else "red"))
        if res.verify:
            render.render_verify(env, res.verify)
        if res.put_back:
            env.out.print(Text(f"put back: {', '.join(res.deltas)} (probe after: {res.after_put_back}). "
                           "They did not fix it: do not blame them.", style="bold yellow"))
        for n in res.notes:
            env.out.print(f"note: {n}")
    return 0 if res.ok else 1


@app.command()
def revert(ctx: typer.Context, ids: List[str] = typer.Argument(None, help="Delta ids to take out."),
           verdict: bool = typer.Option(False, "--verdict", help="Revert exactly the culprits of the last verdict."),
           run_id: Optional[str] = typer.Option(None, "--run", help="The bisect run whose deltas to use (default: last)."),
           probe: Optional[str] = typer.Option(None, "--probe", help="Probe that must pass afterwards (default: the run's)."),
           run_verify: bool = typer.Option(False, "--verify", help="Also run the layered verify."),
           keep_on_fail: bool = typer.Option(False, "--keep-on-fail", help="Keep the revert even if the probe still fails."),
           break_lock: bool = typer.Option(False, "--break-lock",
                                 help="Take the deployment lock even from a live run of another controller "
                                      "(prints whose it was). Never over an active journal."),
           as_json: bool = typer.Option(False, "--json")) -> int:
    """Take deltas out of the live configuration (journaled, co-restart), then prove the symptom is gone."""
    return _change(ctx, "revert", ids or [], verdict, run_id, probe, run_verify, keep_on_fail, as_json, break_lock)


@app.command("apply")
def apply_cmd(ctx: typer.Context, ids: List[str] = typer.Argument(..., help="Delta ids to put back."),
              run_id: Optional[str] = typer.Option(None, "--run"),
              probe: Optional[str] = typer.Option(None, "--probe"),
              run_verify: bool = typer.Option(False, "--verify"),
              break_lock: bool = typer.Option(False, "--break-lock",
                                 help="Take the deployment lock even from a live run of another controller "
                                      "(prints whose it was). Never over an active journal."),
              as_json: bool = typer.Option(False, "--json")) -> int:
    """Put deltas back into the live configuration (journaled, co-restart), then probe."""
    return _change(ctx, "apply", ids, False, run_id, probe, run_verify, True, as_json, break_lock)


# --- history -------------------------------------------------------------------------------------

def _runs(store: Store) -> list[dict]:
    rows = []
    for rd, doc in Runs(store.runs_dir).all():
        kind = str(doc.get("kind", "bisect"))
        row = {"run": rd.run_id, "kind": kind, "deployment": doc.get("deployment"), "created_at": doc.get("created_at"),
               "status": "unfinished", "culprits": [], "restarts": None}
        v = rd.file(rd.result_name(kind))
        if v.exists():
            try:
                vd = rd.read(v.name)
                if kind == "bisect":
                    row.update(status=str(vd["verdict"]), culprits=[str(c) for c in vd.get("culprits", [])],
                               restarts=vd.get("restarts"), confidence=vd.get("confidence"))
                else:
                    row.update(status="ok" if vd.get("ok") else ("put back" if vd.get("put_back") else "failed"),
                               culprits=[str(c) for c in vd.get("deltas", [])])
            except (StoreError, KeyError, TypeError, AttributeError):
                row.update(status=f"damaged {v.name}")  # one bad run must not hide the others
        if not isinstance(row["created_at"], (int, float)):
            row["created_at"] = None
        rows.append(row)
    return rows


@app.command()
def runs(ctx: typer.Context, as_json: bool = typer.Option(False, "--json")) -> int:
    """List past bisect, revert and apply runs with their verdicts."""
    env = _env(ctx)
    _opts(ctx).masker()
    rows = _runs(Store(_opts(ctx).store))
    if as_json:
        env.emit_json(rows)
        return
    if not rows:
        env.out.print("no runs yet")
        return
    t = Table("run", "kind", "when", "result", "deltas", "restarts")
    for r in rows:
        t.add_row(r["run"], r["kind"], when(r["created_at"]), r["status"], ", ".join(r["culprits"]),
                  "" if r["restarts"] is None else str(r["restarts"]))
    env.out.print(t)


@app.command()
def show(ctx: typer.Context, run: str = typer.Argument(..., help="Run id (see `envbisect runs`)."),
         as_json: bool = typer.Option(False, "--json")) -> int:
    """Print one past run."""
    env = _env(ctx)
    from envbisect.report import make_redactor

    o = _opts(ctx)
    store = Store(o.store)
    rd = Runs(store.runs_dir).get(run)
    p = rd.path
    kind = rd.kind
    res = rd.read_optional(rd.result_name(kind))
    make_redactor(p, o.masker())  # the masker learns the raw secret values this run knows of
    if as_json:
        env.emit_json({"run": run, "kind": kind, "result": res, "unfinished": res is None})
        return
    if res is None:
        env.out.print(f"run {run} ({kind}) did not finish; resume it with `envbisect bisect --resume --run {run}` "
                  f"or undo it with `envbisect restore --run {run}`")
        return
    if kind != "bisect":
        env.out.print(json.dumps(env.masker.redact_obj(res), indent=2))
        return
    try:
        env.out.print(Text.assemble(f"run {run}: verdict ", bold(res["verdict"]), f" (confidence {res['confidence']}), "
                                f"{res['restarts']} restarts, hosts left {res['state_left']}"))
        if res["culprits"]:
            env.out.print("  culprits: " + ", ".join(map(str, res["culprits"])))
        env.out.print("  " + str(res["explanation"]))
        t = Table("#", "purpose", "deltas applied", "outcome", "restart s", "probe")
        for tr in res["trials"]:
            t.add_row(str(tr["n"]), str(tr["purpose"]), str(len(tr["config"])), str(tr["outcome"]),
                      f"{float(tr['restart_s']):.1f}", str(tr["reason"]))
    except (KeyError, TypeError, ValueError) as e:
        raise StoreError(f"{rd.file(rd.result_name(kind))}: damaged run file (no usable {e})") from None
    env.out.print(t)


@app.command()
def bundle(ctx: typer.Context,
           run_id: Optional[str] = typer.Option(None, "--run", help="Run id (default: the newest bisect run)."),
           out_path: Optional[Path] = typer.Option(None, "--out", help="FILE.tar.gz or a folder (default: ./)."),
           check: Optional[Path] = typer.Option(None, "--check", help="Verify a bundle's manifest instead."),
           as_json: bool = typer.Option(False, "--json")) -> int:
    """Pack a run's evidence for the postmortem: snapshots, diff, trials, logs, metrics, report.md/.html."""
    env = _env(ctx)
    from envbisect.report.bundle import check_bundle, make_bundle

    o = _opts(ctx)
    if check is not None:
        if not check.exists():
            raise UsageError(f"{check}: no such bundle")
        problems = check_bundle(check)
        if as_json:
            env.emit_json({"bundle": str(check), "ok": not problems, "problems": problems})
        elif problems:
            for p in problems:
                env.out.print(Text(f"FAIL {p}", style="red"))
        else:
            env.out.print(f"{check}: manifest OK (every member present, sizes and sha256 match)")
        return 0 if not problems else 1
    info = make_bundle(o.store, run_id, out_path or Path("."), o.masker(strict=True) if o.playbook.exists() else None)
    if as_json:
        env.emit_json({"bundle": str(info.path), "run": info.run_id, "members": len(info.members), "size": info.size,
                   "sha256": info.sha256})
    else:
        env.out.print(Text.assemble("bundle ", bold(info.path), f" for run {info.run_id}: {len(info.members)} members, "
                                f"{info.size} bytes, sha256 {info.sha256[:16]}…"))
        env.out.print("  open report.html inside it in any browser (no network needed); "
                  f"check it with `envbisect bundle --check {info.path}`")


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
        env.err.print(f"envbisect: error: {e}")
        return int(e.exit_status)
    except BrokenPipeError:  # `envbisect runs | head`
        return int(ExitStatus.OK)
    except OSError as e:
        if e.filename is None and e.strerror is None:
            return _internal_error(env, e)
        env.err.print(f"envbisect: error: {e.filename or ''}: {e.strerror or e}")
        return int(ExitStatus.USAGE)
    except Exception as e:  # noqa: BLE001 - the last resort
        return _internal_error(env, e)
    rc = int(rc or 0)
    if rc == ExitStatus.INTERRUPTED:  # typer's Exit(130) for Ctrl-C/SIGTERM inside a command
        env.err.print("envbisect: interrupted")
    return rc


_run = run  # the name older callers know


def main() -> None:
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
