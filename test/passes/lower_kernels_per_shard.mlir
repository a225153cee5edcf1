// hlofuse-lower-kernels in multi-device modules for targets XLA cannot partition (Pallas, NKI): each kernel
// call runs per shard inside a sdy.manual_computation over the mesh, with the mesh axes Shardy's propagation
// gives the dims a shard can cut (attention: batch and heads; sampling: the leading rows). multi_device=local
// lowers only what stays local (python/hlofuse/shard_local.py, docs/sharding.md).
// RUN: hlofuse-opt %s --split-input-file --pass-pipeline='builtin.module(hlofuse-lower-kernels{target=tpu multi_device=batch})' | filecheck %s --check-prefix=TPU
// RUN: hlofuse-opt %s --split-input-file --pass-pipeline='builtin.module(hlofuse-lower-kernels{target=tpu multi_device=batch})' --remarks 2>&1 >/dev/null | filecheck %s --check-prefix=TPU-REMARK
// RUN: hlofuse-opt %s --split-input-file --pass-pipeline='builtin.module(hlofuse-lower-kernels{target=tpu multi_device=local})' --remarks 2>%t.local | filecheck %s --check-prefix=LOCAL
// RUN: filecheck %s --check-prefix=LOCAL-REMARK < %t.local
// RUN: hlofuse-opt %s --split-input-file --pass-pipeline='builtin.module(hlofuse-lower-kernels{target=cpu multi_device=local})' --remarks 2>%t.cpu | filecheck %s --check-prefix=CPU-LOCAL
// RUN: filecheck %s --check-prefix=CPU-LOCAL-REMARK --allow-empty < %t.cpu
// RUN: hlofuse-opt %s --split-input-file --pass-pipeline='builtin.module(hlofuse-lower-kernels{target=neuron-sim multi_device=batch})' --remarks 2>%t.nki | filecheck %s --check-prefix=NKI
// RUN: filecheck %s --check-prefix=NKI-REMARK < %t.nki

// A prefill whose key sequence and bool mask arrive sharded over `seq`: key ranges cannot take a mask (it
// would have to be cut along the keys too), so `batch` gathers the keys and the mask (and says so) while
// `local` keeps the composite for XLA to partition, and says why. The CPU kernel splits no masked prefill.
// TPU-LABEL: module @prefill_masked_sequence_sharded
// TPU: sdy.manual_computation(%arg0, %arg1, %arg2, %arg3)
// TPU-SAME: manual_axes={"data", "seq"}
// TPU-SAME: (%{{.*}}: tensor<2x16x4x16xf32>, %{{.*}}: tensor<2x32x4x16xf32>, %{{.*}}: tensor<2x32x4x16xf32>, %{{.*}}: tensor<2x1x16x32xi1>)
// TPU-REMARK: remark: [hlofuse-lower-kernels] stablehlo.composite: lowered per shard; k dim 1 (over seq), v dim 1 (over seq), mask dim 3 (over seq) arrive sharded over mesh axes the kernel cannot cut and are all-gathered before it
// TPU-REMARK-NOT: [hlofuse-lower-kernels]
// LOCAL-LABEL: module @prefill_masked_sequence_sharded
// LOCAL-REMARK: remark: {{.*}}kept as a composite: k dim 1 (over seq), v dim 1 (over seq), mask dim 3 (over seq) arrive sharded over mesh axes the tpu kernel call cannot cut and would be all-gathered (its key ranges cannot run per shard: a bias or a mask); XLA partitions the composite instead
// LOCAL: stablehlo.composite "hlofuse.attention"
// LOCAL-NOT: sdy.manual_computation
// CPU-LOCAL-LABEL: module @prefill_masked_sequence_sharded
// CPU-LOCAL: stablehlo.composite "hlofuse.attention"
// CPU-LOCAL-REMARK: remark: {{.*}}kept as a composite: k dim 1 (over seq), v dim 1 (over seq), mask dim 3 (over seq) arrive sharded over mesh axes the cpu kernel call cannot cut and would be all-gathered; XLA partitions the composite instead
// Every other CPU call here keeps its sharded dims local: no other remark.
// CPU-LOCAL-REMARK-NOT: remark
// NKI-LABEL: module @prefill_masked_sequence_sharded
// NKI-REMARK: remark: [hlofuse-lower-kernels] stablehlo.composite: lowered per shard; k dim 1 (over seq), v dim 1 (over seq), mask dim 3 (over seq) arrive sharded over mesh axes the kernel cannot cut and are all-gathered before it
module @prefill_masked_sequence_sharded attributes {mhlo.num_partitions = 8 : i32} {
  sdy.mesh @mesh = <["data"=2, "seq"=4]>
  func.func public @main(%q: tensor<4x16x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}, {}, {}]>},
                         %k: tensor<4x32x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {"seq"}, {}, {}]>},
                         %v: tensor<4x32x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {"seq"}, {}, {}]>},
                         %m: tensor<4x1x16x32xi1> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}, {}, {"seq"}]>}) -> tensor<4x16x4x16xf32> {
    %0 = stablehlo.composite "hlofuse.attention" %q, %k, %v, %m {composite_attributes = {causal = false, decode = false, layout = "BTNH", mask_kind = "boolean", masked_value = 0xFFF0000000000000 : f64, num_heads = 4 : i64, num_kv_heads = 4 : i64, operands = ["q", "k", "v", "mask"], q_offset = 0 : i64, scale = 2.500000e-01 : f64, softcap = 0.000000e+00 : f64, window_left = -1 : i64, window_right = -1 : i64, zero_empty_rows = false}, decomposition = @impl, version = 1 : i32} : (tensor<4x16x4x16xf32>, tensor<4x32x4x16xf32>, tensor<4x32x4x16xf32>, tensor<4x1x16x32xi1>) -> tensor<4x16x4x16xf32>
    return %0 : tensor<4x16x4x16xf32>
  }
  func.func private @impl(%q: tensor<4x16x4x16xf32>, %k: tensor<4x32x4x16xf32>, %v: tensor<4x32x4x16xf32>, %m: tensor<4x1x16x32xi1>) -> tensor<4x16x4x16xf32> {
    return %q : tensor<4x16x4x16xf32>
  }
}

// -----

// GQA (8 query heads on 4 kv heads), batch over `data` (2), heads over `model` (4): each shard runs the
// TPU kernel on 2 batch rows, 2 query heads and the 1 kv head they read; no dim is gathered.
// TPU-LABEL: module @gqa_batch_and_heads
// TPU-NOT: stablehlo.composite
// TPU: sdy.manual_computation(%arg0, %arg1, %arg2)
// TPU-SAME: in_shardings=[<@mesh, [{"data"}, {}, {"model"}, {}]>, <@mesh, [{"data"}, {}, {"model"}, {}]>, <@mesh, [{"data"}, {}, {"model"}, {}]>]
// TPU-SAME: out_shardings=[<@mesh, [{"data"}, {}, {"model"}, {}]>] manual_axes={"data", "model"}
// TPU-SAME: (%[[Q:.*]]: tensor<2x16x2x16xf32>, %[[K:.*]]: tensor<2x16x1x16xf32>, %[[V:.*]]: tensor<2x16x1x16xf32>)
// TPU: func.call @hlofuse.attention.tpu(%[[Q]], %[[K]], %[[V]]) : (tensor<2x16x2x16xf32>, tensor<2x16x1x16xf32>, tensor<2x16x1x16xf32>) -> tensor<2x16x2x16xf32>
// TPU: sdy.return
// TPU: -> tensor<4x16x8x16xf32>
// TPU: func.func private @hlofuse.attention.tpu(%arg0: tensor<2x16x2x16xf32>
// TPU: stablehlo.custom_call @tpu_custom_call
// LOCAL-LABEL: module @gqa_batch_and_heads
// LOCAL: sdy.manual_computation
// CPU-LOCAL-LABEL: module @gqa_batch_and_heads
// CPU-LOCAL: stablehlo.custom_call @hlofuse_attention
// CPU-LOCAL-SAME: num_batch_dims = "2"
// NKI-LABEL: module @gqa_batch_and_heads
// NKI: sdy.manual_computation
// NKI: func.call @"hlofuse.attention.neuron-sim"({{.*}}) : (tensor<2x16x2x16xf32>, tensor<2x16x1x16xf32>, tensor<2x16x1x16xf32>)
module @gqa_batch_and_heads attributes {mhlo.num_partitions = 8 : i32} {
  sdy.mesh @mesh = <["data"=2, "model"=4]>
  func.func public @main(%q: tensor<4x16x8x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}, {"model"}, {}]>},
                         %k: tensor<4x16x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}, {"model"}, {}]>},
                         %v: tensor<4x16x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}, {"model"}, {}]>}) -> tensor<4x16x8x16xf32> {
    %0 = stablehlo.composite "hlofuse.attention" %q, %k, %v {composite_attributes = {causal = true, decode = false, layout = "BTNH", mask_kind = "none", masked_value = 0xFFF0000000000000 : f64, num_heads = 8 : i64, num_kv_heads = 4 : i64, operands = ["q", "k", "v"], q_offset = 0 : i64, scale = 2.500000e-01 : f64, softcap = 0.000000e+00 : f64, window_left = -1 : i64, window_right = -1 : i64, zero_empty_rows = false}, decomposition = @impl, version = 1 : i32} : (tensor<4x16x8x16xf32>, tensor<4x16x4x16xf32>, tensor<4x16x4x16xf32>) -> tensor<4x16x8x16xf32>
    return %0 : tensor<4x16x8x16xf32>
  }
  func.func private @impl(%q: tensor<4x16x8x16xf32>, %k: tensor<4x16x4x16xf32>, %v: tensor<4x16x4x16xf32>) -> tensor<4x16x8x16xf32> {
    return %q : tensor<4x16x8x16xf32>
  }
}

// -----

// The key sequence arrives sharded over `seq`: each shard runs the kernel on one key range (hlofuse.shard_local
// prefill_key_split): `prepare` cuts K, V into (B, P, S/P, K, H) and gives each range its key lengths and its
// q_offset (0 - range start, per batch row), and `merge` combines the ranges by their log-sum-exp. Nothing is
// gathered, under `batch` and under `local` alike.
// TPU-LABEL: module @prefill_sequence_sharded
// TPU: %[[PREP:.*]]:5 = call @hlofuse.attention.tpu.prepare(%arg0, %arg1, %arg2)
// TPU: sdy.manual_computation(%[[PREP]]#0, %[[PREP]]#1, %[[PREP]]#2, %[[PREP]]#3, %[[PREP]]#4)
// TPU-SAME: in_shardings=[<@mesh, [{"data"}, {}, {}, {}]>, <@mesh, [{"data"}, {"seq"}, {}, {}, {}]>, <@mesh, [{"data"}, {"seq"}, {}, {}, {}]>, <@mesh, [{"data"}, {"seq"}]>, <@mesh, [{"data"}, {"seq"}]>]
// TPU-SAME: manual_axes={"data", "seq"}
// TPU: func.call @hlofuse.attention.tpu({{.*}}) : (tensor<2x16x4x16xf32>, tensor<2x1x8x4x16xf32>, tensor<2x1x8x4x16xf32>, tensor<2x1xi32>, tensor<2x1xi32>) -> (tensor<2x1x16x4x16xf32>, tensor<2x1x16x4xf32>)
// TPU: call @hlofuse.attention.tpu.merge({{.*}}) : (tensor<4x4x16x4x16xf32>, tensor<4x4x16x4xf32>) -> tensor<4x16x4x16xf32>
// TPU-LABEL: func.func private @hlofuse.attention.tpu(
// TPU: stablehlo.custom_call @tpu_custom_call(
// LOCAL-LABEL: module @prefill_sequence_sharded
// LOCAL: call @hlofuse.attention.tpu.prepare
// LOCAL: sdy.manual_computation
// LOCAL-NOT: stablehlo.composite
// The CPU kernel cuts the key sequence into 8 ranges (a leading batch dim) and combines their partial results.
module @prefill_sequence_sharded attributes {mhlo.num_partitions = 8 : i32} {
  sdy.mesh @mesh = <["data"=2, "seq"=4]>
  func.func public @main(%q: tensor<4x16x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}, {}, {}]>},
                         %k: tensor<4x32x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {"seq"}, {}, {}]>},
                         %v: tensor<4x32x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {"seq"}, {}, {}]>}) -> tensor<4x16x4x16xf32> {
    %0 = stablehlo.composite "hlofuse.attention" %q, %k, %v {composite_attributes = {causal = false, decode = false, layout = "BTNH", mask_kind = "none", masked_value = 0xFFF0000000000000 : f64, num_heads = 4 : i64, num_kv_heads = 4 : i64, operands = ["q", "k", "v"], q_offset = 0 : i64, scale = 2.500000e-01 : f64, softcap = 0.000000e+00 : f64, window_left = -1 : i64, window_right = -1 : i64, zero_empty_rows = false}, decomposition = @impl, version = 1 : i32} : (tensor<4x16x4x16xf32>, tensor<4x32x4x16xf32>, tensor<4x32x4x16xf32>) -> tensor<4x16x4x16xf32>
    return %0 : tensor<4x16x4x16xf32>
  }
  func.func private @impl(%q: tensor<4x16x4x16xf32>, %k: tensor<4x32x4x16xf32>, %v: tensor<4x32x4x16xf32>) -> tensor<4x16x4x16xf32> {
    return %q : tensor<4x16x4x16xf32>
  }
}

// -----

// Top-k sampling of (8, 2, V) logits with the first row dim over `data` (8): the noise is drawn at global
// counters, so the call gets each shard's first global row (iota * 2 rows per slice), cut like the rows
// (hlofuse.shard_local.sampled_rows).
// TPU-LABEL: module @sampling_rows_sharded
// TPU: %[[PREP:.*]]:3 = call @hlofuse.sample.tpu.prepare(%arg0, %arg1) : (tensor<8x2x1024xf32>, tensor<2xui32>) -> (tensor<8x2x1024xf32>, tensor<2xui32>, tensor<8xi32>)
// TPU: sdy.manual_computation(%[[PREP]]#0, %[[PREP]]#1, %[[PREP]]#2)
// TPU-SAME: in_shardings=[<@mesh, [{"data"}, {}, {}]>, <@mesh, [{}]>, <@mesh, [{"data"}]>]
// TPU-SAME: out_shardings=[<@mesh, [{"data"}, {}]>] manual_axes={"data"}
// TPU-SAME: (%[[X:.*]]: tensor<1x2x1024xf32>, %[[KEY:.*]]: tensor<2xui32>, %[[ROW:.*]]: tensor<1xi32>)
// TPU: func.call @hlofuse.sample.tpu(%[[X]], %[[KEY]], %[[ROW]])
// TPU: func.func private @hlofuse.sample.tpu.prepare
// TPU: %[[IOTA:.*]] = stablehlo.iota dim = 0 : tensor<8xi32>
// TPU: stablehlo.constant dense<2> : tensor<i32>
// TPU: %[[STEP:.*]] = stablehlo.broadcast_in_dim {{.*}} -> tensor<8xi32>
// TPU: stablehlo.multiply %[[IOTA]], %[[STEP]] : tensor<8xi32>
// TPU: func.func private @hlofuse.sample.tpu(%arg0: tensor<1x2x1024xf32>, %arg1: tensor<2xui32>, %arg2: tensor<1xi32>)
// TPU: stablehlo.concatenate {{.*}} -> tensor<4xi32>
// TPU: stablehlo.custom_call @tpu_custom_call
// LOCAL-LABEL: module @sampling_rows_sharded
// LOCAL: sdy.manual_computation
// CPU-LOCAL-LABEL: module @sampling_rows_sharded
// CPU-LOCAL: stablehlo.custom_call @hlofuse_sample_top_k
// The NKI sampler draws each shard's rows of the whole batch's noise too (noise.gumbel_at_rows).
// NKI-LABEL: module @sampling_rows_sharded
// NKI: sdy.manual_computation
// NKI-SAME: in_shardings=[<@mesh, [{"data"}, {}, {}]>, <@mesh, [{}]>, <@mesh, [{"data"}]>]
// NKI: func.call @"hlofuse.sample.neuron-sim"({{.*}}) : (tensor<1x2x1024xf32>, tensor<2xui32>, tensor<1xi32>) -> tensor<1x2xi32>
module @sampling_rows_sharded attributes {mhlo.num_partitions = 8 : i32} {
  sdy.mesh @mesh = <["data"=8]>
  func.func public @main(%x: tensor<8x2x1024xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}, {}]>},
                         %key: tensor<2xui32> {sdy.sharding = #sdy.sharding<@mesh, [{}]>}) -> tensor<8x2xi32> {
    %0 = stablehlo.composite "hlofuse.sample" %x, %key {composite_attributes = {form = "top_k", k = 8 : i64, min_p = 0.000000e+00 : f64, mode = "top_k", p = 1.000000e+00 : f64, temperature = 0.69999999999999996 : f64}, decomposition = @impl, version = 1 : i32} : (tensor<8x2x1024xf32>, tensor<2xui32>) -> tensor<8x2xi32>
    return %0 : tensor<8x2xi32>
  }
  func.func private @impl(%x: tensor<8x2x1024xf32>, %key: tensor<2xui32>) -> tensor<8x2xi32> {
    %0 = stablehlo.constant dense<0> : tensor<8x2xi32>
    return %0 : tensor<8x2xi32>
  }
}

// -----

// Temperature sampling of (4, 1024) logits, rows over `data` (2) and the vocabulary over `model` (4): each
// shard samples its 256 tokens of its 2 rows with the whole row's noise (its first row and first token come
// from iotas cut like the rows and the vocabulary ranges) and returns each row's winner with its score; the
// merge picks the best (score, id) over the 4 ranges (hlofuse.shard_local.vocab_split).
// TPU-LABEL: module @sampling_vocab_sharded
// TPU: %[[PREP:.*]]:4 = call @hlofuse.sample.tpu.prepare(%arg0, %arg1) : (tensor<4x1024xf32>, tensor<2xui32>) -> (tensor<4x4x256xf32>, tensor<4xi32>, tensor<4xi32>, tensor<2xui32>)
// TPU: sdy.manual_computation(%[[PREP]]#0, %[[PREP]]#1, %[[PREP]]#2, %[[PREP]]#3)
// TPU-SAME: in_shardings=[<@mesh, [{"data"}, {"model"}, {}]>, <@mesh, [{"data"}]>, <@mesh, [{"model"}]>, <@mesh, [{}]>]
// TPU-SAME: out_shardings=[<@mesh, [{"data"}, {"model"}]>, <@mesh, [{"data"}, {"model"}]>] manual_axes={"data", "model"}
// TPU: func.call @hlofuse.sample.tpu({{.*}}) : (tensor<2x1x256xf32>, tensor<2xi32>, tensor<1xi32>, tensor<2xui32>) -> (tensor<2x1xi32>, tensor<2x1xf32>)
// TPU: call @hlofuse.sample.tpu.merge({{.*}}) : (tensor<4x4xi32>, tensor<4x4xf32>) -> tensor<4xi32>
// TPU: func.func private @hlofuse.sample.tpu.prepare
// TPU: stablehlo.iota dim = 0 : tensor<4xi32>
// TPU: func.func private @hlofuse.sample.tpu(
// TPU: stablehlo.custom_call @tpu_custom_call
// TPU-SAME: -> (tensor<8x128xi32>, tensor<8x128xf32>)
// LOCAL-LABEL: module @sampling_vocab_sharded
// LOCAL: sdy.manual_computation
// LOCAL-NOT: stablehlo.composite
// CPU-LOCAL-LABEL: module @sampling_vocab_sharded
// CPU-LOCAL: stablehlo.custom_call @hlofuse_sample
// CPU-LOCAL-SAME: vocab_total = 1024
// The NKI sampler takes no vocabulary range: under multi_device=batch its shards gather the vocabulary.
// NKI-LABEL: module @sampling_vocab_sharded
// NKI-REMARK: remark: [hlofuse-lower-kernels] stablehlo.composite: lowered per shard; logits dim 1 (over model) arrive sharded over mesh axes the kernel cannot cut and are all-gathered before it
// NKI: sdy.manual_computation
// NKI-SAME: in_shardings=[<@mesh, [{"data"}, {}]>, <@mesh, [{}]>, <@mesh, [{"data"}]>]
// NKI: func.call @"hlofuse.sample.neuron-sim"({{.*}}) : (tensor<2x1024xf32>, tensor<2xui32>, tensor<2xi32>) -> tensor<2xi32>
module @sampling_vocab_sharded attributes {mhlo.num_partitions = 8 : i32} {
  sdy.mesh @mesh = <["data"=2, "model"=4]>
  func.func public @main(%x: tensor<4x1024xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {"model"}]>},
                         %key: tensor<2xui32> {sdy.sharding = #sdy.sharding<@mesh, [{}]>}) -> tensor<4xi32> {
    %0 = stablehlo.composite "hlofuse.sample" %x, %key {composite_attributes = {form = "temperature", k = 0 : i64, min_p = 0.000000e+00 : f64, mode = "temperature", p = 1.000000e+00 : f64, temperature = 0.69999999999999996 : f64}, decomposition = @impl, version = 1 : i32} : (tensor<4x1024xf32>, tensor<2xui32>) -> tensor<4xi32>
    return %0 : tensor<4xi32>
  }
  func.func private @impl(%x: tensor<4x1024xf32>, %key: tensor<2xui32>) -> tensor<4xi32> {
    %0 = stablehlo.constant dense<0> : tensor<4xi32>
    return %0 : tensor<4xi32>
  }
}

// -----

// MaxText's top-k mask (k = 8) over the same sharding: a first manual computation takes each range's top 8
// (XLA's top-k on the shard's 256 tokens, packed as (value, id bits)), `between` finds each row's 8th largest
// among the 4 x 8 candidates and masks the logits below it, a second samples the masked ranges as temperature
// (hlofuse.vocab_splits).
// TPU-LABEL: module @sampling_top_k_mask_vocab_sharded
// TPU: %[[PREP:.*]]:4 = call @hlofuse.sample.tpu.prepare(%arg0, %arg1)
// TPU: %[[FIRST:.*]] = sdy.manual_computation(%[[PREP]]#0, %[[PREP]]#1, %[[PREP]]#2, %[[PREP]]#3)
// TPU-SAME: out_shardings=[<@mesh, [{"data"}, {"model"}, {}, {}]>]
// TPU: func.call @hlofuse.sample.tpu.first({{.*}}) : (tensor<2x1x256xf32>, tensor<2xi32>, tensor<1xi32>, tensor<2xui32>) -> tensor<2x1x8x2xf32>
// TPU: %[[MASKED:.*]]:4 = call @hlofuse.sample.tpu.between(%[[PREP]]#0, %[[PREP]]#1, %[[PREP]]#2, %[[PREP]]#3, %[[FIRST]])
// TPU: sdy.manual_computation(%[[MASKED]]#0, %[[MASKED]]#1, %[[MASKED]]#2, %[[MASKED]]#3)
// TPU: func.call @hlofuse.sample.tpu({{.*}}) : (tensor<2x1x256xf32>, tensor<2xi32>, tensor<1xi32>, tensor<2xui32>) -> (tensor<2x1xi32>, tensor<2x1xf32>)
// TPU: call @hlofuse.sample.tpu.merge({{.*}}) : (tensor<4x4xi32>, tensor<4x4xf32>) -> tensor<4xi32>
// TPU: func.func private @hlofuse.sample.tpu.first
// TPU: chlo.top_k({{.*}}, k = 8) : tensor<2x256xf32>
// TPU: func.func private @hlofuse.sample.tpu.between
// TPU: chlo.top_k({{.*}}, k = 8) : tensor<4x32xf32>
// LOCAL-LABEL: module @sampling_top_k_mask_vocab_sharded
// LOCAL: sdy.manual_computation
// LOCAL-NOT: stablehlo.composite
// CPU-LOCAL-LABEL: module @sampling_top_k_mask_vocab_sharded
// CPU-LOCAL: stablehlo.custom_call @hlofuse_sample_top_k
// NKI-LABEL: module @sampling_top_k_mask_vocab_sharded
// NKI: sdy.manual_computation
module @sampling_top_k_mask_vocab_sharded attributes {mhlo.num_partitions = 8 : i32} {
  sdy.mesh @mesh = <["data"=2, "model"=4]>
  func.func public @main(%x: tensor<4x1024xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {"model"}]>},
                         %key: tensor<2xui32> {sdy.sharding = #sdy.sharding<@mesh, [{}]>}) -> tensor<4xi32> {
    %0 = stablehlo.composite "hlofuse.sample" %x, %key {composite_attributes = {form = "top_k_mask", k = 8 : i64, min_p = 0.000000e+00 : f64, mode = "top_k", p = 1.000000e+00 : f64, temperature = 0.69999999999999996 : f64}, decomposition = @impl, version = 1 : i32} : (tensor<4x1024xf32>, tensor<2xui32>) -> tensor<4xi32>
    return %0 : tensor<4xi32>
  }
  func.func private @impl(%x: tensor<4x1024xf32>, %key: tensor<2xui32>) -> tensor<4xi32> {
    %0 = stablehlo.constant dense<0> : tensor<4xi32>
    return %0 : tensor<4xi32>
  }
}

// -----

// A causal prefill with its queries sharded over `seq` and K, V whole (context parallelism after the K/V
// all-gather): each shard runs the kernel on its 8 query rows with K and V whole and its own q_offset,
// 0 + p * 8 per batch row (hlofuse.shard_local.prefill_query_split); the merge is a reshape. No collective.
// TPU-LABEL: module @prefill_queries_sharded
// TPU: %[[PREP:.*]]:4 = call @hlofuse.attention.tpu.prepare(%arg0, %arg1, %arg2) : {{.*}} -> (tensor<2x8x8x4x16xf32>, tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32>, tensor<2x8xi32>)
// TPU: sdy.manual_computation(%[[PREP]]#0, %[[PREP]]#1, %[[PREP]]#2, %[[PREP]]#3)
// TPU-SAME: in_shardings=[<@mesh, [{}, {"seq"}, {}, {}, {}]>, <@mesh, [{}, {}, {}, {}]>, <@mesh, [{}, {}, {}, {}]>, <@mesh, [{}, {"seq"}]>]
// TPU-SAME: out_shardings=[<@mesh, [{}, {"seq"}, {}, {}, {}]>] manual_axes={"seq"}
// TPU: func.call @hlofuse.attention.tpu({{.*}}) : (tensor<2x1x8x4x16xf32>, tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32>, tensor<2x1xi32>) -> tensor<2x1x8x4x16xf32>
// TPU: call @hlofuse.attention.tpu.merge({{.*}}) : (tensor<2x8x8x4x16xf32>) -> tensor<2x64x4x16xf32>
// LOCAL-LABEL: module @prefill_queries_sharded
// LOCAL: sdy.manual_computation
// LOCAL-NOT: stablehlo.composite
// CPU-LOCAL-LABEL: module @prefill_queries_sharded
// CPU-LOCAL: stablehlo.custom_call @hlofuse_attention
// CPU-LOCAL-SAME: has_q_offsets = true
// The NKI kernel takes q_offset as a constant only: its call gathers the queries.
// NKI-LABEL: module @prefill_queries_sharded
// NKI-REMARK: remark: [hlofuse-lower-kernels] stablehlo.composite: lowered per shard; q dim 1 (over seq) arrive sharded over mesh axes the kernel cannot cut and are all-gathered before it
module @prefill_queries_sharded attributes {mhlo.num_partitions = 8 : i32} {
  sdy.mesh @mesh = <["seq"=8]>
  func.func public @main(%q: tensor<2x64x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"seq"}, {}, {}]>},
                         %k: tensor<2x64x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}, {}, {}]>},
                         %v: tensor<2x64x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}, {}, {}]>}) -> (tensor<2x64x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"seq"}, {}, {}]>}) {
    %0 = stablehlo.composite "hlofuse.attention" %q, %k, %v {composite_attributes = {causal = true, decode = false, layout = "BTNH", mask_kind = "none", masked_value = 0xFFF0000000000000 : f64, num_heads = 4 : i64, num_kv_heads = 4 : i64, operands = ["q", "k", "v"], q_offset = 0 : i64, scale = 2.500000e-01 : f64, softcap = 0.000000e+00 : f64, window_left = -1 : i64, window_right = 0 : i64, zero_empty_rows = false}, decomposition = @impl, version = 1 : i32} : (tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32>) -> tensor<2x64x4x16xf32>
    return %0 : tensor<2x64x4x16xf32>
  }
  func.func private @impl(%q: tensor<2x64x4x16xf32>, %k: tensor<2x64x4x16xf32>, %v: tensor<2x64x4x16xf32>) -> tensor<2x64x4x16xf32> {
    return %q : tensor<2x64x4x16xf32>
  }
}
