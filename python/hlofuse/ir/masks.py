"""Reads a boolean mask expression as a conjunction of index constraints.

Attention masks are built from iotas, constants and per-sequence lengths, e.g. causal is
`iota(T)[:, None] >= iota(S)[None, :]`. `analyze_mask` evaluates such an expression symbolically:
every integer tensor becomes an affine form `sum(coeff * index[role]) + const (+ ext)` over the
labelled dims (see hlofuse.ir.layout), every comparison becomes an `Atom`, and anything it cannot
read becomes an `Opaque` leaf — a boolean tensor that stays an explicit mask operand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from jaxlib.mlir import ir

from hlofuse.ir import layout
from hlofuse.ir.layout import Labels, Sizes
from hlofuse.ir.mask_eval import comparison_direction, evaluate
from hlofuse.ir.match import constant_scalar, defining_op, dense_values

_LAYOUT = ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.transpose", "stablehlo.convert")
_FLIP = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "EQ": "EQ", "NE": "NE"}
_NEGATE = {"LT": "GE", "LE": "GT", "GT": "LE", "GE": "LT", "EQ": "NE", "NE": "EQ"}


@dataclass(frozen=True)
class Ext:
    """An external integer tensor (lengths, positions) that varies at most along the batch role."""

    value: ir.Value
    labels: Labels


@dataclass(frozen=True)
class Affine:
    coeffs: tuple[tuple[str, int], ...] = ()
    const: int = 0
    ext: Ext | None = None
    ext_sign: int = 0

    def coeff(self, role: str) -> int:
        return dict(self.coeffs).get(role, 0)

    def scaled(self, k: int) -> Affine:
        return Affine(tuple((r, c * k) for r, c in self.coeffs), self.const * k, self.ext, self.ext_sign * k)

    def plus(self, other: Affine) -> Affine | None:
        if self.ext is not None and other.ext is not None:
            return None
        merged = dict(self.coeffs)
        for role, c in other.coeffs:
            merged[role] = merged.get(role, 0) + c
        coeffs = tuple(sorted((r, c) for r, c in merged.items() if c))
        ext, sign = (self.ext, self.ext_sign) if self.ext is not None else (other.ext, other.ext_sign)
        return Affine(coeffs, self.const + other.const, ext, sign)


@dataclass(frozen=True)
class Atom:
    """`lhs - rhs <direction> 0` as an affine form; `value` is the compare's result, which is the
    constraint itself, or its negation when `negated` (the direction is already flipped)."""

    diff: Affine
    direction: str
    value: ir.Value
    labels: Labels
    negated: bool = False


@dataclass(frozen=True)
class Opaque:
    """A boolean tensor hlofuse does not read: it becomes (part of) the explicit mask operand.

    `negated`: the visible entries are where `value` is false (`where(pred, fill, s)` masks).
    """

    value: ir.Value
    labels: Labels
    negated: bool = False
    zero_one: bool = False  # `value` is a number that is 0 or 1 (visible where it is not 0)


@dataclass
class MaskTerms:
    atoms: list[Atom] = field(default_factory=list)
    opaque: list[Opaque] = field(default_factory=list)
    always_false: bool = False


def analyze_mask(pred: ir.Value, labels: Labels, sizes: Sizes, *, negated: bool = False) -> MaskTerms:
    """The conjunction of constraints that makes an entry visible: `pred`, or `not pred` if `negated`."""
    terms = MaskTerms()
    _conjuncts(pred, labels, sizes, terms, negated)
    return terms


def _conjuncts(value: ir.Value, labels: Labels, sizes: Sizes, terms: MaskTerms, negated: bool) -> None:
    op = defining_op(value)
    name = op.name if op is not None else None
    if name == "stablehlo.constant":
        folded = constant_scalar(value)
        if folded is not None:
            if bool(folded) == negated:
                terms.always_false = True
            return
    # a & b is a conjunction; so is not(a | b) = not a & not b.
    if (name == "stablehlo.and" and not negated) or (name == "stablehlo.or" and negated):
        for operand in op.operands:
            _conjuncts(operand, labels, sizes, terms, negated)
        return
    if name == "stablehlo.not":
        _conjuncts(op.operands[0], labels, sizes, terms, not negated)
        return
    if name == "stablehlo.select" and op is not None and _select_conjuncts(op, labels, sizes, terms, negated):
        return
    if name == "stablehlo.compare" and op is not None and _nonzero_conjuncts(op, labels, sizes, terms, negated):
        return
    inner = _see_through(op, labels, sizes)
    if inner is not None:
        _conjuncts(op.operands[0], inner, sizes, terms, negated)
        return
    atom = _atom(value, labels, sizes, negated)
    if atom is not None:
        terms.atoms.append(atom)
        return
    terms.opaque.append(Opaque(value, labels, negated))


def _see_through(op: ir.Operation | None, labels: Labels, sizes: Sizes) -> Labels | None:
    """Operand labels of a layout op, or of a dynamic_slice that takes its whole operand at offset 0."""
    if op is None:
        return None
    if op.name in _LAYOUT:
        return layout.backward(op, labels, sizes)
    if (op.name == "stablehlo.dynamic_slice"
            and all(constant_scalar(index) == 0.0 for index in list(op.operands)[1:])
            and list(ir.DenseI64ArrayAttr(op.attributes["slice_sizes"])) == list(layout.static_shape(op.operands[0])
                                                                                 or ())):
        return labels
    return None


def _select_conjuncts(op: ir.Operation, labels: Labels, sizes: Sizes, terms: MaskTerms, negated: bool) -> bool:
    """Boolean selects with a constant branch: select(p, x, c) and select(p, c, x)."""
    pred, on_true, on_false = op.operands
    true_const, false_const = constant_scalar(on_true), constant_scalar(on_false)
    if false_const is not None and not negated and not false_const:
        # select(p, x, false) == p & x
        _conjuncts(pred, labels, sizes, terms, False)
        _conjuncts(on_true, labels, sizes, terms, False)
        return True
    if true_const is not None and not negated and not true_const:
        # select(p, false, x) == not p & x
        _conjuncts(pred, labels, sizes, terms, True)
        _conjuncts(on_false, labels, sizes, terms, False)
        return True
    if true_const is not None and negated and true_const:
        # not select(p, true, x) == not p & not x
        _conjuncts(pred, labels, sizes, terms, True)
        _conjuncts(on_false, labels, sizes, terms, True)
        return True
    if false_const is not None and negated and false_const:
        # not select(p, x, true) == p & not x
        _conjuncts(pred, labels, sizes, terms, False)
        _conjuncts(on_true, labels, sizes, terms, True)
        return True
    return False


def _nonzero_conjuncts(op: ir.Operation, labels: Labels, sizes: Sizes, terms: MaskTerms, negated: bool) -> bool:
    """`x != 0` / `x == 0` where x is a 0/1 number built from booleans (keras builds masks that way)."""
    direction = comparison_direction(op)
    lhs, rhs = op.operands
    # For a 0/1 number x: x > 0 and 0 < x are x != 0; x <= 0 and 0 >= x are x == 0.
    if constant_scalar(rhs) == 0.0:
        number, direction = lhs, {"GT": "NE", "LE": "EQ"}.get(direction, direction)
    elif constant_scalar(lhs) == 0.0:
        number, direction = rhs, {"LT": "NE", "GE": "EQ"}.get(direction, direction)
    else:
        return False
    if direction not in ("NE", "EQ"):
        return False
    trial = MaskTerms()
    if not _zero_one_conjuncts(number, labels, sizes, trial, negated == (direction == "NE")):
        return False
    terms.atoms += trial.atoms
    terms.opaque += trial.opaque
    terms.always_false |= trial.always_false
    return True


def _zero_one_conjuncts(value: ir.Value, labels: Labels, sizes: Sizes, terms: MaskTerms, negated: bool) -> bool:
    """Reads a number known to be 0 or 1: convert(bool), min/mul (and), max (or). False if it cannot."""
    op = defining_op(value)
    if op is None:
        return False
    if op.name == "stablehlo.constant":
        folded = constant_scalar(value)
        if folded not in (0.0, 1.0):
            return False
        if bool(folded) == negated:
            terms.always_false = True
        return True
    if op.name == "stablehlo.convert" and _is_bool(op.operands[0]):
        _conjuncts(op.operands[0], labels, sizes, terms, negated)
        return True
    if op.name == "stablehlo.convert":
        return _zero_one_conjuncts(op.operands[0], labels, sizes, terms, negated)
    if op.name == "stablehlo.subtract" and constant_scalar(op.operands[0]) == 1.0:
        # 1 - x is 1 where x is 0: the same table, the other way round.
        return _zero_one_conjuncts(op.operands[1], labels, sizes, terms, not negated)
    if (op.name in ("stablehlo.minimum", "stablehlo.multiply") and not negated) or (
            op.name == "stablehlo.maximum" and negated):
        return all(_zero_one_conjuncts(operand, labels, sizes, terms, negated) for operand in op.operands)
    inner = _see_through(op, labels, sizes)
    if inner is not None:
        return _zero_one_conjuncts(op.operands[0], inner, sizes, terms, negated)
    array = evaluate(value)
    if array is not None and np.isin(array, (0, 1)).all():
        # A 0/1 table computed from iotas and constants (tril(ones) - tril(ones, -w)): evaluated later.
        terms.opaque.append(Opaque(value, labels, negated, zero_one=True))
        return True
    return False


def analyze_zero_one(value: ir.Value, labels: Labels, sizes: Sizes, *, visible_when_zero: bool) -> MaskTerms | None:
    """The conjunction that makes an entry visible, for a number known to be 0 or 1 (`(1 - m) * fill` is a
    mask visible where the number is 0); None if it is not readable as one."""
    terms = MaskTerms()
    return terms if _zero_one_conjuncts(value, labels, sizes, terms, visible_when_zero) else None


def _is_bool(value: ir.Value) -> bool:
    etype = ir.RankedTensorType(value.type).element_type
    return isinstance(etype, ir.IntegerType) and etype.width == 1


def _atom(value: ir.Value, labels: Labels, sizes: Sizes, negated: bool = False) -> Atom | None:
    op = defining_op(value)
    if op is None:
        return None
    if op.name == "stablehlo.not":
        return _atom(op.operands[0], labels, sizes, not negated)
    if op.name != "stablehlo.compare":
        return None
    direction = comparison_direction(op)
    if direction not in _FLIP:
        return None
    lhs = _affine(op.operands[0], labels, sizes)
    rhs = _affine(op.operands[1], labels, sizes)
    if lhs is None or rhs is None:
        return None
    diff = lhs.plus(rhs.scaled(-1))
    if diff is None:
        return None
    return Atom(diff, _NEGATE[direction] if negated else direction, value, labels, negated)


def _affine(value: ir.Value, labels: Labels, sizes: Sizes, depth: int = 24) -> Affine | None:
    if depth == 0:
        return None
    vtype = value.type
    if not isinstance(vtype, ir.RankedTensorType) or not isinstance(vtype.element_type, (ir.IntegerType, ir.FloatType)):
        return None
    if _is_bool(value):
        return None
    op = defining_op(value)
    name = op.name if op is not None else None
    if name == "stablehlo.constant":
        return _affine_constant(value, labels)
    if name == "stablehlo.iota":
        label = labels[ir.IntegerAttr(op.attributes["iota_dimension"]).value]
        if len(label) > 1:
            return None
        return Affine(((label[0], 1),)) if label else Affine()
    if name in _LAYOUT and op is not None:
        inner = layout.backward(op, labels, sizes)
        if inner is not None:
            return _affine(op.operands[0], inner, sizes, depth - 1)
    if name in ("stablehlo.add", "stablehlo.subtract") and op is not None:
        a = _affine(op.operands[0], labels, sizes, depth - 1)
        b = _affine(op.operands[1], labels, sizes, depth - 1)
        if a is None or b is None:
            return None
        return a.plus(b if name == "stablehlo.add" else b.scaled(-1))
    if name == "stablehlo.negate" and op is not None:
        inner_affine = _affine(op.operands[0], labels, sizes, depth - 1)
        return inner_affine.scaled(-1) if inner_affine is not None else None
    if name == "stablehlo.multiply" and op is not None:
        for this, other in ((0, 1), (1, 0)):
            factor = constant_scalar(op.operands[other])
            if factor is not None and float(factor).is_integer():
                inner_affine = _affine(op.operands[this], labels, sizes, depth - 1)
                return inner_affine.scaled(int(factor)) if inner_affine is not None else None
        return None
    # Anything else is external data: fine if it is an integer that varies only along the batch (a float
    # bound would not survive the lengths operand's int32).
    if isinstance(vtype.element_type, ir.IntegerType) and all(label in ((), ("B",)) for label in labels):
        return Affine(ext=Ext(value, labels), ext_sign=1)
    return None


def _affine_constant(value: ir.Value, labels: Labels) -> Affine | None:
    folded = constant_scalar(value)
    if folded is not None:
        # Positions in float (keras builds iotas in f32) are exact integers up to 2**24.
        return Affine(const=int(folded)) if float(folded).is_integer() and abs(folded) < 2**24 else None
    array = dense_values(value)
    if array is None:
        return None
    varying = [d for d in range(array.ndim) if array.shape[d] > 1]
    if len(varying) != 1 or len(labels[varying[0]]) != 1:
        return None
    axis = varying[0]
    line = np.moveaxis(array, axis, 0).reshape(array.shape[axis], -1)[:, 0].astype(np.int64)
    step = int(line[1] - line[0])
    if not np.array_equal(line, line[0] + step * np.arange(len(line))):
        return None
    expected = np.broadcast_to(
        (line[0] + step * np.arange(len(line))).reshape([-1 if d == axis else 1 for d in range(array.ndim)]),
        array.shape,
    )
    if not np.array_equal(array, expected):
        return None
    return Affine(((labels[axis][0], step),), int(line[0])) if step else Affine(const=int(line[0]))
