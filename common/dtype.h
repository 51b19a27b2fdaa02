// Element types of tensors in safetensors files, and conversions between the
// float formats that model checkpoints use (F32, F16, BF16).
//
// Thread-safe: everything here is a pure function.
#ifndef MOECACHE_COMMON_DTYPE_H_
#define MOECACHE_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moe {

// The dtypes of the safetensors format, spelled as in its header ("BF16").
// kF32, kF16 and kBF16 keep the values 0, 1, 2: the CUDA module's C ABI
// (kernels/) uses the same numbering for weight dtypes.
enum class DType : int32_t {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
  kBool,
  kU8,
  kI8,
  kU16,
  kI16,
  kU32,
  kI32,
  kU64,
  kI64,
  kF64,
};

// Bytes per element (BOOL is one byte).
size_t DTypeSize(DType dtype);

// The safetensors spelling: "BOOL", "U8", ..., "BF16", "F32".
absl::string_view DTypeName(DType dtype);

// Parses the safetensors spelling (exact, case-sensitive). Unknown names give
// INVALID_ARGUMENT naming the dtype.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// True for F16, BF16, F32 (the dtypes ConvertToFloat accepts).
bool IsFloatDType(DType dtype);

// bfloat16 <-> float. FloatToBF16 rounds to nearest, ties to even; a NaN stays
// a (quiet) NaN, infinities stay infinities.
float BF16ToFloat(uint16_t bits);
uint16_t FloatToBF16(float value);

// IEEE 754 binary16 <-> float. HalfToFloat is exact (subnormals included).
// FloatToHalf rounds to nearest even; overflow gives +-inf, NaN stays NaN.
float HalfToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);

// Converts `n` elements at `src` (any alignment) of type `dtype` to floats.
// Returns INVALID_ARGUMENT for dtypes other than F32, F16 and BF16.
// REQUIRES: src holds n * DTypeSize(dtype) bytes; dst holds n floats.
absl::Status ConvertToFloat(const void* src, DType dtype, size_t n, float* dst);

// Converts `n` floats to `dtype` (F32, F16 or BF16) at `dst` (any alignment).
// REQUIRES: dst holds n * DTypeSize(dtype) bytes.
absl::Status ConvertFromFloat(const float* src, size_t n, DType dtype,
                              void* dst);

}  // namespace moe

#endif  // MOECACHE_COMMON_DTYPE_H_
