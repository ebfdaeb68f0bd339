"""Linking by any knob spelling (issue 24, part 4), where a flag sits on a start command line itself
(a start script's or unit's line, `DeltaKind.FLAG`): an env var in prefill and the flag that replaces it
on decode's start line, a flag's two spellings in a start line and an argument string, the same flag
change in prefill's and decode's start scripts, are each one linked unit; a flag the installed engine
does not read on an sglang command line is marked. The registry is the real sglang 0.5.8's."""
from __future__ import annotations

import hashlib

from envbisect.runs.bisect import make_units
from envbisect.state.delta_cmdline import per_flag
from envbisect.state.deltas import Delta, Diff, with_knobs

from test_knobs import delta, diff_of, registry


def script_flags(service: str, old: str, new: str, host: str = "gpu1") -> list[Delta]:
    """The flag deltas of `service`'s start script whose command line changed from `old` to `new`."""
    path = f"/srv/start-{service}.sh"
    o, n = f"#!/bin/sh\nexec {old}\n".encode(), f"#!/bin/sh\nexec {new}\n".encode()
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    whole = Delta(f"file:{host}:{path}", "file", host, None, path, None, "changed", sha(o), sha(n), "snapshot:s1")
    notes: list[str] = []
    out = per_flag([whole], {sha(o): o, sha(n): n}, notes)
    assert not notes and all(d.kind == "flag" for d in out), (notes, out)
    return out


def linked(d: Diff) -> dict[str, tuple[str, ...]]:
    units, _ = make_units(d.deltas, (), auto_link=True)
    return {u: ids for u, ids in units.items() if u.startswith("linked:")}


def test_an_env_var_and_the_flag_that_replaces_it_on_a_start_line_are_one_knob():
    e = delta("prefill", "SGLANG_ENABLE_FLASHINFER_FP8_GEMM", None, "flashinfer_trtllm", "added")
    (f,) = script_flags("decode", "python -m sglang.launch_server --tp-size 2",
                        "python -m sglang.launch_server --tp-size 2 --fp8-gemm-backend flashinfer_trtllm")
    d = with_knobs(diff_of(e, f), {"gpu1": registry()})
    by = {x.id: x for x in d.deltas}
    assert by[f.id].knob == by[e.id].knob == "flag:fp8_gemm_runner_backend"  # the flag's dest in 0.5.8
    assert linked(d) == {"linked:flag:fp8_gemm_runner_backend": (e.id, f.id)}
    assert d.links() == [[e.id, f.id]]


def test_a_flags_two_spellings_on_a_start_line_and_in_an_argument_string_are_one_knob():
    (p,) = script_flags("prefill", "python -m sglang.launch_server --tp-size 2",
                        "python -m sglang.launch_server --tp-size 4")
    q = delta("decode", "DECODE_ARGS", "--tensor-parallel-size 2", "--tensor-parallel-size=4",
              flag="--tensor-parallel-size", args_old="--tensor-parallel-size 2", args_new="--tensor-parallel-size=4")
    d = with_knobs(diff_of(p, q), {"gpu1": registry()})
    assert linked(d) == {"linked:flag:tp_size": (p.id, q.id)}


def test_the_same_flag_change_in_two_start_scripts_is_linked_without_a_registry():
    (p,) = script_flags("prefill", "python -m sglang.launch_server --page-size 16",
                        "python -m sglang.launch_server --page-size 64")
    (q,) = script_flags("decode", "python -m sglang.launch_server --page-size=16",
                        "python -m sglang.launch_server --page-size=64")
    (r,) = script_flags("router", "sglang-router launch --policy cache_aware", "sglang-router launch --policy random")
    d = with_knobs(diff_of(p, q, r), {"gpu1": None})
    assert linked(d) == {"linked:[--page-size]": (p.id, q.id)}
    # a different new value on one side is not the same change
    (q2,) = script_flags("decode", "python -m sglang.launch_server --page-size 16",
                         "python -m sglang.launch_server --page-size 32")
    assert linked(with_knobs(diff_of(p, q2), {"gpu1": None})) == {}


def test_a_flag_the_engine_does_not_read_is_marked_on_an_sglang_line_only():
    (typo,) = script_flags("decode", "python -m sglang.launch_server --tp-size 2",
                           "python -m sglang.launch_server --tp-size 2 --enable-metrix")
    (router,) = script_flags("router", "sglang-router launch --policy cache_aware",
                             "sglang-router launch --policy cache_aware --max-payload-size 4096")
    (gone,) = script_flags("prefill", "python -m sglang.launch_server --tp-size 2", "python -m sglang.launch_server")
    d = with_knobs(diff_of(typo, router, gone), {"gpu1": registry()})
    by = {x.id: x for x in d.deltas}
    assert by[typo.id].detail == ("--enable-metrix is not read by the installed sglang 0.5.8: typo or stale?",)
    assert by[router.id].detail == () and by[router.id].knob is None
    assert by[gone.id].detail == ("removed: back to the default 1",) and by[gone.id].knob == "flag:tp_size"
