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
from envbisect.state.knobs import SglangRegistry, UnknownLayout, parse_sglang, parse_version

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
    if d and os.path.isfile(os.path.join(d, "sglang", "srt", "environ.py")):
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
out = {"root": root, "init": read(os.path.join(root, "__init__.py")) or "",
       "version_py": read(os.path.join(root, "version.py")) or ""}
import ast
ver = None
for text in (out["init"], out["version_py"]):
    try:
        for n in ast.parse(text).body:
            if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__version__" for t in n.targets):
                ver = getattr(n.value, "value", None)
    except SyntaxError:
        pass
    if ver:
        break
out["version"] = ver
if ver not in req["known"]:
    out["environ"] = read(os.path.join(root, "srt", "environ.py"))
    out["server_args"] = read(os.path.join(root, "srt", "server_args.py"))
print(json.dumps(out))
'''


def _cache_path(store_root: Path, version: str) -> Path:
    safe = "".join(c if c.isalnum() or c in ".-_+" else "_" for c in version)
    return store_root / "knobs" / f"sglang-{safe}.json"


def _load_cached(store_root: Path, version: str) -> SglangRegistry | None:
    try:
        doc = json.loads(_cache_path(store_root, version).read_text())
        return SglangRegistry(**doc)
    except (OSError, ValueError, TypeError):
        return None


def read_sglang(transport: Transport, host: str, paths: Iterable[str], store_root: Path,
                ) -> tuple[SglangRegistry | None, str | None]:
    """The host's installed SGLang registry, or (None, a note why it could not be read)."""
    known = sorted(p.name[len("sglang-"):-len(".json")] for p in (store_root / "knobs").glob("sglang-*.json"))
    req = json.dumps({"paths": list(paths), "known": known}).encode()
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
    version = doc.get("version") or parse_version(doc.get("init", ""), doc.get("version_py", "")) or "unknown"
    if doc.get("environ") is None and version != "unknown":
        cached = _load_cached(store_root, version)
        if cached is not None:
            return cached, None
    if not doc.get("environ") or not doc.get("server_args"):
        return None, (f"{host}: sglang {version} at {doc.get('root')}: srt/environ.py or srt/server_args.py "
                      f"is missing or unreadable; {why}")
    try:
        reg = parse_sglang(version, doc["environ"], doc["server_args"])
    except UnknownLayout as e:
        return None, f"{host}: sglang {version} at {doc.get('root')}: an unknown layout ({e}); {why}"
    if version != "unknown":
        try:
            p = _cache_path(store_root, version)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps({k: v for k, v in asdict(reg).items()}, sort_keys=True))
        except OSError:
            pass  # the cache only saves a transfer next time
    return reg, None
