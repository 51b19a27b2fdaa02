#include "kernels/cpu_matmul.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu_ops.h"
#include "kernels/cpu_quant_matmul.h"

namespace moe {

absl::string_view SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
    case SimdLevel::kAmx:
      return "amx";
  }
  return "?";
}

bool SimdLevelSupported(SimdLevel level) {
#if defined(__x86_64__)
  switch (level) {
    case SimdLevel::kScalar:
      return true;
    case SimdLevel::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case SimdLevel::kAvx512:
      return __builtin_cpu_supports("avx512f");
    case SimdLevel::kAmx:
      return __builtin_cpu_supports("avx512f") && AmxSupported();
  }
  return false;
#else
  return level == SimdLevel::kScalar;
#endif
}

SimdLevel DetectSimdLevel() {
  SimdLevel cap = SimdLevel::kAmx;
  if (const char* env = std::getenv("MOE_CPU_SIMD"); env && *env) {
    if (std::strcmp(env, "scalar") == 0) cap = SimdLevel::kScalar;
    if (std::strcmp(env, "avx2") == 0) cap = SimdLevel::kAvx2;
    if (std::strcmp(env, "avx512") == 0) cap = SimdLevel::kAvx512;
  }
  for (SimdLevel l : {SimdLevel::kAmx, SimdLevel::kAvx512, SimdLevel::kAvx2}) {
    if (static_cast<int>(l) <= static_cast<int>(cap) && SimdLevelSupported(l)) {
      return l;
    }
  }
  return SimdLevel::kScalar;
}

namespace {

template <DType D>
void ScalarColumns(const MatMulArgs& a, int64_t n_begin, int64_t n_end) {
  for (int64_t k0 = 0; k0 < a.k; k0 += kMatMulKBlock) {
    int64_t k1 = std::min(a.k, k0 + kMatMulKBlock);
    for (int64_t i = 0; i < a.m; ++i) {
      const float* x = a.x + i * a.k;
      for (int64_t j = n_begin; j < n_end; ++j) {
        float acc = 0.0f;
        for (int64_t kk = k0; kk < k1; ++kk) {
          acc += x[kk] * LoadAsF32(a.w, D, static_cast<size_t>(j * a.k + kk));
        }
        float* y = a.y + i * a.n + j;
        if (k0 == 0) {
          *y = acc + (a.bias ? a.bias[j] : 0.0f);
        } else {
          *y += acc;
        }
      }
    }
  }
  if (a.k == 0) {
    for (int64_t i = 0; i < a.m; ++i) {
      for (int64_t j = n_begin; j < n_end; ++j) {
        a.y[i * a.n + j] = a.bias ? a.bias[j] : 0.0f;
      }
    }
  }
}

}  // namespace

void MatMulColumnsScalar(const MatMulArgs& a, int64_t n_begin, int64_t n_end) {
  switch (a.dtype) {
    case DType::kF32:
      return ScalarColumns<DType::kF32>(a, n_begin, n_end);
    case DType::kF16:
      return ScalarColumns<DType::kF16>(a, n_begin, n_end);
    case DType::kBF16:
      return ScalarColumns<DType::kBF16>(a, n_begin, n_end);
    default:
      return;  // not a weight dtype; Backend::MatMul rejects it
  }
}

namespace {
float DotScalar(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
void AxpyScalar(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}
void DotRowsScalar(const float* a, const float* b, int64_t stride, int64_t rows, int64_t n,
                   float scale, float* out) {
  for (int64_t j = 0; j < rows; ++j) out[j] = DotScalar(a, b + j * stride, n) * scale;
}
void AxpyRowsScalar(const float* alpha, const float* x, int64_t stride, int64_t rows, float* y,
                    int64_t n) {
  for (int64_t j = 0; j < rows; ++j) AxpyScalar(alpha[j], x + j * stride, y, n);
}
void DotRowsBf16Scalar(const float* a, const uint16_t* b, int64_t stride, int64_t rows, int64_t n,
                       float scale, float* out) {
  for (int64_t j = 0; j < rows; ++j) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) s += a[i] * BF16ToFloat(b[j * stride + i]);
    out[j] = s * scale;
  }
}
void AxpyRowsBf16Scalar(const float* alpha, const uint16_t* x, int64_t stride, int64_t rows,
                        float* y, int64_t n) {
  for (int64_t j = 0; j < rows; ++j) {
    for (int64_t i = 0; i < n; ++i) y[i] += alpha[j] * BF16ToFloat(x[j * stride + i]);
  }
}
float MaxScalar(const float* x, int64_t n) { return cpu::MaxValue(SimdLevel::kScalar, x, n); }
float ExpSumScalar(float* x, int64_t n, float shift) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    x[j] = std::exp(x[j] - shift);
    sum += x[j];
  }
  return sum;
}
}  // namespace

VectorOps VectorOpsFor(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx2:
      return {&DotAvx2,         &AxpyAvx2,         &DotRowsAvx2,    &AxpyRowsAvx2,
              &MaxScalar,       &ExpSumScalar,     &DotRowsBf16Avx2, &AxpyRowsBf16Avx2};
    case SimdLevel::kAvx512:
    case SimdLevel::kAmx:
      return {&DotAvx512,          &AxpyAvx512,        &DotRowsAvx512,
              &AxpyRowsAvx512,     &cpu::MaxValueAvx512, &cpu::ExpSumAvx512,
              &DotRowsBf16Avx512,  &AxpyRowsBf16Avx512};
    default:
      return {&DotScalar,         &AxpyScalar,        &DotRowsScalar,   &AxpyRowsScalar,
              &MaxScalar,         &ExpSumScalar,      &DotRowsBf16Scalar, &AxpyRowsBf16Scalar};
  }
}

namespace {

using ColumnsFn = void (*)(const MatMulArgs&, int64_t, int64_t);

ColumnsFn ColumnsFor(SimdLevel level) {
  if (level == SimdLevel::kAvx2) return &MatMulColumnsAvx2;
  if (AtLeastAvx512(level)) return &MatMulColumnsAvx512;
  return &MatMulColumnsScalar;
}

// Enough chunks to balance the threads; at most 64 columns so that a
// chunk's k-block of W stays in L2 while every row of x passes over it.
int64_t FloatColumnGrain(const ThreadPool& pool, int64_t m, int64_t n, int64_t k) {
  if (!pool.WorthSplitting(m, n * k)) return n;
  int64_t per_thread = (n + pool.size() * 4 - 1) / (pool.size() * 4);
  return std::clamp<int64_t>((per_thread + 7) / 8 * 8, 8, 64);
}

// The ParallelFor grain over the n columns of a product of `dtype` at
// `level`: on AMX whole pairs of 16-row tiles.
int64_t ColumnGrain(const ThreadPool& pool, SimdLevel level, DType dtype, int64_t m, int64_t n,
                    int64_t k) {
  if (IsQuantDType(dtype)) return QuantColumnGrain(pool, m, n, k, RowGroupOf(dtype));
  const int64_t grain = FloatColumnGrain(pool, m, n, k);
  return UsesAmx(dtype, level, k) && grain < n ? (grain + 31) / 32 * 32 : grain;
}

}  // namespace

void CpuMatMul(ThreadPool& pool, SimdLevel level, const MatMulArgs& a) {
  if (IsQuantDType(a.dtype)) return CpuQuantMatMul(pool, level, a);
  if (UsesBf16Dot(a.dtype, level)) {
    QuantizedInput local;
    QuantizedInput& in = QuantizedInputFor(a.m, a.k, &local);
    in.Prepare(a.x, a.m, a.k, a.dtype, level);
    pool.ParallelFor(a.n, ColumnGrain(pool, level, a.dtype, a.m, a.n, a.k),
                     [&](int64_t b, int64_t e) { in.Columns(a.w, a.bias, a.y, a.n, b, e); });
    return;
  }
  const ColumnsFn kernel = ColumnsFor(level);
  pool.ParallelFor(a.n, FloatColumnGrain(pool, a.m, a.n, a.k),
                   [&](int64_t b, int64_t e) { kernel(a, b, e); });
}

void CpuGateUpSilu(ThreadPool& pool, SimdLevel level, const float* x, const void* gate,
                   const void* up, DType dtype, float* g, float* u, int64_t m, int64_t n,
                   int64_t k) {
  auto silu_mul = [&](int64_t b, int64_t e) {
    for (int64_t i = 0; i < m; ++i) {
      cpu::SiluMul(level, g + i * n + b, u + i * n + b, g + i * n + b, e - b);
    }
  };
  if (PreparesActivations(dtype, level)) {
    QuantizedInput local;
    QuantizedInput& in = QuantizedInputFor(m, k, &local);
    in.Prepare(x, m, k, dtype, level);
    pool.ParallelFor(n, ColumnGrain(pool, level, dtype, m, n, k), [&](int64_t b, int64_t e) {
      in.Columns(gate, nullptr, g, n, b, e);
      in.Columns(up, nullptr, u, n, b, e);
      silu_mul(b, e);
    });
    return;
  }
  const ColumnsFn kernel = ColumnsFor(level);
  const MatMulArgs ga{x, gate, dtype, nullptr, g, m, n, k};
  const MatMulArgs ua{x, up, dtype, nullptr, u, m, n, k};
  pool.ParallelFor(n, FloatColumnGrain(pool, m, n, k), [&](int64_t b, int64_t e) {
    kernel(ga, b, e);
    kernel(ua, b, e);
    silu_mul(b, e);
  });
}

namespace {

// One product of a pass: x [m, k] times w [n, k]^T into y, prepared once,
// then any column range from any thread.
struct ColumnProduct {
  const MatMulArgs a;
  const QuantizedInput* q;  // block formats; else the float kernel
  ColumnsFn kernel;
  void Run(int64_t b, int64_t e) const {
    if (q != nullptr) return q->Columns(a.w, nullptr, a.y, a.n, b, e);
    kernel(a, b, e);
  }
};

// fn(i, lb, le) for the parts of [b, e) in each expert i, whose rows are
// [i * rows, (i + 1) * rows) of the pass.
template <typename Fn>
void EachExpert(int64_t experts, int64_t rows, int64_t b, int64_t e, const Fn& fn) {
  for (int64_t i = b / rows; i < experts && i * rows < e; ++i) {
    fn(i, std::max(b, i * rows) - i * rows, std::min(e, (i + 1) * rows) - i * rows);
  }
}

}  // namespace

void CpuExpertPasses(ThreadPool& pool, SimdLevel level, absl::Span<const ExpertPass> experts,
                     DType gate_up, DType down, int64_t hidden, int64_t inter,
                     absl::Span<QuantizedInput> inputs) {
  const int64_t n = static_cast<int64_t>(experts.size());
  int64_t m = 0;
  for (const ExpertPass& p : experts) m = std::max(m, p.count);
  const ColumnsFn kernel = ColumnsFor(level);
  // A pass's grain as its products' own (CpuMatMul's), over all experts'
  // rows; whole row groups, so every edge is one within each expert.
  auto grain = [&](DType t, int64_t rows, int64_t k) {
    return ColumnGrain(pool, level, t, m, n * rows, k);
  };
  // Expert i's prepared activations (block formats, bf16 on AVX512_BF16),
  // into inputs[i].
  auto prepare = [&](int64_t i, const float* x, int64_t k, DType t) -> const QuantizedInput* {
    if (!PreparesActivations(t, level) || experts[i].count == 0) return nullptr;
    inputs[i].Prepare(x, experts[i].count, k, t, level);
    return &inputs[i];
  };
  std::vector<ColumnProduct> gates, ups, downs;
  for (int64_t i = 0; i < n; ++i) {
    const ExpertPass& p = experts[i];
    const QuantizedInput* q = prepare(i, p.x, hidden, gate_up);
    gates.push_back({{p.x, p.gate, gate_up, nullptr, p.g, p.count, inter, hidden}, q, kernel});
    ups.push_back({{p.x, p.up, gate_up, nullptr, p.u, p.count, inter, hidden}, q, kernel});
  }
  pool.ParallelFor(n * inter, grain(gate_up, inter, hidden), [&](int64_t b, int64_t e) {
    EachExpert(n, inter, b, e, [&](int64_t i, int64_t lb, int64_t le) {
      const ExpertPass& p = experts[i];
      if (p.count == 0) return;
      gates[i].Run(lb, le);
      ups[i].Run(lb, le);
      for (int64_t r = 0; r < p.count; ++r) {
        cpu::SiluMul(level, p.g + r * inter + lb, p.u + r * inter + lb, p.g + r * inter + lb,
                     le - lb);
      }
    });
  });
  for (int64_t i = 0; i < n; ++i) {
    const ExpertPass& p = experts[i];
    const QuantizedInput* q = prepare(i, p.g, inter, down);
    downs.push_back({{p.g, p.down, down, nullptr, p.d, p.count, hidden, inter}, q, kernel});
  }
  pool.ParallelFor(n * hidden, grain(down, hidden, inter), [&](int64_t b, int64_t e) {
    EachExpert(n, hidden, b, e, [&](int64_t i, int64_t lb, int64_t le) {
      if (experts[i].count > 0) downs[i].Run(lb, le);
    });
  });
}

}  // namespace moe
