"""A drift hint prints an unset value as "(unset)", never Python's None (red-team R2)."""
from envbisect.runs.drift import drift_hints


def test_an_unset_value_prints_as_unset():
    doc = {"deltas": [], "drift": [{"service": "decode", "key": "SGLANG_A", "process": None, "file": "1",
                                    "pid": 42}]}
    hints = drift_hints(doc)
    assert hints and all("None" not in h for h in hints), hints
    assert any("SGLANG_A=(unset)" in h and "says 1" in h for h in hints), hints
