"""Trial configurations: the baseline plus a chosen subset of the deltas, as concrete host state.

Pure: from the original (journaled) state of each touched resource and the set of applied deltas,
compute the bytes each file must hold and the commit each repo must be at. Env deltas are made by
rewriting only the affected line of the *current* file (`EnvFile.with_word` / `without`), so a
trial differs from what the operator wrote by exactly the reverted variables, and each line is
written back as the exact shell text it had (`Delta.old_word` / `new_word`), never re-quoted. A
line the file no longer has goes back as its exact bytes where it stood on that side
(`EnvFile.with_lines_of`), above the lines that read it; and a file with every delta on one side
is that side's file, byte for byte, when the diff kept it (`EnvSides`).

Every env file a trial edits also gets an `EnvCheck`: what bash must make of it for each key of its
deltas (and, when the file is exactly one side's file, for each line that reads one of them),
checked on the host right after the write and before any restart (`HostEditor.apply`, op
``env_check`` in remote/hostops.py), so that a baseline trial that is not the baseline is an error,
not a silent wrong trial.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

from envbisect.state.delta_cmdline import flag_file
from envbisect.state.deltas import Delta, is_repo_file
from envbisect.inputs.argstring import ArgStringError, diff_args, parse_args, target_string
from envbisect.inputs.envfile import EnvFile, EnvFileError, meaning_refs, parse_env, shell_quote, word_meaning
from envbisect.errors import UsageError

Key = tuple[str, str]  # (host, path)


@dataclass(frozen=True)
class FileOriginal:
    exists: bool
    content: bytes | None = None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    mtime_ns: int | None = None
    atime_ns: int | None = None


@dataclass(frozen=True)
class RepoOriginal:
    head: str
    ref: str | None  # "refs/heads/main", or None when detached


@dataclass(frozen=True)
class OriginalState:
    files: Mapping[Key, FileOriginal]
    repos: Mapping[Key, RepoOriginal]


@dataclass(frozen=True)
class RepoTarget:
    commit: str
    ref: str | None


@dataclass(frozen=True)
class Expect:
    """What bash must make of one key of an edited env file: `value` (None: unset), recorded by a
    snapshot; or, when no snapshot recorded it, whatever bash makes of the reference text `ref`
    ("old": the file with all its deltas in their old state, "new": all in their new state)."""

    key: str
    side: str  # old | new: the state of this key's delta in the trial
    value: str | None = None
    ref: str | None = None
    source: str = ""  # where the expectation comes from, for the error message


@dataclass(frozen=True)
class EnvCheck:
    """The post-apply check of one env file (see `env_checks`)."""

    env: Mapping[str, str] | None  # the environment the file is sourced in; None: a minimal one
    expect: tuple[Expect, ...]
    refs: Mapping[str, bytes] = field(default_factory=dict)  # "old"/"new" -> reference text
    skipped: Mapping[str, str] = field(default_factory=dict)  # key -> why it is not checked


@dataclass(frozen=True)
class EnvSides:
    """One env file as a whole on each side of its deltas, when the diff kept it (`Delta.old_file`,
    `new_file` and their evaluations): its text, and what bash made of all of it on the host. None:
    unknown (a baseline read from a process environment, a run recorded before they were kept)."""

    old_text: str | None = None
    new_text: str | None = None
    old_eval: Mapping[str, str] | None = None
    new_eval: Mapping[str, str] | None = None

    def text(self, side: str) -> str | None:
        return self.old_text if side == "old" else self.new_text

    def evaluated(self, side: str) -> Mapping[str, str] | None:
        return self.old_eval if side == "old" else self.new_eval


def env_sides(file_deltas: Sequence[Delta], contents: Mapping[str, bytes]) -> EnvSides:
    """The `EnvSides` of the file these deltas (all of one file) belong to."""
    # every delta of a file names the same file (a run recorded before they were kept: none does)
    def first(attr: str):  # noqa: ANN202
        return next((getattr(d, attr) for d in file_deltas if getattr(d, attr) is not None), None)

    def text(sha: str | None) -> str | None:
        data = contents.get(sha) if sha else None
        return None if data is None else data.decode("utf-8", "surrogateescape")

    return EnvSides(text(first("old_file")), text(first("new_file")), first("old_file_eval"), first("new_file_eval"))


@dataclass(frozen=True)
class TargetState:
    files: Mapping[Key, bytes | None]  # None: the file must not exist
    repos: Mapping[Key, RepoTarget]
    checks: Mapping[Key, EnvCheck] = field(default_factory=dict)  # env files: checked after the write


def touched(deltas: Iterable[Delta]) -> tuple[set[Key], set[Key]]:
    """Files and repos a run over these deltas may change (what the journal must record)."""
    files, repos = set(), set()
    for d in deltas:
        (repos if d.kind == "git" else files).add((d.host, d.path))
    return files, repos


def check_applicable(deltas: Sequence[Delta]) -> None:
    bad = [d for d in deltas if not d.applicable or (d.kind == "env" and not d.key)]
    if bad:
        raise UsageError(f"cannot re-create the baseline of {bad[0].id}: its old content is unknown "
                         f"({'; '.join(bad[0].detail) or bad[0].baseline_source}); "
                         f"exclude it with --exclude {bad[0].id}")
    for g in (d for d in deltas if d.kind == "git"):
        inside = [d for d in deltas if is_repo_file(d) and d.host == g.host
                  and d.path.startswith(g.path.rstrip("/") + "/")]
        if inside:
            # a checkout never runs over uncommitted changes (hosts/agent/hostops.py), and the trials
            # would need one over the hotfix, or leave HEAD moved at the end
            raise UsageError(f"{g.id}: its HEAD moved and {inside[0].path} has uncommitted changes too; envbisect "
                             "does not check out over uncommitted changes: commit or stash them and take the diff "
                             f"again, or bisect the rest with --exclude {g.id}")


def target_state(original: OriginalState, deltas: Sequence[Delta], applied: Iterable[str],
                 contents: Mapping[str, bytes]) -> TargetState:
    """The state with exactly `applied` deltas in their new state and every other delta in its
    old state, computed from `original` (whatever mix is live now). A key already holding the
    wanted value is not touched, so a file changes by exactly the lines that must change."""
    applied = set(applied)
    unknown = applied - {d.id for d in deltas}
    if unknown:
        raise UsageError(f"unknown delta id {sorted(unknown)[0]!r}")
    files: dict[Key, bytes | None] = {k: (o.content if o.exists else None) for k, o in original.files.items()}
    repos: dict[Key, RepoTarget] = {k: RepoTarget(o.head, o.ref) for k, o in original.repos.items()}
    for d in deltas:
        want_new = d.id in applied
        key = (d.host, d.path)
        if d.kind in ("env", "key", "flag"):
            continue
        if d.kind == "git":
            commit = d.new if want_new else d.old
            orig = original.repos.get(key)
            # back on the branch when the original checkout was at this commit on a branch
            ref = orig.ref if orig is not None and orig.head == commit else None
            repos[key] = RepoTarget(commit or "", ref)
            continue
        sha = d.new if want_new else d.old
        live = files.get(key)
        if sha is None:
            files[key] = None
        elif sha in contents:
            files[key] = contents[sha]
        elif live is not None and hashlib.sha256(live).hexdigest() == sha:
            pass  # already holds it (e.g. a large file recorded by hash only)
        else:
            raise UsageError(f"{d.id}: content {sha[:12]} is not in the store")
    deltas, applied = collapse_flags(deltas, applied)
    for key in sorted({(d.host, d.path) for d in deltas if d.kind == "key"}):
        files[key] = key_file(key, [d for d in deltas if d.kind == "key" and (d.host, d.path) == key], applied,
                              contents, files.get(key))
    for key in sorted({(d.host, d.path) for d in deltas if d.kind == "flag"}):
        try:  # a start command line's flags (state/delta_cmdline.py)
            files[key] = flag_file(key, [d for d in deltas if d.kind == "flag" and (d.host, d.path) == key],
                                   applied, contents, files.get(key))
        except ValueError as e:
            raise UsageError(f"{e}; nothing was written") from None
    checks: dict[Key, EnvCheck] = {}
    for key in sorted({(d.host, d.path) for d in deltas if d.kind == "env"}):
        data = files.get(key)
        text = (data or b"").decode("utf-8", "surrogateescape")
        file_deltas = [d for d in deltas if d.kind == "env" and (d.host, d.path) == key]
        sides = env_sides(file_deltas, contents)
        new_text = _env_text(text, file_deltas, applied, sides)
        files[key] = new_text.encode("utf-8", "surrogateescape")
        checks[key] = env_check(text, new_text, file_deltas, applied, sides)
    return TargetState(files, repos, checks)


def collapse_flags(deltas: Sequence[Delta], applied: Iterable[str]) -> tuple[list[Delta], set[str]]:
    """The flag deltas of each argument string (`deltas.split_flags`) as one whole-value delta of its
    key, in the state the chosen flags make: none applied, the baseline's value word; all, the
    current one's; some, the string with exactly those flag changes (`argstring.target_string`: the
    baseline's with them made, or the current one's with the others undone when more are made),
    written as a literal. The rest of the configuration code then edits and checks the key as any
    other, and returns the applied ids with the collapsed deltas' ids in place of the flags'. A flag
    with no delta here (left out of the run) stays as the current string has it."""
    applied = set(applied)
    groups: dict[tuple[str, str, str], list[Delta]] = {}
    out: list[Delta] = []
    for d in deltas:
        if d.kind == "env" and d.flag is not None:
            groups.setdefault((d.host, d.path, d.key or ""), []).append(d)
        else:
            out.append(d)
    for members in groups.values():
        base = members[0]
        old, new = parse_args(base.args_old or ""), parse_args(base.args_new or "")
        every = {c.name for c in diff_args(old, new)}
        # a flag of the string that is not among these deltas (left out with --only/--exclude) keeps
        # its current state, as a left-out variable keeps its current value
        on = {d.flag for d in members if d.id in applied} | (every - {d.flag for d in members})
        whole = replace(base, id=f"{base.service}:{base.key}", flag=None, change="changed",
                        old=base.args_old, new=base.args_new)
        applied -= {d.id for d in members}
        if on and on != every:
            text = target_string(old, new, on)
            whole = replace(whole, new=text, new_word=shell_quote(text), new_eval=text)
        if on:
            applied.add(whole.id)
        out.append(whole)
    return out, applied


def key_file(key: Key, file_deltas: Sequence[Delta], applied: Iterable[str], contents: Mapping[str, bytes],
             live: bytes | None = None) -> bytes:
    """A structured file with exactly its `applied` key deltas in their new state: the baseline
    file's bytes with those keys changed and every other byte as it was (state/structured.render,
    which checks the result parses back to exactly that data). A key of the file whose delta is not
    among `file_deltas` (left out of the run: --only/--exclude) keeps the current file's value, so
    nothing outside the run's deltas is changed. The `live` file (the journaled original) must be one
    of these renderings, byte for byte: a file edited since the diff in anything else is refused, never
    overwritten."""
    from envbisect.state.structured import KeyChange, RenderError, format_of, key_changes, parse_path, render, value_at

    d0 = file_deltas[0]
    old, new = contents.get(d0.old_file or ""), contents.get(d0.new_file or "")
    fmt = format_of(key[1])
    if old is None or new is None or fmt is None:
        raise UsageError(f"{d0.id}: the file's contents are not in the store")
    changes = [KeyChange(parse_path(d.key or ""), d.change, d.old, d.new) for d in file_deltas]
    keep: set[str] = set()
    every = key_changes(fmt, old, new)
    if isinstance(every, tuple) and {c.key for c in changes} < {c.key for c in every}:
        keep = {c.key for c in every} - {c.key for c in changes}
        changes = list(every)
    try:
        if live is not None:
            now = {c.key for c in changes if value_at(fmt, live, c.key) == (True, c.new)}
            if render(fmt, old, new, changes, now) != live:
                raise UsageError(f"{key[0]}:{key[1]} changed since the diff in more than its key deltas: "
                                 "run diff/bisect again")
        return render(fmt, old, new, changes, keep | {d.key or "" for d in file_deltas if d.id in set(applied)})
    except RenderError as e:
        raise UsageError(f"{key[0]}:{key[1]}: {e}; nothing was written") from None


def holds(env: EnvFile, d: Delta, side: str) -> bool:
    """Does `env` hold `d` in its `side` ("old" | "new") state, by shell meaning?

    A delta with no shell text on either side (recorded before shell text was kept) is compared by
    its unquoted value, as it was recorded. A flag of an argument string: does the key's value give
    the flag the values it has on that side (whatever the other flags are)?"""
    if d.flag is not None:
        return _holds_flag(env, d, side)
    cur = env.get(d.key or "")
    word = d.word(side)
    if word is None:
        return cur is None
    if cur is None:
        return False
    if d.old_word is None and d.new_word is None:
        return cur.value == (d.old if side == "old" else d.new)
    return cur.meaning == word_meaning(word)


def _holds_flag(env: EnvFile, d: Delta, side: str) -> bool:
    cur = env.get(d.key or "")
    if cur is None:
        return False
    if d.old_word is not None and cur.meaning == word_meaning(d.old_word):
        text = d.args_old
    elif d.new_word is not None and cur.meaning == word_meaning(d.new_word):
        text = d.args_new
    elif all(kind == "lit" for kind, _ in cur.meaning):
        text = cur.value
    else:
        return False
    try:
        have = parse_args(text or "").get(d.flag or "")
        want = parse_args((d.args_old if side == "old" else d.args_new) or "").get(d.flag or "")
    except ArgStringError:
        return False
    return (have.values if have else None) == (want.values if want else None)


def _env_text(text: str, file_deltas: Sequence[Delta], applied: Iterable[str], sides: EnvSides = EnvSides()) -> str:
    """The text with each delta of this file in its state (applied: new, else old); a key already
    holding what its state means is not touched, so the file changes by exactly the lines that must.

    A key the text does not assign goes back as its exact lines where they stand in that side's file,
    when it is known (`EnvFile.with_lines_of`): appended at the end, a line that a later line reads
    (``ROOT=/data`` above ``KV="${ROOT}/kv"``) would leave the reader evaluating without it, so the
    "baseline" trial would not be the baseline."""
    applied = set(applied)
    for d in file_deltas:
        side = "new" if d.id in applied else "old"
        env = parse_env(text)
        if holds(env, d, side):
            continue
        key, word = d.key or "", d.word(side)
        ref = _parsed(sides.text(side))
        if word is None:
            text = env.without(key)
        elif env.get(key) is None and ref is not None and (a := ref.get(key)) is not None \
                and a.meaning == word_meaning(word):
            text = env.with_lines_of(key, ref)
        else:
            text = env.with_word(key, word)
    return _whole_side(text, file_deltas, applied, sides) or text


def _whole_side(text: str, file_deltas: Sequence[Delta], applied: set[str], sides: EnvSides) -> str | None:
    """That side's file, byte for byte, when every delta of the file is on one side and the edited
    text assigns exactly what it assigns: the edits above give its meaning, not always its bytes (an
    ``export`` or a comment on a changed line, a line moved that changes no value), and the baseline
    trial is meant to be the baseline file. Not when a key differs (a delta of the file left out of
    the run: --only/--exclude), so nothing outside the run's deltas is changed."""
    ids = {d.id for d in file_deltas}
    side = "old" if not ids & applied else "new" if ids <= applied else None
    ref = _parsed(sides.text(side)) if side else None
    if ref is None or parse_env(text).meanings() != ref.meanings():
        return None
    return sides.text(side)


def _parsed(text: str | None) -> EnvFile | None:
    if text is None:
        return None
    try:
        return parse_env(text)
    except EnvFileError:  # the diff compared it per key, so it parsed; never guess from one that does not
        return None


def env_check(text: str, new_text: str, file_deltas: Sequence[Delta], applied: Iterable[str],
              sides: EnvSides = EnvSides()) -> EnvCheck:
    """What bash must make of `new_text` for each key of the file's deltas: the value a snapshot
    recorded for that side (`old_eval` from the baseline, `new_eval` from the current one), else
    what bash makes of the reference text of that side. A key whose value reads (directly or through
    other keys of the file) a key whose delta is on the other side in this trial is skipped: a mixed
    configuration has no reference value.

    When `new_text` is exactly one side's file (every delta on that side, its bytes), each other key
    whose value reads a delta's key is checked too, against what bash made of that whole file on the
    host: a re-added line that its reader does not see is caught there, before any restart. Only
    then: for any other configuration nothing recorded says what a reader should give."""
    applied = set(applied)
    side = {d.key: ("new" if d.id in applied else "old") for d in file_deltas if d.key}
    env = parse_env(new_text)
    file_keys = set(env.values())
    expects: list[Expect] = []
    skipped: dict[str, str] = {}
    refs_needed: set[str] = set()
    for d in file_deltas:
        k = d.key or ""
        s = side[k]
        other = _reads_other_side(env, k, s, side, file_keys)
        if other:
            skipped[k] = (f"reads {other}, whose delta is in its {'new' if s == 'old' else 'old'} state in this "
                          "trial: a mixed configuration has no reference value")
            continue
        value = d.old_eval if s == "old" else d.new_eval
        if value is not None:
            src = (f"recorded by {d.baseline_source}" if s == "old" else "recorded by the current snapshot")
            expects.append(Expect(k, s, value=value, source=src))
        else:
            refs_needed.add(s)
            expects.append(Expect(k, s, ref=s, source=f"the file with all its deltas {s}, sourced the same way"))
    expects.extend(_reader_expects(env, new_text, file_deltas, side, sides))
    refs = {}
    for s in sorted(refs_needed):
        ref_text = _env_text(text, file_deltas, [d.id for d in file_deltas] if s == "new" else [], sides)
        refs[s] = ref_text.encode("utf-8", "surrogateescape")
    start_env = next((d.start_env for d in file_deltas if d.start_env is not None), None)
    return EnvCheck(start_env, tuple(expects), refs, skipped)


def _reader_expects(env: EnvFile, new_text: str, file_deltas: Sequence[Delta], side_of: Mapping[str, str],
                    sides: EnvSides) -> list[Expect]:
    """The expectations for the keys that read a delta's key, when `new_text` is one side's file."""
    states = set(side_of.values())
    side = states.pop() if len(states) == 1 else None
    evaluated = sides.evaluated(side) if side else None
    if side is None or evaluated is None or new_text != sides.text(side):
        return []
    file_keys = set(env.values())
    source = (f"what bash made of the whole file, recorded by {file_deltas[0].baseline_source}" if side == "old"
              else "what bash made of the whole file, recorded by the current snapshot")
    out = []
    for k in sorted(file_keys - set(side_of)):
        read = _first_read(env, k, set(side_of), file_keys)
        if read is not None and k in evaluated:
            out.append(Expect(k, side, value=evaluated[k], source=f"{source}; {k} reads {read}"))
    return out


def _reads_other_side(env: EnvFile, key: str, side: str, sides: Mapping[str, str], file_keys: set[str]) -> str | None:
    """The first key of the file that `key`'s value reads (transitively through the file's own
    assignments) whose delta is on the other side, or None."""
    return _first_read(env, key, {k for k, s in sides.items() if s != side}, file_keys)


def _first_read(env: EnvFile, key: str, names: set[str], file_keys: set[str]) -> str | None:
    """The first of `names` that `key`'s value reads, directly or through the file's own
    assignments, or None."""
    seen = {key}
    todo = [key]
    while todo:
        a = env.get(todo.pop())
        if a is None:
            continue
        for name in sorted(meaning_refs(a.meaning)):
            if name in seen:
                continue
            seen.add(name)
            if name in names:
                return name
            if name in file_keys:
                todo.append(name)
    return None


# --- the post-apply check on the host (op "env_check" in remote/hostops.py) ---------------------

def env_check_ops(target: TargetState, host: str, ops: Sequence[Mapping]) -> list[dict]:
    """The ``env_check`` ops for the env files that `ops` (one host's batch) write: appended to the
    same batch, so the check runs in the same round trip as the write, before any restart."""
    import base64

    written = {op.get("path") for op in ops if op.get("op") == "write" and not op.get("delete")}
    out = []
    for (h, path), chk in sorted(target.checks.items()):
        if h != host or path not in written or not (chk.expect or chk.skipped):
            continue
        out.append({"op": "env_check", "path": path, "env": dict(chk.env) if chk.env is not None else None,
                    "expect": [{"key": e.key, "side": e.side, "value": e.value, "ref": e.ref, "source": e.source}
                               for e in chk.expect],
                    "refs": {s: base64.b64encode(t).decode("ascii") for s, t in chk.refs.items()},
                    "skipped": dict(chk.skipped)})
    return out


def raise_on_env_check(results: Mapping[str, Sequence[Mapping]], masker) -> None:  # noqa: ANN001
    """Raise `EnvCheckFailed` (one line, values masked) for the first host whose env_check results
    show a mismatch or could not evaluate the file."""
    from envbisect.errors import EnvCheckFailed

    for host in sorted(results):
        for r in results[host]:
            path = r.get("path", "")
            if r.get("error"):
                raise EnvCheckFailed(f"{host}: {path}: cannot check what bash makes of the edited file "
                                     f"({r['error']}); nothing was restarted, the run stops", host, path)
            bad = r.get("mismatches") or []
            if bad:
                m = bad[0]
                k = m["key"]
                more = f" (and {len(bad) - 1} more key(s))" if len(bad) > 1 else ""
                shown = lambda v: "unset" if v is None else repr(masker.mask_value(k, v))  # noqa: E731
                raise EnvCheckFailed(
                    f"{host}: {path}: {k}: after the edit bash gives {shown(m['got'])}, the configuration under test "
                    f"({m.get('side')} {k}) should give {shown(m['expected'])} "
                    f"({m.get('source') or 'expected'}){more}; "
                    "nothing was restarted, the run stops", host, path, k)
