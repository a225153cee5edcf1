"""Rows that tell whether a kernel's greedy_softmax (argmax(softmax(x))) is certified where it must be, shared by
the CPU, Pallas and NKI sampler tests."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hlofuse.kernels.sampling_reference import sample_reference


def _max_and_next_below(value: float, dtype: Any) -> tuple[float, float]:  # noqa: ANN401
    """`value` in `dtype` and the next value of that dtype below it (as f32): so close that the softmax's
    exp(x - max) rounds to 1 for both."""
    top = np.asarray(value, jnp.dtype(dtype))
    bits = top.view(np.uint16 if top.itemsize == 2 else np.uint32)
    return float(top), float((bits - 1).astype(bits.dtype).view(top.dtype))


def tie_rows(dtype: Any, margin: float) -> jax.Array:  # noqa: ANN401
    """(6, 300) logits in `dtype`, the max 4.0 at index 10 unless said:
    0: a token 2 * margin below the max: clear, the kernel's own answer (10);
    1: 0.01 at 10 and the next value below it at 5: the softmax ties them and the program picks 5;
    2: an exact copy of the max at 5: the first copy wins in both, certified (5);
    3, 4: a NaN, a +inf: the softmax is NaN;
    5: all -inf: the softmax is NaN, whose argmax is 0, as argmax(x): certified (0)."""
    rows = np.zeros((6, 300), np.float32)
    rows[:, 10] = 4.0
    rows[0, 200] = 4.0 - 2 * margin
    rows[1, 10], rows[1, 5] = _max_and_next_below(0.01, dtype)
    rows[2, 5] = 4.0
    rows[3, 7], rows[4, 9], rows[5] = np.nan, np.inf, -np.inf
    return jnp.asarray(rows, jnp.dtype(dtype))


def check_certified(raw: Any, uncertified: int, x: jax.Array, tokens: Any) -> None:  # noqa: ANN401
    """`raw`: the kernel's own ids for `tie_rows` (rows 1, 3, 4 left uncertified); `tokens`: the sampler's, with
    the program's softmax for those rows, which must be the reference's."""
    raw = np.asarray(raw)
    assert raw[0] == 10 and raw[2] == 5 and raw[5] == 0 and (raw[[1, 3, 4]] == uncertified).all(), raw
    want = np.asarray(sample_reference(x, None, form="greedy_softmax"))
    assert list(want[:3]) == [10, 5, 5]
    np.testing.assert_array_equal(np.asarray(tokens), want)
