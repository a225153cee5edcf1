"""hlofuse.partition.vocab_ranges: a sampler's vocabulary cut into ranges, run range by range as the shards of a mesh
would run them, gives `sample_reference`'s ids exactly (Pallas tpu kernel in interpret mode)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlofuse.kernels import CompositeCall
from hlofuse.kernels.pallas import sampling as pallas_sampling
from hlofuse.kernels.sampling_reference import sample_reference
from hlofuse.partition.ranges import RangeSplit, ShardPass

PARAMS = {"temperature": 0.7, "k": 20, "p": 1.0, "min_p": 0.05}


def _per_shard(shard_pass: ShardPass, prepared: list[Any], shards: dict[str, int]) -> list[Any]:
    """`shard_pass` on every shard's slice of `prepared` (each dim labelled in `shards` cut into that many
    parts), its results put back together along the same dims: what the manual computation computes."""
    labels = list(shards)
    grid = np.ndindex(*(shards[label] for label in labels))
    pieces: dict[tuple[int, ...], Any] = {}
    for index in grid:
        where = dict(zip(labels, index, strict=True))

        def cut(x: Any, dims: tuple[str, ...], where: dict[str, int] = where) -> Any:  # noqa: ANN401
            slices = []
            for size, label in zip(x.shape, dims, strict=True):
                part = size // shards[label] if label in shards else size
                start = where[label] * part if label in shards else 0
                slices.append(slice(start, start + part))
            return x[tuple(slices)]

        pieces[index] = shard_pass.shard(*(cut(x, dims) for x, dims in zip(prepared, shard_pass.operands,
                                                                            strict=True)))
    results = []
    for i, dims in enumerate(shard_pass.results):
        def assemble(prefix: tuple[int, ...], depth: int, i: int = i, dims: tuple[str, ...] = dims) -> Any:  # noqa: ANN401
            if depth == len(labels):
                return pieces[prefix][i]
            if labels[depth] not in dims:  # replicated along this label: every shard holds the same value
                return assemble((*prefix, 0), depth + 1)
            parts = [assemble((*prefix, j), depth + 1) for j in range(shards[labels[depth]])]
            return jnp.concatenate(parts, axis=dims.index(labels[depth]))
        results.append(assemble((), 0))
    return results


def run_by_shards(split: RangeSplit, operands: list[Any], shards: dict[str, int]) -> Any:  # noqa: ANN401
    prepared = list(split.prepare(*operands))
    if split.first is not None and split.between is not None:
        prepared = list(split.between(*prepared, *_per_shard(split.first, prepared, shards)))
    partial = _per_shard(ShardPass(split.shard, split.operands, split.results), prepared, shards)
    return split.merge(*partial)


def _logits(rows: int, vocab: int, seed: int) -> np.ndarray:
    """Normal rows, then rows with: a NaN; ties at the k-th value spread over the ranges; one range all -inf."""
    rng = np.random.default_rng(seed)
    x = 2 * rng.standard_normal((rows, vocab)).astype(np.float32)
    x[1, vocab // 2] = np.nan
    x[2] = np.round(x[2])  # a handful of values, each shared by tokens of every range
    x[3, : vocab // 3] = -np.inf
    return x


FORMS = [form for form in pallas_sampling.VOCAB_SPLIT_FORMS]
CASES = [pytest.param(form, dtype, vocab, id=f"{form}-{jnp.dtype(dtype).name}-V{vocab}")
         for form in FORMS for dtype in (jnp.float32, jnp.bfloat16) for vocab in (1500, 48)
         if not (dtype == jnp.bfloat16 and form in pallas_sampling.BF16_UNSUPPORTED)]


@pytest.mark.parametrize(("form", "dtype", "vocab"), CASES)
def test_ranges_run_by_shards_give_the_reference_ids(form: str, dtype: Any, vocab: int) -> None:  # noqa: ANN401
    # V = 48 in 3 ranges of 16 < k = 20: a range's candidates are all its tokens.
    rows = 6
    call = CompositeCall("hlofuse.sample", 1, {"form": form, "mode": form, **PARAMS},
                         (((rows, vocab), "bf16" if dtype == jnp.bfloat16 else "f32"), ((2,), "ui32")))
    split = pallas_sampling.vocab_split(call, "tpu-interpret", 3)
    run = jax.jit(functools.partial(run_by_shards, split, shards={"r": 2, "v": 3}))
    x = jnp.asarray(_logits(rows, vocab, 0), dtype)
    for seed in range(3):
        key = jax.random.key_data(jax.random.PRNGKey(seed))
        want = sample_reference(x, key, form=form, **PARAMS)
        np.testing.assert_array_equal(run([x, key]), want, err_msg=f"{form} seed {seed}")


@pytest.mark.parametrize("form", ["top_k_mask", "top_k", "temperature_top_k"])
def test_the_kth_largest_weighs_as_much_as_the_first(form: str) -> None:
    """Rows whose top 20 are nearly equal and spread over the ranges: the 20th token wins about one draw in
    20, so a row's k-th value taken one rank off changes some of the 128 draws."""
    rows, vocab = 64, 48
    rng = np.random.default_rng(1)
    x = np.full((rows, vocab), -3.0, np.float32)
    for row in range(rows):
        x[row, rng.permutation(vocab)[:20]] = 5.0 + 0.001 * np.arange(20)
    call = CompositeCall("hlofuse.sample", 1, {"form": form, "mode": form, **PARAMS},
                         (((rows, vocab), "f32"), ((2,), "ui32")))
    run = jax.jit(functools.partial(run_by_shards, pallas_sampling.vocab_split(call, "tpu-interpret", 3),
                                    shards={"r": 2, "v": 3}))
    for seed in range(2):
        key = jax.random.key_data(jax.random.PRNGKey(seed))
        np.testing.assert_array_equal(run([jnp.asarray(x), key]), sample_reference(x, key, form=form, **PARAMS))


def test_forms_that_need_the_whole_row_are_refused() -> None:
    call = CompositeCall("hlofuse.sample", 1, {"form": "top_p_mask", "mode": "top_p", **PARAMS},
                         (((4, 64), "f32"), ((2,), "ui32")))
    with pytest.raises(ValueError, match="cannot be sampled per vocabulary split"):
        pallas_sampling.vocab_split(call, "tpu", 4)
