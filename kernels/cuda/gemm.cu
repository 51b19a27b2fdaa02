// Matrix products: y[m, n] = x[m, k] W[n, k]^T (+ bias).
//  * m <= kGemvMaxRows (decode and small expert groups): an own kernel, one
//    warp per output column, weights widened in registers, f32 activations
//    and accumulation. Memory bound: every weight byte is read once.
//  * larger m (prefill): cuBLAS GemmEx with f32 compute; for f16/bf16
//    weights the activations are first rounded to the weight type (cuBLAS
//    has no mixed f32 x bf16 product), as HF runs these models anyway.
// Block-format weights go to quant_gemm.cu (q8, q4, mxfp4) and gguf_gemm.cu
// (ggml's blocks). ExpertFfn composes these with gather / SiLU-mul /
// weighted scatter kernels, each projection in its own dtype.
#include <cublas_v2.h>

#include <unordered_map>

#include "kernels/cuda/common.cuh"

namespace moe::cuda {
namespace {

constexpr int kGemvMaxRows = 8;
constexpr int kGemvWarps = 8;  // columns per block

template <typename T>
__device__ __forceinline__ void Load8(const T* p, float out[8]);
template <>
__device__ __forceinline__ void Load8<float>(const float* p, float out[8]) {
  float4 a = reinterpret_cast<const float4*>(p)[0];
  float4 b = reinterpret_cast<const float4*>(p)[1];
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}
template <typename T>
__device__ __forceinline__ void Load8(const T* p, float out[8]) {
  uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* h = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = ToF32(h[i]);
}

// One warp per output column j; lanes stride over k in groups of 8 when
// `vec` (k % 8 == 0 and 16-byte aligned rows), else one element at a time.
template <typename T>
__global__ void GemvKernel(const float* __restrict__ x,
                           const T* __restrict__ w,
                           const float* __restrict__ bias,
                           float* __restrict__ y, int m, int64_t n, int64_t k,
                           bool vec) {
  const int lane = threadIdx.x & 31;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kGemvWarps +
                    (threadIdx.x >> 5);
  if (j >= n) return;
  const T* wr = w + j * k;
  float acc[kGemvMaxRows];
#pragma unroll
  for (int r = 0; r < kGemvMaxRows; ++r) acc[r] = 0.0f;
  if (vec) {
    for (int64_t kk = lane * 8; kk < k; kk += 32 * 8) {
      float wv[8];
      Load8<T>(wr + kk, wv);
#pragma unroll
      for (int r = 0; r < kGemvMaxRows; ++r) {
        if (r < m) {
          float xv[8];
          Load8<float>(x + r * k + kk, xv);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r] = fmaf(xv[i], wv[i], acc[r]);
        }
      }
    }
  } else {
    for (int64_t kk = lane; kk < k; kk += 32) {
      float wv = ToF32(wr[kk]);
#pragma unroll
      for (int r = 0; r < kGemvMaxRows; ++r) {
        if (r < m) acc[r] = fmaf(x[r * k + kk], wv, acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kGemvMaxRows; ++r) {
    if (r < m) {
      float s = WarpSum(acc[r]);
      if (lane == 0) y[r * n + j] = s + (bias ? bias[j] : 0.0f);
    }
  }
}

template <typename T>
int LaunchGemv(const float* x, const void* w, const float* bias, float* y,
               int m, int64_t n, int64_t k, cudaStream_t stream) {
  bool vec = k % 8 == 0 &&
             reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
             reinterpret_cast<uintptr_t>(x) % 16 == 0;
  GemvKernel<T><<<Blocks(n, kGemvWarps), kGemvWarps * 32, 0, stream>>>(
      x, static_cast<const T*>(w), bias, y, m, n, k, vec);
  return LaunchCode();
}

template <typename T>
__global__ void RoundKernel(const float* __restrict__ x, T* __restrict__ out,
                            int64_t n) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    if constexpr (std::is_same_v<T, __half>) {
      out[i] = __float2half_rn(x[i]);
    } else {
      out[i] = __float2bfloat16_rn(x[i]);
    }
  }
}

__global__ void BiasKernel(float* __restrict__ y, const float* __restrict__ b,
                           int64_t m, int64_t n) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < m * n) y[i] += b[i % n];
}

// One cuBLAS handle per thread and device: handles carry the stream, so
// sharing one across threads would race.
int Handle(cublasHandle_t* out) {
  thread_local std::unordered_map<int, cublasHandle_t> handles;
  int dev = 0;
  MOE_CUDA_TRY(Code(cudaGetDevice(&dev)));
  auto it = handles.find(dev);
  if (it == handles.end()) {
    cublasHandle_t h = nullptr;
    MOE_CUDA_TRY(CublasCode(cublasCreate(&h)));
    it = handles.emplace(dev, h).first;
  }
  *out = it->second;
  return 0;
}

int CublasMatMul(const float* x, const void* w, int w_dtype, const float* bias,
                 float* y, int64_t m, int64_t n, int64_t k,
                 cudaStream_t stream) {
  cublasHandle_t h = nullptr;
  MOE_CUDA_TRY(Handle(&h));
  MOE_CUDA_TRY(CublasCode(cublasSetStream(h, stream)));
  const void* b = x;
  void* rounded = nullptr;
  cudaDataType_t type = CUDA_R_32F;
  if (w_dtype != MOE_CUDA_DTYPE_F32) {
    type = w_dtype == MOE_CUDA_DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
    MOE_CUDA_TRY(Code(cudaMallocAsync(&rounded, m * k * 2, stream)));
    if (w_dtype == MOE_CUDA_DTYPE_F16) {
      RoundKernel<__half><<<Blocks(m * k, 256), 256, 0, stream>>>(
          x, static_cast<__half*>(rounded), m * k);
    } else {
      RoundKernel<__nv_bfloat16><<<Blocks(m * k, 256), 256, 0, stream>>>(
          x, static_cast<__nv_bfloat16*>(rounded), m * k);
    }
    b = rounded;
  }
  const float alpha = 1.0f, beta = 0.0f;
  // Column-major view: y^T [n, m] = W [n, k] (stored as k x n, transposed)
  // times x^T [k, m].
  int code = LaunchCode();
  if (code == 0) {
    code = CublasCode(cublasGemmEx(
        h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
        static_cast<int>(k), &alpha, w, type, static_cast<int>(k), b, type,
        static_cast<int>(k), &beta, y, CUDA_R_32F, static_cast<int>(n),
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  if (rounded != nullptr) {
    int free_code = Code(cudaFreeAsync(rounded, stream));
    if (code == 0) code = free_code;
  }
  if (code == 0 && bias != nullptr) {
    BiasKernel<<<Blocks(m * n, 256), 256, 0, stream>>>(y, bias, m, n);
    code = LaunchCode();
  }
  return code;
}

int MatMulOnStream(const float* x, const void* w, int w_dtype,
                   const float* bias, float* y, int64_t m, int64_t n,
                   int64_t k, cudaStream_t stream) {
  if (k > INT32_MAX || n > INT32_MAX || m > INT32_MAX) {
    return ModuleCode(MOE_CUDA_ERR_BAD_ARGUMENT);
  }
  if (w_dtype == MOE_CUDA_DTYPE_Q8 || w_dtype == MOE_CUDA_DTYPE_Q4 ||
      w_dtype == MOE_CUDA_DTYPE_MXFP4) {
    return QuantMatMulOnStream(x, w, w_dtype, bias, y, m, n, k, stream);
  }
  if (w_dtype >= MOE_CUDA_DTYPE_Q4_0 && w_dtype <= MOE_CUDA_DTYPE_Q6_K) {
    return GgufMatMulOnStream(x, w, w_dtype, bias, y, m, n, k, stream);
  }
  if (m <= kGemvMaxRows) {
    switch (w_dtype) {
      case MOE_CUDA_DTYPE_F32:
        return LaunchGemv<float>(x, w, bias, y, int(m), n, k, stream);
      case MOE_CUDA_DTYPE_F16:
        return LaunchGemv<__half>(x, w, bias, y, int(m), n, k, stream);
      case MOE_CUDA_DTYPE_BF16:
        return LaunchGemv<__nv_bfloat16>(x, w, bias, y, int(m), n, k, stream);
      default:
        return ModuleCode(MOE_CUDA_ERR_BAD_DTYPE);
    }
  }
  if (w_dtype < MOE_CUDA_DTYPE_F32 || w_dtype > MOE_CUDA_DTYPE_BF16) {
    return ModuleCode(MOE_CUDA_ERR_BAD_DTYPE);
  }
  return CublasMatMul(x, w, w_dtype, bias, y, m, n, k, stream);
}

__global__ void GatherRowsKernel(const float* __restrict__ x,
                                 const int32_t* __restrict__ rows,
                                 float* __restrict__ out, int64_t tokens,
                                 int64_t count, int64_t hidden) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count * hidden) {
    const int64_t row = rows[i / hidden];
    out[i] = row >= 0 && row < tokens ? x[row * hidden + i % hidden] : 0.0f;
  }
}

__global__ void SiluMulInPlaceKernel(float* __restrict__ g,
                                     const float* __restrict__ u, int64_t n) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    float v = g[i];
    g[i] = v / (1.0f + expf(-v)) * u[i];
  }
}

// Clamped SwiGLU: g = (clamp(u, -limit, limit) + 1) * min(g, limit) *
// sigmoid(alpha * min(g, limit)), in place (the biases are already added).
__global__ void ClampedSwigluInPlaceKernel(float* __restrict__ g,
                                           const float* __restrict__ u,
                                           int64_t n, float limit,
                                           float alpha) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const float gate = fminf(g[i], limit);
    const float up = fminf(fmaxf(u[i], -limit), limit);
    g[i] = (up + 1.0f) * (gate / (1.0f + expf(-alpha * gate)));
  }
}

// The activation between the up and down projections of an expert.
struct Activation {
  bool clamped = false;  // false: SiLU-mul
  float limit = 0.0f, alpha = 0.0f;
};

// rows are distinct, so no two threads add to the same element.
__global__ void ScatterAddKernel(const float* __restrict__ d,
                                 const int32_t* __restrict__ rows,
                                 const float* __restrict__ weights,
                                 float* __restrict__ out, int64_t tokens,
                                 int64_t count, int64_t hidden) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count * hidden) {
    int64_t r = i / hidden;
    int64_t row = rows ? rows[r] : r;
    if (row < 0 || row >= tokens) return;  // out of range: never write there
    float w = weights ? weights[r] : 1.0f;
    out[row * hidden + i % hidden] += w * d[i];
  }
}

}  // namespace

int MatMul(const float* x, const void* w, int w_dtype, const float* bias,
           float* y, int64_t m, int64_t n, int64_t k, void* stream) {
  MOE_CUDA_TRY(UseDevice());
  return MatMulOnStream(x, w, w_dtype, bias, y, m, n, k, AsStream(stream));
}

namespace {

// The weight dtypes of an expert's three projections.
struct ProjDTypes {
  int gate, up, down;
};

int ExpertFfnImpl(const float* x, const int32_t* rows, const float* weights,
                  const void* gate, const void* up, const void* down,
                  ProjDTypes w, const float* gate_bias, const float* up_bias,
                  const float* down_bias, const Activation& act, float* out,
                  int64_t tokens, int64_t count, int64_t hidden, int64_t inter,
                  void* stream_ptr) {
  MOE_CUDA_TRY(UseDevice());
  cudaStream_t stream = AsStream(stream_ptr);
  // xg [count, hidden] | g [count, inter] | u [count, inter] | d [count, hidden]
  const int64_t floats = count * (2 * hidden + 2 * inter);
  float* scratch = nullptr;
  MOE_CUDA_TRY(Code(cudaMallocAsync(reinterpret_cast<void**>(&scratch),
                                    floats * sizeof(float), stream)));
  float* xg = scratch;
  float* g = xg + count * hidden;
  float* u = g + count * inter;
  float* d = u + count * inter;
  const float* xin = x;
  int code = 0;
  if (rows != nullptr) {
    GatherRowsKernel<<<Blocks(count * hidden, 256), 256, 0, stream>>>(
        x, rows, xg, tokens, count, hidden);
    code = LaunchCode();
    xin = xg;
  }
  if (code == 0) {
    code = MatMulOnStream(xin, gate, w.gate, gate_bias, g, count, inter,
                          hidden, stream);
  }
  if (code == 0) {
    code = MatMulOnStream(xin, up, w.up, up_bias, u, count, inter, hidden,
                          stream);
  }
  if (code == 0) {
    if (act.clamped) {
      ClampedSwigluInPlaceKernel<<<Blocks(count * inter, 256), 256, 0,
                                   stream>>>(g, u, count * inter, act.limit,
                                             act.alpha);
    } else {
      SiluMulInPlaceKernel<<<Blocks(count * inter, 256), 256, 0, stream>>>(
          g, u, count * inter);
    }
    code = LaunchCode();
  }
  if (code == 0) {
    code = MatMulOnStream(g, down, w.down, down_bias, d, count, hidden, inter,
                          stream);
  }
  if (code == 0) {
    ScatterAddKernel<<<Blocks(count * hidden, 256), 256, 0, stream>>>(
        d, rows, weights, out, tokens, count, hidden);
    code = LaunchCode();
  }
  int free_code = Code(cudaFreeAsync(scratch, stream));
  return code != 0 ? code : free_code;
}

}  // namespace

int ExpertFfn(const float* x, const int32_t* rows, const float* weights,
              const void* gate, const void* up, const void* down, int w_dtype,
              float* out, int64_t tokens, int64_t count, int64_t hidden,
              int64_t inter, void* stream) {
  return ExpertFfnImpl(x, rows, weights, gate, up, down,
                       ProjDTypes{w_dtype, w_dtype, w_dtype}, nullptr,
                       nullptr, nullptr, Activation{}, out, tokens, count,
                       hidden, inter, stream);
}

int ExpertFfnDTypes(const float* x, const int32_t* rows, const float* weights,
                    const void* gate, const void* up, const void* down,
                    int gate_dtype, int up_dtype, int down_dtype, float* out,
                    int64_t tokens, int64_t count, int64_t hidden,
                    int64_t inter, void* stream) {
  return ExpertFfnImpl(x, rows, weights, gate, up, down,
                       ProjDTypes{gate_dtype, up_dtype, down_dtype}, nullptr,
                       nullptr, nullptr, Activation{}, out, tokens, count,
                       hidden, inter, stream);
}

int BiasedExpertFfn(const float* x, const int32_t* rows, const float* weights,
                    const void* gate, const void* up, const void* down,
                    int w_dtype, const float* gate_bias, const float* up_bias,
                    const float* down_bias, float limit, float alpha,
                    float* out, int64_t tokens, int64_t count, int64_t hidden,
                    int64_t inter, void* stream) {
  return ExpertFfnImpl(x, rows, weights, gate, up, down,
                       ProjDTypes{w_dtype, w_dtype, w_dtype}, gate_bias,
                       up_bias, down_bias, Activation{true, limit, alpha}, out,
                       tokens, count, hidden, inter, stream);
}

}  // namespace moe::cuda
