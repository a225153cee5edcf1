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

void TileItem(const AttentionArgs& args, const AttentionPlan& plan, int64_t item, float* scratch) {
  tile_item(args, plan, item, scratch);
}
void CombineItem(const AttentionArgs& args, const AttentionPlan& plan, int64_t item, float* scratch) {
  combine_item(args, plan, item, scratch);
}
int64_t ScratchSize(const AttentionArgs& args, const AttentionPlan& plan) { return scratch_floats(args, plan); }
}  // namespace
}  // namespace avx512

KernelTable Avx512Kernels() { return {"avx512", avx512::kW, avx512::TileItem, avx512::CombineItem, avx512::ScratchSize}; }

}  // namespace hlofuse::cpu
