// The 32-weight interleaved int8 layouts on AMX-INT8 tiles
// (cpu_gguf_quant.h, SmallRows16Amx).
//
// Per 16-row weight group and 32-weight block b, one TDPBSSD computes every
// activation row's exact integer S = sum of w x against the group's 16 rows:
//  * A: the activation rows' 32 codes of block b, read in place from the
//    quantized activations (stride k): rows x 32 int8;
//  * B: the group's codes of block b, which the interleaved layouts already
//    hold as AMX wants B (8 rows of k/4, each 16 columns x 4 int8): kQ8R16's
//    512 bytes are loaded in place; kQ4_0R16's nibbles are unpacked less 8
//    into a 512-byte scratch first (row t < 4 the low nibbles of load t,
//    weights 4t..4t+3; row 4 + t the high ones, 16 + 4t..);
//  * C: rows x 16 int32, zeroed per block, stored, and each row's 16 lanes
//    then take the same float steps as the VNNI kernel's lanes
//    (acc = fma(S, d dx[b], acc) per block in order, y = acc + bias): so the
//    bits are the VNNI kernel's (and the scalar loop's) for every row count.
// Two blocks in flight (C 0-1, A 2-3, B 4-5).
//
// Its own file, as cpu_amx.cc, for the target attributes and GCC 12's
// -Wuninitialized inside AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstring>
#include <type_traits>
#include <utility>

#include "common/row_interleave.h"
#include "kernels/amx_tiles.h"
#include "kernels/cpu_gguf_quant.h"
#include "kernels/cpu_quant_matmul.h"

#define MOE_AMX_INT8 \
  __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,f16c")))

namespace moe {
namespace {

constexpr int kBlock = 32;      // weights of a block: one TDPBSSD's k
constexpr int kGroupRows = 16;  // weight rows of a group: C's columns

AmxTileConfig ConfigFor(int rows) {
  AmxTileConfig c;
  for (int t = 0; t < 2; ++t) {
    c.Set(t, rows, 4 * kGroupRows);         // C: rows x 16 int32
    c.Set(2 + t, rows, kBlock);             // A: rows x 32 int8
    c.Set(4 + t, kBlock / 4, 4 * kGroupRows);  // B: 8 x (16 x 4 int8)
  }
  return c;
}

MOE_AMX_INT8 inline void UnpackQ4_0(const uint8_t* qs, int8_t* out) {
  const __m512i low = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
  for (int t = 0; t < 4; ++t) {
    const __m512i v = _mm512_loadu_si512(qs + 64 * t);
    _mm512_storeu_si512(out + 64 * t, _mm512_sub_epi8(_mm512_and_si512(v, low), eight));
    _mm512_storeu_si512(out + 64 * (4 + t),
                        _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), low), eight));
  }
}

// acc[r] = fma(S[r], d dx[r][b], acc[r]) for the block's C rows at c.
template <int kR>
MOE_AMX_INT8 inline void Scale(const int32_t* c, const uint8_t* g, const float* xd,
                               int64_t blocks, int64_t b, __m512 (&acc)[kR]) {
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g)));
#pragma GCC unroll 16
  for (int r = 0; r < kR; ++r) {
    const __m512 s = _mm512_cvtepi32_ps(_mm512_load_si512(c + kGroupRows * r));
    acc[r] = _mm512_fmadd_ps(s, _mm512_mul_ps(d, _mm512_set1_ps(xd[r * blocks + b])), acc[r]);
  }
}

// One weight group (gp) against activation rows i0 .. i0 + kR.
template <int kR, bool kQ4_0>
MOE_AMX_INT8 void Group(const uint8_t* gp, const QuantizedActivations& x, int64_t i0,
                        const float* bias, float* y, int64_t y_stride) {
  constexpr int64_t kGroupBytes = kQ4_0 ? kQ4_0R16GroupBytes : kQ8R16GroupBytes;
  const int64_t blocks = x.k / kBlock;
  const int8_t* xq = x.q.data() + i0 * x.k;
  const float* xd = x.d.data() + i0 * blocks;
  alignas(64) int32_t c[2][kR * kGroupRows];
  alignas(64) int8_t codes[2][kBlock * kGroupRows];
  __m512 acc[kR];
  for (int r = 0; r < kR; ++r) acc[r] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    const uint8_t* g0 = gp + b * kGroupBytes;
    const uint8_t* g1 = g0 + kGroupBytes;
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(2, xq + b * kBlock, x.k);
    _tile_loadd(3, xq + (b + 1) * kBlock, x.k);
    if constexpr (kQ4_0) {
      UnpackQ4_0(g0 + 32, codes[0]);
      UnpackQ4_0(g1 + 32, codes[1]);
      _tile_loadd(4, codes[0], 64);
      _tile_loadd(5, codes[1], 64);
    } else {
      _tile_loadd(4, g0 + 32, 64);
      _tile_loadd(5, g1 + 32, 64);
    }
    _tile_dpbssd(0, 2, 4);
    _tile_dpbssd(1, 3, 5);
    _tile_stored(0, c[0], 64);
    _tile_stored(1, c[1], 64);
    Scale<kR>(c[0], g0, xd, blocks, b, acc);
    Scale<kR>(c[1], g1, xd, blocks, b + 1, acc);
  }
  if (b < blocks) {
    const uint8_t* g0 = gp + b * kGroupBytes;
    _tile_zero(0);
    _tile_loadd(2, xq + b * kBlock, x.k);
    if constexpr (kQ4_0) {
      UnpackQ4_0(g0 + 32, codes[0]);
      _tile_loadd(4, codes[0], 64);
    } else {
      _tile_loadd(4, g0 + 32, 64);
    }
    _tile_dpbssd(0, 2, 4);
    _tile_stored(0, c[0], 64);
    Scale<kR>(c[0], g0, xd, blocks, b, acc);
  }
  const __m512 bv = bias != nullptr ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
  for (int r = 0; r < kR; ++r) _mm512_storeu_ps(y + r * y_stride, _mm512_add_ps(acc[r], bv));
}

template <int kR, bool kQ4_0>
MOE_AMX_INT8 void Groups(const uint8_t* w, int64_t w_stride, int64_t n_rows,
                         const QuantizedActivations& x, int64_t i0, const float* bias, float* y,
                         int64_t y_stride) {
  for (int64_t g = 0; g < n_rows / kGroupRows; ++g) {
    Group<kR, kQ4_0>(w + g * kGroupRows * w_stride, x, i0,
                     bias != nullptr ? bias + g * kGroupRows : nullptr, y + g * kGroupRows,
                     y_stride);
  }
}

// f(std::integral_constant<int, rows>) for rows in [1, 16].
template <typename F, int... R>
void ForRows(int rows, const F& f, std::integer_sequence<int, R...>) {
  (void)((rows == R + 1 ? (f(std::integral_constant<int, R + 1>{}), true) : false) || ...);
}

template <bool kQ4_0>
MOE_AMX_INT8 void RowsAmx(const uint8_t* w, int64_t w_stride, int64_t n_rows,
                          const QuantizedActivations& x, int64_t i0, int rows, const float* bias,
                          float* y, int64_t y_stride) {
  const AmxTileConfig cfg = ConfigFor(rows);
  _tile_loadconfig(&cfg);
  ForRows(
      rows,
      [&](auto r) { Groups<r.value, kQ4_0>(w, w_stride, n_rows, x, i0, bias, y, y_stride); },
      std::make_integer_sequence<int, kAmxMaxRows>{});
  _tile_release();
}

}  // namespace

GgufSmallRowsFn SmallRows16Amx(DType dtype) {
  switch (dtype) {
    case DType::kQ8R16:
      return &RowsAmx<false>;
    case DType::kQ4_0R16:
      return &RowsAmx<true>;
    default:
      return nullptr;
  }
}

}  // namespace moe
