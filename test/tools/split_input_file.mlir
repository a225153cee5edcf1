// RUN: hlofuse-opt %s --split-input-file --cse | filecheck %s
// RUN: hlofuse-opt %s --split-input-file --pass-pipeline='builtin.module(cse)' | filecheck %s

// Each chunk is parsed, rewritten and printed on its own; outputs are joined by `// -----`.

// CHECK-LABEL: func.func @cse_in_first_chunk
// CHECK: %[[SUM:.*]] = stablehlo.add %arg0, %arg0
// CHECK-NOT: stablehlo.add
// CHECK: stablehlo.multiply %[[SUM]], %[[SUM]]
func.func @cse_in_first_chunk(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %a : tensor<4xf32>
  %1 = stablehlo.add %a, %a : tensor<4xf32>
  %2 = stablehlo.multiply %0, %1 : tensor<4xf32>
  return %2 : tensor<4xf32>
}

// -----

// CHECK: // -----
// CHECK-LABEL: func.func @same_name_in_second_chunk
// CHECK-NEXT: return %arg0
func.func @same_name_in_second_chunk(%a: tensor<4xf32>) -> tensor<4xf32> {
  return %a : tensor<4xf32>
}

// -----

// Symbols are per chunk: this @cse_in_first_chunk does not clash with the first one.
// CHECK: // -----
// CHECK-LABEL: func.func @cse_in_first_chunk
// CHECK-SAME: tensor<2xi32>
func.func @cse_in_first_chunk(%a: tensor<2xi32>) -> tensor<2xi32> {
  return %a : tensor<2xi32>
}
