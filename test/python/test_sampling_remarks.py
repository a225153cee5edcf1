"""Every draw over the vocabulary fed by noise or a softmax that is not fused whole gets a remark (and a
counter): a draw no form matches says which form came closest and where the program parts from it, and a
sampler fused only at its draw says which of its filters stays in XLA."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sampling_variants import near_miss_search_cutoff_read_beside_the_draw

from hlofuse.kernels.sampling_reference import FORMS
from hlofuse.pipeline import run_pipeline
from hlofuse.testing.modules import clone_module, count_composites, run_module

B, V = 2, 256


def gumbel_of_one_minus_u(x, key):
    """A Gumbel noise of 1 - u, -log(-log1p(-u)): no writing of noise.HAND_NOISES (the bare -log(-log(u)) is one)."""
    return jnp.argmax(x / 0.7 - jnp.log(-jnp.log1p(-jax.random.uniform(key, x.shape))), axis=-1)


def uniform_noise(x, key):
    return jnp.argmax(x + jax.random.uniform(key, x.shape), axis=-1)


def several_samples(x, key):
    """(3, B) draws of the same logits: the noise is (3, B, V); no form draws it, but it is fused as
    categorical of the broadcast logits."""
    return jax.random.categorical(key, x / 0.7, shape=(3, B))


def several_samples_without_replacement(x, key):
    """3 tokens per row, none twice: the top 3 of the perturbed logits; no form draws several."""
    return jax.random.categorical(key, x / 0.7, shape=(3, B), replace=False)


def batch_axis_draw(x, key):
    return jax.random.categorical(key, x, axis=0)


def greedy_top_1_of_probs(x, key):
    return jax.lax.top_k(jax.nn.softmax(x, axis=-1), 1)[1][:, 0]


def argmax_of_log_softmax(x, key):
    return jnp.argmax(jax.nn.log_softmax(x, axis=-1), axis=-1)


def nucleus_with_small_fill(x, key):
    """The nucleus filled with -1000, not -inf: a fill a kept logit may come near (FILL_BOUND), so not the top_p_mask
    form; fused as temperature of its output."""
    ordered = jnp.sort(x, axis=-1)[:, ::-1]
    cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
    cutoff = jnp.take_along_axis(ordered, jnp.sum(cumulative < 0.9, axis=-1, keepdims=True), axis=-1)
    return jax.random.categorical(key, jnp.where(x < cutoff, -1000.0, x) / 0.7)


def unshifted_rank_space_nucleus(x, key):
    """keras-hub's nucleus without its shift (`cumsum <= p` itself keeps): a rule no form has."""
    probs = jax.nn.softmax(x / 0.7, axis=-1)
    ordered, ids = jax.lax.top_k(probs, V)
    keep = jnp.cumsum(ordered, axis=-1) <= 0.9
    pick = jax.random.categorical(key, jnp.log(jnp.where(keep, ordered, 0.0)))
    return jnp.take_along_axis(ids, pick[:, None], axis=-1)[:, 0]


def bisected_top_k(x, key):
    """A top-k cutoff found by bisection over the values (tpu-inference's way: no sort), a loop carrying the
    logits: fused at its draw, and the remark names the loop."""
    def halve(_, bounds):
        lo, hi = bounds
        mid = (lo + hi) / 2
        enough = jnp.sum(x >= mid[:, None], axis=-1) >= 16
        return jnp.where(enough, mid, lo), jnp.where(enough, hi, mid)

    lo, _ = jax.lax.fori_loop(0, 24, halve, (jnp.min(x, axis=-1), jnp.max(x, axis=-1)))
    return jax.random.categorical(key, jnp.where(x >= lo[:, None], x, -jnp.inf))


def scaled_logits_escape(x, key):
    scaled = x / 0.7
    return jax.random.categorical(key, scaled), scaled


def filtered_logits_escape(x, key):
    """t5x's decode step: the token's log-probability under the filtered distribution, a log_softmax of the masked
    logits beside the draw. The top-k mask form matches but would take the masked logits from their other user:
    the draw fuses as a categorical of them."""
    kth = jax.lax.top_k(x, 16)[0][..., -1:]
    masked = jnp.where(x < kth, -jnp.inf, x) / 0.8
    token = jax.random.categorical(key, masked)
    return token, jnp.take_along_axis(jax.nn.log_softmax(masked), token[:, None], axis=-1)


NOT_FUSED = {
    gumbel_of_one_minus_u: "closest: `temperature`",
    uniform_noise: "closest: `categorical`, whose stablehlo.log",
    batch_axis_draw: "argmax over dim 0 (not the last): every sampler form draws over the last dim",
    several_samples_without_replacement: "3 tokens per row drawn without replacement (chlo.top_k with k = 3 of noisy "
                                         "logits, its values unread: jax.random.categorical(..., replace=False))",
    greedy_top_1_of_probs: "top_k with k = 1 over logits matches no sampler form (tried: none) (it draws from a "
                           "softmax: stablehlo.exponential at",
}
FUSED_IN_PART = {
    argmax_of_log_softmax: "fused as `greedy`; a softmax (stablehlo.exponential at",
    nucleus_with_small_fill: "fused as `temperature`; the top-p filter (stablehlo.sort at",
    unshifted_rank_space_nucleus: "fused as `categorical`; the top-p filter (chlo.top_k at",
    bisected_top_k: "fused as `categorical`; a threshold search over the vocabulary (stablehlo.while at",
    filtered_logits_escape: "stays in XLA; not fused as `top_k_mask` or `temperature`: stablehlo.divide inside the "
                            "sampler has a user outside it (stablehlo.",
    # (a form that gives back the scores it draws from says so: what the program reads is something else)
    near_miss_search_cutoff_read_beside_the_draw: "not fused as `searched_top_k`: stablehlo.multiply inside the "
                                                  "sampler has a user outside it (func.return at",
}


def _run(fn: Callable) -> tuple[object, list[str], object]:
    args = (jax.ShapeDtypeStruct((B, V), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.uint32))
    module = clone_module(jax.jit(fn).lower(*args).compiler_ir("stablehlo"))
    result = run_pipeline(module, "builtin.module(hlofuse-prepare,hlofuse-fuse-sampling)")
    return module, [str(r) for r in result.remarks], result.counters


@pytest.mark.parametrize("fn", list(NOT_FUSED), ids=lambda f: f.__name__)
def test_unfused_draw_says_why(fn: Callable) -> None:
    module, remarks, counters = _run(fn)
    assert count_composites(module, "hlofuse.sample") == 0
    assert counters["sampling_not_fused"] == 1, remarks
    assert any("sampler not fused" in r and NOT_FUSED[fn] in r for r in remarks), remarks


@pytest.mark.parametrize("fn", list(FUSED_IN_PART), ids=lambda f: f.__name__)
def test_sampler_fused_in_part_says_what_stays_in_xla(fn: Callable) -> None:
    module, remarks, counters = _run(fn)
    assert count_composites(module, "hlofuse.sample") == 1
    assert counters["sampling_fused_in_part"] == 1, remarks
    assert any("sampler fused only in part" in r and FUSED_IN_PART[fn] in r and "stay" in r for r in remarks), remarks


def test_sampler_fused_whole_gives_no_remark() -> None:
    def top_p(x, key):
        ordered = jnp.sort(x, axis=-1)[:, ::-1]
        cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
        cutoff = jnp.take_along_axis(ordered, jnp.sum(cumulative < 0.9, axis=-1, keepdims=True), axis=-1)
        return jax.random.categorical(key, jnp.where(x < cutoff, -jnp.inf, x) / 0.7)

    module, remarks, counters = _run(top_p)
    assert counters["top_p_mask_to_sample"] == 1 and not remarks, remarks


@pytest.mark.parametrize("fn", [scaled_logits_escape, filtered_logits_escape], ids=lambda f: f.__name__)
def test_a_form_whose_values_are_read_elsewhere_gives_way_to_a_smaller_one(fn: Callable) -> None:
    """The temperature form would take the scaled logits that the program also returns, the top-k mask form the
    masked logits a log_softmax also reads: each draw fuses as a categorical of those values, which stay the
    program's, and the ids and the other outputs are the original's."""
    module, remarks, counters = _run(fn)
    assert counters["categorical_to_sample"] == 1 and not counters["sampling_not_fused"], (remarks, counters)
    args = (jax.ShapeDtypeStruct((B, V), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.uint32))
    original = jax.jit(fn).lower(*args).as_text()
    rng = np.random.default_rng(0)
    for _ in range(3):
        inputs = [rng.standard_normal((B, V)).astype(np.float32), rng.integers(0, 2**32, 2, dtype=np.uint32)]
        for want, got in zip(run_module(original, inputs), run_module(module, inputs), strict=True):
            np.testing.assert_array_equal(got, want)


def test_several_samples_fuse_as_categorical_of_the_broadcast() -> None:
    module, remarks, counters = _run(several_samples)
    assert counters["categorical_to_sample"] == 1, remarks


def test_a_python_zero_fill_is_the_zeros_of_the_form() -> None:
    """keras-hub's nucleus with `where(keep, p, 0.0)`: the weak-typed zero's identity convert is dropped by
    hlofuse-prepare, so it fuses whole as top_p_of_probs."""

    def keras_top_p_python_zero(x, key):
        ordered, ids = jax.lax.top_k(jax.nn.softmax(x / 0.7, axis=-1), V)
        keep = jnp.cumsum(ordered, axis=-1) <= 0.9
        keep = jnp.concatenate([jnp.ones_like(keep[:, :1]), keep[:, :-1]], axis=-1)
        pick = jax.random.categorical(key, jnp.log(jnp.where(keep, ordered, 0.0)))
        return jnp.take_along_axis(ids, pick[:, None], axis=-1)[:, 0]

    module, remarks, counters = _run(keras_top_p_python_zero)
    assert counters["top_p_of_probs_to_sample"] == 1 and not remarks, (remarks, counters)


@pytest.mark.parametrize("fill", [-1e7, -1e10, float(jnp.finfo(jnp.float32).min)])
def test_a_large_negative_fill_is_the_minus_inf_of_the_form(fill: float) -> None:
    """MaxText fills the dropped logits with -1e7, EasyDeL -1e10, gemma finfo.min: each the top_p_mask form."""

    def nucleus(x, key):
        ordered = jnp.sort(x, axis=-1)[:, ::-1]
        cumulative = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1)
        cutoff = jnp.take_along_axis(ordered, jnp.sum(cumulative < 0.9, axis=-1, keepdims=True), axis=-1)
        return jax.random.categorical(key, jnp.where(x < cutoff, fill, x) / 0.7)

    module, remarks, counters = _run(nucleus)
    assert counters["top_p_mask_to_sample"] == 1 and not remarks, (remarks, counters)


@pytest.mark.parametrize("min_p", [0.1, 1.5])
def test_hf_min_p_fuses_only_where_its_writings_agree(min_p: float) -> None:
    """Hugging Face's min-p keeps its top token by torch.topk (5.x) or an argsort (4.x): the same ids while min_p
    <= 1 (the max is never removed); above 1 the fusion keeps to the draw and says what stays in XLA."""

    def hf_min_p(x, key):  # the form's own program (its test: the limit on the constant it reads)
        return FORMS["min_p_removal"].fn(x, key, temperature=0.7, min_p=min_p)

    module, remarks, counters = _run(hf_min_p)
    if min_p <= 1:
        assert counters["min_p_removal_to_sample"] == 1 and not remarks, (remarks, counters)
    else:
        assert not counters["min_p_removal_to_sample"] and counters["sampling_fused_in_part"] == 1, counters
