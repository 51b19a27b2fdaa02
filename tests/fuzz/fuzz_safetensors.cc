// Fuzz target: the safetensors header parser. Any input must give a status,
// never a crash, and every accepted file must keep its promises (views in
// bounds, names findable, sizes consistent).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/logging.h"
#include "common/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = moe::SafetensorsFile::Parse(data, size, "fuzz");
  if (!file.ok()) return 0;
  const auto& f = **file;
  std::vector<float> scratch;
  for (const moe::TensorInfo& t : f.tensors()) {
    MOE_CHECK(f.Find(t.name) == &t) << t.name;
    auto bytes = f.Data(t);
    MOE_CHECK(bytes.data() >= data &&
              bytes.data() + bytes.size() <= data + size);
    MOE_CHECK(bytes.size() ==
              static_cast<size_t>(t.numel()) * moe::DTypeSize(t.dtype));
    if (moe::IsFloatDType(t.dtype)) {
      size_t n = std::min<size_t>(static_cast<size_t>(t.numel()), 256);
      scratch.resize(n);
      MOE_CHECK(
          moe::ConvertToFloat(bytes.data(), t.dtype, n, scratch.data()).ok());
    }
  }
  return 0;
}
