// A GGUF metadata builder for tests of common/gguf_model.h.
#ifndef MOECACHE_TESTS_COMMON_GGUF_METADATA_BUILDER_H_
#define MOECACHE_TESTS_COMMON_GGUF_METADATA_BUILDER_H_

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "common/gguf.h"

namespace moe::testing {

// Builds metadata the way the parser would. The metadata view the builder's
// strings: keep the builder alive while they are used. Move-only: a copy
// would view the original's strings (moving a deque keeps its elements).
class MetadataBuilder {
 public:
  MetadataBuilder() = default;
  MetadataBuilder(MetadataBuilder&&) = default;
  MetadataBuilder& operator=(MetadataBuilder&&) = default;
  MetadataBuilder(const MetadataBuilder&) = delete;
  MetadataBuilder& operator=(const MetadataBuilder&) = delete;

  MetadataBuilder& Str(const std::string& key, const std::string& value) {
    GgufValue v;
    v.type = GgufValueType::kString;
    v.str = strings_.emplace_back(value);
    entries_.push_back({key, v});
    return *this;
  }
  MetadataBuilder& U32(const std::string& key, uint64_t value) {
    GgufValue v;
    v.type = GgufValueType::kUint32;
    v.u = value;
    entries_.push_back({key, v});
    return *this;
  }
  MetadataBuilder& F32(const std::string& key, double value) {
    GgufValue v;
    v.type = GgufValueType::kFloat32;
    v.f = value;
    entries_.push_back({key, v});
    return *this;
  }
  MetadataBuilder& Bool(const std::string& key, bool value) {
    GgufValue v;
    v.type = GgufValueType::kBool;
    v.u = value ? 1 : 0;
    entries_.push_back({key, v});
    return *this;
  }
  MetadataBuilder& Drop(const std::string& key) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->key == key) {
        entries_.erase(it);
        break;
      }
    }
    return *this;
  }
  GgufMetadata Build() const { return GgufMetadata("test.gguf", entries_); }

 private:
  std::deque<std::string> strings_;  // stable addresses for the views
  std::vector<GgufKeyValue> entries_;
};

// Tensor infos with only their names (what ModelConfigFromGguf reads).
inline std::vector<GgufTensorInfo> GgufTensors(std::vector<std::string> names) {
  std::vector<GgufTensorInfo> out;
  for (auto& n : names) {
    GgufTensorInfo t;
    t.name = n;
    out.push_back(t);
  }
  return out;
}

}  // namespace moe::testing

#endif  // MOECACHE_TESTS_COMMON_GGUF_METADATA_BUILDER_H_
