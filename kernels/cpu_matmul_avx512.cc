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
namespace {

// _mm512_reduce_add_ps of 16 registers at once, lane k of the result
// holding s[k]'s. The same additions as GCC's reduction of one register
// (avx512fintrin.h: the upper 8 lanes + the lower 8, then the upper 4 of
// those + the lower 4, then lanes 0 + 2 and 1 + 3, then those two), each
// rounded alike, so every lane equals Avx512::Sum of its register bit for
// bit (addition commutes exactly; it is only regrouping that would change
// a sum). 15 shuffle pairs and 15 additions where 16 reductions take 64
// and 64.
MOE_SIMD_TARGET __attribute__((always_inline)) inline __m512 Sum16(const __m512 (&s)[16]) {
  __m512 u[8];  // u[k]: lanes 0-7 s[2k]'s half sums, lanes 8-15 s[2k+1]'s
  #pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    u[k] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * k], s[2 * k + 1], 0xEE),
                         _mm512_shuffle_f32x4(s[2 * k], s[2 * k + 1], 0x44));
  }
  __m512 v[4];  // v[m]: 128-bit block b holds s[4m + b]'s quarter sums
  #pragma GCC unroll 4
  for (int m = 0; m < 4; ++m) {
    v[m] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * m], u[2 * m + 1], 0xDD),
                         _mm512_shuffle_f32x4(u[2 * m], u[2 * m + 1], 0x88));
  }
  __m512 w[2];  // per block b: s[8h + b]'s lanes 0+2 and 1+3, then s[8h + 4 + b]'s
  #pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    w[h] = _mm512_add_ps(_mm512_shuffle_ps(v[2 * h], v[2 * h + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(v[2 * h], v[2 * h + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // Block b, lane c: s[4c + b]'s sum; put it in lane 4c + b.
  const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_ps(order, sums);
}

// 16 rows of DotRowsAvx512 at a time for n = 16 K (K <= 8: head widths up
// to 128): `a` held in K registers, each row's FMAs in SimdDot's order.
template <int K>
MOE_SIMD_TARGET void DotRows16(const float* a, const float* b, int64_t stride, int64_t blocks,
                               float scale, float* out) {
  __m512 av[K];
  #pragma GCC unroll 8
  for (int c = 0; c < K; ++c) av[c] = _mm512_loadu_ps(a + 16 * c);
  const __m512 sv = _mm512_set1_ps(scale);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    __m512 acc[16];
    const float* row = b + blk * 16 * stride;
    #pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      acc[r] = _mm512_fmadd_ps(av[0], _mm512_loadu_ps(row), _mm512_setzero_ps());
      #pragma GCC unroll 8
      for (int c = 1; c < K; ++c) acc[r] = _mm512_fmadd_ps(av[c], _mm512_loadu_ps(row + 16 * c), acc[r]);
      row += stride;
    }
    _mm512_storeu_ps(out + blk * 16, _mm512_mul_ps(Sum16(acc), sv));
  }
}

}  // namespace

MOE_SIMD_TARGET void DotRowsAvx512(const float* a, const float* b, int64_t stride, int64_t rows,
                                int64_t n, float scale, float* out) {
  // Whole registers only: a tail's products are added after the reduction,
  // row by row, as SimdDot does; wider rows than 128 as SimdDotRows does.
  const int64_t blocks = rows / 16;
  if (n % 16 == 0 && n <= 128 && n > 0 && blocks > 0) {
    switch (n / 16) {
      case 1: DotRows16<1>(a, b, stride, blocks, scale, out); break;
      case 2: DotRows16<2>(a, b, stride, blocks, scale, out); break;
      case 3: DotRows16<3>(a, b, stride, blocks, scale, out); break;
      case 4: DotRows16<4>(a, b, stride, blocks, scale, out); break;
      case 5: DotRows16<5>(a, b, stride, blocks, scale, out); break;
      case 6: DotRows16<6>(a, b, stride, blocks, scale, out); break;
      case 7: DotRows16<7>(a, b, stride, blocks, scale, out); break;
      default: DotRows16<8>(a, b, stride, blocks, scale, out); break;
    }
    const int64_t j = blocks * 16;
    SimdDotRows<Avx512>(a, b + j * stride, stride, rows - j, n, scale, out + j);
    return;
  }
  SimdDotRows<Avx512>(a, b, stride, rows, n, scale, out);
}

MOE_SIMD_TARGET void AxpyRowsAvx512(const float* alpha, const float* x, int64_t stride,
                                 int64_t rows, float* y, int64_t n) {
  SimdAxpyRows<Avx512>(alpha, x, stride, rows, y, n);
}
MOE_SIMD_TARGET void DotRowsBf16Avx512(const float* a, const uint16_t* b, int64_t stride,
                                   int64_t rows, int64_t n, float scale, float* out) {
  SimdDotRows<Avx512, DType::kBF16>(a, b, stride, rows, n, scale, out);
}
MOE_SIMD_TARGET void AxpyRowsBf16Avx512(const float* alpha, const uint16_t* x, int64_t stride,
                                    int64_t rows, float* y, int64_t n) {
  SimdAxpyRows<Avx512, DType::kBF16>(alpha, x, stride, rows, y, n);
}

}  // namespace moe
