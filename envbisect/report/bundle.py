"""Evidence bundle of one run, for a postmortem: a redacted, self-checking `.tar.gz`.

Members (always in this order; evidence sorted by trial and file name; every file mode 0600):

    manifest.json            path, size and sha256 of every other member; run id, created_at, versions
    report.md, report.html   the story of the run (envbisect.report)
    run.json                 the question: deltas (env values masked), units, options, masked diff
    diff.json                the diff as `envbisect diff --json` showed it (masked)
    verdict.json             the verdict (absent for an unfinished run)
    trials.jsonl             every trial: configuration, outcome, probe requests, restart durations
    events.jsonl             the timeline
    corrections.jsonl        the operator's corrections of the record (only when there are any)
    verdict.superseded-K.json  verdicts the corrections superseded (only when there are any)
    environment.json         envbisect/kernel/Python versions + each repo's HEAD and `git describe`
    journal-summary.json     what the journal recorded (paths, modes, owners, sizes, keyed hashes; NO contents)
    snapshots/ID.json        baseline and current snapshot: metadata, env files inlined as redacted text,
                             process environments masked
    evidence/trial-NNN/...   log tails and /metrics scrapes captured after each trial (redacted)

Nothing raw leaves the store: every text member goes through `Redactor` (the masker's
`redact_text` plus literal replacement of the raw values of every secret-named variable the run
knows, see envbisect.report), and the finished members are checked once more for those values
before the archive is written. `journal.json` (the original file contents) is never included.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import time
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Collection, Mapping

from envbisect.state import rundir
from envbisect.errors import UsageError
from envbisect.inputs.masking import SecretMasker, encodable
from envbisect.report.markdown import md_text
from envbisect.state.rundir import Runs
from envbisect.state.store import Store, write_private
from envbisect.report import (Redactor, build_story, journal_summary, load_run, load_snapshot_doc, make_redactor,
                              masked_deltas, render_html, render_markdown)

__all__ = ["BundleInfo", "make_bundle", "check_bundle", "find_run"]

MANIFEST = "manifest.json"
FILE_MODE = 0o600
_FIXED_ORDER = ("report.md", "report.html", "run.json", "diff.json", "verdict.json", "trials.jsonl", "events.jsonl",
                "corrections.jsonl",
                "environment.json", "journal-summary.json")


@dataclass(frozen=True)
class BundleInfo:
    path: Path
    run_id: str
    members: tuple[str, ...]  # in archive order, manifest.json first
    size: int  # bytes of the .tar.gz
    sha256: str  # of the .tar.gz
    created_at: float


def find_run(store_root: Path, run_id: str | None) -> Path:
    """The run directory: `run_id`, or the newest bisection run in the store."""
    runs = Runs(Path(store_root) / "runs")
    if run_id:
        return runs.get(run_id).path
    rd = runs.newest(kind="bisect")
    if rd is None:
        raise UsageError(f"no bisection run in {runs.root}")
    return rd.path


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def _snapshot_member(store_root: Path, doc: Mapping[str, Any], role: str, rd: Redactor) -> str:
    """A snapshot for the bundle: metadata of every file, env files' contents inlined as redacted text,
    process environments masked, repos as recorded."""
    hosts = {}
    for name, h in (doc.get("hosts") or {}).items():
        env_paths = set((h.get("env_files") or {}).values())
        files = {}
        for p, f in sorted((h.get("files") or {}).items()):
            meta = {k: v for k, v in f.items() if k not in ("blob", "sha256")}
            if isinstance(f.get("sha256"), str):
                meta["hmac_sha256"] = rd.masker.content_digest(f["sha256"])
            if p in env_paths:
                content = Store(store_root).read_blob(f.get("blob"))
                if content is not None:
                    meta["content"] = rd.text(content.decode("utf-8", "replace"))
                    meta["content_redacted"] = True
            files[p] = meta
        procs = {}
        for s, pr in sorted((h.get("processes") or {}).items()):
            pr = dict(pr)
            for field in ("environ", "file_eval"):  # file_eval: what bash made of the env file
                if isinstance(pr.get(field), Mapping):
                    pr[field] = {k: rd.masker.mask_value(k, v) if isinstance(v, str) else v
                                 for k, v in sorted(pr[field].items())}
            if isinstance(pr.get("file_eval_sha256"), str):  # of what bash made of the env file: its values
                pr["file_eval_hmac_sha256"] = rd.masker.content_digest(pr.pop("file_eval_sha256"))
            procs[s] = pr
        hosts[name] = {**{k: v for k, v in h.items() if k not in ("files", "processes")}, "files": files,
                       "processes": procs}
    out = {"format": doc.get("format"), "role": role, "id": doc.get("id"), "label": doc.get("label"),
           "taken_at": doc.get("taken_at"), "taken_at_iso": _iso(doc.get("taken_at")), "playbook": doc.get("playbook"),
           "hosts": hosts}
    return rd.json_text(out, sort_keys=True)


def _repos(current: Mapping[str, Any] | None, baseline: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    out = []
    base_hosts = (baseline or {}).get("hosts") or {}
    for h, hd in sorted(((current or {}).get("hosts") or {}).items()):
        for p, r in sorted((hd.get("repos") or {}).items()):
            b = ((base_hosts.get(h) or {}).get("repos") or {}).get(p) or {}
            out.append({"host": h, "path": p, "describe": r.get("describe"), "head": r.get("head"),
                        "branch": r.get("branch"), "dirty": r.get("dirty"), "error": r.get("error"),
                        "baseline_describe": b.get("describe"), "baseline_head": b.get("head")})
    return out


def _jsonl(path: Path, rd: Redactor) -> str:
    lines = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            lines.append(rd.json_text(json.loads(line), indent=None))
        except ValueError:
            lines.append(json.dumps({"unparsable_line": rd.text(line)}, ensure_ascii=False))
    return "".join(l + "\n" for l in lines)


def _utf8(text: str) -> bytes:
    """A text member as UTF-8; the bytes of a non-UTF-8 value (kept as surrogates) shown as \\xNN."""
    return encodable(text).encode("utf-8")


def _members(store_root: Path, run_dir: Path, rd: Redactor) -> dict[str, bytes]:
    run = rundir.RunDir(run_dir)
    raw = run.read_any(rundir.RUN)
    if not isinstance(raw, dict):
        raise UsageError(f"{run_dir}: no readable run.json")
    if raw.get("kind", "bisect") != "bisect":
        raise UsageError(f"run {run_dir.name} is a {raw.get('kind')} run; bundles are made of bisection runs")
    m: dict[str, bytes] = {}
    # The reports are rendered from one story of the redacted record, every string of which was
    # redacted again as it was built (build_story, piece by piece); a whole-document redact_text would
    # mangle markup (a "must pass: ..." reads like a PASS: value pair), so only the literal raw-value
    # replacement runs over the whole text.
    story = build_story(load_run(run_dir, redactor=rd))
    m["report.md"] = _utf8(rd.raw(render_markdown(story)))
    m["report.html"] = _utf8(rd.raw(render_html(story)))
    run_doc = {k: v for k, v in raw.items() if k not in ("contents", "deltas_blob")}  # sha256s of raw contents
    run_doc["deltas"] = masked_deltas(raw, rd.masker)
    m["run.json"] = _utf8(rd.json_text(run_doc))
    m["diff.json"] = _utf8(rd.json_text(raw.get("diff") or {}))
    verdict = run.read_any(rundir.VERDICT)
    if isinstance(verdict, dict):
        m["verdict.json"] = _utf8(rd.json_text(verdict))
    m["trials.jsonl"] = _utf8(_jsonl(run_dir / rundir.TRIALS, rd))
    m["events.jsonl"] = _utf8(_jsonl(run_dir / rundir.EVENTS, rd))
    if (run_dir / rundir.CORRECTIONS).exists():
        m["corrections.jsonl"] = _utf8(_jsonl(run_dir / rundir.CORRECTIONS, rd))
    k = 1
    while isinstance(old := run.read_any(rundir.SUPERSEDED.format(k)), dict):
        m[rundir.SUPERSEDED.format(k)] = _utf8(rd.json_text(old))
        k += 1
    base_doc = load_snapshot_doc(store_root, raw.get("baseline"))
    cur_doc = load_snapshot_doc(store_root, raw.get("current"))
    env = dict(run.read_any(rundir.ENVIRONMENT) or {})
    env["repos"] = _repos(cur_doc, base_doc)
    m["environment.json"] = _utf8(rd.json_text(env))
    m["journal-summary.json"] = _utf8(rd.json_text(journal_summary(run.read_any(rundir.JOURNAL),
                                                                   digest=rd.masker.content_digest) or {}))
    for role, doc in (("baseline", base_doc), ("current", cur_doc)):
        if doc is not None:
            m[f"snapshots/{rd.text(str(doc.get('id')))}.json"] = _utf8(_snapshot_member(store_root, doc, role, rd))
    ev = run_dir / rundir.EVIDENCE
    if ev.is_dir():
        for tdir in sorted(p for p in ev.iterdir() if p.is_dir()):
            for f in sorted(p for p in tdir.iterdir() if p.is_file()):
                text = f.read_bytes().decode("utf-8", "replace")
                m[f"evidence/{rd.text(tdir.name)}/{rd.text(f.name)}"] = _utf8(rd.text(text))
    return m


def _order(names: Collection[str]) -> list[str]:
    fixed = [n for n in _FIXED_ORDER if n in names]
    rest = sorted(n for n in names if n not in _FIXED_ORDER)
    snaps = [n for n in rest if n.startswith("snapshots/")]
    return fixed + snaps + [n for n in rest if n not in snaps]


def _leaks(members: Mapping[str, bytes], rd: Redactor) -> list[str]:
    """Members that still hold a known raw secret value (checked for values of 8+ characters: a
    shorter one can turn up by coincidence, in a hash or a timestamp)."""
    found = []
    values = [v for v in rd.raw_values if len(v) >= 8]
    for name, data in members.items():
        for v in values:
            # report.md holds a value as Markdown text: a `*` or `<` in a secret is backslash-escaped there
            forms = {_utf8(v), v.encode("utf-8", "surrogateescape"), _utf8(md_text(v))}
            if any(b in data or b in _utf8(name) for b in forms):
                found.append(name)
                break
    return found


def make_bundle(store_root: Path, run_id: str | None, out: Path, masker: SecretMasker | None = None) -> BundleInfo:
    """Write the evidence bundle of run `run_id` (None: the newest bisection run) to `out` (a file
    path, or an existing directory to write `envbisect-RUN_ID.tar.gz` in). `masker` should be the
    deployment's (`Deployment.masker`: built-in rules + the playbook's [secrets]); None reads the
    run's playbook."""
    from envbisect import __version__

    store_root = Path(store_root)
    run_dir = find_run(store_root, run_id)
    rd = make_redactor(run_dir, masker)
    members = _members(store_root, run_dir, rd)
    leaked = _leaks(members, rd)
    if leaked:  # cannot happen after Redactor.text; refuse rather than hand out a secret
        raise UsageError(f"refusing to write the bundle: a secret value survived redaction in {', '.join(leaked)}")
    created = time.time()
    run = rundir.RunDir(run_dir)
    raw = run.read_any(rundir.RUN) or {}
    verdict = run.read_any(rundir.VERDICT) or {}
    env = run.read_any(rundir.ENVIRONMENT) or {}
    order = _order(members)
    manifest = {
        "format": 1, "kind": "envbisect-bundle", "run_id": raw.get("run_id") or run_dir.name,
        "deployment": raw.get("deployment"), "created_at": _iso(created), "created_at_epoch": round(created, 3),
        "run_created_at": _iso(raw.get("created_at")), "envbisect_version": __version__,
        "run_envbisect_version": env.get("envbisect"), "verdict": verdict.get("verdict"),
        "culprits": verdict.get("culprits") or [],
        "snapshots": {role: f"snapshots/{sid}.json" for role, sid in (("baseline", raw.get("baseline")),
                                                                        ("current", raw.get("current")))
                      if sid and f"snapshots/{sid}.json" in members},
        "redaction": {"secrets": "built-in secret names and value shapes, the playbook's [secrets], and the raw "
                                 "values of every secret-named variable of the run (deltas, snapshots, journal)",
                      "raw_values": len(rd.raw_values), "terminal_escapes": "stripped",
                      "journal": "summary only (journal-summary.json); original contents are not included",
                      "snapshots": "metadata; env files inlined as redacted text; process environments masked"},
        "members": [{"path": n, "size": len(members[n]), "sha256": hashlib.sha256(members[n]).hexdigest()}
                    for n in order],
    }
    manifest_bytes = _utf8(rd.json_text(manifest))
    all_members = [(MANIFEST, manifest_bytes)] + [(n, members[n]) for n in order]

    out = Path(out)
    rid = manifest["run_id"]
    if out.is_dir():
        out = out / f"envbisect-{rid}.tar.gz"
    data = _tar_gz(all_members, int(created))
    write_private(out, data)  # atomic, 0600: the bundle is evidence with masked, not absent, context
    return BundleInfo(out, str(rid), tuple(n for n, _ in all_members), len(data), hashlib.sha256(data).hexdigest(),
                      created)


def _tar_gz(members: list[tuple[str, bytes]], mtime: int) -> bytes:
    tbuf = io.BytesIO()
    with tarfile.open(fileobj=tbuf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime = len(data), FILE_MODE, mtime
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = ""
            ti.type = tarfile.REGTYPE
            tar.addfile(ti, io.BytesIO(data))
    gbuf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=gbuf, mtime=mtime) as gz:
        gz.write(tbuf.getvalue())
    return gbuf.getvalue()


# `bundle --check` reads a file someone handed over: a gzip bomb must not fill the memory or the
# time. Members are hashed as they stream by, and the archive is refused (one line) past a cap.
MAX_MEMBER_BYTES = 128 * 1024 * 1024  # far above any member envbisect writes (log tails, snapshots)
MAX_TOTAL_BYTES = 512 * 1024 * 1024  # the archive unpacked, headers included
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
_CHUNK = 1024 * 1024


class _OverCap(Exception):
    pass


class _CappedReader:
    """The decompressed stream, refused past `cap` bytes (before reading them, so a header that
    claims a huge size costs nothing)."""

    def __init__(self, raw: Any, cap: int):
        self.raw, self.cap, self.count = raw, cap, 0

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or self.count + n > self.cap:
            n = self.cap - self.count + 1  # one byte more than allowed tells "over" from "exactly at"
        data = self.raw.read(n)
        self.count += len(data)
        if self.count > self.cap:
            raise _OverCap(f"unpacks to more than {self.cap} bytes")
        return data


def check_bundle(path: Path, *, max_member: int = MAX_MEMBER_BYTES, max_total: int = MAX_TOTAL_BYTES) -> list[str]:
    """Problems with a bundle (empty list = ok): every member listed in manifest.json with the right
    size and sha256, nothing unlisted, no duplicates, only regular files with mode 0600, safe paths.
    Nothing is extracted; a member over `max_member` bytes or an archive unpacking to more than
    `max_total` is refused (its one problem says so) without reading further."""
    problems: list[str] = []
    contents: dict[str, tuple[int, str]] = {}  # name -> (size, sha256)
    manifest_data: bytes | None = None
    try:
        with gzip.open(Path(path), "rb") as gz, \
                tarfile.open(fileobj=_CappedReader(gz, max_total), mode="r|") as tar:  # type: ignore[arg-type]
            for ti in tar:
                name = ti.name
                if name in contents:
                    problems.append(f"{name}: appears more than once in the archive")
                if name.startswith("/") or ".." in Path(name).parts:
                    problems.append(f"{name}: unsafe path")
                if not ti.isreg():
                    problems.append(f"{name}: not a regular file")
                    continue
                if ti.size > max_member or (name == MANIFEST and ti.size > MAX_MANIFEST_BYTES):
                    raise _OverCap(f"member {name} is {ti.size} bytes, over the cap of "
                                   f"{MAX_MANIFEST_BYTES if name == MANIFEST else max_member}")
                if ti.mode & 0o7777 != FILE_MODE:
                    problems.append(f"{name}: mode {oct(ti.mode & 0o7777)}, expected {oct(FILE_MODE)}")
                f = tar.extractfile(ti)
                h, size, keep = hashlib.sha256(), 0, []
                while f is not None and (chunk := f.read(_CHUNK)):
                    h.update(chunk)
                    size += len(chunk)
                    if name == MANIFEST:
                        keep.append(chunk)
                contents[name] = (size, h.hexdigest())
                if name == MANIFEST:
                    manifest_data = b"".join(keep)
    except _OverCap as e:
        return [f"{path}: refused, not a bundle envbisect wrote: {e}"]
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        return problems + [f"{path}: cannot read the archive: {e}"]
    if manifest_data is None:
        return problems + [f"{MANIFEST} is missing"]
    try:
        manifest = json.loads(manifest_data)
        listed = manifest["members"]
        entries = {e["path"]: e for e in listed}
    except (ValueError, KeyError, TypeError) as e:
        return problems + [f"{MANIFEST} is not a valid manifest ({e})"]
    if len(entries) != len(listed):
        problems.append(f"{MANIFEST} lists a member more than once")
    for name, e in entries.items():
        if name == MANIFEST:
            problems.append(f"{MANIFEST} lists itself")
            continue
        got = contents.get(name)
        if got is None:
            problems.append(f"{name}: listed in the manifest but missing from the archive")
            continue
        size, sha = got
        if size != e.get("size"):
            problems.append(f"{name}: size {size}, the manifest says {e.get('size')}")
        if sha != e.get("sha256"):
            problems.append(f"{name}: sha256 {sha[:12]}…, the manifest says {str(e.get('sha256'))[:12]}…")
    for name in contents:
        if name != MANIFEST and name not in entries:
            problems.append(f"{name}: in the archive but not listed in the manifest")
    return problems
