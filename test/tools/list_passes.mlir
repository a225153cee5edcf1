// RUN: hlofuse-opt --list-passes | filecheck %s
// CHECK: hlofuse passes:
// CHECK-DAG: hlofuse-fuse-attention
// CHECK-DAG: hlofuse-lower-kernels
// CHECK-DAG: hlofuse-prepare
// CHECK: named pipelines:
// CHECK: default, hlofuse-default

// RUN: hlofuse-opt --help | filecheck %s --check-prefix=HELP
// HELP: usage: hlofuse-opt
// HELP-DAG: --split-input-file
// HELP-DAG: --pass-pipeline PIPELINE
// HELP-DAG: --hlofuse-fuse-attention
// HELP-DAG: --hlofuse-lower-kernels
// HELP-DAG: --canonicalize
// HELP-DAG: --cse
// HELP-DAG: --remarks
// HELP-DAG: --print-stats
// HELP-DAG: --emit-bytecode
// HELP-DAG: --mlir-print-debuginfo
// HELP: examples:

// RUN: hlofuse-opt --version | filecheck %s --check-prefix=VERSION
// VERSION: hlofuse-opt (hlofuse {{[0-9.]+}}, jax {{[0-9.]+}}, jaxlib {{[0-9.]+}})
