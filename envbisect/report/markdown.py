"""The report as Markdown."""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from envbisect.report.common import _OUTCOME_LETTER, _RENDER_MASKER, _t
from envbisect.report.record import RunRecord
from envbisect.report.story import _STATE_MEANING, _VERDICT_MEANING, _clock, _culprit_deltas, _delta_unit, _env_rows, _evidence_for, _is_premise, _premise, _question, _rel, _requests, _secs, _short, _tail, _timeline, _ts, max_latency

# ------------------------------------------------------------------------------------- Markdown

def _md(s: Any) -> str:
    """Text safe inside a Markdown table cell."""
    s = _t(s)
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ").replace("`", "'")


def _md_table(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(_md(h) for h in head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        out.append("| " + " | ".join(_md(c) for c in r) + " |")
    return out


def _fence(text: str) -> list[str]:
    fence = "```"
    while fence in text:
        fence += "`"
    return [fence + "text", text, fence]


def _text_grid(rec: RunRecord) -> list[str]:
    units = list(rec.units)
    if not rec.trials:
        return []
    width = min(max((len(u) for u in units), default=7), 60)
    culprits = set(rec.culprit_units)
    head = " " * (width + 3) + " ".join(f"{t.get('n', '?'):>2}" for t in rec.trials)
    lines = [head]
    for u in units:
        mark = "!" if u in culprits else " "
        cells = " ".join(" ■" if u in (t.get("units") or []) else " ·" for t in rec.trials)
        lines.append(f"{mark} {u[:width]:<{width}} {cells}")
    lines.append(f"  {'outcome':<{width}} " + " ".join(f"{_OUTCOME_LETTER.get(t.get('outcome'), '?'):>2}"
                                                      for t in rec.trials))
    lines.append(f"  {'max latency s':<{width}} " + " ".join(
        _grid_lat(max_latency(t)) for t in rec.trials))
    lines.append("")
    lines.append("■ applied · not applied   P pass  F fail  S start-failure  U unresolved   ! culprit")
    return _fence("\n".join(lines))


def _grid_lat(x: float | None) -> str:
    if x is None:
        return " —"
    return f"{x:>2.0f}" if x >= 1 else "<1"


def render_markdown(run: RunRecord) -> str:
    """The report as Markdown (GitHub flavour: tables, fenced logs)."""
    token = _RENDER_MASKER.set(run.masker)
    try:
        return _render_markdown(run)
    finally:
        _RENDER_MASKER.reset(token)


def _render_markdown(rec: RunRecord) -> str:
    v = rec.verdict or {}
    out: list[str] = []
    kind = str(v.get("verdict") or "unfinished")
    out.append(f"# envbisect run {rec.run_id}: {kind.upper()}")
    out.append("")
    if v:
        culprits = ", ".join(v.get("culprits") or []) or "none"
        out.append(f"**Verdict: {kind}** · confidence {v.get('confidence')} · culprit(s): {culprits} · "
                   f"{v.get('restarts', len(rec.trials))} restarts · hosts left {v.get('state_left')}")
    else:
        out.append("**No verdict: the run did not finish** (interrupted, crashed, or still running). "
                   "Resume with `envbisect bisect --resume` or undo it with `envbisect restore`.")
    out.append("")

    out += ["## The question", ""]
    out += _md_table(["", ""], _question(rec))
    out.append("")

    out += ["## What changed (deltas)", ""]
    du = _delta_unit(rec)
    cul = _culprit_deltas(rec)
    if rec.deltas:
        out += _md_table(["delta", "kind", "change", "old", "new", "old value from", "linked unit"],
                         [((("**" + d.get("id", "?") + "** (culprit)") if d.get("id") in cul else d.get("id", "?")),
                           d.get("kind"), d.get("change"), _short(d.get("old"), d.get("kind")),
                           _short(d.get("new"), d.get("kind")), d.get("baseline_source"),
                           du.get(d.get("id"), "") if du.get(d.get("id")) != d.get("id") else "")
                          for d in rec.deltas])
    else:
        out.append("No deltas.")
    out.append("")
    diff = rec.diff
    for dr in diff.get("drift") or []:
        out.append(f"- drift: {_t(dr.get('service'))} (pid {dr.get('pid')}) runs with "
                   f"`{_t(dr.get('key'))}={_t(dr.get('process'))}` while its file says `{_t(dr.get('file'))}`")
    for link in diff.get("links") or []:
        out.append(f"- linked: {_t(', '.join(link))} changed the same way")
    for s in diff.get("unknown_processes") or []:
        out.append(f"- {_t(s)}: start environment unknown (overwritten by the program)")
    for n in diff.get("notes") or []:
        out.append(f"- note: {_t(n)}")
    if any(diff.get(k) for k in ("drift", "links", "unknown_processes", "notes")):
        out.append("")

    out += ["## Premise checks", ""]
    premises = [t for t in rec.trials if _is_premise(t)]
    if premises:
        for t in premises:
            _w, meaning = _premise(t)
            out.append(f"- **trial {t.get('n')} — {_t(t.get('purpose'))} — {str(t.get('outcome')).upper()}** "
                       f"({_t(t.get('reason'))}). {meaning}")
    else:
        out.append("No premise check was run.")
    out.append("")

    out += ["## Timeline", ""]
    tl = _timeline(rec)
    t0 = next((r["ts"] for r in tl if isinstance(r["ts"], (int, float))), None)
    out.append("Times are UTC.")
    out.append("")
    out += _md_table(["time", "", "event"], [(c, _rel(r["ts"], t0), r["text"]) for r, c in zip(tl, _clock(tl))])
    out.append("")

    out += ["## Trials", ""]
    out += _text_grid(rec)
    out.append("")
    out += _md_table(["#", "purpose", "deltas applied", "outcome", "reason", "restart", "probe", "max latency"],
                     [(t.get("n"), t.get("purpose"), len(t.get("config") or []), t.get("outcome"), t.get("reason"),
                       _secs(t.get("restart_s"), 1), _secs(t.get("probe_s"), 1), _secs(max_latency(t)))
                      for t in rec.trials])
    out.append("")
    for t in rec.trials:
        out += [f"### Trial {t.get('n')} — {_t(t.get('outcome'))} — {_t(t.get('purpose'))}", ""]
        cfg = t.get("config") or []
        out.append(f"- configuration: baseline + {len(cfg)} delta(s)" + (": " + _t(", ".join(cfg)) if cfg else " (the baseline)"))
        out.append(f"- started {_ts(t.get('started_at'))}; outcome **{_t(t.get('outcome'))}** — {_t(t.get('reason'))}")
        rd = t.get("restart_durations") or {}
        out.append(f"- co-restart {_secs(t.get('restart_s'), 2)}" +
                   (" (" + ", ".join(f"{k} {_secs(x, 2)}" for k, x in rd.items()) + ")" if rd else "") +
                   f"; probing {_secs(t.get('probe_s'), 2)}")
        reqs = _requests(t)
        if reqs:
            out.append("")
            out += _md_table(["run", "req", "ok", "status", "latency", "error / answer excerpt"],
                             [(i, q.get("n", ""), "yes" if q.get("ok") else ("no" if q else ""), q.get("status") or "—",
                               _secs(q.get("latency_s"), 3) if q else _secs(r.get("duration_s"), 3),
                               (q.get("error") or q.get("excerpt") or "")[:120] if q else r.get("reason"))
                              for i, r, q in reqs])
        if t.get("log_tail"):
            out.append("")
            out.append("Log tail at the failure:")
            out += _fence(_t(_tail(str(t["log_tail"]), 20)))
        key, ev = _evidence_for(rec, t.get("n"))
        if ev:
            out.append("")
            out.append(f"Evidence captured right after the trial (`evidence/{_t(key)}/`): " + _t(", ".join(sorted(ev))))
            if t.get("outcome") in ("fail", "start-failure"):
                for name, text in sorted(ev.items()):
                    if name.endswith((".log.txt", ".error.txt")) and text.strip():
                        out.append("")
                        out.append(f"{_t(name)} (last {min(12, len(text.splitlines()))} lines):")
                        out += _fence(_t(_tail(text, 12)))
        out.append("")

    out += ["## Verdict", ""]
    if v:
        out.append(f"**{kind.upper()}** — confidence {v.get('confidence')}, {v.get('restarts')} restarts.")
        out.append("")
        out.append(_VERDICT_MEANING.get(kind, ""))
        out.append("")
        if v.get("culprits"):
            dmap = {d.get("id"): d for d in rec.deltas}
            for c in v["culprits"]:
                d = dmap.get(c, {})
                out.append(f"- culprit **{_t(c)}**: `{_t(_short(d.get('old'), d.get('kind')))}` → "
                           f"`{_t(_short(d.get('new'), d.get('kind')))}`")
            out.append("")
        out.append(f"Explanation. {_t(v.get('explanation', ''))}")
        out.append("")
        if v.get("suspects"):
            out += _md_table(["suspect unit", "probability it is to blame"],
                             [(s.get("unit"), s.get("p")) for s in v["suspects"]])
            out.append("")
        for n in v.get("notes") or []:
            out.append(f"- note: {_t(n)}")
    else:
        out.append("No verdict was written.")
        for e in rec.events:
            if e.get("kind") in ("interrupted", "restore-failed"):
                out.append(f"- {_t(e.get('kind'))} — {_t(e.get('error'))}")
    out.append("")

    path = v.get("path")
    if path:
        out += ["## Request path, layer by layer", ""]
        out += _md_table(["layer", "target", "result", "reason"],
                         [(l.get("layer"), l.get("target"), "ok" if l.get("ok") else "BROKEN", l.get("reason"))
                          for l in path.get("layers") or []])
        out.append("")
        out.append(f"Broken at **{_t(path.get('broken_at') or 'nowhere')}**. {_t(path.get('conclusion', ''))}")
        out.append("")
    if v.get("drift_hint"):
        out += ["## Drift hints", ""]
        out += [f"- {_t(h)}" for h in v["drift_hint"]]
        out.append("")

    out += ["## End state", ""]
    state = v.get("state_left") or "unknown"
    out.append(f"**{state}**: {_STATE_MEANING.get(state, '')}")
    fp = v.get("final_probe")
    if fp:
        out.append(f"Final probe (trial {fp.get('n')}) — **{_t(fp.get('outcome'))}** — {_t(fp.get('reason'))}")
    out.append("")

    out += ["## Environment and versions", ""]
    out += _md_table(["", ""], _env_rows(rec))
    out.append("")
    js = rec.journal_summary
    if js:
        out.append(f"Journal ({js.get('state')}): the original state of "
                   f"{sum(len(h['files']) for h in js['hosts'].values())} file(s) and "
                   f"{sum(len(h['repos']) for h in js['hosts'].values())} repo(s) was recorded before the first edit.")
        out.append("")
    if rec.problems:
        out += ["## Problems reading the run", ""] + [f"- {_t(p)}" for p in rec.problems] + [""]
    out.append(f"_Secrets are masked (`••••(masked, sha256:…)`). Generated by envbisect {_version()} from "
               f"run {rec.run_id}._")
    return "\n".join(out) + "\n"


def _version() -> str:
    from envbisect import __version__

    return __version__
