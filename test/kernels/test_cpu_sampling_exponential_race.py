"""The exponential race on the CPU (sampling.py, "the exponential race"): the kernel's random bits are
jax.random.bits', and the race drawn from them takes the program's ids, the rare uniform of 0 included."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlofuse.kernels.cpu import sampling
from hlofuse.kernels.sampling_reference import UNCERTIFIED, exponential_race_draw, form_params, sample_reference

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


#===--- the race of a nucleus, drawn in its band ---------------------------------------------------===#
# A top-p filter then the race (vLLM's sampler) is drawn among the tokens at or above the nucleus's band, with no sort
# (sampling.race_in_band); only a batch the band cannot vouch for takes the sorted row.
TOP_P_RACES = ("top_p_mask_exponential_race", "top_k_top_p_mask_exponential_race",
               "top_p_ascending_mask_exponential_race", "top_k_top_p_ascending_mask_exponential_race")


def _band_of(form: str, x: jax.Array) -> tuple[np.ndarray, np.ndarray]:
    """The whole row's nucleus band (lo, hi) that the form's lowering draws in (p = 0.9)."""
    lo, hi = sampling.nucleus_band(x, 0.9, from_below="ascending" in form, by_place="ascending" in form)
    return np.asarray(lo), np.asarray(hi)


def _zero_noise_in_each_place(form: str, in_band: bool) -> tuple[jax.Array, jax.Array]:
    """ZERO_KEY's logits with its zero-noise ids placed: row 29's far above the band (kept: inf), and row 8's far
    below it (dropped: NaN, which argmax takes) or, `in_band`, at the band's floor (the program may keep it or not:
    the band cannot tell)."""
    x, key = _zero_noise_logits()
    x = np.array(x)
    x[ZEROS[0]], x[ZEROS[1]] = -30.0, 30.0
    if in_band:
        x[ZEROS[0]] = _band_of(form, jnp.asarray(x))[0][ZEROS[0][0]]
    return jnp.asarray(x), key


@pytest.mark.parametrize("form", TOP_P_RACES)
def test_top_p_race_takes_the_programs_ids_with_noise_of_zero(form: str) -> None:
    params = form_params(form, temperature=0.7, k=50, p=0.9)
    lowering = sampling.top_p_ascending_lowering if "ascending" in form else sampling.drawn_form_lowering
    kernel = jax.jit(lowering(form, params))
    reference = jax.jit(lambda x, key: sample_reference(x, key, form=form, **params))
    for in_band in (False, True):
        x, key = _zero_noise_in_each_place(form, in_band)
        np.testing.assert_array_equal(kernel(x, key), reference(x, key), err_msg=f"in band: {in_band}")


def test_race_in_band_vouches_only_where_the_program_must_agree() -> None:
    """Where the zero-noise id is surely dropped or surely kept the band's draw is the program's; in the band it is
    UNCERTIFIED, as is the row with a NaN (3)."""
    form = "top_p_mask_exponential_race"
    race = jax.jit(sampling.race_in_band, static_argnums=4)
    for in_band in (False, True):
        x, key = _zero_noise_in_each_place(form, in_band)
        lo, hi = (jnp.asarray(b) for b in _band_of(form, x))
        got = np.asarray(race(x, key, lo, hi, 0.7))
        want = np.asarray(sample_reference(x, key, form=form, **form_params(form, temperature=0.7, p=0.9)))
        assert got[ZEROS[1][0]] == ZEROS[1][1] and got[3] == UNCERTIFIED
        assert got[ZEROS[0][0]] == (UNCERTIFIED if in_band else ZEROS[0][1])
        vouched = got != UNCERTIFIED
        assert np.sum(vouched) >= 28
        np.testing.assert_array_equal(got[vouched], want[vouched])


@pytest.mark.parametrize("form", TOP_P_RACES)
def test_few_top_p_races_are_left_to_the_sorted_row(form: str) -> None:
    """On ordinary rows (3 N(0, 1) logits) the band vouches for nearly every draw, each the program's: the sort runs
    for few batches. At most 2 of 64 rows (a noise of 0, 2^-23 per id, lands in a 32000-id row's band rarely)."""
    params = form_params(form, temperature=0.7, k=50, p=0.9)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((64, 32000)).astype(np.float32) * 3)
    draw = jax.jit(lambda x, key: _band_draw(form, x, key, params))
    reference = jax.jit(lambda x, key: sample_reference(x, key, form=form, **params))
    uncertified = 0
    for seed in range(2):
        key = jnp.array([seed, 11], jnp.uint32)
        got, want = np.asarray(draw(x, key)), np.asarray(reference(x, key))
        vouched = got != UNCERTIFIED
        np.testing.assert_array_equal(got[vouched], want[vouched])
        uncertified += int(np.sum(~vouched))
    assert uncertified <= 2, f"{uncertified} of 128 draws left to the sorted row"


def _band_draw(form: str, x: jax.Array, key: jax.Array, params: dict) -> jax.Array:
    """The form's draw in its band, UNCERTIFIED where the band cannot vouch for it."""
    from_below = "ascending" in form
    return sampling.nucleus_draw_in_band("exponential_race", x, key, params, params["k"] if "top_k" in form else None,
                                         from_below=from_below, by_place=from_below)
