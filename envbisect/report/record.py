"""The record of one run, read (and redacted) from its folder and the store."""
from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from envbisect.state import rundir
from envbisect.state.corrections import Correction, Corrections
from envbisect.inputs.masking import SecretMasker
from envbisect.report.redaction import Redactor, make_redactor

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
    # the operator's corrections (state/corrections.py) and the verdicts they superseded, oldest first
    corrections: Corrections = field(default_factory=Corrections)
    superseded: tuple[Mapping[str, Any], ...] = ()
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


def journal_summary(doc: Mapping[str, Any] | None, digest: Any = None) -> dict[str, Any] | None:
    """What the journal recorded, without the contents: paths, modes, owners, sizes, and each
    content's sha256 through `digest` (the masker's keyed `content_digest`; the contents go out
    masked elsewhere, so their unkeyed hash would let a guess be checked). Without `digest`, no hash."""
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
                          "hmac_sha256": None if raw is None or digest is None else
                          digest(hashlib.sha256(raw).hexdigest())})
        repos = [{"path": p, "head": r.get("head"), "ref": r.get("ref")}
                 for p, r in sorted((hd.get("repos") or {}).items())]
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
            for f in ("old_word", "new_word", "old_eval", "new_eval", "args_old", "args_new"):
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
    run_files = rundir.RunDir(run_dir)
    doc = run_files.read_any(rundir.RUN)
    if not isinstance(doc, dict):
        from envbisect.errors import UsageError

        raise UsageError(f"{run_dir}: no readable run.json (not a run directory?)")
    rd = redactor or make_redactor(run_dir, masker)
    problems: list[str] = []
    run = dict(doc)
    run["deltas"] = masked_deltas(doc, rd.masker)
    run.pop("contents", None)  # sha256 -> blob references of file deltas: not story material
    run = rd.obj(run)
    trials = _read_jsonl(run_dir / rundir.TRIALS, problems)
    events = _read_jsonl(run_dir / rundir.EVENTS, problems)
    verdict = run_files.read_any(rundir.VERDICT)
    if (run_dir / rundir.VERDICT).exists() and not isinstance(verdict, dict):
        problems.append("verdict.json is not readable JSON")
        verdict = None
    # verdict.json is written right after the last event (the restore): that is when the run concluded
    stamps = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    finished = max(stamps) if isinstance(verdict, dict) and stamps else None
    environment = run_files.read_any(rundir.ENVIRONMENT) or {}
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
    corrections = []
    for i, c in enumerate(_read_jsonl(run_dir / rundir.CORRECTIONS, problems), 1):
        try:
            corrections.append(Correction.from_json(c))
        except (KeyError, TypeError, ValueError):
            problems.append(f"{rundir.CORRECTIONS} line {i}: not a correction (skipped)")
    superseded, k = [], 1
    while (run_dir / rundir.SUPERSEDED.format(k)).exists():
        old = run_files.read_any(rundir.SUPERSEDED.format(k))
        if isinstance(old, dict):
            superseded.append(rd.obj(old))
        else:
            problems.append(f"{rundir.SUPERSEDED.format(k)} is not readable JSON")
        k += 1
    store = run_files.store
    snaps = {"baseline": snapshot_summary(store.snapshot_doc(doc.get("baseline"))),
             "current": snapshot_summary(store.snapshot_doc(doc.get("current")))}
    return RunRecord(
        run_dir=run_dir, run_id=str(doc.get("run_id") or run_dir.name), run=run,
        deltas=tuple(run["deltas"]), trials=tuple(rd.obj(trials)),
        verdict=rd.obj(verdict) if isinstance(verdict, dict) else None, events=tuple(rd.obj(events)),
        environment=rd.obj(environment), evidence=evidence,
        journal_summary=rd.obj(journal_summary(run_files.read_any(rundir.JOURNAL))),
        snapshots=rd.obj(snaps), finished_at=finished, problems=tuple(problems),
        corrections=Corrections(tuple(corrections)), superseded=tuple(superseded), masker=rd.masker)
