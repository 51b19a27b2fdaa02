// CPU implementations of the latent-attention and scored-router ops of
// kernels/backend.h
// (RouterSelect, RopeInterleaved, MlaAttention). Arguments are as documented
// there and already validated.
#ifndef MOECACHE_KERNELS_CPU_MLA_ROUTER_OPS_H_
#define MOECACHE_KERNELS_CPU_MLA_ROUTER_OPS_H_

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cpu_matmul.h"
#include "kernels/thread_pool.h"

namespace moe::cpu {

void RouterSelect(ThreadPool& pool, const float* logits, const float* bias,
                  int32_t* ids, float* weights, int64_t tokens, int64_t experts,
                  int64_t top_k, const RouterSpec& spec);
void RopeInterleaved(ThreadPool& pool, float* x, const int32_t* positions,
                     const float* inv_freq, int64_t tokens, int64_t heads,
                     int64_t stride, int64_t offset, int64_t rot_dim,
                     float mscale);
void MlaAttention(ThreadPool& pool, const VectorOps& vo, const float* q,
                  const void* kv_b, DType kv_b_dtype, const float* ckv_cache,
                  const float* kpe_cache, float* out, const MlaShape& s,
                  float scale);

}  // namespace moe::cpu

#endif  // MOECACHE_KERNELS_CPU_MLA_ROUTER_OPS_H_
