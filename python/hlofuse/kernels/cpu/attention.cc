// XLA FFI handler `hlofuse_attention`: decodes the call, plans the tiles and runs the kernel of the
// best ISA this CPU supports on XLA's intra-op thread pool.
//
// Operands: q (B,T,N,H), k (B,S,K,H), v (B,S,K,D), then the optional operands that are present,
// in this order: bias (B|1,N|1,T|1,S|1) f32|bf16, mask (same broadcast) pred, q_lengths (B,) s32,
// kv_lengths (B,) s32, q_offsets (B,) s32 (each entry's q_offset in place of the attribute's: a
// query or key-range split shifts its causal / window band by its own start). The has_bias /
// has_mask / has_q_lengths / has_kv_lengths / has_q_offsets attributes say which are present.
// Results: out (B,T,N,D) in q's dtype, then optionally lse (B,T,N) f32, each row's log-sum-exp of
// its logits (so shards of the key range combine exactly).
//
// B may be several leading dims (L..., T, N, H), folded into one: under SPMD, XLA's batch
// partitioner cuts leading dims only, so a multi-device lowering moves the kv heads (and key-range
// splits) in front. Bias and mask then lead with L (folded likewise) or all 1s, lengths and q_offsets are L.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "attention_kernel.h"
#include "xla/ffi/api/ffi.h"

#if defined(HLOFUSE_HAVE_AMX_KERNEL)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace ffi = xla::ffi;

namespace hlofuse::cpu {
namespace {

//===--- ISA selection ---------------------------------------------------------------------===//

bool CpuHasAvx512() {
#if defined(HLOFUSE_HAVE_X86_KERNELS)
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

bool CpuHasAvx2() {
#if defined(HLOFUSE_HAVE_X86_KERNELS)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

#if defined(HLOFUSE_HAVE_AMX_KERNEL)
// AMX-BF16 in cpuid, the tile state enabled by the OS (XCR0 bits 17-18), and on Linux the kernel's
// permission for this process to use it (requested once; the answer covers every thread). Any "no"
// leaves the AVX-512 kernel in charge.
bool RequestAmx() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  if (!amx_bf16 || !amx_tile || !__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return false;  // OSXSAVE
  uint32_t xcr0_lo, xcr0_hi;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if (((xcr0_lo >> 17) & 3) != 3) return false;
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
#endif
  return true;
}

bool CpuHasAmx() {
  static const bool granted = CpuHasAvx512() && RequestAmx();
  return granted;
}
#endif

bool CpuHasAvx512Bf16() {
#if defined(HLOFUSE_HAVE_AVX512BF16_KERNEL)
  return CpuHasAvx512() && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

// Kernels from best to plainest; HLOFUSE_CPU_ISA names the best one a call may use.
constexpr std::string_view kIsaOrder[] = {"amx", "avx512bf16", "avx512", "avx2", "generic"};

// The best kernel this CPU runs; HLOFUSE_CPU_ISA=amx|avx512bf16|avx512|avx2|generic asks for a lower
// one (an unknown name gets generic), and HLOFUSE_CPU_ISA=amx-emulated the AMX kernel with its tile
// instructions in software wherever AVX-512 runs (for tests; generic without AVX-512). avx512bf16 is
// the default only on AMD: on Intel's AMX Xeons vdpbf16ps reached half the FLOP rate of f32 FMAs, so
// widening bf16 to f32 was faster there (see docs/kernels-cpu.md); asked for by name it runs
// wherever the CPU has AVX512-BF16.
KernelTable SelectKernels() {
  const char* env = std::getenv("HLOFUSE_CPU_ISA");
  const std::string_view want = env && *env ? env : kIsaOrder[0];
#if defined(HLOFUSE_HAVE_X86_KERNELS)
  if (want == "amx-emulated" && CpuHasAvx512()) return AmxEmulatedKernels();
#endif
  size_t cap = 0;
  while (cap < std::size(kIsaOrder) - 1 && kIsaOrder[cap] != want) ++cap;
  auto allowed = [&](size_t rank) { return cap <= rank; };
#if defined(HLOFUSE_HAVE_AMX_KERNEL)
  if (allowed(0) && CpuHasAmx()) return AmxKernels();
#endif
#if defined(HLOFUSE_HAVE_AVX512BF16_KERNEL)
  if (allowed(1) && CpuHasAvx512Bf16() && (cap == 1 || __builtin_cpu_is("amd"))) return Avx512Bf16Kernels();
#endif
#if defined(HLOFUSE_HAVE_X86_KERNELS)
  if (allowed(2) && CpuHasAvx512()) return Avx512Kernels();
  if (allowed(3) && CpuHasAvx2()) return Avx2Kernels();
#endif
  return GenericKernels();
}

//===--- Thread pool -----------------------------------------------------------------------===//

// Items are claimed from an atomic counter by the calling thread and by helpers scheduled on
// XLA's pool; the caller returns once every item is done. A helper that starts late finds no
// work and only touches the shared job, which it keeps alive.
struct ParallelJob {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  int64_t n = 0;
  int64_t scratch_floats = 0;
  std::function<void(int64_t, float*)> fn;
  std::mutex mu;
  std::condition_variable cv;

  void Work() {
    float* scratch = nullptr;
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      if (!scratch) scratch = ThreadScratch(scratch_floats);
      fn(i, scratch);
      if (done.fetch_add(1) + 1 == n) {
        std::lock_guard<std::mutex> lock(mu);
        cv.notify_all();
      }
    }
  }

  // A per-thread buffer kept across calls: fresh pages for every call cost more than small tiles.
  static float* ThreadScratch(int64_t floats) {
    struct Buffer {
      float* data = nullptr;
      size_t bytes = 0;
      ~Buffer() { std::free(data); }
    };
    thread_local Buffer buf;
    const size_t bytes = (static_cast<size_t>(floats) * sizeof(float) + 63) / 64 * 64 + 64;
    if (bytes > buf.bytes) {
      std::free(buf.data);
      buf.data = static_cast<float*>(std::aligned_alloc(64, bytes));
      buf.bytes = bytes;
    }
    return buf.data;
  }
};

void ParallelFor(ffi::ThreadPool& pool, int64_t threads, int64_t n, int64_t scratch_floats,
                 std::function<void(int64_t, float*)> fn) {
  if (n <= 0) return;
  auto job = std::make_shared<ParallelJob>();
  job->n = n;
  job->scratch_floats = scratch_floats;
  job->fn = std::move(fn);
  const int64_t helpers = std::min(threads, n) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([job] { job->Work(); });
  job->Work();
  std::unique_lock<std::mutex> lock(job->mu);
  job->cv.wait(lock, [&] { return job->done.load() == n; });
}

//===--- Decoding --------------------------------------------------------------------------===//

bool ElemTypeOf(ffi::DataType t, ElemType* out) {
  if (t == ffi::DataType::F32) return *out = ElemType::kF32, true;
  if (t == ffi::DataType::BF16) return *out = ElemType::kBF16, true;
  return false;
}

std::string DimsStr(ffi::Span<const int64_t> dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + ")";
}

// Strides (in elements) of a (L|1s..., N|1, T|1, S|1) operand, 0 on broadcast dims; its leading dims
// are either all 1 or exactly `lead`, folded into one (B) dim.
ffi::Error BroadcastStrides(const char* what, ffi::AnyBuffer buf, ffi::Span<const int64_t> lead, const int64_t full[4],
                            int64_t strides[4]) {
  auto dims = buf.dimensions();
  const size_t nl = lead.size();
  if (dims.size() != nl + 3)
    return ffi::Error::InvalidArgument(std::string(what) + " must be rank " + std::to_string(nl + 3) + ", got " +
                                       DimsStr(dims));
  bool ones = true, same = true;
  for (size_t i = 0; i < nl; ++i) ones &= dims[i] == 1, same &= dims[i] == lead[i];
  if (!ones && !same)
    return ffi::Error::InvalidArgument(std::string(what) + " dims " + DimsStr(dims) + " lead with neither " +
                                       DimsStr(lead) + " nor 1s");
  int64_t folded[4] = {ones ? 1 : full[0], dims[nl], dims[nl + 1], dims[nl + 2]};
  int64_t stride = 1;
  for (int i = 3; i >= 0; --i) {
    if (folded[i] != 1 && folded[i] != full[i])
      return ffi::Error::InvalidArgument(std::string(what) + " dims " + DimsStr(dims) +
                                         " do not broadcast to (B,N,T,S)");
    strides[i] = folded[i] == 1 ? 0 : stride;
    stride *= folded[i];
  }
  return ffi::Error::Success();
}

// True when a and b have the same first n dims.
bool SameLead(ffi::Span<const int64_t> a, ffi::Span<const int64_t> b, size_t n) {
  if (a.size() < n || b.size() < n) return false;
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return false;
  return true;
}

ffi::Error Attention(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                     ffi::RemainingArgs optional, ffi::Result<ffi::AnyBuffer> out, ffi::RemainingRets extra,
                     float scale, bool causal, int64_t window_left, int64_t window_right, int64_t q_offset,
                     float softcap, float masked_value, bool has_bias, bool has_mask, bool has_q_lengths,
                     bool has_kv_lengths, bool has_q_offsets, int64_t block_q, int64_t block_k, int64_t kv_splits) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), od = out->dimensions();
  const size_t rank = qd.size();
  if (rank < 4 || kd.size() != rank || vd.size() != rank || od.size() != rank)
    return ffi::Error::InvalidArgument("q, k, v and out must have one rank >= 4, got q " + DimsStr(qd) + " k " +
                                       DimsStr(kd) + " v " + DimsStr(vd) + " out " + DimsStr(od));
  const size_t nl = rank - 3;  // leading (batch) dims, folded into B
  const ffi::Span<const int64_t> lead = qd.first(nl);
  AttentionArgs a{};
  a.B = 1;
  for (size_t i = 0; i < nl; ++i) a.B *= qd[i];
  a.T = qd[nl], a.N = qd[nl + 1], a.H = qd[nl + 2];
  a.S = kd[nl], a.K = kd[nl + 1], a.D = vd[nl + 2];
  if (!SameLead(kd, qd, nl) || kd[nl + 2] != a.H || !SameLead(vd, qd, nl) || vd[nl] != a.S || vd[nl + 1] != a.K)
    return ffi::Error::InvalidArgument("k " + DimsStr(kd) + " / v " + DimsStr(vd) + " do not match q " + DimsStr(qd));
  if (a.K == 0 || a.N % a.K != 0)
    return ffi::Error::InvalidArgument("N=" + std::to_string(a.N) + " is not a multiple of K=" + std::to_string(a.K));
  if (!SameLead(od, qd, nl) || od[nl] != a.T || od[nl + 1] != a.N || od[nl + 2] != a.D)
    return ffi::Error::InvalidArgument("out " + DimsStr(od) + " is not (B,T,N,D)");
  if (!ElemTypeOf(q.element_type(), &a.dtype) || k.element_type() != q.element_type() ||
      v.element_type() != q.element_type() || out->element_type() != q.element_type())
    return ffi::Error::InvalidArgument("q, k, v and out must all be f32 or all bf16");
  if (extra.size() > 1) return ffi::Error::InvalidArgument("at most one extra result (lse)");
  if (extra.size() == 1) {
    auto lse = extra.get<ffi::AnyBuffer>(0);
    if (!lse.has_value()) return lse.error();
    auto ld = (*lse)->dimensions();
    if ((*lse)->element_type() != ffi::DataType::F32 || ld.size() != rank - 1 || !SameLead(ld, qd, nl) ||
        ld[nl] != a.T || ld[nl + 1] != a.N)
      return ffi::Error::InvalidArgument("lse " + DimsStr(ld) + " must be f32 (B,T,N)");
    a.lse = static_cast<float*>((*lse)->untyped_data());
  }
  a.q = q.untyped_data(), a.k = k.untyped_data(), a.v = v.untyped_data(), a.out = out->untyped_data();

  const int64_t full[4] = {a.B, a.N, a.T, a.S};
  size_t next = 0;
  auto take = [&](const char* what) -> ffi::ErrorOr<ffi::AnyBuffer> {
    if (next >= optional.size()) return ffi::Unexpected(ffi::Error::InvalidArgument(std::string("missing ") + what));
    return optional.get<ffi::AnyBuffer>(next++);
  };
  if (has_bias) {
    auto buf = take("bias");
    if (!buf.has_value()) return buf.error();
    if (!ElemTypeOf(buf->element_type(), &a.bias_dtype)) return ffi::Error::InvalidArgument("bias must be f32 or bf16");
    if (auto err = BroadcastStrides("bias", *buf, lead, full, a.bias_strides); err.failure()) return err;
    a.bias = buf->untyped_data();
  }
  if (has_mask) {
    auto buf = take("mask");
    if (!buf.has_value()) return buf.error();
    if (buf->element_type() != ffi::DataType::PRED) return ffi::Error::InvalidArgument("mask must be bool");
    if (auto err = BroadcastStrides("mask", *buf, lead, full, a.mask_strides); err.failure()) return err;
    a.mask = static_cast<const uint8_t*>(buf->untyped_data());
  }
  for (auto [present, what, dst] : {std::make_tuple(has_q_lengths, "q_lengths", &a.q_lengths),
                                    std::make_tuple(has_kv_lengths, "kv_lengths", &a.kv_lengths),
                                    std::make_tuple(has_q_offsets, "q_offsets", &a.q_offsets)}) {
    if (!present) continue;
    auto buf = take(what);
    if (!buf.has_value()) return buf.error();
    if (buf->element_type() != ffi::DataType::S32 || buf->dimensions().size() != nl ||
        !SameLead(buf->dimensions(), qd, nl))
      return ffi::Error::InvalidArgument(std::string(what) + " must be int32 of shape " + DimsStr(lead));
    *dst = static_cast<const int32_t*>(buf->untyped_data());
  }
  if (next != optional.size()) return ffi::Error::InvalidArgument("unexpected extra operands");

  a.scale = scale, a.softcap = softcap, a.masked_value = masked_value;
  a.window_left = window_left, a.window_right = causal ? 0 : window_right, a.q_offset = q_offset;

  if (a.lse && a.D == 0) return ffi::Error::InvalidArgument("lse needs D > 0");
  if (a.B * a.T * a.N * a.D == 0) return ffi::Error::Success();
  if (a.S == 0) {  // softmax over no keys: the reference's P.V is an empty sum, the log-sum-exp -inf
    std::memset(a.out, 0, static_cast<size_t>(a.B * a.T * a.N * a.D) * (a.dtype == ElemType::kF32 ? 4 : 2));
    if (a.lse) std::fill(a.lse, a.lse + a.B * a.T * a.N, -__builtin_inff());
    return ffi::Error::Success();
  }

  const KernelTable kt = SelectKernels();
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  AttentionPlan p{};
  p.width = kt.width;
  p.groups = a.N / a.K;
  p.tile_t = std::min(a.T, std::max<int64_t>(1, (block_q > 0 ? block_q : 128) / p.groups));
  p.rows = p.tile_t * p.groups;
  p.rows_pad = (p.rows + kt.width - 1) / kt.width * kt.width;
  p.d_pad = (a.D + kt.width - 1) / kt.width * kt.width;
  p.block_k = block_k > 0 ? block_k : 64;
  p.n_qtiles = (a.T + p.tile_t - 1) / p.tile_t;
  p.n_tiles = a.B * a.K * p.n_qtiles;
  // Decode path: too few tiles to keep every thread busy, so split each tile's key range.
  const int64_t n_blocks = (a.S + p.block_k - 1) / p.block_k;
  p.splits = kv_splits > 0 ? kv_splits
                           : std::min((4 * threads + p.n_tiles - 1) / p.n_tiles, std::max<int64_t>(1, n_blocks / 4));
  p.splits = std::max<int64_t>(1, std::min(p.splits, n_blocks));
  p.partial_floats = 2 * p.rows_pad + p.rows_pad * p.d_pad;
  std::vector<float> partials;
  if (p.splits > 1) {
    partials.resize(static_cast<size_t>(p.n_tiles * p.splits * p.partial_floats));
    p.partials = partials.data();
  }
  const int64_t scratch = kt.scratch_floats(a, p);
  ParallelFor(pool, threads, p.n_tiles * p.splits, scratch, [&](int64_t i, float* s) { kt.tile(a, p, i, s); });
  if (p.splits > 1)
    ParallelFor(pool, threads, p.n_tiles, scratch, [&](int64_t i, float* s) { kt.combine(a, p, i, s); });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace hlofuse::cpu

extern "C" __attribute__((visibility("default"))) XLA_FFI_Error* hlofuse_attention(XLA_FFI_CallFrame* call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(hlofuse_attention, hlofuse::cpu::Attention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .RemainingArgs()        // bias?, mask?, q_lengths?, kv_lengths?, q_offsets?
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .RemainingRets()        // lse?
                                  .Attr<float>("scale")
                                  .Attr<bool>("causal")
                                  .Attr<int64_t>("window_left")
                                  .Attr<int64_t>("window_right")
                                  .Attr<int64_t>("q_offset")
                                  .Attr<float>("softcap")
                                  .Attr<float>("masked_value")
                                  .Attr<bool>("has_bias")
                                  .Attr<bool>("has_mask")
                                  .Attr<bool>("has_q_lengths")
                                  .Attr<bool>("has_kv_lengths")
                                  .Attr<bool>("has_q_offsets")
                                  .Attr<int64_t>("block_q")
                                  .Attr<int64_t>("block_k")
                                  .Attr<int64_t>("kv_splits"));

// Which kernel a call would run on this CPU ("amx", "avx512bf16", "avx512", "avx2" or "generic"), for tests
// and benches.
extern "C" __attribute__((visibility("default"))) const char* hlofuse_cpu_isa() {
  return hlofuse::cpu::SelectKernels().name;
}
