// hlofuse-lower-kernels on hlofuse.sample composites for the Pallas targets (python/hlofuse/kernels/pallas/sampling.py).
// The kernels are lowered for TPU / CUDA on this host (cross-platform lowering), so the checks are structural.
// RUN: hlofuse-opt %s --split-input-file --pass-pipeline='builtin.module(hlofuse-lower-kernels{target=tpu})' | filecheck %s --check-prefix=TPU
// RUN: hlofuse-opt %s --split-input-file --pass-pipeline='builtin.module(hlofuse-lower-kernels{target=gpu})' | filecheck %s --check-prefix=GPU
// RUN: hlofuse-opt %s --split-input-file --pass-pipeline='builtin.module(hlofuse-lower-kernels{target=tpu})' --remarks 2>&1 >/dev/null | filecheck %s --check-prefix=TPU-REMARK
// RUN: hlofuse-opt %s --split-input-file --pass-pipeline='builtin.module(hlofuse-lower-kernels{target=gpu-interpret})' --remarks 2>&1 >/dev/null | filecheck %s --check-prefix=GPUI-REMARK

// f32 top-k then top-p over a 32000 vocabulary: rows padded to the 8 sublanes, the vocabulary padded with -inf
// to 42 lane tiles of 768 (8 x 768 f32 is 6 vregs, which libtpu holds without spilling) laid out tile-major, the key as int32
// followed by the first row's global index and the first token's id (0 and 0 on one device; hlofuse.shard_local
// passes a shard's).
// TPU-LABEL: func.func public @top_k_top_p_to_kernel
// TPU-NOT: stablehlo.composite
// TPU: call @hlofuse.sample.tpu(%arg0, %arg1)
// TPU: func.func private @hlofuse.sample.tpu
// TPU: stablehlo.pad %arg0, {{.*}} -> tensor<8x32256xf32>
// TPU: %[[RAW:.*]] = stablehlo.bitcast_convert %arg1 : (tensor<2xui32>) -> tensor<2xi32>
// TPU: %[[KEY:.*]] = stablehlo.concatenate %[[RAW]], {{.*}} -> tensor<4xi32>
// TPU: %[[TILES:.*]] = stablehlo.transpose {{.*}} -> tensor<42x8x768xf32>
// TPU: stablehlo.custom_call @tpu_custom_call(%[[KEY]], %[[TILES]])
// TPU-SAME: kernel_name = "hlofuse_sample_tpu"
// TPU-SAME: -> tensor<8x128xi32>
// TPU-NOT: func.func private @impl
// GPU-LABEL: func.func public @top_k_top_p_to_kernel
// GPU-NOT: stablehlo.composite
// GPU: func.func private @hlofuse.sample.gpu
// GPU: stablehlo.custom_call @__gpu$xla.gpu.triton(
// GPU-SAME: grid_x = 4 : i32
// GPU-SAME: name = "hlofuse_sample_gpu"
// GPU-SAME: (tensor<4xi32>, tensor<4x32768xf32>) -> tensor<4x1xi32>
func.func public @top_k_top_p_to_kernel(%arg0: tensor<4x32000xf32>, %arg1: tensor<2xui32>) -> tensor<4xi32> {
  %0 = stablehlo.composite "hlofuse.sample" %arg0, %arg1 {composite_attributes = {form = "top_k_top_p_mask", k = 40 : i64, min_p = 0.000000e+00 : f64, mode = "top_k+top_p", p = 9.000000e-01 : f64, temperature = 0.69999999999999996 : f64}, decomposition = @impl, version = 1 : i32} : (tensor<4x32000xf32>, tensor<2xui32>) -> tensor<4xi32>
  return %0 : tensor<4xi32>
}
func.func private @impl(%arg0: tensor<4x32000xf32>, %arg1: tensor<2xui32>) -> tensor<4xi32> {
  %0 = stablehlo.constant dense<0> : tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

// Greedy on bf16 (2, 3, V) logits: no key operand, rows flattened, 16 bf16 rows per TPU block.
// TPU-LABEL: func.func public @greedy_bf16_to_kernel
// TPU-NOT: stablehlo.composite
// TPU: call @hlofuse.sample.tpu(%arg0)
// TPU: stablehlo.custom_call @tpu_custom_call({{.*}}) {{.*}} : (tensor<4xi32>, tensor<1x16x256xbf16>) -> tensor<16x128xi32>
// TPU: stablehlo.reshape {{.*}} -> tensor<2x3xi32>
// GPU-LABEL: func.func public @greedy_bf16_to_kernel
// GPU: stablehlo.custom_call @__gpu$xla.gpu.triton({{.*}} : (tensor<4xi32>, tensor<6x256xbf16>) -> tensor<6x1xi32>
func.func public @greedy_bf16_to_kernel(%arg0: tensor<2x3x256xbf16>) -> tensor<2x3xi32> {
  %0 = stablehlo.composite "hlofuse.sample" %arg0 {composite_attributes = {form = "greedy", k = 0 : i64, min_p = 0.000000e+00 : f64, mode = "greedy", p = 1.000000e+00 : f64, temperature = 1.000000e+00 : f64}, decomposition = @impl_greedy, version = 1 : i32} : (tensor<2x3x256xbf16>) -> tensor<2x3xi32>
  return %0 : tensor<2x3xi32>
}
func.func private @impl_greedy(%arg0: tensor<2x3x256xbf16>) -> tensor<2x3xi32> {
  %0 = stablehlo.constant dense<0> : tensor<2x3xi32>
  return %0 : tensor<2x3xi32>
}

// -----

// Near-miss: top-p on bf16 logits thresholds bf16-rounded probabilities and their bf16 cumsum, which only a
// sort reproduces, so it stays a composite (XLA inlines the original) with a remark.
// TPU-REMARK: lower_kernels_pallas_sampling.mlir:[[# @LINE + 6]]:8: remark: [hlofuse-lower-kernels] stablehlo.composite: kept as a composite: the tpu sampler does not reproduce 'top_p_mask' on bf16 logits
// GPUI-REMARK: lower_kernels_pallas_sampling.mlir:[[# @LINE + 5]]:8: remark: [hlofuse-lower-kernels] stablehlo.composite: kept as a composite: the gpu-interpret sampler does not reproduce 'top_p_mask' on bf16 logits
// TPU-LABEL: func.func public @no_match_top_p_bf16
// TPU: stablehlo.composite "hlofuse.sample"
// TPU-NOT: tpu_custom_call
func.func public @no_match_top_p_bf16(%arg0: tensor<4x1000xbf16>, %arg1: tensor<2xui32>) -> tensor<4xi32> {
  %0 = stablehlo.composite "hlofuse.sample" %arg0, %arg1 {composite_attributes = {form = "top_p_mask", k = 0 : i64, min_p = 0.000000e+00 : f64, mode = "top_p", p = 9.000000e-01 : f64, temperature = 0.69921875 : f64}, decomposition = @impl_top_p, version = 1 : i32} : (tensor<4x1000xbf16>, tensor<2xui32>) -> tensor<4xi32>
  return %0 : tensor<4xi32>
}
func.func private @impl_top_p(%arg0: tensor<4x1000xbf16>, %arg1: tensor<2xui32>) -> tensor<4xi32> {
  %0 = stablehlo.constant dense<0> : tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

// argmax(softmax(x)) (keras-hub's greedy sampler): the kernel's argmax, certified away from ties that the
// softmax's rounding could make, and the program's own softmax under a conditional for a row near one.
// TPU-LABEL: func.func public @greedy_softmax_to_kernel
// TPU: call @hlofuse.sample.tpu(%arg0)
// TPU: stablehlo.custom_call @tpu_custom_call
// TPU: stablehlo.case
// GPU-LABEL: func.func public @greedy_softmax_to_kernel
// GPU: call @hlofuse.sample.gpu(%arg0)
// GPU: stablehlo.custom_call @__gpu$xla.gpu.triton
// GPU: stablehlo.case
func.func public @greedy_softmax_to_kernel(%arg0: tensor<4x1000xf32>) -> tensor<4xi32> {
  %0 = stablehlo.composite "hlofuse.sample" %arg0 {composite_attributes = {form = "greedy_softmax", k = 0 : i64, min_p = 0.000000e+00 : f64, mode = "greedy", p = 1.000000e+00 : f64, temperature = 1.000000e+00 : f64}, decomposition = @impl_softmax, version = 1 : i32} : (tensor<4x1000xf32>) -> tensor<4xi32>
  return %0 : tensor<4xi32>
}
func.func private @impl_softmax(%arg0: tensor<4x1000xf32>) -> tensor<4xi32> {
  %0 = stablehlo.constant dense<0> : tensor<4xi32>
  return %0 : tensor<4xi32>
}
