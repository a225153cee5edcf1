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


# Two key ranges of a decode, checked by the kernels' return_lse tests: row 1 sees no key of the second
# range (its lse there is -inf), row 2 sees no key at all (NaN after the merge, as in the reference).
KEY_RANGE_LENGTHS = np.array([256, 100, 0], np.int32)


def check_key_ranges_merge(run_range: Any) -> None:  # noqa: ANN401
    """`run_range(q, k, v, lengths) -> (out f32, lse)` on each half of a 256-key decode, merged by
    `combine_partials`, must equal attention over all keys."""
    from hlofuse.kernels.reference import combine_partials

    b, t, n, kv, s, h = 3, 1, 4, 2, 256, 32
    q, k, v = attention_inputs(7, b, t, s, n, kv, h, h, jnp.float32)
    want = attention_reference(q, k, v, scale=0.2, kv_lengths=jnp.asarray(KEY_RANGE_LENGTHS))
    outs, lses = [], []
    for start in (0, s // 2):
        own = jnp.asarray(np.clip(KEY_RANGE_LENGTHS - start, 0, s // 2))
        out, lse = run_range(q, k[:, start:start + s // 2], v[:, start:start + s // 2], own)
        assert out.dtype == jnp.float32 and lse.shape == (b, t, n)
        outs.append(out)
        lses.append(lse)
    assert np.all(np.isneginf(np.asarray(lses[1][1])))
    merged = combine_partials(jnp.stack(outs, 1).reshape(b, 2, t * n, h), jnp.stack(lses, 1).reshape(b, 2, t * n),
                              jnp.float32).reshape(b, t, n, h)
    np.testing.assert_allclose(np.asarray(merged), np.asarray(want), rtol=2e-5, atol=2e-5)
    assert np.isnan(np.asarray(merged[2])).all()


def check_prefill_key_ranges_merge(run_range: Any) -> None:  # noqa: ANN401
    """`run_range(q, k, v, kv_lengths=, q_offsets=, q_lengths=) -> (out f32, lse)`, a causal kernel, on each
    quarter of a 256-key cache for a 40-query chunk at its end, each with q_offsets = S - T - its start and
    its own key lengths, merged by `combine_partials`, must equal causal attention over all keys. Row 1's
    cache is shorter than its queries' positions and row 2 has no query past 10: some ranges see nothing."""
    from hlofuse.kernels.reference import combine_partials

    b, t, n, kv, s, h, parts = 3, 40, 4, 2, 256, 32, 4
    q, k, v = attention_inputs(8, b, t, s, n, kv, h, h, jnp.float32)
    kv_lengths, q_lengths = np.array([256, 150, 256], np.int32), np.array([40, 40, 10], np.int32)
    want = attention_reference(q, k, v, scale=0.2, causal=True, q_offset=s - t, kv_lengths=jnp.asarray(kv_lengths),
                               q_lengths=jnp.asarray(q_lengths))
    outs, lses, width = [], [], s // parts
    for start in range(0, s, width):
        out, lse = run_range(q, k[:, start:start + width], v[:, start:start + width],
                             kv_lengths=jnp.asarray(np.clip(kv_lengths - start, 0, width)),
                             q_offsets=jnp.full((b,), s - t - start, jnp.int32), q_lengths=jnp.asarray(q_lengths))
        assert out.dtype == jnp.float32 and lse.shape == (b, t, n)
        outs.append(out)
        lses.append(lse)
    merged = combine_partials(jnp.stack(outs, 1).reshape(b, parts, t * n, h),
                              jnp.stack(lses, 1).reshape(b, parts, t * n), jnp.float32).reshape(b, t, n, h)
    got, want = np.asarray(merged), np.asarray(want)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(want[2, 10:]).all() and not np.isnan(want[:2]).any()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
