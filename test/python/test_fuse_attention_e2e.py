"""Every attention variant: fused with the expected attributes, and numerically the original program.

Three programs run on the same inputs: the original, the fused one (XLA inlines each composite's
decomposition), and the fused one lowered to the jnp reference built from the composite's attributes
alone. The last comparison is what proves the attributes describe the op.
"""

from __future__ import annotations

import numpy as np
import pytest
from attention_variants import VARIANTS, Variant, lower
from jaxlib.mlir import ir

from hlofuse.pipeline import run_pipeline
from hlofuse.testing.modules import (
    assert_outputs_close,
    attention_attrs,
    clone_module,
    count_composites,
    run_module,
)

# bf16/f16 programs round differently once fused (f32 softmax inside the reference); allow the
# original program's own rounding noise at these sizes.
LOW_PRECISION_ATOL = {"bfloat16": 3e-2, "float16": 4e-3}


def _compare(expected: list[np.ndarray], actual: list[np.ndarray], inputs: list[np.ndarray] = ()) -> None:
    """Within the precision of the outputs, or of the inputs where those are coarser (bf16 q, k, v with an
    f32 result carry bf16 rounding)."""
    dtype = expected[0].dtype.name
    coarse = [a.dtype.name for a in inputs if a.dtype.name in LOW_PRECISION_ATOL]
    if coarse and dtype not in LOW_PRECISION_ATOL:
        dtype = coarse[0]
    if dtype in LOW_PRECISION_ATOL:
        assert_outputs_close(expected, actual, rtol=0.0, atol=LOW_PRECISION_ATOL[dtype])
    else:
        assert_outputs_close(expected, actual)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_variant_is_fused_and_matches(variant: Variant) -> None:
    original = lower(variant).compiler_ir("stablehlo")
    fused = clone_module(original)
    result = run_pipeline(fused, "default")
    assert count_composites(fused) == variant.sites, [str(r) for r in result.remarks]
    if variant.sites == 0:
        assert result.remarks, "a near-miss must say why it was not fused"
    for attrs in attention_attrs(fused):
        for key, want in variant.expect.items():
            got = getattr(attrs, key)
            assert got == pytest.approx(want) if isinstance(want, float) else got == want, (key, got, want)

    args = variant.args()
    expected = run_module(clone_module(original), args)
    _compare(expected, run_module(fused, args), args)
    if variant.sites:
        referenced = clone_module(fused)
        lowering = run_pipeline(referenced, "builtin.module(hlofuse-lower-kernels{target=reference})")
        assert lowering.counters["attention_to_reference"] == variant.sites
        assert count_composites(referenced) == 0
        _compare(expected, run_module(referenced, args), args)
        _check_cpu_kernel(fused, expected, args, variant)


def _check_cpu_kernel(fused: ir.Module, expected: list[np.ndarray], args: list[np.ndarray], variant: Variant) -> None:
    """target=cpu: the native kernel takes what it supports; the rest stay composites, with a remark."""
    from hlofuse.kernels import cpu

    if not cpu.is_available():
        pytest.skip("the native CPU kernels are not built")
    kernel = clone_module(fused)
    result = run_pipeline(kernel, "builtin.module(hlofuse-lower-kernels{target=cpu})")
    lowered = result.counters["attention_to_cpu"]
    kept = result.counters["attention_kept_composite"]
    assert lowered + kept == variant.sites
    assert len(result.remarks) == kept
    dtype = np.dtype(variant.shapes[0][1]).name
    if dtype in ("float32", "bfloat16"):
        assert lowered == variant.sites, [str(r) for r in result.remarks]
        assert "hlofuse_attention" in str(kernel)
    _compare(expected, run_module(kernel, args), args)
