// CPU implementations of the non-matmul ops of kernels/backend.h, parallel
// over rows on a ThreadPool. Arguments are as documented there and already
// validated, except for values inside arrays, which these check where noted.
#ifndef MOECACHE_KERNELS_CPU_OPS_H_
#define MOECACHE_KERNELS_CPU_OPS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cpu_matmul.h"
#include "kernels/thread_pool.h"

namespace moe::cpu {

void RmsNorm(ThreadPool& pool, const float* x, const float* weight, float* y,
             int64_t rows, int64_t dim, float eps);
void Rope(ThreadPool& pool, float* q, float* k, const int32_t* positions,
          int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
          float theta);
void KvCacheAppend(const float* k, const float* v, float* k_cache,
                   float* v_cache, const AttentionShape& s);
void Attention(ThreadPool& pool, const VectorOps& vo, const float* q,
               const float* k_cache, const float* v_cache, float* out,
               const AttentionShape& s, float scale);
void RouterTopK(ThreadPool& pool, const float* logits, int32_t* ids,
                float* weights, int64_t tokens, int64_t experts, int64_t top_k,
                bool renormalize);
// INVALID_ARGUMENT if an id is outside [0, vocab).
absl::Status Embedding(ThreadPool& pool, const void* table, DType dtype,
                       const int32_t* ids, float* out, int64_t tokens,
                       int64_t vocab, int64_t hidden);
void ConvertToF32(const void* src, DType dtype, float* dst, int64_t n);
// out = silu(gate) * up = gate / (1 + e^-gate) * up. At kAvx512 (where
// supported) e^x is a vector exp within 1 ulp of the exact value
// (cpu_ops_avx512.cc); below it std::exp. `out` may be `gate`.
// REQUIRES: SimdLevelSupported(level).
void SiluMul(SimdLevel level, const float* gate, const float* up, float* out, int64_t n);
// SiluMul's kAvx512 path.
void SiluMulAvx512(const float* gate, const float* up, float* out, int64_t n);
// sum over i of e^(x[i] - shift), summed in double: a log-softmax's
// denominator (the sampler's logprob of every token). At kAvx512 each term
// is the vector exp above (within 1 ulp of e^(x - shift) rounded to float,
// the difference itself rounded to float first), 16 at a time into eight
// double lanes; below it std::exp in double of each float difference, in
// index order. NaN anywhere gives NaN; +inf - shift gives inf.
// REQUIRES: SimdLevelSupported(level).
double SumExp(SimdLevel level, const float* x, int64_t n, float shift);
double SumExpAvx512(const float* x, int64_t n, float shift);
// The largest of x[0, n), NaNs skipped; -inf when n == 0 or every value is
// NaN. Exact at every level (a maximum rounds nothing): at kAvx512 16 lanes
// at a time. The sampler's log-softmax shift.
// REQUIRES: SimdLevelSupported(level).
float MaxValue(SimdLevel level, const float* x, int64_t n);
float MaxValueAvx512(const float* x, int64_t n);
// VectorOps::exp_sum's AVX-512 path (kernels/cpu_matmul.h).
float ExpSumAvx512(float* x, int64_t n, float shift);
// The index of the first largest of x[0, n), as the scalar scan
// `best = 0; for j: if (x[j] > x[best]) best = j` finds it at every level:
// NaNs skipped, except that a NaN x[0] gives 0; -0 and +0 tie (the first
// wins); 0 when n == 0. Greedy sampling over a row of logits.
// REQUIRES: SimdLevelSupported(level).
int64_t ArgmaxRow(SimdLevel level, const float* x, int64_t n);
int64_t ArgmaxRowAvx512(const float* x, int64_t n);
void Add(const float* a, const float* b, float* out, int64_t n);
void Scale(float* x, float s, int64_t n);
void Sigmoid(const float* x, float* y, int64_t n);
void Argmax(const float* x, int32_t* ids, int64_t rows, int64_t n);
void LogSoftmax(ThreadPool& pool, const float* x, float* out, int64_t rows,
                int64_t n);
void TopK(ThreadPool& pool, const float* x, int32_t* ids, float* values,
          int64_t rows, int64_t n, int64_t k);

}  // namespace moe::cpu

#endif  // MOECACHE_KERNELS_CPU_OPS_H_
