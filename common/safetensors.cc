#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/checked_math.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace moe {
namespace {

using nlohmann::json;

std::string S(absl::string_view v) { return std::string(v); }

uint64_t ReadLE64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Reads a non-negative JSON integer; false for anything else (negative,
// fractional, too large, not a number).
bool GetUnsigned(const json& j, uint64_t* out) {
  if (!j.is_number_unsigned()) return false;
  *out = j.get<uint64_t>();
  return true;
}

// Validates one tensor entry of the header. `where` prefixes messages.
absl::Status ParseTensorEntry(const std::string& where, const json& entry,
                              uint64_t data_size, TensorInfo* info) {
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": entry is not a JSON object"));
  }
  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": missing or non-string \"dtype\""));
  }
  auto dtype = ParseDType(dtype_it->get_ref<const std::string&>());
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", dtype.status().message()));
  }
  info->dtype = *dtype;

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": missing or non-array \"shape\""));
  }
  // The product of the non-zero dimensions must fit too, not only the element
  // count: an empty tensor's other dimensions are still multiplied together
  // by whoever computes its strides or row sizes. (A non-empty tensor's count
  // is bounded by its data_offsets below.)
  uint64_t numel = 1;
  uint64_t nonzero = 1;
  for (const json& dim : *shape_it) {
    uint64_t d;
    if (!GetUnsigned(dim, &d) || d > static_cast<uint64_t>(INT64_MAX)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": shape entry ", dim.dump(),
                       " is not a non-negative integer"));
    }
    if (d != 0 && !CheckedMul(nonzero, d, &nonzero)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": shape ", shape_it->dump(), " has too many elements"));
    }
    numel *= d;  // cannot wrap: at most `nonzero`
    info->shape.push_back(static_cast<int64_t>(d));
  }
  if (numel == 0 && nonzero > static_cast<uint64_t>(INT64_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": shape ", shape_it->dump(), " has too many elements"));
  }

  auto off_it = entry.find("data_offsets");
  uint64_t begin = 0, end = 0;
  if (off_it == entry.end() || !off_it->is_array() || off_it->size() != 2 ||
      !GetUnsigned((*off_it)[0], &begin) || !GetUnsigned((*off_it)[1], &end)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        ": \"data_offsets\" must be [begin, end] of non-negative integers"));
  }
  if (begin > end) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": data_offsets [", begin, ", ", end, "] have begin > end"));
  }
  if (end > data_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": data_offsets [", begin, ", ", end,
                     "] out of range (data section is ", data_size, " bytes)"));
  }
  uint64_t expected = 0;
  bool overflow =
      __builtin_mul_overflow(numel, DTypeSize(info->dtype), &expected);
  if (overflow || expected != end - begin) {
    std::string need =
        overflow ? std::string("more than 2^64") : absl::StrCat(expected);
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": shape ", shape_it->dump(), " of ", S(DTypeName(info->dtype)),
        " needs ", need, " bytes but data_offsets span ", end - begin));
  }
  info->data_begin = begin;
  info->data_end = end;
  return absl::OkStatus();
}

absl::Status ParseMetadata(const std::string& source, const json& meta,
                           std::map<std::string, std::string>* out) {
  if (!meta.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": \"__metadata__\" is not an object"));
  }
  for (auto it = meta.begin(); it != meta.end(); ++it) {
    if (!it.value().is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": \"__metadata__\" value for '", it.key(),
                       "' is not a string"));
    }
    (*out)[it.key()] = it.value().get<std::string>();
  }
  return absl::OkStatus();
}

// Tensors sorted by offset must not share a byte.
absl::Status CheckNoOverlap(const std::string& source,
                            const std::vector<TensorInfo>& tensors) {
  std::vector<const TensorInfo*> order;
  for (const auto& t : tensors) {
    if (t.nbytes() > 0) order.push_back(&t);
  }
  std::sort(
      order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
        return a->data_begin != b->data_begin ? a->data_begin < b->data_begin
                                              : a->data_end < b->data_end;
      });
  for (size_t i = 1; i < order.size(); ++i) {
    if (order[i]->data_begin < order[i - 1]->data_end) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": tensors '", order[i - 1]->name, "' [",
                       order[i - 1]->data_begin, ", ", order[i - 1]->data_end,
                       ") and '", order[i]->name, "' [", order[i]->data_begin,
                       ", ", order[i]->data_end, ") overlap"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t TensorInfo::numel() const {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1},
                         [](int64_t a, int64_t b) { return a * b; });
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  ASSIGN_OR_RETURN(OpenedFile opened, OpenRegularFile(path));
  size_t size = static_cast<size_t>(opened.size());
  if (size < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": file is ", size,
                     " bytes, too small for the 8-byte header length"));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, opened.fd(), 0);
  int mmap_errno = errno;
  if (map == MAP_FAILED) return ErrnoToStatus(mmap_errno, "cannot mmap", path);
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->source_ = path;
  file->mapping_ = map;
  file->mapping_size_ = size;
  RETURN_IF_ERROR(file->ParseHeader(static_cast<const uint8_t*>(map), size));
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Parse(
    const uint8_t* data, size_t size, absl::string_view source) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->source_ = S(source);
  RETURN_IF_ERROR(file->ParseHeader(data, size));
  return file;
}

absl::Status SafetensorsFile::ParseHeader(const uint8_t* bytes, size_t size) {
  if (size < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": file is ", size,
                     " bytes, too small for the 8-byte header length"));
  }
  uint64_t n = ReadLE64(bytes);
  if (n > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": header length ",
                                                   n, " exceeds the limit of ",
                                                   kMaxSafetensorsHeaderBytes));
  }
  if (n > size - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": header length ", n,
                     " runs past the end of the file (", size, " bytes)"));
  }
  data_ = bytes + 8 + n;
  data_size_ = size - 8 - n;
  const char* h = reinterpret_cast<const char*>(bytes + 8);
  json header =
      json::parse(h, h + n, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": header is not valid JSON"));
  }
  if (!header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": header is not a JSON object"));
  }
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      RETURN_IF_ERROR(ParseMetadata(source_, it.value(), &metadata_));
      continue;
    }
    TensorInfo info;
    info.name = it.key();
    RETURN_IF_ERROR(
        ParseTensorEntry(absl::StrCat(source_, ": tensor '", it.key(), "'"),
                         it.value(), data_size_, &info));
    tensors_.push_back(std::move(info));
  }
  RETURN_IF_ERROR(CheckNoOverlap(source_, tensors_));
  std::sort(
      tensors_.begin(), tensors_.end(),
      [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  index_.reserve(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i)
    index_.emplace(tensors_[i].name, i);
  return absl::OkStatus();
}

const TensorInfo* SafetensorsFile::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::Span<const uint8_t> SafetensorsFile::Data(
    const TensorInfo& tensor) const {
  return absl::Span<const uint8_t>(data_ + tensor.data_begin, tensor.nbytes());
}

absl::Status SafetensorsWriter::Add(std::string name, DType dtype,
                                    std::vector<int64_t> shape,
                                    absl::Span<const uint8_t> bytes) {
  if (name.empty() || name == "__metadata__") {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid tensor name '", name, "'"));
  }
  for (const auto& e : entries_) {
    if (e.name == name) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "' added twice"));
    }
  }
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0 ||
        __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "': bad shape"));
    }
  }
  if (numel * DTypeSize(dtype) != bytes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': ", bytes.size(),
                     " bytes given, shape needs ", numel * DTypeSize(dtype)));
  }
  uint64_t begin = data_.size();
  data_.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  entries_.push_back(
      {std::move(name), dtype, std::move(shape), begin, data_.size()});
  return absl::OkStatus();
}

void SafetensorsWriter::SetMetadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

std::string SafetensorsWriter::Serialize() const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    auto& meta = header["__metadata__"];
    meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) meta[k] = v;
  }
  for (const auto& e : entries_) {
    header[e.name] = {{"dtype", S(DTypeName(e.dtype))},
                      {"shape", e.shape},
                      {"data_offsets", {e.begin, e.end}}};
  }
  std::string text =
      header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += text;
  out += data_;
  return out;
}

absl::Status SafetensorsWriter::Write(const std::string& path) const {
  return WriteFileAtomically(path, Serialize());
}

}  // namespace moe
