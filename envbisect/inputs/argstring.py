"""Argument strings (``SGLANG_EXTRA_ARGS="--tp 2 --attention-backend triton"``) as lists of flags.

Pure: no I/O. A value of an argument-string key is split into words the way a POSIX shell splits a
command line (blanks separate; single quotes, double quotes and backslashes quote), grouped into
flags by their shape, compared flag by flag, and rebuilt with only chosen flag changes applied.

The shape rule (no knowledge of the engine's own parser):

* a word starting with ``-`` (not ``-`` alone, not a negative number such as ``-1`` or ``-0.5``)
  starts a flag; ``--k=v`` is the flag ``--k`` with the value ``v``;
* every following word up to the next flag is a value of that flag (``--k v``, and the several
  values of an ``nargs='+'`` flag: ``--cuda-graph-bs 1 2 4``); a flag followed by a flag is a switch;
* words before the first flag are positional: they must be the same on both sides, else the value is
  not split (`ArgStringError`).

A flag given several times (``--lora-paths a --lora-paths b``) is one flag whose occurrences keep
their order; its change is one change of all of them. Two flags are the same when their values are
written the same (``--k=v`` and ``--k v`` are one, as argparse reads both); a value quoted anew
(``--k "v"``) is a change: the same to a consumer that reads the quotes (``eval``, ``shlex``), but a
start script that expands the variable unquoted hands the quote characters on to the engine.

A rebuilt string keeps the baseline's order and each word's exact text (its quotes as written), so
whatever the consumer does with it (word splitting of ``$X``, ``eval``, ``shlex.split``) it sees the
baseline's words for every flag left out; an added flag goes where it stands in the current string,
after the nearest flag before it that the rebuilt string has.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

ARG_KEY_SUFFIXES = ("_ARGS", "_FLAGS")  # *_EXTRA_ARGS is one of *_ARGS

_NUMBER_RE = re.compile(r"-\d+(\.\d*)?([eE][-+]?\d+)?\Z|-\.\d+\Z")


class ArgStringError(ValueError):
    """The value cannot be split into flags safely; `str(err)` says why, in a few words."""


def is_arg_key(key: str | None, extra: tuple[str, ...] | frozenset[str] = ()) -> bool:
    """Does `key` hold an argument string: ``*_ARGS`` / ``*_FLAGS`` (``*_EXTRA_ARGS`` included), or a
    key the playbook names in ``[deltas] args``?"""
    if not key:
        return False
    return key in extra or key.endswith(ARG_KEY_SUFFIXES)


@dataclass(frozen=True)
class Word:
    value: str  # what the consumer gets after quote removal
    text: str  # the exact text in the string, quotes included
    at: int = field(default=-1, compare=False)  # where `text` starts in the string (a rewrite in place)


@dataclass(frozen=True)
class Flag:
    """One flag with its values, and every occurrence's words (a repeated flag has several)."""

    name: str  # "--attention-backend"
    occurrences: tuple[tuple[Word, ...], ...]  # each: the flag word then its value words

    @property
    def values(self) -> tuple[tuple[str, ...], ...]:
        """What the flag means: per occurrence, its values (``--k=v`` and ``--k v`` alike)."""
        return tuple(_occurrence_values(self.name, occ) for occ in self.occurrences)

    @property
    def spelling(self) -> tuple[tuple[str, ...], ...]:
        """Its values as written, quotes included (``--k="v"`` and ``--k "v"`` alike): a start script
        that expands the variable unquoted hands the quote characters on to the engine."""
        return tuple(_occurrence_texts(self.name, occ) for occ in self.occurrences)

    @property
    def text(self) -> str:
        """Its exact text: the words of every occurrence, each as written, one blank between."""
        return " ".join(w.text for occ in self.occurrences for w in occ)

    def shown(self) -> str:
        """The values for people: ``triton``; ``(switch)``; ``a ; b`` for a repeated flag."""
        parts = [" ".join(v) if v else "(switch)" for v in self.values]
        return " ; ".join(parts)


@dataclass(frozen=True)
class ArgString:
    positional: tuple[Word, ...]  # words before the first flag
    flags: tuple[Flag, ...]  # in order of first occurrence

    def get(self, name: str) -> Flag | None:
        return next((f for f in self.flags if f.name == name), None)

    def names(self) -> list[str]:
        return [f.name for f in self.flags]


@dataclass(frozen=True)
class FlagChange:
    name: str
    change: str  # added | removed | changed
    old: Flag | None
    new: Flag | None


def split_words(text: str) -> tuple[Word, ...]:
    """The words of `text` as a POSIX shell splits a command line (no expansion is done).
    `ArgStringError` on an unbalanced quote, a trailing backslash, a command substitution, or a
    character that makes the line more than a list of words (``;``, ``|``, ``&``, ``<``, ``>``...)."""
    words: list[Word] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] in " \t\n":
            i += 1
            continue
        start = i
        value: list[str] = []
        while i < n and text[i] not in " \t\n":
            c = text[i]
            if c == "'":
                end = text.find("'", i + 1)
                if end < 0:
                    raise ArgStringError("an unbalanced single quote")
                value.append(text[i + 1:end])
                i = end + 1
            elif c == '"':
                i += 1
                while True:
                    if i >= n:
                        raise ArgStringError("an unbalanced double quote")
                    c = text[i]
                    if c == '"':
                        i += 1
                        break
                    if c == "\\" and i + 1 < n and text[i + 1] in '"\\$`\n':
                        value.append(text[i + 1])
                        i += 2
                        continue
                    if c == "`" or (c == "$" and text[i + 1:i + 2] == "("):
                        raise ArgStringError("a command substitution")
                    value.append(c)
                    i += 1
            elif c == "\\":
                if i + 1 >= n:
                    raise ArgStringError("a trailing backslash")
                value.append(text[i + 1])
                i += 2
            elif c == "`" or (c == "$" and text[i + 1:i + 2] == "("):
                raise ArgStringError("a command substitution")
            elif c in ";&|<>()":
                raise ArgStringError(f"a shell operator {c!r}")
            else:
                value.append(c)
                i += 1
        words.append(Word("".join(value), text[start:i], start))
    return tuple(words)


def _is_flag(word: Word) -> bool:
    v = word.value
    return v.startswith("-") and v != "-" and v != "--" and not _NUMBER_RE.match(v)


def _flag_name(word: Word) -> str:
    return word.value.split("=", 1)[0]


def _occurrence_values(name: str, occ: tuple[Word, ...]) -> tuple[str, ...]:
    first = occ[0].value
    inline = (first[len(name) + 1:],) if len(first) > len(name) and first[len(name)] == "=" else ()
    return inline + tuple(w.value for w in occ[1:])


def _occurrence_texts(name: str, occ: tuple[Word, ...]) -> tuple[str, ...]:
    first = occ[0]
    inline = ()
    if len(first.value) > len(name) and first.value[len(name)] == "=":
        inline = (first.text.split("=", 1)[1] if "=" in first.text else first.value[len(name) + 1:],)
    return inline + tuple(w.text for w in occ[1:])


def parse_args(text: str) -> ArgString:
    """`text` as positional words and flags (see the module's shape rule); `ArgStringError` when it
    cannot be split into words, or holds ``--`` (after which nothing is a flag)."""
    words = split_words(text)
    if any(w.value == "--" for w in words):
        raise ArgStringError("'--' (the words after it are not flags)")
    positional: list[Word] = []
    occurrences: dict[str, list[tuple[Word, ...]]] = {}
    cur: list[Word] | None = None
    order: list[str] = []

    def close() -> None:
        if cur:
            name = _flag_name(cur[0])
            if name not in occurrences:
                occurrences[name] = []
                order.append(name)
            occurrences[name].append(tuple(cur))

    for w in words:
        if _is_flag(w):
            close()
            cur = [w]
        elif cur is None:
            positional.append(w)
        else:
            cur.append(w)
    close()
    return ArgString(tuple(positional), tuple(Flag(n, tuple(occurrences[n])) for n in order))


def diff_args(old: ArgString, new: ArgString, *, quotes_read: bool = False) -> list[FlagChange]:
    """Each flag added, removed or changed, in the order the current string has them (removed ones
    where the baseline had them). `quotes_read`: the string is a command line the shell itself reads
    (a start script's line), so a value quoted anew means the same; else a variable's value, whose
    quote characters an unquoted expansion passes on. `ArgStringError` when the positional words differ."""
    if tuple(w.value for w in old.positional) != tuple(w.value for w in new.positional):
        raise ArgStringError("its words before the first flag (positional arguments) changed")
    out = []
    names = new.names() + [n for n in old.names() if new.get(n) is None]
    for name in names:
        o, n = old.get(name), new.get(name)
        if o is not None and n is not None and o.values == n.values and (quotes_read or o.spelling == n.spelling):
            continue
        change = "added" if o is None else "removed" if n is None else "changed"
        out.append(FlagChange(name, change, o, n))
    return out


def target_string(old: ArgString, new: ArgString, applied: set[str] | frozenset[str]) -> str:
    """The string with exactly the changes of the flags in `applied` made, written from whichever
    side leaves fewer changes to make: the baseline with those made (`rebuild`), or, when more are
    made than left out (a revert of one flag among several changes), the current string with the
    others undone, so that it keeps the current string's order and words."""
    every = {c.name for c in diff_args(old, new)}
    applied = set(applied) & every
    if len(every - applied) < len(applied):
        return rebuild(new, old, every - applied)
    return rebuild(old, new, applied)


def rebuild(old: ArgString, new: ArgString, applied: set[str] | frozenset[str]) -> str:
    """The baseline string with exactly the changes of the flags named in `applied` made: a changed
    flag takes the current string's words where the baseline had it, a removed one is dropped, an
    added one goes after the nearest flag before it in the current string that the result has (at
    the front of the flags when there is none). Every word keeps its exact text."""
    flags: list[Flag] = []
    for f in old.flags:
        if f.name not in applied:
            flags.append(f)
            continue
        n = new.get(f.name)
        if n is not None:
            flags.append(n)
    new_names = new.names()
    for i, name in enumerate(new_names):
        if name not in applied or old.get(name) is not None:
            continue
        have = [f.name for f in flags]
        before = next((p for p in reversed(new_names[:i]) if p in have), None)
        at = have.index(before) + 1 if before is not None else 0
        flags.insert(at, new.get(name))  # type: ignore[arg-type]
    return " ".join([w.text for w in old.positional] + [f.text for f in flags])
