"""Read the installed engine's own knob registry on a host (read-only, one round trip per host), and
keep it in the local store per engine version (`state/knobs.py` parses it).

Where: the directories on the services' start-environment ``PYTHONPATH`` (the python the services
run with sees them first), then ``importlib.util.find_spec("sglang")`` of the host's python, which
for a top-level package only asks the path finders and runs none of the package's code. Nothing is
imported; the files are read as text. A version already in the store is not sent again.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Iterable

from envbisect.errors import EnvbisectError
from envbisect.hosts.transport import Transport
from envbisect.state.knobs import SGLANG_FIELD_DIR, SGLANG_FILES, SglangRegistry, UnknownLayout, \
    no_env_registry_note, parse_sglang_files
from envbisect.state.store import write_file

FIND_SGLANG = r'''
import importlib.util, json, os, sys
req = json.loads(sys.stdin.read())
def read(p):
    try:
        with open(p, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None
root = None
for d in req["paths"]:
    if d and os.path.isfile(os.path.join(d, "sglang", "srt", "server_args.py")):
        root = os.path.join(d, "sglang"); break
if root is None:
    try:
        spec = importlib.util.find_spec("sglang")
    except Exception as e:
        spec = None
    if spec is not None and spec.origin:
        root = os.path.dirname(spec.origin)
if root is None:
    print(json.dumps({"error": "no sglang package found by the host's python nor on the services' PYTHONPATH"}))
    sys.exit(0)
files = {}
for rel in req["version_files"]:
    t = read(os.path.join(root, rel))
    if t is not None:
        files[rel] = t
import ast
ver = None
for rel in req["version_files"]:
    try:
        for n in ast.parse(files.get(rel) or "").body:
            if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__version__" for t in n.targets) \
                    and isinstance(getattr(n.value, "value", None), str):
                ver = n.value.value
    except SyntaxError:
        pass
    if ver:
        break
out = {"root": root, "version": ver}
if ver not in req["known"]:
    for rel in req["files"]:
        t = read(os.path.join(root, rel))
        if t is not None:
            files[rel] = t
    d = os.path.join(root, req["field_dir"])
    for name in (sorted(os.listdir(d)) if os.path.isdir(d) else []):
        if name.endswith(".py"):
            t = read(os.path.join(d, name))
            if t is not None:
                files[req["field_dir"] + "/" + name] = t
out["files"] = files
print(json.dumps(out))
'''

# the cached registries' shape: a registry read by an older reader is read again
READER = 3
_VERSION_FILES = ("_version.py", "version.py", "__init__.py")


def _cache_path(store_root: Path, version: str) -> Path:
    safe = "".join(c if c.isalnum() or c in ".-_+" else "_" for c in version)
    return store_root / "knobs" / f"sglang-{safe}.json"


def _load_cached(store_root: Path, version: str) -> SglangRegistry | None:
    try:
        doc = json.loads(_cache_path(store_root, version).read_text())
        if doc.get("reader") != READER:
            return None
        reg = doc["registry"]
        return SglangRegistry(**{**reg, "retired_envs": tuple(reg.get("retired_envs", ())),
                                 "retired_flags": tuple(reg.get("retired_flags", ()))})
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _known(store_root: Path) -> list[str]:
    """The versions whose registry the store holds as this reader reads it."""
    names = (p.name[len("sglang-"):-len(".json")] for p in (store_root / "knobs").glob("sglang-*.json"))
    return sorted(v for v in names if _load_cached(store_root, v) is not None)


def _keep(store_root: Path, reg: SglangRegistry) -> None:
    try:
        p = _cache_path(store_root, reg.version)
        p.parent.mkdir(parents=True, exist_ok=True)
        write_file(p, json.dumps({"reader": READER, "registry": asdict(reg)}, sort_keys=True).encode(), 0o600)
    except OSError:
        pass  # the cache only saves a transfer next time


def load_registry(store_root: Path, version: str) -> SglangRegistry | None:
    """A version's registry as the store keeps it (read from some host before), or None."""
    return _load_cached(store_root, version)


def read_sglang(transport: Transport, host: str, paths: Iterable[str], store_root: Path,
                ) -> tuple[SglangRegistry | None, str | None]:
    """The host's installed SGLang registry (and a note on what it cannot say), or (None, a note why it
    could not be read)."""
    req = json.dumps({"paths": list(paths), "known": _known(store_root), "version_files": list(_VERSION_FILES),
                      "files": [f for f in SGLANG_FILES if f not in _VERSION_FILES],
                      "field_dir": SGLANG_FIELD_DIR}).encode()
    why = "today's behaviour: aliases and flags are linked by their names only, no defaults"
    try:
        r = transport.run_python(FIND_SGLANG, stdin=req, timeout=30)
    except EnvbisectError as e:
        return None, f"{host}: the installed engine's knobs could not be read ({e}); {why}"
    try:
        doc = json.loads(r.stdout.decode("utf-8", "replace")) if r.ok else {"error": r.stderr_line}
    except ValueError:
        doc = {"error": "unreadable answer"}
    if "error" in doc:
        return None, f"{host}: the installed engine's knobs could not be read ({doc['error']}); {why}"
    files = doc.get("files") or {}
    version = doc.get("version") or "unknown"
    cached = _load_cached(store_root, version) if version != "unknown" and "srt/server_args.py" not in files \
        else None
    if cached is not None:
        reg = cached
    else:
        try:
            reg = parse_sglang_files(files)
        except UnknownLayout as e:
            return None, f"{host}: sglang {version} at {doc.get('root')}: an unknown layout ({e}); {why}"
        if reg.version != "unknown":
            _keep(store_root, reg)
    note = no_env_registry_note(reg)
    return reg, f"{host}: {note}" if note else None
