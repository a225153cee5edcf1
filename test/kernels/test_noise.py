"""hlofuse.kernels.noise: JAX's Gumbel noise at chosen counters is jax.random's, bit for bit."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlofuse.kernels import noise


def _bits(x: jax.Array) -> np.ndarray:
    return np.asarray(x.astype(jnp.float32)).view(np.uint32)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rows_of_the_whole_batch_noise(dtype: Any) -> None:  # noqa: ANN401
    key = jnp.asarray([2**31 + 7, 99], jnp.uint32)
    whole = jax.random.gumbel(key, (24, 333), dtype)
    for offset, shape in ((0, (24, 333)), (5, (4, 333)), (20, (2, 2, 333)), (23, (333,))):
        rows = int(np.prod(shape[:-1]))
        got = jax.jit(lambda k, o, shape=shape: noise.gumbel_at_rows(k, shape, dtype, o))(key, offset)
        assert got.shape == shape and got.dtype == dtype
        np.testing.assert_array_equal(_bits(got.reshape(-1, 333)), _bits(whole[offset:offset + max(rows, 1)]),
                                      err_msg=f"rows from {offset}, shape {shape}")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_categorical_at_rows_is_categorical_of_the_whole_batch(dtype: Any) -> None:  # noqa: ANN401
    logits = jnp.asarray(np.random.default_rng(3).standard_normal((16, 500)), dtype)
    logits = logits.at[3, 40].set(jnp.nan).at[9].set(-jnp.inf)  # NaN wins; an all -inf row picks id 0
    for seed in range(4):
        key = jax.random.key_data(jax.random.PRNGKey(seed))
        want = jax.random.categorical(key, logits, axis=-1)
        for offset, rows in ((0, 16), (3, 5), (8, 8)):
            got = noise.categorical_at_rows(offset)(key, logits[offset:offset + rows], axis=-1)
            np.testing.assert_array_equal(got, want[offset:offset + rows], err_msg=f"seed {seed} rows {offset}")


def test_other_dtypes_and_axes_are_refused() -> None:
    key = jnp.zeros((2,), jnp.uint32)
    with pytest.raises(ValueError, match="f32 or bf16"):
        noise.gumbel_at_rows(key, (2, 8), jnp.float16, 0)
    with pytest.raises(ValueError, match="last axis"):
        noise.categorical_at_rows(0)(key, jnp.zeros((4, 8)), axis=0)
