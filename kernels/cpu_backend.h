// The CPU backend: host memory, synchronous "streams", multithreaded and
// vectorised ops (see cpu_matmul.h for the SIMD dispatch).
//
// Thread-safe as described in backend.h; ops from several threads are
// serialised by the thread pool.
#ifndef MOECACHE_KERNELS_CPU_BACKEND_H_
#define MOECACHE_KERNELS_CPU_BACKEND_H_

#include <atomic>
#include <memory>

#include "kernels/backend.h"
#include "kernels/cpu_matmul.h"
#include "kernels/thread_pool.h"

namespace moe {

class CpuBackend : public Backend {
 public:
  // threads <= 0: one per hardware thread.
  explicit CpuBackend(int threads = 0);
  ~CpuBackend() override;

  BackendInfo Info() const override;
  SimdLevel simd_level() const { return simd_.load(); }
  ThreadPool& pool() { return *pool_; }

  // Test seam: run every kernel at `level`. FAILED_PRECONDITION if this CPU
  // cannot run it.
  absl::Status ForceSimdLevelForTest(SimdLevel level);

  absl::StatusOr<void*> Alloc(size_t bytes) override;
  void Free(void* ptr) override;
  absl::StatusOr<Stream> CreateStream() override;
  void DestroyStream(Stream stream) override;
  absl::StatusOr<Event> CreateEvent() override;
  void DestroyEvent(Event event) override;
  absl::Status RecordEvent(Event event, Stream stream) override;
  absl::Status StreamWaitEvent(Stream stream, Event event) override;
  absl::Status SynchronizeEvent(Event event) override;
  absl::Status Synchronize(Stream stream) override;

 protected:
  absl::Status DoCopy(void* dst, const void* src, size_t bytes, CopyDirection direction,
                      Stream stream) override;
  absl::Status DoMemsetZero(void* dst, size_t bytes, Stream stream) override;
  absl::Status DoMatMul(const float* x, const void* w, DType w_dtype,
                        const float* bias, float* y, int64_t m, int64_t n,
                        int64_t k, Stream stream) override;
  absl::Status DoRmsNorm(const float* x, const float* weight, float* y,
                         int64_t rows, int64_t dim, float eps,
                         Stream stream) override;
  absl::Status DoRope(float* q, float* k, const int32_t* positions,
                      int64_t tokens, int64_t q_heads, int64_t kv_heads,
                      int64_t head_dim, float theta, Stream stream) override;
  absl::Status DoKvCacheAppend(const float* k, const float* v, float* k_cache,
                               float* v_cache, const AttentionShape& shape,
                               Stream stream) override;
  absl::Status DoAttention(const float* q, const float* k_cache,
                           const float* v_cache, float* out,
                           const AttentionShape& shape, float scale,
                           Stream stream) override;
  absl::Status DoRouterTopK(const float* logits, int32_t* topk_ids,
                            float* topk_weights, int64_t tokens,
                            int64_t experts, int64_t top_k, bool renormalize,
                            Stream stream) override;
  // Decode-sized calls of one set of dtypes (gate's equal to up's): two
  // passes over all their weights (CpuExpertPasses), then the outputs
  // added in call order; the bits of DoExpertFfn per call. Larger calls,
  // and mixed dtypes, take the loop.
  absl::Status DoExpertFfns(const float* x, absl::Span<const ExpertCall> calls, float* out,
                            int64_t tokens, int64_t hidden, int64_t inter,
                            Stream stream) override;
  absl::Status DoExpertFfn(const float* x, const int32_t* rows,
                           const float* weights, const void* gate,
                           const void* up, const void* down, const ExpertDTypes& w,
                           float* out, int64_t tokens, int64_t count,
                           int64_t hidden, int64_t inter,
                           Stream stream) override;
  absl::Status DoEmbedding(const void* table, DType dtype, const int32_t* ids,
                           float* out, int64_t tokens, int64_t vocab,
                           int64_t hidden, Stream stream) override;
  absl::Status DoConvertToF32(const void* src, DType dtype, float* dst,
                              int64_t n, Stream stream) override;
  absl::Status DoElementwise(ElementwiseKind kind, const float* a, const float* b,
                             float* out, float s, int64_t n,
                             Stream stream) override;
  absl::Status DoArgmax(const float* x, int32_t* ids, int64_t rows, int64_t n,
                        Stream stream) override;
  absl::Status DoLogSoftmax(const float* x, float* out, int64_t rows,
                            int64_t n, Stream stream) override;
  absl::Status DoTopK(const float* x, int32_t* ids, float* values,
                      int64_t rows, int64_t n, int64_t k,
                      Stream stream) override;
  absl::Status DoRouterSelect(const float* logits, const float* bias,
                              int32_t* topk_ids, float* topk_weights,
                              int64_t tokens, int64_t experts, int64_t top_k,
                              const RouterSpec& spec, Stream stream) override;
  absl::Status DoRopeInterleaved(float* x, const int32_t* positions,
                                 const float* inv_freq, int64_t tokens,
                                 int64_t heads, int64_t stride, int64_t offset,
                                 int64_t rot_dim, float mscale,
                                 Stream stream) override;
  absl::Status DoMlaAttention(const float* q, const void* kv_b,
                              DType kv_b_dtype, const float* ckv_cache,
                              const float* kpe_cache, float* out,
                              const MlaShape& shape, float scale,
                              Stream stream) override;
  absl::Status DoSinkAttention(const float* q, const float* k_cache,
                               const float* v_cache, const float* sinks,
                               float* out, const AttentionShape& shape,
                               float scale, int64_t window,
                               Stream stream) override;
  absl::Status DoBiasedExpertFfn(const float* x, const int32_t* rows,
                                 const float* weights, const BiasedExpert& e,
                                 const ClampedSwiglu& act, float* out,
                                 int64_t tokens, int64_t count, int64_t hidden,
                                 int64_t inter, Stream stream) override;

 private:
  // Rows of x the expert reads: x itself, or the gathered `rows` in
  // `scratch` (INVALID_ARGUMENT for a row out of range).
  absl::StatusOr<const float*> GatherRows(const char* op, const float* x,
                                          const int32_t* rows, int64_t tokens,
                                          int64_t count, int64_t hidden,
                                          float* scratch);
  std::unique_ptr<ThreadPool> pool_;
  std::atomic<SimdLevel> simd_;
};

}  // namespace moe

#endif  // MOECACHE_KERNELS_CPU_BACKEND_H_
