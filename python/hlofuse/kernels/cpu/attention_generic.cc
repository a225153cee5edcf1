// The attention kernel compiled for generic (see CMakeLists.txt for this file's -m flags).
#include <cmath>
#include <cstdint>
#include <cstring>


#include "attention_kernel.h"

namespace hlofuse::cpu {
namespace generic {
namespace {
#include "vec_generic.h"
#include "attention_impl.h"

void TileItem(const AttentionArgs& args, const AttentionPlan& plan, int64_t item, float* scratch) {
  tile_item(args, plan, item, scratch);
}
void CombineItem(const AttentionArgs& args, const AttentionPlan& plan, int64_t item, float* scratch) {
  combine_item(args, plan, item, scratch);
}
int64_t ScratchSize(const AttentionArgs& args, const AttentionPlan& plan) { return scratch_floats(args, plan); }
}  // namespace
}  // namespace generic

KernelTable GenericKernels() { return {"generic", generic::kW, generic::TileItem, generic::CombineItem, generic::ScratchSize}; }

}  // namespace hlofuse::cpu
