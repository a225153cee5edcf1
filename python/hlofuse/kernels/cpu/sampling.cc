// hlofuse_sample: token sampling over (rows, V) logits without sorting the vocabulary.
//
// Returns the token ids of hlofuse.kernels.sampling_reference for each form (sampling.py's FORM_CODES):
// the filters find their threshold from a bounded candidate set (a min-heap of k for top-k, the
// tokens within a growing distance of the row max for top-p), and Gumbel noise is computed only for
// the tokens that survive, from threefry2x32 at the same counters JAX uses (counter = flat index of
// the noise element), with the same float steps (bf16 rounds after every op, as XLA does).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <queue>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace hlofuse::cpu {
namespace {

enum class Form : int64_t {
  kGreedy = 0, kTemperature = 1, kTopK = 2, kTemperatureTopK = 3, kTopKMask = 4, kTopPMask = 5,
  kTopKTopPMask = 6, kMinP = 7,
};

constexpr float kTiny = 1.17549435e-38f;  // finfo(f32).tiny == finfo(bf16).tiny
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

//===--- Floats ----------------------------------------------------------------------------===//

float Bf16ToF32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to the nearest bf16 (ties to even), as XLA rounds each bf16 op's f32 result.
float RoundBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return f;  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  bits &= 0xffff0000u;
  std::memcpy(&f, &bits, 4);
  return f;
}

struct Row {
  const void* data;
  bool bf16;
  int64_t n;
  float operator[](int64_t i) const {
    return bf16 ? Bf16ToF32(static_cast<const uint16_t*>(data)[i]) : static_cast<const float*>(data)[i];
  }
  float Round(float f) const { return bf16 ? RoundBf16(f) : f; }
};

//===--- threefry2x32 and Gumbel noise -------------------------------------------------------===//

inline uint32_t Rotl(uint32_t v, int r) { return (v << r) | (v >> (32 - r)); }

// threefry2x32 (20 rounds) of the counter (hi, lo) under key (k0, k1): JAX's random bits at flat
// index hi:lo are out[0] ^ out[1].
uint32_t ThreefryBits(uint32_t k0, uint32_t k1, uint64_t counter) {
  static constexpr int kRot[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};
  const uint32_t ks[3] = {k0, k1, k0 ^ k1 ^ 0x1BD11BDAu};
  uint32_t x0 = static_cast<uint32_t>(counter >> 32) + ks[0];
  uint32_t x1 = static_cast<uint32_t>(counter) + ks[1];
  for (int block = 0; block < 5; ++block) {
    for (int r = 0; r < 4; ++r) {
      x0 += x1;
      x1 = Rotl(x1, kRot[block % 2][r]) ^ x0;
    }
    x0 += ks[(block + 1) % 3];
    x1 += ks[(block + 2) % 3] + static_cast<uint32_t>(block + 1);
  }
  return x0 ^ x1;
}

// jax.random.gumbel(key, ..., dtype)[counter]: -log(-log(uniform(tiny, 1))).
float Gumbel(uint32_t k0, uint32_t k1, uint64_t counter, bool bf16) {
  const uint32_t bits = ThreefryBits(k0, k1, counter);
  if (bf16) {  // 8 random bits, 7 of them into the mantissa; every op rounds to bf16
    const uint16_t mant = static_cast<uint16_t>(((bits & 0xffu) >> 1) | 0x3f80u);
    const float f = Bf16ToF32(mant) - 1.0f;
    const float u = std::max(kTiny, RoundBf16(f + kTiny));
    return -RoundBf16(std::log(-RoundBf16(std::log(u))));
  }
  uint32_t fbits = (bits >> 9) | 0x3f800000u;
  float f;
  std::memcpy(&f, &fbits, 4);
  const float u = std::max(kTiny, (f - 1.0f) * 1.0f + kTiny);
  return -std::log(-std::log(u));
}

//===--- Row helpers -----------------------------------------------------------------------===//

struct Params {
  Form form;
  float temperature;  // already in the logits' dtype
  int64_t k;
  float p;
  float min_p;
  uint32_t k0, k1;
};

// First index of the largest value; NaN counts as largest (jnp.argmax).
int32_t ArgMax(const Row& x) {
  int64_t best = 0;
  float best_v = x[0];
  for (int64_t i = 1; i < x.n && !std::isnan(best_v); ++i) {
    const float v = x[i];
    if (v > best_v || std::isnan(v)) best = i, best_v = v;
  }
  return static_cast<int32_t>(best);
}

// Keeps the best `score` with the lowest index on ties; -inf scores still win over nothing.
struct Best {
  int64_t index = -1;
  float score = kNegInf;
  void Offer(int64_t i, float s) {
    if (index < 0 || s > score || (s == score && i < index)) index = i, score = s;
  }
};

// The top `k` (value descending, index ascending on ties) of `value(i)` over i < n.
template <typename F>
std::vector<std::pair<float, int64_t>> TopK(int64_t n, int64_t k, F value) {
  auto before = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::priority_queue<std::pair<float, int64_t>, std::vector<std::pair<float, int64_t>>, decltype(before)> heap(
      before);
  for (int64_t i = 0; i < n; ++i) {
    const float v = value(i);
    if (static_cast<int64_t>(heap.size()) < k) {
      heap.emplace(v, i);
    } else if (before({v, i}, heap.top())) {
      heap.pop();
      heap.emplace(v, i);
    }
  }
  std::vector<std::pair<float, int64_t>> out;
  while (!heap.empty()) out.push_back(heap.top()), heap.pop();
  std::reverse(out.begin(), out.end());
  return out;
}

// Nucleus cutoff: the largest value v with mass(x >= v) >= p over the tokens with x >= floor, or
// -inf when the whole mass stays below p (then nothing is cut). Only tokens near the max are sorted.
float NucleusCutoff(const Row& x, float floor, float p) {
  float m = kNegInf;
  for (int64_t i = 0; i < x.n; ++i) m = std::max(m, x[i] >= floor ? x[i] : kNegInf);
  if (m == kNegInf) return kNegInf;
  double z = 0;
  size_t eligible = 0;
  for (int64_t i = 0; i < x.n; ++i)
    if (x[i] >= floor) z += std::exp(static_cast<double>(x[i]) - m), ++eligible;
  // Candidates near the max, widened until they hold mass >= p (one pass each).
  std::vector<std::pair<float, double>> cand;  // (value, exp(value - max) / z)
  for (double delta = 8.0;; delta *= 2) {
    cand.clear();
    double mass = 0;
    const float lo = std::max(floor, static_cast<float>(m - delta));
    for (int64_t i = 0; i < x.n; ++i) {
      const float v = x[i];
      if (v >= lo) {
        const double w = std::exp(static_cast<double>(v) - m) / z;
        cand.emplace_back(v, w);
        mass += w;
      }
    }
    if (mass >= p || cand.size() == eligible || delta > 1e30) break;
  }
  // Quickselect on mass: the largest v with mass(x >= v) >= p, partitioning around pivots (no sort).
  double above = 0;  // mass of the values above the current range
  size_t begin = 0, end = cand.size();
  while (begin < end) {
    const float pivot = cand[begin + (end - begin) / 2].first;
    auto gt = std::partition(cand.begin() + begin, cand.begin() + end, [&](const auto& c) { return c.first > pivot; });
    auto eq = std::partition(gt, cand.begin() + end, [&](const auto& c) { return c.first == pivot; });
    double upper = 0, equal = 0;
    for (auto it = cand.begin() + begin; it != gt; ++it) upper += it->second;
    for (auto it = gt; it != eq; ++it) equal += it->second;
    if (static_cast<float>(above + upper) >= p) {
      end = gt - cand.begin();
    } else if (static_cast<float>(above + upper + equal) >= p) {
      return pivot;
    } else {
      above += upper + equal;
      begin = eq - cand.begin();
    }
  }
  return kNegInf;
}

int32_t SampleKept(const Row& x, const Params& prm, int64_t row, float floor) {
  // categorical(key, where(x >= floor, x, -inf) / T): noise indexed by vocabulary id.
  Best best;
  const uint64_t base = static_cast<uint64_t>(row) * x.n;
  for (int64_t i = 0; i < x.n; ++i) {
    const float v = x[i];
    if (!(v >= floor)) continue;
    const float y = x.Round(v / prm.temperature);
    best.Offer(i, x.Round(Gumbel(prm.k0, prm.k1, base + i, x.bf16) + y));
  }
  if (best.index < 0 || best.score == kNegInf) return 0;  // every score -inf: argmax picks index 0
  return static_cast<int32_t>(best.index);
}

int32_t SampleRow(const Row& x, const Params& prm, int64_t row) {
  switch (prm.form) {
    case Form::kGreedy:
      return ArgMax(x);
    case Form::kTemperature:
      return SampleKept(x, prm, row, kNegInf);
    case Form::kTopK:
    case Form::kTemperatureTopK: {
      const bool first = prm.form == Form::kTemperatureTopK;
      auto top = TopK(x.n, prm.k, [&](int64_t i) { return first ? x.Round(x[i] / prm.temperature) : x[i]; });
      Best best;
      const uint64_t base = static_cast<uint64_t>(row) * prm.k;
      for (int64_t r = 0; r < static_cast<int64_t>(top.size()); ++r) {
        const float y = first ? top[r].first : x.Round(top[r].first / prm.temperature);
        best.Offer(r, x.Round(Gumbel(prm.k0, prm.k1, base + r, x.bf16) + y));
      }
      return static_cast<int32_t>(top[best.index < 0 ? 0 : best.index].second);
    }
    case Form::kTopKMask:
      return SampleKept(x, prm, row, TopK(x.n, prm.k, [&](int64_t i) { return x[i]; }).back().first);
    case Form::kTopPMask:
      return SampleKept(x, prm, row, NucleusCutoff(x, kNegInf, prm.p));
    case Form::kTopKTopPMask: {
      const float kth = TopK(x.n, prm.k, [&](int64_t i) { return x[i]; }).back().first;
      return SampleKept(x, prm, row, std::max(kth, NucleusCutoff(x, kth, prm.p)));
    }
    case Form::kMinP: {
      // y = x / T; keep softmax(y) >= min_p * max(softmax(y)), in f32 like the program.
      float m = kNegInf;
      for (int64_t i = 0; i < x.n; ++i) m = std::max(m, x.Round(x[i] / prm.temperature));
      double z = 0;
      for (int64_t i = 0; i < x.n; ++i) z += std::exp(x.Round(x[i] / prm.temperature) - m);
      const float zf = static_cast<float>(z);
      const float threshold = prm.min_p * (1.0f / zf);
      Best best;
      const uint64_t base = static_cast<uint64_t>(row) * x.n;
      for (int64_t i = 0; i < x.n; ++i) {
        const float y = x.Round(x[i] / prm.temperature);
        if (!(std::exp(y - m) / zf >= threshold)) continue;
        best.Offer(i, Gumbel(prm.k0, prm.k1, base + i, false) + y);
      }
      return static_cast<int32_t>(best.index < 0 ? 0 : best.index);
    }
  }
  return 0;
}

//===--- Threads ---------------------------------------------------------------------------===//

struct Job {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  int64_t n = 0;
  std::function<void(int64_t)> fn;
  std::mutex mu;
  std::condition_variable cv;

  void Work() {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      fn(i);
      if (done.fetch_add(1) + 1 == n) {
        std::lock_guard<std::mutex> lock(mu);
        cv.notify_all();
      }
    }
  }
};

// Runs fn(0..n-1) on the caller and XLA's pool; returns when all are done.
void ParallelFor(ffi::ThreadPool& pool, int64_t n, std::function<void(int64_t)> fn) {
  if (n <= 0) return;
  auto job = std::make_shared<Job>();
  job->n = n;
  job->fn = std::move(fn);
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), n - 1);
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([job] { job->Work(); });
  job->Work();
  std::unique_lock<std::mutex> lock(job->mu);
  job->cv.wait(lock, [&] { return job->done.load() == n; });
}

ffi::Error Sample(ffi::ThreadPool pool, ffi::AnyBuffer logits, ffi::Buffer<ffi::U32> key,
                  ffi::Result<ffi::Buffer<ffi::S32>> out, int64_t form, float temperature, int64_t k, float p,
                  float min_p) {
  const auto dims = logits.dimensions();
  if (dims.size() != 2) return ffi::Error::InvalidArgument("hlofuse_sample: logits must be (rows, V)");
  const bool bf16 = logits.element_type() == ffi::DataType::BF16;
  if (!bf16 && logits.element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument("hlofuse_sample: logits must be f32 or bf16");
  if (key.element_count() != 2) return ffi::Error::InvalidArgument("hlofuse_sample: key must be (2,) uint32");
  if (form < 0 || form > 7) return ffi::Error::InvalidArgument("hlofuse_sample: unknown form");
  const int64_t rows = dims[0], vocab = dims[1];
  const bool needs_k = form >= 2 && form <= 6 && form != 5;
  if (vocab < 1 || (needs_k && (k < 1 || k > vocab)))
    return ffi::Error::InvalidArgument("hlofuse_sample: need 1 <= k <= V");
  Params prm{static_cast<Form>(form), bf16 ? RoundBf16(temperature) : temperature, k, p, min_p,
             key.typed_data()[0], key.typed_data()[1]};
  const char* base = static_cast<const char*>(logits.untyped_data());
  const int64_t row_bytes = vocab * (bf16 ? 2 : 4);
  int32_t* tokens = out->typed_data();
  ParallelFor(pool, rows, [&](int64_t r) {
    tokens[r] = SampleRow(Row{base + r * row_bytes, bf16, vocab}, prm, r);
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace hlofuse::cpu

extern "C" __attribute__((visibility("default"))) XLA_FFI_Error* hlofuse_sample(XLA_FFI_CallFrame* call_frame);

XLA_FFI_DEFINE_HANDLER_SYMBOL(hlofuse_sample, hlofuse::cpu::Sample,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()          // logits (rows, V)
                                  .Arg<ffi::Buffer<ffi::U32>>()   // key (2,)
                                  .Ret<ffi::Buffer<ffi::S32>>()   // tokens (rows,)
                                  .Attr<int64_t>("form")
                                  .Attr<float>("temperature")
                                  .Attr<int64_t>("k")
                                  .Attr<float>("p")
                                  .Attr<float>("min_p"));
