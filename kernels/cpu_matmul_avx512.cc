// AVX-512F matmul kernel. Every function here carries the target
// attribute, so this file builds with the baseline flags and only runs after
// the dispatcher has checked the CPU (cpu_matmul.cc).
// GCC 12's avx512fintrin.h trips -Wuninitialized inside _mm512_cvtepu16_epi32
// (a known false positive: it starts from _mm512_undefined_epi32()).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu_matmul.h"

#define MOE_AVX512 __attribute__((target("avx512f")))

namespace moe {
namespace {

template <DType D>
MOE_AVX512 inline __m512 Load16(const void* w, int64_t i) {
  if constexpr (D == DType::kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(w) + i);
  } else {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
        static_cast<const uint16_t*>(w) + i));
    if constexpr (D == DType::kF16) {
      return _mm512_cvtph_ps(h);
    } else {  // bf16: the upper half of an f32
      return _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

// y[i0.., j0..] (+)= MR rows of x times NR rows of W over k in [k0, k1).
template <DType D, int MR, int NR>
MOE_AVX512 void Tile(const MatMulArgs& a, int64_t i0, int64_t j0, int64_t k0,
                   int64_t k1) {
  __m512 acc[MR][NR];
  #pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    #pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
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
  for (; kk + 16 <= k1; kk += 16) {
    __m512 wv[NR];
    #pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) wv[c] = Load16<D>(w[c], kk);
    #pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      __m512 xv = _mm512_loadu_ps(x[r] + kk);
      #pragma GCC unroll 8
      for (int c = 0; c < NR; ++c) {
        acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
      }
    }
  }
  #pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    #pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) {
      float s = _mm512_reduce_add_ps(acc[r][c]);
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
constexpr int kNr = 4;

template <DType D, int MR>
MOE_AVX512 void RowBlock(const MatMulArgs& a, int64_t i0, int64_t n_begin,
                       int64_t n_end, int64_t k0, int64_t k1) {
  int64_t j = n_begin;
  for (; j + kNr <= n_end; j += kNr) Tile<D, MR, kNr>(a, i0, j, k0, k1);
  switch (n_end - j) {
    case 3:
      Tile<D, MR, 3>(a, i0, j, k0, k1);
      break;
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
MOE_AVX512 void Columns(const MatMulArgs& a, int64_t n_begin, int64_t n_end) {
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

MOE_AVX512 void MatMulColumnsAvx512(const MatMulArgs& a, int64_t n_begin,
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

MOE_AVX512 float DotAvx512(const float* a, const float* b, int64_t n) {
  __m512 s0 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
  }
  float s = _mm512_reduce_add_ps(s0);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

MOE_AVX512 void AxpyAvx512(float alpha, const float* x, float* y, int64_t n) {
  const __m512 av = _mm512_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i),
                                            _mm512_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace moe
