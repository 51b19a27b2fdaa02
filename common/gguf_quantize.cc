// Compiled with -ffp-contract=off (common/CMakeLists.txt): a fused
// multiply-add would round differently from the reference's numpy.
#include "common/gguf_quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/gguf_blocks.h"
#include "common/logging.h"
#include "common/mxfp4.h"

namespace moe {
namespace {

// A value rounded to f16, nearest even, straight from double (numpy's
// np.float16(x); going through float could round twice).
struct Half {
  double value;
  uint16_t bits;
};

Half ToHalf(double x) {
  const double a = std::fabs(x);
  uint16_t bits = 0;
  if (a >= 65520.0) {  // halfway to 2^16 and above: infinity
    bits = 0x7c00;
  } else if (a > 0) {
    int e;
    std::frexp(a, &e);                     // a in [2^(e-1), 2^e)
    const int q = std::max(e - 11, -24);   // the f16 spacing there: 2^q
    const double n = std::nearbyint(std::ldexp(a, -q));
    bits = FloatToHalf(static_cast<float>(std::ldexp(n, q)));  // exact
  }
  if (std::signbit(x)) bits |= 0x8000;
  return {HalfToFloat(bits), bits};
}

void PutHalf(const Half& h, uint8_t* out) {
  out[0] = static_cast<uint8_t>(h.bits & 0xff);
  out[1] = static_cast<uint8_t>(h.bits >> 8);
}

// round() to nearest even, then clamp.
int RoundClamp(double v, int lo, int hi) {
  return static_cast<int>(std::min<double>(hi, std::max<double>(lo, std::nearbyint(v))));
}

// The weight of largest magnitude, the first of equals (numpy argmax).
double SignedMax(const double* x, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i) {
    if (std::fabs(x[i]) > std::fabs(x[best])) best = i;
  }
  return x[best];
}

// 32 codes: byte j holds code j (low nibble) and j + 16 (high).
void PackNibbles(const int* q, uint8_t* out) {
  for (int j = 0; j < 16; ++j) {
    out[j] = static_cast<uint8_t>((q[j] & 0xf) | ((q[j + 16] & 0xf) << 4));
  }
}

// Bit j of the little-endian u32: code j's fifth bit.
void PackFifthBits(const int* q, uint8_t* out) {
  uint32_t bits = 0;
  for (int j = 0; j < 32; ++j) bits |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
  for (int b = 0; b < 4; ++b) out[b] = static_cast<uint8_t>(bits >> (8 * b));
}

void QuantizeQ8_0(const double* x, uint8_t* out) {
  double a = 0;
  for (int i = 0; i < 32; ++i) a = std::max(a, std::fabs(x[i]));
  const Half d = ToHalf(a / 127);
  PutHalf(d, out);
  for (int i = 0; i < 32; ++i) {
    const int q = d.value != 0 ? RoundClamp(x[i] / d.value, -128, 127) : 0;
    out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(q));
  }
}

// Q4_0 (levels 16) and Q5_0 (32): symmetric around the largest magnitude.
void QuantizeSymmetric(const double* x, int levels, uint8_t* out) {
  const Half d = ToHalf(SignedMax(x, 32) / -(levels / 2));
  int q[32];
  for (int i = 0; i < 32; ++i) {
    q[i] = d.value != 0 ? RoundClamp(std::nearbyint(x[i] / d.value) + levels / 2, 0, levels - 1)
                        : levels / 2;
  }
  PutHalf(d, out);
  if (levels == 32) {
    PackFifthBits(q, out + 2);
    PackNibbles(q, out + 6);
  } else {
    PackNibbles(q, out + 2);
  }
}

// Q4_1 (levels 16) and Q5_1 (32): from the minimum up.
void QuantizeAffine(const double* x, int levels, uint8_t* out) {
  const double lo = *std::min_element(x, x + 32), hi = *std::max_element(x, x + 32);
  const Half d = ToHalf((hi - lo) / (levels - 1));
  const Half m = ToHalf(lo);
  int q[32];
  for (int i = 0; i < 32; ++i) {
    q[i] = d.value != 0 ? RoundClamp((x[i] - m.value) / d.value, 0, levels - 1) : 0;
  }
  PutHalf(d, out);
  PutHalf(m, out + 2);
  if (levels == 32) {
    PackFifthBits(q, out + 4);
    PackNibbles(q, out + 8);
  } else {
    PackNibbles(q, out + 4);
  }
}

// The 8 6-bit (scale, min) pairs of a Q4_K / Q5_K block in 12 bytes.
void PackKScales(const int* sc, const int* mn, uint8_t* out) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xf) | ((mn[j + 4] & 0xf) << 4));
  }
}

// Q4_K (levels 16) and Q5_K (32): 256 weights, 8 sub-blocks of 32.
void QuantizeK(const double* x, int levels, uint8_t* out) {
  double scales[8], mins[8];
  for (int s = 0; s < 8; ++s) {
    const double* sub = x + 32 * s;
    // max(0, -min) as numpy's maximum takes it: -0.0 when min is 0.0 (so
    // an all-zero block's dmin is -0.0 there, and here).
    const double neg_min = -*std::min_element(sub, sub + 32);
    mins[s] = neg_min >= 0.0 ? neg_min : 0.0;
    scales[s] = (*std::max_element(sub, sub + 32) + mins[s]) / (levels - 1);
  }
  const Half d = ToHalf(*std::max_element(scales, scales + 8) / 63);
  const Half dmin = ToHalf(*std::max_element(mins, mins + 8) / 63);
  int sc[8], mn[8], q[256];
  for (int s = 0; s < 8; ++s) {
    sc[s] = d.value != 0 ? RoundClamp(scales[s] / d.value, 0, 63) : 0;
    mn[s] = dmin.value != 0 ? RoundClamp(mins[s] / dmin.value, 0, 63) : 0;
    for (int i = 0; i < 32; ++i) {
      const double shifted = x[32 * s + i] + dmin.value * mn[s];
      q[32 * s + i] = sc[s] != 0 ? RoundClamp(shifted / (d.value * sc[s]), 0, levels - 1) : 0;
    }
  }
  PutHalf(d, out);
  PutHalf(dmin, out + 2);
  PackKScales(sc, mn, out + 4);
  uint8_t* qh = out + 16;  // Q5_K only
  uint8_t* qs = levels == 32 ? out + 48 : out + 16;
  if (levels == 32) std::memset(qh, 0, 32);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int a = q[64 * c + l], b = q[64 * c + 32 + l];
      qs[32 * c + l] = static_cast<uint8_t>((a & 0xf) | ((b & 0xf) << 4));
      if (levels == 32) qh[l] |= static_cast<uint8_t>(((a >> 4) << (2 * c)) | ((b >> 4) << (2 * c + 1)));
    }
  }
}

// Q6_K: 256 weights, 16 sub-blocks of 16 with int8 scales.
void QuantizeQ6_K(const double* x, uint8_t* out) {
  double scales[16], top = 0;
  for (int s = 0; s < 16; ++s) {
    scales[s] = SignedMax(x + 16 * s, 16) / -32;
    top = std::max(top, std::fabs(scales[s]));
  }
  const Half d = ToHalf(top / 127);
  int sc[16], q[256];
  for (int s = 0; s < 16; ++s) {
    sc[s] = d.value != 0 ? RoundClamp(scales[s] / d.value, -128, 127) : 0;
    for (int i = 0; i < 16; ++i) {
      q[16 * s + i] =
          sc[s] != 0 ? RoundClamp(std::nearbyint(x[16 * s + i] / (d.value * sc[s])) + 32, 0, 63)
                     : 32;
    }
  }
  uint8_t* ql = out;
  uint8_t* qh = out + 128;
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const int* e = q + 128 * h + l;  // e[32 * k]: the k-th of four
      ql[64 * h + l] = static_cast<uint8_t>((e[0] & 0xf) | ((e[64] & 0xf) << 4));
      ql[64 * h + l + 32] = static_cast<uint8_t>((e[32] & 0xf) | ((e[96] & 0xf) << 4));
      int high = 0;
      for (int k = 0; k < 4; ++k) high |= ((e[32 * k] >> 4) & 3) << (2 * k);
      qh[32 * h + l] = static_cast<uint8_t>(high);
    }
  }
  for (int s = 0; s < 16; ++s) out[192 + s] = static_cast<uint8_t>(static_cast<int8_t>(sc[s]));
  PutHalf(d, out + 208);
}

// MXFP4 from QuantizeMxfp4Row (byte b: codes 2b and 2b + 1) in ggml's
// order (byte j: codes j and j + 16), the exponent byte first.
void QuantizeMxfp4(const float* x, uint8_t* out) {
  uint8_t codes[kMxfp4GroupBytes] = {};
  QuantizeMxfp4Row(x, kMxfp4Group, codes, out);
  auto code = [&](int i) { return (codes[i / 2] >> (4 * (i % 2))) & 0xf; };
  for (int j = 0; j < 16; ++j) out[1 + j] = static_cast<uint8_t>(code(j) | (code(j + 16) << 4));
}

}  // namespace

bool CanQuantizeGguf(GgufType type) {
  // The quantizers cover exactly the types common/gguf_blocks.h decodes.
  return CanDequantizeGguf(type);
}

absl::Status QuantizeGguf(GgufType type, const float* x, int64_t n, uint8_t* out) {
  const std::string name = GgufTypeName(static_cast<uint32_t>(type));
  if (!CanQuantizeGguf(type)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot quantize to GGUF type ", name));
  }
  const GgufTypeInfo& info = GgufTypeInfoOf(type);
  if (n < 0 || n % info.block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrCat(n, " weights are not whole ", name,
                                                   " blocks of ", info.block_elems));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!(std::fabs(x[i]) <= kGgufQuantizeMaxAbs)) {
      return absl::InvalidArgumentError(absl::StrCat("weight ", i, " is ", x[i],
                                                     "; ", name, " takes finite weights within +-",
                                                     kGgufQuantizeMaxAbs));
    }
  }
  switch (type) {
    case GgufType::kF32:
      return ConvertFromFloat(x, static_cast<size_t>(n), DType::kF32, out);
    case GgufType::kF16:
      return ConvertFromFloat(x, static_cast<size_t>(n), DType::kF16, out);
    case GgufType::kBF16:
      return ConvertFromFloat(x, static_cast<size_t>(n), DType::kBF16, out);
    case GgufType::kMXFP4:
      for (int64_t b = 0; b < n / 32; ++b) QuantizeMxfp4(x + 32 * b, out + info.block_bytes * b);
      return absl::OkStatus();
    default:
      break;
  }
  double block[256];
  for (int64_t b = 0; b < n / info.block_elems; ++b) {
    for (int64_t i = 0; i < info.block_elems; ++i) block[i] = x[b * info.block_elems + i];
    uint8_t* o = out + b * info.block_bytes;
    switch (type) {
      case GgufType::kQ8_0: QuantizeQ8_0(block, o); break;
      case GgufType::kQ4_0: QuantizeSymmetric(block, 16, o); break;
      case GgufType::kQ5_0: QuantizeSymmetric(block, 32, o); break;
      case GgufType::kQ4_1: QuantizeAffine(block, 16, o); break;
      case GgufType::kQ5_1: QuantizeAffine(block, 32, o); break;
      case GgufType::kQ4_K: QuantizeK(block, 16, o); break;
      case GgufType::kQ5_K: QuantizeK(block, 32, o); break;
      case GgufType::kQ6_K: QuantizeQ6_K(block, o); break;
      default: MOE_CHECK(false) << name;
    }
  }
  return absl::OkStatus();
}

GgufType GgufTypeForRow(GgufType wanted, int64_t row_length) {
  MOE_CHECK(row_length >= 1) << row_length;
  if (row_length % GgufTypeInfoOf(wanted).block_elems == 0) return wanted;
  GgufType fallback = GgufType::kF32;
  switch (wanted) {
    case GgufType::kQ4_K: fallback = GgufType::kQ5_0; break;
    case GgufType::kQ5_K: fallback = GgufType::kQ5_1; break;
    case GgufType::kQ6_K: fallback = GgufType::kQ8_0; break;
    default: break;
  }
  return row_length % GgufTypeInfoOf(fallback).block_elems == 0 ? fallback : GgufType::kF32;
}

}  // namespace moe
