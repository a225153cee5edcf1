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
    block_sizes: BlockSizes | None = None,
) -> jax.Array:  # (B, T, N, D), in q's dtype
    """`attention_reference`'s semantics, computed by the native CPU kernel (f32 or bf16 q/k/v).

    B may be several leading dims L (q (*L, T, N, H), k (*L, S, K, H), ...; lengths of shape L): the
    kernel treats them as one batch dim, which lets XLA's batch partitioner cut any of them."""
    return _attention_call(q, k, v, bias=bias, mask=mask, q_lengths=q_lengths, kv_lengths=kv_lengths,
                           block_sizes=block_sizes, return_lse=False, scale=scale, causal=causal,
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
        block_q=np.int64(blocks.block_q),
        block_k=np.int64(blocks.block_k),
        kv_splits=np.int64(blocks.kv_splits),
    )
    return list(results)


def attention_lowering(call: CompositeCall) -> Callable[..., Any]:
    """target=cpu: this kernel for an `hlofuse.attention` composite, or Unsupported saying why not."""
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

    def kernel(q: jax.Array, k: jax.Array, v: jax.Array, *, zero_empty_rows: bool, **kwargs: Any) -> jax.Array:
        out = attention(q, k, v, **kwargs)
        if not zero_empty_rows:
            return out
        visible = attention_mask(q.shape[1], k.shape[1], causal=kwargs["causal"],
                                 window_left=kwargs["window_left"], window_right=kwargs["window_right"],
                                 q_offset=kwargs["q_offset"], mask=kwargs.get("mask"),
                                 q_lengths=kwargs.get("q_lengths"), kv_lengths=kwargs.get("kv_lengths"))
        return zero_empty_rows_of(out, visible)

    return attrs.bind_operands(kernel)


__all__ = ["BlockSizes", "attention", "attention_lowering", "attention_reference", "attention_with_lse"]
