"""Matching a program's subgraph against a template lowered from a JAX function, op for op.

A template is the StableHLO of a reference function (after hlofuse-prepare, like the program). Walking
both graphs from their roots, every template op must meet a user op with the same name, attributes,
result types and result index, whose operands match in turn; region bodies are compared through their
terminators, block arguments by position. The template's function arguments are the leaves: each binds
the user value found in its place. Template constants equal to a sentinel bind a parameter instead of
requiring equality, so one lowering matches every temperature, p or min-p: a float sentinel binds a float
constant, an integer one (a k the program compares a count with) an integer constant.

A compare of a value with a bound constant also matches the compare one step of strictness away, the constant one
step along its type's number line: for x and q of one float type, x >= q is x > prev(q) and x <= q is x < next(q)
(q finite, normal and nonzero, never moved onto or across +-1: NaN compares false either way; integers are not
moved: a form may read k - 1 = 0 as no top-k, a branch its template never took). The parameter then
binds the moved constant, so the form computes the program's compare: a top-p written `>= p` is the `> p` form at the
float below p (`strictness_step`).

Since a match is the template's computation, op for op, a composite defined by the template is exactly
the user's subgraph (what the sampler fusion needs: the same PRNG bits, the same rounding).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from jaxlib.mlir import ir

from hlofuse.ir.mask_eval import comparison_direction
from hlofuse.ir.match import defining_op

_TERMINATORS = ("stablehlo.return", "func.return")
# Ops whose two operands may come in either order with bit-identical results (IEEE addition and
# multiplication are commutative, NaN payloads aside): `logits + gumbel` computes what JAX's
# `gumbel + logits` does. Not maximum/minimum, whose result can tell -0 from +0 by operand order.
_COMMUTATIVE = ("stablehlo.add", "stablehlo.multiply", "stablehlo.and", "stablehlo.or")
# Each comparison direction and the one a step of strictness away (x > q is x >= next(q)).
_STRICTNESS = {"GT": "GE", "GE": "GT", "LT": "LE", "LE": "LT"}
# The float types whose constants a step moves (integers never: a form may read k - 1 = 0 as no top-k).
_STEPPED_FLOATS = ("f32", "f64", "f16", "bf16")


@dataclass
class MatchReport:
    """Where a failed match stopped: how many template ops had matched, and the template value and the user
    value last found to differ (either None where one side has no op there)."""

    matched: int = 0
    template: ir.Value | None = None
    user: ir.Value | None = None


@dataclass
class TemplateMatch:
    leaves: dict[int, ir.Value] = field(default_factory=dict)  # template argument number -> user value
    params: dict[str, float] = field(default_factory=dict)
    ops: dict[ir.Operation, ir.Operation] = field(default_factory=dict)  # template op -> user op


def _splat(op: ir.Operation) -> tuple[float, ir.Type] | None:
    """The value of a splat float or integer constant, and its element type."""
    attr = op.attributes["value"]
    if not isinstance(attr, ir.DenseElementsAttr) or not attr.is_splat:
        return None
    element = ir.ShapedType(attr.type).element_type
    try:
        if isinstance(element, ir.FloatType):
            return float(ir.FloatAttr(attr.get_splat_value()).value), element
        if isinstance(element, ir.IntegerType) and element.width > 1:
            return ir.IntegerAttr(attr.get_splat_value()).value, element
    except (TypeError, ValueError):
        return None
    return None


def _binds(sentinel: float, splat: tuple[float, ir.Type]) -> bool:
    """Whether a template constant `splat` is `sentinel`: a float sentinel rounded to a float constant's type, an
    integer sentinel as an integer constant."""
    value, element = splat
    if isinstance(element, ir.IntegerType):
        return isinstance(sentinel, int) and sentinel == value
    return not isinstance(sentinel, int) and float(np.asarray(sentinel, _np_dtype(element))) == value


def _np_dtype(element_type: ir.Type) -> np.dtype:
    import ml_dtypes

    names = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
    return np.dtype(names.get(str(element_type), np.float32))


class _Matcher:
    def __init__(self, template_args: list[ir.Value], sentinels: Mapping[str, float]) -> None:
        self.args = {arg: i for i, arg in enumerate(template_args)}
        self.sentinels = sentinels
        self.values: dict[ir.Value, ir.Value] = {}
        self.result = TemplateMatch()
        self.report = MatchReport()
        self.step = 0  # while matching a compared constant one step of strictness away: -1 or +1 (`strictness_step`)
        self.stepped = False  # whether a parameter bound a constant moved by that step
        self.stepped_values: dict[ir.Value, int] = {}  # template values matched under a step, and its sign

    def differ(self, t: ir.Value, u: ir.Value) -> bool:
        """Records that `t` and `u` differ; False, for `return self.differ(...)`."""
        self.report.template, self.report.user = t, u
        return False

    def value(self, t: ir.Value, u: ir.Value) -> bool:
        if t in self.values:  # (a value matched under a strictness step means the moved constant: only there)
            if self.stepped_values.get(t, 0) != self.step:
                return self.differ(t, u)
            self.stepped = self.stepped or bool(self.step)
            return self.values[t] == u or self.differ(t, u)
        if str(t.type) != str(u.type):
            return self.differ(t, u)
        if t in self.args:
            index = self.args[t]
            if self.result.leaves.setdefault(index, u) != u:
                return self.differ(t, u)
            self._matched(t, u)
            return True
        t_op, u_op = defining_op(t), defining_op(u)
        if t_op is None or u_op is None:
            return self.differ(t, u)  # region block arguments are bound before their bodies are compared
        if ir.OpResult(t).result_number != ir.OpResult(u).result_number:
            return self.differ(t, u)
        if not self.op(t_op, u_op):
            if self.report.template is None:
                self.differ(t, u)
            return False
        self._matched(t, u)
        return True

    def _matched(self, t: ir.Value, u: ir.Value) -> None:
        self.values[t] = u
        if self.step:
            self.stepped_values[t] = self.step

    def op(self, t: ir.Operation, u: ir.Operation) -> bool:
        if t in self.result.ops:
            return self.result.ops[t] == u
        if t.name != u.name or len(t.operands) != len(u.operands) or len(t.regions) != len(u.regions):
            return self._op_differs(t, u)
        if [str(r.type) for r in t.results] != [str(r.type) for r in u.results]:
            return self._op_differs(t, u)
        step = strictness_step(t, u) if t.name == "stablehlo.compare" else None
        if not self._attributes(t, u, ignore=("comparison_direction",) if step else ()):
            return self._op_differs(t, u)
        self.result.ops[t] = u
        self.report.matched = max(self.report.matched, len(self.result.ops))
        if not (self._stepped_operands(t, u, *step) if step else self._operands(t, u)):
            return False
        return all(self._region(a, b) for a, b in zip(t.regions, u.regions, strict=True))

    def _op_differs(self, t: ir.Operation, u: ir.Operation) -> bool:
        self.report.template = t.results[0] if len(t.results) else None
        self.report.user = u.results[0] if len(u.results) else None
        return False

    def _operands(self, t: ir.Operation, u: ir.Operation) -> bool:
        """Operands in order or, for a commutative op, swapped (undoing what the first try bound)."""
        t_operands, u_operands = list(t.operands), list(u.operands)
        if t.name not in _COMMUTATIVE or len(t_operands) != 2:
            return all(self.value(a, b) for a, b in zip(t_operands, u_operands, strict=True))
        saved = self._save()
        if all(self.value(a, b) for a, b in zip(t_operands, u_operands, strict=True)):
            return True
        self._restore(saved)
        return all(self.value(a, b) for a, b in zip(t_operands, reversed(u_operands), strict=True))

    def _stepped_operands(self, t: ir.Operation, u: ir.Operation, constant: int, step: int) -> bool:
        """A compare's operands where the template's is a step of strictness from the user's: the other operand as
        ever, operand `constant` binding a parameter at the user's constant moved by `step`."""
        if not self.value(t.operands[1 - constant], u.operands[1 - constant]):
            return False
        self.step, self.stepped = step, False
        try:
            return self.value(t.operands[constant], u.operands[constant]) and self.stepped
        finally:
            self.step = 0

    def _save(self) -> tuple[dict, ...]:
        r = self.result
        return dict(self.values), dict(r.leaves), dict(r.params), dict(r.ops), dict(self.stepped_values)

    def _restore(self, saved: tuple[dict, ...]) -> None:
        values, leaves, params, ops, stepped_values = saved
        self.values, self.stepped_values = values, stepped_values
        self.result.leaves, self.result.params, self.result.ops = leaves, params, ops

    def _region(self, t: ir.Region, u: ir.Region) -> bool:
        t_blocks, u_blocks = list(t.blocks), list(u.blocks)
        if len(t_blocks) != 1 or len(u_blocks) != 1:
            return False
        t_block, u_block = t_blocks[0], u_blocks[0]
        if len(t_block.arguments) != len(u_block.arguments):
            return False
        for a, b in zip(t_block.arguments, u_block.arguments, strict=True):
            if str(a.type) != str(b.type):
                return False
            self.values[a] = b
        t_term, u_term = list(t_block.operations)[-1].operation, list(u_block.operations)[-1].operation
        if t_term.name not in _TERMINATORS:
            return False
        return self.op(t_term, u_term)

    def _attributes(self, t: ir.Operation, u: ir.Operation, ignore: tuple[str, ...] = ()) -> bool:
        t_attrs = {name: t.attributes[name] for name in t.attributes if name not in ignore}
        u_attrs = {name: u.attributes[name] for name in u.attributes if name not in ignore}
        if set(t_attrs) != set(u_attrs):
            return False
        if t.name == "stablehlo.constant":
            splat = _splat(t)
            if splat is not None:
                for name, sentinel in self.sentinels.items():
                    if _binds(sentinel, splat):
                        return self._bind(name, u)
        return all(str(t_attrs[name]) == str(u_attrs[name]) for name in t_attrs)

    def _bind(self, name: str, u: ir.Operation) -> bool:
        splat = _splat(u)
        if splat is None:
            return False
        value = splat[0]
        if self.step:
            value = _stepped(splat, self.step)
            if value is None:
                return False
            self.stepped = True
        return self.result.params.setdefault(name, value) == value


def _compared_constant(value: ir.Value) -> ir.Operation | None:
    """The constant a compare operand is: a splat constant, or a broadcast of a 0-d one."""
    op = defining_op(value)
    if op is not None and op.name == "stablehlo.broadcast_in_dim":
        op = defining_op(op.operands[0])
    return op if op is not None and op.name == "stablehlo.constant" and _splat(op) is not None else None


def strictness_step(t: ir.Operation, u: ir.Operation) -> tuple[int, int] | None:
    """(operand, step) where template compare `t` and user compare `u` are one step of strictness apart (GT and GE,
    LT and LE) and both compare a value with a constant (operand 0 or 1 of each, a splat or a broadcast of a 0-d
    constant): the template's constant binds the user's moved by `step`, -1 (to the one below) or +1, so that the two
    compares agree everywhere (x >= q is x > prev(q); q >= x is next(q) > x). Floats of _STEPPED_FLOATS only; None
    for any other pair."""
    directions = comparison_direction(t), comparison_direction(u)
    if _STRICTNESS.get(directions[1]) != directions[0]:
        return None
    if str(ir.RankedTensorType(t.operands[0].type).element_type) not in _STEPPED_FLOATS:
        return None
    for constant in (1, 0):
        if all(_compared_constant(op.operands[constant]) is not None and _compared_constant(
                op.operands[1 - constant]) is None for op in (t, u)):
            step = -1 if directions[0] in ("GT", "LE") else 1
            return constant, step if constant == 1 else -step
    return None


def _stepped(splat: tuple[float, ir.Type], step: int) -> float | None:
    """A float constant moved to the adjacent float of its type, or None where the step would leave the normal,
    finite numbers (where a flushed subnormal or an infinity would compare otherwise) or land on or cross 0 or +-1:
    a form's function may read those as no filter at all (p = 1), a branch its template never took. (`strictness_step`
    takes floats of _STEPPED_FLOATS alone.)"""
    value, element = splat
    dtype = _np_dtype(element)
    q = np.asarray(value, dtype)
    moved = np.asarray(np.nextafter(q, np.asarray(np.inf if step > 0 else -np.inf, dtype)), dtype)
    tiny = float(np.finfo(dtype).tiny)
    if not all(np.isfinite(v) and abs(float(v)) >= tiny for v in (q, moved)):
        return None
    if any(float(v) in (1.0, -1.0) for v in (q, moved)) or any(
            (float(q) < edge) != (float(moved) < edge) for edge in (-1.0, 1.0)):
        return None
    return float(moved)


def match_template(user_root: ir.Value, template_root: ir.Value, template_args: list[ir.Value],
                   sentinels: Mapping[str, float], report: MatchReport | None = None) -> TemplateMatch | None:
    """The user subgraph at `user_root` as an instance of the template, or None (and then, if given,
    `report` says where the match stopped)."""
    matcher = _Matcher(template_args, sentinels)
    if matcher.value(template_root, user_root) and len(matcher.result.leaves) == len(template_args):
        return matcher.result
    if report is not None:
        report.matched, report.template, report.user = (matcher.report.matched, matcher.report.template,
                                                        matcher.report.user)
    return None
