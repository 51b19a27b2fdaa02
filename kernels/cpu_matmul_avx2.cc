// AVX2 + FMA + F16C matmul kernel. Every function here carries the target
// attribute, so this file builds with the baseline flags and only runs after
// the dispatcher has checked the CPU (cpu_matmul.cc).
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu_matmul.h"

#define MOE_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace moe {
namespace {

template <DType D>
MOE_AVX2 inline __m256 Load8(const void* w, int64_t i) {
  if constexpr (D == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(w) + i);
  } else {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(
        static_cast<const uint16_t*>(w) + i));
    if constexpr (D == DType::kF16) {
      return _mm256_cvtph_ps(h);
    } else {  // bf16: the upper half of an f32
      return _mm256_castsi256_ps(
          _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

MOE_AVX2 inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// y[i0.., j0..] (+)= MR rows of x times NR rows of W over k in [k0, k1).
template <DType D, int MR, int NR>
MOE_AVX2 void Tile(const MatMulArgs& a, int64_t i0, int64_t j0, int64_t k0,
                   int64_t k1) {
  __m256 acc[MR][NR];
  #pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    #pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  const float* x[MR];
  #pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) x[r] = a.x + (i0 + r) * a.k;
  const char* w[NR];
  #pragma GCC unroll 8
  for (int c = 0; c < NR; ++c) {
    w[c] = static_cast<const char*>(a.w) +
           (j0 + c) * a.k * static_cast<int64_t>(DTypeSize(D));
  }
  int64_t kk = k0;
  for (; kk + 8 <= k1; kk += 8) {
    __m256 wv[NR];
    #pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) wv[c] = Load8<D>(w[c], kk);
    #pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      __m256 xv = _mm256_loadu_ps(x[r] + kk);
      #pragma GCC unroll 8
      for (int c = 0; c < NR; ++c) {
        acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
      }
    }
  }
  #pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    #pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) {
      float s = HorizontalSum(acc[r][c]);
      for (int64_t t = kk; t < k1; ++t) {
        s += x[r][t] * LoadAsF32(a.w, D, static_cast<size_t>((j0 + c) * a.k + t));
      }
      float* y = a.y + (i0 + r) * a.n + j0 + c;
      if (k0 == 0) {
        *y = s + (a.bias ? a.bias[j0 + c] : 0.0f);
      } else {
        *y += s;
      }
    }
  }
}

constexpr int kMr = 4;
constexpr int kNr = 3;

template <DType D, int MR>
MOE_AVX2 void RowBlock(const MatMulArgs& a, int64_t i0, int64_t n_begin,
                       int64_t n_end, int64_t k0, int64_t k1) {
  int64_t j = n_begin;
  for (; j + kNr <= n_end; j += kNr) Tile<D, MR, kNr>(a, i0, j, k0, k1);
  switch (n_end - j) {
    case 2:
      Tile<D, MR, 2>(a, i0, j, k0, k1);
      break;
    case 1:
      Tile<D, MR, 1>(a, i0, j, k0, k1);
      break;
    default:
      break;
  }
}

template <DType D>
MOE_AVX2 void Columns(const MatMulArgs& a, int64_t n_begin, int64_t n_end) {
  int64_t k_end = std::max<int64_t>(a.k, 1);  // k == 0 still writes bias
  for (int64_t k0 = 0; k0 < k_end; k0 += kMatMulKBlock) {
    int64_t k1 = std::min(a.k, k0 + kMatMulKBlock);
    int64_t i = 0;
    for (; i + kMr <= a.m; i += kMr) {
      RowBlock<D, kMr>(a, i, n_begin, n_end, k0, k1);
    }
    switch (a.m - i) {
      case 3:
        RowBlock<D, 3>(a, i, n_begin, n_end, k0, k1);
        break;
      case 2:
        RowBlock<D, 2>(a, i, n_begin, n_end, k0, k1);
        break;
      case 1:
        RowBlock<D, 1>(a, i, n_begin, n_end, k0, k1);
        break;
      default:
        break;
    }
  }
}

}  // namespace

MOE_AVX2 void MatMulColumnsAvx2(const MatMulArgs& a, int64_t n_begin,
                                int64_t n_end) {
  switch (a.dtype) {
    case DType::kF32:
      return Columns<DType::kF32>(a, n_begin, n_end);
    case DType::kF16:
      return Columns<DType::kF16>(a, n_begin, n_end);
    case DType::kBF16:
      return Columns<DType::kBF16>(a, n_begin, n_end);
    default:
      return;  // not a weight dtype; Backend::MatMul rejects it
  }
}

MOE_AVX2 float DotAvx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8),
                         s1);
  }
  for (; i + 8 <= n; i += 8) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  }
  float s = HorizontalSum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

MOE_AVX2 void AxpyAvx2(float alpha, const float* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i),
                                            _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace moe
