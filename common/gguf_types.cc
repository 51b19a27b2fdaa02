#include "common/gguf_types.h"


#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace moe {
namespace {

// ggml-common.h's block structs, as (weights, bytes) per block. QK_K = 256.
constexpr GgufTypeInfo kTypes[] = {
    {GgufType::kF32, "F32", 1, 4},
    {GgufType::kF16, "F16", 1, 2},
    {GgufType::kQ4_0, "Q4_0", 32, 18},     // f16 d, 16 B nibbles
    {GgufType::kQ4_1, "Q4_1", 32, 20},     // f16 d, f16 m, 16 B nibbles
    {GgufType::kQ5_0, "Q5_0", 32, 22},     // f16 d, 4 B high bits, 16 B
    {GgufType::kQ5_1, "Q5_1", 32, 24},     // f16 d, f16 m, 4 B, 16 B
    {GgufType::kQ8_0, "Q8_0", 32, 34},     // f16 d, 32 int8
    {GgufType::kQ8_1, "Q8_1", 32, 36},     // f16 d, f16 s, 32 int8
    {GgufType::kQ2_K, "Q2_K", 256, 84},    // 16 + 64 + 2 f16
    {GgufType::kQ3_K, "Q3_K", 256, 110},   // 32 + 64 + 12 + f16
    {GgufType::kQ4_K, "Q4_K", 256, 144},   // 2 f16 + 12 + 128
    {GgufType::kQ5_K, "Q5_K", 256, 176},   // 2 f16 + 12 + 32 + 128
    {GgufType::kQ6_K, "Q6_K", 256, 210},   // 128 + 64 + 16 + f16
    {GgufType::kQ8_K, "Q8_K", 256, 292},   // f32 + 256 + 16 int16
    {GgufType::kIQ2_XXS, "IQ2_XXS", 256, 66},
    {GgufType::kIQ2_XS, "IQ2_XS", 256, 74},
    {GgufType::kIQ3_XXS, "IQ3_XXS", 256, 98},
    {GgufType::kIQ1_S, "IQ1_S", 256, 50},
    {GgufType::kIQ4_NL, "IQ4_NL", 32, 18},
    {GgufType::kIQ3_S, "IQ3_S", 256, 110},
    {GgufType::kIQ2_S, "IQ2_S", 256, 82},
    {GgufType::kIQ4_XS, "IQ4_XS", 256, 136},
    {GgufType::kI8, "I8", 1, 1},
    {GgufType::kI16, "I16", 1, 2},
    {GgufType::kI32, "I32", 1, 4},
    {GgufType::kI64, "I64", 1, 8},
    {GgufType::kF64, "F64", 1, 8},
    {GgufType::kIQ1_M, "IQ1_M", 256, 56},
    {GgufType::kBF16, "BF16", 1, 2},
    {GgufType::kTQ1_0, "TQ1_0", 256, 54},
    {GgufType::kTQ2_0, "TQ2_0", 256, 66},
    {GgufType::kMXFP4, "MXFP4", 32, 17},   // E8M0 byte, 16 B FP4 pairs
};

constexpr const char* kValueTypeNames[] = {
    "UINT8", "INT8",  "UINT16", "INT16", "UINT32", "INT32",  "FLOAT32",
    "BOOL",  "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64"};

}  // namespace

const GgufTypeInfo* FindGgufType(uint32_t raw) {
  for (const GgufTypeInfo& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == raw) return &t;
  }
  return nullptr;
}

const GgufTypeInfo& GgufTypeInfoOf(GgufType type) {
  const GgufTypeInfo* info = FindGgufType(static_cast<uint32_t>(type));
  MOE_CHECK(info != nullptr) << "unknown GgufType " << static_cast<uint32_t>(type);
  return *info;
}

std::string GgufTypeName(uint32_t raw) {
  const GgufTypeInfo* info = FindGgufType(raw);
  return info != nullptr ? std::string(info->name) : absl::StrCat("type ", raw);
}

bool IsKnownGgufValueType(uint32_t raw) {
  return raw < std::size(kValueTypeNames);
}

std::string GgufValueTypeName(uint32_t raw) {
  return IsKnownGgufValueType(raw) ? std::string(kValueTypeNames[raw])
                                   : absl::StrCat("type ", raw);
}

int GgufValueFixedSize(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      return 0;
  }
  return 0;
}

}  // namespace moe
