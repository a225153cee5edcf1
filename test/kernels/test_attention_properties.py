"""Property test: hypothesis draws attention problems (shapes, GQA, causal / window / offset, soft-cap, bias,
mask, lengths, dtype, masked value, tiling) and the native CPU kernel, and the Pallas TPU and GPU kernels in
interpret mode, must match `attention_reference` to the contract's tolerance, including rows that see no key
(NaN for a -inf fill, as the reference).

HYPOTHESIS_PROFILE=thorough for hundreds of problems; derandomized, so a failure reproduces.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import hypothesis.strategies as st
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from hlofuse.kernels import cpu
from hlofuse.kernels.cpu import attention as cpu_attention
from hlofuse.kernels.reference import UNBOUNDED, attention_reference

pytestmark = pytest.mark.skipif(not cpu.is_available(), reason="the native CPU kernels are not built")

THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
PROFILE = settings(max_examples=400 if THOROUGH else 40, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.too_slow], print_blob=True)
# The contract's tolerances (docs/composites.md): f32 1e-5 relative, bf16 against the f32 reference.
TOLERANCE = {"float32": (1e-5, 1e-5), "bfloat16": (2e-2, 2e-2)}


@dataclass(frozen=True)
class Problem:
    b: int
    t: int
    s: int
    n: int
    kv: int
    h: int
    d: int
    dtype: str
    causal: bool
    window_left: int
    window_right: int
    q_offset: int
    softcap: float
    masked_value: float
    bias: bool
    mask: bool
    q_lengths: tuple[int, ...] | None
    kv_lengths: tuple[int, ...] | None
    block_q: int
    block_k: int
    kv_splits: int
    seed: int


@st.composite
def problems(draw: st.DrawFn) -> Problem:
    b = draw(st.integers(1, 2))
    t = draw(st.sampled_from([1, 2, 5, 16, 33, 70]))
    s = draw(st.sampled_from([1, 3, 16, 31, 64, 130]))
    kv = draw(st.sampled_from([1, 2]))
    n = kv * draw(st.sampled_from([1, 2, 4]))
    h = draw(st.sampled_from([8, 16, 64, 128, 40]))
    d = draw(st.sampled_from([h, 8, 32]))
    causal = draw(st.booleans())
    lengths = st.tuples(*[st.integers(0, s) for _ in range(b)])
    return Problem(
        b=b, t=t, s=s, n=n, kv=kv, h=h, d=d, dtype=draw(st.sampled_from(["float32", "float32", "bfloat16"])),
        causal=causal,
        window_left=draw(st.sampled_from([UNBOUNDED, 0, 3, 20])),
        window_right=0 if causal else draw(st.sampled_from([UNBOUNDED, 0, 2])),
        q_offset=draw(st.sampled_from([0, s - t, 5])) if causal else 0,
        softcap=draw(st.sampled_from([0.0, 0.0, 5.0])),
        masked_value=draw(st.sampled_from([float("-inf"), float("-inf"), -1e9])),
        bias=draw(st.booleans()),
        mask=draw(st.booleans()),
        q_lengths=draw(st.none() | st.tuples(*[st.integers(0, t) for _ in range(b)])),
        kv_lengths=draw(st.none() | lengths),
        block_q=draw(st.sampled_from([0, 8, 32, 128])),
        block_k=draw(st.sampled_from([0, 16, 64])),
        kv_splits=draw(st.sampled_from([0, 0, 1, 3])),
        seed=draw(st.integers(0, 2**16)),
    )


def _problem_inputs(pr: Problem) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray, dict[str, Any]]:
    """q, k, v and the keyword arguments (attributes, optional operands) of the problem."""
    rng = np.random.default_rng(pr.seed)
    dtype = jnp.bfloat16 if pr.dtype == "bfloat16" else jnp.float32
    q = jnp.asarray(rng.standard_normal((pr.b, pr.t, pr.n, pr.h)), dtype)
    k = jnp.asarray(rng.standard_normal((pr.b, pr.s, pr.kv, pr.h)), dtype)
    v = jnp.asarray(rng.standard_normal((pr.b, pr.s, pr.kv, pr.d)), dtype)
    return q, k, v, _kwargs(pr, rng)


def _kwargs(pr: Problem, rng: np.random.Generator) -> dict[str, Any]:
    """The problem's attributes and optional operands, as attention_reference takes them."""
    kwargs: dict[str, Any] = dict(scale=1.0 / np.sqrt(pr.h), causal=pr.causal, window_left=pr.window_left,
                                  window_right=pr.window_right, q_offset=pr.q_offset, softcap=pr.softcap,
                                  masked_value=pr.masked_value)
    if pr.bias:
        kwargs["bias"] = jnp.asarray(rng.standard_normal((1, pr.n, pr.t, pr.s)), jnp.float32)
    if pr.mask:
        kwargs["mask"] = jnp.asarray(rng.random((pr.b, 1, pr.t, pr.s)) < 0.8)
    if pr.q_lengths is not None:
        kwargs["q_lengths"] = jnp.asarray(pr.q_lengths, jnp.int32)
    if pr.kv_lengths is not None:
        kwargs["kv_lengths"] = jnp.asarray(pr.kv_lengths, jnp.int32)
    return kwargs


@PROFILE
@given(problems())
def test_cpu_attention_matches_the_reference(pr: Problem) -> None:
    q, k, v, kwargs = _problem_inputs(pr)
    blocks = cpu_attention.BlockSizes(**{name: value for name, value in
                                         (("block_q", pr.block_q), ("block_k", pr.block_k)) if value},
                                      kv_splits=pr.kv_splits)
    want = np.asarray(attention_reference(q, k, v, **kwargs), np.float32)
    got = np.asarray(cpu_attention.attention(q, k, v, block_sizes=blocks, **kwargs), np.float32)
    rtol, atol = TOLERANCE[pr.dtype]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=str(pr))


PALLAS_PROFILE = settings(max_examples=120 if THOROUGH else 12, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow], print_blob=True)


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
@PALLAS_PROFILE
@given(pr=problems())
def test_pallas_attention_matches_the_reference(backend: str, pr: Problem) -> None:
    """The same problems through the Pallas kernels in interpret mode, with their default tiles (the CPU
    kernel's block sizes do not apply)."""
    from hlofuse.kernels.pallas import attention as pallas_attention

    q, k, v, kwargs = _problem_inputs(pr)
    want = np.asarray(attention_reference(q, k, v, **kwargs), np.float32)
    got = np.asarray(pallas_attention.attention(q, k, v, backend=backend, interpret=True, **kwargs), np.float32)
    rtol, atol = TOLERANCE[pr.dtype]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=str(pr))
