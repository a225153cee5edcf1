"""A StableHLO module flattened into one dataflow graph of costed ops, as XLA would run it.

XLA inlines calls and composite decompositions before it fuses, so the graph does too: `func.call`
bodies and kept composites' decompositions are expanded in place, a `while` body becomes a scope that
runs `trip count` times (read from the loop's counter when it is a constant bound), and every
`hlofuse.*` composite becomes a `Site` placeholder that `expand` later replaces with what a target
runs there (the decomposition, or the kernel call and its layout wrappers). Each node carries the
FLOPs XLA's HloCostAnalysis counts for it (one per element for elementwise ops, transcendentals apart,
`2·M·N·K` for dots, one per reduced element times the reducer's ops), so totals agree with
`compiled.cost_analysis()` where XLA counts right.

Sharded modules: Shardy's propagation (`sdy-propagation-pipeline`) runs on a copy, and every value
takes its per-device shape from the sharding propagation gave it; a dot or reduce whose contracted
dims are sharded adds the all-reduce of its result, an operand that arrives more sharded than its
consumer's result adds an all-gather.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jaxlib.mlir import ir, passmanager

DTYPE_BYTES = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "f8E4M3FN": 1, "f8E5M2": 1, "i64": 8, "ui64": 8, "i32": 4,
               "ui32": 4, "i16": 2, "ui16": 2, "i8": 1, "ui8": 1, "i4": 0.5, "i1": 1, "complex<f32>": 8,
               "complex<f64>": 16}

# Ops XLA's cost analysis counts one flop per output element for (compare and select included).
ELEMENTWISE = frozenset("""add subtract multiply divide remainder maximum minimum negate abs sign floor ceil
round_nearest_even round_nearest_afz compare select and or xor not shift_left shift_right_logical
shift_right_arithmetic clamp convert popcnt count_leading_zeros is_finite real imag complex reduce_precision
""".split())
# Elementwise ops XLA counts as transcendentals, not flops.
TRANSCENDENTAL = frozenset("""exponential exponential_minus_one log log_plus_one logistic tanh sine cosine tan
sqrt rsqrt cbrt power atan2""".split())
# chlo ops that survive to XLA's input as elementwise math: (flops, transcendentals) per element, as XLA
# expands them (erf: a rational polynomial; the rest approximations of that size).
CHLO_ELEMENTWISE = {"erf": (12, 1), "erf_inv": (20, 2), "lgamma": (30, 2), "digamma": (30, 2), "erfc": (12, 1),
                    "acos": (8, 2), "asin": (8, 2), "atan": (8, 1), "acosh": (6, 2), "asinh": (6, 2),
                    "atanh": (6, 1), "cosh": (4, 2), "sinh": (4, 2), "next_after": (6, 0), "is_inf": (1, 0),
                    "is_neg_inf": (1, 0), "is_pos_inf": (1, 0), "polygamma": (40, 3), "zeta": (40, 3),
                    "bessel_i1e": (20, 1), "square": (1, 0), "conj": (1, 0)}
# No flops; fused into their consumers as index arithmetic.
LAYOUT = frozenset("""reshape transpose broadcast_in_dim broadcast slice dynamic_slice concatenate pad reverse
iota constant get_tuple_element tuple bitcast_convert gather real_dynamic_slice dynamic_broadcast_in_dim
dynamic_reshape dynamic_iota dynamic_pad get_dimension_size optimization_barrier""".split())
# Ops that read only part of an operand: a fusion pays for what they touch, not the whole operand.
SLICERS = frozenset({"slice", "dynamic_slice", "gather", "real_dynamic_slice"})
COLLECTIVES = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute",
                         "collective_broadcast"})
# custom_call targets that are hlofuse kernels (the CPU FFI ones start with `hlofuse_`).
KERNEL_TARGETS = ("tpu_custom_call", "__gpu$xla.gpu.triton", "mosaic_gpu", "mosaic_gpu_v2",
                  "AwsNeuronCustomNativeKernel")
SITE_NAMES = ("hlofuse.attention", "hlofuse.sample")


def dtype_bytes(dtype: str) -> float:
    return DTYPE_BYTES.get(dtype, 4)


@dataclass
class Tensor:
    id: int
    shape: tuple[int, ...]
    dtype: str
    producer: int | None = None  # node id; None for program inputs
    kind: str = "value"  # "param" (a program input), "splat" (a constant read as a scalar), "const", "value"

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> float:
        if self.kind == "splat":
            return 0.0
        return self.elements * dtype_bytes(self.dtype)


@dataclass
class Node:
    """One op after flattening. `cls` says how fusion treats it: elementwise | layout | reduce | dot | sort |
    dus | scatter | collective | kernel | custom | opaque | site."""

    id: int
    op: str
    cls: str
    inputs: list[int]
    outputs: list[int]
    scope: int = 0
    flops: float = 0.0  # vector flops, XLA's convention
    mxu_flops: float = 0.0  # dot / convolution flops
    transcendentals: float = 0.0
    sort_ops: float = 0.0  # compare-exchanges
    collective_bytes: float = 0.0  # bytes each device sends for a collective
    expensive: bool = False  # XLA does not duplicate it into several consumers
    site: int | None = None  # the hlofuse site whose decomposition or kernel this belongs to
    info: dict[str, Any] = field(default_factory=dict)
    # Bytes an op reads of an input (slices, in-place updates) and writes of an output (in place).
    touched: dict[int, float] = field(default_factory=dict)
    written: dict[int, float] = field(default_factory=dict)


@dataclass
class Site:
    """An hlofuse composite occurrence: its index in walk order and what a target needs to decide on it."""

    index: int
    name: str
    attributes: dict[str, Any]
    operand_types: tuple[tuple[tuple[int, ...], str], ...]
    result_types: tuple[tuple[tuple[int, ...], str], ...]
    op: ir.Operation
    decomposition: str
    location: str

    @property
    def signature(self) -> tuple[Any, ...]:
        return (self.name, repr(sorted(self.attributes.items())), self.operand_types, self.result_types)


@dataclass
class Graph:
    tensors: list[Tensor] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    scopes: dict[int, float] = field(default_factory=lambda: {0: 1.0})  # scope -> times it runs per call
    scope_notes: dict[int, str] = field(default_factory=dict)
    inputs: list[int] = field(default_factory=list)
    results: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    devices: int = 1
    donated: set[int] = field(default_factory=set)  # inputs whose buffers a result may reuse (donated arguments)

    def tensor(self, shape: Sequence[int], dtype: str, producer: int | None = None, kind: str = "value") -> int:
        self.tensors.append(Tensor(len(self.tensors), tuple(int(d) for d in shape), dtype, producer, kind))
        return len(self.tensors) - 1

    def add(self, op: str, cls: str, inputs: Sequence[int], out_types: Iterable[tuple[Sequence[int], str]],
            scope: int, **fields: Any) -> Node:  # noqa: ANN401
        node = Node(len(self.nodes), op, cls, list(inputs), [], scope, **fields)
        self.nodes.append(node)
        node.outputs = [self.tensor(shape, dtype, node.id) for shape, dtype in out_types]
        return node

    def consumers(self) -> list[list[int]]:
        """Node ids reading each tensor."""
        users: list[list[int]] = [[] for _ in self.tensors]
        for node in self.nodes:
            for t in dict.fromkeys(node.inputs):
                users[t].append(node.id)
        return users

    def totals(self) -> dict[str, float]:
        """FLOPs, transcendentals and MXU FLOPs over the whole call (loops counted as they run)."""
        out = {"flops": 0.0, "mxu_flops": 0.0, "transcendentals": 0.0}
        for node in self.nodes:
            times = self.scopes.get(node.scope, 1.0)
            out["flops"] += node.flops * times
            out["mxu_flops"] += node.mxu_flops * times
            out["transcendentals"] += node.transcendentals * times
        return out


# ---- types and shardings --------------------------------------------------------------------------------

_TYPE_CACHE: dict[Any, tuple[tuple[int, ...], str]] = {}


def tensor_type(t: ir.Type) -> tuple[tuple[int, ...], str]:
    """(shape, element type name) of a ranked tensor type; a token or tuple is a zero-size i1."""
    cached = _TYPE_CACHE.get(t)
    if cached is not None:
        return cached
    try:
        ranked = ir.RankedTensorType(t)
        shape = tuple(d if d >= 0 else 1 for d in ranked.shape)
        result = (shape, str(ranked.element_type))
    except ValueError:
        result = ((0,), "i1")
    _TYPE_CACHE[t] = result
    return result


def sharded_copy(module: ir.Module) -> ir.Module | None:
    """A copy of a multi-device `module` after Shardy's propagation, or None when it does not propagate."""
    copy = ir.Module.parse(module.operation.get_asm(binary=True), context=module.context)
    try:
        passmanager.PassManager.parse("builtin.module(sdy-propagation-pipeline)", context=module.context).run(
            copy.operation)
    except (ir.MLIRError, ValueError):
        return None
    return copy


def _mesh_sizes(module: ir.Module) -> dict[str, dict[str, int]]:
    meshes = {}
    for op in module.body.operations:
        if op.operation.name == "sdy.mesh":
            text = str(op.operation.attributes["mesh"])
            name = ir.StringAttr(op.operation.attributes["sym_name"]).value
            meshes[name] = {axis: int(size) for axis, size in re.findall(r'"([^"]*)"\s*=\s*(\d+)', text)}
    return meshes


_SHARDING = re.compile(r"<@([\w.$-]+),\s*\[(.*)\](?:,\s*replicated=\{[^}]*\})?>")


def _dim_shards(sharding: str, meshes: dict[str, dict[str, int]]) -> tuple[int, ...] | None:
    """How many shards cut each dim, from a `#sdy.sharding<@mesh, [{"x"}, {}]>` text."""
    match = _SHARDING.search(sharding)
    if match is None:
        return None
    mesh = meshes.get(match.group(1))
    if mesh is None:
        return None
    dims = re.findall(r"\{([^}]*)\}", match.group(2))
    out = []
    for dim in dims:
        shards = 1
        for axis in re.findall(r'"([^"]+)"(?::\((\d+)\)(\d+))?', dim):
            name = axis[0]
            shards *= int(axis[2]) if axis[2] else mesh.get(name, 1)
        out.append(shards)
    return tuple(out)


def _per_value_shardings(attr: ir.Attribute) -> list[str]:
    text = str(attr)
    return re.findall(r"<@[^<>]*(?:<[^<>]*>[^<>]*)*>", text)


# ---- flattening -----------------------------------------------------------------------------------------


@dataclass
class _Frame:
    env: dict[Any, int]
    scope: int
    site: int | None


class Flattener:
    """Walks a module from its public main and appends every op it runs to a Graph.

    `on_site(site, inputs, frame)` decides what an hlofuse composite becomes (a Site placeholder by
    default); `kernel_site` labels the kernel custom calls met inside a lowered site's wrapper."""

    def __init__(self, module: ir.Module, *, sharded: ir.Module | None = None) -> None:
        self.module = sharded or module
        self.meshes = _mesh_sizes(self.module) if sharded is not None else {}
        self.graph = Graph()
        self.functions = {ir.StringAttr(op.operation.attributes["sym_name"]).value: op.operation
                          for op in self.module.body.operations if op.operation.name == "func.func"}
        self.sites: list[Site] = []
        self.kernel_site: int | None = None
        self.kernel_node: Callable[[Node], None] | None = None
        self._depth = 0

    # -- shapes --

    def _local(self, shape: tuple[int, ...], sharding: str | None) -> tuple[int, ...]:
        if not sharding or not self.meshes:
            return shape
        shards = _dim_shards(sharding, self.meshes)
        if shards is None or len(shards) != len(shape):
            return shape
        return tuple(max(1, d // s) for d, s in zip(shape, shards, strict=True))

    def _result_types(self, op: ir.Operation) -> list[tuple[tuple[int, ...], str]]:
        types = [tensor_type(r.type) for r in op.results]
        if self.meshes and "sdy.sharding" in op.attributes:
            shardings = _per_value_shardings(op.attributes["sdy.sharding"])
            if len(shardings) == len(types):
                types = [(self._local(shape, s), dtype) for (shape, dtype), s in zip(types, shardings, strict=True)]
        return types

    # -- entry --

    def main(self) -> ir.Operation:
        for name, op in self.functions.items():
            if name == "main" or ("sym_visibility" in op.attributes
                                  and ir.StringAttr(op.attributes["sym_visibility"]).value == "public"):
                if name == "main":
                    return op
        public = [op for op in self.functions.values()
                  if "sym_visibility" not in op.attributes
                  or ir.StringAttr(op.attributes["sym_visibility"]).value == "public"]
        if not public:
            raise ValueError("the module has no public function to run")
        return public[0]

    def run(self, function: ir.Operation | None = None) -> Graph:
        function = function or self.main()
        block = function.regions[0].blocks[0]
        shardings = self._arg_shardings(function)
        inputs = []
        arg_attrs = function.attributes["arg_attrs"] if "arg_attrs" in function.attributes else None
        for i, arg in enumerate(block.arguments):
            shape, dtype = tensor_type(arg.type)
            inputs.append(self.graph.tensor(self._local(shape, shardings[i]), dtype, None, "param"))
            attrs = str(ir.ArrayAttr(arg_attrs)[i]) if arg_attrs is not None else ""
            if "tf.aliasing_output" in attrs or "jax.buffer_donor" in attrs:
                self.graph.donated.add(inputs[-1])
        self.graph.inputs = inputs
        self.graph.results = self.block(block, inputs, _Frame({}, 0, None))
        return self.graph

    def _arg_shardings(self, function: ir.Operation) -> list[str | None]:
        count = len(function.regions[0].blocks[0].arguments)
        if not self.meshes or "arg_attrs" not in function.attributes:
            return [None] * count
        out: list[str | None] = []
        for attrs in ir.ArrayAttr(function.attributes["arg_attrs"]):
            d = ir.DictAttr(attrs)
            out.append(str(d["sdy.sharding"]) if "sdy.sharding" in d else None)
        return out + [None] * (count - len(out))

    def block(self, block: ir.Block, args: Sequence[int], frame: _Frame) -> list[int]:
        """Flattens `block` with its arguments bound to `args`; returns the tensors its terminator yields."""
        env = dict(frame.env)
        for arg, t in zip(block.arguments, args, strict=True):
            env[arg] = t
        inner = _Frame(env, frame.scope, frame.site)
        for op in block.operations:
            op = op.operation
            name = op.name
            if name in ("func.return", "stablehlo.return", "sdy.return"):
                return [env[v] for v in op.operands]
            self.op(op, inner)
        return []

    def _bind(self, op: ir.Operation, outs: Sequence[int], frame: _Frame) -> None:
        for result, t in zip(op.results, outs, strict=True):
            frame.env[result] = t

    def _inputs(self, op: ir.Operation, frame: _Frame) -> list[int]:
        out = []
        for v in op.operands:
            t = frame.env.get(v)
            if t is None:  # a value from an enclosing region we did not enter (should not happen)
                shape, dtype = tensor_type(v.type)
                t = self.graph.tensor(shape, dtype, None, "param")
                frame.env[v] = t
            out.append(t)
        return out

    # -- ops --

    def op(self, op: ir.Operation, frame: _Frame) -> None:
        name = op.name
        short = name.split(".", 1)[1] if "." in name else name
        if name == "func.call":
            self._call(op, frame)
            return
        if name == "stablehlo.composite":
            self._composite(op, frame)
            return
        if name == "stablehlo.while":
            self._while(op, frame)
            return
        if name in ("stablehlo.case", "stablehlo.if"):
            self._case(op, frame)
            return
        if name == "sdy.manual_computation":
            self._manual(op, frame)
            return
        if name.startswith("sdy."):  # sharding_constraint, reshard: a value passes through
            ins = self._inputs(op, frame)
            if ins and len(op.results) == 1:
                frame.env[op.results[0]] = ins[0]
            return
        ins = self._inputs(op, frame)
        types = self._result_types(op)
        node = self._costed(op, short, ins, types, frame)
        if node.cls in ("elementwise", "layout") and short not in ("constant", "rng", "rng_bit_generator"):
            self._fold(node, short)
        outs = node.outputs
        if "all_reduce" in node.info:  # the partitioner's all-reduce of partial sums, an op of its own
            outs = self._implicit_all_reduce(node, frame)
        self._bind(op, outs, frame)

    def _implicit_all_reduce(self, node: Node, frame: _Frame) -> list[int]:
        factor = float(node.info["all_reduce"])
        tensors = [self.graph.tensors[t] for t in node.outputs]
        reduce = self.graph.add("all_reduce (partitioner)", "collective", list(node.outputs),
                                [(t.shape, t.dtype) for t in tensors], frame.scope, site=frame.site)
        reduce.collective_bytes = sum(t.nbytes for t in tensors) * 2 * (1 - 1 / factor)
        reduce.flops = sum(t.elements for t in tensors) * (1 - 1 / factor)
        reduce.info["group"] = factor
        return reduce.outputs

    def _fold(self, node: Node, short: str) -> None:
        """XLA folds ops on constants (a converted or broadcast scalar costs nothing at run time); an iota is
        index arithmetic inside its consumer's fusion."""
        kinds = [self.graph.tensors[t].kind for t in node.inputs]
        if short == "iota" or (kinds and all(k in ("splat", "const") for k in kinds)):
            splat = short == "iota" or all(k == "splat" for k in kinds)
            for t in node.outputs:
                self.graph.tensors[t].kind = "splat" if splat else "const"
            node.cls, node.flops, node.transcendentals, node.expensive = "layout", 0.0, 0.0, False
            node.info["layout"] = "noop"
            node.info["folded"] = True

    def _call(self, op: ir.Operation, frame: _Frame) -> None:
        callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
        function = self.functions.get(callee)
        ins = self._inputs(op, frame)
        if function is None:
            node = self.graph.add(f"call @{callee}", "opaque", ins, self._result_types(op), frame.scope,
                                  site=frame.site)
            self._bind(op, node.outputs, frame)
            return
        self._depth += 1
        if self._depth > 200:
            raise ValueError(f"calls nest deeper than 200 at @{callee} (recursion?)")
        outs = self.block(function.regions[0].blocks[0], ins, _Frame({}, frame.scope, frame.site))
        self._depth -= 1
        self._bind(op, outs, frame)

    def _composite(self, op: ir.Operation, frame: _Frame) -> None:
        name = ir.StringAttr(op.attributes["name"]).value
        ins = self._inputs(op, frame)
        decomposition = ir.FlatSymbolRefAttr(op.attributes["decomposition"]).value
        if name in SITE_NAMES and frame.site is None:
            from hlofuse.ops.attributes import attribute_values

            site = Site(len(self.sites), name, attribute_values(op.attributes["composite_attributes"]),
                        tuple(tensor_type(v.type) for v in op.operands),
                        tuple(tensor_type(r.type) for r in op.results), op, decomposition, _location(op))
            self.sites.append(site)
            node = self.graph.add(name, "site", ins, self._result_types(op), frame.scope,
                                  info={"site": site.index})
            node.site = site.index
            self._bind(op, node.outputs, frame)
            return
        function = self.functions[decomposition]
        outs = self.block(function.regions[0].blocks[0], ins, frame)
        self._bind(op, outs, frame)

    def _while(self, op: ir.Operation, frame: _Frame) -> None:
        ins = self._inputs(op, frame)
        trips, why = trip_count(op)
        scope = len(self.graph.scopes)
        self.graph.scopes[scope] = self.graph.scopes.get(frame.scope, 1.0) * trips
        if why:
            self.graph.scope_notes[scope] = why
        cond, body = op.regions[0].blocks[0], op.regions[1].blocks[0]
        carried = []
        for t in ins:  # the loop's state lives in buffers the body reads and writes every trip
            tensor = self.graph.tensors[t]
            carried.append(self.graph.tensor(tensor.shape, tensor.dtype, None, "param"))
        loop_frame = _Frame(frame.env, scope, frame.site)
        self.block(cond, carried, loop_frame)
        outs = self.block(body, carried, loop_frame)
        results = self._result_types(op)
        node = self.graph.add("stablehlo.while", "control", [*ins, *outs], results, frame.scope, site=frame.site)
        self._bind(op, node.outputs, frame)

    def _case(self, op: ir.Operation, frame: _Frame) -> None:
        """Conditionals: every branch is flattened into a scope of its own, and only the cheapest runs: a
        data-dependent branch is usually a rare fallback (hlofuse's CPU sampler re-runs XLA's argmax when
        its certification fails), so the report is the common path, with a note."""
        self._inputs(op, frame)
        outer = self.graph.scopes.get(frame.scope, 1.0)
        branches: list[tuple[float, int, list[int]]] = []
        for region in op.regions:
            scope = len(self.graph.scopes)
            self.graph.scopes[scope] = 0.0
            first = len(self.graph.nodes)
            outs = self.block(region.blocks[0], [], _Frame(frame.env, scope, frame.site))
            cost = sum(n.flops + n.mxu_flops + 10 * n.transcendentals for n in self.graph.nodes[first:])
            branches.append((cost, scope, outs))
        if not branches:
            return
        cost, scope, outs = min(branches, key=lambda b: b[0])
        self.graph.scopes[scope] = outer
        costliest = max(b[0] for b in branches)
        if len(branches) > 1 and costliest > 2 * cost + 1e6:
            self.graph.scope_notes[scope] = (f"a {op.name} is modelled by the cheapest of its {len(branches)} "
                                             f"branches ({costliest / 1e6:.3g} MFLOP in the costliest)")
        self._bind(op, outs, frame)

    def _manual(self, op: ir.Operation, frame: _Frame) -> None:
        """A shard_map body: its block arguments already have per-device shapes."""
        ins = self._inputs(op, frame)
        block = op.regions[0].blocks[0]
        local = []
        for arg, t in zip(block.arguments, ins, strict=True):
            shape, dtype = tensor_type(arg.type)
            if self.graph.tensors[t].shape == shape:
                local.append(t)
            else:  # entering the body is a view of the local shard
                node = self.graph.add("sdy.manual_computation.arg", "layout", [t], [(shape, dtype)], frame.scope,
                                      site=frame.site)
                local.append(node.outputs[0])
        outs = self.block(block, local, frame)
        results = []
        for result, t in zip(op.results, outs, strict=True):
            shape, dtype = self._result_types_one(op, result)
            if self.graph.tensors[t].shape == shape:
                results.append(t)
            else:
                node = self.graph.add("sdy.manual_computation.result", "layout", [t], [(shape, dtype)], frame.scope,
                                      site=frame.site)
                results.append(node.outputs[0])
        self._bind(op, results, frame)

    def _result_types_one(self, op: ir.Operation, result: ir.Value) -> tuple[tuple[int, ...], str]:
        types = self._result_types(op)
        return types[ir.OpResult(result).result_number]

    def _costed(self, op: ir.Operation, short: str, ins: list[int], types: list[tuple[tuple[int, ...], str]],
                frame: _Frame) -> Node:
        g = self.graph
        out_elems = sum(math.prod(shape) for shape, _ in types)
        node = g.add(op.name, "opaque", ins, types, frame.scope, site=frame.site)
        if op.name.startswith("chlo."):
            chlo = op.name.split(".", 1)[1]
            if chlo in CHLO_ELEMENTWISE:
                flops, trans = CHLO_ELEMENTWISE[chlo]
                node.cls, node.flops, node.transcendentals = "elementwise", flops * out_elems, trans * out_elems
                node.expensive = trans > 0
            elif chlo == "top_k":
                node.cls = "sort"
                shape = g.tensors[ins[0]].shape
                n = shape[-1] if shape else 1
                node.sort_ops = math.prod(shape) * max(1.0, math.log2(max(n, 2)))
            elif chlo in ("broadcast_add", "broadcast_multiply", "broadcast_subtract", "broadcast_divide",
                          "broadcast_maximum", "broadcast_minimum", "broadcast_compare", "broadcast_select",
                          "broadcast_and", "broadcast_or"):
                node.cls, node.flops = "elementwise", out_elems
            return node
        if not op.name.startswith("stablehlo."):
            return node
        if short in ELEMENTWISE:
            node.cls, node.flops = "elementwise", out_elems
            if short == "convert" and ins and g.tensors[ins[0]].dtype == types[0][1]:
                node.flops, node.info["layout"] = 0.0, "noop"  # XLA drops a convert to the same type
            if short == "divide" and types and types[0][1].startswith(("i", "ui")):
                node.expensive = True
        elif short in TRANSCENDENTAL:
            node.cls, node.transcendentals, node.expensive = "elementwise", out_elems, True
        elif short == "constant":
            node.cls = "layout"
            tensor = g.tensors[node.outputs[0]]
            tensor.kind = "splat" if _is_splat(op) else "const"
        elif short in LAYOUT:
            node.cls = "layout"
            node.info["layout"] = short
            if short in SLICERS and ins:
                node.touched[ins[0]] = g.tensors[node.outputs[0]].nbytes
            if short == "transpose":
                perm = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
                shape = g.tensors[ins[0]].shape if ins else ()
                moved = [d for d in perm if shape and shape[d] != 1]
                # moving the minor (contiguous) dim is a strided gather on a CPU, far slower than a stream
                node.info["permutes"] = bool(moved) and moved[-1] != max(moved)
                if node.info["permutes"]:  # bytes between the input elements an output row reads in turn
                    node.info["stride"] = _stride(shape, moved[-1], g.tensors[ins[0]].dtype)
            if _is_noop_layout(op, short, g.tensors[ins[0]].shape if ins else (), types):
                node.info["layout"] = "noop"
        elif short in ("dot_general", "dot"):
            self._dot(op, node)
        elif short == "convolution":
            self._convolution(op, node)
        elif short in ("reduce", "reduce_window"):
            self._reduce(op, short, node)
        elif short == "dynamic_update_slice":
            node.cls = "dus"
            update = g.tensors[ins[1]]
            node.touched[ins[0]] = 0.0  # updated in place
            node.written[node.outputs[0]] = update.nbytes
        elif short in ("scatter", "select_and_scatter"):
            node.cls = "scatter"
            updates = g.tensors[ins[-1]]
            node.flops = updates.elements
            node.touched[ins[0]] = 0.0
            node.written[node.outputs[0]] = updates.nbytes
        elif short == "sort":
            node.cls = "sort"
            dim = ir.IntegerAttr(op.attributes["dimension"]).value if "dimension" in op.attributes else -1
            shape = g.tensors[ins[0]].shape
            n = shape[dim] if shape else 1
            comparator = _region_ops(op)
            node.sort_ops = math.prod(shape) * max(1.0, math.log2(max(n, 2)))
            node.flops = node.sort_ops * comparator
            node.info["sort_len"] = n
        elif short in COLLECTIVES:
            self._collective(op, short, node)
        elif short == "custom_call":
            self._custom_call(op, node)
        elif short in ("rng_bit_generator", "rng"):
            node.cls, node.flops = "elementwise", 30 * out_elems  # threefry/philox: ~30 integer ops a word
        elif short == "fft":
            n = math.prod(g.tensors[ins[0]].shape)
            node.flops = 5 * n * max(1.0, math.log2(max(n, 2)))
        elif short in ("cholesky", "triangular_solve"):
            shape = g.tensors[ins[0]].shape
            n = shape[-1] if shape else 1
            node.flops = math.prod(shape[:-2]) * n ** 3 / 3 if len(shape) >= 2 else n
        elif short in ("after_all", "create_token", "infeed", "outfeed", "send", "recv", "partition_id",
                       "replica_id"):
            node.cls = "layout"
        elif short == "map":
            node.cls, node.flops = "elementwise", out_elems * max(1, _region_ops(op))
        elif short == "batch_norm_inference":
            node.cls, node.flops = "elementwise", 4 * out_elems
        return node

    def _dot(self, op: ir.Operation, node: Node) -> None:
        g = self.graph
        lhs, rhs = (g.tensors[t] for t in node.inputs[:2])
        out = g.tensors[node.outputs[0]]
        if op.name == "stablehlo.dot":
            contracting_l = [len(lhs.shape) - 1] if lhs.shape else []
            contracting_r = [0] if rhs.shape else []
            batch_l: list[int] = []
        else:
            dims = _dot_dims(op)
            batch_l, contracting_l, contracting_r = dims["lhs_batch"], dims["lhs_contracting"], dims["rhs_contracting"]
        k = math.prod(lhs.shape[d] for d in contracting_l) if contracting_l else 1
        batch = math.prod(lhs.shape[d] for d in batch_l) if batch_l else 1
        m = math.prod(d for i, d in enumerate(lhs.shape) if i not in batch_l and i not in contracting_l)
        n = math.prod(d for i, d in enumerate(rhs.shape) if i not in contracting_r
                      and i not in (_dot_dims(op)["rhs_batch"] if op.name != "stablehlo.dot" else []))
        node.cls = "dot"
        node.mxu_flops = 2.0 * out.elements * k
        node.info.update(m=m, n=n, k=k, batch=batch, dtype=lhs.dtype, out_dtype=out.dtype)
        batch_r = _dot_dims(op)["rhs_batch"] if op.name != "stablehlo.dot" else []
        # XLA CPU's dot takes [batch..., rows, contraction] operands (either order of the last two): an operand
        # whose dims come in another order is copied into that layout first.
        operands = ((node.inputs[0], lhs.shape, batch_l, contracting_l), (node.inputs[1], rhs.shape, batch_r,
                                                                                contracting_r))
        node.info["copies"] = [t for t, shape, b, c in operands if not _canonical_operand(shape, b, c)]
        # The copy lays the operand out as XLA's dot takes it, lhs [batch, rows, contraction] and rhs [batch,
        # contraction, columns]: one that keeps the minor dim minor moves whole rows (a stream), one that moves it
        # is a transpose.
        strided, strides = [], {}
        for side, (t, shape, b, c) in enumerate(operands):
            if _canonical_operand(shape, b, c):
                continue
            free = [d for d in range(len(shape)) if d not in b and d not in c and shape[d] != 1]
            target = (sorted(d for d in c if shape[d] != 1) if side == 0 else free) or [_minor_dim(shape)]
            if _minor_dim(shape) != target[-1]:
                strided.append(t)
                # the copy writes the target's minor dim contiguously, reading the operand this far apart
                strides[t] = _stride(shape, target[-1], g.tensors[t].dtype)
        node.info["strided_copies"] = strided
        node.info["strides"] = strides
        global_k = self._global_contraction(op, contracting_l)
        if global_k and global_k > k:  # contracted dims are sharded: partial sums, then an all-reduce
            node.info["all_reduce"] = global_k / k

    def _global_contraction(self, op: ir.Operation, contracting: Sequence[int]) -> int | None:
        if not self.meshes:
            return None
        shape, _ = tensor_type(op.operands[0].type)
        return math.prod(shape[d] for d in contracting) if contracting else None

    def _convolution(self, op: ir.Operation, node: Node) -> None:
        g = self.graph
        kernel = g.tensors[node.inputs[1]]
        out = g.tensors[node.outputs[0]]
        numbers = str(op.attributes.get("dimension_numbers", "")) if "dimension_numbers" in op.attributes else ""
        match = re.search(r"x\[([^\]]*)\]", numbers)
        out_features = 1
        if match:
            labels = [s.strip() for s in match.group(1).split(",")]
            if "o" in labels and len(labels) == len(kernel.shape):
                out_features = kernel.shape[labels.index("o")]
        groups = ir.IntegerAttr(op.attributes["batch_group_count"]).value if "batch_group_count" in op.attributes else 1
        per_output = kernel.elements / max(out_features, 1)
        node.cls = "dot"
        node.mxu_flops = 2.0 * out.elements * per_output / max(groups, 1)
        node.info.update(m=out.elements // max(out_features, 1), n=out_features, k=int(per_output), batch=1,
                         dtype=g.tensors[node.inputs[0]].dtype, out_dtype=out.dtype, conv=True)

    def _reduce(self, op: ir.Operation, short: str, node: Node) -> None:
        g = self.graph
        half = len(node.inputs) // 2
        data = [g.tensors[t] for t in node.inputs[:half]]
        outs = [g.tensors[t] for t in node.outputs]
        body_ops = max(1, _region_ops(op))
        node.cls = "reduce"
        if short == "reduce":
            node.flops = max(0, data[0].elements - outs[0].elements) * body_ops
            dims = list(ir.DenseI64ArrayAttr(op.attributes["dimensions"])) if "dimensions" in op.attributes else []
            node.info["reduced_dims"] = dims
            if self.meshes and dims:
                shape, _ = tensor_type(op.operands[0].type)
                local = data[0].shape
                factor = math.prod(shape[d] for d in dims) / max(1, math.prod(local[d] for d in dims))
                if factor > 1:
                    node.info["all_reduce"] = factor
        else:
            window = 1
            if "window_dimensions" in op.attributes:
                window = math.prod(ir.DenseI64ArrayAttr(op.attributes["window_dimensions"]))
            if window > 64:  # a prefix scan (cumsum): XLA rewrites it into blocked partial sums, ~17 ops an element
                node.flops = outs[0].elements * 17 * body_ops
                node.info["scan"] = True
            else:
                node.flops = outs[0].elements * window * body_ops
        if any(_region_has(op, t) for t in TRANSCENDENTAL):
            node.transcendentals = node.flops / body_ops

    def _collective(self, op: ir.Operation, short: str, node: Node) -> None:
        g = self.graph
        node.cls = "collective"
        group = _group_size(op) or self.graph.devices
        size = sum(g.tensors[t].nbytes for t in node.inputs)
        out = sum(g.tensors[t].nbytes for t in node.outputs)
        frac = (group - 1) / group if group > 1 else 0.0
        if short == "all_reduce":
            node.collective_bytes = 2 * frac * size
            node.flops = sum(g.tensors[t].elements for t in node.inputs) * frac
        elif short == "all_gather":
            node.collective_bytes = frac * out
        elif short == "reduce_scatter":
            node.collective_bytes = frac * size
            node.flops = sum(g.tensors[t].elements for t in node.inputs) * frac
        elif short == "all_to_all":
            node.collective_bytes = frac * size
        else:  # collective_permute, collective_broadcast
            node.collective_bytes = size
        node.info["group"] = group

    def _custom_call(self, op: ir.Operation, node: Node) -> None:
        target = ir.StringAttr(op.attributes["call_target_name"]).value
        node.info["target"] = target
        node.op = f"custom_call @{target}"
        if target.startswith("hlofuse_") or target in KERNEL_TARGETS:
            node.cls = "kernel"
            node.site = self.kernel_site
            node.info["kernel_operands"] = [self.graph.tensors[t].shape for t in node.inputs]
            if self.kernel_node is not None:
                self.kernel_node(node)
        elif target in ("Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "annotate_device_placement",
                        "MoveToHost", "MoveToDevice", "LayoutConstraint", "X64Combine", "X64SplitLow",
                        "X64SplitHigh", "mhlo.sharding"):
            node.cls = "layout"
        else:
            node.cls = "custom"


def _location(op: ir.Operation) -> str:
    from hlofuse.remarks import format_location

    try:
        return format_location(op.location)
    except Exception:  # an unusual location kind: no name is fine
        return ""


def _is_noop_layout(op: ir.Operation, short: str, shape: tuple[int, ...], types: list[Any]) -> bool:
    """A pad with no padding, a broadcast or slice to the operand's own shape: XLA's simplifier removes them."""
    if not types or tuple(types[0][0]) != tuple(shape):
        return False
    if short == "pad":
        return all(not any(ir.DenseI64ArrayAttr(op.attributes[k])) for k in ("edge_padding_low", "edge_padding_high",
                                                                              "interior_padding")
                   if k in op.attributes)
    return short in ("broadcast_in_dim", "slice", "transpose") and (
        short != "transpose" or list(ir.DenseI64ArrayAttr(op.attributes["permutation"])) == sorted(
            ir.DenseI64ArrayAttr(op.attributes["permutation"])))


def _is_splat(op: ir.Operation) -> bool:
    value = op.attributes["value"]
    try:
        return bool(ir.DenseElementsAttr(value).is_splat)
    except (ValueError, TypeError):
        return False


def _region_ops(op: ir.Operation) -> int:
    count = 0
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                if inner.operation.name not in ("stablehlo.return", "func.return"):
                    count += 1
    return count


def _region_has(op: ir.Operation, short: str) -> bool:
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                if inner.operation.name == f"stablehlo.{short}":
                    return True
    return False


_DOT_DIMS: dict[str, dict[str, list[int]]] = {}


def _canonical_operand(shape: Sequence[int], batch: Sequence[int], contracting: Sequence[int]) -> bool:
    """Whether a dot operand's dims are [batch..., free..., contracting...] or [batch..., contracting..., free...]
    in memory order (size-1 dims ignored: they move no data)."""
    keep = [d for d in range(len(shape)) if shape[d] != 1]
    b = [d for d in batch if d in keep]
    c = [d for d in contracting if d in keep]
    f = [d for d in keep if d not in b and d not in c]
    order = keep
    return order[: len(b)] == b and order[len(b):] in (f + c, c + f)


def _stride(shape: Sequence[int], dim: int, dtype: str) -> float:
    """Bytes between consecutive elements along `dim` of a row-major `shape`."""
    return float(math.prod(shape[dim + 1:]) * dtype_bytes(dtype))


def _minor_dim(shape: Sequence[int]) -> int:
    """The last dim of more than one element (the contiguous one in a row-major layout)."""
    return next((d for d in reversed(range(len(shape))) if shape[d] != 1), len(shape) - 1)


def _dot_dims(op: ir.Operation) -> dict[str, list[int]]:
    text = str(op.attributes["dot_dimension_numbers"])
    cached = _DOT_DIMS.get(text)
    if cached is not None:
        return cached

    def field_of(name: str) -> list[int]:
        match = re.search(name + r"\s*=\s*\[([^\]]*)\]", text)
        return [int(x) for x in match.group(1).split(",") if x.strip()] if match else []

    dims = {"lhs_batch": field_of("lhs_batching_dimensions"), "rhs_batch": field_of("rhs_batching_dimensions"),
            "lhs_contracting": field_of("lhs_contracting_dimensions"),
            "rhs_contracting": field_of("rhs_contracting_dimensions")}
    _DOT_DIMS[text] = dims
    return dims


def _group_size(op: ir.Operation) -> int | None:
    if "replica_groups" not in op.attributes:
        return None
    try:
        groups = ir.DenseIntElementsAttr(op.attributes["replica_groups"])
        shape = ir.RankedTensorType(groups.type).shape
        return int(shape[1]) if len(shape) == 2 else None
    except (ValueError, TypeError):
        return None


def _constant_int(value: ir.Value) -> int | None:
    owner = value.owner
    if isinstance(owner, ir.Block):
        return None
    op = owner.operation if not isinstance(owner, ir.Operation) else owner
    if op.name != "stablehlo.constant":
        if op.name == "stablehlo.convert":
            return _constant_int(op.operands[0])
        return None
    try:
        attr = ir.DenseIntElementsAttr(op.attributes["value"])
        return int(attr[0]) if attr.is_splat or len(attr) == 1 else None
    except (ValueError, TypeError, IndexError):
        return None


def trip_count(op: ir.Operation) -> tuple[float, str]:
    """How many times a `stablehlo.while` runs: a counter compared LT/LE/NE/GT against a constant bound (or a
    loop-invariant carried constant), stepped by a constant; 1 with a note when it cannot be read."""
    cond, body = op.regions[0].blocks[0], op.regions[1].blocks[0]
    terminator = list(cond.operations)[-1].operation
    compare = terminator.operands[0].owner if terminator.operands else None
    compare = getattr(compare, "operation", compare)
    if compare is None or isinstance(compare, ir.Block) or compare.name != "stablehlo.compare":
        return 1.0, "trip count unknown (the loop condition is not a compare): counted once"
    found = re.search(r"\b(LT|LE|GT|GE|NE|EQ)\b", str(compare.attributes["comparison_direction"]))
    direction = found.group(1) if found else "LT"
    body_return = list(body.operations)[-1].operation
    args = list(cond.arguments)

    def resolve(value: ir.Value) -> tuple[str, int | None, int | None]:
        """('arg', index, None) for a carried value, ('const', None, value) for a constant."""
        if isinstance(value.owner, ir.Block) and value in args:
            index = args.index(value)
            init = _constant_int(op.operands[index])
            invariant = body_return.operands[index] == list(body.arguments)[index]
            if invariant and init is not None:
                return "const", None, init
            return "arg", index, init
        c = _constant_int(value)
        return ("const", None, c) if c is not None else ("?", None, None)

    lhs, rhs = resolve(compare.operands[0]), resolve(compare.operands[1])
    counter, bound = (lhs, rhs) if lhs[0] == "arg" else (rhs, lhs)
    if counter[0] != "arg" or bound[0] != "const" or counter[2] is None or bound[2] is None:
        return 1.0, "trip count unknown (no constant bound): counted once"
    index = counter[1]
    assert index is not None
    step_value = body_return.operands[index]
    step_op = step_value.owner if not isinstance(step_value.owner, ir.Block) else None
    step_op = getattr(step_op, "operation", step_op)
    step = 1
    if step_op is not None and step_op.name in ("stablehlo.add", "stablehlo.subtract"):
        constants = [_constant_int(v) for v in step_op.operands]
        found = next((c for c in constants if c is not None), None)
        if found is not None:
            step = found if step_op.name == "stablehlo.add" else -found
    if step == 0:
        return 1.0, "trip count unknown (the counter does not move): counted once"
    start, end = counter[2], bound[2]
    if counter is rhs:  # bound < counter: flip the direction
        direction = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}.get(direction, direction)
    if direction == "EQ":
        return 1.0, "trip count unknown (an equality loop condition): counted once"
    span = end - start
    if direction in ("LE", "GE"):
        span += 1 if step > 0 else -1
    trips = max(0.0, math.ceil(span / step))
    return float(trips), ""
