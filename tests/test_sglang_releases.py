"""The knob reader over the real SGLang wheels (issue 37): one release per minor line of every layout
SGLang shipped, downloaded by scripts/sglang_wheels.py (envbisect/sim/sglang_release.py) into a cache
outside the repo, and each release's registry checked against what its own files declare: the counts,
an env alias pair, a variable that gave way to a flag, ``--tp-size``/``--tensor-parallel-size``, a
default. Under scripts/test.sh (ENVBISECT_REQUIRE_SGLANG set) a release missing from the cache fails."""
from __future__ import annotations

import os

import pytest

from envbisect.sim import sglang_release as rel
from envbisect.state.knobs import UnknownLayout, no_env_registry_note, parse_sglang_files


def _required() -> bool:
    return any(os.environ.get(v, "").strip().lower() not in ("", "0", "false", "no")
               for v in ("CI", "ENVBISECT_REQUIRE_SGLANG"))


def release_files(version: str) -> dict[str, str]:
    d = rel.release_dir(version)
    if d is None:
        msg = f"sglang {version} is not in {rel.cache_root()} (scripts/sglang_wheels.py downloads it)"
        if _required():
            pytest.fail(msg + " -- required because CI/ENVBISECT_REQUIRE_SGLANG is set", pytrace=False)
        try:
            d = rel.fetch(version)
        except (RuntimeError, OSError) as e:
            pytest.skip(f"{msg}: {e}")
    return rel.read_files(d)


# release: (env vars, renamed old -> new, env -> flag, flag spellings, ServerArgs fields, retired flags)
COUNTS = {
    "0.4.10": (0, 0, 0, 187, 180, 0),
    "0.5.3": (64, 0, 0, 247, 239, 7),
    "0.5.8": (189, 4, 7, 334, 326, 2),
    "0.5.13": (385, 10, 3, 413, 397, 4),
    "0.5.18": (543, 17, 6, 498, 472, 3),
    "0.5.23": (770, 4, 4, 547, 544, 0),
}

# release: (an old env name, the name it is read as, its default)
ALIAS = {
    "0.5.8": ("SGLANG_GC_LOG", "SGLANG_LOG_GC", "false"),  # _print_deprecated_env(new_name, old_name)
    "0.5.13": ("SGLANG_NSA_FUSE_TOPK", "SGLANG_DSA_FUSE_TOPK", "true"),  # EnvBoolWithAlias(deprecated_name=)
    "0.5.18": ("SGLANG_ENABLE_NVTX", "SGLANG_ENABLE_NVTX_SCHEDULER", "false"),  # EnvBoolWithAlias
    "0.5.23": ("SGLANG_EPLB_ROCM_P2P_BATCH_CHUNK_SIZE", "SGLANG_EPLB_P2P_BATCH_CHUNK_SIZE", "32"),  # EnvIntWithAlias
}

# release: (a variable that gave way to a flag, the flag)
TO_FLAG = {
    "0.5.8": ("SGLANG_ENABLE_FLASHINFER_FP8_GEMM", "--fp8-gemm-backend"),  # _warn_deprecated_env_to_cli_flag
    "0.5.13": ("SGLANG_PREFILL_DELAYER_MAX_DELAY_PASSES", "--prefill-delayer-max-delay-passes"),
    "0.5.18": ("SGLANG_SCHEDULER_DECREASE_PREFILL_IDLE", "--enable-prefill-delayer"),  # _DEPRECATED_ENVS note
    "0.5.23": ("SGLANG_FLASHINFER_MNNVL_CUTEDSL_AR_FUSION", "--flashinfer-allreduce-fusion-backend"),
}


@pytest.mark.parametrize("version", rel.PINNED)
def test_each_release_read_from_its_own_files(version):
    reg = parse_sglang_files(release_files(version))
    assert reg.version == version  # _version.py from 0.5.8 on, version.py before
    envs, renamed, to_flag, flags, fields, retired = COUNTS[version]
    assert (len(reg.envs), len(reg.renamed), len(reg.env_to_flag), len(reg.flags), len(reg.fields),
            len(reg.retired_flags)) == (envs, renamed, to_flag, flags, fields, retired)
    tp = reg.flag("--tp-size")
    assert tp is not None and tp.name == "flag:tp_size" and tp == reg.flag("--tensor-parallel-size=2")
    assert reg.default(tp) == "1" and {"--tp-size", "--tensor-parallel-size"} <= set(reg.aliases(tp))
    assert reg.flag("--model") == reg.flag("--model-path") and reg.flag("--kv-cache-dtype").default == "auto"
    assert reg.flag("--disaggregation-transfer-backend").default == "mooncake"
    assert reg.flag("--no-such-flag") is None and reg.owns("--no-such-flag")
    if version in ALIAS:
        old, new, default = ALIAS[version]
        k = reg.knob(old)
        assert k is not None and k == reg.knob(new) and k.name == new and reg.default(k) == default
        assert old in reg.aliases(k)
    if version in TO_FLAG:
        env, flag = TO_FLAG[version]
        assert reg.knob(env) is not None and reg.knob(env) == reg.flag(flag)
        assert env in reg.aliases(reg.flag(flag))
    for f in reg.env_to_flag.values():  # every replacing flag is a flag of the same release
        assert reg.flag(f) is not None, f


def test_0_4_has_no_env_registry_and_says_so():
    reg = parse_sglang_files(release_files("0.4.10"))
    assert not reg.env_registry and reg.knob("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT") is None
    assert not reg.owns("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT")  # never "typo or stale?" without a registry
    assert "sglang 0.4.10 has no srt/environ.py" in no_env_registry_note(reg)
    assert no_env_registry_note(parse_sglang_files(release_files("0.5.3"))) is None


def test_a_fallback_is_the_default_of_an_unset_field():
    """0.5.23: ``swa_full_tokens_ratio: A[Optional[float], Arg(..., fallback=0.8)] = None`` answers 0.8."""
    assert parse_sglang_files(release_files("0.5.23")).flag("--swa-full-tokens-ratio").default == "0.8"
    assert parse_sglang_files(release_files("0.5.18")).flag("--swa-full-tokens-ratio").default == "0.8"


def test_retired_names_are_not_read():
    reg = parse_sglang_files(release_files("0.5.18"))
    assert "SGLANG_PER_TOKEN_GROUP_QUANT_8BIT_V2" in reg.retired_envs
    assert reg.knob("SGLANG_PER_TOKEN_GROUP_QUANT_8BIT_V2") is None
    assert "--enable-expert-distribution-metrics" in reg.retired_flags
    assert reg.flag("--enable-expert-distribution-metrics") is None  # refused with an error now


def test_a_newer_layout_is_refused_never_read_wrong():
    """The newest release's server_args.py without the namespaces it is assembled from, and a ServerArgs
    whose annotations this parser does not know: a clear UnknownLayout, not a registry of no flags."""
    files = release_files("0.5.23")
    without = {p: t for p, t in files.items() if not p.startswith("srt/arg_groups/fields/parallel")}
    with pytest.raises(UnknownLayout, match="namespaces not found in srt/arg_groups/fields/: Parallel"):
        parse_sglang_files(without)
    old = release_files("0.5.18")
    renamed_marker = old["srt/server_args.py"].replace(" A[", " Field[")
    with pytest.raises(UnknownLayout, match="none is annotated as this parser knows"):
        parse_sglang_files({**old, "srt/server_args.py": renamed_marker})


def test_the_newest_release_on_the_index_reads():
    """The newest 0.5.x (looked up by scripts/sglang_wheels.py) reads as a full registry: a release whose
    layout breaks the reader fails here, not on a user's night."""
    newest = rel.newest()
    if newest is None:
        if _required():
            pytest.fail(f"no newest release remembered in {rel.cache_root()} (scripts/sglang_wheels.py)",
                        pytrace=False)
        pytest.skip("the newest release is not known")
    reg = parse_sglang_files(release_files(newest))
    assert reg.version == newest
    assert len(reg.envs) >= COUNTS["0.5.23"][0] * 0.8 and len(reg.flags) >= COUNTS["0.5.23"][3] * 0.8
    assert reg.flag("--tp-size") == reg.flag("--tensor-parallel-size") is not None
