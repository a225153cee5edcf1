"""The native CPU sampler against the reference forms: equal token ids over distributions, keys and sizes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from hlofuse.kernels.cpu import sampling
from hlofuse.kernels.sampling_reference import sample_reference

pytestmark = pytest.mark.skipif(not sampling.is_available(), reason="the native CPU kernels are not built")

PARAMS = {"greedy": {}, "categorical": {}, "temperature": {"temperature": 0.7},
          "top_k": {"temperature": 0.6, "k": 40}, "temperature_top_k": {"temperature": 1.3, "k": 7},
          "top_k_mask": {"temperature": 0.8, "k": 50}, "top_p_mask": {"temperature": 0.7, "p": 0.9},
          "top_k_top_p_mask": {"temperature": 0.6, "k": 64, "p": 0.8}, "min_p": {"temperature": 0.9, "min_p": 0.05}}


def _logits(kind: str, shape: tuple[int, int], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    if kind == "peaked":
        x *= 8
    elif kind == "ties":
        x = np.round(x * 2) / 2
    elif kind == "neg_inf":
        x[rng.random(shape) < 0.5] = -np.inf
    elif kind == "flat":
        x[:] = 0
    return x


@pytest.mark.parametrize("form", sorted(PARAMS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kernel_matches_reference(form: str, dtype: str) -> None:
    if dtype == "bfloat16" and form in sampling.BF16_UNSUPPORTED:
        pytest.skip("bf16 probabilities are not reproduced")
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    params = PARAMS[form]
    ref = jax.jit(lambda x, key: sample_reference(x, key, form=form, **params))
    ker = jax.jit(lambda x, key: sampling.sample(x, key, form=form, **params))
    for shape in ((3, 1000), (1, 4099)):
        for kind in ("normal", "peaked", "ties", "neg_inf", "flat"):
            for seed in range(3):
                x = jnp.asarray(_logits(kind, shape, seed).astype(np_dtype))
                key = jnp.array([seed * 7919, 12345 + seed], jnp.uint32)
                np.testing.assert_array_equal(ker(x, key), ref(x, key), err_msg=f"{kind} {shape} seed {seed}")


def test_bf16_noise_is_exact_for_every_random_byte() -> None:
    """bf16 Gumbel noise has 128 values; with flat logits the winner is the first token of the largest."""
    x = jnp.zeros((64, 512), jnp.bfloat16)
    for seed in range(4):
        key = jnp.array([seed, 99], jnp.uint32)
        np.testing.assert_array_equal(sampling.sample(x, key, form="categorical"),
                                      sample_reference(x, key, form="categorical"))


@pytest.mark.parametrize("form", sorted(PARAMS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rows_split_across_threads_match_reference(form: str, dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fewer rows than threads and a vocabulary of several 32768-token chunks: each row's chunks run on the
    pool and combine in chunk order. The ids must be the reference's, and the same with the split off."""
    if dtype == "bfloat16" and form in sampling.BF16_UNSUPPORTED:
        pytest.skip("bf16 probabilities are not reproduced")
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    params = PARAMS[form]
    ref = jax.jit(lambda x, key: sample_reference(x, key, form=form, **params))
    ker = jax.jit(lambda x, key: sampling.sample(x, key, form=form, **params))
    for shape in ((1, 100_003), (2, 70_000)):
        for kind, seed in (("normal", 0), ("peaked", 1), ("ties", 2), ("neg_inf", 3)):
            x = jnp.asarray(_logits(kind, shape, seed).astype(np_dtype))
            key = jnp.array([seed * 31, 777 + seed], jnp.uint32)
            want = np.asarray(ref(x, key))
            np.testing.assert_array_equal(np.asarray(ker(x, key)), want, err_msg=f"{kind} {shape} split")
            with monkeypatch.context() as env:
                env.setenv("HLOFUSE_SAMPLE_NO_SPLIT", "1")
                np.testing.assert_array_equal(np.asarray(ker(x, key)), want, err_msg=f"{kind} {shape} unsplit")
