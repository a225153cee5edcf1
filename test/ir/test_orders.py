"""hlofuse.ir.orders and the normal forms of hlofuse-prepare built on it: an argsort's ids are a permutation, so a
take along them is decided, read as the sort's values, or put back by a sort_key_val (as a scatter of the rows to
its places is); a shift by one is a pad
however it is written. Every writing of the classic top-p's parts prepares to one program, and preparing changes no
result."""

from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hlofuse.passes.prepare import (
    broadcast_before_reverses_and_iotas,
    fold_decided_index_checks,
    inline_private_calls,
    sort_values_once,
)
from jaxlib.mlir import ir

from hlofuse.ir.orders import (
    decided_compare,
    index_range,
    inverse_of,
    order_of,
    scattered_along,
    sort_carrying_its_values,
    sorted_operand,
    take_along,
)
from hlofuse.pipeline import run_pipeline
from hlofuse.testing import clone_module
from hlofuse.testing.modules import main_func

# the classic top-p's writings as the sampling generator (test/python/sampling_programs.py) writes them
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from sampling_programs import jax_classic_removal, jax_put_back  # noqa: E402

ROWS = jax.ShapeDtypeStruct((2, 8), jnp.float32)


def _ops(fn, *args) -> tuple[ir.Module, list[ir.Operation]]:  # noqa: ANN001
    """fn lowered with its helpers inlined and its takes' bounds checks folded (hlofuse-prepare's first steps), and
    the ops of its main function in order."""
    module = clone_module(jax.jit(fn).lower(*(args or (ROWS,))).compiler_ir("stablehlo"))
    inline_private_calls(module.operation)
    broadcast_before_reverses_and_iotas(module.operation)
    fold_decided_index_checks(module.operation)
    return module, [op.operation for op in main_func(module).regions[0].blocks[0].operations]


def _named(ops: list[ir.Operation], name: str) -> list[ir.Operation]:
    return [op for op in ops if op.name == name]


def _returned(ops: list[ir.Operation]) -> ir.Value:
    return ops[-1].operands[0]


@pytest.mark.parametrize(("writing", "reversed_"), [
    (lambda x: jnp.argsort(x, axis=-1), False),
    (lambda x: jnp.argsort(x, axis=-1)[:, ::-1], True),
    (lambda x: jnp.flip(jnp.argsort(x, axis=-1), axis=-1), True),
    (lambda x: jax.lax.sort_key_val(x, jax.lax.broadcasted_iota(jnp.int32, x.shape, 1), dimension=1)[1], False),
    (lambda x: jnp.argsort(x, axis=-1, descending=True), True),  # (sort(rev(x), rev(iota)), then reversed)
])
def test_an_argsorts_ids_are_an_order(writing, reversed_: bool) -> None:  # noqa: ANN001
    _, ops = _ops(writing)
    order = order_of(_returned(ops))
    assert order is not None and order.reversed == reversed_ and order.dim == 1
    assert index_range(_returned(ops)) == (0, 7)


@pytest.mark.parametrize("writing", [
    lambda x: jnp.sort(x, axis=-1),  # the sorted values, not the ids
    lambda x: jnp.argsort(x, axis=0),  # ids along another dim than the iota is taken along (rows: 0..1)
    lambda x: jnp.argsort(x, axis=-1)[:, ::-1][::-1],  # reversed along the rows too
])
def test_no_other_value_is_an_order(writing) -> None:  # noqa: ANN001
    _, ops = _ops(writing)
    order = order_of(_returned(ops))
    assert order is None or order.dim != 1


def _compare(direction: str, bound: int):  # noqa: ANN202
    def fn(x):  # noqa: ANN001, ANN202
        ids = jnp.argsort(x, axis=-1)
        return {"LT": ids < bound, "GE": ids >= bound, "LE": ids <= bound, "EQ": ids == bound,
                "NE": ids != bound}[direction]
    return fn


@pytest.mark.parametrize(("direction", "bound", "decided"), [
    ("LT", 0, False), ("GE", 0, True), ("LE", 7, True), ("LT", 8, True), ("NE", -1, True), ("EQ", 9, False),
    ("LT", 7, None), ("GE", 1, None), ("EQ", 3, None), ("NE", 0, None),
])
def test_a_compare_of_an_argsorts_ids_is_decided_by_their_bounds(direction: str, bound: int,
                                                                  decided: bool | None) -> None:
    module = clone_module(jax.jit(_compare(direction, bound)).lower(ROWS).compiler_ir("stablehlo"))
    inline_private_calls(module.operation)
    compares = [op.operation for op in main_func(module).regions[0].blocks[0].operations
                if op.operation.name == "stablehlo.compare"]
    assert [decided_compare(op) for op in compares] == [decided]


@pytest.mark.parametrize("mode", [None, "clip", "fill", "promise_in_bounds"])
@pytest.mark.parametrize("descending", [False, True])
def test_a_take_along_an_argsort_of_its_operand_is_the_sorts_values(mode: str | None, descending: bool) -> None:
    def order(x):  # noqa: ANN001, ANN202
        return jnp.argsort(x, axis=-1, descending=True) if descending else jnp.argsort(x, axis=-1)[:, ::-1]

    _, ops = _ops(lambda x: jnp.take_along_axis(x, order(x), axis=-1, mode=mode))
    (gather,) = _named(ops, "stablehlo.gather")
    assert take_along(gather) is not None
    found = sorted_operand(gather)
    assert found is not None and found[1] == 0 and found[0].reversed


@pytest.mark.parametrize("descending", [False, True])
def test_reading_a_take_along_an_argsort_as_the_sorts_values_changes_no_result(descending: bool) -> None:
    def fn(x):  # noqa: ANN001, ANN202
        order = jnp.argsort(x, axis=-1, descending=descending)
        return jnp.take_along_axis(x, order, axis=-1), order

    prepared = jax.jit(fn, compiler_options={"hlofuse_pipeline": "builtin.module(hlofuse-prepare)",
                                             "hlofuse_strict": True})
    assert "stablehlo.gather" not in _prepared_text(lambda x: fn(x)[0])
    x = np.array([[0.0, -0.0, 1.0, np.nan, 1.0, -np.inf, 0.0, -0.0]] * 2, np.float32)
    for got, want in zip(prepared(x), jax.jit(fn)(x), strict=True):
        np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8))


@pytest.mark.parametrize("shape", [(1, 8), (1, 1, 8), (8,)])
def test_a_take_along_one_rows_argsort_is_the_sorts_values(shape: tuple[int, ...]) -> None:
    """One row (B = 1): JAX lowers the take as a gather whose unit dims are slices, not batch dims."""
    _, ops = _ops(lambda x: jnp.take_along_axis(x, jnp.argsort(x, axis=-1)[..., ::-1], axis=-1),
                  jax.ShapeDtypeStruct(shape, jnp.float32))
    (gather,) = _named(ops, "stablehlo.gather")
    assert take_along(gather) is not None and _named(ops, "stablehlo.select") == []
    found = sorted_operand(gather)
    assert found is not None and found[0].reversed


def test_a_row_indexed_by_its_argsort_is_the_sorts_values() -> None:
    """One row (V,) indexed by its order, `y[argsort(y)[::-1]]`: JAX's gather reads ids broadcast to (V, 1), not
    reshaped; the same take along the order."""
    _, ops = _ops(lambda y: y[jnp.argsort(y)[::-1]], jax.ShapeDtypeStruct((8,), jnp.float32))
    (gather,) = _named(ops, "stablehlo.gather")
    assert take_along(gather) is not None
    found = sorted_operand(gather)
    assert found is not None and found[0].reversed


def test_a_take_of_another_array_is_no_sorts_values() -> None:
    _, ops = _ops(lambda x, y: jnp.take_along_axis(y, jnp.argsort(x, axis=-1), axis=-1), ROWS, ROWS)
    (gather,) = _named(ops, "stablehlo.gather")
    assert take_along(gather) is not None and sorted_operand(gather) is None


def test_a_take_along_the_argsort_of_an_order_is_its_inverse() -> None:
    def put_back(x):  # noqa: ANN001, ANN202
        order = jnp.argsort(x, axis=-1)[:, ::-1]
        return jnp.take_along_axis(x * 2, jnp.argsort(order, axis=-1), axis=-1)

    _, ops = _ops(put_back)
    (gather,) = _named(ops, "stablehlo.gather")
    found = inverse_of(gather)
    assert found is not None and order_of(found[0]) is not None


@pytest.mark.parametrize("writing", [
    lambda x: jnp.take_along_axis(x * 2, jnp.argsort(jnp.argsort(x, axis=-1), axis=-1, descending=True), axis=-1),
    lambda x: jnp.take_along_axis(x * 2, jnp.argsort(jnp.round(x).astype(jnp.int32), axis=-1), axis=-1),
    lambda x: jnp.take(x, jnp.argsort(jnp.argsort(x, axis=-1), axis=-1), axis=0),
])
def test_no_other_take_is_a_put_back(writing) -> None:  # noqa: ANN001
    """A descending argsort of an order, the argsort of integers that are no order, a take along another dim."""
    _, ops = _ops(writing)
    assert all(inverse_of(op) is None for op in _named(ops, "stablehlo.gather"))


@pytest.mark.parametrize("writing", [
    lambda x: jnp.zeros_like(x).at[jnp.arange(2)[:, None], jnp.argsort(x, axis=-1)[:, ::-1]].set(x * 2),
    lambda x: jnp.full_like(x[0], -jnp.inf).at[jnp.argsort(x[0])[::-1]].set(x[1]),
    lambda x: jnp.zeros_like(x).at[jnp.arange(2)[:, None], jnp.argsort(x, axis=-1)].set(x * 2, mode="drop"),
    # a row's `.at[order].set` under jax.vmap: the rows are the scatter's batch dims
    jax.vmap(lambda r: jnp.zeros_like(r).at[jnp.argsort(r, descending=True)].set(r * 2)),
])
def test_a_scatter_of_the_rows_to_an_orders_places_is_a_put_back(writing) -> None:  # noqa: ANN001
    _, ops = _ops(writing)
    (scatter,) = _named(ops, "stablehlo.scatter")
    found = scattered_along(scatter)
    assert found is not None and order_of(found[0]) is not None


@pytest.mark.parametrize("writing", [
    # each row's values into the other row
    lambda x: jnp.zeros_like(x).at[jnp.arange(2)[::-1, None], jnp.argsort(x, axis=-1)].set(x * 2),
    # an add, not a set
    lambda x: jnp.zeros_like(x).at[jnp.arange(2)[:, None], jnp.argsort(x, axis=-1)].add(x * 2),
    # fewer values than places (the top 4 only): the other places keep what they held
    lambda x: jnp.zeros_like(x).at[jnp.arange(2)[:, None], jnp.argsort(x, axis=-1)[:, :4]].set(x[:, :4]),
    # places from no order
    lambda x: jnp.zeros_like(x).at[jnp.arange(2)[:, None], jnp.round(x).astype(jnp.int32) % 8].set(x * 2),
    # under jax.vmap: an add, and places from no order
    jax.vmap(lambda r: jnp.zeros_like(r).at[jnp.argsort(r)].add(r * 2)),
    jax.vmap(lambda r: jnp.zeros_like(r).at[jnp.round(r).astype(jnp.int32) % 8].set(r * 2)),
])
def test_no_other_scatter_is_a_put_back(writing) -> None:  # noqa: ANN001
    _, ops = _ops(writing)
    assert all(scattered_along(op) is None for op in _named(ops, "stablehlo.scatter"))


@pytest.mark.parametrize("writing", [
    lambda x: (jnp.sort(x, axis=-1), jnp.argsort(x, axis=-1)),
    lambda x: (jnp.argsort(x, axis=-1), jnp.sort(x, axis=-1)[:, ::-1]),
    lambda x: (jnp.sort(x, axis=-1), jax.lax.sort_key_val(x, jax.lax.broadcasted_iota(jnp.int32, x.shape, 1))[1]),
], ids=["sort_then_argsort", "argsort_then_sort", "sort_key_val"])
def test_a_sort_beside_an_argsort_of_its_array_is_sorted_once(writing) -> None:  # noqa: ANN001
    module, ops = _ops(writing)
    value_sort = next(op for op in _named(ops, "stablehlo.sort") if len(op.operands) == 1)
    assert sort_carrying_its_values(value_sort) is not None
    assert sort_values_once(module.operation) == 1
    ops = [op.operation for op in main_func(module).regions[0].blocks[0].operations]
    assert len(_named(ops, "stablehlo.sort")) == 1
    assert module.operation.verify()


@pytest.mark.parametrize("writing", [
    lambda x: (jnp.sort(x, axis=-1, stable=False), jnp.argsort(x, axis=-1)),  # which equal entry lands where: XLA's
    lambda x: (jnp.sort(x, axis=-1), jnp.argsort(x, axis=-1, stable=False)),
    lambda x: (jnp.sort(x, axis=0), jnp.argsort(x, axis=-1)),  # another dim
    lambda x: (jnp.sort(x, axis=-1), jnp.argsort(x * 2, axis=-1)),  # another array
    lambda x: (jnp.sort(x, axis=-1), jnp.argsort(x, axis=-1, descending=True)),  # sorts rev(x): ties the other way
    lambda x: (jnp.sort(x, axis=-1), jax.lax.sort(  # a comparator that reads the ids too
        (x, jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)), num_keys=2)[1]),
    lambda x: (jnp.sort(x, axis=-1), jax.lax.sort(  # another comparator: by the integer bits
        (jax.lax.bitcast_convert_type(x, jnp.int32), jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)))[1]),
], ids=["unstable_values", "unstable_ids", "other_dim", "other_array", "descending", "two_keys", "other_keys"])
def test_no_other_sort_gives_a_sorts_values(writing) -> None:  # noqa: ANN001
    module, ops = _ops(writing)
    value_sort = next(op for op in _named(ops, "stablehlo.sort") if len(op.operands) == 1)
    assert sort_carrying_its_values(value_sort) is None
    assert sort_values_once(module.operation) == 0


# --- the normal forms: every writing of the classic top-p's parts prepares to one program --------------------------


WRITINGS = list(itertools.product(["slice", "flip", "sort"], ["roll", "concatenate", "pad"],
                                  ["take", "sort_key_val", "scatter"]))


def _classic_top_p(writing: tuple[str, str, str]):  # noqa: ANN202
    order_how, shift_how, back_how = writing

    def fn(x):  # noqa: ANN001, ANN202
        remove, _, order = jax_classic_removal(x, 0.6, order_how, shift_how)
        return jnp.where(jax_put_back(order, remove, back_how), -jnp.inf, x)

    return fn


def _prepared_text(fn) -> str:  # noqa: ANN001
    module = clone_module(jax.jit(fn).lower(ROWS).compiler_ir("stablehlo"))
    run_pipeline(module, "builtin.module(hlofuse-prepare)")
    text = re.sub(r"module @\S+", "module", re.sub(r"loc\([^)]*\)", "", str(module)))
    # (canonicalize lists the constants as the program first reads them: their order is no part of the program)
    lines = text.splitlines()
    constants = sorted(line for line in lines if "stablehlo.constant" in line)
    return "\n".join([*constants, *(line for line in lines if "stablehlo.constant" not in line)])


def test_every_writing_of_the_classic_top_p_prepares_to_one_program() -> None:
    texts = {writing: _prepared_text(_classic_top_p(writing)) for writing in WRITINGS}
    assert len(set(texts.values())) == 1
    for absent in ("stablehlo.gather", "stablehlo.concatenate", "stablehlo.scatter"):
        assert absent not in texts[WRITINGS[0]]


@pytest.mark.parametrize("writing", WRITINGS[::3], ids=lambda w: "-".join(w))
def test_preparing_the_classic_top_p_changes_no_result(writing: tuple[str, str, str]) -> None:
    fn = _classic_top_p(writing)
    prepared = jax.jit(fn, compiler_options={"hlofuse_pipeline": "builtin.module(hlofuse-prepare)",
                                             "hlofuse_strict": True})
    rng = np.random.default_rng(7)
    for trial in range(6):
        x = rng.standard_normal((2, 8)).astype(np.float32) * (1 + trial)
        if trial % 2:
            x = np.round(x)  # ties, whose order the argsort decides
        np.testing.assert_array_equal(np.asarray(prepared(x)), np.asarray(jax.jit(fn)(x)))


def test_a_take_along_an_ascending_sort_carrying_reversed_ids_is_no_put_back() -> None:
    """sort(order, rev(iota)) lists rev(iota)'s entries, not the order's inverse: taking along it puts nothing back."""
    def fn(x):  # noqa: ANN001, ANN202
        order = jnp.argsort(x, axis=-1)
        reversed_ids = jnp.flip(jax.lax.broadcasted_iota(jnp.int32, order.shape, 1), axis=-1)
        carried = jax.lax.sort_key_val(order, reversed_ids, dimension=-1)[1]
        return jnp.take_along_axis(x * 2, carried, axis=-1)

    _, ops = _ops(fn)
    (gather,) = _named(ops, "stablehlo.gather")
    assert inverse_of(gather) is None
