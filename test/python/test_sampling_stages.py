"""Chains of filters, each applied to the last one's logits, in any order: fused whole as the form of their last
filters and draw, with those in front taken in as the composite's stages (sampling_reference.Stage), and the same
token ids from the original, the fused program, the reference rebuilt from the attributes and the CPU kernel.

The chains are generated: every ordered pair of five filters as JAX pipelines write them, and some triples, each
after x / T; a vmapped chain with a key per row; and the parts the stages rest on (the attributes' round trip, the
kernel's sorts standing in for XLA's bit for bit).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given, settings
from jaxlib.mlir import ir
from sampling_programs import jax_classic_removal, jax_put_back
from sampling_variants import (
    VARIANTS,
    _count_cutoff_top_p,
    _log_space_min_p,
    _sequence_top_k,
    _sequence_top_p,
    _top_k_at_lax_kth,
    lower,
)
from test_fuse_sampling_e2e import _cpu_kernel_module, compile_module, logits_cases
from test_sampling_differential import PROFILE

from hlofuse.kernels.sampling_reference import FORMS, STAGE_FORMS, Stage
from hlofuse.ops.attributes import attribute_values
from hlofuse.ops.sample import SampleAttrs
from hlofuse.pipeline import run_pipeline
from hlofuse.testing.modules import clone_module, count_composites, sample_attrs

V = 256
# Each filter as a pipeline writes it on one row, and the form whose filter it is (a stage's, or the composite's).
FILTERS: dict[str, tuple[Callable[[jax.Array], jax.Array], str]] = {
    "top_k_sort": (lambda y: _sequence_top_k(y, 40), "top_k_keep_mask"),
    "top_k_lax": (lambda y: _top_k_at_lax_kth(y, 30), "top_k_keep_by_top_k_mask"),
    "top_p_argsort": (lambda y: _sequence_top_p(y, 0.9), "top_p_descending_mask"),
    "top_p_count": (lambda y: _count_cutoff_top_p(y, 0.85), "top_p_count_cutoff_mask"),
    "min_p_log": (lambda y: _log_space_min_p(y, 0.05), "min_p_log_constant_mask"),
}
# (a top-k at the sort's k-th then the classic top-p is one form of its own: no stage)
CHAINS = [names for names in itertools.permutations(FILTERS, 2) if names != ("top_k_sort", "top_p_argsort")]
CHAINS += [("top_k_sort", "top_p_argsort", "min_p_log"), ("top_k_lax", "top_p_count", "min_p_log"),
           ("min_p_log", "top_k_lax", "top_p_argsort"), ("top_p_count", "top_k_sort", "top_k_lax")]


def _chain(names: tuple[str, ...]) -> Callable[[jax.Array, jax.Array], jax.Array]:
    def sampler(x: jax.Array, key: jax.Array) -> jax.Array:
        y = x / 0.7
        for name in names:
            y = FILTERS[name][0](y)
        return jax.random.categorical(key, y)

    return sampler


def _expected(names: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """The composite's form and its stages' forms: the chain form of a top-k at the sort's k-th then the classic
    top-p where it ends so, else the last filter's form, the others its stages."""
    if names[-2:] == ("top_k_sort", "top_p_argsort"):
        return "top_k_keep_top_p_descending_mask", tuple(FILTERS[n][1] for n in names[:-2])
    return FILTERS[names[-1]][1], tuple(FILTERS[n][1] for n in names[:-1])


def _assert_fused_whole_with_the_same_ids(sampler: Callable[..., jax.Array], shape: tuple[int, ...], keys: int,
                                          form: str, stages: tuple[str, ...],
                                          dtype: Any = jnp.float32) -> None:  # noqa: ANN401
    """One composite of `form` with the stages of forms `stages`, and the same ids from the original, the fused
    program, the reference and the CPU kernel for each logits case and `keys` keys."""
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    original = jax.jit(sampler).lower(jax.ShapeDtypeStruct(shape, dtype), key).compiler_ir("stablehlo")
    fused = clone_module(original)
    result = run_pipeline(fused, "builtin.module(hlofuse-prepare,hlofuse-fuse-sampling)")
    remarks = [str(r) for r in result.remarks if "fuse-sampling" in str(r)]
    assert count_composites(fused, "hlofuse.sample") == 1 and not remarks, remarks
    (attrs,) = sample_attrs(fused)
    assert (attrs.form, tuple(stage.form for stage in attrs.stages)) == (form, stages)
    referenced = clone_module(fused)
    run_pipeline(referenced, "builtin.module(hlofuse-lower-kernels{target=reference})")
    programs = {"original": original, "fused": fused, "reference": referenced}
    kernel = _cpu_kernel_module(fused)
    if kernel is not None:
        programs["cpu"] = kernel
    runs = {name: compile_module(clone_module(m)) for name, m in programs.items()}
    numpy_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == jnp.bfloat16 else np.dtype(dtype)
    for case, logits in logits_cases(shape, numpy_dtype).items():
        for seed in range(keys):
            args = [logits, np.array([seed, 500 + seed], np.uint32)]
            want = runs["original"](*args)
            for name, run in runs.items():
                np.testing.assert_array_equal(run(*args)[0], want[0], err_msg=f"{name} {case} seed {seed}")


@pytest.mark.parametrize("names", CHAINS, ids="-".join)
def test_a_chain_in_any_order_fuses_whole_with_its_stages(names: tuple[str, ...]) -> None:
    _assert_fused_whole_with_the_same_ids(_chain(names), (V,), 3, *_expected(names))


def _min_p_of_probs(y: jax.Array, min_p: float = 0.05) -> jax.Array:
    """A min-p of the probabilities, as serving code writes it: removed below min_p times the row's top probability."""
    probs = jax.nn.softmax(y, axis=-1)
    return jnp.where(probs < min_p * jnp.max(probs, axis=-1, keepdims=True), -jnp.inf, y)


def _top_a(y: jax.Array, ratio: float = 0.02) -> jax.Array:
    """x-transformers' top-a: removed below ratio times the top probability squared."""
    probs = jax.nn.softmax(y, axis=-1)
    return jnp.where(probs < jnp.max(probs, axis=-1, keepdims=True) ** 2 * ratio, -jnp.inf, y)


def _flax_top_p(y: jax.Array, p: float = 0.9) -> jax.Array:
    """Hugging Face's FlaxTopPLogitsWarper: lax.top_k of the whole row, the shifted cumsum mask, the first token kept,
    the kept scores put back in vocabulary order by `sort_key_val` of their ids (no `where` at its end)."""
    scores, ids = jax.lax.top_k(y, y.shape[-1])
    keep = jnp.roll(jnp.cumsum(jax.nn.softmax(scores, axis=-1), axis=-1) < p, 1)
    keep |= keep.at[:, 0].set(True)
    keep = keep.at[:, :1].set(True)
    return jax.lax.sort_key_val(ids, jnp.where(keep, scores, jnp.full_like(scores, -jnp.inf)))[-1]


# Filters of a batch (B, V) whose forms became stages later than the first five: the min-p of the probabilities,
# top-a, and Flax's top-p, whose filtered logits come out of a sort (no `where` at its end).
BATCH_FILTERS: dict[str, tuple[Callable[[jax.Array], jax.Array], str]] = {
    "top_k_lax": FILTERS["top_k_lax"],
    "min_p_probs": (_min_p_of_probs, "min_p_logits_mask"),
    "top_a": (_top_a, "top_a_logits_mask"),
    "top_p_flax": (_flax_top_p, "top_p_flax_mask"),
}
BATCH_CHAINS = [("min_p_probs", "top_k_lax"), ("top_k_lax", "min_p_probs"), ("top_a", "top_k_lax"),
                ("top_p_flax", "min_p_probs"), ("top_p_flax", "top_k_lax"), ("min_p_probs", "top_p_flax"),
                ("top_k_lax", "top_p_flax", "top_a")]


@pytest.mark.parametrize("names", BATCH_CHAINS, ids="-".join)
def test_a_chain_of_probability_filters_fuses_whole_with_its_stages(names: tuple[str, ...]) -> None:
    """A min-p of the probabilities, top-a and Flax's top-p in front of another filter are stages too."""
    def sampler(x: jax.Array, key: jax.Array) -> jax.Array:
        y = x / 0.7
        for name in names:
            y = BATCH_FILTERS[name][0](y)
        return jax.random.categorical(key, y)

    stages = tuple(BATCH_FILTERS[name][1] for name in names[:-1])
    _assert_fused_whole_with_the_same_ids(sampler, (3, V), 2, BATCH_FILTERS[names[-1]][1], stages)


# Values for a stage's parameters and the constants its writing reads.
_STAGE_VALUES = {"temperature": 0.7, "k": 8, "p": 0.8, "min_p": 0.05, "fill": -1e10, "eps": 1e-4, "epsilon": 1e-4,
                 "one_minus_p": 0.2, "log_min_p": float(np.log(0.05))}


# (a chain form, a top-k and then another filter, is taken in as two stages: its top-k's and its other filter's)
@pytest.mark.parametrize(("name", "dtype"), [
    *((name, jnp.float32) for name in STAGE_FORMS if "+" not in FORMS[name].mode),
    # of bf16 logits, filters whose probabilities round in bf16: the stage's ops are the program's, its sorts XLA's
    *((name, jnp.bfloat16) for name in ("min_p_logits_mask", "typical_mask", "top_p_flax_mask"))])
def test_every_stage_form_fuses_in_front_of_a_top_k_and_draws_the_same_tokens(name: str, dtype: Any) -> None:  # noqa: ANN401
    """Each STAGE_FORMS filter's own writing (its reference function) applied to a batch, then the top-k mask: fused
    whole as top_k_mask with that filter as its stage, and the same ids from the original, the fused program, the
    reference and the CPU kernel (its stage on the kernel's sorts)."""
    form = FORMS[name]
    reads = dict.fromkeys(("temperature", "k", "p", "min_p", *form.params, *form.writings[0].reads))
    stage = Stage(name, 0, tuple((read, _STAGE_VALUES[read]) for read in reads))

    def sampler(x: jax.Array, key: jax.Array) -> jax.Array:
        y = stage.filtered(x)
        return jax.random.categorical(key, jnp.where(y < jax.lax.top_k(y, 4)[0][..., -1:], -jnp.inf, y))

    _assert_fused_whole_with_the_same_ids(sampler, (2, V), 1, "top_k_mask", (name,), dtype=dtype)


def test_a_bf16_chain_fuses_whole_with_its_stages() -> None:
    """Of bf16 logits the CPU kernel's stages keep XLA's sorts (their softmax and cumsum round as XLA fuses them)."""
    names = ("top_p_argsort", "top_k_lax")
    _assert_fused_whole_with_the_same_ids(_chain(names), (1024,), 4, *_expected(names), dtype=jnp.bfloat16)


def test_a_vmapped_chain_with_a_key_per_row_fuses_whole_with_its_stages() -> None:
    one_row = _chain(("top_k_lax", "top_p_argsort", "min_p_log"))

    def sampler(x: jax.Array, key: jax.Array) -> jax.Array:
        return jax.vmap(one_row)(x, jax.random.split(key, x.shape[0]))

    _assert_fused_whole_with_the_same_ids(sampler, (3, V), 2, "min_p_log_constant_mask_row_keys",
                                          ("top_k_keep_by_top_k_mask", "top_p_descending_mask"))


def test_stages_round_trip_through_the_composite_attributes() -> None:
    stages = (Stage("top_k_keep_mask", 1, (("k", 40), ("temperature", 0.7))),
              Stage("top_p_descending_mask", 0, (("fill", -1e10), ("p", 0.9))))
    attrs = SampleAttrs(mode="min_p", form="min_p_log_mask", min_p=0.05, stages=stages)
    with ir.Context(), ir.Location.unknown():
        values = attribute_values(ir.DictAttr.get(attrs.ir_attributes()))
        assert "stages" not in SampleAttrs(mode="min_p", form="min_p_log_mask").ir_attributes()
    assert values["stages"][0] == {"form": "top_k_keep_mask", "writing": 1, "k": 40, "temperature": 0.7}
    assert SampleAttrs.from_dict(values) == attrs


def _sorting(x: jax.Array) -> tuple[jax.Array, ...]:
    """What stages do with sorts: argsorts both ways, the sorted values, lax.top_k's k-th, an argsort's argsort."""
    order = jnp.argsort(x, axis=-1, descending=True)
    kth = jax.lax.top_k(x, 5)[0][..., -1:]
    return (jnp.take_along_axis(x, order, axis=-1), jnp.sort(x, axis=-1), jnp.argsort(x, axis=-1)[..., ::-1],
            jnp.argsort(order, axis=-1), jnp.where(x >= kth, x, -jnp.inf))


def test_the_kernel_sorts_give_the_functions_bits_with_no_sort_left() -> None:
    """sampling's `on_kernel_sorts` (the CPU kernel's stages): -0 and +0, NaN of either sign, infinities and ties, in
    f32 and bf16, batched or one row; int32 keys of any value by their two halves."""
    from hlofuse.kernels import cpu
    from hlofuse.kernels.cpu import sampling

    if not cpu.is_available():
        pytest.skip("the native CPU sampling kernel is not built")
    rng = np.random.default_rng(3)
    x = np.round(rng.standard_normal((3, 64)) * 2).astype(np.float32)
    x[0, 3], x[1, 5], x[1, 9] = np.nan, -np.nan, np.inf
    x[2, 7], x[2, 8] = -0.0, 0.0
    for part in range(5):
        def fn(y: jax.Array, part: int = part) -> jax.Array:
            return _sorting(y)[part]

        on_kernel = jax.jit(lambda y, fn=fn: sampling.on_kernel_sorts(fn, y))
        for logits in (x, x[2], x.astype(jnp.bfloat16)):
            got, want = np.asarray(on_kernel(logits)), np.asarray(jax.jit(fn)(logits))
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=f"part {part}")
        hlo = on_kernel.lower(x).compile().as_text()
        assert " sort(" not in hlo and "TopK" not in hlo and " topk(" not in hlo
    ints = rng.integers(-2**31, 2**31 - 1, (3, 100), dtype=np.int64).astype(np.int32)
    ints[:, :10] = ints[:, 10:20]  # ties
    order = jax.jit(lambda y: sampling.on_kernel_sorts(lambda z: jnp.argsort(z, axis=-1), y))(ints)
    np.testing.assert_array_equal(order, np.argsort(ints, axis=-1, kind="stable"))


def _filtered_rows(rng: np.random.Generator) -> list[np.ndarray]:
    """Rows a filter leaves: most tokens at one fill (-inf, +inf as a negated row has it, a finite fill, NaN, zeros of
    either sign), a few kept, ties among the kept; a row of one value; a row just under and just over a quarter
    filled; and rows of no fill."""
    vocab = 997
    rows = []
    for fill in (-np.inf, np.inf, -1e10, np.nan, 0.0, -0.0):
        for kept in (0, 1, 40, vocab // 2, vocab - vocab // 4 - 1, vocab - vocab // 4 + 1):
            row = np.full(vocab, fill, np.float32)
            ids = rng.choice(vocab, kept, replace=False)
            row[ids] = np.round(rng.standard_normal(kept) * 3).astype(np.float32)
            rows.append(row)
    mixed_zeros = np.where(rng.random(vocab) < 0.5, np.float32(0.0), np.float32(-0.0))
    mixed_zeros[:5] = [1.0, -1.0, np.nan, -np.nan, np.inf]
    rows += [mixed_zeros, rng.standard_normal(vocab).astype(np.float32), np.full(vocab, 7.0, np.float32)]
    return rows


def test_the_kernel_sort_of_a_filtered_row_is_jaxs_stable_sort() -> None:
    """The kernel's sort places a row's fill (the extreme most of a filtered row holds) by one pass in id order and
    sorts only the others: values and ids as JAX's stable sort gives them, bit for bit, ascending and of the negated
    row (a descending sort), one row at a time and as a batch."""
    from hlofuse.kernels import cpu
    from hlofuse.kernels.cpu import sampling

    if not cpu.is_available():
        pytest.skip("the native CPU sampling kernel is not built")
    rows = np.stack(_filtered_rows(np.random.default_rng(5)))

    def by_jax(y: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jax.lax.sort((y, jax.lax.broadcasted_iota(jnp.int32, y.shape, 1)), num_keys=1, is_stable=True)

    for keys in (rows, -rows):
        got = jax.jit(sampling._sort_by_kernel)(keys)
        want = jax.jit(by_jax)(keys)
        np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
        np.testing.assert_array_equal(np.asarray(got[0]).view(np.uint32), np.asarray(want[0]).view(np.uint32))


@pytest.mark.parametrize("largest_selected", [4096, 16])
def test_a_stages_top_k_is_lax_top_k_by_selection_or_by_the_descending_sort(largest_selected: int,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage's lax.top_k up to TOP_K_BY_SELECTION_UP_TO by the kernel's top-k, a larger one (Flax's top-p takes the
    whole row) as the first k of the kernel's sort in lax.top_k's order: the same values and ids either way."""
    from hlofuse.kernels import cpu
    from hlofuse.kernels.cpu import sampling

    if not cpu.is_available():
        pytest.skip("the native CPU sampling kernel is not built")
    monkeypatch.setattr(sampling, "TOP_K_BY_SELECTION_UP_TO", largest_selected)
    rows = np.stack(_filtered_rows(np.random.default_rng(9)))
    for k in (100, rows.shape[-1]):
        def top_k(y: jax.Array, k: int = k) -> tuple[jax.Array, jax.Array]:
            return jax.lax.top_k(y, k)

        got = jax.jit(lambda y, top_k=top_k: sampling.on_kernel_sorts(lambda z: jnp.stack(
            [top_k(z)[0], top_k(z)[1].astype(jnp.float32)]), y))(rows)
        want = jax.jit(lambda y, top_k=top_k: jnp.stack([top_k(y)[0], top_k(y)[1].astype(jnp.float32)]))(rows)
        np.testing.assert_array_equal(np.asarray(got).view(np.uint32), np.asarray(want).view(np.uint32))


def test_the_kernel_sorts_int32_keys_in_one_call_and_inverts_a_permutation() -> None:
    """int32 keys (an argsort's ids sorted again, to put values back) sort by `hlofuse_sample_sort_integers`, one
    call: a permutation of 0..n-1 gives its inverse, and keys that are not one (a repeated id, one out of range,
    negative keys, a row mostly one value) JAX's stable order."""
    from hlofuse.kernels import cpu
    from hlofuse.kernels.cpu import sampling

    if not cpu.is_available():
        pytest.skip("the native CPU sampling kernel is not built")
    rng = np.random.default_rng(7)
    n = 500
    perms = np.stack([rng.permutation(n) for _ in range(3)]).astype(np.int32)
    near = perms.copy()
    near[0, 10] = near[0, 11]  # one id twice
    near[1, 3] = n  # one out of range
    near[2, 4] = -1
    mostly = np.where(rng.random((2, n)) < 0.9, np.int32(-7), rng.integers(-2**31, 2**31 - 1, (2, n))).astype(np.int32)
    wide = rng.integers(-2**31, 2**31 - 1, (2, n), dtype=np.int64).astype(np.int32)
    order = jax.jit(lambda y: sampling.on_kernel_sorts(lambda z: jnp.argsort(z, axis=-1), y))
    for keys in (perms, near, mostly, wide, perms[0]):
        np.testing.assert_array_equal(order(keys), np.argsort(keys, axis=-1, kind="stable"))
    np.testing.assert_array_equal(order(perms)[0][perms[0]], np.arange(n))
    hlo = order.lower(perms).compile().as_text()
    assert hlo.count("hlofuse_sample_sort_integers") == 1 and "hlofuse_sample_sort\"" not in hlo


@pytest.mark.parametrize("target", ["tpu-interpret", "neuron-sim"])
@pytest.mark.parametrize(("name", "stage"), [("chain_min_p_then_top_k_mask_of_a_batch", "min_p_log_mask"),
                                             ("chain_min_p_of_probs_then_temperature_then_top_k", "min_p_logits_mask")])
def test_stages_run_in_front_of_the_pallas_and_nki_kernels(target: str, name: str, stage: str) -> None:
    """A min-p stage (in logit space; of the probabilities, with a temperature after it) in front of a top-k mask (a
    form every kernel takes): the stage by the program's ops, then the target's kernel, with the original's ids."""
    variant = next(v for v in VARIANTS if v.name == name)
    original = lower(variant).compiler_ir("stablehlo")
    fused = clone_module(original)
    run_pipeline(fused, "builtin.module(hlofuse-prepare,hlofuse-fuse-sampling)")
    assert [found.form for found in sample_attrs(fused)[0].stages] == [stage]
    result = run_pipeline(fused, f"builtin.module(hlofuse-lower-kernels{{target={target}}})")
    assert result.counters[f"sample_to_{target}"] == 1, [str(r) for r in result.remarks]
    run_original, run_kernel = compile_module(original), compile_module(fused)
    for case, logits in logits_cases(variant.shape, np.dtype(np.float32)).items():
        for seed in range(2):
            args = [logits, np.array([seed, 77], np.uint32)]
            np.testing.assert_array_equal(run_kernel(*args)[0], run_original(*args)[0], err_msg=f"{case} seed {seed}")


def _classic_top_p(y: jax.Array, p: float) -> jax.Array:
    """The classic top-p as JAX engines write it: a flipped argsort, `jnp.roll`'s shift, the removal put back by a
    take along the order's argsort (sampling_programs' writing)."""
    removed, _, order = jax_classic_removal(y, p, "flip", "roll")
    return jnp.where(jax_put_back(order, removed, "take"), -jnp.inf, y)


# More writings for the generated chains: the top-k masked below lax.top_k's k-th, the top-k kept at or above a
# sort's k-th column (JAX engines' `jnp.sort(y)[..., -k]`), the classic top-p by a flipped argsort, a min-p whose
# log(min_p) is the program's op.
GENERATED_FILTERS: dict[str, Callable[[jax.Array], jax.Array]] = {
    **{name: fn for name, (fn, _) in FILTERS.items()},
    "top_k_below_lax": lambda y: jnp.where(y < jax.lax.top_k(y, 24)[0][..., -1:], -jnp.inf, y),
    "top_k_sort_column": lambda y: jnp.where(y >= jnp.sort(y, axis=-1)[..., -20][..., None], y, -jnp.inf),
    "top_p_flipped": lambda y: _classic_top_p(y, 0.8),
    "min_p_log_op": lambda y: _log_space_min_p(y, 0.1, jnp.log),
    "min_p_probs": lambda y: _min_p_of_probs(y, 0.1),
    "top_a": _top_a,
    "top_p_flax": _flax_top_p,
}
# Filters written for a batch (B, V) alone (Flax's `.at[:, 0]`): not of one row, nor vmapped.
BATCH_ONLY_FILTERS = ("top_p_flax",)


# The filters written for one row (V,) alone (a scalar k-th or cutoff indexed from the row, a max over every axis):
# not of a batch.
ONE_ROW_FILTERS = ("top_k_sort", "top_p_argsort", "top_p_count", "min_p_log", "min_p_log_op")


def _once(name: str) -> str:
    """What a pipeline applies once: each filter, and one min-p of either writing."""
    return "min_p" if name.startswith("min_p") else name


@settings(PROFILE, max_examples=max(2, round(PROFILE.max_examples * 0.25)))
@given(st.lists(st.sampled_from(sorted(GENERATED_FILTERS)), min_size=2, max_size=4, unique_by=_once),
       st.sampled_from(["row", "batch", "vmapped_keys"]), st.sampled_from([0.7, 1.0]))
def test_a_generated_chain_fuses_whole_and_draws_the_same_tokens(names: list[str], batch: str,
                                                                 temperature: float) -> None:
    """Any sequence of distinct filters (one min-p), after x / T (none at T = 1), on one row, a batch, or one row
    vmapped with a key per row: one composite, nothing left to XLA, every stage a STAGE_FORMS filter, and the
    original's ids. (Each filter once, as pipelines apply them: a min-p after a min-p reads the first one's row max,
    which its template, of its own input's max, does not match.)"""
    assume(batch != "batch" or not set(names) & set(ONE_ROW_FILTERS))
    assume(batch == "batch" or not set(names) & set(BATCH_ONLY_FILTERS))
    # (not yet a stage: the count cutoff of one row vmapped, whose `sorted[count]` vmap batches as a gather that no
    # stage template of (B, V) logits writes; as the last filter its `_row_keys` form takes it)
    assume(batch != "vmapped_keys" or "top_p_count" not in names[:-1])

    def one_row(x: jax.Array, key: jax.Array) -> jax.Array:
        y = x / temperature if temperature != 1.0 else x
        for name in names:
            y = GENERATED_FILTERS[name](y)
        return jax.random.categorical(key, y)

    if batch == "vmapped_keys":
        sampler, shape = (lambda x, key: jax.vmap(one_row)(x, jax.random.split(key, x.shape[0]))), (2, V)
    else:
        sampler, shape = one_row, ((2, V) if batch == "batch" else (V,))
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    original = jax.jit(sampler).lower(jax.ShapeDtypeStruct(shape, jnp.float32), key).compiler_ir("stablehlo")
    fused = clone_module(original)
    result = run_pipeline(fused, "builtin.module(hlofuse-prepare,hlofuse-fuse-sampling)")
    remarks = [str(r) for r in result.remarks if "fuse-sampling" in str(r)]
    assert count_composites(fused, "hlofuse.sample") == 1 and not remarks, (names, batch, remarks)
    (attrs,) = sample_attrs(fused)
    assert all(stage.form in STAGE_FORMS for stage in attrs.stages)
    programs = {"original": original, "fused": fused}
    kernel = _cpu_kernel_module(fused)
    if kernel is not None:
        programs["cpu"] = kernel
    runs = {name: compile_module(clone_module(m)) for name, m in programs.items()}
    for case, logits in logits_cases(shape, np.dtype(np.float32)).items():
        args = [logits, np.array([3, 41], np.uint32)]
        want = runs["original"](*args)
        for name, run in runs.items():
            np.testing.assert_array_equal(run(*args)[0], want[0], err_msg=f"{names} {batch} {name} {case}")
