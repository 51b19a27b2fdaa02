// CPU dot products that read ggml's weight blocks as GGUF files store them
// (DType kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ4K, kQ5K, kQ6K; layouts in
// common/gguf_blocks.h), for CpuQuantMatMul (kernels/cpu_quant_matmul.h).
//
// The activations come quantized per 32 (QuantizedActivations: int8 codes,
// an f32 scale d_x and d_x * sum(codes) per group). Every group of 32
// weights meets one activation group, and its dot product is an exact
// integer sum, scaled once:
//   Q4_0 / Q5_0: y += (d * d_x) * sum((q - 8 or 16) * q_x)
//   Q4_1 / Q5_1: y += (d * d_x) * sum(q * q_x) + m * (d_x * sum(q_x))
//   Q4_K / Q5_K (8 sub-blocks of 32, scale s_j and min m_j):
//     y += (d * s_j * d_x) * sum(q * q_x) - (dmin * m_j) * (d_x * sum(q_x))
//   Q6_K (16 sub-blocks of 16, int8 scales): per activation group, the two
//     sub-blocks' integer sums times their scales (still an exact integer),
//     times d * d_x.
// So the result equals the dequantized weights times the rounded
// activations (RoundActivations) up to f32 rounding of the per-group terms
// and of their sum; K-quant blocks (256 weights) need k % 256 == 0.
//
// Each output is reduced by one thread in a fixed order: within one SIMD
// level the result does not depend on the thread count. The levels differ
// only in the f32 rounding of that sum.
//
// Thread-safe: pure functions.
#ifndef MOECACHE_KERNELS_CPU_GGUF_QUANT_H_
#define MOECACHE_KERNELS_CPU_GGUF_QUANT_H_

#include <cstdint>
#include <cstring>

#include "common/dtype.h"
#include "kernels/cpu_matmul.h"
#include "kernels/cpu_quant_matmul.h"

namespace moe {

// One output y[i, j]: weight row `w` (x.k / QuantGroupSize blocks) against
// activation row i of x.
using GgufDotFn = float (*)(const uint8_t* w, const QuantizedActivations& x,
                            int64_t i);

// The kernel for `dtype` at `level`: kScalar -> the scalar loops, kAvx2 ->
// AVX2, kAvx512 -> AVX-512 VNNI where the CPU has AVX512_VNNI/BW/VL
// (Q8VnniSupported), else AVX2. REQUIRES: IsGgufBlockDType(dtype),
// SimdLevelSupported(level).
GgufDotFn GgufDotFor(DType dtype, SimdLevel level);

// Per level, for GgufDotFor and the tests. nullptr for a dtype the level
// has no kernel of its own for (GgufDotFor then falls back a level).
GgufDotFn GgufDotScalar(DType dtype);
GgufDotFn GgufDotAvx2(DType dtype);
GgufDotFn GgufDotAvx512Vnni(DType dtype);

namespace gguf_quant_internal {

// The 6-bit scales and mins of a Q4_K / Q5_K block's 8 sub-blocks from its
// 12 packed bytes (sub-blocks 0-3 in the low 6 bits of bytes 0-3 and 4-7;
// 4-7 from a nibble of bytes 8-11 and the top 2 bits of bytes 0-7).
inline void UnpackKScales(const uint8_t* q, int scale[8], int min[8]) {
  for (int j = 0; j < 4; ++j) {
    scale[j] = q[j] & 63;
    min[j] = q[j + 4] & 63;
    scale[j + 4] = (q[j + 8] & 0x0F) | ((q[j] >> 6) << 4);
    min[j + 4] = (q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4);
  }
}

// The same eight scales and eight mins as bytes of two words (byte j of
// *scales is scale j), from 32-bit word arithmetic on the packed bytes: no
// per-byte loop, so SIMD kernels can widen them in registers.
inline void UnpackKScalesPacked(const uint8_t* q, uint64_t* scales,
                                uint64_t* mins) {
  uint32_t w[3];
  std::memcpy(w, q, 12);
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  const uint32_t s_hi = (w[2] & kLow4) | (((w[0] >> 6) & kLow2) << 4);
  const uint32_t m_hi = ((w[2] >> 4) & kLow4) | (((w[1] >> 6) & kLow2) << 4);
  *scales = (w[0] & kLow6) | (static_cast<uint64_t>(s_hi) << 32);
  *mins = (w[1] & kLow6) | (static_cast<uint64_t>(m_hi) << 32);
}

inline uint16_t Load16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

inline uint32_t Load32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

}  // namespace gguf_quant_internal
}  // namespace moe

#endif  // MOECACHE_KERNELS_CPU_GGUF_QUANT_H_
