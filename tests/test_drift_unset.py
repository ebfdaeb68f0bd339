"""A drift hint prints an unset value as "(unset)", never Python's None (red-team R2)."""
from envbisect.runs.drift import drift_hints


def test_an_unset_value_prints_as_unset():
    doc = {"deltas": [], "drift": [{"service": "decode", "key": "SGLANG_A", "process": None, "file": "1",
                                    "pid": 42}]}
    hints = drift_hints(doc)
    assert hints and all("None" not in h for h in hints), hints
    assert any("SGLANG_A=(unset)" in h and "says 1" in h for h in hints), hints


def test_a_hand_exported_key_no_file_sets_is_named_with_where_it_is_not_set():
    """Issue 34 part 3: a key of the process's start environment that no file sets and the
    baseline's process did not have; what every start inherits (in the baseline's process too) is
    not drift, and without a baseline process nothing is said."""
    from envbisect.state.delta_env import _hand_started
    from envbisect.state.snapshot import ProcessState

    base = ProcessState("decode", "ok", 10, 1.0, {"PATH": "/usr/bin", "PYTHONPATH": "/srv/site", "NCCL_DEBUG": "WARN"})
    proc = ProcessState("decode", "ok", 42, 2.0, {"PATH": "/usr/bin", "PYTHONPATH": "/srv/site", "NCCL_DEBUG": "INFO",
                                                  "SGLANG_SM120_MMA_TARGET_CTAS": "1024"})
    found = _hand_started("node1", "decode", "/srv/decode.serve-env", proc, base, {"NCCL_DEBUG"})
    assert [(d.key, d.process_value, d.file_value, d.where) for d in found] == [
        ("SGLANG_SM120_MMA_TARGET_CTAS", "1024", None, "/srv/decode.serve-env")]
    assert _hand_started("node1", "decode", "/srv/decode.serve-env", proc, None, {"NCCL_DEBUG"}) == []
    doc = {"deltas": [], "drift": [{"service": "decode", "key": "SGLANG_SM120_MMA_TARGET_CTAS", "process": "1024",
                                    "file": None, "pid": 42, "where": "/srv/decode.serve-env"}]}
    (hint,) = drift_hints(doc)
    assert hint.startswith("decode (pid 42) was running with SGLANG_SM120_MMA_TARGET_CTAS=1024, which no file sets "
                           "(not in /srv/decode.serve-env, nor at the baseline"), hint
