// Latent-attention and scored-router ops: the router (softmax / sigmoid
// scores, greedy, group-limited and bias-corrected noaux_tc selection),
// rotary embedding on interleaved pairs, and multi-head latent attention
// over the latent cache with kv_b_proj absorbed. Semantics:
// kernels/backend.h; CPU reference: kernels/cpu_mla_router_ops.cc (the
// selection below follows it step by step, so ids agree exactly away from
// float near-ties).
#include "kernels/cuda/common.cuh"

namespace moe::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMlaWarps = kThreads / 32;

// The k largest of x[0..n) in descending order, ties to the lower index.
__device__ void TopKDescending(const float* x, int64_t n, int64_t k,
                               int32_t* ids, float* vals) {
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

// One block per token. Scores in parallel; the selection by thread 0 (a few
// hundred experts: cheap, and identical in order to the CPU's).
__global__ void RouterSelectKernel(const float* __restrict__ logits,
                                   const float* __restrict__ bias, int32_t* ids,
                                   float* weights, int64_t experts,
                                   int64_t top_k, MoeCudaRouterSpec spec) {
  extern __shared__ float sh[];
  __shared__ float scratch[32];
  float* scores = sh;                        // [experts]
  float* choice = sh + experts;              // [experts]
  float* group = choice + experts;           // [n_group]
  float* group_vals = group + spec.n_group;  // [n_group]
  int32_t* group_ids = reinterpret_cast<int32_t*>(group_vals + spec.n_group);
  const float* l = logits + blockIdx.x * experts;
  int32_t* id = ids + blockIdx.x * top_k;
  float* w = weights + blockIdx.x * top_k;
  const bool biased = spec.selection == 2;
  if (spec.scoring == 0) {
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < experts; j += blockDim.x)
      mx = fmaxf(mx, l[j]);
    mx = BlockMax(mx, scratch);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < experts; j += blockDim.x) {
      scores[j] = expf(l[j] - mx);
      sum += scores[j];
    }
    sum = BlockSum(sum, scratch);
    for (int64_t j = threadIdx.x; j < experts; j += blockDim.x)
      scores[j] /= sum;
  } else {
    for (int64_t j = threadIdx.x; j < experts; j += blockDim.x)
      scores[j] = 1.0f / (1.0f + expf(-l[j]));
  }
  for (int64_t j = threadIdx.x; j < experts; j += blockDim.x)
    choice[j] = biased ? scores[j] + bias[j] : scores[j];
  __syncthreads();
  if (threadIdx.x != 0) return;
  if (spec.selection != 0) {
    const int64_t per = experts / spec.n_group;
    for (int64_t g = 0; g < spec.n_group; ++g) {
      int32_t top_ids[2];
      float top[2];
      TopKDescending(choice + g * per, per, biased ? 2 : 1, top_ids, top);
      group[g] = biased ? top[0] + top[1] : top[0];
    }
    TopKDescending(group, spec.n_group, spec.topk_group, group_ids, group_vals);
    for (int64_t j = 0; j < experts; ++j) {
      bool keep = false;
      for (int64_t g = 0; g < spec.topk_group; ++g)
        keep = keep || group_ids[g] == j / per;
      if (!keep) choice[j] = 0.0f;
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

// One thread per (token, head, pair); the angle in double as Rope's.
__global__ void RopeInterleavedKernel(float* x,
                                      const int32_t* __restrict__ positions,
                                      const float* __restrict__ inv_freq,
                                      int64_t tokens, int64_t heads,
                                      int64_t stride, int64_t offset,
                                      int64_t half, float mscale) {
  const int64_t idx =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= tokens * heads * half) return;
  const int64_t i = idx % half, th = idx / half, t = th / heads;
  double sn, cs;
  sincos(static_cast<double>(positions[t]) * static_cast<double>(inv_freq[i]),
         &sn, &cs);
  const float c = static_cast<float>(cs) * mscale;
  const float s = static_cast<float>(sn) * mscale;
  float* v = x + th * stride + offset + 2 * i;
  const float a = v[0], b = v[1];
  v[0] = a * c - b * s;
  v[1] = b * c + a * s;
}

// One block per (head, token). Shared: q_lat [rank], o_lat [rank], q_pe
// [rope], the scores of one chunk of kMlaWarps keys. Each warp scores one
// key of the chunk; every thread then updates the online softmax (same
// values in every thread) and its own o_lat dims, in key order, so reruns
// are bit-identical.
template <typename T>
__global__ void MlaAttentionKernel(const float* __restrict__ q,
                                   const T* __restrict__ kv_b,
                                   const float* __restrict__ ckv,
                                   const float* __restrict__ kpe,
                                   float* __restrict__ out, MoeCudaMlaShape s,
                                   float scale) {
  extern __shared__ float sh[];
  float* q_lat = sh;
  float* o_lat = q_lat + s.rank;
  float* q_pe = o_lat + s.rank;
  float* chunk = q_pe + s.rope_dim;  // [kMlaWarps]
  const int64_t h = blockIdx.x, t = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t qk = s.nope_dim + s.rope_dim;
  const float* qv = q + (t * s.heads + h) * qk;
  const T* wk = kv_b + h * (s.nope_dim + s.v_dim) * s.rank;
  const T* wv = wk + s.nope_dim * s.rank;
  for (int64_t r = threadIdx.x; r < s.rank; r += blockDim.x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < s.nope_dim; ++i)
      acc += qv[i] * ToF32(wk[i * s.rank + r]);
    q_lat[r] = acc;
    o_lat[r] = 0.0f;
  }
  for (int64_t i = threadIdx.x; i < s.rope_dim; i += blockDim.x)
    q_pe[i] = qv[s.nope_dim + i];
  __syncthreads();
  const int64_t len = s.start_pos + t + 1;
  float m = -INFINITY, l = 0.0f;
  for (int64_t base = 0; base < len; base += kMlaWarps) {
    const int64_t j = base + warp;
    float dot = 0.0f;
    if (j < len) {
      for (int64_t r = lane; r < s.rank; r += 32)
        dot += q_lat[r] * ckv[j * s.rank + r];
      for (int64_t r = lane; r < s.rope_dim; r += 32)
        dot += q_pe[r] * kpe[j * s.rope_dim + r];
    }
    dot = WarpSum(dot);
    if (lane == 0) chunk[warp] = j < len ? dot * scale : -INFINITY;
    __syncthreads();
    float m_new = m;
    for (int w = 0; w < kMlaWarps; ++w) m_new = fmaxf(m_new, chunk[w]);
    const float factor = expf(m - m_new);
    l *= factor;
    for (int w = 0; w < kMlaWarps; ++w) l += expf(chunk[w] - m_new);
    for (int64_t r = threadIdx.x; r < s.rank; r += blockDim.x) {
      float acc = o_lat[r] * factor;
      for (int w = 0; w < kMlaWarps && base + w < len; ++w)
        acc += expf(chunk[w] - m_new) * ckv[(base + w) * s.rank + r];
      o_lat[r] = acc;
    }
    m = m_new;
    __syncthreads();
  }
  const float inv = 1.0f / l;
  float* o = out + (t * s.heads + h) * s.v_dim;
  for (int64_t v = warp; v < s.v_dim; v += kMlaWarps) {
    float acc = 0.0f;
    for (int64_t r = lane; r < s.rank; r += 32)
      acc += ToF32(wv[v * s.rank + r]) * o_lat[r];
    acc = WarpSum(acc);
    if (lane == 0) o[v] = acc * inv;
  }
}

}  // namespace

int RouterSelect(const float* logits, const float* bias, int32_t* ids,
                 float* weights, int64_t tokens, int64_t experts, int64_t top_k,
                 const MoeCudaRouterSpec* spec, void* stream) {
  MOE_CUDA_TRY(UseDevice());
  const int64_t groups = spec->selection == 0 ? 0 : spec->n_group;
  const size_t shared = sizeof(float) * (2 * experts + 3 * groups);
  if (experts > MOE_CUDA_MAX_ROUTER_EXPERTS || shared > 48 * 1024 ||
      tokens > INT32_MAX) {
    return ModuleCode(MOE_CUDA_ERR_BAD_ARGUMENT);
  }
  MoeCudaRouterSpec s = *spec;
  if (s.selection == 0) s.n_group = 0;
  RouterSelectKernel<<<static_cast<unsigned>(tokens), 128, shared,
                       AsStream(stream)>>>(logits, bias, ids, weights, experts,
                                           top_k, s);
  return LaunchCode();
}

int RopeInterleaved(float* x, const int32_t* positions, const float* inv_freq,
                    int64_t tokens, int64_t heads, int64_t stride,
                    int64_t offset, int64_t rot_dim, float mscale,
                    void* stream) {
  MOE_CUDA_TRY(UseDevice());
  const int64_t half = rot_dim / 2;
  RopeInterleavedKernel<<<Blocks(tokens * heads * half, kThreads), kThreads, 0,
                          AsStream(stream)>>>(
      x, positions, inv_freq, tokens, heads, stride, offset, half, mscale);
  return LaunchCode();
}

int MlaAttention(const float* q, const void* kv_b, int kv_b_dtype,
                 const float* ckv_cache, const float* kpe_cache, float* out,
                 const MoeCudaMlaShape* shape, float scale, void* stream) {
  MOE_CUDA_TRY(UseDevice());
  const MoeCudaMlaShape& s = *shape;
  if (s.rank + s.rope_dim > MOE_CUDA_MAX_MLA_RANK || s.heads > INT32_MAX ||
      s.tokens > 65535) {
    return ModuleCode(MOE_CUDA_ERR_BAD_ARGUMENT);
  }
  const size_t shared = sizeof(float) * (2 * s.rank + s.rope_dim + kMlaWarps);
  const dim3 grid(static_cast<unsigned>(s.heads),
                  static_cast<unsigned>(s.tokens));
  cudaStream_t st = AsStream(stream);
  switch (kv_b_dtype) {
    case MOE_CUDA_DTYPE_F32:
      MlaAttentionKernel<<<grid, kThreads, shared, st>>>(
          q, static_cast<const float*>(kv_b), ckv_cache, kpe_cache, out, s,
          scale);
      break;
    case MOE_CUDA_DTYPE_F16:
      MlaAttentionKernel<<<grid, kThreads, shared, st>>>(
          q, static_cast<const __half*>(kv_b), ckv_cache, kpe_cache, out, s,
          scale);
      break;
    case MOE_CUDA_DTYPE_BF16:
      MlaAttentionKernel<<<grid, kThreads, shared, st>>>(
          q, static_cast<const __nv_bfloat16*>(kv_b), ckv_cache, kpe_cache, out,
          s, scale);
      break;
    default:
      return ModuleCode(MOE_CUDA_ERR_BAD_DTYPE);
  }
  return LaunchCode();
}

}  // namespace moe::cuda
