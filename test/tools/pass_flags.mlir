// hlofuse passes get one flag each from the registry; options follow `=`, as in mlir-opt.
// RUN: hlofuse-opt %s --hlofuse-lower-kernels=target=cpu | filecheck %s
// RUN: hlofuse-opt %s --hlofuse-lower-kernels="target=cpu" --cse | filecheck %s
// RUN: hlofuse-opt %s --pass-pipeline='builtin.module(hlofuse-lower-kernels{target=cpu},canonicalize)' | filecheck %s
// RUN: hlofuse-opt %s --hlofuse-prepare --hlofuse-fuse-attention | filecheck %s

// RUN: not hlofuse-opt %s --hlofuse-lower-kernels=no-such-option=1 2>&1 | filecheck %s --check-prefix=BAD
// BAD: hlofuse-opt: error: invalid pipeline: unknown option 'no-such-option' for pass 'hlofuse-lower-kernels'

// Nothing here is attention: every pass leaves the function as it is.
// CHECK-LABEL: func.func @no_match_plain_add
// CHECK-NEXT: stablehlo.add
// CHECK-NOT: stablehlo.composite
// CHECK-NOT: stablehlo.custom_call
func.func @no_match_plain_add(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
