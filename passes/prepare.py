"""hlofuse-prepare: one normal form to match.

Matches: `func.call`s of private, single-block functions (JAX outlines helpers such as `@_where` and
`@tril`, which the upstream `inline` pass leaves in place), and `stablehlo.case`s whose index is a constant
(`lax.cond` on a Python-level flag, as libraries guard each logits warper, or on an `all` of a compare of
constants, as Levanter skips its top-p at `jnp.all(p >= 1.0)`: canonicalize does not fold them), and
`stablehlo.while` operands that start as a constant and that the body gives back unchanged (a decode loop's
closed-over `jnp.array(temperature)`).
Emits: the callee's body inlined at each call site, such a loop operand's uses reading the constant itself, the
taken branch inlined in place of its case, unreferenced
private functions erased, identity converts (`convert` to its own type, as JAX writes a weak-typed Python
scalar: `where(m, x, 0.0)`) dropped, integer scalar arithmetic on constants folded (an index normalised at a
constant, `select(i < 0, i + n, i)`), a float scalar maximum or minimum of constants folded to the one it picks
(a temperature bounded below, `x / jnp.maximum(T, 1e-4)`), a broadcast of a broadcast made one, and a broadcast of a
reverse or an iota made the reverse or the iota of the broadcast (`jax.vmap` of a row's code writes a splat, and its
argsort's reversed ids, for the row and then for the batch: read as the batched code writes them), a broadcast of a
reshape that only drops or adds unit dims made a broadcast of the reshape's operand (`v[..., -1]` read as
`v[..., -1:]`); then the normal forms of takes
along an argsort's ids (hlofuse.ir.orders: such ids lie in [0, n), so the bounds checks `take_along_axis` wraps around
its gather fold away; a take of the sort's own operand is the sort's output, reversed as the ids are; a take along the
ascending argsort of such ids is `lax.sort_key_val(ids, values)`; a stable sort of a row beside a stable argsort of it
is the argsort's sorted values, so the row is sorted once), and of a shift by one (a scatter setting exactly one
part of a concatenate, `jnp.roll(m, 1).at[:, 0].set(False)`, sets that part; a two-part concatenate of a splat
constant and a value is a pad, as `jnp.pad` writes it; a slice of a pad is the pad of the kept slice); masks moved
next to their array (a slice of a bool mask of one array and splats is the mask of the array's slice, as code that
slices first writes it: `c[:, :-1] > p`; such a mask of a pad is the pad of the mask; `convert(m) != 0` is m); and a
one-wide slice of a reversed float row made the row's column at the mirrored place (`jnp.sort(x)[:, ::-1][:, k - 1]`
read as `jnp.sort(x)[:, -k]`); then `canonicalize` and `cse`.

    %m = call @tril(%c) : (tensor<16x16xi1>) -> tensor<16x16xi1>
  becomes
    %0 = stablehlo.iota dim = 0 : tensor<16x16xi32>  ...  %m = stablehlo.select %4, %c, %5 ...
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from jax._src.lib import jax_mlir_ext
from jaxlib.mlir import ir, passmanager
from jaxlib.mlir.dialects import stablehlo

from hlofuse.ir.layout import static_shape
from hlofuse.ir.mask_eval import comparison_direction, evaluate, int_list
from hlofuse.ir.match import defining_op
from hlofuse.ir.orders import (
    decided_compare,
    hoisted_before,
    inverse_of,
    reads_an_order,
    scattered_along,
    sets_its_update,
    sort_carrying_its_values,
    sorted_operand,
)
from hlofuse.pipeline import ModulePass, PassState

# Ops an index may be computed through that compute no float: a float index term is decided only by comparing
# constants (exact), never by arithmetic the evaluator would round otherwise than the program.
_FLOAT_EXACT = ("stablehlo.constant", "stablehlo.broadcast_in_dim", "stablehlo.reshape")


def _symbol(op: ir.Operation) -> str:
    return ir.StringAttr(op.attributes["sym_name"]).value


def _private_single_block_funcs(module: ir.Operation) -> dict[str, ir.Operation]:
    funcs = {}
    for op in module.regions[0].blocks[0].operations:
        operation = op.operation
        if operation.name != "func.func" or "sym_visibility" not in operation.attributes:
            continue
        if ir.StringAttr(operation.attributes["sym_visibility"]).value != "private":
            continue
        blocks = list(operation.regions[0].blocks)
        if len(blocks) == 1:
            funcs[_symbol(operation)] = operation
    return funcs


def _calls_to(module: ir.Operation, callees: dict[str, ir.Operation]) -> list[ir.Operation]:
    calls: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "func.call":
            callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
            if callee in callees:
                calls.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return calls


_SYMBOL_USERS = ("stablehlo.composite", "stablehlo.custom_call")


def _referenced_symbols(module: ir.Operation) -> set[str]:
    used: set[str] = set()

    def visit(op: ir.Operation) -> ir.WalkResult:
        name = op.name
        # Plain StableHLO ops never name a symbol; skipping them keeps this walk cheap on big modules.
        if name.startswith("stablehlo.") and name not in _SYMBOL_USERS:
            return ir.WalkResult.ADVANCE
        attributes = op.attributes
        for index in range(len(attributes)):
            attr = attributes[index].attr
            if isinstance(attr, ir.FlatSymbolRefAttr):
                used.add(attr.value)
            elif isinstance(attr, ir.ArrayAttr):
                used.update(a.value for a in attr if isinstance(a, ir.FlatSymbolRefAttr))
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return used


def inline_private_calls(module: ir.Operation) -> int:
    """Inlines calls to private single-block funcs until none is left; returns how many it inlined."""
    inlined = 0
    while True:
        callees = _private_single_block_funcs(module)
        calls = _calls_to(module, callees)
        if not calls:
            break
        for call in calls:
            callee = callees[ir.FlatSymbolRefAttr(call.attributes["callee"]).value]
            with call.location, ir.InsertionPoint(call):
                results = jax_mlir_ext.inlined_func_call(callee, list(call.operands), call.location)
            for old, new in zip(call.results, results, strict=True):
                old.replace_all_uses_with(new)
            call.erase()
            inlined += 1
    erase_unreferenced_private_funcs(module)
    return inlined


def erase_unreferenced_private_funcs(module: ir.Operation) -> None:
    """Erases private funcs nothing refers to (callers, composites), until none is left."""
    while True:
        used = _referenced_symbols(module)
        dead = [op for name, op in _private_single_block_funcs(module).items() if name not in used]
        if not dead:
            return
        for op in dead:
            op.erase()


def _index_term_has(value: ir.Value, found: Callable[[ir.Operation], bool], limit: int = 64) -> bool:
    """Whether an op of the index term `value` is `found` (or the term is too long to tell)."""
    stack, seen = [value], 0
    while stack:
        op = defining_op(stack.pop())
        seen += 1
        if op is None or seen > limit:
            return seen > limit
        if found(op):
            return True
        stack.extend(op.operands)
    return False


def _rounds_a_float(op: ir.Operation) -> bool:
    """Whether `op` computes a float otherwise than by moving constants (_FLOAT_EXACT)."""
    floats = any(isinstance(ir.RankedTensorType(r.type).element_type, ir.FloatType) for r in op.results)
    return floats and op.name not in _FLOAT_EXACT


def _reduces_rows(op: ir.Operation) -> bool:
    """Whether `op` reduces a vector (`jnp.any(k > 0)` over a batch's k per row, a batch of one too). A guard on one is
    left: its rows are a sampler's per-row parameters, which a template takes as operands, so folding it where a
    program gives them as constants would hide the sampler from its form. (A reduce over no dims, of a 0-d value, is
    no such guard: Levanter's `jnp.all(p >= 1.0)` of its one p.)"""
    return op.name == "stablehlo.reduce" and ir.RankedTensorType(op.operands[0].type).rank > 0


def constant_branch(case: ir.Operation) -> int | None:
    """The branch a `stablehlo.case` takes when its index is a constant term (out of range: the last, as
    StableHLO says), or None. Not where the index reduces a vector of rows (`_reduces_rows`)."""
    index = case.operands[0]
    if _index_term_has(index, _rounds_a_float) or _index_term_has(index, _reduces_rows):
        return None
    value = evaluate(index)
    if value is None or value.size != 1:
        return None
    taken = int(value.reshape(()))
    return taken if 0 <= taken < len(case.regions) else len(case.regions) - 1


def fold_constant_cases(module: ir.Operation) -> int:
    """Inlines the taken branch of every `stablehlo.case` with a constant index, until none is left; returns how
    many it folded."""
    folded = 0
    while True:
        cases: list[tuple[ir.Operation, int]] = []

        def visit(op: ir.Operation, cases: list[tuple[ir.Operation, int]] = cases) -> ir.WalkResult:
            if op.name == "stablehlo.case" and (taken := constant_branch(op)) is not None:
                cases.append((op, taken))
                return ir.WalkResult.SKIP
            return ir.WalkResult.ADVANCE

        module.walk(visit)
        if not cases:
            return folded
        for case, taken in cases:
            block = case.regions[taken].blocks[0]
            *body, terminator = list(block.operations)
            for op in body:
                op.move_before(case)
            for old, new in zip(case.results, terminator.operands, strict=True):
                old.replace_all_uses_with(new)
            case.erase()
            folded += 1


def _has_uses(value: ir.Value) -> bool:
    return next(iter(value.uses), None) is not None


def fold_invariant_constant_carries(module: ir.Operation) -> int:
    """In each `stablehlo.while`, a carried value that starts as a constant and that the body gives back unchanged
    is that constant in every iteration: JAX carries the arrays a loop body closes over as loop operands (a decode
    loop's `jnp.array(temperature)`, t5x's and Flax's samplers), where the matchers see a block argument, not the
    temperature. Its uses in the condition and the body take a clone of the constant, and the loop's result the
    constant itself; repeated until none is left, so that a loop nested in another follows. Returns how many."""
    folded = 0
    while True:
        loops: list[ir.Operation] = []

        def visit(op: ir.Operation, loops: list[ir.Operation] = loops) -> ir.WalkResult:
            if op.name == "stablehlo.while":
                loops.append(op)
            return ir.WalkResult.ADVANCE

        module.walk(visit)
        before = folded
        for loop in loops:
            cond, body = (region.blocks[0] for region in loop.regions)
            returned = list(body.operations)[-1].operands
            for i, initial in enumerate(loop.operands):
                constant = defining_op(initial)
                if constant is None or constant.name != "stablehlo.constant" or returned[i] != body.arguments[i]:
                    continue
                read_in_body = len(list(body.arguments[i].uses)) > 1  # (one use is the return giving it back)
                if not (read_in_body or _has_uses(cond.arguments[i]) or _has_uses(loop.results[i])):
                    continue
                for block in (cond, body):
                    if _has_uses(block.arguments[i]):
                        with ir.InsertionPoint.at_block_begin(block):
                            block.arguments[i].replace_all_uses_with(constant.clone().results[0])
                loop.results[i].replace_all_uses_with(initial)
                folded += 1
        if folded == before:
            return folded


def erase_identity_converts(module: ir.Operation) -> int:
    """Replaces every `stablehlo.convert` whose result has its operand's type by its operand; returns how many."""
    converts: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "stablehlo.convert" and op.operands[0].type == op.results[0].type:
            converts.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    for op in converts:
        op.results[0].replace_all_uses_with(op.operands[0])
        op.erase()
    return len(converts)


# Integer scalar ops folded when every operand is a constant: exact in numpy as in XLA (two's complement), and
# what JAX leaves of an index it normalises (`select(i < 0, i + n, i)`) or a library computes under a cond
# (EasyDeL's `maximum(0, k - 1)`), which canonicalize does not fold.
_INTEGER_FOLDS = ("stablehlo.add", "stablehlo.subtract", "stablehlo.multiply", "stablehlo.maximum",
                  "stablehlo.minimum", "stablehlo.compare", "stablehlo.select", "stablehlo.convert")


def _rank_0(value: ir.Value) -> ir.RankedTensorType | None:
    return value.type if isinstance(value.type, ir.RankedTensorType) and value.type.rank == 0 else None


def _integer_scalar(value: ir.Value) -> bool:
    return (t := _rank_0(value)) is not None and isinstance(t.element_type, ir.IntegerType)


def fold_integer_scalars(module: ir.Operation) -> int:
    """Replaces each 0-d integer result of an op of _INTEGER_FOLDS whose operands are all constants (after the
    folds before it) by its constant; returns how many. A read at a constant index then reads as one."""
    candidates: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name in _INTEGER_FOLDS and len(op.results) == 1 and _integer_scalar(op.results[0]) and all(
                _integer_scalar(v) for v in op.operands):
            candidates.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    folded = 0
    for op in candidates:  # in program order: an op's operands are folded before it
        if not all((d := defining_op(v)) is not None and d.name == "stablehlo.constant" for v in op.operands):
            continue
        value = evaluate(op.results[0])
        if value is None:
            continue
        result_type = ir.RankedTensorType(op.results[0].type)
        attr = ir.IntegerAttr.get(result_type.element_type, int(value.reshape(())))
        with ir.InsertionPoint(op), op.location:
            constant = stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(result_type, attr))
        op.results[0].replace_all_uses_with(constant.result)
        folded += 1
    return folded


def _float_scalar_constant(value: ir.Value) -> float | None:
    """The number a 0-d float constant holds, or None."""
    op = defining_op(value)
    if op is None or op.name != "stablehlo.constant" or (t := _rank_0(value)) is None:
        return None
    if not isinstance(t.element_type, ir.FloatType):
        return None
    return float(ir.FloatAttr(ir.DenseElementsAttr(op.attributes["value"]).get_splat_value()).value)


def fold_float_scalar_extrema(module: ir.Operation) -> int:
    """Replaces each 0-d float maximum or minimum of two constants by the operand it picks (exact: no rounding), as
    a library bounds a Python temperature (axlearn's `logits / jnp.maximum(T, 1e-4)`), which canonicalize does not
    fold; returns how many. Not a NaN, nor two zeros (which of -0 and +0 the op picks is the backend's)."""
    candidates: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name in ("stablehlo.maximum", "stablehlo.minimum") and _rank_0(op.results[0]) is not None:
            candidates.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    folded = 0
    for op in candidates:
        a, b = (_float_scalar_constant(v) for v in op.operands)
        if a is None or b is None or a != a or b != b or a == b == 0.0:
            continue
        picks_a = (a >= b) == (op.name == "stablehlo.maximum")
        op.results[0].replace_all_uses_with(op.operands[0] if picks_a else op.operands[1])
        op.erase()
        folded += 1
    return folded


_EXACT_FLOAT_ARITHMETIC = {"stablehlo.add": np.add, "stablehlo.subtract": np.subtract,
                           "stablehlo.multiply": np.multiply}


def _f32_splat(value: ir.Value) -> np.float32 | None:
    """The number an f32 splat holds: a splat constant, or a broadcast of one; else None."""
    element = _splat_element(value)
    if element is None or not isinstance(ir.RankedTensorType(value.type).element_type, ir.F32Type):
        return None
    return np.float32(ir.FloatAttr(element).value)


def _splat_element(value: ir.Value) -> ir.Attribute | None:
    """The element a splat constant, or a broadcast of one, holds everywhere; else None."""
    op = defining_op(value)
    if op is not None and op.name == "stablehlo.broadcast_in_dim":
        op = defining_op(op.operands[0])
    if op is None or op.name != "stablehlo.constant" or not isinstance(value.type, ir.RankedTensorType):
        return None
    attr = _dense(op)
    return attr.get_splat_value() if attr is not None and attr.is_splat else None


def fold_f32_splat_arithmetic(module: ir.Operation) -> int:
    """Replaces each f32 add, subtract or multiply of two splats of constants by a broadcast of its constant, as a
    library moves a Python threshold by a tolerance in jnp (Levanter's top-p: `clip(p, 0, 1)[..., None] - 1e-4`),
    which canonicalize does not fold; returns how many. IEEE f32 rounds each of these to one value on every backend
    (and XLA folds such constants on the host before any runs), so the constant is the program's own. Not a result
    that is NaN, infinite or subnormal (a TPU flushes subnormals)."""
    candidates: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name in _EXACT_FLOAT_ARITHMETIC and isinstance(op.results[0].type, ir.RankedTensorType):
            candidates.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    folded = 0
    for op in candidates:  # in program order: an op's operands are folded before it
        a, b = (_f32_splat(v) for v in op.operands)
        if a is None or b is None:
            continue
        with np.errstate(all="ignore"):
            value = np.float32(_EXACT_FLOAT_ARITHMETIC[op.name](a, b))
        if not np.isfinite(value) or (value != 0 and abs(value) < np.finfo(np.float32).tiny):
            continue
        result_type = ir.RankedTensorType(op.results[0].type)
        with ir.InsertionPoint(op), op.location:
            folded_value = _splat(result_type, ir.FloatAttr.get(result_type.element_type, float(value)))
        op.results[0].replace_all_uses_with(folded_value)
        op.erase()
        folded += 1
    return folded


def compose_broadcasts(module: ir.Operation) -> int:
    """Replaces each `broadcast_in_dim` of a `broadcast_in_dim` of a 0-d constant that only selects read (a `where`'s
    fill) by one `broadcast_in_dim` of that constant; returns how many. `jax.vmap` writes a per-row function's fill
    twice (to the row, then to the batch) where the batched code writes it once: `vmap(lambda y: where(y >= kth, y,
    -inf))` against `where(y >= kth[:, None], y, -inf)`. (Only fills: other broadcasts keep their steps, which the
    templates' sentinel parameters, the searches' loops and the hand-written noises are matched by.)"""
    composed = 0
    for op in _ops_named(module, "stablehlo.broadcast_in_dim"):
        inner = defining_op(op.operands[0])
        if inner is None or inner.name != "stablehlo.broadcast_in_dim" or len(op.attributes) != 1:
            continue  # (a broadcast carrying more, a sharding annotation, stays as it is)
        splat = defining_op(inner.operands[0])
        if splat is None or splat.name != "stablehlo.constant" or static_shape(inner.operands[0]) != ():
            continue
        if not all(use.owner.name == "stablehlo.select" and use.operand_number > 0 for use in op.results[0].uses):
            continue
        outer_dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
        inner_dims = list(ir.DenseI64ArrayAttr(inner.attributes["broadcast_dimensions"]))
        with ir.InsertionPoint(op), op.location:
            broadcast = stablehlo.BroadcastInDimOp(op.results[0].type, inner.operands[0],
                                                   [outer_dims[d] for d in inner_dims])
        op.results[0].replace_all_uses_with(broadcast.result)
        op.erase()
        composed += 1
    return composed


def _unexpanded(op: ir.Operation, dims: list[int]) -> list[int] | None:
    """The result dims a `broadcast_in_dim` puts its operand's `dims` at, where each keeps its size (not a unit dim
    expanded), else None."""
    places = int_list(op, "broadcast_dimensions")
    source, result = static_shape(op.operands[0]), static_shape(op.results[0])
    if source is None or result is None or any(source[d] != result[places[d]] for d in dims):
        return None
    return [places[d] for d in dims]


def broadcast_before_reverses_and_iotas(module: ir.Operation) -> int:
    """Replaces each `broadcast_in_dim` of a `reverse` by the reverse of the broadcast (its dims at their places in
    the result), and each `broadcast_in_dim` of an `iota` by an iota of the result along its dim's place, where the
    reversed or counted dims keep their size; returns how many. `jax.vmap` of a row's `jnp.argsort(y,
    descending=True)` broadcasts the row's reversed iota to the batch, where the batched code writes the batch's
    iota, reversed. (Until none is left: a broadcast moved before a reverse may meet an iota there.)"""
    moved, before = 0, -1
    while moved != before:
        before = moved
        moved += _broadcast_before_reverse_or_iota(module)
    return moved


def _broadcast_before_reverse_or_iota(module: ir.Operation) -> int:
    """One sweep of `broadcast_before_reverses_and_iotas`."""
    moved = 0
    for op in _ops_named(module, "stablehlo.broadcast_in_dim"):
        inner = defining_op(op.operands[0])
        if inner is None or inner.name not in ("stablehlo.reverse", "stablehlo.iota") or len(op.attributes) != 1:
            continue
        result_type = ir.RankedTensorType(op.results[0].type)
        with ir.InsertionPoint(op), op.location:
            if inner.name == "stablehlo.iota":
                places = _unexpanded(op, [ir.IntegerAttr(inner.attributes["iota_dimension"]).value])
                if places is None:
                    continue
                replaced = stablehlo.IotaOp(result_type, places[0]).result
            else:
                places = _unexpanded(op, int_list(inner, "dimensions"))
                if places is None:
                    continue
                broadcast = stablehlo.BroadcastInDimOp(result_type, inner.operands[0],
                                                       int_list(op, "broadcast_dimensions")).result
                replaced = stablehlo.ReverseOp(broadcast, places).result
        op.results[0].replace_all_uses_with(replaced)
        op.erase()
        moved += 1
    return moved


def _without_units(shape: list[int]) -> list[int]:
    return [size for size in shape if size != 1]


def unit_reshape_broadcast_dims(source: list[int], reshaped: list[int], dims: list[int], rank: int) -> list[int] | None:
    """The `broadcast_dimensions` that broadcast `source` as `broadcast_in_dim(reshape(source) : reshaped, dims)` to
    a rank-`rank` result does, where the reshape only drops or adds unit dims (else None): each dim of `source` that
    is not 1 keeps its dim's place, and each unit dim takes the first place after the one before it (a unit dim is
    the same values wherever it is broadcast). In increasing order, or None where no such places are left."""
    if _without_units(source) != _without_units(reshaped):
        return None
    placed = iter(dims[i] for i, size in enumerate(reshaped) if size != 1)
    kept = [next(placed) if size != 1 else None for size in source]
    result: list[int] = []
    for i, place in enumerate(kept):
        if place is None:
            place = (result[-1] + 1) if result else 0
            later = next((p for p in kept[i + 1:] if p is not None), rank)
            if place >= later:
                return None
        if result and place <= result[-1]:
            return None
        result.append(place)
    return result


def fold_unit_reshapes_into_broadcasts(module: ir.Operation) -> int:
    """Replaces each `broadcast_in_dim` of a `reshape` that only drops or adds unit dims by a `broadcast_in_dim` of
    the reshape's operand (`unit_reshape_broadcast_dims`), or by that operand itself where the broadcast gives back its
    shape in place; returns how many. A value broadcast from a (B, 1) column
    and from its (B,) row, or from a (1,) slice and from its () scalar (`v[..., -1:]` against `v[..., -1]`, a
    `keepdims` reduction against one reshaped after it), then read as one."""
    broadcasts: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "stablehlo.broadcast_in_dim" and (d := defining_op(op.operands[0])) is not None and (
                d.name == "stablehlo.reshape"):
            broadcasts.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    folded = 0
    for op in broadcasts:
        reshape = defining_op(op.operands[0])
        source = reshape.operands[0]
        if not all(isinstance(v.type, ir.RankedTensorType) and v.type.has_static_shape
                   for v in (source, reshape.results[0], op.results[0])):
            continue
        dims = unit_reshape_broadcast_dims(list(source.type.shape), list(reshape.results[0].type.shape),
                                           list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"])),
                                           op.results[0].type.rank)
        if dims is None:
            continue
        if source.type == op.results[0].type and dims == list(range(len(dims))) and len(op.attributes) == 1:
            # `v[-1][None]`: v[-1:] itself (a broadcast carrying more, a sharding annotation, stays one)
            op.results[0].replace_all_uses_with(source)
            op.erase()
            folded += 1
            continue
        with ir.InsertionPoint(op), op.location:
            broadcast = stablehlo.BroadcastInDimOp(op.results[0].type, source, dims)
        for i in range(len(op.attributes)):  # what else the broadcast carries (a sharding annotation) stays on it
            named = op.attributes[i]
            if named.name != "broadcast_dimensions":
                broadcast.operation.attributes[named.name] = named.attr
        op.results[0].replace_all_uses_with(broadcast.result)
        op.erase()
        folded += 1
    return folded


def _ops_named(module: ir.Operation, *names: str) -> list[ir.Operation]:
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name in names:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return found


def _splat(result_type: ir.RankedTensorType, attr: ir.Attribute) -> ir.Value:
    """A splat of the scalar `attr` of `result_type` as JAX writes one: a 0-d constant broadcast (a 0-d result is the
    constant itself, as JAX writes a 0-d array's)."""
    scalar = stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(ir.RankedTensorType.get([], result_type.element_type),
                                                                 attr)).result
    if not result_type.rank:
        return scalar
    return stablehlo.BroadcastInDimOp(result_type, scalar, ir.DenseI64ArrayAttr.get([])).result


def fold_decided_index_checks(module: ir.Operation) -> int:
    """Folds the bounds checks a take wraps around its gather where its ids are an argsort's (`take_along_axis`
    along an order: its ids lie in [0, n)), in program order; returns how many ops it folded. An integer compare of
    an order's ids that `orders.decided_compare` decides becomes a splat of its value; then, for those splats only
    (a program's own constants stay as its templates have them), a select on one gives the operand it picks, an
    `and` / `or` with one gives it or the other operand, and a `reduce` by `and` / `or` of one whose init is the same
    value gives a splat of it (canonicalize folds none of these through a broadcast)."""
    decided: dict[ir.Value, bool] = {}
    folded = 0
    for op in _ops_named(module, "stablehlo.compare", "stablehlo.select", "stablehlo.and", "stablehlo.or",
                         "stablehlo.reduce"):
        value = _decided_check(op, decided)
        if value is None:
            continue
        if isinstance(value, bool):
            with ir.InsertionPoint(op), op.location:
                splat = _splat(ir.RankedTensorType(op.results[0].type), ir.BoolAttr.get(value))
            decided[splat] = value
            value = splat
        op.results[0].replace_all_uses_with(value)
        op.erase()
        folded += 1
    return folded


def _decided_check(op: ir.Operation, decided: dict[ir.Value, bool]) -> ir.Value | bool | None:
    """What `op` folds to in `fold_decided_index_checks`, given the splats it `decided` so far: a value it gives
    back, a boolean it is everywhere, or None."""
    if op.name == "stablehlo.compare":  # (the bounds first: they are known for integers alone, a cheap test)
        value = decided_compare(op)
        return value if value is not None and any(reads_an_order(v) for v in op.operands) else None
    if op.name == "stablehlo.select":
        predicate = _decided_through_broadcasts(op.operands[0], decided)
        return None if predicate is None else op.operands[1 if predicate else 2]
    if op.name in ("stablehlo.and", "stablehlo.or"):
        absorbing = op.name == "stablehlo.or"  # x or True is True; x and False is False
        for i, operand in enumerate(op.operands):
            splat = _decided_through_broadcasts(operand, decided)
            if splat is not None:
                return absorbing if splat == absorbing else op.operands[1 - i]
        return None
    body = [o.operation.name for o in op.regions[0].blocks[0].operations]
    if len(op.operands) != 2 or len(body) != 2 or body[0] not in ("stablehlo.and", "stablehlo.or"):
        return None
    value = _decided_through_broadcasts(op.operands[0], decided)
    return value if value is not None and _bool_splat(op.operands[1]) == value else None


def _decided_through_broadcasts(value: ir.Value, decided: dict[ir.Value, bool]) -> bool | None:
    """The value of one of the `decided` splats, or of a broadcast or reshape of one (one row's bounds checks are
    broadcast to its (1, V) shape), else None."""
    for _ in range(4):
        if value in decided:
            return decided[value]
        op = defining_op(value)
        if op is None or op.name not in ("stablehlo.broadcast_in_dim", "stablehlo.reshape"):
            return None
        value = op.operands[0]
    return None


def _is_bool(element_type: ir.Type) -> bool:
    return isinstance(element_type, ir.IntegerType) and ir.IntegerType(element_type).width == 1


def _bool_splat(value: ir.Value) -> bool | None:
    """The boolean a splat constant, or a broadcast of one, holds; else None."""
    element = _splat_element(value)
    if element is None or not _is_bool(ir.RankedTensorType(value.type).element_type):
        return None
    return bool(ir.BoolAttr(element).value)


def _dense(constant: ir.Operation) -> ir.DenseElementsAttr | None:
    """A constant's elements, or None where it holds them otherwise (a `dense_resource` blob)."""
    try:
        return ir.DenseElementsAttr(constant.attributes["value"])
    except ValueError:
        return None


def sort_values_once(module: ir.Operation) -> int:
    """Replaces each stable sort of one array whose sorted values an argsort of the same array also gives
    (`jnp.sort(x)` beside `jnp.argsort(x)`: `orders.sort_carrying_its_values`) by that argsort's sorted values, moving
    the argsort up where it came later; returns how many. The row is then sorted once, as `lax.sort_key_val` or a take
    along the argsort writes it."""
    folded = 0
    for op in _ops_named(module, "stablehlo.sort"):
        other = sort_carrying_its_values(op)
        if other is None or not hoisted_before(other, op):
            continue
        op.results[0].replace_all_uses_with(other.results[0])
        op.erase()
        folded += 1
    return folded


def take_sorted_operands(module: ir.Operation) -> int:
    """Replaces each take of a sort's operand along that sort's own argsort (`take_along_axis(y, argsort(y))`, also
    reversed: `argsort(y)[..., ::-1]`) by the sort's sorted output of that operand, reversed the same way: the same
    entries in the same places, as `jnp.sort` or `lax.sort_key_val` gives them. Returns how many."""
    folded = 0
    for op in _ops_named(module, "stablehlo.gather"):
        found = sorted_operand(op)
        if found is None:
            continue
        order, i = found
        value = order.sort.results[i]
        if order.reversed:
            with ir.InsertionPoint(op), op.location:
                value = stablehlo.ReverseOp(value, ir.DenseI64ArrayAttr.get([order.dim])).result
        op.results[0].replace_all_uses_with(value)
        op.erase()
        folded += 1
    return folded


def put_back_by_sort_key_val(module: ir.Operation) -> int:
    """Replaces each put-back of values listed in an order's places by `lax.sort_key_val(order, values)`'s values, the
    writing the library nuclei use (simply's, Flax's); returns how many. A put-back is a take along the argsort of an
    order (`take_along_axis(v, argsort(order))`: `orders.inverse_of`) or a scatter of each row's values to the order's
    places (`zeros_like(v).at[rows, order].set(v)`, torch's `scatter` through torchax: `orders.scattered_along`). The
    order's entries are distinct, so each puts every entry at its id."""
    folded = 0
    for op in _ops_named(module, "stablehlo.gather", "stablehlo.scatter"):
        found = inverse_of(op) if op.name == "stablehlo.gather" else scattered_along(op)
        if found is None:
            continue
        order, values, dim = found
        with ir.InsertionPoint(op), op.location:
            put_back = _sort_key_val(order, values, dim)
        op.results[0].replace_all_uses_with(put_back)
        op.erase()
        folded += 1
    return folded


def _sort_key_val(keys: ir.Value, values: ir.Value, dim: int) -> ir.Value:
    """`lax.sort_key_val(keys, values, dimension=dim)[1]` for integer keys, as JAX lowers it (a stable sort whose
    comparator is `lhs < rhs` of the keys)."""
    key_type, value_type = (ir.RankedTensorType(v.type) for v in (keys, values))
    sort = stablehlo.SortOp([key_type, value_type], [keys, values], dimension=dim, is_stable=True)
    scalars = [ir.RankedTensorType.get([], t.element_type) for t in (key_type, key_type, value_type, value_type)]
    block = sort.comparator.blocks.append(*scalars)
    signed = "UNSIGNED" if ir.IntegerType(key_type.element_type).is_unsigned else "SIGNED"
    with ir.InsertionPoint(block):
        less = stablehlo.CompareOp(block.arguments[0], block.arguments[1],
                                   stablehlo.ComparisonDirectionAttr.get("LT"),
                                   compare_type=stablehlo.ComparisonTypeAttr.get(signed)).result
        stablehlo.ReturnOp([less])
    return sort.results[1]


def fold_scatters_over_concatenated_parts(module: ir.Operation) -> int:
    """Replaces each scatter that sets exactly one part of a concatenate (`jnp.roll(m, 1).at[:, 0].set(False)`: the
    rolled-in column overwritten) by the concatenate with that part given the scatter's updates; returns how many.
    Only a set (the body returns the update) at one constant index whose window spans every other dim whole."""
    folded = 0
    for op in _ops_named(module, "stablehlo.scatter"):
        found = _concatenated_part_set(op)
        if found is None:
            continue
        concat, part, updates = found
        parts = list(concat.operands)
        with ir.InsertionPoint(op), op.location:
            part_type = ir.RankedTensorType(parts[part].type)
            if (scalar := _splat_scalar_constant(updates)) is not None:  # (a splat: broadcast its scalar)
                updates = stablehlo.BroadcastInDimOp(part_type, scalar, []).result
            elif updates.type != part_type:
                dim = ir.IntegerAttr(concat.attributes["dimension"]).value
                updates = stablehlo.BroadcastInDimOp(part_type, updates, [d for d in range(part_type.rank)
                                                                          if d != dim]).result
            parts[part] = updates
            replaced = stablehlo.ConcatenateOp(parts, concat.attributes["dimension"]).result
        op.results[0].replace_all_uses_with(replaced)
        op.erase()
        folded += 1
    return folded


def _concatenated_part_set(op: ir.Operation) -> tuple[ir.Operation, int, ir.Value] | None:
    """(concatenate, i, updates) where the scatter `op` sets exactly part i of the concatenate it scatters into."""
    if len(op.operands) != 3 or not sets_its_update(op):
        return None
    concat, index = defining_op(op.operands[0]), evaluate(op.operands[1])
    if concat is None or concat.name != "stablehlo.concatenate" or index is None or np.size(index) != 1:
        return None
    numbers = stablehlo.ScatterDimensionNumbers(op.attributes["scatter_dimension_numbers"])
    shape, update_shape = static_shape(op.operands[0]), static_shape(op.operands[2])
    dim = ir.IntegerAttr(concat.attributes["dimension"]).value
    inserted = list(numbers.inserted_window_dims)
    if (list(numbers.scattered_dims_to_operand_dims) != [dim] or list(numbers.input_batching_dims)
            or static_shape(op.operands[1]) != (1,) or numbers.index_vector_dim != 0 or inserted not in ([], [dim])
            or shape is None or update_shape is None
            or list(numbers.update_window_dims) != list(range(len(update_shape)))):
        return None
    window = list(update_shape)
    if inserted:
        window.insert(dim, 1)
    start = int(np.ravel(index)[0])
    if [w for d, w in enumerate(window) if d != dim] != [n for d, n in enumerate(shape) if d != dim]:
        return None
    offset = 0
    for i, part in enumerate(concat.operands):
        width = ir.RankedTensorType(part.type).shape[dim]
        if (offset, width) == (start, window[dim]):
            return concat, i, op.operands[2]
        offset += width
    return None


def pad_splat_ends(module: ir.Operation) -> int:
    """Replaces each two-part concatenate of a splat of a constant and another value (`concatenate([zeros((B, 1)),
    m[:, :-1]])`: a shift along the dim) by a pad of that value with the constant, as `jnp.pad` and torch's `F.pad`
    write it; returns how many. A pad's value computed from constants alone is made that constant."""
    folded = 0
    for op in _ops_named(module, "stablehlo.concatenate", "stablehlo.pad"):
        if op.name == "stablehlo.pad":
            folded += _constant_pad_value(op)
            continue
        if len(op.operands) != 2 or any(static_shape(v) is None for v in (*op.operands, op.results[0])):
            continue
        dim = ir.IntegerAttr(op.attributes["dimension"]).value
        for i, part in enumerate(op.operands):
            value = _splat_scalar_constant(part)
            if value is None:
                continue
            rank = ir.RankedTensorType(part.type).rank
            width = [ir.RankedTensorType(part.type).shape[dim] if d == dim else 0 for d in range(rank)]
            zeros = [0] * rank
            low, high = (width, zeros) if i == 0 else (zeros, width)
            with ir.InsertionPoint(op), op.location:
                padded = stablehlo.PadOp(op.operands[1 - i], value, low, high, zeros).result
            op.results[0].replace_all_uses_with(padded)
            op.erase()
            folded += 1
            break
    return folded


def _splat_scalar_constant(value: ir.Value) -> ir.Value | None:
    """The 0-d constant a splat of a constant holds (a broadcast of one, or a splat constant, whose 0-d constant is
    made beside it), else None."""
    op = defining_op(value)
    if op is not None and op.name == "stablehlo.broadcast_in_dim":
        scalar = defining_op(op.operands[0])
        if scalar is not None and scalar.name == "stablehlo.constant" and not ir.RankedTensorType(
                op.operands[0].type).rank:
            return op.operands[0]
        return None
    if op is None or op.name != "stablehlo.constant":
        return None
    attr = _dense(op)
    if attr is None or not attr.is_splat:
        return None
    scalar_type = ir.RankedTensorType.get([], ir.RankedTensorType(value.type).element_type)
    with ir.InsertionPoint(op), op.location:
        return stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(scalar_type, attr.get_splat_value())).result


def _constant_pad_value(op: ir.Operation) -> int:
    """Makes a pad's value a constant where it is computed from constants alone (jnp.pad's `False` of a bool array,
    written as a compare of two integer constants); 1 if it did."""
    value = op.operands[1]
    if (defining := defining_op(value)) is None or defining.name == "stablehlo.constant":
        return 0
    array = evaluate(value)
    if array is None:
        return 0
    scalar_type = ir.RankedTensorType(value.type)
    element = scalar_type.element_type
    if _is_bool(element):
        attr = ir.BoolAttr.get(bool(array))
    elif isinstance(element, ir.IntegerType):
        attr = ir.IntegerAttr.get(element, int(array))
    else:
        return 0  # (a float pad value: evaluate reads floats as f64)
    with ir.InsertionPoint(op), op.location:
        constant = stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(scalar_type, attr)).result
    op.operands[1] = constant
    return 1


# Elementwise ops whose bool result a slice or a pad can move through (`_mask_of_one_array`).
_MASK_OPS = ("stablehlo.compare", "stablehlo.and", "stablehlo.or", "stablehlo.xor", "stablehlo.not")


def _scalar_of(value: ir.Value) -> ir.Value | None:
    """The 0-d value a splat holds: a broadcast of a 0-d value (a constant, or a traced p), or a splat constant (whose
    0-d constant is made beside it); else None."""
    op = defining_op(value)
    if op is not None and op.name == "stablehlo.broadcast_in_dim" and not ir.RankedTensorType(
            op.operands[0].type).rank:
        return op.operands[0]
    return _splat_scalar_constant(value)


def _mask_of_one_array(op: ir.Operation) -> tuple[int, list[ir.Value | None]] | None:
    """(i, scalars) where `op` computes a bool array elementwise from its operand i and splats (`c > p`, `m & True`):
    scalars[j] is operand j's 0-d value, None at i. None for any other op."""
    if op.name not in _MASK_OPS or not _is_bool(ir.RankedTensorType(op.results[0].type).element_type):
        return None
    scalars = [_scalar_of(v) for v in op.operands]
    arrays = [i for i, s in enumerate(scalars) if s is None]
    return (arrays[0], scalars) if len(arrays) == 1 else None


def _elementwise_like(op: ir.Operation, operand: ir.Value, i: int, scalars: list[ir.Value | None]) -> ir.Value:
    """`op` computed again of `operand` in place of its operand i, its splats broadcast to `operand`'s shape."""
    shape = ir.RankedTensorType(operand.type).shape
    operands = [operand if j == i else stablehlo.BroadcastInDimOp(ir.RankedTensorType.get(
        shape, ir.RankedTensorType(scalar.type).element_type), scalar, []).result for j, scalar in enumerate(scalars)]
    result = ir.RankedTensorType.get(shape, ir.RankedTensorType(op.results[0].type).element_type)
    attributes = {name: op.attributes[name] for name in op.attributes}
    return ir.Operation.create(op.name, results=[result], operands=operands, attributes=attributes).results[0]


def slice_masks_arrays(module: ir.Operation) -> int:
    """Replaces each slice of a bool mask computed elementwise from one array and splats (`(c > p)[:, :-1]`, the kept
    part of a shift) by the mask of the array's slice (`c[:, :-1] > p`), as code that slices first writes it; returns
    how many. The same entries: an elementwise op reads each place alone."""
    folded = 0
    for op in _ops_named(module, "stablehlo.slice"):
        mask = defining_op(op.operands[0])
        found = None if mask is None else _mask_of_one_array(mask)
        if found is None:
            continue
        i, scalars = found
        with ir.InsertionPoint(op), op.location:
            sliced = stablehlo.SliceOp(mask.operands[i], op.attributes["start_indices"], op.attributes["limit_indices"],
                                       op.attributes["strides"]).result
            replaced = _elementwise_like(mask, sliced, i, scalars)
        op.results[0].replace_all_uses_with(replaced)
        op.erase()
        folded += 1
    return folded


def mask_pads_by_parts(module: ir.Operation) -> int:
    """Replaces each bool mask computed elementwise from a pad and splats (`concatenate([zeros, m]) != 0`, a float
    shift compared) by the pad of the mask of the padded array, with the mask of the pad value as its value
    (`pad(convert(m) != 0, False)`); returns how many. The same entries: the mask reads each place alone."""
    folded = 0
    for op in _ops_named(module, *_MASK_OPS):
        found = _mask_of_one_array(op)
        pad = None if found is None else defining_op(op.operands[found[0]])
        if found is None or pad is None or pad.name != "stablehlo.pad":
            continue
        i, scalars = found
        with ir.InsertionPoint(op), op.location:
            inner = _elementwise_like(op, pad.operands[0], i, scalars)
            value = _elementwise_like(op, pad.operands[1], i, scalars)
            padded = stablehlo.PadOp(inner, value, pad.attributes["edge_padding_low"],
                                     pad.attributes["edge_padding_high"], pad.attributes["interior_padding"])
        _constant_pad_value(padded.operation)
        op.results[0].replace_all_uses_with(padded.result)
        op.erase()
        folded += 1
    return folded


def fold_compares_of_converted_masks(module: ir.Operation) -> int:
    """Replaces each `convert(m) != 0` (or `== 0`) of a bool m, a mask made a number and read back by `where`, by m
    (or `not m`); returns how many."""
    folded = 0
    for op in _ops_named(module, "stablehlo.compare"):
        direction = comparison_direction(op)
        convert, zero = defining_op(op.operands[0]), evaluate(op.operands[1])
        if direction not in ("EQ", "NE") or convert is None or convert.name != "stablehlo.convert" or zero is None:
            continue
        mask = convert.operands[0]
        if not _is_bool(ir.RankedTensorType(mask.type).element_type) or np.any(np.asarray(zero) != 0):
            continue
        if direction == "EQ":
            with ir.InsertionPoint(op), op.location:
                mask = stablehlo.NotOp(mask).result
        op.results[0].replace_all_uses_with(mask)
        op.erase()
        folded += 1
    return folded


def compose_slices(module: ir.Operation) -> int:
    """Replaces each slice of a slice (either a dynamic_slice at constant indices: `_slice_window`) by one slice of
    the inner one's operand (`jnp.sort(x)[..., -k:][..., 0:1]` is `jnp.sort(x)[..., -k:-k + 1]`); returns how many.
    Entry j of the outer slice is entry `start + j * stride` of the inner's result, whose entry i is `start' + i *
    stride'` of its operand."""
    composed = 0
    for op in _ops_named(module, "stablehlo.slice", "stablehlo.dynamic_slice"):
        inner = defining_op(op.operands[0])
        if inner is None or inner.name not in ("stablehlo.slice", "stablehlo.dynamic_slice"):
            continue
        outer_window, inner_window = _slice_window(op), _slice_window(inner)
        if outer_window is None or inner_window is None:
            continue
        starts, limits, strides = [], [], []
        for start, limit, stride, inner_start, inner_stride in zip(*outer_window, inner_window[0], inner_window[2],
                                                                    strict=True):
            count = -(-(limit - start) // stride)
            starts.append(inner_start + start * inner_stride)
            strides.append(stride * inner_stride)
            limits.append(starts[-1] + (count - 1) * strides[-1] + 1 if count > 0 else starts[-1])
        _replace_by_slice(op, inner.operands[0], starts, limits, strides)
        composed += 1
    return composed


def _replace_by_slice(op: ir.Operation, operand: ir.Value, start: list[int], limit: list[int],
                      strides: list[int]) -> None:
    """Replaces `op`'s one result by the slice `operand[start:limit:strides]`, and erases `op`."""
    with ir.InsertionPoint(op), op.location:
        sliced = stablehlo.SliceOp(operand, start, limit, strides).result
    op.results[0].replace_all_uses_with(sliced)
    op.erase()


def slice_pads_by_parts(module: ir.Operation) -> int:
    """Replaces each slice of a pad (`concatenate([zeros, r])[:, :-1]`, mesh-transformer-jax's shift) by the pad of the
    slice of the padded array that the slice keeps (`pad(r[:, :-1])`, as code that slices first writes it); returns
    how many. Only unit strides, and pads with no interior and no negative padding."""
    folded = 0
    for op in _ops_named(module, "stablehlo.slice"):
        pad = defining_op(op.operands[0])
        if pad is None or pad.name != "stablehlo.pad" or static_shape(pad.operands[0]) is None:
            continue
        low, high, interior = (int_list(pad, name) for name in ("edge_padding_low", "edge_padding_high",
                                                                 "interior_padding"))
        start, limit, strides = _slice_window(op)
        if any(interior) or min(low + high) < 0 or any(s != 1 for s in strides):
            continue
        size = static_shape(pad.operands[0])
        kept_from = [max(s - lo, 0) for s, lo in zip(start, low, strict=True)]
        kept_to = [min(max(e - lo, 0), n) for e, lo, n in zip(limit, low, size, strict=True)]
        new_low = [max(lo - s, 0) for s, lo in zip(start, low, strict=True)]
        new_high = [max(e - (lo + n), 0) for e, lo, n in zip(limit, low, size, strict=True)]
        if any(a >= b for a, b in zip(kept_from, kept_to, strict=True)):
            continue  # (the slice keeps only padding: no array to pad)
        with ir.InsertionPoint(op), op.location:
            kept = pad.operands[0]
            if kept_from != [0] * len(size) or kept_to != list(size):
                kept = stablehlo.SliceOp(kept, kept_from, kept_to, [1] * len(size)).result
            replaced = stablehlo.PadOp(kept, pad.operands[1], new_low, new_high, [0] * len(size)).result
        op.results[0].replace_all_uses_with(replaced)
        op.erase()
        folded += 1
    return folded


def slice_columns_of_reverses(module: ir.Operation) -> int:
    """Replaces each one-wide slice (or dynamic_slice at constant indices) of a float array reversed along that dim
    (`jnp.sort(x)[:, ::-1][:, k - 1]`, the k-th largest as EasyDeL reads it) by the slice of the array at the mirrored
    place (`jnp.sort(x)[:, -k]`, as most code reads it); returns how many. One entry along the dim: the reverse moves
    nothing. Ids (an argsort's order, which hlofuse.ir.orders reads through its reverse) are left as they are."""
    folded = 0
    for op in _ops_named(module, "stablehlo.slice", "stablehlo.dynamic_slice"):
        reverse = defining_op(op.operands[0])
        if reverse is None or reverse.name != "stablehlo.reverse" or static_shape(reverse.operands[0]) is None:
            continue
        if not isinstance(ir.RankedTensorType(reverse.operands[0].type).element_type, ir.FloatType):
            continue
        window = _slice_window(op)
        if window is None:
            continue
        start, limit, strides = window
        dims, shape = int_list(reverse, "dimensions"), static_shape(reverse.operands[0])
        if any(limit[d] - start[d] != 1 for d in dims):
            continue
        mirrored = [shape[d] - 1 - s if d in dims else s for d, s in enumerate(start)]
        limit = [mirrored[d] + 1 if d in dims else e for d, e in enumerate(limit)]
        _replace_by_slice(op, reverse.operands[0], mirrored, limit, strides)
        folded += 1
    return folded


def _slice_window(op: ir.Operation) -> tuple[list[int], list[int], list[int]] | None:
    """(start, limit, strides) of a slice, or of a dynamic_slice whose start indices are constants (clamped into the
    operand, as the op clamps them); None for a dynamic_slice at a traced index."""
    if op.name == "stablehlo.slice":
        return tuple(int_list(op, name) for name in ("start_indices", "limit_indices", "strides"))
    shape, sizes = static_shape(op.operands[0]), int_list(op, "slice_sizes")
    indices = [evaluate(v) for v in op.operands[1:]]
    if shape is None or any(i is None or np.size(i) != 1 for i in indices):
        return None
    start = [min(max(int(np.ravel(i)[0]), 0), n - size) for i, n, size in zip(indices, shape, sizes, strict=True)]
    return start, [s + size for s, size in zip(start, sizes, strict=True)], [1] * len(shape)


@dataclass(frozen=True)
class PreparePass(ModulePass):
    """Inlines JAX's private helper functions, then canonicalizes and CSEs: one normal form to match."""

    name: ClassVar[str] = "hlofuse-prepare"
    summary: ClassVar[str] = "Inline private helper funcs, canonicalize and CSE"

    def run(self, module: ir.Operation, state: PassState) -> None:
        state.count("inline_private_call", inline_private_calls(module))
        state.count("fold_invariant_constant_carry", fold_invariant_constant_carries(module))
        # (before the cases: a carried Python float reaches a case's index through an identity convert)
        state.count("erase_identity_convert", erase_identity_converts(module))
        state.count("fold_constant_case", fold_constant_cases(module))  # (calls inside branches: inlined above)
        state.count("fold_integer_scalar", fold_integer_scalars(module))
        state.count("fold_float_scalar_extremum", fold_float_scalar_extrema(module))
        state.count("fold_f32_splat_arithmetic", fold_f32_splat_arithmetic(module))
        state.count("compose_broadcast", compose_broadcasts(module))
        state.count("broadcast_before_reverse_or_iota", broadcast_before_reverses_and_iotas(module))
        state.count("fold_unit_reshape_into_broadcast", fold_unit_reshapes_into_broadcasts(module))
        # takes along an argsort: their bounds checks decided, then read as the sort's outputs
        state.count("fold_decided_index_check", fold_decided_index_checks(module))
        state.count("take_sorted_operand", take_sorted_operands(module))
        state.count("sort_values_once", sort_values_once(module))
        state.count("put_back_by_sort_key_val", put_back_by_sort_key_val(module))
        # shifts along a dim: a rolled-in place overwritten, a constant concatenated, both as a pad
        state.count("fold_scatter_over_concatenated_part", fold_scatters_over_concatenated_parts(module))
        state.count("pad_splat_end", pad_splat_ends(module))
        state.count("compose_slice", compose_slices(module))
        # masks of shifted arrays: sliced and padded parts moved next to the array, as code that slices first has them
        state.count("slice_pad_by_parts", slice_pads_by_parts(module))
        state.count("slice_mask_array", slice_masks_arrays(module))
        state.count("mask_pad_by_parts", mask_pads_by_parts(module))
        state.count("fold_compare_of_converted_mask", fold_compares_of_converted_masks(module))
        # a column of a reversed row read at its place in the row (the k-th largest of a sort, however indexed)
        state.count("slice_column_of_reverse", slice_columns_of_reverses(module))
        cleanup = passmanager.PassManager.parse("builtin.module(canonicalize,cse)", context=module.context)
        cleanup.run(module)
