"""Write tests/durations.json from a JUnit XML of a whole run (pytest --junitxml=FILE): each test
that took a second or more, in seconds. tests/conftest.py starts the longest tests first with it,
so that none of them starts last and finishes alone; a test it does not list is placed by its
group. Stale numbers only cost ordering, never a result.

    python scripts/durations.py /tmp/run.xml
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "durations.json"


def main(xml_path: str) -> int:
    seconds: dict[str, float] = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        module, name = case.get("classname", ""), case.get("name", "")
        path = module.replace(".", "/") + ".py"
        t = float(case.get("time", 0) or 0)
        if t >= 1.0:
            seconds[f"{path}::{name}"] = round(t, 1)
    OUT.write_text(json.dumps(dict(sorted(seconds.items())), indent=1) + "\n")
    print(f"{OUT}: {len(seconds)} tests of a second or more")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]) if len(sys.argv) == 2 else 2)
