// A GGUF metadata builder for tests of common/gguf_model.h.
#ifndef MOECACHE_TESTS_COMMON_GGUF_METADATA_BUILDER_H_
#define MOECACHE_TESTS_COMMON_GGUF_METADATA_BUILDER_H_

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/types/span.h"

#include "common/gguf.h"

namespace moe::testing {

// Metadata built in memory, as the parser would give it (a key set again
// replaces the earlier value). The metadata views the builder's bytes: keep
// the builder alive while it is used.
class MetadataBuilder {
 public:
  MetadataBuilder() = default;
  // A move keeps the stored strings where they are; a copy would not.
  MetadataBuilder(MetadataBuilder&&) = default;
  MetadataBuilder& operator=(MetadataBuilder&&) = default;
  MetadataBuilder(const MetadataBuilder&) = delete;
  MetadataBuilder& operator=(const MetadataBuilder&) = delete;

  MetadataBuilder& Str(const std::string& key, const std::string& value) {
    GgufValue v;
    v.type = GgufValueType::kString;
    v.str = store_.emplace_back(value);
    return Put(key, v);
  }
  MetadataBuilder& U32(const std::string& key, uint64_t value) {
    GgufValue v;
    v.type = GgufValueType::kUint32;
    v.u = value;
    return Put(key, v);
  }
  MetadataBuilder& F32(const std::string& key, double value) {
    GgufValue v;
    v.type = GgufValueType::kFloat32;
    v.f = value;
    return Put(key, v);
  }
  MetadataBuilder& Bool(const std::string& key, bool value) {
    GgufValue v;
    v.type = GgufValueType::kBool;
    v.u = value ? 1 : 0;
    return Put(key, v);
  }
  MetadataBuilder& Strings(const std::string& key, const std::vector<std::string>& values) {
    GgufValue v = Array(GgufValueType::kString, values.size());
    for (const std::string& s : values) v.array_strings.push_back(store_.emplace_back(s));
    return Put(key, v);
  }
  MetadataBuilder& F32s(const std::string& key, const std::vector<float>& values) {
    return Packed(key, GgufValueType::kFloat32, values.data(), values.size());
  }
  MetadataBuilder& I32s(const std::string& key, const std::vector<int32_t>& values) {
    return Packed(key, GgufValueType::kInt32, values.data(), values.size());
  }
  MetadataBuilder& Drop(const std::string& key) {
    std::erase_if(entries_, [&](const GgufKeyValue& kv) { return kv.key == key; });
    return *this;
  }
  GgufMetadata Build() const { return GgufMetadata("test.gguf", entries_); }

 private:
  static GgufValue Array(GgufValueType elem, size_t n) {
    GgufValue v;
    v.type = GgufValueType::kArray;
    v.array_type = elem;
    v.array_size = n;
    return v;
  }
  template <typename T>
  MetadataBuilder& Packed(const std::string& key, GgufValueType elem, const T* data, size_t n) {
    GgufValue v = Array(elem, n);
    // Little-endian hosts only, as the GGUF reader.
    const std::string& bytes =
        store_.emplace_back(reinterpret_cast<const char*>(data), n * sizeof(T));
    v.array_bytes =
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    return Put(key, v);
  }
  MetadataBuilder& Put(const std::string& key, const GgufValue& v) {
    Drop(key);
    entries_.push_back({key, v});
    return *this;
  }

  std::deque<std::string> store_;  // stable addresses for the views
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
