"""Kernel descriptors: everything hlofuse knows about one kernel of one composite on one target.

A `KernelSpec` is the whole contract between a backend module and the rest of hlofuse. It names the
lowering (composite call -> `Lowered`), how a multi-device module partitions the kernel's call, the dims
a per-shard call can cut and the key / query / vocabulary range splits it takes, and the availability
check of the target's SDK. Each backend module exports its descriptors as `SPECS`; `hlofuse.kernels`
registers them in one lazy table, keyed by (composite, target). `hlofuse-lower-kernels` and the
partition planner read only that table.

A lowering that cannot take a composite raises `Unsupported`, whose message is the remark that the
composite keeps: the support predicate and its remark text are one check, so the two cannot disagree.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hlofuse.partition.cuts import Cuts
    from hlofuse.partition.ranges import RangeSplit


class Unsupported(Exception):
    """The target has no kernel for this composite; the message is the remark."""


class TargetUnavailable(RuntimeError):
    """The target's kernels cannot be built on this host (its spec's `unavailable` says why)."""


@dataclass(frozen=True)
class CompositeCall:
    """What a lowering may look at: the composite's name, version, attributes and operand types."""

    name: str
    version: int
    attributes: dict[str, Any]
    operand_types: tuple[tuple[tuple[int, ...], str], ...]  # (shape, element type such as "f32")

    def with_attributes(self, **changed: Any) -> CompositeCall:  # noqa: ANN401
        """The same call with some attributes changed (a form with a normalization in front lowers as its inner
        form)."""
        return dataclasses.replace(self, attributes={**self.attributes, **changed})


@dataclass(frozen=True)
class Lowered:
    """A kernel ready to be lowered into a module: a JAX function of the composite's operands."""

    fn: Callable[..., Any]
    platforms: tuple[str, ...] = ()
    """The platforms to lower `fn` for ("tpu", "cuda", "neuron"); empty: this host's default backend."""
    takes_row_offset: bool = False
    """Whether `fn(logits, key, row_offset=)` draws the noise of rows offset by `row_offset` (a sampler
    run on one shard of the rows draws the whole batch's noise at its rows)."""
    remark: str | None = None
    """A near-miss that still lowers, for people (e.g. a vocabulary gathered because a form cannot split)."""

    def with_fn(self, fn: Callable[..., Any]) -> Lowered:
        """The same kernel with `fn` (a wrapper of this one's) as its function."""
        return dataclasses.replace(self, fn=fn)

    def after(self, normalize: Callable[[Any], Any]) -> Lowered:
        """The same kernel run on `normalize(logits)` (its first operand): a sampler form with a normalization in
        front (sampling_reference.prelude_of), the normalization by the program's own ops."""
        inner = self.fn
        return self.with_fn(lambda logits, *others, **options: inner(normalize(logits), *others, **options))


class Partitioning(enum.Enum):
    """Who runs a kernel's call per shard in a module compiled for several devices."""

    XLA = "xla"
    """Plain JAX ops (the reference): XLA's partitioner partitions them like any program."""
    XLA_BATCH = "xla-batch"
    """A custom call XLA's batch partitioner runs per shard of its leading dims (the CPU FFI calls,
    hlofuse.sharding); sharded dims that are not leading would be gathered."""
    PER_SHARD = "per-shard"
    """A call XLA cannot partition (Pallas, NKI): hlofuse wraps it in an `sdy.manual_computation`."""


def _no_reason() -> str | None:
    return None


@dataclass(frozen=True)
class KernelSpec:
    """One kernel of `composite` on `target`, as the lowering pass and the partition planner see it."""

    composite: str
    target: str
    lower: Callable[[CompositeCall], Lowered]
    """The kernel for one call on one device (or on one shard's shapes); raises Unsupported (the remark)."""
    partitioning: Partitioning = Partitioning.PER_SHARD
    lower_partitioned: Callable[[CompositeCall, int, str], Lowered] | None = None
    """`(call, devices, multi_device mode)`: the kernel in a module compiled for several devices, when it
    differs from `lower`'s (the CPU calls take the dims to keep local as leading batch dims)."""
    cuts: Callable[[CompositeCall, int], Cuts] | None = None
    """`(call, devices)`: the dims the call keeps local; None: the composite's batch / heads / rows
    (hlofuse.partition.cuts.default_cuts)."""
    key_split: Callable[[CompositeCall, str, int], RangeSplit] | None = None
    """`(call, target, splits)`: the key sequence as one range per shard, partial results merged."""
    prefill_key_ranges: bool = False
    """Whether `key_split` also takes a prefill's key sequence (its ranges need q_offset per batch row),
    not only a decode's."""
    query_split: Callable[[CompositeCall, str, int], RangeSplit] | None = None
    """`(call, target, splits)`: a prefill's query sequence as one range per shard."""
    vocab_split: Callable[[CompositeCall, str, int], RangeSplit] | None = None
    """`(call, target, splits)`: a sampler's vocabulary as one range per shard."""
    unavailable: Callable[[], str | None] = _no_reason
    """Why this host cannot build the target's kernels at all (a missing SDK), or None."""

    def lowering(self, call: CompositeCall, devices: int = 1, multi_device: str = "batch") -> Lowered:
        """The kernel for `call` in a module compiled for `devices` devices; raises Unsupported."""
        if devices > 1 and self.lower_partitioned is not None:
            return self.lower_partitioned(call, devices, multi_device)
        return self.lower(call)


def lowered(fn: Callable[[CompositeCall], Callable[..., Any]]) -> Callable[[CompositeCall], Lowered]:
    """A lowering returning a bare function for this host, as one returning `Lowered`."""

    def lower(call: CompositeCall) -> Lowered:
        return Lowered(fn(call))

    return lower


__all__ = ["CompositeCall", "KernelSpec", "Lowered", "Partitioning", "TargetUnavailable", "Unsupported", "lowered"]
