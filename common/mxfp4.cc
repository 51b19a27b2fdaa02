#include "common/mxfp4.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/quant.h"
#include "common/status_macros.h"

namespace moe {
namespace {

constexpr float kFp4Values[8] = {0.0f, 0.5f, 1.0f, 1.5f,
                                 2.0f, 3.0f, 4.0f, 6.0f};

// Bytes from the view's start to the codes / scales of row r.
int64_t CodeOffset(const TensorView& v, int64_t r) {
  const int64_t step = v.row_stride != 0 ? v.row_stride : v.shape[1];
  return r * step / 2;
}
int64_t ScaleOffset(const TensorView& v, int64_t r) {
  const int64_t step = v.row_stride != 0 ? v.row_stride : v.shape[1];
  return r * step / kMxfp4Group;
}

absl::Status CheckView(const TensorView& v) {
  if (v.shape.size() != 2 || v.shape[1] % kMxfp4Group != 0 ||
      v.scales.data == nullptr || v.col_stride > 1 ||
      (v.row_stride != 0 && v.row_stride % v.shape[1] != 0)) {
    return absl::InvalidArgumentError(
        "MXFP4 view must be 2-D, of whole 32-weight groups, with scales");
  }
  return absl::OkStatus();
}

// Q8 group of 32 weights with the exact codes of an MXFP4 group, when half
// its factor is an f16 (then d * q reproduces every weight); else false.
bool ExactQ8Group(const uint8_t* codes, uint8_t scale, uint8_t* out) {
  const int e = static_cast<int>(scale) - 128;  // d = 2^e
  if (e < -24 || e > 15) return false;
  const uint16_t d = FloatToHalf(std::ldexp(1.0f, e));
  std::memcpy(out, &d, 2);
  for (int b = 0; b < kMxfp4GroupBytes; ++b) {
    for (int k = 0; k < 2; ++k) {
      const uint8_t code = k == 0 ? (codes[b] & 0x0f) : (codes[b] >> 4);
      const int mag = static_cast<int>(kFp4Values[code & 7] * 2.0f);  // 0..12
      out[2 + 2 * b + k] =
          static_cast<uint8_t>(static_cast<int8_t>(code & 8 ? -mag : mag));
    }
  }
  return true;
}

}  // namespace

float Fp4E2M1ToFloat(uint8_t code) {
  const float v = kFp4Values[code & 7];
  return (code & 8) ? -v : v;
}

float E8M0ToFloat(uint8_t s) {
  return std::ldexp(1.0f, static_cast<int>(s) - 127);
}

absl::Status DequantizeMxfp4Row(const TensorView& view, int64_t row,
                                float* dst) {
  RETURN_IF_ERROR(CheckView(view));
  const int64_t cols = view.shape[1];
  const uint8_t* codes = view.data + CodeOffset(view, row);
  const uint8_t* scales = view.scales.data + ScaleOffset(view, row);
  for (int64_t g = 0; g < cols / kMxfp4Group; ++g) {
    if (scales[g] == 255) {
      return absl::InvalidArgumentError(
          absl::StrCat("MXFP4 scale 255 (NaN) in row ", row, ", group ", g));
    }
    const float f = E8M0ToFloat(scales[g]);
    for (int b = 0; b < kMxfp4GroupBytes; ++b) {
      const uint8_t byte = codes[g * kMxfp4GroupBytes + b];
      dst[g * kMxfp4Group + 2 * b] = Fp4E2M1ToFloat(byte & 0x0f) * f;
      dst[g * kMxfp4Group + 2 * b + 1] = Fp4E2M1ToFloat(byte >> 4) * f;
    }
  }
  return absl::OkStatus();
}

absl::Status ConvertMxfp4View(const TensorView& view, DType to, void* dst) {
  RETURN_IF_ERROR(CheckView(view));
  const int64_t rows = view.shape[0], cols = view.shape[1];
  const int64_t out_row = WeightBytes(to, 1, cols);
  if (out_row < 0 || (!IsFloatDType(to) && !IsQuantDType(to))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot convert MXFP4 rows of ", cols, " weights to ", DTypeName(to)));
  }
  auto* out = static_cast<uint8_t*>(dst);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* o = out + r * out_row;
    if (to == DType::kMxfp4) {  // the same codes, packed per block
      const uint8_t* codes = view.data + CodeOffset(view, r);
      const uint8_t* scales = view.scales.data + ScaleOffset(view, r);
      for (int64_t g = 0; g < cols / kMxfp4Group; ++g) {
        if (scales[g] == 255) {
          return absl::InvalidArgumentError(
              absl::StrCat("MXFP4 scale 255 (NaN) in row ", r, ", group ", g));
        }
        o[g * kMxfp4BlockBytes] = scales[g];
        std::memcpy(o + g * kMxfp4BlockBytes + 1, codes + g * kMxfp4GroupBytes,
                    kMxfp4GroupBytes);
      }
      continue;
    }
    if (to == DType::kQ8) {
      const uint8_t* codes = view.data + CodeOffset(view, r);
      const uint8_t* scales = view.scales.data + ScaleOffset(view, r);
      bool exact = true;
      for (int64_t g = 0; exact && g < cols / kMxfp4Group; ++g) {
        exact =
            scales[g] != 255 && ExactQ8Group(codes + g * kMxfp4GroupBytes,
                                             scales[g], o + g * kQ8BlockBytes);
      }
      if (exact) continue;
    }
    RETURN_IF_ERROR(DequantizeMxfp4Row(view, r, row.data()));
    if (IsQuantDType(to)) {
      RETURN_IF_ERROR(QuantizeRow(row.data(), cols, to, o));
    } else {
      RETURN_IF_ERROR(
          ConvertFromFloat(row.data(), static_cast<size_t>(cols), to, o));
    }
  }
  return absl::OkStatus();
}

absl::Status ConvertStridedView(const TensorView& view, DType to, void* dst) {
  if (view.shape.size() != 2 || !IsFloatDType(view.dtype)) {
    return absl::InvalidArgumentError(
        "strided view must be a 2-D float weight");
  }
  const int64_t rows = view.shape[0], cols = view.shape[1];
  const int64_t out_row = WeightBytes(to, 1, cols);
  if (out_row < 0 || (!IsFloatDType(to) && !IsQuantDType(to))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot convert rows of ", cols, " weights to ", DTypeName(to)));
  }
  const size_t esize = DTypeSize(view.dtype);
  const int64_t cs = view.col_stride != 0 ? view.col_stride : 1;
  const int64_t rs = view.row_stride != 0 ? view.row_stride : cols * cs;
  std::vector<uint8_t> gathered(static_cast<size_t>(cols) * esize);
  std::vector<float> row(static_cast<size_t>(cols));
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      std::memcpy(gathered.data() + c * esize,
                  view.data + (r * rs + c * cs) * esize, esize);
    }
    RETURN_IF_ERROR(ConvertToFloat(gathered.data(), view.dtype,
                                   static_cast<size_t>(cols), row.data()));
    if (IsQuantDType(to)) {
      RETURN_IF_ERROR(QuantizeRow(row.data(), cols, to, out + r * out_row));
    } else {
      RETURN_IF_ERROR(ConvertFromFloat(row.data(), static_cast<size_t>(cols),
                                       to, out + r * out_row));
    }
  }
  return absl::OkStatus();
}

absl::Status ConvertVectorView(const TensorView& view, float* dst) {
  if (view.shape.size() != 1 || !IsFloatDType(view.dtype)) {
    return absl::InvalidArgumentError(
        "ConvertVectorView: not a 1-D float tensor");
  }
  const int64_t n = view.shape[0];
  const int64_t cs = view.col_stride != 0 ? view.col_stride : 1;
  const size_t esize = DTypeSize(view.dtype);
  for (int64_t i = 0; i < n; ++i) {
    RETURN_IF_ERROR(
        ConvertToFloat(view.data + i * cs * esize, view.dtype, 1, dst + i));
  }
  return absl::OkStatus();
}

void QuantizeMxfp4Row(const float* w, int64_t cols, uint8_t* codes,
                      uint8_t* scales) {
  for (int64_t g = 0; g < cols / kMxfp4Group; ++g) {
    const float* x = w + g * kMxfp4Group;
    float mx = 0.0f;
    for (int i = 0; i < kMxfp4Group; ++i) mx = std::max(mx, std::fabs(x[i]));
    int e = 0;
    if (mx > 0.0f) {
      e = static_cast<int>(std::ceil(std::log2(mx / 6.0f)));
      if (std::ldexp(6.0f, e - 1) >= mx) --e;  // log2 rounding
    }
    e = std::max(-127, std::min(127, e));
    scales[g] = static_cast<uint8_t>(e + 127);
    for (int i = 0; i < kMxfp4Group; ++i) {
      const float a = std::fabs(x[i]) / std::ldexp(1.0f, e);
      int best = 0;
      for (int c = 1; c < 8; ++c) {
        const float dc = std::fabs(kFp4Values[c] - a),
                    db = std::fabs(kFp4Values[best] - a);
        if (dc < db || (dc == db && c % 2 == 0)) best = c;
      }
      const uint8_t code =
          static_cast<uint8_t>(best | (x[i] < 0.0f && best != 0 ? 8 : 0));
      uint8_t& byte = codes[g * kMxfp4GroupBytes + i / 2];
      byte = (i % 2 == 0) ? static_cast<uint8_t>((byte & 0xf0) | code)
                          : static_cast<uint8_t>((byte & 0x0f) | (code << 4));
    }
  }
}

}  // namespace moe
