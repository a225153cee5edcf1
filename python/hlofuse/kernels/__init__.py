"""Which kernel implements a composite on a target: one table of `KernelSpec`s, keyed by (composite, target).

Each backend module exports its descriptors as `SPECS` (hlofuse.kernels.target). `BACKENDS` names, per
target, the modules that hold them; `spec_for` imports a target's modules the first time it is asked, so
that a CPU compile never imports Pallas or NKI. A spec's `lowering(call)` returns a JAX function of the
composite's operands computing exactly the composite's reference semantics, or raises `Unsupported`
saying why it cannot (a dtype, an attribute, a missing library). hlofuse-lower-kernels lowers that JAX
function into the module in place of the composite.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from hlofuse.kernels.target import CompositeCall, KernelSpec, Lowered, Partitioning, TargetUnavailable, Unsupported

# target -> the modules whose `SPECS` hold its kernels. A target is known here whether or not it has a kernel for
# a given composite yet. `gpu` is Triton; `gpu-mosaic` (Mosaic GPU, Hopper) is opt-in until it is measured on
# hardware, and samples with the Triton kernel (pallas.sampling's specs for it).
BACKENDS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "cpu": ("hlofuse.kernels.cpu.attention", "hlofuse.kernels.cpu.sampling"),
    "tpu": ("hlofuse.kernels.pallas.attention", "hlofuse.kernels.pallas.sampling"),
    "gpu": ("hlofuse.kernels.pallas.attention", "hlofuse.kernels.pallas.sampling"),
    "neuron": ("hlofuse.kernels.nki.attention", "hlofuse.kernels.nki.sampling"),
    "reference": ("hlofuse.kernels.reference",),
    "tpu-interpret": ("hlofuse.kernels.pallas.attention", "hlofuse.kernels.pallas.sampling"),
    "gpu-interpret": ("hlofuse.kernels.pallas.attention", "hlofuse.kernels.pallas.sampling"),
    "gpu-mosaic": ("hlofuse.kernels.pallas.mosaic_gpu", "hlofuse.kernels.pallas.sampling"),
    "gpu-mosaic-interpret": ("hlofuse.kernels.pallas.mosaic_gpu", "hlofuse.kernels.pallas.sampling"),
    "neuron-sim": ("hlofuse.kernels.nki.attention", "hlofuse.kernels.nki.sampling"),
})
TARGETS = tuple(BACKENDS)


@functools.cache
def target_specs(target: str) -> Mapping[str, KernelSpec]:
    """composite name -> `target`'s kernel for it, from the `SPECS` of the target's modules (imported here, once:
    the cache holds an immutable mapping, so threads may share it)."""
    specs: dict[str, KernelSpec] = {}
    for module_name in BACKENDS.get(target, ()):
        module_specs: tuple[KernelSpec, ...] = importlib.import_module(module_name).SPECS
        for spec in module_specs:
            if spec.target == target:
                if spec.composite in specs:
                    raise ValueError(f"two kernels for {spec.composite} on {target}: in {module_name} and before it")
                specs[spec.composite] = spec
    return MappingProxyType(specs)


def spec_for(composite: str, target: str) -> KernelSpec | None:
    """`target`'s kernel descriptor for `composite`, or None when the target has none."""
    return target_specs(target).get(composite)


def target_unavailable(target: str) -> str | None:
    """Why `target`'s kernels cannot be built on this host, or None when they can."""
    return next((why for spec in target_specs(target).values() if (why := spec.unavailable()) is not None), None)


def known_targets() -> tuple[str, ...]:
    return TARGETS


def lowering_for(call: CompositeCall, target: str, devices: int = 1, multi_device: str = "batch") -> Lowered:
    """`target`'s kernel for `call` in a module compiled for `devices` devices; raises Unsupported when there is
    none."""
    spec = spec_for(call.name, target)
    if spec is None:
        raise Unsupported(f"no {target} kernel for {call.name} in this build")
    return spec.lowering(call, devices, multi_device)


def kernel_for(call: CompositeCall, target: str) -> Callable[..., Any]:
    """The JAX function implementing `call` on `target` on one device; raises Unsupported when there is none."""
    return lowering_for(call, target).fn


__all__ = ["BACKENDS", "TARGETS", "CompositeCall", "KernelSpec", "Lowered", "Partitioning", "TargetUnavailable",
           "Unsupported", "kernel_for", "known_targets", "lowering_for", "spec_for", "target_specs",
           "target_unavailable"]
