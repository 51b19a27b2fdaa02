#include "common/fp8.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/mxfp4.h"
#include "common/quant.h"
#include "common/row_interleave.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace moe {
namespace {

using nlohmann::json;

const std::array<float, 256>& Fp8Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) {
      const int e = (b >> 3) & 0xf;
      const int m = b & 7;
      float v;
      if (e == 15 && m == 7) {
        v = std::nanf("");
      } else if (e == 0) {
        v = std::ldexp(static_cast<float>(m), -9);  // subnormal: m/8 * 2^-6
      } else {
        v = std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
      }
      t[b] = (b & 0x80) ? -v : v;
    }
    return t;
  }();
  return table;
}

float ScaleAt(const BlockScales& s, int64_t i) {
  switch (s.dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, s.data + 4 * i, 4);
      return f;
    }
    default: {
      uint16_t h;
      std::memcpy(&h, s.data + 2 * i, 2);
      return s.dtype == DType::kBF16 ? BF16ToFloat(h) : HalfToFloat(h);
    }
  }
}

// ceil(a / b) for a >= 0, b > 0, without forming a + b - 1 (which overflows
// for a dimension near INT64_MAX: an empty weight may have one).
int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

std::string JsonText(const json& j) { return j.dump(); }

}  // namespace

float Fp8E4M3ToFloat(uint8_t bits) { return Fp8Table()[bits]; }

uint8_t FloatToFp8E4M3(float value) {
  if (std::isnan(value)) return 0x7f;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const float a = std::fabs(value);
  if (a >= kFp8E4M3Max) return sign | 0x7e;
  if (a < 0x1p-6f) {
    // Subnormal steps of 2^-9; a result of 8 is the smallest normal, whose
    // code is 8 as well.
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  int k;
  const float f = std::frexp(a, &k);  // a = f 2^k, f in [0.5, 1)
  int e = k - 1;                       // a = (2f) 2^e
  int q = static_cast<int>(std::nearbyint(f * 16.0f));  // 8 + mantissa
  if (q == 16) {
    q = 8;
    ++e;
  }
  const int code = ((e + 7) << 3) | (q - 8);
  return sign | static_cast<uint8_t>(std::min(code, 0x7e));
}

absl::StatusOr<std::optional<Fp8BlockScheme>> ParseQuantizationConfig(
    const json& config) {
  auto it = config.find("quantization_config");
  if (it == config.end() || it->is_null()) return std::nullopt;
  const json& q = *it;
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantization_config ", why,
        " (supported: quant_method \"fp8\", fmt \"e4m3\", activation_scheme "
        "\"dynamic\", weight_block_size [B0, B1])"));
  };
  if (!q.is_object()) return bad("is not an object");
  auto str = [&](const char* key, const char* dflt) -> std::string {
    auto f = q.find(key);
    if (f == q.end() || f->is_null()) return dflt;
    return f->is_string() ? f->get<std::string>() : JsonText(*f);
  };
  const std::string method = str("quant_method", "");
  if (method != "fp8") {
    return bad(method.empty() ? std::string("has no quant_method")
                              : absl::StrCat("quant_method '", method,
                                             "' is not supported"));
  }
  const std::string fmt = str("fmt", "e4m3");
  if (fmt != "e4m3") {
    return bad(absl::StrCat("fmt '", fmt, "' is not supported"));
  }
  const std::string act = str("activation_scheme", "dynamic");
  if (act != "dynamic") {
    return bad(absl::StrCat("activation_scheme '", act, "' is not supported"));
  }
  auto b = q.find("weight_block_size");
  if (b == q.end() || b->is_null()) {
    return bad("has no weight_block_size (per-tensor fp8 scales are not "
               "supported)");
  }
  if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number_integer() ||
      !(*b)[1].is_number_integer() || (*b)[0].get<int64_t>() <= 0 ||
      (*b)[1].get<int64_t>() <= 0 || (*b)[0].get<int64_t>() > (1 << 20) ||
      (*b)[1].get<int64_t>() > (1 << 20)) {
    return bad(absl::StrCat("weight_block_size ", JsonText(*b),
                            " is not two positive integers"));
  }
  return Fp8BlockScheme{(*b)[0].get<int64_t>(), (*b)[1].get<int64_t>()};
}

nlohmann::ordered_json QuantizationConfigJson(const Fp8BlockScheme& s) {
  nlohmann::ordered_json j;
  j["activation_scheme"] = "dynamic";
  j["fmt"] = "e4m3";
  j["quant_method"] = "fp8";
  j["weight_block_size"] = {s.block_rows, s.block_cols};
  return j;
}

absl::Status ResolveWeightDType(const Checkpoint& ckpt, const std::string& name,
                                const std::optional<Fp8BlockScheme>& fp8,
                                TensorView* view) {
  const std::string scale_name = name + kFp8ScaleSuffix;
  if (IsFloatDType(view->dtype)) {
    if (ckpt.Has(scale_name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "has dtype ", DTypeName(view->dtype), " but also a '", scale_name,
          "'; only F8_E4M3 weights take block scales"));
    }
    return absl::OkStatus();
  }
  if (IsQuantDType(view->dtype) && view->scales.data == nullptr) {
    // Blocks with their scales inside (GGUF experts, Checkpoint::FromGguf).
    if (view->shape.size() == 2 &&
        WeightBytes(view->dtype, view->shape[0], view->shape[1]) ==
            static_cast<int64_t>(view->nbytes)) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "has dtype ", DTypeName(view->dtype), " but is not a 2-D weight of whole blocks"));
  }
  if (view->dtype != DType::kF8E4M3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "has dtype ", DTypeName(view->dtype),
        "; weights must be F32, F16 or BF16 (or F8_E4M3 with block scales)"));
  }
  if (!fp8.has_value()) {
    return absl::InvalidArgumentError(
        "has dtype F8_E4M3 but config.json declares no fp8 "
        "quantization_config (quant_method \"fp8\", weight_block_size)");
  }
  if (view->shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "has dtype F8_E4M3 but ", view->shape.size(),
        " dimensions; only 2-D weights may be F8_E4M3"));
  }
  auto scales = ckpt.Get(scale_name);
  if (!scales.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "has dtype F8_E4M3 but the checkpoint lacks its scales '", scale_name,
        "'"));
  }
  if (!IsFloatDType(scales->dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "has scales '", scale_name, "' of dtype ", DTypeName(scales->dtype),
        "; scales must be F32, BF16 or F16"));
  }
  const int64_t rows = view->shape[0], cols = view->shape[1];
  const std::vector<int64_t> want = {CeilDiv(rows, fp8->block_rows),
                                     CeilDiv(cols, fp8->block_cols)};
  if (scales->shape != want) {
    std::string got = "[";
    for (size_t i = 0; i < scales->shape.size(); ++i) {
      absl::StrAppend(&got, i ? ", " : "", scales->shape[i]);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "has scales '", scale_name, "' of shape ", got, "], expected [",
        want[0], ", ", want[1], "] (", rows, " x ", cols, " in blocks of ",
        fp8->block_rows, " x ", fp8->block_cols, ")"));
  }
  BlockScales s{scales->dtype, scales->data,     want[0],
                want[1],       fp8->block_rows, fp8->block_cols,
                scales->nbytes};
  for (int64_t i = 0; i < want[0] * want[1]; ++i) {
    const float v = ScaleAt(s, i);
    if (!std::isfinite(v) || v < 0.0f) {
      return absl::InvalidArgumentError(absl::StrCat(
          "has scale ", v, " at block ", i / want[1], ", ", i % want[1],
          " of '", scale_name, "'; scales must be finite and non-negative"));
    }
  }
  view->scales = s;
  return absl::OkStatus();
}

absl::Status DequantizeFp8Row(const TensorView& view, int64_t row, float* dst) {
  const BlockScales& s = view.scales;
  const int64_t cols = view.shape[1];
  const uint8_t* q = view.data + row * cols;
  const int64_t srow = row / s.block_rows;
  const std::array<float, 256>& table = Fp8Table();
  for (int64_t c0 = 0; c0 < cols; c0 += s.block_cols) {
    const float scale = ScaleAt(s, srow * s.cols + c0 / s.block_cols);
    const int64_t end = std::min(cols, c0 + s.block_cols);
    for (int64_t c = c0; c < end; ++c) {
      if ((q[c] & 0x7f) == 0x7f) {
        return absl::InvalidArgumentError(
            absl::StrCat("F8_E4M3 NaN at row ", row, ", column ", c));
      }
      dst[c] = table[q[c]] * scale;
    }
  }
  return absl::OkStatus();
}

absl::Status ConvertWeightView(const TensorView& view, DType to, void* dst) {
  if (view.shape.size() != 2) {
    return absl::InvalidArgumentError("ConvertWeightView: not a 2-D weight");
  }
  if (const DType plain = RowMajorOf(to);
      plain != to && view.dtype != to &&
      !(view.dtype == plain && view.scales.data == nullptr && !view.strided())) {
    // An interleaved layout: the row-major blocks first (every path below
    // writes rows), then interleaved.
    const int64_t bytes = WeightBytes(plain, view.shape[0], view.shape[1]);
    if (bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rows of ", view.shape[1], " weights are not whole ", DTypeName(to), " blocks"));
    }
    std::vector<uint8_t> rows(static_cast<size_t>(bytes));
    RETURN_IF_ERROR(ConvertWeightView(view, plain, rows.data()));
    return ConvertWeights(rows.data(), plain, view.shape[0], view.shape[1], to, dst);
  }
  if (IsQuantDType(view.dtype) && view.scales.data == nullptr && !view.strided()) {
    // Packed blocks (GGUF experts): the same bytes, or decoded and redone.
    return ConvertWeights(view.data, view.dtype, view.shape[0], view.shape[1], to, dst);
  }
  if (view.dtype == DType::kMxfp4) return ConvertMxfp4View(view, to, dst);
  if (view.strided()) return ConvertStridedView(view, to, dst);
  const int64_t rows = view.shape[0], cols = view.shape[1];
  if (view.dtype != DType::kF8E4M3) {
    return ConvertWeights(view.data, view.dtype, rows, cols, to, dst);
  }
  if (view.scales.data == nullptr) {
    return absl::InvalidArgumentError("F8_E4M3 weight without block scales");
  }
  const int64_t out_row = WeightBytes(to, 1, cols);
  if (out_row < 0 || (!IsFloatDType(to) && !IsQuantDType(to))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot convert F8_E4M3 rows of ", cols, " weights to ",
        DTypeName(to)));
  }
  auto* out = static_cast<uint8_t*>(dst);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    RETURN_IF_ERROR(DequantizeFp8Row(view, r, row.data()));
    if (IsQuantDType(to)) {
      RETURN_IF_ERROR(QuantizeRow(row.data(), cols, to, out + r * out_row));
    } else {
      RETURN_IF_ERROR(ConvertFromFloat(row.data(), static_cast<size_t>(cols),
                                       to, out + r * out_row));
    }
  }
  return absl::OkStatus();
}

DType DefaultHeldFormat(DType stored) {
  return stored == DType::kF8E4M3 || stored == DType::kMxfp4 ? DType::kQ8
                                                              : stored;
}

DType DefaultHeldFormat(const TensorView& expert) {
  if (expert.dtype == DType::kMxfp4 && expert.scales.data == nullptr && !expert.strided()) {
    return DType::kMxfp4;  // already our packed blocks (a GGUF file's MXFP4)
  }
  return DefaultHeldFormat(expert.dtype);
}

void QuantizeFp8Blocks(const float* w, int64_t rows, int64_t cols,
                       const Fp8BlockScheme& scheme, uint8_t* q,
                       float* scale_inv) {
  const int64_t brows = CeilDiv(rows, scheme.block_rows);
  const int64_t bcols = CeilDiv(cols, scheme.block_cols);
  for (int64_t br = 0; br < brows; ++br) {
    const int64_t r0 = br * scheme.block_rows;
    const int64_t r1 = std::min(rows, r0 + scheme.block_rows);
    for (int64_t bc = 0; bc < bcols; ++bc) {
      const int64_t c0 = bc * scheme.block_cols;
      const int64_t c1 = std::min(cols, c0 + scheme.block_cols);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          amax = std::max(amax, std::fabs(w[r * cols + c]));
        }
      }
      const float s = amax > 0.0f ? amax / kFp8E4M3Max : 1.0f;
      scale_inv[br * bcols + bc] = s;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          q[r * cols + c] = FloatToFp8E4M3(w[r * cols + c] / s);
        }
      }
    }
  }
}

}  // namespace moe
