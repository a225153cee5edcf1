"""The performance model: a program as each target runs it, in fused regions, with predicted times.

For each target the program goes through the default pipeline as that target sees it: prepare and the
fusion passes once (they do not depend on the target), then `hlofuse-lower-kernels{target=T}` for each
of the target's sites. Identical sites (same composite, attributes and operand types: a model's 32 layers)
are lowered once, on a one-composite module, which is what the pass decides for each of them in a
one-device module; so a 32-layer model costs two lowerings per target, not 64. A site the target's
kernels take becomes its kernel call (and the layout ops the lowering wraps around it); a site they refuse
stays a composite, which XLA inlines, so it is modelled as its decomposition; where a target's lowering
cannot run on this host (no Neuron SDK), its sites are modelled as the kernels anyway.

Each region's time is `max(compute, memory) + collective + launch`: compute is its matrix-unit FLOPs at
the chip's peak for the operand dtype (the dims padded to the matrix unit's tile; on the host, the GEMM
rate measured for that size) plus vector FLOPs and transcendentals at the vector units' rates; memory is
its HBM bytes at the chip's bandwidth (the host's cache bandwidth when the region's bytes fit in its last-level
cache). Kernels have their own models (hlofuse.report.kernels). The unfused decomposition is modelled
as XLA runs it, with its (T, S) scores through HBM, so every fusion carries its predicted gain.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func

from hlofuse.report.graph import Flattener, Graph, Node, Site, dtype_bytes, sharded_copy
from hlofuse.report.hardware import Chip, chips_for, resolve_targets
from hlofuse.report.kernels import KernelCost, kernel_cost
from hlofuse.report.regions import Region, dot_padded_flops, form_regions, label

# Buffers of glibc's largest mmap threshold (32 MiB on 64-bit) and more are fresh pages on every call.
FRESH_BUFFER_BYTES = 32 * 1024 * 1024


# ---- results --------------------------------------------------------------------------------------------


@dataclass
class RegionRow:
    """Regions of one kind and shape (e.g. the same matmul in each of 32 layers), summed over a call."""

    name: str
    kind: str
    count: float
    flops: float
    bytes: float
    transcendentals: float
    compute_s: float
    memory_s: float
    collective_s: float
    overhead_s: float
    predicted_s: float
    floor_s: float
    bound: str
    share: float = 0.0
    site: str | None = None
    fix: str = ""
    mxu_flops: float = 0.0
    useful_flops: float = 0.0
    unfused: bool = False
    cpu_s: float = 0.0  # host: the CPU time it takes (predicted_s x the threads it keeps busy)
    transposed: float = 0.0  # host: bytes through transposes of the minor dim

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else math.inf

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in dataclasses.asdict(self).items()}
        out["intensity"] = None if math.isinf(self.intensity) else self.intensity
        return out


@dataclass
class FusionRow:
    site: str
    composite: str
    count: int
    status: str  # kernel | kept | modelled
    reason: str
    kernel: str
    unfused_s: float
    fused_s: float

    @property
    def gain(self) -> float:
        return self.unfused_s / self.fused_s if self.fused_s else math.inf

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["gain"] = None if math.isinf(self.gain) else self.gain
        return out


@dataclass
class NextItem:
    region: str
    predicted_s: float
    floor_s: float
    share: float
    bound: str
    why: str
    fix: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class TargetReport:
    name: str
    chip: Chip
    predicted_s: float
    regions: list[RegionRow]
    fusions: list[FusionRow]
    next: list[NextItem]
    flops: float
    bytes: float
    lowering: str
    notes: list[str] = field(default_factory=list)
    predicted_cpu_s: float = 0.0  # host: CPU time per call (equal to predicted_s when everything runs on one thread)

    def to_json(self) -> dict[str, Any]:
        c = self.chip
        return {"chip": c.description, "kernel_target": c.kernel_target, "predicted_s": self.predicted_s,
                "predicted_cpu_s": self.predicted_cpu_s if c.family == "cpu" else None,
                "flops": self.flops, "bytes": self.bytes, "lowering": self.lowering,
                "peaks": {"flops": c.peak_flops, "vector_flops": c.vector_flops, "hbm_bw": c.hbm_bw,
                          "interconnect_bw": c.interconnect_bw, "launch_s": c.launch_s, "step_s": c.step_s},
                "regions": [r.to_json() for r in self.regions], "fusions": [f.to_json() for f in self.fusions],
                "next": [n.to_json() for n in self.next], "notes": self.notes,
                "calibrated": c.calibrated or None}


@dataclass
class Report:
    program: str
    targets: dict[str, TargetReport]
    fused: bool
    sites: int
    counters: dict[str, int]
    remarks: list[str]
    devices: int
    notes: list[str]
    analysis_s: float
    measured: dict[str, Any] | None = None
    xla_flops: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"program": self.program, "fused": self.fused, "sites": self.sites,
                               "devices": self.devices, "counters": self.counters, "remarks": self.remarks,
                               "notes": self.notes, "analysis_s": self.analysis_s,
                               "targets": {name: t.to_json() for name, t in self.targets.items()}}
        if self.measured is not None:
            out["measured"] = self.measured
        return out


# ---- lowering one site per target --------------------------------------------------------------------------


@dataclass
class Outcome:
    """What a kernel target does with a site: `kernel` (with the lowered wrapper function), `kept` (a remark
    says why) or `modelled` (the target's lowering cannot run here; modelled as the kernel anyway)."""

    status: str
    reason: str = ""
    module: ir.Module | None = None
    wrapper: ir.Operation | None = None


def _called(function: ir.Operation, functions: dict[str, ir.Operation]) -> list[ir.Operation]:
    """`function` and every function it calls, transitively."""
    out: dict[str, ir.Operation] = {}
    work = [function]
    while work:
        f = work.pop()
        name = ir.StringAttr(f.attributes["sym_name"]).value
        if name in out:
            continue
        out[name] = f
        found: list[str] = []

        def visit(op: ir.Operation, found: list[str] = found) -> ir.WalkResult:
            for key in ("callee", "decomposition"):
                if key in op.attributes:
                    found.append(ir.FlatSymbolRefAttr(op.attributes[key]).value)
            return ir.WalkResult.ADVANCE

        f.walk(visit)
        work.extend(functions[n] for n in found if n in functions and n not in out)
    return list(out.values())


def site_module(site: Site, functions: dict[str, ir.Operation]) -> ir.Module:
    """A module whose main is just `site`'s composite (its decomposition and callees copied along)."""
    op = site.op
    context = op.context
    texts = [str(f) for f in _called(functions[site.decomposition], functions)]
    with context, ir.Location.unknown(context):
        module = ir.Module.parse("module {\n" + "\n".join(texts) + "\n}")
        ins = [v.type for v in op.operands]
        outs = [r.type for r in op.results]
        with ir.InsertionPoint.at_block_begin(module.body):
            main = func.FuncOp("main", ir.FunctionType.get(ins, outs))
            block = main.add_entry_block()
            with ir.InsertionPoint(block):
                attrs = op.attributes
                new = ir.Operation.create("stablehlo.composite", results=outs, operands=list(block.arguments),
                                          attributes={k: attrs[k] for k in list(attrs)})
                func.ReturnOp(new.results)
    return module


def lower_site(site: Site, functions: dict[str, ir.Operation], kernel_target: str) -> Outcome:
    """Runs hlofuse-lower-kernels{target=...} on a one-site module and reads what it made of the site."""
    from hlofuse.pipeline import PassFailure, run_pipeline

    module = site_module(site, functions)
    try:
        result = run_pipeline(module, f"builtin.module(hlofuse-lower-kernels{{target={kernel_target}}})")
    except PassFailure as error:
        return Outcome("modelled", f"{kernel_target} lowering unavailable here ({_first_sentence(error.cause)})")
    except Exception as error:  # a lowering that crashes: the composite would be kept by the compile hook
        return Outcome("modelled", f"{kernel_target} lowering failed here ({type(error).__name__}: "
                                   f"{_first_sentence(error)}); modelled as the kernel")
    main = next(op.operation for op in module.body.operations
                if ir.StringAttr(op.operation.attributes["sym_name"]).value == "main")
    body = list(main.regions[0].blocks[0].operations)
    if any(o.operation.name == "stablehlo.composite" for o in body):
        reasons = [r.reason.removeprefix("kept as a composite: ") for r in result.remarks]
        return Outcome("kept", "; ".join(reasons) or "kept as a composite", module)
    functions_after = {ir.StringAttr(o.operation.attributes["sym_name"]).value: o.operation
                       for o in module.body.operations if o.operation.name == "func.func"}
    wrapper = main
    calls = [o.operation for o in body if o.operation.name == "func.call"]
    if len(calls) == 1:
        wrapper = functions_after[ir.FlatSymbolRefAttr(calls[0].attributes["callee"]).value]
    return Outcome("kernel", "", module, wrapper)


def _first_sentence(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text.split(". ")[0][:160]


# ---- expanding sites -------------------------------------------------------------------------------------


def _template(function: ir.Operation, module: ir.Module) -> Graph:
    flattener = Flattener(module)
    flattener.kernel_site = -1
    return flattener.run(function)


def _kernel_template(site: Site) -> Graph:
    g = Graph()
    g.inputs = [g.tensor(shape, dtype, None, "param") for shape, dtype in site.operand_types]
    node = g.add(site.name, "kernel", g.inputs, site.result_types, 0, site=-1)
    node.info["target"] = "modelled"
    g.results = list(node.outputs)
    return g


def expand(base: Graph, templates: dict[int, tuple[Graph, bool]]) -> Graph:
    """`base` with each site node replaced by its template (a graph whose inputs and results stand for the
    site's operands and results); nodes from a template carry the site's index."""
    out = Graph(tensors=[_copy(t) for t in base.tensors], scopes=dict(base.scopes),
                scope_notes=dict(base.scope_notes), inputs=list(base.inputs), results=list(base.results),
                notes=list(base.notes), devices=base.devices, donated=set(base.donated))
    for node in base.nodes:
        if node.cls != "site":
            new = _copy(node, id=len(out.nodes))
            out.nodes.append(new)
            for t in new.outputs:
                out.tensors[t].producer = new.id
            continue
        site_index = node.info["site"]
        template, unfused = templates[site_index]
        tmap: dict[int, int] = dict(zip(template.inputs, node.inputs, strict=True))
        for result, target in zip(template.results, node.outputs, strict=True):
            if result not in tmap:
                tmap[result] = target
        smap = {0: node.scope}
        for scope, times in template.scopes.items():
            if scope == 0:
                continue
            smap[scope] = len(out.scopes)
            out.scopes[smap[scope]] = times * base.scopes.get(node.scope, 1.0)
        for tnode in template.nodes:
            outputs = []
            for t in tnode.outputs:
                if t in tmap:
                    outputs.append(tmap[t])
                else:
                    src = template.tensors[t]
                    tmap[t] = out.tensor(src.shape, src.dtype, None, src.kind)
                    outputs.append(tmap[t])
            inputs = []
            for t in tnode.inputs:
                if t not in tmap:  # a template input we did not map (should not happen): a fresh param
                    src = template.tensors[t]
                    tmap[t] = out.tensor(src.shape, src.dtype, None, "param")
                inputs.append(tmap[t])
            new = _copy(tnode, id=len(out.nodes), inputs=inputs, outputs=outputs,
                                      scope=smap.get(tnode.scope, node.scope), site=site_index,
                                      touched={tmap[k]: v for k, v in tnode.touched.items() if k in tmap},
                                      written={tmap[k]: v for k, v in tnode.written.items() if k in tmap},
                                      info={**tnode.info, "unfused": unfused})
            out.nodes.append(new)
            for t in outputs:
                out.tensors[t].producer = new.id
        for result, target in zip(template.results, node.outputs, strict=True):
            if tmap[result] != target:  # a site result that is one of its operands (a pass-through)
                copy = out.add("copy", "layout", [tmap[result]], [], node.scope, site=site_index)
                copy.outputs = [target]
                out.tensors[target].producer = copy.id
    return out


# ---- costing ---------------------------------------------------------------------------------------------


@dataclass
class Costed:
    region: Region
    name: str
    compute_s: float
    memory_s: float
    collective_s: float
    overhead_s: float
    predicted_s: float
    floor_s: float
    flops: float
    useful_flops: float
    bytes: float
    kernel: KernelCost | None = None
    threads: float = 1.0  # cores it keeps busy (host): its CPU time is predicted_s x threads
    transposed: float = 0.0  # bytes it moves through a transpose of the minor dim (host)


class Coster:
    def __init__(self, chip: Chip, graph: Graph, sites: Sequence[Site], kv_fill: float) -> None:
        self.chip, self.graph, self.sites, self.kv_fill = chip, graph, sites, kv_fill
        self.copy_fused = _copies_fused_into_producers(graph) if chip.family == "cpu" else set()
        self.copy_operands = _copy_operands(graph, self.copy_fused)
        self.copy_strided = _strided_sources(graph) if chip.family == "cpu" else {}
        # The program's arguments come from DRAM on every call unless all of them fit in the cache together
        # (one region's footprint fitting says nothing when the weights of 32 layers stream past it).
        arguments = sum(graph.tensors[t].nbytes for t in graph.inputs)
        self.arguments_from_dram = bool(chip.cache_bytes) and arguments > chip.cache_bytes * 0.75

    def cost(self, region: Region) -> Costed:
        chip, repeat = self.chip, region.repeat
        launch = chip.launch_s
        if region.kernel is not None and region.kind == "kernel":
            return self._kernel(region)
        mxu_s, useful_mxu, exec_mxu = 0.0, 0.0, 0.0
        threads = 1.0
        if chip.family == "cpu" and chip.threads > 1 and region.dots and max(
                2.0 * d["batch"] * d["m"] * d["n"] * d["k"] for d in region.dots) >= 1 << 24:
            threads = chip.threads  # XLA splits a big dot over its threads; everything else runs on one
        for info in region.dots:
            flops = dot_padded_flops(info, chip.matmul_tile, chip.family)
            gemm = 2.0 * info["m"] * info["n"] * info["k"]
            rate = chip.gemm_rate(info["dtype"], gemm)
            if chip.family != "cpu":
                rate = chip.peak(info["dtype"])
            mxu_s += flops / (rate * threads)
            exec_mxu += flops
            useful_mxu += 2.0 * info["batch"] * info["m"] * info["n"] * info["k"]
        vector_s = region.flops / chip.vector_flops + self._transcendental_s(region)
        if chip.variadic_rate and region.variadic_flops:  # argmax-like reductions run as scalar code on a CPU
            vector_s += region.variadic_flops * (1 / chip.variadic_rate - 1 / chip.vector_flops)
        sort_s = region.sort_ops / chip.sort_rate if region.sort_ops else 0.0
        compute = mxu_s + vector_s + sort_s
        nbytes = region.bytes
        memory = chip.memory_time(region.bytes_read, region.bytes_written) if nbytes else 0.0
        transposed = sum(2 * self.graph.tensors[t].nbytes for d in region.dots for t in d.get("strided_copies", ())
                         if t not in self.copy_operands) if chip.family == "cpu" else 0.0
        if self.arguments_from_dram and region.param_read:
            read_bw = chip.read_bw or chip.hbm_bw
            if chip.gemv_bw and region.dots and all(min(d["m"], d["n"]) <= 16 for d in region.dots):
                read_bw = chip.gemv_bw  # a matrix-vector dot streams its weights at its own measured rate
            memory = max(memory, chip.memory_time(region.bytes_read - region.param_read, region.bytes_written)
                         + region.param_read / read_bw)
        if chip.family == "cpu" and chip.transpose_bw:
            memory += self._cpu_layout_copies(region)
            g = self.graph
            # (bytes read + written, bytes between the elements an output row reads) of each transposed tensor
            # and the bytes of what it reads them from
            moves = [(2 * g.tensors[t].nbytes, *self.copy_strided[t]) for n in region.nodes
                     for t in g.nodes[n].outputs if t in self.copy_strided]
            moves += [(2 * g.tensors[g.nodes[n].inputs[0]].nbytes, g.nodes[n].info.get("stride", 0.0),
                       g.tensors[g.nodes[n].inputs[0]].nbytes)
                      for n in region.nodes if g.nodes[n].info.get("permutes") and g.nodes[n].inputs]
            permuted = sum(m for m, _, _ in moves)
            if permuted:
                # XLA's tiled transpose runs only a fusion that is a pure copy; any other op in it (a slice, as
                # of one layer's KV cache, a broadcast, arithmetic) makes it a loop reading through the transpose
                # an element at a time (measured: x[:2048].T 20x x.T's time), whose rate falls as the elements
                # it reads in turn lie further apart (cache lines, pages)
                pure = all(g.nodes[n].info.get("layout") in ("transpose", "reshape", "noop") for n in region.nodes)
                # (each output element passes through once: a broadcast source is read again for each copy)
                scale = min(1.0, 2 * nbytes / permuted)
                permuted *= scale
                rest = chip.memory_time(max(region.bytes_read - permuted / 2, 0.0),
                                        max(region.bytes_written - permuted / 2, 0.0))
                moved = sum(chip.transpose_time(m * scale, fused=not pure, stride=stride, source=source)
                            for m, stride, source in moves)
                memory = max(memory, rest + moved)  # not a stream
                transposed = permuted
            nbytes += sum(2 * self.graph.tensors[t].nbytes for d in region.dots for t in d.get("copies", ())
                          if t not in self.copy_operands)
        collective = region.collective_bytes / chip.interconnect_bw if region.collective_bytes else 0.0
        predicted = max(compute, memory) + collective + launch
        ideal_compute = (useful_mxu / chip.peak(region.dots[0]["dtype"]) if region.dots else 0.0) + vector_s + sort_s
        floor = max(ideal_compute, self._compulsory_bytes(region) / chip.hbm_bw)
        flops = region.flops + exec_mxu + region.transcendentals
        useful = region.flops + useful_mxu + region.transcendentals
        return Costed(region, label(region, self.graph), compute * repeat, memory * repeat, collective * repeat,
                      launch * repeat, predicted * repeat, floor * repeat, flops * repeat, useful * repeat,
                      nbytes * repeat, threads=threads, transposed=transposed * repeat)

    def _transcendental_s(self, region: Region) -> float:
        """exp/tanh/... time: past two per element of one fusion, XLA CPU's code runs them at a slower rate."""
        chip = self.chip
        if not region.transcendentals:
            return 0.0
        if not chip.chain_transcendental_rate or not region.elements:
            return region.transcendentals / chip.transcendental_rate
        fast = min(region.transcendentals, 2 * region.elements)
        return fast / chip.transcendental_rate + (region.transcendentals - fast) / chip.chain_transcendental_rate

    def _cpu_layout_copies(self, region: Region) -> float:
        """Seconds XLA CPU spends copying dot operands into the layout its dot takes (and faulting the copy's
        pages in when it is a fresh buffer)."""
        chip, seconds = self.chip, 0.0
        for info in region.dots:
            for t in info.get("copies", ()):
                if t not in self.copy_operands:
                    size = self.graph.tensors[t].nbytes
                    strided = t in info.get("strided_copies", ())
                    seconds += chip.transpose_time(2 * size) if strided else chip.memory_time(size, size)
        return seconds

    def _kernel(self, region: Region) -> Costed:
        chip, node, repeat = self.chip, region.kernel, region.repeat
        assert node is not None
        site_index = node.site if node.site is not None and node.site >= 0 else None
        if site_index is None or site_index >= len(self.sites):
            # a kernel whose composite we do not know (a module lowered elsewhere): its bytes at bandwidth
            nbytes = region.bytes
            memory = chip.memory_time(region.bytes_read, region.bytes_written)
            t = memory + chip.launch_s
            name = f"kernel {node.info.get('target', node.op)}"
            return Costed(region, name, 0.0, memory * repeat, 0.0, chip.launch_s * repeat, t * repeat, memory * repeat,
                          0.0, 0.0, nbytes * repeat)
        site = self.sites[site_index]
        site = self._local_site(site, node)
        k = kernel_cost(chip, site, node.info.get("kernel_operands"), kv_fill=self.kv_fill)
        overlap = not k.details.get("serial")  # the CPU kernel at decode loads a block, then computes on it
        predicted = (max(k.compute_s, k.memory_s) if overlap else k.compute_s + k.memory_s) + chip.launch_s
        min_bytes = k.bytes if k.details.get("kv_reads", 1) <= 1 else k.bytes - k.details["kv_bytes"] * (
            k.details["kv_reads"] - 1)
        dtype = site.operand_types[0][1]
        floor = max(k.useful_flops / chip.peak(dtype) if site.name == "hlofuse.attention" else 0.0,
                    min_bytes / chip.hbm_bw)
        threads = chip.kernel_threads if chip.family == "cpu" else 1.0
        return Costed(region, k.name, k.compute_s * repeat, k.memory_s * repeat, 0.0, chip.launch_s * repeat,
                      predicted * repeat, floor * repeat, k.flops * repeat, k.useful_flops * repeat,
                      k.bytes * repeat, k, threads)

    def _local_site(self, site: Site, node: Node) -> Site:
        """`site` with the operand types the kernel node sees (per device in a sharded module)."""
        types = tuple((self.graph.tensors[t].shape, self.graph.tensors[t].dtype) for t in node.inputs)
        if node.info.get("target") == "modelled" and len(types) == len(site.operand_types):
            results = tuple((self.graph.tensors[t].shape, self.graph.tensors[t].dtype) for t in node.outputs)
            if types != site.operand_types:
                return dataclasses.replace(site, operand_types=types, result_types=results)
        return site

    def _compulsory_bytes(self, region: Region) -> float:
        """What a region must move even fused into its neighbours: program inputs it reads, results it writes."""
        g = self.graph
        results = set(g.results)
        total = 0.0
        members = set(region.nodes)
        for n in region.nodes:
            node = g.nodes[n]
            for t in set(node.inputs):
                tensor = g.tensors[t]
                if tensor.producer is None and tensor.kind == "param":
                    total += node.touched.get(t, tensor.nbytes)
            for t in node.outputs:
                if t in results and g.tensors[t].producer in members:
                    total += node.written.get(t, g.tensors[t].nbytes)
        return total


def _copies_fused_into_producers(graph: Graph, strided: bool = False) -> set[int]:
    """Dot operands XLA CPU copies into its dot's layout where the copy fuses into the operand's producer (a
    fusion whose only reader is the dot writes the operand in that layout): no copy of their own."""
    consumers = graph.consumers()
    fused = set()
    for node in graph.nodes:
        for t in node.info.get("strided_copies" if strided else "copies", ()) if node.cls == "dot" else ():
            source, reader = t, node.id
            while True:  # through bitcasts (reshapes) to the op that computes the operand
                p = graph.tensors[source].producer
                if p is None or consumers[source] != [reader]:
                    p = None
                    break
                if graph.nodes[p].info.get("layout") in ("reshape", "noop") and graph.nodes[p].inputs:
                    source, reader = graph.nodes[p].inputs[0], p
                    continue
                break
            if p is not None and graph.nodes[p].cls in ("elementwise", "layout"):
                fused.add(source)
    return fused


def _viewed_through_reshapes(graph: Graph, t: int, targets: set[int]) -> int:
    """The first of `t` and the tensors it views through reshapes and no-op layouts (walking to their inputs) that
    is in `targets`; the last one reached when none is."""
    source = t
    while source not in targets:
        p = graph.tensors[source].producer
        if p is None or graph.nodes[p].info.get("layout") not in ("reshape", "noop") or not graph.nodes[p].inputs:
            break
        source = graph.nodes[p].inputs[0]
    return source


def _strided_sources(graph: Graph) -> dict[int, tuple[float, float]]:
    """The tensors whose producers write a dot operand's strided layout copy (`_copies_fused_into_producers`),
    each with the bytes between the elements the copy reads in turn and the bytes it reads them from. A
    broadcast in the producer (GQA's jnp.repeat of the KV heads) reads its smaller input: its elements lie
    closer together by the ratio of the sizes (the repeated dims are the minor ones there)."""
    sources = _copies_fused_into_producers(graph, strided=True)
    out: dict[int, tuple[float, float]] = {}
    for node in graph.nodes:
        for t, stride in node.info.get("strides", {}).items() if node.cls == "dot" else ():
            source = _viewed_through_reshapes(graph, t, sources)
            if source not in sources:
                continue
            producer = graph.tensors[source].producer
            node_p = graph.nodes[producer] if producer is not None else None
            read = graph.tensors[source].nbytes
            if node_p is not None and node_p.info.get("layout") in ("broadcast_in_dim", "broadcast") and node_p.inputs:
                stride *= graph.tensors[node_p.inputs[0]].elements / max(graph.tensors[source].elements, 1)
                read = graph.tensors[node_p.inputs[0]].nbytes
            out[source] = (stride, read)
    for source in sources:
        out.setdefault(source, (0.0, graph.tensors[source].nbytes))
    return out


def _copy_operands(graph: Graph, fused: set[int]) -> set[int]:
    """The dot operands (the tensors the dots read) whose layout copy fused into a producer in `fused`."""
    out = set()
    for node in graph.nodes:
        for t in node.info.get("copies", ()) if node.cls == "dot" else ():
            source = _viewed_through_reshapes(graph, t, fused)
            if source in fused:
                out.add(t)
    return out


def bound_of(c: Costed, chip: Chip) -> str:
    parts = {"compute": c.compute_s, "memory": c.memory_s, "interconnect": c.collective_s, "overhead": c.overhead_s}
    return max(parts, key=lambda k: parts[k])


# ---- the analysis ---------------------------------------------------------------------------------------


@dataclass
class Prepared:
    """A program after the target-independent passes, flattened once."""

    module: ir.Module
    base: Graph
    sites: list[Site]
    functions: dict[str, ir.Operation]
    counters: dict[str, int]
    remarks: list[str]
    devices: int
    notes: list[str]
    fused: bool
    outcomes: dict[tuple[Any, str], Outcome] = field(default_factory=dict)
    templates: dict[tuple[Any, str], tuple[Graph, bool]] = field(default_factory=dict)
    expanded: dict[str, tuple[Graph, dict[int, Outcome]]] = field(default_factory=dict)  # per kernel target
    regions: dict[tuple[Any, ...], list[Region]] = field(default_factory=dict)  # per (graph key, family)


def prepare(module: ir.Module, *, fuse: bool = True) -> Prepared:
    """Runs prepare and the fusion passes on a copy of `module` (unless `fuse` is False) and flattens it."""
    from hlofuse.ir.context import clone_module
    from hlofuse.pipeline import run_pipeline
    from hlofuse.sharding import device_count

    clone = clone_module(module)
    counters: dict[str, int] = {}
    remarks: list[str] = []
    notes: list[str] = []
    if fuse:
        result = run_pipeline(clone, "default")
        counters = dict(result.counters)
        remarks = [str(r) for r in result.remarks]
    else:  # XLA inlines calls and eliminates common subexpressions before it fuses (jnp.var's second mean)
        run_pipeline(clone, "builtin.module(hlofuse-prepare)")
    devices = device_count(clone.operation)
    sharded = None
    if devices > 1:
        sharded = sharded_copy(clone)
        if sharded is None:
            notes.append(f"{devices} devices, but Shardy's propagation failed on the module: shapes are global "
                         "(per-device costs overstated)")
        else:
            notes.append(f"{devices} devices: per-device shapes from Shardy's propagation; collectives at the "
                         "interconnect bandwidth")
    flattener = Flattener(clone, sharded=sharded)
    flattener.graph.devices = devices
    base = flattener.run()
    for scope, note in base.scope_notes.items():
        notes.append(f"loop scope {scope}: {note}")
    return Prepared(flattener.module, base, flattener.sites, flattener.functions, counters, remarks, devices, notes,
                    fuse)


def _templates_for(prepared: Prepared, kernel_target: str) -> tuple[dict[int, tuple[Graph, bool]], dict[int, Outcome]]:
    templates: dict[int, tuple[Graph, bool]] = {}
    outcomes: dict[int, Outcome] = {}
    for site in prepared.sites:
        key = (site.signature, kernel_target)
        if key not in prepared.outcomes:
            prepared.outcomes[key] = lower_site(site, prepared.functions, kernel_target)
        outcome = prepared.outcomes[key]
        outcomes[site.index] = outcome
        if key not in prepared.templates:
            if outcome.status == "kernel" and outcome.module is not None and outcome.wrapper is not None:
                prepared.templates[key] = (_template(outcome.wrapper, outcome.module), False)
            elif outcome.status == "modelled" or (prepared.devices > 1 and outcome.status == "kernel"):
                prepared.templates[key] = (_kernel_template(site), False)
            else:
                prepared.templates[key] = (unfused_template(prepared, site), True)
        templates[site.index] = prepared.templates[key]
    return templates, outcomes


def unfused_template(prepared: Prepared, site: Site) -> Graph:
    key = (site.signature, "unfused")
    if key not in prepared.templates:
        prepared.templates[key] = (_template(prepared.functions[site.decomposition], prepared.module), True)
    return prepared.templates[key][0]


def _isolated_time(prepared: Prepared, key: tuple[Any, ...], graph: Graph, chip: Chip, kv_fill: float,
                   site: Site) -> float:
    """A template's predicted time run on its own (inputs from HBM, results written)."""
    cache_key = (key, chip.family)
    if cache_key not in prepared.regions:
        graph = _clone_graph(graph)
        for node in graph.nodes:
            if node.cls == "kernel":
                node.site = 0
        prepared.regions[cache_key] = form_regions(graph, chip.family)
        prepared.regions[(cache_key, "graph")] = graph  # type: ignore[assignment]
    regions = prepared.regions[cache_key]
    graph = prepared.regions[(cache_key, "graph")]  # type: ignore[assignment]
    coster = Coster(chip, graph, [dataclasses.replace(site, index=0)], kv_fill)
    return sum(coster.cost(r).predicted_s for r in regions)


def analyze_target(prepared: Prepared, chip: Chip, *, kv_fill: float = 1.0) -> TargetReport:
    if chip.kernel_target not in prepared.expanded:
        templates, outcomes = _templates_for(prepared, chip.kernel_target)
        prepared.expanded[chip.kernel_target] = (expand(prepared.base, templates), outcomes)
    graph, outcomes = prepared.expanded[chip.kernel_target]
    key = ("main", chip.kernel_target, chip.family)
    if key not in prepared.regions:
        prepared.regions[key] = form_regions(graph, chip.family)
    regions = prepared.regions[key]
    coster = Coster(chip, graph, prepared.sites, kv_fill)
    costed = [coster.cost(r) for r in regions]
    notes: list[str] = []
    alloc = _allocation(costed, graph, chip)
    rows = _aggregate(costed, chip, prepared.sites)
    if alloc is not None:
        rows.append(alloc)
    rows.extend(_argument_copies(graph, chip))
    rows.append(RegionRow("call: dispatch of the program", "call", 1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, chip.step_s,
                          chip.step_s, chip.step_s, "overhead",
                          fix="a fixed cost per call: more work per call (a larger batch, several steps in one "
                              "program) amortises it", cpu_s=chip.step_s))
    total = sum(r.predicted_s for r in rows)
    total_cpu = sum(r.cpu_s or r.predicted_s for r in rows)
    for row in rows:
        row.share = row.predicted_s / total if total else 0.0
    rows.sort(key=lambda r: -r.predicted_s)
    fusions = _fusions(prepared, outcomes, chip, kv_fill)
    lowering = "ok"
    modelled = {o.reason for o in outcomes.values() if o.status == "modelled"}
    if modelled:
        lowering = "kernels modelled without lowering: " + "; ".join(sorted(modelled))
    nexts = next_steps(rows, total, chip, fusions)
    flops = sum(c.flops for c in costed)
    nbytes = sum(c.bytes for c in costed)
    return TargetReport(chip.name, chip, total, rows, fusions, nexts, flops, nbytes, lowering, notes, total_cpu)


def _allocation(costed: list[Costed], graph: Graph, chip: Chip) -> RegionRow | None:
    """Host only: fresh buffers above the mmap threshold are page-faulted in on every call."""
    fault_bw = chip.fault_bw
    if chip.family != "cpu" or not fault_bw:
        return None
    results = set(graph.results)
    fused_operands = _copy_operands(graph, _copies_fused_into_producers(graph))
    # The temp arena: peak bytes live of intermediates, in program order (XLA's buffer assignment reuses
    # buffers as they die).
    order = sorted(costed, key=lambda c: max(c.region.nodes))
    last_use: dict[int, int] = {}
    consumers = graph.consumers()
    region_of: dict[int, int] = {}
    for i, c in enumerate(order):
        for n in c.region.nodes:
            region_of.setdefault(n, i)
    live, peak, outputs = 0.0, 0.0, 0.0
    born: dict[int, float] = {}
    # XLA's buffer assignment also puts an intermediate into a result's buffer when the intermediate dies
    # before the result is written (a softmax's exp lives in its output): slots of (size, region writing it)
    slots = sorted((graph.tensors[t].nbytes, region_of.get(graph.tensors[t].producer, len(order)), t)
                   for t in results if graph.tensors[t].producer is not None)
    occupied: dict[int, int] = {}  # slot tensor -> the intermediate in it
    for i, c in enumerate(order):
        # tensors read for the last time here (XLA CPU's arenas, as memory_analysis reports them, show no
        # in-place reuse of a dying operand by an elementwise fusion: not modelled)
        dying = [t for t, last in last_use.items() if last == i]
        for t in c.region.writes:
            n = graph.tensors[t].producer
            assert n is not None
            users = [region_of.get(u, i) for u in consumers[t]]
            if t in results:
                size = graph.nodes[n].written.get(t, graph.tensors[t].nbytes)
                if size >= FRESH_BUFFER_BYTES:
                    outputs += size
                continue
            if not any(u != i for u in users) or t in born:
                continue
            size = graph.tensors[t].nbytes
            last = max(users)
            slot = next((r for sz, at, r in slots if sz == size and at >= last and r not in occupied), None)
            if slot is not None:
                occupied[slot] = t
                size = 0.0  # lives in the result's buffer
            else:
                live += size
            born[t] = size
            last_use[t] = last
        copies = sum(graph.tensors[t].nbytes for d in c.region.dots for t in d.get("copies", ())
                     if t not in fused_operands)
        peak = max(peak, live + copies)
        for t in dying:
            live -= born.pop(t)
            del last_use[t]
            for r, held in list(occupied.items()):
                if held == t:
                    del occupied[r]
    fresh = outputs + (peak if peak >= FRESH_BUFFER_BYTES else 0.0)
    if not fresh:
        return None
    t = fresh / fault_bw
    return RegionRow("allocation: fresh pages of buffers > 32 MiB", "allocation", 1, 0.0, fresh, 0.0, 0.0, 0.0, 0.0,
                     t, t, 0.0, "overhead", cpu_s=t,
                     fix=f"{_human_bytes(fresh)} of buffers above glibc's mmap threshold fault in on every call "
                         f"(~{fault_bw / 1e9:.1f} GB/s here): donate them or keep temporaries smaller")


def _argument_copies(graph: Graph, chip: Chip) -> list[RegionRow]:
    """An argument updated in place (dynamic_update_slice, scatter: a KV cache) whose buffer was not donated
    is copied first, whole: XLA's copy insertion keeps the caller's array intact. One row per shape."""
    consumers = graph.consumers()
    groups: dict[tuple[tuple[int, ...], str], list[int]] = defaultdict(list)
    for t in graph.inputs:
        if t in graph.donated:
            continue
        if any(graph.nodes[n].cls in ("dus", "scatter") and graph.nodes[n].inputs[:1] == [t] for n in consumers[t]):
            groups[(graph.tensors[t].shape, graph.tensors[t].dtype)].append(t)
    rows = []
    for (shape, dtype), members in groups.items():
        size = graph.tensors[members[0]].nbytes
        t = chip.memory_time(size, size) + chip.launch_s
        total = t * len(members)
        rows.append(RegionRow(f"copy: argument {dtype}[{','.join(map(str, shape))}] updated in place, not donated",
                              "dus", len(members), 0.0, 2 * size * len(members), 0.0, 0.0, total - chip.launch_s *
                              len(members), 0.0, chip.launch_s * len(members), total, 0.0, "memory", cpu_s=total,
                              fix=f"XLA copies the {_human_bytes(size)} argument before updating it in place: donating "
                                  "it (jax.jit(..., donate_argnums=...)) removes the copy"))
    return rows


def _aggregate(costed: list[Costed], chip: Chip, sites: list[Site]) -> list[RegionRow]:
    groups: dict[str, list[Costed]] = defaultdict(list)
    for c in costed:
        site = sites[c.region.site] if c.region.site is not None and 0 <= c.region.site < len(sites) else None
        prefix = ""
        if site is not None and c.region.kind != "kernel":
            prefix = f"[{site.name} {'decomposition' if c.region.unfused else 'wrapper'}] "
        groups[prefix + c.name].append(c)
    rows = []
    for name, members in groups.items():
        first = members[0]
        row = RegionRow(name, first.region.kind, sum(m.region.repeat for m in members),
                        sum(m.flops for m in members), sum(m.bytes for m in members),
                        sum(m.region.transcendentals * m.region.repeat for m in members),
                        sum(m.compute_s for m in members), sum(m.memory_s for m in members),
                        sum(m.collective_s for m in members), sum(m.overhead_s for m in members),
                        sum(m.predicted_s for m in members), sum(m.floor_s for m in members), "")
        row.useful_flops = sum(m.useful_flops for m in members)
        row.cpu_s = sum(m.predicted_s * m.threads for m in members)
        row.transposed = sum(m.transposed for m in members)
        row.mxu_flops = sum(m.region.mxu_flops * m.region.repeat for m in members)
        parts = {"compute": row.compute_s, "memory": row.memory_s, "interconnect": row.collective_s,
                 "overhead": row.overhead_s}
        row.bound = max(parts, key=lambda k: parts[k])
        if first.region.site is not None and 0 <= first.region.site < len(sites):
            row.site = sites[first.region.site].name
            row.unfused = first.region.unfused
        row.fix = _fix(row, first, chip)
        rows.append(row)
    return rows


def _human_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _fix(row: RegionRow, sample: Costed, chip: Chip) -> str:
    """What bounds a region and what would move it, in one sentence."""
    region = sample.region
    k = sample.kernel
    if k is not None:
        if "decode" in k.name or row.bound == "memory":
            return (f"bound by reading {_human_bytes(k.details.get('kv_bytes', k.bytes))} of K/V per call: fewer KV "
                    "heads (GQA/MQA), a narrower cache dtype, or reading only the filled prefix (kv_lengths) moves it")
        padded = k.details.get("head_dim_padded")
        if k.useful_flops and k.flops > 1.5 * k.useful_flops:
            head = k.details.get("head_dim", padded)
            why = f"head dim {head} padded to {padded} lanes, " if padded and padded > head else ""
            return (f"the matrix unit does {k.flops / max(k.useful_flops, 1):.1f}x the useful FLOPs ({why}masked tiles "
                    "computed): larger heads or a window/causal mask that skips more tiles moves it")
        return ("near its compute roof: fewer FLOPs (a sliding window, fewer query heads) or a lower precision "
                "(bf16/fp8 peaks) moves it")
    if row.bound == "overhead":
        return (f"{row.count:.0f} small regions of {row.predicted_s / max(row.count, 1) * 1e6:.1f} us each, most of it "
                "fixed cost: fewer, larger ops (fusing, batching, a scan) move it")
    if row.bound == "memory" and row.transposed > 0.25 * row.bytes:
        return (f"{_human_bytes(row.transposed)} go through a transpose of the minor dim, which XLA CPU runs far "
                "below its streaming bandwidth: an operand order that keeps the contiguous dim in place (the einsum's "
                "layout, or the dot's [batch, rows, contraction]) moves it")
    if row.bound == "interconnect":
        return (f"{_human_bytes(region.collective_bytes * region.repeat)} over the interconnect per call: a "
                "sharding that keeps the contraction local, or overlapping it with compute, moves it")
    if region.kind == "dot":
        dtype = region.dots[0]["dtype"] if region.dots else "f32"
        if row.bound == "compute":
            if dtype == "f32" and chip.peak("bf16") > 1.5 * chip.peak("f32"):
                return (f"f32 operands run at {chip.peak('f32') / 1e12:.3g} TFLOP/s; bf16 at "
                        f"{chip.peak('bf16') / 1e12:.3g} ({chip.peak('bf16') / chip.peak('f32'):.1f}x) moves it")
            if row.useful_flops and row.flops > 1.3 * row.useful_flops:
                return (f"dims padded to the {chip.matmul_tile}-wide matrix unit waste "
                        f"{100 * (1 - row.useful_flops / row.flops):.0f}% of its work: multiples of "
                        f"{chip.matmul_tile} move it")
            return "at its compute roof: fewer FLOPs or a lower precision moves it"
        m = min(d["m"] for d in region.dots) if region.dots else 0
        ridge = chip.peak(dtype) / chip.hbm_bw
        return (f"intensity {row.intensity:.0f} FLOP/B is under the ridge ({ridge:.0f}): more rows per weight read "
                f"(M = {m}: batch more tokens) or narrower weights (bf16/int8) moves it")
    if row.site is not None and not row.unfused:
        return (f"layout work the {chip.kernel_target} lowering of {row.site} wraps around its kernel (transposes, "
                "pads, a split-K merge): a kernel that takes the program's layout moves it")
    if row.site is not None and row.unfused:
        return (f"part of a {row.site} composite this target keeps: its intermediates go through HBM; the "
                "fused kernel would keep them on chip")
    if region.kind == "sort":
        return "a full sort: a sort-free selection (hlofuse's sampler, a top-k threshold) moves it"
    if region.kind in ("loop", "reduce", "dus"):
        return (f"a memory pass of {_human_bytes(row.bytes / max(row.count, 1))} per region: fusing it into its "
                "producer or consumer (or a kernel) saves the round trip")
    return "opaque to the model: its bytes at the memory bandwidth"


def _fusions(prepared: Prepared, outcomes: dict[int, Outcome], chip: Chip, kv_fill: float) -> list[FusionRow]:
    groups: dict[Any, list[Site]] = defaultdict(list)
    for site in prepared.sites:
        groups[site.signature].append(site)
    rows = []
    for _, sites in groups.items():
        site = sites[0]
        outcome = outcomes[site.index]
        unfused = _isolated_time(prepared, (site.signature, "unfused"), unfused_template(prepared, site), chip,
                                 kv_fill, site)
        if outcome.status == "kept":
            fused = unfused
            kernel = "kept as a composite"
        else:
            key = (site.signature, chip.kernel_target)
            fused = _isolated_time(prepared, key, prepared.templates[key][0], chip, kv_fill, site)
            kernel = kernel_cost(chip, site, None, kv_fill=kv_fill).name
        name = f"{site.name}#{site.index} {site_summary(site)}"
        if site.location and not site.location.startswith(("-:", "loc(", "unknown")):
            name += f" at {site.location}"
        if len(sites) > 1:
            name += f" (+{len(sites) - 1} alike)"
        rows.append(FusionRow(name, site.name, len(sites), outcome.status, outcome.reason, kernel,
                              unfused * len(sites), fused * len(sites)))
    return rows


def site_summary(site: Site) -> str:
    """`[B1 T128 S1024 N8/2 H64 f32 causal]` or `[8x128256 f32 top_p]`."""
    a = site.attributes
    if site.name == "hlofuse.attention" and len(site.operand_types) >= 3:
        (q, dtype), (k, _) = site.operand_types[0], site.operand_types[1]
        heads = f"{q[2]}/{k[2]}" if k[2] != q[2] else f"{q[2]}"
        mask = " causal" if a.get("causal") else ""
        if int(a.get("window_left", -1)) >= 0:
            mask += f" window {a['window_left']}"
        phase = " decode" if a.get("decode") else ""
        return f"[B{q[0]} T{q[1]} S{k[1]} N{heads} H{q[3]} {dtype}{mask}{phase}]"
    shape, dtype = site.operand_types[0]
    return f"[{'x'.join(map(str, shape))} {dtype} {a.get('mode', '?')}]"


def _copy(obj: Any, **changes: Any) -> Any:  # noqa: ANN401
    """A shallow copy of a dataclass instance with `changes` (much cheaper than dataclasses.replace)."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(changes)
    return new


def _clone_graph(graph: Graph) -> Graph:
    return Graph(tensors=[_copy(t) for t in graph.tensors],
                 nodes=[_copy(n, info=dict(n.info)) for n in graph.nodes], scopes=dict(graph.scopes),
                 scope_notes=dict(graph.scope_notes), inputs=list(graph.inputs), results=list(graph.results))


def next_steps(rows: list[RegionRow], total: float, chip: Chip, fusions: list[FusionRow]) -> list[NextItem]:
    """The next 2x: regions holding the most time above their floor (the time their compulsory work would
    take at the chip's roofs), until their gaps add up to half the call, at most five."""
    candidates = sorted(rows, key=lambda r: -(r.predicted_s - r.floor_s))
    out: list[NextItem] = []
    gained = 0.0
    for row in candidates:
        gap = row.predicted_s - row.floor_s
        if gap <= 0 or gap < 0.02 * total:
            break
        why = {"compute": "compute-bound", "memory": "memory-bound", "overhead": "overhead-bound",
               "interconnect": "interconnect-bound"}[row.bound]
        if row.bound == "memory" and row.bytes:
            why += f" ({_human_bytes(row.bytes)} at {row.bytes / max(row.memory_s, 1e-30) / 1e9:.0f} GB/s)"
        elif row.bound == "compute" and row.flops:
            why += f" ({row.flops / 1e9:.3g} GFLOP at {row.flops / max(row.compute_s, 1e-30) / 1e12:.3g} TFLOP/s)"
        out.append(NextItem(row.name, row.predicted_s, row.floor_s, row.share, row.bound, why, row.fix))
        gained += gap
        if gained >= total / 2 or len(out) >= 5:
            break
    return out


def analyze(module: ir.Module, targets: str | list[str] | None = None, *, fuse: bool = True, kv_fill: float = 1.0,
            calibrate: bool = True, program: str = "program", verbose: bool = False) -> Report:
    """The report of `module` for `targets` (all chips by default)."""
    start = time.perf_counter()
    names = resolve_targets(targets)
    chips = chips_for(names, calibrate_host=calibrate, verbose=verbose)
    prepared = prepare(module, fuse=fuse)
    reports = {name: analyze_target(prepared, chips[name], kv_fill=kv_fill) for name in names}
    notes = list(prepared.notes)
    if kv_fill != 1.0:
        notes.append(f"attention sites with kv_lengths read {kv_fill:.0%} of their cache (--kv-fill)")
    return Report(program, reports, fuse, len(prepared.sites), prepared.counters, prepared.remarks, prepared.devices,
                  notes, time.perf_counter() - start)


def total_flops(module: ir.Module, *, executed: bool = True, family: str = "cpu") -> dict[str, float]:
    """FLOPs of `module` without hlofuse's fusion, as XLA's cost analysis counts them: summed over the fused
    regions of `family` (`executed`: cheap ops duplicated into several fusions count once per fusion, as
    in XLA's count of its fused module), or over the ops once each."""
    prepared = prepare(module, fuse=False)
    if not executed:
        return prepared.base.totals()
    out = {"flops": 0.0, "mxu_flops": 0.0, "transcendentals": 0.0}
    for region in form_regions(prepared.base, family):
        out["flops"] += region.flops * region.repeat
        out["mxu_flops"] += region.mxu_flops * region.repeat
        out["transcendentals"] += region.transcendentals * region.repeat
    return out


def bytes_of(shape: Sequence[int], dtype: str) -> float:
    return math.prod(shape) * dtype_bytes(dtype)
