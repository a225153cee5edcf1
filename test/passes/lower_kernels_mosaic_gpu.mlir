// hlofuse-lower-kernels on hlofuse.attention for the Mosaic GPU (Hopper) target
// (python/hlofuse/kernels/pallas/mosaic_gpu.py). The kernel is lowered for CUDA on this host
// (cross-platform lowering), so the checks are structural.
// RUN: hlofuse-opt %s --split-input-file --pass-pipeline='builtin.module(hlofuse-lower-kernels{target=gpu-mosaic})' | filecheck %s --check-prefix=MGPU
// RUN: hlofuse-opt %s --split-input-file --pass-pipeline='builtin.module(hlofuse-lower-kernels{target=gpu-mosaic})' --remarks 2>&1 >/dev/null | filecheck %s --check-prefix=MGPU-REMARK
// RUN: hlofuse-opt %s --split-input-file --pass-pipeline='builtin.module(hlofuse-lower-kernels{target=gpu-mosaic-interpret})' | filecheck %s --check-prefix=INTERP

// bf16 causal GQA (4 query heads on 2 kv heads) with kv lengths: lengths as (B, 2) int32, q in the row
// layout (B, K, T·G rows padded to one 64-row wgmma tile, H padded to 64), K/V kept (B, S, K, H) with
// S padded to the 64-key block and H to 64; one Mosaic GPU call; the wrapper fills rows that see no key.
// MGPU-LABEL: func.func public @causal_gqa_lengths_to_mosaic_gpu
// MGPU-NOT: stablehlo.composite
// MGPU: call @"hlofuse.attention.gpu-mosaic"(%arg0, %arg1, %arg2, %arg3)
// MGPU: func.func private @"hlofuse.attention.gpu-mosaic"
// MGPU: %[[LENS:.*]] = stablehlo.concatenate {{.*}} -> tensor<2x2xi32>
// MGPU: %[[Q:.*]] = stablehlo.pad {{.*}} -> tensor<2x2x64x64xbf16>
// MGPU: %[[K:.*]] = stablehlo.pad %arg1, {{.*}} -> tensor<2x64x2x64xbf16>
// MGPU: %[[V:.*]] = stablehlo.pad %arg2, {{.*}} -> tensor<2x64x2x64xbf16>
// MGPU: stablehlo.custom_call @mosaic_gpu_v2(%[[LENS]], %[[Q]], %[[K]], %[[V]])
// MGPU-SAME: kernel_hash =
// MGPU-SAME: (tensor<2x2xi32>, tensor<2x2x64x64xbf16>, tensor<2x64x2x64xbf16>, tensor<2x64x2x64xbf16>) -> tensor<2x2x64x64xbf16>
// MGPU-NOT: stablehlo.custom_call
// MGPU: stablehlo.select
// MGPU-NOT: func.func private @impl
// The interpreted target: a host call that runs the same kernel in the Mosaic GPU interpreter.
// INTERP-LABEL: func.func public @causal_gqa_lengths_to_mosaic_gpu
// INTERP: call @"hlofuse.attention.gpu-mosaic-interpret"(%arg0, %arg1, %arg2, %arg3)
// INTERP: stablehlo.custom_call @hlofuse_nki_host_call(%arg0, %arg1, %arg2, %arg3)
// INTERP-SAME: hlofuse.kernels.pallas.mosaic_gpu:run_interpreted
// INTERP-SAME: \22roles\22: [\22kv_lengths\22]
func.func public @causal_gqa_lengths_to_mosaic_gpu(%arg0: tensor<2x16x4x32xbf16>, %arg1: tensor<2x16x2x32xbf16>, %arg2: tensor<2x16x2x32xbf16>, %arg3: tensor<2xi32>) -> tensor<2x16x4x32xbf16> {
  %0 = stablehlo.composite "hlofuse.attention" %arg0, %arg1, %arg2, %arg3 {composite_attributes = {causal = true, decode = false, layout = "BTNH", mask_kind = "lengths", masked_value = 0xFFF0000000000000 : f64, num_heads = 4 : i64, num_kv_heads = 2 : i64, operands = ["q", "k", "v", "kv_lengths"], q_offset = 0 : i64, scale = 0.17677669529663687 : f64, softcap = 0.000000e+00 : f64, window_left = -1 : i64, window_right = 0 : i64, zero_empty_rows = false}, decomposition = @impl, version = 1 : i32} : (tensor<2x16x4x32xbf16>, tensor<2x16x2x32xbf16>, tensor<2x16x2x32xbf16>, tensor<2xi32>) -> tensor<2x16x4x32xbf16>
  return %0 : tensor<2x16x4x32xbf16>
}
func.func private @impl(%arg0: tensor<2x16x4x32xbf16>, %arg1: tensor<2x16x2x32xbf16>, %arg2: tensor<2x16x2x32xbf16>, %arg3: tensor<2xi32>) -> tensor<2x16x4x32xbf16> {
  return %arg0 : tensor<2x16x4x32xbf16>
}

// -----

// f32 would run on wgmma as tf32: the composite stays, with the reason.
// MGPU-REMARK: lower_kernels_mosaic_gpu.mlir:[[# @LINE + 4]]:8: remark: [hlofuse-lower-kernels] stablehlo.composite: kept as a composite: the gpu-mosaic kernel takes q, k, v all bf16 or all f16, not ['f32', 'f32', 'f32'] (wgmma would run f32 as tf32
// MGPU-LABEL: func.func public @no_match_f32
// MGPU: stablehlo.composite "hlofuse.attention"
func.func public @no_match_f32(%arg0: tensor<1x64x2x64xf32>) -> tensor<1x64x2x64xf32> {
  %0 = stablehlo.composite "hlofuse.attention" %arg0, %arg0, %arg0 {composite_attributes = {causal = true, decode = false, layout = "BTNH", mask_kind = "none", masked_value = 0xFFF0000000000000 : f64, num_heads = 2 : i64, num_kv_heads = 2 : i64, operands = ["q", "k", "v"], q_offset = 0 : i64, scale = 1.250000e-01 : f64, softcap = 0.000000e+00 : f64, window_left = -1 : i64, window_right = 0 : i64, zero_empty_rows = false}, decomposition = @impl_f32, version = 1 : i32} : (tensor<1x64x2x64xf32>, tensor<1x64x2x64xf32>, tensor<1x64x2x64xf32>) -> tensor<1x64x2x64xf32>
  return %0 : tensor<1x64x2x64xf32>
}
func.func private @impl_f32(%arg0: tensor<1x64x2x64xf32>, %arg1: tensor<1x64x2x64xf32>, %arg2: tensor<1x64x2x64xf32>) -> tensor<1x64x2x64xf32> {
  return %arg0 : tensor<1x64x2x64xf32>
}

// -----

// An additive bias operand: not taken by this kernel (target=gpu takes it).
// MGPU-REMARK: lower_kernels_mosaic_gpu.mlir:[[# @LINE + 4]]:8: remark: [hlofuse-lower-kernels] stablehlo.composite: kept as a composite: the gpu-mosaic kernel takes no bias operand (target=gpu does)
// MGPU-LABEL: func.func public @no_match_bias
// MGPU: stablehlo.composite "hlofuse.attention"
func.func public @no_match_bias(%arg0: tensor<1x64x2x64xbf16>, %arg1: tensor<1x2x64x64xf32>) -> tensor<1x64x2x64xbf16> {
  %0 = stablehlo.composite "hlofuse.attention" %arg0, %arg0, %arg0, %arg1 {composite_attributes = {causal = false, decode = false, layout = "BTNH", mask_kind = "additive", masked_value = 0xFFF0000000000000 : f64, num_heads = 2 : i64, num_kv_heads = 2 : i64, operands = ["q", "k", "v", "bias"], q_offset = 0 : i64, scale = 1.250000e-01 : f64, softcap = 0.000000e+00 : f64, window_left = -1 : i64, window_right = -1 : i64, zero_empty_rows = false}, decomposition = @impl_bias, version = 1 : i32} : (tensor<1x64x2x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x64xbf16>, tensor<1x2x64x64xf32>) -> tensor<1x64x2x64xbf16>
  return %0 : tensor<1x64x2x64xbf16>
}
func.func private @impl_bias(%arg0: tensor<1x64x2x64xbf16>, %arg1: tensor<1x64x2x64xbf16>, %arg2: tensor<1x64x2x64xbf16>, %arg3: tensor<1x2x64x64xf32>) -> tensor<1x64x2x64xbf16> {
  return %arg0 : tensor<1x64x2x64xbf16>
}
