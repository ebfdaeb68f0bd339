"""A self-contained SVG of the search comparison (no plotting library): restarts against n per
method for each deterministic scenario, and accuracy against the per-probe detection rate.

    python bench/chart.py bench/results/search.json bench/results/comparison.svg
"""
from __future__ import annotations

import json
import math
import sys
from html import escape
from pathlib import Path

STYLE = {  # method: (label, colour, dash, width)
    "envbisect-confirm": ("envbisect (default: confirm)", "#d62728", "", 3.0),
    "envbisect-fast": ("envbisect --policy fast", "#ff7f0e", "6 3", 1.8),
    "envbisect-thorough": ("envbisect --policy thorough", "#8c564b", "2 2", 1.8),
    "toggle": ("one at a time", "#1f77b4", "", 1.8),
    "bisect": ("classic bisection (git bisect run)", "#2ca02c", "", 1.8),
    "bisect-verify": ("classic bisection + the operator's checks", "#e377c2", "4 2", 1.8),
    "bisect-k": ("bisection, k runs/step (k tuned)", "#17becf", "8 3 2 3", 1.8),
    "ddmin": ("ddmin", "#9467bd", "", 1.8),
    "bound": ("information bound ceil(log2 C(n,k))", "#7f7f7f", "3 3", 1.2),
}
FONT = 'font-family="DejaVu Sans, Arial, sans-serif"'


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * mag:
            return m * mag
    return 10 * mag


def panel(x: float, y: float, w: float, h: float, title: str, xlabels: list[str], xtitle: str, ytitle: str,
          series: list[tuple[str, list[float | None]]], ymax: float | None = None, percent: bool = False,
          hollow: dict[str, list[bool]] | None = None) -> str:
    pl, pr, pt, pb = 46, 10, 26, 38
    iw, ih = w - pl - pr, h - pt - pb
    vals = [v for _, ys in series for v in ys if v is not None]
    top = ymax if ymax is not None else _nice_max(max(vals) if vals else 1.0)
    nx = len(xlabels)

    def px(i: int) -> float:
        return x + pl + (iw * i / (nx - 1) if nx > 1 else iw / 2)

    def py(v: float) -> float:
        return y + pt + ih - ih * (v / top if top else 0)

    out = [f'<text x="{x + w / 2:.1f}" y="{y + 16:.1f}" text-anchor="middle" font-size="13" font-weight="bold" {FONT}>'
           f'{escape(title)}</text>',
           f'<rect x="{x + pl:.1f}" y="{y + pt:.1f}" width="{iw:.1f}" height="{ih:.1f}" fill="#fafafa" stroke="#bbb"/>']
    for j in range(6):
        v = top * j / 5
        yy = py(v)
        lab = f"{v:.0%}" if percent else (f"{v:.0f}" if top >= 5 else f"{v:.1f}")
        out.append(f'<line x1="{x + pl:.1f}" y1="{yy:.1f}" x2="{x + pl + iw:.1f}" y2="{yy:.1f}" stroke="#e3e3e3"/>')
        out.append(f'<text x="{x + pl - 4:.1f}" y="{yy + 4:.1f}" text-anchor="end" font-size="10" {FONT}>{lab}</text>')
    for i, lab in enumerate(xlabels):
        out.append(f'<text x="{px(i):.1f}" y="{y + pt + ih + 14:.1f}" text-anchor="middle" font-size="10" {FONT}>'
                   f'{escape(lab)}</text>')
    out.append(f'<text x="{x + pl + iw / 2:.1f}" y="{y + h - 6:.1f}" text-anchor="middle" font-size="11" {FONT}>'
               f'{escape(xtitle)}</text>')
    cy = y + pt + ih / 2
    out.append(f'<text x="{x + 12:.1f}" y="{cy:.1f}" text-anchor="middle" font-size="11" {FONT} '
               f'transform="rotate(-90 {x + 12:.1f} {cy:.1f})">{escape(ytitle)}</text>')
    for method, ys in series:
        _label, colour, dash, width = STYLE[method]
        pts = [(px(i), py(v)) for i, v in enumerate(ys) if v is not None]
        if not pts:
            continue
        d = " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<polyline points="{d}" fill="none" stroke="{colour}" stroke-width="{width}"{dash_attr}>'
                   f'<title>{escape(STYLE[method][0])}</title></polyline>')
        flags = [f for f, v in zip((hollow or {}).get(method, [False] * len(ys)), ys) if v is not None]
        for (a, b), empty in zip(pts, flags or [False] * len(pts)):
            fill = "white" if empty else colour
            out.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="{2.6 if width < 2 else 3.2}" fill="{fill}" '
                       f'stroke="{colour}" stroke-width="1.2"/>')
    return "\n".join(out)


def render(res: dict) -> str:
    cells = res["cells"]
    ns = res["config"]["ns"]
    dets = res["config"]["detections"]

    def get(scenario: str, n: int, method: str, key: str) -> float | None:
        for c in cells:
            if c["scenario"] == scenario and c["n"] == n and c["method"] == method:
                return c[key]
        return None

    W, PH = 1280, 290
    parts = []
    methods = ["envbisect-confirm", "envbisect-fast", "envbisect-thorough", "toggle", "bisect", "bisect-verify",
               "ddmin"]
    titles = {"culprit": "one culprit", "pair": "pair failing only together", "two": "two independent culprits",
              "linked": "same key, innocent on one side"}
    pw = W / 4
    top = 70
    for i, scenario in enumerate(("culprit", "pair", "two", "linked")):
        series = [(m, [get(scenario, n, m, "mean_restarts") for n in ns]) for m in methods]
        series.append(("bound", [get(scenario, n, "envbisect-confirm", "info_bound") for n in ns]))
        # one-at-a-time grows linearly in n; cap the axis so the others stay readable
        ymax = _nice_max(max(v for m, ys in series if m != "toggle" for v in ys if v is not None) * 1.15)
        series = [(m, [v if v is None or v <= ymax else None for v in ys]) for m, ys in series]
        hollow = {m: [(get(scenario, n, m, "right") or 0) < 0.95 for n in ns] for m in methods}
        parts.append(panel(i * pw, top, pw, PH, f"restarts: {titles[scenario]}", [str(n) for n in ns],
                           "n (deltas); points above the axis left out", "mean restarts", series, ymax,
                           hollow=hollow))
    y2 = top + PH + 20
    pw2 = W / 3
    kmethods = methods[:] + ["bisect-k"]
    flaky = [f"flaky-{d}" for d in dets]

    def over_n(scenario: str, m: str, key: str) -> float | None:
        vs = [get(scenario, n, m, key) for n in ns]
        vs = [v for v in vs if v is not None]
        return sum(vs) / len(vs) if vs else None

    series = [(m, [over_n(s, m, "right") for s in flaky]) for m in kmethods]
    parts.append(panel(0, y2, pw2, PH, "right verdicts vs per-probe detection (mean over n)", [str(d) for d in dets],
                       "probability that a bad config fails one probe run", "right verdict", series, 1.0, True))
    series = [(m, [over_n(s, m, "innocent") for s in flaky]) for m in kmethods]
    parts.append(panel(pw2, y2, pw2, PH, "an innocent delta named (mean over n)", [str(d) for d in dets],
                       "probability that a bad config fails one probe run", "innocent named", series,
                       _nice_max(max((v for _, ys in series for v in ys if v is not None), default=1.0)), True))
    nmax = max(ns)
    series = [(m, [get(s, nmax, m, "mean_restarts") for s in flaky]) for m in kmethods]
    ymax = _nice_max(max(v for m, ys in series if m != "toggle" for v in ys if v is not None) * 1.15)
    series = [(m, [v if v is None or v <= ymax else None for v in ys]) for m, ys in series]
    hollow = {m: [(get(s, nmax, m, "right") or 0) < 0.95 for s in flaky] for m in kmethods}
    parts.append(panel(2 * pw2, y2, pw2, PH, f"restarts vs detection (n = {nmax})", [str(d) for d in dets],
                       "per-probe detection; points above the axis left out", "mean restarts", series, ymax,
                       hollow=hollow))
    # legend
    leg = []
    lx, ly = 20, 44
    for m in kmethods + ["bound"]:
        label, colour, dash, width = STYLE[m]
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        leg.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 26}" y2="{ly}" stroke="{colour}" '
                   f'stroke-width="{width}"{dash_attr}/>')
        leg.append(f'<text x="{lx + 31}" y="{ly + 4}" font-size="11" {FONT}>{escape(label)}</text>')
        lx += 44 + 6.6 * len(label)
        if lx > W - 200:
            lx, ly = 20, ly + 16
    H = y2 + PH + 30
    mode = "quick run" if res["config"].get("quick") else "full run"
    note = (f"{mode}: simulated oracle; every culprit position, or seeded samples where positions explode; a restart = "
            "one started configuration; hollow point: < 95% right verdicts")
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="20" y="24" font-size="15" font-weight="bold" {FONT}>'
        f'{escape("envbisect vs the classic methods")}</text>',
        f'<text x="320" y="24" font-size="11" fill="#555" {FONT}>{escape(note)}</text>',
        *leg, *parts,
        f'<text x="20" y="{H - 10}" font-size="10" fill="#555" {FONT}>'
        f'{escape("bench/run.py; figures in bench/results/search.json")}</text>',
        "</svg>", ""])


def main() -> None:
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/search.json")
    dst = Path(sys.argv[2] if len(sys.argv) > 2 else "bench/results/comparison.svg")
    dst.write_text(render(json.loads(src.read_text())))
    print(dst)


if __name__ == "__main__":
    main()
