"""Flash attention on the CPU: the `hlofuse_attention` XLA FFI kernel (attention.cc) and its binding.

`attention` computes exactly `attention_reference` (the composite's contract) up to float rounding:
one FFI custom call over the canonical operands q (B,T,N,H), k (B,S,K,H), v (B,S,K,D), tiled over
query and key blocks with an online softmax so the (T, S) logits never exist in memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hlofuse.kernels import cpu
from hlofuse.kernels.cpu import register
from hlofuse.kernels.reference import (
    UNBOUNDED,
    ZERO_EMPTY_ROWS_FILL_LIMIT,
    attention_reference,
    combine_partials,
    zeroed_if_asked,
)
from hlofuse.kernels.target import CompositeCall, KernelSpec, Lowered, Partitioning, Unsupported, lowered
from hlofuse.ops.attention import ATTENTION, AttentionAttrs
from hlofuse.partition.cuts import Cuts, attention_cuts

TARGET = "hlofuse_attention"


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tiling of the CPU kernel.

    block_q: query rows per tile, counted over all G = N/K heads sharing a kv head (a tile holds
    max(1, block_q // G) query positions). block_k: keys per block. kv_splits: how many parts each
    tile's key range is split into and combined afterwards (the decode path); 0 picks it from the
    thread count.
    """

    block_q: int = 128
    block_k: int = 64
    kv_splits: int = 0

    def __post_init__(self) -> None:
        if self.block_q < 1 or self.block_k < 1 or self.kv_splits < 0:
            raise ValueError(f"invalid BlockSizes {self}")

    @classmethod
    def get_default(cls) -> BlockSizes:
        return cls()


def _broadcastable(x: jax.Array, name: str, lead: tuple[int, ...], full: tuple[int, int, int]) -> jax.Array:
    """x as (L|1s..., N|1, T|1, S|1): leading 1s added, and leading dims that mix 1s and L broadcast to L
    (the kernel folds L into one batch dim, which is either broadcast or not)."""
    rank = len(lead) + 3
    if x.ndim > rank:
        raise ValueError(f"{name} has rank {x.ndim} > {rank}; expected (B|1, N|1, T|1, S|1) broadcasting to "
                         f"{(*lead, *full)}")
    x = x.reshape((1,) * (rank - x.ndim) + x.shape)
    for got, want in zip(x.shape, (*lead, *full), strict=True):
        if got not in (1, want):
            raise ValueError(f"{name} shape {x.shape} does not broadcast to (B, N, T, S) = {(*lead, *full)}")
    if x.shape[:len(lead)] not in (lead, (1,) * len(lead)):
        x = jnp.broadcast_to(x, lead + x.shape[len(lead):])
    return x


def _lengths(x: jax.Array, name: str, lead: tuple[int, ...]) -> jax.Array:
    if x.shape != lead:
        raise ValueError(f"{name} shape {x.shape} != the leading (batch) dims {lead}")
    return x.astype(jnp.int32)


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
    q_offsets: jax.Array | None = None,  # (B,) int: each batch entry's q_offset, in place of q_offset
    block_sizes: BlockSizes | None = None,
) -> jax.Array:  # (B, T, N, D), in q's dtype
    """`attention_reference`'s semantics, computed by the native CPU kernel (f32 or bf16 q/k/v).

    B may be several leading dims L (q (*L, T, N, H), k (*L, S, K, H), ...; lengths and q_offsets of
    shape L): the kernel treats them as one batch dim, which lets XLA's batch partitioner cut any of them.
    `q_offsets` lets each of them carry its own causal / window offset (a split of the query or key
    range shifts it by the split's start)."""
    return _attention_call(q, k, v, bias=bias, mask=mask, q_lengths=q_lengths, kv_lengths=kv_lengths,
                           q_offsets=q_offsets, block_sizes=block_sizes, return_lse=False, scale=scale, causal=causal,
                           window_left=window_left, window_right=window_right, q_offset=q_offset, softcap=softcap,
                           masked_value=masked_value)[0]


def attention_with_lse(
    q: jax.Array,  # (*L, T, N, H)
    k: jax.Array,  # (*L, S, K, H)
    v: jax.Array,  # (*L, S, K, D)
    **kwargs: Any,  # as `attention`
) -> tuple[jax.Array, jax.Array]:  # out (*L, T, N, D) in q's dtype, lse (*L, T, N) f32
    """`attention`, plus each row's log-sum-exp of its (masked) logits: -inf for a row that sees no key.
    Two calls over disjoint key ranges combine exactly: out = sum_i exp(lse_i - lse) out_i with
    lse = logsumexp_i(lse_i)."""
    out, lse = _attention_call(q, k, v, return_lse=True, **kwargs)
    return out, lse


def _attention_call(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    bias: jax.Array | None = None,
    mask: jax.Array | None = None,
    q_lengths: jax.Array | None = None,
    kv_lengths: jax.Array | None = None,
    q_offsets: jax.Array | None = None,
    block_sizes: BlockSizes | None = None,
    return_lse: bool,
    scale: float,
    causal: bool = False,
    window_left: int = UNBOUNDED,
    window_right: int = UNBOUNDED,
    q_offset: int = 0,
    softcap: float = 0.0,
    masked_value: float = float("-inf"),
) -> list[jax.Array]:
    if q.ndim < 4 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(f"q, k, v must share one rank >= 4, got {q.shape}, {k.shape}, {v.shape}")
    lead = tuple(q.shape[:-3])
    t, n, h = q.shape[-3:]
    s, kv_heads = k.shape[-3], k.shape[-2]
    if k.shape != (*lead, s, kv_heads, h):
        raise ValueError(f"k shape {k.shape} does not match q shape {q.shape} (B and H)")
    if v.shape[:-1] != (*lead, s, kv_heads):
        raise ValueError(f"v shape {v.shape} does not match k shape {k.shape} (B, S, K)")
    if kv_heads == 0 or n % kv_heads:
        raise ValueError(f"query heads N={n} are not a multiple of kv heads K={kv_heads}")
    if q.dtype not in (jnp.float32, jnp.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(
            f"q, k, v must share one dtype of float32 / bfloat16, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    blocks = block_sizes or BlockSizes.get_default()
    register()

    full = (n, t, s)
    operands = [q, k, v]
    if bias is not None:
        bias = _broadcastable(bias, "bias", lead, full)
        operands.append(bias if bias.dtype in (jnp.float32, jnp.bfloat16) else bias.astype(jnp.float32))
    if mask is not None:
        operands.append(_broadcastable(mask, "mask", lead, full).astype(jnp.bool_))
    if q_lengths is not None:
        operands.append(_lengths(q_lengths, "q_lengths", lead))
    if kv_lengths is not None:
        operands.append(_lengths(kv_lengths, "kv_lengths", lead))
    if q_offsets is not None:
        operands.append(_lengths(q_offsets, "q_offsets", lead))

    out_types = [jax.ShapeDtypeStruct((*lead, t, n, v.shape[-1]), q.dtype)]
    if return_lse:
        out_types.append(jax.ShapeDtypeStruct((*lead, t, n), jnp.float32))
    call = jax.ffi.ffi_call(TARGET, out_types, vmap_method="sequential")
    results = call(
        *operands,
        scale=np.float32(scale),
        causal=np.bool_(causal),
        window_left=np.int64(window_left),
        window_right=np.int64(window_right),
        q_offset=np.int64(q_offset),
        softcap=np.float32(softcap),
        masked_value=np.float32(masked_value),
        has_bias=np.bool_(bias is not None),
        has_mask=np.bool_(mask is not None),
        has_q_lengths=np.bool_(q_lengths is not None),
        has_kv_lengths=np.bool_(kv_lengths is not None),
        has_q_offsets=np.bool_(q_offsets is not None),
        block_q=np.int64(blocks.block_q),
        block_k=np.int64(blocks.block_k),
        kv_splits=np.int64(blocks.kv_splits),
    )
    return list(results)


def _supported_attrs(call: CompositeCall) -> AttentionAttrs:
    """The composite's attributes if this kernel takes them, else Unsupported saying why not."""
    if not cpu.is_available():
        raise Unsupported("the native CPU kernel library is not built (pip install . builds it)")
    dtypes = {dtype for _, dtype in call.operand_types[:3]}
    if len(dtypes) != 1 or not dtypes <= {"f32", "bf16"}:
        raise Unsupported(f"the CPU kernel takes q, k, v all f32 or all bf16, not {sorted(dtypes)}")
    attrs = AttentionAttrs.from_dict(call.attributes)
    if attrs.zero_empty_rows and attrs.masked_value > ZERO_EMPTY_ROWS_FILL_LIMIT:
        # Zeroing whole rows afterwards is exact only if masked keys already weigh exactly 0.
        raise Unsupported(f"zero_empty_rows with a mask fill above {ZERO_EMPTY_ROWS_FILL_LIMIT:g}")
    return attrs


def attention_lowering(call: CompositeCall) -> Callable[..., Any]:
    """target=cpu: this kernel for an `hlofuse.attention` composite, or Unsupported saying why not."""
    attrs = _supported_attrs(call)

    def kernel(q: jax.Array, k: jax.Array, v: jax.Array, *, zero_empty_rows: bool, **kwargs: Any) -> jax.Array:
        return zeroed_if_asked(attention(q, k, v, **kwargs), q, k, zero_empty_rows, kwargs)

    return attrs.bind_operands(kernel)


#===--- Multi-device layout -----------------------------------------------------------------===#
# XLA's batch partitioner (`num_batch_dims`, hlofuse.sharding) runs a call per shard of its LEADING
# dims only. So in a module compiled for several devices the call takes the kv heads, and Pt splits of
# the query range and Ps splits of the key range, as leading batch dims:
#   q (B,T,N,H) -> (B, K, [Pt,] [Ps,] T/Pt, G, H)     k (B,S,K,H) -> (B, K, [Pt,] [Ps,] S/Ps, 1, H)
# (N = K * G; q is broadcast along Ps and k, v along Pt). Heads sharded (Megatron, GQA with kv heads
# sharded) cut K; queries sharded along T cut Pt; a KV sequence sharded along S cuts Ps, and the Ps
# partial results combine exactly through their log-sum-exps: a max and two sums over Ps, the same
# reductions (and bytes) the unfused softmax's partitioned program communicates. Each split sees its
# causal / window band through its own q_offset (the `q_offsets` operand): the global offset plus the
# split's first query minus its first key.


def kv_splits_for(attrs: AttentionAttrs, call: CompositeCall, devices: int, sequence: bool = False) -> int:
    """Ps: how many key-range splits a multi-device call takes as a leading batch dim (1 = none).

    S must be a multiple of the device count (then S = (Ps, S/Ps) is a reshape, and a sequence sharded
    over any mesh axes arrives sharded along Ps), and the call must have no bias or mask operand, which
    would have to be split along S as well. Every split reads all T queries and writes a partial output:
    when S is not sharded those are Ps copies. Decode always splits; a prefill only under `sequence`
    (multi_device=sequence) or when the copies are no larger than the keys (T * N * Ps <= S * K: a chunk
    or a few speculative tokens against a long cache). A full prefill split 8 ways with its S unsharded
    ran 2.3x slower (B, T = S, N = K, H = (1, 512, 8, 64)).
    """
    (t, n), (s, kv) = call.operand_types[0][0][1:3], call.operand_types[1][0][1:3]
    if devices < 2 or s % devices or {"bias", "mask"} & set(attrs.operands):
        return 1
    if t > 1 and not sequence and t * n * devices > s * kv:
        return 1
    return devices


def q_splits_for(attrs: AttentionAttrs, call: CompositeCall, devices: int, sequence: bool = False) -> int:
    """Pt: how many query-range splits a multi-device prefill call takes as a leading batch dim (1 = none).

    Query rows are independent, so a split needs only its rows' q_lengths and q_offset. Only under
    `sequence`: every split reads all of K and V, Pt copies of them when T is not sharded. Otherwise the
    conditions of `kv_splits_for`, on T.
    """
    t = call.operand_types[0][0][1]
    if not sequence or devices < 2 or t == 1 or t % devices or {"bias", "mask"} & set(attrs.operands):
        return 1
    return devices


def _heads_leading(x: jax.Array, groups: int, splits: int) -> jax.Array:
    """(B, L, K*groups, H) -> (B, K, [splits,] L/splits, groups, H): kv heads (and the range's splits) lead."""
    b, length, heads, h = x.shape
    kv = heads // groups
    if splits == 1:
        return jnp.transpose(x.reshape(b, length, kv, groups, h), (0, 2, 1, 3, 4))
    return jnp.transpose(x.reshape(b, splits, length // splits, kv, groups, h), (0, 3, 1, 2, 4, 5))


def _to_lead(x: jax.Array, axes: tuple[int, ...], lead: tuple[int, ...]) -> jax.Array:
    """x, whose first dims are the dims `axes` of `lead`, broadcast to lead + x's other dims."""
    shape = [1] * len(lead)
    for axis, size in zip(axes, x.shape, strict=False):
        shape[axis] = size
    rest = x.shape[len(axes):]
    return jnp.broadcast_to(x.reshape(*shape, *rest), (*lead, *rest))


def _broadcast_operand(x: jax.Array, kv: int, groups: int) -> jax.Array:
    """A (B|1, N|1, T|1, S|1) bias or mask as (B|1, K|1, G|1, T|1, S|1); the caller broadcasts its
    leading dims to the call's (the batch partitioner cuts every operand's leading dims alike)."""
    x = x.reshape((1,) * (4 - x.ndim) + x.shape)
    b1, n1, t1, s1 = x.shape
    x = x.reshape(b1, kv, groups, t1, s1) if n1 != 1 else x.reshape(b1, 1, 1, t1, s1)
    return x


def partitioned_lowering(call: CompositeCall, devices: int, multi_device: str = "batch") -> Callable[..., Any]:
    """target=cpu in a module compiled for `devices` > 1 devices: the kernel with kv heads, and the
    `q_splits_for` query and `kv_splits_for` key ranges, as leading batch dims, so the partitioner keeps it
    local when batch, heads, T or S are sharded. Same results as `attention_lowering`'s."""
    attrs = _supported_attrs(call)
    # multi_device=local lowers with "queries" or "keys" where only that sequence is sharded (hlofuse-lower-kernels)
    q_splits = q_splits_for(attrs, call, devices, multi_device in ("sequence", "queries"))
    kv_splits = kv_splits_for(attrs, call, devices, multi_device in ("sequence", "keys"))

    def kernel(q: jax.Array, k: jax.Array, v: jax.Array, *, zero_empty_rows: bool, **kwargs: Any) -> jax.Array:
        b, t, n, _ = q.shape
        s, kv = k.shape[1], k.shape[2]
        groups = n // kv
        lead = (b, kv, *(p for p in (q_splits, kv_splits) if p > 1))
        q_at, kv_at = (2,) * (q_splits > 1), (len(lead) - 1,) * (kv_splits > 1)  # where Pt and Ps sit in lead
        qh = _to_lead(_heads_leading(q, groups, q_splits), (0, 1, *q_at), lead)  # (*lead, T/Pt, G, H)
        kh, vh = (_to_lead(_heads_leading(x, 1, kv_splits), (0, 1, *kv_at), lead) for x in (k, v))  # S/Ps, 1, H
        local = dict(kwargs)
        for name in ("bias", "mask"):  # only on unsplit calls (kv_splits_for, q_splits_for)
            if local.get(name) is not None:
                x = _broadcast_operand(local[name], kv, groups)
                local[name] = jnp.broadcast_to(x, lead + x.shape[2:])
        for name, length, splits, at in (("q_lengths", t, q_splits, q_at), ("kv_lengths", s, kv_splits, kv_at)):
            if local.get(name) is not None:
                lengths = _split_lengths(local[name], length, splits) if splits > 1 else local[name]
                local[name] = _to_lead(lengths, (0, *at), lead)
        if (q_splits > 1 or kv_splits > 1) and _has_band(local):
            offsets = _split_q_offsets(local.pop("q_offset"), t, s, q_splits, kv_splits)  # (Pt, Ps)
            local["q_offsets"] = _to_lead(offsets.reshape([p for p in offsets.shape if p > 1]), q_at + kv_at, lead)
        if kv_splits > 1:
            out, lse = attention_with_lse(qh, kh, vh, **local)
            # Rows (T/Pt, G) merged: at rank 7 XLA CPU's YNNPACK reduce fusion crashes (jaxlib 0.10.2,
            # e.g. summing f32[2,8,8,2,2,1,16] over dim 3 segfaults); rank <= 6 did not in a random search.
            rows = (t // q_splits) * groups
            out = combine_partials(out.reshape(*lead, rows, out.shape[-1]), lse.reshape(*lead, rows), q.dtype)
        else:
            out = attention(qh, kh, vh, **local)
        d = v.shape[3]
        if q_splits == 1:  # (B, K, T, G, D) -> (B, T, K, G, D)
            out = out.reshape(b, kv, t, groups, d).transpose(0, 2, 1, 3, 4)
        else:  # (B, K, Pt, T/Pt, G, D) -> (B, Pt, T/Pt, K, G, D)
            out = out.reshape(b, kv, q_splits, t // q_splits, groups, d).transpose(0, 2, 3, 1, 4, 5)
        out = out.reshape(b, t, n, d)
        return zeroed_if_asked(out, q, k, zero_empty_rows, kwargs)

    return attrs.bind_operands(kernel)


def partitioned_remark(call: CompositeCall, devices: int, multi_device: str = "batch") -> str | None:
    """Why `partitioned_lowering`'s call for a prefill gathers a sharded T or S (it splits neither), or None."""
    attrs = _supported_attrs(call)
    sequence = multi_device == "sequence"
    q_splits = q_splits_for(attrs, call, devices, multi_device in ("sequence", "queries"))
    kv_splits = kv_splits_for(attrs, call, devices, multi_device in ("sequence", "keys"))
    if (why := _unsplit_prefill(attrs, call, devices, sequence, q_splits, kv_splits)) is None:
        return None
    return f"prefill not split along its sequences ({why}): a T or S sharded over devices is gathered before the call"


def _partitioned(call: CompositeCall, devices: int, multi_device: str) -> Lowered:
    return Lowered(partitioned_lowering(call, devices, multi_device),
                   remark=partitioned_remark(call, devices, multi_device))


def shard_cuts(call: CompositeCall, devices: int) -> Cuts:
    """The dims `partitioned_lowering`'s call can keep local (hlofuse.shard_local): the batch, the kv heads
    (a query-head sharding maps onto them; with one kv head the query heads are not a batch dim of the
    call) and the query and key sequences where `q_splits_for` / `kv_splits_for` split them under
    `sequence` (the pass lowers with `sequence` exactly where the plan cuts one of them)."""
    cuts = attention_cuts(call)
    attrs = _supported_attrs(call)
    kv_heads = call.operand_types[1][0][2]
    q_splits = q_splits_for(attrs, call, devices, sequence=True)
    kv_splits = kv_splits_for(attrs, call, devices, sequence=True)

    def cpu_labels(role: str, labels: tuple[str, ...]) -> tuple[str, ...]:
        if kv_heads == 1:
            labels = tuple("" if label == "n" else label for label in labels)
        if q_splits > 1 and role in ("q", "out"):
            labels = (labels[0], "t", *labels[2:])
        if kv_splits > 1 and role in ("k", "v"):
            labels = (labels[0], "s", *labels[2:])
        return labels

    roles = list(call.attributes["operands"])
    operands = tuple(cpu_labels(role, labels) for role, labels in zip(roles, cuts.operands, strict=True))
    results = tuple(cpu_labels("out", labels) for labels in cuts.results)
    sizes = dict(cuts.sizes)
    if q_splits > 1:
        sizes["t"] = call.operand_types[0][0][1]
    if kv_splits > 1:
        sizes["s"] = call.operand_types[1][0][1]
    return Cuts(operands, results, sizes)


def _unsplit_prefill(attrs: AttentionAttrs, call: CompositeCall, devices: int, sequence: bool, q_splits: int,
                     kv_splits: int) -> str | None:
    """Why a prefill's key range (and under `sequence`, its query range) is not split, or None."""
    (t, n), (s, kv) = call.operand_types[0][0][1:3], call.operand_types[1][0][1:3]
    if t == 1 or (kv_splits > 1 and (q_splits > 1 or not sequence)):
        return None
    if {"bias", "mask"} & set(attrs.operands):
        return "a bias or mask operand would have to be split as well"
    reasons = [f"{name} = {size} is not a multiple of the {devices} devices"
               for name, size, splits in (("T", t, q_splits if sequence else 0), ("S", s, kv_splits))
               if splits == 1 and size % devices]
    if not sequence and kv_splits == 1 and not s % devices:
        reasons.append(f"{devices} copies of its {t * n} query rows would outweigh its {s * kv} keys; "
                       "multi_device=sequence splits it")
    return "; ".join(reasons) or None


def _has_band(kwargs: dict[str, Any]) -> bool:
    """Whether the call masks by position (causal or a window), so that a split needs its own q_offset."""
    return bool(kwargs["causal"]) or kwargs["window_left"] != UNBOUNDED or kwargs["window_right"] != UNBOUNDED


def _split_lengths(lengths: jax.Array, size: int, splits: int) -> jax.Array:
    """(B,) lengths of a range of `size` -> (B, splits): each split's own, clipped to its size/splits
    positions (a split past the length gets 0)."""
    starts = np.arange(splits, dtype=np.int32) * np.int32(size // splits)
    return jnp.clip(lengths.astype(jnp.int32)[:, None] - starts[None, :], 0, size // splits)


def _split_q_offsets(q_offset: int, t: int, s: int, q_splits: int, kv_splits: int) -> np.ndarray:
    """(Pt, Ps) q_offset of each (query split, key split): query row i of query split a sits at key
    position a*T/Pt + i + q_offset, which is key b*S/Ps + (that - b*S/Ps) of key split b. A NumPy
    constant: the partitioner slices a constant locally, where it gathered the same values computed
    from iotas (measured: one 32-byte all-gather with T sharded)."""
    q_starts = np.arange(q_splits, dtype=np.int64) * (t // q_splits)
    kv_starts = np.arange(kv_splits, dtype=np.int64) * (s // kv_splits)
    return (q_offset + q_starts[:, None] - kv_starts[None, :]).astype(np.int32)


# XLA's batch partitioner runs the FFI call per shard of its leading dims (hlofuse.sharding).
SPECS = (KernelSpec(ATTENTION, "cpu", lowered(attention_lowering), Partitioning.XLA_BATCH,
                    lower_partitioned=_partitioned, cuts=shard_cuts),)

__all__ = ["SPECS", "BlockSizes", "attention", "attention_lowering", "attention_reference", "attention_with_lse",
           "kv_splits_for", "partitioned_lowering", "partitioned_remark", "q_splits_for", "shard_cuts"]
