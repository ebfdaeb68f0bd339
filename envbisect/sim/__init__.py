"""Simulated SGLang PD deployment (real sglang-router + simulated prefill/decode workers).

``from envbisect.sim import build`` -- see :mod:`envbisect.sim.stack`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["build", "SimDeployment", "DEFAULT_RULES"]


def __getattr__(name: str) -> Any:  # lazy: keep `python -m envbisect.sim.worker` light
    if name in __all__:
        from envbisect.sim import stack

        return getattr(stack, name)
    raise AttributeError(name)
