// The typed field reader of ParseModelConfig (model_config.cc), shared with
// the per-family readers (gpt_oss_config.cc). Internal to common/.
#ifndef MOECACHE_COMMON_CONFIG_READER_H_
#define MOECACHE_COMMON_CONFIG_READER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace moe::config_internal {

using nlohmann::json;

// Reads typed fields; a missing or null field gives the default. The first
// type error is kept in status() and later reads are no-ops.
class FieldReader {
 public:
  explicit FieldReader(const json& j) : j_(j) {}
  const absl::Status& status() const { return status_; }

  const json* Find(const char* key) const {
    auto it = j_.find(key);
    return (it == j_.end() || it->is_null()) ? nullptr : &*it;
  }
  bool Has(const char* key) const { return Find(key) != nullptr; }

  int64_t Int(const char* key, int64_t def) {
    const json* v = Find(key);
    if (v == nullptr || !status_.ok()) return def;
    return ToInt(key, *v, def);
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
    if (IsExplicitNull(key)) return {};
    const json* v = Find(key);
    if (v == nullptr || !status_.ok()) return def;
    if (!v->is_array()) return {ToInt(key, *v, 0)};
    std::vector<int64_t> out;
    for (const json& e : *v) out.push_back(ToInt(key, e, 0));
    return out;
  }
  std::vector<int64_t> IntList(const char* key) {
    const json* v = Find(key);
    if (v == nullptr || !status_.ok()) return {};
    if (!v->is_array())
      return Fail(key, "must be a list of integers", std::vector<int64_t>{});
    return IntOrList(key, {});
  }
  void Fail(const std::string& message) {
    if (status_.ok()) status_ = absl::InvalidArgumentError(message);
  }

 private:
  template <typename T>
  T Fail(const char* key, const char* what, T def) {
    Fail(absl::StrCat(key, " ", what));
    return def;
  }
  int64_t ToInt(const char* key, const json& v, int64_t def) {
    if (v.is_number_integer() &&
        !(v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX)) {
      return v.get<int64_t>();
    }
    return Fail(key, absl::StrCat("must be an integer, got ", v.dump()).c_str(),
                def);
  }

  const json& j_;
  absl::Status status_;
};

}  // namespace moe::config_internal

#endif  // MOECACHE_COMMON_CONFIG_READER_H_
