#include "kernels/cuda_backend.h"

#include <chrono>
#include <initializer_list>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/cuda_gguf_self_check.h"
#include "kernels/cuda_module.h"

namespace moe {

// The enums and dtypes passed through the module's C ABI as ints.
static_assert(static_cast<int>(ElementwiseKind::kSiluMul) == MOE_CUDA_EW_SILU_MUL);
static_assert(static_cast<int>(ElementwiseKind::kAdd) == MOE_CUDA_EW_ADD);
static_assert(static_cast<int>(ElementwiseKind::kScale) == MOE_CUDA_EW_SCALE);
static_assert(static_cast<int>(ElementwiseKind::kSigmoid) == MOE_CUDA_EW_SIGMOID);
static_assert(static_cast<int>(DType::kF32) == MOE_CUDA_DTYPE_F32);
static_assert(static_cast<int>(DType::kF16) == MOE_CUDA_DTYPE_F16);
static_assert(static_cast<int>(DType::kBF16) == MOE_CUDA_DTYPE_BF16);
static_assert(static_cast<int>(DType::kQ8) == MOE_CUDA_DTYPE_Q8);
static_assert(static_cast<int>(DType::kQ4) == MOE_CUDA_DTYPE_Q4);
static_assert(static_cast<int>(DType::kMxfp4) == MOE_CUDA_DTYPE_MXFP4);
static_assert(static_cast<int>(DType::kQ4_0) == MOE_CUDA_DTYPE_Q4_0);
static_assert(static_cast<int>(DType::kQ4_1) == MOE_CUDA_DTYPE_Q4_1);
static_assert(static_cast<int>(DType::kQ5_0) == MOE_CUDA_DTYPE_Q5_0);
static_assert(static_cast<int>(DType::kQ5_1) == MOE_CUDA_DTYPE_Q5_1);
static_assert(static_cast<int>(DType::kQ4K) == MOE_CUDA_DTYPE_Q4_K);
static_assert(static_cast<int>(DType::kQ5K) == MOE_CUDA_DTYPE_Q5_K);
static_assert(static_cast<int>(DType::kQ6K) == MOE_CUDA_DTYPE_Q6_K);

namespace {

void* S(Stream stream) { return static_cast<void*>(stream); }

class CudaBackend : public Backend {
 public:
  CudaBackend(const MoeCudaModuleApi* api, int device, std::string name)
      : api_(api), device_(device), device_name_(std::move(name)) {}

  BackendInfo Info() const override {
    BackendInfo info;
    info.name = "cuda";
    info.device_name = device_name_;
    info.is_device = true;
    // MatMul and the expert FFNs (ABI v7), once the self-check passed.
    info.supports_gguf_blocks = gguf_check_.ok();
    size_t free_bytes = 0, total_bytes = 0;
    if (api_->set_device(device_) == 0 &&
        api_->mem_info(&free_bytes, &total_bytes) == 0) {
      info.device_memory_bytes = static_cast<int64_t>(total_bytes);
      info.free_memory_bytes = static_cast<int64_t>(free_bytes);
    }
    return info;
  }

  // The start-up self-check's outcome (CreateCudaBackend sets it before the
  // backend is returned; until then ggml blocks run, for the check itself).
  void SetGgufSelfCheck(absl::Status s) { gguf_check_ = std::move(s); }

  absl::StatusOr<void*> Alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    RETURN_IF_ERROR(Check(api_->device_malloc(&p, bytes), "cudaMalloc"));
    return p;
  }
  void Free(void* ptr) override {
    if (ptr != nullptr) api_->device_free(ptr);
  }
  absl::StatusOr<Stream> CreateStream() override {
    void* s = nullptr;
    RETURN_IF_ERROR(Check(api_->stream_create(&s), "cudaStreamCreate"));
    return static_cast<Stream>(s);
  }
  void DestroyStream(Stream stream) override {
    if (stream != nullptr) api_->stream_destroy(S(stream));
  }
  absl::StatusOr<Event> CreateEvent() override {
    void* e = nullptr;
    RETURN_IF_ERROR(Check(api_->event_create(&e), "cudaEventCreate"));
    return static_cast<Event>(e);
  }
  void DestroyEvent(Event event) override {
    if (event != nullptr) api_->event_destroy(event);
  }
  absl::Status RecordEvent(Event event, Stream stream) override {
    return Check(api_->event_record(event, S(stream)), "cudaEventRecord");
  }
  absl::Status StreamWaitEvent(Stream stream, Event event) override {
    return Check(api_->stream_wait_event(S(stream), event),
                 "cudaStreamWaitEvent");
  }
  absl::Status SynchronizeEvent(Event event) override {
    return Check(api_->event_synchronize(event), "cudaEventSynchronize");
  }
  absl::Status Synchronize(Stream stream) override {
    return Check(api_->stream_synchronize(S(stream)), "cudaStreamSynchronize");
  }

 protected:
  absl::Status DoCopy(void* dst, const void* src, size_t bytes,
                      CopyDirection direction, Stream stream) override {
    return Check(api_->memcpy(dst, src, bytes, static_cast<int>(direction),
                              S(stream)),
                 "cudaMemcpy");
  }
  absl::Status DoMemsetZero(void* dst, size_t bytes, Stream stream) override {
    return Check(api_->memset_zero(dst, bytes, S(stream)), "cudaMemset");
  }
  absl::Status DoMatMul(const float* x, const void* w, DType w_dtype,
                        const float* bias, float* y, int64_t m, int64_t n,
                        int64_t k, Stream stream) override {
    RETURN_IF_ERROR(RefuseGgufBlocks({w_dtype}));
    return Check(api_->matmul(x, w, static_cast<int>(w_dtype), bias, y, m, n,
                              k, S(stream)),
                 "MatMul");
  }
  absl::Status DoRmsNorm(const float* x, const float* weight, float* y,
                         int64_t rows, int64_t dim, float eps,
                         Stream stream) override {
    return Check(api_->rms_norm(x, weight, y, rows, dim, eps, S(stream)),
                 "RmsNorm");
  }
  absl::Status DoRope(float* q, float* k, const int32_t* positions,
                      int64_t tokens, int64_t q_heads, int64_t kv_heads,
                      int64_t head_dim, float theta, Stream stream) override {
    return Check(api_->rope(q, k, positions, tokens, q_heads, kv_heads,
                            head_dim, theta, S(stream)),
                 "Rope");
  }
  absl::Status DoKvCacheAppend(const float* k, const float* v, float* k_cache,
                               float* v_cache, const AttentionShape& shape,
                               Stream stream) override {
    MoeCudaAttentionShape s = ToAbi(shape);
    return Check(api_->kv_cache_append(k, v, k_cache, v_cache, &s, S(stream)),
                 "KvCacheAppend");
  }
  absl::Status DoAttention(const float* q, const float* k_cache,
                           const float* v_cache, float* out,
                           const AttentionShape& shape, float scale,
                           Stream stream) override {
    MoeCudaAttentionShape s = ToAbi(shape);
    return Check(
        api_->attention(q, k_cache, v_cache, out, &s, scale, S(stream)),
        "Attention");
  }
  absl::Status DoRouterTopK(const float* logits, int32_t* topk_ids,
                            float* topk_weights, int64_t tokens,
                            int64_t experts, int64_t top_k, bool renormalize,
                            Stream stream) override {
    return Check(api_->router_topk(logits, topk_ids, topk_weights, tokens,
                                   experts, top_k, renormalize ? 1 : 0,
                                   S(stream)),
                 "RouterTopK");
  }
  absl::Status DoRouterSelect(const float* logits, const float* bias,
                              int32_t* topk_ids, float* topk_weights,
                              int64_t tokens, int64_t experts, int64_t top_k,
                              const RouterSpec& spec, Stream stream) override {
    MoeCudaRouterSpec s{static_cast<int>(spec.scoring),
                        static_cast<int>(spec.selection),
                        spec.n_group,
                        spec.topk_group,
                        spec.renormalize ? 1 : 0,
                        spec.scale};
    return Check(api_->router_select(logits, bias, topk_ids, topk_weights,
                                     tokens, experts, top_k, &s, S(stream)),
                 "RouterSelect");
  }
  absl::Status DoRopeInterleaved(float* x, const int32_t* positions,
                                 const float* inv_freq, int64_t tokens,
                                 int64_t heads, int64_t stride, int64_t offset,
                                 int64_t rot_dim, float mscale,
                                 Stream stream) override {
    return Check(api_->rope_interleaved(x, positions, inv_freq, tokens, heads,
                                        stride, offset, rot_dim, mscale,
                                        S(stream)),
                 "RopeInterleaved");
  }
  absl::Status DoMlaAttention(const float* q, const void* kv_b,
                              DType kv_b_dtype, const float* ckv_cache,
                              const float* kpe_cache, float* out,
                              const MlaShape& shape, float scale,
                              Stream stream) override {
    MoeCudaMlaShape s{shape.tokens,   shape.heads, shape.nope_dim,
                      shape.rope_dim, shape.v_dim, shape.rank,
                      shape.max_seq,  shape.start_pos};
    return Check(api_->mla_attention(q, kv_b, static_cast<int>(kv_b_dtype),
                                     ckv_cache, kpe_cache, out, &s, scale,
                                     S(stream)),
                 "MlaAttention");
  }
  absl::Status DoSinkAttention(const float* q, const float* k_cache,
                               const float* v_cache, const float* sinks,
                               float* out, const AttentionShape& shape,
                               float scale, int64_t window,
                               Stream stream) override {
    MoeCudaAttentionShape s = ToAbi(shape);
    return Check(api_->sink_attention(q, k_cache, v_cache, sinks, out, &s,
                                      scale, window, S(stream)),
                 "SinkAttention");
  }
  absl::Status DoBiasedExpertFfn(const float* x, const int32_t* rows,
                                 const float* weights, const BiasedExpert& e,
                                 const ClampedSwiglu& act, float* out,
                                 int64_t tokens, int64_t count, int64_t hidden,
                                 int64_t inter, Stream stream) override {
    RETURN_IF_ERROR(RefuseGgufBlocks({e.w_dtype}));
    return Check(api_->biased_expert_ffn(
                     x, rows, weights, e.gate, e.up, e.down,
                     static_cast<int>(e.w_dtype), e.gate_bias, e.up_bias,
                     e.down_bias, act.limit, act.alpha, out, tokens, count,
                     hidden, inter, S(stream)),
                 "BiasedExpertFfn");
  }
  absl::Status DoExpertFfn(const float* x, const int32_t* rows,
                           const float* weights, const void* gate,
                           const void* up, const void* down, const ExpertDTypes& w,
                           float* out, int64_t tokens, int64_t count,
                           int64_t hidden, int64_t inter,
                           Stream stream) override {
    RETURN_IF_ERROR(RefuseGgufBlocks({w.gate, w.up, w.down}));
    return Check(api_->expert_ffn_dtypes(
                     x, rows, weights, gate, up, down, static_cast<int>(w.gate),
                     static_cast<int>(w.up), static_cast<int>(w.down), out,
                     tokens, count, hidden, inter, S(stream)),
                 "ExpertFfn");
  }
  absl::Status DoEmbedding(const void* table, DType dtype, const int32_t* ids,
                           float* out, int64_t tokens, int64_t vocab,
                           int64_t hidden, Stream stream) override {
    return Check(api_->embedding(table, static_cast<int>(dtype), ids, out,
                                 tokens, vocab, hidden, S(stream)),
                 "Embedding");
  }
  absl::Status DoConvertToF32(const void* src, DType dtype, float* dst,
                              int64_t n, Stream stream) override {
    return Check(api_->convert_to_f32(src, static_cast<int>(dtype), dst, n,
                                      S(stream)),
                 "ConvertToF32");
  }
  absl::Status DoElementwise(ElementwiseKind kind, const float* a,
                             const float* b, float* out, float s, int64_t n,
                             Stream stream) override {
    return Check(api_->elementwise(static_cast<int>(kind), a, b, out, s, n,
                                   S(stream)),
                 "Elementwise");
  }
  absl::Status DoArgmax(const float* x, int32_t* ids, int64_t rows, int64_t n,
                        Stream stream) override {
    return Check(api_->argmax(x, ids, rows, n, S(stream)), "Argmax");
  }
  absl::Status DoLogSoftmax(const float* x, float* out, int64_t rows,
                            int64_t n, Stream stream) override {
    return Check(api_->log_softmax(x, out, rows, n, S(stream)), "LogSoftmax");
  }
  absl::Status DoTopK(const float* x, int32_t* ids, float* values,
                      int64_t rows, int64_t n, int64_t k,
                      Stream stream) override {
    return Check(api_->topk(x, ids, values, rows, n, k, S(stream)), "TopK");
  }

 private:
  static MoeCudaAttentionShape ToAbi(const AttentionShape& s) {
    return {s.tokens, s.heads, s.kv_heads, s.head_dim, s.max_seq, s.start_pos};
  }
  absl::Status Check(int code, const char* what) const {
    return CudaModuleStatus(api_, code, what);
  }
  // UNIMPLEMENTED for ggml blocks once the self-check has failed.
  // And always for the interleaved layouts (RowGroupOf 16), the CPU's own
  // (no CUDA kernel reads them).
  absl::Status RefuseGgufBlocks(std::initializer_list<DType> dtypes) const {
    for (DType t : dtypes) {
      if (RowGroupOf(t) != 1) {
        return absl::UnimplementedError(absl::StrCat(
            DTypeName(t), " weights are the CPU's interleaved layout; the CUDA kernels read "
            "the row-major blocks"));
      }
    }
    if (gguf_check_.ok()) return absl::OkStatus();
    for (DType t : dtypes) {
      if (IsGgufBlockDType(t)) {
        return absl::UnimplementedError(absl::StrCat(
            DTypeName(t), " weights: ggml blocks failed the CUDA self-check at "
            "start (see the log); run with --device cpu or --expert-format "
            "q8/q4/bf16"));
      }
    }
    return absl::OkStatus();
  }

  const MoeCudaModuleApi* api_;
  const int device_;
  const std::string device_name_;
  absl::Status gguf_check_;
};

absl::StatusOr<std::unique_ptr<CudaBackend>> NewCudaBackend(int device) {
  auto api = LoadCudaModule();
  if (!api.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "CUDA backend unavailable: ", api.status().message()));
  }
  int count = (*api)->device_count();
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA device ", device, " does not exist (", count, " devices)"));
  }
  RETURN_IF_ERROR(
      CudaModuleStatus(*api, (*api)->set_device(device), "cudaSetDevice"));
  char name[256] = {0};
  (*api)->device_name(device, name, sizeof(name));
  return std::make_unique<CudaBackend>(*api, device, name);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend,
                   NewCudaBackend(device));
  const auto start = std::chrono::steady_clock::now();
  absl::Status check = RunGgufSelfCheck(*backend);
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start)
                        .count();
  if (check.ok()) {
    MOE_LOG(INFO) << "CUDA device " << device << ": ggml block kernels passed "
                  << "the start-up self-check (" << ms << " ms)";
    return std::unique_ptr<Backend>(std::move(backend));
  }
  MOE_LOG(WARNING) << "CUDA device " << device
                   << ": ggml blocks (Q4_0 .. Q6_K) are turned off, their "
                   << "kernels failed the start-up self-check: " << check;
  // A kernel fault leaves the context unusable for every op: then there is
  // no CUDA backend ("auto" falls back to the CPU).
  if (absl::Status s = backend->Synchronize(nullptr); !s.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "CUDA device ", device, " is unusable after the ggml self-check (",
        check.message(), "): ", s.message()));
  }
  backend->SetGgufSelfCheck(std::move(check));
  return std::unique_ptr<Backend>(std::move(backend));
}

absl::StatusOr<std::unique_ptr<Backend>>
CreateCudaBackendWithoutSelfCheckForTest(int device) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend,
                   NewCudaBackend(device));
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace moe
