"""The CPU lowering of tpu-inference's sampler (`threshold_search_rows`: a top-k and a top-p each found by a search
over float32 bits, 32 reductions over the vocabulary each). The lowering reads the two thresholds off the kernel's
top candidates instead (`searched_top_k_cutoff`, `searched_top_p_threshold`); each analysis must give the search's
own threshold wherever it says it is certain, be certain on the rows a model gives (peaked ones), and the lowering
must give `sample_reference`'s ids on every row, certain or not, with no sort, no TopK and, on its certain path, no
search loop in the compiled program."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlofuse.kernels.cpu import sampling
from hlofuse.kernels.sampling_reference import (
    form_params,
    largest_float_not_meeting,
    sample_reference,
    search_top_k_mask,
)

pytestmark = pytest.mark.skipif(not sampling.is_available(), reason="the native CPU sampler is not built")

FORM = "threshold_search_rows"


def _rows(case: str, rows: int, vocab: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, vocab)).astype(np.float32)
    scale = {"flat": 0.3, "normal": 1.0, "model": 3.0 / 0.7, "peaked": 10.0}.get(case, 2.0)
    x *= scale
    if case == "ties":  # equal probabilities straddle the threshold
        x = np.round(x)
    elif case == "neg_inf":  # some rows keep fewer than k finite logits
        x[:, rng.random(vocab) < 0.99] = -np.inf
    elif case == "nan":
        x[0, 5] = np.nan
    elif case == "underflow":  # probabilities that underflow to 0 beside a few large ones
        x[:, :3] += 200.0
    return x


def _search_threshold(probs: jax.Array, p: jax.Array) -> jax.Array:
    """The top-p search's own threshold: the largest t whose mass of probs >= t is not below p (f32 sums)."""
    def below_p(t: jax.Array) -> jax.Array:
        return jnp.sum(jnp.where(probs >= t[:, None], probs, 0.0), axis=-1) < p

    return largest_float_not_meeting(probs.shape[:-1], below_p)


@pytest.mark.parametrize("candidates", [4096, 512], ids=["whole_row", "fewer_than_the_row"])
@pytest.mark.parametrize("case", ["flat", "normal", "model", "peaked", "ties", "underflow"])
def test_top_p_threshold_is_the_searchs_wherever_certain(case: str, candidates: int) -> None:
    rows, vocab = 64, 4096
    x = jnp.asarray(_rows(case, rows, vocab, seed=len(case) + candidates))
    p = jnp.asarray(np.random.default_rng(3).choice([0.0, 0.3, 0.9, 0.95, 0.999, 1.0], rows).astype(np.float32))
    probs = jax.nn.softmax(x, axis=-1)
    _, ids = jax.lax.top_k(x, candidates)
    threshold, certain = sampling.searched_top_p_threshold(jnp.take_along_axis(probs, ids, axis=-1), p,
                                                           candidates == vocab)
    want = _search_threshold(probs, p)
    certain, threshold, want = np.asarray(certain), np.asarray(threshold), np.asarray(want)
    np.testing.assert_array_equal(threshold[certain], want[certain])
    assert not certain[np.asarray(p) <= 0].any()  # p <= 0: no group's mass is below it, so no threshold is certain
    if case in ("peaked", "model", "underflow"):  # a model's rows at p <= 0.95: the search is rarely needed
        assert certain[(np.asarray(p) > 0) & (np.asarray(p) < 0.96)].mean() >= 0.9, certain


@pytest.mark.parametrize("candidates", [4096, 512], ids=["whole_row", "fewer_than_the_row"])
@pytest.mark.parametrize("case", ["flat", "normal", "model", "peaked", "ties", "underflow"])
def test_top_p_band_holds_the_searchs_threshold(case: str, candidates: int) -> None:
    """`searched_top_p_band`: wherever it holds, the search's own threshold lies in [lo, hi]; and on a model's rows
    the band is a few probabilities wide."""
    rows, vocab = 64, 4096
    x = jnp.asarray(_rows(case, rows, vocab, seed=len(case) + candidates))
    p = jnp.asarray(np.random.default_rng(3).choice([0.0, 0.3, 0.9, 0.95, 0.999, 1.0], rows).astype(np.float32))
    probs = jax.nn.softmax(x, axis=-1)
    _, ids = jax.lax.top_k(x, candidates)
    lo, hi, holds = (np.asarray(a) for a in sampling.searched_top_p_band(jnp.take_along_axis(probs, ids, axis=-1), p,
                                                                         candidates == vocab))
    want = np.asarray(_search_threshold(probs, p))
    assert np.all(lo[holds] <= want[holds]) and np.all(want[holds] <= hi[holds])
    assert not holds[np.asarray(p) <= 0].any()
    if case in ("model", "peaked"):
        in_band = np.sum((np.asarray(probs) >= lo[:, None]) & (np.asarray(probs) <= hi[:, None]), axis=-1)
        model_p = (np.asarray(p) > 0) & (np.asarray(p) < 0.96)
        assert holds[model_p].all() and np.all(in_band[model_p] <= 16), in_band


@pytest.mark.parametrize("whole_row", [False, True], ids=["candidates", "whole_row"])
def test_a_draw_is_vouched_for_where_the_threshold_is_not_certain(whole_row: bool) -> None:
    """Rows whose nucleus holds hundreds of tokens (3 N(0, 1) logits / 0.7 over 128256 ids; from the whole row,
    20000 ids of 1.2 N(0, 1), whose nucleus of thousands passes the candidates): the threshold itself is not certain
    (the tokens at the cut carry less mass than its slack), but the draw is vouched for wherever its winner lies above
    the band, and then it is the program's."""
    rows_of = 8
    if whole_row:
        x = jnp.asarray(_rows("flat", rows_of, 20000, seed=7) * 4.0)
    else:
        x = jnp.asarray(np.random.default_rng(7).standard_normal((rows_of, 128256)).astype(np.float32) * 3.0)
    rows = (jnp.full((rows_of,), 0.7), jnp.zeros((rows_of,), jnp.int32), jnp.full((rows_of,), 0.9))
    params = form_params(FORM)
    reference = jax.jit(lambda x, key, *rows: sample_reference(x, key, form=FORM, rows=rows, **params))
    categorical = sampling._draw_by_kernel(FORM)

    def draw(x: jax.Array, key: jax.Array, whole_row: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
        masks = sampling._searched_masks(x / 0.7, rows[1], rows[2], sampling.NEG_INF,
                                         lambda y: jax.nn.softmax(y, axis=-1), whole_row)
        return masks.vouched(categorical(key, masks.x)), masks.certain(), masks.holds

    if whole_row:  # the candidates fall short of these nuclei
        assert not np.asarray(jax.jit(draw, static_argnums=2)(x, jnp.array([0, 5], jnp.uint32), False)[2]).any()
    vouched = 0
    for seed in range(3):
        key = jnp.array([seed, 5], jnp.uint32)
        tokens, certain, holds = (np.asarray(a) for a in jax.jit(draw, static_argnums=2)(x, key, whole_row))
        want = np.asarray(reference(x, key, *rows))
        drawn = tokens != sampling.UNCERTIFIED
        np.testing.assert_array_equal(tokens[drawn], want[drawn])
        assert not certain and holds.all()
        vouched += int(np.sum(drawn))
    assert vouched >= 3 * rows_of - 2, f"{vouched} of {3 * rows_of} draws vouched for"


@pytest.mark.parametrize("case", ["normal", "ties", "neg_inf", "nan"])
def test_top_k_cutoff_is_the_searchs_wherever_it_holds(case: str) -> None:
    rows, vocab = 32, 2048
    x = jnp.asarray(_rows(case, rows, vocab, seed=11))
    k = jnp.asarray(np.random.default_rng(5).choice([1, 2, 40, 300, 600], rows).astype(np.int32))
    values, _ = jax.lax.top_k(x, 512)
    cutoff, holds = sampling.searched_top_k_cutoff(values, k)
    mine = jnp.where(x >= cutoff[:, None], x, -jnp.inf)
    searched = search_top_k_mask(x, k, -jnp.inf)
    holds = np.asarray(holds)
    np.testing.assert_array_equal(np.asarray(mine)[holds], np.asarray(searched)[holds])
    assert not holds[np.asarray(k) > 512].any()  # a k above the candidates is not read off them
    if case == "nan":
        assert not holds[0]
    if case in ("normal", "ties"):
        assert holds[np.asarray(k) <= 512].all()


def _per_row(rows: int, seed: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    rng = np.random.default_rng(seed)
    temperature = rng.choice([0.0, 0.5, 0.7, 1.0], rows).astype(np.float32)  # T = 0: tpu-inference's greedy rows
    k = rng.choice([0, 1, 20, 64, 2000], rows).astype(np.int32)
    p = rng.choice([0.5, 0.9, 1.0], rows).astype(np.float32)
    return jnp.asarray(temperature), jnp.asarray(k), jnp.asarray(p)


@pytest.mark.parametrize("case", ["model", "peaked", "flat", "ties", "neg_inf", "nan"])
def test_lowering_gives_the_reference_ids(case: str) -> None:
    params = form_params(FORM)
    lowering = jax.jit(sampling.threshold_search_lowering(FORM, params))
    reference = jax.jit(lambda x, key, *rows: sample_reference(x, key, form=FORM, rows=rows, **params))
    for seed in range(4):
        x = jnp.asarray(_rows(case, 4, 3000, seed=seed))
        rows = _per_row(4, seed) if seed else (jnp.full((4,), 0.7), jnp.full((4,), 20, jnp.int32), jnp.full((4,), 0.9))
        key = jnp.array([seed, 41], jnp.uint32)
        np.testing.assert_array_equal(lowering(x, key, *rows), reference(x, key, *rows), err_msg=f"{case} {seed}")


def _assert_no_sort_and_searches_only_in_the_fallback(lowering: Callable[..., jax.Array], key: tuple[int, ...],
                                                      rows: list[jax.ShapeDtypeStruct]) -> None:
    """The compiled program of `lowering` over (2, 12288) f32 logits holds no sort and no TopK, and its entry no loop:
    the searches (two 31-step loops) run under the conditional, for an uncertain batch only."""
    hlo = lowering.lower(jax.ShapeDtypeStruct((2, 12288), jnp.float32), jax.ShapeDtypeStruct(key, jnp.uint32),
                         *rows).compile().as_text()
    assert " sort(" not in hlo and " topk(" not in hlo and "TopK" not in hlo
    entry = hlo[hlo.index("ENTRY"):]
    assert " while(" not in entry.split("\n}\n")[0]


def test_lowering_leaves_no_sort_and_searches_only_in_its_fallback() -> None:
    lowering = jax.jit(sampling.threshold_search_lowering(FORM, form_params(FORM)))
    rows = [jax.ShapeDtypeStruct((2,), dtype) for dtype in (jnp.float32, jnp.int32, jnp.float32)]
    _assert_no_sort_and_searches_only_in_the_fallback(lowering, (2,), rows)


ESURGE = ("esurge_searched_rows_row_keys", "esurge_searched_min_p_rows_row_keys")


@pytest.mark.parametrize("form", ESURGE)
@pytest.mark.parametrize("case", ["model", "peaked", "flat", "ties", "neg_inf", "nan"])
def test_esurge_lowering_gives_the_reference_ids(form: str, case: str) -> None:
    """EasyDeL eSurge's sampler: its (B, 1) temperatures, k, p (and min-p) per row, a key per row; rows with T = 1
    (no division), k = 0 and p = 1 (no filter), and min-p rows whose negative max logit keeps nothing among them."""
    params = form_params(form)
    lowering = jax.jit(sampling.esurge_lowering(form, params))
    reference = jax.jit(lambda x, keys, *rows: sample_reference(x, keys, form=form, rows=rows, **params))
    for seed in range(4):
        x = jnp.asarray(_rows(case, 4, 3000, seed=seed) - (8.0 if seed == 3 else 0.0))
        temperature, k, p = _per_row(4, seed)
        rows = (jnp.where(temperature > 0, temperature, 1.0)[:, None], k, p)
        if form.endswith("min_p_rows_row_keys"):
            rows += (jnp.asarray(np.random.default_rng(seed).choice([0.0, 0.1, 0.5], 4).astype(np.float32)),)
        keys = jnp.asarray(np.random.default_rng(seed + 9).integers(0, 2**32, (4, 2), dtype=np.uint32))
        np.testing.assert_array_equal(lowering(x, keys, *rows), reference(x, keys, *rows), err_msg=f"{case} {seed}")


def test_esurge_lowering_leaves_no_sort_and_searches_only_in_its_fallback() -> None:
    lowering = jax.jit(sampling.esurge_lowering(ESURGE[1], form_params(ESURGE[1])))
    rows = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in
            (((2, 1), jnp.float32), ((2,), jnp.int32), ((2,), jnp.float32), ((2,), jnp.float32))]
    _assert_no_sort_and_searches_only_in_the_fallback(lowering, (2, 2), rows)
