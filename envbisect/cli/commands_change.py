"""Commands that change the live deployment (journaled, co-restarted): bisect, restore, demo,
verify, revert, apply."""
from __future__ import annotations

from typing import List, Optional

import typer
from rich.text import Text

from envbisect.cli import render
from envbisect.cli.base import Options, env_of, opts_of, app
from envbisect.cli.render import bold
from envbisect.errors import EnvbisectError, ExitStatus, UsageError
from envbisect.outcome import Leave
from envbisect.inputs.playbook import load_playbook
from envbisect.runs.revert import ChangeRequest
from envbisect.state.store import Store


DRY_RUN_HELP = "Say what would change on which host; touch nothing, take no lock."


# --- bisect ------------------------------------------------------------------------------------

@app.command()
def bisect(ctx: typer.Context,
           since: Optional[str] = typer.Option(None, "--since", "-s", help="Known-good TIME (see `diff`)."),
           against: Optional[str] = typer.Option(None, "--against", "-a", help="Known-good snapshot label or id."),
           probe: Optional[str] = typer.Option(None, "--probe",
                                               help="Probe name from the playbook (default: the first)."),
           guard: Optional[str] = typer.Option(None, "--guard",
                                               help="A perf probe: report a culprit as safe to revert only if "
                                                    "reverting it costs no more than its `regression`."),
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
           split_merges: bool = typer.Option(False, "--split-merges",
                                             help="A guilty HEAD move: search a merge's second-parent commits too."),
           dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan; touch nothing."),
           resume: bool = typer.Option(False, "--resume", help="Continue the last interrupted run."),
           run_id: Optional[str] = typer.Option(None, "--run", help="With --resume: which run."),
           retract: List[int] = typer.Option([], "--retract", metavar="N",
                                             help="With --resume: drop trial N from the evidence (kept in the record, "
                                                  "marked retracted) and go on from what the search then asks."),
           break_lock: bool = typer.Option(False, "--break-lock",
                                 help="Take the deployment lock even from a live run of another controller "
                                      "(prints whose it was). Never over an active journal."),
           as_json: bool = typer.Option(False, "--json")) -> ExitStatus:
    """Find the guilty delta(s) on the live deployment, after checking the premises."""
    env = env_of(ctx)
    from envbisect.runs.bisect import BisectRun
    from envbisect.runs.plan import BisectOptions, parse_leave, parse_policy

    leave, policy = parse_leave(leave), parse_policy(policy)
    if retract and not resume:
        raise UsageError("--retract N corrects a recorded run: use it with --resume (see `envbisect log`)")
    o = opts_of(ctx)
    opts = BisectOptions(probe=probe, only=tuple(only), exclude=tuple(exclude), link=tuple(link), confidence=confidence,
                         max_trials=max_trials, leave=leave, policy=policy, auto_link=not no_auto_link,
                         guard=guard, split_merges=split_merges)
    progress = env.listener(render.Progress(env, quiet=env.quiet))
    if o.is_fleet():
        for flag, given in (("--resume", resume), ("--dry-run", dry_run), ("--guard", guard is not None),
                            ("--leave fixed", leave is Leave.FIXED)):
            if given:
                raise UsageError(f"{flag} is not available for a [fleet] playbook yet: bisect one replica's playbook")
        return _bisect_fleet(env, o, opts, progress, since, against, as_json, break_lock)
    with o.deployment() as dep:
        run = BisectRun(dep, opts, on_event=progress, break_lock=break_lock)
        if resume:
            try:
                result = run.resume(run_id, retract=tuple(retract))
            except KeyboardInterrupt:
                _print_resume(o, run.run_id)
                raise
            last_good = None
        else:
            started = _bisect_start(env, o, dep, run, since=since, against=against, dry_run=dry_run, as_json=as_json)
            if started is None:
                return ExitStatus.OK
            result, last_good = started
    return _verdict_out(env, result, as_json, last_good)


def _bisect_start(env, o: Options, dep, run, *, since: Optional[str], against: Optional[str],  # noqa: ANN001
                  dry_run: bool, as_json: bool):  # noqa: ANN202
    """A new run over the diff since the baseline: (its result, the last-good snapshot it picked),
    or None once a --dry-run's plan is shown."""
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
        return None
    if diff.last_good:  # which snapshot --since last-good picked (stdout stays the verdict)
        env.event("baseline", {"last_good": diff.last_good})
        if not env.quiet:
            env.err.print(diff.last_good["line"])
    try:
        return run.start(diff), diff.last_good
    except KeyboardInterrupt:
        _print_resume(o, run.run_id)
        raise


def _verdict_out(env, result, as_json: bool, last_good=None) -> ExitStatus:  # noqa: ANN001
    """The verdict: an event, then --json or the rendering; its exit status."""
    env.event("verdict", {"run": result.run_id, "verdict": result.verdict.kind, "culprits": list(result.culprit_deltas),
                          "confidence": round(result.verdict.confidence, 4), "restarts": result.restarts,
                          "state_left": result.state_left, "exit_status": int(result.exit_status)})
    if as_json:
        env.emit_json({**result.to_json(), **({"last_good": last_good} if last_good else {})})
    else:
        render.render_verdict(env, result)
    return result.exit_status


def _bisect_fleet(env, o: Options, opts, progress, since, against,  # noqa: ANN001
                  as_json: bool, break_lock: bool) -> ExitStatus:
    from contextlib import ExitStack

    from envbisect.runs.fleet import FleetRun

    reps = o.fleet()
    with ExitStack() as stack:
        for _n, dep in reps:
            stack.enter_context(dep)
        fleet = FleetRun(reps, Store(o.store), opts, on_event=progress, break_lock=break_lock).start(
            since=since, against=against)
    env.event("verdict", {"verdict": fleet.result.verdict.kind, "culprits": list(fleet.result.culprit_deltas),
                          "replicas": len(fleet.replicas), "exit_status": int(fleet.result.exit_status)})
    if as_json:
        env.emit_json(fleet.to_json())
    else:
        render.render_verdict(env, fleet.result)
        env.out.print(f"fleet: {len(fleet.replicas)} replicas, {fleet.rounds} rounds, {len(fleet.result.trials)} "
                      f"trials, {fleet.wall_s:.0f} s"
                      + "".join(f"; {n} excluded ({why})" for n, why in fleet.excluded.items()))
    return fleet.result.exit_status


def _print_resume(o: Options, run_id: str) -> None:
    if run_id:
        import shlex

        cfg = f" --ssh-config {shlex.quote(o.ssh_config)}" if o.ssh_config else ""
        cfg += f" --inventory {shlex.quote(o.inventory)}" if o.inventory else ""
        o.env.err.print(f"To resume, run: envbisect -p {shlex.quote(str(o.playbook))} "
                        f"--store {shlex.quote(str(o.store))}{cfg} bisect --resume --run {run_id}", soft_wrap=True)


@app.command()
def restore(ctx: typer.Context,
            run_id: Optional[str] = typer.Option(None, "--run", help="The run to undo (default: the newest with an "
                                                                     "active journal)."),
            break_lock: bool = typer.Option(False, "--break-lock",
                                 help="Take the deployment lock even from a live run of another controller "
                                      "(prints whose it was). Never over an active journal."),
            dry_run: bool = typer.Option(False, "--dry-run", help=DRY_RUN_HELP),
            as_json: bool = typer.Option(False, "--json")) -> ExitStatus:
    """Undo an interrupted or crashed run from its journal (exact bytes, mode, owner, mtime, HEAD), then co-restart.
    Files someone else changed meanwhile are left as found and listed."""
    env = env_of(ctx)
    from envbisect.runs.restore import restore_deployment

    o = opts_of(ctx)
    if o.is_fleet():
        if dry_run:
            raise UsageError("--dry-run is not available for a [fleet] playbook yet: restore one replica's playbook")
        return _restore_fleet(env, o, run_id, break_lock, as_json)
    with o.deployment() as dep:
        res = restore_deployment(dep, run_id=run_id, break_lock=break_lock, dry_run=dry_run,
                                 on_event=env.listener(render.Progress(env, quiet=as_json or env.quiet)))
    env.event("restore", res.to_json())
    if as_json:
        env.emit_json(res.to_json())
    elif dry_run and res.run:
        render.render_restore_plan(env, res)
    else:
        render.render_restore(env, res)
    return ExitStatus.OK if res.co_restart_ok else ExitStatus.CONNECTION


def _restore_fleet(env, o: Options, run_id: Optional[str], break_lock: bool,  # noqa: ANN001
                   as_json: bool) -> ExitStatus:
    """A `[fleet]` playbook: every replica is undone from its own journal (one after the other: a
    replica that cannot be reached does not keep the others half-applied)."""
    from envbisect.runs.restore import RestoreResult, restore_deployment

    results: dict[str, RestoreResult] = {}
    status = ExitStatus.OK
    for name, dep in o.fleet():
        try:
            with dep:
                progress = render.Progress(env, quiet=as_json or env.quiet)
                results[name] = restore_deployment(dep, run_id=run_id, break_lock=break_lock,
                                                   on_event=env.listener(progress))
        except EnvbisectError as e:  # the others are still restored; this one is reported
            results[name] = RestoreResult(False, reason=str(e), error=True)
            status = status or e.exit_status
        if not results[name].co_restart_ok:
            status = status or ExitStatus.CONNECTION
    if as_json:
        env.emit_json({"replicas": {name: res.to_json() for name, res in results.items()}})
    else:
        for name, res in results.items():
            render.render_restore(env, res, replica=name)
    return status


@app.command()
def demo(ctx: typer.Context,
         keep: bool = typer.Option(False, "--keep", help="Leave the demo deployment's files in place."),
         perf: bool = typer.Option(False, "--perf", help="A speed regression instead of a hang: bisect with the "
                                                         "perf probe `throughput` (statistical, sampled)."),
         as_json: bool = typer.Option(False, "--json")) -> ExitStatus:
    """Run snapshot -> diff -> bisect on a built-in simulated SGLang PD deployment (real sglang-router)."""
    env = env_of(ctx)
    import time as _time

    from envbisect.cli import demo as demo_mod
    from envbisect.runs.bisect import BisectOptions, BisectRun
    from envbisect.runs.deployment import Deployment

    t0 = _time.monotonic()
    say = (lambda *_a, **_k: None) if as_json else env.out.print
    say(Text.assemble(bold("envbisect demo" + (" --perf" if perf else "")),
                      ": simulated prefill + decode workers behind the real sglang-router"))
    planted = demo_mod.PERF_BAD_ID if perf else demo_mod.BAD_DELTA_ID
    probe = "throughput" if perf else "e2e"
    d = demo_mod.prepare(perf=perf)
    try:
        say(f"  deployment in {d.root} (playbook {d.playbook})")
        with Deployment(load_playbook(d.playbook), Store(d.store)) as dep:
            env.masker = dep.masker
            snap = dep.snapshot("noon")
            say(Text.assemble("1. known-good snapshot ", bold(snap.id), " (label 'noon'): the stack serves requests"))
            changes = demo_mod.plant_changes(d, perf=perf)
            symptom = ("nothing fails, but decode got slower (one knob sped it up, another slowed it more)" if perf
                       else "requests through the router now hang")
            say(f"2. an afternoon of changes: {len(changes)} variables edited, a note file touched, everything "
                f"restarted; {symptom}")
            say("3. envbisect diff --against noon")
            diff = dep.diff(against="noon")
            if not as_json:
                render.render_diff(env, diff, dep.masker)
            say(f"\n4. envbisect bisect --against noon --probe {probe}"
                + ("   (tokens/s sampled per start, judged against the baseline measured first)" if perf else ""))
            progress = env.listener(render.Progress(env, quiet=as_json or env.quiet))
            result = BisectRun(dep, BisectOptions(probe=probe), on_event=progress).start(diff)
        if as_json:
            env.emit_json({"diff": diff.to_json(dep.masker), "bisect": result.to_json(),
                           "planted": {"bad": planted}, "seconds": round(_time.monotonic() - t0, 1)})
        else:
            render.render_verdict(env, result)
            ok = result.culprit_deltas == (planted,)
            say(f"\nplanted bad change: {planted} -> envbisect {'found it' if ok else 'DID NOT find it'}"
                f" in {result.restarts} restarts ({_time.monotonic() - t0:.0f} s in all)")
            if perf and ok:
                fast = f"{demo_mod.PERF_SPEEDUP[0]}:{demo_mod.PERF_SPEEDUP[1]}"
                say(f"the speed-up {fast}={demo_mod.PERF_SPEEDUP[2]} was not blamed: reverting only {planted} keeps it")
    finally:
        d.cleanup(keep)
    return ExitStatus.OK if result.culprit_deltas == (planted,) else ExitStatus.DELTAS



# --- verify / revert / apply ---------------------------------------------------------------------

@app.command("verify")
def verify_cmd(ctx: typer.Context,
               probe: List[str] = typer.Option([], "--probe", help="Probes to run as the layers (default: one request, "
                                                                   "16 concurrent, multi-round, all via the router)."),
               concurrency: int = typer.Option(16, "--concurrency", min=1),
               as_json: bool = typer.Option(False, "--json")) -> ExitStatus:
    """Layered health check: services, one request, a concurrent batch, a multi-round keep-alive run."""
    env = env_of(ctx)
    from envbisect.trials.verify import verify

    o = opts_of(ctx)
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
    return ExitStatus.OK if report.ok else ExitStatus.DELTAS


def _change(ctx: typer.Context, req: ChangeRequest, *, keep_on_fail: bool, as_json: bool, break_lock: bool,
            dry_run: bool) -> ExitStatus:
    """revert and apply: the request resolved (runs/revert.prepare_change), planned or made, rendered."""
    env = env_of(ctx)
    from envbisect.runs.revert import change, plan_change, prepare_change

    o = opts_of(ctx)
    with o.deployment() as dep:
        prep = prepare_change(dep, req, on_note=lambda note: env.err.print(f"envbisect: {note}"))

        def decide(result) -> bool:  # noqa: ANN001
            if keep_on_fail:
                return False
            if env.stdin_isatty and not as_json:
                return typer.confirm(f"the revert of {', '.join(result.deltas)} did not make '{prep.probe_name}' "
                                     "pass; put it back?", default=True)
            return True

        if dry_run:
            plan = plan_change(dep, req.action, prep.ids, prep.source, probe=prep.probe, from_verdict=req.from_verdict)
            env.event("plan", plan.to_json())
            if as_json:
                env.emit_json(plan.to_json())
            else:
                render.render_change_plan(env, plan)
            return ExitStatus.OK
        res = change(dep, req.action, prep.ids, prep.source, probe=prep.probe, run_verify=req.run_verify,
                     put_back_on_fail=decide, on_event=env.listener(render.Progress(env, quiet=as_json or env.quiet)),
                     break_lock=break_lock, perf_guard=prep.perf_guard, from_verdict=req.from_verdict)
    env.event("result", res.to_json())
    if as_json:
        env.emit_json(res.to_json())
    else:
        render.render_change(env, res, prep.probe_name, prep.probe)
    return ExitStatus.OK if res.ok else ExitStatus.DELTAS


@app.command()
def revert(ctx: typer.Context, ids: List[str] = typer.Argument(None, help="Delta ids to take out."),
           verdict: bool = typer.Option(False, "--verdict", help="Revert exactly the culprits of the last verdict."),
           run_id: Optional[str] = typer.Option(None, "--run",
                                                help="The bisect run whose deltas to use (default: last)."),
           probe: Optional[str] = typer.Option(None, "--probe",
                                               help="Probe that must pass afterwards (default: the run's)."),
           run_verify: bool = typer.Option(False, "--verify", help="Also run the layered verify."),
           keep_on_fail: bool = typer.Option(False, "--keep-on-fail",
                                             help="Keep the revert even if the probe still fails."),
           guard: Optional[str] = typer.Option(None, "--guard", help="A perf probe measured before and after "
                                               "(default with --verify: the playbook's first perf probe)."),
           accept_cost: bool = typer.Option(False, "--accept-cost",
                                            help="With --verdict: revert even when the bisection's guard measured "
                                                 "that it costs speed."),
           break_lock: bool = typer.Option(False, "--break-lock",
                                 help="Take the deployment lock even from a live run of another controller "
                                      "(prints whose it was). Never over an active journal."),
           dry_run: bool = typer.Option(False, "--dry-run", help=DRY_RUN_HELP),
           as_json: bool = typer.Option(False, "--json")) -> ExitStatus:
    """Take deltas out of the live configuration (journaled, co-restart), then prove the symptom is gone."""
    req = ChangeRequest("revert", tuple(ids or ()), verdict, run_id, probe, run_verify, guard, accept_cost)
    return _change(ctx, req, keep_on_fail=keep_on_fail, as_json=as_json, break_lock=break_lock, dry_run=dry_run)


@app.command("apply")
def apply_cmd(ctx: typer.Context, ids: List[str] = typer.Argument(..., help="Delta ids to put back."),
              run_id: Optional[str] = typer.Option(None, "--run"),
              probe: Optional[str] = typer.Option(None, "--probe"),
              run_verify: bool = typer.Option(False, "--verify"),
              guard: Optional[str] = typer.Option(None, "--guard", help="A perf probe measured before and after."),
              break_lock: bool = typer.Option(False, "--break-lock",
                                 help="Take the deployment lock even from a live run of another controller "
                                      "(prints whose it was). Never over an active journal."),
              dry_run: bool = typer.Option(False, "--dry-run", help=DRY_RUN_HELP),
              as_json: bool = typer.Option(False, "--json")) -> ExitStatus:
    """Put deltas back into the live configuration (journaled, co-restart), then probe."""
    req = ChangeRequest("apply", tuple(ids), False, run_id, probe, run_verify, guard)
    return _change(ctx, req, keep_on_fail=True, as_json=as_json, break_lock=break_lock, dry_run=dry_run)
