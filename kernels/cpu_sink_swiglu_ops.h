// CPU implementations of the attention-with-sinks and clamped-SwiGLU ops of
// kernels/backend.h
// (SinkAttention, BiasedExpertFfn's activation). Arguments are as documented
// there and already validated.
#ifndef MOECACHE_KERNELS_CPU_SINK_SWIGLU_OPS_H_
#define MOECACHE_KERNELS_CPU_SINK_SWIGLU_OPS_H_

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cpu_matmul.h"
#include "kernels/thread_pool.h"

namespace moe::cpu {

void SinkAttention(ThreadPool& pool, const VectorOps& vo, const float* q,
                   const float* k_cache, const float* v_cache,
                   const float* sinks, float* out, const AttentionShape& s,
                   float scale, int64_t window);

// g = act(g + gate_bias, u + up_bias) in place, for `rows` rows of `inter`.
void ClampedSwigluRows(float* g, const float* u, int64_t rows, int64_t inter,
                       const ClampedSwiglu& act);

}  // namespace moe::cpu

#endif  // MOECACHE_KERNELS_CPU_SINK_SWIGLU_OPS_H_
