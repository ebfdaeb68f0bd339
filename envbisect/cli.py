"""Command line: a thin layer over `envbisect.deployment` and friends.

This is the one place that maps errors to exit statuses and one-line messages (see errors.py).
"""
from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import __version__
from .deployment import ConnectOptions, Deployment
from .errors import EnvbisectError, ExitStatus
from .playbook import load_playbook
from .store import Store

app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
    help="Which change broke the serving stack, exactly, and is it a change at all?",
)
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


@dataclass
class Options:
    playbook: Path
    store: Path
    ssh_config: Optional[str]
    accept_new_host_key: bool
    connect_attempts: int

    def deployment(self) -> Deployment:
        return Deployment(load_playbook(self.playbook), Store(self.store),
                          ConnectOptions(self.ssh_config, self.accept_new_host_key, self.connect_attempts))


def _opts(ctx: typer.Context) -> Options:
    return ctx.ensure_object(Options)  # type: ignore[return-value]


@app.callback()
def _main(
    ctx: typer.Context,
    playbook: Path = typer.Option(Path("envbisect.toml"), "--playbook", "-p", help="Deployment description (TOML)."),
    store: Path = typer.Option(Path("snapshots"), "--store", help="Local store of snapshots and runs."),
    ssh_config: Optional[str] = typer.Option(None, "--ssh-config", help="OpenSSH client config (default ~/.ssh/config)."),
    accept_new_host_key: bool = typer.Option(False, "--accept-new-host-key",
                                             help="Trust and record an unknown host key (a changed key is still refused)."),
    connect_attempts: int = typer.Option(3, "--connect-attempts", min=1, help="SSH connection attempts per host."),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="-v info, -vv debug (shows SSH round trips)."),
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
) -> None:
    if version:
        out.print(f"envbisect {__version__}")
        raise typer.Exit(0)
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if verbose < 2:
        logging.getLogger("paramiko").setLevel(logging.WARNING)
    ctx.obj = Options(playbook, store, ssh_config, accept_new_host_key, connect_attempts)


def emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")


def _when(t: float | None) -> str:
    if t is None:
        return "?"
    return datetime.fromtimestamp(t, timezone.utc).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


# --- snapshot ----------------------------------------------------------------------------------

@app.command()
def snapshot(ctx: typer.Context, label: Optional[str] = typer.Option(None, "--label", "-l", help="A name to find it by."),
             as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Record the state of every host: env files, watched files, repo HEADs, process environments."""
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
        emit_json(summary)
        return
    out.print(f"snapshot [bold]{snap.id}[/bold] saved in {o.store}")
    t = Table("host", "files", "repos", "processes", "ssh round trips")
    for h, s in summary["hosts"].items():
        t.add_row(h, str(s["files"]), ", ".join(f"{Path(p).name}@{d}" for p, d in s["repos"].items()) or "-",
                  ", ".join(f"{n}: {st}" for n, st in s["processes"].items()) or "-", str(s["round_trips"]))
    out.print(t)


@app.command()
def snapshots(ctx: typer.Context, as_json: bool = typer.Option(False, "--json")) -> None:
    """List stored snapshots, oldest first."""
    o = _opts(ctx)
    snaps = Store(o.store).list()
    rows = [{"id": s.id, "label": s.label, "taken_at": s.taken_at_iso, "deployment": s.playbook,
             "hosts": sorted(s.hosts)} for s in snaps]
    if as_json:
        emit_json(rows)
        return
    if not rows:
        out.print(f"no snapshots in {o.store} (take one with `envbisect snapshot`)")
        return
    t = Table("id", "label", "taken at", "deployment", "hosts")
    for s, r in zip(snaps, rows):
        t.add_row(r["id"], r["label"] or "", _when(s.taken_at), r["deployment"], ", ".join(r["hosts"]))
    out.print(t)


# --- diff --------------------------------------------------------------------------------------

@app.command()
def diff(ctx: typer.Context,
         since: Optional[str] = typer.Option(None, "--since", "-s",
                                             help="Known-good TIME: noon, midnight, 'today 12:00', 'yesterday 18:00', '2h ago', ISO 8601, epoch."),
         against: Optional[str] = typer.Option(None, "--against", "-a", help="A snapshot label, id or file."),
         as_json: bool = typer.Option(False, "--json")) -> None:
    """What changed since the last known-good state? Exit 0: nothing, 1: deltas found."""
    o = _opts(ctx)
    with o.deployment() as dep:
        result = dep.diff(since=since, against=against)
        masker = dep.masker
    if as_json:
        emit_json(result.to_json(masker))
    else:
        render_diff(result, masker)
    raise typer.Exit(int(ExitStatus.DELTAS if result.deltas else ExitStatus.OK))


def render_diff(result, masker) -> None:  # noqa: ANN001
    from .deltas import Diff

    assert isinstance(result, Diff)
    b = result.baseline
    head = f"baseline: snapshot {b.id} ({_when(b.taken_at)})" if b else "baseline: no snapshot old enough; fallback sources"
    if result.since:
        head += f"   since: {_when(result.since)}"
    out.print(head)
    if not result.deltas:
        out.print("[green]no deltas[/green]")
    groups: dict[tuple[str, str], list] = {}
    for d in result.deltas:
        title = f"{d.service} ({d.path})" if d.kind == "env" else ("repo " + d.path if d.kind == "git" else "watched files")
        groups.setdefault((d.host, title), []).append(d)
    for (host, title), items in groups.items():
        out.print(Text(f"\n{host} · {title}", style="bold"))
        for d in items:
            j = d.to_json(masker)
            name = d.key if d.kind == "env" else d.path
            if d.kind == "env":
                line = {"added": f"+ {name}={j['new']}", "removed": f"- {name}",
                        "changed": f"~ {name} {j['old']} → {j['new']}"}[d.change] if d.key else f"? {d.path} changed"
            elif d.kind == "git":
                line = f"~ HEAD {(d.old or '?')[:10]} → {(d.new or '?')[:10]}"
            else:
                sym = {"added": "+", "removed": "-", "changed": "~"}[d.change]
                line = f"{sym} {name}"
            style = {"added": "green", "removed": "red", "changed": "yellow"}[d.change]
            text = Text("  ")
            text.append(line, style=style)
            text.append(f"   [{d.id}; from {d.baseline_source}]", style="dim")
            out.print(text)
            for det in j["detail"]:
                out.print(Text(f"      {det}", style="dim"))
    if result.links():
        out.print("\n[bold]linked[/bold] (same variable changed in several services; they may need to change together):")
        for ids in result.links():
            out.print("  " + " + ".join(ids))
    if result.drift:
        out.print("\n[bold red]drift[/bold red]: running processes whose start environment differs from their env file")
        for dr in result.drift:
            j = dr.to_json(masker)
            out.print(f"  {dr.host}/{dr.service} pid {dr.pid} (started {_when(dr.started_at)}): {dr.key} "
                      f"file={j['file']} process={j['process']}")
    if result.unknown_processes:
        out.print(f"\nstart environment unknown (overwritten or unreadable) for: {', '.join(result.unknown_processes)}")
    for n in result.notes:
        out.print(Text(f"note: {masker.redact_text(n)}", style="dim"))


def main() -> None:
    try:
        app(standalone_mode=True)
    except EnvbisectError as e:
        err.print(Text(f"envbisect: error: {e}"))
        sys.exit(int(e.exit_status))
    except OSError as e:
        err.print(Text(f"envbisect: error: {e.filename or ''}: {e.strerror or e}"))
        sys.exit(int(ExitStatus.USAGE))
    except KeyboardInterrupt:
        err.print("envbisect: interrupted")
        sys.exit(int(ExitStatus.INTERRUPTED))


if __name__ == "__main__":
    main()
