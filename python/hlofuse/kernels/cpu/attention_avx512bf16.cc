// The attention kernel with AVX512-BF16 dot products for bf16 (see CMakeLists.txt for this file's -m
// flags): the AVX-512 body of attention_avx512.cc plus the bf16 tile products of the AMX kernel,
// computed with vdpbf16ps (dpbf16_tiles.h). f32 inputs and few-row tiles run exactly the AVX-512
// code. attention.cc picks it on CPUs with AVX512-BF16 and no usable AMX where it is measured faster
// than widening to f32 (AMD; see SelectKernels).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <immintrin.h>

#include "attention_kernel.h"

#define HLOFUSE_BF16_TILES 1

namespace hlofuse::cpu {
namespace avx512bf16 {
namespace {
#include "vec_avx512.h"
#include "bf16_tiles.h"
#include "dpbf16_tiles.h"
#include "attention_impl.h"
}  // namespace
}  // namespace avx512bf16

KernelTable Avx512Bf16Kernels() { return avx512bf16::kernel_table("avx512bf16"); }

}  // namespace hlofuse::cpu
