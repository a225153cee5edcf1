"""Sharding rules for the kernel custom calls hlofuse emits, so XLA's SPMD partitioner (Shardy) keeps
them local instead of all-gathering their operands.

After hlofuse-lower-kernels has inlined a kernel's JAX function (`inline_jax_function`), `annotate`
walks the module for hlofuse's custom calls and gives each

- an `sdy.sharding_rule` naming its factors (batch, query and key sequence, heads, head dims, vocab),
  which steers Shardy's propagation through the call, and
- where the call's leading dims are batch-like in every operand and result, the frontend attribute
  `num_batch_dims`; with the target registered by `jax.ffi.register_ffi_target_as_batch_partitionable`
  (`hlofuse.kernels.cpu.register`), XLA then runs the call per shard on those dims, with no collectives.
  In multi-device modules the CPU attention call leads with (B, K[, P]) (kv heads, decode key-range
  splits: hlofuse.kernels.cpu.attention.partitioned_lowering), so all three stay local.

Factors that are not batch dims are all-gathered before the call if they arrive sharded: still exactly
right, but with communication (docs/sharding.md says which cases are local). The Pallas and NKI calls
inside hlofuse kernel functions get a rule with B as their one shared factor and no `num_batch_dims`
(XLA has no batch partitioner for those targets).

    %0 = stablehlo.custom_call @hlofuse_attention(%q, %k, %v) {...}     q (B, K, T, G, H), k (B, K, S, 1, H)
  becomes
    %0 = stablehlo.custom_call @hlofuse_attention(%q, %k, %v) {...,
           mhlo.frontend_attributes = {num_batch_dims = "2"},
           sdy.sharding_rule = #sdy.op_sharding_rule<([i, j, k, l, n], [i, j, o, m, n], [i, j, o, m, n])
                                 ->([i, j, k, l, n]) {i=2, j=4, k=16, l=2, m=1, n=16, o=16}
                                 need_replication={k, l, m, n, o}>}
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from jaxlib.mlir import ir

# Custom-call targets that get a rule here, and the function that writes it.
ATTENTION_TARGETS = ("hlofuse_attention",)
# (every sampling target leads each operand and result with the rows: the sorts, the band, the tokens at or above a
# floor and the whole rows' copy too)
SAMPLE_TARGETS = ("hlofuse_sample", "hlofuse_sample_top_k", "hlofuse_sample_sort", "hlofuse_sample_sort_descending",
                  "hlofuse_sample_sort_integers",
                  "hlofuse_sample_top_mass", "hlofuse_sample_nucleus_band", "hlofuse_sample_at_or_above",
                  "hlofuse_sample_whole_rows", "hlofuse_sample_noise_bits")
# The calls other targets' kernels emit (Pallas Mosaic TPU, Pallas Triton / Mosaic GPU, NKI). These names
# are shared with every other kernel of those backends, so only calls inside a function hlofuse-lower-kernels
# inlined (`hlofuse.<op>.<target>`) get a rule.
FOREIGN_TARGETS = ("tpu_custom_call", "__gpu$xla.gpu.triton", "mosaic_gpu", "mosaic_gpu_v2",
                   "AwsNeuronCustomNativeKernel")
KERNEL_FUNC_PREFIX = "hlofuse."

RULE_ATTR = "sdy.sharding_rule"
FRONTEND_ATTR = "mhlo.frontend_attributes"


@dataclass
class _Factors:
    """Factor names and sizes, in order of first appearance (Shardy wants special factors sorted)."""

    sizes: dict[str, int] = field(default_factory=dict)
    need_replication: list[str] = field(default_factory=list)

    def new(self, size: int) -> str:
        index = len(self.sizes)
        # i, j, ..., z, then z_1, z_2, ... (Shardy's own spelling for many factors)
        name = chr(ord("i") + index) if index < 18 else f"z_{index - 17}"
        self.sizes[name] = size
        return name


def _dims(value: ir.Value) -> list[int]:
    return list(ir.RankedTensorType(value.type).shape)


def _mapping(dims: Sequence[Sequence[str]]) -> str:
    return "[" + ", ".join("".join(d) for d in dims) + "]"


def _rule(operands: Sequence[Sequence[Sequence[str]]], results: Sequence[Sequence[Sequence[str]]],
          factors: _Factors, context: ir.Context) -> ir.Attribute:
    sizes = ", ".join(f"{name}={size}" for name, size in factors.sizes.items())
    special = ""
    order = list(factors.sizes)
    if factors.need_replication:
        names = sorted(set(factors.need_replication), key=order.index)
        special = " need_replication={" + ", ".join(names) + "}"
    text = ("#sdy.op_sharding_rule<(" + ", ".join(_mapping(o) for o in operands) + ")->("
            + ", ".join(_mapping(r) for r in results) + ") {" + sizes + "}" + special + ">")
    return ir.Attribute.parse(text, context)


def attention_rule(op: ir.Operation) -> tuple[ir.Attribute, int]:
    """The rule of an `hlofuse_attention` call (q, k, v, then bias?, mask?, q_lengths?, kv_lengths?;
    results out, then lse?) and its number of batch dims.

    q (*L,T,N,H) -> [*l, t, (k g), h]; k (*L,S,K,H) -> [*l, s, k, h]; v (*L,S,K,D) -> [*l, s, k, d];
    out (*L,T,N,D) -> [*l, t, (k g), d]; lse (*L,T,N) -> [*l, t, (k g)]: query head n reads kv head
    n // G, so N is the compound (K, G). L is the batch (B) in one-device layouts and (B, K[, P]) in
    the multi-device one (hlofuse.kernels.cpu.attention.partitioned_lowering); every L dim is a batch
    dim. A (L|1, N|1, T|1, S|1) bias or mask uses the same factors, a size-1 dim a factor of its own;
    lengths are `[*l]`.
    """
    context = op.context
    operands = list(op.operands)
    q, k, v = (_dims(x) for x in operands[:3])
    nl = len(q) - 3
    t, n, h = q[nl:]
    s, kv, d = k[nl], k[nl + 1], v[nl + 2]
    f = _Factors()
    lead = [f.new(size) for size in q[:nl]]
    ft = f.new(t)
    if kv == n:
        heads = [f.new(n)]
        fk = heads[0]
    elif kv == 1:  # Shardy takes no size-1 factor in a compound dim
        heads = [f.new(n)]
        fk = f.new(1)
    else:
        fk, fg = f.new(kv), f.new(n // kv)
        heads = [fk, fg]
    fh = f.new(h)
    fs = f.new(s)
    fd = fh if d == h else f.new(d)
    batch = [[x] for x in lead]
    mappings: list[list[list[str]]] = [[*batch, [ft], heads, [fh]], [*batch, [fs], [fk], [fh]],
                                       [*batch, [fs], [fk], [fd]]]
    full = [*batch, heads, [ft], [fs]]
    for extra in operands[3:]:
        dims = _dims(extra)
        if len(dims) == nl + 3:
            mappings.append([full[i] if dims[i] != 1 or q[i] == 1 and i < nl else [f.new(1)]
                             for i in range(nl + 3)])
        else:  # lengths (*L,)
            mappings.append(batch)
    results = [[*batch, [ft], heads, [fd]]]
    if len(op.results) > 1:  # lse
        results.append([*batch, [ft], heads])
    # Only the leading dims are cut per device; every other factor is gathered before the call.
    f.need_replication = [x for x in f.sizes if x not in lead]
    rule = _rule(mappings, results, f, context)
    return rule, nl


def sample_rule(op: ir.Operation) -> tuple[ir.Attribute, int]:
    """The rule of an `hlofuse_sample` call: logits (*L, V), keys (*L, 2), row ids (*L,), then offsets?
    (*L,) -> ids (*L,), then scores? (*L,); and its number of batch dims, len(L). Also of an
    `hlofuse_sample_top_k` call: logits (*L, V), offsets (*L,) -> values, ids (*L, k).

    L is the rows R on one device and (R, P) in the multi-device layout (P vocabulary splits:
    hlofuse.kernels.cpu.sampling.partitioned_lowering). Every operand and result leads with L (each row
    or split carries its own key, global row id and vocabulary offset, from which the kernel counts the
    noise), so XLA's batch partitioner can cut any L dim on every operand and each device samples its own
    rows and splits with the noise the whole program would draw for them. The split's V and the key words
    are kept whole on each device (`need_replication`)."""
    operands = list(op.operands)
    logits = _dims(operands[0])
    lead = logits[:-1]
    f = _Factors()
    fl = [f.new(size) for size in lead]
    fv = f.new(logits[-1])
    batched = True

    def mapping(value: ir.Value) -> list[list[str]]:
        nonlocal batched
        dims = _dims(value)
        batched = batched and dims[:len(lead)] == lead
        return [[fl[i]] if i < len(lead) and size == lead[i] else [f.new(size)] for i, size in enumerate(dims)]

    mappings = [[*([x] for x in fl), [fv]], *(mapping(x) for x in operands[1:])]
    results = [mapping(x) for x in op.results]
    f.need_replication = [x for x in f.sizes if x not in fl]
    return _rule(mappings, results, f, op.context), len(lead) if batched else 0


def foreign_rule(op: ir.Operation, batch: int) -> tuple[ir.Attribute, int]:
    """The rule of a Pallas / NKI kernel call inside an hlofuse kernel function whose batch is `batch`.

    Every operand and result of those calls leads with the batch B (the kernels' grids run over B first:
    q, k, v in the kernels' layouts, the (B, 2) lengths, partial results) or with a broadcast 1
    (bias, mask): dim 0 of size B is the factor b, every other dim a factor of its own, kept whole
    (`need_replication`). No `num_batch_dims`: XLA has no batch partitioner for these targets, so the
    rule steers propagation (the batch sharding flows through the call) and the partitioner still runs
    the call on whole operands."""
    f = _Factors()
    fb = f.new(batch)

    def mapping(value: ir.Value) -> list[list[str]]:
        dims = _dims(value)
        return [[fb] if i == 0 and size == batch else [f.new(size)] for i, size in enumerate(dims)]

    operands = [mapping(x) for x in op.operands]
    results = [mapping(x) for x in op.results]
    f.need_replication = [x for x in f.sizes if x != fb]
    return _rule(operands, results, f, op.context), 0


def _target(op: ir.Operation) -> str | None:
    if op.name != "stablehlo.custom_call" or "call_target_name" not in op.attributes:
        return None
    return ir.StringAttr(op.attributes["call_target_name"]).value


def annotate_op(op: ir.Operation) -> bool:
    """Adds the rule (and `num_batch_dims`) to one hlofuse custom call; False if it is not one."""
    target = _target(op)
    if target in ATTENTION_TARGETS:
        rule, batch_dims = attention_rule(op)
    elif target in SAMPLE_TARGETS:
        rule, batch_dims = sample_rule(op)
    else:
        return False
    _set_rule(op, rule, batch_dims)
    return True


def module_meshes(module: ir.Operation) -> dict[str, tuple[tuple[str, int], ...]]:
    """The module's `sdy.mesh` symbols: name -> its (axis, size) pairs in mesh order."""
    meshes = {}
    for op in module.regions[0].blocks[0].operations:
        if op.operation.name == "sdy.mesh":
            text = str(op.operation.attributes["mesh"])
            name = ir.StringAttr(op.operation.attributes["sym_name"]).value
            meshes[name] = tuple((axis, int(size)) for axis, size in re.findall(r'"([^"]*)"\s*=\s*(\d+)', text))
    return meshes


def device_count(module: ir.Operation) -> int:
    """How many devices `module` is compiled for: `mhlo.num_partitions`, else the largest `sdy.mesh`."""
    attrs = module.attributes
    count = 1
    if "mhlo.num_partitions" in attrs:
        count = ir.IntegerAttr(attrs["mhlo.num_partitions"]).value
    for axes in module_meshes(module).values():
        count = max(count, math.prod(size for _, size in axes))
    return count


def is_partitioned(module: ir.Operation) -> bool:
    """True when `module` is compiled for more than one device (`mhlo.num_partitions` > 1 or a
    `sdy.mesh` with more than one device): only then do the calls need rules."""
    return device_count(module) > 1


def _set_rule(op: ir.Operation, rule: ir.Attribute, batch_dims: int) -> None:
    op.attributes[RULE_ATTR] = rule
    if batch_dims:
        entries = {}
        if FRONTEND_ATTR in op.attributes:
            old = ir.DictAttr(op.attributes[FRONTEND_ATTR])
            entries = {old[i].name: old[i].attr for i in range(len(old))}
        entries["num_batch_dims"] = ir.StringAttr.get(str(batch_dims), op.context)
        op.attributes[FRONTEND_ATTR] = ir.DictAttr.get(entries, op.context)


def _annotate_foreign_calls(func_op: ir.Operation) -> int:
    """Rules for the Pallas / NKI calls inside one `hlofuse.<op>.<target>` function (batch: its arg 0's
    dim 0, B in every composite's canonical operands)."""
    args = func_op.regions[0].blocks[0].arguments
    try:
        batch = _dims(args[0])[0]
    except (IndexError, ValueError):  # no argument, or not a ranked tensor of rank >= 1
        return 0
    count = 0

    def leads_with_batch(op: ir.Operation) -> bool:
        return any(_dims(x)[:1] == [batch] for x in (*op.operands, *op.results))

    def visit(op: ir.Operation) -> ir.WalkResult:
        nonlocal count
        # A call with no operand or result leading with B (a kernel that pads the rows, as the Pallas
        # sampler pads 4 rows to 8 sublanes) shares no factor: no rule (Shardy rejects an unused factor).
        if _target(op) in FOREIGN_TARGETS and RULE_ATTR not in op.attributes and leads_with_batch(op):
            _set_rule(op, *foreign_rule(op, batch))
            count += 1
        return ir.WalkResult.ADVANCE

    func_op.walk(visit)
    return count


def annotate(root: ir.Operation) -> int:
    """Annotates every hlofuse kernel custom call under `root` (hlofuse's own targets anywhere, other
    targets' calls inside hlofuse kernel functions); returns how many."""
    count = 0
    kernel_funcs: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        nonlocal count
        if annotate_op(op):
            count += 1
        elif (op.name == "func.func" and "sym_name" in op.attributes
              and ir.StringAttr(op.attributes["sym_name"]).value.startswith(KERNEL_FUNC_PREFIX)):
            kernel_funcs.append(op)
        return ir.WalkResult.ADVANCE

    root.walk(visit)
    return count + sum(_annotate_foreign_calls(op) for op in kernel_funcs)


def split_shared_iotas(root: ir.Operation) -> int:
    """Gives each user of a `stablehlo.iota` its own copy; returns how many copies it made.

    hlofuse-prepare's CSE merges equal iotas, e.g. a causal mask's query and key positions when T = S. In
    a module compiled for several devices the merged iota then feeds a sharded query dim and a whole key
    dim, and the partitioner all-gathers it (256 bytes for T = 64 with the queries sharded, which the
    original program, with one iota per use, does not). Copies are free: an iota reads nothing."""
    shared: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "stablehlo.iota" and len(list(op.results[0].uses)) > 1:
            shared.append(op)
        return ir.WalkResult.ADVANCE

    root.walk(visit)
    copies = 0
    for iota in shared:
        for use in list(iota.results[0].uses)[1:]:
            user = use.owner
            copy = iota.clone(ir.InsertionPoint(user))
            user.operands[use.operand_number] = copy.results[0]
            copies += 1
    return copies


def annotate_if_partitioned(module: ir.Operation) -> int:
    """hlofuse-lower-kernels' hook: annotates the module's hlofuse calls when it runs on several devices
    (single-device modules stay exactly as before)."""
    return annotate(module) if is_partitioned(module) else 0


__all__ = ["annotate", "annotate_if_partitioned", "annotate_op", "attention_rule", "device_count", "foreign_rule",
           "is_partitioned", "module_meshes", "sample_rule", "split_shared_iotas"]
