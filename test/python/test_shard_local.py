"""hlofuse.partition: the dims a kernel call can cut, the per-composite plans Shardy's propagation gives, and the
strategy the lowering picks from them."""

from __future__ import annotations

import re

import pytest

from hlofuse.ir.context import parse_module
from hlofuse.kernels import CompositeCall, spec_for
from hlofuse.partition.cuts import attention_cuts, cuts_for, prefill_key_split_unsupported, sample_cuts
from hlofuse.partition.plan import GatheredDim, composites_in, plan_shards
from hlofuse.partition.strategy import Keep, LoweringOptions, PerShard, choose_strategy

ATTRS = {"operands": ["q", "k", "v", "kv_lengths"], "causal": True}


def _attention_call(heads: int, kv_heads: int) -> CompositeCall:
    return CompositeCall("hlofuse.attention", 1, ATTRS, (((4, 16, heads, 8), "f32"), ((4, 32, kv_heads, 8), "f32"),
                                                         ((4, 32, kv_heads, 8), "f32"), ((4,), "i32")))


def test_attention_cuts_batch_and_heads_with_the_kv_heads_they_read() -> None:
    gqa = attention_cuts(_attention_call(8, 2))
    assert gqa.operands == (("b", "", "n", ""), ("b", "", "n", ""), ("b", "", "n", ""), ("b",))
    assert gqa.sizes == {"b": 4, "n": 2}  # the head factor is K; q's N = (K, N / K)
    mqa = attention_cuts(_attention_call(8, 1))
    assert mqa.operands[1] == ("b", "", "", "")  # the one kv head stays whole on every shard
    assert mqa.sizes == {"b": 4, "n": 8}


def test_sample_cuts_the_first_row_dim_longer_than_one() -> None:
    call = CompositeCall("hlofuse.sample", 1, {}, (((1, 6, 3, 128), "f32"), ((2,), "ui32")))
    cuts = sample_cuts(call)
    assert cuts.operands == (("", "r", "", ""), ("",)) and cuts.results == (("", "r", ""),)
    assert sample_cuts(call, vocab=True).operands[0] == ("", "r", "", "v")
    single = CompositeCall("hlofuse.sample", 1, {}, (((1, 128), "f32"),))
    assert sample_cuts(single).sizes == {}


def test_each_target_cuts_what_its_call_can_keep_local() -> None:
    attrs = {"causal": False, "decode": True, "layout": "BTNH", "mask_kind": "lengths", "masked_value": float("-inf"),
             "num_heads": 8, "num_kv_heads": 1, "operands": ["q", "k", "v", "kv_lengths"], "q_offset": 0,
             "scale": 0.35, "softcap": 0.0, "window_left": -1, "window_right": -1, "zero_empty_rows": False}
    call = CompositeCall("hlofuse.attention", 1, attrs,
                         (((4, 1, 8, 8), "f32"), ((4, 64, 1, 8), "f32"), ((4, 64, 1, 8), "f32"), ((4,), "i32")))
    cuts = cuts_for(call, "cpu", 8)
    assert cuts is not None
    assert cuts.operands[0] == ("b", "", "", "") and cuts.operands[1] == ("b", "s", "", "")
    # The Pallas and NKI calls cut the key sequence of a decode too (partial results merged after the shards)
    # and keep MQA's query heads cuttable (gpu-mosaic decodes with the Triton kernel).
    for target in ("tpu", "gpu-interpret", "gpu-mosaic", "neuron-sim"):
        cuts = cuts_for(call, target, 8)
        assert cuts is not None and cuts.operands[:2] == (("b", "", "n", ""), ("b", "s", "", "")), target
        assert cuts.sizes["s"] == 64
    prefill = CompositeCall(call.name, 1, attrs, (((4, 16, 8, 8), "bf16"), *call.operand_types[1:]))
    assert cuts_for(prefill, "gpu-mosaic", 8) == attention_cuts(prefill)
    # A prefill's key sequence: the Pallas tpu / gpu kernels take each range's q_offset per batch row; the
    # Mosaic GPU and NKI kernels do not, and a bias, a mask or a finite masked_value rules the ranges out.
    for target in ("tpu", "gpu", "tpu-interpret", "gpu-interpret"):
        cuts = cuts_for(prefill, target, 8)
        assert cuts is not None and cuts.operands[:2] == (("b", "t", "n", ""), ("b", "s", "", "")), target
        assert cuts.results == (("b", "t", "n", ""),) and cuts.sizes["t"] == 16
    for target in ("gpu-mosaic", "neuron", "neuron-sim"):
        assert cuts_for(prefill, target, 8) == attention_cuts(prefill), target
    finite = CompositeCall(call.name, 1, {**attrs, "masked_value": -1e9}, prefill.operand_types)
    finite_cuts = cuts_for(finite, "tpu", 8)
    assert finite_cuts is not None and "s" not in finite_cuts.sizes and finite_cuts.sizes["t"] == 16  # rows: no merge
    assert prefill_key_split_unsupported(finite) == "a finite masked_value"
    masked = CompositeCall(call.name, 1, {**attrs, "operands": ["q", "k", "v", "mask"]},
                           (*prefill.operand_types[:3], ((4, 1, 16, 64), "i1")))
    assert cuts_for(masked, "gpu", 8) == attention_cuts(masked)
    assert prefill_key_split_unsupported(masked) == "a bias or a mask"


_MODULE = """
module @m attributes {mhlo.num_partitions = 8 : i32} {
  sdy.mesh @mesh = <["data"=2, "model"=4]>
  func.func public @main(%q: tensor<4x16x8x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}, {"model"}, {}]>},
                         %k: tensor<4x16x2x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {"model"}, {}, {}]>})
      -> tensor<4x16x8x16xf32> {
    %0 = stablehlo.composite "hlofuse.attention" %q, %k, %k {composite_attributes = {operands = ["q", "k", "v"]},
      decomposition = @impl, version = 1 : i32}
      : (tensor<4x16x8x16xf32>, tensor<4x16x2x16xf32>, tensor<4x16x2x16xf32>) -> tensor<4x16x8x16xf32>
    return %0 : tensor<4x16x8x16xf32>
  }
  func.func private @impl(%q: tensor<4x16x8x16xf32>, %k: tensor<4x16x2x16xf32>, %v: tensor<4x16x2x16xf32>)
      -> tensor<4x16x8x16xf32> {
    return %q : tensor<4x16x8x16xf32>
  }
}
"""


def _call(module_text: str) -> tuple[object, list[CompositeCall]]:
    module = parse_module(module_text)
    call = CompositeCall("hlofuse.attention", 1, {"operands": ["q", "k", "v"]},
                         (((4, 16, 8, 16), "f32"), ((4, 16, 2, 16), "f32"), ((4, 16, 2, 16), "f32")))
    return module, [call]


def test_a_plan_names_the_axes_of_each_cut_and_what_would_be_gathered() -> None:
    module, calls = _call(_MODULE)
    (plan,) = plan_shards(module.operation, composites_in(module.operation), calls, "neuron-sim", 8)
    assert plan is not None
    assert plan.axes["b"] == ("data",)
    # 4 shards of the query heads would split K = 2 kv heads unevenly: the heads stay whole.
    assert plan.shards("n") == 1
    assert plan.local_shape((4, 16, 8, 16), ("b", "", "n", "")) == (2, 16, 8, 16)
    # q's heads arrive over `model`, k's key sequence too: both would be gathered.
    assert plan.gathered == (GatheredDim("q", 2, ("model",)), GatheredDim("k", 1, ("model",)),
                             GatheredDim("v", 1, ("model",)))
    assert plan.gathers_keys
    assert [str(dim) for dim in plan.gathered] == ["q dim 2 (over model)", "k dim 1 (over model)",
                                                   "v dim 1 (over model)"]


def test_the_strategy_is_taken_from_the_plan_and_the_spec() -> None:
    """Under multi_device=local a plan that gathers keeps the composite, naming the gathered dims; under batch the
    same plan runs per shard of the batch (no range split: the heads and keys stay whole), with a note that they
    are gathered; another version always stays."""
    module, calls = _call(_MODULE)
    (plan,) = plan_shards(module.operation, composites_in(module.operation), calls, "neuron-sim", 8)
    spec = spec_for("hlofuse.attention", "neuron-sim")
    attrs = {"operands": ["q", "k", "v"], "scale": 0.25, "num_heads": 8, "num_kv_heads": 2}
    calls = [CompositeCall(calls[0].name, 1, attrs, calls[0].operand_types)]
    local = choose_strategy(calls[0], 1, spec, plan, False, LoweringOptions("neuron-sim", 8, "local"))
    assert isinstance(local, Keep) and local.reason.startswith("q dim 2 (over model), k dim 1 (over model)")
    assert "its key ranges cannot run per shard" in local.reason
    batch = choose_strategy(calls[0], 1, spec, plan, False, LoweringOptions("neuron-sim", 8, "batch"))
    assert isinstance(batch, PerShard) and batch.split is None and batch.plan.shards("b") == 2
    assert batch.notes[0].startswith("lowered per shard; q dim 2")
    assert choose_strategy(calls[0], 2, spec, plan, False, LoweringOptions("neuron-sim", 8, "batch")) == Keep(
        "version 1 is not 2")


def test_no_mesh_no_plan() -> None:
    """A module partitioned without Shardy (no sdy.mesh): nothing says how operands are sharded."""
    text = re.sub(r" \{sdy\.sharding = #sdy\.sharding<[^>]*>\}", "", _MODULE)
    text = text.replace('sdy.mesh @mesh = <["data"=2, "model"=4]>', "")
    assert "sdy" not in text
    module, calls = _call(text)
    assert plan_shards(module.operation, composites_in(module.operation), calls, "neuron-sim", 8) == [None]


_PREFILL_ATTRS = {"causal": True, "decode": False, "layout": "BTNH", "mask_kind": "lengths",
                  "masked_value": float("-inf"), "num_heads": 4, "num_kv_heads": 2,
                  "operands": ["q", "k", "v", "q_lengths", "kv_lengths"], "q_offset": 24, "scale": 0.3,
                  "softcap": 0.0, "window_left": 20, "window_right": 0, "zero_empty_rows": False}


@pytest.mark.parametrize("split", ["query", "key"])
def test_prefill_ranges_prepared_run_and_merged_are_the_whole(split: str) -> None:
    """prefill_query_split / prefill_key_split on the Pallas tpu-interpret kernel, its P ranges run one by one
    as the shards would: a causal, left-windowed chunk with q and kv lengths (rows past a q length are NaN)."""
    import jax.numpy as jnp
    import numpy as np

    from hlofuse.kernels.pallas import attention as pallas_attention
    from hlofuse.kernels.reference import attention_reference

    b, t, s, n, kv, h, parts = 2, 16, 40, 4, 2, 8, 4 if split == "query" else 5
    call = CompositeCall("hlofuse.attention", 1, _PREFILL_ATTRS,
                         (((b, t, n, h), "f32"), ((b, s, kv, h), "f32"), ((b, s, kv, h), "f32"), ((b,), "i32"),
                          ((b,), "i32")))
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal(shape, np.float32)) for shape in ((b, t, n, h), (b, s, kv, h),
                                                                                  (b, s, kv, h)))
    q_lengths, kv_lengths = jnp.asarray([16, 9], jnp.int32), jnp.asarray([40, 31], jnp.int32)
    make = pallas_attention.query_split if split == "query" else pallas_attention.key_split
    ranges = make(call, "tpu-interpret", parts)
    prepared = ranges.prepare(q, k, v, q_lengths, kv_lengths)
    per_shard = []
    for p in range(parts):  # each shard's slice of every dim labelled "t" or "s"
        args = [x[tuple(slice(p, p + 1) if label in ("t", "s") else slice(None) for label in labels)]
                for x, labels in zip(prepared, ranges.operands, strict=True)]
        per_shard.append(ranges.shard(*args))
    results = [jnp.concatenate([r[i] for r in per_shard], axis=1) for i in range(len(ranges.results))]
    got = np.asarray(ranges.merge(*results))
    want = np.asarray(attention_reference(q, k, v, scale=0.3, causal=True, window_left=20, q_offset=24,
                                          q_lengths=q_lengths, kv_lengths=kv_lengths))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(want[1, 9:]).all()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
