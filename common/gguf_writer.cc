#include "common/gguf_writer.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checked_math.h"
#include "common/file_util.h"
#include "common/gguf.h"
#include "common/status_macros.h"

namespace moe {
namespace {

constexpr uint32_t kMaxAlignment = 1u << 20;

void PutLE(std::string* out, uint64_t v, int bytes) {
  for (int b = 0; b < bytes; ++b) out->push_back(static_cast<char>((v >> (8 * b)) & 0xff));
}

void PutString(std::string* out, absl::string_view s) {
  PutLE(out, s.size(), 8);
  out->append(s.data(), s.size());
}

bool IsUnsigned(GgufValueType t) {
  return t == GgufValueType::kUint8 || t == GgufValueType::kUint16 ||
         t == GgufValueType::kUint32 || t == GgufValueType::kUint64;
}

bool IsSigned(GgufValueType t) {
  return t == GgufValueType::kInt8 || t == GgufValueType::kInt16 ||
         t == GgufValueType::kInt32 || t == GgufValueType::kInt64;
}

absl::Status OutOfRange(absl::string_view key, GgufValueType type,
                        absl::string_view value) {
  return absl::InvalidArgumentError(absl::StrCat(
      "GGUF key '", key, "': ", value, " does not fit ", GgufValueTypeName(type)));
}

// Appends `v` encoded as unsigned `type`, or fails naming the key.
absl::Status EncodeUint(absl::string_view key, GgufValueType type, uint64_t v,
                        std::string* out) {
  const int size = GgufValueFixedSize(type);
  if (size < 8 && v >> (8 * size) != 0) return OutOfRange(key, type, absl::StrCat(v));
  PutLE(out, v, size);
  return absl::OkStatus();
}

absl::Status EncodeInt(absl::string_view key, GgufValueType type, int64_t v,
                       std::string* out) {
  const int size = GgufValueFixedSize(type);
  if (size < 8) {
    const int64_t lim = int64_t{1} << (8 * size - 1);
    if (v < -lim || v >= lim) return OutOfRange(key, type, absl::StrCat(v));
  }
  PutLE(out, static_cast<uint64_t>(v), size);
  return absl::OkStatus();
}

absl::Status EncodeFloat(absl::string_view key, GgufValueType type, double v,
                         std::string* out) {
  uint64_t bits;
  if (type == GgufValueType::kFloat32) {
    if (std::isfinite(v) && std::fabs(v) > FLT_MAX) {
      return OutOfRange(key, type, absl::StrCat(v));
    }
    const float f = static_cast<float>(v);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    bits = b;
  } else {
    std::memcpy(&bits, &v, 8);
  }
  PutLE(out, bits, GgufValueFixedSize(type));
  return absl::OkStatus();
}

absl::Status WrongKind(absl::string_view key, GgufValueType type,
                       absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat("GGUF key '", key, "': type ",
                                                 GgufValueTypeName(type), " is not ",
                                                 expected));
}

// The array header: element tag and count.
std::string ArrayHead(GgufValueType elem, size_t count) {
  std::string out;
  PutLE(&out, static_cast<uint32_t>(elem), 4);
  PutLE(&out, count, 8);
  return out;
}

}  // namespace

absl::Status GgufWriter::CheckName(
    absl::string_view what, absl::string_view name,
    const absl::flat_hash_set<std::string>& used) const {
  if (name.empty() || name.size() > kGgufMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF ", what, " '", name.substr(0, 64),
                                                   "' is ", name.size(),
                                                   " bytes; expected 1 to ",
                                                   kGgufMaxNameBytes));
  }
  if (used.contains(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF ", what, " '", name, "' was added already"));
  }
  return absl::OkStatus();
}

absl::Status GgufWriter::AddEncoded(absl::string_view key, GgufValueType type,
                                    const std::string& value) {
  RETURN_IF_ERROR(CheckName("key", key, keys_));
  if (key == kGgufAlignmentKey && !setting_alignment_) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF key '", key, "' is set by SetAlignment only"));
  }
  PutString(&kv_, key);
  PutLE(&kv_, static_cast<uint32_t>(type), 4);
  kv_ += value;
  keys_.emplace(key);
  ++kv_count_;
  return absl::OkStatus();
}

absl::Status GgufWriter::SetAlignment(uint32_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > kMaxAlignment) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF alignment ", alignment, " is not a power of two up to ", kMaxAlignment));
  }
  if (!tensors_.empty()) {
    return absl::InvalidArgumentError("GGUF alignment must be set before any tensor");
  }
  setting_alignment_ = true;
  const absl::Status added = AddUint(kGgufAlignmentKey, GgufValueType::kUint32, alignment);
  setting_alignment_ = false;
  RETURN_IF_ERROR(added);
  alignment_ = alignment;
  return absl::OkStatus();
}

absl::Status GgufWriter::AddUint(absl::string_view key, GgufValueType type,
                                 uint64_t value) {
  if (!IsUnsigned(type)) return WrongKind(key, type, "an unsigned integer type");
  std::string v;
  RETURN_IF_ERROR(EncodeUint(key, type, value, &v));
  return AddEncoded(key, type, v);
}

absl::Status GgufWriter::AddInt(absl::string_view key, GgufValueType type,
                                int64_t value) {
  if (!IsSigned(type)) return WrongKind(key, type, "a signed integer type");
  std::string v;
  RETURN_IF_ERROR(EncodeInt(key, type, value, &v));
  return AddEncoded(key, type, v);
}

absl::Status GgufWriter::AddFloat(absl::string_view key, GgufValueType type,
                                  double value) {
  if (!IsGgufFloatType(type)) return WrongKind(key, type, "FLOAT32 or FLOAT64");
  std::string v;
  RETURN_IF_ERROR(EncodeFloat(key, type, value, &v));
  return AddEncoded(key, type, v);
}

absl::Status GgufWriter::AddBool(absl::string_view key, bool value) {
  return AddEncoded(key, GgufValueType::kBool, std::string(1, value ? '\1' : '\0'));
}

absl::Status GgufWriter::AddString(absl::string_view key, absl::string_view value) {
  std::string v;
  PutString(&v, value);
  return AddEncoded(key, GgufValueType::kString, v);
}

absl::Status GgufWriter::AddIntArray(absl::string_view key, GgufValueType elem,
                                     absl::Span<const int64_t> values) {
  std::string v = ArrayHead(elem, values.size());
  for (int64_t x : values) {
    if (IsUnsigned(elem) || elem == GgufValueType::kBool) {
      if (x < 0 || (elem == GgufValueType::kBool && x > 1)) {
        return OutOfRange(key, elem, absl::StrCat(x));
      }
      RETURN_IF_ERROR(EncodeUint(key, elem, static_cast<uint64_t>(x), &v));
    } else if (IsSigned(elem)) {
      RETURN_IF_ERROR(EncodeInt(key, elem, x, &v));
    } else {
      return WrongKind(key, elem, "an integer or BOOL element type");
    }
  }
  return AddEncoded(key, GgufValueType::kArray, v);
}

absl::Status GgufWriter::AddFloatArray(absl::string_view key, GgufValueType elem,
                                       absl::Span<const double> values) {
  if (!IsGgufFloatType(elem)) return WrongKind(key, elem, "FLOAT32 or FLOAT64");
  std::string v = ArrayHead(elem, values.size());
  for (double x : values) RETURN_IF_ERROR(EncodeFloat(key, elem, x, &v));
  return AddEncoded(key, GgufValueType::kArray, v);
}

absl::Status GgufWriter::AddStringArray(absl::string_view key,
                                        absl::Span<const std::string> values) {
  std::string v = ArrayHead(GgufValueType::kString, values.size());
  for (const std::string& s : values) PutString(&v, s);
  return AddEncoded(key, GgufValueType::kArray, v);
}

absl::Status GgufWriter::AddTensor(absl::string_view name, GgufType type,
                                   std::vector<int64_t> dims,
                                   absl::Span<const uint8_t> data) {
  RETURN_IF_ERROR(CheckName("tensor", name, names_));
  const GgufTypeInfo* info = FindGgufType(static_cast<uint32_t>(type));
  if (info == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF tensor '", name, "': unknown ggml type ", static_cast<uint32_t>(type)));
  }
  if (dims.empty() || dims.size() > static_cast<size_t>(kGgufMaxDims)) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF tensor '", name, "' has ",
                                                   dims.size(), " dimensions; expected 1 to ",
                                                   kGgufMaxDims));
  }
  int64_t numel = 1;
  for (int64_t d : dims) {
    if (d < 1 || !CheckedMul(numel, d, &numel)) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF tensor '", name, "': dims [", absl::StrJoin(dims, ", "),
                       "] are not all >= 1 or their product overflows int64"));
    }
  }
  if (dims[0] % info->block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF tensor '", name, "': rows of ", dims[0], " are not whole ", info->name,
        " blocks of ", info->block_elems));
  }
  uint64_t nbytes = 0;
  if (!CheckedMul(static_cast<uint64_t>(numel / info->block_elems),
                  static_cast<uint64_t>(info->block_bytes), &nbytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF tensor '", name, "': its byte count overflows"));
  }
  if (data.size() != nbytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF tensor '", name, "' of ", info->name, " [", absl::StrJoin(dims, ", "),
        "] needs ", nbytes, " bytes, got ", data.size()));
  }
  data_.append((alignment_ - data_.size() % alignment_) % alignment_, '\0');
  tensors_.push_back(Tensor{std::string(name), type, std::move(dims), data_.size(), nbytes});
  data_.append(reinterpret_cast<const char*>(data.data()), data.size());
  names_.emplace(name);
  return absl::OkStatus();
}

std::string GgufWriter::Serialize() const {
  std::string out = "GGUF";
  PutLE(&out, kGgufWriterVersion, 4);
  PutLE(&out, tensors_.size(), 8);
  PutLE(&out, kv_count_, 8);
  out += kv_;
  for (const Tensor& t : tensors_) {
    PutString(&out, t.name);
    PutLE(&out, t.dims.size(), 4);
    for (int64_t d : t.dims) PutLE(&out, static_cast<uint64_t>(d), 8);
    PutLE(&out, static_cast<uint32_t>(t.type), 4);
    PutLE(&out, t.offset, 8);
  }
  out.append((alignment_ - out.size() % alignment_) % alignment_, '\0');
  out += data_;
  out.append((alignment_ - data_.size() % alignment_) % alignment_, '\0');
  return out;
}

absl::Status GgufWriter::Write(const std::string& path) const {
  return WriteFileAtomically(path, Serialize());
}

}  // namespace moe
