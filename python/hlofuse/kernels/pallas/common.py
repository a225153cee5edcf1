"""What the TPU and GPU flash-attention kernels share: the plan, the row layout, masks and the combine.

Both kernels see GQA as rows. Query (B, T, N, H) becomes (B, K, R, H) with R = T * G rows per kv head
(G = N / K), row r holding query position t = r // G of head k * G + r % G. One K/V tile then serves
all G heads of its group, and a decode step (T <= 8) still fills a tile of rows. Everything is padded
on the host side: rows to the q block, keys to the kv block, head dims to the backend's tile width; the
kernels mask padded keys with the rest and the wrapper slices padded rows and columns off.

A row that sees no key (l == 0 after the online softmax) becomes what `attention_reference` makes of
it: NaN when masked logits are -inf, else the uniform average of all S values (softmax of S equal
logits), computed here as `empty_rows`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hlofuse.kernels.reference import UNBOUNDED


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


@dataclasses.dataclass(frozen=True)
class Plan:
    """Static shapes, tiles and attributes of one kernel call (all Python ints/floats)."""

    b: int
    t: int
    n: int
    kv_heads: int
    h: int
    d: int
    s: int
    block_q: int  # rows per tile
    block_k: int  # keys per tile
    head_pad: int  # H padded
    value_pad: int  # D padded
    num_splits: int  # KV splits (flash-decoding); 1 = the kernel normalises in place
    scale: float
    softcap: float
    causal: bool
    window_left: int
    window_right: int
    q_offset: int
    masked_value: float
    bias_rows: int = 0  # 0 = no bias operand, 1 = one row broadcast over all rows, else rows_pad
    bias_heads: int = 0  # 1 or K
    bias_batch: int = 0  # 1 or B
    mask_rows: int = 0
    mask_heads: int = 0
    mask_batch: int = 0
    partials: bool = False  # write per-split (acc, m, l) even with one split (attention(return_lse=True))
    dynamic_q_offset: bool = False  # each batch row's q_offset is column 2 of the lengths (q_offset is 0)
    block_k_inner: int = 0  # TPU: keys per slice of the kernel's loop over a kv block (0: block_k, no loop)

    @property
    def writes_partials(self) -> bool:
        return self.num_splits > 1 or self.partials

    @property
    def groups(self) -> int:
        return self.n // self.kv_heads

    @property
    def rows(self) -> int:
        return self.t * self.groups

    @property
    def rows_pad(self) -> int:
        return round_up(self.rows, self.block_q)

    @property
    def keys_pad(self) -> int:
        return round_up(self.s, self.block_k * self.num_splits)

    @property
    def num_q_blocks(self) -> int:
        return self.rows_pad // self.block_q

    @property
    def num_k_blocks(self) -> int:
        return self.keys_pad // self.block_k

    @property
    def blocks_per_split(self) -> int:
        return self.num_k_blocks // self.num_splits

    @property
    def right(self) -> int:
        return 0 if self.causal else self.window_right

    @property
    def empty_is_nan(self) -> bool:
        return math.isinf(self.masked_value)


def kv_block_range(plan: Plan, iq: jax.Array, q_len: jax.Array, kv_len: jax.Array,
                   q_offset: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """First and last kv block holding a key visible from some row of q block `iq` (last < first: none).

    Used by kernels and index maps alike, so only scalar int32 ops; every division's operand is clamped
    non-negative first. `q_offset`: the batch row's own offset (plan.dynamic_q_offset), else plan.q_offset.
    """
    offset = plan.q_offset if q_offset is None else q_offset
    t_lo = lax.div(iq * plan.block_q, plan.groups)
    t_hi = jnp.minimum(lax.div(iq * plan.block_q + plan.block_q - 1, plan.groups), jnp.minimum(q_len, plan.t) - 1)
    key_end = jnp.minimum(kv_len, plan.s) - 1
    key_lo = jnp.int32(0)
    if plan.window_left != UNBOUNDED:
        key_lo = jnp.maximum(t_lo + (offset - plan.window_left), 0)
    key_hi = key_end
    if plan.right != UNBOUNDED:
        key_hi = jnp.minimum(key_hi, t_hi + (offset + plan.right))
    lo = lax.div(jnp.minimum(key_lo, plan.keys_pad - 1), plan.block_k)
    empty = (key_hi < key_lo) | (t_hi < t_lo)
    hi = jnp.where(empty, lo - 1, lax.div(jnp.maximum(key_hi, 0), plan.block_k))
    return lo, hi


def visible(
    plan: Plan,
    row0: jax.Array,
    key0: jax.Array,
    q_len: jax.Array,
    kv_len: jax.Array,
    shape: tuple[int, int],
    iota: Callable[[Any, tuple[int, int], int], jax.Array] = lax.broadcasted_iota,
    q_offset: jax.Array | None = None,
) -> jax.Array:
    """(rows, keys) bool of one tile: causal/window, lengths and key padding (not the mask operand).

    `iota` makes the index tiles: Mosaic GPU passes one that fixes the register layout (wgmma's).
    `q_offset`: the batch row's own offset (plan.dynamic_q_offset), else plan.q_offset.
    """
    rows = row0 + iota(jnp.int32, shape, 0)
    keys = key0 + iota(jnp.int32, shape, 1)
    t = rows if plan.groups == 1 else lax.div(rows, jnp.int32(plan.groups))
    ok = (keys < jnp.minimum(kv_len, plan.s)) & (t < q_len)
    rel = keys - t - (plan.q_offset if q_offset is None else q_offset)
    if plan.right != UNBOUNDED:
        ok = ok & (rel <= plan.right)
    if plan.window_left != UNBOUNDED:
        ok = ok & (rel >= -plan.window_left)
    return ok


def logits(plan: Plan, s: jax.Array) -> jax.Array:
    """f32 (rows, keys) q·kᵀ -> scaled and soft-capped, as the reference orders it."""
    s = s * jnp.float32(plan.scale)
    if plan.softcap:
        s = jnp.tanh(s / jnp.float32(plan.softcap)) * jnp.float32(plan.softcap)
    return s


def online_softmax_step(
    s: jax.Array,  # (rows, keys) f32, masked logits are -inf
    m_prev: jax.Array,  # (rows, 1) f32, -inf before any key
    l_prev: jax.Array,  # (rows, 1) f32
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(p, alpha, m_new, l_new): FlashAttention-2's running max and sum, safe for rows with no key yet."""
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    p = jnp.exp(s - m_safe)
    alpha = jnp.exp(m_prev - m_safe)
    return p, alpha, m_new, alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)


# ----------------------------------------------------------------------------- host-side layout


def rows_layout(q: jax.Array, kv_heads: int, rows_pad: int, head_pad: int) -> jax.Array:
    """(B, T, N, H) -> (B, K, rows_pad, head_pad), row r = t * G + g."""
    b, t, n, h = q.shape
    g = n // kv_heads
    q = q.reshape(b, t, kv_heads, g, h).transpose(0, 2, 1, 3, 4).reshape(b, kv_heads, t * g, h)
    return jnp.pad(q, ((0, 0), (0, 0), (0, rows_pad - t * g), (0, head_pad - h)))


def from_rows(o: jax.Array, t: int, n: int, d: int) -> jax.Array:
    """(B, K, rows_pad, D_pad) -> (B, T, N, D)."""
    b, kv_heads = o.shape[:2]
    g = n // kv_heads
    o = o[:, :, : t * g, :d].reshape(b, kv_heads, t, g, d)
    return o.transpose(0, 2, 1, 3, 4).reshape(b, t, n, d)


def broadcast_operand(x: jax.Array, name: str, plan: Plan, dtype: jnp.dtype) -> tuple[jax.Array, tuple[int, int, int]]:
    """bias/mask (B|1, N|1, T|1, S|1) -> (B|1, K|1, 1|rows_pad, keys_pad) and its (batch, heads, rows) sizes.

    A row vector shared by all rows of a kv head stays one row; anything else is spread over the rows.
    """
    full = (plan.b, plan.n, plan.t, plan.s)
    if x.ndim > 4:
        raise ValueError(f"{name} has rank {x.ndim} > 4; expected (B|1, N|1, T|1, S|1) broadcasting to {full}")
    x = x.reshape((1,) * (4 - x.ndim) + x.shape)
    for got, want in zip(x.shape, full, strict=True):
        if got not in (1, want):
            raise ValueError(f"{name} shape {x.shape} does not broadcast to (B, N, T, S) = {full}")
    x = jnp.broadcast_to(x, x.shape[:3] + (plan.s,)).astype(dtype)
    bb, nb, tb, _ = x.shape
    pad_keys = plan.keys_pad - plan.s
    if tb == 1 and (nb == 1 or plan.groups == 1):
        x = x.reshape(bb, nb, 1, plan.s)
        return jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, pad_keys))), (bb, nb, 1)
    x = jnp.broadcast_to(x, (bb, plan.n, plan.t, plan.s))
    x = x.reshape(bb, plan.kv_heads, plan.groups, plan.t, plan.s).transpose(0, 1, 3, 2, 4)
    x = x.reshape(bb, plan.kv_heads, plan.rows, plan.s)
    x = jnp.pad(x, ((0, 0), (0, 0), (0, plan.rows_pad - plan.rows), (0, pad_keys)))
    return x, (bb, plan.kv_heads, plan.rows_pad)


def lengths(plan: Plan, q_lengths: jax.Array | None, kv_lengths: jax.Array | None,
            q_offsets: jax.Array | None = None) -> jax.Array:
    """(B, 2) int32: [q length, kv length] per batch row (T and S when absent); with `q_offsets`
    (plan.dynamic_q_offset), (B, 4): each row's q_offset third, then a zero, as Triton blocks are powers of 2."""
    out = []
    if q_offsets is not None and q_offsets.shape != (plan.b,):
        raise ValueError(f"q_offsets shape {q_offsets.shape} != (B,) = ({plan.b},)")
    for x, name, full in ((q_lengths, "q_lengths", plan.t), (kv_lengths, "kv_lengths", plan.s)):
        if x is None:
            out.append(jnp.full((plan.b,), full, jnp.int32))
        elif x.shape != (plan.b,):
            raise ValueError(f"{name} shape {x.shape} != (B,) = ({plan.b},)")
        else:
            out.append(jnp.clip(x.astype(jnp.int32), 0, full))
    if q_offsets is not None:
        out += [q_offsets.astype(jnp.int32), jnp.zeros((plan.b,), jnp.int32)]
    return jnp.stack(out, axis=1)


def empty_rows(plan: Plan, v: jax.Array) -> jax.Array:
    """(B, K, D_pad) f32: the output of a row that sees no key when masked logits are finite.

    softmax of S equal logits is 1/S, cast to v's dtype before the P·V dot (as in the reference).
    """
    weight = float(np.asarray(1.0 / plan.s, dtype=np.float32).astype(v.dtype).astype(np.float32))
    mean = jnp.sum(v.astype(jnp.float32), axis=1) * jnp.float32(weight)  # (B, K, D)
    return jnp.pad(mean, ((0, 0), (0, 0), (0, plan.value_pad - plan.d)))


def combine(
    plan: Plan,
    acc: jax.Array,  # (B, K, splits, rows_pad, D_pad) f32, unnormalised
    m: jax.Array,  # (B, K, splits, rows_pad) f32
    l: jax.Array,  # (B, K, splits, rows_pad) f32
    empty: jax.Array | None,  # (B, K, D_pad) f32, None = NaN
) -> jax.Array:  # (B, K, rows_pad, D_pad) f32
    """Flash-decoding's second step: merges the splits' partial softmaxes by their running maxima."""
    return combine_with_lse(acc, m, l, empty)[0]


def combine_with_lse(
    acc: jax.Array,  # (B, K, splits, rows_pad, D_pad) f32, unnormalised
    m: jax.Array,  # (B, K, splits, rows_pad) f32
    l: jax.Array,  # (B, K, splits, rows_pad) f32
    empty: jax.Array | None,  # (B, K, D_pad) f32, None = NaN
) -> tuple[jax.Array, jax.Array]:  # (B, K, rows_pad, D_pad), (B, K, rows_pad) f32
    """`combine`, and each row's log-sum-exp over all splits (-inf for a row that sees no key): what a
    caller needs to merge this call's rows with another call's over other keys."""
    m_total = jnp.max(m, axis=2, keepdims=True)
    m_safe = jnp.where(m_total == -jnp.inf, 0.0, m_total)
    w = jnp.exp(m - m_safe)  # (B, K, splits, rows_pad)
    l_total = jnp.sum(w * l, axis=2)
    o = jnp.sum(w[..., None] * acc, axis=2)
    lse = jnp.where(l_total > 0, m_safe[:, :, 0] + jnp.log(jnp.where(l_total > 0, l_total, 1.0)), -jnp.inf)
    return finalize(o, l_total[..., None], None if empty is None else empty[:, :, None, :]), lse


def finalize(
    acc: jax.Array,  # (B, K, rows, D_pad) or a tile (rows, D_pad), f32
    l: jax.Array,  # same rank, last dim 1
    empty: jax.Array | None,  # broadcasts to acc; None = NaN
) -> jax.Array:
    """acc / l, and the empty-row value where no key was visible (l == 0)."""
    seen = l > 0
    out = acc / jnp.where(seen, l, 1.0)
    fill = jnp.float32(jnp.nan) if empty is None else empty
    return jnp.where(seen, out, fill)
