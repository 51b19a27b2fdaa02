// The AVX-512F elementwise ops of cpu_ops.h: silu(gate) * up, a sum of
// exponentials with a vector exp (and attention's softmax numerators), and
// a row's maximum and its first index, 16 lanes at a time.
// GCC 12's avx512fintrin.h trips -Wmaybe-uninitialized inside its
// intrinsics' undefined pass-through operands (as in cpu_matmul_avx512.cc).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu_ops.h"

#define MOE_SIMD_TARGET __attribute__((target("avx512f")))

namespace moe::cpu {
namespace {

// e^x, within 1 ulp of the exact value wherever the result is a normal
// float (0.93 ulp at worst over [-87, 88] in 2^24 steps); 0 and inf beyond
// the range as std::exp; NaN stays NaN. x = n ln2 + r with n rounded to
// nearest, |r| <= ln2 / 2, ln2 split in two so that r is exact; e^r by
// its Taylor series to r^7 (the first term left out, r^8 / 8!, is
// 5e-9 relative); then r's value times 2^n (vscalefps: gradual underflow,
// overflow to inf).
MOE_SIMD_TARGET inline __m512 Exp(__m512 x) {
  // NaN passes both (max/min return their second operand when one is NaN).
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln2's top 16 bits
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);  // the rest
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// gate / (1 + e^-gate) * up, lane by lane.
MOE_SIMD_TARGET inline __m512 SiluTimes(__m512 g, __m512 u) {
  const __m512 e = Exp(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

}  // namespace

MOE_SIMD_TARGET void SiluMulAvx512(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i, SiluTimes(_mm512_loadu_ps(gate + i), _mm512_loadu_ps(up + i)));
  }
  if (i < n) {  // the tail through masked lanes: the same arithmetic as the rest
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(out + i, m,
                          SiluTimes(_mm512_maskz_loadu_ps(m, gate + i),
                                    _mm512_maskz_loadu_ps(m, up + i)));
  }
}

MOE_SIMD_TARGET double SumExpAvx512(const float* x, int64_t n, float shift) {
  const __m512 c = _mm512_set1_ps(shift);
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  auto add = [&](__m512 e) MOE_SIMD_TARGET {
    lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(
                               _mm512_castps_pd(e), 1))));
  };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) add(Exp(_mm512_sub_ps(_mm512_loadu_ps(x + i), c)));
  if (i < n) {  // masked-off lanes add e^-inf = 0
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, x + i);
    add(Exp(_mm512_sub_ps(v, c)));
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
}

MOE_SIMD_TARGET float ExpSumAvx512(float* x, int64_t n, float shift) {
  const __m512 c = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = Exp(_mm512_sub_ps(_mm512_loadu_ps(x + i), c));
    _mm512_storeu_ps(x + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (i < n) {  // masked-off lanes add e^-inf = 0 and are not stored
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 e = Exp(_mm512_sub_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, x + i), c));
    _mm512_mask_storeu_ps(x + i, m, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

MOE_SIMD_TARGET float MaxValueAvx512(const float* x, int64_t n) {
  // vmaxps returns its second operand when either is NaN: with the running
  // maximum second, a NaN of x leaves it as it was.
  __m512 max = _mm512_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) max = _mm512_max_ps(_mm512_loadu_ps(x + i), max);
  if (i < n) {  // masked-off lanes read -inf
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    max = _mm512_max_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, x + i), max);
  }
  return _mm512_reduce_max_ps(max);
}

MOE_SIMD_TARGET int64_t ArgmaxRowAvx512(const float* x, int64_t n) {
  if (n <= 0 || std::isnan(x[0])) return 0;  // the scalar scan never leaves a NaN x[0]
  // x[0] is a number, so the maximum is one too: the first lane equal to
  // it (-0 == +0) is the scan's answer.
  const __m512 max = _mm512_set1_ps(MaxValueAvx512(x, n));
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), max, _CMP_EQ_OQ);
    if (eq != 0) return i + __builtin_ctz(eq);
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __mmask16 eq = _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, x + i), max,
                                                 _CMP_EQ_OQ);
    if (eq != 0) return i + __builtin_ctz(eq);
  }
  return 0;  // not reached: the maximum is one of the values
}

}  // namespace moe::cpu
