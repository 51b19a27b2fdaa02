// Row-wise and element-wise ops: RMSNorm, RoPE, router softmax + top-k,
// embedding gather, dtype widening, SiLU-mul / add / scale / sigmoid, and
// the sampling helpers (argmax, log-softmax, top-k).
#include "kernels/cuda/common.cuh"

namespace moe::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void RmsNormKernel(const float* __restrict__ x,
                              const float* __restrict__ w, float* y,
                              int64_t dim, float eps) {
  __shared__ float scratch[32];
  const float* xr = x + blockIdx.x * dim;
  float* yr = y + blockIdx.x * dim;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  ss = BlockSum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    yr[i] = xr[i] * inv * w[i];
  }
}

// One thread per (token, head, pair i < head_dim / 2); the angle in double
// so that large positions keep f32 accuracy.
__global__ void RopeKernel(float* v, const int32_t* __restrict__ positions,
                           int64_t tokens, int64_t heads, int64_t head_dim,
                           double log_theta) {
  const int64_t half = head_dim / 2;
  int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= tokens * heads * half) return;
  const int64_t i = idx % half;
  const int64_t th = idx / half;
  const int64_t t = th / heads;
  const double inv_freq = exp(-2.0 * static_cast<double>(i) / head_dim * log_theta);
  double sn, cs;
  sincos(static_cast<double>(positions[t]) * inv_freq, &sn, &cs);
  float* p = v + th * head_dim;
  const float a = p[i], b = p[i + half];
  const float c = static_cast<float>(cs), s = static_cast<float>(sn);
  p[i] = a * c - b * s;
  p[i + half] = b * c + a * s;
}

// Keeps vals/ids (length *len <= cap) sorted descending; equal values keep
// the earlier id first.
__device__ void InsertTop(float value, int32_t id, float* vals, int32_t* ids,
                          int64_t* len, int64_t cap) {
  if (*len == cap) {
    if (!(value > vals[cap - 1])) return;
    --*len;
  }
  int64_t pos = *len;
  while (pos > 0 && value > vals[pos - 1]) {
    vals[pos] = vals[pos - 1];
    ids[pos] = ids[pos - 1];
    --pos;
  }
  vals[pos] = value;
  ids[pos] = id;
  ++*len;
}

// One thread per token: experts are few (<= a few hundred).
__global__ void RouterKernel(const float* __restrict__ logits, int32_t* ids,
                             float* weights, int64_t tokens, int64_t experts,
                             int64_t top_k, int renormalize) {
  int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const float* l = logits + t * experts;
  float mx = -INFINITY;
  for (int64_t e = 0; e < experts; ++e) mx = fmaxf(mx, l[e]);
  float sum = 0.0f;
  for (int64_t e = 0; e < experts; ++e) sum += expf(l[e] - mx);
  float* w = weights + t * top_k;
  int32_t* id = ids + t * top_k;
  int64_t len = 0;
  for (int64_t e = 0; e < experts; ++e) {
    InsertTop(expf(l[e] - mx) / sum, static_cast<int32_t>(e), w, id, &len,
              top_k);
  }
  if (renormalize) {
    float s = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) s += w[j];
    for (int64_t j = 0; j < top_k; ++j) w[j] /= s;
  }
}

template <typename T>
__global__ void WidenKernel(const T* __restrict__ src, float* __restrict__ dst,
                            int64_t n) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = ToF32(src[i]);
}

template <typename T>
__global__ void EmbeddingKernel(const T* __restrict__ table,
                                const int32_t* __restrict__ ids,
                                float* __restrict__ out, int64_t tokens,
                                int64_t vocab, int64_t hidden) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < tokens * hidden) {
    const int64_t id = ids[i / hidden];
    // An id outside the table must not read out of bounds (that would
    // poison the CUDA context); NaN makes the caller's bug visible instead.
    out[i] = id >= 0 && id < vocab ? ToF32(table[id * hidden + i % hidden])
                                   : __int_as_float(0x7fc00000);
  }
}

__global__ void ElementwiseKernel(int kind, const float* a, const float* b,
                                  float* out, float s, int64_t n) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  switch (kind) {
    case MOE_CUDA_EW_SILU_MUL: {
      float g = a[i];
      out[i] = g / (1.0f + expf(-g)) * b[i];
      break;
    }
    case MOE_CUDA_EW_ADD:
      out[i] = a[i] + b[i];
      break;
    case MOE_CUDA_EW_SCALE:
      out[i] = a[i] * s;
      break;
    default:
      out[i] = 1.0f / (1.0f + expf(-a[i]));
      break;
  }
}

// (value, index) ordering of the sampling helpers: larger value first, then
// lower index. NaN never wins.
__device__ __forceinline__ bool Better(float v, int64_t i, float bv,
                                       int64_t bi) {
  return v > bv || (v == bv && i < bi);
}

// Block argmax over elements strictly after (prev_v, prev_i) in that
// ordering (prev_i < 0: no bound). Result in *out_v / *out_i (all threads).
__device__ void BlockArgmaxAfter(const float* row, int64_t n, float prev_v,
                                 int64_t prev_i, float* out_v,
                                 int64_t* out_i) {
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  float bv = -INFINITY;
  int64_t bi = INT64_MAX;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float v = row[j];
    if (prev_i >= 0 && !Better(prev_v, prev_i, v, j)) continue;
    if (Better(v, j, bv, bi)) {
      bv = v;
      bi = j;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (Better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) {
    sv[warp] = bv;
    si[warp] = bi;
  }
  __syncthreads();
  bv = -INFINITY;
  bi = INT64_MAX;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) {
    if (Better(sv[w], si[w], bv, bi)) {
      bv = sv[w];
      bi = si[w];
    }
  }
  // A row of only -inf (or NaN) still yields the lowest eligible index.
  if (bi == INT64_MAX) bi = prev_i < 0 ? 0 : prev_i + 1;
  *out_v = bv;
  *out_i = bi;
}

__global__ void TopKKernel(const float* __restrict__ x, int32_t* ids,
                           float* values, int64_t n, int64_t k) {
  const float* row = x + blockIdx.x * n;
  float v = 0.0f;
  int64_t i = -1;
  for (int64_t r = 0; r < k; ++r) {
    BlockArgmaxAfter(row, n, v, i, &v, &i);
    if (threadIdx.x == 0) {
      ids[blockIdx.x * k + r] = static_cast<int32_t>(i);
      values[blockIdx.x * k + r] = i < n ? row[i] : -INFINITY;
    }
  }
}

__global__ void LogSoftmaxKernel(const float* __restrict__ x, float* out,
                                 int64_t n) {
  __shared__ float scratch[32];
  const float* row = x + blockIdx.x * n;
  float* o = out + blockIdx.x * n;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, row[j]);
  mx = BlockMax(mx, scratch);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += expf(row[j] - mx);
  sum = BlockSum(sum, scratch);
  const float lse = mx + logf(sum);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) o[j] = row[j] - lse;
}

}  // namespace

int RmsNorm(const float* x, const float* weight, float* y, int64_t rows,
            int64_t dim, float eps, void* stream) {
  MOE_CUDA_TRY(UseDevice());
  if (rows > INT32_MAX) return ModuleCode(MOE_CUDA_ERR_BAD_ARGUMENT);
  RmsNormKernel<<<static_cast<unsigned>(rows), kThreads, 0, AsStream(stream)>>>(
      x, weight, y, dim, eps);
  return LaunchCode();
}

int Rope(float* q, float* k, const int32_t* positions, int64_t tokens,
         int64_t q_heads, int64_t kv_heads, int64_t head_dim, float theta,
         void* stream) {
  MOE_CUDA_TRY(UseDevice());
  const double log_theta = log(static_cast<double>(theta));
  const int64_t half = head_dim / 2;
  cudaStream_t st = AsStream(stream);
  if (q_heads > 0) {
    RopeKernel<<<Blocks(tokens * q_heads * half, kThreads), kThreads, 0, st>>>(
        q, positions, tokens, q_heads, head_dim, log_theta);
    MOE_CUDA_TRY(LaunchCode());
  }
  if (kv_heads > 0) {
    RopeKernel<<<Blocks(tokens * kv_heads * half, kThreads), kThreads, 0, st>>>(
        k, positions, tokens, kv_heads, head_dim, log_theta);
    MOE_CUDA_TRY(LaunchCode());
  }
  return 0;
}

int RouterTopK(const float* logits, int32_t* ids, float* weights,
               int64_t tokens, int64_t experts, int64_t top_k, int renormalize,
               void* stream) {
  MOE_CUDA_TRY(UseDevice());
  RouterKernel<<<Blocks(tokens, 64), 64, 0, AsStream(stream)>>>(
      logits, ids, weights, tokens, experts, top_k, renormalize);
  return LaunchCode();
}

int Embedding(const void* table, int dtype, const int32_t* ids, float* out,
              int64_t tokens, int64_t vocab, int64_t hidden, void* stream) {
  MOE_CUDA_TRY(UseDevice());
  const unsigned blocks = Blocks(tokens * hidden, kThreads);
  cudaStream_t st = AsStream(stream);
  switch (dtype) {
    case MOE_CUDA_DTYPE_F32:
      EmbeddingKernel<<<blocks, kThreads, 0, st>>>(
          static_cast<const float*>(table), ids, out, tokens, vocab, hidden);
      break;
    case MOE_CUDA_DTYPE_F16:
      EmbeddingKernel<<<blocks, kThreads, 0, st>>>(
          static_cast<const __half*>(table), ids, out, tokens, vocab, hidden);
      break;
    case MOE_CUDA_DTYPE_BF16:
      EmbeddingKernel<<<blocks, kThreads, 0, st>>>(
          static_cast<const __nv_bfloat16*>(table), ids, out, tokens, vocab, hidden);
      break;
    default:
      return ModuleCode(MOE_CUDA_ERR_BAD_DTYPE);
  }
  return LaunchCode();
}

int ConvertToF32(const void* src, int dtype, float* dst, int64_t n,
                 void* stream) {
  MOE_CUDA_TRY(UseDevice());
  const unsigned blocks = Blocks(n, kThreads);
  cudaStream_t st = AsStream(stream);
  switch (dtype) {
    case MOE_CUDA_DTYPE_F32:
      return Code(cudaMemcpyAsync(dst, src, n * sizeof(float),
                                  cudaMemcpyDeviceToDevice, st));
    case MOE_CUDA_DTYPE_F16:
      WidenKernel<<<blocks, kThreads, 0, st>>>(static_cast<const __half*>(src),
                                               dst, n);
      break;
    case MOE_CUDA_DTYPE_BF16:
      WidenKernel<<<blocks, kThreads, 0, st>>>(
          static_cast<const __nv_bfloat16*>(src), dst, n);
      break;
    default:
      return ModuleCode(MOE_CUDA_ERR_BAD_DTYPE);
  }
  return LaunchCode();
}

int Elementwise(int kind, const float* a, const float* b, float* out, float s,
                int64_t n, void* stream) {
  MOE_CUDA_TRY(UseDevice());
  if (kind < MOE_CUDA_EW_SILU_MUL || kind > MOE_CUDA_EW_SIGMOID) {
    return ModuleCode(MOE_CUDA_ERR_BAD_ARGUMENT);
  }
  ElementwiseKernel<<<Blocks(n, kThreads), kThreads, 0, AsStream(stream)>>>(
      kind, a, b, out, s, n);
  return LaunchCode();
}

int Argmax(const float* x, int32_t* ids, int64_t rows, int64_t n,
           void* stream) {
  // The first of a top-k is the argmax; values go to a scratch buffer.
  MOE_CUDA_TRY(UseDevice());
  float* vals = nullptr;
  cudaStream_t st = AsStream(stream);
  MOE_CUDA_TRY(Code(cudaMallocAsync(reinterpret_cast<void**>(&vals),
                                    rows * sizeof(float), st)));
  TopKKernel<<<static_cast<unsigned>(rows), 1024, 0, st>>>(x, ids, vals, n, 1);
  int code = LaunchCode();
  int free_code = Code(cudaFreeAsync(vals, st));
  return code != 0 ? code : free_code;
}

int LogSoftmax(const float* x, float* out, int64_t rows, int64_t n,
               void* stream) {
  MOE_CUDA_TRY(UseDevice());
  LogSoftmaxKernel<<<static_cast<unsigned>(rows), 1024, 0, AsStream(stream)>>>(
      x, out, n);
  return LaunchCode();
}

int TopK(const float* x, int32_t* ids, float* values, int64_t rows, int64_t n,
         int64_t k, void* stream) {
  MOE_CUDA_TRY(UseDevice());
  TopKKernel<<<static_cast<unsigned>(rows), 1024, 0, AsStream(stream)>>>(
      x, ids, values, n, k);
  return LaunchCode();
}

}  // namespace moe::cuda
