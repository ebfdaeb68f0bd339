"""The report as self-contained HTML (inline CSS and SVG, no scripts): a walk over the story's blocks."""
from __future__ import annotations

import html
import statistics
from dataclasses import dataclass
from typing import Any, Sequence

from envbisect.report.blocks import (Badge, Block, BulletList, ChartTrial, Code, Figure, Footer, Group, Heading,
                                     Link, Log, Paragraph, SamplesChart, Story, Strong, Table, Text, TrialsChart,
                                     redacted)
from envbisect.report.common import OUTCOME_COLORS, OUTCOME_LETTER
from envbisect.report.record import RunRecord
from envbisect.report.story import build_story, trials_chart


def _h(s: Any) -> str:
    return html.escape("" if s is None else str(s), quote=True)


_CSS = """
:root{--pass:#2e7d32;--fail:#d32f2f;--sfail:#7f0000;--unres:#9e9e9e;--ink:#1d232a;--muted:#5f6b76;--line:#d9dee3}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:var(--ink);
margin:0;background:#f5f7f9}
main{max-width:1180px;margin:0 auto;padding:24px 28px 48px;background:#fff;min-height:100vh}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:28px 0 8px;padding-bottom:4px;border-bottom:1px solid var(--line)}
h3{font-size:14px;margin:18px 0 6px}
code,pre,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace;
font-size:12.5px}
pre{background:#f3f5f7;border:1px solid var(--line);padding:8px 10px;overflow:auto;max-height:420px;
white-space:pre-wrap;word-break:break-all;margin:6px 0}
table{border-collapse:collapse;margin:6px 0 10px;width:100%}
th,td{border:1px solid var(--line);padding:4px 7px;text-align:left;vertical-align:top}
th{background:#f0f3f6;font-weight:600}
td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
table.kv th{width:170px;white-space:nowrap}
.badge{display:inline-block;padding:1px 7px;border-radius:9px;color:#fff;font-size:12px;font-weight:600;
white-space:nowrap}
.o-pass{background:var(--pass)}.o-fail{background:var(--fail)}.o-start-failure{background:var(--sfail)}
.o-unresolved{background:var(--unres)}.o-none{background:#607d8b}
#verdict,.lead{border:2px solid #607d8b;border-radius:8px;padding:12px 16px;margin:14px 0;background:#fafbfc}
.lead{font-size:15px}#verdict h2{margin-top:0}
#verdict.v-culprit,#verdict.v-interaction,.lead.v-culprit,.lead.v-interaction{border-color:var(--fail);
background:#fff6f6}
#verdict.v-not-config,.lead.v-not-config{border-color:#ef6c00;background:#fff8f0}
#verdict.v-not-reproduced,.lead.v-not-reproduced{border-color:#1565c0;background:#f3f8ff}
.meaning{margin:6px 0}
li.premise{list-style:none;margin:6px 0 6px -18px;border-left:4px solid var(--line);padding:4px 10px}
li.premise.ok{border-color:var(--pass)}li.premise.bad{border-color:var(--fail)}
.chart{overflow-x:auto;border:1px solid var(--line);border-radius:6px;padding:8px;background:#fff}
tr.guilty td:first-child{font-weight:700;color:var(--fail)}
tr.k-trial-start td{background:#eef2f6;font-weight:600}
table.timeline td{padding:2px 7px}table.timeline td.num{color:var(--muted)}
table.timeline tr.k-step td:last-child{color:var(--muted);font-size:12.5px}
table.timeline tr.k-verdict td:last-child{font-weight:700}
table.timeline tr.k-interrupted td:last-child,table.timeline tr.k-restore-failed td:last-child,
table.timeline tr.k-warning td:last-child{font-weight:700;color:var(--fail)}
details{margin:4px 0}summary{cursor:pointer;color:#34495e}details pre{max-height:280px}
/* a log box opens scrolled to its newest lines, without script */
pre.tail{display:flex;flex-direction:column-reverse}
.trial{border:1px solid var(--line);border-radius:6px;padding:6px 12px;margin:10px 0}
.muted{color:var(--muted)}
footer{margin-top:30px;color:var(--muted);font-size:12px}
@media print{body{background:#fff}main{padding:0}pre{max-height:none}}
"""


def render_html(run: RunRecord | Story) -> str:
    """The report as one self-contained HTML page: inline CSS and SVG, no script, no external resource.
    `run` is a record or the story already built from one."""
    story = run if isinstance(run, Story) else build_story(run)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width,initial-scale=1">'
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
            "img-src data:\">"
            f"<title>{_h(story.title)}</title><style>{_CSS}</style></head><body><main>"
            + "\n".join(_block(b) for b in story.blocks) + "</main></body></html>\n")


def _cls(c: str) -> str:
    return f' class="{_h(c)}"' if c else ""


def _inline(t: Text) -> str:
    out = []
    for p in t:
        if isinstance(p, str):
            out.append(_h(p))
        elif isinstance(p, Strong):
            out.append(f"<b>{_inline(p.text)}</b>")
        elif isinstance(p, Code):
            out.append(f"<code>{_inline(p.text)}</code>")
        elif isinstance(p, Badge):
            o = p.outcome or "none"
            out.append(f'<span class="badge o-{_h(o if o in OUTCOME_COLORS else "none")}">{_h(o.upper())}</span>')
        elif isinstance(p, Link):
            out.append(f'<a href="#{_h(p.target)}">{_inline(p.text)}</a>')
    return "".join(out)


def _table(b: Table) -> str:
    if b.kv:
        return ('<table class="kv">' + "".join(f"<tr><th>{_inline(r[0])}</th><td>{_inline(r[1])}</td></tr>"
                                               for r in b.rows) + "</table>")
    out = [f"<table{_cls(b.cls)}><thead><tr>" + "".join(f"<th>{_h(c)}</th>" for c in b.columns)
           + "</tr></thead><tbody>"]
    for i, r in enumerate(b.rows):
        cls = _cls(b.row_classes[i]) if i < len(b.row_classes) else ""
        out.append(f"<tr{cls}>" + "".join(f'<td class="num">{_inline(c)}</td>' if j in b.numeric
                                          else f"<td>{_inline(c)}</td>" for j, c in enumerate(r)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _block(b: Block) -> str:
    if isinstance(b, Heading):
        return f"<h{b.level}>{_inline(b.text)}</h{b.level}>"
    if isinstance(b, Paragraph):
        return "".join(f"<p{_cls(b.cls)}>{_inline(line)}</p>" for line in b.lines)
    if isinstance(b, BulletList):
        classes = b.classes or ("",) * len(b.items)
        return "<ul>" + "".join(f"<li{_cls(c)}>{_inline(i)}</li>" for i, c in zip(b.items, classes)) + "</ul>"
    if isinstance(b, Table):
        return _table(b)
    if isinstance(b, Log):
        return (f"<details{'' if b.folded else ' open'}><summary>{_inline(b.label)}</summary>"
                f"<pre class='tail'><span>{_h(b.text)}</span></pre></details>")
    if isinstance(b, Figure):
        svg = samples_svg(b.chart) if isinstance(b.chart, SamplesChart) else trials_svg(b.chart)
        return f'<p class="muted">{_h(b.caption)}</p><div class="chart">{svg}</div>'
    if isinstance(b, Group):
        tag = "section" if b.role == "section" else "div"
        anchor = f' id="{_h(b.anchor)}"' if b.anchor else ""
        return f"<{tag}{anchor}{_cls(b.cls)}>" + "\n".join(_block(c) for c in b.blocks) + f"</{tag}>"
    if isinstance(b, Footer):
        return f"<footer>{_inline(b.text)}</footer>"
    raise TypeError(f"not a report block: {b!r}")


@dataclass(frozen=True)
class _TrialsLayout:
    """Where the parts of the trials chart go: unit rows, then the outcome marks, the latency bars
    and the legend, one below the other; a column per trial right of the unit labels."""
    label_w: int
    width: int
    rows: int  # one per unit
    cw: int = 30
    rh: int = 20
    top: int = 34
    lat_h: int = 70

    @property
    def outcome_y(self) -> int:
        return self.top + self.rh * self.rows + 8

    @property
    def lat_top(self) -> int:
        return self.outcome_y + self.rh + 22

    @property
    def legend_y(self) -> int:
        return self.lat_top + self.lat_h + 34

    @property
    def height(self) -> int:
        return self.legend_y + 20

    def x(self, i: int) -> int:
        return self.label_w + i * self.cw


def trials_svg(chart: TrialsChart | RunRecord) -> str:
    """The trials chart: x = trial, one row per unit (applied or not), the outcome mark per trial, and a
    bar of the trial's max probe latency. `chart` is the story's, or a record to draw it from."""
    if isinstance(chart, RunRecord):
        chart = redacted(trials_chart(chart), chart.masker)
    trials, units = chart.trials, chart.units
    label_w = min(380, max(120, 7 * max((len(u) for u in units), default=10) + 40))
    width = max(label_w + 30 * max(1, len(trials)) + 70, 600)  # at least the legend's width
    lay = _TrialsLayout(label_w, width, len(units))
    aria = f"{len(trials)} trials: which units were applied, the outcome and the max probe latency of each"
    p: list[str] = [
        f'<svg id="trials-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{lay.height}" '
        f'viewBox="0 0 {width} {lay.height}" role="img" font-family="system-ui,Segoe UI,Arial,sans-serif" '
        f'font-size="12" aria-label="{_h(aria)}">',
        f"<title>{_h(f'Trials of run {chart.run_id}')}</title>",
        f'<text x="{label_w - 8}" y="{lay.top - 12}" text-anchor="end" fill="#5f6b76">trial →</text>',
    ]
    for i, t in enumerate(trials):
        p.append(f'<text x="{lay.x(i) + lay.cw / 2}" y="{lay.top - 12}" text-anchor="middle" font-weight="600">'
                 f"{_h(t.n)}</text>")
    for j, u in enumerate(units):
        p.extend(_unit_row(lay, j, u, trials, u in chart.culprits))
    p.extend(_outcome_marks(lay, trials))
    p.extend(_latency_bars(lay, trials))
    p.extend(_chart_legend(lay, bool(chart.culprits)))
    p.append("</svg>")
    return "".join(p)


def _unit_row(lay: _TrialsLayout, j: int, u: str, trials: Sequence[ChartTrial], guilty: bool) -> list[str]:
    """One unit's row: its label (marked when the verdict names it), and a cell per trial, filled in
    the trial's outcome colour where the unit was applied."""
    cw, rh, y = lay.cw, lay.rh, lay.top + j * lay.rh
    p = [f'<rect x="0" y="{y}" width="{lay.width}" height="{rh}" fill="#f6f8fa"/>'] if j % 2 == 0 else []
    label = u if len(u) * 7 + 40 <= lay.label_w else u[: max(4, (lay.label_w - 52) // 7)] + "…"
    weight = ' font-weight="700" fill="#d32f2f"' if guilty else ' fill="#1d232a"'
    mark = "◆ " if guilty else ""
    p.append(f'<text class="unit-label" x="{lay.label_w - 8}" y="{y + rh / 2 + 4}" text-anchor="end"{weight} '
             f'font-family="ui-monospace,Menlo,Consolas,monospace" font-size="11.5"><title>{_h(u)}</title>'
             f"{_h(mark + label)}</text>")
    for i, t in enumerate(trials):
        x = lay.x(i)
        if u in t.units:
            tip = _h(f"{u}: applied in trial {t.n} ({t.outcome})")
            p.append(f'<rect class="cell applied" x="{x + 4}" y="{y + 3}" width="{cw - 8}" height="{rh - 6}" '
                     f'rx="2" fill="{OUTCOME_COLORS.get(t.outcome, "#607d8b")}"><title>{tip}</title></rect>')
        else:
            p.append(f'<rect class="cell" x="{x + 4}" y="{y + 3}" width="{cw - 8}" height="{rh - 6}" rx="2" '
                     f'fill="none" stroke="#c5ccd3" stroke-dasharray="2 2"/>')
    return p


def _outcome_marks(lay: _TrialsLayout, trials: Sequence[ChartTrial]) -> list[str]:
    cw, rh, oy = lay.cw, lay.rh, lay.outcome_y
    p = [f'<line x1="{lay.label_w - 4}" x2="{lay.width - 60}" y1="{oy - 4}" y2="{oy - 4}" stroke="#9aa5b1"/>',
         f'<text x="{lay.label_w - 8}" y="{oy + rh / 2 + 4}" text-anchor="end" font-weight="600">outcome</text>']
    for i, t in enumerate(trials):
        x = lay.x(i)
        p.append(f'<g class="trial-mark" data-trial="{_h(t.n)}" data-outcome="{_h(t.outcome)}">'
                 f"<title>{_h(t.title)}</title>"
                 f'<rect x="{x + 3}" y="{oy}" width="{cw - 6}" height="{rh}" rx="4" '
                 f'fill="{OUTCOME_COLORS.get(t.outcome, "#607d8b")}"/>'
                 f'<text x="{x + cw / 2}" y="{oy + rh / 2 + 4}" text-anchor="middle" fill="#fff" '
                 f'font-weight="700">{_h(OUTCOME_LETTER.get(t.outcome, "?"))}</text></g>')
    return p


def _latency_bars(lay: _TrialsLayout, trials: Sequence[ChartTrial]) -> list[str]:
    """A bar per trial of its max probe latency, scaled to the largest; a dash for a trial that made
    no request."""
    cw, lat_top, lat_h = lay.cw, lay.lat_top, lay.lat_h
    lmax = max([t.max_latency for t in trials if t.max_latency is not None] or [0.0])
    scale_max = max(lmax, 0.001)
    base_y = lat_top + lat_h
    p = [f'<text x="{lay.label_w - 8}" y="{lat_top + 12}" text-anchor="end" font-weight="600">max probe latency</text>',
         f'<text x="{lay.label_w - 8}" y="{lat_top + 27}" text-anchor="end" fill="#5f6b76">'
         f'(0 – {_h(f"{lmax:.2f}")} s)</text>',
         f'<line x1="{lay.label_w - 4}" x2="{lay.width - 60}" y1="{base_y}" y2="{base_y}" stroke="#9aa5b1"/>']
    for i, t in enumerate(trials):
        x, lat = lay.x(i), t.max_latency
        if lat is None:
            tip = _h(f"trial {t.n}: no probe request was made (the stack did not start, or nothing was probed)")
            p.append(f'<text class="latency-none" x="{x + cw / 2}" y="{base_y - 4}" text-anchor="middle" '
                     f'fill="#5f6b76">—<title>{tip}</title></text>')
            continue
        h = max(2.0, lat / scale_max * (lat_h - 14))
        p.append(f'<rect class="latency-bar" data-trial="{_h(t.n)}" x="{x + 8}" y="{base_y - h:.1f}" '
                 f'width="{cw - 16}" height="{h:.1f}" fill="{OUTCOME_COLORS.get(t.outcome, "#607d8b")}" '
                 f'opacity="0.85"><title>{_h(f"trial {t.n}: max latency {lat:.3f} s")}</title></rect>')
        p.append(f'<text x="{x + cw / 2}" y="{base_y + 13}" text-anchor="middle" font-size="10" fill="#34495e">'
                 f"{_h(_fmt_lat(lat))}</text>")
    return p


def _chart_legend(lay: _TrialsLayout, has_culprits: bool) -> list[str]:
    lx, legend_y, p = 8, lay.legend_y, []
    for o, color in OUTCOME_COLORS.items():
        p.append(f'<rect x="{lx}" y="{legend_y - 10}" width="12" height="12" rx="2" fill="{color}"/>'
                 f'<text x="{lx + 17}" y="{legend_y}">{_h(o)}</text>')
        lx += 24 + 7 * len(o) + 14
    p.append(f'<rect x="{lx}" y="{legend_y - 10}" width="12" height="12" rx="2" fill="none" stroke="#c5ccd3" '
             f'stroke-dasharray="2 2"/><text x="{lx + 17}" y="{legend_y}">not applied</text>')
    lx += 110
    if has_culprits:
        p.append(f'<text x="{lx}" y="{legend_y}" fill="#d32f2f" font-weight="700">◆ culprit</text>')
    return p


def samples_svg(chart: SamplesChart) -> str:
    """A strip plot: x = trial, y = the metric; one dot per sample, each trial's median as a tick,
    the reference's min-max band shaded across, its median and the regression allowance as lines."""
    series = chart.series
    cw, top, plot_h, left = 44, 30, 180, 90
    width = max(left + cw * len(series) + 30, 420)
    height = top + plot_h + 62
    lo_ref, med_ref, hi_ref = chart.band
    every = [v for s in series for v in s.values] + [lo_ref, hi_ref] + ([chart.allowance] if chart.allowance else [])
    lo, hi = min(every), max(every)
    pad = (hi - lo) * 0.08 or abs(hi) * 0.05 or 1.0
    lo, hi = lo - pad, hi + pad

    def y(v: float) -> float:
        return top + plot_h - (v - lo) / (hi - lo) * plot_h

    aria = f"{chart.metric} samples of {len(series)} trials against the reference of trial {chart.reference}"
    p = [f'<svg class="samples-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
         f'viewBox="0 0 {width} {height}" role="img" font-family="system-ui,Segoe UI,Arial,sans-serif" font-size="12" '
         f'aria-label="{_h(aria)}">',
         f"<title>{_h(f'{chart.metric} per trial, run {chart.run_id}')}</title>",
         f'<text x="8" y="{top - 12}" font-weight="600">{_h(chart.metric)}</text>',
         f'<rect class="reference-band" x="{left}" y="{y(hi_ref):.1f}" width="{width - left - 10}" '
         f'height="{max(1.0, y(lo_ref) - y(hi_ref)):.1f}" fill="#2e7d32" opacity="0.12">'
         f"<title>{_h(f'reference (trial {chart.reference}): {lo_ref:.4g} to {hi_ref:.4g}, median {med_ref:.4g}')}"
         "</title></rect>",
         f'<line x1="{left}" x2="{width - 10}" y1="{y(med_ref):.1f}" y2="{y(med_ref):.1f}" stroke="#2e7d32"/>']
    if chart.allowance is not None:
        p.append(f'<line class="allowance" x1="{left}" x2="{width - 10}" y1="{y(chart.allowance):.1f}" '
                 f'y2="{y(chart.allowance):.1f}" stroke="#d32f2f" stroke-dasharray="5 4">'
                 f"<title>{_h(f'regression allowance: {chart.allowance:.4g}')}</title></line>")
    for v in (lo + pad, (lo + hi) / 2, hi - pad):  # three axis labels
        p.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end" fill="#5f6b76" font-size="11">'
                 f"{_h(f'{v:.4g}')}</text>")
    for i, s in enumerate(series):
        cx = left + i * cw + cw / 2
        color = OUTCOME_COLORS.get(s.outcome, "#607d8b")
        p.append(f'<g class="sample-strip" data-trial="{_h(s.n)}" data-outcome="{_h(s.outcome)}">'
                 f'<title>{_h(s.title)}</title>')
        k = len(s.values)
        for j, v in enumerate(s.values):
            dx = (j - (k - 1) / 2) * min(4.0, 28 / max(k, 1))  # spread the dots so equal values stay visible
            p.append(f'<circle cx="{cx + dx:.1f}" cy="{y(v):.1f}" r="3" fill="{color}" opacity="0.8"/>')
        m = statistics.median(s.values)
        p.append(f'<line x1="{cx - 12}" x2="{cx + 12}" y1="{y(m):.1f}" y2="{y(m):.1f}" stroke="#1d232a" '
                 f'stroke-width="2"/></g>')
        p.append(f'<text x="{cx}" y="{top + plot_h + 16}" text-anchor="middle" font-weight="600">{_h(s.n)}</text>')
    ly = top + plot_h + 44
    p.append(f'<rect x="8" y="{ly - 10}" width="12" height="12" fill="#2e7d32" opacity="0.25"/>'
             f'<text x="25" y="{ly}">reference band (trial {_h(chart.reference)})</text>')
    if chart.allowance is not None:
        p.append(f'<line x1="230" x2="252" y1="{ly - 4}" y2="{ly - 4}" stroke="#d32f2f" stroke-dasharray="5 4"/>'
                 f'<text x="258" y="{ly}">regression allowance</text>')
    p.append("</svg>")
    return "".join(p)


def _fmt_lat(x: float) -> str:
    """Compact seconds for a 30 px column: 5.0, 12, .04"""
    if x >= 10:
        return f"{x:.0f}"
    if x >= 1:
        return f"{x:.1f}"
    return f"{x:.2f}"[1:]
