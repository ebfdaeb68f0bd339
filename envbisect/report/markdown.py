"""The report as Markdown (GitHub flavour: tables, fenced logs): a walk over the story's blocks."""
from __future__ import annotations

import re
import statistics

from envbisect.report.blocks import (Badge, Block, BulletList, Code, Figure, Footer, Group, Heading, Link, Log,
                                     Paragraph, SamplesChart, Story, Strong, Table, Text, TrialsChart)
from envbisect.report.common import OUTCOME_LETTER
from envbisect.report.record import RunRecord
from envbisect.report.story import build_story


def render_markdown(run: RunRecord | Story) -> str:
    """The report as Markdown; `run` is a record or the story already built from one."""
    story = run if isinstance(run, Story) else build_story(run)
    return "\n\n".join(b for b in (_block(x) for x in story.blocks) if b) + "\n"


def _cell(s: str) -> str:
    """Text safe inside a Markdown table cell."""
    return md_text(s)


# Backslash-escaped wherever they are: HTML and autolinks (`<`, `>`, `&`), links and images (`[`, `]`),
# emphasis and strikethrough (`*`, `~`), code spans (backtick), table cells (`|`), and the backslash.
_ALWAYS = re.compile(r"[\\`*~\[\]<>&|]")
# `_` emphasises only where it is not between two letters or digits (CommonMark's flanking rule).
_LONE_UNDERSCORE = re.compile(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")
# A bare URL that GFM viewers turn into a link: its `://` or `www.` escaped, so it stays text.
_BARE_URL = re.compile(r"(?<=[A-Za-z]):(?=//)|(?<=\b[wW]{3})\.")
# What makes a block when it starts a line: a heading, list item, quote, setext underline, or fence.
_LINE_START = re.compile(r"^( {0,3})([#+=>-]|\d{1,9}(?=[.)]))")


def md_text(s: str) -> str:
    """A string from a host (or from the story) as Markdown text that renders as exactly itself: no
    HTML, image, link, emphasis, code span or table cell of its own, on one line."""
    s = s.replace("\r", " ").replace("\n", " ")
    s = _ALWAYS.sub(lambda m: "\\" + m.group(0), s)
    s = _LONE_UNDERSCORE.sub(r"\\_", s)
    return _BARE_URL.sub(lambda m: "\\" + m.group(0), s)


def _line(s: str) -> str:
    """A line of Markdown whose start cannot open a block: a leading `#`, `-`, `+`, `=`, `>` or
    `1.`/`1)` is escaped."""
    m = _LINE_START.match(s)
    if not m:
        return s
    mark = m.group(2)
    if mark.isdigit():
        return s[:m.end()] + "\\" + s[m.end():]
    return s[:m.start(2)] + "\\" + s[m.start(2):]


def _inline(t: Text, cell: bool = False) -> str:
    out = []
    for p in t:
        if isinstance(p, str):
            out.append(md_text(p))
        elif isinstance(p, Strong):
            out.append("**" + _inline(p.text, cell) + "**")
        elif isinstance(p, Code):
            # in a table a pipe ends the cell even inside a code span (GFM): escaped, and literal there
            out.append(_code_span(_plain(p.text).replace("|", "\\|") if cell else _plain(p.text)))
        elif isinstance(p, (Badge, Link)):  # no badges, no anchors: their plain text
            out.append(_inline(p.plain if isinstance(p, Badge) else p.text, cell))
    return "".join(out)


def _one_line(s: str) -> str:
    """A line break inside a value would end the block it is in (and could start a heading or a fence)."""
    return s.replace("\r", " ").replace("\n", " ")


def _plain(t: Text) -> str:
    """The text of inline pieces without their markup (inside a code span everything is literal)."""
    out = []
    for p in t:
        if isinstance(p, str):
            out.append(p)
        elif isinstance(p, Badge):
            out.append(_plain(p.plain))
        else:
            out.append(_plain(p.text))
    return "".join(out)


def _code_span(body: str) -> str:
    """A CommonMark code span holding `body` literally: its backtick string is longer than any run of
    backticks in the body, and a body that starts or ends with a backtick or a space is padded with
    one space on each side (CommonMark strips exactly one from each side of such a span)."""
    body = _one_line(body)
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    ticks = "`" * (longest + 1)
    if body.strip(" ") and (body[0] in "` " or body[-1] in "` "):
        body = f" {body} "
    return f"{ticks}{body}{ticks}"


def _fence(body: str) -> str:
    fence = "```"
    while fence in body:
        fence += "`"
    return f"{fence}text\n{body}\n{fence}"


def _block(b: Block) -> str:
    if isinstance(b, Heading):
        return "#" * b.level + " " + _line(_inline(b.text))
    if isinstance(b, Paragraph):
        return "\n".join(_line(_inline(line)) for line in b.lines)
    if isinstance(b, BulletList):
        return "\n".join("- " + _line(_inline(i)) for i in b.items)
    if isinstance(b, Table):
        lines = ["| " + " | ".join(_cell(c) for c in b.columns) + " |", "|" + "|".join("---" for _ in b.columns) + "|"]
        return "\n".join(lines + ["| " + " | ".join(_inline(c, cell=True) for c in r) + " |" for r in b.rows])
    if isinstance(b, Log):  # Markdown cannot fold: a folded log is left out (the story names its file)
        return "" if b.folded else _line(_inline(b.label)) + "\n" + _fence(b.text)
    if isinstance(b, Figure):
        if isinstance(b.chart, SamplesChart):
            return _fence(_text_samples(b.chart))
        return _fence(_text_grid(b.chart))
    if isinstance(b, Group):
        return "\n\n".join(x for x in (_block(c) for c in b.blocks) if x)
    if isinstance(b, Footer):
        return "_" + _inline(b.text) + "_"
    raise TypeError(f"not a report block: {b!r}")


def _text_samples(chart: SamplesChart) -> str:
    """The perf samples as text: per trial, the median, the range and the values."""
    lo, med, hi = chart.band
    lines = [f"{chart.metric}: reference (trial {chart.reference}) median {med:.4g}, range {lo:.4g} to {hi:.4g}"
             + (f"; regression allowance {chart.allowance:.4g}" if chart.allowance is not None else "")]
    for s in chart.series:
        v = sorted(s.values)
        m = statistics.median(v)
        lines.append(f"trial {s.n:>3} {s.outcome:<13} median {m:>10.4g}  [{v[0]:.4g} .. {v[-1]:.4g}]  "
                     + " ".join(f"{x:.4g}" for x in s.values))
    return "\n".join(lines)


def _text_grid(chart: TrialsChart) -> str:
    """The trials chart as text: a row per unit (■ applied), the outcome letters, the max latencies."""
    width = min(max((len(u) for u in chart.units), default=7), 60)
    culprits = set(chart.culprits)
    lines = [" " * (width + 3) + " ".join(f"{t.n:>2}" for t in chart.trials)]
    for u in chart.units:
        mark = "!" if u in culprits else " "
        cells = " ".join(" ■" if u in t.units else " ·" for t in chart.trials)
        lines.append(f"{mark} {u[:width]:<{width}} {cells}")
    lines.append(f"  {'outcome':<{width}} " + " ".join(f"{OUTCOME_LETTER.get(t.outcome, '?'):>2}"
                                                      for t in chart.trials))
    lines.append(f"  {'max latency s':<{width}} " + " ".join(_grid_lat(t.max_latency) for t in chart.trials))
    lines.append("")
    lines.append("■ applied · not applied   P pass  F fail  S start-failure  U unresolved   ! culprit")
    return "\n".join(lines)


def _grid_lat(x: float | None) -> str:
    if x is None:
        return " —"
    return f"{x:>2.0f}" if x >= 1 else "<1"
