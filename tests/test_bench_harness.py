"""The bench harness drives the library's own search and link refinement (bench/harness.py): a
change to their interfaces must break here, in the suite, not only in `python bench/run.py`."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import harness  # noqa: E402


@pytest.mark.parametrize("scenario", ["culprit", "pair", "linked"])
@pytest.mark.parametrize("method", ["envbisect-confirm", "toggle", "bisect", "ddmin"])
def test_every_method_runs_a_small_case_and_envbisect_is_right(scenario, method):
    results = [harness.run_case(case, method) for case in harness.cases(scenario, 8, pair_cap=6)]
    assert results and all(restarts >= 1 for restarts, *_ in results)
    if method == "envbisect-confirm":  # the default policy: right, no innocent named, on every case
        assert all(right and not innocent for _, _, right, innocent, _ in results), results
