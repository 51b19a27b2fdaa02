// Reading GGUF files (llama.cpp's checkpoint format), versions 2 and 3,
// little-endian, single or split into `<prefix>-00001-of-0000N.gguf` parts:
//
//   "GGUF" | u32 version | u64 tensor_count | u64 metadata_count
//   metadata_count x (string key, u32 value type, value)
//   tensor_count x (string name, u32 n_dims, u64 dims[n_dims], u32 ggml type,
//                   u64 offset)
//   padding to the alignment | data section
//
// Strings are a u64 byte length and the bytes; arrays a u32 element type, a
// u64 count and the elements (arrays of arrays are refused). dims[0] is the
// row length (ggml order, innermost first: the reverse of a safetensors
// shape). The alignment is the UINT32 key general.alignment (default 32);
// the data section starts at the first multiple of it after the tensor
// infos, and each tensor's offset, relative to that start, is a multiple.
//
// GgufFile validates everything up front, so every GgufTensorInfo it hands
// out is safe to use: known version, counts and lengths within the file,
// unique keys and names, a power-of-two alignment, 1 to 4 dimensions each
// >= 1 with an element count that fits int64, a known ggml type whose block
// divides the row length, an aligned offset, bytes inside the data section,
// no two tensors overlapping. Violations are INVALID_ARGUMENT with a message
// naming the source, the field and the bad value.
//
// Thread-safety: GgufFile and GgufCheckpoint are immutable after Open/Parse;
// concurrent reads are safe.
#ifndef MOECACHE_COMMON_GGUF_H_
#define MOECACHE_COMMON_GGUF_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/gguf_metadata.h"
#include "common/gguf_types.h"

namespace moe {

inline constexpr uint32_t kGgufDefaultAlignment = 32;
inline constexpr int kGgufMaxDims = 4;
// Longest metadata key and tensor name accepted (ggml's own names are under
// 64 bytes; keys are dotted paths).
inline constexpr uint64_t kGgufMaxNameBytes = 65535;
// magic, version, tensor count, metadata count.
inline constexpr size_t kGgufHeaderBytes = 24;
// The keys gguf-split writes into every part (llama.cpp's LLM_KV_SPLIT_*).
inline constexpr char kGgufSplitNoKey[] = "split.no";
inline constexpr char kGgufSplitCountKey[] = "split.count";
inline constexpr char kGgufSplitTensorsKey[] = "split.tensors.count";
inline constexpr char kGgufAlignmentKey[] = "general.alignment";

struct GgufTensorInfo {
  std::string name;
  GgufType type = GgufType::kF32;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the row length
  uint64_t offset = 0;        // relative to its file's data section
  uint64_t nbytes = 0;
  int64_t numel = 0;
  int file_index = 0;         // which part of a split checkpoint

  // Rows of dims[0] elements: the product of dims[1..].
  int64_t rows() const { return dims.empty() ? 0 : numel / dims[0]; }
  // Row-major shape (PyTorch / safetensors order): dims reversed.
  std::vector<int64_t> shape() const {
    return std::vector<int64_t>(dims.rbegin(), dims.rend());
  }
};

// One .gguf file.
class GgufFile {
 public:
  // Maps `path` read-only and validates it. The mapping lives as long as
  // the returned object; Data() views and metadata strings point into it.
  // NOTE: truncating the file while it is mapped makes later reads fault
  // (SIGBUS); checkpoints are treated as immutable.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);

  // Validates `size` bytes at `data` without copying them.
  // REQUIRES: the bytes outlive the returned object.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Parse(
      const uint8_t* data, size_t size, absl::string_view source = "<memory>");

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  // Byte offset of the data section from the start of the file.
  uint64_t data_offset() const { return data_offset_; }
  // Bytes from the data section's start to the end of the file (0 when the
  // file ends before it, which only a file without tensor bytes may do).
  uint64_t data_size() const { return data_size_; }
  const GgufMetadata& metadata() const { return metadata_; }
  // In file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const GgufTensorInfo* Find(absl::string_view name) const;
  // The bytes of `tensor`. REQUIRES: `tensor` came from this file.
  absl::Span<const uint8_t> Data(const GgufTensorInfo& tensor) const;
  const std::string& source() const { return source_; }

 private:
  friend class GgufParser;
  GgufFile() = default;

  std::string source_;
  void* mapping_ = nullptr;  // owned mmap region when opened from a path
  size_t mapping_size_ = 0;
  const uint8_t* bytes_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint32_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  uint64_t data_size_ = 0;
  GgufMetadata metadata_;
  std::vector<GgufTensorInfo> tensors_;
  absl::flat_hash_map<absl::string_view, size_t> index_;  // into tensors_
};

// A checkpoint in one GGUF file or split into parts. Open() takes any part's
// path: a name ending in -KKKKK-of-NNNNN.gguf opens parts 1..N, each of
// which must carry split.no = its number - 1 and split.count = N (as
// gguf-split writes them); split.tensors.count, when present, must equal
// the tensors found. A file whose name is not a part's must not claim
// split.count > 1. Metadata are the first part's (gguf-split writes them
// there only); tensor names must be unique across the parts.
class GgufCheckpoint {
 public:
  static absl::StatusOr<std::unique_ptr<GgufCheckpoint>> Open(
      const std::string& path);

  // The first part's metadata.
  const GgufMetadata& metadata() const { return files_.front()->metadata(); }
  // Every part's tensors: part 1's in file order, then part 2's, ...
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* Find(absl::string_view name) const;
  // REQUIRES: `tensor` came from this checkpoint.
  absl::Span<const uint8_t> Data(const GgufTensorInfo& tensor) const;
  size_t file_count() const { return files_.size(); }
  const GgufFile& file(size_t k) const { return *files_[k]; }

 private:
  GgufCheckpoint() = default;
  absl::Status Index();

  std::vector<std::unique_ptr<GgufFile>> files_;
  std::vector<GgufTensorInfo> tensors_;
  absl::flat_hash_map<absl::string_view, size_t> index_;
};

// Splits a part's path "<prefix>-KKKKK-of-NNNNN.gguf" (five digits or
// more each, as llama.cpp's "%s-%05d-of-%05d.gguf" writes them): true and
// *prefix, *part (K) and *count (N) when it has that form.
bool ParseGgufSplitPath(absl::string_view path, std::string* prefix, int* part,
                        int* count);

// "<prefix>-0000K-of-0000N.gguf".
std::string GgufSplitPath(absl::string_view prefix, int part, int count);

}  // namespace moe

#endif  // MOECACHE_COMMON_GGUF_H_
