// The typed field reader of ParseModelConfig (model_config.cc), shared with
// the per-family readers (family_fields.cc). Internal to common/.
//
// Check before compute: every integer is range-checked as it is read, against
// the bounds of its field (IntFieldBounds, one table in model_config.cc), so
// that no value a config.json sets takes part in arithmetic before it is known
// to be small. ValidateModelConfig checks configs built in code against the
// same table (CheckIntField).
#ifndef MOECACHE_COMMON_CONFIG_READER_H_
#define MOECACHE_COMMON_CONFIG_READER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/checked_math.h"
#include "nlohmann/json.hpp"

namespace moe::config_internal {

using nlohmann::json;

struct IntBounds {
  int64_t lo;
  int64_t hi;
};

// The bounds of the integer field `field` (a ModelConfig field name, or
// "object.key" for a nested one). MOE_CHECK-fails for a field without an
// entry: every integer the parser reads has one.
IntBounds IntFieldBounds(absl::string_view field);

// INVALID_ARGUMENT unless lo <= v <= hi: "<field> must be positive, got v",
// "<field> must be at least lo, got v" or "<field> is v, more than the
// supported hi".
absl::Status CheckRange(absl::string_view field, int64_t v, int64_t lo,
                        int64_t hi);
// CheckRange against IntFieldBounds(field).
absl::Status CheckIntField(absl::string_view field, int64_t v);

// Reads typed fields; a missing or null field gives the default (defaults are
// not range-checked here; ValidateModelConfig checks the result). The first
// error is kept in status() and later reads are no-ops.
class FieldReader {
 public:
  explicit FieldReader(const json& j) : j_(j) {}
  const absl::Status& status() const { return status_; }

  const json* Find(const char* key) const {
    auto it = j_.find(key);
    return (it == j_.end() || it->is_null()) ? nullptr : &*it;
  }
  bool Has(const char* key) const { return Find(key) != nullptr; }

  // The integer at `key`, checked against the bounds of `field` (default:
  // the key itself; e.g. mixtral's "num_local_experts" is field
  // "num_experts"). An error names the field, and the key when it differs.
  int64_t Int(const char* key, int64_t def, const char* field = nullptr) {
    if (int_keys_ != nullptr) int_keys_->push_back(key);
    const json* v = Find(key);
    if (v == nullptr || !status_.ok()) return def;
    return ToInt(key, field, *v, def);
  }
  // Token ids: missing gives `def`, an explicit null gives none (as
  // transformers, where null overrides the default).
  std::optional<int64_t> OptInt(const char* key, std::optional<int64_t> def) {
    if (IsExplicitNull(key)) return std::nullopt;
    if (!Has(key)) return def;
    return Int(key, 0);
  }
  bool IsExplicitNull(const char* key) const {
    auto it = j_.find(key);
    return it != j_.end() && it->is_null();
  }
  double Double(const char* key, double def) {
    const json* v = Find(key);
    if (v == nullptr || !status_.ok()) return def;
    if (!v->is_number()) return Fail(key, "must be a number", def);
    return v->get<double>();
  }
  bool Bool(const char* key, bool def) {
    const json* v = Find(key);
    if (v == nullptr || !status_.ok()) return def;
    if (!v->is_boolean()) return Fail(key, "must be true or false", def);
    return v->get<bool>();
  }
  std::string String(const char* key, std::string def) {
    const json* v = Find(key);
    if (v == nullptr || !status_.ok()) return def;
    if (!v->is_string()) return Fail(key, "must be a string", def);
    return v->get<std::string>();
  }
  // An int or a list of ints (eos_token_id); `null` or missing gives `def`.
  std::vector<int64_t> IntOrList(const char* key, std::vector<int64_t> def) {
    if (int_keys_ != nullptr) int_keys_->push_back(key);
    if (IsExplicitNull(key)) return {};
    const json* v = Find(key);
    if (v == nullptr || !status_.ok()) return def;
    if (!v->is_array()) return {ToInt(key, nullptr, *v, 0)};
    std::vector<int64_t> out;
    for (const json& e : *v) out.push_back(ToInt(key, nullptr, e, 0));
    return out;
  }
  std::vector<int64_t> IntList(const char* key) {
    const json* v = Find(key);
    if (v == nullptr || !status_.ok()) return {};
    if (!v->is_array())
      return Fail(key, "must be a list of integers", std::vector<int64_t>{});
    return IntOrList(key, {});
  }
  // A number inside the object `obj` found at `obj_key` (rope_scaling's
  // factor, say); missing or null gives `def`. Errors name "obj_key.key".
  double SubDouble(const json& obj, const char* obj_key, const char* key,
                   double def) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null() || !status_.ok()) return def;
    if (!it->is_number()) {
      Fail(absl::StrCat(obj_key, ".", key, " must be a number"));
      return def;
    }
    return it->get<double>();
  }
  // An integer inside `obj` (an integral number, 4096 or 4096.0), checked
  // against the bounds of field "obj_key.key" before it is converted.
  int64_t SubInt(const json& obj, const char* obj_key, const char* key,
                 int64_t def) {
    const std::string field = absl::StrCat(obj_key, ".", key);
    const double v = SubDouble(obj, obj_key, key, static_cast<double>(def));
    if (!status_.ok()) return def;
    const IntBounds b = IntFieldBounds(field);
    auto i = DoubleToIntInRange(v, b.lo, b.hi, field);
    if (!i.ok()) {
      Fail(std::string(i.status().message()));
      return def;
    }
    return *i;
  }
  void Fail(const std::string& message) {
    if (status_.ok()) status_ = absl::InvalidArgumentError(message);
  }
  // Test seam: appends the key of every top-level integer read (present or
  // not) to `keys`.
  void RecordIntKeysForTest(std::vector<std::string>* keys) {
    int_keys_ = keys;
  }

 private:
  template <typename T>
  T Fail(const char* key, const char* what, T def) {
    Fail(absl::StrCat(key, " ", what));
    return def;
  }
  int64_t ToInt(const char* key, const char* field, const json& v,
                int64_t def) {
    if (!v.is_number_integer()) {
      return Fail(
          key, absl::StrCat("must be an integer, got ", v.dump()).c_str(), def);
    }
    const char* name = field != nullptr ? field : key;
    // Past INT64_MAX (an unsigned JSON integer): too large for any field.
    const int64_t i = v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX
                          ? INT64_MAX
                          : v.get<int64_t>();
    if (absl::Status s = CheckIntField(name, i); !s.ok()) {
      if (i == INT64_MAX) {
        s = absl::InvalidArgumentError(
            absl::StrCat(name, " is ", v.dump(), ", more than the supported ",
                         IntFieldBounds(name).hi));
      }
      Fail(field == nullptr || absl::string_view(field) == key
               ? std::string(s.message())
               : absl::StrCat(s.message(), " (config key ", key, ")"));
      return def;
    }
    return i;
  }

  const json& j_;
  absl::Status status_;
  std::vector<std::string>* int_keys_ = nullptr;
};

}  // namespace moe::config_internal

#endif  // MOECACHE_COMMON_CONFIG_READER_H_
