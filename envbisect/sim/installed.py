"""The simulated deployment's installed SGLang: a tiny site-packages with ``sglang/__init__.py`` (its
version), ``sglang/srt/environ.py`` and ``sglang/srt/server_args.py`` shaped like the real package's
files (an ``Envs`` class of ``EnvBool``/``EnvInt``/... fields, the ``SGL_`` -> ``SGLANG_`` rewrite, a
renamed variable, one variable that gave way to a flag; a ``ServerArgs`` dataclass and its
``add_argument`` calls), on the workers' ``PYTHONPATH`` so that envbisect reads what the workers'
python would import (hosts/engine.py). The workers never import it."""
from __future__ import annotations

from pathlib import Path

VERSION = "0.5.3"

# every SGLANG_* variable the simulated workers and their scenarios use, with a documented default
_ENVS = {
    "SGLANG_KV_PAGE_SIZE": ("EnvInt", "1"), "SGLANG_KV_CACHE_DTYPE": ("EnvStr", '"auto"'),
    "SGLANG_SM120_MMA_TARGET_CTAS": ("EnvInt", "128"), "SGLANG_ENABLE_JIT_DEEPGEMM": ("EnvBool", "True"),
    "SGLANG_ENABLE_TRANSFER_COALESCE": ("EnvBool", "False"),
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": ("EnvInt", "300"),
    "SGLANG_DISAGGREGATION_THREAD_POOL_SIZE": ("EnvInt", "None"),
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": ("EnvInt", "300"),
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": ("EnvFloat", "5.0"),
    "SGLANG_CUDA_GRAPH_MAX_BS": ("EnvInt", "None"), "SGLANG_SCHEDULER_INTERVAL": ("EnvInt", "None"),
    "SGLANG_TEST_RETRACT": ("EnvBool", "False"), "SGLANG_ENABLE_TORCH_COMPILE": ("EnvBool", "False"),
    "SGLANG_LOG_GC": ("EnvBool", "False"), "SGLANG_ENABLE_FLASHINFER_FP8_GEMM": ("EnvBool", "False"),
}

_ENVIRON = '''import os
import warnings


class EnvField:
    def __init__(self, default):
        self.default = default

    @property
    def value(self):
        return os.environ.get(self.name, self.default)


class EnvBool(EnvField):
    pass


class EnvInt(EnvField):
    pass


class EnvFloat(EnvField):
    pass


class EnvStr(EnvField):
    pass


class Envs:
    # fmt: off
{fields}
    # fmt: on


envs = Envs()


def _print_deprecated_env(new_name: str, old_name: str):
    if old_name in os.environ:
        warnings.warn(f"Environment variable {{old_name}} will be deprecated, please use {{new_name}} instead")
        os.environ[new_name] = os.environ[old_name]


def _warn_deprecated_env_to_cli_flag(env_name: str, suggestion: str):
    if env_name in os.environ:
        warnings.warn(f"Environment variable {{env_name}} is deprecated. {{suggestion}}")


def _convert_SGL_to_SGLANG():
    _print_deprecated_env("SGLANG_LOG_GC", "SGLANG_GC_LOG")
    for key, value in os.environ.items():
        if key.startswith("SGL_"):
            new_key = key.replace("SGL_", "SGLANG_", 1)
            warnings.warn(f"Environment variable {{key}} is deprecated, please use {{new_key}}")
            os.environ[new_key] = value


_convert_SGL_to_SGLANG()

_warn_deprecated_env_to_cli_flag(
    "SGLANG_ENABLE_FLASHINFER_FP8_GEMM", "Please use '--fp8-gemm-backend=flashinfer_trtllm' instead."
)
'''

_SERVER_ARGS = '''import argparse
import dataclasses
from typing import List, Optional


@dataclasses.dataclass
class ServerArgs:
    model_path: str
    page_size: Optional[int] = None
    kv_cache_dtype: str = "auto"
    tp_size: int = 1
    mem_fraction_static: Optional[float] = None
    chunked_prefill_size: Optional[int] = None
    attention_backend: Optional[str] = None
    disable_radix_cache: bool = False
    enable_metrics: bool = False
    cuda_graph_bs: Optional[List[int]] = None
    disaggregation_mode: str = "null"
    disaggregation_transfer_backend: str = "mooncake"
    fp8_gemm_backend: str = "auto"

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        parser.add_argument("--model-path", "--model", type=str, required=True)
        parser.add_argument("--page-size", type=int, default=ServerArgs.page_size)
        parser.add_argument("--kv-cache-dtype", type=str, default=ServerArgs.kv_cache_dtype)
        parser.add_argument("--tensor-parallel-size", "--tp-size", type=int, default=ServerArgs.tp_size)
        parser.add_argument("--mem-fraction-static", type=float, default=ServerArgs.mem_fraction_static)
        parser.add_argument("--chunked-prefill-size", type=int, default=ServerArgs.chunked_prefill_size)
        parser.add_argument("--attention-backend", type=str, default=ServerArgs.attention_backend)
        parser.add_argument("--disable-radix-cache", action="store_true")
        parser.add_argument("--enable-metrics", action="store_true")
        parser.add_argument("--cuda-graph-bs", type=int, nargs="+")
        parser.add_argument("--disaggregation-mode", type=str, default=ServerArgs.disaggregation_mode)
        parser.add_argument("--disaggregation-transfer-backend", type=str,
                            default=ServerArgs.disaggregation_transfer_backend)
        parser.add_argument("--fp8-gemm-backend", type=str, default=ServerArgs.fp8_gemm_backend)
'''


def write_installed_sglang(root: Path) -> Path:
    """Write the package under ROOT/site-packages; returns that directory (for PYTHONPATH)."""
    site = root / "site-packages"
    pkg = site / "sglang" / "srt"
    pkg.mkdir(parents=True, exist_ok=True)
    (site / "sglang" / "__init__.py").write_text(f'__version__ = "{VERSION}"\n')
    (pkg / "__init__.py").write_text("")
    fields = "\n".join(f"    {name} = {kind}({default})" for name, (kind, default) in _ENVS.items())
    (pkg / "environ.py").write_text(_ENVIRON.format(fields=fields))
    (pkg / "server_args.py").write_text(_SERVER_ARGS)
    return site
