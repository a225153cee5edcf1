"""The CPU lowering of the forms with another draw (`<form>_log_softmax`, `_log_of_softmax`, `_choice`, `_row_keys`):
the form's function with the kernel as its categorical must give `sample_reference`'s ids exactly."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlofuse.kernels.cpu import sampling
from hlofuse.kernels.sampling_reference import FORMS, form_params, prelude_of, sample_reference
from hlofuse.kernels.target import CompositeCall

# (per-row forms: their own test; a form with log-probabilities in front, `<form>_of_log_probs`, is its inner form's
# kernel on the program's log_softmax: test_a_prelude_form_is_its_inner_kernel_on_the_programs_normalization)
DRAWN = [name for name, form in FORMS.items() if form.base and not form.row_params and not form.prelude_of]
DRAWS = ("log_softmax", "log_of_softmax", "choice", "row_keys", "same_key_rows", "inverse_cdf", "exponential_race")
BASES = [name for name, form in FORMS.items()
         if form.stochastic and not form.base and form.draw == "argmax" and form.composes_draws and not form.prelude_of]
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}
PARAMS = {"temperature": 0.7, "k": 5, "p": 0.8, "min_p": 0.1}
# Every base form with two draws, one per dtype, and every draw with two fifths of the bases: a Latin-square slice of
# the product (each draw is one kernel categorical under the base's own function, whatever the base).
# HYPOTHESIS_PROFILE=thorough runs the whole product.
if os.environ.get("HYPOTHESIS_PROFILE") == "thorough":
    SLICE = [(base, draw, dtype) for base in BASES for draw in DRAWS for dtype in DTYPES]
else:
    SLICE = [(base, DRAWS[(i + 2 * j) % len(DRAWS)], dtype)
             for i, base in enumerate(BASES) for j, dtype in enumerate(DTYPES)]
CASES = [(f"{base}_{draw}", dtype) for base, draw, dtype in SLICE]

pytestmark = pytest.mark.skipif(not sampling.is_available(), reason="the native CPU sampler is not built")


def _logits(rows: int, vocab: int, case: str, dtype: jnp.dtype) -> jax.Array:
    rng = np.random.default_rng(vocab + rows)
    x = rng.standard_normal((rows, vocab)).astype(np.float32) * 3
    if case == "ties":
        x = np.round(x)
    elif case == "neg_inf":
        x[:, rng.random(vocab) < 0.4] = -np.inf
    elif case == "flat":
        x[:] = 0
    elif case == "nan":  # a NaN logit: every draw takes the first NaN (argmax), the kernel's categorical too
        x[0, 11] = np.nan
    return jnp.asarray(x, dtype)


@pytest.mark.parametrize(("form", "dtype_name"), CASES, ids=[f"{form}-{dtype}" for form, dtype in CASES])
def test_drawn_form_gives_the_reference_ids(form: str, dtype_name: str) -> None:
    dtype = DTYPES[dtype_name]
    params = form_params(form, **PARAMS)
    kernel = jax.jit(sampling.drawn_form_lowering(form, params))
    reference = jax.jit(lambda x, key: sample_reference(x, key, form=form, **params))
    for case in ("normal", "ties", "neg_inf", "flat", "nan"):
        logits = _logits(3, 700, case, dtype)
        for seed in range(4):
            key = jnp.array([seed, 99 + seed], jnp.uint32)
            if FORMS[form].row_keys:  # a key per row (row 1 shares row 0's: the same noise, other logits)
                key = jnp.array([[seed, 99 + seed], [seed, 99 + seed], [7 * seed + 1, 5]], jnp.uint32)
            np.testing.assert_array_equal(kernel(logits, key), reference(logits, key), err_msg=f"{case} seed {seed}")


def test_every_draw_composes_with_every_stochastic_form() -> None:
    assert {f"{base}_{draw}" for base in BASES for draw in DRAWS} == set(DRAWN)
    # the slice tests every base and every draw, each draw in both dtypes
    assert {base for base, _, _ in SLICE} == set(BASES) and {form for form, _ in CASES} <= set(DRAWN)
    assert {(draw, dtype) for _, draw, dtype in SLICE} == {(draw, dtype) for draw in DRAWS for dtype in DTYPES}


# One form of each kind of lowering behind a prelude: the categorical kernel, a filter the kernel runs, a draw by
# the program's function with the kernel's top-k, the searched filters, and a search with per-row T, k and p.
PRELUDE_FORMS = ["categorical_of_log_probs", "top_k_top_p_mask_of_log_probs", "top_k_log_softmax_of_log_probs",
                 "searched_top_k_top_p_of_log_probs", "threshold_search_rows_of_log_probs"]
ROW_VALUES = {"temperature": jnp.asarray([0.7, 1.0, 0.3], jnp.float32), "k": jnp.asarray([5, 1, 40], jnp.int32),
              "p": jnp.asarray([0.8, 1.0, 0.5], jnp.float32)}


@pytest.mark.parametrize("form", PRELUDE_FORMS)
def test_a_prelude_form_is_its_inner_kernel_on_the_programs_normalization(form: str) -> None:
    """sampling_lowering of `<inner>_of_log_probs` gives the reference's ids, a NaN row included (its log_softmax is
    NaN throughout, unlike the logits the inner form's own tests draw from)."""
    assert prelude_of(form) is not None
    params = form_params(form, **PARAMS)
    rows, vocab = 3, 700
    operands = [((rows, vocab), "f32"), ((2,), "ui32")]
    row_values = [ROW_VALUES[name] for name in FORMS[form].row_params]
    operands += [((rows,), "i32" if value.dtype == jnp.int32 else "f32") for value in row_values]
    call = CompositeCall("hlofuse.sample", 1, {"mode": FORMS[form].mode, "form": form, **params}, tuple(operands))
    kernel = jax.jit(sampling.sampling_lowering(call))
    reference = jax.jit(lambda x, key, *rows: sample_reference(x, key, form=form, **params, rows=rows))
    for case in ("normal", "ties", "neg_inf", "nan"):
        logits = _logits(rows, vocab, case, jnp.float32)
        for seed in range(3):
            key = jnp.array([seed, 99 + seed], jnp.uint32)
            np.testing.assert_array_equal(kernel(logits, key, *row_values), reference(logits, key, *row_values),
                                          err_msg=f"{case} seed {seed}")
