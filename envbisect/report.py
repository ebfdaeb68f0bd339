"""The postmortem report of one bisection run: Markdown and self-contained HTML.

`load_run(run_dir)` reads everything a run left in `runs/RUN_ID/` (run.json, trials.jsonl,
verdict.json, events.jsonl, environment.json, evidence/, a summary of journal.json) plus the
baseline and current snapshots from the store, and REDACTS it on the way in: a `RunRecord` never
holds a raw secret, so `render_markdown` / `render_html` can be handed to anyone.

Redaction (`Redactor`) = the masker's `redact_text` on every string (secret shapes, secret
``NAME=VALUE`` forms, the playbook's [secrets]) plus a literal replacement of the raw values of
every secret-named variable the run knows about (its env deltas, the env files and process
environments of both snapshots, the journal's original env files): those values can show up in a
log line without any recognisable shape.

The report tells the story to someone who was not there: the question, the deltas, the premise
checks and what they meant, a timeline, every trial, the verdict, the layered path check
(not-config), drift hints (not-reproduced), the end state and the versions.
"""
from __future__ import annotations

import base64
import contextvars
import hashlib
import html
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from . import rundir
from .errors import UsageError
from .masking import SecretMasker

__all__ = ["RunRecord", "Redactor", "load_run", "make_redactor", "render_markdown", "render_html",
           "OUTCOME_COLORS"]

OUTCOME_COLORS = {"pass": "#2e7d32", "fail": "#d32f2f", "start-failure": "#7f0000", "unresolved": "#9e9e9e"}
_OUTCOME_LETTER = {"pass": "P", "fail": "F", "start-failure": "S", "unresolved": "U"}
# Raw values of secret-named variables are replaced literally wherever they appear, except values
# shorter than this, plain numbers (SGLANG_TOKEN_LIMIT=4096 is not a secret worth masking every "4096"
# for) and these literals: they would match everywhere. They are still masked wherever they appear as
# NAME=VALUE or under their variable's name.
_MIN_RAW_SECRET = 4
_TRIVIAL_VALUES = frozenset({"true", "false", "none", "null", "yes", "no", "on", "off", "unset", "empty"})
_NUMBER_RE = re.compile(r"[+-]?\d+(?:\.\d+)?")
_LOG_LINES = 40  # log lines per service and trial shown in the report (the bundle has the full capture)
_VAR_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# terminal escape sequences (CSI colour codes, OSC titles, two-byte escapes)
_ANSI_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")

# The masker of the record being rendered: every piece of run data is passed through its
# redact_text once more as it is written out (piece by piece, never across markup).
_RENDER_MASKER: contextvars.ContextVar[SecretMasker | None] = contextvars.ContextVar("envbisect_render_masker",
                                                                                     default=None)


def _t(s: Any) -> str:
    """Run data as text, redacted by the masker of the record being rendered."""
    s = "" if s is None else str(s)
    m = _RENDER_MASKER.get()
    return m.redact_text(s) if m is not None and s else s


# ------------------------------------------------------------------------------------- redaction

class Redactor:
    """`masker.redact_text` plus literal replacement of known raw secret values."""

    def __init__(self, masker: SecretMasker, raw_values: Iterable[str] = ()):
        self.masker = masker
        vals = {v for v in raw_values if isinstance(v, str) and len(v.strip()) >= _MIN_RAW_SECRET
                and v.strip().lower() not in _TRIVIAL_VALUES and not _NUMBER_RE.fullmatch(v.strip())}
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
            s = _ANSI_RE.sub("", s)
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
            return {self.text(str(k)): self.obj(v, str(k) if _VAR_NAME_RE.fullmatch(str(k)) else None)
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
    from .envfile import EnvFileError, parse_env

    text = content.decode("utf-8", "surrogateescape") if isinstance(content, bytes) else content
    try:
        return parse_env(text).values()
    except (EnvFileError, ValueError):
        return {}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError):
        return None


def _store_root(run_dir: Path) -> Path:
    return run_dir.parent.parent  # STORE/runs/RUN_ID


def _get_blob(store_root: Path, sha: str | None) -> bytes | None:
    if not sha or not all(c in "0123456789abcdef" for c in sha):
        return None
    try:
        return (store_root / "blobs" / sha[:2] / sha).read_bytes()
    except OSError:
        return None


def load_snapshot_doc(store_root: Path, snap_id: str | None) -> dict[str, Any] | None:
    """The stored JSON of a snapshot (file contents are blob references), or None."""
    if not snap_id or "/" in snap_id or snap_id.startswith("."):
        return None
    doc = _read_json(store_root / "snapshots" / f"{snap_id}.json")
    return doc if isinstance(doc, dict) else None


def secret_raw_values(run_dir: Path, masker: SecretMasker) -> set[str]:
    """Raw values of every secret-named variable this run knows: its env deltas (old and new), the
    env files and process environments of its baseline and current snapshots, and the original env
    files in its journal."""
    run_dir = Path(run_dir)
    out: set[str] = set()
    doc = _read_json(run_dir / rundir.RUN) or {}
    try:  # run.json holds its deltas masked; the raw ones are in the blob it names
        from .store import Store

        raw_deltas = Store(_store_root(run_dir)).run_deltas(doc) if isinstance(doc, dict) else []
    except UsageError:
        raw_deltas = []
    for d in raw_deltas:
        if d.get("kind") == "env" and masker.is_secret_name(d.get("key") or ""):
            out.update(v for v in (d.get("old"), d.get("new"), d.get("old_word"), d.get("new_word"),
                                   d.get("old_eval"), d.get("new_eval")) if isinstance(v, str))
    root = _store_root(run_dir)
    for sid in (doc.get("baseline"), doc.get("current")):
        snap = load_snapshot_doc(root, sid)
        for h in (snap or {}).get("hosts", {}).values():
            for p in (h.get("env_files") or {}).values():
                f = (h.get("files") or {}).get(p) or {}
                for k, v in _env_values(_get_blob(root, f.get("blob"))).items():
                    if masker.is_secret_name(k):
                        out.add(v)
            for proc in (h.get("processes") or {}).values():
                for k, v in [*(proc.get("environ") or {}).items(), *(proc.get("file_eval") or {}).items()]:
                    if masker.is_secret_name(k) and isinstance(v, str):
                        out.add(v)
    journal = _read_json(run_dir / rundir.JOURNAL) or {}
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
                if masker.is_secret_name(k):
                    out.add(v)
    return out


def default_masker(run_dir: Path) -> SecretMasker:
    """The masker of the run's playbook ([secrets] names/values) when it can be read, else the
    built-in rules only."""
    doc = _read_json(Path(run_dir) / rundir.RUN) or {}
    pb = doc.get("playbook")
    if pb and Path(pb).exists():
        try:
            from .playbook import load_playbook

            p = load_playbook(pb)
            return SecretMasker(p.secret_names, p.secret_values)
        except Exception:  # noqa: BLE001 - a broken playbook must not stop a postmortem
            pass
    return SecretMasker()


def make_redactor(run_dir: Path, masker: SecretMasker | None = None) -> Redactor:
    masker = masker or default_masker(run_dir)
    return Redactor(masker, secret_raw_values(run_dir, masker))


# ------------------------------------------------------------------------------------ the record

@dataclass(frozen=True)
class RunRecord:
    """Everything one run left behind, already redacted."""

    run_dir: Path
    run_id: str
    run: Mapping[str, Any]  # run.json; env delta values masked
    deltas: tuple[Mapping[str, Any], ...]  # masked (the diff's view)
    trials: tuple[Mapping[str, Any], ...]  # trials.jsonl (the final probe of --leave fixed included)
    verdict: Mapping[str, Any] | None  # None: the run did not finish
    events: tuple[Mapping[str, Any], ...]
    environment: Mapping[str, Any]
    evidence: Mapping[str, Mapping[str, str]]  # "trial-001" -> {"decode.log.txt": text}
    journal_summary: Mapping[str, Any] | None
    snapshots: Mapping[str, Mapping[str, Any] | None]  # "baseline"/"current" -> summary (no contents)
    finished_at: float | None = None  # when the run concluded (its last event), None if unfinished
    problems: tuple[str, ...] = field(default=())
    masker: SecretMasker = field(default_factory=SecretMasker, repr=False, compare=False)

    @property
    def diff(self) -> Mapping[str, Any]:
        return self.run.get("diff") or {}

    @property
    def units(self) -> dict[str, list[str]]:
        u = (self.verdict or {}).get("units") or self.run.get("units") or {}
        return {k: list(v) for k, v in u.items()}

    @property
    def culprit_units(self) -> list[str]:
        return list((self.verdict or {}).get("culprit_units") or [])


def journal_summary(doc: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What the journal recorded, without the contents: paths, modes, owners, sizes, sha256."""
    if not isinstance(doc, Mapping):
        return None
    hosts = {}
    for h, hd in (doc.get("hosts") or {}).items():
        files = []
        for p, f in sorted((hd.get("files") or {}).items()):
            raw = None
            if f.get("content_b64"):
                try:
                    raw = base64.b64decode(f["content_b64"])
                except ValueError:
                    raw = None
            files.append({"path": p, "exists": f.get("exists"),
                          "mode": None if f.get("mode") is None else oct(f["mode"] & 0o7777),
                          "uid": f.get("uid"), "gid": f.get("gid"), "mtime_ns": f.get("mtime_ns"),
                          "size": None if raw is None else len(raw),
                          "sha256": None if raw is None else hashlib.sha256(raw).hexdigest()})
        repos = [{"path": p, "head": r.get("head"), "ref": r.get("ref")} for p, r in sorted((hd.get("repos") or {}).items())]
        hosts[h] = {"files": files, "repos": repos}
    return {"run_id": doc.get("run_id"), "deployment": doc.get("deployment"), "created_at": doc.get("created_at"),
            "state": doc.get("state"), "hosts": hosts}


def snapshot_summary(doc: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not isinstance(doc, Mapping):
        return None
    hosts = {}
    for name, h in (doc.get("hosts") or {}).items():
        hosts[name] = {"hostname": h.get("hostname"), "tz": h.get("tz"), "clock_epoch": h.get("clock_epoch"),
                       "repos": {p: {k: r.get(k) for k in ("head", "branch", "dirty", "describe", "error")}
                                 for p, r in (h.get("repos") or {}).items()},
                       "processes": {s: {k: p.get(k) for k in ("status", "pid", "started_at")}
                                     for s, p in (h.get("processes") or {}).items()}}
    return {"id": doc.get("id"), "label": doc.get("label"), "taken_at": doc.get("taken_at"),
            "playbook": doc.get("playbook"), "hosts": hosts}


def _read_jsonl(path: Path, problems: list[str]) -> list[dict[str, Any]]:
    out = []
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return out
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            problems.append(f"{path.name} line {i}: not JSON (skipped)")
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def masked_deltas(run_doc: Mapping[str, Any], masker: SecretMasker) -> list[dict[str, Any]]:
    """The run's deltas as the diff shows them: env values through `mask_value`."""
    shown = {d.get("id"): d for d in ((run_doc.get("diff") or {}).get("deltas") or [])}
    out = []
    for d in run_doc.get("deltas") or []:
        m = dict(shown.get(d.get("id")) or d)
        m.pop("start_env", None)  # a process environment: not story material, and raw
        if d.get("kind") == "env":
            key = d.get("key") or ""
            m["old"], m["new"] = masker.mask_value(key, d.get("old")), masker.mask_value(key, d.get("new"))
            for f in ("old_word", "new_word", "old_eval", "new_eval"):
                m[f] = masker.mask_value(key, d.get(f))
        out.append(m)
    if not out:
        out = [dict(d) for d in shown.values()]
    return out


def load_run(run_dir: Path, masker: SecretMasker | None = None, *, redactor: Redactor | None = None) -> RunRecord:
    """Read a run directory (and its snapshots from the store) into a redacted `RunRecord`.

    `masker` defaults to the run's playbook secrets (when the playbook is still there) plus the
    built-in rules."""
    run_dir = Path(run_dir)
    doc = _read_json(run_dir / rundir.RUN)
    if not isinstance(doc, dict):
        from .errors import UsageError

        raise UsageError(f"{run_dir}: no readable run.json (not a run directory?)")
    rd = redactor or make_redactor(run_dir, masker)
    problems: list[str] = []
    run = dict(doc)
    run["deltas"] = masked_deltas(doc, rd.masker)
    run.pop("contents", None)  # sha256 -> blob references of file deltas: not story material
    run = rd.obj(run)
    trials = _read_jsonl(run_dir / rundir.TRIALS, problems)
    events = _read_jsonl(run_dir / rundir.EVENTS, problems)
    verdict = _read_json(run_dir / rundir.VERDICT)
    if (run_dir / rundir.VERDICT).exists() and not isinstance(verdict, dict):
        problems.append("verdict.json is not readable JSON")
        verdict = None
    # verdict.json is written right after the last event (the restore): that is when the run concluded
    stamps = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    finished = max(stamps) if isinstance(verdict, dict) and stamps else None
    environment = _read_json(run_dir / rundir.ENVIRONMENT) or {}
    evidence: dict[str, dict[str, str]] = {}
    ev_dir = run_dir / rundir.EVIDENCE
    if ev_dir.is_dir():
        for tdir in sorted(p for p in ev_dir.iterdir() if p.is_dir()):
            files = {}
            for f in sorted(p for p in tdir.iterdir() if p.is_file()):
                try:
                    files[f.name] = rd.text(f.read_bytes().decode("utf-8", "replace"))
                except OSError as e:
                    problems.append(f"evidence/{tdir.name}/{f.name}: {e.strerror}")
            evidence[rd.text(tdir.name)] = files
    root = _store_root(run_dir)
    snaps = {"baseline": snapshot_summary(load_snapshot_doc(root, doc.get("baseline"))),
             "current": snapshot_summary(load_snapshot_doc(root, doc.get("current")))}
    return RunRecord(
        run_dir=run_dir, run_id=str(doc.get("run_id") or run_dir.name), run=run,
        deltas=tuple(run["deltas"]), trials=tuple(rd.obj(trials)),
        verdict=rd.obj(verdict) if isinstance(verdict, dict) else None, events=tuple(rd.obj(events)),
        environment=rd.obj(environment), evidence=evidence,
        journal_summary=rd.obj(journal_summary(_read_json(run_dir / rundir.JOURNAL))),
        snapshots=rd.obj(snaps), finished_at=finished, problems=tuple(problems), masker=rd.masker)


# ------------------------------------------------------------------------------- shared helpers

def _ts(t: Any) -> str:
    if not isinstance(t, (int, float)):
        return "?" if t is None else str(t)
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _clock(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """HH:MM:SS per timeline row, with the date where it changes (and on the first row)."""
    out, day = [], None
    for r in rows:
        t = r.get("ts")
        if not isinstance(t, (int, float)):
            out.append("?")
            continue
        d = datetime.fromtimestamp(t, timezone.utc)
        stamp = d.strftime("%H:%M:%S")
        if d.date() != day:
            day = d.date()
            stamp = d.strftime("%Y-%m-%d ") + stamp
        out.append(stamp)
    return out


def _rel(t: Any, t0: float | None) -> str:
    if not isinstance(t, (int, float)) or t0 is None:
        return ""
    s = max(0, int(round(t - t0)))
    return f"+{s // 60}:{s % 60:02d}"


def _secs(x: Any, digits: int = 2) -> str:
    return f"{x:.{digits}f} s" if isinstance(x, (int, float)) else "—"


def _short(v: Any, kind: str | None = None) -> str:
    if v is None:
        return "(unset)" if kind == "env" else "—"
    s = str(v)
    if kind in ("git", "file") and len(s) >= 40 and all(c in "0123456789abcdef" for c in s):
        return s[:12]
    return s


def max_latency(trial: Mapping[str, Any]) -> float | None:
    lats = [q.get("latency_s") for r in (trial.get("probe") or {}).get("runs") or []
            for q in r.get("requests") or [] if isinstance(q.get("latency_s"), (int, float))]
    return max(lats) if lats else None


def _requests(trial: Mapping[str, Any]) -> list[tuple[int, Mapping[str, Any], Mapping[str, Any]]]:
    out = []
    for i, r in enumerate((trial.get("probe") or {}).get("runs") or [], 1):
        reqs = r.get("requests") or []
        if not reqs:
            out.append((i, r, {}))
        for q in reqs:
            out.append((i, r, q))
    return out


def _probe_target(rec: RunRecord) -> str | None:
    for t in rec.trials:
        for r in (t.get("probe") or {}).get("runs") or []:
            if r.get("target"):
                return f"{r.get('kind', '?')} → {r['target']}"
    return None


_PREMISE_MEANING = {
    ("current", "fail"): "Reproduced: the current configuration, co-restarted cleanly, fails the probe. "
                         "The failure is real and survives a proper co-restart.",
    ("current", "pass"): "Not reproduced: after a clean co-restart the current configuration passes. The deltas "
                         "themselves do not break the stack; look at how things were restarted (drift hints below).",
    ("baseline", "pass"): "The baseline (no deltas) passes under the same probe: the failure comes from one or more "
                          "of the deltas, so bisecting them is meaningful.",
    ("baseline", "fail"): "The baseline fails too: the failure is NOT caused by these deltas, so none is blamed "
                          "(verdict not-config); the layered path check says where the request breaks.",
    ("empty", "fail"): "There are no deltas and the baseline fails: not a configuration change.",
    ("empty", "pass"): "There are no deltas and the baseline passes: the failure was not reproduced.",
}


def _is_premise(trial: Mapping[str, Any]) -> bool:
    kind = trial.get("kind")
    if kind:
        return kind in ("premise-current", "premise-baseline")
    return str(trial.get("purpose", "")).startswith("premise")  # a record of an older version


def _premise(trial: Mapping[str, Any]) -> tuple[str, str]:
    kind = trial.get("kind")
    if kind:
        which = "baseline" if kind == "premise-baseline" else ("empty" if not trial.get("units") else "current")
    else:  # a record of an older version: only its purpose says
        p = str(trial.get("purpose") or "")
        which = "empty" if "no deltas" in p and "current" in p else ("current" if "current" in p else "baseline")
    o = trial.get("outcome")
    oc = "fail" if o in ("fail", "start-failure") else o
    meaning = _PREMISE_MEANING.get((which, oc)) or (
        "Could not tell: infrastructure trouble (SSH, a start command that could not run) makes a trial "
        "unresolved, never a failure; it was retried or the run stopped.")
    return which, meaning


_VERDICT_MEANING = {
    "culprit": "Each listed delta breaks the stack on its own: all of them must go.",
    "interaction": "The listed deltas break the stack only together; each alone passes.",
    "not-config": "The baseline fails too: no configuration delta is to blame. See the request path check.",
    "not-reproduced": "The current configuration passes after a clean co-restart: the failure came from how "
                      "things were (re)started, not from the deltas. See the drift hints.",
    "inconclusive": "The search stopped before reaching the required confidence; the remaining suspects and "
                    "their probabilities are listed.",
}

_STATE_MEANING = {
    "original": "The hosts were put back exactly as they were before the run (bytes, mode, owner, mtime, HEAD, "
                "branch) and co-restarted: the failure is live again until the culprit is removed.",
    "fixed": "The hosts were left at current minus the culprits: every exonerated delta stays applied, and a final "
             "probe proved that this configuration passes.",
    "unknown": "Unknown: the run did not finish cleanly. Run `envbisect restore` to undo it from its journal.",
}


def _timeline(rec: RunRecord) -> list[dict[str, Any]]:
    """(ts, kind, text) rows from events.jsonl, plus the conclusion."""
    rows = []
    for e in rec.events:
        k = e.get("kind")
        if k == "trial-start":
            cfg = e.get("config") or []
            shown = ", ".join(cfg) if len(cfg) <= 6 else ", ".join(cfg[:6]) + f", +{len(cfg) - 6} more"
            text = (f"trial {e.get('n')} started — {e.get('purpose')} — applying {len(cfg)} of "
                    f"{e.get('total_deltas', '?')} deltas" + (f" ({shown})" if cfg else " (the baseline)"))
        elif k == "trial-end":
            t = e.get("trial") or {}
            text = (f"trial {t.get('n')} ended — {str(t.get('outcome', '?')).upper()} — {t.get('reason', '')} "
                    f"(restart {_secs(t.get('restart_s'), 1)}, probe {_secs(t.get('probe_s'), 1)})")
            k = f"trial-end {t.get('outcome', '')}".strip()
        elif k == "step":
            text = str(e.get("message", ""))
        elif k == "interrupted":
            text = f"INTERRUPTED: {e.get('error', '')} — the hosts were restored"
        elif k == "resumed":
            text = f"resumed after {e.get('trials_done', '?')} finished trial(s)"
        else:
            rest = {a: b for a, b in e.items() if a not in ("ts", "kind")}
            text = str(rest.get("message") or rest.get("error") or json.dumps(rest, ensure_ascii=False))
        rows.append({"ts": e.get("ts"), "kind": k or "?", "text": text})
    v = rec.verdict
    if v:
        culprits = ", ".join(v.get("culprits") or []) or "none"
        rows.append({"ts": rec.finished_at, "kind": "verdict",
                     "text": f"concluded: {str(v.get('verdict', '?')).upper()} (confidence {v.get('confidence')}), "
                             f"culprits: {culprits}; hosts left {v.get('state_left')}"})
    return rows


def _question(rec: RunRecord) -> list[tuple[str, str]]:
    r, d = rec.run, rec.diff
    b = d.get("baseline") or {}
    c = d.get("current") or {}
    if r.get("baseline"):
        base = f"snapshot {r.get('baseline')}" + (f" (label '{b['label']}')" if b.get("label") else "")
        base += f", taken {b.get('taken_at') or _ts((rec.snapshots.get('baseline') or {}).get('taken_at'))}"
    else:
        base = "no baseline snapshot: old values from " + (", ".join(b.get("sources") or []) or "fallback sources")
    o = r.get("options") or {}
    opts = [f"confidence ≥ {o.get('confidence')}", f"leave {o.get('leave')}"]
    if o.get("max_trials"):
        opts.append(f"max {o['max_trials']} trials")
    for k in ("only", "exclude", "link"):
        if o.get(k):
            opts.append(f"{k} {', '.join(o[k])}")
    rows = [("deployment", str(r.get("deployment", "?"))), ("playbook", str(r.get("playbook", "?"))),
            ("run", f"{rec.run_id}, started {_ts(r.get('created_at'))}"),
            ("known-good since", str(d.get("since") or _ts(r.get("since")))),
            ("baseline", base),
            ("current", f"snapshot {r.get('current')}, taken {c.get('taken_at', '?')}"),
            ("probe", str(r.get("probe")) + (f" ({t})" if (t := _probe_target(rec)) else "")),
            ("options", "; ".join(opts))]
    return rows


def _delta_unit(rec: RunRecord) -> dict[str, str]:
    out = {}
    for u, ds in rec.units.items():
        for d in ds:
            out[d] = u
    return out


def _culprit_deltas(rec: RunRecord) -> set[str]:
    return set((rec.verdict or {}).get("culprits") or [])


def _evidence_for(rec: RunRecord, n: Any) -> tuple[str, Mapping[str, str]]:
    key = f"trial-{int(n):03d}" if isinstance(n, int) else str(n)
    return key, rec.evidence.get(key) or {}


def _tail(text: str, n: int = _LOG_LINES) -> str:
    lines = text.rstrip("\n").splitlines()
    return "\n".join(lines[-n:])


def _env_rows(rec: RunRecord) -> list[tuple[str, str]]:
    env = rec.environment or {}
    rows = [("envbisect", str(env.get("envbisect", "?")))]
    c = env.get("controller") or {}
    if c:
        rows.append(("controller", f"{c.get('hostname', '?')}: kernel {c.get('kernel', '?')}, Python {c.get('python', '?')}"))
    for h, hd in sorted((env.get("hosts") or {}).items()):
        if hd.get("error"):
            rows.append((f"host {h}", f"could not be read: {hd['error']}"))
        else:
            rows.append((f"host {h}", f"{hd.get('hostname', '?')}: kernel {hd.get('kernel', '?')}, Python {hd.get('python', '?')}"))
    for role in ("baseline", "current"):
        s = rec.snapshots.get(role) or {}
        for h, hd in sorted((s.get("hosts") or {}).items()):
            for p, r in sorted((hd.get("repos") or {}).items()):
                desc = r.get("describe") or (r.get("head") or "?")[:12]
                extra = (f" on {r['branch']}" if r.get("branch") else "") + (" (dirty)" if r.get("dirty") else "")
                rows.append((f"repo {h}:{p} ({role})", f"{desc}{extra}"))
    return rows


def _trial_label(t: Mapping[str, Any]) -> str:
    return f"trial {t.get('n')} · {str(t.get('outcome', '?')).upper()} · {t.get('purpose', '')}"


# ------------------------------------------------------------------------------------- Markdown

def _md(s: Any) -> str:
    """Text safe inside a Markdown table cell."""
    s = _t(s)
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ").replace("`", "'")


def _md_table(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(_md(h) for h in head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        out.append("| " + " | ".join(_md(c) for c in r) + " |")
    return out


def _fence(text: str) -> list[str]:
    fence = "```"
    while fence in text:
        fence += "`"
    return [fence + "text", text, fence]


def _text_grid(rec: RunRecord) -> list[str]:
    units = list(rec.units)
    if not rec.trials:
        return []
    width = min(max((len(u) for u in units), default=7), 60)
    culprits = set(rec.culprit_units)
    head = " " * (width + 3) + " ".join(f"{t.get('n', '?'):>2}" for t in rec.trials)
    lines = [head]
    for u in units:
        mark = "!" if u in culprits else " "
        cells = " ".join(" ■" if u in (t.get("units") or []) else " ·" for t in rec.trials)
        lines.append(f"{mark} {u[:width]:<{width}} {cells}")
    lines.append(f"  {'outcome':<{width}} " + " ".join(f"{_OUTCOME_LETTER.get(t.get('outcome'), '?'):>2}"
                                                      for t in rec.trials))
    lines.append(f"  {'max latency s':<{width}} " + " ".join(
        _grid_lat(max_latency(t)) for t in rec.trials))
    lines.append("")
    lines.append("■ applied · not applied   P pass  F fail  S start-failure  U unresolved   ! culprit")
    return _fence("\n".join(lines))


def _grid_lat(x: float | None) -> str:
    if x is None:
        return " —"
    return f"{x:>2.0f}" if x >= 1 else "<1"


def render_markdown(run: RunRecord) -> str:
    """The report as Markdown (GitHub flavour: tables, fenced logs)."""
    token = _RENDER_MASKER.set(run.masker)
    try:
        return _render_markdown(run)
    finally:
        _RENDER_MASKER.reset(token)


def _render_markdown(rec: RunRecord) -> str:
    v = rec.verdict or {}
    out: list[str] = []
    kind = str(v.get("verdict") or "unfinished")
    out.append(f"# envbisect run {rec.run_id}: {kind.upper()}")
    out.append("")
    if v:
        culprits = ", ".join(v.get("culprits") or []) or "none"
        out.append(f"**Verdict: {kind}** · confidence {v.get('confidence')} · culprit(s): {culprits} · "
                   f"{v.get('restarts', len(rec.trials))} restarts · hosts left {v.get('state_left')}")
    else:
        out.append("**No verdict: the run did not finish** (interrupted, crashed, or still running). "
                   "Resume with `envbisect bisect --resume` or undo it with `envbisect restore`.")
    out.append("")

    out += ["## The question", ""]
    out += _md_table(["", ""], _question(rec))
    out.append("")

    out += ["## What changed (deltas)", ""]
    du = _delta_unit(rec)
    cul = _culprit_deltas(rec)
    if rec.deltas:
        out += _md_table(["delta", "kind", "change", "old", "new", "old value from", "linked unit"],
                         [((("**" + d.get("id", "?") + "** (culprit)") if d.get("id") in cul else d.get("id", "?")),
                           d.get("kind"), d.get("change"), _short(d.get("old"), d.get("kind")),
                           _short(d.get("new"), d.get("kind")), d.get("baseline_source"),
                           du.get(d.get("id"), "") if du.get(d.get("id")) != d.get("id") else "")
                          for d in rec.deltas])
    else:
        out.append("No deltas.")
    out.append("")
    diff = rec.diff
    for dr in diff.get("drift") or []:
        out.append(f"- drift: {_t(dr.get('service'))} (pid {dr.get('pid')}) runs with "
                   f"`{_t(dr.get('key'))}={_t(dr.get('process'))}` while its file says `{_t(dr.get('file'))}`")
    for link in diff.get("links") or []:
        out.append(f"- linked: {_t(', '.join(link))} changed the same way")
    for s in diff.get("unknown_processes") or []:
        out.append(f"- {_t(s)}: start environment unknown (overwritten by the program)")
    for n in diff.get("notes") or []:
        out.append(f"- note: {_t(n)}")
    if any(diff.get(k) for k in ("drift", "links", "unknown_processes", "notes")):
        out.append("")

    out += ["## Premise checks", ""]
    premises = [t for t in rec.trials if _is_premise(t)]
    if premises:
        for t in premises:
            _w, meaning = _premise(t)
            out.append(f"- **trial {t.get('n')} — {_t(t.get('purpose'))} — {str(t.get('outcome')).upper()}** "
                       f"({_t(t.get('reason'))}). {meaning}")
    else:
        out.append("No premise check was run.")
    out.append("")

    out += ["## Timeline", ""]
    tl = _timeline(rec)
    t0 = next((r["ts"] for r in tl if isinstance(r["ts"], (int, float))), None)
    out.append("Times are UTC.")
    out.append("")
    out += _md_table(["time", "", "event"], [(c, _rel(r["ts"], t0), r["text"]) for r, c in zip(tl, _clock(tl))])
    out.append("")

    out += ["## Trials", ""]
    out += _text_grid(rec)
    out.append("")
    out += _md_table(["#", "purpose", "deltas applied", "outcome", "reason", "restart", "probe", "max latency"],
                     [(t.get("n"), t.get("purpose"), len(t.get("config") or []), t.get("outcome"), t.get("reason"),
                       _secs(t.get("restart_s"), 1), _secs(t.get("probe_s"), 1), _secs(max_latency(t)))
                      for t in rec.trials])
    out.append("")
    for t in rec.trials:
        out += [f"### Trial {t.get('n')} — {_t(t.get('outcome'))} — {_t(t.get('purpose'))}", ""]
        cfg = t.get("config") or []
        out.append(f"- configuration: baseline + {len(cfg)} delta(s)" + (": " + _t(", ".join(cfg)) if cfg else " (the baseline)"))
        out.append(f"- started {_ts(t.get('started_at'))}; outcome **{_t(t.get('outcome'))}** — {_t(t.get('reason'))}")
        rd = t.get("restart_durations") or {}
        out.append(f"- co-restart {_secs(t.get('restart_s'), 2)}" +
                   (" (" + ", ".join(f"{k} {_secs(x, 2)}" for k, x in rd.items()) + ")" if rd else "") +
                   f"; probing {_secs(t.get('probe_s'), 2)}")
        reqs = _requests(t)
        if reqs:
            out.append("")
            out += _md_table(["run", "req", "ok", "status", "latency", "error / answer excerpt"],
                             [(i, q.get("n", ""), "yes" if q.get("ok") else ("no" if q else ""), q.get("status") or "—",
                               _secs(q.get("latency_s"), 3) if q else _secs(r.get("duration_s"), 3),
                               (q.get("error") or q.get("excerpt") or "")[:120] if q else r.get("reason"))
                              for i, r, q in reqs])
        if t.get("log_tail"):
            out.append("")
            out.append("Log tail at the failure:")
            out += _fence(_t(_tail(str(t["log_tail"]), 20)))
        key, ev = _evidence_for(rec, t.get("n"))
        if ev:
            out.append("")
            out.append(f"Evidence captured right after the trial (`evidence/{_t(key)}/`): " + _t(", ".join(sorted(ev))))
            if t.get("outcome") in ("fail", "start-failure"):
                for name, text in sorted(ev.items()):
                    if name.endswith((".log.txt", ".error.txt")) and text.strip():
                        out.append("")
                        out.append(f"{_t(name)} (last {min(12, len(text.splitlines()))} lines):")
                        out += _fence(_t(_tail(text, 12)))
        out.append("")

    out += ["## Verdict", ""]
    if v:
        out.append(f"**{kind.upper()}** — confidence {v.get('confidence')}, {v.get('restarts')} restarts.")
        out.append("")
        out.append(_VERDICT_MEANING.get(kind, ""))
        out.append("")
        if v.get("culprits"):
            dmap = {d.get("id"): d for d in rec.deltas}
            for c in v["culprits"]:
                d = dmap.get(c, {})
                out.append(f"- culprit **{_t(c)}**: `{_t(_short(d.get('old'), d.get('kind')))}` → "
                           f"`{_t(_short(d.get('new'), d.get('kind')))}`")
            out.append("")
        out.append(f"Explanation. {_t(v.get('explanation', ''))}")
        out.append("")
        if v.get("suspects"):
            out += _md_table(["suspect unit", "probability it is to blame"],
                             [(s.get("unit"), s.get("p")) for s in v["suspects"]])
            out.append("")
        for n in v.get("notes") or []:
            out.append(f"- note: {_t(n)}")
    else:
        out.append("No verdict was written.")
        for e in rec.events:
            if e.get("kind") in ("interrupted", "restore-failed"):
                out.append(f"- {_t(e.get('kind'))} — {_t(e.get('error'))}")
    out.append("")

    path = v.get("path")
    if path:
        out += ["## Request path, layer by layer", ""]
        out += _md_table(["layer", "target", "result", "reason"],
                         [(l.get("layer"), l.get("target"), "ok" if l.get("ok") else "BROKEN", l.get("reason"))
                          for l in path.get("layers") or []])
        out.append("")
        out.append(f"Broken at **{_t(path.get('broken_at') or 'nowhere')}**. {_t(path.get('conclusion', ''))}")
        out.append("")
    if v.get("drift_hint"):
        out += ["## Drift hints", ""]
        out += [f"- {_t(h)}" for h in v["drift_hint"]]
        out.append("")

    out += ["## End state", ""]
    state = v.get("state_left") or "unknown"
    out.append(f"**{state}**: {_STATE_MEANING.get(state, '')}")
    fp = v.get("final_probe")
    if fp:
        out.append(f"Final probe (trial {fp.get('n')}) — **{_t(fp.get('outcome'))}** — {_t(fp.get('reason'))}")
    out.append("")

    out += ["## Environment and versions", ""]
    out += _md_table(["", ""], _env_rows(rec))
    out.append("")
    js = rec.journal_summary
    if js:
        out.append(f"Journal ({js.get('state')}): the original state of "
                   f"{sum(len(h['files']) for h in js['hosts'].values())} file(s) and "
                   f"{sum(len(h['repos']) for h in js['hosts'].values())} repo(s) was recorded before the first edit.")
        out.append("")
    if rec.problems:
        out += ["## Problems reading the run", ""] + [f"- {_t(p)}" for p in rec.problems] + [""]
    out.append(f"_Secrets are masked (`••••(masked, sha256:…)`). Generated by envbisect {_version()} from "
               f"run {rec.run_id}._")
    return "\n".join(out) + "\n"


def _version() -> str:
    from . import __version__

    return __version__


# ----------------------------------------------------------------------------------------- HTML

def _h(s: Any) -> str:
    return html.escape(_t(s), quote=True)


_CSS = """
:root{--pass:#2e7d32;--fail:#d32f2f;--sfail:#7f0000;--unres:#9e9e9e;--ink:#1d232a;--muted:#5f6b76;--line:#d9dee3}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:var(--ink);
margin:0;background:#f5f7f9}
main{max-width:1180px;margin:0 auto;padding:24px 28px 48px;background:#fff;min-height:100vh}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;padding-bottom:4px;border-bottom:1px solid var(--line)}
h3{font-size:14px;margin:18px 0 6px}
.sub{color:var(--muted);margin:0 0 14px}
code,pre,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace;font-size:12.5px}
pre{background:#f3f5f7;border:1px solid var(--line);padding:8px 10px;overflow:auto;max-height:420px;white-space:pre-wrap;
word-break:break-all;margin:6px 0}
table{border-collapse:collapse;margin:6px 0 10px;width:100%}
th,td{border:1px solid var(--line);padding:4px 7px;text-align:left;vertical-align:top}
th{background:#f0f3f6;font-weight:600}
td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
table.kv th{width:170px;white-space:nowrap}
.badge{display:inline-block;padding:1px 7px;border-radius:9px;color:#fff;font-size:12px;font-weight:600;white-space:nowrap}
.o-pass{background:var(--pass)}.o-fail{background:var(--fail)}.o-start-failure{background:var(--sfail)}
.o-unresolved{background:var(--unres)}.o-none{background:#607d8b}
#verdict{border:2px solid #607d8b;border-radius:8px;padding:12px 16px;margin:14px 0;background:#fafbfc}
#verdict.v-culprit,#verdict.v-interaction{border-color:var(--fail);background:#fff6f6}
#verdict.v-not-config{border-color:#ef6c00;background:#fff8f0}
#verdict.v-not-reproduced{border-color:#1565c0;background:#f3f8ff}
#verdict .kind{font-size:20px;font-weight:700;letter-spacing:.02em}
#verdict .culprit{font-family:ui-monospace,Menlo,Consolas,monospace;font-weight:700;color:var(--fail)}
.meaning{margin:6px 0}
.premise{border-left:4px solid var(--line);padding:4px 10px;margin:6px 0}
.premise.ok{border-color:var(--pass)}.premise.bad{border-color:var(--fail)}
.chart{overflow-x:auto;border:1px solid var(--line);border-radius:6px;padding:8px;background:#fff}
tr.culprit td:first-child{font-weight:700;color:var(--fail)}
tr.k-trial-start td{background:#eef2f6;font-weight:600}
table.timeline td{padding:2px 7px}table.timeline td.num{color:var(--muted)}
table.timeline tr.k-step td:last-child{color:var(--muted);font-size:12.5px}
details{margin:4px 0}summary{cursor:pointer;color:#34495e}details pre{max-height:280px}
/* a log box opens scrolled to its newest lines, without script */
pre.tail{display:flex;flex-direction:column-reverse}
.trial{border:1px solid var(--line);border-radius:6px;padding:6px 12px;margin:10px 0}
.muted{color:var(--muted)}
footer{margin-top:30px;color:var(--muted);font-size:12px}
@media print{body{background:#fff}main{padding:0}pre{max-height:none}}
"""


def _badge(outcome: Any) -> str:
    o = str(outcome or "none")
    cls = o if o in OUTCOME_COLORS else "none"
    return f'<span class="badge o-{_h(cls)}">{_h(o.upper())}</span>'


def _kv_table(rows: Iterable[tuple[str, str]]) -> str:
    return ('<table class="kv">' + "".join(f"<tr><th>{_h(k)}</th><td>{_h(v)}</td></tr>" for k, v in rows)
            + "</table>")


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], raw_cols: Iterable[int] = (), num_cols: Iterable[int] = (),
           row_classes: Sequence[str] | None = None) -> str:
    raw, num = set(raw_cols), set(num_cols)
    out = ["<table><thead><tr>" + "".join(f"<th>{_h(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for i, r in enumerate(rows):
        cls = f' class="{_h(row_classes[i])}"' if row_classes and row_classes[i] else ""
        cells = []
        for j, c in enumerate(r):
            content = c if j in raw else _h(c)
            cells.append(f'<td class="num">{content}</td>' if j in num else f"<td>{content}</td>")
        out.append(f"<tr{cls}>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def trials_svg(rec: RunRecord) -> str:
    """The trials chart: x = trial, one row per unit (applied or not), the outcome mark per trial, and a
    bar of the trial's max probe latency."""
    trials = list(rec.trials)
    units = list(rec.units)
    for t in trials:  # units a trial used that the unit map does not know (should not happen)
        for u in t.get("units") or []:
            if u not in units:
                units.append(u)
    culprits = set(rec.culprit_units)
    cw, rh = 30, 20
    label_w = min(380, max(120, 7 * max((len(u) for u in units), default=10) + 40))
    top = 34
    grid_h = rh * len(units)
    outcome_y = top + grid_h + 8
    lat_top = outcome_y + rh + 22
    lat_h = 70
    legend_y = lat_top + lat_h + 34
    width = max(label_w + cw * max(1, len(trials)) + 70, 600)  # at least the legend's width
    height = legend_y + 20
    lats = [max_latency(t) for t in trials]
    lmax = max([x for x in lats if x is not None] or [0.0])
    scale_max = max(lmax, 0.001)
    p: list[str] = [
        f'<svg id="trials-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" font-family="system-ui,Segoe UI,Arial,sans-serif" font-size="12" '
        f'aria-label="{_h(f"{len(trials)} trials: which units were applied, the outcome and the max probe latency of each")}">',
        f"<title>{_h(f'Trials of run {rec.run_id}')}</title>",
        f'<text x="{label_w - 8}" y="{top - 12}" text-anchor="end" fill="#5f6b76">trial →</text>',
    ]
    for i, t in enumerate(trials):
        x = label_w + i * cw
        p.append(f'<text x="{x + cw / 2}" y="{top - 12}" text-anchor="middle" font-weight="600">{_h(t.get("n"))}</text>')
    for j, u in enumerate(units):
        y = top + j * rh
        if j % 2 == 0:
            p.append(f'<rect x="0" y="{y}" width="{width}" height="{rh}" fill="#f6f8fa"/>')
        label = u if len(u) * 7 + 40 <= label_w else u[: max(4, (label_w - 52) // 7)] + "…"
        weight = ' font-weight="700" fill="#d32f2f"' if u in culprits else ' fill="#1d232a"'
        mark = "◆ " if u in culprits else ""
        p.append(f'<text class="unit-label" x="{label_w - 8}" y="{y + rh / 2 + 4}" text-anchor="end"{weight} '
                 f'font-family="ui-monospace,Menlo,Consolas,monospace" font-size="11.5"><title>{_h(u)}</title>'
                 f"{_h(mark + label)}</text>")
        for i, t in enumerate(trials):
            x = label_w + i * cw
            applied = u in (t.get("units") or [])
            o = str(t.get("outcome"))
            color = OUTCOME_COLORS.get(o, "#607d8b")
            if applied:
                tip = _h(f"{u}: applied in trial {t.get('n')} ({o})")
                p.append(f'<rect class="cell applied" x="{x + 4}" y="{y + 3}" width="{cw - 8}" height="{rh - 6}" rx="2" '
                         f'fill="{color}"><title>{tip}</title></rect>')
            else:
                p.append(f'<rect class="cell" x="{x + 4}" y="{y + 3}" width="{cw - 8}" height="{rh - 6}" rx="2" '
                         f'fill="none" stroke="#c5ccd3" stroke-dasharray="2 2"/>')
    # outcome marks
    p.append(f'<line x1="{label_w - 4}" x2="{width - 60}" y1="{outcome_y - 4}" y2="{outcome_y - 4}" stroke="#9aa5b1"/>')
    p.append(f'<text x="{label_w - 8}" y="{outcome_y + rh / 2 + 4}" text-anchor="end" font-weight="600">outcome</text>')
    for i, t in enumerate(trials):
        x = label_w + i * cw
        o = str(t.get("outcome"))
        color = OUTCOME_COLORS.get(o, "#607d8b")
        p.append(f'<g class="trial-mark" data-trial="{_h(t.get("n"))}" data-outcome="{_h(o)}">'
                 f"<title>{_h(_trial_label(t) + ' — ' + str(t.get('reason', '')))}</title>"
                 f'<rect x="{x + 3}" y="{outcome_y}" width="{cw - 6}" height="{rh}" rx="4" fill="{color}"/>'
                 f'<text x="{x + cw / 2}" y="{outcome_y + rh / 2 + 4}" text-anchor="middle" fill="#fff" '
                 f'font-weight="700">{_h(_OUTCOME_LETTER.get(o, "?"))}</text></g>')
    # latency bars
    p.append(f'<text x="{label_w - 8}" y="{lat_top + 12}" text-anchor="end" font-weight="600">max probe latency</text>')
    p.append(f'<text x="{label_w - 8}" y="{lat_top + 27}" text-anchor="end" fill="#5f6b76">(0 – {_h(f"{lmax:.2f}")} s)</text>')
    base_y = lat_top + lat_h
    p.append(f'<line x1="{label_w - 4}" x2="{width - 60}" y1="{base_y}" y2="{base_y}" stroke="#9aa5b1"/>')
    for i, (t, lat) in enumerate(zip(trials, lats)):
        x = label_w + i * cw
        color = OUTCOME_COLORS.get(str(t.get("outcome")), "#607d8b")
        n = t.get("n")
        if lat is None:
            tip = _h(f"trial {n}: no probe request was made (the stack did not start, or nothing was probed)")
            p.append(f'<text class="latency-none" x="{x + cw / 2}" y="{base_y - 4}" text-anchor="middle" fill="#5f6b76">—'
                     f"<title>{tip}</title></text>")
            continue
        h = max(2.0, lat / scale_max * (lat_h - 14))
        tip = _h(f"trial {n}: max latency {lat:.3f} s")
        p.append(f'<rect class="latency-bar" data-trial="{_h(n)}" x="{x + 8}" y="{base_y - h:.1f}" '
                 f'width="{cw - 16}" height="{h:.1f}" fill="{color}" opacity="0.85">'
                 f"<title>{tip}</title></rect>")
        p.append(f'<text x="{x + cw / 2}" y="{base_y + 13}" text-anchor="middle" font-size="10" fill="#34495e">'
                 f"{_h(_fmt_lat(lat))}</text>")
    # legend
    lx = 8
    for o, color in OUTCOME_COLORS.items():
        p.append(f'<rect x="{lx}" y="{legend_y - 10}" width="12" height="12" rx="2" fill="{color}"/>'
                 f'<text x="{lx + 17}" y="{legend_y}">{_h(o)}</text>')
        lx += 24 + 7 * len(o) + 14
    p.append(f'<rect x="{lx}" y="{legend_y - 10}" width="12" height="12" rx="2" fill="none" stroke="#c5ccd3" '
             f'stroke-dasharray="2 2"/><text x="{lx + 17}" y="{legend_y}">not applied</text>')
    lx += 110
    if culprits:
        p.append(f'<text x="{lx}" y="{legend_y}" fill="#d32f2f" font-weight="700">◆ culprit</text>')
    p.append("</svg>")
    return "".join(p)


def _fmt_lat(x: float) -> str:
    """Compact seconds for a 30 px column: 5.0, 12, .04"""
    if x >= 10:
        return f"{x:.0f}"
    if x >= 1:
        return f"{x:.1f}"
    return f"{x:.2f}"[1:]


def render_html(run: RunRecord) -> str:
    """The report as one self-contained HTML page: inline CSS and SVG, no script, no external resource."""
    token = _RENDER_MASKER.set(run.masker)
    try:
        return _render_html(run)
    finally:
        _RENDER_MASKER.reset(token)


def _render_html(rec: RunRecord) -> str:
    v = rec.verdict or {}
    kind = str(v.get("verdict") or "unfinished")
    b: list[str] = []
    b.append(f"<h1>envbisect run {_h(rec.run_id)}</h1>")
    b.append(f'<p class="sub">deployment <b>{_h(rec.run.get("deployment"))}</b> · probe <b>{_h(rec.run.get("probe"))}</b>'
             f" · started {_h(_ts(rec.run.get('created_at')))} · {len(rec.trials)} trial(s)</p>")

    # verdict box
    vb = [f'<section id="verdict" class="v-{_h(kind)}">']
    if v:
        vb.append(f'<div class="kind">Verdict: {_h(kind.upper())}</div>')
        vb.append(f"<div>confidence <b>{_h(v.get('confidence'))}</b> · {_h(v.get('restarts'))} restarts · hosts left "
                  f"<b>{_h(v.get('state_left'))}</b></div>")
        if v.get("culprits"):
            dmap = {d.get("id"): d for d in rec.deltas}
            items = []
            for c in v["culprits"]:
                d = dmap.get(c, {})
                items.append(f'<li><span class="culprit">{_h(c)}</span>: <code>{_h(_short(d.get("old"), d.get("kind")))}'
                             f"</code> → <code>{_h(_short(d.get('new'), d.get('kind')))}</code></li>")
            vb.append(f"<div>culprit(s), which must all go:</div><ul>{''.join(items)}</ul>")
        else:
            vb.append("<div>culprit(s): <b>none</b> — no delta is blamed</div>")
        vb.append(f'<p class="meaning">{_h(_VERDICT_MEANING.get(kind, ""))}</p>')
        vb.append(f'<p class="meaning"><b>Explanation.</b> {_h(v.get("explanation", ""))}</p>')
    else:
        vb.append('<div class="kind">No verdict: the run did not finish</div>')
        vb.append("<p>It was interrupted, crashed, or is still running. Resume it with <code>envbisect bisect --resume"
                  "</code> or undo it with <code>envbisect restore</code>.</p>")
        for e in rec.events:
            if e.get("kind") in ("interrupted", "restore-failed"):
                vb.append(f"<p>{_h(e.get('kind'))}: {_h(e.get('error'))}</p>")
    vb.append("</section>")
    b.append("".join(vb))

    b.append("<h2>Trials at a glance</h2>")
    b.append('<p class="muted">Columns are trials in order; each row is a bisection unit (a delta, or linked deltas); a '
             "filled cell means the unit was applied on top of the baseline in that trial, coloured by the trial's outcome. "
             "Bars: the slowest probe request of each trial.</p>")
    b.append(f'<div class="chart">{trials_svg(rec)}</div>')

    b.append("<h2>The question</h2>")
    b.append(_kv_table(_question(rec)))

    b.append("<h2>What changed (deltas)</h2>")
    du = _delta_unit(rec)
    cul = _culprit_deltas(rec)
    if rec.deltas:
        rows, classes = [], []
        for d in rec.deltas:
            unit = du.get(d.get("id"), "")
            rows.append((d.get("id", "?"), d.get("kind"), d.get("change"), _short(d.get("old"), d.get("kind")),
                         _short(d.get("new"), d.get("kind")), d.get("baseline_source"),
                         unit if unit != d.get("id") else ""))
            classes.append("culprit" if d.get("id") in cul else "")
        b.append(_table(["delta", "kind", "change", "old", "new", "old value from", "linked unit"], rows,
                        row_classes=classes))
    else:
        b.append("<p>No deltas.</p>")
    diff = rec.diff
    extra = []
    for dr in diff.get("drift") or []:
        extra.append(f"<li>drift: {_h(dr.get('service'))} (pid {_h(dr.get('pid'))}) runs with "
                     f"<code>{_h(dr.get('key'))}={_h(dr.get('process'))}</code> while its file says "
                     f"<code>{_h(dr.get('file'))}</code></li>")
    for link in diff.get("links") or []:
        extra.append(f"<li>linked: {_h(', '.join(link))} changed the same way</li>")
    for s in diff.get("unknown_processes") or []:
        extra.append(f"<li>{_h(s)}: start environment unknown (overwritten by the program)</li>")
    for n in diff.get("notes") or []:
        extra.append(f"<li>note: {_h(n)}</li>")
    if extra:
        b.append("<ul>" + "".join(extra) + "</ul>")

    b.append("<h2>Premise checks</h2>")
    premises = [t for t in rec.trials if _is_premise(t)]
    if not premises:
        b.append("<p>No premise check was run.</p>")
    for t in premises:
        which, meaning = _premise(t)
        good = (which == "current" and t.get("outcome") in ("fail", "start-failure")) or \
               (which == "baseline" and t.get("outcome") == "pass")
        b.append(f'<div class="premise {"ok" if good else "bad"}"><b>trial {_h(t.get("n"))} — {_h(t.get("purpose"))}</b> '
                 f"{_badge(t.get('outcome'))} <span class=\"muted\">{_h(t.get('reason'))}</span><br>{_h(meaning)}</div>")

    b.append("<h2>Timeline</h2>")
    tl = _timeline(rec)
    t0 = next((r["ts"] for r in tl if isinstance(r["ts"], (int, float))), None)
    clock = _clock(tl)
    rows, classes = [], []
    for r in tl:
        k = r["kind"]
        what = _h(r["text"])
        if k.startswith("trial-end"):
            what = _badge(k.split(" ", 1)[1] if " " in k else "") + " " + what
        elif k == "verdict":
            what = f"<b>{what}</b>"
        elif k in ("interrupted", "restore-failed", "warning"):
            what = f'<b style="color:#d32f2f">{what}</b>'
        rows.append((clock.pop(0), _rel(r["ts"], t0), what))
        classes.append("k-" + k.split(" ")[0])
    b.append('<p class="muted">Times are UTC; steps in grey are what envbisect did on the hosts.</p>')
    b.append(_table(["time", "", "what happened"], rows, raw_cols=[2], num_cols=[0, 1], row_classes=classes)
             .replace("<table>", '<table class="timeline">', 1))

    b.append("<h2>Trials</h2>")
    b.append(_table(["#", "purpose", "deltas applied", "outcome", "reason", "restart", "probe", "max latency"],
                    [(f'<a href="#trial-{_h(t.get("n"))}">{_h(t.get("n"))}</a>', _h(t.get("purpose")),
                      _h(len(t.get("config") or [])), _badge(t.get("outcome")), _h(t.get("reason")),
                      _h(_secs(t.get("restart_s"), 1)), _h(_secs(t.get("probe_s"), 1)), _h(_secs(max_latency(t))))
                     for t in rec.trials], raw_cols=range(8), num_cols=[2, 5, 6, 7]))
    for t in rec.trials:
        s = [f'<div class="trial" id="trial-{_h(t.get("n"))}">']
        s.append(f"<h3>Trial {_h(t.get('n'))} {_badge(t.get('outcome'))} — {_h(t.get('purpose'))}</h3>")
        cfg = t.get("config") or []
        s.append(f"<div>configuration: baseline + {len(cfg)} delta(s)"
                 + (": <code>" + _h(", ".join(cfg)) + "</code>" if cfg else " (the baseline)") + "</div>")
        s.append(f"<div>started {_h(_ts(t.get('started_at')))}; {_h(t.get('reason'))}</div>")
        rd = t.get("restart_durations") or {}
        s.append(f"<div>co-restart {_h(_secs(t.get('restart_s')))}"
                 + (" (" + _h(", ".join(f"{k} {_secs(x)}" for k, x in rd.items())) + ")" if rd else "")
                 + f"; probing {_h(_secs(t.get('probe_s')))}</div>")
        reqs = _requests(t)
        if reqs:
            s.append(_table(["run", "req", "ok", "status", "latency", "error / answer excerpt"],
                            [(i, q.get("n", "") if q else "", ("yes" if q.get("ok") else "no") if q else "",
                              (q.get("status") or "—") if q else "—",
                              _secs(q.get("latency_s"), 3) if q else _secs(r.get("duration_s"), 3),
                              ((q.get("error") or q.get("excerpt") or "")[:110]) if q else r.get("reason"))
                             for i, r, q in reqs], num_cols=[0, 1, 3, 4]))
        if t.get("log_tail"):
            s.append(f"<details open><summary>log tail at the failure</summary><pre class='tail'><span>{_h(_tail(str(t['log_tail']), 30))}</span>"
                     "</pre></details>")
        key, ev = _evidence_for(rec, t.get("n"))
        failed = t.get("outcome") in ("fail", "start-failure")
        for name, text in sorted(ev.items()):
            # a failed trial's logs are open: the fault is usually in their last lines
            opened = " open" if failed and name.endswith((".log.txt", ".error.txt")) else ""
            s.append(f"<details{opened}><summary>evidence/{_h(key)}/{_h(name)} ({len(text.splitlines())} lines; last "
                     f"{min(_LOG_LINES, len(text.splitlines()))} shown)</summary><pre class='tail'><span>{_h(_tail(text))}</span></pre></details>")
        s.append("</div>")
        b.append("".join(s))

    if v.get("suspects"):
        b.append("<h2>Suspects</h2>")
        b.append(_table(["unit", "probability it is to blame"], [(s.get("unit"), s.get("p")) for s in v["suspects"]],
                        num_cols=[1]))
    if v.get("notes"):
        b.append("<ul>" + "".join(f"<li>note: {_h(n)}</li>" for n in v["notes"]) + "</ul>")

    path = v.get("path")
    if path:
        b.append("<h2>Request path, layer by layer</h2>")
        b.append(_table(["layer", "target", "result", "reason"],
                        [(_h(l.get("layer")), _h(l.get("target")), _badge("pass" if l.get("ok") else "fail"),
                          _h(l.get("reason"))) for l in path.get("layers") or []], raw_cols=range(4)))
        b.append(f"<p>Broken at: <b>{_h(path.get('broken_at') or 'nowhere')}</b>. {_h(path.get('conclusion'))}</p>")
    if v.get("drift_hint"):
        b.append("<h2>Drift hints</h2><ul>" + "".join(f"<li>{_h(h)}</li>" for h in v["drift_hint"]) + "</ul>")

    b.append("<h2>End state</h2>")
    state = v.get("state_left") or "unknown"
    b.append(f"<p><b>{_h(state)}</b>: {_h(_STATE_MEANING.get(state, ''))}</p>")
    fp = v.get("final_probe")
    if fp:
        b.append(f"<p>Final probe (trial {_h(fp.get('n'))}): {_badge(fp.get('outcome'))} {_h(fp.get('reason'))}</p>")

    b.append("<h2>Environment and versions</h2>")
    b.append(_kv_table(_env_rows(rec)))
    js = rec.journal_summary
    if js:
        b.append(f"<p>Journal ({_h(js.get('state'))}): the original state of "
                 f"{sum(len(h['files']) for h in js['hosts'].values())} file(s) and "
                 f"{sum(len(h['repos']) for h in js['hosts'].values())} repo(s) was recorded before the first edit.</p>")
    if rec.problems:
        b.append("<h2>Problems reading the run</h2><ul>" + "".join(f"<li>{_h(p)}</li>" for p in rec.problems) + "</ul>")
    b.append(f"<footer>Secrets are masked (<code>••••(masked, sha256:…)</code>). Generated by envbisect {_h(_version())} "
             f"from run {_h(rec.run_id)}.</footer>")

    title = f"envbisect {rec.run_id}: {kind}"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width,initial-scale=1">'
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
            "img-src data:\">"
            f"<title>{_h(title)}</title><style>{_CSS}</style></head><body><main>"
            + "\n".join(b) + "</main></body></html>\n")
