// Reading and writing the safetensors format (Hugging Face):
//
//   [8 bytes: little-endian u64 N][N bytes: JSON header][data section]
//
// The header maps each tensor name to {"dtype", "shape", "data_offsets":
// [begin, end)} (offsets relative to the data section) and may hold a
// "__metadata__" object of string -> string.
//
// SafetensorsFile validates the whole header up front, so that every
// TensorInfo it hands out is safe to use: known dtype, non-negative shape,
// offsets inside the data section, no two tensors overlapping, and
// product(shape) * dtype size == end - begin. Gaps between tensors are
// allowed (some writers align tensors). Any violation is INVALID_ARGUMENT
// with a message naming the source and the tensor.
//
// Thread-safety: a SafetensorsFile is immutable after Open/Parse; concurrent
// reads are safe. SafetensorsWriter is not thread-safe.
#ifndef MOECACHE_COMMON_SAFETENSORS_H_
#define MOECACHE_COMMON_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"

namespace moe {

// Upper bound on the JSON header, as in the reference implementation.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // Byte range [data_begin, data_end) within the data section.
  uint64_t data_begin = 0;
  uint64_t data_end = 0;

  uint64_t nbytes() const { return data_end - data_begin; }
  int64_t numel() const;  // product of shape (1 for a scalar)
};

class SafetensorsFile {
 public:
  // Maps `path` read-only and validates it. The mapping lives as long as the
  // returned object; Data() views point into it (zero-copy).
  // NOTE: truncating the file while it is mapped makes later reads fault
  // (SIGBUS); checkpoints are treated as immutable.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path);

  // Validates `size` bytes at `data` without copying them.
  // REQUIRES: the bytes outlive the returned object.
  // `source` names the bytes in error messages.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Parse(
      const uint8_t* data, size_t size, absl::string_view source = "<memory>");

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // The tensor named `name`, or nullptr.
  const TensorInfo* Find(absl::string_view name) const;

  // All tensors, sorted by name.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  // The bytes of `tensor`. REQUIRES: `tensor` came from this file.
  absl::Span<const uint8_t> Data(const TensorInfo& tensor) const;

  // The "__metadata__" map (empty when absent).
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }

  // The path given to Open, or the `source` given to Parse.
  const std::string& source() const { return source_; }

  // Size of the data section in bytes.
  uint64_t data_size() const { return data_size_; }

 private:
  SafetensorsFile() = default;
  absl::Status ParseHeader(const uint8_t* bytes, size_t size);

  std::string source_;
  void* mapping_ = nullptr;  // owned mmap region when opened from a file
  size_t mapping_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  uint64_t data_size_ = 0;
  std::vector<TensorInfo> tensors_;
  absl::flat_hash_map<absl::string_view, size_t>
      index_;  // keys point into tensors_
  std::map<std::string, std::string> metadata_;
};

// Builds a safetensors file in memory and writes it atomically. Tensors are
// laid out back to back in the order added; the header is padded with spaces
// to a multiple of 8 bytes so that the data section is 8-byte aligned.
class SafetensorsWriter {
 public:
  // Copies `bytes`. INVALID_ARGUMENT when the name is empty, reserved
  // ("__metadata__") or already added, a dimension is negative, or
  // bytes.size() != product(shape) * DTypeSize(dtype).
  absl::Status Add(std::string name, DType dtype, std::vector<int64_t> shape,
                   absl::Span<const uint8_t> bytes);

  // Adds an entry to "__metadata__".
  void SetMetadata(std::string key, std::string value);

  // The whole file image.
  std::string Serialize() const;

  // Writes to `path` via a temporary file in the same directory, fsync and
  // rename, so readers never see a partial file.
  absl::Status Write(const std::string& path) const;

  // Sum of tensor bytes (the "total_size" of a sharded index).
  uint64_t data_bytes() const { return data_.size(); }
  size_t tensor_count() const { return entries_.size(); }

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin;
    uint64_t end;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
  std::string data_;
};

}  // namespace moe

#endif  // MOECACHE_COMMON_SAFETENSORS_H_
