"""Per-shard plans: how each composite's kernel call runs on one shard of a multi-device module.

Which dims to cut, and over which mesh axes, comes from Shardy itself. `plan_shards` copies the module,
replaces each composite by a probe custom call whose sharding rule (`Cuts`) shares the dims a per-shard
kernel can cut and keeps the others whole, and runs Shardy's propagation on the copy. The probe's
propagated result sharding names the mesh axes of each cut dim (`ShardPlan.axes`), and the manual
computation takes exactly those: XLA's own propagation later meets the same shardings at its boundary.
Dims that arrive sharded but that a shard keeps whole (a vocabulary, a sequence no split takes) are
`ShardPlan.gathered`, as data: the lowering decides from them, and prints them only in remarks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from jaxlib.mlir import ir, passmanager
from jaxlib.mlir.dialects import sdy, stablehlo

from hlofuse.kernels import CompositeCall
from hlofuse.ops.attention import ATTENTION
from hlofuse.partition.cuts import Cuts, cuts_for
from hlofuse.partition.rules import _dims, _Factors, _rule, module_meshes

PROBE_TARGET = "hlofuse_shard_probe"
PROPAGATION = "builtin.module(sdy-propagation-pipeline)"
SHARDING_ATTR = "sdy.sharding"


@dataclass(frozen=True)
class Mesh:
    """An `sdy.mesh`: its name and its axes."""

    name: str
    axes: tuple[tuple[str, int], ...]  # (name, size) in mesh order

    def size(self, axes: Sequence[str]) -> int:
        """How many shards the mesh axes `axes` cut a dim into."""
        sizes = dict(self.axes)
        return math.prod(sizes[a] for a in axes)


@dataclass(frozen=True)
class GatheredDim:
    """An operand dim that arrives sharded over mesh axes its call does not cut it over: the partitioner
    all-gathers it before the call."""

    role: str
    """The operand's role: q, k, v, bias, mask, q_lengths, kv_lengths; logits or key."""
    dim: int
    axes: tuple[str, ...] | None
    """The mesh axes it arrives sharded over; None where they are sub-axes."""

    def is_key_sequence(self) -> bool:
        """Whether this is K's or V's key sequence (dim 1 of the canonical (B, S, K, H))."""
        return self.role in ("k", "v") and self.dim == 1

    def __str__(self) -> str:
        """The dim for a remark: `k dim 1 (over seq)`."""
        return f"{self.role} dim {self.dim} (over {', '.join(self.axes or ['sub-axes'])})"


@dataclass(frozen=True)
class ShardPlan:
    """How one composite runs per shard: the mesh axes of each cut factor (an empty tuple keeps it
    whole), and the operand dims that arrive sharded but stay whole (gathered at the boundary)."""

    mesh: Mesh
    cuts: Cuts
    axes: Mapping[str, tuple[str, ...]]
    gathered: tuple[GatheredDim, ...] = ()

    def shards(self, label: str) -> int:
        """How many shards cut the dims labelled `label` (1 for "", a dim kept whole)."""
        return self.mesh.size(self.axes.get(label, ())) if label else 1

    @property
    def is_cut(self) -> bool:
        """Whether any factor is cut: a shard then computes a part of the composite."""
        return any(self.shards(label) > 1 for label in self.axes)

    @property
    def gathers_keys(self) -> bool:
        """Whether K or V arrive with their key sequence sharded and are gathered."""
        return any(dim.is_key_sequence() for dim in self.gathered)

    def local_shape(self, shape: Sequence[int], labels: Sequence[str]) -> tuple[int, ...]:
        """One shard's shape of a whole value of `shape` whose dims carry `labels`."""
        return tuple(size // self.shards(label) for size, label in zip(shape, labels, strict=True))

    def whole_shape(self, shape: Sequence[int], labels: Sequence[str]) -> tuple[int, ...]:
        """The whole value's shape for one shard's `shape`."""
        return tuple(size * self.shards(label) for size, label in zip(shape, labels, strict=True))

    def sharding(self, labels: Sequence[str]) -> str:
        """`<@mesh, [{"data"}, {}, ...]>` for a value whose dims carry `labels`."""
        dims = ", ".join("{" + ", ".join(f'"{a}"' for a in self.axes.get(label, ())) + "}" if label else "{}"
                         for label in labels)
        return f"<@{self.mesh.name}, [{dims}]>"


def _meshes(module: ir.Operation) -> dict[str, Mesh]:
    return {name: Mesh(name, axes) for name, axes in module_meshes(module).items()}


def inside_manual_computation(op: ir.Operation) -> bool:
    parent = op.parent
    while parent is not None and parent.operation.name != "builtin.module":
        if parent.operation.name == "sdy.manual_computation":
            return True
        parent = parent.operation.parent
    return False


def _probe_rule(cuts: Cuts, op: ir.Operation) -> ir.Attribute:
    """The probe's rule: one shared factor per cut label, every other dim a factor of its own, kept whole."""
    factors = _Factors()
    shared: dict[str, str] = {}
    whole: list[str] = []

    def mapping(value: ir.Value, labels: Sequence[str]) -> list[list[str]]:
        dims: list[list[str]] = []
        for size, label in zip(ir.RankedTensorType(value.type).shape, labels, strict=True):
            if not label:
                whole.append(factors.new(size))
                dims.append([whole[-1]])
                continue
            if label not in shared:
                shared[label] = factors.new(cuts.sizes[label])
            dims.append([shared[label]])
            if size != cuts.sizes[label]:  # the compound (factor, rest)
                whole.append(factors.new(size // cuts.sizes[label]))
                dims[-1].append(whole[-1])
        return dims

    operands = [mapping(v, labels) for v, labels in zip(op.operands, cuts.operands, strict=True)]
    results = [mapping(v, labels) for v, labels in zip(op.results, cuts.results, strict=True)]
    factors.need_replication = whole
    return _rule(operands, results, factors, op.context)


def _axes(sharding: ir.Attribute) -> tuple[str, list[tuple[str, ...] | None]]:
    """(mesh name, the axes of each dim; None for a dim cut by sub-axes) of a `#sdy.sharding`."""
    tensor = sdy.TensorShardingAttr(sharding)
    mesh = str(tensor.mesh_or_ref).lstrip("@")
    dims: list[tuple[str, ...] | None] = []
    for dim in tensor.dimension_shardings:
        refs = [sdy.AxisRefAttr(a) for a in sdy.DimensionShardingAttr(dim).axes]
        dims.append(None if any(r.sub_axis_info is not None for r in refs) else tuple(r.name for r in refs))
    return mesh, dims


def _value_sharding(value: ir.Value) -> ir.Attribute | None:
    """The `#sdy.sharding` propagation gave `value` (on its defining op, or on its function argument)."""
    owner = value.owner
    if isinstance(owner, ir.Block):
        parent = owner.owner.operation
        if parent.name != "func.func" or "arg_attrs" not in parent.attributes:
            return None
        attrs = ir.DictAttr(ir.ArrayAttr(parent.attributes["arg_attrs"])[ir.BlockArgument(value).arg_number])
        return attrs[SHARDING_ATTR] if SHARDING_ATTR in attrs else None
    op = owner if isinstance(owner, ir.Operation) else owner.operation
    if SHARDING_ATTR not in op.attributes:
        return None
    per_value = sdy.TensorShardingPerValueAttr(op.attributes[SHARDING_ATTR])
    return per_value.shardings[ir.OpResult(value).result_number]


def _plan(probe: ir.Operation, cuts: Cuts, meshes: dict[str, Mesh], roles: Sequence[str]) -> ShardPlan | None:
    """The plan Shardy's propagation gave `probe`: the mesh axes of each cut label, as the probe's result (or,
    for a label in no result, its operands) arrive, kept whole where they would not split evenly or where an
    exclusive label is cut already; then the operand dims that arrive sharded otherwise (gathered)."""
    arrivals = [_value_sharding(value) for value in probe.operands]
    if SHARDING_ATTR in probe.attributes:
        result = sdy.TensorShardingPerValueAttr(probe.attributes[SHARDING_ATTR]).shardings[0]
        mesh_name, dims = _axes(result)
    else:  # propagation leaves a replicated result unannotated
        names = {_axes(a)[0] for a in arrivals if a is not None} or set(meshes)
        if len(names) != 1:
            return None
        mesh_name, dims = names.pop(), [()] * len(cuts.results[0])
    if mesh_name not in meshes:
        return None
    mesh = meshes[mesh_name]
    axes: dict[str, tuple[str, ...]] = {}
    for label, dim_axes in zip(cuts.results[0], dims, strict=True):
        if label and label not in axes:
            axes[label] = dim_axes or ()  # a sub-axis split stays whole: gathered, never wrong
    for label in set(cuts.sizes) - set(axes):  # in no result (a key sequence, a vocabulary): as it arrives
        axes[label] = next((_axes(arrival)[1][dim] or () for arrival, labels in zip(arrivals, cuts.operands,
                                                                                   strict=True)
                            if arrival is not None for dim, lab in enumerate(labels) if lab == label), ())
    for label in list(axes):
        if not _splits_evenly(probe, cuts, label, mesh.size(axes[label])):
            axes[label] = ()
    for label in [label for label in cuts.exclusive if mesh.size(axes.get(label, ())) > 1][1:]:
        axes[label] = ()  # a shard runs one of the exclusive ranges
    gathered = _gathered(roles, arrivals, cuts, axes)
    return ShardPlan(mesh, cuts, MappingProxyType(axes), gathered)


def _gathered(roles: Sequence[str], arrivals: Sequence[ir.Attribute | None], cuts: Cuts,
              axes: Mapping[str, tuple[str, ...]]) -> tuple[GatheredDim, ...]:
    """The operand dims that arrive sharded over other axes than the plan cuts them over (or over sub-axes)."""
    gathered: list[GatheredDim] = []
    for role, sharding, labels in zip(roles, arrivals, cuts.operands, strict=True):
        if sharding is None:
            continue
        _, arrived = _axes(sharding)
        for dim, (label, dim_axes) in enumerate(zip(labels, arrived, strict=True)):
            wanted = axes.get(label, ()) if label else ()
            if dim_axes is None or dim_axes and tuple(dim_axes) != wanted:
                gathered.append(GatheredDim(role, dim, tuple(dim_axes) if dim_axes is not None else None))
    return tuple(gathered)


def _splits_evenly(probe: ir.Operation, cuts: Cuts, label: str, shards: int) -> bool:
    """Whether every dim labelled `label`, and the label's factor (K in GQA's query heads N = (K, G)),
    divides into `shards` parts."""
    sizes = [size for values, labelling in ((probe.operands, cuts.operands), (probe.results, cuts.results))
             for value, labels in zip(values, labelling, strict=True)
             for size, dim_label in zip(_dims(value), labels, strict=True) if dim_label == label]
    return all(size % shards == 0 for size in (*sizes, cuts.sizes[label]))


def composites_in(root: ir.Operation) -> list[ir.Operation]:
    """Every `stablehlo.composite` under `root`, in walk order."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "stablehlo.composite":
            found.append(op)
        return ir.WalkResult.ADVANCE

    root.walk(visit)
    return found


def plan_shards(module: ir.Operation, composites: Sequence[ir.Operation], calls: Sequence[CompositeCall],
                target: str, devices: int) -> list[ShardPlan | None]:
    """Each composite's per-shard plan, from Shardy's propagation on a copy of `module` in which the
    composites are probes; None where the composite sits in a manual computation already (a shard_map
    body, whose shapes are local), has nothing to cut, or propagation names no mesh for it."""
    meshes = _meshes(module)
    if not meshes:
        return [None] * len(composites)
    copy = module.clone()
    originals, copies = composites_in(module), composites_in(copy)  # the same walk order
    probes: list[tuple[ir.Operation, Cuts] | None] = []
    for composite, call in zip(composites, calls, strict=True):
        cuts = cuts_for(call, target, devices)
        mirror = next((twin for original, twin in zip(originals, copies, strict=True) if original == composite),
                      None)
        if cuts is None or mirror is None or inside_manual_computation(composite):
            probes.append(None)
            continue
        with mirror.location, ir.InsertionPoint(mirror):
            probe = stablehlo.CustomCallOp([r.type for r in mirror.results], list(mirror.operands),
                                           call_target_name=PROBE_TARGET)
        probe.attributes["sdy.sharding_rule"] = _probe_rule(cuts, probe.operation)
        for old, new in zip(mirror.results, probe.results, strict=True):
            old.replace_all_uses_with(new)
        mirror.erase()
        probes.append((probe.operation, cuts))
    try:
        passmanager.PassManager.parse(PROPAGATION, context=module.context).run(copy)
    except ir.MLIRError:  # a module Shardy cannot propagate: no plans, so nothing is lowered per shard
        return [None] * len(composites)
    plans: list[ShardPlan | None] = []
    for entry, call in zip(probes, calls, strict=True):
        if entry is None:
            plans.append(None)
            continue
        # (a sampler's operands after the key: its per-row parameters, sampling_reference.Form.row_params)
        named = ["logits", "key", *(f"per-row operand {i}" for i in range(2, len(call.operand_types)))]
        roles = list(call.attributes.get("operands", [])) or named[:len(call.operand_types)]
        plans.append(_plan(entry[0], entry[1], meshes, roles))
    return plans


def local_call(call: CompositeCall, plan: ShardPlan) -> CompositeCall:
    """`call` as one shard sees it: its operand shapes, and head counts, per shard."""
    types = tuple((plan.local_shape(shape, labels), dtype)
                  for (shape, dtype), labels in zip(call.operand_types, plan.cuts.operands, strict=True))
    attributes = dict(call.attributes)
    if call.name == ATTENTION:
        attributes["num_heads"] = types[0][0][2]
        attributes["num_kv_heads"] = types[1][0][2]
    return CompositeCall(call.name, call.version, attributes, types)


__all__ = ["GatheredDim", "Mesh", "ShardPlan", "composites_in", "inside_manual_computation", "local_call",
           "plan_shards"]
