// hlofuse_sample: token sampling over (rows, V) logits without sorting the vocabulary.
//
// Returns the token ids of hlofuse.kernels.sampling_reference for each form (sampling.py's FORM_CODES).
// The filters find their threshold without a sort (a k-element heap behind a threshold test for
// top-k; a histogram of probability mass by distance from the row max, then a quickselect inside the
// one bin where the cumulative mass reaches p, for top-p). Gumbel-max then draws noise only where it
// can change the winner: JAX's f32 Gumbel noise is bounded (uniform u < 1), so a token whose
// y + gmax rounds below the best score so far cannot win and gets no threefry at all, and a token
// whose 12 leading random bits bound its noise below what it needs gets no log. The noise that is
// drawn comes from threefry2x32 at JAX's counters (the flat index of the noise element), computed
// 16 / 8 / 4 counters at a time by the ISA chosen at run time, with the same float steps as JAX.
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <queue>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "sampling_simd.h"
#include "xla/ffi/api/ffi.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ffi = xla::ffi;

namespace hlofuse::cpu {
namespace {

enum class Form : int64_t {
  kGreedy = 0,
  kTemperature = 1,
  kTopK = 2,
  kTemperatureTopK = 3,
  kTopKMask = 4,
  kTopPMask = 5,
  kTopKTopPMask = 6,
  kMinP = 7,
  // Rank-space top-k over packed candidates: each row is C (value, id) pairs as f32 words, the id's int32
  // bits in the second word (the vocabulary splits' top-k candidates, gathered as one array). The values
  // round as f32 (8) or as bf16 (9: bf16 logits widened to f32 by hlofuse_sample_top_k).
  kTopKPacked = 8,
  kTopKPackedBf16 = 9,
  // argmax(softmax(x)): argmax(x) where the softmax cannot tie another token with the max, else kUncertified.
  kGreedySoftmax = 10,
  // top_p_mask's draw for a nucleus whose program sums its cumsum from the smallest and cuts by sorted place
  // (Hugging Face's `cumsum <= 1 - p`, with p the mass kept): its band's slack from the 1 - p the cumsum reaches.
  kTopPMaskFromBelow = 11,
  // categorical with the noise scaled instead of the logits: argmax(x + gumbel * T) (Pax's draw), f32 only.
  kCategoricalNoiseScaled = 12,
  // kCategoricalNoiseScaled with a scale per row (Pax's per-request temperature, (B, 1)): the optional operand is
  // the rows' scales, (*L,) f32, each >= 0 (0: argmax(x + 0), the row's greedy token), f32 only, no splits.
  kCategoricalNoiseScaledRows = 13,
  // top_p_mask (14) and top_p_mask_from_below (15) for a draw from the nucleus's log-probabilities (a categorical of
  // log_softmax(y) or of log(softmax(y)), jax.random.choice's top_k(gumbel + log p)), f32 only: drawn over y = x / T,
  // which differs from the log-probabilities by the normaliser, the same for every token up to rounding; the winner is
  // vouched for only where it also leads the runner-up by more than that rounding (`LeadsPastRounding`).
  kTopPMaskLogProb = 14,
  kTopPMaskFromBelowLogProb = 15,
};

// A row's token the kernel cannot vouch for (greedy_softmax near a tie, a nucleus draw in its band): the binding
// recomputes such rows.
constexpr int64_t kUncertified = -1;

bool IsPacked(int64_t form) {
  return form == static_cast<int64_t>(Form::kTopKPacked) || form == static_cast<int64_t>(Form::kTopKPackedBf16);
}

bool IsLogProb(Form form) { return form == Form::kTopPMaskLogProb || form == Form::kTopPMaskFromBelowLogProb; }

constexpr float kTiny = 1.17549435e-38f;  // finfo(f32).tiny == finfo(bf16).tiny
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

//===--- Floats ----------------------------------------------------------------------------===//

float Bf16ToF32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to the nearest bf16 (ties to even), as XLA rounds each bf16 op's f32 result.
float RoundBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return f;  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  bits &= 0xffff0000u;
  std::memcpy(&f, &bits, 4);
  return f;
}

// An order-preserving map of floats to integers (-0 and +0 share 0), and back.
int32_t OrderKey(float f) {
  int32_t i;
  std::memcpy(&i, &f, 4);
  return i >= 0 ? i : std::numeric_limits<int32_t>::min() - i;
}
float FromOrderKey(int32_t k) {
  const uint32_t bits = k >= 0 ? static_cast<uint32_t>(k) : 0x80000000u | static_cast<uint32_t>(-k);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The key that orders floats as jnp.sort's comparator does: -0 and +0 equal, NaN (any) after +inf.
uint32_t AscendingKey(float x) {
  if (std::isnan(x)) return 0xFFFFFFFFu;
  if (x == 0.0f) x = 0.0f;
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// The key that orders floats as lax.top_k does, first to last: XLA's total order reversed, so +NaN (the larger
// payload first), +inf, ..., +0, -0, ..., -inf, -NaN.
uint32_t DescendingKey(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return ~((bits & 0x80000000u) ? ~bits : (bits | 0x80000000u));
}

//===--- ISA selection and the vector loops --------------------------------------------------===//

struct SimdOps {
  const char* name;
  void (*threefry)(uint32_t k0, uint32_t k1, uint64_t base, const int32_t* idx, uint32_t* out, int64_t n);
  double (*exp_shifted)(const float* x, float m, float* w, int64_t n, float* bins, float bin_scale, float last_bin);
  float (*max_of)(const float* x, int64_t n, bool* nan);
  int64_t (*find_first)(const float* x, int64_t n, float value, bool nan);
  float (*scale_max)(const float* x, float t, bool bf16, float* y, int64_t n);
  int64_t (*collect_range)(const float* v, float lo, float hi, int64_t begin, int64_t end, int32_t* out);
};

constexpr int kMaxLanes = 16;

#define HLOFUSE_SIMD_OPS(NAME, LANES, TARGET)                                                                         \
  TARGET void NAME##Threefry(uint32_t k0, uint32_t k1, uint64_t base, const int32_t* idx, uint32_t* out, int64_t n) { \
    sampling_simd::Threefry<LANES>(k0, k1, base, idx, out, n);                                                        \
  }                                                                                                                   \
  TARGET double NAME##ExpShifted(const float* x, float m, float* w, int64_t n, float* bins, float bin_scale,          \
                                 float last_bin) {                                                                    \
    return sampling_simd::ExpShifted<LANES>(x, m, w, n, bins, bin_scale, last_bin);                                   \
  }                                                                                                                   \
  TARGET float NAME##MaxOf(const float* x, int64_t n, bool* nan) { return sampling_simd::MaxOf<LANES>(x, n, nan); }   \
  TARGET int64_t NAME##FindFirst(const float* x, int64_t n, float value, bool nan) {                                  \
    return sampling_simd::FindFirst<LANES>(x, n, value, nan);                                                         \
  }                                                                                                                   \
  TARGET float NAME##ScaleMax(const float* x, float t, bool bf16, float* y, int64_t n) {                              \
    return sampling_simd::ScaleMax<LANES>(x, t, bf16, y, n);                                                          \
  }                                                                                                                   \
  constexpr SimdOps k##NAME##Ops{#NAME,           NAME##Threefry, NAME##ExpShifted,      NAME##MaxOf,                 \
                                 NAME##FindFirst, NAME##ScaleMax, NAME##CollectRangeMask};

// CollectRange with the ISA's compare-to-bitmask (GCC lowers vector-extension float compares of 16
// lanes lane by lane): the indices of the set bits are written in order.
#if defined(__x86_64__)
#define HLOFUSE_COLLECT_RANGE(NAME, TARGET, LANES, VEC, LOAD, SET1, MASK)                               \
  TARGET int64_t NAME##CollectRangeMask(const float* v, float lo, float hi, int64_t begin, int64_t end, \
                                        int32_t* out) {                                                 \
    /* x >= top holds only for x == +inf == hi */                                                       \
    const float top = hi == kPosInf ? hi : std::numeric_limits<float>::quiet_NaN();                     \
    const VEC lo_v = SET1(lo), hi_v = SET1(hi), top_v = SET1(top);                                      \
    int64_t count = 0, i = begin;                                                                       \
    for (; i + LANES <= end; i += LANES) {                                                              \
      const VEC x = LOAD(v + i);                                                                        \
      uint32_t bits = MASK(x, lo_v, hi_v, top_v);                                                       \
      while (bits) {                                                                                    \
        out[count++] = static_cast<int32_t>(i + __builtin_ctz(bits));                                   \
        bits &= bits - 1;                                                                               \
      }                                                                                                 \
    }                                                                                                   \
    for (; i < end; ++i) {                                                                              \
      out[count] = static_cast<int32_t>(i);                                                             \
      count += v[i] >= lo && (v[i] < hi || v[i] >= top);                                                \
    }                                                                                                   \
    return count;                                                                                       \
  }

#define HLOFUSE_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#define HLOFUSE_TARGET_AVX2 __attribute__((target("avx2,fma")))
HLOFUSE_TARGET_AVX512 inline uint32_t Avx512RangeMask(__m512 x, __m512 lo, __m512 hi, __m512 top) {
  return _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ) &
         (_mm512_cmp_ps_mask(x, hi, _CMP_LT_OQ) | _mm512_cmp_ps_mask(x, top, _CMP_GE_OQ));
}
HLOFUSE_TARGET_AVX2 inline uint32_t Avx2RangeMask(__m256 x, __m256 lo, __m256 hi, __m256 top) {
  const __m256 in = _mm256_and_ps(_mm256_cmp_ps(x, lo, _CMP_GE_OQ),
                                  _mm256_or_ps(_mm256_cmp_ps(x, hi, _CMP_LT_OQ), _mm256_cmp_ps(x, top, _CMP_GE_OQ)));
  return static_cast<uint32_t>(_mm256_movemask_ps(in));
}
inline uint32_t Sse2RangeMask(__m128 x, __m128 lo, __m128 hi, __m128 top) {
  const __m128 in = _mm_and_ps(_mm_cmpge_ps(x, lo), _mm_or_ps(_mm_cmplt_ps(x, hi), _mm_cmpge_ps(x, top)));
  return static_cast<uint32_t>(_mm_movemask_ps(in));
}
HLOFUSE_COLLECT_RANGE(avx512, HLOFUSE_TARGET_AVX512, 16, __m512, _mm512_loadu_ps, _mm512_set1_ps, Avx512RangeMask)
HLOFUSE_COLLECT_RANGE(avx2Tail, HLOFUSE_TARGET_AVX2, 8, __m256, _mm256_loadu_ps, _mm256_set1_ps, Avx2RangeMask)
HLOFUSE_COLLECT_RANGE(generic, , 4, __m128, _mm_loadu_ps, _mm_set1_ps, Sse2RangeMask)
#undef HLOFUSE_COLLECT_RANGE

// For each 8-lane mask, the lanes of its set bits in order (then zeros): AVX2 has no compress, so a block's hits
// are written as the block's start plus its mask's row.
struct LanesOfMask {
  alignas(32) int32_t lanes[256][8];
};
constexpr LanesOfMask MakeLanesOfMask() {
  LanesOfMask t{};
  for (int mask = 0; mask < 256; ++mask) {
    int hits = 0;
    for (int lane = 0; lane < 8; ++lane)
      if (mask >> lane & 1) t.lanes[mask][hits++] = lane;
  }
  return t;
}
constexpr LanesOfMask kLanesOfMask = MakeLanesOfMask();

// CollectRange for AVX2 without a branch per hit: each block with a hit stores all 8 of its table row's ids and
// advances by the hits (a bit loop mispredicts on every block where hits are neither rare nor all). The 8 ids
// land at out[count, count + 8), count <= i - begin; while i + 16 <= end that is inside the caller's room
// (end - begin + 1), and the last blocks go through the bit loop.
__attribute__((target("avx2,fma,popcnt"))) int64_t avx2CollectRangeMask(const float* v, float lo, float hi,
                                                                        int64_t begin, int64_t end, int32_t* out) {
  const float top = hi == kPosInf ? hi : std::numeric_limits<float>::quiet_NaN();  // x >= top: x == +inf == hi
  const __m256 lo_v = _mm256_set1_ps(lo), hi_v = _mm256_set1_ps(hi), top_v = _mm256_set1_ps(top);
  int64_t count = 0, i = begin;
  for (; i + 16 <= end; i += 8) {
    const uint32_t bits = Avx2RangeMask(_mm256_loadu_ps(v + i), lo_v, hi_v, top_v);
    if (bits == 0) continue;
    const __m256i lanes = _mm256_load_si256(reinterpret_cast<const __m256i*>(kLanesOfMask.lanes[bits]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + count),
                        _mm256_add_epi32(lanes, _mm256_set1_epi32(static_cast<int32_t>(i))));
    count += __builtin_popcount(bits);
  }
  return count + avx2TailCollectRangeMask(v, lo, hi, i, end, out + count);
}
#else
int64_t genericCollectRangeMask(const float* v, float lo, float hi, int64_t begin, int64_t end, int32_t* out) {
  return sampling_simd::CollectRange<4>(v, lo, hi, begin, end, out);
}
#endif

#define HLOFUSE_NO_TARGET
HLOFUSE_SIMD_OPS(generic, 4, HLOFUSE_NO_TARGET)
#if defined(__x86_64__)
HLOFUSE_SIMD_OPS(avx2, 8, HLOFUSE_TARGET_AVX2)
HLOFUSE_SIMD_OPS(avx512, 16, HLOFUSE_TARGET_AVX512)
#endif
#undef HLOFUSE_SIMD_OPS
#undef HLOFUSE_NO_TARGET

// How wide HLOFUSE_CPU_ISA lets the sampler go: generic 0, avx2 1, anything wider (avx512, and the
// attention kernel's avx512bf16 and amx, which share the variable) or unset 2.
int IsaCap(std::string_view want) {
  if (want == "generic") return 0;
  if (want == "avx2") return 1;
  return 2;
}

// The widest ISA this CPU runs; HLOFUSE_CPU_ISA=avx2|generic asks for a lower one.
const SimdOps& SelectOps() {
  const char* env = std::getenv("HLOFUSE_CPU_ISA");
  const int cap = IsaCap(env ? env : "");
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && cap >= 2)
    return kavx512Ops;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cap >= 1) return kavx2Ops;
#endif
  return kgenericOps;
}

//===--- Gumbel noise ----------------------------------------------------------------------===//

inline uint32_t Rotl(uint32_t v, int r) { return (v << r) | (v >> (32 - r)); }

// threefry2x32 (20 rounds) of the counter (hi, lo) under key (k0, k1): JAX's random bits at flat
// index hi:lo are out[0] ^ out[1]. The scalar twin of sampling_simd::Threefry, for tests of the lanes.
uint32_t ThreefryBits(uint32_t k0, uint32_t k1, uint64_t counter) {
  static constexpr int kRot[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};
  const uint32_t ks[3] = {k0, k1, k0 ^ k1 ^ 0x1BD11BDAu};
  uint32_t x0 = static_cast<uint32_t>(counter >> 32) + ks[0];
  uint32_t x1 = static_cast<uint32_t>(counter) + ks[1];
  for (int block = 0; block < 5; ++block) {
    for (int r = 0; r < 4; ++r) {
      x0 += x1;
      x1 = Rotl(x1, kRot[block % 2][r]) ^ x0;
    }
    x0 += ks[(block + 1) % 3];
    x1 += ks[(block + 2) % 3] + static_cast<uint32_t>(block + 1);
  }
  return x0 ^ x1;
}

// jax.random.gumbel's f32 steps on 23 random mantissa bits: -log(-log(uniform(tiny, 1))).
float GumbelF32(uint32_t mantissa) {
  uint32_t fbits = mantissa | 0x3f800000u;
  float f;
  std::memcpy(&f, &fbits, 4);
  const float u = std::max(kTiny, (f - 1.0f) * 1.0f + kTiny);
  return -std::log(-std::log(u));
}

// bf16: 8 random bits, 7 of them into the mantissa; every op rounds to bf16 (XLA does).
float GumbelBf16(uint32_t bits) {
  const uint16_t mant = static_cast<uint16_t>(((bits & 0xffu) >> 1) | 0x3f80u);
  const float f = Bf16ToF32(mant) - 1.0f;
  const float u = std::max(kTiny, RoundBf16(f + kTiny));
  return -RoundBf16(std::log(-RoundBf16(std::log(u))));
}

// Whether a noise `zero` at a zero uniform keeps the noise monotone in the mantissa (the bucket bounds hold): at most
// the noise of mantissa 1, as every hand-written -log(-log(u + eps) + eps) whose eps leaves u > 0 alone is; and
// finite, or -inf: -log(-log(u)) with no guard, whose token of u = 0 scores -inf, or NaN for a logit of +inf, which
// argmax would take (the rows where that decides are left UNCERTIFIED, in `Sample`).
bool ZeroNoiseFits(float zero) { return (std::isfinite(zero) || zero == kNegInf) && zero <= GumbelF32(1); }

// Bounds of the noise, computed once with the same float steps as the noise itself.
struct NoiseTables {
  static constexpr int kBucketBits = 12;  // f32 noise bucketed by its leading random bits
  float f32_upper[1 << kBucketBits];      // the largest noise of any mantissa in the bucket, plus margin
  float bf16[128];                        // bf16 noise has 128 values: all of them, exactly
  float f32_max = 0, bf16_max = kNegInf;

  NoiseTables() {
    // The noise grows with the mantissa; the margin (>> the 1-ulp non-monotonicity a libm log may
    // have) keeps each bucket's bound above every value inside it.
    constexpr int kShift = 23 - kBucketBits;
    for (uint32_t b = 0; b < (1u << kBucketBits); ++b) f32_upper[b] = GumbelF32(((b + 1) << kShift) - 1) + 1e-3f;
    f32_max = f32_upper[(1 << kBucketBits) - 1];
    for (uint32_t v = 0; v < 128; ++v) bf16[v] = GumbelBf16(v << 1), bf16_max = std::max(bf16_max, bf16[v]);
  }
};

const NoiseTables& Tables() {
  static const NoiseTables tables;
  return tables;
}

//===--- Candidates and the Gumbel bound ----------------------------------------------------===//

// Keeps the best `score` with the lowest index on ties; -inf scores still win over nothing.
struct Best {
  int64_t index = -1;
  float score = kNegInf;
  void Offer(int64_t i, float s) {
    if (index < 0 || s > score || (s == score && i < index)) index = i, score = s;
  }
};

// Counts what the bound saved, for tests (hlofuse_sample_stats).
std::atomic<int64_t> g_noise_draws{0}, g_noise_logs{0};

// argmax_i(round(gumbel[base + idx_i] + y_i)) over the offered (idx, y), lowest idx on ties. Offers are
// buffered; a candidate that cannot beat the best so far even with the largest noise is dropped before
// its threefry, and one whose bucket bound cannot beat it is dropped before its logs.
class GumbelArgmax {
 public:
  static constexpr int kChunk = 256;  // a multiple of every ISA's lanes

  // `zero_noise`: the f32 noise where the uniform is 0 (all 23 mantissa bits 0), for a hand-written Gumbel noise
  // (-log(-log(u + eps) + eps) has -log(-log(eps)) there, JAX's -log(-log(tiny))), at most the bucket-0 bound (the
  // caller checks, `ZeroNoiseFits`). `start`: a best already found elsewhere (the argmax is then over its candidate
  // too). `noise_scale`: the score is round(y + round(gumbel * noise_scale)) (f32 only), as Pax draws argmax(x +
  // gumbel * T).
  GumbelArgmax(const SimdOps& ops, uint32_t k0, uint32_t k1, uint64_t base, bool bf16, float zero_noise,
               Best start = {}, float noise_scale = 1.0f)
      : ops_(ops),
        tables_(Tables()),
        k0_(k0),
        k1_(k1),
        base_(base),
        bf16_(bf16),
        zero_noise_(zero_noise),
        noise_scale_(noise_scale),
        gmax_(bf16 ? tables_.bf16_max : Scaled(tables_.f32_max)),
        best_(start) {
    if (best_.index >= 0) Raise(best_.score);
  }

  float Round(float f) const { return bf16_ ? RoundBf16(f) : f; }

  // The smallest y that may still win: round(y + gmax) >= bound (y >= -inf until a first score).
  float threshold() const { return threshold_; }

  // A score some token elsewhere reaches: nothing scoring below it can be the argmax.
  float bound() const { return bound_; }
  void Raise(float score) {
    if (score > bound_) bound_ = score, UpdateThreshold();
  }

  void Offer(int64_t i, float y) {
    if (!(y >= threshold_)) return;
    idx_[n_] = static_cast<int32_t>(i);
    y_[n_++] = y;
    if (n_ == kChunk) Flush();
  }

  void Flush() {
    if (n_ == 0) return;
    const int64_t padded = (n_ + kMaxLanes - 1) / kMaxLanes * kMaxLanes;
    for (int64_t j = n_; j < padded; ++j) idx_[j] = 0;
    ops_.threefry(k0_, k1_, base_, idx_, bits_, padded);
    int64_t logs = 0;
    for (int64_t j = 0; j < n_; ++j) {
      const float y = y_[j];
      float score;
      if (bf16_) {
        score = RoundBf16(tables_.bf16[(bits_[j] & 0xffu) >> 1] + y);
      } else {
        if (Scaled(tables_.f32_upper[bits_[j] >> (32 - NoiseTables::kBucketBits)]) + y < bound_) continue;
        ++logs;
        const uint32_t mantissa = bits_[j] >> 9;
        score = Scaled(mantissa == 0 ? zero_noise_ : GumbelF32(mantissa)) + y;
      }
      best_.Offer(idx_[j], score);
      bound_ = best_.score > bound_ ? best_.score : bound_;
    }
    g_noise_draws.fetch_add(n_, std::memory_order_relaxed);
    g_noise_logs.fetch_add(logs, std::memory_order_relaxed);
    n_ = 0;
    UpdateThreshold();
  }

  const Best& best() {
    Flush();
    return best_;
  }

 private:
  // Binary search over the float order for the smallest y with round(y + gmax) >= bound (monotone in y).
  void UpdateThreshold() {
    if (!(bound_ > kNegInf)) return;
    int32_t lo = OrderKey(kNegInf), hi = OrderKey(kPosInf);  // pred(hi) holds: inf + gmax = inf
    while (lo < hi) {
      const int32_t mid = static_cast<int32_t>((static_cast<int64_t>(lo) + hi) >> 1);  // floor
      if (Round(FromOrderKey(mid) + gmax_) >= bound_) hi = mid;
      else lo = mid + 1;
    }
    threshold_ = FromOrderKey(lo);
  }

  // f32 noise times the scale (times 1: the noise itself); monotone in the noise for a scale > 0.
  float Scaled(float g) const { return noise_scale_ == 1.0f ? g : g * noise_scale_; }

  const SimdOps& ops_;
  const NoiseTables& tables_;
  uint32_t k0_, k1_;
  uint64_t base_;
  bool bf16_;
  float zero_noise_;
  float noise_scale_;
  float gmax_;
  Best best_;
  float bound_ = kNegInf;
  float threshold_ = kNegInf;
  int64_t n_ = 0;
  alignas(64) int32_t idx_[kChunk];
  alignas(64) uint32_t bits_[kChunk];
  float y_[kChunk];
};

//===--- Row helpers -----------------------------------------------------------------------===//

struct Params {
  Form form;
  float temperature;  // already in the logits' dtype
  int64_t k;
  float p;
  float min_p;
};

// Every full-vocabulary pass runs over fixed chunks of the row whose partial results (max, f64 sums,
// histograms, best candidates) are combined in chunk order: the same arithmetic whether the chunks run
// one after another (rows in parallel) or on several threads (fewer rows than threads), so the token ids
// never depend on the thread count.
constexpr int64_t kChunkTokens = 32768;
int64_t NumChunks(int64_t n) { return (n + kChunkTokens - 1) / kChunkTokens; }

// Runs fn(0..n-1): in order on the calling thread, or on the pool when a row's chunks are split.
using ForEach = std::function<void(int64_t, const std::function<void(int64_t)>&)>;

// One row: its logits as f32 (bf16 widened exactly), and scratch the size of the row.
struct Row {
  const float* x;
  int64_t n;
  bool bf16;
  float zero_noise;  // the f32 Gumbel noise where the uniform is 0 (GumbelArgmax)
  float* y;          // scratch: the scaled logits
  float* w;          // scratch: exp(x - max)
  float* bins;       // scratch: histogram bins
  int32_t* ids;      // scratch: candidate indices (n + chunks + 1)
  const ForEach* each;
  float Round(float f) const { return bf16 ? RoundBf16(f) : f; }
  int64_t chunks() const { return NumChunks(n); }
  int64_t begin(int64_t c) const { return c * kChunkTokens; }
  int64_t end(int64_t c) const { return std::min(n, (c + 1) * kChunkTokens); }
  int32_t* ids_of(int64_t c) const { return ids + begin(c) + c; }  // room for end - begin + 1
  // Runs fn(c) for every chunk, on the pool when the row is split.
  void ForChunks(const std::function<void(int64_t)>& fn) const { (*each)(chunks(), fn); }
};

// y = x / T into r.y (ScaleMax), chunked; returns max y, or NaN where some y is NaN.
float ScaleMaxRow(const SimdOps& ops, const Row& r, float t) {
  std::vector<float> part(r.chunks());
  r.ForChunks([&](int64_t c) {
    part[c] = ops.scale_max(r.x + r.begin(c), t, r.bf16, r.y + r.begin(c), r.end(c) - r.begin(c));
  });
  float m = kNegInf;
  bool nan = false;
  for (float v : part) m = v > m ? v : m, nan |= std::isnan(v);
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

// The first NaN of y, which argmax(y + noise) takes whatever the noise: the draw of a row with a NaN.
Best FirstNaN(const SimdOps& ops, const Row& r, const float* y) {
  return Best{ops.find_first(y, r.n, 0.0f, true), std::numeric_limits<float>::quiet_NaN()};
}

// max(v) over the row (NaN ignored), chunked; *nan says whether v has a NaN.
float MaxRow(const SimdOps& ops, const Row& r, const float* v, bool* nan) {
  std::vector<float> part(r.chunks());
  std::vector<char> part_nan(r.chunks());
  r.ForChunks([&](int64_t c) {
    bool chunk_nan = false;
    part[c] = ops.max_of(v + r.begin(c), r.end(c) - r.begin(c), &chunk_nan);
    part_nan[c] = chunk_nan;
  });
  float m = kNegInf;
  *nan = false;
  for (int64_t c = 0; c < r.chunks(); ++c) m = part[c] > m ? part[c] : m, *nan |= part_nan[c] != 0;
  return m;
}

// y = x / T for a draw, and max y (NaN where y has a NaN): f32 x itself at T = 1, where x / 1 is x bit for bit (one
// read-only pass for the max, no copy), else ScaleMaxRow's r.y.
const float* ScaledRow(const SimdOps& ops, const Row& r, float t, float* ymax) {
  if (t == 1.0f && !r.bf16) {
    bool nan = false;
    const float m = MaxRow(ops, r, r.x, &nan);
    *ymax = nan ? std::numeric_limits<float>::quiet_NaN() : m;
    return r.x;
  }
  *ymax = ScaleMaxRow(ops, r, t);
  return r.y;
}

// First index of the largest value; NaN counts as largest (jnp.argmax). Its score is the value itself
// (NaN if the row has one), so that splits of a row merge by the same argmax.
Best ArgMax(const SimdOps& ops, const Row& r) {
  bool nan = false;
  const float m = MaxRow(ops, r, r.x, &nan);
  const int64_t i = ops.find_first(r.x, r.n, m, nan);
  Best best;
  best.index = i < r.n ? i : 0;
  best.score = r.x[best.index];
  return best;
}

// argmax(softmax(x)) as jax.nn.softmax computes it, exp(x - max) / sum: the max's probability is round(1 / sum)
// and a token `margin` or more below it has exp(x - max) at most 1 - margin, whose quotient rounds below
// the max's (margin: 2^-17 for f32, 2^-5 for bf16, many units of rounding and of exp's error). Copies of the
// max come after its first index and tie it in both. So the answer is argmax(x) unless a token lies less
// than the margin below the max, or the max is NaN or +inf: then kUncertified.
Best ArgMaxOfSoftmax(const SimdOps& ops, const Row& r) {
  const Best best = ArgMax(ops, r);
  // NaN or +inf make every probability NaN (index 0); a row of -inf is NaN too, and argmax(x) is 0 as well.
  if (std::isnan(best.score) || best.score == kPosInf) return Best{kUncertified, best.score};
  if (best.score == kNegInf) return best;
  const float margin = r.bf16 ? 0x1p-5f : 0x1p-17f;               // as sampling_reference.SOFTMAX_TIE_MARGIN
  const float lo = std::nextafter(best.score - margin, kPosInf);  // collect_range takes lo <= x < hi
  constexpr int64_t kBlock = 4096;
  int64_t near = 0;
  for (int64_t i = 0; i < r.n && near == 0; i += kBlock)
    near = ops.collect_range(r.x, lo, best.score, i, std::min(r.n, i + kBlock), r.ids);
  return near == 0 ? best : Best{kUncertified, best.score};
}

// The winner of a Gumbel argmax: index 0 at score -inf when nothing scored above -inf (argmax of an
// all -inf row picks index 0, and a split holding such a winner must lose every merge it can lose).
Best Winner(const Best& best) {
  if (best.index < 0 || best.score == kNegInf) return Best{0, kNegInf};
  return best;
}

// The top `k` (value descending, index ascending on ties) of v[0..n). Indices grow during the scan, so
// a value enters the full heap only if it is strictly above the heap's worst; the scan collects those
// in vector blocks. *has_nan (if given) says whether v has a NaN.
std::vector<std::pair<float, int64_t>> TopK(const SimdOps& ops, const float* v, int64_t n, int64_t k, int32_t* ids,
                                            bool* has_nan = nullptr) {
  // lax.top_k's order: XLA's total order (+0 above -0) descending, the lower index first among equal values.
  auto before = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
    const uint32_t ka = DescendingKey(a.first), kb = DescendingKey(b.first);
    return ka < kb || (ka == kb && a.second < b.second);
  };
  // A row with a NaN is ordered in full by `before` (+NaN first by payload, -NaN last, as lax.top_k): the heap
  // below never sees one.
  const bool any_nan = ops.find_first(v, n, 0.0f, true) < n;
  if (has_nan != nullptr) *has_nan = any_nan;
  if (any_nan) {
    std::vector<std::pair<float, int64_t>> all;
    all.reserve(n);
    for (int64_t i = 0; i < n; ++i) all.emplace_back(v[i], i);
    const int64_t keep = std::min(k, n);
    std::partial_sort(all.begin(), all.begin() + keep, all.end(), before);
    all.resize(keep);
    return all;
  }
  std::priority_queue<std::pair<float, int64_t>, std::vector<std::pair<float, int64_t>>, decltype(before)> heap(before);
  int64_t i = 0;
  for (; i < n && static_cast<int64_t>(heap.size()) < k; ++i) heap.emplace(v[i], i);
  constexpr int64_t kBlock = 1024;
  for (; i < n; i += kBlock) {
    const float worst = heap.top().first;
    // above worst: the open interval (worst, inf] as [nextafter(worst), inf], and +0 above a worst of -0
    const float lo = worst == 0.0f && std::signbit(worst) ? 0.0f : std::nextafter(worst, kPosInf);
    const int64_t found = ops.collect_range(v, lo, kPosInf, i, std::min(n, i + kBlock), ids);
    for (int64_t j = 0; j < found; ++j) {
      const int64_t at = ids[j];
      if (!before({v[at], at}, heap.top())) continue;
      heap.pop();
      heap.emplace(v[at], at);
    }
  }
  std::vector<std::pair<float, int64_t>> out;
  while (!heap.empty()) out.push_back(heap.top()), heap.pop();
  std::reverse(out.begin(), out.end());
  return out;
}

// The first rank of `top` holding a NaN, or -1: a NaN rank scores NaN whatever its noise, and argmax takes the
// first NaN.
int64_t FirstNaNRank(const std::vector<std::pair<float, int64_t>>& top) {
  for (int64_t i = 0; i < static_cast<int64_t>(top.size()); ++i)
    if (std::isnan(top[i].first)) return i;
  return -1;
}

// Over (value, mass) candidates: the largest value v with (above + mass(value >= v)) / z >= target, by
// three-way quickselect around pivots (no sort); -inf if even all of them stay below the target.
float SelectCutoff(std::vector<std::pair<float, double>>& cand, double above, double z, double target) {
  size_t begin = 0, end = cand.size();
  while (begin < end) {
    const float pivot = cand[begin + (end - begin) / 2].first;
    auto gt = std::partition(cand.begin() + begin, cand.begin() + end, [&](const auto& c) { return c.first > pivot; });
    auto eq = std::partition(gt, cand.begin() + end, [&](const auto& c) { return c.first == pivot; });
    double upper = 0, equal = 0;
    for (auto it = cand.begin() + begin; it != gt; ++it) upper += it->second;
    for (auto it = gt; it != eq; ++it) equal += it->second;
    if ((above + upper) / z >= target) {
      end = gt - cand.begin();
    } else if ((above + upper + equal) / z >= target) {
      return pivot;
    } else {
      above += upper + equal;
      begin = eq - cand.begin();
    }
  }
  return kNegInf;
}

//===--- Certified nucleus cut --------------------------------------------------------------===//
// A sorted nucleus (JetStream's and MaxText's `sorted[sum(cumsum < p)]`, Hugging Face's `cumsum <= 1 - p` from
// the bottom, Flax's exclusive cumsum) keeps a token by the program's f32 cumulative mass at its place in the
// sorted row, which differs from the exact mass by the rounding of the softmax's sum and of the cumsum, in an
// order only XLA knows. So the kernel does not decide the cut: it finds the band of values the rounding can move
// the cut across, draws among every token at or above the band, and vouches for the draw only where the winner
// lies above the band (then whether the band's tokens are kept cannot change it: they scored lower). A winner in
// the band gives kUncertified, and the binding runs the program's own cut (docs/kernels-cpu-sampling.md).

constexpr double kUnitRoundoff = 0x1p-24;

// A bound on |program's cumulative mass - exact mass| at the cut, where the program's cumsum has reached `side` of
// the mass (p summed from the top, 1 - p from the bottom) over `prefix` terms of a softmax of `terms`: the softmax's
// sum and the cumsum's prefix, each summed in any order, (terms - 1) u and (prefix - 1) u of what they reach; the
// division, XLA's exp (a few ulp of exp of the same rounded x - max) and this kernel's exp (within a few ulp), under
// 300 u in all; and p's own rounding to f32.
double CutSlack(int64_t terms, int64_t prefix, double side) {
  const double reached = std::min(1.0, side * 1.05 + 1e-3);
  return reached * (static_cast<double>(terms) + static_cast<double>(prefix) + 300.0) * kUnitRoundoff * 1.01 + 1e-7;
}

// Draw among x >= lo; the draw is the program's wherever the winner's x > hi. NaN: no draw is (the row has a
// NaN or an infinity, whose softmax is NaN: the program's own cut decides).
struct Band {
  float lo, hi;
  float max = std::numeric_limits<float>::quiet_NaN();  // the row's (NucleusBand's only)
};
constexpr Band kNoBand{std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::quiet_NaN()};

// The band of a nucleus that keeps a token when the mass above it is below p. With c(P) the largest value v with
// mass(x >= v) >= P: values below c(p + slack) have at least p + slack above every copy, so are surely dropped;
// values above c(p - slack) have less than p - slack at and above them, so are surely kept; and so is c(p - slack)
// itself (less than p - slack strictly above it) where the program keeps every copy of a value alike (a cut by
// value, `x >= sorted[count]`), or where it has no other copy (a cut by sorted place, whose later copies count the
// earlier ones' mass as above them).
template <typename CutoffAt>
Band BandOf(double p, double slack, bool top_kept, CutoffAt cutoff_at) {
  const float hi = p - slack > 0 ? cutoff_at(p - slack) : kPosInf;  // (no p - slack: no token is surely kept)
  return {cutoff_at(p + slack), top_kept ? std::nextafter(hi, kNegInf) : hi};
}

// A row's mass by distance from its max: one vector pass for the max, one for exp(x - max) and each token's bin
// (1/64 wide), one scalar pass adding the mass into the bins.
struct RowMass {
  static constexpr int kBinsPerUnit = 64, kBins = 64 * kBinsPerUnit;
  float max = kNegInf;
  bool finite = false;  // no NaN, no infinity at the max: a softmax that is not NaN
  double z = 0;
  std::vector<double> mass;
  std::vector<int64_t> count;  // tokens per bin
  // How many tokens lie in the bins at or above `value`'s (at least those with x >= value).
  int64_t AtOrAbove(float value) const {
    const double d = (static_cast<double>(max) - value) * kBinsPerUnit;
    const int last = d >= kBins - 1 ? kBins - 1 : static_cast<int>(d);
    int64_t n = 0;
    for (int b = 0; b <= last; ++b) n += count[b];
    return n;
  }
};

RowMass MassByBin(const SimdOps& ops, const Row& r) {
  RowMass rm;
  bool nan = false;
  rm.max = MaxRow(ops, r, r.x, &nan);
  rm.finite = !nan && std::isfinite(rm.max);
  if (!rm.finite) return rm;
  std::vector<double> part_z(r.chunks());
  std::vector<std::vector<double>> part_mass(r.chunks());
  std::vector<std::vector<int64_t>> part_count(r.chunks());
  r.ForChunks([&](int64_t c) {
    const int64_t b = r.begin(c), e = r.end(c);
    part_z[c] = ops.exp_shifted(r.x + b, rm.max, r.w + b, e - b, r.bins + b, RowMass::kBinsPerUnit, RowMass::kBins - 1);
    part_mass[c].assign(RowMass::kBins, 0.0);
    part_count[c].assign(RowMass::kBins, 0);
    double* mass = part_mass[c].data();
    int64_t* count = part_count[c].data();
    for (int64_t i = b; i < e; ++i) {
      const int bin = static_cast<int>(r.bins[i]);
      mass[bin] += r.w[i];
      ++count[bin];
    }
  });
  rm.mass.assign(RowMass::kBins, 0.0);
  rm.count.assign(RowMass::kBins, 0);
  for (int64_t c = 0; c < r.chunks(); ++c) {
    rm.z += part_z[c];
    for (int b = 0; b < RowMass::kBins; ++b) rm.mass[b] += part_mass[c][b], rm.count[b] += part_count[c][b];
  }
  return rm;
}

// The largest value v of the row with mass(x >= v) / z >= target, or -inf when none reaches it: only the bin
// where the cumulative mass reaches the target is searched token by token.
float CutoffOf(const SimdOps& ops, const Row& r, const RowMass& rm, double target) {
  double above = 0;
  std::vector<std::pair<float, double>> cand;
  for (int b = 0; b < RowMass::kBins; ++b) {
    if (rm.mass[b] == 0) continue;
    if ((above + rm.mass[b]) / rm.z >= target) {
      cand.clear();
      const int64_t found = ops.collect_range(r.bins, b, b + 1, 0, r.n, r.ids);
      for (int64_t j = 0; j < found; ++j)
        if (r.w[r.ids[j]] > 0) cand.emplace_back(r.x[r.ids[j]], r.w[r.ids[j]]);
      const float cutoff = SelectCutoff(cand, above, rm.z, target);
      if (cutoff != kNegInf) return cutoff;
    }
    above += rm.mass[b];  // summed in a different order, the bin total can round past the target: search on
  }
  return kNegInf;
}

// The band of the whole row's nucleus. `from_below`: the program's cumsum runs from the smallest (Hugging Face's),
// over nearly every token; from the top its prefix holds only the tokens at or above the band, counted by bin
// with the slack of a prefix of the whole row first. `by_place`: the program cuts by sorted place, not by value.
Band NucleusBand(const SimdOps& ops, const Row& r, double p, bool from_below, bool by_place) {
  const RowMass rm = MassByBin(ops, r);
  if (!rm.finite) return kNoBand;
  auto cutoff_at = [&](double target) { return CutoffOf(ops, r, rm, target); };
  const double side = from_below ? 1.0 - p : p;
  int64_t prefix = r.n;
  if (!from_below) {
    const float lo = cutoff_at(p + CutSlack(r.n, r.n, side));
    prefix = lo == kNegInf ? r.n : rm.AtOrAbove(lo);
  }
  Band band = BandOf(p, CutSlack(r.n, prefix, side), !by_place, cutoff_at);
  if (by_place && band.hi != kPosInf &&
      ops.collect_range(r.x, band.hi, std::nextafter(band.hi, kPosInf), 0, r.n, r.ids) == 1)
    band.hi = std::nextafter(band.hi, kNegInf);  // one copy: it is surely kept too
  band.max = rm.max;
  return band;
}

// The band of the nucleus of a few candidates (x >= kth after a top-k mask): mass from f64 exp.
Band NucleusBandOf(std::vector<std::pair<float, double>>& cand, double p) {
  float m = kNegInf;
  for (const auto& c : cand) {
    if (std::isnan(c.first)) return kNoBand;
    m = std::max(m, c.first);
  }
  if (!std::isfinite(m)) return kNoBand;
  double z = 0;
  for (auto& c : cand) z += c.second = std::exp(static_cast<double>(c.first) - m);
  const auto n = static_cast<int64_t>(cand.size());
  return BandOf(p, CutSlack(n, n, p), true, [&](double target) { return SelectCutoff(cand, 0.0, z, target); });
}

// The winner of a draw among the band's lower side and above, or kUncertified where the band could hold it.
Best Vouched(const Best& best, const Row& r, const Band& band) {
  return best.index >= 0 && r.x[best.index] > band.hi ? best : Best{kUncertified, best.score};
}

// Whether a winner scoring `best` = round(y + g) over the runner-up's `runner_up` keeps its place when the program
// scores round(z + g) with z its f32 log-probabilities, y - log(sum) up to rounding, ymax the row's largest y. Per
// token, |y - ymax| <= |score| + 17 + |ymax| (a Gumbel of an f32 uniform lies in [-4.5, 17]) and |z| <= that + log V
// (< 13); the program's score is off by the rounding of y - max, of exp, the division and the log (a few u of each,
// 8 u in all) and of z and of z + g, and this kernel's by that of y + g: under u (5 |score| + 3 |ymax| + 128) each.
// The lead asked, u (512 + 16 (|best| + |runner-up| + |ymax|)), is twice the two tokens' sum. A runner-up of -inf
// (no other token in the band's floor and above) cannot overtake the winner.
bool LeadsPastRounding(float best, float runner_up, float ymax) {
  if (runner_up == kNegInf) return true;
  const float slack = 0x1p-24f * (512.0f + 16.0f * (std::fabs(best) + std::fabs(runner_up) + std::fabs(ymax)));
  return best - runner_up > slack;
}

// The floor on y of the runner-up's search: only a token scoring within `gap` of the winner can fail
// LeadsPastRounding (its slack at a runner-up gap below is under gap, and grows far slower than the lead beyond), and
// its y is above best - gap - 18 (an f32 uniform's Gumbel is below 16). Any runner-up found below that leads too.
float RunnerUpFloor(float best, float ymax, float ylo) {
  const float gap = 1.0f + 0x1p-23f * (512.0f + 16.0f * (2.0f * std::fabs(best) + std::fabs(ymax)));
  return std::max(ylo, best - gap - 18.0f);
}

// categorical over the tokens `keep` accepts, scored by y (x / T, computed by the caller, whose max over
// y >= ylo is ymax); `ylo` is a floor on y below which `keep` is known to fail. The tokens within 1 of the
// largest y go first, so that the bound is tight when the rest are scanned, in blocks, each collecting
// only the y that can still win. Each chunk keeps its own best (from the seeds' best on), and the chunks'
// bests are combined in order.
template <typename Keep>
Best SampleKept(const SimdOps& ops, const Row& r, const float* y, float ymax, uint32_t k0, uint32_t k1, uint64_t base,
                float ylo, Keep keep, float noise_scale = 1.0f) {
  // A row of -inf scores -inf whatever its noise (never +inf), and argmax takes index 0: no noise is drawn (else
  // every token would be offered, none ever raising the pruning threshold above -inf).
  if (ymax == kNegInf) return Winner(Best{});
  const float seed = std::max(ylo, ymax - 1.0f);
  std::vector<Best> part(r.chunks());
  r.ForChunks([&](int64_t c) {
    GumbelArgmax sampler(ops, k0, k1, base, r.bf16, r.zero_noise, {}, noise_scale);
    int32_t* ids = r.ids_of(c);
    const int64_t found = ops.collect_range(y, seed, kPosInf, r.begin(c), r.end(c), ids);
    for (int64_t j = 0; j < found; ++j)
      if (keep(ids[j])) sampler.Offer(ids[j], y[ids[j]]);
    part[c] = sampler.best();
  });
  Best seeds;
  for (const Best& b : part)
    if (b.index >= 0) seeds.Offer(b.index, b.score);
  // The best score any chunk has reached so far, shared so that every chunk prunes with it.
  std::atomic<float> shared(seeds.index >= 0 ? seeds.score : kNegInf);
  r.ForChunks([&](int64_t c) {
    GumbelArgmax sampler(ops, k0, k1, base, r.bf16, r.zero_noise, seeds, noise_scale);
    int32_t* ids = r.ids_of(c);
    auto share = [&] {
      float seen = shared.load(std::memory_order_relaxed);
      while (sampler.bound() > seen && !shared.compare_exchange_weak(seen, sampler.bound())) {
      }
      sampler.Raise(seen);
    };
    constexpr int64_t kBlock = 4096;
    for (int64_t i = r.begin(c); i < r.end(c); i += kBlock) {
      share();
      const float lo = std::max(ylo, sampler.threshold());
      const int64_t found = ops.collect_range(y, lo, seed, i, std::min(r.end(c), i + kBlock), ids);
      for (int64_t j = 0; j < found; ++j)
        if (keep(ids[j])) sampler.Offer(ids[j], y[ids[j]]);
    }
    part[c] = sampler.best();
    share();
  });
  Best best = seeds;
  for (const Best& b : part)
    if (b.index >= 0) best.Offer(b.index, b.score);
  return Winner(best);
}

// y floor implied by x >= floor: round(x / T) is monotone in x for T > 0.
float ScaledFloor(const Row& r, float floor, float t) {
  return t > 0 && floor != kNegInf ? r.Round(floor / t) : kNegInf;
}

// One row's winner: its index in the row and its score (the logit for greedy, the perturbed score
// round(gumbel + y) for the stochastic forms). Vocabulary-space noise is counted from `vocab_base`, the
// counter of the row's token 0 (row * V_global + the split's offset).
Best SampleRow(const SimdOps& ops, const Row& r, const Params& prm, uint32_t k0, uint32_t k1, int64_t row,
               uint64_t vocab_base) {
  const float t = prm.temperature;
  auto everything = [](int64_t) { return true; };
  switch (prm.form) {
    case Form::kGreedy: return ArgMax(ops, r);
    case Form::kGreedySoftmax: return ArgMaxOfSoftmax(ops, r);
    case Form::kTemperature: {
      float ymax;
      const float* y = ScaledRow(ops, r, t, &ymax);
      if (std::isnan(ymax)) return FirstNaN(ops, r, y);
      return SampleKept(ops, r, y, ymax, k0, k1, vocab_base, kNegInf, everything);
    }
    case Form::kCategoricalNoiseScaled:
    case Form::kCategoricalNoiseScaledRows: {  // argmax(x + gumbel * T): the logits as they are, the noise scaled
      float ymax;
      const float* y = ScaledRow(ops, r, 1.0f, &ymax);
      if (std::isnan(ymax)) return FirstNaN(ops, r, y);
      return SampleKept(ops, r, y, ymax, k0, k1, vocab_base, kNegInf, everything, t);
    }
    case Form::kTopK:
    case Form::kTemperatureTopK: {
      // Rank-space: noise at counters row * k + rank.
      const bool first = prm.form == Form::kTemperatureTopK;
      const float* v = r.x;
      if (first) {
        ops.scale_max(r.x, t, r.bf16, r.y, r.n);
        v = r.y;
      }
      auto top = TopK(ops, v, r.n, prm.k, r.ids);
      const int64_t nan_rank = FirstNaNRank(top);
      if (nan_rank >= 0) return Best{top[nan_rank].second, top[nan_rank].first};
      GumbelArgmax sampler(ops, k0, k1, static_cast<uint64_t>(row) * prm.k, r.bf16, r.zero_noise);
      for (int64_t i = 0; i < static_cast<int64_t>(top.size()); ++i)
        sampler.Offer(i, first ? top[i].first : r.Round(top[i].first / t));
      const Best& best = sampler.best();
      const int64_t rank = best.index < 0 ? 0 : best.index;
      return Best{top[rank].second, best.score};
    }
    case Form::kTopKPacked:
    case Form::kTopKPackedBf16: {
      // As kTopK over the candidates' values (their order, value descending and earlier position first on
      // ties, is the row's: candidates come split by split, ids ascending), noise at row * k + rank; the
      // token is the winner's id word.
      const int64_t candidates = r.n / 2;
      for (int64_t i = 0; i < candidates; ++i) r.y[i] = r.x[2 * i];
      auto top = TopK(ops, r.y, candidates, prm.k, r.ids);
      const int64_t nan_rank = FirstNaNRank(top);
      GumbelArgmax sampler(ops, k0, k1, static_cast<uint64_t>(row) * prm.k, r.bf16, r.zero_noise);
      for (int64_t i = 0; i < static_cast<int64_t>(top.size()) && nan_rank < 0; ++i)
        sampler.Offer(i, r.Round(top[i].first / t));
      const Best& best = nan_rank >= 0 ? Best{nan_rank, std::numeric_limits<float>::quiet_NaN()} : sampler.best();
      const int64_t at = top[best.index < 0 ? 0 : best.index].second;
      int32_t id;
      std::memcpy(&id, &r.x[2 * at + 1], 4);
      return Best{id, best.score};
    }
    case Form::kTopKMask: {
      const float kth = TopK(ops, r.x, r.n, prm.k, r.ids).back().first;
      const float ylo = ScaledFloor(r, kth, t);
      float ymax;
      const float* y = ScaledRow(ops, r, t, &ymax);
      if (std::isnan(ymax)) return FirstNaN(ops, r, y);  // `x < kth` never masks a NaN
      return SampleKept(ops, r, y, ymax, k0, k1, vocab_base, ylo, [&](int64_t i) { return r.x[i] >= kth; });
    }
    case Form::kTopPMask:
    case Form::kTopPMaskFromBelow:
    case Form::kTopPMaskLogProb:
    case Form::kTopPMaskFromBelowLogProb: {
      // (from below, and by place: Hugging Face's)
      const bool from_below = prm.form == Form::kTopPMaskFromBelow || prm.form == Form::kTopPMaskFromBelowLogProb;
      const Band band = NucleusBand(ops, r, prm.p, from_below, from_below);
      if (std::isnan(band.lo)) return Best{kUncertified, kNegInf};
      // At T = 1 the draw reads x (as ScaledRow), whose max the band has: the row is finite.
      const bool as_is = t == 1.0f && !r.bf16;
      const float ymax = as_is ? band.max : ScaleMaxRow(ops, r, t);
      const float* y = as_is ? r.x : r.y;
      const float ylo = ScaledFloor(r, band.lo, t);
      const Best best =
          SampleKept(ops, r, y, ymax, k0, k1, vocab_base, ylo, [&](int64_t i) { return r.x[i] >= band.lo; });
      if (IsLogProb(prm.form) && best.index >= 0) {  // the runner-up: the same noise, the winner left out
        const Best runner_up = SampleKept(ops, r, y, ymax, k0, k1, vocab_base, RunnerUpFloor(best.score, ymax, ylo),
                                          [&](int64_t i) { return r.x[i] >= band.lo && i != best.index; });
        if (!LeadsPastRounding(best.score, runner_up.score, ymax)) return Best{kUncertified, best.score};
      }
      return Vouched(best, r, band);
    }
    case Form::kTopKTopPMask: {
      // Top-k mask, then the nucleus of what is left: only those (about k) tokens are ever scored. `x < kth` never
      // masks a NaN, whose nucleus the program's own cut decides.
      bool nan = false;
      const float kth = TopK(ops, r.x, r.n, prm.k, r.ids, &nan).back().first;
      if (nan) return Best{kUncertified, kNegInf};
      const int64_t found = ops.collect_range(r.x, kth, kPosInf, 0, r.n, r.ids);
      std::vector<std::pair<float, double>> cand;
      for (int64_t j = 0; j < found; ++j) cand.emplace_back(r.x[r.ids[j]], 0.0);
      const Band band = NucleusBandOf(cand, prm.p);
      if (std::isnan(band.lo)) return Best{kUncertified, kNegInf};
      const float lo = std::max(kth, band.lo);
      GumbelArgmax sampler(ops, k0, k1, vocab_base, r.bf16, r.zero_noise);
      for (int64_t j = 0; j < found; ++j)
        if (r.x[r.ids[j]] >= lo) sampler.Offer(r.ids[j], r.Round(r.x[r.ids[j]] / t));
      return Vouched(Winner(sampler.best()), r, band);
    }
    case Form::kMinP: {
      // y = x / T; keep softmax(y) >= min_p * max(softmax(y)), in f32 like the program.
      float m;
      const float* y = ScaledRow(ops, r, t, &m);
      // A NaN or an infinite max (a row of -inf too) makes every probability NaN: nothing is kept, all score -inf.
      if (!std::isfinite(m)) return Best{0, kNegInf};
      std::vector<double> part_z(r.chunks());
      r.ForChunks([&](int64_t c) {
        part_z[c] = ops.exp_shifted(y + r.begin(c), m, r.w + r.begin(c), r.end(c) - r.begin(c), nullptr, 0, 0);
      });
      double z = 0;
      for (double v : part_z) z += v;
      const float zf = static_cast<float>(z);
      const float threshold = prm.min_p * (1.0f / zf);
      // exp(y - m) / zf >= min_p / zf needs y - m >= log(min_p) up to rounding: 1 is a wide margin.
      const float ylo = prm.min_p > 0 ? m + std::log(prm.min_p) - 1.0f : kNegInf;
      return SampleKept(ops, r, y, m, k0, k1, vocab_base, ylo,
                        [&](int64_t i) { return std::exp(y[i] - m) / zf >= threshold; });
    }
  }
  return Best{0, kNegInf};
}

//===--- Threads ---------------------------------------------------------------------------===//

struct Job {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  int64_t n = 0;
  std::function<void(int64_t)> fn;
  std::mutex mu;
  std::condition_variable cv;

  void Work() {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      fn(i);
      if (done.fetch_add(1) + 1 == n) {
        std::lock_guard<std::mutex> lock(mu);
        cv.notify_all();
      }
    }
  }
};

// Runs fn(0..n-1) on the caller and XLA's pool; returns when all are done.
void ParallelFor(ffi::ThreadPool& pool, int64_t n, std::function<void(int64_t)> fn) {
  if (n <= 0) return;
  auto job = std::make_shared<Job>();
  job->n = n;
  job->fn = std::move(fn);
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), n - 1);
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([job] { job->Work(); });
  job->Work();
  std::unique_lock<std::mutex> lock(job->mu);
  job->cv.wait(lock, [&] { return job->done.load() == n; });
}

// A per-thread buffer kept across calls (a row's worth of floats, three times).
float* ThreadScratch(int64_t floats) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < floats) buf.resize(floats);
  return buf.data();
}

// Row r of (rows, vocab) logits at `base` (bf16 widened into this thread's scratch), with this thread's scratch.
Row RowOf(const char* base, int64_t r, int64_t vocab, bool bf16, bool round_bf16, float zero_noise,
          const ForEach* each) {
  const int64_t stride = vocab + NumChunks(vocab) + kMaxLanes;
  float* scratch = ThreadScratch(5 * stride);
  const float* x = reinterpret_cast<const float*>(base + r * vocab * 4);
  if (bf16) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(base + r * vocab * 2);
    float* wide = scratch + 4 * stride;
    for (int64_t i = 0; i < vocab; ++i) wide[i] = Bf16ToF32(h[i]);
    x = wide;
  }
  return Row{x,
             vocab,
             round_bf16,
             zero_noise,
             scratch,
             scratch + stride,
             scratch + 2 * stride,
             reinterpret_cast<int32_t*>(scratch + 3 * stride),
             each};
}

// Runs fn(0..n-1) in order on the calling thread.
void InOrder(int64_t n, const std::function<void(int64_t)>& fn) {
  for (int64_t i = 0; i < n; ++i) fn(i);
}

// The optional operand and result of a vocabulary split (docs/kernels-cpu-sampling.md, "FFI contract"):
// offsets (*L,) s32, each row's first token in the global vocabulary of `vocab_total` tokens, and
// scores (*L,) f32, each row's winning score, by which the splits of a row merge.
struct Split {
  const int32_t* offsets = nullptr;
  float* scores = nullptr;
};

ffi::ErrorOr<Split> SplitOf(ffi::RemainingArgs optional, ffi::RemainingRets extra, int64_t rows, int64_t vocab,
                            int64_t vocab_total, int64_t form) {
  Split split;
  if (optional.size() > 1 || extra.size() > 1)
    return ffi::Unexpected(
        ffi::Error::InvalidArgument("hlofuse_sample: at most an offsets operand and a score result"));
  // The per-row scales' form takes its optional operand as the scales (RowScalesOf), never offsets.
  const bool offsets_given = optional.size() == 1 && form != static_cast<int64_t>(Form::kCategoricalNoiseScaledRows);
  if ((vocab_total != 0) != offsets_given)
    return ffi::Unexpected(ffi::Error::InvalidArgument("hlofuse_sample: offsets go with vocab_total > 0"));
  if (offsets_given) {
    // Only the vocabulary-space forms whose keep-set is the whole row split: a threshold (top-k, top-p,
    // min-p) or a rank (top_k's noise counter) needs the whole row.
    if (form != static_cast<int64_t>(Form::kGreedy) && form != static_cast<int64_t>(Form::kTemperature))
      return ffi::Unexpected(ffi::Error::InvalidArgument("hlofuse_sample: only greedy and temperature split"));
    auto offsets = optional.get<ffi::Buffer<ffi::S32>>(0);
    if (!offsets.has_value()) return ffi::Unexpected(offsets.error());
    if (offsets->element_count() != rows)
      return ffi::Unexpected(ffi::Error::InvalidArgument("hlofuse_sample: offsets must be (rows,) int32"));
    split.offsets = offsets->typed_data();
    for (int64_t r = 0; r < rows; ++r)
      if (split.offsets[r] < 0 || split.offsets[r] + vocab > vocab_total)
        return ffi::Unexpected(ffi::Error::InvalidArgument("hlofuse_sample: need 0 <= offset <= vocab_total - V"));
  }
  if (extra.size() == 1) {
    auto scores = extra.get<ffi::Buffer<ffi::F32>>(0);
    if (!scores.has_value()) return ffi::Unexpected(scores.error());
    if ((*scores)->element_count() != rows)
      return ffi::Unexpected(ffi::Error::InvalidArgument("hlofuse_sample: scores must be (rows,) f32"));
    split.scores = (*scores)->typed_data();
  }
  return split;
}

// The rows' noise scales of kCategoricalNoiseScaledRows: its optional operand, (rows,) f32 (nullptr for another form).
ffi::ErrorOr<const float*> RowScalesOf(ffi::RemainingArgs optional, int64_t rows, int64_t form) {
  if (form != static_cast<int64_t>(Form::kCategoricalNoiseScaledRows)) return static_cast<const float*>(nullptr);
  if (optional.size() != 1)
    return ffi::Unexpected(ffi::Error::InvalidArgument("hlofuse_sample: a scale per row takes a scales operand"));
  auto scales = optional.get<ffi::Buffer<ffi::F32>>(0);
  if (!scales.has_value()) return ffi::Unexpected(scales.error());
  if (scales->element_count() != rows)
    return ffi::Unexpected(ffi::Error::InvalidArgument("hlofuse_sample: scales must be (rows,) f32"));
  const float* data = scales->typed_data();
  for (int64_t r = 0; r < rows; ++r)  // a negative, infinite or NaN scale breaks the noise's bound: the binding's
    if (!(data[r] >= 0 && data[r] < kPosInf))  // rows to recompute, never the kernel's
      return ffi::Unexpected(ffi::Error::InvalidArgument("hlofuse_sample: each row's scale must be finite and >= 0"));
  return data;
}

ffi::Error Sample(ffi::ThreadPool pool, ffi::AnyBuffer logits, ffi::Buffer<ffi::U32> keys,
                  ffi::Buffer<ffi::S32> row_ids, ffi::RemainingArgs optional, ffi::Result<ffi::Buffer<ffi::S32>> out,
                  ffi::RemainingRets extra, int64_t form, float temperature, int64_t k, float p, float min_p,
                  int64_t vocab_total, float gumbel_at_zero) {
  const auto dims = logits.dimensions();
  if (dims.size() < 2) return ffi::Error::InvalidArgument("hlofuse_sample: logits must be (*L, V)");
  const bool bf16 = logits.element_type() == ffi::DataType::BF16;
  if (!bf16 && logits.element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument("hlofuse_sample: logits must be f32 or bf16");
  // Leading dims (rows, or rows and vocabulary splits) are one batch of rows.
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < dims.size(); ++i) rows *= dims[i];
  const int64_t vocab = dims[dims.size() - 1];
  if (keys.element_count() != 2 * rows)
    return ffi::Error::InvalidArgument("hlofuse_sample: keys must be (rows, 2) uint32");
  if (row_ids.element_count() != rows) return ffi::Error::InvalidArgument("hlofuse_sample: row ids must be (rows,)");
  if (out->element_count() != rows) return ffi::Error::InvalidArgument("hlofuse_sample: tokens must be (rows,)");
  if (form < 0 || form > 15) return ffi::Error::InvalidArgument("hlofuse_sample: unknown form");
  const bool needs_k = (form >= 2 && form <= 6 && form != 5) || IsPacked(form);
  // Packed candidates: V = 2C words, k of the C candidates.
  const int64_t choices = IsPacked(form) ? vocab / 2 : vocab;
  if (IsPacked(form) && (bf16 || vocab % 2 || vocab_total != 0))
    return ffi::Error::InvalidArgument("hlofuse_sample: packed candidates are (rows, 2C) f32 and do not split");
  if (form == static_cast<int64_t>(Form::kCategoricalNoiseScaled) && (bf16 || !(temperature > 0)))
    return ffi::Error::InvalidArgument("hlofuse_sample: a scaled noise takes f32 logits and a scale > 0");
  if (form == static_cast<int64_t>(Form::kCategoricalNoiseScaledRows) && (bf16 || vocab_total != 0))
    return ffi::Error::InvalidArgument("hlofuse_sample: a scale per row takes f32 logits and no splits");
  if (IsLogProb(static_cast<Form>(form)) && (bf16 || !(temperature > 0)))
    return ffi::Error::InvalidArgument("hlofuse_sample: a log-probability nucleus takes f32 logits and T > 0");
  if (vocab < 1 || (needs_k && (k < 1 || k > choices)))
    return ffi::Error::InvalidArgument("hlofuse_sample: need 1 <= k <= V");
  // NaN: JAX's noise there; another value (a hand-written noise's) only for f32 logits, below every other noise.
  const float zero_noise = std::isnan(gumbel_at_zero) ? GumbelF32(0) : gumbel_at_zero;
  if (!std::isnan(gumbel_at_zero) && (bf16 || IsPacked(form) || !ZeroNoiseFits(zero_noise)))
    return ffi::Error::InvalidArgument(
        "hlofuse_sample: gumbel_at_zero takes f32 logits and a value <= the noise of "
        "mantissa 1 (-inf too)");
  if (vocab_total < 0 || (vocab_total > 0 && vocab_total < vocab))
    return ffi::Error::InvalidArgument("hlofuse_sample: vocab_total must be 0 (this call's V) or >= V");
  const int64_t vocab_global = vocab_total > 0 ? vocab_total : vocab;
  if (vocab_global > std::numeric_limits<int32_t>::max())
    return ffi::Error::InvalidArgument("hlofuse_sample: V must fit in int32");
  auto split_of = SplitOf(optional, extra, rows, vocab, vocab_total, form);
  if (!split_of.has_value()) return split_of.error();
  const Split split_io = *split_of;
  auto scales_of = RowScalesOf(optional, rows, form);
  if (!scales_of.has_value()) return scales_of.error();
  const float* row_scales = *scales_of;
  // Values round as bf16 for bf16 logits, and for packed candidates widened from bf16.
  const bool round_bf16 = bf16 || form == static_cast<int64_t>(Form::kTopKPackedBf16);
  const Params prm{static_cast<Form>(form), round_bf16 ? RoundBf16(temperature) : temperature, k, p, min_p};
  const SimdOps& ops = SelectOps();
  const char* base = static_cast<const char*>(logits.untyped_data());
  const uint32_t* key = keys.typed_data();
  const int32_t* ids = row_ids.typed_data();
  int32_t* tokens = out->typed_data();
  // Fewer rows than threads: rows one after another, each row's chunks on the pool.
  const int64_t threads = pool.num_threads() + 1;
  const bool split = rows < threads && NumChunks(vocab) > 1 && std::getenv("HLOFUSE_SAMPLE_NO_SPLIT") == nullptr;
  const ForEach in_order = InOrder;
  const ForEach on_pool = [&pool](int64_t n, const std::function<void(int64_t)>& fn) { ParallelFor(pool, n, fn); };
  auto sample_row = [&](int64_t r) {
    const Row row = RowOf(base, r, vocab, bf16, round_bf16, zero_noise, split ? &on_pool : &in_order);
    const int64_t offset = split_io.offsets ? split_io.offsets[r] : 0;
    const uint64_t vocab_base = static_cast<uint64_t>(ids[r]) * vocab_global + offset;
    Params row_prm = prm;
    if (row_scales) row_prm.temperature = row_scales[r];
    const Best best = SampleRow(ops, row, row_prm, key[2 * r], key[2 * r + 1], ids[r], vocab_base);
    tokens[r] = static_cast<int32_t>(best.index + offset);
    // A noise of -inf at u = 0 makes a logit of +inf score NaN there (argmax's first NaN, before any +inf or NaN the
    // row ranks), and a row whose every candidate drew u = 0 score -inf throughout (argmax's index 0, whatever the
    // form kept): the binding draws such rows by the program's own ops.
    if (zero_noise == kNegInf && !std::isfinite(best.score)) tokens[r] = static_cast<int32_t>(kUncertified);
    if (split_io.scores) split_io.scores[r] = best.score;
  };
  if (split) {
    for (int64_t r = 0; r < rows; ++r) sample_row(r);
  } else {
    ParallelFor(pool, rows, sample_row);
  }
  return ffi::Error::Success();
}

// Each row's nucleus band (docs/kernels-cpu-sampling.md, "Certified nucleus cut"): lo and hi per row, NaN where the
// row has a NaN or an infinity. A binding draws among x >= lo and vouches for a winner with x > hi.
ffi::Error SampleNucleusBand(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> logits, ffi::Result<ffi::Buffer<ffi::F32>> lo,
                             ffi::Result<ffi::Buffer<ffi::F32>> hi, double p, bool from_below, bool by_place) {
  const auto dims = logits.dimensions();
  if (dims.size() < 2) return ffi::Error::InvalidArgument("hlofuse_sample_nucleus_band: logits must be (*L, V)");
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < dims.size(); ++i) rows *= dims[i];
  const int64_t vocab = dims[dims.size() - 1];
  if (vocab < 1 || vocab > std::numeric_limits<int32_t>::max())
    return ffi::Error::InvalidArgument("hlofuse_sample_nucleus_band: need 1 <= V < 2^31");
  if (!(p > 0 && p <= 1)) return ffi::Error::InvalidArgument("hlofuse_sample_nucleus_band: need 0 < p <= 1");
  const SimdOps& ops = SelectOps();
  const char* base = reinterpret_cast<const char*>(logits.typed_data());
  const bool split = rows < pool.num_threads() + 1 && NumChunks(vocab) > 1;
  const ForEach in_order = InOrder;
  const ForEach on_pool = [&pool](int64_t n, const std::function<void(int64_t)>& fn) { ParallelFor(pool, n, fn); };
  auto band_of_row = [&](int64_t r) {
    const Band band = NucleusBand(ops, RowOf(base, r, vocab, false, false, GumbelF32(0), split ? &on_pool : &in_order),
                                  p, from_below, by_place);
    lo->typed_data()[r] = band.lo;
    hi->typed_data()[r] = band.hi;
  };
  if (split) {
    for (int64_t r = 0; r < rows; ++r) band_of_row(r);
  } else {
    ParallelFor(pool, rows, band_of_row);
  }
  return ffi::Error::Success();
}

// The rows as they are (a copy). In a module for several devices its sharding rule keeps the rows local and the
// vocabulary whole, so a vocabulary sharded over devices is gathered once, here, for every call that then reads the
// rows (a certified nucleus's draw and its fallback's sort): `sampling.partitioned_lowering`.
ffi::Error SampleWholeRows(ffi::Buffer<ffi::F32> logits, ffi::Result<ffi::Buffer<ffi::F32>> rows) {
  if (rows->element_count() != logits.element_count())
    return ffi::Error::InvalidArgument("hlofuse_sample_whole_rows: the result is the logits' shape");
  std::memcpy(rows->typed_data(), logits.typed_data(), logits.element_count() * sizeof(float));
  return ffi::Error::Success();
}

// JAX's random bits (threefry2x32) of each row under its key, at the counters row_id * V + id (the flat index of
// (row, id) in (rows, V) noise: `jax.random.bits`, and so the bits of `uniform` and `exponential`), 16 / 8 / 4
// counters at a time by the ISA's threefry. XLA's CPU threefry of a (1, 128256) row takes milliseconds; the
// exponential race (sampling.py) reads its noise from these bits with the program's own float ops.
ffi::Error SampleNoiseBits(ffi::ThreadPool pool, ffi::Buffer<ffi::U32> keys, ffi::Buffer<ffi::S32> row_ids,
                           ffi::Result<ffi::Buffer<ffi::U32>> bits) {
  const auto dims = bits->dimensions();
  if (dims.size() != 2) return ffi::Error::InvalidArgument("hlofuse_sample_noise_bits: bits must be (rows, V)");
  const int64_t rows = dims[0], vocab = dims[1];
  if (keys.element_count() != 2 * rows || row_ids.element_count() != rows)
    return ffi::Error::InvalidArgument("hlofuse_sample_noise_bits: keys must be (rows, 2), row ids (rows,)");
  const SimdOps& ops = SelectOps();
  const uint32_t* key = keys.typed_data();
  const int32_t* row = row_ids.typed_data();
  uint32_t* out = bits->typed_data();
  ParallelFor(pool, rows, [&](int64_t r) {
    constexpr int64_t kChunk = 4096;  // a multiple of every ISA's lanes
    auto* offsets = reinterpret_cast<int32_t*>(ThreadScratch(2 * kChunk));
    uint32_t* chunk = reinterpret_cast<uint32_t*>(offsets + kChunk);
    for (int64_t j = 0; j < kChunk; ++j) offsets[j] = static_cast<int32_t>(j);
    const uint64_t base = static_cast<uint64_t>(row[r]) * static_cast<uint64_t>(vocab);
    for (int64_t start = 0; start < vocab; start += kChunk) {
      const int64_t n = std::min(kChunk, vocab - start);
      uint32_t* dest = out + r * vocab + start;
      const bool whole = n % kMaxLanes == 0;  // else the lanes past n go to the scratch, not past the row
      ops.threefry(key[2 * r], key[2 * r + 1], base + static_cast<uint64_t>(start), offsets, whole ? dest : chunk,
                   (n + kMaxLanes - 1) / kMaxLanes * kMaxLanes);
      if (!whole) std::memcpy(dest, chunk, n * sizeof(uint32_t));
    }
  });
  return ffi::Error::Success();
}

// Each row's top k: candidates (*L, k) as values (f32; bf16 widened exactly) and global ids (offset +
// index), value descending, lower id first on ties (lax.top_k's order). The top k of a whole row is the
// top k of its splits' candidates, concatenated in split order, so the splits of a sharded vocabulary
// merge on P * k candidates instead of the row.
ffi::Error SampleTopK(ffi::ThreadPool pool, ffi::AnyBuffer logits, ffi::Buffer<ffi::S32> offsets,
                      ffi::Result<ffi::Buffer<ffi::F32>> values, ffi::Result<ffi::Buffer<ffi::S32>> ids, int64_t k) {
  const auto dims = logits.dimensions();
  if (dims.size() < 2) return ffi::Error::InvalidArgument("hlofuse_sample_top_k: logits must be (*L, V)");
  const bool bf16 = logits.element_type() == ffi::DataType::BF16;
  if (!bf16 && logits.element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument("hlofuse_sample_top_k: logits must be f32 or bf16");
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < dims.size(); ++i) rows *= dims[i];
  const int64_t vocab = dims[dims.size() - 1];
  if (k < 1 || k > vocab) return ffi::Error::InvalidArgument("hlofuse_sample_top_k: need 1 <= k <= V");
  if (offsets.element_count() != rows)
    return ffi::Error::InvalidArgument("hlofuse_sample_top_k: offsets must be (*L,) int32");
  if (values->element_count() != rows * k || ids->element_count() != rows * k)
    return ffi::Error::InvalidArgument("hlofuse_sample_top_k: values and ids must be (*L, k)");
  const SimdOps& ops = SelectOps();
  const char* base = static_cast<const char*>(logits.untyped_data());
  const int32_t* offset = offsets.typed_data();
  float* out_values = values->typed_data();
  int32_t* out_ids = ids->typed_data();
  ParallelFor(pool, rows, [&](int64_t r) {
    float* scratch = ThreadScratch(2 * (vocab + kMaxLanes));
    const float* x = reinterpret_cast<const float*>(base + r * vocab * 4);
    if (bf16) {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(base + r * vocab * 2);
      float* wide = scratch + vocab + kMaxLanes;
      for (int64_t i = 0; i < vocab; ++i) wide[i] = Bf16ToF32(h[i]);
      x = wide;
    }
    const auto top = TopK(ops, x, vocab, k, reinterpret_cast<int32_t*>(scratch));
    for (int64_t j = 0; j < k; ++j) {
      out_values[r * k + j] = top[j].first;
      out_ids[r * k + j] = static_cast<int32_t>(top[j].second + offset[r]);
    }
  });
  return ffi::Error::Success();
}

// How many of the largest of n probabilities it takes for their mass to pass `mass`, at most `limit` (and `limit`
// when no count does, or when the row is not a probability row: NaN or negative values). One pass bins the values
// by their top 12 bits (sign, exponent, 3 mantissa bits: bins ordered as the values); the count is that of the
// bins from the top down to the one where the mass passes, so every value of that bin is counted (an upper
// bound, which is all the caller needs: it checks the mass of what it gets with the program's own cumsum).
int64_t CountForMass(const float* v, int64_t n, double mass, int64_t limit) {
  constexpr int kBins = 1 << 11;  // non-negative floats: bits >> 20 < 2048
  std::vector<double> bin_mass(kBins, 0.0);
  std::vector<int64_t> bin_count(kBins, 0);
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(v[i]) || v[i] < 0) return limit;  // not a probability row
    uint32_t bits;
    std::memcpy(&bits, &v[i], 4);
    if (bits >> 31) continue;         // -0.0: no mass
    const uint32_t bin = bits >> 20;  // +inf: 0x7F8, the top
    bin_mass[bin] += v[i];
    bin_count[bin] += 1;
  }
  double above = 0;
  int64_t count = 0;
  for (int b = kBins - 1; b >= 0 && count < limit; --b) {
    above += bin_mass[b];
    count += bin_count[b];
    if (above > mass) return std::max<int64_t>(1, std::min(count, limit));
  }
  return limit;
}

// Each row's largest probabilities, as many as their mass needs to pass `mass` (CountForMass), at most k: values
// (*L, k) value descending, lower id first on ties (lax.top_k's order), then zeros; ids likewise, then -1. One
// pass for the count and one for the top of that count, so a nucleus of a few tokens costs a top-few, whatever
// k allows.
ffi::Error SampleTopMass(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> probs, ffi::Result<ffi::Buffer<ffi::F32>> values,
                         ffi::Result<ffi::Buffer<ffi::S32>> ids, int64_t k, float mass) {
  const auto dims = probs.dimensions();
  if (dims.size() < 2) return ffi::Error::InvalidArgument("hlofuse_sample_top_mass: probs must be (*L, V)");
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < dims.size(); ++i) rows *= dims[i];
  const int64_t vocab = dims[dims.size() - 1];
  if (k < 1 || k > vocab) return ffi::Error::InvalidArgument("hlofuse_sample_top_mass: need 1 <= k <= V");
  if (values->element_count() != rows * k || ids->element_count() != rows * k)
    return ffi::Error::InvalidArgument("hlofuse_sample_top_mass: values and ids must be (*L, k)");
  const SimdOps& ops = SelectOps();
  const float* base = probs.typed_data();
  float* out_values = values->typed_data();
  int32_t* out_ids = ids->typed_data();
  ParallelFor(pool, rows, [&](int64_t r) {
    int32_t* scratch = reinterpret_cast<int32_t*>(ThreadScratch(vocab + kMaxLanes));
    const float* x = base + r * vocab;
    const int64_t count = CountForMass(x, vocab, static_cast<double>(mass), k);
    const auto top = TopK(ops, x, vocab, count, scratch);
    for (int64_t j = 0; j < k; ++j) {
      const bool found = j < static_cast<int64_t>(top.size());
      out_values[r * k + j] = found ? top[j].first : 0.0f;
      out_ids[r * k + j] = found ? static_cast<int32_t>(top[j].second) : -1;
    }
  });
  return ffi::Error::Success();
}

// The key that orders int32 values as an integer sort does: the sign bit flipped.
uint32_t IntegerKey(int32_t x) { return static_cast<uint32_t>(x) ^ 0x80000000u; }

// Sorts n items (a 32-bit key above, an id below) by key, stably: four passes of an 8-bit least-significant-digit
// radix sort (256 buckets: 25% faster than 11-bit passes here), each item one 64-bit word so that a pass moves it
// once, over the digit counts `counts` the caller took as it wrote the items. A pass whose digit is the same for
// every item (a narrow range of logits shares its top bits) is skipped. Returns the buffer the result is in.
using DigitCounts = std::array<std::array<int64_t, 256>, 4>;
uint64_t* RadixSortItems(uint64_t* from, uint64_t* to, int64_t n, DigitCounts& counts) {
  constexpr int kBits = 8, kBuckets = 1 << kBits;
  for (int pass = 0; pass < static_cast<int>(counts.size()) && n > 0; ++pass) {
    const int shift = 32 + pass * kBits;
    auto& count = counts[pass];
    if (count[(from[0] >> shift) & (kBuckets - 1)] == n) continue;  // one digit for every item
    int64_t start = 0;
    for (int b = 0; b < kBuckets; ++b) start += std::exchange(count[b], start);
    for (int64_t i = 0; i < n; ++i) to[count[(from[i] >> shift) & (kBuckets - 1)]++] = from[i];
    std::swap(from, to);
  }
  return from;
}

// Where the n int32 values are a permutation of 0..n-1: each value's place in the sorted row is the value itself,
// so the values are 0..n-1 and the ids the inverse permutation. False where they are not (then out_ids holds
// scratch, which the caller's sort overwrites).
bool InvertedPermutation(const int32_t* x, int64_t n, int32_t* out_values, int32_t* out_ids) {
  std::fill(out_ids, out_ids + n, -1);
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] < 0 || x[i] >= n || out_ids[x[i]] != -1) return false;
    out_ids[x[i]] = static_cast<int32_t>(i);
  }
  for (int64_t j = 0; j < n; ++j) out_values[j] = static_cast<int32_t>(j);
  return true;
}

// The key most of a row holds, where a filter left it: a row masked by a top-k, top-p or min-p is its fill (-inf, or
// +inf negated) but for the tokens kept. Only the smallest and the largest key are candidates; `count` is how many
// hold it, `first` whether it is the smallest (so sorts first).
struct RowFill {
  uint32_t key = 0;
  int64_t count = 0;
  bool first = true;
};

template <typename T, uint32_t (*Key)(T)>
RowFill MostHeldExtreme(const T* x, int64_t n) {
  uint32_t low = std::numeric_limits<uint32_t>::max(), high = 0;
  for (int64_t i = 0; i < n; ++i) {  // (two passes: each vectorizes)
    const uint32_t key = Key(x[i]);
    low = std::min(low, key);
    high = std::max(high, key);
  }
  int64_t at_low = 0, at_high = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t key = Key(x[i]);
    at_low += key == low;
    at_high += key == high;
  }
  return at_low >= at_high ? RowFill{low, at_low, true} : RowFill{high, at_high, false};
}

// One row of n values sorted by Key, stably (equal keys keep their order): values and ids. Where one extreme key
// holds a quarter of the row or more (a filtered row's fill), those tokens are placed by one pass in id order (the
// stable sort's order among equal keys) and only the others are radix-sorted: a row a top-k kept 50 of 128256 tokens
// of costs a few passes over the row, not four scattering ones. A permutation of 0..n-1 (an argsort sorted again, to
// put values back) is inverted by one scatter: its keys are distinct, so the stable order is the inverse.
template <typename T, uint32_t (*Key)(T)>
void SortRow(const T* x, int64_t n, T* out_values, int32_t* out_ids) {
  thread_local std::vector<uint64_t> items, items_next;
  if (static_cast<int64_t>(items.size()) < n) items.resize(n), items_next.resize(n);
  const RowFill fill = MostHeldExtreme<T, Key>(x, n);
  const bool split = fill.count >= n / 4;
  if constexpr (std::is_same_v<T, int32_t>) {
    if (!split && fill.count == 1 && InvertedPermutation(x, n, out_values, out_ids)) return;
  }
  DigitCounts counts{};
  int64_t others = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t key = Key(x[i]);
    if (split && key == fill.key) continue;
    items[others++] = (uint64_t{key} << 32) | static_cast<uint32_t>(i);
    for (size_t pass = 0; pass < counts.size(); ++pass) ++counts[pass][(key >> (pass * 8)) & 0xFF];
  }
  const uint64_t* sorted = RadixSortItems(items.data(), items_next.data(), others, counts);
  const int64_t first_other = split && fill.first ? n - others : 0;
  for (int64_t j = 0; j < others; ++j) {
    const int32_t id = static_cast<int32_t>(sorted[j] & 0xFFFFFFFFu);
    out_values[first_other + j] = x[id];
    out_ids[first_other + j] = id;
  }
  if (!split) return;
  for (int64_t i = 0, place = fill.first ? 0 : others; i < n; ++i) {
    if (Key(x[i]) != fill.key) continue;
    out_values[place] = x[i];
    out_ids[place++] = static_cast<int32_t>(i);
  }
}

// Each row sorted by Key, stably: values (*L, V) and their ids (SortRow).
template <typename T, ffi::DataType D, uint32_t (*Key)(T)>
ffi::Error SortRows(ffi::ThreadPool pool, ffi::Buffer<D> keys, ffi::Result<ffi::Buffer<D>> values,
                    ffi::Result<ffi::Buffer<ffi::S32>> ids) {
  const auto dims = keys.dimensions();
  if (dims.size() < 2) return ffi::Error::InvalidArgument("hlofuse_sample_sort: logits must be (*L, V)");
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < dims.size(); ++i) rows *= dims[i];
  const int64_t vocab = dims[dims.size() - 1];
  if (vocab > (int64_t{1} << 31) - 1) return ffi::Error::InvalidArgument("hlofuse_sample_sort: V must fit int32");
  const T* base = keys.typed_data();
  T* out_values = values->typed_data();
  int32_t* out_ids = ids->typed_data();
  ParallelFor(pool, rows, [&](int64_t r) {
    SortRow<T, Key>(base + r * vocab, vocab, out_values + r * vocab, out_ids + r * vocab);
  });
  return ffi::Error::Success();
}

// Each row's tokens at or above its `floor`, in lax.top_k's order (DescendingKey: XLA's total order reversed, ties by
// the lower id), the first `k` of them, then -inf with id -1; and how many there are (more than k: not all given).
// With a floor from the row's nucleus band, these are the first ranks of the row's descending sort, and a draw
// over ranks needs no other (`_rank_nucleus_by_band`). One vector pass and a sort of the few it collects.
ffi::Error SampleAtOrAbove(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> logits, ffi::Buffer<ffi::F32> floors,
                           ffi::Result<ffi::Buffer<ffi::F32>> values, ffi::Result<ffi::Buffer<ffi::S32>> ids,
                           ffi::Result<ffi::Buffer<ffi::S32>> counts) {
  const auto dims = logits.dimensions();
  if (dims.size() < 2) return ffi::Error::InvalidArgument("hlofuse_sample_at_or_above: logits must be (*L, V)");
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < dims.size(); ++i) rows *= dims[i];
  const int64_t vocab = dims[dims.size() - 1];
  const int64_t k = values->element_count() / std::max<int64_t>(rows, 1);
  if (floors.element_count() != rows || values->element_count() != rows * k || ids->element_count() != rows * k ||
      counts->element_count() != rows || vocab > std::numeric_limits<int32_t>::max())
    return ffi::Error::InvalidArgument(
        "hlofuse_sample_at_or_above: floors (*L,), values and ids (*L, k), counts (*L,)");
  const SimdOps& ops = SelectOps();
  ParallelFor(pool, rows, [&](int64_t r) {
    const float* x = logits.typed_data() + r * vocab;
    int32_t* found = reinterpret_cast<int32_t*>(ThreadScratch(vocab + kMaxLanes));
    // (finite tokens only: a row with an infinity or a NaN has no band, and no draw of it is vouched for)
    const int64_t n = ops.collect_range(x, floors.typed_data()[r], kPosInf, 0, vocab, found);
    counts->typed_data()[r] = static_cast<int32_t>(n);
    float* out_values = values->typed_data() + r * k;
    int32_t* out_ids = ids->typed_data() + r * k;
    std::fill(out_values, out_values + k, kNegInf);
    std::fill(out_ids, out_ids + k, -1);
    if (n > k) return;
    std::vector<std::pair<uint32_t, int32_t>> order;
    order.reserve(n);
    for (int64_t j = 0; j < n; ++j) order.emplace_back(DescendingKey(x[found[j]]), found[j]);
    std::sort(order.begin(), order.end());
    for (int64_t j = 0; j < n; ++j) out_values[j] = x[order[j].second], out_ids[j] = order[j].second;
  });
  return ffi::Error::Success();
}

// Ascending as jnp.sort (hlofuse_sample_sort); descending as lax.top_k of the whole row (ties by the lower id).
ffi::Error SampleSortAscending(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> logits,
                               ffi::Result<ffi::Buffer<ffi::F32>> values, ffi::Result<ffi::Buffer<ffi::S32>> ids) {
  return SortRows<float, ffi::F32, AscendingKey>(pool, logits, values, ids);
}

// int32 values ascending, stably (an argsort's ids sorted again, to put values back in place).
ffi::Error SampleSortIntegers(ffi::ThreadPool pool, ffi::Buffer<ffi::S32> keys,
                              ffi::Result<ffi::Buffer<ffi::S32>> values, ffi::Result<ffi::Buffer<ffi::S32>> ids) {
  return SortRows<int32_t, ffi::S32, IntegerKey>(pool, keys, values, ids);
}

ffi::Error SampleSortDescending(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> logits,
                                ffi::Result<ffi::Buffer<ffi::F32>> values, ffi::Result<ffi::Buffer<ffi::S32>> ids) {
  return SortRows<float, ffi::F32, DescendingKey>(pool, logits, values, ids);
}

}  // namespace
}  // namespace hlofuse::cpu

extern "C" __attribute__((visibility("default"))) XLA_FFI_Error* hlofuse_sample_sort(XLA_FFI_CallFrame* call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(hlofuse_sample_sort, hlofuse::cpu::SampleSortAscending,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()    // logits (*L, V): L folds into rows
                                  .Ret<ffi::Buffer<ffi::F32>>()    // values (*L, V) ascending
                                  .Ret<ffi::Buffer<ffi::S32>>());  // ids (*L, V): where each came from

extern "C" __attribute__((visibility("default"))) XLA_FFI_Error* hlofuse_sample_top_mass(XLA_FFI_CallFrame* call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(hlofuse_sample_top_mass, hlofuse::cpu::SampleTopMass,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // probs (*L, V): L folds into rows
                                  .Ret<ffi::Buffer<ffi::F32>>()  // values (*L, k): the top count, then zeros
                                  .Ret<ffi::Buffer<ffi::S32>>()  // ids (*L, k): their ids, then -1
                                  .Attr<int64_t>("k")
                                  .Attr<float>("mass"));

extern "C" __attribute__((visibility("default"))) XLA_FFI_Error* hlofuse_sample_top_k(XLA_FFI_CallFrame* call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(hlofuse_sample_top_k, hlofuse::cpu::SampleTopK,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()         // logits (*L, V): L folds into rows
                                  .Arg<ffi::Buffer<ffi::S32>>()  // offsets (*L,): each row's first global id
                                  .Ret<ffi::Buffer<ffi::F32>>()  // values (*L, k)
                                  .Ret<ffi::Buffer<ffi::S32>>()  // ids (*L, k): global vocabulary ids
                                  .Attr<int64_t>("k"));

extern "C" __attribute__((visibility("default"))) XLA_FFI_Error* hlofuse_sample(XLA_FFI_CallFrame* call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(hlofuse_sample, hlofuse::cpu::Sample,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()         // logits (*L, V): L folds into rows
                                  .Arg<ffi::Buffer<ffi::U32>>()  // keys (*L, 2): the key, per row
                                  .Arg<ffi::Buffer<ffi::S32>>()  // row ids (*L,): global row index
                                  .RemainingArgs()               // offsets? (*L,) s32; form 13: scales f32
                                  .Ret<ffi::Buffer<ffi::S32>>()  // tokens (*L,): global vocabulary ids
                                  .RemainingRets()               // scores? (*L,) f32: each winner's score
                                  .Attr<int64_t>("form")
                                  .Attr<float>("temperature")
                                  .Attr<int64_t>("k")
                                  .Attr<float>("p")
                                  .Attr<float>("min_p")
                                  .Attr<int64_t>("vocab_total")     // 0: V; else the global V of a split
                                  .Attr<float>("gumbel_at_zero"));  // NaN: JAX's; else a hand-written noise's

// The vector ISA the sampler picks here ($HLOFUSE_CPU_ISA lowers it).
extern "C" __attribute__((visibility("default"))) const char* hlofuse_sample_isa() {
  return hlofuse::cpu::SelectOps().name;
}

// Noise draws (threefry) and exact noise evaluations (logs) since the last call, over all rows.
extern "C" __attribute__((visibility("default"))) void hlofuse_sample_stats(int64_t* draws, int64_t* logs) {
  *draws = hlofuse::cpu::g_noise_draws.exchange(0);
  *logs = hlofuse::cpu::g_noise_logs.exchange(0);
}

extern "C" __attribute__((visibility("default"))) XLA_FFI_Error* hlofuse_sample_sort_integers(
    XLA_FFI_CallFrame* call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(hlofuse_sample_sort_integers, hlofuse::cpu::SampleSortIntegers,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::S32>>()    // keys (*L, V): L folds into rows
                                  .Ret<ffi::Buffer<ffi::S32>>()    // values (*L, V) ascending
                                  .Ret<ffi::Buffer<ffi::S32>>());  // ids (*L, V): where each came from

extern "C" __attribute__((visibility("default"))) XLA_FFI_Error* hlofuse_sample_sort_descending(
    XLA_FFI_CallFrame* call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(hlofuse_sample_sort_descending, hlofuse::cpu::SampleSortDescending,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()    // logits (*L, V): L folds into rows
                                  .Ret<ffi::Buffer<ffi::F32>>()    // values (*L, V) as lax.top_k orders them
                                  .Ret<ffi::Buffer<ffi::S32>>());  // ids (*L, V): where each came from

extern "C" __attribute__((visibility("default"))) XLA_FFI_Error* hlofuse_sample_nucleus_band(
    XLA_FFI_CallFrame* call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(hlofuse_sample_nucleus_band, hlofuse::cpu::SampleNucleusBand,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // logits (*L, V): L folds into rows
                                  .Ret<ffi::Buffer<ffi::F32>>()  // lo (*L,): draw among x >= lo
                                  .Ret<ffi::Buffer<ffi::F32>>()  // hi (*L,): a winner with x > hi is certain
                                  .Attr<double>("p")             // the mass kept (1 - the removal threshold)
                                  .Attr<bool>("from_below")      // the program's cumsum runs from the smallest
                                  .Attr<bool>("by_place"));      // it cuts by sorted place, not by value

extern "C" __attribute__((visibility("default"))) XLA_FFI_Error* hlofuse_sample_at_or_above(
    XLA_FFI_CallFrame* call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(hlofuse_sample_at_or_above, hlofuse::cpu::SampleAtOrAbove,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()    // logits (*L, V): L folds into rows
                                  .Arg<ffi::Buffer<ffi::F32>>()    // floors (*L,)
                                  .Ret<ffi::Buffer<ffi::F32>>()    // values (*L, k) in lax.top_k's order, then -inf
                                  .Ret<ffi::Buffer<ffi::S32>>()    // ids (*L, k), then -1
                                  .Ret<ffi::Buffer<ffi::S32>>());  // counts (*L,): how many are at or above

extern "C" __attribute__((visibility("default"))) XLA_FFI_Error* hlofuse_sample_whole_rows(
    XLA_FFI_CallFrame* call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(hlofuse_sample_whole_rows, hlofuse::cpu::SampleWholeRows,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()    // logits (*L, V)
                                  .Ret<ffi::Buffer<ffi::F32>>());  // the same (*L, V)

extern "C" __attribute__((visibility("default"))) XLA_FFI_Error* hlofuse_sample_noise_bits(
    XLA_FFI_CallFrame* call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(hlofuse_sample_noise_bits, hlofuse::cpu::SampleNoiseBits,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::U32>>()    // keys (rows, 2): each row's key
                                  .Arg<ffi::Buffer<ffi::S32>>()    // row ids (rows,): counters from row_id * V
                                  .Ret<ffi::Buffer<ffi::U32>>());  // bits (rows, V)
