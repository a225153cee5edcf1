"""Flash attention on the CPU: the `hlofuse_attention` XLA FFI kernel (attention.cc) and its binding.

`attention` computes exactly `attention_reference` (the composite's contract) up to float rounding:
one FFI custom call over the canonical operands q (B,T,N,H), k (B,S,K,H), v (B,S,K,D), tiled over
query and key blocks with an online softmax so the (T, S) logits never exist in memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from hlofuse.kernels.cpu import register
from hlofuse.kernels.reference import UNBOUNDED, attention_mask, attention_reference, zero_empty_rows_of

if TYPE_CHECKING:
    from hlofuse.composites import AttentionAttrs
    from hlofuse.kernels import CompositeCall

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
    from hlofuse.composites import AttentionAttrs
    from hlofuse.kernels import Unsupported, cpu

    if not cpu.is_available():
        raise Unsupported("the native CPU kernel library is not built (pip install . builds it)")
    dtypes = {dtype for _, dtype in call.operand_types[:3]}
    if len(dtypes) != 1 or not dtypes <= {"f32", "bf16"}:
        raise Unsupported(f"the CPU kernel takes q, k, v all f32 or all bf16, not {sorted(dtypes)}")
    attrs = AttentionAttrs.from_dict(call.attributes)
    if attrs.zero_empty_rows and attrs.masked_value > -1e4:
        # Zeroing whole rows afterwards is exact only if masked keys already weigh exactly 0.
        raise Unsupported("zero_empty_rows with a mask fill above -1e4")
    return attrs


def _zeroed_if_asked(out: jax.Array, q: jax.Array, k: jax.Array, zero_empty_rows: bool,
                     kwargs: dict[str, Any]) -> jax.Array:
    if not zero_empty_rows:
        return out
    visible = attention_mask(q.shape[1], k.shape[1], causal=kwargs["causal"],
                             window_left=kwargs["window_left"], window_right=kwargs["window_right"],
                             q_offset=kwargs["q_offset"], mask=kwargs.get("mask"),
                             q_lengths=kwargs.get("q_lengths"), kv_lengths=kwargs.get("kv_lengths"))
    return zero_empty_rows_of(out, visible)


def attention_lowering(call: CompositeCall) -> Callable[..., Any]:
    """target=cpu: this kernel for an `hlofuse.attention` composite, or Unsupported saying why not."""
    attrs = _supported_attrs(call)

    def kernel(q: jax.Array, k: jax.Array, v: jax.Array, *, zero_empty_rows: bool, **kwargs: Any) -> jax.Array:
        return _zeroed_if_asked(attention(q, k, v, **kwargs), q, k, zero_empty_rows, kwargs)

    return attrs.bind_operands(kernel)


#===--- Multi-device layout -----------------------------------------------------------------===#
# XLA's batch partitioner (`num_batch_dims`, hlofuse.sharding) runs a call per shard of its LEADING
# dims only. So in a module compiled for several devices the call takes the kv heads, and for decode
# P splits of the key range, as leading batch dims:
#   q (B,T,N,H) -> (B, K, [P,] T, G, H)     k (B,S,K,H) -> (B, K, [P,] S/P, 1, H)     (N = K * G)
# Heads sharded (Megatron, GQA with kv heads sharded) cut K; a KV cache sharded along S cuts P, and
# the P partial results combine exactly through their log-sum-exps: a max and two sums over P, the
# same reductions (and bytes) the unfused softmax's partitioned program communicates.


def kv_splits_for(attrs: AttentionAttrs, call: CompositeCall, devices: int) -> int:
    """P: how many key-range splits a multi-device decode call takes as a leading batch dim (1 = none).

    Only decode (T == 1) splits, with no bias or mask operand and no left window: the causal / right
    window bound of a single query row is a key-length bound, which each split can shift by its offset.
    """
    t, s = call.operand_types[0][0][1], call.operand_types[1][0][1]
    if devices < 2 or t != 1 or s % devices or attrs.window_left != UNBOUNDED:
        return 1
    if {"bias", "mask"} & set(attrs.operands):
        return 1
    return devices


def _heads_leading(x: jax.Array, groups: int, splits: int) -> jax.Array:
    """(B, L, K*groups, H) -> (B, K, [splits,] L/splits, groups, H): kv heads (and key splits) lead."""
    b, length, heads, h = x.shape
    kv = heads // groups
    x = x.reshape(b, splits, length // splits, kv, groups, h)
    x = jnp.transpose(x, (0, 3, 1, 2, 4, 5))
    return x if splits > 1 else x.reshape(b, kv, length, groups, h)


def _broadcast_operand(x: jax.Array, kv: int, groups: int) -> jax.Array:
    """A (B|1, N|1, T|1, S|1) bias or mask as (B|1, K|1, G|1, T|1, S|1); the caller broadcasts its
    leading dims to the call's (the batch partitioner cuts every operand's leading dims alike)."""
    x = x.reshape((1,) * (4 - x.ndim) + x.shape)
    b1, n1, t1, s1 = x.shape
    x = x.reshape(b1, kv, groups, t1, s1) if n1 != 1 else x.reshape(b1, 1, 1, t1, s1)
    return x


def _combine_splits(out: jax.Array, lse: jax.Array, dtype: Any) -> jax.Array:  # noqa: ANN401
    """out (B, K, P, T, G, D), lse (B, K, P, T, G) -> (B, K, T, G, D): the softmax over all P key ranges.

    A split that sees no key (lse -inf, out NaN) weighs 0; a row no split sees is 0/0 = NaN, as the
    reference's fully masked row is."""
    top = jnp.max(lse, axis=2, keepdims=True)
    empty = lse == -jnp.inf
    weight = jnp.where(empty, 0.0, jnp.exp(lse - jnp.where(jnp.isfinite(top), top, 0.0)))
    parts = jnp.where(empty[..., None], 0.0, out.astype(jnp.float32))
    total = jnp.sum(weight[..., None] * parts, axis=2) / jnp.sum(weight, axis=2)[..., None]
    return total.astype(dtype)


def partitioned_lowering(call: CompositeCall, devices: int) -> Callable[..., Any]:
    """target=cpu in a module compiled for `devices` > 1 devices: the kernel with kv heads (and, for
    decode, `kv_splits_for` key ranges) as leading batch dims, so the partitioner keeps it local when
    batch, heads or the KV sequence are sharded. Same results as `attention_lowering`'s."""
    attrs = _supported_attrs(call)
    splits = kv_splits_for(attrs, call, devices)

    def kernel(q: jax.Array, k: jax.Array, v: jax.Array, *, zero_empty_rows: bool, **kwargs: Any) -> jax.Array:
        b, t, n, _ = q.shape
        s, kv = k.shape[1], k.shape[2]
        groups = n // kv
        lead = (b, kv, splits) if splits > 1 else (b, kv)
        qh = q.reshape(b, t, kv, groups, q.shape[3]).transpose(0, 2, 1, 3, 4)  # (B, K, T, G, H)
        if splits > 1:
            qh = jnp.broadcast_to(qh[:, :, None], (b, kv, splits, *qh.shape[2:]))
        kh, vh = _heads_leading(k, 1, splits), _heads_leading(v, 1, splits)
        local = dict(kwargs)
        for name in ("bias", "mask"):
            if local.get(name) is not None:
                x = _broadcast_operand(local[name], kv, groups)
                local[name] = jnp.broadcast_to(x, lead + x.shape[2:])
        if local.get("q_lengths") is not None:
            local["q_lengths"] = jnp.broadcast_to(local["q_lengths"].reshape(b, *(1,) * (len(lead) - 1)), lead)
        if splits > 1:
            local["kv_lengths"] = _split_kv_lengths(local, b, s, splits, lead)
            local.update(causal=False, window_right=UNBOUNDED, q_offset=0)
            out, lse = attention_with_lse(qh, kh, vh, **local)
            out = _combine_splits(out, lse, q.dtype)
        else:
            if local.get("kv_lengths") is not None:
                local["kv_lengths"] = jnp.broadcast_to(local["kv_lengths"][:, None], lead)
            out = attention(qh, kh, vh, **local)
        out = out.transpose(0, 2, 1, 3, 4).reshape(b, t, n, v.shape[3])  # (B, K, T, G, D) -> (B, T, N, D)
        return _zeroed_if_asked(out, q, k, zero_empty_rows, kwargs)

    return attrs.bind_operands(kernel)


def _split_kv_lengths(kwargs: dict[str, Any], b: int, s: int, splits: int, lead: tuple[int, ...]) -> jax.Array:
    """(B, K, P) key lengths of each split: the composite's kv_lengths and, for the one query row, its
    causal / right-window bound (key j visible iff j <= q_offset + right), shifted by the split's offset."""
    limit = jnp.full((b,), s, jnp.int32)
    if kwargs.get("kv_lengths") is not None:
        limit = jnp.minimum(limit, kwargs["kv_lengths"].astype(jnp.int32))
    right = 0 if kwargs["causal"] else kwargs["window_right"]
    if right != UNBOUNDED:
        limit = jnp.minimum(limit, jnp.int32(max(0, kwargs["q_offset"] + right + 1)))
    offsets = jnp.arange(splits, dtype=jnp.int32) * (s // splits)
    per_split = jnp.clip(limit[:, None] - offsets[None, :], 0, s // splits)  # (B, P)
    return jnp.broadcast_to(per_split[:, None, :], lead)


__all__ = ["BlockSizes", "attention", "attention_lowering", "attention_reference", "attention_with_lse",
           "kv_splits_for", "partitioned_lowering"]
