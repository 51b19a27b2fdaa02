// Fuzz target: the GGUF parser. Any input must give a status, never a
// crash, and every accepted file must keep its promises: tensor views inside
// the input, sizes consistent with the type's blocks, aligned offsets,
// names findable, every metadata getter safe on every key, the block
// decoder safe on any bytes (the first blocks of each tensor), and a
// vocabulary (tokenizer.ggml.*) either refused or encoding and decoding any
// text to ids inside it.
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "common/logging.h"
#include "common/gguf_blocks.h"
#include "services/engine/tokenizer.h"

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

void CheckTokenizer(const moe::GgufMetadata& m, const uint8_t* data, size_t size) {
  if (!m.Has("tokenizer.ggml.model")) return;
  auto t = moe::Tokenizer::FromGguf(m);
  if (!t.ok()) return;
  const moe::Tokenizer& tok = **t;
  // Fixed text (specials, bytes, spaces) and the input's own last bytes.
  std::string text = "<s> Hello  w\xc3\xb6rld\n\xe4\xb8\xad\xf0\x9f\x98\x80 \xff";
  text.append(reinterpret_cast<const char*>(data) + size - std::min<size_t>(size, 48),
              std::min<size_t>(size, 48));
  const std::vector<int32_t> ids = tok.Encode(text, /*add_special=*/true);
  for (int32_t id : ids) MOE_CHECK(id >= 0 && id < tok.vocab_size()) << id;
  (void)tok.Decode(ids);
  moe::StreamDecoder stream(tok, /*skip_special=*/true);
  for (int32_t id : ids) (void)stream.Push(id);
  (void)stream.Flush();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = moe::GgufFile::Parse(data, size, "fuzz");
  if (!file.ok()) return 0;
  const moe::GgufFile& f = **file;
  CheckMetadata(f.metadata());
  CheckTokenizer(f.metadata(), data, size);
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
