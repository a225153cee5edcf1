// AMX tile primitives for attention_impl.h, included after vec_avx512.h and bf16_tiles.h inside the
// amx namespace.
//
// One AMX product, tdpbf16ps C += A . B, takes C as 16 x 16 f32, A as 16 rows x 32 bf16 and B as
// 16 rows x 16 bf16 *pairs* (the "VNNI" layout: B row k2 holds (B[2*k2][n], B[2*k2+1][n]) for each
// column n). Every tile here is configured full size, 16 rows x 64 bytes, and the callers pad the
// buffers they load from, so no tile shape changes between calls.
//
// Tile registers: 0-3 hold a 2 x 2 block of C, 4-5 two A tiles, 6-7 two B tiles. Each A tile then
// meets two B tiles and each B tile two A tiles: 4 loads per 4 products.

struct alignas(64) AmxTileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Loads the configuration for this thread; the tiles hold state until tiles_end releases them.
inline void tiles_begin() {
  AmxTileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
}

inline void tiles_end() { _tile_release(); }

// C tiles (i0 + {0, 1}, j0 + {0, 1}) (+)= sum over ksteps of A(i, k) . B(j, k); NI, NJ in {1, 2}.
template <int NI, int NJ, bool LOAD_C>
inline void amx_block(int64_t ksteps, const char* a, const TileOperand& A, const char* b, const TileOperand& B, char* c,
                      int64_t ldc, int64_t c_i, int64_t c_j) {
  if constexpr (LOAD_C) {
    _tile_loadd(0, c, ldc);
    if constexpr (NJ > 1) _tile_loadd(1, c + c_j, ldc);
    if constexpr (NI > 1) _tile_loadd(2, c + c_i, ldc);
    if constexpr (NI > 1 && NJ > 1) _tile_loadd(3, c + c_i + c_j, ldc);
  } else {
    _tile_zero(0);
    if constexpr (NJ > 1) _tile_zero(1);
    if constexpr (NI > 1) _tile_zero(2);
    if constexpr (NI > 1 && NJ > 1) _tile_zero(3);
  }
  for (int64_t kk = 0; kk < ksteps; ++kk) {
    const char* ak = a + kk * A.step_k;
    const char* bk = b + kk * B.step_k;
    _tile_loadd(4, ak, A.ld);
    _tile_loadd(6, bk, B.ld);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NJ > 1) {
      _tile_loadd(7, bk + B.step_mn, B.ld);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (NI > 1) {
      _tile_loadd(5, ak + A.step_mn, A.ld);
      _tile_dpbf16ps(2, 5, 6);
    }
    if constexpr (NI > 1 && NJ > 1) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, ldc);
  if constexpr (NJ > 1) _tile_stored(1, c + c_j, ldc);
  if constexpr (NI > 1) _tile_stored(2, c + c_i, ldc);
  if constexpr (NI > 1 && NJ > 1) _tile_stored(3, c + c_i + c_j, ldc);
}

// C (mt x nt tiles of 16 x 16 f32, rows ldc bytes apart) (+)= A . B over ksteps tiles of 32 along k.
template <bool LOAD_C>
void tile_gemm(int64_t mt, int64_t nt, int64_t ksteps, const TileOperand& A, const TileOperand& B, float* c,
               int64_t ldc) {
  char* cb = reinterpret_cast<char*>(c);
  const int64_t c_i = 16 * ldc, c_j = 64;
  for (int64_t i = 0; i < mt; i += 2) {
    const char* a = A.p + i * A.step_mn;
    for (int64_t j = 0; j < nt; j += 2) {
      const char* b = B.p + j * B.step_mn;
      char* cij = cb + i * c_i + j * c_j;
      const bool two_i = i + 1 < mt, two_j = j + 1 < nt;
      if (two_i && two_j) amx_block<2, 2, LOAD_C>(ksteps, a, A, b, B, cij, ldc, c_i, c_j);
      else if (two_i) amx_block<2, 1, LOAD_C>(ksteps, a, A, b, B, cij, ldc, c_i, c_j);
      else if (two_j) amx_block<1, 2, LOAD_C>(ksteps, a, A, b, B, cij, ldc, c_i, c_j);
      else amx_block<1, 1, LOAD_C>(ksteps, a, A, b, B, cij, ldc, c_i, c_j);
    }
  }
}
