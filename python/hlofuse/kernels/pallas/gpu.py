"""Flash attention for the GPU: a Pallas kernel on the Triton backend (named by its compiler params).

One program per (b, kv head, q block x split) holds a (block_q, head_pad) tile of rows in registers
and loops over its kv blocks (FlashAttention-2's loop order): the loop bounds come from causal,
window and lengths, so fully masked blocks are never loaded. K and V stay in the canonical
(B, S, K, H) layout and are read with strided loads; Triton needs power-of-two tiles, so head dims are
padded to one (at least 16, the tensor-core minimum).

With num_splits > 1 (flash-decoding) each program covers 1/num_splits of the kv blocks and writes its
unnormalised partial output and softmax state; `common.combine` merges them.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from hlofuse.kernels.pallas import common
from hlofuse.kernels.pallas.common import Plan


def _kernel(plan: Plan, has_bias: bool, has_mask: bool, has_empty: bool, *refs: Any) -> None:
    """All kv blocks of one (b, kv head, q block, split): online softmax in registers."""
    lens_ref, q_ref, k_ref, v_ref, *rest = refs
    bias_ref = rest.pop(0) if has_bias else None
    mask_ref = rest.pop(0) if has_mask else None
    empty_ref = rest.pop(0) if has_empty else None
    out_refs = rest
    bq, bk, nps = plan.block_q, plan.block_k, plan.blocks_per_split
    program = pl.program_id(2)
    iq, split = lax.div(program, plan.num_splits), lax.rem(program, plan.num_splits)
    q_len, kv_len = lens_ref[0], lens_ref[1]
    q_offset = lens_ref[2] if plan.dynamic_q_offset else None
    lo, hi = common.kv_block_range(plan, iq, q_len, kv_len, q_offset)
    start = jnp.maximum(lo, split * nps)
    stop = jnp.minimum(hi + 1, split * nps + nps)
    q = q_ref[...]  # (block_q, head_pad)

    def body(j: jax.Array, carry: tuple[jax.Array, jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array]:
        m_prev, l_prev, acc = carry  # (block_q, 1), (block_q, 1), (block_q, value_pad)
        keys = pl.ds(pl.multiple_of(j * bk, bk), bk)
        k = k_ref[keys, :]  # (block_k, head_pad)
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        s = common.logits(plan, s)  # (block_q, block_k)
        if bias_ref is not None:
            s = s + bias_ref[:, keys]  # (block_q | 1, block_k)
        ok = common.visible(plan, iq * bq, j * bk, q_len, kv_len, (bq, bk), q_offset=q_offset)
        if mask_ref is not None:
            ok = ok & (mask_ref[:, keys] != 0)
        s = jnp.where(ok, s, -jnp.inf)
        p, alpha, m_new, l_new = common.online_softmax_step(s, m_prev, l_prev)
        v = v_ref[keys, :]  # (block_k, value_pad)
        pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        return m_new, l_new, acc * alpha + pv

    init = (
        jnp.full((bq, 1), -jnp.inf, jnp.float32),
        jnp.zeros((bq, 1), jnp.float32),
        jnp.zeros((bq, plan.value_pad), jnp.float32),
    )
    m, l, acc = lax.fori_loop(start, stop, body, init)
    if not plan.writes_partials:
        (o_ref,) = out_refs
        empty = None if empty_ref is None else empty_ref[...][None, :]  # (1, value_pad)
        o_ref[...] = common.finalize(acc, l, empty).astype(o_ref.dtype)
    else:
        acc_ref, m_ref, l_ref = out_refs
        acc_ref[...] = acc
        m_ref[...] = m[:, 0]
        l_ref[...] = l[:, 0]


def flash_attention(
    plan: Plan,
    q: jax.Array,  # (B, K, rows_pad, head_pad)
    k: jax.Array,  # (B, keys_pad, K, head_pad)
    v: jax.Array,  # (B, keys_pad, K, value_pad)
    lens: jax.Array,  # (B, 2) int32, or (B, 4) with each row's q_offset third (plan.dynamic_q_offset)
    bias: jax.Array | None,  # (B|1, K|1, 1|rows_pad, keys_pad) f32
    mask: jax.Array | None,  # (B|1, K|1, 1|rows_pad, keys_pad) int8
    empty: jax.Array | None,  # (B, K, value_pad) f32
    *,
    out_dtype: Any,  # noqa: ANN401
    num_warps: int,
    num_stages: int,
    interpret: Any = False,  # noqa: ANN401
) -> tuple[jax.Array, ...]:
    """The pallas_call: o (B, K, rows_pad, value_pad), or per-split (acc, m, l) when plan.writes_partials."""
    bq, sp = plan.block_q, plan.num_splits
    grid = (plan.b, plan.kv_heads, plan.num_q_blocks * sp)

    def q_map(b: jax.Array, h: jax.Array, p: jax.Array) -> Any:  # noqa: ANN401
        return b, h, lax.div(p, sp), 0

    def kv_map(b: jax.Array, h: jax.Array, p: jax.Array) -> Any:  # noqa: ANN401
        return b, 0, h, 0

    def side_spec(sizes: tuple[int, int, int]) -> pl.BlockSpec:
        batch, heads, rows = sizes

        def index(b: jax.Array, h: jax.Array, p: jax.Array) -> Any:  # noqa: ANN401
            return (b if batch > 1 else 0), (h if heads > 1 else 0), (lax.div(p, sp) if rows > 1 else 0), 0

        return pl.BlockSpec((None, None, bq if rows > 1 else 1, plan.keys_pad), index)

    in_specs = [
        pl.BlockSpec((None, lens.shape[1]), lambda b, h, p: (b, 0)),
        pl.BlockSpec((None, None, bq, plan.head_pad), q_map),
        pl.BlockSpec((None, plan.keys_pad, None, plan.head_pad), kv_map),
        pl.BlockSpec((None, plan.keys_pad, None, plan.value_pad), kv_map),
    ]
    operands = [lens, q, k, v]
    if bias is not None:
        in_specs.append(side_spec((plan.bias_batch, plan.bias_heads, plan.bias_rows)))
        operands.append(bias)
    if mask is not None:
        in_specs.append(side_spec((plan.mask_batch, plan.mask_heads, plan.mask_rows)))
        operands.append(mask)
    if empty is not None:
        in_specs.append(pl.BlockSpec((None, None, plan.value_pad), lambda b, h, p: (b, h, 0)))
        operands.append(empty)

    b, kh, rp, dp = plan.b, plan.kv_heads, plan.rows_pad, plan.value_pad
    if not plan.writes_partials:
        out_shape: tuple[jax.ShapeDtypeStruct, ...] = (jax.ShapeDtypeStruct((b, kh, rp, dp), out_dtype),)
        out_specs: tuple[pl.BlockSpec, ...] = (pl.BlockSpec((None, None, bq, dp), q_map),)
    else:

        def split_map(b: jax.Array, h: jax.Array, p: jax.Array) -> Any:  # noqa: ANN401
            return b, h, lax.rem(p, sp), lax.div(p, sp), 0

        def state_map(b: jax.Array, h: jax.Array, p: jax.Array) -> Any:  # noqa: ANN401
            return b, h, lax.rem(p, sp), lax.div(p, sp)

        out_shape = (
            jax.ShapeDtypeStruct((b, kh, sp, rp, dp), jnp.float32),
            jax.ShapeDtypeStruct((b, kh, sp, rp), jnp.float32),
            jax.ShapeDtypeStruct((b, kh, sp, rp), jnp.float32),
        )
        out_specs = (
            pl.BlockSpec((None, None, None, bq, dp), split_map),
            pl.BlockSpec((None, None, None, bq), state_map),
            pl.BlockSpec((None, None, None, bq), state_map),
        )
    kernel = functools.partial(_kernel, plan, bias is not None, mask is not None, empty is not None)
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="hlofuse_flash_attention_gpu",
    )(*operands)
