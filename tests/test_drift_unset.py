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


def test_a_hand_started_key_is_named_in_a_culprit_verdict_too():
    """Red-team scen_g: SGLANG_MOE_DEBUG=1 exported in the shell that started decode, no file sets
    it, and a file delta is the culprit: the verdict named the culprit and dropped the key (drift_hint
    empty, only a note without the value). Any verdict carries the hand-started keys, with value,
    service and where they are not set; other drift stays the not-reproduced verdict's."""
    from envbisect.outcome import VerdictKind
    from envbisect.runs.drift import verdict_drift
    from envbisect.search import Verdict

    doc = {"deltas": [{"kind": "env", "service": "decode", "key": "SGLANG_SM120", "old": None}],
           "drift": [{"service": "decode", "key": "SGLANG_MOE_DEBUG", "process": "1", "file": None, "pid": 77,
                      "where": "/srv/decode.serve-env"},
                     {"service": "prefill", "key": "NCCL_DEBUG", "process": "INFO", "file": "WARN", "pid": 5}]}
    culprit = Verdict(VerdictKind.CULPRIT, ("decode:SGLANG_SM120",), 1.0, (), "Observed: it failed alone.")
    v, hints = verdict_drift(culprit, doc, co_restarted=True)
    assert v.kind == VerdictKind.CULPRIT and v.culprits == culprit.culprits
    assert len(hints) == 1 and "SGLANG_MOE_DEBUG=1" in hints[0] and "decode" in hints[0]
    assert "/srv/decode.serve-env" in hints[0]
    assert v.explanation.startswith("Observed: it failed alone.") and "SGLANG_MOE_DEBUG=1" in v.explanation
    assert "NCCL_DEBUG" not in v.explanation
    # without hand-started keys a culprit verdict is left as it was
    plain = {"deltas": [], "drift": doc["drift"][1:]}
    assert verdict_drift(culprit, plain, co_restarted=True) == (culprit, ())
    # the not-reproduced verdict names all drift, as before; a run that never restarted says none
    nr = Verdict(VerdictKind.NOT_REPRODUCED, (), 0.9, (), "Passed after a co-restart (check the probe, or run "
                                                          "again while the fault shows).")
    v2, hints2 = verdict_drift(nr, doc, co_restarted=True)
    assert len(hints2) == 2 and "SGLANG_MOE_DEBUG=1" in v2.explanation and "NCCL_DEBUG=INFO" in v2.explanation
    assert verdict_drift(nr, doc, co_restarted=False) == (nr, ())
