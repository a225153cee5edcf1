// RUN: hlofuse-opt %s --split-input-file --hlofuse-lower-kernels=target=reference | filecheck %s --check-prefix=REF
// RUN: hlofuse-opt %s --split-input-file --hlofuse-lower-kernels=target=tpu --remarks 2>&1 | filecheck %s --check-prefix=TPU

// REF-LABEL: func.func public @attention_to_reference
// REF-NOT: stablehlo.composite
// REF: %[[OUT:.*]] = call @hlofuse.attention.reference(%arg0, %arg1, %arg2)
// REF: return %[[OUT]]
// REF: func.func private @hlofuse.attention.reference
// REF: stablehlo.dot_general
// REF-NOT: func.func private @hlofuse.attention.impl
// TPU: remark: [hlofuse-lower-kernels] stablehlo.composite: kept as a composite: no tpu kernel
// TPU-LABEL: func.func public @attention_to_reference
// TPU: stablehlo.composite "hlofuse.attention"
func.func public @attention_to_reference(%arg0: tensor<1x4x2x8xf32>, %arg1: tensor<1x4x2x8xf32>, %arg2: tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32> {
  %0 = stablehlo.composite "hlofuse.attention" %arg0, %arg1, %arg2 {composite_attributes = {causal = true, decode = false, layout = "BTNH", mask_kind = "none", masked_value = 0xFFF0000000000000 : f64, num_heads = 2 : i64, num_kv_heads = 2 : i64, operands = ["q", "k", "v"], q_offset = 0 : i64, scale = 0.35355339059327379 : f64, softcap = 0.000000e+00 : f64, window_left = -1 : i64, window_right = 0 : i64}, decomposition = @hlofuse.attention.impl, version = 1 : i32} : (tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return %0 : tensor<1x4x2x8xf32>
}
func.func private @hlofuse.attention.impl(%arg0: tensor<1x4x2x8xf32>, %arg1: tensor<1x4x2x8xf32>, %arg2: tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32> {
  return %arg0 : tensor<1x4x2x8xf32>
}

// -----

// A composite of a newer version than this build knows is left alone.
// REF-LABEL: func.func public @no_match_unknown_version
// REF: stablehlo.composite "hlofuse.attention"
// TPU-LABEL: func.func public @no_match_unknown_version
func.func public @no_match_unknown_version(%arg0: tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32> {
  %0 = stablehlo.composite "hlofuse.attention" %arg0, %arg0, %arg0 {composite_attributes = {scale = 1.0 : f64}, decomposition = @impl, version = 2 : i32} : (tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return %0 : tensor<1x4x2x8xf32>
}
func.func private @impl(%arg0: tensor<1x4x2x8xf32>, %arg1: tensor<1x4x2x8xf32>, %arg2: tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32> {
  return %arg0 : tensor<1x4x2x8xf32>
}
