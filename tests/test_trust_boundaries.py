"""Trust boundaries (issue 22: F1, F5, F12, F13, F14, F15): the operator's machine, the playbook and
the inventory are trusted; each host is trusted for itself only, and values from the hosts are data."""
from __future__ import annotations

import pytest

from envbisect.report.blocks import Code, Heading, Paragraph, Story, Table, text
from envbisect.report.markdown import render_markdown

HOSTILE_VALUES = ["a`b", "``x``", "`lead", "trail`", "x ``` y", "` `", "a|b`c", "line1\n# heading\n```", " ` "]


def _code_spans(md: str) -> list[str]:
    markdown_it = pytest.importorskip("markdown_it")
    tokens = markdown_it.MarkdownIt("commonmark").enable("table").parse(md)
    out = []
    for tok in tokens:
        for child in tok.children or ():
            if child.type == "code_inline":
                out.append(child.content)
    return out


@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_markdown_code_span_holds_a_backtick_value_intact(value):
    """F15: a value with backticks (or a line break) stays inside its code span, in a paragraph and in a table."""
    story = Story("t", (Heading(1, text("Report")),
                        Paragraph((text("culprit ", Code(text(value)), " then **after**"),)),
                        Table(("key", "value"), ((text("k"), text(Code(text(value)))),))))
    md = render_markdown(story)
    shown = value.replace("\n", " ")
    assert _code_spans(md) == [shown, shown], md
    assert [line for line in md.splitlines() if line.startswith("#")] == ["# Report"], md  # no new block
    assert "**after**" in md
