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
from .errors import EnvbisectError, ExitStatus, UsageError
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
                # the value, or the shell text and what bash made of it where they differ
                old, new = j.get("old_shown", j["old"]), j.get("new_shown", j["new"])
                line = {"added": f"+ {name}={new}", "removed": f"- {name}",
                        "changed": f"~ {name} {old} → {new}"}[d.change] if d.key else f"? {d.path} changed"
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
                      f"file={j.get('file_shown') or j['file']} process={j['process']}")
    if result.unknown_processes:
        out.print(f"\nstart environment unknown (overwritten or unreadable) for: {', '.join(result.unknown_processes)}")
    for n in result.notes:
        out.print(Text(f"note: {masker.redact_text(n)}", style="dim"))



# --- bisect ------------------------------------------------------------------------------------

def _fmt_s(s: float | None) -> str:
    if s is None:
        return "?"
    s = int(round(s))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _config_label(config: list[str] | tuple[str, ...], total: int) -> str:
    if not config:
        return "baseline (no deltas)"
    if len(config) == total:
        return f"current (all {total} deltas)"
    shown = ", ".join(config[:3]) + (f", +{len(config) - 3} more" if len(config) > 3 else "")
    return f"{len(config)}/{total}: {shown}"


class _Progress:
    """Human progress lines on stderr (stdout stays clean for --json)."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.total = 0

    def __call__(self, kind: str, data: dict) -> None:
        if self.quiet and kind not in ("interrupted", "restore-failed", "warning"):
            return
        if kind == "trial-start":
            self.total = data.get("total_deltas", self.total)
            eta = f" · ETA {_fmt_s(data['eta_s'])}" if data.get("eta_s") else ""
            total = f"/~{data['expected_total']}" if data.get("expected_total") else ""
            err.print(f"[bold]trial {data['n']}{total}[/bold] · {data['purpose']} · "
                      f"{_config_label(data['config'], data.get('total_deltas', 0))}{eta}")
        elif kind == "trial-end":
            t = data["trial"]
            style = {"pass": "green", "fail": "red", "start-failure": "red", "unresolved": "yellow"}[t.outcome]
            err.print(Text.assemble("  → ", (t.outcome.upper(), style),
                                    f"  restart {_fmt_s(t.restart_s)}, probe {t.probe_s:.1f}s: {t.reason}"))
        elif kind == "step":
            err.print(Text(f"    {data['message']}", style="dim"))
        elif kind in ("interrupted", "restore-failed", "warning"):
            err.print(Text(f"envbisect: {kind}: {data.get('error') or data.get('message')}", style="yellow"))
        elif kind == "resumed":
            err.print(f"resuming run {data['run']} after {data['trials_done']} finished trial(s)")


def render_verdict(result) -> None:  # noqa: ANN001
    v = result.verdict
    colour = {"culprit": "red", "interaction": "red", "not-config": "magenta", "not-reproduced": "cyan",
              "inconclusive": "yellow"}[v.kind]
    out.print(Text.assemble("\nverdict: ", (v.kind.upper(), f"bold {colour}"), f"   confidence {v.confidence:.2f}",
                            f"   restarts {len(result.trials)}"))
    if result.culprit_deltas:
        word = "must all go" if v.kind == "culprit" else "fail only together"
        out.print(f"  culprit(s), which {word}: " + ", ".join(result.culprit_deltas))
    out.print(f"  {v.explanation}")
    if v.kind == "inconclusive" and v.suspects:
        out.print("  remaining suspects: " + ", ".join(f"{u} ({p:.0%})" for u, p in v.suspects[:8]))
    if result.path_report:
        t = Table("layer", "target", "result", title="request path, layer by layer")
        for l in result.path_report.layers:
            t.add_row(l.name, l.target, Text("ok" if l.ok else "FAIL", style="green" if l.ok else "red"), l.reason)
        out.print(t)
        out.print(Text(f"  {result.path_report.conclusion}", style="bold"))
    for h in result.drift_hint:
        out.print(f"  drift: {h}")
    for n in result.notes:
        out.print(f"  note: {n}")
    t = Table("#", "purpose", "configuration", "outcome", "restart", "probe", title="trials")
    total = len(result.units)
    for tr in result.trials + ((result.final_probe,) if result.final_probe else ()):
        t.add_row(str(tr.n), tr.purpose, _config_label(list(tr.units), total), tr.outcome, _fmt_s(tr.restart_s),
                  f"{tr.passes} pass / {len(tr.probe_runs)}")
    out.print(t)
    out.print(f"hosts left: {result.state_left}" + ("" if result.state_left != "fixed" else
                                                     " (current minus the culprits; every exonerated delta kept)"))


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
           as_json: bool = typer.Option(False, "--json")) -> None:
    """Find the guilty delta(s) on the live deployment, after checking the premises."""
    from .bisect import BisectOptions, BisectRun

    if leave not in ("original", "fixed"):
        raise typer.BadParameter("must be 'original' or 'fixed'", param_hint="--leave")
    if policy not in ("confirm", "fast", "thorough"):
        raise typer.BadParameter("must be 'confirm', 'fast' or 'thorough'", param_hint="--policy")
    o = _opts(ctx)
    opts = BisectOptions(probe=probe, only=tuple(only), exclude=tuple(exclude), link=tuple(link), confidence=confidence,
                         max_trials=max_trials, leave=leave, policy=policy, auto_link=not no_auto_link)
    progress = _Progress(quiet=False)
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
            diff = dep.diff(since=since, against=against)
            if not diff.deltas:
                msg = "no deltas since the baseline: nothing to bisect (the config did not change)"
                if as_json:
                    emit_json({"verdict": "not-config", "culprits": [], "confidence": None, "trials": [],
                               "state_left": "original", "explanation": msg})
                else:
                    out.print(msg)
                raise typer.Exit(int(ExitStatus.NOT_CONFIG))
            if dry_run:
                plan = run.plan(diff)
                if as_json:
                    emit_json(plan)
                else:
                    render_diff(diff, dep.masker)
                    out.print(f"\nplan: probe [bold]{plan['probe']}[/bold]; {len(plan['units'])} unit(s) to bisect")
                    for u, ds in plan["units"].items():
                        out.print(f"  {u}" + (f"  = {' + '.join(ds)}" if len(ds) > 1 or ds[0] != u else ""))
                    for n in plan["notes"]:
                        out.print(f"  note: {n}")
                    out.print("  1. " + plan["premise_checks"][0] + "\n  2. " + plan["premise_checks"][1])
                    e = plan["expected_restarts"]
                    out.print(f"  then about {e['single culprit'] - 2} more restart(s) for a single culprit "
                              f"({e['interacting pair'] - 2} for an interacting pair); each restart stops "
                              + " → ".join(reversed(plan["restart_order"])) + " and starts "
                              + " → ".join(plan["restart_order"]))
                    out.print("dry run: no host was touched")
                raise typer.Exit(0)
            try:
                result = run.start(diff)
            except KeyboardInterrupt:
                _print_resume(o, run.run_id)
                raise
    if as_json:
        emit_json(result.to_json())
    else:
        render_verdict(result)
    raise typer.Exit(int(result.exit_status))


def _print_resume(o: Options, run_id: str) -> None:
    if run_id:
        import shlex

        cfg = f" --ssh-config {shlex.quote(o.ssh_config)}" if o.ssh_config else ""
        err.print(f"To resume, run: envbisect -p {shlex.quote(str(o.playbook))} --store {shlex.quote(str(o.store))}{cfg} "
                  f"bisect --resume --run {run_id}", soft_wrap=True)


@app.command()
def restore(ctx: typer.Context,
            run_id: Optional[str] = typer.Option(None, "--run", help="The run to undo (default: the newest with an "
                                                                     "active journal)."),
            break_lock: bool = typer.Option(False, "--break-lock",
                                 help="Take the deployment lock even from a live run of another controller "
                                      "(prints whose it was). Never over an active journal."),
            as_json: bool = typer.Option(False, "--json")) -> None:
    """Undo an interrupted or crashed run from its journal (exact bytes, mode, owner, mtime, HEAD), then co-restart.
    Files someone else changed meanwhile are left as found and listed."""
    from .bisect import restore_deployment

    o = _opts(ctx)
    with o.deployment() as dep:
        res = restore_deployment(dep, run_id=run_id, break_lock=break_lock, on_event=_Progress(quiet=as_json))
    if as_json:
        emit_json(res)
    elif res["restored"]:
        out.print(f"restored {res['files']} file(s) and {res['repos']} repo(s) from run {res['run']}; "
                  f"co-restart: {res['co_restart']}")
        if res["conflicts"]:
            out.print(f"left as found (changed by someone else during the run): "
                      + ", ".join(f"{c['host']}:{c['path']}" for c in res["conflicts"]))
    else:
        out.print(res["reason"])
    raise typer.Exit(0 if res.get("co_restart_ok", True) else int(ExitStatus.CONNECTION))



@app.command()
def demo(keep: bool = typer.Option(False, "--keep", help="Leave the demo deployment's files in place."),
         as_json: bool = typer.Option(False, "--json")) -> None:
    """Run snapshot -> diff -> bisect on a built-in simulated SGLang PD deployment (real sglang-router)."""
    import time as _time

    from . import demo as demo_mod
    from .bisect import BisectOptions, BisectRun
    from .deployment import Deployment

    t0 = _time.monotonic()
    say = (lambda *_a, **_k: None) if as_json else out.print
    say("[bold]envbisect demo[/bold]: simulated prefill + decode workers behind the real sglang-router")
    d = demo_mod.prepare()
    try:
        say(f"  deployment in {d.root} (playbook {d.playbook})")
        with Deployment(load_playbook(d.playbook), Store(d.store)) as dep:
            snap = dep.snapshot("noon")
            say(f"1. known-good snapshot [bold]{snap.id}[/bold] (label 'noon'): the stack serves requests")
            changes = demo_mod.plant_changes(d)
            say(f"2. an afternoon of changes: {len(changes)} variables edited, a note file touched, everything restarted;"
                " requests through the router now hang")
            say("3. envbisect diff --against noon")
            diff = dep.diff(against="noon")
            if not as_json:
                render_diff(diff, dep.masker)
            say("\n4. envbisect bisect --against noon --probe e2e")
            result = BisectRun(dep, BisectOptions(probe="e2e"), on_event=_Progress(quiet=as_json)).start(diff)
        if as_json:
            emit_json({"diff": diff.to_json(dep.masker), "bisect": result.to_json(),
                       "planted": {"bad": demo_mod.BAD_DELTA_ID},
                       "seconds": round(_time.monotonic() - t0, 1)})
        else:
            render_verdict(result)
            planted = demo_mod.BAD_DELTA_ID
            ok = result.culprit_deltas == (planted,)
            say(f"\nplanted bad change: {planted} -> envbisect {'found it' if ok else 'DID NOT find it'}"
                f" in {len(result.trials)} restarts ({_time.monotonic() - t0:.0f} s in all)")
    finally:
        d.cleanup(keep)
    raise typer.Exit(0 if result.culprit_deltas == (demo_mod.BAD_DELTA_ID,) else 1)



# --- verify / revert / apply ---------------------------------------------------------------------

def render_verify(report) -> None:  # noqa: ANN001
    t = Table("layer", "target", "result", "time", "detail", title="verify")
    for l in report.layers:
        res = Text("-", style="dim") if l.ok is None else Text("ok" if l.ok else "FAIL", style="green" if l.ok else "red")
        name = l.name + (" (info)" if l.informational else "")
        t.add_row(name, l.target, res, f"{l.seconds:.2f}s", l.reason)
    out.print(t)
    out.print(Text(report.summary, style="bold green" if report.ok else "bold red"))


@app.command("verify")
def verify_cmd(ctx: typer.Context,
               probe: List[str] = typer.Option([], "--probe", help="Probes to run as the layers (default: one request, "
                                                                   "16 concurrent, multi-round, all via the router)."),
               concurrency: int = typer.Option(16, "--concurrency", min=1),
               as_json: bool = typer.Option(False, "--json")) -> None:
    """Layered health check: services, one request, a concurrent batch, a multi-round keep-alive run."""
    from .verify import verify

    o = _opts(ctx)
    with o.deployment() as dep:
        pb = dep.playbook
        for name in probe:
            if name not in pb.probes:
                raise UsageError(f"no probe {name!r} in {pb.path} (known: {', '.join(pb.probes)})")
        report = verify(pb, dep.transports, [pb.probes[n] for n in probe] or None, concurrency=concurrency)
    if as_json:
        emit_json(report.to_json())
    else:
        render_verify(report)
    raise typer.Exit(0 if report.ok else 1)


def _change(ctx: typer.Context, action: str, ids: List[str], verdict: bool, run_id: Optional[str],
            probe: Optional[str], run_verify: bool, keep_on_fail: bool, as_json: bool,
            break_lock: bool = False) -> None:
    from .revert import change, load_run_deltas

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
            if sys.stdin.isatty() and not as_json:
                return typer.confirm(f"the revert of {', '.join(result.deltas)} did not make '{pname}' pass; "
                                     "put it back?", default=True)
            return True

        res = change(dep, action, ids, src, probe=pr, run_verify=run_verify, put_back_on_fail=decide,
                     on_event=_Progress(quiet=as_json), break_lock=break_lock)
    if as_json:
        emit_json(res.to_json())
    else:
        word = "reverted" if action == "revert" else "applied"
        out.print(f"{word}: {', '.join(res.deltas)} (co-restart {'ok' if res.restart.ok else 'FAILED: ' + res.restart.message})")
        if res.probe_outcome:
            out.print(Text(f"probe {pname}: {res.probe_outcome.upper()} - {res.probe_reason}",
                           style="green" if res.probe_outcome == "pass" else "red"))
        if res.verify:
            render_verify(res.verify)
        if res.put_back:
            out.print(Text(f"put back: {', '.join(res.deltas)} (probe after: {res.after_put_back}). "
                           "They did not fix it: do not blame them.", style="bold yellow"))
        for n in res.notes:
            out.print(f"note: {n}")
    raise typer.Exit(0 if res.ok else 1)


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
           as_json: bool = typer.Option(False, "--json")) -> None:
    """Take deltas out of the live configuration (journaled, co-restart), then prove the symptom is gone."""
    _change(ctx, "revert", ids or [], verdict, run_id, probe, run_verify, keep_on_fail, as_json, break_lock)


@app.command("apply")
def apply_cmd(ctx: typer.Context, ids: List[str] = typer.Argument(..., help="Delta ids to put back."),
              run_id: Optional[str] = typer.Option(None, "--run"),
              probe: Optional[str] = typer.Option(None, "--probe"),
              run_verify: bool = typer.Option(False, "--verify"),
              break_lock: bool = typer.Option(False, "--break-lock",
                                 help="Take the deployment lock even from a live run of another controller "
                                      "(prints whose it was). Never over an active journal."),
              as_json: bool = typer.Option(False, "--json")) -> None:
    """Put deltas back into the live configuration (journaled, co-restart), then probe."""
    _change(ctx, "apply", ids, False, run_id, probe, run_verify, True, as_json, break_lock)


# --- history -------------------------------------------------------------------------------------

def _runs(store: Store) -> list[dict]:
    rows = []
    for p, doc in store.runs():
        kind = doc.get("kind", "bisect")
        row = {"run": p.name, "kind": kind, "deployment": doc.get("deployment"), "created_at": doc.get("created_at"),
               "status": "unfinished", "culprits": [], "restarts": None}
        v = p / ("verdict.json" if kind == "bisect" else "result.json")
        if v.exists():
            vd = json.loads(v.read_text())
            if kind == "bisect":
                row.update(status=vd["verdict"], culprits=vd.get("culprits", []), restarts=vd.get("restarts"),
                           confidence=vd.get("confidence"))
            else:
                row.update(status="ok" if vd.get("ok") else ("put back" if vd.get("put_back") else "failed"),
                           culprits=vd.get("deltas", []))
        rows.append(row)
    return rows


@app.command()
def runs(ctx: typer.Context, as_json: bool = typer.Option(False, "--json")) -> None:
    """List past bisect, revert and apply runs with their verdicts."""
    rows = _runs(Store(_opts(ctx).store))
    if as_json:
        emit_json(rows)
        return
    if not rows:
        out.print("no runs yet")
        return
    t = Table("run", "kind", "when", "result", "deltas", "restarts")
    for r in rows:
        t.add_row(r["run"], r["kind"], _when(r["created_at"]), r["status"], ", ".join(r["culprits"]),
                  "" if r["restarts"] is None else str(r["restarts"]))
    out.print(t)


@app.command()
def show(ctx: typer.Context, run: str = typer.Argument(..., help="Run id (see `envbisect runs`)."),
         as_json: bool = typer.Option(False, "--json")) -> None:
    """Print one past run."""
    store = Store(_opts(ctx).store)
    p = store.runs_dir / run
    if not (p / "run.json").exists():
        raise UsageError(f"no run {run!r} in {store.runs_dir}")
    doc = json.loads((p / "run.json").read_text())
    kind = doc.get("kind", "bisect")
    res_path = p / ("verdict.json" if kind == "bisect" else "result.json")
    res = json.loads(res_path.read_text()) if res_path.exists() else None
    if as_json:
        emit_json({"run": run, "kind": kind, "result": res, "unfinished": res is None})
        return
    if res is None:
        out.print(f"run {run} ({kind}) did not finish; resume it with `envbisect bisect --resume --run {run}` "
                  "or undo it with `envbisect restore --run {run}`")
        return
    if kind == "bisect":
        out.print(f"run {run}: verdict [bold]{res['verdict']}[/bold] (confidence {res['confidence']}), "
                  f"{res['restarts']} restarts, hosts left {res['state_left']}")
        if res["culprits"]:
            out.print("  culprits: " + ", ".join(res["culprits"]))
        out.print("  " + res["explanation"])
        t = Table("#", "purpose", "deltas applied", "outcome", "restart s", "probe")
        for tr in res["trials"]:
            t.add_row(str(tr["n"]), tr["purpose"], str(len(tr["config"])), tr["outcome"], f"{tr['restart_s']:.1f}",
                      tr["reason"])
        out.print(t)
    else:
        out.print_json(json.dumps(res))



@app.command()
def bundle(ctx: typer.Context,
           run_id: Optional[str] = typer.Option(None, "--run", help="Run id (default: the newest bisect run)."),
           out_path: Optional[Path] = typer.Option(None, "--out", help="FILE.tar.gz or a folder (default: ./)."),
           check: Optional[Path] = typer.Option(None, "--check", help="Verify a bundle's manifest instead."),
           as_json: bool = typer.Option(False, "--json")) -> None:
    """Pack a run's evidence for the postmortem: snapshots, diff, trials, logs, metrics, report.md/.html."""
    from .bundle import check_bundle, make_bundle
    from .masking import SecretMasker

    o = _opts(ctx)
    if check is not None:
        if not check.exists():
            raise UsageError(f"{check}: no such bundle")
        problems = check_bundle(check)
        if as_json:
            emit_json({"bundle": str(check), "ok": not problems, "problems": problems})
        elif problems:
            for p in problems:
                out.print(Text(f"FAIL {p}", style="red"))
        else:
            out.print(f"{check}: manifest OK (every member present, sizes and sha256 match)")
        raise typer.Exit(0 if not problems else 1)
    masker = None
    if o.playbook.exists():
        pb = load_playbook(o.playbook)
        masker = SecretMasker(pb.secret_names, pb.secret_values)
    info = make_bundle(o.store, run_id, out_path or Path("."), masker)
    if as_json:
        emit_json({"bundle": str(info.path), "run": info.run_id, "members": len(info.members), "size": info.size,
                   "sha256": info.sha256})
    else:
        out.print(f"bundle [bold]{info.path}[/bold] for run {info.run_id}: {len(info.members)} members, "
                  f"{info.size} bytes, sha256 {info.sha256[:16]}…")
        out.print("  open report.html inside it in any browser (no network needed); "
                  f"check it with `envbisect bundle --check {info.path}`")


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
