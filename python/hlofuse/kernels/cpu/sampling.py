"""Token sampling on the CPU: the `hlofuse_sample` XLA FFI kernel (sampling.cc) and its binding.

`sample` returns the token ids of `sample_reference` (the composite's contract) for the forms it
supports, without sorting the vocabulary: one pass for the row max (and the softmax sum where a filter
needs probabilities), a pivot search for the top-k / top-p / min-p threshold over the few candidates
that can pass it, then Gumbel noise from threefry2x32 computed only at the counters of the surviving
tokens. Rows run in parallel, and a row's vocabulary is split across threads when rows are few.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np

from hlofuse.kernels import cpu
from hlofuse.kernels.noise import categorical_at_zero
from hlofuse.kernels.sampling_reference import (
    COUNT_CUTOFF_EPS,
    DRAWS,
    ESURGE_FILL,
    FORMS,
    HAND_NOISE_DRAWS,
    JAX_CLASSIC_CHAINS,
    JAX_CLASSIC_CUTS,
    JAX_UNSHIFTED_CHAINS,
    JAX_UNSHIFTED_CUTS,
    MTJ_MASK,
    NEG_INF,
    NOISE_SCALED,
    NOISE_SCALED_ROWS,
    NORMALIZED_NUCLEUS,
    RANK_NUCLEI,
    ROW_KEY_DRAWS,
    SEARCHED_FORMS,
    SHARED_NOISE_DRAWS,
    TOP_P_CHAINS,
    UNCERTIFIED,
    Categorical,
    RankNucleus,
    Stage,
    TopKFilter,
    after_stages,
    esurge_min_p_mask,
    exponential_race_scores,
    flax_top_p_keep,
    form_params,
    gives_scores,
    inverse_cdf_draw,
    inverse_cdf_of_sorted,
    jax_cut,
    keep_exactly_top_k,
    last_column,
    levanter_kept_in_rank_order,
    log_floored,
    mask_top_k,
    masked_top_k,
    merge_vocab_splits,
    min_p_masked,
    mtj_sorted_removal,
    nucleus_cut_slack,
    nucleus_probs,
    prelude_of,
    prob_sorted_top_p_scores,
    probs_of_rows,
    rank_masks,
    rank_nucleus_scores,
    recording_draw,
    reference_where_uncertified,
    row_sums,
    row_values,
    sample_reference,
    sample_reference_with_scores,
    scale_rows,
    simply_top_p_keep,
    sorted_top_p_removal,
    top_k_first,
    top_p_removal,
    top_p_removed,
    torch_sort_descending,
    typical_removal,
)
from hlofuse.kernels.target import CompositeCall, KernelSpec, Lowered, Partitioning, Unsupported, lowered
from hlofuse.ops.sample import SAMPLE, SampleAttrs
from hlofuse.partition.cuts import Cuts, sample_cuts

TARGET = "hlofuse_sample"
TOP_K_TARGET = "hlofuse_sample_top_k"
TOP_MASS_TARGET = "hlofuse_sample_top_mass"
SORT_TARGET = "hlofuse_sample_sort"
SORT_DESCENDING_TARGET = "hlofuse_sample_sort_descending"
SORT_INTEGERS_TARGET = "hlofuse_sample_sort_integers"
NUCLEUS_BAND_TARGET = "hlofuse_sample_nucleus_band"
AT_OR_ABOVE_TARGET = "hlofuse_sample_at_or_above"
WHOLE_ROWS_TARGET = "hlofuse_sample_whole_rows"
NOISE_BITS_TARGET = "hlofuse_sample_noise_bits"
# form -> the kernel's form code (sampling.cc: enum class Form).
FORM_CODES = {"greedy": 0, "categorical": 1, "temperature": 1, "top_k": 2,
              "temperature_top_k": 3, "top_k_mask": 4, "top_p_mask": 5, "top_k_top_p_mask": 6, "min_p": 7,
              "greedy_softmax": 10}

# The kernel's own forms, no composite's: rank-space top-k over packed (value, id-bits) f32 candidates, the
# values rounding as f32 or as bf16 (`_sample_rank_top_k_splits`).
PACKED_FORM_CODES = {"top_k_packed": 8, "top_k_packed_bf16": 9}
# top_p_mask's draw for a nucleus whose program sums its cumsum from the smallest logit (Hugging Face's `cumsum <= 1 -
# p`): the band's slack is that of the 1 - p the cumsum reaches there (sampling.cc, "Certified nucleus cut").
FROM_BELOW_FORM_CODES = {"top_p_mask_from_below": 11}
# A categorical whose noise is scaled instead of the logits, argmax(x + gumbel * T) (Pax's draw), f32 only.
# With a scale per row, the optional operand (*L,) f32 (Pax's per-request temperature).
NOISE_SCALED_FORM_CODES = {"categorical_noise_scaled": 12, "categorical_noise_scaled_rows": 13}
# top_p_mask's and top_p_mask_from_below's draws from the nucleus's log-probabilities (log_softmax, log(softmax),
# jax.random.choice's log p), f32, T > 0: drawn over x / T in the band, the winner vouched for where it also leads the
# runner-up by more than the normaliser's rounding (sampling.cc, `LeadsPastRounding`).
LOG_PROB_FORM_CODES = {"top_p_mask_log_prob": 14, "top_p_mask_from_below_log_prob": 15}
KERNEL_FORM_CODES = {**PACKED_FORM_CODES, **FROM_BELOW_FORM_CODES, **NOISE_SCALED_FORM_CODES, **LOG_PROB_FORM_CODES}
# The nucleus forms whose cut the kernel does not decide alone: it draws among the tokens at or above the band of
# values the program's f32 rounding of its softmax and cumsum could move the cut across, and a winner in that band
# is UNCERTIFIED, for the program's own cut (`_nucleus_of_sorted_row`) to decide.
CERTIFIED_NUCLEI = ("top_p_mask", "top_k_top_p_mask")

# Forms whose filter compares probabilities: the program rounds them (and their cumulative sum) to bf16.
BF16_UNSUPPORTED = ("top_p_mask", "top_k_top_p_mask", "min_p")


def is_available() -> bool:
    """True when the native library is built and exports the sampling kernel."""
    if not cpu.is_available():
        return False
    try:
        return bool(getattr(cpu._load(), TARGET))
    except AttributeError:
        return False


def isa() -> str:
    """The vector ISA the sampler picks here: "avx512", "avx2" or "generic" ($HLOFUSE_CPU_ISA lowers it)."""
    fn = cpu._load().hlofuse_sample_isa
    fn.restype = ctypes.c_char_p
    return str(fn().decode())


def noise_stats() -> tuple[int, int]:
    """(noise draws, exact noise evaluations) over all rows since the last call: what the Gumbel bound left."""
    draws, logs = ctypes.c_int64(0), ctypes.c_int64(0)
    cpu._load().hlofuse_sample_stats(ctypes.byref(draws), ctypes.byref(logs))
    return draws.value, logs.value


def sample(
    logits: jax.Array,  # (..., V) f32 or bf16
    key: jax.Array | None,  # (2,) uint32
    *,
    form: str,
    temperature: float = 1.0,
    k: int = 0,
    p: float = 1.0,
    min_p: float = 0.0,
    gumbel_at_zero: float | None = None,  # a hand-written noise's value where the uniform is 0 (SampleAttrs)
) -> jax.Array:  # (...,) int32
    """`sample_reference`'s token ids, computed by the native CPU kernel."""
    if form not in FORM_CODES:
        raise ValueError(f"the CPU sampler has no form '{form}'")
    params = form_params(form, temperature=temperature, k=k, p=p, min_p=min_p)
    batch, vocab = logits.shape[:-1], logits.shape[-1]
    rows = int(np.prod(batch, dtype=np.int64))
    keys = _keys(key, (rows,))
    row_ids = jax.lax.iota(jnp.int32, rows)
    (tokens,) = _sample_call(logits.reshape(rows, vocab), keys, row_ids, form=form, gumbel_at_zero=gumbel_at_zero,
                             **params)
    tokens = tokens.reshape(batch)
    if _draws_minus_inf_at_zero(gumbel_at_zero) and form not in CERTIFIED_NUCLEI:
        return reference_where_uncertified(
            tokens, lambda: sample_reference(logits, key, form=form, gumbel_at_zero=gumbel_at_zero, **params))
    if form == "greedy_softmax":  # the program's softmax, run only when some row is near a tie
        return reference_where_uncertified(tokens, lambda: sample_reference(logits, key, form=form, **params))
    if form in CERTIFIED_NUCLEI:  # the program's cut, run only when some row drew in its band
        return reference_where_uncertified(
            tokens, lambda: _nucleus_of_sorted_row(logits, key, form, params, gumbel_at_zero))
    return tokens


def _draws_minus_inf_at_zero(gumbel_at_zero: float | None) -> bool:
    """Whether a hand-written noise is -inf where the uniform is 0 (-log(-log(u)) with no guard): the kernel then
    leaves UNCERTIFIED the rows where that decides the draw (a +inf logit, or every candidate drawing u = 0), for the
    caller to draw by the program's own ops."""
    return gumbel_at_zero == -np.inf


def _nucleus_of_sorted_row(logits: jax.Array, key: jax.Array | None, form: str, params: dict[str, Any],
                           gumbel_at_zero: float | None = None) -> jax.Array:
    """A form of CERTIFIED_NUCLEI as the program computes it, its row sorted by the kernel (the same values in the
    same places: ties are equal values), its top-k and draw by the kernel: no sort in XLA."""
    def descending(x: jax.Array) -> jax.Array:
        return _sorted_by(SORT_TARGET, x)[0][..., ::-1]

    return FORMS[form].fn(logits, key, **params, descending_fn=descending, top_k_fn=_top_k_by_kernel,
                          categorical_fn=_kernel_categorical(False, gumbel_at_zero=gumbel_at_zero)).astype(jnp.int32)


def _keys(key: jax.Array | None, lead: tuple[int, ...]) -> jax.Array:
    """The key, one copy per row (the batch partitioner cuts every operand's leading dims alike)."""
    if key is None:
        key = jnp.zeros((2,), jnp.uint32)
    return jnp.broadcast_to(key.astype(jnp.uint32), (*lead, 2))


def _sample_call(
    logits: jax.Array,  # (*L, V)
    keys: jax.Array,  # (*L, 2) uint32
    row_ids: jax.Array,  # (*L,) int32: each row's global index, from which its noise is counted
    offsets: jax.Array | None = None,  # (*L,) int32: each row's first token in a vocabulary of vocab_total
    scales: jax.Array | None = None,  # (*L,) f32: each row's noise scale (form categorical_noise_scaled_rows only)
    *,
    vocab_total: int = 0,
    with_scores: bool = False,
    form: str,
    temperature: float,
    k: int,
    p: float,
    min_p: float,
    gumbel_at_zero: float | None = None,  # f32 logits: a hand-written noise's value where the uniform is 0
) -> list[jax.Array]:  # tokens (*L,) int32 [, scores (*L,) f32]
    code = FORM_CODES.get(form, KERNEL_FORM_CODES.get(form))
    if code is None:
        raise ValueError(f"the CPU sampler has no form '{form}'")
    if logits.dtype not in (jnp.float32, jnp.bfloat16):
        raise ValueError(f"logits must be float32 or bfloat16, got {logits.dtype}")
    cpu.register()
    lead = logits.shape[:-1]
    out_types = [jax.ShapeDtypeStruct(lead, jnp.int32)]
    if with_scores:
        out_types.append(jax.ShapeDtypeStruct(lead, jnp.float32))
    operands = [logits, keys, row_ids] if offsets is None else [logits, keys, row_ids, offsets.astype(jnp.int32)]
    if scales is not None:
        operands.append(scales.astype(jnp.float32))
    call = jax.ffi.ffi_call(TARGET, out_types, vmap_method="sequential")
    return list(call(*operands, form=np.int64(code), temperature=np.float32(temperature),
                     k=np.int64(k), p=np.float32(p), min_p=np.float32(min_p), vocab_total=np.int64(vocab_total),
                     gumbel_at_zero=np.float32(np.nan if gumbel_at_zero is None else gumbel_at_zero)))


#===--- Vocabulary splits ---------------------------------------------------------------------===#
# A row's vocabulary in P splits, each sampled by its own kernel row with the noise the whole row draws
# for its tokens (counter row * V + global id), then merged by (score, id): the partial results of a
# vocabulary sharded over devices. Only forms whose keep-set is the whole row split this way; the rest
# need a row-wide threshold or rank first (`partitioned_lowering`).
SPLIT_FORMS = ("greedy", "categorical", "temperature")


def sample_splits(
    logits: jax.Array,  # (R, P, V/P) f32 or bf16: split p holds tokens [p * V/P, (p + 1) * V/P)
    key: jax.Array | None,  # (2,) uint32
    *,
    form: str,
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array]:  # ids (R, P) int32 in the global vocabulary, scores (R, P) f32
    """Each split's winner and its score (the logit for greedy, round(gumbel + logit / T) otherwise), drawn
    with the noise `sample` draws for the same tokens of the whole (R, V) row. `merge_vocab_splits`
    combines them into `sample`'s ids."""
    if form not in SPLIT_FORMS:
        raise ValueError(f"'{form}' cannot be sampled per vocabulary split (splits: {SPLIT_FORMS})")
    rows, splits, width = logits.shape
    row_ids = jnp.broadcast_to(jax.lax.iota(jnp.int32, rows)[:, None], (rows, splits))
    offsets = jnp.broadcast_to(jax.lax.iota(jnp.int32, splits)[None, :] * width, (rows, splits))
    tokens, scores = _sample_call(logits, _keys(key, (rows, splits)), row_ids, offsets, vocab_total=splits * width,
                                  with_scores=True, form=form, temperature=temperature, k=0, p=1.0, min_p=0.0)
    return tokens, scores


def _kernel_categorical(shared_noise: bool, row_keys: bool = False,
                        gumbel_at_zero: float | None = None) -> Callable[..., jax.Array]:
    """jax.random.categorical(key, z, axis=-1) by the kernel (form categorical: the same ids for f32 and bf16 z, and a
    row's first NaN where it has one, as argmax takes it). With `shared_noise` every row draws row 0's noise, as
    jax.random.choice does row by row with one key; with `row_keys` the key is (B, 2), one per row of (B, n) z, each
    row drawing counters 0..n-1 under its own (sampling_reference.row_keys_draw); with `gumbel_at_zero`, f32 z drawn
    with a hand-written noise (noise.categorical_at_zero)."""

    def draw(key: jax.Array, z: jax.Array, axis: int = -1) -> jax.Array:
        if axis not in (-1, z.ndim - 1):
            raise ValueError("the kernel draws over the last axis")
        batch, vocab = z.shape[:-1], z.shape[-1]
        rows = int(np.prod(batch, dtype=np.int64))
        row_ids = jnp.zeros((rows,), jnp.int32) if shared_noise or row_keys else jax.lax.iota(jnp.int32, rows)
        keys = key.astype(jnp.uint32).reshape(rows, 2) if row_keys else _keys(key, (rows,))
        params = form_params("categorical")
        (tokens,) = _sample_call(z.reshape(rows, vocab), keys, row_ids, form="categorical",
                                 gumbel_at_zero=gumbel_at_zero, **params)
        tokens = tokens.reshape(batch)
        if _draws_minus_inf_at_zero(gumbel_at_zero):
            if shared_noise or row_keys:
                raise ValueError("a noise of -inf at a zero uniform is drawn with one key's noise per row only")
            return reference_where_uncertified(tokens, lambda: categorical_at_zero(-np.inf)(key, z))
        return tokens

    return draw


def _choice_by_kernel(key: jax.Array, y: jax.Array, axis: int = -1) -> jax.Array:
    """sampling_reference.choice_draw: per row top_k(gumbel + log p, 1), the same noise for every row, which is
    the argmax of each row's log p plus row 0's noise (top_k with k = 1 orders as argmax: NaN first, then the
    lower id). One row (n,) gives (1,), as torch.multinomial of one row does."""
    tokens = _kernel_categorical(shared_noise=True)(key, jnp.log(jax.nn.softmax(y, axis=-1)))
    return tokens.reshape(1) if y.ndim == 1 else tokens


def _multinomial_by_kernel(key: jax.Array, probs: jax.Array) -> jax.Array:
    """sampling_reference.torch_multinomial of (B, n) probabilities: per row top_k(gumbel + log p, 1) with one key's
    noise for every row, as `_choice_by_kernel` draws it; (B, 1) positions."""
    return _kernel_categorical(shared_noise=True)(key, jnp.log(probs))[:, None]


def drawn_form_lowering(form: str, params: dict[str, Any],
                        gumbel_at_zero: float | None = None) -> Callable[..., jax.Array]:
    """A form `<base>_<draw>` (a draw of sampling_reference.DRAWS): the form's own function, whose filters and
    log-probabilities run in JAX with the program's ops (so the same bits), with the kernel in place of its
    categorical draw, its top-k and its nucleus's descending sort (`_descending_values_by_kernel`). The kernel prunes
    the noise, the filters run as XLA runs them, and no sort is left to XLA. JetStream's nucleus under a draw of
    BAND_DRAWS (BANDED_DRAWN_NUCLEI, f32 (B, V) logits) is drawn first in its band (`nucleus_draw_in_band`), with no
    sort at all; only a batch the band cannot vouch for runs the form's own function. (A writing's fill is -inf to
    the composite: FILL_NOTE. `gumbel_at_zero`: a hand-written noise's, HAND_NOISE_FILTERS.)"""
    base = FORMS[FORMS[form].base].fn
    categorical_fn = _draw_by_kernel(form, gumbel_at_zero)
    by_band = form in BANDED_DRAWN_NUCLEI

    def kernel(logits: jax.Array, key: jax.Array | None = None) -> jax.Array:
        def own() -> jax.Array:
            return base(logits, key, categorical_fn=categorical_fn, top_k_fn=_top_k_by_kernel,
                        descending_fn=_descending_values_by_kernel, **params)

        if not by_band or logits.dtype != jnp.float32 or logits.ndim != 2:
            return own()
        top_k = params["k"] if "k" in FORMS[form].params else None
        tokens = nucleus_draw_in_band(FORMS[form].drawn_by, logits, key, params, top_k, from_below=False,
                                      by_place=False, gumbel_at_zero=gumbel_at_zero)
        return reference_where_uncertified(tokens, own)

    return kernel


def _descending_values_by_kernel(x: jax.Array) -> jax.Array:
    """sampling_reference.descending (`jnp.sort(x)[..., ::-1]`) by the kernel's radix sort: the same values in the same
    places, but for which of -0 and +0 (equal) comes first, which the nucleus's softmax, cumsum and `x < cutoff`
    cannot tell apart. XLA's CPU sort of a 128256-logit row takes tens of milliseconds."""
    return _sorted_values_by_kernel(x)[..., ::-1]


# Forms the kernel has no code for that run as their own function, its top-k and categorical by the kernel: the
# other ops (a softmax, a log) are the program's, so the same bits.
# (tunix's nucleus of all V sorted logits takes the kernel's full descending sort, lax.top_k's order to the bit;
# gemma 3.1.0's top-p, where its count bound cannot vouch for the draw, the kernel's ascending sort, whose values are
# jnp.sort's: ties are equal values.)
# (x-transformers' min-p and top-a of the logits, then / T: the program's softmax and mask, elementwise, and the
# kernel's draw; a min-p in logit space likewise: the program's max, log and compare.)
# (Haiku's and grok-1's nucleus reads only the sorted values, a cut by value: the kernel's ascending sort.)
# (audiocraft's top-k and a hand-written min-p of the probabilities, renormalised or not, drawn by torch.multinomial:
# the program's softmax, zeroing and sum, the kernel's top-k and draw of their logs.)
FUNCTION_FORMS = ("top_k_of_probs", "top_k_top_p_of_logits", "top_k_exact_mask", "top_p_of_logits_exclusive",
                  "top_k_top_p_of_logits_exclusive", "top_p_ascending_count_mask", "top_k_of_probs_torch",
                  "min_p_logits_mask", "top_a_logits_mask", "top_p_haiku_mask", "top_p_haiku_logits_mask",
                  "top_k_of_probs_torch_unnormalized",
                  "min_p_of_probs_torch", "min_p_of_probs_torch_unnormalized", "top_p_simply_mask",
                  "top_k_top_p_simply_mask", "min_p_log_mask", "min_p_log_constant_mask",
                  "top_k_keep_by_top_k_mask", "top_p_count_cutoff_mask")
# A function form whose filter compares bf16-rounded probabilities (as BF16_UNSUPPORTED's).
BF16_UNSUPPORTED_FUNCTION_FORMS = ("min_p_logits_mask", "top_a_logits_mask", "min_p_of_probs_torch",
                                   "min_p_of_probs_torch_unnormalized")
# The forms of all V sorted logits: in bf16 their softmax and cumsum round as XLA fuses them next to its own sort,
# which the kernel's sorted row does not reproduce.
WHOLE_ROW_FUNCTION_FORMS = ("top_p_of_logits_exclusive", "top_p_ascending_count_mask", "top_p_haiku_mask",
                            "top_p_haiku_logits_mask", "top_p_simply_mask", "top_p_count_cutoff_mask")
# Haiku's and grok-1's nucleus, and perceiver-ar's of the logits: drawn by their band first (`_haiku_nucleus_by_band`).
HAIKU_NUCLEI = ("top_p_haiku_mask", "top_p_haiku_logits_mask")


def _whole_row_by_kernel(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """lax.top_k(x, V) of x (..., V) by the kernel's descending sort (the same values and ids, NaN included)."""
    del k  # every rank
    values, ids = _sort_descending_by_kernel(x.reshape(-1, x.shape[-1]))
    return values.reshape(x.shape), ids.reshape(x.shape)


def _sorted_values_by_kernel(x: jax.Array) -> jax.Array:
    """jnp.sort(x) of x (..., V) by the kernel's ascending sort (the same values in the same places)."""
    return _sort_by_kernel(x.reshape(-1, x.shape[-1]))[0].reshape(x.shape)


def _argsort_descending_by_kernel(x: jax.Array) -> jax.Array:
    """sampling_reference.argsort_descending_stable (`jnp.argsort(x, descending=True)`) of x (..., V) as JAX computes
    it, by the kernel's stable ascending sort: of the row reversed, its ids mapped back and reversed (equal values by
    the lower id first; -0 and +0 equal, NaN largest)."""
    vocab = x.shape[-1]
    ids = _sort_by_kernel(x.reshape(-1, vocab)[:, ::-1])[1]
    return (vocab - 1 - ids)[:, ::-1].reshape(x.shape)


def _put_back_by_scatter(order: jax.Array, values: jax.Array) -> jax.Array:
    """sampling_reference.put_back_by_sort (`lax.sort_key_val(order, values)[1]`) with no sort: each value set at the
    id `order` lists for its place."""
    vocab = order.shape[-1]
    return _scattered(values.reshape(-1, vocab), order.reshape(-1, vocab)).reshape(values.shape)


def _kept_ids_by_scatter(ids: jax.Array, keep: jax.Array, vocab: int) -> jax.Array:
    """sampling_reference.kept_ids_by_one_hot with no (..., k, V) one-hot: `keep` set at each row's (distinct) ids in
    a row of False."""
    rows = keep.reshape(-1, keep.shape[-1])
    return _scattered(jnp.pad(rows, ((0, 0), (0, vocab - rows.shape[-1]))),
                      jnp.pad(ids.reshape(rows.shape), ((0, 0), (0, vocab - rows.shape[-1])),
                              constant_values=vocab)).reshape((*keep.shape[:-1], vocab))


def simply_top_p_keep_by_candidates(y: jax.Array, p: float) -> jax.Array:
    """simply_top_p_keep (google-deepmind/simply's nucleus) of f32 y (..., V) with no sorted row
    (`_simply_keep_of_candidates`). A batch the candidates cannot vouch for, bf16, a row no wider than the candidates
    and p outside (0, 1) run the keep on the kernel's stable argsort of the whole row, in a conditional's branch."""
    def whole() -> jax.Array:  # (the conditional's result as rows: simply's (B, 1, V) gave its branches two layouts)
        return simply_top_p_keep(y, p, _argsort_descending_by_kernel, _put_back_by_scatter).reshape(-1, y.shape[-1])

    if y.dtype != jnp.float32 or y.shape[-1] <= NUCLEUS_CANDIDATES or not 0.0 < p < 1.0:
        return whole().reshape(y.shape)
    keep, vouched = _simply_keep_of_candidates(y, p)  # (the program's softmax of y as the program shapes it)
    return jax.lax.cond(jnp.all(vouched), lambda: keep.reshape(-1, y.shape[-1]), whole).reshape(y.shape)


def _simply_keep_of_candidates(y: jax.Array, p: float) -> tuple[jax.Array, jax.Array]:
    """simply_top_p_keep of f32 y (..., V) from the kernel's top candidates by mass, and whether each row's is vouched
    for. The program's probabilities are softmax(y) in id order (its op, so its values), and the candidates
    (`hlofuse_sample_top_mass`: by probability, lower id first among equal ones) are the first ranks of its argsort's
    row: the same values in the same places as by y, as a larger y never has a smaller probability. The program's
    exclusive cumsum over them is the first ranks of its cumsum over the row (as for the rank-space nuclei), and a
    rank past them is dropped (their mass passes p by the margin). So the program keeps its first j ranks, and those
    are the tokens whose probability is at least the last kept one's, when no more tokens than j have one: which of
    equal probabilities takes a rank is the argsort's (by y), so a row where another token ties the last kept one is
    not vouched for (nor one whose candidates do not hold its nucleus, or a NaN)."""
    probs = jax.nn.softmax(y, axis=-1)
    values, _ = _top_mass_by_kernel(probs, NUCLEUS_CANDIDATES, p + 2 * NUCLEUS_MARGIN)
    keep = jnp.cumulative_sum(values, axis=-1, include_initial=True)[..., :-1] < p
    last_kept = jnp.min(jnp.where(keep, values, jnp.inf), axis=-1, keepdims=True)
    kept = probs >= last_kept
    vouched = _rows_holding_nucleus(values, p) & (jnp.sum(kept, axis=-1) == jnp.sum(keep, axis=-1))
    return kept, vouched


def function_form_lowering(form: str, params: dict[str, Any], gumbel_at_zero: float | None = None,
                           scores_fill: float | None = None) -> Callable[..., Any]:
    """A form of FUNCTION_FORMS: its function with the kernel's top-k (or sort) and categorical draw. tunix's nucleus
    of all V sorted logits (f32) is drawn by its band first (`_rank_nucleus_by_band`), Haiku's too
    (`_haiku_nucleus_by_band`), and gemma 3.1.0's top-p by its count bound (`_ascending_count_by_mass`): the sorted row
    only for the batches those cannot vouch for. With a hand-written noise (`gumbel_at_zero`), its function without
    those bounds. With `scores_fill` (a form that `gives_scores`): (ids, the filtered logits its categorical drew
    from, the dropped at that fill), both from its function."""
    fn = FORMS[form].fn
    top_k_fn = _whole_row_by_kernel if form == "top_p_of_logits_exclusive" else _top_k_by_kernel
    # (audiocraft's top-k draws by torch.multinomial of its probabilities: the kernel's draw of their logs)
    draws = {"draw_fn": _multinomial_by_kernel} if FORMS[form].draw == "top_k" else {}
    # (simply's nucleus: its argsort and its sort_key_val back by the kernel's sort and a scatter)
    orders = {"argsort_fn": _argsort_descending_by_kernel, "put_back_fn": _put_back_by_scatter,
              "mask_fn": _kept_ids_by_scatter}
    if form == "top_p_simply_mask":  # (its nucleus from the kernel's top candidates by mass: no sorted row)
        orders["keep_fn"] = simply_top_p_keep_by_candidates
    categorical_fn = _kernel_categorical(False, gumbel_at_zero=gumbel_at_zero)

    def with_scores(logits: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        draw, drawn_from = recording_draw(categorical_fn)
        ids = fn(logits, key, categorical_fn=draw, top_k_fn=top_k_fn, sort_fn=_sorted_values_by_kernel, **orders,
                 fill=scores_fill, **params)
        return ids, drawn_from[0]

    if scores_fill is not None:
        return with_scores

    def kernel(logits: jax.Array, key: jax.Array | None = None) -> jax.Array:
        def own() -> jax.Array:
            return fn(logits, key, categorical_fn=categorical_fn, top_k_fn=top_k_fn, sort_fn=_sorted_values_by_kernel,
                      descending_fn=_descending_values_by_kernel, **orders, **draws, **params)

        if form == "top_k_of_probs":  # a NaN row of probabilities: id 0 (_id_0_where_nan)
            return _id_0_where_nan(nucleus_probs(logits, params["temperature"]), own())
        if gumbel_at_zero is not None:  # (the bounds below draw by kernel calls of JAX's noise)
            return own()
        if form == "top_p_of_logits_exclusive" and logits.dtype == jnp.float32 and logits.ndim == 2:
            return reference_where_uncertified(_rank_nucleus_by_band(logits, key, params), own)
        if (form == "top_p_ascending_count_mask" and logits.dtype == jnp.float32 and logits.ndim == 2
                and 0.0 < params["p"] < 1.0):
            return reference_where_uncertified(_ascending_count_by_mass(logits, key, params), own)
        if form == "top_p_count_cutoff_mask" and logits.dtype == jnp.float32 and 0.0 < params["p"] < 1.0:
            return reference_where_uncertified(_count_cutoff_by_mass(logits, key, params), own)
        if form in HAIKU_NUCLEI and logits.dtype == jnp.float32 and 0.0 < params["p"] < 1.0:
            return reference_where_uncertified(_haiku_nucleus_by_band(logits, key, params, form), own)
        return own()

    return kernel


def _haiku_nucleus_by_band(logits: jax.Array, key: jax.Array, params: dict[str, Any],
                           form: str = "top_p_haiku_mask") -> jax.Array:
    """Haiku's and grok-1's nucleus (`top_p_haiku_mask`) of (..., V) f32 logits with no sort: a cut by value from
    below (the smallest values removed while their ascending cumsum is below 1 - p, every copy of the cut's value
    kept), so the band of a nucleus from below by value holds it (its slack covers `>=` as `>`), of y = x / T by the
    program's op, drawn at T = 1; perceiver-ar's (`top_p_haiku_logits_mask`) the band of the logits, drawn at T.
    UNCERTIFIED where the band could hold the winner, and for a row with a NaN or an infinity."""
    rows = logits.reshape(-1, logits.shape[-1])
    of_logits = form == "top_p_haiku_logits_mask"
    y, temperature = (rows, params["temperature"]) if of_logits else (rows / params["temperature"], 1.0)
    tokens = nucleus_draw_by_band("", y, key, params["p"], temperature, from_below=True, by_place=False)
    return tokens.reshape(logits.shape[:-1])


def _ascending_count_by_mass(logits: jax.Array, key: jax.Array, params: dict[str, Any]) -> jax.Array:
    """gemma 3.1.0's top-p (`top_p_ascending_count_mask`) with no sort, for 0 < p < 1. The program removes the
    `count` smallest of y = x / T (those below the count-th of its ascending sort), where count is how many ascending
    places have a cumsum of at least p: a place whose cumsum reaches p (less the program's rounding, `slack`) has at
    most 1 - p + slack of mass above it, so count is at most the number m of largest probabilities it takes to pass
    that mass (the kernel's top-mass candidates, with its own rounding added). A token at or above at least m + 1 of
    the row's values (itself included) is kept, so the kernel's draw over every token is the program's when its
    winner is one: UNCERTIFIED otherwise (also a row with a NaN or an infinity, whose mass passes nothing)."""
    y = logits / params["temperature"]
    vocab = y.shape[-1]
    slack = nucleus_cut_slack(vocab, vocab, 1.0, own_terms=2 * vocab)  # the program's cumsum and ours, from 1
    mass = 1.0 - params["p"] + slack + NUCLEUS_MARGIN
    values, _ = _top_mass_by_kernel(jax.nn.softmax(y, axis=-1), min(vocab, NUCLEUS_CANDIDATES), mass)
    cumulative = jnp.cumsum(values, axis=-1)
    held = cumulative[:, -1] > mass
    at_most = jnp.sum(cumulative <= mass, axis=-1) + 1  # a bound on the program's count where `held`
    tokens = _kernel_categorical(False)(key, y)
    winner = jnp.take_along_axis(y, tokens[:, None], axis=-1)
    at_or_below = jnp.sum(y <= winner, axis=-1)
    return jnp.where(held & (at_or_below > at_most), tokens, UNCERTIFIED)


def _count_cutoff_by_mass(logits: jax.Array, key: jax.Array, params: dict[str, Any]) -> jax.Array:
    """The count cutoff's top-p (`top_p_count_cutoff_mask`) of (..., V) f32 logits with no sort, for 0 < p < 1. The
    program keeps the tokens whose probability is at least its sorted probabilities' entry at `count`, the number of
    places whose cumsum less 1e-8 is at most p. The probabilities are the program's (its softmax op); the kernel's
    top candidates by mass are its sorted values' first places, whose cumsum is the program's within the rounding
    of either sum over them (`nucleus_cut_slack`) and of the program's subtraction (2^-23). So count lies within
    [lower, upper]: the places surely counted, and those not surely left out. Its cutoff is then at most the entry at
    lower (every token at or above it kept) and at least the entry at upper (no token below it kept): the kernel
    draws among the tokens at or above the latter, at the program's counters, and the winner is the program's where
    it is at or above the former. UNCERTIFIED otherwise, and for a row whose candidates do not pass the mass (a NaN
    or an infinity among its logits)."""
    y = logits.reshape(-1, logits.shape[-1]) / params["temperature"]
    p = params["p"]
    probs = jax.nn.softmax(y, axis=-1)
    candidates = min(y.shape[-1], NUCLEUS_CANDIDATES)
    slack = nucleus_cut_slack(0, candidates, p, own_terms=candidates) + 2.0**-23
    below, above = p + COUNT_CUTOFF_EPS - slack, p + COUNT_CUTOFF_EPS + slack
    values, _ = _top_mass_by_kernel(probs, candidates, above + NUCLEUS_MARGIN)
    cumulative = jnp.cumsum(values, axis=-1)
    held = _rows_holding_nucleus(values, above)
    lower = jnp.sum(cumulative <= jnp.float32(below), axis=-1, keepdims=True)
    upper = jnp.sum(cumulative <= jnp.float32(above), axis=-1, keepdims=True)
    at_lower = jnp.take_along_axis(values, jnp.minimum(lower, candidates - 1), axis=-1)
    at_upper = jnp.take_along_axis(values, jnp.minimum(upper, candidates - 1), axis=-1)
    tokens = _kernel_categorical(False)(key, jnp.where(probs >= at_upper, y, NEG_INF))
    surely_kept = jnp.take_along_axis(probs, tokens[:, None], axis=-1) >= at_lower
    certified = held & (upper[:, 0] < candidates) & surely_kept[:, 0]
    return jnp.where(certified, tokens, UNCERTIFIED).reshape(logits.shape[:-1])


def _rank_nucleus_by_band(logits: jax.Array, key: jax.Array, params: dict[str, Any]) -> jax.Array:
    """tunix's `sample_top_p` of all V (`top_p_of_logits_exclusive`: y = x / T sorted as lax.top_k sorts it, ranks
    whose preceding mass exceeds p at -inf, a categorical over the V ranks) with no sort: the nucleus's band
    (`nucleus_band`, a cut by sorted place from the top), the tokens at or above its floor in the program's order
    (the first ranks, `at_or_above`), the kernel's draw over those ranks at the program's counters (row * V + rank).
    UNCERTIFIED where more than NUCLEUS_CANDIDATES tokens lie at or above the floor, or the band holds the winner."""
    y = logits / params["temperature"]
    vocab = y.shape[-1]
    lo, hi = nucleus_band(y, params["p"], from_below=False, by_place=True)
    values, ids, count = at_or_above(y, lo, min(vocab, NUCLEUS_CANDIDATES))
    rank = _rank_categorical(vocab)(key, values)
    winner = jnp.take_along_axis(values, rank[:, None], axis=-1)[:, 0]
    token = jnp.take_along_axis(ids, rank[:, None], axis=-1)[:, 0]
    return jnp.where((count <= values.shape[-1]) & (winner > hi), token, UNCERTIFIED)


def at_or_above(x: jax.Array, floor: jax.Array, k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """x (B, V) f32, floor (B,) -> each row's finite tokens at or above its floor in lax.top_k's order (value
    descending by XLA's total order, ties by the lower id): values (B, k) then -inf, ids (B, k) then -1, and how many
    there are (B,) (more than k: none given)."""
    cpu.register()
    rows = x.shape[0]
    out_types = [jax.ShapeDtypeStruct((rows, k), jnp.float32), jax.ShapeDtypeStruct((rows, k), jnp.int32),
                 jax.ShapeDtypeStruct((rows,), jnp.int32)]
    return tuple(jax.ffi.ffi_call(AT_OR_ABOVE_TARGET, out_types, vmap_method="sequential")(
        x.astype(jnp.float32), floor.astype(jnp.float32)))


#===--- Rank-space nuclei ---------------------------------------------------------------------===#
# A rank-space nucleus (sampling_reference.RANK_NUCLEI) sorts every probability, but only the nucleus can be
# drawn (or, with a floor eps > 0, a rank outside it, rarely). So the kernel returns each row's largest
# probabilities, as many as their mass needs to pass p (`hlofuse_sample_top_mass`, at most NUCLEUS_CANDIDATES,
# then zeros), and the program's own ops run on them. The cumsum of the first ranks is the first ranks of the
# whole cumsum (XLA's CPU cumsum is a blocked scan from rank 0, so each prefix sums alike; test_cpu_sampling_nucleus
# checks it); a zero rank is outside the nucleus in the program too, whose value there is 0 once dropped; the
# normalising sum runs over the whole width, the other ranks as zeros, so it is the program's sum of the same
# values. The candidates hold the nucleus when their cumsum passes p by NUCLEUS_MARGIN (far above its rounding)
# in every row; else the form's own function runs, with the kernel's top-k of the whole row (no sort in XLA).
NUCLEUS_CANDIDATES = 4096
NUCLEUS_MARGIN = 2.0**-12


def _rank_categorical(width: int, shared_noise: bool = False) -> Callable[..., jax.Array]:
    """jax.random.categorical over the first L ranks of a (..., width) rank space, by the kernel: the noise at
    counter row * width + rank, as the program draws it over all width ranks (`shared_noise`: at counter rank in every
    row, as jax.random.choice draws each row with the one key)."""

    def draw(key: jax.Array, z: jax.Array, axis: int = -1) -> jax.Array:
        del axis
        batch, ranks = z.shape[:-1], z.shape[-1]
        rows = int(np.prod(batch, dtype=np.int64))
        row_ids = jnp.zeros((rows,), jnp.int32) if shared_noise else jax.lax.iota(jnp.int32, rows)
        (tokens,) = _sample_call(z.reshape(rows, ranks), _keys(key, (rows,)), row_ids,
                                 jnp.zeros((rows,), jnp.int32), vocab_total=width, form="categorical",
                                 **form_params("categorical"))
        return tokens.reshape(batch)

    return draw


def _top_mass_by_kernel(probs: jax.Array, candidates: int, mass: float) -> tuple[jax.Array, jax.Array]:
    """probs (..., V) f32 -> each row's largest values, as many as it takes for their mass to pass `mass` (at most
    `candidates`), value descending and lower id first on ties as lax.top_k orders them, then zeros (ids -1)."""
    cpu.register()
    out_types = [jax.ShapeDtypeStruct((*probs.shape[:-1], candidates), jnp.float32),
                 jax.ShapeDtypeStruct((*probs.shape[:-1], candidates), jnp.int32)]
    call = jax.ffi.ffi_call(TOP_MASS_TARGET, out_types, vmap_method="sequential")
    values, ids = call(probs, k=np.int64(candidates), mass=np.float32(mass))
    return values, ids


# The filters (Form.filters) of forms whose program sorts unstably where the order of equal values can decide the ids:
# which of equal probabilities takes which rank, or which of equal logits a removal takes, is XLA's sort's alone, so a
# batch that meets such a tie runs the program's own sorts, in a conditional's branch (never in the compiled entry
# computation): the llama reference's rank-space draw, Hugging Face's top-p (alone, after its top-k, after litgpt's
# exact top-k: `top_p_ascending_lowering`'s own function) and its top-p then min-p or epsilon, and the classic top-p
# (Megatron-LM's: `shifted_top_p_lowering`; and as JAX code writes it, whose stable sort's order of ties is known, but
# whose own function still sorts in that branch).
XLA_SORT_IN_A_BRANCH = ("top_p_of_probs_torch", "top_p_of_probs_torch_unnormalized", "sorted_probs_inverse_cdf_rows",
                        *TOP_P_CHAINS, "top_p_ascending_mask",
                        "top_k_top_p_ascending_mask", "top_k_exact_top_p_ascending_mask", "top_p_shifted_mask",
                        "top_p_shifted_logits_mask", "top_k_top_p_shifted_mask", *JAX_CLASSIC_CUTS,
                        *JAX_CLASSIC_CHAINS)
# The classic top-p (`shifted_top_p_lowering`): of x / T (Megatron-LM's; after a top-k mask, Hugging Face's old
# `top_k_top_p_filtering`; as JAX code writes it, by a flipped argsort, also after a top-k: JAX_CLASSIC_CHAINS), and
# of the logits, then / T (x-transformers').
SHIFTED_TOP_PS = ("top_p_shifted_mask", "top_k_top_p_shifted_mask", "top_p_shifted_logits_mask",
                  *JAX_CLASSIC_CUTS, *JAX_CLASSIC_CHAINS)


def shifted_top_p_lowering(form: str, params: dict[str, Any],
                           gumbel_at_zero: float | None = None) -> Callable[..., jax.Array]:
    """The classic top-p (SHIFTED_TOP_PS: Megatron-LM's of y = x / T, after a top-k mask of y as Hugging Face's old
    `top_k_top_p_filtering`, x-transformers' of the logits, then / T) of (B, V) f32 logits on the CPU, under a draw
    of BAND_DRAWS: the nucleus (of y, computed by the program's op, at T = 1; or of the logits at T), cut by sorted
    place from the top, drawn in its band (`nucleus_draw_by_band`, or among the kernel's top k,
    `top_k_nucleus_draw`: no sort; the band's slack holds the program's `> p` of the mass before a place as Flax's
    `< p`). A batch the band cannot vouch for (a tie across the cut, whose order is XLA's unstable sort's alone; a
    NaN or an infinity) runs the form's own function, its sort XLA's, in a conditional's branch. Under another draw
    (a key per row, the inverse CDF), and for bf16 logits (whose softmax and cumsum round as XLA fuses them), the
    form's own function with the kernel's draw: the sort is XLA's. (`gumbel_at_zero`: a hand-written noise's.)"""
    fn = FORMS[FORMS[form].filters].fn
    categorical_fn = _draw_by_kernel(form, gumbel_at_zero)

    def kernel(logits: jax.Array, key: jax.Array | None = None) -> jax.Array:
        def own() -> jax.Array:
            return fn(logits, key, categorical_fn=categorical_fn, **params)

        if logits.dtype != jnp.float32 or FORMS[form].drawn_by not in BAND_DRAWS:
            return own()
        cut, temperature = logits, params["temperature"]
        if FORMS[form].filters != "top_p_shifted_logits_mask":  # the cut of x / T, drawn at T = 1
            cut, temperature = logits / params["temperature"], 1.0
        if "k" in FORMS[form].params:  # the band among the kernel's top k (ties of the k-th: the program's)
            tokens = top_k_nucleus_draw(FORMS[form].drawn_by, cut, key, {**params, "temperature": temperature},
                                        from_below=False, exact_k=False, gumbel_at_zero=gumbel_at_zero)
        else:
            tokens = nucleus_draw_by_band(FORMS[form].drawn_by, cut, key, params["p"], temperature, from_below=False,
                                          by_place=True, gumbel_at_zero=gumbel_at_zero)
        return reference_where_uncertified(tokens, own)

    return kernel


def torch_nucleus_lowering(form: str, params: dict[str, Any]) -> Callable[..., jax.Array]:
    """The llama reference's `sample_top_p` through torchax (`top_p_of_probs_torch`, and audiocraft's of (B, K, V) rows
    flattened, as its `multinomial` draws them) on the CPU (f32): drawn by
    `torch_nucleus_by_candidates`, with no sort; a batch whose nucleus is wider than the candidates (p near or at 1:
    a temperature-only config) by `torch_nucleus_by_sort`, the row sorted by the kernel; a batch neither can vouch
    for runs the form's own function (XLA's unstable sorts, whose order of ties only XLA knows, in a conditional's
    branch)."""
    fn = FORMS[form].fn

    def kernel(logits: jax.Array, key: jax.Array | None = None) -> jax.Array:
        # (B, K, V) rows (audiocraft's codebooks) are drawn as the (B * K, V) rows its torch.multinomial draws: every
        # row with the one key's noise, so the same ids
        rows = logits.reshape(-1, logits.shape[-1])

        def by_sort() -> jax.Array:
            return reference_where_uncertified(torch_nucleus_by_sort(rows, key, params, form),
                                               lambda: fn(rows, key, **params).astype(jnp.int32))

        tokens = reference_where_uncertified(torch_nucleus_by_candidates(rows, key, params, form), by_sort)
        return tokens.reshape(logits.shape[:-1])

    return kernel


def _torch_nucleus(form: str) -> RankNucleus:
    """The rank nucleus a torch.multinomial nucleus draws: the llama reference's renormalised, or xformers' fastgen's
    weights as they are (`top_p_of_probs_torch_unnormalized`)."""
    return dataclasses.replace(NORMALIZED_NUCLEUS, normalized=not form.endswith("_unnormalized"))


def torch_nucleus_by_sort(logits: jax.Array, key: jax.Array, params: dict[str, Any],
                          form: str = "top_p_of_probs_torch") -> jax.Array:
    """`top_p_of_probs_torch` of (B, V) f32 logits with the whole row sorted by the kernel's radix sort: the sorted
    values are the program's whatever its unstable sort does with ties (equal values are equal bits: probabilities are
    never -0), so the nucleus, its normalization and the draw over all V ranks are the program's; the drawn rank's id
    is vouched for only when no other token of its row has its probability. UNCERTIFIED for a tied winner or a NaN
    row."""
    width = logits.shape[-1]
    probs = nucleus_probs(logits, params["temperature"])
    values, ids = _descending_by_kernel_sort(probs)
    tokens = _nucleus_of_candidates(values, ids, key, width, _torch_nucleus(form), params, shared_noise=True)
    winner = jnp.take_along_axis(probs, jnp.maximum(tokens, 0)[:, None], axis=-1)
    return jnp.where(jnp.sum(probs == winner, axis=-1) == 1, tokens, UNCERTIFIED)


def torch_nucleus_by_candidates(logits: jax.Array, key: jax.Array, params: dict[str, Any],
                                form: str = "top_p_of_probs_torch") -> jax.Array:
    """`top_p_of_probs_torch` of (B, V) f32 logits with no sort: the normalized rank-space nucleus of the kernel's top
    candidates by mass (their ranks' values are the program's, whatever its sort does with ties), drawn at the ranks'
    counters with every row on the one key's noise (torch.multinomial's choice per row). torch.sort is unstable: which
    of equal probabilities takes the drawn rank is XLA's alone, so a winner is vouched for only when no other token of
    its row has its probability. UNCERTIFIED for a tied winner, a NaN row, or a batch whose candidates do not hold
    its nucleus."""
    width = logits.shape[-1]
    probs = nucleus_probs(logits, params["temperature"])
    values, ids = _top_mass_by_kernel(probs, min(width, NUCLEUS_CANDIDATES), params["p"] + 2 * NUCLEUS_MARGIN)
    tokens = _nucleus_of_candidates(values, ids, key, width, _torch_nucleus(form), params, shared_noise=True)
    winner = jnp.take_along_axis(probs, jnp.maximum(tokens, 0)[:, None], axis=-1)
    unique = jnp.sum(probs == winner, axis=-1) == 1  # one pass over the row; a NaN row counts none
    return jnp.where(unique & _holds_nucleus(values, params["p"]), tokens, UNCERTIFIED)


def _nucleus_of_candidates(values: jax.Array, ids: jax.Array, key: jax.Array, width: int, nucleus: RankNucleus,
                           params: dict[str, Any], shared_noise: bool = False) -> jax.Array:
    """The form's ids from the first ranks `values` (..., L) of `width` sorted probabilities and their `ids` (-1 for
    a zero past the row's candidates), when they hold the nucleus; a rank that wins without an id (only with a
    floor eps > 0) gives UNCERTIFIED. `shared_noise`: every row draws the one key's noise (`_rank_categorical`)."""
    candidates = values.shape[-1]
    eps = params.get("eps", 0.0)
    scores = rank_nucleus_scores(values, params["p"], eps, nucleus, width)
    if not eps:  # log(0) = -inf: no rank outside the nucleus can win
        rank = _rank_categorical(width, shared_noise)(key, scores)
        return jnp.take_along_axis(ids, rank[..., None], axis=-1)[..., 0]
    # Every rank past the candidates scores log(0 + eps), as the program computes it for its zeros.
    lead = values.shape[:-1]
    outside = log_floored(jnp.zeros((*lead, 1), values.dtype), eps)
    everyone = jnp.concatenate([scores, jnp.broadcast_to(outside, (*lead, width - candidates))], axis=-1)
    rank = _rank_categorical(width, shared_noise)(key, everyone)
    inside = jnp.take_along_axis(ids, jnp.minimum(rank, candidates - 1)[..., None], axis=-1)[..., 0]
    return jnp.where((rank < candidates) & (inside >= 0), inside, UNCERTIFIED)


def _rows_holding_nucleus(values: jax.Array, p: float) -> jax.Array:
    """Whether the first ranks `values` (..., L) of each row hold its nucleus: their cumsum passes p by the margin
    (False for NaN)."""
    return jnp.cumsum(values, axis=-1)[..., -1] > jnp.float32(p + NUCLEUS_MARGIN)


def _holds_nucleus(values: jax.Array, p: float) -> jax.Array:
    """Whether the first ranks `values` of every row hold its nucleus (`_rows_holding_nucleus`)."""
    return jnp.all(_rows_holding_nucleus(values, p))


#===--- gemma_pytorch's sampler: masks in rank space, an inverse-CDF draw in vocabulary order ---===#
# sampling_reference.sorted_probs_inverse_cdf_rows sorts the probabilities twice (torch.sort, then argsort of the ids to
# put them back) before the draw. Its draw reads the masked, renormalised probabilities in vocabulary order: zeros but
# at the kept ids. Three paths, the first that can vouch for a batch drawing it:
#   1. In a band (`inverse_cdf_rows_banded`): the kernel's top candidates alone, the masks, renormalisation and the
#      draw's search computed on them, each decision certified against the program's f32 sums by a bound on what any
#      order of summing can move them (a mass within that bound of p, or the draw's point within it of a kept id's
#      prefix, leaves the row to path 2). No vocabulary-wide op but the softmax and the kernel's top-k.
#   2. Exactly (`inverse_cdf_rows_drawn`): the candidates padded with zeros to the row's width, so that the program's
#      cumsum, masks and sum see the same values in the same places (a prefix sum over the ranks before the padding,
#      zeros adding exactly), and a scatter to the kept ids in place of the argsort, so that the draw's cumsum and
#      search, the program's own ops, see the program's array bit for bit; or the same on the kernel's radix sort of
#      the whole row, where the kept ranks may reach past the candidates.
#   3. The form's own function, XLA's sorts in a conditional's branch: equal probabilities straddling the cut (one
#      kept, one dropped; which is XLA's unstable sort's alone), or a NaN.
INVERSE_CDF_CANDIDATES = 256
# Forms that keep every id: their inverse-CDF draw is the program's own cumsum and search (no band over candidates
# can hold a whole row's mass, and no sort was there to take out).
UNFILTERED = ("temperature", "categorical")
# Forms drawn by an inverse CDF: in a band on the kernel's top candidates, else by the program's own ops on the arrays
# the kernel's top-k or sort rebuild. Their compiled program calls those targets, not the sampler (`hlofuse_sample`).
DRAWN_BY_THE_PROGRAM = tuple(name for name, form in FORMS.items() if form.draw == "inverse_cdf")
F32_UNIT_ROUNDOFF = 2.0**-24


def _scattered(values: jax.Array, ids: jax.Array) -> jax.Array:
    """(B, n) values in rank order at their vocabulary ids in a (B, n) row of zeros (ids of n or more: padding, not
    placed): `by_argsort_of_ids` where the ids beyond the kept ranks are padding and the values there zeros."""
    rows = jax.lax.broadcasted_iota(jnp.int32, ids.shape, 0)
    return jnp.zeros_like(values).at[rows, ids].set(values, mode="drop")


def _padded_candidates(probs: jax.Array, candidates: int) -> tuple[jax.Array, jax.Array]:
    """The kernel's top `candidates` of each (B, V) row (value descending), then zeros to the row's width; the
    padding's ids are V (no id)."""
    values, ids = _top_k_by_kernel(probs, candidates)
    padding = ((0, 0), (0, probs.shape[-1] - candidates))
    return jnp.pad(values, padding), jnp.pad(ids, padding, constant_values=probs.shape[-1])


def inverse_cdf_rows_vouched(values: jax.Array, p: jax.Array, k: jax.Array, vocab: int | None) -> jax.Array:
    """Whether the kept ranks of sorted (B, n) probabilities `values` give a row the program's kept ids: no NaN, rank
    0 kept (a positive sum), no two equal positive values on either side of the cut, and, where `values` are the
    top n of a row of `vocab` (None: the whole row), rank n - 1 dropped, by its rank or by a mass past p by more than
    any order of summing the row can move it. (B,) bools."""
    by_mass, by_rank = rank_masks(values, p, k)
    dropped = by_mass | by_rank
    straddles = (dropped[:, :-1] != dropped[:, 1:]) & (values[:, :-1] == values[:, 1:]) & (values[:, :-1] > 0)
    vouched = ~jnp.any(jnp.isnan(values), axis=-1) & ~dropped[:, 0] & ~jnp.any(straddles, axis=-1)
    if vocab is None:
        return vouched
    slack = max(NUCLEUS_MARGIN, nucleus_cut_slack(vocab, vocab, 1.0))  # any two prefixes
    mass_before_last = jnp.cumsum(values, axis=-1)[:, -1] - values[:, -1]
    return vouched & (by_rank[:, -1] | (mass_before_last > p + slack))


def inverse_cdf_rows_drawn(probs: jax.Array, key: jax.Array, p: jax.Array, k: jax.Array,
                           candidates: int | None, sum_fn: Callable[[jax.Array], jax.Array] = row_sums) -> jax.Array:
    """gemma_pytorch's draw from (B, V) f32 probabilities (`sampling_reference.inverse_cdf_of_sorted`) with the kernel's
    top `candidates` in place of the sort (None: the kernel's radix sort of the whole row) and a scatter in place of
    the argsort: the program's ids, or UNCERTIFIED for the batch where `inverse_cdf_rows_vouched` cannot say so.
    (`sum_fn`: the renormalising sum, `_sums_as_in_a_batch` for a row redrawn alone.)"""
    values, ids = _descending_by_kernel_sort(probs) if candidates is None else _padded_candidates(probs, candidates)
    tokens = inverse_cdf_of_sorted(values, ids, key, p, k, unsort_fn=_scattered, sum_fn=sum_fn)
    vocab = None if candidates is None else probs.shape[-1]
    vouched = inverse_cdf_rows_vouched(values[:, :candidates], p, k, vocab)
    return jnp.where(jnp.all(vouched), tokens, UNCERTIFIED)


def rank_mass_slack(ranks: int) -> jax.Array:
    """(ranks,) bounds on |a computed mass before rank i - the exact mass| of sorted probabilities summing to at most
    1.1 (a softmax's f32 rounding), for the program's cumsum in any order and a kernel's own: (i + 1) u of each
    prefix, u of each subtraction."""
    return (2.0 * jnp.arange(ranks, dtype=jnp.float32) + 6.0) * (F32_UNIT_ROUNDOFF * 1.1)


def draw_point_slack(kept: jax.Array) -> jax.Array:
    """(B, 1) bounds on the distance at which the program's and a kernel's f32 inverse-CDF draws over m kept
    probabilities agree: each renormalises by a sum (m - 1) u off, divides (u), sums a prefix (m - 1) u off and scales
    the total by 1 - u (u), so each puts a prefix and the point within (2m + 2) u of the exact ones (normalised mass
    1); the two draws agree when the point is past a prefix by more than all four."""
    m = jnp.sum(kept, axis=-1, keepdims=True).astype(jnp.float32)
    return (8.0 * m + 8.0) * (F32_UNIT_ROUNDOFF * 1.05)


def _kept_ranks_certain(values: jax.Array, p: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The ranks of sorted (B, n) candidates the program keeps, and whether each row's every mass decision is past p
    by more than `rank_mass_slack` (a rank dropped by k needs none)."""
    by_mass, by_rank = rank_masks(values, p, k)
    mass_before = jnp.cumsum(values, axis=-1) - values
    decided = by_rank | (jnp.abs(mass_before - p[:, None]) > rank_mass_slack(values.shape[-1]))
    return ~(by_mass | by_rank), jnp.all(decided, axis=-1)


def _drawn_in_band(values: jax.Array, ids: jax.Array, kept: jax.Array,
                   key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The id that torch.multinomial with replacement draws from the `kept` of (B, n) probabilities at their
    vocabulary `ids` (any order, the rest of the row zeros), and whether each row's draw is past both its prefixes by
    more than `draw_point_slack`. The prefix in vocabulary order before each candidate is a masked sum over the
    candidates of lower id (n^2 compares), not a sort."""
    kept_values = jnp.where(kept, values, 0.0)
    weights = kept_values / jnp.sum(kept_values, axis=-1, keepdims=True)
    point = jnp.sum(weights, axis=-1, keepdims=True) * (1 - jax.random.uniform(key, (1,), dtype=jnp.float32))
    lower_id = ids[:, None, :] < ids[:, :, None]  # [b, j, i]: candidate i comes before candidate j
    before = jnp.sum(jnp.where(lower_id, weights[:, None, :], 0.0), axis=-1)
    slack = draw_point_slack(kept)
    past = kept & (before < point - slack) & (before + weights > point + slack)
    drawn = jnp.take_along_axis(ids, jnp.argmax(past, axis=-1)[:, None], axis=-1)[:, 0]
    return drawn, jnp.any(past, axis=-1)


def inverse_cdf_rows_banded(probs: jax.Array, key: jax.Array, p: jax.Array, k: jax.Array,
                            candidates: int) -> jax.Array:
    """gemma_pytorch's draw from (B, V) f32 probabilities on the kernel's top `candidates` (at most V) alone (path
    1): the program's ids, or UNCERTIFIED for each row whose kept ids or drawn id f32 rounding could change."""
    values, ids = _top_k_by_kernel(probs, candidates)
    kept, masks_certain = _kept_ranks_certain(values, p, k)
    drawn, draw_certain = _drawn_in_band(values, ids, kept, key)
    vocab = probs.shape[-1] if candidates < probs.shape[-1] else None  # None: the candidates are the whole row
    certain = inverse_cdf_rows_vouched(values, p, k, vocab) & masks_certain & draw_certain
    return jnp.where(certain, drawn, UNCERTIFIED)


def inverse_cdf_in_band(key: jax.Array, y: jax.Array) -> jax.Array:
    """sampling_reference.inverse_cdf_draw (jax.random.choice of softmax(y) with replacement: one row (n,), or per row
    of (B, n) with one key) in a band on the kernel's top candidates of softmax(y) (`_drawn_in_band`, as for
    gemma_pytorch's sampler): the draw's ids where a row's positive probabilities are all among the candidates (its
    filter kept at most 255 ids) and the f32 sums' rounding cannot move its draw, else UNCERTIFIED."""
    rows = y.reshape(-1, y.shape[-1])
    probs = jax.nn.softmax(rows, axis=-1)  # the program's ops: the same bits (a row holds a NaN everywhere or nowhere)
    candidates = min(INVERSE_CDF_CANDIDATES, rows.shape[-1])
    values, ids = _top_k_by_kernel(probs, candidates)
    kept = values > 0
    drawn, certain = _drawn_in_band(values, ids, kept, key)
    if candidates < rows.shape[-1]:  # the last candidate zero: no positive probability beyond the candidates
        certain &= values[:, -1] == 0
    return jnp.where(certain & ~jnp.isnan(values[:, 0]), drawn, UNCERTIFIED).reshape(y.shape[:-1])


def _inverse_cdf_by_kernel(key: jax.Array, y: jax.Array, axis: int = -1) -> jax.Array:
    """sampling_reference.inverse_cdf_draw: `inverse_cdf_in_band` for f32 rows, else the draw's own ops (the program's
    cumsum and search) for the batch. (Of bf16 rows the draw's cumsum and uniform are bf16, which the band's f32
    bounds do not cover: their own ops.)"""
    del axis  # the rows' last
    own = functools.partial(inverse_cdf_draw, None, key, y)
    if y.dtype != jnp.float32:
        return own().astype(jnp.int32)
    return reference_where_uncertified(inverse_cdf_in_band(key, y), lambda: own().astype(jnp.int32))


def _redrawn_row_by_row(tokens: jax.Array, redraw: Callable[[jax.Array], jax.Array]) -> jax.Array:
    """`tokens` with each UNCERTIFIED row i replaced by `redraw(i)` (a (1,) id), one row at a time in a loop: the
    redraw's vocabulary-wide sorts and sums then take one row's memory, not the batch's (XLA allocates every
    branch's buffers on each call, and a large allocation is fresh pages to fault in: at 8 x 262144 f32 the
    fallbacks for the whole batch needed 67 MB)."""

    def one(i: jax.Array, drawn: jax.Array) -> jax.Array:
        return jax.lax.cond(drawn[i] == UNCERTIFIED, lambda: drawn.at[i].set(redraw(i)[0]), lambda: drawn)

    return jax.lax.cond(jnp.any(tokens == UNCERTIFIED),
                        lambda: jax.lax.fori_loop(0, tokens.shape[0], one, tokens), lambda: tokens)


def _sums_as_in_a_batch(values: jax.Array, batch: int) -> jax.Array:
    """`row_sums` of one row (1, V) as the program sums it within its (batch, V) batch. XLA's CPU reduction rounds a row
    alone otherwise (its strategy depends on the batch: `test_a_row_alone_sums_as_in_its_batch`), but a row in a
    batch of zeros as in its own batch, wherever it lies (`test_a_row_in_a_batch_of_zeros_sums_as_in_its_batch`)."""
    rows = jax.lax.broadcasted_iota(jnp.int32, (batch, values.shape[-1]), 0)
    return row_sums(jnp.where(rows == 0, values, jnp.zeros_like(values)))[:1]


def inverse_cdf_rows_lowering(form: str, params: dict[str, Any]) -> Callable[..., jax.Array]:
    """gemma_pytorch's sampler on the CPU (f32): drawn in a band on the kernel's top candidates where every row's
    decisions are certain; any other row alone (its rows independent: one key, per-row masks, a per-row draw) exactly
    from those candidates where they hold every kept rank, else from the row sorted by the kernel's radix sort, else
    (ties at the cut, a NaN) by the form's own function, XLA's sorts in a conditional's branch."""
    del params  # the form's parameters are all per row
    if form != "sorted_probs_inverse_cdf_rows":
        raise Unsupported(f"'{form}' is not gemma_pytorch's sampler")

    def kernel(logits: jax.Array, key: jax.Array, temperature: jax.Array, p: jax.Array, k: jax.Array) -> jax.Array:
        probs = probs_of_rows(logits, temperature)  # (the batch's: a row's alone would round otherwise)
        sum_fn = functools.partial(_sums_as_in_a_batch, batch=logits.shape[0])

        def exactly(i: jax.Array) -> jax.Array:
            row_probs, row_p, row_k = (jax.lax.dynamic_slice_in_dim(a, i, 1) for a in (probs, p, k))

            def own() -> jax.Array:  # the form's function on the batch's probabilities: XLA's sort (ties), its sums
                return inverse_cdf_of_sorted(*torch_sort_descending(row_probs), key, row_p, row_k,
                                             sum_fn=sum_fn).astype(jnp.int32)

            def by_sort() -> jax.Array:
                return reference_where_uncertified(
                    inverse_cdf_rows_drawn(row_probs, key, row_p, row_k, None, sum_fn), own)

            if logits.shape[-1] <= INVERSE_CDF_CANDIDATES:
                return by_sort()
            return reference_where_uncertified(
                inverse_cdf_rows_drawn(row_probs, key, row_p, row_k, INVERSE_CDF_CANDIDATES, sum_fn), by_sort)

        tokens = inverse_cdf_rows_banded(probs, key, p, k, min(INVERSE_CDF_CANDIDATES, logits.shape[-1]))
        return _redrawn_row_by_row(tokens, exactly)

    return kernel


#===--- Hugging Face's top-p --------------------------------------------------------------------===#
# TopPLogitsWarper (sampling_reference.top_p_removal) sorts the row ascending and removes by the cumsum of the
# softmax of the sorted logits, which depends on every value in sorted order: so the kernel sorts the row
# (`hlofuse_sample_sort`, a radix sort, stable) and the program's own ops run on the sorted row, the same values
# in the same places. The program's sort is unstable: which of equal logits comes first is XLA's, so where equal
# logits straddle the removal (one removed, one kept) the ids could differ; such a batch runs the form's own
# function (UNCERTIFIED).


def _sorted_by(target: str, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Each row of x (..., V) sorted by the radix-sort kernel `target`, stably: values (in x's dtype: bf16 widened
    exactly, so narrowed exactly; int32 keys, for `hlofuse_sample_sort_integers`, as they are) and ids."""
    cpu.register()
    keys = x if x.dtype == jnp.int32 else x.astype(jnp.float32)
    out_types = [jax.ShapeDtypeStruct(x.shape, keys.dtype), jax.ShapeDtypeStruct(x.shape, jnp.int32)]
    values, ids = jax.ffi.ffi_call(target, out_types, vmap_method="sequential")(keys)
    return values.astype(x.dtype), ids


def _sort_by_kernel(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """x (..., V) sorted ascending as jnp.sort orders it (-0 and +0 equal, NaN last), stably: values and ids."""
    return _sorted_by(SORT_TARGET, x)


#===--- the exponential race ---------------------------------------------------------------===#
# argmax(softmax(y) / q) of exponential noise (sampling_reference.exponential_race_draw: gpt-fast, torchtune, vLLM).
# Its ids depend on every id's noise: a uniform of 0 (2^-23 per id, about 1.5% of 128256-id rows) makes q = 0, so an
# inf where the id is kept and a NaN, which argmax takes first, where the filter dropped it. So no pruning: the
# kernel draws every id's random bits (`hlofuse_sample_noise_bits`, the ISA's threefry, in place of XLA's), the
# program's own float ops turn them into the noise and divide (`exponential_race_scores`: the same bits), and the
# kernel's argmax (form greedy: jnp.argmax's ids, the first NaN, else the first max) takes the id. XLA's CPU argmax
# of such scores (a variadic reduce of (value, id) pairs) was most of the fused program's time: docs/kernels-cpu-
# sampling.md, "The exponential race".


def noise_bits(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """jax.random.bits(key, shape) (uint32, threefry2x32 at each element's flat index) by the kernel, its rows the
    last dim's."""
    cpu.register()
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    call = jax.ffi.ffi_call(NOISE_BITS_TARGET, jax.ShapeDtypeStruct((rows, shape[-1]), jnp.uint32),
                            vmap_method="sequential")
    return call(_keys(key, (rows,)), jax.lax.iota(jnp.int32, rows)).reshape(shape)


def _exponential_race_by_kernel(key: jax.Array, y: jax.Array, axis: int = -1) -> jax.Array:
    """sampling_reference.exponential_race_draw with the noise's bits drawn, and the argmax taken, by the kernel."""
    del axis  # the rows' last
    probs = jax.nn.softmax(y, axis=-1)  # the program's ops: the same bits
    return sample(exponential_race_scores(probs, noise_bits(key, probs.shape)), None, form="greedy")


def _draw_by_kernel(form: str, gumbel_at_zero: float | None = None) -> Categorical:
    """The kernel's categorical draw for `form`'s draw (its own, or that of DRAWS it is drawn by; a key per row, or
    one key's noise for every row, drawn for every row at once, not under a vmap), its noise at a zero uniform
    `gumbel_at_zero` where given (a hand-written noise's: a draw of HAND_NOISE_DRAWS)."""
    draw = FORMS[form].drawn_by
    if draw == "choice":
        return _choice_by_kernel
    if draw == "inverse_cdf" and FORMS[form].filters not in UNFILTERED:  # few ids kept, which a band holds
        return _inverse_cdf_by_kernel
    if draw == "exponential_race":
        return _exponential_race_by_kernel
    if draw in ROW_KEY_DRAWS:
        return _kernel_categorical(False, row_keys=True)
    if draw in SHARED_NOISE_DRAWS:
        return _kernel_categorical(True)
    if draw:
        return functools.partial(DRAWS[draw], _kernel_categorical(False, gumbel_at_zero=gumbel_at_zero))
    return _kernel_categorical(False, gumbel_at_zero=gumbel_at_zero)


def _straddles(ordered: jax.Array, remove: jax.Array) -> jax.Array:
    """Per row: whether equal sorted logits straddle the removal (one removed, the next kept, or the reverse)."""
    return jnp.any((ordered[:, 1:] == ordered[:, :-1]) & (remove[:, 1:] != remove[:, :-1]), axis=-1)


def _top_k_top_p_removal(logits: jax.Array, k: int, one_minus_p: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Hugging Face's top-k then top-p removal with no sort of the row: where every row keeps exactly its k largest
    (finite, no tie at the k-th), the masked row sorted ascending is V - k times -inf and then the kernel's top k
    reversed, the same values in the same places as the program's sort, so the program's removal runs on that; else
    the kernel's sort of the masked row. Returns (masked logits, removed in vocabulary order, straddles per row)."""
    values, ids = _top_k_by_kernel(logits, k)
    masked = jnp.where(logits < values[:, -1:], NEG_INF, logits)
    batch, vocab = logits.shape

    def constructed() -> tuple[jax.Array, jax.Array]:
        ordered = jnp.concatenate([jnp.full((batch, vocab - k), NEG_INF, logits.dtype), values[:, ::-1]], axis=-1)
        remove = sorted_top_p_removal(ordered, one_minus_p)
        rows = jnp.broadcast_to(jnp.arange(batch)[:, None], (batch, k))
        removed = jnp.ones((batch, vocab), jnp.bool_).at[rows, ids[:, ::-1]].set(remove[:, vocab - k:])
        return removed, _straddles(ordered, remove)

    def sorted_by_kernel() -> tuple[jax.Array, jax.Array]:
        removed, ordered, remove = top_p_removal(masked, one_minus_p, _sort_by_kernel)
        return removed, _straddles(ordered, remove)

    exactly_k = jnp.all(jnp.isfinite(values)) & jnp.all(jnp.sum(logits >= values[:, -1:], axis=-1) == k)
    removed, straddles = jax.lax.cond(exactly_k, constructed, sorted_by_kernel)
    return masked, removed, straddles


def top_p_ascending_lowering(form: str, params: dict[str, Any]) -> Callable[..., jax.Array]:
    """A form whose filter is top_p_ascending_mask or top_k_top_p_ascending_mask (any draw): the top-k by the
    kernel's top-k, the row's order by the kernel (`_top_k_top_p_removal`, or its sort), the removal by the
    program's ops, the draw by the kernel; the form's own function where equal logits straddle the removal. Top-p
    alone or after a top-k of fewer than V, with a draw of BAND_DRAWS, is drawn first with no sort at all
    (`nucleus_draw_in_band`); the sorted row decides only the rows drawn in the nucleus's band."""
    categorical_fn = _draw_by_kernel(form)
    top_k_first = "k" in FORMS[FORMS[form].filters].params
    by_band = FORMS[form].drawn_by in BAND_DRAWS

    def kernel(logits: jax.Array, key: jax.Array | None = None) -> jax.Array:
        def own() -> jax.Array:
            return sample_reference(logits, key, form=form, **params)

        def sorted_row() -> jax.Array:
            if top_k_first and params["k"] < logits.shape[-1]:
                masked, removed, straddles = _top_k_top_p_removal(logits, params["k"], 1 - params["p"])
            else:
                masked = mask_top_k(logits, params["k"], _top_k_by_kernel) if top_k_first else logits
                removed, ordered, remove = top_p_removal(masked, 1 - params["p"], _sort_by_kernel)
                straddles = _straddles(ordered, remove)
            tokens = categorical_fn(key, jnp.where(removed, NEG_INF, masked) / params["temperature"], axis=-1)
            return reference_where_uncertified(jnp.where(straddles, UNCERTIFIED, tokens), own)

        if logits.dtype != jnp.float32:
            return own()
        top_k = params["k"] if top_k_first else None
        if by_band and (top_k is None or top_k < logits.shape[-1]):
            tokens = nucleus_draw_in_band(FORMS[form].drawn_by, logits, key, params, top_k, from_below=True,
                                          by_place=True)
            return reference_where_uncertified(tokens, sorted_row)
        return sorted_row()

    return kernel


def top_k_exact_top_p_lowering(form: str, params: dict[str, Any]) -> Callable[..., jax.Array]:
    """litgpt's top-k then top-p (`top_k_exact_top_p_ascending_mask`, any draw): the kernel's top k (lax.top_k's, as
    torch.topk's) scattered into -inf and scaled by the program's ops, then the top-p form of the same draw on that
    row at T = 1 (`top_p_ascending_lowering`: the nucleus drawn by its band, no sort). x / 1.0 is x bit for bit."""
    draw = FORMS[form].drawn_by
    top_p = top_p_ascending_lowering("top_p_ascending_mask" + (f"_{draw}" if draw else ""),
                                     form_params("top_p_ascending_mask", p=params["p"]))

    def kernel(logits: jax.Array, key: jax.Array | None = None) -> jax.Array:
        return top_p(keep_exactly_top_k(logits, params["k"], _top_k_by_kernel) / params["temperature"], key)

    return kernel


def nucleus_draw_in_band(draw: str, logits: jax.Array, key: jax.Array, params: dict[str, Any], top_k: int | None, *,
                         from_below: bool, by_place: bool, gumbel_at_zero: float | None = None) -> jax.Array:
    """The draw `draw` (of BAND_DRAWS) of a nucleus of mass params["p"] over logits / params["temperature"], with no
    sort, UNCERTIFIED where its band cannot vouch for the winner: after a top-k mask (`top_k` < V, Hugging Face's
    `< kth` keep) among the kernel's top k (`top_k_nucleus_draw`), else in the whole row's band
    (`nucleus_draw_by_band`, the cut by sorted place where `by_place`). `from_below`: the program's cumsum runs from
    the smallest logit. (B, V) f32 logits."""
    if top_k is not None and top_k < logits.shape[-1]:
        return top_k_nucleus_draw(draw, logits, key, params, from_below=from_below, exact_k=False,
                                  gumbel_at_zero=gumbel_at_zero)
    return nucleus_draw_by_band(draw, logits, key, params["p"], params["temperature"], from_below=from_below,
                                by_place=by_place, gumbel_at_zero=gumbel_at_zero)


def top_k_nucleus_draw(draw: str, logits: jax.Array, key: jax.Array, params: dict[str, Any], *, from_below: bool,
                       exact_k: bool, gumbel_at_zero: float | None = None) -> jax.Array:
    """Top-k then a nucleus cut by sorted place (Hugging Face's TopK then TopP warpers, `from_below`; Flax's, from the
    top), drawn with no sort: the kernel's top k, their band (`top_k_nucleus_band`), the draw (of BAND_DRAWS) among
    the top k at or above its floor (`draw_in_band`). (B, V) f32 logits."""
    logits, lo, hi, whole = top_k_nucleus_band(logits, params["k"], params["p"], from_below=from_below,
                                               exact_k=exact_k)
    tokens = draw_in_band(draw, logits, key, lo, hi, params["temperature"], gumbel_at_zero)
    return jnp.where(whole, tokens, UNCERTIFIED)


def top_k_nucleus_band(logits: jax.Array, k: int, p: float, *, from_below: bool,
                       exact_k: bool) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """The band (lo, hi) of a top-k then a nucleus cut by sorted place, from the kernel's top k (`candidates_band`),
    and the logits to draw from. `exact_k`: the program keeps exactly lax.top_k's k (Flax's scatter: those k, the
    rest -inf); else every logit not below the k-th (Hugging Face's mask), so a row where that is not k tokens (ties
    of the k-th, a NaN) is not `whole`, as is a row whose top k are not all finite. Returns (logits, lo, hi, whole),
    lo, hi and whole (B,) each."""
    if exact_k:
        values, ids = _top_k_by_kernel(logits, k)
        finite = jnp.all(jnp.isfinite(values), axis=-1)
        lo, hi = candidates_band(jnp.where(finite[:, None], values, 0.0), p, from_below)
        rows = jnp.broadcast_to(jnp.arange(logits.shape[0])[:, None], ids.shape)
        return jnp.full(logits.shape, NEG_INF, logits.dtype).at[rows, ids].set(values), lo, hi, finite
    lo, hi, kth, whole = top_k_mask_band(logits, k, p, from_below)
    return logits, jnp.maximum(lo, kth), hi, whole


def top_k_mask_band(logits: jax.Array, k: int, p: float,
                    from_below: bool) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """The band of a top-k mask (every logit not below the k-th kept) then a nucleus cut by sorted place, from the
    kernel's top k (`candidates_band`): (lo, hi, kth, whole), (B,) each; lo as the candidates give it (-inf where
    their mass never reaches p + slack), not yet raised to the k-th; `whole` where the top k are finite and no tie of
    the k-th (nor a NaN) makes more than k kept."""
    values, _ = _top_k_by_kernel(logits, k)
    finite = jnp.all(jnp.isfinite(values), axis=-1)
    lo, hi = candidates_band(jnp.where(finite[:, None], values, 0.0), p, from_below)
    kth = values[:, -1]
    whole = finite & (jnp.sum(~(logits < kth[:, None]), axis=-1) == k)  # the program's keep, NaN kept
    return lo, hi, kth, whole


#===--- Pax's samplers: the noise scaled by T ---------------------------------------------------------===#
# sampling_reference.NOISE_SCALED: the form's own function with the kernel's top-k, its sort's values and its draw with
# the noise scaled (kernel form 12), so every filter is the program's own ops on (B, k) or elementwise; Pax's top-p of
# the whole row is drawn by its band first (from the bottom, by value), the sorted row only for the batches that draw
# in the band.


def _noise_scaled_by_kernel(key: jax.Array, z: jax.Array, temperature: float | jax.Array) -> jax.Array:
    """sampling_reference.noise_scaled_draw by the kernel: argmax(z + gumbel * T), the noise at JAX's counters. T is one
    scale (> 0), or one per row ((B, 1) or (B,), each finite and >= 0: kernel form 13)."""
    batch, width = z.shape[:-1], z.shape[-1]
    rows = int(np.prod(batch, dtype=np.int64))
    per_row = isinstance(temperature, (jax.Array, np.ndarray))
    (tokens,) = _sample_call(z.reshape(rows, width), _keys(key, (rows,)), jax.lax.iota(jnp.int32, rows),
                             scales=jnp.reshape(temperature, (rows,)) if per_row else None,
                             form="categorical_noise_scaled_rows" if per_row else "categorical_noise_scaled",
                             temperature=1.0 if per_row else temperature, k=0, p=1.0, min_p=0.0)
    nan = jnp.isnan(z)  # a NaN scores NaN whatever its noise: argmax takes the first
    return jnp.where(jnp.any(nan, axis=-1), jnp.argmax(nan, axis=-1).astype(jnp.int32), tokens.reshape(batch))


def noise_scaled_lowering(form: str, params: dict[str, Any]) -> Callable[..., jax.Array]:
    """A form of NOISE_SCALED on the CPU (f32 logits, T > 0), or of NOISE_SCALED_ROWS (f32 logits, a T per row, the
    operand after the key): its function with the kernel's top-k, sort and draw. A row whose T is negative, infinite
    or NaN has no bound on its noise: the batch then runs the form's own draw (the program's noise, the kernel's top-k
    and sort, which are lax.top_k's and jnp.sort's)."""
    fn = FORMS[form].fn
    scalars = _scalar_params(form, params)

    def kernel(logits: jax.Array, key: jax.Array | None = None, *rows: jax.Array) -> jax.Array:
        given = row_values(form, rows)
        drawn = dict(given)
        if given:  # the kernel draws the rows whose T bounds the noise; the others' tokens are UNCERTIFIED below
            fit = (given["temperature"] >= 0) & (given["temperature"] < jnp.inf)
            drawn["temperature"] = jnp.where(fit, given["temperature"], 1.0)

        def own() -> jax.Array:
            return fn(logits, key, **scalars, **drawn, top_k_fn=_top_k_by_kernel, sort_fn=_sorted_values_by_kernel,
                      draw_fn=_noise_scaled_by_kernel).astype(jnp.int32)

        if form.removesuffix("_rows") == "top_p_noise_scaled":
            tokens = reference_where_uncertified(pax_nucleus_by_band(logits, key, scalars | drawn), own)
        else:
            tokens = own()
        if not given:
            return tokens
        def program_draw() -> jax.Array:  # the program's own noise and draw, the kernel's exact top-k and sort
            return fn(logits, key, **scalars, **given, top_k_fn=_top_k_by_kernel,
                      sort_fn=_sorted_values_by_kernel).astype(jnp.int32)

        return reference_where_uncertified(jnp.where(fit.reshape(tokens.shape), tokens, UNCERTIFIED), program_draw)

    return kernel


def pax_nucleus_by_band(logits: jax.Array, key: jax.Array, params: dict[str, Any]) -> jax.Array:
    """Pax's top-p of the whole row (`top_p_noise_scaled`: `x >= sorted[count(cumsum <= 1 - p)]` from the bottom, by
    value) with no sort: the draw among the tokens at or above the band, UNCERTIFIED where the band holds the winner."""
    lo, hi = nucleus_band(logits, params["p"], from_below=True, by_place=False)
    tokens = _noise_scaled_by_kernel(key, jnp.where(logits >= lo[:, None], logits, NEG_INF), params["temperature"])
    winner = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]
    return jnp.where(winner > hi, tokens, UNCERTIFIED)


#===--- A nucleus drawn by its band ---------------------------------------------------------------===#
# A sorted nucleus keeps a token by the program's f32 cumulative mass at its sorted place, whose rounding only XLA
# knows. The kernel's band (`hlofuse_sample_nucleus_band`, sampling.cc "Certified nucleus cut") bounds it: every
# token below `lo` is dropped by the program, every token above `hi` kept. So the draw runs among the tokens at or
# above `lo`, and its winner is the program's when it lies above `hi`: a token of the band that the program drops
# scored lower. A draw from the log-probabilities (BAND_DRAWS but "") also renormalises over the kept tokens, which
# shifts every score alike up to rounding: its winner must also lead the runner-up by more than that rounding
# (`_lead`). The exponential race divides the probabilities, so renormalising scales every score alike: its winner
# must lead by a ratio (`race_in_band`). Any other row is UNCERTIFIED, for the program's own cut.
# (A key per row, `row_keys`, draws each row with its own noise: the band's argument holds row by row.)
BAND_DRAWS = ("", "choice", "log_softmax", "log_of_softmax", "exponential_race", "row_keys")
# The drawn forms of JetStream's nucleus (top_p_mask: the cut by value from the top, after a top-k mask or not) whose
# draw the band decides (BAND_DRAWS): drawn first among the tokens at or above the band, with no sort; only a batch
# drawn in the band takes the kernel's sort of the row.
BANDED_DRAWN_NUCLEI = tuple(f"{nucleus}_{draw}" for nucleus in ("top_p_mask", "top_k_top_p_mask")
                            for draw in BAND_DRAWS if draw)


def nucleus_band(x: jax.Array, p: float, from_below: bool, by_place: bool) -> tuple[jax.Array, jax.Array]:
    """x (B, V) f32 -> (lo, hi), (B,) each: the band of the nucleus keeping mass p (NaN for a row with a NaN or an
    infinity: none of its draws is certain). `from_below`: the program's cumsum runs from the smallest logit;
    `by_place`: it cuts by sorted place (a copy of a value has the mass of the copies before it above it), not by
    value (`x >= sorted[count]` keeps every copy alike)."""
    cpu.register()
    out_types = [jax.ShapeDtypeStruct(x.shape[:-1], jnp.float32)] * 2
    lo, hi = jax.ffi.ffi_call(NUCLEUS_BAND_TARGET, out_types, vmap_method="sequential")(
        x.astype(jnp.float32), p=np.float64(p), from_below=from_below, by_place=by_place)
    return lo, hi


def _lead(score: jax.Array) -> jax.Array:
    """How far a winner of a log-probability draw must lead the runner-up: twice the most by which rounding can move
    their scores apart when the normalising sum changes (the log's and the softmax's rounding, a few u of the
    scores and log-probabilities, whose size is the score's plus the noise's 17 at most)."""
    return jnp.float32(2.0**-24) * (256.0 + 32.0 * jnp.abs(score))


def _draw_with_score(key: jax.Array, z: jax.Array, shared: bool,
                     gumbel_at_zero: float | None = None) -> tuple[jax.Array, jax.Array]:
    """categorical(key, z) by the kernel (one key's noise for every row where `shared`) and the winner's score."""
    rows = z.shape[0]
    row_ids = jnp.zeros((rows,), jnp.int32) if shared else jax.lax.iota(jnp.int32, rows)
    tokens, scores = _sample_call(z, _keys(key, (rows,)), row_ids, with_scores=True, form="categorical",
                                  gumbel_at_zero=gumbel_at_zero, **form_params("categorical"))
    return tokens, scores


def nucleus_draw_by_band(draw: str, logits: jax.Array, key: jax.Array, p: float, temperature: float, *,
                         from_below: bool, by_place: bool, gumbel_at_zero: float | None = None) -> jax.Array:
    """The draw `draw` (of BAND_DRAWS) of a sorted nucleus's kept logits / T, by the kernel with no sort, or
    UNCERTIFIED where the band could hold the winner (or, for a log-probability draw, where the runner-up is too
    close). (B, V) f32 logits. A cut by value from the top (JetStream's) or by place from the bottom (Hugging Face's)
    under any draw of BAND_DRAWS but the race, at T > 0, is one kernel call (`_nucleus_draw_in_one_call`): band,
    scaling and draw, with no pass of XLA's over the row."""
    if draw in ONE_CALL_DRAWS and from_below == by_place and temperature > 0:
        return _nucleus_draw_in_one_call(draw, logits, key, p, temperature, from_below, gumbel_at_zero)
    lo, hi = nucleus_band(logits, p, from_below, by_place)
    return draw_in_band(draw, logits, key, lo, hi, temperature, gumbel_at_zero)


def crossing_dropped(hi: jax.Array) -> jax.Array:
    """The band's `hi` (B,) of a cut by sorted place from the top (`nucleus_band`, `candidates_band`: c(p - slack),
    or the float below it where it has one copy, which the classic cut surely keeps) for the cut that drops the
    token whose mass crosses p too (`cumsum > p` removed as it is, not shifted): the program keeps a subset of the
    classic cut's tokens, the same but for its last place, so `lo` bounds it as well; and every token above c(p -
    slack) has less than p - slack at and above it, kept by either cut, but c itself may cross. So the float above
    `hi`: c, or the float above c where it has copies (a token there is vouched for by neither)."""
    return jnp.nextafter(hi, jnp.float32(jnp.inf))


# The draws of BAND_DRAWS one kernel call makes in the band (kernel forms 5 and 11, and their log-probability forms).
ONE_CALL_DRAWS = ("", "choice", "log_softmax", "log_of_softmax")


def _nucleus_draw_in_one_call(draw: str, logits: jax.Array, key: jax.Array, p: float, temperature: float,
                              from_below: bool, gumbel_at_zero: float | None = None) -> jax.Array:
    """`draw_in_band` of the nucleus's own band as one kernel call: the categorical of the logits (kernel forms 5 and
    11), or a log-probability draw (LOG_PROB_FORM_CODES: the categorical of x / T, the winner vouched for where it
    leads the runner-up past the normaliser's rounding); jax.random.choice's with one key's noise for every row."""
    form = "top_p_mask_from_below" if from_below else "top_p_mask"
    if draw:
        form += "_log_prob"
    rows = logits.shape[0]
    row_ids = jnp.zeros((rows,), jnp.int32) if draw == "choice" else jax.lax.iota(jnp.int32, rows)
    (tokens,) = _sample_call(logits, _keys(key, (rows,)), row_ids, form=form, temperature=temperature, k=0, p=p,
                             min_p=0.0, gumbel_at_zero=gumbel_at_zero)
    return tokens


def draw_in_band(draw: str, logits: jax.Array, key: jax.Array, lo: jax.Array, hi: jax.Array,
                 temperature: float, gumbel_at_zero: float | None = None) -> jax.Array:
    """The draw `draw` (of BAND_DRAWS) among the logits at or above `lo` (B,), / T, by the kernel: the winner where
    its logit is above `hi` (B,) (and, for a log-probability draw, it leads the runner-up by more than the rounding of
    another normaliser), else UNCERTIFIED. (B, V) f32 logits."""
    if draw == "exponential_race":
        return race_in_band(logits, key, lo, hi, temperature)
    y = jnp.where(logits >= lo[:, None], logits, NEG_INF) / temperature
    if draw in ("", "row_keys"):
        tokens = _kernel_categorical(False, row_keys=draw == "row_keys", gumbel_at_zero=gumbel_at_zero)(key, y)
        lead = jnp.ones(tokens.shape, jnp.bool_)
    else:
        z = jax.nn.log_softmax(y, axis=-1) if draw == "log_softmax" else jnp.log(jax.nn.softmax(y, axis=-1))
        tokens, best = _draw_with_score(key, z, draw == "choice", gumbel_at_zero)
        winner = jnp.arange(z.shape[-1])[None, :] == tokens[:, None]
        _, runner_up = _draw_with_score(key, jnp.where(winner, NEG_INF, z), draw == "choice", gumbel_at_zero)
        lead = best - runner_up > _lead(best)
    kept = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0] > hi
    return jnp.where(kept & lead, tokens, UNCERTIFIED)


# How far the race's winner must lead the runner-up among the tokens at or above the band, as a ratio of their
# scores p / q: the program's normaliser (over the tokens it keeps) scales every p alike, and the two roundings of p
# and of p / q, and exp's few ulps, move a ratio by far less than 2^-16.
_RACE_LEAD = 1.0 + 2.0**-16
# A probability below this has no margin against the program's other normaliser rounding it to 0.
_RACE_TINY = 2.0**-100


def race_in_band(logits: jax.Array, key: jax.Array, lo: jax.Array, hi: jax.Array, temperature: float) -> jax.Array:
    """The exponential race (`exponential_race_draw`: argmax of softmax(y) / q) among the logits at or above `lo`,
    / T, by the kernel: its noise bits and argmax, the program's float ops. The winner where the program's would be
    the same, else UNCERTIFIED: the program keeps a set S between {x > hi} and {x >= lo}, and
    - a finite winner (no noise of 0 in the row) must be above `hi` and lead every other candidate by `_RACE_LEAD`:
      the program's scores over S are these scaled alike, and every other token scores 0 there;
    - with a noise of 0 (u = 0, q = 0: p / 0 is inf, or NaN where p = 0, which argmax takes first) the row's NaN and
      inf ids are the program's where no such id lies in the band and none above it has a probability near 0.
    (B, V) f32 logits."""
    y = jnp.where(logits >= lo[:, None], logits, NEG_INF) / temperature
    probs = jax.nn.softmax(y, axis=-1)
    bits = noise_bits(key, probs.shape)
    scores = exponential_race_scores(probs, bits)
    tokens = sample(scores, None, form="greedy")
    winner = jnp.arange(scores.shape[-1])[None, :] == tokens[:, None]
    runner_up = sample(jnp.where(winner, NEG_INF, scores), None, form="greedy")
    best = jnp.take_along_axis(scores, tokens[:, None], axis=-1)[:, 0]
    second = jnp.take_along_axis(scores, runner_up[:, None], axis=-1)[:, 0]
    above = logits > hi[:, None]
    zero_noise = (bits >> 9) == 0  # u = 0 exactly: q = -log1p(-0) = 0
    doubtful = zero_noise & ((logits >= lo[:, None]) & ~above | above & (probs < _RACE_TINY))
    sure = ~jnp.isnan(lo) & ~jnp.isnan(hi) & jnp.all(jnp.isfinite(probs), axis=-1) & ~jnp.any(doubtful, axis=-1)
    leads = jnp.take_along_axis(above, tokens[:, None], axis=-1)[:, 0] & (best > second * _RACE_LEAD)
    return jnp.where(sure & (leads | ~jnp.isfinite(best)), tokens, UNCERTIFIED)


def candidates_band(values: jax.Array, p: float, from_below: bool) -> tuple[jax.Array, jax.Array]:
    """The band (lo, hi), (B,) each, of a nucleus cut by sorted place among a top-k's candidates `values` (B, k), value
    descending and finite, the rest of the row -inf (zero mass): c(P), the largest candidate with a mass of at least
    P at or above it, at P = p + slack (lo: every value below is surely dropped; -inf where the candidates never reach
    it) and at p - slack (hi: every value above is surely kept, and c itself where it has no copy; +inf where
    p - slack <= 0). The program sums at most k non-zero terms in any order (zeros add exactly), and these masses are
    f32 sums of k more (`nucleus_cut_slack`)."""
    k = values.shape[-1]
    slack = nucleus_cut_slack(k, k, 1.0 - p if from_below else p, own_terms=2 * k)
    inclusive = jnp.cumsum(jax.nn.softmax(values, axis=-1), axis=-1)

    def cutoff(target: float) -> jax.Array:
        place = jnp.sum(inclusive < jnp.float32(target), axis=-1, keepdims=True)
        found = jnp.take_along_axis(values, jnp.minimum(place, k - 1), axis=-1)[:, 0]
        return jnp.where(place[:, 0] < k, found, NEG_INF)

    hi = cutoff(p - slack) if p - slack > 0 else jnp.full(values.shape[:-1], jnp.inf, values.dtype)
    # c(p - slack) itself has less than p - slack strictly above it: with no other copy, it is surely kept too
    one_copy = jnp.sum(values == hi[:, None], axis=-1) == 1
    return cutoff(p + slack), jnp.where(one_copy, jnp.nextafter(hi, jnp.float32(-jnp.inf)), hi)


#===--- Hugging Face's Flax top-p ---------------------------------------------------------------===#
# FlaxTopPLogitsWarper (sampling_reference.top_p_flax_mask) sorts the row descending by a full-width lax.top_k
# (ties by the lower id: deterministic) and keeps by the cumsum of the softmax of the sorted logits. The kernel
# sorts the row in that order (`hlofuse_sample_sort_descending`), or, after Flax's exact top-k, takes the top k
# (the sorted row is those k and then -inf), the program's own ops keep, a scatter puts the scores back where
# sort_key_val would, and the kernel draws. The kernel's order is lax.top_k's to the bit (XLA's total order, NaN
# payloads and signs included), so even a row with a NaN gives the program's ids: no sort in XLA. EasyDeL's warpers
# are Flax's top-p after a top-k of their own (`keep_top_k`: the k-th of a descending jnp.sort), whose k-th the
# kernel's top-k gives.
FLAX_TOP_P = ("top_p_flax_mask", "top_k_exact_top_p_flax_mask", "top_k_keep_top_p_flax_mask")


def _sort_descending_by_kernel(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """x (B, V) sorted as lax.top_k(x, V) orders it (+NaN, +inf, ..., +0, -0, ..., -inf, -NaN; ties by the lower
    id)."""
    return _sorted_by(SORT_DESCENDING_TARGET, x)


def _keep_top_k_by_kernel(x: jax.Array, k: int, fill: float | None = None) -> jax.Array:
    """sampling_reference.keep_top_k with no sort: its k-th (column k - 1 of jnp.sort reversed, where every NaN
    comes first) is NaN in a row of k NaNs or more, else the (k - n)-th largest of the row's other logits (n NaNs),
    from the kernel's top-k; -0 and +0 compare equal either way. The dropped at -inf, or at the program's `fill`."""
    nans = jnp.sum(jnp.isnan(x), axis=-1, keepdims=True)
    values, _ = _top_k_by_kernel(jnp.where(jnp.isnan(x), NEG_INF, x), k)
    kth = jnp.take_along_axis(values, jnp.clip(k - 1 - nans, 0, k - 1), axis=-1)
    kth = jnp.where(nans >= k, jnp.asarray(jnp.nan, x.dtype), kth)
    return jnp.where(x >= kth, x, NEG_INF if fill is None else fill)


def _flax_top_p_kept(logits: jax.Array, p: float, exact_k: int) -> jax.Array:
    """FlaxTopPLogitsWarper of `logits` (B, V): the row in lax.top_k's order by the kernel (or, after Flax's exact
    top-k, `exact_k` > 0, the kernel's top k and then -inf, which is that order), the program's keep, a scatter
    back to vocabulary order (where the program's sort_key_val puts them)."""
    batch, vocab = logits.shape
    dtype = logits.dtype
    if exact_k:  # Flax's exact top-k scatters into a row of jnp.full's default float dtype
        values, ids = _top_k_by_kernel(logits, exact_k)
        dtype = jnp.full((), NEG_INF).dtype
        values = values.astype(dtype)
        rest = jnp.full((batch, vocab - exact_k), NEG_INF, dtype)
        keep = flax_top_p_keep(jnp.concatenate([values, rest], axis=-1), p)[:, :exact_k]
    else:
        values, ids = _sort_descending_by_kernel(logits)
        keep = flax_top_p_keep(values, p)
    rows = jnp.broadcast_to(jnp.arange(batch)[:, None], ids.shape)
    kept = jnp.where(keep, values, jnp.full_like(values, NEG_INF))
    return jnp.full((batch, vocab), NEG_INF, dtype).at[rows, ids].set(kept)


def _mtj_top_p_subtracted(logits: jax.Array, p: float) -> jax.Array:
    """mesh-transformer-jax's `nucleaus_filter` (sampling_reference.top_p_mtj_mask) with no sort in XLA: the row in its
    order by the kernel (jnp.sort's and the stable jnp.argsort's ascending order, reversed), the program's removal on
    it, a scatter back (where sort_key_val of the ids puts it), MTJ_MASK subtracted by the program's op."""
    ascending, ids = _sort_by_kernel(logits)
    return logits - MTJ_MASK * _scattered(mtj_sorted_removal(ascending[:, ::-1], p), ids[:, ::-1])


def _levanter_top_p_kept(y: jax.Array, p: float) -> jax.Array:
    """Levanter's nucleus of y (sampling_reference.levanter_top_p_kept) with no sort in XLA: the kernel's stable
    ascending order reversed (the program's argsort's, reversed), the logits taken along it, the program's softmax,
    cumsum and keep on them, a scatter back (where the program's take along the argsort of the order puts them)."""
    order = _sort_by_kernel(y)[1][:, ::-1]
    return _scattered(levanter_kept_in_rank_order(jnp.take_along_axis(y, order, axis=-1), p), order)


def _levanter_top_p_kept_by_candidates(y: jax.Array, p: float) -> jax.Array:
    """`_levanter_top_p_kept` of f32 (B, V) y with no take, cumsum or scatter over the row
    (`_levanter_keep_of_candidates`); a batch those cannot vouch for, bf16 and rows no wider than the candidates: the
    whole row's, in a conditional's branch."""
    if y.dtype != jnp.float32 or y.ndim != 2 or y.shape[-1] <= NUCLEUS_CANDIDATES:
        return _levanter_top_p_kept(y, p)
    kept, vouched = _levanter_keep_of_candidates(y, p)
    return jax.lax.cond(jnp.all(vouched), lambda: jnp.where(kept, y, NEG_INF), lambda: _levanter_top_p_kept(y, p))


def _levanter_keep_of_candidates(y: jax.Array, p: float) -> tuple[jax.Array, jax.Array]:
    """Which of f32 (B, V) y Levanter's nucleus keeps, and whether each row's is vouched for. Its softmax sums the
    whole row in its order, so the row stays sorted (the kernel's ascending sort reversed: the program's values in
    the program's places, as `_levanter_top_p_kept` takes them), but only the first ranks are summed up: the program's
    cumsum of its probabilities there is the first ranks of its cumsum (as for the rank-space nuclei), and a rank past
    them is dropped (their mass passes p by the margin). It keeps its first j ranks, which are the logits at or above
    the j-th when no other logit equals it (which of equal logits it keeps is its argsort's): a row with such a tie
    across the cut, whose candidates do not hold its nucleus, or with a NaN is not vouched for."""
    ordered = _sort_by_kernel(y)[0][:, ::-1]
    head = jax.nn.softmax(ordered, axis=-1)[:, :NUCLEUS_CANDIDATES]
    below = jnp.cumsum(head, axis=-1) < jnp.asarray(p, dtype=jnp.float32)[..., None]
    keep = jnp.concatenate([jnp.ones_like(below[:, :1]), below[:, :-1]], axis=-1)  # (levanter_kept_in_rank_order)
    count = jnp.sum(keep, axis=-1, keepdims=True)
    prefix = jnp.all(keep == (jnp.arange(NUCLEUS_CANDIDATES) < count), axis=-1)
    kept = y >= jnp.take_along_axis(ordered, count - 1, axis=-1)
    return kept, prefix & _rows_holding_nucleus(head, p) & (jnp.sum(kept, axis=-1) == count[:, 0])


# mesh-transformer-jax's removed logits are x - 1e10, not -inf: its nucleus is drawn by the band (which drops them)
# only where that gives -inf's ids, for T up to 1e8 (a removed token scores below -99 + 16.7 relative to the max's
# x / T - 4.5) and logits under 1e12 in size (x - 1e10 then moves x by 1e10 up to its f32 rounding).
MTJ_BAND_TEMPERATURE = 1.0e8
MTJ_BAND_LOGITS = 1.0e12


def _min_p_sorted_kept(logits: jax.Array, min_p: float) -> jax.Array:
    """EasyDeL's MinPLogitsWarper of `logits` (B, V): the row in lax.top_k's order by the kernel, the program's
    softmax and removal on it, scattered back; the removed at -inf."""
    batch, vocab = logits.shape
    ordered, ids = _sort_descending_by_kernel(logits)
    probs = jax.nn.softmax(ordered, axis=-1)
    remove = (probs < min_p * probs[:, 0:1]) & ~(jnp.arange(vocab) < 1)
    rows = jnp.broadcast_to(jnp.arange(batch)[:, None], ids.shape)
    removed = jnp.zeros(logits.shape, jnp.bool_).at[rows, ids].set(remove)
    return jnp.where(removed, NEG_INF, logits)


def flax_top_p_lowering(form: str, params: dict[str, Any], with_scores: bool = False) -> Callable[..., Any]:
    """A form of FLAX_TOP_P, top_k_keep_mask (EasyDeL's top-k; any draw), min_p_sorted_removal (EasyDeL's min-p),
    top_p_mtj_mask (mesh-transformer-jax's nucleus) or top_p_levanter_mask (Levanter's, of x / T) on the CPU: the top-k
    and the row's order by the kernel, the keep by the program's ops, the draw by the kernel. Flax's, Levanter's (the
    same cut, of x / T, ties the other way) and mesh-transformer-jax's top-p (f32; the latter's band
    cuts by place from the top as Flax's, and holds its `<=` as Flax's `<`: the cut's slack covers either) are drawn by
    their nucleus's band first (`nucleus_draw_by_band`: no sort), and after
    Flax's exact top-k by the band among the top k (`top_k_nucleus_draw`), the sorted row only for the rows drawn in
    the band. `with_scores` (Levanter's, whose program reads its filtered logits again): (ids, the filtered x / T), both
    from the sorted row, no band."""
    filters = FORMS[form].filters
    categorical_fn = _draw_by_kernel(form)

    def kept_and_drawn(logits: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        kept = _levanter_top_p_kept_by_candidates(logits / params["temperature"], params["p"])
        return categorical_fn(key, kept, axis=-1), kept

    def kernel(logits: jax.Array, key: jax.Array | None = None) -> jax.Array:
        if filters == "top_p_flax_mask" and logits.dtype == jnp.float32:  # its nucleus by its band first
            tokens = nucleus_draw_by_band("", logits, key, params["p"], params["temperature"], from_below=False,
                                          by_place=True)
            return reference_where_uncertified(tokens, lambda: sorted_row(logits, key))
        mtj_band = params["temperature"] <= MTJ_BAND_TEMPERATURE
        if filters == "top_p_mtj_mask" and logits.dtype == jnp.float32 and mtj_band:
            tokens = nucleus_draw_by_band("", logits, key, params["p"], params["temperature"], from_below=False,
                                          by_place=True)
            small = jnp.max(jnp.abs(logits), axis=-1) < MTJ_BAND_LOGITS
            return reference_where_uncertified(jnp.where(small, tokens, UNCERTIFIED), lambda: sorted_row(logits, key))
        if filters == "top_p_levanter_mask" and logits.dtype == jnp.float32:  # the cut of x / T, drawn at T = 1
            tokens = nucleus_draw_by_band("", logits / params["temperature"], key, params["p"], 1.0, from_below=False,
                                          by_place=True)
            return reference_where_uncertified(tokens, lambda: sorted_row(logits, key))
        if filters == "top_k_exact_top_p_flax_mask" and logits.dtype == jnp.float32 and params["k"] < logits.shape[-1]:
            tokens = top_k_nucleus_draw("", logits, key, params, from_below=False, exact_k=True)
            return reference_where_uncertified(tokens, lambda: sorted_row(logits, key))
        return sorted_row(logits, key)

    def sorted_row(logits: jax.Array, key: jax.Array | None) -> jax.Array:
        if filters == "top_p_levanter_mask":  # the nucleus of x / T (by the program's op), drawn at T = 1
            return categorical_fn(key, _levanter_top_p_kept(logits / params["temperature"], params["p"]), axis=-1)
        if filters == "top_k_keep_mask":
            scores = _keep_top_k_by_kernel(logits, params["k"])
        elif filters == "min_p_sorted_removal":
            scores = _min_p_sorted_kept(logits, params["min_p"])
        elif filters == "top_p_mtj_mask":
            scores = _mtj_top_p_subtracted(logits, params["p"])
        elif filters == "top_k_keep_top_p_flax_mask":
            scores = _flax_top_p_kept(_keep_top_k_by_kernel(logits, params["k"]), params["p"], 0)
        else:
            scores = _flax_top_p_kept(logits, params["p"], params["k"] if filters != "top_p_flax_mask" else 0)
        return categorical_fn(key, scores / params["temperature"], axis=-1)

    if with_scores:
        if filters != "top_p_levanter_mask":
            raise Unsupported(f"'{form}' gives back no scores")
        return kept_and_drawn
    return kernel


#===--- transformer_vq's nucleus ----------------------------------------------------------------===#
# sampling_reference.top_p_prob_sorted_mask: Hugging Face's cut from below by sorted place, but of the probabilities
# sorted ascending by a stable argsort, so that tokens whose probabilities round equal are ordered by id, not by
# logit; the mask multiplied in (a removed token -1e10, a removed infinity NaN). Hugging Face's band (by place, from
# below) draws it where the two orders agree on what the draw reads: the row's order by logit is its order by
# probability but within a run of distinct logits whose probabilities round equal (exp is monotone), so the band's
# kept and dropped sets are the program's unless such a run holds the winner, or crosses the band's lower end. Such
# runs are found on the logits (`_run_reach`), with no exp. Rows with either (`_probability_runs_clear`) take the
# program's keep on the kernel's stable sort of the probabilities.

# Where the program's f32 probabilities of two distinct logits round equal, the logits are within
# `_run_reach(y - max)`: fl(y - max) moves y by u |y - max|, exp and the divide by a few u (u = 2^-24; this allows
# 100 u for XLA's exp), and q = exp(y - max) / z ties only values within those. That holds where q is normal, which it
# is for every token a cut can keep or move (q > (1 - p) / V): a run of subnormal probabilities holds less than
# V 2^-126 below it, never a cumsum reaching 1 - p >= _PROB_SORTED_LEAST_CUT.
_PROB_SORTED_LEAST_CUT = 2.0**-60
# A kept logit above this outscores every removed token's -1e10 under any noise (gumbel within [-4.5, 16.7]), so the
# draw among the kept (the band's, where the removed are -inf) is the program's.
_PROB_SORTED_LEAST_WINNER = -1.0e9


def _run_reach(shifted: jax.Array) -> jax.Array:
    """How far apart two distinct logits whose probabilities round equal can be, for a logit `shifted` = y - max."""
    return jnp.float32(2.0**-22) * (64.0 + jnp.abs(shifted))


def _probability_runs_clear(y: jax.Array, tokens: jax.Array, lo: jax.Array, top: jax.Array,
                            lowest: jax.Array) -> jax.Array:
    """Per row of y (B, V), whose max and min are `top` and `lowest` (B,): whether the band's draw `tokens` of y
    (Hugging Face's order, by logit) is the program's, which orders by probability: every logit is finite, no other
    logit is within `_run_reach` of the winner's, no token below the band's lower end `lo` is within it of the least
    at or above it, and the winner's logit outscores the removed tokens' -1e10."""
    finite = jnp.isfinite(top) & jnp.isfinite(lowest)
    top = top[:, None]
    best = jnp.take_along_axis(y, jnp.maximum(tokens, 0)[:, None], axis=-1)
    partners = jnp.any((jnp.abs(y - best) <= _run_reach(best - top)) & (y != best), axis=-1)
    below = jnp.max(jnp.where(y < lo[:, None], y, NEG_INF), axis=-1)
    above = jnp.min(jnp.where(y >= lo[:, None], y, jnp.inf), axis=-1)
    crossing = above - below <= _run_reach(above - top[:, 0])
    return finite & ~partners & ~crossing & (best[:, 0] > _PROB_SORTED_LEAST_WINNER)


def _first_removed_neg_inf(y: jax.Array, tokens: jax.Array, top: jax.Array, lowest: jax.Array) -> jax.Array:
    """`tokens`, but for the rows of y (B, V) (max `top`, min `lowest`) with a -inf and every other logit finite:
    their first -inf. A -inf has probability 0 and cumsum 0, so with 1 - p > 0 it is removed, as -inf * 0 - 1e10 =
    NaN, which argmax takes first."""
    neg_inf = (lowest == NEG_INF) & jnp.isfinite(top)

    def first() -> jax.Array:
        return jnp.where(neg_inf, jnp.argmax(y == NEG_INF, axis=-1).astype(tokens.dtype), tokens)

    return jax.lax.cond(jnp.any(neg_inf), first, lambda: tokens)


def prob_sorted_top_p_lowering(form: str, params: dict[str, Any]) -> Callable[..., jax.Array]:
    """top_p_prob_sorted_mask (transformer_vq's nucleus) of (..., V) f32 logits on the CPU: drawn by Hugging Face's
    band (`nucleus_band`, by place from below) where `_probability_runs_clear` vouches for it, else by the
    program's keep on the kernel's stable sort of the probabilities (`prob_sorted_top_p_scores`, scattered back);
    no sort in XLA. 0 < p < 1."""
    categorical_fn = _draw_by_kernel(form)
    one_minus_p = 1.0 - params["p"]

    def kernel(logits: jax.Array, key: jax.Array | None = None) -> jax.Array:
        y = (logits / params["temperature"]).reshape(-1, logits.shape[-1])  # the program's x / T

        def sorted_row() -> jax.Array:
            return categorical_fn(key, prob_sorted_top_p_scores(y, one_minus_p, True, _sort_by_kernel), axis=-1)

        if one_minus_p < _PROB_SORTED_LEAST_CUT:
            return sorted_row().reshape(logits.shape[:-1])
        lo, hi = nucleus_band(y, params["p"], from_below=True, by_place=True)
        tokens = draw_in_band("", y, key, lo, hi, 1.0)
        top, lowest = jnp.max(y, axis=-1), jnp.min(y, axis=-1)  # (both checks read them)
        tokens = jnp.where(_probability_runs_clear(y, tokens, lo, top, lowest), tokens, UNCERTIFIED)
        tokens = _first_removed_neg_inf(y, tokens, top, lowest)
        return reference_where_uncertified(tokens, sorted_row).reshape(logits.shape[:-1])

    return kernel


#===--- Hugging Face's min-p --------------------------------------------------------------------===#
# MinPLogitsWarper (sampling_reference.min_p_removal, after a TopKLogitsWarper in top_k_min_p_removal) is
# elementwise but for its top-1 (and the top-k's k-th value): the form's function, with the kernel's top-k for
# both and the kernel's draw. No sort.
MIN_P_REMOVALS = ("min_p_removal", "top_k_min_p_removal")


def min_p_removal_lowering(form: str, params: dict[str, Any]) -> Callable[..., jax.Array]:
    """A form whose filters are of MIN_P_REMOVALS (any draw): its function with the kernel's top-k and draw."""
    fn = FORMS[FORMS[form].filters].fn
    categorical_fn = _draw_by_kernel(form)

    def kernel(logits: jax.Array, key: jax.Array | None = None) -> jax.Array:
        return fn(logits, key, top_k_fn=_top_k_by_kernel, kth_fn=last_column, min_p_top_k_fn=_top_k_by_kernel,
                  categorical_fn=categorical_fn, **params)

    return kernel


# generate()'s Temperature, [TopK,] TopP then MinP or Epsilon (sampling_reference.TOP_P_CHAINS): the top-k by the
# kernel's top-k, the top-p's order by the kernel's sort (stable) and its removal by the program's ops, then the
# warper after it by its own lowering (of the same draw, at T = 1) on the nucleus's row. Where equal logits straddle
# the top-p removal, which of them the program's unstable sort removes is XLA's: such a batch runs the form's own
# function.


def top_p_chain_lowering(form: str, params: dict[str, Any]) -> Callable[..., jax.Array]:
    """A form whose filters are of TOP_P_CHAINS (any draw), with no sort in XLA. A min-p after the top-p, with a draw
    of BAND_DRAWS, is drawn first in the chain's band (`top_p_min_p_draw_by_band`): the sorted row only for the
    batches that band cannot vouch for."""
    then = TOP_P_CHAINS[FORMS[form].filters]
    draw = FORMS[form].drawn_by
    then_params = form_params(then, min_p=params.get("min_p", 0.0), epsilon=params.get("epsilon", 0.0))
    then_kernel = (min_p_removal_lowering if then in MIN_P_REMOVALS else epsilon_removal_lowering)(
        then + (f"_{draw}" if draw else ""), then_params)
    by_band = then in MIN_P_REMOVALS and draw in BAND_DRAWS and params.get("min_p", 0.0) >= _LEAST_BANDED_MIN_P

    def kernel(logits: jax.Array, key: jax.Array | None = None) -> jax.Array:
        def sorted_row() -> jax.Array:
            kept, ordered, remove = top_p_removed(logits, temperature=params["temperature"], p=params["p"],
                                                  k=params.get("k", 0), top_k_fn=_top_k_by_kernel,
                                                  kth_fn=last_column, sort_fn=_sort_by_kernel)
            tokens = then_kernel(kept, key)
            return reference_where_uncertified(jnp.where(_straddles(ordered, remove), UNCERTIFIED, tokens),
                                               lambda: sample_reference(logits, key, form=form, **params))

        if not by_band or logits.dtype != jnp.float32 or logits.ndim != 2:
            return sorted_row()
        return reference_where_uncertified(top_p_min_p_draw_by_band(draw, logits, key, params), sorted_row)

    return kernel


# A min-p whose threshold min_p * max(probs) is far from f32's subnormals: its band below is then a few ulps wide.
_LEAST_BANDED_MIN_P = 2.0**-40


def min_p_band(y: jax.Array, min_p: float) -> tuple[jax.Array, jax.Array]:
    """The band (lo, hi), (B,) each, of MinPLogitsWarper's removal `softmax(y) < min_p * max(softmax(y))` of y (B, V)
    f32, over any subset of the row that holds its largest: the ratio of a probability to the largest is exp(y -
    max(y)) whatever the normaliser, so the removal is y < max(y) + log(min_p) but for rounding, all of it within
    2^-24 * (8 + |max| + 2 |log min_p|) of y: the ulps of exp, of the softmax's division, of 1 / sum, of min_p *
    max and of f32(min_p), u * |y - max| from y - max, and the ulp of the threshold itself. The band's half-width is
    64 times that bound, 2^-18 * (8 + |max| + 2 |log min_p|): about 10^-4 of a unit of y for ordinary logits."""
    top = jnp.max(y, axis=-1)
    log_min_p = float(np.log(min_p))
    half = jnp.float32(2.0**-18) * (8.0 + jnp.abs(top) + 2.0 * abs(log_min_p))
    return top + log_min_p - half, top + log_min_p + half


def top_p_min_p_draw_by_band(draw: str, logits: jax.Array, key: jax.Array, params: dict[str, Any]) -> jax.Array:
    """generate()'s Temperature, [TopK,] TopP then MinP (`top_p_then_removal` of `min_p_removal`) drawn with no sort:
    y = x / T (the program's op), the top-p's band (of the whole row, or of the kernel's top k) and the min-p's
    (`min_p_band`), a token surely kept when above both and surely removed when below either, and the draw (of
    BAND_DRAWS) among y at or above the higher floor (`draw_in_band`, at T = 1). UNCERTIFIED where the bands cannot
    vouch for the winner. (B, V) f32 logits."""
    y = logits / params["temperature"]
    if params.get("k", 0) and params["k"] < y.shape[-1]:
        y, lo, hi, whole = top_k_nucleus_band(y, params["k"], params["p"], from_below=True, exact_k=False)
    else:
        (lo, hi), whole = nucleus_band(y, params["p"], from_below=True, by_place=True), True
    min_p_lo, min_p_hi = min_p_band(y, params["min_p"])
    tokens = draw_in_band(draw, y, key, jnp.maximum(lo, min_p_lo), jnp.maximum(hi, min_p_hi), 1.0)
    return jnp.where(whole, tokens, UNCERTIFIED)


# EpsilonLogitsWarper (sampling_reference.epsilon_removal, after a TopKLogitsWarper in top_k_epsilon_removal) is
# elementwise but for its top-1 (and the top-k's k-th value): the form's function with the kernel's top-k for both
# (its values are torch.topk's, sorted, NaN first) and the kernel's draw. No sort.
EPSILON_REMOVALS = ("epsilon_removal", "top_k_epsilon_removal")


def epsilon_removal_lowering(form: str, params: dict[str, Any]) -> Callable[..., jax.Array]:
    """A form whose filters are of EPSILON_REMOVALS (any draw): its function with the kernel's top-k and draw."""
    filters = FORMS[form].filters
    fn = FORMS[filters].fn
    categorical_fn = _draw_by_kernel(form)
    top_k = {"top_k_fn": _top_k_by_kernel} if filters == "top_k_epsilon_removal" else {"top_1_fn": _top_k_by_kernel}

    def kernel(logits: jax.Array, key: jax.Array | None = None) -> jax.Array:
        return fn(logits, key, kth_fn=last_column, categorical_fn=categorical_fn, **top_k, **params)

    return kernel


def _at(values: jax.Array, column: jax.Array) -> jax.Array:
    """values (B, C) at one column per row, (B,)."""
    return jnp.take_along_axis(values, column[:, None], axis=-1)[:, 0]


def _before(values: jax.Array, column: jax.Array) -> jax.Array:
    """values (B, C) at the column before `column` per row (0 where `column` is the first)."""
    return jnp.where(column > 0, _at(values, jnp.maximum(column - 1, 0)), 0.0)


def _scalar_params(form: str, params: dict[str, Any]) -> dict[str, Any]:
    """The attributes' parameters of a form with per-row parameters, the per-row ones (its operands) left out."""
    return {name: value for name, value in params.items() if name not in FORMS[form].row_params}


# Hugging Face's typical warper (sampling_reference.typical_removal) sorts its scores |-log q - H| with an unstable
# sort: the kernel's radix sort is one order the program's could be. The removal reads the order only through the
# cumsum's count below the mass (the cut is a score: tied scores share it). Equal scores of equal logits can come in
# any order (the same values in the same places), so the cumsums agree bit for bit before the first tie group of
# other logits (a scan's output at j reads positions up to j only); past it they are sums of the same values in
# other orders, within 2 V u of each other's exact sum. The cut is the same where that first group comes after the
# mass, by that much; the batch runs the form's own function where not (a wide typical set among symmetric ties, a
# NaN).
TYPICAL_MASKS = ("typical_mask", "top_k_typical_mask")


def typical_order_matters(ordered: jax.Array, in_order: jax.Array, cumulative: jax.Array, mass: float) -> jax.Array:
    """Per row: whether another order of equal sorted scores `ordered` could move the typical cut (the sorted
    logits `in_order`, their cumsum in the kernel's order `cumulative`, the warper's `mass`)."""
    width = ordered.shape[-1]
    place = jax.lax.broadcasted_iota(jnp.int32, ordered.shape, 1)
    starts = jnp.concatenate([jnp.ones_like(ordered[:, :1], bool), ordered[:, 1:] != ordered[:, :-1]], axis=-1)
    group_start = jax.lax.cummax(jnp.where(starts, place, 0), axis=1)
    mixed = jnp.concatenate([(ordered[:, 1:] == ordered[:, :-1]) & (in_order[:, 1:] != in_order[:, :-1]),
                             jnp.zeros_like(ordered[:, :1], bool)], axis=-1)
    first = jnp.where(jnp.any(mixed, axis=-1), _at(group_start, jnp.argmax(mixed, axis=-1)), width)
    before = _before(cumulative, first)
    # (1 - g) / (1 + g) = 1 - 2 V u for g = V u / (1 - V u); 4 u more for this f32 product's own rounding
    settled = (first >= width) | (before * (1 - (2 * width + 4) * _F32_UNIT) >= np.float32(mass))
    nan = jnp.any(jnp.isnan(ordered) | jnp.isnan(in_order), axis=-1)
    return ~settled | nan


def typical_lowering(form: str, params: dict[str, Any]) -> Callable[..., jax.Array]:
    """A form whose filters are of TYPICAL_MASKS (any draw): the top-k by the kernel's top-k, the scores' order by
    the kernel's sort, the removal by the program's ops, the draw by the kernel; the form's own function (its sort
    in XLA) where the order of equal scores could matter (`typical_order_matters`) and for logits other than f32."""
    categorical_fn = _draw_by_kernel(form)
    top_k_first = FORMS[form].filters == "top_k_typical_mask"

    def kernel(logits: jax.Array, key: jax.Array | None = None) -> jax.Array:
        def own() -> jax.Array:
            return sample_reference(logits, key, form=form, **params)

        if logits.dtype != jnp.float32:
            return own()
        y = (mask_top_k(logits, params["k"], _top_k_by_kernel) if top_k_first else logits) / params["temperature"]
        removed, ordered, in_order, cumulative = typical_removal(y, params["p"], _sort_by_kernel)
        tokens = categorical_fn(key, jnp.where(removed, NEG_INF, y), axis=-1)
        matters = typical_order_matters(ordered, in_order, cumulative, params["p"])
        return reference_where_uncertified(jnp.where(matters, UNCERTIFIED, tokens), own)

    return kernel


def _id_0_where_nan(probs: jax.Array, tokens: jax.Array) -> jax.Array:
    """`tokens`, but 0 in the rows whose probabilities are NaN. A softmax row is all NaN or none (a NaN, or an
    infinity, in its logits makes its max or its sum NaN), and lax.top_k puts NaN first, ties by the lower id:
    such a row's first candidate is id 0, whose NaN score wins every draw. The kernel's top-k does not order NaN."""
    return jnp.where(jnp.isnan(probs[..., 0]), 0, tokens)


def rank_nucleus_lowering(form: str, params: dict[str, Any]) -> Callable[..., jax.Array]:
    """A form of RANK_NUCLEI on the CPU: the nucleus from the kernel's top candidates by mass, the form's own
    function when they do not hold it. A top k of the probabilities (a narrow rank space), a row no wider than the
    candidates, or bf16 logits run the form's function with the kernel's top-k and categorical."""
    fn = FORMS[form].fn

    def kernel(logits: jax.Array, key: jax.Array | None = None) -> jax.Array:
        def whole() -> jax.Array:  # every rank by the kernel's top-k: no sort in XLA, even here
            return fn(logits, key, top_k_fn=_top_k_by_kernel, categorical_fn=_kernel_categorical(False), **params)

        width = logits.shape[-1]
        probs = nucleus_probs(logits, params["temperature"])
        if params["k"] or width <= NUCLEUS_CANDIDATES or logits.dtype != jnp.float32:
            return _id_0_where_nan(probs, whole())
        values, ids = _top_mass_by_kernel(probs, NUCLEUS_CANDIDATES, params["p"] + 2 * NUCLEUS_MARGIN)
        tokens = jax.lax.cond(_holds_nucleus(values, params["p"]),
                              lambda: _nucleus_of_candidates(values, ids, key, width, RANK_NUCLEI[form], params),
                              whole)
        if params.get("eps"):  # a rank without an id won: the whole row
            tokens = reference_where_uncertified(tokens, whole)
        return _id_0_where_nan(probs, tokens)

    return kernel


def _top_k_by_kernel(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """lax.top_k(x, k) by the kernel's one-pass top-k (`hlofuse_sample_top_k`): the same values and ids, in the
    same order (value descending, lower id first on ties). XLA's CPU top-k of a filter whose ids go unused is a
    full sort (152 ms at 8 x 128256 f32, against 1.2 ms here); values come back in x's dtype (bf16 widened
    exactly, so narrowed exactly)."""
    values, ids = top_k_candidates(x[..., None, :], k)
    return values[..., 0, :].astype(x.dtype), ids[..., 0, :]


# Forms with per-row parameters (sampling_reference.Form.row_params, operands after the key): their function, with
# the kernel's top-k (or sort) and categorical, on the rows' values.


def _descending_by_kernel_sort(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`jnp.sort(x)[:, ::-1]` and `jnp.argsort(x)[:, ::-1]` (a stable ascending order reversed: ties by the higher id
    first) by the kernel's radix sort."""
    values, ids = _sort_by_kernel(x)
    return values[:, ::-1], ids[:, ::-1]


def unshifted_top_p_lowering(form: str, params: dict[str, Any],
                             gumbel_at_zero: float | None = None) -> Callable[..., jax.Array]:
    """The JAX cut not shifted (JAX_UNSHIFTED_CUTS, and after a top-k JAX_UNSHIFTED_CHAINS) of (B, V) f32 logits on the
    CPU. Under a draw of BAND_DRAWS, drawn first with no sort (`unshifted_nucleus_draw`); the batch runs the chain's
    own function where a row remains that neither the band nor the empty cut vouches for (the program's softmax of a
    row alone rounds otherwise than of the batch's row: XLA's CPU reduction is not the same for one row). That
    function (and under any other draw, the only path): y = x / T, the top-k's k-th by the kernel's top-k (the sort's
    k-th where it keeps: `_keep_top_k_by_kernel`), the program's cut on the kernel's sorted row
    (`_descending_by_kernel_sort`: the flipped argsort's values and ids), put back by a scatter
    (`_put_back_by_scatter`), the kernel's draw. No sort in XLA on any path."""
    categorical_fn = _draw_by_kernel(form, gumbel_at_zero)
    filters = FORMS[form].filters
    cut, keep = JAX_UNSHIFTED_CHAINS.get(filters, (filters, None))
    fn = jax_cut(cut)
    top_k_filter: TopKFilter | None = None
    if keep is not None:  # the chain's own function, its top-k by the kernel
        top_k_filter = _keep_top_k_by_kernel if keep else masked_top_k(_top_k_by_kernel)
        fn = top_k_first(fn, top_k_filter)

    def kernel(logits: jax.Array, key: jax.Array | None = None) -> jax.Array:
        def own() -> jax.Array:
            return fn(logits, key, sort_fn=_descending_by_kernel_sort, put_back_fn=_put_back_by_scatter,
                      categorical_fn=categorical_fn, **params)

        if FORMS[form].drawn_by not in BAND_DRAWS:
            return own()
        tokens = unshifted_nucleus_draw(form, logits / params["temperature"], key, params, top_k_filter,
                                        gumbel_at_zero)
        return reference_where_uncertified(tokens, own)

    return kernel


def unshifted_nucleus_draw(form: str, y: jax.Array, key: jax.Array, params: dict[str, Any],
                           top_k_filter: TopKFilter | None, gumbel_at_zero: float | None = None) -> jax.Array:
    """The draw of the unshifted cut's `form` (a draw of BAND_DRAWS) of y = x / T (B, V) f32, after `top_k_filter` or
    not, with no sort: in its band (`unshifted_band`) where the winner lies above it. In the rows it cannot vouch for,
    a lone token at the band's floor c(p + slack) has a mass past p at its place, its own included: it is surely
    dropped (the crossing token, which a peaked row draws often), so the draw runs again above it; and where that
    token is the row's largest, every later place's mass is past p too (the cumsum is monotone): the row keeps
    nothing, and draws from the program's fill alone (id 0 at -inf). UNCERTIFIED where none of these vouches."""
    draw = FORMS[form].drawn_by
    categorical_fn = _draw_by_kernel(form, gumbel_at_zero)
    band = unshifted_band(y, params["p"], params["k"] if top_k_filter else None)

    def drawn(lo: jax.Array) -> jax.Array:
        tokens = draw_in_band(draw, y, key, jnp.maximum(lo, band.kth), band.hi, 1.0, gumbel_at_zero)
        return jnp.where(band.whole, tokens, UNCERTIFIED)

    tokens = drawn(band.lo)

    def settled() -> jax.Array:
        lone = (jnp.sum(y == band.lo[:, None], axis=-1) == 1) & (band.lo > NEG_INF)
        top = jnp.max(y, axis=-1)
        nothing = band.whole & lone & (band.lo == top)
        # (not above the row's max: nothing is left there, and a draw of -inf alone meets every token's noise)
        again = drawn(jnp.where(lone & (band.lo < top), jnp.nextafter(band.lo, jnp.float32(jnp.inf)), band.lo))
        fill = params.get("fill")
        # (at a finite fill, every token is drawn by its noise alone)
        empty = EMPTY_ROWS_DRAW if fill is None or fill == NEG_INF else categorical_fn(key, jnp.full_like(y, fill))
        return jnp.where(tokens != UNCERTIFIED, tokens, jnp.where(nothing, empty, again))

    return jax.lax.cond(jnp.any(tokens == UNCERTIFIED), settled, lambda: tokens)


# What every draw of BAND_DRAWS gives a row of -inf: each is an argmax over scores that are then all -inf or all NaN
# (x + gumbel; log_softmax; a softmax's NaN over its noise), which takes the first id
# (test_unshifted_cut_of_a_row_that_keeps_nothing_draws_the_fill checks each).
EMPTY_ROWS_DRAW = 0


@dataclasses.dataclass(frozen=True)
class UnshiftedBand:
    """The band of the unshifted cut (B,) per field: every token below max(lo, kth) is surely dropped, every token
    above hi surely kept, where `whole`. lo is c(p + slack) itself (-inf where the mass never reaches it); kth the
    top-k mask's k-th (-inf with no top-k)."""

    lo: jax.Array
    hi: jax.Array
    kth: jax.Array
    whole: jax.Array


def unshifted_band(y: jax.Array, p: float, k: int | None) -> UnshiftedBand:
    """The band of the unshifted cut of y (B, V) f32 (after a top-k mask of k, or not): the classic cut's
    (`nucleus_band` by place from the top, or `top_k_mask_band`) with `hi` raised past the crossing token
    (`crossing_dropped`)."""
    if k is None:
        lo, hi = nucleus_band(y, p, from_below=False, by_place=True)
        return UnshiftedBand(lo, crossing_dropped(hi), jnp.full_like(lo, NEG_INF), jnp.ones(lo.shape, jnp.bool_))
    lo, hi, kth, whole = top_k_mask_band(y, k, p, from_below=False)
    return UnshiftedBand(lo, crossing_dropped(hi), kth, whole)


def row_param_lowering(form: str, params: dict[str, Any]) -> Callable[..., jax.Array]:
    """A form with per-row parameters on the CPU: its function with the kernel's top-k (or sort) and draw, on the
    operands (every row with the one key's noise for a same-key draw); `params` are the attributes' (the per-row
    ones aside)."""
    fn = FORMS[FORMS[form].filters].fn
    categorical_fn = _draw_by_kernel(form)
    scalars = _scalar_params(form, params)

    def kernel(logits: jax.Array, key: jax.Array, *rows: jax.Array) -> jax.Array:
        return fn(logits, key, top_k_fn=_top_k_by_kernel, sort_fn=_descending_by_kernel_sort,
                  categorical_fn=categorical_fn, **scalars, **row_values(form, rows))

    return kernel


def haiku_rows_lowering(form: str, params: dict[str, Any], scores_fill: float | None = None) -> Callable[..., Any]:
    """grok-1's sampler (sampling_reference.top_p_haiku_rows: Haiku's nucleus with a p per row) of (B, 1, ..., 1, V)
    f32 or bf16 logits on the CPU: the form's function on the kernel's ascending radix sort (the program's sorted
    values; its softmax, cumsum and cut are the program's ops), drawn by the kernel (with a key per row for its
    `row_keys` form). In bf16 too: XLA's CPU sort of the program's bf16 row sorts it widened to f32 and converts the
    result back, as this lowering converts the kernel's f32 row, so the program's bf16 ops after the sort meet the
    same values through the same converts (grok's logits are bf16; checked bit for bit by the generator's bf16
    `settings_rows` and variant `grok_sample_token_bf16`).
    With `scores_fill`: (ids, the filtered logits it drew from, the dropped at that fill), as grok reads them again
    for the token's probability and its top 8; no sort in XLA either way."""
    fn = FORMS[FORMS[form].filters].fn
    categorical_fn = _draw_by_kernel(form)
    scalars = _scalar_params(form, params)
    fill = {} if scores_fill is None else {"fill": scores_fill}

    def kernel(logits: jax.Array, key: jax.Array, *rows: jax.Array) -> Any:  # noqa: ANN401
        draw, drawn_from = recording_draw(categorical_fn)
        ids = fn(logits, key, sort_fn=_sorted_values_by_kernel, categorical_fn=draw, **scalars, **fill,
                 **row_values(form, rows))
        return ids if scores_fill is None else (ids, drawn_from[0])

    return kernel


# tpu-inference's searched top-k and top-p (sampling_reference.threshold_search_rows) without the searches: the
# top-k cutoff is the kernel's k-th value, the top-p threshold the first of the row's largest probabilities whose
# mass (ties counted whole) passes p by more than any order of summing it can move it.
SEARCH_CANDIDATES = 1024
_F32_UNIT = 2.0**-24  # the f32 unit roundoff u


def searched_top_k_cutoff(values: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The top-k search's cutoff per row (its k-th largest value) from the row's largest `values` (B, C) in
    lax.top_k's order, and whether that holds: 0 < k <= C, no NaN in the row (lax.top_k ranks NaN first; the
    search counts none) and a finite k-th value (the search ranges over finite floats only)."""
    kth = _at(values, jnp.clip(k - 1, 0, values.shape[-1] - 1))
    holds = (k <= values.shape[-1]) & ~jnp.isnan(values[:, 0]) & jnp.isfinite(kth)
    return kth, holds


def searched_top_p_band(ordered: jax.Array, p: jax.Array, complete: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The band of the top-p search's threshold per row from the row's largest probabilities `ordered` (B, C),
    descending: (lo, hi, holds), the program's threshold surely in [lo, hi] where `holds`. The search keeps probs >= t
    for the largest t whose mass of probabilities >= t is not below p, computed by an f32 sum over the row. That mass
    is a sum of the n values >= t (the zeros add nothing); any order of summing n non-negative f32 values is within
    (n - 1) u of the exact sum, and a sum of larger sets is never smaller (each rounded addition is monotone). So the
    threshold is at most the value of the first tie group whose mass could reach p (hi) and at least that of the
    first whose mass surely does (lo): every probability above hi is kept, every one below lo dropped. (`complete`:
    the candidates are the whole row; otherwise lo must be above the last candidate. p <= 0 never holds: the empty
    set's mass reaches it, and the search's threshold lies above every probability.)"""
    width = ordered.shape[-1]
    mass = jnp.cumsum(ordered, axis=-1)
    # how many values are >= each one (where its tie group ends, by a reverse running min of the groups' last
    # places), and the mass of all of them
    place = jax.lax.broadcasted_iota(jnp.int32, ordered.shape, ordered.ndim - 1)
    last_of_group = jnp.concatenate([ordered[:, 1:] != ordered[:, :-1], jnp.ones_like(ordered[:, :1], bool)], -1)
    at_or_above = jax.lax.cummin(jnp.where(last_of_group, place, width - 1), axis=1, reverse=True) + 1
    group_mass = jnp.take_along_axis(mass, at_or_above - 1, axis=-1)
    slack = 4 * _F32_UNIT * at_or_above * group_mass  # ours and the program's sums: 2 (n - 1) u, with room
    surely = group_mass - slack >= p[:, None]
    lo = _at(ordered, jnp.argmax(surely, axis=-1))
    hi = _at(ordered, jnp.argmax(group_mass + slack >= p[:, None], axis=-1))
    holds = jnp.any(surely, axis=-1) & (p > 0) & ~jnp.isnan(ordered[:, 0])
    if not complete:
        holds &= lo > ordered[:, -1]
    return lo, hi, holds


def searched_top_p_threshold(ordered: jax.Array, p: jax.Array, complete: bool) -> tuple[jax.Array, jax.Array]:
    """The top-p search's threshold per row (`searched_top_p_band`), and whether it is certain: its band is one tie
    group."""
    lo, hi, holds = searched_top_p_band(ordered, p, complete)
    return lo, holds & (hi == lo)


@dataclasses.dataclass(frozen=True)
class SearchedMasks:
    """The searched top-k and top-p masks of x (B, V): x with both applied (the top-p keeping every probability at or
    above its band's floor, `searched_top_p_band`), the probabilities the top-p reads, and per row the band (lo, hi:
    -inf for a row with no top-p) and whether both thresholds hold."""

    x: jax.Array
    probs: jax.Array
    lo: jax.Array
    hi: jax.Array
    holds: jax.Array

    def certain(self) -> jax.Array:
        """Whether every row's thresholds are certain: x is the program's masked x."""
        return jnp.all(self.holds & (self.hi == self.lo))

    def vouched(self, tokens: jax.Array) -> jax.Array:
        """`tokens` drawn from x, UNCERTIFIED where a row does not hold or its winner's probability is below the band's
        top: a draw (an argmax of the kept logits' scores) keeps its winner when the program drops band tokens."""
        kept = jnp.take_along_axis(self.probs, jnp.maximum(tokens, 0)[:, None], axis=-1)[:, 0] >= self.hi
        return jnp.where(self.holds & kept, tokens, UNCERTIFIED)


def _searched_masks(x: jax.Array, k: jax.Array, p: jax.Array, fill: float,
                    softmax: Callable[[jax.Array], jax.Array], whole_row: bool = False) -> SearchedMasks:
    """x with the searched top-k mask (rows with k > 0), then the searched top-p mask of `softmax` of that (rows with
    p < 1), dropped logits at `fill`, both thresholds read off the kernel's top SEARCH_CANDIDATES of x (which the
    softmax keeps in order), or, `whole_row`, off the kernel's sort of the whole row."""
    width = x.shape[-1]
    if whole_row:
        values, ids = _sort_descending_by_kernel(x)
    else:
        values, ids = _top_k_by_kernel(x, min(width, SEARCH_CANDIDATES))
    cutoff, k_holds = searched_top_k_cutoff(values, k)
    x = jnp.where((k > 0)[:, None], jnp.where(x >= cutoff[:, None], x, fill), x)
    probs = softmax(x)
    lo, hi, p_holds = searched_top_p_band(jnp.take_along_axis(probs, ids, axis=-1), p,
                                          whole_row or width <= SEARCH_CANDIDATES)
    top_p = p < 1.0
    lo, hi = jnp.where(top_p, lo, NEG_INF), jnp.where(top_p, hi, NEG_INF)
    x = jnp.where(top_p[:, None] & ~(probs >= lo[:, None]), fill, x)  # a row with no top-p keeps its NaN
    return SearchedMasks(x, probs, lo, hi, ((k <= 0) | k_holds) & (~top_p | p_holds))


def _searched_by_kernel(draw: Callable[[bool], jax.Array], program: Callable[[], Any]) -> Any:  # noqa: ANN401
    """`draw(whole_row)` of the searched masks (UNCERTIFIED where a row's band cannot vouch for its winner) from the
    kernel's top candidates first; a batch they cannot vouch for (a nucleus wider than SEARCH_CANDIDATES: a high
    temperature, a flat row) from the kernel's sort of the whole row, in a conditional's branch; and only where that
    cannot vouch either (a NaN or an infinity, a winner in the band), the program's own searches, in a branch of
    that."""
    def whole_row() -> jax.Array:
        return reference_where_uncertified(draw(True), program)

    return reference_where_uncertified(draw(False), whole_row)


def threshold_search_lowering(form: str, params: dict[str, Any]) -> Callable[..., jax.Array]:
    """tpu-inference's sampler on the CPU: x / T, the searches' thresholds by `_searched_masks`, the kernel's
    categorical. A batch with a row where either is not certain (a k above the candidates, a nucleus wider than them,
    a NaN or an infinity, a mass within rounding of p) runs the form's own function, searches and all."""
    fn = FORMS[form].fn
    categorical = _draw_by_kernel(form)
    scalars = _scalar_params(form, params)

    def kernel(logits: jax.Array, key: jax.Array, temperature: jax.Array, k: jax.Array, p: jax.Array) -> jax.Array:
        def searched() -> jax.Array:
            return fn(logits, key, temperature=temperature, k=k, p=p, categorical_fn=categorical, **scalars)

        def draw(whole_row: bool) -> jax.Array:
            masks = _searched_masks(scale_rows(logits, temperature), k, p, NEG_INF,
                                    functools.partial(jax.nn.softmax, axis=-1), whole_row)
            return masks.vouched(categorical(key, masks.x))

        return _searched_by_kernel(draw, searched)

    return kernel


def constant_search_lowering(form: str, params: dict[str, Any], scores_fill: float | None = None) -> Callable[..., Any]:
    """axlearn's and T5X's searched filters with constant parameters (sampling_reference.searched_masks) on the CPU:
    x / T, the searches' thresholds by `_searched_masks` (the constants as every row's), the kernel's categorical; a
    batch with a row where either threshold is not certain runs the form's own function, searches and all. With
    `scores_fill`, (ids, the masked x / T it drew from, the dropped logits at that fill): a composite with `scores`."""
    fn = FORMS[form].fn
    categorical = _draw_by_kernel(form)
    reads = FORMS[form].params

    def kernel(logits: jax.Array, key: jax.Array) -> Any:  # noqa: ANN401
        rows = logits.reshape(-1, logits.shape[-1])
        k = jnp.full(rows.shape[:1], params["k"] if "k" in reads else 0, jnp.int32)
        p = jnp.full(rows.shape[:1], params["p"] if "p" in reads else 1.0, jnp.float32)

        def searched() -> jax.Array:
            return fn(logits, key, categorical_fn=categorical, **params)

        def searched_with_scores() -> tuple[jax.Array, jax.Array]:
            return sample_reference_with_scores(logits, key, form=form, fill=scores_fill, categorical_fn=categorical,
                                                **params)

        fill = NEG_INF if scores_fill is None else scores_fill

        def masked(whole_row: bool) -> SearchedMasks:
            return _searched_masks(rows / params["temperature"], k, p, fill,
                                   functools.partial(jax.nn.softmax, axis=-1), whole_row)

        def draw(whole_row: bool) -> jax.Array:
            masks = masked(whole_row)
            return masks.vouched(categorical(key, masks.x)).reshape(logits.shape[:-1])

        if scores_fill is None:
            return _searched_by_kernel(draw, searched)

        def drawn_with_scores(whole_row: bool, otherwise: Callable[[], Any]) -> Any:  # noqa: ANN401
            masks = masked(whole_row)  # the scores are the masked x itself: its band must be one tie group
            x = masks.x.reshape(logits.shape)
            return jax.lax.cond(masks.certain(), lambda: (categorical(key, x), x), otherwise)

        return drawn_with_scores(False, lambda: drawn_with_scores(True, searched_with_scores))

    return kernel


def _softmax_of_each_row(x: jax.Array) -> jax.Array:
    """The softmax of each row as one (1, V) array, as eSurge's vmapped top-p computes it."""
    return jax.vmap(lambda row: jax.nn.softmax(row[None, :], axis=-1)[0])(x)


def esurge_lowering(form: str, params: dict[str, Any]) -> Callable[..., jax.Array]:
    """EasyDeL eSurge's sampler on the CPU: the searches' thresholds by `_searched_masks` (its -1e10 fill), x / T, its
    min-p, the kernel's categorical with a key per row; the form's own function for a batch with an uncertain row."""
    fn = FORMS[FORMS[form].filters].fn
    categorical = _draw_by_kernel(form)
    scalars = _scalar_params(form, params)

    def kernel(logits: jax.Array, keys: jax.Array, *rows: jax.Array) -> jax.Array:
        values = row_values(form, rows)

        def searched() -> jax.Array:
            return fn(logits, keys, categorical_fn=categorical, **scalars, **values)

        def draw(whole_row: bool) -> jax.Array:
            # eSurge's min-p compares each logit with min_p times the row's largest, which the top-p always keeps:
            # a token the band keeps or drops does not move it. A winner at the fill (a row min-p empties) is not
            # vouched for: every token of the row then ties at the fill.
            masks = _searched_masks(logits, values["k"], values["p"], ESURGE_FILL, _softmax_of_each_row, whole_row)
            x = masks.x / values["temperature"]
            if "min_p" in values:
                x = esurge_min_p_mask(x, values["min_p"])
            tokens = categorical(keys, x)
            filled = jnp.take_along_axis(x, jnp.maximum(tokens, 0)[:, None], axis=-1)[:, 0] == ESURGE_FILL
            return jnp.where(filled, UNCERTIFIED, masks.vouched(tokens))

        return _searched_by_kernel(draw, searched)

    return kernel


ESURGE_FORMS = ("esurge_searched_rows", "esurge_searched_min_p_rows")


def _batch_of_one(call: CompositeCall) -> CompositeCall:
    """`call` with its one row of logits (V,) taken as a batch of one (1, V)."""
    (shape, dtype), *others = call.operand_types
    return dataclasses.replace(call, operand_types=(((1, *shape), dtype), *others))


def _as_one_row(form: str, kernel: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """The kernel for a batch of one, on one row (V,): its ids as the form's function gives them for one row, (1,)
    for the choice draw (torch.multinomial of one row), () otherwise. The program's own ops in the kernel (a softmax,
    a cumsum) run on the (1, V) row as on the (V,) row: XLA drops the unit dim, so they round alike (the library
    fixtures compare the ids)."""
    shape = (1,) if FORMS[form].draw == "top_k" else ()

    def one_row(logits: jax.Array, *others: jax.Array) -> jax.Array:
        return kernel(logits[None], *others).reshape(shape)

    return one_row


def prelude_lowering(call: CompositeCall, inner: str,
                     normalize: Callable[[jax.Array], jax.Array]) -> Callable[..., Any]:
    """A form with a normalization in front (`<inner>_<prelude>`, sampling_reference.prelude_of): the normalization by
    the program's own ops (the same bits), then the kernel of form `inner` on what it gives."""
    kernel = sampling_lowering(call.with_attributes(form=inner))

    def normalized(logits: jax.Array, *others: jax.Array) -> jax.Array:
        return kernel(normalize(logits), *others)

    return normalized


def stages_lowering(call: CompositeCall, stages: tuple[Stage, ...]) -> Callable[..., Any]:
    """A composite with filters in front of its form (SampleAttrs.stages): each stage's function on the kernel's sorts
    and top-ks (`on_kernel_sorts`), then the kernel of the form on what the last gives. Of bf16 logits the stages
    run with XLA's own sorts: a softmax and cumsum of bf16 values round as XLA fuses them next to its sort
    (WHOLE_ROW_FUNCTION_FORMS), which the kernel's sorted row need not reproduce."""
    kernel = sampling_lowering(call.with_attributes(stages=()))
    run = on_kernel_sorts if call.operand_types[0][1] == "f32" else None

    def staged(logits: jax.Array, *others: jax.Array) -> jax.Array:
        return kernel(after_stages(logits, stages, run), *others)

    return staged


def on_kernel_sorts(fn: Callable[[jax.Array], jax.Array], x: jax.Array) -> jax.Array:
    """fn(x) with its sorts and top-ks by the kernel: each stable sort along the last axis of one f32 or bf16 key (and
    any payloads: an argsort's ids) by the kernel's radix sort, which orders as JAX's sort does (-0 and +0 equal,
    every NaN last, ties by place), its operands taken along the kernel's order, so the same values in the same places;
    each lax.top_k by the kernel's top-k (lax.top_k's values and ids). Every other op is fn's own, bound as traced
    (calls of jitted functions evaluated inline). So no sort is left to XLA, and the results are fn's bit for bit."""
    closed = jax.make_jaxpr(fn)(x)
    (out,) = _evaluated_on_kernel(closed.jaxpr, closed.consts, x)
    return out


def _evaluated_on_kernel(jaxpr: Any, consts: list[Any], *args: Any) -> list[Any]:  # noqa: ANN401
    """The jaxpr's outputs of `args`, its sorts and top-ks by the kernel where it takes them (`on_kernel_sorts`)."""
    env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))

    def read(var: Any) -> Any:  # noqa: ANN401
        return var.val if isinstance(var, jax.extend.core.Literal) else env[var]

    for eqn in jaxpr.eqns:
        values = [read(var) for var in eqn.invars]
        outs = _on_kernel(eqn, values)
        if outs is None:
            outs = eqn.primitive.bind(*values, **eqn.primitive.get_bind_params(eqn.params))
            outs = outs if eqn.primitive.multiple_results else [outs]
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(var) for var in jaxpr.outvars]


def _on_kernel(eqn: Any, values: list[Any]) -> list[Any] | None:  # noqa: ANN401
    """The results of one equation by the kernel (a sort, a top-k, or a jitted call holding them), or None: fn's own."""
    name, params = eqn.primitive.name, eqn.params
    if name in ("jit", "pjit"):
        return _evaluated_on_kernel(params["jaxpr"].jaxpr, params["jaxpr"].consts, *values)
    if name not in ("sort", "top_k"):
        return None
    keys = values[0]
    if keys.dtype not in (jnp.float32, jnp.bfloat16, jnp.int32) or keys.ndim == 0:
        return None
    if (name == "sort" and params["num_keys"] == 1 and params["dimension"] == keys.ndim - 1
            and (params["is_stable"] or len(values) == 1)):
        order = _stable_order_by_kernel(keys.reshape(-1, keys.shape[-1])).reshape(keys.shape)
        return [jnp.take_along_axis(value, order, axis=-1) for value in values]
    if name == "top_k" and keys.dtype != jnp.int32 and params.get("axis", keys.ndim - 1) == keys.ndim - 1:
        k = params["k"]
        if k <= TOP_K_BY_SELECTION_UP_TO:
            return list(_top_k_by_kernel(keys, k))
        values, ids = _sorted_by(SORT_DESCENDING_TARGET, keys.reshape(-1, keys.shape[-1]))
        return [values[:, :k].reshape((*keys.shape[:-1], k)), ids[:, :k].reshape((*keys.shape[:-1], k))]
    return None


# The largest lax.top_k a stage takes by the kernel's top-k; a larger one (Flax's top-p takes the whole row) is the
# first k of the row sorted in lax.top_k's order (`hlofuse_sample_sort_descending`): at 1 x 128256 the top-k takes
# 0.6 ms for k = 1024, 1.9 ms for 4096 and 6 ms for 16384, the sort 1.5 ms (docs/kernels-cpu-sampling.md, stages).
TOP_K_BY_SELECTION_UP_TO = 2048


def _stable_order_by_kernel(keys: jax.Array) -> jax.Array:
    """The stable ascending order of each row of `keys` (B, n) as JAX's sort orders it, by the kernel's radix sort:
    of f32 or bf16 keys, `hlofuse_sample_sort`; of int32 keys (an argsort's ids sorted again to put values back),
    `hlofuse_sample_sort_integers`, which inverts a permutation by one scatter."""
    return _sorted_by(SORT_INTEGERS_TARGET if keys.dtype == jnp.int32 else SORT_TARGET, keys)[1]


# A categorical whose noise is written by hand (SampleAttrs.gumbel_at_zero): the kernel draws it for f32 logits where
# the lowering of the form's filters hands the value on to every draw of the kernel's (the plain kernel forms, the
# function forms, the classic top-p) and its draw is the categorical itself or of the log-probabilities
# (HAND_NOISE_DRAWS).
HAND_NOISE_FILTERS = (*FORM_CODES, *FUNCTION_FORMS, *SHIFTED_TOP_PS)


def _check_hand_noise(call: CompositeCall, attrs: SampleAttrs) -> None:
    """Raises Unsupported where the kernel cannot draw the composite's hand-written noise (`gumbel_at_zero`)."""
    if attrs.gumbel_at_zero is None:
        return
    form = FORMS.get(attrs.form)
    if call.operand_types[0][1] != "f32":
        raise Unsupported("a hand-written Gumbel noise is drawn by the kernel for f32 logits only")
    if (form is None or form.filters not in HAND_NOISE_FILTERS or form.drawn_by not in HAND_NOISE_DRAWS
            or form.row_params or prelude_of(attrs.form) is not None):
        raise Unsupported(f"the CPU sampler draws '{attrs.form}' with JAX's Gumbel noise only, not a hand-written one "
                          f"(another value where the uniform is 0; it does for the filters of "
                          f"{', '.join(HAND_NOISE_FILTERS)})")


def sampling_lowering(call: CompositeCall) -> Callable[..., Any]:
    """target=cpu: this kernel for an `hlofuse.sample` composite, or Unsupported saying why not."""
    if not is_available():
        raise Unsupported("the native CPU sampling kernel is not built (pip install . builds it)")
    attrs = SampleAttrs.from_dict(call.attributes)
    _check_hand_noise(call, attrs)
    hand = attrs.gumbel_at_zero
    if attrs.stages:
        return stages_lowering(call, attrs.stages)
    if (normalized := prelude_of(attrs.form)) is not None:
        return prelude_lowering(call, *normalized)
    if attrs.scores and not gives_scores(attrs.form):
        raise Unsupported(f"the CPU sampler gives back the scores it draws from for the searched forms, Levanter's "
                          f"and grok-1's nuclei only, not '{attrs.form}'")
    filters = FORMS[attrs.form].filters if attrs.form in FORMS else ""
    if attrs.form in FORMS and FORMS[attrs.form].filters == "top_p_haiku_rows":
        (shape, dtype), *_ = call.operand_types
        if len(shape) < 2 or any(size != 1 for size in shape[1:-1]) or dtype not in ("f32", "bf16"):
            raise Unsupported(f"'{attrs.form}' (grok-1's nucleus) takes (B, V) or (B, 1, V) f32 or bf16 logits")
        return haiku_rows_lowering(attrs.form, attrs.params(), attrs.fill if attrs.scores else None)
    if attrs.form in FORMS and FORMS[attrs.form].row_params:
        (shape, dtype), *_ = call.operand_types
        k_attribute = "k" in FORMS[attrs.form].params
        if len(shape) != 2 or dtype not in ("f32", "bf16") or (k_attribute and not 0 < attrs.k <= shape[-1]):
            raise Unsupported(f"'{attrs.form}' takes (B, V) f32 or bf16 logits (and 0 < k <= V)")
        if attrs.form == "threshold_search_rows":
            return threshold_search_lowering(attrs.form, attrs.params())
        if attrs.form in NOISE_SCALED_ROWS:
            if dtype != "f32":
                raise Unsupported(f"'{attrs.form}' (argmax(x + gumbel * T), a T per row) takes f32 logits: its noise "
                                  "is f32 cast to the logits' dtype, which the kernel draws in f32 only")
            return noise_scaled_lowering(attrs.form, attrs.params())
        if FORMS[attrs.form].filters in ESURGE_FORMS:
            return esurge_lowering(attrs.form, attrs.params())
        if attrs.form == "sorted_probs_inverse_cdf_rows":
            if dtype != "f32":
                raise Unsupported("gemma_pytorch's sampler is drawn by the kernel for f32 probabilities only (its "
                                  "softmax is f32, as torch.softmax(dtype=torch.float) computes it)")
            return inverse_cdf_rows_lowering(attrs.form, attrs.params())
        return row_param_lowering(attrs.form, attrs.params())
    if filters in SEARCHED_FORMS and call.operand_types[0][1] != "f32":
        # Under a draw of its own too: the searched top-p thresholds bf16 probabilities, which XLA rounds as it fuses
        # the program (f32 inside a fusion), so the form's function run beside the kernel can keep another set (a
        # T5X-style search on bf16 logits with a -1e7 fill, T 1.3 and a log-softmax draw did). The composite's
        # decomposition, the program's own ops, runs instead.
        raise Unsupported(f"'{attrs.form}' (a searched filter) takes f32 logits: the search compares f32 queries, and "
                          "its bf16 probabilities round as XLA fuses the program")
    if attrs.form in SEARCHED_FORMS:
        shape, dtype = call.operand_types[0]
        if not shape:
            raise Unsupported(f"'{attrs.form}' (a searched filter) takes (..., V) logits")
        if ("k" in FORMS[attrs.form].params and not 0 < attrs.k <= shape[-1]) or (
                "p" in FORMS[attrs.form].params and not 0.0 < attrs.p < 1.0):
            raise Unsupported(f"'{attrs.form}' is drawn by the kernel for 0 < k <= V and 0 < p < 1 only (with p = 1 "
                              "the program's search still drops what its f32 sum of all probabilities leaves out)")
        return constant_search_lowering(attrs.form, attrs.params(), attrs.fill if attrs.scores else None)
    if attrs.form in NOISE_SCALED:
        shape, dtype = call.operand_types[0]
        if dtype != "f32" or len(shape) != 2 or not attrs.temperature > 0 or attrs.k > shape[-1]:
            raise Unsupported(f"'{attrs.form}' (argmax(x + gumbel * T)) takes (B, V) f32 logits and T > 0 (and k <= "
                              "V): its noise is f32 cast to the logits' dtype, which the kernel draws in f32 only")
        return noise_scaled_lowering(attrs.form, attrs.params())
    if filters == "top_p_prob_sorted_mask":
        shape, dtype = call.operand_types[0]
        if len(shape) < 2 or dtype != "f32" or not 0.0 < attrs.p < 1.0 or not attrs.temperature > 0:
            raise Unsupported("transformer_vq's nucleus is drawn by the kernel for (..., V) f32 logits, 0 < p < 1 and "
                              "T > 0: the probabilities' order is the f32 softmax's, which XLA rounds its own way in "
                              "bf16")
        return prob_sorted_top_p_lowering(attrs.form, attrs.params())
    if filters in SHIFTED_TOP_PS:
        shape, dtype = call.operand_types[0]
        if len(shape) == 1:  # one row (a JAX engine's `sample_top_p` at batch 1): drawn as a batch of one
            return _as_one_row(attrs.form, sampling_lowering(_batch_of_one(call)))
        if len(shape) != 2 or dtype not in ("f32", "bf16") or not attrs.temperature > 0 or attrs.k > shape[-1]:
            raise Unsupported("the classic top-p (Megatron-LM's) takes (B, V) f32 or bf16 logits, T > 0 and k <= V")
        return shifted_top_p_lowering(attrs.form, attrs.params(), hand)
    if filters in (*JAX_UNSHIFTED_CUTS, *JAX_UNSHIFTED_CHAINS):
        shape, dtype = call.operand_types[0]
        if len(shape) == 1:  # one row (V,): drawn as a batch of one
            return _as_one_row(attrs.form, sampling_lowering(_batch_of_one(call)))
        if len(shape) != 2 or dtype != "f32" or not attrs.temperature > 0 or attrs.k >= shape[-1]:
            raise Unsupported("the unshifted JAX top-p takes (B, V) f32 logits, T > 0 (and k < V): in bf16 the softmax "
                              "and cumsum of the whole sorted row round as XLA fuses them")
        return unshifted_top_p_lowering(attrs.form, attrs.params(), hand)
    if filters in (*FLAX_TOP_P, "top_k_keep_mask", "min_p_sorted_removal", "top_p_mtj_mask", "top_p_levanter_mask"):
        shape, dtype = call.operand_types[0]
        if len(shape) == 1 and filters == "top_k_keep_mask" and not attrs.scores:  # one row: a batch of one
            return _as_one_row(attrs.form, sampling_lowering(_batch_of_one(call)))
        if len(shape) != 2 or dtype not in ("f32", "bf16"):
            raise Unsupported("the Flax and EasyDeL warpers take (B, V) f32 or bf16 logits")
        if attrs.k > shape[-1]:
            raise Unsupported(f"k = {attrs.k} exceeds the vocabulary")
        return flax_top_p_lowering(attrs.form, attrs.params(), with_scores=attrs.scores)
    if filters in ("top_p_ascending_mask", "top_k_top_p_ascending_mask", "top_k_exact_top_p_ascending_mask",
                   *MIN_P_REMOVALS, *TOP_P_CHAINS, *EPSILON_REMOVALS, *TYPICAL_MASKS):
        if len(call.operand_types[0][0]) == 1:  # one row (litgpt's `sample`): drawn as a batch of one
            return _as_one_row(attrs.form, sampling_lowering(_batch_of_one(call)))
        if len(call.operand_types[0][0]) != 2:
            raise Unsupported("Hugging Face's warpers take (B, V) logits or one row (V,)")
        if call.operand_types[0][1] not in ("f32", "bf16"):
            raise Unsupported(f"the CPU sampler takes f32 or bf16 logits, not {call.operand_types[0][1]}")
        if attrs.k > call.operand_types[0][0][-1]:
            raise Unsupported(f"k = {attrs.k} exceeds the vocabulary")
        if filters in MIN_P_REMOVALS:
            return min_p_removal_lowering(attrs.form, attrs.params())
        if filters in EPSILON_REMOVALS:
            return epsilon_removal_lowering(attrs.form, attrs.params())
        if filters in TYPICAL_MASKS:
            return typical_lowering(attrs.form, attrs.params())
        if filters in TOP_P_CHAINS:
            return top_p_chain_lowering(attrs.form, attrs.params())
        if filters == "top_k_exact_top_p_ascending_mask":
            return top_k_exact_top_p_lowering(attrs.form, attrs.params())
        return top_p_ascending_lowering(attrs.form, attrs.params())
    if attrs.form in FORMS and FORMS[attrs.form].base and call.operand_types[0][1] in ("f32", "bf16"):
        if FORMS[attrs.form].draw == "top_k" and len(call.operand_types[0][0]) not in (1, 2):
            raise Unsupported("the choice draw takes (B, V) logits or one row (V,)")
        return drawn_form_lowering(attrs.form, attrs.params(), hand)
    if attrs.form in ("top_p_of_probs_torch", "top_p_of_probs_torch_unnormalized"):
        if len(call.operand_types[0][0]) < 2 or call.operand_types[0][1] != "f32":
            raise Unsupported("the llama reference's top-p through torchax is drawn by the kernel for (..., V) f32 "
                              "rows only: the kernel's candidates by mass take f32 probabilities")
        return torch_nucleus_lowering(attrs.form, attrs.params())
    if attrs.form in RANK_NUCLEI and call.operand_types[0][1] in ("f32", "bf16"):
        return rank_nucleus_lowering(attrs.form, attrs.params())
    if attrs.form in FUNCTION_FORMS and call.operand_types[0][1] in ("f32", "bf16"):
        if attrs.k > call.operand_types[0][0][-1]:
            raise Unsupported(f"k = {attrs.k} exceeds the vocabulary")
        if attrs.form in WHOLE_ROW_FUNCTION_FORMS and call.operand_types[0][1] == "bf16":
            raise Unsupported(f"'{attrs.form}' of bf16 logits: the bf16 softmax and cumsum of the whole sorted row "
                              "round as XLA fuses them, which the kernel's sorted row does not reproduce")
        if attrs.form in BF16_UNSUPPORTED_FUNCTION_FORMS and call.operand_types[0][1] == "bf16":
            raise Unsupported(f"'{attrs.form}' on bf16 logits thresholds bf16-rounded probabilities, which the CPU "
                              "sampler does not reproduce")
        return function_form_lowering(attrs.form, attrs.params(), hand, attrs.fill if attrs.scores else None)
    if attrs.form not in FORM_CODES:
        raise Unsupported(f"the CPU sampler has no form '{attrs.form}'")
    dtype = call.operand_types[0][1]
    if dtype not in ("f32", "bf16"):
        raise Unsupported(f"the CPU sampler takes f32 or bf16 logits, not {dtype}")
    if dtype == "bf16" and attrs.form in BF16_UNSUPPORTED:
        raise Unsupported(f"'{attrs.form}' on bf16 logits thresholds bf16-rounded probabilities, which the CPU "
                          "sampler does not reproduce")
    if attrs.k > call.operand_types[0][0][-1]:
        raise Unsupported(f"k = {attrs.k} exceeds the vocabulary")

    def kernel(logits: jax.Array, key: jax.Array | None = None) -> jax.Array:
        return sample(logits, key, form=attrs.form, gumbel_at_zero=hand, **attrs.params())

    return kernel


#===--- Multi-device layout -----------------------------------------------------------------===#
# XLA's batch partitioner (`num_batch_dims`, hlofuse.sharding) runs a call per shard of its LEADING dims
# only, so in a module compiled for P devices the vocabulary becomes a leading dim of splits:
#   logits (*B, V) -> (R, P, V/P)     a reshape: a V sharded over devices arrives sharded along P
#   ids, scores (R, P) -> merged over P -> (*B,)
# R and P are both batch dims (num_batch_dims = 2): rows sharded cut R, a vocabulary sharded cuts P, and
# the merge is one small reduction over P that the partitioner runs like the unfused program's argmax.
# top_k_mask takes each split's top k first (`hlofuse_sample_top_k`, batch-partitionable like the sampler:
# XLA's partitioner gathers lax.top_k's whole operand, even along its batch dims), finds the row's k-th
# value on the (R, P * k) candidates, then samples the kept tokens per split. The rank-space forms (top_k,
# temperature_top_k) draw among the splits' candidates, packed (value, id) into one array so that the
# partitioner gathers them once (`_sample_rank_top_k_splits`). top-p and top-k + top-p keep the whole-row
# call: the nucleus needs the row sorted by value, which the unfused program gathers too.
TOP_K_FORMS = ("top_k_mask", "top_k", "temperature_top_k")
# min_p keeps a token by its softmax probability against the row's largest: elementwise work and three
# row reductions (max, sum, max), which the partitioner splits across a sharded vocabulary with small
# all-reduces, as it does in the unfused program. So the multi-device call computes the mask with the
# program's own ops (sampling_reference.min_p_masked, the same rounding) and samples the masked, scaled
# logits per split (categorical).
MASKED_FORMS = ("min_p",)


def vocab_splits_for(form: str, vocab: int, devices: int, staged: bool = False) -> int:
    """P: how many vocabulary splits a multi-device call takes as a leading batch dim (1 = the whole row; so for a
    composite with filters in front of its form, `staged`: each reads the whole row)."""
    if devices < 2 or vocab % devices or staged or form not in (*SPLIT_FORMS, *TOP_K_FORMS, *MASKED_FORMS):
        return 1
    return devices


def top_k_candidates(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """x (*L, P, W) -> each split's top min(k, W): values (*L, P, k') f32, global ids (*L, P, k') int32 (split
    p holds ids [p * W, (p + 1) * W)), value descending, lower id first on ties, as lax.top_k orders them.

    Concatenated in split order, the candidates of a row hold its top k in the same order: a token of the
    row's top k is in its split's top k, and among equal values, earlier positions have lower ids."""
    cpu.register()
    *lead, splits, width = x.shape
    kk = min(k, width)
    offsets = jnp.broadcast_to(jax.lax.iota(jnp.int32, splits) * width, (*lead, splits))
    out_types = [jax.ShapeDtypeStruct((*lead, splits, kk), jnp.float32),
                 jax.ShapeDtypeStruct((*lead, splits, kk), jnp.int32)]
    call = jax.ffi.ffi_call(TOP_K_TARGET, out_types, vmap_method="sequential")
    values, ids = call(x, offsets, k=np.int64(kk))
    return values, ids


def _sample_top_k_mask_splits(x: jax.Array, key: jax.Array | None, attrs: SampleAttrs) -> jax.Array:
    """(R, P, V/P) -> (R,) for top_k_mask: the row's k-th largest value is the k-th of its splits' top-k
    candidates (the top k of the (R, P * k) candidates, again by the kernel: lax.top_k would be gathered);
    then x >= kth (every tie of it stays) is sampled as temperature over the splits, which is the program's
    where(x < kth, -inf, x) / T with the same vocabulary-space noise."""
    rows, k = x.shape[0], attrs.k
    values, _ = top_k_candidates(x, k)  # (R, P, k') f32
    kth = top_k_candidates(values.reshape(rows, 1, -1), k)[0][:, 0, k - 1].astype(x.dtype)
    masked = jnp.where(x < kth[:, None, None], -jnp.inf, x)
    ids, scores = sample_splits(masked, key, form="temperature", temperature=attrs.temperature)
    return merge_vocab_splits(ids, scores)


def _sample_rank_top_k_splits(x: jax.Array, key: jax.Array | None, attrs: SampleAttrs) -> jax.Array:
    """(R, P, V/P) -> (R,) for the rank-space forms (top_k: categorical over top_k(x) / T, mapped back
    through the ids; temperature_top_k: the same over top_k(x / T)). Each split's top k with global ids
    (`hlofuse_sample_top_k`), packed as (value, id bits) f32 pairs into one (R, 2 * P * k') array, so that
    a vocabulary sharded over devices is gathered once, as the candidates; the kernel's packed form then
    ranks the candidates (their order is the row's: split by split, ids ascending), draws the rank noise
    at row * k + rank and returns the winner's id."""
    rows, k = x.shape[0], attrs.k
    temperature = attrs.temperature
    if attrs.form == "temperature_top_k":  # the program divides first, in the logits' dtype
        x, temperature = x / attrs.temperature, 1.0
    values, ids = top_k_candidates(x, k)  # (R, P, k')
    packed = jnp.stack([values, jax.lax.bitcast_convert_type(ids, jnp.float32)], axis=-1).reshape(rows, -1)
    form = "top_k_packed_bf16" if x.dtype == jnp.bfloat16 else "top_k_packed"
    row_ids = jax.lax.iota(jnp.int32, rows)
    (tokens,) = _sample_call(packed, _keys(key, (rows,)), row_ids, form=form, temperature=temperature, k=k,
                             p=1.0, min_p=0.0)
    return tokens


def partitioned_lowering(call: CompositeCall, devices: int, multi_device: str = "batch") -> Callable[..., Any]:
    """target=cpu in a module compiled for `devices` > 1 devices (`multi_device` batch or sequence, alike
    here: the vocabulary splits cost nothing when V is not sharded): the kernel with `vocab_splits_for`
    vocabulary splits as a leading batch dim next to the rows, so the partitioner keeps it local when
    the rows or the vocabulary are sharded. Same ids as `sampling_lowering`'s; forms that do not split
    (top_k, temperature_top_k, top-p) or a V the device count does not divide keep its whole-row
    call, with a remark."""
    whole_row = sampling_lowering(call)  # raises Unsupported for what the kernel does not take at all
    attrs = SampleAttrs.from_dict(call.attributes)
    if attrs.scores:
        raise Unsupported("a sampler that gives back its scores is drawn by the kernel on one device only")
    if attrs.gumbel_at_zero is not None:
        raise Unsupported("a hand-written Gumbel noise is drawn by the kernel on one device only")
    if attrs.form in FORMS and FORMS[attrs.form].row_params:
        raise Unsupported(f"'{attrs.form}' takes per-row parameters, which the kernel takes on one device only")
    if attrs.form in FORMS and FORMS[attrs.form].row_keys:
        # (the partitioner's cuts take the key as one (2,) key for every shard: (B, 2) keys are not cut by row)
        raise Unsupported(f"'{attrs.form}' draws each row with its own key, which the kernel takes on one device only")
    vocab = call.operand_types[0][0][-1]
    splits = vocab_splits_for(attrs.form, vocab, devices, bool(attrs.stages))
    if splits == 1 and attrs.form in CERTIFIED_NUCLEI and call.operand_types[0][1] == "f32":
        # the draw and its fallback's sort read the same rows: gathered once (`_whole_rows`), not once per call
        return lambda logits, key=None: whole_row(_whole_rows(logits), key)
    if splits == 1:
        return whole_row

    def kernel(logits: jax.Array, key: jax.Array | None = None) -> jax.Array:
        batch = logits.shape[:-1]
        rows = int(np.prod(batch, dtype=np.int64))
        if attrs.form == "min_p":
            masked = min_p_masked(logits, temperature=attrs.temperature, min_p=attrs.min_p)
            ids, scores = sample_splits(masked.reshape(rows, splits, vocab // splits), key, form="categorical")
            return merge_vocab_splits(ids, scores).reshape(batch)
        x = logits.reshape(rows, splits, vocab // splits)  # (R, P, V/P)
        if attrs.form == "top_k_mask":
            return _sample_top_k_mask_splits(x, key, attrs).reshape(batch)
        if attrs.form in ("top_k", "temperature_top_k"):
            return _sample_rank_top_k_splits(x, key, attrs).reshape(batch)
        ids, scores = sample_splits(x, key, form=attrs.form, temperature=attrs.temperature)
        return merge_vocab_splits(ids, scores).reshape(batch)

    return kernel


def _whole_rows(x: jax.Array) -> jax.Array:
    """x itself, through `hlofuse_sample_whole_rows`, whose sharding rule gathers a sharded vocabulary here, once."""
    cpu.register()
    return jax.ffi.ffi_call(WHOLE_ROWS_TARGET, jax.ShapeDtypeStruct(x.shape, x.dtype), vmap_method="sequential")(x)


def whole_row_remark(call: CompositeCall, devices: int) -> str | None:
    """Why `partitioned_lowering` samples `call` by whole rows (gathering a sharded vocabulary), or None when it
    splits the vocabulary."""
    attrs = SampleAttrs.from_dict(call.attributes)
    vocab = call.operand_types[0][0][-1]
    if vocab_splits_for(attrs.form, vocab, devices, bool(attrs.stages)) > 1:
        return None
    why = (f"V = {vocab} is not a multiple of the {devices} devices" if vocab % devices else
           f"its filters in front of '{attrs.form}' read the whole row" if attrs.stages else
           f"'{attrs.form}' needs a row-wide threshold or rank before any split")
    return f"sampled by whole rows ({why}): a vocabulary sharded over devices is gathered before the call"


def _partitioned(call: CompositeCall, devices: int, multi_device: str) -> Lowered:
    return Lowered(partitioned_lowering(call, devices, multi_device), remark=whole_row_remark(call, devices))


def shard_cuts(call: CompositeCall, devices: int) -> Cuts:
    """The dims `partitioned_lowering`'s call keeps local (hlofuse.shard_local): the rows and, for the
    forms that split it, the vocabulary."""
    attrs = SampleAttrs.from_dict(call.attributes)
    vocab = call.operand_types[0][0][-1]
    return sample_cuts(call, vocab=vocab_splits_for(attrs.form, vocab, devices, bool(attrs.stages)) > 1)


# XLA's batch partitioner runs the FFI call per shard of its leading dims (hlofuse.sharding).
SPECS = (KernelSpec(SAMPLE, "cpu", lowered(sampling_lowering), Partitioning.XLA_BATCH,
                    lower_partitioned=_partitioned, cuts=shard_cuts),)

__all__ = ["SPECS", "FORM_CODES", "MASKED_FORMS", "PACKED_FORM_CODES", "SPLIT_FORMS", "TOP_K_FORMS", "isa",
           "noise_stats", "partitioned_lowering", "sample", "sample_reference", "sample_splits", "sampling_lowering",
           "shard_cuts", "whole_row_remark",
           "top_k_candidates", "vocab_splits_for"]
