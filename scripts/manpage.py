#!/usr/bin/env python3
"""Write docs/envbisect.1 from the CLI (envbisect.cli.manpage); --check: exit 1 when it is stale."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from envbisect.cli.manpage import man_page  # noqa: E402

PAGE = ROOT / "docs" / "envbisect.1"


def main(argv: list[str]) -> int:
    text = man_page()
    if "--check" in argv:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE} is stale: run scripts/manpage.py", file=sys.stderr)
            return 1
        print(f"{PAGE} is up to date")
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE} (read it with: man -l {PAGE})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
