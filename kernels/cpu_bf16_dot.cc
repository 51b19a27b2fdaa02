// bf16 weights times bf16-rounded activations with AVX512_BF16's vdpbf16ps
// (cpu_matmul.h, "bf16 products on AVX512_BF16"): 32 products per
// instruction where the f32 kernels' FMA does 16, read straight from the
// weights without widening.
//
// Its own file, as cpu_quant_vnni.cc, because GCC 12's avx512fintrin.h
// trips -Wuninitialized inside its intrinsics' undefined pass-through
// operands.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu_matmul.h"

#define MOE_BF16_DOT __attribute__((target("avx512f,avx512bw,avx512bf16")))

namespace moe {
namespace {

constexpr int64_t kChunk = 32;  // bf16 pairs of one vdpbf16ps: 16 lanes x 2

MOE_BF16_DOT inline __m512bh LoadBh(const uint16_t* p) {
  __m512bh v;
  const __m512i bits = _mm512_loadu_si512(p);
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

// y[i0 + r, j0 + c] (+)= x row i0 + r . W row j0 + c over [k0, k1), for
// r < MR, c < NR: the arithmetic of every output (cpu_matmul.h).
template <int MR, int NR>
MOE_BF16_DOT void Tile(const uint16_t* xb, const MatMulArgs& a, int64_t i0,
                       int64_t j0, int64_t k0, int64_t k1) {
  const auto* w = static_cast<const uint16_t*>(a.w);
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  int64_t kk = k0;
  for (; kk + kChunk <= k1; kk += kChunk) {
    __m512bh wv[NR];
#pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) wv[c] = LoadBh(w + (j0 + c) * a.k + kk);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512bh xv = LoadBh(xb + (i0 + r) * a.k + kk);
#pragma GCC unroll 8
      for (int c = 0; c < NR; ++c)
        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < NR; ++c) {
      float s = _mm512_reduce_add_ps(acc[r][c]);
      for (int64_t t = kk; t < k1; ++t) {
        s += BF16ToFloat(xb[(i0 + r) * a.k + t]) *
             BF16ToFloat(w[(j0 + c) * a.k + t]);
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

constexpr int kMr = 4, kNr = 4;

template <int MR>
MOE_BF16_DOT void RowBlock(const uint16_t* xb, const MatMulArgs& a, int64_t i0,
                           int64_t n_begin, int64_t n_end, int64_t k0,
                           int64_t k1) {
  int64_t j = n_begin;
  for (; j + kNr <= n_end; j += kNr) Tile<MR, kNr>(xb, a, i0, j, k0, k1);
  for (; j < n_end; ++j) Tile<MR, 1>(xb, a, i0, j, k0, k1);
}

// Fewer rows than a tile (decode): one W row at a time over all of k, so a
// core streams one sequential run of memory (as the f32 kernels' RowStreams).
template <int MR>
MOE_BF16_DOT void RowStreams(const uint16_t* xb, const MatMulArgs& a,
                             int64_t n_begin, int64_t n_end) {
  for (int64_t j = n_begin; j < n_end; ++j) {
    for (int64_t k0 = 0; k0 < a.k; k0 += kMatMulKBlock) {
      Tile<MR, 1>(xb, a, 0, j, k0, std::min(a.k, k0 + kMatMulKBlock));
    }
  }
}

}  // namespace

MOE_BF16_DOT void Bf16DotColumns(const uint16_t* xb, const MatMulArgs& a,
                                 int64_t n_begin, int64_t n_end) {
  if (a.k > 0 && a.m < kMr) {
    switch (a.m) {
      case 1:
        return RowStreams<1>(xb, a, n_begin, n_end);
      case 2:
        return RowStreams<2>(xb, a, n_begin, n_end);
      case 3:
        return RowStreams<3>(xb, a, n_begin, n_end);
      default:
        break;
    }
  }
  const int64_t k_end = std::max<int64_t>(a.k, 1);  // k == 0 still writes bias
  for (int64_t k0 = 0; k0 < k_end; k0 += kMatMulKBlock) {
    const int64_t k1 = std::min(a.k, k0 + kMatMulKBlock);
    int64_t i = 0;
    for (; i + kMr <= a.m; i += kMr)
      RowBlock<kMr>(xb, a, i, n_begin, n_end, k0, k1);
    switch (a.m - i) {
      case 3:
        RowBlock<3>(xb, a, i, n_begin, n_end, k0, k1);
        break;
      case 2:
        RowBlock<2>(xb, a, i, n_begin, n_end, k0, k1);
        break;
      case 1:
        RowBlock<1>(xb, a, i, n_begin, n_end, k0, k1);
        break;
      default:
        break;
    }
  }
}

MOE_BF16_DOT void RoundToBf16(const float* x, int64_t count, uint16_t* out) {
  const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff),
                inf = _mm512_set1_epi32(0x7f800000);
  const __m512i quiet = _mm512_set1_epi32(0x40);
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m512i u = _mm512_loadu_si512(x + i);
    // FloatToBF16: u + 0x7fff + bit 16, then the top half; a NaN keeps its
    // top bits with the quiet bit set.
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(
            u, _mm512_add_epi32(
                   half, _mm512_and_si512(_mm512_srli_epi32(u, 16), one))),
        16);
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
    const __m512i v =
        _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(u, 16), quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm512_cvtepi32_epi16(v));
  }
  for (; i < count; ++i) out[i] = FloatToBF16(x[i]);
}

namespace {
// -1: $MOE_BF16_DOT decides; 0 / 1: SetBf16DotForTest.
std::atomic<int> g_bf16_dot_forced{-1};
}  // namespace

bool Bf16DotSupported() {
#if defined(__x86_64__)
  static const bool cpu = __builtin_cpu_supports("avx512bf16") &&
                          __builtin_cpu_supports("avx512bw");
  // Read once: this runs for every product (a getenv each was ~1% of a
  // batched decode step).
  static const bool env_off = [] {
    const char* env = std::getenv("MOE_BF16_DOT");
    return env != nullptr && std::strcmp(env, "0") == 0;
  }();
  const int forced = g_bf16_dot_forced.load(std::memory_order_relaxed);
  return cpu && (forced >= 0 ? forced == 1 : !env_off);
#else
  return false;
#endif
}

void SetBf16DotForTest(std::optional<bool> on) {
  g_bf16_dot_forced.store(on.has_value() ? (*on ? 1 : 0) : -1, std::memory_order_relaxed);
}

bool UsesBf16Dot(DType dtype, SimdLevel level) {
  return dtype == DType::kBF16 && AtLeastAvx512(level) && Bf16DotSupported();
}

bool UsesAmx(DType dtype, SimdLevel level, int64_t k) {
  return level == SimdLevel::kAmx && UsesBf16Dot(dtype, level) && k > 0 && k % 32 == 0 &&
         AmxSupported();
}

}  // namespace moe
