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
#define HLOFUSE_LANES(W)                                              \
  template <>                                                         \
  struct Lanes<W> {                                                   \
    typedef uint32_t U __attribute__((vector_size(W * 4)));           \
    typedef int32_t I __attribute__((vector_size(W * 4)));            \
    typedef float F __attribute__((vector_size(W * 4)));              \
    typedef double D __attribute__((vector_size(W * 8)));             \
  };
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
#define HLOFUSE_TF_ROUND(r) x0 += x1; x1 = (x1 << (r)) | (x1 >> (32 - (r))); x1 ^= x0;
#define HLOFUSE_TF_EVEN HLOFUSE_TF_ROUND(13) HLOFUSE_TF_ROUND(15) HLOFUSE_TF_ROUND(26) HLOFUSE_TF_ROUND(6)
#define HLOFUSE_TF_ODD HLOFUSE_TF_ROUND(17) HLOFUSE_TF_ROUND(29) HLOFUSE_TF_ROUND(16) HLOFUSE_TF_ROUND(24)
    HLOFUSE_TF_EVEN x0 += k1; x1 += k2 + 1u;
    HLOFUSE_TF_ODD x0 += k2; x1 += k0 + 2u;
    HLOFUSE_TF_EVEN x0 += k0; x1 += k1 + 3u;
    HLOFUSE_TF_ODD x0 += k1; x1 += k2 + 4u;
    HLOFUSE_TF_EVEN x0 += k2; x1 += k0 + 5u;
#undef HLOFUSE_TF_ODD
#undef HLOFUSE_TF_EVEN
#undef HLOFUSE_TF_ROUND
    const V bits = x0 ^ x1;
    std::memcpy(out + i, &bits, sizeof(V));
  }
}

// w[i] = exp(x[i] - m) (0 where x[i] - m < -87 or is NaN, below f32's normal range); returns the sum
// in f64 (any n; no padding needed). A degree-7 Taylor polynomial on |r| <= ln2/2 after n = round(t / ln2): relative error < 1e-8
// before the final rounding, so within an ulp of a correctly rounded exp.
template <int W>
HLOFUSE_SIMD_INLINE double ExpShifted(const float* x, float m, float* w, int64_t n) {
  using VF = typename Lanes<W>::F;
  using VI = typename Lanes<W>::I;
  using VD = typename Lanes<W>::D;
  VD acc{};
  const VF zero{};
  auto block = [&](const float* src, float* dst) __attribute__((always_inline)) {
    VF v;
    std::memcpy(&v, src, sizeof(VF));
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
    acc += __builtin_convertvector(y, VD);
  };
  int64_t i = 0;
  for (; i + W <= n; i += W) block(x + i, w + i);
  if (i < n) {  // the tail through a padded block (-inf lanes add 0)
    float src[W], dst[W];
    for (int l = 0; l < W; ++l) src[l] = i + l < n ? x[i + l] : -__builtin_inff();
    block(src, dst);
    std::memcpy(w + i, dst, (n - i) * sizeof(float));
  }
  double sum = 0;
  for (int l = 0; l < W; ++l) sum += acc[l];
  return sum;
}

#undef HLOFUSE_SIMD_INLINE

}  // namespace hlofuse::cpu::sampling_simd
