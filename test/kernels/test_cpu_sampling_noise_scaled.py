"""Pax's samplers on the CPU (sampling_reference.NOISE_SCALED): the kernel's draw with the noise scaled, argmax(x +
gumbel * T), must be `noise_scaled_draw`'s to the bit, and each form's lowering must give `sample_reference`'s ids,
with no sort or TopK in the compiled program."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlofuse.kernels.cpu import sampling
from hlofuse.kernels.sampling_reference import (
    NOISE_SCALED,
    NOISE_SCALED_ROWS,
    form_params,
    noise_scaled_draw,
    sample_reference,
)

pytestmark = pytest.mark.skipif(not sampling.is_available(), reason="the native CPU sampler is not built")


def _logits(case: str, shape: tuple[int, int] = (6, 3000)) -> jax.Array:
    rng = np.random.default_rng(len(case))
    x = rng.standard_normal(shape).astype(np.float32)
    if case == "wide":
        x *= 4
    elif case == "peaked":
        x *= 12
    elif case == "ties":
        x = np.round(x * 2) / 2
    elif case == "neg_inf":
        x[:, rng.random(shape[-1]) < 0.5] = -np.inf
    elif case == "nan":
        x[1, 17] = np.nan
    return jnp.asarray(x)


CASES = ("wide", "peaked", "ties", "neg_inf", "nan")


@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.0, 2.5])
def test_kernel_draw_with_the_noise_scaled_is_the_programs(temperature: float) -> None:
    """Every case, 3 keys: the kernel's pruning by the scaled noise's bound never drops the winner, and its f32 steps
    (round(gumbel * T), then + x) are the program's."""
    for case in CASES:
        x = _logits(case)
        for seed in range(3):
            key = jnp.array([seed, 5], jnp.uint32)
            np.testing.assert_array_equal(sampling._noise_scaled_by_kernel(key, x, temperature),
                                          noise_scaled_draw(key, x, temperature), err_msg=f"{case} seed {seed}")


# A temperature per row (Pax served by saxml: (B, 1)), 0 among them (that row's greedy token); and rows whose T no
# bound holds for (negative, NaN, infinite), which the lowering leaves to the form's own draw.
ROW_TEMPERATURES = {"fit": [0.7, 0.0, 1.3, 2.5, 0.3, 1e-3], "negative": [0.7, -1.0, 1.3, 2.5, 0.3, 1.0],
                    "nan_inf": [0.7, np.nan, 1.0, np.inf, 0.0, 0.0]}


def test_kernel_draw_with_a_scale_per_row_is_the_programs() -> None:
    """Kernel form 13: each row's noise times its own scale, 0 included, is noise_scaled_draw's with T (B, 1)."""
    t = jnp.asarray(np.array(ROW_TEMPERATURES["fit"], np.float32)[:, None])
    for case in CASES:
        x = _logits(case)
        for seed in range(3):
            key = jnp.array([seed, 5], jnp.uint32)
            np.testing.assert_array_equal(sampling._noise_scaled_by_kernel(key, x, t), noise_scaled_draw(key, x, t),
                                          err_msg=f"{case} seed {seed}")


@pytest.mark.parametrize("form", NOISE_SCALED_ROWS)
@pytest.mark.parametrize("temperatures", list(ROW_TEMPERATURES))
def test_noise_scaled_form_with_a_temperature_per_row_gives_the_reference_ids(form: str, temperatures: str) -> None:
    params = {name: value for name, value in form_params(form, k=40, p=0.9, epsilon=3e-4).items()
              if name != "temperature"}
    lowering = jax.jit(sampling.noise_scaled_lowering(form, params))
    reference = jax.jit(lambda x, key, t: sample_reference(x, key, form=form, **params, rows=(t,)))
    t = jnp.asarray(np.array(ROW_TEMPERATURES[temperatures], np.float32)[:, None])
    for case in CASES:
        x = _logits(case)
        for seed in range(3):
            key = jnp.array([seed, 9], jnp.uint32)
            np.testing.assert_array_equal(lowering(x, key, t), reference(x, key, t), err_msg=f"{case} seed {seed}")
    hlo = lowering.lower(jax.ShapeDtypeStruct((2, 3000), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.uint32),
                         jax.ShapeDtypeStruct((2, 1), jnp.float32)).compile().as_text()
    assert " sort(" not in hlo and "TopK" not in hlo


@pytest.mark.parametrize("form", NOISE_SCALED)
def test_noise_scaled_form_gives_the_reference_ids_with_no_sort(form: str) -> None:
    params = form_params(form, temperature=0.7, k=40, p=0.9, epsilon=3e-4)
    lowering = jax.jit(sampling.noise_scaled_lowering(form, params))
    reference = jax.jit(lambda x, key: sample_reference(x, key, form=form, **params))
    for case in CASES:
        x = _logits(case)
        for seed in range(3):
            key = jnp.array([seed, 9], jnp.uint32)
            np.testing.assert_array_equal(lowering(x, key), reference(x, key), err_msg=f"{case} seed {seed}")
    hlo = lowering.lower(jax.ShapeDtypeStruct((2, 3000), jnp.float32),
                         jax.ShapeDtypeStruct((2,), jnp.uint32)).compile().as_text()
    assert " sort(" not in hlo and "TopK" not in hlo


def test_kernel_refuses_a_scaled_noise_on_bf16_or_without_a_positive_scale() -> None:
    """Pax's noise is f32 cast to the logits' dtype: the kernel draws it in f32 only, and a scale of 0 is no draw."""
    key = jnp.broadcast_to(jnp.array([0, 1], jnp.uint32), (2, 2))
    for x, temperature in ((jnp.zeros((2, 64), jnp.bfloat16), 0.7), (jnp.zeros((2, 64), jnp.float32), 0.0)):
        with pytest.raises(Exception, match="a scaled noise takes f32 logits and a scale > 0"):
            jax.block_until_ready(sampling._sample_call(x, key, jnp.arange(2, dtype=jnp.int32),
                                                        form="categorical_noise_scaled", temperature=temperature,
                                                        k=0, p=1.0, min_p=0.0))


@pytest.mark.parametrize("scale", [-1.0, np.nan, np.inf])
def test_kernel_refuses_a_row_scale_that_bounds_no_noise(scale: float) -> None:
    """A negative, NaN or infinite scale breaks the pruning bound: the binding recomputes such rows, not the kernel."""
    key = jnp.broadcast_to(jnp.array([0, 1], jnp.uint32), (2, 2))
    with pytest.raises(Exception, match="each row's scale must be finite and >= 0"):
        jax.block_until_ready(sampling._sample_call(
            jnp.zeros((2, 64), jnp.float32), key, jnp.arange(2, dtype=jnp.int32),
            scales=jnp.array([0.5, scale], jnp.float32), form="categorical_noise_scaled_rows", temperature=1.0, k=0,
            p=1.0, min_p=0.0))
