"""What a report is made of, whatever the format: small frozen blocks and inline pieces.

`story.build_story` turns a run record into a `Story` (a title and a tuple of blocks) and redacts it
once (`redacted`: every string in it through the run's masker, piece by piece, never across markup,
because the markup is only added by the renderers). `markdown` and `html` walk the blocks and only
format them: a renderer decides how a block looks, never what the report says.

Inline pieces (`Text` is a tuple of them): a plain `str`, `Strong`, `Code`, `Badge` (an outcome:
a coloured badge where the format has colour, its `plain` text elsewhere) and `Link` (an in-page
link: its text where the format has no anchors). Blocks: `Heading`, `Paragraph` (lines kept
together), `BulletList`, `Table` (key/value or with a header row), `Log` (a captured log: a label
and its last lines; a folded one is supplementary, left out where the format cannot fold),
`Figure` (the trials chart, drawn by each renderer from `TrialsChart`), `Group` (blocks that
belong together: a trial, the verdict) and `Footer`. Presentation hints (`cls`, `anchor`,
`row_classes`, `numeric`) are for formats that can use them and are ignored by the others.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Union

from envbisect.inputs.masking import SecretMasker


@dataclass(frozen=True)
class Strong:
    text: Text


@dataclass(frozen=True)
class Code:
    text: Text


@dataclass(frozen=True)
class Badge:
    outcome: str  # pass / fail / start-failure / unresolved (anything else: a neutral badge)
    plain: Text  # how it reads where the format has no badges


@dataclass(frozen=True)
class Link:
    target: str  # an anchor in the same report
    text: Text


Inline = Union[str, Strong, Code, Badge, Link]
Text = tuple  # tuple[Inline, ...]


def text(*parts: Any) -> Text:
    """A `Text` of the parts: inline pieces as they are, anything else as its string (None: nothing)."""
    out: list[Inline] = []
    for p in parts:
        if p is None:
            continue
        if isinstance(p, tuple):
            out.extend(p)
        elif isinstance(p, (Strong, Code, Badge, Link)):
            out.append(p)
        else:
            out.append(str(p))
    return tuple(out)


@dataclass(frozen=True)
class Heading:
    level: int
    text: Text


@dataclass(frozen=True)
class Paragraph:
    lines: tuple[Text, ...]  # kept together (one paragraph per line where the format has no line breaks)
    cls: str = ""


@dataclass(frozen=True)
class BulletList:
    items: tuple[Text, ...]
    classes: tuple[str, ...] = ()  # one per item, or none


@dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    rows: tuple[tuple[Text, ...], ...]
    kv: bool = False  # a key/value table: the first cell of a row is its header
    numeric: tuple[int, ...] = ()  # columns of numbers (right-aligned where the format can)
    row_classes: tuple[str, ...] = ()
    cls: str = ""


@dataclass(frozen=True)
class Log:
    label: Text
    text: str  # the lines shown (already cut to the last few)
    folded: bool = False  # supplementary: folded where the format can, left out where it cannot


@dataclass(frozen=True)
class ChartTrial:
    n: str
    outcome: str
    units: tuple[str, ...]  # the units applied in this trial
    max_latency: float | None
    title: str  # "trial 3 · FAIL · purpose — reason"


@dataclass(frozen=True)
class TrialsChart:
    """Which unit was applied in which trial, each trial's outcome and slowest probe request."""

    run_id: str
    units: tuple[str, ...]
    culprits: tuple[str, ...]
    trials: tuple[ChartTrial, ...]


@dataclass(frozen=True)
class SampleSeries:
    n: str  # the trial
    outcome: str
    values: tuple[float, ...]
    title: str


@dataclass(frozen=True)
class SamplesChart:
    """A perf probe's samples, one strip per trial, against the reference's band (min to max of
    the reference trial's samples, the median marked): what "worse" was decided on."""

    run_id: str
    metric: str
    reference: str  # the trial whose samples are the reference
    band: tuple[float, float, float]  # reference min, median, max
    allowance: float | None  # the median moved by `regression` (worse than this line = a regression)
    series: tuple[SampleSeries, ...]


@dataclass(frozen=True)
class Figure:
    chart: "TrialsChart | SamplesChart"
    caption: str = ""  # for formats that show the chart as a picture (a text figure carries its legend)


@dataclass(frozen=True)
class Group:
    blocks: tuple[Block, ...]
    anchor: str = ""
    cls: str = ""
    role: str = ""  # "section" (a part of the report, like the verdict) or "" (a box inside one)


@dataclass(frozen=True)
class Footer:
    text: Text


Block = Union[Heading, Paragraph, BulletList, Table, Log, Figure, Group, Footer]


@dataclass(frozen=True)
class Story:
    title: str
    blocks: tuple[Block, ...]


def redacted(o: Any, masker: SecretMasker) -> Any:
    """`o` with every string in it (inline pieces, cells, labels, hints) through `masker.redact_text`."""
    if isinstance(o, str):
        return masker.redact_text(o) if o else o
    if isinstance(o, tuple):
        return tuple(redacted(x, masker) for x in o)
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.replace(o, **{f.name: redacted(getattr(o, f.name), masker) for f in dataclasses.fields(o)})
    return o  # numbers, None, booleans
