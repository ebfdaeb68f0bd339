"""Real SGLang release files for the tests: ``pip download --no-deps sglang==X`` once, keep only the files
the knob reader needs (`state.knobs.SGLANG_FILES` and `SGLANG_FIELD_DIR`) and the dist-info METADATA under a cache outside the repo
(``$ENVBISECT_SGLANG_CACHE``, else ``~/.cache/envbisect/sglang``), one directory per release:
``<cache>/<version>/sglang/...``. A release already cached is never downloaded again. scripts/test.sh
fills the cache (scripts/sglang_wheels.py); the compatibility test and the simulated deployment read it.
"""
from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from envbisect.state.knobs import SGLANG_FIELD_DIR, SGLANG_FILES

# one release per minor line of every layout SGLang shipped (the compatibility test knows each one's counts)
PINNED = ("0.4.10", "0.5.3", "0.5.8", "0.5.13", "0.5.18", "0.5.23")
SIM_RELEASE = "0.5.23"  # the simulated deployment's installed engine
_DONE = ".complete"
_LAYOUT = "files 2"  # what a cached release holds: the reader's files and the dist-info METADATA
_NEWEST = "newest.txt"


def cache_root() -> Path:
    env = os.environ.get("ENVBISECT_SGLANG_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "envbisect" / "sglang"


def release_dir(version: str, root: Path | None = None) -> Path | None:
    """The cached release's directory (holding ``sglang/``), or None when it is not (completely) cached."""
    d = (root or cache_root()) / version
    try:
        return d if (d / _DONE).read_text().splitlines()[0] == _LAYOUT else None
    except (OSError, IndexError):
        return None


def wanted(member: str) -> bool:
    """Is a wheel member (``sglang/srt/environ.py``) one of the files the reader needs, or the
    distribution's METADATA (what importlib.metadata reads the version from)?"""
    if fnmatch.fnmatch(member, "sglang-*.dist-info/METADATA"):
        return True
    if not member.startswith("sglang/"):
        return False
    rel = member[len("sglang/"):]
    return rel in SGLANG_FILES or fnmatch.fnmatch(rel, f"{SGLANG_FIELD_DIR}/*.py")


def _download(version: str, into: Path) -> Path:
    base = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
            f"sglang=={version}", "-d", str(into)]
    # a wheel built for another interpreter than this one: ask for the CPython 3.11 manylinux build
    tries = [base, base + ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
                           "--platform", "manylinux_2_34_x86_64"]]
    err = ""
    for cmd in tries:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        wheels = sorted(into.glob("sglang-*.whl"))
        if r.returncode == 0 and wheels:
            return wheels[0]
        err = (r.stderr.strip().splitlines() or ["no wheel"])[-1]
    raise RuntimeError(f"pip download sglang=={version} failed: {err}")


def fetch(version: str, root: Path | None = None) -> Path:
    """The release's cached directory, downloading and extracting it first if needed."""
    root = root or cache_root()
    have = release_dir(version, root)
    if have is not None:
        return have
    with tempfile.TemporaryDirectory(prefix="sglang-wheel-") as tmp:
        wheel = _download(version, Path(tmp))
        part = root / f".{version}.part"
        shutil.rmtree(part, ignore_errors=True)
        with zipfile.ZipFile(wheel) as z:
            for m in z.namelist():
                if wanted(m):
                    dest = part / m
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(z.read(m))
        (part / _DONE).write_text(f"{_LAYOUT}\n{wheel.name}\n")
        final = root / version
        shutil.rmtree(final, ignore_errors=True)
        part.rename(final)
    return final


def newest(root: Path | None = None, refresh: bool = False) -> str | None:
    """The newest 0.5.x on the index (``pip index versions sglang``), remembered in the cache; None when
    the index cannot be asked and nothing is remembered."""
    root = root or cache_root()
    remembered = root / _NEWEST
    if remembered.is_file() and not refresh:
        return remembered.read_text().strip() or None
    r = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "sglang", "--disable-pip-version-check"],
                       capture_output=True, text=True, timeout=300)
    line = next((x for x in r.stdout.splitlines() if x.startswith("Available versions:")), "")
    versions = [v.strip() for v in line.partition(":")[2].split(",") if v.strip().startswith("0.5.")]
    if not versions:
        return remembered.read_text().strip() or None if remembered.is_file() else None
    root.mkdir(parents=True, exist_ok=True)
    remembered.write_text(versions[0] + "\n")
    return versions[0]


def read_files(version_dir: Path) -> dict[str, str]:
    """The cached files by path relative to the ``sglang`` package directory (what a host sends)."""
    pkg = version_dir / "sglang"
    return {p.relative_to(pkg).as_posix(): p.read_text(encoding="utf-8") for p in sorted(pkg.rglob("*.py"))}


def install(version: str, site: Path, root: Path | None = None) -> Path:
    """Copy a cached release's files into SITE/sglang (a site-packages the simulated workers' python
    sees); returns SITE. FileNotFoundError when the release is not cached (scripts/test.sh caches it)."""
    d = release_dir(version, root)
    if d is None:
        raise FileNotFoundError(f"sglang {version} is not in {root or cache_root()}: run scripts/sglang_wheels.py")
    shutil.copytree(d / "sglang", site / "sglang", dirs_exist_ok=True)
    for info in d.glob("sglang-*.dist-info"):
        shutil.copytree(info, site / info.name, dirs_exist_ok=True)
    return site
