// MXFP4 weights (OCP Microscaling FP4) as checkpoints store their routed
// experts (`_blocks` + `_scales`), and reading the strided per-expert views
// ModelDescription hands out for fused expert tensors.
//
// An MXFP4 [rows, cols] weight (rows = output features) is two U8 tensors:
//   <p>_blocks [..., rows, cols / 32, 16]: per group of 32 weights of a row,
//     16 bytes; byte b holds weight 2b in its low nibble and 2b + 1 in its
//     high nibble, each an FP4 E2M1 code (sign | 2 exponent | 1 mantissa bits:
//     0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives);
//   <p>_scales [..., rows, cols / 32]: per group an E8M0 exponent s, the
//     group's factor 2^(s - 127).
// w = fp4(code) * 2^(s - 127): transformers' convert_moe_packed_tensors
// (integrations/mxfp4.py), which then transposes to the [in, out] layout of
// gate_up_proj / down_proj. s = 255 is NaN in the OCP spec; we refuse it.
//
// Held formats (docs/architecture.md, "Expert formats"): MXFP4 experts are
// converted once at load. q8 (the default) is exact whenever the group's
// factor / 2 is an f16 (2^-24 .. 2^15, every published scale): each FP4
// value is an integer multiple (-12 .. 12) of half the group's factor, and
// a Q8 group is the same 32 weights. q4 and bf16/f32 go through floats.
//
// Thread-safe: pure functions.
#ifndef MOECACHE_COMMON_MXFP4_H_
#define MOECACHE_COMMON_MXFP4_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/checkpoint.h"
#include "common/dtype.h"

namespace moe {

inline constexpr int64_t kMxfp4Group = 32;
inline constexpr int64_t kMxfp4GroupBytes = 16;  // packed codes per group
inline constexpr char kMxfp4BlocksSuffix[] = "_blocks";
inline constexpr char kMxfp4ScalesSuffix[] = "_scales";

// The value of FP4 E2M1 code `code` (its low 4 bits).
float Fp4E2M1ToFloat(uint8_t code);
// 2^(s - 127). REQUIRES: s != 255.
float E8M0ToFloat(uint8_t s);

// Row `row` of a kMxfp4 view (data = codes, scales = E8M0 bytes, both
// stepping by view.row_stride weights per row) as `cols` floats.
// INVALID_ARGUMENT for a NaN scale (255).
absl::Status DequantizeMxfp4Row(const TensorView& view, int64_t row,
                                float* dst);

// ConvertWeightView for kMxfp4 views: to a float dtype, kMxfp4 (the same
// codes and scales, packed: common/quant.h), kQ8 (exact codes when the
// scale allows, see above) or kQ4. dst holds WeightBytes(to, rows, cols).
absl::Status ConvertMxfp4View(const TensorView& view, DType to, void* dst);

// ConvertWeightView for strided float views (gather, then convert).
absl::Status ConvertStridedView(const TensorView& view, DType to, void* dst);

// Whether a view must go through ConvertWeightView to be held as `held`
// (another dtype, a strided view, or a checkpoint layout with separate
// scales such as MXFP4's and FP8's); false means its bytes are the held
// ones.
inline bool ViewNeedsConversion(const TensorView& view, DType held) {
  return held != view.dtype || view.strided() || view.scales.data != nullptr;
}

// A 1-D view (plain or strided, F32/F16/BF16) widened to view.numel()
// floats (the per-expert biases of fused experts).
absl::Status ConvertVectorView(const TensorView& view, float* dst);

// Quantizes one row of `cols` floats (a multiple of 32) to MXFP4: per group
// the scale is the smallest power of two that brings max|w| within 6, and
// each weight the nearest FP4 value (ties to the even code). For make-model
// and tests. Writes cols / 2 bytes of codes and cols / 32 scales.
void QuantizeMxfp4Row(const float* w, int64_t cols, uint8_t* codes,
                      uint8_t* scales);

}  // namespace moe

#endif  // MOECACHE_COMMON_MXFP4_H_
