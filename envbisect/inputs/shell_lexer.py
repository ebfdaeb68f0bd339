"""Shell lexing of a serve-env file's text: where a statement ends and what the value word of an
assignment is made of, as ``sh``/``bash`` would lex it (quotes, escapes, continuations, comments,
``$NAME``/``${...}``, ``$(...)``, backquotes), without executing anything.

The lexer gives offsets and the parts of a value word (`Part`); what those parts mean is
`shell_meaning.py`'s, and the file model and its edits are `envfile.py`'s.
"""
from __future__ import annotations

import bisect
import re

from envbisect.errors import UsageError

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# an assignment statement's start: blanks, an optional `export`, the name and `=` (or `+=`, refused)
ASSIGN_RE = re.compile(r"[ \t]*(?:(export)[ \t]+)?([A-Za-z_][A-Za-z0-9_]*)(\+?=)")
WORD_END = frozenset(" \t\n;&|<>()")
BRACE_NAME_RE = re.compile(r"[#!]?([A-Za-z_][A-Za-z0-9_]*)")
SIMPLE_REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


class EnvFileError(UsageError, ValueError):
    """The file cannot be read the way the shell would read it, or an edit could not be made safely.

    Raised instead of guessing, because a guessed value would make a bisection blame the wrong
    variable.  `str(err)` is one line, ``line N: problem``; `lineno` is 1-based (0 when the
    problem is not tied to a line).  It is a `UsageError` so the CLI reports it like other
    bad-input errors, and a `ValueError` for callers that treat it as plain bad data.
    """

    def __init__(self, lineno: int, problem: str):
        problem = " ".join(problem.split("\n"))
        super().__init__(f"line {lineno}: {problem}" if lineno else problem)
        self.lineno = lineno
        self.problem = problem


# Parts of a value as the lexer saw it, kept so that `resolved` knows which `$` were live:
# ("lit", text) is literal (quoted or escaped), ("ref", raw) a parameter expansion like "$X" /
# "${X:-d}", ("tilde", "~") a tilde prefix, ("cmd", raw) a command or arithmetic substitution
# ("$(...)", "$((...))", "`...`"): bash runs it, envbisect never does (`resolved` keeps its text).
Part = tuple[str, str]


class ShellLexer:
    """Shell-lexing helpers over one text; every method takes and returns offsets."""

    MAX_NESTING = 100  # $( ${ inside each other: deeper is no env file, and would exhaust the stack

    def __init__(self, text: str):
        self.t = text
        self.n = len(text)
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.depth = 0

    def lineno(self, off: int) -> int:
        return bisect.bisect_right(self.line_starts, off)

    def error(self, off: int, problem: str):
        raise EnvFileError(self.lineno(off), problem)

    # -- skipping constructs whose content we keep verbatim (or ignore) --------------------

    def skip_sq(self, i: int) -> int:
        j = self.t.find("'", i + 1)
        if j < 0:
            self.error(i, "unterminated single quote")
        return j + 1

    def skip_ansi(self, i: int) -> int:
        t, j = self.t, i + 2
        while j < self.n:
            if t[j] == "\\":
                j += 2
            elif t[j] == "'":
                return j + 1
            else:
                j += 1
        self.error(i, "unterminated $'...' quote")

    def skip_bt(self, i: int) -> int:
        t, j = self.t, i + 1
        while j < self.n:
            if t[j] == "\\":
                j += 2
            elif t[j] == "`":
                return j + 1
            else:
                j += 1
        self.error(i, "unterminated backquote")

    def skip_dq(self, i: int) -> int:
        t, j = self.t, i + 1
        while j < self.n:
            c = t[j]
            if c == "\\":
                j += 2
            elif c == '"':
                return j + 1
            elif c == "`":
                j = self.skip_bt(j)
            elif c == "$" and t.startswith(("$(", "${"), j):
                j = self.skip_group(j)
            else:
                j += 1
        self.error(i, "unterminated double quote")

    def skip_group(self, i: int) -> int:
        """Skip ``$(...)``, ``$((...))`` or ``${...}`` starting at i, honouring nested quotes."""
        if self.depth >= self.MAX_NESTING:
            self.error(i, f"$( or ${{ nested more than {self.MAX_NESTING} levels deep")
        self.depth += 1
        try:
            return self._skip_group(i)
        finally:
            self.depth -= 1

    def _skip_group(self, i: int) -> int:
        t = self.t
        opener = t[i + 1]
        closer = ")" if opener == "(" else "}"
        depth, j = 1, i + 2
        while j < self.n:
            c = t[j]
            if c == "\\":
                j += 2
            elif c == "'":
                j = self.skip_sq(j)
            elif c == '"':
                j = self.skip_dq(j)
            elif c == "`":
                j = self.skip_bt(j)
            elif c == "$" and t.startswith(("$(", "${"), j):
                j = self.skip_group(j)
            else:
                if c == opener:
                    depth += 1
                elif c == closer:
                    depth -= 1
                    if depth == 0:
                        return j + 1
                j += 1
        self.error(i, f"unterminated ${opener}")

    def skip_statement(self, i: int) -> int:
        """Offset of the newline ending the (ignored) statement starting at i, or len(text)."""
        t, n = self.t, self.n
        j, word_start = i, True
        while j < n:
            c = t[j]
            if c == "\n":
                return j
            if c == "\\":
                if j + 1 < n and t[j + 1] != "\n":
                    word_start = False
                j += 2
                continue
            if c == "#" and word_start:
                nl = t.find("\n", j)
                return n if nl < 0 else nl
            if c == "'":
                j = self.skip_sq(j)
            elif c == '"':
                j = self.skip_dq(j)
            elif c == "`":
                j = self.skip_bt(j)
            elif c == "$" and t.startswith(("$(", "${"), j):
                j = self.skip_group(j)
            elif c == "$" and t.startswith("$'", j):
                j = self.skip_ansi(j)
            elif c == "<" and t.startswith("<<", j) and not t.startswith("<<<", j):
                self.error(j, "here-documents are not supported")
            else:
                j += 1
            word_start = c in " \t;&|()"
        return n

    # -- the value word of an assignment ---------------------------------------------------

    def lex_value(self, i: int) -> tuple[int, list[Part], list[str]]:
        t, n = self.t, self.n
        parts: list[Part] = []
        refs: list[str] = []

        def lit(s: str) -> None:
            if parts and parts[-1][0] == "lit":
                parts[-1] = ("lit", parts[-1][1] + s)
            else:
                parts.append(("lit", s))

        j = i
        tilde_ok = True  # at the word start, or right after an unquoted ':'
        while j < n:
            c = t[j]
            if c in WORD_END:
                break
            nxt_tilde = False
            if c == "\\":
                if j + 1 >= n:
                    lit("\\")  # bash keeps a backslash at end of file
                    j += 1
                elif t[j + 1] == "\n":
                    j += 2
                    nxt_tilde = tilde_ok  # a continuation does not end the prefix position
                else:
                    lit(t[j + 1])
                    j += 2
            elif c == "'":
                k = self.skip_sq(j)
                lit(t[j + 1 : k - 1])
                j = k
            elif c == '"':
                j = self._lex_dq(j, lit, parts, refs)
            elif c == "`":
                k = self.skip_bt(j)
                parts.append(("cmd", t[j:k]))
                j = k
            elif c == "$":
                j = self._lex_dollar(j, False, lit, parts, refs)
            elif c == "~" and tilde_ok and (j + 1 >= n or t[j + 1] in WORD_END or t[j + 1] in "/:"):
                parts.append(("tilde", "~"))
                j += 1
            else:
                lit(c)
                nxt_tilde = c == ":"
                j += 1
            tilde_ok = nxt_tilde
        return j, parts, refs

    def _lex_dq(self, i: int, lit, parts: list[Part], refs: list[str]) -> int:
        t, n = self.t, self.n
        j = i + 1
        while j < n:
            c = t[j]
            if c == '"':
                return j + 1
            if c == "\\":
                if j + 1 >= n:
                    break
                d = t[j + 1]
                if d == "\n":
                    pass
                elif d in '$`"\\':
                    lit(d)
                else:
                    lit("\\" + d)
                j += 2
            elif c == "`":
                k = self.skip_bt(j)
                parts.append(("cmd", t[j:k]))
                j = k
            elif c == "$":
                j = self._lex_dollar(j, True, lit, parts, refs)
            else:
                lit(c)
                j += 1
        self.error(i, "unterminated double quote")

    def _lex_dollar(self, i: int, quoted: bool, lit, parts: list[Part], refs: list[str]) -> int:
        t = self.t
        nxt = t[i + 1] if i + 1 < self.n else ""
        if nxt == "{":
            k = self.skip_group(i)
            raw = t[i:k]
            parts.append(("ref", raw))
            m = BRACE_NAME_RE.match(raw, 2)
            if m:
                refs.append(m.group(1))
            refs.extend(a or b for a, b in SIMPLE_REF_RE.findall(raw[2:-1]))
            return k
        if nxt == "(":
            k = self.skip_group(i)
            parts.append(("cmd", t[i:k]))  # command/arithmetic substitution: kept, never run
            return k
        m = NAME_RE.match(t, i + 1)
        if m:
            parts.append(("ref", "$" + m.group()))
            refs.append(m.group())
            return m.end()
        if not quoted and nxt in ("'", '"'):
            self.error(i, f"${nxt}...{nxt} quoting is not supported")
        lit("$")
        return i + 1
