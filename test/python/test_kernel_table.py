"""hlofuse.kernels: the table of KernelSpecs, one per (composite, target), registered from each backend's SPECS."""

from __future__ import annotations

import dataclasses

import pytest

from hlofuse.kernels import BACKENDS, TARGETS, CompositeCall, Lowered, Partitioning, spec_for, target_specs
from hlofuse.ops.attention import ATTENTION
from hlofuse.ops.sample import SAMPLE

_ATTENTION_CALL = CompositeCall(ATTENTION, 1, {"operands": ["q", "k", "v"], "scale": 0.25, "num_heads": 4,
                                               "num_kv_heads": 2},
                                (((1, 16, 4, 8), "f32"), ((1, 16, 2, 8), "f32"), ((1, 16, 2, 8), "f32")))


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_describes_both_composites(target: str) -> None:
    specs = target_specs(target)
    assert set(specs) == {ATTENTION, SAMPLE}
    for composite, spec in specs.items():
        assert (spec.composite, spec.target) == (composite, target)
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec.target = "other"  # type: ignore[misc]
    assert target_specs(target) is specs  # imported and registered once


def test_who_partitions_each_targets_calls() -> None:
    """The reference is plain JAX ops, the CPU calls run under XLA's batch partitioner, the others per shard."""
    for target in TARGETS:
        expected = {"reference": Partitioning.XLA, "cpu": Partitioning.XLA_BATCH}.get(target, Partitioning.PER_SHARD)
        assert {spec.partitioning for spec in target_specs(target).values()} == {expected}, target
    assert spec_for(ATTENTION, "tpu").prefill_key_ranges and spec_for(ATTENTION, "tpu").query_split is not None
    assert not spec_for(ATTENTION, "neuron-sim").prefill_key_ranges
    assert spec_for(SAMPLE, "gpu-mosaic").vocab_split is not None  # gpu-mosaic samples with the Triton kernel


def test_a_lowering_says_its_platforms_in_its_result() -> None:
    """What the lowering pass reads is the `Lowered` record, never attributes stuck on the function."""
    for target, platforms in (("tpu", ("tpu",)), ("gpu", ("cuda",)), ("tpu-interpret", ()), ("reference", ())):
        lowered = spec_for(ATTENTION, target).lowering(_ATTENTION_CALL)
        assert isinstance(lowered, Lowered) and lowered.platforms == platforms, target
        assert not hasattr(lowered.fn, "lowering_platforms") and not hasattr(lowered.fn, "hlofuse_remark")


def test_the_table_names_each_backend_module_once_per_target() -> None:
    for target, modules in BACKENDS.items():
        assert len(set(modules)) == len(modules), target
