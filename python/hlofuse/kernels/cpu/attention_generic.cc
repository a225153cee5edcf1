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
}  // namespace
}  // namespace generic

KernelTable GenericKernels() { return generic::kernel_table("generic"); }

}  // namespace hlofuse::cpu
