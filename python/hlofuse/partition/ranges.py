"""Range splits: a composite whose sharded dim a per-shard kernel cannot take whole, run as one range per shard.

A `RangeSplit` is three JAX functions around a manual computation: `prepare` (on the whole operands) cuts the dim
into one range per shard, `shard` runs one range's kernel inside the computation and returns partial results, and
`merge` combines them into the composite's results. Here are the attention splits, whose maths follows:
- a decode's key sequence (`decode_key_split`): each range gets its key lengths (the composite's and the one
  query's causal / right-window bound, shifted by the range's start); the ranges' (output, log-sum-exp) merge
  exactly, as flash-decoding merges its splits (`combine_partials`);
- a prefill's key sequence (`prefill_key_split`, a query chunk against a sharded cache): each range also gets its
  own q_offset (the composite's minus the range's start), which the kernels read per batch row;
- a prefill's query sequence (`prefill_query_split`, context parallelism): each query range gets its q_offset
  (the composite's plus the range's start) and its q_lengths, K and V stay whole, and the merge is a reshape;
- a sampler's rows (`sampled_rows`): each shard draws its rows of the whole batch's noise through the kernel's
  row offset.
The samplers' vocabulary splits are in hlofuse.partition.vocab_ranges. A target's splits are its `KernelSpec`'s
`key_split`, `query_split` and `vocab_split` (`key_split_for` and the others read them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from hlofuse.kernels import CompositeCall, Lowered, spec_for
from hlofuse.kernels.reference import UNBOUNDED, combine_partials
from hlofuse.ops.attention import AttentionAttrs
from hlofuse.partition.cuts import (
    Cuts,
    decode_key_split_unsupported,
    prefill_key_split_unsupported,
    spec_cuts,
)


@dataclass(frozen=True)
class RangeSplit:
    """A composite with a sharded dim that a per-shard kernel cannot take whole (a key or query sequence, a
    vocabulary): `prepare` (JAX, on the whole operands) cuts it into one range per shard, `shard` runs one
    range's kernel under the manual computation (operands and results labelled `operands`, `results`; "s",
    "t" or "v" the range dim) and returns partial results, and `merge` (JAX, after it) combines the ranges
    into the composite's results."""

    prepare: Callable[..., Any]
    shard: Callable[..., Any]
    merge: Callable[..., Any]
    operands: tuple[tuple[str, ...], ...]
    results: tuple[tuple[str, ...], ...]
    # A first pass over the ranges, for a split that needs a row-wide value before its main pass (the k-th
    # largest logit of top_k_mask): `first` runs per shard on the prepared operands, `between` (JAX, on the
    # whole values) takes the prepared operands and the first pass's results and gives `shard`'s operands.
    first: ShardPass | None = None
    between: Callable[..., Any] | None = None
    platforms: tuple[str, ...] = ()  # what `shard` is lowered for (a kernel's platform); empty: this host

    def __post_init__(self) -> None:
        if (self.first is None) != (self.between is None):
            raise ValueError("a RangeSplit takes a first pass and its `between` together, or neither")


@dataclass(frozen=True)
class ShardPass:
    """One function run per shard under a manual computation, on operands and to results labelled as given."""

    shard: Callable[..., Any]
    operands: tuple[tuple[str, ...], ...]
    results: tuple[tuple[str, ...], ...]
    platforms: tuple[str, ...] = ()  # what `shard` is lowered for; empty: this host


_JNP_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


def _platforms(platform: str | None) -> tuple[str, ...]:
    """The platforms a range's kernel is lowered for: `platform`, or this host's (empty)."""
    return (platform,) if platform is not None else ()


def _merge_ranges(b: int, t: int, n: int, splits: int, dtype: Any) -> Callable[..., Any]:  # noqa: ANN401
    """The merge of a key split: combines the P ranges' (output, lse) exactly (`combine_partials`)."""
    def merge(out: Any, lse: Any) -> Any:  # noqa: ANN401  (B, P, T, N, D), (B, P, T, N)
        d = out.shape[-1]
        merged = combine_partials(out.reshape(b, splits, t * n, d), lse.reshape(b, splits, t * n), "float32")
        return merged.reshape(b, t, n, d).astype(dtype)

    return merge


def decode_key_split(call: CompositeCall, splits: int, run_range: Callable[..., Any],
                     platform: str | None = None) -> RangeSplit:
    """A decode composite as `splits` key ranges, one per shard of its sharded key sequence.

    `prepare` cuts k, v into (B, P, S/P, K, H) and gives each range its key lengths (the composite's and
    the one query's causal / right-window bound, shifted by the range's start); `shard` runs
    `run_range(q, k, v, lengths, scale=, softcap=) -> (out f32, lse)` on one range (a target's kernel,
    lowered for `platform`); `merge` combines the P partial results exactly (`combine_partials`)."""
    attrs = AttentionAttrs.from_dict(call.attributes)
    b, t, n, _ = call.operand_types[0][0]
    s, kv = call.operand_types[1][0][1:3]
    has_lengths = "kv_lengths" in attrs.operands
    per_range = s // splits
    dtype = jnp.dtype(_JNP_DTYPES[call.operand_types[0][1]])

    def prepare(q: Any, k: Any, v: Any, *rest: Any) -> tuple[Any, ...]:  # noqa: ANN401
        limit = jnp.full((b,), s, jnp.int32)
        if has_lengths:
            limit = jnp.minimum(limit, rest[-1].astype(jnp.int32))
        right = 0 if attrs.causal else attrs.window_right
        if right != UNBOUNDED:  # key j is visible from the one query iff j <= q_offset + right
            limit = jnp.minimum(limit, jnp.int32(max(0, attrs.q_offset + right + 1)))
        starts = jnp.arange(splits, dtype=jnp.int32) * per_range
        lengths = jnp.clip(limit[:, None] - starts[None, :], 0, per_range)  # (B, P)
        return (q, *(x.reshape(b, splits, per_range, *x.shape[2:]) for x in (k, v)), lengths)

    def shard(q: Any, k: Any, v: Any, lengths: Any) -> tuple[Any, Any]:  # noqa: ANN401
        out, lse = run_range(q, k[:, 0], v[:, 0], lengths[:, 0], scale=attrs.scale, softcap=attrs.softcap)
        return out[:, None], lse[:, None]

    kv_label = "n" if kv > 1 else ""
    return RangeSplit(prepare=prepare, shard=shard, merge=_merge_ranges(b, t, n, splits, dtype),
                    operands=(("b", "", "n", ""), ("b", "s", "", kv_label, ""), ("b", "s", "", kv_label, ""),
                              ("b", "s")),
                    results=(("b", "s", "", "n", ""), ("b", "s", "", "n")), platforms=_platforms(platform))


def _range_attributes(attrs: AttentionAttrs) -> dict[str, Any]:
    """The attention attributes a prefill range's kernel call takes as they are: the reference's, less q_offset
    (each range has its own) and zero_empty_rows (which the splits refuse)."""
    own = ("q_offset", "zero_empty_rows")
    return {name: value for name, value in attrs.reference_kwargs().items() if name not in own}


def prefill_key_split(call: CompositeCall, splits: int, run_range: Callable[..., Any],
                      platform: str | None = None) -> RangeSplit:
    """A prefill composite (no bias or mask, masked_value -inf) as `splits` key ranges, one per shard.

    Key j of range p is global key p * S/P + j, so the range sees the queries at q_offset - p * S/P: the
    causal / window bounds hold with that offset, which `prepare` gives each (batch row, range) next to
    its key lengths (the composite's kv_lengths, shifted by the range's start). `shard` runs
    `run_range(q, k, v, kv_lengths=, q_offsets=, q_lengths=, **attention attributes) -> (out f32, lse)`
    on one range; `merge` combines the P partial results exactly (`combine_partials`): a row that sees
    no key of a range weighs 0 there, one that sees none of any is NaN, as in the reference."""
    attrs = AttentionAttrs.from_dict(call.attributes)
    b, t, n, _ = call.operand_types[0][0]
    s, kv = call.operand_types[1][0][1:3]
    extra = list(attrs.operands[3:])  # q_lengths and / or kv_lengths, in that order
    per_range = s // splits
    dtype = jnp.dtype(_JNP_DTYPES[call.operand_types[0][1]])
    statics = _range_attributes(attrs)

    def prepare(q: Any, k: Any, v: Any, *rest: Any) -> tuple[Any, ...]:  # noqa: ANN401
        named = dict(zip(extra, rest, strict=True))
        limit = jnp.full((b,), s, jnp.int32)
        if "kv_lengths" in named:
            limit = jnp.minimum(limit, named["kv_lengths"].astype(jnp.int32))
        starts = jnp.arange(splits, dtype=jnp.int32) * per_range
        lengths = jnp.clip(limit[:, None] - starts[None, :], 0, per_range)  # (B, P)
        offsets = jnp.broadcast_to(jnp.int32(attrs.q_offset) - starts[None, :], (b, splits))
        ranges = tuple(x.reshape(b, splits, per_range, *x.shape[2:]) for x in (k, v))
        q_lengths = (named["q_lengths"].astype(jnp.int32),) if "q_lengths" in named else ()
        return (q, *ranges, lengths, offsets, *q_lengths)

    def shard(q: Any, k: Any, v: Any, lengths: Any, offsets: Any, *q_lengths: Any) -> tuple[Any, Any]:  # noqa: ANN401
        out, lse = run_range(q, k[:, 0], v[:, 0], kv_lengths=lengths[:, 0], q_offsets=offsets[:, 0],
                             q_lengths=q_lengths[0] if q_lengths else None, **statics)
        return out[:, None], lse[:, None]

    kv_label = "n" if kv > 1 else ""
    range_labels = ("b", "s", "", kv_label, "")
    return RangeSplit(prepare=prepare, shard=shard, merge=_merge_ranges(b, t, n, splits, dtype),
                    operands=(("b", "", "n", ""), range_labels, range_labels, ("b", "s"), ("b", "s"),
                              *((("b",),) if "q_lengths" in extra else ())),
                    results=(("b", "s", "", "n", ""), ("b", "s", "", "n")), platforms=_platforms(platform))


def prefill_query_split(call: CompositeCall, splits: int, run_range: Callable[..., Any],
                        platform: str | None = None) -> RangeSplit:
    """A prefill composite (no bias or mask) as `splits` query ranges, one per shard of its sharded T.

    Query row i of range p is global row p * T/P + i, at key position i + q_offset + p * T/P: `prepare`
    cuts q into (B, P, T/P, N, H) and gives each (batch row, range) that q_offset and its q_lengths (the
    composite's, shifted by the range's start); `shard` runs `run_range(q, k, v, q_offsets=, q_lengths=,
    kv_lengths=, **attention attributes) -> out` on one range with K and V whole; `merge` is a reshape.
    Rows are independent, so nothing is combined and any masked_value works."""
    attrs = AttentionAttrs.from_dict(call.attributes)
    b, t, n, h = call.operand_types[0][0]
    kv = call.operand_types[1][0][2]
    extra = list(attrs.operands[3:])  # q_lengths and / or kv_lengths, in that order
    per_range = t // splits
    statics = _range_attributes(attrs)

    def prepare(q: Any, k: Any, v: Any, *rest: Any) -> tuple[Any, ...]:  # noqa: ANN401
        named = dict(zip(extra, rest, strict=True))
        starts = jnp.arange(splits, dtype=jnp.int32) * per_range
        offsets = jnp.broadcast_to(jnp.int32(attrs.q_offset) + starts[None, :], (b, splits))
        lengths = []
        if "q_lengths" in named:
            q_len = jnp.minimum(named["q_lengths"].astype(jnp.int32), t)
            lengths.append(jnp.clip(q_len[:, None] - starts[None, :], 0, per_range))  # (B, P)
        if "kv_lengths" in named:
            lengths.append(named["kv_lengths"].astype(jnp.int32))
        return (q.reshape(b, splits, per_range, n, h), k, v, offsets, *lengths)

    def shard(q: Any, k: Any, v: Any, offsets: Any, *lengths: Any) -> tuple[Any]:  # noqa: ANN401
        named = dict(zip(extra, lengths, strict=True))
        q_lengths = named["q_lengths"][:, 0] if "q_lengths" in named else None
        out = run_range(q[:, 0], k, v, q_offsets=offsets[:, 0], q_lengths=q_lengths,
                        kv_lengths=named.get("kv_lengths"), **statics)
        return (out[:, None],)

    def merge(out: Any) -> Any:  # noqa: ANN401  (B, P, T/P, N, D)
        return out.reshape(b, t, n, out.shape[-1])

    kv_label = "n" if kv > 1 else ""
    lengths_labels = {"q_lengths": ("b", "t"), "kv_lengths": ("b",)}
    return RangeSplit(prepare=prepare, shard=shard, merge=merge,
                    operands=(("b", "t", "", "n", ""), ("b", "", kv_label, ""), ("b", "", kv_label, ""), ("b", "t"),
                              *(lengths_labels[role] for role in extra)),
                    results=(("b", "t", "", "n", ""),), platforms=_platforms(platform))


def vocab_split_for(call: CompositeCall, target: str, splits: int) -> RangeSplit | None:
    """How `target`'s per-shard call splits `call`'s vocabulary into `splits` ranges; None if it does not."""
    spec = spec_for(call.name, target)
    return spec.vocab_split(call, target, splits) if spec is not None and spec.vocab_split is not None else None


def why_keys_stay_whole(call: CompositeCall, target: str) -> str | None:
    """Why `target`'s per-shard call keeps `call`'s key sequence whole, for a remark; None when it cuts it into
    ranges, or when the target has no key ranges at all (its spec's `key_split`)."""
    spec = spec_for(call.name, target)
    if spec is None or spec.key_split is None or "s" in spec_cuts(spec, call, 1).sizes:
        return None
    if call.operand_types[0][0][1] == 1:
        return decode_key_split_unsupported(call)
    if spec.prefill_key_ranges:
        return prefill_key_split_unsupported(call)
    return f"the {target} kernel takes q_offset as a constant, and each key range of a prefill needs its own"


def key_split_for(call: CompositeCall, target: str, splits: int) -> RangeSplit | None:
    """How `target`'s per-shard call splits `call`'s key sequence into `splits` ranges; None if it does not."""
    spec = spec_for(call.name, target)
    return spec.key_split(call, target, splits) if spec is not None and spec.key_split is not None else None


def query_split_for(call: CompositeCall, target: str, splits: int) -> RangeSplit | None:
    """How `target`'s per-shard call splits `call`'s query sequence into `splits` ranges; None if it does not."""
    spec = spec_for(call.name, target)
    return spec.query_split(call, target, splits) if spec is not None and spec.query_split is not None else None


def sampled_rows(call: CompositeCall, cuts: Cuts, kernel: Lowered) -> RangeSplit:
    """A stochastic sampler whose rows are cut: `prepare` adds the global index of each slice of the cut row dim
    (its iota times the rows after it, an operand cut like that dim), and each shard runs `kernel(logits, key,
    row_offset=)` with its element 0, so that it draws the noise of its rows of the whole batch."""
    shape = call.operand_types[0][0]
    dim = cuts.operands[0].index("r")
    stride = math.prod(shape[dim + 1:-1])

    def prepare(logits: Any, key: Any) -> tuple[Any, Any, Any]:  # noqa: ANN401
        return logits, key, jax.lax.iota(jnp.int32, shape[dim]) * jnp.int32(stride)

    def shard(logits: Any, key: Any, row_ids: Any) -> tuple[Any]:  # noqa: ANN401
        return (kernel.fn(logits, key, row_offset=row_ids[0]),)

    def merge(ids: Any) -> Any:  # noqa: ANN401
        return ids

    return RangeSplit(prepare=prepare, shard=shard, merge=merge, operands=(*cuts.operands, ("r",)),
                      results=cuts.results, platforms=kernel.platforms)


__all__ = ["RangeSplit", "ShardPass", "decode_key_split", "key_split_for", "prefill_key_split", "prefill_query_split",
           "query_split_for", "sampled_rows", "vocab_split_for", "why_keys_stay_whole"]
