// --compile-for=h100 compiles each kernel call, then the module, for the H100 target config shipped in
// hlofuse/gpu_targets (Triton, then ptxas) on a host without a GPU. A kernel the compiler rejects is an
// error with the compiler's own message, and the exit code is 1.
// REQUIRES: cuda-compiler
// RUN: hlofuse-opt %S/inputs/attention_f32.mlir --split-input-file --compile-for=h100 -o %t.mlir 2>&1 \
// RUN:   | filecheck %s
// RUN: not hlofuse-opt %S/inputs/triton_f32_h256_64x64.mlir --compile-for=h100 -o %t.mlir 2>&1 \
// RUN:   | filecheck %s --check-prefix=TOO-LARGE

// H = 64: compiles; registers and spills from ptxas, shared memory and grid from XLA's thunk sequence.
// CHECK: attention_f32.mlir:{{[0-9]+}}:{{[0-9]+}}: remark: h100: kernel hlofuse_flash_attention_gpu (__gpu$xla.gpu.triton) compiled: {{[0-9]+}} registers, spills 0 B stored / 0 B loaded, shared memory {{[0-9]+}} KiB, grid {{[0-9]+x[0-9]+x[0-9]+}} of 128 threads
// CHECK-NEXT: attention_f32.mlir: remark: h100: module compiled (1 kernel)

// H = 256 in f32: 64 x 64 tiles would need 256 KiB of shared memory (the H100 has 227 KiB per block), so the
// lowering takes 16 x 32 tiles for this chip (hlofuse.kernels.pallas.resources): 82 KiB, no spills.
// CHECK-NEXT: attention_f32.mlir:{{[0-9]+}}:{{[0-9]+}}: remark: h100: kernel hlofuse_flash_attention_gpu (__gpu$xla.gpu.triton) compiled: {{[0-9]+}} registers, spills 0 B stored / 0 B loaded, shared memory 82 KiB, grid 1x2x16 of 128 threads
// CHECK-NEXT: attention_f32.mlir: remark: h100: module compiled (1 kernel)
// CHECK-NOT: error

// A kernel lowered with explicit 64 x 64 tiles at f32, H = 256 (test/tools/inputs/generate.py): the compiler
// rejects it, with its own message.
// TOO-LARGE: triton_f32_h256_64x64.mlir:{{[0-9]+}}:{{[0-9]+}}: error: h100: kernel hlofuse_flash_attention_gpu (__gpu$xla.gpu.triton) failed: RESOURCE_EXHAUSTED: Shared memory size limit exceeded: requested 262144, available: 232448
// TOO-LARGE-NEXT: triton_f32_h256_64x64.mlir: error: h100: module failed (1 kernel): RESOURCE_EXHAUSTED: Shared memory size limit exceeded
