// The bf16 tile products' shared layouts, included after vec_avx512.h by each ISA that provides
// tile_gemm (amx_tiles.h, dpbf16_tiles.h).
//
// A product C += A . B takes C as f32 tiles of 16 x 16, A as tiles of 16 rows x 32 bf16 and B as
// tiles of 16 rows x 16 bf16 *pairs* (the "VNNI" layout: B row k2 holds (B[2*k2][n], B[2*k2+1][n])
// for each column n), and sums each pair product in f32.

// One operand of a tiled product, in bytes: tile (i, k) starts at p + i * step_mn + k * step_k and
// its rows are ld apart.
struct TileOperand {
  const char* p;
  int64_t ld, step_mn, step_k;
};

// 32 bf16 of row a and 32 of row b (same columns) interleaved as pairs (a[d], b[d]): columns 0-15
// in lo, 16-31 in hi. This is the VNNI layout of two consecutive k rows.
inline void pair_rows(__m512i a, __m512i b, __m512i* lo, __m512i* hi) {
  alignas(64) static constexpr uint16_t kLo[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                   8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr uint16_t kHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                   24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  *lo = _mm512_permutex2var_epi16(a, _mm512_load_si512(kLo), b);
  *hi = _mm512_permutex2var_epi16(a, _mm512_load_si512(kHi), b);
}
