// Vector loops of the sampling kernel (sampling.cc), written once with GCC vector extensions and
// compiled per ISA: sampling.cc instantiates them inside functions carrying a `target` attribute
// (AVX-512: 16 lanes, AVX2: 8 lanes, baseline: 4 lanes) and picks one at run time, so no build flag
// assumes the CPU the library runs on.
#pragma once

#include <cstdint>
#include <cstring>

namespace hlofuse::cpu::sampling_simd {

#define HLOFUSE_SIMD_INLINE inline __attribute__((always_inline))

// Vector types of W lanes (a dependent vector_size inside a template typedef is not honoured by GCC).
template <int W>
struct Lanes;
#define HLOFUSE_LANES(W)                                    \
  template <>                                               \
  struct Lanes<W> {                                         \
    typedef uint32_t U __attribute__((vector_size(W * 4))); \
    typedef int32_t I __attribute__((vector_size(W * 4)));  \
    typedef float F __attribute__((vector_size(W * 4)));    \
    typedef double D __attribute__((vector_size(W * 8)));   \
    typedef int8_t B __attribute__((vector_size(W)));       \
  };
HLOFUSE_LANES(2)
HLOFUSE_LANES(4)
HLOFUSE_LANES(8)
HLOFUSE_LANES(16)
#undef HLOFUSE_LANES

// threefry2x32 with 20 rounds on `n` counters base + idx[j]; writes JAX's random bits out0 ^ out1.
template <int W>
HLOFUSE_SIMD_INLINE void Threefry(uint32_t k0, uint32_t k1, uint64_t base, const int32_t* idx, uint32_t* out,
                                  int64_t n) {
  using V = typename Lanes<W>::U;
  const uint32_t k2 = k0 ^ k1 ^ 0x1BD11BDAu;
  const uint32_t base_lo = static_cast<uint32_t>(base), base_hi = static_cast<uint32_t>(base >> 32);
  for (int64_t i = 0; i < n; i += W) {
    V off{};
    std::memcpy(&off, idx + i, sizeof(V));  // idx is padded to a multiple of W by the caller
    V lo = off + base_lo;
    V hi = base_hi - (V)(lo < base_lo);  // carry of the 64-bit counter into its high half
    V x0 = hi + k0, x1 = lo + k1;
#define HLOFUSE_TF_ROUND(r)              \
  x0 += x1;                              \
  x1 = (x1 << (r)) | (x1 >> (32 - (r))); \
  x1 ^= x0;
#define HLOFUSE_TF_EVEN HLOFUSE_TF_ROUND(13) HLOFUSE_TF_ROUND(15) HLOFUSE_TF_ROUND(26) HLOFUSE_TF_ROUND(6)
#define HLOFUSE_TF_ODD HLOFUSE_TF_ROUND(17) HLOFUSE_TF_ROUND(29) HLOFUSE_TF_ROUND(16) HLOFUSE_TF_ROUND(24)
    HLOFUSE_TF_EVEN x0 += k1;
    x1 += k2 + 1u;
    HLOFUSE_TF_ODD x0 += k2;
    x1 += k0 + 2u;
    HLOFUSE_TF_EVEN x0 += k0;
    x1 += k1 + 3u;
    HLOFUSE_TF_ODD x0 += k1;
    x1 += k2 + 4u;
    HLOFUSE_TF_EVEN x0 += k2;
    x1 += k0 + 5u;
#undef HLOFUSE_TF_ODD
#undef HLOFUSE_TF_EVEN
#undef HLOFUSE_TF_ROUND
    const V bits = x0 ^ x1;
    std::memcpy(out + i, &bits, sizeof(V));
  }
}

// w[i] = exp(x[i] - m) (0 where x[i] - m < -87 or is NaN, below f32's normal range); returns the sum
// in f64 (any n; no padding needed). With `bins`, also bins[i] = min(floor((m - x[i]) * bin_scale),
// last_bin) as a float: the histogram bin of x[i] by its distance from m. A degree-7 Taylor polynomial on |r| <= ln2/2
// after n = round(t / ln2): relative error < 1e-8 before the final rounding, so within an ulp of a correctly rounded
// exp.
template <int W>
HLOFUSE_SIMD_INLINE double ExpShifted(const float* x, float m, float* w, int64_t n, float* bins, float bin_scale,
                                      float last_bin) {
  using VF = typename Lanes<W>::F;
  using VI = typename Lanes<W>::I;
  // The f64 sum of each lane, in two half-width accumulators (lanes 0..W/2-1, then the rest): a W-double vector is
  // two registers wide, and GCC kept it on the stack, a store and reload every block.
  using HalfF = typename Lanes<W / 2>::F;
  using HalfD = typename Lanes<W / 2>::D;
  HalfD acc_low{}, acc_high{};
  const VF zero{};
  auto block = [&](const float* src, float* dst, float* bin_dst) __attribute__((always_inline)) {
    VF v;
    std::memcpy(&v, src, sizeof(VF));
    if (bins) {
      VF d = (m - v) * bin_scale;
      d = d < last_bin ? d : last_bin;  // NaN and +inf go to the last bin
      d = __builtin_convertvector(__builtin_convertvector(d, VI), VF);
      std::memcpy(bin_dst, &d, sizeof(VF));
    }
    VF t = v - m;
    const VI live = t >= -87.0f;
    t = live ? t : zero;
    const VF fn = (t * 1.44269504f + 12582912.0f) - 12582912.0f;  // round to nearest
    VF r = t - fn * 0.693145751953125f;
    r = r - fn * 1.428606765330187e-06f;
    VF p = r * (1.0f / 5040) + (1.0f / 720);
    p = p * r + (1.0f / 120);
    p = p * r + (1.0f / 24);
    p = p * r + (1.0f / 6);
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const VI e = (__builtin_convertvector(fn, VI) + 127) << 23;
    VF scale;
    std::memcpy(&scale, &e, sizeof(VF));
    VF y = p * scale;
    y = live ? y : zero;
    std::memcpy(dst, &y, sizeof(VF));
    HalfF low, high;
    std::memcpy(&low, &y, sizeof(HalfF));
    std::memcpy(&high, reinterpret_cast<const char*>(&y) + sizeof(HalfF), sizeof(HalfF));
    acc_low += __builtin_convertvector(low, HalfD);
    acc_high += __builtin_convertvector(high, HalfD);
  };
  int64_t i = 0;
  for (; i + W <= n; i += W) block(x + i, w + i, bins ? bins + i : nullptr);
  if (i < n) {  // the tail through a padded block (-inf lanes add 0)
    float src[W], dst[W], bin_dst[W];
    for (int l = 0; l < W; ++l) src[l] = i + l < n ? x[i + l] : -__builtin_inff();
    block(src, dst, bin_dst);
    std::memcpy(w + i, dst, (n - i) * sizeof(float));
    if (bins) std::memcpy(bins + i, bin_dst, (n - i) * sizeof(float));
  }
  double sum = 0;  // lane by lane in order, as one W-lane accumulator would be summed
  for (int l = 0; l < W / 2; ++l) sum += acc_low[l];
  for (int l = 0; l < W / 2; ++l) sum += acc_high[l];
  return sum;
}

// True if any lane of a comparison result (0 or -1 per lane) is set.
template <int W>
HLOFUSE_SIMD_INLINE bool Any(typename Lanes<W>::I c) {
  const typename Lanes<W>::B b = __builtin_convertvector(c, typename Lanes<W>::B);
  uint64_t words[(W + 7) / 8] = {};
  std::memcpy(words, &b, W);
  uint64_t any = 0;
  for (int j = 0; j < (W + 7) / 8; ++j) any |= words[j];
  return any != 0;
}

// The largest x[i], NaN ignored (-inf if none); *nan says whether a NaN was seen.
template <int W>
HLOFUSE_SIMD_INLINE float MaxOf(const float* x, int64_t n, bool* nan) {
  using VF = typename Lanes<W>::F;
  using VI = typename Lanes<W>::I;
  VF m = VF{} - __builtin_inff();
  VI bad{};
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    VF v;
    std::memcpy(&v, x + i, sizeof(VF));
    m = v > m ? v : m;
    bad |= v != v;
  }
  float best = -__builtin_inff();
  bool any_nan = Any<W>(bad);
  for (int l = 0; l < W; ++l) best = m[l] > best ? m[l] : best;
  for (; i < n; ++i) {
    best = x[i] > best ? x[i] : best;
    any_nan |= x[i] != x[i];
  }
  *nan = any_nan;
  return best;
}

// The first i with x[i] == value (with x[i] NaN if `nan`), or n.
template <int W>
HLOFUSE_SIMD_INLINE int64_t FindFirst(const float* x, int64_t n, float value, bool nan) {
  using VF = typename Lanes<W>::F;
  using VI = typename Lanes<W>::I;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    VF v;
    std::memcpy(&v, x + i, sizeof(VF));
    const VI hit = nan ? v != v : v == value;
    if (Any<W>(hit))
      for (int l = 0; l < W; ++l)
        if (hit[l]) return i + l;
  }
  for (; i < n; ++i)
    if (nan ? x[i] != x[i] : x[i] == value) return i;
  return n;
}

// y[i] = x[i] / t (rounded to bf16 if `bf16`, ties to even, as XLA rounds a bf16 op); returns max y, or NaN where
// some y is NaN.
template <int W>
HLOFUSE_SIMD_INLINE float ScaleMax(const float* x, float t, bool bf16, float* y, int64_t n) {
  using VF = typename Lanes<W>::F;
  using VU = typename Lanes<W>::U;
  using VI = typename Lanes<W>::I;
  VF m = VF{} - __builtin_inff();
  VI bad{};
  auto block = [&](const float* src, float* dst) __attribute__((always_inline)) {
    VF v;
    std::memcpy(&v, src, sizeof(VF));
    VF q = v / t;
    if (bf16) {
      VU bits;
      std::memcpy(&bits, &q, sizeof(VF));
      const VI is_nan = (bits & 0x7fffffffu) > 0x7f800000u;
      const VU rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
      bits = is_nan ? bits : rounded;
      std::memcpy(&q, &bits, sizeof(VF));
    }
    m = q > m ? q : m;
    bad |= q != q;
    std::memcpy(dst, &q, sizeof(VF));
  };
  int64_t i = 0;
  for (; i + W <= n; i += W) block(x + i, y + i);
  if (i < n) {
    float src[W] = {}, dst[W];
    for (int l = 0; l < W; ++l) src[l] = i + l < n ? x[i + l] : -__builtin_inff();
    block(src, dst);
    std::memcpy(y + i, dst, (n - i) * sizeof(float));
  }
  if (Any<W>(bad)) return __builtin_nanf("");
  float best = -__builtin_inff();
  for (int l = 0; l < W; ++l) best = m[l] > best ? m[l] : best;
  return best;
}

// Writes the i in [begin, end) with lo <= v[i] < hi (or v[i] == hi == +inf) to out, ascending; returns
// how many. `out` has room for end - begin + 1.
template <int W>
HLOFUSE_SIMD_INLINE int64_t CollectRange(const float* v, float lo, float hi, int64_t begin, int64_t end, int32_t* out) {
  using VF = typename Lanes<W>::F;
  using VI = typename Lanes<W>::I;
  int64_t count = 0, i = begin;
  // x >= top holds only for x == +inf == hi (GCC lowers a vector == lane by lane here, >= it vectorises)
  const float top = hi == __builtin_inff() ? hi : __builtin_nanf("");
  const VF lo_v = VF{} + lo, hi_v = VF{} + hi, top_v = VF{} + top;
  for (; i + W <= end; i += W) {
    VF x;
    std::memcpy(&x, v + i, sizeof(VF));
    const VI in = (x >= lo_v) & ((x < hi_v) | (x >= top_v));
    if (!Any<W>(in)) continue;
    for (int l = 0; l < W; ++l) {
      out[count] = static_cast<int32_t>(i + l);
      count += in[l] != 0;
    }
  }
  for (; i < end; ++i) {
    out[count] = static_cast<int32_t>(i);
    count += v[i] >= lo && (v[i] < hi || v[i] >= top);
  }
  return count;
}

#undef HLOFUSE_SIMD_INLINE

}  // namespace hlofuse::cpu::sampling_simd
