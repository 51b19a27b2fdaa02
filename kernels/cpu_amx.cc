// bf16 products on AMX tiles (cpu_matmul.h, "bf16 products on AMX").
//
// The weights are the A tiles, read in place: 16 consecutive weight rows
// (outputs) by 32 k values, one TILELOADD with the row stride, so nothing is
// repacked at load. The activations are the B tiles: rounded to bf16 (as
// the vdpbf16ps path rounds them) and packed once per product in AMX's
// pair layout, block by block of 16 activation rows:
//   packed[(block * k / 2 + p) * 32 + 2 * t + e] = xb[(16 * block + t) * k + 2
//   * p + e]
// A C tile is then 16 outputs by up to 16 activation rows, accumulated over
// all of k by one TDPBF16PS per 32 k values, in order, from zero; the bias
// is added at the end.
//
// Why an output's bits depend on nothing but its row, its weight row and k
// (not the threads, the column split, the rows beside it in a tile, or how
// many activation rows come together): TDPBF16PS computes each element of
// C from that element's A row and B column alone (checked on this CPU by
// AmxTest.AnOutputsBitsDependOnItsRowAndColumnOnly), and every element runs
// the same sequence of instructions over k. Its internal arithmetic is not
// a sequence of IEEE additions (the products of one instruction are summed
// with a wider, truncating alignment; measured here, see docs/architecture.md),
// so the tests bound it against the float64 reference instead of matching
// an emulation bit for bit.
//
// Its own file, as cpu_bf16_dot.cc, for the target attributes and GCC 12's
// -Wuninitialized inside AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/amx_tiles.h"
#include "kernels/cpu_matmul.h"
#include "kernels/cpu_quant_matmul.h"

#define MOE_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw")))

namespace moe {
namespace {

constexpr int kRows = 16;  // outputs of an A tile, activation rows of a B tile
constexpr int64_t kDepth = 32;  // k values of one TDPBF16PS (16 pairs)

// Tiles: C 0-3 (A0 x B0, A1 x B0, A0 x B1, A1 x B1), A 4-5 (weight rows
// j .. j+15 and j+16 .. j+31), B 6-7 (two blocks of activation rows).
// `cols` activation rows per B block: 16, or fewer for the last block.
AmxTileConfig ConfigFor(int cols) {
  AmxTileConfig c;
  for (int t = 0; t < 4; ++t) c.Set(t, kRows, 4 * cols);
  for (int t = 4; t < 6; ++t) c.Set(t, kRows, 2 * kDepth);
  for (int t = 6; t < 8; ++t) c.Set(t, kDepth / 2, 4 * cols);
  return c;
}

// y[(i0 + t) * n + j0 + r] = c[r * 16 + t] + bias[j0 + r] for r < rows,
// t < cols. Output row by output row: each row's `rows` floats are one
// contiguous run (a cache line for a whole tile). Column by column, the 16
// rows' lines lie n floats apart, in one L1 set when n is a power of two
// (a 2048-token vocabulary: the 16-row lm head took 159 us against 51 at
// n = 2000), and every store missed.
inline void Scatter(const float* c, int rows, int cols, const float* bias,
                    float* y, int64_t n, int64_t i0, int64_t j0) {
  for (int t = 0; t < cols; ++t) {
    float* out = y + (i0 + t) * n + j0;
    for (int r = 0; r < rows; ++r) {
      out[r] = c[r * kRows + t] + (bias != nullptr ? bias[j0 + r] : 0.0f);
    }
  }
}

// One block of 16 or 32 weight rows (`w0`, `w1`, rows of k elements; w1
// null for 16) against one or two blocks of activation rows
// (`b0`, `b1`; b1 null for one), all of k.
template <bool kTwoA, bool kTwoB>
MOE_AMX void Block(const uint16_t* w0, const uint16_t* w1, const uint16_t* b0,
                   const uint16_t* b1, int64_t k, float* c /* [4][256] */) {
  _tile_zero(0);
  if (kTwoA) _tile_zero(1);
  if (kTwoB) _tile_zero(2);
  if (kTwoA && kTwoB) _tile_zero(3);
  const int64_t stride = k * 2;
  for (int64_t k0 = 0; k0 < k; k0 += kDepth) {
    _tile_loadd(4, w0 + k0, stride);
    if (kTwoA) _tile_loadd(5, w1 + k0, stride);
    _tile_loadd(6, b0 + k0 * kRows, 64);
    if (kTwoB) _tile_loadd(7, b1 + k0 * kRows, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (kTwoA) _tile_dpbf16ps(1, 5, 6);
    if (kTwoB) _tile_dpbf16ps(2, 4, 7);
    if (kTwoA && kTwoB) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  if (kTwoA) _tile_stored(1, c + 256, 64);
  if (kTwoB) _tile_stored(2, c + 512, 64);
  if (kTwoA && kTwoB) _tile_stored(3, c + 768, 64);
}

}  // namespace

bool AmxSupported() {
#if defined(__x86_64__)
  static const bool ok = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool tile = (edx >> 24) & 1, bf16 = (edx >> 22) & 1, int8 = (edx >> 25) & 1;
    if (!tile || !bf16 || !int8 || !Bf16DotSupported() || !Q8VnniSupported()) return false;
    // Linux hands out the tile data state only to a process that asks
    // (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, Linux 5.16 and later);
    // the permission holds for every thread of the process.
    constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

int64_t AmxPackedSize(int64_t m, int64_t k) {
  return (m + kRows - 1) / kRows * kRows * k;
}

void PackForAmx(const uint16_t* xb, int64_t m, int64_t k, uint16_t* out) {
  // Each (row, pair) is one 32-bit word: a transpose of [16, k / 2] words
  // per block of rows, zero past the last row.
  const int64_t pairs = k / 2;
  for (int64_t i0 = 0; i0 < m; i0 += kRows) {
    uint32_t* block = reinterpret_cast<uint32_t*>(out + i0 * k);
    const int64_t rows = std::min<int64_t>(kRows, m - i0);
    for (int64_t p = 0; p < pairs; ++p) {
      for (int64_t t = 0; t < rows; ++t) {
        std::memcpy(&block[p * kRows + t], xb + (i0 + t) * k + 2 * p, 4);
      }
      for (int64_t t = rows; t < kRows; ++t) block[p * kRows + t] = 0;
    }
  }
}

namespace {

// The activation row blocks [b_begin, b_end), `cols` rows each (16, or
// fewer for the last block), against the weight rows [n_begin, n_end).
MOE_AMX void OverRows(const uint16_t* packed, const MatMulArgs& a,
                      int64_t n_begin, int64_t n_end, int64_t b_begin,
                      int64_t b_end, int cols) {
  if (b_begin >= b_end) return;
  const auto* w = static_cast<const uint16_t*>(a.w);
  const int64_t k = a.k;
  alignas(64) float c[4 * 256];
  // Weight rows past a 16-row edge of the range, zero-padded to a tile
  // (their outputs are the same bits as inside a full tile).
  thread_local std::vector<uint16_t> tail;
  const AmxTileConfig cfg = ConfigFor(cols);
  _tile_loadconfig(&cfg);
  for (int64_t j = n_begin; j < n_end;) {
    const int64_t left = n_end - j;
    const uint16_t* w0 = w + j * k;
    int rows = kRows;
    if (left < kRows) {
      rows = static_cast<int>(left);
      tail.assign(static_cast<size_t>(kRows * k), 0);
      std::memcpy(tail.data(), w0, static_cast<size_t>(rows * k) * 2);
      w0 = tail.data();
    }
    const bool two_a = left >= 2 * kRows;
    for (int64_t bb = b_begin; bb < b_end;) {
      const uint16_t* b0 = packed + bb * kRows * k;
      const bool two_b = bb + 1 < b_end;
      if (two_a && two_b) {
        Block<true, true>(w0, w0 + kRows * k, b0, b0 + kRows * k, k, c);
      } else if (two_a) {
        Block<true, false>(w0, w0 + kRows * k, b0, nullptr, k, c);
      } else if (two_b) {
        Block<false, true>(w0, nullptr, b0, b0 + kRows * k, k, c);
      } else {
        Block<false, false>(w0, nullptr, b0, nullptr, k, c);
      }
      for (int bi = 0; bi < (two_b ? 2 : 1); ++bi) {
        const int64_t i0 = (bb + bi) * kRows;
        Scatter(c + bi * 512, rows, cols, a.bias, a.y, a.n, i0, j);
        if (two_a)
          Scatter(c + bi * 512 + 256, kRows, cols, a.bias, a.y, a.n, i0,
                  j + kRows);
      }
      bb += two_b ? 2 : 1;
    }
    j += two_a ? 2 * kRows : rows;
  }
}

}  // namespace

MOE_AMX void AmxBf16Columns(const uint16_t* packed, const MatMulArgs& a,
                            int64_t n_begin, int64_t n_end) {
  const int64_t full_blocks = a.m / kRows;
  const int last = static_cast<int>(a.m - full_blocks * kRows);
  OverRows(packed, a, n_begin, n_end, 0, full_blocks, kRows);
  if (last > 0)
    OverRows(packed, a, n_begin, n_end, full_blocks, full_blocks + 1, last);
  _tile_release();
}

}  // namespace moe
