"""What envbisect could not see of the files the env files source.

The collector (hosts/agent/collect.py) follows each env file's ``. FILE`` / ``source FILE`` lines
and snapshots the files they name like `[watch]` files, so a change in one is an ordinary file
delta. Where it could not (a variable of the start script, ``$(...)``, a file that is not there, a
source line of a sourced file), the part of the configuration bash reads there is invisible: no
delta can show a change in it, and a baseline trial keeps it as it is now. A `not-config` verdict
("the baseline fails too") then does not mean the configuration is innocent. These notes say so,
in the diff and in the verdict.

Pure: snapshots in, note strings out.
"""
from __future__ import annotations

import re
from typing import Iterable

from envbisect.state.snapshot import HostState, Snapshot, SourcedFile

# Every note about an invisible part carries this phrase: `verdict_notes` picks them out of a
# diff's notes (also from a run record, where only the note strings are kept).
CANNOT_SEE = "which envbisect cannot see"
ADD_IT = "add it to [watch] paths"
NOT_LOOKED = "did not look at it"
LINES_CHANGED = "source lines"
GUESSED = "bash reads it relative to the start script's working directory"


def keep_sourced(baseline: Snapshot | None) -> dict[str, dict[str, list[str]]]:
    """host -> env file -> the files the baseline snapshotted for its source lines: the current
    snapshot keeps snapshotting them (collect.py `keep_sourced`) even when the line is gone, so the
    diff compares their real state instead of reading "no longer sourced" as "removed"."""
    out: dict[str, dict[str, list[str]]] = {}
    for hname, h in (baseline.hosts.items() if baseline else ()):
        for env, entries in h.sourced.items():
            paths = sorted({e.path for e in entries if e.path and e.via is None})
            if paths:
                out.setdefault(hname, {})[env] = paths
    return out


def sourced_notes(current: Snapshot, baseline: Snapshot | None) -> list[str]:
    """The diff's notes about sourced files: each one envbisect cannot see, each relative path it
    had to guess, each one the baseline snapshot did not look at, and source lines that changed."""
    notes: list[str] = []
    for hname, cur in current.hosts.items():
        base = baseline.hosts.get(hname) if baseline is not None else None
        for env, entries in sorted(cur.sourced.items()):
            where = f"{hname}:{env}"
            for e in entries:
                note = _entry_note(where, e, cur)
                if note:
                    notes.append(note)
            if base is not None and baseline is not None:
                notes.extend(_against_baseline(where, env, entries, cur, base, baseline.id))
    return notes


def _at(e: SourcedFile) -> str:
    return f"line {e.line}" if e.line is not None else "no longer sourced"


def _entry_note(where: str, e: SourcedFile, host: HostState) -> str | None:
    if e.via is not None:
        return (f"{where} sources {e.via}, which sources {e.word} ({e.via} line {e.line}; envbisect follows "
                f"only the env file's own source lines), {CANNOT_SEE}: {ADD_IT}")
    if e.line is None:
        return None
    if e.path is None:
        return f"{where} sources {e.word} ({_at(e)}: {e.why}), {CANNOT_SEE}: {ADD_IT}"
    f = host.files.get(e.path)
    if f is not None and f.exists is False:
        guess = (f"; a relative path, looked for in the env file's folder, while {GUESSED}" if e.relative else "")
        return f"{where} sources {e.word} ({_at(e)}: {e.path} does not exist{guess}), {CANNOT_SEE}: {ADD_IT}"
    if f is not None and (f.exists is None or f.error):
        return (f"{where} sources {e.word} ({_at(e)}: {e.path}: {f.error or 'cannot be read'}), {CANNOT_SEE}: "
                f"{ADD_IT}")
    if e.relative:
        return (f"{where} sources {e.word} by a relative path ({_at(e)}): envbisect watches {e.path} (the env "
                f"file's folder), but {GUESSED}, which it does not know; if that is elsewhere, the file bash "
                f"reads is one {CANNOT_SEE}: {ADD_IT}")
    return None


def _against_baseline(where: str, env: str, entries: Iterable[SourcedFile], cur: HostState, base: HostState,
                      base_id: str) -> list[str]:
    out = []
    base_entries = base.sourced.get(env)
    for e in entries:
        if e.path and e.via is None and e.line is not None and e.path not in base.files \
                and cur.files.get(e.path) is not None and cur.files[e.path].exists:
            out.append(f"{where} sources {e.path}, but the baseline snapshot {base_id} {NOT_LOOKED} (taken before "
                       "this line was added, or before envbisect followed source lines): a change in it is not in "
                       "the diff")
    if base_entries is None:
        return out
    now = _words(entries)
    then = _words(base_entries)
    if now != then:
        added = [w for w in now if w not in then]
        removed = [w for w in then if w not in now]
        what = "; ".join(p for p in (f"added {', '.join(added)}" if added else "",
                                     f"removed {', '.join(removed)}" if removed else "") if p) or "reordered"
        out.append(f"{where}: its {LINES_CHANGED} changed since the baseline ({what}): no per-variable delta "
                   "expresses that, so the env file is compared as a whole file")
    return out


# A `.`/`source` statement at the start of a line: the text-level fallback of source_lines_changed
_SOURCE_STATEMENT_RE = re.compile(rb"^[ \t]*(?:\.|source)[ \t]+(\S.*?)[ \t]*$", re.M)


def source_lines_changed(env: str, cur: HostState, base: HostState | None, old: bytes | None,
                         new: bytes | None) -> tuple[bool, bool]:
    """(changed, noted): did the `.`/`source` lines of env file `env` change since the baseline?
    By what the collector recorded on both sides (it finds them as bash would, `[ -r f ] && . f`
    included), and then `sourced_notes` says so; for a baseline snapshot taken before envbisect
    followed source lines, by the statements that start a line of the file's text (not noted)."""
    then = base.sourced.get(env) if base is not None else None
    now = cur.sourced.get(env)
    if then is not None and now is not None:
        return _words(now) != _words(then), True
    if old is None or new is None:
        return False, False
    return _SOURCE_STATEMENT_RE.findall(old) != _SOURCE_STATEMENT_RE.findall(new), False


def _words(entries: Iterable[SourcedFile]) -> list[str]:
    """The source lines' words in order, once per line (collect.py adds a second entry, with the
    same line and word, for a symlink's target)."""
    out: list[str] = []
    seen: set[tuple[int | None, str]] = set()
    for e in entries:
        if e.via is None and e.line is not None and (e.line, e.word) not in seen:
            seen.add((e.line, e.word))
            out.append(e.word)
    return out


def verdict_notes(diff_notes: Iterable[str]) -> list[str]:
    """For a `not-config` verdict: the diff's notes about parts of the configuration envbisect did
    not see, each saying that "the baseline fails too" does not clear them."""
    return [f"not-config holds only for what envbisect saw: {n}" for n in diff_notes
            if CANNOT_SEE in n or NOT_LOOKED in n or LINES_CHANGED in n]


__all__ = ["keep_sourced", "source_lines_changed", "sourced_notes", "verdict_notes", "CANNOT_SEE"]
