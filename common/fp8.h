// FP8 E4M3 checkpoints with block scales (128 x 128 blocks of
// `weight_scale_inv`, the layout the FP8 releases on the Hub use).
//
// A Linear weight `<p>.weight` of dtype F8_E4M3 and shape [out, in] comes
// with `<p>.weight_scale_inv` of dtype F32 (BF16 and F16 are accepted too) and
// shape [ceil(out / B0), ceil(in / B1)], where [B0, B1] is config.json's
//   "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
//                            "activation_scheme": "dynamic",
//                            "weight_block_size": [128, 128]}
// The weight is w[r][c] = e4m3(q[r][c]) * scale_inv[r / B0][c / B1] ("inv":
// the inverse of the scale the quantizer divided by). E4M3 is the "fn"
// variant: bias 7, no infinities, S.1111.111 is NaN, largest finite 448.
//
// How we load them (docs/architecture.md, "Expert formats"): dense weights
// are dequantized to BF16 at load; routed experts are converted once at load
// to an expert format the kernels run (q8 unless --expert-format says
// otherwise), so no kernel reads F8.
//
// Thread-safe: pure functions.
#ifndef MOECACHE_COMMON_FP8_H_
#define MOECACHE_COMMON_FP8_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/checkpoint.h"
#include "common/dtype.h"
#include "common/model_config.h"
#include "nlohmann/json_fwd.hpp"

namespace moe {

// Appended to a weight's name to name its scales.
inline constexpr char kFp8ScaleSuffix[] = "_scale_inv";
inline constexpr float kFp8E4M3Max = 448.0f;

// Exact (every E4M3 value is a float); NaN for the two NaN codes.
float Fp8E4M3ToFloat(uint8_t bits);
// Rounds to nearest, ties to even; magnitudes above 448 saturate to +-448
// (as quantizers clamp before casting); NaN gives 0x7f.
uint8_t FloatToFp8E4M3(float value);

// Reads config.json's "quantization_config": nullopt when absent or null;
// the block scheme for fp8 / e4m3 / dynamic with a weight_block_size of two
// positive integers. INVALID_ARGUMENT naming the field otherwise (another
// quant_method, fmt, activation scheme, per-tensor fp8 without
// weight_block_size, ...).
absl::StatusOr<std::optional<Fp8BlockScheme>> ParseQuantizationConfig(
    const nlohmann::json& config);
// The quantization_config object ParseQuantizationConfig accepts, as the
// published checkpoints write it.
nlohmann::ordered_json QuantizationConfigJson(const Fp8BlockScheme& scheme);

// Checks the dtype of the weight `name` (viewed by `view`, from `ckpt`)
// against the config: F32/F16/BF16 without scales, or (with `fp8` set) a
// 2-D F8_E4M3 weight whose scales exist with the right dtype, shape and
// finite non-negative values; those are attached to view->scales.
// INVALID_ARGUMENT with a message that starts with the tensor's problem (the
// caller prefixes the directory and name).
absl::Status ResolveWeightDType(const Checkpoint& ckpt, const std::string& name,
                                const std::optional<Fp8BlockScheme>& fp8,
                                TensorView* view);

// Row `row` of a resolved F8_E4M3 weight as floats (cols of them).
// INVALID_ARGUMENT for a NaN code. REQUIRES: view.scales is set.
absl::Status DequantizeFp8Row(const TensorView& view, int64_t row, float* dst);

// Converts a 2-D weight view (F32/F16/BF16, or F8_E4M3 with its scales, or
// MXFP4, or a strided view: common/mxfp4.h, or packed blocks of a block
// format: ConvertWeights) to
// `to` (a float dtype or a block format) at dst, which holds
// WeightBytes(to, rows, cols) bytes. INVALID_ARGUMENT as ConvertWeights.
absl::Status ConvertWeightView(const TensorView& view, DType to, void* dst);

// The format routed experts are held in when no --expert-format is given:
// kQ8 for F8_E4M3 and MXFP4 checkpoints (no kernel reads them; q8 holds
// MXFP4 exactly), else as stored.
DType DefaultHeldFormat(DType stored);
// The same for one expert weight view: block-format views with their
// scales inside (GGUF experts: kQ8, the ggml dtypes, packed kMxfp4) are
// held as they are.
DType DefaultHeldFormat(const TensorView& expert);

// Quantizes a [rows, cols] float matrix as the published checkpoints do:
// per [B0, B1] tile, scale_inv = max|w| / 448 (1 for an all-zero tile) and
// q = e4m3(w / scale_inv). q holds rows * cols bytes, scale_inv
// ceil(rows / B0) * ceil(cols / B1) floats. For make-model and tests.
void QuantizeFp8Blocks(const float* w, int64_t rows, int64_t cols,
                       const Fp8BlockScheme& scheme, uint8_t* q,
                       float* scale_inv);

}  // namespace moe

#endif  // MOECACHE_COMMON_FP8_H_
