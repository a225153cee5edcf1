// tile_gemm for attention_impl.h with AVX512-BF16 (vdpbf16ps) instead of AMX, included after
// vec_avx512.h and bf16_tiles.h inside the avx512bf16 namespace.
//
// Same operands, layouts and padding as amx_tiles.h, so the bf16 packing in attention_impl.h is
// shared. One vdpbf16ps adds 16 lanes of 2 bf16 products each to f32 sums, in the time of one
// vfmadd231ps on the CPUs that take this kernel (measured on AMD Zen: 2.8 G instructions/s each on
// one core), so it doubles the FLOP rate of widening bf16 to f32 and using FMAs. Register tile:
// kMR rows x kNV vectors of C (24 zmm), per pair step kNV loads of B and kMR broadcasts of A.

inline void tiles_begin() {}
inline void tiles_end() {}

// C (MR, NV*16) (+)= A (MR rows of kw pairs, rows lda bytes apart) . B (kw pair rows, ldb bytes
// apart); ldc in floats.
template <int MR, int NV, bool LOAD_C>
void dp_micro_kernel(int64_t kw, const char* a, int64_t lda, const char* b, int64_t ldb, float* c, int64_t ldc) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = LOAD_C ? vload(c + i * ldc + v * 16) : vzero();
  for (int64_t w = 0; w < kw; ++w) {
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + w * ldb + v * 64);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      int32_t word;
      std::memcpy(&word, a + i * lda + w * 4, sizeof(word));
      const __m512bh av = (__m512bh)_mm512_set1_epi32(word);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, bv[v]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) vstore(c + i * ldc + v * 16, acc[i][v]);
}

template <int MR, bool LOAD_C>
void dp_micro_kernel_nv(int nv, int64_t kw, const char* a, int64_t lda, const char* b, int64_t ldb, float* c,
                        int64_t ldc) {
  switch (nv) {
    case 1: dp_micro_kernel<MR, 1, LOAD_C>(kw, a, lda, b, ldb, c, ldc); return;
    case 2: dp_micro_kernel<MR, 2, LOAD_C>(kw, a, lda, b, ldb, c, ldc); return;
    case 3: dp_micro_kernel<MR, 3, LOAD_C>(kw, a, lda, b, ldb, c, ldc); return;
    default: dp_micro_kernel<MR, 4, LOAD_C>(kw, a, lda, b, ldb, c, ldc); return;
  }
}

// C (mt x nt tiles of 16 x 16 f32, rows ldc bytes apart) (+)= A . B over ksteps tiles of 32 along k.
// Reads A as rows A.ld apart with contiguous pairs along k, and B as pair rows B.ld apart with
// contiguous columns: what every caller passes (A.step_mn = 16 A.ld, A.step_k = 64, B.step_mn = 64,
// B.step_k = 16 B.ld).
template <bool LOAD_C>
void tile_gemm(int64_t mt, int64_t nt, int64_t ksteps, const TileOperand& A, const TileOperand& B, float* c,
               int64_t ldc) {
  const int64_t rows = 16 * mt, cols = 16 * nt, kw = 16 * ksteps, ldcf = ldc / 4;
  for (int64_t c0 = 0; c0 < cols; c0 += kNV * 16) {
    const int nv = static_cast<int>((cols - c0) / 16 < kNV ? (cols - c0) / 16 : kNV);
    const char* b = B.p + c0 * 4;
    for (int64_t r0 = 0; r0 < rows; r0 += kMR) {
      const char* a = A.p + r0 * A.ld;
      float* cr = c + r0 * ldcf + c0;
      switch (rows - r0 < kMR ? rows - r0 : kMR) {
        case 1: dp_micro_kernel_nv<1, LOAD_C>(nv, kw, a, A.ld, b, B.ld, cr, ldcf); break;
        case 2: dp_micro_kernel_nv<2, LOAD_C>(nv, kw, a, A.ld, b, B.ld, cr, ldcf); break;
        case 3: dp_micro_kernel_nv<3, LOAD_C>(nv, kw, a, A.ld, b, B.ld, cr, ldcf); break;
        case 4: dp_micro_kernel_nv<4, LOAD_C>(nv, kw, a, A.ld, b, B.ld, cr, ldcf); break;
        case 5: dp_micro_kernel_nv<5, LOAD_C>(nv, kw, a, A.ld, b, B.ld, cr, ldcf); break;
        default: dp_micro_kernel_nv<6, LOAD_C>(nv, kw, a, A.ld, b, B.ld, cr, ldcf); break;
      }
    }
  }
}
