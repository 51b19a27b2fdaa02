// The compute backend interface: device memory, streams/events and the ops of
// the MoE forward pass. Two implementations: CPU (kernels/cpu_backend.h) and
// CUDA (kernels/cuda_backend.h, which forwards to the dlopen'ed module).
//
// Conventions, for every op:
//  * Every array argument is backend memory: host memory for the CPU backend,
//    device memory from Alloc() for a device backend. Scalars are by value.
//  * Activations are f32, row-major. Weights are f32, f16 or bf16 (DType),
//    row-major in the Hugging Face layout; accumulation is always f32.
//    MatMul and ExpertFfn also take the block formats kQ8, kQ4 and kMxfp4
//    (common/quant.h) and ggml's kQ4_0 .. kQ6K (common/gguf_blocks.h), read
//    directly (dequantized on the fly); their rows must be whole blocks. A
//    backend without kernels for them (BackendInfo's supports_*) returns
//    UNIMPLEMENTED.
//  * Shapes are stated per parameter as `// [rows, cols]`. The public methods
//    validate sizes and pointers and return INVALID_ARGUMENT on bad shapes,
//    before any work is issued; the values inside arrays (token ids,
//    positions) are not inspected on a device backend.
//  * Ops are issued on `stream` (nullptr: the backend's default stream) and
//    may complete asynchronously on a device; Synchronize() waits. On the CPU
//    an op has completed when it returns.
//  * Output arrays must not alias inputs unless the comment says "in place".
//
// Thread-safety: memory, copy and stream functions are thread-safe. Ops on one
// stream must be issued from one thread at a time; the CPU backend runs one
// op at a time (its thread pool is shared), so callers on several threads
// serialise there.
#ifndef MOECACHE_KERNELS_BACKEND_H_
#define MOECACHE_KERNELS_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "absl/strings/string_view.h"
#include "kernels/device_memory.h"  // CopyDirection
#include "kernels/dtype.h"

namespace moe {

// Opaque handles; nullptr is the default stream. The CPU backend executes
// everything synchronously, so its streams and events are trivial.
struct BackendStream;
struct BackendEvent;
using Stream = BackendStream*;
using Event = BackendEvent*;

// Kinds of DoElementwise. The values cross the CUDA module's C ABI
// (MOE_CUDA_EW_*; checked by static_asserts in kernels/cuda_backend.cc).
enum class ElementwiseKind : int {
  kSiluMul = 0,  // out = silu(a) * b (a = gate, b = up)
  kAdd = 1,      // out = a + b
  kScale = 2,    // out = a * s
  kSigmoid = 3,  // out = 1 / (1 + exp(-a))
};

struct BackendInfo {
  std::string name;         // "cpu" or "cuda"
  std::string device_name;  // CPU model / GPU name
  bool is_device = false;   // memory is not host-addressable
  // MatMul and ExpertFfn run kQ8/kQ4 weights (both backends since the CUDA
  // module's ABI v4); a worker refuses a daemon holding a format its
  // backend cannot run.
  bool supports_q8 = true;
  bool supports_q4 = true;
  // And kMxfp4 (the CPU always; CUDA since module ABI v6).
  bool supports_mxfp4 = true;
  // And ggml's block formats kQ4_0 .. kQ6K (IsGgufBlockDType): the CPU
  // always; the CUDA module has kernels (never run on a GPU so far), used
  // only when they pass the self-check run as the backend is created
  // (kernels/cuda_gguf_self_check.h); false, with a WARNING, otherwise.
  bool supports_gguf_blocks = true;
  // And the CPU's interleaved layouts kQ4KR16, kQ4R16, kQ8R16, kQ4_0R16
  // (Q4_K, q4, q8, Q4_0 with 16 rows interleaved, common/row_interleave.h): the CPU at
  // every level, never CUDA. `prefers_rows16`: loaders hold those matrices of
  // whole 16-row groups in them for this backend (CpuPrefersRows16,
  // kernels/cpu_gguf_quant.h).
  bool supports_rows16 = false;
  bool prefers_rows16 = false;
  // Products with bf16 weights round their f32 activations to bf16 first
  // (the CPU on AVX512_BF16: UsesBf16Dot, kernels/cpu_matmul.h); else they
  // read the f32 activations.
  bool bf16_rounds_activations = false;
  int64_t device_memory_bytes = 0;  // total; 0 for the CPU backend
  int64_t free_memory_bytes = 0;    // at the time of the query
  int threads = 1;                  // CPU worker threads (1 on a device)
  std::string simd;                 // CPU: "scalar", "avx2", "avx512", "amx"
};

// Geometry of one layer's attention and its KV cache. The cache holds
// `max_seq` positions: k_cache/v_cache are [max_seq, kv_heads, head_dim].
struct AttentionShape {
  int64_t tokens = 0;    // new query tokens in this call
  int64_t heads = 0;     // query heads
  int64_t kv_heads = 0;  // key/value heads; heads % kv_heads == 0 (GQA)
  int64_t head_dim = 0;
  int64_t max_seq = 0;   // capacity of the cache in positions
  // Position of the first new token; new token t is at start_pos + t.
  // Prefill: start_pos = 0, tokens = prompt length. Decode: tokens = 1.
  int64_t start_pos = 0;
};

// Geometry of multi-head latent attention over a latent cache
// (see Backend::MlaAttention).
struct MlaShape {
  int64_t tokens = 0;     // new query tokens in this call
  int64_t heads = 0;      // query heads
  int64_t nope_dim = 0;   // qk_nope_head_dim
  int64_t rope_dim = 0;   // qk_rope_head_dim
  int64_t v_dim = 0;      // v_head_dim
  int64_t rank = 0;       // kv_lora_rank
  int64_t max_seq = 0;    // capacity of the latent cache in positions
  int64_t start_pos = 0;  // position of the first new token
};

// How RouterSelect scores and chooses experts (a scored, grouped router).
enum class RouterScoring : int { kSoftmax = 0, kSigmoid = 1 };
enum class RouterSelection : int {
  kGreedy = 0,  // top_k of the scores
  // Groups ranked by their best score; top_k among the topk_group best.
  kGroupLimited = 1,
  // Scores plus the correction bias choose; groups ranked by the sum of
  // their two best biased scores (noaux_tc).
  kBiasedGroupLimited = 2,
};
struct RouterSpec {
  RouterScoring scoring = RouterScoring::kSoftmax;
  RouterSelection selection = RouterSelection::kGreedy;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  // When top_k > 1: divide the k weights by (their sum + 1e-20).
  bool renormalize = false;
  // Then multiply them by this (routed_scaling_factor, or 1).
  float scale = 1.0f;
};

// The clamped SwiGLU of biased experts (ExpertActivation::kClampedSwiglu):
// with g, u the biased gate and up projections,
//   g = min(g, limit); u = clamp(u, -limit, limit);
//   act = (u + 1) * g * sigmoid(alpha * g)
struct ClampedSwiglu {
  float limit = 7.0f;
  float alpha = 1.702f;
};

class Backend {
 public:
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual BackendInfo Info() const = 0;

  // ---- Memory -------------------------------------------------------------
  // Alloc returns memory aligned to at least 64 bytes; Alloc(0) is nullptr.
  // RESOURCE_EXHAUSTED when the device is full.
  virtual absl::StatusOr<void*> Alloc(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;  // nullptr is a no-op
  // Host <-> backend copies block until the data has arrived (the host
  // buffer may be reused on return); they are ordered after work already
  // issued on `stream`.
  absl::Status CopyToDevice(void* dst, const void* host_src, size_t bytes,
                            Stream stream = nullptr);
  absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes,
                          Stream stream = nullptr);
  // Asynchronous on a device.
  absl::Status CopyDeviceToDevice(void* dst, const void* src, size_t bytes,
                                  Stream stream = nullptr);
  absl::Status MemsetZero(void* dst, size_t bytes, Stream stream = nullptr);

  // ---- Streams and events -------------------------------------------------
  virtual absl::StatusOr<Stream> CreateStream() = 0;
  virtual void DestroyStream(Stream stream) = 0;
  virtual absl::StatusOr<Event> CreateEvent() = 0;
  virtual void DestroyEvent(Event event) = 0;
  virtual absl::Status RecordEvent(Event event, Stream stream) = 0;
  // Work issued on `stream` later waits for `event`.
  virtual absl::Status StreamWaitEvent(Stream stream, Event event) = 0;
  virtual absl::Status SynchronizeEvent(Event event) = 0;
  virtual absl::Status Synchronize(Stream stream = nullptr) = 0;

  // ---- Ops ----------------------------------------------------------------
  // y = x W^T (+ bias): the Hugging Face Linear. M = 1 is decode (memory
  // bound), M > 1 prefill.
  absl::Status MatMul(const float* x,     // [m, k]
                      const void* w,      // [n, k] of w_dtype
                      DType w_dtype,
                      const float* bias,  // [n] or nullptr
                      float* y,           // [m, n]
                      int64_t m, int64_t n, int64_t k,
                      Stream stream = nullptr);

  // y = x / sqrt(mean(x^2) + eps) * weight, per row. For q/k norm per head,
  // pass rows = tokens * heads and dim = head_dim. In place allowed (y == x).
  absl::Status RmsNorm(const float* x,       // [rows, dim]
                       const float* weight,  // [dim]
                       float* y,             // [rows, dim]
                       int64_t rows, int64_t dim, float eps,
                       Stream stream = nullptr);

  // Rotary embedding, neox style (rotate_half: pairs (i, i + head_dim/2)) as
  // in HF Llama/Mixtral/Qwen/OLMoE; inv_freq_i = theta^(-2i/head_dim).
  // In place on q and k. head_dim must be even.
  absl::Status Rope(float* q,                  // [tokens, q_heads, head_dim]
                    float* k,                  // [tokens, kv_heads, head_dim]
                    const int32_t* positions,  // [tokens]
                    int64_t tokens, int64_t q_heads, int64_t kv_heads,
                    int64_t head_dim, float theta, Stream stream = nullptr);

  // Writes the new tokens' keys/values at positions start_pos.. of the cache.
  absl::Status KvCacheAppend(const float* k,   // [tokens, kv_heads, head_dim]
                             const float* v,   // [tokens, kv_heads, head_dim]
                             float* k_cache,   // [max_seq, kv_heads, head_dim]
                             float* v_cache,   // [max_seq, kv_heads, head_dim]
                             const AttentionShape& shape,
                             Stream stream = nullptr);

  // Causal attention of the new tokens over the cache (which must already
  // hold them, see KvCacheAppend): token t attends to positions
  // [0, start_pos + t]. Query head h uses kv head h / (heads / kv_heads).
  // softmax(q k^T * scale) v in f32; scale is usually 1/sqrt(head_dim).
  absl::Status Attention(const float* q,        // [tokens, heads, head_dim]
                         const float* k_cache,  // [max_seq, kv_heads, head_dim]
                         const float* v_cache,  // [max_seq, kv_heads, head_dim]
                         float* out,            // [tokens, heads, head_dim]
                         const AttentionShape& shape, float scale,
                         Stream stream = nullptr);

  // Router: softmax over all experts, then the top_k largest probabilities in
  // descending order (ties -> lower expert index). With `renormalize`
  // (norm_topk_prob) the k weights are divided by their sum.
  absl::Status RouterTopK(const float* logits,  // [tokens, experts]
                          int32_t* topk_ids,    // [tokens, top_k]
                          float* topk_weights,  // [tokens, top_k]
                          int64_t tokens, int64_t experts, int64_t top_k,
                          bool renormalize, Stream stream = nullptr);

  // Scored router: scores = softmax(logits) or sigmoid(logits) per row;
  // selection per `spec` (choice = scores, + bias for kBiasedGroupLimited;
  // experts of the groups not chosen count as 0 when choosing, as the
  // published masked_fill(..., 0.0)); ids in descending choice order (ties
  // -> lower index); weights = the chosen experts' scores without the bias,
  // then renormalized and scaled per `spec`.
  // REQUIRES: experts % n_group == 0 for the grouped selections,
  // 1 <= topk_group <= n_group, top_k <= topk_group * experts / n_group,
  // groups of >= 2 experts and a bias for kBiasedGroupLimited.
  absl::Status RouterSelect(const float* logits,  // [tokens, experts]
                            const float* bias,    // [experts] or nullptr
                            int32_t* topk_ids,    // [tokens, top_k]
                            float* topk_weights,  // [tokens, top_k]
                            int64_t tokens, int64_t experts, int64_t top_k,
                            const RouterSpec& spec, Stream stream = nullptr);

  // Rotary embedding on interleaved pairs (x[2i], x[2i+1]) of the `rot_dim`
  // values at `offset` in each head of `x` (latent attention's q_pe /
  // k_pe): the pair rotates by positions[t] * inv_freq[i] and is scaled by
  // `mscale` (YaRN's cos/sin factor; 1 otherwise). In place. rot_dim even,
  // offset + rot_dim <= stride.
  absl::Status RopeInterleaved(float* x,  // [tokens, heads, stride]
                               const int32_t* positions,  // [tokens]
                               const float* inv_freq,     // [rot_dim / 2]
                               int64_t tokens, int64_t heads, int64_t stride,
                               int64_t offset, int64_t rot_dim, float mscale,
                               Stream stream = nullptr);

  // Multi-head latent attention with kv_b_proj absorbed, over a
  // cache of the normed latent c_kv and the roped k_pe of every position
  // (which must already hold the new tokens). With W_UK[h] = kv_b rows
  // [h*(nope+v), h*(nope+v)+nope) and W_UV[h] the next v rows, per token t
  // and head h, over positions j <= start_pos + t:
  //   s_j = (q_nope W_UK[h]) . c_kv[j] + q_pe . k_pe[j], p = softmax(s*scale)
  //   out = W_UV[h] (sum_j p_j c_kv[j])
  // which equals attention with keys [c_kv W_UK^T, k_pe] and values
  // c_kv W_UV^T, without expanding them.
  absl::Status MlaAttention(const float* q,  // [tokens, heads, nope+rope]
                            const void* kv_b,  // [heads*(nope+v), rank]
                            DType kv_b_dtype,
                            const float* ckv_cache,  // [max_seq, rank]
                            const float* kpe_cache,  // [max_seq, rope]
                            float* out,              // [tokens, heads, v]
                            const MlaShape& shape, float scale,
                            Stream stream = nullptr);

  // One routed expert (SwiGLU) over the `count` tokens routed to it:
  //   out[row_i] += weight_i * down(silu(gate(x[row_i])) * up(x[row_i]))
  // rows == nullptr means rows 0..count-1; weights == nullptr means 1.
  // REQUIRES: rows are distinct and in [0, tokens). The CPU backend returns
  // INVALID_ARGUMENT otherwise; a device skips rows out of range.
  // Each projection has its own dtype (`w`: a file may mix them, e.g. a
  // Q6_K down beside Q4_K gate and up); each must be a weight dtype whose
  // blocks divide its rows (hidden for gate and up, inter for down).
  absl::Status ExpertFfn(const float* x,        // [tokens, hidden]
                         const int32_t* rows,   // [count] or nullptr
                         const float* weights,  // [count] or nullptr
                         const void* gate,      // [inter, hidden] of w.gate
                         const void* up,        // [inter, hidden] of w.up
                         const void* down,      // [hidden, inter] of w.down
                         const ExpertDTypes& w,
                         float* out,            // [tokens, hidden]
                         int64_t tokens, int64_t count, int64_t hidden,
                         int64_t inter, Stream stream = nullptr);
  // The same with one dtype for all three projections.
  absl::Status ExpertFfn(const float* x, const int32_t* rows, const float* weights,
                         const void* gate, const void* up, const void* down, DType w_dtype,
                         float* out, int64_t tokens, int64_t count, int64_t hidden,
                         int64_t inter, Stream stream = nullptr) {
    return ExpertFfn(x, rows, weights, gate, up, down, ExpertDTypes::All(w_dtype), out, tokens,
                     count, hidden, inter, stream);
  }

  // Several routed experts over the same x: exactly ExpertFfn for each
  // call in turn (out accumulates in call order, so the bits are the
  // loop's), as one op so that a backend may run every call's gate and up
  // as one parallel pass over the weights and every down as another (the
  // CPU does for decode-sized calls: two passes per layer, not two per
  // expert). Each call is checked as ExpertFfn checks it.
  struct ExpertCall {
    const int32_t* rows = nullptr;   // [count] or nullptr
    const float* weights = nullptr;  // [count] or nullptr
    const void* gate = nullptr;
    const void* up = nullptr;
    const void* down = nullptr;
    ExpertDTypes dtypes;
    int64_t count = 0;
  };
  absl::Status ExpertFfns(const float* x, absl::Span<const ExpertCall> calls, float* out,
                          int64_t tokens, int64_t hidden, int64_t inter,
                          Stream stream = nullptr);

  // Attention with sinks (backend.cc checks the shapes): Attention
  // with a learned logit per head that joins each softmax and is dropped
  // afterwards, and an optional sliding window. Token t (position
  // p = start_pos + t) attends to positions j with p - window < j <= p
  // (transformers' sliding_window_overlay: exactly `window` positions once
  // p >= window - 1); window 0 means all of [0, p]. Per head h:
  //   s_j = q . k_j * scale, m = max(max_j s_j, sinks[h]),
  //   out = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) + exp(sinks[h] - m))
  absl::Status SinkAttention(const float* q,        // [tokens, heads, head_dim]
                             const float* k_cache,  // [max_seq, kv_heads, head_dim]
                             const float* v_cache,  // [max_seq, kv_heads, head_dim]
                             const float* sinks,    // [heads]
                             float* out,            // [tokens, heads, head_dim]
                             const AttentionShape& shape, float scale,
                             int64_t window, Stream stream = nullptr);

  // One biased routed expert over the `count` tokens routed to it, with
  // its biases (f32) and the clamped SwiGLU `act`:
  //   out[row_i] += weight_i * (down(act(gate(x) + gate_bias,
  //                                      up(x) + up_bias)) + down_bias)
  // Rows, weights and w_dtype as ExpertFfn.
  absl::Status BiasedExpertFfn(const float* x,          // [tokens, hidden]
                               const int32_t* rows,     // [count] or nullptr
                               const float* weights,    // [count] or nullptr
                               const void* gate,        // [inter, hidden]
                               const void* up,          // [inter, hidden]
                               const void* down,        // [hidden, inter]
                               DType w_dtype,
                               const float* gate_bias,  // [inter]
                               const float* up_bias,    // [inter]
                               const float* down_bias,  // [hidden]
                               const ClampedSwiglu& act,
                               float* out,              // [tokens, hidden]
                               int64_t tokens, int64_t count, int64_t hidden,
                               int64_t inter, Stream stream = nullptr);

  // Row gather from an embedding table, widened to f32.
  // REQUIRES: 0 <= ids[t] < vocab. The CPU backend returns INVALID_ARGUMENT
  // otherwise; a device writes NaN rows for such ids.
  absl::Status Embedding(const void* table,     // [vocab, hidden] of dtype
                         DType dtype,
                         const int32_t* ids,    // [tokens]
                         float* out,            // [tokens, hidden]
                         int64_t tokens, int64_t vocab, int64_t hidden,
                         Stream stream = nullptr);

  // Widens n elements of `src` to f32 (e.g. norm weights at load time).
  absl::Status ConvertToF32(const void* src, DType dtype,  // [n]
                            float* dst,                    // [n]
                            int64_t n, Stream stream = nullptr);

  // ---- Element-wise (all [n]) ---------------------------------------------
  // out = silu(gate) * up; out may alias gate or up.
  absl::Status SiluMul(const float* gate, const float* up, float* out,
                       int64_t n, Stream stream = nullptr);
  // out = a + b (residual add); out may alias a or b.
  absl::Status Add(const float* a, const float* b, float* out, int64_t n,
                   Stream stream = nullptr);
  // x *= s, in place.
  absl::Status Scale(float* x, float s, int64_t n, Stream stream = nullptr);
  // y = 1 / (1 + exp(-x)); in place allowed (qwen2_moe shared-expert gate).
  absl::Status Sigmoid(const float* x, float* y, int64_t n,
                       Stream stream = nullptr);

  // ---- Sampling helpers (per row) -----------------------------------------
  // Index of the maximum (ties -> lower index).
  absl::Status Argmax(const float* x,  // [rows, n]
                      int32_t* ids,    // [rows]
                      int64_t rows, int64_t n, Stream stream = nullptr);
  // out = x - logsumexp(x), per row. In place allowed.
  absl::Status LogSoftmax(const float* x,  // [rows, n]
                          float* out,      // [rows, n]
                          int64_t rows, int64_t n, Stream stream = nullptr);
  // The k largest values per row in descending order (ties -> lower index).
  absl::Status TopK(const float* x,   // [rows, n]
                    int32_t* ids,     // [rows, k]
                    float* values,    // [rows, k]
                    int64_t rows, int64_t n, int64_t k,
                    Stream stream = nullptr);

 protected:
  Backend() = default;

  // Implementations; arguments are already validated.
  virtual absl::Status DoCopy(void* dst, const void* src, size_t bytes,
                              CopyDirection direction, Stream stream) = 0;
  virtual absl::Status DoMemsetZero(void* dst, size_t bytes,
                                    Stream stream) = 0;
  virtual absl::Status DoMatMul(const float* x, const void* w, DType w_dtype,
                                const float* bias, float* y, int64_t m,
                                int64_t n, int64_t k, Stream stream) = 0;
  virtual absl::Status DoRmsNorm(const float* x, const float* weight,
                                 float* y, int64_t rows, int64_t dim,
                                 float eps, Stream stream) = 0;
  virtual absl::Status DoRope(float* q, float* k, const int32_t* positions,
                              int64_t tokens, int64_t q_heads,
                              int64_t kv_heads, int64_t head_dim, float theta,
                              Stream stream) = 0;
  virtual absl::Status DoKvCacheAppend(const float* k, const float* v,
                                       float* k_cache, float* v_cache,
                                       const AttentionShape& shape,
                                       Stream stream) = 0;
  virtual absl::Status DoAttention(const float* q, const float* k_cache,
                                   const float* v_cache, float* out,
                                   const AttentionShape& shape, float scale,
                                   Stream stream) = 0;
  virtual absl::Status DoRouterTopK(const float* logits, int32_t* topk_ids,
                                    float* topk_weights, int64_t tokens,
                                    int64_t experts, int64_t top_k,
                                    bool renormalize, Stream stream) = 0;
  virtual absl::Status DoExpertFfn(const float* x, const int32_t* rows,
                                   const float* weights, const void* gate,
                                   const void* up, const void* down,
                                   const ExpertDTypes& w, float* out, int64_t tokens,
                                   int64_t count, int64_t hidden,
                                   int64_t inter, Stream stream) = 0;
  // Default: DoExpertFfn per call, in order.
  virtual absl::Status DoExpertFfns(const float* x, absl::Span<const ExpertCall> calls,
                                    float* out, int64_t tokens, int64_t hidden, int64_t inter,
                                    Stream stream);
  virtual absl::Status DoEmbedding(const void* table, DType dtype,
                                   const int32_t* ids, float* out,
                                   int64_t tokens, int64_t vocab,
                                   int64_t hidden, Stream stream) = 0;
  virtual absl::Status DoConvertToF32(const void* src, DType dtype,
                                      float* dst, int64_t n,
                                      Stream stream) = 0;
  virtual absl::Status DoElementwise(ElementwiseKind kind, const float* a, const float* b,
                                     float* out, float s, int64_t n,
                                     Stream stream) = 0;
  virtual absl::Status DoArgmax(const float* x, int32_t* ids, int64_t rows,
                                int64_t n, Stream stream) = 0;
  virtual absl::Status DoLogSoftmax(const float* x, float* out, int64_t rows,
                                    int64_t n, Stream stream) = 0;
  virtual absl::Status DoTopK(const float* x, int32_t* ids, float* values,
                              int64_t rows, int64_t n, int64_t k,
                              Stream stream) = 0;
  virtual absl::Status DoRouterSelect(const float* logits, const float* bias,
                                      int32_t* topk_ids, float* topk_weights,
                                      int64_t tokens, int64_t experts,
                                      int64_t top_k, const RouterSpec& spec,
                                      Stream stream) = 0;
  virtual absl::Status DoRopeInterleaved(float* x, const int32_t* positions,
                                         const float* inv_freq,
                                         int64_t tokens, int64_t heads,
                                         int64_t stride, int64_t offset,
                                         int64_t rot_dim, float mscale,
                                         Stream stream) = 0;
  virtual absl::Status DoMlaAttention(const float* q, const void* kv_b,
                                      DType kv_b_dtype, const float* ckv_cache,
                                      const float* kpe_cache, float* out,
                                      const MlaShape& shape, float scale,
                                      Stream stream) = 0;
  virtual absl::Status DoSinkAttention(const float* q, const float* k_cache,
                                       const float* v_cache,
                                       const float* sinks, float* out,
                                       const AttentionShape& shape,
                                       float scale, int64_t window,
                                       Stream stream) = 0;
  // Weights come as {gate, up, down}, biases as {gate, up, down}.
  struct BiasedExpert {
    const void* gate;
    const void* up;
    const void* down;
    DType w_dtype;
    const float* gate_bias;
    const float* up_bias;
    const float* down_bias;
  };
  virtual absl::Status DoBiasedExpertFfn(const float* x, const int32_t* rows,
                                         const float* weights,
                                         const BiasedExpert& e,
                                         const ClampedSwiglu& act, float* out,
                                         int64_t tokens, int64_t count,
                                         int64_t hidden, int64_t inter,
                                         Stream stream) = 0;
};

// "cpu", "cuda" or "auto" (CUDA when a device is usable, else CPU).
// "cuda" returns UNAVAILABLE with the reason when no GPU or module is usable.
// Each call makes a new backend; the CPU backend's thread count is CpuThreads()
// (kernels/cpu_threads.h: --cpu-threads, $MOE_CPU_THREADS, the usable CPUs).
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(absl::string_view name);

// The process-wide "auto" backend, created on first use. Never null.
Backend& DefaultBackend();

}  // namespace moe

#endif  // MOECACHE_KERNELS_BACKEND_H_
