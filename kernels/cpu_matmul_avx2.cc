// The AVX2 + FMA + F16C instantiation of the SIMD kernels
// (cpu_matmul_simd.inc): 8 floats per register, 4 x 3 register tiles.
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu_matmul.h"

#define MOE_SIMD_TARGET __attribute__((target("avx2,fma,f16c")))

namespace moe {
namespace {

struct Avx2 {
  using Reg = __m256;
  static constexpr int kWidth = 8;
  static constexpr int kNr = 3;
  static constexpr int kDotUnroll = 2;

  MOE_SIMD_TARGET static Reg Zero() { return _mm256_setzero_ps(); }
  MOE_SIMD_TARGET static Reg Load(const float* p) { return _mm256_loadu_ps(p); }
  MOE_SIMD_TARGET static void Store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  MOE_SIMD_TARGET static Reg Set1(float v) { return _mm256_set1_ps(v); }
  MOE_SIMD_TARGET static Reg Fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  MOE_SIMD_TARGET static Reg Add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  MOE_SIMD_TARGET static float Sum(Reg v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  template <DType D>
  MOE_SIMD_TARGET static Reg LoadW(const void* w, int64_t i) {
    if constexpr (D == DType::kF32) {
      return _mm256_loadu_ps(static_cast<const float*>(w) + i);
    } else {
      __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(
          static_cast<const uint16_t*>(w) + i));
      if constexpr (D == DType::kF16) {
        return _mm256_cvtph_ps(h);
      } else {  // bf16: the upper half of an f32
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      }
    }
  }
};

}  // namespace
}  // namespace moe

#include "kernels/cpu_matmul_simd.inc"

namespace moe {

MOE_SIMD_TARGET void MatMulColumnsAvx2(const MatMulArgs& a, int64_t n_begin, int64_t n_end) {
  SimdMatMulColumns<Avx2>(a, n_begin, n_end);
}
MOE_SIMD_TARGET float DotAvx2(const float* a, const float* b, int64_t n) {
  return SimdDot<Avx2>(a, b, n);
}
MOE_SIMD_TARGET void AxpyAvx2(float alpha, const float* x, float* y, int64_t n) {
  SimdAxpy<Avx2>(alpha, x, y, n);
}
MOE_SIMD_TARGET void DotRowsAvx2(const float* a, const float* b, int64_t stride, int64_t rows,
                                int64_t n, float scale, float* out) {
  SimdDotRows<Avx2>(a, b, stride, rows, n, scale, out);
}
MOE_SIMD_TARGET void AxpyRowsAvx2(const float* alpha, const float* x, int64_t stride,
                                 int64_t rows, float* y, int64_t n) {
  SimdAxpyRows<Avx2>(alpha, x, stride, rows, y, n);
}
MOE_SIMD_TARGET void DotRowsBf16Avx2(const float* a, const uint16_t* b, int64_t stride,
                                   int64_t rows, int64_t n, float scale, float* out) {
  SimdDotRows<Avx2, DType::kBF16>(a, b, stride, rows, n, scale, out);
}
MOE_SIMD_TARGET void AxpyRowsBf16Avx2(const float* alpha, const uint16_t* x, int64_t stride,
                                    int64_t rows, float* y, int64_t n) {
  SimdAxpyRows<Avx2, DType::kBF16>(alpha, x, stride, rows, y, n);
}

}  // namespace moe
