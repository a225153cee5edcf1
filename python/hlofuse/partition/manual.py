"""The manual-computation builder: a kernel lowered for one shard's shapes, called per shard.

What a user writes by hand with `jax.shard_map`: a `sdy.manual_computation` over every mesh axis whose body
calls the kernel lowered for one shard's shapes, with the in / out shardings of a `ShardPlan`.

    %0 = stablehlo.composite "hlofuse.attention" %q, %k, %v {...}   q (4,16,8,16): batch over data, heads over model
  becomes
    %0 = sdy.manual_computation(%q, %k, %v) in_shardings=[<@mesh, [{"data"}, {}, {"model"}, {}]>, ...]
           out_shardings=[<@mesh, [{"data"}, {}, {"model"}, {}]>] manual_axes={"data", "model"}
           (%lq: tensor<2x16x2x16xf32>, %lk: ..., %lv: ...) {
      %1 = func.call @hlofuse.attention.tpu(%lq, %lk, %lv)
      sdy.return %1
    }
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, sdy

from hlofuse.partition.plan import ShardPlan


def manual_computation(anchor: ir.Operation, plan: ShardPlan, callee: str, operands: Sequence[ir.Value],
                       operand_labels: Sequence[Sequence[str]], result_types: Sequence[ir.Type],
                       result_labels: Sequence[Sequence[str]]) -> list[ir.Value]:
    """A `sdy.manual_computation` over every mesh axis, before `anchor`, whose body calls `callee` (lowered
    for one shard's shapes) on `operands`; returns its results (of the whole `result_types`)."""
    context = anchor.context

    def local_type(rtype: ir.Type, labels: Sequence[str]) -> ir.Type:
        ranked = ir.RankedTensorType(rtype)
        return ir.RankedTensorType.get(list(plan.local_shape(ranked.shape, labels)), ranked.element_type)

    def per_value(labelling: Sequence[Sequence[str]]) -> ir.Attribute:
        text = "#sdy.sharding_per_value<[" + ", ".join(plan.sharding(x) for x in labelling) + "]>"
        return ir.Attribute.parse(text, context)

    manual = ", ".join(f'"{name}"' for name, _ in plan.mesh.axes)
    with anchor.location, ir.InsertionPoint(anchor):
        op = ir.Operation.create(
            "sdy.manual_computation", results=list(result_types), operands=list(operands),
            attributes={"in_shardings": per_value(operand_labels), "out_shardings": per_value(result_labels),
                        "manual_axes": ir.Attribute.parse(f"#sdy<manual_axes{{{manual}}}>", context)},
            regions=1)
        block = op.regions[0].blocks.append(*(local_type(v.type, labels) for v, labels in zip(operands, operand_labels,
                                                                                                strict=True)))
        with ir.InsertionPoint(block):
            call = func.CallOp([local_type(t, labels) for t, labels in zip(result_types, result_labels, strict=True)],
                               ir.FlatSymbolRefAttr.get(callee), list(block.arguments))
            sdy.ReturnOp(list(call.results))
    return list(op.results)


def wrap_in_manual_computation(composite: ir.Operation, plan: ShardPlan, callee: str) -> None:
    """Replaces `composite` by a `manual_computation` whose body calls `callee` (the kernel lowered for one
    shard's shapes) on the composite's operands."""
    results = manual_computation(composite, plan, callee, list(composite.operands), plan.cuts.operands,
                                 [r.type for r in composite.results], plan.cuts.results)
    for old, new in zip(composite.results, results, strict=True):
        old.replace_all_uses_with(new)
    composite.erase()


__all__ = ["manual_computation", "wrap_in_manual_computation"]
