// The attention kernel compiled for avx512 (see CMakeLists.txt for this file's -m flags).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <immintrin.h>

#include "attention_kernel.h"

namespace hlofuse::cpu {
namespace avx512 {
namespace {
#include "vec_avx512.h"
#include "attention_impl.h"
}  // namespace
}  // namespace avx512

KernelTable Avx512Kernels() { return avx512::kernel_table("avx512"); }

}  // namespace hlofuse::cpu
