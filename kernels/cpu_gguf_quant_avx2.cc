// The AVX2 ggml-block dot products (cpu_gguf_quant.h). Compiled with the
// baseline flags; the functions carry their target, and only run after
// GgufDotFor has checked the level.
//
// Integer core, as in cpu_quant_matmul.cc: unsigned codes meet the s8
// activations in vpmaddubsw directly (|pair| <= 2 * 63 * 127 < 2^15);
// signed codes (Q4_0, Q5_0, Q6_K) go through the sign trick, |x| against w
// carrying x's sign. vpmaddwd then widens to eight int32 lanes, lanes 0-3
// holding elements 0-15 and lanes 4-7 elements 16-31 of the group.
#include <immintrin.h>

#include "kernels/cpu_gguf_quant.h"

#define MOE_GGUF_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace moe {
namespace {

using gguf_quant_internal::ForEachWeightRow;
using gguf_quant_internal::ForRowCount;
using gguf_quant_internal::Load16;
using gguf_quant_internal::Load32;
using gguf_quant_internal::UnpackKScalesSimd;

MOE_GGUF_AVX2 inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

MOE_GGUF_AVX2 inline float F16(const uint8_t* p) {
  return _cvtsh_ss(Load16(p));
}

// Unsigned codes (u8) x activations (s8), summed into eight int32 lanes.
MOE_GGUF_AVX2 inline __m256i DotU8(__m256i codes, __m256i xv) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(codes, xv),
                           _mm256_set1_epi16(1));
}

// Signed codes (s8, > -128) x activations (s8).
MOE_GGUF_AVX2 inline __m256i DotS8(__m256i codes, __m256i xv) {
  return DotU8(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(codes, xv));
}

// The 32 bits of a Q5 block's qh, one per byte: 0x10 where set.
MOE_GGUF_AVX2 inline __m256i FifthBits(uint32_t qh) {
  const __m256i shuffle =
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                        0x0101010101010101, 0x0000000000000000);
  const __m256i bytes =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), shuffle);
  const __m256i bit =
      _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// Q4_0 / Q4_1 / Q5_0 / Q5_1 (see the scalar DotSmall): the 16 nibble bytes
// widened to 32 codes in element order (low nibbles, then high).
template <bool kFive, bool kMin>
MOE_GGUF_AVX2 float DotSmallAvx2(const uint8_t* w,
                                 const QuantizedActivations& x, int64_t i) {
  constexpr int kBytes = 2 + (kMin ? 2 : 0) + (kFive ? 4 : 0) + 16;
  constexpr int kOffset = kMin ? 0 : (kFive ? 16 : 8);
  const int64_t blocks = x.k / 32;
  const int8_t* xq = x.q.data() + i * x.k;
  const float* xd = x.d.data() + i * blocks;
  const float* sd = x.sd.data() + i * blocks;
  const __m128i low = _mm_set1_epi8(0x0F);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float macc = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = w + b * kBytes;
    const __m128i qs =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kBytes - 16));
    __m256i codes = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), low),
                                     _mm_and_si128(qs, low));
    if (kFive)
      codes = _mm256_or_si256(codes, FifthBits(Load32(blk + (kMin ? 4 : 2))));
    const __m256i xv =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * 32));
    const __m256i p =
        kMin ? DotU8(codes, xv)
             : DotS8(_mm256_sub_epi8(codes, _mm256_set1_epi8(kOffset)), xv);
    const __m256 scale = _mm256_set1_ps(F16(blk) * xd[b]);
    if (b % 2 == 0) {
      acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc0);
    } else {
      acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc1);
    }
    if (kMin) macc += F16(blk + 2) * sd[b];
  }
  return HSum(_mm256_add_ps(acc0, acc1)) + macc;
}

// The 16 bit-sums of a K block's activations against 16 int16 weights:
// eight int32 lanes (pairs added).
MOE_GGUF_AVX2 inline __m256i BsumsDot(const int16_t* bs, __m256i w16) {
  return _mm256_madd_epi16(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs)), w16);
}

// Q4_K / Q5_K (see the scalar K45Rows): per 64 weights c, 32 bytes of qs
// give sub-block 2c (low nibbles) and 2c + 1 (high); the codes meet the
// activations in vpmaddubsw (16-bit pair sums) and their sub-block scale
// in vpmaddwd, so a block's sum stays integer in eight int32 lanes.
template <bool kFive, int kRows>
MOE_GGUF_AVX2 void K45RowsAvx2N(const uint8_t* w, const KActivations& x,
                               int64_t i0, float bias, float* y,
                               int64_t y_stride) {
  constexpr int kBytes = kFive ? 176 : 144;
  const int64_t blocks = x.k / kKBlock;
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i five = _mm256_set1_epi8(0x10);
  __m256 acc[kRows], macc[kRows];
  for (int r = 0; r < kRows; ++r) acc[r] = macc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = w + b * kBytes;
    // Scale j in 16 int16 lanes (a byte shuffle of the scales widened and
    // repeated); each min twice (m0 m0 m1 m1 ...), against the 16 bit-sums.
    const __m128i sm = UnpackKScalesSimd(blk + 4);
    const __m256i s16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
    const __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm));
    __m256i scale[8];
    for (int j = 0; j < 8; ++j) {
      scale[j] = _mm256_shuffle_epi8(s16, _mm256_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * j)));
    }
    const uint8_t* qs = blk + (kFive ? 48 : 16);
    const __m256i qh =
        kFive ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16))
              : __m256i{};
    __m256i isum[kRows];
    for (int r = 0; r < kRows; ++r) isum[r] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i bytes =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      __m256i lo = _mm256_and_si256(bytes, low);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
      if (kFive) {
        const __m256i bit0 = _mm256_set1_epi8(static_cast<char>(1 << (2 * c)));
        const __m256i bit1 =
            _mm256_set1_epi8(static_cast<char>(1 << (2 * c + 1)));
        lo = _mm256_or_si256(
            lo, _mm256_and_si256(
                    _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit0), bit0), five));
        hi = _mm256_or_si256(
            hi, _mm256_and_si256(
                    _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit1), bit1), five));
      }
      for (int r = 0; r < kRows; ++r) {
        const int8_t* xb = x.q.data() + (i0 + r) * x.k + b * kKBlock + 64 * c;
        const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb));
        const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 32));
        isum[r] = _mm256_add_epi32(
            isum[r], _mm256_add_epi32(
                         _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), scale[2 * c]),
                         _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1),
                                           scale[2 * c + 1])));
      }
    }
    const float d = F16(blk), dmin = F16(blk + 2);
    for (int r = 0; r < kRows; ++r) {
      const int64_t i = i0 + r;
      const float dx = x.d[i * blocks + b];
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_set1_ps(d * dx), acc[r]);
      macc[r] = _mm256_fmadd_ps(
          _mm256_cvtepi32_ps(BsumsDot(x.bsums.data() + (i * x.k + b * kKBlock) / 16, m16)),
          _mm256_set1_ps(dmin * dx), macc[r]);
    }
  }
  for (int r = 0; r < kRows; ++r) y[r * y_stride] = HSum(acc[r]) - HSum(macc[r]) + bias;
}

// Q6_K (see the scalar Q6KRows): per half, group k's codes (0..63) are a
// nibble of ql0 (k = 0, 2) or ql1 (k = 1, 3) and two bits of qh; the
// sub-block scales (int16) split vpmaddwd's eight lanes 4 + 4, and the codes'
// offset of 32 comes back per block as 32 * sum_j s_j (bit-sum j).
template <int kRows>
MOE_GGUF_AVX2 void Q6KRowsAvx2N(const uint8_t* w, const KActivations& x,
                               int64_t i0, float bias, float* y,
                               int64_t y_stride) {
  const int64_t blocks = x.k / kKBlock;
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i three = _mm256_set1_epi8(0x03);
  __m256 acc[kRows];
  for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = w + b * 210;
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const __m256i sc16 = _mm256_cvtepi8_epi16(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
    __m256i isum[kRows];
    for (int r = 0; r < kRows; ++r) {
      // -32 * sum_j s_j bsum_j, as a start.
      isum[r] = _mm256_sub_epi32(
          _mm256_setzero_si256(),
          _mm256_slli_epi32(
              BsumsDot(x.bsums.data() + ((i0 + r) * x.k + b * kKBlock) / 16, sc16), 5));
    }
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(blk + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
      const __m256i nib[4] = {_mm256_and_si256(ql0, low),
                              _mm256_and_si256(ql1, low),
                              _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low),
                              _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low)};
      for (int k = 0; k < 4; ++k) {
        const __m256i codes = _mm256_or_si256(
            nib[k], _mm256_slli_epi16(
                        _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), three), 4));
        const __m256i scale = _mm256_set_m128i(
            _mm_set1_epi16(sc[8 * h + 2 * k + 1]), _mm_set1_epi16(sc[8 * h + 2 * k]));
        for (int r = 0; r < kRows; ++r) {
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
              x.q.data() + (i0 + r) * x.k + b * kKBlock + 128 * h + 32 * k));
          isum[r] = _mm256_add_epi32(
              isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(codes, xv), scale));
        }
      }
    }
    const float d = F16(blk + 208);
    for (int r = 0; r < kRows; ++r) {
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]),
                               _mm256_set1_ps(d * x.d[(i0 + r) * blocks + b]), acc[r]);
    }
  }
  for (int r = 0; r < kRows; ++r) y[r * y_stride] = HSum(acc[r]) + bias;
}

template <bool kFive>
void K45RowsAvx2(const uint8_t* w, int64_t w_stride, int64_t n_rows, const KActivations& x,
                 int64_t i0, int rows, const float* bias, float* y, int64_t y_stride) {
  ForRowCount(rows, [&](auto r) {
    ForEachWeightRow(w, w_stride, n_rows, bias, y, [&](const uint8_t* wc, float b, float* yc) {
      K45RowsAvx2N<kFive, r.value>(wc, x, i0, b, yc, y_stride);
    });
  });
}

void Q6KRowsAvx2(const uint8_t* w, int64_t w_stride, int64_t n_rows, const KActivations& x,
                 int64_t i0, int rows, const float* bias, float* y, int64_t y_stride) {
  ForRowCount(rows, [&](auto r) {
    ForEachWeightRow(w, w_stride, n_rows, bias, y, [&](const uint8_t* wc, float b, float* yc) {
      Q6KRowsAvx2N<r.value>(wc, x, i0, b, yc, y_stride);
    });
  });
}

}  // namespace

GgufDotFn GgufDotAvx2(DType dtype) {
  switch (dtype) {
    case DType::kQ4_0:
      return &DotSmallAvx2<false, false>;
    case DType::kQ4_1:
      return &DotSmallAvx2<false, true>;
    case DType::kQ5_0:
      return &DotSmallAvx2<true, false>;
    case DType::kQ5_1:
      return &DotSmallAvx2<true, true>;
    default:
      return nullptr;
  }
}

GgufKRowsFn GgufKRowsAvx2(DType dtype) {
  switch (dtype) {
    case DType::kQ4K:
      return &K45RowsAvx2<false>;
    case DType::kQ5K:
      return &K45RowsAvx2<true>;
    case DType::kQ6K:
      return &Q6KRowsAvx2;
    default:
      return nullptr;
  }
}

}  // namespace moe
