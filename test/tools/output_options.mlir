// RUN: hlofuse-opt %s --mlir-print-debuginfo | filecheck %s --check-prefix=DEBUGINFO
// DEBUGINFO: stablehlo.add {{.*}} loc(#[[LOC:loc[0-9]*]])
// DEBUGINFO: #[[LOC]] = loc("{{.*}}output_options.mlir":[[# @LINE + 20]]:8)

// RUN: hlofuse-opt %s | filecheck %s --check-prefix=PLAIN
// PLAIN-NOT: loc(

// -o writes the file; the output parses back.
// RUN: hlofuse-opt %s -o %t.mlir && hlofuse-opt %t.mlir | filecheck %s --check-prefix=PLAIN-FUNC
// PLAIN-FUNC: func.func @twice

// Bytecode round-trips.
// RUN: hlofuse-opt %s --emit-bytecode -o %t.mlirbc && hlofuse-opt %t.mlirbc | filecheck %s --check-prefix=PLAIN-FUNC

// Shorthand flags run in the order given: cse then canonicalize, or canonicalize then cse.
// RUN: hlofuse-opt %s --cse --canonicalize | filecheck %s --check-prefix=PLAIN-FUNC
// RUN: hlofuse-opt %s --pass-pipeline='builtin.module(canonicalize,cse)' | filecheck %s --check-prefix=PLAIN-FUNC

// A pass anchored on func.func given as a flag is nested for it, as mlir-opt does.
// RUN: hlofuse-opt %s --stablehlo-legalize-composite-to-call | filecheck %s --check-prefix=PLAIN-FUNC

func.func @twice(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
