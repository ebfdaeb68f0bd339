"""What the commands print for people: diffs, verdicts, verify reports, progress lines. Every
function writes through an `Environment`'s consoles (so through its masker), never to sys.stdout."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from envbisect.cli.environment import Environment
from envbisect.outcome import Leave, VerdictKind

PENDING = "pending"  # a replay whose evidence does not decide yet (runs/replay.PENDING)

if TYPE_CHECKING:
    from envbisect.inputs.playbook import Probe
    from envbisect.runs.restore import RestoreResult
    from envbisect.runs.revert import ActionResult


def bold(s: Any) -> tuple[str, str]:
    return (str(s), "bold")


def when(t: float | None) -> str:
    if t is None:
        return "?"
    try:
        return datetime.fromtimestamp(t, timezone.utc).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    except (OverflowError, OSError, ValueError, TypeError):  # a damaged record, or --since 0001-01-01
        return str(t)




def one(env: Environment, text: Any) -> str:
    """A name from a host (a path, a delta id) inside a line: on that line, whatever it holds."""
    return env.shown(text, one_line=True)


def render_diff(env: Environment, result, masker) -> None:  # noqa: ANN001
    from envbisect.state.deltas import Diff, fallback_sources, is_repo_file

    assert isinstance(result, Diff)
    b = result.baseline
    head = f"baseline: snapshot {b.id} ({when(b.taken_at)})" if b else \
        "baseline: no snapshot old enough; fallback sources: " + (", ".join(fallback_sources(result)) or "none")
    if result.since:
        head += f"   since: {when(result.since)}"
    if result.last_good:  # which snapshot --since last-good picked, and why
        env.out.print(result.last_good["line"])
    if env.quiet:  # -q: one line per delta (its id), or nothing
        for d in result.deltas:
            env.out.print(one(env, d.id))
        return
    env.out.print(head)
    if not result.deltas and not result.upgrades:
        env.out.print(Text("no deltas", style="green"))
    groups: dict[tuple[str, str], list] = {}
    for d in result.deltas:
        path = one(env, d.path)
        title = f"{d.service} ({path})" if d.kind == "env" else ("repo " + path if d.kind == "git" else
                                                                  "uncommitted changes in deployed repos"
                                                                  if is_repo_file(d) else "watched files")
        groups.setdefault((d.host, title), []).append(d)
    for (host, title), items in groups.items():
        env.out.print(Text(f"\n{host} · {title}", style="bold"))
        for d in items:
            j = d.to_json(masker)
            name = one(env, d.key if d.kind == "env" else d.path)
            if d.flag is not None:
                # one flag of an argument string or a start command line: its values on each side
                old, new = (env.shown(flag_values(d.flag, v), one_line=True)
                            for v in (j.get("old_shown", j["old"]), j.get("new_shown", j["new"])))
                added = f"+ {name} {d.flag}" + ("" if new == "(switch)" else f" {new}")
                line = {"added": added, "removed": f"- {name} {d.flag}",
                        "changed": f"~ {name} {d.flag} {old} → {new}"}[d.change]
            elif d.kind == "env":
                # the value, or the shell text and what bash made of it where they differ
                old, new = (env.shown(v, one_line=True)
                            for v in (j.get("old_shown", j["old"]), j.get("new_shown", j["new"])))
                line = {"added": f"+ {name}={new}", "removed": f"- {name}",
                        "changed": f"~ {name} {old} → {new}"}[d.change] if d.key else f"? {name} changed"
            elif d.kind == "git":
                line = f"~ HEAD {(d.old or '?')[:10]} → {(d.new or '?')[:10]}"
            elif d.kind == "key":  # one key of a structured file: its value as JSON text
                old, new = (env.shown(v, one_line=True) for v in (j["old"], j["new"]))
                key = one(env, d.key)
                line = {"added": f"+ {name} {key} = {new}", "removed": f"- {name} {key} (was {old})",
                        "changed": f"~ {name} {key} {old} → {new}"}[d.change]
            else:
                sym = {"added": "+", "removed": "-", "changed": "~"}[d.change]
                line = f"{sym} {name}"
            style = {"added": "green", "removed": "red", "changed": "yellow"}[d.change]
            text = Text("  ")
            text.append(line, style=style)
            text.append(f"   [{one(env, d.id)}; from {one(env, d.baseline_source)}]", style="dim")
            env.out.print(text)
            for det in j["detail"]:
                env.out.print(Text(f"      {env.shown(det, one_line=True)}", style="dim"))
    render_upgrades(env, result.upgrades)
    if result.links():
        env.out.print(Text.assemble("\n", bold("linked"),
                                " (the same variable or engine knob changed in several services; "
                                "they may need to change together):"))
        for ids in result.links():
            env.out.print("  " + " + ".join(one(env, i) for i in ids))
    if result.drift:
        env.out.print(Text.assemble("\n", ("drift", "bold red"),
                                ": running processes whose start environment differs from their env file"))
        for dr in result.drift:
            j = dr.to_json(masker)
            env.out.print(f"  {dr.host}/{dr.service} pid {dr.pid} (started {when(dr.started_at)}): {dr.key} "
                      f"file={env.shown(j.get('file_shown') or j['file'], one_line=True)} "
                      f"process={env.shown(j['process'], one_line=True)}")
    if result.unknown_processes:
        env.out.print("\nstart environment unknown (overwritten or unreadable) for: "
                      + ", ".join(result.unknown_processes))
    for n in result.notes:
        env.out.print(Text(f"note: {env.shown(masker.redact_text(n))}", style="dim"))



def render_upgrades(env: Environment, upgrades) -> None:  # noqa: ANN001 - state.upgrades.Upgrade
    """The diff's upgrades: each package's versions, and what an engine upgrade changed under the
    deployment's settings."""
    if not upgrades:
        return
    env.out.print(Text.assemble("\n", bold("upgrades"), " (a package the service's python sees in another "
                                "version than at the baseline):"))
    for u in upgrades:
        text = Text("  ")
        text.append(f"~ {u.line()}", style="yellow")
        text.append(f"   [{u.host}]", style="dim")
        env.out.print(text)
        for e in u.effects:
            env.out.print(Text(f"      {env.shown(e, one_line=True)}", style="dim"))


def render_observed_probe(env: Environment, p) -> None:  # noqa: ANN001 - state.snapshot.ObservedProbe
    """`snapshot --probe`: what the probe said of the running stack (one line, and a note when the
    processes may not run the files the snapshot recorded)."""
    style = "green" if p.passed else ("red" if p.outcome == "fail" else "yellow")
    env.out.print(Text.assemble(f"probe {p.name} on the running stack: ", (p.outcome.upper(), f"bold {style}"),
                                f" - {p.reason}"))
    if p.unverified and not env.quiet:
        env.out.print(Text(f"note: the probe saw what runs, which may not be what the files say: {p.unverified}",
                           style="yellow"))


def flag_values(flag: str, text: str | None) -> str:
    """A flag's text without its name: ``--k v`` and ``--k=v`` give ``v``; a switch gives ``(switch)``."""
    if text is None:
        return ""
    rest = text[len(flag):] if text.startswith(flag) else text
    rest = rest[1:] if rest.startswith("=") else rest
    return rest.strip() or "(switch)"


def fmt_s(s: float | None) -> str:
    if s is None:
        return "?"
    s = int(round(s))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def config_label(config: list[str] | tuple[str, ...], total: int) -> str:
    if not config:
        return "baseline (no deltas)"
    if len(config) == total:
        return f"current (all {total} deltas)"
    shown = ", ".join(config[:3]) + (f", +{len(config) - 3} more" if len(config) > 3 else "")
    return f"{len(config)}/{total}: {shown}"


class Progress:
    """Human progress lines on stderr (stdout stays clean for --json)."""

    def __init__(self, env: Environment, quiet: bool):
        self.env, self.quiet = env, quiet
        self.total = 0

    def __call__(self, kind: str, data: dict) -> None:
        if self.quiet and kind not in ("interrupted", "restore-failed", "warning"):
            return
        if kind == "trial-start":
            self.total = data.get("total_deltas", self.total)
            eta = f" · ETA {fmt_s(data['eta_s'])}" if data.get("eta_s") else ""
            total = f"/~{data['expected_total']}" if data.get("expected_total") else ""
            purpose, config = one(self.env, data["purpose"]), one(self.env, config_label(data["config"], self.total))
            self.env.err.print(Text.assemble(bold(f"trial {data['n']}{total}"), f" · {purpose} · {config}{eta}"))
        elif kind == "trial-end":
            t = data["trial"]
            style = {"pass": "green", "fail": "red", "start-failure": "red", "unresolved": "yellow"}[t.outcome]
            self.env.err.print(Text.assemble("  → ", (t.outcome.upper(), style),
                                    f"  restart {fmt_s(t.restart_s)}, probe {t.probe_s:.1f}s: "
                                    f"{f'{t.cause}: ' if t.cause else ''}{one(self.env, t.reason)}"))
        elif kind == "step":
            self.env.err.print(Text(f"    {one(self.env, data['message'])}", style="dim"))
        elif kind in ("interrupted", "restore-failed", "warning"):
            self.env.err.print(Text(f"envbisect: {kind}: {one(self.env, data.get('error') or data.get('message'))}",
                                    style="yellow"))
        elif kind == "resumed":
            self.env.err.print(f"resuming run {data['run']} after {data['trials_done']} finished trial(s)")


def render_verdict(env: Environment, result) -> None:  # noqa: ANN001
    v = result.verdict
    colour = {VerdictKind.CULPRIT: "red", VerdictKind.INTERACTION: "red", VerdictKind.NOT_CONFIG: "magenta",
              VerdictKind.NOT_REPRODUCED: "cyan", VerdictKind.INCONCLUSIVE: "yellow", PENDING: "yellow"}[v.kind]
    env.out.print(Text.assemble("verdict: " if env.quiet else "\nverdict: ", (v.kind.upper(), f"bold {colour}"),
                                f"   confidence {v.confidence:.2f}", f"   restarts {result.restarts}"))
    if result.culprit_deltas:
        word = "must all go" if v.kind == VerdictKind.CULPRIT else "fail only together"
        env.out.print(f"  culprit(s), which {word}: " + one(env, ", ".join(result.culprit_deltas)))
    commit = getattr(result, "commit", None)
    if commit is not None and commit.commit is not None:
        c = commit.commit
        env.out.print(f"  commit: {c.sha} {c.subject!r}" + (" (a merge: one step)" if c.merge else ""))
        env.out.print(f"    author {one(env, c.author)}; files: {one(env, ', '.join(c.files)) or '(none)'}")
        if c.merged_by:  # --split-merges: a branch commit is reverted with its merge in mind
            merge = next((x for x in commit.line if x.sha == c.merged_by), None)
            env.out.print(f"    brought in by the merge {c.merged_by[:12]}" + (f" {merge.subject!r}" if merge else ""))
        split = any(x.merged_by for x in commit.line)
        steps = (f"{len(commit.line)} commits on the first-parent line, merges split" if split
                 else f"{len(commit.line)} first-parent commits")
        env.out.print(f"    first failing of {steps} "
                      f"(last passing {commit.passed[:12]}; trials {', '.join(map(str, commit.trials)) or '-'})")
    elif commit is not None:
        env.out.print(f"  commit: not narrowed to one ({commit.text})")
    if env.quiet:  # -q: the verdict and its culprits are the result
        return
    env.out.print(f"  {v.explanation}")
    sym = getattr(result, "symptom", None)
    if sym:
        env.out.print(f"  symptom: {sym['text']} (trial {sym['trial']}); trials that failed another way are no "
                      "evidence about it")
    faults = getattr(result, "faults", ())
    if len(faults) > 1:
        env.out.print(Text("  faults (each with its own fingerprint):", style="bold"))
        for f in faults:
            env.out.print(f"    {f['text']}")
    if getattr(result, "stack_state", None):
        env.out.print(f"  {result.stack_state}")
    deps = getattr(result, "dependencies", ())
    if deps:
        env.out.print(Text("  dependencies (another failure, not the symptom):", style="bold"))
        for d in deps:
            env.out.print(f"    {d['text']}")
    proof = getattr(result, "baseline_proof", None)
    for line in proof.lines() if proof is not None else ():
        env.out.print(f"  {line}")
    g = getattr(result, "guard", None)
    if g is not None:
        word, style = {True: ("safe to revert", "bold green"), False: ("NOT safe to revert", "bold red"),
                       None: ("revert cost unknown", "bold yellow")}[g.safe]
        env.out.print(Text.assemble("  guard ", bold(g.probe), ": ", (word, style), f" - {g.text}"))
    if v.kind in (VerdictKind.INCONCLUSIVE, PENDING) and v.suspects:
        env.out.print("  remaining suspects: " + ", ".join(f"{one(env, u)} ({p:.0%})" for u, p in v.suspects[:8]))
    if result.path_report:
        t = Table("layer", "target", "result", title="request path, layer by layer")
        for l in result.path_report.layers:
            t.add_row(l.name, l.target, Text("ok" if l.ok else "FAIL", style="green" if l.ok else "red"), l.reason)
        env.out.print(t)
        env.out.print(Text(f"  {result.path_report.conclusion}", style="bold"))
    for h in result.drift_hint:
        env.out.print(f"  drift: {h}")
    for n in result.notes:
        env.out.print(f"  note: {n}")
    t = Table("#", "purpose", "configuration", "outcome", "restart", "probe", title="trials")
    total = len(result.units)
    corrections = getattr(result, "corrections", None)
    for tr in result.trials + ((result.final_probe,) if result.final_probe else ()):
        standing = corrections.state(tr.n) if corrections else None
        values = sorted(r.value for r in tr.probe_runs if r.value is not None)
        probed = (f"{len(values)} samples, median {values[len(values) // 2]:.4g}" if values
                  else f"{tr.passes} pass / {len(tr.probe_runs)}")
        shown = (str(tr.outcome) if standing is None else f"{tr.outcome}, retracted" if standing == "retracted"
                 else f"{standing} (corrected; ran {tr.outcome})")
        if getattr(tr, "symptom", None) == "other" and standing is None:
            shown += " (other)"
        elif getattr(tr, "symptom", None) == "background" and standing is None:
            shown += " (as the baseline)"
        plan = getattr(tr, "restart_plan", None)
        restart = fmt_s(tr.restart_s) + (f" ({', '.join(plan.services)} only)" if plan and not plan.full else "")
        t.add_row(str(tr.n), tr.purpose, config_label(list(tr.units), total), shown, restart, probed)
    env.out.print(t)
    env.out.print(f"hosts left: {result.state_left}" + ("" if result.state_left != Leave.FIXED else
                                                     " (current minus the culprits; every exonerated delta kept)"))




def render_replay(env: Environment, rp) -> None:  # noqa: ANN001
    """`envbisect replay`: what the edit corrects, the verdict the evidence then supports, the
    trials it still needs, and what was recorded."""
    for c in rp.changes:
        env.out.print(f"correction: {c.describe()}")
    if not rp.changes:
        env.out.print("no correction: the log says what the record says")
    render_verdict(env, rp.result)
    for need in rp.needs:
        env.out.print(Text.assemble("still needed: ", bold(need.purpose),
                                    f" [{', '.join(need.deltas) or 'the baseline'}]"))
    if rp.needs:
        env.out.print(f"  `envbisect bisect --resume --run {rp.run_id}` runs it, and only what its outcome "
                      "then calls for"
                      + ("" if rp.recorded else " (once the correction is recorded: replay without --dry-run)"))
    if rp.recorded:
        kept = f"; the verdict it replaces is kept as {rp.superseded}" if rp.superseded else ""
        env.out.print(f"recorded in run {rp.run_id} (corrections.jsonl; trials.jsonl is unchanged){kept}")


def render_verify(env: Environment, report) -> None:  # noqa: ANN001
    t = Table("layer", "target", "result", "time", "detail", title="verify")
    for l in report.layers:
        res = (Text("-", style="dim") if l.ok is None
               else Text("ok" if l.ok else "FAIL", style="green" if l.ok else "red"))
        name = l.name + (" (info)" if l.informational else "")
        t.add_row(name, l.target, res, f"{l.seconds:.2f}s", l.reason)
    if not env.quiet:
        env.out.print(t)
    env.out.print(Text(report.summary, style="bold green" if report.ok else "bold red"))


def render_plan(env: Environment, plan: dict) -> None:
    """`bisect --dry-run`: what would be bisected, the premise checks, the restart bound."""
    env.out.print(Text.assemble("\nplan: probe ", bold(plan["probe"]),
                            f"; {len(plan['units'])} unit(s) to bisect"))
    for u, ds in plan["units"].items():
        env.out.print(f"  {one(env, u)}" + (f"  = {' + '.join(one(env, d) for d in ds)}" if len(ds) > 1 or ds[0] != u
                                            else ""))
    for n in plan["notes"]:
        env.out.print(f"  note: {n}")
    env.out.print("  1. " + plan["premise_checks"][0] + f" ({plan['first_premise']})"
              + "\n  2. " + plan["premise_checks"][1])
    e = plan["expected_restarts"]
    env.out.print(f"  at most {e['single culprit']} restart(s) in all for a single culprit "
              f"({e['interacting pair']} for an interacting pair, {e['two independent culprits']} "
              "for two independent culprits); each restart stops "
              + " → ".join(reversed(plan["restart_order"])) + " and starts "
              + " → ".join(" + ".join(g) for g in plan.get("start_groups") or [[n] for n in plan["restart_order"]]))
    env.out.print("dry run: no host was touched")


def render_change_plan(env: Environment, plan) -> None:  # noqa: ANN001 - runs.revert.ChangePlan
    """`revert`/`apply --dry-run`: each host and file the change would write, what in it, the
    co-restart and the probe that would follow."""
    word = {"revert": "would revert", "apply": "would apply"}[plan.action]
    for c in plan.changes:
        env.out.print(Text.assemble(f"{word} ", bold(one(env, ", ".join(c["deltas"]) or c["path"])),
                                    f" on {c['host']}: {one(env, c['path'])} "
                                    f"({one(env, '; '.join(c['what']))})"))
    for d in plan.already:
        done = "reverted" if plan.action == "revert" else "applied"
        env.out.print(f"{one(env, d)}: already {done} on the hosts (no change)")
    if plan.changes:
        env.out.print("then co-restart: stop " + " → ".join(reversed(plan.restart_order)) + ", start "
                      + " → ".join(plan.restart_order) + (f"; then probe {plan.probe}" if plan.probe else ""))
    env.out.print("dry run: no host was touched")


def render_restore_plan(env: Environment, res: RestoreResult) -> None:
    """`restore --dry-run`: what the journal of run RUN would put back, on which host."""
    for f in res.files:
        what = "its journaled bytes, mode, owner and times" if f["existed"] else "removed (it did not exist)"
        env.out.print(f"would restore {f['host']}:{one(env, f['path'])} from run {res.run}: {what}")
    for r in res.repos:
        env.out.print(f"would restore {r['host']}:{one(env, r['path'])} from run {res.run}: HEAD {str(r['head'])[:10]}")
    env.out.print("then co-restart: stop " + " → ".join(reversed(res.restart_order)) + ", start "
                  + " → ".join(res.restart_order))
    env.out.print("dry run: no host was touched")


def render_restore(env: Environment, res: RestoreResult, replica: str | None = None) -> None:
    """What `restore` did (``replica``: a fleet's replica, named on each line)."""
    who = f"{replica}: " if replica else ""
    if not res.restored:
        env.out.print(who + res.reason)
        return
    env.out.print(f"{who}restored {len(res.files)} file(s) and {len(res.repos)} repo(s) from run {res.run}; "
                  f"co-restart: {res.co_restart}")
    if res.conflicts:
        env.out.print(f"{who}left as found (changed by someone else during the run): "
                      + ", ".join(f"{c['host']}:{one(env, c['path'])}" for c in res.conflicts))


def render_timer(env: Environment, sch, done, *, write_hint: str, add_hint: str,  # noqa: ANN001
                 soft_wrap: bool = False) -> None:
    """What `schedule` and `watch --print/--install` show of a systemd unit or crontab line
    (runs/schedule.py's Schedule), and of what installing it did (`done`, None: only printed)."""
    if sch.kind == "systemd":
        if done is None:
            for path, text in sch.files.items():
                env.out.print(Text(f"# {path}", style="bold"))
                env.out.print(text, soft_wrap=soft_wrap)
            env.out.print(f"{write_hint}, then run: {sch.enable_command}")
            return
        for p in done.changed:
            env.out.print(f"wrote {p}")
        for p in done.unchanged:
            env.out.print(f"unchanged {p}")
        env.out.print("now run:")
        for step in done.next_steps:
            env.out.print(f"  {step}")
    elif done is None:
        env.out.print(sch.cron_marker)
        env.out.print(sch.cron_line, soft_wrap=soft_wrap)
        env.out.print(f"{add_hint} (or `crontab -e`)")
    elif done.changed:
        env.out.print(f"added to your crontab: {sch.cron_line}", soft_wrap=soft_wrap)
        for step in done.next_steps:
            env.out.print(f"  {step}")
    else:
        env.out.print(f"your crontab already has it: {sch.cron_line}", soft_wrap=soft_wrap)


def render_change(env: Environment, res: ActionResult, probe_name: str | None, probe: Probe | None) -> None:
    """What `revert`/`apply` did: the co-restart, the probe, the speed before and after, the verify
    report, a revert put back, the notes (--quiet: one line)."""
    word = "reverted" if res.action == "revert" else "applied"
    if env.quiet:
        env.out.print(f"{word}: {one(env, ', '.join(res.deltas))}: " + ("ok" if res.ok else "put back" if res.put_back
                                                               else "NOT ok"))
        return
    restart = "ok" if res.restart.ok else "FAILED: " + res.restart.message
    env.out.print(f"{word}: {one(env, ', '.join(res.deltas))} (co-restart {restart})")
    if res.probe_outcome:
        env.out.print(Text(f"probe {probe_name}: {res.probe_outcome.upper()} - {res.probe_reason}",
                           style="green" if res.probe_outcome == "pass" else "red"))
    if res.perf and res.perf.get("effect_text") and not (probe is not None and probe.is_perf):
        env.out.print(Text(f"{res.perf.get('metric')} before → after the {res.action}: {res.perf['effect_text']}",
                           style="red" if res.perf.get("decision") == "worse" else ""))
    if res.verify:
        render_verify(env, res.verify)
    if res.put_back:
        env.out.print(Text(f"put back: {one(env, ', '.join(res.deltas))} (probe after: {res.after_put_back}). "
                           "They did not fix it: do not blame them.", style="bold yellow"))
    for n in res.notes:
        env.out.print(f"note: {n}")
