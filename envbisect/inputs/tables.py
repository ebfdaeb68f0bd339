"""Typed, strict reading of one TOML table, shared by the playbook's sections and its probe keys.

A key of the wrong type, a missing required key or an unknown key is a `PlaybookError` that names
the file and the dotted key: a typo in a file that drives restarts must never be silently ignored.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from envbisect.errors import PlaybookError

VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TableReader:
    """Typed access to one TOML table that remembers the dotted key for error messages."""

    def __init__(self, path: Path, prefix: str, table: Any):
        self.path, self.prefix = path, prefix
        if not isinstance(table, dict):
            raise PlaybookError(path, prefix, f"must be a table, got {type(table).__name__}")
        self.table = table
        self.used: set[str] = set()

    def key(self, k: str) -> str:
        return f"{self.prefix}.{k}" if self.prefix else k

    def get(self, k: str, kind: type | tuple[type, ...], default: Any = ..., *, required: bool = False) -> Any:
        self.used.add(k)
        if k not in self.table:
            if required or default is ...:
                raise PlaybookError(self.path, self.key(k), "is required")
            return default
        v = self.table[k]
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if not isinstance(v, kind) or (kind is not bool and isinstance(v, bool)):
            want = kind.__name__ if isinstance(kind, type) else "/".join(t.__name__ for t in kind)
            raise PlaybookError(self.path, self.key(k), f"must be {want}, got {type(v).__name__} {v!r}")
        if isinstance(v, str) and not v.strip() and required:
            raise PlaybookError(self.path, self.key(k), "must not be empty")
        return v

    def in_range(self, k: str, kind: type, default: Any, lo: float, hi: float, what: str) -> Any:
        """A number between lo and hi (None passes when it is the default); `what` says the range."""
        v = self.get(k, kind, default)
        if v is not None and not lo <= v <= hi:
            raise PlaybookError(self.path, self.key(k), f"must be {what}, got {v!r}")
        return v

    def fraction(self, k: str, default: str, allow_zero: bool = False) -> float:
        """A fraction written "5%" or 0.05 (see `parse_fraction`)."""
        try:
            return parse_fraction(self.get(k, (str, float, int), default), allow_zero=allow_zero)
        except ValueError as e:
            raise PlaybookError(self.path, self.key(k), str(e)) from None

    def str_list(self, k: str) -> tuple[str, ...]:
        v = self.get(k, list, [])
        for item in v:
            if not isinstance(item, str):
                raise PlaybookError(self.path, self.key(k), f"must be a list of strings, got {item!r}")
        return tuple(v)

    def variable_names(self, k: str) -> tuple[str, ...]:
        """A list of environment variable names."""
        names = self.str_list(k)
        for name in names:
            if not VARIABLE_NAME.fullmatch(name):
                raise PlaybookError(self.path, self.key(k), f"{name!r} is not a variable name")
        return names

    def absolute(self, k: str, value: str) -> str:
        """`value` (read from key k) as an absolute path on a host."""
        check_absolute(self.path, self.key(k), value)
        return value

    def finish(self) -> None:
        unknown = sorted(set(self.table) - self.used)
        if unknown:
            raise PlaybookError(self.path, self.key(unknown[0]), "unknown key (see docs/playbook.md)")


def check_absolute(path: Path, key: str, value: str) -> None:
    if not value.startswith("/"):
        raise PlaybookError(path, key, f"must be an absolute path on the host, got {value!r}")


def parse_fraction(text: str | float | int, allow_zero: bool = False) -> float:
    """ "5%" or 0.05 -> 0.05; ValueError (one line) for anything else or outside (0, 1)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        v = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(%?)\s*", str(text))
        if not m:
            raise ValueError(f"must be a fraction such as \"5%\" or 0.05, got {text!r}")
        v = float(m.group(1)) / (100.0 if m.group(2) else 1.0)
    if not (0 <= v < 1 if allow_zero else 0 < v < 1):
        zero = "0 allowed, " if allow_zero else ""
        raise ValueError(f"must be between 0% and 100% ({zero}exclusive), got {text!r}")
    return v
