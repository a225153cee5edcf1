"""The CPU lowering of the forms with another draw (`<form>_log_softmax`, `_log_of_softmax`, `_choice`, `_row_keys`):
the form's function with the kernel as its categorical must give `sample_reference`'s ids exactly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlofuse.kernels.cpu import sampling
from hlofuse.kernels.sampling_reference import FORMS, form_params, sample_reference

DRAWN = [name for name, form in FORMS.items() if form.base and not form.row_params]  # (per-row forms: their own test)
PARAMS = {"temperature": 0.7, "k": 5, "p": 0.8, "min_p": 0.1}

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


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("form", DRAWN)
def test_drawn_form_gives_the_reference_ids(form: str, dtype: jnp.dtype) -> None:
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
    bases = [name for name, form in FORMS.items()
             if form.stochastic and not form.base and form.draw == "argmax" and form.composes_draws]
    draws = ("log_softmax", "log_of_softmax", "choice", "row_keys", "same_key_rows")
    assert {f"{base}_{draw}" for base in bases for draw in draws} == set(DRAWN)
