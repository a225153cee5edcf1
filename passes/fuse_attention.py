"""hlofuse-fuse-attention: raises attention to `stablehlo.composite "hlofuse.attention"`.

Matches `softmax(stages(q·kᵀ)) · v` where the softmax is `exp(x - max(x)) / sum(exp(x - max(x)))` and
the stages between the first dot and the softmax are, in this order:
  scale (multiply/divide by a constant, or a constant-scaled q),   logit soft-cap `tanh(s / c) * c`,
  additive bias and masks `select(pred, s, fill)`,
with converts, transposes and reshapes anywhere. Masks built from iotas are read as causal, sliding
windows and per-sequence lengths (hlofuse.ir.masks); any other boolean becomes an explicit mask.
GQA/MQA is recognised from a 5-D query reshape or from K/V repeated by broadcast+reshape.

Emits, for each site: canonical operands (q BTNH, k/v BSKH, optional bias, mask, q_lengths,
kv_lengths), the composite with attributes describing the op fully (docs/composites.md), and a
private `@hlofuse.attention.impl` decomposition holding the ORIGINAL subgraph, cloned:

    %s = stablehlo.dot_general %q, %k ... ; %p = softmax(%s * 0.125) ; %o = stablehlo.dot_general %p, %v
  becomes
    %o = stablehlo.composite "hlofuse.attention" %q, %k, %v {composite_attributes = {scale = 1.250000e-01
         : f32, causal = false, ...}, decomposition = @hlofuse.attention.impl, version = 1 : i32}

A site whose interior values have users outside it (e.g. under jax.grad) is left alone, and every
softmax that is not fused gets a remark saying why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from hlofuse.passes.prepare import inline_private_calls
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse.ir import build, layout
from hlofuse.ir.attention_dims import SiteOps, analyze_dims
from hlofuse.ir.dims import LAYOUT_OPS, DimsError
from hlofuse.ir.layout import Labels
from hlofuse.ir.mask_eval import Band, as_grid, band_table, evaluate, fit_band
from hlofuse.ir.masks import Atom, MaskTerms, Opaque, analyze_mask, analyze_zero_one
from hlofuse.ir.match import CONVERTS, P, Rule, constant_scalar, defining_op, first_rule, match, round_to_type
from hlofuse.ops.attention import ATTENTION, ATTENTION_OPERANDS, ATTENTION_VERSION, is_decode, mask_kind
from hlofuse.pipeline import ModulePass, PassState

UNBOUNDED = -1

BROADCASTS = ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.convert")


class NoMatch(Exception):
    """A softmax that is not fused; the message is the remark."""


# ----- the softmax anchor ---------------------------------------------------------------------------


def _reduces_with(body_op: str, capture: str) -> Any:  # noqa: ANN401
    def check(captures: dict[str, Any]) -> bool:
        op = defining_op(captures[capture])
        body = [o.operation.name for o in op.regions[0].blocks[0].operations]
        dims = list(ir.DenseI64ArrayAttr(op.attributes["dimensions"]))
        return body == [body_op, "stablehlo.return"] and len(dims) == 1

    return check


REDUCE_MAX = P("stablehlo.reduce", P.any("max_input"), P.const(), name="max_reduce",
               where=_reduces_with("stablehlo.maximum", "max_reduce"))
# jax.nn.softmax clamps the row max with -inf: maximum(broadcast(-inf), reduce_max(x)).
ROW_MAX = P.through(BROADCASTS + ("stablehlo.transpose",), P.one_of(
    P.commutative("stablehlo.maximum", P.through(BROADCASTS, P.const()), REDUCE_MAX), REDUCE_MAX))
SHIFTED_EXP = P("stablehlo.exponential", P("stablehlo.subtract", P.any("logits"), ROW_MAX), name="exp")
ROW_SUM = P.through(BROADCASTS, P("stablehlo.reduce", P.through(CONVERTS, P.any("exp")), P.const(0.0),
                                  name="sum_reduce", where=_reduces_with("stablehlo.add", "sum_reduce")))


def _max_over_same_dim(captures: dict[str, Any]) -> bool:
    """The row max must reduce the logits' key dim, possibly seen through one transpose."""
    logits, max_input = captures["logits"], captures["max_input"]
    key_dim, max_dim = _reduce_dim(captures["sum_reduce"]), _reduce_dim(captures["max_reduce"])
    if logits == max_input:
        return key_dim == max_dim
    op = defining_op(logits)
    if op is not None and op.name == "stablehlo.transpose" and op.operands[0] == max_input:
        return list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))[key_dim] == max_dim
    return False


# softmax(x) = exp(x - max x) / sum exp(x - max x)
SOFTMAX = P("stablehlo.divide", SHIFTED_EXP, ROW_SUM, name="probs", where=_max_over_same_dim)
# (exp(x - max x) · v) / sum exp(x - max x): normalising after the P·V dot, as MaxText does.
ROW_SUM_MOVED = P.through(BROADCASTS + ("stablehlo.transpose",), P(
    "stablehlo.reduce", P.through(CONVERTS, P.any("exp")), P.const(0.0), name="sum_reduce",
    where=_reduces_with("stablehlo.add", "sum_reduce")))
NORMALIZED_AFTER_PV = P("stablehlo.divide", P.any("numerator"), ROW_SUM_MOVED, name="normalized")
# Ops that only move or retype data, which the site's layout chains may contain.
DATA_MOVES = ("stablehlo.transpose", "stablehlo.reshape", "stablehlo.convert")


def _match_normalized_after_pv(value: ir.Value) -> dict[str, Any] | None:
    """Captures of NORMALIZED_AFTER_PV whose numerator is a dot of the same shifted exp, or None."""
    captures = match(NORMALIZED_AFTER_PV, value)
    if captures is None:
        return None
    exp_captures = match(SHIFTED_EXP, captures["exp"])
    if exp_captures is None:
        return None
    captures.update(exp_captures)
    if not _max_over_same_dim(captures):
        return None
    chain: list[ir.Operation] = []
    op = defining_op(captures["numerator"])
    while op is not None and op.name in DATA_MOVES:
        chain.append(op)
        op = defining_op(op.operands[0])
    if op is None or op.name != "stablehlo.dot_general":
        return None
    captures["output_chain"] = chain[::-1]
    return captures


def _reduce_dim(value: ir.Value) -> int:
    return list(ir.DenseI64ArrayAttr(defining_op(value).attributes["dimensions"]))[0]


# ----- stages between q·kᵀ and the softmax -----------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    kind: str  # convert | layout | scale | softcap | bias | mask
    input: ir.Value
    output: ir.Value
    value: float = 0.0  # scale factor, soft-cap, or mask fill
    operand: ir.Value | None = None  # bias or mask predicate
    inverted: bool = False  # mask given as select(pred, fill, s): pred marks the MASKED entries


def _leads_to_dot(value: ir.Value, depth: int = 16) -> bool:
    """Whether `value` is computed from a dot_general through elementwise and layout ops."""
    op = defining_op(value)
    if op is None or depth == 0:
        return False
    if op.name == "stablehlo.dot_general":
        return True
    if op.name == "stablehlo.broadcast_in_dim" and layout.is_unit_broadcast(op):
        return _leads_to_dot(op.operands[0], depth - 1)
    if op.name in ("stablehlo.constant", "stablehlo.iota", "stablehlo.broadcast_in_dim", "stablehlo.reduce"):
        return False
    return any(_leads_to_dot(v, depth - 1) for v in op.operands
               if isinstance(v.type, ir.RankedTensorType) and isinstance(v.type.element_type, ir.FloatType))


def _is_logits(captures: dict[str, Any]) -> bool:
    return _leads_to_dot(captures["x"])


STAGE_RULES: Sequence[Rule] = (
    Rule("convert", P("stablehlo.convert", P.any("x"), name="out"),
         lambda x, out: Stage("convert", x, out)),
    Rule("layout", P(("stablehlo.transpose", "stablehlo.reshape"), P.any("x"), name="out"),
         lambda x, out: Stage("layout", x, out)),
    Rule("unit_broadcast", P("stablehlo.broadcast_in_dim", P.any("x"), name="out",
                             where=lambda c: layout.is_unit_broadcast(defining_op(c["out"]))),
         lambda x, out: Stage("layout", x, out)),
    # tanh(s / c) * c
    Rule("softcap_div", P.commutative("stablehlo.multiply", P("stablehlo.tanh", P("stablehlo.divide", P.any("x"),
         P.const(name="cap"))), P.const(name="cap"), name="out"),
         lambda x, cap, out: Stage("softcap", x, out, cap) if cap > 0 else None),
    # tanh(s * (1/c)) * c
    Rule("softcap_mul", P.commutative("stablehlo.multiply", P("stablehlo.tanh", P.commutative("stablehlo.multiply",
         P.any("x", where=_is_logits), P.const(name="inv"))), P.const(name="cap"), name="out"),
         lambda x, inv, cap, out: Stage("softcap", x, out, cap) if cap > 0 and math.isclose(inv * cap, 1.0,
                                                                                     rel_tol=1e-6) else None),
    # s * c
    Rule("scale_mul", P.commutative("stablehlo.multiply", P.any("x", where=_is_logits), P.const(name="c"),
         name="out"), lambda x, c, out: Stage("scale", x, out, c) if c > 0 else None),
    # s / c
    Rule("scale_div", P("stablehlo.divide", P.any("x", where=_is_logits), P.const(name="c"), name="out"),
         lambda x, c, out: Stage("scale", x, out, 1.0 / c) if c > 0 else None),
    # where(pred, s, fill)
    Rule("mask_select", P("stablehlo.select", P.any("pred"), P.any("x", where=_is_logits), P.const(name="fill"),
         name="out"), lambda pred, x, fill, out: Stage("mask", x, out, fill, pred)),
    # where(pred, fill, s)
    Rule("mask_select_inverted", P("stablehlo.select", P.any("pred"), P.const(name="fill"),
         P.any("x", where=_is_logits), name="out"),
         lambda pred, fill, x, out: Stage("mask", x, out, fill, pred, inverted=True)),
    # s + bias
    Rule("bias_add", P.commutative("stablehlo.add", P.any("x", where=_is_logits), P.any("bias"), name="out"),
         lambda x, bias, out: Stage("bias", x, out, operand=bias)),
)

# Stages must follow the canonical order scale -> soft-cap -> bias/mask that the kernels implement.
_PHASE = {"scale": 0, "softcap": 1, "bias": 2, "mask": 2}

def _shape(value: ir.Value) -> tuple[int, ...]:
    shape = layout.static_shape(value)
    if shape is None:
        raise NoMatch("dynamic shapes are not supported")
    return shape


def _forward_labels(start: Labels, ops: Sequence[ir.Operation], sizes: dict[str, int]) -> Labels:
    labels = start
    for op in ops:
        new = layout.forward(op, labels, sizes)
        if new is None:
            raise NoMatch(f"cannot follow dims through {op.name}")
        labels = new
    return labels


# ----- the analysis of one site --------------------------------------------------------------------


@dataclass
class Site:
    """Everything known about one attention site, and what the rewrite needs."""

    probs: ir.Value
    pv_dot: ir.Operation
    qk_dot: ir.Operation
    stages: list[Stage]  # dot -> softmax order
    sizes: dict[str, int] = field(default_factory=dict)
    scale: float = 1.0
    softcap: float = 0.0
    masked_value: float = float("-inf")
    causal: bool = False
    window_left: int = UNBOUNDED
    window_right: int = UNBOUNDED
    q_offset: int = 0
    # Canonical operands: role -> (boundary value, its labels or an adjustment, how to rebuild it).
    inputs: dict[str, ir.Value] = field(default_factory=dict)
    input_labels: dict[str, Labels] = field(default_factory=dict)
    length_adjust: dict[str, int] = field(default_factory=dict)
    const_lengths: dict[str, int] = field(default_factory=dict)  # lengths fixed at compile time
    out_labels: Labels = ()
    # Bias and mask terms: the composite's operand combines them (a sum; a conjunction); the decomposition
    # reads the combination through the term that varies along every dim any term does (its carrier,
    # inputs[role]) and a neutral value (0; all visible) for the others, which computes the same logits.
    terms: dict[str, list[Term]] = field(default_factory=dict)
    masked_fill_set: bool = False
    logits_labels: Labels = ()  # of the softmax input (the last stage's result)
    # What the composite replaces: the P·V dot, or the divide after it when normalised there.
    result: ir.Value | None = None
    result_labels: Labels = ()
    zero_empty_rows: bool = False
    roles: dict[str, tuple[str, ...]] = field(default_factory=dict)  # role -> its atoms (attention_dims)

    def role_size(self, role: str) -> int:
        return math.prod(self.sizes[atom] for atom in self.roles.get(role, ()))


def _logit_stages(logits: ir.Value) -> tuple[ir.Operation, list[Stage]]:
    stages: list[Stage] = []
    value = logits
    for _ in range(64):
        op = defining_op(value)
        if op is not None and op.name == "stablehlo.dot_general":
            return op, stages[::-1]
        found = first_rule(STAGE_RULES, value)
        if found is None:
            what = op.name if op is not None else "a block argument"
            raise NoMatch(f"logits come from {what}, not from a dot_general through scale/soft-cap/bias/mask")
        stages.append(found[1])
        value = found[1].input
    raise NoMatch("too many ops between the dot and the softmax")


def _check_stage_order(stages: list[Stage]) -> None:
    phase = 0
    for stage in stages:
        if stage.kind not in _PHASE:
            continue
        if _PHASE[stage.kind] < phase:
            raise NoMatch(f"{stage.kind} after a later stage: not in the order scale, soft-cap, bias/mask")
        if stage.kind == "softcap" and phase == 1:
            raise NoMatch("two soft-caps")
        phase = _PHASE[stage.kind]
    fills = {stage.value for stage in stages if stage.kind == "mask"}
    if len(fills) > 1:
        raise NoMatch(f"masks fill different values {sorted(fills)}")
    kinds = [s.kind for s in stages if s.kind in ("bias", "mask")]
    masks = [s for s in stages if s.kind == "mask"]
    if masks and "bias" in kinds[kinds.index("mask"):] and not absorbs_logits(
            masks[0].value, layout.element_type(masks[0].output)):
        raise NoMatch("a bias is added after a finite mask fill, so masked logits are not the fill value")


@dataclass(frozen=True)
class ProbsPath:
    """From the softmax to the P·V dot: layout ops, and `select(pred, p, 0)` re-masks (keras' Softmax(mask))."""

    layout_ops: list[ir.Operation]
    remask_preds: list[ir.Value]
    pv_dot: ir.Operation
    p_operand: ir.Value


def _probs_to_pv(probs: ir.Value, also_used_by: frozenset[ir.Operation] = frozenset()) -> ProbsPath:
    """Follows single-use converts, transposes, reshapes and zeroing selects to the P·V dot; uses of
    `probs` by `also_used_by` (the row sum when normalising after the dot) are part of the site."""
    layout_ops: list[ir.Operation] = []
    remask_preds: list[ir.Value] = []
    value = probs
    for _ in range(8):
        uses = [use for use in value.uses if use.owner.operation not in also_used_by]
        if len(uses) != 1:
            raise NoMatch(f"the softmax output has {len(uses)} users; only a single P·V dot can be fused")
        user = uses[0].owner.operation
        if user.name == "stablehlo.dot_general":
            return ProbsPath(layout_ops, remask_preds, user, value)
        if user.name == "stablehlo.select" and user.operands[1] == value and constant_scalar(user.operands[2]) == 0.0:
            remask_preds.append(user.operands[0])
        elif user.name in DATA_MOVES:
            layout_ops.append(user)
        else:
            raise NoMatch(f"the softmax output feeds {user.name}, not a dot_general")
        value = user.results[0]
    raise NoMatch("too many ops between the softmax and the P·V dot")


def analyze(probs: ir.Value, captures: dict[str, Any]) -> Site:
    logits = captures["logits"]
    reduce_dim = _reduce_dim(captures["sum_reduce"])
    normalized_after = "numerator" in captures
    path = _probs_to_pv(captures["exp"] if normalized_after else probs,
                        _ops_between(captures["exp"], captures["sum_reduce"]) if normalized_after else frozenset())
    qk_dot, stages = _logit_stages(logits)
    _check_stage_order(stages)
    site = Site(probs, path.pv_dot, qk_dot, stages)
    _assign_roles(site, reduce_dim, path)
    site.result, site.result_labels = site.pv_dot.results[0], site.out_labels
    if normalized_after:
        chain = captures["output_chain"]
        if (chain[0].operands[0] if chain else captures["numerator"]) != site.pv_dot.results[0]:
            raise NoMatch("the row sum divides a different dot than the one the exp feeds")
        site.result, site.result_labels = probs, _forward_labels(site.out_labels, chain, site.sizes)
        _check_row_sum_alignment(site, captures, reduce_dim)
    _read_stages(site)
    _read_remasks(site, path.remask_preds)
    return site


def _check_row_sum_alignment(site: Site, captures: dict[str, Any], reduce_dim: int) -> None:
    """The row sum that divides the P·V output must be broadcast along the same rows (b, heads, t)."""
    sizes = site.sizes
    stage_layout = [defining_op(s.output) for s in site.stages if s.kind in ("layout", "convert")]
    row_labels = list(_forward_labels(site.input_labels["qk_out"], stage_layout, sizes))
    del row_labels[reduce_dim]
    labels: Labels = tuple(row_labels)
    path: list[ir.Operation] = []
    op = defining_op(defining_op(captures["normalized"]).operands[1])
    while op is not None and op != defining_op(captures["sum_reduce"]):
        path.append(op)
        op = defining_op(op.operands[0])
    for op in reversed(path):
        if op.name == "stablehlo.broadcast_in_dim":
            labels = layout.broadcast_labels(op, labels)
        else:
            labels = _forward_labels(labels, [op], sizes)
    rows = {a for label in site.result_labels for a in label} - {"D"}
    if {a for label in labels for a in label} != rows or any(
            label and label != want for label, want in zip(labels, site.result_labels, strict=True)):
        raise NoMatch("the row sum is not broadcast along the rows of the P·V output")


def _ops_between(source: ir.Value, sink: ir.Value) -> frozenset[ir.Operation]:
    """The ops on the single-operand path from `source` up to and including `sink`'s producer."""
    ops: set[ir.Operation] = set()
    op = defining_op(sink)
    while op is not None:
        ops.add(op)
        if op.operands[0] == source:
            return frozenset(ops)
        op = defining_op(op.operands[0])
    return frozenset(ops)


def _assign_roles(site: Site, reduce_dim: int, path: ProbsPath) -> None:
    """Reads every dim's role (hlofuse.ir.attention_dims) and takes q, k and v from their sources."""
    stages = site.stages
    parts = SiteOps(site.qk_dot, [s.output for s in stages], [s.operand for s in stages if s.operand is not None],
                    reduce_dim, path.layout_ops, site.pv_dot, path.p_operand)
    try:
        dims = analyze_dims(parts)
    except DimsError as reason:
        raise NoMatch(str(reason)) from None
    site.sizes.update(dims.sizes)
    site.roles = dims.roles
    site.input_labels["qk_out"], site.out_labels = dims.qk_out, dims.pv_out
    site.scale *= dims.q.scale * dims.k.scale
    for role, source in (("q", dims.q), ("k", dims.k), ("v", dims.v)):
        site.inputs[role], site.input_labels[role] = source.value, source.labels


@dataclass(frozen=True)
class Term:
    """One bias or mask tensor the site reads: its smallest carrier (broadcasts looked through) and labels.
    A mask term with `negated` marks the visible entries where it is false."""

    value: ir.Value
    labels: Labels
    negated: bool = False
    zero_one: bool = False  # a 0/1 number, visible where it is not 0


def _read_stages(site: Site) -> None:
    """Scale, soft-cap, masks and biases from the stages. A bias that is `select(m, 0, fill)` with a fill
    that absorbs any logit (`s + fill == fill`) is the mask `m` written additively (PyTorch and Hugging
    Face build masks that way); a sum of biases is read term by term."""
    sizes = site.sizes
    labels = site.input_labels["qk_out"]
    site.logits_labels = _forward_labels(labels, [defining_op(s.output) for s in site.stages
                                                  if s.kind in ("layout", "convert")], sizes)
    conjunction = MaskTerms()
    biases: list[tuple[ir.Value, Labels]] = []
    fills: list[str] = []  # "select" / "add": how each mask term puts its fill on the logits, in order

    def read_bias(value: ir.Value, value_labels: Labels) -> None:
        for term, term_labels, additive in _bias_terms(value, value_labels, sizes):
            if additive is None:
                biases.append((term, term_labels))
                continue
            _set_fill(site, additive.fill)
            _add_mask(conjunction, additive.terms)
            fills.append("add")
            if additive.bias is not None:
                read_bias(*additive.bias)

    for stage in site.stages:
        op = defining_op(stage.output)
        if stage.kind in ("layout", "convert"):
            labels = _forward_labels(labels, [op], sizes)
        elif stage.kind == "scale":
            site.scale *= stage.value
        elif stage.kind == "softcap":
            site.softcap = stage.value
        elif stage.kind == "bias":
            read_bias(stage.operand, labels)
        elif stage.kind == "mask":
            _set_fill(site, stage.value)
            _add_mask(conjunction, analyze_mask(stage.operand, labels, sizes, negated=stage.inverted))
            fills.append("select")
    _check_fills_do_not_stack(site, fills)
    if conjunction.always_false:
        raise NoMatch("the mask is constant false")
    for value, term_labels in biases:
        _set_dense_input(site, "bias", value, term_labels)
    leftover = _read_atoms(site, conjunction.atoms)
    terms = conjunction.opaque + [Opaque(atom.value, atom.labels, atom.negated) for atom in leftover]
    for opaque in _fold_constant_bands(site, terms):
        _set_dense_input(site, "mask", opaque.value, opaque.labels, opaque.negated, opaque.zero_one)


def _fold_constant_bands(site: Site, terms: list[Opaque]) -> list[Opaque]:
    """Mask terms computed from iotas and constants alone are evaluated (hlofuse.ir.mask_eval); if, ANDed
    with the band read so far, they are exactly a band, the band becomes the attributes and the terms
    go. Returns the terms that stay mask operands (all of them when no band fits)."""
    sizes = site.sizes
    constant: list[Opaque] = []
    table = band_table(sizes["T"], sizes["S"], Band(site.causal, site.window_left, site.window_right, site.q_offset))
    for term in terms:
        array = evaluate(term.value)
        grid = as_grid(array != 0, term.labels, sizes) if array is not None else None
        if grid is not None:
            constant.append(term)
            table = table & (~grid if term.negated else grid)
    band = fit_band(table) if constant else None
    if band is None:
        return terms
    site.causal, site.window_left, site.q_offset = band.causal, band.window_left, band.q_offset
    site.window_right = 0 if band.causal else band.window_right
    return [term for term in terms if term not in constant]


def _check_fills_do_not_stack(site: Site, fills: list[str]) -> None:
    """A key masked twice by additive masks gets fill + fill: -inf stays -inf, but a finite fill adds up (to
    2 * fill, or -inf past the dtype's range), so a fully masked row would not be the uniform average the
    composite's finite masked_value gives. With a finite fill, at most one mask may be added, before any
    select (which sets the fill, whatever was added before)."""
    if math.isinf(site.masked_value) or "add" not in fills:
        return
    added_after_select = "select" in fills and fills.index("select") < fills.index("add")
    if fills.count("add") > 1 or added_after_select:
        raise NoMatch(f"masks add a finite fill {site.masked_value:g} more than once to the same logits, so "
                      "a fully masked row is not one fill's uniform average")


def _add_mask(conjunction: MaskTerms, terms: MaskTerms) -> None:
    conjunction.atoms += terms.atoms
    conjunction.opaque += terms.opaque
    conjunction.always_false |= terms.always_false


def _set_fill(site: Site, fill: float) -> None:
    if site.masked_fill_set and site.masked_value != fill and not (math.isnan(fill) and math.isnan(site.masked_value)):
        raise NoMatch(f"masks fill different values {sorted((site.masked_value, fill))}")
    site.masked_value, site.masked_fill_set = fill, True


@dataclass(frozen=True)
class AdditiveMask:
    """A bias that is 0 where visible and an absorbing `fill` elsewhere: the mask its `terms` say."""

    terms: MaskTerms
    fill: float
    bias: tuple[ir.Value, Labels] | None = None  # `select(m, b, fill)`: the bias b where visible


# A fill absorbs a logit s when s + fill rounds to fill: -inf always, a finite fill when half its unit in
# the last place exceeds any logit (2**64 is far beyond any softmax input that is not already inf/NaN).
_ABSORBED_LOGIT = 2.0**64
_BIAS_LAYOUT = ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.transpose", "stablehlo.convert")


def absorbs_logits(fill: float, element_type: ir.Type) -> bool:
    if fill == float("-inf"):
        return True
    if not fill < 0 or math.isinf(fill):
        return False
    finfo = np.finfo(_np_float(element_type))
    ulp = 2.0 ** (math.floor(math.log2(-fill)) - int(finfo.nmant))
    return ulp / 2 > _ABSORBED_LOGIT


def _np_float(element_type: ir.Type) -> Any:  # noqa: ANN401
    import ml_dtypes

    return {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16, "f64": np.float64}.get(
        str(element_type), np.float32)


def _bias_terms(value: ir.Value, labels: Labels,
                sizes: dict[str, int]) -> list[tuple[ir.Value, Labels, AdditiveMask | None]]:
    """The summands of a bias (through adds and layout ops), each a plain bias or an additive mask; a zero
    constant (torch's sdpa adds a zero bias when it has no mask) is no term."""
    if constant_scalar(value) == 0.0:
        return []
    found = _additive_mask(value, labels, sizes)
    if found is not None:
        return [(value, labels, found)]
    op = defining_op(value)
    if op is not None and op.name == "stablehlo.add":
        return [t for operand in op.operands for t in _bias_terms(operand, labels, sizes)]
    if op is not None and op.name == "stablehlo.multiply" and 1.0 in map(constant_scalar, op.operands):
        # b * 1 (torch.add's alpha): exactly b.
        other = op.operands[0] if constant_scalar(op.operands[1]) == 1.0 else op.operands[1]
        return _bias_terms(other, labels, sizes)
    if op is not None and op.name in _BIAS_LAYOUT and op.name != "stablehlo.convert":
        inner = layout.backward(op, labels, sizes)
        if inner is not None:
            terms = _bias_terms(op.operands[0], layout.normalize(inner, sizes), sizes)
            if any(t[2] is not None for t in terms):
                return terms
    return [(value, labels, None)]


def _additive_mask(value: ir.Value, labels: Labels, sizes: dict[str, int]) -> AdditiveMask | None:
    """A mask written as a bias, seen through layout ops and multiplies by a positive constant (which scale
    the fill): `select(m, 0, fill)` or `select(m, fill, 0)`, or `x * fill` with x a 0/1 number (BERT-era
    code writes `(1 - m) * finfo.min`), where the fill absorbs the logits in the bias's element type."""
    element_type = layout.element_type(value)
    factor = 1.0
    while True:
        op = defining_op(value)
        if op is None:
            return None
        if op.name in _BIAS_LAYOUT:
            inner = layout.backward(op, labels, sizes)
            if inner is None:
                return None
            value, labels = op.operands[0], layout.normalize(inner, sizes)
            continue
        if op.name != "stablehlo.multiply":
            break
        lhs, rhs = op.operands
        for x, c in ((lhs, constant_scalar(rhs)), (rhs, constant_scalar(lhs))):
            if c is not None and c > 0:
                factor *= c
                value = x
                break
            if c is not None and absorbs_logits(c * factor, element_type):
                terms = analyze_zero_one(x, labels, sizes, visible_when_zero=True)
                return AdditiveMask(terms, round_to_type(c * factor, element_type)) if terms is not None else None
        else:
            return None
    if op.name != "stablehlo.select":
        return None
    pred, on_true, on_false = op.operands
    true_c, false_c = constant_scalar(on_true), constant_scalar(on_false)
    for kept, fill, inverted in ((on_true, false_c, False), (on_false, true_c, True)):
        if fill is None or not absorbs_logits(fill * factor, element_type):
            continue
        terms = analyze_mask(pred, labels, sizes, negated=inverted)
        if constant_scalar(kept) == 0.0:
            return AdditiveMask(terms, round_to_type(fill * factor, element_type))
        if factor == 1.0 and constant_scalar(kept) is None:
            # select(m, b, fill) = b + select(m, 0, fill) when the fill absorbs b (T5's masked position bias).
            return AdditiveMask(terms, round_to_type(fill, element_type), bias=(kept, labels))
    return None


# Below this fill, exp(fill - row max) is exactly 0 in f32, so re-masking changes only fully masked rows.
REMASK_MAX_FILL = -1e4


def _read_remasks(site: Site, preds: list[ir.Value]) -> None:
    """`select(mask, softmax(...), 0)` with the logits' own mask zeroes the rows that see no key."""
    if not preds:
        return
    logit_masks = {_strip_broadcasts(s.operand) for s in site.stages if s.kind == "mask" and not s.inverted}
    for pred in preds:
        if _strip_broadcasts(pred) not in logit_masks:
            raise NoMatch("the probabilities are zeroed by a mask that differs from the logits' mask")
    if site.masked_value > REMASK_MAX_FILL:
        raise NoMatch(f"re-masked probabilities with a mask fill of {site.masked_value} are not exactly 0")
    site.zero_empty_rows = True


def _strip_broadcasts(value: ir.Value) -> ir.Value:
    op = defining_op(value)
    while op is not None and op.name in ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.transpose"):
        value = op.operands[0]
        op = defining_op(value)
    return value


def _set_dense_input(site: Site, role: str, value: ir.Value, labels: Labels, negated: bool = False,
                     zero_one: bool = False) -> None:
    """A bias or mask term: looks through broadcasts and layout ops to the smallest tensor that carries it."""
    sizes = site.sizes
    while True:
        op = defining_op(value)
        if op is None or op.name not in ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.transpose"):
            break
        inner = layout.backward(op, labels, sizes)
        if inner is None:
            break
        value, labels = op.operands[0], layout.normalize(inner, sizes)
    atoms = {a for label in labels for a in label}
    if atoms & set(site.roles["H"] + site.roles["D"]):
        raise NoMatch(f"the {role} varies along the head dim of q or v")
    if any(t.value == value for t in site.terms.get(role, [])):
        return
    site.terms.setdefault(role, []).append(Term(value, labels, negated, zero_one))
    terms = site.terms[role]
    carrier = max(terms, key=lambda t: len({a for label in t.labels for a in label}))
    site.inputs[role] = carrier.value
    site.input_labels[role] = layout.normalize([tuple(a for a in label if any(
        a in tl for t in terms for tl in t.labels)) for label in site.logits_labels], site.sizes)


def _read_atoms(site: Site, atoms: list[Atom]) -> list[Atom]:
    """Sets causal / window / lengths from the atoms it reads; returns the atoms it cannot read."""
    rights: list[int] = []
    lefts: list[int] = []
    unread: list[Atom] = []
    single_query = site.sizes["T"] == 1
    for atom in atoms:
        diff, direction = atom.diff, atom.direction
        cs, ct = diff.coeff("S"), diff.coeff("T")
        if single_query and cs:
            # The only query row is t = 0: a bound on s alone is a band, and t may be dropped beside a length.
            ct = 0 if diff.ext is not None else -cs
        elif single_query and diff.ext is not None:
            # `0 < len[b]` with t = 0 is the query length bound `t < len[b]`.
            ct = -diff.ext_sign
        others = [r for r, c in diff.coeffs if c and r not in ("S", "T")]
        if cs < 0 or (cs == 0 and ct < 0):
            diff, direction = diff.scaled(-1), {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}.get(direction,
                                                                                             direction)
            cs, ct = -cs, -ct
        if others or direction in ("EQ", "NE"):
            unread.append(atom)
        elif cs == 1 and ct == -1 and diff.ext is None:
            # s - t + c <dir> 0
            c = diff.const
            if direction in ("LT", "LE"):
                rights.append(-c - 1 if direction == "LT" else -c)
            else:
                lefts.append(c - 1 if direction == "GT" else c)
        elif cs == 1 and ct == 0 and diff.ext is not None and diff.ext_sign == -1 and direction in ("LT", "LE"):
            # s + c - len < 0  <=>  s < len - c
            if not _set_length(site, "kv_lengths", atom, -diff.const + (1 if direction == "LE" else 0)):
                unread.append(atom)
        elif cs == 0 and ct == 1 and diff.ext is not None and diff.ext_sign == -1 and direction in ("LT", "LE"):
            if not _set_length(site, "q_lengths", atom, -diff.const + (1 if direction == "LE" else 0)):
                unread.append(atom)
        elif (cs, ct) in ((1, 0), (0, 1)) and diff.ext is None and direction in ("LT", "LE"):
            # s < L or t < L with L a constant: a length known at compile time (e.g. a prefill at position 0)
            role, extent = ("kv_lengths", "S") if cs else ("q_lengths", "T")
            bound = -diff.const + (1 if direction == "LE" else 0)
            if bound >= site.sizes[extent]:
                continue  # always true
            if role in site.inputs or site.const_lengths.get(role, bound) != bound or bound <= 0:
                unread.append(atom)
            else:
                site.const_lengths[role] = bound
        else:
            unread.append(atom)
    if rights:
        site.causal, site.q_offset, site.window_right = True, min(rights), 0
    if lefts and rights:
        site.window_left = min(lefts) + site.q_offset
        if site.window_left < 0:
            raise NoMatch("the sliding window is empty")
    elif lefts:
        # Only s - t >= -left: with no right bound, q_offset can carry a negative left bound.
        left = min(lefts)
        site.q_offset, site.window_left = max(0, -left), max(0, left)
    return unread


def _set_length(site: Site, role: str, atom: Atom, adjust: int) -> bool:
    ext = atom.diff.ext
    assert ext is not None
    if role in site.const_lengths:
        return False
    if role in site.inputs:
        return site.inputs[role] == ext.value and site.length_adjust[role] == adjust
    site.inputs[role], site.input_labels[role], site.length_adjust[role] = ext.value, ext.labels, adjust
    return True


# ----- the rewrite ---------------------------------------------------------------------------------

def _canonical_labels(role: str, site: Site) -> Labels:
    """Canonical layouts over the site's role atoms: q (B,T,N,H), k (B,S,K,H), v (B,S,K,D), out (B,T,N,D),
    bias and mask (B|1, N|1, T|1, S|1); N packs the kv-head atoms, then the group atoms."""
    roles = site.roles

    def r(*names: str) -> tuple[str, ...]:
        return tuple(atom for name in names for atom in roles.get(name, ()))

    if role == "q":
        spec = [r("B"), r("T"), r("K", "G"), r("H")]
    elif role in ("k", "v"):
        spec = [r("B"), r("S"), r("K"), r("H") if role == "k" else r("D")]
    elif role in ("bias", "mask"):
        present = {a for label in site.input_labels[role] for a in label}
        heads = r("K", "G") if present & set(r("K", "G")) else ()
        spec = [r("B") if present & set(r("B")) else (), heads, r("T") if "T" in present else (),
                r("S") if "S" in present else ()]
    elif role == "out":
        spec = [r("B"), r("T"), r("K", "G"), r("D")]
    else:
        raise ValueError(role)
    return layout.normalize(spec, site.sizes)


def _i32(like: ir.Value) -> ir.Type:
    return ir.RankedTensorType.get(list(_shape(like)), ir.IntegerType.get_signless(32))


def _canonical_length(value: ir.Value, labels: Labels, adjust: int, sizes: dict[str, int]) -> ir.Value:
    """(B,) int32 = relayout(value) + adjust: the number of visible rows per sequence."""
    vector = layout.relayout(value, labels, layout.normalize([("B",)], sizes), sizes)
    if layout.element_type(vector) != ir.IntegerType.get_signless(32):
        vector = stablehlo.convert(_i32(vector), vector)
    if adjust:
        vector = stablehlo.add(vector, layout.broadcast_scalar(adjust, vector))
    return vector


def _rebuild_length(canonical: ir.Value, adjust: int, original: ir.Value, labels: Labels,
                    sizes: dict[str, int]) -> ir.Value:
    """Inverse of _canonical_length: the original lengths tensor from the canonical (B,) vector."""
    vector = canonical
    if adjust:
        vector = stablehlo.subtract(vector, layout.broadcast_scalar(adjust, vector))
    etype = layout.element_type(original)
    if etype != layout.element_type(vector):
        vector = stablehlo.convert(ir.RankedTensorType.get(list(_shape(vector)), etype), vector)
    source = layout.normalize([("B",)], sizes)
    if sizes["B"] > 1 and not any("B" in label for label in labels):
        # The same length for every sequence: any row holds it.
        vector, source = stablehlo.slice(vector, [0], [1], [1]), ((),)
    return layout.relayout(vector, source, labels, sizes)


def _f64(number: float) -> ir.Attribute:
    return ir.FloatAttr.get(ir.F64Type.get(), number)


def _attributes(site: Site, roles: list[str]) -> dict[str, ir.Attribute]:
    sizes = site.sizes
    i64 = ir.IntegerType.get_signless(64)
    layout_name = "BTNH"
    return {
        "scale": _f64(site.scale),
        "causal": ir.BoolAttr.get(site.causal),
        "window_left": ir.IntegerAttr.get(i64, site.window_left),
        "window_right": ir.IntegerAttr.get(i64, site.window_right),
        "q_offset": ir.IntegerAttr.get(i64, site.q_offset),
        "softcap": _f64(site.softcap),
        "masked_value": _f64(site.masked_value),
        "mask_kind": ir.StringAttr.get(mask_kind(roles)),
        "num_heads": ir.IntegerAttr.get(i64, site.role_size("K") * site.role_size("G")),
        "num_kv_heads": ir.IntegerAttr.get(i64, site.role_size("K")),
        "layout": ir.StringAttr.get(layout_name),
        "decode": ir.BoolAttr.get(is_decode(sizes["T"], sizes["S"])),
        "zero_empty_rows": ir.BoolAttr.get(site.zero_empty_rows),
        "operands": ir.ArrayAttr.get([ir.StringAttr.get(r) for r in roles]),
    }


def rewrite(site: Site, module: ir.Operation) -> ir.Operation:
    """Emits canonical operands, the decomposition and the composite; replaces the P·V dot's result."""
    sizes = site.sizes
    roles = [r for r in ATTENTION_OPERANDS if r in site.inputs or r in site.const_lengths]
    boundaries = {site.inputs[r]: r for r in roles if r in site.inputs}
    boundaries.update({term.value: role for role, terms in site.terms.items() for term in terms})
    assert site.result is not None
    interior = build.backward_slice(site.result, boundaries)
    _check_escapes(site, interior, boundaries)
    plan = _term_plan(site)
    location = site.pv_dot.location
    with location, ir.InsertionPoint(site.pv_dot):
        operands = []
        for role in roles:
            if role in site.const_lengths:
                lengths = np.full((sizes["B"],), site.const_lengths[role], dtype=np.int32)
                operands.append(stablehlo.constant(ir.DenseElementsAttr.get(lengths)))
                continue
            value, labels = site.inputs[role], site.input_labels[role]
            if role.endswith("lengths"):
                operands.append(_canonical_length(value, labels, site.length_adjust[role], sizes))
            elif role in site.terms:
                operands.append(_combined_terms(site, role))
            else:
                operands.append(layout.relayout(value, labels, _canonical_labels(role, site), sizes))

    def body(args: Sequence[ir.Value]) -> list[ir.Value]:
        mapping: dict[ir.Value, ir.Value] = {}
        for role, arg in zip(roles, args, strict=True):
            if role in site.const_lengths:
                continue  # the original computes this bound from constants of its own
            original, labels = site.inputs[role], site.input_labels[role]
            if role.endswith("lengths"):
                mapping.setdefault(original, _rebuild_length(arg, site.length_adjust[role], original, labels, sizes))
                continue
            if role not in site.terms:
                mapping.setdefault(original, layout.relayout(arg, _canonical_labels(role, site), labels, sizes))
                continue
            for term in site.terms[role]:
                if term is plan.carriers.get(role):
                    rebuilt = layout.relayout(arg, _canonical_labels(role, site), term.labels, sizes)
                    rebuilt = stablehlo.not_(rebuilt) if term.negated else rebuilt
                    if term.zero_one:
                        rebuilt = stablehlo.convert(term.value.type, rebuilt)
                    mapping.setdefault(term.value, rebuilt)
                else:
                    mapping.setdefault(term.value, _neutral(term, role))
        if not plan.at_logits:
            build.clone_ops(interior, mapping)
        else:
            logits_op = defining_op(plan.logits)
            split = interior.index(logits_op) + 1 if logits_op in interior else 0
            build.clone_ops(interior[:split], mapping)
            at_logits = {role: arg for role, arg in zip(roles, args, strict=True) if role in plan.at_logits}
            mapping[plan.logits] = _apply_at_logits(site, mapping.get(plan.logits, plan.logits), at_logits)
            build.clone_ops(interior[split:], mapping)
        out = mapping[site.result]
        return [layout.relayout(out, site.result_labels, _canonical_labels("out", site), sizes)]

    name = build.unique_symbol(module, f"{ATTENTION}.impl")
    name = build.build_private_func(module, name, [v.type for v in operands], body, location)
    out_shape = [layout.label_size(lb, sizes) for lb in _canonical_labels("out", site)]
    out_type = ir.RankedTensorType.get(out_shape, layout.element_type(site.result))
    with location, ir.InsertionPoint(site.pv_dot):
        op = build.composite(ATTENTION, operands, [out_type], _attributes(site, roles), name, ATTENTION_VERSION)
        result = layout.relayout(op.results[0], _canonical_labels("out", site), site.result_labels, sizes)
    site.result.replace_all_uses_with(result)
    build.erase_dead(interior)
    return op


@dataclass
class TermPlan:
    """How the decomposition reads several bias or mask terms from the one combined operand: through the
    term whose dims cover the others' (`carriers`), or, where none does, applied to the logits after the
    last stage (`at_logits`: + bias; select(mask, logits, fill)), with every term made neutral."""

    logits: ir.Value
    carriers: dict[str, Term] = field(default_factory=dict)
    at_logits: list[str] = field(default_factory=list)


def _term_plan(site: Site) -> TermPlan:
    plan = TermPlan(site.stages[-1].output if site.stages else site.qk_dot.results[0])
    for role, terms in site.terms.items():
        carrier = max(terms, key=lambda t: len({a for label in t.labels for a in label}))
        covered = {a for label in carrier.labels for a in label}
        if all({a for label in t.labels for a in label} <= covered for t in terms):
            plan.carriers[role] = carrier
        else:
            plan.at_logits.append(role)
    if "bias" in plan.at_logits:
        masks = [s for s in site.stages if s.kind == "mask"]
        if site.zero_empty_rows or (masks and not absorbs_logits(site.masked_value, layout.element_type(plan.logits))):
            raise NoMatch("the biases vary along different dims and a finite mask fill follows them")
    if "mask" in plan.at_logits and site.zero_empty_rows:
        raise NoMatch("the masks vary along different dims and the probabilities are masked again")
    return plan


def _apply_at_logits(site: Site, logits: ir.Value, combined: dict[str, ir.Value]) -> ir.Value:
    """logits + bias, then select(mask, logits, fill), with the canonical operands laid out as the logits."""
    sizes, labels, etype = site.sizes, site.logits_labels, layout.element_type(logits)
    if "bias" in combined:
        bias = layout.relayout(combined["bias"], _canonical_labels("bias", site), labels, sizes)
        if layout.element_type(bias) != etype:
            bias = stablehlo.convert(logits.type, bias)
        logits = stablehlo.add(logits, bias)
    if "mask" in combined:
        mask = layout.relayout(combined["mask"], _canonical_labels("mask", site), labels, sizes)
        logits = stablehlo.select(mask, logits, _splat(site.masked_value, logits))
    return logits


def _splat(number: float, like: ir.Value) -> ir.Value:
    """`number` in `like`'s float type and shape (an f32 constant converted, then broadcast)."""
    scalar = stablehlo.constant(ir.DenseElementsAttr.get(np.array(number, dtype=np.float32)))
    etype = layout.element_type(like)
    if etype != ir.F32Type.get():
        scalar = stablehlo.convert(ir.RankedTensorType.get([], etype), scalar)
    return stablehlo.broadcast_in_dim(like.type, scalar, [])


def _combined_terms(site: Site, role: str) -> ir.Value:
    """The canonical bias (the sum of the terms) or mask (the conjunction of the visible sets)."""
    combined = None
    terms = site.terms[role]
    for term in terms:
        canonical = layout.relayout(term.value, term.labels, _canonical_labels(role, site), site.sizes)
        if term.zero_one:
            canonical = _is_nonzero(canonical)
        if term.negated:
            canonical = stablehlo.not_(canonical)
        if len(terms) > 1 and role == "bias" and layout.element_type(canonical) != layout.element_type(terms[0].value):
            canonical = stablehlo.convert(ir.RankedTensorType.get(list(_shape(canonical)),
                                                                  layout.element_type(terms[0].value)), canonical)
        if combined is None:
            combined = canonical
        else:
            combined = (stablehlo.and_ if role == "mask" else stablehlo.add)(combined, canonical)
    assert combined is not None
    return combined


def _neutral(term: Term, role: str) -> ir.Value:
    """A term's value that changes nothing: 0 for a bias, all visible for a mask."""
    visible = not term.negated
    if term.zero_one:
        return _splat(float(visible), term.value) if _is_float(term.value) else layout.broadcast_scalar(
            int(visible), term.value)
    return layout.broadcast_scalar(0.0 if role == "bias" else visible, term.value)


def _is_float(value: ir.Value) -> bool:
    return isinstance(layout.element_type(value), ir.FloatType)


def _is_nonzero(value: ir.Value) -> ir.Value:
    """value != 0, elementwise (a 0/1 number as a boolean)."""
    zero = _splat(0.0, value) if _is_float(value) else layout.broadcast_scalar(0, value)
    direction = stablehlo.ComparisonDirectionAttr.get("NE")
    kind = stablehlo.ComparisonTypeAttr.get("FLOAT" if _is_float(value) else "SIGNED")
    i1 = ir.RankedTensorType.get(list(_shape(value)), ir.IntegerType.get_signless(1))
    return stablehlo.CompareOp(i1, value, zero, direction, compare_type=kind).result


def _check_escapes(site: Site, interior: list[ir.Operation], boundaries: dict[ir.Value, str]) -> None:
    """Interior values computed from q/k/v may not be used outside the site (e.g. by a backward pass)."""
    inside = set(interior)
    # Only values computed from q, k and v are the attention's own; masks and lengths computed once and
    # shared by every layer are cloned into each decomposition, so sharing them is fine.
    tainted: set[ir.Value] = {value for value, role in boundaries.items() if role in ("q", "k", "v")}
    # q, k or v only laid out (transposed, reshaped, repeated per group) may have other users, e.g. the next
    # layer's site over the same repeated K/V: the decomposition clones that data movement, and the
    # original stays for them.
    moved: set[ir.Value] = set(tainted)
    for op in interior:
        if not any(v in tainted for v in op.operands):
            continue
        if op.name in LAYOUT_OPS and op.operands[0] in moved:
            moved.update(op.results)
            tainted.update(op.results)
            continue
        for result in op.results:
            tainted.add(result)
            if result == site.result:
                continue
            for use in result.uses:
                if use.owner.operation not in inside:
                    raise NoMatch(f"{op.name} inside the attention has a user outside it "
                                  f"({use.owner.operation.name}), e.g. a backward pass")


def _find_softmaxes(module: ir.Operation) -> tuple[list[tuple[ir.Value, dict[str, Any]]], list[ir.Operation]]:
    """Matched softmaxes, and row-max-shifted exps that are not inside one (near-misses)."""
    found: list[tuple[ir.Value, dict[str, Any]]] = []
    shifted_exps: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "stablehlo.divide":
            captures = match(SOFTMAX, op.results[0]) or _match_normalized_after_pv(op.results[0])
            if captures is not None:
                found.append((op.results[0], captures))
        elif op.name == "stablehlo.exponential" and match(SHIFTED_EXP, op.results[0]) is not None:
            shifted_exps.append(op)
        return ir.WalkResult.ADVANCE

    for fn in build.functions(module, skip_decompositions=True):
        fn.walk(visit)
    in_softmax = {defining_op(captures["exp"]) for _, captures in found}
    return found, [op for op in shifted_exps if op not in in_softmax]


@dataclass(frozen=True)
class FuseAttentionPass(ModulePass):
    """Raises each attention subgraph to `stablehlo.composite "hlofuse.attention"` (see module docs)."""

    name: ClassVar[str] = "hlofuse-fuse-attention"
    summary: ClassVar[str] = "Raise softmax(q·kᵀ)·v subgraphs to hlofuse.attention composites"

    def run(self, module: ir.Operation, state: PassState) -> None:
        # JAX outlines helpers (`@_where`, `@tril`) that sit inside the site: see through them, so the pass
        # also works on its own (`hlofuse-opt --hlofuse-fuse-attention`), without hlofuse-prepare first.
        state.count("inline_private_call", inline_private_calls(module))
        softmaxes, near_misses = _find_softmaxes(module)
        for exp in near_misses:
            state.remark(exp, "exp(x - max(x)) is not normalised by a divide into a softmax that feeds a dot "
                              "(e.g. a backward pass, or a log-softmax); not fused")
            state.count("attention_not_fused")
        for probs, captures in softmaxes:
            try:
                site = analyze(probs, captures)
                with site.pv_dot.location:
                    rewrite(site, module)
            except (NoMatch, build.NotOutlinable) as reason:
                state.remark(defining_op(probs), f"softmax not fused: {reason}")
                state.count("attention_not_fused")
                continue
            state.count("softmax_of_qk_to_attention")
