"""Property test: hypothesis draws sampler inputs (form, parameters, shape, dtype, logit distribution, key); every
sampling kernel must return `sample_reference`'s token ids exactly: the native CPU sampler, the Pallas TPU and
GPU samplers in interpret mode, and the NKI sampler under the emulator (its own ids, before the reference
fills rows it marks uncertified).

Profiles as in test_differential.py: HYPOTHESIS_PROFILE=ci (default, part of test.sh) or =thorough
(`HYPOTHESIS_PROFILE=thorough pytest test/kernels/test_sampling_properties.py`, several minutes).
Derandomized, so a failure reproduces; the failing example is printed.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings

from hlofuse.kernels.cpu import sampling
from hlofuse.kernels.sampling_reference import sample_reference

_COMMON = {"deadline": None, "derandomize": True, "suppress_health_check": [HealthCheck.too_slow],
           "print_blob": True}
THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
# Interpret mode and the emulator run a kernel far slower than the native sampler: fewer examples there.
PROFILE = settings(max_examples=600 if THOROUGH else 60, **_COMMON)
SLOW_PROFILE = settings(max_examples=150 if THOROUGH else 30, **_COMMON)

FORMS = tuple(sorted(sampling.FORM_CODES))
DISTRIBUTIONS = ("normal", "wide", "peaked", "ties", "neg_inf", "flat", "one_hot")


@dataclass(frozen=True)
class Case:
    form: str
    dtype: str
    rows: int
    vocab: int
    distribution: str
    seed: int
    key: tuple[int, int]
    temperature: float
    k: int
    p: float
    min_p: float

    def logits(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        shape = (self.rows, self.vocab)
        x = rng.standard_normal(shape).astype(np.float32)
        if self.distribution == "wide":
            x *= 20
        elif self.distribution == "peaked":
            x *= 8
        elif self.distribution == "ties":
            x = np.round(x * 2) / 2
        elif self.distribution == "neg_inf":
            x[rng.random(shape) < 0.6] = -np.inf
            x[:, rng.integers(self.vocab)] = 1.0  # every row keeps a finite logit
        elif self.distribution == "flat":
            x[:] = 0
        elif self.distribution == "one_hot":
            x[:] = -30
            x[np.arange(self.rows), rng.integers(self.vocab, size=self.rows)] = 5
        np_dtype = np.dtype(ml_dtypes.bfloat16) if self.dtype == "bfloat16" else np.dtype(np.float32)
        return x.astype(np_dtype)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    dtype = draw(st.sampled_from(["float32", "float32", "bfloat16"]))
    forms = [f for f in FORMS if dtype == "float32" or f not in sampling.BF16_UNSUPPORTED]
    vocab = draw(st.sampled_from([1, 2, 7, 100, 1000, 4099, 40_000]))
    return Case(
        form=draw(st.sampled_from(forms)),
        dtype=dtype,
        rows=draw(st.integers(1, 4)),
        vocab=vocab,
        distribution=draw(st.sampled_from(DISTRIBUTIONS)),
        seed=draw(st.integers(0, 2**16)),
        key=(draw(st.integers(0, 2**32 - 1)), draw(st.integers(0, 2**32 - 1))),
        temperature=draw(st.sampled_from([0.1, 0.6, 1.0, 1.7])),
        k=draw(st.integers(1, min(vocab, 64))),
        p=draw(st.sampled_from([0.05, 0.5, 0.9, 0.99, 1.0])),
        min_p=draw(st.sampled_from([0.0, 0.01, 0.1, 0.5])),
    )


def _check(case: Case, kernel: Callable[..., jax.Array]) -> None:
    params = {"temperature": case.temperature, "k": case.k, "p": case.p, "min_p": case.min_p}
    x = jnp.asarray(case.logits())
    key = jnp.array(case.key, jnp.uint32)
    want = jax.jit(lambda x, key: sample_reference(x, key, form=case.form, **params))(x, key)
    got = kernel(x, key, form=case.form, **params)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=str(case))


@pytest.mark.skipif(not sampling.is_available(), reason="the native CPU kernels are not built")
@PROFILE
@given(cases())
def test_cpu_sampler_returns_the_reference_tokens(case: Case) -> None:
    _check(case, jax.jit(sampling.sample, static_argnames=("form", "temperature", "k", "p", "min_p")))


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
@SLOW_PROFILE
@given(case=cases())
def test_pallas_sampler_returns_the_reference_tokens(backend: str, case: Case) -> None:
    from hlofuse.kernels.pallas import sampling as pallas

    _check(case, functools.partial(pallas.sample, backend=backend, interpret=True))


@SLOW_PROFILE
@given(cases())
def test_nki_sampler_returns_the_reference_tokens(case: Case) -> None:
    from hlofuse.kernels.nki import sampling as nki

    assume(case.form in nki.KERNEL_FORMS and (case.dtype == "float32" or case.form not in nki.F32_ONLY_FORMS))
    assume(case.form not in nki.RANK_FORMS or case.k <= nki.MAX_RANK_K)

    def kernel(x: jax.Array, key: jax.Array, **params: Any) -> jax.Array:  # noqa: ANN401
        tokens = np.asarray(nki.kernel_tokens(x, key, **params))
        # Rows the kernel marks uncertified are the reference's by construction: compare only the rest.
        want = np.asarray(sample_reference(x, key, **params))
        return np.where(tokens == nki.UNCERTIFIED, want, tokens)

    _check(case, kernel)


def test_parameters_a_form_does_not_read_are_ignored_by_every_path() -> None:
    """A composite written by hand may carry a temperature on the categorical form, whose function ignores
    it: the attributes' params() and the kernels must ignore it too (the first example hypothesis found)."""
    from hlofuse.composites import SampleAttrs

    attrs = SampleAttrs(mode="temperature", form="categorical", temperature=0.1, k=5, p=0.3, min_p=0.2)
    assert attrs.params() == {"temperature": 1.0, "k": 0, "p": 1.0, "min_p": 0.0}
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 300)).astype(np.float32))
    key = jnp.array([0, 0], jnp.uint32)
    want = sample_reference(x, key, form="categorical", temperature=0.1)
    np.testing.assert_array_equal(sampling.sample(x, key, form="categorical", temperature=0.1, k=5), want)
    from hlofuse.kernels.nki import sampling as nki

    np.testing.assert_array_equal(nki.kernel_tokens(x, key, form="categorical", temperature=0.1, k=5), want)
