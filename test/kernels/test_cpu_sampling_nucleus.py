"""The CPU lowering of the rank-space nuclei (sampling_reference.RANK_NUCLEI): the largest probabilities by mass
from the kernel, the program's ops on them, must give `sample_reference`'s ids exactly, whichever path a row takes
(the candidates, the whole row, a floored rank past the candidates that wins). And the two facts about XLA's CPU
ops the lowering rests on: a cumsum's first L values are the cumsum of the first L, and a sum over the whole width
with zeros after L is the program's sum of the same values."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlofuse.kernels.cpu import sampling
from hlofuse.kernels.sampling_reference import (
    RANK_NUCLEI,
    UNCERTIFIED,
    form_params,
    levanter_top_p_kept,
    rank_nucleus_scores,
    sample_reference,
    sample_reference_with_scores,
    simply_top_p_keep,
)

pytestmark = pytest.mark.skipif(not sampling.is_available(), reason="the native CPU sampler is not built")

WIDE = 12288  # wider than the candidates: their path runs


def _logits(rows: int, vocab: int, case: str) -> np.ndarray:
    rng = np.random.default_rng(vocab + rows + len(case))
    x = rng.standard_normal((rows, vocab)).astype(np.float32)
    if case == "peaked":  # a nucleus of a few tokens: the first candidates hold it
        x *= 12
    elif case == "normal":  # a nucleus of hundreds
        x *= 3
    elif case == "flat":  # a nucleus of thousands, more than the candidates: the whole row
        x *= 0.2
    elif case == "ties":
        x = np.round(x * 4)
    elif case == "neg_inf":
        x *= 4
        x[:, rng.random(vocab) < 0.5] = -np.inf
    elif case == "nan":
        x[0, 7] = np.nan
    elif case == "many_nan":  # normal, with a row of k = 64 NaNs or more and one with fewer
        x *= 3
        x[0, ::61] = np.nan  # 68 NaNs
        x[1, ::200] = np.nan  # 21
    return x


CASES = ("peaked", "normal", "flat", "ties", "neg_inf", "nan")


def _assert_gives_the_reference_ids(lowering: Callable[..., jax.Array], form: str, params: dict, cases: tuple[str, ...],
                                    dtype: jnp.dtype = jnp.float32, key_base: int = 17) -> None:
    """`lowering` draws `sample_reference`'s ids on 3 x 4096 logits of each case, for 3 keys."""
    reference = jax.jit(lambda x, key: sample_reference(x, key, form=form, **params))
    for case in cases:
        logits = jnp.asarray(_logits(3, 4096, case), dtype)
        for seed in range(3):
            key = jnp.array([seed, key_base + seed], jnp.uint32)
            np.testing.assert_array_equal(lowering(logits, key), reference(logits, key), err_msg=f"{case} seed {seed}")


def _assert_no_sort(lowering: Callable[..., jax.Array], dtype: jnp.dtype = jnp.float32) -> None:
    """The compiled program of `lowering` over (2, WIDE) logits holds no sort and no TopK."""
    hlo = lowering.lower(jax.ShapeDtypeStruct((2, WIDE), dtype),
                         jax.ShapeDtypeStruct((2,), jnp.uint32)).compile().as_text()
    assert " sort(" not in hlo and " topk(" not in hlo and "TopK" not in hlo


@pytest.mark.parametrize("eps", [0.0, 1e-10, 0.05], ids=["no_floor", "floor_1e-10", "floor_0.05"])
@pytest.mark.parametrize("form", sorted(RANK_NUCLEI))
def test_rank_nucleus_gives_the_reference_ids(form: str, eps: float) -> None:
    """eps = 0.05 makes ranks outside the nucleus win often: the lowering must then fall back, not guess."""
    if eps and "eps" not in form_params(form, eps=eps):
        pytest.skip("the form reads no floor")
    params = form_params(form, temperature=0.8, k=40, p=0.9, eps=eps)
    kernel = jax.jit(sampling.rank_nucleus_lowering(form, params))
    reference = jax.jit(lambda x, key: sample_reference(x, key, form=form, **params))
    for case in CASES:
        logits = jnp.asarray(_logits(3, WIDE, case))
        for seed in range(3):
            key = jnp.array([seed, 41 + seed], jnp.uint32)
            np.testing.assert_array_equal(kernel(logits, key), reference(logits, key), err_msg=f"{case} seed {seed}")


@pytest.mark.parametrize("form", sorted(RANK_NUCLEI))
def test_rank_nucleus_of_a_narrow_row_and_of_bf16(form: str) -> None:
    params = form_params(form, temperature=0.7, k=16, p=0.8)
    kernel = jax.jit(sampling.rank_nucleus_lowering(form, params))
    reference = jax.jit(lambda x, key: sample_reference(x, key, form=form, **params))
    for dtype in (jnp.float32, jnp.bfloat16):
        logits = jnp.asarray(_logits(2, 600, "normal"), dtype)
        for seed in range(3):
            key = jnp.array([seed, 7], jnp.uint32)
            np.testing.assert_array_equal(kernel(logits, key), reference(logits, key))


def test_the_candidates_path_leaves_no_sort_in_the_compiled_program() -> None:
    params = form_params("top_p_of_probs", temperature=0.8, p=0.9)
    hlo = jax.jit(sampling.rank_nucleus_lowering("top_p_of_probs", params)).lower(
        jax.ShapeDtypeStruct((2, WIDE), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.uint32)).compile().as_text()
    assert " sort(" not in hlo and "TopK" not in hlo
    assert sampling.TOP_MASS_TARGET in hlo


@pytest.mark.parametrize("vocab", [5000, 32000, 128256])
def test_xla_cumsum_of_a_prefix_is_the_prefix_of_the_cumsum(vocab: int) -> None:
    rng = np.random.default_rng(vocab)
    probs = jax.nn.softmax(jnp.asarray(rng.standard_normal((3, vocab)).astype(np.float32) * 3), axis=-1)
    ordered = jnp.sort(probs, axis=-1)[..., ::-1]
    whole = np.asarray(jax.jit(lambda v: jnp.cumsum(v, axis=-1))(ordered))
    for candidates in (sampling.NUCLEUS_CANDIDATES, 256, 17, vocab // 3):
        prefix = np.asarray(jax.jit(lambda v: jnp.cumsum(v, axis=-1))(ordered[:, :candidates]))
        np.testing.assert_array_equal(prefix, whole[:, :candidates], err_msg=f"first {candidates}")
    # and it is not a running sum (which the lowering does not assume)
    assert not np.array_equal(whole, np.cumsum(np.asarray(ordered), axis=-1, dtype=np.float32))


@pytest.mark.parametrize("vocab", [5000, 128256])
def test_sum_over_the_whole_width_with_zeros_after_the_candidates(vocab: int) -> None:
    rng = np.random.default_rng(1)
    values = rng.random((4, vocab)).astype(np.float32)
    for candidates in (sampling.NUCLEUS_CANDIDATES, 300):
        values[:, candidates:] = 0
        program = np.asarray(jax.jit(lambda v: jnp.sum(v, axis=-1))(jnp.asarray(values)))
        padded = np.asarray(jax.jit(lambda v: jnp.sum(jnp.pad(v, [(0, 0), (0, vocab - v.shape[-1])]), axis=-1))(
            jnp.asarray(values[:, :candidates])))
        np.testing.assert_array_equal(padded, program)


def test_top_k_of_probs_of_a_nan_row_draws_id_0_as_the_program() -> None:
    """The kernel's top-k does not order NaN as lax.top_k does (first, lower id first): a NaN row is id 0."""
    params = form_params("top_k_of_probs", temperature=0.7, k=8)
    kernel = jax.jit(sampling.function_form_lowering("top_k_of_probs", params))
    reference = jax.jit(lambda x, key: sample_reference(x, key, form="top_k_of_probs", **params))
    logits = jnp.asarray(_logits(3, 600, "nan"))
    for seed in range(3):
        key = jnp.array([seed, 5], jnp.uint32)
        np.testing.assert_array_equal(kernel(logits, key), reference(logits, key))


def test_top_mass_returns_the_top_by_mass_then_zeros() -> None:
    """As many of the largest as their mass needs (ties by the lower id, as lax.top_k), then zeros with id -1."""
    probs = np.zeros((2, 5000), np.float32)
    probs[0, [10, 20, 30, 40]] = [0.5, 0.3, 0.15, 0.05]
    probs[1, :] = 1 / 5000
    values, ids = jax.jit(lambda v: sampling._top_mass_by_kernel(v, 64, 0.9))(jnp.asarray(probs))
    want_values, want_ids = jax.lax.top_k(jnp.asarray(probs), 64)
    # 0.5 + 0.3 + 0.15 passes 0.9: three, each in a bin of its own
    assert list(np.asarray(ids[0, :3])) == [10, 20, 30] and np.all(np.asarray(ids[0, 3:]) == -1)
    np.testing.assert_array_equal(values[0, :3], np.float32([0.5, 0.3, 0.15]))
    assert np.all(np.asarray(values[0, 3:]) == 0)
    np.testing.assert_array_equal(ids[1], want_ids[1])  # a flat row: all 64, as lax.top_k orders them
    np.testing.assert_array_equal(values[1], want_values[1])


def test_kernel_top_k_orders_nan_first_as_lax_top_k() -> None:
    """MaxText's top-k + top-p of logits on the CPU (the form's function, the kernel's top-k): a row with NaN
    logits draws the first NaN, as lax.top_k ranks NaN first, lower id first."""
    params = form_params("top_k_top_p_of_logits", temperature=0.7, k=8, p=0.9)
    kernel = jax.jit(sampling.function_form_lowering("top_k_top_p_of_logits", params))
    reference = jax.jit(lambda x, key: sample_reference(x, key, form="top_k_top_p_of_logits", **params))
    logits = _logits(4, 600, "normal")
    logits[1, [50, 9, 300]] = np.nan
    logits[2, :] = np.nan
    for seed in range(3):
        key = jnp.array([seed, 5], jnp.uint32)
        got = np.asarray(kernel(jnp.asarray(logits), key))
        np.testing.assert_array_equal(got, reference(jnp.asarray(logits), key))
        assert got[1] == 9 and got[2] == 0
    values, ids = sampling._top_k_by_kernel(jnp.asarray(logits), 5)
    want_values, want_ids = jax.lax.top_k(jnp.asarray(logits), 5)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(values, want_values)


def test_kernel_top_k_orders_positive_zero_above_negative_zero_as_lax_top_k() -> None:
    """lax.top_k ranks by XLA's total order, +0 above -0, and only then by the lower id: the kernel's top-k (the ranks
    of every rank-space draw) must too, in its heap and in its filter of what may enter it (a heap whose worst is -0
    takes a later +0)."""
    rng = np.random.default_rng(3)
    x = np.round(rng.standard_normal((3, 4000)) * 0.6).astype(np.float32)
    x[x == 0] = np.where(rng.random(int((x == 0).sum())) < 0.5, -0.0, 0.0)
    x[0] = -np.abs(x[0])  # zeros at the top of the row
    x[1, :5] = [-0.0, 0.0, -1.0, 0.0, -0.0]
    for k in (1, 4, 64, 700):
        values, ids = sampling._top_k_by_kernel(jnp.asarray(x), k)
        want_values, want_ids = jax.lax.top_k(jnp.asarray(x), k)
        np.testing.assert_array_equal(ids, want_ids, err_msg=f"k = {k}")
        np.testing.assert_array_equal(np.signbit(values), np.signbit(want_values), err_msg=f"k = {k}")


# ----- Hugging Face's top-p: the row sorted by the kernel ------------------------------------------------


def test_kernel_sort_is_jnp_sort_and_a_stable_argsort() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 5000)).astype(np.float32)
    x[0, rng.integers(0, 5000, 300)] = 0.0
    x[0, rng.integers(0, 5000, 300)] = -0.0
    x[1, rng.integers(0, 5000, 50)] = np.nan
    x[1, rng.integers(0, 5000, 50)] = -np.inf
    x[1, rng.integers(0, 5000, 50)] = np.inf
    x[2] = np.round(x[2] * 2)  # ties everywhere
    values, ids = jax.jit(sampling._sort_by_kernel)(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(values) == 0, np.sort(x, axis=-1) == 0)  # +-0 as a tie
    np.testing.assert_array_equal(values, jnp.sort(jnp.asarray(x), axis=-1))
    np.testing.assert_array_equal(ids, jnp.argsort(jnp.asarray(x), axis=-1, stable=True))


HF_TOP_P = ("top_p_ascending_mask", "top_p_ascending_mask_choice", "top_p_ascending_mask_log_softmax",
            "top_k_top_p_ascending_mask", "top_k_top_p_ascending_mask_choice")


@pytest.mark.parametrize("form", HF_TOP_P)
def test_hf_top_p_gives_the_reference_ids(form: str) -> None:
    """Ties straddling the removal (rounded logits) take the form's own function; the rest, the kernel's sort (after
    the kernel's top-k mask, whose k-th value ties in the `ties` rows)."""
    params = form_params(form, temperature=0.8, p=0.9, k=64)
    _assert_gives_the_reference_ids(jax.jit(sampling.top_p_ascending_lowering(form, params)), form, params, CASES)


def _computations_with(hlo: str, op: str) -> tuple[set[str], str]:
    """The names of the HLO text's computations holding `op`, and the text of its ENTRY computation."""
    names, entry = set(), ""
    for block in hlo.split("\n\n"):
        header = block.strip().splitlines()[0] if block.strip() else ""
        if op in block:
            names.add(header.split()[1] if header.startswith("ENTRY") else header.split()[0])
        if header.startswith("ENTRY"):
            entry = block
    return names, entry


def _assert_sorts_in_xla_only_in_a_branch(lowering: Callable[..., jax.Array]) -> None:
    """The compiled program of `lowering` over (2, WIDE) f32 logits sorts by the kernel, and its XLA sort runs only in
    a conditional's branch (the form's own function, for a batch the kernel's order cannot vouch for)."""
    hlo = lowering.lower(jax.ShapeDtypeStruct((2, WIDE), jnp.float32),
                         jax.ShapeDtypeStruct((2,), jnp.uint32)).compile().as_text()
    assert sampling.SORT_TARGET in hlo
    sorting, entry = _computations_with(hlo, " sort(")
    assert sorting and " sort(" not in entry and "conditional(" in entry and "TopK" not in entry
    branches = " ".join(line for line in hlo.splitlines() if "branch_computations=" in line)
    reached = {name for name in sorting if name.lstrip("%") in branches.replace("%", "")}
    assert reached or all(name not in entry for name in sorting)


def test_hf_top_p_sorts_in_xla_only_where_ties_straddle() -> None:
    """The compiled program's sort runs only in the conditional's branch for a batch with ties at the removal."""
    params = form_params("top_p_ascending_mask_choice", temperature=0.8, p=0.9)
    _assert_sorts_in_xla_only_in_a_branch(jax.jit(sampling.top_p_ascending_lowering("top_p_ascending_mask_choice",
                                                                                    params)))


HF_MIN_P = ("min_p_removal", "min_p_removal_choice", "top_k_min_p_removal", "top_k_min_p_removal_choice")


@pytest.mark.parametrize("form", HF_MIN_P)
def test_hf_min_p_gives_the_reference_ids_with_no_sort(form: str) -> None:
    """Hugging Face's min-p (after its top-k): the form's function with the kernel's top-k and draw; no sort and no
    TopK in the compiled program."""
    params = form_params(form, temperature=0.7, min_p=0.1, k=64)
    lowering = jax.jit(sampling.min_p_removal_lowering(form, params))
    _assert_gives_the_reference_ids(lowering, form, params, CASES)
    _assert_no_sort(lowering)


@pytest.mark.parametrize("form", ["epsilon_removal", "top_k_epsilon_removal", "top_k_epsilon_removal_choice"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_hf_epsilon_gives_the_reference_ids_with_no_sort(form: str, dtype: jnp.dtype) -> None:
    """Hugging Face's epsilon sampling (after its top-k): the form's function with the kernel's top-k for the top-k
    and the kept max, and the kernel's draw; no sort and no TopK in the compiled program. (4096 wide: an epsilon of
    3e-4 removes some of each case's tokens and keeps others.)"""
    params = form_params(form, temperature=0.7, epsilon=3e-4, k=64)
    lowering = jax.jit(sampling.epsilon_removal_lowering(form, params))
    _assert_gives_the_reference_ids(lowering, form, params, (*CASES, "many_nan"), dtype, key_base=31)
    _assert_no_sort(lowering, dtype)


HF_TYPICAL = ("typical_mask", "typical_mask_choice", "top_k_typical_mask", "top_k_typical_mask_choice")


@pytest.mark.parametrize("form", HF_TYPICAL)
def test_hf_typical_gives_the_reference_ids(form: str) -> None:
    """Hugging Face's typical sampling (after 4.x's top-k): the kernel's sort of the scores and the program's removal,
    or the form's own function where the order of equal scores could matter (the `ties` rows, the -inf of the top-k
    mask: equal scores of equal logits, which it does not)."""
    params = form_params(form, temperature=0.8, p=0.9, k=64)
    _assert_gives_the_reference_ids(jax.jit(sampling.typical_lowering(form, params)), form, params,
                                    (*CASES, "many_nan"), key_base=37)


def test_hf_typical_sorts_in_xla_only_where_the_order_of_ties_matters() -> None:
    params = form_params("typical_mask_choice", temperature=0.8, p=0.9)
    _assert_sorts_in_xla_only_in_a_branch(jax.jit(sampling.typical_lowering("typical_mask_choice", params)))


def test_typical_order_matters_only_for_ties_of_other_logits_before_the_mass() -> None:
    ordered = jnp.array([[0.1, 0.2, 0.2, 0.5], [0.1, 0.1, 0.3, 0.4], [0.1, 0.2, 0.3, 0.3], [0.2, 0.2, 0.2, 0.9]])
    in_order = jnp.array([[1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 1.0, 0.0], [5.0, 4.0, 1.0, 0.5], [1.0, 1.0, 1.0, 3.0]])
    cumulative = jnp.array([[0.3, 0.5, 0.8, 1.0], [0.4, 0.8, 0.9, 1.0], [0.5, 0.96, 0.98, 1.0], [0.2, 0.4, 0.6, 1.0]])
    # row 0: tied scores of the logits 2 and 3 before the mass 0.9; row 1: a tie of equal logits only; row 2: a tie of
    # other logits after the cumsum passed 0.9 by more than 2 V u; row 3: equal logits tied
    np.testing.assert_array_equal(sampling.typical_order_matters(ordered, in_order, cumulative, 0.9),
                                  [True, False, False, False])
    assert sampling.typical_order_matters(ordered, in_order, cumulative, 0.96)[2]  # within 2 V u of the mass
    assert sampling.typical_order_matters(ordered.at[1, 3].set(jnp.nan), in_order, cumulative, 0.9)[1]


# ----- Hugging Face's Flax top-p: the row in lax.top_k's order, by the kernel ------------------------------


def test_kernel_descending_sort_is_a_full_width_lax_top_k() -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 5000)).astype(np.float32)
    x[0, rng.integers(0, 5000, 300)] = 0.0
    x[0, rng.integers(0, 5000, 300)] = -0.0  # lax.top_k puts +0 first
    x[1, rng.integers(0, 5000, 50)] = -np.inf
    x[1, rng.integers(0, 5000, 50)] = np.inf
    x[2] = np.round(x[2] * 2)  # ties everywhere: the lower id first
    nans = np.array([0x7FC00000, 0x7FC01234, 0xFFC00000, 0x7FC00000], np.uint32).view(np.float32)
    x[1, [40, 3, 4000, 9]] = nans  # XLA's total order: +NaN by payload first, -NaN after -inf
    values, ids = jax.jit(sampling._sort_descending_by_kernel)(jnp.asarray(x))
    want_values, want_ids = jax.lax.top_k(jnp.asarray(x), x.shape[-1])
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(np.asarray(values).view(np.uint32), np.asarray(want_values).view(np.uint32))


@pytest.mark.parametrize("form", ["top_p_flax_mask", "top_k_exact_top_p_flax_mask", "top_k_keep_top_p_flax_mask",
                                  "top_k_keep_mask", "top_k_keep_mask_choice", "min_p_sorted_removal"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_flax_and_easydel_warpers_give_the_reference_ids_with_no_sort(form: str, dtype: jnp.dtype) -> None:
    """Flax's and EasyDeL's warpers; `many_nan` has a row with k NaNs (EasyDeL's k-th is then NaN: nothing kept)
    and one with fewer."""
    params = form_params(form, temperature=0.8, p=0.9, k=64, min_p=0.1)
    lowering = jax.jit(sampling.flax_top_p_lowering(form, params))
    _assert_gives_the_reference_ids(lowering, form, params, (*CASES, "many_nan"), dtype, key_base=23)
    _assert_no_sort(lowering, dtype)


@pytest.mark.parametrize("form", ["top_p_unshifted_mask", "top_p_unshifted_mask_choice", "top_k_top_p_unshifted_mask",
                                  "top_k_keep_top_p_unshifted_mask"])
@pytest.mark.parametrize("p", [0.9, 0.5, 1e-7], ids=["p_0.9", "p_0.5", "p_tiny"])
def test_unshifted_jax_top_p_gives_the_reference_ids_with_no_sort(form: str, p: float) -> None:
    """The JAX cut not shifted (`cumsum > p` removed as it is), alone and after a top-k of 64: the program's cut on the
    kernel's sorted row, put back by a scatter. A tiny p keeps nothing of a row (every draw is over -inf: id 0)."""
    params = form_params(form, temperature=0.7, p=p, k=64)
    lowering = jax.jit(sampling.unshifted_top_p_lowering(form, params))
    _assert_gives_the_reference_ids(lowering, form, params, (*CASES, "many_nan"), key_base=53)
    _assert_no_sort(lowering)


@pytest.mark.parametrize("p", [0.9, 0.5, 1e-7], ids=["p_0.9", "p_0.5", "p_past_the_end"])
def test_gemma_3_1_top_p_gives_the_reference_ids_with_no_sort(p: float) -> None:
    """gemma 3.1.0's top-p: the kernel's ascending sort of all V logits (jnp.sort's values, -0 and +0 alike), the
    program's softmax, cumsum, count and cutoff on them. A p so small that every cumsum reaches it counts V: the cutoff
    reads past the end (NaN) and nothing is removed."""
    form = "top_p_ascending_count_mask"
    params = form_params(form, temperature=0.7, p=p)
    lowering = jax.jit(sampling.function_form_lowering(form, params))
    _assert_gives_the_reference_ids(lowering, form, params, (*CASES, "many_nan"), key_base=31)
    _assert_no_sort(lowering)


@pytest.mark.parametrize("form", ["top_p_haiku_mask", "top_p_haiku_logits_mask"])
@pytest.mark.parametrize("p", [0.9, 0.5, 1e-7, 1.0], ids=["p_0.9", "p_0.5", "p_tiny", "p_1"])
def test_haiku_top_p_gives_the_reference_ids_with_no_sort(p: float, form: str) -> None:
    """Haiku's and grok-1's nucleus (top_p_haiku_mask), and perceiver-ar's of the logits then / T: the band where it
    vouches, else the kernel's ascending sort of all V logits with the program's softmax, cumsum, `argmax(cumsum >=
    1 - p)` and cut by value on them. At p = 1 the cut is place 0 (every token stays); a tiny p keeps the largest
    values and every logit tied with the cut's."""
    params = form_params(form, temperature=0.7, p=p)
    lowering = jax.jit(sampling.function_form_lowering(form, params))
    _assert_gives_the_reference_ids(lowering, form, params, (*CASES, "many_nan"), key_base=37)
    _assert_no_sort(lowering)


def test_haiku_top_p_keeps_every_logit_tied_with_the_cut() -> None:
    """Four equal logits across the place where the cumsum reaches 1 - p: the cut is by value, so all four stay
    whichever of them the sort put there, for (B, V) and (B, 1, V) logits, and the draws are the program's."""
    form = "top_p_haiku_mask"
    ties = np.tile(np.array([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0], np.float32), (16, 1))
    params = form_params(form, temperature=1.0, p=0.5)
    lowering = jax.jit(sampling.function_form_lowering(form, params))
    for shape in ((16, 8), (16, 1, 8)):
        x = jnp.asarray(ties.reshape(shape))
        seen: set[int] = set()
        for seed in range(8):
            key = jnp.array([seed, 13], jnp.uint32)
            got = np.asarray(lowering(x, key))
            np.testing.assert_array_equal(got, sample_reference(x, key, form=form, **params))
            seen |= set(got.ravel().tolist())
        assert seen == {0, 2, 4, 6}


@pytest.mark.parametrize("form", ["top_p_haiku_rows", "top_p_haiku_rows_row_keys"])
@pytest.mark.parametrize("lead", [(), (1,)], ids=["rows", "decode_rows"])
def test_grok_nucleus_gives_the_reference_ids_and_scores_with_no_sort(form: str, lead: tuple[int, ...]) -> None:
    """grok-1's sampler (top_p_haiku_rows: Haiku's nucleus with a p per row, p = 0.9, 0.5, tiny and 1 across the rows),
    of (B, V) and (B, 1, V) logits, with one key or a key per row: the ids and the filtered logits it gives back (at
    grok's -1e10) are `sample_reference_with_scores`'s bit for bit, and no sort or TopK is left to XLA."""
    params = form_params(form, temperature=1.0)
    lowering = jax.jit(sampling.haiku_rows_lowering(form, params, scores_fill=-1e10))
    reference = jax.jit(lambda x, key, p: sample_reference_with_scores(x, key, form=form, fill=-1e10, rows=(p,),
                                                                       **params))
    p = jnp.array([0.9, 0.5, 1e-7, 1.0], jnp.float32)
    for case in (*CASES, "many_nan"):
        x = jnp.asarray(np.tile(_logits(2, 4096, case), (2, 1))).reshape(4, *lead, 4096)
        for seed in range(3):
            key = jax.random.key_data(jax.random.split(jax.random.key(seed), 4)) if form.endswith("_row_keys") \
                else jnp.array([seed, 41 + seed], jnp.uint32)
            (ids, scores), (want_ids, want_scores) = lowering(x, key, p), reference(x, key, p)
            np.testing.assert_array_equal(ids, want_ids, err_msg=f"{case} seed {seed}")
            np.testing.assert_array_equal(np.asarray(scores).view(np.uint32), np.asarray(want_scores).view(np.uint32),
                                          err_msg=f"{case} seed {seed}")
    key = jax.ShapeDtypeStruct((4, 2) if form.endswith("_row_keys") else (2,), jnp.uint32)
    hlo = lowering.lower(jax.ShapeDtypeStruct((4, *lead, WIDE), jnp.float32), key,
                         jax.ShapeDtypeStruct((4,), jnp.float32)).compile().as_text()
    assert " sort(" not in hlo and " topk(" not in hlo and "TopK" not in hlo


def _assert_gives_the_reference_ids_and_score_bits(lowering: Callable[..., Any], reference: Callable[..., Any],
                                                   x: jax.Array, case: str, key_base: int, seeds: int = 2) -> None:
    """`lowering` returns `reference`'s ids and scores (compared as bits) for `seeds` keys [seed, key_base + seed]."""
    for seed in range(seeds):
        key = jnp.array([seed, key_base + seed], jnp.uint32)
        (ids, scores), (want_ids, want_scores) = lowering(x, key), reference(x, key)
        np.testing.assert_array_equal(ids, want_ids, err_msg=f"{case} seed {seed}")
        np.testing.assert_array_equal(np.asarray(scores).view(np.uint32), np.asarray(want_scores).view(np.uint32),
                                      err_msg=f"{case} seed {seed}")


@pytest.mark.parametrize("form", ["top_k_exact_mask", "top_p_simply_mask", "top_k_top_p_simply_mask"])
def test_simply_filters_give_the_reference_ids_and_scores_with_no_sort(form: str) -> None:
    """google-deepmind/simply's exact top-k (one-hot), nucleus (a stable descending argsort, put back by sort_key_val)
    and nucleus of the top k, which its sampler reads again for the token's log-probability: the ids and the filtered
    logits given back (at simply's -0.5 * finfo.max) are `sample_reference_with_scores`'s bit for bit, the argsort by
    the kernel's stable sort and the put-back by a scatter (ties, -0 beside +0, NaN rows), and no sort or TopK is left
    to XLA."""
    fill = -0.5 * float(np.finfo(np.float32).max)
    params = form_params(form, temperature=0.7, k=40, p=0.9)
    lowering = jax.jit(sampling.function_form_lowering(form, params, scores_fill=fill))
    reference = jax.jit(lambda x, key: sample_reference_with_scores(x, key, form=form, fill=fill, **params))
    for case in (*CASES, "many_nan", "signed_zeros"):
        x = _logits(3, 4096, "ties") if case == "signed_zeros" else _logits(3, 4096, case)
        if case == "signed_zeros":  # the ties' zeros, every other one -0: equal to the argsort, other bits
            x[:, ::2] = np.where(x[:, ::2] == 0, -0.0, x[:, ::2])
        _assert_gives_the_reference_ids_and_score_bits(lowering, reference, jnp.asarray(x), case, 43, seeds=3)
    hlo = lowering.lower(jax.ShapeDtypeStruct((2, WIDE), jnp.float32),
                         jax.ShapeDtypeStruct((2,), jnp.uint32)).compile().as_text()
    assert " sort(" not in hlo and " topk(" not in hlo and "TopK" not in hlo


def test_simply_nucleus_of_wide_rows_is_the_programs_from_the_candidates() -> None:
    """simply's nucleus of rows wider than the candidates: from the kernel's top candidates by mass, vouched for on
    peaked and normal rows (no sorted row at all) and not on flat ones (a nucleus past the candidates) or NaN rows;
    the keep where vouched, and the lowering's ids and scores everywhere, are the reference's bit for bit."""
    form = "top_p_simply_mask"
    fill = -0.5 * float(np.finfo(np.float32).max)
    params = form_params(form, temperature=0.7, p=0.9)
    lowering = jax.jit(sampling.function_form_lowering(form, params, scores_fill=fill))
    reference = jax.jit(lambda x, key: sample_reference_with_scores(x, key, form=form, fill=fill, **params))
    of_candidates = jax.jit(lambda y: sampling._simply_keep_of_candidates(y, 0.9))
    want_vouched = {"peaked": True, "normal": True, "flat": False, "nan": False}
    for case in (*CASES, "many_nan"):
        x = jnp.asarray(_logits(3, WIDE, case).reshape(3, 1, WIDE))  # simply's (B, 1, V) decode rows
        keep, vouched = of_candidates(x / 0.7)
        want_keep = simply_top_p_keep(x / 0.7, 0.9)
        np.testing.assert_array_equal(np.asarray(keep)[vouched], np.asarray(want_keep)[vouched], err_msg=case)
        if case in want_vouched:
            assert np.all(vouched[1:]) == want_vouched[case], case  # (the nan case's row 0 holds the NaN)
        _assert_gives_the_reference_ids_and_score_bits(lowering, reference, x, case, 47)
    hlo = lowering.lower(jax.ShapeDtypeStruct((2, 1, WIDE), jnp.float32),
                         jax.ShapeDtypeStruct((2,), jnp.uint32)).compile().as_text()
    entry = hlo[hlo.index("ENTRY"):]
    entry = entry[:entry.index("\n}")]  # the whole row's sort only in a conditional's branch, not run when vouched
    assert "hlofuse_sample_top_mass" in entry and "conditional(" in entry and "hlofuse_sample_sort" not in entry
    assert " sort(" not in hlo and " topk(" not in hlo and "TopK" not in hlo


def test_levanter_nucleus_with_scores_of_wide_rows_sums_only_the_candidates() -> None:
    """Levanter's nucleus when its program reads the filtered logits again (its log-probability): of rows wider than
    the candidates, the kept logits from the sorted row's softmax and the cumsum of its first ranks only, vouched for
    on peaked, normal and -inf rows and not on flat or NaN ones, nor where equal logits straddle the cut; the ids and
    the scores are the reference's bit for bit either way, with no sort or TopK left to XLA."""
    form = "top_p_levanter_mask"
    p = float(np.float32(0.9) - np.float32(1e-4))  # Levanter's p less its tolerance, folded (hlofuse-prepare)
    params = form_params(form, temperature=0.7, p=p)
    lowering = jax.jit(sampling.flax_top_p_lowering(form, params, with_scores=True))
    reference = jax.jit(lambda x, key: sample_reference_with_scores(x, key, form=form, **params))
    of_candidates = jax.jit(lambda y: sampling._levanter_keep_of_candidates(y, p))
    want_vouched = {"peaked": True, "normal": True, "neg_inf": True, "flat": False, "nan": False}
    for case in (*CASES, "many_nan"):
        x = jnp.asarray(_logits(3, WIDE, case))
        kept, vouched = of_candidates(x / 0.7)
        want_kept = np.isfinite(np.asarray(levanter_top_p_kept(x / 0.7, p)))
        np.testing.assert_array_equal(np.asarray(kept)[vouched], want_kept[vouched], err_msg=case)
        if case in want_vouched:
            assert np.all(vouched) == want_vouched[case], case
        _assert_gives_the_reference_ids_and_score_bits(lowering, reference, x, case, 53)
    # two equal logits at the cut: the argsort keeps the higher id, and no compare with the last kept logit can
    ties = np.full((2, WIDE), -30.0, np.float32)
    ties[:, [5, 9]] = 1.0
    ties[:, 100] = 1.5
    ordered = -jnp.sort(-jnp.asarray(ties), axis=-1)
    tie_p = float(jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)[0, 1])  # ranks 0 (id 100) and 1 (id 9) kept
    kept, vouched = sampling._levanter_keep_of_candidates(jnp.asarray(ties), tie_p)
    want = np.isfinite(np.asarray(levanter_top_p_kept(jnp.asarray(ties), tie_p)))
    assert want[0, 9] and want[0, 100] and not want[0, 5] and kept[0, 5] and not np.any(vouched)
    np.testing.assert_array_equal(np.isfinite(sampling._levanter_top_p_kept_by_candidates(jnp.asarray(ties), tie_p)),
                                  want)
    hlo = lowering.lower(jax.ShapeDtypeStruct((2, WIDE), jnp.float32),
                         jax.ShapeDtypeStruct((2,), jnp.uint32)).compile().as_text()
    assert " sort(" not in hlo and " topk(" not in hlo and "TopK" not in hlo


def test_simply_nucleus_leaves_equal_probabilities_across_the_cut_to_the_whole_row() -> None:
    """Two logits one ulp apart near the top have one probability; simply's argsort ranks the larger (the higher id
    here) first, the kernel's candidates the lower id first. With p at the exact mass before the second of them, the
    cut falls between the two: the candidates' keep (every token at or above the last kept probability) would keep
    both, so the row is not vouched for, and the keep on the whole row is the program's."""
    y = np.full((1, WIDE), -20.0, np.float32)
    y[0, 100] = 0.0
    y[0, 7] = np.float32(-1e-6)
    y[0, 9] = np.nextafter(np.float32(-1e-6), np.float32(1))  # the higher id, the larger logit
    y = jnp.asarray(y)
    probs = jax.nn.softmax(y, axis=-1)
    assert probs[0, 7] == probs[0, 9]
    order = jnp.argsort(y, axis=-1, descending=True)
    mass = jnp.cumulative_sum(jnp.take_along_axis(probs, order, axis=-1), axis=-1, include_initial=True)
    p = float(mass[0, 2])  # rank 1 (id 9) kept, rank 2 (id 7) dropped
    want = np.asarray(simply_top_p_keep(y, p))
    assert want[0, 9] and not want[0, 7]
    keep, vouched = sampling._simply_keep_of_candidates(y, p)
    assert keep[0, 7] and keep[0, 9]  # one probability: the candidates cannot tell them apart
    assert not vouched[0]
    np.testing.assert_array_equal(sampling.simply_top_p_keep_by_candidates(y, p), want)


def test_gemma_3_1_top_p_is_drawn_with_no_sorted_row_and_vouches_only_for_kept_winners() -> None:
    """gemma 3.1.0's top-p by its mass bound (`_ascending_count_by_mass`): at p = 0.9 on LLM-like rows every draw is
    vouched for with no sorted row, and each is the program's; on flat rows at a high temperature the program removes
    dozens of the smallest logits, so a draw over the whole row often lands on a removed token: every such draw is
    UNCERTIFIED (a bound on the count that misses one fails here), and the others are the program's."""
    form = "top_p_ascending_count_mask"
    rng = np.random.default_rng(41)
    for scale, temperature, want_vouched in ((3.0, 0.7, 1.0), (0.05, 50.0, 0.0)):
        params = form_params(form, temperature=temperature, p=0.9)
        by_mass = jax.jit(lambda x, key, params=params: sampling._ascending_count_by_mass(x, key, params))
        reference = jax.jit(lambda x, key, params=params: sample_reference(x, key, form=form, **params))
        whole_row = jax.jit(lambda x, key, params=params: jax.random.categorical(key, x / params["temperature"]))
        logits = jnp.asarray(rng.standard_normal((8, 256)).astype(np.float32) * scale)
        vouched, removed_winners = 0, 0
        for seed in range(40):
            key = jnp.array([seed, 5], jnp.uint32)
            tokens, want, drawn = (np.asarray(f(logits, key)) for f in (by_mass, reference, whole_row))
            sure = tokens != sampling.UNCERTIFIED
            np.testing.assert_array_equal(tokens[sure], want[sure], err_msg=f"scale {scale} seed {seed}")
            assert not np.any(sure & (drawn != want))  # a winner the program removed is never vouched for
            vouched += int(sure.sum())
            removed_winners += int((drawn != want).sum())
        assert vouched >= want_vouched * 8 * 40
        if not want_vouched:
            assert removed_winners > 10  # the check above had winners to refuse


@pytest.mark.parametrize(("form", "dtype"), [("top_p_of_logits_exclusive", jnp.float32),
                                             ("top_k_top_p_of_logits_exclusive", jnp.float32),
                                             ("top_k_top_p_of_logits_exclusive", jnp.bfloat16)])
def test_tunix_nucleus_of_logits_gives_the_reference_ids_with_no_sort(form: str, dtype: jnp.dtype) -> None:
    """tunix's sample_top_p: all V sorted logits by the kernel's descending sort, or its top k by the kernel's top-k;
    the program's softmax, cumsum and mask on them. (All V bf16 logits are not lowered: sampling_lowering says
    why.)"""
    params = form_params(form, temperature=0.8, p=0.9, k=64)
    lowering = jax.jit(sampling.function_form_lowering(form, params))
    _assert_gives_the_reference_ids(lowering, form, params, (*CASES, "many_nan"), dtype, key_base=29)
    _assert_no_sort(lowering, dtype)


TORCH_NUCLEI = ("top_p_of_probs_torch", "top_p_of_probs_torch_unnormalized")


@pytest.mark.parametrize("form", TORCH_NUCLEI)
@pytest.mark.parametrize("p", [0.5, 0.9, 0.95])
def test_llama_reference_top_p_gives_the_reference_ids(p: float, form: str) -> None:
    """`top_p_of_probs_torch` (the llama reference's sample_top_p through torchax), and xformers' fastgen `top_p`, its
    kept probabilities not renormalised: the kernel's candidates and draw where the winner's probability is unique in
    its row, the program's unstable sorts otherwise."""
    params = form_params(form, temperature=0.7, p=p)
    lowering = jax.jit(sampling.torch_nucleus_lowering(form, params))
    _assert_gives_the_reference_ids(lowering, form, params, CASES + ("many_nan",))


@pytest.mark.parametrize("form", TORCH_NUCLEI)
@pytest.mark.parametrize("p", [0.999, 1.0])
def test_llama_reference_top_p_wider_than_the_candidates_is_sorted_by_the_kernel(p: float, form: str) -> None:
    """A nucleus wider than the kernel's candidates (p at or near 1: a temperature-only config of the llama reference)
    is drawn on the row sorted by the kernel, the program's ids for every untied winner (no fallback to XLA's sorts)."""
    params = form_params(form, temperature=0.7, p=p)
    draw = jax.jit(lambda x, key: sampling.torch_nucleus_by_sort(x, key, params, form))
    candidates = jax.jit(lambda x, key: sampling.torch_nucleus_by_candidates(x, key, params, form))
    reference = jax.jit(lambda x, key: sample_reference(x, key, form=form, **params))
    for case in ("peaked", "normal", "flat"):
        logits = jnp.asarray(_logits(4, WIDE, case))
        for seed in range(3):
            key = jnp.array([seed, 5], jnp.uint32)
            want = reference(logits, key)
            np.testing.assert_array_equal(draw(logits, key), want, err_msg=f"{case} seed {seed}")
            if p == 1.0:  # the candidates cannot hold all V: that batch would run the program's sorts
                assert bool(jnp.any(candidates(logits, key) == UNCERTIFIED)), f"{case} seed {seed}"
    lowering = jax.jit(sampling.torch_nucleus_lowering(form, params))
    _assert_gives_the_reference_ids(lowering, form, params, CASES + ("many_nan",))


def test_torch_nucleus_scores_are_the_programs_logs_of_its_weights() -> None:
    """The kernel draws the torch nucleus from `rank_nucleus_scores` of the sorted probabilities: bit for bit the logs
    the program's choice adds its noise to, the renormalised probabilities' for the llama reference and the weights'
    own for xformers' fastgen. The two differ in their bits (so a draw from the wrong one is another program), though
    they rarely change a winner, which is why the ids alone cannot tell them apart."""
    probs = jax.nn.softmax(jnp.asarray(_logits(4, 4096, "normal")) / 0.7, axis=-1)
    values = jnp.sort(probs, axis=-1)[:, ::-1]
    kept = jnp.where(jnp.cumsum(values, axis=-1) - values * 1 > 0.9, 0.0, values)
    logs = {"top_p_of_probs_torch": jnp.log(kept / jnp.sum(kept, axis=-1, keepdims=True)),
            "top_p_of_probs_torch_unnormalized": jnp.log(kept)}
    for form, want in logs.items():
        got = rank_nucleus_scores(values, 0.9, 0.0, sampling._torch_nucleus(form), values.shape[-1])
        np.testing.assert_array_equal(got, want, err_msg=form)
    finite = np.isfinite(np.asarray(logs["top_p_of_probs_torch"]))
    assert np.any(np.asarray(logs["top_p_of_probs_torch"])[finite]
                  != np.asarray(logs["top_p_of_probs_torch_unnormalized"])[finite])


@pytest.mark.parametrize("form", ["top_k_of_probs_torch_unnormalized", "min_p_of_probs_torch",
                                  "min_p_of_probs_torch_unnormalized"])
def test_torch_weights_give_the_reference_ids_with_no_sort(form: str) -> None:
    """A top-k or min-p of the probabilities drawn by torch.multinomial, renormalised or as weights: the program's
    softmax, zeroing (and sum), the kernel's top-k and draw of their logs, every row with the one key's noise."""
    params = form_params(form, temperature=0.7, k=40, min_p=0.1)
    lowering = jax.jit(sampling.function_form_lowering(form, params))
    _assert_gives_the_reference_ids(lowering, form, params, (*CASES, "many_nan"), key_base=43)
    _assert_no_sort(lowering)


def test_llama_reference_top_p_vouches_for_every_untied_winner() -> None:
    """With no tied probabilities every draw is the kernel's (no UNCERTIFIED row, the reference's ids); where the
    logits tie, only draws whose winner shares its probability are left to the program's sorts."""
    params = form_params("top_p_of_probs_torch", temperature=0.7, p=0.9)
    draw = jax.jit(lambda x, key: sampling.torch_nucleus_by_candidates(x, key, params))
    reference = jax.jit(lambda x, key: sample_reference(x, key, form="top_p_of_probs_torch", **params))
    for case in ("peaked", "normal"):
        logits = jnp.asarray(_logits(8, WIDE, case))
        for seed in range(4):
            key = jnp.array([seed, 3], jnp.uint32)
            np.testing.assert_array_equal(draw(logits, key), reference(logits, key), err_msg=f"{case} seed {seed}")
    logits = jnp.asarray(_logits(8, WIDE, "ties"))
    probs = jax.nn.softmax(logits / 0.7, axis=-1)
    for seed in range(4):
        key = jnp.array([seed, 3], jnp.uint32)
        tokens, want = draw(logits, key), reference(logits, key)
        vouched = tokens != UNCERTIFIED
        np.testing.assert_array_equal(tokens[vouched], want[vouched])
        tied = jnp.sum(probs == jnp.take_along_axis(probs, want[:, None], axis=-1), axis=-1) > 1
        np.testing.assert_array_equal(vouched, ~tied)  # every untied winner vouched for, no tied one


def test_llama_reference_top_p_sorts_only_in_a_branch() -> None:
    params = form_params("top_p_of_probs_torch", temperature=0.7, p=0.9)
    lowering = jax.jit(sampling.torch_nucleus_lowering("top_p_of_probs_torch", params))
    hlo = lowering.lower(jax.ShapeDtypeStruct((2, WIDE), jnp.float32),
                         jax.ShapeDtypeStruct((2,), jnp.uint32)).compile().as_text()
    entry = next(block for block in hlo.split("\n\n") if block.startswith("ENTRY"))
    assert "conditional(" in entry and " sort(" not in entry and "TopK" not in entry and " topk(" not in entry


@pytest.mark.parametrize("form", ["top_k_keep_by_top_k_mask", "min_p_log_mask", "min_p_log_constant_mask"])
@pytest.mark.parametrize("nan_sign", [1.0, -1.0], ids=["nan", "minus_nan"])
def test_masks_against_a_row_statistic_give_the_reference_ids_with_no_sort(form: str, nan_sign: float) -> None:
    """A top-k kept at or above lax.top_k's k-th, and a min-p in logit space: the program's mask against the kernel's
    top-k (or the row's max), then the kernel's draw. A -NaN is among lax.top_k's smallest (a row of them keeps its
    other tokens) and a +NaN among its largest, which the kernel's top-k must order alike; x86 computes -NaN."""
    params = form_params(form, temperature=0.7, k=64, min_p=0.05)
    lowering = jax.jit(sampling.function_form_lowering(form, params))
    reference = jax.jit(lambda x, key: sample_reference(x, key, form=form, **params))
    for case in (*CASES, "many_nan"):
        logits = _logits(3, 4096, case)
        logits = np.where(np.isnan(logits), np.copysign(np.float32(np.nan), nan_sign), logits).astype(np.float32)
        for seed in range(3):
            key = jnp.array([seed, 41 + seed], jnp.uint32)
            np.testing.assert_array_equal(lowering(logits, key), reference(logits, key), err_msg=f"{case} seed {seed}")
    _assert_no_sort(lowering)


@pytest.mark.parametrize("p", [0.5, 0.9, 0.99])
def test_count_cutoff_top_p_gives_the_reference_ids_with_no_sort(p: float) -> None:
    """The top-p by a count of sorted probabilities (`top_p_count_cutoff_mask`): its mass bound with no sorted row,
    the program's function on the kernel's sort where the bound cannot vouch (a NaN row); no sort in XLA."""
    form = "top_p_count_cutoff_mask"
    params = form_params(form, temperature=0.8, p=p)
    lowering = jax.jit(sampling.function_form_lowering(form, params))
    _assert_gives_the_reference_ids(lowering, form, params, (*CASES, "many_nan"))
    _assert_no_sort(lowering)


def test_count_cutoff_vouches_only_for_winners_its_count_bounds_keep() -> None:
    """Rows whose cumsum reaches p + 1e-8 at their second place (0.5 + 0.4 of p = 0.9), within the bound's slack: the
    program's count is 1 or 2 as its sums round, so the kernel draws among the top three and vouches only for a
    winner among the top two. Every vouched draw is the program's; the third place wins often enough to be refused
    (a bound that took the count as known would vouch for it)."""
    form = "top_p_count_cutoff_mask"
    params = form_params(form, temperature=1.0, p=0.9)
    by_mass = jax.jit(lambda x, key: sampling._count_cutoff_by_mass(x, key, params))
    reference = jax.jit(lambda x, key: sample_reference(x, key, form=form, **params))
    row = np.full(512, -np.inf, np.float32)
    row[[3, 7, 11, 12]] = np.log([0.5, 0.4, 0.06, 0.04])
    logits = jnp.asarray(np.tile(row, (8, 1)))
    refused = 0
    for seed in range(60):
        key = jnp.array([seed, 13], jnp.uint32)
        tokens, want = np.asarray(by_mass(logits, key)), np.asarray(reference(logits, key))
        sure = tokens != sampling.UNCERTIFIED
        np.testing.assert_array_equal(tokens[sure], want[sure], err_msg=f"seed {seed}")
        assert set(tokens[sure]) <= {3, 7}
        refused += int((~sure).sum())
    assert refused > 5
