// Plain scalar reference implementations of the backend ops, in double
// precision, used only by the parity tests. Written for clarity, not speed.
#ifndef MOECACHE_TESTS_KERNELS_REFERENCE_OPS_H_
#define MOECACHE_TESTS_KERNELS_REFERENCE_OPS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu_quant_matmul.h"
#include "kernels/dtype.h"

namespace moe::ref {

inline std::vector<float> MatMul(const std::vector<float>& x, const void* w,
                                 DType dt, const float* bias, int64_t m,
                                 int64_t n, int64_t k) {
  std::vector<float> y(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = bias ? bias[j] : 0.0;
      for (int64_t t = 0; t < k; ++t) {
        acc += static_cast<double>(x[i * k + t]) * LoadAsF32(w, dt, j * k + t);
      }
      y[i * n + j] = static_cast<float>(acc);
    }
  }
  return y;
}

inline std::vector<float> RmsNorm(const std::vector<float>& x,
                                  const std::vector<float>& w, int64_t rows,
                                  int64_t dim, double eps) {
  std::vector<float> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
    double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = float(x[r * dim + i] * inv * w[i]);
  }
  return y;
}

// In place on v [tokens, heads, head_dim].
inline void Rope(std::vector<float>& v, const std::vector<int32_t>& pos,
                 int64_t tokens, int64_t heads, int64_t head_dim,
                 double theta) {
  int64_t half = head_dim / 2;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      float* p = v.data() + (t * heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        double ang = pos[t] * std::pow(theta, -2.0 * i / head_dim);
        double a = p[i], b = p[i + half];
        p[i] = float(a * std::cos(ang) - b * std::sin(ang));
        p[i + half] = float(b * std::cos(ang) + a * std::sin(ang));
      }
    }
  }
}

// q [tokens, heads, d]; keys/values [len_total, kv_heads, d] (every position
// up to start_pos + tokens). Causal from start_pos.
inline std::vector<float> Attention(const std::vector<float>& q,
                                    const std::vector<float>& keys,
                                    const std::vector<float>& values,
                                    const AttentionShape& s, double scale) {
  const int64_t d = s.head_dim, group = s.heads / s.kv_heads;
  std::vector<float> out(q.size());
  for (int64_t t = 0; t < s.tokens; ++t) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t kvh = h / group, len = s.start_pos + t + 1;
      std::vector<double> sc(len);
      double mx = -INFINITY;
      for (int64_t j = 0; j < len; ++j) {
        double dot = 0;
        for (int64_t i = 0; i < d; ++i) {
          dot += double(q[(t * s.heads + h) * d + i]) *
                 keys[(j * s.kv_heads + kvh) * d + i];
        }
        sc[j] = dot * scale;
        mx = std::max(mx, sc[j]);
      }
      double sum = 0;
      for (double& x : sc) sum += (x = std::exp(x - mx));
      for (int64_t i = 0; i < d; ++i) {
        double acc = 0;
        for (int64_t j = 0; j < len; ++j) {
          acc += sc[j] * values[(j * s.kv_heads + kvh) * d + i];
        }
        out[(t * s.heads + h) * d + i] = float(acc / sum);
      }
    }
  }
  return out;
}

// Indices of the k largest of row (descending, ties -> lower index).
inline std::vector<int32_t> TopKIds(const std::vector<double>& row, int64_t k) {
  std::vector<int32_t> idx(row.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  idx.resize(k);
  return idx;
}

inline void Router(const std::vector<float>& logits, int64_t tokens,
                   int64_t experts, int64_t k, bool renorm,
                   std::vector<int32_t>* ids, std::vector<float>* weights) {
  ids->clear();
  weights->clear();
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<double> p(experts);
    double mx = -INFINITY, sum = 0;
    for (int64_t e = 0; e < experts; ++e) mx = std::max<double>(mx, logits[t * experts + e]);
    for (int64_t e = 0; e < experts; ++e) sum += (p[e] = std::exp(logits[t * experts + e] - mx));
    for (double& v : p) v /= sum;
    std::vector<int32_t> top = TopKIds(p, k);
    double tsum = 0;
    for (int32_t e : top) tsum += p[e];
    for (int32_t e : top) {
      ids->push_back(e);
      weights->push_back(float(renorm ? p[e] / tsum : p[e]));
    }
  }
}

// out[rows[i]] += w_i * down(silu(gate x) * up x), in double.
inline void ExpertFfn(const std::vector<float>& x, const std::vector<int32_t>& rows,
                      const std::vector<float>& wts, const void* gate,
                      const void* up, const void* down, DType dt,
                      std::vector<float>& out, int64_t hidden, int64_t inter) {
  // The block formats multiply activations rounded to 8 bits per 32
  // (kernels/cpu_quant_matmul.h): x, and silu(gate) * up before down.
  const bool quant = IsQuantDType(dt);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<float> xq;
    const float* xr = x.data() + rows[i] * hidden;
    if (quant) {
      xq = RoundActivations(xr, 1, hidden);
      xr = xq.data();
    }
    std::vector<double> act(inter);
    for (int64_t j = 0; j < inter; ++j) {
      double g = 0, u = 0;
      for (int64_t h = 0; h < hidden; ++h) {
        g += double(xr[h]) * LoadAsF32(gate, dt, j * hidden + h);
        u += double(xr[h]) * LoadAsF32(up, dt, j * hidden + h);
      }
      act[j] = g / (1.0 + std::exp(-g)) * u;
    }
    if (quant) {
      std::vector<float> a32(act.begin(), act.end());
      std::vector<float> r = RoundActivations(a32.data(), 1, inter);
      act.assign(r.begin(), r.end());
    }
    for (int64_t h = 0; h < hidden; ++h) {
      double acc = 0;
      for (int64_t j = 0; j < inter; ++j) acc += act[j] * LoadAsF32(down, dt, h * inter + j);
      out[rows[i] * hidden + h] += float(wts[i] * acc);
    }
  }
}

}  // namespace moe::ref

#endif  // MOECACHE_TESTS_KERNELS_REFERENCE_OPS_H_
