"""hlofuse: fuses attention and token sampling in JAX/StableHLO programs into hand-written kernels.

Use it through `jax.jit(f, compiler_options={"hlofuse_pipeline": "default"})` (no import needed once
installed), through `hlofuse-opt` on dumped modules, or explicitly with `hlofuse.attention(...)`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# jax sets this default before it loads jaxlib's C++ library; hlofuse's modules import jaxlib.mlir, which loads that
# library, and may come first (hlofuse-opt does): without it every PJRT plugin's INFO lines reach stderr.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

__version__ = "0.1.0"

if TYPE_CHECKING:
    from hlofuse.api import attention as attention
    from hlofuse.api import sample as sample

__all__ = ["__version__", "attention", "sample"]


def __getattr__(name: str) -> Any:  # noqa: ANN401 - lazy re-export keeps `import hlofuse` cheap
    if name == "attention":
        from hlofuse.api import attention

        return attention
    if name == "sample":
        from hlofuse.api import sample

        return sample
    raise AttributeError(f"module 'hlofuse' has no attribute {name!r}")
