"""Flash attention for Hopper GPUs: a Pallas Mosaic GPU kernel (TMA copies, mbarriers, wgmma).

One CTA (a single warpgroup, 128 threads) per (q tile, kv head, batch) holds block_q rows of the GQA
row layout (common.rows_layout: the G query heads of one kv head share every K/V tile, so nothing is
copied per head) and walks the kv blocks its rows can see (`common.kv_block_range`: causal, sliding
window, q/kv lengths), so fully masked blocks are neither loaded nor multiplied. K/V tiles arrive by
TMA into a ring of `stages` shared-memory slots, each with its own mbarrier; the copy of block
i + stages is issued as soon as block i's wgmmas have read its slot, so `stages - 1` copies are in
flight behind the compute (the Hopper analogue of Triton's num_stages).

Per kv block, FlashAttention-2's step with both matmuls on wgmma (f32 accumulators):
  S = Q·Kᵀ (wgmma, Q and K from swizzled SMEM) -> scale, soft-cap -> mask -> online softmax in the
  WGMMA register layout -> P rounded to v's dtype, stored to SMEM -> acc += P·V (wgmma).
P goes through SMEM, not registers, because the Mosaic GPU interpreter (the only place this kernel has
run) takes wgmma operands from SMEM only; on hardware that is one (block_q, block_k) store per step.

wgmma multiplies 16-bit floats (bf16, f16) with f32 accumulation; f32 operands would run as tf32
(10-bit mantissa), which does not reproduce the f32 reference, so f32 is rejected. Tiles follow
wgmma's rules: block_q a multiple of 64 (a warpgroup's M), block_k and the padded head dims multiples
of 64 elements (one 128-byte swizzle row of 16-bit values), the padded value dim at most 256 (wgmma's
largest N).

Rows that see no key leave the kernel as 0 (l == 0); the wrapper (attention) writes the reference's
value there (NaN, or v's mean for a finite masked_value), from the same causal/window/length rule.

Interpreted vs compiled (`interpreted`), the only two differences: on hardware K stays (B, S, K, H) and
the Q·Kᵀ operand is the transposed SMEM view (plgpu.transpose_ref, free for 16-bit wgmma); the
interpreter takes no transposed operand, so there the wrapper passes K as (B, K, H, S) and the kernel
reads (H, block_k) tiles. And register layout hints (plgpu.layout_cast, the WGMMA-layout iota) are
dropped when interpreted: the interpreter has no rule for them and they change no value.

Targets (this module's SPECS): `gpu-mosaic` lowers this kernel for cuda on any host
(`mosaic_gpu_v2`); `gpu-mosaic-interpret` runs it in the Mosaic GPU interpreter through a host call
(see run_interpreted). `gpu` stays Triton: nothing here has been measured on a GPU.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from hlofuse.kernels.nki import hostcall
from hlofuse.kernels.pallas import attention as pallas_attention
from hlofuse.kernels.pallas import common, resources
from hlofuse.kernels.pallas.attention import MASKED_VALUE_LIMIT, _check_shapes
from hlofuse.kernels.pallas.common import Plan
from hlofuse.kernels.reference import zeroed_if_asked
from hlofuse.kernels.target import CompositeCall, KernelSpec, Lowered, Unsupported
from hlofuse.ops.attention import ATTENTION, AttentionAttrs
from hlofuse.partition.cuts import Cuts, decode_key_cuts
from hlofuse.partition.ranges import RangeSplit

WARPGROUP_ROWS = 64  # wgmma's M per warpgroup
SWIZZLE_BYTES = 128
SWIZZLE_ELEMS = SWIZZLE_BYTES // 2  # 16-bit elements per swizzled row
MAX_WGMMA_N = 256
# Hopper's shared memory per CTA (227 KiB usable of 228).
MAX_SMEM = 227 * 1024
DTYPES = (jnp.bfloat16, jnp.float16)


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tiles of the Mosaic GPU kernel.

    block_q: rows per CTA, counted over the G = N/K heads of a kv head (a multiple of 64: wgmma's M per
    warpgroup). block_k: keys per kv block (a multiple of 64, at most 256: the N of Q·Kᵀ). stages: K/V
    slots in shared memory (stages - 1 TMA copies run ahead of the compute).
    """

    block_q: int = 64
    block_k: int = 128
    stages: int = 2

    def __post_init__(self) -> None:
        if self.block_q < WARPGROUP_ROWS or self.block_q % WARPGROUP_ROWS:
            raise ValueError(f"Mosaic GPU block_q {self.block_q} must be a positive multiple of {WARPGROUP_ROWS}")
        if self.block_k < SWIZZLE_ELEMS or self.block_k % SWIZZLE_ELEMS or self.block_k > MAX_WGMMA_N:
            raise ValueError(
                f"Mosaic GPU block_k {self.block_k} must be a multiple of {SWIZZLE_ELEMS} "
                f"(a {SWIZZLE_BYTES}-byte swizzle of 16-bit values) and at most {MAX_WGMMA_N}"
            )
        if self.stages < 1:
            raise ValueError(f"Mosaic GPU stages {self.stages} must be at least 1")

    @classmethod
    def get_default(cls, h: int = 128, d: int = 128) -> BlockSizes:
        """128-key blocks, two slots; 64-key blocks when head dims of 256 would overflow shared memory."""
        hp, dp = common.round_up(h, SWIZZLE_ELEMS), common.round_up(d, SWIZZLE_ELEMS)
        block_k = 128 if (64 * hp + 2 * 128 * (hp + dp) + 64 * 128 + 64 * dp) * 2 <= MAX_SMEM else 64
        return cls(block_k=block_k)


def smem_bytes(plan: Plan, stages: int, itemsize: int = 2) -> int:
    """Shared memory of one CTA: q, the K/V ring, P, the output tile and the mbarriers."""
    return tile_smem_bytes(plan.block_q, plan.block_k, plan.head_pad, plan.value_pad, stages, itemsize)


def tile_smem_bytes(bq: int, bk: int, hp: int, dp: int, stages: int, itemsize: int = 2) -> int:
    """smem_bytes of tiles given one by one: q (bq, hp), the K/V ring, P (bq, bk), the output (bq, dp), barriers."""
    tiles = bq * hp + stages * bk * (hp + dp) + bq * bk + bq * dp
    return tiles * itemsize + (1 + 2 * stages) * 8


def plan_tiles(rows: int, s: int, h: int, d: int, blocks: BlockSizes) -> dict[str, int]:
    """Plan fields this kernel fixes: tiles shrunk to the problem (keeping wgmma's multiples), head pads."""
    return {
        "block_q": min(blocks.block_q, common.round_up(rows, WARPGROUP_ROWS)),
        "block_k": min(blocks.block_k, common.round_up(s, SWIZZLE_ELEMS)),
        "head_pad": common.round_up(h, SWIZZLE_ELEMS),
        "value_pad": common.round_up(d, SWIZZLE_ELEMS),
    }


def _swizzled(shape: tuple[int, ...], dtype: Any) -> Any:  # noqa: ANN401
    """An SMEM buffer in wgmma's operand layout: (8, 64) tiles, 128-byte swizzle."""
    from jax.experimental.pallas import mosaic_gpu as plgpu  # lazy: a heavy import only kernel building needs

    transforms = (plgpu.TilingTransform((8, SWIZZLE_ELEMS)), plgpu.SwizzleTransform(SWIZZLE_BYTES))
    return plgpu.SMEM(shape, dtype, transforms=transforms)


def _kernel(plan: Plan, stages: int, interpreted: bool, *refs: Any) -> None:
    """One (q tile, kv head, batch): TMA ring over the visible kv blocks, wgmma for both matmuls."""
    from jax.experimental.pallas import mosaic_gpu as plgpu  # lazy: a heavy import only kernel building needs

    lens_ref, q_ref, k_ref, v_ref, o_ref, q_smem, k_smem, v_smem, p_smem, o_smem, q_bar, k_bars, v_bars = refs
    bq, bk = plan.block_q, plan.block_k
    iq, head, b = lax.axis_index("q"), lax.axis_index("heads"), lax.axis_index("batch")
    q_len, kv_len = lens_ref[b, 0], lens_ref[b, 1]
    lo, hi = common.kv_block_range(plan, iq, q_len, kv_len)
    steps = jnp.maximum(hi - lo + 1, 0)

    def fetch(step: jax.Array, slot: int | jax.Array) -> None:
        keys = pl.ds((lo + step) * bk, bk)
        k_src = k_ref.at[b, head, :, keys] if interpreted else k_ref.at[b, keys, head]
        plgpu.copy_gmem_to_smem(k_src, k_smem.at[slot], k_bars.at[slot])
        plgpu.copy_gmem_to_smem(v_ref.at[b, keys, head], v_smem.at[slot], v_bars.at[slot])

    plgpu.copy_gmem_to_smem(q_ref.at[b, head, pl.ds(iq * bq, bq)], q_smem, q_bar.at[0])
    for slot in range(stages):  # prologue: fill the ring
        pl.when(slot < steps)(functools.partial(fetch, jnp.int32(slot), slot))
    plgpu.barrier_wait(q_bar.at[0])

    # Register layouts are hints for the compiler; the interpreter has no rule for layout_cast.
    wgmma_layout = plgpu.Layout.WGMMA
    if interpreted:
        iota: Any = lax.broadcasted_iota
        layout_cast: Any = lambda x, layout: x  # noqa: E731
    else:
        iota = functools.partial(plgpu.broadcasted_iota, layout=wgmma_layout)
        layout_cast = plgpu.layout_cast

    def body(step: jax.Array, carry: tuple[jax.Array, jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array]:
        acc, m_prev, l_prev = carry  # (block_q, value_pad) f32, (block_q,) f32, (block_q,) f32
        slot = lax.rem(step, jnp.int32(stages))
        plgpu.barrier_wait(k_bars.at[slot])
        k_tile = k_smem.at[slot] if interpreted else plgpu.transpose_ref(k_smem.at[slot], (1, 0))

        def qk(acc_ref: Any) -> jax.Array:  # noqa: ANN401
            plgpu.wgmma(acc_ref, q_smem, k_tile)
            return acc_ref[...]

        s = pl.run_scoped(qk, plgpu.ACC((bq, bk), jnp.float32))  # (block_q, block_k)
        s = common.logits(plan, s)
        ok = common.visible(plan, iq * bq, (lo + step) * bk, q_len, kv_len, (bq, bk), iota=iota)
        s = jnp.where(ok, s, -jnp.inf)
        # FlashAttention-2's running max and sum, kept as row vectors in the WGMMA layout.
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1))
        m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        p = jnp.exp(s - lax.broadcast_in_dim(m_safe, s.shape, [0]))
        alpha = jnp.exp(m_prev - m_safe)
        l_new = alpha * l_prev + jnp.sum(p, axis=1)
        p_smem[...] = p.astype(p_smem.dtype)  # P in v's dtype, as the reference rounds it
        plgpu.commit_smem()  # make the register stores visible to wgmma's async proxy
        plgpu.barrier_wait(v_bars.at[slot])

        def pv(acc_ref: Any) -> jax.Array:  # noqa: ANN401
            plgpu.wgmma(acc_ref, p_smem, v_smem.at[slot])
            return acc_ref[...]

        # A fresh accumulator added in registers (FlashAttention-2's rescale-and-add): the interpreter
        # runs no pl.run_state, which would let wgmma accumulate onto the rescaled acc directly.
        pv_tile = pl.run_scoped(pv, plgpu.ACC((bq, plan.value_pad), jnp.float32))
        acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0]) + pv_tile
        # Both wgmmas of this step have completed (their accumulators were read), so the slot is free.
        pl.when(step + stages < steps)(functools.partial(fetch, step + stages, slot))
        return acc, m_new, l_new

    init = (
        layout_cast(jnp.zeros((bq, plan.value_pad), jnp.float32), wgmma_layout),
        layout_cast(jnp.full((bq,), -jnp.inf, jnp.float32), wgmma_layout.reduce(1)),
        layout_cast(jnp.zeros((bq,), jnp.float32), wgmma_layout.reduce(1)),
    )
    acc, _, l = lax.fori_loop(0, steps, body, init)
    # Rows with l == 0 saw no key: 0 here, the reference's value is written by the wrapper.
    l_safe = jnp.where(l > 0, l, 1.0)
    o_smem[...] = (acc / lax.broadcast_in_dim(l_safe, acc.shape, [0])).astype(o_smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, o_ref.at[b, head, pl.ds(iq * bq, bq)])
    plgpu.wait_smem_to_gmem(0)


def flash_attention(
    plan: Plan,
    q: jax.Array,  # (B, K, rows_pad, head_pad)
    k: jax.Array,  # (B, keys_pad, K, head_pad), or (B, K, head_pad, keys_pad) when interpreted
    v: jax.Array,  # (B, keys_pad, K, value_pad)
    lens: jax.Array,  # (B, 2) int32
    *,
    stages: int,
    interpreted: bool,
    interpret: Any = None,  # noqa: ANN401  (InterpretGPUParams runs the Mosaic GPU interpreter)
) -> jax.Array:  # (B, K, rows_pad, value_pad), rows that see no key are 0
    """The plgpu.kernel call: grid (q tiles, kv heads, batch), one warpgroup per CTA."""
    from jax.experimental.pallas import mosaic_gpu as plgpu  # lazy: a heavy import only kernel building needs

    smem = smem_bytes(plan, stages, jnp.dtype(q.dtype).itemsize)
    if smem > MAX_SMEM:
        raise ValueError(
            f"Mosaic GPU tiles block_q={plan.block_q}, block_k={plan.block_k}, stages={stages} with head dims "
            f"({plan.head_pad}, {plan.value_pad}) need {smem // 1024} KiB of shared memory > {MAX_SMEM // 1024} KiB: "
            "use smaller BlockSizes"
        )
    bq, bk, hp, dp, dtype = plan.block_q, plan.block_k, plan.head_pad, plan.value_pad, q.dtype
    k_tile = (hp, bk) if interpreted else (bk, hp)
    scratch = [
        _swizzled((bq, hp), dtype),
        _swizzled((stages, *k_tile), dtype),
        _swizzled((stages, bk, dp), dtype),
        _swizzled((bq, bk), dtype),
        _swizzled((bq, dp), dtype),
        plgpu.Barrier(num_barriers=1),
        plgpu.Barrier(num_barriers=stages),
        plgpu.Barrier(num_barriers=stages),
    ]
    kernel = plgpu.kernel(
        functools.partial(_kernel, plan, stages, interpreted),
        out_type=jax.ShapeDtypeStruct((plan.b, plan.kv_heads, plan.rows_pad, dp), dtype),
        scratch_types=scratch,
        grid=(plan.num_q_blocks, plan.kv_heads, plan.b),
        grid_names=("q", "heads", "batch"),
        compiler_params=plgpu.CompilerParams(),
        interpret=interpret,
        kernel_name="hlofuse_flash_attention_mosaic_gpu",
    )
    out: jax.Array = kernel(lens, q, k, v)
    return out


# ----------------------------------------------------------------------------- entry point


def _interpret_params(interpret: Any) -> Any:  # noqa: ANN401
    """True -> the Mosaic GPU interpreter's default parameters (its only interpret mode)."""
    if interpret is True:
        # Not exported under jax.experimental in jax 0.10.2.
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

        return InterpretGPUParams()
    return interpret or None


def seen_rows(plan: Plan, lens: jax.Array) -> jax.Array:
    """(B, T) bool: whether query t sees any key under causal/window/q_offset and the lengths."""
    t = jnp.arange(plan.t, dtype=jnp.int32)[None, :]
    q_len, kv_len = lens[:, :1], jnp.minimum(lens[:, 1:], plan.s)
    key_lo = jnp.zeros_like(t)
    if plan.window_left != common.UNBOUNDED:
        key_lo = jnp.maximum(t + (plan.q_offset - plan.window_left), 0)
    key_hi = kv_len - 1
    if plan.right != common.UNBOUNDED:
        key_hi = jnp.minimum(key_hi, t + (plan.q_offset + plan.right))
    return (key_lo <= key_hi) & (t < q_len)


def attention(
    q: jax.Array,  # (B, T, N, H), bf16 or f16
    k: jax.Array,  # (B, S, K, H), N % K == 0
    v: jax.Array,  # (B, S, K, D), D padded to a multiple of 64 must be <= 256
    *,
    scale: float,
    causal: bool = False,
    window_left: int = common.UNBOUNDED,
    window_right: int = common.UNBOUNDED,
    q_offset: int = 0,
    softcap: float = 0.0,
    masked_value: float = float("-inf"),
    q_lengths: jax.Array | None = None,  # (B,) int
    kv_lengths: jax.Array | None = None,  # (B,) int
    block_sizes: BlockSizes | None = None,
    interpret: Any = False,  # noqa: ANN401  (True or InterpretGPUParams: the Mosaic GPU interpreter)
) -> jax.Array:  # (B, T, N, D), in q's dtype
    """`attention_reference`'s semantics (no bias or mask operand) on the Hopper Mosaic GPU kernel."""
    _check_shapes(q, k, v, "gpu")
    if q.dtype not in DTYPES:
        raise ValueError(
            f"the Mosaic GPU kernel takes bf16 or f16 (wgmma would run f32 as tf32), got {jnp.dtype(q.dtype).name}"
        )
    if masked_value > 0 or (masked_value != float("-inf") and masked_value > MASKED_VALUE_LIMIT):
        raise ValueError(f"masked_value {masked_value} must be -inf or <= {MASKED_VALUE_LIMIT}")
    b, t, n, h = q.shape
    s, kv_heads, d = k.shape[1], k.shape[2], v.shape[3]
    blocks = block_sizes or BlockSizes.get_default(h, d)
    tiles = plan_tiles(t * (n // kv_heads), s, h, d, blocks)
    if tiles["value_pad"] > MAX_WGMMA_N:
        raise ValueError(f"the Mosaic GPU kernel takes D <= {MAX_WGMMA_N} (wgmma's largest N), got D = {d}")
    plan = Plan(
        b=b, t=t, n=n, kv_heads=kv_heads, h=h, d=d, s=s, num_splits=1, scale=float(scale), softcap=float(softcap),
        causal=bool(causal), window_left=int(window_left), window_right=int(window_right), q_offset=int(q_offset),
        masked_value=float(masked_value), **tiles,
    )  # fmt: skip
    lens = common.lengths(plan, q_lengths, kv_lengths)
    params = _interpret_params(interpret)
    pad_keys = plan.keys_pad - s
    qr = common.rows_layout(q, kv_heads, plan.rows_pad, plan.head_pad)
    kr = jnp.pad(k, ((0, 0), (0, pad_keys), (0, 0), (0, plan.head_pad - h)))  # no copy when S, H are aligned
    vr = jnp.pad(v, ((0, 0), (0, pad_keys), (0, 0), (0, plan.value_pad - d)))
    interpreted = params is not None
    if interpreted:  # the interpreter's wgmma takes no transposed operand: (B, K, H_pad, S_pad)
        kr = kr.transpose(0, 2, 3, 1)
    o = flash_attention(plan, qr, kr, vr, lens, stages=blocks.stages, interpreted=interpreted, interpret=params)
    out = common.from_rows(o, t, n, d)  # (B, T, N, D)
    if plan.empty_is_nan:
        fill = jnp.full((b, 1, n, d), jnp.nan, out.dtype)
    else:  # the uniform average of all S values, per kv head, spread over its G query heads
        fill = jnp.repeat(common.empty_rows(plan, v)[:, :, :d], n // kv_heads, axis=1)[:, None].astype(out.dtype)
    return jnp.where(seen_rows(plan, lens)[:, :, None, None], out, fill)


# ----------------------------------------------------------------------------- lowerings


def unfit(call: CompositeCall, chip: Any = None) -> str | None:  # noqa: ANN401  (resources.ChipLimits)
    """Why this kernel cannot compile cleanly for the composite's shapes on `chip` (default:
    resources.current_chip("gpu")): shared memory per block, or registers (ptxas spills beyond
    resources.MOSAIC_REGISTER_BUDGET words per thread); None when the default tiles fit."""
    chip = chip or resources.current_chip("gpu")
    (q_shape, _), (k_shape, _), (v_shape, _) = call.operand_types[:3]
    _, t, n, h = q_shape
    s, kv_heads, d = k_shape[1], k_shape[2], v_shape[3]
    blocks = BlockSizes.get_default(h, d)
    tiles = plan_tiles(t * (n // kv_heads), s, h, d, blocks)
    bq, bk, hp, dp = tiles["block_q"], tiles["block_k"], tiles["head_pad"], tiles["value_pad"]
    smem = tile_smem_bytes(bq, bk, hp, dp, blocks.stages)
    if smem > chip.smem_per_block:
        return f"needs {smem // 1024} KiB of shared memory > {chip.smem_per_block // 1024} KiB per block on {chip.name}"
    words = resources.mosaic_register_words(bq, bk, dp)
    if words > resources.MOSAIC_REGISTER_BUDGET:
        return (
            f"keeps two f32 ({bq} x {dp}) accumulators and a ({bq} x {bk}) logits tile in one warpgroup: "
            f"~{words} registers per thread > {resources.MOSAIC_REGISTER_BUDGET} (above that ptxas spills on "
            f"{chip.name})"
        )
    return None


def _lowering(call: CompositeCall, interpret: bool) -> Lowered:
    """An `hlofuse.attention` composite as this kernel, or Unsupported saying why not.

    Decode composites (T <= 8 against a cache) go to the Triton flash-decoding kernel instead: a
    decode step is T·G rows, mostly padding in a 64-row wgmma tile, and one CTA per (b, kv head)
    without KV splits would leave most of the GPU idle.
    """
    target = "gpu-mosaic-interpret" if interpret else "gpu-mosaic"
    attrs = AttentionAttrs.from_dict(call.attributes)
    if attrs.decode:
        triton = pallas_attention.gpu_interpret_lowering if interpret else pallas_attention.gpu_lowering
        return triton(call)
    dtypes = [dtype for _, dtype in call.operand_types[:3]]
    if len(set(dtypes)) != 1 or dtypes[0] not in ("bf16", "f16"):
        raise Unsupported(
            f"the {target} kernel takes q, k, v all bf16 or all f16, not {dtypes} (wgmma would run f32 as tf32, "
            "which does not match the f32 reference; target=gpu takes f32)"
        )
    if attrs.layout != "BTNH":
        raise Unsupported(f"the {target} kernel takes layout BTNH, not {attrs.layout}")
    operands = [role for role in attrs.operands if role in ("bias", "mask")]
    if operands:
        raise Unsupported(f"the {target} kernel takes no {' or '.join(operands)} operand (target=gpu does)")
    mv = attrs.masked_value
    if mv > 0 or (mv != float("-inf") and mv > pallas_attention.MASKED_VALUE_LIMIT):
        raise Unsupported(
            f"the {target} kernel gives masked keys weight 0, which needs masked_value -inf or "
            f"<= {pallas_attention.MASKED_VALUE_LIMIT:g}, not {mv:g}"
        )
    d = call.operand_types[2][0][-1]
    if common.round_up(d, SWIZZLE_ELEMS) > MAX_WGMMA_N:
        raise Unsupported(f"the {target} kernel takes value head dims up to {MAX_WGMMA_N} (wgmma's N), not {d}")
    if not interpret and (why := unfit(call)) is not None:
        raise Unsupported(f"the {target} kernel {why}")

    def kernel(q: jax.Array, k: jax.Array, v: jax.Array, *, zero_empty_rows: bool, **kwargs: Any) -> jax.Array:
        return zeroed_if_asked(attention(q, k, v, **kwargs), q, k, zero_empty_rows, kwargs)

    def interpreted(q: jax.Array, k: jax.Array, v: jax.Array, *, zero_empty_rows: bool, **kwargs: Any) -> jax.Array:
        attrs = dict(kwargs)
        lengths = {role: kwargs.pop(role) for role in ("q_lengths", "kv_lengths") if role in kwargs}
        blocks = dataclasses.asdict(BlockSizes.get_default(q.shape[3], v.shape[3]))
        spec = {"roles": list(lengths), "attrs": kwargs, "blocks": blocks}
        shape = jax.ShapeDtypeStruct((*q.shape[:3], v.shape[3]), q.dtype)
        out = hostcall.host_call(run_interpreted, [q, k, v, *lengths.values()], spec, shape)
        return zeroed_if_asked(out, q, k, zero_empty_rows, attrs)

    return Lowered(attrs.bind_operands(interpreted if interpret else kernel), platforms=() if interpret else ("cuda",))


# target=gpu-mosaic: lowered for cuda (on any host), runs on Hopper only.
gpu_mosaic_lowering = functools.partial(_lowering, interpret=False)
# target=gpu-mosaic-interpret: the same kernel in the Mosaic GPU interpreter, through a host call.
gpu_mosaic_interpret_lowering = functools.partial(_lowering, interpret=True)


# The interpreter (InterpretGPUParams) runs a kernel through ordered io_callbacks, which name their
# Python function by an index into the host callbacks of the executable they were lowered in; inlined
# into the user's module by hlofuse-lower-kernels they would point nowhere. (Pallas' HLO interpreter,
# which the other -interpret targets inline, has no rule for TMA copies, barriers or wgmma.) So the
# target inlines a host call (hlofuse.kernels.nki.hostcall, the custom call neuron-sim uses) that runs
# this function, which runs the interpreter in its own executable.
def run_interpreted(q: np.ndarray, k: np.ndarray, v: np.ndarray, *lengths: np.ndarray, roles: list[str],
                    attrs: dict[str, Any], blocks: dict[str, int]) -> np.ndarray:  # fmt: skip
    """`attention` in the Mosaic GPU interpreter on host arrays (what target=gpu-mosaic-interpret calls)."""
    named = {role: jnp.asarray(x) for role, x in zip(roles, lengths, strict=True)}
    out = attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), **named, **attrs,
                    block_sizes=BlockSizes(**blocks), interpret=True)  # fmt: skip
    return np.asarray(out)


def shard_cuts(call: CompositeCall) -> Cuts:
    """What one shard's gpu-mosaic call cuts (hlofuse.shard_local): B, heads and a decode's key sequence,
    whose ranges run on the Triton kernel as gpu-mosaic's one-device decodes do. A prefill's key ranges would
    need this kernel to take q_offset per batch row; they stay whole."""
    return decode_key_cuts(call)


def key_split(call: CompositeCall, target: str, splits: int) -> RangeSplit:
    """A decode's key ranges, one per shard, on the Triton kernel (pallas.attention.key_split)."""
    return pallas_attention.key_split(call, target, splits)


def _spec(target: str, lower: Callable[[CompositeCall], Lowered]) -> KernelSpec:
    """A per-shard gpu-mosaic attention call: B, heads and a decode's key ranges (on the Triton kernel)."""
    return KernelSpec(ATTENTION, target, lower, cuts=lambda call, devices: shard_cuts(call),
                      key_split=key_split)


SPECS = (_spec("gpu-mosaic", gpu_mosaic_lowering), _spec("gpu-mosaic-interpret", gpu_mosaic_interpret_lowering))
