// Overflow-checked integer arithmetic for numbers that come from outside
// (config.json, safetensors headers, trace files, the EAMC store, wire
// messages). Range-check each value where it is read; use these for the
// arithmetic that can still overflow after that (products of several sizes,
// offsets plus lengths). Every error is INVALID_ARGUMENT and names the
// quantity, e.g. "hidden_size * intermediate_size overflows int64".
//
// The plain Add/Mul forms return false on overflow and leave *out unset, for
// hot or status-free code; the *OrError forms return a StatusOr.
// Thread-safe: pure functions.
#ifndef MOECACHE_COMMON_CHECKED_MATH_H_
#define MOECACHE_COMMON_CHECKED_MATH_H_

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace moe {

// *out = a + b; false (and *out unchanged) when the sum does not fit T.
template <typename T>
[[nodiscard]] bool CheckedAdd(T a, T b, T* out) {
  static_assert(std::is_integral_v<T>);
  T r;
  if (__builtin_add_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

// *out = a * b; false (and *out unchanged) when the product does not fit T.
template <typename T>
[[nodiscard]] bool CheckedMul(T a, T b, T* out) {
  static_assert(std::is_integral_v<T>);
  T r;
  if (__builtin_mul_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}

// a + b, or INVALID_ARGUMENT "<what> overflows int64".
inline absl::StatusOr<int64_t> CheckedAddOrError(int64_t a, int64_t b,
                                                 absl::string_view what) {
  int64_t r;
  if (!CheckedAdd(a, b, &r)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " overflows int64 (", a, " + ", b, ")"));
  }
  return r;
}

// a * b, or INVALID_ARGUMENT "<what> overflows int64".
inline absl::StatusOr<int64_t> CheckedMulOrError(int64_t a, int64_t b,
                                                 absl::string_view what) {
  int64_t r;
  if (!CheckedMul(a, b, &r)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " overflows int64 (", a, " * ", b, ")"));
  }
  return r;
}

// A double that must be an integer in [lo, hi] (a JSON number written as
// 4096.0, say): converting an out-of-range double to an integer is undefined
// behaviour, so this checks first. INVALID_ARGUMENT naming `what` otherwise.
// REQUIRES: |lo| and |hi| <= 2^53 (exact as doubles).
inline absl::StatusOr<int64_t> DoubleToIntInRange(double v, int64_t lo,
                                                  int64_t hi,
                                                  absl::string_view what) {
  if (!std::isfinite(v) || v != std::floor(v) || v < static_cast<double>(lo) ||
      v > static_cast<double>(hi)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " must be an integer in [", lo, ", ", hi, "], got ", v));
  }
  return static_cast<int64_t>(v);
}

}  // namespace moe

#endif  // MOECACHE_COMMON_CHECKED_MATH_H_
