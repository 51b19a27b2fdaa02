// Quantizing floats to GGUF (ggml) weight blocks, the layouts that
// common/gguf_blocks.h decodes: for writing GGUF files (moectl make-model
// --gguf) and tests.
//
// The schemes are the simple round-to-nearest ones of our numpy reference,
// tests/reference/gguf_quants.py, not llama.cpp's scale search: every field
// of a block is filled (scales, minimums, high bits), and the dequantized
// block is close to the input, not as close as llama.cpp's. Per block of
// weights x (a = max |x|, m = the x of largest magnitude, first of equals):
//   Q8_0  d = f16(a / 127)                 q = clamp(round(x / d), -128, 127)
//   Q4_0  d = f16(m / -8)                  q = clamp(round(x / d) + 8, 0, 15)
//   Q5_0  d = f16(m / -16)                 q = clamp(round(x / d) + 16, 0, 31)
//   Q4_1  d = f16((max - min) / 15), m = f16(min)  q = clamp(round((x - m) / d), 0, 15)
//   Q5_1  as Q4_1 over 31 levels
//   Q4_K / Q5_K  per sub-block of 32: min_s = max(0, -min), scale_s =
//        (max + min_s) / (levels - 1); d = f16(max scale_s / 63), dmin =
//        f16(max min_s / 63), 6-bit sc_s = round(scale_s / d), mn_s =
//        round(min_s / dmin); q = clamp(round((x + dmin mn_s) / (d sc_s)))
//   Q6_K  per sub-block of 16: scale_s = m_s / -32; d = f16(max |scale_s| /
//        127), sc_s = round(scale_s / d) (int8), q = clamp(round(x / (d
//        sc_s)) + 32, 0, 63)
//   MXFP4 QuantizeMxfp4Row (common/mxfp4.h: the exponent that brings a
//        within 6, each weight the nearest FP4 value, ties to the even
//        code), in ggml's nibble order.
// A zero scale gives the block's neutral code. The error stays within half
// a step (a whole one for the clamped top codes) while the f16 scales are
// normal numbers; a block of tiny weights (Q6_K's d is max / 4064: below
// about 0.25 its d is an f16 subnormal) loses precision with them, as
// ggml's blocks do. round() is to nearest, ties
// to even (numpy's), f16() rounds to nearest even from double, and all
// arithmetic is double in the reference's order, so that blocks are byte
// for byte the reference's (tests/engine/gguf_make_model_test.cc checks
// it). Known differences, both MXFP4's and both decoding as near to the
// input: at an exact tie between two FP4 values the reference takes the
// lower code, and an all-zero group's exponent byte is 127 here, 0 there.
//
// Thread-safe: pure functions.
#ifndef MOECACHE_COMMON_GGUF_QUANTIZE_H_
#define MOECACHE_COMMON_GGUF_QUANTIZE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/gguf_types.h"

namespace moe {

// The largest magnitude QuantizeGguf takes: f16's largest finite value,
// which keeps every block scale a finite f16.
inline constexpr float kGgufQuantizeMaxAbs = 65504.0f;

// Whether QuantizeGguf writes `type`: F32, F16, BF16 (converted, rounding
// to nearest even) and Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K,
// MXFP4 (above).
bool CanQuantizeGguf(GgufType type);

// Writes `n` weights as n / block_elems blocks of `type`
// (GgufTypeInfoOf(type).block_bytes each). INVALID_ARGUMENT when the type is
// not written here, n is negative or not a multiple of the block, or a
// weight is not finite or exceeds kGgufQuantizeMaxAbs in magnitude.
absl::Status QuantizeGguf(GgufType type,
                          const float* x,  // [n]
                          int64_t n,
                          uint8_t* out);   // [n / block_elems, block_bytes]

// The type a row of `row_length` weights gets when `wanted` is asked for,
// as llama.cpp's quantizer decides: `wanted` when the row is whole blocks
// of it; else, for a K-quant, the 32-weight type llama.cpp falls back to
// (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0) when the row is whole blocks
// of 32; else F32 (llama.cpp writes F16 there; F32 keeps the weights).
// REQUIRES: row_length >= 1.
GgufType GgufTypeForRow(GgufType wanted, int64_t row_length);

}  // namespace moe

#endif  // MOECACHE_COMMON_GGUF_QUANTIZE_H_
