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

void TileItem(const AttentionArgs& args, const AttentionPlan& plan, int64_t item, float* scratch) {
  tile_item(args, plan, item, scratch);
}
void CombineItem(const AttentionArgs& args, const AttentionPlan& plan, int64_t item, float* scratch) {
  combine_item(args, plan, item, scratch);
}
int64_t ScratchSize(const AttentionArgs& args, const AttentionPlan& plan) { return scratch_floats(args, plan); }
}  // namespace
}  // namespace avx2

KernelTable Avx2Kernels() { return {"avx2", avx2::kW, avx2::TileItem, avx2::CombineItem, avx2::ScratchSize}; }

}  // namespace hlofuse::cpu
