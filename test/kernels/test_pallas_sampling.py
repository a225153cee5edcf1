"""The Pallas TPU and GPU samplers against sample_reference, in interpret mode on the CPU: same token ids.

Every form the kernels take runs on both kernels in Pallas' HLO interpreter (interpret=True, the mode
of the `tpu-interpret` / `gpu-interpret` targets), f32 and bf16, over rows with different shapes of
distribution (wide, flat, peaked, ties, -inf entries) and several keys; a subset reruns under the
TPU interpreter proper (pltpu.InterpretParams), which checks block reads and poisons VMEM. Tiles are
small so that a row spans several lane tiles and the vocabulary needs padding.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
import nucleus_rounding
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from softmax_ties import check_certified, tie_rows

from hlofuse.kernels import noise
from hlofuse.kernels.pallas import sampling
from hlofuse.kernels.pallas.sampling import BlockSizes, sample, sample_reference
from hlofuse.kernels.sampling_reference import SOFTMAX_TIE_MARGIN, UNCERTIFIED, merge_vocab_splits

V = 1500  # not a multiple of 128 lanes or of the GPU tile: the padded tail must never be drawn
PARAMS = dict(temperature=0.7, k=20, p=0.9, min_p=0.05)
BLOCKS = {"tpu": BlockSizes(block_rows=8, block_v=256), "gpu": BlockSizes(block_rows=1, block_v=512)}
# More keys for a sweep: HLOFUSE_SAMPLING_SEEDS=200 pytest test/kernels/test_pallas_sampling.py
SEEDS = tuple(range(int(os.environ.get("HLOFUSE_SAMPLING_SEEDS", "3"))))


def _logits(dtype: Any) -> jax.Array:  # noqa: ANN401
    """(2, 3, V): wide, flat, peaked / ties, -inf entries, all -inf but one tie."""
    rng = np.random.default_rng(0)
    wide = 3 * rng.standard_normal(V)
    flat = 0.01 * rng.standard_normal(V)
    peaked = rng.standard_normal(V)
    peaked[[7, 900]] = 12.0  # two equal peaks
    ties = np.round(2 * rng.standard_normal(V)) / 2  # a handful of distinct values
    holes = 3 * rng.standard_normal(V)
    holes[rng.random(V) < 0.6] = -np.inf
    few = np.full(V, -np.inf)
    few[[3, 1400, 1499]] = [1.0, 2.0, 2.0]
    return jnp.asarray(np.stack([wide, flat, peaked, ties, holes, few]).reshape(2, 3, V), dtype)


def _key(seed: int) -> jax.Array:
    return jax.random.key_data(jax.random.PRNGKey(seed))


@functools.partial(jax.jit, static_argnames=("form",))
def _reference(logits: jax.Array, key: jax.Array, form: str) -> jax.Array:
    return sample_reference(logits, key, form=form, **PARAMS)


def _supported() -> list[tuple[str, Any]]:
    return [(form, dtype) for dtype in (jnp.float32, jnp.bfloat16) for form in sampling.FORMS
            if sampling.check(form, sampling.dtype_name(dtype), (6, V), PARAMS["k"]) is None]


# The two kernels share every pass (sampling.sample_block) and differ in grid, tiles and loads, so the
# GPU kernel runs a cross-section: each pass kind and the bf16 noise. Compiles dominate the file's time.
GPU_CASES = {("greedy", jnp.float32), ("temperature", jnp.bfloat16), ("top_k", jnp.float32),
             ("top_k_top_p_mask", jnp.float32), ("min_p", jnp.float32), ("greedy_softmax", jnp.bfloat16)}
CASES = [pytest.param("tpu", form, dtype, id=f"tpu-{form}-{jnp.dtype(dtype).name}") for form, dtype in _supported()]
CASES += [pytest.param("gpu", form, dtype, id=f"gpu-{form}-{jnp.dtype(dtype).name}") for form, dtype in _supported()
          if (form, dtype) in GPU_CASES]


@pytest.mark.parametrize(("backend", "form", "dtype"), CASES)
def test_kernel_draws_the_reference_tokens(backend: str, form: str, dtype: Any) -> None:  # noqa: ANN401
    logits = _logits(dtype)
    kernel = jax.jit(functools.partial(sample, form=form, backend=backend, block_sizes=BLOCKS[backend],
                                       interpret=True, **PARAMS))
    for seed in SEEDS:
        got, want = kernel(logits, _key(seed)), _reference(logits, _key(seed), form)
        assert got.shape == want.shape == (2, 3) and got.dtype == jnp.int32
        np.testing.assert_array_equal(got, want, err_msg=f"{form} {dtype} seed {seed}")


def test_every_form_and_dtype_is_covered() -> None:
    """Forms the kernel keeps as composites are exactly the documented ones."""
    kept = {(form, dtype) for form in sampling.FORMS for dtype in (jnp.float32, jnp.bfloat16)} - set(_supported())
    assert kept == {(form, jnp.bfloat16) for form in sampling.BF16_UNSUPPORTED}
    assert GPU_CASES <= set(_supported())


@pytest.mark.parametrize(
    ("backend", "form", "dtype", "extra"),
    [
        ("tpu", "top_k", jnp.float32, dict(k=1)),  # one rank: the noise is irrelevant, the max's lowest id wins
        ("gpu", "temperature_top_k", jnp.bfloat16, dict(k=V)),  # every token ranked, counters row * V + rank
        ("tpu", "top_k_top_p_mask", jnp.float32, dict(k=300, p=0.5)),
        ("gpu", "top_p_mask", jnp.float32, dict(p=1.0)),  # the whole mass: f32 rounding decides whether all stay
        ("tpu", "min_p", jnp.float32, dict(min_p=0.5, temperature=2.0)),
    ],
    ids=["k1", "k_vocab_bf16", "k300_p05", "p1", "min_p05_t2"],
)
def test_edge_parameters(backend: str, form: str, dtype: Any, extra: dict[str, Any]) -> None:  # noqa: ANN401
    params = {**PARAMS, **extra}
    logits = _logits(dtype)
    kernel = jax.jit(functools.partial(sample, form=form, backend=backend, block_sizes=BLOCKS[backend],
                                       interpret=True, **params))
    for seed in SEEDS:
        want = sample_reference(logits, _key(seed), form=form, **params)
        np.testing.assert_array_equal(kernel(logits, _key(seed)), want, err_msg=f"{backend} {form} {extra} {seed}")


@pytest.mark.parametrize(
    ("form", "dtype"),
    [("top_k", jnp.float32), ("top_k_top_p_mask", jnp.float32), ("categorical", jnp.bfloat16)],
)
def test_tpu_interpreter_proper(form: str, dtype: Any) -> None:  # noqa: ANN401
    """pltpu.InterpretParams: block reads are bounds-checked and uninitialised VMEM is NaN."""
    logits = _logits(dtype)
    got = sample(logits, _key(5), form=form, backend="tpu", block_sizes=BLOCKS["tpu"],
                 interpret=pltpu.InterpretParams(), **PARAMS)
    np.testing.assert_array_equal(got, sample_reference(logits, _key(5), form=form, **PARAMS))


def test_default_tiles_and_rank1_logits() -> None:
    """The default blocks (one TPU tile of 1536 lanes, 16 bf16 rows) and a (V,) row."""
    logits = _logits(jnp.bfloat16)[0, 0]
    for backend in ("tpu", "gpu"):
        got = sample(logits, _key(1), form="temperature", temperature=0.7, backend=backend, interpret=True)
        assert got.shape == ()
        assert int(got) == int(sample_reference(logits, _key(1), form="temperature", temperature=0.7))


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_greedy_softmax_is_certified_away_from_ties(backend: str, dtype: Any) -> None:  # noqa: ANN401
    """argmax(softmax(x)): the kernel's argmax where no token lies less than SOFTMAX_TIE_MARGIN below the max,
    UNCERTIFIED (then the program's own softmax) where one does or the max is NaN or +inf."""
    x = tie_rows(dtype, SOFTMAX_TIE_MARGIN[jnp.dtype(dtype).name])
    options = dict(form="greedy_softmax", backend=backend, block_sizes=BLOCKS[backend], interpret=True)
    raw = sampling._run(x, None, "greedy_softmax", {}, backend, BLOCKS[backend], True, 0)[0]
    check_certified(raw, UNCERTIFIED, x, jax.jit(functools.partial(sample, **options))(x, None))


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_nucleus_draw_that_rounding_decides_is_left_to_the_program(backend: str) -> None:
    """nucleus_rounding's row as row ROW of a batch: the token its draw lands on is kept only by the program's f32
    rounding of its cumsum, which the kernel cannot know, so the kernel leaves the row UNCERTIFIED and `sample` gives
    the program's token."""
    x, p = nucleus_rounding.rounded_cut()
    key = jnp.asarray(nucleus_rounding.KEY, jnp.uint32)
    params = dict(temperature=nucleus_rounding.TEMPERATURE, p=p, k=0, min_p=0.0)
    raw = sampling._run(x, key, "top_p_mask", params, backend, BLOCKS[backend], True, nucleus_rounding.ROW)[0]
    assert int(raw[0]) == UNCERTIFIED
    got = sample(x, key, form="top_p_mask", temperature=params["temperature"], p=p, backend=backend,
                 block_sizes=BLOCKS[backend], interpret=True, row_offset=nucleus_rounding.ROW)
    assert int(got[0]) == nucleus_rounding.program_token(x, p)


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_rank_space_top_k_ranks_positive_zero_above_negative_zero(backend: str) -> None:
    """lax.top_k ranks +0 above -0 (XLA's total order), then by the lower id: the rank-space draw's noise follows the
    rank, so the kernel must rank the same (rows of -0 and +0 at the top of the row)."""
    x = np.full((2, V), -5.0, np.float32)
    x[:, :40:2], x[:, 1:40:2] = -0.0, 0.0
    x[1, 3:40:4] = -0.0
    x = jnp.asarray(x)
    for seed in SEEDS:
        got = sample(x, _key(seed), form="top_k", temperature=0.7, k=20, backend=backend,
                     block_sizes=BLOCKS[backend], interpret=True)
        np.testing.assert_array_equal(got, sample_reference(x, _key(seed), form="top_k", temperature=0.7, k=20))


# ----------------------------------------------------------------------------- vocabulary splits


@functools.partial(jax.jit, static_argnames=("form", "backend", "splits", "shard_rows"))
def _split_sampled(logits: jax.Array, key: jax.Array, form: str, backend: str, splits: int,
                   shard_rows: int) -> jax.Array:
    """The (R, V) rows cut as a mesh of devices would cut them: `splits` vocabulary ranges times row shards of
    `shard_rows`, each sampled on its own by `sample_split`, then merged over the ranges."""
    rows, vocab = logits.shape
    width = vocab // splits
    ids, scores = [], []
    for p in range(splits):
        parts = [sampling.sample_split(logits[r0:r0 + shard_rows, p * width:(p + 1) * width], key, form=form,
                                       vocab_total=vocab, vocab_offset=jnp.int32(p * width), row_offset=jnp.int32(r0),
                                       temperature=PARAMS["temperature"], backend=backend,
                                       block_sizes=BLOCKS[backend], interpret=True)
                 for r0 in range(0, rows, shard_rows)]
        ids.append(jnp.concatenate([i for i, _ in parts]))
        scores.append(jnp.concatenate([s for _, s in parts]))
    return merge_vocab_splits(jnp.stack(ids, axis=1), jnp.stack(scores, axis=1))


def _with_nan(logits: jax.Array) -> jax.Array:
    """The six rows, then the peaked row with a NaN in its second and its third range (jnp.argmax: the first
    NaN wins)."""
    nan_row = logits.reshape(6, V)[2].at[700].set(jnp.nan).at[1200].set(jnp.nan)
    return jnp.concatenate([logits.reshape(6, V), nan_row[None]])


SPLIT_CASES = [pytest.param("tpu", form, dtype, id=f"tpu-{form}-{jnp.dtype(dtype).name}")
               for form in sampling.SPLIT_FORMS for dtype in (jnp.float32, jnp.bfloat16)]
SPLIT_CASES += [pytest.param("gpu", "temperature", jnp.bfloat16, id="gpu-temperature-bfloat16"),
                pytest.param("gpu", "greedy", jnp.float32, id="gpu-greedy-float32")]


@pytest.mark.parametrize(("backend", "form", "dtype"), SPLIT_CASES)
def test_vocabulary_splits_merge_into_the_reference_tokens(backend: str, form: str, dtype: Any) -> None:  # noqa: ANN401
    # Three ranges of 500 tokens (whole lane tiles of neither kernel), rows cut in shards of 3 and 4 (a row
    # offset that is not a block's): the "few" row has a range of only -inf and its tie across ranges.
    logits = _with_nan(_logits(dtype))
    for seed in SEEDS:
        want = sample_reference(logits, _key(seed), form=form, **PARAMS)
        for shard_rows in (7, 3):
            got = _split_sampled(logits, _key(seed), form, backend, 3, shard_rows)
            np.testing.assert_array_equal(got, want, err_msg=f"{form} {dtype} seed {seed} shards of {shard_rows}")


def test_vocabulary_split_rejects_forms_that_need_the_whole_row() -> None:
    with pytest.raises(ValueError, match="cannot be sampled per vocabulary split"):
        sampling.sample_split(_logits(jnp.float32)[0], _key(0), form="top_k", vocab_total=2 * V, vocab_offset=0)


# ----------------------------------------------------------------------------- pieces


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_in_kernel_gumbel_is_jax_random_gumbel_bit_for_bit(dtype: Any) -> None:  # noqa: ANN401
    bf16 = jnp.dtype(dtype) == jnp.bfloat16
    for seed in (0, 11, 2**31 + 5):
        key = jnp.asarray([seed % 2**32, (seed * 7919) % 2**32], jnp.uint32)
        k0, k1 = noise.key_words(key)
        counters = jnp.arange(3 * 700, dtype=jnp.int32).reshape(3, 700)
        got = jax.jit(lambda c, k0=k0, k1=k1: noise.gumbel(noise.threefry_bits(k0, k1, c), bf16))(counters)
        want = jax.random.gumbel(key, (3, 700), dtype).astype(jnp.float32)
        np.testing.assert_array_equal(np.asarray(got).view(np.uint32), np.asarray(want).view(np.uint32))


def test_order_key_preserves_float_order() -> None:
    # (No subnormals: XLA's CPU flushes them, so they compare equal to 0 and rightly map to 0 as well.)
    values = np.array([-np.inf, -3e38, -1.5, -1e-30, -0.0, 0.0, 1e-30, 1.0, 2.5, 3e38, np.inf], np.float32)
    keys = np.asarray(sampling.order_key(jnp.asarray(values)))
    assert np.all(np.diff(keys[values != 0]) > 0)
    assert keys[4] == keys[5] == 0 and keys[3] < 0 < keys[6]  # -0 == +0
    back = np.asarray(sampling.from_order_key(jnp.asarray(keys)))
    np.testing.assert_array_equal(back[values != 0].view(np.uint32), values[values != 0].view(np.uint32))


@pytest.mark.parametrize(
    ("form", "dtype", "shape", "k", "reason"),
    [
        ("top_p_mask", "bf16", (2, 100), 0, "thresholds bf16-rounded probabilities"),
        ("min_p", "bf16", (2, 100), 0, "thresholds bf16-rounded probabilities"),
        ("temperature", "f16", (2, 100), 0, "takes f32 or bf16 logits, not f16"),
        ("top_k", "f32", (2, 100), 101, "needs 1 <= k <= V"),
        ("temperature", "f32", (2**17, 2**16), 0, "counters below 2**32"),
    ],
)
def test_what_the_kernel_does_not_take(form: str, dtype: str, shape: tuple[int, ...], k: int, reason: str) -> None:
    why = sampling.check(form, dtype, shape, k)
    assert why is not None and reason in why
    if dtype in ("f32", "bf16") and len(shape) == 2 and shape[0] * shape[1] < 2**20:
        logits = jnp.zeros(shape, jnp.float32 if dtype == "f32" else jnp.bfloat16)
        with pytest.raises(ValueError, match=reason):
            sample(logits, _key(0), form=form, k=k, backend="tpu", interpret=True)


def test_block_sizes_are_validated() -> None:
    with pytest.raises(ValueError, match="block_v % 128"):
        sample(_logits(jnp.float32), _key(0), form="greedy", backend="tpu", block_sizes=BlockSizes(8, 100))
    with pytest.raises(ValueError, match="power-of-two block_v"):
        sample(_logits(jnp.float32), _key(0), form="greedy", backend="gpu", block_sizes=BlockSizes(1, 300))
    with pytest.raises(ValueError, match="needs a key"):
        sample(_logits(jnp.float32), None, form="categorical", backend="gpu")
    with pytest.raises(ValueError, match="VMEM"):
        jax.eval_shape(functools.partial(sample, key=None, form="greedy", backend="tpu"),
                       jax.ShapeDtypeStruct((8, 2**21), jnp.float32))
