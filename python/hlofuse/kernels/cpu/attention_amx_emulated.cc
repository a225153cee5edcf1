// The AMX kernel with its tile instructions emulated in software (amx_emulation.h): exactly the code
// of attention_amx.cc, built with AVX-512 flags only, so it runs wherever the AVX-512 kernel does.
// It exists to test the AMX kernel's tile code on CPUs without AMX; it is slow and never picked
// unless HLOFUSE_CPU_ISA=amx-emulated names it.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <immintrin.h>

#include "attention_kernel.h"

#define HLOFUSE_BF16_TILES 1

namespace hlofuse::cpu {
namespace amx_emulated {
namespace {
#include "vec_avx512.h"
#include "bf16_tiles.h"
#include "amx_emulation.h"
#include "amx_tiles.h"
#include "attention_impl.h"
}  // namespace
}  // namespace amx_emulated

KernelTable AmxEmulatedKernels() { return amx_emulated::kernel_table("amx-emulated"); }

}  // namespace hlofuse::cpu
