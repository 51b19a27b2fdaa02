// Shared helpers of the CUDA module: error codes, the module's device,
// weight loads and block reductions. Module-internal (not part of the ABI).
#ifndef MOECACHE_KERNELS_CUDA_COMMON_CUH_
#define MOECACHE_KERNELS_CUDA_COMMON_CUH_

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/module_abi.h"

namespace moe::cuda {

inline int Code(cudaError_t e) { return static_cast<int>(e); }
inline int CublasCode(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS ? 0
                                    : MOE_CUDA_CUBLAS_BASE + static_cast<int>(s);
}
inline int ModuleCode(int err) { return MOE_CUDA_MODULE_BASE + err; }

// Makes the module's device current on this thread; a cudaError_t code.
int UseDevice();

// The launch's error (bad configuration etc.), as a code.
inline int LaunchCode() { return Code(cudaGetLastError()); }

#define MOE_CUDA_TRY(expr)            \
  do {                                \
    int moe_cuda_code_ = (expr);      \
    if (moe_cuda_code_ != 0) return moe_cuda_code_; \
  } while (0)

inline cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

inline unsigned Blocks(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// Weight element loads (T is float, __half or __nv_bfloat16).
__device__ __forceinline__ float ToF32(float v) { return v; }
__device__ __forceinline__ float ToF32(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToF32(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum/max for blockDim.x a multiple of 32 (<= 1024). Every thread
// gets the result. `scratch` holds 32 floats of shared memory.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpSum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  v = lane < warps ? scratch[lane] : 0.0f;
  return WarpSum(v);
}
__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  v = lane < warps ? scratch[lane] : -INFINITY;
  return WarpMax(v);
}

// ---- Entry points implemented in the .cu files (ABI semantics) ----
int MatMul(const float* x, const void* w, int w_dtype, const float* bias,
           float* y, int64_t m, int64_t n, int64_t k, void* stream);
int ExpertFfn(const float* x, const int32_t* rows, const float* weights,
              const void* gate, const void* up, const void* down, int w_dtype,
              float* out, int64_t tokens, int64_t count, int64_t hidden,
              int64_t inter, void* stream);
int Attention(const float* q, const float* k_cache, const float* v_cache,
              float* out, const MoeCudaAttentionShape* shape, float scale,
              void* stream);
int KvCacheAppend(const float* k, const float* v, float* k_cache,
                  float* v_cache, const MoeCudaAttentionShape* shape,
                  void* stream);
int RmsNorm(const float* x, const float* weight, float* y, int64_t rows,
            int64_t dim, float eps, void* stream);
int Rope(float* q, float* k, const int32_t* positions, int64_t tokens,
         int64_t q_heads, int64_t kv_heads, int64_t head_dim, float theta,
         void* stream);
int RouterTopK(const float* logits, int32_t* ids, float* weights,
               int64_t tokens, int64_t experts, int64_t top_k, int renormalize,
               void* stream);
int Embedding(const void* table, int dtype, const int32_t* ids, float* out,
              int64_t tokens, int64_t vocab, int64_t hidden, void* stream);
int ConvertToF32(const void* src, int dtype, float* dst, int64_t n,
                 void* stream);
int Elementwise(int kind, const float* a, const float* b, float* out, float s,
                int64_t n, void* stream);
int Argmax(const float* x, int32_t* ids, int64_t rows, int64_t n,
           void* stream);
int LogSoftmax(const float* x, float* out, int64_t rows, int64_t n,
               void* stream);
int TopK(const float* x, int32_t* ids, float* values, int64_t rows, int64_t n,
         int64_t k, void* stream);

// mla_router.cu (ABI v4).
int RouterSelect(const float* logits, const float* bias, int32_t* ids,
                 float* weights, int64_t tokens, int64_t experts,
                 int64_t top_k, const MoeCudaRouterSpec* spec, void* stream);
int RopeInterleaved(float* x, const int32_t* positions, const float* inv_freq,
                    int64_t tokens, int64_t heads, int64_t stride,
                    int64_t offset, int64_t rot_dim, float mscale,
                    void* stream);
int MlaAttention(const float* q, const void* kv_b, int kv_b_dtype,
                 const float* ckv_cache, const float* kpe_cache, float* out,
                 const MoeCudaMlaShape* shape, float scale, void* stream);
// attention.cu, gemm.cu (ABI v6): attention with sinks, biased experts.
int SinkAttention(const float* q, const float* k_cache, const float* v_cache,
                  const float* sinks, float* out,
                  const MoeCudaAttentionShape* shape, float scale,
                  int64_t window, void* stream);
int BiasedExpertFfn(const float* x, const int32_t* rows, const float* weights,
                    const void* gate, const void* up, const void* down,
                    int w_dtype, const float* gate_bias, const float* up_bias,
                    const float* down_bias, float limit, float alpha,
                    float* out, int64_t tokens, int64_t count, int64_t hidden,
                    int64_t inter, void* stream);
// quant_gemm.cu (ABI v4): matmul with MOE_CUDA_DTYPE_Q8 / Q4 weights.
int QuantMatMulOnStream(const float* x, const void* w, int w_dtype,
                        const float* bias, float* y, int64_t m, int64_t n,
                        int64_t k, cudaStream_t stream);

// gguf_gemm.cu (ABI v7): matmul with MOE_CUDA_DTYPE_Q4_0 .. Q6_K weights.
int GgufMatMulOnStream(const float* x, const void* w, int w_dtype,
                       const float* bias, float* y, int64_t m, int64_t n,
                       int64_t k, cudaStream_t stream);
// gemm.cu (ABI v7): ExpertFfn with a dtype per projection.
int ExpertFfnDTypes(const float* x, const int32_t* rows, const float* weights,
                    const void* gate, const void* up, const void* down,
                    int gate_dtype, int up_dtype, int down_dtype, float* out,
                    int64_t tokens, int64_t count, int64_t hidden,
                    int64_t inter, void* stream);

// arena.cu (ABI v3).
int HostRegister(void* ptr, size_t bytes);
int HostUnregister(void* ptr);
int IpcGetMemHandle(const void* dev_ptr, void* handle);
int IpcOpenMemHandle(const void* handle, void** dev_ptr);
int IpcCloseMemHandle(void* dev_ptr);
int MemcpyAsyncH2D(void* dst, const void* src, size_t bytes, void* stream);
int StreamCreateWithPriority(void** stream, int priority);
int StreamPriorityRange(int* least, int* greatest);
int EventQuery(void* event);

}  // namespace moe::cuda

#endif  // MOECACHE_KERNELS_CUDA_COMMON_CUH_
