"""What hlofuse-lower-kernels does with one composite: keep it, inline its kernel, or run the kernel per shard.

`choose_strategy` decides from data only: the composite call, the target's `KernelSpec`, the per-shard
`ShardPlan` (its cut axes and `GatheredDim`s) and the pass's options. Its result is one of three records, which
the pass then emits; the remark texts they carry are written for people and read by nothing.

- `Keep`: the composite stays (XLA inlines its decomposition, or partitions it), with the reason.
- `Inline`: the kernel's function replaces the composite: on one device, under XLA's batch partitioner (the CPU
  calls) or where the plan cuts nothing.
- `PerShard`: the kernel lowered for one shard's shapes runs in a `sdy.manual_computation`, alone or as the
  shard pass of a `RangeSplit` (key, query or vocabulary ranges, or a sampler's rows).
"""

from __future__ import annotations

from dataclasses import dataclass

from hlofuse.kernels import CompositeCall, KernelSpec, Lowered, Partitioning, Unsupported
from hlofuse.ops.sample import SAMPLE
from hlofuse.partition.plan import ShardPlan, local_call
from hlofuse.partition.ranges import (
    RangeSplit,
    key_split_for,
    query_split_for,
    sampled_rows,
    vocab_split_for,
    why_keys_stay_whole,
)

MULTI_DEVICE_MODES = ("keep", "local", "batch", "sequence")


@dataclass(frozen=True)
class LoweringOptions:
    """The pass's options, for a module compiled for `devices` devices."""

    target: str
    devices: int
    multi_device: str
    """keep | local | batch | sequence (LowerKernelsPass.multi_device)."""

    @property
    def keeps_all(self) -> bool:
        """multi_device=keep in a multi-device module: every composite is left to XLA's partitioner."""
        return self.multi_device == "keep" and self.devices > 1

    def checks_locality(self, spec: KernelSpec | None) -> bool:
        """Whether a call of `spec` lowers only where its plan keeps every sharded dim local (multi_device=local
        on several devices; plain JAX ops are partitioned by XLA like the program, so they need no check)."""
        return (self.devices > 1 and self.multi_device == "local" and spec is not None
                and spec.partitioning is not Partitioning.XLA)

    def runs_per_shard(self, spec: KernelSpec | None) -> bool:
        """Whether a call of `spec` runs under hlofuse's manual computation (XLA cannot partition it)."""
        return (self.devices > 1 and not self.keeps_all and spec is not None
                and spec.partitioning is Partitioning.PER_SHARD)

    def needs_plan(self, spec: KernelSpec | None) -> bool:
        """Whether the composite's lowering reads a per-shard plan."""
        return self.runs_per_shard(spec) or self.checks_locality(spec)

    def mode_for(self, plan: ShardPlan | None) -> str:
        """The partitioned lowering's mode for one call: under "local", the query and key sequences the plan
        cuts (they arrive, or leave, sharded) are split ("queries", "keys", or both: "sequence") and no
        other, so that no unsharded prefill pays for split copies; otherwise the pass's own mode."""
        if self.multi_device != "local" or plan is None:
            return self.multi_device if self.multi_device != "local" else "batch"
        queries, keys = plan.shards("t") > 1, plan.shards("s") > 1
        return {(True, True): "sequence", (True, False): "queries", (False, True): "keys"}.get((queries, keys), "batch")


@dataclass(frozen=True)
class Keep:
    """The composite stays, with `reason` as its remark (after `notes`)."""

    reason: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Inline:
    """`kernel` replaces the composite in place (`notes` are remarks about how)."""

    kernel: Lowered
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class PerShard:
    """`kernel`, lowered for one shard's shapes, runs under `plan`'s manual computation; with `split`, as its
    shard pass between the split's prepare and merge."""

    kernel: Lowered
    plan: ShardPlan
    split: RangeSplit | None
    notes: tuple[str, ...] = ()


Strategy = Keep | Inline | PerShard

NO_PLAN = ("no sdy.mesh and propagated sharding say how its operands are sharded here (a module partitioned without "
           "Shardy?), so a kernel call might gather them; XLA partitions the composite instead (multi_device=batch "
           "lowers anyway)")
KEEP_ALL = "the module runs on several devices and multi_device=keep leaves every composite to XLA's partitioner"


def choose_strategy(call: CompositeCall, version: int, spec: KernelSpec | None, plan: ShardPlan | None,
                    in_manual_computation: bool, options: LoweringOptions) -> Strategy:
    """What to do with one composite (`version`: the version this build lowers; `in_manual_computation`: it sits
    in a shard_map body, whose shapes are local already)."""
    if call.version != version:
        return Keep(f"version {call.version} is not {version}")
    if options.keeps_all:
        return Keep(KEEP_ALL)
    if spec is None:
        return Keep(f"no {options.target} kernel for {call.name} in this build")
    try:
        kernel = spec.lowering(call, options.devices, options.mode_for(plan))
    except Unsupported as reason:
        return Keep(str(reason))
    if options.checks_locality(spec) and plan is None and not in_manual_computation:
        return Keep(NO_PLAN)
    if plan is not None and plan.gathered and options.multi_device == "local":
        return Keep(_gathered_reason(call, plan, options.target))
    notes: tuple[str, ...] = ()
    if plan is not None and plan.gathered:
        notes = (f"lowered per shard; {_dims(plan)} arrive sharded over mesh axes the kernel cannot cut and are "
                 "all-gathered before it",)
    if plan is not None and plan.is_cut and options.runs_per_shard(spec):
        try:
            return _per_shard(call, spec, plan, kernel, options.target, notes)
        except Unsupported as reason:
            return Keep(str(reason), notes)
    if kernel.remark and not (options.multi_device == "local" and plan is not None):  # local: nothing is gathered
        notes = (*notes, kernel.remark)
    return Inline(kernel, notes)


def _dims(plan: ShardPlan) -> str:
    return ", ".join(str(dim) for dim in plan.gathered)


def _gathered_reason(call: CompositeCall, plan: ShardPlan, target: str) -> str:
    """Why a composite whose plan gathers some operand dims stays under multi_device=local."""
    keys = why_keys_stay_whole(call, target) if plan.gathers_keys else None
    why = f" (its key ranges cannot run per shard: {keys})" if keys else ""
    return (f"{_dims(plan)} arrive sharded over mesh axes the {target} kernel call cannot cut and would be "
            f"all-gathered{why}; XLA partitions the composite instead")


def _per_shard(call: CompositeCall, spec: KernelSpec, plan: ShardPlan, kernel: Lowered, target: str,
               notes: tuple[str, ...]) -> PerShard:
    """`call` run per shard as `plan` cuts it; raises Unsupported (the composite stays, partitioned by XLA) when
    a shard cannot compute its part."""
    stochastic = call.name == SAMPLE and len(call.operand_types) > 1
    if stochastic and not kernel.takes_row_offset:
        raise Unsupported(f"the {target} sampler cannot draw the whole batch's noise for one shard of its rows (its "
                          "noise, or these logits' dtype, has no row offset); XLA partitions the composite instead")
    shard_call = local_call(call, plan)
    try:  # the target must take one shard's problem (its shapes), also where a RangeSplit runs it
        shard_kernel = spec.lower(shard_call)
    except Unsupported as reason:
        raise Unsupported(f"one shard's part ({shard_call.operand_types[0][0]}) has no kernel: {reason}") from None
    for label, split_for, dim in (("s", key_split_for, "key sequence"), ("t", query_split_for, "query sequence"),
                                  ("v", vocab_split_for, "vocabulary")):
        if plan.shards(label) > 1:  # one key, query or vocabulary range per shard (hlofuse.partition.ranges)
            split = split_for(call, target, plan.shards(label))
            if split is None:
                raise Unsupported(f"the {target} kernel cannot take a sharded {dim}")
            return PerShard(shard_kernel, plan, split, notes)
    if stochastic:  # each shard draws its rows of the whole batch's noise
        return PerShard(shard_kernel, plan, sampled_rows(call, plan.cuts, shard_kernel), notes)
    return PerShard(shard_kernel, plan, None, notes)


__all__ = ["MULTI_DEVICE_MODES", "Inline", "Keep", "LoweringOptions", "PerShard", "Strategy", "choose_strategy"]
