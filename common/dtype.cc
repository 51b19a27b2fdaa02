#include "common/dtype.h"

#include <array>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace moe {
namespace {

struct DTypeEntry {
  DType dtype;
  absl::string_view name;
  size_t size;
};

// Indexed by the enum's value.
constexpr std::array<DTypeEntry, 29> kDTypes = {{
    {DType::kF32, "F32", 4},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kBool, "BOOL", 1},
    {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},
    {DType::kU16, "U16", 2},
    {DType::kI16, "I16", 2},
    {DType::kU32, "U32", 4},
    {DType::kI32, "I32", 4},
    {DType::kU64, "U64", 8},
    {DType::kI64, "I64", 8},
    {DType::kF64, "F64", 8},
    {DType::kQ8, "Q8", 0},
    {DType::kQ4, "Q4", 0},
    {DType::kF8E4M3, "F8_E4M3", 1},
    {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kMxfp4, "MXFP4", 0},
    {DType::kQ4_0, "Q4_0", 0},
    {DType::kQ4_1, "Q4_1", 0},
    {DType::kQ5_0, "Q5_0", 0},
    {DType::kQ5_1, "Q5_1", 0},
    {DType::kQ4K, "Q4_K", 0},
    {DType::kQ5K, "Q5_K", 0},
    {DType::kQ6K, "Q6_K", 0},
    {DType::kQ4KR16, "Q4_Kx16", 0},
    {DType::kQ4R16, "Q4x16", 0},
    {DType::kQ8R16, "Q8x16", 0},
    {DType::kQ4_0R16, "Q4_0x16", 0},
}};

const DTypeEntry& Entry(DType dtype) {
  return kDTypes[static_cast<size_t>(dtype)];
}

}  // namespace

size_t DTypeSize(DType dtype) { return Entry(dtype).size; }

absl::string_view DTypeName(DType dtype) { return Entry(dtype).name; }

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (const DTypeEntry& e : kDTypes) {
    // The block formats are ours: no file may claim them.
    if (e.name == name && !IsQuantDType(e.dtype)) return e.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", std::string(name), "'"));
}

int64_t QuantGroupSize(DType dtype) {
  switch (dtype) {
    case DType::kQ8:
    case DType::kQ8R16:
      return 32;
    case DType::kQ4:
    case DType::kQ4R16:
      return 64;
    case DType::kMxfp4:
    case DType::kQ4_0:
    case DType::kQ4_0R16:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
      return 32;
    case DType::kQ4K:
    case DType::kQ4KR16:
    case DType::kQ5K:
    case DType::kQ6K:
      return 256;
    default:
      return 1;
  }
}

int64_t QuantBlockBytes(DType dtype) {
  switch (dtype) {
    case DType::kQ8:
    case DType::kQ8R16:
      return 2 + 32;
    case DType::kQ4:
    case DType::kQ4R16:
      return 2 + 2 + 32;
    case DType::kMxfp4:
      return 1 + 16;
    case DType::kQ4_0:
    case DType::kQ4_0R16:
      return 2 + 16;
    case DType::kQ4_1:
      return 2 + 2 + 16;
    case DType::kQ5_0:
      return 2 + 4 + 16;
    case DType::kQ5_1:
      return 2 + 2 + 4 + 16;
    case DType::kQ4K:
    case DType::kQ4KR16:
      return 2 + 2 + 12 + 128;
    case DType::kQ5K:
      return 2 + 2 + 12 + 32 + 128;
    case DType::kQ6K:
      return 128 + 64 + 16 + 2;
    default:
      return static_cast<int64_t>(DTypeSize(dtype));
  }
}

int64_t WeightBytes(DType dtype, int64_t rows, int64_t cols) {
  const int64_t group = QuantGroupSize(dtype);
  if (cols % group != 0) return -1;
  return rows * (cols / group) * QuantBlockBytes(dtype);
}

absl::StatusOr<DType> ParseWeightDType(absl::string_view name) {
  for (const DTypeEntry& e : kDTypes) {
    if (IsQuantDType(e.dtype) && e.name == name) return e.dtype;
  }
  return ParseDType(name);
}

bool IsFloatDType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

absl::Status ConvertToFloat(const void* src, DType dtype, size_t n,
                            float* dst) {
  const auto* p = static_cast<const uint8_t*>(src);
  switch (dtype) {
    case DType::kF32:
      if (n > 0) std::memcpy(dst, p, n * sizeof(float));
      return absl::OkStatus();
    case DType::kF16:
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = dtype == DType::kF16 ? HalfToFloat(h) : BF16ToFloat(h);
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot convert dtype ", std::string(DTypeName(dtype)), " to float"));
  }
}

absl::Status ConvertFromFloat(const float* src, size_t n, DType dtype,
                              void* dst) {
  auto* p = static_cast<uint8_t*>(dst);
  switch (dtype) {
    case DType::kF32:
      if (n > 0) std::memcpy(p, src, n * sizeof(float));
      return absl::OkStatus();
    case DType::kF16:
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h =
            dtype == DType::kF16 ? FloatToHalf(src[i]) : FloatToBF16(src[i]);
        std::memcpy(p + 2 * i, &h, 2);
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot convert float to dtype ", std::string(DTypeName(dtype))));
  }
}

}  // namespace moe
