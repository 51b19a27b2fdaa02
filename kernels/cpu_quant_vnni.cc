// The AVX-512 VNNI q8 and q4 kernels (see cpu_quant_matmul.h): their own
// file because GCC 12's avx512fintrin.h trips -Wuninitialized inside
// _mm512_inserti64x4 / _mm512_cvtepi32_ps (their undefined pass-through
// operands), as in cpu_matmul_avx512.cc.
//
// vpdpbusd covers 64 activations per 512-bit instruction: two q8 blocks, or
// one q4 block (its low nibbles against the first group, its high nibbles
// against the second); lane l (4 bytes) sums into int32 lane l exactly.
// q4 runs up to kVnniMaxRows activation rows per pass over a weight row: a
// block is loaded and unpacked once for all of them (the prompt path), and
// each row's sums keep the order they have alone.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "common/quant.h"
#include "kernels/cpu_quant_matmul.h"

#define MOE_QUANT_VNNI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx2,fma,f16c")))

namespace moe {
namespace {

template <int MR>
struct RowPointers {
  const int8_t* q[MR];
  const float* lane_d[MR];
  const float* block_sd[MR];
};

template <int MR>
MOE_QUANT_VNNI inline RowPointers<MR> RowsOf(const VnniActivations& x, int64_t i0) {
  RowPointers<MR> p;
  for (int r = 0; r < MR; ++r) {
    p.q[r] = x.q + (i0 + r) * x.k;
    p.lane_d[r] = x.lane_d + (i0 + r) * (x.k / 4);
    p.block_sd[r] = x.block_sd + (i0 + r) * (x.k / kQ4Group);
  }
  return p;
}

inline uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Two q8 blocks per step, one in each 256-bit half of a register; vpdpbusd
// sums u8 x s8 quadruples straight into int32 lanes (one instruction where
// AVX2 needs maddubs + madd), so |w| meets x carrying w's sign. The
// activations are in [-127, 127], so negating them never overflows, and a
// weight code of -128 (GGUF Q8_0 files may hold one) reads as u8 128.
MOE_QUANT_VNNI inline __m512i SignedDot2(__m512i wv, __m512i xv) {
  const __mmask64 neg = _mm512_movepi8_mask(wv);
  const __m512i sx = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(wv), sx);
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

// q4 block g (at `blk`) against every row's activations, into acc (the
// block's parity) and macc[parity] (its min term). The low nibbles sit in
// the lower 256 bits, the high ones (shifted down) in the upper; the f16
// scale is broadcast and widened in two instructions, so the scale work
// per row is one multiply by the prepared lane scales.
template <int MR>
MOE_QUANT_VNNI inline void Q4Block(const uint8_t* blk, int64_t g, const RowPointers<MR>& x,
                                   __m512 (&acc)[MR], float (&macc)[MR]) {
  const __m512i bytes =
      _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 4)));
  const __m512i codes = _mm512_and_si512(_mm512_mask_srli_epi16(bytes, 0xffff0000u, bytes, 4),
                                         _mm512_set1_epi8(0x0f));
  const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<int16_t>(Load16(blk))));
  const float m = _cvtsh_ss(Load16(blk + 2));
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
    const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes,
                                          _mm512_loadu_si512(x.q[r] + kQ4Group * g));
    const __m512 scale = _mm512_mul_ps(d, _mm512_loadu_ps(x.lane_d[r] + 16 * g));
    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc[r]);
    macc[r] += m * x.block_sd[r][g];
  }
}

// Even blocks into acc0 / macc0, odd ones into acc1 / macc1.
template <int MR>
MOE_QUANT_VNNI void Q4Rows(const uint8_t* w, const VnniActivations& x, int64_t i0, float bias,
                           float* y, int64_t y_stride) {
  const RowPointers<MR> xr = RowsOf<MR>(x, i0);
  const int64_t groups = x.k / kQ4Group;
  __m512 acc0[MR], acc1[MR];
  float macc0[MR], macc1[MR];
  for (int r = 0; r < MR; ++r) {
    acc0[r] = acc1[r] = _mm512_setzero_ps();
    macc0[r] = macc1[r] = 0.0f;
  }
  int64_t g = 0;
  for (; g + 2 <= groups; g += 2) {
    Q4Block<MR>(w + g * kQ4BlockBytes, g, xr, acc0, macc0);
    Q4Block<MR>(w + (g + 1) * kQ4BlockBytes, g + 1, xr, acc1, macc1);
  }
  if (g < groups) Q4Block<MR>(w + g * kQ4BlockBytes, g, xr, acc0, macc0);
  for (int r = 0; r < MR; ++r) {
    y[r * y_stride] =
        _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r])) + (macc0[r] + macc1[r]) + bias;
  }
}

template <void (*K1)(const uint8_t*, const VnniActivations&, int64_t, float, float*, int64_t),
          void (*K2)(const uint8_t*, const VnniActivations&, int64_t, float, float*, int64_t),
          void (*K3)(const uint8_t*, const VnniActivations&, int64_t, float, float*, int64_t),
          void (*K4)(const uint8_t*, const VnniActivations&, int64_t, float, float*, int64_t)>
void RowsDispatch(const uint8_t* w, const VnniActivations& x, int64_t i0, int rows, float bias,
                  float* y, int64_t y_stride) {
  switch (rows) {
    case 1: return K1(w, x, i0, bias, y, y_stride);
    case 2: return K2(w, x, i0, bias, y, y_stride);
    case 3: return K3(w, x, i0, bias, y, y_stride);
    default: return K4(w, x, i0, bias, y, y_stride);
  }
}

// 32 floats -> codes (clamped to +-127, rounded to nearest even as
// std::nearbyint does in the default mode) and their sum; bit for bit the
// scalar QuantizeActivations.
MOE_QUANT_VNNI inline int32_t QuantizeGroup(const float* xs, int8_t* q, float* d_out,
                                            float* amax_out, bool ggml) {
  const __m512 a = _mm512_loadu_ps(xs), b = _mm512_loadu_ps(xs + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  *d_out = ActScale32(amax, ggml);
  *amax_out = amax;
  const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
  const __m512i lim = _mm512_set1_epi32(127);
  const __m512i qa = _mm512_max_epi32(
      _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(a, inv)), lim), _mm512_sub_epi32(
          _mm512_setzero_si512(), lim));
  const __m512i qb = _mm512_max_epi32(
      _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(b, inv)), lim), _mm512_sub_epi32(
          _mm512_setzero_si512(), lim));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(qa));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(qb));
  return _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
}

}  // namespace

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
    const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(wv, wv),
                                          _mm256_sign_epi8(xv, wv));
    tail = static_cast<float>(_mm512_reduce_add_epi32(_mm512_zextsi256_si512(p))) *
           (_cvtsh_ss(Load16(blk)) * xd[b]);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + tail;
}

VnniRowsFn Q4RowsVnni() { return &RowsDispatch<&Q4Rows<1>, &Q4Rows<2>, &Q4Rows<3>, &Q4Rows<4>>; }

MOE_QUANT_VNNI void QuantizeActivationsAvx512(const float* x, int64_t m, int64_t k, int8_t* q,
                                              float* d, float* sd, int32_t* s,
                                              ActRounding rounding) {
  const int64_t groups = m * (k / kActGroup);
  for (int64_t g = 0; g < groups; ++g) {
    float amax = 0.0f;
    const int32_t sum = QuantizeGroup(x + g * kActGroup, q + g * kActGroup, d + g, &amax,
                                      rounding != ActRounding::kF32);
    s[g] = sum;
    sd[g] = rounding == ActRounding::kGgmlQ8_1 ? ActSum32(amax, sum)
                                               : d[g] * static_cast<float>(sum);
  }
}

void PrepareVnniLanes(const QuantizedActivations& x, float* lane_d, float* block_sd) {
  const int64_t groups = x.m * x.k / kActGroup;  // even: k is whole q4 blocks
  for (int64_t g = 0; g < groups; ++g) std::fill_n(lane_d + 8 * g, 8, x.d[g]);
  for (int64_t b = 0; 2 * b < groups; ++b) block_sd[b] = x.sd[2 * b] + x.sd[2 * b + 1];
}

bool Q8VnniSupported() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

}  // namespace moe
