"""A run's folder, `STORE/runs/RUN_ID/`: the one owner of its file names, reading and writing.

Every run (bisect, revert, apply) writes `run.json` (the question) first; a bisection appends
`trials.jsonl` (one trial per line, after each trial) and `events.jsonl` (the timeline), and ends
with `verdict.json`; revert/apply end with `result.json`. An operator's corrections of a bisection
(state/corrections.py) append to `corrections.jsonl`; a verdict they superseded is kept as
`verdict.superseded-K.json` (K = 1, 2, ... in the order they were superseded), never deleted. The
local half of the host journal (`journal.json`, `made.json`) and per-trial `evidence/` live here
too. Files are private (0600) and written atomically; a damaged one reads as one clear `StoreError`
line, never a traceback.

`Runs` is the one rule for finding runs: by id, or the newest (by `created_at` in run.json, then
by id, which starts with the creation time) matching a kind, deployment and finished state.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from envbisect.errors import StoreError, UsageError
from envbisect.state.store import Store, private_dir, read_json_or_none, write_private

RUN = "run.json"
TRIALS = "trials.jsonl"
EVENTS = "events.jsonl"
VERDICT = "verdict.json"  # bisect
RESULT = "result.json"  # revert, apply
ENVIRONMENT = "environment.json"
JOURNAL = "journal.json"
MADE = "made.json"
EVIDENCE = "evidence"
CORRECTIONS = "corrections.jsonl"
SUPERSEDED = "verdict.superseded-{}.json"

# What a run id may be wherever it becomes a path (STORE/runs/ID): ids envbisect makes are
# 20261202T115801-1a2b3c, -revert-, -fleet-; one read from a host or typed is held to the same.
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def check_run_id(run_id: str, where: str = "run id") -> str:
    """`run_id`, or a one-line UsageError when it could not be a run's folder name."""
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise UsageError(f"{where} {run_id!r} is not a run id (letters, digits, '_', '.', '-')")
    return run_id


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def run_id(self) -> str:
        return self.path.name

    def file(self, name: str) -> Path:
        return self.path / name

    def has(self, name: str) -> bool:
        return (self.path / name).exists()

    @property
    def store(self) -> Store:
        """The store this run belongs to: a run's folder is STORE/runs/RUN_ID."""
        return Store(self.path.parent.parent)

    # --- reading -------------------------------------------------------------------------------
    def read(self, name: str) -> dict[str, Any]:
        """A JSON object file of the run, or a one-line StoreError naming it."""
        path = self.path / name
        try:
            doc = json.loads(path.read_text(encoding="utf-8", errors="replace"))
        except FileNotFoundError:
            raise StoreError(f"{path}: missing") from None
        except OSError as e:
            raise StoreError(f"{path}: cannot read: {e.strerror}") from None
        except ValueError as e:
            raise StoreError(f"{path}: damaged run file (not JSON: {e})") from None
        if not isinstance(doc, dict):
            raise StoreError(f"{path}: damaged run file (not a JSON object)")
        return doc

    def read_any(self, name: str) -> Any:
        """A JSON file of the run as it is, None when it is missing or damaged: for the report and
        the bundle, which show what a damaged run still holds."""
        return read_json_or_none(self.path / name)

    def read_optional(self, name: str) -> dict[str, Any] | None:
        """As read(), None when the file does not exist (a damaged one is still an error)."""
        return self.read(name) if self.has(name) else None

    def read_lines(self, name: str) -> list[dict[str, Any]]:
        """A JSON-lines file; a damaged line is a one-line StoreError naming it."""
        path = self.path / name
        if not path.exists():
            return []
        out = []
        for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise StoreError(f"{path}:{i}: damaged run file (not JSON: {e})") from None
            if not isinstance(rec, dict):
                raise StoreError(f"{path}:{i}: damaged run file (not a JSON object)")
            out.append(rec)
        return out

    @property
    def doc(self) -> dict[str, Any]:
        return self.read(RUN)

    @property
    def kind(self) -> str:
        return str(self.doc.get("kind", "bisect"))

    def result_name(self, kind: str | None = None) -> str:
        return VERDICT if (kind or self.kind) == "bisect" else RESULT

    def finished(self, kind: str | None = None) -> bool:
        return self.has(self.result_name(kind))

    def superseded_verdicts(self) -> list[dict[str, Any]]:
        """The verdicts corrections superseded, oldest first."""
        out, k = [], 1
        while self.has(SUPERSEDED.format(k)):
            out.append(self.read(SUPERSEDED.format(k)))
            k += 1
        return out

    # --- writing -------------------------------------------------------------------------------
    def supersede_verdict(self) -> str | None:
        """Keep verdict.json as the next `verdict.superseded-K.json` (the run is then unfinished until
        a new verdict is written). Returns the name it was kept under, None when there was none."""
        if not self.has(VERDICT):
            return None
        k = 1
        while self.has(SUPERSEDED.format(k)):
            k += 1
        name = SUPERSEDED.format(k)
        os.replace(self.path / VERDICT, self.path / name)
        return name

    def write(self, name: str, data: bytes | str) -> None:
        write_private(self.path / name, data.encode() if isinstance(data, str) else data)

    def append_line(self, name: str, line: str) -> None:
        """One line to a JSON-lines file, fsync'd (a run killed after a trial keeps that trial)."""
        private_dir(self.path)
        with open(self.path / name, "a") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(line.rstrip("\n") + "\n")
            f.flush()
            os.fsync(f.fileno())


class Runs:
    """The runs of a store (`STORE/runs`)."""

    def __init__(self, runs_dir: Path):
        self.root = Path(runs_dir)

    def new(self, run_id: str) -> RunDir:
        path = self.root / check_run_id(run_id)
        private_dir(path)
        return RunDir(path)

    def all(self) -> list[tuple[RunDir, dict[str, Any]]]:
        """Every run with a readable run.json, oldest first. An unreadable one is skipped (like a
        damaged snapshot in `snapshots`): one bad run must not hide the others."""
        found = []
        for rd in self._dirs():
            try:
                found.append((rd, rd.doc))
            except StoreError:
                continue

        def created(doc: dict[str, Any]) -> float:
            t = doc.get("created_at")
            return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0

        return sorted(found, key=lambda r: (created(r[1]), r[0].run_id))

    def _dirs(self) -> Iterator[RunDir]:
        if self.root.is_dir():
            for p in self.root.iterdir():
                if p.is_dir() and not p.name.startswith("."):
                    yield RunDir(p)

    def get(self, run_id: str) -> RunDir:
        if not run_id or not RUN_ID.fullmatch(run_id) or ".." in run_id or not (self.root / run_id / RUN).is_file():
            raise UsageError(f"no run {run_id!r} in {self.root} (see `envbisect runs`)")
        return RunDir(self.root / run_id)

    def bisection(self, run_id: str | None, deployment: str, finished: bool | None = False) -> RunDir:
        """The bisection to resume: by id, or this deployment's newest (``finished`` None: finished
        or not, as `--retract` corrects the newest run whatever its state)."""
        if run_id:
            return self.get(run_id)
        rd = self.newest(kind="bisect", deployment=deployment, finished=finished)
        if rd is None:
            raise UsageError("no unfinished run to resume for this deployment" if finished is False
                             else "no bisection of this deployment to correct")
        return rd

    def newest(self, *, kind: str | None = None, deployment: str | None = None,
               finished: bool | None = None) -> RunDir | None:
        for rd, doc in reversed(self.all()):
            k = str(doc.get("kind", "bisect"))
            if kind is not None and k != kind:
                continue
            if deployment is not None and doc.get("deployment") != deployment:
                continue
            if finished is not None and rd.finished(k) != finished:
                continue
            return rd
        return None
