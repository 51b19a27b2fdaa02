// kQ4KR16 (common/dtype.h): Q4_K blocks of 16 rows interleaved, the CPU's
// held layout for Q4_K matrices, and the lossless conversions to and from
// row-major Q4_K (common/gguf_blocks.h).
//
// A [rows, cols] kQ4KR16 matrix is rows / 16 row groups one after another,
// each cols / 256 "group blocks" of 2304 bytes (16 x 144: the same bytes
// as the 16 rows' Q4_K blocks of those 256 columns, rearranged). So row
// group g starts where row 16 g of the Q4_K matrix does, and a split of
// the rows at a multiple of 16 is a split of the bytes. Group block of
// rows r = 0..15, from their Q4_K blocks (d, dmin, 6-bit scale s[j] and
// min m[j] of sub-block j = 0..7, qs[128]):
//   [0, 32)      d[r] (f16)
//   [32, 64)     dmin[r] (f16)
//   [64, 128)    scales, low nibbles      } each of 128 "targets" t =
//   [128, 160)   scales, top two bits     } 32 p + 2 r + e holds s[2p + e]
//   [160, 224)   mins, low nibbles        } of row r (p = 0..3, e = 0, 1);
//   [224, 256)   mins, top two bits       } m[...] likewise
//       low-nibble byte i: target i (low nibble), target 64 + i (high);
//       top-bits byte i: bits 2h, 2h + 1 are target 32 h + i's bits 4-5.
//   [256, 2304)  qs: for c = 0..3, t = 0..7, 64 bytes at 256 + 64 (8c + t):
//                row r's qs[32c + 4t .. 32c + 4t + 4) at 4r.
// So one 64-byte load gives a 32-bit lane per row: 4 weights of sub-block
// 2c (low nibbles) and the same 4 positions of sub-block 2c + 1 (high),
// and one widening of a target half gives each row's scale pair as an
// int32 lane (kernels/cpu_gguf_quant_avx512.cc).
//
// Thread-safe: pure functions.
#ifndef MOECACHE_COMMON_GGUF_INTERLEAVE_H_
#define MOECACHE_COMMON_GGUF_INTERLEAVE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace moe {

inline constexpr int64_t kQ4KR16Rows = 16;
inline constexpr int64_t kQ4KR16GroupBytes = 16 * 144;

// Q4_K [rows, cols] at src -> kQ4KR16 at dst (the same number of bytes;
// src and dst must not overlap). INVALID_ARGUMENT unless rows % 16 == 0
// and cols % 256 == 0.
absl::Status InterleaveQ4KRows16(const void* src, int64_t rows, int64_t cols,
                                 void* dst);
// The inverse: kQ4KR16 -> row-major Q4_K, byte for byte the original.
absl::Status DeinterleaveQ4KRows16(const void* src, int64_t rows, int64_t cols,
                                   void* dst);

// The held dtype of a [rows, cols] matrix held as `held` by a loader whose
// CPU prefers the interleaved layout (`interleave`): kQ4KR16 for Q4_K of
// whole 16-row groups, else `held`.
inline DType InterleavedHeld(DType held, int64_t rows, int64_t cols,
                             bool interleave) {
  return interleave && held == DType::kQ4K && rows % kQ4KR16Rows == 0 &&
                 cols % 256 == 0
             ? DType::kQ4KR16
             : held;
}

// Row `r` (0..15) of one group block `g` (2304 bytes) as its Q4_K block
// (144 bytes) at `out`: for references, tests and the scalar kernel.
void Q4KR16RowBlock(const uint8_t* g, int r, uint8_t* out);

}  // namespace moe

#endif  // MOECACHE_COMMON_GGUF_INTERLEAVE_H_
