// The C ABI between the executables and the dlopen'ed CUDA module. Plain C
// types only, so the module can be built by nvcc and loaded from any binary.
// Bump MOE_CUDA_MODULE_ABI_VERSION whenever this table changes.
//
// Return codes of the table's functions (except device_count): 0 success;
// 1..9999 a cudaError_t; MOE_CUDA_CUBLAS_BASE + cublasStatus_t;
// MOE_CUDA_MODULE_BASE + one of MOE_CUDA_ERR_*. error_string() names them all.
//
// Array arguments are device pointers; shapes, dtypes and stream semantics
// are those of the same-named ops in kernels/backend.h (the host wrapper has
// validated them). `stream` is a cudaStream_t (NULL: the legacy default
// stream). Every function first makes the module's device current on the
// calling thread.
#ifndef MOECACHE_KERNELS_CUDA_MODULE_ABI_H_
#define MOECACHE_KERNELS_CUDA_MODULE_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_CUDA_MODULE_ABI_VERSION 7

#define MOE_CUDA_CUBLAS_BASE 10000
#define MOE_CUDA_MODULE_BASE 20000
#define MOE_CUDA_ERR_BAD_DTYPE 1       // unknown weight dtype
#define MOE_CUDA_ERR_HEAD_DIM 2        // head_dim above the kernels' limit
#define MOE_CUDA_ERR_BAD_ARGUMENT 3    // other unsupported argument
// event_query: the work before the event has not finished yet (not an error).
#define MOE_CUDA_ERR_NOT_READY 4
#define MOE_CUDA_NOT_READY (MOE_CUDA_MODULE_BASE + MOE_CUDA_ERR_NOT_READY)
// Size of a cudaIpcMemHandle_t.
#define MOE_CUDA_IPC_HANDLE_BYTES 64
#define MOE_CUDA_MAX_HEAD_DIM 512

// Same values as moe::DType.
#define MOE_CUDA_DTYPE_F32 0
#define MOE_CUDA_DTYPE_F16 1
#define MOE_CUDA_DTYPE_BF16 2
// v4: the block formats of common/quant.h, for matmul and expert_ffn weights
// (activations rounded to 8 bits per 32, as the CPU kernels do).
#define MOE_CUDA_DTYPE_Q8 13
#define MOE_CUDA_DTYPE_Q4 14
#define MOE_CUDA_DTYPE_MXFP4 17  // ABI v6
// v7: ggml's block formats (common/gguf_blocks.h), for matmul and the
// expert FFNs' weights (activations rounded as the CPU kernels of
// kernels/cpu_gguf_quant.h round them: per 32, or per 256 for the K-quants).
#define MOE_CUDA_DTYPE_Q4_0 18
#define MOE_CUDA_DTYPE_Q4_1 19
#define MOE_CUDA_DTYPE_Q5_0 20
#define MOE_CUDA_DTYPE_Q5_1 21
#define MOE_CUDA_DTYPE_Q4_K 22
#define MOE_CUDA_DTYPE_Q5_K 23
#define MOE_CUDA_DTYPE_Q6_K 24

// memcpy kinds. Host<->device copies return when the data has arrived.
#define MOE_CUDA_COPY_H2D 0
#define MOE_CUDA_COPY_D2H 1
#define MOE_CUDA_COPY_D2D 2

// Element-wise kinds (Backend::DoElementwise).
#define MOE_CUDA_EW_SILU_MUL 0
#define MOE_CUDA_EW_ADD 1
#define MOE_CUDA_EW_SCALE 2
#define MOE_CUDA_EW_SIGMOID 3

typedef struct MoeCudaAttentionShape {
  int64_t tokens, heads, kv_heads, head_dim, max_seq, start_pos;
} MoeCudaAttentionShape;

// Backend::RouterSelect's RouterSpec (scoring, selection: the enum values).
typedef struct MoeCudaRouterSpec {
  int scoring, selection;
  int64_t n_group, topk_group;
  int renormalize;
  float scale;
} MoeCudaRouterSpec;

// Backend::MlaAttention's MlaShape.
typedef struct MoeCudaMlaShape {
  int64_t tokens, heads, nope_dim, rope_dim, v_dim, rank, max_seq, start_pos;
} MoeCudaMlaShape;

// Largest kv_lora_rank + qk_rope_head_dim and experts the kernels of
// mla_router.cu take (shared memory); larger ones return
// MOE_CUDA_ERR_BAD_ARGUMENT.
#define MOE_CUDA_MAX_MLA_RANK 2048
#define MOE_CUDA_MAX_ROUTER_EXPERTS 4096

typedef struct MoeCudaModuleApi {
  int abi_version;
  // Number of usable devices; a negative value is -cudaError_t.
  int (*device_count)(void);
  // Writes device `dev`'s name into buf (NUL-terminated). 0 on success.
  int (*device_name)(int dev, char* buf, size_t len);
  // Human-readable text for an error code returned by the functions above.
  const char* (*error_string)(int code);

  // ---- v2: device, memory, streams ----
  int (*set_device)(int dev);  // the device every later call uses
  int (*mem_info)(size_t* free_bytes, size_t* total_bytes);
  int (*device_malloc)(void** ptr, size_t bytes);
  int (*device_free)(void* ptr);
  int (*memcpy)(void* dst, const void* src, size_t bytes, int kind,
                void* stream);
  int (*memset_zero)(void* dst, size_t bytes, void* stream);
  int (*stream_create)(void** stream);
  int (*stream_destroy)(void* stream);
  int (*event_create)(void** event);
  int (*event_destroy)(void* event);
  int (*event_record)(void* event, void* stream);
  int (*stream_wait_event)(void* stream, void* event);
  int (*event_synchronize)(void* event);
  int (*stream_synchronize)(void* stream);

  // ---- v2: ops ----
  int (*matmul)(const float* x, const void* w, int w_dtype, const float* bias,
                float* y, int64_t m, int64_t n, int64_t k, void* stream);
  int (*rms_norm)(const float* x, const float* weight, float* y, int64_t rows,
                  int64_t dim, float eps, void* stream);
  int (*rope)(float* q, float* k, const int32_t* positions, int64_t tokens,
              int64_t q_heads, int64_t kv_heads, int64_t head_dim, float theta,
              void* stream);
  int (*kv_cache_append)(const float* k, const float* v, float* k_cache,
                         float* v_cache, const MoeCudaAttentionShape* shape,
                         void* stream);
  int (*attention)(const float* q, const float* k_cache, const float* v_cache,
                   float* out, const MoeCudaAttentionShape* shape, float scale,
                   void* stream);
  int (*router_topk)(const float* logits, int32_t* ids, float* weights,
                     int64_t tokens, int64_t experts, int64_t top_k,
                     int renormalize, void* stream);
  int (*expert_ffn)(const float* x, const int32_t* rows, const float* weights,
                    const void* gate, const void* up, const void* down,
                    int w_dtype, float* out, int64_t tokens, int64_t count,
                    int64_t hidden, int64_t inter, void* stream);
  int (*embedding)(const void* table, int dtype, const int32_t* ids,
                   float* out, int64_t tokens, int64_t vocab, int64_t hidden,
                   void* stream);
  int (*convert_to_f32)(const void* src, int dtype, float* dst, int64_t n,
                        void* stream);
  int (*elementwise)(int kind, const float* a, const float* b, float* out,
                     float s, int64_t n, void* stream);
  int (*argmax)(const float* x, int32_t* ids, int64_t rows, int64_t n,
                void* stream);
  int (*log_softmax)(const float* x, float* out, int64_t rows, int64_t n,
                     void* stream);
  int (*topk)(const float* x, int32_t* ids, float* values, int64_t rows,
              int64_t n, int64_t k, void* stream);

  // ---- v3: pinned host memory, IPC, asynchronous copies (arena.cu) ----
  // cudaHostRegister(ptr, bytes, cudaHostRegisterPortable): pins an existing
  // host range (page-aligned) so copies from it run by DMA.
  int (*host_register)(void* ptr, size_t bytes);
  int (*host_unregister)(void* ptr);
  // cudaIpcGetMemHandle of a cudaMalloc'ed pointer: writes
  // MOE_CUDA_IPC_HANDLE_BYTES bytes to `handle`.
  int (*ipc_get_mem_handle)(const void* dev_ptr, void* handle);
  // Maps another process's allocation (cudaIpcMemLazyEnablePeerAccess);
  // close it with ipc_close_mem_handle.
  int (*ipc_open_mem_handle)(const void* handle, void** dev_ptr);
  int (*ipc_close_mem_handle)(void* dev_ptr);
  // cudaMemcpyAsync host -> device on `stream`; returns once queued.
  int (*memcpy_async_h2d)(void* dst, const void* src, size_t bytes,
                          void* stream);
  // A non-blocking stream with the given priority (clamped to the device's
  // range; lower numbers are higher priority, as in CUDA).
  int (*stream_create_with_priority)(void** stream, int priority);
  // The device's stream priorities: *least (lowest priority, usually 0) and
  // *greatest (highest, e.g. -5).
  int (*stream_priority_range)(int* least, int* greatest);
  // 0 when all work before the event is done, MOE_CUDA_NOT_READY when not
  // yet, else an error code. (event_create makes events with
  // cudaEventDisableTiming, so polling them is cheap.)
  int (*event_query)(void* event);

  // ---- v4: latent attention, scored router (mla_router.cu) ----
  int (*router_select)(const float* logits, const float* bias, int32_t* ids,
                       float* weights, int64_t tokens, int64_t experts,
                       int64_t top_k, const MoeCudaRouterSpec* spec,
                       void* stream);
  int (*rope_interleaved)(float* x, const int32_t* positions,
                          const float* inv_freq, int64_t tokens, int64_t heads,
                          int64_t stride, int64_t offset, int64_t rot_dim,
                          float mscale, void* stream);
  int (*mla_attention)(const float* q, const void* kv_b, int kv_b_dtype,
                       const float* ckv_cache, const float* kpe_cache,
                       float* out, const MoeCudaMlaShape* shape, float scale,
                       void* stream);

  // ---- v6: attention sinks, biased experts (attention.cu, gemm.cu) ----
  // Backend::SinkAttention: Attention with a per-head sink logit joining
  // the softmax, over the last `window` positions (0: all).
  int (*sink_attention)(const float* q, const float* k_cache,
                        const float* v_cache, const float* sinks, float* out,
                        const MoeCudaAttentionShape* shape, float scale,
                        int64_t window, void* stream);
  // Backend::BiasedExpertFfn with ClampedSwiglu{limit, alpha}.
  int (*biased_expert_ffn)(const float* x, const int32_t* rows,
                           const float* weights, const void* gate,
                           const void* up, const void* down, int w_dtype,
                           const float* gate_bias, const float* up_bias,
                           const float* down_bias, float limit, float alpha,
                           float* out, int64_t tokens, int64_t count,
                           int64_t hidden, int64_t inter, void* stream);

  // ---- v7: ggml's blocks (gguf_gemm.cu), experts of mixed dtypes ----
  // (matmul, expert_ffn and biased_expert_ffn take MOE_CUDA_DTYPE_Q4_0 ..
  // Q6_K weights.) Backend::ExpertFfn with a dtype per projection: a GGUF
  // file may hold a Q6_K down beside Q4_K gate and up.
  int (*expert_ffn_dtypes)(const float* x, const int32_t* rows,
                           const float* weights, const void* gate,
                           const void* up, const void* down, int gate_dtype,
                           int up_dtype, int down_dtype, float* out,
                           int64_t tokens, int64_t count, int64_t hidden,
                           int64_t inter, void* stream);
} MoeCudaModuleApi;

// The module's single exported symbol.
const MoeCudaModuleApi* moe_cuda_module_api(void);

#ifdef __cplusplus
}
#endif

#endif  // MOECACHE_KERNELS_CUDA_MODULE_ABI_H_
