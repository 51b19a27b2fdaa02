// KV-cache append and causal attention (prefill and decode, GQA) in f32.
// One block per (query head, token); its warps split the keys round-robin,
// each keeping an online softmax (running max, sum, weighted values), and
// the partial results are merged at the end in a fixed order, so reruns
// are bit-identical. Lanes hold head_dim / 32 elements each (head_dim <= 512).
// SinkAttention is the same kernel over the last `window` keys
// (0: all), with the head's sink logit merged into the softmax at the end.
#include "kernels/cuda/common.cuh"

namespace moe::cuda {
namespace {

constexpr int kAttnWarps = 8;

template <int kDpl>  // head elements per lane: ceil(head_dim / 32) <= kDpl
__global__ void AttentionKernel(const float* __restrict__ q,
                                const float* __restrict__ k_cache,
                                const float* __restrict__ v_cache,
                                const float* __restrict__ sinks,
                                float* __restrict__ out, int heads,
                                int kv_heads, int d, int64_t start_pos,
                                float scale, int64_t window) {
  __shared__ float s_m[kAttnWarps], s_l[kAttnWarps];
  __shared__ float s_acc[kAttnWarps][kDpl * 32];
  const int h = blockIdx.x;
  const int64_t t = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int kvh = h / (heads / kv_heads);
  const int64_t len = start_pos + t + 1;
  // transformers' sliding_window_overlay: kv > q - window.
  const int64_t first = window > 0 && len > window ? len - window : 0;
  const int64_t kv_row = static_cast<int64_t>(kv_heads) * d;
  const float* qv = q + (t * heads + h) * d;

  float qr[kDpl], acc[kDpl];
#pragma unroll
  for (int e = 0; e < kDpl; ++e) {
    int i = lane + 32 * e;
    qr[e] = i < d ? qv[i] : 0.0f;
    acc[e] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = first + warp; j < len; j += kAttnWarps) {
    const float* kr = k_cache + j * kv_row + static_cast<int64_t>(kvh) * d;
    float dot = 0.0f;
#pragma unroll
    for (int e = 0; e < kDpl; ++e) {
      int i = lane + 32 * e;
      if (i < d) dot = fmaf(qr[e], kr[i], dot);
    }
    const float s = WarpSum(dot) * scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);
    const float p = expf(s - m_new);
    l = l * corr + p;
    const float* vr = v_cache + j * kv_row + static_cast<int64_t>(kvh) * d;
#pragma unroll
    for (int e = 0; e < kDpl; ++e) {
      int i = lane + 32 * e;
      acc[e] = acc[e] * corr + (i < d ? p * vr[i] : 0.0f);
    }
    m = m_new;
  }
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
#pragma unroll
  for (int e = 0; e < kDpl; ++e) s_acc[warp][lane + 32 * e] = acc[e];
  __syncthreads();
  float mx = sinks != nullptr ? sinks[h] : -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, s_m[w]);
  float total = sinks != nullptr ? expf(sinks[h] - mx) : 0.0f;
  for (int w = 0; w < kAttnWarps; ++w) {
    total += s_m[w] == -INFINITY ? 0.0f : s_l[w] * expf(s_m[w] - mx);
  }
  float* o = out + (t * heads + h) * d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float v = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w) {
      if (s_m[w] != -INFINITY) v += s_acc[w][i] * expf(s_m[w] - mx);
    }
    o[i] = v / total;
  }
}

template <int kDpl>
int LaunchAttention(const float* q, const float* k_cache, const float* v_cache,
                    const float* sinks, float* out,
                    const MoeCudaAttentionShape& s, float scale,
                    int64_t window, cudaStream_t stream) {
  dim3 grid(static_cast<unsigned>(s.heads), static_cast<unsigned>(s.tokens));
  AttentionKernel<kDpl><<<grid, kAttnWarps * 32, 0, stream>>>(
      q, k_cache, v_cache, sinks, out, static_cast<int>(s.heads),
      static_cast<int>(s.kv_heads), static_cast<int>(s.head_dim), s.start_pos,
      scale, window);
  return LaunchCode();
}

int AttentionWithSinks(const float* q, const float* k_cache,
                       const float* v_cache, const float* sinks, float* out,
                       const MoeCudaAttentionShape* s, float scale,
                       int64_t window, void* stream) {
  MOE_CUDA_TRY(UseDevice());
  if (s->head_dim > MOE_CUDA_MAX_HEAD_DIM) {
    return ModuleCode(MOE_CUDA_ERR_HEAD_DIM);
  }
  if (s->tokens > 65535 || s->heads > INT32_MAX) {
    return ModuleCode(MOE_CUDA_ERR_BAD_ARGUMENT);
  }
  cudaStream_t st = AsStream(stream);
  const int64_t dpl = (s->head_dim + 31) / 32;
  if (dpl <= 1) return LaunchAttention<1>(q, k_cache, v_cache, sinks, out, *s, scale, window, st);
  if (dpl <= 2) return LaunchAttention<2>(q, k_cache, v_cache, sinks, out, *s, scale, window, st);
  if (dpl <= 4) return LaunchAttention<4>(q, k_cache, v_cache, sinks, out, *s, scale, window, st);
  if (dpl <= 8) return LaunchAttention<8>(q, k_cache, v_cache, sinks, out, *s, scale, window, st);
  return LaunchAttention<16>(q, k_cache, v_cache, sinks, out, *s, scale, window, st);
}

}  // namespace

int KvCacheAppend(const float* k, const float* v, float* k_cache,
                  float* v_cache, const MoeCudaAttentionShape* s,
                  void* stream) {
  MOE_CUDA_TRY(UseDevice());
  const int64_t row = s->kv_heads * s->head_dim;
  const size_t bytes = static_cast<size_t>(s->tokens * row) * sizeof(float);
  MOE_CUDA_TRY(Code(cudaMemcpyAsync(k_cache + s->start_pos * row, k, bytes,
                                    cudaMemcpyDeviceToDevice,
                                    AsStream(stream))));
  return Code(cudaMemcpyAsync(v_cache + s->start_pos * row, v, bytes,
                              cudaMemcpyDeviceToDevice, AsStream(stream)));
}

int Attention(const float* q, const float* k_cache, const float* v_cache,
              float* out, const MoeCudaAttentionShape* s, float scale,
              void* stream) {
  return AttentionWithSinks(q, k_cache, v_cache, nullptr, out, s, scale, 0,
                            stream);
}

int SinkAttention(const float* q, const float* k_cache, const float* v_cache,
                  const float* sinks, float* out,
                  const MoeCudaAttentionShape* s, float scale, int64_t window,
                  void* stream) {
  return AttentionWithSinks(q, k_cache, v_cache, sinks, out, s, scale, window,
                            stream);
}

}  // namespace moe::cuda
