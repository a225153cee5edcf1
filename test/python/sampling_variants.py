"""A catalogue of token samplers as JAX programs write them: one entry per variant the fusion must cover.

Each variant is a function of (logits, key) plus the logits' shape and dtype, the form the fusion must
find (None for a near-miss that must stay unfused, with a remark) and the attributes it must read.
The e2e tests (test_fuse_sampling_e2e.py) and the lit file test/passes/fuse_sampling.mlir come from
these entries; regenerate the lit file with `python test/python/sampling_variants.py`.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from sampling_programs import jax_classic_removal, jax_put_back

B, V = 4, 256


@dataclass(frozen=True)
class Variant:
    name: str
    fn: Callable[..., Any]
    form: str | None  # None: must not fuse
    shape: tuple[int, ...] = (B, V)
    dtype: Any = jnp.float32  # noqa: ANN401
    expect: dict[str, Any] = field(default_factory=dict)
    stochastic: bool = True
    remark: str | None = None  # a remark the variant must give (a near-miss's reason, or a part left unfused)
    platform: str | None = None  # lowered for this platform ("tpu", "cuda"), not the host
    # TopKs the program takes of its own outside the sampler (grok-1's top 8 of its probabilities): XLA keeps them
    program_top_ks: int = 0


def lower(variant: Variant, platform: str | None = None) -> Any:  # noqa: ANN401
    """The variant lowered for `platform` or the variant's own ("tpu", "cuda", ...: JAX lowers for any
    platform on a CPU-only host, and some ops lower differently on each), else for the host."""
    platform = platform or variant.platform
    args = [jax.ShapeDtypeStruct(variant.shape, variant.dtype)]
    if variant.stochastic:
        args.append(jax.ShapeDtypeStruct((2,), jnp.uint32))
    if platform is None:
        return jax.jit(variant.fn).lower(*args)
    return jax.jit(variant.fn).trace(*args).lower(lowering_platforms=(platform,))


# --- greedy ---------------------------------------------------------------------------------------


def argmax(x):
    return jnp.argmax(x, axis=-1)


def argmax_of_softmax(x):
    return jnp.argmax(jax.nn.softmax(x, axis=-1), axis=-1)


# --- temperature ----------------------------------------------------------------------------------


def categorical(x, key):
    return jax.random.categorical(key, x)


def temperature_07(x, key):
    return jax.random.categorical(key, x / 0.7, axis=-1)


def temperature_upcast(x, key):
    return jax.random.categorical(key, x.astype(jnp.float32) / 1.3)


def split_key(x, key):
    _, sub = jax.random.split(key)
    return jax.random.categorical(sub, x / 0.8)


def in_a_cond_branch(x, key):
    """t5x's decode step draws in a lax.cond on a traced flag (T > 0: the sampler, else argmax): the sampler in the
    conditional's second branch (stablehlo.case region 1), whose -inf hlofuse-prepare's CSE shares with the
    parent's own (a value from the enclosing block)."""
    finite = jnp.where(jnp.isnan(x), -jnp.inf, x)
    return jax.lax.cond(jnp.any(finite > 0), lambda y: jax.random.categorical(key, y / 0.7),
                        lambda y: jnp.zeros(y.shape[:-1], jnp.int32), finite)


# --- top-k ----------------------------------------------------------------------------------------


def jetstream_top_k(x, key):
    values, ids = jax.lax.top_k(x, 40)
    pick = jax.random.categorical(key, values / 0.6).astype(jnp.int32)
    return jnp.take_along_axis(ids, pick[..., None], axis=-1)[..., 0]


def keras_top_k(x, key):
    values, ids = jax.lax.top_k(x / 0.9, 8)
    pick = jax.random.categorical(key, values)
    return jnp.take_along_axis(ids, pick[..., None].astype(jnp.int32), axis=-1)[..., 0]


def maxtext_top_k_mask(x, key):
    kth = jax.lax.top_k(x, 16)[0][..., -1:]
    return jax.random.categorical(key, jnp.where(x < kth, -jnp.inf, x) / 0.8)


def argsort_top_k(x, key):
    """top-k by a stable descending argsort: lax.top_k's ids and values."""
    ids = jnp.argsort(x, axis=-1, descending=True, stable=True)[..., :20]
    pick = jax.random.categorical(key, jnp.take_along_axis(x, ids, axis=-1) / 0.7)
    return jnp.take_along_axis(ids, pick[..., None], axis=-1)[..., 0]


def negated_argsort_top_k_mask(x, key):
    """argsort(-x) puts NaN last where lax.top_k puts it first: not the top_k_mask form; exact as the
    temperature form of the masked logits."""
    kth = jnp.take_along_axis(x, jnp.argsort(-x, axis=-1)[..., :12], axis=-1)[..., -1:]
    return jax.random.categorical(key, jnp.where(x < kth, -jnp.inf, x) / 0.8)


# --- a key per row ---------------------------------------------------------------------------------


def split_key_per_row(x, key):
    """A key split into one per row, each row drawn with its own (penzai's nmap of jax.random.categorical over a
    key split along the batch axis): the temperature form drawn by `row_keys`."""
    keys = jax.random.split(jax.random.wrap_key_data(key), x.shape[0])
    return jax.vmap(jax.random.categorical)(keys, x / 0.7)


def fold_in_row_top_k_mask(x, key):
    """A serving engine's per-request key, `fold_in(key, row)`, drawing MaxText's top-k mask row by row."""
    keys = jax.vmap(lambda row: jax.random.fold_in(key, row))(jnp.arange(x.shape[0]))
    kth = jax.lax.top_k(x, 16)[0][..., -1:]
    return jax.vmap(lambda k, row: jax.random.categorical(k, row))(keys, jnp.where(x < kth, -jnp.inf, x) / 0.8)


def vmapped_row_sampler(x, key):
    """A one-row sampler (the nucleus of `_nucleus`, then / T and a categorical) vmapped over rows and their split
    keys: its filters batch into the (B, V) form, its draw into `row_keys`."""
    def one_row(row_key, row):
        return jax.random.categorical(row_key, _nucleus(row, 0.9) / 0.7)

    return jax.vmap(one_row)(jax.random.split(key, x.shape[0]), x)


def near_miss_row_keys_of_other_rows(x, key):
    """Each row drawn with the key split for another row (the keys reversed): the composite's keys are the
    program's own, whatever derives them, so this fuses too, with the reversed keys as its operand."""
    keys = jax.random.split(key, x.shape[0])[::-1]
    return jax.vmap(jax.random.categorical)(keys, x)


def vmapped_same_key_sampler(x, key):
    """A one-row sampler (the nucleus of `_nucleus`, then / T and a categorical) vmapped over the rows with its key
    unbatched, so every row draws the same noise: the top_p_mask form drawn by `same_key_rows`."""
    return jax.vmap(lambda row: jax.random.categorical(key, _nucleus(row, 0.9) / 0.7))(x)


def vmapped_choice_top_k_mask(x, key):
    """A one-row top-k mask then `jax.random.choice(key, V, p=softmax(y))` (replace=True), vmapped over the rows with
    its key unbatched: every row searches its cumsum at the same uniform, as torch.multinomial with replacement per
    row does (top_k_mask_inverse_cdf)."""
    def one_row(row):
        y = row / 0.8
        probs = jax.nn.softmax(jnp.where(y < jax.lax.top_k(y, 16)[0][-1], -jnp.inf, y))
        return jax.random.choice(key, y.shape[-1], p=probs)

    return jax.vmap(one_row)(x)


def vmapped_choice_top_p(x, key):
    """A one-row nucleus (`_nucleus`), / T, then jax.random.choice with replacement, vmapped with the key unbatched:
    top_p_mask_inverse_cdf."""
    return jax.vmap(lambda row: jax.random.choice(key, row.shape[-1], p=jax.nn.softmax(_nucleus(row, 0.9) / 0.7)))(x)


# --- parameters per row ----------------------------------------------------------------------------


def sglang_jax_sorted_probs(x, key):
    """sglang-jax's sampler: softmax(x / T), sorted descending with its argsort, per-row top-k and top-p zeroing of the
    sorted probabilities, then a categorical of those probabilities as logits: sorted_probs_rows (T outside it)."""
    probs = jax.nn.softmax(jnp.divide(x, jnp.full((x.shape[0], 1), 0.8)), axis=-1)
    ordered, ids = jnp.sort(probs, axis=-1)[:, ::-1], jnp.argsort(probs, axis=-1)[:, ::-1]
    cumulative = jnp.cumsum(ordered, axis=-1)
    top_k = jnp.resize(jnp.array([40, 5]), x.shape[:1])
    ordered = jnp.where(jnp.arange(0, x.shape[-1]).reshape(1, -1) >= top_k.reshape(-1, 1), 0.0, ordered)
    ordered = jnp.where((cumulative - ordered) > jnp.full((x.shape[0],), 0.9).reshape(-1, 1), 0.0, ordered)
    drawn = jax.random.categorical(key, ordered).reshape(-1, 1)
    return jnp.take_along_axis(ids.astype(jnp.int32), axis=1, indices=drawn).flatten()


def gemma_pytorch_sampler(x, key):
    """gemma_pytorch's Sampler as torchax lowers it: a T, a p and a k per row, softmax(x / T) sorted descending
    (torch.sort: unstable), ranks whose preceding mass exceeds p and ranks at or past k zeroed, renormalised, put
    back in vocabulary order by gather(argsort(ids)), then torch.multinomial with replacement (jax.random.choice per
    row, one key): sorted_probs_inverse_cdf_rows."""
    rows, vocab = x.shape
    temperature = jnp.resize(jnp.array([0.8, 1.3], jnp.float32), (rows,))
    p = jnp.resize(jnp.array([0.95, 0.6], jnp.float32), (rows,))
    k = jnp.resize(jnp.array([64, 7], jnp.int32), (rows,))
    probs = jax.nn.softmax(x / jnp.expand_dims(temperature, 1), axis=-1)
    ordered = jnp.sort(probs, axis=-1, stable=False, descending=True)
    ids = jnp.argsort(probs, axis=-1, stable=False, descending=True)
    ordered = jnp.where(jnp.cumsum(ordered, axis=-1) - ordered * 1 > jnp.expand_dims(p, 1), 0.0, ordered)
    ranks = jnp.broadcast_to(jnp.arange(0, vocab, 1), x.shape)
    ordered = jnp.where(ranks >= jnp.expand_dims(k, 1), 0.0, ordered)
    ordered = ordered / jnp.sum(ordered, axis=-1, keepdims=True)
    lead = jnp.broadcast_to(jnp.arange(rows).reshape(rows, 1), x.shape)  # torch.gather under torchax
    probs = ordered[lead, jnp.argsort(ids, axis=-1, stable=False)]
    drawn = [jax.random.choice(key, vocab, (1,), replace=True, p=probs[i, :]) for i in range(rows)]
    return jnp.squeeze(jnp.array(drawn), 1)


def near_miss_sorted_probs_inclusive(x, key):
    """The sglang-jax sampler with the inclusive top-p rule `cumsum > p`: no form has it, so only the draw fuses."""
    probs = jax.nn.softmax(x / 0.8, axis=-1)
    ordered, ids = jnp.sort(probs, axis=-1)[:, ::-1], jnp.argsort(probs, axis=-1)[:, ::-1]
    ordered = jnp.where(jnp.cumsum(ordered, axis=-1) > jnp.full((x.shape[0],), 0.9).reshape(-1, 1), 0.0, ordered)
    drawn = jax.random.categorical(key, ordered).reshape(-1, 1)
    return jnp.take_along_axis(ids.astype(jnp.int32), axis=1, indices=drawn).flatten()


def easydel_vmapped_per_row_top_p(x, key):
    """EasyDeL's vmaped_sample_top_p_efficient: the one-row sampler vmapped over the rows, each with its own
    temperature and p, the key unbatched: top_p_of_top_k_rows drawn by `same_key_rows`."""
    def one_row(row, temperature, top_p):
        values, ids = jax.lax.top_k(row / jnp.expand_dims(jnp.where(temperature > 1e-6, temperature, 1.0), -1), 32)
        keep = (jnp.cumsum(jax.nn.softmax(values, axis=-1), axis=-1) <= jnp.expand_dims(top_p, -1)).at[..., 0].set(True)
        pick = jax.random.categorical(key, jnp.where(keep, values, -jnp.inf))
        return jnp.take_along_axis(ids, jnp.expand_dims(pick, -1), axis=-1).squeeze(-1)

    return jax.vmap(one_row)(x, jnp.resize(jnp.array([0.7, 1.0, 1e-7, 1.3]), x.shape[:1]),
                             jnp.resize(jnp.array([0.9, 0.5, 1.0, 0.95]), x.shape[:1]))


def tpu_inference_searched(x, key):
    """tpu-inference's sampler: a temperature, k and p per row, its top-k and top-p masks each found by a search over
    float32 bits (-1e12 fills), a categorical: threshold_search_rows."""
    from hlofuse.kernels.sampling_reference import search_top_k_mask, search_top_p_mask

    rows = x.shape[:1]
    temperature, top_k, top_p = jnp.full(rows, 0.7), jnp.resize(jnp.array([16, 0]), rows), jnp.full(rows, 0.9)
    x = x / jnp.expand_dims(temperature.astype(x.dtype), axis=-1)
    x = jnp.where(jnp.expand_dims(top_k > 0, axis=-1), search_top_k_mask(x, top_k, -1e12), x)
    x = jnp.where(jnp.expand_dims(top_p < 1.0, axis=-1), search_top_p_mask(x, top_p, -1e12), x)
    return jax.random.categorical(key, x)


def esurge_searched(x, key):
    """EasyDeL eSurge's sampler: the searched top-k and top-p of the rows asking for them (lax.conds, a vmap of a
    per-row lax.cond), x / T by a (B, 1) column, its min-p on the logits, -1e10 fills, each row drawn with
    fold_in(key, row): esurge_searched_min_p_rows_row_keys."""
    from hlofuse.kernels.sampling_reference import esurge_searched_rows

    rows = x.shape[:1]

    def per_row_draw(key, y):
        return jax.vmap(lambda row, i: jax.random.categorical(jax.random.fold_in(key, i), row))(y, jnp.arange(rows[0]))

    return esurge_searched_rows(x, key, temperature=jnp.full((rows[0], 1), 0.7, jnp.float32),
                                k=jnp.full(rows, 16, jnp.int32), p=jnp.full(rows, 0.9, jnp.float32),
                                min_p=jnp.full(rows, 0.05, jnp.float32), categorical_fn=per_row_draw)


def near_miss_searched_top_p_strict(x, key):
    """The searched top-p keeping probs strictly above its threshold (it keeps probs >= t): no form has it, so only
    the draw fuses, with the search named as left in XLA."""
    from hlofuse.kernels.sampling_reference import largest_float_not_meeting

    probs = jax.nn.softmax(x, axis=-1)
    threshold = largest_float_not_meeting(
        x.shape[:-1], lambda t: jnp.sum(jnp.where(probs >= t[:, None], probs, 0.0), axis=-1) < 0.9)
    return jax.random.categorical(key, jnp.where(probs > threshold[:, None], x, -1e12))


def _axlearn_search(lead, predicate):
    """axlearn's bisection (after T5X's) over float32 bits, its sign bit written `jnp.int32(1 << 31)` as NumPy 1
    wraps it: sampling_reference.largest_float_not_meeting with an int32 sign bit."""
    from hlofuse.kernels.sampling_reference import largest_float_not_meeting

    return largest_float_not_meeting(lead, predicate, jnp.int32)


def _axlearn_top_k(k):
    def modifier(x):
        rows = jnp.swapaxes(x, -1, -2)
        threshold = -1 * _axlearn_search(x.shape[:-1], lambda t: jnp.sum(rows > jnp.expand_dims(-t, 0), axis=0) >= k)
        return jnp.where(x >= jnp.expand_dims(threshold, -1), x, np.array(-1.0e7))

    return modifier


def _axlearn_top_p(p):
    def modifier(x):
        probs = jax.nn.softmax(x, axis=-1)
        rows = jnp.swapaxes(probs, -1, -2)
        threshold = _axlearn_search(x.shape[:-1], lambda t: jnp.sum(
            jnp.where(rows >= jnp.expand_dims(t, 0), rows, 0.0), axis=0) < p)
        return jnp.where(probs >= jnp.expand_dims(threshold, -1), x, np.array(-1.0e7))

    return modifier


def axlearn_searched_chain(x, key):
    """axlearn's sample decode step: log_softmax of the logits, its logit modifiers (scale_by(0.8) as
    `x / jnp.maximum(0.8, 1e-4)`, its searched top_k_logits(16) and top_p_logits(0.9), -1e7 fills), the rows
    reshaped to (B, 1, V), a categorical over axis 2: searched_top_k_top_p_of_log_probs."""
    y = jax.nn.log_softmax(x, axis=-1)
    y = _axlearn_top_p(0.9)(_axlearn_top_k(16)(y / jnp.maximum(0.8, 1e-4)))
    return jax.random.categorical(key, y.reshape(x.shape[0], 1, x.shape[-1]), axis=2)


def axlearn_searched_chain_with_token_log_prob(x, key):
    """axlearn's sample_decode step as its loop body writes it: axlearn_searched_chain, and the drawn token's
    log-probability as `sum(candidates * one_hot(token))` of the (B, 1, V) candidates it drew from, which the composite
    gives back as its scores (reshaped from the (B, V) it computes)."""
    y = jax.nn.log_softmax(x, axis=-1)
    y = _axlearn_top_p(0.9)(_axlearn_top_k(16)(y / jnp.maximum(0.8, 1e-4)))
    candidates = y.reshape(x.shape[0], 1, x.shape[-1])
    ids = jax.random.categorical(key, candidates, axis=2)
    return ids, jnp.sum(candidates * jax.nn.one_hot(ids, x.shape[-1]), axis=-1)


def axlearn_searched_top_k(x, key):
    """axlearn's searched top_k_logits(16) alone, on the logits: searched_top_k, T = 1."""
    return jax.random.categorical(key, _axlearn_top_k(16)(x))


def _log_prob_of(scores, ids):
    """log_softmax(scores) at the drawn ids, as T5X's decode step takes the token's log-probability."""
    return jnp.take_along_axis(jax.nn.log_softmax(scores), ids[:, None], axis=-1)[:, 0]


def searched_top_k_with_log_prob(x, key):
    """T5X's decode step with topk: x / T, the searched top-k (-1e7 fill), a categorical, and the drawn token's
    log-probability under the masked logits: searched_top_k, giving back its scores (the masked logits)."""
    masked = _axlearn_top_k(16)(x / 0.7)
    ids = jax.random.categorical(key, masked)
    return ids, _log_prob_of(masked, ids)


def searched_top_k_log_prob_of_the_scaled_logits(x, key):
    """As searched_top_k_with_log_prob, the log-probability taken from the scaled logits before the mask: the division
    stays outside the composite (searched_top_k at T = 1), which gives back no scores."""
    scaled = x / 0.7
    ids = jax.random.categorical(key, _axlearn_top_k(16)(scaled))
    return ids, _log_prob_of(scaled, ids)


def near_miss_search_cutoff_read_beside_the_draw(x, key):
    """As searched_top_k_with_log_prob, the program also returning the search's cutoff: a value inside the sampler that
    is not the scores its draw perturbs, so the searched form is passed over and only the draw fuses."""
    rows = jnp.swapaxes(x, -1, -2)
    cutoff = -1 * _axlearn_search(x.shape[:-1], lambda t: jnp.sum(rows > jnp.expand_dims(-t, 0), axis=0) >= 16)
    ids = jax.random.categorical(key, jnp.where(x >= jnp.expand_dims(cutoff, -1), x, np.array(-1.0e7)))
    return ids, cutoff


def near_miss_scores_read_before_the_key_is_split(x, key):
    """As searched_top_k_with_log_prob, the log_softmax taken before the draw's key is split off: the composite would
    have to come before that reader and after the key, so the scores stay the program's and only the draw fuses."""
    masked = _axlearn_top_k(16)(x / 0.7)
    log_probs = jax.nn.log_softmax(masked)
    _, draw_key = jax.random.split(key)
    ids = jax.random.categorical(draw_key, masked)
    return ids, jnp.take_along_axis(log_probs, ids[:, None], axis=-1)[:, 0]


def near_miss_searched_top_k_strict(x, key):
    """The searched top-k keeping values strictly above its cutoff (it keeps x >= t): no form has it, so only the draw
    fuses, with the search named as left in XLA."""
    rows = jnp.swapaxes(x, -1, -2)
    threshold = -1 * _axlearn_search(x.shape[:-1], lambda t: jnp.sum(rows > jnp.expand_dims(-t, 0), axis=0) >= 16)
    return jax.random.categorical(key, jnp.where(x > jnp.expand_dims(threshold, -1), x, -1.0e7))


def easydel_per_row_top_p(x, key):
    """EasyDeL's sample_top_p_efficient with each request's own temperature and p (one below its 1e-6 guard): the
    top_p_of_top_k_rows form, whose composite takes them as (B,) operands."""
    temperature = jnp.resize(jnp.array([0.7, 1.0, 1e-7, 1.3]), x.shape[:1])
    top_p = jnp.resize(jnp.array([0.9, 0.5, 1.0, 0.95]), x.shape[:1])
    scaled = x / jnp.where(temperature > 1e-6, temperature, 1.0)[:, None]
    values, ids = jax.lax.top_k(scaled, 32)
    keep = (jnp.cumsum(jax.nn.softmax(values, axis=-1), axis=-1) <= top_p[:, None]).at[:, 0].set(True)
    pick = jax.random.categorical(key, jnp.where(keep, values, -jnp.inf))
    return jnp.take_along_axis(ids, pick[:, None], axis=-1)[:, 0]


# --- top-p, min-p and combinations ------------------------------------------------------------------


def _nucleus(x, p):
    ordered = jnp.sort(x, axis=-1)[..., ::-1]
    cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
    cutoff = jnp.take_along_axis(ordered, jnp.sum(cumulative < p, axis=-1, keepdims=True), axis=-1)
    return jnp.where(x < cutoff, -jnp.inf, x)


def jetstream_top_p(x, key):
    return jax.random.categorical(key, _nucleus(x, 0.9) / 0.7)


def top_k_then_top_p(x, key):
    kth = jax.lax.top_k(x, 50)[0][..., -1:]
    return jax.random.categorical(key, _nucleus(jnp.where(x < kth, -jnp.inf, x), 0.95) / 0.6)


def min_p_sampler(x, key):
    scaled = x / 0.9
    probs = jax.nn.softmax(scaled, axis=-1)
    keep = probs >= 0.05 * jnp.max(probs, axis=-1, keepdims=True)
    return jax.random.categorical(key, jnp.where(keep, scaled, -jnp.inf))


# --- other draws: from the log-probabilities, or by jax.random.choice (torch.multinomial) ---------------


def keras_random(x, key):
    """keras-hub's RandomSampler: softmax(x / T), then keras' random.categorical of the probabilities' log."""
    return jax.random.categorical(key, jnp.log(jax.nn.softmax(x / 0.7, axis=-1)))


def log_softmax_temperature(x, key):
    return jax.random.categorical(key, jax.nn.log_softmax(x / 0.8))


def log_softmax_categorical(x, key):
    return jax.random.categorical(key, jax.nn.log_softmax(x, axis=-1), axis=-1)


def top_k_log_softmax(x, key):
    values, ids = jax.lax.top_k(x, 8)
    pick = jax.random.categorical(key, jax.nn.log_softmax(values / 0.6))
    return jnp.take_along_axis(ids, pick[..., None], axis=-1)[..., 0]


def top_p_log_of_softmax(x, key):
    return jax.random.categorical(key, jnp.log(jax.nn.softmax(_nucleus(x, 0.9) / 0.7)))


def _multinomial(probs, key):
    """torch.multinomial(probs, 1).squeeze(1) as torchax lowers it: jax.random.choice per row, one key."""
    rows = [jax.random.choice(key, probs.shape[-1], (1,), replace=False, p=probs[i, :]) for i in range(probs.shape[0])]
    return jnp.squeeze(jnp.array(rows), 1)


def _multinomial_unsqueezed(probs, key):
    """torch.multinomial(probs, 1) as torchax lowers it, its (B, 1) ids left as they are (nanoGPT, gpt-neox)."""
    return jnp.array([jax.random.choice(key, probs.shape[-1], (1,), replace=False, p=probs[i, :])
                      for i in range(probs.shape[0])])


def top_k_mask_filled_before_scale(x, key):
    """The logits below the k-th largest filled with -1e9, then / T: top_k_mask with the fill (FILL_NOTE)."""
    kth = jax.lax.top_k(x, 40)[0][:, -1:]
    return jax.random.categorical(key, jnp.where(x < kth, -1e9, x) / 0.7)


def nanogpt_multinomial_unsqueezed(x, key):
    """nanoGPT's `generate` step: / T, softmax, torch.multinomial(probs, num_samples=1), its (B, 1) ids unsqueezed:
    temperature_choice."""
    return _multinomial_unsqueezed(jax.nn.softmax(x / 0.8, axis=-1), key)


def nanogpt_top_k_multinomial_unsqueezed(x, key):
    """nanoGPT's top-k (`logits[logits < v[:, [-1]]] = -inf`), softmax, torch.multinomial, (B, 1) ids: a top-k
    mask drawn by choice."""
    y = x / 0.8
    kth = jax.lax.top_k(y, 16)[0][..., -1:]
    return _multinomial_unsqueezed(jax.nn.softmax(jnp.where(y < kth, -jnp.inf, y), axis=-1), key)


def torch_top_k_candidates_multinomial(x, key):
    """`v, ix = torch.topk(x / T, k)`, torch.multinomial(softmax(v), 1), `torch.gather(ix, -1, idx)`, as torchax lowers
    them: lax.top_k with its values sorted again and its ids taken along their argsort, a choice per row, the ids
    gathered by an iota of rows, (B, 1): temperature_top_k_choice."""
    values, ids = jax.lax.top_k(x / 0.8, 20)
    values = jnp.sort(values, descending=True)
    ids = jnp.take_along_axis(ids, jnp.argsort(values, axis=-1, descending=True), axis=-1)
    picks = _multinomial_unsqueezed(jax.nn.softmax(values, axis=-1), key)
    rows = jnp.broadcast_to(jnp.arange(picks.shape[0]).reshape(-1, 1), picks.shape)
    return ids[(rows, picks)]


def llama_reference_top_p_unsqueezed(x, key):
    """The llama reference's `sample_top_p` as its function returns it, the (B, 1) gathered ids (the caller's
    `.reshape(-1)` left out): top_p_of_probs_torch."""
    return llama_reference_top_p_through_torchax(x, key).reshape(-1, 1)


def multinomial_temperature(x, key):
    return _multinomial(jax.nn.softmax(x / 0.7, axis=-1), key)


def multinomial_top_k_mask(x, key):
    kth = jax.lax.top_k(x, 16)[0][..., -1:]
    return _multinomial(jax.nn.softmax(jnp.where(x < kth, -jnp.inf, x) / 0.8, axis=-1), key)


# --- near-misses -----------------------------------------------------------------------------------


def no_match_noise_escapes(x, key):
    noisy = jax.random.gumbel(key, x.shape, x.dtype) + x / 0.7
    return jnp.argmax(noisy, axis=-1), noisy


def no_match_uniform_noise(x, key):
    """Perturbed by uniform, not Gumbel, noise: no sampler form."""
    return jnp.argmax(x + jax.random.uniform(key, x.shape), axis=-1)


def no_match_searchsorted_of_uniform(x, key):
    """A hand-written inverse-CDF draw: each row's uniform searched in its cumulative probabilities."""
    cumulative = jnp.cumsum(jax.nn.softmax(x, axis=-1), axis=-1)
    u = jax.random.uniform(key, (x.shape[0],))
    return jax.vmap(jnp.searchsorted)(cumulative, u)


def reversed_argsort_top_k(x, key):
    """An ascending argsort reversed: ties go to the higher index, unlike lax.top_k, so it is not the top_k
    form; exact as the temperature form over the values it gathers."""
    ids = jnp.argsort(x, axis=-1)[..., ::-1][..., :20]
    pick = jax.random.categorical(key, jnp.take_along_axis(x, ids, axis=-1) / 0.7)
    return jnp.take_along_axis(ids, pick[..., None], axis=-1)[..., 0]


def unknown_filter_is_categorical(x, key):
    """A filter no form knows (<= kth, then * 1/T): exact as categorical over what it computes."""
    kth = jax.lax.top_k(x, 16)[0][..., -1:]
    return jax.random.categorical(key, jnp.where(x <= kth, x, -jnp.inf) * 1.25)


def mask_from_a_branch(x, key):
    """google-deepmind/simply's `sample_from_logits` with a traced top-p or top-k: its mask comes out of a lax.cond
    (a top-k mask by a one-hot of the top-k ids, or a top-p mask put back by sort_key_val), then `where(mask, x,
    -0.5 * finfo.max)` and a categorical. The branch's filters stay in XLA and the remark names the branch. Here the
    flag is traced from the logits; the library's is its parameters."""
    y = x / 0.7

    def top_k_keep(y):
        return jnp.any(jax.nn.one_hot(jax.lax.top_k(y, 16)[1], y.shape[-1], dtype=jnp.bool_), axis=-2)

    def top_p_keep(y):
        order = jnp.argsort(y, axis=-1, descending=True)
        mass = jnp.cumulative_sum(jnp.take_along_axis(jax.nn.softmax(y), order, axis=-1), axis=-1,
                                  include_initial=True)
        return jax.lax.sort_key_val(order, mass[..., :-1] < 0.9, dimension=-1)[1]

    keep = jax.lax.cond(jnp.any(jnp.isnan(y)), top_k_keep, top_p_keep, y)
    return jax.random.categorical(key, jnp.where(keep, y, -0.5 * float(jnp.finfo(y.dtype).max)))


def approximate_top_k(x, key):
    """scaling_transformer_inference_efficiency's `sample` and jax-llm-examples' `sample_top`: the candidates of
    lax.approx_max_k (ApproxTopK: exact on the CPU, approximate on TPU), then a categorical of them. The draw fuses
    over the k candidates; the remark names the approximate top-k left in XLA."""
    values, ids = jax.lax.approx_max_k(x, 16)
    pick = jax.random.categorical(key, values / 0.7)
    return jnp.take_along_axis(ids, pick[..., None], axis=-1)[..., 0]


def keras_categorical_axis1(x, key):
    """keras' JAX random.categorical draws over axis 1 of logits[..., None], a dim followed only by a size-1 dim:
    the same noise counters, so the categorical form."""
    return jax.random.categorical(key, x[..., None], shape=(x.shape[0], 1), axis=1)[:, 0]


def no_match_categorical_axis0(x, key):
    """A draw over the batch dim (axis 0 of (B, V)): no form draws over a dim followed by others (a remark)."""
    return jax.random.categorical(key, x, axis=0)


def keras_hub_random(x, key):
    """keras-hub's RandomSampler as keras' JAX backend runs it: softmax(x / T), keras' random.categorical(log p, 1)
    (over (B, V, 1) along axis 1), squeezed."""
    log_probs = jnp.log(jax.nn.softmax(x / 0.7, axis=-1))
    return jnp.squeeze(jax.random.categorical(key, log_probs[..., None], shape=(x.shape[0], 1), axis=1), -1)


def keras_hub_top_k(x, key):
    """keras-hub's TopKSampler: top_k of the probabilities (not the logits), keras' categorical of their log in
    rank space, take_along_axis of the (B, 1) ids: the top_k_of_probs form."""
    values, ids = jax.lax.top_k(jax.nn.softmax(x / 0.7, axis=-1), 16)
    pick = jax.random.categorical(key, jnp.log(values)[..., None], shape=(x.shape[0], 1), axis=1)
    return jnp.squeeze(jnp.take_along_axis(ids, pick, axis=-1), -1)


def top_k_of_probs_at_t1(x, key):
    """The top k of softmax(x) with no temperature at all (nanoGPT-style code, keras-hub's TopKSampler at T = 1),
    drawn by a categorical of their log in rank space: top_k_of_probs at T = 1."""
    values, ids = jax.lax.top_k(jax.nn.softmax(x, axis=-1), 16)
    pick = jax.random.categorical(key, jnp.log(values), axis=-1)
    return jnp.take_along_axis(ids, pick[:, None], axis=-1)[:, 0]


def gemma_top_p(x, key):
    """gemma's TopPSampling: the temperature first, the nucleus of the scaled logits in vocabulary order, dropped
    logits at finfo.min: top_p_mask at T = 1 of x / T (the division stays in XLA)."""
    y = x / 0.7
    ordered = jnp.sort(y, axis=-1, descending=True)
    cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
    cutoff = jnp.take_along_axis(ordered, jnp.sum(cumulative < 0.9, axis=-1, keepdims=True), axis=-1)
    return jax.random.categorical(key, jnp.where(y < cutoff, jnp.finfo(y.dtype).min, y), axis=-1)


def _ascending_cutoff_sampler(x, key, count_fn):
    y = x / 0.6
    ordered = jnp.sort(y, axis=-1)
    cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
    cutoff = jnp.take_along_axis(ordered, count_fn(cumulative < 0.8), axis=-1)
    return jax.random.categorical(key, jnp.where(y < cutoff, jnp.finfo(y.dtype).min, y), axis=-1)


def gemma_3_1_top_p(x, key):
    """gemma 3.1.0's TopPSampling: the ascending sort, its cutoff index counted as `sum(mask < p)` of the boolean
    `cumsum < p` (the positions at or past p): top_p_ascending_count_mask."""
    return _ascending_cutoff_sampler(x, key, lambda below: jnp.sum(below < 0.8, axis=-1, keepdims=True))


def near_miss_ascending_count_below(x, key):
    """The ascending sort with the cutoff index `sum(cumsum < p)` (the positions below p): not gemma 3.1.0's count,
    so only the draw fuses."""
    return _ascending_cutoff_sampler(x, key, lambda below: jnp.sum(below, axis=-1, keepdims=True))


def scaled_then_top_k_mask_multinomial(x, key):
    """Hugging Face's TemperatureLogitsWarper then TopKLogitsWarper, drawn as torch.multinomial through torchax:
    top_k_mask_choice at T = 1 of x / T."""
    y = x / 0.8
    y = jnp.where(y < jax.lax.top_k(y, 20)[0][..., -1:], -jnp.inf, y)
    probs = jax.nn.softmax(y, axis=-1)
    rows = [jax.random.choice(key, y.shape[-1], (1,), replace=False, p=probs[i, :]) for i in range(y.shape[0])]
    return jnp.squeeze(jnp.array(rows), 1)


def torchax_top_k_warper_multinomial(x, key):
    """Hugging Face's TemperatureLogitsWarper and TopKLogitsWarper as torchax lowers them (torch.topk sorts its
    values again; the k-th read as [..., -1, None]), then torch.multinomial: top_k_mask_choice at T = 1."""
    y = x / 0.9
    kth = jnp.sort(jax.lax.top_k(y, 12)[0], axis=-1, descending=True)[..., -1][..., None]
    y = jnp.where(y < kth, -jnp.inf, y)
    probs = jax.nn.softmax(y, axis=-1)
    rows = [jax.random.choice(key, y.shape[-1], (1,), replace=False, p=probs[i, :]) for i in range(y.shape[0])]
    return jnp.squeeze(jnp.array(rows), 1)


def nanogpt_top_k_through_torchax(x, key):
    """nanoGPT's sampling step as torchax lowers it: logits / T, `v, _ = torch.topk(logits, k)` (its values sorted
    again), `logits[logits < v[:, [-1]]] = -inf` (the k-th read through the index list [-1]), softmax,
    torch.multinomial, reshape: top_k_mask_choice at T = 1."""
    y = x / 0.8
    kth = jnp.sort(jax.lax.top_k(y, 20)[0], axis=-1, descending=True)[:, jnp.array([-1], jnp.int32)]
    y = jnp.where(y < kth, jnp.broadcast_to(-jnp.inf, y.shape), y)
    probs = jax.nn.softmax(y, axis=-1)
    rows = [jax.random.choice(key, y.shape[-1], (1,), replace=False, p=probs[i, :]) for i in range(y.shape[0])]
    return jnp.array(rows).reshape(-1)


def torchax_top_p_warper_multinomial(x, key):
    """Hugging Face's TemperatureLogitsWarper and TopPLogitsWarper as torchax lowers them (jnp.sort and jnp.argsort,
    unstable; remove where the ascending cumsum of the sorted softmax is <= 1 - p but the largest; scattered back),
    then torch.multinomial: top_p_ascending_mask_choice at T = 1, p = 1 - f32(0.1)."""
    return _torchax_multinomial(_torchax_top_p_warper(x / 0.6, 0.9), key)


def torchax_min_p_warper_multinomial(x, key):
    """Hugging Face's TemperatureLogitsWarper and MinPLogitsWarper as torchax lowers them (remove where the
    softmax is below min_p times its max; the top token kept by a scatter of False at torch.topk's id), then
    torch.multinomial: min_p_removal_choice (its scaling inside the site)."""
    return _torchax_multinomial(_torchax_min_p_warper(x / 0.7, 0.05), key)


def _torchax_top_p_warper(y, p):
    """Hugging Face's TopPLogitsWarper as torchax lowers it: jnp.sort and jnp.argsort (unstable), remove where the
    ascending cumsum of the sorted softmax is <= 1 - p but the largest, scattered back, removed at -inf."""
    ordered, ids = jnp.sort(y, axis=-1, stable=False), jnp.argsort(y, axis=-1, stable=False)
    remove = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1) <= (1 - p)
    remove = remove.astype(jnp.int32).at[..., -1:].set(jnp.zeros((y.shape[0], 1), jnp.int32)) != 0
    rows = jnp.broadcast_to(jnp.arange(y.shape[0]).reshape(y.shape[0], 1), y.shape)
    return jnp.where(remove.at[(rows, ids)].set(remove[0:y.shape[0], 0:y.shape[1]]), -jnp.inf, y)


def _torchax_classic_top_p(y, p, at_or_above=False):
    """The classic top-p filter (Megatron-LM's `modify_logits_for_top_p_filtering`, Hugging Face's old
    `top_k_top_p_filtering`) as torchax lowers it: torch.sort(descending=True) (jnp.sort and jnp.argsort, unstable,
    each reversed), `filter_ = cumsum(softmax(sorted)) > p` (`>=`: a near miss), `filter_[:, 1:] = filter_[:, :-1]`,
    `filter_[..., 0] = 0`, `filter_.scatter(1, sorted_indices, filter_)`, `masked_fill_(filter_, -inf)`."""
    ordered = jnp.sort(y, axis=-1, stable=False)[..., ::-1]
    ids = jnp.argsort(y, axis=-1, stable=False)[..., ::-1]
    cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
    remove = cumulative >= p if at_or_above else cumulative > p
    remove = remove.at[:, 1:].set(remove[:, :-1])
    remove = remove.astype(jnp.int32).at[..., 0].set(jnp.zeros((y.shape[0],), jnp.int32)) != 0
    rows = jnp.broadcast_to(jnp.arange(y.shape[0]).reshape(y.shape[0], 1), y.shape)
    return jnp.where(remove.at[(rows, ids)].set(remove[0:y.shape[0], 0:y.shape[1]]), -jnp.inf, y)


def megatron_top_p_multinomial(x, key):
    """Megatron-LM's `sample` with a top-p (megatron-core's text generation controller) through torchax: `div_(T)`,
    the classic top-p, softmax, torch.multinomial: top_p_shifted_mask_choice."""
    return _torchax_multinomial(_torchax_classic_top_p(x / 0.7, 0.9), key)


def classic_top_p_categorical(x, key):
    """The classic top-p filter through torchax, drawn by jax.random.categorical at T = 1 (the logits scaled before
    it, as a JAX port would): top_p_shifted_mask."""
    return jax.random.categorical(key, _torchax_classic_top_p(x / 0.8, 0.85))


def old_hugging_face_top_k_top_p_multinomial(x, key):
    """Hugging Face's old `generate(do_sample=True)` (transformers 2.x, and the many copies of its
    `top_k_top_p_filtering`) through torchax: `scores / T`, the logits below torch.topk's k-th at -inf, the classic
    top-p, softmax, torch.multinomial: top_k_top_p_shifted_mask_choice."""
    y = x / 0.7
    values, ids = jax.lax.top_k(y, 40)
    values = jnp.sort(values, descending=True)
    kth = values[..., -1][..., None]
    return _torchax_multinomial(_torchax_classic_top_p(jnp.where(y < kth, -jnp.inf, y), 0.9), key)


def f32_below(value: float) -> float:
    """The f32 just below `value`'s f32: the threshold a `>=` compare is a `>` compare at (x >= q is x > prev(q))."""
    return float(np.nextafter(np.float32(value), np.float32(-np.inf)))


def f32_above(value: float) -> float:
    """The f32 just above `value`'s f32: the threshold a `<=` compare is a `<` compare at."""
    return float(np.nextafter(np.float32(value), np.float32(np.inf)))


def jax_top_k_by_sort_column(x, key):
    """A JAX engine's top-k (a Flax NNX sampler's): x / T, its k-th largest read as `jnp.sort(y)[..., -k]`, the logits
    at or above it kept, the others at finfo.min: EasyDeL's threshold (`jnp.sort(y)[:, ::-1][:, k - 1]`, the same
    column after hlofuse-prepare) with its fill, of y: top_k_keep_mask."""
    y = x.astype(jnp.float32) / 0.7
    kth = jnp.sort(y, axis=-1)[..., -40]
    return jax.random.categorical(key, jnp.where(y >= kth[..., None], y, jnp.finfo(jnp.float32).min), axis=-1)


def mingpt_jax_top_k_below_sort_column(x, key):
    """minGPT's top-k as JAX ports write it, of one row: x / T, `v = jnp.sort(y)[..., -k]`, the logits below
    `v[..., None]` at -inf, `jax.random.choice(key, V, shape=(), p=softmax)`: top_k_mask (its k-th by the sort is
    lax.top_k's but in a row with a NaN, which both keep) at T = 1, drawn by the inverse CDF."""
    y = x / 0.8
    v = jnp.sort(y, axis=-1)[..., -40]
    y = jnp.where(y < v[..., None], -jnp.inf, y)
    return jax.random.choice(key, y.shape[-1], shape=(), p=jax.nn.softmax(y))


def mingpt_jax_sample_with_log_softmax(x, key):
    """minGPT-jax's `sample` as it is written: of its (T, V) logits the last context position's row / T, the top-k
    below `jnp.sort(y)[..., -k]` at -inf, `jax.random.choice(key, V, shape=(), p=softmax(y))`, and it returns
    `jax.nn.log_softmax(y)` too, which reads the filtered logits (sharing the softmax's max and sum): the draw fuses
    whole as top_k_mask_inverse_cdf, and a remark says XLA still sorts the row for the log-softmax."""
    y = x[..., 6, :] / 0.8
    v = jnp.sort(y, axis=-1)[..., -40]
    y = jnp.where(y < v[..., jnp.newaxis], -jnp.inf, y)
    return jax.random.choice(key, y.shape[-1], shape=(), p=jax.nn.softmax(y)), jax.nn.log_softmax(y)


def jax_top_k_below_sort_slice(x, key):
    """The k-th read as `jnp.sort(y)[..., -k:][..., 0:1]` (a slice of a slice, one after hlofuse-prepare), the logits
    below it at -inf, a categorical of / T: top_k_mask."""
    kth = jnp.sort(x, axis=-1)[..., -40:][..., 0:1]
    return jax.random.categorical(key, jnp.where(x < kth, -jnp.inf, x) / 0.7, axis=-1)


def nnx_top_k_below_sort_scalar(x, key):
    """A Flax NNX port's top-k of one row: `kth = jnp.sort(y)[-k]` (a 0-d k-th), the logits below it at -inf, a
    categorical: top_k_mask at T = 1."""
    y = x / 0.8
    return jax.random.categorical(key, jnp.where(y < jnp.sort(y)[-40], -jnp.inf, y))


def nnx_top_k_then_top_p(x, key):
    """A Flax NNX sampler (a JAX port of a serving engine's): x / T, the top-k kept at or above `jnp.sort(y)[..., -k]`
    (finfo.min elsewhere), then the classic cut by `argsort(descending=True)` with `>= p` of the mass before each
    place, the sorted logits at finfo.min and scattered back, a categorical: top_k_keep_top_p_descending_mask at the
    float below p, with its fill."""
    y = x.astype(jnp.float32) / 0.7
    least = jnp.finfo(jnp.float32).min
    y = jnp.where(y >= jnp.sort(y, axis=-1)[..., -40][..., None], y, least)
    order = jnp.argsort(y, axis=-1, descending=True)
    ordered = jnp.take_along_axis(y, order, axis=-1)
    mass = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
    remove = jnp.concatenate([jnp.zeros_like(mass[..., :1]), mass[..., :-1] >= 0.9], axis=-1).astype(bool)
    ordered = jnp.where(remove, least, ordered)
    y = jnp.zeros_like(y).at[jnp.arange(y.shape[0])[:, None], order].set(ordered)
    return jax.random.categorical(key, y, axis=-1)


def mingpt_top_k_then_classic_top_p(x, key):
    """minGPT's top-k as JAX code writes it, then the classic cut by a flipped argsort (`jnp.roll` shift), both of
    x / T: top_k_top_p_flipped_mask."""
    y = x / 0.8
    y = jnp.where(y < jnp.sort(y, axis=-1)[..., -40][..., None], -jnp.inf, y)
    remove, _, order = jax_classic_removal(y, 0.9, "slice", "roll")
    return jax.random.categorical(key, jnp.where(jnp.take_along_axis(remove, jnp.argsort(order, axis=-1), axis=-1),
                                                 -jnp.inf, y))


def jax_top_k_then_unshifted_top_p_one_row(x, key):
    """A JAX chat demo's sampler of one row: x / T, minGPT's top-k (`jnp.sort(y)[-k]`), then the cut not shifted:
    `jnp.sort(y)[::-1]` beside `jnp.argsort(y)[::-1]`, the sorted logits at -inf where `cumsum > p`, scattered back
    into zeros, a categorical: top_k_top_p_unshifted_mask."""
    y = x / 0.7
    y = jnp.where(y < jnp.sort(y, axis=-1)[-40], -jnp.inf, y)
    ordered = jnp.sort(y, axis=-1)[::-1]
    mass = jnp.cumsum(jax.nn.softmax(ordered))
    order = jnp.argsort(y, axis=-1)[::-1]
    y = jnp.zeros_like(y).at[order].set(jnp.where(mass > 0.9, -jnp.inf, ordered))
    return jax.random.categorical(key, y)


def jax_unshifted_top_p(x, key):
    """The cut not shifted of (B, V) rows: the flipped argsort's order, `cumsum > p` removed as it is (the crossing
    token too), the mask put back by the order's argsort: top_p_unshifted_mask."""
    y = x / 0.8
    order = jnp.argsort(y, axis=-1)[..., ::-1]
    remove = jnp.cumsum(jax.nn.softmax(jnp.take_along_axis(y, order, axis=-1), axis=-1), axis=-1) > 0.9
    return jax.random.categorical(key, jnp.where(jnp.take_along_axis(remove, jnp.argsort(order, axis=-1), axis=-1),
                                                 -jnp.inf, y))


# A per-sequence sampler pipeline (equinox-style stages of one row (V,), vmapped over sequences by its caller): a
# temperature, a top-k kept at or above `jnp.sort(y, descending=True)[k - 1]`, the classic cut by
# `argsort(descending=True)` with its removal scattered back by the order (`.at[order].set`), a categorical.


def _sequence_top_k(y, k):
    return jnp.where(y >= jnp.sort(y, descending=True)[k - 1], y, -jnp.inf)


def _sequence_top_p(y, p):
    order = jnp.argsort(y, descending=True)
    removed = jnp.roll(jnp.cumsum(jax.nn.softmax(y[order])) > p, 1).at[0].set(False)
    return jnp.where(jnp.zeros_like(removed).at[order].set(removed), -jnp.inf, y)


def sequence_top_k(x, key):
    """One sequence's row: x / T, the top-k kept at or above the descending sort's k-th: top_k_keep_mask (of y, at
    T = 1: the scaling stays an elementwise op before the composite)."""
    return jax.random.categorical(key, _sequence_top_k(x / 0.7, 40))


def sequence_top_k_top_p(x, key):
    """One sequence's row: the top-k, then the classic cut scattered back by its order:
    top_k_keep_top_p_descending_mask."""
    return jax.random.categorical(key, _sequence_top_p(_sequence_top_k(x / 0.7, 40), 0.9))


def sequences_top_p_with_their_keys(x, key):
    """The per-sequence top-p vmapped over the batch and a key split per sequence (the scatter back and the argsort's
    ids become batched: one normal form with the batched code's): top_p_descending_mask_row_keys."""
    keys = jax.random.split(key, x.shape[0])
    return jax.vmap(lambda k, row: jax.random.categorical(k, _sequence_top_p(row / 0.8, 0.9)))(keys, x)


def sequences_top_k_top_p_with_their_keys(x, key):
    """The per-sequence top-k then top-p vmapped with a key per sequence: top_k_keep_top_p_descending_mask_row_keys."""
    keys = jax.random.split(key, x.shape[0])
    return jax.vmap(lambda k, row: jax.random.categorical(
        k, _sequence_top_p(_sequence_top_k(row / 0.7, 40), 0.9)))(keys, x)


def _log_space_min_p(y, min_p, log=math.log):
    """A min-p in logit space on one row, as serving pipelines write it: `where(y >= max(y) + log(min_p), y, -inf)`
    (log: `math.log`, a constant of the program, or `jnp.log`, its log op)."""
    return jnp.where(y >= jnp.max(y) + log(min_p), y, -jnp.inf)


def sequence_min_p_in_logit_space(x, key):
    """One sequence's row: x / T, then a min-p in logit space with math.log: min_p_log_constant_mask."""
    return jax.random.categorical(key, _log_space_min_p(x / 0.7, 0.05))


def sequence_min_p_in_logit_space_under_conds(x, key):
    """One row with each stage under `lax.cond(flag, stage, identity)` on a static flag, as generic JAX samplers write
    their pipeline, the min-p's log by jnp.log: min_p_log_mask."""
    y = jax.lax.cond(True, lambda v: v / 0.8, lambda v: v, x)
    y = jax.lax.cond(True, lambda v: _log_space_min_p(v, 0.1, jnp.log), lambda v: v, y)
    return jax.random.categorical(key, y)


def sequences_min_p_in_logit_space_with_their_keys(x, key):
    """The per-sequence logit-space min-p vmapped with a key per sequence: min_p_log_constant_mask_row_keys."""
    keys = jax.random.split(key, x.shape[0])
    return jax.vmap(lambda k, row: jax.random.categorical(k, _log_space_min_p(row / 0.7, 0.05)))(keys, x)


def min_p_in_logit_space_of_a_batch(x, key):
    """A batch's min-p in logit space at T = 1, its threshold a (B, 1) column: min_p_log_mask."""
    return jax.random.categorical(key, jnp.where(x >= jnp.max(x, axis=-1, keepdims=True) + jnp.log(0.1), x, -jnp.inf))


def _top_k_at_lax_kth(y, k):
    """The top-k kept at or above lax.top_k's k-th value: a scalar against one row (`lax.top_k(y, k)[0][-1]`), a
    (B, 1) column of a batch."""
    values = jax.lax.top_k(y, k)[0]
    return jnp.where(y >= (values[-1] if y.ndim == 1 else values[..., -1:]), y, -jnp.inf)


def sequence_top_k_at_lax_kth_under_conds(x, key):
    """One row, each stage under `lax.cond(flag, stage, identity)` on a static flag, as generic JAX samplers write
    their pipeline: x / T, then the top-k kept at or above lax.top_k's k-th: top_k_keep_by_top_k_mask."""
    y = jax.lax.cond(True, lambda v: v / 0.7, lambda v: v, x)
    y = jax.lax.cond(True, lambda v: _top_k_at_lax_kth(v, 40), lambda v: v, y)
    return jax.random.categorical(key, y)


def top_k_at_lax_kth_of_a_batch(x, key):
    """A batch's x / T, kept at or above lax.top_k's k-th as a (B, 1) column: top_k_keep_by_top_k_mask."""
    return jax.random.categorical(key, _top_k_at_lax_kth(x / 0.8, 16))


def sequences_top_k_at_lax_kth_with_one_key(x, key):
    """The per-sequence top-k at lax.top_k's k-th vmapped with one key: top_k_keep_by_top_k_mask_same_key_rows."""
    return jax.vmap(lambda row: jax.random.categorical(key, _top_k_at_lax_kth(row / 0.7, 40)))(x)


def _count_cutoff_top_p(y, p, keeps=jnp.greater_equal):
    """A top-p of one row by a count of its sorted probabilities, as generic JAX samplers write it: the places whose
    cumsum less 1e-8 is at most p, the sorted probability there the cutoff (0 past the end), y kept where its
    probability `keeps` against the cutoff (at or above it)."""
    probs = jax.nn.softmax(y)
    ordered = jnp.sort(probs)[::-1]
    count = jnp.sum((jnp.cumsum(ordered) - 1e-8) <= p)
    cutoff = jnp.where(count < len(ordered), ordered[count], 0.0)
    return jnp.where(keeps(probs, cutoff), y, -jnp.inf)


def sequence_top_p_by_count_cutoff_under_conds(x, key):
    """One row, each stage under `lax.cond(flag, stage, identity)` on a static flag: x / T, then the top-p by a count
    of sorted probabilities: top_p_count_cutoff_mask."""
    y = jax.lax.cond(True, lambda v: v / 0.7, lambda v: v, x)
    y = jax.lax.cond(True, lambda v: _count_cutoff_top_p(v, 0.9), lambda v: v, y)
    return jax.random.categorical(key, y)


def sequences_top_p_by_count_cutoff_with_their_keys(x, key):
    """The per-sequence count cutoff vmapped with a key per sequence, at T = 1: top_p_count_cutoff_mask_row_keys."""
    keys = jax.random.split(key, x.shape[0])
    return jax.vmap(lambda k, row: jax.random.categorical(k, _count_cutoff_top_p(row, 0.8)))(keys, x)


def sequences_top_p_by_count_cutoff_with_one_key(x, key):
    """The per-sequence count cutoff of x / T vmapped with one key: top_p_count_cutoff_mask_same_key_rows."""
    return jax.vmap(lambda row: jax.random.categorical(key, _count_cutoff_top_p(row / 0.6, 0.95)))(x)


def near_miss_count_cutoff_strictly_above(x, key):
    """The count cutoff keeping the probabilities strictly above the cutoff (its crossing token dropped, and every
    token of its probability): fused at its draw, the top-p left in XLA with a remark."""
    return jax.random.categorical(key, _count_cutoff_top_p(x / 0.7, 0.9, jnp.greater))


def sequence_chain_top_k_top_p_min_p(x, key):
    """One sequence's row through a pipeline of filters, each applied to the last one's logits (equinox-style): x / T,
    the top-k at the sort's k-th, the classic top-p by argsort, a min-p in logit space: min_p_log_constant_mask, the
    top-k and top-p taken in as its stages."""
    y = _sequence_top_p(_sequence_top_k(x / 0.7, 40), 0.9)
    return jax.random.categorical(key, _log_space_min_p(y, 0.05))


def sequences_chain_top_k_top_p_min_p_with_their_keys(x, key):
    """The per-sequence pipeline vmapped with a key per sequence: min_p_log_constant_mask_row_keys with its stages."""
    keys = jax.random.split(key, x.shape[0])
    return jax.vmap(lambda k, row: jax.random.categorical(
        k, _log_space_min_p(_sequence_top_p(_sequence_top_k(row / 0.7, 40), 0.9), 0.05)))(keys, x)


def sequence_chain_top_k_then_count_cutoff_under_conds(x, key):
    """A generic JAX pipeline, each stage under `lax.cond(flag, stage, identity)`: x / T, the top-k at lax.top_k's
    k-th, then the top-p by a count of sorted probabilities: top_p_count_cutoff_mask, the top-k its stage."""
    y = jax.lax.cond(True, lambda v: v / 0.7, lambda v: v, x)
    y = jax.lax.cond(True, lambda v: _top_k_at_lax_kth(v, 40), lambda v: v, y)
    y = jax.lax.cond(True, lambda v: _count_cutoff_top_p(v, 0.9), lambda v: v, y)
    return jax.random.categorical(key, y)


def chain_min_p_then_top_k_of_a_batch(x, key):
    """A batch's filters in another order: a min-p in logit space, then the top-k at lax.top_k's k-th, then x / T
    drawn: top_k_keep_by_top_k_mask, the min-p its stage."""
    y = jnp.where(x >= jnp.max(x, axis=-1, keepdims=True) + jnp.log(0.02), x, -jnp.inf)
    return jax.random.categorical(key, _top_k_at_lax_kth(y / 0.8, 16))


def chain_min_p_then_top_k_mask_of_a_batch(x, key):
    """A batch's x / T through a min-p in logit space, then the top-k mask below lax.top_k's k-th: top_k_mask (a form
    every kernel takes) at T = 1, the min-p its stage."""
    y = x / 0.8
    y = jnp.where(y >= jnp.max(y, axis=-1, keepdims=True) + jnp.log(0.02), y, -jnp.inf)
    return jax.random.categorical(key, jnp.where(y < jax.lax.top_k(y, 16)[0][..., -1:], -jnp.inf, y))


def _min_p_of_probs(y, min_p):
    probs = jax.nn.softmax(y, axis=-1)
    return jnp.where(probs < min_p * jnp.max(probs, axis=-1, keepdims=True), -jnp.inf, y)


def chain_min_p_of_probs_then_top_k(x, key):
    """A serving pipeline's order: x / T, a min-p of the probabilities, the top-k below lax.top_k's k-th:
    top_k_mask, the min-p (min_p_logits_mask) its stage."""
    y = _min_p_of_probs(x / 0.7, 0.05)
    return jax.random.categorical(key, jnp.where(y < jax.lax.top_k(y, 40)[0][..., -1:], -jnp.inf, y))


def chain_min_p_of_probs_then_temperature_then_top_k(x, key):
    """The temperature between two filters: a min-p of the raw logits' probabilities, then / T, then the top-k mask:
    top_k_mask, with the min-p and its temperature (a writing that divides after filtering) as the stage."""
    y = _min_p_of_probs(x, 0.05) / 0.7
    return jax.random.categorical(key, jnp.where(y < jax.lax.top_k(y, 40)[0][..., -1:], -jnp.inf, y))


def chain_flax_top_p_then_min_p_of_probs(x, key):
    """Flax's TopP warper (lax.top_k of the whole row, the kept scores put back by sort_key_val of their ids, no
    `where` at its end) before a min-p of the probabilities: min_p_logits_mask, the top-p its stage."""
    scores, ids = jax.lax.top_k(x / 0.7, x.shape[-1])
    keep = jnp.roll(jnp.cumsum(jax.nn.softmax(scores, axis=-1), axis=-1) < 0.9, 1)
    keep |= keep.at[:, 0].set(True)
    keep = keep.at[:, :1].set(True)
    y = jax.lax.sort_key_val(ids, jnp.where(keep, scores, jnp.full_like(scores, -jnp.inf)))[-1]
    return jax.random.categorical(key, _min_p_of_probs(y, 0.05))


def chain_top_k_then_top_a(x, key):
    """x-transformers' order: the top-k mask, then top-a of the probabilities: top_a_logits_mask, the top-k its
    stage."""
    y = x / 0.8
    y = jnp.where(y < jax.lax.top_k(y, 32)[0][..., -1:], -jnp.inf, y)
    probs = jax.nn.softmax(y, axis=-1)
    return jax.random.categorical(key, jnp.where(probs < jnp.max(probs, axis=-1, keepdims=True) ** 2 * 0.02,
                                                 -jnp.inf, y))


def near_miss_chain_stage_read_elsewhere(x, key):
    """The pipeline whose top-k output the program also returns: its min-p and top-p fuse, the top-k stays in XLA
    (its filtered logits have a reader outside the sampler)."""
    kept = _sequence_top_k(x / 0.7, 40)
    return jax.random.categorical(key, _log_space_min_p(_sequence_top_p(kept, 0.9), 0.05)), kept


def near_miss_min_p_in_logit_space_removal(x, key):
    """The logit-space min-p written as a removal (`where(y < threshold, -inf, y)`, which keeps a NaN the form drops):
    fused at its draw, the mask left in XLA with a remark."""
    y = x / 0.7
    return jax.random.categorical(key, jnp.where(y < jnp.max(y, -1, keepdims=True) + math.log(0.05), -jnp.inf, y))


def sequences_top_k_with_one_key(x, key):
    """The per-sequence top-k vmapped with one key for every sequence (its fill broadcast to the row, then to the
    batch): top_k_keep_mask_same_key_rows."""
    return jax.vmap(lambda row: jax.random.categorical(key, _sequence_top_k(row / 0.7, 40)))(x)


def jax_classic_top_p_roll(x, key):
    """The classic top-p as a JAX engine writes it: x / T, the rank-order removal shifted by `jnp.roll(remove, 1)` and
    `.at[:, 0].set(False)`, the mask put back by `take_along_axis(remove, argsort(order))`, -inf, a categorical:
    top_p_flipped_mask."""
    y = x / 0.7
    remove, _, order = jax_classic_removal(y, 0.9, "slice", "roll")
    inverse = jnp.argsort(order, axis=-1)
    return jax.random.categorical(key, jnp.where(jnp.take_along_axis(remove, inverse, axis=-1), -jnp.inf, y))


def jax_classic_top_p_sorted_logits(x, key):
    """The classic top-p with the shift as a concatenate of False, the sorted logits filled with -1e9 and put back by
    the argsort of the order: top_p_flipped_mask with its fill, by the logits."""
    y = x / 0.8
    remove, ordered, order = jax_classic_removal(y, 0.85, "slice", "concatenate")
    filtered = jnp.where(remove, -1e9, ordered)
    return jax.random.categorical(key, jnp.take_along_axis(filtered, jnp.argsort(order, axis=-1), axis=-1))


def jax_classic_top_p_pad(x, key):
    """The classic top-p by `jnp.flip(argsort)`, the shift by `jnp.pad`, at T = 1 of logits scaled before it:
    top_p_flipped_mask."""
    y = x / 0.9
    remove, _, order = jax_classic_removal(y, 0.95, "flip", "pad")
    return jax.random.categorical(key, jnp.where(jnp.take_along_axis(remove, jnp.argsort(order), axis=-1),
                                                 -jnp.inf, y))


def jax_classic_top_p_scattered_back(x, key):
    """The classic top-p with the sorted logits filled and scattered back to the order's places
    (`full_like(y, -inf).at[rows, order].set(...)`): top_p_flipped_mask by the logits."""
    y = x / 0.7
    remove, ordered, order = jax_classic_removal(y, 0.9, "slice", "roll")
    rows = jnp.arange(y.shape[0])[:, None]
    return jax.random.categorical(key, jnp.full_like(y, -jnp.inf).at[rows, order].set(
        jnp.where(remove, -jnp.inf, ordered)))


def jax_classic_top_p_sorted_apart(x, key):
    """The classic top-p with the logits sorted by `jnp.sort(y)[:, ::-1]` beside the order `argsort(y)[:, ::-1]` (two
    sorts of one row: hlofuse-prepare sorts it once) and the mask scattered to the order's places:
    top_p_flipped_mask."""
    y = x / 0.7
    remove, _, order = jax_classic_removal(y, 0.9, "sort", "roll")
    return jax.random.categorical(key, jnp.where(jax_put_back(order, remove, "scatter"), -jnp.inf, y))


def jax_classic_top_p_descending_argsort(x, key):
    """The JAX classic top-p with `argsort(y, descending=True)` (equal values by the lower id first):
    top_p_descending_mask."""
    y = x / 0.7
    order = jnp.argsort(y, axis=-1, descending=True)
    remove = jnp.cumsum(jax.nn.softmax(jnp.take_along_axis(y, order, axis=-1), axis=-1), axis=-1) > 0.9
    remove = jnp.roll(remove, 1, axis=-1).at[:, 0].set(False)
    return jax.random.categorical(key, jnp.where(jnp.take_along_axis(remove, jnp.argsort(order), axis=-1),
                                                 -jnp.inf, y))


def jax_classic_top_p_descending_at_or_above(x, key):
    """A Flax NNX engine's nucleus: `argsort(y, descending=True)`, the mass before each place compared `>= p` on the
    cumsum's slice, float zeros concatenated in front (a float mask, read `!= 0` by `where`), the sorted logits at
    finfo.min there, scattered back into zeros: top_p_descending_mask by the logits with its fill, at the f32 below
    p."""
    y = x.astype(jnp.float32) / 0.7
    order = jnp.argsort(y, axis=-1, descending=True)
    ordered = jnp.take_along_axis(y, order, axis=-1)
    cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
    remove = jnp.concatenate([jnp.zeros_like(cumulative[..., :1]), cumulative[..., :-1] >= 0.9], axis=-1)
    ordered = jnp.where(remove, jnp.finfo(jnp.float32).min, ordered)
    rows = jnp.arange(y.shape[0])[:, None]
    return jax.random.categorical(key, jnp.zeros_like(y).at[rows, order].set(ordered), axis=-1)


def jax_classic_top_p_one_row(x, key):
    """The JAX classic top-p of one row (V,), as engines write it at batch 1: `argsort(y)[::-1]`, `y[order]`, `[False]`
    concatenated with `cumsum[:-1] >= p`, the sorted logits at -inf there set back by `.at[order].set`:
    top_p_flipped_mask by the logits, at the f32 below p."""
    y = x / 0.8
    order = jnp.argsort(y)[::-1]
    ordered = y[order]
    cumulative = jnp.cumsum(jax.nn.softmax(ordered))
    remove = jnp.concatenate([jnp.array([False]), cumulative[:-1] >= 0.85])
    return jax.random.categorical(key, jnp.full_like(y, -jnp.inf).at[order].set(jnp.where(remove, -jnp.inf, ordered)))


def jax_classic_top_p_one_row_sorted_apart(x, key):
    """The JAX classic top-p of one row with `jnp.sort(y)[::-1]` beside `argsort(y)[::-1]`, the shift by roll and set,
    the mask scattered to the order's places: top_p_flipped_mask."""
    y = x / 0.7
    ordered = jnp.sort(y)[::-1]
    remove = jnp.roll(jnp.cumsum(jax.nn.softmax(ordered)) > 0.9, 1).at[0].set(False)
    mask = jnp.zeros_like(y, dtype=bool).at[jnp.argsort(y)[::-1]].set(remove)
    return jax.random.categorical(key, jnp.where(mask, -jnp.inf, y))


def _x_transformers_top_p(x, p):
    """x-transformers' `top_p` filter through torchax: torch.sort(descending=True), `cumsum > p`, `F.pad(..., (1, -1),
    value=False)` (a slice and a pad), the sorted logits set to -inf there and scattered back by the sorted ids."""
    ordered = jnp.sort(x, axis=-1, stable=False)[..., ::-1]
    ids = jnp.argsort(x, axis=-1, stable=False)[..., ::-1]
    remove = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1) > p
    remove = jnp.pad(remove[:, :-1], ((0, 0), (1, 0)), constant_values=False)
    ordered = jnp.where(remove, -jnp.inf, ordered)
    rows = jnp.broadcast_to(jnp.arange(x.shape[0]).reshape(x.shape[0], 1), x.shape)
    return ordered.at[(rows, ids)].set(ordered)


def x_transformers_top_p_multinomial(x, key):
    """x-transformers' `generate` with its `top_p` filter (`_x_transformers_top_p`), then softmax(filtered / T) and
    torch.multinomial: top_p_shifted_logits_mask_choice."""
    return _torchax_multinomial(_x_transformers_top_p(x, 0.9) / 0.8, key)


def lucidrains_gumbel_top_p(x, key):
    """x-transformers' `top_p` filter drawn by its file's `gumbel_sample` (argmax(filtered / T + -log(-log(u))), each
    log clamped at 1e-20, through torchax): top_p_shifted_logits_mask, with `gumbel_at_zero`."""
    return jnp.argmax(_x_transformers_top_p(x, 0.9) / 0.8 + _hand_gumbel(key, x.shape, clamp=True, torch=True) * 1,
                      axis=-1)


def x_transformers_top_k_multinomial(x, key):
    """x-transformers' `generate` with its default filter, `top_k` (k = ceil(0.1 * V)), through torchax: torch.topk's
    values and ids scattered into a (B, V) row of -inf (`full_like(-inf).scatter_(1, ind, val)`), then
    softmax(filtered / T) and torch.multinomial: top_k_exact_mask_choice."""
    k = -(-x.shape[-1] // 10)
    values, ids = jax.lax.top_k(x, k)
    values = jnp.sort(values, descending=True)
    ids = jnp.take_along_axis(ids, jnp.argsort(values, descending=True), axis=-1)
    rows = jnp.broadcast_to(jnp.arange(x.shape[0]).reshape(x.shape[0], 1), (x.shape[0], k))
    kept = jnp.full_like(x, -jnp.inf).at[(rows, ids)].set(values[0:x.shape[0], 0:k])
    return _torchax_multinomial(kept / 0.9, key)


def _x_transformers_min_p(x, min_p):
    """x-transformers' `min_p` filter through torchax: softmax of the logits themselves, `torch.where(probs < min_p *
    probs.amax(-1, keepdim=True), -inf, logits)`."""
    probs = jax.nn.softmax(x, axis=-1)
    return jnp.where(probs < jnp.max(probs, axis=-1, keepdims=True) * min_p, -jnp.inf, x)


def x_transformers_min_p_multinomial(x, key):
    """x-transformers' `generate` with its `min_p` filter, then softmax(filtered / T) and torch.multinomial:
    min_p_logits_mask_choice (the min-p of the logits, not of x / T)."""
    return _torchax_multinomial(_x_transformers_min_p(x, 0.1) / 0.8, key)


def x_transformers_min_p_categorical(x, key):
    """x-transformers' `min_p` filter, then a categorical of filtered / T: min_p_logits_mask."""
    return jax.random.categorical(key, _x_transformers_min_p(x, 0.1) / 0.8)


def _top_a(x, ratio, square):
    """Top-a of the logits' own softmax: `torch.where(probs < square(probs.amax(-1, keepdim=True)) * ratio, -inf, x)`
    (x-transformers' `top_a`, torch.pow(max, 2.0) through torchax; or `max ** 2` in JAX, RWKV's rule)."""
    probs = jax.nn.softmax(x, axis=-1)
    return jnp.where(probs < square(jnp.max(probs, axis=-1, keepdims=True)) * ratio, -jnp.inf, x)


def x_transformers_top_a_multinomial(x, key):
    """x-transformers' `generate` with its `top_a` filter at its defaults (min_p_pow=2.0, min_p_ratio=0.02), then
    softmax(filtered / T) and torch.multinomial: top_a_logits_mask_choice."""
    return _torchax_multinomial(_top_a(x, 0.02, lambda m: jnp.power(m, 2.0)) / 0.8, key)


def top_a_squared_categorical(x, key):
    """Top-a with the square written `** 2` (a multiply), a = 0.2, then a categorical of filtered / T."""
    return jax.random.categorical(key, _top_a(x, 0.2, lambda m: m**2) / 0.7)


def near_miss_top_a_cubed(x, key):
    """A top-a whose limit is the cube of the largest probability (min_p_pow=3.0): not top-a, whose square the form
    fixes; fused at its draw, the filter left in XLA with a remark."""
    return jax.random.categorical(key, _top_a(x, 0.2, lambda m: jnp.power(m, 3.0)) / 0.7)


def _hand_gumbel(key, shape, eps=1e-20, clamp=False, torch=False):
    """A Gumbel noise written by hand: -log(-log(u)) of a uniform u, each log guarded by eps, added (PaLM-jax's
    `log(t + eps)`) or clamped (lucidrains' `t.clamp(min=eps).log()`), in JAX or as torchax lowers torch (`-1 * x`)."""
    def log(t):
        return jnp.log(jnp.clip(t, eps, None) if clamp else t + eps)

    def neg(t):
        return -1 * t if torch else -t

    return neg(log(neg(log(jax.random.uniform(key, shape, minval=0.0, maxval=1.0)))))


def palm_gumbel_sample(x, key):
    """PaLM-jax's (and progen's) sampler without top-k: argmax(logits / T + its hand-written noise), whose eps 1e-20
    changes the noise only where the uniform is 0: temperature, with `gumbel_at_zero`."""
    return jnp.argmax(x / 0.8 + _hand_gumbel(key, x.shape), axis=-1)


def lucidrains_gumbel_top_k(x, key):
    """lucidrains' `gumbel_sample` (x-transformers' `-log(-log(torch.rand_like(t)))`, each log clamped at 1e-20)
    of a top-k mask (`x < kth` at -inf), through torchax: top_k_mask, with `gumbel_at_zero`."""
    kth = jax.lax.top_k(x, 16)[0][..., -1:]
    y = jnp.where(x < kth, -jnp.inf, x) / 0.9
    return jnp.argmax(y + _hand_gumbel(key, x.shape, clamp=True, torch=True) * 1, axis=-1)


def hand_gumbel_of_log_softmax(x, key):
    """argmax(log_softmax(x / T) + a hand-written noise, each log clamped in JAX): temperature_log_softmax."""
    return jnp.argmax(jax.nn.log_softmax(x / 0.7, axis=-1) + _hand_gumbel(key, x.shape, clamp=True), axis=-1)


def near_miss_hand_gumbel_large_eps(x, key):
    """A hand-written noise whose eps (1e-10) moves the noise of the smallest uniforms too: no kernel draws it."""
    return jnp.argmax(x + _hand_gumbel(key, x.shape, eps=1e-10), axis=-1)


def hand_gumbel_unguarded(x, key):
    """-log(-log(u)) with no guard, its outer log subtracted: -inf where the uniform is 0, which every kernel draws
    (NaN for a logit of +inf): categorical, with `gumbel_at_zero` -inf."""
    u = jax.random.uniform(key, x.shape)
    return jnp.argmax(x - jnp.log(-jnp.log(u)), axis=-1)


def near_miss_hand_gumbel_of_one_minus_u(x, key):
    """-log(-log1p(-u)), a Gumbel noise of 1 - u: another noise than JAX's, which no writing takes."""
    u = jax.random.uniform(key, x.shape)
    return jnp.argmax(x - jnp.log(-jnp.log1p(-u)), axis=-1)


def classic_top_p_at_or_above(x, key):
    """The classic top-p with `>=` for `>` (a place whose mass before it is exactly p is removed too): `cumsum >= p`
    is `cumsum > p'` at the f32 p' just below p, so top_p_shifted_mask_choice at p'."""
    return _torchax_multinomial(_torchax_classic_top_p(x / 0.7, 0.9, at_or_above=True), key)


def _torchax_min_p_warper(y, min_p):
    """Hugging Face's MinPLogitsWarper as torchax lowers it: remove where the softmax is below min_p times its max,
    the top token kept by a scatter of False at torch.topk's id, removed at -inf."""
    probs = jax.nn.softmax(y, axis=-1)
    remove = probs < min_p * jnp.max(probs, axis=-1, keepdims=True)
    values, ids = jax.lax.top_k(probs, 1)
    ids = jnp.take_along_axis(ids, jnp.argsort(jnp.sort(values, descending=True), axis=-1, descending=True), axis=-1)
    rows = jnp.broadcast_to(jnp.arange(y.shape[0]).reshape(y.shape[0], 1), ids.shape)
    return jnp.where(remove.at[(rows, ids)].set(False), -jnp.inf, y)


def _torchax_top_k_warper(y, k):
    kth = jnp.sort(jax.lax.top_k(y, k)[0], axis=-1, descending=True)[..., -1][..., None]
    return jnp.where(y < kth, -jnp.inf, y)


def _torchax_multinomial(y, key):
    """softmax, then torch.multinomial (`_multinomial`)."""
    return _multinomial(jax.nn.softmax(y, axis=-1), key)


def torchax_top_k_top_p_warpers_multinomial(x, key):
    """transformers 4.x's Llama-3 config (Temperature, its default TopK(50), TopP) as torchax lowers it, then
    torch.multinomial: top_k_top_p_ascending_mask_choice at T = 1 of x / T."""
    return _torchax_multinomial(_torchax_top_p_warper(_torchax_top_k_warper(x / 0.6, 50), 0.9), key)


def torchax_top_p_min_p_warpers_multinomial(x, key):
    """generate()'s Temperature, TopP then MinP (transformers 5.x's order) as torchax lowers them, then
    torch.multinomial: top_p_min_p_removal_choice with T inside the site."""
    return _torchax_multinomial(_torchax_min_p_warper(_torchax_top_p_warper(x / 0.7, 0.9), 0.05), key)


def _torch_top_k_scattered(row, k):
    """litgpt's `torch.full_like(row, -inf).scatter_(-1, i, v)` of `v, i = torch.topk(row, k)` as torchax lowers it."""
    values, ids = jax.lax.top_k(row, k)
    values = jnp.sort(values, descending=True)
    ids = jnp.take_along_axis(ids, jnp.argsort(values, descending=True), axis=-1)
    return jnp.full_like(row, -jnp.inf).at[ids].set(values)


def _multinomial_with_replacement(probs, key):
    """torch.multinomial(probs, 1, replacement=True).squeeze(1) as torchax lowers it: jax.random.choice with
    replacement per row, one key (an inverse-CDF draw: every row searches its cumsum at the same uniform)."""
    rows = [jax.random.choice(key, probs.shape[-1], (1,), replace=True, p=probs[i, :]) for i in range(probs.shape[0])]
    return jnp.squeeze(jnp.array(rows), 1)


def multinomial_with_replacement_temperature(x, key):
    return _multinomial_with_replacement(jax.nn.softmax(x / 0.7, axis=-1), key)


def multinomial_with_replacement_top_k_mask(x, key):
    """A top-k mask (`logits < topk(...)[..., -1]`) then torch.multinomial with replacement: top_k_mask_inverse_cdf."""
    y = x / 0.8
    kth = jax.lax.top_k(y, 16)[0][..., -1:]
    return _multinomial_with_replacement(jax.nn.softmax(jnp.where(y < kth, -jnp.inf, y), axis=-1), key)


def choice_of_one_row_temperature(x, key):
    """`jax.random.choice(key, V, p=softmax(x / T))` of one row (replace=True, its default): an inverse-CDF draw."""
    return jax.random.choice(key, x.shape[-1], p=jax.nn.softmax(x / 0.9))


def choice_of_one_row_top_k_mask(x, key):
    """A one-row top-k mask, then jax.random.choice with its default replacement: top_k_mask_inverse_cdf."""
    y = x / 0.8
    kth = jax.lax.top_k(y, 40)[0][-1]
    return jax.random.choice(key, y.shape[-1], p=jax.nn.softmax(jnp.where(y < kth, -jnp.inf, y)))


def _torchax_exponential_(like):
    """`torch.empty_like(like).exponential_(1)` as torchax's aten.exponential_ rule writes it: its key PRNGKey(0),
    made in the program. (torchax 0.0.13 loses the in-place write under jax.jit, where q is zeros: the torchtune
    fixtures in test/fixtures/samplers; this is the program once it does not.)"""
    return jnp.empty_like(like).at[:].set(jax.random.exponential(jax.random.PRNGKey(0), like.shape) / 1.0)


def gpt_fast_top_k_race(x):
    """gpt-fast's `sample` of one row (`logits[0, -1]`) through torchax: / max(T, 1e-5), the top-k pivot mask
    (`v.select(-1, -1).unsqueeze(-1)`), softmax, then `multinomial_sample_one_no_sync`, argmax(probs / q) of
    exponential noise q (`exponential_`, whose key torchax fixes: PRNGKey(0), computed in the program, is the
    composite's key operand): top_k_mask_exponential_race, T applied in front."""
    y = x[0] / max(0.8, 1e-5)
    pivot = jax.lax.top_k(y, 40)[0][-1][None]
    probs = jax.nn.softmax(jnp.where(y < pivot, -jnp.inf, y), axis=-1)
    return jnp.argmax(probs / _torchax_exponential_(probs), axis=-1, keepdims=True).astype(jnp.int32)


def torchtune_top_k_race(x):
    """torchtune's `sample` of (B, V) logits through torchax: / T, the top-k pivot mask, softmax, then
    `multinomial_sample_one(probs, q)` of `q = torch.empty_like(probs).exponential_(1)`: (B, 1) ids."""
    y = x / 0.6
    pivot = jax.lax.top_k(y, 16)[0][..., -1][..., None]
    probs = jax.nn.softmax(jnp.where(y < pivot, -jnp.inf, y), axis=-1)
    return jnp.argmax(probs / _torchax_exponential_(probs), axis=-1, keepdims=True).astype(jnp.int32)


def torchtune_race_under_jit(x):
    """torchtune's `sample` as torchax 0.0.13 lowers it under jax.jit: `exponential_`'s in-place write is lost, so q is
    the empty tensor's zeros and the race is argmax(probs / 0): greedy over it, the top-k, softmax and division by 0
    named in the remark (test_library_samplers checks the division's part of it on torchtune's own module)."""
    y = x / 0.6
    probs = jax.nn.softmax(jnp.where(y < jax.lax.top_k(y, 16)[0][..., -1][..., None], -jnp.inf, y), axis=-1)
    return jnp.argmax(probs / jnp.zeros_like(probs), axis=-1, keepdims=True).astype(jnp.int32)


def exponential_race_temperature(x, key):
    """The exponential race written in JAX with a key of its own: argmax(softmax(x / T) / exponential(key))."""
    probs = jax.nn.softmax(x / 0.7, axis=-1)
    return jnp.argmax(probs / jax.random.exponential(key, probs.shape), axis=-1)


def exponential_race_top_k(x, key):
    """torchtune's `sample` written in JAX with a key of its own: / T, the top-k pivot mask, softmax, the race."""
    y = x / 0.6
    probs = jax.nn.softmax(jnp.where(y < jax.lax.top_k(y, 50)[0][..., -1:], -jnp.inf, y), axis=-1)
    return jnp.argmax(probs / jax.random.exponential(key, probs.shape), axis=-1)


def exponential_race_top_p(x, key):
    """A sorted top-p mask (`_mask_top_p`'s descending cumsum), then the exponential race of vLLM's sampler."""
    y = x / 0.9
    ordered = jnp.sort(y, axis=-1, descending=True)
    cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
    cutoff_index = jnp.sum(cumulative < 0.9, axis=-1, keepdims=True)
    cutoff = jnp.take_along_axis(ordered, cutoff_index, axis=-1)
    probs = jax.nn.softmax(jnp.where(y < cutoff, -jnp.inf, y), axis=-1)
    return jnp.argmax(probs / jax.random.exponential(key, probs.shape), axis=-1)


def near_miss_race_of_logits(x, key):
    """argmax(logits / q): the race divides the logits, not their probabilities (no form: a remark)."""
    return jnp.argmax(x / jax.random.exponential(key, x.shape), axis=-1)


def mtj_nucleaus_sample(x, key):
    """mesh-transformer-jax's (GPT-J's) `nucleaus_sample(key, logits, _, top_p=0.9, temp=0.8)`: `nucleaus_filter`'s
    descending jnp.sort and argsort, cumsum of the sorted softmax, the shifted `> top_p` removal put back by
    `lax.sort_key_val`, `logits -= 1e10 * removed`, then `jax.random.categorical(key, logits / temp)`."""
    sorted_logits = jnp.sort(x)[:, ::-1]
    sorted_indices = jnp.argsort(x)[:, ::-1]
    cumulative_probs = jnp.cumsum(jax.nn.softmax(sorted_logits), axis=-1)
    to_remove = cumulative_probs > 0.9
    to_remove = jnp.concatenate((jnp.zeros_like(to_remove[:, :1]), to_remove), axis=-1)[:, :-1]
    _, indices_to_remove = jax.lax.sort_key_val(sorted_indices, to_remove)
    x = x - 1e10 * indices_to_remove
    return jax.random.categorical(key, x / 0.8, -1).astype(jnp.uint32)


def mtj_removal_at_or_above(x, key):
    """mesh-transformer-jax's nucleus with `>= top_p`: its `> p'` at the f32 p' just below p (top_p_mtj_mask)."""
    ordered, ids = jnp.sort(x)[:, ::-1], jnp.argsort(x)[:, ::-1]
    remove = jnp.cumsum(jax.nn.softmax(ordered), axis=-1) >= 0.9
    remove = jnp.concatenate((jnp.zeros_like(remove[:, :1]), remove), axis=-1)[:, :-1]
    return jax.random.categorical(key, (x - 1e10 * jax.lax.sort_key_val(ids, remove)[1]) / 0.8, -1)


def _levanter_nucleus(y, p, keep_at_or_below=False):
    """Levanter's (marin's) `Sampler._apply_top_p` of y, written its way: a stable argsort reversed, the logits taken
    along it, the cumsum of their softmax, `cumsum < clip(p, 0, 1)[..., None] - 1e-4` (a tolerance in jnp, f32)
    shifted by a concatenate of ones, -inf, back by a take along the argsort of the order. `keep_at_or_below`: `<=`,
    another cut."""
    order = jnp.argsort(y, axis=-1)[..., ::-1]
    ordered = jnp.take_along_axis(y, order, axis=-1)
    cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
    threshold = jnp.clip(jnp.asarray(p, dtype=jnp.float32), min=0.0, max=1.0)[..., None]
    tolerance = jnp.asarray(1e-4, dtype=cumulative.dtype)
    keep = cumulative <= threshold - tolerance if keep_at_or_below else cumulative < threshold - tolerance
    keep = jnp.concatenate([jnp.ones_like(keep[..., :1], dtype=bool), keep[..., :-1]], axis=-1)
    kept = jnp.where(keep, ordered, -jnp.inf)
    return jnp.take_along_axis(kept, jnp.argsort(order, axis=-1), axis=-1)


def _levanter_sample(x, key, keep_at_or_below=False):
    """Levanter's `Sampler` at T = 0.7 and top_p = 0.9 (Python numbers): the logits in f32 over a T with 0 made 1, its
    top-p under `lax.cond(jnp.all(p >= 1.0), ...)` (a constant guard), then the Gumbel argmax it draws by."""
    y = x.astype(jnp.float32) / jnp.where(jnp.asarray(0.7) == 0, 1.0, 0.7)
    y = jax.lax.cond(jnp.all(jnp.asarray(0.9) >= 1.0), lambda: y, lambda: _levanter_nucleus(y, 0.9, keep_at_or_below))
    return jnp.argmax(y + jax.random.gumbel(key, y.shape, dtype=y.dtype), axis=-1).astype(jnp.int32)


def levanter_top_p_sample(x, key):
    return _levanter_sample(x, key)


def levanter_top_p_sample_with_log_prob(x, key):
    """Levanter's `Sampler` as it runs by default (`return_log_probs=True`): the token and its log-probability under the
    filtered logits, `take_along_axis(y, token) - logsumexp(y)`: the composite gives those logits back (`scores`)."""
    y = x.astype(jnp.float32) / 0.7
    y = _levanter_nucleus(y, 0.9)
    token = jnp.argmax(y + jax.random.gumbel(key, y.shape, dtype=y.dtype), axis=-1).astype(jnp.int32)
    picked = jnp.take_along_axis(y, token[:, None], axis=-1)[:, 0]
    return token, picked - jax.nn.logsumexp(y, axis=-1)


def near_miss_levanter_keep_at_or_below(x, key):
    """Levanter's nucleus with `<=`: another cut (no form; a remark)."""
    return _levanter_sample(x, key, keep_at_or_below=True)


def _haiku_top_p_filter(logits, top_p, fill=-1e10, cut_above=False):
    """The nucleus of DeepMind's Haiku samplers (`nucleus_sample`) and grok-1's `top_p_filter`, written their way:
    `lax.sort(logits, is_stable=False)`, the cumsum of its softmax, `argmax(cumsum >= 1 - top_p)` as the place of the
    cut, the sorted logit there taken along the last axis, and `where(logits >= it, logits, fill)`. `cut_above`:
    `>`, another cut."""
    sorted_logits = jax.lax.sort(logits, is_stable=False)
    sorted_probs = jax.nn.softmax(sorted_logits)
    threshold_idx = jnp.argmax(jnp.cumsum(sorted_probs, -1) >= 1 - top_p, axis=-1)
    threshold_largest_logits = jnp.take_along_axis(sorted_logits, threshold_idx[..., jnp.newaxis], axis=-1)
    mask = logits > threshold_largest_logits if cut_above else logits >= threshold_largest_logits
    return jnp.where(mask, logits, fill)


def haiku_nucleus_sample(x, key):
    """Haiku's `nucleus_sample(logits, top_p=0.9)`: no temperature, the dropped at -1e10 (`mask_logits`), then
    `sample`: a categorical of the f32 logits, as int32."""
    return jax.random.categorical(key, _haiku_top_p_filter(x, 0.9).astype(jnp.float32)).astype(jnp.int32)


def haiku_nucleus_decode_rows(x, key):
    """The same nucleus of (B, 1, V) decode logits over a temperature (grok-1's `top_p_filter` at a Python p, as a
    one-request copy calls it), the dropped at -1e10, then a categorical."""
    return jax.random.categorical(key, _haiku_top_p_filter(x[:, None, :] / 0.7, 0.95))


def grok_sample_token(x, key):
    """xai-org/grok-1's `sample_token` (runners.py) as written: its SampleSettings' T and p per row expanded to
    (B, 1, 1) and its mask of allowed tokens to (B, 1, V) (here computed from the logits' spread and the ids, standing
    in for the requests' settings), / T, the disallowed at -1e10, `top_p_filter`, `jax.vmap(jax.random.categorical)`
    with a key per row, and the filtered logits read again: the drawn token's probability and the top 8 (the
    composite gives them back)."""
    rows, vocab = x.shape[0], x.shape[-1]
    spread = jnp.std(x[:, 0, :].astype(jnp.float32), axis=-1)  # (f32 settings, as grok's SampleSettings are)
    temperature = jnp.expand_dims(0.5 + 0.5 * jax.nn.sigmoid(spread), (1, 2))
    nucleus_p = jnp.expand_dims(0.6 + 0.35 * jax.nn.sigmoid(-spread), (1, 2))
    allowed = jnp.broadcast_to(jnp.arange(vocab) % 11 != 0, (rows, vocab)).astype(jnp.int32)
    mask = jnp.expand_dims(allowed, 1)
    logits = x / temperature.astype(x.dtype)
    logits = jnp.where(mask, logits, -1e10)
    logits = _haiku_top_p_filter(logits, nucleus_p.astype(logits.dtype))
    new_token = jax.vmap(jax.random.categorical)(jax.random.split(key, rows), logits)
    probabilities = jax.nn.softmax(logits)
    token_prob = jnp.squeeze(jnp.take_along_axis(probabilities, jnp.expand_dims(new_token, 1), axis=2), 1)
    top_k_probs, top_k_token_ids = jax.lax.top_k(probabilities, 8)
    return new_token, token_prob, jnp.squeeze(top_k_token_ids, 1), jnp.squeeze(top_k_probs, 1)


_SIMPLY_NEG_INF = float(-0.5 * np.finfo(np.float32).max)  # simply's `common.neg_inf(float32)`


def _simply_top_p_mask(logits, top_p):
    probs = jax.nn.softmax(logits, axis=-1)
    indices = jnp.argsort(logits, axis=-1, descending=True)
    cumsum = jnp.cumulative_sum(jnp.take_along_axis(probs, indices, axis=-1), axis=-1, include_initial=True)
    return jax.lax.sort_key_val(indices, cumsum[..., :-1] < top_p, dimension=-1)[1]


def simply_top_p_inclusive(x, key):
    """simply's nucleus with `<=` for its `<`: `c <= p` is `c < p'` at the f32 p' just above p, so top_p_simply_mask
    at p'."""
    y = x / 0.7
    probs = jax.nn.softmax(y, axis=-1)
    indices = jnp.argsort(y, axis=-1, descending=True)
    cumsum = jnp.cumulative_sum(jnp.take_along_axis(probs, indices, axis=-1), axis=-1, include_initial=True)
    keep = jax.lax.sort_key_val(indices, cumsum[..., :-1] <= 0.9, dimension=-1)[1]
    return jax.random.categorical(key, jnp.where(keep, y, _SIMPLY_NEG_INF))


def _simply_top_k_top_p_mask(logits, top_k, top_p):
    values, ids = jax.lax.top_k(logits, max(min(top_k, logits.shape[-1]), 1))
    cumsum = jnp.cumulative_sum(jax.nn.softmax(values, axis=-1), axis=-1, include_initial=True)
    picked = jax.nn.one_hot(ids, logits.shape[-1], dtype=jnp.bool_) & (cumsum[..., :-1] < top_p)[..., None]
    return jnp.any(picked, axis=-2)


def _simply_sample(x, key, temperature, top_k=-1, top_p=1.0):
    """google-deepmind/simply's `sample_from_logits` as written: its lax.conds on the Python settings (folded by
    hlofuse-prepare), y = f32 x / T, the mask of the branch taken (a top-k as a one-hot of lax.top_k's ids, the
    nucleus put back by sort_key_val, or both fused over the top k), `MaskedCategorical`'s `where(mask, y,
    -0.5 * finfo.max)` drawn by jax.random.categorical, and the token's log-probability under the masked logits (a
    one-hot gather of their log_softmax): the composite gives those back (`scores`)."""
    def masked_sample(y):
        y = y / temperature
        mask = jax.lax.cond(
            jnp.logical_and(top_k > 0, top_p < 1), lambda: _simply_top_k_top_p_mask(y, top_k, top_p),
            lambda: jax.lax.cond(
                top_k > 0,
                lambda: jnp.any(jax.nn.one_hot(jax.lax.top_k(y, max(min(top_k, y.shape[-1]), 1))[1], y.shape[-1],
                                               dtype=jnp.bool_), axis=-2),
                lambda: _simply_top_p_mask(y, top_p)))
        masked = jnp.where(mask, y, jnp.astype(_SIMPLY_NEG_INF, y.dtype))
        tokens = jax.random.categorical(key, masked)
        one_hot = jax.nn.one_hot(tokens, masked.shape[-1], dtype=masked.dtype)
        return tokens, jnp.sum(one_hot * jax.nn.log_softmax(masked, axis=-1), axis=-1)

    def greedy(y):
        return jnp.argmax(y, axis=-1), jnp.zeros(y.shape[:-1], y.dtype)

    return jax.lax.cond(jnp.logical_or(temperature == 0, top_k == 1), greedy, masked_sample, jnp.astype(x, jnp.float32))


def simply_top_k_sample(x, key):
    """simply's sampler at T = 0.7 with top_k = 40: an exact top-k (the k ids lax.top_k picks, ties by the lower id),
    of (B, 1, V) logits as its decode step samples them."""
    return _simply_sample(x, key, 0.7, top_k=40)


def simply_top_p_sample(x, key):
    """simply's sampler at T = 0.7 with top_p = 0.9."""
    return _simply_sample(x, key, 0.7, top_p=0.9)


def simply_top_k_top_p_sample(x, key):
    """simply's sampler at T = 0.7 with top_k = 40 and top_p = 0.9: its nucleus of the top k."""
    return _simply_sample(x, key, 0.7, top_k=40, top_p=0.9)


def grok_sample_token_bf16(x, key):
    """grok-1's `sample_token` on its model's bf16 logits (its `fprop_dtype`): / T, the mask, the nucleus, the draw and
    the reads all in bf16."""
    return grok_sample_token(x, key)


def perceiver_ar_nucleus_sample(x, key):
    """perceiver-ar's `sample_position` at top_p = 0.9: the same nucleus of the logits themselves, the dropped at
    -1e30, then `logits /= jnp.maximum(temperature, 1e-12)` at T = 0.8, then a categorical."""
    logits = _haiku_top_p_filter(x, 0.9, -1e30)
    logits /= jnp.maximum(0.8, 1e-12)
    return jax.random.categorical(key, logits)


def near_miss_haiku_cut_above(x, key):
    """Haiku's nucleus with `>` at the cut: another cut (no form; a remark)."""
    return jax.random.categorical(key, _haiku_top_p_filter(x / 0.8, 0.9, -jnp.inf, cut_above=True))


def _transformer_vq_nucleus(logits, p, strictly_above=True):
    """transformer_vq's `nucleus(logits, p)` (nn/prob.py), written its way: the softmax's values sorted ascending
    (jnp.sort) and their stable argsort, the cumsum of the sorted, `> 1 - (p - 1e-4)` or'ed with the last place
    (`arange == full(V - 1)`), as int32, back to vocabulary order by take_along_axis with the argsort of the
    argsort, then `logits * mask - 1e10 * (1 - mask)`. `strictly_above` False: `>=`, another cut."""
    vocab = logits.shape[-1]
    probs = jax.nn.softmax(logits, axis=-1)
    sorted_probs, order = jnp.sort(probs, axis=-1), jnp.argsort(probs, axis=-1)
    cumulative = jnp.cumsum(sorted_probs, axis=-1)
    over = (jnp.greater if strictly_above else jnp.greater_equal)(cumulative, 1.0 - (p - 1e-4))
    last = jnp.equal(jnp.arange(vocab), jnp.full(fill_value=vocab - 1, shape=[vocab]))
    mask = jnp.logical_or(over, last).astype(jnp.int32)
    mask = jnp.take_along_axis(mask, jnp.argsort(order, axis=-1), axis=-1)
    return logits * mask - 1e10 * (1 - mask)


def transformer_vq_sample_step(x, key):
    """transformer_vq's sample_op step: the model's log-probabilities of the last position (B, 1, V), its nucleus
    at p_nucleus = 0.9, then `jax.random.categorical(rng, logits=...)`."""
    return jax.random.categorical(key, logits=_transformer_vq_nucleus(jax.nn.log_softmax(x)[:, -1:, :], 0.9))


def transformer_vq_nucleus_scaled(x, key):
    """transformer_vq's nucleus of logits / 0.8 at p = 0.95, then categorical: (B, V)."""
    return jax.random.categorical(key, _transformer_vq_nucleus(x / 0.8, 0.95), axis=-1)


def prob_sorted_nucleus_scattered_back(x, key):
    """transformer_vq's nucleus with its mask put back by a scatter at the argsort's ids (the same places as the
    argsort of the argsort), p = 0.9 written without a nudge."""
    probs = jax.nn.softmax(x, axis=-1)
    order = jnp.argsort(probs, axis=-1)
    cumulative = jnp.cumsum(jnp.sort(probs, axis=-1), axis=-1)
    mask = ((cumulative > 1.0 - 0.9) | (jnp.arange(x.shape[-1]) == x.shape[-1] - 1)).astype(jnp.int32)
    mask = jnp.zeros_like(order).at[jnp.arange(x.shape[0])[:, None], order].set(mask)
    return jax.random.categorical(key, x * mask - 1e10 * (1 - mask), axis=-1)


def transformer_vq_at_or_above(x, key):
    """transformer_vq's nucleus with `>=`: `c >= 1 - p` is `c > q'` at the f32 q' just below 1 - p, so
    top_p_prob_sorted_mask at p' = 1 - q'."""
    return jax.random.categorical(key, _transformer_vq_nucleus(x, 0.9, strictly_above=False), axis=-1)


def _multinomial_of_row(probs, key):
    """torch.multinomial(probs, 1) of one row (V,) as torchax lowers it: (1,) ids."""
    return jax.random.choice(key, probs.shape[-1], (1,), replace=False, p=probs)


def litgpt_top_k_multinomial(x, key):
    """litgpt's `sample` with its generate's defaults (T = 0.8, top_k = 50) of `logits[0, -1]` (one row), as torchax
    lowers it: top_k_exact_mask_choice of the row."""
    return _multinomial_of_row(jax.nn.softmax(_torch_top_k_scattered(x[0], 50) / 0.8), key)


def litgpt_top_k_top_p_multinomial(x, key):
    """litgpt's `sample` with top_k = 50 and top_p = 0.9 of one row: the top k scattered, / T, then `sample_top_p`
    (Hugging Face's removal, scattered back by a one-row index): top_k_exact_top_p_ascending_mask_choice."""
    y = _torch_top_k_scattered(x[0], 50) / 0.8
    ordered, ids = jnp.sort(y, stable=False), jnp.argsort(y, stable=False)
    remove = jnp.cumsum(jax.nn.softmax(ordered), axis=-1) <= (1 - 0.9)
    remove = remove.astype(jnp.int32).at[-1:].set(jnp.zeros((1,), jnp.int32)) != 0
    return _multinomial_of_row(jax.nn.softmax(jnp.where(remove.at[ids].set(remove[0:y.shape[0]]), -jnp.inf, y)), key)


def torchax_top_k_min_p_argsort_multinomial(x, key):
    """transformers 4.x's min-p config (Temperature, TopK(50), MinP: the top token kept through a descending
    argsort, gathered, cleared and scattered back) as torchax lowers it, then torch.multinomial."""
    y = _torchax_top_k_warper(x / 0.7, 50)
    probs = jax.nn.softmax(y, axis=-1)
    remove = probs < 0.1 * jnp.max(probs, axis=-1, keepdims=True)
    order = jnp.argsort(y, axis=-1, stable=False)[..., ::-1]
    rows = jnp.broadcast_to(jnp.arange(y.shape[0]).reshape(y.shape[0], 1), y.shape)
    ordered = remove[(rows, order)].at[..., :1].set(jnp.zeros((y.shape[0], 1), jnp.bool_))
    scattered = ordered.at[(rows, order)].set(ordered[0:y.shape[0], 0:y.shape[1]])  # torchax slices the source
    return _torchax_multinomial(jnp.where(scattered, -jnp.inf, y), key)


def torchax_epsilon_warper_multinomial(x, key):
    """Hugging Face's TemperatureLogitsWarper and EpsilonLogitsWarper as torchax lowers them (remove where the
    softmax is below epsilon and the score below torch.topk's max, sorted again as torch.topk(sorted=True) is),
    then torch.multinomial: epsilon_removal_choice."""
    y = x / 0.8
    largest = jnp.sort(jax.lax.top_k(y, 1)[0], axis=-1, descending=True)[..., -1][..., None]
    remove = (jax.nn.softmax(y, axis=-1) < 3e-3) & (y < largest)
    return _torchax_multinomial(jnp.where(remove, -jnp.inf, y), key)


def epsilon_at_or_below(x, key):
    """The epsilon warper with `<=` for its cutoff: `probs <= eps` is `probs < eps'` at the f32 eps' just above eps,
    so Hugging Face's rule at eps': epsilon_removal_choice."""
    y = x / 0.8
    largest = jnp.sort(jax.lax.top_k(y, 1)[0], axis=-1, descending=True)[..., -1][..., None]
    remove = (jax.nn.softmax(y, axis=-1) <= 3e-3) & (y < largest)
    return _torchax_multinomial(jnp.where(remove, -jnp.inf, y), key)


def _typical_removed(y, mass, strict=True):
    """Hugging Face's TypicalLogitsWarper as torchax lowers it: the entropy as a nansum, the shifted scores sorted
    (unstable), the cumsum of the softmax of the logits in that order, the cut at the score of `last`, the first kept,
    the removal scattered back (`strict=False`: the cumsum compared with <=, not HF's rule)."""
    batch, vocab = y.shape
    normalized = jax.nn.log_softmax(y, axis=-1)
    product = normalized * jnp.exp(normalized)
    entropy = -1.0 * jnp.sum(jnp.where(jnp.isnan(product), 0, product), axis=-1, keepdims=True)
    shifted = jnp.abs(-1.0 * normalized - entropy * 1.0)
    ordered, order = jnp.sort(shifted, axis=-1, stable=False), jnp.argsort(shifted, axis=-1, stable=False)
    rows = jnp.broadcast_to(jnp.arange(batch).reshape(batch, 1), (batch, vocab))
    cumulative = jnp.cumsum(jax.nn.softmax(y[(rows, order)], axis=-1), axis=1)
    below = cumulative < mass if strict else cumulative <= mass
    last = jnp.clip(jnp.sum(below, axis=1), max=vocab - 1).reshape(-1, 1)
    remove = ordered > ordered[(jnp.broadcast_to(jnp.arange(batch).reshape(batch, 1), last.shape), last)]
    remove = remove.astype(jnp.int32).at[..., :1].set(jnp.zeros((batch, 1), jnp.int32)) != 0
    return remove.at[(rows, order)].set(remove[0:batch, 0:vocab])


def torchax_typical_warper_multinomial(x, key):
    """Hugging Face's TemperatureLogitsWarper and TypicalLogitsWarper (typical_p = 0.9) as torchax lowers them, then
    torch.multinomial: typical_mask_choice."""
    y = x / 0.8
    return _torchax_multinomial(jnp.where(_typical_removed(y, 0.9), -jnp.inf, y), key)


def typical_at_or_below(x, key):
    """The typical warper counting the cumsum at or below its mass: `c <= m` is `c < m'` at the f32 m' just above m,
    so Hugging Face's rule at m': typical_mask_choice."""
    return _torchax_multinomial(jnp.where(_typical_removed(x, 0.9, strict=False), -jnp.inf, x), key)


def gemma_top_k_by_batch_index(x, key):
    """gemma's TopkSampling: categorical over the top-k / T, the drawn rank's id gathered by batch index."""
    values, ids = jax.lax.top_k(x, 24)
    pick = jax.random.categorical(key, values / 0.6, axis=-1)
    return ids[jnp.arange(x.shape[0]), pick]


def no_match_top_1_of_probs(x):
    """Greedy written as top_k(softmax(x), 1): no form, but it draws from a softmax, so a remark."""
    return jax.lax.top_k(jax.nn.softmax(x, axis=-1), 1)[1][..., 0]


def gemma_top_p_rank_space(x, key):
    """gemma's (and flax's, tunix's) `_sample_top_p`: the probabilities sorted by a full-width lax.top_k, the ranks
    whose preceding mass passes p (`cumsum - p > 0.9`) at 0, renormalised, a categorical of their log in rank
    space, mapped back: the top_p_of_probs_normalized form."""
    probs = jax.nn.softmax(x / 0.7, axis=-1)
    ordered, ids = jax.lax.top_k(probs, probs.shape[-1])
    cumulative = jnp.cumsum(ordered, axis=-1)
    kept = jnp.where(cumulative - ordered > 0.9, 0.0, ordered)
    pick = jax.random.categorical(key, jnp.log(kept / jnp.sum(kept, axis=-1, keepdims=True)))
    return jnp.take_along_axis(ids, pick[..., None], axis=-1)[..., 0]


def hand_written_top_p_by_argsort(x, key):
    """The nucleus as small projects write it (the JAX port of the llama reference's `sample_top_p`): the probabilities
    sorted by `argsort(-probs)` and gathered, `cumsum - probs > p` at 0, renormalised, a categorical of their log over
    the ranks, the id gathered back: the top_p_of_probs_normalized form, its sort a hand-written argsort."""
    probs = jax.nn.softmax(x / 0.6, axis=-1)
    order = jnp.argsort(-probs, axis=-1)
    ordered = jnp.take_along_axis(probs, order, axis=-1)
    kept = jnp.where(jnp.cumsum(ordered, axis=-1) - ordered > 0.9, 0.0, ordered)
    pick = jax.random.categorical(key, jnp.log(kept / kept.sum(axis=-1, keepdims=True)))
    return jnp.take_along_axis(order, pick[..., None], axis=-1)[..., 0]


def hand_written_top_k_top_p_by_argsort(x, key):
    """As hand_written_top_p_by_argsort, sorted by a descending argsort sliced to the top 32."""
    probs = jax.nn.softmax(x / 0.9, axis=-1)
    order = jnp.argsort(probs, axis=-1, descending=True)[..., :32]
    ordered = jnp.take_along_axis(probs, order, axis=-1)
    kept = jnp.where(jnp.cumsum(ordered, axis=-1) - ordered > 0.8, 0.0, ordered)
    pick = jax.random.categorical(key, jnp.log(kept / kept.sum(axis=-1, keepdims=True)))
    return jnp.take_along_axis(order, pick[..., None], axis=-1)[..., 0]


def llama_reference_top_p_through_torchax(x, key, p=0.9, renormalize=True):
    """The llama reference's `sample_top_p(torch.softmax(x / T), p)` as torchax lowers it: torch.sort descending (an
    unstable jnp.sort and jnp.argsort), `cumsum - v * 1 > p` at 0 (torch's sub, alpha 1), renormalised (not by
    xformers' fastgen `top_p`: `renormalize`), torch.multinomial (a choice per row with the one key), torch.gather by
    row indices, reshaped to (B,)."""
    probs = jax.nn.softmax(x / 0.6, axis=-1)
    ordered = jnp.sort(probs, axis=-1, stable=False, descending=True)
    order = jnp.argsort(probs, axis=-1, stable=False, descending=True)
    kept = jnp.where(jnp.cumsum(ordered, axis=-1) - ordered * 1 > p, jnp.broadcast_to(0.0, ordered.shape), ordered)
    if renormalize:
        kept = kept / jnp.sum(kept, axis=-1, keepdims=True)
    picks = jnp.array([jax.random.choice(key, kept.shape[-1], (1,), replace=False, p=kept[i, :])
                       for i in range(kept.shape[0])])
    rows = jnp.broadcast_to(jnp.arange(picks.shape[0]).reshape(picks.shape[0], 1), picks.shape)
    return order[(rows, picks)].reshape(-1)


def audiocraft_top_p_of_codebooks(x, key, p=0.9):
    """audiocraft's (MusicGen's) `sample_top_p(torch.softmax(x / T), p)` of (B, K, V) codebook logits as torchax lowers
    it: the llama reference's nucleus with the dropped probabilities zeroed by a product (`probs_sort *=
    (~mask).float()`), drawn by its `multinomial` (the rows flattened to (B * K, V), a choice per row with the one
    key, reshaped back), torch.gather by an iota of each leading dim, `[..., 0]`."""
    probs = jax.nn.softmax(x / 0.8, axis=-1)
    ordered = jnp.sort(probs, axis=-1, stable=False, descending=True)
    order = jnp.argsort(probs, axis=-1, stable=False, descending=True)
    kept = ordered * jnp.logical_not(jnp.cumsum(ordered, axis=-1) - ordered * 1 > p).astype(jnp.float32)
    kept = kept / jnp.sum(kept, axis=-1, keepdims=True)
    rows = kept.reshape(-1, kept.shape[-1])
    picks = jnp.array([jax.random.choice(key, rows.shape[-1], (1,), replace=False, p=rows[i, :])
                       for i in range(rows.shape[0])]).reshape(*kept.shape[:-1], 1)
    b, c = (jnp.broadcast_to(jnp.arange(n).reshape(shape), picks.shape)
            for n, shape in ((picks.shape[0], (-1, 1, 1)), (picks.shape[1], (1, -1, 1))))
    return order[(b, c, picks)][..., 0]


def fastgen_top_p_through_torchax(x, key):
    """xformers' fastgen `top_p(torch.softmax(x / T), p)` as torchax lowers it: the llama reference's nucleus, its kept
    probabilities drawn by torch.multinomial as weights, not renormalised."""
    return llama_reference_top_p_through_torchax(x, key, renormalize=False)


def top_k_of_probs_weights(x, key):
    """A top-k of the probabilities as torch code writes it by hand: `probs * (probs >= torch.topk(probs, k)[0][...,
    -1:])`, drawn by torch.multinomial as weights (not renormalised)."""
    probs = jax.nn.softmax(x / 0.7, axis=-1)
    return _multinomial(probs * (probs >= jax.lax.top_k(probs, 40)[0][..., -1:]).astype(jnp.float32), key)


def min_p_of_probs_weights(x, key, renormalize=False):
    """A min-p as torch code writes it by hand: `probs = softmax(x / T)`, `torch.where(probs < min_p * top, 0, probs)`
    with top the row's largest, then torch.multinomial of the weights ((B, 1) ids, not squeezed); `renormalize`: the
    weights divided by their sum first."""
    probs = jax.nn.softmax(x / 0.7, axis=-1)
    kept = jnp.where(probs < 0.1 * jnp.max(probs, axis=-1, keepdims=True), jnp.zeros_like(probs), probs)
    if renormalize:
        kept = kept / jnp.sum(kept, axis=-1, keepdims=True)
    return _multinomial_unsqueezed(kept, key)


def min_p_of_probs_renormalized(x, key):
    return min_p_of_probs_weights(x, key, renormalize=True)


def audiocraft_top_k(x, key):
    """audiocraft's `sample_top_k(torch.softmax(x), 12)` of (B, V) logits, written with lax.top_k: the k-th largest
    probability, `probs *= (probs >= kth).float()`, renormalised, torch.multinomial in vocabulary order."""
    probs = jax.nn.softmax(x / 1.0, axis=-1)
    kept = probs * (probs >= jax.lax.top_k(probs, 12)[0][..., -1:]).astype(jnp.float32)
    return _multinomial(kept / jnp.sum(kept, axis=-1, keepdims=True), key)


def llama_reference_temperature_only_through_torchax(x, key):
    """The same step with top_p = 1.0 (the reference's temperature-only config, as mistral_inference runs it too): its
    nucleus is the whole row, wider than the kernel's candidates, so the row is sorted by the kernel."""
    return llama_reference_top_p_through_torchax(x, key, p=1.0)


def maxtext_top_p_fill(x, key):
    """MaxText's nucleus: the dropped logits at -1e7, not -inf (any fill <= -1e6 gives -inf's ids: FILL_NOTE), then
    / T: the top_p_mask form."""
    ordered = jnp.sort(x, axis=-1)[..., ::-1]
    cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
    cutoff = jnp.take_along_axis(ordered, jnp.sum(cumulative < 0.9, axis=-1, keepdims=True), axis=-1)
    return jax.random.categorical(key, jnp.where(x < cutoff, -1e7, x) / 0.8)


def maxtext_composite(x, key):
    """MaxText's composite: the top k logits, their nucleus in rank space (`arange(k) <= sum(cumsum < p)`), the rest
    at -1e7, / max(T, 1e-6), a categorical over the k ranks: the top_k_top_p_of_logits form."""
    values, ids = jax.lax.top_k(x, 24)
    cumulative = jnp.cumsum(jax.nn.softmax(values, axis=-1), axis=-1)
    keep = jnp.arange(24) <= jnp.sum(cumulative < 0.9, axis=-1, keepdims=True)
    masked = jnp.where(keep, values, jnp.full_like(values, -1e7)) / jnp.maximum(0.6, 1e-6)
    pick = jax.random.categorical(key, masked).astype(jnp.int32)
    return jnp.squeeze(jnp.take_along_axis(ids, pick[..., None], axis=-1), axis=-1)


def tunix_top_p(x, key):
    """tunix's sample_top_p without a top k: x / T first, every logit by lax.top_k, the softmax of the sorted logits,
    the ranks whose mass before them exceeds p at -inf, a categorical of the kept sorted logits themselves, the rank
    mapped back: the top_p_of_logits_exclusive form, T inside it."""
    ordered, ids = jax.lax.top_k(x / 0.7, x.shape[-1])
    probs = jax.nn.softmax(ordered, axis=-1)
    ordered = jnp.where(jnp.cumsum(probs, axis=-1) - probs > 0.9, -jnp.inf, ordered)
    return jnp.take_along_axis(ids, jax.random.categorical(key, ordered)[..., None], axis=-1)[..., 0]


def tunix_top_k_top_p(x, key):
    """tunix's sample_top_p with a top k of 32: the same nucleus over lax.top_k(x / T, 32)."""
    ordered, ids = jax.lax.top_k(x / 0.8, 32)
    probs = jax.nn.softmax(ordered, axis=-1)
    ordered = jnp.where(jnp.cumsum(probs, axis=-1) - probs > 0.95, -jnp.inf, ordered)
    return jnp.take_along_axis(ids, jax.random.categorical(key, ordered)[..., None], axis=-1)[..., 0]


def near_miss_logits_nucleus_inclusive(x, key):
    """The tunix nucleus with the inclusive rule `cumsum > p` (its own rank's mass counted): no form keeps that, so
    only the draw fuses, and the remark names the top-p filter left in XLA."""
    ordered, ids = jax.lax.top_k(x / 0.7, x.shape[-1])
    ordered = jnp.where(jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1) > 0.9, -jnp.inf, ordered)
    return jnp.take_along_axis(ids, jax.random.categorical(key, ordered)[..., None], axis=-1)[..., 0]


def flax_top_k_warper(x, key):
    """Hugging Face's Flax generate(): the Temperature warper (x / T), then FlaxTopKLogitsWarper (lax.top_k's exactly
    k scattered into a flat row of -inf), then a categorical: top_k_exact_mask at T = 1 of x / T."""
    y = x / 0.8
    batch, vocab = y.shape
    values, ids = jax.lax.top_k(y, 20)
    shift = jnp.broadcast_to((jnp.arange(batch) * vocab)[:, None], (batch, 20)).flatten()
    kept = jnp.full(batch * vocab, -jnp.inf).at[ids.flatten() + shift].set(values.flatten()).reshape(batch, vocab)
    return jax.random.categorical(key, kept, axis=-1)


def _flax_top_p_warper(y, p):
    values, ids = jax.lax.top_k(y, y.shape[-1])
    keep = jnp.roll(jax.nn.softmax(values, axis=-1).cumsum(axis=-1) < p, 1)
    keep |= keep.at[:, 0].set(True)
    keep = keep.at[:, :1].set(True)
    return jax.lax.sort_key_val(ids, jnp.where(keep, values, jnp.full_like(y, -jnp.inf)))[-1]


def flax_top_p_warper(x, key):
    """Hugging Face's Flax generate() with top_k=0: Temperature, then FlaxTopPLogitsWarper (a full-width lax.top_k,
    the rolled cumsum < p, -inf elsewhere, sort_key_val back), then a categorical: top_p_flax_mask at T = 1."""
    return jax.random.categorical(key, _flax_top_p_warper(x / 0.7, 0.9), axis=-1)


def flax_top_k_top_p_warpers(x, key):
    """Flax generate()'s Llama-3 config: Temperature, its default FlaxTopKLogitsWarper(50), FlaxTopPLogitsWarper:
    top_k_exact_top_p_flax_mask at T = 1 of x / T."""
    y = x / 0.6
    batch, vocab = y.shape
    values, ids = jax.lax.top_k(y, 50)
    shift = jnp.broadcast_to((jnp.arange(batch) * vocab)[:, None], (batch, 50)).flatten()
    kept = jnp.full(batch * vocab, -jnp.inf).at[ids.flatten() + shift].set(values.flatten()).reshape(batch, vocab)
    return jax.random.categorical(key, _flax_top_p_warper(kept, 0.9), axis=-1)


def _easydel_top_k_warper(y, k):
    """EasyDeL's TopKLogitsWarper: the k-th of a descending jnp.sort (its index computed from k under its cond,
    constants a prepare folds), keep >=."""
    effective_k = jnp.minimum(jnp.maximum(jnp.asarray(k), 1), y.shape[-1]).astype(jnp.int32)
    threshold = jnp.sort(y, axis=-1)[:, ::-1][:, jnp.maximum(0, effective_k - 1)][:, None]
    return jnp.where(y >= threshold, y, -jnp.inf)


def easydel_top_k_warper(x, key):
    """EasyDeL's Temperature and TopK warpers, then a categorical: top_k_keep_mask at T = 1 of x / T."""
    return jax.random.categorical(key, _easydel_top_k_warper(x / 0.7, 12), axis=-1)


def easydel_top_k_top_p_warpers(x, key):
    """EasyDeL's Temperature, TopK and TopP (Flax's) warpers: top_k_keep_top_p_flax_mask at T = 1 of x / T."""
    return jax.random.categorical(key, _flax_top_p_warper(_easydel_top_k_warper(x / 0.7, 40), 0.9), axis=-1)


def easydel_min_p_warper(x, key):
    """EasyDeL's Temperature and MinP warpers (the softmax of the full-width-sorted logits against its first, the
    removal scattered back through a meshgrid), then a categorical: min_p_sorted_removal at T = 1 of x / T."""
    y = x / 0.7
    batch, vocab = y.shape
    ordered, ids = jax.lax.top_k(y, vocab)
    probs = jax.nn.softmax(ordered, axis=-1)
    remove = (probs < 0.1 * probs[:, 0:1]) & ~(jnp.arange(vocab) < 1)
    rows, _ = jnp.meshgrid(jnp.arange(batch), jnp.arange(vocab), indexing="ij")
    removed = jnp.zeros_like(y, dtype=jnp.bool_).at[(rows, ids)].set(remove)
    return jax.random.categorical(key, jnp.where(removed, -jnp.inf, y), axis=-1)


def floored_top_k_top_p_rank_space(x, key):
    """The same nucleus over the top k probabilities, floored before the log (`log(p + 1e-10)`), squeezed as
    several gemma-derived samplers write it: top_k_top_p_of_probs_normalized with eps = 1e-10."""
    probs = jax.nn.softmax(x / 0.8, axis=-1)
    ordered, ids = jax.lax.top_k(probs, 32)
    kept = jnp.where(jnp.cumsum(ordered, axis=-1) - ordered > 0.95, 0.0, ordered)
    kept = kept / jnp.sum(kept, axis=-1, keepdims=True)
    pick = jax.random.categorical(key, jnp.log(kept + 1e-10))
    return jnp.squeeze(jnp.take_along_axis(ids, pick[..., None], axis=-1), axis=-1)


def keras_hub_top_p(x, key):
    """keras-hub's TopPSampler: the probabilities sorted (top_k of all V), the shifted `cumsum <= p` keep mask,
    the rest at 0, keras' categorical of their log over (B, V, 1), take_along_axis of the (B, 1) ranks: the
    top_p_of_probs form."""
    ordered, ids = jax.lax.top_k(jax.nn.softmax(x / 0.7, axis=-1), x.shape[-1])
    keep = jnp.cumsum(ordered, axis=-1) <= 0.9
    keep = jnp.concatenate([jnp.ones_like(keep[:, :1]), keep[:, :-1]], axis=-1)
    kept = jnp.where(keep, ordered, jnp.zeros_like(ordered))
    pick = jax.random.categorical(key, jnp.log(kept)[..., None], shape=(x.shape[0], 1), axis=1)
    return jnp.squeeze(jnp.take_along_axis(ids, pick, axis=-1), -1)


def keras_hub_top_k_top_p(x, key):
    """keras-hub's TopPSampler with k: the nucleus of the top k probabilities (top_k_top_p_of_probs)."""
    ordered, ids = jax.lax.top_k(jax.nn.softmax(x, axis=-1), 24)
    keep = jnp.cumsum(ordered, axis=-1) <= 0.8
    keep = jnp.concatenate([jnp.ones_like(keep[:, :1]), keep[:, :-1]], axis=-1)
    kept = jnp.where(keep, ordered, jnp.zeros_like(ordered))
    pick = jax.random.categorical(key, jnp.log(kept)[..., None], shape=(x.shape[0], 1), axis=1)
    return jnp.squeeze(jnp.take_along_axis(ids, pick, axis=-1), -1)


def no_match_rank_space_nucleus_cumsum_lt(x, key):
    """A nucleus whose keep rule no form has (`cumsum < p`, unshifted): fused at its draw only, with a remark."""
    ordered, ids = jax.lax.top_k(jax.nn.softmax(x, axis=-1), x.shape[-1])
    kept = jnp.where(jnp.cumsum(ordered, axis=-1) < 0.9, ordered, 0.0)
    pick = jax.random.categorical(key, jnp.log(kept))
    return jnp.take_along_axis(ids, pick[..., None], axis=-1)[..., 0]


# --- Pax (praxis token_samplers): argmax(x + gumbel * T), the noise scaled -------------------------------------------


def _pax_draw(x, key, temperature):
    noise = jax.random.gumbel(key, x.shape).astype(x.dtype)
    return jnp.argmax(x + noise * temperature, axis=-1)


def _pax_gather(items, position):
    rows = jax.lax.broadcasted_iota(jnp.int32, position.shape, 0)
    return items[rows, position]


def _pax_nucleus(x, threshold, descending):
    ordered = x if descending else jnp.sort(x, axis=-1)
    cumulative = jnp.cumsum(jax.nn.softmax(ordered.astype(jnp.float32), axis=-1), axis=-1)
    count = jnp.sum((cumulative <= threshold).astype(jnp.int32), axis=-1)
    cutoff = ordered[jnp.arange(x.shape[0]), count]
    return jnp.where(x < cutoff[:, None], jnp.asarray(-0.7 * jnp.finfo(x.dtype).max, x.dtype), x)


def pax_temperature(x, key):
    return _pax_draw(x, key, 0.7)


def pax_top_k(x, key):
    values, ids = jax.lax.top_k(x, 16)
    return _pax_gather(ids, _pax_draw(values, key, 0.8))


def pax_top_k_top_p(x, key):
    values, ids = jax.lax.top_k(x, 24)
    return _pax_gather(ids, _pax_draw(_pax_nucleus(values, 0.9, descending=True), key, 0.6))


def pax_top_p(x, key):
    return _pax_draw(_pax_nucleus(x, 1.0 - 0.9, descending=False), key, 0.7)


def pax_epsilon(x, key):
    probs = jax.nn.softmax(x.astype(jnp.float32), axis=-1)
    return _pax_draw(jnp.where(probs < 3e-3, jnp.asarray(-0.7 * jnp.finfo(x.dtype).max, x.dtype), x), key, 0.9)


def pax_temperature_per_row(x, key):
    """Pax's draw with a temperature per row (a request's, (B, 1), as saxml serves it), one of them 0 (greedy)."""
    return _pax_draw(x, key, jnp.linspace(0.0, 1.0, x.shape[0], dtype=x.dtype)[:, None])


def pax_top_k_top_p_per_row(x, key):
    values, ids = jax.lax.top_k(x, 24)
    t = jnp.linspace(0.5, 1.5, x.shape[0], dtype=x.dtype)[:, None]
    return _pax_gather(ids, _pax_draw(_pax_nucleus(values, 0.9, descending=True), key, t))


def near_miss_pax_temperature_per_token(x, key):
    """Pax's draw with a temperature per token ((1, V)): no form scales the noise along the vocabulary."""
    return _pax_draw(x, key, jnp.linspace(0.5, 1.0, x.shape[-1], dtype=x.dtype)[None, :])


def unsorted_top_p(x, key):
    """A hand-written nucleus: argsort descending, the sorted logits' cumsum, the first token past p dropped from the
    second on (a shifted mask), back to vocabulary order by the inverse permutation (a second argsort), categorical:
    fused whole as `temperature`, the nucleus its stage (the classic cut put back by a take along the order's argsort,
    a writing whose filtered logits come out of that take: before stages could end in any op, it stayed in XLA)."""
    order = jnp.argsort(x, axis=-1)[..., ::-1]
    ordered = jnp.take_along_axis(x, order, axis=-1)
    cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
    dropped = jnp.concatenate([jnp.zeros_like(cumulative[..., :1], bool), cumulative[..., :-1] > 0.9], axis=-1)
    kept = jnp.where(dropped, -jnp.inf, ordered)
    return jax.random.categorical(key, jnp.take_along_axis(kept, jnp.argsort(order, axis=-1), axis=-1) / 0.8)


ARGSORT_REMARK = "stablehlo.sort: top-k by argsort not fused into the sampler (fused as `temperature` after it)"

VARIANTS: list[Variant] = [
    Variant("argmax", argmax, "greedy", stochastic=False, expect={"mode": "greedy"}),
    Variant("argmax_bf16", argmax, "greedy", dtype=jnp.bfloat16, stochastic=False),
    Variant("argmax_rank1", argmax, "greedy", shape=(V,), stochastic=False),
    Variant("argmax_of_softmax", argmax_of_softmax, "greedy_softmax", stochastic=False),
    Variant("categorical", categorical, "categorical", expect={"mode": "temperature", "temperature": 1.0}),
    Variant("temperature_07", temperature_07, "temperature", expect={"temperature": 0.7}),
    Variant("temperature_bf16", temperature_07, "temperature", dtype=jnp.bfloat16,
            expect={"temperature": 0.69921875}),
    Variant("temperature_upcast_bf16", temperature_upcast, "temperature", dtype=jnp.bfloat16),
    Variant("temperature_rank3", temperature_07, "temperature", shape=(2, 3, V)),
    Variant("split_key", split_key, "temperature", expect={"temperature": 0.8}),
    Variant("in_a_cond_branch", in_a_cond_branch, "temperature", expect={"temperature": 0.7}),
    Variant("jetstream_top_k", jetstream_top_k, "top_k", expect={"mode": "top_k", "k": 40, "temperature": 0.6}),
    Variant("jetstream_top_k_bf16", jetstream_top_k, "top_k", dtype=jnp.bfloat16, expect={"k": 40}),
    Variant("keras_top_k", keras_top_k, "temperature_top_k", expect={"k": 8, "temperature": 0.9}),
    Variant("maxtext_top_k_mask", maxtext_top_k_mask, "top_k_mask", expect={"k": 16, "temperature": 0.8}),
    Variant("argsort_top_k", argsort_top_k, "top_k", expect={"k": 20, "temperature": 0.7}),
    Variant("negated_argsort_top_k_mask", negated_argsort_top_k_mask, "temperature", expect={"temperature": 0.8},
            remark=ARGSORT_REMARK),
    Variant("reversed_argsort_top_k", reversed_argsort_top_k, "temperature", expect={"temperature": 0.7},
            remark=ARGSORT_REMARK),
    Variant("jetstream_top_p", jetstream_top_p, "top_p_mask", expect={"mode": "top_p", "p": 0.9}),
    Variant("jetstream_top_p_bf16", jetstream_top_p, "top_p_mask", dtype=jnp.bfloat16),
    Variant("top_k_then_top_p", top_k_then_top_p, "top_k_top_p_mask",
            expect={"mode": "top_k+top_p", "k": 50, "p": 0.95}),
    Variant("min_p", min_p_sampler, "min_p", expect={"mode": "min_p", "min_p": 0.05, "temperature": 0.9}),
    Variant("keras_random", keras_random, "temperature_log_of_softmax", expect={"temperature": 0.7}),
    Variant("log_softmax_temperature", log_softmax_temperature, "temperature_log_softmax",
            expect={"mode": "temperature", "temperature": 0.8}),
    Variant("log_softmax_categorical", log_softmax_categorical, "categorical_log_softmax"),
    Variant("log_softmax_categorical_bf16", log_softmax_categorical, "categorical_log_softmax", dtype=jnp.bfloat16),
    Variant("top_k_log_softmax", top_k_log_softmax, "top_k_log_softmax", expect={"k": 8, "temperature": 0.6}),
    Variant("top_p_log_of_softmax", top_p_log_of_softmax, "top_p_mask_log_of_softmax", expect={"p": 0.9}),
    Variant("multinomial_temperature", multinomial_temperature, "temperature_choice", expect={"temperature": 0.7}),
    Variant("multinomial_top_k_mask", multinomial_top_k_mask, "top_k_mask_choice",
            expect={"k": 16, "temperature": 0.8}),
    Variant("gemma_top_p_rank_space", gemma_top_p_rank_space, "top_p_of_probs_normalized",
            expect={"mode": "top_p", "p": 0.9, "temperature": 0.7, "eps": 0.0}),
    Variant("floored_top_k_top_p_rank_space", floored_top_k_top_p_rank_space, "top_k_top_p_of_probs_normalized",
            expect={"mode": "top_k+top_p", "k": 32, "p": 0.95, "temperature": 0.8, "eps": 1e-10}),
    Variant("hand_written_top_p_by_argsort", hand_written_top_p_by_argsort, "top_p_of_probs_normalized",
            expect={"mode": "top_p", "p": 0.9, "temperature": 0.6, "eps": 0.0}),
    Variant("hand_written_top_k_top_p_by_argsort", hand_written_top_k_top_p_by_argsort,
            "top_k_top_p_of_probs_normalized", expect={"mode": "top_k+top_p", "k": 32, "p": 0.8, "temperature": 0.9}),
    Variant("top_k_mask_filled_before_scale", top_k_mask_filled_before_scale, "top_k_mask",
            expect={"k": 40, "temperature": 0.7}),
    Variant("nanogpt_multinomial_unsqueezed", nanogpt_multinomial_unsqueezed, "temperature_choice",
            expect={"temperature": 0.8}),
    Variant("nanogpt_top_k_multinomial_unsqueezed", nanogpt_top_k_multinomial_unsqueezed, "top_k_mask_choice",
            expect={"k": 16}),
    Variant("torch_top_k_candidates_multinomial", torch_top_k_candidates_multinomial, "temperature_top_k_choice",
            expect={"k": 20, "temperature": 0.8}),
    Variant("llama_reference_top_p_unsqueezed", llama_reference_top_p_unsqueezed, "top_p_of_probs_torch",
            expect={"p": 0.9, "temperature": 0.6}),
    Variant("llama_reference_top_p_through_torchax", llama_reference_top_p_through_torchax, "top_p_of_probs_torch",
            expect={"mode": "top_p", "p": 0.9, "temperature": 0.6}),
    Variant("audiocraft_top_p_of_codebooks", audiocraft_top_p_of_codebooks, "top_p_of_probs_torch", shape=(B, 3, V),
            expect={"mode": "top_p", "p": 0.9, "temperature": 0.8}),
    Variant("audiocraft_top_k", audiocraft_top_k, "top_k_of_probs_torch", expect={"mode": "top_k", "k": 12}),
    # torch.multinomial of zeroed probabilities as weights, not renormalised: forms of their own (`_unnormalized`)
    Variant("fastgen_top_p_through_torchax", fastgen_top_p_through_torchax, "top_p_of_probs_torch_unnormalized",
            expect={"mode": "top_p", "p": 0.9, "temperature": 0.6}),
    Variant("top_k_of_probs_weights", top_k_of_probs_weights, "top_k_of_probs_torch_unnormalized",
            expect={"mode": "top_k", "k": 40, "temperature": float(np.float32(0.7))}),
    Variant("min_p_of_probs_weights", min_p_of_probs_weights, "min_p_of_probs_torch_unnormalized",
            expect={"mode": "min_p", "min_p": float(np.float32(0.1)), "temperature": float(np.float32(0.7))}),
    Variant("min_p_of_probs_renormalized", min_p_of_probs_renormalized, "min_p_of_probs_torch",
            expect={"mode": "min_p", "min_p": float(np.float32(0.1)), "temperature": float(np.float32(0.7))}),
    Variant("llama_reference_temperature_only_through_torchax", llama_reference_temperature_only_through_torchax,
            "top_p_of_probs_torch", expect={"mode": "top_p", "p": 1.0, "temperature": 0.6}),
    Variant("maxtext_top_p_fill", maxtext_top_p_fill, "top_p_mask", expect={"p": 0.9, "temperature": 0.8}),
    Variant("flax_top_k_warper", flax_top_k_warper, "top_k_exact_mask", expect={"k": 20, "temperature": 1.0}),
    Variant("maxtext_composite", maxtext_composite, "top_k_top_p_of_logits",
            expect={"k": 24, "p": 0.9, "temperature": 0.6}),
    Variant("torchax_epsilon_warper_multinomial", torchax_epsilon_warper_multinomial, "epsilon_removal_choice",
            expect={"temperature": 0.8, "epsilon": 3e-3}),
    Variant("epsilon_at_or_below", epsilon_at_or_below, "epsilon_removal_choice",
            expect={"epsilon": f32_above(3e-3), "temperature": 0.8}),
    Variant("gemma_3_1_top_p", gemma_3_1_top_p, "top_p_ascending_count_mask",
            expect={"mode": "top_p", "p": 0.8, "temperature": 0.6}),
    Variant("near_miss_ascending_count_below", near_miss_ascending_count_below, "categorical",
            remark="stablehlo.composite: sampler fused only in part: fused as `categorical`; the top-p filter"),
    Variant("torchax_typical_warper_multinomial", torchax_typical_warper_multinomial, "typical_mask_choice",
            expect={"temperature": 0.8, "p": 0.9}),
    Variant("typical_at_or_below", typical_at_or_below, "typical_mask_choice",
            expect={"p": f32_above(0.9), "temperature": 1.0}),
    Variant("vmapped_same_key_sampler", vmapped_same_key_sampler, "top_p_mask_same_key_rows",
            expect={"p": 0.9, "temperature": 0.7}),
    Variant("easydel_vmapped_per_row_top_p", easydel_vmapped_per_row_top_p, "top_p_of_top_k_rows_same_key_rows",
            expect={"k": 32}),
    Variant("easydel_vmapped_per_row_top_p_one_row", easydel_vmapped_per_row_top_p,
            "top_p_of_top_k_rows_same_key_rows", shape=(1, V), expect={"k": 32}),
    Variant("vmapped_choice_top_k_mask", vmapped_choice_top_k_mask, "top_k_mask_inverse_cdf", expect={"k": 16}),
    Variant("vmapped_choice_top_p", vmapped_choice_top_p, "top_p_mask_inverse_cdf",
            expect={"p": 0.9, "temperature": 0.7}),
    Variant("sglang_jax_sorted_probs", sglang_jax_sorted_probs, "sorted_probs_rows"),
    Variant("gemma_pytorch_sampler", gemma_pytorch_sampler, "sorted_probs_inverse_cdf_rows"),
    # one prompt: the one row's draw stacked to (1, 1) with no concatenate, from its search's index
    Variant("gemma_pytorch_sampler_one_row", gemma_pytorch_sampler, "sorted_probs_inverse_cdf_rows", shape=(1, V)),
    Variant("multinomial_with_replacement_temperature", multinomial_with_replacement_temperature,
            "temperature_inverse_cdf", expect={"temperature": 0.7}),
    Variant("multinomial_with_replacement_top_k_mask", multinomial_with_replacement_top_k_mask,
            "top_k_mask_inverse_cdf", expect={"k": 16}),
    Variant("choice_of_one_row_temperature", choice_of_one_row_temperature, "temperature_inverse_cdf", shape=(V,),
            expect={"temperature": 0.9}),
    Variant("choice_of_one_row_top_k_mask", choice_of_one_row_top_k_mask, "top_k_mask_inverse_cdf", shape=(V,),
            expect={"k": 40}),
    Variant("gpt_fast_top_k_race", gpt_fast_top_k_race, "top_k_mask_exponential_race", shape=(1, V),
            expect={"k": 40, "temperature": 1.0}, stochastic=False),
    Variant("torchtune_top_k_race", torchtune_top_k_race, "top_k_mask_exponential_race",
            expect={"k": 16, "temperature": 1.0}, stochastic=False),
    Variant("torchtune_race_under_jit", torchtune_race_under_jit, "greedy", stochastic=False,
            remark="stablehlo.composite: sampler fused only in part: fused as `greedy`; the top-k filter"),
    Variant("exponential_race_temperature", exponential_race_temperature, "temperature_exponential_race",
            expect={"temperature": 0.7}),
    Variant("exponential_race_top_k", exponential_race_top_k, "top_k_mask_exponential_race", expect={"k": 50}),
    Variant("exponential_race_top_p", exponential_race_top_p, "top_p_mask_exponential_race",
            expect={"p": 0.9, "temperature": 1.0}),
    Variant("near_miss_race_of_logits", near_miss_race_of_logits, None),
    Variant("mtj_nucleaus_sample", mtj_nucleaus_sample, "top_p_mtj_mask", expect={"p": 0.9, "temperature": 0.8}),
    Variant("transformer_vq_sample_step", transformer_vq_sample_step, "top_p_prob_sorted_mask_of_log_probs",
            shape=(B, 1, V), expect={"temperature": 1.0}),
    Variant("transformer_vq_nucleus_scaled", transformer_vq_nucleus_scaled, "top_p_prob_sorted_mask",
            expect={"temperature": 0.8}),
    Variant("prob_sorted_nucleus_scattered_back", prob_sorted_nucleus_scattered_back, "top_p_prob_sorted_mask",
            expect={"temperature": 1.0}),
    Variant("transformer_vq_at_or_above", transformer_vq_at_or_above, "top_p_prob_sorted_mask",
            expect={"p": 1.0 - f32_below(1.0 - (0.9 - 1e-4)), "temperature": 1.0}),
    # (its p: 0.9 - 1e-4 in f32, one constant after hlofuse-prepare; its T, a select of constants, stays outside)
    Variant("levanter_top_p_sample", levanter_top_p_sample, "top_p_levanter_mask",
            expect={"p": float(np.float32(0.9) - np.float32(1e-4)), "temperature": 1.0}),
    Variant("levanter_top_p_sample_with_log_prob", levanter_top_p_sample_with_log_prob, "top_p_levanter_mask",
            expect={"p": float(np.float32(0.9) - np.float32(1e-4)), "temperature": 0.7, "scores": True}),
    # (Haiku's p: 1 - f32(1 - 0.9): its threshold 1 - p is a Python float)
    Variant("haiku_nucleus_sample", haiku_nucleus_sample, "top_p_haiku_mask",
            expect={"p": 1 - float(np.float32(1 - 0.9)), "temperature": 1.0}),
    Variant("haiku_nucleus_decode_rows", haiku_nucleus_decode_rows, "top_p_haiku_mask",
            expect={"p": 1 - float(np.float32(1 - 0.95)), "temperature": float(np.float32(0.7))}),
    Variant("grok_sample_token", grok_sample_token, "top_p_haiku_rows_row_keys", shape=(B, 1, V),
            expect={"scores": True, "fill": -1e10, "temperature": 1.0}, program_top_ks=1),
    Variant("grok_sample_token_bf16", grok_sample_token_bf16, "top_p_haiku_rows_row_keys", shape=(B, 1, V),
            dtype=jnp.bfloat16, expect={"scores": True, "temperature": 1.0}, program_top_ks=1),
    # (simply's p: 0.9 as an f32 constant; its T before the top-k's mask, outside)
    Variant("simply_top_k_sample", simply_top_k_sample, "top_k_exact_mask",
            shape=(B, 1, V), expect={"k": 40, "temperature": 1.0, "scores": True,
                                      "fill": -0.5 * float(np.finfo(np.float32).max)}),
    Variant("simply_top_p_sample", simply_top_p_sample, "top_p_simply_mask", shape=(B, 1, V),
            expect={"p": float(np.float32(0.9)), "temperature": float(np.float32(0.7)), "scores": True}),
    Variant("simply_top_k_top_p_sample", simply_top_k_top_p_sample, "top_k_top_p_simply_mask", shape=(B, 1, V),
            expect={"k": 40, "p": float(np.float32(0.9)), "temperature": float(np.float32(0.7)), "scores": True}),
    Variant("simply_top_p_inclusive", simply_top_p_inclusive, "top_p_simply_mask",
            expect={"p": f32_above(0.9), "temperature": 0.7}),
    Variant("perceiver_ar_nucleus_sample", perceiver_ar_nucleus_sample, "top_p_haiku_logits_mask",
            expect={"p": 1 - float(np.float32(1 - 0.9)), "temperature": float(np.float32(0.8))}),
    Variant("near_miss_haiku_cut_above", near_miss_haiku_cut_above, "categorical",
            remark="stablehlo.composite: sampler fused only in part: fused as `categorical`; the top-p filter"),
    Variant("near_miss_levanter_keep_at_or_below", near_miss_levanter_keep_at_or_below, "categorical",
            remark="stablehlo.composite: sampler fused only in part: fused as `categorical`; the top-p filter"),
    Variant("mtj_removal_at_or_above", mtj_removal_at_or_above, "top_p_mtj_mask",
            expect={"p": f32_below(0.9), "temperature": 0.8}),
    Variant("near_miss_sorted_probs_inclusive", near_miss_sorted_probs_inclusive, "categorical",
            remark="stablehlo.composite: sampler fused only in part: fused as `categorical`"),
    Variant("easydel_per_row_top_p", easydel_per_row_top_p, "top_p_of_top_k_rows", expect={"k": 32}),
    Variant("tpu_inference_searched", tpu_inference_searched, "threshold_search_rows"),
    Variant("esurge_searched", esurge_searched, "esurge_searched_min_p_rows_row_keys"),
    # (at batch 1: its guards `jnp.any(k > 0)` of one row given as constants stay, as the form's template has them)
    Variant("esurge_searched_batch_of_one", esurge_searched, "esurge_searched_min_p_rows_row_keys", shape=(1, V)),
    Variant("near_miss_searched_top_p_strict", near_miss_searched_top_p_strict, "categorical",
            remark="stablehlo.composite: sampler fused only in part: fused as `categorical`; a softmax"),
    Variant("axlearn_searched_chain", axlearn_searched_chain, "searched_top_k_top_p_of_log_probs",
            expect={"k": 16, "p": 0.9, "temperature": 0.8}),
    Variant("axlearn_searched_top_k", axlearn_searched_top_k, "searched_top_k", expect={"k": 16, "temperature": 1.0}),
    Variant("axlearn_searched_chain_with_token_log_prob", axlearn_searched_chain_with_token_log_prob,
            "searched_top_k_top_p_of_log_probs", expect={"k": 16, "p": 0.9, "temperature": 0.8, "scores": True,
                                                         "fill": -1.0e7}),
    Variant("searched_top_k_with_log_prob", searched_top_k_with_log_prob, "searched_top_k",
            expect={"k": 16, "temperature": 0.7, "scores": True, "fill": -1.0e7}),
    Variant("searched_top_k_log_prob_of_the_scaled_logits", searched_top_k_log_prob_of_the_scaled_logits,
            "searched_top_k", expect={"k": 16, "temperature": 1.0, "scores": False}),
    Variant("near_miss_search_cutoff_read_beside_the_draw", near_miss_search_cutoff_read_beside_the_draw,
            "categorical", remark="stablehlo.composite: sampler fused only in part: fused as `categorical`; a "
            "threshold search"),
    Variant("near_miss_scores_read_before_the_key_is_split", near_miss_scores_read_before_the_key_is_split,
            "categorical", remark="stablehlo.composite: sampler fused only in part: fused as `categorical`; a "
            "threshold search"),
    Variant("near_miss_searched_top_k_strict", near_miss_searched_top_k_strict, "categorical",
            remark="stablehlo.composite: sampler fused only in part: fused as `categorical`; a threshold search"),
    Variant("megatron_top_p_multinomial", megatron_top_p_multinomial, "top_p_shifted_mask_choice",
            expect={"p": 0.9, "temperature": 0.7}),
    Variant("classic_top_p_categorical", classic_top_p_categorical, "top_p_shifted_mask",
            expect={"p": 0.85, "temperature": 0.8}),
    Variant("jax_top_k_by_sort_column", jax_top_k_by_sort_column, "top_k_keep_mask",
            expect={"k": 40, "temperature": 1.0}),
    Variant("mingpt_jax_top_k_below_sort_column", mingpt_jax_top_k_below_sort_column, "top_k_mask_inverse_cdf",
            shape=(V,), expect={"k": 40, "temperature": 1.0}),
    Variant("mingpt_jax_sample_with_log_softmax", mingpt_jax_sample_with_log_softmax, "top_k_mask_inverse_cdf",
            shape=(16, V), expect={"k": 40, "temperature": 1.0},
            remark="stablehlo.composite: sampler fused as `top_k_mask_inverse_cdf`, but XLA still computes its filter"),
    Variant("jax_top_k_below_sort_slice", jax_top_k_below_sort_slice, "top_k_mask",
            expect={"k": 40, "temperature": 0.7}),
    Variant("jax_top_k_then_unshifted_top_p_one_row", jax_top_k_then_unshifted_top_p_one_row,
            "top_k_top_p_unshifted_mask", shape=(V,), expect={"k": 40, "p": 0.9, "temperature": 0.7}),
    Variant("jax_unshifted_top_p", jax_unshifted_top_p, "top_p_unshifted_mask", expect={"p": 0.9, "temperature": 0.8}),
    Variant("sequence_top_k", sequence_top_k, "top_k_keep_mask", shape=(V,), expect={"k": 40, "temperature": 1.0}),
    Variant("sequence_top_k_top_p", sequence_top_k_top_p, "top_k_keep_top_p_descending_mask", shape=(V,),
            expect={"k": 40, "p": 0.9, "temperature": 0.7}),
    Variant("sequences_top_p_with_their_keys", sequences_top_p_with_their_keys, "top_p_descending_mask_row_keys",
            expect={"p": 0.9, "temperature": 0.8}),
    Variant("sequences_top_k_top_p_with_their_keys", sequences_top_k_top_p_with_their_keys,
            "top_k_keep_top_p_descending_mask_row_keys", expect={"k": 40, "p": 0.9, "temperature": 0.7}),
    Variant("sequences_top_k_with_one_key", sequences_top_k_with_one_key, "top_k_keep_mask_same_key_rows",
            expect={"k": 40, "temperature": 1.0}),
    Variant("sequence_min_p_in_logit_space", sequence_min_p_in_logit_space, "min_p_log_constant_mask", shape=(V,),
            expect={"min_p": 0.05, "temperature": 0.7}),
    Variant("sequence_min_p_in_logit_space_under_conds", sequence_min_p_in_logit_space_under_conds, "min_p_log_mask",
            shape=(V,), expect={"min_p": 0.1, "temperature": 0.8}),
    Variant("sequences_min_p_in_logit_space_with_their_keys", sequences_min_p_in_logit_space_with_their_keys,
            "min_p_log_constant_mask_row_keys", expect={"min_p": 0.05, "temperature": 0.7}),
    Variant("min_p_in_logit_space_of_a_batch", min_p_in_logit_space_of_a_batch, "min_p_log_mask",
            expect={"min_p": 0.1, "temperature": 1.0}),
    Variant("sequence_top_k_at_lax_kth_under_conds", sequence_top_k_at_lax_kth_under_conds, "top_k_keep_by_top_k_mask",
            shape=(V,), expect={"k": 40, "temperature": 0.7}),
    Variant("top_k_at_lax_kth_of_a_batch", top_k_at_lax_kth_of_a_batch, "top_k_keep_by_top_k_mask",
            expect={"k": 16, "temperature": 0.8}),
    Variant("sequences_top_k_at_lax_kth_with_one_key", sequences_top_k_at_lax_kth_with_one_key,
            "top_k_keep_by_top_k_mask_same_key_rows", expect={"k": 40, "temperature": 0.7}),
    Variant("near_miss_min_p_in_logit_space_removal", near_miss_min_p_in_logit_space_removal, "categorical",
            remark="stablehlo.composite: sampler fused only in part: fused as `categorical`; a mask against a row "
                   "statistic"),
    Variant("sequence_top_p_by_count_cutoff_under_conds", sequence_top_p_by_count_cutoff_under_conds,
            "top_p_count_cutoff_mask", shape=(V,), expect={"mode": "top_p", "p": 0.9, "temperature": 0.7}),
    Variant("sequences_top_p_by_count_cutoff_with_their_keys", sequences_top_p_by_count_cutoff_with_their_keys,
            "top_p_count_cutoff_mask_row_keys", expect={"p": 0.8, "temperature": 1.0}),
    Variant("sequences_top_p_by_count_cutoff_with_one_key", sequences_top_p_by_count_cutoff_with_one_key,
            "top_p_count_cutoff_mask_same_key_rows", expect={"p": 0.95, "temperature": 0.6}),
    Variant("near_miss_count_cutoff_strictly_above", near_miss_count_cutoff_strictly_above, "categorical",
            shape=(V,), remark="stablehlo.composite: sampler fused only in part: fused as `categorical`; the top-p "
                               "filter"),
    Variant("sequence_chain_top_k_top_p_min_p", sequence_chain_top_k_top_p_min_p, "min_p_log_constant_mask",
            shape=(V,), expect={"min_p": 0.05, "stages": ("top_k_keep_mask", "top_p_descending_mask")}),
    Variant("sequences_chain_top_k_top_p_min_p_with_their_keys", sequences_chain_top_k_top_p_min_p_with_their_keys,
            "min_p_log_constant_mask_row_keys",
            expect={"min_p": 0.05, "stages": ("top_k_keep_mask", "top_p_descending_mask")}),
    Variant("sequence_chain_top_k_then_count_cutoff_under_conds", sequence_chain_top_k_then_count_cutoff_under_conds,
            "top_p_count_cutoff_mask", shape=(V,), expect={"p": 0.9, "stages": ("top_k_keep_by_top_k_mask",)}),
    Variant("chain_min_p_then_top_k_of_a_batch", chain_min_p_then_top_k_of_a_batch, "top_k_keep_by_top_k_mask",
            expect={"k": 16, "temperature": 0.8, "stages": ("min_p_log_mask",)}),
    Variant("chain_min_p_then_top_k_mask_of_a_batch", chain_min_p_then_top_k_mask_of_a_batch, "top_k_mask",
            expect={"k": 16, "stages": ("min_p_log_mask",)}),
    Variant("chain_min_p_of_probs_then_top_k", chain_min_p_of_probs_then_top_k, "top_k_mask",
            expect={"k": 40, "stages": ("min_p_logits_mask",)}),
    Variant("chain_min_p_of_probs_then_temperature_then_top_k", chain_min_p_of_probs_then_temperature_then_top_k,
            "top_k_mask", expect={"k": 40, "stages": ("min_p_logits_mask",)}),
    Variant("chain_flax_top_p_then_min_p_of_probs", chain_flax_top_p_then_min_p_of_probs, "min_p_logits_mask",
            expect={"stages": ("top_p_flax_mask",)}),
    Variant("chain_top_k_then_top_a", chain_top_k_then_top_a, "top_a_logits_mask",
            expect={"stages": ("top_k_mask",)}),
    Variant("near_miss_chain_stage_read_elsewhere", near_miss_chain_stage_read_elsewhere, "min_p_log_constant_mask",
            shape=(V,), remark="stablehlo.composite: sampler fused only in part: fused as `min_p_log_constant_mask`; "
                               "a sort over the vocabulary", expect={"stages": ("top_p_descending_mask",)}),
    Variant("nnx_top_k_then_top_p", nnx_top_k_then_top_p, "top_k_keep_top_p_descending_mask",
            expect={"k": 40, "p": f32_below(0.9), "temperature": 0.7}),
    Variant("mingpt_top_k_then_classic_top_p", mingpt_top_k_then_classic_top_p, "top_k_top_p_flipped_mask",
            expect={"k": 40, "p": 0.9, "temperature": 0.8}),
    Variant("mingpt_top_k_then_classic_top_p_one_row", mingpt_top_k_then_classic_top_p, "top_k_top_p_flipped_mask",
            shape=(V,), expect={"k": 40, "p": 0.9, "temperature": 0.8}),
    Variant("nnx_top_k_below_sort_scalar", nnx_top_k_below_sort_scalar, "top_k_mask", shape=(V,),
            expect={"k": 40, "temperature": 1.0}),
    Variant("jax_classic_top_p_roll", jax_classic_top_p_roll, "top_p_flipped_mask",
            expect={"p": 0.9, "temperature": 0.7}),
    Variant("jax_classic_top_p_roll_one_row", jax_classic_top_p_roll, "top_p_flipped_mask", shape=(1, V),
            expect={"p": 0.9, "temperature": 0.7}),
    Variant("jax_classic_top_p_sorted_logits", jax_classic_top_p_sorted_logits, "top_p_flipped_mask",
            expect={"p": 0.85, "temperature": 0.8}),
    Variant("jax_classic_top_p_pad", jax_classic_top_p_pad, "top_p_flipped_mask",
            expect={"p": 0.95}),
    Variant("jax_classic_top_p_scattered_back", jax_classic_top_p_scattered_back, "top_p_flipped_mask",
            expect={"p": 0.9, "temperature": 0.7}),
    # (one prompt: JAX lowers a take along the last dim of (1, V) as a gather of one row, with no batch dims)
    Variant("jax_classic_top_p_scattered_back_one_row", jax_classic_top_p_scattered_back, "top_p_flipped_mask",
            shape=(1, V), expect={"p": 0.9, "temperature": 0.7}),
    Variant("jax_classic_top_p_sorted_apart", jax_classic_top_p_sorted_apart, "top_p_flipped_mask",
            expect={"p": 0.9, "temperature": 0.7}),
    Variant("jax_classic_top_p_descending_argsort", jax_classic_top_p_descending_argsort, "top_p_descending_mask",
            expect={"p": 0.9, "temperature": 0.7}),
    Variant("jax_classic_top_p_descending_at_or_above", jax_classic_top_p_descending_at_or_above,
            "top_p_descending_mask", expect={"p": f32_below(0.9), "temperature": 0.7}),
    Variant("jax_classic_top_p_one_row", jax_classic_top_p_one_row, "top_p_flipped_mask", shape=(V,),
            expect={"p": f32_below(0.85), "temperature": 0.8}),
    Variant("jax_classic_top_p_one_row_sorted_apart", jax_classic_top_p_one_row_sorted_apart, "top_p_flipped_mask",
            shape=(V,), expect={"p": 0.9, "temperature": 0.7}),
    Variant("old_hugging_face_top_k_top_p_multinomial", old_hugging_face_top_k_top_p_multinomial,
            "top_k_top_p_shifted_mask_choice", expect={"k": 40, "p": 0.9, "temperature": 0.7}),
    Variant("x_transformers_top_p_multinomial", x_transformers_top_p_multinomial, "top_p_shifted_logits_mask_choice",
            expect={"p": 0.9, "temperature": 0.8}),
    Variant("x_transformers_top_k_multinomial", x_transformers_top_k_multinomial, "top_k_exact_mask_choice",
            expect={"k": 26, "temperature": 0.9}),
    Variant("classic_top_p_at_or_above", classic_top_p_at_or_above, "top_p_shifted_mask_choice",
            expect={"p": f32_below(0.9), "temperature": 0.7}),
    Variant("x_transformers_min_p_multinomial", x_transformers_min_p_multinomial, "min_p_logits_mask_choice",
            expect={"min_p": 0.1, "temperature": 0.8}),
    Variant("x_transformers_min_p_categorical", x_transformers_min_p_categorical, "min_p_logits_mask",
            expect={"min_p": 0.1, "temperature": 0.8}),
    Variant("top_k_of_probs_at_t1", top_k_of_probs_at_t1, "top_k_of_probs", expect={"k": 16, "temperature": 1.0}),
    Variant("x_transformers_top_a_multinomial", x_transformers_top_a_multinomial, "top_a_logits_mask_choice",
            expect={"min_p": 0.02, "temperature": 0.8}),
    Variant("top_a_squared_categorical", top_a_squared_categorical, "top_a_logits_mask",
            expect={"min_p": 0.2, "temperature": 0.7}),
    Variant("near_miss_top_a_cubed", near_miss_top_a_cubed, "temperature",
            remark="stablehlo.composite: sampler fused only in part: fused as `temperature`; a softmax"),
    Variant("palm_gumbel_sample", palm_gumbel_sample, "temperature",
            expect={"temperature": 0.8, "gumbel_at_zero": -3.8297646045684814}),
    Variant("lucidrains_gumbel_top_k", lucidrains_gumbel_top_k, "top_k_mask",
            expect={"k": 16, "temperature": 0.9, "gumbel_at_zero": -3.8297646045684814}),
    Variant("lucidrains_gumbel_top_p", lucidrains_gumbel_top_p, "top_p_shifted_logits_mask",
            expect={"p": 0.9, "temperature": 0.8, "gumbel_at_zero": -3.8297646045684814}),
    Variant("hand_gumbel_of_log_softmax", hand_gumbel_of_log_softmax, "temperature_log_softmax",
            expect={"temperature": 0.7, "gumbel_at_zero": -3.8297646045684814}),
    Variant("near_miss_hand_gumbel_large_eps", near_miss_hand_gumbel_large_eps, None,
            remark="a hand-written Gumbel noise: its eps (1e-10, 1e-10) moves"),
    Variant("hand_gumbel_unguarded", hand_gumbel_unguarded, "categorical", expect={"gumbel_at_zero": -np.inf}),
    Variant("near_miss_hand_gumbel_of_one_minus_u", near_miss_hand_gumbel_of_one_minus_u, None,
            remark="argmax over noisy logits (threefry) matches no sampler form"),
    Variant("mask_from_a_branch", mask_from_a_branch, "categorical",
            remark="stablehlo.composite: sampler fused only in part: fused as `categorical`; the filters of a branch "
            "on traced values"),
    Variant("approximate_top_k", approximate_top_k, "temperature", expect={"temperature": 0.7},
            remark="stablehlo.composite: sampler fused only in part: fused as `temperature`; an approximate top-k "
            "over the vocabulary"),
    Variant("split_key_per_row", split_key_per_row, "temperature_row_keys", expect={"temperature": 0.7}),
    Variant("fold_in_row_top_k_mask", fold_in_row_top_k_mask, "top_k_mask_row_keys",
            expect={"k": 16, "temperature": 0.8}),
    Variant("vmapped_row_sampler", vmapped_row_sampler, "top_p_mask_row_keys", expect={"p": 0.9, "temperature": 0.7}),
    Variant("row_keys_of_other_rows", near_miss_row_keys_of_other_rows, "categorical_row_keys"),
    Variant("tunix_top_p", tunix_top_p, "top_p_of_logits_exclusive", expect={"p": 0.9, "temperature": 0.7}),
    Variant("tunix_top_k_top_p", tunix_top_k_top_p, "top_k_top_p_of_logits_exclusive",
            expect={"k": 32, "p": 0.95, "temperature": 0.8}),
    Variant("near_miss_logits_nucleus_inclusive", near_miss_logits_nucleus_inclusive, "categorical",
            remark="stablehlo.composite: sampler fused only in part: fused as `categorical`; the top-p filter "
                   "(chlo.top_k"),
    Variant("keras_hub_top_p", keras_hub_top_p, "top_p_of_probs", expect={"p": 0.9, "temperature": 0.7, "k": 0}),
    Variant("keras_hub_top_k_top_p", keras_hub_top_k_top_p, "top_k_top_p_of_probs",
            expect={"k": 24, "p": 0.8, "temperature": 1.0}),
    Variant("rank_space_nucleus_cumsum_lt", no_match_rank_space_nucleus_cumsum_lt, "categorical",
            remark="stablehlo.composite: sampler fused only in part: fused as `categorical`; the top-p filter "
                   "(chlo.top_k"),
    Variant("jetstream_top_k_tpu", jetstream_top_k, "top_k", expect={"k": 40}, platform="tpu"),
    Variant("top_k_then_top_p_cuda", top_k_then_top_p, "top_k_top_p_mask", expect={"k": 50}, platform="cuda"),
    Variant("no_match_noise_escapes", no_match_noise_escapes, None),
    Variant("keras_categorical_axis1", keras_categorical_axis1, "categorical"),
    Variant("no_match_categorical_axis0", no_match_categorical_axis0, None,
            remark="argmax over dim 0 (not the last): every sampler form draws over the last dim"),
    Variant("keras_hub_random", keras_hub_random, "temperature_log_of_softmax", expect={"temperature": 0.7}),
    Variant("keras_hub_top_k", keras_hub_top_k, "top_k_of_probs", expect={"k": 16, "temperature": 0.7}),
    Variant("gemma_top_p", gemma_top_p, "top_p_mask", expect={"temperature": 1.0, "p": 0.9}),
    Variant("scaled_then_top_k_mask_multinomial", scaled_then_top_k_mask_multinomial, "top_k_mask_choice",
            expect={"temperature": 1.0, "k": 20}),
    Variant("torchax_top_k_warper_multinomial", torchax_top_k_warper_multinomial, "top_k_mask_choice",
            expect={"temperature": 1.0, "k": 12}),
    Variant("nanogpt_top_k_through_torchax", nanogpt_top_k_through_torchax, "top_k_mask_choice",
            expect={"temperature": 1.0, "k": 20}),
    Variant("torchax_top_p_warper_multinomial", torchax_top_p_warper_multinomial, "top_p_ascending_mask_choice",
            expect={"temperature": 1.0, "p": 1 - float(np.float32(1 - 0.9))}),
    Variant("torchax_min_p_warper_multinomial", torchax_min_p_warper_multinomial, "min_p_removal_choice",
            expect={"temperature": 0.7, "min_p": 0.05}),
    Variant("torchax_top_k_top_p_warpers_multinomial", torchax_top_k_top_p_warpers_multinomial,
            "top_k_top_p_ascending_mask_choice", expect={"temperature": 1.0, "k": 50, "p": 1 - float(np.float32(0.1))}),
    Variant("torchax_top_p_min_p_warpers_multinomial", torchax_top_p_min_p_warpers_multinomial,
            "top_p_min_p_removal_choice",
            expect={"temperature": 0.7, "p": 1 - float(np.float32(0.1)), "min_p": float(np.float32(0.05))}),
    Variant("litgpt_top_k_multinomial", litgpt_top_k_multinomial, "top_k_exact_mask_choice",
            expect={"temperature": 0.8, "k": 50}),
    Variant("litgpt_top_k_top_p_multinomial", litgpt_top_k_top_p_multinomial, "top_k_exact_top_p_ascending_mask_choice",
            expect={"temperature": 0.8, "k": 50, "p": 1 - float(np.float32(0.1))}),
    Variant("torchax_top_k_min_p_argsort_multinomial", torchax_top_k_min_p_argsort_multinomial,
            "top_k_min_p_removal_choice", expect={"temperature": 1.0, "k": 50, "min_p": float(np.float32(0.1))}),
    Variant("flax_top_p_warper", flax_top_p_warper, "top_p_flax_mask",
            expect={"temperature": 1.0, "p": float(np.float32(0.9))}),
    Variant("flax_top_k_top_p_warpers", flax_top_k_top_p_warpers, "top_k_exact_top_p_flax_mask",
            expect={"temperature": 1.0, "k": 50, "p": float(np.float32(0.9))}),
    Variant("easydel_top_k_warper", easydel_top_k_warper, "top_k_keep_mask", expect={"temperature": 1.0, "k": 12}),
    Variant("easydel_top_k_top_p_warpers", easydel_top_k_top_p_warpers, "top_k_keep_top_p_flax_mask",
            expect={"temperature": 1.0, "k": 40, "p": float(np.float32(0.9))}),
    Variant("easydel_min_p_warper", easydel_min_p_warper, "min_p_sorted_removal",
            expect={"temperature": 1.0, "min_p": float(np.float32(0.1))}),
    Variant("gemma_top_k_by_batch_index", gemma_top_k_by_batch_index, "top_k", expect={"k": 24, "temperature": 0.6}),
    Variant("no_match_top_1_of_probs", no_match_top_1_of_probs, None, stochastic=False,
            remark="top_k with k = 1 over logits matches no sampler form (tried: none) (it draws from a softmax"),
    Variant("unknown_filter_is_categorical", unknown_filter_is_categorical, "categorical"),
    Variant("no_match_uniform_noise", no_match_uniform_noise, None),
    Variant("no_match_searchsorted_of_uniform", no_match_searchsorted_of_uniform, None,
            remark="an inverse-CDF draw"),
    Variant("pax_temperature", pax_temperature, "temperature_noise_scaled",
            expect={"mode": "temperature", "temperature": 0.7}),
    Variant("pax_top_k", pax_top_k, "top_k_noise_scaled", expect={"mode": "top_k", "k": 16, "temperature": 0.8}),
    Variant("pax_top_k_top_p", pax_top_k_top_p, "top_k_top_p_noise_scaled",
            expect={"mode": "top_k+top_p", "k": 24, "p": 0.9, "temperature": 0.6}),
    Variant("pax_top_p", pax_top_p, "top_p_noise_scaled",
            expect={"mode": "top_p", "p": 1 - float(np.float32(1.0 - 0.9)), "temperature": 0.7}),
    Variant("pax_epsilon", pax_epsilon, "epsilon_noise_scaled",
            expect={"mode": "epsilon", "epsilon": 3e-3, "temperature": 0.9}),
    Variant("pax_temperature_per_row", pax_temperature_per_row, "temperature_noise_scaled_rows",
            expect={"mode": "temperature"}),
    Variant("pax_top_k_top_p_per_row", pax_top_k_top_p_per_row, "top_k_top_p_noise_scaled_rows",
            expect={"mode": "top_k+top_p", "k": 24, "p": 0.9}),
    Variant("near_miss_pax_temperature_per_token", near_miss_pax_temperature_per_token, None),
    Variant("unsorted_top_p", unsorted_top_p, "temperature",
            expect={"temperature": 0.8, "stages": ("top_p_flipped_mask",)}),
]

LIT = Path(__file__).resolve().parents[1] / "passes" / "fuse_sampling.mlir"
HEADER = (
    "// Generated by test/python/sampling_variants.py from its VARIANTS; do not edit by hand.\n"
    "// RUN: hlofuse-opt %s --split-input-file"
    " --pass-pipeline='builtin.module(hlofuse-prepare,hlofuse-fuse-sampling)' | filecheck %s\n"
    "// RUN: hlofuse-opt %s --split-input-file --hlofuse-prepare --hlofuse-fuse-sampling --remarks"
    " 2>&1 >/dev/null | filecheck %s --check-prefix=REMARK\n"
)


def _lit_case(variant: Variant) -> str:
    text = lower(variant).as_text()
    name = f"sample_{variant.name}"  # not a name JAX gives its helpers (@argmax)
    text = re.sub(r"module @\S+", f"module @{name}", text, count=1)
    text = text.replace("func.func public @main(", f"func.func public @{name}(", 1)
    lines = [f"// CHECK-LABEL: func.func public @{name}("]
    if variant.form is None:
        lines += ['// CHECK-NOT: stablehlo.composite "hlofuse.sample"',
                  "// REMARK: remark: [hlofuse-fuse-sampling] {{.*}}sampler not fused" +
                  (f"{{{{.*}}}}{variant.remark}" if variant.remark else "")]
    else:
        lines += [f'// CHECK: stablehlo.composite "hlofuse.sample"{{{{.*}}}}form = "{variant.form}"',
                  *(["// CHECK-SAME: scores = true"] if variant.expect.get("scores") else []),
                  *(f'// CHECK-SAME: {{form = "{stage}"' for stage in variant.expect.get("stages", ())),
                  '// CHECK-NOT: stablehlo.composite "hlofuse.sample"',
                  "// CHECK: func.func private @hlofuse.sample.impl"]
        if variant.remark:
            lines += [f"// REMARK: remark: [hlofuse-fuse-sampling] {variant.remark}"]
    return "\n".join(lines) + "\n" + text


def render_lit() -> str:
    return HEADER + "\n// -----\n\n".join(_lit_case(v) for v in VARIANTS)


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        sys.exit(0 if LIT.read_text() == render_lit() else 1)
    LIT.write_text(render_lit())
    print(f"wrote {LIT} ({len(VARIANTS)} cases)")
