// The AVX-512 VNNI q8 and q4 dot products (see cpu_quant_matmul.h): their own file
// because GCC 12's avx512fintrin.h trips -Wuninitialized inside
// _mm512_inserti64x4 / _mm512_cvtepi32_ps (their undefined pass-through
// operands), as in cpu_matmul_avx512.cc.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstring>

#include "common/quant.h"
#include "kernels/cpu_quant_matmul.h"

#define MOE_QUANT_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

namespace moe {
namespace {

inline uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// AVX-512 VNNI: two q8 blocks per step, one in each 256-bit half of a
// register; vpdpbusd sums u8 x s8 quadruples straight into int32 lanes (one
// instruction where AVX2 needs maddubs + madd), so |x| meets w carrying x's
// sign. The codes are in [-127, 127], so negating w never overflows.
MOE_QUANT_VNNI inline __m512i SignedDot2(__m512i wv, __m512i xv) {
  const __mmask64 neg = _mm512_movepi8_mask(xv);
  const __m512i sw = _mm512_mask_sub_epi8(wv, neg, _mm512_setzero_si512(), wv);
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(xv), sw);
}

// Blocks b0 and b0 + 1 of a q8 row against their activations, into acc.
MOE_QUANT_VNNI inline __m512 Q8PairVnni(const uint8_t* w, const int8_t* xq, const float* xd,
                                        int64_t b0, __m512 acc) {
  const uint8_t* p0 = w + b0 * kQ8BlockBytes;
  const uint8_t* p1 = p0 + kQ8BlockBytes;
  const __m512i wv = _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p0 + 2))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p1 + 2)), 1);
  const __m512i xv = _mm512_loadu_si512(xq + b0 * kQ8Group);
  const __m512 scale =
      _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(_cvtsh_ss(Load16(p0)) * xd[b0]),
                           _mm512_set1_ps(_cvtsh_ss(Load16(p1)) * xd[b0 + 1]));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(SignedDot2(wv, xv)), scale, acc);
}

// One q4 block (64 weights: the low nibbles are its first 32, the high
// nibbles the next 32) against its two activation groups, into acc. The
// codes are unsigned (0..15), which is what vpdpbusd's first operand wants,
// so no sign trick: lanes 0-7 sum the low half against group 2g, lanes
// 8-15 the high half against group 2g + 1 (the AVX2 kernel's quads).
MOE_QUANT_VNNI inline __m512 Q4BlockVnni(const uint8_t* blk, const int8_t* xg, float xd0,
                                         float xd1, __m512 acc) {
  const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 4));
  const __m256i low = _mm256_set1_epi8(0x0f);
  const __m256i lo = _mm256_and_si256(bytes, low);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
  const __m512i wv = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  const __m512i xv = _mm512_loadu_si512(xg);
  const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, xv);
  const float d = _cvtsh_ss(Load16(blk));
  const __m512 scale =
      _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(d * xd0), _mm512_set1_ps(d * xd1));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc);
}

}  // namespace

MOE_QUANT_VNNI float DotQ4Avx512Vnni(const uint8_t* w, const QuantizedActivations& x,
                                     int64_t i) {
  const int64_t groups = x.k / kQ4Group;
  const int8_t* xq = x.q.data() + i * x.k;
  const float* xd = x.d.data() + i * (x.k / kActGroup);
  const float* sd = x.sd.data() + i * (x.k / kActGroup);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  float macc = 0.0f;
  int64_t g = 0;
  for (; g + 2 <= groups; g += 2) {
    const uint8_t* b0 = w + g * kQ4BlockBytes;
    const uint8_t* b1 = b0 + kQ4BlockBytes;
    acc0 = Q4BlockVnni(b0, xq + g * kQ4Group, xd[2 * g], xd[2 * g + 1], acc0);
    acc1 = Q4BlockVnni(b1, xq + (g + 1) * kQ4Group, xd[2 * g + 2], xd[2 * g + 3], acc1);
    macc += _cvtsh_ss(Load16(b0 + 2)) * (sd[2 * g] + sd[2 * g + 1]);
    macc += _cvtsh_ss(Load16(b1 + 2)) * (sd[2 * g + 2] + sd[2 * g + 3]);
  }
  if (g < groups) {
    const uint8_t* b0 = w + g * kQ4BlockBytes;
    acc0 = Q4BlockVnni(b0, xq + g * kQ4Group, xd[2 * g], xd[2 * g + 1], acc0);
    macc += _cvtsh_ss(Load16(b0 + 2)) * (sd[2 * g] + sd[2 * g + 1]);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + macc;
}

MOE_QUANT_VNNI float DotQ8Avx512Vnni(const uint8_t* w, const QuantizedActivations& x,
                                     int64_t i) {
  const int64_t blocks = x.k / kQ8Group;
  const int8_t* xq = x.q.data() + i * x.k;
  const float* xd = x.d.data() + i * blocks;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 4 <= blocks; b += 4) {
    acc0 = Q8PairVnni(w, xq, xd, b, acc0);
    acc1 = Q8PairVnni(w, xq, xd, b + 2, acc1);
  }
  for (; b + 2 <= blocks; b += 2) acc0 = Q8PairVnni(w, xq, xd, b, acc0);
  float tail = 0.0f;
  if (b < blocks) {
    const uint8_t* blk = w + b * kQ8BlockBytes;
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * kQ8Group));
    const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(xv, xv),
                                          _mm256_sign_epi8(wv, xv));
    tail = static_cast<float>(_mm512_reduce_add_epi32(_mm512_zextsi256_si512(p))) *
           (_cvtsh_ss(Load16(blk)) * xd[b]);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + tail;
}

bool Q8VnniSupported() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

}  // namespace moe
