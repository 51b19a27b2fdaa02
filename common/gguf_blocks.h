// CPU reference decoding of GGUF (ggml) weight blocks to floats: the
// ground truth that block-reading kernels are tested against, and the
// conversion path for tensors converted at load (Checkpoint::FromGguf);
// and which of our DTypes holds each block type as it is.
//
// Each function decodes one block (ggml-common.h layouts, little-endian;
// common/gguf_types.h lists the sizes):
//   Q8_0  34 B / 32:  f16 d | int8 q[32]                  w = d * q
//   Q4_0  18 B / 32:  f16 d | u8 qs[16]                   w = d * (q - 8)
//   Q4_1  20 B / 32:  f16 d | f16 m | u8 qs[16]           w = d * q + m
//   Q5_0  22 B / 32:  f16 d | u32 qh | u8 qs[16]          w = d * (q - 16)
//   Q5_1  24 B / 32:  f16 d | f16 m | u32 qh | u8 qs[16]  w = d * q + m
//     4-bit blocks: byte j holds weight j (low nibble) and j + 16 (high);
//     Q5: bit j of qh is weight j's fifth bit.
//   Q4_K 144 B / 256: f16 d | f16 dmin | 12 B scales | qs[128]
//   Q5_K 176 B / 256: f16 d | f16 dmin | 12 B scales | qh[32] | qs[128]
//     8 sub-blocks of 32 with 6-bit scale s and min m packed in 12 bytes:
//     w = d * s * q - dmin * m. Sub-blocks 2c and 2c + 1 share qs[32c ..
//     32c + 32) (low and high nibbles); Q5_K's fifth bits are bits 2c and
//     2c + 1 of qh[l].
//   Q6_K 210 B / 256: ql[128] | qh[64] | int8 scales[16] | f16 d
//     16 sub-blocks of 16: w = d * scale * (q - 32), q 6 bits from a nibble
//     of ql and two bits of qh.
//   MXFP4 17 B / 32:  u8 e | u8 qs[16]   w = fp4(q) * 2^(e - 127)
//     (ggml's order: byte j holds weight j low, j + 16 high; e = 255 is
//     read as 2^128, as ggml does, not as NaN).
// Arithmetic is float, in the order ggml's reference dequantizers use, so
// results match them to the last bit for finite scales.
//
// Thread-safe: pure functions.
#ifndef MOECACHE_COMMON_GGUF_BLOCKS_H_
#define MOECACHE_COMMON_GGUF_BLOCKS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "common/gguf_types.h"

namespace moe {

void DequantizeQ8_0Block(const uint8_t* block, float* out);  // out: [32]
void DequantizeQ4_0Block(const uint8_t* block, float* out);  // out: [32]
void DequantizeQ4_1Block(const uint8_t* block, float* out);  // out: [32]
void DequantizeQ5_0Block(const uint8_t* block, float* out);  // out: [32]
void DequantizeQ5_1Block(const uint8_t* block, float* out);  // out: [32]
void DequantizeQ4_KBlock(const uint8_t* block, float* out);  // out: [256]
void DequantizeQ5_KBlock(const uint8_t* block, float* out);  // out: [256]
void DequantizeQ6_KBlock(const uint8_t* block, float* out);  // out: [256]
void DequantizeMxfp4Block(const uint8_t* block, float* out);  // out: [32]

// Whether DequantizeGguf handles `type`: the block types above and F32,
// F16, BF16.
bool CanDequantizeGguf(GgufType type);

// Byte offsets of the f16 fields in one block of a block dtype (d; m or
// dmin): {0} for kQ8 and Q4_0 / Q5_0, {0, 2} for Q4_1 / Q5_1 / Q4_K / Q5_K,
// {208} for Q6_K (the layouts above). For generators of valid blocks.
std::vector<int> GgufF16FieldOffsets(DType dtype);

// Decodes `n` consecutive weights of `type` (n / block_elems blocks, e.g.
// one row or a whole tensor) into out[0 .. n).
// INVALID_ARGUMENT when the type has no decoder here or n is negative or not
// a multiple of the type's block.
absl::Status DequantizeGguf(GgufType type,
                            const uint8_t* data,  // [n / block_elems, block_bytes]
                            int64_t n, float* out);  // [n]

// The DType that holds GGUF blocks of `type` as they are: Q8_0 -> kQ8 and
// Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K -> kQ4_0 .. kQ6K (the same
// bytes), MXFP4 -> kMxfp4 (the same bytes after RepackGgufMxfp4). nullopt
// for the plain types and the block types we have no kernel for.
std::optional<DType> HeldDTypeOfGguf(GgufType type);

// The inverse for kQ8 and the ggml block dtypes (nullopt otherwise,
// kMxfp4 included: its nibble order is ours, not ggml's).
std::optional<GgufType> GgufTypeOfDType(DType dtype);

// Rewrites `blocks` MXFP4 blocks from ggml's nibble order (byte j holds
// weights j and j + 16) into kMxfp4's (byte j holds weights 2j and 2j + 1),
// scale byte first in both: every weight keeps its value. dst may not
// overlap src.
void RepackGgufMxfp4(const uint8_t* src,  // [blocks, 17]
                     int64_t blocks,
                     uint8_t* dst);       // [blocks, 17]

}  // namespace moe

#endif  // MOECACHE_COMMON_GGUF_BLOCKS_H_
