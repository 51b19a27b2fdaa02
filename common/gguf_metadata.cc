#include "common/gguf_metadata.h"

#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace moe {
namespace {

uint64_t LoadLE(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int b = bytes - 1; b >= 0; --b) v = (v << 8) | p[b];
  return v;
}

// Sign-extends the low `bytes` bytes of `bits`.
int64_t SignExtend(uint64_t bits, int bytes) {
  if (bytes == 8) return static_cast<int64_t>(bits);
  const int shift = 64 - 8 * bytes;
  return static_cast<int64_t>(bits << shift) >> shift;
}

bool IsSigned(GgufValueType t) {
  return t == GgufValueType::kInt8 || t == GgufValueType::kInt16 ||
         t == GgufValueType::kInt32 || t == GgufValueType::kInt64;
}

}  // namespace

std::string GgufValue::TypeName() const {
  if (type != GgufValueType::kArray) return GgufValueTypeName(type);
  return absl::StrCat("ARRAY of ", GgufValueTypeName(array_type));
}

GgufMetadata::GgufMetadata(std::string source, std::vector<GgufKeyValue> entries)
    : source_(std::move(source)), entries_(std::move(entries)) {
  index_.reserve(entries_.size());
  for (size_t k = 0; k < entries_.size(); ++k) {
    bool inserted = index_.emplace(entries_[k].key, k).second;
    MOE_CHECK(inserted) << "duplicate GGUF key " << entries_[k].key;
  }
}

const GgufValue* GgufMetadata::Find(absl::string_view key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].value;
}

absl::StatusOr<const GgufValue*> GgufMetadata::Get(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(source_, ": metadata key '", key, "' is missing"));
  }
  return v;
}

absl::Status GgufMetadata::WrongType(absl::string_view key, const GgufValue& v,
                                     absl::string_view expected) const {
  return absl::InvalidArgumentError(absl::StrCat(source_, ": metadata key '", key,
                                                 "' is ", v.TypeName(),
                                                 ", expected ", expected));
}

absl::StatusOr<uint64_t> GgufMetadata::GetUint(absl::string_view key) const {
  absl::StatusOr<const GgufValue*> v = Get(key);
  if (!v.ok()) return v.status();
  const GgufValue& x = **v;
  if (!IsGgufIntegerType(x.type)) return WrongType(key, x, "an integer");
  if (IsSigned(x.type)) {
    if (x.i < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_, ": metadata key '", key, "' is ", x.i, ", expected >= 0"));
    }
    return static_cast<uint64_t>(x.i);
  }
  return x.u;
}

absl::StatusOr<int64_t> GgufMetadata::GetInt(absl::string_view key) const {
  absl::StatusOr<const GgufValue*> v = Get(key);
  if (!v.ok()) return v.status();
  const GgufValue& x = **v;
  if (!IsGgufIntegerType(x.type)) return WrongType(key, x, "an integer");
  if (IsSigned(x.type)) return x.i;
  if (x.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(
        source_, ": metadata key '", key, "' is ", x.u, ", more than int64 holds"));
  }
  return static_cast<int64_t>(x.u);
}

absl::StatusOr<double> GgufMetadata::GetFloat(absl::string_view key) const {
  absl::StatusOr<const GgufValue*> v = Get(key);
  if (!v.ok()) return v.status();
  if (!IsGgufFloatType((*v)->type)) return WrongType(key, **v, "FLOAT32 or FLOAT64");
  return (*v)->f;
}

absl::StatusOr<bool> GgufMetadata::GetBool(absl::string_view key) const {
  absl::StatusOr<const GgufValue*> v = Get(key);
  if (!v.ok()) return v.status();
  if ((*v)->type != GgufValueType::kBool) return WrongType(key, **v, "BOOL");
  return (*v)->u != 0;
}

absl::StatusOr<absl::string_view> GgufMetadata::GetString(
    absl::string_view key) const {
  absl::StatusOr<const GgufValue*> v = Get(key);
  if (!v.ok()) return v.status();
  if ((*v)->type != GgufValueType::kString) return WrongType(key, **v, "STRING");
  return (*v)->str;
}

absl::StatusOr<std::vector<int64_t>> GgufMetadata::GetIntArray(
    absl::string_view key) const {
  absl::StatusOr<const GgufValue*> v = Get(key);
  if (!v.ok()) return v.status();
  const GgufValue& x = **v;
  if (x.type != GgufValueType::kArray || !IsGgufIntegerType(x.array_type)) {
    return WrongType(key, x, "an ARRAY of integers");
  }
  std::vector<int64_t> out(x.array_size);
  for (uint64_t k = 0; k < x.array_size; ++k) {
    if (!GgufArrayInt(x, k, &out[k])) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_, ": metadata key '", key, "' element ", k,
          " is more than int64 holds"));
    }
  }
  return out;
}

absl::StatusOr<std::vector<double>> GgufMetadata::GetFloatArray(
    absl::string_view key) const {
  absl::StatusOr<const GgufValue*> v = Get(key);
  if (!v.ok()) return v.status();
  const GgufValue& x = **v;
  if (x.type != GgufValueType::kArray || !IsGgufFloatType(x.array_type)) {
    return WrongType(key, x, "an ARRAY of FLOAT32 or FLOAT64");
  }
  std::vector<double> out(x.array_size);
  for (uint64_t k = 0; k < x.array_size; ++k) out[k] = GgufArrayFloat(x, k);
  return out;
}

absl::StatusOr<std::vector<absl::string_view>> GgufMetadata::GetStringArray(
    absl::string_view key) const {
  absl::StatusOr<const GgufValue*> v = Get(key);
  if (!v.ok()) return v.status();
  const GgufValue& x = **v;
  if (x.type != GgufValueType::kArray || x.array_type != GgufValueType::kString) {
    return WrongType(key, x, "an ARRAY of STRING");
  }
  return x.array_strings;
}

bool GgufArrayInt(const GgufValue& v, uint64_t k, int64_t* out) {
  const int size = GgufValueFixedSize(v.array_type);
  MOE_CHECK(size > 0 && k < v.array_size);
  const uint64_t bits = LoadLE(v.array_bytes.data() + k * size, size);
  if (IsSigned(v.array_type)) {
    *out = SignExtend(bits, size);
    return true;
  }
  if (bits > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
  *out = static_cast<int64_t>(bits);
  return true;
}

double GgufArrayFloat(const GgufValue& v, uint64_t k) {
  MOE_CHECK(IsGgufFloatType(v.array_type) && k < v.array_size);
  if (v.array_type == GgufValueType::kFloat32) {
    uint32_t bits = static_cast<uint32_t>(LoadLE(v.array_bytes.data() + 4 * k, 4));
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  uint64_t bits = LoadLE(v.array_bytes.data() + 8 * k, 8);
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}

}  // namespace moe
