"""report.md: every string from a host (env values, file names, delta ids, messages) is text when the
report is rendered, in every block: no HTML tag, image, link, heading, list or emphasis of its own.
Rendered with markdown-it-py's CommonMark preset (raw HTML on, as GitLab, VS Code and most viewers)."""
from __future__ import annotations

import re

import pytest
from markdown_it import MarkdownIt

from envbisect.report.blocks import BulletList, Code, Footer, Heading, Log, Paragraph, Story, Strong, Table, text
from envbisect.report.markdown import render_markdown

HOSTILE = [
    "![pixel](http://127.0.0.1:9/leak?x=1)",
    "<img src=x onerror=alert(1)>",
    "[click](javascript:alert(1))",
    "file:node1:/w/<img src=x onerror=alert(1)>.yaml",
    "<http://evil.example/a>",
    "<script>alert(1)</script>",
    "&lt;img src=x&gt; &#60;b&#62;",
    "*bold* _em_ **strong** ~~del~~ `tick",
    "a | b | c",
    "# heading",
    "- item",
    "1. item",
    "> quote",
    "===",
    "[ref]: http://evil.example/x",
    "[ref]",
    "x\\<img src=y onerror=z>",
]


def _render(md: str) -> tuple[str, list]:
    mdi = MarkdownIt("commonmark").enable("table")
    return mdi.render(md), mdi.parse(md)


def _story(value: str) -> Story:
    return Story("t", (
        Heading(1, text("Report ", value)),
        Paragraph((text("changed: ", value), text(value))),
        BulletList((text(value), text("then ", Strong(text(value))))),
        Table(("delta", value), ((text(value), text(Code(text(value)))),)),
        Log(text(value), "a log"),
        Footer(text(value)),
    ))


def _texts(tokens) -> str:
    out = []
    for tok in tokens:
        for child in tok.children or ():
            if child.type in ("text", "code_inline"):
                out.append(child.content)
    return "\n".join(out)


@pytest.mark.parametrize("value", HOSTILE)
def test_a_host_string_is_shown_as_text_in_every_block_of_report_md(value):
    md = render_markdown(_story(value))
    html, tokens = _render(md)
    kinds = {t.type for t in tokens} | {c.type for t in tokens for c in (t.children or ())}
    assert not kinds & {"html_inline", "html_block", "image", "link_open", "s_open"}, (md, kinds)
    assert not re.search(r"<(img|script|a |a>|iframe|svg|h[2-6]|ol|blockquote)", html), html
    assert len([t for t in tokens if t.type == "heading_open"]) == 1, md
    assert len([t for t in tokens if t.type == "bullet_list_open"]) == 1, md
    inline = [c.type for t in tokens for c in (t.children or ())]
    assert inline.count("strong_open") == 1 and inline.count("em_open") == 1, md  # the Strong, the Footer
    # a table keeps its two columns; the value is shown as it is, every time
    assert html.count("<th>") == 2 and html.count("<td>") == 2, html
    assert _texts(tokens).count(value) >= 8, (md, _texts(tokens))


def test_the_bundles_leak_check_finds_a_secret_in_its_markdown_form():
    """A secret with Markdown syntax in it is escaped in report.md; the bundle's last check (a
    known raw value in any member refuses the bundle) looks for that form too."""
    from envbisect.inputs.masking import SecretMasker
    from envbisect.report import Redactor
    from envbisect.report.bundle import _leaks
    from envbisect.report.markdown import md_text

    secret = "Pa*ss<w0rd>|Xq7_"
    rd = Redactor(SecretMasker(), [secret])
    assert md_text(secret) != secret
    assert _leaks({"report.md": md_text(f"pw {secret} here").encode()}, rd) == ["report.md"]
    assert _leaks({"report.md": b"nothing"}, rd) == []
