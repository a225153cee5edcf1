// RUN: hlofuse-opt %s --split-input-file --hlofuse-lower-kernels=target=reference | filecheck %s --check-prefix=REF
// RUN: not hlofuse-opt %s --split-input-file --hlofuse-lower-kernels=target=neuron 2>&1 | filecheck %s --check-prefix=NOKERNEL
// (assumes neuronxcc does not import, as on CI: the neuron target then fails with the install message)
// RUN: hlofuse-opt %s --split-input-file --hlofuse-lower-kernels=target=cpu | filecheck %s --check-prefix=CPU
// RUN: hlofuse-opt %s --split-input-file --hlofuse-lower-kernels=target=cpu --remarks 2>&1 >/dev/null | filecheck %s --check-prefix=CPU-REMARK
// The CPU kernel library is built by `pip install .`; CI always has it.
// REQUIRES: cpu-kernels

// REF-LABEL: func.func public @attention_to_reference
// REF-NOT: stablehlo.composite
// REF: %[[OUT:.*]] = call @hlofuse.attention.reference(%arg0, %arg1, %arg2)
// REF: return %[[OUT]]
// REF: func.func private @hlofuse.attention.reference
// REF: stablehlo.dot_general
// REF-NOT: func.func private @hlofuse.attention.impl
// NOKERNEL: error: pass 'hlofuse-lower-kernels' failed: TargetUnavailable: target 'neuron' cannot lower 1 composite(s) here: no neuron kernel without the Neuron SDK: `neuronxcc` does not import here. Install it on a Trainium/Inferentia host (pip install neuronx-cc jax-neuronx
// NOKERNEL-NOT: Traceback
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
func.func public @no_match_unknown_version(%arg0: tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32> {
  %0 = stablehlo.composite "hlofuse.attention" %arg0, %arg0, %arg0 {composite_attributes = {scale = 1.0 : f64}, decomposition = @impl, version = 2 : i32} : (tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return %0 : tensor<1x4x2x8xf32>
}
func.func private @impl(%arg0: tensor<1x4x2x8xf32>, %arg1: tensor<1x4x2x8xf32>, %arg2: tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32> {
  return %arg0 : tensor<1x4x2x8xf32>
}

// -----

// CPU-LABEL: func.func public @causal_gqa_to_cpu_kernel
// CPU-NOT: stablehlo.composite
// CPU: call @hlofuse.attention.cpu(%arg0, %arg1, %arg2)
// CPU: func.func private @hlofuse.attention.cpu
// CPU: stablehlo.custom_call @hlofuse_attention(
// CPU-SAME: mhlo.backend_config = {
// CPU-SAME: causal = true
// CPU-SAME: has_bias = false
// CPU-SAME: window_right = 0
func.func public @causal_gqa_to_cpu_kernel(%arg0: tensor<1x4x4x8xf32>, %arg1: tensor<1x4x2x8xf32>, %arg2: tensor<1x4x2x8xf32>) -> tensor<1x4x4x8xf32> {
  %0 = stablehlo.composite "hlofuse.attention" %arg0, %arg1, %arg2 {composite_attributes = {causal = true, decode = false, layout = "BTNH", mask_kind = "none", masked_value = 0xFFF0000000000000 : f64, num_heads = 4 : i64, num_kv_heads = 2 : i64, operands = ["q", "k", "v"], q_offset = 0 : i64, scale = 0.35355339059327379 : f64, softcap = 0.000000e+00 : f64, window_left = -1 : i64, window_right = 0 : i64, zero_empty_rows = false}, decomposition = @impl_cpu, version = 1 : i32} : (tensor<1x4x4x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) -> tensor<1x4x4x8xf32>
  return %0 : tensor<1x4x4x8xf32>
}
func.func private @impl_cpu(%arg0: tensor<1x4x4x8xf32>, %arg1: tensor<1x4x2x8xf32>, %arg2: tensor<1x4x2x8xf32>) -> tensor<1x4x4x8xf32> {
  return %arg0 : tensor<1x4x4x8xf32>
}

// -----


// f16 has no CPU kernel: the composite stays and a remark says why.
// CPU-REMARK: lower_kernels.mlir:[[# @LINE + 4]]:8: remark: [hlofuse-lower-kernels] stablehlo.composite: kept as a composite: the CPU kernel takes q, k, v all f32 or all bf16
// CPU-LABEL: func.func public @no_match_f16
// CPU: stablehlo.composite "hlofuse.attention"
func.func public @no_match_f16(%arg0: tensor<1x4x2x8xf16>) -> tensor<1x4x2x8xf16> {
  %0 = stablehlo.composite "hlofuse.attention" %arg0, %arg0, %arg0 {composite_attributes = {causal = false, decode = false, layout = "BTNH", mask_kind = "none", masked_value = 0xFFF0000000000000 : f64, num_heads = 2 : i64, num_kv_heads = 2 : i64, operands = ["q", "k", "v"], q_offset = 0 : i64, scale = 0.35355339059327379 : f64, softcap = 0.000000e+00 : f64, window_left = -1 : i64, window_right = -1 : i64, zero_empty_rows = false}, decomposition = @impl_f16, version = 1 : i32} : (tensor<1x4x2x8xf16>, tensor<1x4x2x8xf16>, tensor<1x4x2x8xf16>) -> tensor<1x4x2x8xf16>
  return %0 : tensor<1x4x2x8xf16>
}
func.func private @impl_f16(%arg0: tensor<1x4x2x8xf16>, %arg1: tensor<1x4x2x8xf16>, %arg2: tensor<1x4x2x8xf16>) -> tensor<1x4x2x8xf16> {
  return %arg0 : tensor<1x4x2x8xf16>
}
