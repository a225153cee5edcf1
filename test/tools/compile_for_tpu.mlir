// --compile-for=tpu-v5e compiles each kernel call, then the module, with libtpu's own compiler (Mosaic
// for the kernel) on a host without a TPU, and prints one line per kernel with what it uses.
// REQUIRES: libtpu
// RUN: hlofuse-opt %S/inputs/attention_f32.mlir --split-input-file --compile-for=tpu-v5e -o %t 2>&1 \
// RUN:   | filecheck %s
// RUN: filecheck %s --check-prefix=IR < %t

// Both attentions lower to the Mosaic kernel (the default pipeline for the chip's kernels) and compile;
// each line gives the kernel's VMEM, with its double-buffered operand windows and its spills, the chip's
// VMEM and the bundle count.
// CHECK: attention_f32.mlir:{{[0-9]+}}:{{[0-9]+}}: remark: tpu-v5e: kernel hlofuse_flash_attention_tpu (tpu_custom_call) compiled: vmem {{[0-9.]+ (KiB|MiB)}} (windows {{[0-9.]+ (KiB|MiB)}}{{.*}}) of 128.0 MiB, {{[0-9]+}} bundles
// CHECK-NEXT: attention_f32.mlir: remark: tpu-v5e: module compiled (1 kernel)
// CHECK-NEXT: attention_f32.mlir:{{[0-9]+}}:{{[0-9]+}}: remark: tpu-v5e: kernel hlofuse_flash_attention_tpu (tpu_custom_call) compiled: vmem
// CHECK-NEXT: attention_f32.mlir: remark: tpu-v5e: module compiled (1 kernel)
// CHECK-NOT: error

// IR-LABEL: module @attention_f32_h64
// IR: stablehlo.custom_call @tpu_custom_call
// IR-LABEL: module @attention_f32_h256
// IR: stablehlo.custom_call @tpu_custom_call
