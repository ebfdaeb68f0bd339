"""Commands about the hosts' state and the snapshot store: init, snapshot, snapshots, schedule,
prune, diff. Each parses its options, calls the library, renders or emits JSON, returns an ExitStatus."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table
from rich.text import Text

from envbisect.cli import render
from envbisect.cli.base import env_of, opts_of, app
from envbisect.cli.render import bold, when
from envbisect.errors import ExitStatus, UsageError
from envbisect.state.store import Store


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
         as_json: bool = typer.Option(False, "--json")) -> ExitStatus:
    """Write a commented playbook draft from the SGLang servers and routers running on HOST (changes nothing there)."""
    env = env_of(ctx)
    import tomllib

    from envbisect.hosts.inventory import bind_inventory
    from envbisect.hosts.transport import connect
    from envbisect.inputs.playbook import Host, Playbook, Restart
    from envbisect.runs import playbook_draft as disc

    o = opts_of(ctx)
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
    services, repos, _notes = disc.interpret(doc, under=under, extra_match=match, masker=env.masker)
    doc = disc.masked(doc, env.masker)
    text, required, optional = disc.draft(
        doc, services, repos, host=key, ssh=None if o.inventory else host, inventory_host=host if o.inventory else None,
        inventory_file=inventory_file, python=target.python or "python3", name=name,
        command=env.masker.redact_text(f"init --host {host}" + (f" --under {under}" if under else "")))
    tomllib.loads(text)  # a draft that is not TOML would be a bug
    if dest is not None:
        disc.write_draft(dest, text, force=force)
    if as_json:
        env.emit_json({"host": host, "hostname": doc.get("hostname"), "draft": str(dest) if dest else None,
                   "text": None if dest else text, "todo_required": required, "todo_optional": optional,
                   **disc.summary(services, repos)})
        return ExitStatus.OK
    if dest is None:
        env.write_raw(text)
        return ExitStatus.OK
    env.out.print(Text.assemble("wrote ", bold(dest), f": {len(services)} service(s) found on "
                                f"{doc.get('hostname', host)}, {len(repos)} repo(s); nothing was changed there"))
    t = Table("service", "env file", "start", "health")
    for s in services:
        t.add_row(s.name, *(str(s.keys[k].value) if s.keys[k].known else "TODO"
                            for k in ("env_file", "start", "health")))
    env.out.print(t)
    if required:
        env.out.print(Text(f"{required} TODO (required) to fill in before envbisect can load it "
                           f"(and {optional} optional); then: envbisect -p {dest} snapshot --label known-good",
                           style="yellow"))
    else:
        env.out.print(f"{optional} TODO (optional) to look at; read the lines marked check:, then: "
                  f"envbisect -p {dest} snapshot --label known-good")
    return ExitStatus.OK


# --- snapshot ----------------------------------------------------------------------------------

@app.command()
def snapshot(ctx: typer.Context,
             label: Optional[str] = typer.Option(None, "--label", "-l", help="A name to find it by."),
             probe: Optional[str] = typer.Option(None, "--probe",
                                                 help="Also probe the running stack (no edit, no restart) and record "
                                                      "pass or fail: an observed known-good for --since last-good. "
                                                      "Exit 1 when it did not pass (the snapshot is saved)."),
             as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> ExitStatus:
    """Record the state of every host: env files, watched files, repo HEADs, process environments."""
    env = env_of(ctx)
    o = opts_of(ctx)
    if o.is_fleet():
        if probe is not None:
            raise UsageError("--probe is not available for a [fleet] playbook yet: snapshot one replica's playbook")
        return _snapshot_fleet(env, o, label, as_json)
    with o.deployment() as dep:
        pr = None
        if probe is not None:
            pr = dep.playbook.probes.get(probe)
            if pr is None:  # before any host is contacted
                raise UsageError(f"no probe {probe!r} in {dep.playbook.path} (known: "
                                 f"{', '.join(dep.playbook.probes) or 'none'})")
        snap = dep.snapshot(label, probe=pr)
        trips = dep.round_trips()
    summary = {
        "id": snap.id, "label": snap.label, "taken_at": snap.taken_at_iso, "store": str(o.store),
        "hosts": {h: {"files": len(s.files), "repos": {p: r.describe or r.head for p, r in s.repos.items()},
                      "processes": {n: p.status for n, p in s.processes.items()}, "round_trips": trips.get(h)}
                  for h, s in snap.hosts.items()},
        "probe": snap.probe.to_json() if snap.probe else None,
    }
    status = ExitStatus.OK if snap.probe is None or snap.probe.passed else ExitStatus.DELTAS
    if as_json:
        env.emit_json(summary)
        return status
    env.out.print(Text.assemble("snapshot ", bold(snap.id), f" saved in {o.store}"))
    if snap.probe is not None:
        render.render_observed_probe(env, snap.probe)
    if env.quiet:
        return status
    t = Table("host", "files", "repos", "processes", "ssh round trips")
    for h, s in summary["hosts"].items():
        t.add_row(h, str(s["files"]), ", ".join(f"{Path(p).name}@{d}" for p, d in s["repos"].items()) or "-",
                  ", ".join(f"{n}: {st}" for n, st in s["processes"].items()) or "-", str(s["round_trips"]))
    env.out.print(t)
    return status


def _snapshot_fleet(env, o, label: Optional[str], as_json: bool) -> ExitStatus:  # noqa: ANN001
    """A `[fleet]` playbook: one snapshot per replica (each its own deployment in the store)."""
    done = {}
    for name, dep in o.fleet():
        with dep:
            snap = dep.snapshot(label)
        done[name] = {"id": snap.id, "deployment": dep.playbook.name, "hosts": sorted(snap.hosts)}
        if not as_json:
            env.out.print(Text.assemble(f"replica {name}: snapshot ", bold(snap.id), f" ({dep.playbook.name})"))
    if as_json:
        env.emit_json({"label": label, "store": str(o.store), "replicas": done})
    return ExitStatus.OK


@app.command()
def snapshots(ctx: typer.Context, as_json: bool = typer.Option(False, "--json")) -> ExitStatus:
    """List stored snapshots, oldest first."""
    env = env_of(ctx)
    o = opts_of(ctx)
    snaps = Store(o.store).list()
    rows = [{"id": s.id, "label": s.label, "taken_at": s.taken_at_iso, "deployment": s.playbook,
             "hosts": sorted(s.hosts), "probe": s.probe.to_json() if s.probe else None} for s in snaps]
    if as_json:
        env.emit_json(rows)
        return ExitStatus.OK
    if not rows:
        env.out.print(f"no snapshots in {o.store} (take one with `envbisect snapshot`)")
        return ExitStatus.OK
    t = Table("id", "label", "taken at", "deployment", "hosts", "probe")
    for s, r in zip(snaps, rows):
        cell = (Text(s.probe.summary(), style="green" if s.probe.passed else "red") if s.probe
                else Text("-", style="dim"))
        t.add_row(r["id"], r["label"] or "", when(s.taken_at), r["deployment"], ", ".join(r["hosts"]), cell)
    env.out.print(t)
    return ExitStatus.OK


@app.command()
def schedule(ctx: typer.Context,
             every: str = typer.Option(..., "--every", help="How often: 15m, 1h, 6h, 1d."),
             label: str = typer.Option("auto", "--label", help="Label of the scheduled snapshots (prune treats "
                                                              "'auto' as automatic)."),
             install: bool = typer.Option(False, "--install", help="Write the systemd user units (or add the "
                                                                   "crontab line) instead of printing them."),
             probe: Optional[str] = typer.Option(None, "--probe", help="Each snapshot also probes the running stack "
                                                 "(`snapshot --probe`): observed known-goods for --since last-good."),
             cron: bool = typer.Option(False, "--cron", help="A crontab line even where systemd runs."),
             systemd: bool = typer.Option(False, "--systemd", help="systemd user units even where systemd is "
                                                                  "not detected."),
             as_json: bool = typer.Option(False, "--json")) -> ExitStatus:
    """Take `snapshot --label auto` on a timer: a systemd user timer, or a crontab line without systemd."""
    env = env_of(ctx)
    from envbisect.runs.schedule import install as do_install, make_schedule

    if cron and systemd:
        raise typer.BadParameter("give --cron or --systemd, not both", param_hint="--cron")
    o = opts_of(ctx)
    o.masker()
    sch = make_schedule(every=every, label=label, playbook=o.playbook, store=o.store, ssh_config=o.ssh_config,
                        inventory=o.inventory, kind="cron" if cron else ("systemd" if systemd else None),
                        probe=probe)
    done = do_install(sch) if install else None
    if as_json:
        env.emit_json({**sch.to_json(), "installed": done.to_json() if done else None})
        return ExitStatus.OK
    import shlex

    again = f"envbisect schedule --every {every}" + (f" --label {label}" if label != "auto" else "") \
        + (f" --probe {shlex.quote(probe)}" if probe else "") \
        + (" --cron" if cron else "") + (" --systemd" if systemd else "") + " --install"
    head = sch.command[:len(sch.command) - sch.command[::-1].index("snapshot") - 1]  # up to the subcommand
    deploy_hook = ("after a deploy, from its hook: " + " ".join(shlex.quote(a) for a in head)
                   + " snapshot --label deploy-$(git rev-parse --short HEAD)")
    # a crontab line or unit file is copied as printed: a line wrapped at the terminal's width would be two
    render.render_timer(env, sch, done, write_hint=f"write them with `{again}`", add_hint=f"add it with `{again}`",
                        soft_wrap=True)
    env.out.print(Text(deploy_hook, style="dim"))
    return ExitStatus.OK


@app.command()
def prune(ctx: typer.Context,
          keep: str = typer.Option(..., "--keep", help="Keep snapshots newer than this: 14d, 36h, 2w."),
          keep_labelled: bool = typer.Option(False, "--keep-labelled",
                                             help="Keep every snapshot with a label other than 'auto'/'diff'."),
          dry_run: bool = typer.Option(False, "--dry-run", help="List what would go; remove nothing."),
          as_json: bool = typer.Option(False, "--json")) -> ExitStatus:
    """Thin the store: old automatic snapshots go (never one a run uses, never the newest), then unused blobs."""
    env = env_of(ctx)
    from rich.table import Column

    from envbisect.state.prune import parse_duration, prune as do_prune

    o = opts_of(ctx)
    o.masker()
    res = do_prune(Store(o.store), keep_s=parse_duration(keep, "--keep"), keep_labelled=keep_labelled, dry_run=dry_run)
    if as_json:
        env.emit_json(res.to_json())
        return ExitStatus.OK
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
    return ExitStatus.OK


# --- diff --------------------------------------------------------------------------------------

@app.command()
def diff(ctx: typer.Context,
         since: Optional[str] = typer.Option(None, "--since", "-s",
                                             help="Known-good TIME: noon, midnight, 'today 12:00', 'yesterday 18:00', "
                                                  "'2h ago', ISO 8601, epoch; or last-good: the newest snapshot whose "
                                                  "probe passed (`snapshot --probe`)."),
         against: Optional[str] = typer.Option(None, "--against", "-a", help="A snapshot label, id or file."),
         as_json: bool = typer.Option(False, "--json")) -> ExitStatus:
    """What changed since the last known-good state? Exit 0: nothing, 1: deltas found."""
    env = env_of(ctx)
    o = opts_of(ctx)
    with o.deployment() as dep:
        result = dep.diff(since=since, against=against)
        masker = dep.masker
    if as_json:
        env.emit_json(result.to_json(masker))
    else:
        render.render_diff(env, result, masker)
    return ExitStatus.DELTAS if result.deltas else ExitStatus.OK
