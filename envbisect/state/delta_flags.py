"""Finer splits of env deltas: an argument-string variable as one delta per flag (`split_flags`),
and each env delta or flag tied to the knob the installed engine reads (`with_knobs`). Pure: no I/O.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from envbisect.inputs.argstring import ArgStringError, diff_args, is_arg_key, parse_args, split_words
from envbisect.inputs.envfile import EnvFileError, meaning_refs, word_meaning
from envbisect.state.delta import Delta, Diff, knob_value
from envbisect.state.rename_proof import why_not_same

if TYPE_CHECKING:
    from envbisect.state.knobs import KnobRegistry


def split_flags(diff: Diff, arg_keys: Iterable[str] = ()) -> Diff:
    """The diff with each changed argument string (`argstring.is_arg_key`: ``*_ARGS``, ``*_FLAGS``,
    or a key in `arg_keys`) replaced by one delta per flag added, removed or changed, with the id
    ``SERVICE:KEY[--flag]``. What cannot be split stays one whole-value delta, with a note why."""
    extra = frozenset(arg_keys)
    out: list[Delta] = []
    notes: list[str] = []
    by_file: dict[tuple[str, str], set[str]] = {}
    for d in diff.deltas:
        if d.kind == "env" and d.key:
            by_file.setdefault((d.host, d.path), set()).add(d.key)
    for d in diff.deltas:
        if d.kind != "env" or d.change != "changed" or d.flag is not None or not is_arg_key(d.key, extra):
            out.append(d)
            continue
        flags, why = _flag_deltas(d, by_file.get((d.host, d.path), set()) - {d.key})
        if why:
            notes.append(f"{d.id}: compared as one value: {why}")
            out.append(d)
        else:
            out.extend(flags)
    return replace(diff, deltas=tuple(out), notes=diff.notes + tuple(notes))


def _flag_deltas(d: Delta, other_keys: set[str]) -> tuple[list[Delta], str | None]:
    """`d`'s flag deltas, or why it stays whole."""
    texts = []
    for value, word, ev in ((d.old, d.old_word, d.old_eval), (d.new, d.new_word, d.new_eval)):
        try:
            meaning = word_meaning(word) if word is not None else (("lit", value or ""),)
        except EnvFileError:
            return [], "its shell text cannot be read"
        if all(kind == "lit" for kind, _ in meaning):
            texts.append("".join(t for _, t in meaning))
            continue
        if any(kind == "cmd" for kind, _ in meaning):
            return [], "its value runs a command substitution"
        read = sorted(meaning_refs(meaning) & other_keys)
        if read:
            return [], f"its value reads {', '.join(read)}, which changed too"
        if ev is None:
            return [], "what bash makes of its value was not recorded"
        texts.append(ev)
    old_text, new_text = texts
    try:
        changes = diff_args(parse_args(old_text), parse_args(new_text))
    except ArgStringError as e:
        return [], f"not a list of flags ({e})"
    if not changes:
        return [], "only the order or spelling of its flags changed"
    return [replace(d, id=f"{d.id}[{c.name}]", change=c.change, old=c.old.text if c.old else None,
                    new=c.new.text if c.new else None, flag=c.name, args_old=old_text, args_new=new_text)
            for c in changes], None


def engine_names(diff: Diff) -> dict[str, list[str]]:
    """Per host, the names of its env deltas and flags an engine's registry may know (``SGL*_`` variables,
    flags of argument strings and of start command lines): only those hosts need their registry read."""
    out: dict[str, list[str]] = {}
    for d in diff.deltas:
        if (d.kind == "env" and d.key and (d.flag is not None or d.key.startswith(("SGLANG_", "SGL_")))) \
                or (d.kind == "flag" and d.flag is not None):
            out.setdefault(d.host, []).append(d.flag or d.key or "")
    return out


def _engine_line(d: Delta) -> bool:
    """Is a start command line's flag on the engine's own command line (its program words name sglang,
    not its router), so that a flag the engine does not read is worth a mark?"""
    try:
        words = [w.value for w in split_words(d.args_new or d.args_old or "")]
    except ArgStringError:
        return False
    program = words[:next((i for i, w in enumerate(words) if w.startswith("--")), len(words))]  # -m MODULE too
    return any("sglang" in w for w in program) and not any("router" in w for w in program)


def with_knobs(diff: Diff, registries: Mapping[str, "KnobRegistry | None"], notes: Iterable[str] = (),
               arg_keys: Iterable[str] = (), releases: Mapping[str, "KnobRegistry | None"] | None = None) -> Diff:
    """The diff with each env delta and flag (of an argument string or a start command line, whose "not
    read" mark needs the line to be the engine's own) tied to the knob the host's installed engine reads
    (`registries`: host -> its registry, None where it could not be read): linked by that knob
    whatever its spelling, "back to the default D" when removed, and "not read by the installed
    sglang V" when the engine does not know a name of its own namespace. A rename is judged with the
    registry of the release each side runs (`releases`: version -> registry; rename_proof.py)."""
    out = []
    extra = frozenset(arg_keys)
    for d in diff.deltas:
        reg = registries.get(d.host) if (d.kind == "env" and d.key) or d.kind == "flag" else None
        if reg is None:
            out.append(d)
            continue
        name = d.flag if d.flag is not None else d.key or ""
        k = reg.flag(name) if d.flag is not None else reg.knob(name)
        if k is None:
            # an argument string is read by the start script, not by the engine's registry
            if reg.owns(name) and ((d.kind == "flag" and _engine_line(d)) or (d.kind == "env" and (
                    d.flag is not None or not is_arg_key(d.key, extra)))):
                out.append(replace(d, detail=d.detail + (
                    f"{name} is not read by the installed {reg.engine} {reg.version}: typo or stale?",)))
            else:
                out.append(d)
            continue
        detail = d.detail
        default = reg.default(k)
        if d.change == "removed":
            detail += (f"removed: back to the default {default}" if default is not None
                       else "removed: back to no value (the engine documents no default)",)
        out.append(replace(d, knob=k.name, detail=detail))
    known = releases or {}
    kept, renames = same_knob_renames(out, lambda d, a: why_not_same(diff, d, a, registries[d.host], known))
    return replace(diff, deltas=kept, notes=diff.notes + tuple(notes) + renames)


def _old_side(d: Delta) -> Delta:
    """The delta as if its old side were new: to read the old value as the engine reads it."""
    return replace(d, new=d.old, new_word=d.old_word, new_eval=d.old_eval, args_new=d.args_old)


def _shown(d: Delta) -> str:
    """The new value for people: a flag's values (``(switch)`` for none), a variable's value."""
    if d.flag is not None:
        try:
            f = parse_args(d.args_new or "").get(d.flag)
        except ArgStringError:
            f = None
        if f is not None:
            return f.shown()
    return d.new if d.new is not None else ""


def same_knob_renames(deltas: Iterable[Delta], why_not: Callable[[Delta, Delta], str | None] = lambda d, a: None,
                      ) -> tuple[tuple[Delta, ...], tuple[str, ...]]:
    """A spelling removed and another spelling of the same knob added in the same place (an env file,
    an argument string, a start command line) with the same value as the engine reads it: a rename
    with no change in meaning (``SGLANG_OLD=32`` at noon, ``SGLANG_NEW=32`` now; ``--tp-size 2`` then
    ``--tensor-parallel-size 2``), which no trial can tell apart: both deltas leave the diff, and a
    note says so. Unless `why_not` (removed, added) says why the pair may still change what the engine
    runs with: then both stay deltas, tied to the knob, and the note says why."""
    deltas = tuple(deltas)
    place = lambda d: (d.kind, d.host, d.service, d.path, d.key if d.flag is not None else None)  # noqa: E731
    added = {(place(d), d.knob): d for d in deltas if d.knob is not None and d.change == "added"}
    gone: set[str] = set()
    notes = []
    for d in deltas:
        a = added.get((place(d), d.knob)) if d.knob is not None and d.change == "removed" else None
        if a is None or a.id in gone or d.id in gone:
            continue
        value = knob_value(_old_side(d))
        if value is None or value != knob_value(a):
            continue
        old, new = d.flag or d.key, a.flag or a.key
        where = f"{d.service}" if d.service else d.host
        said = f"{where}: {old} became {new} in {d.path}, the same knob ({d.knob}) with the same value {_shown(a)}"
        why = why_not(d, a)
        if why is not None:
            notes.append(f"{said}, but {why}: tested as a change ({d.id} + {a.id})")
            continue
        gone |= {d.id, a.id}
        notes.append(f"{said}: no change in meaning, not tested ({d.id} + {a.id})")
    return tuple(d for d in deltas if d.id not in gone), tuple(notes)
