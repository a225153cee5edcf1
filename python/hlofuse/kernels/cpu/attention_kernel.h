// Shared, ISA-independent declarations of the hlofuse CPU attention kernel.
//
// attention.cc decodes the FFI call into AttentionArgs, plans the work (AttentionPlan) and runs
// the items of one ISA's KernelTable on XLA's intra-op thread pool. The ISA translation units
// (attention_amx.cc, attention_avx512bf16.cc, attention_avx512.cc, attention_avx2.cc,
// attention_generic.cc, and attention_amx_emulated.cc for tests) compile attention_impl.h with
// their own -m flags; only plain structs and function pointers cross between them, so no inline
// template compiled for one ISA can leak into another.
#pragma once

#include <cstdint>

namespace hlofuse::cpu {

enum class ElemType : int32_t { kF32 = 0, kBF16 = 1 };

struct AttentionArgs {
  // Shapes: q (B,T,N,H), k (B,S,K,H), v (B,S,K,D), out (B,T,N,D); N % K == 0.
  int64_t B, T, S, N, K, H, D;
  ElemType dtype;  // of q, k, v and out
  const void* q;
  const void* k;
  const void* v;
  void* out;
  // Optional operands (null when absent). Strides are in elements, 0 on a broadcast (size-1) dim.
  const void* bias;
  ElemType bias_dtype;
  int64_t bias_strides[4];  // (b, n, t, s)
  const uint8_t* mask;      // bool, nonzero = visible
  int64_t mask_strides[4];
  const int32_t* q_lengths;   // (B,)
  const int32_t* kv_lengths;  // (B,)
  const int32_t* q_offsets;   // (B,): each batch entry's q_offset (a key-range split's own), else q_offset
  float* lse;                 // (B,T,N) log-sum-exp of each row's logits, or null (issue 6: shards combine)
  // Attributes.
  float scale;
  float softcap;         // 0 = none
  float masked_value;    // -inf or finite
  int64_t window_left;   // -1 = unbounded
  int64_t window_right;  // -1 = unbounded; already 0 when causal
  int64_t q_offset;
};

struct AttentionPlan {
  int64_t width;           // vector lanes of the chosen ISA
  int64_t groups;          // G = N / K query heads per kv head
  int64_t tile_t;          // query positions per tile; a tile holds tile_t * G rows
  int64_t rows;            // M = tile_t * G
  int64_t rows_pad;        // Mp: M rounded up to the vector width
  int64_t d_pad;           // Dp: D rounded up to the vector width
  int64_t block_k;         // keys per block
  int64_t n_qtiles;        // ceil(T / tile_t)
  int64_t n_tiles;         // B * K * n_qtiles
  int64_t splits;          // key-range splits per tile (> 1: decode path, partials combined afterwards)
  int64_t partial_floats;  // per (tile, split) partial result: m, l, O
  float* partials;         // n_tiles * splits * partial_floats, or null when splits == 1
};

// Runs one work item: a (tile, split) pair, or a tile's combine step.
using ItemFn = void (*)(const AttentionArgs&, const AttentionPlan&, int64_t item, float* scratch);

struct KernelTable {
  const char* name;
  int64_t width;
  ItemFn tile;     // items: n_tiles * splits
  ItemFn combine;  // items: n_tiles (only when splits > 1)
  // Scratch floats per worker.
  int64_t (*scratch_floats)(const AttentionArgs&, const AttentionPlan&);
};

KernelTable GenericKernels();
#if defined(HLOFUSE_HAVE_X86_KERNELS)
KernelTable Avx2Kernels();
KernelTable Avx512Kernels();
KernelTable AmxEmulatedKernels();  // the AMX kernel with its tile instructions in software, for tests
#endif
#if defined(HLOFUSE_HAVE_AVX512BF16_KERNEL)
KernelTable Avx512Bf16Kernels();  // bf16 products with vdpbf16ps; only where attention.cc's CpuHasAvx512Bf16() holds
#endif
#if defined(HLOFUSE_HAVE_AMX_KERNEL)
KernelTable AmxKernels();  // bf16 products on AMX tiles; only where attention.cc's CpuHasAmx() holds
#endif

}  // namespace hlofuse::cpu
