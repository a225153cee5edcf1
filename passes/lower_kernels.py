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
every composite of a module compiled for several devices, unless `multi_device=batch` or `sequence`
(docs/sharding.md).

    %0 = stablehlo.composite "hlofuse.attention" %q, %k, %v {...}
  becomes (target=reference)
    %0 = call @hlofuse.attention.reference(%q, %k, %v)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from hlofuse.passes.prepare import erase_unreferenced_private_funcs, inline_private_calls
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func

from hlofuse.composites import ATTENTION, ATTENTION_VERSION, SAMPLE, SAMPLE_VERSION, attribute_values
from hlofuse.ir import build
from hlofuse.kernels import CompositeCall, TargetUnavailable, Unsupported, kernel_for, known_targets, target_unavailable
from hlofuse.pipeline import ModulePass, PassState
from hlofuse.sharding import annotate_if_partitioned, device_count

# (composite, target) -> the lowering used instead in a module compiled for several devices, called as
# `lowering(call, devices, multi_device)`: its kernel takes the dims to keep local (heads, key-range splits)
# as leading batch dims, which XLA's batch partitioner can cut (docs/sharding.md). Other pairs lower as on
# one device.
PARTITIONED_LOWERINGS: dict[tuple[str, str], str] = {
    ("hlofuse.attention", "cpu"): "hlofuse.kernels.cpu.attention:partitioned_lowering",
    ("hlofuse.sample", "cpu"): "hlofuse.kernels.cpu.sampling:partitioned_lowering",
}
# A kernel function may carry a remark (this attribute, a str) about how it was lowered: a near-miss that
# still lowers, e.g. a sampling form that cannot split the vocabulary and so gathers a sharded one.
KERNEL_REMARK_ATTR = "hlofuse_remark"

# The composite versions this build lowers.
VERSIONS = {ATTENTION: ATTENTION_VERSION, SAMPLE: SAMPLE_VERSION}

_DTYPES: dict[str, Any] = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16, "f64": jnp.float64,
                           "i32": jnp.int32, "i64": jnp.int64, "i1": jnp.bool_, "ui32": jnp.uint32}


def _spec(value: ir.Value) -> jax.ShapeDtypeStruct:
    rtype = ir.RankedTensorType(value.type)
    return jax.ShapeDtypeStruct(tuple(rtype.shape), _DTYPES[str(rtype.element_type)])


def inline_jax_function(fn: Callable[..., Any], composite: ir.Operation, module: ir.Operation,
                        base_name: str, platforms: tuple[str, ...] | None = None) -> None:
    """Lowers `fn` for the composite's operand types, adds it to `module`, and calls it instead.

    `platforms` (default: `fn.lowering_platforms` if set, else the default backend) lowers `fn` for
    other platforms than this host's, e.g. ("tpu",) for a Pallas Mosaic kernel on a CPU-only host.
    """
    specs = [_spec(v) for v in composite.operands]
    platforms = platforms or getattr(fn, "lowering_platforms", None)
    if platforms:
        lowered = jax.jit(fn).trace(*specs).lower(lowering_platforms=tuple(platforms))
    else:
        lowered = jax.jit(fn).lower(*specs)
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
    with composite.location, ir.InsertionPoint(composite):
        call = func.CallOp([r.type for r in composite.results], ir.FlatSymbolRefAttr.get(name),
                           list(composite.operands))
    for old, new in zip(composite.results, call.results, strict=True):
        old.replace_all_uses_with(new)
    composite.erase()


def _composite_call(composite: ir.Operation) -> CompositeCall:
    name = ir.StringAttr(composite.attributes["name"]).value
    version = ir.IntegerAttr(composite.attributes["version"]).value if "version" in composite.attributes else 0
    types = tuple((tuple(ir.RankedTensorType(v.type).shape), str(ir.RankedTensorType(v.type).element_type))
                  for v in composite.operands)
    return CompositeCall(name, version, attribute_values(composite.attributes["composite_attributes"]), types)


def _kernel(call: CompositeCall, target: str, devices: int, multi_device: str) -> Callable[..., Any]:
    """The target's kernel for `call` in a module compiled for `devices` devices; raises Unsupported."""
    entry = PARTITIONED_LOWERINGS.get((call.name, target)) if devices > 1 else None
    if entry is None:
        return kernel_for(call, target)
    module_name, function_name = entry.split(":")
    lowering: Callable[[CompositeCall, int, str], Callable[..., Any]] = getattr(
        importlib.import_module(module_name), function_name)
    return lowering(call, devices, multi_device)


def _composites(module: ir.Operation) -> list[ir.Operation]:
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "stablehlo.composite":
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return found


@dataclass(frozen=True)
class LowerKernelsPass(ModulePass):
    """Replaces hlofuse composites with `target`'s kernels; unsupported ones stay, with a remark."""

    name: ClassVar[str] = "hlofuse-lower-kernels"
    summary: ClassVar[str] = ("Lower hlofuse composites to the target's kernels (cpu|tpu|gpu|gpu-mosaic|neuron|"
                              "reference, or tpu-|gpu-|gpu-mosaic-interpret, neuron-sim to check them on a CPU)")

    target: str = "cpu"
    # In a module compiled for several devices: "keep" leaves composites to XLA's partitioner, which
    # splits them along any sharded dim; "batch" lowers anyway (kernels keep batch, heads, a decode or
    # chunk's KV sequence and a vocabulary local, so other sharded dims are gathered); "sequence" also
    # splits every prefill's query and key ranges, which costs copies where they are not sharded (see
    # docs/sharding.md).
    multi_device: str = "keep"

    def run(self, module: ir.Operation, state: PassState) -> None:
        if self.target not in known_targets():
            raise ValueError(f"unknown target '{self.target}' (known: {', '.join(known_targets())})")
        if self.multi_device not in ("keep", "batch", "sequence"):
            raise ValueError(f"multi_device takes keep, batch or sequence, not '{self.multi_device}'")
        devices = device_count(module)
        keep_partitioned = self.multi_device == "keep" and devices > 1
        composites = [op for op in _composites(module) if ir.StringAttr(op.attributes["name"]).value in VERSIONS]
        if composites and (why := target_unavailable(self.target)) is not None:
            raise TargetUnavailable(f"target '{self.target}' cannot lower {len(composites)} composite(s) here: {why}")
        lowered_any = False
        for composite in composites:
            call = _composite_call(composite)
            short = call.name.removeprefix("hlofuse.")
            try:
                if call.version != VERSIONS[call.name]:
                    raise Unsupported(f"version {call.version} is not {VERSIONS[call.name]}")
                if keep_partitioned:
                    raise Unsupported("the module runs on several devices and a kernel call gathers the dims "
                                      "it cannot cut (a KV sequence outside decode, a vocab); XLA partitions the "
                                      "composite instead (multi_device=batch lowers)")
                kernel = _kernel(call, self.target, devices, self.multi_device)
            except Unsupported as reason:
                state.remark(composite, f"kept as a composite: {reason}")
                state.count(f"{short}_kept_composite")
                continue
            remark = getattr(kernel, KERNEL_REMARK_ATTR, None)
            if remark:
                state.remark(composite, str(remark))
            inline_jax_function(kernel, composite, module, f"{call.name}.{self.target}")
            state.count(f"{short}_to_{self.target}")
            lowered_any = True
        if lowered_any:
            erase_unreferenced_private_funcs(module)
            annotate_if_partitioned(module)  # sdy rules for the kernels' custom calls (hlofuse.sharding)
