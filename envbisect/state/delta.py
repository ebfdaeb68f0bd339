"""One delta, its drift and the diff they make up: the types `state/deltas.py` and its kinds share.

A `Delta` is one applicable unit of change (its `kind`: a `DeltaKind`); `same_change` says when two
services' deltas are the same change (linked by the search as one unit), by key, flag or knob.
Pure: no I/O.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any, Mapping

from envbisect.inputs.argstring import ArgStringError, parse_args
from envbisect.inputs.envfile import EnvFile, EnvFileError, parse_env, shell_quote, word_meaning
from envbisect.inputs.masking import SecretMasker
from envbisect.state.snapshot import HostState, Snapshot
from envbisect.state.structured import key_name


class DeltaKind(str, Enum):
    """What a delta changes. Serialised as its text, as run records always held it."""

    ENV = "env"  # one variable of a service's env file (or one flag of an argument-string variable)
    GIT = "git"  # a deployed repo's HEAD
    FILE = "file"  # a whole file (watched, or an uncommitted change in a deployed repo)
    KEY = "key"  # one key path of a structured (YAML, JSON, TOML) file
    FLAG = "flag"  # one flag of a start command line held in a script or unit file (`Delta.flag`)

    __hash__ = str.__hash__

    def __str__(self) -> str:
        return self.value


CHANGES = ("added", "removed", "changed")


def same_change(d: "Delta") -> tuple[str, str, str | None]:
    """What makes two services' env deltas "the same change" (to be tested as one linked unit):
    key, kind of change and the new value as bash makes it where that is known (`128` and
    `${KV_PAGE:-128}` are the same page size; by their text such a pair was split, and each side
    alone, a layout mismatch, was named as a culprit). A flag of an argument string: the key with
    the flag (`link_name`), and its values as the consumer gets them (``--page-size=16`` and
    ``--page-size 16`` are the same change)."""
    if d.knob is not None:  # one knob of the installed engine, whatever its spelling (state/knobs.py)
        return (d.knob, d.change, knob_value(d))
    if d.flag is not None:
        return (link_name(d), d.change, repr(_flag_values(d.args_new, d.flag)))
    return (d.key or "", d.change, d.new_eval if d.new_eval is not None else _static_value(d))


_TRUE, _FALSE = frozenset({"1", "true", "yes", "y", "on"}), frozenset({"0", "false", "no", "n", "off"})


def knob_value(d: "Delta") -> str | None:
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
    """The name deltas are linked by: the key, for a flag of an argument string ``KEY[--flag]``, for a
    flag of a start command line ``[--flag]``."""
    if d.flag is not None:
        return f"{d.key}[{d.flag}]" if d.key is not None else f"[{d.flag}]"
    return d.key or ""


def _flag_values(text: str | None, flag: str) -> tuple[tuple[str, ...], ...] | None:
    try:
        f = parse_args(text).get(flag) if text is not None else None
    except ArgStringError:
        return None
    return f.values if f is not None else None


def _static_value(d: "Delta") -> str | None:
    """What bash would make of the new value, worked out here when the host could not evaluate the
    file (its service was down, e.g. a culprit that stops decode, and twins would be compared by
    text alone): EnvFile.resolved, in the start environment the delta carries.
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
    # "file:node1:/srv/conf/a.yaml#router.policy" (one key of a structured file: state/structured.py),
    # "file:node1:/srv/bin/start-decode.sh[--tp]" (one flag of a start command line: state/delta_cmdline.py)
    kind: DeltaKind  # a plain "env" etc. (a record read back) is taken as its DeltaKind
    host: str
    service: str | None
    path: str
    key: str | None
    change: str  # added | removed | changed
    old: str | None  # env: value; git: commit; file: sha256; key: the value as JSON text; flag: its text
    # (None when absent or unknown)
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
    # env: one flag of an argument string (`split_flags`); flag: one flag of a start command line in
    # a file (`delta_cmdline.per_flag`). `flag` is its name ("--tp"); `old` / `new` are its text on each
    # side (None: absent there); the words, evaluations and files above stay those of the whole value
    # or file; `args_old` / `args_new` are the whole strings (the command line's words) it was split from.
    flag: str | None = None
    args_old: str | None = None
    args_new: str | None = None
    # env only: the installed engine's name for what this variable or flag sets (`knobs.Knob.name`,
    # "SGLANG_X" for SGL_X too, "flag:page_size" for --page-size); None: no registry, or not its knob
    knob: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", DeltaKind(self.kind))

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
        elif self.kind == "flag":  # the flag's text on the line, masked as an argument string's flag is
            old, new = masker.mask_value(self.flag or "", old), masker.mask_value(self.flag or "", new)
        elif self.kind == "file":  # a whole file's side is its content's sha256: keyed, as it goes out to people
            old, new = (None if v is None else masker.content_digest(v) for v in (old, new))
        return {"id": self.id, "kind": self.kind.value, "host": self.host, "service": self.service, "path": self.path,
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
    # a key no file sets (not in its env file today nor at the baseline) and the baseline's process
    # did not have: the env file it is not set in (state/delta_env._hand_started); None otherwise
    where: str | None = None

    def to_json(self, masker: SecretMasker) -> dict[str, Any]:
        return {"host": self.host, "service": self.service, "key": self.key, "where": self.where,
                "file": masker.mask_value(self.key, self.file_value),
                "file_text": masker.mask_value(self.key, self.file_text), "evaluated": self.evaluated,
                "file_shown": self.shown(masker),
                "process": masker.mask_value(self.key, self.process_value), "pid": self.pid,
                "started_at": iso_time(self.started_at)}

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
    # the distributions a service's python sees in another version than at the baseline (state/upgrades.py)
    upgrades: tuple[Any, ...] = ()

    def links(self) -> list[list[str]]:
        """Env and flag deltas of the same change (key, flag or knob) in several places: these often must
        change together."""
        by_key: dict[tuple[str, str, str | None], list[str]] = {}
        for d in self.deltas:
            if d.kind in ("env", "flag"):
                by_key.setdefault(same_change(d), []).append(d.id)
        return [ids for ids in by_key.values() if len(ids) > 1]

    def to_json(self, masker: SecretMasker) -> dict[str, Any]:
        b = self.baseline
        return {
            "since": iso_time(self.since),
            "baseline": ({"snapshot": b.id, "label": b.label, "taken_at": b.taken_at_iso} if b else
                         {"snapshot": None, "sources": fallback_sources(self), "hint": SNAPSHOT_HINT}),
            "current": {"snapshot": self.current.id, "taken_at": self.current.taken_at_iso},
            "deltas": [d.to_json(masker) for d in self.deltas],
            "drift": [d.to_json(masker) for d in self.drift],
            "links": self.links(),
            "unknown_processes": list(self.unknown_processes),
            "notes": [masker.redact_text(n) for n in self.notes],
            "upgrades": [u.to_json() for u in self.upgrades],
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
    since = iso_time(diff.since) or "TIME"
    where = (f"the oldest snapshot of this deployment, {oldest[0]}, is from {iso_time(oldest[1])}" if oldest
             else "there is no snapshot of this deployment in the store")
    used = "; ".join(f"{_SOURCE_WORDS.get(k, k)} ({n} delta{'s' if n != 1 else ''})" for k, n in sorted(counts.items()))
    return (f"no snapshot taken at or before {since} ({where}): old values came from "
            f"{used or 'no other source (nothing found older than that time)'}; {SNAPSHOT_HINT}")


def iso_time(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()



def parse_env_bytes(content: bytes | None) -> EnvFile | None:
    """An env file's bytes as an EnvFile; None when absent or not parseable."""
    if content is None:
        return None
    try:
        return parse_env(content.decode("utf-8", "surrogateescape"))
    except EnvFileError:
        return None


@dataclass(frozen=True)
class HostSides:
    """One host in both snapshots, and what every delta kind needs besides to compare it."""

    name: str
    cur: HostState
    base: HostState | None
    base_id: str | None  # the baseline snapshot's id (None: no baseline snapshot)
    since: float | None
    contents: dict[str, bytes] = field(compare=False)  # sha256 -> bytes of file sides, filled by the kinds


@dataclass(frozen=True)
class Found:
    """What one delta kind found on one host: its deltas, and notes on what it could not compare."""

    deltas: tuple[Delta, ...] = ()
    notes: tuple[str, ...] = ()
    drift: tuple[Drift, ...] = ()  # env files only: running processes that differ from their file
    unknown_processes: tuple[str, ...] = ()  # env files only: services whose start environment was unreadable
