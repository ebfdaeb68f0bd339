"""Redaction on the way in: a RunRecord never holds a raw secret (see envbisect.report)."""
from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from envbisect.state import rundir
from envbisect.errors import UsageError
from envbisect.inputs.masking import KEY_NAME_RE, SecretMasker
from envbisect.report.common import ANSI_RE, MIN_RAW_SECRET, NUMBER_RE, TRIVIAL_VALUES
from envbisect.state.store import Store

# ------------------------------------------------------------------------------------- redaction

class Redactor:
    """`masker.redact_text` plus literal replacement of known raw secret values."""

    def __init__(self, masker: SecretMasker, raw_values: Iterable[str] = ()):
        self.masker = masker
        vals = {v for v in raw_values if isinstance(v, str) and len(v.strip()) >= MIN_RAW_SECRET
                and v.strip().lower() not in TRIVIAL_VALUES and not NUMBER_RE.fullmatch(v.strip())}
        self.raw_values: tuple[str, ...] = tuple(sorted(vals, key=lambda v: (-len(v), v)))
        masker.learn_values(self.raw_values)  # one redaction path: the masker knows them from now on

    def mask(self, value: str) -> str:
        """The masked form of one secret value (hint + short hash, as the masker writes it)."""
        return self.masker.mask_value("SECRET", value) or ""

    def raw(self, s: str) -> str:
        """Only the literal replacement of known raw secret values (safe on markup)."""
        for v in self.raw_values:
            if v in s:
                s = s.replace(v, self.mask(v))
        return s

    def text(self, s: str) -> str:
        """Terminal escape sequences removed (a colour code between NAME and =VALUE would hide the
        pair from the masker), known raw secret values replaced, then the masker's redaction."""
        if not s:
            return s
        if "\x1b" in s:
            s = ANSI_RE.sub("", s)
        for v in self.raw_values:
            if v in s:
                s = s.replace(v, self.mask(v))
        return self.masker.redact_text(s)

    def obj(self, o: Any, key: str | None = None) -> Any:
        """Every string (dict keys too) of a JSON-like value redacted; a string under a secret-named
        variable (``"HF_TOKEN": "…"``, as in a process environment) is masked whole. Only keys shaped
        like a variable name count: ``"decode:HF_TOKEN"`` is a delta id, not a variable."""
        if isinstance(o, str):
            if key is not None and self.masker.is_secret_name(key):
                return self.masker.mask_value(key, self.text(o))
            return self.text(o)
        if isinstance(o, Mapping):
            return {self.text(str(k)): self.obj(v, str(k) if KEY_NAME_RE.fullmatch(str(k)) else None)
                    for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [self.obj(v, key) for v in o]
        return o

    def json_text(self, o: Any, *, indent: int | None = 1, sort_keys: bool = False) -> str:
        """Redacted JSON: the structure is redacted string by string, then the whole text goes through
        `text` once more (unless that would break the JSON)."""
        safe = json.dumps(self.obj(o), indent=indent, sort_keys=sort_keys, ensure_ascii=False, default=str)
        again = self.text(safe)
        if again != safe:
            try:
                json.loads(again)
                return again
            except ValueError:
                pass
        return safe


def _env_values(content: bytes | str | None) -> dict[str, str]:
    if content is None:
        return {}
    from envbisect.inputs.envfile import EnvFileError, parse_env

    text = content.decode("utf-8", "surrogateescape") if isinstance(content, bytes) else content
    try:
        return parse_env(text).values()
    except (EnvFileError, ValueError):
        return {}


def load_snapshot_doc(store_root: Path, snap_id: str | None) -> dict[str, Any] | None:
    """The stored JSON of a snapshot (file contents are blob references), or None."""
    return Store(store_root).snapshot_doc(snap_id)


def secret_raw_values(run_dir: Path, masker: SecretMasker) -> set[str]:
    """Raw secrets of every variable this run knows (`SecretMasker.secret_parts`: the value of a
    secret-named or token-shaped variable, the secret parts of any other, such as a netrc password
    inside an innocent one): its env deltas (old and new), the env files and process environments of
    its baseline and current snapshots, and the original env files in its journal."""
    run = rundir.RunDir(Path(run_dir))
    store = run.store
    out: set[str] = set()
    doc = run.read_any(rundir.RUN) or {}
    try:  # run.json holds its deltas masked; the raw ones are in the blob it names
        raw_deltas = store.run_deltas(doc) if isinstance(doc, dict) else []
    except UsageError:
        raw_deltas = []
    for d in raw_deltas:
        if d.get("kind") == "env":
            for v in (d.get("old"), d.get("new"), d.get("old_word"), d.get("new_word"),
                      d.get("old_eval"), d.get("new_eval"), d.get("args_old"), d.get("args_new")):
                out.update(masker.secret_parts(d.get("key") or "", v if isinstance(v, str) else None))
    for sid in (doc.get("baseline"), doc.get("current")):
        snap = store.snapshot_doc(sid)
        for h in (snap or {}).get("hosts", {}).values():
            for p in (h.get("env_files") or {}).values():
                f = (h.get("files") or {}).get(p) or {}
                for k, v in _env_values(store.read_blob(f.get("blob"))).items():
                    out.update(masker.secret_parts(k, v))
            for proc in (h.get("processes") or {}).values():
                for k, v in [*(proc.get("environ") or {}).items(), *(proc.get("file_eval") or {}).items()]:
                    out.update(masker.secret_parts(str(k), v if isinstance(v, str) else None))
    journal = run.read_any(rundir.JOURNAL) or {}
    for h in (journal.get("hosts") or {}).values():
        for f in (h.get("files") or {}).values():
            b64 = f.get("content_b64")
            if not b64:
                continue
            try:
                content = base64.b64decode(b64)
            except ValueError:
                continue
            for k, v in _env_values(content).items():
                out.update(masker.secret_parts(k, v))
    return out


def default_masker(run_dir: Path) -> SecretMasker:
    """The masker of the run's playbook ([secrets] names/values) when it can be read, else the
    built-in rules only."""
    rd = rundir.RunDir(Path(run_dir))
    doc = rd.read_any(rundir.RUN) or {}
    key = _store_key(Path(run_dir))
    pb = doc.get("playbook")
    if pb and Path(pb).exists():
        try:
            from envbisect.inputs.playbook import load_playbook

            p = load_playbook(pb)
            return SecretMasker(p.secret_names, p.secret_values, key=key)
        except Exception:  # noqa: BLE001 - a broken playbook must not stop a postmortem
            pass
    return SecretMasker(key=key)


def _store_key(run_dir: Path) -> bytes | None:
    """The mask key of the store STORE/runs/ID belongs to (a fleet replica's folder is one deeper)."""
    from envbisect.state.store import JOURNAL_KEY, Store

    for root in (run_dir.parent.parent, run_dir.parent.parent.parent):
        if (root / JOURNAL_KEY).is_file():
            return Store(root).mask_key()
    return None


def make_redactor(run_dir: Path, masker: SecretMasker | None = None) -> Redactor:
    masker = masker or default_masker(run_dir)
    return Redactor(masker, secret_raw_values(run_dir, masker))
