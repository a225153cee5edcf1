"""gemma_pytorch's sampler on the CPU (sampling.py "gemma_pytorch's sampler"): the kernel's top candidates, or its
radix sort, in place of the program's two sorts, and the program's own inverse-CDF draw on the array they rebuild.

The ids must be the program's (`sorted_probs_inverse_cdf_rows`, XLA's sorts) for every key: on ordinary rows, on rows
of ties (equal probabilities straddling the top-k or top-p cut, where only XLA's unstable sort knows which id is
kept), with -inf logits, and with a k and a p per row that put the cut inside or past the kernel's candidates. Each
path must also vouch for the rows it is meant for, or the fallback would be all that is tested."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlofuse.kernels.cpu import sampling
from hlofuse.kernels.sampling_reference import FORMS, UNCERTIFIED, probs_of_rows

pytestmark = pytest.mark.skipif(not sampling.is_available(), reason="the native CPU sampler is not built")

FORM = "sorted_probs_inverse_cdf_rows"
ROWS, VOCAB = 4, 2048
KEYS = 6


def _logits(kind: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((ROWS, VOCAB)).astype(np.float32)
    if kind == "peaked":
        x *= 6
    elif kind == "ties":  # a coarse grid: runs of equal probabilities, at the cut too
        x = np.round(x * 2) / 2
    elif kind == "with_inf":
        x[:, rng.random(VOCAB) < 0.3] = -np.inf
    return x.astype(np.float32)


def _params(setting: str) -> dict[str, jax.Array]:
    """gemma_pytorch's defaults (top-k 64 inside the candidates), a nucleus alone (k = V), and mixed rows."""
    temperature, p, k = {"defaults": ([1.0] * ROWS, [0.95] * ROWS, [64] * ROWS),
                         "nucleus": ([0.7] * ROWS, [0.9] * ROWS, [VOCAB] * ROWS),
                         "mixed": ([0.5, 1.0, 1.5, 0.8], [0.5, 0.99, 0.8, 1.0], [1, 200, VOCAB, 300])}[setting]
    return {"temperature": jnp.array(temperature, jnp.float32), "p": jnp.array(p, jnp.float32),
            "k": jnp.array(k, jnp.int32)}


@pytest.mark.parametrize("setting", ["defaults", "nucleus", "mixed"])
@pytest.mark.parametrize("kind", ["normal", "peaked", "ties", "with_inf"])
def test_lowering_gives_the_programs_ids(kind: str, setting: str) -> None:
    params = _params(setting)
    lowered = jax.jit(sampling.inverse_cdf_rows_lowering(FORM, {}))
    program = jax.jit(lambda x, key, **rows: FORMS[FORM].fn(x, key, **rows))
    logits = jnp.asarray(_logits(kind, seed=len(kind) * 7 + len(setting)))
    for seed in range(KEYS):
        key = jax.random.key_data(jax.random.key(seed))
        want = program(logits, key, **params)
        got = lowered(logits, key, params["temperature"], params["p"], params["k"])
        np.testing.assert_array_equal(got, want, err_msg=f"{kind} {setting} key {seed}")


def _drawn(kind: str, setting: str, candidates: int | None) -> tuple[np.ndarray, np.ndarray]:
    params = _params(setting)
    logits = jnp.asarray(_logits(kind, seed=3))
    probs = probs_of_rows(logits, params["temperature"])
    key = jax.random.key_data(jax.random.key(11))
    got = jax.jit(sampling.inverse_cdf_rows_drawn, static_argnums=4)(probs, key, params["p"], params["k"], candidates)
    return np.asarray(got), np.asarray(FORMS[FORM].fn(logits, key, **params))


@pytest.mark.parametrize("kind", ["normal", "peaked"])
def test_candidates_vouch_for_a_top_k_inside_them(kind: str) -> None:
    got, want = _drawn(kind, "defaults", sampling.INVERSE_CDF_CANDIDATES)
    np.testing.assert_array_equal(got, want)


def test_candidates_leave_a_wide_nucleus_to_the_sorted_row() -> None:
    got, _ = _drawn("normal", "nucleus", sampling.INVERSE_CDF_CANDIDATES)
    assert np.all(got == UNCERTIFIED)
    got, want = _drawn("normal", "nucleus", None)
    np.testing.assert_array_equal(got, want)


def test_ties_across_the_cut_are_left_to_the_program() -> None:
    # the 2nd and 3rd largest probabilities equal, k = 2: which of their ids is kept is XLA's sort's alone
    logits = np.zeros((ROWS, VOCAB), np.float32)
    logits[:, 10] = 5.0
    logits[:, [20, 30]] = 4.0
    params = {"temperature": jnp.ones(ROWS), "p": jnp.ones(ROWS), "k": jnp.full(ROWS, 2, jnp.int32)}
    probs = probs_of_rows(jnp.asarray(logits), params["temperature"])
    key = jax.random.key_data(jax.random.key(0))
    for candidates in (sampling.INVERSE_CDF_CANDIDATES, None):
        got = sampling.inverse_cdf_rows_drawn(probs, key, params["p"], params["k"], candidates)
        assert np.all(np.asarray(got) == UNCERTIFIED), candidates
    lowered = sampling.inverse_cdf_rows_lowering(FORM, {})(jnp.asarray(logits), key, *params.values())
    np.testing.assert_array_equal(lowered, FORMS[FORM].fn(jnp.asarray(logits), key, **params))
