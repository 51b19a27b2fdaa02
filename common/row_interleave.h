// The CPU's row-interleaved held layouts (common/dtype.h): kQ4KR16, Q4_K
// blocks of 16 rows interleaved, and kQ4R16, our q4 blocks likewise; and
// the lossless conversions to and from the row-major formats
// (common/gguf_blocks.h, common/quant.h).
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
// kQ4R16 likewise: [rows / 16][cols / 64] group blocks of 576 bytes (16 x
// 36, the 16 rows' q4 blocks of those 64 columns):
//   [0, 32)    d[r] (f16)      [32, 64)   m[r] (f16)
//   [64, 576)  qs: for t = 0..7, 64 bytes at 64 + 64 t: row r's
//              qs[4t .. 4t + 4) at 4r (low nibbles: weights 4t..4t+3 of
//              the block's first 32, high: of its last 32).
//
// kQ8R16 likewise: [rows / 16][cols / 32] group blocks of 544 bytes (16 x
// 34, the 16 rows' q8 blocks of those 32 columns; GGUF's Q8_0 is q8):
//   [0, 32)    d[r] (f16)
//   [32, 544)  qs: for t = 0..7, 64 bytes at 32 + 64 t: row r's
//              qs[4t .. 4t + 4) at 4r (the signed codes as stored).
//
// kQ4_0R16 (ggml's Q4_0) likewise: [rows / 16][cols / 32] group blocks of
// 288 bytes (16 x 18):
//   [0, 32)    d[r] (f16)
//   [32, 288)  qs: for t = 0..3, 64 bytes at 32 + 64 t: row r's
//              qs[4t .. 4t + 4) at 4r (low nibbles: weights 4t..4t+3,
//              high: weights 16 + 4t .. 16 + 4t + 3).
//
// Thread-safe: pure functions.
#ifndef MOECACHE_COMMON_ROW_INTERLEAVE_H_
#define MOECACHE_COMMON_ROW_INTERLEAVE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace moe {

inline constexpr int64_t kQ4KR16Rows = 16;  // the row group of both layouts
inline constexpr int64_t kQ4KR16GroupBytes = 16 * 144;
inline constexpr int64_t kQ4R16GroupBytes = 16 * 36;
inline constexpr int64_t kQ8R16GroupBytes = 16 * 34;
inline constexpr int64_t kQ4_0R16GroupBytes = 16 * 18;

// The interleaved layout of a row-major dtype (kQ4K -> kQ4KR16, kQ4 ->
// kQ4R16, kQ8 -> kQ8R16, kQ4_0 -> kQ4_0R16), or `plain` itself when it has none; and the inverse.
DType InterleavedOf(DType plain);
DType RowMajorOf(DType interleaved);

// Q4_K [rows, cols] at src -> kQ4KR16 at dst (the same number of bytes;
// src and dst must not overlap). INVALID_ARGUMENT unless rows % 16 == 0
// and cols % 256 == 0.
absl::Status InterleaveQ4KRows16(const void* src, int64_t rows, int64_t cols,
                                 void* dst);
// The inverse: kQ4KR16 -> row-major Q4_K, byte for byte the original.
absl::Status DeinterleaveQ4KRows16(const void* src, int64_t rows, int64_t cols,
                                   void* dst);

// kQ4 [rows, cols] <-> kQ4R16, as the two above (cols % 64 == 0).
absl::Status InterleaveQ4Rows16(const void* src, int64_t rows, int64_t cols,
                                void* dst);
absl::Status DeinterleaveQ4Rows16(const void* src, int64_t rows, int64_t cols,
                                  void* dst);

// kQ8 [rows, cols] <-> kQ8R16, as the two above (cols % 32 == 0).
absl::Status InterleaveQ8Rows16(const void* src, int64_t rows, int64_t cols,
                                void* dst);
absl::Status DeinterleaveQ8Rows16(const void* src, int64_t rows, int64_t cols,
                                  void* dst);

// The interleaving of `interleaved`'s row-major dtype into it, and back,
// for any of the layouts (INVALID_ARGUMENT for other dtypes).
absl::Status InterleaveRows16(DType interleaved, const void* src, int64_t rows,
                              int64_t cols, void* dst);
absl::Status DeinterleaveRows16(DType interleaved, const void* src,
                                int64_t rows, int64_t cols, void* dst);

// The held dtype of a [rows, cols] matrix held as `held` by a loader whose
// CPU prefers the interleaved layouts (`interleave`): InterleavedOf(held)
// for whole 16-row groups of whole blocks, else `held`.
DType InterleavedHeld(DType held, int64_t rows, int64_t cols, bool interleave);

// Row `r` (0..15) of one group block `g` (2304 bytes) as its Q4_K block
// (144 bytes) at `out`: for references, tests and the scalar kernel.
void Q4KR16RowBlock(const uint8_t* g, int r, uint8_t* out);
// Row `r` of one kQ4R16 group block (576 bytes) as its q4 block (36 bytes).
void Q4R16RowBlock(const uint8_t* g, int r, uint8_t* out);
// Row `r` of one kQ8R16 group block (544 bytes) as its q8 block (34 bytes).
void Q8R16RowBlock(const uint8_t* g, int r, uint8_t* out);
// Row `r` of one kQ4_0R16 group block (288 bytes) as its Q4_0 block (18
// bytes).
void Q4_0R16RowBlock(const uint8_t* g, int r, uint8_t* out);

}  // namespace moe

#endif  // MOECACHE_COMMON_ROW_INTERLEAVE_H_
