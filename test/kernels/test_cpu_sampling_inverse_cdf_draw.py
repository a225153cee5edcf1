"""The inverse-CDF draw composed with any filter on the CPU (sampling.py `inverse_cdf_in_band`): jax.random.choice of
softmax(y) with replacement, of one row or per row of a batch with one key (torch.multinomial with replacement under
torchax), decided in a band on the kernel's top candidates of the filtered probabilities.

The ids must be the draw's own (`sampling_reference.inverse_cdf_draw`, XLA's cumsum and search) for every key: after a
top-k that keeps few ids (the band), after one that keeps more than the candidates and with no filter at all (the
draw's own ops), on ties, peaked rows and -inf logits, for (B, V) and (V,). The band must vouch for most rows it is
meant for, or the fallback would be all that is tested."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlofuse.kernels.cpu import sampling
from hlofuse.kernels.sampling_reference import UNCERTIFIED, inverse_cdf_draw

pytestmark = pytest.mark.skipif(not sampling.is_available(), reason="the native CPU sampler is not built")

ROWS, VOCAB = 4, 2048
KEYS = 12


def _filtered(kind: str, kept: int | None, shape: tuple[int, ...], seed: int) -> jax.Array:
    """Logits of `kind` with all but their `kept` largest per row set to -inf (None: every id kept)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    if kind == "peaked":
        x *= 6
    elif kind == "ties":
        x = np.round(x * 2) / 2
    elif kind == "with_inf":
        x[..., rng.random(shape[-1]) < 0.3] = -np.inf
    if kept is not None:
        kth = -np.sort(-x, axis=-1)[..., kept - 1 : kept]
        x = np.where(x < kth, -np.inf, x)
    return jnp.asarray(x.astype(np.float32))


@pytest.mark.parametrize("shape", [(ROWS, VOCAB), (VOCAB,)], ids=["rows", "one_row"])
@pytest.mark.parametrize("kept", [40, 1000, None], ids=["top_40", "top_1000", "all"])
@pytest.mark.parametrize("kind", ["normal", "peaked", "ties", "with_inf"])
def test_kernel_draw_gives_the_draws_ids(kind: str, kept: int | None, shape: tuple[int, ...]) -> None:
    y = _filtered(kind, kept, shape, seed=len(kind) + (kept or 0))
    lowered = jax.jit(sampling._inverse_cdf_by_kernel)
    own = jax.jit(lambda key, y: inverse_cdf_draw(None, key, y))
    for seed in range(KEYS):
        key = jax.random.key_data(jax.random.key(seed))
        np.testing.assert_array_equal(lowered(key, y), own(key, y), err_msg=f"{kind} key {seed}")


@pytest.mark.parametrize("kind", ["normal", "peaked", "with_inf"])
def test_band_vouches_for_a_few_kept_ids_only(kind: str) -> None:
    band = jax.jit(sampling.inverse_cdf_in_band)
    few, many = _filtered(kind, 40, (ROWS, VOCAB), seed=1), _filtered(kind, 1000, (ROWS, VOCAB), seed=1)
    vouched = 0
    for seed in range(KEYS):
        key = jax.random.key_data(jax.random.key(seed))
        got = np.asarray(band(key, few))
        sure = got != UNCERTIFIED
        np.testing.assert_array_equal(got[sure], np.asarray(inverse_cdf_draw(None, key, few))[sure])
        vouched += int(sure.sum())
        assert np.all(np.asarray(band(key, many)) == UNCERTIFIED)  # mass past the candidates: the draw's own ops
    assert vouched >= 0.9 * KEYS * ROWS, vouched


def test_nan_rows_are_the_draws_own() -> None:
    y = _filtered("normal", 40, (ROWS, VOCAB), seed=2).at[1, 7].set(jnp.nan)
    key = jax.random.key_data(jax.random.key(0))
    assert np.asarray(sampling.inverse_cdf_in_band(key, y))[1] == UNCERTIFIED
    np.testing.assert_array_equal(sampling._inverse_cdf_by_kernel(key, y), inverse_cdf_draw(None, key, y))
