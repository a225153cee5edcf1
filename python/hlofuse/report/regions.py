"""Regions: the graph's ops grouped the way a target's compiler fuses them, each with its FLOPs and HBM bytes.

The grouping follows XLA's instruction fusion, walked from consumers to producers: elementwise and layout
ops fuse into their consumer when every user of theirs is in the consumer's region, and a cheap one (not
a transcendental) is duplicated into each consumer otherwise; reductions fuse the elementwise chains that
feed them; dots and convolutions are regions of their own, absorbing their operands' layout ops where the
target's compiler does (TPU, GPU, Neuron: transposes, reshapes, converts and broadcasts; CPU: transposes
and reshapes, which layout assignment folds); kernels, sorts, custom calls and collectives stand alone. On
GPU and TPU a reduction fuses into its consumers too (XLA GPU's Triton softmax fusion; TPU's fusion of a
reduce with its broadcast consumers), so a softmax is one pass there and three on the CPU.

A region reads each tensor it does not compute (the part a slice touches; nothing of a buffer it updates
in place) and writes each tensor a later region or the program's caller reads.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hlofuse.report.graph import Graph, Node


@dataclass(frozen=True)
class FusionRules:
    reduce_into_consumers: bool
    dot_output_fusion: bool
    dot_absorbs: frozenset[str]  # layout ops (and "convert") a dot region takes from its operands
    dot_input_elementwise: bool = False  # elementwise producers used only by the dot fuse into it (TPU)


_LAYOUT = frozenset({"reshape", "transpose", "broadcast_in_dim", "convert", "noop"})
RULES = {
    "cpu": FusionRules(False, False, frozenset({"reshape", "transpose", "noop"})),
    "gpu": FusionRules(True, True, _LAYOUT),
    "tpu": FusionRules(True, True, _LAYOUT | {"iota", "slice", "pad"}, True),
    "neuron": FusionRules(True, True, _LAYOUT),
}


@dataclass
class Region:
    id: int
    kind: str  # dot | loop | reduce | kernel | sort | dus | scatter | collective | custom
    nodes: list[int]
    scope: int
    repeat: float
    flops: float = 0.0
    mxu_flops: float = 0.0
    transcendentals: float = 0.0
    sort_ops: float = 0.0
    collective_bytes: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    site: int | None = None
    dots: list[dict[str, Any]] = field(default_factory=list)
    kernel: Node | None = None
    name: str = ""
    materialized: float = 0.0  # bytes of fresh buffers it writes (outputs and temps)
    unfused: bool = False  # its root comes from a site's decomposition (a composite the target keeps)
    elements: float = 0.0  # elements of its largest output (the loop's trip count)
    variadic_flops: float = 0.0  # flops of reductions over several operands (argmax)
    param_read: float = 0.0  # bytes of program arguments it reads
    writes: list[int] = field(default_factory=list)  # the tensors it materializes

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written


def _short(op: str) -> str:
    return op.split(".", 1)[1] if op.startswith(("stablehlo.", "chlo.")) else op


def form_regions(graph: Graph, family: str) -> list[Region]:
    """Groups `graph`'s nodes into fusion regions for a target of `family` (cpu | tpu | gpu | neuron)."""
    rules = RULES.get(family, RULES["cpu"])
    nodes = graph.nodes
    tensors = graph.tensors
    consumers = graph.consumers()
    producer = [t.producer for t in tensors]
    exclusive: dict[int, int] = {}  # node -> region that owns it
    members: list[set[int]] = []
    roots: list[Node] = []
    result_set = set(graph.results)

    def users_of(node: Node) -> set[int]:
        out: set[int] = set()
        for t in node.outputs:
            out.update(consumers[t])
        return out

    def region_kind(root: Node) -> str:
        return {"dot": "dot", "reduce": "reduce", "kernel": "kernel", "sort": "sort", "dus": "dus",
                "scatter": "scatter", "collective": "collective", "custom": "custom",
                "opaque": "custom"}.get(root.cls, "loop")

    duplicated: dict[int, set[int]] = {}  # node -> regions that compute it as a duplicate

    def covered(node: Node) -> bool:
        """Whether every consumer's region computes `node` itself, so it needs no region of its own."""
        if node.id not in duplicated or set(node.outputs) & result_set:
            return False
        users = users_of(node)
        if not users:
            return False
        for u in users:
            holding = duplicated.get(u, set()) | ({exclusive[u]} if u in exclusive else set())
            if not holding or any(node.id not in members[r] for r in holding):
                return False
        return True

    for root in reversed(nodes):
        if root.id in exclusive or root.cls in ("control", "site"):
            continue
        if root.cls == "layout" and not _needs_region(root, tensors):
            continue
        if root.cls == "elementwise" and root.info.get("layout") == "noop":
            continue
        if root.cls in ("elementwise", "layout") and covered(root):
            continue
        rid = len(members)
        region = {root.id}
        members.append(region)
        roots.append(root)
        exclusive[root.id] = rid
        kind = region_kind(root)
        if kind in ("kernel", "sort", "collective", "custom", "scatter"):
            continue
        dot_side = {root.id} if kind == "dot" else set()
        work = list(root.inputs)
        seen: set[int] = set()
        while work:
            t = work.pop()
            if t in seen:
                continue
            seen.add(t)
            p = producer[t]
            if p is None:
                continue
            pnode = nodes[p]
            if pnode.id in region or pnode.scope != root.scope:
                continue
            cheap = pnode.cls in ("elementwise", "layout") and not pnode.expensive and not _is_big_constant(
                pnode, tensors)
            if pnode.id in exclusive:
                # another region computes it; a cheap op is recomputed here too when a duplicate of this region
                # reads it (that region need not write it for us)
                if cheap and not dot_side and any(u in duplicated and rid in duplicated[u] for u in users_of(pnode)):
                    region.add(pnode.id)
                    duplicated.setdefault(pnode.id, set()).add(rid)
                    work.extend(pnode.inputs)
                continue
            users = users_of(pnode)
            # exclusive only when every reader is this region's own: a duplicate's input is duplicated too
            all_inside = (all(u in region and not (u in duplicated and rid in duplicated[u]) for u in users)
                          and not (set(pnode.outputs) & result_set))
            take, dup = False, False
            if dot_side and users & dot_side:  # a dot's operand: only what the target fuses into its dot
                if all(u in dot_side for u in users) and not set(pnode.outputs) & result_set:
                    if pnode.cls == "layout" and pnode.info.get("layout") in rules.dot_absorbs:
                        take = True
                    elif (pnode.cls == "elementwise" and _short(pnode.op) == "convert"
                          and "convert" in rules.dot_absorbs):
                        take = True
                    elif pnode.cls == "elementwise" and rules.dot_input_elementwise:
                        take = True
                if take:
                    dot_side.add(pnode.id)
            elif pnode.cls in ("elementwise", "layout"):
                if all_inside:
                    take = True
                elif not pnode.expensive and not _is_big_constant(pnode, tensors):
                    take, dup = True, True
            elif pnode.cls == "reduce" and rules.reduce_into_consumers and kind in ("loop", "reduce") and all_inside:
                take, kind = True, "reduce"
            elif (pnode.cls == "dot" and rules.dot_output_fusion and kind == "loop" and all_inside
                  and all(nodes[m].cls in ("elementwise", "layout") for m in region)):
                take, kind = True, "dot"
                dot_side.add(pnode.id)
            if not take:
                continue
            region.add(pnode.id)
            if dup:
                duplicated.setdefault(pnode.id, set()).add(rid)
            else:
                exclusive[pnode.id] = rid
            work.extend(pnode.inputs)
    regions = []
    for rid, region in enumerate(members):
        root = roots[rid]
        regions.append(_summarize(graph, rid, region, root, exclusive, consumers, producer, result_set))
    return regions


def _needs_region(node: Node, tensors: list[Any]) -> bool:
    """A layout op needs a region of its own only when it moves data (not a constant, iota or bitcast)."""
    if _short(node.op) in ("constant", "iota", "get_tuple_element", "tuple", "after_all", "create_token",
                           "partition_id", "replica_id", "optimization_barrier", "reshape", "copy",
                           "sdy.manual_computation.arg", "sdy.manual_computation.result"):
        return False  # no data moves (a reshape is a bitcast in XLA's layouts)
    if node.info.get("layout") == "noop":
        return False
    return True


def _feeds_dot_only(node: Node, region: set[int], nodes: list[Node], users_of: Any) -> bool:  # noqa: ANN401
    return all(u in region for u in users_of(node))


def _is_big_constant(node: Node, tensors: list[Any]) -> bool:
    return _short(node.op) == "constant" and tensors[node.outputs[0]].kind == "const"


def _summarize(graph: Graph, rid: int, region: set[int], root: Node, exclusive: dict[int, int],
               consumers: list[list[int]], producer: list[int | None], results: set[int]) -> Region:
    nodes, tensors = graph.nodes, graph.tensors
    classes = Counter(nodes[n].cls for n in region)
    if root.cls in ("kernel", "sort", "collective", "custom", "scatter", "dus"):
        kind = {"opaque": "custom"}.get(root.cls, root.cls)
    elif classes["dot"]:
        kind = "dot"
    elif classes["reduce"]:
        kind = "reduce"
    elif root.cls == "opaque":
        kind = "custom"
    else:
        kind = "loop"
    out = Region(rid, kind, sorted(region), root.scope, graph.scopes.get(root.scope, 1.0))
    anchor = next((nodes[n] for n in region if nodes[n].cls in ("dot", "kernel")), root)
    out.site, out.unfused = anchor.site, bool(anchor.info.get("unfused"))
    reads: dict[int, float] = {}
    for n in region:
        node = nodes[n]
        out.flops += node.flops if node.cls != "sort" else 0.0
        out.mxu_flops += node.mxu_flops
        out.transcendentals += node.transcendentals
        out.sort_ops += node.sort_ops
        out.collective_bytes += node.collective_bytes
        if node.cls == "dot":
            out.dots.append(node.info)
        if node.cls == "kernel":
            out.kernel = node
        for t in dict.fromkeys(node.inputs):
            p = producer[t]
            if p is not None and p in region:
                continue
            tensor = tensors[t]
            amount = node.touched.get(t, tensor.nbytes)
            if t in reads and t not in node.touched:
                reads[t] = tensor.nbytes
            else:
                reads[t] = min(tensor.nbytes, reads.get(t, 0.0) + amount) if t in node.touched else amount
    for n in region:
        if exclusive.get(n) != rid:
            continue  # a duplicate: its outputs live inside this region only
        node = nodes[n]
        for t in node.outputs:
            outside = t in results or any(c not in region for c in consumers[t])
            if outside:
                out.writes.append(t)
                written = node.written.get(t, tensors[t].nbytes)
                out.bytes_written += written
                out.materialized += written
    out.bytes_read = sum(reads.values())
    out.param_read = sum(v for t, v in reads.items() if tensors[t].producer is None and tensors[t].kind == "param")
    out.elements = max((tensors[t].elements for n in region for t in nodes[n].outputs), default=0)
    out.variadic_flops = sum(nodes[n].flops for n in region if nodes[n].cls == "reduce" and len(nodes[n].outputs) > 1)
    return out


def label(region: Region, graph: Graph) -> str:
    """A short, stable name: the region's kind, its main ops and shapes (no ids), e.g.
    `dot f32[128,512]x[512,1536]`, `reduce(max) f32[8,128,256]->[8,128]`."""
    nodes, tensors = graph.nodes, graph.tensors
    if region.kind == "dot" and region.dots:
        d = max(region.dots, key=lambda d: d["m"] * d["n"] * d["k"] * d["batch"])
        batch = f"{d['batch']}x" if d["batch"] > 1 else ""
        extra = " +epilogue" if any(nodes[n].cls == "elementwise" and _short(nodes[n].op) != "convert"
                                    for n in region.nodes) else ""
        what = "conv" if d.get("conv") else "dot"
        return f"{what} {d['dtype']} {batch}[{d['m']},{d['k']}]x[{d['k']},{d['n']}]{extra}"
    ops = []
    for n in region.nodes:
        node = nodes[n]
        if node.cls in ("layout",) and _short(node.op) in ("constant", "iota", "broadcast_in_dim", "reshape"):
            continue
        short = _short(node.op).replace("custom_call @", "")
        if short.startswith("sdy.manual_computation."):
            continue
        if short not in ops:
            ops.append(short)
    root = nodes[max(region.nodes)]
    out_t = tensors[root.outputs[0]] if root.outputs else None
    shape = f"{out_t.dtype}[{','.join(map(str, out_t.shape))}]" if out_t is not None else ""
    if region.kind == "reduce":
        reduced = [n for n in region.nodes if nodes[n].cls == "reduce"]
        src = tensors[nodes[reduced[0]].inputs[0]]
        dst = tensors[nodes[reduced[-1]].outputs[0]]
        body = "+".join(ops[:4]) + ("+..." if len(ops) > 4 else "")
        return f"reduce({body}) {src.dtype}[{','.join(map(str, src.shape))}]->[{','.join(map(str, dst.shape))}]"
    body = ",".join(ops[:4]) + (",..." if len(ops) > 4 else "")
    if region.kind == "loop":
        return f"fusion({body}) {shape}"
    return f"{body} {shape}"


def dot_padded_flops(info: dict[str, Any], tile: int, family: str) -> float:
    """A dot's FLOPs with its dims padded to the matrix unit's tile (the MXU works on whole tiles)."""
    if tile <= 1:
        return 2.0 * info["batch"] * info["m"] * info["n"] * info["k"]
    rows = 8 if family in ("tpu", "neuron") else tile

    def pad(x: int, to: int) -> int:
        return int(math.ceil(x / to) * to)

    return 2.0 * info["batch"] * pad(info["m"], rows) * pad(info["n"], tile) * pad(info["k"], tile)
