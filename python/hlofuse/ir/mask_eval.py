"""Masks decided by evaluation: a boolean term built from iotas and constants alone is computed at compile
time on its static shape, then compared element by element with the composite's bands.

However the code writes a causal or sliding-window mask (`tril`, `triu`, iota compares, arange
arithmetic, int64 iotas truncated to int32, a cumsum over ones), the pattern is the same (T, S) table,
so evaluating it makes every writing the same thing. `evaluate` interprets the StableHLO ops such terms
use (numpy, exact integer and boolean arithmetic, reductions whose result no order of evaluation changes: an
`all`, an `any`, an integer sum, an extremum); anything else (an argument, a data-dependent op, a float sum)
makes the term not constant. `fit_band` finds the causal / window / q_offset attributes whose visibility
(hlofuse.kernels.reference.attention_visibility) is exactly the table, or says there are none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse.ir.layout import Labels, Sizes, static_shape
from hlofuse.ir.match import defining_op, dense_values

UNBOUNDED = -1
MAX_ELEMENTS = 1 << 24  # larger tables are not evaluated (a 4k x 4k mask is 16M entries)
_MAX_OPS = 512


class NotConstant(Exception):  # noqa: N818  (a control signal)
    """The term reads a value that is not an iota or a constant, or an op this evaluator does not know."""


def int_list(op: ir.Operation, name: str) -> list[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes[name]))


def comparison_direction(op: ir.Operation) -> str:
    return stablehlo.ComparisonDirectionAttr(op.attributes["comparison_direction"]).value


COMPARISONS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal, "GT": np.greater, "GE": np.greater_equal,
}
_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "stablehlo.add": np.add, "stablehlo.subtract": np.subtract, "stablehlo.multiply": np.multiply,
    "stablehlo.maximum": np.maximum, "stablehlo.minimum": np.minimum, "stablehlo.and": np.logical_and,
    "stablehlo.or": np.logical_or, "stablehlo.xor": np.logical_xor,
}
_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "stablehlo.negate": np.negative, "stablehlo.abs": np.abs, "stablehlo.not": np.logical_not,
    "stablehlo.sign": np.sign,
}


def _np_type(value: ir.Value) -> np.dtype:
    etype = ir.RankedTensorType(value.type).element_type
    if isinstance(etype, ir.IntegerType):
        if etype.width == 1:
            return np.dtype(bool)
        signed = not etype.is_unsigned
        return np.dtype(f"{'int' if signed else 'uint'}{max(etype.width, 8)}")
    if isinstance(etype, ir.FloatType):
        return np.dtype(np.float64)  # positions held in floats are exact integers far below 2**53
    raise NotConstant(f"element type {etype}")


class _Evaluator:
    def __init__(self) -> None:
        self.memo: dict[ir.Value, np.ndarray] = {}

    def value(self, value: ir.Value) -> np.ndarray:
        if value in self.memo:
            return self.memo[value]
        if len(self.memo) > _MAX_OPS:
            raise NotConstant("too many ops")
        shape = static_shape(value)
        if shape is None or int(np.prod(shape)) > MAX_ELEMENTS:
            raise NotConstant("shape")
        op = defining_op(value)
        if op is None:
            raise NotConstant("a block argument")
        result = self._op(op, value, shape).astype(_np_type(value), copy=False)
        self.memo[value] = np.broadcast_to(result, shape)
        return self.memo[value]

    def _op(self, op: ir.Operation, value: ir.Value, shape: tuple[int, ...]) -> np.ndarray:
        name = op.name
        if name == "stablehlo.constant":
            array = dense_values(value)
            if array is None:
                raise NotConstant("an unreadable constant")
            return np.broadcast_to(np.asarray(array), shape)
        if name == "stablehlo.iota":
            dim = ir.IntegerAttr(op.attributes["iota_dimension"]).value
            index = np.arange(shape[dim]).reshape([-1 if d == dim else 1 for d in range(len(shape))])
            return np.broadcast_to(index, shape)
        args = [self.value(v) for v in op.operands]
        if name in _BINARY:
            return _BINARY[name](args[0], args[1])
        if name in _UNARY:
            return _UNARY[name](args[0])
        if name == "stablehlo.compare":
            return COMPARISONS[comparison_direction(op)](args[0], args[1])
        if name == "stablehlo.select":
            return np.where(args[0], args[1], args[2])
        if name == "stablehlo.clamp":
            return np.clip(args[1], args[0], args[2])
        if name == "stablehlo.convert":
            return _convert(args[0], value)
        if name in ("stablehlo.divide", "stablehlo.remainder") and np.issubdtype(args[0].dtype, np.integer):
            if np.any(args[1] == 0):
                raise NotConstant("division by zero")
            quotient = np.trunc(args[0] / args[1]).astype(args[0].dtype)  # StableHLO rounds toward zero
            return quotient if name == "stablehlo.divide" else args[0] - quotient * args[1]
        return self._layout(op, args, shape)

    def _layout(self, op: ir.Operation, args: list[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
        name, x = op.name, args[0]
        if name == "stablehlo.broadcast_in_dim":
            dims = int_list(op, "broadcast_dimensions")
            expanded = x.reshape([x.shape[dims.index(d)] if d in dims else 1 for d in range(len(shape))])
            return np.broadcast_to(expanded, shape)
        if name == "stablehlo.reshape":
            return np.reshape(x, shape)
        if name == "stablehlo.transpose":
            return np.transpose(x, int_list(op, "permutation"))
        if name == "stablehlo.reverse":
            return np.flip(x, axis=tuple(int_list(op, "dimensions")))
        if name == "stablehlo.slice":
            starts, limits, strides = (int_list(op, a) for a in ("start_indices", "limit_indices", "strides"))
            return x[tuple(slice(a, b, c) for a, b, c in zip(starts, limits, strides, strict=True))]
        if name == "stablehlo.concatenate":
            return np.concatenate(args, axis=ir.IntegerAttr(op.attributes["dimension"]).value)
        if name == "stablehlo.reduce_window":
            return _cumulative_sum(op, args)
        if name == "stablehlo.reduce":
            return _reduce(op, args)
        raise NotConstant(f"{name} is not evaluated")


def _convert(x: np.ndarray, value: ir.Value) -> np.ndarray:
    target = _np_type(value)
    if target == np.dtype(bool):
        return x != 0
    if np.issubdtype(x.dtype, np.floating) and np.issubdtype(target, np.integer):
        return np.trunc(x).astype(target)
    return x.astype(target)  # integer truncation wraps, as StableHLO's convert does


# The reductions evaluated exactly whatever the order: of booleans and integers (an `any`, an `all`, a count), and the
# extrema of any type. A float sum is not (its rounding depends on the order the backend adds in).
_REDUCTIONS: dict[str, np.ufunc] = {
    "stablehlo.and": np.logical_and, "stablehlo.or": np.logical_or, "stablehlo.maximum": np.maximum,
    "stablehlo.minimum": np.minimum, "stablehlo.add": np.add,
}


def _reduce(op: ir.Operation, args: list[np.ndarray]) -> np.ndarray:
    """`stablehlo.reduce` of one input whose body is one op of _REDUCTIONS over its two arguments (`jnp.all`,
    `jnp.any`, a max, an integer sum; over some dims or none), combined with its init."""
    block = op.regions[0].blocks[0]
    body = list(block.operations)
    if len(args) != 2 or len(body) != 2 or body[0].operation.name not in _REDUCTIONS:
        raise NotConstant("a reduce that is not one op over one input")
    combine = body[0].operation
    if list(combine.operands) != [block.arguments[0], block.arguments[1]]:
        raise NotConstant("a reduce whose body is not its op of its two arguments")
    if body[1].operation.operands[0] != combine.result:
        raise NotConstant("a reduce that does not return its op")
    x, init = args
    ufunc = _REDUCTIONS[combine.name]
    if ufunc is np.add and np.issubdtype(x.dtype, np.floating):
        raise NotConstant("a float sum (its rounding is the backend's order)")
    reduced = ufunc.reduce(x, axis=tuple(int_list(op, "dimensions")))
    return ufunc(reduced, init)


def _cumulative_sum(op: ir.Operation, args: list[np.ndarray]) -> np.ndarray:
    """`reduce_window` of an add with a window along one dim padded before (jnp.cumsum's lowering)."""
    body = [o.operation.name for o in op.regions[0].blocks[0].operations]
    x, init = args[0], args[1]
    dims = int_list(op, "window_dimensions")
    if body != ["stablehlo.add", "stablehlo.return"] or np.any(init != 0) or "padding" not in op.attributes:
        raise NotConstant("a reduce_window that is not a cumulative sum")
    axes = [d for d, n in enumerate(dims) if n > 1]
    padding = np.array(ir.DenseIntElementsAttr(op.attributes["padding"])).reshape(-1, 2)
    strides = int_list(op, "window_strides") if "window_strides" in op.attributes else [1] * len(dims)
    if not axes and not padding.any() and set(strides) <= {1}:
        return x  # a cumulative sum over a dim of size 1
    if len(axes) != 1 or set(strides) != {1} or padding[axes[0]].tolist() != [dims[axes[0]] - 1, 0]:
        raise NotConstant("a reduce_window that is not a cumulative sum")
    if dims[axes[0]] != x.shape[axes[0]]:
        raise NotConstant("a windowed sum shorter than its dim")
    return np.cumsum(x, axis=axes[0])


def evaluate(value: ir.Value) -> np.ndarray | None:
    """The value of a tensor computed from iotas and constants only, or None."""
    try:
        return np.asarray(_Evaluator().value(value))
    except (NotConstant, KeyError, ValueError, TypeError):
        return None


def as_grid(array: np.ndarray, labels: Labels, sizes: Sizes) -> np.ndarray | None:
    """`array` (a tensor whose dims carry `labels`) as a (T, S) table, or None if it varies along any other
    role (a batch or head)."""
    atoms = [a for label in labels for a in label]
    atomic = array.reshape([sizes[a] for a in atoms]) if atoms else array.reshape(())
    for axis in reversed(range(len(atoms))):
        if atoms[axis] in ("T", "S"):
            continue
        first = np.take(atomic, [0], axis=axis)
        if not np.array_equal(np.broadcast_to(first, atomic.shape), atomic):
            return None
        atomic = np.squeeze(first, axis=axis)
    kept = [a for a in atoms if a in ("T", "S")]
    grid = np.transpose(atomic, [kept.index(a) for a in ("T", "S") if a in kept]) if kept else atomic
    if "T" not in kept:
        grid = grid[None, ...]
    if "S" not in kept:
        grid = grid[..., None]
    return np.broadcast_to(grid, (sizes.get("T", 1), sizes.get("S", 1)))


@dataclass(frozen=True)
class Band:
    causal: bool = False
    window_left: int = UNBOUNDED
    window_right: int = UNBOUNDED
    q_offset: int = 0


def band_table(t: int, s: int, band: Band) -> np.ndarray:
    """The (T, S) visibility of `band`, as hlofuse.kernels.reference.attention_visibility defines it."""
    rel = np.arange(s)[None, :] - (np.arange(t)[:, None] + band.q_offset)
    visible = np.ones((t, s), bool)
    right = 0 if band.causal else band.window_right
    if right != UNBOUNDED:
        visible &= rel <= right
    if band.window_left != UNBOUNDED:
        visible &= rel >= -band.window_left
    return visible


def fit_band(table: np.ndarray) -> Band | None:
    """The band whose visibility is exactly `table` (T, S), or None. An all-visible table is Band()."""
    t, s = table.shape
    candidates = [Band()] if table.any() else [Band(causal=True, q_offset=-t - 1)]  # nothing visible
    rel = np.arange(s)[None, :] - np.arange(t)[:, None]
    if table.any():
        hi, lo = int(np.max(np.where(table, rel, -(1 << 40)))), int(np.min(np.where(table, rel, 1 << 40)))
        # The fewest bounds that fit (the edges of S can make several fit): a left bound at `lo`, a right
        # bound at `hi` (causal with q_offset = hi), or both.
        candidates += [Band(window_left=-lo) if lo <= 0 else Band(q_offset=lo, window_left=0)]
        candidates += [Band(causal=True, q_offset=hi), Band(causal=True, q_offset=hi, window_left=hi - lo)]
    for band in candidates:
        if np.array_equal(band_table(t, s, band), table):
            return band
    return None


__all__ = ["MAX_ELEMENTS", "Band", "as_grid", "band_table", "evaluate", "fit_band"]
