"""Parse, diff and surgically edit ``*.serve-env`` files.

A serve-env file is a shell fragment that the start script *sources*, so the truth about what a
process sees is whatever ``sh``/``bash`` would make of it.  This module therefore follows shell
lexing rules (quotes, escapes, continuations, comments) instead of ``KEY=VALUE`` line splitting,
and never executes anything: ``$(...)`` and backquotes are kept as text (as their own part kind,
so that ``$(nproc)`` and ``'$(nproc)'`` are told apart).

Two assignments are *the same* when bash makes the same of them: `EnvAssignment.meaning` (the lexed
parts: literal text, parameter expansions, tilde prefixes, command substitutions), not the text
(``X=512`` and ``X="512"`` are the same) and not the unquoted value (``X='$HOME/t'`` and
``X="$HOME/t"`` are not).

Bisection flips one variable at a time on production hosts, so edits are byte-surgical: only the
value word of one assignment is replaced, every other byte stays identical, and every edit is
re-parsed and checked (by meaning) before it is returned.  A literal value is written in a form that
the shell cannot execute (`EnvFile.with_value`, `shell_quote`); a word that the file once held is
written back as exactly that shell text (`EnvFile.with_word`), so a baseline such as
``"${HF_HOME%/*}/kv"`` means again what it meant.

Supported: ``export K=V``, ``K=V``, several of them on one line (``export A=1 B=2``: each is an
assignment of its own, edited alone), leading blanks, comments, blank lines, single quotes, double
quotes (``\\" \\\\ \\$ \\``` escapes), backslash escapes, backslash-newline continuations,
``$NAME`` / ``${NAME}`` references (plus ``${NAME:-w}``-style defaults in `EnvFile.resolved`),
``~`` at the start of a value or after ``:``.

Deliberately *not* understood (see the individual docstrings): control flow (an assignment inside
an ``if`` block counts as unconditional), ``declare``/``readonly``/``local`` (ignored like any
other command), ``export K`` without ``=`` (ignored: it assigns nothing), here-documents, ``+=``,
arrays, ``$'...'`` quoting and assignments followed by a command on one line (the last four raise
`EnvFileError` rather than being silently misread).

Size (718 lines): a shell-word parser and its meaning (quoting, which expansions can be evaluated and which cannot), and line-exact edits by it: one grammar.
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping

from envbisect.errors import UsageError

__all__ = [
    "EnvAssignment",
    "EnvFile",
    "EnvFileError",
    "Meaning",
    "meaning_refs",
    "parse_env",
    "shell_quote",
    "word_meaning",
]


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
_Part = tuple[str, str]
# What bash makes of a value word, as a comparable value: its parts, normalised (empty literals
# dropped, adjacent literals joined, "${X}" written "$X").
Meaning = tuple[_Part, ...]


@dataclass(frozen=True)
class EnvAssignment:
    """One ``[export] KEY=VALUE`` statement, with enough position data to rewrite it in place.

    `start`/`end` cover the whole line(s) (leading blanks and a trailing comment included, the
    final newline excluded) so that removing an assignment removes its lines; `value_start`/
    `value_end` cover only the value word, which is all that `EnvFile.with_value` replaces.

    `value` is the shell-unquoted text with references left as written, so ``'$HOME'``,
    ``\\$HOME`` and ``$HOME`` all give ``"$HOME"``; `refs`, `meaning` (and `EnvFile.resolved`) tell
    them apart.  References inside ``$(...)``/backquotes are not listed: that text is never run.
    `word` is the exact shell text of the value word (``"${HF_HOME%/*}/kv"`` with its quotes).
    """

    key: str
    value: str
    exported: bool
    start: int
    end: int
    lineno: int
    refs: tuple[str, ...]
    value_start: int = -1
    value_end: int = -1
    parts: tuple[_Part, ...] = field(default=(), repr=False, compare=False)
    word: str = field(default="", repr=False, compare=False)

    @property
    def meaning(self) -> Meaning:
        """What bash makes of the value (see `Meaning`): equal meanings, equal assignments."""
        return _normalise(self.parts)


@dataclass(frozen=True)
class EnvFile:
    """A parsed serve-env file; the original `text` is kept so edits can preserve every byte."""

    text: str
    assignments: tuple[EnvAssignment, ...]

    def values(self) -> dict[str, str]:
        """Key -> literal value, last assignment winning, because that is what sourcing leaves."""
        return {a.key: a.value for a in self.assignments}

    def meanings(self) -> dict[str, Meaning]:
        """Key -> what bash makes of its value (`EnvAssignment.meaning`), last assignment winning."""
        return {a.key: a.meaning for a in self.assignments}

    def duplicates(self) -> dict[str, list[int]]:
        """Keys assigned more than once -> their line numbers; an early copy is a common trap."""
        lines: dict[str, list[int]] = {}
        for a in self.assignments:
            lines.setdefault(a.key, []).append(a.lineno)
        return {k: v for k, v in lines.items() if len(v) > 1}

    def get(self, key: str) -> EnvAssignment | None:
        """The assignment that takes effect (the last one), or None if the file never sets key."""
        for a in reversed(self.assignments):
            if a.key == key:
                return a
        return None

    def with_value(self, key: str, value: str) -> str:
        """New file text with key set to value. If the key exists, rewrite ONLY the span of its last assignment (keep `export ` prefix if it had one, keep any trailing comment on that line), every other byte identical. Earlier duplicate assignments are left untouched (the last one wins anyway). If absent, append `export KEY=<quoted>` as a new line at the end (adding a newline first if the file does not end with one).

        Only the value word is replaced, so a non-exported ``K=V`` stays non-exported (the start
        script's ``set -a`` or a later ``export K`` is what exports it).  The value is written
        with `shell_quote`, so sourcing can never execute it.  The result is re-parsed and
        checked (new value read back, every other key unchanged) because these edits land on
        production hosts; when a plain append would be swallowed by a dangling backslash
        continuation a blank line is inserted first, and if no safe edit exists `EnvFileError`
        is raised.  Raises `ValueError` for an invalid key or a value containing NUL.
        """
        _check_key(key)
        quoted = shell_quote(value)
        return self._set_word(key, quoted, _normalise((("lit", value),)))

    def with_word(self, key: str, word: str) -> str:
        """New file text with key's value word replaced by exactly `word`: shell text as a file held
        it (``"${HF_HOME%/*}/kv"``, ``$(nproc)``, ``~/x``), written back byte for byte, never
        re-quoted, so that sourcing gives what it gave then.  Placement, the append rule and the
        safety re-parse are those of `with_value`; the check compares by meaning (the key must mean
        what `word` means, every other key what it meant).  Raises `EnvFileError` when `word` is
        not exactly one value word (``a b``, a trailing comment, an unterminated quote...).
        """
        _check_key(key)
        return self._set_word(key, word, word_meaning(word))

    def _set_word(self, key: str, word: str, want: Meaning) -> str:
        cur = self.get(key)
        if cur is not None:
            candidates = [self.text[: cur.value_start] + word + self.text[cur.value_end :]]
        else:
            sep = "" if not self.text or self.text.endswith("\n") else "\n"
            line = f"export {key}={word}\n"
            candidates = [self.text + sep + line, self.text + sep + "\n" + line]
        for candidate in candidates:
            if self._edit_keeps_others(candidate, key, want):
                return candidate
        where = cur.lineno if cur is not None else 0
        raise EnvFileError(where, f"cannot set {key} without changing other assignments "
                                  "(does the file end with a backslash?)")

    def with_lines_of(self, key: str, reference: "EnvFile") -> str:
        """New text with every assignment of key in `reference` (the same file on the other side of
        a change) put back as exactly its bytes, each right after the nearest line before it in
        `reference` that this text still has (lines matched in order, as diff does), or at the top
        when none is left: a line below it that reads key (``KV="${ROOT}/kv"``) sees it again, as it
        did there. Appending it at the end instead left that reader evaluating without it.

        Only for a key this text does not assign. Checked like `with_word`; when the line cannot go
        there without changing another assignment, it is appended at the end only if no assignment
        reads key (there its place changes nothing), else `EnvFileError`."""
        _check_key(key)
        if self.get(key) is not None:
            raise EnvFileError(0, f"{key} is assigned already: its value is replaced, not its lines")
        want = reference.get(key)
        if want is None:
            raise EnvFileError(0, f"the reference text does not assign {key}")
        copies = [a for a in reference.assignments if a.key == key]
        text = self.text
        for a in copies:
            line = reference.statement_of(a) + "\n"
            first = reference.text.count("\n", 0, a.start)  # a.start is a line start: its 0-based index
            at = _insertion_point(_lines(reference.text), first, _lines(text))
            sep = "\n" if at == len(text) and text and not text.endswith("\n") else ""
            text = text[:at] + sep + line + text[at:]
        if self._edit_keeps_others(text, key, want.meaning):
            return text
        if not any(key in meaning_refs(a.meaning) for a in self.assignments):
            sep = "" if not self.text or self.text.endswith("\n") else "\n"
            for end in (self.text + sep, self.text + sep + "\n"):  # a blank line ends a dangling backslash
                text = end + "".join(reference.statement_of(a) + "\n" for a in copies)
                if self._edit_keeps_others(text, key, want.meaning):
                    return text
        raise EnvFileError(want.lineno, f"cannot put {key} back above the lines that read it without changing "
                                        "other assignments")

    def without(self, key: str) -> str:
        """New text with every assignment of key removed (whole lines, including their newline); all other bytes identical.

        Used to test "what if this variable were not set at all".  A trailing comment on a removed
        line goes with it.  A removed last line that had no newline leaves the previous line's
        newline in place.  The result is re-parsed and checked like `with_value`.
        """
        pieces: list[str] = []
        pos = 0
        for a in self.assignments:
            if a.key != key:
                continue
            cut = self._own_span(a)
            if cut is None:  # the line holds only this key: the whole line goes
                cut = (a.start, a.end + 1 if a.end < len(self.text) else a.end)
            if cut[0] < pos:
                continue  # within the line removed already
            pieces.append(self.text[pos : cut[0]])
            pos = cut[1]
        pieces.append(self.text[pos:])
        new = "".join(pieces)
        if not self._edit_keeps_others(new, key, None):
            raise EnvFileError(0, f"cannot remove {key} without changing other assignments")
        return new

    def _own_span(self, a: EnvAssignment) -> tuple[int, int] | None:
        """Where `a` alone stands on a line it shares with assignments of other keys (``export A=1 B=2``):
        its ``KEY=VALUE`` word and the blanks up to the next one (the last: from the previous value's
        end). None when every assignment of its line is of its key."""
        line = [b for b in self.assignments if b.start == a.start]
        if all(b.key == a.key for b in line):
            return None
        i = line.index(a)
        if i + 1 < len(line):
            return a.value_start - len(a.key) - 1, line[i + 1].value_start - len(line[i + 1].key) - 1
        return line[i - 1].value_end, a.value_end

    def statement_of(self, a: EnvAssignment) -> str:
        """The text that sets `a` on a line of its own: its whole line, or, from a line it shares with
        other keys, ``[export ]KEY=VALUE``."""
        if self._own_span(a) is None:
            return self.text[a.start : a.end]
        return f"{'export ' if a.exported else ''}{a.key}={a.word}"

    def resolved(self, environ: Mapping[str, str] = {}) -> dict[str, str]:
        """values with ${X}/$X expanded in file order the way `sh` sourcing would (earlier assignments, then environ, else empty); single-quoted parts are not expanded. Used to compare with a process's real environment.

        Also handles ``${X:-w}``, ``${X-w}``, ``${X:+w}``, ``${X+w}``, ``${X:=w}``, ``${X=w}``
        when ``w`` is a plain word (``$Y``/``${Y}`` inside it are expanded) and ``~``/``~/``
        prefixes (from HOME).  Anything else that a shell would compute (``$(...)``, backquotes,
        ``${#X}``, ``${X%pat}``, quoted default words, ``$1``) is kept as literal text, so the
        result can differ from the real environment for such values.
        """
        scope: dict[str, str] = {}

        def lookup(name: str) -> str | None:
            if name in scope:
                return scope[name]
            return environ.get(name)

        def assign(name: str, val: str) -> None:
            scope[name] = val

        out: dict[str, str] = {}
        for a in self.assignments:
            pieces = []
            for kind, text in a.parts:
                if kind == "lit":
                    pieces.append(text)
                elif kind == "tilde":
                    home = lookup("HOME")
                    pieces.append("~" if home is None else home)
                elif kind == "cmd":
                    pieces.append(text)  # never run here: kept as written
                else:
                    pieces.append(_expand_ref(text, lookup, assign))
            val = "".join(pieces)
            scope[a.key] = val
            out[a.key] = val
        return out

    def _edit_keeps_others(self, new_text: str, key: str, want: Meaning | None) -> bool:
        # A production edit must not change anything but `key`: re-parse and compare what bash
        # makes of every assignment (`want` None: key must be gone).
        try:
            new = parse_env(new_text)
        except EnvFileError:
            return False
        old_vals = self.meanings()
        new_vals = new.meanings()
        if want is None:
            if key in new_vals:
                return False
        elif new_vals.get(key) != want:
            return False
        old_vals.pop(key, None)
        new_vals.pop(key, None)
        return old_vals == new_vals


def parse_env(text: str) -> EnvFile:
    """Parse serve-env text as the shell would lex it; raise `EnvFileError` on anything ambiguous.

    Non-assignment statements (``set -a``, ``echo``, ``export K``, ``declare -x K=V``...) are
    skipped, but still lexed so that quotes spanning lines cannot hide or fake assignments and an
    unterminated quote anywhere is an error.  Text is taken as-is: a ``\\r`` from CRLF files is
    part of the value, exactly as for ``sh`` (read files with ``newline=""`` to keep bytes).
    """
    lx = _Lexer(text)
    n = len(text)
    out: list[EnvAssignment] = []
    i = 0
    while i < n:
        m = _ASSIGN_RE.match(text, i)
        if m is None:
            i = lx.skip_statement(i) + 1
            continue
        exported, stmt, am = m.group(1) is not None, [], m
        while True:  # ``export A=1 B=2``: each word of the statement that is KEY=VALUE is an assignment
            key = am.group(2)
            if am.group(3) == "+=":
                lx.error(am.start(3), f"'+=' (append) for {key} is not supported")
            vs = am.end()
            ve, parts, refs = lx.lex_value(vs)
            stmt.append((key, vs, ve, parts, refs))
            j = ve
            while j < n and text[j] in " \t":
                j += 1
            am = _NEXT_ASSIGN_RE.match(text, j) if j > ve else None
            if am is None:
                break
        if j < n and text[j] != "\n":
            if text[j] == "#" and j > ve:
                nl = text.find("\n", j)
                j = n if nl < 0 else nl
            else:
                lx.error(j, f"unexpected {text[j]!r} after the value of {key} (only assignments on a "
                            "line, optionally followed by a comment, are supported)")
        out.extend(EnvAssignment(key=key, value="".join(t for _, t in parts), exported=exported, start=i, end=j,
                                 lineno=lx.lineno(i), refs=tuple(dict.fromkeys(refs)), value_start=vs,
                                 value_end=ve, parts=tuple(parts), word=text[vs:ve])
                   for key, vs, ve, parts, refs in stmt)
        i = j + 1
    return EnvFile(text=text, assignments=tuple(out))


_SAFE_RE = re.compile(r"[A-Za-z0-9_./:,+=@%^-]+\Z")


def word_meaning(word: str) -> Meaning:
    """What bash makes of `word` as the value of an assignment (see `Meaning`).

    Raises `EnvFileError` when `word` is not exactly one value word."""
    text = "X=" + word
    try:
        env = parse_env(text)
    except EnvFileError as e:
        raise EnvFileError(0, f"not a shell value word: {word!r} ({e.problem})") from None
    a = env.assignments[0] if len(env.assignments) == 1 else None
    if a is None or a.key != "X" or a.start != 0 or a.value_end != len(text):
        raise EnvFileError(0, f"not a single shell value word: {word!r}")
    return a.meaning


def meaning_refs(meaning: Meaning) -> set[str]:
    """Every variable name a value may read: its parameter expansions, and the ``$NAME`` /
    ``${NAME...}`` found in the text of its command substitutions (over-approximated: that text is
    never run here)."""
    names: set[str] = set()
    for kind, text in meaning:
        if kind in ("ref", "cmd"):
            names.update(_ANY_REF_RE.findall(text))
    return names


def _normalise(parts) -> Meaning:  # noqa: ANN001
    out: list[_Part] = []
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


# ---------------------------------------------------------------------------- internals

_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN_RE = re.compile(r"[ \t]*(?:(export)[ \t]+)?([A-Za-z_][A-Za-z0-9_]*)(\+?=)")
_NEXT_ASSIGN_RE = re.compile(r"()([A-Za-z_][A-Za-z0-9_]*)(\+?=)")  # a further assignment of the same line
_WORD_END = frozenset(" \t\n;&|<>()")
_BRACE_NAME_RE = re.compile(r"[#!]?([A-Za-z_][A-Za-z0-9_]*)")
_BRACE_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-+=])(.*))?\}\Z", re.S)
_SIMPLE_REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_PLAIN_BRACE_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}\Z")
_ANY_REF_RE = re.compile(r"\$\{?[#!]?([A-Za-z_][A-Za-z0-9_]*)")


def _lines(text: str) -> list[str]:
    """The lines of `text`, each with its newline (only ``\\n`` ends a line for the shell)."""
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text)


def _insertion_point(reference: list[str], first: int, lines: list[str]) -> int:
    """Offset in the text of `lines` right after the line matched to the nearest of reference lines
    before `first` that the alignment of the two texts (as diff makes it, over the whole texts, so a
    blank line is matched in its place) matches; 0 (the top) when none of them is matched."""
    import difflib

    after = -1
    # compared without their newline: a last line without one is the same line
    a, b = [x.rstrip("\n") for x in reference], [x.rstrip("\n") for x in lines]
    for i, j, n in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
        if n and i < first:  # blocks come in order of both texts: the last one before `first` wins
            after = j + min(n, first - i) - 1
    return sum(len(x) for x in lines[: after + 1])


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ValueError(f"not a valid variable name: {key!r}")


def _expand_simple(word: str, lookup: Callable[[str], str | None]) -> str | None:
    """Expand $Y/${Y} in a default word; None when it needs more than that (kept literal)."""
    if any(c in word for c in "'\"\\`"):
        return None
    out = _SIMPLE_REF_RE.sub(lambda m: lookup(m.group(1) or m.group(2)) or "", word)
    rest = _SIMPLE_REF_RE.sub("", word)
    if "${" in rest or "$(" in rest:
        return None
    return out


def _expand_ref(raw: str, lookup: Callable[[str], str | None],
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
        alt = _expand_simple(word, lookup)
        return raw if alt is None else alt
    if not use_word:
        return val or ""
    dflt = _expand_simple(word, lookup)
    if dflt is None:
        return raw
    if op.endswith("="):
        assign(name, dflt)
    return dflt


class _Lexer:
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

    def lex_value(self, i: int) -> tuple[int, list[_Part], list[str]]:
        t, n = self.t, self.n
        parts: list[_Part] = []
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
            if c in _WORD_END:
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
            elif c == "~" and tilde_ok and (j + 1 >= n or t[j + 1] in _WORD_END or t[j + 1] in "/:"):
                parts.append(("tilde", "~"))
                j += 1
            else:
                lit(c)
                nxt_tilde = c == ":"
                j += 1
            tilde_ok = nxt_tilde
        return j, parts, refs

    def _lex_dq(self, i: int, lit, parts: list[_Part], refs: list[str]) -> int:
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

    def _lex_dollar(self, i: int, quoted: bool, lit, parts: list[_Part], refs: list[str]) -> int:
        t = self.t
        nxt = t[i + 1] if i + 1 < self.n else ""
        if nxt == "{":
            k = self.skip_group(i)
            raw = t[i:k]
            parts.append(("ref", raw))
            m = _BRACE_NAME_RE.match(raw, 2)
            if m:
                refs.append(m.group(1))
            refs.extend(a or b for a, b in _SIMPLE_REF_RE.findall(raw[2:-1]))
            return k
        if nxt == "(":
            k = self.skip_group(i)
            parts.append(("cmd", t[i:k]))  # command/arithmetic substitution: kept, never run
            return k
        m = _NAME_RE.match(t, i + 1)
        if m:
            parts.append(("ref", "$" + m.group()))
            refs.append(m.group())
            return m.end()
        if not quoted and nxt in ("'", '"'):
            self.error(i, f"${nxt}...{nxt} quoting is not supported")
        lit("$")
        return i + 1
