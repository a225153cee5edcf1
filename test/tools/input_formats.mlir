// Every input form is detected from its content; all of these print the same StableHLO program.
// The samples come from test/tools/inputs/generate.py (see docs/hlofuse-opt.md for each dump).

// RUN: hlofuse-opt %S/inputs/xla_dump_module.mlir | filecheck %s
// RUN: hlofuse-opt %S/inputs/jax_ir_compile.mlir | filecheck %s
// RUN: hlofuse-opt %S/inputs/tanh_matmul.mlirbc | filecheck %s
// RUN: hlofuse-opt %S/inputs/tanh_matmul.vhlo | filecheck %s
// RUN: hlofuse-opt %S/inputs/tanh_matmul.jax_export | filecheck %s
// RUN: hlofuse-opt %S/inputs/xla_dump.before_optimizations.txt | filecheck %s
// RUN: hlofuse-opt %S/inputs/xla_dump.before_optimizations.hlo.pb | filecheck %s
// RUN: hlofuse-opt %S/inputs/hlo_module_proto.pb | filecheck %s
// RUN: hlofuse-opt - < %S/inputs/tanh_matmul.jax_export | filecheck %s
// RUN: hlofuse-opt < %S/inputs/xla_dump.before_optimizations.txt | filecheck %s

// CHECK: module @jit_tanh_matmul
// CHECK: func.func {{(public )?}}@main(%arg0: tensor<2x3xf32>{{.*}}, %arg1: tensor<3x2xf32>{{.*}}) -> {{\(?}}tensor<2x2xf32>
// CHECK: stablehlo.dot{{(_general)?}} %arg0, %arg1
// CHECK: stablehlo.tanh
// CHECK: stablehlo.add
// CHECK-NOT: loc(
