"""Random token samplers for the sampling differential test (test_sampling_differential.py).

`SamplerSpec` describes one sampler program: its form (the semantics, sampling_reference.FORMS) and the
ways libraries vary how they write it: logits dtype and an f32 upcast, the batch shape (with a decode-step
slice of the last position), how the temperature is applied, top-k by `lax.top_k` or a sort, top-p as
JetStream/MaxText, gemma or keras-hub write it, Hugging Face's min-p, epsilon and typical warpers as torchax
lowers them (after its temperature warper, with or without its top-k warper), x-transformers' min-p of the logits
and keras-hub's top-k of the probabilities (LIBRARY_FILTERS), typed or raw keys (split or
folded in the program), `jax.random.categorical` or an explicit Gumbel argmax, other consumers of the logits
and of the constants the sampler shares after CSE, and interior values returned by the program.

`build(spec)` writes the program, `inputs(spec, logits, seed)` its arguments, and `expected(spec)` the
fusion the spec must get: the form and attributes of its `hlofuse.sample` composite, or None where it must
stay unfused with a remark. Writings that compute the form's function in other ops (a traced or
reciprocal temperature, a sort for top-k, rank-space top-p) are exact only as the `categorical` of what
they feed the draw: that is the fusion expected for them. The library writings are reconstructed from
the libraries' documented behaviour, not copied.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from hlofuse.kernels.noise import hand_noise_at_zero

# Hugging Face's warpers as torchax lowers `generate()`'s logits processors: MinPLogitsWarper, EpsilonLogitsWarper and
# TypicalLogitsWarper over (B, V) logits, each after the TemperatureLogitsWarper and, with `warper_top_k`, the
# TopKLogitsWarper (4.x's default top-k 50). The form is then `top_k_<form>`. The min-p and epsilon warpers may
# follow the TopPLogitsWarper (`warper_top_p`, 5.x's chains): the form is then `[top_k_]top_p_<form>`.
HF_WARPERS = ("min_p_removal", "epsilon_removal", "typical_mask")
# Filters as libraries write them whose form is their own (LIBRARY_FORMS): min_p_logits, x-transformers' `min_p` (the
# min-p of the logits' own softmax, then / T); top_a_logits, its `top_a` (the same with the square of the largest
# probability, SQUARES: torch.pow(m, 2.0) through torchax, or `m ** 2` in JAX); top_k_of_probs, keras-hub's
# TopKSampler (the top k of softmax(x / T), drawn by the log of their probabilities in rank space; nanoGPT-style code
# takes it at T = 1); probs_weights, a filter of softmax(x / T) written in torch by hand (`weights_filter`: a min-p
# `torch.where(probs < min_p * top, 0, probs)`, or a top-k `probs * (probs >= topk(probs)[0][..., -1:])`), renormalised
# or not (`renormalize`: torch.multinomial takes weights), drawn by torch.multinomial through torchax ((B, V) rows);
# min_p_log, a min-p in logit space as serving pipelines write it (`where(y >= max(y) + log(min_p), y, -inf)` of y =
# x / T, its log a constant of the program or its op, MIN_P_LOGS; a scalar threshold for one row (V,)), f32 only.
LIBRARY_FILTERS = ("min_p_logits", "top_a_logits", "top_k_of_probs", "probs_weights", "min_p_log")
MIN_P_LOGS = {"constant": "min_p_log_constant_mask", "op": "min_p_log_mask"}
LIBRARY_FORMS = {"min_p_logits": "min_p_logits_mask", "top_a_logits": "top_a_logits_mask",
                 "top_k_of_probs": "top_k_of_probs"}
WEIGHTS_FILTERS = {"min_p": "min_p_of_probs_torch", "top_k": "top_k_of_probs_torch"}
SQUARES = {"power": lambda m: jnp.power(m, 2.0), "squared": lambda m: m**2}
FORMS = ("greedy", "greedy_softmax", "categorical", "temperature", "top_k", "temperature_top_k", "top_k_mask",
         "top_p_mask", "top_k_top_p_mask", "min_p", *HF_WARPERS, *LIBRARY_FILTERS)
STOCHASTIC = FORMS[2:]
READS_T = ("temperature", "top_k", "temperature_top_k", "top_k_mask", "top_p_mask", "top_k_top_p_mask", "min_p",
           *HF_WARPERS, *LIBRARY_FILTERS)
USES_TOP_K = ("top_k", "temperature_top_k", "top_k_mask", "top_k_top_p_mask", "top_k_of_probs", "probs_weights")
RANK_SPACE_TOP_KS = ("top_k", "temperature_top_k", "top_k_of_probs")  # drawn among the top k, mapped back by their ids
USES_TOP_P = ("top_p_mask", "top_k_top_p_mask")
MODES = {"greedy": "greedy", "greedy_softmax": "greedy", "categorical": "temperature", "temperature": "temperature",
         "top_k": "top_k", "temperature_top_k": "top_k", "top_k_mask": "top_k", "top_p_mask": "top_p",
         "top_k_top_p_mask": "top_k+top_p", "min_p": "min_p", "min_p_removal": "min_p", "epsilon_removal": "epsilon",
         "typical_mask": "typical", "min_p_logits": "min_p", "top_a_logits": "min_p", "top_k_of_probs": "top_k",
         "probs_weights": "min_p", "min_p_log": "min_p"}
# How the min-p warper keeps its top token (min_tokens_to_keep = 1): transformers 5.x scatters False at
# torch.topk(probs, 1)'s id; 4.x gathers the removal into a descending argsort of the scores, clears rank 0 and
# scatters it back.
MIN_P_KEEPS = ("topk", "argsort")
# v: (V,); b: (B, V); b1: (B, 1, V); bt: (B, T, V) of which the sampler reads the last position.
BATCHES = ("v", "b", "b1", "bt")
# A one-row sampler vmapped over (B, V) rows: each row with its own key (jax.random.split), or all with the one key.
# The composite is the one-row form's with that draw (`<form>_row_keys`, `<form>_same_key_rows`).
PER_SEQUENCE = ("row_keys", "same_key_rows")
# const: x / T (a Python float); reciprocal: x * (1 / T); traced: x / t with t a scalar argument; before: x / T
# applied to the logits before the sampler, which then scales no more (gemma's top-p, Hugging Face's
# TemperatureLogitsWarper first): for the mask forms only (SCALED_BEFORE).
TEMPERATURES = ("const", "reciprocal", "traced")
SCALED_BEFORE = ("top_k_mask", "top_p_mask", "top_k_top_p_mask", *LIBRARY_FILTERS)
# lax.top_k, a stable descending argsort sliced to k (values gathered), or argsort(-x) sliced to k (which
# puts NaN last, unlike lax.top_k: not a top-k writing)
TOP_KS = ("lax", "sort", "negated_sort")
MASK_TOP_KS = TOP_KS + ("torchax",)  # torch.topk's k-th as torchax lowers it (its values sorted again), for masks
# A top-k mask by the k-th of an ascending sort, `jnp.sort(x)[..., -k]` (top_k_mask only), and the form it is:
# sort_keep keeps the logits at or above it ((B, V) logits, as JAX engines and EasyDeL write it: a NaN logit never
# kept, so not top_k_mask); sort_below drops those below it (minGPT's, as JAX code writes it, logits of any rank: a
# writing of top_k_mask, `sampling_reference.sort_column`), its column read as `[..., -k][..., None]` or, for an even
# k, `[..., -k:][..., :1]`. The others go to the spec's fill.
SORT_COLUMN_TOP_KS = {"sort_keep": "top_k_keep_mask", "sort_below": "top_k_mask"}
# sort: the reference (descending sort, softmax after it, cutoff at sum(cumsum < p)); top_k: the same with
# a full-width lax.top_k for the sort (JetStream / MaxText); gemma: softmax first, then sort the
# probabilities, drop where cumsum - prob > p, draw in rank space; keras: sort the probabilities, keep the
# shifted `cumsum <= p` mask, draw from log(kept) in rank space; hf: Hugging Face's TopPLogitsWarper as torchax
# lowers it (ascending unstable sort, remove `cumsum <= 1 - p` but the largest, scattered back); flax: its
# FlaxTopPLogitsWarper (a full-width lax.top_k, the rolled `cumsum < p`, sort_key_val back); mtj: mesh-transformer-jax's
# `nucleaus_filter` (jnp.sort and argsort reversed, the shifted `cumsum > p` removal, sort_key_val back, 1e10
# subtracted from the removed); tvq: transformer_vq's `nucleus` of the scaled logits (the softmax sorted ascending
# with its stable argsort, `cumsum > 1 - p` or the last place, back by the argsort of the argsort, the mask multiplied
# in); classic: the classic filter of the scaled logits (Megatron-LM's, Hugging Face's old `top_k_top_p_filtering`,
# through torchax: torch.sort descending, `cumsum > p` shifted a place later, the first never removed, scattered back);
# xt: x-transformers' `top_p` of the logits (the same cut, shifted by F.pad, the sorted logits filled and scattered
# back), then / T; levanter: Levanter's (marin's) of the scaled logits, in f32 (a stable argsort reversed, the logits
# taken along it, `cumsum < clip(p, 0, 1)[..., None] - 1e-4` shifted by a concatenate, -inf, back by a take along the
# argsort of the order); haiku: the nucleus of DeepMind's Haiku samplers and grok-1 of the scaled logits, in f32 (the
# values sorted ascending by lax.sort, the cut at `argmax(cumsum >= 1 - p)`, the logits at or above the sorted logit
# there kept, the others at the spec's fill); haiku_logits: the same of the logits, then / T (perceiver-ar's). hf takes
# (B, V) logits or one row (litgpt's), flax, mtj, classic, xt and levanter (B, V) logits, haiku any; hf, flax, classic,
# xt and levanter fill with -inf; simply: google-deepmind/simply's of the scaled logits, in f32 (softmax in id order
# taken along a stable descending argsort, its exclusive cumsum below p, put back by sort_key_val; after a top-k, its
# fused nucleus of lax.top_k's k, the kept ids as a one-hot mask), any logits, the spec's fill; jax: the classic filter
# of the scaled logits as JAX engines write it ((B, V) logits, -inf: `argsort(y)[:, ::-1]` or `jnp.flip`, the logits
# taken along it, the shift by `jnp.roll(...).at[:, 0].set(False)`, a concatenate or `jnp.pad`, the mask or the
# filled sorted logits put back by a take along the order's argsort, by sort_key_val or (the logits) by a scatter to
# the order's places; `_jax_classic_writing` picks
# one of each from the spec's p, so that generated programs meet every writing).
TOP_PS = ("sort", "top_k", "gemma", "keras", "hf", "flax", "mtj", "tvq", "classic", "xt", "levanter", "haiku",
          "haiku_logits", "simply", "jax")
# What the sort / top_k styles of the nucleus fill dropped logits with: -inf, or a large negative number (gemma's
# finfo.min, MaxText's -1e7: writings of the form, FILL_NOTE), or -1000, which a kept logit may come near, so no
# writing of it (top_p_mask only: it fuses as the fallback of its output).
FILLS = ("-inf", "finfo_min", "-1e7", "-1000")
# The rank-space styles and the forms they write (sampling_reference.RANK_NUCLEI).
RANK_SPACE_TOP_PS = {"gemma": "top_p_of_probs_normalized", "keras": "top_p_of_probs"}
# The forms a nucleus written in the Hugging Face styles fuses to, alone and after a top-k mask (the torch chain has
# a form; Flax's follows only its own exact top-k, so a top-k mask before it stays in XLA).
HF_TOP_PS = {"hf": ("top_p_ascending_mask", "top_k_top_p_ascending_mask"), "flax": ("top_p_flax_mask", None),
             "mtj": ("top_p_mtj_mask", None), "tvq": ("top_p_prob_sorted_mask", None),
             "classic": ("top_p_shifted_mask", None), "xt": ("top_p_shifted_logits_mask", None),
             "levanter": ("top_p_levanter_mask", None), "haiku": ("top_p_haiku_mask", None),
             "haiku_logits": ("top_p_haiku_logits_mask", None),
             "simply": ("top_p_simply_mask", "top_k_top_p_simply_mask"), "jax": ("top_p_flipped_mask", None)}
HAIKU_TOP_PS = ("haiku", "haiku_logits")  # any logits, f32 (Haiku asserts it), a large fill
F32_ANY_SHAPE_TOP_PS = (*HAIKU_TOP_PS, "simply")  # any logits, upcast to f32, a large fill
# The nuclei of the scaled logits (the program divides by T before the filter): the form each style fuses to.
SCALED_NUCLEI = {"tvq": "top_p_prob_sorted_mask", "classic": "top_p_shifted_mask", "levanter": "top_p_levanter_mask",
                 "haiku": "top_p_haiku_mask", "simply": "top_p_simply_mask", "jax": "top_p_flipped_mask"}
# How the jax style varies the classic cut (`jax_classic_removal`): "" as the JAX engines mostly write it, or with
# the logits sorted apart, `argsort(descending=True)` (top_p_descending_mask), a `>= p` removal (the form at the float
# below p) or the cumsum sliced before its compare, and all of the last three; or the removal not shifted
# (top_p_unshifted_mask: the crossing token removed too), with the logits sorted apart or `>= p`.
JAX_CUTS = ("", "sorted_apart", "descending", "at_or_above", "slice_first", "descending+at_or_above+slice_first",
            "unshifted", "unshifted+sorted_apart", "unshifted+at_or_above")
LEVANTER_TOLERANCE = 1e-4  # what Levanter's nucleus subtracts from its p (in f32, in jnp)
KEY_KINDS = ("raw", "typed")  # the uint32 key data as a legacy key, or wrapped by jax.random.wrap_key_data
KEY_OPS = ("none", "split", "fold_in")  # fold_in folds a traced int32 step
# gumbel: argmax(x + g); gumbel_first: argmax(g + x); keras: keras' JAX random.categorical(x, 1), a categorical of
# x[..., None] along the vocabulary with shape (..., 1), its (..., 1) ids squeezed (rank-space forms take_along_axis
# the (..., 1) ids first, as keras-hub does)
NOISES = ("categorical", "gumbel", "gumbel_first", "keras")
# Gumbel noises written by hand, -log(-log(u)) of a uniform u with its logs guarded by 1e-20 (f32 logits, a draw of
# the rows as they are): hand_sums, PaLM-jax's `log(t + eps)`; hand_clamps, lucidrains' `clamp(min=eps)` in JAX;
# hand_inner_sum, only the inner log guarded, `-log(-log(u + eps))`; hand_minus, PaLM-jax's subtracted from the
# logits, `x - log(-log(u + eps) + eps)`; hand_unguarded, the textbook `-log(-log(u))` (-inf where u = 0). The
# composite carries the noise where u = 0 (`gumbel_at_zero`).
HAND_NOISES = {"hand_sums": "logs_of_sums", "hand_clamps": "logs_of_clamps", "hand_inner_sum": "log_of_sum",
               "hand_minus": "minus_logs_of_sums", "hand_unguarded": "unguarded_logs"}
HAND_NOISE_EPS = 1e-20
# How a rank-space form maps the drawn rank back to its id: take_along_axis, or gemma's ids[arange(B), rank]
# ((B, k) candidates only), or torch's (`v, ix = torch.topk(y, k)`, `torch.gather(ix, -1, idx)` as torchax lowers
# them: the top k's values sorted again and their ids taken along the argsort, then gathered by an iota of rows)
TAKES = ("along_axis", "batch_index", "torch_gather")
# What the draw samples from its scaled, filtered logits y: y itself, log_softmax(y), log(softmax(y)) (keras-hub),
# or softmax(y) by jax.random.choice per row (torch.multinomial through torchax; (B, V) rows, or one row (V,) whose
# (1,) ids litgpt's `sample` returns, for the forms that draw in vocabulary order). The form
# is then `<form>_<draw>` (sampling_reference.DRAWS).
# or each row by a key of its own (row_keys: the key split into one per row, then a vmapped categorical), or softmax(y)
# by jax.random.choice with replacement (inverse_cdf: its cumsum searched at a uniform; one row (V,) by its default,
# a () id, or per row with one key, torch.multinomial(replacement=True) through torchax).
# or the exponential race (argmax(softmax(y) / exponential noise): gpt-fast's, torchtune's and vLLM's draw).
DRAWS = ("categorical", "log_softmax", "log_of_softmax", "choice", "row_keys", "inverse_cdf", "exponential_race")
# The mask forms' filters written as threshold searches over float32 bits (axlearn's logit modifiers; T5X's
# topk_mask and topp_mask): the logits scaled first, then the searched top-k (keep x >= the k-th
# largest) and the searched top-p (keep softmax >= the largest t whose mass at or above it reaches p). axlearn: the
# sign bit `jnp.int32(1 << 31)` (int32's minimum, as NumPy 1 wraps it) and the cutoff as `-1 * t`; t5x: a uint32 sign
# bit and `-t` (tpu-inference's too). The form is then SEARCHED[form].
SEARCH_SIGNS = ("axlearn", "t5x")
SEARCHED = {"top_k_mask": "searched_top_k", "top_p_mask": "searched_top_p", "top_k_top_p_mask": "searched_top_k_top_p"}
# Outputs next to the token: the logits, their log-softmax at the token (logprobs), another
# take_along_axis of the logits, an iota-indexed select: consumers the sampler must not be blocked by.
EXTRAS = ("logits", "logprobs", "take", "iota")
# Interior values a program returns, which must block fusion: the probabilities (greedy_softmax, min_p),
# the scaled logits (temperature), the cumulative probabilities (top_p_mask).
ESCAPES = {"greedy_softmax": "probs", "min_p": "probs", "temperature": "scaled", "top_p_mask": "cumulative"}

NEG_INF = -jnp.inf


@dataclass(frozen=True)
class SamplerSpec:
    form: str
    vocab: int = 64
    batch: str = "b"
    rows: int = 2  # B
    steps: int = 3  # T, for batch "bt"
    dtype: str = "float32"
    upcast: bool = False  # x.astype(f32) before the sampler
    temperature: float = 0.7
    temperature_style: str = "const"
    k: int = 5
    top_k_style: str = "lax"
    p: float = 0.9
    top_p_style: str = "sort"
    fill: str = "-inf"
    min_p: float = 0.1
    square: str = "power"  # how top_a_logits squares the largest probability (SQUARES)
    weights_filter: str = "min_p"  # probs_weights' filter (WEIGHTS_FILTERS)
    renormalize: bool = False  # whether probs_weights divides its kept probabilities by their sum
    min_p_log: str = "constant"  # how min_p_log takes log(min_p) (MIN_P_LOGS)
    epsilon: float = 0.02
    warper_top_k: bool = False  # the TopKLogitsWarper (k) before a Hugging Face warper
    warper_top_p: bool = False  # the TopPLogitsWarper (p) before the min-p (5.x's keep only) or epsilon warper
    min_p_keep: str = "topk"
    key_kind: str = "raw"
    key_op: str = "none"
    noise: str = "categorical"
    draw: str = "categorical"
    take: str = "along_axis"
    extras: tuple[str, ...] = ()
    escape: bool = False
    search_sign: str = ""  # the mask forms' filters as threshold searches (SEARCH_SIGNS), "" for not
    # A searched sampler also returning the drawn token's log-probability under the scores it drew from (T5X's decode
    # step): the composite gives those back (`scores`), and fuses whole.
    log_prob: bool = False
    # Where the sampler runs: "" in the function's body, "cond" in a lax.cond's second branch (T5X's draw under
    # `T > 0`), "loop" in a decode loop's body, the temperature carried as `jnp.array(T)` (Flax's lm1b, T5X).
    enclosure: str = ""
    prelude: bool = False  # log_softmax of the logits before the sampler (axlearn's decoder): `<form>_of_log_probs`
    draw_rows: int = 0  # n > 0: the (R, V) rows drawn as (R / n, n, V) (axlearn's decodes per prompt), ids back to (R,)
    # The (B, V) rows' choice or inverse-CDF ids left (B, 1), as `torch.multinomial(probs, 1)` gives them and nanoGPT's
    # and the llama reference's samplers return them (vocabulary-space forms: no take reads them)
    unit_ids: bool = False
    # grok-1's `sample_token` settings (haiku style, (B, V) or (B, 1, V) logits): T and p per row, (B,) arguments with
    # unit dims added up to the logits' rank, and a (B, V) int mask of allowed tokens applied after / T with -1e10
    settings_rows: bool = False
    # The jax style's variation of the classic cut (JAX_CUTS): its order, values, rule and shift as engines vary them.
    jax_cut: str = ""
    # A sampler written for one sequence's row (V,) and vmapped over the (B, V) rows (PER_SEQUENCE: with a key split
    # per row, or the one key for every row), as serving pipelines write their stages: "" for the rows as they are.
    per_sequence: str = ""

    @property
    def stochastic(self) -> bool:
        return self.form in STOCHASTIC

    @property
    def logits_shape(self) -> tuple[int, ...]:
        lead = {"v": (), "b": (self.rows,), "b1": (self.rows, 1), "bt": (self.rows, self.steps)}[self.batch]
        return (*lead, self.vocab)

    @property
    def sampler_dtype(self) -> str:
        return "float32" if self.upcast else self.dtype

    @property
    def arg_names(self) -> list[str]:
        names = ["logits"]
        if self.stochastic:
            names.append("key")
        if self.temperature_style == "traced" and self.form in READS_T:
            names.append("temperature")
        if self.stochastic and self.key_op == "fold_in":
            names.append("step")
        if "take" in self.extras:
            names.append("index")
        if self.settings_rows:
            names += ["temperatures", "top_ps", "allowed"]
        return names


def np_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def arg_specs(spec: SamplerSpec) -> list[jax.ShapeDtypeStruct]:
    rows = spec.logits_shape[:-1] if spec.batch != "bt" else spec.logits_shape[:1]
    shapes: dict[str, tuple[tuple[int, ...], Any]] = {
        "logits": (spec.logits_shape, jnp.dtype(spec.dtype)), "key": ((2,), jnp.uint32),
        "temperature": ((), jnp.float32), "step": ((), jnp.int32), "index": ((*rows, 1), jnp.int32),
        "temperatures": (rows[:1], jnp.float32), "top_ps": (rows[:1], jnp.float32),
        "allowed": ((*rows[:1], spec.vocab), jnp.int32)}
    return [jax.ShapeDtypeStruct(*shapes[name]) for name in spec.arg_names]


def inputs(spec: SamplerSpec, logits: np.ndarray, seed: int) -> list[np.ndarray]:
    rows = spec.logits_shape[:-1] if spec.batch != "bt" else spec.logits_shape[:1]
    values = {"logits": logits, "key": np.array([seed, 1000 + 7 * seed], np.uint32),
              "temperature": np.float32(spec.temperature), "step": np.int32(3 + seed),
              "index": np.full((*rows, 1), (5 * seed) % spec.vocab, np.int32)}
    if spec.settings_rows:  # each row its own T and p (p = 1 keeps every token), about 1 token in 8 disallowed
        batch = rows[0]
        values["temperatures"] = (spec.temperature * (1.0 + 0.25 * np.arange(batch))).astype(np.float32)
        values["top_ps"] = np.resize(np.array([spec.p, 1.0, 0.3, 1e-3], np.float32), batch)
        values["allowed"] = (np.random.default_rng(seed).random((batch, spec.vocab)) > 0.125).astype(np.int32)
    return [np.asarray(values[name]) for name in spec.arg_names]


# ----- expectations ------------------------------------------------------------------------------------


def _rounded(value: float, dtype: str) -> float:
    return float(np.asarray(value, np_dtype(dtype)).astype(np.float64))


def _scales_first(spec: SamplerSpec) -> bool:
    """A form whose function scales the logits before its filter, with the temperature written another way: the
    scaling is the program's, outside the site, and the rest is the form unscaled (T = 1; temperature_top_k
    unscaled is top_k)."""
    return spec.form in ("temperature_top_k", "min_p", "top_k_of_probs", "probs_weights", "min_p_log", *HF_WARPERS) \
        and spec.temperature_style in ("reciprocal", "traced")


def writes_form_exactly(spec: SamplerSpec) -> bool:
    """Whether the program computes its form op for op as the reference writes it (else it is exact only
    as the categorical of what it feeds the draw)."""
    if spec.form in READS_T and spec.temperature_style not in ("const", "before") and not _scales_first(spec):
        return False
    if spec.form in USES_TOP_K and spec.top_k_style == "negated_sort":
        return False
    if spec.form == "top_k_top_p_mask" and spec.top_k_style == "torchax" and spec.top_p_style in ("sort", "top_k"):
        return False  # the torchax k-th is a writing of top_k_mask and of the torch chain only
    if spec.form in USES_TOP_P and spec.top_p_style in HF_TOP_PS:
        return spec.form == "top_p_mask" or HF_TOP_PS[spec.top_p_style][1] is not None
    # A stable descending argsort sliced to k for the top-k, and a full-width lax.top_k for the nucleus's
    # sort, are other writings of the form (sampling_reference).
    if spec.form in USES_TOP_P and spec.fill == "-1000":
        return False
    return not (spec.form in USES_TOP_P and spec.top_p_style not in ("sort", "top_k"))


# Forms whose writing divides by T right before the draw: another writing of their filter still ends in
# `categorical(key, filtered / T)`, which is the temperature form of the filtered logits.
_T_LAST = ("temperature", "top_k", "top_k_mask", "top_p_mask", "top_k_top_p_mask")


def expected(spec: SamplerSpec) -> tuple[str, dict[str, Any]]:
    """(form, attributes) of the composite the spec must fuse to: every generated sampler fuses, whole or at its
    draw (with a remark naming what stays in XLA); with a hand-written noise, the same, its noise where the uniform
    is 0 carried (`gumbel_at_zero`)."""
    if spec.per_sequence:  # the one row's form, with the draw of its keys
        form, attrs = expected(one_row(spec))
        return f"{form}_{spec.per_sequence}", attrs
    form, attrs = _expected(spec)
    if spec.noise in HAND_NOISES:
        attrs["gumbel_at_zero"] = hand_noise_at_zero(HAND_NOISES[spec.noise], HAND_NOISE_EPS, HAND_NOISE_EPS)
    return form, attrs


def _expected(spec: SamplerSpec) -> tuple[str, dict[str, Any]]:
    dtype = spec.sampler_dtype
    attrs: dict[str, Any] = {"mode": MODES[spec.form], "temperature": 1.0, "k": 0, "p": 1.0, "min_p": 0.0}
    draw = f"_{spec.draw}" if spec.draw != "categorical" and spec.stochastic else ""
    suffix = draw
    if spec.escape and writes_form_exactly(spec):  # (otherwise the escaping value is not inside the fallback's site)
        form, values = _escape_fallback(spec, attrs, dtype)
        return form + suffix, values
    if spec.prelude:  # written exactly (sampler_specs): the site's logits are the log-probabilities, taken in
        suffix += "_of_log_probs"
    if spec.search_sign and dtype != "float32":  # no searched form of bf16 values (EXCESS_PRECISION_NOTE): the
        return "categorical" + draw, {**attrs, "mode": "temperature"}  # draw of what the searches keep, in part
    if spec.search_sign:
        return _searched(spec, attrs, dtype, suffix)
    if spec.form in USES_TOP_P and spec.top_p_style in RANK_SPACE_TOP_PS:
        return _rank_space_nucleus(spec, attrs, dtype)
    if spec.form == "top_p_mask" and spec.top_p_style == "haiku_logits" and spec.temperature_style == "before":
        spec = dataclasses.replace(spec, top_p_style="haiku")  # scaled right before its cut: Haiku's nucleus of x / T
    if spec.form in USES_TOP_P and spec.top_p_style in SCALED_NUCLEI:
        form, values = _scaled_nucleus(spec, attrs, dtype)
        return form + suffix, values
    if not writes_form_exactly(spec):
        form, values = _fallback(spec, attrs, dtype)
        return form + suffix, values
    if spec.form in HF_WARPERS:
        form, values = _hf_warper(spec, attrs, dtype)
        return form + suffix, values
    if spec.form == "probs_weights":
        form, values = _weights_form(spec, attrs, dtype)
        return form + suffix, values
    form = LIBRARY_FORMS.get(spec.form, spec.form)
    if spec.form in USES_TOP_P and spec.top_p_style in HF_TOP_PS:
        form = HF_TOP_PS[spec.top_p_style][spec.form == "top_k_top_p_mask"]
        attrs["mode"] = "top_k+top_p" if spec.form == "top_k_top_p_mask" else "top_p"
    if _scales_first(spec) and form == "temperature_top_k":
        form, attrs["mode"] = "top_k", "top_k"
    if spec.form == "top_k_mask" and spec.top_k_style in SORT_COLUMN_TOP_KS:
        form = SORT_COLUMN_TOP_KS[spec.top_k_style]
    # (top_k_of_probs and min_p_log divide first, so a division "before" them is the form's own)
    divides_first = spec.form in ("top_k_of_probs", "min_p_log") and spec.temperature_style == "before"
    if spec.form in READS_T and (spec.temperature_style == "const" or divides_first):
        attrs["temperature"] = _rounded(spec.temperature, dtype)
    if spec.form in USES_TOP_K:
        attrs["k"] = spec.k
    if spec.form in USES_TOP_P:
        attrs["p"] = _nucleus_p(spec, dtype)
    if spec.form in ("min_p", "min_p_logits", "top_a_logits"):
        attrs["min_p"] = _rounded(spec.min_p, dtype)
    if spec.form == "min_p_log":  # (the constant log: exp of it, from which the kernel's f32(log) gives it back)
        form = MIN_P_LOGS[spec.min_p_log]
        constant = spec.min_p_log == "constant"
        attrs["min_p"] = math.exp(np.float32(math.log(spec.min_p))) if constant else _rounded(spec.min_p, dtype)
    return form + suffix, attrs


def _weights_form(spec: SamplerSpec, attrs: dict[str, Any], dtype: str) -> tuple[str, dict[str, Any]]:
    """probs_weights fuses whole as its filter's torch form (`_unnormalized` where it draws the weights as they are),
    its temperature read where the program divides by a constant right before its softmax (else 1: the scaling
    outside)."""
    form = WEIGHTS_FILTERS[spec.weights_filter] + ("" if spec.renormalize else "_unnormalized")
    attrs = {**attrs, "mode": spec.weights_filter}
    if spec.temperature_style in ("const", "before"):  # (a division right before its softmax is its own)
        attrs["temperature"] = _rounded(spec.temperature, dtype)
    if spec.weights_filter == "min_p":
        attrs["min_p"] = _rounded(spec.min_p, dtype)
    else:
        attrs["k"] = spec.k
    return form, attrs


def _searched(spec: SamplerSpec, attrs: dict[str, Any], dtype: str, suffix: str) -> tuple[str, dict[str, Any]]:
    """A searched mask form: the temperature is the form's where the program divides by a constant right before the
    searches, as the form's chain does, "before" the sampler too (else 1: the scaling stays outside, the form's
    unscaled writing), k and p its constants."""
    attrs = dict(attrs)
    if spec.temperature_style in ("const", "before"):
        attrs["temperature"] = _rounded(spec.temperature, dtype)
    if spec.form in USES_TOP_K:
        attrs["k"] = spec.k
    if spec.form in USES_TOP_P:
        attrs["p"] = _rounded(spec.p, dtype)
    if spec.log_prob:  # the scores, the dropped logits at the program's fill
        attrs |= {"scores": True, "fill": _rounded(SEARCH_FILLS[spec.fill], dtype)}
    return SEARCHED[spec.form] + suffix, attrs


def _hf_warper(spec: SamplerSpec, attrs: dict[str, Any], dtype: str) -> tuple[str, dict[str, Any]]:
    """A Hugging Face warper's form and attributes: the temperature is the form's where the program divides by a
    constant and no top-k warper lies between (else 1: the scaling stays outside)."""
    if spec.warper_top_p:
        return _hf_top_p_chain(spec, attrs, dtype)
    attrs = dict(attrs)
    if spec.temperature_style == "const" and not spec.warper_top_k:
        attrs["temperature"] = _rounded(spec.temperature, dtype)
    if spec.form == "min_p_removal":
        attrs["min_p"] = _rounded(spec.min_p, dtype)
    elif spec.form == "epsilon_removal":
        attrs["epsilon"] = _rounded(spec.epsilon, dtype)
    else:
        attrs["p"] = _rounded(spec.p, dtype)
    if not spec.warper_top_k:
        return spec.form, attrs
    attrs["k"] = spec.k
    if attrs["mode"] != "min_p":
        attrs["mode"] = f"top_k+{attrs['mode']}"
    return f"top_k_{spec.form}", attrs


def _hf_top_p_chain(spec: SamplerSpec, attrs: dict[str, Any], dtype: str) -> tuple[str, dict[str, Any]]:
    """generate()'s Temperature, [TopK,] TopP, then MinP or Epsilon chain: its form divides by T first, so a constant
    T is read whether or not a top-k lies between (else 1: the scaling stays outside)."""
    attrs = {**attrs, "p": 1 - _rounded(1 - spec.p, dtype)}
    if spec.form == "min_p_removal":
        attrs["min_p"] = _rounded(spec.min_p, dtype)
    else:
        attrs["epsilon"] = _rounded(spec.epsilon, dtype)
    if spec.temperature_style == "const":
        attrs["temperature"] = _rounded(spec.temperature, dtype)
    if not spec.warper_top_k:
        return f"top_p_{spec.form}", attrs
    return f"top_k_top_p_{spec.form}", {**attrs, "k": spec.k}


def _nucleus_p(spec: SamplerSpec, dtype: str) -> float:
    """The p a nucleus's composite carries: the program's constant, or, for Hugging Face's torch style, which writes
    1 - p, 1 minus it."""
    return 1 - _rounded(1 - spec.p, dtype) if spec.top_p_style in ("hf", "haiku_logits") else _rounded(spec.p, dtype)


def _scaled_nucleus(spec: SamplerSpec, attrs: dict[str, Any], dtype: str) -> tuple[str, dict[str, Any]]:
    """A nucleus of the scaled logits (transformer_vq's, the classic filter) fuses whole (over all V: a top-k mask
    before it stays in XLA), reading its threshold (transformer_vq's 1 - p; the classic p) and the temperature where
    the program divides by a constant right before it (the site's x / T; a division "before" the sampler is that too,
    unless a top-k mask lies between), else 1 (the scaling outside)."""
    if spec.settings_rows:  # grok-1's: its T and p are operands, its scaling and mask in XLA, its scores at its fill
        fill = _fill(spec.fill, jnp.dtype(dtype))  # (grok's bf16: its finfo.min is bf16's)
        scored = {"scores": True, "fill": fill} if spec.log_prob else {}
        return "top_p_haiku_rows", {**attrs, **scored, "mode": "top_p"}
    p = 1 - _rounded(1 - spec.p, dtype) if spec.top_p_style in ("tvq", "haiku") else _rounded(spec.p, dtype)
    if spec.top_p_style == "levanter":  # its threshold p - 1e-4, one constant after hlofuse-prepare's fold
        p = float(np.float32(spec.p) - np.float32(LEVANTER_TOLERANCE))
    if spec.log_prob:  # the drawn token's log-probability (Levanter's, simply's): the composite gives back its scores
        fill = _fill(spec.fill, jnp.dtype(jnp.float32)) if spec.top_p_style == "simply" else float("-inf")
        attrs = {**attrs, "scores": True, "fill": fill}
    attrs = {**attrs, "mode": "top_p", "p": p}
    if spec.form == "top_k_top_p_mask" and spec.top_p_style == "simply":  # its nucleus of the top k, fused
        attrs = {**attrs, "mode": "top_k+top_p", "k": spec.k}
        if spec.temperature_style in ("const", "before"):
            attrs["temperature"] = _rounded(spec.temperature, dtype)
        return "top_k_top_p_simply_mask", attrs
    nucleus = SCALED_NUCLEI[spec.top_p_style]
    if spec.top_p_style == "jax":
        cuts = spec.jax_cut.split("+")
        if "at_or_above" in cuts:  # `>= p` is `> p'` at the float p' below p in the sampler's dtype
            below = np.nextafter(np.asarray(p, jnp.dtype(dtype)), np.asarray(0, jnp.dtype(dtype)))
            attrs = {**attrs, "p": float(below)}
        nucleus = "top_p_descending_mask" if "descending" in cuts else nucleus
        nucleus = "top_p_unshifted_mask" if "unshifted" in cuts else nucleus
    if spec.form == "top_k_top_p_mask" and spec.top_p_style in ("classic", "jax"):
        # / T, then the top-k mask, then the classic cut: Hugging Face's old top_k_top_p_filtering (a top-k writing:
        # torch.topk's k-th through torchax, lax.top_k's, a stable argsort's), or as JAX code writes it
        # (JAX_CLASSIC_CHAINS: lax.top_k's, a stable argsort's or a sort's column, kept at or above or masked below);
        # another top-k stays in XLA and the nucleus of what it leaves fuses (the scaling before the mask, outside)
        chain = {"classic": "top_k_top_p_shifted_mask", "jax": f"top_k_{nucleus}"}[spec.top_p_style]
        if spec.top_k_style == "sort_keep":
            chain = f"top_k_keep_{nucleus}"
        if spec.top_k_style == "negated_sort" or (spec.top_p_style == "jax" and spec.top_k_style == "torchax"):
            return nucleus, attrs
        attrs = {**attrs, "mode": "top_k+top_p", "k": spec.k}
        if spec.temperature_style in ("const", "before"):
            attrs["temperature"] = _rounded(spec.temperature, dtype)
        return chain, attrs
    if spec.temperature_style == "const" or (spec.temperature_style == "before" and spec.form == "top_p_mask"):
        attrs["temperature"] = _rounded(spec.temperature, dtype)
    return nucleus, attrs


def _rank_space_nucleus(spec: SamplerSpec, attrs: dict[str, Any], dtype: str) -> tuple[str, dict[str, Any]]:
    """A rank-space nucleus fuses whole as its rule's form (over all V: a top-k mask before it stays in XLA), the
    temperature read where the program divides by a constant right before its softmax (a division "before" the
    sampler is that too, unless a top-k mask lies between), else 1 (the scaling outside)."""
    form = RANK_SPACE_TOP_PS[spec.top_p_style]
    attrs = {**attrs, "mode": "top_p", "p": _rounded(spec.p, dtype)}
    divides_first = spec.temperature_style == "before" and spec.form == "top_p_mask"
    if spec.temperature_style == "const" or divides_first:
        attrs["temperature"] = _rounded(spec.temperature, dtype)
    return form, attrs


def _fallback(spec: SamplerSpec, attrs: dict[str, Any], dtype: str) -> tuple[str, dict[str, Any]]:
    """The exact form a writing that is not its form's own fuses as (the draw's suffix aside)."""
    rank_space_p = spec.form in USES_TOP_P and spec.top_p_style in ("gemma", "keras")
    if spec.temperature_style in ("const", "before") and spec.form == "top_k_top_p_mask" and not rank_space_p:
        # The top-k mask in another writing, then the nucleus as written: top_p_mask of the masked logits.
        scale = _rounded(spec.temperature, dtype) if spec.temperature_style == "const" else 1.0
        nucleus = HF_TOP_PS[spec.top_p_style][0] if spec.top_p_style in HF_TOP_PS else "top_p_mask"
        return nucleus, {**attrs, "mode": "top_p", "temperature": scale, "p": _nucleus_p(spec, dtype)}
    if spec.form in _T_LAST and spec.temperature_style == "const" and not rank_space_p:
        return "temperature", {**attrs, "mode": "temperature", "temperature": _rounded(spec.temperature, dtype)}
    return "categorical", {**attrs, "mode": "temperature"}


def _escape_fallback(spec: SamplerSpec, attrs: dict[str, Any], dtype: str) -> tuple[str, dict[str, Any]]:
    """The form a sampler written as its form fuses as when it also returns the value ESCAPES names: its own form
    would take that value inside the composite, so the pass tries the next forms (fuse_sampling.analyze), down to
    the draw of that value (greedy of the probabilities, a categorical of the scaled logits) or of what the filters
    computed past it (as `_fallback`)."""
    if spec.form == "greedy_softmax":
        return "greedy", {**attrs, "mode": "greedy"}
    if spec.form == "temperature":
        return "categorical", {**attrs, "mode": "temperature"}
    return _fallback(spec, attrs, dtype)


# ----- the program -------------------------------------------------------------------------------------


class _Ctx:
    """What the sampler body reads besides the logits: the key, the traced temperature, the spec."""

    def __init__(self, spec: SamplerSpec, args: dict[str, jax.Array]) -> None:
        self.spec = spec
        self.args = args
        self.escaped: list[jax.Array] = []
        self.carried_temperature: jax.Array | None = None  # a decode loop's carried T (enclosure "loop")

    def key(self) -> jax.Array:
        spec, key = self.spec, self.args["key"]
        if spec.key_kind == "typed":
            key = jax.random.wrap_key_data(key)
        if spec.key_op == "split":
            _, key = jax.random.split(key)
        elif spec.key_op == "fold_in":
            key = jax.random.fold_in(key, self.args["step"])
        return key

    def per_row(self, name: str, x: jax.Array) -> jax.Array:
        """A (B,) settings argument with unit dims added up to x's rank, as grok-1 expands its SampleSettings."""
        return jnp.expand_dims(self.args[name], tuple(range(1, x.ndim)))

    def scale(self, x: jax.Array) -> jax.Array:
        style, t = self.spec.temperature_style, self.spec.temperature
        if self.spec.settings_rows:  # grok-1's: / T per row, then its disallowed tokens at -1e10
            y = x / self.per_row("temperatures", x).astype(x.dtype)
            allowed = self.args["allowed"]
            return jnp.where(jnp.expand_dims(allowed, 1) if x.ndim == 3 else allowed, y, -1e10)
        if style == "before":
            return x  # scaled before the sampler (_sampler)
        if style == "reciprocal":
            return x * (1.0 / t)
        if style == "traced":
            return x / self.args["temperature"].astype(x.dtype)
        return x / (t if self.carried_temperature is None else self.carried_temperature)

    def draw(self, x: jax.Array) -> jax.Array:
        """Index of the Gumbel-max of `x` (or of its log-probabilities, per spec.draw) along its last axis."""
        picked = self._pick(x)
        return jnp.squeeze(picked, -1) if self.spec.noise == "keras" and self.spec.draw != "choice" else picked

    def draw_rank(self, values: jax.Array, ids: jax.Array) -> jax.Array:
        """The id of the rank drawn from `values`, mapped back through the candidates' `ids` as spec.take says."""
        if self.spec.noise == "keras" and self.spec.draw != "choice":
            return jnp.squeeze(jnp.take_along_axis(ids, self._pick(values), axis=-1), -1)
        if self.spec.take == "batch_index":
            return ids[jnp.arange(ids.shape[0]), self.draw(values)]
        if self.spec.take == "torch_gather":
            picks = self.draw(values)[..., None].astype(jnp.int32)
            return ids[(_rows(picks.shape), picks)][..., 0]
        return _take(ids, self.draw(values))

    def _stacked(self, rows: list[jax.Array]) -> jax.Array:
        """The rows' (1,) ids stacked: (B, 1) for spec.unit_ids, else squeezed to (B,)."""
        stacked = jnp.array(rows)
        return stacked if self.spec.unit_ids else jnp.squeeze(stacked, 1)

    def multinomial_of_weights(self, weights: jax.Array) -> jax.Array:
        """torch.multinomial(weights, 1) of (B, V) rows through torchax: jax.random.choice per row with the one key, its
        weights as they are; (B, 1) ids for spec.unit_ids, else squeezed."""
        key = self.key()
        return self._stacked([jax.random.choice(key, weights.shape[-1], (1,), replace=False, p=weights[i, :])
                              for i in range(weights.shape[0])])

    def _pick(self, x: jax.Array) -> jax.Array:
        """The draw's ids: (...,), or (..., 1) for keras' categorical; rows drawn as (R / n, n, V) give (R,)."""
        if self.spec.draw_rows:  # the draw's function of the rows, then the categorical of them reshaped
            rows, n = x.shape[0], self.spec.draw_rows
            if self.spec.draw == "log_softmax":
                x = jax.nn.log_softmax(x, axis=-1)
            elif self.spec.draw == "log_of_softmax":
                x = jnp.log(jax.nn.softmax(x, axis=-1))
            drawn = dataclasses.replace(self.spec, draw_rows=0, draw="categorical")
            return _Ctx(drawn, self.args)._pick(x.reshape(rows // n, n, x.shape[-1])).reshape(rows)
        key = self.key()
        if self.spec.draw == "choice":
            probs = jax.nn.softmax(x, axis=-1)
            if x.ndim == 1:  # torch.multinomial of one row (litgpt's `sample`): (1,) ids
                return jax.random.choice(key, x.shape[-1], (1,), replace=False, p=probs)
            rows = [jax.random.choice(key, x.shape[-1], (1,), replace=False, p=probs[i, :]) for i in range(x.shape[0])]
            return self._stacked(rows)
        if self.spec.draw == "inverse_cdf":  # jax.random.choice with replacement: an inverse-CDF draw
            probs = jax.nn.softmax(x, axis=-1)
            if x.ndim == 1:  # one row, its default replace=True: a () id
                return jax.random.choice(key, x.shape[-1], p=probs)
            rows = [jax.random.choice(key, x.shape[-1], (1,), replace=True, p=probs[i, :]) for i in range(x.shape[0])]
            return self._stacked(rows)  # torch.multinomial(replacement=True) through torchax
        if self.spec.draw == "exponential_race":  # any rows (..., V), one key's noise over all of them
            probs = jax.nn.softmax(x, axis=-1)
            return jnp.argmax(probs / jax.random.exponential(key, probs.shape), axis=-1)
        if self.spec.draw == "row_keys":
            return jax.vmap(lambda row_key, row: jax.random.categorical(row_key, row))(
                jax.random.split(key, x.shape[0]), x)
        if self.spec.draw == "log_softmax":
            x = jax.nn.log_softmax(x, axis=-1)
        elif self.spec.draw == "log_of_softmax":
            x = jnp.log(jax.nn.softmax(x, axis=-1))
        if self.spec.noise == "categorical":
            return jax.random.categorical(key, x, axis=-1)
        if self.spec.noise in HAND_NOISES:
            def log(t: jax.Array) -> jax.Array:
                clamped = self.spec.noise == "hand_clamps"
                return jnp.log(jnp.clip(t, min=HAND_NOISE_EPS) if clamped else t + HAND_NOISE_EPS)

            u = jax.random.uniform(key, x.shape)
            if self.spec.noise == "hand_inner_sum":
                return jnp.argmax(x + -jnp.log(-log(u)), axis=-1)
            if self.spec.noise == "hand_unguarded":
                return jnp.argmax(x + -jnp.log(-jnp.log(u)), axis=-1)
            if self.spec.noise == "hand_minus":
                return jnp.argmax(x - log(-log(u)), axis=-1)
            return jnp.argmax(x + -log(-log(u)), axis=-1)
        if self.spec.noise == "keras":
            return jax.random.categorical(key, x[..., None], axis=x.ndim - 1, shape=(*x.shape[:-1], 1))
        g = jax.random.gumbel(key, x.shape, x.dtype)
        return jnp.argmax(x + g if self.spec.noise == "gumbel" else g + x, axis=-1)

    def top_k(self, x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
        if self.spec.take == "torch_gather":  # torch.topk through torchax: lax.top_k sorted again
            values, ids = jax.lax.top_k(x, k)
            values = jnp.sort(values, descending=True)
            return values, jnp.take_along_axis(ids, jnp.argsort(values, axis=-1, descending=True), axis=-1)
        if self.spec.top_k_style == "lax":
            return jax.lax.top_k(x, k)
        if self.spec.top_k_style == "sort":
            ids = jnp.argsort(x, axis=-1, descending=True, stable=True)[..., :k].astype(jnp.int32)
        else:
            ids = jnp.argsort(-x, axis=-1)[..., :k]
        return jnp.take_along_axis(x, ids, axis=-1), ids


def _rows(shape: tuple[int, ...]) -> jax.Array:
    """Each element's row (B, ...) of `shape`, as torchax indexes a gather or scatter along dim 1."""
    return jnp.broadcast_to(jnp.arange(shape[0]).reshape(shape[0], 1), shape)


def _take(ids: jax.Array, position: jax.Array) -> jax.Array:
    return jnp.take_along_axis(ids, position[..., None].astype(jnp.int32), axis=-1)[..., 0]


def _torch_kth(x: jax.Array, k: int) -> jax.Array:
    """`torch.topk(x, k)[0][..., -1, None]` as torchax lowers it: lax.top_k's values sorted again, the last kept
    as a column."""
    return jnp.sort(jax.lax.top_k(x, k)[0], axis=-1, descending=True)[..., -1][..., None]


def _kth_mask(c: _Ctx, x: jax.Array) -> jax.Array:
    if c.spec.top_k_style == "sort_keep":
        kth = jnp.sort(x, axis=-1)[..., -c.spec.k][..., None]
        return jnp.where(x >= kth, x, _fill(c.spec.fill, x.dtype))
    if c.spec.top_k_style == "sort_below":
        ordered = jnp.sort(x, axis=-1)
        kth = ordered[..., -c.spec.k:][..., :1] if c.spec.k % 2 == 0 else ordered[..., -c.spec.k][..., None]
        return jnp.where(x < kth, _fill(c.spec.fill, x.dtype), x)
    if c.spec.top_k_style == "torchax":
        kth = _torch_kth(x, c.spec.k)
    else:
        kth = c.top_k(x, c.spec.k)[0][..., -1:]
    fill = _fill(c.spec.fill, x.dtype) if c.spec.form == "top_k_mask" else NEG_INF  # (top_k_top_p_mask: the nucleus's)
    return jnp.where(x < kth, fill, x)


def _fill(name: str, dtype: jnp.dtype) -> float:
    """The value the spec's fill names, for logits of `dtype`."""
    return {"-inf": NEG_INF, "finfo_min": float(jnp.finfo(dtype).min), "-1e7": -1e7, "-1000": -1000.0}[name]


def _classic_cut(x: jax.Array, p: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The classic top-p's start as torchax lowers it (Megatron's and x-transformers' alike): torch.sort(descending)
    (jnp.sort and jnp.argsort, unstable, each reversed) and `cumsum(softmax(sorted)) > p`, not yet shifted."""
    ordered = jnp.sort(x, axis=-1, stable=False)[..., ::-1]
    ids = jnp.argsort(x, axis=-1, stable=False)[..., ::-1]
    return ordered, ids, jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1) > p


def _jax_classic_writing(p: float) -> tuple[str, str, str]:
    """The order, shift and put-back writings of the jax style's classic top-p, picked by p."""
    pick = round(p * 1000)
    return (("slice", "flip")[pick % 2], ("roll", "concatenate", "pad")[pick % 3],
            ("mask_take", "mask_sort_key_val", "logits_take", "logits_scatter")[(pick // 6) % 4])


def jax_classic_removal(x: jax.Array, p: float, order_how: str, shift_how: str,
                        cut: str = "") -> tuple[jax.Array, ...]:
    """The classic top-p's removal in rank order as JAX engines write it, of (..., V) x: the order
    `argsort(x)[..., ::-1]` ("slice") or `jnp.flip(argsort(x))` ("flip"), the logits taken along it,
    `cumsum(softmax) > p` shifted a place later by `jnp.roll(...).at[..., 0].set(False)` ("roll"), a concatenate of
    False or `jnp.pad`. `cut` (JAX_CUTS, "+"-joined) varies it: "sorted_apart", the logits sorted by `jnp.sort(x)[...,
    ::-1]` beside the argsort; "descending", the order `argsort(x, descending=True)` (ties the other way);
    "at_or_above", the removal `>= p`; "slice_first", the cumsum sliced before its compare (a concatenate or a pad);
    "unshifted", the removal as it is (not shifted). Returns (removed, the sorted logits, the order)."""
    cuts = cut.split("+")
    if "descending" in cuts:
        order = jnp.argsort(x, axis=-1, descending=True)
    elif order_how == "flip":
        order = jnp.flip(jnp.argsort(x, axis=-1), axis=-1)
    else:
        order = jnp.argsort(x, axis=-1)[..., ::-1]
    if "sorted_apart" in cuts and "descending" not in cuts:
        ordered = jnp.sort(x, axis=-1)[..., ::-1]
    else:
        ordered = jnp.take_along_axis(x, order, axis=-1)
    cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)

    def removed(c: jax.Array) -> jax.Array:
        return c >= p if "at_or_above" in cuts else c > p

    if "unshifted" in cuts:
        return removed(cumulative), ordered, order
    if shift_how == "roll":
        return jnp.roll(removed(cumulative), 1, axis=-1).at[..., 0].set(False), ordered, order
    kept_part = removed(cumulative[..., :-1]) if "slice_first" in cuts else removed(cumulative)[..., :-1]
    if shift_how == "concatenate":
        first = jnp.zeros((*x.shape[:-1], 1), dtype=bool)
        return jnp.concatenate([first, kept_part], axis=-1), ordered, order
    return jnp.pad(kept_part, [(0, 0)] * (x.ndim - 1) + [(1, 0)]), ordered, order


def _rows_of(x: jax.Array) -> tuple[jax.Array, ...]:
    """The index of each row of (..., V) x, for a scatter along its last dim: (rows, ) of (B, V), none of (V,)."""
    return tuple(jnp.arange(n).reshape([-1 if d == i else 1 for d in range(x.ndim)])
                 for i, n in enumerate(x.shape[:-1]))


def jax_put_back(order: jax.Array, values: jax.Array, how: str) -> jax.Array:
    """(..., V) values listed in the order's places, back in id order as JAX engines write it: a take along the
    order's argsort ("take"), a scatter to the order's places ("scatter"), or `lax.sort_key_val` ("sort_key_val")."""
    if how == "take":
        return jnp.take_along_axis(values, jnp.argsort(order, axis=-1), axis=-1)
    if how == "scatter":
        return jnp.zeros_like(values).at[(*_rows_of(values), order)].set(values)
    return jax.lax.sort_key_val(order, values, dimension=-1)[1]


def _jax_classic_kept(x: jax.Array, p: float, cut: str = "") -> jax.Array:
    """The jax style: the classic top-p of x as a JAX engine writes it (`_jax_classic_writing`, varied by `cut`), the
    dropped at -inf."""
    order_how, shift_how, back_how = _jax_classic_writing(p)
    remove, ordered, order = jax_classic_removal(x, p, order_how, shift_how, cut)
    if back_how == "logits_take":
        return jax_put_back(order, jnp.where(remove, NEG_INF, ordered), "take")
    if back_how == "logits_scatter":  # (into -inf: every place is set either way)
        return jnp.full_like(x, NEG_INF).at[(*_rows_of(x), order)].set(jnp.where(remove, NEG_INF, ordered))
    return jnp.where(jax_put_back(order, remove, back_how.removeprefix("mask_")), NEG_INF, x)


def _hf_nucleus_mask(c: _Ctx, x: jax.Array) -> jax.Array:
    """hf / flax / mtj styles: Hugging Face's top-p warpers, torch's through torchax or Flax's, the dropped at -inf;
    mesh-transformer-jax's, 1e10 below."""
    if c.spec.top_p_style == "hf":
        ordered, ids = jnp.sort(x, axis=-1, stable=False), jnp.argsort(x, axis=-1, stable=False)
        cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
        remove = (cumulative <= 1 - c.spec.p).astype(jnp.int32)
        remove = remove.at[..., -1:].set(jnp.zeros((*x.shape[:-1], 1), jnp.int32)) != 0
        if x.ndim == 1:  # litgpt's `sample_top_p` of one row: scattered back along dim 0
            kept = jnp.where(remove.at[ids].set(remove[0:x.shape[0]]), NEG_INF, x)
        else:
            batch, vocab = x.shape
            kept = jnp.where(remove.at[(_rows((batch, vocab)), ids)].set(remove[0:batch, 0:vocab]), NEG_INF, x)
    elif c.spec.top_p_style == "tvq":
        vocab = x.shape[-1]
        probs = jax.nn.softmax(x, axis=-1)
        cumulative = jnp.cumsum(jnp.sort(probs, axis=-1), axis=-1)
        last = jnp.equal(jnp.arange(vocab), jnp.full(fill_value=vocab - 1, shape=[vocab]))
        mask = jnp.logical_or(cumulative > 1 - c.spec.p, last).astype(jnp.int32)
        mask = jnp.take_along_axis(mask, jnp.argsort(jnp.argsort(probs, axis=-1), axis=-1), axis=-1)
        kept = x * mask - 1e10 * (1 - mask)
    elif c.spec.top_p_style == "classic":
        ordered, ids, remove = _classic_cut(x, c.spec.p)
        remove = remove.at[:, 1:].set(remove[:, :-1])
        remove = remove.astype(jnp.int32).at[..., 0].set(jnp.zeros(x.shape[:-1], jnp.int32)) != 0
        batch, vocab = x.shape
        kept = jnp.where(remove.at[(_rows((batch, vocab)), ids)].set(remove[0:batch, 0:vocab]), NEG_INF, x)
    elif c.spec.top_p_style == "jax":
        kept = _jax_classic_kept(x, c.spec.p, c.spec.jax_cut)
    elif c.spec.top_p_style == "xt":
        ordered, ids, remove = _classic_cut(x, c.spec.p)
        remove = jnp.pad(remove[:, :-1], ((0, 0), (1, 0)), constant_values=False)
        ordered = jnp.where(remove, NEG_INF, ordered)
        kept = ordered.at[(_rows(x.shape), ids)].set(ordered)
    elif c.spec.top_p_style == "levanter":
        order = jnp.argsort(x, axis=-1)[..., ::-1]
        ordered = jnp.take_along_axis(x, order, axis=-1)
        cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
        threshold = jnp.clip(jnp.asarray(c.spec.p, dtype=jnp.float32), min=0.0, max=1.0)[..., None]
        keep = cumulative < threshold - jnp.asarray(LEVANTER_TOLERANCE, dtype=cumulative.dtype)
        keep = jnp.concatenate([jnp.ones_like(keep[..., :1], dtype=bool), keep[..., :-1]], axis=-1)
        kept = jnp.take_along_axis(jnp.where(keep, ordered, NEG_INF), jnp.argsort(order, axis=-1), axis=-1)
    elif c.spec.top_p_style in HAIKU_TOP_PS:
        ordered = jax.lax.sort(x, is_stable=False)
        cumulative = jnp.cumsum(jax.nn.softmax(ordered), -1)
        top_p = c.per_row("top_ps", x).astype(x.dtype) if c.spec.settings_rows else c.spec.p
        cut = jnp.argmax(cumulative >= 1 - top_p, axis=-1)
        kept = jnp.where(x >= jnp.take_along_axis(ordered, cut[..., jnp.newaxis], axis=-1), x,
                         _fill(c.spec.fill, x.dtype))
    elif c.spec.top_p_style == "simply" and c.spec.form == "top_k_top_p_mask":  # its `_fused_top_k_top_p_mask`
        values, ids = jax.lax.top_k(x, max(min(c.spec.k, x.shape[-1]), 1))
        cumulative = jnp.cumulative_sum(jax.nn.softmax(values, axis=-1), axis=-1, include_initial=True)
        picked = jax.nn.one_hot(ids, x.shape[-1], dtype=jnp.bool_) & (cumulative[..., :-1] < c.spec.p)[..., None]
        kept = jnp.where(jnp.any(picked, axis=-2), x, _fill(c.spec.fill, x.dtype))
    elif c.spec.top_p_style == "simply":  # its `top_p_mask`, then MaskedCategorical's fill
        order = jnp.argsort(x, axis=-1, descending=True)
        cumulative = jnp.cumulative_sum(jnp.take_along_axis(jax.nn.softmax(x, axis=-1), order, axis=-1), axis=-1,
                                        include_initial=True)
        keep = jax.lax.sort_key_val(order, cumulative[..., :-1] < c.spec.p, dimension=-1)[1]
        kept = jnp.where(keep, x, _fill(c.spec.fill, x.dtype))
    elif c.spec.top_p_style == "mtj":
        ordered, ids = jnp.sort(x)[:, ::-1], jnp.argsort(x)[:, ::-1]
        cumulative = jnp.cumsum(jax.nn.softmax(ordered), axis=-1)
        remove = cumulative > c.spec.p
        remove = jnp.concatenate((jnp.zeros_like(remove[:, :1]), remove), axis=-1)[:, :-1]
        kept = x - 1e10 * jax.lax.sort_key_val(ids, remove)[1]
    else:
        batch, vocab = x.shape
        ordered, ids = jax.lax.top_k(x, vocab)
        cumulative = jax.nn.softmax(ordered, axis=-1).cumsum(axis=-1)
        keep = jnp.roll(cumulative < c.spec.p, 1)
        keep |= keep.at[:, 0].set(True)
        keep = keep.at[:, :1].set(True)
        kept = jax.lax.sort_key_val(ids, jnp.where(keep, ordered, jnp.full_like(x, NEG_INF)))[-1]
    if c.spec.escape:
        c.escaped.append(cumulative)
    return kept


def _nucleus_mask(c: _Ctx, x: jax.Array) -> jax.Array:
    """sort / top_k styles: logits below the cutoff logit become -inf."""
    if c.spec.top_p_style == "sort":
        ordered = jnp.sort(x, axis=-1)[..., ::-1]
    else:
        ordered = jax.lax.top_k(x, x.shape[-1])[0]
    cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
    if c.spec.escape:
        c.escaped.append(cumulative)
    cutoff = jnp.take_along_axis(ordered, jnp.sum(cumulative < c.spec.p, axis=-1, keepdims=True), axis=-1)
    return jnp.where(x < cutoff, _fill(c.spec.fill, x.dtype), x)


def _rank_space_top_p(c: _Ctx, x: jax.Array) -> jax.Array:
    """gemma / keras styles: probabilities sorted (a full-width top-k in the spec's style: lax.top_k, a stable
    descending argsort, or argsort(-probs), each a writing of the sort for probabilities), the tail dropped, drawn in
    rank space."""
    probs = jax.nn.softmax(c.scale(x), axis=-1)
    ordered, ids = c.top_k(probs, probs.shape[-1])
    cumulative = jnp.cumsum(ordered, axis=-1)
    if c.spec.top_p_style == "gemma":
        kept = jnp.where(cumulative - ordered > c.spec.p, 0.0, ordered)
        kept = kept / jnp.sum(kept, axis=-1, keepdims=True)
    else:
        keep = cumulative <= c.spec.p
        keep = jnp.concatenate([jnp.ones_like(keep[..., :1]), keep[..., :-1]], axis=-1)
        kept = jnp.where(keep, ordered, jnp.zeros_like(ordered))
    return c.draw_rank(jnp.log(kept), ids)


def _torch_topk_ids(x: jax.Array, k: int) -> jax.Array:
    """`torch.topk(x, k).indices` as torchax lowers it: lax.top_k's ids taken in the order of its values sorted
    again."""
    values, ids = jax.lax.top_k(x, k)
    values = jnp.sort(values, descending=True)
    return jnp.take_along_axis(ids, jnp.argsort(values, axis=-1, descending=True), axis=-1)


def _scatter_rows(target: jax.Array, ids: jax.Array, values: jax.Array) -> jax.Array:
    """`target.scatter(1, ids, values)` as torchax indexes it."""
    return target.at[(_rows(ids.shape), ids)].set(values)


def _hf_min_p_removal(c: _Ctx, y: jax.Array) -> jax.Array:
    probs = jax.nn.softmax(y, axis=-1)
    remove = probs < c.spec.min_p * jnp.max(probs, axis=-1, keepdims=True)
    if c.spec.min_p_keep == "topk":
        return _scatter_rows(remove, _torch_topk_ids(probs, 1), jnp.zeros((y.shape[0], 1), jnp.bool_))
    order = jnp.argsort(y, axis=-1, stable=False)[..., ::-1]
    in_order = remove[(_rows(y.shape), order)].at[..., :1].set(jnp.zeros((y.shape[0], 1), jnp.bool_))
    return _scatter_rows(in_order, order, in_order[0:y.shape[0], 0:y.shape[1]])


def _hf_typical_removal(c: _Ctx, y: jax.Array) -> jax.Array:
    batch, vocab = y.shape
    normalized = jax.nn.log_softmax(y, axis=-1)
    product = normalized * jnp.exp(normalized)
    entropy = -1.0 * jnp.sum(jnp.where(jnp.isnan(product), 0, product), axis=-1, keepdims=True)  # nansum
    scores = jnp.abs(-1.0 * normalized - entropy * 1.0)
    ordered, order = jnp.sort(scores, axis=-1, stable=False), jnp.argsort(scores, axis=-1, stable=False)
    cumulative = jnp.cumsum(jax.nn.softmax(y[(_rows((batch, vocab)), order)], axis=-1), axis=1)
    last = jnp.clip(jnp.sum(cumulative < c.spec.p, axis=1), max=vocab - 1).reshape(-1, 1)
    remove = ordered > ordered[(_rows(last.shape), last)]
    remove = remove.astype(jnp.int32).at[..., :1].set(jnp.zeros((batch, 1), jnp.int32)) != 0
    return _scatter_rows(remove, order, remove[0:batch, 0:vocab])


def _hf_warper_chain(c: _Ctx, x: jax.Array) -> jax.Array:
    """Hugging Face's TemperatureLogitsWarper, [TopKLogitsWarper,] then the spec's warper, the removed at -inf."""
    y = c.scale(x)
    if c.spec.warper_top_k:
        y = jnp.where(y < _torch_kth(y, c.spec.k), NEG_INF, y)
    if c.spec.warper_top_p:
        y = _hf_nucleus_mask(c, y)
    if c.spec.form == "min_p_removal":
        remove = _hf_min_p_removal(c, y)
    elif c.spec.form == "epsilon_removal":
        remove = (jax.nn.softmax(y, axis=-1) < c.spec.epsilon) & (y < _torch_kth(y, 1))
    else:
        remove = _hf_typical_removal(c, y)
    return c.draw(jnp.where(remove, NEG_INF, y))


def _largest_float_not_meeting(lead: tuple[int, ...], predicate: Callable[[jax.Array], jax.Array],
                               sign: str) -> jax.Array:
    """T5X's bisection: per element of `lead`, the largest finite float32 with `predicate` False, over int32 bit
    patterns in float order (the non-sign bits of a negative flipped), the sign bit first, then 31 bits in a
    fori_loop; non-finite patterns answer False below every finite one and True above."""
    exponent = jnp.int32((1 << 31) - (1 << 23))  # closed over by the loop body (a loop operand), as T5X writes it

    def in_float_order(bits: jax.Array) -> jax.Array:
        return bits ^ jnp.where(bits < 0, jnp.int32((1 << 31) - 1), jnp.int32(0))

    def on_bits(bits: jax.Array) -> jax.Array:
        pattern = in_float_order(bits)
        finite = (pattern & exponent) != exponent
        return jnp.where(finite, predicate(jax.lax.bitcast_convert_type(pattern, jnp.float32)), pattern >= 0)

    found = jnp.zeros(lead, jnp.int32)
    if sign == "axlearn":
        found = found | jnp.where(on_bits(found), jnp.int32(-(1 << 31)), jnp.int32(0))
    else:
        found = found | jnp.where(on_bits(found), jnp.uint32(1 << 31), jnp.uint32(0))
    found = jax.lax.fori_loop(0, 31, lambda i, f: f | jnp.where(on_bits(f | jnp.int32(1 << 30 - i)), jnp.int32(0),
                                                                  jnp.int32(1 << 30 - i)), found)
    return jax.lax.bitcast_convert_type(in_float_order(found), jnp.float32)


SEARCH_FILLS = {"-inf": NEG_INF, "finfo_min": float(jnp.finfo(jnp.float32).min), "-1e7": -1e7}


def _searched_filters(c: _Ctx, x: jax.Array) -> jax.Array:
    """The searched top-k and top-p (axlearn's chain: scale, top-k, top-p), reductions over the vocabulary moved next
    to last as the libraries do, the dropped at the spec's fill as T5X writes it (`jnp.full_like(x, replace_val)`)."""
    spec = c.spec
    fill = SEARCH_FILLS[spec.fill]
    y = c.scale(x)
    if spec.form in USES_TOP_K:
        rows = jnp.swapaxes(y, -1, -2)
        found = _largest_float_not_meeting(
            y.shape[:-1], lambda t: jnp.sum(rows > jnp.expand_dims(-t, -2), axis=-2) >= spec.k, spec.search_sign)
        cutoff = -1 * found if spec.search_sign == "axlearn" else -found
        y = jnp.where(y >= jnp.expand_dims(cutoff, -1), y, jnp.full_like(y, fill))
    if spec.form in USES_TOP_P:
        probs = jax.nn.softmax(y, axis=-1)
        rows = jnp.swapaxes(probs, -1, -2)
        threshold = _largest_float_not_meeting(
            y.shape[:-1], lambda t: jnp.sum(jnp.where(rows >= jnp.expand_dims(t, -2), rows, 0.0), axis=-2) < spec.p,
            spec.search_sign)
        y = jnp.where(probs >= jnp.expand_dims(threshold, -1), y, jnp.full_like(y, fill))
    return y


def _sampler(c: _Ctx, x: jax.Array) -> jax.Array:
    form, spec = c.spec.form, c.spec
    if spec.prelude:
        x = jax.nn.log_softmax(x, axis=-1)
    if spec.temperature_style == "before":
        x = x / spec.temperature
    if spec.search_sign:
        scores = _searched_filters(c, x)
        ids = c.draw(scores)
        if spec.log_prob:
            c.escaped.append(jnp.take_along_axis(jax.nn.log_softmax(scores, axis=-1), ids[..., None], axis=-1))
        return ids
    if form == "greedy":
        return jnp.argmax(x, axis=-1)
    if form == "greedy_softmax":
        probs = jax.nn.softmax(x, axis=-1)
        if spec.escape:
            c.escaped.append(probs)
        return jnp.argmax(probs, axis=-1)
    if form == "categorical":
        return c.draw(x)
    if form in ("min_p_logits", "top_a_logits"):  # the probabilities of the logits themselves, below min_p times the
        probs = jax.nn.softmax(x, axis=-1)  # largest (its square, for top-a) at -inf
        largest = jnp.max(probs, axis=-1, keepdims=True)
        if form == "min_p_logits":
            limit = spec.min_p * largest
        else:
            limit = SQUARES[spec.square](largest) * spec.min_p
        return c.draw(c.scale(jnp.where(probs < limit, NEG_INF, x)))
    if form == "min_p_log":
        y = c.scale(x)
        top = jnp.max(y, axis=-1) if y.ndim == 1 else jnp.max(y, axis=-1, keepdims=True)
        log = math.log if spec.min_p_log == "constant" else jnp.log
        return c.draw(jnp.where(y >= top + log(spec.min_p), y, NEG_INF))
    if form == "top_k_of_probs":
        values, ids = c.top_k(jax.nn.softmax(c.scale(x), axis=-1), spec.k)
        return c.draw_rank(jnp.log(values), ids)
    if form == "probs_weights":
        return c.multinomial_of_weights(_weights(spec, jax.nn.softmax(c.scale(x), axis=-1)))
    if form in HF_WARPERS:
        return _hf_warper_chain(c, x)
    if form == "temperature":
        scaled = c.scale(x)
        if spec.escape:
            c.escaped.append(scaled)
        return c.draw(scaled)
    if form == "top_k":
        values, ids = c.top_k(x, spec.k)
        return c.draw_rank(c.scale(values), ids)
    if form == "temperature_top_k":
        values, ids = c.top_k(c.scale(x), spec.k)
        return c.draw_rank(values, ids)
    if form == "top_k_mask":
        return c.draw(c.scale(_kth_mask(c, x)))
    if form in USES_TOP_P:
        if form == "top_k_top_p_mask" and spec.top_p_style not in ("classic", "jax", "simply"):  # (simply's: fused)
            x = _kth_mask(c, x)
        if spec.top_p_style in ("gemma", "keras"):
            return _rank_space_top_p(c, x)
        if spec.top_p_style in SCALED_NUCLEI:  # the nucleus of the scaled logits
            y = c.scale(x)
            if form == "top_k_top_p_mask" and spec.top_p_style in ("classic", "jax"):  # / T first (the old
                y = _kth_mask(c, y)  # top_k_top_p_filtering, and JAX code)
            scores = _hf_nucleus_mask(c, y)
            ids = c.draw(scores)
            if spec.log_prob:  # Levanter's and simply's: the drawn token's filtered logit minus their logsumexp
                picked = jnp.take_along_axis(scores, ids[..., None].astype(jnp.int32), axis=-1)[..., 0]
                c.escaped.append(picked - jax.nn.logsumexp(scores, axis=-1))
            return ids
        if spec.top_p_style in HF_TOP_PS:
            return c.draw(c.scale(_hf_nucleus_mask(c, x)))
        return c.draw(c.scale(_nucleus_mask(c, x)))
    assert form == "min_p", form
    scaled = c.scale(x)
    probs = jax.nn.softmax(scaled, axis=-1)
    if spec.escape:
        c.escaped.append(probs)
    keep = probs >= spec.min_p * jnp.max(probs, axis=-1, keepdims=True)
    return c.draw(jnp.where(keep, scaled, NEG_INF))


def _weights(spec: SamplerSpec, probs: jax.Array) -> jax.Array:
    """probs_weights' filter of the probabilities as torch code writes it, renormalised where spec.renormalize."""
    if spec.weights_filter == "min_p":
        kept = jnp.where(probs < spec.min_p * jnp.max(probs, axis=-1, keepdims=True), jnp.zeros_like(probs), probs)
    else:
        kept = probs * (probs >= jax.lax.top_k(probs, spec.k)[0][..., -1:]).astype(probs.dtype)
    return kept / jnp.sum(kept, axis=-1, keepdims=True) if spec.renormalize else kept


def _enclosed(c: _Ctx, x: jax.Array) -> jax.Array:
    """The sampler's token ids, drawn where spec.enclosure says: in the body, in a lax.cond's second branch (the first
    gives zeros, taken only for a NaN first logit), or in a two-step decode loop carrying the temperature."""
    def sample() -> jax.Array:
        return _sampler(c, x).astype(jnp.int32)

    enclosure = c.spec.enclosure
    if not enclosure:
        return sample()
    ids = jax.eval_shape(sample)
    zeros = jnp.zeros(ids.shape, ids.dtype)
    if enclosure == "cond":
        return jax.lax.cond(jnp.isnan(x.reshape(-1)[0]), lambda: zeros, sample)
    assert enclosure == "loop", enclosure

    def step(_: jax.Array, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        _, temperature = carry
        c.carried_temperature = temperature
        return sample(), temperature

    temperature = jnp.array(c.spec.temperature, x.dtype)
    return jax.lax.fori_loop(0, 2, step, (zeros, temperature))[0]


def one_row(spec: SamplerSpec) -> SamplerSpec:
    """The sampler of one sequence that a `per_sequence` spec vmaps over its rows."""
    return dataclasses.replace(spec, batch="v", per_sequence="")


def _per_sequence(spec: SamplerSpec, args: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """The one-row sampler vmapped over the rows of x (B, V), with a key split per row or the one key."""
    def sample(row: jax.Array, key: jax.Array) -> jax.Array:
        return _enclosed(_Ctx(one_row(spec), {**args, "key": key}), row)

    if spec.per_sequence == "row_keys":
        return jax.vmap(sample)(x, jax.random.split(args["key"], x.shape[0]))
    return jax.vmap(sample, in_axes=(0, None))(x, args["key"])


def build(spec: SamplerSpec) -> tuple[Callable[..., Any], list[jax.ShapeDtypeStruct]]:
    """The program of `spec`: (logits, [key], [temperature], [step], [index]) -> (token ids, *extras)."""

    def program(*flat: jax.Array) -> tuple[jax.Array, ...]:
        args = dict(zip(spec.arg_names, flat, strict=True))
        logits = args["logits"]
        x = logits[:, -1, :] if spec.batch == "bt" else logits
        if spec.upcast:
            x = x.astype(jnp.float32)
        c = _Ctx(spec, args)
        token = _per_sequence(spec, args, x) if spec.per_sequence else _enclosed(c, x)
        outs: list[jax.Array] = [token, *c.escaped]
        if "logits" in spec.extras:
            outs.append(logits)
        if "logprobs" in spec.extras:
            outs.append(jnp.take_along_axis(jax.nn.log_softmax(x, axis=-1), token.reshape((*x.shape[:-1], 1)),
                                            axis=-1))
        if "take" in spec.extras:
            index = args["index"].reshape((*x.shape[:-1], 1))
            outs.append(jnp.take_along_axis(x, index, axis=-1))
        if "iota" in spec.extras:
            outs.append(jnp.where(x > 0, jnp.arange(x.shape[-1], dtype=jnp.int32), -1))
        return tuple(outs)

    return program, arg_specs(spec)


def logits_cases(spec: SamplerSpec, seed: int = 0) -> dict[str, np.ndarray]:
    """Logit distributions that stress the filters and the tie rules (as test_fuse_sampling_e2e's)."""
    shape = spec.logits_shape
    rng = np.random.default_rng(seed)
    normal = rng.standard_normal(shape).astype(np.float32)
    ties = np.round(normal * 2.0) / 2.0
    with_inf = normal.copy()
    with_inf[..., rng.random(shape[-1]) < 0.3] = -np.inf
    cases = {"normal": normal, "peaked": normal * 6.0, "ties": ties, "neg_inf": with_inf}
    return {name: x.astype(np_dtype(spec.dtype)) for name, x in cases.items()}
