// CPU dot products that read ggml's weight blocks as GGUF files store them
// (DType kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ4K, kQ5K, kQ6K; layouts in
// common/gguf_blocks.h), for CpuQuantMatMul (kernels/cpu_quant_matmul.h).
//
// The 32-weight types (Q4_0 .. Q5_1) meet activations quantized per 32
// (QuantizedActivations: int8 codes, an f32 scale d_x and d_x * sum(codes)
// per group), as ggml's Q8_0 / Q8_1 do:
//   Q4_0 / Q5_0: y += (d * d_x) * sum((q - 8 or 16) * q_x)
//     (AVX-512 VNNI: (d * d_x) * sum(q * q_x) - (8 or 16) d * (d_x * sum(q_x)))
//   Q4_1 / Q5_1: y += (d * d_x) * sum(q * q_x) + m * (d_x * sum(q_x))
//
// The K-quants (256-weight blocks) meet activations quantized per 256
// (KActivations, ggml's Q8_K: one f32 scale per 256 and the sum of every 16
// codes), so a whole block's dot product is one exact integer:
//   Q4_K / Q5_K (8 sub-blocks of 32, 6-bit scale s_j and min m_j):
//     y += (d * d_x) * sum_j s_j sum(q * q_x)
//        - (dmin * d_x) * sum_j m_j (sum of the sub-block's q_x)
//   Q6_K (16 sub-blocks of 16, int8 scales s_j, codes q in 0..63):
//     y += (d * d_x) * sum_j s_j sum((q - 32) * q_x)
// The integers stay below 2^31 (|sum| <= 256 * 63 * 63 * 127 for Q5_K and
// 256 * 32 * 128 * 127 for Q6_K), and the SIMD kernels form them from
// 16-bit pair sums (|pair| <= 2 * 63 * 127 < 2^15). The codes and scales
// equal ggml's Q8_K (which stores both negated), so both engines multiply
// the same rounded activations.
//
//   kQ4KR16 (Q4_K, 16 rows interleaved: common/row_interleave.h), per
//   block the exact integers S = sum_j s_j sum(q * q_x) and M = sum_j m_j
//   (bit-sum j), then acc = fma(S, d * d_x, acc), acc = fma(-M, dmin * d_x,
//   acc), y = acc + bias: one float order that every level follows, so its
//   results are the same bits at every SIMD level (AVX-512 VNNI: one lane
//   per row of the group; other levels: the scalar loop).
//
// So the result equals the dequantized weights times the rounded
// activations (RoundActivations / RoundKActivations) up to f32 rounding of
// the per-block terms and of their sum; K-quant blocks need k % 256 == 0.
//
// Each output is reduced by one thread in a fixed order: within one SIMD
// level the result does not depend on the thread count, nor on how many
// weight and activation rows one call computes (GgufKRowsFn,
// GgufSmallRowsFn). The levels differ only in the f32 rounding of that sum.
//
// Thread-safe: pure functions.
#ifndef MOECACHE_KERNELS_CPU_GGUF_QUANT_H_
#define MOECACHE_KERNELS_CPU_GGUF_QUANT_H_

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/dtype.h"
#include "kernels/cpu_matmul.h"
#include "kernels/cpu_quant_matmul.h"

namespace moe {

// The K-quants: 256-weight blocks that meet KActivations.
inline bool IsGgufKDType(DType dtype) {
  return dtype == DType::kQ4K || dtype == DType::kQ5K || dtype == DType::kQ6K ||
         dtype == DType::kQ4KR16;
}

// One output y[i, j] of a 32-weight type: weight row `w` (x.k / 32 blocks)
// against activation row i of x.
using GgufDotFn = float (*)(const uint8_t* w, const QuantizedActivations& x,
                            int64_t i);

// As GgufKRowsFn for the 32-weight types, on activations per 32 (the
// AVX-512 VNNI kernels; other levels use GgufDotFn).
using GgufSmallRowsFn = void (*)(const uint8_t* w, int64_t w_stride, int64_t n_rows,
                                 const QuantizedActivations& x, int64_t i0, int rows,
                                 const float* bias, float* y, int64_t y_stride);

// The kernel for `dtype` at `level`: kScalar -> the scalar loops, kAvx2 ->
// AVX2, kAvx512 -> AVX-512 VNNI where the CPU has AVX512_VNNI/BW/VL
// (Q8VnniSupported), else AVX2. GgufDotFor REQUIRES a 32-weight type
// (IsGgufBlockDType, not IsGgufKDType), GgufKRowsFor a K-quant;
// SimdLevelSupported(level). For kQ4KR16, w is a row group's start and
// n_rows a multiple of 16 (whole groups; w_stride one row's share).
GgufDotFn GgufDotFor(DType dtype, SimdLevel level);
GgufKRowsFn GgufKRowsFor(DType dtype, SimdLevel level);

// Per level, for the dispatch and the tests. nullptr for a dtype the level
// has no kernel of its own for (the dispatch then falls back a level).
GgufDotFn GgufDotScalar(DType dtype);
GgufDotFn GgufDotAvx2(DType dtype);
// The AVX-512 VNNI rows kernels of the 32-weight types (nullptr for other
// dtypes). REQUIRES to run: Q8VnniSupported().
GgufSmallRowsFn GgufSmallRowsAvx512Vnni(DType dtype);
GgufKRowsFn GgufKRowsScalar(DType dtype);
GgufKRowsFn GgufKRowsAvx2(DType dtype);
GgufKRowsFn GgufKRowsAvx512Vnni(DType dtype);

// The rows kernels of the small-block interleaved layouts
// (common/row_interleave.h) at `level`, on activations per 32 rounded as
// for their row-major dtypes (ActRounding::kF32):
//  * kQ4R16 (our q4). Per row and 64-weight block b, with SA and SB the
//    exact integer sums of its two halves:
//      acc = fma(SA, d dx[2b], acc), acc = fma(SB, d dx[2b+1], acc),
//      acc = fma(m, sd[2b], acc), acc = fma(m, sd[2b+1], acc);
//  * kQ8R16 (our q8, GGUF's Q8_0). Per row and 32-weight block b, with S
//    its exact integer sum: acc = fma(S, d dx[b], acc);
//  * kQ4_0R16 (ggml's Q4_0; activations with ggml's Q8_0 scales,
//    ActRounding::kGgmlQ8_0): likewise, S = sum of (q - 8) x;
// and y = acc + bias: the same bits at every level (AVX-512 VNNI: a lane per
// row of the group; else the scalar loop). w is a row group's start and
// n_rows a multiple of 16. nullptr for other dtypes.
GgufSmallRowsFn SmallRows16For(DType dtype, SimdLevel level);
// REQUIRES to run: Q8VnniSupported().
GgufSmallRowsFn SmallRows16Avx512Vnni(DType dtype);
// kQ8R16 and kQ4_0R16 on AMX-INT8 tiles (kernels/cpu_amx_int8.cc), for up
// to kAmxMaxRows activation rows a call (`rows` in [1, 16]): per weight
// group and block one TDPBSSD gives every row's exact S (the activation
// codes read in place as A, the group's codes as B: kQ8R16's as stored,
// kQ4_0R16's unpacked to q - 8), then each row takes SmallRows16For's float
// steps in its order: the same bits as every other level, for any `rows`.
// REQUIRES to run: AmxSupported() (cpu_matmul.h). nullptr for other dtypes.
inline constexpr int kAmxMaxRows = 16;
GgufSmallRowsFn SmallRows16Amx(DType dtype);

// Whether Q4_K, q4, q8 and Q4_0 matrices are best held interleaved
// (kQ4KR16, kQ4R16, kQ8R16, kQ4_0R16) on this CPU at `level`: AVX-512 VNNI (the Q4_K kernel
// reads ~1.8x the bytes per second of the row-major one from memory, ~3x
// in cache, on a zen4 core; Q8x16 ~3.5x row-major q8's in cache), unless $MOE_ROWS16=0 (a diagnostic: keep the row-major
// layouts).
bool CpuPrefersRows16(SimdLevel level);

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

// The same eight scales (bytes 0-7) and eight mins (bytes 8-15) in one
// register, from a 16-byte load of the packed bytes (4 past the 12 read:
// q must have 16 readable bytes, as a block's scales do) and byte shuffles:
// no scalar unpacking and no moves from general registers.
__attribute__((target("avx2"))) inline __m128i UnpackKScalesSimd(const uint8_t* q) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  // Low parts: scales 0-3 = q0-3 & 63, 4-7 = q8-11 & 15; mins 0-3 =
  // q4-7 & 63, 4-7 = q8-11 >> 4.
  const __m128i a = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7,
                                                      8, 9, 10, 11));
  const __m128i low = _mm_or_si128(
      _mm_and_si128(a, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0,
                                     0, 0)),
      _mm_and_si128(_mm_srli_epi16(a, 4),
                    _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15)));
  // High parts of sub-blocks 4-7: the top two bits of q0-3 (scales) and
  // q4-7 (mins), to bits 4-5.
  const __m128i b = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1,
                                                      -1, 4, 5, 6, 7));
  return _mm_or_si128(low, _mm_and_si128(_mm_srli_epi16(b, 2), _mm_set1_epi8(0x30)));
}

// Calls f(std::integral_constant<int, rows>{}) for rows 1 to kKMaxRows (4
// for anything larger): the rows kernels' row count as a template argument,
// so each row's sums live in registers.
template <typename F>
inline void ForRowCount(int rows, const F& f) {
  switch (rows) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    default:
      return f(std::integral_constant<int, 4>{});
  }
}

// The run of a rows kernel (GgufKRowsFn, GgufSmallRowsFn): row(w + c *
// w_stride, bias[c] or 0, y + c) for each weight row c < n_rows.
template <typename Row>
inline void ForEachWeightRow(const uint8_t* w, int64_t w_stride, int64_t n_rows,
                             const float* bias, float* y, const Row& row) {
  for (int64_t c = 0; c < n_rows; ++c) {
    row(w + c * w_stride, bias != nullptr ? bias[c] : 0.0f, y + c);
  }
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
