"""Matching a program's subgraph against a template lowered from a JAX function, op for op.

A template is the StableHLO of a reference function (after hlofuse-prepare, like the program). Walking
both graphs from their roots, every template op must meet a user op with the same name, attributes,
result types and result index, whose operands match in turn; region bodies are compared through their
terminators, block arguments by position. The template's function arguments are the leaves: each binds
the user value found in its place. Template constants equal to a sentinel bind a parameter instead of
requiring equality, so one lowering matches every temperature, p or min-p: a float sentinel binds a float
constant, an integer one (a k the program compares a count with) an integer constant.

Since a match is the template's computation, op for op, a composite defined by the template is exactly
the user's subgraph (what the sampler fusion needs: the same PRNG bits, the same rounding).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from jaxlib.mlir import ir

from hlofuse.ir.match import defining_op

_TERMINATORS = ("stablehlo.return", "func.return")
# Ops whose two operands may come in either order with bit-identical results (IEEE addition and
# multiplication are commutative, NaN payloads aside): `logits + gumbel` computes what JAX's
# `gumbel + logits` does. Not maximum/minimum, whose result can tell -0 from +0 by operand order.
_COMMUTATIVE = ("stablehlo.add", "stablehlo.multiply", "stablehlo.and", "stablehlo.or")


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

    def differ(self, t: ir.Value, u: ir.Value) -> bool:
        """Records that `t` and `u` differ; False, for `return self.differ(...)`."""
        self.report.template, self.report.user = t, u
        return False

    def value(self, t: ir.Value, u: ir.Value) -> bool:
        if t in self.values:
            return self.values[t] == u or self.differ(t, u)
        if str(t.type) != str(u.type):
            return self.differ(t, u)
        if t in self.args:
            index = self.args[t]
            if self.result.leaves.setdefault(index, u) != u:
                return self.differ(t, u)
            self.values[t] = u
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
        self.values[t] = u
        return True

    def op(self, t: ir.Operation, u: ir.Operation) -> bool:
        if t in self.result.ops:
            return self.result.ops[t] == u
        if t.name != u.name or len(t.operands) != len(u.operands) or len(t.regions) != len(u.regions):
            return self._op_differs(t, u)
        if [str(r.type) for r in t.results] != [str(r.type) for r in u.results]:
            return self._op_differs(t, u)
        if not self._attributes(t, u):
            return self._op_differs(t, u)
        self.result.ops[t] = u
        self.report.matched = max(self.report.matched, len(self.result.ops))
        if not self._operands(t, u):
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

    def _save(self) -> tuple[dict, dict, dict, dict]:
        r = self.result
        return dict(self.values), dict(r.leaves), dict(r.params), dict(r.ops)

    def _restore(self, saved: tuple[dict, dict, dict, dict]) -> None:
        values, leaves, params, ops = saved
        self.values = values
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

    def _attributes(self, t: ir.Operation, u: ir.Operation) -> bool:
        t_attrs = {name: t.attributes[name] for name in t.attributes}
        u_attrs = {name: u.attributes[name] for name in u.attributes}
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
        return self.result.params.setdefault(name, splat[0]) == splat[0]


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
