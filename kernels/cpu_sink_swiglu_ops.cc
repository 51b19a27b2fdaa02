#include "kernels/cpu_sink_swiglu_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace moe::cpu {

void SinkAttention(ThreadPool& pool, const VectorOps& vo, const float* q,
                   const float* k_cache, const float* v_cache,
                   const float* sinks, float* out, const AttentionShape& s,
                   float scale, int64_t window) {
  const int64_t group = s.heads / s.kv_heads;
  const int64_t d = s.head_dim;
  const int64_t kv_row = s.kv_heads * d;
  const int64_t span = s.start_pos + s.tokens;
  const int64_t widest = window > 0 ? std::min(window, span) : span;
  const int64_t grain = std::max<int64_t>(
      1, (int64_t{1} << 17) / std::max<int64_t>(widest * d * 2, 1));
  pool.ParallelFor(s.tokens * s.heads, grain, [&](int64_t b, int64_t e) {
    std::vector<float> scores(widest);
    std::vector<float> acc(d);
    for (int64_t th = b; th < e; ++th) {
      const int64_t t = th / s.heads, h = th % s.heads;
      const int64_t kvh = h / group;
      const int64_t p = s.start_pos + t;
      // p - window < j <= p (sliding_window_overlay and the causal mask).
      const int64_t first =
          window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
      const int64_t len = p + 1 - first;
      const float* qv = q + th * d;
      const int64_t at = first * kv_row + kvh * d;
      vo.dot_rows(qv, k_cache + at, kv_row, len, d, scale, scores.data());
      const float mx = std::max(sinks[h], vo.max(scores.data(), len));
      // The keys' terms, then the sink's share (in the sum only).
      const float sum = vo.exp_sum(scores.data(), len, mx) + std::exp(sinks[h] - mx);
      std::fill(acc.begin(), acc.end(), 0.0f);
      vo.axpy_rows(scores.data(), v_cache + at, kv_row, len, acc.data(), d);
      float* o = out + th * d;
      const float inv = 1.0f / sum;
      for (int64_t i = 0; i < d; ++i) o[i] = acc[i] * inv;
    }
  });
}

void ClampedSwigluRows(float* g, const float* u, int64_t rows, int64_t inter,
                       const ClampedSwiglu& act) {
  const int64_t n = rows * inter;
  for (int64_t i = 0; i < n; ++i) {
    const float gate = std::min(g[i], act.limit);
    const float up = std::clamp(u[i], -act.limit, act.limit);
    const float glu = gate / (1.0f + std::exp(-act.alpha * gate));
    g[i] = (up + 1.0f) * glu;
  }
}

}  // namespace moe::cpu
