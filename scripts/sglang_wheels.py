#!/usr/bin/env python3
"""Cache the real SGLang release files the knob reader needs, outside the repo (envbisect/sim/
sglang_release.py): the pinned releases of every layout, and the newest 0.5.x on the index.

    scripts/sglang_wheels.py            fetch what is missing (a second run downloads nothing)
    scripts/sglang_wheels.py 0.5.20     fetch these releases too
"""
from __future__ import annotations

import sys

from envbisect.sim import sglang_release as rel


def main(argv: list[str]) -> int:
    versions = list(rel.PINNED) + [v for v in argv if v not in rel.PINNED]
    try:
        latest = rel.newest(refresh=True)
    except Exception as e:  # noqa: BLE001 - the index may be unreachable; the pinned releases still count
        print(f"sglang_wheels: the newest release could not be looked up ({e})", file=sys.stderr)
        latest = rel.newest()
    if latest and latest not in versions:
        versions.append(latest)
    failed = 0
    for v in versions:
        cached = rel.release_dir(v) is not None
        try:
            d = rel.fetch(v)
        except (RuntimeError, OSError) as e:
            print(f"sglang_wheels: {v}: {e}", file=sys.stderr)
            failed += 1
            continue
        print(f"sglang_wheels: {v}: {'cached' if cached else 'downloaded'} {d}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
