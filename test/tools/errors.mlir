// Every failure is one line on stderr and exit code 1, never a Python traceback.

// RUN: not hlofuse-opt %s 2>&1 | filecheck %s --check-prefix=PARSE
// PARSE: errors.mlir:[[# @LINE + 4]]:8: error: custom op 'stablehlo.bogus' is unknown
// PARSE-NOT: Traceback
// PARSE-NOT: error
func.func @bad(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.bogus %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// RUN: not hlofuse-opt %S/does-not-exist.mlir 2>&1 | filecheck %s --check-prefix=MISSING
// MISSING: does-not-exist.mlir: error: cannot read input: No such file or directory

// RUN: not hlofuse-opt %S/inputs 2>&1 | filecheck %s --check-prefix=DIR
// DIR: inputs: error: is a directory

// RUN: not hlofuse-opt %S/inputs/xla_dump_module.mlir --pass-pipeline='builtin.module(no-such-pass)' 2>&1 \
// RUN:   | filecheck %s --check-prefix=UNKNOWN-PASS
// UNKNOWN-PASS: hlofuse-opt: error: invalid pipeline: {{.*}}'no-such-pass' does not refer to a registered pass

// RUN: not hlofuse-opt %S/inputs/xla_dump_module.mlir --no-such-pass 2>&1 | filecheck %s --check-prefix=UNKNOWN-FLAG
// UNKNOWN-FLAG: hlofuse-opt: error: invalid pipeline: {{.*}}'no-such-pass' does not refer to a registered pass

// RUN: not hlofuse-opt %S/inputs/xla_dump_module.mlir --pass-pipeline='builtin.module(hlofuse-nope)' 2>&1 \
// RUN:   | filecheck %s --check-prefix=UNKNOWN-HLOFUSE
// UNKNOWN-HLOFUSE: hlofuse-opt: error: invalid pipeline: unknown hlofuse pass 'hlofuse-nope' (known: {{.*}}hlofuse-fuse-attention

// RUN: not hlofuse-opt %S/inputs/xla_dump_module.mlir --canonicalize=bogus=1 2>&1 | filecheck %s --check-prefix=OPTION
// OPTION: hlofuse-opt: error: invalid pipeline: {{.*}}no such option bogus

// RUN: not hlofuse-opt %S/inputs/xla_dump_module.mlir --pass-pipeline='builtin.module(cse' 2>&1 \
// RUN:   | filecheck %s --check-prefix=UNBALANCED
// UNBALANCED: hlofuse-opt: error: invalid pipeline: unbalanced

// RUN: not hlofuse-opt %S/inputs/xla_dump_module.mlir --cse --pass-pipeline='builtin.module(cse)' 2>&1 \
// RUN:   | filecheck %s --check-prefix=BOTH
// BOTH: hlofuse-opt: error: --pass-pipeline cannot be combined with pass flags such as --cse

// RUN: not hlofuse-opt %S/inputs/xla_dump_module.mlir -z 2>&1 | filecheck %s --check-prefix=USAGE
// USAGE: hlofuse-opt: error: unrecognized arguments: -z

// RUN: not hlofuse-opt %S/inputs/tanh_matmul.jax_export --split-input-file 2>&1 | filecheck %s --check-prefix=SPLIT-BINARY
// SPLIT-BINARY: tanh_matmul.jax_export: error: --split-input-file needs a text input
