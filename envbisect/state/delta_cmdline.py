"""A start command line held in a script or a unit file, as one delta per flag.

A watched (or hotfixed) file that starts a service often holds its command line itself:
``exec python -m sglang.launch_server --tp 2 ...`` in a start script, ``ExecStart=...`` in a systemd
unit. When such a file changed in exactly that line, each flag added, removed or changed on it is its
own delta (`DeltaKind.FLAG`, id ``file:HOST:PATH[--flag]``), compared and rebuilt by the rules of
argument strings (inputs/argstring.py). A trial writes the baseline file with exactly the chosen
flag changes made on that line; every other byte is the baseline's.

Which files: a shell script (``.sh``, ``.bash``, or a first line ``#!``) or a systemd unit
(``.service``). Which line: the file's one changed logical line (backslash-newline continuations
joined); in a unit file it must be an ``ExecStart=`` line. Anything else (several lines changed, a
shell operator on the line, its program words changed) leaves the file one whole-file delta, with a
note when the changed line looks like a command line. Pure: no I/O.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from envbisect.inputs.argstring import ArgString, ArgStringError, Word, diff_args, parse_args
from envbisect.state.delta import Delta, DeltaKind

_SCRIPT_EXT = (".sh", ".bash")
_UNIT_EXT = (".service",)
_EXEC_START = re.compile(r"[ \t]*ExecStart=[-@:+!]*")
_LEAD = re.compile(r"[ \t]*")
_CONTINUATION = re.compile(r"\\\n([ \t]*)")


@dataclass(frozen=True)
class CommandLine:
    """The command line of one side of a file: where it is and its words."""

    index: int  # which logical line of the file
    start: int  # its span in the file's text (end: before its newline)
    end: int
    lead: str  # the text before its words: indentation, ``ExecStart=`` and its prefixes
    args: str  # its words, each continuation as two blanks (what a shell and systemd make of it; the
    # same length, so a word's place in `args` is its place in the line after `lead`)
    sep: str  # what goes before an added flag: a blank, or a continuation and the indentation


def is_command_file(path: str, data: bytes | None) -> bool:
    """A shell script or a systemd unit, by its name or its ``#!`` line."""
    return path.endswith(_SCRIPT_EXT + _UNIT_EXT) or (data is not None and data.startswith(b"#!"))


def logical_lines(text: str) -> list[tuple[int, int]]:
    """The spans of the logical lines of `text` (a backslash-newline continues a line)."""
    out = []
    start = i = 0
    while i <= len(text):
        nl = text.find("\n", i)
        if nl < 0:
            if start < len(text):
                out.append((start, len(text)))
            break
        if nl > start and text[nl - 1] == "\\" and not _escaped_backslash(text, nl - 1):
            i = nl + 1
            continue
        out.append((start, nl))
        start = i = nl + 1
    return out


def _escaped_backslash(text: str, at: int) -> bool:
    n = 0
    while at - n - 1 >= 0 and text[at - n - 1] == "\\":
        n += 1
    return n % 2 == 1


def command_line(path: str, text: str, index: int, span: tuple[int, int]) -> CommandLine | None:
    """The logical line at `span` as a command line (None: not one, e.g. a unit file's other lines)."""
    line = text[span[0]:span[1]]
    m = _EXEC_START.match(line) if path.endswith(_UNIT_EXT) else _LEAD.match(line)
    if m is None or line.lstrip().startswith("#"):
        return None
    cont = _CONTINUATION.search(line)
    sep = f" \\\n{cont.group(1)}" if cont else " "
    rest = line[m.end():]
    return CommandLine(index, span[0], span[1], m.group(0), rest.replace("\\\n", "  "), sep)


@dataclass(frozen=True)
class CommandSides:
    """A file's one changed command line on each side, parsed into flags."""

    old: CommandLine
    new: CommandLine
    old_args: ArgString
    new_args: ArgString


def changed_command(path: str, old: bytes, new: bytes) -> CommandSides | str | None:
    """The file's one changed command line on both sides; a reason (str) when the change looks like
    one of a command line but cannot be split per flag; None when it is not a command line's change."""
    try:
        old_text, new_text = old.decode("utf-8"), new.decode("utf-8")
    except UnicodeDecodeError:
        return None
    old_lines, new_lines = logical_lines(old_text), logical_lines(new_text)
    differ = [i for i in range(max(len(old_lines), len(new_lines)))
              if i >= len(old_lines) or i >= len(new_lines)
              or old_text[slice(*old_lines[i])] != new_text[slice(*new_lines[i])]]
    flagged = any(" -" in t[slice(*spans[i])] for t, spans in ((old_text, old_lines), (new_text, new_lines))
                  for i in differ if i < len(spans))
    if len(old_lines) != len(new_lines) or len(differ) != 1:
        return f"{len(differ)} lines changed, not only its command line" if flagged else None
    i = differ[0]
    o, n = command_line(path, old_text, i, old_lines[i]), command_line(path, new_text, i, new_lines[i])
    if o is None or n is None or o.lead != n.lead:
        return None
    try:
        old_args, new_args = parse_args(o.args), parse_args(n.args)
        if not old_args.flags and not new_args.flags:
            return None
        diff_args(old_args, new_args, quotes_read=True)
    except ArgStringError as e:
        return f"its command line (line {_line_number(old_text, o.start)}) is not a list of flags ({e})"
    for text, spans, args in ((old_text, old_lines, old_args), (new_text, new_lines, new_args)):
        twin = next(iter(_program_lines(path, text, spans, _program(args)) - {i}), None)
        if twin is not None:  # a flag's state read back from the file could come from the other line
            return (f"its command line (line {_line_number(old_text, o.start)}) runs the same program words as line "
                    f"{_line_number(text, spans[twin][0])}, so a flag's state in the file is ambiguous")
    return CommandSides(o, n, old_args, new_args)


def _program(args: ArgString) -> tuple[str, ...]:
    return tuple(w.value for w in args.positional)


def _program_lines(path: str, text: str, spans: list[tuple[int, int]], program: tuple[str, ...]) -> set[int]:
    """The logical lines of `text` that are command lines running `program` (their words before the flags)."""
    out = set()
    for i, span in enumerate(spans):
        line = command_line(path, text, i, span)
        try:
            have = parse_args(line.args) if line is not None else None
        except ArgStringError:
            continue
        if have is not None and _program(have) == program:
            out.add(i)
    return out


def _line_number(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1


def per_flag(file_deltas: Iterable[Delta], contents: Mapping[str, bytes], notes: list[str]) -> list[Delta]:
    """A changed start script or unit file whose change is its command line, as one delta per flag;
    else as it is (a note says why when the change looked like a command line's). Others pass through."""
    out: list[Delta] = []
    for d in file_deltas:
        old, new = contents.get(d.old or ""), contents.get(d.new or "")
        if d.kind != DeltaKind.FILE or d.change != "changed" or old is None or new is None \
                or not is_command_file(d.path, old):
            out.append(d)
            continue
        sides = changed_command(d.path, old, new)
        if not isinstance(sides, CommandSides):
            if sides is not None:
                notes.append(f"{d.host}:{d.path}: compared as a whole file, not per flag: {sides}")
            out.append(d)
            continue
        out.extend(Delta(f"{d.id}[{c.name}]", DeltaKind.FLAG, d.host, d.service, d.path, None, c.change,
                         c.old.text if c.old else None, c.new.text if c.new else None, d.baseline_source,
                         d.detail, old_file=d.old, new_file=d.new, flag=c.name, args_old=sides.old.args,
                         args_new=sides.new.args)
                   for c in diff_args(sides.old_args, sides.new_args, quotes_read=True))
    return out


def render_line(path: str, old: bytes, new: bytes, on: set[str]) -> bytes:
    """The baseline file with exactly the flag changes named in `on` made on its command line."""
    sides = changed_command(path, old, new)
    if not isinstance(sides, CommandSides):
        raise ValueError(f"{path}: its command line cannot be split per flag any more")
    every = {c.name for c in diff_args(sides.old_args, sides.new_args, quotes_read=True)}
    if not on & every:
        return old
    if every <= on:
        return new
    text = old.decode("utf-8")
    o = sides.old
    line = o.lead + splice(text[o.start + len(o.lead):o.end], sides.old_args, sides.new_args, on & every, o.sep)
    return (text[:o.start] + line + text[o.end:]).encode("utf-8")


def _span(occ: tuple[Word, ...]) -> tuple[int, int]:
    return occ[0].at, occ[-1].at + len(occ[-1].text)


def splice(line: str, old: ArgString, new: ArgString, on: set[str], sep: str) -> str:
    """The baseline line with the flag changes named in `on` made in place: a changed flag's first
    occurrence takes the current text, a removed flag's occurrences go with the blanks (and any
    continuation) before them, an added flag goes after the nearest flag before it in the current
    line that the result has (`argstring.rebuild`'s order rule). Every other byte is kept."""
    edits: list[tuple[int, int, str]] = []  # (start, end, text) on `line`, spans not overlapping
    for f in old.flags:
        if f.name not in on:
            continue
        n = new.get(f.name)
        for i, occ in enumerate(f.occurrences):
            s, e = _span(occ)
            if n is not None and i == 0:
                edits.append((s, e, n.text))
            else:
                edits.append((len(line[:s].rstrip(" \t\n\\")), e, ""))
    kept = [f.name for f in old.flags if f.name not in on or new.get(f.name) is not None]
    names = new.names()
    for i, name in enumerate(names):
        if name not in on or old.get(name) is not None:
            continue
        before = next((p for p in reversed(names[:i]) if p in kept), None)
        if before is not None:
            at = _span(old.get(before).occurrences[-1])[1]  # type: ignore[union-attr]
        else:
            at = _span((old.positional[-1],))[1] if old.positional else 0
        edits.append((at, at, sep + new.get(name).text))  # type: ignore[union-attr]
        kept.insert(kept.index(before) + 1 if before is not None else 0, name)
    out = line
    for s, e, t in sorted(edits, key=lambda x: (x[0], x[1]), reverse=True):
        out = out[:s] + t + out[e:]
    return out


def flags_on(path: str, old: bytes, new: bytes, live: bytes | None) -> set[str] | None:
    """The flags the `live` file's command line has in their current state (None: not a rendering)."""
    sides = changed_command(path, old, new)
    if live is None or not isinstance(sides, CommandSides):
        return None
    try:
        text = live.decode("utf-8")
    except UnicodeDecodeError:
        return None
    spans = logical_lines(text)
    if sides.old.index >= len(spans):
        return None
    line = command_line(path, text, sides.old.index, spans[sides.old.index])
    try:
        have = parse_args(line.args) if line is not None else None
    except ArgStringError:
        return None
    if have is None:
        return None
    on = set()
    for c in diff_args(sides.old_args, sides.new_args, quotes_read=True):
        now = have.get(c.name)
        if (now.values if now else None) == (c.new.values if c.new else None):
            on.add(c.name)
    return on


def flag_file(key: tuple[str, str], file_deltas: Sequence[Delta], applied: Iterable[str],
              contents: Mapping[str, bytes], live: bytes | None) -> bytes:
    """A start script or unit file with exactly its `applied` flag deltas in their new state. A flag
    of the line whose delta is not among `file_deltas` (left out of the run) keeps its current state.
    The `live` file (the journaled original) must be one of these renderings, byte for byte: a file
    edited since the diff in anything else is refused, never overwritten. ValueError says why."""
    d0 = file_deltas[0]
    old, new = contents.get(d0.old_file or ""), contents.get(d0.new_file or "")
    if old is None or new is None:
        raise ValueError(f"{d0.id}: the file's contents are not in the store")
    sides = changed_command(key[1], old, new)
    if not isinstance(sides, CommandSides):
        raise ValueError(f"{key[0]}:{key[1]}: its command line cannot be split per flag")
    every = {c.name for c in diff_args(sides.old_args, sides.new_args, quotes_read=True)}
    keep = every - {d.flag or "" for d in file_deltas}
    if live is not None:
        now = flags_on(key[1], old, new, live)
        if now is None or render_line(key[1], old, new, now) != live:
            raise ValueError(f"{key[0]}:{key[1]} changed since the diff in more than its flag deltas: "
                             "run diff/bisect again")
    chosen = {d.flag or "" for d in file_deltas if d.id in set(applied)}
    return render_line(key[1], old, new, keep | chosen)


def flag_holds(data: bytes | None, d: Delta) -> bool | None:
    """Is the flag delta `d` in its new state in the file `data` (True), its old (False), or neither
    (None: no command line of the file has the delta's program words, or several have)? By the flag's
    values, as the delta was found, whatever the line's other flags are."""
    try:
        text = (data or b"").decode("utf-8")
        want_old, want_new = parse_args(d.args_old or ""), parse_args(d.args_new or "")
    except (UnicodeDecodeError, ArgStringError):
        return None
    program = _program(want_old)
    old, new = (f.values if f else None for f in (want_old.get(d.flag or ""), want_new.get(d.flag or "")))
    spans = logical_lines(text)
    lines = _program_lines(d.path, text, spans, program)
    if len(lines) != 1:  # none, or several: which one the delta came from is not known here
        return None
    (i,) = lines
    line = command_line(d.path, text, i, spans[i])
    now = parse_args(line.args).get(d.flag or "") if line is not None else None
    value = now.values if now else None
    return True if value == new else False if value == old else None
