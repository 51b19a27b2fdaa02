// The metadata key/values of a GGUF file, with typed getters whose errors
// name the key and the source (INVALID_ARGUMENT for a value of the wrong
// type or range, NOT_FOUND for a missing key).
//
// Values are decoded once by the parser (common/gguf.h). Strings, string
// array elements and numeric array bytes are views into the file's bytes:
// a GgufMetadata is valid only as long as the GgufFile it came from.
//
// Thread-safety: immutable after construction; concurrent reads are safe.
#ifndef MOECACHE_COMMON_GGUF_METADATA_H_
#define MOECACHE_COMMON_GGUF_METADATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/gguf_types.h"

namespace moe {

struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  // Scalars: the one member that matches `type` is set.
  uint64_t u = 0;   // UINT8..UINT64 and BOOL (0 or 1)
  int64_t i = 0;    // INT8..INT64
  double f = 0;     // FLOAT32 (widened) and FLOAT64
  absl::string_view str;  // STRING
  // Arrays: element type, count, and either the packed little-endian
  // elements (numeric and BOOL elements) or the strings.
  GgufValueType array_type = GgufValueType::kUint8;
  uint64_t array_size = 0;
  absl::Span<const uint8_t> array_bytes;
  std::vector<absl::string_view> array_strings;

  // "UINT32", or "ARRAY of STRING".
  std::string TypeName() const;
};

struct GgufKeyValue {
  std::string key;
  GgufValue value;
};

class GgufMetadata {
 public:
  GgufMetadata() = default;
  // `source` names the file in error messages.
  // REQUIRES: keys are unique (the parser rejects duplicates).
  GgufMetadata(std::string source, std::vector<GgufKeyValue> entries);

  GgufMetadata(GgufMetadata&&) = default;
  GgufMetadata& operator=(GgufMetadata&&) = default;

  // In file order.
  const std::vector<GgufKeyValue>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  bool Has(absl::string_view key) const { return Find(key) != nullptr; }
  // nullptr when absent.
  const GgufValue* Find(absl::string_view key) const;

  // Any integer type whose value fits; INVALID_ARGUMENT for other types or
  // values out of range (a negative INT32 for GetUint).
  absl::StatusOr<uint64_t> GetUint(absl::string_view key) const;
  absl::StatusOr<int64_t> GetInt(absl::string_view key) const;
  // FLOAT32 or FLOAT64 (integers are refused: a writer that stores a float
  // hyper-parameter as an integer wrote the wrong key).
  absl::StatusOr<double> GetFloat(absl::string_view key) const;
  absl::StatusOr<bool> GetBool(absl::string_view key) const;
  // A view into the file's bytes (not NUL-terminated, may hold any bytes).
  absl::StatusOr<absl::string_view> GetString(absl::string_view key) const;
  // Arrays: every element converted; integer arrays must hold integers
  // that fit int64, float arrays FLOAT32 or FLOAT64 elements.
  absl::StatusOr<std::vector<int64_t>> GetIntArray(absl::string_view key) const;
  absl::StatusOr<std::vector<double>> GetFloatArray(absl::string_view key) const;
  absl::StatusOr<std::vector<absl::string_view>> GetStringArray(
      absl::string_view key) const;

 private:
  absl::StatusOr<const GgufValue*> Get(absl::string_view key) const;
  absl::Status WrongType(absl::string_view key, const GgufValue& v,
                         absl::string_view expected) const;

  std::string source_;
  std::vector<GgufKeyValue> entries_;
  absl::flat_hash_map<std::string, size_t> index_;
};

// The value of element `k` of a numeric array as int64 / double.
// REQUIRES: k < v.array_size; an integer (or BOOL) element type for
// GgufArrayInt, FLOAT32/FLOAT64 for GgufArrayFloat. GgufArrayInt returns
// false for a UINT64 element above INT64_MAX.
bool GgufArrayInt(const GgufValue& v, uint64_t k, int64_t* out);
double GgufArrayFloat(const GgufValue& v, uint64_t k);

}  // namespace moe

#endif  // MOECACHE_COMMON_GGUF_METADATA_H_
