"""Inputs and the jitted reference shared by the attention kernel tests (CPU, Pallas, Mosaic GPU)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hlofuse.kernels.reference import attention_reference


def attention_inputs(seed: int, b: int, t: int, s: int, n: int, kv: int, h: int, d: int,
                     dtype: Any) -> tuple[jax.Array, ...]:  # noqa: ANN401
    """q (B, T, N, H), k (B, S, K, H), v (B, S, K, D): standard normal f32 draws, cast to `dtype`."""
    rng = np.random.default_rng(seed)
    return tuple(
        jnp.asarray(rng.standard_normal(shape, np.float32), dtype)
        for shape in ((b, t, n, h), (b, s, kv, h), (b, s, kv, d))
    )


@functools.partial(jax.jit, static_argnames=("kw",))
def jitted_reference(q: jax.Array, k: jax.Array, v: jax.Array, extra: dict[str, jax.Array],
                     kw: Any) -> jax.Array:  # noqa: ANN401
    """attention_reference with the static attributes `kw` (a hashable tuple of items) and array operands `extra`."""
    return attention_reference(q, k, v, **dict(kw), **extra)
