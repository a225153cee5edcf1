"""hlofuse-lower-kernels: replaces each hlofuse composite with the target's kernel.

Matches: `stablehlo.composite "hlofuse.attention"` and `"hlofuse.sample"` (version 1).
Emits, by `target` (the table in hlofuse.kernels says which function implements what):
  reference      a call to the plain-jnp reference, lowered by JAX into this module. It runs anywhere,
                 and since it is built from the composite's attributes alone, comparing it with the
                 original program checks that fusion read the attributes right.
  cpu            `stablehlo.custom_call @hlofuse_attention` / `@hlofuse_sample*` (XLA FFI, api_version 4,
                 the attributes as FFI attributes) when the native kernels are built.
  tpu, gpu       the Pallas kernels' `tpu_custom_call` (Mosaic) / `__gpu$xla.gpu.triton`, lowered for
                 that platform on any host.
  tpu-interpret, gpu-interpret
                 the same Pallas kernels in interpret mode, to check them on a CPU.
  gpu-mosaic     attention on Hopper: the Mosaic GPU kernel's `mosaic_gpu_v2` (prefill; decode goes to
                 the Triton kernel), lowered for cuda on any host.
  gpu-mosaic-interpret
                 that kernel in the Mosaic GPU interpreter, through a host call (docs/kernels-pallas.md).
  neuron         the NKI kernels traced with nki.jit (`AwsNeuronCustomNativeKernel`) when the Neuron
                 SDK (neuronxcc) imports; without it the pass fails with TargetUnavailable, whose message
                 says how to install the SDK (hlofuse-opt: one error line, exit 1; jax.jit: a fallback
                 warning and the original program, or HlofuseCompileError under hlofuse_strict).
  neuron-sim     the NKI kernels on the host, under NKI's simulator or hlofuse's NumPy emulation.
A composite that no kernel takes (a dtype, an attribute, a missing library) stays as it is, with a
remark saying why: XLA then inlines its decomposition, so the program stays exactly right. So does
In a module compiled for several devices (docs/sharding.md) a composite is lowered only where its kernel call
keeps every sharded dim local (`multi_device=local`, the default: Shardy's propagation on a copy of the module
says how the operands arrive); Pallas and NKI calls then run per shard inside `sdy.manual_computation`
(hlofuse.shard_local), the CPU calls under XLA's batch partitioner (hlofuse.sharding).

    %0 = stablehlo.composite "hlofuse.attention" %q, %k, %v {...}
  becomes (target=reference)
    %0 = call @hlofuse.attention.reference(%q, %k, %v)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from hlofuse.passes.prepare import erase_unreferenced_private_funcs, inline_private_calls
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func

from hlofuse.ir import build
from hlofuse.kernels import (
    CompositeCall,
    KernelSpec,
    Lowered,
    Partitioning,
    TargetUnavailable,
    Unsupported,
    known_targets,
    spec_for,
    target_unavailable,
)
from hlofuse.ops.attention import ATTENTION, ATTENTION_VERSION
from hlofuse.ops.attributes import attribute_values
from hlofuse.ops.sample import SAMPLE, SAMPLE_VERSION
from hlofuse.pipeline import ModulePass, PassState
from hlofuse.shard_local import (
    RangeSplit,
    ShardPass,
    ShardPlan,
    composites_in,
    inside_manual_computation,
    key_split_for,
    local_call,
    manual_computation,
    plan_shards,
    query_split_for,
    sampled_rows,
    vocab_split_for,
    why_keys_stay_whole,
    wrap_in_manual_computation,
)
from hlofuse.sharding import annotate_if_partitioned, device_count, split_shared_iotas

MULTI_DEVICE_MODES = ("keep", "local", "batch", "sequence")

# The composite versions this build lowers.
VERSIONS = {ATTENTION: ATTENTION_VERSION, SAMPLE: SAMPLE_VERSION}

_DTYPES: dict[str, Any] = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16, "f64": jnp.float64,
                           "i32": jnp.int32, "i64": jnp.int64, "i1": jnp.bool_, "ui32": jnp.uint32}


def _spec(value: ir.Value) -> jax.ShapeDtypeStruct:
    rtype = ir.RankedTensorType(value.type)
    return jax.ShapeDtypeStruct(tuple(rtype.shape), _DTYPES[str(rtype.element_type)])


def add_jax_function(fn: Callable[..., Any], specs: Sequence[jax.ShapeDtypeStruct], module: ir.Operation,
                     base_name: str, platforms: tuple[str, ...] = ()) -> str:
    """Lowers `fn` for `specs` into a private function of `module`; returns its symbol name.

    `platforms` (default: this host's backend) lowers `fn` for other platforms than this host's, e.g.
    ("tpu",) for a Pallas Mosaic kernel on a CPU-only host (a kernel's `Lowered.platforms`).
    """
    jitted = jax.jit(fn, keep_unused=True)  # the callers pass every operand, used or not
    if platforms:
        lowered = jitted.trace(*specs).lower(lowering_platforms=tuple(platforms))
    else:
        lowered = jitted.lower(*specs)
    imported = ir.Module.parse(lowered.as_text(), context=module.context)
    inline_private_calls(imported.operation)
    main = next(op.operation for op in imported.body.operations
                if ir.StringAttr(op.operation.attributes["sym_name"]).value == "main")
    name = build.unique_symbol(module, base_name)
    main.attributes["sym_name"] = ir.StringAttr.get(name)
    main.attributes["sym_visibility"] = ir.StringAttr.get("private")
    for attr in ("arg_attrs", "res_attrs"):
        if attr in main.attributes:
            del main.attributes[attr]
    body = module.regions[0].blocks[0]
    main.move_after(list(body.operations)[-1].operation)
    return name


def call_jax_function(fn: Callable[..., Any], operands: Sequence[ir.Value], anchor: ir.Operation,
                      module: ir.Operation, base_name: str) -> list[ir.Value]:
    """Lowers `fn` for `operands`' types into `module` and calls it on them before `anchor`."""
    name = add_jax_function(fn, [_spec(v) for v in operands], module, base_name)
    callee = next(op.operation for op in module.regions[0].blocks[0].operations
                  if "sym_name" in op.operation.attributes
                  and ir.StringAttr(op.operation.attributes["sym_name"]).value == name)
    result_types = ir.FunctionType(ir.TypeAttr(callee.attributes["function_type"]).value).results
    with anchor.location, ir.InsertionPoint(anchor):
        call = func.CallOp(list(result_types), ir.FlatSymbolRefAttr.get(name), list(operands))
    return list(call.results)


def _element_type(dtype: Any) -> ir.Type:  # noqa: ANN401
    name = next(key for key, value in _DTYPES.items() if jnp.dtype(value) == dtype)
    return ir.RankedTensorType(ir.Type.parse(f"tensor<{name}>")).element_type


def inline_jax_function(fn: Callable[..., Any], composite: ir.Operation, module: ir.Operation,
                        base_name: str, platforms: tuple[str, ...] = ()) -> None:
    """Lowers `fn` for the composite's operand types, adds it to `module` (`add_jax_function`), and calls
    it instead of the composite."""
    name = add_jax_function(fn, [_spec(v) for v in composite.operands], module, base_name, platforms)
    with composite.location, ir.InsertionPoint(composite):
        call = func.CallOp([r.type for r in composite.results], ir.FlatSymbolRefAttr.get(name),
                           list(composite.operands))
    for old, new in zip(composite.results, call.results, strict=True):
        old.replace_all_uses_with(new)
    composite.erase()


def _with_result_types(kernel: Lowered, composite: ir.Operation) -> Lowered:
    """`kernel` returning the composite's result element types: a kernel computes in its inputs' dtype, and
    a program may ask for another (bf16 q, k, v with an f32 P·V result), which the composite's type says."""
    dtypes = [_DTYPES[str(ir.RankedTensorType(r.type).element_type)] for r in composite.results]
    fn = kernel.fn

    @functools.wraps(fn)
    def converted(*operands: Any, **options: Any) -> Any:  # noqa: ANN401  (options: a sampler's row_offset)
        out = fn(*operands, **options)
        if isinstance(out, (tuple, list)):
            return type(out)(o.astype(d) for o, d in zip(out, dtypes, strict=True))
        return out.astype(dtypes[0])

    return kernel.with_fn(converted)


def composite_call(composite: ir.Operation) -> CompositeCall:
    name = ir.StringAttr(composite.attributes["name"]).value
    version = ir.IntegerAttr(composite.attributes["version"]).value if "version" in composite.attributes else 0
    types = tuple((tuple(ir.RankedTensorType(v.type).shape), str(ir.RankedTensorType(v.type).element_type))
                  for v in composite.operands)
    return CompositeCall(name, version, attribute_values(composite.attributes["composite_attributes"]), types)


def _kernel_spec(call: CompositeCall, target: str) -> KernelSpec:
    """The target's kernel descriptor for `call`; raises Unsupported when it has none."""
    spec = spec_for(call.name, target)
    if spec is None:
        raise Unsupported(f"no {target} kernel for {call.name} in this build")
    return spec


def _check_local(plan: ShardPlan | None, composite: ir.Operation, target: str) -> None:
    """Raises Unsupported unless `plan` shows that `target`'s call keeps every sharded operand dim local."""
    if plan is None and not inside_manual_computation(composite):  # a shard_map body's shapes are local
        raise Unsupported("no sdy.mesh and propagated sharding say how its operands are sharded here (a module "
                          "partitioned without Shardy?), so a kernel call might gather them; XLA partitions the "
                          "composite instead (multi_device=batch lowers anyway)")


def _gathers_keys(plan: ShardPlan) -> bool:
    """Whether the plan would gather K or V (whose dim 1 is the key sequence)."""
    return any(dim.startswith(("k dim 1 ", "v dim 1 ")) for dim in plan.gathered)


@dataclass(frozen=True)
class LowerKernelsPass(ModulePass):
    """Replaces hlofuse composites with `target`'s kernels; unsupported ones stay, with a remark."""

    name: ClassVar[str] = "hlofuse-lower-kernels"
    summary: ClassVar[str] = ("Lower hlofuse composites to the target's kernels (cpu|tpu|gpu|gpu-mosaic|neuron|"
                              "reference, or tpu-|gpu-|gpu-mosaic-interpret, neuron-sim to check them on a CPU)")

    target: str = "cpu"
    # In a module compiled for several devices: "local" lowers the composites whose sharded dims the kernel
    # call keeps local (Shardy's propagation says how each operand arrives) and keeps the others for XLA's
    # partitioner; "keep" keeps every composite; "batch" lowers every one, gathering the sharded dims a call
    # cannot cut; "sequence" is "batch" with every CPU prefill's query and key ranges split, which costs
    # copies where they are not sharded ("local" splits them only where they are; docs/sharding.md).
    multi_device: str = "local"

    def run(self, module: ir.Operation, state: PassState) -> None:
        if self.target not in known_targets():
            raise ValueError(f"unknown target '{self.target}' (known: {', '.join(known_targets())})")
        if self.multi_device not in MULTI_DEVICE_MODES:
            raise ValueError(f"multi_device takes {', '.join(MULTI_DEVICE_MODES)}, not '{self.multi_device}'")
        devices = device_count(module)
        keep_partitioned = self.multi_device == "keep" and devices > 1
        composites = [op for op in composites_in(module) if ir.StringAttr(op.attributes["name"]).value in VERSIONS]
        if composites and (why := target_unavailable(self.target)) is not None:
            raise TargetUnavailable(f"target '{self.target}' cannot lower {len(composites)} composite(s) here: {why}")
        calls = [composite_call(op) for op in composites]
        specs = [spec_for(call.name, self.target) for call in calls]
        partitionings = [spec.partitioning if spec is not None else None for spec in specs]
        checked = [devices > 1 and self.multi_device == "local" and p is not Partitioning.XLA for p in partitionings]
        per_shard = [devices > 1 and not keep_partitioned and p is Partitioning.PER_SHARD for p in partitionings]
        planned = [shard or check for shard, check in zip(per_shard, checked, strict=True)]
        plans = (plan_shards(module, composites, calls, self.target, devices) if any(planned)
                 else [None] * len(composites))
        lowered_any = False
        for composite, call, plan, shard, check, needed in zip(composites, calls, plans, per_shard, checked, planned,
                                                              strict=True):
            short = call.name.removeprefix("hlofuse.")
            plan = plan if needed else None
            try:
                if call.version != VERSIONS[call.name]:
                    raise Unsupported(f"version {call.version} is not {VERSIONS[call.name]}")
                if keep_partitioned:
                    raise Unsupported("the module runs on several devices and multi_device=keep leaves every "
                                      "composite to XLA's partitioner")
                lowering = _kernel_spec(call, self.target).lowering(call, devices, self._mode_for(plan))
                kernel = _with_result_types(lowering, composite)
                if check:
                    _check_local(plan, composite, self.target)
                if plan is not None and plan.gathered and self.multi_device == "local":
                    keys = why_keys_stay_whole(call, self.target) if _gathers_keys(plan) else None
                    why = f" (its key ranges cannot run per shard: {keys})" if keys else ""
                    raise Unsupported(f"{', '.join(plan.gathered)} arrive sharded over mesh axes the {self.target} "
                                      f"kernel call cannot cut and would be all-gathered{why}; XLA partitions the "
                                      "composite instead")
                if plan is not None and plan.gathered:
                    state.remark(composite, f"lowered per shard; {', '.join(plan.gathered)} arrive sharded over "
                                            "mesh axes the kernel cannot cut and are all-gathered before it")
                if plan is not None and plan.is_cut and shard:
                    self._lower_per_shard(composite, call, plan, kernel, module)
                    state.count(f"{short}_to_{self.target}_per_shard")
                    lowered_any = True
                    continue
            except Unsupported as reason:
                state.remark(composite, f"kept as a composite: {reason}")
                state.count(f"{short}_kept_composite")
                continue
            if kernel.remark and not (self.multi_device == "local" and plan is not None):  # local: nothing gathered
                state.remark(composite, kernel.remark)
            inline_jax_function(kernel.fn, composite, module, f"{call.name}.{self.target}", kernel.platforms)
            state.count(f"{short}_to_{self.target}")
            lowered_any = True
        if devices > 1:
            state.count("shared_iota_split", split_shared_iotas(module))
        if lowered_any:
            erase_unreferenced_private_funcs(module)
            annotate_if_partitioned(module)  # sdy rules for the kernels' custom calls (hlofuse.sharding)

    def _mode_for(self, plan: ShardPlan | None) -> str:
        """The partitioned lowering's mode for one call: under "local", the query and key sequences the plan
        cuts (they arrive, or leave, sharded) are split ("queries", "keys", or both: "sequence") and no
        other, so that no unsharded prefill pays for split copies; otherwise the pass's own mode."""
        if self.multi_device != "local" or plan is None:
            return self.multi_device if self.multi_device != "local" else "batch"
        queries, keys = plan.shards("t") > 1, plan.shards("s") > 1
        return {(True, True): "sequence", (True, False): "queries", (False, True): "keys"}.get((queries, keys), "batch")

    def _lower_per_shard(self, composite: ir.Operation, call: CompositeCall, plan: ShardPlan,
                         kernel: Lowered, module: ir.Operation) -> None:
        """Lowers `composite` as `plan`'s manual computation around the kernel for one shard's shapes;
        raises Unsupported (the composite stays, partitioned by XLA) when a shard cannot compute its part."""
        stochastic = call.name == SAMPLE and len(call.operand_types) > 1
        if stochastic and not kernel.takes_row_offset:
            raise Unsupported(f"the {self.target} sampler cannot draw the whole batch's noise for one shard of its "
                              "rows (its noise, or these logits' dtype, has no row offset); XLA partitions the "
                              "composite instead")
        shard_call = local_call(call, plan)
        try:  # the target must take one shard's problem (its shapes), also where a RangeSplit runs it
            shard_kernel = _kernel_spec(shard_call, self.target).lower(shard_call)
        except Unsupported as reason:
            raise Unsupported(f"one shard's part ({shard_call.operand_types[0][0]}) has no kernel: {reason}") from None
        for label, split_for, dim in (("s", key_split_for, "key sequence"), ("t", query_split_for, "query sequence"),
                                      ("v", vocab_split_for, "vocabulary")):
            if plan.shards(label) > 1:  # one key, query or vocabulary range per shard (hlofuse.shard_local)
                split = split_for(call, self.target, plan.shards(label))
                if split is None:
                    raise Unsupported(f"the {self.target} kernel cannot take a sharded {dim}")
                self._lower_split(composite, call, plan, module, split)
                return
        if stochastic:  # each shard draws its rows of the whole batch's noise
            self._lower_split(composite, call, plan, module, sampled_rows(call, plan.cuts, shard_kernel))
            return
        specs = [jax.ShapeDtypeStruct(shape, _DTYPES[dtype]) for shape, dtype in shard_call.operand_types]
        wrap_in_manual_computation(composite, plan, add_jax_function(shard_kernel.fn, specs, module,
                                                                     f"{call.name}.{self.target}",
                                                                     shard_kernel.platforms))

    def _run_per_shard(self, composite: ir.Operation, plan: ShardPlan, module: ir.Operation, shard_pass: ShardPass,
                       operands: list[ir.Value], name: str) -> list[ir.Value]:
        """`shard_pass` lowered for one shard's shapes and called in a manual computation on `operands`, before
        `composite`; returns its whole results."""
        specs = [jax.ShapeDtypeStruct(plan.local_shape(_spec(v).shape, labels), _spec(v).dtype)
                 for v, labels in zip(operands, shard_pass.operands, strict=True)]
        callee = add_jax_function(shard_pass.shard, specs, module, name, shard_pass.platforms)
        whole = [ir.RankedTensorType.get(list(plan.whole_shape(r.shape, labels)), _element_type(r.dtype))
                 for r, labels in zip(jax.eval_shape(shard_pass.shard, *specs), shard_pass.results, strict=True)]
        return manual_computation(composite, plan, callee, operands, shard_pass.operands, whole, shard_pass.results)

    def _lower_split(self, composite: ir.Operation, call: CompositeCall, plan: ShardPlan, module: ir.Operation,
                     split: RangeSplit) -> None:
        """`composite` with a dim cut into ranges: `split.prepare` on the whole operands, `split.first` per shard
        and `split.between` where the split has a first pass, `split.shard` per shard in a manual computation,
        then `split.merge` (a key split combines the ranges' partial results), in place of `composite`."""
        base = f"{call.name}.{self.target}"
        prepared = call_jax_function(split.prepare, list(composite.operands), composite, module, f"{base}.prepare")
        if split.first is not None and split.between is not None:  # both or neither (RangeSplit)
            first = self._run_per_shard(composite, plan, module, split.first, prepared, f"{base}.first")
            prepared = call_jax_function(split.between, [*prepared, *first], composite, module, f"{base}.between")
        partial = self._run_per_shard(composite, plan, module,
                                      ShardPass(split.shard, split.operands, split.results, split.platforms),
                                      prepared, base)
        merged = call_jax_function(split.merge, partial, composite, module, f"{base}.merge")
        for old, new in zip(composite.results, merged, strict=True):
            old.replace_all_uses_with(new)
        composite.erase()
