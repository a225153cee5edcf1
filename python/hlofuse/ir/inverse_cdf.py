"""Inverse-CDF draws: a uniform from random bits searched in a cumulative sum.

`jax.random.choice(key, n, p=p, replace=True)` draws `searchsorted(cumsum(p), cumsum(p)[-1] * (1 - u))`, and
`torch.multinomial(probs, 1, replacement=True)` under torchax is that draw for each row, with one key for all
(gemma_pytorch's sampler). A hand-written `searchsorted(cumsum(probs), uniform(key))`, or `sum(cumsum < u)`, is the
same draw. However the search is written (JAX's bisection loop, a sort, a compare against every prefix), it starts
where the uniform meets the cumulative sum, and that op is what `inverse_cdf_draws` finds:

    %u = bitcast_convert(or(shift_right_logical(bits, 9), 0x3f800000)) - 1     a uniform, as jax.random.uniform
    %c = reduce_window add (window: the whole dim, padded before)               a cumulative sum, as jnp.cumsum
    %r = multiply(slice(%c, last), 1 - %u)                                      <- the draw: the two meet here

The walk from the uniform follows only arithmetic that keeps it a quantile (`_QUANTILE_OPS`). A uniform that passes
through a log is noise (Gumbel: `-log(-log(u))`; an exponential: `-log1p(-u)`), so a top-p filter (a cumulative sum)
with Gumbel noise added to its output is a categorical draw, not one of these; a uniform compared with a constant is
a mask (dropout), whose selections may meet positions counted by a cumulative sum further on, and are no draw.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from jaxlib.mlir import ir

from hlofuse.ir.match import constant_scalar, defining_op

__all__ = ["InverseCdfDraw", "cumulative_sum_axis", "inverse_cdf_draws", "is_uniform_from_bits"]

# The bit pattern of 1.0 in each float type JAX draws uniforms in: the mantissa's random bits are or'ed into it
# (a float in [1, 2)) before the 1 is taken off.
_ONE_BITS = {"f32": 0x3F800000, "bf16": 0x3F80, "f16": 0x3C00, "f64": 0x3FF0000000000000}
# What a quantile goes through on its way to the search: arithmetic that keeps it a number in proportion to the
# uniform (JAX's scaling to [minval, maxval), torchax's `1 - u`, the total it is scaled by), and moves. Anything else
# ends the walk: a log makes it noise (Gumbel, an exponential), a compare a mask (dropout's `u < keep`), and what a
# mask selects is no quantile either.
_QUANTILE_OPS = ("stablehlo.add", "stablehlo.subtract", "stablehlo.multiply", "stablehlo.divide", "stablehlo.maximum",
                 "stablehlo.minimum", "stablehlo.negate", "stablehlo.clamp", "stablehlo.convert",
                 "stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.slice", "stablehlo.transpose",
                 "stablehlo.concatenate")
_FORWARD_LIMIT = 400  # ops walked forward from one uniform


@dataclass(frozen=True)
class InverseCdfDraw:
    """Where a uniform meets a cumulative sum (`op`), with the ops that made each (the uniform's bitcast, the sum's
    reduce_window), and how many other ops the same uniform meets a cumulative sum at (`others`: the other rows of a
    draw unrolled per row)."""

    op: ir.Operation
    uniform: ir.Operation
    cumulative: ir.Operation
    others: int = 0


def _ints(op: ir.Operation, name: str) -> list[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes[name])) if name in op.attributes else []


def cumulative_sum_axis(op: ir.Operation) -> int | None:
    """The axis `op` sums cumulatively along, if it is jnp.cumsum's lowering: a `reduce_window` of an add from 0
    whose window spans one whole dim, padded before by its size less one, with stride 1; else None."""
    if op.name != "stablehlo.reduce_window" or len(op.operands) != 2:
        return None
    body = [o.operation.name for o in op.regions[0].blocks[0].operations]
    if body != ["stablehlo.add", "stablehlo.return"]:
        return None
    if constant_scalar(op.operands[1]) != 0:
        return None
    shape = list(ir.RankedTensorType(op.operands[0].type).shape)
    window = _ints(op, "window_dimensions")
    strides = _ints(op, "window_strides") or [1] * len(window)
    if "padding" not in op.attributes or set(strides) != {1}:
        return None
    padding = np.array(ir.DenseIntElementsAttr(op.attributes["padding"])).reshape(-1, 2).tolist()
    axes = [d for d, size in enumerate(window) if size > 1]
    if len(axes) != 1 or window[axes[0]] != shape[axes[0]] or padding[axes[0]] != [shape[axes[0]] - 1, 0]:
        return None
    if any(pad != [0, 0] for d, pad in enumerate(padding) if d != axes[0]):
        return None
    return axes[0]


def is_uniform_from_bits(op: ir.Operation) -> bool:
    """Whether `op` makes floats in [1, 2) from random bits, as jax.random.uniform does: a `bitcast_convert` from
    unsigned integers of an `or` with the bit pattern of 1.0."""
    if op.name != "stablehlo.bitcast_convert":
        return False
    source, target = (ir.RankedTensorType(v.type) for v in (op.operands[0], op.results[0]))
    if not (isinstance(source.element_type, ir.IntegerType) and source.element_type.is_unsigned):
        return False
    one = _ONE_BITS.get(str(target.element_type))
    merged = defining_op(op.operands[0])
    if one is None or merged is None or merged.name != "stablehlo.or":
        return False
    return any(constant_scalar(operand) == one for operand in merged.operands)


def _fed_by_cumulative_sums(function: ir.Operation) -> dict[ir.Value, ir.Operation]:
    """Each value of `function` that a cumulative sum computes (looking back), with that sum: one walk forward over
    the ops (each is visited after the ops that define its operands)."""
    fed: dict[ir.Value, ir.Operation] = {}

    def visit(op: ir.Operation) -> ir.WalkResult:
        source = op if cumulative_sum_axis(op) is not None else next(
            (fed[v] for v in op.operands if v in fed), None)
        if source is not None:
            fed.update((result, source) for result in op.results)
        return ir.WalkResult.ADVANCE

    function.walk(visit, ir.WalkOrder.PRE_ORDER)
    return fed


def _meetings(uniform: ir.Operation, sums: dict[ir.Value, ir.Operation]) -> Iterator[tuple[ir.Operation, ir.Operation]]:
    """The ops where values computed from `uniform` (through _QUANTILE_OPS only) meet a cumulative sum, nearest first,
    with that sum; the walk goes no further past a meeting."""
    reached: set[ir.Value] = set(uniform.results)
    queue = deque(uniform.results)
    visited: set[ir.Operation] = set()
    while queue and len(visited) < _FORWARD_LIMIT:
        for use in queue.popleft().uses:
            user = use.owner.operation
            if user in visited:
                continue
            visited.add(user)
            others = [operand for operand in user.operands if operand not in reached]
            cumulative = next((sums[v] for v in others if v in sums), None)
            if cumulative is not None:
                yield user, cumulative
                continue
            if user.name not in _QUANTILE_OPS:
                continue
            for result in user.results:
                reached.add(result)
                queue.append(result)


def inverse_cdf_draws(function: ir.Operation) -> list[InverseCdfDraw]:
    """Every inverse-CDF draw in `function`: one per uniform, at the first op where it meets a cumulative sum (the
    others it meets one at are counted: a draw unrolled per row)."""
    uniforms: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if is_uniform_from_bits(op):
            uniforms.append(op)
        return ir.WalkResult.ADVANCE

    function.walk(visit)
    if not uniforms:
        return []
    sums = _fed_by_cumulative_sums(function)
    draws = []
    for uniform in uniforms:
        met = list(_meetings(uniform, sums))
        if met:
            (op, cumulative), rest = met[0], met[1:]
            draws.append(InverseCdfDraw(op, uniform, cumulative, len(rest)))
    return draws
