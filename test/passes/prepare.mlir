// RUN: hlofuse-opt %s --split-input-file --hlofuse-prepare | filecheck %s

// CHECK-LABEL: func.func public @inlines_private_helpers
// CHECK-NOT: call @
// CHECK: stablehlo.iota dim = 0
// CHECK: stablehlo.select
// CHECK-NOT: func.func private @tril
func.func public @inlines_private_helpers(%arg0: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %c = stablehlo.constant dense<true> : tensor<i1>
  %0 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i1>) -> tensor<4x4xi1>
  %1 = call @tril(%0) : (tensor<4x4xi1>) -> tensor<4x4xi1>
  %cst = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x4xf32>
  %3 = stablehlo.select %1, %arg0, %2 : tensor<4x4xi1>, tensor<4x4xf32>
  return %3 : tensor<4x4xf32>
}
func.func private @tril(%arg0: tensor<4x4xi1>) -> tensor<4x4xi1> {
  %0 = stablehlo.iota dim = 0 : tensor<4x4xi32>
  %1 = stablehlo.iota dim = 1 : tensor<4x4xi32>
  %2 = stablehlo.compare GE, %0, %1, SIGNED : (tensor<4x4xi32>, tensor<4x4xi32>) -> tensor<4x4xi1>
  %c = stablehlo.constant dense<false> : tensor<i1>
  %3 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i1>) -> tensor<4x4xi1>
  %4 = stablehlo.select %2, %arg0, %3 : tensor<4x4xi1>, tensor<4x4xi1>
  return %4 : tensor<4x4xi1>
}

// -----

// A public function is an entry point, not a helper: it stays, and so do calls to it.
// CHECK-LABEL: func.func public @no_match_public_callee
// CHECK: call @helper
// CHECK: func.func public @helper
func.func public @no_match_public_callee(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = call @helper(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func public @helper(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %arg0, %arg0 : tensor<4xf32>
  return %0 : tensor<4xf32>
}
