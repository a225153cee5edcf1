"""Small composable matchers over StableHLO values, in the spirit of tinygrad's UPat and XLA's m::.

    P("stablehlo.exponential", P.any("x"), name="e")          # exp(x), binds x and e
    P.commutative("stablehlo.multiply", P.any("x"), P.const(name="c"))
    P.through(LAYOUT_OPS, P("stablehlo.dot_general", name="dot"))

`match(pattern, value)` returns the captures (a dict) or None. Captured values are `ir.Value`s, except
`P.const`, which binds the constant's float value. Patterns are data: a pass keeps them in a table of
`Rule`s and the driver counts hits per rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
from jaxlib.mlir import ir

Captures = dict[str, Any]

# Ops that only move or retype data: safe to look through where a pattern says so.
LAYOUT_OPS = ("stablehlo.reshape", "stablehlo.transpose", "stablehlo.broadcast_in_dim")
CONVERTS = ("stablehlo.convert",)


def defining_op(value: ir.Value) -> ir.Operation | None:
    """The operation producing `value`, or None for a block argument."""
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    return owner.operation


def op_name(value: ir.Value) -> str | None:
    op = defining_op(value)
    return op.name if op is not None else None


class Pat:
    """A pattern over one value. Subclasses implement `_match`; `name` binds the value when it matches."""

    name: str | None = None
    where: Callable[[Captures], bool] | None = None

    def match(self, value: ir.Value, captures: Captures) -> bool:
        trial = dict(captures)
        if not self._match(value, trial):
            return False
        if self.name is not None:
            if self.name in trial and trial[self.name] != self._bound(value, trial):
                return False
            trial[self.name] = self._bound(value, trial)
        if self.where is not None and not self.where(trial):
            return False
        captures.clear()
        captures.update(trial)
        return True

    def _bound(self, value: ir.Value, captures: Captures) -> Any:  # noqa: ANN401
        return value

    def _match(self, value: ir.Value, captures: Captures) -> bool:
        raise NotImplementedError


@dataclass(eq=False)
class OpPat(Pat):
    """An op by name (or any of several names) whose operands match in order (or either order)."""

    ops: tuple[str, ...]
    operands: tuple[Pat, ...] | None = None
    name: str | None = None
    where: Callable[[Captures], bool] | None = None
    commutative: bool = False

    def _match(self, value: ir.Value, captures: Captures) -> bool:
        op = defining_op(value)
        if op is None or op.name not in self.ops:
            return False
        if self.operands is None:
            return True
        actual = list(op.operands)
        if len(actual) != len(self.operands):
            return False
        orders = [actual, actual[::-1]] if self.commutative and len(actual) == 2 else [actual]
        for order in orders:
            trial = dict(captures)
            if all(p.match(v, trial) for p, v in zip(self.operands, order, strict=True)):
                captures.clear()
                captures.update(trial)
                return True
        return False


@dataclass(eq=False)
class AnyPat(Pat):
    name: str | None = None
    where: Callable[[Captures], bool] | None = None

    def _match(self, value: ir.Value, captures: Captures) -> bool:
        return True


@dataclass(eq=False)
class ConstPat(Pat):
    """A scalar constant, or a splat, or a constant expression such as sqrt(64) or 1/sqrt(d)."""

    value: float | None = None
    name: str | None = None
    where: Callable[[Captures], bool] | None = None

    def _match(self, value: ir.Value, captures: Captures) -> bool:
        folded = constant_scalar(value)
        if folded is None:
            return False
        return self.value is None or folded == self.value or (math.isnan(self.value) and math.isnan(folded))

    def _bound(self, value: ir.Value, captures: Captures) -> Any:  # noqa: ANN401
        return constant_scalar(value)


@dataclass(eq=False)
class ThroughPat(Pat):
    """Looks through any number of single-operand `ops` (e.g. converts) before matching `inner`."""

    ops: tuple[str, ...]
    inner: Pat
    name: str | None = None
    where: Callable[[Captures], bool] | None = None

    def _match(self, value: ir.Value, captures: Captures) -> bool:
        while True:
            trial = dict(captures)
            if self.inner.match(value, trial):
                captures.clear()
                captures.update(trial)
                return True
            op = defining_op(value)
            if op is None or op.name not in self.ops:
                return False
            value = op.operands[0]


@dataclass(eq=False)
class OneOfPat(Pat):
    options: tuple[Pat, ...] = field(default_factory=tuple)
    name: str | None = None
    where: Callable[[Captures], bool] | None = None

    def _match(self, value: ir.Value, captures: Captures) -> bool:
        return any(option.match(value, captures) for option in self.options)


class _PatternFactory:
    """`P(...)` builds OpPats; `P.any`, `P.const`, `P.commutative`, `P.through`, `P.one_of` the rest."""

    def __call__(
        self,
        ops: str | Sequence[str],
        *operands: Pat,
        name: str | None = None,
        where: Callable[[Captures], bool] | None = None,
    ) -> OpPat:
        names = (ops,) if isinstance(ops, str) else tuple(ops)
        return OpPat(names, operands or None, name, where)

    def commutative(
        self, ops: str | Sequence[str], a: Pat, b: Pat, *, name: str | None = None,
        where: Callable[[Captures], bool] | None = None,
    ) -> OpPat:
        names = (ops,) if isinstance(ops, str) else tuple(ops)
        return OpPat(names, (a, b), name, where, commutative=True)

    def any(self, name: str | None = None, where: Callable[[Captures], bool] | None = None) -> AnyPat:
        return AnyPat(name, where)

    def const(
        self, value: float | None = None, *, name: str | None = None, where: Callable[[Captures], bool] | None = None
    ) -> ConstPat:
        return ConstPat(value, name, where)

    def through(self, ops: Sequence[str], inner: Pat, *, name: str | None = None) -> ThroughPat:
        return ThroughPat(tuple(ops), inner, name)

    def one_of(self, *options: Pat, name: str | None = None) -> OneOfPat:
        return OneOfPat(options, name)


P = _PatternFactory()


def match(pattern: Pat, value: ir.Value) -> Captures | None:
    captures: Captures = {}
    return captures if pattern.match(value, captures) else None


@dataclass(frozen=True)
class Rule:
    """A named pattern and what to do with its captures; `apply` returns None when it does not apply."""

    name: str
    pattern: Pat
    rewrite: Callable[..., Any]

    def apply(self, value: ir.Value) -> Any:  # noqa: ANN401
        captures = match(self.pattern, value)
        if captures is None:
            return None
        return self.rewrite(**captures)


def first_rule(rules: Sequence[Rule], value: ir.Value) -> tuple[Rule, Any] | None:
    """The first rule whose pattern matches and whose rewrite accepts, with the rewrite's result."""
    for rule in rules:
        result = rule.apply(value)
        if result is not None:
            return rule, result
    return None


# ----- constant folding of scalar expressions -----------------------------------------------------

_UNARY_FOLDS: dict[str, Callable[[float], float]] = {
    "stablehlo.sqrt": math.sqrt,
    "stablehlo.rsqrt": lambda x: 1.0 / math.sqrt(x),
    "stablehlo.negate": lambda x: -x,
    "stablehlo.broadcast_in_dim": lambda x: x,
    "stablehlo.reshape": lambda x: x,
    "stablehlo.exponential": math.exp,
    "stablehlo.log": math.log,
}
_BINARY_FOLDS: dict[str, Callable[[float, float], float]] = {
    "stablehlo.multiply": lambda a, b: a * b,
    "stablehlo.divide": lambda a, b: a / b,
    "stablehlo.add": lambda a, b: a + b,
    "stablehlo.subtract": lambda a, b: a - b,
    "stablehlo.power": lambda a, b: a**b,
    "stablehlo.maximum": max,
    "stablehlo.minimum": min,
}


def dense_values(value: ir.Value) -> np.ndarray | None:
    """The elements of a `stablehlo.constant`, or None."""
    op = defining_op(value)
    if op is None or op.name != "stablehlo.constant":
        return None
    attr = op.attributes["value"]
    try:
        return np.array(attr)
    except (TypeError, ValueError):
        pass
    if isinstance(attr, ir.DenseElementsAttr) and attr.is_splat:
        return np.array(_splat_scalar(attr.get_splat_value()))
    return None


def _splat_scalar(attr: ir.Attribute) -> float:
    if isinstance(attr, ir.FloatAttr):
        return attr.value
    if isinstance(attr, ir.IntegerAttr):
        return attr.value
    if isinstance(attr, ir.BoolAttr):
        return float(attr.value)
    return float(ir.FloatAttr(attr).value)


def constant_scalar(value: ir.Value, depth: int = 8) -> float | None:
    """Folds a splat constant or a small expression of them (sqrt(64), 1/sqrt(d)) to a float."""
    op = defining_op(value)
    if op is None or depth == 0:
        return None
    if op.name == "stablehlo.constant":
        attr = op.attributes["value"]
        if isinstance(attr, ir.DenseElementsAttr) and attr.is_splat:
            try:
                return float(_splat_scalar(attr.get_splat_value()))
            except (TypeError, ValueError):
                return None
        return None
    if op.name == "stablehlo.convert":
        inner = constant_scalar(op.operands[0], depth - 1)
        return None if inner is None else round_to_type(inner, ir.RankedTensorType(op.results[0].type).element_type)
    if op.name in _UNARY_FOLDS and len(op.operands) == 1:
        inner = constant_scalar(op.operands[0], depth - 1)
        if inner is None:
            return None
        try:
            return float(_UNARY_FOLDS[op.name](inner))
        except (ValueError, ZeroDivisionError, OverflowError):
            return None
    if op.name in _BINARY_FOLDS and len(op.operands) == 2:
        a = constant_scalar(op.operands[0], depth - 1)
        b = constant_scalar(op.operands[1], depth - 1)
        if a is None or b is None:
            return None
        try:
            return float(_BINARY_FOLDS[op.name](a, b))
        except (ValueError, ZeroDivisionError, OverflowError):
            return None
    return None


def round_to_type(value: float, element_type: ir.Type) -> float:
    """`value` as `element_type` holds it: -1e9 converted to f16 is -inf, 0.3 to bf16 is 0.30078125."""
    name = str(element_type)
    with np.errstate(over="ignore"):
        if name == "f16":
            return float(np.float16(value))
        if name == "bf16":
            return float(np.array(value, dtype=np.float32).astype(ml_dtypes.bfloat16))
        if name == "f32":
            return float(np.float32(value))
    if isinstance(element_type, ir.IntegerType):
        if element_type.width == 1:
            return float(bool(value))
        return float(int(value)) if math.isfinite(value) else value
    return value
