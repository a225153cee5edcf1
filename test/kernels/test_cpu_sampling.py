"""The native CPU sampler against the reference forms: equal token ids over distributions, keys and sizes."""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from softmax_ties import check_certified, tie_rows

from hlofuse.kernels import CompositeCall
from hlofuse.kernels.cpu import sampling
from hlofuse.kernels.sampling_reference import SOFTMAX_TIE_MARGIN, UNCERTIFIED, merge_vocab_splits, sample_reference

pytestmark = pytest.mark.skipif(not sampling.is_available(), reason="the native CPU kernels are not built")

PARAMS = {"greedy": {}, "greedy_softmax": {}, "categorical": {}, "temperature": {"temperature": 0.7},
          "top_k": {"temperature": 0.6, "k": 40}, "temperature_top_k": {"temperature": 1.3, "k": 7},
          "top_k_mask": {"temperature": 0.8, "k": 50}, "top_p_mask": {"temperature": 0.7, "p": 0.9},
          "top_k_top_p_mask": {"temperature": 0.6, "k": 64, "p": 0.8}, "min_p": {"temperature": 0.9, "min_p": 0.05}}


def _logits(kind: str, shape: tuple[int, int], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    if kind == "peaked":
        x *= 8
    elif kind == "ties":
        x = np.round(x * 2) / 2
    elif kind == "neg_inf":
        x[rng.random(shape) < 0.5] = -np.inf
    elif kind == "flat":
        x[:] = 0
    elif kind == "nan":  # by row: a NaN; a -NaN (last in lax.top_k's order); a NaN beside a +inf; all NaN
        for row in range(shape[0]):
            at = rng.integers(shape[1], size=2)
            pattern = (row + seed) % 4
            x[row, at[0]] = (np.nan, -np.nan, np.nan, np.nan)[pattern]
            if pattern == 2:
                x[row, at[1]] = np.inf
            elif pattern == 3:
                x[row] = np.nan
    return x


def _kernel_and_reference(form: str, dtype: str) -> tuple[np.dtype, Callable[..., jax.Array],
                                                           Callable[..., jax.Array]]:
    """The logits' numpy dtype and the jitted kernel and reference for `form` with its PARAMS (skips the
    bf16 forms the kernel leaves to XLA)."""
    if dtype == "bfloat16" and form in sampling.BF16_UNSUPPORTED:
        pytest.skip("bf16 probabilities are not reproduced")
    params = PARAMS[form]
    ref = jax.jit(lambda x, key: sample_reference(x, key, form=form, **params))
    ker = jax.jit(lambda x, key: sampling.sample(x, key, form=form, **params))
    return np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype), ker, ref


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_softmax_is_certified_away_from_ties(dtype: str) -> None:
    """argmax(softmax(x)): the kernel's argmax where no token lies less than the margin below the max (2^-17 for
    f32, 2^-5 for bf16), UNCERTIFIED (then the program's own softmax) where one does or the max is NaN or +inf."""
    x = tie_rows(dtype, SOFTMAX_TIE_MARGIN[dtype])
    (raw,) = sampling._sample_call(x, sampling._keys(None, (6,)), jax.lax.iota(jnp.int32, 6), form="greedy_softmax",
                                   temperature=1.0, k=0, p=1.0, min_p=0.0)
    tokens = jax.jit(functools.partial(sampling.sample, form="greedy_softmax"))(x, None)
    check_certified(raw, UNCERTIFIED, x, tokens)


@pytest.mark.parametrize("form", sorted(PARAMS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kernel_matches_reference(form: str, dtype: str) -> None:
    np_dtype, ker, ref = _kernel_and_reference(form, dtype)
    for shape in ((3, 1000), (1, 4099)):
        for kind in ("normal", "peaked", "ties", "neg_inf", "flat", "nan"):
            for seed in range(3):
                x = jnp.asarray(_logits(kind, shape, seed).astype(np_dtype))
                key = jnp.array([seed * 7919, 12345 + seed], jnp.uint32)
                np.testing.assert_array_equal(ker(x, key), ref(x, key), err_msg=f"{kind} {shape} seed {seed}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_row_of_minus_inf_draws_index_0_with_no_noise(dtype: str) -> None:
    """A filter that keeps nothing leaves a row of -inf, whose every score is -inf: jax.random.categorical gives index
    0, and the kernel gives it without drawing the row's noise (it once drew all of it: no score raised its bound)."""
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    x = np.random.default_rng(2).standard_normal((3, 5000)).astype(np_dtype)
    x[1] = -np.inf
    key = jnp.array([5, 6], jnp.uint32)
    ref = jax.jit(lambda x, key: sample_reference(x, key, form="categorical", temperature=0.7))(jnp.asarray(x), key)
    sampling.noise_stats()
    np.testing.assert_array_equal(sampling.sample(jnp.asarray(x[1:2]), key, form="categorical", temperature=0.7), [0])
    assert sampling.noise_stats()[0] == 0
    np.testing.assert_array_equal(sampling.sample(jnp.asarray(x), key, form="categorical", temperature=0.7), ref)
    assert int(ref[1]) == 0


@pytest.mark.parametrize("form", ["temperature", "top_k_mask", "top_p_mask", "min_p"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kernel_matches_reference_at_temperature_1(form: str, dtype: str) -> None:
    """At T = 1 an f32 draw reads the logits as they are (no scaled copy; the top-p band's max as the draw's): the
    program's ids, NaN rows included."""
    if dtype == "bfloat16" and form in sampling.BF16_UNSUPPORTED:
        pytest.skip("bf16 probabilities are not reproduced")
    params = {**PARAMS[form], "temperature": 1.0}
    ref = jax.jit(lambda x, key: sample_reference(x, key, form=form, **params))
    ker = jax.jit(lambda x, key: sampling.sample(x, key, form=form, **params))
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    for kind in ("normal", "peaked", "ties", "neg_inf", "nan"):
        for seed in range(3):
            x = jnp.asarray(_logits(kind, (4, 3001), seed).astype(np_dtype))
            key = jnp.array([seed * 7919, 12345 + seed], jnp.uint32)
            np.testing.assert_array_equal(ker(x, key), ref(x, key), err_msg=f"{kind} seed {seed}")


def test_bf16_noise_is_exact_for_every_random_byte() -> None:
    """bf16 Gumbel noise has 128 values; with flat logits the winner is the first token of the largest."""
    x = jnp.zeros((64, 512), jnp.bfloat16)
    for seed in range(4):
        key = jnp.array([seed, 99], jnp.uint32)
        np.testing.assert_array_equal(sampling.sample(x, key, form="categorical"),
                                      sample_reference(x, key, form="categorical"))


@pytest.mark.parametrize("form", sorted(PARAMS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rows_split_across_threads_match_reference(form: str, dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fewer rows than threads and a vocabulary of several 32768-token chunks: each row's chunks run on the
    pool and combine in chunk order. The ids must be the reference's, and the same with the split off."""
    np_dtype, ker, ref = _kernel_and_reference(form, dtype)
    for shape in ((1, 100_003), (2, 70_000)):
        for kind, seed in (("normal", 0), ("peaked", 1), ("ties", 2), ("neg_inf", 3)):
            x = jnp.asarray(_logits(kind, shape, seed).astype(np_dtype))
            key = jnp.array([seed * 31, 777 + seed], jnp.uint32)
            want = np.asarray(ref(x, key))
            np.testing.assert_array_equal(np.asarray(ker(x, key)), want, err_msg=f"{kind} {shape} split")
            with monkeypatch.context() as env:
                env.setenv("HLOFUSE_SAMPLE_NO_SPLIT", "1")
                np.testing.assert_array_equal(np.asarray(ker(x, key)), want, err_msg=f"{kind} {shape} unsplit")


# Vocabulary splits (the multi-device layout, sampling.partitioned_lowering): each split's call and the
# merge over splits give `sample_reference`'s ids. V is not a multiple of the kernel's vector lanes, its
# 256-candidate noise chunks or its 32768-token row chunks in most of these shapes, and (1, 3, 23000) splits
# a row wider than one row chunk.
SPLIT_SHAPES = ((3, 8, 125), (2, 4, 1037), (1, 3, 23000), (5, 2, 1))


@pytest.mark.parametrize("form", sampling.SPLIT_FORMS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_split_calls_and_merge_match_reference(form: str, dtype: str) -> None:
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    params = PARAMS[form]
    ref = jax.jit(lambda x, key: sample_reference(x, key, form=form, **params))

    @jax.jit
    def split(x: jax.Array, key: jax.Array) -> jax.Array:
        rows, vocab = x.shape
        ids, scores = sampling.sample_splits(x.reshape(rows, splits, vocab // splits), key, form=form,
                                             temperature=params.get("temperature", 1.0))
        return merge_vocab_splits(ids, scores)

    for rows, splits, width in SPLIT_SHAPES:
        for kind in ("normal", "peaked", "ties", "neg_inf", "flat", "nan"):
            for seed in range(3):
                x = jnp.asarray(_logits(kind, (rows, splits * width), seed).astype(np_dtype))
                key = jnp.array([seed * 7919, 12345 + seed], jnp.uint32)
                np.testing.assert_array_equal(split(x, key), ref(x, key),
                                              err_msg=f"{kind} {(rows, splits, width)} seed {seed}")


def test_split_scores_are_the_winners() -> None:
    """Greedy: each split's winner is its first largest logit (global id) and its score that logit; NaN wins
    the merge as it wins jnp.argmax, and an all -inf row picks id 0."""
    x = np.asarray(_logits("normal", (3, 40), 0))
    x[1, 17] = np.nan
    x[1, 33] = np.nan
    x[2] = -np.inf
    ids, scores = sampling.sample_splits(jnp.asarray(x).reshape(3, 4, 10), None, form="greedy")
    want_ids = np.argmax(x.reshape(3, 4, 10), axis=-1) + np.arange(4) * 10
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(scores, np.take_along_axis(x, want_ids, axis=-1))
    np.testing.assert_array_equal(merge_vocab_splits(ids, scores), np.argmax(x, axis=-1))


def test_splits_reject_threshold_forms() -> None:
    with pytest.raises(ValueError, match="cannot be sampled per vocabulary split"):
        sampling.sample_splits(jnp.zeros((1, 2, 8)), jnp.zeros((2,), jnp.uint32), form="top_k_mask")


def _sample_call(form: str, shape: tuple[int, ...], dtype: str) -> CompositeCall:
    params = PARAMS[form]
    attrs = {"mode": form, "form": form, **params}
    operands = ((shape, dtype), ((2,), "ui32"))
    return CompositeCall("hlofuse.sample", 1, attrs, operands)


@pytest.mark.parametrize("form", sorted(PARAMS))
@pytest.mark.parametrize("shape", [(2, 3, 1024), (3, 1001)])
def test_partitioned_lowering_matches_reference(form: str, shape: tuple[int, ...]) -> None:
    """The multi-device lowering on 8 devices: split forms with V a multiple of 8, else whole rows with a
    remark; the same ids either way."""
    fn = sampling.partitioned_lowering(_sample_call(form, shape, "f32"), 8)
    splits = form in (*sampling.SPLIT_FORMS, *sampling.TOP_K_FORMS, *sampling.MASKED_FORMS) and shape[-1] % 8 == 0
    assert (sampling.whole_row_remark(_sample_call(form, shape, "f32"), 8) is None) == splits
    x = jnp.asarray(_logits("normal", (int(np.prod(shape[:-1])), shape[-1]), 1)).reshape(shape)
    key = jnp.array([3, 4], jnp.uint32)
    ref = sample_reference(x, key, form=form, **PARAMS[form])
    np.testing.assert_array_equal(jax.jit(fn)(x, key), ref)
    text = jax.jit(fn).lower(x, key).as_text()
    rank_space = form in ("top_k", "temperature_top_k")  # draw among packed candidates, no vocab_total
    assert (f"vocab_total = {shape[-1]}" in text) == (splits and not rank_space)
    # (top-k + top-p's own cut, for a row drawn in its nucleus's band, masks by the kernel's top-k too)
    assert ("hlofuse_sample_top_k" in text) == ((splits and form in sampling.TOP_K_FORMS) or form == "top_k_top_p_mask")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_top_k_candidates_are_the_splits_top_k(dtype: str) -> None:
    """Each split's top min(k, W) with global ids: value descending in XLA's total order (+0 above -0, as
    lax.top_k ranks them; the flat rows hold both), lower id first on ties (a stable sort; XLA's CPU lax.top_k
    itself breaks ties out of order once k nears the row, seen at k >= 1000 of 1037)."""
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    for kind in ("normal", "ties", "neg_inf", "flat"):
        x = np.asarray(_logits(kind, (3, 4 * 1037), 0).astype(np_dtype)).reshape(3, 4, 1037)
        bits = x.astype(np.float32).view(np.int32).astype(np.int64)
        total = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # XLA's total order of the floats, ascending
        order = np.argsort(-total, axis=-1, kind="stable")
        for k in (1, 50, 2000):
            values, ids = sampling.top_k_candidates(jnp.asarray(x), k)
            want_ids = order[..., :min(k, 1037)]
            np.testing.assert_array_equal(values, np.take_along_axis(x, want_ids, axis=-1).astype(np.float32),
                                          err_msg=f"{kind} k={k}")
            np.testing.assert_array_equal(ids, want_ids + (np.arange(4) * 1037)[None, :, None],
                                          err_msg=f"{kind} k={k}")


@pytest.mark.parametrize("form", ["top_k_mask", "top_k", "temperature_top_k"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("k", [1, 50, 300])
def test_top_k_splits_match_reference(form: str, dtype: str, k: int) -> None:
    """The top-k forms over P vocabulary splits against `sample_reference`, over several keys; k = 300
    exceeds a split's 125. top_k_mask: the k-th value from the splits' candidates, then temperature per
    split and the merge; top_k / temperature_top_k: the rank-space draw among the packed candidates."""
    _assert_splits_match_reference(form, {"temperature": 0.8, "k": k}, dtype)


def test_min_p_splits_match_reference() -> None:
    """min_p over P vocabulary splits: the program's own mask (softmax against the row's largest), then a
    categorical draw per split and the merge."""
    _assert_splits_match_reference("min_p", {"temperature": 0.9, "min_p": 0.05}, "float32")


def _assert_splits_match_reference(form: str, params: dict[str, float], dtype: str) -> None:
    """partitioned_lowering with P = the split count against `sample_reference`, over the split shapes,
    distributions and keys."""
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    ref = jax.jit(lambda x, key: sample_reference(x, key, form=form, **params))
    for rows, splits, width in SPLIT_SHAPES[:3]:
        call = CompositeCall("hlofuse.sample", 1, {"mode": form, "form": form, **params},
                             (((rows, splits * width), "bf16" if dtype == "bfloat16" else "f32"), ((2,), "ui32")))
        fn = jax.jit(sampling.partitioned_lowering(call, splits))
        for kind in ("normal", "peaked", "ties", "neg_inf", "flat", "nan"):
            for seed in range(3):
                x = jnp.asarray(_logits(kind, (rows, splits * width), seed).astype(np_dtype))
                key = jnp.array([seed * 7919, 12345 + seed], jnp.uint32)
                np.testing.assert_array_equal(fn(x, key), ref(x, key),
                                              err_msg=f"{kind} {(rows, splits, width)} seed {seed}")


def test_isa_cap_shared_with_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    """HLOFUSE_CPU_ISA is shared with the attention kernel: its wider names leave the sampler at its widest,
    the narrower ones cap it."""
    monkeypatch.delenv("HLOFUSE_CPU_ISA", raising=False)
    widest = sampling.isa()
    for name in ("amx", "amx-emulated", "avx512bf16", "avx512"):
        monkeypatch.setenv("HLOFUSE_CPU_ISA", name)
        assert sampling.isa() == widest, name
    monkeypatch.setenv("HLOFUSE_CPU_ISA", "generic")
    assert sampling.isa() == "generic"


@pytest.mark.parametrize("form", ["temperature", "top_k", "top_p_mask"])
def test_every_isa_draws_alike_at_every_vector_boundary(form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The candidate scans (CollectRange) of each ISA write a block's hits their own way (AVX2 stores a whole
    table row past the hits while two blocks remain, then goes bit by bit): at row lengths on either side of one
    and two blocks and past a 32768-token chunk, and from hits in every lane (logits nearly flat under the noise)
    to rare ones (peaked), every ISA must give the reference's ids."""
    for vocab in (7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 33, 32783, 65541):
        params = {name: min(value, vocab) if name == "k" else value for name, value in PARAMS[form].items()}
        ref = jax.jit(functools.partial(sample_reference, form=form, **params))
        ker = jax.jit(functools.partial(sampling.sample, form=form, **params))
        for scale in (0.05, 1.0, 8.0):
            x = jnp.asarray(np.random.default_rng(vocab).standard_normal((3, vocab)).astype(np.float32) * scale)
            key = jnp.array([vocab, 4242], jnp.uint32)
            want = np.asarray(ref(x, key))
            for isa in ("avx2", "generic"):
                monkeypatch.setenv("HLOFUSE_CPU_ISA", isa)
                np.testing.assert_array_equal(np.asarray(ker(x, key)), want, err_msg=f"{isa} V={vocab} x{scale}")
            monkeypatch.delenv("HLOFUSE_CPU_ISA")
            np.testing.assert_array_equal(np.asarray(ker(x, key)), want, err_msg=f"widest V={vocab} x{scale}")
