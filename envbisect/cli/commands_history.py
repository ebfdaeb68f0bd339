"""Commands that read past runs: runs, show, bundle; and correct a bisection's record: log, replay."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from envbisect.cli.base import env_of, opts_of, app
from envbisect.cli.render import bold, when
from envbisect.errors import EnvbisectError, ExitStatus, StoreError, UsageError
from envbisect.state.rundir import Runs
from envbisect.state.store import Store


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
def runs(ctx: typer.Context, as_json: bool = typer.Option(False, "--json")) -> ExitStatus:
    """List past bisect, revert and apply runs with their verdicts."""
    env = env_of(ctx)
    opts_of(ctx).masker()
    rows = _runs(Store(opts_of(ctx).store))
    if as_json:
        env.emit_json(rows)
        return ExitStatus.OK
    if not rows:
        env.out.print("no runs yet")
        return ExitStatus.OK
    t = Table("run", "kind", "when", "result", "deltas", "restarts")
    for r in rows:
        t.add_row(r["run"], r["kind"], when(r["created_at"]), r["status"], ", ".join(r["culprits"]),
                  "" if r["restarts"] is None else str(r["restarts"]))
    env.out.print(t)
    return ExitStatus.OK


@app.command()
def show(ctx: typer.Context, run: str = typer.Argument(..., help="Run id (see `envbisect runs`)."),
         as_json: bool = typer.Option(False, "--json")) -> ExitStatus:
    """Print one past run."""
    env = env_of(ctx)
    from envbisect.report import make_redactor

    o = opts_of(ctx)
    store = Store(o.store)
    rd = Runs(store.runs_dir).get(run)
    p = rd.path
    kind = rd.kind
    res = rd.read_optional(rd.result_name(kind))
    make_redactor(p, o.masker())  # the masker learns the raw secret values this run knows of
    if as_json:
        env.emit_json({"run": run, "kind": kind, "result": res, "unfinished": res is None})
        return ExitStatus.OK
    if res is None:
        env.out.print(f"run {run} ({kind}) did not finish; resume it with `envbisect bisect --resume --run {run}` "
                  f"or undo it with `envbisect restore --run {run}`")
        return ExitStatus.OK
    if kind != "bisect":
        env.out.print(json.dumps(env.masker.redact_obj(res), indent=2))
        return ExitStatus.OK
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
    return ExitStatus.OK


@app.command()
def bundle(ctx: typer.Context,
           run_id: Optional[str] = typer.Option(None, "--run", help="Run id (default: the newest bisect run)."),
           out_path: Optional[Path] = typer.Option(None, "--out", help="FILE.tar.gz or a folder (default: ./)."),
           check: Optional[Path] = typer.Option(None, "--check", help="Verify a bundle's manifest instead."),
           as_json: bool = typer.Option(False, "--json")) -> ExitStatus:
    """Pack a run's evidence for the postmortem: snapshots, diff, trials, logs, metrics, report.md/.html."""
    env = env_of(ctx)
    from envbisect.report.bundle import check_bundle, make_bundle

    o = opts_of(ctx)
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
        return ExitStatus.OK if not problems else ExitStatus.DELTAS
    info = make_bundle(o.store, run_id, out_path or Path("."), o.masker(strict=True) if o.playbook.exists() else None)
    if as_json:
        env.emit_json({"bundle": str(info.path), "run": info.run_id, "members": len(info.members), "size": info.size,
                   "sha256": info.sha256})
    else:
        env.out.print(Text.assemble("bundle ", bold(info.path), f" for run {info.run_id}: {len(info.members)} members, "
                                f"{info.size} bytes, sha256 {info.sha256[:16]}…"))
        env.out.print("  open report.html inside it in any browser (no network needed); "
                  f"check it with `envbisect bundle --check {info.path}`")
    return ExitStatus.OK


# --- correcting the record -----------------------------------------------------------------------

def _playbook_of(o):  # noqa: ANN001, ANN202
    """The playbook given with -p, when it can be read (log and replay need no hosts, nor a playbook)."""
    if not o.playbook.exists():
        return None
    from envbisect.inputs.playbook import load_playbook

    try:
        return load_playbook(o.playbook)
    except EnvbisectError:
        return None


@app.command("log")
def log_(ctx: typer.Context,
         run: Optional[str] = typer.Argument(None, help="Run id (default: the newest bisection of this deployment).")
         ) -> ExitStatus:
    """Print a bisection's trials as an editable text, for `envbisect replay` (secrets masked)."""
    env = env_of(ctx)
    from envbisect.report import make_redactor
    from envbisect.runs.replay import find_run, load_evidence, render_log

    o = opts_of(ctx)
    pb = _playbook_of(o)
    rd = find_run(Store(o.store).runs_dir, run, pb.name if pb is not None else None)
    red = make_redactor(rd.path, o.masker())
    env.write_raw(render_log(load_evidence(rd), red.masker))
    return ExitStatus.OK


@app.command()
def replay(ctx: typer.Context,
           file: Path = typer.Argument(..., help="An edited `envbisect log` (- for stdin)."),
           dry_run: bool = typer.Option(False, "--dry-run", help="Recompute and print; record nothing."),
           as_json: bool = typer.Option(False, "--json")) -> ExitStatus:
    """Recompute a bisection's verdict from an edited log, without touching the hosts; say which
    trials it still needs (`bisect --resume` runs them). The correction is recorded in the run."""
    env = env_of(ctx)
    from envbisect.cli.render import render_replay
    from envbisect.report import make_redactor
    from envbisect.runs.replay import load_evidence, parse_log, record_replay, replay_log

    o = opts_of(ctx)
    if str(file) == "-":
        text, source = env.stdin.read(), "-"
    else:
        try:
            text = file.read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise UsageError(f"{file}: cannot read: {e.strerror}") from None
        source = str(file)
    edited = parse_log(text, source)
    rd = Runs(Store(o.store).runs_dir).get(edited.run_id)
    ev = load_evidence(rd)
    base_probes = None
    pb = _playbook_of(o)
    if pb is not None and pb.name == ev.deployment and ev.doc.get("probe") in pb.probes:
        base_probes = pb.probes[ev.doc["probe"]].repeat  # a run recorded before run.json kept it
    red = make_redactor(rd.path, o.masker())
    rp = replay_log(ev, edited, base_probes=base_probes)
    if not dry_run:
        rp = record_replay(ev, rp, red.masker)
    if as_json:
        env.emit_json(rp.to_json())
    else:
        render_replay(env, rp)
    return rp.exit_status
