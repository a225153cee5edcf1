// The attention kernel compiled for avx2 (see CMakeLists.txt for this file's -m flags).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <immintrin.h>

#include "attention_kernel.h"

namespace hlofuse::cpu {
namespace avx2 {
namespace {
#include "vec_avx2.h"
#include "attention_impl.h"
}  // namespace
}  // namespace avx2

KernelTable Avx2Kernels() { return avx2::kernel_table("avx2"); }

}  // namespace hlofuse::cpu
