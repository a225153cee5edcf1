"""A sampler's sharded vocabulary as one range per shard: the `RangeSplit`s of per-shard samplers.

A tensor-parallel model's logits arrive sharded along the vocabulary. A per-shard sampler call cannot take
the whole row, so `hlofuse-lower-kernels` runs it as ranges (hlofuse.partition.ranges): `prepare` cuts the
logits (*R, V) into (R, P, V/P) next to each row's global index and each range's first token (iotas cut
like the rows and the ranges), the shards run their ranges, and `merge` gives the composite's ids. Each form
is exactly its `sample_reference`:

- `sampled_ranges` (greedy, categorical, temperature; min_p after its mask): each range's winner with its
  score, drawn with the whole row's noise (`run_split`, e.g. the Pallas `sample_split`), and the best
  (score, id) over the ranges (`merge_vocab_splits`).
- `rank_top_k_ranges` (top_k, temperature_top_k): each range's top k with ids in the whole vocabulary (XLA's
  top-k on the shard); a second pass ranks each row's P * k candidates (split by split, each value
  descending with the lower id first, so equal values keep the row's id order) and draws among the row's
  top k as the program does (noise by rank, at the shard's rows of the batch).
- `top_k_mask_ranges` (top_k_mask): a first pass takes each range's top k, the row's k-th largest value is
  the k-th of those candidates, and the logits below it become -inf before `sampled_ranges`' pass (every
  tie of the k-th value stays, as in the program).

Only the candidates (R, P, k) and the winners (R, P) cross devices, not the logits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from hlofuse.kernels import CompositeCall
from hlofuse.kernels.noise import categorical_at_rows
from hlofuse.kernels.sampling_reference import merge_vocab_splits
from hlofuse.partition.ranges import RangeSplit, ShardPass

# Labels of the prepared operands: logits (R, P, V/P), row ids (R,), range starts (P,), the key if any; and of
# the ranges' top-k candidates (R, P, k, 2).
_LOGITS, _ROWS, _STARTS, _KEY = ("r", "v", ""), ("r",), ("v",), ("",)
_CANDIDATES = ("r", "v", "", "")
_JNP_DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}


def _prepare(call: CompositeCall, splits: int,
             mask: Callable[[Any], Any] | None = None) -> tuple[Callable[..., Any], tuple[tuple[str, ...], ...]]:
    """The prepare of every vocabulary split, and its operands' labels."""
    (shape, _), *rest = call.operand_types
    rows, width = math.prod(shape[:-1]), shape[-1] // splits

    def prepare(logits: Any, *key: Any) -> tuple[Any, ...]:  # noqa: ANN401
        if mask is not None:
            logits = mask(logits)
        row_ids = jax.lax.iota(jnp.int32, rows)
        starts = jax.lax.iota(jnp.int32, splits) * jnp.int32(width)
        return (logits.reshape(rows, splits, width), row_ids, starts, *key)

    return prepare, (_LOGITS, _ROWS, _STARTS, *((_KEY,) if rest else ()))


def _batch(call: CompositeCall) -> tuple[int, ...]:
    return tuple(call.operand_types[0][0][:-1])


def _sample_ranges_pass(call: CompositeCall, run_split: Callable[..., Any], form: str) -> Callable[..., Any]:
    """One shard's ranges sampled by `run_split(logits (R', W), key, form=, vocab_total=, vocab_offset=,
    row_offset=) -> (ids, scores)`."""
    vocab = call.operand_types[0][0][-1]

    def shard(logits: Any, row_ids: Any, starts: Any, *key: Any) -> tuple[Any, Any]:  # noqa: ANN401
        ids, scores = run_split(logits[:, 0], key[0] if key else None, form=form, vocab_total=vocab,
                                vocab_offset=starts[0], row_offset=row_ids[0])
        return ids[:, None], scores[:, None]

    return shard


def _merge_winners(call: CompositeCall) -> Callable[..., Any]:
    batch = _batch(call)

    def merge(ids: Any, scores: Any) -> Any:  # noqa: ANN401  (R, P) each
        return merge_vocab_splits(ids, scores).reshape(batch)

    return merge


def _platforms(platform: str | None) -> tuple[str, ...]:
    """The platforms a range's pass is lowered for: the kernel's, or this host's (empty)."""
    return (platform,) if platform is not None else ()


def sampled_ranges(call: CompositeCall, splits: int, run_split: Callable[..., Any], form: str,
                   mask: Callable[[Any], Any] | None = None, platform: str | None = None) -> RangeSplit:
    """Each range sampled with the whole row's noise (row * V + id) and the winners merged by (score, id):
    for the forms whose keep-set is the whole row, after `mask` (JAX, on the whole logits: a keep-set the
    program computes with row reductions, which the partitioner splits with small all-reduces)."""
    prepare, operands = _prepare(call, splits, mask)
    return RangeSplit(prepare=prepare, shard=_sample_ranges_pass(call, run_split, form), merge=_merge_winners(call),
                      operands=operands, results=(("r", "v"), ("r", "v")), platforms=_platforms(platform))


def _range_top_k(k: int, scale: float | None = None) -> Callable[..., Any]:
    """One shard's ranges' top min(k, W) of x (of x / scale when a scale is given), as (R', 1, k', 2) f32
    candidates: the value (exact in f32 for f32 and bf16 logits) and the bits of its id in the whole
    vocabulary. One array, so that the partitioner gathers the candidates once."""

    def shard(logits: Any, row_ids: Any, starts: Any, *key: Any) -> tuple[Any]:  # noqa: ANN401
        x = logits[:, 0]
        if scale is not None:
            x = x / scale
        values, ids = jax.lax.top_k(x, min(k, x.shape[-1]))
        id_bits = jax.lax.bitcast_convert_type(ids + starts[0], jnp.float32)
        return (jnp.stack([values.astype(jnp.float32), id_bits], axis=-1)[:, None],)

    return shard


def _candidates_top_k(candidates: Any, k: int, dtype: Any) -> tuple[Any, Any]:  # noqa: ANN401
    """The row's top k from its ranges' candidates (R, P, k', 2): values (in `dtype`) and ids, in lax.top_k's
    order."""
    rows = candidates.shape[0]
    flat = candidates.reshape(rows, -1, 2)
    top, position = jax.lax.top_k(flat[..., 0].astype(dtype), k)
    ids = jax.lax.bitcast_convert_type(flat[..., 1], jnp.int32)
    return top, jnp.take_along_axis(ids, position, axis=-1)


def rank_top_k_ranges(call: CompositeCall, splits: int, form: str, temperature: float, k: int,
                      platform: str | None = None) -> RangeSplit:
    """top_k (categorical over top_k(x) / T) or temperature_top_k (over top_k(x / T)), ids mapped back: a
    first pass takes each range's top k; the second takes every range's candidates of its rows (one
    all-gather at the manual computation's boundary), ranks them and draws among the row's top k as the
    program does, with the whole batch's noise at its rows (`categorical_at_rows`)."""
    if form not in ("top_k", "temperature_top_k"):
        raise ValueError(f"'{form}' is not a rank-space top-k form")
    prepare, operands = _prepare(call, splits)
    batch = _batch(call)
    dtype = call.operand_types[0][1]
    temperature_first = form == "temperature_top_k"

    def between(logits: Any, row_ids: Any, starts: Any, key: Any, candidates: Any) -> tuple[Any, ...]:  # noqa: ANN401
        return candidates, row_ids, key

    def draw(candidates: Any, row_ids: Any, key: Any) -> tuple[Any]:  # noqa: ANN401
        top, top_ids = _candidates_top_k(candidates, k, _JNP_DTYPES[dtype])
        scaled = top if temperature_first else top / temperature
        chosen = categorical_at_rows(row_ids[0])(key, scaled, axis=-1)
        return (jnp.take_along_axis(top_ids, chosen[:, None].astype(jnp.int32), axis=-1)[:, 0],)

    def merge(ids: Any) -> Any:  # noqa: ANN401  (R,)
        return ids.reshape(batch)

    first = ShardPass(_range_top_k(k, temperature if temperature_first else None), operands, (_CANDIDATES,),
                      _platforms(platform))
    return RangeSplit(prepare=prepare, shard=draw, merge=merge, operands=(("r", "", "", ""), _ROWS, _KEY),
                      results=(_ROWS,), first=first, between=between, platforms=_platforms(platform))


def top_k_mask_ranges(call: CompositeCall, splits: int, run_split: Callable[..., Any], k: int,
                      platform: str | None = None) -> RangeSplit:
    """top_k_mask: a first pass takes each range's top k; the row's k-th largest logit is the k-th of those
    candidates; the logits below it become -inf (every tie of it stays), and the ranges are sampled as
    temperature (`run_split` with the composite's temperature) with the whole row's noise and merged by
    (score, id)."""
    prepare, operands = _prepare(call, splits)

    def between(logits: Any, row_ids: Any, starts: Any, *rest: Any) -> tuple[Any, ...]:  # noqa: ANN401
        *key, candidates = rest
        kth = _candidates_top_k(candidates, k, logits.dtype)[0][:, k - 1]
        masked = jnp.where(logits < kth[:, None, None], -jnp.inf, logits)
        return (masked, row_ids, starts, *key)

    sample_pass = _sample_ranges_pass(call, run_split, "temperature")
    return RangeSplit(prepare=prepare, shard=sample_pass, merge=_merge_winners(call),
                      operands=operands, results=(("r", "v"), ("r", "v")),
                      first=ShardPass(_range_top_k(k), operands, (_CANDIDATES,), _platforms(platform)),
                      between=between, platforms=_platforms(platform))


__all__ = ["rank_top_k_ranges", "sampled_ranges", "top_k_mask_ranges"]
