#include "common/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/checked_math.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace moe {
namespace {

// Smallest encodings, to refuse counts that cannot fit in what is left of
// the file before allocating for them: a key/value is a key length (8), a
// non-empty key, a type (4) and at least one value byte; a tensor info a
// name length (8), a non-empty name, a dimension count (4), one dimension
// (8), a type (4) and an offset (8).
constexpr uint64_t kMinKeyValueBytes = 8 + 1 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;
constexpr uint64_t kStringLengthBytes = 8;
// Reserve no more than this many slots up front; vectors grow past it as
// real entries are read.
constexpr uint64_t kMaxReserve = 1 << 16;

// Reads little-endian fields from a byte range, refusing to run past its end.
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size, const std::string& source)
      : data_(data), size_(size), source_(source) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  absl::Status Need(uint64_t n, absl::string_view what) const {
    if (n <= left()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        source_, ": ", what, " at byte ", pos_, " runs past the end of the file (needs ",
        n, " bytes, ", left(), " left)"));
  }

  // REQUIRES: Need(n) passed.
  const uint8_t* Take(uint64_t n) {
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }

  absl::StatusOr<uint64_t> Uint(int bytes, absl::string_view what) {
    RETURN_IF_ERROR(Need(bytes, what));
    const uint8_t* p = Take(bytes);
    uint64_t v = 0;
    for (int b = bytes - 1; b >= 0; --b) v = (v << 8) | p[b];
    return v;
  }

  // A u64 length and that many bytes; the length may not exceed max_len.
  absl::StatusOr<absl::string_view> String(absl::string_view what,
                                           uint64_t max_len) {
    ASSIGN_OR_RETURN(uint64_t len, Uint(8, absl::StrCat(what, " length")));
    if (len > max_len) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_, ": ", what, " length ", len, " exceeds the limit of ", max_len));
    }
    RETURN_IF_ERROR(Need(len, what));
    return absl::string_view(reinterpret_cast<const char*>(Take(len)), len);
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& source_;
};

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

// Fills a GgufFile from its bytes; see the format in gguf.h.
class GgufParser {
 public:
  explicit GgufParser(GgufFile* file)
      : f_(file), in_(file->bytes_, file->size_, file->source_) {}

  absl::Status Run() {
    RETURN_IF_ERROR(ParseHeader());
    RETURN_IF_ERROR(ParseMetadata());
    RETURN_IF_ERROR(CheckWellKnownKeys());
    RETURN_IF_ERROR(ParseTensorInfos());
    return LayOut();
  }

 private:
  absl::Status Error(absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat(f_->source_, ": ", message));
  }

  absl::Status ParseHeader();
  absl::Status ParseMetadata();
  absl::Status ParseValue(uint32_t type, const std::string& what, GgufValue* v);
  absl::Status ParseArray(const std::string& what, GgufValue* v);
  absl::Status CheckWellKnownKeys();
  absl::Status ParseTensorInfos();
  absl::Status ParseTensorInfo(uint64_t k, GgufTensorInfo* t);
  absl::Status ParseDims(GgufTensorInfo* t);
  absl::Status LayOut();

  GgufFile* f_;
  Cursor in_;
  uint64_t tensor_count_ = 0;
  uint64_t metadata_count_ = 0;
};

absl::Status GgufParser::ParseHeader() {
  if (f_->size_ < kGgufHeaderBytes) {
    return Error(absl::StrCat("file is ", f_->size_, " bytes, too small for the ",
                              kGgufHeaderBytes, "-byte GGUF header"));
  }
  const uint8_t* magic = in_.Take(4);
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    return Error(absl::StrFormat(
        "not a GGUF file (magic bytes %02x %02x %02x %02x, expected 'GGUF')",
        magic[0], magic[1], magic[2], magic[3]));
  }
  ASSIGN_OR_RETURN(uint64_t version, in_.Uint(4, "version"));
  if (version != 2 && version != 3) {
    if (version != 0 && (version & 0xffff) == 0) {
      return Error(absl::StrFormat(
          "version field 0x%08x looks like a big-endian GGUF; only "
          "little-endian files are supported",
          version));
    }
    return Error(absl::StrCat("GGUF version ", version,
                              " is not supported (versions 2 and 3 are)"));
  }
  f_->version_ = static_cast<uint32_t>(version);
  ASSIGN_OR_RETURN(tensor_count_, in_.Uint(8, "tensor count"));
  ASSIGN_OR_RETURN(metadata_count_, in_.Uint(8, "metadata count"));
  if (metadata_count_ > in_.left() / kMinKeyValueBytes) {
    return Error(absl::StrCat("metadata count ", metadata_count_,
                              " cannot fit in the ", in_.left(),
                              " bytes after the header"));
  }
  if (tensor_count_ > in_.left() / kMinTensorInfoBytes) {
    return Error(absl::StrCat("tensor count ", tensor_count_, " cannot fit in the ",
                              in_.left(), " bytes after the header"));
  }
  return absl::OkStatus();
}

absl::Status GgufParser::ParseMetadata() {
  std::vector<GgufKeyValue> entries;
  entries.reserve(std::min(metadata_count_, kMaxReserve));
  absl::flat_hash_set<std::string> seen;
  for (uint64_t k = 0; k < metadata_count_; ++k) {
    const std::string what = absl::StrCat("metadata key #", k);
    ASSIGN_OR_RETURN(absl::string_view key, in_.String(what, kGgufMaxNameBytes));
    if (key.empty()) return Error(absl::StrCat(what, " is empty"));
    if (!seen.insert(std::string(key)).second) {
      return Error(absl::StrCat("duplicate metadata key '", key, "'"));
    }
    const std::string named = absl::StrCat("metadata key '", key, "'");
    ASSIGN_OR_RETURN(uint64_t type, in_.Uint(4, absl::StrCat("type of ", named)));
    GgufKeyValue kv;
    kv.key = std::string(key);
    RETURN_IF_ERROR(ParseValue(static_cast<uint32_t>(type), named, &kv.value));
    entries.push_back(std::move(kv));
  }
  f_->metadata_ = GgufMetadata(f_->source_, std::move(entries));
  return absl::OkStatus();
}

absl::Status GgufParser::ParseValue(uint32_t type, const std::string& what,
                                    GgufValue* v) {
  if (!IsKnownGgufValueType(type)) {
    return Error(absl::StrCat(what, " has unknown value type ", type));
  }
  v->type = static_cast<GgufValueType>(type);
  switch (v->type) {
    case GgufValueType::kString: {
      ASSIGN_OR_RETURN(v->str, in_.String(what, std::numeric_limits<uint64_t>::max()));
      return absl::OkStatus();
    }
    case GgufValueType::kArray:
      return ParseArray(what, v);
    default:
      break;
  }
  const int size = GgufValueFixedSize(v->type);
  ASSIGN_OR_RETURN(uint64_t bits, in_.Uint(size, what));
  switch (v->type) {
    case GgufValueType::kInt8:
    case GgufValueType::kInt16:
    case GgufValueType::kInt32:
    case GgufValueType::kInt64: {
      const int shift = 64 - 8 * size;
      v->i = static_cast<int64_t>(bits << shift) >> shift;
      break;
    }
    case GgufValueType::kFloat32: {
      uint32_t b32 = static_cast<uint32_t>(bits);
      float f;
      std::memcpy(&f, &b32, 4);
      v->f = f;
      break;
    }
    case GgufValueType::kFloat64:
      std::memcpy(&v->f, &bits, 8);
      break;
    case GgufValueType::kBool:
      if (bits > 1) return Error(absl::StrCat(what, " is a BOOL of value ", bits));
      v->u = bits;
      break;
    default:
      v->u = bits;
  }
  return absl::OkStatus();
}

absl::Status GgufParser::ParseArray(const std::string& what, GgufValue* v) {
  ASSIGN_OR_RETURN(uint64_t elem,
                   in_.Uint(4, absl::StrCat("array element type of ", what)));
  if (elem == static_cast<uint32_t>(GgufValueType::kArray)) {
    return Error(absl::StrCat(what, " is an array of arrays, which is not supported"));
  }
  if (!IsKnownGgufValueType(static_cast<uint32_t>(elem))) {
    return Error(absl::StrCat(what, " has unknown array element type ", elem));
  }
  v->array_type = static_cast<GgufValueType>(elem);
  ASSIGN_OR_RETURN(v->array_size,
                   in_.Uint(8, absl::StrCat("array length of ", what)));
  const std::string elems = absl::StrCat(what, " (array of ", v->array_size, " ",
                                         GgufValueTypeName(v->array_type), ")");
  if (v->array_type != GgufValueType::kString) {
    uint64_t bytes = 0;
    if (!CheckedMul<uint64_t>(v->array_size, GgufValueFixedSize(v->array_type),
                              &bytes)) {
      return Error(absl::StrCat(elems, " is larger than 2^64 bytes"));
    }
    RETURN_IF_ERROR(in_.Need(bytes, elems));
    const uint8_t* p = in_.Take(bytes);
    v->array_bytes = absl::Span<const uint8_t>(p, bytes);
    if (v->array_type == GgufValueType::kBool) {
      for (uint64_t k = 0; k < bytes; ++k) {
        if (p[k] > 1) {
          return Error(absl::StrCat(what, " element ", k, " is a BOOL of value ",
                                    static_cast<int>(p[k])));
        }
      }
    }
    return absl::OkStatus();
  }
  if (v->array_size > in_.left() / kStringLengthBytes) {
    return Error(absl::StrCat(elems, " cannot fit in the ", in_.left(),
                              " bytes left"));
  }
  v->array_strings.reserve(std::min(v->array_size, kMaxReserve));
  for (uint64_t k = 0; k < v->array_size; ++k) {
    ASSIGN_OR_RETURN(absl::string_view s,
                     in_.String(absl::StrCat(what, " element ", k),
                                std::numeric_limits<uint64_t>::max()));
    v->array_strings.push_back(s);
  }
  return absl::OkStatus();
}

absl::Status GgufParser::CheckWellKnownKeys() {
  const GgufMetadata& m = f_->metadata_;
  if (const GgufValue* a = m.Find(kGgufAlignmentKey)) {
    if (a->type != GgufValueType::kUint32) {
      return Error(absl::StrCat(kGgufAlignmentKey, " is ", a->TypeName(),
                                ", expected UINT32"));
    }
    if (!IsPowerOfTwo(a->u)) {
      return Error(absl::StrCat(kGgufAlignmentKey, " is ", a->u,
                                ", expected a power of two"));
    }
    f_->alignment_ = static_cast<uint32_t>(a->u);
  }
  const bool has_no = m.Has(kGgufSplitNoKey), has_count = m.Has(kGgufSplitCountKey);
  if (has_no != has_count) {
    return Error(absl::StrCat("has ", has_no ? kGgufSplitNoKey : kGgufSplitCountKey,
                              " without ",
                              has_no ? kGgufSplitCountKey : kGgufSplitNoKey));
  }
  if (has_count) {
    ASSIGN_OR_RETURN(uint64_t count, m.GetUint(kGgufSplitCountKey));
    ASSIGN_OR_RETURN(uint64_t no, m.GetUint(kGgufSplitNoKey));
    if (count < 1 || count > 65535) {
      return Error(absl::StrCat(kGgufSplitCountKey, " is ", count,
                                ", expected 1 to 65535"));
    }
    if (no >= count) {
      return Error(absl::StrCat(kGgufSplitNoKey, " is ", no, " but ",
                                kGgufSplitCountKey, " is ", count));
    }
  }
  if (m.Has(kGgufSplitTensorsKey)) {
    RETURN_IF_ERROR(m.GetUint(kGgufSplitTensorsKey).status());
  }
  return absl::OkStatus();
}

absl::Status GgufParser::ParseTensorInfos() {
  f_->tensors_.reserve(std::min(tensor_count_, kMaxReserve));
  for (uint64_t k = 0; k < tensor_count_; ++k) {
    GgufTensorInfo t;
    RETURN_IF_ERROR(ParseTensorInfo(k, &t));
    f_->tensors_.push_back(std::move(t));
  }
  for (size_t k = 0; k < f_->tensors_.size(); ++k) {
    if (!f_->index_.emplace(f_->tensors_[k].name, k).second) {
      return Error(
          absl::StrCat("duplicate tensor name '", f_->tensors_[k].name, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status GgufParser::ParseTensorInfo(uint64_t k, GgufTensorInfo* t) {
  const std::string what = absl::StrCat("name of tensor #", k);
  ASSIGN_OR_RETURN(absl::string_view name, in_.String(what, kGgufMaxNameBytes));
  if (name.empty()) return Error(absl::StrCat("tensor #", k, " has an empty name"));
  t->name = std::string(name);
  RETURN_IF_ERROR(ParseDims(t));
  const std::string named = absl::StrCat("tensor '", t->name, "'");
  ASSIGN_OR_RETURN(uint64_t raw_type, in_.Uint(4, absl::StrCat("type of ", named)));
  const GgufTypeInfo* type =
      raw_type > std::numeric_limits<uint32_t>::max()
          ? nullptr
          : FindGgufType(static_cast<uint32_t>(raw_type));
  if (type == nullptr) {
    return Error(absl::StrCat(named, " has unknown ggml type ", raw_type));
  }
  t->type = type->type;
  if (t->dims[0] % type->block_elems != 0) {
    return Error(absl::StrCat(named, " row length ", t->dims[0],
                              " is not a multiple of the ", type->name,
                              " block size ", type->block_elems));
  }
  uint64_t bytes = 0;
  if (!CheckedMul<uint64_t>(static_cast<uint64_t>(t->numel / type->block_elems),
                            static_cast<uint64_t>(type->block_bytes), &bytes)) {
    return Error(absl::StrCat(named, " byte size overflows"));
  }
  t->nbytes = bytes;
  ASSIGN_OR_RETURN(t->offset, in_.Uint(8, absl::StrCat("offset of ", named)));
  if (t->offset % f_->alignment_ != 0) {
    return Error(absl::StrCat(named, " offset ", t->offset,
                              " is not a multiple of the alignment ", f_->alignment_));
  }
  return absl::OkStatus();
}

absl::Status GgufParser::ParseDims(GgufTensorInfo* t) {
  const std::string named = absl::StrCat("tensor '", t->name, "'");
  ASSIGN_OR_RETURN(uint64_t n_dims,
                   in_.Uint(4, absl::StrCat("dimension count of ", named)));
  if (n_dims < 1 || n_dims > static_cast<uint64_t>(kGgufMaxDims)) {
    return Error(absl::StrCat(named, " has ", n_dims, " dimensions (1 to ",
                              kGgufMaxDims, " are supported)"));
  }
  int64_t numel = 1;
  for (uint64_t d = 0; d < n_dims; ++d) {
    ASSIGN_OR_RETURN(uint64_t dim,
                     in_.Uint(8, absl::StrCat("dimension ", d, " of ", named)));
    if (dim == 0) return Error(absl::StrCat(named, " dimension ", d, " is 0"));
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        !CheckedMul<int64_t>(numel, static_cast<int64_t>(dim), &numel)) {
      return Error(absl::StrCat(named, " element count overflows int64 (dimension ",
                                d, " is ", dim, ")"));
    }
    t->dims.push_back(static_cast<int64_t>(dim));
  }
  t->numel = numel;
  return absl::OkStatus();
}

absl::Status GgufParser::LayOut() {
  const uint64_t a = f_->alignment_;
  uint64_t end = 0;
  if (!CheckedAdd<uint64_t>(in_.pos(), a - 1, &end)) {
    return Error("data section offset overflows");
  }
  f_->data_offset_ = end & ~(a - 1);
  f_->data_size_ = f_->size_ > f_->data_offset_ ? f_->size_ - f_->data_offset_ : 0;
  std::vector<const GgufTensorInfo*> order;
  for (const GgufTensorInfo& t : f_->tensors_) {
    uint64_t stop = 0;
    if (!CheckedAdd(t.offset, t.nbytes, &stop) || stop > f_->data_size_) {
      return Error(absl::StrCat("tensor '", t.name, "' bytes [", t.offset, ", +",
                                t.nbytes, ") run past the end of the data section (",
                                f_->data_size_, " bytes from offset ",
                                f_->data_offset_, ")"));
    }
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(),
            [](const GgufTensorInfo* x, const GgufTensorInfo* y) {
              return x->offset < y->offset;
            });
  for (size_t k = 1; k < order.size(); ++k) {
    const GgufTensorInfo& p = *order[k - 1];
    if (order[k]->offset < p.offset + p.nbytes) {
      return Error(absl::StrCat("tensors '", p.name, "' [", p.offset, ", ",
                                p.offset + p.nbytes, ") and '", order[k]->name,
                                "' [", order[k]->offset, ", ",
                                order[k]->offset + order[k]->nbytes, ") overlap"));
    }
  }
  return absl::OkStatus();
}

GgufFile::~GgufFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(OpenedFile opened, OpenRegularFile(path));
  const size_t size = static_cast<size_t>(opened.size());
  if (size < kGgufHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": file is ", size, " bytes, too small for the ",
                     kGgufHeaderBytes, "-byte GGUF header"));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, opened.fd(), 0);
  const int mmap_errno = errno;
  if (map == MAP_FAILED) return ErrnoToStatus(mmap_errno, "cannot mmap", path);
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->source_ = path;
  file->mapping_ = map;
  file->mapping_size_ = size;
  file->bytes_ = static_cast<const uint8_t*>(map);
  file->size_ = size;
  RETURN_IF_ERROR(GgufParser(file.get()).Run());
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Parse(const uint8_t* data,
                                                          size_t size,
                                                          absl::string_view source) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->source_ = std::string(source);
  file->bytes_ = data;
  file->size_ = size;
  RETURN_IF_ERROR(GgufParser(file.get()).Run());
  return file;
}

const GgufTensorInfo* GgufFile::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::Span<const uint8_t> GgufFile::Data(const GgufTensorInfo& tensor) const {
  return absl::Span<const uint8_t>(bytes_ + data_offset_ + tensor.offset,
                                   tensor.nbytes);
}

namespace {

// Parses a run of at least five decimal digits ending at s[end) backwards;
// returns its start, or npos.
size_t DigitsBefore(absl::string_view s, size_t end, int* value) {
  size_t b = end;
  while (b > 0 && s[b - 1] >= '0' && s[b - 1] <= '9' && end - b < 9) --b;
  if (end - b < 5 || (b > 0 && s[b - 1] >= '0' && s[b - 1] <= '9')) {
    return absl::string_view::npos;
  }
  int v = 0;
  for (size_t k = b; k < end; ++k) v = v * 10 + (s[k] - '0');
  *value = v;
  return b;
}

}  // namespace

bool ParseGgufSplitPath(absl::string_view path, std::string* prefix, int* part,
                        int* count) {
  constexpr absl::string_view kExt = ".gguf", kOf = "-of-";
  if (path.size() < kExt.size() || path.substr(path.size() - kExt.size()) != kExt) {
    return false;
  }
  int n = 0, k = 0;
  size_t b = DigitsBefore(path, path.size() - kExt.size(), &n);
  if (b == absl::string_view::npos || b < kOf.size() ||
      path.substr(b - kOf.size(), kOf.size()) != kOf) {
    return false;
  }
  size_t a = DigitsBefore(path, b - kOf.size(), &k);
  if (a == absl::string_view::npos || a < 1 || path[a - 1] != '-') return false;
  *prefix = std::string(path.substr(0, a - 1));
  *part = k;
  *count = n;
  return true;
}

std::string GgufSplitPath(absl::string_view prefix, int part, int count) {
  return absl::StrFormat("%s-%05d-of-%05d.gguf", prefix, part, count);
}

absl::StatusOr<std::unique_ptr<GgufCheckpoint>> GgufCheckpoint::Open(
    const std::string& path) {
  std::unique_ptr<GgufCheckpoint> ckpt(new GgufCheckpoint());
  std::string prefix;
  int part = 0, count = 0;
  if (!ParseGgufSplitPath(path, &prefix, &part, &count)) {
    ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
    absl::StatusOr<uint64_t> n = file->metadata().GetUint(kGgufSplitCountKey);
    if (n.ok() && *n > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": ", kGgufSplitCountKey, " is ", *n,
          " but the name is not a part's (<prefix>-00001-of-", absl::StrFormat("%05d", *n),
          ".gguf)"));
    }
    ckpt->files_.push_back(std::move(file));
    RETURN_IF_ERROR(ckpt->Index());
    return ckpt;
  }
  if (count < 1 || part < 1 || part > count) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": part ", part, " of ", count, " is not a valid split part number"));
  }
  for (int k = 1; k <= count; ++k) {
    const std::string p = GgufSplitPath(prefix, k, count);
    ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(p));
    const GgufMetadata& m = file->metadata();
    if (count > 1 && !m.Has(kGgufSplitCountKey)) {
      return absl::InvalidArgumentError(absl::StrCat(
          p, ": part ", k, " of ", count, " lacks ", kGgufSplitCountKey));
    }
    if (m.Has(kGgufSplitCountKey)) {
      // Both keys are present and integers (the parser checked).
      const uint64_t n = *m.GetUint(kGgufSplitCountKey), no = *m.GetUint(kGgufSplitNoKey);
      if (n != static_cast<uint64_t>(count) || no != static_cast<uint64_t>(k - 1)) {
        return absl::InvalidArgumentError(absl::StrCat(
            p, ": ", kGgufSplitNoKey, " ", no, " and ", kGgufSplitCountKey, " ", n,
            " do not match the name (expected ", k - 1, " and ", count, ")"));
      }
    }
    ckpt->files_.push_back(std::move(file));
  }
  RETURN_IF_ERROR(ckpt->Index());
  return ckpt;
}

absl::Status GgufCheckpoint::Index() {
  for (size_t k = 0; k < files_.size(); ++k) {
    for (GgufTensorInfo t : files_[k]->tensors()) {
      t.file_index = static_cast<int>(k);
      tensors_.push_back(std::move(t));
    }
  }
  for (size_t k = 0; k < tensors_.size(); ++k) {
    auto [it, inserted] = index_.emplace(tensors_[k].name, k);
    if (!inserted) {
      const GgufTensorInfo& first = tensors_[it->second];
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", first.name, "' is in both ", files_[first.file_index]->source(),
          " and ", files_[tensors_[k].file_index]->source()));
    }
  }
  const GgufMetadata& m = metadata();
  if (m.Has(kGgufSplitTensorsKey)) {
    const uint64_t n = *m.GetUint(kGgufSplitTensorsKey);
    if (n != tensors_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          files_.front()->source(), ": ", kGgufSplitTensorsKey, " is ", n, " but the ",
          files_.size(), " part(s) hold ", tensors_.size(), " tensors"));
    }
  }
  return absl::OkStatus();
}

const GgufTensorInfo* GgufCheckpoint::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::Span<const uint8_t> GgufCheckpoint::Data(const GgufTensorInfo& tensor) const {
  return files_[tensor.file_index]->Data(tensor);
}

}  // namespace moe
