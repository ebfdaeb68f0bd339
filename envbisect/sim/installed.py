"""The simulated deployment's installed SGLang: the real files of one pinned release (`SIM_RELEASE`,
the newest the reader is tested on) that the knob reader needs, copied from the cache of downloaded
wheels (`sim/sglang_release.py`, filled by scripts/sglang_wheels.py) into a site-packages on the
workers' ``PYTHONPATH``, so that envbisect reads what a user's host has (hosts/engine.py). The workers
never import it. Not committed, and never downloaded here (the demo runs offline): scripts/test.sh, or
a test's fixture, fills the cache."""
from __future__ import annotations

import sys
from pathlib import Path

from envbisect.sim import sglang_release

VERSION = sglang_release.SIM_RELEASE


def write_installed_sglang(root: Path, version: str = VERSION) -> Path:
    """Copy the release's files under ROOT/site-packages; returns that directory (for PYTHONPATH). When
    the release is not cached, the directory stays empty (the diff then says that no sglang package was
    found) and a line on stderr says why."""
    site = root / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    try:
        return sglang_release.install(version, site)
    except FileNotFoundError as e:
        print(f"envbisect sim: no installed sglang for the workers ({e})", file=sys.stderr)
        return site
