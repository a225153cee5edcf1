"""Pallas flash attention for TPU (Mosaic) and GPU (Triton), with the composite's exact semantics.

`attention` computes `attention_reference` (docs/composites.md) of the canonical operands: q (B,T,N,H),
k (B,S,K,H), v (B,S,K,D), GQA/MQA, causal and sliding windows with a query offset, soft-cap, an
additive bias, a boolean mask and q/kv lengths, in f32 or bf16 with f32 softmax and accumulation
(FlashAttention-2, Dao 2023: online softmax, one pass over K/V per q tile). Blocks that no row of a
tile can see are skipped. `decode_attention` is the same kernel split over the KV axis
(flash-decoding) with a combine step, for T <= 8 queries against a long cache.

Masked logits count as -inf inside the kernel. That is the reference's `where(mask, s, masked_value)`
whenever a row sees some key and masked_value is -inf or far below any logit (hence the limit
MASKED_VALUE_LIMIT); a row that sees no key becomes NaN (-inf) or the uniform average of all values
(finite), exactly as in the reference.

Targets (this module's SPECS): `tpu` and `gpu` lower the kernels for that platform even on a
CPU-only host (`tpu_custom_call`, `__gpu$xla.gpu.triton`); `tpu-interpret` and `gpu-interpret` run
the same kernels in Pallas interpret mode on any host.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from hlofuse.kernels.pallas import common, gpu, resources, tpu
from hlofuse.kernels.pallas.common import Plan
from hlofuse.kernels.reference import UNBOUNDED, attention_reference, zeroed_if_asked
from hlofuse.kernels.target import CompositeCall, KernelSpec, Lowered, Unsupported
from hlofuse.ops.attention import ATTENTION, AttentionAttrs
from hlofuse.partition.cuts import Cuts, key_sequence_cuts
from hlofuse.partition.ranges import RangeSplit, decode_key_split, prefill_key_split, prefill_query_split

BACKENDS = ("tpu", "gpu")
# A finite masked_value must be at least this far below zero: the kernel gives masked keys weight 0,
# the reference exp(masked_value - max logit), equal in f32 for any |logit| < -limit - 104.
MASKED_VALUE_LIMIT = -1e4
DTYPES = {"tpu": (jnp.float32, jnp.bfloat16), "gpu": (jnp.float32, jnp.bfloat16, jnp.float16)}
# Queries at most this long against a longer cache take the decode path (the composite's `decode`).
DECODE_MAX_T = 8
# Auto num_splits for the GPU aims at this many programs (about two waves on an H100/H200).
GPU_TARGET_PROGRAMS = 264


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tiles of the Pallas kernels.

    block_q: query rows per tile, counted over the G = N/K heads that share a kv head (a tile holds
    block_q // G query positions). block_k: keys per tile. num_splits: parts the kv axis is split into
    (flash-decoding; 0 = pick from the shapes, 1 = none). num_warps, num_stages: Triton only.
    block_k_inner (TPU only): keys per slice of the kernel's loop over each kv block, so that one slice's
    f32 logits stay in vector registers (0 = block_k: the whole block at once).
    TPU tiles are multiples of (8, 128); GPU tiles are powers of two, at least 16.
    """

    block_q: int
    block_k: int
    num_splits: int = 0
    num_warps: int = 4
    num_stages: int = 2
    block_k_inner: int = 0

    def __post_init__(self) -> None:
        if (self.block_q < 1 or self.block_k < 1 or self.num_splits < 0 or self.num_warps < 1 or self.num_stages < 1
                or self.block_k_inner < 0):
            raise ValueError(f"invalid BlockSizes {self}")

    @classmethod
    def get_default(cls, backend: str = "tpu", *, decode: bool = False) -> BlockSizes:
        if backend == "tpu":
            return cls(block_q=16, block_k=1024) if decode else cls(block_q=256, block_k=512)
        if backend == "gpu":
            return cls(block_q=16, block_k=128) if decode else cls(block_q=64, block_k=64)
        raise ValueError(f"backend {backend!r} is not one of {BACKENDS}")

    def check(self, backend: str) -> None:
        """Raises ValueError when the tiles do not fit `backend`'s layout rules."""
        if backend == "tpu" and (self.block_q % tpu.SUBLANES or self.block_k % tpu.LANES):
            raise ValueError(
                f"TPU block_q {self.block_q} must be a multiple of {tpu.SUBLANES} and block_k {self.block_k} "
                f"a multiple of {tpu.LANES}"
            )
        if backend == "tpu" and self.block_k_inner and (self.block_k_inner % tpu.LANES
                                                        or self.block_k % self.block_k_inner):
            raise ValueError(f"TPU block_k_inner {self.block_k_inner} must be a multiple of {tpu.LANES} dividing "
                             f"block_k {self.block_k}")
        if backend == "gpu":
            for name, x in (("block_q", self.block_q), ("block_k", self.block_k), ("num_warps", self.num_warps)):
                if x & (x - 1) or (x < 16 and name != "num_warps"):
                    raise ValueError(f"GPU {name} {x} must be a power of two (block sizes at least 16)")


def _plan(
    backend: str,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    blocks: BlockSizes,
    attrs: dict[str, Any],
) -> Plan:
    b, t, n, h = q.shape
    s, kv_heads, d = k.shape[1], k.shape[2], v.shape[3]
    rows = t * (n // kv_heads)
    if backend == "tpu":
        sublanes = 16 if q.dtype == jnp.bfloat16 else tpu.SUBLANES
        block_q = min(blocks.block_q, common.round_up(rows, sublanes))
        block_k = min(blocks.block_k, common.round_up(s, tpu.LANES))
        head_pad, value_pad = common.round_up(h, tpu.LANES), common.round_up(d, tpu.LANES)
        inner = blocks.block_k_inner if 0 < blocks.block_k_inner < block_k else 0
        block_k_inner = inner if inner and block_k % inner == 0 else 0
    else:
        block_k_inner = 0
        block_q = min(blocks.block_q, max(16, common.next_pow2(rows)))
        block_k = min(blocks.block_k, max(16, common.next_pow2(s)))
        head_pad, value_pad = max(16, common.next_pow2(h)), max(16, common.next_pow2(d))
    num_k_blocks = -(-s // block_k)
    splits = blocks.num_splits
    if splits == 0:
        programs = b * kv_heads * -(-rows // block_q)
        if backend == "gpu":
            splits = max(1, min(num_k_blocks // 2, GPU_TARGET_PROGRAMS // programs))
        else:  # one TensorCore walks the splits in turn; two (megacore) can share them
            splits = 2 if programs == 1 and num_k_blocks >= 4 else 1
    splits = min(splits, num_k_blocks)
    return Plan(
        b=b, t=t, n=n, kv_heads=kv_heads, h=h, d=d, s=s, block_q=block_q, block_k=block_k,
        head_pad=head_pad, value_pad=value_pad, num_splits=splits, block_k_inner=block_k_inner, **attrs,
    )  # fmt: skip


def _dtype_name(dtype: Any) -> str:  # noqa: ANN401
    return {"bfloat16": "bf16", "float32": "f32", "float16": "f16"}.get(jnp.dtype(dtype).name, jnp.dtype(dtype).name)


def chip_blocks(backend: str, q: Any, k: Any, v: Any, *, decode: bool, has_side: bool = False,  # noqa: ANN401
                causal_offset: int | None = None, chip: resources.ChipLimits | None = None) -> BlockSizes:  # fmt: skip
    """The tiles for these shapes on `chip` (default: resources.current_chip): GPU, the largest Triton tiles
    whose shared memory and registers fit; TPU prefill, the fewest bundles x grid steps by libtpu's schedule
    analysis among the tiles it compiled without spills, within the VMEM the kernel may ask for. get_default
    where nothing fits (the lowering refuses
    such shapes; a direct call gets the compiler's error)."""
    chip = chip or resources.current_chip(backend)
    default = BlockSizes.get_default(backend, decode=decode)
    b, t, n, h = q.shape
    s, kv_heads, d = k.shape[1], k.shape[2], v.shape[3]
    rows = t * (n // kv_heads)
    if backend == "gpu":
        found, _ = resources.triton_blocks(rows, s, h, d, jnp.dtype(q.dtype).itemsize, decode, chip)
        return default if found is None else BlockSizes(*found)
    if decode:
        return default
    head_pad = common.round_up(h, tpu.LANES)
    found, _ = resources.tpu_blocks(rows, s, head_pad, _dtype_name(q.dtype), chip, groups=n // kv_heads,
                                    causal_offset=causal_offset)  # fmt: skip
    if found is None:
        return default
    blocks = BlockSizes(found[0], found[1], block_k_inner=found[2])
    plan = _plan(backend, q, k, v, blocks, _NO_ATTRS)
    plan = dataclasses.replace(plan, bias_rows=int(has_side), mask_rows=int(has_side))
    fits = tpu.vmem_bytes(plan, jnp.dtype(q.dtype).itemsize) <= resources.tpu_vmem_limit(chip)
    return blocks if fits else default


_NO_ATTRS = {"scale": 1.0, "softcap": 0.0, "causal": False, "window_left": UNBOUNDED, "window_right": UNBOUNDED,
             "q_offset": 0, "masked_value": float("-inf")}


def unfit(backend: str, call: CompositeCall, *, decode: bool, has_side: bool, causal_offset: int | None = None,
          chip: resources.ChipLimits | None = None) -> str | None:  # fmt: skip
    """Why `backend`'s kernel cannot compile cleanly for this composite on `chip` (a phrase naming the limit:
    Triton's shared memory or registers, the TPU's VMEM), or None when its tiles fit."""
    chip = chip or resources.current_chip(backend)
    (q_shape, dtype), (k_shape, _), (v_shape, _) = call.operand_types[:3]
    if len(q_shape) != 4 or len(k_shape) != 4 or len(v_shape) != 4:
        return None  # the layout check speaks for these
    jdtype = {"bf16": jnp.bfloat16, "f32": jnp.float32, "f16": jnp.float16}[dtype]
    q, k, v = (jax.ShapeDtypeStruct(shape, jdtype) for shape in (q_shape, k_shape, v_shape))
    b, t, n, h = q_shape
    s, d = k_shape[1], v_shape[3]
    if backend == "gpu":
        found, why = resources.triton_blocks(t * (n // k_shape[2]), s, h, d, jnp.dtype(jdtype).itemsize, decode, chip)
        return None if found is not None else why
    if not decode:
        rows, head_pad = t * (n // k_shape[2]), common.round_up(h, tpu.LANES)
        found, why = resources.tpu_blocks(rows, s, head_pad, dtype, chip, groups=n // k_shape[2],
                                          causal_offset=causal_offset)  # fmt: skip
        if found is None:
            return why
    blocks = chip_blocks(backend, q, k, v, decode=decode, has_side=has_side, causal_offset=causal_offset, chip=chip)
    plan = dataclasses.replace(_plan(backend, q, k, v, blocks, _NO_ATTRS), bias_rows=int(has_side),
                               mask_rows=int(has_side))
    vmem, limit = tpu.vmem_bytes(plan, jnp.dtype(jdtype).itemsize), resources.tpu_vmem_limit(chip)
    if vmem > limit:
        return (f"tiles ({plan.block_q} x {plan.block_k}) with head dims ({plan.head_pad}, {plan.value_pad}) need "
                f"about {vmem // resources.MiB} MiB of VMEM > {limit // resources.MiB} MiB on {chip.name}")
    return None


def _check_shapes(q: jax.Array, k: jax.Array, v: jax.Array, backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {BACKENDS}")
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be rank 4, got {q.shape}, {k.shape}, {v.shape}")
    b, _, n, h = q.shape
    s, kv_heads = k.shape[1], k.shape[2]
    if k.shape != (b, s, kv_heads, h):
        raise ValueError(f"k shape {k.shape} does not match q shape {q.shape} (B and H)")
    if v.shape[:3] != (b, s, kv_heads):
        raise ValueError(f"v shape {v.shape} does not match k shape {k.shape} (B, S, K)")
    if kv_heads == 0 or n % kv_heads:
        raise ValueError(f"query heads N={n} are not a multiple of kv heads K={kv_heads}")
    if q.dtype not in DTYPES[backend] or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(
            f"q, k, v must share one dtype of {[jnp.dtype(d).name for d in DTYPES[backend]]} on {backend}, "
            f"got {q.dtype}, {k.dtype}, {v.dtype}"
        )


def attention(
    q: jax.Array,  # (B, T, N, H)
    k: jax.Array,  # (B, S, K, H), N % K == 0
    v: jax.Array,  # (B, S, K, D)
    *,
    scale: float,
    causal: bool = False,
    window_left: int = UNBOUNDED,
    window_right: int = UNBOUNDED,
    q_offset: int = 0,
    softcap: float = 0.0,
    masked_value: float = float("-inf"),
    bias: jax.Array | None = None,  # (B|1, N|1, T|1, S|1), added to the logits
    mask: jax.Array | None = None,  # (B|1, N|1, T|1, S|1) bool, True = visible
    q_lengths: jax.Array | None = None,  # (B,) int
    kv_lengths: jax.Array | None = None,  # (B,) int
    q_offsets: jax.Array | None = None,  # (B,) int: each batch row's q_offset, in place of q_offset
    backend: str = "tpu",
    block_sizes: BlockSizes | None = None,
    interpret: Any = False,  # noqa: ANN401  (True, or pltpu.InterpretParams for the TPU interpreter)
    return_lse: bool = False,
) -> Any:  # noqa: ANN401  (B, T, N, D) in q's dtype; with return_lse, that in f32 and the (B, T, N) lse
    """`attention_reference`'s semantics computed by the Pallas kernel of `backend` ("tpu" or "gpu").

    `return_lse` also returns each row's log-sum-exp over its visible keys (-inf where it sees none), and
    the output in f32: the partial result that `combine_partials` merges with other calls' over other keys
    (a KV sequence sharded over devices, hlofuse.shard_local). It needs masked_value -inf: a row no key
    of any call sees is then NaN after the merge, as in the reference.

    `q_offsets` gives each batch row its own q_offset as a traced operand (the kernels read it with the
    lengths): a key range run per shard sees the queries at `q_offset - range start`."""
    _check_shapes(q, k, v, backend)
    if q_offsets is not None and q_offset:
        raise ValueError("give q_offset or q_offsets, not both")
    if return_lse and not math.isinf(masked_value):
        raise ValueError("return_lse needs masked_value -inf: a finite one weighs the masked keys of every call")
    if not math.isinf(masked_value) and masked_value > MASKED_VALUE_LIMIT:
        raise ValueError(f"masked_value {masked_value} > {MASKED_VALUE_LIMIT}: masked keys would carry weight")
    if math.isinf(masked_value) and masked_value > 0:
        raise ValueError(f"masked_value {masked_value} must be -inf or finite")
    decode = q.shape[1] <= DECODE_MAX_T < k.shape[1]
    has_side = bias is not None or mask is not None
    causal_offset = q_offset if causal and q_offsets is None else None
    blocks = block_sizes or chip_blocks(backend, q, k, v, decode=decode, has_side=has_side, causal_offset=causal_offset)
    blocks.check(backend)
    attrs = {
        "scale": float(scale), "softcap": float(softcap), "causal": bool(causal), "window_left": int(window_left),
        "window_right": int(window_right), "q_offset": int(q_offset), "masked_value": float(masked_value),
    }  # fmt: skip
    plan = dataclasses.replace(_plan(backend, q, k, v, blocks, attrs), partials=return_lse,
                               dynamic_q_offset=q_offsets is not None)
    side_dtype = jnp.int32 if backend == "tpu" else jnp.int8
    bias_p = mask_p = None
    if bias is not None:
        bias_p, (bb, bh, br) = common.broadcast_operand(bias, "bias", plan, jnp.float32)
        plan = dataclasses.replace(plan, bias_batch=bb, bias_heads=bh, bias_rows=br)
    if mask is not None:
        mask_p, (mb, mh, mr) = common.broadcast_operand(mask.astype(jnp.bool_), "mask", plan, side_dtype)
        plan = dataclasses.replace(plan, mask_batch=mb, mask_heads=mh, mask_rows=mr)
    lens = common.lengths(plan, q_lengths, kv_lengths, q_offsets)
    empty = None if plan.empty_is_nan else common.empty_rows(plan, v)  # (B, K, D_pad)

    qr = common.rows_layout(q, plan.kv_heads, plan.rows_pad, plan.head_pad)
    pad_keys = plan.keys_pad - plan.s
    if backend == "tpu":
        kr = jnp.pad(k.transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, pad_keys), (0, plan.head_pad - plan.h)))
        vr = jnp.pad(v.transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, pad_keys), (0, plan.value_pad - plan.d)))
        out = tpu.flash_attention(
            plan, qr, kr, vr, lens, bias_p, mask_p, None if empty is None else empty[:, :, None, :],
            out_dtype=q.dtype, interpret=interpret,
        )  # fmt: skip
        if plan.writes_partials:
            out = (out[0], out[1][..., 0], out[2][..., 0])
    else:
        kr = jnp.pad(k, ((0, 0), (0, pad_keys), (0, 0), (0, plan.head_pad - plan.h)))
        vr = jnp.pad(v, ((0, 0), (0, pad_keys), (0, 0), (0, plan.value_pad - plan.d)))
        out = gpu.flash_attention(
            plan, qr, kr, vr, lens, bias_p, mask_p, empty, out_dtype=q.dtype,
            num_warps=blocks.num_warps, num_stages=blocks.num_stages, interpret=interpret,
        )  # fmt: skip
    if return_lse:
        o, lse = common.combine_with_lse(*out, empty)
        return (common.from_rows(o, plan.t, plan.n, plan.d),
                common.from_rows(lse[..., None], plan.t, plan.n, 1)[..., 0])
    o = out[0] if not plan.writes_partials else common.combine(plan, *out, empty).astype(q.dtype)
    return common.from_rows(o, plan.t, plan.n, plan.d)


def decode_attention(
    q: jax.Array,  # (B, T, N, H), T <= 8
    k: jax.Array,  # (B, S, K, H): the KV cache
    v: jax.Array,  # (B, S, K, D)
    *,
    scale: float,
    backend: str = "tpu",
    block_sizes: BlockSizes | None = None,
    **kwargs: Any,  # noqa: ANN401  (as `attention`: causal, q_offset, kv_lengths, ...)
) -> jax.Array:  # (B, T, N, D)
    """Flash-decoding: `attention` with the kv axis split across programs and a combine step."""
    if q.ndim != 4 or q.shape[1] > DECODE_MAX_T:
        raise ValueError(f"decode_attention takes at most {DECODE_MAX_T} queries, got q shape {q.shape}")
    blocks = block_sizes or chip_blocks(backend, q, k, v, decode=True, has_side="bias" in kwargs or "mask" in kwargs)
    return attention(q, k, v, scale=scale, backend=backend, block_sizes=blocks, **kwargs)


# ----------------------------------------------------------------------------- lowerings


def _lowering(call: CompositeCall, backend: str, interpret: bool, platform: str | None) -> Lowered:
    """An `hlofuse.attention` composite as this kernel, or Unsupported saying why not."""
    target = f"{backend}-interpret" if interpret else backend
    dtypes = [dtype for _, dtype in call.operand_types[:3]]
    allowed = {"tpu": ("f32", "bf16"), "gpu": ("f32", "bf16", "f16")}[backend]
    if len(set(dtypes)) != 1 or dtypes[0] not in allowed:
        raise Unsupported(f"the {target} kernel takes q, k, v all of one dtype in {list(allowed)}, not {dtypes}")
    attrs = AttentionAttrs.from_dict(call.attributes)
    if attrs.layout != "BTNH":
        raise Unsupported(f"the {target} kernel takes layout BTNH, not {attrs.layout}")
    mv = attrs.masked_value
    if (math.isinf(mv) and mv > 0) or (not math.isinf(mv) and mv > MASKED_VALUE_LIMIT):
        raise Unsupported(
            f"the {target} kernel gives masked keys weight 0, which needs masked_value -inf or "
            f"<= {MASKED_VALUE_LIMIT:g}, not {mv:g}"
        )
    has_side = any(role in ("bias", "mask") for role in attrs.operands)
    causal_offset = attrs.q_offset if attrs.causal else None
    why = None if interpret else unfit(backend, call, decode=attrs.decode, has_side=has_side,
                                       causal_offset=causal_offset)  # fmt: skip
    if why is not None:
        raise Unsupported(f"the {target} kernel {why}")
    entry = decode_attention if attrs.decode else attention

    def kernel(q: jax.Array, k: jax.Array, v: jax.Array, *, zero_empty_rows: bool, **kwargs: Any) -> jax.Array:
        out = entry(q, k, v, backend=backend, interpret=interpret, **kwargs)
        return zeroed_if_asked(out, q, k, zero_empty_rows, kwargs)  # masked keys weigh 0 (the fill check above)

    return Lowered(attrs.bind_operands(kernel), platforms=(platform,) if platform is not None else ())


def shard_cuts(call: CompositeCall) -> Cuts:
    """What one shard's Pallas call cuts (hlofuse.shard_local): B, heads, and the key sequence of a decode
    or of a prefill (whose ranges take their q_offset per batch row)."""
    return key_sequence_cuts(call)


def _range_target(target: str) -> tuple[str, bool, str | None]:
    """(backend, interpret, platform to lower for) of a target whose ranges run on these kernels."""
    backend = "tpu" if target.startswith("tpu") else "gpu"
    interpret = target.endswith("-interpret")
    return backend, interpret, None if interpret else {"tpu": "tpu", "gpu": "cuda"}[backend]


def key_split(call: CompositeCall, target: str, splits: int) -> RangeSplit:
    """A decode or prefill with its key sequence in `splits` ranges, one per shard, each run by this
    target's kernel with `return_lse` (its specs' `key_split`; gpu-mosaic's
    decodes come here through mosaic_gpu.key_split and run the Triton kernel)."""
    backend, interpret, platform = _range_target(target)
    decode = call.operand_types[0][0][1] == 1

    def run_range(q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array | None = None,
                  **kwargs: Any) -> tuple[jax.Array, jax.Array]:  # noqa: ANN401
        if lengths is not None:  # the decode split's positional key lengths
            kwargs["kv_lengths"] = lengths
        blocks = chip_blocks(backend, q, k, v, decode=decode, has_side="bias" in kwargs or "mask" in kwargs)
        out: tuple[jax.Array, jax.Array] = attention(
            q, k, v, backend=backend, interpret=interpret, return_lse=True, block_sizes=blocks, **kwargs)
        return out

    if decode:
        return decode_key_split(call, splits, run_range, platform)
    return prefill_key_split(call, splits, run_range, platform)


def query_split(call: CompositeCall, target: str, splits: int) -> RangeSplit:
    """A prefill with its query sequence in `splits` ranges, one per shard, each run by this target's kernel
    with its own q_offset per batch row and K, V whole (hlofuse.shard_local.prefill_query_split)."""
    backend, interpret, platform = _range_target(target)

    def run_range(q: jax.Array, k: jax.Array, v: jax.Array, **kwargs: Any) -> jax.Array:  # noqa: ANN401
        out: jax.Array = attention(q, k, v, backend=backend, interpret=interpret, **kwargs)
        return out

    return prefill_query_split(call, splits, run_range, platform)


# target=tpu / gpu: lowered for that platform (on any host); the result runs only there.
tpu_lowering = functools.partial(_lowering, backend="tpu", interpret=False, platform="tpu")
gpu_lowering = functools.partial(_lowering, backend="gpu", interpret=False, platform="cuda")
# target=tpu-interpret / gpu-interpret: the same kernels in Pallas' HLO interpreter, on this host.
# (The TPU interpreter proper, pltpu.InterpretParams, calls back into Python through host callbacks
# that belong to the executable they were lowered in, so it cannot be inlined into another module;
# the kernel tests run it directly.)
tpu_interpret_lowering = functools.partial(_lowering, backend="tpu", interpret=True, platform=None)
gpu_interpret_lowering = functools.partial(_lowering, backend="gpu", interpret=True, platform=None)


def _spec(target: str, lower: Callable[[CompositeCall], Lowered]) -> KernelSpec:
    """A per-shard Pallas attention call: B, heads, and decode or prefill key ranges (their q_offset per batch
    row), or prefill query ranges."""
    return KernelSpec(ATTENTION, target, lower, cuts=lambda call, devices: shard_cuts(call),
                      key_split=key_split, prefill_key_ranges=True, query_split=query_split)


SPECS = (_spec("tpu", tpu_lowering), _spec("gpu", gpu_lowering), _spec("tpu-interpret", tpu_interpret_lowering),
         _spec("gpu-interpret", gpu_interpret_lowering))

__all__ = [
    "SPECS",
    "BlockSizes",
    "attention",
    "attention_reference",
    "decode_attention",
    "key_split",
    "shard_cuts",
    "gpu_interpret_lowering",
    "gpu_lowering",
    "tpu_interpret_lowering",
    "tpu_lowering",
]
