"""Deltas: what changed between a known-good baseline and now, as discrete, applicable units.

Pure: takes snapshots (the current one carrying fallback material for TIME), returns a `Diff`.
Every delta says where its old value came from (`baseline_source`), because "old value from a
.bak file of unknown age" and "old value from a snapshot taken at 11:58" are different evidence.

An env delta is a change of *shell meaning* (`envfile.EnvAssignment.meaning`): ``X=512`` ->
``X="512"`` is none, ``X='$HOME/t'`` -> ``X="$HOME/t"`` is one. Each side keeps the exact shell
text of its value word (`Delta.old_word` / `new_word`, written back byte for byte by a trial) and,
when the host evaluated the file in bash (`snapshot.ProcessState.file_eval`), what bash made of it
(`old_eval` / `new_eval`): drift compares a process with that, and the post-apply check of a trial
compares the host's evaluation of the edited file with it.

Size (516 lines): every kind of delta (env, file, git, process drift) computed from the same two snapshots with the same shell-meaning rules.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from envbisect.inputs.argstring import ArgStringError, diff_args, is_arg_key, parse_args
from envbisect.inputs.envfile import EnvFile, EnvFileError, meaning_refs, parse_env, shell_quote, word_meaning
from envbisect.inputs.masking import SecretMasker
from envbisect.state.snapshot import FileState, HostState, ProcessState, RepoState, Snapshot
from envbisect.state.sourced import source_lines_changed
from envbisect.state.structured import Unfaithful, format_of, key_changes, key_name

if TYPE_CHECKING:
    from envbisect.state.knobs import KnobRegistry

CHANGES = ("added", "removed", "changed")


def same_change(d: "Delta") -> tuple[str, str, str | None]:
    """What makes two services' env deltas "the same change" (to be tested as one linked unit):
    key, kind of change and the new value as bash makes it where that is known (`128` and
    `${KV_PAGE:-128}` are the same page size; by their text such a pair was split, and each side
    alone, a layout mismatch, was named as a culprit). A flag of an argument string: the key with
    the flag (`link_name`), and its values as the consumer gets them (``--page-size=16`` and
    ``--page-size 16`` are the same change)."""
    if d.knob is not None:  # one knob of the installed engine, whatever its spelling (state/knobs.py)
        return (d.knob, d.change, _knob_value(d))
    if d.flag is not None:
        return (link_name(d), d.change, repr(_flag_values(d.args_new, d.flag)))
    return (d.key or "", d.change, d.new_eval if d.new_eval is not None else _static_value(d))


_TRUE, _FALSE = frozenset({"1", "true", "yes", "y", "on"}), frozenset({"0", "false", "no", "n", "off"})


def _knob_value(d: "Delta") -> str | None:
    """The new value of a knob as the engine reads it: a flag's values joined (a bare switch is
    "true"), a variable's value as bash makes it; a boolean word in either is true or false, so
    ``SGLANG_X=1`` and a bare ``--x`` that replaces it are the same change."""
    if d.flag is not None:
        values = _flag_values(d.args_new, d.flag)
        if values is None:
            return None
        text = " ".join(" ".join(v) for v in values) or "true"
    else:
        text = d.new_eval if d.new_eval is not None else _static_value(d)
        if text is None:
            return None
    low = text.strip().lower()
    return "true" if low in _TRUE else "false" if low in _FALSE else text


def link_name(d: "Delta") -> str:
    """The name deltas are linked by: the key, and for a flag of an argument string ``KEY[--flag]``."""
    return f"{d.key}[{d.flag}]" if d.flag is not None else (d.key or "")


def _flag_values(text: str | None, flag: str) -> tuple[tuple[str, ...], ...] | None:
    try:
        f = parse_args(text).get(flag) if text is not None else None
    except ArgStringError:
        return None
    return f.values if f is not None else None


def _static_value(d: "Delta") -> str | None:
    """What bash would make of the new value, worked out here when the host could not evaluate the
    file (its service was down: red-team R01, where the culprit stopped decode and the KV twins
    were compared by text again): EnvFile.resolved, in the start environment the delta carries.
    A command substitution stays as written, so such a value links only with the same text."""
    if d.new_word is None:
        return d.new
    try:
        return parse_env(f"X={d.new_word}\n").resolved(d.start_env or {}).get("X", d.new)
    except EnvFileError:
        return d.new


@dataclass(frozen=True)
class Delta:
    id: str  # stable and typable: "decode:SGLANG_X", "git:node1:/srv/src", "file:node1:/srv/conf/a.yaml",
    # "file:node1:/srv/conf/a.yaml#router.policy" (one key of a structured file: state/structured.py)
    kind: str  # env | git | file | key
    host: str
    service: str | None
    path: str
    key: str | None
    change: str  # added | removed | changed
    old: str | None  # env: value; git: commit; file: sha256; key: the value as JSON text (None when absent or unknown)
    new: str | None
    baseline_source: str  # "snapshot:ID", "backup:PATH", "git:COMMIT", "reflog", "process:SERVICE", "mtime"
    detail: tuple[str, ...] = ()  # commits in between, "old content unknown", duplicate keys...
    # env only. The exact shell text of the value word on each side (``"${HF_HOME%/*}/kv"``, quotes
    # included): what a trial writes back. None when unknown (a value read from a process
    # environment, an absent side): then the value is a literal, written as shell_quote(value).
    old_word: str | None = None
    new_word: str | None = None
    # env only. What bash made of each side on the host (baseline snapshot for old, current for new;
    # ProcessState.file_eval). None when unknown (no process, no evaluation, absent side).
    old_eval: str | None = None
    new_eval: str | None = None
    # env only. The environment the service's env file is sourced in (its process's start
    # environment minus the file's keys, from the current snapshot, else the baseline's); the
    # post-apply check evaluates the edited file in it. None: unknown (a minimal one is used).
    start_env: Mapping[str, str] | None = field(default=None, compare=False, repr=False)
    # env and key. The whole file on each side (sha256; its bytes in Diff.contents) and (env) what bash made of
    # all of it on the host (ProcessState.file_eval), when known: a trial re-adds a removed line where
    # it stood, and checks the lines that read a delta's key (state/configuration.py).
    old_file: str | None = field(default=None, compare=False, repr=False)
    new_file: str | None = field(default=None, compare=False, repr=False)
    old_file_eval: Mapping[str, str] | None = field(default=None, compare=False, repr=False)
    new_file_eval: Mapping[str, str] | None = field(default=None, compare=False, repr=False)
    # env only: one flag of an argument string (`split_flags`). `flag` is its name ("--tp"); `old` /
    # `new` are its text on each side (None: absent there); the words, evaluations and files above
    # stay those of the whole value; `args_old` / `args_new` are the whole strings it was split from.
    flag: str | None = None
    args_old: str | None = None
    args_new: str | None = None
    # env only: the installed engine's name for what this variable or flag sets (`knobs.Knob.name`,
    # "SGLANG_X" for SGL_X too, "flag:page_size" for --page-size); None: no registry, or not its knob
    knob: str | None = None

    def word(self, side: str) -> str | None:
        """The shell text a trial writes for `side` ("old" | "new"); None: the key is absent there."""
        value, word = (self.old, self.old_word) if side == "old" else (self.new, self.new_word)
        if value is None and word is None:
            return None
        return word if word is not None else shell_quote(value or "")

    @property
    def applicable(self) -> bool:
        """Can a trial put the old state back? Not when the old content is unknown."""
        if self.kind == "file":
            return self.change == "added" or self.old is not None
        if self.kind == "git":
            return self.old is not None and self.new is not None
        return True

    def to_json(self, masker: SecretMasker) -> dict[str, Any]:
        old, new = self.old, self.new
        extra: dict[str, Any] = {}
        if self.kind == "env":
            k = self.key or ""
            old, new = masker.mask_value(k, old), masker.mask_value(k, new)
            extra = {"old_word": masker.mask_value(k, self.old_word), "new_word": masker.mask_value(k, self.new_word),
                     "old_eval": masker.mask_value(k, self.old_eval), "new_eval": masker.mask_value(k, self.new_eval),
                     "old_shown": self.shown("old", masker), "new_shown": self.shown("new", masker)}
        elif self.kind == "key":
            k = key_name(self.key or "")
            old, new = masker.mask_value(k, old), masker.mask_value(k, new)
        return {"id": self.id, "kind": self.kind, "host": self.host, "service": self.service, "path": self.path,
                "key": self.key, "change": self.change, "old": old, "new": new,
                "baseline_source": self.baseline_source, "detail": [masker.redact_text(d) for d in self.detail],
                **extra, **({"flag": self.flag} if self.flag is not None else {}),
                **({"knob": self.knob} if self.knob is not None else {})}

    def shown(self, side: str, masker: SecretMasker) -> str | None:
        """One side for people, masked: the value; the shell text instead when it is not a plain
        literal (or the change is one of quoting only), followed by what bash made of it when that
        differs: ``"${HF_HOME%/*}/cache"  (= /data/cache)``."""
        value, word, ev = ((self.old, self.old_word, self.old_eval) if side == "old"
                           else (self.new, self.new_word, self.new_eval))
        if self.flag is not None:  # the flag's own text, as the string has it
            return masker.mask_value(self.key or "", value)
        return shown_value(self.key or "", value, word, ev, masker, quoting_only=self.old == self.new)


@dataclass(frozen=True)
class Drift:
    """A running process whose start environment differs from its env file on disk."""

    host: str
    service: str
    key: str
    file_value: str | None
    process_value: str | None
    pid: int | None
    started_at: float | None
    # the file's shell text for the key (its value word), and whether file_value is what bash made
    # of the file on the host (True) or envbisect's own reading of it (EnvFile.resolved: False)
    file_text: str | None = None
    evaluated: bool = False

    def to_json(self, masker: SecretMasker) -> dict[str, Any]:
        return {"host": self.host, "service": self.service, "key": self.key,
                "file": masker.mask_value(self.key, self.file_value),
                "file_text": masker.mask_value(self.key, self.file_text), "evaluated": self.evaluated,
                "file_shown": self.shown(masker),
                "process": masker.mask_value(self.key, self.process_value), "pid": self.pid,
                "started_at": _iso(self.started_at)}

    def shown(self, masker: SecretMasker) -> str | None:
        """The file side for people, masked: its text, and the value where they differ."""
        if self.file_text is None:
            return masker.mask_value(self.key, self.file_value)
        return shown_value(self.key, self.file_value, self.file_text, self.file_value, masker)


def shown_value(key: str, value: str | None, word: str | None, ev: str | None, masker: SecretMasker, *,
                quoting_only: bool = False) -> str | None:
    """``TEXT  (= VALUE)`` for a value word whose shell text and value differ, else the value; masked."""
    if value is None and word is None:
        return None
    text = value
    if word is not None:
        try:
            plain = all(kind == "lit" for kind, _ in word_meaning(word))
        except EnvFileError:
            plain = False
        if quoting_only or not plain:
            text = word
    shown = masker.mask_value(key, text)
    if ev is not None and ev != text and (word is None or not all_literal_equal(word, ev)):
        shown = f"{shown}  (= {masker.mask_value(key, ev)})"
    return shown


def all_literal_equal(word: str, value: str) -> bool:
    """Is `word` the plain literal `value` (so that showing the value again says nothing)?"""
    try:
        m = word_meaning(word)
    except EnvFileError:
        return False
    return m == ((("lit", value),) if value else ())


@dataclass(frozen=True)
class Diff:
    since: float | None
    baseline: Snapshot | None
    current: Snapshot
    deltas: tuple[Delta, ...]
    drift: tuple[Drift, ...]
    unknown_processes: tuple[str, ...] = ()  # services whose start environment could not be read
    notes: tuple[str, ...] = ()
    contents: Mapping[str, bytes] = field(default_factory=dict)  # sha256 -> bytes for file deltas (old and new)
    # `--since last-good`: how the baseline was picked (state/store.LastGood.to_json; its "line" says it)
    last_good: Mapping[str, Any] | None = None

    def links(self) -> list[list[str]]:
        """Env deltas of the same key in several services: these often must change together."""
        by_key: dict[tuple[str, str, str | None], list[str]] = {}
        for d in self.deltas:
            if d.kind == "env":
                by_key.setdefault(same_change(d), []).append(d.id)
        return [ids for ids in by_key.values() if len(ids) > 1]

    def to_json(self, masker: SecretMasker) -> dict[str, Any]:
        b = self.baseline
        return {
            "since": _iso(self.since),
            "baseline": ({"snapshot": b.id, "label": b.label, "taken_at": b.taken_at_iso} if b else
                         {"snapshot": None, "sources": fallback_sources(self), "hint": SNAPSHOT_HINT}),
            "current": {"snapshot": self.current.id, "taken_at": self.current.taken_at_iso},
            "deltas": [d.to_json(masker) for d in self.deltas],
            "drift": [d.to_json(masker) for d in self.drift],
            "links": self.links(),
            "unknown_processes": list(self.unknown_processes),
            "notes": [masker.redact_text(n) for n in self.notes],
            **({"last_good": masker.redact_obj(dict(self.last_good))} if self.last_good else {}),
        }


SNAPSHOT_HINT = ("for a real baseline next time: `envbisect schedule --every 1h --install` (a snapshot labelled "
                 "auto every hour; `envbisect prune` thins them), or `envbisect snapshot --label NAME` from a "
                 "deploy hook")
_SOURCE_WORDS = {
    "backup": "backup copies ([baseline] backups)", "git": "the files' git history",
    "reflog": "the repos' reflog", "process": "the environment the running services started with",
    "mtime": "modification times only (old values unknown)", "snapshot": "a snapshot",
}


def fallback_sources(diff: "Diff") -> list[str]:
    """Where the old values of a diff without a baseline snapshot came from: backup, git, ..."""
    return sorted({d.baseline_source.split(":")[0] for d in diff.deltas})


def fallback_note(diff: "Diff", oldest: tuple[str, float] | None) -> str:
    """Says, for a diff --since with no snapshot old enough, which sources stood in and how to have
    a real snapshot next time. ``oldest``: (id, taken_at) of the deployment's oldest snapshot."""
    counts: dict[str, int] = {}
    for d in diff.deltas:
        k = d.baseline_source.split(":")[0]
        counts[k] = counts.get(k, 0) + 1
    since = _iso(diff.since) or "TIME"
    where = (f"the oldest snapshot of this deployment, {oldest[0]}, is from {_iso(oldest[1])}" if oldest
             else "there is no snapshot of this deployment in the store")
    used = "; ".join(f"{_SOURCE_WORDS.get(k, k)} ({n} delta{'s' if n != 1 else ''})" for k, n in sorted(counts.items()))
    return (f"no snapshot taken at or before {since} ({where}): old values came from "
            f"{used or 'no other source (nothing found older than that time)'}; {SNAPSHOT_HINT}")


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _parse(content: bytes | None) -> EnvFile | None:
    if content is None:
        return None
    try:
        return parse_env(content.decode("utf-8", "surrogateescape"))
    except EnvFileError:
        return None


@dataclass
class _Old:
    """The baseline state of one file: content (or known absence) and where it came from."""

    source: str
    content: bytes | None
    absent: bool = False
    sha: str | None = None  # known even when the content is not (large files, symlinks)


def _old_file(path: str, base_host: HostState | None, base_id: str | None, cur: HostState,
              since: float | None) -> _Old | None:
    if base_host is not None:
        bf = base_host.files.get(path)
        if bf is not None:
            if bf.exists is False:
                return _Old(f"snapshot:{base_id}", None, absent=True)
            if bf.content is not None or bf.sha256:
                return _Old(f"snapshot:{base_id}", bf.content, sha=bf.sha256)
        elif _covered(path, base_host):
            return _Old(f"snapshot:{base_id}", None, absent=True)
    fb = cur.fallback
    if fb is not None:
        bk = fb.backups.get(path)
        if bk is not None and bk.content is not None:
            return _Old(f"backup:{bk.path}", bk.content)
        g = fb.git.get(path)
        if g is not None and g.get("commit"):
            if g.get("absent"):
                return _Old(f"git:{g['commit'][:12]}", None, absent=True)
            if "content" in g:
                return _Old(f"git:{g['commit'][:12]}", g["content"])
    return None


def _covered(path: str, host: HostState) -> bool:
    """Was path inside something the baseline looked at (so its absence there is meaningful)?"""
    return (any(path == root or path.startswith(root.rstrip("/") + "/") for root in host.watched)
            or path in host.env_files.values())


def compute_diff(current: Snapshot, baseline: Snapshot | None, *, since: float | None) -> Diff:
    deltas: list[Delta] = []
    drift: list[Drift] = []
    notes: list[str] = []
    unknown: list[str] = []
    contents: dict[str, bytes] = {}
    base_id = baseline.id if baseline else None
    for hname, cur in current.hosts.items():
        base = baseline.hosts.get(hname) if baseline else None
        # --- env files, one per service ------------------------------------------------------
        for service, path in cur.env_files.items():
            f = cur.files.get(path) or FileState(path, exists=None)
            if f.error or f.exists is None:
                notes.append(f"{hname}:{path}: cannot read ({f.error or 'unknown'}); its deltas are unknown")
                continue
            new_env = _parse(f.content) if f.exists else EnvFile("", ())
            if new_env is None:
                notes.append(f"{hname}:{path}: not parseable as a serve-env file; compared as a whole file")
                deltas.extend(_file_delta(hname, path, f, _old_file(path, base, base_id, cur, since), since, contents))
                continue
            for key, lines in new_env.duplicates().items():
                notes.append(f"{service}: {key} is assigned {len(lines)} times in {path} (lines "
                             f"{', '.join(map(str, lines))}); the last one wins")
            old = _old_file(path, base, base_id, cur, since)
            proc = cur.processes.get(service)
            base_proc = base.processes.get(service) if base is not None else None
            # what bash made of the current file on the host (None: not evaluated there)
            new_eval = proc.evaluated(f.sha256) if proc is not None and f.exists else None
            old_env = None
            if old is not None:
                old_env = EnvFile("", ()) if old.absent else _parse(old.content)
            keys = set(new_env.values()) | set(old_env.values() if old_env else ())
            start_env = _start_env(keys, proc, base_proc)
            if old is not None:
                if old_env is None:
                    # its deltas are not dropped (the baseline trial would keep the current file
                    # and fail: a false not-config); the file is one delta, as a current file
                    # that does not parse is
                    notes.append(f"{hname}:{path}: the baseline ({old.source}) is not parseable as a serve-env file "
                                 "(per key); compared as a whole file")
                    deltas.extend(_file_delta(hname, path, f, old, since, contents))
                    continue
                old_eval = None
                if base_proc is not None and old.source == f"snapshot:{base_id}" and not old.absent:
                    old_eval = base_proc.evaluated(old.sha or (_sha(old.content) if old.content is not None else None))
                file_deltas = _env_deltas(hname, service, path, _file_sides(old_env, old_eval),
                                          _file_sides(new_env, new_eval), old.source, start_env)
                unexplained = _unexplained_evaluations(old_env, new_env, old_eval, new_eval,
                                                       {d.key for d in file_deltas})
                changed, noted = source_lines_changed(path, cur, base, old.content, f.content if f.exists else None)
                if changed:
                    # a `. FILE` line added, removed or changed is no assignment: per-key deltas
                    # would keep today's source lines in the baseline trial
                    if not noted:  # else sourced_notes says it, with what was added or removed
                        notes.append(f"{hname}:{path}: its source lines changed since the baseline; compared as a "
                                     "whole file")
                    deltas.extend(_file_delta(hname, path, f, old, since, contents))
                    continue
                if unexplained:
                    notes.append(f"{hname}:{path}: what bash makes of {', '.join(unexplained)} changed, though no "
                                 "assignment it reads did (a line moved, or an earlier copy of a key was edited): "
                                 "compared as a whole file")
                    deltas.extend(_file_delta(hname, path, f, old, since, contents))
                    continue
                deltas.extend(_with_files(file_deltas, None if old.absent else old.content,
                                          f.content if f.exists else None, old_eval, new_eval, contents))
            elif proc is not None and proc.status == "ok" and since is not None and proc.started_at is not None \
                    and proc.started_at <= since:
                # The process started before TIME still carries the old environment.
                deltas.extend(_env_deltas_from_process(hname, service, path, proc, new_env, new_eval, start_env))
            elif f.mtime is not None and since is not None and f.mtime > since:
                deltas.append(Delta(f"{service}:*", "env", hname, service, path, None, "changed", None, None, "mtime",
                                    (f"modified at {_iso(f.mtime)}, after {_iso(since)}; its old content is unknown "
                                     "(no snapshot, backup, git history or older process)",)))
            # --- drift: process environment vs file on disk ---------------------------------
            if proc is not None:
                if proc.status == "ok" and proc.environ is not None:
                    old_keys = set()
                    if old is not None and not old.absent:
                        oe = _parse(old.content)
                        old_keys = set(oe.values()) if oe else set()
                    drift.extend(_drift(hname, service, proc, new_env, old_keys, new_eval))
                elif proc.status == "unknown":
                    unknown.append(service)
        # --- repos -------------------------------------------------------------------------
        covered = set(cur.env_files.values()) | {p for ms in cur.watched.values() for p in ms}
        for rpath, repo in cur.repos.items():
            if repo.error:
                notes.append(f"{hname}:{rpath}: {repo.error}")
                continue
            d = _repo_delta(hname, rpath, repo, base.repos.get(rpath) if base else None, base_id)
            if d:
                deltas.append(d)
            # a structured file of the repo (configs/feature_flags.yaml) per key, as a watched one
            dirty = _dirty_deltas(hname, rpath, repo, cur, base, base_id, since, contents, covered, notes)
            deltas.extend(per_key(dirty, contents, notes))
        # --- watched files -----------------------------------------------------------------
        env_paths = set(cur.env_files.values())
        members = sorted({p for ms in cur.watched.values() for p in ms} - env_paths)
        gone = set()
        if base is not None:
            gone = {p for ms in base.watched.values() for p in ms} - set(members) - env_paths
        for path in members:
            f = cur.files[path]
            if f.error:
                notes.append(f"{hname}:{path}: cannot read ({f.error})")
            file_deltas = _file_delta(hname, path, f, _old_file(path, base, base_id, cur, since), since, contents)
            deltas.extend(per_key(file_deltas, contents, notes))
        for path in sorted(gone):
            bf = base.files.get(path) if base else None
            if bf is None:
                continue
            if bf.content is not None:
                contents[bf.sha256 or _sha(bf.content)] = bf.content
            deltas.append(Delta(f"file:{hname}:{path}", "file", hname, None, path, None, "removed",
                                bf.sha256, None, f"snapshot:{base_id}",
                                () if bf.content is not None else ("old content too large to restore",)))
    return Diff(since, baseline, current, tuple(deltas), tuple(drift), tuple(unknown), tuple(notes), contents)


def _unexplained_evaluations(old_env: EnvFile, new_env: EnvFile, old_eval: Mapping[str, str] | None,
                             new_eval: Mapping[str, str] | None, delta_keys: set[str | None]) -> list[str]:
    """Keys whose assignment means the same on both sides, whose value reads only keys the file
    itself assigns, none of which has a delta or evaluates differently, and which bash nonetheless
    evaluated differently on the host. Per-key deltas cannot express that (the order of the lines
    or an earlier, shadowed copy changed), and a trial built from them would not be the baseline.
    Conservative: a value that reads the process environment, runs a command or expands ``~`` may
    legitimately evaluate differently, so it never counts."""
    if old_eval is None or new_eval is None:
        return []
    assigned = {a.key for a in old_env.assignments} | {a.key for a in new_env.assignments}
    old_m, new_m = old_env.meanings(), new_env.meanings()
    out = []
    for key in sorted(set(old_m) & set(new_m)):
        if key in delta_keys or old_m[key] != new_m[key]:
            continue
        if old_eval.get(key) is None or new_eval.get(key) is None or old_eval[key] == new_eval[key]:
            continue
        if any(kind not in ("lit", "ref") or (kind == "ref" and any(c in text for c in ("$(", "`", "~")))
               for kind, text in new_m[key]):
            continue  # a command or ~ (also inside a default: ${A:-$(date)}, red-team R10/R13) may differ
        refs = meaning_refs(new_m[key])
        if not refs or not refs <= assigned:
            continue
        if any(r in delta_keys or old_eval.get(r) != new_eval.get(r) for r in refs):
            continue
        out.append(key)
    return out


@dataclass(frozen=True)
class _Side:
    """One side of an env delta: the value, its shell text, what bash made of it, and what equality
    is decided on (the shell meaning between two files; the evaluated value against a process)."""

    value: str
    word: str | None
    eval: str | None
    same: Any


def _file_sides(env: EnvFile, evaluated: Mapping[str, str] | None) -> dict[str, _Side]:
    out = {}
    for key in env.values():
        a = env.get(key)
        assert a is not None
        out[key] = _Side(a.value, a.word, evaluated.get(key) if evaluated is not None else None, a.meaning)
    return out


def _start_env(keys: Iterable[str], proc: ProcessState | None, base_proc: ProcessState | None) -> dict[str, str] | None:
    """The environment the env file is sourced in: the current process's, else the baseline's."""
    for p in (proc, base_proc):
        env = p.start_environ(keys) if p is not None else None
        if env is not None:
            return env
    return None


def _env_deltas(host: str, service: str, path: str, old: Mapping[str, _Side], new: Mapping[str, _Side],
                source: str, start_env: Mapping[str, str] | None = None) -> list[Delta]:
    out = []
    for key in sorted(set(old) | set(new)):
        o, n = old.get(key), new.get(key)
        if o is not None and n is not None and o.same == n.same:
            continue
        change = "added" if o is None else "removed" if n is None else "changed"
        out.append(Delta(f"{service}:{key}", "env", host, service, path, key, change,
                         o.value if o else None, n.value if n else None, source,
                         old_word=o.word if o else None, new_word=n.word if n else None,
                         old_eval=o.eval if o else None, new_eval=n.eval if n else None, start_env=start_env))
    return out


def _with_files(file_deltas: list[Delta], old: bytes | None, new: bytes | None, old_eval: Mapping[str, str] | None,
                new_eval: Mapping[str, str] | None, contents: dict[str, bytes]) -> list[Delta]:
    """The file's deltas, each naming the whole file on both sides (kept in `contents`)."""
    if not file_deltas:  # nothing to apply: no need to keep the file
        return []
    shas = {}
    for side, data in (("old", old), ("new", new)):
        if data is not None:
            shas[side] = _sha(data)
            contents[shas[side]] = data
    return [replace(d, old_file=shas.get("old"), new_file=shas.get("new"), old_file_eval=old_eval,
                    new_file_eval=new_eval) for d in file_deltas]


def _env_deltas_from_process(host: str, service: str, path: str, proc: ProcessState, new_env: EnvFile,
                             new_eval: Mapping[str, str] | None = None,
                             start_env: Mapping[str, str] | None = None) -> list[Delta]:
    """Old values from the environment of a process started before TIME.

    A process environment also holds everything inherited (PATH, HOME...), so only keys the file
    sets, or that share a prefix family with them (SGLANG_, NCCL_...), can be told apart as removed.
    The process holds values, not shell text: they are compared with what bash makes of the file
    (evaluated on the host when it could be, else `EnvFile.resolved`), and written back as literals.
    """
    env = dict(proc.environ or {})
    resolved = new_env.resolved({k: v for k, v in env.items() if k not in new_env.values()})
    if new_eval is not None:
        resolved = {k: new_eval.get(k) for k in resolved}
    families = {k.split("_", 1)[0] + "_" for k in resolved if "_" in k}
    keys = set(resolved) | {k for k in env if any(k.startswith(f) for f in families)}
    old = {k: _Side(env[k], None, env[k], env[k]) for k in keys if k in env}
    new = {}
    for k in keys:
        a = new_env.get(k)
        if a is not None:
            new[k] = _Side(a.value, a.word, resolved[k] if new_eval is not None else None, resolved[k])
    return _env_deltas(host, service, path, old, new, f"process:{service}", start_env)


def _drift(host: str, service: str, proc: ProcessState, file_env: EnvFile, old_keys: set[str],
           evaluated: Mapping[str, str] | None = None) -> list[Drift]:
    """Keys whose value in the process differs from what bash makes of the file: evaluated on the
    host when it could be (`evaluated`), else envbisect's own reading (`EnvFile.resolved`)."""
    env = dict(proc.environ or {})
    values = file_env.values()
    if evaluated is not None:
        got: dict[str, str | None] = {k: evaluated.get(k) for k in values}
    else:
        got = dict(file_env.resolved({k: v for k, v in env.items() if k not in values}))
    out = []
    for key in sorted(got):
        if env.get(key) != got[key]:
            a = file_env.get(key)
            out.append(Drift(host, service, key, got[key], env.get(key), proc.pid, proc.started_at,
                             a.word if a is not None else None, evaluated is not None))
    for key in sorted(old_keys - set(got)):
        if key in env:  # removed from the file, still set in the running process
            out.append(Drift(host, service, key, None, env[key], proc.pid, proc.started_at))
    return out


def _repo_delta(host: str, path: str, repo: RepoState, base: RepoState | None, base_id: str | None) -> Delta | None:
    if base is not None and base.head:
        old, source = base.head, f"snapshot:{base_id}"
    elif repo.head_at_since:
        old, source = repo.head_at_since, "reflog"
    else:
        return None
    if old == repo.head:
        return None  # HEAD did not move; uncommitted changes are file deltas of their own (_dirty_deltas)
    detail: list[str] = []
    if repo.dirty:
        detail.append(f"working tree has uncommitted changes: {', '.join(repo.dirty_files[:10])}")
    detail.extend(f"+ {c}" for c in repo.commits_since)
    detail.extend(f"- {c}" for c in repo.commits_rewound)
    return Delta(f"git:{host}:{path}", "git", host, None, path, None, "changed", old, repo.head, source, tuple(detail))


REPO_FILE_MARK = "in the deployed repo"  # in the first detail of a file delta made by _dirty_deltas


def is_repo_file(d: Delta) -> bool:
    """Is this file delta an uncommitted change to a tracked file of a deployed repo (a hotfix)?"""
    return d.kind in ("file", "key") and bool(d.detail) and REPO_FILE_MARK in d.detail[0]


def _dirty_deltas(host: str, rpath: str, repo: RepoState, cur: HostState, base: HostState | None,
                  base_id: str | None, since: float | None, contents: dict[str, bytes], covered: set[str],
                  notes: list[str]) -> list[Delta]:
    """Uncommitted changes to tracked files of a deployed repo (a hotfix edited on the box), one
    file delta each, like a watched file's. The baseline side is the baseline snapshot's copy when
    the file was dirty there too, else the file at the baseline HEAD (read from git on the host by
    the collector). A file a watch root or an env file covers is compared there."""
    base_repo = base.repos.get(rpath) if base is not None else None
    now, then = repo.dirty_paths(), base_repo.dirty_paths() if base_repo is not None else {}
    repo_base = cur.fallback.repo_base if cur.fallback is not None else {}
    out: list[Delta] = []
    for path in sorted(set(now) | set(then)):
        if path in covered:
            continue
        rel = now.get(path) or then.get(path)
        f = cur.files.get(path)
        if f is None or f.error or f.exists is None:
            notes.append(f"{host}:{path}: an uncommitted change in {rpath} that could not be read "
                         f"({f.error if f is not None and f.error else 'not snapshotted'}); its delta is unknown")
            continue
        old: _Old | None = None
        if path in then and base is not None:
            bf = base.files.get(path)
            if bf is not None and bf.exists is False:
                old = _Old(f"snapshot:{base_id}", None, absent=True)
            elif bf is not None and (bf.content is not None or bf.sha256):
                old = _Old(f"snapshot:{base_id}", bf.content, sha=bf.sha256)
        else:
            g = repo_base.get(path)
            if base is None and since is not None and path in now and f.mtime is not None and f.mtime <= since:
                continue  # edited before TIME: part of the baseline
            if g is not None:
                old = _Old(f"git:{str(g.get('commit'))[:12]}", g.get("content"), absent=bool(g.get("absent")),
                           sha=g.get("sha256"))
        why = (f"uncommitted change to {rel} {REPO_FILE_MARK} {rpath} (tracked, not committed: a hotfix on the box?)"
               if path in now else f"{rel} {REPO_FILE_MARK} {rpath} had uncommitted changes at the baseline")
        out.extend(replace(d, detail=(why, *d.detail)) for d in _file_delta(host, path, f, old, since, contents))
    return out


def _file_delta(host: str, path: str, f: FileState, old: _Old | None, since: float | None,
                contents: dict[str, bytes]) -> list[Delta]:
    did = f"file:{host}:{path}"
    new_sha = f.sha256 if f.exists else None
    if f.content is not None and new_sha:
        contents[new_sha] = f.content
    if old is None:
        # No old content anywhere: like `find -newermt TIME`, still list what was modified after TIME.
        if since is not None and f.exists and f.mtime is not None and f.mtime > since:
            return [Delta(did, "file", host, None, path, None, "changed", None, new_sha, "mtime",
                          (f"modified at {_iso(f.mtime)}, after {_iso(since)}; old content unknown",))]
        return []
    old_sha = None if old.absent else (_sha(old.content) if old.content is not None else old.sha)
    if old.content is not None and old_sha:
        contents[old_sha] = old.content
    if old.absent and not f.exists:
        return []
    if old.absent:
        return [Delta(did, "file", host, None, path, None, "added", None, new_sha, old.source)]
    if not f.exists:
        return [Delta(did, "file", host, None, path, None, "removed", old_sha, None, old.source)]
    if old_sha == new_sha:
        return []
    detail = () if old.content is not None else ("old content unknown",)
    return [Delta(did, "file", host, None, path, None, "changed", old_sha, new_sha, old.source, detail)]


def per_key(file_deltas: list[Delta], contents: Mapping[str, bytes], notes: list[str]) -> list[Delta]:
    """A changed structured file (YAML, JSON, TOML by its extension) as one delta per key path, when
    both sides are known and that is faithful (state/structured.py); else as it is, with a note
    saying why it stays whole. Other deltas pass through."""
    out: list[Delta] = []
    for d in file_deltas:
        fmt = format_of(d.path)
        old, new = contents.get(d.old or ""), contents.get(d.new or "")
        if d.kind != "file" or d.change != "changed" or fmt is None or old is None or new is None:
            out.append(d)
            continue
        changes = key_changes(fmt, old, new)
        if isinstance(changes, Unfaithful):
            notes.append(f"{d.host}:{d.path}: compared as a whole file, not per key: {changes.reason}")
            out.append(d)
            continue
        out.extend(Delta(f"{d.id}#{c.key}", "key", d.host, d.service, d.path, c.key, c.change, c.old, c.new,
                         d.baseline_source, d.detail, old_file=d.old, new_file=d.new) for c in changes)
    return out


def linked_units(deltas: Iterable[Delta], link_keys: Iterable[str] = ()) -> dict[str, tuple[str, ...]]:
    """Group deltas into bisection units: by default every delta alone, `--link KEY` pins all deltas of
    that variable into one unit (every flag of an argument string too), `KEY[--flag]` those of one flag.
    Returns unit id -> delta ids."""
    deltas = list(deltas)
    keys = set(link_keys)
    units: dict[str, tuple[str, ...]] = {}
    grouped: dict[str, list[str]] = {}
    for d in deltas:
        if d.kind == "env" and d.key in keys:
            grouped.setdefault(f"linked:{d.key}", []).append(d.id)
        elif d.kind == "env" and d.knob is not None and d.knob in keys:
            grouped.setdefault(f"linked:{d.knob}", []).append(d.id)
        elif d.kind == "env" and d.flag is not None and link_name(d) in keys:
            grouped.setdefault(f"linked:{link_name(d)}", []).append(d.id)
        else:
            units[d.id] = (d.id,)
    for uid, ids in grouped.items():
        units[uid] = tuple(ids)
    return units


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
    """Per host, the names of its env deltas and flags an engine's registry may know (``SGL*_`` variables
    and flags): only those hosts need their registry read."""
    out: dict[str, list[str]] = {}
    for d in diff.deltas:
        if d.kind == "env" and d.key and (d.flag is not None or d.key.startswith(("SGLANG_", "SGL_"))):
            out.setdefault(d.host, []).append(d.flag or d.key)
    return out


def with_knobs(diff: Diff, registries: Mapping[str, "KnobRegistry | None"], notes: Iterable[str] = (),
               arg_keys: Iterable[str] = ()) -> Diff:
    """The diff with each env delta and flag tied to the knob the host's installed engine reads
    (`registries`: host -> its registry, None where it could not be read): linked by that knob
    whatever its spelling, "back to the default D" when removed, and "not read by the installed
    sglang V" when the engine does not know a name of its own namespace."""
    out = []
    extra = frozenset(arg_keys)
    for d in diff.deltas:
        reg = registries.get(d.host) if d.kind == "env" and d.key else None
        if reg is None:
            out.append(d)
            continue
        name = d.flag if d.flag is not None else d.key or ""
        k = reg.flag(name) if d.flag is not None else reg.knob(name)
        if k is None:
            # an argument string is read by the start script, not by the engine's registry
            if reg.owns(name) and (d.flag is not None or not is_arg_key(d.key, extra)):
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
    return replace(diff, deltas=tuple(out), notes=diff.notes + tuple(notes))
