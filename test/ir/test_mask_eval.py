"""hlofuse.ir.mask_eval: masks from iotas and constants evaluated, and matched exactly against bands."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hlofuse.passes.prepare import inline_private_calls

from hlofuse.ir.mask_eval import Band, band_table, evaluate, fit_band
from hlofuse.testing import clone_module
from hlofuse.testing.modules import main_func

T, S = 6, 9


def _returned(fn):
    """The IR value `fn()` returns, lowered (no arguments: everything is iotas and constants)."""
    module = clone_module(jax.jit(fn).lower().compiler_ir("stablehlo"))
    inline_private_calls(module.operation)  # jnp.tril, cumsum and floor_divide lower through private helpers
    block = main_func(module).regions[0].blocks[0]
    return module, list(block.operations)[-1].operands[0]


WRITINGS = {
    "tril": lambda: jnp.tril(jnp.ones((T, S), bool), 3),
    "iota_compare": lambda: jnp.arange(S)[None, :] <= jnp.arange(T)[:, None] + 3,
    "cumsum_positions": lambda: (jnp.cumsum(jnp.ones(S, jnp.int32)) - 1)[None, :] <= jnp.arange(T)[:, None] + 3,
    "float_positions": lambda: (jnp.arange(S, dtype=jnp.float32)[None, :] - 3.0
                                <= jnp.arange(T, dtype=jnp.float32)[:, None]),
    "floor_divide": lambda: (jnp.arange(S) * 5 // 5)[None, :] <= jnp.arange(T)[:, None] + 3,
    "triu_not": lambda: jnp.logical_not(jnp.triu(jnp.ones((T, S), bool), 4)),
}


@pytest.mark.parametrize("name", WRITINGS)
def test_every_writing_of_a_causal_band_evaluates_to_it(name):
    _module, value = _returned(WRITINGS[name])
    table = evaluate(value)
    assert table is not None
    np.testing.assert_array_equal(table, band_table(T, S, Band(causal=True, q_offset=3)))
    assert fit_band(np.asarray(table)) == Band(causal=True, q_offset=3)


def test_values_that_read_arguments_are_not_constant():
    module = clone_module(jax.jit(lambda x: x[None, :] <= jnp.arange(T)[:, None]).lower(
        jax.ShapeDtypeStruct((S,), jnp.int32)).compiler_ir("stablehlo"))
    value = list(main_func(module).regions[0].blocks[0].operations)[-1].operands[0]
    assert evaluate(value) is None


@pytest.mark.parametrize("t,s", [(1, 7), (5, 5), (4, 11), (9, 3)])
def test_fit_band_recovers_every_band_exactly(t, s):
    offsets, windows = range(-3, s + 2), (-1, 0, 1, 2, 5)
    for causal, left, right, offset in itertools.product((False, True), windows, windows, offsets):
        table = band_table(t, s, Band(causal, left, right, offset))
        band = fit_band(table)
        assert band is not None, (causal, left, right, offset)
        np.testing.assert_array_equal(band_table(t, s, band), table)


def test_chunked_attention_is_not_a_band():
    t = np.arange(8)
    chunked = (t[:, None] // 4 == t[None, :] // 4) & (t[None, :] <= t[:, None])
    assert fit_band(chunked) is None


REDUCTIONS = {
    # Levanter-style guards on a p known when tracing: `lax.cond(jnp.all(p >= 1.0), ...)`, over no dims (a scalar p)
    # or over rows (a p per row given as a constant).
    "all_of_a_scalar": (lambda: jnp.all(jnp.asarray(0.9, jnp.float32) >= 1.0), False),
    "all_of_rows": (lambda: jnp.all(jnp.asarray([0.9, 1.0], jnp.float32) >= 1.0), False),
    "any_of_rows": (lambda: jnp.any(jnp.asarray([0.9, 1.0], jnp.float32) >= 1.0), True),
    "integer_count": (lambda: jnp.sum(jnp.arange(T) < 4), 4),
    "float_max": (lambda: jnp.max(jnp.asarray([0.25, 0.75, 0.5], jnp.float32)), 0.75),
    "rows_of_a_table": (lambda: jnp.all(jnp.tril(jnp.ones((T, S), bool), 3), axis=1), [False] * 5 + [True]),
}


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reductions_of_constants_evaluate(name):
    fn, expected = REDUCTIONS[name]
    _module, value = _returned(fn)
    result = evaluate(value)
    assert result is not None
    np.testing.assert_array_equal(result, np.asarray(expected))


def test_a_float_sum_is_not_evaluated():
    """Its rounding is the order the backend adds in, which the evaluator does not know."""
    _module, value = _returned(lambda: jnp.sum(jnp.asarray([0.1, 0.2, 0.3], jnp.float32)) == 0.6)
    assert evaluate(value) is None
