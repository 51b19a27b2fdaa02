#include "kernels/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"

namespace moe::cpu {
namespace {

// Rows per chunk so that a chunk holds roughly `target` elements.
int64_t RowGrain(int64_t row_elems, int64_t target = 16384) {
  return std::max<int64_t>(1, target / std::max<int64_t>(row_elems, 1));
}

// Inserts (value, id) into the descending list vals/ids of length len < cap
// or replacing the last; equal values keep the earlier (lower) id first.
void InsertTop(float value, int32_t id, float* vals, int32_t* ids, int64_t& len,
               int64_t cap) {
  if (len == cap) {
    if (!(value > vals[len - 1])) return;
    --len;
  }
  int64_t pos = len;
  while (pos > 0 && value > vals[pos - 1]) {
    vals[pos] = vals[pos - 1];
    ids[pos] = ids[pos - 1];
    --pos;
  }
  vals[pos] = value;
  ids[pos] = id;
  ++len;
}

void TopKRow(const float* x, int64_t n, int64_t k, int32_t* ids, float* vals) {
  int64_t len = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (len == k && !(x[j] > vals[k - 1])) continue;
    InsertTop(x[j], static_cast<int32_t>(j), vals, ids, len, k);
  }
}

}  // namespace

void RmsNorm(ThreadPool& pool, const float* x, const float* weight, float* y,
             int64_t rows, int64_t dim, float eps) {
  pool.ParallelFor(rows, RowGrain(dim), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x + r * dim;
      float* yr = y + r * dim;
      // ggml's rms_norm to the bit: the f32 squares summed in double, the
      // mean rounded to f32, 1 / sqrtf(mean + eps), then (x * inv) * w.
      // (An f32 sum differed from llama.cpp's by ~1 ulp, enough to flip a
      // next 8-bit activation code now and then: 0.005-0.01 in a logit.)
      double ss = 0.0;
      for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i] * xr[i]);
      const float mean = static_cast<float>(ss / static_cast<double>(dim));
      const float inv = 1.0f / std::sqrt(mean + eps);
      for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv * weight[i];
    }
  });
}

void Rope(ThreadPool& pool, float* q, float* k, const int32_t* positions,
          int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
          float theta) {
  const int64_t half = head_dim / 2;
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = std::pow(static_cast<double>(theta),
                           -2.0 * static_cast<double>(i) / head_dim);
  }
  pool.ParallelFor(tokens, RowGrain((q_heads + kv_heads) * head_dim * 8, 1 << 18),
                   [&](int64_t b, int64_t e) {
    std::vector<float> cs(half), sn(half);
    for (int64_t t = b; t < e; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        double angle = static_cast<double>(positions[t]) * inv_freq[i];
        cs[i] = static_cast<float>(std::cos(angle));
        sn[i] = static_cast<float>(std::sin(angle));
      }
      auto rotate = [&](float* base, int64_t heads) {
        for (int64_t h = 0; h < heads; ++h) {
          float* v = base + (t * heads + h) * head_dim;
          for (int64_t i = 0; i < half; ++i) {
            float a = v[i], c = v[i + half];
            v[i] = a * cs[i] - c * sn[i];
            v[i + half] = c * cs[i] + a * sn[i];
          }
        }
      };
      rotate(q, q_heads);
      rotate(k, kv_heads);
    }
  });
}

void KvCacheAppend(const float* k, const float* v, float* k_cache,
                   float* v_cache, const AttentionShape& s) {
  const int64_t row = s.kv_heads * s.head_dim;
  const size_t bytes = static_cast<size_t>(s.tokens * row) * sizeof(float);
  std::memmove(k_cache + s.start_pos * row, k, bytes);
  std::memmove(v_cache + s.start_pos * row, v, bytes);
}

void Attention(ThreadPool& pool, const VectorOps& vo, const float* q,
               const float* k_cache, const float* v_cache, float* out,
               const AttentionShape& s, float scale) {
  const int64_t group = s.heads / s.kv_heads;
  const int64_t d = s.head_dim;
  const int64_t kv_row = s.kv_heads * d;
  const int64_t span = s.start_pos + s.tokens;  // longest context
  pool.ParallelFor(s.tokens * s.heads, RowGrain(span * d * 2, 1 << 17),
                   [&](int64_t b, int64_t e) {
    std::vector<float> scores(span);
    std::vector<float> acc(d);
    for (int64_t th = b; th < e; ++th) {
      const int64_t t = th / s.heads, h = th % s.heads;
      const int64_t kvh = h / group;
      const int64_t len = s.start_pos + t + 1;
      const float* qv = q + th * d;
      vo.dot_rows(qv, k_cache + kvh * d, kv_row, len, d, scale, scores.data());
      const float sum = vo.exp_sum(scores.data(), len, vo.max(scores.data(), len));
      std::fill(acc.begin(), acc.end(), 0.0f);
      vo.axpy_rows(scores.data(), v_cache + kvh * d, kv_row, len, acc.data(), d);
      float* o = out + th * d;
      const float inv = 1.0f / sum;
      for (int64_t i = 0; i < d; ++i) o[i] = acc[i] * inv;
    }
  });
}

void RouterTopK(ThreadPool& pool, const float* logits, int32_t* ids,
                float* weights, int64_t tokens, int64_t experts, int64_t top_k,
                bool renormalize) {
  pool.ParallelFor(tokens, RowGrain(experts * 4), [&](int64_t b, int64_t e) {
    std::vector<float> prob(experts);
    for (int64_t t = b; t < e; ++t) {
      const float* l = logits + t * experts;
      float mx = *std::max_element(l, l + experts);
      float sum = 0.0f;
      for (int64_t j = 0; j < experts; ++j) {
        prob[j] = std::exp(l[j] - mx);
        sum += prob[j];
      }
      for (int64_t j = 0; j < experts; ++j) prob[j] /= sum;
      int32_t* id = ids + t * top_k;
      float* w = weights + t * top_k;
      TopKRow(prob.data(), experts, top_k, id, w);
      if (renormalize) {
        float s = 0.0f;
        for (int64_t j = 0; j < top_k; ++j) s += w[j];
        for (int64_t j = 0; j < top_k; ++j) w[j] /= s;
      }
    }
  });
}

absl::Status Embedding(ThreadPool& pool, const void* table, DType dtype,
                       const int32_t* ids, float* out, int64_t tokens,
                       int64_t vocab, int64_t hidden) {
  for (int64_t t = 0; t < tokens; ++t) {
    if (ids[t] < 0 || ids[t] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Embedding: token id ", ids[t], " at ", t, " is outside [0, ", vocab,
          ")"));
    }
  }
  const size_t elem = DTypeSize(dtype);
  pool.ParallelFor(tokens, RowGrain(hidden), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const char* row = static_cast<const char*>(table) +
                        static_cast<size_t>(ids[t]) * hidden * elem;
      ConvertToF32(row, dtype, out + t * hidden, hidden);
    }
  });
  return absl::OkStatus();
}

void ConvertToF32(const void* src, DType dtype, float* dst, int64_t n) {
  if (dtype == DType::kF32) {
    std::memmove(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const uint16_t* h = static_cast<const uint16_t*>(src);
  if (dtype == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToFloat(h[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(h[i]);
  }
}

void SiluMul(SimdLevel level, const float* gate, const float* up, float* out, int64_t n) {
  if (AtLeastAvx512(level)) return SiluMulAvx512(gate, up, out, n);
  for (int64_t i = 0; i < n; ++i) {
    float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

double SumExp(SimdLevel level, const float* x, int64_t n, float shift) {
  if (AtLeastAvx512(level)) return SumExpAvx512(x, n, shift);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i] - shift));
  return sum;
}

float MaxValue(SimdLevel level, const float* x, int64_t n) {
  if (AtLeastAvx512(level)) return MaxValueAvx512(x, n);
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max = std::max(max, x[i]);  // NaN: keeps max
  return max;
}

int64_t ArgmaxRow(SimdLevel level, const float* x, int64_t n) {
  if (AtLeastAvx512(level)) return ArgmaxRowAvx512(x, n);
  int64_t best = 0;
  for (int64_t j = 1; j < n; ++j) {
    if (x[j] > x[best]) best = j;
  }
  return best;
}

void Add(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void Scale(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void Sigmoid(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = 1.0f / (1.0f + std::exp(-x[i]));
}

void Argmax(const float* x, int32_t* ids, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * n;
    int64_t best = 0;
    for (int64_t j = 1; j < n; ++j) {
      if (row[j] > row[best]) best = j;
    }
    ids[r] = static_cast<int32_t>(best);
  }
}

void LogSoftmax(ThreadPool& pool, const float* x, float* out, int64_t rows,
                int64_t n) {
  pool.ParallelFor(rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* row = x + r * n;
      float mx = *std::max_element(row, row + n);
      double sum = 0.0;
      for (int64_t j = 0; j < n; ++j) sum += std::exp(row[j] - mx);
      const float lse = mx + static_cast<float>(std::log(sum));
      float* o = out + r * n;
      for (int64_t j = 0; j < n; ++j) o[j] = row[j] - lse;
    }
  });
}

void TopK(ThreadPool& pool, const float* x, int32_t* ids, float* values,
          int64_t rows, int64_t n, int64_t k) {
  pool.ParallelFor(rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      TopKRow(x + r * n, n, k, ids + r * k, values + r * k);
    }
  });
}

}  // namespace moe::cpu
