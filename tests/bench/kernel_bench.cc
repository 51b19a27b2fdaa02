// Kernel benchmark: decode-shaped matvec bandwidth against memcpy bandwidth,
// and prefill-shaped matmul throughput against a measured FMA peak, all
// measured in the same run so that the ratios are meaningful.
//
//   kernel_bench [--backend=cpu|cuda|all] [--weights-mb=512] [--threads=N]
//                [--reps=5] [--prefill-tokens=128] [--hidden=4096]
//                [--inter=1024]
//
// CPU: the decode matvec streams --weights-mb of bf16 weights (far larger
// than the caches) per token; "weight bytes/s" over the multithreaded memcpy
// rate (bytes copied per second) is the ratio to watch (goal >= 0.6).
// Per expert format (bf16, q8, q4), the expert FFN decode of one token through
// as many experts as --weights-mb of bf16 holds (--inter each): tokens/s
// against bf16 and weight bytes/s against memcpy, side by side (goals: q8 >=
// 1.7x, q4 >= 3x the bf16 tokens/s; bytes/s >= 0.6 of memcpy).
// CUDA (when a device is usable): the same matvec over device memory against
// device-to-device copy bandwidth, and prefill GEMM TFLOP/s.
// GCC 12 warns inside _mm512_reduce_add_ps (a known false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/quant.h"
#include "common/row_interleave.h"
#include "common/threads.h"
#include "kernels/backend.h"
#include "kernels/cpu_backend.h"
#include "kernels/cpu_gguf_quant.h"
#include "kernels/cpu_matmul.h"

namespace moe {
namespace {

struct Flags {
  std::string backend = "all";
  int64_t weights_mb = 512;
  int threads = 0;
  int reps = 5;
  int64_t prefill_tokens = 128;
  int64_t hidden = 4096;
  int64_t inter = 1024;
};

bool ParseFlag(const char* arg, const char* name, std::string* out) {
  size_t len = std::strlen(name);
  if (std::strncmp(arg, name, len) != 0 || arg[len] != '=') return false;
  *out = arg + len + 1;
  return true;
}

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string v;
    if (ParseFlag(argv[i], "--backend", &v)) {
      f->backend = v;
    } else if (ParseFlag(argv[i], "--weights-mb", &v)) {
      f->weights_mb = std::atoll(v.c_str());
    } else if (ParseFlag(argv[i], "--threads", &v)) {
      f->threads = std::atoi(v.c_str());
    } else if (ParseFlag(argv[i], "--reps", &v)) {
      f->reps = std::max(1, std::atoi(v.c_str()));
    } else if (ParseFlag(argv[i], "--prefill-tokens", &v)) {
      f->prefill_tokens = std::atoll(v.c_str());
    } else if (ParseFlag(argv[i], "--hidden", &v)) {
      f->hidden = std::atoll(v.c_str());
    } else if (ParseFlag(argv[i], "--inter", &v)) {
      f->inter = std::atoll(v.c_str());
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return false;
    }
  }
  return f->weights_mb > 0 && f->prefill_tokens > 0 && f->hidden > 0 &&
         f->inter > 0 && f->hidden % 64 == 0 && f->inter % 64 == 0;
}

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Median (or, with `best`, the shortest) seconds of `reps` runs of fn (after
// one warm-up run). The format table uses the shortest: on a shared machine
// other processes only ever add time.
double MedianSeconds(int reps, const std::function<void()>& fn,
                     bool best = false) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    double t0 = Now();
    fn();
    t.push_back(Now() - t0);
  }
  std::sort(t.begin(), t.end());
  return best ? t.front() : t[t.size() / 2];
}

// Uniform in [-1, 1), from a xorshift generator: gigabytes of weights must
// not take longer to make than to benchmark.
std::vector<uint16_t> RandomBf16(size_t n, uint32_t seed) {
  std::vector<uint16_t> w(n);
  uint32_t s = seed * 2654435761u + 1;
  for (auto& v : w) {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    v = FloatToBF16(static_cast<float>(s >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
  return w;
}

std::vector<float> RandomF32(size_t n, uint32_t seed) {
  std::vector<float> x(n);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  for (auto& v : x) v = d(rng);
  return x;
}

// Eight independent FMA chains per thread: the FLOP/s ceiling of this core
// for the vector width the matmul kernels use.
__attribute__((target("avx2,fma"))) float FmaLoopAvx2(int64_t iters) {
  __m256 a[8];
  for (int i = 0; i < 8; ++i) a[i] = _mm256_set1_ps(0.001f * i);
  const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.0001f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) a[i] = _mm256_fmadd_ps(a[i], b, c);
  }
  __m256 s = a[0];
  for (int i = 1; i < 8; ++i) s = _mm256_add_ps(s, a[i]);
  return _mm256_cvtss_f32(s);
}

__attribute__((target("avx512f"))) float FmaLoopAvx512(int64_t iters) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(0.001f * i);
  const __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.0001f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], b, c);
  }
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  return _mm512_reduce_add_ps(s);
}

// Peak f32 FLOP/s over all pool threads, for the given SIMD level.
double MeasurePeakFlops(ThreadPool& pool, SimdLevel level, int reps) {
  const int64_t iters = 20'000'000;
  double flops_per_iter = 0;
  std::function<float(int64_t)> loop;
  if (AtLeastAvx512(level)) {
    loop = FmaLoopAvx512;
    flops_per_iter = 12 * 16 * 2;
  } else if (level == SimdLevel::kAvx2) {
    loop = FmaLoopAvx2;
    flops_per_iter = 8 * 8 * 2;
  } else {
    return 0;
  }
  std::vector<float> sink(pool.size());
  double secs = MedianSeconds(reps, [&] {
    pool.ParallelFor(pool.size(), 1, [&](int64_t b, int64_t) {
      sink[b] = loop(iters);
    });
  });
  return flops_per_iter * iters * pool.size() / secs;
}

// `rows` rows of `cols` bf16 weights re-encoded as `dt` (bf16: a copy).
std::vector<uint8_t> Encode(ThreadPool& pool, const uint16_t* w, int64_t rows,
                            int64_t cols, DType dt) {
  std::vector<uint8_t> out(WeightBytes(dt, rows, cols));
  if (dt == DType::kBF16) {
    std::memcpy(out.data(), w, out.size());
    return out;
  }
  const int64_t row_bytes = WeightBytes(dt, 1, cols);
  pool.ParallelFor(rows, 64, [&](int64_t b, int64_t e) {
    std::vector<float> f(cols);
    for (int64_t r = b; r < e; ++r) {
      for (int64_t c = 0; c < cols; ++c) f[c] = BF16ToFloat(w[r * cols + c]);
      absl::Status s = QuantizeRow(f.data(), cols, dt, out.data() + r * row_bytes);
      if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
    }
  });
  return out;
}

// One decode token through every expert of a model whose bf16 experts fill
// --weights-mb, per format.
void RunExpertFormats(CpuBackend& backend, const Flags& f, double copy_bw) {
  const int64_t h = f.hidden, in = f.inter;
  const int64_t experts =
      std::max<int64_t>(1, f.weights_mb * (1 << 20) / (3 * h * in * 2));
  std::vector<uint16_t> w = RandomBf16(size_t(experts) * 3 * h * in, 3);
  std::vector<float> x = RandomF32(h, 4), out(h);
  std::printf("expert FFN decode: %lld experts [hidden %lld, inter %lld], one token through all\n",
              (long long)experts, (long long)h, (long long)in);
  std::printf("  %-5s %10s %10s %9s %10s %8s\n", "fmt", "MiB", "tokens/s",
              "vs bf16", "GB/s", "vs memcpy");
  double bf16_tps = 0;
  const bool rows16 = CpuPrefersRows16(DetectSimdLevel());
  for (DType plain : {DType::kBF16, DType::kQ8, DType::kQ4}) {
    // Per expert: gate [in, h] | up [in, h] | down [h, in], each re-encoded,
    // then held as a loader holds them on this CPU (16 rows interleaved
    // where the CPU prefers it: the layout the served experts use).
    const DType held = InterleavedHeld(plain, in, h, rows16);
    const DType dt = InterleavedHeld(plain, h, in, rows16) == held ? held : plain;
    auto encoded = [&](int64_t rows, int64_t cols) {
      std::vector<uint8_t> q = Encode(backend.pool(), w.data(), rows, cols, plain);
      if (dt == plain) return q;
      std::vector<uint8_t> out(q.size());
      absl::Status s = InterleaveRows16(dt, q.data(), rows, cols, out.data());
      if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return out;
    };
    std::vector<uint8_t> all = encoded(experts * 3 * in, h);
    const int64_t mat_bytes = WeightBytes(dt, in, h);
    // down is [h, in]: rows of `in` weights (a different row length).
    std::vector<uint8_t> down_all = encoded(experts * h, in);
    const int64_t down_bytes = WeightBytes(dt, h, in);
    double secs = MedianSeconds(f.reps, [&] {
      for (int64_t e = 0; e < experts; ++e) {
        const uint8_t* base = all.data() + e * 3 * mat_bytes;
        absl::Status s = backend.ExpertFfn(
            x.data(), nullptr, nullptr, base, base + mat_bytes,
            down_all.data() + e * down_bytes, dt, out.data(), 1, 1, h, in);
        if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
      }
    }, /*best=*/true);
    const double bytes = double(experts) * (2 * mat_bytes + down_bytes);
    const double tps = 1.0 / secs;
    if (dt == DType::kBF16) bf16_tps = tps;
    std::printf("  %-5s %10.1f %10.2f %8.2fx %10.2f %9.2f\n",
                std::string(DTypeName(dt)).c_str(), bytes / 1048576.0, tps,
                tps / bf16_tps, bytes / secs / 1e9, bytes / secs / copy_bw);
    std::printf("RESULT cpu expert_format=%s tokens_per_s=%.3f vs_bf16=%.2f "
                "weight_gbps=%.2f vs_memcpy=%.2f\n",
                std::string(DTypeName(dt)).c_str(), tps, tps / bf16_tps,
                bytes / secs / 1e9, bytes / secs / copy_bw);
  }
}

void RunCpu(const Flags& f) {
  CpuBackend backend(f.threads);
  BackendInfo info = backend.Info();
  const int64_t k = f.hidden;
  const int64_t n = f.weights_mb * (1 << 20) / (2 * k);
  const size_t wbytes = size_t(n) * k * 2;
  std::printf("== CPU: %s, %d threads, %s kernels\n", info.device_name.c_str(),
              info.threads, info.simd.c_str());

  std::vector<uint16_t> w = RandomBf16(size_t(n) * k, 1);
  std::vector<float> x = RandomF32(f.prefill_tokens * k, 2);
  std::vector<float> y(f.prefill_tokens * n);
  // memcpy of the same size as the weights, split over the same threads.
  std::vector<char> src(wbytes, 1), dst(wbytes, 0);
  const int64_t parts = backend.pool().size() * 4;
  double copy_s = MedianSeconds(f.reps, [&] {
    backend.pool().ParallelFor(parts, 1, [&](int64_t b, int64_t e) {
      size_t chunk = (wbytes + parts - 1) / parts;
      size_t off = size_t(b) * chunk;
      if (off < wbytes) {
        std::memcpy(dst.data() + off, src.data() + off,
                    std::min(chunk, wbytes - off));
      }
    });
  });
  double decode_s = MedianSeconds(f.reps, [&] {
    absl::Status s = backend.MatMul(x.data(), w.data(), DType::kBF16, nullptr,
                                    y.data(), 1, n, k);
    if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
  });
  const double copy_bw = wbytes / copy_s, decode_bw = wbytes / decode_s;
  std::printf("decode matvec  [1 x %lld] x [%lld x %lld] bf16 (%.0f MiB)\n",
              (long long)k, (long long)n, (long long)k, wbytes / 1048576.0);
  std::printf("  memcpy         %8.2f GB/s (bytes copied)\n", copy_bw / 1e9);
  std::printf("  matvec weights %8.2f GB/s  ratio %.2f (goal >= 0.60)\n",
              decode_bw / 1e9, decode_bw / copy_bw);

  // Prefill: a [tokens, hidden] x [hidden, hidden] product per projection.
  const int64_t m = f.prefill_tokens, pn = std::min<int64_t>(n, 4096);
  double prefill_s = MedianSeconds(f.reps, [&] {
    absl::Status s = backend.MatMul(x.data(), w.data(), DType::kBF16, nullptr,
                                    y.data(), m, pn, k);
    if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
  });
  const double flops = 2.0 * m * pn * k / prefill_s;
  // The same product with f32 weights: the cost of widening bf16 in-loop.
  std::vector<float> wf(size_t(pn) * k);
  for (size_t i = 0; i < wf.size(); ++i) wf[i] = BF16ToFloat(w[i]);
  double prefill_f32_s = MedianSeconds(f.reps, [&] {
    absl::Status s = backend.MatMul(x.data(), wf.data(), DType::kF32, nullptr,
                                    y.data(), m, pn, k);
    if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
  });
  const double peak =
      MeasurePeakFlops(backend.pool(), backend.simd_level(), f.reps);
  std::printf("prefill matmul [%lld x %lld] x [%lld x %lld] bf16\n",
              (long long)m, (long long)k, (long long)pn, (long long)k);
  std::printf("  FMA peak       %8.1f GFLOP/s (measured, %d threads)\n",
              peak / 1e9, backend.pool().size());
  std::printf("  matmul         %8.1f GFLOP/s  ratio %.2f\n", flops / 1e9,
              peak > 0 ? flops / peak : 0.0);
  std::printf("  (f32 weights   %8.1f GFLOP/s)\n",
              2.0 * m * pn * k / prefill_f32_s / 1e9);
  std::printf("RESULT cpu decode_ratio=%.2f prefill_ratio=%.2f\n",
              decode_bw / copy_bw, peak > 0 ? flops / peak : 0.0);
  RunExpertFormats(backend, f, copy_bw);
}

int RunCuda(const Flags& f) {
  auto created = CreateBackend("cuda");
  if (!created.ok()) {
    std::printf("== CUDA: skipped (%s)\n",
                std::string(created.status().message()).c_str());
    return 1;
  }
  Backend& b = **created;
  BackendInfo info = b.Info();
  std::printf("== CUDA: %s, %.1f GiB\n", info.device_name.c_str(),
              info.device_memory_bytes / 1073741824.0);
  const int64_t k = f.hidden;
  // At least 2 GiB so that the weights dwarf the L2 cache.
  const int64_t mb = std::max<int64_t>(f.weights_mb, 2048);
  const int64_t n = mb * (1 << 20) / (2 * k);
  const size_t wbytes = size_t(n) * k * 2;
  const int64_t m = std::max<int64_t>(f.prefill_tokens, 512);
  auto w = b.Alloc(wbytes);
  auto w2 = b.Alloc(wbytes);
  auto x = b.Alloc(m * k * sizeof(float));
  auto y = b.Alloc(m * n * sizeof(float));
  if (!w.ok() || !w2.ok() || !x.ok() || !y.ok()) {
    std::printf("CUDA: allocation failed\n");
    return 1;
  }
  std::vector<uint16_t> hw = RandomBf16(size_t(n) * k, 1);
  std::vector<float> hx = RandomF32(m * k, 2);
  bool ok = b.CopyToDevice(*w, hw.data(), wbytes).ok() &&
            b.CopyToDevice(*x, hx.data(), hx.size() * 4).ok();
  auto timed = [&](const std::function<absl::Status()>& fn) {
    return MedianSeconds(f.reps, [&] {
      absl::Status s = fn();
      if (s.ok()) s = b.Synchronize();
      if (!s.ok()) {
        ok = false;
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
      }
    });
  };
  double copy_s = timed([&] { return b.CopyDeviceToDevice(*w2, *w, wbytes); });
  double decode_s = timed([&] {
    return b.MatMul(static_cast<float*>(*x), *w, DType::kBF16, nullptr,
                    static_cast<float*>(*y), 1, n, k);
  });
  const int64_t pn = std::min<int64_t>(n, 8192);
  double prefill_s = timed([&] {
    return b.MatMul(static_cast<float*>(*x), *w, DType::kBF16, nullptr,
                    static_cast<float*>(*y), m, pn, k);
  });
  const double copy_bw = wbytes / copy_s, decode_bw = wbytes / decode_s;
  std::printf("  d2d copy       %8.1f GB/s (bytes copied)\n", copy_bw / 1e9);
  std::printf("  matvec weights %8.1f GB/s  ratio %.2f\n", decode_bw / 1e9,
              decode_bw / copy_bw);
  std::printf("  prefill [%lld x %lld] x [%lld x %lld]^T bf16: %.1f TFLOP/s\n",
              (long long)m, (long long)k, (long long)pn, (long long)k,
              2.0 * m * pn * k / prefill_s / 1e12);
  std::printf("RESULT cuda decode_ratio=%.2f prefill_tflops=%.1f\n",
              decode_bw / copy_bw, 2.0 * m * pn * k / prefill_s / 1e12);
  // The block formats (kernels/cuda/quant_gemm.cu) on the same weights:
  // matvec weight bytes/s against the copy rate, and prefill TFLOP/s.
  CpuBackend encoder;
  for (DType dt : {DType::kQ8, DType::kQ4}) {
    std::vector<uint8_t> q = Encode(encoder.pool(), hw.data(), n, k, dt);
    ok = ok && b.CopyToDevice(*w2, q.data(), q.size()).ok();
    double q_decode_s = timed([&] {
      return b.MatMul(static_cast<float*>(*x), *w2, dt, nullptr,
                      static_cast<float*>(*y), 1, n, k);
    });
    double q_prefill_s = timed([&] {
      return b.MatMul(static_cast<float*>(*x), *w2, dt, nullptr,
                      static_cast<float*>(*y), m, pn, k);
    });
    const double bw = q.size() / q_decode_s;
    std::printf("  %s matvec   %8.1f GB/s  ratio %.2f, %.2fx the bf16 matvec's time; "
                "prefill %.1f TFLOP/s\n",
                std::string(DTypeName(dt)).c_str(), bw / 1e9, bw / copy_bw,
                decode_s / q_decode_s, 2.0 * m * pn * k / q_prefill_s / 1e12);
    std::printf("RESULT cuda format=%s decode_ratio=%.2f decode_speedup=%.2f "
                "prefill_tflops=%.1f\n",
                std::string(DTypeName(dt)).c_str(), bw / copy_bw, decode_s / q_decode_s,
                2.0 * m * pn * k / q_prefill_s / 1e12);
  }
  for (void* p : {*w, *w2, *x, *y}) b.Free(p);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  moe::SkipLockOrderChecks();  // before any lock: they all pay for the checks
  moe::Flags flags;
  if (!moe::ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr,
                 "usage: kernel_bench [--backend=cpu|cuda|all] "
                 "[--weights-mb=512] [--threads=N] [--reps=5] "
                 "[--prefill-tokens=128] [--hidden=4096] [--inter=1024]\n");
    return 2;
  }
  int rc = 0;
  if (flags.backend == "cpu" || flags.backend == "all") moe::RunCpu(flags);
  if (flags.backend == "cuda" || flags.backend == "all") {
    int cuda_rc = moe::RunCuda(flags);
    if (flags.backend == "cuda") rc = cuda_rc;
  }
  return rc;
}
