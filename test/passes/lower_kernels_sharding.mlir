// hlofuse-lower-kernels in modules compiled for several devices (docs/sharding.md): the calls hlofuse emits
// carry Shardy rules; the CPU kernels take kv heads (and, for decode and prefill chunks, key-range splits; under
// multi_device=sequence every prefill's query and key-range splits) or vocabulary splits as leading batch dims;
// the default (multi_device=local) lowers the calls whose sharded operand dims stay local (splitting a prefill's
// sequences where they arrive sharded) and keeps the others; multi_device=keep leaves every composite to XLA's
// partitioner; one-device modules are lowered exactly as before.
// RUN: hlofuse-opt %s --split-input-file --pass-pipeline='builtin.module(hlofuse-lower-kernels{target=cpu multi_device=batch})' | filecheck %s --check-prefix=CPU
// RUN: hlofuse-opt %s --split-input-file --pass-pipeline='builtin.module(hlofuse-lower-kernels{target=cpu multi_device=sequence})' | filecheck %s --check-prefix=SEQ
// RUN: hlofuse-opt %s --split-input-file --pass-pipeline='builtin.module(hlofuse-lower-kernels{target=cpu multi_device=keep})' --remarks 2>&1 | filecheck %s --check-prefix=KEEP
// RUN: hlofuse-opt %s --split-input-file --pass-pipeline='builtin.module(hlofuse-lower-kernels{target=cpu})' --remarks 2>%t.remarks | filecheck %s --check-prefix=DEFAULT
// RUN: filecheck %s --check-prefix=DEFAULT-REMARK < %t.remarks
// RUN: hlofuse-opt %s --split-input-file --pass-pipeline='builtin.module(hlofuse-lower-kernels{target=cpu multi_device=batch})' --remarks 2>&1 | filecheck %s --check-prefix=REMARK
// RUN: hlofuse-opt %s --split-input-file --pass-pipeline='builtin.module(hlofuse-lower-kernels{target=tpu multi_device=batch})' | filecheck %s --check-prefix=TPU
// RUN: hlofuse-opt %s --split-input-file --pass-pipeline='builtin.module(hlofuse-lower-kernels{target=gpu multi_device=batch})' | filecheck %s --check-prefix=GPU
// REQUIRES: cpu-kernels

// Megatron / GQA with kv heads sharded: q (B,T,N,H) = (2,16,8,16) on K = 4 kv heads becomes
// (B, K, T, G, H), k and v (B, K, S, 1, H); B and K are batch dims, so either may be sharded.
// CPU-LABEL: func.func public @heads_sharded
// CPU: call @hlofuse.attention.cpu
// CPU: func.func private @hlofuse.attention.cpu
// CPU: %[[Q:.*]] = stablehlo.transpose {{.*}} -> tensor<2x4x16x2x16xf32>
// CPU: stablehlo.custom_call @hlofuse_attention(%[[Q]],
// CPU-SAME: mhlo.frontend_attributes = {num_batch_dims = "2"}
// CPU-SAME: sdy.sharding_rule = #sdy.op_sharding_rule<([i, j, k, l, n], [i, j, o, m, n], [i, j, o, m, n])->([i, j, k, l, n])
// CPU-SAME: need_replication={k, l, m, n, o}
// CPU-SAME: (tensor<2x4x16x2x16xf32>, tensor<2x4x16x1x16xf32>, tensor<2x4x16x1x16xf32>) -> tensor<2x4x16x2x16xf32>
// CPU: stablehlo.transpose {{.*}} -> tensor<2x16x4x2x16xf32>
// KEEP: remark: [hlofuse-lower-kernels] stablehlo.composite: kept as a composite: the module runs on several devices
// DEFAULT-REMARK: remark: [hlofuse-lower-kernels] stablehlo.composite: kept as a composite: logits dim 1 (over vocab) arrive sharded over mesh axes the cpu kernel call cannot cut and would be all-gathered; XLA partitions the composite instead
// DEFAULT-LABEL: func.func public @heads_sharded
// DEFAULT: stablehlo.custom_call @hlofuse_attention
// DEFAULT-SAME: num_batch_dims = "2"
// KEEP-LABEL: func.func public @heads_sharded
// KEEP: stablehlo.composite "hlofuse.attention"
// TPU-LABEL: func.func private @hlofuse.attention.tpu
// TPU: stablehlo.custom_call @tpu_custom_call(
// TPU-SAME: sdy.sharding_rule = #sdy.op_sharding_rule<([i, j], [i, k, l, m], [i, n, o, p], [i, q, r, s])->([i, t, u, v])
// TPU-NOT: num_batch_dims
// GPU-LABEL: func.func private @hlofuse.attention.gpu
// GPU: stablehlo.custom_call @__gpu$xla.gpu.triton(
// GPU-SAME: sdy.sharding_rule = #sdy.op_sharding_rule<([i, j], [i, k, l, m], [i, n, o, p], [i, q, r, s])->([i, t, u, v])
// GPU-NOT: num_batch_dims
module @heads attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["data"=2, "model"=4]>
  func.func public @heads_sharded(%arg0: tensor<2x16x8x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}, {"model"}, {}]>}, %arg1: tensor<2x16x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}, {"model"}, {}]>}, %arg2: tensor<2x16x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}, {"model"}, {}]>}) -> tensor<2x16x8x16xf32> {
    %0 = stablehlo.composite "hlofuse.attention" %arg0, %arg1, %arg2 {composite_attributes = {causal = true, decode = false, layout = "BTNH", mask_kind = "none", masked_value = 0xFFF0000000000000 : f64, num_heads = 8 : i64, num_kv_heads = 4 : i64, operands = ["q", "k", "v"], q_offset = 0 : i64, scale = 0.25 : f64, softcap = 0.000000e+00 : f64, window_left = -1 : i64, window_right = 0 : i64, zero_empty_rows = false}, decomposition = @impl, version = 1 : i32} : (tensor<2x16x8x16xf32>, tensor<2x16x4x16xf32>, tensor<2x16x4x16xf32>) -> tensor<2x16x8x16xf32>
    return %0 : tensor<2x16x8x16xf32>
  }
  func.func private @impl(%arg0: tensor<2x16x8x16xf32>, %arg1: tensor<2x16x4x16xf32>, %arg2: tensor<2x16x4x16xf32>) -> tensor<2x16x8x16xf32> {
    return %arg0 : tensor<2x16x8x16xf32>
  }
}

// -----

// Decode against a KV cache sharded along S over 8 devices: the key range splits into P = 8 leading
// batch dims, the call also returns each split's log-sum-exp, and the splits combine through a max, a dot
// and a sum over P (the reductions the partitioner turns into all-reduces). No lengths and no band: every
// split sees all its keys, so the call takes no lengths or offsets.
// CPU-LABEL: func.func public @decode_kv_sequence_sharded
// CPU: func.func private @hlofuse.attention.cpu
// CPU: %[[OUT:.*]]:2 = stablehlo.custom_call @hlofuse_attention(
// CPU-SAME: has_kv_lengths = false
// CPU-SAME: has_q_offsets = false
// CPU-SAME: mhlo.frontend_attributes = {num_batch_dims = "3"}
// CPU-SAME: sdy.sharding_rule = #sdy.op_sharding_rule<([i, j, k, l, m, n], [i, j, k, o, m, n], [i, j, k, o, m, n])->([i, j, k, l, m, n], [i, j, k, l, m])
// CPU-SAME: -> (tensor<2x4x8x1x1x16xf32>, tensor<2x4x8x1x1xf32>)
// CPU: stablehlo.reduce({{.*}} applies stablehlo.maximum across dimensions = [2]
// CPU: stablehlo.dot_general {{.*}} contracting_dims = [2] x [2]
// CPU: stablehlo.reduce({{.*}} applies stablehlo.add across dimensions = [2]
// KEEP-LABEL: func.func public @decode_kv_sequence_sharded
// DEFAULT-LABEL: func.func public @decode_kv_sequence_sharded
// DEFAULT: call @hlofuse.attention.cpu
// KEEP: stablehlo.composite "hlofuse.attention"
// The Pallas kernels run per shard on one key range each (hlofuse.shard_local): `prepare` cuts K, V into
// (B, P, S/P, K, H) and gives each range its key lengths, each of the 8 shards runs the kernel on its range
// and returns its partial output and log-sum-exp, and `merge` combines the 8 ranges.
// TPU-LABEL: func.func public @decode_kv_sequence_sharded
// TPU: %[[PREP:.*]]:4 = call @hlofuse.attention.tpu.prepare(%arg0, %arg1, %arg2) : {{.*}} -> (tensor<2x1x4x16xf32>, tensor<2x8x32x4x16xf32>, tensor<2x8x32x4x16xf32>, tensor<2x8xi32>)
// TPU: %[[PART:.*]]:2 = sdy.manual_computation(%[[PREP]]#0, %[[PREP]]#1, %[[PREP]]#2, %[[PREP]]#3)
// TPU-SAME: in_shardings=[<@mesh, [{}, {}, {}, {}]>, <@mesh, [{}, {"seq"}, {}, {}, {}]>, <@mesh, [{}, {"seq"}, {}, {}, {}]>, <@mesh, [{}, {"seq"}]>]
// TPU-SAME: out_shardings=[<@mesh, [{}, {"seq"}, {}, {}, {}]>, <@mesh, [{}, {"seq"}, {}, {}]>] manual_axes={"seq"}
// TPU: func.call @hlofuse.attention.tpu({{.*}}) : (tensor<2x1x4x16xf32>, tensor<2x1x32x4x16xf32>, tensor<2x1x32x4x16xf32>, tensor<2x1xi32>) -> (tensor<2x1x1x4x16xf32>, tensor<2x1x1x4xf32>)
// TPU: call @hlofuse.attention.tpu.merge(%[[PART]]#0, %[[PART]]#1) : (tensor<2x8x1x4x16xf32>, tensor<2x8x1x4xf32>) -> tensor<2x1x4x16xf32>
// TPU-LABEL: func.func private @hlofuse.attention.tpu(
// TPU: stablehlo.custom_call @tpu_custom_call(
// GPU-LABEL: func.func public @decode_kv_sequence_sharded
// GPU: sdy.manual_computation
// GPU-SAME: manual_axes={"seq"}
// GPU-LABEL: func.func private @hlofuse.attention.gpu(
// GPU: stablehlo.custom_call @__gpu$xla.gpu.triton(
module @decode attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["seq"=8]>
  func.func public @decode_kv_sequence_sharded(%arg0: tensor<2x1x4x16xf32>, %arg1: tensor<2x256x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"seq"}, {}, {}]>}, %arg2: tensor<2x256x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"seq"}, {}, {}]>}) -> tensor<2x1x4x16xf32> {
    %0 = stablehlo.composite "hlofuse.attention" %arg0, %arg1, %arg2 {composite_attributes = {causal = false, decode = true, layout = "BTNH", mask_kind = "none", masked_value = 0xFFF0000000000000 : f64, num_heads = 4 : i64, num_kv_heads = 4 : i64, operands = ["q", "k", "v"], q_offset = 0 : i64, scale = 0.25 : f64, softcap = 0.000000e+00 : f64, window_left = -1 : i64, window_right = -1 : i64, zero_empty_rows = false}, decomposition = @impl, version = 1 : i32} : (tensor<2x1x4x16xf32>, tensor<2x256x4x16xf32>, tensor<2x256x4x16xf32>) -> tensor<2x1x4x16xf32>
    return %0 : tensor<2x1x4x16xf32>
  }
  func.func private @impl(%arg0: tensor<2x1x4x16xf32>, %arg1: tensor<2x256x4x16xf32>, %arg2: tensor<2x256x4x16xf32>) -> tensor<2x1x4x16xf32> {
    return %arg0 : tensor<2x1x4x16xf32>
  }
}

// -----

// A causal prefill chunk (T = 8 queries at the end of a 256-key cache sharded along S): its P = 8 copies of
// the query rows are no larger than the keys (T * N * P <= S * K), so it splits like decode; each split gets
// its causal band through its own q_offset, 248 - p * 32, a constant (B, K, P) operand.
// CPU-LABEL: func.func public @prefill_chunk_kv_sequence_sharded
// CPU: func.func private @hlofuse.attention.cpu
// CPU: %[[OFFSETS:.*]] = stablehlo.constant dense<{{\[\[\[}}248, 216, 184, 152, 120, 88, 56, 24]]]>
// CPU: %[[SPLIT_OFFSETS:.*]] = stablehlo.broadcast_in_dim %[[OFFSETS]], dims = [0, 1, 2] : (tensor<1x1x8xi32>) -> tensor<2x4x8xi32>
// CPU: stablehlo.custom_call @hlofuse_attention({{.*}}, %[[SPLIT_OFFSETS]])
// CPU-SAME: causal = true
// CPU-SAME: has_q_offsets = true
// CPU-SAME: mhlo.frontend_attributes = {num_batch_dims = "3"}
// CPU-SAME: sdy.sharding_rule = #sdy.op_sharding_rule<([i, j, k, l, m, n], [i, j, k, o, m, n], [i, j, k, o, m, n], [i, j, k])->([i, j, k, l, m, n], [i, j, k, l, m])
// CPU-SAME: (tensor<2x4x8x8x1x16xf32>, tensor<2x4x8x32x1x16xf32>, tensor<2x4x8x32x1x16xf32>, tensor<2x4x8xi32>) -> (tensor<2x4x8x8x1x16xf32>, tensor<2x4x8x8x1xf32>)
// KEEP-LABEL: func.func public @prefill_chunk_kv_sequence_sharded
// KEEP: stablehlo.composite "hlofuse.attention"
// The Pallas calls run one key range per shard too, each with its q_offset per batch row (248 - p * 32, from
// `prepare`), merged by log-sum-exp (hlofuse.shard_local.prefill_key_split).
// TPU-LABEL: func.func public @prefill_chunk_kv_sequence_sharded
// TPU: call @hlofuse.attention.tpu.prepare
// TPU: sdy.manual_computation
// TPU-SAME: manual_axes={"seq"}
// TPU: call @hlofuse.attention.tpu.merge
// TPU-LABEL: func.func private @hlofuse.attention.tpu(
// TPU: stablehlo.custom_call @tpu_custom_call(
// GPU-LABEL: func.func public @prefill_chunk_kv_sequence_sharded
// GPU: call @hlofuse.attention.gpu.prepare
// GPU: sdy.manual_computation
// GPU-SAME: manual_axes={"seq"}
// GPU-LABEL: func.func private @hlofuse.attention.gpu(
// GPU: stablehlo.custom_call @__gpu$xla.gpu.triton(
module @chunk attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["seq"=8]>
  func.func public @prefill_chunk_kv_sequence_sharded(%arg0: tensor<2x8x4x16xf32>, %arg1: tensor<2x256x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"seq"}, {}, {}]>}, %arg2: tensor<2x256x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"seq"}, {}, {}]>}) -> tensor<2x8x4x16xf32> {
    %0 = stablehlo.composite "hlofuse.attention" %arg0, %arg1, %arg2 {composite_attributes = {causal = true, decode = false, layout = "BTNH", mask_kind = "none", masked_value = 0xFFF0000000000000 : f64, num_heads = 4 : i64, num_kv_heads = 4 : i64, operands = ["q", "k", "v"], q_offset = 248 : i64, scale = 0.25 : f64, softcap = 0.000000e+00 : f64, window_left = -1 : i64, window_right = 0 : i64, zero_empty_rows = false}, decomposition = @impl, version = 1 : i32} : (tensor<2x8x4x16xf32>, tensor<2x256x4x16xf32>, tensor<2x256x4x16xf32>) -> tensor<2x8x4x16xf32>
    return %0 : tensor<2x8x4x16xf32>
  }
  func.func private @impl(%arg0: tensor<2x8x4x16xf32>, %arg1: tensor<2x256x4x16xf32>, %arg2: tensor<2x256x4x16xf32>) -> tensor<2x8x4x16xf32> {
    return %arg0 : tensor<2x8x4x16xf32>
  }
}

// -----

// A full causal prefill (T = S = 64) with q, k and v sharded along the sequence. Under multi_device=batch it
// is not split (P copies of q or of K/V where the sequence is not sharded cost more than they save): the call
// keeps (B, K) leading and its sequence dims are gathered. Under multi_device=sequence the query range splits
// into Pt = 8 and the key range into Ps = 8, leading as (B, K, Pt, Ps), each (query split, key split) pair with
// its q_offset, 8 * (a - b) for query split a and key split b.
// CPU-LABEL: func.func public @prefill_sequence_sharded
// CPU: stablehlo.custom_call @hlofuse_attention(
// CPU-SAME: has_q_offsets = false
// CPU-SAME: mhlo.frontend_attributes = {num_batch_dims = "2"}
// CPU-SAME: (tensor<2x4x64x1x16xf32>, tensor<2x4x64x1x16xf32>, tensor<2x4x64x1x16xf32>) -> tensor<2x4x64x1x16xf32>
// REMARK: remark: [hlofuse-lower-kernels] stablehlo.composite: prefill not split along its sequences (8 copies of its 256 query rows would outweigh its 256 keys; multi_device=sequence splits it): a T or S sharded over devices is gathered before the call
// SEQ-LABEL: func.func public @prefill_sequence_sharded
// SEQ: func.func private @hlofuse.attention.cpu
// SEQ: %[[OFFSETS:.*]] = stablehlo.constant dense<{{\[\[\[\[}}0, -8, -16, -24, -32, -40, -48, -56], [8, 0, -8,
// SEQ: %[[SPLIT_OFFSETS:.*]] = stablehlo.broadcast_in_dim %[[OFFSETS]], {{.*}} -> tensor<2x4x8x8xi32>
// SEQ: stablehlo.custom_call @hlofuse_attention({{.*}}, %[[SPLIT_OFFSETS]])
// SEQ-SAME: has_q_offsets = true
// SEQ-SAME: mhlo.frontend_attributes = {num_batch_dims = "4"}
// SEQ-SAME: sdy.sharding_rule = #sdy.op_sharding_rule<([i, j, k, l, m, n, o], [i, j, k, l, p, n, o], [i, j, k, l, p, n, o], [i, j, k, l])->([i, j, k, l, m, n, o], [i, j, k, l, m, n])
// SEQ-SAME: (tensor<2x4x8x8x8x1x16xf32>, tensor<2x4x8x8x8x1x16xf32>, tensor<2x4x8x8x8x1x16xf32>, tensor<2x4x8x8xi32>)
// SEQ: stablehlo.dot_general {{.*}} contracting_dims = [3] x [3]
// Under batch the Pallas calls take the key sequence as one range per shard (with their q_offsets, 0 - p * 8)
// and the queries whole: a shard cuts no query sequence, so q is gathered at the manual computation.
// TPU-LABEL: func.func public @prefill_sequence_sharded
// TPU: call @hlofuse.attention.tpu.prepare
// TPU: sdy.manual_computation
// TPU-SAME: in_shardings=[<@mesh, [{}, {}, {}, {}]>, <@mesh, [{}, {"seq"}, {}, {}, {}]>, <@mesh, [{}, {"seq"}, {}, {}, {}]>, <@mesh, [{}, {"seq"}]>, <@mesh, [{}, {"seq"}]>]
// TPU-SAME: manual_axes={"seq"}
// TPU-LABEL: func.func private @hlofuse.attention.tpu(
// TPU: stablehlo.custom_call @tpu_custom_call(
// GPU-LABEL: func.func public @prefill_sequence_sharded
// GPU: sdy.manual_computation
// GPU-LABEL: func.func private @hlofuse.attention.gpu(
// GPU: stablehlo.custom_call @__gpu$xla.gpu.triton(
module @sequence attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["seq"=8]>
  func.func public @prefill_sequence_sharded(%arg0: tensor<2x64x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"seq"}, {}, {}]>}, %arg1: tensor<2x64x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"seq"}, {}, {}]>}, %arg2: tensor<2x64x4x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"seq"}, {}, {}]>}) -> tensor<2x64x4x16xf32> {
    %0 = stablehlo.composite "hlofuse.attention" %arg0, %arg1, %arg2 {composite_attributes = {causal = true, decode = false, layout = "BTNH", mask_kind = "none", masked_value = 0xFFF0000000000000 : f64, num_heads = 4 : i64, num_kv_heads = 4 : i64, operands = ["q", "k", "v"], q_offset = 0 : i64, scale = 0.25 : f64, softcap = 0.000000e+00 : f64, window_left = -1 : i64, window_right = 0 : i64, zero_empty_rows = false}, decomposition = @impl, version = 1 : i32} : (tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32>, tensor<2x64x4x16xf32>) -> tensor<2x64x4x16xf32>
    return %0 : tensor<2x64x4x16xf32>
  }
  func.func private @impl(%arg0: tensor<2x64x4x16xf32>, %arg1: tensor<2x64x4x16xf32>, %arg2: tensor<2x64x4x16xf32>) -> tensor<2x64x4x16xf32> {
    return %arg0 : tensor<2x64x4x16xf32>
  }
}

// -----

// One device: the kernel takes the canonical rank-4 operands, with no transposes, rule or batch dims.
// CPU-LABEL: func.func public @no_match_one_device
// CPU: func.func private @hlofuse.attention.cpu
// CPU-NOT: stablehlo.transpose
// CPU: stablehlo.custom_call @hlofuse_attention(%arg0, %arg1, %arg2)
// CPU-NOT: num_batch_dims
// CPU-NOT: sdy.sharding_rule
// CPU-SAME: (tensor<2x16x8x16xf32>, tensor<2x16x4x16xf32>, tensor<2x16x4x16xf32>) -> tensor<2x16x8x16xf32>
// KEEP-LABEL: func.func public @no_match_one_device
// KEEP: call @hlofuse.attention.cpu
// TPU-LABEL: func.func private @hlofuse.attention.tpu
// TPU: stablehlo.custom_call @tpu_custom_call(
// TPU-NOT: sdy.sharding_rule
// TPU: return
// GPU-LABEL: func.func private @hlofuse.attention.gpu
// GPU: stablehlo.custom_call @__gpu$xla.gpu.triton(
// GPU-NOT: sdy.sharding_rule
// GPU: return
module @one_device attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @no_match_one_device(%arg0: tensor<2x16x8x16xf32>, %arg1: tensor<2x16x4x16xf32>, %arg2: tensor<2x16x4x16xf32>) -> tensor<2x16x8x16xf32> {
    %0 = stablehlo.composite "hlofuse.attention" %arg0, %arg1, %arg2 {composite_attributes = {causal = true, decode = false, layout = "BTNH", mask_kind = "none", masked_value = 0xFFF0000000000000 : f64, num_heads = 8 : i64, num_kv_heads = 4 : i64, operands = ["q", "k", "v"], q_offset = 0 : i64, scale = 0.25 : f64, softcap = 0.000000e+00 : f64, window_left = -1 : i64, window_right = 0 : i64, zero_empty_rows = false}, decomposition = @impl, version = 1 : i32} : (tensor<2x16x8x16xf32>, tensor<2x16x4x16xf32>, tensor<2x16x4x16xf32>) -> tensor<2x16x8x16xf32>
    return %0 : tensor<2x16x8x16xf32>
  }
  func.func private @impl(%arg0: tensor<2x16x8x16xf32>, %arg1: tensor<2x16x4x16xf32>, %arg2: tensor<2x16x4x16xf32>) -> tensor<2x16x8x16xf32> {
    return %arg0 : tensor<2x16x8x16xf32>
  }
}

// -----

// Sampling with the rows sharded: every operand of the CPU call leads with the rows and the vocabulary
// splits (logits, a key per row, each row's global id and each split's offset, from which the kernel
// counts the noise), so R (i) is a batch dim and each device samples its own rows, all 8 splits of them.
// CPU-LABEL: func.func public @sample_rows_sharded
// CPU: func.func private @hlofuse.sample.cpu
// CPU: stablehlo.custom_call @hlofuse_sample(
// CPU-SAME: mhlo.frontend_attributes = {num_batch_dims = "2"}
// CPU-SAME: sdy.sharding_rule = #sdy.op_sharding_rule<([i, j, k], [i, j, l], [i, j], [i, j])->([i, j], [i, j]) {i=16, j=8, k=128, l=2} need_replication={k, l}>
// CPU-SAME: (tensor<16x8x128xf32>, tensor<16x8x2xui32>, tensor<16x8xi32>, tensor<16x8xi32>) -> (tensor<16x8xi32>, tensor<16x8xf32>)
// KEEP-LABEL: func.func public @sample_rows_sharded
// DEFAULT-LABEL: func.func public @sample_rows_sharded
// DEFAULT: call @hlofuse.sample.cpu
// KEEP: stablehlo.composite "hlofuse.sample"
module @sample_rows attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["data"=8]>
  func.func public @sample_rows_sharded(%arg0: tensor<16x1024xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}, %arg1: tensor<2xui32>) -> tensor<16xi32> {
    %0 = stablehlo.composite "hlofuse.sample" %arg0, %arg1 {composite_attributes = {form = "temperature", k = 0 : i64, min_p = 0.000000e+00 : f64, mode = "temperature", p = 1.000000e+00 : f64, temperature = 0.69999999999999996 : f64}, decomposition = @impl, version = 1 : i32} : (tensor<16x1024xf32>, tensor<2xui32>) -> tensor<16xi32>
    return %0 : tensor<16xi32>
  }
  func.func private @impl(%arg0: tensor<16x1024xf32>, %arg1: tensor<2xui32>) -> tensor<16xi32> {
    %0 = stablehlo.constant dense<0> : tensor<16xi32>
    return %0 : tensor<16xi32>
  }
}

// -----

// Sampling with the vocabulary sharded over 8 devices: the logits (R, V) are reshaped (no data movement)
// into P = 8 vocabulary splits (R, P, V/P), a V sharding arriving as a sharding of P; R and P are batch
// dims. Each split's call takes its offset into the global vocabulary (vocab_total = V), counts its noise
// at row * V + global id, and returns its winner and the winner's score; one reduction over P merges
// them (largest score, smallest id on ties, NaN largest).
// CPU-LABEL: func.func public @sample_vocab_sharded
// CPU: func.func private @hlofuse.sample.cpu
// CPU: %[[X:.*]] = stablehlo.reshape %arg0 : (tensor<4x1024xf32>) -> tensor<4x8x128xf32>
// CPU: %[[OUT:.*]]:2 = stablehlo.custom_call @hlofuse_sample(%[[X]],
// CPU-SAME: vocab_total = 1024
// CPU-SAME: mhlo.frontend_attributes = {num_batch_dims = "2"}
// CPU-SAME: sdy.sharding_rule = #sdy.op_sharding_rule<([i, j, k], [i, j, l], [i, j], [i, j])->([i, j], [i, j]) {i=4, j=8, k=128, l=2} need_replication={k, l}>
// CPU-SAME: (tensor<4x8x128xf32>, tensor<4x8x2xui32>, tensor<4x8xi32>, tensor<4x8xi32>) -> (tensor<4x8xi32>, tensor<4x8xf32>)
// CPU: %[[MERGED:.*]]:2 = stablehlo.reduce(%[[OUT]]#1 init: {{.*}}), (%[[OUT]]#0 init: {{.*}}) across dimensions = [1]
// CPU: return %[[MERGED]]#1 : tensor<4xi32>
// KEEP-LABEL: func.func public @sample_vocab_sharded
// DEFAULT-LABEL: func.func public @sample_vocab_sharded
// DEFAULT: call @hlofuse.sample.cpu
// KEEP: stablehlo.composite "hlofuse.sample"
module @sample_vocab attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["vocab"=8]>
  func.func public @sample_vocab_sharded(%arg0: tensor<4x1024xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"vocab"}]>}, %arg1: tensor<2xui32>) -> tensor<4xi32> {
    %0 = stablehlo.composite "hlofuse.sample" %arg0, %arg1 {composite_attributes = {form = "temperature", k = 0 : i64, min_p = 0.000000e+00 : f64, mode = "temperature", p = 1.000000e+00 : f64, temperature = 0.69999999999999996 : f64}, decomposition = @impl, version = 1 : i32} : (tensor<4x1024xf32>, tensor<2xui32>) -> tensor<4xi32>
    return %0 : tensor<4xi32>
  }
  func.func private @impl(%arg0: tensor<4x1024xf32>, %arg1: tensor<2xui32>) -> tensor<4xi32> {
    %0 = stablehlo.constant dense<0> : tensor<4xi32>
    return %0 : tensor<4xi32>
  }
}

// -----

// Near-miss: top-p needs the row-wide nucleus cutoff before any split, so the call keeps whole rows (R is
// its one batch dim; a sharded vocabulary is gathered before it), with a remark saying so.
// REMARK: remark: [hlofuse-lower-kernels] stablehlo.composite: sampled by whole rows ('top_p_mask' needs a row-wide threshold or rank before any split)
// CPU-LABEL: func.func public @no_split_top_p_vocab_sharded
// CPU: func.func private @hlofuse.sample.cpu
// CPU-NOT: stablehlo.reduce
// CPU: stablehlo.custom_call @hlofuse_sample(
// CPU-NOT: vocab_total = 1024
// CPU-SAME: mhlo.frontend_attributes = {num_batch_dims = "1"}
// CPU-SAME: (tensor<4x1024xf32>, tensor<4x2xui32>, tensor<4xi32>) -> tensor<4xi32>
// KEEP-LABEL: func.func public @no_split_top_p_vocab_sharded
// KEEP: stablehlo.composite "hlofuse.sample"
// DEFAULT-LABEL: func.func public @no_split_top_p_vocab_sharded
// DEFAULT: stablehlo.composite "hlofuse.sample"
module @sample_top_p_vocab attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["vocab"=8]>
  func.func public @no_split_top_p_vocab_sharded(%arg0: tensor<4x1024xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"vocab"}]>}, %arg1: tensor<2xui32>) -> tensor<4xi32> {
    %0 = stablehlo.composite "hlofuse.sample" %arg0, %arg1 {composite_attributes = {form = "top_p_mask", k = 0 : i64, min_p = 0.000000e+00 : f64, mode = "top_p", p = 9.000000e-01 : f64, temperature = 0.69999999999999996 : f64}, decomposition = @impl, version = 1 : i32} : (tensor<4x1024xf32>, tensor<2xui32>) -> tensor<4xi32>
    return %0 : tensor<4xi32>
  }
  func.func private @impl(%arg0: tensor<4x1024xf32>, %arg1: tensor<2xui32>) -> tensor<4xi32> {
    %0 = stablehlo.constant dense<0> : tensor<4xi32>
    return %0 : tensor<4xi32>
  }
}

// -----

// top_k_mask with the vocabulary sharded: each split's top k (hlofuse_sample_top_k, its values and global
// ids), then the top k of the (R, 1, P * k) candidates for the row's k-th value, then x < kth -> -inf and
// temperature sampling per split, merged over P.
// CPU-LABEL: func.func public @sample_top_k_mask_vocab_sharded
// CPU: func.func private @hlofuse.sample.cpu
// CPU: %[[X:.*]] = stablehlo.reshape %arg0 : (tensor<4x1024xf32>) -> tensor<4x8x128xf32>
// CPU: %[[TOP:.*]]:2 = stablehlo.custom_call @hlofuse_sample_top_k(%[[X]],
// CPU-SAME: k = 8 : i64
// CPU-SAME: mhlo.frontend_attributes = {num_batch_dims = "2"}
// CPU-SAME: sdy.sharding_rule = #sdy.op_sharding_rule<([i, j, k], [i, j])->([i, j, l], [i, j, m]) {i=4, j=8, k=128, l=8, m=8} need_replication={k, l, m}>
// CPU: %[[CAND:.*]] = stablehlo.reshape %[[TOP]]#0 : (tensor<4x8x8xf32>) -> tensor<4x1x64xf32>
// CPU: stablehlo.custom_call @hlofuse_sample_top_k(%[[CAND]],
// CPU: %[[LOW:.*]] = stablehlo.compare LT, %[[X]],
// CPU: %[[MASKED:.*]] = stablehlo.select %[[LOW]], {{.*}}, %[[X]]
// CPU: %[[OUT:.*]]:2 = stablehlo.custom_call @hlofuse_sample(%[[MASKED]],
// CPU-SAME: vocab_total = 1024
// CPU: stablehlo.reduce(%[[OUT]]#1 init: {{.*}}), (%[[OUT]]#0 init: {{.*}}) across dimensions = [1]
// KEEP-LABEL: func.func public @sample_top_k_mask_vocab_sharded
// DEFAULT-LABEL: func.func public @sample_top_k_mask_vocab_sharded
// DEFAULT: call @hlofuse.sample.cpu
// KEEP: stablehlo.composite "hlofuse.sample"
module @sample_top_k_mask_vocab attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["vocab"=8]>
  func.func public @sample_top_k_mask_vocab_sharded(%arg0: tensor<4x1024xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"vocab"}]>}, %arg1: tensor<2xui32>) -> tensor<4xi32> {
    %0 = stablehlo.composite "hlofuse.sample" %arg0, %arg1 {composite_attributes = {form = "top_k_mask", k = 8 : i64, min_p = 0.000000e+00 : f64, mode = "top_k", p = 1.000000e+00 : f64, temperature = 0.69999999999999996 : f64}, decomposition = @impl, version = 1 : i32} : (tensor<4x1024xf32>, tensor<2xui32>) -> tensor<4xi32>
    return %0 : tensor<4xi32>
  }
  func.func private @impl(%arg0: tensor<4x1024xf32>, %arg1: tensor<2xui32>) -> tensor<4xi32> {
    %0 = stablehlo.constant dense<0> : tensor<4xi32>
    return %0 : tensor<4xi32>
  }
}

// -----

// min-p with the vocabulary sharded: the mask is the program's own softmax against the row's largest
// probability (three row reductions the partitioner splits with small all-reduces), then the masked,
// scaled logits are sampled per vocabulary split (categorical) and merged.
// CPU-LABEL: func.func public @min_p_vocab_sharded
// CPU: func.func private @hlofuse.sample.cpu
// CPU: %[[Y:.*]] = stablehlo.divide %arg0
// CPU: stablehlo.reduce({{.*}}) applies stablehlo.maximum across dimensions = [1]
// CPU: stablehlo.exponential
// CPU: stablehlo.reduce({{.*}}) applies stablehlo.add across dimensions = [1]
// CPU: stablehlo.reduce({{.*}}) applies stablehlo.maximum across dimensions = [1]
// CPU: %[[KEPT:.*]] = stablehlo.compare GE
// CPU: %[[MASKED:.*]] = stablehlo.select %[[KEPT]], %[[Y]],
// CPU: %[[X:.*]] = stablehlo.reshape %[[MASKED]] : (tensor<4x1024xf32>) -> tensor<4x8x128xf32>
// CPU: stablehlo.custom_call @hlofuse_sample(%[[X]],
// CPU-SAME: form = 1 : i64
// CPU-SAME: vocab_total = 1024
// CPU-SAME: mhlo.frontend_attributes = {num_batch_dims = "2"}
// CPU: stablehlo.reduce({{.*}}) across dimensions = [1]
// KEEP-LABEL: func.func public @min_p_vocab_sharded
// DEFAULT-LABEL: func.func public @min_p_vocab_sharded
// DEFAULT: call @hlofuse.sample.cpu
// KEEP: stablehlo.composite "hlofuse.sample"
module @sample_min_p_vocab attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["vocab"=8]>
  func.func public @min_p_vocab_sharded(%arg0: tensor<4x1024xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"vocab"}]>}, %arg1: tensor<2xui32>) -> tensor<4xi32> {
    %0 = stablehlo.composite "hlofuse.sample" %arg0, %arg1 {composite_attributes = {form = "min_p", k = 0 : i64, min_p = 5.000000e-02 : f64, mode = "min_p", p = 1.000000e+00 : f64, temperature = 8.000000e-01 : f64}, decomposition = @impl, version = 1 : i32} : (tensor<4x1024xf32>, tensor<2xui32>) -> tensor<4xi32>
    return %0 : tensor<4xi32>
  }
  func.func private @impl(%arg0: tensor<4x1024xf32>, %arg1: tensor<2xui32>) -> tensor<4xi32> {
    %0 = stablehlo.constant dense<0> : tensor<4xi32>
    return %0 : tensor<4xi32>
  }
}

// -----

// Rank-space top-k (JetStream / gemma) with the vocabulary sharded: each split's top k with global ids
// (hlofuse_sample_top_k, batch dims R and P), packed as (value, id bits) f32 pairs into one (R, 2 * P * k)
// array, which a sharded vocabulary gathers once; the packed form (8) ranks the candidates, draws the rank
// noise and returns the winner's id.
// CPU-LABEL: func.func public @rank_top_k_vocab_sharded
// CPU: func.func private @hlofuse.sample.cpu
// CPU: %[[X:.*]] = stablehlo.reshape %arg0 : (tensor<4x1024xf32>) -> tensor<4x8x128xf32>
// CPU: %[[TOP:.*]]:2 = stablehlo.custom_call @hlofuse_sample_top_k(%[[X]],
// CPU-SAME: num_batch_dims = "2"
// CPU: %[[BITS:.*]] = stablehlo.bitcast_convert %[[TOP]]#1 : (tensor<4x8x8xi32>) -> tensor<4x8x8xf32>
// CPU: stablehlo.concatenate
// CPU: %[[PACKED:.*]] = stablehlo.reshape {{.*}} : (tensor<4x8x8x2xf32>) -> tensor<4x128xf32>
// CPU: stablehlo.custom_call @hlofuse_sample(%[[PACKED]],
// CPU-SAME: form = 8 : i64, gumbel_at_zero = 0x7FC00000 : f32, k = 8 : i64
// CPU-SAME: vocab_total = 0 : i64
// CPU-SAME: num_batch_dims = "1"
// KEEP-LABEL: func.func public @rank_top_k_vocab_sharded
// DEFAULT-LABEL: func.func public @rank_top_k_vocab_sharded
// DEFAULT: call @hlofuse.sample.cpu
// KEEP: stablehlo.composite "hlofuse.sample"
module @sample_top_k_vocab attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["vocab"=8]>
  func.func public @rank_top_k_vocab_sharded(%arg0: tensor<4x1024xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"vocab"}]>}, %arg1: tensor<2xui32>) -> tensor<4xi32> {
    %0 = stablehlo.composite "hlofuse.sample" %arg0, %arg1 {composite_attributes = {form = "top_k", k = 8 : i64, min_p = 0.000000e+00 : f64, mode = "top_k", p = 1.000000e+00 : f64, temperature = 0.69999999999999996 : f64}, decomposition = @impl, version = 1 : i32} : (tensor<4x1024xf32>, tensor<2xui32>) -> tensor<4xi32>
    return %0 : tensor<4xi32>
  }
  func.func private @impl(%arg0: tensor<4x1024xf32>, %arg1: tensor<2xui32>) -> tensor<4xi32> {
    %0 = stablehlo.constant dense<0> : tensor<4xi32>
    return %0 : tensor<4xi32>
  }
}
