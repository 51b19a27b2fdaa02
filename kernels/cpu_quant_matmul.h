// CPU products with block-format weights (kQ8, kQ4, kMxfp4;
// common/quant.h):
// y[m, n] = x[m, k] W[n, k]^T (+ bias), reading W's blocks directly.
//
// As in llama.cpp's vec_dot_q8_0_q8_0 / q4_1_q8_1, the activations are first
// rounded to 8 bits per 32 (an f32 scale per 32, QuantizeActivations), and
// each block's dot product is an exact integer sum, scaled once:
//   kQ8: y += d_w * d_x * sum(q_w * q_x)
//   kQ4: y += d_w * d_x * sum(q_w * q_x) + m_w * d_x * sum(q_x)
//   kMxfp4: y += 2^(e_w - 128) * d_x * sum((2 fp4_w) * q_x)
// So the result is the product of the dequantized weights and the rounded
// activations (RoundActivations) up to f32 rounding of the per-block terms;
// the integer sums make the kernels ~4x cheaper per weight than converting
// codes to floats, which is what makes the formats faster at decode than
// bf16 and not just smaller.
//
// Within one SIMD level the result does not depend on the thread count
// (each output is reduced by one thread, blocks in order).
#ifndef MOECACHE_KERNELS_CPU_QUANT_MATMUL_H_
#define MOECACHE_KERNELS_CPU_QUANT_MATMUL_H_

#include <cstdint>
#include <vector>

#include "kernels/cpu_matmul.h"

namespace moe {

inline constexpr int64_t kActGroup = 32;

// Activations rounded to 8 bits per kActGroup: q[r * k + i] = round(x / d),
// d = max|x| / 127 per group; sd[g] = d[g] * sum of the group's q.
struct QuantizedActivations {
  int64_t m = 0, k = 0;
  std::vector<int8_t> q;  // [m, k]
  std::vector<float> d;   // [m, k / kActGroup]
  std::vector<float> sd;  // [m, k / kActGroup]
};
// REQUIRES: k % kActGroup == 0.
void QuantizeActivations(const float* x, int64_t m, int64_t k,
                         QuantizedActivations* out);
// x rounded as the kernels see it (d * q), for references.
std::vector<float> RoundActivations(const float* x, int64_t m, int64_t k);

// The AVX-512 VNNI q8 kernel (cpu_quant_vnni.cc): one output y[i, j] of
// the q8 row `w`. REQUIRES: Q8VnniSupported().
float DotQ8Avx512Vnni(const uint8_t* w, const QuantizedActivations& x, int64_t i);
// The same for a q4 row (its codes are unsigned: vpdpbusd takes them as they
// are). REQUIRES: Q8VnniSupported().
float DotQ4Avx512Vnni(const uint8_t* w, const QuantizedActivations& x, int64_t i);
// AVX512_VNNI, AVX512BW and AVX512VL are all present.
bool Q8VnniSupported();

// REQUIRES: IsQuantDType(a.dtype), a.k a multiple of its group,
// SimdLevelSupported(level). At the AVX-512 level q8 and q4 run VNNI
// (vpdpbusd) kernels where the CPU has AVX512_VNNI/BW/VL; without VNNI, and
// for MXFP4, the AVX2 kernels run.
void CpuQuantMatMul(ThreadPool& pool, SimdLevel level, const MatMulArgs& a);

}  // namespace moe

#endif  // MOECACHE_KERNELS_CPU_QUANT_MATMUL_H_
