"""Which kernel implements a composite on a target: one table, one entry per (composite, target).

Each entry names a function `lowering(call: CompositeCall) -> Callable` that returns a JAX function of
the composite's operands computing exactly the composite's reference semantics, or raises
`Unsupported` saying why it cannot (a dtype, an attribute, a missing library). hlofuse-lower-kernels
lowers that JAX function into the module in place of the composite.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# (composite name, target) -> "module:function". Backends add their rows here.
LOWERINGS: dict[tuple[str, str], str] = {
    ("hlofuse.attention", "reference"): "hlofuse.kernels.reference:attention_lowering",
    ("hlofuse.attention", "cpu"): "hlofuse.kernels.cpu.attention:attention_lowering",
    ("hlofuse.attention", "tpu"): "hlofuse.kernels.pallas.attention:tpu_lowering",
    ("hlofuse.attention", "gpu"): "hlofuse.kernels.pallas.attention:gpu_lowering",
    ("hlofuse.attention", "tpu-interpret"): "hlofuse.kernels.pallas.attention:tpu_interpret_lowering",
    ("hlofuse.attention", "gpu-interpret"): "hlofuse.kernels.pallas.attention:gpu_interpret_lowering",
    ("hlofuse.attention", "gpu-mosaic"): "hlofuse.kernels.pallas.mosaic_gpu:gpu_mosaic_lowering",
    ("hlofuse.attention", "gpu-mosaic-interpret"): "hlofuse.kernels.pallas.mosaic_gpu:gpu_mosaic_interpret_lowering",
    ("hlofuse.attention", "neuron"): "hlofuse.kernels.nki.attention:neuron_lowering",
    ("hlofuse.attention", "neuron-sim"): "hlofuse.kernels.nki.attention:neuron_sim_lowering",
    ("hlofuse.sample", "reference"): "hlofuse.kernels.sampling_reference:sampling_lowering",
    ("hlofuse.sample", "cpu"): "hlofuse.kernels.cpu.sampling:sampling_lowering",
    ("hlofuse.sample", "tpu"): "hlofuse.kernels.pallas.sampling:tpu_lowering",
    ("hlofuse.sample", "gpu"): "hlofuse.kernels.pallas.sampling:gpu_lowering",
    ("hlofuse.sample", "tpu-interpret"): "hlofuse.kernels.pallas.sampling:tpu_interpret_lowering",
    ("hlofuse.sample", "gpu-interpret"): "hlofuse.kernels.pallas.sampling:gpu_interpret_lowering",
    # Mosaic GPU has no sampler of its own: gpu-mosaic programs sample with the Triton kernel.
    ("hlofuse.sample", "gpu-mosaic"): "hlofuse.kernels.pallas.sampling:gpu_lowering",
    ("hlofuse.sample", "gpu-mosaic-interpret"): "hlofuse.kernels.pallas.sampling:gpu_interpret_lowering",
    ("hlofuse.sample", "neuron"): "hlofuse.kernels.nki.sampling:neuron_lowering",
    ("hlofuse.sample", "neuron-sim"): "hlofuse.kernels.nki.sampling:neuron_sim_lowering",
}

# Targets hlofuse knows, whether or not a kernel for a given composite exists on them yet.
# `gpu` is Triton; `gpu-mosaic` (Mosaic GPU, Hopper) is opt-in until it is measured on hardware.
TARGETS = ("cpu", "tpu", "gpu", "neuron", "reference", "tpu-interpret", "gpu-interpret", "gpu-mosaic",
           "gpu-mosaic-interpret", "neuron-sim")


# target -> "module:function" returning why this host cannot build the target's kernels at all (a missing
# SDK), or None. A lowering pass asked for such a target fails with that message instead of leaving every
# composite behind with a remark: the user asked for kernels that cannot exist here.
AVAILABILITY: dict[str, str] = {
    "neuron": "hlofuse.kernels.nki.attention:missing_sdk",
}


class Unsupported(Exception):
    """The target has no kernel for this composite; the message is the remark."""


class TargetUnavailable(RuntimeError):
    """The target's kernels cannot be built on this host (AVAILABILITY says why)."""


def target_unavailable(target: str) -> str | None:
    """Why `target`'s kernels cannot be built on this host, or None when they can."""
    entry = AVAILABILITY.get(target)
    if entry is None:
        return None
    module_name, function_name = entry.split(":")
    reason: str | None = getattr(importlib.import_module(module_name), function_name)()
    return reason


@dataclass(frozen=True)
class CompositeCall:
    """What a lowering may look at: the composite's name, version, attributes and operand types."""

    name: str
    version: int
    attributes: dict[str, Any]
    operand_types: tuple[tuple[tuple[int, ...], str], ...]  # (shape, element type such as "f32")


def known_targets() -> tuple[str, ...]:
    return tuple(dict.fromkeys(TARGETS + tuple(target for _, target in LOWERINGS)))


def kernel_for(call: CompositeCall, target: str) -> Callable[..., Any]:
    """The JAX function implementing `call` on `target`; raises Unsupported when there is none."""
    entry = LOWERINGS.get((call.name, target))
    if entry is None:
        raise Unsupported(f"no {target} kernel for {call.name} in this build")
    module_name, function_name = entry.split(":")
    lowering = getattr(importlib.import_module(module_name), function_name)
    return lowering(call)
