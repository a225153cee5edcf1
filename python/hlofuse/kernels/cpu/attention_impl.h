// Flash-attention body, compiled once per ISA (FlashAttention-2 style: Dao, 2023).
//
// Included inside an ISA namespace after one of vec_*.h, which supplies vf, kW, kMR, kNV and the
// v* primitives. Uses no std:: templates, so nothing compiled here can be shared across ISAs.
//
// A tile is (b, kv head kh, tile_t query positions) and holds M = tile_t * G rows, one per
// (position, query head of kh's group), so the G heads sharing a kv head read each K/V block once.
// Per key block of block_k keys:
//   S^T (jn, Mp)  = K_blk (jn, H) . Q^T (H, Mp)          lanes run over query rows
//   S^T           = mask(softcap(S^T) + bias)            masked logits take masked_value
//   m, l, P^T     = online softmax over the block         running max m and sum l per row
//   O (M, Dp)     = O * alpha + P (M, jn) . V_blk (jn, Dp)
// Tiles of at most 4 rows (decode) keep S row major instead, lanes over keys (process_block_rows).
// Key blocks outside every row's causal / window / kv_lengths range are never read. With a finite
// masked_value those keys still count (the reference averages over them), so finalize() adds them
// as one virtual key: logit masked_value, multiplicity c, value sum(v) over the skipped keys.

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
inline int64_t div_up(int64_t x, int64_t m) { return (x + m - 1) / m; }
constexpr float kInf = __builtin_inff();

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline uint16_t f32_to_bf16(float f) {  // round to nearest even, NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// exp(x) for x <= 0; -inf gives 0, NaN stays NaN. Degree-7 Taylor on |r| <= ln2/2 (rel. err ~1e-8).
inline vf vexp_nonpos(vf x) {
  const vf lo = vset1(-87.0f);
  vf xc = vmax(lo, x);
  vf n = vround(vmul(xc, vset1(1.44269504088896341f)));
  vf r = vfma(n, vset1(-0.693145751953125f), xc);
  r = vfma(n, vset1(-1.42860682030941723e-6f), r);
  vf p = vset1(1.0f / 5040.0f);
  p = vfma(p, r, vset1(1.0f / 720.0f));
  p = vfma(p, r, vset1(1.0f / 120.0f));
  p = vfma(p, r, vset1(1.0f / 24.0f));
  p = vfma(p, r, vset1(1.0f / 6.0f));
  p = vfma(p, r, vset1(0.5f));
  p = vfma(p, r, vset1(1.0f));
  p = vfma(p, r, vset1(1.0f));
  return vexp_finish(x, lo, p, n);
}

// tanh: odd Taylor series below |y| = 0.55 (10 terms), (1 - e^-2|y|) / (1 + e^-2|y|) above.
inline vf vtanh(vf y) {
  vf a = vabs(y);
  vf a2 = vmul(a, a);
  vf p = vset1(-2.3912911424355248e-4f);
  p = vfma(p, a2, vset1(5.90027440945586e-4f));
  p = vfma(p, a2, vset1(-1.4558343870513183e-3f));
  p = vfma(p, a2, vset1(3.592128036572481e-3f));
  p = vfma(p, a2, vset1(-8.863235529902197e-3f));
  p = vfma(p, a2, vset1(2.1869488536155203e-2f));
  p = vfma(p, a2, vset1(-5.396825396825397e-2f));
  p = vfma(p, a2, vset1(0.13333333333333333f));
  p = vfma(p, a2, vset1(-0.3333333333333333f));
  p = vfma(p, a2, vset1(1.0f));
  vf small = vmul(p, a);
  vf e = vexp_nonpos(vmul(a, vset1(-2.0f)));
  vf big = vdiv(vsub(vset1(1.0f), e), vadd(vset1(1.0f), e));
  return vcopysign(vselect_lt(a, vset1(0.55f), small, big), y);
}

//===--- Register-blocked micro-kernel -----------------------------------------------------===//

// kW elements of a K or V row as f32: in place for f32, widened on the load for bf16 (exact).
inline vf vload_row(const float* p) { return vload(p); }
inline vf vload_row(const uint16_t* p) { return vload_bf16(p); }

// C (MR, NV*kW) (+)= sum_kk A(i, kk) * B(kk, :), with A(i, kk) = a[i*sai + kk*sak] broadcast and
// B(kk, :) = b[kk*ldb ...] contiguous. The MR x NV accumulators stay in registers over all of kc.
// ACC: C starts from its old value, times row_scale[i] when row_scale is not null.
template <int MR, int NV, bool ACC, typename BT = float>
void micro_kernel(int64_t kc, const float* a, int64_t sai, int64_t sak, const BT* b, int64_t ldb, float* c, int64_t ldc,
                  const float* row_scale) {
  vf acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    const vf sc = vset1(row_scale ? row_scale[i] : 1.0f);
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[i][v] = ACC ? vmul(vload(c + i * ldc + v * kW), sc) : vzero();
  }
  for (int64_t kk = 0; kk < kc; ++kk) {
    const BT* bk = b + kk * ldb;
    const float* ak = a + kk * sak;
    vf bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = vload_row(bk + v * kW);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      vf av = vset1(ak[i * sai]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] = vfma(av, bv[v], acc[i][v]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) vstore(c + i * ldc + v * kW, acc[i][v]);
}

template <int MR, bool ACC, typename BT>
void micro_kernel_nv(int nv, int64_t kc, const float* a, int64_t sai, int64_t sak, const BT* b, int64_t ldb, float* c,
                     int64_t ldc, const float* rs) {
  switch (nv) {
    case 1: micro_kernel<MR, 1, ACC, BT>(kc, a, sai, sak, b, ldb, c, ldc, rs); return;
    case 2:
      if constexpr (kNV >= 2) micro_kernel<MR, 2, ACC, BT>(kc, a, sai, sak, b, ldb, c, ldc, rs);
      return;
    case 3:
      if constexpr (kNV >= 3) micro_kernel<MR, 3, ACC, BT>(kc, a, sai, sak, b, ldb, c, ldc, rs);
      return;
    default:
      if constexpr (kNV >= 4) micro_kernel<MR, 4, ACC, BT>(kc, a, sai, sak, b, ldb, c, ldc, rs);
      return;
  }
}

// C (rows, cols) (+)= A (rows, kc) . B (kc, cols); cols is a multiple of kW. With ACC and row_scale,
// C = diag(row_scale) C + A . B.
template <bool ACC, typename BT = float>
void gemm(int64_t rows, int64_t cols, int64_t kc, const float* a, int64_t sai, int64_t sak, const BT* b, int64_t ldb,
          float* c, int64_t ldc, const float* row_scale = nullptr) {
  for (int64_t c0 = 0; c0 < cols; c0 += kNV * kW) {
    int nv = static_cast<int>(imin(kNV, (cols - c0) / kW));
    for (int64_t r0 = 0; r0 < rows; r0 += kMR) {
      const float* ar = a + r0 * sai;
      float* cr = c + r0 * ldc + c0;
      const float* rs = row_scale ? row_scale + r0 : nullptr;
      switch (imin(kMR, rows - r0)) {
        case 1: micro_kernel_nv<1, ACC, BT>(nv, kc, ar, sai, sak, b + c0, ldb, cr, ldc, rs); break;
        case 2: micro_kernel_nv<2, ACC, BT>(nv, kc, ar, sai, sak, b + c0, ldb, cr, ldc, rs); break;
        case 3: micro_kernel_nv<3, ACC, BT>(nv, kc, ar, sai, sak, b + c0, ldb, cr, ldc, rs); break;
        case 4: micro_kernel_nv<4, ACC, BT>(nv, kc, ar, sai, sak, b + c0, ldb, cr, ldc, rs); break;
        case 5:
          if constexpr (kMR >= 5) micro_kernel_nv<5, ACC, BT>(nv, kc, ar, sai, sak, b + c0, ldb, cr, ldc, rs);
          break;
        default:
          if constexpr (kMR >= 6) micro_kernel_nv<6, ACC, BT>(nv, kc, ar, sai, sak, b + c0, ldb, cr, ldc, rs);
          break;
      }
    }
  }
}

// Few-row tiles (decode): S[r][j] = q_r . k_j with lanes over H, MR rows x 4 keys per step, so a
// tile of 1..4 rows does not waste the lanes the GEMM path would spread over query rows. S is row
// major (see process_block_rows).
template <int MR, typename KT>
void qk_dot(int64_t jn, int64_t hp, const float* qr, const KT* k, int64_t ldk, float* s, int64_t ldsr) {
  int64_t j = 0;
  for (; j + 4 <= jn; j += 4) {
    vf acc[MR][4];
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) acc[r][u] = vzero();
    const KT* kj = k + j * ldk;
    for (int64_t h = 0; h < hp; h += kW) {
      vf kv[4];
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) kv[u] = vload_row(kj + u * ldk + h);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        vf qv = vload(qr + r * hp + h);
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) acc[r][u] = vfma(qv, kv[u], acc[r][u]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) s[r * ldsr + j + u] = vhsum(acc[r][u]);
  }
  for (; j < jn; ++j) {
    for (int r = 0; r < MR; ++r) {
      vf acc = vzero();
      for (int64_t h = 0; h < hp; h += kW) acc = vfma(vload(qr + r * hp + h), vload_row(k + j * ldk + h), acc);
      s[r * ldsr + j] = vhsum(acc);
    }
  }
}

template <typename KT>
void qk_dot_rows(int64_t rows, int64_t jn, int64_t hp, const float* qr, const KT* k, int64_t ldk, float* s,
                 int64_t ldsr) {
  switch (rows) {
    case 1: qk_dot<1>(jn, hp, qr, k, ldk, s, ldsr); return;
    case 2: qk_dot<2>(jn, hp, qr, k, ldk, s, ldsr); return;
    case 3: qk_dot<3>(jn, hp, qr, k, ldk, s, ldsr); return;
    default: qk_dot<4>(jn, hp, qr, k, ldk, s, ldsr); return;
  }
}

//===--- Tiles and scratch -----------------------------------------------------------------===//

#if defined(HLOFUSE_BF16_TILES)
// The bf16 tile products store S^T in whole 16-key tiles and read P in 32-key steps.
inline int64_t s_rows(int64_t block_k) { return round_up(block_k, 32); }
#else
inline int64_t s_rows(int64_t block_k) { return block_k; }
#endif

// Per-worker scratch, in floats; every region starts on a 64-byte boundary.
struct Scratch {
  float* qt;     // (H, Mp) scaled Q^T
  float* qr;     // (Mp, Hp) scaled Q, rows zero-padded to Hp (few-row tiles: the dot-product path)
  float* s;      // (block_k, Mp) logits, then probabilities: S^T, or S (Mp, block_k) for few-row tiles
  float* o;      // (Mp, Dp) unnormalised output
  float* kp;     // (block_k, Hp) K block as f32, packed (see k_block)
  float* vp;     // (block_k, Dp) V block as f32, packed and zero-padded (see v_block)
  float* m;      // (Mp) running max
  float* l;      // (Mp) running sum
  float* alpha;  // (Mp) rescale factor of the last block
  float* lo;     // (Mp) first visible key of each row
  float* hi;     // (Mp) one past the last visible key
  float* vsum;   // (Dp) sum of v over skipped keys
#if defined(HLOFUSE_BF16_TILES)
  uint32_t* qv;  // (Ha / 2, Mp) unscaled Q^T as bf16 pairs along H (the VNNI layout), Ha = H rounded to 32
  uint16_t* kb;  // (Ja, Ha) K block as bf16, Ja = block_k rounded to 32; padding is zero
  uint16_t* pb;  // (Mp, Ja) P as bf16 rows (S^T transposed); keys past the block are zero
  uint32_t* vb;  // (Ja / 2, Dp) V block as bf16 pairs along the keys (VNNI); padding is zero
#endif
};

inline Scratch carve_scratch(const AttentionArgs& args, const AttentionPlan& plan, float* base, int64_t* total) {
  const int64_t mp = plan.rows_pad, dp = plan.d_pad, bk = plan.block_k;
  int64_t off = 0;
  auto take = [&](int64_t n) {
    float* p = base ? base + off : nullptr;
    off += round_up(n, 16);
    return p;
  };
  Scratch sc;
  sc.qt = take(args.H * mp);
  sc.qr = take(mp * round_up(args.H, kW));
  sc.s = take(imax(s_rows(bk) * mp, mp * round_up(bk, kW)));  // S^T, or S for few-row tiles
  sc.o = take(mp * dp);
  sc.kp = take(bk * round_up(args.H, kW));
  sc.vp = take(bk * dp);
  sc.m = take(mp);
  sc.l = take(mp);
  sc.alpha = take(mp);
  sc.lo = take(mp);
  sc.hi = take(mp);
  sc.vsum = take(dp);
#if defined(HLOFUSE_BF16_TILES)
  const int64_t ha = round_up(args.H, 32), ja = round_up(bk, 32);
  sc.qv = reinterpret_cast<uint32_t*>(take(ha / 2 * mp));
  sc.kb = reinterpret_cast<uint16_t*>(take(ja * ha / 2));
  sc.pb = reinterpret_cast<uint16_t*>(take(mp * ja / 2));
  sc.vb = reinterpret_cast<uint32_t*>(take(ja / 2 * dp));
#endif
  if (total) *total = off;
  return sc;
}

inline int64_t scratch_floats(const AttentionArgs& args, const AttentionPlan& plan) {
  int64_t total = 0;
  carve_scratch(args, plan, nullptr, &total);
  return total;
}

struct Tile {
  int64_t b, kh, t0, tn, rows;
  int64_t key_lo, key_hi;  // union of the rows' visible key ranges (empty when key_lo >= key_hi)
  int64_t max_lo, min_hi;  // a block [j0, j1) needs no range mask iff max_lo <= j0 && j1 <= min_hi
  int64_t kb0, kb1;        // key blocks to read: [kb0, kb1)
};

// Locates tile `id` (later query positions first, since causal tiles there carry more work) and
// fills lo / hi with each row's visible key range.
inline Tile locate_tile(const AttentionArgs& args, const AttentionPlan& plan, int64_t id, float* lo, float* hi) {
  const int64_t G = plan.groups, nqt = plan.n_qtiles;
  Tile tl;
  tl.b = id / (args.K * nqt);
  tl.kh = (id / nqt) % args.K;
  tl.t0 = (nqt - 1 - id % nqt) * plan.tile_t;
  tl.tn = imin(plan.tile_t, args.T - tl.t0);
  tl.rows = tl.tn * G;
  const int64_t q_len = args.q_lengths ? imax(0, imin(args.q_lengths[tl.b], args.T)) : args.T;
  const int64_t kv_len = args.kv_lengths ? imax(0, imin(args.kv_lengths[tl.b], args.S)) : args.S;
  const int64_t q_offset = args.q_offsets ? args.q_offsets[tl.b] : args.q_offset;
  tl.key_lo = args.S, tl.key_hi = 0, tl.max_lo = 0, tl.min_hi = args.S;
  for (int64_t tt = 0; tt < tl.tn; ++tt) {
    const int64_t t = tl.t0 + tt, pos = t + q_offset;
    int64_t a = 0, z = kv_len;
    if (args.window_left >= 0) a = imax(a, pos - args.window_left);
    if (args.window_right >= 0) z = imin(z, pos + args.window_right + 1);
    float lof = static_cast<float>(a), hif = static_cast<float>(z);
    if (t >= q_len || a >= z) {
      lof = kInf, hif = -kInf;
      tl.max_lo = args.S + 1, tl.min_hi = -1;
    } else {
      tl.key_lo = imin(tl.key_lo, a), tl.key_hi = imax(tl.key_hi, z);
      tl.max_lo = imax(tl.max_lo, a), tl.min_hi = imin(tl.min_hi, z);
    }
    for (int64_t g = 0; g < G; ++g) lo[tt * G + g] = lof, hi[tt * G + g] = hif;
  }
  for (int64_t r = tl.rows; r < plan.rows_pad; ++r) lo[r] = kInf, hi[r] = -kInf;
  tl.kb0 = tl.kb1 = 0;
  if (tl.key_lo < tl.key_hi) tl.kb0 = tl.key_lo / plan.block_k, tl.kb1 = div_up(tl.key_hi, plan.block_k);
  return tl;
}

// Element offsets of row r's (t, n) in a (B, T, N, X) tensor, and its head n.
inline int64_t row_t(const Tile& tl, const AttentionPlan& plan, int64_t r) { return tl.t0 + r / plan.groups; }
inline int64_t row_n(const Tile& tl, const AttentionPlan& plan, int64_t r) {
  return tl.kh * plan.groups + r % plan.groups;
}

// Whether a tile of `rows` rows takes the dot-product path for S = Q.K^T (lanes over H).
inline bool use_qk_dot(int64_t rows) { return kW > 1 && rows <= 4 && 4 * rows <= kW; }

// Q (Mp, Hp) = scale * q rows of the tile, for the dot path; padding is zero.
inline void pack_q_rows(const AttentionArgs& args, const AttentionPlan& plan, const Tile& tl, float* qr) {
  const int64_t H = args.H, hp = round_up(H, kW);
  for (int64_t r = 0; r < tl.rows; ++r) {
    const int64_t off = ((tl.b * args.T + row_t(tl, plan, r)) * args.N + row_n(tl, plan, r)) * H;
    for (int64_t h = 0; h < hp; ++h) {
      float x = 0.0f;
      if (h < H && args.dtype == ElemType::kF32) x = static_cast<const float*>(args.q)[off + h];
      if (h < H && args.dtype == ElemType::kBF16) x = bf16_to_f32(static_cast<const uint16_t*>(args.q)[off + h]);
      qr[r * hp + h] = x * args.scale;
    }
  }
}

// Q^T (H, Mp) = scale * q rows of the tile; padded rows are zero.
inline void pack_q(const AttentionArgs& args, const AttentionPlan& plan, const Tile& tl, float* qt) {
  const int64_t mp = plan.rows_pad, H = args.H;
  for (int64_t r = 0; r < mp; ++r) {
    if (r >= tl.rows) {
      for (int64_t h = 0; h < H; ++h) qt[h * mp + r] = 0.0f;
      continue;
    }
    const int64_t off = ((tl.b * args.T + row_t(tl, plan, r)) * args.N + row_n(tl, plan, r)) * H;
    if (args.dtype == ElemType::kF32) {
      const float* src = static_cast<const float*>(args.q) + off;
      for (int64_t h = 0; h < H; ++h) qt[h * mp + r] = src[h] * args.scale;
    } else {
      const uint16_t* src = static_cast<const uint16_t*>(args.q) + off;
      for (int64_t h = 0; h < H; ++h) qt[h * mp + r] = bf16_to_f32(src[h]) * args.scale;
    }
  }
}

// A short f32 row, inlined: a libc memcpy call costs more than copying one 256-512 byte row.
inline void f32_row_copy(const float* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) vstore(dst + i, vload(src + i));
  for (; i < n; ++i) dst[i] = src[i];
}

inline void bf16_row_to_f32(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) vstore(dst + i, vload_bf16(src + i));
  for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

// K block rows [j0, j0 + jn) as f32: a pointer and its row stride. The GEMM path (`padded` false)
// always copies into kp: in place, the rows sit K*H*4 bytes apart (a multiple of 4 KiB for common
// shapes), so a block's rows share a few L1 sets and evict each other. The dot path (`padded`,
// rows zero-padded to a multiple of kW) reads f32 rows in place when H is already a multiple.
inline const float* k_block(const AttentionArgs& args, const Tile& tl, int64_t j0, int64_t jn, bool padded, float* kp,
                            int64_t* ld) {
  const int64_t H = args.H, hp = padded ? round_up(H, kW) : H;
  const int64_t off = ((tl.b * args.S + j0) * args.K + tl.kh) * H, stride = args.K * H;
  if (args.dtype == ElemType::kF32 && padded && hp == H) {
    *ld = stride;
    return static_cast<const float*>(args.k) + off;
  }
  for (int64_t j = 0; j < jn; ++j) {
    float* dst = kp + j * hp;
    if (args.dtype == ElemType::kF32) {
      f32_row_copy(static_cast<const float*>(args.k) + off + j * stride, dst, H);
    } else {
      bf16_row_to_f32(static_cast<const uint16_t*>(args.k) + off + j * stride, dst, H);
    }
    for (int64_t h = H; h < hp; ++h) dst[h] = 0.0f;
  }
  *ld = hp;
  return kp;
}

// V block rows [j0, j0 + jn) as f32 with a row stride whose rows are Dp wide (zero-padded on copy).
// Copied into vp except for few-row (dot path) tiles with f32 rows already Dp wide; see k_block.
inline const float* v_block(const AttentionArgs& args, const AttentionPlan& plan, const Tile& tl, int64_t j0,
                            int64_t jn, float* vp, int64_t* ld) {
  const int64_t D = args.D, dp = plan.d_pad, stride = args.K * D;
  const int64_t off = ((tl.b * args.S + j0) * args.K + tl.kh) * D;
  if (args.dtype == ElemType::kF32 && D == dp && use_qk_dot(tl.rows)) {
    *ld = stride;
    return static_cast<const float*>(args.v) + off;
  }
  for (int64_t j = 0; j < jn; ++j) {
    float* dst = vp + j * dp;
    if (args.dtype == ElemType::kF32) {
      f32_row_copy(static_cast<const float*>(args.v) + off + j * stride, dst, D);
    } else {
      bf16_row_to_f32(static_cast<const uint16_t*>(args.v) + off + j * stride, dst, D);
    }
    for (int64_t d = D; d < dp; ++d) dst[d] = 0.0f;
  }
  *ld = dp;
  return vp;
}

#if defined(HLOFUSE_BF16_TILES)
//===--- bf16 tiles (AMX, or AVX512-BF16 dot products) ---------------------------------------===//
//
// bf16 tiles of more than a few rows compute both products as bf16 pair products with f32 sums
// (tile_gemm: AMX tdpbf16ps in amx_tiles.h, or vdpbf16ps in dpbf16_tiles.h) in the same S^T layout
// as the FMA path, so masking and the online softmax below are shared:
//   S^T (Jt, Mp) = K_blk (Jt, Ha) . Q^T (Ha, Mp), then * scale in f32
//   O (Mp, Dp)  += P (Mp, Ja) . V_blk (Ja, Dp), P = S^T transposed, already rounded to bf16
// Jt and Ja are jn rounded up to 16 and 32 keys, Ha is H rounded up to 32; padding is zero.

inline bool use_bf16_tiles(const AttentionArgs& args, int64_t rows) {
  return args.dtype == ElemType::kBF16 && !use_qk_dot(rows);
}

// qv (Ha/2, Mp): word (h2, r) = (q[r][2 h2], q[r][2 h2 + 1]), i.e. the 32-bit transpose of the
// tile's q rows. Unscaled: scaling S^T in f32 (as the reference does) avoids rounding scale * q to bf16.
inline void pack_q_vnni(const AttentionArgs& args, const AttentionPlan& plan, const Tile& tl, uint32_t* qv) {
  const int64_t mp = plan.rows_pad, H = args.H, ha = round_up(H, 32);
  auto q_row = [&](int64_t r) {
    return static_cast<const uint16_t*>(args.q) +
           ((tl.b * args.T + row_t(tl, plan, r)) * args.N + row_n(tl, plan, r)) * H;
  };
  if (H % 32 == 0) {
    vf blk[16];
    for (int64_t c = 0; c < mp; c += 16) {
      for (int64_t h2 = 0; h2 < H / 2; h2 += 16) {
        for (int64_t i = 0; i < 16; ++i)
          blk[i] = c + i < tl.rows ? vload(reinterpret_cast<const float*>(q_row(c + i)) + h2) : vzero();
        vtranspose(blk);
        for (int64_t u = 0; u < 16; ++u) vstore(reinterpret_cast<float*>(qv + (h2 + u) * mp + c), blk[u]);
      }
    }
    return;
  }
  for (int64_t i = 0; i < ha / 2 * mp; ++i) qv[i] = 0;
  for (int64_t r = 0; r < tl.rows; ++r) {
    const uint16_t* src = q_row(r);
    for (int64_t h = 0; h < H; ++h) qv[(h / 2) * mp + r] |= static_cast<uint32_t>(src[h]) << (16 * (h & 1));
  }
}

// kb (Jt, Ha) = K rows [j0, j0 + jn), contiguous for the same reason as k_block.
inline void k_block_bf16(const AttentionArgs& args, const Tile& tl, int64_t j0, int64_t jn, uint16_t* kb) {
  const int64_t H = args.H, ha = round_up(H, 32), stride = args.K * H;
  const uint16_t* src = static_cast<const uint16_t*>(args.k) + ((tl.b * args.S + j0) * args.K + tl.kh) * H;
  for (int64_t j = 0; j < round_up(jn, 16); ++j) {
    uint16_t* dst = kb + j * ha;
    int64_t h = 0;
    if (j < jn)
      for (; h < H; ++h) dst[h] = src[j * stride + h];
    for (; h < ha; ++h) dst[h] = 0;
  }
}

// vb (Ja/2, Dp): word (j2, d) = (v[j0 + 2 j2][d], v[j0 + 2 j2 + 1][d]).
inline void v_block_vnni(const AttentionArgs& args, const AttentionPlan& plan, const Tile& tl, int64_t j0, int64_t jn,
                         uint32_t* vb) {
  const int64_t D = args.D, dp = plan.d_pad, stride = args.K * D;
  const uint16_t* src = static_cast<const uint16_t*>(args.v) + ((tl.b * args.S + j0) * args.K + tl.kh) * D;
  for (int64_t j = 0; j < round_up(jn, 32); j += 2) {
    const uint16_t* r0 = j < jn ? src + j * stride : nullptr;
    const uint16_t* r1 = j + 1 < jn ? src + (j + 1) * stride : nullptr;
    uint32_t* dst = vb + (j / 2) * dp;
    int64_t d = 0;
    if (r1) {
      for (; d + 32 <= D; d += 32) {
        __m512i lo, hi;
        pair_rows(_mm512_loadu_si512(r0 + d), _mm512_loadu_si512(r1 + d), &lo, &hi);
        _mm512_storeu_si512(dst + d, lo);
        _mm512_storeu_si512(dst + d + 16, hi);
      }
    }
    for (; d < dp; ++d) {
      const uint32_t lo = r0 && d < D ? r0[d] : 0u, hi = r1 && d < D ? r1[d] : 0u;
      dst[d] = lo | hi << 16;
    }
  }
}

// pb (Mp, Ja) = P^T (jn, Mp) transposed; keys [jn, Ja) are zero. P is already rounded to bf16, so
// rows 2 j2 and 2 j2 + 1 of P^T pack into one vector of 32-bit words (p[2 j2][r], p[2 j2 + 1][r]),
// and one 16 x 16 transpose of those words yields 32 keys of 16 rows of P: half the shuffles of
// transposing f32 and narrowing afterwards.
inline void p_rows_bf16(const AttentionPlan& plan, int64_t jn, int64_t ldp, const float* s, uint16_t* pb) {
  const int64_t mp = plan.rows_pad, ja = round_up(jn, 32);
  const __m512i hi_half = _mm512_set1_epi32(static_cast<int32_t>(0xffff0000u));
  vf blk[16];
  for (int64_t c = 0; c < mp; c += 16) {
    for (int64_t j0 = 0; j0 < ja; j0 += 32) {
      for (int64_t i = 0; i < 16; ++i) {
        const int64_t j = j0 + 2 * i;
        const __m512i even = j < jn ? _mm512_castps_si512(vload(s + j * mp + c)) : _mm512_setzero_si512();
        const __m512i odd = j + 1 < jn ? _mm512_castps_si512(vload(s + (j + 1) * mp + c)) : _mm512_setzero_si512();
        // (even >> 16) | (odd & 0xffff0000)
        blk[i] = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_srli_epi32(even, 16), odd, hi_half, 0xF8));
      }
      vtranspose(blk);
      for (int64_t u = 0; u < 16; ++u) vstore(reinterpret_cast<float*>(pb + (c + u) * ldp + j0), blk[u]);
    }
  }
}

// O rows *= alpha. Tiles accumulate in place, so the FMA path's rescale-on-load is a separate pass
// here; rows whose running max did not move (alpha == 1, most rows after the first blocks) skip it.
inline void rescale_o(const AttentionPlan& plan, const float* alpha, float* o) {
  const int64_t dp = plan.d_pad;
  for (int64_t c = 0; c < plan.rows_pad; c += 16) {
    uint32_t moved = _mm512_cmp_ps_mask(vload(alpha + c), vset1(1.0f), _CMP_NEQ_UQ);
    while (moved) {
      const int64_t r = c + __builtin_ctz(moved);
      moved &= moved - 1;
      const vf a = vset1(alpha[r]);
      float* row = o + r * dp;
      for (int64_t d = 0; d < dp; d += kW) vstore(row + d, vmul(vload(row + d), a));
    }
  }
}

// S^T = K_blk . Q^T, unscaled (rows [0, jn) are the block's keys). K tiles load in place when the
// block is whole tiles (H a multiple of 32, jn of 16); otherwise from a zero-padded copy.
inline void qk_tiles(const AttentionArgs& args, const AttentionPlan& plan, const Tile& tl, int64_t j0, int64_t jn,
                     const Scratch& sc) {
  const int64_t mp = plan.rows_pad, ha = round_up(args.H, 32);
  TileOperand kt{reinterpret_cast<const char*>(sc.kb), ha * 2, 16 * ha * 2, 64};
  if (args.H % 32 == 0 && jn % 16 == 0) {
    const int64_t ld = args.K * args.H * 2;
    kt = {static_cast<const char*>(args.k) + ((tl.b * args.S + j0) * args.K + tl.kh) * args.H * 2, ld, 16 * ld, 64};
  } else {
    k_block_bf16(args, tl, j0, jn, sc.kb);
  }
  const TileOperand qt{reinterpret_cast<const char*>(sc.qv), mp * 4, 64, 16 * mp * 4};
  tile_gemm<false>(div_up(jn, 16), mp / 16, ha / 32, kt, qt, sc.s, mp * 4);
}

// O = diag(alpha) O + P . V_blk, with V_blk already in vb.
inline void pv_tiles(const AttentionPlan& plan, int64_t jn, const Scratch& sc) {
  const int64_t mp = plan.rows_pad, dp = plan.d_pad, ldp = round_up(plan.block_k, 32);
  rescale_o(plan, sc.alpha, sc.o);
  p_rows_bf16(plan, jn, ldp, sc.s, sc.pb);
  const TileOperand p{reinterpret_cast<const char*>(sc.pb), ldp * 2, 16 * ldp * 2, 64};
  const TileOperand v{reinterpret_cast<const char*>(sc.vb), dp * 4, 64, 16 * dp * 4};
  tile_gemm<true>(mp / 16, dp / 16, div_up(jn, 32), p, v, sc.o, dp * 4);
}
#endif  // HLOFUSE_BF16_TILES

//===--- One key block ---------------------------------------------------------------------===//

// S^T += bias, then S^T = masked_value where the bool mask hides a key. Per kW rows: where the keys
// are contiguous (stride 1), kW x kW blocks are loaded along the keys and transposed into S^T's
// layout; the rest (other key strides, the last jn % kW keys) is scalar.
inline void apply_bias_and_mask(const AttentionArgs& args, const AttentionPlan& plan, const Tile& tl, int64_t j0,
                                int64_t jn, float* s) {
  const int64_t mp = plan.rows_pad;
  const int64_t* bst = args.bias_strides;
  const int64_t* mst = args.mask_strides;
  const bool bias_bf16 = args.bias_dtype == ElemType::kBF16;
  const vf mv = vset1(args.masked_value), zero = vzero();
  int64_t boff[kW], moff[kW];
  vf blk[kW];
  for (int64_t c = 0; c < mp; c += kW) {
    const int64_t nr = imin(kW, tl.rows - c);  // real rows in this chunk; padding rows reuse the last
    if (nr <= 0) break;
    for (int64_t i = 0; i < kW; ++i) {
      const int64_t r = c + imin(i, nr - 1), t = row_t(tl, plan, r), n = row_n(tl, plan, r);
      boff[i] = tl.b * bst[0] + n * bst[1] + t * bst[2] + j0 * bst[3];
      moff[i] = tl.b * mst[0] + n * mst[1] + t * mst[2] + j0 * mst[3];
    }
    if (args.bias) {
      int64_t j = 0;
      if (bst[3] == 1) {
        for (; j + kW <= jn; j += kW) {
          for (int64_t i = 0; i < kW; ++i) {
            blk[i] = bias_bf16 ? vload_bf16(static_cast<const uint16_t*>(args.bias) + boff[i] + j)
                               : vload(static_cast<const float*>(args.bias) + boff[i] + j);
          }
          vtranspose(blk);
          for (int64_t u = 0; u < kW; ++u) vstore(s + (j + u) * mp + c, vadd(vload(s + (j + u) * mp + c), blk[u]));
        }
      }
      for (; j < jn; ++j) {
        for (int64_t i = 0; i < nr; ++i) {
          const int64_t at = boff[i] + j * bst[3];
          s[j * mp + c + i] += bias_bf16 ? bf16_to_f32(static_cast<const uint16_t*>(args.bias)[at])
                                         : static_cast<const float*>(args.bias)[at];
        }
      }
    }
    if (args.mask) {
      int64_t j = 0;
      if (mst[3] == 1) {
        for (; j + kW <= jn; j += kW) {
          for (int64_t i = 0; i < kW; ++i) blk[i] = vload_u8(args.mask + moff[i] + j);
          vtranspose(blk);
          for (int64_t u = 0; u < kW; ++u) {
            float* p = s + (j + u) * mp + c;
            vstore(p, vselect_eq(blk[u], zero, mv, vload(p)));
          }
        }
      }
      for (; j < jn; ++j) {
        for (int64_t i = 0; i < nr; ++i)
          if (!args.mask[moff[i] + j * mst[3]]) s[j * mp + c + i] = args.masked_value;
      }
    }
  }
}

// Prefetches K and V rows [j0, j0 + jn) of the tile's kv head into L2. Each key's row sits in its own
// K*H-element stretch, so the hardware streamers, which stop at 4 KiB pages, miss them.
inline void prefetch_kv(const AttentionArgs& args, const Tile& tl, int64_t j0, int64_t jn) {
  const int64_t elem = args.dtype == ElemType::kF32 ? 4 : 2;
  const char* k = static_cast<const char*>(args.k) + ((tl.b * args.S + j0) * args.K + tl.kh) * args.H * elem;
  const char* v = static_cast<const char*>(args.v) + ((tl.b * args.S + j0) * args.K + tl.kh) * args.D * elem;
  const int64_t krow = args.K * args.H * elem, vrow = args.K * args.D * elem;
  for (int64_t j = 0; j < jn; ++j) {
    for (int64_t off = 0; off < args.H * elem; off += 64) __builtin_prefetch(k + j * krow + off, 0, 2);
    for (int64_t off = 0; off < args.D * elem; off += 64) __builtin_prefetch(v + j * vrow + off, 0, 2);
  }
}

// Few-row tiles (at most 4 rows: decode) keep S row major, (rows, Jv) with Jv = jn rounded up to kW,
// so that the masks and the online softmax run with the lanes over keys. In S^T's layout a 1-row
// tile would use 1 of kW lanes for every exp. Keys [jn, Jv) are -inf, so they weigh 0.
inline int64_t s_row_stride(const AttentionPlan& plan) { return round_up(plan.block_k, kW); }

inline void bias_and_mask_rows(const AttentionArgs& args, const AttentionPlan& plan, const Tile& tl, int64_t j0,
                               int64_t jn, float* s, int64_t ldr) {
  const int64_t* bst = args.bias_strides;
  const int64_t* mst = args.mask_strides;
  const bool bias_bf16 = args.bias_dtype == ElemType::kBF16;
  const vf mv = vset1(args.masked_value), zero = vzero();
  for (int64_t r = 0; r < tl.rows; ++r) {
    const int64_t t = row_t(tl, plan, r), n = row_n(tl, plan, r);
    float* sr = s + r * ldr;
    if (args.bias) {
      const int64_t off = tl.b * bst[0] + n * bst[1] + t * bst[2] + j0 * bst[3];
      int64_t j = 0;
      if (bst[3] == 1) {
        for (; j + kW <= jn; j += kW) {
          const vf b = bias_bf16 ? vload_bf16(static_cast<const uint16_t*>(args.bias) + off + j)
                                 : vload(static_cast<const float*>(args.bias) + off + j);
          vstore(sr + j, vadd(vload(sr + j), b));
        }
      }
      for (; j < jn; ++j) {
        const int64_t at = off + j * bst[3];
        sr[j] += bias_bf16 ? bf16_to_f32(static_cast<const uint16_t*>(args.bias)[at])
                           : static_cast<const float*>(args.bias)[at];
      }
    }
    if (args.mask) {
      const int64_t off = tl.b * mst[0] + n * mst[1] + t * mst[2] + j0 * mst[3];
      int64_t j = 0;
      if (mst[3] == 1) {
        for (; j + kW <= jn; j += kW)
          vstore(sr + j, vselect_eq(vload_u8(args.mask + off + j), zero, mv, vload(sr + j)));
      }
      for (; j < jn; ++j)
        if (!args.mask[off + j * mst[3]]) sr[j] = args.masked_value;
    }
  }
}

// One key block of a few-row tile: S = Q . K_blk^T, masks, online softmax, O = diag(alpha) O + P . V_blk.
inline void process_block_rows(const AttentionArgs& args, const AttentionPlan& plan, const Tile& tl, int64_t j0,
                               int64_t jn, const Scratch& sc) {
  const int64_t ldr = s_row_stride(plan), jv = round_up(jn, kW), dp = plan.d_pad;
  float* s = sc.s;
  const int64_t hp = round_up(args.H, kW);
  // bf16 rows already a whole number of vectors are read in place and widened on the load: a copy would
  // store and reload every element of the block, which the few rows here do not amortise.
  const bool bf16_in_place = args.dtype == ElemType::kBF16 && hp == args.H;
  if (bf16_in_place) {
    const uint16_t* k = static_cast<const uint16_t*>(args.k) + ((tl.b * args.S + j0) * args.K + tl.kh) * args.H;
    qk_dot_rows(tl.rows, jn, hp, sc.qr, k, args.K * args.H, s, ldr);
  } else {
    int64_t ldk;
    const float* kb_ptr = k_block(args, tl, j0, jn, true, sc.kp, &ldk);
    qk_dot_rows(tl.rows, jn, hp, sc.qr, kb_ptr, ldk, s, ldr);
  }

  if (args.softcap != 0.0f) {
    const vf cap = vset1(args.softcap), inv = vset1(1.0f / args.softcap);
    for (int64_t r = 0; r < tl.rows; ++r)
      for (int64_t j = 0; j < jv; j += kW) vstore(s + r * ldr + j, vmul(vtanh(vmul(vload(s + r * ldr + j), inv)), cap));
  }
  if (args.bias || args.mask) bias_and_mask_rows(args, plan, tl, j0, jn, s, ldr);

  const bool partial = !(tl.max_lo <= j0 && j0 + jn <= tl.min_hi);
  const vf mv = vset1(args.masked_value), neg_inf = vset1(-kInf), lanes = vlanes();
  const bool round_p = args.dtype == ElemType::kBF16;
  alignas(64) float lane0[kW];
  for (int64_t r = 0; r < tl.rows; ++r) {
    float* sr = s + r * ldr;
    if (partial) {
      const vf lo = vset1(sc.lo[r]), hi = vset1(sc.hi[r]);
      for (int64_t j = 0; j < jv; j += kW)
        vstore(sr + j, vselect_in(vadd(vset1(static_cast<float>(j0 + j)), lanes), lo, hi, vload(sr + j), mv));
    }
    for (int64_t j = jn; j < jv; ++j) sr[j] = -kInf;
    vf mx = neg_inf, mx2 = neg_inf;
    int64_t j = 0;
    for (; j + 2 * kW <= jv; j += 2 * kW) mx = vmax(mx, vload(sr + j)), mx2 = vmax(mx2, vload(sr + j + kW));
    if (j < jv) mx = vmax(mx, vload(sr + j));
    const float m_old = sc.m[r], row_max = vhmax(vmax(mx, mx2));
    const float m_new = m_old > row_max ? m_old : row_max;
    const float m_use = m_new == -kInf ? 0.0f : m_new;  // all -inf so far: p = 0
    const vf neg_m = vset1(-m_use);
    vf sum = vzero();
    for (j = 0; j < jv; j += kW) {
      const vf e = vexp_nonpos(vadd(vload(sr + j), neg_m));
      sum = vadd(sum, e);
      vstore(sr + j, round_p ? vround_bf16(e) : e);
    }
    vstore(lane0, vexp_nonpos(vset1(m_old - m_use)));
    sc.alpha[r] = lane0[0];
    sc.l[r] = sc.l[r] * lane0[0] + vhsum(sum);
    sc.m[r] = m_new;
  }

  if (args.dtype == ElemType::kBF16 && args.D == dp) {
    const uint16_t* v = static_cast<const uint16_t*>(args.v) + ((tl.b * args.S + j0) * args.K + tl.kh) * args.D;
    gemm<true>(tl.rows, dp, jn, s, ldr, 1, v, args.K * args.D, sc.o, dp, sc.alpha);
    return;
  }
  int64_t ldv;
  const float* vb = v_block(args, plan, tl, j0, jn, sc.vp, &ldv);
  gemm<true>(tl.rows, dp, jn, s, ldr, 1, vb, ldv, sc.o, dp, sc.alpha);
}

inline void process_block(const AttentionArgs& args, const AttentionPlan& plan, const Tile& tl, int64_t kb,
                          int64_t kb_end, const Scratch& sc) {
  const int64_t mp = plan.rows_pad, dp = plan.d_pad;
  const int64_t j0 = kb * plan.block_k, jn = imin(plan.block_k, args.S - j0);
  float* s = sc.s;
  if (kb + 1 < kb_end) prefetch_kv(args, tl, j0 + jn, imin(plan.block_k, args.S - j0 - jn));
  if (use_qk_dot(tl.rows)) {
    process_block_rows(args, plan, tl, j0, jn, sc);
    return;
  }

  // S^T (jn, Mp) = K_blk . Q^T
#if defined(HLOFUSE_BF16_TILES)
  const bool tiles = use_bf16_tiles(args, tl.rows);
  if (tiles) qk_tiles(args, plan, tl, j0, jn, sc);
#else
  constexpr bool tiles = false;
#endif
  if (!tiles) {
    int64_t ldk;
    const float* kb_ptr = k_block(args, tl, j0, jn, false, sc.kp, &ldk);
    gemm<false>(jn, mp, args.H, kb_ptr, ldk, 1, sc.qt, mp, s, mp);
  }

  // The bf16 tile products leave S^T unscaled. The scale joins the first pass that reads S^T: its own
  // pass before soft-cap, bias or mask, else the range mask or the max and exp below (scale > 0
  // keeps the max where it is).
  float pending = 1.0f;
#if defined(HLOFUSE_BF16_TILES)
  if (tiles) pending = args.scale;
#endif
  if (pending != 1.0f && (args.softcap != 0.0f || args.bias || args.mask || !(pending > 0.0f))) {
    const vf f = vset1(pending);
    for (int64_t i = 0; i < jn * mp; i += kW) vstore(s + i, vmul(vload(s + i), f));
    pending = 1.0f;
  }
  if (args.softcap != 0.0f) {
    const vf cap = vset1(args.softcap), inv = vset1(1.0f / args.softcap);
    for (int64_t i = 0; i < jn * mp; i += kW) vstore(s + i, vmul(vtanh(vmul(vload(s + i), inv)), cap));
  }
  if (args.bias || args.mask) apply_bias_and_mask(args, plan, tl, j0, jn, s);

  const bool partial = !(tl.max_lo <= j0 && j0 + jn <= tl.min_hi);
  const vf mv = vset1(args.masked_value), neg_inf = vset1(-kInf);
  const bool round_p = args.dtype == ElemType::kBF16;
  for (int64_t c = 0; c < mp; c += kW) {
    vf f = vset1(pending);
    if (partial) {
      const vf lo = vload(sc.lo + c), hi = vload(sc.hi + c);
      for (int64_t j = 0; j < jn; ++j) {
        float* p = s + j * mp + c;
        vstore(p, vselect_in(vset1(static_cast<float>(j0 + j)), lo, hi, vmul(vload(p), f), mv));
      }
      f = vset1(1.0f);
    }
    vf mx = neg_inf, mx2 = neg_inf;  // two chains: vmax latency, not throughput, bounds this loop
    int64_t j = 0;
    for (; j + 2 <= jn; j += 2) mx = vmax(mx, vload(s + j * mp + c)), mx2 = vmax(mx2, vload(s + (j + 1) * mp + c));
    if (j < jn) mx = vmax(mx, vload(s + j * mp + c));
    mx = vmul(vmax(mx, mx2), f);
    const vf m_old = vload(sc.m + c);
    const vf m_new = vmax(m_old, mx);
    const vf m_use = vselect_eq(m_new, neg_inf, vzero(), m_new);  // all -inf so far: p = 0
    const vf neg_m = vsub(vzero(), m_use);
    vf sum = vzero();
    for (int64_t j = 0; j < jn; ++j) {
      float* p = s + j * mp + c;
      vf e = vexp_nonpos(vfma(vload(p), f, neg_m));  // f == 1: exactly s - m
      sum = vadd(sum, e);
      vstore(p, round_p ? vround_bf16(e) : e);
    }
    const vf alpha = vexp_nonpos(vsub(m_old, m_use));
    vstore(sc.alpha + c, alpha);
    vstore(sc.l + c, vfma(vload(sc.l + c), alpha, sum));
    vstore(sc.m + c, m_new);
  }

  // O = diag(alpha) O + P . V_blk
#if defined(HLOFUSE_BF16_TILES)
  if (tiles) {
    v_block_vnni(args, plan, tl, j0, jn, sc.vb);
    pv_tiles(plan, jn, sc);
    return;
  }
#endif
  int64_t ldv;
  const float* vb = v_block(args, plan, tl, j0, jn, sc.vp, &ldv);
  gemm<true>(tl.rows, dp, jn, s, 1, mp, vb, ldv, sc.o, dp, sc.alpha);
}

inline void init_state(const AttentionPlan& plan, const Scratch& sc) {
  for (int64_t r = 0; r < plan.rows_pad; ++r) sc.m[r] = -kInf, sc.l[r] = 0.0f;
  for (int64_t i = 0; i < plan.rows_pad * plan.d_pad; ++i) sc.o[i] = 0.0f;
}

// vsum = sum of v[b, j, kh, :] over the keys j outside [p0, p1).
inline void sum_skipped_v(const AttentionArgs& args, const AttentionPlan& plan, const Tile& tl, int64_t p0, int64_t p1,
                          float* vsum) {
  for (int64_t d = 0; d < plan.d_pad; ++d) vsum[d] = 0.0f;
  for (int64_t j = 0; j < args.S; ++j) {
    if (j == p0) j = p1;
    if (j >= args.S) break;
    const int64_t off = ((tl.b * args.S + j) * args.K + tl.kh) * args.D;
    if (args.dtype == ElemType::kF32) {
      const float* src = static_cast<const float*>(args.v) + off;
      for (int64_t d = 0; d < args.D; ++d) vsum[d] += src[d];
    } else {
      const uint16_t* src = static_cast<const uint16_t*>(args.v) + off;
      for (int64_t d = 0; d < args.D; ++d) vsum[d] += bf16_to_f32(src[d]);
    }
  }
}

// Adds the skipped keys (outside [p0, p1)) as a virtual key when masked_value is finite, normalises
// and writes the tile's rows of out. A row whose max logit is -inf is NaN, as in the reference.
inline void finalize(const AttentionArgs& args, const AttentionPlan& plan, const Tile& tl, int64_t p0, int64_t p1,
                     const Scratch& sc) {
  const int64_t dp = plan.d_pad, D = args.D;
  const float mvf = args.masked_value;
  const int64_t skipped = args.S - (p1 - p0);
  const bool virtual_key = skipped > 0 && mvf > -kInf && mvf < kInf;
  bool have_vsum = false;
  for (int64_t r = 0; r < tl.rows; ++r) {
    float m = sc.m[r], l = sc.l[r], a = 1.0f, e = 0.0f;
    if (virtual_key) {
      const float mn = m > mvf ? m : mvf;
      a = m == -kInf ? 0.0f : std::exp(m - mn);
      e = std::exp(mvf - mn);
      l = l * a + static_cast<float>(skipped) * e;
      if (args.dtype == ElemType::kBF16) e = round_bf16(e);
      m = mn;
      if (e != 0.0f && !have_vsum) sum_skipped_v(args, plan, tl, p0, p1, sc.vsum), have_vsum = true;
    }
    const float inv = m == -kInf ? __builtin_nanf("") : 1.0f / l;
    const float* orow = sc.o + r * dp;
    const int64_t off = ((tl.b * args.T + row_t(tl, plan, r)) * args.N + row_n(tl, plan, r)) * D;
    if (args.lse) args.lse[off / D] = m == -kInf ? -kInf : m + std::log(l);
    for (int64_t d = 0; d < D; ++d) {
      float x = orow[d];
      if (virtual_key) x = x * a + (e != 0.0f ? e * sc.vsum[d] : 0.0f);
      x *= inv;
      if (args.dtype == ElemType::kF32) {
        static_cast<float*>(args.out)[off + d] = x;
      } else {
        static_cast<uint16_t*>(args.out)[off + d] = f32_to_bf16(x);
      }
    }
  }
}

//===--- Work items ------------------------------------------------------------------------===//

// Item = tile * splits + split: runs the split's share of the tile's key blocks. With one split
// it finalizes into out; otherwise it leaves (m, l, O) in plan.partials for combine_item.
inline void tile_item(const AttentionArgs& args, const AttentionPlan& plan, int64_t item, float* scratch) {
  const Scratch sc = carve_scratch(args, plan, scratch, nullptr);
  const int64_t tile = item / plan.splits, split = item % plan.splits;
  const Tile tl = locate_tile(args, plan, tile, sc.lo, sc.hi);
  const int64_t nb = tl.kb1 - tl.kb0;
  const int64_t b0 = tl.kb0 + nb * split / plan.splits, b1 = tl.kb0 + nb * (split + 1) / plan.splits;
  init_state(plan, sc);
#if defined(HLOFUSE_BF16_TILES)
  const bool tiles = b0 < b1 && use_bf16_tiles(args, tl.rows);
  if (tiles) tiles_begin(), pack_q_vnni(args, plan, tl, sc.qv);
#else
  constexpr bool tiles = false;
#endif
  if (b0 < b1 && use_qk_dot(tl.rows)) pack_q_rows(args, plan, tl, sc.qr);
  if (b0 < b1 && !use_qk_dot(tl.rows) && !tiles) pack_q(args, plan, tl, sc.qt);
  for (int64_t kb = b0; kb < b1; ++kb) process_block(args, plan, tl, kb, b1, sc);
#if defined(HLOFUSE_BF16_TILES)
  if (tiles) tiles_end();
#endif
  if (plan.splits == 1) {
    finalize(args, plan, tl, tl.kb0 * plan.block_k, imin(tl.kb1 * plan.block_k, args.S), sc);
    return;
  }
  float* part = plan.partials + item * plan.partial_floats;
  const int64_t mp = plan.rows_pad;
  std::memcpy(part, sc.m, mp * sizeof(float));
  std::memcpy(part + mp, sc.l, mp * sizeof(float));
  std::memcpy(part + 2 * mp, sc.o, tl.rows * plan.d_pad * sizeof(float));
}

// Item = tile: merges its splits' (m, l, O) (log-sum-exp rescaling), then finalizes into out.
inline void combine_item(const AttentionArgs& args, const AttentionPlan& plan, int64_t tile, float* scratch) {
  const Scratch sc = carve_scratch(args, plan, scratch, nullptr);
  const Tile tl = locate_tile(args, plan, tile, sc.lo, sc.hi);
  const int64_t mp = plan.rows_pad, dp = plan.d_pad;
  init_state(plan, sc);
  for (int64_t sp = 0; sp < plan.splits; ++sp) {
    const float* part = plan.partials + (tile * plan.splits + sp) * plan.partial_floats;
    for (int64_t r = 0; r < tl.rows; ++r) {
      const float mi = part[r], m = sc.m[r];
      const float mn = mi > m ? mi : m;
      if (mn == -kInf) continue;
      const float a = std::exp(m - mn), ai = std::exp(mi - mn);
      sc.l[r] = sc.l[r] * a + part[mp + r] * ai;
      sc.m[r] = mn;
      const vf av = vset1(a), aiv = vset1(ai);
      float* orow = sc.o + r * dp;
      const float* prow = part + 2 * mp + r * dp;
      for (int64_t d = 0; d < dp; d += kW) vstore(orow + d, vfma(vload(prow + d), aiv, vmul(vload(orow + d), av)));
    }
  }
  finalize(args, plan, tl, tl.kb0 * plan.block_k, imin(tl.kb1 * plan.block_k, args.S), sc);
}

// This ISA's entry points (the including translation unit's, as this file sits in its namespace).
inline KernelTable kernel_table(const char* name) { return {name, kW, tile_item, combine_item, scratch_floats}; }
