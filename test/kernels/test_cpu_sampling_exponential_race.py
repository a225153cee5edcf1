"""The exponential race on the CPU (sampling.py, "the exponential race"): the kernel's random bits are
jax.random.bits', and the race drawn from them takes the program's ids, the rare uniform of 0 included."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlofuse.kernels.cpu import sampling
from hlofuse.kernels.sampling_reference import exponential_race_draw, form_params, sample_reference

pytestmark = pytest.mark.skipif(not sampling.is_available(), reason="the native CPU sampler is not built")

# A key whose (32, 131072) noise has a uniform of exactly 0 (bits >> 9 == 0, 2^-23 per id) at these (row, id):
# found by searching keys [seed, 2026] (the test checks it still holds).
ZERO_KEY = (1, 2026)
ZERO_SHAPE = (32, 131072)
ZEROS = ((8, 99525), (29, 97317))


@pytest.mark.parametrize("shape", [(1, 4096), (3, 1000), (1000,), (2, 3, 77), (2, 70001), (5, 16)])
def test_noise_bits_are_jax_random_bits(shape: tuple[int, ...]) -> None:
    kernel = jax.jit(sampling.noise_bits, static_argnums=1)
    for seed in range(3):
        key = jnp.array([seed, 40 + seed], jnp.uint32)
        want = jax.random.bits(jax.random.wrap_key_data(key), shape, jnp.uint32)
        np.testing.assert_array_equal(kernel(key, shape), want, err_msg=f"seed {seed}")


def _zero_noise_logits() -> tuple[jax.Array, jax.Array]:
    """Logits for ZERO_KEY's noise: row 8's zero-noise id dropped (-inf: p = 0, so p / q = 0 / 0 = NaN, which argmax
    takes), row 29's kept (p / 0 = inf), and a NaN logit in row 3 (every probability NaN: id 0)."""
    key = jnp.array(ZERO_KEY, jnp.uint32)
    bits = np.asarray(jax.random.bits(jax.random.wrap_key_data(key), ZERO_SHAPE, jnp.uint32))
    assert [tuple(z) for z in np.argwhere((bits >> 9) == 0)] == list(ZEROS)
    x = np.random.default_rng(0).standard_normal(ZERO_SHAPE).astype(np.float32) * 3
    x[ZEROS[0]] = -np.inf
    x[3, 500] = np.nan
    return jnp.asarray(x), key


def test_race_takes_the_uniform_of_zero_as_the_program_does() -> None:
    x, key = _zero_noise_logits()
    kernel = jax.jit(sampling._exponential_race_by_kernel)
    reference = jax.jit(lambda key, y: exponential_race_draw(None, key, y))
    got = np.asarray(kernel(key, x))
    np.testing.assert_array_equal(got, reference(key, x))
    assert got[ZEROS[0][0]] == ZEROS[0][1] and got[ZEROS[1][0]] == ZEROS[1][1] and got[3] == 0


@pytest.mark.parametrize("form", ["top_k_mask_exponential_race", "min_p_exponential_race",
                                  "temperature_exponential_race"])
def test_filtered_race_takes_the_programs_ids(form: str) -> None:
    """A filter drops the zero-noise ids (a NaN each, the first of which argmax takes) or keeps them (an inf)."""
    x, key = _zero_noise_logits()
    params = form_params(form, temperature=0.7, k=50, min_p=0.05)
    kernel = jax.jit(sampling.drawn_form_lowering(form, params))
    reference = jax.jit(lambda x, key: sample_reference(x, key, form=form, **params))
    np.testing.assert_array_equal(kernel(x, key), reference(x, key))
    for seed in range(3):  # and keys of no zero
        other = jnp.array([seed, 7], jnp.uint32)
        np.testing.assert_array_equal(kernel(x[:4], other), reference(x[:4], other), err_msg=f"seed {seed}")
