// AVX-512 vector primitives for attention_impl.h (16 f32 lanes). Included inside an ISA namespace.
constexpr int64_t kW = 16;
constexpr int kMR = 6;  // register tile: kMR rows x kNV vectors of accumulators (24 of 32 zmm)
constexpr int kNV = 4;
using vf = __m512;

inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vset1(float x) { return _mm512_set1_ps(x); }
inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vf x) { _mm512_storeu_ps(p, x); }
inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
inline float vhsum(vf a) { return _mm512_reduce_add_ps(a); }
inline float vhmax(vf a) { return _mm512_reduce_max_ps(a); }
// (0, 1, ..., kW - 1)
inline vf vlanes() { return _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0); }
inline vf vabs(vf a) { return _mm512_abs_ps(a); }
inline vf vround(vf a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
// 2^n for integral n in [-126, 127].
inline vf vpow2i(vf n) {
  __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
  return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
}
// x < lo ? 0 : p * 2^n, for integral n (no range limit: scalef under- and overflows like a multiply).
// A NaN x keeps p's NaN.
inline vf vexp_finish(vf x, vf lo, vf p, vf n) {
  return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ), p, n);
}
// a < b ? x : y
inline vf vselect_lt(vf a, vf b, vf x, vf y) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), y, x);
}
// a == b ? x : y
inline vf vselect_eq(vf a, vf b, vf x, vf y) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ), y, x);
}
// lo <= j < hi ? s : mv
inline vf vselect_in(vf j, vf lo, vf hi, vf s, vf mv) {
  __mmask16 in = _mm512_cmp_ps_mask(lo, j, _CMP_LE_OQ) & _mm512_cmp_ps_mask(j, hi, _CMP_LT_OQ);
  return _mm512_mask_blend_ps(in, mv, s);
}
inline vf vcopysign(vf mag, vf sign) {
  const __m512i m = _mm512_set1_epi32(INT32_MIN);
  return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(m, _mm512_castps_si512(sign), _mm512_castps_si512(mag),
                                                       0xCA));  // bitwise m ? sign : mag
}
// Round to the nearest bf16 (ties to even) and back to f32. Inputs are finite and >= 0 here.
inline vf vround_bf16(vf a) {
  __m512i u = _mm512_castps_si512(a);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32(static_cast<int32_t>(0xffff0000u))));
}
inline vf vload_bf16(const uint16_t* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// r[i] = column i of the 16 x 16 matrix whose rows are r[0..15].
inline void vtranspose(vf* r) {
  vf t[16], u[16];
  for (int i = 0; i < 16; i += 2)
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44), u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44), u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {  // u[4i + k], 128-bit lane L: column 4L + k of rows 4i .. 4i + 3
    const vf x0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x44), x1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xEE);
    const vf y0 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x44), y1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xEE);
    r[k] = _mm512_shuffle_f32x4(x0, y0, 0x88), r[4 + k] = _mm512_shuffle_f32x4(x0, y0, 0xDD);
    r[8 + k] = _mm512_shuffle_f32x4(x1, y1, 0x88), r[12 + k] = _mm512_shuffle_f32x4(x1, y1, 0xDD);
  }
}
inline vf vload_u8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
