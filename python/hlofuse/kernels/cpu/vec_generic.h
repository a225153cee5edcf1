// Portable scalar "vector" primitives for attention_impl.h (1 lane). Included inside an ISA namespace.
constexpr int64_t kW = 1;
constexpr int kMR = 4;
constexpr int kNV = 4;
using vf = float;

inline vf vzero() { return 0.0f; }
inline vf vset1(float x) { return x; }
inline vf vload(const float* p) { return *p; }
inline void vstore(float* p, vf x) { *p = x; }
inline vf vadd(vf a, vf b) { return a + b; }
inline vf vsub(vf a, vf b) { return a - b; }
inline vf vmul(vf a, vf b) { return a * b; }
inline vf vdiv(vf a, vf b) { return a / b; }
inline vf vfma(vf a, vf b, vf c) { return a * b + c; }
inline vf vmax(vf a, vf b) { return a > b ? a : b; }
inline float vhsum(vf a) { return a; }
inline float vhmax(vf a) { return a; }
inline vf vlanes() { return 0.0f; }
inline vf vabs(vf a) { return std::fabs(a); }
inline vf vround(vf a) { return std::nearbyint(a); }
inline vf vpow2i(vf n) {
  uint32_t u = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
inline vf vselect_lt(vf a, vf b, vf x, vf y) { return a < b ? x : y; }
// x < lo ? 0 : p * 2^n, for integral n in [-126, 127].
inline vf vexp_finish(vf x, vf lo, vf p, vf n) { return vselect_lt(x, lo, vzero(), vmul(p, vpow2i(n))); }
inline vf vselect_eq(vf a, vf b, vf x, vf y) { return a == b ? x : y; }
inline vf vselect_in(vf j, vf lo, vf hi, vf s, vf mv) { return (lo <= j && j < hi) ? s : mv; }
inline vf vcopysign(vf mag, vf sign) { return std::copysign(mag, sign); }
inline vf vround_bf16(vf a) {
  uint32_t u;
  std::memcpy(&u, &a, sizeof(u));
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&a, &u, sizeof(u));
  return a;
}
inline vf vload_bf16(const uint16_t* p) {
  uint32_t u = static_cast<uint32_t>(*p) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
inline void vtranspose(vf*) {}  // one lane: a 1 x 1 matrix
inline vf vload_u8(const uint8_t* p) { return static_cast<float>(*p); }
