"""Where a known secret value is in a text although not whole: cut at the text's edge by a
truncation (a log tail, a probe's last characters), or cut in pieces by a line break or a space (a
wrapped log line, a probe excerpt that joins lines with a space)."""
from __future__ import annotations

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
    kept = [i for i, c in enumerate(text) if not c.isspace()]
    joined = "".join(text[i] for i in kept)
    for v in values:
        if any(c.isspace() for c in v):
            continue
        j = joined.find(v)
        while j != -1:
            s, e = kept[j], kept[j + len(v) - 1] + 1
            if e - s > len(v):  # it spans whitespace: each piece masked where it is
                pos = s
                for m in re.finditer(r"\s+", text[s:e]):
                    yield pos, s + m.start()
                    pos = s + m.end()
                yield pos, e
            j = joined.find(v, j + 1)
    start = 0
    for line in text.split("\n"):
        for v in values:
            for a, b in cut_at_the_edges(line, v):
                yield start + a, start + b
        start += len(line) + 1
