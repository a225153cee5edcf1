"""Flash attention for the TPU: a Pallas Mosaic kernel over a (B, K, q blocks, splits, kv blocks) grid.

The innermost grid axis walks kv blocks ("arbitrary": sequential, the softmax state lives in VMEM
scratch); the others are "parallel". Tiles are (block_q rows, head_pad) for q and (block_k, head_pad)
for K/V with head_pad a multiple of 128 lanes, so both dots feed the MXU full tiles; small head dims
are zero-padded (the padding adds nothing to q·kᵀ and its P·V columns are sliced off).

Blocks no row can see (causal, sliding window, q/kv lengths) are skipped twice: the kv index map
clamps them to the nearest needed block, so the pipeline issues no new DMA, and `pl.when` skips the
compute. Lengths arrive by scalar prefetch (SMEM), so both decisions are made per batch row.

Running max and sum are kept lane-replicated, (block_q, 128) f32, as Mosaic lays out row vectors.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from hlofuse.kernels.pallas import common
from hlofuse.kernels.pallas.common import Plan

LANES = 128
SUBLANES = 8
# The scoped VMEM a kernel may use without raising the limit (16 MiB on v4/v5e, more on later chips),
# and the most this module asks for (every TPU since v4 has at least 32 MiB of VMEM).
DEFAULT_SCOPED_VMEM = 16 * 2**20
MAX_VMEM = 32 * 2**20


def inner_keys(plan: Plan) -> int:
    """Keys per slice of the kernel's inner loop over a kv block (block_k: no loop)."""
    width = plan.block_k_inner or plan.block_k
    return width if plan.block_k % width == 0 else plan.block_k


def vmem_bytes(plan: Plan, itemsize: int) -> int:
    """Estimated VMEM of one grid step: double-buffered tiles, scratch and the f32 (block_q, key slice) temporaries."""
    bq, bk, hp, dp = plan.block_q, plan.block_k, plan.head_pad, plan.value_pad
    tiles = (bq * hp + bk * hp + bk * dp) * itemsize + bq * dp * max(itemsize, 4) + 2 * bq * LANES * 4
    tiles += (int(plan.bias_rows > 0) + int(plan.mask_rows > 0)) * bq * bk * 4
    scratch = (2 * bq * LANES + bq * dp) * 4
    return 2 * tiles + scratch + 4 * bq * inner_keys(plan) * 4


def _kernel(plan: Plan, has_bias: bool, has_mask: bool, has_empty: bool, *refs: Any) -> None:
    """One (b, kv head, q block, split, kv block) step of the online softmax."""
    lens_ref, q_ref, k_ref, v_ref, *rest = refs
    bias_ref = rest.pop(0) if has_bias else None
    mask_ref = rest.pop(0) if has_mask else None
    empty_ref = rest.pop(0) if has_empty else None
    out_refs, (m_sc, l_sc, acc_sc) = rest[:-3], rest[-3:]
    b, iq, split, i = pl.program_id(0), pl.program_id(2), pl.program_id(3), pl.program_id(4)
    q_len, kv_len = lens_ref[b, 0], lens_ref[b, 1]
    q_offset = lens_ref[b, 2] if plan.dynamic_q_offset else None
    j = split * plan.blocks_per_split + i

    @pl.when(i == 0)
    def _init() -> None:
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    lo, hi = common.kv_block_range(plan, iq, q_len, kv_len, q_offset)

    def key_slice(c: Any, width: int) -> None:  # noqa: ANN401
        """The online softmax over keys [c * width, (c + 1) * width) of this kv block."""
        key0 = c * width if isinstance(c, int) else pl.multiple_of(c * width, width)
        q = q_ref[...]  # (block_q, head_pad)
        k = k_ref[pl.ds(key0, width), :]  # (width, head_pad)
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        s = common.logits(plan, s)  # (block_q, width)
        if bias_ref is not None:
            s = s + bias_ref[:, pl.ds(key0, width)]  # (block_q | 1, width)
        shape = (plan.block_q, width)
        key_first = j * plan.block_k + key0
        ok = common.visible(plan, iq * plan.block_q, key_first, q_len, kv_len, shape, q_offset=q_offset)
        if mask_ref is not None:
            ok = ok & (mask_ref[:, pl.ds(key0, width)] != 0)
        s = jnp.where(ok, s, -jnp.inf)
        m_prev = m_sc[...]  # (block_q, LANES), lane-replicated
        p, alpha, m_new, l_new = common.online_softmax_step(s, m_prev[:, :1], l_sc[...][:, :1])
        m_sc[...] = jnp.broadcast_to(m_new, m_sc.shape)
        l_sc[...] = jnp.broadcast_to(l_new, l_sc.shape)
        v = v_ref[pl.ds(key0, width), :]  # (width, value_pad)
        pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        acc_sc[...] = acc_sc[...] * alpha + pv

    @pl.when((j >= lo) & (j <= hi))
    def _step() -> None:
        width = inner_keys(plan)
        if width == plan.block_k:
            key_slice(0, width)
        else:  # a loop, not unrolled: one slice's f32 logits live at a time (unrolled, the scheduler spills)
            lax.fori_loop(0, plan.block_k // width, lambda c, carry: (key_slice(c, width), carry)[1], None)

    @pl.when(i == plan.blocks_per_split - 1)
    def _write() -> None:
        if not plan.writes_partials:
            (o_ref,) = out_refs
            empty = None if empty_ref is None else empty_ref[...]  # (1, value_pad)
            o_ref[...] = common.finalize(acc_sc[...], l_sc[...][:, :1], empty).astype(o_ref.dtype)
        else:
            acc_out_ref, m_out_ref, l_out_ref = out_refs
            acc_out_ref[...] = acc_sc[...]
            m_out_ref[...] = m_sc[...]
            l_out_ref[...] = l_sc[...]


def flash_attention(
    plan: Plan,
    q: jax.Array,  # (B, K, rows_pad, head_pad)
    k: jax.Array,  # (B, K, keys_pad, head_pad)
    v: jax.Array,  # (B, K, keys_pad, value_pad)
    lens: jax.Array,  # (B, 2) int32, or (B, 4) with each row's q_offset third (plan.dynamic_q_offset)
    bias: jax.Array | None,  # (B|1, K|1, 1|rows_pad, keys_pad) f32
    mask: jax.Array | None,  # (B|1, K|1, 1|rows_pad, keys_pad) int32
    empty: jax.Array | None,  # (B, K, 1, value_pad) f32
    *,
    out_dtype: Any,  # noqa: ANN401
    interpret: Any = False,  # noqa: ANN401
) -> tuple[jax.Array, ...]:
    """The pallas_call: o (B, K, rows_pad, value_pad), or per-split (acc, m, l) when plan.writes_partials."""
    bq, bk, nps = plan.block_q, plan.block_k, plan.blocks_per_split
    grid = (plan.b, plan.kv_heads, plan.num_q_blocks, plan.num_splits, nps)

    def kv_map(b: jax.Array, h: jax.Array, iq: jax.Array, split: jax.Array, i: jax.Array, lens_ref: Any) -> Any:  # noqa: ANN401
        q_offset = lens_ref[b, 2] if plan.dynamic_q_offset else None
        lo, hi = common.kv_block_range(plan, iq, lens_ref[b, 0], lens_ref[b, 1], q_offset)
        j = jnp.clip(split * nps + i, lo, jnp.maximum(hi, lo))
        return b, h, jnp.minimum(j, plan.num_k_blocks - 1), 0

    def q_map(b: jax.Array, h: jax.Array, iq: jax.Array, split: jax.Array, i: jax.Array, lens_ref: Any) -> Any:  # noqa: ANN401
        return b, h, iq, 0

    def side_spec(sizes: tuple[int, int, int]) -> pl.BlockSpec:
        batch, heads, rows = sizes

        def index(b: jax.Array, h: jax.Array, iq: jax.Array, split: jax.Array, i: jax.Array, lens_ref: Any) -> Any:  # noqa: ANN401
            kv = kv_map(b, h, iq, split, i, lens_ref)[2]
            return (b if batch > 1 else 0), (h if heads > 1 else 0), (iq if rows > 1 else 0), kv

        return pl.BlockSpec((None, None, bq if rows > 1 else 1, bk), index)

    in_specs = [
        pl.BlockSpec((None, None, bq, plan.head_pad), q_map),
        pl.BlockSpec((None, None, bk, plan.head_pad), kv_map),
        pl.BlockSpec((None, None, bk, plan.value_pad), kv_map),
    ]
    operands = [q, k, v]
    if bias is not None:
        in_specs.append(side_spec((plan.bias_batch, plan.bias_heads, plan.bias_rows)))
        operands.append(bias)
    if mask is not None:
        in_specs.append(side_spec((plan.mask_batch, plan.mask_heads, plan.mask_rows)))
        operands.append(mask)
    if empty is not None:
        in_specs.append(pl.BlockSpec((None, None, 1, plan.value_pad), lambda b, h, *_: (b, h, 0, 0)))
        operands.append(empty)

    b, kh, rp, dp = plan.b, plan.kv_heads, plan.rows_pad, plan.value_pad
    if not plan.writes_partials:
        out_shape: tuple[jax.ShapeDtypeStruct, ...] = (jax.ShapeDtypeStruct((b, kh, rp, dp), out_dtype),)
        out_specs: tuple[pl.BlockSpec, ...] = (pl.BlockSpec((None, None, bq, dp), q_map),)
    else:

        def split_map(b: jax.Array, h: jax.Array, iq: jax.Array, split: jax.Array, i: jax.Array, lens_ref: Any) -> Any:  # noqa: ANN401
            return b, h, split, iq, 0

        sp = plan.num_splits
        out_shape = (
            jax.ShapeDtypeStruct((b, kh, sp, rp, dp), jnp.float32),
            jax.ShapeDtypeStruct((b, kh, sp, rp, LANES), jnp.float32),
            jax.ShapeDtypeStruct((b, kh, sp, rp, LANES), jnp.float32),
        )
        out_specs = (
            pl.BlockSpec((None, None, None, bq, dp), split_map),
            pl.BlockSpec((None, None, None, bq, LANES), split_map),
            pl.BlockSpec((None, None, None, bq, LANES), split_map),
        )
    vmem = vmem_bytes(plan, jnp.dtype(q.dtype).itemsize)
    if vmem > MAX_VMEM:
        raise ValueError(
            f"TPU tiles block_q={bq}, block_k={bk} with head dims ({plan.head_pad}, {dp}) need about "
            f"{vmem / 2**20:.1f} MiB of VMEM > {MAX_VMEM // 2**20} MiB: use smaller BlockSizes"
        )
    kernel = functools.partial(_kernel, plan, bias is not None, mask is not None, empty is not None)
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=grid,
            in_specs=in_specs,
            out_specs=out_specs,
            scratch_shapes=[
                pltpu.VMEM((bq, LANES), jnp.float32),
                pltpu.VMEM((bq, LANES), jnp.float32),
                pltpu.VMEM((bq, dp), jnp.float32),
            ],
        ),
        out_shape=out_shape,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=MAX_VMEM if vmem > DEFAULT_SCOPED_VMEM else None,
        ),
        interpret=interpret,
        name="hlofuse_flash_attention_tpu",
    )(lens, *operands)
