"""The postmortem report of one bisection run: Markdown and self-contained HTML.

`load_run(run_dir)` reads everything a run left in `runs/RUN_ID/` (run.json, trials.jsonl,
verdict.json, events.jsonl, environment.json, evidence/, a summary of journal.json) plus the
baseline and current snapshots from the store, and REDACTS it on the way in: a `RunRecord` never
holds a raw secret. `build_story(record)` says what the report says once, as blocks, each string
through the run's masker once more; `render_markdown` / `render_html` take a record or that story.

Redaction (`Redactor`) = the masker's `redact_text` on every string (secret shapes, secret
``NAME=VALUE`` forms, the playbook's [secrets]) plus a literal replacement of the raw values of
every secret-named variable the run knows about (its env deltas, the env files and process
environments of both snapshots, the journal's original env files): those values can show up in a
log line without any recognisable shape.

Modules: `record` (the RunRecord and load_run: what the run left, redacted on the way in, with
`redaction`), `story` (`build_story`: what the report says, whatever the format, as a `Story` of
`blocks`, every string redacted once more by the run's masker as it is built; `facts` reads the
record out for it), `markdown` and `html` (the two renderers: they walk the blocks and only format
them), `common` (outcome colours and letters, redaction limits), `bundle` (the evidence archive).

The report tells the story to someone who was not there: the question, the deltas, the premise
checks and what they meant, a timeline, every trial, the verdict, the layered path check
(not-config), drift hints (not-reproduced), the end state and the versions.
"""
from __future__ import annotations

from envbisect.report.blocks import Story
from envbisect.report.common import OUTCOME_COLORS
from envbisect.report.html import render_html, trials_svg
from envbisect.report.markdown import render_markdown
from envbisect.report.record import RunRecord, journal_summary, load_run, masked_deltas, snapshot_summary
from envbisect.report.redaction import Redactor, default_masker, load_snapshot_doc, make_redactor, secret_raw_values
from envbisect.report.story import build_story

__all__ = ["RunRecord", "Redactor", "Story", "load_run", "make_redactor", "build_story", "render_markdown",
           "render_html", "OUTCOME_COLORS", "trials_svg", "journal_summary", "masked_deltas", "snapshot_summary",
           "default_masker", "load_snapshot_doc", "secret_raw_values"]
