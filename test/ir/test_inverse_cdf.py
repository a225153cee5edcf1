"""hlofuse.ir.inverse_cdf: a uniform from random bits meeting a cumulative sum is an inverse-CDF draw, whichever way
the search is written; a uniform that becomes noise (through a log) is not one, even beside a cumulative sum."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jaxlib.mlir import ir

from hlofuse.ir.inverse_cdf import cumulative_sum_axis, inverse_cdf_draws, is_uniform_from_bits
from hlofuse.pipeline import run_pipeline
from hlofuse.testing import clone_module
from hlofuse.testing.modules import main_func

B, V = 3, 64


def _main(fn, *shapes, dtype=jnp.float32):
    args = [jax.ShapeDtypeStruct(s, dtype) for s in shapes] + [jax.ShapeDtypeStruct((2,), jnp.uint32)]
    module = clone_module(jax.jit(fn).lower(*args).compiler_ir("stablehlo"))
    run_pipeline(module, "builtin.module(hlofuse-prepare)")
    return module, main_func(module)


def _ops(function, predicate):
    found = []
    function.walk(lambda op: (found.append(op) if predicate(op) else None) or ir.WalkResult.ADVANCE)
    return found


def _choice_rows(x, key):
    """torch.multinomial(softmax(x), 1, replacement=True) under torchax: choice with replacement per row, one key."""
    probs = jax.nn.softmax(x, axis=-1)
    return jnp.stack([jax.random.choice(key, V, (1,), replace=True, p=probs[i]) for i in range(B)])


DRAWS = {
    "choice_with_replacement_per_row": (_choice_rows, "stablehlo.multiply", B - 1),
    "searchsorted_of_a_uniform": (lambda x, key: jax.vmap(lambda row: jnp.searchsorted(
        jnp.cumsum(jax.nn.softmax(row)), jax.random.uniform(key)))(x), "stablehlo.while", 0),
    "count_of_prefixes_below_a_uniform": (lambda x, key: jnp.sum(
        jnp.cumsum(jax.nn.softmax(x), -1) < jax.random.uniform(key, (B, 1)), -1), "stablehlo.compare", 0),
}


@pytest.mark.parametrize("name", DRAWS)
def test_a_uniform_searched_in_a_cumulative_sum_is_one_draw(name):
    fn, meets_at, others = DRAWS[name]
    _, function = _main(fn, (B, V))
    (draw,) = inverse_cdf_draws(function)
    assert draw.op.name == meets_at
    assert is_uniform_from_bits(draw.uniform) and cumulative_sum_axis(draw.cumulative) is not None
    assert draw.others == others


NOT_DRAWS = {
    # Gumbel noise (a log of the uniform) added to logits filtered by a cumulative sum: a categorical draw
    "top_p_filter_then_gumbel": lambda x, key: jax.random.categorical(
        key, jnp.where(jnp.cumsum(jax.nn.softmax(x), -1) > 0.9, -jnp.inf, x)),
    "choice_without_replacement": lambda x, key: jax.random.choice(key, V, (1,), replace=False,
                                                                  p=jax.nn.softmax(x[0])),
    "uniform_noise_on_logits": lambda x, key: jnp.argmax(x + jax.random.uniform(key, x.shape), -1),
    # dropout (a uniform compared with the keep rate) of activations that later meet positions counted by a cumsum
    "dropout_then_cumsum_positions": lambda x, key: jnp.where(jax.random.uniform(key, x.shape) < 0.9, x / 0.9, 0.0)
    + jnp.cumsum(jnp.ones_like(x), -1),
    # the exponential race (probs / Exp(1)): -log1p(-u) is noise too
    "exponential_race_after_a_cumulative_sum": lambda x, key: jnp.argmax(
        jnp.cumsum(jax.nn.softmax(x), -1) / jax.random.exponential(key, x.shape), -1),
}


@pytest.mark.parametrize("name", NOT_DRAWS)
def test_noise_or_no_cumulative_sum_is_no_draw(name):
    _, function = _main(NOT_DRAWS[name], (B, V))
    assert inverse_cdf_draws(function) == []


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_each_float_type_of_a_uniform_is_recognised(dtype):
    _, function = _main(lambda x, key: x + jax.random.uniform(key, x.shape, dtype), (B, V), dtype=dtype)
    assert len(_ops(function, is_uniform_from_bits)) == 1


def test_a_bitcast_of_other_bits_is_not_a_uniform():
    _, function = _main(lambda x, key: x + jax.lax.bitcast_convert_type(key[0] | jnp.uint32(7), jnp.float32), (B,))
    bitcasts = _ops(function, lambda op: op.name == "stablehlo.bitcast_convert")
    assert bitcasts and not any(is_uniform_from_bits(op) for op in bitcasts)


WINDOWS = {
    "cumsum_last": (lambda x, _: jnp.cumsum(x, axis=-1), 1),
    "cumsum_first": (lambda x, _: jnp.cumsum(x, axis=0), 0),
    "cumsum_reversed": (lambda x, _: jnp.cumsum(x[:, ::-1], axis=-1), 1),
    "windowed_sum_of_four": (lambda x, _: jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 4), (1, 1),
                                                                ((0, 0), (3, 0))), None),
    "cumulative_max": (lambda x, _: jax.lax.cummax(x, axis=1), None),
    "windowed_sum_padded_after": (lambda x, _: jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, V), (1, 1),
                                                                     ((0, 0), (0, V - 1))), None),
}


@pytest.mark.parametrize("name", WINDOWS)
def test_only_a_whole_dim_window_padded_before_is_a_cumulative_sum(name):
    fn, axis = WINDOWS[name]
    _, function = _main(fn, (B, V))
    windows = _ops(function, lambda op: op.name == "stablehlo.reduce_window")
    assert len(windows) == 1
    assert cumulative_sum_axis(windows[0]) == axis
