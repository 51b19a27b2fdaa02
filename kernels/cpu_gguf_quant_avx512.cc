// The AVX-512 VNNI ggml-block dot products (cpu_gguf_quant.h) for the
// K-quants, which dominate GGUF MoE files: one vpdpbusd covers 64 weights
// (two K sub-blocks of 32, or two Q6_K activation groups), where AVX2
// needs two maddubs + madd pairs. The small 32-weight types keep their
// AVX2 kernels (GgufDotFor falls back). Its own file, as
// cpu_quant_vnni.cc, because GCC 12's avx512fintrin.h trips
// -Wuninitialized inside _mm512_inserti64x4 / _mm512_cvtepi32_ps.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include "kernels/cpu_gguf_quant.h"

#define MOE_GGUF_VNNI                                         \
  __attribute__((                                             \
      target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma," \
             "f16c")))

namespace moe {
namespace {

using gguf_quant_internal::Load16;
using gguf_quant_internal::UnpackKScalesPacked;

MOE_GGUF_VNNI inline float F16(const uint8_t* p) {
  return _cvtsh_ss(Load16(p));
}

MOE_GGUF_VNNI inline __m512i Join(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// Two scales: lanes 0-7 get a, lanes 8-15 get b.
MOE_GGUF_VNNI inline __m512 Scale2(float a, float b) {
  return _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(a), _mm512_set1_ps(b));
}

// Q4_K / Q5_K: per 64 weights c, the low nibbles (sub-block 2c) in the
// lower 256 bits and the high nibbles (2c + 1) in the upper, against the 64
// activations in order; the codes are unsigned, vpdpbusd's first operand.
// A block's eight factors d * s_j * d_x[j] and dmin * m_j * sd[j] are
// computed as vectors (no serial scalar chain per sub-block).
template <bool kFive>
MOE_GGUF_VNNI float DotK45Vnni(const uint8_t* w, const QuantizedActivations& x,
                               int64_t i) {
  constexpr int kBytes = kFive ? 176 : 144;
  const int64_t blocks = x.k / 256;
  const int8_t* xq = x.q.data() + i * x.k;
  const float* xd = x.d.data() + i * (x.k / 32);
  const float* sd = x.sd.data() + i * (x.k / 32);
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m512i five = _mm512_set1_epi8(0x10);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  __m256 mins = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = w + b * kBytes;
    uint64_t sc, mn;
    UnpackKScalesPacked(blk + 4, &sc, &mn);
    alignas(32) float scale[8];
    _mm256_store_ps(
        scale,
        _mm256_mul_ps(
            _mm256_mul_ps(_mm256_set1_ps(F16(blk)),
                          _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                              _mm_cvtsi64_si128(static_cast<int64_t>(sc))))),
            _mm256_loadu_ps(xd + b * 8)));
    mins = _mm256_fmadd_ps(
        _mm256_mul_ps(_mm256_set1_ps(F16(blk + 2)),
                      _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                          _mm_cvtsi64_si128(static_cast<int64_t>(mn))))),
        _mm256_loadu_ps(sd + b * 8), mins);
    const uint8_t* qs = blk + (kFive ? 48 : 16);
    __m512i qh2 = _mm512_setzero_si512();
    if (kFive) {
      const __m256i qh =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
      qh2 = Join(qh, qh);
    }
    const int8_t* xb = xq + b * 256;
    for (int c = 0; c < 4; ++c) {
      const __m256i bytes =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      __m512i codes = Join(_mm256_and_si256(bytes, low),
                           _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low));
      if (kFive) {
        // Bit 2c of qh for the lower half, bit 2c + 1 for the upper.
        const __m512i bit = _mm512_mask_blend_epi64(
            0xf0, _mm512_set1_epi8(static_cast<char>(1 << (2 * c))),
            _mm512_set1_epi8(static_cast<char>(1 << (2 * c + 1))));
        const __mmask64 set = _mm512_test_epi8_mask(qh2, bit);
        codes = _mm512_or_si512(codes, _mm512_maskz_mov_epi8(set, five));
      }
      const __m512i xv = _mm512_loadu_si512(xb + 64 * c);
      const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, xv);
      const __m512 f = Scale2(scale[2 * c], scale[2 * c + 1]);
      if (c % 2 == 0) {
        acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), f, acc0);
      } else {
        acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), f, acc1);
      }
    }
  }
  const __m128 m2 =
      _mm_add_ps(_mm256_castps256_ps128(mins), _mm256_extractf128_ps(mins, 1));
  const __m128 m1 = _mm_add_ps(m2, _mm_movehl_ps(m2, m2));
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) -
         _mm_cvtss_f32(_mm_add_ss(m1, _mm_movehdup_ps(m1)));
}

// Q6_K: per half, activation groups k and k + 1 side by side (k = 0, 2),
// codes biased to unsigned (q in 0..63) for vpdpbusd, and the bias taken
// back per sub-block of 16 as 32 * sum(q_x) (vpdpbusd of 32s against x).
// Lanes 0-3, 4-7, 8-11, 12-15 are the four sub-blocks of 16.
MOE_GGUF_VNNI float DotQ6KVnni(const uint8_t* w, const QuantizedActivations& x,
                               int64_t i) {
  const int64_t blocks = x.k / 256;
  const int8_t* xq = x.q.data() + i * x.k;
  const float* xd = x.d.data() + i * (x.k / 32);
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i three = _mm256_set1_epi8(0x03);
  const __m512i bias = _mm512_set1_epi8(32);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = w + b * 210;
    const float d = F16(blk + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(blk + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
      // Groups 0 | 1 (low nibbles of ql0 | ql1, qh bits 0-1 | 2-3), then
      // 2 | 3 (high nibbles, qh bits 4-5 | 6-7).
      for (int pair = 0; pair < 2; ++pair) {
        const int shift = 4 * pair;
        const __m256i n0 = _mm256_and_si256(
            _mm256_srl_epi16(ql0, _mm_cvtsi32_si128(shift)), low);
        const __m256i n1 = _mm256_and_si256(
            _mm256_srl_epi16(ql1, _mm_cvtsi32_si128(shift)), low);
        const __m256i h0 = _mm256_and_si256(
            _mm256_srl_epi16(qh, _mm_cvtsi32_si128(shift)), three);
        const __m256i h1 = _mm256_and_si256(
            _mm256_srl_epi16(qh, _mm_cvtsi32_si128(shift + 2)), three);
        const __m512i codes =
            Join(_mm256_or_si256(n0, _mm256_slli_epi16(h0, 4)),
                 _mm256_or_si256(n1, _mm256_slli_epi16(h1, 4)));
        const int k = 2 * pair;
        const __m512i xv = _mm512_loadu_si512(xq + b * 256 + 128 * h + 32 * k);
        const __m512i p = _mm512_sub_epi32(
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, xv),
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, xv));
        const int8_t* s = sc + 8 * h + 2 * k;
        const __m512i sv =
            _mm512_set_epi32(s[3], s[3], s[3], s[3], s[2], s[2], s[2], s[2],
                             s[1], s[1], s[1], s[1], s[0], s[0], s[0], s[0]);
        const __m512 scale =
            Scale2(d * xd[b * 8 + 4 * h + k], d * xd[b * 8 + 4 * h + k + 1]);
        const __m512 term = _mm512_cvtepi32_ps(_mm512_mullo_epi32(p, sv));
        if (pair == 0) {
          acc0 = _mm512_fmadd_ps(term, scale, acc0);
        } else {
          acc1 = _mm512_fmadd_ps(term, scale, acc1);
        }
      }
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

}  // namespace

GgufDotFn GgufDotAvx512Vnni(DType dtype) {
  switch (dtype) {
    case DType::kQ4K:
      return &DotK45Vnni<false>;
    case DType::kQ5K:
      return &DotK45Vnni<true>;
    case DType::kQ6K:
      return &DotQ6KVnni;
    default:
      return nullptr;
  }
}

}  // namespace moe
