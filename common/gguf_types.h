// The numbered types of the GGUF format (llama.cpp / ggml): the element
// types of tensors (ggml_type, with their block layouts) and the types of
// metadata values (gguf_type).
//
// A tensor of a block type stores each row (ggml's dimension 0, the
// innermost) as row_length / block_elems blocks of block_bytes bytes, so a
// row's length must be a multiple of block_elems. The sizes below are the
// published ggml layouts (ggml-common.h), e.g. Q4_K: 256 weights in 144
// bytes (f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of
// nibbles); common/gguf_blocks.h decodes the ones we compute with.
//
// Thread-safe: constant tables and pure functions.
#ifndef MOECACHE_COMMON_GGUF_TYPES_H_
#define MOECACHE_COMMON_GGUF_TYPES_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace moe {

// ggml_type values as written in GGUF tensor infos. Gaps (4, 5, 31-33,
// 36-38) are types ggml removed; they are unknown to the reader.
enum class GgufType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

struct GgufTypeInfo {
  GgufType type;
  absl::string_view name;  // as llama.cpp prints it: "Q4_K", "BF16"
  int64_t block_elems;     // weights per block (1 for plain types)
  int64_t block_bytes;     // bytes per block
};

// The layout of ggml type number `raw`, or nullptr when the reader does not
// know it (a removed or newer type).
const GgufTypeInfo* FindGgufType(uint32_t raw);

// Layout of a known type. REQUIRES: `type` is one of the enumerators.
const GgufTypeInfo& GgufTypeInfoOf(GgufType type);

// "Q4_K", or "type 77" for an unknown number.
std::string GgufTypeName(uint32_t raw);

// gguf_type: the type tag of a metadata value (and of an array's elements).
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// True for the 13 tags above.
bool IsKnownGgufValueType(uint32_t raw);

// "UINT32", "STRING", ...; "type N" for unknown tags.
std::string GgufValueTypeName(uint32_t raw);
inline std::string GgufValueTypeName(GgufValueType t) {
  return GgufValueTypeName(static_cast<uint32_t>(t));
}

// Encoded size of a fixed-size value (1 for BOOL); 0 for STRING and ARRAY,
// whose size depends on their contents. REQUIRES: a known tag.
int GgufValueFixedSize(GgufValueType t);

inline bool IsGgufIntegerType(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
      return true;
    default:
      return false;
  }
}

inline bool IsGgufFloatType(GgufValueType t) {
  return t == GgufValueType::kFloat32 || t == GgufValueType::kFloat64;
}

}  // namespace moe

#endif  // MOECACHE_COMMON_GGUF_TYPES_H_
