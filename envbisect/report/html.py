"""The report as self-contained HTML (inline CSS and SVG, no scripts)."""
from __future__ import annotations

import html
from typing import Any, Iterable, Sequence

from envbisect.report.common import OUTCOME_COLORS, _LOG_LINES, _OUTCOME_LETTER, _RENDER_MASKER, _t
from envbisect.report.markdown import _version
from envbisect.report.record import RunRecord
from envbisect.report.story import _STATE_MEANING, _VERDICT_MEANING, _clock, _culprit_deltas, _delta_unit, _env_rows, _evidence_for, _is_premise, _premise, _question, _rel, _requests, _secs, _short, _tail, _timeline, _trial_label, _ts, max_latency

# ----------------------------------------------------------------------------------------- HTML

def _h(s: Any) -> str:
    return html.escape(_t(s), quote=True)


_CSS = """
:root{--pass:#2e7d32;--fail:#d32f2f;--sfail:#7f0000;--unres:#9e9e9e;--ink:#1d232a;--muted:#5f6b76;--line:#d9dee3}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:var(--ink);
margin:0;background:#f5f7f9}
main{max-width:1180px;margin:0 auto;padding:24px 28px 48px;background:#fff;min-height:100vh}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;padding-bottom:4px;border-bottom:1px solid var(--line)}
h3{font-size:14px;margin:18px 0 6px}
.sub{color:var(--muted);margin:0 0 14px}
code,pre,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace;font-size:12.5px}
pre{background:#f3f5f7;border:1px solid var(--line);padding:8px 10px;overflow:auto;max-height:420px;white-space:pre-wrap;
word-break:break-all;margin:6px 0}
table{border-collapse:collapse;margin:6px 0 10px;width:100%}
th,td{border:1px solid var(--line);padding:4px 7px;text-align:left;vertical-align:top}
th{background:#f0f3f6;font-weight:600}
td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
table.kv th{width:170px;white-space:nowrap}
.badge{display:inline-block;padding:1px 7px;border-radius:9px;color:#fff;font-size:12px;font-weight:600;white-space:nowrap}
.o-pass{background:var(--pass)}.o-fail{background:var(--fail)}.o-start-failure{background:var(--sfail)}
.o-unresolved{background:var(--unres)}.o-none{background:#607d8b}
#verdict{border:2px solid #607d8b;border-radius:8px;padding:12px 16px;margin:14px 0;background:#fafbfc}
#verdict.v-culprit,#verdict.v-interaction{border-color:var(--fail);background:#fff6f6}
#verdict.v-not-config{border-color:#ef6c00;background:#fff8f0}
#verdict.v-not-reproduced{border-color:#1565c0;background:#f3f8ff}
#verdict .kind{font-size:20px;font-weight:700;letter-spacing:.02em}
#verdict .culprit{font-family:ui-monospace,Menlo,Consolas,monospace;font-weight:700;color:var(--fail)}
.meaning{margin:6px 0}
.premise{border-left:4px solid var(--line);padding:4px 10px;margin:6px 0}
.premise.ok{border-color:var(--pass)}.premise.bad{border-color:var(--fail)}
.chart{overflow-x:auto;border:1px solid var(--line);border-radius:6px;padding:8px;background:#fff}
tr.culprit td:first-child{font-weight:700;color:var(--fail)}
tr.k-trial-start td{background:#eef2f6;font-weight:600}
table.timeline td{padding:2px 7px}table.timeline td.num{color:var(--muted)}
table.timeline tr.k-step td:last-child{color:var(--muted);font-size:12.5px}
details{margin:4px 0}summary{cursor:pointer;color:#34495e}details pre{max-height:280px}
/* a log box opens scrolled to its newest lines, without script */
pre.tail{display:flex;flex-direction:column-reverse}
.trial{border:1px solid var(--line);border-radius:6px;padding:6px 12px;margin:10px 0}
.muted{color:var(--muted)}
footer{margin-top:30px;color:var(--muted);font-size:12px}
@media print{body{background:#fff}main{padding:0}pre{max-height:none}}
"""


def _badge(outcome: Any) -> str:
    o = str(outcome or "none")
    cls = o if o in OUTCOME_COLORS else "none"
    return f'<span class="badge o-{_h(cls)}">{_h(o.upper())}</span>'


def _kv_table(rows: Iterable[tuple[str, str]]) -> str:
    return ('<table class="kv">' + "".join(f"<tr><th>{_h(k)}</th><td>{_h(v)}</td></tr>" for k, v in rows)
            + "</table>")


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], raw_cols: Iterable[int] = (), num_cols: Iterable[int] = (),
           row_classes: Sequence[str] | None = None) -> str:
    raw, num = set(raw_cols), set(num_cols)
    out = ["<table><thead><tr>" + "".join(f"<th>{_h(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for i, r in enumerate(rows):
        cls = f' class="{_h(row_classes[i])}"' if row_classes and row_classes[i] else ""
        cells = []
        for j, c in enumerate(r):
            content = c if j in raw else _h(c)
            cells.append(f'<td class="num">{content}</td>' if j in num else f"<td>{content}</td>")
        out.append(f"<tr{cls}>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def trials_svg(rec: RunRecord) -> str:
    """The trials chart: x = trial, one row per unit (applied or not), the outcome mark per trial, and a
    bar of the trial's max probe latency."""
    trials = list(rec.trials)
    units = list(rec.units)
    for t in trials:  # units a trial used that the unit map does not know (should not happen)
        for u in t.get("units") or []:
            if u not in units:
                units.append(u)
    culprits = set(rec.culprit_units)
    cw, rh = 30, 20
    label_w = min(380, max(120, 7 * max((len(u) for u in units), default=10) + 40))
    top = 34
    grid_h = rh * len(units)
    outcome_y = top + grid_h + 8
    lat_top = outcome_y + rh + 22
    lat_h = 70
    legend_y = lat_top + lat_h + 34
    width = max(label_w + cw * max(1, len(trials)) + 70, 600)  # at least the legend's width
    height = legend_y + 20
    lats = [max_latency(t) for t in trials]
    lmax = max([x for x in lats if x is not None] or [0.0])
    scale_max = max(lmax, 0.001)
    p: list[str] = [
        f'<svg id="trials-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" font-family="system-ui,Segoe UI,Arial,sans-serif" font-size="12" '
        f'aria-label="{_h(f"{len(trials)} trials: which units were applied, the outcome and the max probe latency of each")}">',
        f"<title>{_h(f'Trials of run {rec.run_id}')}</title>",
        f'<text x="{label_w - 8}" y="{top - 12}" text-anchor="end" fill="#5f6b76">trial →</text>',
    ]
    for i, t in enumerate(trials):
        x = label_w + i * cw
        p.append(f'<text x="{x + cw / 2}" y="{top - 12}" text-anchor="middle" font-weight="600">{_h(t.get("n"))}</text>')
    for j, u in enumerate(units):
        y = top + j * rh
        if j % 2 == 0:
            p.append(f'<rect x="0" y="{y}" width="{width}" height="{rh}" fill="#f6f8fa"/>')
        label = u if len(u) * 7 + 40 <= label_w else u[: max(4, (label_w - 52) // 7)] + "…"
        weight = ' font-weight="700" fill="#d32f2f"' if u in culprits else ' fill="#1d232a"'
        mark = "◆ " if u in culprits else ""
        p.append(f'<text class="unit-label" x="{label_w - 8}" y="{y + rh / 2 + 4}" text-anchor="end"{weight} '
                 f'font-family="ui-monospace,Menlo,Consolas,monospace" font-size="11.5"><title>{_h(u)}</title>'
                 f"{_h(mark + label)}</text>")
        for i, t in enumerate(trials):
            x = label_w + i * cw
            applied = u in (t.get("units") or [])
            o = str(t.get("outcome"))
            color = OUTCOME_COLORS.get(o, "#607d8b")
            if applied:
                tip = _h(f"{u}: applied in trial {t.get('n')} ({o})")
                p.append(f'<rect class="cell applied" x="{x + 4}" y="{y + 3}" width="{cw - 8}" height="{rh - 6}" rx="2" '
                         f'fill="{color}"><title>{tip}</title></rect>')
            else:
                p.append(f'<rect class="cell" x="{x + 4}" y="{y + 3}" width="{cw - 8}" height="{rh - 6}" rx="2" '
                         f'fill="none" stroke="#c5ccd3" stroke-dasharray="2 2"/>')
    # outcome marks
    p.append(f'<line x1="{label_w - 4}" x2="{width - 60}" y1="{outcome_y - 4}" y2="{outcome_y - 4}" stroke="#9aa5b1"/>')
    p.append(f'<text x="{label_w - 8}" y="{outcome_y + rh / 2 + 4}" text-anchor="end" font-weight="600">outcome</text>')
    for i, t in enumerate(trials):
        x = label_w + i * cw
        o = str(t.get("outcome"))
        color = OUTCOME_COLORS.get(o, "#607d8b")
        p.append(f'<g class="trial-mark" data-trial="{_h(t.get("n"))}" data-outcome="{_h(o)}">'
                 f"<title>{_h(_trial_label(t) + ' — ' + str(t.get('reason', '')))}</title>"
                 f'<rect x="{x + 3}" y="{outcome_y}" width="{cw - 6}" height="{rh}" rx="4" fill="{color}"/>'
                 f'<text x="{x + cw / 2}" y="{outcome_y + rh / 2 + 4}" text-anchor="middle" fill="#fff" '
                 f'font-weight="700">{_h(_OUTCOME_LETTER.get(o, "?"))}</text></g>')
    # latency bars
    p.append(f'<text x="{label_w - 8}" y="{lat_top + 12}" text-anchor="end" font-weight="600">max probe latency</text>')
    p.append(f'<text x="{label_w - 8}" y="{lat_top + 27}" text-anchor="end" fill="#5f6b76">(0 – {_h(f"{lmax:.2f}")} s)</text>')
    base_y = lat_top + lat_h
    p.append(f'<line x1="{label_w - 4}" x2="{width - 60}" y1="{base_y}" y2="{base_y}" stroke="#9aa5b1"/>')
    for i, (t, lat) in enumerate(zip(trials, lats)):
        x = label_w + i * cw
        color = OUTCOME_COLORS.get(str(t.get("outcome")), "#607d8b")
        n = t.get("n")
        if lat is None:
            tip = _h(f"trial {n}: no probe request was made (the stack did not start, or nothing was probed)")
            p.append(f'<text class="latency-none" x="{x + cw / 2}" y="{base_y - 4}" text-anchor="middle" fill="#5f6b76">—'
                     f"<title>{tip}</title></text>")
            continue
        h = max(2.0, lat / scale_max * (lat_h - 14))
        tip = _h(f"trial {n}: max latency {lat:.3f} s")
        p.append(f'<rect class="latency-bar" data-trial="{_h(n)}" x="{x + 8}" y="{base_y - h:.1f}" '
                 f'width="{cw - 16}" height="{h:.1f}" fill="{color}" opacity="0.85">'
                 f"<title>{tip}</title></rect>")
        p.append(f'<text x="{x + cw / 2}" y="{base_y + 13}" text-anchor="middle" font-size="10" fill="#34495e">'
                 f"{_h(_fmt_lat(lat))}</text>")
    # legend
    lx = 8
    for o, color in OUTCOME_COLORS.items():
        p.append(f'<rect x="{lx}" y="{legend_y - 10}" width="12" height="12" rx="2" fill="{color}"/>'
                 f'<text x="{lx + 17}" y="{legend_y}">{_h(o)}</text>')
        lx += 24 + 7 * len(o) + 14
    p.append(f'<rect x="{lx}" y="{legend_y - 10}" width="12" height="12" rx="2" fill="none" stroke="#c5ccd3" '
             f'stroke-dasharray="2 2"/><text x="{lx + 17}" y="{legend_y}">not applied</text>')
    lx += 110
    if culprits:
        p.append(f'<text x="{lx}" y="{legend_y}" fill="#d32f2f" font-weight="700">◆ culprit</text>')
    p.append("</svg>")
    return "".join(p)


def _fmt_lat(x: float) -> str:
    """Compact seconds for a 30 px column: 5.0, 12, .04"""
    if x >= 10:
        return f"{x:.0f}"
    if x >= 1:
        return f"{x:.1f}"
    return f"{x:.2f}"[1:]


def render_html(run: RunRecord) -> str:
    """The report as one self-contained HTML page: inline CSS and SVG, no script, no external resource."""
    token = _RENDER_MASKER.set(run.masker)
    try:
        return _render_html(run)
    finally:
        _RENDER_MASKER.reset(token)


def _render_html(rec: RunRecord) -> str:
    v = rec.verdict or {}
    kind = str(v.get("verdict") or "unfinished")
    b: list[str] = []
    b.append(f"<h1>envbisect run {_h(rec.run_id)}</h1>")
    b.append(f'<p class="sub">deployment <b>{_h(rec.run.get("deployment"))}</b> · probe <b>{_h(rec.run.get("probe"))}</b>'
             f" · started {_h(_ts(rec.run.get('created_at')))} · {len(rec.trials)} trial(s)</p>")

    # verdict box
    vb = [f'<section id="verdict" class="v-{_h(kind)}">']
    if v:
        vb.append(f'<div class="kind">Verdict: {_h(kind.upper())}</div>')
        vb.append(f"<div>confidence <b>{_h(v.get('confidence'))}</b> · {_h(v.get('restarts'))} restarts · hosts left "
                  f"<b>{_h(v.get('state_left'))}</b></div>")
        if v.get("culprits"):
            dmap = {d.get("id"): d for d in rec.deltas}
            items = []
            for c in v["culprits"]:
                d = dmap.get(c, {})
                items.append(f'<li><span class="culprit">{_h(c)}</span>: <code>{_h(_short(d.get("old"), d.get("kind")))}'
                             f"</code> → <code>{_h(_short(d.get('new'), d.get('kind')))}</code></li>")
            vb.append(f"<div>culprit(s), which must all go:</div><ul>{''.join(items)}</ul>")
        else:
            vb.append("<div>culprit(s): <b>none</b> — no delta is blamed</div>")
        vb.append(f'<p class="meaning">{_h(_VERDICT_MEANING.get(kind, ""))}</p>')
        vb.append(f'<p class="meaning"><b>Explanation.</b> {_h(v.get("explanation", ""))}</p>')
    else:
        vb.append('<div class="kind">No verdict: the run did not finish</div>')
        vb.append("<p>It was interrupted, crashed, or is still running. Resume it with <code>envbisect bisect --resume"
                  "</code> or undo it with <code>envbisect restore</code>.</p>")
        for e in rec.events:
            if e.get("kind") in ("interrupted", "restore-failed"):
                vb.append(f"<p>{_h(e.get('kind'))}: {_h(e.get('error'))}</p>")
    vb.append("</section>")
    b.append("".join(vb))

    b.append("<h2>Trials at a glance</h2>")
    b.append('<p class="muted">Columns are trials in order; each row is a bisection unit (a delta, or linked deltas); a '
             "filled cell means the unit was applied on top of the baseline in that trial, coloured by the trial's outcome. "
             "Bars: the slowest probe request of each trial.</p>")
    b.append(f'<div class="chart">{trials_svg(rec)}</div>')

    b.append("<h2>The question</h2>")
    b.append(_kv_table(_question(rec)))

    b.append("<h2>What changed (deltas)</h2>")
    du = _delta_unit(rec)
    cul = _culprit_deltas(rec)
    if rec.deltas:
        rows, classes = [], []
        for d in rec.deltas:
            unit = du.get(d.get("id"), "")
            rows.append((d.get("id", "?"), d.get("kind"), d.get("change"), _short(d.get("old"), d.get("kind")),
                         _short(d.get("new"), d.get("kind")), d.get("baseline_source"),
                         unit if unit != d.get("id") else ""))
            classes.append("culprit" if d.get("id") in cul else "")
        b.append(_table(["delta", "kind", "change", "old", "new", "old value from", "linked unit"], rows,
                        row_classes=classes))
    else:
        b.append("<p>No deltas.</p>")
    diff = rec.diff
    extra = []
    for dr in diff.get("drift") or []:
        extra.append(f"<li>drift: {_h(dr.get('service'))} (pid {_h(dr.get('pid'))}) runs with "
                     f"<code>{_h(dr.get('key'))}={_h(dr.get('process'))}</code> while its file says "
                     f"<code>{_h(dr.get('file'))}</code></li>")
    for link in diff.get("links") or []:
        extra.append(f"<li>linked: {_h(', '.join(link))} changed the same way</li>")
    for s in diff.get("unknown_processes") or []:
        extra.append(f"<li>{_h(s)}: start environment unknown (overwritten by the program)</li>")
    for n in diff.get("notes") or []:
        extra.append(f"<li>note: {_h(n)}</li>")
    if extra:
        b.append("<ul>" + "".join(extra) + "</ul>")

    b.append("<h2>Premise checks</h2>")
    premises = [t for t in rec.trials if _is_premise(t)]
    if not premises:
        b.append("<p>No premise check was run.</p>")
    for t in premises:
        which, meaning = _premise(t)
        good = (which == "current" and t.get("outcome") in ("fail", "start-failure")) or \
               (which == "baseline" and t.get("outcome") == "pass")
        b.append(f'<div class="premise {"ok" if good else "bad"}"><b>trial {_h(t.get("n"))} — {_h(t.get("purpose"))}</b> '
                 f"{_badge(t.get('outcome'))} <span class=\"muted\">{_h(t.get('reason'))}</span><br>{_h(meaning)}</div>")

    b.append("<h2>Timeline</h2>")
    tl = _timeline(rec)
    t0 = next((r["ts"] for r in tl if isinstance(r["ts"], (int, float))), None)
    clock = _clock(tl)
    rows, classes = [], []
    for r in tl:
        k = r["kind"]
        what = _h(r["text"])
        if k.startswith("trial-end"):
            what = _badge(k.split(" ", 1)[1] if " " in k else "") + " " + what
        elif k == "verdict":
            what = f"<b>{what}</b>"
        elif k in ("interrupted", "restore-failed", "warning"):
            what = f'<b style="color:#d32f2f">{what}</b>'
        rows.append((clock.pop(0), _rel(r["ts"], t0), what))
        classes.append("k-" + k.split(" ")[0])
    b.append('<p class="muted">Times are UTC; steps in grey are what envbisect did on the hosts.</p>')
    b.append(_table(["time", "", "what happened"], rows, raw_cols=[2], num_cols=[0, 1], row_classes=classes)
             .replace("<table>", '<table class="timeline">', 1))

    b.append("<h2>Trials</h2>")
    b.append(_table(["#", "purpose", "deltas applied", "outcome", "reason", "restart", "probe", "max latency"],
                    [(f'<a href="#trial-{_h(t.get("n"))}">{_h(t.get("n"))}</a>', _h(t.get("purpose")),
                      _h(len(t.get("config") or [])), _badge(t.get("outcome")), _h(t.get("reason")),
                      _h(_secs(t.get("restart_s"), 1)), _h(_secs(t.get("probe_s"), 1)), _h(_secs(max_latency(t))))
                     for t in rec.trials], raw_cols=range(8), num_cols=[2, 5, 6, 7]))
    for t in rec.trials:
        s = [f'<div class="trial" id="trial-{_h(t.get("n"))}">']
        s.append(f"<h3>Trial {_h(t.get('n'))} {_badge(t.get('outcome'))} — {_h(t.get('purpose'))}</h3>")
        cfg = t.get("config") or []
        s.append(f"<div>configuration: baseline + {len(cfg)} delta(s)"
                 + (": <code>" + _h(", ".join(cfg)) + "</code>" if cfg else " (the baseline)") + "</div>")
        s.append(f"<div>started {_h(_ts(t.get('started_at')))}; {_h(t.get('reason'))}</div>")
        rd = t.get("restart_durations") or {}
        s.append(f"<div>co-restart {_h(_secs(t.get('restart_s')))}"
                 + (" (" + _h(", ".join(f"{k} {_secs(x)}" for k, x in rd.items())) + ")" if rd else "")
                 + f"; probing {_h(_secs(t.get('probe_s')))}</div>")
        reqs = _requests(t)
        if reqs:
            s.append(_table(["run", "req", "ok", "status", "latency", "error / answer excerpt"],
                            [(i, q.get("n", "") if q else "", ("yes" if q.get("ok") else "no") if q else "",
                              (q.get("status") or "—") if q else "—",
                              _secs(q.get("latency_s"), 3) if q else _secs(r.get("duration_s"), 3),
                              ((q.get("error") or q.get("excerpt") or "")[:110]) if q else r.get("reason"))
                             for i, r, q in reqs], num_cols=[0, 1, 3, 4]))
        if t.get("log_tail"):
            s.append(f"<details open><summary>log tail at the failure</summary><pre class='tail'><span>{_h(_tail(str(t['log_tail']), 30))}</span>"
                     "</pre></details>")
        key, ev = _evidence_for(rec, t.get("n"))
        failed = t.get("outcome") in ("fail", "start-failure")
        for name, text in sorted(ev.items()):
            # a failed trial's logs are open: the fault is usually in their last lines
            opened = " open" if failed and name.endswith((".log.txt", ".error.txt")) else ""
            s.append(f"<details{opened}><summary>evidence/{_h(key)}/{_h(name)} ({len(text.splitlines())} lines; last "
                     f"{min(_LOG_LINES, len(text.splitlines()))} shown)</summary><pre class='tail'><span>{_h(_tail(text))}</span></pre></details>")
        s.append("</div>")
        b.append("".join(s))

    if v.get("suspects"):
        b.append("<h2>Suspects</h2>")
        b.append(_table(["unit", "probability it is to blame"], [(s.get("unit"), s.get("p")) for s in v["suspects"]],
                        num_cols=[1]))
    if v.get("notes"):
        b.append("<ul>" + "".join(f"<li>note: {_h(n)}</li>" for n in v["notes"]) + "</ul>")

    path = v.get("path")
    if path:
        b.append("<h2>Request path, layer by layer</h2>")
        b.append(_table(["layer", "target", "result", "reason"],
                        [(_h(l.get("layer")), _h(l.get("target")), _badge("pass" if l.get("ok") else "fail"),
                          _h(l.get("reason"))) for l in path.get("layers") or []], raw_cols=range(4)))
        b.append(f"<p>Broken at: <b>{_h(path.get('broken_at') or 'nowhere')}</b>. {_h(path.get('conclusion'))}</p>")
    if v.get("drift_hint"):
        b.append("<h2>Drift hints</h2><ul>" + "".join(f"<li>{_h(h)}</li>" for h in v["drift_hint"]) + "</ul>")

    b.append("<h2>End state</h2>")
    state = v.get("state_left") or "unknown"
    b.append(f"<p><b>{_h(state)}</b>: {_h(_STATE_MEANING.get(state, ''))}</p>")
    fp = v.get("final_probe")
    if fp:
        b.append(f"<p>Final probe (trial {_h(fp.get('n'))}): {_badge(fp.get('outcome'))} {_h(fp.get('reason'))}</p>")

    b.append("<h2>Environment and versions</h2>")
    b.append(_kv_table(_env_rows(rec)))
    js = rec.journal_summary
    if js:
        b.append(f"<p>Journal ({_h(js.get('state'))}): the original state of "
                 f"{sum(len(h['files']) for h in js['hosts'].values())} file(s) and "
                 f"{sum(len(h['repos']) for h in js['hosts'].values())} repo(s) was recorded before the first edit.</p>")
    if rec.problems:
        b.append("<h2>Problems reading the run</h2><ul>" + "".join(f"<li>{_h(p)}</li>" for p in rec.problems) + "</ul>")
    b.append(f"<footer>Secrets are masked (<code>••••(masked, sha256:…)</code>). Generated by envbisect {_h(_version())} "
             f"from run {_h(rec.run_id)}.</footer>")

    title = f"envbisect {rec.run_id}: {kind}"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width,initial-scale=1">'
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
            "img-src data:\">"
            f"<title>{_h(title)}</title><style>{_CSS}</style></head><body><main>"
            + "\n".join(b) + "</main></body></html>\n")
