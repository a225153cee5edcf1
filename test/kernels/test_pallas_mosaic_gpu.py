"""The Hopper Mosaic GPU attention kernel against attention_reference, in the Mosaic GPU interpreter.

The interpreter (InterpretGPUParams) simulates shared memory, TMA copies, mbarriers and wgmma on the
CPU, so these cases run the kernel's ring of K/V slots, its block skipping and its empty-row handling.
Each case spans several q tiles and kv blocks with the smallest wgmma tiles (64 x 64) and covers several
attributes; the file stays well under a minute. Cross-platform lowering for cuda is checked too.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import attention_inputs, jitted_reference

from hlofuse.kernels.pallas import mosaic_gpu
from hlofuse.kernels.pallas.mosaic_gpu import BlockSizes
from hlofuse.kernels.reference import attention_mask

TOL = dict(rtol=0, atol=3e-2)  # bf16 / f16 outputs, f32 softmax and accumulation
SMALL = BlockSizes(block_q=64, block_k=64, stages=2)
WINDOW = {"causal": False, "window_left": -1, "window_right": -1, "q_offset": 0}




def _compare(got: jax.Array, want: jax.Array) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    got_np, want_np = np.asarray(got.astype(jnp.float32)), np.asarray(want.astype(jnp.float32))
    np.testing.assert_array_equal(np.isnan(got_np), np.isnan(want_np))
    np.testing.assert_allclose(got_np, want_np, **TOL)


# (id, (B, T, S, N, K, H, D), dtype, attributes, lengths as functions of (B, T, S), block sizes)
CASES: list[tuple[str, tuple[int, ...], Any, dict[str, Any], dict[str, Any], BlockSizes]] = [
    # 4 query heads per kv head: 32 positions x 4 heads = 128 rows = 2 q tiles; causal skips kv blocks.
    ("causal_bottom_right_gqa_bf16", (1, 32, 192, 8, 2, 64, 64), jnp.bfloat16, dict(causal=True, q_offset=160),
     {}, SMALL),
    # A window of 40 keys behind and 8 ahead: each q tile sees 1-2 of the 5 kv blocks; soft-cap; f16;
    # one K/V slot (no copy runs ahead) and H = 48, D = 80 padded to 64 and 128.
    ("window_softcap_f16_padded_heads", (2, 64, 300, 2, 2, 48, 80), jnp.float16,
     dict(window_left=40, window_right=8, q_offset=200, softcap=5.0), {}, BlockSizes(64, 64, stages=1)),
    # MQA; kv lengths 0 and 70, q length 20 of 40: empty rows -> NaN with a -inf fill; three slots.
    ("mqa_lengths_empty_rows_nan", (2, 40, 256, 4, 1, 64, 64), jnp.bfloat16, dict(causal=True, q_offset=100),
     dict(q_lengths=lambda b, t, s: np.array([t, 20], np.int32),
          kv_lengths=lambda b, t, s: np.array([0, 70], np.int32)),
     BlockSizes(64, 64, stages=3)),
    # A finite fill (jax.nn's): rows that see no key are the mean of all S values; a 128-key block.
    ("window_empty_rows_finite_fill", (1, 64, 128, 2, 2, 64, 64), jnp.bfloat16,
     dict(window_left=0, window_right=0, q_offset=100, masked_value=-2.3819763e38), {}, BlockSizes(64, 128)),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_kernel_matches_reference_in_the_interpreter(case: Any) -> None:  # noqa: ANN401
    name, (b, t, s, n, kv, h, d), dtype, attrs, length_fns, blocks = case
    q, k, v = attention_inputs(0, b, t, s, n, kv, h, d, dtype)
    extra = {key: jnp.asarray(fn(b, t, s)) for key, fn in length_fns.items()}
    kw = {"scale": h**-0.5, **attrs}
    got = mosaic_gpu.attention(q, k, v, **kw, **extra, block_sizes=blocks, interpret=True)
    want = jitted_reference(q, k, v, extra, tuple(sorted(kw.items())))
    if "empty_rows" in name:
        visible = attention_mask(t, s, **{key: kw.get(key, default) for key, default in WINDOW.items()}, **extra)
        assert not np.asarray(visible.any(-1)).all(), "the case must hold rows that see no key"
    _compare(got, want)


def test_lowers_for_cuda_on_this_host_as_one_mosaic_gpu_call() -> None:
    q = jax.ShapeDtypeStruct((2, 256, 8, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, 1024, 2, 128), jnp.bfloat16)
    lengths = jax.ShapeDtypeStruct((2,), jnp.int32)

    def f(q: jax.Array, k: jax.Array, v: jax.Array, kv_len: jax.Array) -> jax.Array:
        return mosaic_gpu.attention(q, k, v, scale=0.1, causal=True, softcap=30.0, kv_lengths=kv_len)

    text = jax.jit(f).trace(q, kv, kv, lengths).lower(lowering_platforms=("cuda",)).as_text()
    assert re.findall(r"stablehlo\.custom_call @([\w$.]+)\(", text) == ["mosaic_gpu_v2"]


# ----------------------------------------------------------------------------- entry-point checks


def test_refusals_name_the_reason() -> None:
    q, k, v = attention_inputs(0, 1, 64, 64, 2, 1, 64, 64, jnp.float32)
    with pytest.raises(ValueError, match=r"bf16 or f16 \(wgmma would run f32 as tf32\), got float32"):
        mosaic_gpu.attention(q, k, v, scale=1.0)
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    with pytest.raises(ValueError, match="masked_value -10.0 must be -inf or <= -10000"):
        mosaic_gpu.attention(q, k, v, scale=1.0, masked_value=-10.0)
    wide_v = jnp.zeros((1, 64, 1, 320), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"D <= 256 \(wgmma's largest N\), got D = 320"):
        mosaic_gpu.attention(q, k, wide_v, scale=1.0)


def test_block_sizes_follow_wgmma_tiles() -> None:
    with pytest.raises(ValueError, match="block_q 32 must be a positive multiple of 64"):
        BlockSizes(block_q=32)
    with pytest.raises(ValueError, match="block_k 96 must be a multiple of 64 .* and at most 256"):
        BlockSizes(block_k=96)
    with pytest.raises(ValueError, match="block_k 512"):
        BlockSizes(block_k=512)
    with pytest.raises(ValueError, match="stages 0"):
        BlockSizes(stages=0)


def test_tiles_over_the_shared_memory_budget_are_rejected() -> None:
    q = jax.ShapeDtypeStruct((1, 256, 1, 256), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 1024, 1, 256), jnp.bfloat16)
    big = functools.partial(mosaic_gpu.attention, scale=1.0, block_sizes=BlockSizes(block_q=128, block_k=256, stages=3))
    with pytest.raises(ValueError, match=r"block_q=128, block_k=256, stages=3 .* KiB of shared memory > 227 KiB"):
        jax.eval_shape(big, q, kv, kv)
