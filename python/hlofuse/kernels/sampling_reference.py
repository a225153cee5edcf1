"""Token samplers as JAX programs write them: the forms hlofuse-fuse-sampling recognises, and the oracle.

Each `Form` is a plain-jnp function `fn(logits, key, *, temperature, k, p, min_p) -> token ids` written
the way a family of samplers writes it (MaxText/JetStream, gemma, keras-hub; reconstructed from their
documented behaviour, not copied). Three things use the same functions:
  - the fusion pass lowers each form (with sentinel constants for temperature, p and min_p) and fuses a
    program's subgraph only if it is op-for-op that lowering, so the composite's meaning is exact;
  - `sample_reference(logits, key, attrs)` is the contract of `stablehlo.composite "hlofuse.sample"`
    (docs/composites.md): every kernel returns exactly its token ids;
  - `hlofuse-lower-kernels{target=reference}` lowers a composite to its form, which is how tests check
    that fusion read the attributes right.

Noise: every stochastic form draws Gumbel noise with `jax.random.categorical` (threefry2x32, partitionable
counters: element i of the noise array uses counter i of its row-major flat index). Forms whose noise
array is (..., V) index it by vocabulary id; rank-space forms (`top_k`) index it by position in the
top-k list (value descending, ties by lower vocabulary id).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from hlofuse.kernels.noise import categorical_at_zero

NEG_INF = -jnp.inf
# jax.random.categorical, or one that draws the noise of other counters (hlofuse.kernels.noise.categorical_at_rows:
# a shard's rows of a larger batch); only the kernels' fallbacks pass another.
Categorical = Callable[..., jax.Array]


def _argmax(x: jax.Array) -> jax.Array:
    return jnp.argmax(x, axis=-1)


def _scale(x: jax.Array, temperature: float | None) -> jax.Array:
    """x / T; x itself for temperature None, a writing whose program scaled its logits before the sampler (see
    `_unscaled`)."""
    return x if temperature is None else x / temperature


def greedy(logits: jax.Array, key: jax.Array, **_: Any) -> jax.Array:
    """argmax(logits): first index of the largest value (NaN counts as largest)."""
    return _argmax(logits)


def greedy_softmax(logits: jax.Array, key: jax.Array, *, argmax_fn: Callable[[jax.Array], jax.Array] = _argmax,
                   **_: Any) -> jax.Array:
    """argmax(softmax(logits)), as samplers write `argmax(probs)`."""
    return argmax_fn(jax.nn.softmax(logits, axis=-1))


def keras_argmax(x: jax.Array) -> jax.Array:
    """keras' `ops.argmax` on its JAX backend: -0.0 becomes -tiny first (so that it ranks below +0.0), then
    jnp.argmax. Over probabilities, which are never -0.0, that is jnp.argmax: a writing of greedy_softmax (not of
    greedy, whose logits may hold -0.0)."""
    negative_zero = (x == 0) & jnp.signbit(x)
    return _argmax(jnp.where(negative_zero, -jnp.finfo(x.dtype).tiny, x))


def categorical(logits: jax.Array, key: jax.Array, *, categorical_fn: Categorical = jax.random.categorical,
                **_: Any) -> jax.Array:
    """jax.random.categorical(key, logits): Gumbel-max over the vocabulary, temperature 1."""
    return categorical_fn(key, logits, axis=-1)


def temperature(logits: jax.Array, key: jax.Array, *, temperature: float,
                categorical_fn: Categorical = jax.random.categorical, **_: Any) -> jax.Array:
    """categorical(key, logits / T)."""
    return categorical_fn(key, logits / temperature, axis=-1)


def _take(indices: jax.Array, position: jax.Array) -> jax.Array:
    return jnp.take_along_axis(indices, position[..., None].astype(jnp.int32), axis=-1)[..., 0]


Take = Callable[[jax.Array, jax.Array], jax.Array]


def take_by_batch_index(indices: jax.Array, position: jax.Array) -> jax.Array:
    """`indices[arange(B), position]` over (B, k) candidates, as gemma maps the drawn rank back to its id: the
    same ids as `_take`, written as a gather by batch index. (B, k) only: other shapes raise ValueError, so
    no template is made for them."""
    if indices.ndim != 2:
        raise ValueError(f"the batch-index gather takes (B, k) candidates, not {indices.shape}")
    return indices[jnp.arange(indices.shape[0]), position]


def take_by_torch_gather(indices: jax.Array, position: jax.Array) -> jax.Array:
    """`torch.gather(indices, -1, position[..., None])[..., 0]` as torchax lowers it (`torch_gather`: an iota of each
    leading dim beside the index), as torch samplers map the rank torch.multinomial drew among torch.topk's candidates
    back to its id: the same ids as `_take`."""
    return torch_gather(indices, position[..., None].astype(jnp.int32))[..., 0]


TopK = Callable[[jax.Array, int], tuple[jax.Array, jax.Array]]


def top_k_by_argsort(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """lax.top_k written as a stable descending argsort sliced to k, then the values gathered: the same ids
    (NaN first, then value descending, ties by lower index) and values, bit for bit except that it takes
    -0 and +0 as a tie where lax.top_k puts +0 first. (`argsort(-x)[..., :k]` is not one: it puts NaN
    last.)"""
    ids = jnp.argsort(x, axis=-1, descending=True, stable=True)[..., :k]
    return jnp.take_along_axis(x, ids, axis=-1), ids


def top_k_of_probs_by_negated_argsort(probs: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """lax.top_k of a softmax's probabilities written as `argsort(-probs)` sliced to k, then the values gathered (a
    hand-written nucleus's sort): a stable ascending order of -probs is value descending, ties by the lower id, as
    lax.top_k orders them. The two part only on a -0 (no softmax gives one: exp(y - max) / sum >= +0) and on a row
    holding both NaN and numbers (argsort(-x) puts NaN last; a softmax row is all NaN or none)."""
    ids = jnp.argsort(-probs, axis=-1)[..., :k]
    return jnp.take_along_axis(probs, ids, axis=-1), ids


def top_k(logits: jax.Array, key: jax.Array, *, temperature: float, k: int, top_k_fn: TopK = jax.lax.top_k,
          categorical_fn: Categorical = jax.random.categorical, take_fn: Take = _take, **_: Any) -> jax.Array:
    """JetStream / gemma style: categorical over the top-k logits / T, mapped back through their ids."""
    values, indices = top_k_fn(logits, k)
    return take_fn(indices, categorical_fn(key, _scale(values, temperature), axis=-1))


def temperature_top_k(logits: jax.Array, key: jax.Array, *, temperature: float, k: int,
                      top_k_fn: TopK = jax.lax.top_k, categorical_fn: Categorical = jax.random.categorical,
                      take_fn: Take = _take, **_: Any) -> jax.Array:
    """keras-hub style: temperature first, then categorical over the top-k."""
    values, indices = top_k_fn(logits / temperature, k)
    return take_fn(indices, categorical_fn(key, values, axis=-1))


def top_k_resorted(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """lax.top_k with its values sorted again, descending, as torchax lowers `torch.topk(x, k)` (sorted=True).
    Only the k-th value is read through it (`mask_top_k`): the smallest of the k either way, NaN only if all
    k are NaN, and of a tie of +0 and -0 either one, which compare equal."""
    values, ids = jax.lax.top_k(x, k)
    return jnp.sort(values, axis=-1, descending=True), ids


def top_k_as_torch(x: jax.Array, k: int, top_k_fn: TopK = jax.lax.top_k) -> tuple[jax.Array, jax.Array]:
    """`torch.topk(x, k)` as torchax lowers it: lax.top_k, its values sorted again (descending) and the ids taken
    along their argsort. The same (value, id) pairs as lax.top_k's (its values are sorted already: the argsort only
    moves equal values, or +0 and -0, among themselves)."""
    values, ids = top_k_fn(x, k)
    values = jnp.sort(values, descending=True)
    return values, jnp.take_along_axis(ids, jnp.argsort(values, axis=-1, descending=True), axis=-1)


def last_column(values: jax.Array) -> jax.Array:
    """values[..., -1:]: the k-th largest, kept as a (..., 1) column."""
    return values[..., -1:]


def last_as_torch_indexes(values: jax.Array) -> jax.Array:
    """values[..., -1, None], as torch code reads the k-th largest (`topk(...)[0][..., -1, None]`): the same
    column, through a squeeze and an expand."""
    return values[..., -1][..., None]


def last_as_torch_list_index(values: jax.Array) -> jax.Array:
    """values[:, [-1]], as nanoGPT-style torch code reads the k-th largest (`v[:, [-1]]`) and torchax lowers it: a
    gather at the index array [-1], normalised to k - 1. (B, k) values only."""
    if values.ndim != 2:
        raise ValueError(f"`v[:, [-1]]` reads (B, k) values, not {values.shape}")
    return values[:, jnp.array([-1], jnp.int32)]


def mask_top_k(logits: jax.Array, k: int, top_k_fn: TopK = jax.lax.top_k,
                kth_fn: Callable[[jax.Array], jax.Array] = last_column, fill: float | None = None) -> jax.Array:
    kth = kth_fn(top_k_fn(logits, k)[0])
    return jnp.where(logits < kth, NEG_INF if fill is None else fill, logits)


def top_k_of_probs(logits: jax.Array, key: jax.Array, *, temperature: float, k: int, top_k_fn: TopK = jax.lax.top_k,
                   categorical_fn: Categorical = jax.random.categorical, take_fn: Take = _take, **_: Any) -> jax.Array:
    """keras-hub's TopKSampler: the top k of the probabilities softmax(x / T) (not of the logits: distinct logits
    whose probabilities round equal tie, lower id first), then a categorical of their log in rank space, mapped
    back through their ids."""
    values, indices = top_k_fn(jax.nn.softmax(_scale(logits, temperature), axis=-1), k)
    return take_fn(indices, categorical_fn(key, jnp.log(values), axis=-1))


def top_k_mask(logits: jax.Array, key: jax.Array, *, temperature: float, k: int, top_k_fn: TopK = jax.lax.top_k,
               categorical_fn: Categorical = jax.random.categorical,
               kth_fn: Callable[[jax.Array], jax.Array] = last_column, fill: float | None = None,
               **_: Any) -> jax.Array:
    """MaxText style: logits below the k-th largest become -inf (ties at the k-th all stay), then / T. (A `fill` is a
    writing's: the dropped logits become that large negative number, not -inf; see FILL_NOTE.)"""
    return categorical_fn(key, _scale(mask_top_k(logits, k, top_k_fn, kth_fn, fill), temperature), axis=-1)


@dataclass(frozen=True)
class RankNucleus:
    """How a rank-space nucleus keeps the sorted probabilities `v` (descending) with their cumsum `c`. The two
    rules mean the same set in exact arithmetic, but each rounds its own way, so each is a form of its own:
      - "shifted" (keras-hub's TopPSampler): rank 0, and every rank whose preceding cumsum is <= p, that is
        `concatenate([True], (c <= p)[:-1])`; the dropped become 0;
      - "exclusive" (the flax / gemma / tunix `_sample_top_p`): `where(c - v > p, 0, v)`.
    `normalized`: the kept probabilities are divided by their sum before their log (flax / gemma)."""

    rule: str
    normalized: bool = False


KERAS_NUCLEUS = RankNucleus("shifted")
NORMALIZED_NUCLEUS = RankNucleus("exclusive", normalized=True)


def rank_nucleus_kept(values: jax.Array, cumulative: jax.Array, p: float, rule: str) -> jax.Array:
    """The sorted probabilities `values` with the ranks outside the nucleus at 0, by `rule` (RankNucleus), from
    their cumsum `cumulative`."""
    if rule == "shifted":
        keep = cumulative <= p
        keep = jnp.concatenate([jnp.ones_like(keep[..., :1]), keep[..., :-1]], axis=-1)
        return jnp.where(keep, values, jnp.zeros_like(values))
    if rule == "exclusive":
        return jnp.where(cumulative - values > p, 0.0, values)
    raise ValueError(f"no rank-space nucleus rule '{rule}'")


def log_floored(x: jax.Array, eps: float | None) -> jax.Array:
    """log(x + eps), as samplers floor the zeros before their log; log(x) for eps None (no floor written), which
    is log(x + 0.0) bit for bit for x >= 0."""
    return jnp.log(x) if eps is None else jnp.log(x + eps)


def nucleus_probs(logits: jax.Array, temperature: float | None) -> jax.Array:
    """softmax(x / T): the probabilities a rank-space nucleus sorts."""
    return jax.nn.softmax(_scale(logits, temperature), axis=-1)


def top_p_of_probs(logits: jax.Array, key: jax.Array, *, temperature: float, p: float, k: int = 0,
                   eps: float | None = None, nucleus: RankNucleus = KERAS_NUCLEUS, top_k_fn: TopK = jax.lax.top_k,
                   categorical_fn: Categorical = jax.random.categorical, take_fn: Take = _take,
                   **_: Any) -> jax.Array:
    """The rank-space nucleus: the top k (k = 0: all V) of softmax(x / T), sorted; the ranks outside the nucleus
    (`nucleus`'s rule) at 0, divided by their sum if `nucleus.normalized`; a categorical of log(kept + eps) in rank
    space (noise at row * width + rank), mapped back through the ids. keras-hub's TopPSampler (with or without k),
    and the flax / gemma / tunix `_sample_top_p`. Zero-probability ranks can win only when eps > 0."""
    values, indices = top_k_fn(nucleus_probs(logits, temperature), k or logits.shape[-1])
    return take_fn(indices, categorical_fn(key, rank_nucleus_scores(values, p, eps, nucleus), axis=-1))


def rank_nucleus_scores(values: jax.Array, p: float, eps: float | None, nucleus: RankNucleus,
                        width: int | None = None) -> jax.Array:
    """What a rank-space nucleus draws from: log(kept + eps), the kept sorted probabilities divided by their sum
    if `nucleus.normalized`. `values` may be the first ranks of `width` whose others all lie outside the nucleus
    (a kernel's candidates): the sum is then taken over the whole width, the others as zeros, so that it is the
    program's reduction of the same values."""
    kept = rank_nucleus_kept(values, jnp.cumsum(values, axis=-1), p, nucleus.rule)
    if nucleus.normalized:
        whole = kept if width is None else jnp.pad(kept, [(0, 0)] * (kept.ndim - 1) + [(0, width - kept.shape[-1])])
        kept = kept / jnp.sum(whole, axis=-1, keepdims=True)
    return log_floored(kept, eps)


def top_k_top_p_of_logits(logits: jax.Array, key: jax.Array, *, temperature: float, k: int, p: float,
                          fill: float | None = None, top_k_fn: TopK = jax.lax.top_k,
                          categorical_fn: Categorical = jax.random.categorical, take_fn: Take = _take,
                          **_: Any) -> jax.Array:
    """MaxText's composite sampler: the top k logits, the nucleus of their own softmax in rank space (ranks up to
    `sum(cumsum < p)` kept, as `arange(k) <= count`), the rest at -inf (or a writing's fill, FILL_NOTE), a categorical
    of `/ max(T, 1e-6)` (MaxText's guard, part of the form) over the k ranks, mapped back through the ids."""
    values, indices = top_k_fn(logits, k)
    cumulative = jnp.cumsum(jax.nn.softmax(values, axis=-1), axis=-1)
    keep = jnp.arange(values.shape[-1]) <= jnp.sum(cumulative < p, axis=-1, keepdims=True)
    masked = jnp.where(keep, values, jnp.full_like(values, NEG_INF if fill is None else fill))
    guarded = None if temperature is None else jnp.maximum(temperature, 1e-6)
    return take_fn(indices, categorical_fn(key, _scale(masked, guarded), axis=-1))


def top_p_of_logits_exclusive(logits: jax.Array, key: jax.Array, *, temperature: float, p: float, k: int = 0,
                              top_k_fn: TopK = jax.lax.top_k, categorical_fn: Categorical = jax.random.categorical,
                              take_fn: Take = _take, **_: Any) -> jax.Array:
    """tunix's `sample_top_p`: the top k (k = 0: all V) of x / T, the softmax of those sorted logits, the ranks whose
    preceding mass `cumsum - v` exceeds p at -inf (the "exclusive" rule of RankNucleus, on logits), a categorical
    of the kept logits themselves (not renormalised probabilities) over the ranks, mapped back through the ids."""
    values, indices = top_k_fn(_scale(logits, temperature), k or logits.shape[-1])
    probs = jax.nn.softmax(values, axis=-1)
    masked = jnp.where(jnp.cumsum(probs, axis=-1) - probs > p, NEG_INF, values)
    return take_fn(indices, categorical_fn(key, masked, axis=-1))


def top_p_of_top_k_rows(logits: jax.Array, key: jax.Array, *, temperature: jax.Array, p: jax.Array, k: int,
                        top_k_fn: TopK = jax.lax.top_k, categorical_fn: Categorical = jax.random.categorical,
                        take_fn: Take = _take, **_: Any) -> jax.Array:
    """EasyDeL's `sample_top_p_efficient`, with a temperature and a p per row ((B,) operands, a serving batch's
    requests): x / T (T at or below 1e-6 taken as 1), the top k of that, ranks whose cumsum of their softmax is
    within p kept (rank 0 always), the rest -inf, a categorical over the k ranks, mapped back through the ids.
    (B, V) logits (one (V,) row with scalar parameters under a vmap: `_row_by_row`)."""
    if logits.ndim > 2:
        raise ValueError(f"the per-row nucleus takes (B, V) logits (or one row, vmapped), not {logits.shape}")
    safe = jnp.where(temperature > 1e-6, temperature, 1.0)
    values, indices = top_k_fn(logits / jnp.expand_dims(safe, axis=-1), k)
    keep = jnp.cumsum(jax.nn.softmax(values, axis=-1), axis=-1) <= jnp.expand_dims(p, axis=-1)
    keep = keep.at[..., 0].set(True)
    return take_fn(indices, categorical_fn(key, jnp.where(keep, values, NEG_INF), axis=-1))


def sorted_probs_rows(logits: jax.Array, key: jax.Array, *, temperature: float, k: jax.Array, p: jax.Array,
                      min_p: jax.Array | None = None, sort_fn: Callable[[jax.Array], tuple[jax.Array, jax.Array]] | None
                      = None, categorical_fn: Categorical = jax.random.categorical, **_: Any) -> jax.Array:
    """sglang-jax's sampler with a k, a p (and a min-p) per row ((B,) operands): softmax(x / T) sorted descending as
    `jnp.sort(probs)[:, ::-1]` with `jnp.argsort(probs)[:, ::-1]` (ties: the higher id first), its cumsum, ranks at
    or past k zeroed, ranks whose preceding mass exceeds p zeroed (by the zeroed values), ranks below min-p times rank
    0 zeroed, then a categorical of those probabilities *as logits* (so a zeroed rank still scores 0 + noise: the
    library's own rule), mapped back through the ids. (B, V) logits only."""
    if logits.ndim != 2:
        raise ValueError(f"sglang-jax's sampler takes (B, V) logits, not {logits.shape}")
    probs = jax.nn.softmax(_scale(logits, temperature), axis=-1)
    if sort_fn is None:
        ordered, ids = jnp.sort(probs, axis=-1)[:, ::-1], jnp.argsort(probs, axis=-1)[:, ::-1]
    else:
        ordered, ids = sort_fn(probs)
    cumulative = jnp.cumsum(ordered, axis=-1)
    ordered = jnp.where(jnp.arange(0, probs.shape[-1]).reshape(1, -1) >= k.reshape(-1, 1), 0.0, ordered)
    ordered = jnp.where((cumulative - ordered) > p.reshape(-1, 1), 0.0, ordered)
    if min_p is not None:
        ordered = jnp.where(ordered < (ordered[:, 0] * min_p).reshape(-1, 1), 0.0, ordered)
    drawn = categorical_fn(key, ordered, axis=-1).reshape(-1, 1)
    return jnp.take_along_axis(ids.astype(jnp.int32), axis=1, indices=drawn).flatten()


# ----- threshold searches over float32 bits (tpu-inference's sampler; eSurge's search is the same) --------------
# A search of bf16 values is formed for no kernel: the search's loop reads them rounded to bf16 (a loop operand),
# while XLA may fuse their computation (`x * (1 / T)`) into the final compare with the cutoff and compare them
# unrounded (its excess precision, on by default). Then the program keeps another set than its own ops mean:
# axlearn's searched top-k at k = 1 of bf16 logits times 1 / 1.3 drops every logit of a row, and draws id 0, unless
# compiled with `xla_allow_excess_precision=False`. No kernel can stand in for a cut that is the compiler's choice.
EXCESS_PRECISION_NOTE = ("of bf16 values, which XLA may compare unrounded (excess precision) where the search read "
                         "them rounded: the cut is the compiler's, which no kernel reproduces")
# A search finds, per row, the largest finite float32 t for which a monotone predicate is False, one bit at a time from
# the sign down (32 predicate evaluations, each a reduction over the vocabulary, and no sort): the top-k cutoff is the
# k-th largest value (the count of values above -t reaching k), the top-p threshold the smallest probability whose
# mass of probabilities at or above it reaches p.

_EXPONENT_BITS = (1 << 31) - (1 << 23)


def _total_order_bits(bits: jax.Array) -> jax.Array:
    """int32 -> the bit pattern of the float32 at that place in the float total order (the non-sign bits of a
    negative flipped), so that int32 order is float order."""
    return bits ^ jnp.where(bits < 0, jnp.int32((1 << 31) - 1), jnp.int32(0))


def largest_float_not_meeting(lead: tuple[int, ...], predicate: Callable[[jax.Array], jax.Array],
                              sign_dtype: Any = jnp.uint32) -> jax.Array:  # noqa: ANN401
    """Per element of `lead`, the largest finite float32 t with predicate(t) False (predicate monotone: False up to
    a threshold, True above it), found over int32 bit patterns in the float order: the sign bit first, then bits 30
    down to 0 in a fori_loop. Non-finite patterns answer False below and True above every finite one. The sign bit
    is a `sign_dtype` constant: uint32 as T5X's binary_search and tpu-inference write it, or int32 as axlearn writes
    `jnp.int32(1 << 31)` (NumPy 1 wraps it to int32's minimum, the same bits)."""

    exponent = jnp.int32(_EXPONENT_BITS)  # one array the loop body closes over (a loop operand, as libraries write it)

    def on_bits(bits: jax.Array) -> jax.Array:
        pattern = _total_order_bits(bits)
        finite = (pattern & exponent) != exponent
        return jnp.where(finite, predicate(jax.lax.bitcast_convert_type(pattern, jnp.float32)), pattern >= 0)

    found = jnp.zeros(lead, dtype=jnp.int32)
    sign = jnp.uint32(1 << 31) if sign_dtype == jnp.uint32 else jnp.int32(-(1 << 31))
    found = found | jnp.where(on_bits(found), sign, sign_dtype(0))

    def next_bit(i: jax.Array, found: jax.Array) -> jax.Array:
        bit = jnp.int32(1 << (30 - i))
        return found | jnp.where(on_bits(found | bit), jnp.int32(0), bit)

    found = jax.lax.fori_loop(0, 31, next_bit, found)
    return jax.lax.bitcast_convert_type(_total_order_bits(found), jnp.float32)


def _over_rows(x: jax.Array) -> tuple[jax.Array, int]:
    """x (..., V) with the vocabulary moved next to last (the searches reduce it 32 times: not across lanes)."""
    return (jnp.swapaxes(x, -1, -2), x.ndim - 2) if x.ndim > 1 else (x, x.ndim - 1)


def search_top_k_mask(x: jax.Array, k: jax.Array, fill: float, sign_dtype: Any = jnp.uint32,  # noqa: ANN401
                      negate: Callable[[jax.Array], jax.Array] = jnp.negative) -> jax.Array:
    """x where x >= its k-th largest value (all tied values kept), else `fill`: the cutoff found by
    largest_float_not_meeting over -t, with the count of values above -t reaching k, and then negated (`negate`:
    tpu-inference's `-t`, or axlearn's `-1 * t`, the same bits)."""
    rows, axis = _over_rows(x)

    def reaches_k(t: jax.Array) -> jax.Array:
        return jnp.sum(rows > jax.lax.expand_dims(-t, (axis,)), axis=axis) >= k

    cutoff = negate(largest_float_not_meeting(x.shape[:-1], reaches_k, sign_dtype))
    return jnp.where(x >= jax.lax.expand_dims(cutoff, (cutoff.ndim,)), x, jnp.full_like(x, fill))


def search_top_p_mask(logits: jax.Array, p: jax.Array, fill: float,
                      sign_dtype: Any = jnp.uint32) -> jax.Array:  # noqa: ANN401
    """logits where softmax(logits) >= t, else `fill`, for the largest t whose mass of probabilities at or above
    it is not below p (found by largest_float_not_meeting)."""
    probs = jax.nn.softmax(logits, axis=-1)
    rows, axis = _over_rows(probs)

    def below_p(t: jax.Array) -> jax.Array:
        t = jax.lax.expand_dims(t, (axis,))
        return jnp.sum(jnp.where(rows >= t, rows, 0.0), axis=axis) < p

    threshold = largest_float_not_meeting(probs.shape[:-1], below_p, sign_dtype)
    return jnp.where(probs >= jax.lax.expand_dims(threshold, (threshold.ndim,)), logits, jnp.full_like(logits, fill))


def scale_rows(logits: jax.Array, temperature: jax.Array) -> jax.Array:
    """logits (B, V) / a temperature per row (B,), in the logits' dtype (tpu-inference's scaling)."""
    return logits / jnp.expand_dims(temperature.astype(logits.dtype), axis=-1)


def threshold_search_rows(logits: jax.Array, key: jax.Array, *, temperature: jax.Array, k: jax.Array, p: jax.Array,
                          fill: float | None = None, categorical_fn: Categorical = jax.random.categorical,
                          **_: Any) -> jax.Array:
    """tpu-inference's sampler (vLLM on TPU) with a temperature, k (int32) and p per row ((B,) operands): x / T, the
    searched top-k mask where k > 0, the searched top-p mask of what is left where p < 1, the dropped logits at -inf
    (or a writing's fill, FILL_NOTE), then a categorical. (B, V) logits only."""
    if logits.ndim != 2:
        raise ValueError(f"the threshold-search sampler takes (B, V) logits, not {logits.shape}")
    fill = NEG_INF if fill is None else fill
    x = scale_rows(logits, temperature)
    x = jnp.where(jnp.expand_dims(k > 0, axis=-1), search_top_k_mask(x, k, fill), x)
    x = jnp.where(jnp.expand_dims(p < 1.0, axis=-1), search_top_p_mask(x, p, fill), x)
    return categorical_fn(key, x)


def searched_masks(logits: jax.Array, key: jax.Array, *, temperature: float | None, k: int | None = None,
                   p: float | None = None, fill: float | None = None, sign_dtype: Any = jnp.int32,  # noqa: ANN401
                   negate: Callable[[jax.Array], jax.Array] = lambda t: -1 * t,
                   categorical_fn: Categorical = jax.random.categorical, **_: Any) -> jax.Array:
    """The searched filters with constant parameters, as axlearn's logit modifiers chain them (after T5X's search):
    x / T (`scale_by`), the searched top-k mask of x (`top_k_logits`: every value >= the k-th largest, ties kept),
    the searched top-p mask of what is left (`top_p_logits`: the probabilities >= the largest t whose mass at or above
    it reaches p), the dropped logits at -inf (or a writing's fill, FILL_NOTE), then a categorical. A filter whose
    parameter is None is not in the chain. Logits of any rank: the vocabulary last. The searches' sign bit is axlearn's
    int32 (`largest_float_not_meeting`) and the top-k cutoff axlearn's `-1 * t`; a writing has tpu-inference's
    uint32 and `-t` (T5X's `binary_search.topk_mask` and `topp_mask`)."""
    fill = NEG_INF if fill is None else fill
    x = _scale(logits, temperature)
    if k is not None:
        x = search_top_k_mask(x, k, fill, sign_dtype, negate)
    if p is not None:
        x = search_top_p_mask(x, p, fill, sign_dtype)
    return categorical_fn(key, x, axis=-1)


def searched_top_k(logits: jax.Array, key: jax.Array, *, k: int, p: float | None = None, **params: Any) -> jax.Array:
    """searched_masks with the top-k alone: `chain(scale_by(T), top_k_logits(k))`."""
    del p
    return searched_masks(logits, key, k=k, **params)


def searched_top_p(logits: jax.Array, key: jax.Array, *, p: float, k: int | None = None, **params: Any) -> jax.Array:
    """searched_masks with the top-p alone: `chain(scale_by(T), top_p_logits(p))`."""
    del k
    return searched_masks(logits, key, p=p, **params)


ESURGE_FILL = -1.0e10  # eSurge's fill for every dropped logit: its forms read it as a constant of their own


def _esurge_per_row(mask: Callable[..., jax.Array], applies: Callable[[jax.Array], jax.Array],
                    values: jax.Array) -> Callable[[jax.Array], jax.Array]:
    """eSurge's filter of a batch: each row, under a vmap, through `mask(row[None], value, fill)[0]` where
    `applies(value)` (a lax.cond per row), else the row itself."""

    def rows(x: jax.Array) -> jax.Array:
        def one(row: jax.Array, value: jax.Array) -> jax.Array:
            return jax.lax.cond(applies(value), lambda: mask(row[None, :], value, ESURGE_FILL)[0], lambda: row)

        return jax.vmap(one)(x, values)

    return rows


def esurge_min_p_mask(x: jax.Array, min_p: jax.Array) -> jax.Array:
    """eSurge's min-p, on the logits (not the probabilities): keep `x >= min_p * max(x)`, else its fill (so a row whose
    max logit is negative, above min_p times itself, keeps nothing: every logit at the fill)."""
    threshold = min_p[:, None] * jnp.max(x, axis=-1, keepdims=True)
    return jnp.where(x >= threshold, x, jnp.full_like(x, ESURGE_FILL))


def esurge_searched_rows(logits: jax.Array, key: jax.Array, *, temperature: jax.Array, k: jax.Array, p: jax.Array,
                         min_p: jax.Array | None = None, categorical_fn: Categorical = jax.random.categorical,
                         **_: Any) -> jax.Array:
    """EasyDeL eSurge's sampler (`_regular_sample`) with a temperature ((B, 1) column), k (int32), p (and min-p) per
    row: the searched top-k mask (search_top_k_mask) of the rows with k > 0, then the searched top-p mask of the rows
    with p < 1, each under a lax.cond on whether any row asks for it and a per-row lax.cond under a vmap; then
    x / T where any T != 1 (x / 1 is x); then, with a min-p, esurge_min_p_mask under its flag's lax.cond; every
    dropped logit at eSurge's -1e10 (ESURGE_FILL, its rule, kept), then the draw (a key per row: `_row_keys`).
    (B, V) logits only."""
    if logits.ndim != 2:
        raise ValueError(f"eSurge's sampler takes (B, V) logits, not {logits.shape}")
    x = jax.lax.cond(jnp.any(k > 0), _esurge_per_row(search_top_k_mask, lambda value: value > 0, k), lambda x: x,
                     logits)
    x = jax.lax.cond(jnp.any(p < 1.0), _esurge_per_row(search_top_p_mask, lambda value: value < 1.0, p),
                     lambda x: x, x)
    x = jax.lax.cond(jnp.any(temperature != 1.0), lambda x: x / temperature, lambda x: x, x)
    if min_p is not None:
        x = jax.lax.cond(True, lambda x: esurge_min_p_mask(x, min_p), lambda x: x, x)
    return categorical_fn(key, x)


def _unfloored(writing: Writing) -> Writing:
    """`writing` without a floor before the log: the program takes log(kept) itself, which reads eps = 0."""

    def fn(logits: jax.Array, key: jax.Array, *, eps: float | None = None, **params: Any) -> jax.Array:
        del eps
        return writing.fn(logits, key, eps=None, **params)

    return dataclasses.replace(writing, fn=fn)


def keep_exactly_top_k(logits: jax.Array, k: int, top_k_fn: TopK = jax.lax.top_k, by_rows: bool = False,
                       dropped: float = NEG_INF) -> jax.Array:
    """The k logits lax.top_k picks (ties by the lower id: exactly k, unlike `mask_top_k`) scattered into a row of
    -inf, as Hugging Face's FlaxTopKLogitsWarper writes it: flat ids (row * V + id) set into a flat (B * V,) row; of
    one row (V,), the ids set into a row of -inf, as litgpt's `full_like(-inf).scatter_(-1, i, v)` is lowered; with
    `by_rows`, (B, V) rows set at (row, id), as torchax lowers `full_like(-inf).scatter_(1, i, v)` of (B, V) logits
    (x-transformers' `top_k`). (B, V) or (V,) logits only: other shapes raise ValueError, so no template is made."""
    values, ids = top_k_fn(logits, k)
    if logits.ndim == 1:
        return jnp.full_like(logits, dropped).at[ids].set(values)
    if logits.ndim != 2:
        raise ValueError(f"the exact top-k scatter takes (B, V) logits or one row, not {logits.shape}")
    batch, vocab = logits.shape
    if by_rows:
        rows = jnp.broadcast_to(jnp.arange(batch).reshape(batch, 1), (batch, k))
        return jnp.full_like(logits, dropped).at[(rows, ids)].set(values[0:batch, 0:k])
    rows = jnp.broadcast_to((jnp.arange(batch) * vocab)[:, None], (batch, k)).flatten()
    kept = jnp.full(batch * vocab, dropped).at[ids.flatten() + rows].set(values.flatten())
    return kept.reshape(batch, vocab)


def top_k_exact_mask(logits: jax.Array, key: jax.Array, *, temperature: float, k: int,
                     top_k_fn: TopK = jax.lax.top_k, categorical_fn: Categorical = jax.random.categorical,
                     by_rows: bool = False, fill: float | None = None, by_one_hot: bool = False,
                     **_: Any) -> jax.Array:
    """Exactly the top k logits kept (lax.top_k's, ties by the lower id), the rest -inf, then / T, a categorical over
    the vocabulary (noise by id): Hugging Face's Flax generate() with its TopK warper (litgpt's and x-transformers'
    top-k through torchax are writings). `by_one_hot` (google-deepmind/simply's `top_k_mask`, of any (..., V) logits:
    simply's are (B, 1, V)): the kept ids as a mask, `any(one_hot(ids, V), axis=-2)`, and `where(mask, logits,
    fill)`: the same row, the dropped at `fill` (FILL_NOTE; the scores a composite gives back are at it). Logits of
    more than two dims are kept as their rows, (R, V)."""
    dropped = NEG_INF if fill is None else fill
    if by_one_hot:
        _, ids = top_k_fn(logits, k)
        kept = jnp.where(jnp.any(jax.nn.one_hot(ids, logits.shape[-1], dtype=jnp.bool_), axis=-2), logits, dropped)
    elif logits.ndim > 2:
        rows = logits.reshape(-1, logits.shape[-1])
        kept = keep_exactly_top_k(rows, k, top_k_fn, by_rows, dropped).reshape(logits.shape)
    else:
        kept = keep_exactly_top_k(logits, k, top_k_fn, by_rows, dropped)
    return categorical_fn(key, _scale(kept, temperature), axis=-1)


def flax_top_p_keep(values: jax.Array, p: float) -> jax.Array:
    """Hugging Face's FlaxTopPLogitsWarper's keep of the descending-sorted logits `values` (B, V): rank j is kept
    where the cumulative softmax before it is below p (`jnp.roll` of `cumsum < p` by one, over the flattened
    array, whose wrapped first column is then set), and rank 0 always (min_tokens_to_keep = 1)."""
    keep = jnp.roll(jnp.cumsum(jax.nn.softmax(values, axis=-1), axis=-1) < p, 1)
    keep |= keep.at[:, 0].set(True)
    return keep.at[:, :1].set(True)


def top_p_flax_mask(logits: jax.Array, key: jax.Array, *, temperature: float, p: float,
                    categorical_fn: Categorical = jax.random.categorical, **_: Any) -> jax.Array:
    """Hugging Face's FlaxTopPLogitsWarper (transformers 4.x Flax generate()): a full-width lax.top_k (value
    descending, ties by the lower id), `flax_top_p_keep`, the others -inf, back to vocabulary order by
    `lax.sort_key_val` of the ids, then a categorical of / T. (B, V) logits only."""
    if logits.ndim != 2:
        raise ValueError(f"the Flax top-p warper takes (B, V) logits, not {logits.shape}")
    values, ids = jax.lax.top_k(logits, logits.shape[-1])
    scores = jnp.where(flax_top_p_keep(values, p), values, jnp.full_like(logits, NEG_INF))
    return categorical_fn(key, _scale(jax.lax.sort_key_val(ids, scores)[-1], temperature), axis=-1)


MTJ_MASK = 1.0e10  # what mesh-transformer-jax subtracts from each removed logit


def mtj_sorted_removal(ordered: jax.Array, p: float) -> jax.Array:
    """mesh-transformer-jax's removal of the descending-sorted logits `ordered` (B, V): rank j removed where the cumsum
    of their softmax through rank j - 1 exceeds p (rank 0 never). (B, V) bools in rank order."""
    remove = jnp.cumsum(jax.nn.softmax(ordered), axis=-1) > p
    return jnp.concatenate((jnp.zeros_like(remove[:, :1]), remove), axis=-1)[:, :-1]


def mtj_top_p_removed(logits: jax.Array, p: float) -> jax.Array:
    """mesh-transformer-jax's (GPT-J's) `nucleaus_filter` removal, in vocabulary order: the row sorted descending by
    `jnp.sort` and `jnp.argsort` reversed (equal logits by the higher id first), `mtj_sorted_removal`, back to
    vocabulary order by `lax.sort_key_val` of the ids. (B, V) bools."""
    ids = jnp.argsort(logits)[:, ::-1]
    return jax.lax.sort_key_val(ids, mtj_sorted_removal(jnp.sort(logits)[:, ::-1], p))[1]


def top_p_mtj_mask(logits: jax.Array, key: jax.Array, *, temperature: float, p: float,
                   categorical_fn: Categorical = jax.random.categorical, **_: Any) -> jax.Array:
    """mesh-transformer-jax's `nucleaus_sample`: `mtj_top_p_removed` of the raw logits, MTJ_MASK subtracted from the
    removed (`logits -= 1e10 * removed`: not -inf, and in f32 whatever the logits' dtype), then a categorical of / T.
    A removed token then scores about -1e10 / T, below every kept one for T up to about 4e8. (B, V) logits only."""
    if logits.ndim != 2:
        raise ValueError(f"mesh-transformer-jax's nucleus takes (B, V) logits, not {logits.shape}")
    return categorical_fn(key, _scale(logits - MTJ_MASK * mtj_top_p_removed(logits, p), temperature), axis=-1)


def levanter_top_p_kept(y: jax.Array, p: float) -> jax.Array:
    """Levanter's (marin's) vocabulary-space nucleus of y (..., V): the order of a stable `jnp.argsort` reversed
    (descending; equal values by the higher id first, NaN first), the sorted logits taken along it, the cumsum of their
    softmax; rank 0 kept, and each rank whose cumsum before it is below p (`concatenate([True], (c < p)[..., :-1])`),
    the others -inf; back to vocabulary order by `take_along_axis` with the argsort of the order. Its threshold is p as
    a (1,) f32 array (`asarray(p)[..., None]`: Levanter writes `clip(p, 0, 1)[..., None] - 1e-4` in jnp, whose clip
    JAX folds when tracing and whose subtraction hlofuse-prepare folds, to the one constant this p is)."""
    order = jnp.argsort(y, axis=-1)[..., ::-1]
    kept = levanter_kept_in_rank_order(jnp.take_along_axis(y, order, axis=-1), p)
    return jnp.take_along_axis(kept, jnp.argsort(order, axis=-1), axis=-1)


def levanter_kept_in_rank_order(ordered: jax.Array, p: float) -> jax.Array:
    """`levanter_top_p_kept`'s keep of the logits in rank order (descending): rank 0, and each rank whose cumsum of
    the softmax before it is below p; the others -inf."""
    cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
    keep = cumulative < jnp.asarray(p, dtype=jnp.float32)[..., None]
    keep = jnp.concatenate([jnp.ones_like(keep[..., :1]), keep[..., :-1]], axis=-1)
    return jnp.where(keep, ordered, jnp.full_like(ordered, NEG_INF))


def top_p_levanter_mask(logits: jax.Array, key: jax.Array, *, temperature: float, p: float,
                        categorical_fn: Categorical = jax.random.categorical, **_: Any) -> jax.Array:
    """Levanter's (marin's) `Sampler`: y = x / T, its nucleus (`levanter_top_p_kept`), then a categorical of what is
    left (Levanter draws `argmax(y + gumbel)`, a writing of it). A cut by sorted place from the top, as Flax's."""
    return categorical_fn(key, levanter_top_p_kept(_scale(logits, temperature), p), axis=-1)


def sort_stable(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`jnp.sort(x)` and the stable `jnp.argsort(x)` (ascending; equal values by the lower id first, NaN last)."""
    return jnp.sort(x, axis=-1), jnp.argsort(x, axis=-1)


def prob_sorted_top_p_scores(y: jax.Array, one_minus_p: float, scatter_back: bool = False,
                             sort_fn: Sort = sort_stable) -> jax.Array:
    """transformer_vq's `nucleus` of y (..., V): the softmax of y in vocabulary order, sorted ascending by `jnp.sort`
    (the values) and the stable `jnp.argsort` (the ids: equal probabilities by the lower id first, whatever their
    logits; `sort_fn`), kept where the cumsum of the sorted probabilities is above 1 - p, and the last place (the
    largest) always, as int32; back to vocabulary order by `take_along_axis` with the argsort of the argsort, or
    (`scatter_back`, (B, V) only) by a scatter at the argsort's ids, which puts every place where the other does;
    then multiplied in: `y * keep - 1e10 * (1 - keep)` (a kept y is y bit for bit, a removed finite one -1e10, a
    removed infinity NaN)."""
    vocab = y.shape[-1]
    ascending, ids = sort_fn(jax.nn.softmax(y, axis=-1))
    last = jnp.equal(jnp.arange(vocab), jnp.full((vocab,), vocab - 1))
    keep = jnp.logical_or(jnp.cumsum(ascending, axis=-1) > one_minus_p, last).astype(jnp.int32)
    if scatter_back:
        if y.ndim != 2:
            raise ValueError(f"the scattered-back nucleus takes (B, V) logits, not {y.shape}")
        keep = jnp.zeros_like(ids).at[jnp.arange(y.shape[0])[:, None], ids].set(keep)
    else:
        keep = jnp.take_along_axis(keep, jnp.argsort(ids, axis=-1), axis=-1)
    return y * keep - MTJ_MASK * (1 - keep)


def top_p_prob_sorted_mask(logits: jax.Array, key: jax.Array, *, temperature: float, p: float,
                           categorical_fn: Categorical = jax.random.categorical, one_minus_p: float | None = None,
                           scatter_back: bool = False, **_: Any) -> jax.Array:
    """transformer_vq's `nucleus` (nn/prob.py) of y = x / T (`prob_sorted_top_p_scores`), then a categorical.
    Hugging Face's cut from below by sorted place, but sorted by probability, so that tokens whose probabilities
    round equal are ordered by id. The program's threshold is the constant 1 - p (transformer_vq's `1 - (p -
    1e-4)`), read as `one_minus_p`. (..., V) logits."""
    threshold = 1 - p if one_minus_p is None else one_minus_p
    return categorical_fn(key, prob_sorted_top_p_scores(_scale(logits, temperature), threshold, scatter_back),
                          axis=-1)


def top_k_exact_top_p_flax_mask(logits: jax.Array, key: jax.Array, *, temperature: float, k: int, p: float,
                                top_k_fn: TopK = jax.lax.top_k, **params: Any) -> jax.Array:
    """Flax generate()'s FlaxTopKLogitsWarper then FlaxTopPLogitsWarper (its Llama-3 config, with the default
    top-k 50): the exact top k scattered into -inf (`top_k_exact_mask`), then `top_p_flax_mask` of it."""
    return top_p_flax_mask(keep_exactly_top_k(logits, k, top_k_fn), key, temperature=temperature, p=p, **params)


def kth_of_descending_sort(logits: jax.Array, k: int) -> jax.Array:
    """EasyDeL's TopKLogitsWarper's threshold: column k - 1 of jnp.sort reversed (so NaN, any, first), as a (B, 1)
    column, read at a constant index; of one row (V,), that entry, 0-d."""
    if logits.ndim == 1:
        return jnp.sort(logits)[::-1][jnp.asarray(k - 1, jnp.int32)]
    return jnp.sort(logits, axis=-1)[:, ::-1][:, jnp.asarray(k - 1, jnp.int32)][:, None]


def keep_top_k(logits: jax.Array, k: int, fill: float | None = None) -> jax.Array:
    """EasyDeL's top-k filter: keep `x >= kth_of_descending_sort(x, k)` (ties of the k-th kept; a NaN logit never
    kept, and a row with k NaNs keeps nothing), -inf (or a writing's `fill`) elsewhere. (B, V) logits, or one row (V,)
    as a per-sequence sampler writes it (`jnp.sort(y, descending=True)[k - 1]`). (JAX engines'
    `x >= jnp.sort(x)[..., -k][..., None]` reads the same column after hlofuse-prepare.)"""
    if logits.ndim not in (1, 2):
        raise ValueError(f"EasyDeL's top-k warper takes (B, V) logits or one row (V,), not {logits.shape}")
    return jnp.where(logits >= kth_of_descending_sort(logits, k), logits, NEG_INF if fill is None else fill)


def kth_of_sort(logits: jax.Array, k: int) -> jax.Array:
    """`jnp.sort(x, axis=-1)[..., -k][..., None]`: the k-th largest as JAX code reads it from an ascending sort, every
    NaN counted among the largest (lax.top_k counts a -NaN among the smallest), as a (..., 1) column."""
    return jnp.sort(logits, axis=-1)[..., -k][..., None]


def sort_column(logits: jax.Array, k: int) -> tuple[jax.Array, None]:
    """A top_k_fn for `mask_top_k` (with `kth_fn=same_column`) that reads the k-th from an ascending sort as JAX code
    does (`kth_of_sort`), and no ids. minGPT's `where(x < jnp.sort(x)[..., -k][..., None], -inf, x)` is so top_k_mask:
    their k-th differs only in a row with a NaN (which the sort counts among the largest, and lax.top_k a -NaN among
    the smallest), which neither removes (`x < kth` is False) and every draw then gives the first NaN's id or draws
    from an all-NaN softmax alike."""
    return kth_of_sort(logits, k), None


def same_column(values: jax.Array) -> jax.Array:
    """A kth_fn for `mask_top_k` whose top_k_fn gave the column itself (`sort_column`)."""
    return values


def top_k_keep_mask(logits: jax.Array, key: jax.Array, *, temperature: float, k: int,
                    categorical_fn: Categorical = jax.random.categorical, fill: float | None = None,
                    **_: Any) -> jax.Array:
    """EasyDeL's TopKLogitsWarper (`keep_top_k`), then a categorical of / T."""
    return categorical_fn(key, _scale(keep_top_k(logits, k, fill), temperature), axis=-1)


def top_k_keep_top_p_flax_mask(logits: jax.Array, key: jax.Array, *, temperature: float, k: int, p: float,
                               **params: Any) -> jax.Array:
    """EasyDeL's TopKLogitsWarper then its TopPLogitsWarper (Flax's, `top_p_flax_mask`)."""
    return top_p_flax_mask(keep_top_k(logits, k), key, temperature=temperature, p=p, **params)


def top_k_keep_by_top_k_mask(logits: jax.Array, key: jax.Array, *, temperature: float, k: int,
                             top_k_fn: TopK = jax.lax.top_k, categorical_fn: Categorical = jax.random.categorical,
                             by_row: bool = False, **_: Any) -> jax.Array:
    """A top-k kept at or above lax.top_k's k-th value, as generic JAX samplers write it: y = x / T, then
    `where(y >= lax.top_k(y, k)[0][..., -1:], y, -inf)` (ties of the k-th kept, a NaN never), then the categorical of
    y. Not `top_k_keep_mask`: lax.top_k counts a -NaN among the smallest where a sort counts it among the largest, so
    a row with a -NaN keeps other tokens; and / T comes first. `by_row`: the k-th a scalar against one row (V,)
    (`lax.top_k(y, k)[0][-1]`, and vmap of that); else a (..., 1) column."""
    if by_row and logits.ndim != 1:  # (so that no template is made: a batch's is the column writing's)
        raise ValueError(f"the k-th as a scalar is one row's (V,), not of {logits.shape}")
    y = _scale(logits, temperature)
    values = top_k_fn(y, k)[0]
    kth = values[..., -1] if by_row else values[..., -1:]
    return categorical_fn(key, jnp.where(y >= kth, y, NEG_INF), axis=-1)


def min_p_sorted_removal(logits: jax.Array, key: jax.Array, *, temperature: float, min_p: float,
                         categorical_fn: Categorical = jax.random.categorical, **_: Any) -> jax.Array:
    """EasyDeL's MinPLogitsWarper: a full-width lax.top_k, the softmax of the sorted logits, remove ranks whose
    probability is below min_p times rank 0's (rank 0 never: min_tokens_to_keep = 1), scattered back to vocabulary
    order through a meshgrid of rows, -inf there, then a categorical of / T. (B, V) logits only."""
    if logits.ndim != 2:
        raise ValueError(f"EasyDeL's min-p warper takes (B, V) logits, not {logits.shape}")
    batch, vocab = logits.shape
    ordered, ids = jax.lax.top_k(logits, vocab)
    probs = jax.nn.softmax(ordered, axis=-1)
    remove = (probs < min_p * probs[:, 0:1]) & ~(jnp.arange(vocab) < 1)
    rows, _ = jnp.meshgrid(jnp.arange(batch), jnp.arange(vocab), indexing="ij")
    removed = jnp.zeros_like(logits, dtype=jnp.bool_).at[(rows, ids)].set(remove)
    return categorical_fn(key, _scale(jnp.where(removed, NEG_INF, logits), temperature), axis=-1)


Sort = Callable[[jax.Array], tuple[jax.Array, jax.Array]]


def sort_unstable(logits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`torch.sort(x)` as torchax lowers it: jnp.sort and jnp.argsort, both unstable (ascending; -0 and +0 equal,
    NaN last). Which of equal values comes first is the backend's."""
    return jnp.sort(logits, axis=-1, stable=False), jnp.argsort(logits, axis=-1, stable=False)


def sorted_top_p_removal(ordered: jax.Array, one_minus_p: float) -> jax.Array:
    """Hugging Face's top-p removal of ascending-sorted logits: `cumsum(softmax(ordered)) <= 1 - p`, but never the
    last (the largest; min_tokens_to_keep = 1)."""
    remove = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1) <= one_minus_p
    return remove.astype(jnp.int32).at[..., -1:].set(jnp.zeros((*remove.shape[:-1], 1), jnp.int32)) != 0


def top_p_removal(logits: jax.Array, one_minus_p: float, sort_fn: Sort = sort_unstable) -> tuple[jax.Array, ...]:
    """Hugging Face's TopPLogitsWarper as torchax lowers it: the logits sorted ascending, the softmax of the sorted
    logits and its cumsum, `remove = cumsum <= 1 - p` but for the largest (`[..., -1:] = 0`, min_tokens_to_keep
    = 1), scattered back to vocabulary order. Returns (removed in vocabulary order, sorted logits, removed in sorted
    order). (B, V) logits, or one row (V,) (litgpt's `sample_top_p`, the same removal of `logits[0, -1]`): other
    shapes raise ValueError, so no template is made for them."""
    if logits.ndim not in (1, 2):
        raise ValueError(f"the Hugging Face top-p warper takes (B, V) logits or one row, not {logits.shape}")
    ordered, ids = sort_fn(logits)
    remove = sorted_top_p_removal(ordered, one_minus_p)
    if logits.ndim == 1:
        return remove.at[ids].set(remove[0:remove.shape[0]]), ordered, remove
    batch, vocab = remove.shape
    rows = jnp.broadcast_to(jnp.arange(batch).reshape(batch, 1), (batch, vocab))
    return remove.at[(rows, ids)].set(remove[0:batch, 0:vocab]), ordered, remove


def top_p_ascending_mask(logits: jax.Array, key: jax.Array, *, temperature: float, p: float,
                         sort_fn: Sort = sort_unstable, categorical_fn: Categorical = jax.random.categorical,
                         one_minus_p: float | None = None, **_: Any) -> jax.Array:
    """Hugging Face's top-p (`top_p_removal`: the tokens whose ascending cumulative mass is at most 1 - p removed,
    the largest always kept) at -inf, then / T. The program's threshold is the constant 1 - p (`one_minus_p`, what
    the fusion reads); the attribute p is 1 - that, so that 1 - p gives it back exactly in f64."""
    threshold = 1 - p if one_minus_p is None else one_minus_p
    removed = top_p_removal(logits, threshold, sort_fn)[0]
    return categorical_fn(key, _scale(jnp.where(removed, NEG_INF, logits), temperature), axis=-1)


def top_p_ascending_count_mask(logits: jax.Array, key: jax.Array, *, temperature: float, p: float,
                               sort_fn: Callable[[jax.Array], jax.Array] = jnp.sort,
                               categorical_fn: Categorical = jax.random.categorical, **_: Any) -> jax.Array:
    """gemma 3.1.0's TopPSampling (rewritten in 3.2): y = x / T sorted ascending (jnp.sort, values only), the
    cumsum of their softmax, the cutoff index `sum((cumsum < p) < p)`: comparing the booleans with p counts the
    positions whose cumsum is not below p, so the cutoff is the sorted logit at that count (past the end,
    take_along_axis' NaN: nothing removed), and y below it is set to finfo.min, then a categorical. It removes
    that many of the smallest logits (with p = 0.9 usually one or two): the form is the program's function, not
    a nucleus. Only the sorted values are read, which any ascending sort gives alike (`sort_fn`: values only)."""
    y = _scale(logits, temperature)
    ordered = sort_fn(y)
    cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
    cutoff_index = jnp.sum((cumulative < p) < p, axis=-1, keepdims=True)
    cutoff = jnp.take_along_axis(ordered, cutoff_index, axis=-1)
    return categorical_fn(key, jnp.where(y < cutoff, jnp.finfo(y.dtype).min, y), axis=-1)


def sort_values_unstable(x: jax.Array) -> jax.Array:
    """`jax.lax.sort(x, is_stable=False)`: the values ascending along the last dim (NaN last). Equal values are equal
    bits but for -0 and +0, so any ascending sort of the values gives the same row to every op that reads it."""
    return jax.lax.sort(x, is_stable=False)


def haiku_top_p_kept(y: jax.Array, one_minus_p: float,
                     sort_fn: Callable[[jax.Array], jax.Array] = sort_values_unstable) -> jax.Array:
    """The nucleus of DeepMind's Haiku samplers (`nucleus_sample`) and of grok-1's `top_p_filter`, of y (..., V): the
    values sorted ascending (`sort_fn`), the cumsum of their softmax, the first place where it reaches 1 - p
    (`argmax(cumsum >= 1 - p)`: place 0 where none does, so every token stays), and y kept where it is at or above
    the value there. A cut by value from below: ties with the cut's value all stay, and no id order enters."""
    ordered = sort_fn(y)
    cut = jnp.argmax(jnp.cumsum(jax.nn.softmax(ordered), -1) >= one_minus_p, axis=-1)
    return y >= jnp.take_along_axis(ordered, cut[..., jnp.newaxis], axis=-1)


def top_p_haiku_mask(logits: jax.Array, key: jax.Array, *, temperature: float, p: float,
                     sort_fn: Callable[[jax.Array], jax.Array] = sort_values_unstable,
                     categorical_fn: Categorical = jax.random.categorical, one_minus_p: float | None = None,
                     fill: float | None = None, of_logits: bool = False, **_: Any) -> jax.Array:
    """Haiku's `nucleus_sample` and grok-1's `sample_token` at its top-p: y = x / T, the tokens outside its nucleus
    (`haiku_top_p_kept`) at -inf (their writings fill -1e10 or -1e30: FILL_NOTE), then a categorical. `of_logits`
    (perceiver-ar's `sample_position`): the nucleus of the logits themselves, then / T. The program's threshold is
    the constant 1 - p, read as `one_minus_p`. (..., V) logits; only the sorted values are read."""
    y = logits if of_logits else _scale(logits, temperature)
    kept = jnp.where(haiku_top_p_kept(y, 1 - p if one_minus_p is None else one_minus_p, sort_fn), y,
                     NEG_INF if fill is None else fill)
    return categorical_fn(key, _scale(kept, temperature) if of_logits else kept, axis=-1)


def top_p_haiku_rows(logits: jax.Array, key: jax.Array, *, temperature: float, p: jax.Array,
                     sort_fn: Callable[[jax.Array], jax.Array] = sort_values_unstable,
                     categorical_fn: Categorical = jax.random.categorical, fill: float | None = None,
                     **_: Any) -> jax.Array:
    """grok-1's `sample_token`: Haiku's nucleus (`haiku_top_p_kept`) of y = x / T with a p per row, (B,) with unit
    dims added up to the logits' rank and cast to their dtype (`jnp.expand_dims(nucleus_p, (1, 2))` of its (B, 1, V)
    logits, then `.astype(logits.dtype)`), the threshold 1 - p computed by the program; the dropped logits at -inf
    (grok fills -1e10: FILL_NOTE), then a categorical.
    (grok divides by its per-row T and masks its disallowed tokens before the nucleus: T = 1 here, `_unscaled`.)"""
    y = _scale(logits, temperature)
    one_minus_p = 1 - jnp.expand_dims(p, tuple(range(1, y.ndim))).astype(y.dtype)
    kept = jnp.where(haiku_top_p_kept(y, one_minus_p, sort_fn), y, NEG_INF if fill is None else fill)
    return categorical_fn(key, kept, axis=-1)


def argsort_descending_stable(x: jax.Array) -> jax.Array:
    """`jnp.argsort(x, axis=-1, descending=True)` (stable: equal values by the lower id first; -0 and +0 equal, NaN
    largest, as lax.sort compares)."""
    return jnp.argsort(x, axis=-1, descending=True)


def put_back_by_sort(order: jax.Array, values: jax.Array) -> jax.Array:
    """`lax.sort_key_val(order, values)[1]`: `values`, given in the places `order` (a permutation of each row's ids)
    lists, back in id order."""
    return jax.lax.sort_key_val(order, values, dimension=-1)[1]


def simply_top_p_keep(y: jax.Array, p: float,
                      argsort_fn: Callable[[jax.Array], jax.Array] = argsort_descending_stable,
                      put_back_fn: Callable[[jax.Array, jax.Array], jax.Array] = put_back_by_sort) -> jax.Array:
    """google-deepmind/simply's `top_p_mask` of y (..., V): softmax(y) in id order, taken along the stable descending
    argsort of y, its exclusive cumsum (`cumulative_sum(include_initial=True)[..., :-1]`) below p, put back in id
    order by `sort_key_val` of the argsort. The place of rank 0 always stays (its exclusive mass is 0)."""
    order = argsort_fn(y)
    mass = jnp.cumulative_sum(jnp.take_along_axis(jax.nn.softmax(y, axis=-1), order, axis=-1), axis=-1,
                              include_initial=True)
    return put_back_fn(order, mass[..., :-1] < p)


def top_p_simply_mask(logits: jax.Array, key: jax.Array, *, temperature: float, p: float,
                      categorical_fn: Categorical = jax.random.categorical, fill: float | None = None,
                      argsort_fn: Callable[[jax.Array], jax.Array] = argsort_descending_stable,
                      put_back_fn: Callable[[jax.Array, jax.Array], jax.Array] = put_back_by_sort,
                      keep_fn: Callable[[jax.Array, float], jax.Array] | None = None, **_: Any) -> jax.Array:
    """google-deepmind/simply's `sample_from_logits` with a top-p: y = x / T, `where(simply_top_p_keep(y), y, fill)`
    (simply's `-0.5 * finfo.max`: FILL_NOTE), then a categorical. `keep_fn(y, p)`: the same keep computed another way
    (a kernel's)."""
    y = _scale(logits, temperature)
    keep = simply_top_p_keep(y, p, argsort_fn, put_back_fn) if keep_fn is None else keep_fn(y, p)
    kept = jnp.where(keep, y, NEG_INF if fill is None else fill)
    return categorical_fn(key, kept, axis=-1)


def kept_ids_by_one_hot(ids: jax.Array, keep: jax.Array, vocab: int) -> jax.Array:
    """The (..., V) mask of the ids (..., k), each distinct, whose `keep` is set: `any(one_hot(ids, V) & keep,
    axis=-2)`, as simply writes it."""
    return jnp.any(jax.nn.one_hot(ids, vocab, dtype=jnp.bool_) & keep[..., None], axis=-2)


def simply_top_k_top_p_keep(y: jax.Array, k: int, p: float, top_k_fn: TopK = jax.lax.top_k,
                            mask_fn: Callable[[jax.Array, jax.Array, int], jax.Array] = kept_ids_by_one_hot
                            ) -> jax.Array:
    """google-deepmind/simply's `_fused_top_k_top_p_mask` of y (..., V): lax.top_k's k, the softmax of their values,
    its exclusive cumsum below p, and the ids of those kept as a mask (`mask_fn`)."""
    values, ids = top_k_fn(y, k)
    mass = jnp.cumulative_sum(jax.nn.softmax(values, axis=-1), axis=-1, include_initial=True)
    return mask_fn(ids, mass[..., :-1] < p, y.shape[-1])


def top_k_top_p_simply_mask(logits: jax.Array, key: jax.Array, *, temperature: float, k: int, p: float,
                            top_k_fn: TopK = jax.lax.top_k, categorical_fn: Categorical = jax.random.categorical,
                            fill: float | None = None,
                            mask_fn: Callable[[jax.Array, jax.Array, int], jax.Array] = kept_ids_by_one_hot,
                            **_: Any) -> jax.Array:
    """google-deepmind/simply's `sample_from_logits` with a top-k and a top-p: y = x / T,
    `where(simply_top_k_top_p_keep(y), y, fill)`, then a categorical."""
    y = _scale(logits, temperature)
    kept = jnp.where(simply_top_k_top_p_keep(y, k, p, top_k_fn, mask_fn), y, NEG_INF if fill is None else fill)
    return categorical_fn(key, kept, axis=-1)


def sort_descending_torch(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`torch.sort(x, descending=True)` as torchax lowers it: `sort_unstable`'s values and ids, each reversed (equal
    values in the reverse of the backend's ascending order; NaN first)."""
    ordered, ids = sort_unstable(x)
    return ordered[..., ::-1], ids[..., ::-1]


def shifted_top_p_removal(y: jax.Array, p: float, sort_fn: Sort = sort_descending_torch) -> jax.Array:
    """The classic top-p filter (Hugging Face's old `top_k_top_p_filtering`, which Megatron-LM's
    `modify_logits_for_top_p_filtering` keeps) as torchax lowers it: y sorted descending (`sort_fn`), the cumsum of
    the sorted softmax above p, shifted one place later (`filter_[:, 1:] = filter_[:, :-1].clone()`), the first
    place never removed (`filter_[..., 0] = 0`), scattered back to vocabulary order by the sorted ids
    (`filter_.scatter(1, sorted_indices, filter_)`). A place is removed where the mass strictly before it exceeds p:
    a cut by sorted place from the top. (B, V) y only (other shapes raise ValueError: no template is made)."""
    if y.ndim != 2:
        raise ValueError(f"the classic top-p filter takes (B, V) logits, not {y.shape}")
    ordered, ids = sort_fn(y)
    remove = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1) > p
    remove = remove.at[:, 1:].set(remove[:, :-1])
    remove = remove.astype(jnp.int32).at[..., 0].set(jnp.zeros(remove.shape[:-1], jnp.int32)) != 0
    batch, vocab = remove.shape
    rows = jnp.broadcast_to(jnp.arange(batch).reshape(batch, 1), (batch, vocab))
    return remove.at[(rows, ids)].set(remove[0:batch, 0:vocab])


def shifted_top_p_filtered(y: jax.Array, p: float, sort_fn: Sort = sort_descending_torch,
                           by_logits: bool = False) -> jax.Array:
    """y with the classic top-p filter's removed at -inf: `shifted_top_p_removal` scattered back and filled
    (Megatron's `masked_fill_`), or (`by_logits`, x-transformers' `top_p`) the sorted logits filled where the shifted
    removal (`F.pad(cumsum > p, (1, -1), value=False)`: a slice and a pad) says, then scattered back by the sorted
    ids (`sorted_logits.scatter(1, sorted_indices, sorted_logits)`). The two put the same values at the same places,
    but for which of a -0 and a +0 (equal to the sorts) lands where, which no draw tells apart. (B, V) y only."""
    if not by_logits:
        return jnp.where(shifted_top_p_removal(y, p, sort_fn), NEG_INF, y)
    if y.ndim != 2:
        raise ValueError(f"the classic top-p filter takes (B, V) logits, not {y.shape}")
    ordered, ids = sort_fn(y)
    remove = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1) > p
    remove = jnp.pad(remove[:, :-1], ((0, 0), (1, 0)), constant_values=False)
    ordered = jnp.where(remove, NEG_INF, ordered)
    batch, vocab = y.shape
    rows = jnp.broadcast_to(jnp.arange(batch).reshape(batch, 1), (batch, vocab))
    return ordered.at[(rows, ids)].set(ordered)


def top_p_shifted_mask(logits: jax.Array, key: jax.Array, *, temperature: float, p: float,
                       sort_fn: Sort = sort_descending_torch, categorical_fn: Categorical = jax.random.categorical,
                       by_logits: bool = False, **_: Any) -> jax.Array:
    """Megatron-LM's sampler (and every copy of Hugging Face's old `top_k_top_p_filtering` after a division by T):
    y = x / T, then the classic top-p filter of y (`shifted_top_p_filtered`), then a categorical of what is left
    (Megatron draws by torch.multinomial of its softmax: the form's `_choice`)."""
    return categorical_fn(key, shifted_top_p_filtered(_scale(logits, temperature), p, sort_fn, by_logits), axis=-1)


def sort_descending_by_flipped_argsort(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """JAX code's descending sort: `order = jnp.argsort(x)[..., ::-1]` (`jnp.flip` alike: a stable ascending argsort
    reversed, so equal values by the higher id first and NaN first) and the values taken along it,
    `take_along_axis(x, order)` (hlofuse-prepare reads that, and `jnp.sort(x)[..., ::-1]` beside the argsort, as the
    sort's own values)."""
    order = jnp.argsort(x, axis=-1)[..., ::-1]
    return jnp.take_along_axis(x, order, axis=-1), order


def sort_descending_by_argsort(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """JAX code's other descending sort: `order = jnp.argsort(x, descending=True)` (a stable sort of the reversed row,
    reversed: equal values by the lower id first, NaN first) and the values taken along it."""
    order = jnp.argsort(x, axis=-1, descending=True)
    return jnp.take_along_axis(x, order, axis=-1), order


# The classic cut as JAX code writes it, one form per order of ties (`top_p_flipped_mask`'s `sort_fn`).
JAX_CLASSIC_CUTS: dict[str, Sort] = {"top_p_flipped_mask": sort_descending_by_flipped_argsort,
                                     "top_p_descending_mask": sort_descending_by_argsort}
# The cut not shifted (`cumsum > p` removed as it is, the crossing token too), as some JAX code writes it: by the
# flipped argsort's order (`jnp.sort(y)[::-1]` beside `jnp.argsort(y)[::-1]`). Not the band's: its own lowering.
JAX_UNSHIFTED_CUTS: dict[str, Sort] = {"top_p_unshifted_mask": sort_descending_by_flipped_argsort}
# The same after a top-k (`_jax_classic_chain`): the form's name, and its cut and whether its top-k keeps (else masks).
JAX_CLASSIC_CHAINS: dict[str, tuple[str, bool]] = {f"top_k_{'keep_' * keep}{cut}": (cut, keep)
                                                   for cut in JAX_CLASSIC_CUTS for keep in (False, True)}
JAX_UNSHIFTED_CHAINS: dict[str, tuple[str, bool]] = {f"top_k_{'keep_' * keep}{cut}": (cut, keep)
                                                     for cut in JAX_UNSHIFTED_CUTS for keep in (False, True)}


def jax_cut(name: str, by_logits: bool = False) -> Callable[..., jax.Array]:
    """The function of the JAX cut `name` (of JAX_CLASSIC_CUTS or JAX_UNSHIFTED_CUTS), by the mask or `by_logits`."""
    shifted = name in JAX_CLASSIC_CUTS
    sort_fn = JAX_CLASSIC_CUTS[name] if shifted else JAX_UNSHIFTED_CUTS[name]
    return functools.partial(top_p_flipped_mask, sort_fn=sort_fn, shifted=shifted, by_logits=by_logits)


def put_back_by_inverse(order: jax.Array, values: jax.Array) -> jax.Array:
    """`take_along_axis(values, argsort(order))`: `values`, given in the places `order` lists, back in id order as
    JAX code writes it (hlofuse-prepare reads it as `put_back_by_sort`, the same entries in the same places)."""
    return jnp.take_along_axis(values, jnp.argsort(order, axis=-1), axis=-1)


def top_p_flipped_mask(logits: jax.Array, key: jax.Array, *, temperature: float, p: float,
                       categorical_fn: Categorical = jax.random.categorical, by_logits: bool = False,
                       fill: float | None = None, sort_fn: Sort = sort_descending_by_flipped_argsort,
                       shifted: bool = True,
                       put_back_fn: Callable[[jax.Array, jax.Array], jax.Array] = put_back_by_inverse,
                       **_: Any) -> jax.Array:
    """The classic top-p as JAX code writes it: y = x / T sorted descending by a flipped argsort
    (`sort_descending_by_flipped_argsort`; `top_p_descending_mask`: by `argsort(descending=True)`), the cumsum of
    the sorted softmax above p shifted one place later (`jnp.roll(remove, 1).at[..., 0].set(False)`; a concatenate of
    False or a pad, and the compare of the cumsum's slice, read the same after hlofuse-prepare), put back in id order
    by the argsort of the order (`put_back_by_inverse`) and filled (or, `by_logits`, the sorted logits filled, then
    put back), then a categorical. The removal of `shifted_top_p_removal` (a cut by sorted place from the top), with
    ties ordered as `sort_fn` orders them. (B, V) y, or one row (V,), as engines write it at batch 1. (A removal
    written `>= p` is this form at the float below p: hlofuse.ir.template_match's strictness step.) Not `shifted`
    (`top_p_unshifted_mask`): the removal as it is, so the token whose mass crosses p goes too, and a row whose top
    token alone is above p keeps nothing (its draw is then over the fill alone: id 0 at -inf)."""
    y = _scale(logits, temperature)
    if y.ndim not in (1, 2):
        raise ValueError(f"the classic top-p filter takes (B, V) or (V,) logits, not {y.shape}")
    ordered, order = sort_fn(y)
    remove = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1) > p
    if shifted:
        remove = jnp.roll(remove, 1, axis=-1).at[..., 0].set(False)
    dropped = NEG_INF if fill is None else fill
    if by_logits:
        kept = put_back_fn(order, jnp.where(remove, dropped, ordered))
    else:
        kept = jnp.where(put_back_fn(order, remove), dropped, y)
    return categorical_fn(key, kept, axis=-1)


# A top-k filter that a chain applies first, to y = x / T: (y, k, fill) -> y filtered, the dropped at `fill` (None:
# -inf). `mask_top_k`'s (ties of the k-th kept, a NaN never dropped; its k-th by lax.top_k or by a writing), or
# `keep_top_k` (EasyDeL's and JAX engines' `y >= jnp.sort(y)[..., -k]`: a NaN never kept).
TopKFilter = Callable[[jax.Array, int, float | None], jax.Array]


def masked_top_k(top_k_fn: TopK = jax.lax.top_k, kth_fn: Callable[[jax.Array], jax.Array] = last_column) -> TopKFilter:
    """`mask_top_k` as a chain's first filter, its k-th read by `kth_fn` of `top_k_fn`'s values."""
    return lambda y, k, fill: mask_top_k(y, k, top_k_fn, kth_fn, fill)


def top_k_first(cut: Callable[..., jax.Array], top_k_filter: TopKFilter) -> Callable[..., jax.Array]:
    """The chain of `top_k_filter` and then `cut` (a top-p form's function, which draws), both of y = x / T: the
    function of a top-k + top-p form whose top-k any of the top-k filters may be (Flax NNX samplers keep
    `y >= jnp.sort(y)[..., -k]` before their classic cut; MaxText-style code masks below lax.top_k's k-th)."""

    def fn(logits: jax.Array, key: jax.Array, *, temperature: float | None, k: int, p: float,
           fill: float | None = None, **params: Any) -> jax.Array:
        y = top_k_filter(_scale(logits, temperature), k, fill)
        return cut(y, key, temperature=None, p=p, fill=fill, **params)

    return fn


def top_k_top_p_shifted_mask(logits: jax.Array, key: jax.Array, *, temperature: float, k: int, p: float,
                             top_k_fn: TopK = top_k_resorted,
                             kth_fn: Callable[[jax.Array], jax.Array] = last_as_torch_indexes,
                             sort_fn: Sort = sort_descending_torch,
                             categorical_fn: Categorical = jax.random.categorical, **_: Any) -> jax.Array:
    """Hugging Face's old `top_k_top_p_filtering` with a top k and a top p, after a division by T, as torchax lowers
    it: y = x / T, the logits below the k-th largest at -inf (`logits < torch.topk(logits, k)[0][..., -1, None]`: ties
    of the k-th kept), then the classic top-p filter of what is left (`shifted_top_p_filtered`), then a categorical
    (torch.multinomial of its softmax: `_choice`)."""
    y = mask_top_k(_scale(logits, temperature), k, top_k_fn, kth_fn)
    return categorical_fn(key, shifted_top_p_filtered(y, p, sort_fn), axis=-1)


def top_p_shifted_logits_mask(logits: jax.Array, key: jax.Array, *, temperature: float, p: float,
                              sort_fn: Sort = sort_descending_torch,
                              categorical_fn: Categorical = jax.random.categorical, by_logits: bool = True,
                              **_: Any) -> jax.Array:
    """x-transformers' `generate` with its `top_p` filter: the classic top-p filter of the logits themselves
    (`shifted_top_p_filtered`, by default as x-transformers writes it), then a categorical of what is left / T
    (x-transformers draws by torch.multinomial of `softmax(filtered / T)`: the form's `_choice`)."""
    return categorical_fn(key, _scale(shifted_top_p_filtered(logits, p, sort_fn, by_logits), temperature), axis=-1)


def top_k_top_p_ascending_mask(logits: jax.Array, key: jax.Array, *, temperature: float, k: int, p: float,
                               top_k_fn: TopK = top_k_resorted,
                               kth_fn: Callable[[jax.Array], jax.Array] = last_as_torch_indexes,
                               sort_fn: Sort = sort_unstable, categorical_fn: Categorical = jax.random.categorical,
                               one_minus_p: float | None = None, **_: Any) -> jax.Array:
    """Hugging Face's TopKLogitsWarper then its TopPLogitsWarper, in generate()'s order (transformers 4.x adds
    top-k 50 to every sampling config, so Llama-3's and Qwen's configs are this), as torchax lowers them: the logits
    below the k-th largest at -inf (ties of the k-th kept), then `top_p_removal` of what is left, then / T."""
    masked = mask_top_k(logits, k, top_k_fn, kth_fn)
    removed = top_p_removal(masked, 1 - p if one_minus_p is None else one_minus_p, sort_fn)[0]
    return categorical_fn(key, _scale(jnp.where(removed, NEG_INF, masked), temperature), axis=-1)


def top_k_exact_top_p_ascending_mask(logits: jax.Array, key: jax.Array, *, temperature: float, k: int, p: float,
                                     top_k_fn: TopK = top_k_as_torch, sort_fn: Sort = sort_unstable,
                                     categorical_fn: Categorical = jax.random.categorical,
                                     one_minus_p: float | None = None, **_: Any) -> jax.Array:
    """litgpt's `sample` with a top k and a top p, as torchax lowers it: exactly torch.topk's k logits scattered into
    -inf (`keep_exactly_top_k`), then / T, then Hugging Face's top-p removal of that (`top_p_removal`, litgpt's
    `sample_top_p` is the same) at -inf. T sits between the two filters, as litgpt applies it."""
    y = _scale(keep_exactly_top_k(logits, k, top_k_fn), temperature)
    removed = top_p_removal(y, 1 - p if one_minus_p is None else one_minus_p, sort_fn)[0]
    return categorical_fn(key, jnp.where(removed, NEG_INF, y), axis=-1)


def descending(logits: jax.Array) -> jax.Array:
    """The row's values in descending order, as `jnp.sort(x)[..., ::-1]` (ties are equal values: any order)."""
    return jnp.sort(logits, axis=-1)[..., ::-1]


# What the count cutoff's program subtracts from each cumsum before comparing it with p (`top_p_count_cutoff_mask`).
COUNT_CUTOFF_EPS = 1e-8


def top_p_count_cutoff_mask(logits: jax.Array, key: jax.Array, *, temperature: float, p: float,
                            descending_fn: Callable[[jax.Array], jax.Array] = descending,
                            categorical_fn: Categorical = jax.random.categorical, by_row: bool = False,
                            **_: Any) -> jax.Array:
    """A top-p by a count of sorted probabilities, as generic JAX samplers write it (each stage under
    `lax.cond(flag, stage, identity)`): y = x / T, its softmax sorted descending (`jnp.sort(probs)[::-1]`, values
    only: `descending_fn`), `count = sum(cumsum - 1e-8 <= p)` places, the cutoff the sorted probability at that count
    (0 past the end: nothing removed), and y where `probs >= cutoff`, -inf elsewhere, then a categorical of y. A cut
    by value in probability space from the top: the token whose mass crosses p is kept, with every token of its
    probability (a NaN row keeps nothing). `by_row`: one row (V,) as the program writes it (`sorted[count]` under
    `where(count < V, ..., 0.0)`, and vmap of that); else a (..., 1) column of the count, taken along the row."""
    if by_row and logits.ndim != 1:  # (so that no template is made: a batch's is the column writing's)
        raise ValueError(f"the count cutoff of one row takes (V,) logits, not {logits.shape}")
    y = _scale(logits, temperature)
    probs = jax.nn.softmax(y, axis=-1)
    ordered = descending_fn(probs)
    count = jnp.sum((jnp.cumsum(ordered, axis=-1) - COUNT_CUTOFF_EPS) <= p, axis=-1, keepdims=not by_row)
    vocab = y.shape[-1]
    if by_row:
        cutoff = jnp.where(count < vocab, ordered[count], 0.0)
    else:
        cutoff = jnp.where(count < vocab, jnp.take_along_axis(ordered, jnp.minimum(count, vocab - 1), axis=-1), 0.0)
    return categorical_fn(key, jnp.where(probs >= cutoff, y, NEG_INF), axis=-1)


def _mask_top_p(logits: jax.Array, p: float, *, sort_by_top_k: bool = False, fill: float | None = None,
                descending_fn: Callable[[jax.Array], jax.Array] = descending) -> jax.Array:
    # A full-width lax.top_k (JetStream, MaxText) returns the values of the descending sort, bit for bit
    # (NaN first, then +inf, ..., +0 before -0, ..., -inf): the same cutoff.
    if sort_by_top_k:
        ordered = jax.lax.top_k(logits, logits.shape[-1])[0]
    else:
        ordered = descending_fn(logits)
    cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
    cutoff_index = jnp.sum(cumulative < p, axis=-1, keepdims=True)
    cutoff = jnp.take_along_axis(ordered, cutoff_index, axis=-1)
    return jnp.where(logits < cutoff, NEG_INF if fill is None else fill, logits)


def top_p_mask(logits: jax.Array, key: jax.Array, *, temperature: float, p: float,
               categorical_fn: Categorical = jax.random.categorical, fill: float | None = None,
               descending_fn: Callable[[jax.Array], jax.Array] = descending, **_: Any) -> jax.Array:
    """JetStream / MaxText nucleus: keep logits >= the first sorted logit whose cumulative mass reaches p. (A
    `fill` is a writing's: the dropped logits become that large negative number, not -inf; see FILL_NOTE.)"""
    masked = _mask_top_p(logits, p, fill=fill, descending_fn=descending_fn)
    return categorical_fn(key, _scale(masked, temperature), axis=-1)


def top_k_top_p_mask(logits: jax.Array, key: jax.Array, *, temperature: float, k: int, p: float,
                     top_k_fn: TopK = jax.lax.top_k, categorical_fn: Categorical = jax.random.categorical,
                     fill: float | None = None, descending_fn: Callable[[jax.Array], jax.Array] = descending,
                     **_: Any) -> jax.Array:
    """Top-k mask, then the nucleus mask over what is left (its fill a writing's, FILL_NOTE), then / T."""
    masked = _mask_top_p(mask_top_k(logits, k, top_k_fn), p, fill=fill, descending_fn=descending_fn)
    return categorical_fn(key, _scale(masked, temperature), axis=-1)


def top_p_mask_by_top_k(logits: jax.Array, key: jax.Array, *, temperature: float, p: float,
                        categorical_fn: Categorical = jax.random.categorical, fill: float | None = None,
                        **_: Any) -> jax.Array:
    """top_p_mask as JetStream / MaxText write it: the descending sort is a full-width lax.top_k."""
    masked = _mask_top_p(logits, p, sort_by_top_k=True, fill=fill)
    return categorical_fn(key, _scale(masked, temperature), axis=-1)


def top_k_top_p_mask_by_top_k(logits: jax.Array, key: jax.Array, *, temperature: float, k: int, p: float,
                              top_k_fn: TopK = jax.lax.top_k, categorical_fn: Categorical = jax.random.categorical,
                              fill: float | None = None, **_: Any) -> jax.Array:
    """top_k_top_p_mask with the nucleus's sort as a full-width lax.top_k."""
    masked = _mask_top_p(mask_top_k(logits, k, top_k_fn), p, sort_by_top_k=True, fill=fill)
    return categorical_fn(key, _scale(masked, temperature), axis=-1)


def min_p_masked(logits: jax.Array, *, temperature: float, min_p: float) -> jax.Array:
    """min_p's scaled logits with the dropped tokens at -inf: what its categorical draws from."""
    scaled = _scale(logits, temperature)
    probs = jax.nn.softmax(scaled, axis=-1)
    keep = probs >= min_p * jnp.max(probs, axis=-1, keepdims=True)
    return jnp.where(keep, scaled, NEG_INF)


def min_p(logits: jax.Array, key: jax.Array, *, temperature: float, min_p: float,
          categorical_fn: Categorical = jax.random.categorical, **_: Any) -> jax.Array:
    """Temperature first; keep tokens whose probability is at least min_p times the largest."""
    return categorical_fn(key, min_p_masked(logits, temperature=temperature, min_p=min_p), axis=-1)


def min_p_logits_mask(logits: jax.Array, key: jax.Array, *, temperature: float, min_p: float,
                      categorical_fn: Categorical = jax.random.categorical, **_: Any) -> jax.Array:
    """x-transformers' `min_p` filter, then / T: the min-p of the logits themselves (softmax(x), as at T = 1), each
    token whose probability is below min_p times the largest at -inf (`probs < limit`: a NaN stays), then the
    categorical of the filtered logits / T (its `generate` draws softmax(filtered / T))."""
    probs = jax.nn.softmax(logits, axis=-1)
    filtered = jnp.where(probs < min_p * jnp.max(probs, axis=-1, keepdims=True), NEG_INF, logits)
    return categorical_fn(key, _scale(filtered, temperature), axis=-1)


def min_p_log_mask(logits: jax.Array, key: jax.Array, *, temperature: float, min_p: float,
                   categorical_fn: Categorical = jax.random.categorical, log_min_p: float | None = None,
                   by_row: bool = False, **_: Any) -> jax.Array:
    """A min-p in logit space, as JAX serving pipelines write it: y = x / T, each token below the row's largest plus
    log(min_p) at -inf (`where(y >= max(y) + log(min_p), y, -inf)`: a NaN dropped), then the categorical of y. Not
    `min_p`: the same cut but for rounding, read from y and not from its softmax. log(min_p) by the program's own op
    on the constant (`jnp.log(min_p)`); with `log_min_p`, the constant the program holds (`math.log(min_p)` in
    Python: min_p_log_constant_mask, whose composite carries exp of it, from which f32(log) gives it back).
    `by_row`: the threshold a scalar, as a sampler of one row (V,) writes it (`max(y) + log(min_p)`, which vmap
    batches); else a (..., 1) column (`keepdims=True`)."""
    y = _scale(logits, temperature)
    offset = jnp.log(min_p) if log_min_p is None else log_min_p
    if by_row:  # (a scalar against one row, broadcast by jnp as the program's `y >= max(y) + c` is)
        threshold = jnp.max(y, axis=-1) + offset
        threshold = threshold[..., None] if y.ndim > 1 else threshold
    else:
        threshold = jnp.max(y, axis=-1, keepdims=True) + offset
    return categorical_fn(key, jnp.where(y >= threshold, y, NEG_INF), axis=-1)


def min_p_log_constant_mask(logits: jax.Array, key: jax.Array, *, temperature: float, min_p: float,
                            categorical_fn: Categorical = jax.random.categorical, log_min_p: float | None = None,
                            by_row: bool = False, **_: Any) -> jax.Array:
    """min_p_log_mask with log(min_p) a constant of the program (`max(y) + math.log(min_p)`): `log_min_p` as the
    template reads it, else log(min_p) in f64, which the program's f32 constant is rounded from."""
    offset = math.log(min_p) if log_min_p is None else log_min_p
    return min_p_log_mask(logits, key, temperature=temperature, min_p=min_p, categorical_fn=categorical_fn,
                          log_min_p=offset, by_row=by_row)


def power_of_2(x: jax.Array) -> jax.Array:
    """x ** 2.0 by a power op, as torch.pow(x, 2.0) lowers through torchax."""
    return jnp.power(x, 2.0)


def squared(x: jax.Array) -> jax.Array:
    """x ** 2 by a multiply (JAX's integer power)."""
    return x**2


def top_a_logits_mask(logits: jax.Array, key: jax.Array, *, temperature: float, min_p: float,
                      categorical_fn: Categorical = jax.random.categorical,
                      square_fn: Callable[[jax.Array], jax.Array] = power_of_2, **_: Any) -> jax.Array:
    """Top-a (x-transformers' `top_a`, RWKV's sampler), then / T: the probabilities of the logits themselves below
    min_p (the ratio a) times the square of the largest (`square_fn`: its writing) at -inf (`probs < limit`: a NaN
    stays), then the categorical of the filtered logits / T."""
    probs = jax.nn.softmax(logits, axis=-1)
    limit = square_fn(jnp.max(probs, axis=-1, keepdims=True)) * min_p
    return categorical_fn(key, _scale(jnp.where(probs < limit, NEG_INF, logits), temperature), axis=-1)


def _torch_top_1_ids(probs: jax.Array, top_k_fn: TopK = jax.lax.top_k) -> jax.Array:
    """`torch.topk(probs, 1).indices` as torchax lowers it."""
    return top_k_as_torch(probs, 1, top_k_fn)[1]


def min_p_removal(logits: jax.Array, key: jax.Array, *, temperature: float, min_p: float,
                  top_k_fn: TopK = jax.lax.top_k, categorical_fn: Categorical = jax.random.categorical,
                  **_: Any) -> jax.Array:
    """Hugging Face's MinPLogitsWarper as torchax lowers it: y = x / T (its TemperatureLogitsWarper first), remove
    where `softmax(y) < min_p * max(softmax(y))` (so a NaN probability is never removed, unlike `min_p`, which keeps
    `>=`), the top token kept by a scatter of False at torch.topk's id (min_tokens_to_keep = 1), removed at -inf, a
    categorical. (B, V) logits only: other shapes raise ValueError."""
    if logits.ndim != 2:
        raise ValueError(f"the Hugging Face min-p warper takes (B, V) logits, not {logits.shape}")
    y = _scale(logits, temperature)
    probs = jax.nn.softmax(y, axis=-1)
    remove = probs < min_p * jnp.max(probs, axis=-1, keepdims=True)
    ids = _torch_top_1_ids(probs, top_k_fn)
    rows = jnp.broadcast_to(jnp.arange(ids.shape[0]).reshape(ids.shape[0], 1), ids.shape)
    return categorical_fn(key, jnp.where(remove.at[(rows, ids)].set(False), NEG_INF, y), axis=-1)


def epsilon_removal(logits: jax.Array, key: jax.Array, *, temperature: float, epsilon: float,
                    top_1_fn: TopK = top_k_resorted, kth_fn: Callable[[jax.Array], jax.Array] = last_as_torch_indexes,
                    categorical_fn: Categorical = jax.random.categorical, **_: Any) -> jax.Array:
    """Hugging Face's EpsilonLogitsWarper as torchax lowers it: y = x / T, remove where `softmax(y) < epsilon` and y
    is below its largest (`torch.topk(y, 1)`'s value: min_tokens_to_keep = 1, so every tie of the max stays), at
    -inf, then a categorical (with `_choice`: torch.multinomial). (B, V) logits only."""
    if logits.ndim != 2:
        raise ValueError(f"the Hugging Face epsilon warper takes (B, V) logits, not {logits.shape}")
    y = _scale(logits, temperature)
    remove = (jax.nn.softmax(y, axis=-1) < epsilon) & (y < kth_fn(top_1_fn(y, 1)[0]))
    return categorical_fn(key, jnp.where(remove, NEG_INF, y), axis=-1)


def top_k_epsilon_removal(logits: jax.Array, key: jax.Array, *, temperature: float, k: int, epsilon: float,
                          top_k_fn: TopK = top_k_resorted,
                          kth_fn: Callable[[jax.Array], jax.Array] = last_as_torch_indexes,
                          **params: Any) -> jax.Array:
    """transformers 4.x's epsilon config: TopKLogitsWarper (its default 50), then epsilon_removal of what is left."""
    masked = mask_top_k(logits, k, top_k_fn, kth_fn)
    return epsilon_removal(masked, key, temperature=temperature, epsilon=epsilon, top_1_fn=top_k_fn, kth_fn=kth_fn,
                           **params)


def typical_removal(y: jax.Array, mass: float, sort_fn: Sort = sort_unstable) -> tuple[jax.Array, ...]:
    """Hugging Face's TypicalLogitsWarper's removal as torchax lowers it: the entropy H of softmax(y) (a nansum of
    log q * q), the scores |-log q - H| sorted ascending (an unstable sort and argsort), the cumsum of the softmax of
    y in that order, `last = min(sum(cumsum < mass), V - 1)`, remove the scores above the score at `last`, but never
    the first (min_tokens_to_keep = 1), scattered back to vocabulary order. Returns (removed in vocabulary order,
    the sorted scores, y in their order, removed in their order). (B, V) logits only."""
    if y.ndim != 2:
        raise ValueError(f"the Hugging Face typical warper takes (B, V) logits, not {y.shape}")
    batch, vocab = y.shape
    normalized = jax.nn.log_softmax(y, axis=-1)
    product = normalized * jnp.exp(normalized)
    # torch's negations are products with -1, and its subtraction a - b * alpha (alpha = 1)
    entropy = -1.0 * jnp.sum(jnp.where(jnp.isnan(product), 0, product), axis=-1, keepdims=True)
    ordered, order = sort_fn(jnp.abs(-1.0 * normalized - entropy * 1.0))
    rows = jnp.broadcast_to(jnp.arange(batch).reshape(batch, 1), (batch, vocab))
    in_order = y[(rows, order)]
    cumulative = jnp.cumsum(jax.nn.softmax(in_order, axis=-1), axis=1)
    last = jnp.clip(jnp.sum(cumulative < mass, axis=1), max=vocab - 1).reshape(-1, 1)
    remove = ordered > ordered[(jnp.broadcast_to(jnp.arange(batch).reshape(batch, 1), last.shape), last)]
    remove = remove.astype(jnp.int32).at[..., :1].set(jnp.zeros((batch, 1), jnp.int32)) != 0
    return remove.at[(rows, order)].set(remove[0:batch, 0:vocab]), ordered, in_order, cumulative


def typical_mask(logits: jax.Array, key: jax.Array, *, temperature: float, p: float, sort_fn: Sort = sort_unstable,
                 categorical_fn: Categorical = jax.random.categorical, **_: Any) -> jax.Array:
    """Hugging Face's typical sampling (`typical_p`, TypicalLogitsWarper: p is its mass): y = x / T, the tokens of
    `typical_removal` at -inf, then a categorical (with `_choice`: torch.multinomial). (B, V) logits only."""
    y = _scale(logits, temperature)
    return categorical_fn(key, jnp.where(typical_removal(y, p, sort_fn)[0], NEG_INF, y), axis=-1)


def top_k_typical_mask(logits: jax.Array, key: jax.Array, *, temperature: float, k: int, p: float,
                       top_k_fn: TopK = top_k_resorted,
                       kth_fn: Callable[[jax.Array], jax.Array] = last_as_torch_indexes, **params: Any) -> jax.Array:
    """transformers 4.x's typical config: TopKLogitsWarper (its default 50), then typical_mask of what is left."""
    return typical_mask(mask_top_k(logits, k, top_k_fn, kth_fn), key, temperature=temperature, p=p, **params)


def _keep_sorted_first(remove: jax.Array, order: jax.Array) -> jax.Array:
    """transformers 4.x's min_tokens_to_keep = 1: `remove` gathered into `order`, its first set False, scattered
    back (`sorted_remove.scatter(1, order, sorted_remove)`)."""
    batch, vocab = remove.shape
    rows = jnp.broadcast_to(jnp.arange(batch).reshape(batch, 1), (batch, vocab))
    ordered = remove[(rows, order)]  # torch.gather as torchax indexes it
    ordered = ordered.at[..., :1].set(jnp.zeros((batch, 1), jnp.bool_))
    return ordered.at[(rows, order)].set(ordered[0:batch, 0:vocab])


def min_p_removal_by_argsort(logits: jax.Array, key: jax.Array, *, temperature: float, min_p: float,
                             categorical_fn: Categorical = jax.random.categorical, **_: Any) -> jax.Array:
    """min_p_removal as transformers 4.x writes it: the top token kept through a descending argsort of the scores,
    gathered, cleared at rank 0 and scattered back. The same ids: the kept token's probability is the max, which
    `< min_p * max` never removes for min_p <= 1 (so which of tied maxima the unstable argsort puts first, and the
    whole keep, change nothing)."""
    if logits.ndim != 2:
        raise ValueError(f"the Hugging Face min-p warper takes (B, V) logits, not {logits.shape}")
    y = _scale(logits, temperature)
    probs = jax.nn.softmax(y, axis=-1)
    remove = probs < min_p * jnp.max(probs, axis=-1, keepdims=True)
    order = jnp.argsort(y, axis=-1, stable=False)[..., ::-1]
    return categorical_fn(key, jnp.where(_keep_sorted_first(remove, order), NEG_INF, y), axis=-1)


def top_k_min_p_removal(logits: jax.Array, key: jax.Array, *, temperature: float, k: int, min_p: float,
                        top_k_fn: TopK = top_k_resorted,
                        kth_fn: Callable[[jax.Array], jax.Array] = last_as_torch_indexes,
                        min_p_fn: Callable[..., jax.Array] = min_p_removal, min_p_top_k_fn: TopK = jax.lax.top_k,
                        **params: Any) -> jax.Array:
    """Hugging Face's TopKLogitsWarper then MinPLogitsWarper (transformers 4.x's default top-k 50 with a min_p):
    the top-k mask (-inf below the k-th largest), then min_p_removal of what is left (`min_p_fn`: a writing's,
    `min_p_top_k_fn` its top-1's top-k)."""
    masked = mask_top_k(logits, k, top_k_fn, kth_fn)
    return min_p_fn(masked, key, temperature=temperature, min_p=min_p, top_k_fn=min_p_top_k_fn, **params)


def top_p_removed(logits: jax.Array, *, temperature: float | None, p: float, k: int = 0,
                  top_k_fn: TopK = top_k_resorted, kth_fn: Callable[[jax.Array], jax.Array] = last_as_torch_indexes,
                  sort_fn: Sort = sort_unstable, one_minus_p: float | None = None) -> tuple[jax.Array, ...]:
    """The head of generate()'s chains with a warper after the top-p: y = x / T, [the top-k mask of y (k > 0)], then
    `top_p_removal` of that. Returns (y with the removed at -inf, the sorted logits, removed in sorted order)."""
    y = _scale(logits, temperature)
    if k:
        y = mask_top_k(y, k, top_k_fn, kth_fn)
    removed, ordered, remove = top_p_removal(y, 1 - p if one_minus_p is None else one_minus_p, sort_fn)
    return jnp.where(removed, NEG_INF, y), ordered, remove


def top_p_then_removal(logits: jax.Array, key: jax.Array, *, temperature: float, p: float, k: int = 0,
                       then: str, top_k_fn: TopK = top_k_resorted,
                       kth_fn: Callable[[jax.Array], jax.Array] = last_as_torch_indexes, sort_fn: Sort = sort_unstable,
                       one_minus_p: float | None = None, **params: Any) -> jax.Array:
    """Hugging Face's generate() chain of TemperatureLogitsWarper, [TopKLogitsWarper,] TopPLogitsWarper and then the
    warper `then` (its order: MinPLogitsWarper or EpsilonLogitsWarper) as torchax lowers it: `top_p_removed`, then
    the form `then` of what is left, at T = 1 (its softmax that of the nucleus). (B, V) logits only."""
    kept = top_p_removed(logits, temperature=temperature, p=p, k=k, top_k_fn=top_k_fn, kth_fn=kth_fn,
                         sort_fn=sort_fn, one_minus_p=one_minus_p)[0]
    return FORMS[then].fn(kept, key, temperature=None, **params)


def _of_fewer_than_all(fn: Callable[..., jax.Array], logits: jax.Array, key: jax.Array, *, k: int,
                       **params: Any) -> jax.Array:
    """`fn` with a top k of fewer than all V (ValueError otherwise, so that no template is made: the top k of
    every token is the whole-row form)."""
    if not 0 < k < logits.shape[-1]:
        raise ValueError(f"a top-k + top-p nucleus takes 0 < k < V, not k = {k} of {logits.shape[-1]}")
    return fn(logits, key, k=k, **params)


@dataclass(frozen=True)
class Writing:
    """Another program for a form's function that computes its token ids bit for bit: the fusion pass
    matches it too, and the composite still means the form's own function."""

    fn: Callable[..., jax.Array]
    marker_ops: tuple[str, ...] = ()
    # Size-1 dims after the vocabulary in the array the draw reduces: 1 for keras' categorical, which draws over
    # (..., V, 1) along the vocabulary. A draw is matched only against writings with its own count.
    unit_dims: int = 0
    own_take: bool = False  # maps the drawn rank back to its id its own way (not take_along_axis)
    scaled_before: bool = False  # the program applied the temperature before the sampler (`_unscaled`)
    # Constants the writing reads that the composite does not carry (its meaning is the form's without them): a
    # fill for the dropped logits (FILL_NOTE). The fusion checks each (`fuse_sampling.WRITING_LIMITS`).
    reads: tuple[str, ...] = ()
    # The logits' dtypes ("f32", "bf16", ...) for which it computes the form's ids bit for bit (() for every one): a
    # writing that rounds otherwise in another dtype (torchax's f32 noise set into bf16 probabilities) is not tried.
    dtypes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Form:
    """One way samplers are written: its mode, the parameters it reads, and its function."""

    name: str
    mode: str
    fn: Callable[..., jax.Array]
    params: tuple[str, ...] = ()  # of temperature, k, p, min_p, eps
    marker_ops: tuple[str, ...] = ()  # ops a program must contain for the form to be worth lowering
    others: tuple[Writing, ...] = ()  # other writings of fn, as libraries vary it
    draw: str = "argmax"  # the op that draws: "argmax", "top_k" (k = 1, as jax.random.choice draws without
    # replacement) or "inverse_cdf" (a uniform searched in a cumsum, as it draws with replacement)
    base: str = ""  # the form whose filters this one has, with another draw ("" = its own)
    composes_draws: bool = True  # whether DRAWS compose with it (not for a form that draws from a log of its own)
    reads: tuple[str, ...] = ()  # constants its own writing reads that no attribute is (Writing.reads)
    row_keys: bool = False  # its key is one per row, (B, 2) (ROW_KEY_DRAWS), not one (2,) key
    # Parameters given per row, as (B,) operands after the key in this order (a serving engine's per-request
    # temperature, k, p, min-p; `row_dtype`), not as attributes: the composite's operands are (logits, key, *rows).
    row_params: tuple[str, ...] = ()
    row_columns: tuple[str, ...] = ()  # the per-row parameters the program holds as (B, 1) columns, not (B,)
    # The form this one is with a normalization of the logits in front (PRELUDES), "" for none. Such a form has no
    # template of its own: the fusion finds the normalization in front of a site of `prelude_of`.
    prelude_of: str = ""
    # The logits' dtypes it is formed for (() for every one): a form whose program's ids hang on how XLA rounds
    # (EXCESS_PRECISION_NOTE) is formed for f32 logits only.
    dtypes: tuple[str, ...] = ()

    def row_dtype(self, name: str) -> Any:  # noqa: ANN401
        """The dtype of a per-row operand: int32 for k, float32 for the others."""
        return jnp.int32 if name == "k" else jnp.float32

    def row_shape(self, name: str, batch: int) -> tuple[int, ...]:
        """The shape of a per-row operand: (B,), or (B, 1) for one of `row_columns`."""
        return (batch, 1) if name in self.row_columns else (batch,)

    @property
    def drawn_by(self) -> str:
        """The draw of DRAWS this form is its base's with ("" for a form's own draw)."""
        if self.prelude_of:
            return FORMS[self.prelude_of].drawn_by
        return self.name[len(self.base) + 1:] if self.base else ""

    @property
    def filters(self) -> str:
        """The form whose filters (and their order) this form has: its base, or itself."""
        if self.prelude_of:
            return FORMS[self.prelude_of].filters
        return self.base or self.name

    @property
    def writings(self) -> tuple[Writing, ...]:
        """Every program the fusion matches for this form: its own function first."""
        return (Writing(self.fn, self.marker_ops, reads=self.reads), *self.others)

    @property
    def stochastic(self) -> bool:
        return self.mode != "greedy"


_NOISE: tuple[str, ...] = ()  # threefry lowers per platform (a while loop on the CPU only): no marker
def _by_argsort(fn: Callable[..., jax.Array], markers: tuple[str, ...]) -> Writing:
    """`fn` with its top-k taken by top_k_by_argsort: the sort replaces lax.top_k among the markers."""
    markers = tuple(op for op in markers if op != "chlo.top_k")
    markers += ("stablehlo.sort",) * ("stablehlo.sort" not in markers)
    return Writing(functools.partial(fn, top_k_fn=top_k_by_argsort), markers)


def _unscaled(writing: Writing) -> Writing:
    """`writing` without a temperature of its own: the program scaled its logits before the sampler (gemma's top-p,
    Hugging Face's TemperatureLogitsWarper first), so the site reads T = 1, and the form's x / 1.0 is x bit for bit.
    The scaling stays in XLA, an elementwise op in front of the composite."""

    def fn(logits: jax.Array, key: jax.Array, *, temperature: float | None = None, **params: Any) -> jax.Array:
        del temperature
        return writing.fn(logits, key, temperature=None, **params)

    return dataclasses.replace(writing, fn=fn, scaled_before=True)


# Libraries fill the dropped logits with a large negative number, not -inf: gemma finfo.min, MaxText -1e7,
# EasyDeL -1e10, tpu-inference -1e12. The ids are those of -inf when the fill F is at most FILL_BOUND: a dropped
# token scores F / T + gumbel, the noise within [-4.5, 16.7], below every kept token's y + gumbel, y >= the
# cutoff / T, where the cutoff is a logit of the row; the exception is a row whose cutoff / T lies within 21.2 of
# F / T, that is logits within about 1e6 of F, which no model writes. A writing that reads its fill (a sentinel in
# the template, `Writing.reads`) is matched only for F <= FILL_BOUND; the composite means the -inf form.
FILL_BOUND = -1.0e6
FILL_NOTE = "a fill F <= -1e6 for the dropped logits: the ids of -inf but for logits / T within 21.2 of F / T"


def _by_resorted_top_k(fn: Callable[..., jax.Array], markers: tuple[str, ...],
                       kth_fn: Callable[[jax.Array], jax.Array] = last_as_torch_indexes) -> Writing:
    """`fn` with its k-th value read from top_k_resorted as torch code indexes it (`kth_fn`: Hugging Face's
    TopKLogitsWarper, or nanoGPT's `v[:, [-1]]`), through torchax."""
    return Writing(functools.partial(fn, top_k_fn=top_k_resorted, kth_fn=kth_fn), markers + ("stablehlo.sort",))


def _by_batch_index(fn: Callable[..., jax.Array], markers: tuple[str, ...]) -> Writing:
    """`fn` with the drawn rank mapped back to its id by take_by_batch_index (gemma's TopkSampling)."""
    return Writing(functools.partial(fn, take_fn=take_by_batch_index), markers, own_take=True)


def _with_fills(form: Form) -> Form:
    """`form` with each of its writings also filling the dropped logits with the program's own large negative
    number (FILL_NOTE)."""
    return dataclasses.replace(form, others=form.others + tuple(dataclasses.replace(w, reads=(*w.reads, "fill"))
                                                                for w in form.writings))


def _by_batch_index_of(writing: Writing) -> Writing:
    """`writing` with the drawn rank mapped back by take_by_batch_index (an argsort top-k, gathered as gemma does)."""
    return dataclasses.replace(writing, fn=functools.partial(writing.fn, take_fn=take_by_batch_index), own_take=True)


def _rank_space_writings(fn: Callable[..., jax.Array], markers: tuple[str, ...]) -> tuple[Writing, ...]:
    """The other writings of a top-k drawn in rank space (`fn` takes top_k_fn and take_fn): its top-k by a stable
    descending argsort, its drawn rank mapped back by batch index, and both; and mapped back by torch.gather through
    torchax (`v, ix = torch.topk(y, k)`, torch.multinomial of softmax(v), `torch.gather(ix, -1, idx)`)."""
    by_argsort = _by_argsort(fn, markers)
    by_torch = Writing(functools.partial(fn, top_k_fn=top_k_as_torch, take_fn=take_by_torch_gather), markers,
                       own_take=True)
    return by_argsort, _by_batch_index(fn, markers), _by_batch_index_of(by_argsort), by_torch


_TOP_K = _NOISE + ("chlo.top_k",)


def _jax_cut_markers(name: str) -> tuple[str, ...]:
    """The ops a JAX cut's program holds: its sort, and the shift's pad (after hlofuse-prepare) where it shifts."""
    return _NOISE + ("stablehlo.sort",) + ("stablehlo.pad",) * (name in JAX_CLASSIC_CUTS)


def _jax_classic_chain(name: str, cut: str, keep: bool) -> Form:
    """A top-k and then the JAX cut `cut` (of JAX_CLASSIC_CUTS or JAX_UNSHIFTED_CUTS; its writing by the mask or by
    the sorted logits), of y = x / T: `top_k_<cut>` masks y below the k-th (lax.top_k's last value, a stable
    descending argsort's or `jnp.sort(y)[..., -k]`, the same ids: `sort_column`), `top_k_keep_<cut>` keeps y at or
    above the sort's k-th (a NaN never kept). Each with the program's fill (FILL_NOTE); 0 < k < V."""
    if keep:
        filters = [(keep_top_k, _NOISE + ("stablehlo.sort",))]
    else:
        filters = [(masked_top_k(), _TOP_K), (masked_top_k(top_k_by_argsort), _NOISE + ("stablehlo.sort",)),
                   (masked_top_k(sort_column, same_column), _NOISE + ("stablehlo.sort",))]
    writings = [Writing(functools.partial(_of_fewer_than_all, top_k_first(jax_cut(cut, by_logits), top_k_filter)),
                        tuple(dict.fromkeys(markers + _jax_cut_markers(cut))))
                for top_k_filter, markers in filters for by_logits in (False, True)]
    first, *others = writings
    return _with_fills(Form(name, "top_k+top_p", first.fn, ("temperature", "k", "p"), first.marker_ops,
                            tuple(others)))


FORMS: dict[str, Form] = {f.name: f for f in (
    Form("greedy", "greedy", greedy),
    Form("greedy_softmax", "greedy", greedy_softmax, marker_ops=("stablehlo.exponential",),
         others=(Writing(functools.partial(greedy_softmax, argmax_fn=keras_argmax), ("stablehlo.exponential",)),)),
    Form("categorical", "temperature", categorical, marker_ops=_NOISE),
    Form("temperature", "temperature", temperature, ("temperature",), _NOISE),
    Form("top_k", "top_k", top_k, ("temperature", "k"), _TOP_K, _rank_space_writings(top_k, _TOP_K)),
    Form("temperature_top_k", "top_k", temperature_top_k, ("temperature", "k"), _TOP_K,
         _rank_space_writings(temperature_top_k, _TOP_K)),
    _with_fills(Form("top_k_mask", "top_k", top_k_mask, ("temperature", "k"), _TOP_K,
                     (_by_argsort(top_k_mask, _TOP_K), _by_resorted_top_k(top_k_mask, _TOP_K),
                      _by_resorted_top_k(top_k_mask, _TOP_K, last_as_torch_list_index),
                      Writing(functools.partial(top_k_mask, top_k_fn=sort_column, kth_fn=same_column),
                              _NOISE + ("stablehlo.sort",))))),
    _with_fills(Form("top_p_mask", "top_p", top_p_mask, ("temperature", "p"), _NOISE + ("stablehlo.sort",),
                     (Writing(top_p_mask_by_top_k, _TOP_K),))),
    _with_fills(Form("top_k_top_p_mask", "top_k+top_p", top_k_top_p_mask, ("temperature", "k", "p"),
                     _TOP_K + ("stablehlo.sort",),
                     (Writing(top_k_top_p_mask_by_top_k, _TOP_K),
                      _by_argsort(top_k_top_p_mask, _TOP_K + ("stablehlo.sort",)),
                      _by_argsort(top_k_top_p_mask_by_top_k, _TOP_K)))),
    Form("min_p", "min_p", min_p, ("temperature", "min_p"), _NOISE + ("stablehlo.exponential",)),
    Form("min_p_logits_mask", "min_p", min_p_logits_mask, ("temperature", "min_p"),
         _NOISE + ("stablehlo.exponential",)),
    # (lax.top_k's k-th as a column of a batch, or a scalar against one row)
    Form("top_k_keep_by_top_k_mask", "top_k", top_k_keep_by_top_k_mask, ("temperature", "k"), _TOP_K,
         (Writing(functools.partial(top_k_keep_by_top_k_mask, by_row=True), _TOP_K),)),
    # (a min-p in logit space: log(min_p) by the program's log op, or a constant it holds; f32 only, as the
    # threshold max(y) + log(min_p) of bf16 logits rounds as XLA fuses it)
    Form("min_p_log_mask", "min_p", min_p_log_mask, ("temperature", "min_p"), _NOISE + ("stablehlo.log",),
         (Writing(functools.partial(min_p_log_mask, by_row=True), _NOISE + ("stablehlo.log",)),), dtypes=("f32",)),
    Form("min_p_log_constant_mask", "min_p", min_p_log_constant_mask, ("temperature", "min_p"),
         _NOISE + ("stablehlo.select",),
         (Writing(functools.partial(min_p_log_constant_mask, by_row=True), _NOISE + ("stablehlo.select",),
                  reads=("log_min_p",)),), reads=("log_min_p",), dtypes=("f32",)),
    # (the square by torch.pow through torchax, or by JAX's `** 2`)
    Form("top_a_logits_mask", "min_p", top_a_logits_mask, ("temperature", "min_p"),
         _NOISE + ("stablehlo.exponential", "stablehlo.power"),
         (Writing(functools.partial(top_a_logits_mask, square_fn=squared), _NOISE + ("stablehlo.exponential",)),)),
    Form("top_k_exact_mask", "top_k", top_k_exact_mask, ("temperature", "k"), _TOP_K + ("stablehlo.scatter",),
         (Writing(functools.partial(top_k_exact_mask, top_k_fn=top_k_as_torch),
                  _TOP_K + ("stablehlo.scatter", "stablehlo.sort")),
          Writing(functools.partial(top_k_exact_mask, top_k_fn=top_k_as_torch, by_rows=True),
                  _TOP_K + ("stablehlo.scatter", "stablehlo.sort")),
          # (simply's: the kept ids as a one-hot mask, its fill -0.5 * finfo.max)
          Writing(functools.partial(top_k_exact_mask, by_one_hot=True), _TOP_K, reads=("fill",)))),
    # google-deepmind/simply's nuclei: its fill -0.5 * finfo.max
    _with_fills(Form("top_p_simply_mask", "top_p", top_p_simply_mask, ("temperature", "p"),
                     _NOISE + ("stablehlo.sort", "stablehlo.reduce_window"), composes_draws=False)),
    _with_fills(Form("top_k_top_p_simply_mask", "top_k+top_p", top_k_top_p_simply_mask, ("temperature", "k", "p"),
                     _TOP_K + ("stablehlo.reduce_window",), composes_draws=False)),
    Form("top_p_flax_mask", "top_p", top_p_flax_mask, ("temperature", "p"), _TOP_K + ("stablehlo.sort",),
         composes_draws=False),
    Form("top_p_mtj_mask", "top_p", top_p_mtj_mask, ("temperature", "p"), _NOISE + ("stablehlo.sort",),
         composes_draws=False),
    Form("top_p_levanter_mask", "top_p", top_p_levanter_mask, ("temperature", "p"), _NOISE + ("stablehlo.sort",),
         composes_draws=False),
    # transformer_vq's nucleus writes its threshold 1 - (p - 1e-4) as one constant: it reads `one_minus_p`.
    Form("top_p_prob_sorted_mask", "top_p", top_p_prob_sorted_mask, ("temperature", "p"), _NOISE + ("stablehlo.sort",),
         (Writing(functools.partial(top_p_prob_sorted_mask, scatter_back=True),
                  _NOISE + ("stablehlo.sort", "stablehlo.scatter"), reads=("one_minus_p",)),),
         composes_draws=False, reads=("one_minus_p",)),
    # the classic top-p, of x / T and of the logits (each also written the other library's way)
    Form("top_p_shifted_mask", "top_p", top_p_shifted_mask, ("temperature", "p"),
         _NOISE + ("stablehlo.sort", "stablehlo.scatter"),
         (Writing(functools.partial(top_p_shifted_mask, by_logits=True),
                  _NOISE + ("stablehlo.sort", "stablehlo.pad")),)),
    # (and as JAX code writes it: a flipped argsort, the mask or the sorted logits put back by the order's argsort)
    # (and not shifted; each also after a top-k: one form per top-k filter and order of ties, `_jax_classic_chain`)
    *(_with_fills(Form(name, "top_p", jax_cut(name), ("temperature", "p"), _jax_cut_markers(name),
                       (Writing(jax_cut(name, by_logits=True), _jax_cut_markers(name)),)))
      for name in (*JAX_CLASSIC_CUTS, *JAX_UNSHIFTED_CUTS)),
    *(_jax_classic_chain(name, cut, keep)
      for name, (cut, keep) in (*JAX_CLASSIC_CHAINS.items(), *JAX_UNSHIFTED_CHAINS.items())),
    # (its top-k mask as torchax lowers torch.topk's k-th, or as JAX code writes it: lax.top_k's last column, or a
    # stable descending argsort)
    Form("top_k_top_p_shifted_mask", "top_k+top_p", functools.partial(_of_fewer_than_all, top_k_top_p_shifted_mask),
         ("temperature", "k", "p"), _TOP_K + ("stablehlo.sort", "stablehlo.scatter"),
         (Writing(functools.partial(_of_fewer_than_all, top_k_top_p_shifted_mask, top_k_fn=jax.lax.top_k,
                                    kth_fn=last_column), _TOP_K + ("stablehlo.sort", "stablehlo.scatter")),
          Writing(functools.partial(_of_fewer_than_all, top_k_top_p_shifted_mask, top_k_fn=top_k_by_argsort,
                                    kth_fn=last_column), ("stablehlo.sort", "stablehlo.scatter")))),
    Form("top_p_shifted_logits_mask", "top_p", top_p_shifted_logits_mask, ("temperature", "p"),
         _NOISE + ("stablehlo.sort", "stablehlo.pad"),
         (Writing(functools.partial(top_p_shifted_logits_mask, by_logits=False),
                  _NOISE + ("stablehlo.sort", "stablehlo.scatter")),)),
    _with_fills(Form("top_k_keep_mask", "top_k", top_k_keep_mask, ("temperature", "k"), _NOISE + ("stablehlo.sort",))),
    Form("min_p_sorted_removal", "min_p", min_p_sorted_removal, ("temperature", "min_p"),
         _TOP_K + ("stablehlo.exponential", "stablehlo.scatter"), composes_draws=False),
    Form("top_k_keep_top_p_flax_mask", "top_k+top_p", top_k_keep_top_p_flax_mask, ("temperature", "k", "p"),
         _TOP_K + ("stablehlo.sort",), composes_draws=False),
    Form("top_k_exact_top_p_flax_mask", "top_k+top_p", top_k_exact_top_p_flax_mask, ("temperature", "k", "p"),
         _TOP_K + ("stablehlo.sort", "stablehlo.scatter"), composes_draws=False),
    Form("min_p_removal", "min_p", min_p_removal, ("temperature", "min_p"),
         _NOISE + ("stablehlo.exponential", "chlo.top_k", "stablehlo.scatter"),
         (Writing(min_p_removal_by_argsort,
                  _NOISE + ("stablehlo.exponential", "stablehlo.sort", "stablehlo.scatter")),)),
    # The program writes the threshold 1 - p: its writings read `one_minus_p` (fuse_sampling turns it into p).
    Form("top_p_ascending_mask", "top_p", top_p_ascending_mask, ("temperature", "p"),
         _NOISE + ("stablehlo.sort", "stablehlo.scatter"), reads=("one_minus_p",)),
    # Haiku's and grok-1's nucleus writes its threshold 1 - p as one constant (`one_minus_p`), its fill -1e10.
    _with_fills(Form("top_p_haiku_mask", "top_p", top_p_haiku_mask, ("temperature", "p"), _NOISE + ("stablehlo.sort",),
                     composes_draws=False, reads=("one_minus_p",))),
    _with_fills(Form("top_p_haiku_logits_mask", "top_p", functools.partial(top_p_haiku_mask, of_logits=True),
                     ("temperature", "p"), _NOISE + ("stablehlo.sort",), composes_draws=False, reads=("one_minus_p",))),
    Form("top_p_ascending_count_mask", "top_p", top_p_ascending_count_mask, ("temperature", "p"),
         _NOISE + ("stablehlo.sort", "stablehlo.convert"), composes_draws=False),
    # (the count cutoff of a batch as a (B, 1) column, or of one row as the program indexes it)
    Form("top_p_count_cutoff_mask", "top_p", top_p_count_cutoff_mask, ("temperature", "p"),
         _NOISE + ("stablehlo.sort",),
         (Writing(functools.partial(top_p_count_cutoff_mask, by_row=True), _NOISE + ("stablehlo.sort",)),)),
    Form("top_k_top_p_ascending_mask", "top_k+top_p", top_k_top_p_ascending_mask, ("temperature", "k", "p"),
         _TOP_K + ("stablehlo.sort", "stablehlo.scatter"),
         # the top-k mask as JAX code writes it: lax.top_k's last column, or a stable descending argsort
         (Writing(functools.partial(top_k_top_p_ascending_mask, top_k_fn=jax.lax.top_k, kth_fn=last_column),
                  _TOP_K + ("stablehlo.sort", "stablehlo.scatter"), reads=("one_minus_p",)),
          Writing(functools.partial(top_k_top_p_ascending_mask, top_k_fn=top_k_by_argsort, kth_fn=last_column),
                  ("stablehlo.sort", "stablehlo.scatter"), reads=("one_minus_p",))),
         reads=("one_minus_p",)),
    Form("top_k_exact_top_p_ascending_mask", "top_k+top_p", top_k_exact_top_p_ascending_mask,
         ("temperature", "k", "p"), _TOP_K + ("stablehlo.sort", "stablehlo.scatter"), reads=("one_minus_p",)),
    Form("epsilon_removal", "epsilon", epsilon_removal, ("temperature", "epsilon"),
         _NOISE + ("stablehlo.exponential", "chlo.top_k")),
    Form("top_k_epsilon_removal", "top_k+epsilon", top_k_epsilon_removal, ("temperature", "k", "epsilon"),
         _NOISE + ("stablehlo.exponential", "chlo.top_k")),
    Form("typical_mask", "typical", typical_mask, ("temperature", "p"),
         _NOISE + ("stablehlo.sort", "stablehlo.scatter", "stablehlo.abs")),
    Form("top_k_typical_mask", "top_k+typical", top_k_typical_mask, ("temperature", "k", "p"),
         _TOP_K + ("stablehlo.sort", "stablehlo.scatter", "stablehlo.abs")),
    Form("top_k_min_p_removal", "min_p", top_k_min_p_removal, ("temperature", "k", "min_p"),
         _TOP_K + ("stablehlo.exponential", "stablehlo.scatter"),
         (Writing(functools.partial(top_k_min_p_removal, min_p_fn=min_p_removal_by_argsort),
                  _TOP_K + ("stablehlo.exponential", "stablehlo.sort", "stablehlo.scatter")),)),
)}


# generate()'s chains with a warper after the top-p (a top-k first, or none): TOP_P_CHAINS[form] is that warper's form.
TOP_P_CHAINS = {"top_p_min_p_removal": "min_p_removal", "top_k_top_p_min_p_removal": "min_p_removal",
                "top_p_epsilon_removal": "epsilon_removal", "top_k_top_p_epsilon_removal": "epsilon_removal"}


def _top_p_chain_form(name: str, then: str) -> Form:
    with_k = name.startswith("top_k_")
    fn = functools.partial(top_p_then_removal, then=then)
    markers = (_TOP_K if with_k else _NOISE) + ("stablehlo.exponential", "stablehlo.sort", "stablehlo.scatter")
    own = tuple(q for q in FORMS[then].params if q != "temperature")
    return Form(name, FORMS[then].mode, functools.partial(_of_fewer_than_all, fn) if with_k else fn,
                ("temperature",) + ("k",) * with_k + ("p",) + own, markers, reads=("one_minus_p",))


FORMS.update({name: _top_p_chain_form(name, then) for name, then in TOP_P_CHAINS.items()})

# axlearn's logit modifiers and T5X's topk_mask / topp_mask (searches) with constant parameters: k is the integer the
# program compares its counts with (read by a sentinel, `reads`), not a top-k's size; the fill is axlearn's -1e7
# (FILL_NOTE).
_CONSTANT_SEARCH_MARKERS = _NOISE + ("stablehlo.bitcast_convert", "stablehlo.while", "stablehlo.and")
SEARCHED_FORMS = {"searched_top_k": (searched_top_k, ("temperature", "k"), ("k",)),
                  "searched_top_p": (searched_top_p, ("temperature", "p"), ()),
                  "searched_top_k_top_p": (searched_masks, ("temperature", "k", "p"), ("k",))}


def _searched_form(name: str, mode: str) -> Form:
    """A SEARCHED_FORMS form: its function, and the same as tpu-inference writes its searches; each also with a
    fill."""
    fn, params, reads = SEARCHED_FORMS[name]
    by_uint32 = Writing(functools.partial(fn, sign_dtype=jnp.uint32, negate=jnp.negative), _CONSTANT_SEARCH_MARKERS,
                        reads=reads)
    return _with_fills(Form(name, mode, fn, params, _CONSTANT_SEARCH_MARKERS, (by_uint32,), reads=reads,
                            dtypes=("f32",)))


FORMS.update({name: _searched_form(name, mode)
              for name, mode in zip(SEARCHED_FORMS, ("top_k", "top_p", "top_k+top_p"), strict=True)})

# Forms whose temperature a program may have applied before the sampler: each also matches unscaled (at T = 1).
# (temperature unscaled is categorical, and temperature_top_k unscaled is top_k unscaled.)
# (the rank nuclei: below)
_SCALED_BEFORE = ("top_k", "top_k_mask", "top_p_mask", "top_k_top_p_mask", "min_p", "top_k_exact_mask",
                  "top_p_ascending_mask", "min_p_removal", "top_k_top_p_ascending_mask", "top_k_min_p_removal",
                  "top_p_flax_mask", "top_k_exact_top_p_flax_mask", "top_k_keep_mask", "top_k_keep_top_p_flax_mask",
                  "top_p_mtj_mask", "top_p_levanter_mask", "top_p_prob_sorted_mask", "top_p_shifted_mask",
                  *JAX_CLASSIC_CUTS, *JAX_CLASSIC_CHAINS, *JAX_UNSHIFTED_CUTS, *JAX_UNSHIFTED_CHAINS,
                  "top_p_shifted_logits_mask",
                  "top_k_top_p_shifted_mask", "top_p_ascending_count_mask", "top_k_exact_top_p_ascending_mask",
                  "top_p_haiku_mask", "top_p_simply_mask", "top_k_top_p_simply_mask",
                  "min_p_logits_mask", "top_a_logits_mask", "min_p_log_mask", "min_p_log_constant_mask",
                  "top_k_keep_by_top_k_mask", "top_p_count_cutoff_mask",
                  "min_p_sorted_removal", "epsilon_removal", "top_k_epsilon_removal", "typical_mask",
                  "top_k_typical_mask", *TOP_P_CHAINS, *SEARCHED_FORMS)
FORMS.update({name: dataclasses.replace(f, others=f.others + tuple(_unscaled(w) for w in f.writings))
              for name, f in FORMS.items() if name in _SCALED_BEFORE})


# ----- draws -----------------------------------------------------------------------------------------
# The forms above draw `categorical(key, y)` from their filtered, scaled logits y. Libraries also draw from the
# log-probabilities, or sample the probabilities; each such draw composes with every stochastic form above
# (form `<form>_<draw>`): the same filters, then this draw of y.


def log_softmax_draw(categorical_fn: Categorical, key: jax.Array, y: jax.Array, axis: int = -1) -> jax.Array:
    """categorical(key, log_softmax(y)), as keras-hub's samplers draw from their probabilities' logs."""
    return categorical_fn(key, jax.nn.log_softmax(y, axis=axis), axis=axis)


def log_of_softmax_draw(categorical_fn: Categorical, key: jax.Array, y: jax.Array, axis: int = -1) -> jax.Array:
    """categorical(key, log(softmax(y))): keras' `random.categorical(ops.log(probabilities))`."""
    return categorical_fn(key, jnp.log(jax.nn.softmax(y, axis=axis)), axis=axis)


def choice_draw(categorical_fn: Categorical, key: jax.Array, y: jax.Array, axis: int = -1) -> jax.Array:
    """`torch.multinomial(softmax(y), 1).squeeze(1)` as torchax lowers it: per row, jax.random.choice without
    replacement (top_k(gumbel + log p, 1)), every row with the same key, so the same noise (counters 0..n-1).
    Rows of (B, n), or one row (n,), whose `torch.multinomial(probs, 1)` is (1,) (litgpt's one-row `sample`).
    (`categorical_fn` is not used: the rows do not index the noise.)"""
    probs = jax.nn.softmax(y, axis=-1)
    if y.ndim == 1:
        return jax.random.choice(key, y.shape[-1], (1,), replace=False, p=probs)
    if y.ndim != 2:
        raise ValueError(f"the choice draw takes (B, n) logits or one row (n,), not {y.shape}")
    rows = [jax.random.choice(key, y.shape[-1], (1,), replace=False, p=probs[i, :]) for i in range(y.shape[0])]
    return jnp.squeeze(jnp.array(rows), 1)


def row_keys_draw(categorical_fn: Categorical, keys: jax.Array, y: jax.Array, axis: int = -1) -> jax.Array:
    """Each row drawn with a key of its own: `jax.vmap(jax.random.categorical)(keys, y)` of (B, n) rows and (B, 2)
    keys, as serving engines draw each request (a key split or folded in per row, penzai's nmap of a split key).
    Row r's noise is that of counters 0..n-1 under keys[r]. Rows of (B, n), or (B, 1, ..., 1, n) (grok-1's (B, 1, V)
    logits: each row's ids (1, ..., 1)), with (B, 2) keys only."""
    del axis  # the rows' last
    if y.ndim < 2 or any(size != 1 for size in y.shape[1:-1]) or keys.shape != (y.shape[0], 2):
        raise ValueError(f"the per-row-key draw takes (B, n) or (B, 1, ..., 1, n) rows and (B, 2) keys, not {y.shape} "
                         f"and {keys.shape}")
    return jax.vmap(lambda key, row: categorical_fn(key, row, axis=-1))(keys, y)


def same_key_rows_draw(categorical_fn: Categorical, key: jax.Array, y: jax.Array, axis: int = -1) -> jax.Array:
    """Every row drawn with the same key: `jax.vmap(lambda row: jax.random.categorical(key, row))(y)` of (B, n) rows,
    as a one-row sampler vmapped over the batch with its key unbatched draws (EasyDeL's vmapped samplers): row r's
    noise is that of counters 0..n-1 under `key`, for every r. Rows of (B, n) only."""
    del axis  # the rows' last
    if y.ndim != 2:
        raise ValueError(f"the same-key draw takes (B, n) rows, not {y.shape}")
    return jax.vmap(lambda row: categorical_fn(key, row, axis=-1))(y)


def inverse_cdf_draw(categorical_fn: Categorical, key: jax.Array, y: jax.Array, axis: int = -1) -> jax.Array:
    """softmax(y) drawn by its inverse CDF, `searchsorted(c, c[-1] * (1 - u))` of its f32 cumsum c: of one row (n,),
    `jax.random.choice(key, n, p=softmax(y))` (replace=True, its default), a () id; of (B, n) rows,
    `torch.multinomial(softmax(y), 1, replacement=True)` as torchax lowers it (`torch_multinomial`: per row, one key,
    so one u for every row), (B,) ids. (`categorical_fn` is not used: no noise is drawn per id.)"""
    del categorical_fn, axis  # the rows' last
    probs = jax.nn.softmax(y, axis=-1)
    if y.ndim == 1:
        return jax.random.choice(key, y.shape[-1], p=probs)
    if y.ndim != 2:
        raise ValueError(f"the inverse-CDF draw takes (B, n) logits or one row (n,), not {y.shape}")
    return torch_multinomial(key, probs, replacement=True)[:, 0]


def exponential_race_draw(categorical_fn: Categorical, key: jax.Array, y: jax.Array, axis: int = -1) -> jax.Array:
    """argmax(softmax(y) / q) of exponential noise q = jax.random.exponential(key, y.shape): the exponential race
    that gpt-fast, torchtune and vLLM draw by (`probs / torch.empty_like(probs).exponential_(1)`, argmax). Each id's
    noise is that of its flat index under `key`: q = -log1p(-u), u in [0, 1). Ties and edge cases are argmax's: a u of
    0 makes q = 0, so p / q is inf where p > 0 and NaN where p = 0 (a filtered id), and argmax takes the first NaN,
    else the first inf. Any shape (..., n). (`categorical_fn` is not used: the noise is not Gumbel.)"""
    del categorical_fn, axis  # the rows' last
    probs = jax.nn.softmax(y, axis=-1)
    return jnp.argmax(probs / jax.random.exponential(key, probs.shape), axis=-1)


def exponential_race_scores(probs: jax.Array, bits: jax.Array) -> jax.Array:
    """probs / q of q = jax.random.exponential's f32 noise from its random bits (`jax.random.bits`, uint32, probs'
    shape), with its ops: the uniform u is the bits' top 23 as the mantissa of a float in [1, 2), less 1 (JAX's
    uniform over [0, 1) then scales by 1, adds 0 and floors at 0, each exact on u >= 0), and q = -log1p(-u). The
    race's ids are their argmax."""
    u = jax.lax.bitcast_convert_type((bits >> 9) | jnp.uint32(0x3F800000), jnp.float32) - 1.0
    return probs / -jnp.log1p(-u)


def torch_exponential(key: jax.Array, like: jax.Array) -> jax.Array:
    """`torch.empty_like(like).exponential_(1)` as torchax's aten.exponential_ rule writes it: f32 exponential noise of
    `key` (the rule's own is PRNGKey(0), computed in the program: the fusion takes it as the key operand), divided by
    the rate 1, set into the array (a scatter of no indices) in `like`'s dtype. (Under jax.jit torchax 0.0.13 loses
    that in-place write and q is zeros: test/fixtures/samplers/torchtune_*.)"""
    return jnp.empty_like(like).at[:].set(jax.random.exponential(key, like.shape) / 1.0)


def torch_exponential_race_draw(categorical_fn: Categorical, key: jax.Array, y: jax.Array,
                                axis: int = -1) -> jax.Array:
    """exponential_race_draw as gpt-fast's `multinomial_sample_one_no_sync` writes it through torchax's rule:
    `argmax(probs / torch.empty_like(probs).exponential_(1))` of probs = softmax(y) (`torch_exponential`)."""
    del categorical_fn, axis  # the rows' last
    probs = jax.nn.softmax(y, axis=-1)
    return jnp.argmax(probs / torch_exponential(key, probs), axis=-1)


DRAWS: dict[str, Callable[..., jax.Array]] = {"log_softmax": log_softmax_draw, "log_of_softmax": log_of_softmax_draw,
                                              "choice": choice_draw, "row_keys": row_keys_draw,
                                              "same_key_rows": same_key_rows_draw, "inverse_cdf": inverse_cdf_draw,
                                              "exponential_race": exponential_race_draw}


@dataclass(frozen=True)
class DrawWriting:
    """Another program for a draw of DRAWS, with its ids bit for bit for logits of `dtypes` (() for every one)."""

    fn: Callable[..., jax.Array]
    dtypes: tuple[str, ...] = ()


# Other writings of a draw of DRAWS: each composes with every writing of a form. (torchax's exponential noise is f32
# set into an array of the probabilities' dtype: in bf16 its race divides bf16 values, the form's f32 ones.)
DRAW_WRITINGS: dict[str, tuple[DrawWriting, ...]] = {
    "exponential_race": (DrawWriting(torch_exponential_race_draw, ("f32",)),)}
# The op each draw of DRAWS picks its ids by (Form.draw): an argmax unless named here.
DRAW_OPS = {"choice": "top_k", "inverse_cdf": "inverse_cdf"}
# Draws whose noise is the categorical's, drawn over the rows as they are: a form drawn by one of them may have its
# noise written by hand (noise.HAND_NOISES, SampleAttrs.gumbel_at_zero).
HAND_NOISE_DRAWS = ("", "log_softmax", "log_of_softmax")
# Draws whose rows all take the one key's noise, counted from 0 in each row (the fusion looks for them only where
# the program's noise is one row's, broadcast over the rows).
SHARED_NOISE_DRAWS = ("same_key_rows",)
# Draws whose key is one per row, (B, 2): their forms' key operand.
ROW_KEY_DRAWS = ("row_keys",)
# Draws whose one-row program vmapped over the rows with its key unbatched draws the rows' ids (each row's own draw
# with the one key: jax.random.choice with replacement searches every row at the same uniform, as the draw does).
VMAPPED_DRAWS = ("inverse_cdf",)


def _drawn_by(fn: Callable[..., jax.Array], draw: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """`fn` with its categorical draw replaced by `draw` (which wraps the categorical it is given)."""

    def composed(logits: jax.Array, key: jax.Array, *, categorical_fn: Categorical = jax.random.categorical,
                 **params: Any) -> jax.Array:
        return fn(logits, key, categorical_fn=functools.partial(draw, categorical_fn), **params)

    return composed


def _row_by_row(fn: Callable[..., jax.Array], row_params: tuple[str, ...],
                keys_per_row: bool) -> Callable[..., jax.Array]:
    """`fn` written for one row and vmapped over the rows (and the form's per-row parameters), with a key per row
    (`keys_per_row`: what `fn` drawn by `row_keys_draw` computes, each row's categorical over counters 0..V-1 under
    its own key) or one key for every row (what `same_key_rows_draw` computes). (Whether a form's functions take one
    row is the template's to find: those that do not raise, and no template is made.)"""

    def vmapped(logits: jax.Array, key: jax.Array, **params: Any) -> jax.Array:
        per_row = {name: params.pop(name) for name in row_params}

        def one_row(row: jax.Array, row_key: jax.Array, *values: jax.Array) -> jax.Array:
            return fn(row, row_key, **params, **dict(zip(per_row, values, strict=True)))

        in_axes = (0, 0 if keys_per_row else None, *(0 for _ in per_row))
        return jax.vmap(one_row, in_axes=in_axes)(logits, key, *per_row.values())

    return vmapped


def _both(dtypes: tuple[str, ...], others: tuple[str, ...]) -> tuple[str, ...]:
    """The dtypes two limits (() for none) leave: the writing of a form's writing and a draw's."""
    return tuple(d for d in dtypes if d in others) if dtypes and others else dtypes or others


def _with_draw(form: Form, name: str) -> Form:
    markers = (("stablehlo.exponential",) * (name not in ROW_KEY_DRAWS + SHARED_NOISE_DRAWS)
               + ("chlo.top_k",) * (name == "choice") + ("stablehlo.reduce_window",) * (name == "inverse_cdf")
               + ("stablehlo.log_plus_one",) * (name == "exponential_race"))
    draws = (DrawWriting(DRAWS[name]), *DRAW_WRITINGS.get(name, ()))
    others = tuple(dataclasses.replace(w, fn=_drawn_by(w.fn, draw.fn), dtypes=_both(w.dtypes, draw.dtypes),
                                       marker_ops=tuple(dict.fromkeys(w.marker_ops + markers)))
                   for w in form.others for draw in draws)
    others += tuple(Writing(_drawn_by(form.fn, draw.fn), tuple(dict.fromkeys(form.marker_ops + markers)),
                            reads=form.reads, dtypes=draw.dtypes) for draw in draws[1:])
    if name in ROW_KEY_DRAWS + SHARED_NOISE_DRAWS + VMAPPED_DRAWS:  # also a one-row sampler vmapped over the rows
        keys_per_row = name in ROW_KEY_DRAWS  # (EasyDeL's, a serving engine's), its key batched or not
        others += tuple(dataclasses.replace(w, fn=_row_by_row(_drawn_by(w.fn, DRAWS[name]) if name in VMAPPED_DRAWS
                                                              else w.fn, form.row_params, keys_per_row))
                        for w in form.writings)
    return Form(f"{form.name}_{name}", form.mode, _drawn_by(form.fn, DRAWS[name]), form.params,
                tuple(dict.fromkeys(form.marker_ops + markers)), others, DRAW_OPS.get(name, "argmax"),
                form.name, reads=form.reads, row_keys=name in ROW_KEY_DRAWS, row_params=form.row_params,
                row_columns=form.row_columns, dtypes=form.dtypes)


FORMS.update({f.name: f for f in (_with_draw(base, name) for name in DRAWS for base in list(FORMS.values())
                                  if base.stochastic and base.draw == "argmax" and base.composes_draws)})


def keras_categorical_draw(categorical_fn: Categorical, key: jax.Array, y: jax.Array, axis: int = -1) -> jax.Array:
    """keras' `random.categorical(y, 1)` on its JAX backend: jax.random.categorical of `y[..., None]` along the
    vocabulary with shape (..., 1), so (..., 1) ids. Its noise is the (..., V, 1) array, whose element (..., v, 0)
    has the flat index, hence the threefry counter, of (..., v) in (..., V): the ids of `categorical_fn(key, y)`."""
    del axis  # the vocabulary: the forms draw over the last axis
    return categorical_fn(key, y[..., None], axis=y.ndim - 1, shape=(*y.shape[:-1], 1))


def keras_take(indices: jax.Array, position: jax.Array) -> jax.Array:
    """keras-hub's `take_along_axis(indices, position, axis=-1)` of the (..., 1) ids keras_categorical_draw gives."""
    return jnp.take_along_axis(indices, position, axis=-1)


def _keras_writing(writing: Writing) -> Writing:
    """`writing` drawn as keras draws: its (..., 1) ids, which the program squeezes after (the fusion reshapes the
    composite's ids back to them)."""
    fn = functools.partial(_drawn_by(writing.fn, keras_categorical_draw), take_fn=keras_take)
    return dataclasses.replace(writing, fn=fn, unit_dims=1)


def _with_keras_draw(form: Form) -> Form:
    """`form` with each of its writings (but those that map ranks back their own way) also drawn as keras does."""
    keras = tuple(_keras_writing(w) for w in form.writings if not w.own_take)
    return dataclasses.replace(form, others=form.others + keras)


# Forms with a draw of their own (the log of probabilities): no other draw composes with them.
_OF_PROBS = _TOP_K + ("stablehlo.exponential", "stablehlo.log")
# (in the other rank-space writings of a top-k too; and each at T = 1 with no division, or after the program's own:
# the top k of softmax(x), as nanoGPT-style code takes)
_TOP_K_OF_PROBS = (Writing(top_k_of_probs, _OF_PROBS), *_rank_space_writings(top_k_of_probs, _OF_PROBS))
FORMS["top_k_of_probs"] = Form("top_k_of_probs", "top_k", top_k_of_probs, ("temperature", "k"), _OF_PROBS,
                               (*_TOP_K_OF_PROBS[1:], *map(_unscaled, _TOP_K_OF_PROBS)), composes_draws=False)


def _rank_nucleus_form(name: str, nucleus: RankNucleus, with_k: bool) -> Form:
    """A rank-space nucleus form (top_p_of_probs with `nucleus`'s rule), of all V sorted probabilities or of the
    top k. A normalized nucleus reads the floor eps added before its log (or none: eps = 0)."""
    fn = functools.partial(top_p_of_probs, nucleus=nucleus)
    if with_k:
        fn = functools.partial(_of_fewer_than_all, fn)
    params = ("temperature",) + ("k",) * with_k + ("p",) + ("eps",) * nucleus.normalized
    mode = "top_k+top_p" if with_k else "top_p"
    own = Writing(fn, _OF_PROBS)
    writings = (own, _unfloored(own)) if nucleus.normalized else (own,)
    # the probabilities sorted by a hand-written argsort, descending or of their negation, then gathered
    by_sort = ("stablehlo.sort",) + _OF_PROBS[len(_TOP_K):]
    writings += tuple(Writing(functools.partial(w.fn, top_k_fn=sort), by_sort) for w in writings
                      for sort in (top_k_by_argsort, top_k_of_probs_by_negated_argsort))
    writings += tuple(_unscaled(w) for w in writings)
    return Form(name, mode, fn, params, _OF_PROBS, writings[1:], composes_draws=False)


# The rank-space nuclei: each rule with all V probabilities (top_p) or the top k of them (top_k+top_p).
RANK_NUCLEI: dict[str, RankNucleus] = {"top_p_of_probs": KERAS_NUCLEUS, "top_k_top_p_of_probs": KERAS_NUCLEUS,
                                       "top_p_of_probs_normalized": NORMALIZED_NUCLEUS,
                                       "top_k_top_p_of_probs_normalized": NORMALIZED_NUCLEUS}
FORMS.update({name: _rank_nucleus_form(name, nucleus, name.startswith("top_k_"))
              for name, nucleus in RANK_NUCLEI.items()})
_LOGITS_NUCLEUS = Writing(top_k_top_p_of_logits, _OF_PROBS[:-1])
FORMS["top_k_top_p_of_logits"] = Form(
    "top_k_top_p_of_logits", "top_k+top_p", top_k_top_p_of_logits, ("temperature", "k", "p"), _OF_PROBS[:-1],
    (dataclasses.replace(_LOGITS_NUCLEUS, reads=("fill",)), _unscaled(_LOGITS_NUCLEUS),
     _unscaled(dataclasses.replace(_LOGITS_NUCLEUS, reads=("fill",)))), composes_draws=False)
FORMS["top_p_of_top_k_rows"] = Form("top_p_of_top_k_rows", "top_k+top_p", top_p_of_top_k_rows, ("k",),
                                     _OF_PROBS[:-1], composes_draws=False, row_params=("temperature", "p"))
def _without_min_p(fn: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """`fn` with no min-p filter (sglang-jax's sampler when no request asks for one)."""

    def without(logits: jax.Array, key: jax.Array, *, min_p: Any = None, **params: Any) -> jax.Array:  # noqa: ANN401
        del min_p
        return fn(logits, key, **params)

    return without


# sglang-jax's sampler, without and with its min-p (a Python flag of the batch): T inside, or before, the site.
_SORTED_PROBS = Writing(_without_min_p(sorted_probs_rows), _NOISE + ("stablehlo.sort", "stablehlo.exponential"))
_SORTED_PROBS_MIN_P = Writing(sorted_probs_rows, _SORTED_PROBS.marker_ops)
FORMS["sorted_probs_rows"] = Form("sorted_probs_rows", "top_k+top_p", _SORTED_PROBS.fn, ("temperature",),
                                  _SORTED_PROBS.marker_ops, (_unscaled(_SORTED_PROBS),), composes_draws=False,
                                  row_params=("k", "p"))
FORMS["sorted_probs_min_p_rows"] = Form("sorted_probs_min_p_rows", "top_k+top_p", sorted_probs_rows, ("temperature",),
                                        _SORTED_PROBS.marker_ops, (_unscaled(_SORTED_PROBS_MIN_P),),
                                        composes_draws=False, row_params=("k", "p", "min_p"))
# tpu-inference's sampler: its searches fill with -1e12 (FILL_NOTE). Its markers are the search's own (the
# vocabulary moved next to last, the exponent test's `and`): the CPU's threefry loop has the while and the bitcast.
_SEARCH_MARKERS = _NOISE + ("stablehlo.bitcast_convert", "stablehlo.while", "stablehlo.transpose", "stablehlo.and")
_SEARCHED = Writing(threshold_search_rows, _SEARCH_MARKERS, reads=("fill",))
FORMS["threshold_search_rows"] = Form("threshold_search_rows", "top_k+top_p", threshold_search_rows, (),
                                      _SEARCHED.marker_ops, (_SEARCHED,), composes_draws=False,
                                      row_params=("temperature", "k", "p"), dtypes=("f32",))
# EasyDeL eSurge's sampler, without and with its min-p (a Python flag of the batch), drawn with a key per row.
_ESURGE_MARKERS = _SEARCH_MARKERS + ("stablehlo.case",)
FORMS["esurge_searched_rows"] = Form("esurge_searched_rows", "top_k+top_p", _without_min_p(esurge_searched_rows), (),
                                     _ESURGE_MARKERS, composes_draws=False, row_params=("temperature", "k", "p"),
                                     row_columns=("temperature",), dtypes=("f32",))
FORMS["esurge_searched_min_p_rows"] = Form("esurge_searched_min_p_rows", "top_k+top_p", esurge_searched_rows, (),
                                           _ESURGE_MARKERS, composes_draws=False,
                                           row_params=("temperature", "k", "p", "min_p"), row_columns=("temperature",),
                                           dtypes=("f32",))
FORMS["esurge_searched_rows_row_keys"] = _with_draw(FORMS["esurge_searched_rows"], "row_keys")
# grok-1's sampler: Haiku's nucleus with a p per row, drawn with a key per row (`jax.vmap(jax.random.categorical)`) or
# one key. Its T and its mask of disallowed tokens come before the nucleus, in XLA (`_unscaled`).
_HAIKU_ROWS = Writing(top_p_haiku_rows, _NOISE + ("stablehlo.sort",))
FORMS["top_p_haiku_rows"] = _with_fills(Form("top_p_haiku_rows", "top_p", top_p_haiku_rows, ("temperature",),
                                             _HAIKU_ROWS.marker_ops, (_unscaled(_HAIKU_ROWS),), composes_draws=False,
                                             row_params=("p",)))
FORMS["top_p_haiku_rows_row_keys"] = _with_draw(FORMS["top_p_haiku_rows"], "row_keys")
FORMS["esurge_searched_min_p_rows_row_keys"] = _with_draw(FORMS["esurge_searched_min_p_rows"], "row_keys")
# (its vmapped writing, EasyDeL's `vmaped_sample_top_p_efficient`, draws every row with the one key)
FORMS["top_p_of_top_k_rows_same_key_rows"] = _with_draw(FORMS["top_p_of_top_k_rows"], "same_key_rows")
# tunix's nucleus of the sorted logits, of all V (top_p) or of the top k (top_k+top_p): T inside or before.
_EXCLUSIVE_LOGITS = Writing(top_p_of_logits_exclusive, _OF_PROBS[:-1])
_EXCLUSIVE_LOGITS_K = Writing(functools.partial(_of_fewer_than_all, top_p_of_logits_exclusive), _OF_PROBS[:-1])
FORMS["top_p_of_logits_exclusive"] = Form(
    "top_p_of_logits_exclusive", "top_p", top_p_of_logits_exclusive, ("temperature", "p"), _OF_PROBS[:-1],
    (_unscaled(_EXCLUSIVE_LOGITS),), composes_draws=False)
FORMS["top_k_top_p_of_logits_exclusive"] = Form(
    "top_k_top_p_of_logits_exclusive", "top_k+top_p", _EXCLUSIVE_LOGITS_K.fn, ("temperature", "k", "p"),
    _OF_PROBS[:-1], (_unscaled(_EXCLUSIVE_LOGITS_K),), composes_draws=False)
FORMS.update({name: _with_keras_draw(f) for name, f in FORMS.items() if f.stochastic and f.draw == "argmax"})


# ----- the llama reference's `sample_top_p`, as torch code writes it and torchax lowers it ---------------------------
# `probs_sort, probs_idx = torch.sort(probs, descending=True)`, the cumsum, `probs_sort[cumsum - probs_sort > p] = 0`,
# renormalised, `torch.multinomial(probs_sort, 1)`, `torch.gather(probs_idx, -1, ...)`: the normalized rank-space
# nucleus, its sort torch's (unstable: which of equal probabilities takes which rank is the backend's) and its draw
# torch.multinomial's (jax.random.choice per row, every row with the same key: the noise of counters 0..V-1).


def torch_sort_descending(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`torch.sort(x, descending=True)` as torchax lowers it: jnp.sort and jnp.argsort, both unstable, descending."""
    return (jnp.sort(x, axis=-1, stable=False, descending=True),
            jnp.argsort(x, axis=-1, stable=False, descending=True))


def torch_multinomial(key: jax.Array, probs: jax.Array, replacement: bool = False) -> jax.Array:
    """`torch.multinomial(probs, 1)` of (B, n) probabilities as torchax lowers it: per row jax.random.choice without
    replacement (top_k(gumbel + log p, 1)), every row with the same key; (B, 1) positions. With `replacement`, per
    row jax.random.choice with replacement: the inverse-CDF draw `searchsorted(c, c[-1] * (1 - u))` of the row's
    cumsum c, every row with the same uniform u."""
    if probs.ndim != 2:
        raise ValueError(f"torch.multinomial's rows are (B, n), not {probs.shape}")
    return jnp.array([jax.random.choice(key, probs.shape[-1], (1,), replace=replacement, p=probs[i, :])
                      for i in range(probs.shape[0])])


def torch_multinomial_with_replacement(key: jax.Array, probs: jax.Array) -> jax.Array:
    """`torch.multinomial(probs, 1, replacement=True)` of (B, n) probabilities under torchax (`torch_multinomial`)."""
    return torch_multinomial(key, probs, replacement=True)


def torch_multinomial_of_rows(key: jax.Array, probs: jax.Array,
                              draw_fn: Callable[[jax.Array, jax.Array], jax.Array] = torch_multinomial) -> jax.Array:
    """torch.multinomial of (..., n) probabilities as audiocraft's `multinomial` draws them: the rows reshaped to
    (-1, n), drawn, and the (..., 1) positions reshaped back. Of (B, n) rows both reshapes are none: the llama
    reference's torch.multinomial."""
    drawn = draw_fn(key, probs.reshape(-1, probs.shape[-1]))
    return drawn.reshape(*probs.shape[:-1], -1)


def torch_gather(values: jax.Array, index: jax.Array) -> jax.Array:
    """`torch.gather(values, -1, index)` of (..., n) values at (..., m) positions, as torchax indexes it: an iota of
    each leading dim beside the index."""
    leading = [jnp.broadcast_to(jnp.arange(size).reshape([size if d == i else 1 for d in range(index.ndim)]),
                                index.shape) for i, size in enumerate(index.shape[:-1])]
    return values[(*leading, index)]


def zeroed_where(dropped: jax.Array, values: jax.Array) -> jax.Array:
    """`values[dropped] = 0`: the dropped values set to 0 (the llama reference's `probs_sort[mask] = 0.0`)."""
    return jnp.where(dropped, jnp.broadcast_to(jnp.asarray(0.0, values.dtype), values.shape), values)


def zeroed_by_product(dropped: jax.Array, values: jax.Array) -> jax.Array:
    """`values *= (~dropped).float()` (audiocraft's `probs_sort *= (~mask).float()`): for probabilities the same
    values as `zeroed_where`, bit for bit. A finite p times 1 is p and times 0 is +0; a NaN stays NaN where it is
    kept, and a softmax row holds a NaN in every place or in none, the renormalisation's 0 / 0 making either row all
    NaN."""
    return values * jnp.logical_not(dropped).astype(values.dtype)


def top_p_of_probs_torch(logits: jax.Array, key: jax.Array, *, temperature: float, p: float,
                         sort_fn: Callable[[jax.Array], tuple[jax.Array, jax.Array]] = torch_sort_descending,
                         draw_fn: Callable[[jax.Array, jax.Array], jax.Array] = torch_multinomial,
                         zero_fn: Callable[[jax.Array, jax.Array], jax.Array] = zeroed_where,
                         renormalize: bool = True, **_: Any) -> jax.Array:
    """The llama reference's `sample_top_p(torch.softmax(x / T), p)` through torchax, its (B, 1) ids reshaped to (B,)
    (audiocraft's of (B, K, V) codebook logits, its (B, K, 1) ids read as `[..., 0]`): top_p_of_probs_normalized's
    nucleus (`cumsum - v * 1 > p` is `cumsum - v > p`: torch's sub scales by alpha = 1) in torch's sort order, drawn
    by torch.multinomial. Without `renormalize` (xformers' fastgen `top_p`), the kept probabilities are drawn as they
    are: torch.multinomial takes weights, and their logs are not the renormalised ones' bit for bit."""
    values, ids = sort_fn(nucleus_probs(logits, temperature))
    dropped = jnp.cumsum(values, axis=-1) - values * 1 > p
    kept = zero_fn(dropped, values)
    if renormalize:
        kept = kept / jnp.sum(kept, axis=-1, keepdims=True)
    drawn = torch_gather(ids, torch_multinomial_of_rows(key, kept, draw_fn))
    return drawn.reshape(-1) if drawn.ndim == 2 else drawn[..., 0]


_TORCH_NUCLEUS = Writing(top_p_of_probs_torch, ("stablehlo.sort", "chlo.top_k", "stablehlo.exponential",
                                                "stablehlo.log"))
# audiocraft's `sample_top_p` (MusicGen's): the same nucleus, its dropped probabilities zeroed by a product
_TORCH_NUCLEUS_BY_PRODUCT = dataclasses.replace(
    _TORCH_NUCLEUS, fn=functools.partial(top_p_of_probs_torch, zero_fn=zeroed_by_product))
FORMS["top_p_of_probs_torch"] = Form("top_p_of_probs_torch", "top_p", top_p_of_probs_torch, ("temperature", "p"),
                                     _TORCH_NUCLEUS.marker_ops,
                                     (_unscaled(_TORCH_NUCLEUS), _TORCH_NUCLEUS_BY_PRODUCT,
                                      _unscaled(_TORCH_NUCLEUS_BY_PRODUCT)),
                                     draw="top_k", composes_draws=False)


def last_as_torch_ellipsis_index(values: jax.Array) -> jax.Array:
    """values[..., [-1]], as audiocraft reads the k-th largest (`top_k_value[..., [-1]]`) and torchax lowers it: a
    gather at the index array [-1], of values of any rank (MusicGen's (B, K, k))."""
    return values[..., jnp.array([-1], jnp.int32)]


def top_k_of_probs_torch(logits: jax.Array, key: jax.Array, *, temperature: float, k: int,
                         top_k_fn: TopK = jax.lax.top_k, kth_fn: Callable[[jax.Array], jax.Array] = last_column,
                         draw_fn: Callable[[jax.Array, jax.Array], jax.Array] = torch_multinomial,
                         renormalize: bool = True, **_: Any) -> jax.Array:
    """audiocraft's `sample_top_k(torch.softmax(x / T), k)` through torchax (MusicGen's sampler), its (..., 1) ids read
    as `[..., 0]`: the k-th largest probability, `probs *= (probs >= kth).float()` (every probability tied with the
    k-th stays), renormalised (or not: `renormalize`), torch.multinomial of the rows in vocabulary order. (..., V)
    logits: MusicGen's are (B, K, V), a row per codebook. Its writing as audiocraft's torch code is lowered reads the
    k-th of torch.topk's values sorted again (`top_k_resorted`) at `[..., [-1]]`."""
    probs = nucleus_probs(logits, temperature)
    kept = probs * (probs >= kth_fn(top_k_fn(probs, k)[0])).astype(probs.dtype)
    if renormalize:
        kept = kept / jnp.sum(kept, axis=-1, keepdims=True)
    return torch_multinomial_of_rows(key, kept, draw_fn)[..., 0]


_TORCH_TOP_K_PROBS = Writing(top_k_of_probs_torch, ("chlo.top_k", "stablehlo.exponential", "stablehlo.log"))
_TORCH_TOP_K_PROBS_AS_TORCH = dataclasses.replace(
    _TORCH_TOP_K_PROBS, fn=functools.partial(top_k_of_probs_torch, top_k_fn=top_k_resorted,
                                             kth_fn=last_as_torch_ellipsis_index))
FORMS["top_k_of_probs_torch"] = Form("top_k_of_probs_torch", "top_k", top_k_of_probs_torch, ("temperature", "k"),
                                     _TORCH_TOP_K_PROBS.marker_ops,
                                     (_unscaled(_TORCH_TOP_K_PROBS), _TORCH_TOP_K_PROBS_AS_TORCH,
                                      _unscaled(_TORCH_TOP_K_PROBS_AS_TORCH)),
                                     draw="top_k", composes_draws=False)


def min_p_of_probs_torch(logits: jax.Array, key: jax.Array, *, temperature: float, min_p: float,
                         draw_fn: Callable[[jax.Array, jax.Array], jax.Array] = torch_multinomial,
                         renormalize: bool = True, **_: Any) -> jax.Array:
    """A min-p of the probabilities as torch samplers write it by hand, through torchax: `probs = softmax(x / T)`, those
    below min_p times the row's largest set to 0 (`torch.where(probs < min_p * top, 0, probs)`: a NaN stays),
    renormalised (or not: `renormalize`, torch.multinomial takes weights), torch.multinomial of the rows in vocabulary
    order, its (..., 1) ids read as `[..., 0]`."""
    probs = nucleus_probs(logits, temperature)
    kept = zeroed_where(probs < min_p * jnp.max(probs, axis=-1, keepdims=True), probs)
    if renormalize:
        kept = kept / jnp.sum(kept, axis=-1, keepdims=True)
    return torch_multinomial_of_rows(key, kept, draw_fn)[..., 0]


_TORCH_MIN_P_PROBS = Writing(min_p_of_probs_torch, ("chlo.top_k", "stablehlo.exponential", "stablehlo.log"))
FORMS["min_p_of_probs_torch"] = Form("min_p_of_probs_torch", "min_p", min_p_of_probs_torch, ("temperature", "min_p"),
                                     _TORCH_MIN_P_PROBS.marker_ops, (_unscaled(_TORCH_MIN_P_PROBS),),
                                     draw="top_k", composes_draws=False)


def _unnormalized(form: Form) -> Form:
    """`form` (a filter of the probabilities drawn by torch.multinomial) with the kept probabilities drawn as they
    are, not renormalised, as torch code may write it since torch.multinomial takes weights: a form of its own, since
    the logs of the weights are not those of the renormalised probabilities bit for bit."""
    def without(fn: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
        return functools.partial(fn, renormalize=False)

    return dataclasses.replace(form, name=f"{form.name}_unnormalized", fn=without(form.fn),
                               others=tuple(dataclasses.replace(w, fn=without(w.fn)) for w in form.others))


# torch.multinomial of probabilities zeroed and not renormalised (xformers' fastgen `top_p`, hand-written min-p)
TORCH_WEIGHT_FORMS = ("top_p_of_probs_torch", "top_k_of_probs_torch", "min_p_of_probs_torch")
FORMS.update({f"{name}_unnormalized": _unnormalized(FORMS[name]) for name in TORCH_WEIGHT_FORMS})


# gemma_pytorch's `Sampler.forward` (google/gemma_pytorch, gemma/model.py) after its logits: a temperature, a top-p and
# a top-k per row, the masks in rank space, the probabilities put back in vocabulary order and drawn by
# `torch.multinomial(probs, 1, replacement=True)`: an inverse-CDF draw (`Form.draw` "inverse_cdf").


def rank_masks(values: jax.Array, p: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
    """gemma_pytorch's masks of (B, n) probabilities sorted descending, a p and a k per row: the ranks whose
    preceding mass `cumsum - v` exceeds p (torch's sub, `v * 1`), and the ranks at or past k."""
    by_mass = jnp.cumsum(values, axis=-1) - values * 1 > jnp.expand_dims(p, axis=1)
    ranks = jnp.broadcast_to(jnp.arange(0, values.shape[-1], 1), values.shape)
    return by_mass, ranks >= jnp.expand_dims(k, axis=1)


def by_argsort_of_ids(values: jax.Array, ids: jax.Array) -> jax.Array:
    """(B, n) values in rank order put back in vocabulary order as gemma_pytorch does it:
    `torch.gather(values, -1, torch.argsort(ids))` (a second sort, of the ids)."""
    return torch_gather(values, jnp.argsort(ids, axis=-1, stable=False))


def probs_of_rows(logits: jax.Array, temperature: jax.Array) -> jax.Array:
    """softmax(x / T) of (B, V) logits with a (B,) temperature, as gemma_pytorch's `logits.div_(T.unsqueeze(1))`."""
    return jax.nn.softmax(logits / jnp.expand_dims(temperature, axis=1), axis=-1)


def row_sums(values: jax.Array) -> jax.Array:
    """`jnp.sum(values, axis=-1, keepdims=True)`."""
    return jnp.sum(values, axis=-1, keepdims=True)


def inverse_cdf_of_sorted(values: jax.Array, ids: jax.Array, key: jax.Array, p: jax.Array, k: jax.Array,
                          unsort_fn: Callable[[jax.Array, jax.Array], jax.Array] = by_argsort_of_ids,
                          draw_fn: Callable[[jax.Array, jax.Array], jax.Array]
                          = torch_multinomial_with_replacement,
                          sum_fn: Callable[[jax.Array], jax.Array] = row_sums) -> jax.Array:
    """gemma_pytorch's sampler after its sort: the (B, V) probabilities sorted descending with their ids, masked
    (`rank_masks`), renormalised by the row's sum (`sum_fn`), put back in vocabulary order (`unsort_fn`) and drawn by
    torch.multinomial with replacement. (B,) ids."""
    by_mass, by_rank = rank_masks(values, p, k)
    values = zeroed_where(by_rank, zeroed_where(by_mass, values))
    values = values / sum_fn(values)
    return draw_fn(key, unsort_fn(values, ids))[:, 0]


def sorted_probs_inverse_cdf_rows(logits: jax.Array, key: jax.Array, *, temperature: jax.Array, p: jax.Array,
                                  k: jax.Array,
                                  sort_fn: Callable[[jax.Array], tuple[jax.Array, jax.Array]] = torch_sort_descending,
                                  **_: Any) -> jax.Array:
    """gemma_pytorch's sampler through torchax, (B, V) logits with a (B,) temperature, p and k: softmax(x / T) sorted
    descending (torch.sort: unstable), ranks whose preceding mass exceeds p zeroed, ranks at or past k zeroed
    (`rank_masks`), renormalised by the row's sum, put back in vocabulary order (`by_argsort_of_ids`), then
    torch.multinomial with replacement: per row `searchsorted(c, c[-1] * (1 - u))` of the row's cumsum c in
    vocabulary order, one uniform u for every row (one key). (B,) ids."""
    if logits.ndim != 2:
        raise ValueError(f"gemma_pytorch's sampler takes (B, V) logits, not {logits.shape}")
    values, ids = sort_fn(probs_of_rows(logits, temperature))
    return inverse_cdf_of_sorted(values, ids, key, p, k)


FORMS["sorted_probs_inverse_cdf_rows"] = Form(
    "sorted_probs_inverse_cdf_rows", "top_k+top_p", sorted_probs_inverse_cdf_rows, (),
    ("stablehlo.sort", "stablehlo.reduce_window", "stablehlo.exponential", "stablehlo.gather"), draw="inverse_cdf",
    composes_draws=False, row_params=("temperature", "p", "k"))


# ----- Pax (praxis `token_samplers`, as saxml serves it): the noise scaled by T, not the logits ----------------------
# DefaultCategoricalLogitsSampler draws argmax(x + gumbel * T): for T > 0 that samples softmax(x / T), as a categorical
# of x / T does, but it rounds otherwise, so these forms draw their own way (the CPU kernel's scaled noise) and no other
# draw composes with them. The filters come first, as DefaultNextTokenSampler applies them: the epsilon mask, then the
# top k (the draw among them, their ids gathered back by an iota per dim) with the nucleus of the sorted top k, or,
# without a top k, the nucleus of the whole row sorted ascending. Dropped logits become -0.7 * finfo.max (`fill`).
NoiseScaledDraw = Callable[[jax.Array, jax.Array, float], jax.Array]


def noise_scaled_draw(key: jax.Array, logits: jax.Array, temperature: float) -> jax.Array:
    """argmax(x + gumbel * T) over the last axis, the noise jax.random.gumbel's f32 cast to the logits' dtype."""
    noise = jax.random.gumbel(key, logits.shape).astype(logits.dtype)
    return jnp.argmax(logits + noise * temperature, axis=-1)


def take_by_iotas(items: jax.Array, position: jax.Array) -> jax.Array:
    """items (..., k) at `position` (...,): a gather indexed by an iota per leading dim and the position, as Pax maps
    the drawn rank back to its id."""
    selectors = [jax.lax.broadcasted_iota(jnp.int32, position.shape, d) for d in range(position.ndim)]
    return items[(*selectors, position)]


def pax_nucleus(logits: jax.Array, threshold: float, *, descending: bool, fill: float | None,
                sort_fn: Callable[[jax.Array], jax.Array] = jnp.sort) -> jax.Array:
    """Pax's top_p_mask_logits of (B, n) logits: sorted ascending (or given descending), the cumsum of their f32
    softmax, the count of places whose cumsum is at most `threshold` (p from the top, 1 - p from the bottom), the
    sorted logit at that count, and the logits below it at `fill` (-inf for the form's own meaning)."""
    ordered = logits if descending else sort_fn(logits)
    cumulative = jnp.cumsum(jax.nn.softmax(ordered.astype(jnp.float32), axis=-1), axis=-1)
    count = jnp.sum((cumulative <= threshold).astype(jnp.int32), axis=-1)
    cutoff = ordered[jnp.arange(logits.shape[0]), count]
    return jnp.where(logits < jnp.expand_dims(cutoff, -1), NEG_INF if fill is None else fill, logits)


def temperature_noise_scaled(logits: jax.Array, key: jax.Array, *, temperature: float,
                             draw_fn: NoiseScaledDraw = noise_scaled_draw, **_: Any) -> jax.Array:
    """Pax's sampler with neither top-k nor top-p: argmax(x + gumbel * T)."""
    return draw_fn(key, logits, temperature)


def top_k_noise_scaled(logits: jax.Array, key: jax.Array, *, temperature: float, k: int,
                       top_k_fn: TopK = jax.lax.top_k, draw_fn: NoiseScaledDraw = noise_scaled_draw,
                       **_: Any) -> jax.Array:
    """Pax's top-k sampler: lax.top_k, argmax(values + gumbel * T) over the k ranks, the id gathered back."""
    values, ids = top_k_fn(logits, k)
    return take_by_iotas(ids, draw_fn(key, values, temperature))


def top_k_top_p_noise_scaled(logits: jax.Array, key: jax.Array, *, temperature: float, k: int, p: float,
                             fill: float | None = None, top_k_fn: TopK = jax.lax.top_k,
                             draw_fn: NoiseScaledDraw = noise_scaled_draw, **_: Any) -> jax.Array:
    """Pax's top-k then top-p: the nucleus of the sorted top k (`pax_nucleus` from the top, cumsum <= p), drawn over
    the k ranks by argmax(masked + gumbel * T), the id gathered back. (B, V) logits only."""
    if logits.ndim != 2:
        raise ValueError(f"Pax's top-p takes (B, V) logits, not {logits.shape}")
    values, ids = top_k_fn(logits, k)
    masked = pax_nucleus(values, p, descending=True, fill=fill)
    return take_by_iotas(ids, draw_fn(key, masked, temperature))


def top_p_noise_scaled(logits: jax.Array, key: jax.Array, *, temperature: float, p: float,
                       fill: float | None = None, one_minus_p: float | None = None,
                       sort_fn: Callable[[jax.Array], jax.Array] = jnp.sort,
                       draw_fn: NoiseScaledDraw = noise_scaled_draw, **_: Any) -> jax.Array:
    """Pax's top-p of the whole row (no top-k): `pax_nucleus` from the bottom (cumsum <= 1 - p: the program's constant
    1 - p, what the fusion reads), then argmax(masked + gumbel * T). (B, V) logits only."""
    if logits.ndim != 2:
        raise ValueError(f"Pax's top-p takes (B, V) logits, not {logits.shape}")
    threshold = 1 - p if one_minus_p is None else one_minus_p
    masked = pax_nucleus(logits, threshold, descending=False, fill=fill, sort_fn=sort_fn)
    return draw_fn(key, masked, temperature)


def epsilon_noise_scaled(logits: jax.Array, key: jax.Array, *, temperature: float, epsilon: float,
                         fill: float | None = None, draw_fn: NoiseScaledDraw = noise_scaled_draw,
                         **_: Any) -> jax.Array:
    """Pax's epsilon sampling: the logits whose f32 softmax is below epsilon at `fill`, then argmax(x + gumbel * T)."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    masked = jnp.where(probs < epsilon, NEG_INF if fill is None else fill, logits)
    return draw_fn(key, masked, temperature)


NOISE_SCALED = ("temperature_noise_scaled", "top_k_noise_scaled", "top_k_top_p_noise_scaled", "top_p_noise_scaled",
                "epsilon_noise_scaled")
FORMS.update({f.name: f for f in (
    Form("temperature_noise_scaled", "temperature", temperature_noise_scaled, ("temperature",), _NOISE,
         composes_draws=False),
    Form("top_k_noise_scaled", "top_k", top_k_noise_scaled, ("temperature", "k"), _TOP_K, composes_draws=False),
    Form("top_k_top_p_noise_scaled", "top_k+top_p", top_k_top_p_noise_scaled, ("temperature", "k", "p"),
         _TOP_K + ("stablehlo.exponential",), composes_draws=False, reads=("fill",)),
    Form("top_p_noise_scaled", "top_p", top_p_noise_scaled, ("temperature", "p"),
         _NOISE + ("stablehlo.sort", "stablehlo.exponential"), composes_draws=False, reads=("fill", "one_minus_p")),
    Form("epsilon_noise_scaled", "epsilon", epsilon_noise_scaled, ("temperature", "epsilon"),
         _NOISE + ("stablehlo.exponential",), composes_draws=False, reads=("fill",)),
)})


# Pax with a temperature per request (saxml's: sample_decode passes `temperature.flatten()[:, jnp.newaxis]`, (B, 1)):
# the same forms with T an operand after the key, not an attribute. Each function computes noise * T as the program
# does, T broadcast along the row; a row at T = 0 draws argmax(x + gumbel * 0), its greedy token.
NOISE_SCALED_ROWS = tuple(f"{name}_rows" for name in NOISE_SCALED)
FORMS.update({f"{name}_rows": dataclasses.replace(FORMS[name], name=f"{name}_rows",
                                                   params=tuple(p for p in FORMS[name].params if p != "temperature"),
                                                   row_params=("temperature",), row_columns=("temperature",))
              for name in NOISE_SCALED})


# ----- log-probabilities in front of the sampler -------------------------------------------------------------------
# axlearn's decoder samples from log-probabilities: log_softmax of the logits, then its logit modifiers, then the draw.
# Every stochastic form composes with that normalization in front (`<form>_of_log_probs`): the form's function of
# log_softmax(logits). These forms have no templates of their own: the fusion finds the normalization, by its own
# template, computing the logits operand of a fused site (fuse_sampling's `_with_prelude`), and takes it in.


def log_probs(logits: jax.Array) -> jax.Array:
    """jax.nn.log_softmax over the vocabulary: the log-probabilities a sampler of them draws from."""
    return jax.nn.log_softmax(logits, axis=-1)


PRELUDES: dict[str, Callable[[jax.Array], jax.Array]] = {"of_log_probs": log_probs}


def _after(prelude: Callable[[jax.Array], jax.Array], fn: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """`fn` of `prelude(logits)`."""

    def normalized(logits: jax.Array, key: jax.Array, **params: Any) -> jax.Array:
        return fn(prelude(logits), key, **params)

    return normalized


def prelude_of(form: str) -> tuple[str, Callable[[jax.Array], jax.Array]] | None:
    """For a form with a normalization in front (`<inner>_<prelude>`): the inner form and the normalization, which
    a kernel runs by the program's own ops before the inner form's kernel; None for any other form."""
    if form not in FORMS or not FORMS[form].prelude_of:
        return None
    inner = FORMS[form].prelude_of
    return inner, PRELUDES[form[len(inner) + 1:]]


FORMS.update({f"{name}_{prelude}": dataclasses.replace(form, name=f"{name}_{prelude}", fn=_after(fn, form.fn),
                                                        others=(), prelude_of=name)
              for prelude, fn in PRELUDES.items() for name, form in list(FORMS.items()) if form.stochastic})


# ----- filter stages in front of the sampler ------------------------------------------------------------------------
# A chain of filters, each applied to the last one's logits (a top-k, then a top-p, then a min-p, as equinox-style and
# generic JAX pipelines compose them), is fused as the form of its last filters and its draw, with the filters in
# front of those taken in as stages: each is the logits that one writing of a STAGE_FORMS form hands its categorical
# (`Stage.filtered`), in the order the program applies them. A composite with stages means its form's function of the
# last stage's logits (`sample_reference`'s `stages`). The fusion finds each stage by the writing's own template, so
# a chain of any length and order composes, and each stage computes what the program's filter does, bit for bit.
STAGE_FORMS = ("top_k_keep_mask", "top_k_keep_by_top_k_mask", "top_k_mask", *JAX_CLASSIC_CUTS, *JAX_UNSHIFTED_CUTS,
               *JAX_CLASSIC_CHAINS, *JAX_UNSHIFTED_CHAINS, "top_p_count_cutoff_mask", "min_p_log_mask",
               "min_p_log_constant_mask", "min_p", "min_p_logits_mask", "top_a_logits_mask", "top_k_exact_mask",
               "top_p_mask", "top_k_top_p_mask", "top_p_shifted_mask", "top_k_top_p_shifted_mask",
               "top_p_shifted_logits_mask", "min_p_removal", "top_p_ascending_mask", "top_k_top_p_ascending_mask",
               "typical_mask", "top_k_typical_mask", "top_p_flax_mask", "top_p_mtj_mask", "top_p_levanter_mask",
               "top_p_prob_sorted_mask", "top_p_simply_mask", "min_p_sorted_removal", "top_p_haiku_mask",
               "top_p_haiku_logits_mask", "top_p_ascending_count_mask")


@dataclass(frozen=True)
class Stage:
    """A filter in front of a composite's form: the logits writing `writing` of form `form` hands its categorical,
    with `params` (the values its function reads: temperature, k, p, min_p and the constants of `Writing.reads`).
    The writing is named by its place in the form's `writings`."""

    form: str
    writing: int
    params: tuple[tuple[str, float], ...]

    def filtered(self, logits: jax.Array) -> jax.Array:
        """The stage's filtered logits: what the writing's function draws from (its draw itself is not computed)."""
        drawn_from: list[jax.Array] = []

        def captured(key: jax.Array, y: jax.Array, axis: int = -1, **_: Any) -> jax.Array:  # noqa: ANN401
            del key, axis
            drawn_from.append(y)
            return jnp.zeros(y.shape[:-1], jnp.int32)

        writing = FORMS[self.form].writings[self.writing]
        writing.fn(logits, jnp.zeros((2,), jnp.uint32), categorical_fn=captured, **dict(self.params))
        if len(drawn_from) != 1 or drawn_from[0].shape != logits.shape:
            raise ValueError(f"stage '{self.form}' (writing {self.writing}) draws no logits shaped as its "
                             f"{logits.shape}")
        return drawn_from[0]


def after_stages(logits: jax.Array, stages: tuple[Stage, ...],
                 run: Callable[[Callable[[jax.Array], jax.Array], jax.Array], jax.Array] | None = None) -> jax.Array:
    """`logits` through each stage in order; `run(filtered, x)` runs each (a kernel's: its sorts by the kernel)."""
    for stage in stages:
        logits = stage.filtered(logits) if run is None else run(stage.filtered, logits)
    return logits


# Parameters only the forms that read them are given (so that the kernels of the other forms never see them).
OPTIONAL_PARAMS = ("eps", "epsilon")
# Each parameter's value when a form does not read it: what the form's function computes with.
NEUTRAL_PARAMS: dict[str, float] = {"temperature": 1.0, "k": 0, "p": 1.0, "min_p": 0.0, "eps": 0.0, "epsilon": 0.0}


def form_params(form: str, *, temperature: float = 1.0, k: int = 0, p: float = 1.0,
                min_p: float = 0.0, eps: float = 0.0, epsilon: float = 0.0) -> dict[str, Any]:
    """The parameters `form` reads, the others at their neutral values. Kernels take their parameters
    through this, so that none applies, say, a temperature to the categorical form, whose function
    ignores it (a composite written by hand may carry any attribute values)."""
    given = {"temperature": temperature, "k": k, "p": p, "min_p": min_p, "eps": eps, "epsilon": epsilon}
    read = FORMS[form].params
    return {name: given[name] if name in read else neutral for name, neutral in NEUTRAL_PARAMS.items()
            if name in read or name not in OPTIONAL_PARAMS}


def sample_reference(
    logits: jax.Array,  # (..., V) float
    key: jax.Array | None,  # (2,) uint32, a raw threefry2x32 key ((B, 2) for a `row_keys` form); None if greedy
    *,
    form: str,
    temperature: float = 1.0,
    k: int = 0,
    p: float = 1.0,
    min_p: float = 0.0,
    eps: float = 0.0,
    epsilon: float = 0.0,
    categorical_fn: Categorical = jax.random.categorical,
    rows: tuple[jax.Array, ...] = (),  # (B,) per-row values of the form's `row_params`, in order (the operands)
    fill: float | None = None,  # the dropped logits' value, for a form that reads one (`gives_scores`); None: -inf
    gumbel_at_zero: float | None = None,  # the noise at a zero uniform of a hand-written noise (SampleAttrs)
    stages: tuple[Stage, ...] = (),  # the filters in front of the form, in the order applied (SampleAttrs.stages)
) -> jax.Array:  # (...,) int32 token ids
    """The token ids `form` draws from `logits` with `key`: the meaning of an hlofuse.sample composite.
    (`categorical_fn` draws in place of jax.random.categorical: a shard's rows draw the whole batch's noise; with
    `gumbel_at_zero`, the categorical is `categorical_at_zero` of it.)"""
    if gumbel_at_zero is not None:
        categorical_fn = categorical_at_zero(gumbel_at_zero)
    scalars = {"temperature": temperature, "k": k, "p": p, "min_p": min_p, "eps": eps, "epsilon": epsilon}
    filled = {} if fill is None else {"fill": fill}
    logits = after_stages(logits, stages)
    return FORMS[form].fn(logits, key, **(scalars | row_values(form, rows)), **filled,
                          categorical_fn=categorical_fn).astype(jnp.int32)


# Vocabulary-space filters whose composite may give back its scores: Levanter's nucleus, whose sampler reads its
# filtered logits again for the drawn token's log-probability (`take_along_axis(y, token) - logsumexp(y)`,
# `return_log_probs=True`); grok-1's, for the token's probability and the top 8; google-deepmind/simply's top-k (an
# exact top-k), top-p and top-k + top-p, for the drawn token's log-probability (`MaskedCategorical.log_prob`).
SCORED_FILTERS = ("top_p_levanter_mask", "top_p_haiku_rows", "top_k_exact_mask", "top_p_simply_mask",
                  "top_k_top_p_simply_mask")


def gives_scores(form: str) -> bool:
    """Whether `form`'s composite may also give back the scores its draw perturbs (`scores = true`): the filtered logits
    that T5X, axlearn and Levanter read again for the drawn token's log-probability. The searched forms (and those with
    a normalization in front) and SCORED_FILTERS, drawn by their own categorical: their function draws once, by
    `categorical_fn`, from scores shaped as the logits, and the CPU kernel computes them as one masked copy of the
    logits; grok-1's, drawn with a key per row, too."""
    if form not in FORMS or FORMS[form].filters not in (*SEARCHED_FORMS, *SCORED_FILTERS):
        return False
    grok = FORMS[form].filters == "top_p_haiku_rows" and FORMS[form].drawn_by in ROW_KEY_DRAWS
    return not FORMS[form].drawn_by or grok


def recording_draw(categorical_fn: Categorical) -> tuple[Categorical, list[jax.Array]]:
    """`categorical_fn`, and the list each of its calls appends the scores it draws from to: a form that gives
    scores draws once, so they are the list's one element."""
    drawn_from: list[jax.Array] = []

    def draw(key: jax.Array, y: jax.Array, axis: int = -1, **options: Any) -> jax.Array:  # noqa: ANN401
        drawn_from.append(y)
        return categorical_fn(key, y, axis=axis, **options)

    return draw, drawn_from


def sample_reference_with_scores(logits: jax.Array, key: jax.Array, *, form: str, fill: float = NEG_INF,
                                 categorical_fn: Categorical = jax.random.categorical,
                                 **params: Any) -> tuple[jax.Array, jax.Array]:
    """(`sample_reference`'s token ids, the scores its draw perturbs): the meaning of a composite with `scores = true`.
    The scores are what the form's function hands its categorical, the dropped logits at `fill`."""
    if not gives_scores(form):
        raise ValueError(f"'{form}' gives back no scores (only the searched forms and SCORED_FILTERS do)")
    recording, drawn_from = recording_draw(categorical_fn)
    if FORMS[form].drawn_by:  # (a key per row: the draw is under a vmap, so the scores are its base form's, one key)
        ids = sample_reference(logits, key, form=form, fill=fill, categorical_fn=categorical_fn, **params)
        sample_reference(logits, key[0], form=FORMS[form].base, fill=fill, categorical_fn=recording, **params)
    else:
        ids = sample_reference(logits, key, form=form, fill=fill, categorical_fn=recording, **params)
    (scores,) = drawn_from  # one draw (a form that gives scores draws once)
    return ids, scores


def row_values(form: str, rows: tuple[jax.Array, ...]) -> dict[str, jax.Array]:
    """The per-row parameters of `form` (`Form.row_params`) by name, from the composite's operands after the key."""
    names = FORMS[form].row_params
    if len(rows) != len(names):
        raise ValueError(f"'{form}' takes {len(names)} per-row operands ({', '.join(names) or 'none'}), "
                         f"not {len(rows)}")
    return dict(zip(names, rows, strict=True))


# The id a kernel gives a row it cannot vouch for (an unconverged search, a NaN, greedy_softmax near a tie);
# `reference_where_uncertified` recomputes the batch then.
UNCERTIFIED = -1
# greedy_softmax is argmax(x) but where its rounding ties distinct logits: a token this far or more below the
# max has a probability that rounds below the max's, by many units of the logits' rounding and of exp's error,
# so a kernel certifies a row with no token less than this below its max (and a max below +inf).
SOFTMAX_TIE_MARGIN = {"float32": 2.0**-17, "bfloat16": 2.0**-5, "float16": 2.0**-8}


def nucleus_cut_slack(terms: int, prefix: int, side: float, own_terms: int = 0) -> float:
    """A bound on |the program's f32 cumulative mass - the exact mass| at a sorted nucleus's cut, plus a kernel's own
    error in computing that mass: the program's softmax normaliser over `terms` and its cumsum's `prefix`, each summed
    in any order, (n - 1) u of the `side` of the mass they reach at the cut (p from the top, 1 - p from the bottom);
    `own_terms` more for a kernel that sums the mass in f32 itself; 300 u for the divisions and exp's rounding; and
    p's rounding to f32. A kernel draws among the values above c(p + slack) and vouches for a winner above c(p -
    slack) (docs/kernels-cpu-sampling.md, "Certified nucleus cut"; sampling.cc's CutSlack is the CPU's copy)."""
    reached = min(1.0, side * 1.05 + 1e-3)
    return reached * (terms + prefix + own_terms + 300) * 2.0**-24 * 1.01 + 1e-7


def reference_where_uncertified(tokens: jax.Array, reference: Callable[[], jax.Array]) -> jax.Array:
    """`tokens`, or `reference()` when some row is UNCERTIFIED: a lax.cond, so the reference runs only then."""
    return jax.lax.cond(jnp.any(tokens == UNCERTIFIED), reference, lambda: tokens)


def _better(a: tuple[jax.Array, jax.Array], b: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """The better of two (score, id) candidates: the larger score, NaN above all (jnp.argmax), the smaller
    id on ties. A total order, so the reduction over P may run in any order (the partitioner's)."""
    (sa, ia), (sb, ib) = a, b
    a_nan, b_nan = jnp.isnan(sa), jnp.isnan(sb)
    tie = (sa == sb) | (a_nan & b_nan)
    a_wins = (sa > sb) | (a_nan & ~b_nan) | (tie & (ia < ib))
    return jnp.where(a_wins, sa, sb), jnp.where(a_wins, ia, ib)


def merge_vocab_splits(ids: jax.Array, scores: jax.Array) -> jax.Array:  # (R, P), (R, P) -> (R,) int32
    """The winner over the P vocabulary splits of each row, each split's (id in the whole vocabulary, score)
    computed by a kernel on its part of the row: jnp.argmax of the whole row's scores. One reduction over P,
    which the partitioner runs on each device's splits and then across devices (as it does the unfused
    program's argmax)."""
    init = (jnp.array(-jnp.inf, jnp.float32), jnp.array(jnp.iinfo(jnp.int32).max, jnp.int32))
    _, best = jax.lax.reduce((scores, ids), init, _better, (1,))
    return best


__all__ = ["DRAWS", "FORMS", "JAX_CLASSIC_CUTS", "NEG_INF", "NEUTRAL_PARAMS", "RANK_NUCLEI", "SOFTMAX_TIE_MARGIN",
           "UNCERTIFIED", "Form", "RankNucleus", "Writing", "form_params", "gives_scores", "keras_categorical_draw",
           "log_floored",
           "merge_vocab_splits", "nucleus_cut_slack", "nucleus_probs", "rank_nucleus_kept", "rank_nucleus_scores",
           "recording_draw", "reference_where_uncertified", "sample_reference", "sample_reference_with_scores",
           "sort_unstable", "take_by_batch_index", "top_k_by_argsort", "top_p_removal"]
