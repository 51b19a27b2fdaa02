// Writing GGUF v3 files (llama.cpp's checkpoint format; the layout is in
// common/gguf.h, which reads what this writes).
//
//   GgufWriter w;
//   RETURN_IF_ERROR(w.AddString("general.architecture", "qwen3moe"));
//   RETURN_IF_ERROR(w.AddUint("qwen3moe.block_count", GgufValueType::kUint32, 2));
//   RETURN_IF_ERROR(w.AddTensor("blk.0.ffn_gate_exps.weight", GgufType::kQ8_0,
//                               {64, 32, 4}, bytes));  // ggml dims: row first
//   RETURN_IF_ERROR(w.Write("/tmp/model.gguf"));
//
// The file is built in memory: metadata in the order added, then the tensor
// infos in the order added, the data section at the next multiple of the
// alignment (32, llama.cpp's default; another power of two is written as
// general.alignment), each tensor's bytes at the next multiple after the
// previous one's and the file padded to a multiple too, as ggml's writer
// does. Every Add* checks what GgufFile::Parse would refuse, so a file
// written from successful calls always parses: keys and names 1 to
// kGgufMaxNameBytes bytes and unique, values within their type's range,
// tensors of 1 to kGgufMaxDims dimensions each >= 1 whose element count fits
// int64, of a known ggml type whose block divides the row length, with
// exactly the type's byte count. Violations are INVALID_ARGUMENT naming the
// key or tensor and the bad value; nothing is added then.
//
// Thread-safety: none; one writer per thread.
#ifndef MOECACHE_COMMON_GGUF_WRITER_H_
#define MOECACHE_COMMON_GGUF_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/gguf_types.h"

namespace moe {

inline constexpr uint32_t kGgufWriterVersion = 3;

class GgufWriter {
 public:
  GgufWriter() = default;
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  // Aligns the data section and each tensor to `alignment` bytes, written as
  // the UINT32 key general.alignment. INVALID_ARGUMENT unless a power of two
  // up to 2^20, or when tensors or the key were added already.
  absl::Status SetAlignment(uint32_t alignment);

  // Scalar values (general.alignment excepted: SetAlignment). `type` must be of the method's kind (AddUint: UINT8,
  // UINT16, UINT32, UINT64; AddInt: INT8 .. INT64; AddFloat: FLOAT32 or
  // FLOAT64, FLOAT32 rounding to nearest) and hold the value: INVALID_ARGUMENT
  // otherwise, and for an empty, too long or repeated key.
  absl::Status AddUint(absl::string_view key, GgufValueType type, uint64_t value);
  absl::Status AddInt(absl::string_view key, GgufValueType type, int64_t value);
  absl::Status AddFloat(absl::string_view key, GgufValueType type, double value);
  absl::Status AddBool(absl::string_view key, bool value);
  absl::Status AddString(absl::string_view key, absl::string_view value);
  // UINT32 and FLOAT32, the types llama.cpp writes hyper-parameters in.
  absl::Status AddUint32(absl::string_view key, uint64_t value) {
    return AddUint(key, GgufValueType::kUint32, value);
  }
  absl::Status AddFloat32(absl::string_view key, double value) {
    return AddFloat(key, GgufValueType::kFloat32, value);
  }

  // Arrays of one element type: integers of any integer type or BOOL (0 or
  // 1) from int64, floats (FLOAT32 or FLOAT64), strings. Each element must
  // fit `elem`, as for the scalars.
  absl::Status AddIntArray(absl::string_view key, GgufValueType elem,
                           absl::Span<const int64_t> values);
  absl::Status AddFloatArray(absl::string_view key, GgufValueType elem,
                             absl::Span<const double> values);
  absl::Status AddStringArray(absl::string_view key,
                              absl::Span<const std::string> values);

  // A tensor of `type` with ggml dims `dims` (dims[0] the row length: a
  // [rows, cols] matrix is {cols, rows}) and its bytes (copied).
  absl::Status AddTensor(absl::string_view name, GgufType type,
                         std::vector<int64_t> dims,
                         absl::Span<const uint8_t> data);

  // The whole file image.
  std::string Serialize() const;
  // Writes Serialize() to `path` atomically (a temporary file in the same
  // directory, fsync, rename).
  absl::Status Write(const std::string& path) const;

  size_t metadata_count() const { return kv_count_; }
  size_t tensor_count() const { return tensors_.size(); }

 private:
  struct Tensor {
    std::string name;
    GgufType type;
    std::vector<int64_t> dims;
    uint64_t offset;  // in the data section
    uint64_t nbytes;
  };

  absl::Status CheckName(absl::string_view what, absl::string_view name,
                         const absl::flat_hash_set<std::string>& used) const;
  // Appends key, tag and the already-encoded value.
  absl::Status AddEncoded(absl::string_view key, GgufValueType type,
                          const std::string& value);

  uint32_t alignment_ = 32;
  bool setting_alignment_ = false;  // general.alignment comes from SetAlignment
  std::string kv_;  // encoded key/value pairs
  size_t kv_count_ = 0;
  absl::flat_hash_set<std::string> keys_;
  std::vector<Tensor> tensors_;
  absl::flat_hash_set<std::string> names_;
  std::string data_;  // the data section, each tensor padded
};

}  // namespace moe

#endif  // MOECACHE_COMMON_GGUF_WRITER_H_
