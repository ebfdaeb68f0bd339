"""What every part of the report shares: outcome colours and letters, log lengths, and the limits
of raw-value redaction."""
from __future__ import annotations

import re

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
