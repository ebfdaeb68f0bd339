"""Issue 24's "done when", the documentation part: the guide's worked example shows a flag-level
verdict (one flag of an argument string named, reverted alone), and the playbook reference documents
`[deltas] args`."""
from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_guides_worked_example_shows_a_flag_level_verdict():
    guide = (DOCS / "guide.md").read_text()
    flag_id = r"decode:SGLANG_EXTRA_ARGS\[--attention-backend\]"
    assert re.search(r"culprit\(s\)[^\n]*: " + flag_id, guide), "no flag-level verdict line"
    assert re.search(r"reverted: " + flag_id, guide), "the revert of that one flag is not shown"
    assert "~ SGLANG_EXTRA_ARGS --attention-backend flashinfer → triton" in guide  # the diff per flag


def test_the_playbook_reference_documents_deltas_args():
    row = next((line for line in (DOCS / "playbook.md").read_text().splitlines()
                if line.startswith("| `[deltas]` | `args` |")), None)
    assert row is not None, "no [deltas] args row"
    assert "one delta per flag" in row and "*_ARGS" in row
