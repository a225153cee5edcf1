"""Property test: hypothesis draws sampler inputs (form, parameters, shape, dtype, logit distribution, key); the
native CPU sampler must return `sample_reference`'s token ids exactly.

Profiles as in test_differential.py: HYPOTHESIS_PROFILE=ci (default, part of test.sh) or =thorough
(`HYPOTHESIS_PROFILE=thorough pytest test/kernels/test_cpu_sampling_properties.py`, a few minutes).
Derandomized, so a failure reproduces; the failing example is printed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from hlofuse.kernels.cpu import sampling
from hlofuse.kernels.sampling_reference import sample_reference

pytestmark = pytest.mark.skipif(not sampling.is_available(), reason="the native CPU kernels are not built")

_COMMON = {"deadline": None, "derandomize": True, "suppress_health_check": [HealthCheck.too_slow],
           "print_blob": True}
settings.register_profile("sampling-ci", max_examples=60, **_COMMON)
settings.register_profile("sampling-thorough", max_examples=600, **_COMMON)
PROFILE = settings.get_profile("sampling-thorough" if os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
                               else "sampling-ci")

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


@settings(PROFILE)
@given(cases())
def test_cpu_sampler_returns_the_reference_tokens(case: Case) -> None:
    params = {"temperature": case.temperature, "k": case.k, "p": case.p, "min_p": case.min_p}
    x = jnp.asarray(case.logits())
    key = jnp.array(case.key, jnp.uint32)
    want = jax.jit(lambda x, key: sample_reference(x, key, form=case.form, **params))(x, key)
    got = jax.jit(lambda x, key: sampling.sample(x, key, form=case.form, **params))(x, key)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=str(case))


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
