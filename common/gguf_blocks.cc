#include "common/gguf_blocks.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"

namespace moe {
namespace {

uint16_t Load16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

uint32_t Load32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

float F16At(const uint8_t* p) { return HalfToFloat(Load16(p)); }

// The 6-bit scale and min of K-quant sub-block j (0..7) from the 12 packed
// bytes: sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7
// (mins); 4-7 as a nibble of bytes 8-11 plus the top 2 bits of bytes 0-7.
void ScaleMinK4(int j, const uint8_t* q, int* scale, int* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_0 / Q4_1 / Q5_0 / Q5_1: 32 weights from 16 nibble bytes and optional
// fifth bits; w = d * (q - offset) + m.
void DecodeSmallBlock(const uint8_t* qs, uint32_t qh, bool five_bits, float d,
                      bool has_min, float m, int offset, float* out) {
  for (int j = 0; j < 16; ++j) {
    int lo = qs[j] & 0x0F, hi = qs[j] >> 4;
    if (five_bits) {
      lo |= static_cast<int>((qh >> j) & 1u) << 4;
      hi |= static_cast<int>((qh >> (j + 16)) & 1u) << 4;
    }
    out[j] = static_cast<float>(lo - offset) * d;
    out[j + 16] = static_cast<float>(hi - offset) * d;
    if (has_min) {
      out[j] += m;
      out[j + 16] += m;
    }
  }
}

// FP4 E2M1 codes, doubled (so that they are integers): 0, 0.5, 1, 1.5, 2,
// 3, 4, 6 and their negatives, times 2.
constexpr int8_t kFp4Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12,
                                    0, -1, -2, -3, -4, -6, -8, -12};

}  // namespace

void DequantizeQ8_0Block(const uint8_t* block, float* out) {
  const float d = F16At(block);
  for (int j = 0; j < 32; ++j) {
    out[j] = static_cast<float>(static_cast<int8_t>(block[2 + j])) * d;
  }
}

void DequantizeQ4_0Block(const uint8_t* block, float* out) {
  DecodeSmallBlock(block + 2, 0, false, F16At(block), false, 0.0f, 8, out);
}

void DequantizeQ4_1Block(const uint8_t* block, float* out) {
  DecodeSmallBlock(block + 4, 0, false, F16At(block), true, F16At(block + 2), 0, out);
}

void DequantizeQ5_0Block(const uint8_t* block, float* out) {
  DecodeSmallBlock(block + 6, Load32(block + 2), true, F16At(block), false, 0.0f, 16,
                   out);
}

void DequantizeQ5_1Block(const uint8_t* block, float* out) {
  DecodeSmallBlock(block + 8, Load32(block + 4), true, F16At(block), true,
                   F16At(block + 2), 0, out);
}

void DequantizeQ4_KBlock(const uint8_t* block, float* out) {
  const float d = F16At(block), dmin = F16At(block + 2);
  const uint8_t* scales = block + 4;
  const uint8_t* qs = block + 16;
  for (int c = 0; c < 4; ++c) {  // 64 weights: sub-blocks 2c, 2c + 1
    int s0, m0, s1, m1;
    ScaleMinK4(2 * c, scales, &s0, &m0);
    ScaleMinK4(2 * c + 1, scales, &s1, &m1);
    const float d0 = d * s0, min0 = dmin * m0, d1 = d * s1, min1 = dmin * m1;
    const uint8_t* q = qs + 32 * c;
    for (int l = 0; l < 32; ++l) {
      out[64 * c + l] = d0 * (q[l] & 0x0F) - min0;
      out[64 * c + 32 + l] = d1 * (q[l] >> 4) - min1;
    }
  }
}

void DequantizeQ5_KBlock(const uint8_t* block, float* out) {
  const float d = F16At(block), dmin = F16At(block + 2);
  const uint8_t* scales = block + 4;
  const uint8_t* qh = block + 16;
  const uint8_t* qs = block + 48;
  for (int c = 0; c < 4; ++c) {
    int s0, m0, s1, m1;
    ScaleMinK4(2 * c, scales, &s0, &m0);
    ScaleMinK4(2 * c + 1, scales, &s1, &m1);
    const float d0 = d * s0, min0 = dmin * m0, d1 = d * s1, min1 = dmin * m1;
    const uint8_t* q = qs + 32 * c;
    for (int l = 0; l < 32; ++l) {
      const int lo = (q[l] & 0x0F) | (((qh[l] >> (2 * c)) & 1) << 4);
      const int hi = (q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
      out[64 * c + l] = d0 * lo - min0;
      out[64 * c + 32 + l] = d1 * hi - min1;
    }
  }
}

void DequantizeQ6_KBlock(const uint8_t* block, float* out) {
  const float d = F16At(block + 208);
  for (int h = 0; h < 2; ++h) {  // two halves of 128 weights
    const uint8_t* ql = block + 64 * h;
    const uint8_t* qh = block + 128 + 32 * h;
    const int8_t* sc = reinterpret_cast<const int8_t*>(block + 192) + 8 * h;
    float* y = out + 128 * h;
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q0 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q1 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * sc[is] * q0;
      y[l + 32] = d * sc[is + 2] * q1;
      y[l + 64] = d * sc[is + 4] * q2;
      y[l + 96] = d * sc[is + 6] * q3;
    }
  }
}

void DequantizeMxfp4Block(const uint8_t* block, float* out) {
  // Half the E8M0 scale, to go with the doubled codes: 2^(e - 128).
  const float d = std::ldexp(1.0f, static_cast<int>(block[0]) - 128);
  const uint8_t* qs = block + 1;
  for (int j = 0; j < 16; ++j) {
    out[j] = kFp4Doubled[qs[j] & 0x0F] * d;
    out[j + 16] = kFp4Doubled[qs[j] >> 4] * d;
  }
}

std::vector<int> GgufF16FieldOffsets(DType dtype) {
  switch (dtype) {
    case DType::kQ4_1:
    case DType::kQ5_1:
    case DType::kQ4K:
    case DType::kQ5K:
      return {0, 2};
    case DType::kQ6K:
      return {208};
    default:
      return {0};
  }
}

bool CanDequantizeGguf(GgufType type) {
  switch (type) {
    case GgufType::kF32:
    case GgufType::kF16:
    case GgufType::kBF16:
    case GgufType::kQ8_0:
    case GgufType::kQ4_0:
    case GgufType::kQ4_1:
    case GgufType::kQ5_0:
    case GgufType::kQ5_1:
    case GgufType::kQ4_K:
    case GgufType::kQ5_K:
    case GgufType::kQ6_K:
    case GgufType::kMXFP4:
      return true;
    default:
      return false;
  }
}

absl::Status DequantizeGguf(GgufType type, const uint8_t* data, int64_t n,
                            float* out) {
  if (!CanDequantizeGguf(type)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no CPU decoder for GGUF type ", GgufTypeName(static_cast<uint32_t>(type))));
  }
  const GgufTypeInfo& info = GgufTypeInfoOf(type);
  if (n < 0 || n % info.block_elems != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        n, " weights are not whole ", info.name, " blocks of ", info.block_elems));
  }
  void (*decode)(const uint8_t*, float*) = nullptr;
  switch (type) {
    case GgufType::kF32:
      for (int64_t k = 0; k < n; ++k) out[k] = dtype_internal::BitsFloat(Load32(data + 4 * k));
      return absl::OkStatus();
    case GgufType::kF16:
      for (int64_t k = 0; k < n; ++k) out[k] = HalfToFloat(Load16(data + 2 * k));
      return absl::OkStatus();
    case GgufType::kBF16:
      for (int64_t k = 0; k < n; ++k) out[k] = BF16ToFloat(Load16(data + 2 * k));
      return absl::OkStatus();
    case GgufType::kQ8_0: decode = DequantizeQ8_0Block; break;
    case GgufType::kQ4_0: decode = DequantizeQ4_0Block; break;
    case GgufType::kQ4_1: decode = DequantizeQ4_1Block; break;
    case GgufType::kQ5_0: decode = DequantizeQ5_0Block; break;
    case GgufType::kQ5_1: decode = DequantizeQ5_1Block; break;
    case GgufType::kQ4_K: decode = DequantizeQ4_KBlock; break;
    case GgufType::kQ5_K: decode = DequantizeQ5_KBlock; break;
    case GgufType::kQ6_K: decode = DequantizeQ6_KBlock; break;
    default: decode = DequantizeMxfp4Block; break;
  }
  for (int64_t b = 0; b < n / info.block_elems; ++b) {
    decode(data + b * info.block_bytes, out + b * info.block_elems);
  }
  return absl::OkStatus();
}

std::optional<DType> HeldDTypeOfGguf(GgufType type) {
  switch (type) {
    case GgufType::kQ8_0: return DType::kQ8;
    case GgufType::kQ4_0: return DType::kQ4_0;
    case GgufType::kQ4_1: return DType::kQ4_1;
    case GgufType::kQ5_0: return DType::kQ5_0;
    case GgufType::kQ5_1: return DType::kQ5_1;
    case GgufType::kQ4_K: return DType::kQ4K;
    case GgufType::kQ5_K: return DType::kQ5K;
    case GgufType::kQ6_K: return DType::kQ6K;
    case GgufType::kMXFP4: return DType::kMxfp4;
    default: return std::nullopt;
  }
}

std::optional<GgufType> GgufTypeOfDType(DType dtype) {
  switch (dtype) {
    case DType::kQ8: return GgufType::kQ8_0;
    case DType::kQ4_0: return GgufType::kQ4_0;
    case DType::kQ4_1: return GgufType::kQ4_1;
    case DType::kQ5_0: return GgufType::kQ5_0;
    case DType::kQ5_1: return GgufType::kQ5_1;
    case DType::kQ4K: return GgufType::kQ4_K;
    case DType::kQ5K: return GgufType::kQ5_K;
    case DType::kQ6K: return GgufType::kQ6_K;
    default: return std::nullopt;
  }
}

void RepackGgufMxfp4(const uint8_t* src, int64_t blocks, uint8_t* dst) {
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* in = src + 17 * b;
    uint8_t* out = dst + 17 * b;
    out[0] = in[0];
    uint8_t codes[32];
    for (int j = 0; j < 16; ++j) {
      codes[j] = in[1 + j] & 0x0F;
      codes[j + 16] = in[1 + j] >> 4;
    }
    for (int j = 0; j < 16; ++j) {
      out[1 + j] = static_cast<uint8_t>(codes[2 * j] | (codes[2 * j + 1] << 4));
    }
  }
}

}  // namespace moe
