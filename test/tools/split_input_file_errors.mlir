// RUN: not hlofuse-opt %s --split-input-file 2>&1 | filecheck %s
// RUN: not hlofuse-opt %s --split-input-file 2>/dev/null | filecheck %s --check-prefix=OUT

// A failing chunk is reported with its line in THIS file; the other chunks still print, exit code 1.

// CHECK: split_input_file_errors.mlir:[[# @LINE + 3]]:8: error: custom op 'stablehlo.bogus' is unknown
// OUT-LABEL: func.func @before_the_error
func.func @bad(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.bogus %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @before_the_error(%a: tensor<4xf32>) -> tensor<4xf32> {
  return %a : tensor<4xf32>
}

// -----

// CHECK: split_input_file_errors.mlir:[[# @LINE + 2]]:10: error: use of value '%a' expects different type
func.func @type_mismatch(%a: tensor<4xf32>) -> tensor<4xf32> {
  return %a : tensor<4xi32>
}

// -----

// OUT: // -----
// OUT-LABEL: func.func @after_the_error
func.func @after_the_error(%a: tensor<4xf32>) -> tensor<4xf32> {
  return %a : tensor<4xf32>
}
