"""JAX's Gumbel noise at chosen counters: the noise `jax.random.categorical` draws, element by element.

`jax.random.gumbel(key, shape, dtype)` (threefry2x32, partitionable counters) gives element i of the
row-major flattened array the random bits of counter i, then turns them into a float with a fixed
sequence of f32 ops, rounded to the dtype after each. Computing those bits and floats from the counters
themselves lets a kernel, or a shard of a batch, draw exactly the noise the whole array would hold at its
own elements: the Pallas samplers compute it inside the kernel (`threefry_bits`, `gumbel`), and a shard
of rows draws its rows of the whole batch's noise (`gumbel_at_rows`, `categorical_at_rows`).

Only f32 and bf16 noise, and counters below 2**32 (the high word of the counter is 0).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

MAX_COUNTER = 2**32
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))

_TINY = float(np.finfo(np.float32).tiny)  # == finfo(bfloat16).tiny
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.int32(0x1BD11BDA)


def _rotl(x: jax.Array, r: int) -> jax.Array:
    return lax.shift_left(x, np.int32(r)) | lax.shift_right_logical(x, np.int32(32 - r))


def threefry_bits(k0: jax.Array, k1: jax.Array, counter: jax.Array) -> jax.Array:
    """JAX's random bits at flat index `counter` (< 2**32) under key (k0, k1): threefry2x32 of the counter
    (hi = 0, lo = counter), out0 ^ out1. int32 arithmetic wraps like uint32."""
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0 = jnp.zeros_like(counter) + ks[0]
    x1 = counter + ks[1]
    for block in range(5):
        for r in _ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = _rotl(x1, r) ^ x0
        x0 = x0 + ks[(block + 1) % 3]
        x1 = x1 + ks[(block + 2) % 3] + np.int32(block + 1)
    return x0 ^ x1


def _rounded(x: jax.Array, bf16: bool) -> jax.Array:
    """x rounded to bf16 and back when the noise is bf16: XLA computes each bf16 op in f32 and rounds it."""
    return x.astype(jnp.bfloat16).astype(jnp.float32) if bf16 else x


def gumbel(bits: jax.Array, bf16: bool) -> jax.Array:
    """jax.random.gumbel's value (in f32) for these random bits: -log(-log(uniform(tiny, 1)))."""
    if bf16:  # uniform draws 8 bits for bf16 and keeps 7 as the mantissa of [1, 2)
        mantissa = lax.shift_right_logical(bits & np.int32(0xFF), np.int32(1)) | np.int32(0x3F80)
        f = lax.bitcast_convert_type(lax.shift_left(mantissa, np.int32(16)), jnp.float32)
    else:
        f = lax.bitcast_convert_type(lax.shift_right_logical(bits, np.int32(9)) | np.int32(0x3F800000), jnp.float32)
    u = jnp.maximum(jnp.float32(_TINY), _rounded((f - jnp.float32(1.0)) + jnp.float32(_TINY), bf16))
    return -_rounded(jnp.log(-_rounded(jnp.log(u), bf16)), bf16)


def key_words(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The two int32 words of a raw (2,) uint32 threefry key."""
    raw = lax.bitcast_convert_type(key.astype(jnp.uint32), jnp.int32)
    return raw[0], raw[1]


def gumbel_at_rows(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype, row_offset: jax.Array | int) -> jax.Array:
    """Rows row_offset .. row_offset + R of jax.random.gumbel(key, (rows, W), dtype), for `shape` (..., R, W)
    flattened to R rows of W: the noise a shard of rows draws as its part of the whole batch's."""
    if jnp.dtype(dtype) not in DTYPES:
        raise ValueError(f"noise at chosen counters is f32 or bf16 only, not {jnp.dtype(dtype).name}")
    width = shape[-1]
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    first = jnp.asarray(row_offset, jnp.int32) * np.int32(width)
    counters = first + lax.broadcasted_iota(jnp.int32, (rows, width), 0) * np.int32(width) + lax.broadcasted_iota(
        jnp.int32, (rows, width), 1)
    k0, k1 = key_words(key)
    noise = gumbel(threefry_bits(k0, k1, counters), jnp.dtype(dtype) == jnp.bfloat16)
    return noise.astype(dtype).reshape(shape)


Categorical = Callable[..., jax.Array]


def categorical_at_rows(row_offset: jax.Array | int) -> Categorical:
    """`jax.random.categorical(key, logits, axis=-1)` for logits that are rows row_offset.. of a larger batch:
    jnp.argmax(logits + the whole batch's noise at these rows), as categorical adds its noise."""

    def categorical(key: jax.Array, logits: jax.Array, axis: int = -1) -> jax.Array:
        if axis not in (-1, logits.ndim - 1):
            raise ValueError("categorical_at_rows draws over the last axis only")
        return jnp.argmax(gumbel_at_rows(key, logits.shape, logits.dtype, row_offset) + logits, axis=-1)

    return categorical


__all__ = ["DTYPES", "MAX_COUNTER", "Categorical", "categorical_at_rows", "gumbel", "gumbel_at_rows", "key_words",
           "threefry_bits"]
