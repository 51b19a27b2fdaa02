// The AVX-512 VNNI ggml-block products (cpu_gguf_quant.h) for the
// K-quants, which dominate GGUF MoE files: one vpmaddubsw + vpdpwssd pair
// covers 64 weights (two K sub-blocks of 32, or four Q6_K sub-blocks of
// 16) with their scales, where AVX2 needs two maddubs + madd pairs; and the
// 32-weight types with one vpdpbusd per block (256-bit).
// Its own file, as cpu_quant_vnni.cc, because GCC 12's avx512fintrin.h
// trips -Wuninitialized inside _mm512_inserti64x4 / _mm512_cvtepi32_ps.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "common/row_interleave.h"
#include "kernels/cpu_gguf_quant.h"

#define MOE_GGUF_VNNI_TARGET \
  target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#define MOE_GGUF_VNNI __attribute__((MOE_GGUF_VNNI_TARGET))
// One weight row's kernel, inlined into the loop over rows (EachRow).
#define MOE_GGUF_VNNI_INLINE __attribute__((MOE_GGUF_VNNI_TARGET, always_inline)) inline
// A lambda's own target (GCC does not inherit the enclosing function's).
#define MOE_GGUF_VNNI_LAMBDA __attribute__((MOE_GGUF_VNNI_TARGET, always_inline))

namespace moe {
namespace {

using gguf_quant_internal::ForRowCount;
using gguf_quant_internal::Load16;
using gguf_quant_internal::Load32;
using gguf_quant_internal::UnpackKScalesSimd;

MOE_GGUF_VNNI inline float F16(const uint8_t* p) {
  return _cvtsh_ss(Load16(p));
}

MOE_GGUF_VNNI inline float HSum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// 32 bytes at p in both halves of a register.
MOE_GGUF_VNNI inline __m512i Both(const uint8_t* p) {
  return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The 16 bit-sums of a K block's activations against 16 int16 weights:
// eight int32 lanes (pairs added).
MOE_GGUF_VNNI inline __m256i BsumsDot(const int16_t* bs, __m256i w16) {
  return _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs)), w16);
}

// Constants the kernels read from memory rather than build per call.
struct alignas(64) KConstants {
  // Q4_K/Q5_K: vpermw indices taking scale 2c to int16 lanes 0-15 and
  // 2c + 1 to 16-31.
  int16_t k45_pick[4][32];
  // Q6_K: sub-blocks 4q .. 4q + 3 of a 64-weight run, eight lanes each.
  int16_t q6_pick[4][32];
  constexpr KConstants() : k45_pick(), q6_pick() {
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        k45_pick[c][l] = static_cast<int16_t>(2 * c + l / 16);
        q6_pick[c][l] = static_cast<int16_t>(4 * c + l / 8);
      }
    }
  }
};
constexpr KConstants kK;

MOE_GGUF_VNNI inline __m512i Pick(const int16_t* p) { return _mm512_load_si512(p); }

// The codes, scales and bit-sums of kR activation rows from i0.
template <int kR>
struct KRows {
  const int8_t* xq[kR];
  const float* xd[kR];
  const int16_t* xbs[kR];
  KRows(const KActivations& x, int64_t i0) {
    const int64_t blocks = x.k / kKBlock;
    for (int r = 0; r < kR; ++r) {
      xq[r] = x.q.data() + (i0 + r) * x.k;
      xd[r] = x.d.data() + (i0 + r) * blocks;
      xbs[r] = x.bsums.data() + (i0 + r) * (x.k / 16);
    }
  }
};

// Q4_K / Q5_K: per 64 weights c, the 32 bytes of qs in both halves shifted
// by 0 | 4 give sub-block 2c in bytes 0-31 and 2c + 1 in bytes 32-63, the
// 64 activations in order. vpmaddubsw forms the 16-bit pair sums and
// vpdpwssd multiplies them by the sub-block's scale into int32 lanes (two
// chains, c even and odd), so a block is one integer vector per row and
// one f32 multiply-add; the mins meet the bit-sums in vpmaddwd. (Four
// weight rows a call, sharing the constants, measured ~10% slower at
// decode than one.)
template <bool kFive, int kR>
MOE_GGUF_VNNI_INLINE void K45Row(const uint8_t* w, const KActivations& x, int64_t i0, float bias,
                            float* y, int64_t y_stride) {
  constexpr int kBytes = kFive ? 176 : 144;
  const int64_t blocks = x.k / kKBlock;
  const KRows<kR> t(x, i0);
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i five = _mm512_set1_epi8(0x10);
  const __m512i nibble_shift =
      _mm512_mask_blend_epi64(0xf0, _mm512_setzero_si512(), _mm512_set1_epi16(4));
  __m512 acc[kR];
  __m256 macc[kR];
  for (int r = 0; r < kR; ++r) {
    acc[r] = _mm512_setzero_ps();
    macc[r] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = w + b * kBytes;
    const __m128i sm = UnpackKScalesSimd(blk + 4);
    const __m512i s16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(sm));
    const __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sm, sm));
    const uint8_t* qs = blk + (kFive ? 48 : 16);
    const __m512i qh2 = kFive ? Both(blk + 16) : _mm512_setzero_si512();
    __m512i isum[2][kR];
    for (int r = 0; r < kR; ++r) isum[0][r] = isum[1][r] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      __m512i codes =
          _mm512_and_si512(_mm512_srlv_epi16(Both(qs + 32 * c), nibble_shift), low);
      if (kFive) {
        // Bit 2c of qh for the lower half, bit 2c + 1 for the upper.
        const __m512i bit = _mm512_mask_blend_epi64(
            0xf0, _mm512_set1_epi8(static_cast<char>(1 << (2 * c))),
            _mm512_set1_epi8(static_cast<char>(1 << (2 * c + 1))));
        codes = _mm512_or_si512(
            codes, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(qh2, bit), five));
      }
      const __m512i scale = _mm512_permutexvar_epi16(Pick(kK.k45_pick[c]), s16);
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) {
        const __m512i xv = _mm512_loadu_si512(t.xq[r] + b * kKBlock + 64 * c);
        isum[c & 1][r] =
            _mm512_dpwssd_epi32(isum[c & 1][r], _mm512_maddubs_epi16(codes, xv), scale);
      }
    }
    // d and dmin side by side.
    const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(Load32(blk))));
#pragma GCC unroll 4
    for (int r = 0; r < kR; ++r) {
      const __m128 f = _mm_mul_ps(dd, _mm_set1_ps(t.xd[r][b]));
      acc[r] =
          _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(isum[0][r], isum[1][r])),
                          _mm512_broadcastss_ps(f), acc[r]);
      macc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(BsumsDot(t.xbs[r] + b * 16, m16)),
                                    _mm256_broadcastss_ps(_mm_movehdup_ps(f)), macc[r]);
    }
  }
  for (int r = 0; r < kR; ++r) {
    y[r * y_stride] = _mm512_reduce_add_ps(acc[r]) - HSum8(macc[r]) + bias;
  }
}

// Q6_K: per half h, the 64 bytes of ql give groups 0 | 1 (low nibbles,
// weights 128h + [0, 64)) and 2 | 3 (high nibbles, 128h + [64, 128)), the
// 32 bytes of qh in both halves shifted so that each group's two bits land
// on bits 4-5. Codes 0..63 (unsigned, vpmaddubsw's first operand); the
// offset of 32 comes back per block as 32 * sum_j s_j (bit-sum j). The
// 32 int16 pair sums of 64 weights cover four sub-blocks of 16, eight
// lanes each, whose scales vpdpwssd applies (two chains: the halves).
template <int kR>
MOE_GGUF_VNNI_INLINE void Q6KRow(const uint8_t* w, const KActivations& x, int64_t i0, float bias,
                            float* y, int64_t y_stride) {
  const int64_t blocks = x.k / kKBlock;
  const KRows<kR> t(x, i0);
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i bits45 = _mm512_set1_epi8(0x30);
  // Groups 0 | 1: qh << 4 | qh << 2; groups 2 | 3: qh | qh >> 2.
  const __m512i up =
      _mm512_mask_blend_epi64(0xf0, _mm512_set1_epi16(4), _mm512_set1_epi16(2));
  const __m512i down =
      _mm512_mask_blend_epi64(0xf0, _mm512_setzero_si512(), _mm512_set1_epi16(2));
  __m512 acc[kR];
  for (int r = 0; r < kR; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = w + b * 210;
    const __m256i sc16 = _mm256_cvtepi8_epi16(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
    const __m512i sc512 = _mm512_castsi256_si512(sc16);
    // The first chain starts at -32 * sum_j s_j bsum_j.
    __m512i isum[2][kR];
    for (int r = 0; r < kR; ++r) {
      isum[0][r] = _mm512_zextsi256_si512(_mm256_sub_epi32(
          _mm256_setzero_si256(), _mm256_slli_epi32(BsumsDot(t.xbs[r] + b * 16, sc16), 5)));
      isum[1][r] = _mm512_setzero_si512();
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(blk + 64 * h);
      const __m512i qh2 = Both(blk + 128 + 32 * h);
      const __m512i codes[2] = {
          _mm512_or_si512(_mm512_and_si512(ql, low),
                          _mm512_and_si512(_mm512_sllv_epi16(qh2, up), bits45)),
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low),
                          _mm512_and_si512(_mm512_srlv_epi16(qh2, down), bits45))};
#pragma GCC unroll 2
      for (int p = 0; p < 2; ++p) {
        const __m512i scale = _mm512_permutexvar_epi16(Pick(kK.q6_pick[2 * h + p]), sc512);
#pragma GCC unroll 4
        for (int r = 0; r < kR; ++r) {
          const __m512i xv = _mm512_loadu_si512(t.xq[r] + b * kKBlock + 128 * h + 64 * p);
          isum[h][r] =
              _mm512_dpwssd_epi32(isum[h][r], _mm512_maddubs_epi16(codes[p], xv), scale);
        }
      }
    }
    const float d = F16(blk + 208);
#pragma GCC unroll 4
    for (int r = 0; r < kR; ++r) {
      acc[r] =
          _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(isum[0][r], isum[1][r])),
                          _mm512_set1_ps(d * t.xd[r][b]), acc[r]);
    }
  }
  for (int r = 0; r < kR; ++r) y[r * y_stride] = _mm512_reduce_add_ps(acc[r]) + bias;
}

// kQ4KR16 (common/row_interleave.h): a 16-row group at a time, one 32-bit
// lane per row, so a block's scales, float work and the final sums serve
// 16 rows and no row needs a horizontal reduction. Per 64-byte load of
// codes: `& 0x0F` gives 4 weights of sub-block 2p per row, `& 0xF0` the
// same positions of 2p + 1 times 16; vpdpbusd against the 4 activations
// broadcast. After a sub-block pair, the two int32 sums meet the scales
// (16 s_2p and s_2p+1, so the block's integer is 16 S, exact), and the mins
// meet the bit-sum pair in one vpdpwssd. Each lane then follows the scalar
// order: acc = fma(S, d dx, acc), acc = fma(-M, dmin dx, acc).
// No software prefetch: with the weights on huge pages (HugePageArena) the
// hardware prefetchers alone read more from memory; prefetching 1024 bytes
// ahead, which gained 10% on 4 KiB pages, cost Q8x16's decode 10-13%.
template <int kR>
MOE_GGUF_VNNI_INLINE void Q4KR16Group(const uint8_t* gp, const KActivations& x, int64_t i0,
                                      const float* bias, float* y, int64_t y_stride) {
  const int64_t blocks = x.k / kKBlock;
  const KRows<kR> t(x, i0);
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i high = _mm512_set1_epi8(static_cast<char>(0xF0));
  const __m512i bits45 = _mm512_set1_epi8(0x30);
  const __m512i scale16 = _mm512_set1_epi32(0x3F0);
  // Targets 0-63 take their top bits from bits 0-1 | 2-3 of the top-bit
  // bytes (to bits 4-5: << 4 | << 2), targets 64-127 from 4-5 | 6-7.
  const __m512i first_shift =
      _mm512_mask_blend_epi64(0xf0, _mm512_set1_epi16(4), _mm512_set1_epi16(2));
  const __m512i second_shift =
      _mm512_mask_blend_epi64(0xf0, _mm512_setzero_si512(), _mm512_set1_epi16(2));
  __m512 acc[kR];
  for (int r = 0; r < kR; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* g = gp + b * kQ4KR16GroupBytes;
    // The 128 six-bit targets of an area: t0 = targets 0-63 (pairs 0, 1),
    // t1 = 64-127 (pairs 2, 3). a | (b & c) is ternary-logic 0xF8.
    auto targets = [&](const uint8_t* area, __m512i* t0, __m512i* t1) MOE_GGUF_VNNI_LAMBDA {
      const __m512i l = _mm512_loadu_si512(area);
      const __m512i h = Both(area + 64);
      *t0 = _mm512_ternarylogic_epi32(_mm512_and_si512(l, low),
                                      _mm512_sllv_epi16(h, first_shift), bits45, 0xF8);
      *t1 = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(l, 4), low),
                                      _mm512_srlv_epi16(h, second_shift), bits45, 0xF8);
    };
    __m512i sc[2], mn[2];
    targets(g + 64, &sc[0], &sc[1]);
    targets(g + 160, &mn[0], &mn[1]);
    // Per row, the bit-sums of sub-blocks 2p and 2p + 1 as one int32
    // (int16 pair), at element {0, 1, 4, 5}[p].
    alignas(32) int32_t bsp[kR][8];
    for (int r = 0; r < kR; ++r) {
      const __m256i s32 = _mm256_madd_epi16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.xbs[r] + b * 16)),
          _mm256_set1_epi16(1));
      _mm256_store_si256(reinterpret_cast<__m256i*>(bsp[r]), _mm256_packs_epi32(s32, s32));
    }
    __m512i s16[kR], m[kR];
    for (int r = 0; r < kR; ++r) s16[r] = m[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      const __m512i& st = sc[p / 2];
      const __m512i& mt = mn[p / 2];
      const __m512i sp = _mm512_cvtepu8_epi16(p % 2 == 0 ? _mm512_castsi512_si256(st)
                                                         : _mm512_extracti64x4_epi64(st, 1));
      const __m512i mp = _mm512_cvtepu8_epi16(p % 2 == 0 ? _mm512_castsi512_si256(mt)
                                                         : _mm512_extracti64x4_epi64(mt, 1));
      const __m512i s_lo = _mm512_and_si512(_mm512_slli_epi32(sp, 4), scale16);
      const __m512i s_hi = _mm512_srli_epi32(sp, 16);
      constexpr int kPair[4] = {0, 1, 4, 5};
      __m512i da[kR], db[kR];
      for (int r = 0; r < kR; ++r) {
        m[r] = _mm512_dpwssd_epi32(m[r], mp, _mm512_set1_epi32(bsp[r][kPair[p]]));
        da[r] = db[r] = _mm512_setzero_si512();
      }
      const uint8_t* qs = g + 256 + 512 * p;
#pragma GCC unroll 8
      for (int q = 0; q < 8; ++q) {
        const __m512i v = _mm512_loadu_si512(qs + 64 * q);
        const __m512i lo = _mm512_and_si512(v, low);
        const __m512i hi = _mm512_and_si512(v, high);
#pragma GCC unroll 4
        for (int r = 0; r < kR; ++r) {
          const int8_t* xp = t.xq[r] + b * kKBlock + 64 * p + 4 * q;
          int32_t xa, xb;
          std::memcpy(&xa, xp, 4);
          std::memcpy(&xb, xp + 32, 4);
          da[r] = _mm512_dpbusd_epi32(da[r], lo, _mm512_set1_epi32(xa));
          db[r] = _mm512_dpbusd_epi32(db[r], hi, _mm512_set1_epi32(xb));
        }
      }
      for (int r = 0; r < kR; ++r) {
        s16[r] = _mm512_add_epi32(
            s16[r], _mm512_add_epi32(_mm512_mullo_epi32(da[r], s_lo),
                                     _mm512_mullo_epi32(db[r], s_hi)));
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g)));
    const __m512 dmin =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 32)));
    for (int r = 0; r < kR; ++r) {
      const __m512 dx = _mm512_set1_ps(t.xd[r][b]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srai_epi32(s16[r], 4)),
                               _mm512_mul_ps(d, dx), acc[r]);
      acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m[r]), _mm512_mul_ps(dmin, dx), acc[r]);
    }
  }
  const __m512 bv = bias != nullptr ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  for (int r = 0; r < kR; ++r) _mm512_storeu_ps(y + r * y_stride, _mm512_add_ps(acc[r], bv));
}

// A rows16 group kernel (Q4KR16Group, Q4R16Group) over whole groups.
template <auto kGroup, typename X>
MOE_GGUF_VNNI void Rows16Groups(const uint8_t* w, int64_t w_stride, int64_t n_rows, const X& x,
                                int64_t i0, const float* bias, float* y, int64_t y_stride) {
  for (int64_t g = 0; g < n_rows / kQ4KR16Rows; ++g) {
    kGroup(w + g * kQ4KR16Rows * w_stride, x, i0,
           bias != nullptr ? bias + g * kQ4KR16Rows : nullptr, y + g * kQ4KR16Rows, y_stride);
  }
}

void Q4KR16RowsVnni(const uint8_t* w, int64_t w_stride, int64_t n_rows, const KActivations& x,
                    int64_t i0, int rows, const float* bias, float* y, int64_t y_stride) {
  ForRowCount(rows, [&](auto r) {
    Rows16Groups<&Q4KR16Group<r.value>>(w, w_stride, n_rows, x, i0, bias, y, y_stride);
  });
}

// kQ4R16 (our q4, 16 rows interleaved): per 64-byte load, `& 0x0F` gives
// 4 weights of the block's first half per row, `& 0xF0` the same positions
// of its second half times 16 (shifted back, exactly, before the scale);
// vpdpbusd against the 4 activations broadcast; then each lane follows the
// scalar order (SmallRows16For).
template <int kR>
MOE_GGUF_VNNI_INLINE void Q4R16Group(const uint8_t* gp, const QuantizedActivations& x,
                                     int64_t i0, const float* bias, float* y,
                                     int64_t y_stride) {
  const int64_t blocks = x.k / 64, groups = x.k / 32;
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i high = _mm512_set1_epi8(static_cast<char>(0xF0));
  const int8_t* xq[kR];
  const float* xd[kR];
  const float* sd[kR];
  __m512 acc[kR];
  for (int r = 0; r < kR; ++r) {
    xq[r] = x.q.data() + (i0 + r) * x.k;
    xd[r] = x.d.data() + (i0 + r) * groups;
    sd[r] = x.sd.data() + (i0 + r) * groups;
    acc[r] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* g = gp + b * kQ4R16GroupBytes;
    __m512i da[kR], db[kR];
    for (int r = 0; r < kR; ++r) da[r] = db[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int t = 0; t < 8; ++t) {
      const __m512i v = _mm512_loadu_si512(g + 64 + 64 * t);
      const __m512i lo = _mm512_and_si512(v, low);
      const __m512i hi = _mm512_and_si512(v, high);
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) {
        int32_t xa, xb;
        std::memcpy(&xa, xq[r] + 64 * b + 4 * t, 4);
        std::memcpy(&xb, xq[r] + 64 * b + 32 + 4 * t, 4);
        da[r] = _mm512_dpbusd_epi32(da[r], lo, _mm512_set1_epi32(xa));
        db[r] = _mm512_dpbusd_epi32(db[r], hi, _mm512_set1_epi32(xb));
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g)));
    const __m512 m =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 32)));
    for (int r = 0; r < kR; ++r) {
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(da[r]),
                               _mm512_mul_ps(d, _mm512_set1_ps(xd[r][2 * b])), acc[r]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srai_epi32(db[r], 4)),
                               _mm512_mul_ps(d, _mm512_set1_ps(xd[r][2 * b + 1])), acc[r]);
      acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(sd[r][2 * b]), acc[r]);
      acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(sd[r][2 * b + 1]), acc[r]);
    }
  }
  const __m512 bv = bias != nullptr ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  for (int r = 0; r < kR; ++r) _mm512_storeu_ps(y + r * y_stride, _mm512_add_ps(acc[r], bv));
}

void Q4R16RowsVnni(const uint8_t* w, int64_t w_stride, int64_t n_rows,
                   const QuantizedActivations& x, int64_t i0, int rows, const float* bias,
                   float* y, int64_t y_stride) {
  ForRowCount(rows, [&](auto r) {
    Rows16Groups<&Q4R16Group<r.value>>(w, w_stride, n_rows, x, i0, bias, y, y_stride);
  });
}

// The 32-weight interleaved layouts (kQ8R16, kQ4_0R16): per 64-byte load
// a 32-bit lane per row, unsigned codes u against 4 activations broadcast
// (vpdpbusd), then the block's exact sum of w x = sum of u x - kOffset x
// (the block's activation sum), and each lane follows the scalar order
// (SmallRows16For).
//  * kQ8R16 (kQ4_0 false): the codes with their sign bit flipped are
//    w + 128 as u8; 8 loads of 4 weights per row; kOffset 128.
//  * kQ4_0R16 (kQ4_0 true): `& 0x0F` gives 4 weights of the block's first
//    16 per row and `>> 4` the same positions of its last 16, q = w + 8;
//    4 loads; kOffset 8.
template <int kR, bool kQ4_0>
MOE_GGUF_VNNI_INLINE void Small32Group(const uint8_t* gp, const QuantizedActivations& x,
                                       int64_t i0, const float* bias, float* y,
                                       int64_t y_stride) {
  constexpr int64_t kGroupBytes = kQ4_0 ? kQ4_0R16GroupBytes : kQ8R16GroupBytes;
  constexpr int kLoads = kQ4_0 ? 4 : 8;
  constexpr int32_t kOffset = kQ4_0 ? 8 : 128;
  const int64_t blocks = x.k / 32;
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const int8_t* xq[kR];
  const float* xd[kR];
  const int32_t* xs[kR];
  __m512 acc[kR];
  for (int r = 0; r < kR; ++r) {
    xq[r] = x.q.data() + (i0 + r) * x.k;
    xd[r] = x.d.data() + (i0 + r) * blocks;
    xs[r] = x.s.data() + (i0 + r) * blocks;
    acc[r] = _mm512_setzero_ps();
  }
  // u (4 bytes of each row) against the 4 activations at xq[r] + 32 b + at.
  auto dot = [&](__m512i (&d)[kR], __m512i u, int64_t b, int at) MOE_GGUF_VNNI_LAMBDA {
#pragma GCC unroll 4
    for (int r = 0; r < kR; ++r) {
      int32_t xa;
      std::memcpy(&xa, xq[r] + 32 * b + at, 4);
      d[r] = _mm512_dpbusd_epi32(d[r], u, _mm512_set1_epi32(xa));
    }
  };
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* g = gp + b * kGroupBytes;
    __m512i da[kR], db[kR];
    for (int r = 0; r < kR; ++r) da[r] = db[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int t = 0; t < kLoads; ++t) {
      const __m512i v = _mm512_loadu_si512(g + 32 + 64 * t);
      if constexpr (kQ4_0) {
        dot(da, _mm512_and_si512(v, low), b, 4 * t);
        dot(db, _mm512_and_si512(_mm512_srli_epi16(v, 4), low), b, 16 + 4 * t);
      } else {
        dot(t % 2 == 0 ? da : db, _mm512_xor_si512(v, flip), b, 4 * t);
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g)));
    for (int r = 0; r < kR; ++r) {
      const __m512i sum = _mm512_sub_epi32(_mm512_add_epi32(da[r], db[r]),
                                           _mm512_set1_epi32(kOffset * xs[r][b]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, _mm512_set1_ps(xd[r][b])),
                               acc[r]);
    }
  }
  const __m512 bv = bias != nullptr ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  for (int r = 0; r < kR; ++r) _mm512_storeu_ps(y + r * y_stride, _mm512_add_ps(acc[r], bv));
}

template <bool kQ4_0>
void Small32RowsVnni(const uint8_t* w, int64_t w_stride, int64_t n_rows,
                     const QuantizedActivations& x, int64_t i0, int rows, const float* bias,
                     float* y, int64_t y_stride) {
  ForRowCount(rows, [&](auto r) {
    Rows16Groups<&Small32Group<r.value, kQ4_0>>(w, w_stride, n_rows, x, i0, bias, y, y_stride);
  });
}

// Weight rows one after another in one call (no call and no constants
// per row), each as kRow (K45Row, Q6KRow, SmallRow) computes it alone.
template <auto kRow, typename X>
MOE_GGUF_VNNI void EachRow(const uint8_t* w, int64_t w_stride, int64_t n_rows, const X& x,
                           int64_t i0, const float* bias, float* y, int64_t y_stride) {
  for (int64_t c = 0; c < n_rows; ++c) {
    kRow(w + c * w_stride, x, i0, bias != nullptr ? bias[c] : 0.0f, y + c, y_stride);
  }
}

template <bool kFive>
void K45RowsVnni(const uint8_t* w, int64_t w_stride, int64_t n_rows, const KActivations& x,
                 int64_t i0, int rows, const float* bias, float* y, int64_t y_stride) {
  ForRowCount(rows, [&](auto r) {
    EachRow<&K45Row<kFive, r.value>>(w, w_stride, n_rows, x, i0, bias, y, y_stride);
  });
}

void Q6KRowsVnni(const uint8_t* w, int64_t w_stride, int64_t n_rows, const KActivations& x,
                 int64_t i0, int rows, const float* bias, float* y, int64_t y_stride) {
  ForRowCount(rows, [&](auto r) {
    EachRow<&Q6KRow<r.value>>(w, w_stride, n_rows, x, i0, bias, y, y_stride);
  });
}

// The 32-weight types (see the scalar DotSmall): the 16 nibble bytes in
// both 128-bit halves, shifted by 0 | 4, give the 32 codes in element
// order; codes stay unsigned (vpdpbusd's first operand, one instruction
// per block and row) and the offset of Q4_0 / Q5_0 (8 / 16) comes back as
// a min term, as Q4_1's min does: y += (d * d_x) * sum(q * q_x) +
// m' * (d_x * sum(q_x)), m' = m or -offset * d. A block's codes serve up
// to kKMaxRows activation rows; each row's sums run in the order they have
// alone. (The scales of 8 blocks gathered into vectors at once measured
// ~15% slower at decode: vpgatherdd and the per-block lane broadcast cost
// more than the scalar conversions they replace.)
MOE_GGUF_VNNI inline __m256i FifthBits256(uint32_t qh) {
  const __m256i shuffle = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                            0x0101010101010101, 0x0000000000000000);
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), shuffle);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  return _mm256_maskz_mov_epi8(_mm256_test_epi8_mask(bytes, bit), _mm256_set1_epi8(0x10));
}

template <bool kFive, bool kMin, int kR>
MOE_GGUF_VNNI_INLINE void SmallRow(const uint8_t* w, const QuantizedActivations& x, int64_t i0,
                                   float bias, float* y, int64_t y_stride) {
  constexpr int kBytes = 2 + (kMin ? 2 : 0) + (kFive ? 4 : 0) + 16;
  constexpr float kOffset = kMin ? 0.0f : (kFive ? 16.0f : 8.0f);
  const int64_t blocks = x.k / 32;
  const int8_t* xq[kR];
  const float* xd[kR];
  const float* sd[kR];
  // Two chains each (even and odd blocks): a block's few operations would
  // otherwise wait on the previous block's scalar min term.
  __m256 acc[2][kR];
  float macc[2][kR];
  for (int r = 0; r < kR; ++r) {
    xq[r] = x.q.data() + (i0 + r) * x.k;
    xd[r] = x.d.data() + (i0 + r) * blocks;
    sd[r] = x.sd.data() + (i0 + r) * blocks;
    acc[0][r] = acc[1][r] = _mm256_setzero_ps();
    macc[0][r] = macc[1][r] = 0.0f;
  }
  const __m128i low = _mm_set1_epi8(0x0F);
  // Block b into chain kOdd (b's parity, a template argument so that the
  // chains stay in registers).
  auto block = [&]<int kOdd>(int64_t b) MOE_GGUF_VNNI_LAMBDA {
    const uint8_t* blk = w + b * kBytes;
    const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kBytes - 16));
    __m256i codes = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), low),
                                     _mm_and_si128(qs, low));
    if (kFive) codes = _mm256_or_si256(codes, FifthBits256(Load32(blk + (kMin ? 4 : 2))));
    const float d = F16(blk);
    const float m = kMin ? F16(blk + 2) : -kOffset * d;
#pragma GCC unroll 4
    for (int r = 0; r < kR; ++r) {
      const __m256i p = _mm256_dpbusd_epi32(
          _mm256_setzero_si256(), codes,
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[r] + b * 32)));
      acc[kOdd][r] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * xd[r][b]), acc[kOdd][r]);
      // std::fma, not `+= m * sd`: the compiler may fuse or not, and may
      // differ between row counts (the rows' results must not).
      macc[kOdd][r] = std::fma(m, sd[r][b], macc[kOdd][r]);
    }
  };
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    block.template operator()<0>(b);
    block.template operator()<1>(b + 1);
  }
  if (b < blocks) block.template operator()<0>(b);
  for (int r = 0; r < kR; ++r) {
    y[r * y_stride] =
        HSum8(_mm256_add_ps(acc[0][r], acc[1][r])) + (macc[0][r] + macc[1][r]) + bias;
  }
}

template <bool kFive, bool kMin>
void SmallRowsVnni(const uint8_t* w, int64_t w_stride, int64_t n_rows,
                   const QuantizedActivations& x, int64_t i0, int rows, const float* bias,
                   float* y, int64_t y_stride) {
  ForRowCount(rows, [&](auto r) {
    EachRow<&SmallRow<kFive, kMin, r.value>>(w, w_stride, n_rows, x, i0, bias, y, y_stride);
  });
}

}  // namespace

MOE_GGUF_VNNI void QuantizeKActivationsAvx512(const float* x, int64_t m, int64_t k,
                                             KActivations* out) {
  SizeKActivations(m, k, out);
  const int64_t blocks = m * (k / kKBlock);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xs = x + b * kKBlock;
    int8_t* q = out->q.data() + b * kKBlock;
    __m512 amax = _mm512_setzero_ps();
    for (int t = 0; t < 16; ++t) {
      amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(xs + 16 * t)));
    }
    const float a = _mm512_reduce_max_ps(amax);
    const float inv = a > 0.0f ? 127.0f / a : 0.0f;
    out->d[b] = a > 0.0f ? 1.0f / inv : 0.0f;
    const __m512 vinv = _mm512_set1_ps(inv);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (int t = 0; t < 16; ++t) {
      // vcvtps2dq rounds half to even under the default MXCSR, as nearbyint.
      const __m512i v = _mm512_min_epi32(
          hi, _mm512_max_epi32(
                  lo, _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xs + 16 * t), vinv))));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * t), _mm512_cvtepi32_epi8(v));
      out->bsums[b * 16 + t] = static_cast<int16_t>(_mm512_reduce_add_epi32(v));
    }
  }
}

GgufSmallRowsFn SmallRows16Avx512Vnni(DType dtype) {
  switch (dtype) {
    case DType::kQ4R16:
      return &Q4R16RowsVnni;
    case DType::kQ8R16:
      return &Small32RowsVnni<false>;
    case DType::kQ4_0R16:
      return &Small32RowsVnni<true>;
    default:
      return nullptr;
  }
}

GgufSmallRowsFn GgufSmallRowsAvx512Vnni(DType dtype) {
  switch (dtype) {
    case DType::kQ4_0:
      return &SmallRowsVnni<false, false>;
    case DType::kQ4_1:
      return &SmallRowsVnni<false, true>;
    case DType::kQ5_0:
      return &SmallRowsVnni<true, false>;
    case DType::kQ5_1:
      return &SmallRowsVnni<true, true>;
    default:
      return nullptr;
  }
}

GgufKRowsFn GgufKRowsAvx512Vnni(DType dtype) {
  switch (dtype) {
    case DType::kQ4K:
      return &K45RowsVnni<false>;
    case DType::kQ5K:
      return &K45RowsVnni<true>;
    case DType::kQ6K:
      return &Q6KRowsVnni;
    case DType::kQ4KR16:
      return &Q4KR16RowsVnni;
    default:
      return nullptr;
  }
}

}  // namespace moe
