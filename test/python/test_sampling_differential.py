"""Differential test: hypothesis writes random token samplers; each must fuse where it should, and draw the
same tokens as the original.

Every generated program (sampling_programs.SamplerSpec, drawn by `sampler_specs`) is lowered with jax.jit
and run through the default pipeline twice: without a target (the composite stays; XLA inlines its
decomposition) and with target=cpu (the native kernel takes the composites it supports). The untargeted
module must hold exactly the composite `sampling_programs.expected` names, with its attributes (where an interior
value escapes, the smaller form the pass falls back to, with a remark saying why). Then the original, the fused
module, the fused module lowered to the reference form rebuilt from the attributes alone
(`hlofuse-lower-kernels{target=reference}`) and the cpu-targeted module run on several logit distributions
(normal, peaked, ties, -inf entries) and keys: token ids, and every other output, must be EQUAL.

Profiles: HYPOTHESIS_PROFILE=ci (default, a few dozen programs, under a minute on two cores) or
=thorough (hundreds). Examples are derandomized, so CI always runs the same programs.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import hypothesis.strategies as st
import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import given as hypothesis_given
from jaxlib.mlir import ir
from sampling_programs import (
    BATCHES,
    DRAWS,
    ESCAPES,
    EXTRAS,
    F32_ANY_SHAPE_TOP_PS,
    FILLS,
    FORMS,
    HAND_NOISES,
    HF_TOP_PS,
    HF_WARPERS,
    JAX_CUTS,
    KEY_KINDS,
    KEY_OPS,
    LIBRARY_FILTERS,
    MASK_TOP_KS,
    MIN_P_KEEPS,
    MIN_P_LOGS,
    NOISES,
    PER_SEQUENCE,
    RANK_SPACE_TOP_KS,
    READS_T,
    SCALED_BEFORE,
    SEARCH_SIGNS,
    SEARCHED,
    SORT_COLUMN_TOP_KS,
    SQUARES,
    STOCHASTIC,
    TAKES,
    TEMPERATURES,
    TOP_KS,
    TOP_PS,
    USES_TOP_K,
    USES_TOP_P,
    WEIGHTS_FILTERS,
    SamplerSpec,
    build,
    expected,
    inputs,
    logits_cases,
    writes_form_exactly,
)
from test_fuse_sampling_e2e import compile_module

from hlofuse.kernels.sampling_reference import (
    mask_top_k,
    same_column,
    sort_column,
    top_k_by_argsort,
    top_k_of_probs_by_negated_argsort,
)
from hlofuse.pipeline import run_pipeline
from hlofuse.testing.modules import clone_module, count_composites, sample_attrs

_COMMON = {"deadline": None, "derandomize": True, "suppress_health_check": [HealthCheck.too_slow],
           "print_blob": True}
# ci: 16 examples over the families (5-6 each). An example lowers its sites' templates at its own shapes and
# compiles four programs: the families took 571 s of test time with 24 (a loaded run), 184 s with 16 in a clean-clone
# CI run. `thorough` is for runs by hand.
settings.register_profile("ci", max_examples=16, **_COMMON)
settings.register_profile("thorough", max_examples=300, **_COMMON)
PROFILE = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
KEYS = 3
REFERENCE = "builtin.module(hlofuse-lower-kernels{target=reference})"


# ----- the strategy ------------------------------------------------------------------------------------


@st.composite
def sampler_specs(draw: st.DrawFn, forms: tuple[str, ...] = FORMS) -> SamplerSpec:
    """Any sampler program, as libraries write them, over small sizes."""
    form = draw(st.sampled_from(forms))
    stochastic = form in STOCHASTIC
    vocab = draw(st.sampled_from([16, 64, 100]))
    dtype = draw(st.sampled_from(["float32", "bfloat16"]))
    spec = SamplerSpec(
        form=form, vocab=vocab, batch=draw(st.sampled_from(BATCHES)), rows=draw(st.integers(1, 3)),
        steps=draw(st.integers(1, 3)), dtype=dtype, upcast=dtype != "float32" and draw(st.booleans()),
        temperature=draw(st.sampled_from([0.5, 0.7, 1.0, 1.3])),
        temperature_style=draw(st.sampled_from(TEMPERATURES + ("before",) * (form in SCALED_BEFORE)))
        if form in READS_T else "const",
        k=draw(st.sampled_from([1, 3, 8])),
        top_k_style=draw(st.sampled_from(MASK_TOP_KS if form in ("top_k_mask", "top_k_top_p_mask") else TOP_KS))
        if form in USES_TOP_K else "lax",
        p=draw(st.sampled_from([0.5, 0.9])),
        top_p_style=draw(st.sampled_from(TOP_PS)) if form in USES_TOP_P else "sort",
        fill=draw(st.sampled_from(FILLS if form == "top_p_mask" else FILLS[:3]))
        if form in (*USES_TOP_P, "top_k_mask") else "-inf",
        min_p=draw(st.sampled_from([0.05, 0.2])),
        key_kind=draw(st.sampled_from(KEY_KINDS)) if stochastic else "raw",
        key_op=draw(st.sampled_from(KEY_OPS)) if stochastic else "none",
        noise=draw(st.sampled_from(NOISES)) if stochastic else "categorical",
        extras=tuple(e for e in EXTRAS if draw(st.integers(0, 3)) == 0),
    )
    if form == "top_k_mask" and draw(st.integers(0, 3)) == 0:  # by a sort's column (kept at or above it: (B, V))
        style = draw(st.sampled_from(sorted(SORT_COLUMN_TOP_KS)))
        spec = dataclasses.replace(spec, top_k_style=style, batch="b" if style == "sort_keep" else spec.batch)
    if form in HF_WARPERS:  # (B, V) logits, as Hugging Face writes them
        spec = dataclasses.replace(spec, batch=draw(st.sampled_from(["b", "bt"])), warper_top_k=draw(st.booleans()),
                                   min_p_keep=draw(st.sampled_from(MIN_P_KEEPS)),
                                   epsilon=draw(st.sampled_from([0.01, 0.03])))
        if (form == "min_p_removal" and spec.min_p_keep == "topk") or form == "epsilon_removal":
            spec = dataclasses.replace(spec, warper_top_p=draw(st.booleans()), top_p_style="hf")
    rank_space_p = form in USES_TOP_P and spec.top_p_style in ("gemma", "keras")
    if form in USES_TOP_P and spec.top_p_style in F32_ANY_SHAPE_TOP_PS:  # any logits, upcast to f32, a large fill
        fill = "-1e7" if spec.fill == "-1000" else spec.fill
        spec = dataclasses.replace(spec, upcast=spec.dtype != "float32", fill=fill)
    # grok-1's sample_token: T, p and a mask of allowed tokens per row, drawn with one key or a key per row (vmapped)
    if form == "top_p_mask" and spec.top_p_style == "haiku" and draw(st.integers(0, 2)) == 0:
        spec = dataclasses.replace(spec, settings_rows=True, batch=draw(st.sampled_from(["b", "b1"])),
                                   temperature_style="const", noise=draw(st.sampled_from(["categorical", "gumbel"])),
                                   upcast=spec.upcast and draw(st.booleans()))  # (grok's logits are bf16)
        if draw(st.booleans()):
            spec = dataclasses.replace(spec, draw="row_keys", noise="categorical")
    elif form in USES_TOP_P and spec.top_p_style in HF_TOP_PS:  # (B, V) logits and -inf, as Hugging Face writes them
        # one row: litgpt's `sample_top_p`, and JAX engines' `sample_top_p` at batch 1
        one_row = ["v"] * (spec.top_p_style in ("hf", "jax"))
        spec = dataclasses.replace(spec, batch=draw(st.sampled_from(["b", "bt", *one_row])), fill="-inf")
        if spec.top_p_style == "jax":
            spec = dataclasses.replace(spec, jax_cut=draw(st.sampled_from(JAX_CUTS)))
            if form == "top_k_top_p_mask" and draw(st.integers(0, 2)) == 0:  # JAX code's top-k by a sort's column
                style = draw(st.sampled_from(sorted(SORT_COLUMN_TOP_KS)))
                spec = dataclasses.replace(spec, top_k_style=style,
                                           batch="b" if style == "sort_keep" else spec.batch)
    # Flax's, MTJ's, transformer_vq's, Levanter's and Haiku's nuclei draw by categorical only; top_k_of_probs by the log
    # of its probabilities
    flax_p = form in USES_TOP_P and spec.top_p_style in ("flax", "mtj", "tvq", "levanter", *F32_ANY_SHAPE_TOP_PS)
    if form in USES_TOP_P and spec.top_p_style == "levanter":  # Levanter samples f32 logits
        spec = dataclasses.replace(spec, upcast=spec.dtype != "float32")
    if stochastic and not rank_space_p and not flax_p and form not in ("top_k_of_probs", "probs_weights"):
        drawn = draw(st.sampled_from(DRAWS))
        one_row_choice = spec.batch == "v" and form not in RANK_SPACE_TOP_KS  # (1,) ids, no rank space
        if drawn in ("choice", "inverse_cdf") and (spec.batch in ("b", "bt") or one_row_choice):
            spec = dataclasses.replace(spec, draw=drawn, noise="categorical")
        elif drawn == "row_keys" and spec.batch == "b":  # (B, V) rows, one key each
            spec = dataclasses.replace(spec, draw=drawn, noise="categorical")
        elif drawn == "exponential_race" and spec.sampler_dtype == "float32":  # its own noise (f32: its bf16 race
            # divides bf16 probabilities by f32 noise, which no form takes; a remark says so), no keras categorical
            spec = dataclasses.replace(spec, draw=drawn, noise="categorical")
        elif drawn not in ("choice", "row_keys", "inverse_cdf", "exponential_race"):
            spec = dataclasses.replace(spec, draw=drawn)
    # torch.multinomial's (B, 1) ids returned as they are, where nothing takes through them (vocabulary space)
    if spec.draw in ("choice", "inverse_cdf") and spec.batch in ("b", "bt") and form not in RANK_SPACE_TOP_KS \
            and not rank_space_p and draw(st.integers(0, 2)) == 0:
        spec = dataclasses.replace(spec, unit_ids=True)
    # a Gumbel noise written by hand, for f32 logits drawn as they are
    if stochastic and spec.sampler_dtype == "float32" and spec.noise != "keras" \
            and spec.draw in ("categorical", "log_softmax", "log_of_softmax") and draw(st.integers(0, 3)) == 0:
        spec = dataclasses.replace(spec, noise=draw(st.sampled_from(sorted(HAND_NOISES))))
    if form == "top_a_logits":
        spec = dataclasses.replace(spec, square=draw(st.sampled_from(sorted(SQUARES))))
    if form == "min_p_log":  # (f32: its threshold of bf16 logits rounds as XLA fuses it, and no form is made)
        spec = dataclasses.replace(spec, min_p_log=draw(st.sampled_from(sorted(MIN_P_LOGS))), dtype="float32",
                                   upcast=False)
    if form == "probs_weights":  # torch.multinomial of (B, V) rows, its (B, 1) ids squeezed or not
        spec = dataclasses.replace(spec, weights_filter=draw(st.sampled_from(sorted(WEIGHTS_FILTERS))),
                                   renormalize=draw(st.booleans()), batch="b", unit_ids=draw(st.booleans()),
                                   noise="categorical", top_k_style="lax")  # (its top-k: lax.top_k's last value)
    if form in RANK_SPACE_TOP_KS and spec.noise != "keras" and spec.batch in ("b", "bt"):
        spec = dataclasses.replace(spec, take=draw(st.sampled_from(TAKES)))
        if spec.take == "torch_gather":  # torch's writing: torch.topk through torchax, on (B, V) rows
            spec = dataclasses.replace(spec, top_k_style="lax", batch="b")
    if form in SEARCHED and spec.batch in ("b", "bt", "b1") and draw(st.integers(0, 2)) == 0:
        spec = dataclasses.replace(spec, search_sign=draw(st.sampled_from(SEARCH_SIGNS)),
                                   fill=draw(st.sampled_from(FILLS[:3])), take="along_axis")
        if spec.draw == "categorical" and not spec.prelude:  # its drawn token's log-probability (T5X's) too
            spec = dataclasses.replace(spec, log_prob=draw(st.booleans()))
    # Levanter's nucleus alone, then the drawn token's log-probability it returns by default (`return_log_probs`)
    if form == "top_p_mask" and spec.top_p_style == "levanter" and spec.draw == "categorical" \
            and spec.noise not in HAND_NOISES:
        spec = dataclasses.replace(spec, log_prob=draw(st.booleans()))
    if form in USES_TOP_P and spec.top_p_style == "simply" and spec.draw == "categorical" \
            and spec.noise not in HAND_NOISES:  # simply's sampler returns the token's log-probability too
        spec = dataclasses.replace(spec, log_prob=draw(st.booleans()))
    if spec.settings_rows:  # grok-1 reads its filtered logits again: the drawn token's probability, the top 8
        spec = dataclasses.replace(spec, log_prob=draw(st.booleans()))
    escapable = form in ESCAPES and (form not in USES_TOP_P or spec.top_p_style in ("sort", "top_k", "hf", "flax"))
    if form == "temperature":
        escapable = spec.temperature_style == "const"
    escape = escapable and not spec.search_sign and draw(st.integers(0, 4)) == 0
    spec = dataclasses.replace(spec, escape=escape)
    # log-probabilities first (axlearn's decoder), where the site would read the logits themselves
    if stochastic and not escape and not spec.log_prob and spec.temperature_style == "const" \
            and writes_form_exactly(spec) and draw(st.integers(0, 3)) == 0:
        spec = dataclasses.replace(spec, prelude=True)
    # in a lax.cond branch or a decode loop's body (values it returns beside the ids stay in the body's function)
    if not spec.escape and not spec.log_prob and draw(st.integers(0, 3)) == 0:
        spec = dataclasses.replace(spec, enclosure=draw(st.sampled_from(["cond", "loop"])))
    # rows drawn as (R / n, n, V): vocabulary-space draws of (B, V) rows
    vocabulary_space = form not in (*RANK_SPACE_TOP_KS, "probs_weights") and not rank_space_p  # (its draw: its own)
    vocabulary_space = vocabulary_space and not spec.settings_rows  # (per-row operands: the rows as they are drawn)
    if vocabulary_space and spec.batch == "b" and spec.draw in ("categorical", "log_softmax", "log_of_softmax") \
            and spec.noise != "keras" and spec.noise not in HAND_NOISES and draw(st.integers(0, 3)) == 0:
        spec = dataclasses.replace(spec, draw_rows=draw(st.sampled_from([1, spec.rows])))
    if per_sequence_writable(spec) and draw(st.integers(0, 2)) == 0:
        spec = dataclasses.replace(spec, per_sequence=draw(st.sampled_from(PER_SEQUENCE)), batch="b")
    return spec


def per_sequence_writable(spec: SamplerSpec) -> bool:
    """Whether `spec` is a sampler serving pipelines write per sequence and vmap: the top-k kept at or above a sort's
    k-th, the JAX nuclei, a plain categorical, on f32 rows as they are, drawn by jax.random.categorical with its key
    as given, and nothing else read or returned."""
    writable = spec.form in ("categorical", "temperature") or (
        spec.form == "top_k_mask" and spec.top_k_style == "sort_keep") or (
        spec.form in USES_TOP_P and spec.top_p_style == "jax")
    plain = spec.draw == "categorical" and spec.noise == "categorical" and spec.key_kind == "raw" \
        and spec.key_op == "none" and spec.temperature_style == "const" and spec.dtype == "float32"
    alone = not (spec.extras or spec.escape or spec.enclosure or spec.prelude or spec.log_prob or spec.draw_rows
                 or spec.settings_rows or spec.search_sign)
    return writable and plain and alone and spec.batch in ("b", "v")


# ----- the checks --------------------------------------------------------------------------------------



def _check_fusion(spec: SamplerSpec, fused: ir.Module, remarks: list[str]) -> None:
    form, values = expected(spec)
    sites = count_composites(fused, "hlofuse.sample")
    assert sites == 1, f"{spec}\nremarks: {remarks}"
    (attrs,) = sample_attrs(fused)
    # Fused past the value it also returns, its filter (or softmax) left in XLA: the remark says which form it
    # passed over, and why (a temperature's divide is no filter: no remark).
    if spec.escape and spec.form in ESCAPES and spec.form != "temperature":
        assert any("not fused as" in r and "has a user outside it" in r for r in remarks), f"{spec}\n{remarks}"
    if spec.search_sign and spec.sampler_dtype != "float32":  # the searches stay in XLA, and the remark says why
        assert any("threshold search" in r and "excess precision" in r for r in remarks), f"{spec}\n{remarks}"
    # (at T = 1 the classic cut of x / T and that of the logits, then / T, are one function, and so are Haiku's: the
    # pass takes either)
    of_logits = attrs.form.replace("top_p_shifted_mask", "top_p_shifted_logits_mask").replace(
        "top_p_haiku_mask", "top_p_haiku_logits_mask")
    same_at_t1 = attrs.temperature == 1.0 and of_logits == form
    assert attrs.form == form or same_at_t1, f"{spec}\nfused as {attrs.form}, not {form}"
    for name, value in values.items():
        got = getattr(attrs, name)
        ok = got == pytest.approx(value, rel=1e-6) if isinstance(value, float) else got == value
        assert ok, f"{spec}\n{name} = {got}, want {value}"


def check_program(spec: SamplerSpec) -> None:
    fn, specs = build(spec)
    original = jax.jit(fn).lower(*specs).compiler_ir("stablehlo")
    fused = clone_module(original)
    result = run_pipeline(fused, "default")
    _check_fusion(spec, fused, [str(r) for r in result.remarks])
    targeted = clone_module(original)
    run_pipeline(targeted, "default", target="cpu")
    programs: dict[str, Any] = {"original": original, "fused": fused, "cpu": targeted}
    if count_composites(fused, "hlofuse.sample"):
        referenced = clone_module(fused)
        assert run_pipeline(referenced, REFERENCE).counters["sample_to_reference"] == 1
        programs["reference"] = referenced
    runs = {name: compile_module(clone_module(m)) for name, m in programs.items()}
    for case, logits in logits_cases(spec).items():
        for seed in range(KEYS if spec.stochastic else 1):
            args = inputs(spec, logits, seed)
            want = runs["original"](*args)
            for name, run in runs.items():
                for i, (w, g) in enumerate(zip(want, run(*args), strict=True)):
                    np.testing.assert_array_equal(g, w, err_msg=f"{spec}\n{name} output {i}, {case}, seed {seed}")


# ----- the properties ----------------------------------------------------------------------------------

# Split by family so pytest-xdist can run them on different workers.
FAMILIES = {
    "greedy_temperature": (("greedy", "greedy_softmax", "categorical", "temperature"), 0.3),
    "top_k": (("top_k", "temperature_top_k", "top_k_mask"), 0.35),
    "top_p_min_p": (("top_p_mask", "top_k_top_p_mask", "min_p"), 0.35),
    "hf_warpers": (HF_WARPERS, 0.3),
    "library_filters": (LIBRARY_FILTERS, 0.3),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_generated_sampler_is_fused_and_draws_the_same_tokens(family: str) -> None:
    forms, share = FAMILIES[family]

    @settings(PROFILE, max_examples=max(1, round(PROFILE.max_examples * share)))
    @hypothesis_given(sampler_specs(forms))
    def prop(spec: SamplerSpec) -> None:
        check_program(spec)

    prop()


# ----- regressions and known gaps ------------------------------------------------------------------------

_SMALL = SamplerSpec(form="temperature", vocab=64, batch="b", rows=2)

# Gaps the differential test found and that are fixed: each stays as a regression test.
FIXED_GAPS = {
    # gemma / keras-hub nucleus: draws in rank space from log(kept probabilities), fused as `categorical` with
    # its sort left in XLA until the rank-space nucleus forms (sampling_reference.RANK_NUCLEI).
    "top_p_rank_space_gemma": SamplerSpec(form="top_p_mask", top_p_style="gemma"),
    "top_p_rank_space_keras": SamplerSpec(form="top_p_mask", top_p_style="keras", noise="keras"),
    "top_k_then_rank_space_keras_traced_t": SamplerSpec(form="top_k_top_p_mask", top_p_style="keras",
                                                        temperature_style="traced"),
    # A nucleus fill other than -inf fused only at its draw until fills <= -1e6 became writings (FILL_NOTE); -1000
    # still does, the near-miss.
    # A top-k by argsort whose drawn rank is gathered by batch index (HYPOTHESIS_PROFILE=thorough found it): the
    # two writings composed.
    "argsort_top_k_by_batch_index": SamplerSpec(form="top_k", vocab=16, rows=1, k=1, top_k_style="sort",
                                                temperature=0.5, take="batch_index"),
    "top_p_fill_maxtext": SamplerSpec(form="top_p_mask", fill="-1e7"),
    "top_k_top_p_fill_finfo_min_bf16": SamplerSpec(form="top_k_top_p_mask", top_p_style="top_k", fill="finfo_min",
                                                   dtype="bfloat16"),
    "top_p_fill_small_is_the_fallback": SamplerSpec(form="top_p_mask", fill="-1000"),
    # mesh-transformer-jax's (GPT-J's) nucleus: fused as `temperature` with its sorts in XLA until top_p_mtj_mask;
    # after a top-k mask, its nucleus of the masked logits (the top-k stays in XLA, as for Flax's)
    "top_p_mtj": SamplerSpec(form="top_p_mask", top_p_style="mtj"),
    # Levanter's (marin's) nucleus of x / T (a reversed stable argsort, a take along it, `cumsum < p - 1e-4` with the
    # tolerance in jnp, shifted, a take back): fused as `categorical` with its sorts in XLA until top_p_levanter_mask
    # and hlofuse-prepare's fold of the f32 threshold; with ties, p at 0.5, the Gumbel argmax Levanter draws by
    "top_p_levanter": SamplerSpec(form="top_p_mask", top_p_style="levanter"),
    "top_p_levanter_ties_gumbel": SamplerSpec(form="top_p_mask", top_p_style="levanter", noise="gumbel", vocab=16,
                                              p=0.5),
    # ... and the drawn token's log-probability it returns by default: fused at its draw, the nucleus in XLA for that
    # read, until the composite gave back its filtered logits (SCORED_FILTERS)
    "top_p_levanter_log_prob": SamplerSpec(form="top_p_mask", top_p_style="levanter", noise="gumbel", log_prob=True),
    # Haiku's and grok-1's nucleus of x / T (an ascending lax.sort, the cut at `argmax(cumsum >= 1 - p)`, the logits at
    # or above the sorted logit there): fused as `categorical` with its sort in XLA until top_p_haiku_mask; with ties
    # and a large fill in a loop, and of (B, 1, V) decode logits
    "top_p_haiku": SamplerSpec(form="top_p_mask", top_p_style="haiku"),
    "top_p_haiku_ties_filled_in_a_loop": SamplerSpec(form="top_p_mask", top_p_style="haiku", vocab=16, p=0.5,
                                                     fill="-1e7", enclosure="loop"),
    "top_p_haiku_decode_rows_gumbel": SamplerSpec(form="top_p_mask", top_p_style="haiku", batch="b1", noise="gumbel"),
    # torch samplers' filters of the probabilities drawn by torch.multinomial of the weights as they are (a min-p
    # zeroed by torch.where, a top-k by a product): not fused at all, with a remark, until the `_unnormalized` forms;
    # renormalised, the min-p had no form until min_p_of_probs_torch
    "probs_weights_min_p": SamplerSpec(form="probs_weights", batch="b", unit_ids=True),
    "probs_weights_min_p_renormalized_traced_t": SamplerSpec(form="probs_weights", batch="b", renormalize=True,
                                                             temperature_style="traced"),
    "probs_weights_top_k": SamplerSpec(form="probs_weights", batch="b", weights_filter="top_k"),
    "top_p_haiku_of_logits_then_scaled": SamplerSpec(form="top_p_mask", top_p_style="haiku_logits", fill="finfo_min"),
    # grok-1's sample_token: T, p and a mask of allowed tokens per row ((B,) and (B, V) arguments expanded to its
    # (B, 1, V) logits), each row drawn with its own key by a vmapped categorical, the filtered logits read again (the
    # drawn token's probability): fused at its draw, its sort in XLA, until top_p_haiku_rows gave back its scores
    "grok_sample_token": SamplerSpec(form="top_p_mask", top_p_style="haiku", settings_rows=True, batch="b1",
                                     draw="row_keys", fill="-1e7", log_prob=True),
    # google-deepmind/simply's nucleus (softmax in id order along a stable descending argsort, exclusive cumsum, put
    # back by sort_key_val) and its fused nucleus of the top k (one-hot ids), with the drawn token's log-probability:
    # fused as `categorical` with the filters in XLA until top_p_simply_mask and top_k_top_p_simply_mask (scores)
    "top_p_simply_log_prob": SamplerSpec(form="top_p_mask", top_p_style="simply", fill="finfo_min", log_prob=True),
    "top_k_top_p_simply_ties": SamplerSpec(form="top_k_top_p_mask", top_p_style="simply", vocab=16, k=8, p=0.5,
                                           fill="-1e7"),
    "grok_sample_token_bf16": SamplerSpec(form="top_p_mask", top_p_style="haiku", settings_rows=True, batch="b1",
                                          draw="row_keys", fill="-1e7", log_prob=True, dtype="bfloat16"),
    "grok_sample_token_one_key_ties": SamplerSpec(form="top_p_mask", top_p_style="haiku", settings_rows=True, vocab=16,
                                                  p=0.5, fill="-inf"),
    "top_p_mtj_ties_traced_t": SamplerSpec(form="top_p_mask", top_p_style="mtj", vocab=16, p=0.5,
                                           temperature_style="traced"),
    "top_k_then_top_p_mtj": SamplerSpec(form="top_k_top_p_mask", top_p_style="mtj"),
    # transformer_vq's nucleus (the softmax sorted by a stable argsort, the mask multiplied in): fused as `categorical`
    # with its sorts in XLA until top_p_prob_sorted_mask; of (B, T, V) rows; T traced in front; after a top-k mask
    "top_p_tvq": SamplerSpec(form="top_p_mask", top_p_style="tvq"),
    "top_p_tvq_rows_traced_t": SamplerSpec(form="top_p_mask", top_p_style="tvq", batch="bt", vocab=16, p=0.5,
                                           temperature_style="traced"),
    "top_p_tvq_of_log_probs_in_a_loop": SamplerSpec(form="top_p_mask", top_p_style="tvq", prelude=True,
                                                    enclosure="loop"),
    "top_k_then_top_p_tvq": SamplerSpec(form="top_k_top_p_mask", top_p_style="tvq"),
    # The classic top-p (Megatron-LM's, Hugging Face's old `top_k_top_p_filtering`, through torchax): fused as its draw
    # with the sorts in XLA until top_p_shifted_mask; drawn by torch.multinomial; ties with T traced in front; by a key
    # per row; after a top-k mask
    "top_p_classic": SamplerSpec(form="top_p_mask", top_p_style="classic"),
    "top_p_classic_choice": SamplerSpec(form="top_p_mask", top_p_style="classic", draw="choice"),
    "top_p_classic_ties_traced_t": SamplerSpec(form="top_p_mask", top_p_style="classic", vocab=16, p=0.5,
                                               temperature_style="traced"),
    "top_p_classic_row_keys": SamplerSpec(form="top_p_mask", top_p_style="classic", draw="row_keys"),
    # Hugging Face's old top_k_top_p_filtering (/ T, torch.topk's k-th mask, the classic cut; lax.top_k's k-th; the
    # negated argsort, no top-k writing: its mask stays in XLA)
    "top_k_then_top_p_classic": SamplerSpec(form="top_k_top_p_mask", top_p_style="classic", top_k_style="torchax",
                                            draw="choice"),
    "top_k_then_top_p_classic_by_lax": SamplerSpec(form="top_k_top_p_mask", top_p_style="classic"),
    "top_k_then_top_p_classic_negated_argsort": SamplerSpec(form="top_k_top_p_mask", top_p_style="classic",
                                                            top_k_style="negated_sort"),
    # The classic top-p as JAX engines write it (a flipped argsort, a roll, concatenate or pad, put back by a take along
    # the order's argsort or by sort_key_val: `_jax_classic_writing` picks by p): fused as its draw with the sorts in
    # XLA until hlofuse-prepare's normal forms and top_p_flipped_mask; ties with T traced in front; by torch-style
    # choice; by a key per row; after a top-k mask (which stayed in XLA until JAX_CLASSIC_CHAINS)
    "top_p_jax": SamplerSpec(form="top_p_mask", top_p_style="jax"),  # (slice, roll, logits_take)
    "top_p_jax_ties_traced_t": SamplerSpec(form="top_p_mask", top_p_style="jax", vocab=16, p=0.5,  # (pad, scatter)
                                           temperature_style="traced"),
    "top_p_jax_flip_concatenate_sort_key_val": SamplerSpec(form="top_p_mask", top_p_style="jax", p=0.871),
    "top_p_jax_choice_flip_pad": SamplerSpec(form="top_p_mask", top_p_style="jax", draw="choice", p=0.815),
    "top_p_jax_row_keys_mask_take": SamplerSpec(form="top_p_mask", top_p_style="jax", draw="row_keys", p=0.6),
    "top_k_then_top_p_jax": SamplerSpec(form="top_k_top_p_mask", top_p_style="jax", p=0.757),
    "top_p_jax_scattered_back": SamplerSpec(form="top_p_mask", top_p_style="jax", p=0.93),
    # ... and as they vary the cut (JAX_CUTS): fused whole by top_p_descending_mask, hlofuse-prepare's normal forms
    # (one sort of one row; the cumsum sliced before its compare) and the template match's strictness step (`>= p`):
    # with ties, by choice, and of one row (V,), as engines write it at batch 1
    "top_p_jax_descending_ties": SamplerSpec(form="top_p_mask", top_p_style="jax", jax_cut="descending", vocab=16,
                                             p=0.5),
    "top_p_jax_descending_at_or_above_slice_first": SamplerSpec(
        form="top_p_mask", top_p_style="jax", jax_cut="descending+at_or_above+slice_first", p=0.871),
    "top_p_jax_at_or_above_choice": SamplerSpec(form="top_p_mask", top_p_style="jax", jax_cut="at_or_above",
                                                draw="choice", p=0.815),
    "top_p_jax_one_row_sorted_apart": SamplerSpec(form="top_p_mask", top_p_style="jax", jax_cut="sorted_apart",
                                                  batch="v"),
    "top_p_jax_one_row_slice_first_ties": SamplerSpec(form="top_p_mask", top_p_style="jax", jax_cut="slice_first",
                                                      batch="v", vocab=16, p=0.5),
    # ... and not shifted (`cumsum > p` removed as it is: top_p_unshifted_mask; a row whose top token is above p keeps
    # nothing): fused as its draw, the sorts in XLA, until that form; with ties, by choice at `>= p`, of one row sorted
    # apart, and after minGPT's top-k (a JAX chat demo's sampler of one row)
    "top_p_jax_unshifted_ties": SamplerSpec(form="top_p_mask", top_p_style="jax", jax_cut="unshifted", vocab=16,
                                            p=0.5),
    "top_p_jax_unshifted_at_or_above_choice": SamplerSpec(form="top_p_mask", top_p_style="jax",
                                                          jax_cut="unshifted+at_or_above", draw="choice", p=0.815),
    "top_p_jax_unshifted_one_row_sorted_apart": SamplerSpec(form="top_p_mask", top_p_style="jax",
                                                            jax_cut="unshifted+sorted_apart", batch="v"),
    "top_k_below_then_unshifted_one_row": SamplerSpec(form="top_k_top_p_mask", top_k_style="sort_below",
                                                      top_p_style="jax", jax_cut="unshifted+sorted_apart", batch="v",
                                                      fill="-inf"),
    # x-transformers' top-p of the logits (the classic cut, its sorted logits filled and scattered back), then / T
    "top_p_x_transformers": SamplerSpec(form="top_p_mask", top_p_style="xt"),
    # (a top-k mask no form reads, then x-transformers' cut at T = 1: either classic form)
    "top_k_then_top_p_x_transformers_negated_argsort": SamplerSpec(
        form="top_k_top_p_mask", vocab=16, rows=3, steps=1, temperature=0.5, temperature_style="before", k=1,
        top_k_style="negated_sort", p=0.5, top_p_style="xt", key_kind="typed", key_op="split", draw="choice",
        enclosure="loop"),
    "top_p_x_transformers_choice_traced_t": SamplerSpec(form="top_p_mask", top_p_style="xt", draw="choice", vocab=16,
                                                        p=0.5, temperature_style="traced"),
    # argmax(x + gumbel): JAX's categorical adds gumbel + x; the matcher now tries add/multiply both ways.
    "gumbel_logits_first": dataclasses.replace(_SMALL, noise="gumbel"),
    # argmax(softmax(x)) next to log_softmax(x) (logprobs): CSE shares the max, shift, exp and sum.
    "greedy_softmax_with_logprobs": SamplerSpec(form="greedy_softmax", extras=("logprobs",)),
    # JetStream / MaxText top-p: the descending sort is a full-width lax.top_k (another writing of the form).
    "top_p_by_full_top_k": SamplerSpec(form="top_p_mask", top_p_style="top_k"),
    "top_k_top_p_by_full_top_k": SamplerSpec(form="top_k_top_p_mask", top_p_style="top_k", key_kind="typed"),
    # The sampler's returned probabilities still block fusion, with a remark.
    "min_p_probs_escape": SamplerSpec(form="min_p", escape=True),
    # A stable descending argsort sliced to k, values gathered: lax.top_k's ids and values, so another
    # writing of the top-k forms (sampling_reference._by_argsort). Fused as `temperature` over the gathered
    # values before, which left the whole-vocabulary sort to XLA.
    "top_k_by_argsort": SamplerSpec(form="top_k", top_k_style="sort"),
    "top_k_mask_by_argsort": SamplerSpec(form="top_k_mask", top_k_style="sort"),
    # a top-k kept at or above `jnp.sort(x)[..., -k]` (JAX engines'; EasyDeL's column after hlofuse-prepare): ties,
    # a fill, bf16, T before
    "top_k_kept_by_sort_column_ties": SamplerSpec(form="top_k_mask", top_k_style="sort_keep", vocab=16, k=3),
    "top_k_kept_by_sort_column_fill_bf16": SamplerSpec(form="top_k_mask", top_k_style="sort_keep", fill="finfo_min",
                                                       dtype="bfloat16"),
    "top_k_kept_by_sort_column_before_choice": SamplerSpec(form="top_k_mask", top_k_style="sort_keep",
                                                           temperature_style="before", draw="choice"),
    # minGPT's top-k as JAX code writes it, `where(x < jnp.sort(x)[..., -k][..., None], -inf, x)` (a writing of
    # top_k_mask): fused as `temperature` or `categorical` of what it keeps, the sort in XLA, until then. One row
    # scaled before and drawn by `jax.random.choice(key, V, p=softmax)` (minGPT-jax's); `[..., -k:][..., :1]`
    # (k = 8) with ties and a fill; bf16 decode rows (B, 1, V) with Gumbel noise.
    "top_k_below_sort_column_one_row_choice": SamplerSpec(form="top_k_mask", top_k_style="sort_below", batch="v",
                                                          temperature_style="before", draw="inverse_cdf"),
    "top_k_below_sort_column_slice_ties_fill": SamplerSpec(form="top_k_mask", top_k_style="sort_below", k=8,
                                                           vocab=16, fill="-1e7"),
    "top_k_below_sort_column_bf16_decode_rows": SamplerSpec(form="top_k_mask", top_k_style="sort_below", batch="b1",
                                                            dtype="bfloat16", noise="gumbel"),
    # A top-k and then the classic cut as JAX code writes them, both of x / T (JAX_CLASSIC_CHAINS): fused as the cut
    # of what the top-k leaves, the top-k's sort or top_k in XLA, until the chains. A Flax NNX sampler's (kept at or
    # above the sort's column, `argsort(descending=True)`, `>= p`); minGPT's top-k then the flipped argsort's cut, of
    # one row; lax.top_k's, by a reciprocal (T outside); a stable argsort's, sorted apart.
    "top_k_keep_then_jax_top_p_nnx": SamplerSpec(form="top_k_top_p_mask", top_k_style="sort_keep", top_p_style="jax",
                                                 jax_cut="descending+at_or_above+slice_first", fill="-inf"),
    "top_k_below_then_jax_top_p_one_row": SamplerSpec(form="top_k_top_p_mask", top_k_style="sort_below",
                                                      top_p_style="jax", batch="v", fill="-inf", k=8),
    "top_k_lax_then_jax_top_p_reciprocal": SamplerSpec(form="top_k_top_p_mask", top_k_style="lax", top_p_style="jax",
                                                       temperature_style="reciprocal", fill="-inf"),
    "top_k_argsort_then_jax_top_p_sorted_apart": SamplerSpec(form="top_k_top_p_mask", top_k_style="sort",
                                                             top_p_style="jax", jax_cut="sorted_apart", fill="-inf"),
    "temperature_top_k_by_argsort": SamplerSpec(form="temperature_top_k", top_k_style="sort"),
    "top_k_top_p_by_argsort_and_full_top_k": SamplerSpec(form="top_k_top_p_mask", top_k_style="sort",
                                                         top_p_style="top_k"),
    # argsort(-x)[..., :k] puts NaN last where lax.top_k puts it first: not a top-k writing, so the exact
    # fallback (temperature over what it feeds the draw).
    "top_k_mask_by_negated_argsort_is_not_top_k": SamplerSpec(form="top_k_mask", top_k_style="negated_sort"),
    # keras' JAX random.categorical draws over (..., V, 1) along axis -2: an argmax over a dim that is not the
    # last was refused with a remark, so keras-hub's samplers never fused. Now a writing of every form.
    "keras_categorical": dataclasses.replace(_SMALL, noise="keras"),
    "keras_log_of_softmax_top_k": SamplerSpec(form="top_k", noise="keras", draw="log_of_softmax"),
    "keras_vector_logits": SamplerSpec(form="top_k_mask", batch="v", noise="keras"),
    "keras_rank_space_top_p": SamplerSpec(form="top_p_mask", top_p_style="keras", noise="keras"),
    # gemma's TopkSampling gathers the drawn rank's id by batch index: fused as `temperature` over the top-k
    # values, which left the top_k in XLA with no remark. Now a writing of the rank-space top-k forms.
    "top_k_by_batch_index": SamplerSpec(form="top_k", take="batch_index"),
    # keras-hub's top-k of the probabilities with its top-k by a stable argsort, or its drawn rank gathered by batch
    # index (the generator's library_filters family found both): fused as `categorical` of the log-probabilities,
    # the softmax, sort and take left in XLA, until top_k_of_probs took the rank-space writings of the top-k forms.
    # One row's jax.random.choice, the token's log-probability read beside it (the library_filters family found it,
    # HYPOTHESIS_PROFILE=thorough): that read's (1, 1) index was taken for the one row stacked as a batch, so no
    # form's shape matched, and the draw was not fused.
    "one_row_choice_with_logprobs": SamplerSpec(form="temperature", vocab=16, batch="v", temperature=0.5,
                                                draw="choice", extras=("logprobs",)),
    # bf16 logits whose softmax x-transformers' min-p filter shares with their log-softmax (logprobs): its exp widened
    # to f32 for the sum escaped the sampler, so it fused as `temperature` with the filter in XLA.
    "min_p_logits_bf16_with_logprobs": SamplerSpec(form="min_p_logits", dtype="bfloat16", extras=("logprobs",)),
    "top_k_of_probs_by_argsort": SamplerSpec(form="top_k_of_probs", top_k_style="sort"),
    "top_k_of_probs_by_batch_index_at_t1": SamplerSpec(form="top_k_of_probs", take="batch_index",
                                                       temperature_style="before", top_k_style="sort"),
    # The temperature applied before the sampler (gemma's top-p, Hugging Face's warpers): fused as categorical of
    # the filtered logits, leaving the filter's sort in XLA. Now each form also matches unscaled, at T = 1.
    "top_p_scaled_before": SamplerSpec(form="top_p_mask", temperature_style="before"),
    "top_k_top_p_scaled_before": SamplerSpec(form="top_k_top_p_mask", temperature_style="before", noise="keras"),
    "top_k_mask_scaled_before_choice": SamplerSpec(form="top_k_mask", temperature_style="before", draw="choice"),
    "min_p_traced_temperature": SamplerSpec(form="min_p", temperature_style="traced"),
    "temperature_top_k_reciprocal": SamplerSpec(form="temperature_top_k", temperature_style="reciprocal"),
    "temperature_top_k_by_batch_index": SamplerSpec(form="temperature_top_k", take="batch_index", batch="bt"),
    # The rank-space nucleus with its probabilities sorted by a hand-written argsort (the JAX ports of the llama
    # reference's `sample_top_p`): fused at its draw as `categorical`, the sort left in XLA; now writings of the
    # rank-space forms (a softmax's probabilities are never -0, nor NaN beside numbers).
    "rank_space_top_p_by_negated_argsort": SamplerSpec(form="top_p_mask", top_p_style="gemma",
                                                       top_k_style="negated_sort"),
    "rank_space_top_p_by_argsort_keras": SamplerSpec(form="top_p_mask", top_p_style="keras", top_k_style="sort",
                                                     noise="keras"),
    # torch.multinomial of one row (litgpt's `sample` of `logits[0, -1]`), whose ids are (1,): the choice draw took
    # (B, V) rows only, so none fused; Hugging Face's top-p of one row (litgpt's `sample_top_p`) likewise.
    "choice_one_row_vector": SamplerSpec(form="temperature", draw="choice", batch="v"),
    "choice_one_row_top_k_mask_torchax": SamplerSpec(form="top_k_mask", draw="choice", batch="v",
                                                     top_k_style="torchax"),
    "choice_one_row_hf_top_p": SamplerSpec(form="top_p_mask", top_p_style="hf", draw="choice", batch="v"),
    "one_row_hf_top_k_top_p_bf16": SamplerSpec(form="top_k_top_p_mask", top_p_style="hf", top_k_style="torchax",
                                               batch="v", dtype="bfloat16"),
    # axlearn's logit modifiers and T5X's masks (searches with constant k and p) fused as `categorical` at most, the
    # searches' while loops left in XLA, until the searched forms; its log-probabilities first, and its rows drawn as
    # (B, n, V), fused in part or not at all until the prelude and the reshaped draw.
    "searched_top_k_axlearn": SamplerSpec(form="top_k_mask", search_sign="axlearn", fill="-1e7", k=3),
    "searched_top_p_t5x_decode_slice": SamplerSpec(form="top_p_mask", search_sign="t5x", batch="bt"),
    "searched_top_k_top_p_reciprocal_t": SamplerSpec(form="top_k_top_p_mask", search_sign="t5x",
                                                     temperature_style="reciprocal", fill="finfo_min"),
    "searched_top_k_top_p_of_log_probs_drawn_by_rows": SamplerSpec(
        form="top_k_top_p_mask", search_sign="axlearn", fill="-1e7", prelude=True, draw_rows=1, rows=3),
    # T5X's decode step: the drawn token's log-probability under the filtered logits, which the composite gives back
    # (fused as `categorical` of them, the searches in XLA, until the scores result).
    "searched_top_k_t5x_log_prob": SamplerSpec(form="top_k_mask", search_sign="t5x", fill="-1e7", log_prob=True),
    "searched_top_k_top_p_keras_noise_log_prob": SamplerSpec(form="top_k_top_p_mask", search_sign="axlearn",
                                                             noise="keras", batch="b1", log_prob=True),
    "searched_top_p_drawn_by_rows_log_prob": SamplerSpec(form="top_p_mask", search_sign="t5x", draw_rows=2, rows=4,
                                                         fill="finfo_min", log_prob=True),
    # Samplers in a lax.cond branch and in a decode loop carrying jnp.array(T) (T5X, Flax's lm1b), before the cond's
    # rewrite, the dominance-ordered decomposition and the carried constants' fold.
    "top_p_mask_in_a_decode_loop": SamplerSpec(form="top_p_mask", enclosure="loop"),
    "top_k_rank_space_in_a_cond_branch": SamplerSpec(form="top_k", enclosure="cond", key_op="split"),
    "searched_top_k_top_p_in_a_decode_loop": SamplerSpec(form="top_k_top_p_mask", search_sign="t5x", fill="-1e7",
                                                         enclosure="loop"),
    "hf_min_p_in_a_decode_loop_bf16": SamplerSpec(form="min_p_removal", enclosure="loop", dtype="bfloat16"),
    "temperature_of_log_probs": SamplerSpec(form="temperature", prelude=True),
    "top_k_rank_space_of_log_probs_log_softmax": SamplerSpec(form="top_k", prelude=True, draw="log_softmax"),
    "top_p_mask_drawn_by_rows": SamplerSpec(form="top_p_mask", draw_rows=2, rows=2),
    "min_p_log_softmax_drawn_by_rows_gumbel": SamplerSpec(form="min_p", draw_rows=1, draw="log_softmax",
                                                          noise="gumbel"),
    # Gumbel noise written by hand (PaLM-jax's `log(t + 1e-20)`, lucidrains' clamp at 1e-20): not fused at all until
    # the composite carried its value where the uniform is 0 (`gumbel_at_zero`)
    "hand_sums_top_p_mask": SamplerSpec(form="top_p_mask", noise="hand_sums"),
    "hand_clamps_top_k_rank_space_log_softmax": SamplerSpec(form="top_k", noise="hand_clamps", draw="log_softmax"),
    "hand_sums_min_p_in_a_decode_loop": SamplerSpec(form="min_p", noise="hand_sums", enclosure="loop"),
    "hand_clamps_classic_top_p": SamplerSpec(form="top_p_mask", top_p_style="classic", noise="hand_clamps"),
    "hand_sums_hf_top_k_top_p": SamplerSpec(form="top_k_top_p_mask", top_p_style="hf", noise="hand_sums"),
    # Only the inner log guarded (`-log(-log(u + eps))`), or the noise subtracted (`x - log(-log(u + eps) + eps)`):
    # not fused (a remark) until HAND_NOISES took every pair of guards, and the subtraction.
    "hand_inner_sum_top_k_mask": SamplerSpec(form="top_k_mask", noise="hand_inner_sum"),
    "hand_minus_top_p_log_softmax": SamplerSpec(form="top_p_mask", noise="hand_minus", draw="log_softmax"),
    # The textbook `-log(-log(u))`, -inf where u = 0: not fused (a remark) until the kernels drew that -inf.
    "hand_unguarded_top_k_mask": SamplerSpec(form="top_k_mask", noise="hand_unguarded"),
    "hand_unguarded_classic_top_p": SamplerSpec(form="top_p_mask", top_p_style="classic", noise="hand_unguarded"),
    # torch's rank-space top-k (torch.topk through torchax, its candidates' ids mapped back by torch.gather): not
    # fused (a remark) until the rank-space forms took that writing.
    "torch_gather_top_k_choice": SamplerSpec(form="temperature_top_k", take="torch_gather", draw="choice"),
    "torch_gather_top_k_of_probs": SamplerSpec(form="top_k_of_probs", take="torch_gather"),
    # A top-k mask filled with a large negative number before the temperature: fused as `temperature`, the top-k in
    # XLA, until top_k_mask took the fills (FILL_NOTE).
    "top_k_mask_fill_before_scale": SamplerSpec(form="top_k_mask", fill="-1e7"),
    "top_k_mask_fill_finfo_min": SamplerSpec(form="top_k_mask", fill="finfo_min"),
    # The rank-space top-k scaled by a reciprocal after the top-k, drawn by choice: its candidates' (B, 1) stack read
    # by the take as it is had no (B,) root for the draw's own form (a thorough run; unfused, with a remark).
    "top_k_reciprocal_choice_one_row": SamplerSpec(form="top_k", vocab=16, rows=1, k=3, temperature_style="reciprocal",
                                                   draw="choice"),
    "top_k_reciprocal_choice_rows": SamplerSpec(form="top_k", rows=2, k=3, temperature_style="reciprocal",
                                                draw="choice"),
}


@pytest.mark.parametrize("spec", [pytest.param(spec, id=name) for name, spec in FIXED_GAPS.items()])
def test_fixed_gap(spec: SamplerSpec) -> None:
    check_program(spec)


@pytest.mark.parametrize("draw", ["log_softmax", "choice"])
def test_searched_filter_on_bf16_is_left_to_xla_with_its_draw_fused(draw: str) -> None:
    """HYPOTHESIS_PROFILE=thorough found it: a T5X-style searched top-k and top-p of bf16 logits (a -1e7 fill, T 1.3),
    drawn from its log-probabilities. On the CPU the kernel's draw beside the form's function drew another token than
    the program: XLA rounds the bf16 probabilities the search thresholds as it fuses each program. No searched form
    is formed for bf16 (EXCESS_PRECISION_NOTE): the draw fuses, the searches stay in XLA, with the remark."""
    spec = SamplerSpec(form="top_k_top_p_mask", vocab=16, rows=1, dtype="bfloat16", temperature=1.3, k=1, p=0.5,
                       fill="-1e7", draw=draw, search_sign="t5x")
    assert expected(spec)[0] == f"categorical_{draw}"
    check_program(spec)


def test_searched_top_k_of_bf16_decode_rows_is_the_programs() -> None:
    """Found by the derandomized generator (2026-12-07, once its stream changed): axlearn's searched top-k at k = 1 of
    bf16 (B, 1, V) logits scaled by a reciprocal, a finfo.min fill and Gumbel noise. The program draws id 0 for every
    row of the `normal` case (XLA compares the scaled logits unrounded with the cutoff the search found of them
    rounded, and keeps none), the searched form's function the row's top token: it fused as `searched_top_k`, which
    its reference lowering, or any target's kernel, drew otherwise. Now its draw fuses, the search in XLA."""
    spec = SamplerSpec(form="top_k_mask", vocab=16, batch="b1", rows=2, steps=2, dtype="bfloat16", temperature=1.3,
                       temperature_style="reciprocal", k=1, top_k_style="torchax", p=0.5, fill="finfo_min",
                       min_p=0.05, key_op="split", noise="gumbel", search_sign="axlearn")
    fn, specs = build(spec)
    args = inputs(spec, logits_cases(spec)["normal"], 0)
    exact = jax.jit(fn, compiler_options={"xla_allow_excess_precision": False})
    assert not np.array_equal(jax.jit(fn)(*args), exact(*args))  # the program's cut is XLA's choice
    check_program(spec)


def test_argsort_writing_is_lax_top_k_but_for_signed_zeros() -> None:
    """Why the stable descending argsort is a top-k writing and argsort(-x) is not: NaN, infinities and ties."""
    rng = np.random.default_rng(0)
    specials = np.array([np.nan, np.inf, -np.inf, 1.0, 1.0, 0.5], np.float32)
    rows = rng.choice(np.concatenate([specials, rng.standard_normal(10).astype(np.float32)]), size=(64, 24))
    x = jax.numpy.asarray(rows)
    for k in (1, 5, 24):
        want_values, want_ids = jax.lax.top_k(x, k)
        values, ids = top_k_by_argsort(x, k)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_array_equal(values, want_values)  # NaN where NaN
    negated_ids = jax.numpy.argsort(-x, axis=-1)[..., :5]
    assert not np.array_equal(negated_ids, jax.lax.top_k(x, 5)[1])  # NaN goes last there
    zeros = jax.numpy.asarray([[-0.0, 0.0, 1.0]])
    assert top_k_by_argsort(zeros, 3)[1].tolist() == [[2, 0, 1]]  # a tie in value, by index
    assert jax.lax.top_k(zeros, 3)[1].tolist() == [[2, 1, 0]]  # +0 first


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sort_column_writing_draws_the_top_k_masks_ids(dtype: str) -> None:
    """Why minGPT's `where(x < jnp.sort(x)[..., -k][..., None], -inf, x)` is a writing of top_k_mask: its k-th is not
    lax.top_k's in a row with a -NaN (the sort counts every NaN among the largest), and then the masks differ, but
    both keep every NaN, so a categorical draws the first NaN and a choice draws from an all-NaN softmax alike."""
    rng = np.random.default_rng(2)
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 1.0, 1.0, -0.0, 0.0], np.float32)
    rows = rng.choice(np.concatenate([specials, rng.standard_normal(16).astype(np.float32)]), size=(96, 24))
    rows[:32] = rng.standard_normal((32, 24))  # and rows with no NaN, where the two k-th are one
    x = jax.numpy.asarray(rows, dtype)
    differ = False
    for k in (1, 4, 9):
        masked, by_sort = mask_top_k(x, k), mask_top_k(x, k, sort_column, same_column)
        np.testing.assert_array_equal(masked[:32], by_sort[:32])
        differ |= not np.array_equal(masked, by_sort)
        for seed in range(4):
            key = jax.random.key(seed)
            np.testing.assert_array_equal(jax.random.categorical(key, by_sort / 0.7),
                                          jax.random.categorical(key, masked / 0.7))
            for replace in (True, False):
                def choice(row: jax.Array, replace: bool = replace, key: jax.Array = key) -> jax.Array:
                    return jax.random.choice(key, row.shape[-1], p=jax.nn.softmax(row), replace=replace)
                np.testing.assert_array_equal(jax.vmap(choice)(by_sort), jax.vmap(choice)(masked))
    assert differ  # (the masks themselves are not one)


def test_negated_argsort_is_lax_top_k_of_a_softmax() -> None:
    """Why argsort(-probs) is a top-k writing for a softmax's probabilities (the rank-space nuclei) though not for
    logits: a softmax row is all NaN or none, and never -0. Rows with ties, -inf, +inf (a NaN row) and NaN."""
    rng = np.random.default_rng(1)
    specials = np.array([np.nan, np.inf, -np.inf, 1.0, 1.0, 0.5, -30.0], np.float32)
    rows = rng.choice(np.concatenate([specials, rng.standard_normal(12).astype(np.float32)]), size=(256, 24))
    probs = jax.nn.softmax(jax.numpy.asarray(rows), axis=-1)
    assert np.isnan(probs).all(axis=-1).any() and not np.isnan(probs).all()  # both kinds of row
    for k in (1, 7, 24):
        want_values, want_ids = jax.lax.top_k(probs, k)
        values, ids = top_k_of_probs_by_negated_argsort(probs, k)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_array_equal(values, want_values)


# The draws from the log-probabilities, by jax.random.choice and by a key per row, each with a filter (and the
# logprobs next to a log_softmax draw: CSE shares the log-softmax of the logits, as it shares a softmax's row
# statistics).
DRAW_CASES = {
    "log_softmax_temperature": SamplerSpec(form="temperature", draw="log_softmax"),
    "log_softmax_categorical_with_logprobs": SamplerSpec(form="categorical", draw="log_softmax", extras=("logprobs",)),
    "log_of_softmax_top_k": SamplerSpec(form="top_k", draw="log_of_softmax", key_kind="typed"),
    "log_of_softmax_top_p_bf16": SamplerSpec(form="top_p_mask", draw="log_of_softmax", dtype="bfloat16"),
    "choice_temperature": SamplerSpec(form="temperature", draw="choice", rows=3),
    "choice_one_row": SamplerSpec(form="temperature", draw="choice", rows=1),
    "choice_min_p_decode_slice": SamplerSpec(form="min_p", draw="choice", batch="bt"),
    "choice_top_k_mask_split_key": SamplerSpec(form="top_k_mask", draw="choice", key_op="split"),
    # torch.multinomial's (B, 1) ids returned as they are (nanoGPT's, the llama reference's `sample_top_p`)
    "choice_unit_ids_classic_top_p": SamplerSpec(form="top_p_mask", top_p_style="classic", draw="choice",
                                                 unit_ids=True),
    "choice_unit_ids_top_k_top_p_in_a_cond": SamplerSpec(form="top_k_top_p_mask", draw="choice", enclosure="cond",
                                                         unit_ids=True),
    "inverse_cdf_unit_ids_min_p_decode_slice": SamplerSpec(form="min_p", draw="inverse_cdf", batch="bt",
                                                           unit_ids=True),
    "row_keys_temperature": SamplerSpec(form="temperature", draw="row_keys", rows=3),
    "row_keys_top_k_rank_space_typed": SamplerSpec(form="top_k", draw="row_keys", key_kind="typed"),
    "row_keys_top_p_mask_fold_in": SamplerSpec(form="top_p_mask", draw="row_keys", key_op="fold_in"),
    "row_keys_min_p_bf16": SamplerSpec(form="min_p", draw="row_keys", dtype="bfloat16"),
    # Hugging Face's generate() steps: its warpers, then softmax and torch.multinomial (choice), 4.x with top-k first
    "choice_hf4_top_k_min_p_by_argsort": SamplerSpec(form="min_p_removal", draw="choice", warper_top_k=True,
                                                     min_p_keep="argsort"),
    "choice_hf_typical_decode_slice": SamplerSpec(form="typical_mask", draw="choice", batch="bt", p=0.5),
    "choice_hf4_top_k_epsilon_traced_t": SamplerSpec(form="epsilon_removal", draw="choice", warper_top_k=True,
                                                     temperature_style="traced"),
    "row_keys_hf_epsilon_bf16": SamplerSpec(form="epsilon_removal", draw="row_keys", dtype="bfloat16"),
    # generate()'s TopP then MinP (5.x), with and without a top-k and a temperature first: fused as min_p_removal,
    # the top-p's sorts left in XLA, until the chain's forms (top_p_min_p_removal)
    "choice_hf_top_p_min_p": SamplerSpec(form="min_p_removal", draw="choice", warper_top_p=True, top_p_style="hf"),
    "choice_hf_top_k_top_p_min_p_ties": SamplerSpec(form="min_p_removal", draw="choice", warper_top_k=True,
                                                    warper_top_p=True, top_p_style="hf", vocab=16, p=0.5),
    "hf_top_p_min_p_traced_t_bf16": SamplerSpec(form="min_p_removal", warper_top_p=True, top_p_style="hf",
                                                temperature_style="traced", dtype="bfloat16"),
    "choice_hf_top_k_top_p_epsilon": SamplerSpec(form="epsilon_removal", draw="choice", warper_top_k=True,
                                                 warper_top_p=True, top_p_style="hf"),
    # jax.random.choice with replacement (its default) and torch.multinomial(replacement=True) through torchax: an
    # inverse-CDF draw, composed with any filter (drawn in a band on the kernel's top candidates where few ids are
    # kept), of one row or per row with one key
    "inverse_cdf_temperature": SamplerSpec(form="temperature", draw="inverse_cdf", rows=3),
    "inverse_cdf_one_row_top_k_mask": SamplerSpec(form="top_k_mask", draw="inverse_cdf", batch="v"),
    "inverse_cdf_top_k_rank_space": SamplerSpec(form="top_k", draw="inverse_cdf"),
    "inverse_cdf_min_p_decode_slice": SamplerSpec(form="min_p", draw="inverse_cdf", batch="bt"),
    "inverse_cdf_hf_top_p": SamplerSpec(form="top_p_mask", draw="inverse_cdf", top_p_style="hf"),
    "inverse_cdf_top_k_top_p_ties": SamplerSpec(form="top_k_top_p_mask", draw="inverse_cdf", vocab=16, p=0.5),
    # the exponential race (gpt-fast, torchtune, vLLM): argmax(softmax(y) / exponential noise), any filter
    "exponential_race_temperature": SamplerSpec(form="temperature", draw="exponential_race"),
    "exponential_race_top_k_mask_decode_slice": SamplerSpec(form="top_k_mask", draw="exponential_race", batch="bt"),
    "exponential_race_min_p": SamplerSpec(form="min_p", draw="exponential_race"),
    "exponential_race_hf_top_p": SamplerSpec(form="top_p_mask", draw="exponential_race", top_p_style="hf"),
}


@pytest.mark.parametrize("spec", [pytest.param(spec, id=name) for name, spec in DRAW_CASES.items()])
def test_other_draw(spec: SamplerSpec) -> None:
    check_program(spec)


# Known gaps: each the smallest program of its family, with the form it should fuse to; the strategy lets
# these families through with the fallback fusion (`sampling_programs.expected`), which is exact. When a
# fix lands the entry XPASSes, which fails the suite: move it to FIXED_GAPS and update `expected`.
KNOWN_GAPS: dict[str, tuple[SamplerSpec, str]] = {}


@pytest.mark.parametrize(("spec", "form"), [pytest.param(*entry, id=name) for name, entry in KNOWN_GAPS.items()])
@pytest.mark.xfail(strict=True, reason="known fusion gap; see the comment on its KNOWN_GAPS entry")
def test_known_gap(spec: SamplerSpec, form: str) -> None:
    fn, specs = build(spec)
    fused = clone_module(jax.jit(fn).lower(*specs).compiler_ir("stablehlo"))
    run_pipeline(fused, "default")
    assert [a.form for a in sample_attrs(fused)] == [form]


@st.composite
def per_sequence_specs(draw: st.DrawFn) -> SamplerSpec:
    """A sampler written for one sequence and vmapped (per_sequence_writable), over small sizes."""
    form = draw(st.sampled_from(["categorical", "temperature", "top_k_mask", "top_p_mask", "top_k_top_p_mask"]))
    spec = SamplerSpec(form=form, vocab=draw(st.sampled_from([16, 64, 100])), batch="b", rows=draw(st.integers(1, 3)),
                       temperature=draw(st.sampled_from([0.5, 0.7, 1.0, 1.3])), k=draw(st.sampled_from([1, 3, 8])),
                       p=draw(st.sampled_from([0.5, 0.9])), per_sequence=draw(st.sampled_from(PER_SEQUENCE)))
    if form == "top_k_mask":
        spec = dataclasses.replace(spec, top_k_style="sort_keep", fill=draw(st.sampled_from(FILLS[:3])))
    if form in USES_TOP_P:
        spec = dataclasses.replace(spec, top_p_style="jax", jax_cut=draw(st.sampled_from(JAX_CUTS)))
    if form == "top_k_top_p_mask":
        spec = dataclasses.replace(spec, top_k_style=draw(st.sampled_from([*MASK_TOP_KS, *SORT_COLUMN_TOP_KS])))
    assert per_sequence_writable(spec), spec
    return spec


@settings(PROFILE, max_examples=max(1, round(PROFILE.max_examples * 0.2)))
@hypothesis_given(per_sequence_specs())
def test_per_sequence_sampler_is_fused_and_draws_the_same_tokens(spec: SamplerSpec) -> None:
    """A sampler written for one sequence's row and vmapped over the batch, with a key per row or the one key (the
    top-k at a sort's k-th, the JAX nuclei, a categorical): its one-row form with that draw, the same ids."""
    check_program(spec)
