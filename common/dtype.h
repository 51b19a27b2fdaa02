// Element types of tensors in safetensors files, and conversions between the
// float formats that model checkpoints use (F32, F16, BF16).
//
// Thread-safe: everything here is a pure function.
#ifndef MOECACHE_COMMON_DTYPE_H_
#define MOECACHE_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moe {

// The dtypes of the safetensors format, spelled as in its header ("BF16").
// kF32, kF16 and kBF16 keep the values 0, 1, 2: the CUDA module's C ABI
// (kernels/) uses the same numbering for weight dtypes.
enum class DType : int32_t {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
  kBool,
  kU8,
  kI8,
  kU16,
  kI16,
  kU32,
  kI32,
  kU64,
  kI64,
  kF64,
  // Block-quantized weight formats (ours, not safetensors dtypes; see
  // common/quant.h). A [rows, cols] matrix of one of these is rows x
  // cols / QuantGroupSize blocks, row-major; cols must be a multiple of the
  // group. Their values are part of the CUDA module's C ABI too.
  kQ8 = 13,  // Q8_0-like: per 32 weights an f16 scale + 32 int8
  kQ4 = 14,  // per 64 weights an f16 scale + f16 minimum + 64 uint4
  // 8-bit floats of safetensors ("F8_E4M3", "F8_E5M2"): read from files;
  // E4M3 weights come with block scales (common/fp8.h), E5M2 is parsed only
  // to be refused with a clear message.
  kF8E4M3 = 15,
  kF8E5M2 = 16,
  // OCP MXFP4 (common/mxfp4.h): per 32 weights of a row one E8M0 scale
  // byte and 16 bytes of FP4 E2M1 pairs. As a held format (a block format
  // like kQ8: 17-byte blocks, scale first) and as the dtype of a view of a
  // checkpoint's MXFP4 `_blocks` + `_scales` (scales then in
  // TensorView::scales). Never a safetensors dtype.
  kMxfp4 = 17,
  // ggml's block formats that have no equal above, exactly as GGUF files
  // store them (layouts in common/gguf_blocks.h): routed experts of GGUF
  // checkpoints are held and moved in these blocks, and read by the CPU
  // kernels (kernels/cpu_gguf_quant.h) and by the CUDA module's MatMul and
  // expert FFNs (kernels/cuda/gguf_gemm.cu, module ABI v7; compiled and its
  // block math tested on the CPU, never run on a GPU yet). (GGUF's Q8_0 is
  // kQ8 byte for byte; its MXFP4 is repacked to kMxfp4 at load.)
  kQ4_0 = 18,  // 18 B / 32:  f16 d | u8 qs[16]              w = d (q - 8)
  kQ4_1 = 19,  // 20 B / 32:  f16 d | f16 m | u8 qs[16]      w = d q + m
  kQ5_0 = 20,  // 22 B / 32:  f16 d | u32 qh | u8 qs[16]     w = d (q - 16)
  kQ5_1 = 21,  // 24 B / 32:  f16 d | f16 m | u32 qh | qs[16]  w = d q + m
  kQ4K = 22,   // 144 B / 256 (8 sub-blocks of 32, 6-bit scales and mins)
  kQ5K = 23,   // 176 B / 256
  kQ6K = 24,   // 210 B / 256 (16 sub-blocks of 16, int8 scales)
  // Q4_K with 16 rows interleaved (common/row_interleave.h): the same
  // bytes as kQ4K, rearranged so that one SIMD register holds 4 bytes of
  // each of 16 rows and a row's sums need no horizontal reduction. A held
  // layout of the CPU (kernels/cpu_gguf_quant.h), made at load from kQ4K
  // matrices of whole 16-row groups (RowGroupOf); never in a file, never
  // on a GPU (BackendInfo::supports_rows16).
  kQ4KR16 = 25,  // 144 B / 256 weights, [rows / 16][cols / 256] groups of 2304 B
  // Our kQ4 with 16 rows interleaved, the same way (common/row_interleave.h).
  kQ4R16 = 26,  // 36 B / 64 weights, [rows / 16][cols / 64] groups of 576 B
  // Our kQ8 (and GGUF's Q8_0) with 16 rows interleaved, the same way.
  kQ8R16 = 27,  // 34 B / 32 weights, [rows / 16][cols / 32] groups of 544 B
  // ggml's Q4_0 with 16 rows interleaved, the same way.
  kQ4_0R16 = 28,  // 18 B / 32 weights, [rows / 16][cols / 32] groups of 288 B
};

// Bytes per element (BOOL and the F8 types are one byte); 0 for the block
// formats (kQ8, kQ4, kMxfp4 and the ggml ones), whose sizes come from
// WeightBytes.
size_t DTypeSize(DType dtype);

// Rows a [rows, cols] matrix of `dtype` must come in whole groups of: 16
// for the interleaved kQ4KR16, kQ4R16, kQ8R16 and kQ4_0R16, 1 for every
// other dtype.
inline int64_t RowGroupOf(DType dtype) {
  return dtype == DType::kQ4KR16 || dtype == DType::kQ4R16 || dtype == DType::kQ8R16 ||
                 dtype == DType::kQ4_0R16
             ? 16
             : 1;
}

// True for ggml's block formats kQ4_0 .. kQ6K (row-major blocks as GGUF
// stores them; not kQ4KR16).
inline bool IsGgufBlockDType(DType dtype) {
  return dtype >= DType::kQ4_0 && dtype <= DType::kQ6K;
}

// True for the block formats kernels read: kQ8, kQ4, kMxfp4, the ggml
// ones (IsGgufBlockDType) and the interleaved ones (RowGroupOf 16).
inline bool IsQuantDType(DType dtype) {
  return dtype == DType::kQ8 || dtype == DType::kQ4 || dtype == DType::kMxfp4 ||
         IsGgufBlockDType(dtype) || RowGroupOf(dtype) == 16;
}

// The dtypes of a routed expert's three projections. One file may mix them
// per projection and per layer (llama.cpp's Q4_K_M keeps some layers'
// ffn_down in Q6_K); the experts of one layer always share theirs.
struct ExpertDTypes {
  DType gate = DType::kBF16;
  DType up = DType::kBF16;
  DType down = DType::kBF16;
  static ExpertDTypes All(DType t) { return {t, t, t}; }
  bool uniform() const { return gate == up && up == down; }
  friend bool operator==(const ExpertDTypes& a, const ExpertDTypes& b) {
    return a.gate == b.gate && a.up == b.up && a.down == b.down;
  }
  friend bool operator!=(const ExpertDTypes& a, const ExpertDTypes& b) { return !(a == b); }
};

// Weights per block (1 for plain dtypes) and bytes per block.
int64_t QuantGroupSize(DType dtype);
int64_t QuantBlockBytes(DType dtype);
// Bytes of a [rows, cols] weight matrix of `dtype`, plain or block format;
// -1 when cols is not a multiple of the dtype's group. (For kQ4KR16, a
// row's share: whole matrices also need rows % RowGroupOf == 0.)
int64_t WeightBytes(DType dtype, int64_t rows, int64_t cols);

// The safetensors spelling: "BOOL", "U8", ..., "BF16", "F32"; the block
// formats: "Q8", "Q4", "MXFP4", ggml's names ("Q4_0", ..., "Q6_K") and
// "Q4_Kx16", "Q4x16", "Q8x16", "Q4_0x16".
absl::string_view DTypeName(DType dtype);

// Parses the safetensors spelling (exact, case-sensitive). Unknown names give
// INVALID_ARGUMENT naming the dtype; the block formats are not safetensors
// dtypes and are never parsed from a file.
absl::StatusOr<DType> ParseDType(absl::string_view name);
// ParseDType that also accepts the block formats ("Q8", "Q4", "Q4_K"...): for names
// that do not come from a file (the expert layout in Attach's reply).
absl::StatusOr<DType> ParseWeightDType(absl::string_view name);

// True for F16, BF16, F32 (the dtypes ConvertToFloat accepts).
bool IsFloatDType(DType dtype);

namespace dtype_internal {

inline uint32_t FloatBits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  return x;
}

inline float BitsFloat(uint32_t x) {
  float f;
  std::memcpy(&f, &x, sizeof(f));
  return f;
}

// Rounds `value >> shift` to nearest, ties to even. REQUIRES: 1 <= shift < 32.
inline uint32_t ShiftRoundEven(uint32_t value, int shift) {
  uint32_t r = value >> shift;
  uint32_t rem = value & ((1u << shift) - 1);
  uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return r;
}

}  // namespace dtype_internal

// bfloat16 <-> float. FloatToBF16 rounds to nearest, ties to even; a NaN stays
// a (quiet) NaN, infinities stay infinities.
// (Inline: the CPU kernels call these in their inner loops.)
inline float BF16ToFloat(uint16_t bits) {
  return dtype_internal::BitsFloat(static_cast<uint32_t>(bits) << 16);
}

inline uint16_t FloatToBF16(float value) {
  uint32_t x = dtype_internal::FloatBits(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    // NaN: keep sign and top payload bits, force the quiet bit so the
    // truncated payload can never become zero (which would read as inf).
    return static_cast<uint16_t>((x >> 16) | 0x40u);
  }
  uint32_t bias = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + bias) >> 16);
}

// IEEE 754 binary16 <-> float. HalfToFloat is exact (subnormals included).
// FloatToHalf rounds to nearest even; overflow gives +-inf, NaN stays NaN.
inline float HalfToFloat(uint16_t bits) {
  uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    float v = static_cast<float>(mant) * dtype_internal::BitsFloat(0x33800000u);  // 2^-24
    return dtype_internal::BitsFloat(dtype_internal::FloatBits(v) | sign);
  }
  if (exp == 31) return dtype_internal::BitsFloat(sign | 0x7f800000u | (mant << 13));
  return dtype_internal::BitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t FloatToHalf(float value) {
  uint32_t x = dtype_internal::FloatBits(value);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or NaN
    uint32_t nan = absx > 0x7f800000u ? (0x200u | ((absx >> 13) & 0x3ffu)) : 0;
    return static_cast<uint16_t>(sign | 0x7c00u | nan);
  }
  // 65520 is halfway between the largest half (65504) and 2^16; ties-to-even
  // sends it (and everything above) to infinity.
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (absx < 0x38800000u) {  // below 2^-14: half subnormal or zero
    uint32_t exp = absx >> 23;
    if (exp < 102) return static_cast<uint16_t>(sign);  // below 2^-25
    uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    // Result in units of 2^-24; may round up to 0x400, the smallest normal.
    return static_cast<uint16_t>(
        sign | dtype_internal::ShiftRoundEven(mant, static_cast<int>(126 - exp)));
  }
  // Normal: rebias the exponent; a rounding carry correctly bumps it.
  uint32_t rebased = absx - (112u << 23);
  return static_cast<uint16_t>(sign | dtype_internal::ShiftRoundEven(rebased, 13));
}

// Converts `n` elements at `src` (any alignment) of type `dtype` to floats.
// Returns INVALID_ARGUMENT for dtypes other than F32, F16 and BF16.
// REQUIRES: src holds n * DTypeSize(dtype) bytes; dst holds n floats.
absl::Status ConvertToFloat(const void* src, DType dtype, size_t n, float* dst);

// Converts `n` floats to `dtype` (F32, F16 or BF16) at `dst` (any alignment).
// REQUIRES: dst holds n * DTypeSize(dtype) bytes.
absl::Status ConvertFromFloat(const float* src, size_t n, DType dtype,
                              void* dst);

}  // namespace moe

#endif  // MOECACHE_COMMON_DTYPE_H_
