"""JAX's Gumbel noise at chosen counters: the noise `jax.random.categorical` draws, element by element.

`jax.random.gumbel(key, shape, dtype)` (threefry2x32, partitionable counters) gives element i of the
row-major flattened array the random bits of counter i, then turns them into a float with a fixed
sequence of f32 ops, rounded to the dtype after each. Computing those bits and floats from the counters
themselves lets a kernel, or a shard of a batch, draw exactly the noise the whole array would hold at its
own elements: the Pallas samplers compute it inside the kernel (`threefry_bits`, `gumbel`), and a shard
of rows draws its rows of the whole batch's noise (`gumbel_at_rows`, `categorical_at_rows`).

Only f32 and bf16 noise, and counters below 2**32 (the high word of the counter is 0).

Libraries also write the noise by hand, -log(-log(u)) of a uniform u, bare or guarded by a small eps (PaLM-jax's
`log(t + eps)`, lucidrains' `t.clamp(min=eps).log()`; HAND_NOISES). For an eps that leaves every u > 0 and every
-log(u) as it is, that noise is JAX's f32 noise but where u = 0 (`hand_noise_at_zero` decides it by evaluating
the writing at all 2**23 uniforms): a categorical with such noise is `categorical_at_zero` of its value there. With
the inner log bare that value is -inf: a token whose uniform is 0 scores -inf, and NaN where its logit is +inf.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


def at_zero(noise: jax.Array, bits: jax.Array, value: float | None) -> jax.Array:
    """f32 `noise` of these random bits with `value` where the uniform is 0 (the bits' 23 mantissa bits are 0): a
    hand-written noise's (SampleAttrs.gumbel_at_zero); the noise itself for None."""
    if value is None:
        return noise
    return jnp.where(lax.shift_right_logical(bits, np.int32(9)) == 0, jnp.float32(value), noise)


def key_words(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The two int32 words of a raw (2,) uint32 threefry key."""
    raw = lax.bitcast_convert_type(key.astype(jnp.uint32), jnp.int32)
    return raw[0], raw[1]


def gumbel_at_rows(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype, row_offset: jax.Array | int,
                   gumbel_at_zero: float | None = None) -> jax.Array:
    """Rows row_offset .. row_offset + R of jax.random.gumbel(key, (rows, W), dtype), for `shape` (..., R, W)
    flattened to R rows of W: the noise a shard of rows draws as its part of the whole batch's (f32 with
    `gumbel_at_zero`: a hand-written noise's, `at_zero`)."""
    if jnp.dtype(dtype) not in DTYPES:
        raise ValueError(f"noise at chosen counters is f32 or bf16 only, not {jnp.dtype(dtype).name}")
    width = shape[-1]
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    first = jnp.asarray(row_offset, jnp.int32) * np.int32(width)
    counters = first + lax.broadcasted_iota(jnp.int32, (rows, width), 0) * np.int32(width) + lax.broadcasted_iota(
        jnp.int32, (rows, width), 1)
    k0, k1 = key_words(key)
    bits = threefry_bits(k0, k1, counters)
    noise = at_zero(gumbel(bits, jnp.dtype(dtype) == jnp.bfloat16), bits, gumbel_at_zero)
    return noise.astype(dtype).reshape(shape)


Categorical = Callable[..., jax.Array]


def categorical_at_rows(row_offset: jax.Array | int, gumbel_at_zero: float | None = None) -> Categorical:
    """`jax.random.categorical(key, logits, axis=-1)` for logits that are rows row_offset.. of a larger batch:
    jnp.argmax(logits + the whole batch's noise at these rows), as categorical adds its noise (with
    `gumbel_at_zero`, `categorical_at_zero`'s of f32 logits)."""

    def categorical(key: jax.Array, logits: jax.Array, axis: int = -1) -> jax.Array:
        if axis not in (-1, logits.ndim - 1):
            raise ValueError("categorical_at_rows draws over the last axis only")
        noise = gumbel_at_rows(key, logits.shape, logits.dtype, row_offset, gumbel_at_zero)
        return jnp.argmax(noise + logits, axis=-1)

    return categorical


# ----- hand-written Gumbel noise ---------------------------------------------------------------------------------


def _plus(x: Any, eps: Any, xp: Any) -> Any:  # noqa: ANN401
    """x + eps: PaLM-jax's `log(t, eps) = log(t + eps)`."""
    del xp
    return x + eps


def _floored(x: Any, eps: Any, xp: Any) -> Any:  # noqa: ANN401
    """torch's `x.clamp(min=eps)` as torchax lowers it (jnp.clip: maximum(eps, x)): lucidrains'
    `log(t, eps) = t.clamp(min=eps).log()`; numpy's maximum alike."""
    return xp.clip(x, eps, None) if xp is jnp else np.maximum(eps, x)


@dataclass(frozen=True)
class HandNoise:
    """-log(outer(-log(inner(u, eps)), eps_out)) of a uniform u in [0, 1): a Gumbel noise written by hand, by the
    guards around its two logs (each `(x, eps, xp) -> x guarded`, xp the array module: jnp in a program, np to
    evaluate it). `torch`: written in torch, through torchax, which negates as `-1 * x` (aten.neg) and adds the
    noise to the logits as `x + noise * 1` (aten.add's alpha): the same values. `subtracted`: the logits less the
    outer log, `x - log(...)`, not plus its negation (the same values too)."""

    inner: Callable[[Any, Any, Any], Any]
    outer: Callable[[Any, Any, Any], Any]
    torch: bool = False
    subtracted: bool = False

    def __call__(self, u: Any, eps: Any, eps_out: Any, xp: Any) -> Any:  # noqa: ANN401
        """The noise's values."""
        return self._negated(self._outer_log(u, eps, eps_out, xp))

    def term(self, u: Any, eps: Any, eps_out: Any, xp: Any) -> Any:  # noqa: ANN401
        """What the program adds to the logits (subtracts, where `subtracted`)."""
        return self._outer_log(u, eps, eps_out, xp) if self.subtracted else self(u, eps, eps_out, xp)

    def perturbed(self, logits: Any, u: Any, eps: Any, eps_out: Any, xp: Any) -> Any:  # noqa: ANN401
        """The logits perturbed by the noise of u, as the writing computes them."""
        term = self.term(u, eps, eps_out, xp)
        if self.subtracted:
            return logits - term
        return logits + term * 1 if self.torch else logits + term

    def _outer_log(self, u: Any, eps: Any, eps_out: Any, xp: Any) -> Any:  # noqa: ANN401
        return xp.log(self.outer(self._negated(xp.log(self.inner(u, eps, xp))), eps_out, xp))

    def _negated(self, x: Any) -> Any:  # noqa: ANN401
        return -1 * x if self.torch else -x


def _bare(x: Any, eps: Any, xp: Any) -> Any:  # noqa: ANN401
    """x itself: a log with no guard (the outer one of `-log(-log(u + eps))`, or both of `-log(-log(u))`)."""
    del eps, xp
    return x


# Hand-written Gumbel noises, of the f32 uniform `jax.random.uniform(key, shape)` (torch.rand_like through torchax), by
# the guards around their two logs: an eps added (PaLM-jax's `log(t + eps)`, diffusers' and paddle samplers' in
# torch), an eps floor (lucidrains' `t.clamp(min=eps).log()`: x-transformers' `gumbel_noise`; jnp.clip in JAX), or
# none (`-log(-log(u + eps))`, and the textbook `-log(-log(u))`, whose value where u is 0 is -inf). Every pair is a
# writing, in JAX and in torch, and in JAX also subtracted from the logits (`x - log(-log(...))`).
_GUARDS = {"sum": _plus, "clamp": _floored, "bare": _bare}
_WRITING_NAMES = {("sum", "sum"): "logs_of_sums", ("clamp", "clamp"): "logs_of_clamps", ("sum", "bare"): "log_of_sum",
                  ("clamp", "bare"): "log_of_clamp", ("sum", "clamp"): "log_of_sum_clamped",
                  ("clamp", "sum"): "log_of_clamp_plus_eps", ("bare", "bare"): "unguarded_logs",
                  ("bare", "sum"): "log_plus_eps", ("bare", "clamp"): "log_clamped"}
HAND_NOISES: dict[str, HandNoise] = {
    f"{prefix}{name}": HandNoise(_GUARDS[inner], _GUARDS[outer], torch=prefix == "torch_",
                                 subtracted=prefix == "minus_")
    for prefix in ("", "torch_", "minus_") for (inner, outer), name in _WRITING_NAMES.items()}


def hand_categorical(noise: str, eps: float, eps_out: float) -> Categorical:
    """argmax(logits + HAND_NOISES[noise] of jax.random.uniform(key, logits.shape)) over the last axis: a categorical
    drawn with a hand-written noise, as the program writes it (f32 logits: the noise is f32)."""

    def categorical(key: jax.Array, logits: jax.Array, axis: int = -1) -> jax.Array:
        if axis not in (-1, logits.ndim - 1) or logits.dtype != jnp.float32:
            raise ValueError("a hand-written noise is drawn over the last axis of f32 logits")
        writing = HAND_NOISES[noise]
        u = jax.random.uniform(key, logits.shape, minval=0.0, maxval=1.0)
        return jnp.argmax(writing.perturbed(logits, u, eps, eps_out, jnp), axis=-1)

    return categorical


def categorical_at_zero(at_zero: float) -> Categorical:
    """jax.random.categorical of f32 logits over the last axis, its noise JAX's but `at_zero` where the uniform is 0
    (the 23 mantissa bits of the element's random bits are 0): the ids of a hand-written noise whose eps leaves every
    other uniform as it is (`hand_noise_at_zero`)."""

    def categorical(key: jax.Array, logits: jax.Array, axis: int = -1) -> jax.Array:
        if axis not in (-1, logits.ndim - 1) or logits.dtype != jnp.float32:
            raise ValueError("a noise with another value at a zero uniform is drawn over the last axis of f32 logits")
        zero = (jax.random.bits(key, logits.shape, jnp.uint32) >> 9) == 0
        noise = jnp.where(zero, jnp.float32(at_zero), jax.random.gumbel(key, logits.shape, jnp.float32))
        return jnp.argmax(noise + logits, axis=-1)

    return categorical


# Every f32 -log(u) of a uniform u in (0, 1) lies at or above this (-log(1 - 2**-23) is 2**-23 less a log's ulp).
_LEAST_LOG = 2.0**-24


@functools.lru_cache(maxsize=64)
def hand_noise_at_zero(noise: str, eps: float, eps_out: float) -> float:
    """The value of the hand-written noise HAND_NOISES[noise] (with these eps) where the uniform is 0, for a writing
    that is JAX's f32 noise, -log(-log(max(tiny, u + tiny))) = -log(-log(u)), at every other uniform: decided by
    evaluating its guards, f32 adds and maxima that round as XLA's do, where they act (the inner one at every uniform
    u = m * 2**-23, m = 1 .. 2**23 - 1; the outer one at every f32 in [2**-24, 2**-23), the lowest -log(u) can
    reach, where an add's rounding and a clamp's floor reach furthest), so that the logs' operands are JAX's,
    whatever a log rounds. -inf for a bare inner log (-log(0) is +inf): the kernels draw it too, a token whose
    uniform is 0 scoring -inf, or NaN where its logit is +inf. Raises ValueError saying how else it differs: a guard
    that moves some u or some -log(u), or a value at 0 that is NaN, +inf or above the noise of u = 2**-23."""
    writing = HAND_NOISES[noise]
    u = (np.arange(1, 2**23, dtype=np.uint32) | np.uint32(0x3F800000)).view(np.float32) - np.float32(1.0)
    logs = (np.arange(2**23, dtype=np.uint32) | np.float32(_LEAST_LOG).view(np.uint32)).view(np.float32)
    for what, values, guarded in (("uniforms", u, writing.inner(u, np.float32(eps), np)),
                                  ("-log(u) near 0", logs, writing.outer(logs, np.float32(eps_out), np))):
        moved = np.flatnonzero(np.asarray(guarded, np.float32) != values)
        if moved.size:
            raise ValueError(f"its eps ({eps:g}, {eps_out:g}) moves {moved.size} of the 2^23 {what} (the first "
                             f"{float(values[moved[0]]):g}) off JAX's noise, which the kernels draw")
    with np.errstate(divide="ignore", invalid="ignore"):
        zero, least = (float(writing(np.float32(x), np.float32(eps), np.float32(eps_out), np)) for x in (0.0, u[0]))
    if not zero <= least:
        raise ValueError(f"its noise where the uniform is 0 is {zero:g}, not a value below the others, which the "
                         "kernels draw")
    return zero


__all__ = ["DTYPES", "HAND_NOISES", "MAX_COUNTER", "Categorical", "HandNoise", "at_zero", "categorical_at_rows",
           "categorical_at_zero", "gumbel", "gumbel_at_rows", "hand_categorical", "hand_noise_at_zero", "key_words",
           "threefry_bits"]
