"""The NKI sampling kernel against sample_reference: the same token ids, and the emulator's limits.

`TestNkiSampling` runs the kernel under hlofuse's NumPy emulation of NKI (every CI host);
`TestNkiSamplingSimulator` reruns it under NKI's own simulator where `neuronxcc` imports (skipped
otherwise). The token ids compared are the kernel's own (`kernel_tokens`, no reference fallback), so a row
the kernel could not certify fails the test. Small blocks make a (6, 700) batch span two row tiles and
three vocabulary chunks, the last of each partial.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import ml_dtypes
import nucleus_rounding
import numpy as np
import pytest
from softmax_ties import check_certified, tie_rows

from hlofuse.kernels.nki import emulator, hostcall, sampling
from hlofuse.kernels.nki.emulator import NkiLimitError
from hlofuse.kernels.nki.sampling import (
    HAVE_NEURONXCC,
    UNCERTIFIED,
    BlockSizes,
    KernelConfig,
    kernel_tokens,
    sample,
    sample_reference,
)

PARAMS: dict[str, dict[str, Any]] = {
    "greedy": {}, "greedy_softmax": {}, "categorical": {}, "temperature": {"temperature": 0.7},
    "top_k": {"temperature": 0.6, "k": 40}, "temperature_top_k": {"temperature": 1.3, "k": 7},
    "top_k_mask": {"temperature": 0.8, "k": 50}, "top_p_mask": {"temperature": 0.7, "p": 0.9},
    "top_k_top_p_mask": {"temperature": 0.6, "k": 64, "p": 0.8}, "min_p": {"temperature": 0.9, "min_p": 0.05},
}  # fmt: skip
DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}
KINDS = ("normal", "peaked", "ties", "neg_inf", "flat")
SMALL = BlockSizes(block_rows=4, block_v=256)
SHAPE = (6, 700)
KEYS = 2


def _logits(kind: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * 3
    if kind == "peaked":
        x[..., rng.integers(shape[-1])] += 30  # one token holds nearly all the mass
    elif kind == "ties":
        x = np.round(x)  # a handful of distinct values, each shared by many tokens
    elif kind == "neg_inf":
        x[rng.random(shape) < 0.6] = -np.inf
        x[0] = -np.inf  # a row with nothing to sample: argmax is 0, as in the program
    elif kind == "flat":
        x[:] = 0
    return x


def _cases(dtype: str) -> list[tuple[str, int]]:
    """Every kind with two keys in f32; one key for the 16-bit dtypes, whose kernel path differs only by rounding."""
    return [(kind, seed) for kind in KINDS for seed in range(KEYS if dtype == "float32" else 1)]


def _supported(form: str, dtype: str) -> bool:
    return dtype == "float32" or form not in sampling.F32_ONLY_FORMS


GRID = [(form, dtype) for form in PARAMS for dtype in DTYPES if _supported(form, dtype)]


class TestNkiSampling:
    """The emulated kernel (runner='emulator') against the reference."""

    runner: ClassVar[str] = "emulator"

    @pytest.mark.parametrize(("form", "dtype"), GRID, ids=[f"{f}-{d}" for f, d in GRID])
    def test_kernel_matches_reference(self, form: str, dtype: str) -> None:
        params = PARAMS[form]
        ker = jax.jit(functools.partial(kernel_tokens, form=form, runner=self.runner, block_sizes=SMALL, **params))
        ref = jax.jit(functools.partial(sample_reference, form=form, **params))
        for kind, seed in _cases(dtype):
            x = jnp.asarray(_logits(kind, SHAPE, seed).astype(DTYPES[dtype]))
            key = jnp.array([seed * 7919 + 1, 12345 + seed], jnp.uint32)
            got, want = np.asarray(ker(x, key)), np.asarray(ref(x, key))
            assert not hostcall.last_errors()
            assert (got != UNCERTIFIED).all(), f"{kind} seed {seed}: rows the kernel did not certify: {got}"
            np.testing.assert_array_equal(got, want, err_msg=f"{form} {dtype} {kind} seed {seed}")

    def test_rank3_and_rank1_logits(self) -> None:
        kernel = functools.partial(kernel_tokens, form="top_k", temperature=0.5, k=7, runner=self.runner,
                                   block_sizes=SMALL)  # fmt: skip
        for shape in ((2, 3, 300), (300,)):
            x = jnp.asarray(_logits("normal", shape, 3))
            key = jnp.array([5, 6], jnp.uint32)
            got = jax.jit(kernel)(x, key)
            assert got.shape == shape[:-1]
            np.testing.assert_array_equal(got, sample_reference(x, key, form="top_k", temperature=0.5, k=7))

    def test_default_tiles_fit_with_128_rows(self) -> None:
        """Default blocks (128 rows x 2048 entries): the search's passes fit SBUF at full partition use."""
        x = jnp.asarray(_logits("normal", (128, 2500), 4))
        key = jnp.array([7, 8], jnp.uint32)
        got = jax.jit(functools.partial(kernel_tokens, form="top_p_mask", p=0.9, runner=self.runner))(x, key)
        want = sample_reference(x, key, form="top_p_mask", p=0.9)
        np.testing.assert_array_equal(got, want)
        if self.runner == "emulator":
            sbuf_peak, psum_peak = emulator.last_core_peaks()
            assert 0 < sbuf_peak <= emulator.SBUF_PARTITION_BYTES // 2 and psum_peak == 0, (sbuf_peak, psum_peak)

    def test_uncertified_rows_come_from_the_reference(self) -> None:
        """Two search passes cannot isolate the 50th value: the kernel says so, and `sample` stays exact."""
        x = jnp.asarray(_logits("normal", SHAPE, 5))
        x = x.at[1, 3].set(jnp.nan)  # NaN rows are always left to the reference
        key = jnp.array([9, 10], jnp.uint32)
        options = dict(form="top_k_mask", temperature=0.8, k=50, runner=self.runner, block_sizes=SMALL, steps=2)
        raw = np.asarray(kernel_tokens(x, key, **options))
        assert raw[1] == UNCERTIFIED and (raw == UNCERTIFIED).sum() >= 3, raw
        want = sample_reference(x, key, form="top_k_mask", temperature=0.8, k=50)
        np.testing.assert_array_equal(jax.jit(functools.partial(sample, **options))(x, key), want)

    @pytest.mark.parametrize(("form", "dtype"), [("temperature", "bfloat16"), ("top_k", "float32"),
                                                 ("top_k_mask", "float32")])
    def test_a_shard_of_rows_draws_the_whole_batch_noise(self, form: str, dtype: str) -> None:
        """`row_offset`: rows 2..4 of a 6-row batch draw that batch's noise at their rows, in the kernel's noise
        and in the reference fallback (a NaN row, and steps=2 leaving top_k_mask's search unconverged)."""
        params = PARAMS[form]
        x = jnp.asarray(_logits("normal", SHAPE, 6).astype(DTYPES[dtype])).at[3, 5].set(jnp.nan)
        key = jnp.array([11, 12], jnp.uint32)
        want = np.asarray(sample_reference(x, key, form=form, **params))[2:5]
        steps = {"steps": 2} if form == "top_k_mask" else {}
        shard = jax.jit(functools.partial(sample, form=form, runner=self.runner, block_sizes=SMALL, **steps, **params))
        np.testing.assert_array_equal(shard(x[2:5], key, row_offset=jnp.int32(2)), want, err_msg=f"{form} {dtype}")
        raw = np.asarray(kernel_tokens(x[2:5], key, form=form, runner=self.runner, block_sizes=SMALL,
                                       row_offset=2, **steps, **params))
        assert raw[1] == UNCERTIFIED  # the NaN row: its token came from the fallback
        certified = raw != UNCERTIFIED
        np.testing.assert_array_equal(raw[certified], want[certified])

    @pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
    def test_greedy_softmax_is_certified_away_from_ties(self, dtype: str) -> None:
        """argmax(softmax(x)): the kernel's argmax where no token lies less than the margin below the max,
        UNCERTIFIED (then the program's own softmax) where one does or the max is NaN or +inf."""
        x = tie_rows(DTYPES[dtype], sampling.SOFTMAX_TIE_MARGIN[dtype])
        raw = kernel_tokens(x, None, form="greedy_softmax", runner=self.runner, block_sizes=SMALL)
        check_certified(raw, UNCERTIFIED, x, sample(x, None, form="greedy_softmax", runner=self.runner,
                                                       block_sizes=SMALL))

    def test_nucleus_draw_that_rounding_decides_is_left_to_the_program(self) -> None:
        """nucleus_rounding's row as row ROW of a batch: the token its draw lands on is kept only by the program's
        f32 rounding of its cumsum (a cut by the kernel's own f32 mass drew 2637), so the kernel leaves the row
        UNCERTIFIED and `sample` gives the program's token."""
        x, p = nucleus_rounding.rounded_cut()
        key = jnp.asarray(nucleus_rounding.KEY, jnp.uint32)
        options = dict(form="top_p_mask", temperature=nucleus_rounding.TEMPERATURE, p=p, runner=self.runner,
                       row_offset=jnp.int32(nucleus_rounding.ROW))
        assert int(kernel_tokens(x, key, **options)[0]) == UNCERTIFIED
        assert int(sample(x, key, **options)[0]) == nucleus_rounding.program_token(x, p)

    def test_rank_space_rows_with_zeros_in_the_top_k_are_left_to_the_reference(self) -> None:
        """lax.top_k ranks +0 above -0, which the kernel's groups of equal values cannot tell apart: a row whose top k
        take a group of zeros is UNCERTIFIED, and `sample` gives the reference's token."""
        x = np.full((2, 300), -5.0, np.float32)
        x[0, :40:2], x[0, 1:40:2] = -0.0, 0.0
        x[1, :40] = np.arange(40, dtype=np.float32)  # no zero in its top k
        x = jnp.asarray(x)
        key = jnp.array([3, 4], jnp.uint32)
        options = dict(form="top_k", temperature=0.7, k=20, runner=self.runner, block_sizes=SMALL)
        raw = np.asarray(kernel_tokens(x, key, **options))
        assert raw[0] == UNCERTIFIED and raw[1] != UNCERTIFIED, raw
        np.testing.assert_array_equal(sample(x, key, **options), sample_reference(x, key, form="top_k",
                                                                                  temperature=0.7, k=20))

    def test_search_spans_the_float_range(self) -> None:
        """Finite fills at -3e38 beside logits 1 ulp apart: the log-scale bisection still converges."""
        x = np.full((2, 500), -3e38, np.float32)
        x[:, :100] = np.float32(1.0) + np.arange(100, dtype=np.float32) * np.float32(2**-23)
        x = jnp.asarray(x)
        key = jnp.array([11, 12], jnp.uint32)
        got = kernel_tokens(x, key, form="top_k_mask", k=37, runner=self.runner, block_sizes=SMALL)
        np.testing.assert_array_equal(got, sample_reference(x, key, form="top_k_mask", k=37))


@pytest.mark.skipif(not HAVE_NEURONXCC, reason="neuronxcc (the Neuron SDK, with NKI's simulator) does not import")
class TestNkiSamplingSimulator(TestNkiSampling):
    """The same cases under NKI's own simulator (nki.simulate_kernel)."""

    runner: ClassVar[str] = "simulator"


# ----------------------------------------------------------------------------- limits and support


def _config(**overrides: Any) -> dict[str, Any]:  # noqa: ANN401
    cfg = dict(form="top_k_mask", temperature=1.0, k=5, p=1.0, min_p=0.0, dtype="float32", block_rows=128,
               block_v=2048)  # fmt: skip
    return {**cfg, **overrides}


@pytest.mark.parametrize(
    ("rows", "overrides", "message"),
    [
        (200, dict(block_rows=200), "partition dim 200 of tile .* exceeds the 128 partitions"),
        (2, dict(block_v=60000), "SBUF overflow"),
    ],
    ids=["rows_over_128_partitions", "vocab_chunk_over_sbuf"],
)
def test_emulator_rejects(rows: int, overrides: dict[str, Any], message: str) -> None:
    x = np.zeros((rows, 64 if "block_rows" in overrides else 60000), np.float32)
    noise = np.zeros_like(x)
    with pytest.raises(NkiLimitError, match=message):
        sampling.run_kernel(x, noise, config=_config(**overrides))


def test_block_sizes_are_checked() -> None:
    with pytest.raises(ValueError, match="block_rows 129 must be in"):
        BlockSizes(block_rows=129)
    assert KernelConfig(**_config()).stochastic


@pytest.mark.parametrize(
    ("form", "dtype", "vocab", "k", "message"),
    [
        ("top_k", "float32", 1000, 300, "k = 300 exceeds 256 for the rank-space form 'top_k'"),
        ("greedy_softmax_top", "float32", 100, 0, "form 'greedy_softmax_top' is not taken"),
        ("top_p_mask", "bfloat16", 100, 0, "'top_p_mask' on bfloat16 logits thresholds bfloat16-rounded"),
        ("top_k_mask", "float32", 100, 101, "k = 101 is outside [1, vocabulary 100]"),
        ("greedy", "float64", 100, 0, "logits dtype float64 is not one of"),
    ],
)
def test_unsupported_samplers_say_why(form: str, dtype: str, vocab: int, k: int, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        sampling.check_form(form, dtype, vocab, k, 1.0)
