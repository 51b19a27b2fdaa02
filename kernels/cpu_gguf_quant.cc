// The scalar ggml-block dot products (cpu_gguf_quant.h), the K-quants'
// activation rounding, and the dispatch.
#include "kernels/cpu_gguf_quant.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/dtype.h"
#include "common/row_interleave.h"

namespace moe {
namespace {

using gguf_quant_internal::ForEachWeightRow;
using gguf_quant_internal::Load16;
using gguf_quant_internal::Load32;
using gguf_quant_internal::UnpackKScales;

float F16(const uint8_t* p) { return HalfToFloat(Load16(p)); }

// Q4_0 / Q4_1 / Q5_0 / Q5_1: 32 weights per block, byte j of qs holding
// weights j (low nibble) and j + 16 (high); Q5's fifth bits in a u32.
template <bool kFive, bool kMin>
float DotSmall(const uint8_t* w, const QuantizedActivations& x, int64_t i) {
  constexpr int kBytes = 2 + (kMin ? 2 : 0) + (kFive ? 4 : 0) + 16;
  constexpr int kOffset = kMin ? 0 : (kFive ? 16 : 8);
  const int64_t blocks = x.k / 32;
  const int8_t* xq = x.q.data() + i * x.k;
  const float* xd = x.d.data() + i * blocks;
  const float* sd = x.sd.data() + i * blocks;
  float acc = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = w + b * kBytes;
    const uint32_t qh = kFive ? Load32(blk + (kMin ? 4 : 2)) : 0;
    const uint8_t* qs = blk + kBytes - 16;
    const int8_t* xb = xq + b * 32;
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) {
      int lo = qs[j] & 0x0F, hi = qs[j] >> 4;
      if (kFive) {
        lo |= static_cast<int>((qh >> j) & 1u) << 4;
        hi |= static_cast<int>((qh >> (j + 16)) & 1u) << 4;
      }
      s += (lo - kOffset) * xb[j] + (hi - kOffset) * xb[j + 16];
    }
    acc += static_cast<float>(s) * (F16(blk) * xd[b]);
    if (kMin) acc += F16(blk + 2) * sd[b];
  }
  return acc;
}

// Q4_K / Q5_K: sub-blocks 2c and 2c + 1 share qs[32c .. 32c + 32) (low,
// high nibbles); Q5_K's fifth bits are bits 2c and 2c + 1 of qh[l].
template <bool kFive>
void K45Rows(const uint8_t* w, const KActivations& x, int64_t i0, int rows,
             float bias, float* y, int64_t y_stride) {
  constexpr int kBytes = kFive ? 176 : 144;
  const int64_t blocks = x.k / kKBlock;
  for (int r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    float acc = 0.0f, macc = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = w + b * kBytes;
      int sc[8], mn[8];
      UnpackKScales(blk + 4, sc, mn);
      const uint8_t* qh = blk + 16;
      const uint8_t* qs = blk + (kFive ? 48 : 16);
      const int8_t* xb = x.q.data() + i * x.k + b * kKBlock;
      const int16_t* bs = x.bsums.data() + (i * x.k + b * kKBlock) / 16;
      int32_t isum = 0, msum = 0;
      for (int c = 0; c < 4; ++c) {
        int32_t s0 = 0, s1 = 0;
        for (int l = 0; l < 32; ++l) {
          int lo = qs[32 * c + l] & 0x0F, hi = qs[32 * c + l] >> 4;
          if (kFive) {
            lo |= ((qh[l] >> (2 * c)) & 1) << 4;
            hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
          }
          s0 += lo * xb[64 * c + l];
          s1 += hi * xb[64 * c + 32 + l];
        }
        isum += sc[2 * c] * s0 + sc[2 * c + 1] * s1;
      }
      for (int j = 0; j < 8; ++j) msum += mn[j] * (bs[2 * j] + bs[2 * j + 1]);
      const float dx = x.d[i * blocks + b];
      acc += (F16(blk) * dx) * static_cast<float>(isum);
      macc += (F16(blk + 2) * dx) * static_cast<float>(msum);
    }
    y[r * y_stride] = acc - macc + bias;
  }
}

// Q6_K: per half h of 128 weights, activation group k (0..3) holds weights
// 128h + 32k + l: a nibble of ql[64h + 32 (k & 1) + l] (high for k >= 2),
// bits 2k, 2k + 1 of qh[32h + l], and scale sc[8h + 2k + l / 16].
void Q6KRows(const uint8_t* w, const KActivations& x, int64_t i0, int rows,
             float bias, float* y, int64_t y_stride) {
  const int64_t blocks = x.k / kKBlock;
  for (int r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    float acc = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = w + b * 210;
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
      const int8_t* xb = x.q.data() + i * x.k + b * kKBlock;
      int32_t isum = 0;
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = blk + 64 * h;
        const uint8_t* qh = blk + 128 + 32 * h;
        for (int k = 0; k < 4; ++k) {
          int32_t s[2] = {0, 0};
          for (int l = 0; l < 32; ++l) {
            const uint8_t byte = ql[32 * (k & 1) + l];
            const int lo = k >= 2 ? byte >> 4 : byte & 0x0F;
            const int q = (lo | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
            s[l / 16] += q * xb[128 * h + 32 * k + l];
          }
          isum += s[0] * sc[8 * h + 2 * k] + s[1] * sc[8 * h + 2 * k + 1];
        }
      }
      acc += (F16(blk + 208) * x.d[i * blocks + b]) * static_cast<float>(isum);
    }
    y[r * y_stride] = acc + bias;
  }
}

// The interleaved layouts' scalar loops: y[r, c] = row(group start, row
// of the group, activation row) + bias, for every output.
template <typename Row>
void EachRows16Output(const uint8_t* w, int64_t w_stride, int64_t n_rows, int64_t i0, int rows,
                      const float* bias, float* y, int64_t y_stride, const Row& row) {
  for (int64_t g = 0; g < n_rows / kQ4KR16Rows; ++g) {
    const uint8_t* gp = w + g * kQ4KR16Rows * w_stride;
    for (int rr = 0; rr < kQ4KR16Rows; ++rr) {
      const int64_t c = g * kQ4KR16Rows + rr;
      for (int r = 0; r < rows; ++r) {
        y[r * y_stride + c] = row(gp, rr, i0 + r) + (bias != nullptr ? bias[c] : 0.0f);
      }
    }
  }
}

// kQ4KR16 (common/row_interleave.h): each row of a 16-row group from its
// Q4_K block, in the arithmetic every level shares (cpu_gguf_quant.h):
// S and M exact per block, acc = fma(S, d dx, acc), acc = fma(-M, dmin dx,
// acc).
void Q4KR16Rows(const uint8_t* w, int64_t w_stride, int64_t n_rows, const KActivations& x,
                int64_t i0, int rows, const float* bias, float* y, int64_t y_stride) {
  const int64_t blocks = x.k / kKBlock;
  EachRows16Output(w, w_stride, n_rows, i0, rows, bias, y, y_stride,
                   [&](const uint8_t* gp, int rr, int64_t i) {
    float acc = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t blk[144];
      Q4KR16RowBlock(gp + b * kQ4KR16GroupBytes, rr, blk);
      int sc[8], mn[8];
      UnpackKScales(blk + 4, sc, mn);
      const int8_t* xb = x.q.data() + i * x.k + b * kKBlock;
      const int16_t* bs = x.bsums.data() + (i * x.k + b * kKBlock) / 16;
      int32_t isum = 0, msum = 0;
      for (int j = 0; j < 8; ++j) {
        int32_t s = 0;
        for (int l = 0; l < 32; ++l) {
          const uint8_t byte = blk[16 + 32 * (j / 2) + l];
          s += (j % 2 == 0 ? byte & 0x0F : byte >> 4) * xb[32 * j + l];
        }
        isum += sc[j] * s;
        msum += mn[j] * (bs[2 * j] + bs[2 * j + 1]);
      }
      const float dx = x.d[i * blocks + b];
      acc = std::fma(static_cast<float>(isum), F16(blk) * dx, acc);
      acc = std::fma(-static_cast<float>(msum), F16(blk + 2) * dx, acc);
    }
    return acc;
  });
}

// kQ4R16 (our q4, 16 rows interleaved): each row of a group from its q4
// block, in the arithmetic every level shares (cpu_gguf_quant.h).
void Q4R16Rows(const uint8_t* w, int64_t w_stride, int64_t n_rows, const QuantizedActivations& x,
               int64_t i0, int rows, const float* bias, float* y, int64_t y_stride) {
  const int64_t blocks = x.k / 64, groups = x.k / 32;
  EachRows16Output(w, w_stride, n_rows, i0, rows, bias, y, y_stride,
                   [&](const uint8_t* gp, int rr, int64_t i) {
    float acc = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t blk[36];
      Q4R16RowBlock(gp + b * kQ4R16GroupBytes, rr, blk);
      const int8_t* xb = x.q.data() + i * x.k + 64 * b;
      int32_t sa = 0, sb = 0;
      for (int j = 0; j < 32; ++j) {
        sa += (blk[4 + j] & 0x0F) * xb[j];
        sb += (blk[4 + j] >> 4) * xb[32 + j];
      }
      const float d = F16(blk), m = F16(blk + 2);
      const int64_t g0 = i * groups + 2 * b;
      acc = std::fma(static_cast<float>(sa), d * x.d[g0], acc);
      acc = std::fma(static_cast<float>(sb), d * x.d[g0 + 1], acc);
      acc = std::fma(m, x.sd[g0], acc);
      acc = std::fma(m, x.sd[g0 + 1], acc);
    }
    return acc;
  });
}

// The 32-weight interleaved layouts, kQ8R16 (our q8, kQ4_0 false) and
// kQ4_0R16 (ggml's Q4_0, kQ4_0 true): each row of a group from its block
// (the f16 d, then the codes), in the arithmetic every level shares
// (cpu_gguf_quant.h).
template <bool kQ4_0>
void Small32Rows(const uint8_t* w, int64_t w_stride, int64_t n_rows,
                 const QuantizedActivations& x, int64_t i0, int rows, const float* bias, float* y,
                 int64_t y_stride) {
  const int64_t blocks = x.k / 32;
  EachRows16Output(w, w_stride, n_rows, i0, rows, bias, y, y_stride,
                   [&](const uint8_t* gp, int rr, int64_t i) {
    float acc = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t blk[34];
      if constexpr (kQ4_0) {
        Q4_0R16RowBlock(gp + b * kQ4_0R16GroupBytes, rr, blk);
      } else {
        Q8R16RowBlock(gp + b * kQ8R16GroupBytes, rr, blk);
      }
      const int8_t* xb = x.q.data() + i * x.k + 32 * b;
      int32_t sum = 0;
      for (int j = 0; j < 32; ++j) {
        const int q = kQ4_0 ? (j < 16 ? (blk[2 + j] & 0x0F) : (blk[2 + j - 16] >> 4)) - 8
                            : static_cast<int8_t>(blk[2 + j]);
        sum += q * xb[j];
      }
      acc = std::fma(static_cast<float>(sum), F16(blk) * x.d[i * blocks + b], acc);
    }
    return acc;
  });
}

// Weight rows one at a time (the scalar pairs are independent).
template <void (*kRow)(const uint8_t*, const KActivations&, int64_t, int, float, float*,
                       int64_t)>
void ScalarRows(const uint8_t* w, int64_t w_stride, int64_t n_rows, const KActivations& x,
                int64_t i0, int rows, const float* bias, float* y, int64_t y_stride) {
  ForEachWeightRow(w, w_stride, n_rows, bias, y, [&](const uint8_t* wc, float b, float* yc) {
    kRow(wc, x, i0, rows, b, yc, y_stride);
  });
}

}  // namespace

GgufDotFn GgufDotScalar(DType dtype) {
  switch (dtype) {
    case DType::kQ4_0:
      return &DotSmall<false, false>;
    case DType::kQ4_1:
      return &DotSmall<false, true>;
    case DType::kQ5_0:
      return &DotSmall<true, false>;
    case DType::kQ5_1:
      return &DotSmall<true, true>;
    default:
      return nullptr;
  }
}

GgufKRowsFn GgufKRowsScalar(DType dtype) {
  switch (dtype) {
    case DType::kQ4K:
      return &ScalarRows<&K45Rows<false>>;
    case DType::kQ5K:
      return &ScalarRows<&K45Rows<true>>;
    case DType::kQ6K:
      return &ScalarRows<&Q6KRows>;
    case DType::kQ4KR16:
      return &Q4KR16Rows;
    default:
      return nullptr;
  }
}

GgufSmallRowsFn SmallRows16For(DType dtype, SimdLevel level) {
  static const bool vnni = Q8VnniSupported();
  if (AtLeastAvx512(level) && vnni) return SmallRows16Avx512Vnni(dtype);
  switch (dtype) {
    case DType::kQ4R16:
      return &Q4R16Rows;
    case DType::kQ8R16:
      return &Small32Rows<false>;
    case DType::kQ4_0R16:
      return &Small32Rows<true>;
    default:
      return nullptr;
  }
}

bool CpuPrefersRows16(SimdLevel level) {
  static const bool vnni = Q8VnniSupported();
  const char* env = std::getenv("MOE_ROWS16");
  return AtLeastAvx512(level) && vnni && !(env != nullptr && std::strcmp(env, "0") == 0);
}

GgufDotFn GgufDotFor(DType dtype, SimdLevel level) {
  GgufDotFn f = level != SimdLevel::kScalar ? GgufDotAvx2(dtype) : nullptr;
  return f != nullptr ? f : GgufDotScalar(dtype);
}

GgufKRowsFn GgufKRowsFor(DType dtype, SimdLevel level) {
  static const bool vnni = Q8VnniSupported();
  GgufKRowsFn f = nullptr;
  if (AtLeastAvx512(level) && vnni) f = GgufKRowsAvx512Vnni(dtype);
  if (f == nullptr && level != SimdLevel::kScalar && dtype != DType::kQ4KR16) {
    f = GgufKRowsAvx2(dtype);
  }
  return f != nullptr ? f : GgufKRowsScalar(dtype);
}

}  // namespace moe
