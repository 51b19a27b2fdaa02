// The AVX-512F instantiation of the SIMD kernels (cpu_matmul_simd.inc):
// 16 floats per register, 4 x 4 register tiles.
// GCC 12's avx512fintrin.h trips -Wuninitialized inside _mm512_cvtepu16_epi32
// (a known false positive: it starts from _mm512_undefined_epi32()).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu_matmul.h"

#define MOE_SIMD_TARGET __attribute__((target("avx512f")))

namespace moe {
namespace {

struct Avx512 {
  using Reg = __m512;
  static constexpr int kWidth = 16;
  static constexpr int kNr = 4;
  static constexpr int kDotUnroll = 1;

  MOE_SIMD_TARGET static Reg Zero() { return _mm512_setzero_ps(); }
  MOE_SIMD_TARGET static Reg Load(const float* p) { return _mm512_loadu_ps(p); }
  MOE_SIMD_TARGET static void Store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  MOE_SIMD_TARGET static Reg Set1(float v) { return _mm512_set1_ps(v); }
  MOE_SIMD_TARGET static Reg Fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  MOE_SIMD_TARGET static Reg Add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  MOE_SIMD_TARGET static float Sum(Reg v) { return _mm512_reduce_add_ps(v); }
  template <DType D>
  MOE_SIMD_TARGET static Reg LoadW(const void* w, int64_t i) {
    if constexpr (D == DType::kF32) {
      return _mm512_loadu_ps(static_cast<const float*>(w) + i);
    } else {
      __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
          static_cast<const uint16_t*>(w) + i));
      if constexpr (D == DType::kF16) {
        return _mm512_cvtph_ps(h);
      } else {  // bf16: the upper half of an f32
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      }
    }
  }
};

}  // namespace
}  // namespace moe

#include "kernels/cpu_matmul_simd.inc"

namespace moe {

MOE_SIMD_TARGET void MatMulColumnsAvx512(const MatMulArgs& a, int64_t n_begin, int64_t n_end) {
  SimdMatMulColumns<Avx512>(a, n_begin, n_end);
}
MOE_SIMD_TARGET float DotAvx512(const float* a, const float* b, int64_t n) {
  return SimdDot<Avx512>(a, b, n);
}
MOE_SIMD_TARGET void AxpyAvx512(float alpha, const float* x, float* y, int64_t n) {
  SimdAxpy<Avx512>(alpha, x, y, n);
}
MOE_SIMD_TARGET void DotRowsAvx512(const float* a, const float* b, int64_t stride, int64_t rows,
                                int64_t n, float scale, float* out) {
  SimdDotRows<Avx512>(a, b, stride, rows, n, scale, out);
}
MOE_SIMD_TARGET void AxpyRowsAvx512(const float* alpha, const float* x, int64_t stride,
                                 int64_t rows, float* y, int64_t n) {
  SimdAxpyRows<Avx512>(alpha, x, stride, rows, y, n);
}

}  // namespace moe
