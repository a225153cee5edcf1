// hlofuse-lower-kernels on hlofuse.sample for the NKI targets: neuron-sim runs the NKI sampler through the
// host call, near-misses stay composites with a remark, and target=neuron without the Neuron SDK fails
// with the install message, never a traceback (the neuron RUN line assumes neuronxcc does not import, as on CI).
// RUN: hlofuse-opt %s --split-input-file --hlofuse-lower-kernels=target=neuron-sim | filecheck %s --check-prefix=SIM
// RUN: hlofuse-opt %s --split-input-file --hlofuse-lower-kernels=target=neuron-sim --remarks 2>&1 >/dev/null | filecheck %s --check-prefix=SIM-REMARK
// RUN: not hlofuse-opt %s --split-input-file --hlofuse-lower-kernels=target=neuron 2>&1 | filecheck %s --check-prefix=NEURON

// SIM-LABEL: func.func public @top_p_mask_to_nki_host_call
// SIM-NOT: stablehlo.composite "hlofuse.sample"
// SIM: call @"hlofuse.sample.neuron-sim"(%arg0, %arg1)
// SIM: func.func private @"hlofuse.sample.neuron-sim"
// The Gumbel noise, drawn from the key as jax.random.categorical draws it, is the kernel's second operand.
// SIM: stablehlo.log
// SIM: stablehlo.log
// SIM: %[[NOISE:.*]] = stablehlo.negate
// SIM-NEXT: %[[IDS:.*]] = stablehlo.custom_call @hlofuse_nki_host_call(%arg0, %[[NOISE]])
// SIM-SAME: \22function\22: \22hlofuse.kernels.nki.sampling:run_kernel\22
// SIM-SAME: \22form\22: \22top_p_mask\22
// SIM-SAME: (tensor<4x256xf32>, tensor<4x256xf32>) -> tensor<4x1xi32>
// Rows the kernel marks -1 (uncertified) select the reference branch, which alone sorts.
// SIM: %[[TOKENS:.*]] = stablehlo.reshape %[[IDS]]
// SIM: stablehlo.compare EQ, %[[TOKENS]]
// SIM: "stablehlo.case"
// SIM-NEXT: stablehlo.return %[[TOKENS]]
// SIM: "stablehlo.sort"(%arg0)
// NEURON-COUNT-5: error: pass 'hlofuse-lower-kernels' failed: TargetUnavailable: target 'neuron' cannot lower 1 composite(s) here: no neuron kernel without the Neuron SDK: `neuronxcc` does not import here
// NEURON-NOT: Traceback
func.func public @top_p_mask_to_nki_host_call(%arg0: tensor<4x256xf32>, %arg1: tensor<2xui32>) -> tensor<4xi32> {
  %0 = stablehlo.composite "hlofuse.sample" %arg0, %arg1 {composite_attributes = {form = "top_p_mask", k = 0 : i64, min_p = 0.000000e+00 : f64, mode = "top_p", p = 0.90000000000000002 : f64, temperature = 0.69999999999999996 : f64}, decomposition = @hlofuse.sample.impl, version = 1 : i32} : (tensor<4x256xf32>, tensor<2xui32>) -> tensor<4xi32>
  return %0 : tensor<4xi32>
}
func.func private @hlofuse.sample.impl(%arg0: tensor<4x256xf32>, %arg1: tensor<2xui32>) -> tensor<4xi32> {
  %0 = stablehlo.constant dense<0> : tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

// Greedy has no key and no noise operand: the host call takes the logits alone.
// SIM-LABEL: func.func public @greedy_bf16_to_nki_host_call
// SIM-NOT: stablehlo.composite "hlofuse.sample"
// SIM: stablehlo.custom_call @hlofuse_nki_host_call(%arg0)
// SIM-SAME: \22form\22: \22greedy\22
// SIM-SAME: (tensor<3x1000xbf16>) -> tensor<3x1xi32>
func.func public @greedy_bf16_to_nki_host_call(%arg0: tensor<3x1000xbf16>) -> tensor<3xi32> {
  %0 = stablehlo.composite "hlofuse.sample" %arg0 {composite_attributes = {form = "greedy", k = 0 : i64, min_p = 0.000000e+00 : f64, mode = "greedy", p = 1.000000e+00 : f64, temperature = 1.000000e+00 : f64}, decomposition = @hlofuse.sample.impl, version = 1 : i32} : (tensor<3x1000xbf16>) -> tensor<3xi32>
  return %0 : tensor<3xi32>
}
func.func private @hlofuse.sample.impl(%arg0: tensor<3x1000xbf16>) -> tensor<3xi32> {
  %0 = stablehlo.constant dense<0> : tensor<3xi32>
  return %0 : tensor<3xi32>
}

// -----

// Near-miss: top-p on bf16 logits thresholds bf16-rounded probabilities, which the kernel does not reproduce.
// SIM-REMARK: remark: [hlofuse-lower-kernels] stablehlo.composite: kept as a composite: the neuron-sim sampler does not take this composite: 'top_p_mask' on bfloat16 logits thresholds bfloat16-rounded probabilities
// SIM-LABEL: func.func public @no_match_top_p_mask_bf16
// SIM: stablehlo.composite "hlofuse.sample"
// SIM-NOT: hlofuse_nki_host_call
func.func public @no_match_top_p_mask_bf16(%arg0: tensor<4x256xbf16>, %arg1: tensor<2xui32>) -> tensor<4xi32> {
  %0 = stablehlo.composite "hlofuse.sample" %arg0, %arg1 {composite_attributes = {form = "top_p_mask", k = 0 : i64, min_p = 0.000000e+00 : f64, mode = "top_p", p = 0.90000000000000002 : f64, temperature = 1.000000e+00 : f64}, decomposition = @hlofuse.sample.impl, version = 1 : i32} : (tensor<4x256xbf16>, tensor<2xui32>) -> tensor<4xi32>
  return %0 : tensor<4xi32>
}
func.func private @hlofuse.sample.impl(%arg0: tensor<4x256xbf16>, %arg1: tensor<2xui32>) -> tensor<4xi32> {
  %0 = stablehlo.constant dense<0> : tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

// Near-miss: the rank-space top-k form walks the top k's distinct values, one pass each, so k is bounded.
// SIM-REMARK: remark: [hlofuse-lower-kernels] stablehlo.composite: kept as a composite: the neuron-sim sampler does not take this composite: k = 300 exceeds 256 for the rank-space form 'top_k'

// SIM-LABEL: func.func public @no_match_rank_space_top_k_over_256
// SIM: stablehlo.composite "hlofuse.sample"
// SIM-NOT: hlofuse_nki_host_call
func.func public @no_match_rank_space_top_k_over_256(%arg0: tensor<4x512xf32>, %arg1: tensor<2xui32>) -> tensor<4xi32> {
  %0 = stablehlo.composite "hlofuse.sample" %arg0, %arg1 {composite_attributes = {form = "top_k", k = 300 : i64, min_p = 0.000000e+00 : f64, mode = "top_k", p = 1.000000e+00 : f64, temperature = 6.000000e-01 : f64}, decomposition = @hlofuse.sample.impl, version = 1 : i32} : (tensor<4x512xf32>, tensor<2xui32>) -> tensor<4xi32>
  return %0 : tensor<4xi32>
}
func.func private @hlofuse.sample.impl(%arg0: tensor<4x512xf32>, %arg1: tensor<2xui32>) -> tensor<4xi32> {
  %0 = stablehlo.constant dense<0> : tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

// The rank-space top-k form (JetStream / gemma): the noise operand holds the top k's noise only.
// SIM-LABEL: func.func public @rank_space_top_k_to_nki_host_call
// SIM-NOT: stablehlo.composite "hlofuse.sample"
// SIM: stablehlo.custom_call @hlofuse_nki_host_call(%arg0, %{{[0-9]+}})
// SIM-SAME: \22form\22: \22top_k\22
// SIM-SAME: (tensor<4x256xf32>, tensor<4x40xf32>) -> tensor<4x1xi32>
func.func public @rank_space_top_k_to_nki_host_call(%arg0: tensor<4x256xf32>, %arg1: tensor<2xui32>) -> tensor<4xi32> {
  %0 = stablehlo.composite "hlofuse.sample" %arg0, %arg1 {composite_attributes = {form = "top_k", k = 40 : i64, min_p = 0.000000e+00 : f64, mode = "top_k", p = 1.000000e+00 : f64, temperature = 6.000000e-01 : f64}, decomposition = @hlofuse.sample.impl, version = 1 : i32} : (tensor<4x256xf32>, tensor<2xui32>) -> tensor<4xi32>
  return %0 : tensor<4xi32>
}
func.func private @hlofuse.sample.impl(%arg0: tensor<4x256xf32>, %arg1: tensor<2xui32>) -> tensor<4xi32> {
  %0 = stablehlo.constant dense<0> : tensor<4xi32>
  return %0 : tensor<4xi32>
}
