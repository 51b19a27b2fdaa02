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
constexpr std::array<DTypeEntry, 13> kDTypes = {{
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
}};

const DTypeEntry& Entry(DType dtype) {
  return kDTypes[static_cast<size_t>(dtype)];
}

uint32_t FloatBits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  return x;
}

float BitsFloat(uint32_t x) {
  float f;
  std::memcpy(&f, &x, sizeof(f));
  return f;
}

// Rounds `value >> shift` to nearest, ties to even. REQUIRES: 1 <= shift < 32.
uint32_t ShiftRoundEven(uint32_t value, int shift) {
  uint32_t r = value >> shift;
  uint32_t rem = value & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return r;
}

}  // namespace

size_t DTypeSize(DType dtype) { return Entry(dtype).size; }

absl::string_view DTypeName(DType dtype) { return Entry(dtype).name; }

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (const auto& e : kDTypes) {
    if (e.name == name) return e.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", std::string(name), "'"));
}

bool IsFloatDType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

float BF16ToFloat(uint16_t bits) {
  return BitsFloat(static_cast<uint32_t>(bits) << 16);
}

uint16_t FloatToBF16(float value) {
  uint32_t x = FloatBits(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    // NaN: keep sign and top payload bits, force the quiet bit so the
    // truncated payload can never become zero (which would read as inf).
    return static_cast<uint16_t>((x >> 16) | 0x40u);
  }
  uint32_t bias = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + bias) >> 16);
}

float HalfToFloat(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    float v = static_cast<float>(mant) * BitsFloat(0x33800000u);  // 2^-24
    return BitsFloat(FloatBits(v) | sign);
  }
  if (exp == 31) return BitsFloat(sign | 0x7f800000u | (mant << 13));
  return BitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t FloatToHalf(float value) {
  uint32_t x = FloatBits(value);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or NaN
    uint32_t nan = absx > 0x7f800000u ? (0x200u | ((absx >> 13) & 0x3ffu)) : 0;
    return static_cast<uint16_t>(sign | 0x7c00u | nan);
  }
  // 65520 is halfway between the largest half (65504) and 2^16; ties-to-even
  // sends it (and everything above) to infinity.
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (absx < 0x38800000u) {  // below 2^-14: half subnormal or zero
    uint32_t exp = absx >> 23;
    if (exp < 102) return static_cast<uint16_t>(sign);  // below 2^-25
    uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    // Result in units of 2^-24; may round up to 0x400, the smallest normal.
    return static_cast<uint16_t>(
        sign | ShiftRoundEven(mant, static_cast<int>(126 - exp)));
  }
  // Normal: rebias the exponent; a rounding carry correctly bumps it.
  uint32_t rebased = absx - (112u << 23);
  return static_cast<uint16_t>(sign | ShiftRoundEven(rebased, 13));
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
