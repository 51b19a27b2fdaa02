#include "common/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/gguf_blocks.h"
#include "common/row_interleave.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/mxfp4.h"

namespace moe {
namespace {

void QuantizeQ8Block(const float* w, uint8_t* b) {
  float amax = 0.0f;
  for (int64_t i = 0; i < kQ8Group; ++i) amax = std::max(amax, std::fabs(w[i]));
  const uint16_t dh = FloatToHalf(amax / 127.0f);
  const float d = HalfToFloat(dh);
  std::memcpy(b, &dh, 2);
  for (int64_t i = 0; i < kQ8Group; ++i) {
    float q = d > 0.0f ? std::nearbyint(w[i] / d) : 0.0f;
    q = std::clamp(q, -127.0f, 127.0f);
    b[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(q));
  }
}

void QuantizeQ4Block(const float* w, uint8_t* b) {
  float lo = w[0], hi = w[0];
  for (int64_t i = 1; i < kQ4Group; ++i) {
    lo = std::min(lo, w[i]);
    hi = std::max(hi, w[i]);
  }
  const uint16_t mh = FloatToHalf(lo);
  const float m = HalfToFloat(mh);
  // The rounded minimum may sit above lo; the scale must still reach hi.
  const uint16_t dh = FloatToHalf((hi - m) / 15.0f);
  const float d = HalfToFloat(dh);
  std::memcpy(b, &dh, 2);
  std::memcpy(b + 2, &mh, 2);
  uint8_t q[kQ4Group];
  for (int64_t i = 0; i < kQ4Group; ++i) {
    float v = d > 0.0f ? std::nearbyint((w[i] - m) / d) : 0.0f;
    q[i] = static_cast<uint8_t>(std::clamp(v, 0.0f, 15.0f));
  }
  for (int64_t j = 0; j < 32; ++j) {
    b[4 + j] = static_cast<uint8_t>(q[j] | (q[j + 32] << 4));
  }
}

}  // namespace

absl::Status QuantizeRow(const float* src, int64_t cols, DType format,
                         void* dst) {
  if (!IsQuantDType(format)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "QuantizeRow: ", DTypeName(format), " is not a block format"));
  }
  if (RowMajorOf(format) != format) {
    return absl::InvalidArgumentError(absl::StrCat(
        "QuantizeRow: ", DTypeName(format), " interleaves rows; quantize to ",
        DTypeName(RowMajorOf(format)), " and interleave whole groups (ConvertWeights)"));
  }
  if (IsGgufBlockDType(format)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot quantize weights to ", DTypeName(format),
        ": ggml's block formats are only read from GGUF files (hold them as q8, q4, "
        "mxfp4 or bf16 instead)"));
  }
  const int64_t group = QuantGroupSize(format);
  if (cols <= 0 || cols % group != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot quantize a row of ", cols, " weights to ", DTypeName(format),
        ": the length must be a positive multiple of ", group));
  }
  for (int64_t i = 0; i < cols; ++i) {
    if (!std::isfinite(src[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot quantize a non-finite weight (", src[i], " at ", i, ")"));
    }
  }
  auto* out = static_cast<uint8_t*>(dst);
  const int64_t bb = QuantBlockBytes(format);
  for (int64_t g = 0; g < cols / group; ++g) {
    if (format == DType::kMxfp4) {
      // QuantizeMxfp4Row's split layout, packed: scale, then the codes.
      uint8_t codes[16] = {};
      QuantizeMxfp4Row(src + g * group, group, codes, out + g * bb);
      std::memcpy(out + g * bb + 1, codes, 16);
    } else if (format == DType::kQ8) {
      QuantizeQ8Block(src + g * group, out + g * bb);
    } else {
      QuantizeQ4Block(src + g * group, out + g * bb);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DType> ParseExpertFormat(absl::string_view name) {
  if (name == "bf16") return DType::kBF16;
  if (name == "q8") return DType::kQ8;
  if (name == "q4") return DType::kQ4;
  if (name == "mxfp4") return DType::kMxfp4;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown expert format '", name, "' (choose bf16, q8, q4 or mxfp4)"));
}

std::string ExpertFormatsName(absl::Span<const ExpertDTypes> formats) {
  std::vector<std::string> names;
  for (const ExpertDTypes& f : formats) {
    for (DType t : {f.gate, f.up, f.down}) {
      std::string n = ExpertFormatName(t);
      if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(std::move(n));
    }
  }
  return names.empty() ? "none" : absl::StrJoin(names, "+");
}

DType WidestDType(absl::Span<const ExpertDTypes> formats) {
  MOE_CHECK(!formats.empty());
  DType best = formats[0].gate;
  auto per_weight = [](DType t) {
    return static_cast<double>(QuantBlockBytes(t)) / static_cast<double>(QuantGroupSize(t));
  };
  for (const ExpertDTypes& f : formats) {
    for (DType t : {f.gate, f.up, f.down}) {
      if (per_weight(t) > per_weight(best)) best = t;
    }
  }
  return best;
}

std::string ExpertFormatName(DType format) {
  switch (format) {
    case DType::kBF16:
      return "bf16";
    case DType::kQ8:
      return "q8";
    case DType::kQ4:
      return "q4";
    case DType::kMxfp4:
      return "mxfp4";
    default:
      return std::string(DTypeName(format));
  }
}

namespace {

absl::Status ConvertInterleaved(const void* src, DType from, int64_t rows, int64_t cols,
                                DType to, void* dst) {
  if (from == to) {  // group for group
    if (rows % kQ4KR16Rows != 0 || cols % QuantGroupSize(from) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a [", rows, ", ", cols, "] matrix is not whole ", DTypeName(from), " groups"));
    }
    if (rows > 0) std::memcpy(dst, src, static_cast<size_t>(WeightBytes(from, rows, cols)));
    return absl::OkStatus();
  }
  if (RowMajorOf(from) != from) {
    const DType plain = RowMajorOf(from);
    std::vector<uint8_t> buf(static_cast<size_t>(std::max<int64_t>(
        0, WeightBytes(plain, rows, std::max<int64_t>(cols, 0)))));
    RETURN_IF_ERROR(DeinterleaveRows16(from, src, rows, cols, buf.data()));
    return ConvertWeights(buf.data(), plain, rows, cols, to, dst);
  }
  const DType plain = RowMajorOf(to);
  if (from == plain) return InterleaveRows16(to, src, rows, cols, dst);
  const int64_t bytes = WeightBytes(plain, rows, cols);
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rows of ", cols, " weights are not whole ", DTypeName(to), " blocks of ",
        QuantGroupSize(to)));
  }
  std::vector<uint8_t> buf(static_cast<size_t>(bytes));
  RETURN_IF_ERROR(ConvertWeights(src, from, rows, cols, plain, buf.data()));
  return InterleaveRows16(to, buf.data(), rows, cols, dst);
}

}  // namespace

absl::Status ConvertWeights(const void* src, DType from, int64_t rows,
                            int64_t cols, DType to, void* dst) {
  if (RowMajorOf(from) != from || RowMajorOf(to) != to) {
    return ConvertInterleaved(src, from, rows, cols, to, dst);
  }
  if (!IsFloatDType(from) && !IsQuantDType(from)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot convert weights of dtype ", DTypeName(from)));
  }
  const int64_t in_row = WeightBytes(from, 1, cols);
  const int64_t out_row = WeightBytes(to, 1, cols);
  if (in_row < 0 || out_row < 0) {
    const DType bad = in_row < 0 ? from : to;
    return absl::InvalidArgumentError(absl::StrCat(
        "rows of ", cols, " weights are not whole ", DTypeName(bad),
        " blocks of ", QuantGroupSize(bad)));
  }
  const auto* in = static_cast<const uint8_t*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  if (from == to) {  // block for block
    if (rows > 0) std::memcpy(out, in, static_cast<size_t>(rows * in_row));
    return absl::OkStatus();
  }
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    absl::Status s;
    if (IsQuantDType(from)) {
      DequantizeRow(in + r * in_row, from, cols, row.data());
    } else {
      s = ConvertToFloat(in + r * in_row, from, cols, row.data());
    }
    if (s.ok()) {
      s = IsQuantDType(to) ? QuantizeRow(row.data(), cols, to, out + r * out_row)
                           : ConvertFromFloat(row.data(), cols, to, out + r * out_row);
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void DequantizeRow(const void* src, DType format, int64_t cols, float* dst) {
  MOE_CHECK(RowMajorOf(format) == format)
      << "DequantizeRow: " << DTypeName(format) << " has no rows of its own";
  if (const std::optional<GgufType> t = GgufTypeOfDType(format);
      t.has_value() && format != DType::kQ8) {
    MOE_CHECK(DequantizeGguf(*t, static_cast<const uint8_t*>(src), cols, dst).ok())
        << "DequantizeRow: " << cols << " weights are not whole " << DTypeName(format)
        << " blocks";
    return;
  }
  for (int64_t i = 0; i < cols; ++i) dst[i] = DequantizeElement(src, format, i);
}

}  // namespace moe
