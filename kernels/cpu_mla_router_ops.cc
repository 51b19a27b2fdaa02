#include "kernels/cpu_mla_router_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu_ops.h"

namespace moe::cpu {
namespace {

// The k largest of x[0..n) in descending order, ties to the lower index.
void TopKDescending(const float* x, int64_t n, int64_t k, int32_t* ids,
                    float* vals) {
  int64_t len = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (len == k && !(x[j] > vals[k - 1])) continue;
    int64_t pos = len == k ? k - 1 : len++;
    while (pos > 0 && x[j] > vals[pos - 1]) {
      vals[pos] = vals[pos - 1];
      ids[pos] = ids[pos - 1];
      --pos;
    }
    vals[pos] = x[j];
    ids[pos] = static_cast<int32_t>(j);
  }
}

// One token of RouterSelect; `scratch` holds 3 * experts floats.
void SelectRow(const float* l, const float* bias, int32_t* id, float* w,
               int64_t experts, int64_t top_k, const RouterSpec& spec,
               float* scratch) {
  float* scores = scratch;
  float* choice = scratch + experts;
  float* group_score = scratch + 2 * experts;  // n_group <= experts
  if (spec.scoring == RouterScoring::kSoftmax) {
    const float mx = *std::max_element(l, l + experts);
    float sum = 0.0f;
    for (int64_t j = 0; j < experts; ++j) {
      scores[j] = std::exp(l[j] - mx);
      sum += scores[j];
    }
    for (int64_t j = 0; j < experts; ++j) scores[j] /= sum;
  } else {
    for (int64_t j = 0; j < experts; ++j) {
      scores[j] = 1.0f / (1.0f + std::exp(-l[j]));
    }
  }
  const bool biased = spec.selection == RouterSelection::kBiasedGroupLimited;
  for (int64_t j = 0; j < experts; ++j) {
    choice[j] = biased ? scores[j] + bias[j] : scores[j];
  }
  if (spec.selection != RouterSelection::kGreedy) {
    const int64_t per = experts / spec.n_group;
    for (int64_t g = 0; g < spec.n_group; ++g) {
      int32_t top_ids[2];
      float top[2];
      TopKDescending(choice + g * per, per, biased ? 2 : 1, top_ids, top);
      group_score[g] = biased ? top[0] + top[1] : top[0];
    }
    std::vector<int32_t> groups(spec.topk_group);
    std::vector<float> unused(spec.topk_group);
    TopKDescending(group_score, spec.n_group, spec.topk_group, groups.data(),
                   unused.data());
    std::vector<bool> keep(spec.n_group, false);
    for (int32_t g : groups) keep[g] = true;
    for (int64_t j = 0; j < experts; ++j) {
      if (!keep[j / per]) choice[j] = 0.0f;
    }
  }
  TopKDescending(choice, experts, top_k, id, w);
  for (int64_t j = 0; j < top_k; ++j) w[j] = scores[id[j]];
  if (spec.renormalize && top_k > 1) {
    float sum = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) sum += w[j];
    for (int64_t j = 0; j < top_k; ++j) w[j] /= sum + 1e-20f;
  }
  for (int64_t j = 0; j < top_k; ++j) w[j] *= spec.scale;
}

}  // namespace

void RouterSelect(ThreadPool& pool, const float* logits, const float* bias,
                  int32_t* ids, float* weights, int64_t tokens, int64_t experts,
                  int64_t top_k, const RouterSpec& spec) {
  pool.ParallelFor(tokens, 1, [&](int64_t b, int64_t e) {
    std::vector<float> scratch(3 * experts);
    for (int64_t t = b; t < e; ++t) {
      SelectRow(logits + t * experts, bias, ids + t * top_k,
                weights + t * top_k, experts, top_k, spec, scratch.data());
    }
  });
}

void RopeInterleaved(ThreadPool& pool, float* x, const int32_t* positions,
                     const float* inv_freq, int64_t tokens, int64_t heads,
                     int64_t stride, int64_t offset, int64_t rot_dim,
                     float mscale) {
  const int64_t half = rot_dim / 2;
  pool.ParallelFor(tokens, 1, [&](int64_t b, int64_t e) {
    std::vector<float> cs(half), sn(half);
    for (int64_t t = b; t < e; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(positions[t]) *
                             static_cast<double>(inv_freq[i]);
        cs[i] = static_cast<float>(std::cos(angle)) * mscale;
        sn[i] = static_cast<float>(std::sin(angle)) * mscale;
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + (t * heads + h) * stride + offset;
        for (int64_t i = 0; i < half; ++i) {
          const float a = v[2 * i], c = v[2 * i + 1];
          v[2 * i] = a * cs[i] - c * sn[i];
          v[2 * i + 1] = c * cs[i] + a * sn[i];
        }
      }
    }
  });
}

// Below this many tokens a call reads a bf16 kv_b without widening it.
constexpr int64_t kMlaWidenFromTokens = 8;

void MlaAttention(ThreadPool& pool, const VectorOps& vo, const float* q,
                  const void* kv_b, DType kv_b_dtype, const float* ckv_cache,
                  const float* kpe_cache, float* out, const MlaShape& s,
                  float scale) {
  const int64_t qk = s.nope_dim + s.rope_dim;
  const int64_t rows = s.nope_dim + s.v_dim;  // kv_b rows per head
  const int64_t span = s.start_pos + s.tokens;
  const size_t elem = DTypeSize(kv_b_dtype);
  // A chunk is one head's tokens (head-major order), or a share of them
  // when there are more threads than heads, so each head's kv_b block is
  // converted once a chunk, not once a token (grain 1 made every (head,
  // token) a chunk of its own: the conversion was 59% of a 200-token
  // prompt's attention, docs/benchmarks.md "Attention on the CPU").
  const int64_t threads = std::max(1, pool.size());
  const int64_t grain =
      std::max<int64_t>(1, std::min(s.tokens, (s.tokens * s.heads + threads - 1) / threads));
  // A few tokens a head (decode) read a bf16 kv_b as it is stored: the
  // bf16 helpers are the f32 ones on the widened rows, bit for bit, so the
  // choice changes only the speed (a decode step would otherwise widen
  // every head's block for one token).
  const bool direct = kv_b_dtype == DType::kBF16 && s.tokens < kMlaWidenFromTokens;
  pool.ParallelFor(s.tokens * s.heads, grain, [&](int64_t b, int64_t e) {
    std::vector<float> w(direct ? 0 : rows * s.rank), q_lat(s.rank), o_lat(s.rank);
    std::vector<float> p(span), p_rope(span);
    int64_t loaded = -1;
    // Head-major, so that a chunk converts each head's kv_b block once.
    for (int64_t ht = b; ht < e; ++ht) {
      const int64_t h = ht / s.tokens, t = ht % s.tokens;
      const int64_t th = t * s.heads + h;
      const void* block =  // this head's [nope + v, rank] block of kv_b
          static_cast<const char*>(kv_b) + static_cast<size_t>(h * rows * s.rank) * elem;
      if (!direct && h != loaded) {
        ConvertToF32(block, kv_b_dtype, w.data(), rows * s.rank);
        loaded = h;
      }
      const float* qv = q + th * qk;
      // q_lat = sum_i q_nope[i] * w_i, the rows in order (axpy_rows holds
      // q_lat in registers across them).
      std::fill(q_lat.begin(), q_lat.end(), 0.0f);
      const uint16_t* block16 = static_cast<const uint16_t*>(block);
      if (direct) {
        vo.axpy_rows_bf16(qv, block16, s.rank, s.nope_dim, q_lat.data(), s.rank);
      } else {
        vo.axpy_rows(qv, w.data(), s.rank, s.nope_dim, q_lat.data(), s.rank);
      }
      const int64_t len = s.start_pos + t + 1;
      // p[j] = (q_lat . ckv_j + q_rope . kpe_j) * scale (dot_rows with
      // scale 1 is the plain dot).
      vo.dot_rows(q_lat.data(), ckv_cache, s.rank, len, s.rank, 1.0f, p.data());
      vo.dot_rows(qv + s.nope_dim, kpe_cache, s.rope_dim, len, s.rope_dim, 1.0f,
                  p_rope.data());
      for (int64_t j = 0; j < len; ++j) p[j] = (p[j] + p_rope[j]) * scale;
      const float sum = vo.exp_sum(p.data(), len, vo.max(p.data(), len));
      for (int64_t j = 0; j < len; ++j) p[j] /= sum;
      std::fill(o_lat.begin(), o_lat.end(), 0.0f);
      vo.axpy_rows(p.data(), ckv_cache, s.rank, len, o_lat.data(), s.rank);
      float* o = out + th * s.v_dim;
      if (direct) {
        vo.dot_rows_bf16(o_lat.data(), block16 + s.nope_dim * s.rank, s.rank, s.v_dim, s.rank,
                         1.0f, o);
      } else {
        vo.dot_rows(o_lat.data(), w.data() + s.nope_dim * s.rank, s.rank, s.v_dim, s.rank, 1.0f,
                    o);
      }
    }
  });
}

}  // namespace moe::cpu
