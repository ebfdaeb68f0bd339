"""What bash makes of a value word, as a comparable value (`Meaning`), and what can be evaluated of
it without running anything: the variables it reads (`meaning_refs`), the parameter expansions that
`EnvFile.resolved` evaluates (`expand_ref`), and the literal form the shell can never execute
(`shell_quote`).
"""
from __future__ import annotations

import re
from typing import Callable, Iterable

from envbisect.inputs.shell_lexer import SIMPLE_REF_RE, Part

# What bash makes of a value word, as a comparable value: its parts, normalised (empty literals
# dropped, adjacent literals joined, "${X}" written "$X").
Meaning = tuple[Part, ...]

_SAFE_RE = re.compile(r"[A-Za-z0-9_./:,+=@%^-]+\Z")
_BRACE_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-+=])(.*))?\}\Z", re.S)
_PLAIN_BRACE_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}\Z")
_ANY_REF_RE = re.compile(r"\$\{?[#!]?([A-Za-z_][A-Za-z0-9_]*)")


def meaning_refs(meaning: Meaning) -> set[str]:
    """Every variable name a value may read: its parameter expansions, and the ``$NAME`` /
    ``${NAME...}`` found in the text of its command substitutions (over-approximated: that text is
    never run here)."""
    names: set[str] = set()
    for kind, text in meaning:
        if kind in ("ref", "cmd"):
            names.update(_ANY_REF_RE.findall(text))
    return names


def normalise(parts: Iterable[Part]) -> Meaning:
    """The `Meaning` of lexed parts: empty literals dropped, adjacent literals joined, "${X}" as "$X"."""
    out: list[Part] = []
    for kind, text in parts:
        if kind == "lit":
            if not text:
                continue
            if out and out[-1][0] == "lit":
                out[-1] = ("lit", out[-1][1] + text)
                continue
        elif kind == "ref":
            m = _PLAIN_BRACE_RE.match(text)
            if m:
                text = "$" + m.group(1)
        out.append((kind, text))
    return tuple(out)


def shell_quote(value: str) -> str:
    """A word that ``sh``/``bash`` read back as exactly `value`, with nothing expanded or executed.

    Bare when that is unambiguous (so common values like ``512`` or ``mlx5_0,mlx5_1`` stay
    readable and diffs stay small), otherwise single-quoted, the one quoting form in which no
    character is special; ``'`` is written as ``'\\''``.  NUL cannot be passed through a shell or
    an environment, so it raises `ValueError` instead of being silently dropped.
    """
    if "\0" in value:
        raise ValueError("a shell value cannot contain NUL")
    if _SAFE_RE.match(value):
        return value
    return "'" + value.replace("'", "'\\''") + "'"


def expand_simple(word: str, lookup: Callable[[str], str | None]) -> str | None:
    """Expand $Y/${Y} in a default word; None when it needs more than that (kept literal)."""
    if any(c in word for c in "'\"\\`"):
        return None
    out = SIMPLE_REF_RE.sub(lambda m: lookup(m.group(1) or m.group(2)) or "", word)
    rest = SIMPLE_REF_RE.sub("", word)
    if "${" in rest or "$(" in rest:
        return None
    return out


def expand_ref(raw: str, lookup: Callable[[str], str | None],
                assign: Callable[[str, str], None]) -> str:
    if not raw.startswith("${"):
        return lookup(raw[1:]) or ""
    m = _BRACE_RE.match(raw)
    if m is None:
        return raw
    name, op, word = m.groups()
    val = lookup(name)
    if op is None:
        return val or ""
    use_word = val is None or (op.startswith(":") and val == "")
    if op.endswith("+"):
        if use_word:
            return ""
        alt = expand_simple(word, lookup)
        return raw if alt is None else alt
    if not use_word:
        return val or ""
    dflt = expand_simple(word, lookup)
    if dflt is None:
        return raw
    if op.endswith("="):
        assign(name, dflt)
    return dflt
