#include "kernels/cuda_gguf_self_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/gguf_blocks.h"
#include "common/status_macros.h"
#include "kernels/cuda/gguf_block_math.h"

namespace moe {
namespace {

namespace gm = gguf_math;

static_assert(gm::kQ4_0 == static_cast<int>(DType::kQ4_0) &&
              gm::kQ4_1 == static_cast<int>(DType::kQ4_1) &&
              gm::kQ5_0 == static_cast<int>(DType::kQ5_0) &&
              gm::kQ5_1 == static_cast<int>(DType::kQ5_1) &&
              gm::kQ4K == static_cast<int>(DType::kQ4K) &&
              gm::kQ5K == static_cast<int>(DType::kQ5K) &&
              gm::kQ6K == static_cast<int>(DType::kQ6K));

constexpr double kOrderTolerance = 1e-6;  // of sum |terms| (see the header)

// SplitMix64: the same numbers on every platform (the <random>
// distributions are not).
class SplitMix {
 public:
  explicit SplitMix(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1), a multiple of 2^-23 (exact in f32).
  float Symmetric() {
    return static_cast<float>(static_cast<int64_t>(Next() >> 40) -
                              (int64_t{1} << 23)) *
           0x1p-23f;
  }

 private:
  uint64_t state_;
};


// A finite f16 of either sign, 2^-10 <= |h| < 4: exponent field 5 .. 16.
uint16_t RandomHalf(SplitMix& rng) {
  const uint64_t r = rng.Next();
  return static_cast<uint16_t>((r & 0x8000u) | ((5 + (r >> 16) % 12) << 10) |
                               (r & 0x3ffu));
}

// The host's y for one block kind T: the kernels' quantizers and block
// terms, added in the tiled kernel's order.
template <int T>
GgufCheckExpected Expect(const GgufCheckProblem& p) {
  constexpr int kGroup = gm::BlockElems(T), kBytes = gm::BlockBytes(T);
  const int64_t m = p.m, n = p.n, k = p.k, blocks = k / kGroup;
  std::vector<int8_t> q(static_cast<size_t>(m * k));
  std::vector<float> d(static_cast<size_t>(m * blocks)), sd(d.size());
  std::vector<int16_t> bsums(static_cast<size_t>(m * k / 16));
  for (int64_t g = 0; g < m * blocks; ++g) {
    if constexpr (gm::IsK(T)) {
      gm::QuantizeGroup256(&p.x[g * 256], &q[g * 256], &d[g], &bsums[g * 16]);
    } else {
      gm::QuantizeGroup32(&p.x[g * 32], &q[g * 32], &d[g], &sd[g], gm::UsesQ8_1(T));
    }
  }
  GgufCheckExpected out{std::vector<float>(static_cast<size_t>(m * n)),
                        std::vector<double>(static_cast<size_t>(m * n))};
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* row = p.w.data() + j * blocks * kBytes;
    for (int64_t i = 0; i < m; ++i) {
      float acc = 0.0f;
      double abs_terms = 0.0;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = row + b * kBytes;
        const int64_t g = i * blocks + b, base = g * kGroup;
        int8_t codes[kGroup];
        int scales[gm::SubBlocks(T)], mins[gm::SubBlocks(T)];
        for (int e = 0; e < kGroup; ++e) {
          codes[e] = static_cast<int8_t>(gm::WeightCode<T>(blk, e));
        }
        for (int s = 0; s < gm::SubBlocks(T); ++s) {
          scales[s] = gm::SubScale<T>(blk, s);
          mins[s] = gm::SubMin<T>(blk, s);
        }
        const int32_t dot = gm::ScaledDot<T>(codes, scales, &q[base], kGroup);
        gm::BlockTerms t;
        if constexpr (gm::IsK(T)) {
          t = gm::KTerms(gm::BlockD<T>(blk), gm::BlockMin<T>(blk), d[g], dot,
                         gm::MinSum<T>(mins, &bsums[base / 16], 8));
        } else {
          t = gm::SmallTerms(gm::BlockD<T>(blk), gm::BlockMin<T>(blk), dot,
                             d[g], sd[g], gm::HasMin(T));
        }
        acc += t.dot + t.min;
        abs_terms += std::fabs(double{t.dot}) + std::fabs(double{t.min});
      }
      const float bias = p.bias.empty() ? 0.0f : p.bias[j];
      out.y[i * n + j] = p.bias.empty() ? acc : acc + bias;
      out.bound[i * n + j] =
          kOrderTolerance * (abs_terms + std::fabs(double{bias})) + 1e-30;
    }
  }
  return out;
}

// Every product of the check on `backend`, in `mem` (sized by MemBytes).
struct DeviceBuffers {
  float* x;
  void* w;
  float* bias;
  float* y;
};

int64_t Aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }

int64_t MaxRows() {
  return *std::max_element(std::begin(kGgufCheckRows),
                           std::end(kGgufCheckRows));
}

int64_t MaxWeightBytes() {
  int64_t most = 0;
  for (DType t : kGgufCheckTypes) {
    most = std::max(most, WeightBytes(t, kGgufCheckN, kGgufCheckK));
  }
  return most;
}

int64_t MemBytes() {
  return Aligned(MaxRows() * kGgufCheckK * int64_t{sizeof(float)}) +
         Aligned(MaxWeightBytes()) +
         Aligned(kGgufCheckN * int64_t{sizeof(float)}) +
         Aligned(MaxRows() * kGgufCheckN * int64_t{sizeof(float)});
}

DeviceBuffers Slice(void* mem) {
  auto* base = static_cast<uint8_t*>(mem);
  DeviceBuffers b;
  b.x = reinterpret_cast<float*>(base);
  base += Aligned(MaxRows() * kGgufCheckK * int64_t{sizeof(float)});
  b.w = base;
  base += Aligned(MaxWeightBytes());
  b.bias = reinterpret_cast<float*>(base);
  base += Aligned(kGgufCheckN * int64_t{sizeof(float)});
  b.y = reinterpret_cast<float*>(base);
  return b;
}

// p's product on the backend, read back. y is NaN before the run, so an
// output that no kernel writes fails the comparison.
absl::StatusOr<std::vector<float>> RunOne(Backend& be, const DeviceBuffers& buf,
                                          const GgufCheckProblem& p) {
  std::vector<float> y(static_cast<size_t>(p.m * p.n),
                       std::numeric_limits<float>::quiet_NaN());
  RETURN_IF_ERROR(
      be.CopyToDevice(buf.x, p.x.data(), p.x.size() * sizeof(float)));
  RETURN_IF_ERROR(be.CopyToDevice(buf.w, p.w.data(), p.w.size()));
  RETURN_IF_ERROR(
      be.CopyToDevice(buf.bias, p.bias.data(), p.bias.size() * sizeof(float)));
  RETURN_IF_ERROR(be.CopyToDevice(buf.y, y.data(), y.size() * sizeof(float)));
  RETURN_IF_ERROR(be.MatMul(buf.x, buf.w, p.type,
                            p.bias.empty() ? nullptr : buf.bias, buf.y, p.m,
                            p.n, p.k));
  RETURN_IF_ERROR(be.Synchronize());
  RETURN_IF_ERROR(be.CopyToHost(y.data(), buf.y, y.size() * sizeof(float)));
  return y;
}

absl::Status RunAll(Backend& be, const DeviceBuffers& buf) {
  std::vector<std::string> failures;
  for (DType t : kGgufCheckTypes) {
    for (int64_t m : kGgufCheckRows) {
      const GgufCheckProblem p = MakeGgufCheckProblem(t, m);
      absl::StatusOr<std::vector<float>> got = RunOne(be, buf, p);
      if (!got.ok()) {
        return absl::Status(
            got.status().code(),
            absl::StrCat("the ggml self-check's ", DTypeName(t), " product (m ",
                         m, ") failed to run: ", got.status().message()));
      }
      const absl::Status s =
          CompareGgufProduct(p, ExpectedGgufProduct(p), *got);
      if (!s.ok()) failures.emplace_back(s.message());
    }
  }
  if (failures.empty()) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("ggml block kernels disagree with the host: ",
                   absl::StrJoin(failures, "; ")));
}

}  // namespace

GgufCheckProblem MakeGgufCheckProblem(DType type, int64_t m) {
  GgufCheckProblem p;
  p.type = type;
  p.m = m;
  p.n = kGgufCheckN;
  p.k = kGgufCheckK;
  SplitMix rng(static_cast<uint64_t>(type) * 1000003u +
               static_cast<uint64_t>(m));
  p.w.resize(static_cast<size_t>(WeightBytes(type, p.n, p.k)));
  for (uint8_t& b : p.w) b = static_cast<uint8_t>(rng.Next() >> 56);
  const int64_t bb = QuantBlockBytes(type);
  for (size_t b = 0; b < p.w.size() / static_cast<size_t>(bb); ++b) {
    for (int off : GgufF16FieldOffsets(type)) {
      const uint16_t h = RandomHalf(rng);
      std::memcpy(&p.w[b * bb + off], &h, sizeof(h));  // little-endian
    }
  }
  p.x.resize(static_cast<size_t>(m * p.k));
  for (float& v : p.x) v = 2.0f * rng.Symmetric();
  p.x[2] = 12.0f;  // an outlier: a coarse activation group
  if (m >= 2) std::fill_n(&p.x[p.k], 256, 0.0f);  // row 1: groups of d = 0
  if (m > 1) {
    p.bias.resize(static_cast<size_t>(p.n));
    for (float& v : p.bias) v = rng.Symmetric();
  }
  return p;
}

GgufCheckExpected ExpectedGgufProduct(const GgufCheckProblem& p) {
  switch (p.type) {
    case DType::kQ4_0:
      return Expect<gm::kQ4_0>(p);
    case DType::kQ4_1:
      return Expect<gm::kQ4_1>(p);
    case DType::kQ5_0:
      return Expect<gm::kQ5_0>(p);
    case DType::kQ5_1:
      return Expect<gm::kQ5_1>(p);
    case DType::kQ4K:
      return Expect<gm::kQ4K>(p);
    case DType::kQ5K:
      return Expect<gm::kQ5K>(p);
    default:
      return Expect<gm::kQ6K>(p);
  }
}

absl::Status CompareGgufProduct(const GgufCheckProblem& p,
                                const GgufCheckExpected& want,
                                absl::Span<const float> got) {
  const size_t outputs = static_cast<size_t>(p.m * p.n);
  if (got.size() != outputs || want.y.size() != outputs ||
      want.bound.size() != outputs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ggml self-check: ", got.size(), " outputs for ", DTypeName(p.type),
        " [", p.m, ", ", p.n, "], the host has ", want.y.size()));
  }
  size_t worst = 0, bad = 0;
  double worst_ratio = -1.0;
  for (size_t o = 0; o < outputs; ++o) {
    const double err = std::fabs(double{got[o]} - want.y[o]);
    if (!(err <= want.bound[o])) ++bad;  // NaN too
    const double ratio = std::isfinite(err)
                             ? err / want.bound[o]
                             : std::numeric_limits<double>::infinity();
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = o;
    }
  }
  if (bad == 0) return absl::OkStatus();
  const size_t n = static_cast<size_t>(p.n);
  return absl::InternalError(absl::StrFormat(
      "%s m %d: y[%d, %d] = %.9g, the host's %.9g, error %.3g > bound %.3g "
      "(1e-6 x sum |terms|); %d of %d outputs out of bound",
      DTypeName(p.type), p.m, worst / n, worst % n, got[worst], want.y[worst],
      std::fabs(double{got[worst]} - want.y[worst]), want.bound[worst], bad,
      outputs));
}

absl::Status RunGgufSelfCheck(Backend& backend) {
  absl::StatusOr<void*> mem = backend.Alloc(static_cast<size_t>(MemBytes()));
  if (!mem.ok()) {
    return absl::Status(
        mem.status().code(),
        absl::StrCat("the ggml self-check could not allocate ", MemBytes(),
                     " bytes: ", mem.status().message()));
  }
  const absl::Status s = RunAll(backend, Slice(*mem));
  backend.Free(*mem);
  return s;
}

}  // namespace moe
