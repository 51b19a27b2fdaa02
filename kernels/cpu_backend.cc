#include "kernels/cpu_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu_gguf_quant.h"
#include "kernels/cpu_mla_router_ops.h"
#include "kernels/cpu_quant_matmul.h"
#include "kernels/cpu_sink_swiglu_ops.h"
#include "kernels/cpu_ops.h"

namespace moe {
namespace {

// Streams and events need distinct non-null handles; their identity is all.
struct CpuHandle {
  int unused = 0;
};

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "cpu";
}

// out[rows[i]] += weights[i] * d[i] for i < count (an expert's output rows
// into the block's; rows nullptr: 0..count-1, weights nullptr: 1).
void AddRows(const float* d, const int32_t* rows, const float* weights, int64_t count,
             int64_t hidden, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    const float w = weights ? weights[i] : 1.0f;
    float* o = out + (rows ? rows[i] : i) * hidden;
    const float* di = d + i * hidden;
    for (int64_t h = 0; h < hidden; ++h) o[h] += w * di[h];
  }
}

// At least n floats of scratch for an expert's intermediates: the calling
// thread's kept buffer up to kKeptFloats (a prompt's are megabytes, so they
// are then neither allocated nor page-faulted per call), its own above.
class ExpertScratch {
 public:
  explicit ExpertScratch(int64_t n) {
    constexpr int64_t kKeptFloats = int64_t{16} << 20;  // 64 MiB
    if (n > kKeptFloats) {
      own_.resize(static_cast<size_t>(n));
      data_ = own_.data();
      return;
    }
    thread_local std::vector<float> kept;
    if (kept.size() < static_cast<size_t>(n)) kept.resize(static_cast<size_t>(n));
    data_ = kept.data();
  }
  float* data() const { return data_; }

 private:
  std::vector<float> own_;
  float* data_ = nullptr;
};

}  // namespace

CpuBackend::CpuBackend(int threads)
    : pool_(std::make_unique<ThreadPool>(threads)), simd_(DetectSimdLevel()) {}

CpuBackend::~CpuBackend() = default;

BackendInfo CpuBackend::Info() const {
  BackendInfo info;
  info.name = "cpu";
  info.device_name = CpuModelName();
  info.is_device = false;
  info.threads = pool_->size();
  info.simd = std::string(SimdLevelName(simd_.load()));
  info.supports_rows16 = true;
  info.prefers_rows16 = CpuPrefersRows16(simd_.load());
  info.bf16_rounds_activations = UsesBf16Dot(DType::kBF16, simd_.load());
  return info;
}

absl::Status CpuBackend::ForceSimdLevelForTest(SimdLevel level) {
  if (!SimdLevelSupported(level)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this CPU cannot run the ", SimdLevelName(level), " kernels"));
  }
  simd_.store(level);
  return absl::OkStatus();
}

absl::StatusOr<void*> CpuBackend::Alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("CPU backend: cannot allocate ", bytes, " bytes"));
  }
  return p;
}

void CpuBackend::Free(void* ptr) { std::free(ptr); }

absl::StatusOr<Stream> CpuBackend::CreateStream() {
  return reinterpret_cast<Stream>(new CpuHandle);
}
void CpuBackend::DestroyStream(Stream stream) {
  delete reinterpret_cast<CpuHandle*>(stream);
}
absl::StatusOr<Event> CpuBackend::CreateEvent() {
  return reinterpret_cast<Event>(new CpuHandle);
}
void CpuBackend::DestroyEvent(Event event) {
  delete reinterpret_cast<CpuHandle*>(event);
}
absl::Status CpuBackend::RecordEvent(Event, Stream) {
  return absl::OkStatus();
}
absl::Status CpuBackend::StreamWaitEvent(Stream, Event) {
  return absl::OkStatus();
}
absl::Status CpuBackend::SynchronizeEvent(Event) { return absl::OkStatus(); }
absl::Status CpuBackend::Synchronize(Stream) { return absl::OkStatus(); }

absl::Status CpuBackend::DoCopy(void* dst, const void* src, size_t bytes, CopyDirection,
                                Stream) {
  std::memmove(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoMemsetZero(void* dst, size_t bytes, Stream) {
  std::memset(dst, 0, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoMatMul(const float* x, const void* w, DType w_dtype,
                                  const float* bias, float* y, int64_t m,
                                  int64_t n, int64_t k, Stream) {
  CpuMatMul(*pool_, simd_.load(), MatMulArgs{x, w, w_dtype, bias, y, m, n, k});
  return absl::OkStatus();
}

absl::Status CpuBackend::DoRmsNorm(const float* x, const float* weight,
                                   float* y, int64_t rows, int64_t dim,
                                   float eps, Stream) {
  cpu::RmsNorm(*pool_, x, weight, y, rows, dim, eps);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoRope(float* q, float* k, const int32_t* positions,
                                int64_t tokens, int64_t q_heads,
                                int64_t kv_heads, int64_t head_dim,
                                float theta, Stream) {
  cpu::Rope(*pool_, q, k, positions, tokens, q_heads, kv_heads, head_dim,
            theta);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoKvCacheAppend(const float* k, const float* v,
                                         float* k_cache, float* v_cache,
                                         const AttentionShape& shape, Stream) {
  cpu::KvCacheAppend(k, v, k_cache, v_cache, shape);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoAttention(const float* q, const float* k_cache,
                                     const float* v_cache, float* out,
                                     const AttentionShape& shape, float scale,
                                     Stream) {
  cpu::Attention(*pool_, VectorOpsFor(simd_.load()), q, k_cache, v_cache, out,
                 shape, scale);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoRouterTopK(const float* logits, int32_t* topk_ids,
                                      float* topk_weights, int64_t tokens,
                                      int64_t experts, int64_t top_k,
                                      bool renormalize, Stream) {
  cpu::RouterTopK(*pool_, logits, topk_ids, topk_weights, tokens, experts,
                  top_k, renormalize);
  return absl::OkStatus();
}

absl::StatusOr<const float*> CpuBackend::GatherRows(const char* op, const float* x,
                                                    const int32_t* rows, int64_t tokens,
                                                    int64_t count, int64_t hidden,
                                                    float* scratch) {
  if (rows == nullptr) return x;
  for (int64_t i = 0; i < count; ++i) {
    if (rows[i] < 0 || rows[i] >= tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": row ", rows[i], " at ", i, " is outside [0, ", tokens, ")"));
    }
  }
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(scratch + i * hidden, x + rows[i] * hidden, hidden * sizeof(float));
  }
  return scratch;
}

absl::Status CpuBackend::DoExpertFfn(const float* x, const int32_t* rows,
                                     const float* weights, const void* gate,
                                     const void* up, const void* down,
                                     const ExpertDTypes& w, float* out, int64_t tokens,
                                     int64_t count, int64_t hidden,
                                     int64_t inter, Stream) {
  // xg [count, hidden] | g [count, inter] | u [count, inter] | d [count, hidden]
  const ExpertScratch scratch(count * (2 * hidden + 2 * inter));
  float* xg = scratch.data();
  float* g = xg + count * hidden;
  float* u = g + count * inter;
  float* d = u + count * inter;
  ASSIGN_OR_RETURN(const float* xin,
                   GatherRows("ExpertFfn", x, rows, tokens, count, hidden, xg));
  const SimdLevel level = simd_.load();
  if (w.gate == w.up) {
    CpuGateUpSilu(*pool_, level, xin, gate, up, w.gate, g, u, count, inter, hidden);
  } else {  // the same arithmetic, x quantized once per product
    CpuMatMul(*pool_, level, {xin, gate, w.gate, nullptr, g, count, inter, hidden});
    CpuMatMul(*pool_, level, {xin, up, w.up, nullptr, u, count, inter, hidden});
    cpu::SiluMul(level, g, u, g, count * inter);
  }
  CpuMatMul(*pool_, level, {g, down, w.down, nullptr, d, count, hidden, inter});
  AddRows(d, rows, weights, count, hidden, out);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoExpertFfns(const float* x, absl::Span<const ExpertCall> calls,
                                      float* out, int64_t tokens, int64_t hidden,
                                      int64_t inter, Stream stream) {
  // Passes only where the kept inputs stay small (decode and short
  // batches: each call's activations are quantized into its own kept
  // QuantizedInput) and the calls share dtypes, gate's equal to up's.
  constexpr int64_t kMaxPassActivations = int64_t{1} << 16;
  const int64_t n = static_cast<int64_t>(calls.size());
  const ExpertDTypes& t = calls[0].dtypes;
  int64_t total = 0;
  bool passes = n > 1 && t.gate == t.up;
  for (const ExpertCall& c : calls) {
    total += c.count;
    passes = passes && c.dtypes == t && c.count * std::max(hidden, inter) <= kMaxPassActivations;
  }
  if (!passes) return Backend::DoExpertFfns(x, calls, out, tokens, hidden, inter, stream);
  // Per call: xg [count, hidden] | g [count, inter] | u [count, inter] | d [count, hidden].
  const ExpertScratch scratch(total * (2 * hidden + 2 * inter));
  std::vector<ExpertPass> experts(static_cast<size_t>(n));
  float* at = scratch.data();
  for (int64_t i = 0; i < n; ++i) {
    const ExpertCall& c = calls[i];
    ExpertPass& p = experts[i];
    float* xg = at;
    p.g = xg + c.count * hidden;
    p.u = p.g + c.count * inter;
    p.d = p.u + c.count * inter;
    at = p.d + c.count * hidden;
    ASSIGN_OR_RETURN(p.x, GatherRows("ExpertFfns", x, c.rows, tokens, c.count, hidden, xg));
    p.gate = c.gate;
    p.up = c.up;
    p.down = c.down;
    p.count = c.count;
  }
  thread_local std::vector<QuantizedInput> inputs;
  if (inputs.size() < calls.size()) inputs.resize(calls.size());
  CpuExpertPasses(*pool_, simd_.load(), experts, t.gate, t.down, hidden, inter,
                  absl::MakeSpan(inputs));
  for (int64_t i = 0; i < n; ++i) {  // in call order, as the loop adds them
    AddRows(experts[i].d, calls[i].rows, calls[i].weights, calls[i].count, hidden, out);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::DoBiasedExpertFfn(const float* x, const int32_t* rows,
                                           const float* weights, const BiasedExpert& e,
                                           const ClampedSwiglu& act, float* out,
                                           int64_t tokens, int64_t count, int64_t hidden,
                                           int64_t inter, Stream) {
  const ExpertScratch scratch(count * (2 * hidden + 2 * inter));
  float* xg = scratch.data();
  float* g = xg + count * hidden;
  float* u = g + count * inter;
  float* d = u + count * inter;
  ASSIGN_OR_RETURN(const float* xin,
                   GatherRows("BiasedExpertFfn", x, rows, tokens, count, hidden, xg));
  const SimdLevel level = simd_.load();
  CpuMatMul(*pool_, level, {xin, e.gate, e.w_dtype, e.gate_bias, g, count, inter, hidden});
  CpuMatMul(*pool_, level, {xin, e.up, e.w_dtype, e.up_bias, u, count, inter, hidden});
  cpu::ClampedSwigluRows(g, u, count, inter, act);
  CpuMatMul(*pool_, level, {g, e.down, e.w_dtype, e.down_bias, d, count, hidden, inter});
  AddRows(d, rows, weights, count, hidden, out);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoSinkAttention(const float* q, const float* k_cache,
                                         const float* v_cache, const float* sinks,
                                         float* out, const AttentionShape& shape,
                                         float scale, int64_t window, Stream) {
  cpu::SinkAttention(*pool_, VectorOpsFor(simd_.load()), q, k_cache, v_cache, sinks, out,
                     shape, scale, window);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoEmbedding(const void* table, DType dtype,
                                     const int32_t* ids, float* out,
                                     int64_t tokens, int64_t vocab,
                                     int64_t hidden, Stream) {
  return cpu::Embedding(*pool_, table, dtype, ids, out, tokens, vocab, hidden);
}

absl::Status CpuBackend::DoConvertToF32(const void* src, DType dtype,
                                        float* dst, int64_t n, Stream) {
  cpu::ConvertToF32(src, dtype, dst, n);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoElementwise(ElementwiseKind kind, const float* a,
                                       const float* b, float* out, float s,
                                       int64_t n, Stream) {
  switch (kind) {
    case ElementwiseKind::kSiluMul:
      cpu::SiluMul(simd_.load(), a, b, out, n);
      break;
    case ElementwiseKind::kAdd:
      cpu::Add(a, b, out, n);
      break;
    case ElementwiseKind::kScale:
      cpu::Scale(out, s, n);
      break;
    case ElementwiseKind::kSigmoid:
      cpu::Sigmoid(a, out, n);
      break;
    default:
      return absl::InternalError(absl::StrCat("unknown elementwise op ", static_cast<int>(kind)));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::DoArgmax(const float* x, int32_t* ids, int64_t rows,
                                  int64_t n, Stream) {
  cpu::Argmax(x, ids, rows, n);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoLogSoftmax(const float* x, float* out,
                                      int64_t rows, int64_t n, Stream) {
  cpu::LogSoftmax(*pool_, x, out, rows, n);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoTopK(const float* x, int32_t* ids, float* values,
                                int64_t rows, int64_t n, int64_t k, Stream) {
  cpu::TopK(*pool_, x, ids, values, rows, n, k);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoRouterSelect(const float* logits, const float* bias,
                                        int32_t* topk_ids, float* topk_weights,
                                        int64_t tokens, int64_t experts,
                                        int64_t top_k, const RouterSpec& spec,
                                        Stream) {
  cpu::RouterSelect(*pool_, logits, bias, topk_ids, topk_weights, tokens,
                    experts, top_k, spec);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoRopeInterleaved(float* x, const int32_t* positions,
                                           const float* inv_freq,
                                           int64_t tokens, int64_t heads,
                                           int64_t stride, int64_t offset,
                                           int64_t rot_dim, float mscale,
                                           Stream) {
  cpu::RopeInterleaved(*pool_, x, positions, inv_freq, tokens, heads, stride,
                       offset, rot_dim, mscale);
  return absl::OkStatus();
}

absl::Status CpuBackend::DoMlaAttention(const float* q, const void* kv_b,
                                        DType kv_b_dtype,
                                        const float* ckv_cache,
                                        const float* kpe_cache, float* out,
                                        const MlaShape& shape, float scale,
                                        Stream) {
  cpu::MlaAttention(*pool_, VectorOpsFor(simd_.load()), q, kv_b, kv_b_dtype,
                    ckv_cache, kpe_cache, out, shape, scale);
  return absl::OkStatus();
}

}  // namespace moe
