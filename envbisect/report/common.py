"""What every part of the report shares: outcome colours and letters, log lengths, and the limits
of raw-value redaction."""
from __future__ import annotations

import re

from envbisect.inputs.masking import NUMBER_RE, TRIVIAL_VALUES, VAR_NAME_RE

__all__ = ["ANSI_RE", "LOG_LINES", "MIN_RAW_SECRET", "NUMBER_RE", "OUTCOME_COLORS", "OUTCOME_LETTER",
           "TRIVIAL_VALUES", "VAR_NAME_RE"]

OUTCOME_COLORS = {"pass": "#2e7d32", "fail": "#d32f2f", "start-failure": "#7f0000", "unresolved": "#9e9e9e"}
OUTCOME_LETTER = {"pass": "P", "fail": "F", "start-failure": "S", "unresolved": "U"}
# Raw values of secret-named variables are replaced literally wherever they appear, except values
# shorter than this, plain numbers (NUMBER_RE: SGLANG_TOKEN_LIMIT=4096 is not a secret worth masking
# every "4096" for) and the TRIVIAL_VALUES literals: they would match everywhere. They are still
# masked wherever they appear as NAME=VALUE or under their variable's name.
MIN_RAW_SECRET = 4
LOG_LINES = 40  # log lines per service and trial shown in the report (the bundle has the full capture)
# terminal escape sequences (CSI colour codes, OSC titles, two-byte escapes)
ANSI_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
