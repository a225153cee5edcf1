// The attention kernel with AMX tiles for bf16 (see CMakeLists.txt for this file's -m flags): the
// AVX-512 body of attention_avx512.cc plus AMX products for bf16 tiles (amx_tiles.h). f32 inputs and
// few-row tiles run exactly the AVX-512 code. attention.cc picks it only when cpuid reports AMX-BF16
// and the kernel grants this process the tile state (Linux: arch_prctl ARCH_REQ_XCOMP_PERM).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <immintrin.h>

#include "attention_kernel.h"

#define HLOFUSE_BF16_TILES 1

namespace hlofuse::cpu {
namespace amx {
namespace {
#include "vec_avx512.h"
#include "bf16_tiles.h"
#include "amx_tiles.h"
#include "attention_impl.h"
}  // namespace
}  // namespace amx

KernelTable AmxKernels() { return amx::kernel_table("amx"); }

}  // namespace hlofuse::cpu
