"""Where a known secret value is in a text although not whole: cut at the text's edge by a
truncation (a log tail, a probe's last characters), or cut in pieces by a line break or a space (a
wrapped log line, a probe excerpt that joins lines with a space)."""
from __future__ import annotations

import functools
import re
from typing import Iterable, Sequence

MIN_PARTIAL = 8  # a known value cut to fewer characters than this at an edge is not looked for


def cut_at_the_edges(text: str, value: str) -> Iterable[tuple[int, int]]:
    """Where ``text`` begins with the end of ``value`` or ends with its beginning (8+ characters):
    a known secret cut by truncation (``log_tail[-2000:]``, a probe's last 160 characters)."""
    if len(value) <= MIN_PARTIAL or len(text) < MIN_PARTIAL:
        return
    head, tail = text[:MIN_PARTIAL], text[-MIN_PARTIAL:]
    i = value.find(head, 1)
    while i != -1:
        if text.startswith(value[i:]):
            yield 0, len(value) - i
            break
        i = value.find(head, i + 1)
    j = value.find(tail)
    while j != -1 and j + MIN_PARTIAL < len(value):
        if text.endswith(value[:j + MIN_PARTIAL]):
            yield len(text) - j - MIN_PARTIAL, len(text)
            break
        j = value.find(tail, j + 1)


def across_whitespace(text: str, values: Sequence[str]) -> Iterable[tuple[int, int]]:
    """Known values a line break or a space cut in two (a wrapped log line, a value printed in pieces,
    a probe's excerpt that joins lines with a space): each piece of a value found whole once the
    whitespace is taken out, however short; and a line that begins with the end of a value or ends
    with its beginning (8+ characters), when the rest of it is not next to it (the lines printed apart)."""
    joined = _SPACE.sub("", text)
    split = [v for v in values if v in joined and joined.count(v) > text.count(v) and not _SPACE.search(v)]
    if split:
        kept = [i for i, c in enumerate(text) if not c.isspace()]
        for v in split:
            j = joined.find(v)
            while j != -1:
                s, e = kept[j], kept[j + len(v) - 1] + 1
                if e - s > len(v):  # it spans whitespace: each piece masked where it is
                    pos = s
                    for m in _SPACE.finditer(text, s, e):
                        yield pos, m.start()
                        pos = m.end()
                    yield pos, e
                j = joined.find(v, j + 1)
    pieces = _pieces(tuple(values))
    start = 0
    for raw in text.split("\n"):
        line = raw.rstrip("\r")
        near = pieces.get(line[:MIN_PARTIAL], ()) + pieces.get(line[-MIN_PARTIAL:], ())
        for v in dict.fromkeys(near):
            for a, b in cut_at_the_edges(line, v):
                yield start + a, start + b
        start += len(raw) + 1


_SPACE = re.compile(r"\s+")


@functools.lru_cache(maxsize=8)
def _pieces(values: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """Every MIN_PARTIAL-character piece of the values -> the values it is in: a line's edge is
    looked up, not searched for in every value."""
    out: dict[str, tuple[str, ...]] = {}
    for v in values:
        for i in range(len(v) - MIN_PARTIAL + 1):
            out[v[i:i + MIN_PARTIAL]] = out.get(v[i:i + MIN_PARTIAL], ()) + (v,)
    return out
