"""The playbook keys of the probes that read Prometheus (`metrics`, `promql`) and of the accuracy
probe (`answers`), checked at load like every other key (see docs/playbook.md).

An `answers` file is JSON lines, one prompt a line, with exactly one of the expected forms:
``{"prompt": "What is 17 + 25?", "answer": "42"}`` (exact: the reply, or its last word, without
surrounding punctuation), ``{"prompt": "...", "regex": "\\\\b42\\\\b"}`` (searched in the reply) or
``{"prompt": "...", "choice": "B"}`` (the first standalone capital letter A-J of the reply).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from envbisect.errors import PlaybookError
from envbisect.inputs.tables import TableReader

METRICS_READINGS = ("rate", "quantile", "gauge")  # what a metrics probe makes of its series (probe_metrics.py)

ANSWER_FORMS = ("answer", "regex", "choice")  # the JSONL key -> how the reply is judged
FORM_KIND = {"answer": "exact", "regex": "regex", "choice": "choice"}
ANSWERS_MAX_ITEMS = 100_000


def parse_reading(r: TableReader, kind: str) -> dict[str, Any]:
    """metrics / promql keys -> Probe fields (with `metric`: the label the perf judge shows)."""
    out: dict[str, Any] = {"load_s": r.in_range("load_s", float, 3.0, 0.2, 3600, "between 0.2 and 3600 seconds")}
    higher = r.get("higher_is_better", bool, None)
    if kind == "metrics":
        murl = r.get("metrics_url", str, required=True)
        if not murl.startswith(("http://", "https://")):
            raise PlaybookError(r.path, r.key("metrics_url"), f"must be an http(s) URL, got {murl!r}")
        series = r.get("series", str, required=True).strip()
        if not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", series):
            raise PlaybookError(r.path, r.key("series"), f"is not a Prometheus metric name: {series!r}")
        reading = r.get("reading", str, "rate")
        if reading not in METRICS_READINGS:
            raise PlaybookError(r.path, r.key("reading"),
                                f"must be one of {', '.join(METRICS_READINGS)}, got {reading!r}")
        q = r.in_range("quantile", float, 0.5, 0.0, 1.0, "between 0 and 1")
        labels = r.get("labels", dict, {})
        for k, v in labels.items():
            if not isinstance(v, str):
                raise PlaybookError(r.path, r.key(f"labels.{k}"), f"must be a string, got {v!r}")
        if higher is None and reading == "gauge":
            raise PlaybookError(r.path, r.key("higher_is_better"), "is required with reading = \"gauge\"")
        # a rate of a counter (tokens, requests) is better higher; a histogram's quantile (TTFT, latency) lower
        higher = (reading == "rate") if higher is None else higher
        shown = f"p{q * 100:g} of {series}" if reading == "quantile" else f"{reading} of {series}"
        out.update(metrics_url=murl, series=series, reading=reading, quantile=q,
                   labels=tuple(sorted(labels.items())), higher=higher, metric=shown)
    else:
        prom = r.get("prometheus", str, required=True)
        if not prom.startswith(("http://", "https://")):
            raise PlaybookError(r.path, r.key("prometheus"), f"must be an http(s) URL, got {prom!r}")
        query = r.get("query", str, required=True)
        if not query.strip():
            raise PlaybookError(r.path, r.key("query"), "must not be empty")
        if higher is None:
            raise PlaybookError(r.path, r.key("higher_is_better"), "is required for kind = \"promql\" (is a higher "
                                "value of the query better?)")
        out.update(prometheus=prom.rstrip("/"), query=query, higher=higher, metric="promql")
    return out


def parse_answers(r: TableReader) -> dict[str, Any]:
    """answers keys -> Probe fields; the JSONL file is read and checked now, not mid-run."""
    rel = r.get("answers", str, required=True)
    path = (r.path.parent / rel) if not rel.startswith("/") else Path(rel)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "strerror", None) or e
        raise PlaybookError(r.path, r.key("answers"), f"cannot read {path}: {reason}") from None
    items = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            raise PlaybookError(r.path, r.key("answers"), f"{path} line {i} is not JSON") from None
        forms = [f for f in ANSWER_FORMS if f in doc] if isinstance(doc, dict) else []
        if not isinstance(doc, dict) or not isinstance(doc.get("prompt"), str) or len(forms) != 1 \
                or not isinstance(doc[forms[0]], str):
            raise PlaybookError(r.path, r.key("answers"), f"{path} line {i}: needs a \"prompt\" string and exactly one "
                                "of \"answer\", \"regex\", \"choice\" (a string)")
        form = forms[0]
        if form == "regex":
            try:
                re.compile(doc[form])
            except re.error as e:
                raise PlaybookError(r.path, r.key("answers"), f"{path} line {i}: bad regex: {e}") from None
        if form == "choice" and not re.fullmatch(r"[A-J]", doc[form]):
            raise PlaybookError(r.path, r.key("answers"), f"{path} line {i}: a choice is one letter A-J")
        items.append((doc["prompt"], FORM_KIND[form], doc[form]))
    if not items:
        raise PlaybookError(r.path, r.key("answers"), f"{path} holds no prompts")
    if len(items) > ANSWERS_MAX_ITEMS:
        raise PlaybookError(r.path, r.key("answers"), f"{path} holds more than {ANSWERS_MAX_ITEMS} prompts")
    return dict(answer_items=tuple(items), model=r.get("model", str, "default"),
                max_tokens=r.in_range("max_tokens", int, 64, 1, 100_000, "between 1 and 100000"),
                requests=r.in_range("requests", int, 200, 10, 100_000, "between 10 and 100000 (prompts per run)"),
                tolerance=r.fraction("tolerance", "10%"), min_accuracy=r.fraction("min_accuracy", "0%", True),
                metric="accuracy")
