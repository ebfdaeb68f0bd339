"""What every part of the report shares: outcome colours and the render-time redaction of run data."""
from __future__ import annotations

import contextvars
import re
from typing import Any

from envbisect.inputs.masking import SecretMasker

OUTCOME_COLORS = {"pass": "#2e7d32", "fail": "#d32f2f", "start-failure": "#7f0000", "unresolved": "#9e9e9e"}
_OUTCOME_LETTER = {"pass": "P", "fail": "F", "start-failure": "S", "unresolved": "U"}
# Raw values of secret-named variables are replaced literally wherever they appear, except values
# shorter than this, plain numbers (SGLANG_TOKEN_LIMIT=4096 is not a secret worth masking every "4096"
# for) and these literals: they would match everywhere. They are still masked wherever they appear as
# NAME=VALUE or under their variable's name.
_MIN_RAW_SECRET = 4
_TRIVIAL_VALUES = frozenset({"true", "false", "none", "null", "yes", "no", "on", "off", "unset", "empty"})
_NUMBER_RE = re.compile(r"[+-]?\d+(?:\.\d+)?")
_LOG_LINES = 40  # log lines per service and trial shown in the report (the bundle has the full capture)
_VAR_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# terminal escape sequences (CSI colour codes, OSC titles, two-byte escapes)
_ANSI_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")

# The masker of the record being rendered: every piece of run data is passed through its
# redact_text once more as it is written out (piece by piece, never across markup).
_RENDER_MASKER: contextvars.ContextVar[SecretMasker | None] = contextvars.ContextVar("envbisect_render_masker",
                                                                                     default=None)


def _t(s: Any) -> str:
    """Run data as text, redacted by the masker of the record being rendered."""
    s = "" if s is None else str(s)
    m = _RENDER_MASKER.get()
    return m.redact_text(s) if m is not None and s else s
