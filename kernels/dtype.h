// Element types of weights, and scalar conversions between them and float.
//
// Activations are always f32; weights may be f32, f16 or bf16 (as published
// in Hugging Face checkpoints). All arithmetic accumulates in f32.
#ifndef MOECACHE_KERNELS_DTYPE_H_
#define MOECACHE_KERNELS_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/dtype.h"
#include "common/quant.h"

namespace moe {

// DType, DTypeSize, DTypeName and the scalar conversions come from
// common/dtype.h; its kF32/kF16/kBF16 values are part of the CUDA module's C
// ABI (MOE_CUDA_DTYPE_* in kernels/cuda/module_abi.h).

// Element `i` of a weight array of type `t`, widened to f32. For the block
// formats `i` indexes the row-major matrix (whole rows of blocks).
inline float LoadAsF32(const void* data, DType t, size_t i) {
  switch (t) {
    case DType::kQ8:
    case DType::kQ4:
      return DequantizeElement(data, t, static_cast<int64_t>(i));
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kF16:
      return HalfToFloat(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16:
      return BF16ToFloat(static_cast<const uint16_t*>(data)[i]);
    default:
      return 0.0f;  // not a weight dtype; Backend's checks reject it
  }
}

}  // namespace moe

#endif  // MOECACHE_KERNELS_DTYPE_H_
