"""Orders: which values list each row's ids in some order, and what a take along such a value reads.

An order is what an argsort gives: an iota along a dim (or its reverse, as `jnp.argsort(x, descending=True)` carries
it) carried through a `stablehlo.sort` along that dim (`jnp.argsort`, `lax.sort_key_val(x, iota)`), reversed along
it or not (`argsort(x)[..., ::-1]`, `flip`). Whatever
the sort compares, its iota comes out a permutation of [0, n) along the dim. Three facts follow, which
hlofuse-prepare uses to make the writings of a take along an order one program:
- its entries lie in [0, n), so the bounds checks a take wraps around its gather (`take_along_axis`'s default `fill`
  mode: negative ids wrapped, out-of-range ones filled) are decided (`index_range`, `decided_compare`);
- a take of one of the sort's own operands along it is that operand's sorted output (`sorted_operand`);
- a take along the ascending argsort of an order puts values back in id order: `sort_key_val(order, values)`
  (`inverse_of`), and so does a scatter that sets each row's values at the order's places (`zeros_like(x).at[rows,
  order].set(values)`, torch's `scatter(1, order, values)` through torchax: every place is set once, whatever the
  array set into held; `scattered_along`).

    %s:2 = stablehlo.sort(%y, %iota) ...        %r = stablehlo.reverse %s#1
    %v = stablehlo.gather(%y, reshape(%r))      -- sorted_operand: stablehlo.reverse %s#0
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse.ir.layout import static_shape
from hlofuse.ir.mask_eval import COMPARISONS, comparison_direction, evaluate, int_list
from hlofuse.ir.match import defining_op, dense_values
from hlofuse.ir.template_match import match_template

# Ops that only move an integer value's entries: its bounds, and whether it reads an order, are its operand's.
_MOVES = ("stablehlo.reshape", "stablehlo.broadcast_in_dim", "stablehlo.slice", "stablehlo.reverse",
          "stablehlo.transpose")


@dataclass(frozen=True)
class Order:
    """A permutation of [0, n) along `dim`: result `result` of `sort` (the iota it carries), `reversed` along dim."""

    sort: ir.Operation
    result: int
    dim: int
    reversed: bool


def _iota_along(value: ir.Value, dim: int) -> bool:
    op = defining_op(value)
    return (op is not None and op.name == "stablehlo.iota"
            and ir.IntegerAttr(op.attributes["iota_dimension"]).value == dim)


def _reversed_along(value: ir.Value, dim: int) -> ir.Value | None:
    """What `value` is a reverse of along `dim` alone, else None."""
    op = defining_op(value)
    if op is None or op.name != "stablehlo.reverse" or int_list(op, "dimensions") != [dim]:
        return None
    return op.operands[0]


def _carried_ids(value: ir.Value, dim: int) -> bool | None:
    """Whether a sort's operand is the ids it carries along `dim`: an iota (False) or one reversed along the dim, as
    `jnp.argsort(x, descending=True)` sorts `rev(x)` with `rev(iota)` (True); None for any other."""
    if _iota_along(value, dim):
        return False
    reversed_ = _reversed_along(value, dim)
    return True if reversed_ is not None and _iota_along(reversed_, dim) else None


def order_of(value: ir.Value) -> Order | None:
    """The order `value` is (a sort's iota along its own dim, reversed along that dim or not), or None."""
    op = defining_op(value)
    reversed_ = False
    if op is not None and op.name == "stablehlo.reverse":
        dims = int_list(op, "dimensions")
        value, op, reversed_ = op.operands[0], defining_op(op.operands[0]), True
        if op is None or op.name != "stablehlo.sort" or dims != [ir.IntegerAttr(op.attributes["dimension"]).value]:
            return None
    if op is None or op.name != "stablehlo.sort":
        return None
    dim = ir.IntegerAttr(op.attributes["dimension"]).value
    result = ir.OpResult(value).result_number
    if _carried_ids(op.operands[result], dim) is None:
        return None
    return Order(op, result, dim, reversed_)


def index_range(value: ir.Value, depth: int = 8) -> tuple[int, int] | None:
    """Bounds [lo, hi] of every entry of an integer `value`: an order's or an iota's [0, n - 1], a constant's, through
    ops that only move entries (reshape, broadcast, slice, reverse, transpose, a widening convert), a select of two
    bounded values, and a sum with a constant. None where it is not known."""
    shape = static_shape(value)
    if shape is None or depth == 0 or not isinstance(ir.RankedTensorType(value.type).element_type, ir.IntegerType):
        return None
    op = defining_op(value)
    if op is None:
        return None
    if op.name == "stablehlo.constant":
        array = dense_values(value)
        return None if array is None or array.size == 0 else (int(np.min(array)), int(np.max(array)))
    if op.name == "stablehlo.iota":
        return 0, shape[ir.IntegerAttr(op.attributes["iota_dimension"]).value] - 1
    if op.name in ("stablehlo.sort", "stablehlo.reverse") and (order := order_of(value)) is not None:
        return 0, static_shape(order.sort.operands[0])[order.dim] - 1
    if op.name in _MOVES or (op.name == "stablehlo.convert" and _widens(op)):
        return index_range(op.operands[0], depth - 1)
    if op.name == "stablehlo.select":
        predicate = dense_values(op.operands[0])
        if predicate is not None and predicate.size and np.all(predicate == predicate.flat[0]):
            return index_range(op.operands[1 if predicate.flat[0] else 2], depth - 1)
        on_true, on_false = (index_range(v, depth - 1) for v in op.operands[1:])
        return None if on_true is None or on_false is None else (min(on_true[0], on_false[0]),
                                                                  max(on_true[1], on_false[1]))
    if op.name == "stablehlo.add":
        a, b = (index_range(v, depth - 1) for v in op.operands)
        if a is None or b is None:
            return None
        lo, hi = a[0] + b[0], a[1] + b[1]
        return (lo, hi) if _fits(lo, hi, ir.RankedTensorType(value.type).element_type) else None
    return None


def reads_an_order(value: ir.Value, depth: int = 8) -> bool:
    """Whether integer `value` is an order's entries, through the ops `index_range` reads through (a take's wrapped
    ids)."""
    op = defining_op(value)
    if op is None or depth == 0 or static_shape(value) is None or not isinstance(
            ir.RankedTensorType(value.type).element_type, ir.IntegerType):
        return False
    if order_of(value) is not None:
        return True
    if op.name in (*_MOVES, "stablehlo.convert", "stablehlo.add", "stablehlo.select"):
        return any(reads_an_order(v, depth - 1) for v in op.operands)
    return False


def _fits(lo: int, hi: int, etype: ir.IntegerType) -> bool:
    """Whether [lo, hi] fits the integer type (no wrap-around in the sum)."""
    etype = ir.IntegerType(etype)
    if etype.is_unsigned:
        return 0 <= lo and hi < (1 << etype.width)
    return -(1 << (etype.width - 1)) <= lo and hi < (1 << (etype.width - 1))


def _widens(op: ir.Operation) -> bool:
    """A convert between integer types that keeps every value of the operand's bounds (checked by the caller's range:
    a narrowing or sign-changing convert is taken only where the bounds fit the result type)."""
    source, target = (ir.RankedTensorType(v.type).element_type for v in (op.operands[0], op.results[0]))
    if not (isinstance(source, ir.IntegerType) and isinstance(target, ir.IntegerType)):
        return False
    bounds = index_range(op.operands[0], 4)
    return bounds is not None and _fits(*bounds, target)


def decided_compare(op: ir.Operation) -> bool | None:
    """The one value an integer `stablehlo.compare` gives everywhere, where its operands' bounds decide it (an order's
    entries against 0 or n - 1: `i < 0`, `i >= 0`, `i <= n - 1`); else None."""
    direction = comparison_direction(op)
    a, b = (index_range(v) for v in op.operands)
    if a is None or b is None or direction not in COMPARISONS:
        return None
    # an ordering of two intervals holds everywhere (or nowhere) exactly when it does at all four pairs of their ends
    at_extremes = {bool(COMPARISONS[direction](x, y)) for x in a for y in b}
    if direction in ("EQ", "NE"):
        if a[0] == a[1] and b[0] == b[1]:
            return at_extremes.pop()
        return direction == "NE" if a[1] < b[0] or b[1] < a[0] else None
    return at_extremes.pop() if len(at_extremes) == 1 else None


def take_along(op: ir.Operation) -> tuple[ir.Value, ir.Value, int] | None:
    """(operand, ids, dim) of a `stablehlo.gather` that is `take_along_axis(operand, ids, axis=dim)`: one entry per
    index, the index (with a trailing unit dim for its vector) naming the place along `dim` and every other dim
    taken as a batch dim of its own place, or (one row: every other dim of size 1, as JAX lowers B = 1) as a slice of
    the gather. None for any other gather."""
    if op.name != "stablehlo.gather":
        return None
    operand, indices = op.operands
    shape, index_shape = static_shape(operand), static_shape(indices)
    if shape is None or index_shape is None or index_shape[-1:] != (1,):
        return None
    numbers = stablehlo.GatherDimensionNumbers(op.attributes["dimension_numbers"])
    rank = len(shape)
    if any(s != 1 for s in int_list(op, "slice_sizes")) or list(numbers.collapsed_slice_dims) != list(
            numbers.start_index_map) or len(numbers.start_index_map) != 1 or numbers.index_vector_dim != len(
            index_shape) - 1:
        return None
    dim = numbers.start_index_map[0]
    others = [d for d in range(rank) if d != dim]
    reshape = defining_op(indices)  # (a reshape of the ids, or a broadcast adding the unit dim as `x[ids]` writes it)
    ids = reshape.operands[0] if reshape is not None and reshape.name == "stablehlo.reshape" else _without_unit_dim(
        indices)
    if ids is None or static_shape(op.results[0]) != static_shape(ids):
        return None
    if list(numbers.operand_batching_dims) == others and list(numbers.start_indices_batching_dims) == others and (
            not list(numbers.offset_dims) and index_shape[:-1] == static_shape(ids)):
        return operand, ids, dim
    # one row (B = 1, or every other dim of size 1): those dims are slices of the gather, not batch dims, and its
    # indices are the row's ids listed
    if not list(numbers.operand_batching_dims) and all(shape[d] == 1 for d in others) and (
            list(numbers.offset_dims) == others and index_shape == (static_shape(ids)[dim], 1)):
        return operand, ids, dim
    return None


def sorted_operand(op: ir.Operation) -> tuple[Order, int] | None:
    """(order, i) where `op` is a take along an order (`take_along`) of the order's sort's operand i (not its iota)
    along the sort's dim: the take is that sort's result i, reversed as the order is. (Where the sort carries its ids
    reversed, `jnp.argsort(x, descending=True)`'s `sort(rev(x), rev(iota))`, operand i is rev(x): the sort keeps each
    id with its own value either way.)"""
    taken = take_along(op)
    if taken is None:
        return None
    operand, ids, dim = taken
    order = order_of(ids)
    if order is None or order.dim != dim:
        return None
    ids_reversed = _carried_ids(order.sort.operands[order.result], dim)
    for i, sorted_in in enumerate(order.sort.operands):
        if i != order.result and (_reversed_along(sorted_in, dim) if ids_reversed else sorted_in) == operand:
            return order, i
    return None


def _ascending_by_first(sort: ir.Operation) -> bool:
    """Whether `sort`'s comparator is `lhs0 < rhs0` of integers alone (jnp.argsort of integers, sort_key_val by
    integer keys)."""
    body = list(sort.regions[0].blocks[0].operations)
    args = list(sort.regions[0].blocks[0].arguments)
    if len(body) != 2 or body[0].operation.name != "stablehlo.compare":
        return False
    compare = body[0].operation
    direction = comparison_direction(compare)
    return (direction == "LT" and list(compare.operands) == [args[0], args[1]]
            and body[1].operation.operands[0] == compare.results[0]
            and isinstance(ir.RankedTensorType(sort.operands[0].type).element_type, ir.IntegerType))


def inverse_of(op: ir.Operation) -> tuple[ir.Value, ir.Value, int] | None:
    """(order, values, dim) where `op` takes `values` along the ascending argsort of an order (`jnp.argsort(order)`,
    the order's inverse permutation) along the order's dim: `values` put back in id order, as
    `sort_key_val(order, values)` puts them."""
    taken = take_along(op)
    if taken is None:
        return None
    values, ids, dim = taken
    inverse = order_of(ids)
    if inverse is None or inverse.reversed or inverse.dim != dim or len(inverse.sort.operands) != 2:
        return None
    keys = inverse.sort.operands[1 - inverse.result]
    order = order_of(keys)
    if order is None or order.dim != dim or inverse.result != 1 or not _ascending_by_first(inverse.sort):
        return None
    if _carried_ids(inverse.sort.operands[1], dim):  # (ids carried reversed: the argsort's ids are not the inverse)
        return None
    return keys, values, dim


def scattered_along(op: ir.Operation) -> tuple[ir.Value, ir.Value, int] | None:
    """(order, values, dim) where the scatter `op` sets `values` (the operand's shape) at the places an order along
    the last dim lists, each row into its own row: its indices give each entry its coordinates, those before the last
    its own (iotas, however wrapped: decided by evaluation) and the last the order's entry; or (as `jax.vmap` writes
    a row's `.at[order].set(values)`) the dims before the last are batch dims and the indices the order's entries
    alone. Every place is set once, so the result is `sort_key_val(order, values)`'s, whatever the scattered-into
    array held. None for any other scatter."""
    if op.name != "stablehlo.scatter" or len(op.operands) != 3 or not sets_its_update(op):
        return None
    _, indices, values = op.operands
    shape, index_shape = static_shape(op.operands[0]), static_shape(indices)
    if shape is None or static_shape(values) != shape:
        return None
    numbers = stablehlo.ScatterDimensionNumbers(op.attributes["scatter_dimension_numbers"])
    if index_shape == (*shape, 1):
        return _scattered_in_batches(numbers, indices, values, len(shape))
    if index_shape != (*shape, len(shape)):
        return None
    every = list(range(len(shape)))
    if (list(numbers.update_window_dims) or list(numbers.inserted_window_dims) != every
            or list(numbers.scattered_dims_to_operand_dims) != every or numbers.index_vector_dim != len(shape)
            or list(numbers.input_batching_dims)):
        return None
    columns = _index_columns(indices, len(shape))
    if columns is None:
        return None
    for dim, column in enumerate(columns[:-1]):
        coordinate = evaluate(column)
        if coordinate is None or not np.array_equal(np.reshape(coordinate, shape),
                                                    np.broadcast_to(np.arange(shape[dim]).reshape(
                                                        [-1 if d == dim else 1 for d in every]), shape)):
            return None
    order = _without_unit_dim(columns[-1])
    found = None if order is None else order_of(order)
    if found is None or found.dim != len(shape) - 1:
        return None
    return order, values, found.dim


def _scattered_in_batches(numbers: stablehlo.ScatterDimensionNumbers, indices: ir.Value, values: ir.Value,
                          rank: int) -> tuple[ir.Value, ir.Value, int] | None:
    """`scattered_along` of a scatter whose dims before the last are batch dims (of the operand and of its (..., 1)
    indices alike) and whose indices place each update along the last dim: (order, values, last dim) where those
    indices are an order's."""
    last, batch = rank - 1, list(range(rank - 1))
    if (list(numbers.update_window_dims) or list(numbers.inserted_window_dims) != [last]
            or list(numbers.scattered_dims_to_operand_dims) != [last] or numbers.index_vector_dim != rank
            or list(numbers.input_batching_dims) != batch or list(numbers.scatter_indices_batching_dims) != batch):
        return None
    order = _without_unit_dim(indices)
    found = None if order is None else order_of(order)
    if found is None or found.dim != last:
        return None
    return order, values, last


def sets_its_update(op: ir.Operation) -> bool:
    """Whether a scatter's body gives back its update (`.at[...].set`)."""
    block = op.regions[0].blocks[0]
    body = list(block.operations)
    return len(body) == 1 and body[0].operation.operands[0] == block.arguments[1]


def _index_columns(indices: ir.Value, rank: int) -> list[ir.Value] | None:
    """The (..., 1) columns of an index array (..., n): the parts of a concatenate of `rank` of them along the last
    dim, or the array itself for a rank-1 operand."""
    if rank == 1:
        return [indices]
    op = defining_op(indices)
    if op is not None and op.name == "stablehlo.concatenate" and len(op.operands) == rank and (
            ir.IntegerAttr(op.attributes["dimension"]).value == rank):
        return list(op.operands)
    return None


def _without_unit_dim(column: ir.Value) -> ir.Value | None:
    """The value a (..., 1) column is a broadcast or reshape of, with that trailing unit dim added, else None."""
    adds = defining_op(column)
    if adds is None or adds.name not in ("stablehlo.broadcast_in_dim", "stablehlo.reshape"):
        return None
    source = adds.operands[0]
    if static_shape(source) != static_shape(column)[:-1]:
        return None
    rank = len(static_shape(source))
    if adds.name == "stablehlo.broadcast_in_dim" and list(ir.DenseI64ArrayAttr(
            adds.attributes["broadcast_dimensions"])) != list(range(rank)):
        return None
    return source


def sort_carrying_its_values(sort: ir.Operation) -> ir.Operation | None:
    """A stable sort that gives `sort`'s sorted values and carries more (an argsort of the same array: `jnp.sort(x)`
    beside `jnp.argsort(x)`), so that `sort` need not run, else None. `sort` is a stable sort of one operand; the other
    sorts the same value along the same dim, stably, first, by a comparator that reads only that operand's pair and
    computes what `sort`'s does (op for op). A stable sort's permutation is fixed by its comparator alone, so the two
    put the same entries (a -0 and a +0 that compare equal, NaNs of any payload) in the same places. The other sort
    comes first in the block, or is the earliest after `sort` (hlofuse-prepare moves it up: `hoisted_before`)."""
    sort = sort.operation
    if sort.name != "stablehlo.sort" or len(sort.operands) != 1 or not _stable(sort):
        return None
    operand, dim = sort.operands[0], ir.IntegerAttr(sort.attributes["dimension"]).value
    for use in operand.uses:
        other = use.owner.operation
        if (other == sort or other.name != "stablehlo.sort" or len(other.operands) < 2 or other.operands[0] != operand
                or use.operand_number != 0 or other.block != sort.block or not _stable(other)
                or ir.IntegerAttr(other.attributes["dimension"]).value != dim):
            continue
        if _same_comparator(sort, other):
            return other
    return None


def _stable(sort: ir.Operation) -> bool:
    return "is_stable" in sort.attributes and ir.BoolAttr(sort.attributes["is_stable"]).value


def _same_comparator(sort: ir.Operation, other: ir.Operation) -> bool:
    """Whether `other`'s comparator computes `sort`'s (one operand) from its first operand's pair alone."""
    mine, theirs = (s.regions[0].blocks[0] for s in (sort, other))
    returned = [list(block.operations)[-1].operation.operands[0] for block in (mine, theirs)]
    found = match_template(returned[1], returned[0], list(mine.arguments), {})
    return found is not None and found.leaves == {0: theirs.arguments[0], 1: theirs.arguments[1]}


def hoisted_before(op: ir.Operation, before: ir.Operation, depth: int = 3) -> bool:
    """Moves `op` (and the ops of its operands defined after `before` in its block, which must read nothing else
    defined there: an argsort's iota, its reverse) up to just before `before`; False (moving nothing) where it
    cannot."""
    op, before = op.operation, before.operation
    if op.block != before.block or op.is_before_in_block(before):
        return True
    movable = []

    def gather(current: ir.Operation, level: int) -> bool:
        for value in current.operands:
            defining = defining_op(value)
            defining = None if defining is None else defining.operation
            if defining is None or defining.block != before.block or defining.is_before_in_block(before):
                continue
            if level == 0 or defining.regions or not gather(defining, level - 1):
                return False
            if defining not in movable:
                movable.append(defining)
        return True

    if not gather(op, depth):
        return False
    for defining in [*movable, op]:  # operands first: each lands after what it reads
        defining.move_before(before)
    return True
