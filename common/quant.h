// The block-quantized weight formats of routed experts (DType::kQ8, kQ4):
// layouts, quantization (the daemon's --expert-format, at load) and scalar
// dequantization (references, scalar kernels).
//
// A [rows, cols] matrix is stored row by row; a row is cols / G blocks, each
// covering G consecutive weights of the row (G = QuantGroupSize):
//
//   kQ8 (G = 32, 34 bytes, 8.5 bits/weight): f16 d | int8 q[32]
//       w[i] = d * q[i];  d = max|w| / 127 (llama.cpp's Q8_0)
//   kQ4 (G = 64, 36 bytes, 4.5 bits/weight): f16 d | f16 m | uint8 qs[32]
//       qs[j] = q[j] | q[j + 32] << 4;  w[i] = d * q[i] + m, q in [0, 15]
//       d = (max - min) / 15, m = min (asymmetric, like llama.cpp's Q4_1 and
//       GPTQ/AWQ int4 with a zero point, with a 64-weight group)
//   kMxfp4 (G = 32, 17 bytes, 4.25 bits/weight): uint8 e | uint8 qs[16]
//       w[2j] = fp4(qs[j] & 15) * 2^(e - 127), w[2j+1] from qs[j] >> 4
//       (OCP MXFP4 as checkpoints store it; common/mxfp4.h), quantized from
//       floats by QuantizeMxfp4Row's rule
//
// The nibble order (low nibbles: first half of the group) lets a 256-bit
// load yield 32 + 32 weights with one mask and one shift. Scales are stored
// as f16 and the codes are computed against the rounded f16 values, so the
// stored block is the best one its scales allow.
//
// Thread-safe: pure functions.
#ifndef MOECACHE_COMMON_QUANT_H_
#define MOECACHE_COMMON_QUANT_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"

namespace moe {

inline constexpr int64_t kQ8Group = 32;
inline constexpr int64_t kQ8BlockBytes = 34;
inline constexpr int64_t kQ4Group = 64;
inline constexpr int64_t kQ4BlockBytes = 36;
inline constexpr int64_t kMxfp4BlockBytes = 17;

// The --expert-format names: "bf16" (kBF16), "q8" (kQ8), "q4" (kQ4),
// "mxfp4" (kMxfp4).
// INVALID_ARGUMENT naming the choices otherwise.
absl::StatusOr<DType> ParseExpertFormat(absl::string_view name);
// The inverse ("bf16", "q8", "q4"); DTypeName for other dtypes.
std::string ExpertFormatName(DType format);
// The formats of a model's experts (one ExpertDTypes per MoE layer) in
// words: one ExpertFormatName when they all agree, else the distinct names
// in order of first appearance joined by "+" ("Q4_K+Q6_K"); "none" for none.
std::string ExpertFormatsName(absl::Span<const ExpertDTypes> formats);
// Of `formats`, the dtype of most bytes per weight (the first such);
// REQUIRES: !formats.empty().
DType WidestDType(absl::Span<const ExpertDTypes> formats);

// Converts a [rows, cols] weight of dtype `from` (F32/F16/BF16, or a block
// format, decoded by DequantizeRow) into `to` (a float dtype or a block
// format QuantizeRow writes; from == to copies the bytes) at dst
// (WeightBytes(to, rows, cols) bytes). INVALID_ARGUMENT as QuantizeRow.
absl::Status ConvertWeights(const void* src, DType from, int64_t rows,
                            int64_t cols, DType to, void* dst);

// Quantizes one row of `cols` floats into cols / G blocks of `format`.
// INVALID_ARGUMENT if `format` is not kQ8/kQ4/kMxfp4 (the ggml block
// dtypes come from files only), cols is not a multiple of the
// group, or a value is not finite.
// REQUIRES: dst holds WeightBytes(format, 1, cols) bytes.
absl::Status QuantizeRow(const float* src, int64_t cols, DType format,
                         void* dst);

// Dequantizes one row (the inverse layout of QuantizeRow; the ggml block
// dtypes through common/gguf_blocks.h). REQUIRES: IsQuantDType(format) and
// cols a multiple of its group.
void DequantizeRow(const void* src, DType format, int64_t cols, float* dst);

// Element `i` of a matrix of `format` (row-major, whole rows of blocks), as a
// float. REQUIRES: format is kQ8, kQ4 or kMxfp4 (DequantizeRow reads the
// others).
inline float DequantizeElement(const void* data, DType format, int64_t i) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (format == DType::kMxfp4) {
    static constexpr float kFp4[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,
                                       4.0f,  6.0f,  -0.0f, -0.5f, -1.0f, -1.5f,
                                       -2.0f, -3.0f, -4.0f, -6.0f};
    const uint8_t* b = p + (i / 32) * kMxfp4BlockBytes;
    const uint8_t byte = b[1 + (i % 32) / 2];
    return std::ldexp(kFp4[i % 2 == 0 ? (byte & 15) : (byte >> 4)],
                      static_cast<int>(b[0]) - 127);
  }
  uint16_t d;
  if (format == DType::kQ8) {
    const uint8_t* b = p + (i / kQ8Group) * kQ8BlockBytes;
    std::memcpy(&d, b, 2);
    return HalfToFloat(d) * static_cast<float>(static_cast<int8_t>(b[2 + i % kQ8Group]));
  }
  const uint8_t* b = p + (i / kQ4Group) * kQ4BlockBytes;
  uint16_t m;
  std::memcpy(&d, b, 2);
  std::memcpy(&m, b + 2, 2);
  const int64_t j = i % kQ4Group;
  const uint8_t byte = b[4 + (j % 32)];
  const int q = j < 32 ? (byte & 0x0f) : (byte >> 4);
  return HalfToFloat(d) * static_cast<float>(q) + HalfToFloat(m);
}

}  // namespace moe

#endif  // MOECACHE_COMMON_QUANT_H_
