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

The shell lexing is `shell_lexer.py`'s and the meaning of a value word `shell_meaning.py`'s; this
module holds the file model, parsing into it and the edits. Their public names are re-exported here.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Mapping

from envbisect.inputs.shell_lexer import ASSIGN_RE, EnvFileError, Part, ShellLexer
from envbisect.inputs.shell_meaning import Meaning, expand_ref, meaning_refs, normalise, shell_quote

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
    parts: tuple[Part, ...] = field(default=(), repr=False, compare=False)
    word: str = field(default="", repr=False, compare=False)

    @property
    def meaning(self) -> Meaning:
        """What bash makes of the value (see `Meaning`): equal meanings, equal assignments."""
        return normalise(self.parts)


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
        """New file text with key set to value.

        If the key exists, only the span of its last assignment is rewritten (an `export ` prefix
        and a trailing comment on that line are kept), every other byte identical. Earlier
        duplicate assignments are left untouched (the last one wins anyway). If absent,
        `export KEY=<quoted>` is appended as a new line at the end (after a newline when the file
        does not end with one).

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
        return self._set_word(key, quoted, normalise((("lit", value),)))

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
        did there. Appended at the end, that reader would evaluate without it.

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
        raise EnvFileError(want.lineno, f"cannot put {key} back above the lines that read it without "
                                        "changing other assignments")

    def without(self, key: str) -> str:
        """New text with every assignment of key removed (whole lines, including their newline);
        all other bytes identical.

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
        """`values` with ${X}/$X expanded in file order the way `sh` sourcing would (earlier
        assignments, then environ, else empty); single-quoted parts are not expanded. Used to
        compare with a process's real environment.

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
                    pieces.append(expand_ref(text, lookup, assign))
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
    lx = ShellLexer(text)
    n = len(text)
    out: list[EnvAssignment] = []
    i = 0
    while i < n:
        m = ASSIGN_RE.match(text, i)
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


# ---------------------------------------------------------------------------- internals

_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NEXT_ASSIGN_RE = re.compile(r"()([A-Za-z_][A-Za-z0-9_]*)(\+?=)")  # a further assignment of the same line


def _lines(text: str) -> list[str]:
    """The lines of `text`, each with its newline (only ``\\n`` ends a line for the shell)."""
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text)


def _insertion_point(reference: list[str], first: int, lines: list[str]) -> int:
    """Offset in the text of `lines` right after the line matched to the nearest of reference lines
    before `first` that the alignment of the two texts (as diff makes it, over the whole texts, so a
    blank line is matched in its place) matches; 0 (the top) when none of them is matched."""
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
