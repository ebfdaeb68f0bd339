"""The report shows the guilty commit of a HEAD move searched commit by commit (verdict.json's
"commit"): its sha, subject, author and files, and the trials that named it; or, when a trial was
unresolved, how far the line was narrowed. Hand-written run files, as test_bundle's branches."""
from __future__ import annotations

import json

from envbisect.report.html import render_html
from envbisect.report.markdown import render_markdown
from envbisect.report.record import load_run

BASE, GUILTY, HEAD = "a" * 40, "3f2c9d1e" + "b" * 32, "c" * 40
REPO = "git:node1:/srv/repo"
COMMIT = {"sha": GUILTY, "subject": "scheduler: overlap by default <sm120>", "author": "Rita Dev <rita@x.org>",
          "files": ["python/sglang/srt/managers/scheduler.py", "VERSION"], "merge": False}


def run_dir_with(tmp_path, commit: dict | None):
    run_dir = tmp_path / "store" / "runs" / "R1"
    run_dir.mkdir(parents=True)
    delta = {"id": REPO, "kind": "git", "host": "node1", "service": None, "path": "/srv/repo", "key": None,
             "change": "changed", "old": BASE, "new": HEAD, "baseline_source": "snapshot:S0", "detail": []}
    (run_dir / "run.json").write_text(json.dumps({
        "run_id": "R1", "deployment": "pd", "playbook": "/nonexistent.toml", "created_at": 1.7e9, "probe": "e2e",
        "options": {"confidence": 0.95, "leave": "original"}, "baseline": "S0", "current": "S1", "since": None,
        "deltas": [delta], "units": {REPO: [REPO]},
        "diff": {"baseline": {"snapshot": "S0", "label": "good", "taken_at": "x"}, "deltas": [delta], "drift": []}}))
    (run_dir / "trials.jsonl").write_text("")
    (run_dir / "events.jsonl").write_text("")
    (run_dir / "verdict.json").write_text(json.dumps({
        "run": "R1", "verdict": "culprit", "culprits": [REPO], "culprit_units": [REPO], "confidence": 0.99,
        "suspects": [], "explanation": "the HEAD move fails alone", "units": {REPO: [REPO]}, "restarts": 5,
        "path": None, "drift_hint": [], "final_probe": None, "state_left": "original", "notes": [],
        "commit": {"delta": REPO, "commit": commit, "last_passing": "d" * 40 if commit else "e" * 40,
                   "first_failing": GUILTY, "trials": [4, 5], "line": [COMMIT]}}))
    return load_run(run_dir)


def _shown(md: str) -> str:
    from markdown_it import MarkdownIt

    return "\n".join(c.content for t in MarkdownIt("commonmark").enable("table").parse(md)
                     for c in (t.children or ()) if c.type in ("text", "code_inline"))


def test_the_guilty_commit_block_shows_sha_subject_author_and_files(tmp_path):
    rec = run_dir_with(tmp_path, COMMIT)
    md, html = render_markdown(rec), render_html(rec)
    assert "Guilty commit" in md
    shown = _shown(md)  # as a Markdown viewer shows it: a `<` from the commit is text, not a tag
    for needle in (GUILTY, "scheduler: overlap by default <sm120>", "Rita Dev <rita@x.org>",
                   "python/sglang/srt/managers/scheduler.py", "VERSION", "first of 1 commits", "trials 4, 5"):
        assert needle in shown, (needle, md)
    assert GUILTY in html and "scheduler: overlap by default &lt;sm120&gt;" in html
    assert "Rita Dev &lt;rita@x.org&gt;" in html
    assert "python/sglang/srt/managers/scheduler.py" in html


def test_a_line_not_narrowed_to_one_commit_says_how_far_it_got(tmp_path):
    md = render_markdown(run_dir_with(tmp_path, None))
    assert "Guilty commit" in md and "not narrowed to one commit" in md and ("e" * 12) in md and GUILTY[:12] in md
