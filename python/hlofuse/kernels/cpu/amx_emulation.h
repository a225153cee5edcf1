// AMX tile instructions in software, for the amx-emulated kernel (attention_amx_emulated.cc): the
// AMX kernel's own code (amx_tiles.h and the bf16 packing it shares) runs on any CPU with AVX-512,
// so the tests check its tile configuration, tile indices, strides and C updates on machines without
// AMX. Included after <immintrin.h> and before amx_tiles.h, inside that kernel's namespace.
//
// Each instruction follows the Intel SDM's description (palette 1: 8 tiles of at most 16 rows of 64
// bytes), including the faults: a tile used while unconfigured or outside its configured shape, a
// bad configuration, or a tdpbf16ps whose three tiles do not fit together would raise #UD or #GP on
// an AMX CPU, so here it prints what was wrong and aborts. It is slow (scalar products) and only
// for checking results, never for timing.
//
// tdpbf16ps adds each bf16 pair product in f32 in the SDM's order (even element, then odd), with
// bf16 denormal inputs and f32 denormal results flushed to zero. An AMX CPU may round the pair sum
// differently, so its results can differ from this in the last bits of f32, never by more.

// The intrinsics are macros (or inline functions) in the compiler's AMX headers; these take their
// names for the code that follows.
#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbf16ps
#define _tile_loadconfig emulated_tile_loadconfig
#define _tile_release emulated_tile_release
#define _tile_loadd(tile, base, stride) emulated_tile_loadd(tile, base, stride)
#define _tile_stored(tile, base, stride) emulated_tile_stored(tile, base, stride)
#define _tile_zero(tile) emulated_tile_zero(tile)
#define _tile_dpbf16ps(dst, a, b) emulated_tile_dpbf16ps(dst, a, b)

constexpr int kEmulatedTiles = 8, kEmulatedMaxRows = 16, kEmulatedMaxColsb = 64;

// One thread's tile registers and TILECFG, as the OS keeps them per thread.
struct EmulatedTileState {
  bool configured = false;
  uint16_t colsb[kEmulatedTiles] = {};
  uint8_t rows[kEmulatedTiles] = {};
  alignas(64) unsigned char data[kEmulatedTiles][kEmulatedMaxRows * kEmulatedMaxColsb] = {};
};

inline EmulatedTileState& emulated_tiles() {
  static thread_local EmulatedTileState state;
  return state;
}

[[noreturn]] inline void emulated_tile_fault(const char* instruction, int tile, const char* why) {
  std::fprintf(stderr, "hlofuse amx-emulated: %s on tile %d: %s (an AMX CPU would fault here)\n", instruction, tile,
               why);
  std::abort();
}

// The tile a load, store or product names must be configured (rows and colsb both nonzero).
inline EmulatedTileState& emulated_configured(const char* instruction, int tile) {
  EmulatedTileState& s = emulated_tiles();
  if (tile < 0 || tile >= kEmulatedTiles) emulated_tile_fault(instruction, tile, "no such tile register");
  if (!s.configured) emulated_tile_fault(instruction, tile, "no tile configuration is loaded");
  if (s.rows[tile] == 0) emulated_tile_fault(instruction, tile, "the tile is not configured");
  return s;
}

// ldtilecfg: the 64-byte TILECFG of palette 1 (palette 0 releases the tiles). Zeroes every tile.
inline void emulated_tile_loadconfig(const void* config) {
  unsigned char bytes[64];
  std::memcpy(bytes, config, sizeof(bytes));
  EmulatedTileState& s = emulated_tiles();
  s = EmulatedTileState{};
  const uint8_t palette = bytes[0], start_row = bytes[1];
  if (palette == 0) return;
  if (palette != 1) emulated_tile_fault("ldtilecfg", -1, "palette is not 0 or 1");
  if (start_row != 0) emulated_tile_fault("ldtilecfg", -1, "start_row is not 0");
  for (int i = 2; i < 16; ++i)
    if (bytes[i] != 0) emulated_tile_fault("ldtilecfg", -1, "reserved bytes 2-15 are not 0");
  for (int t = 0; t < 16; ++t) {
    uint16_t colsb;
    std::memcpy(&colsb, bytes + 16 + 2 * t, sizeof(colsb));
    const uint8_t rows = bytes[48 + t];
    if (t >= kEmulatedTiles) {
      if (colsb != 0 || rows != 0) emulated_tile_fault("ldtilecfg", t, "palette 1 has 8 tiles; this one must be 0");
      continue;
    }
    if (rows > kEmulatedMaxRows || colsb > kEmulatedMaxColsb)
      emulated_tile_fault("ldtilecfg", t, "more than 16 rows or 64 bytes a row");
    if ((rows == 0) != (colsb == 0)) emulated_tile_fault("ldtilecfg", t, "rows and colsb must be both 0 or both not");
    s.rows[t] = rows, s.colsb[t] = colsb;
  }
  s.configured = true;
}

// tilerelease: back to the init state; a tile used after it faults.
inline void emulated_tile_release() { emulated_tiles() = EmulatedTileState{}; }

// tileloadd: rows x colsb bytes, rows stride bytes apart; the rest of the register reads as zero.
inline void emulated_tile_loadd(int tile, const void* base, int64_t stride) {
  EmulatedTileState& s = emulated_configured("tileloadd", tile);
  unsigned char* reg = s.data[tile];
  std::memset(reg, 0, sizeof(s.data[tile]));
  for (int r = 0; r < s.rows[tile]; ++r)
    std::memcpy(reg + r * kEmulatedMaxColsb, static_cast<const char*>(base) + r * stride, s.colsb[tile]);
}

inline void emulated_tile_stored(int tile, void* base, int64_t stride) {
  EmulatedTileState& s = emulated_configured("tilestored", tile);
  for (int r = 0; r < s.rows[tile]; ++r)
    std::memcpy(static_cast<char*>(base) + r * stride, s.data[tile] + r * kEmulatedMaxColsb, s.colsb[tile]);
}

inline void emulated_tile_zero(int tile) {
  EmulatedTileState& s = emulated_configured("tilezero", tile);
  std::memset(s.data[tile], 0, sizeof(s.data[tile]));
}

inline float emulated_bf16_daz(uint16_t bits) {
  if ((bits & 0x7f80) == 0) bits &= 0x8000;  // a denormal (or zero) reads as a signed zero
  const uint32_t wide = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}

inline float emulated_f32_ftz(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7f800000u) == 0) bits &= 0x80000000u;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// tdpbf16ps dst += a . b: dst (M x N f32), a (M x K bf16 pairs, colsb = 4K), b (K rows of N pairs).
inline void emulated_tile_dpbf16ps(int dst, int a, int b) {
  EmulatedTileState& s = emulated_configured("tdpbf16ps", dst);
  emulated_configured("tdpbf16ps", a), emulated_configured("tdpbf16ps", b);
  if (dst == a || dst == b || a == b) emulated_tile_fault("tdpbf16ps", dst, "the three tiles must differ");
  if (s.rows[dst] != s.rows[a]) emulated_tile_fault("tdpbf16ps", dst, "dst and a have different rows");
  if (s.colsb[dst] != s.colsb[b]) emulated_tile_fault("tdpbf16ps", dst, "dst and b have different colsb");
  if (s.colsb[a] != 4 * s.rows[b]) emulated_tile_fault("tdpbf16ps", a, "a's colsb is not 4 x b's rows");
  if (s.colsb[dst] % 4 != 0 || s.colsb[a] % 4 != 0)
    emulated_tile_fault("tdpbf16ps", dst, "colsb is not a whole number of f32 / bf16 pairs");
  const int m_rows = s.rows[dst], n_cols = s.colsb[dst] / 4, k_pairs = s.colsb[a] / 4;
  // Rows go through memcpy: the registers are bytes, and reading them as float or uint16_t in place
  // would break strict aliasing.
  float acc[kEmulatedMaxColsb / 4];
  uint16_t a_row[kEmulatedMaxColsb / 2], b_row[kEmulatedMaxColsb / 2];
  for (int m = 0; m < m_rows; ++m) {
    std::memcpy(acc, s.data[dst] + m * kEmulatedMaxColsb, kEmulatedMaxColsb);
    std::memcpy(a_row, s.data[a] + m * kEmulatedMaxColsb, kEmulatedMaxColsb);
    for (int k = 0; k < k_pairs; ++k) {
      std::memcpy(b_row, s.data[b] + k * kEmulatedMaxColsb, kEmulatedMaxColsb);
      const float a_even = emulated_bf16_daz(a_row[2 * k]), a_odd = emulated_bf16_daz(a_row[2 * k + 1]);
      for (int n = 0; n < n_cols; ++n) {
        // Each product of two bf16 is exact in f32, so only the two sums round.
        acc[n] = emulated_f32_ftz(acc[n] + a_even * emulated_bf16_daz(b_row[2 * n]));
        acc[n] = emulated_f32_ftz(acc[n] + a_odd * emulated_bf16_daz(b_row[2 * n + 1]));
      }
    }
    std::memcpy(s.data[dst] + m * kEmulatedMaxColsb, acc, kEmulatedMaxColsb);
  }
}
