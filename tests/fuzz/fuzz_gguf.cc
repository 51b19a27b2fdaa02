// Fuzz target: the GGUF parser. Any input must give a status, never a
// crash, and every accepted file must keep its promises: tensor views inside
// the input, sizes consistent with the type's blocks, aligned offsets,
// names findable, every metadata getter safe on every key, and the block
// decoder safe on any bytes (the first blocks of each tensor).
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "common/logging.h"
#include "common/gguf_blocks.h"

namespace {

void CheckMetadata(const moe::GgufMetadata& m) {
  for (const moe::GgufKeyValue& kv : m.entries()) {
    MOE_CHECK(m.Find(kv.key) == &kv.value) << kv.key;
    // Each getter either succeeds or returns an error; none may crash.
    (void)m.GetUint(kv.key);
    (void)m.GetInt(kv.key);
    (void)m.GetFloat(kv.key);
    (void)m.GetBool(kv.key);
    (void)m.GetString(kv.key);
    (void)m.GetIntArray(kv.key);
    (void)m.GetFloatArray(kv.key);
    (void)m.GetStringArray(kv.key);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = moe::GgufFile::Parse(data, size, "fuzz");
  if (!file.ok()) return 0;
  const moe::GgufFile& f = **file;
  CheckMetadata(f.metadata());
  for (const moe::GgufTensorInfo& t : f.tensors()) {
    MOE_CHECK(f.Find(t.name) == &t) << t.name;
    const moe::GgufTypeInfo& type = moe::GgufTypeInfoOf(t.type);
    MOE_CHECK(t.dims.size() >= 1 && t.dims.size() <= 4);
    MOE_CHECK(t.dims[0] % type.block_elems == 0);
    MOE_CHECK(t.nbytes == static_cast<uint64_t>(t.numel / type.block_elems) *
                              static_cast<uint64_t>(type.block_bytes));
    MOE_CHECK(t.offset % f.alignment() == 0);
    auto bytes = f.Data(t);
    MOE_CHECK(bytes.data() >= data && bytes.data() + bytes.size() <= data + size);
    if (moe::CanDequantizeGguf(t.type)) {
      const int64_t n = std::min<int64_t>(t.dims[0], 4 * type.block_elems);
      std::vector<float> out(n);
      MOE_CHECK(moe::DequantizeGguf(t.type, bytes.data(), n, out.data()).ok());
    }
  }
  return 0;
}
