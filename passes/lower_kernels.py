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
(hlofuse.partition), the CPU calls under XLA's batch partitioner (hlofuse.partition.rules). Per composite the
pass plans (Shardy's propagation, where a lowering reads a plan), picks a strategy from data
(hlofuse.partition.strategy: keep, inline or per shard) and emits it.

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
    TargetUnavailable,
    known_targets,
    spec_for,
    target_unavailable,
)
from hlofuse.ops.attention import ATTENTION, ATTENTION_VERSION
from hlofuse.ops.attributes import attribute_values
from hlofuse.ops.sample import SAMPLE, SAMPLE_VERSION
from hlofuse.partition.manual import manual_computation, wrap_in_manual_computation
from hlofuse.partition.plan import ShardPlan, composites_in, inside_manual_computation, local_call, plan_shards
from hlofuse.partition.ranges import RangeSplit, ShardPass
from hlofuse.partition.rules import annotate_if_partitioned, device_count, split_shared_iotas
from hlofuse.partition.strategy import MULTI_DEVICE_MODES, Inline, Keep, LoweringOptions, Strategy, choose_strategy
from hlofuse.pipeline import ModulePass, PassState

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
        """Plan (per-shard plans from Shardy where a lowering reads one), pick a strategy per composite, emit."""
        if self.target not in known_targets():
            raise ValueError(f"unknown target '{self.target}' (known: {', '.join(known_targets())})")
        if self.multi_device not in MULTI_DEVICE_MODES:
            raise ValueError(f"multi_device takes {', '.join(MULTI_DEVICE_MODES)}, not '{self.multi_device}'")
        options = LoweringOptions(self.target, device_count(module), self.multi_device)
        composites = [op for op in composites_in(module) if ir.StringAttr(op.attributes["name"]).value in VERSIONS]
        if composites and (why := target_unavailable(self.target)) is not None:
            raise TargetUnavailable(f"target '{self.target}' cannot lower {len(composites)} composite(s) here: {why}")
        calls = [composite_call(op) for op in composites]
        specs = [spec_for(call.name, self.target) for call in calls]
        plans = self._plans(module, composites, calls, specs, options)
        lowered_any = False
        for composite, call, spec, plan in zip(composites, calls, specs, plans, strict=True):
            strategy = choose_strategy(call, VERSIONS[call.name], spec, plan, inside_manual_computation(composite),
                                       options)
            lowered_any |= self._emit(strategy, composite, call, module, state)
        if options.devices > 1:
            state.count("shared_iota_split", split_shared_iotas(module))
        if lowered_any:
            erase_unreferenced_private_funcs(module)
            annotate_if_partitioned(module)  # sdy rules for the kernels' custom calls (hlofuse.partition.rules)

    def _plans(self, module: ir.Operation, composites: Sequence[ir.Operation], calls: Sequence[CompositeCall],
               specs: Sequence[KernelSpec | None], options: LoweringOptions) -> list[ShardPlan | None]:
        """Each composite's per-shard plan where its lowering reads one, else None. The probes of one propagation
        stand for every composite, so all are planned together."""
        needed = [options.needs_plan(spec) for spec in specs]
        if not any(needed):
            return [None] * len(composites)
        plans = plan_shards(module, composites, calls, self.target, options.devices)
        return [plan if need else None for plan, need in zip(plans, needed, strict=True)]

    def _emit(self, strategy: Strategy, composite: ir.Operation, call: CompositeCall, module: ir.Operation,
              state: PassState) -> bool:
        """Carries out `strategy` for `composite`, with its remarks and counter; whether a kernel replaced it."""
        short = call.name.removeprefix("hlofuse.")
        for note in strategy.notes:
            state.remark(composite, note)
        if isinstance(strategy, Keep):
            state.remark(composite, f"kept as a composite: {strategy.reason}")
            state.count(f"{short}_kept_composite")
            return False
        base = f"{call.name}.{self.target}"
        if isinstance(strategy, Inline):
            kernel = _with_result_types(strategy.kernel, composite)
            inline_jax_function(kernel.fn, composite, module, base, kernel.platforms)
            state.count(f"{short}_to_{self.target}")
            return True
        if strategy.split is not None:
            _lower_split(composite, strategy.plan, module, strategy.split, base)
        else:
            shard_call = local_call(call, strategy.plan)
            specs = [jax.ShapeDtypeStruct(shape, _DTYPES[dtype]) for shape, dtype in shard_call.operand_types]
            callee = add_jax_function(strategy.kernel.fn, specs, module, base, strategy.kernel.platforms)
            wrap_in_manual_computation(composite, strategy.plan, callee)
        state.count(f"{short}_to_{self.target}_per_shard")
        return True


def _run_per_shard(composite: ir.Operation, plan: ShardPlan, module: ir.Operation, shard_pass: ShardPass,
                   operands: list[ir.Value], name: str) -> list[ir.Value]:
    """`shard_pass` lowered for one shard's shapes and called in a manual computation on `operands`, before
    `composite`; returns its whole results."""
    specs = [jax.ShapeDtypeStruct(plan.local_shape(_spec(v).shape, labels), _spec(v).dtype)
             for v, labels in zip(operands, shard_pass.operands, strict=True)]
    callee = add_jax_function(shard_pass.shard, specs, module, name, shard_pass.platforms)
    whole = [ir.RankedTensorType.get(list(plan.whole_shape(r.shape, labels)), _element_type(r.dtype))
             for r, labels in zip(jax.eval_shape(shard_pass.shard, *specs), shard_pass.results, strict=True)]
    return manual_computation(composite, plan, callee, operands, shard_pass.operands, whole, shard_pass.results)


def _lower_split(composite: ir.Operation, plan: ShardPlan, module: ir.Operation, split: RangeSplit,
                 base: str) -> None:
    """`composite` with a dim cut into ranges: `split.prepare` on the whole operands, `split.first` per shard
    and `split.between` where the split has a first pass, `split.shard` per shard in a manual computation,
    then `split.merge` (a key split combines the ranges' partial results), in place of `composite`."""
    prepared = call_jax_function(split.prepare, list(composite.operands), composite, module, f"{base}.prepare")
    if split.first is not None and split.between is not None:  # both or neither (RangeSplit)
        first = _run_per_shard(composite, plan, module, split.first, prepared, f"{base}.first")
        prepared = call_jax_function(split.between, [*prepared, *first], composite, module, f"{base}.between")
    shard_pass = ShardPass(split.shard, split.operands, split.results, split.platforms)
    partial = _run_per_shard(composite, plan, module, shard_pass, prepared, base)
    merged = call_jax_function(split.merge, partial, composite, module, f"{base}.merge")
    for old, new in zip(composite.results, merged, strict=True):
        old.replace_all_uses_with(new)
    composite.erase()
