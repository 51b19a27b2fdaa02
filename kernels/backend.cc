// Shape validation for every op (shared by all backends) and the factory.
#include "kernels/backend.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/cpu_budget.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/cpu_backend.h"
#include "kernels/cpu_threads.h"
#include "kernels/cuda_backend.h"

namespace moe {
namespace {

constexpr int64_t kMaxDim = int64_t{1} << 40;

absl::Status CheckDims(absl::string_view op,
                       std::initializer_list<std::pair<const char*, int64_t>>
                           dims) {
  for (const auto& [name, value] : dims) {
    if (value < 0 || value > kMaxDim) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", name, " = ", value, " is out of range"));
    }
  }
  return absl::OkStatus();
}

// A pointer must be non-null when the array it points to is non-empty.
absl::Status CheckPtr(absl::string_view op, const char* name, const void* p,
                      int64_t elements) {
  if (p == nullptr && elements > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", name, " is null but has ", elements,
                     " elements"));
  }
  return absl::OkStatus();
}

absl::Status CheckDType(absl::string_view op, DType t) {
  if (t != DType::kF32 && t != DType::kF16 && t != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": unknown weight dtype ", static_cast<int>(t)));
  }
  return absl::OkStatus();
}

// A weight of a plain dtype, or of a block format (kQ8, kQ4) whose rows of
// `k` weights are whole blocks.
absl::Status CheckWeightDType(absl::string_view op, DType t,
                              std::initializer_list<int64_t> row_lengths) {
  if (!IsQuantDType(t)) return CheckDType(op, t);
  for (int64_t k : row_lengths) {
    if (k % QuantGroupSize(t) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": rows of ", k, " weights are not whole ", DTypeName(t),
          " blocks of ", QuantGroupSize(t)));
    }
  }
  return absl::OkStatus();
}

// `rows` rows of a weight of dtype t are whole row groups (RowGroupOf:
// kQ4KR16's 16).
absl::Status CheckRowGroups(absl::string_view op, DType t, int64_t rows) {
  if (rows % RowGroupOf(t) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", rows, " rows of ", DTypeName(t),
                                                   " are not whole groups of ", RowGroupOf(t)));
  }
  return absl::OkStatus();
}

absl::Status CheckAttentionShape(absl::string_view op,
                                 const AttentionShape& s) {
  RETURN_IF_ERROR(CheckDims(op, {{"tokens", s.tokens},
                                 {"heads", s.heads},
                                 {"kv_heads", s.kv_heads},
                                 {"head_dim", s.head_dim},
                                 {"max_seq", s.max_seq},
                                 {"start_pos", s.start_pos}}));
  if (s.heads <= 0 || s.kv_heads <= 0 || s.head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": heads, kv_heads and head_dim must be positive (", s.heads, ", ",
        s.kv_heads, ", ", s.head_dim, ")"));
  }
  if (s.heads % s.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": heads (", s.heads, ") is not a multiple of kv_heads (",
        s.kv_heads, ")"));
  }
  if (s.start_pos + s.tokens > s.max_seq) {
    return absl::OutOfRangeError(absl::StrCat(
        op, ": positions up to ", s.start_pos + s.tokens,
        " exceed the KV cache capacity ", s.max_seq));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Backend::CopyToDevice(void* dst, const void* host_src,
                                   size_t bytes, Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckPtr("CopyToDevice", "dst", dst, 1));
  RETURN_IF_ERROR(CheckPtr("CopyToDevice", "src", host_src, 1));
  return DoCopy(dst, host_src, bytes, CopyDirection::kHostToDevice, stream);
}

absl::Status Backend::CopyToHost(void* host_dst, const void* src, size_t bytes,
                                 Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckPtr("CopyToHost", "dst", host_dst, 1));
  RETURN_IF_ERROR(CheckPtr("CopyToHost", "src", src, 1));
  return DoCopy(host_dst, src, bytes, CopyDirection::kDeviceToHost, stream);
}

absl::Status Backend::CopyDeviceToDevice(void* dst, const void* src,
                                         size_t bytes, Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckPtr("CopyDeviceToDevice", "dst", dst, 1));
  RETURN_IF_ERROR(CheckPtr("CopyDeviceToDevice", "src", src, 1));
  return DoCopy(dst, src, bytes, CopyDirection::kDeviceToDevice, stream);
}

absl::Status Backend::MemsetZero(void* dst, size_t bytes, Stream stream) {
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckPtr("MemsetZero", "dst", dst, 1));
  return DoMemsetZero(dst, bytes, stream);
}

absl::Status Backend::MatMul(const float* x, const void* w, DType w_dtype,
                             const float* bias, float* y, int64_t m, int64_t n,
                             int64_t k, Stream stream) {
  constexpr absl::string_view kOp = "MatMul";
  RETURN_IF_ERROR(CheckDims(kOp, {{"m", m}, {"n", n}, {"k", k}}));
  RETURN_IF_ERROR(CheckWeightDType(kOp, w_dtype, {k}));
  RETURN_IF_ERROR(CheckRowGroups(kOp, w_dtype, n));
  RETURN_IF_ERROR(CheckPtr(kOp, "x", x, m * k));
  RETURN_IF_ERROR(CheckPtr(kOp, "w", w, n * k));
  RETURN_IF_ERROR(CheckPtr(kOp, "y", y, m * n));
  if (m == 0 || n == 0) return absl::OkStatus();
  if (k == 0) {
    return absl::InvalidArgumentError("MatMul: k must be positive");
  }
  return DoMatMul(x, w, w_dtype, bias, y, m, n, k, stream);
}

absl::Status Backend::RmsNorm(const float* x, const float* weight, float* y,
                              int64_t rows, int64_t dim, float eps,
                              Stream stream) {
  constexpr absl::string_view kOp = "RmsNorm";
  RETURN_IF_ERROR(CheckDims(kOp, {{"rows", rows}, {"dim", dim}}));
  if (dim == 0 && rows > 0) {
    return absl::InvalidArgumentError("RmsNorm: dim must be positive");
  }
  if (!(eps >= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RmsNorm: eps = ", eps, " must be >= 0"));
  }
  RETURN_IF_ERROR(CheckPtr(kOp, "x", x, rows * dim));
  RETURN_IF_ERROR(CheckPtr(kOp, "weight", weight, rows > 0 ? dim : 0));
  RETURN_IF_ERROR(CheckPtr(kOp, "y", y, rows * dim));
  if (rows == 0) return absl::OkStatus();
  return DoRmsNorm(x, weight, y, rows, dim, eps, stream);
}

absl::Status Backend::Rope(float* q, float* k, const int32_t* positions,
                           int64_t tokens, int64_t q_heads, int64_t kv_heads,
                           int64_t head_dim, float theta, Stream stream) {
  constexpr absl::string_view kOp = "Rope";
  RETURN_IF_ERROR(CheckDims(kOp, {{"tokens", tokens},
                                  {"q_heads", q_heads},
                                  {"kv_heads", kv_heads},
                                  {"head_dim", head_dim}}));
  if (head_dim == 0 || head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Rope: head_dim = ", head_dim, " must be positive and even"));
  }
  if (!(theta > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Rope: theta = ", theta, " must be positive"));
  }
  RETURN_IF_ERROR(CheckPtr(kOp, "q", q, tokens * q_heads * head_dim));
  RETURN_IF_ERROR(CheckPtr(kOp, "k", k, tokens * kv_heads * head_dim));
  RETURN_IF_ERROR(CheckPtr(kOp, "positions", positions, tokens));
  if (tokens == 0) return absl::OkStatus();
  return DoRope(q, k, positions, tokens, q_heads, kv_heads, head_dim, theta,
                stream);
}

absl::Status Backend::KvCacheAppend(const float* k, const float* v,
                                    float* k_cache, float* v_cache,
                                    const AttentionShape& shape,
                                    Stream stream) {
  constexpr absl::string_view kOp = "KvCacheAppend";
  RETURN_IF_ERROR(CheckAttentionShape(kOp, shape));
  int64_t new_elems = shape.tokens * shape.kv_heads * shape.head_dim;
  int64_t cache_elems = shape.max_seq * shape.kv_heads * shape.head_dim;
  RETURN_IF_ERROR(CheckPtr(kOp, "k", k, new_elems));
  RETURN_IF_ERROR(CheckPtr(kOp, "v", v, new_elems));
  RETURN_IF_ERROR(CheckPtr(kOp, "k_cache", k_cache, cache_elems));
  RETURN_IF_ERROR(CheckPtr(kOp, "v_cache", v_cache, cache_elems));
  if (shape.tokens == 0) return absl::OkStatus();
  return DoKvCacheAppend(k, v, k_cache, v_cache, shape, stream);
}

absl::Status Backend::Attention(const float* q, const float* k_cache,
                                const float* v_cache, float* out,
                                const AttentionShape& shape, float scale,
                                Stream stream) {
  constexpr absl::string_view kOp = "Attention";
  RETURN_IF_ERROR(CheckAttentionShape(kOp, shape));
  if (!(scale > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Attention: scale = ", scale, " must be positive"));
  }
  int64_t q_elems = shape.tokens * shape.heads * shape.head_dim;
  int64_t cache_elems = shape.max_seq * shape.kv_heads * shape.head_dim;
  RETURN_IF_ERROR(CheckPtr(kOp, "q", q, q_elems));
  RETURN_IF_ERROR(CheckPtr(kOp, "k_cache", k_cache, cache_elems));
  RETURN_IF_ERROR(CheckPtr(kOp, "v_cache", v_cache, cache_elems));
  RETURN_IF_ERROR(CheckPtr(kOp, "out", out, q_elems));
  if (shape.tokens == 0) return absl::OkStatus();
  return DoAttention(q, k_cache, v_cache, out, shape, scale, stream);
}

absl::Status Backend::RouterTopK(const float* logits, int32_t* topk_ids,
                                 float* topk_weights, int64_t tokens,
                                 int64_t experts, int64_t top_k,
                                 bool renormalize, Stream stream) {
  constexpr absl::string_view kOp = "RouterTopK";
  RETURN_IF_ERROR(CheckDims(
      kOp, {{"tokens", tokens}, {"experts", experts}, {"top_k", top_k}}));
  if (top_k < 1 || top_k > experts ||
      experts > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RouterTopK: need 1 <= top_k (", top_k, ") <= experts (", experts,
        ")"));
  }
  RETURN_IF_ERROR(CheckPtr(kOp, "logits", logits, tokens * experts));
  RETURN_IF_ERROR(CheckPtr(kOp, "topk_ids", topk_ids, tokens * top_k));
  RETURN_IF_ERROR(CheckPtr(kOp, "topk_weights", topk_weights, tokens * top_k));
  if (tokens == 0) return absl::OkStatus();
  return DoRouterTopK(logits, topk_ids, topk_weights, tokens, experts, top_k,
                      renormalize, stream);
}

namespace {

// ExpertFfn's checks of one expert (`op` names the op in messages).
absl::Status CheckExpertFfn(absl::string_view op, const float* x, const void* gate,
                            const void* up, const void* down, const ExpertDTypes& w,
                            const float* out, int64_t tokens, int64_t count, int64_t hidden,
                            int64_t inter) {
  RETURN_IF_ERROR(CheckDims(op, {{"tokens", tokens},
                                 {"count", count},
                                 {"hidden", hidden},
                                 {"inter", inter}}));
  RETURN_IF_ERROR(CheckWeightDType(op, w.gate, {hidden}));
  RETURN_IF_ERROR(CheckWeightDType(op, w.up, {hidden}));
  RETURN_IF_ERROR(CheckWeightDType(op, w.down, {inter}));
  RETURN_IF_ERROR(CheckRowGroups(op, w.gate, inter));
  RETURN_IF_ERROR(CheckRowGroups(op, w.up, inter));
  RETURN_IF_ERROR(CheckRowGroups(op, w.down, hidden));
  if (count > tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": count (", count, ") exceeds tokens (", tokens, ")"));
  }
  if (hidden == 0 || inter == 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": hidden and inter must be > 0"));
  }
  RETURN_IF_ERROR(CheckPtr(op, "x", x, tokens * hidden));
  RETURN_IF_ERROR(CheckPtr(op, "gate", gate, inter * hidden));
  RETURN_IF_ERROR(CheckPtr(op, "up", up, inter * hidden));
  RETURN_IF_ERROR(CheckPtr(op, "down", down, hidden * inter));
  return CheckPtr(op, "out", out, tokens * hidden);
}

}  // namespace

absl::Status Backend::ExpertFfn(const float* x, const int32_t* rows,
                                const float* weights, const void* gate,
                                const void* up, const void* down,
                                const ExpertDTypes& w, float* out, int64_t tokens,
                                int64_t count, int64_t hidden, int64_t inter,
                                Stream stream) {
  RETURN_IF_ERROR(
      CheckExpertFfn("ExpertFfn", x, gate, up, down, w, out, tokens, count, hidden, inter));
  if (count == 0) return absl::OkStatus();
  return DoExpertFfn(x, rows, weights, gate, up, down, w, out, tokens,
                     count, hidden, inter, stream);
}

absl::Status Backend::ExpertFfns(const float* x, absl::Span<const ExpertCall> calls,
                                 float* out, int64_t tokens, int64_t hidden, int64_t inter,
                                 Stream stream) {
  for (size_t i = 0; i < calls.size(); ++i) {
    const ExpertCall& c = calls[i];
    RETURN_IF_ERROR(CheckExpertFfn(absl::StrCat("ExpertFfns call ", i), x, c.gate, c.up,
                                   c.down, c.dtypes, out, tokens, c.count, hidden, inter));
  }
  if (calls.empty()) return absl::OkStatus();
  return DoExpertFfns(x, calls, out, tokens, hidden, inter, stream);
}

absl::Status Backend::DoExpertFfns(const float* x, absl::Span<const ExpertCall> calls,
                                   float* out, int64_t tokens, int64_t hidden, int64_t inter,
                                   Stream stream) {
  for (const ExpertCall& c : calls) {
    if (c.count == 0) continue;
    RETURN_IF_ERROR(DoExpertFfn(x, c.rows, c.weights, c.gate, c.up, c.down, c.dtypes, out,
                                tokens, c.count, hidden, inter, stream));
  }
  return absl::OkStatus();
}

absl::Status Backend::SinkAttention(const float* q, const float* k_cache,
                                    const float* v_cache, const float* sinks,
                                    float* out, const AttentionShape& shape,
                                    float scale, int64_t window,
                                    Stream stream) {
  constexpr absl::string_view kOp = "SinkAttention";
  RETURN_IF_ERROR(CheckAttentionShape(kOp, shape));
  RETURN_IF_ERROR(CheckDims(kOp, {{"window", window}}));
  if (!(scale > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SinkAttention: scale = ", scale, " must be positive"));
  }
  const int64_t q_elems = shape.tokens * shape.heads * shape.head_dim;
  const int64_t cache_elems = shape.max_seq * shape.kv_heads * shape.head_dim;
  RETURN_IF_ERROR(CheckPtr(kOp, "q", q, q_elems));
  RETURN_IF_ERROR(CheckPtr(kOp, "k_cache", k_cache, cache_elems));
  RETURN_IF_ERROR(CheckPtr(kOp, "v_cache", v_cache, cache_elems));
  RETURN_IF_ERROR(CheckPtr(kOp, "sinks", sinks, shape.heads));
  RETURN_IF_ERROR(CheckPtr(kOp, "out", out, q_elems));
  if (shape.tokens == 0) return absl::OkStatus();
  return DoSinkAttention(q, k_cache, v_cache, sinks, out, shape, scale, window,
                         stream);
}

absl::Status Backend::BiasedExpertFfn(
    const float* x, const int32_t* rows, const float* weights, const void* gate,
    const void* up, const void* down, DType w_dtype, const float* gate_bias,
    const float* up_bias, const float* down_bias, const ClampedSwiglu& act,
    float* out, int64_t tokens, int64_t count, int64_t hidden, int64_t inter,
    Stream stream) {
  constexpr absl::string_view kOp = "BiasedExpertFfn";
  RETURN_IF_ERROR(CheckDims(kOp, {{"tokens", tokens},
                                  {"count", count},
                                  {"hidden", hidden},
                                  {"inter", inter}}));
  RETURN_IF_ERROR(CheckWeightDType(kOp, w_dtype, {hidden, inter}));
  RETURN_IF_ERROR(CheckRowGroups(kOp, w_dtype, hidden));
  RETURN_IF_ERROR(CheckRowGroups(kOp, w_dtype, inter));
  if (count > tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BiasedExpertFfn: count (", count, ") exceeds tokens (", tokens, ")"));
  }
  if (hidden == 0 || inter == 0) {
    return absl::InvalidArgumentError(
        "BiasedExpertFfn: hidden and inter must be > 0");
  }
  if (!(act.limit > 0.0f) || !std::isfinite(act.limit) ||
      !std::isfinite(act.alpha)) {
    return absl::InvalidArgumentError(
        absl::StrCat("BiasedExpertFfn: limit = ", act.limit,
                     " must be positive and finite, alpha = ", act.alpha,
                     " finite"));
  }
  RETURN_IF_ERROR(CheckPtr(kOp, "x", x, tokens * hidden));
  RETURN_IF_ERROR(CheckPtr(kOp, "gate", gate, inter * hidden));
  RETURN_IF_ERROR(CheckPtr(kOp, "up", up, inter * hidden));
  RETURN_IF_ERROR(CheckPtr(kOp, "down", down, hidden * inter));
  RETURN_IF_ERROR(CheckPtr(kOp, "gate_bias", gate_bias, inter));
  RETURN_IF_ERROR(CheckPtr(kOp, "up_bias", up_bias, inter));
  RETURN_IF_ERROR(CheckPtr(kOp, "down_bias", down_bias, hidden));
  RETURN_IF_ERROR(CheckPtr(kOp, "out", out, tokens * hidden));
  if (count == 0) return absl::OkStatus();
  return DoBiasedExpertFfn(
      x, rows, weights,
      BiasedExpert{gate, up, down, w_dtype, gate_bias, up_bias, down_bias}, act,
      out, tokens, count, hidden, inter, stream);
}

absl::Status Backend::Embedding(const void* table, DType dtype,
                                const int32_t* ids, float* out, int64_t tokens,
                                int64_t vocab, int64_t hidden, Stream stream) {
  constexpr absl::string_view kOp = "Embedding";
  RETURN_IF_ERROR(CheckDims(
      kOp, {{"tokens", tokens}, {"vocab", vocab}, {"hidden", hidden}}));
  RETURN_IF_ERROR(CheckDType(kOp, dtype));
  if (vocab == 0 && tokens > 0) {
    return absl::InvalidArgumentError("Embedding: empty table");
  }
  RETURN_IF_ERROR(CheckPtr(kOp, "table", table, vocab * hidden));
  RETURN_IF_ERROR(CheckPtr(kOp, "ids", ids, tokens));
  RETURN_IF_ERROR(CheckPtr(kOp, "out", out, tokens * hidden));
  if (tokens == 0 || hidden == 0) return absl::OkStatus();
  return DoEmbedding(table, dtype, ids, out, tokens, vocab, hidden, stream);
}

absl::Status Backend::ConvertToF32(const void* src, DType dtype, float* dst,
                                   int64_t n, Stream stream) {
  RETURN_IF_ERROR(CheckDims("ConvertToF32", {{"n", n}}));
  RETURN_IF_ERROR(CheckDType("ConvertToF32", dtype));
  RETURN_IF_ERROR(CheckPtr("ConvertToF32", "src", src, n));
  RETURN_IF_ERROR(CheckPtr("ConvertToF32", "dst", dst, n));
  if (n == 0) return absl::OkStatus();
  return DoConvertToF32(src, dtype, dst, n, stream);
}

absl::Status Backend::SiluMul(const float* gate, const float* up, float* out,
                              int64_t n, Stream stream) {
  RETURN_IF_ERROR(CheckDims("SiluMul", {{"n", n}}));
  RETURN_IF_ERROR(CheckPtr("SiluMul", "gate", gate, n));
  RETURN_IF_ERROR(CheckPtr("SiluMul", "up", up, n));
  RETURN_IF_ERROR(CheckPtr("SiluMul", "out", out, n));
  if (n == 0) return absl::OkStatus();
  return DoElementwise(ElementwiseKind::kSiluMul, gate, up, out, 0.0f, n, stream);
}

absl::Status Backend::Add(const float* a, const float* b, float* out,
                          int64_t n, Stream stream) {
  RETURN_IF_ERROR(CheckDims("Add", {{"n", n}}));
  RETURN_IF_ERROR(CheckPtr("Add", "a", a, n));
  RETURN_IF_ERROR(CheckPtr("Add", "b", b, n));
  RETURN_IF_ERROR(CheckPtr("Add", "out", out, n));
  if (n == 0) return absl::OkStatus();
  return DoElementwise(ElementwiseKind::kAdd, a, b, out, 0.0f, n, stream);
}

absl::Status Backend::Scale(float* x, float s, int64_t n, Stream stream) {
  RETURN_IF_ERROR(CheckDims("Scale", {{"n", n}}));
  RETURN_IF_ERROR(CheckPtr("Scale", "x", x, n));
  if (n == 0) return absl::OkStatus();
  return DoElementwise(ElementwiseKind::kScale, x, nullptr, x, s, n, stream);
}

absl::Status Backend::Sigmoid(const float* x, float* y, int64_t n,
                              Stream stream) {
  RETURN_IF_ERROR(CheckDims("Sigmoid", {{"n", n}}));
  RETURN_IF_ERROR(CheckPtr("Sigmoid", "x", x, n));
  RETURN_IF_ERROR(CheckPtr("Sigmoid", "y", y, n));
  if (n == 0) return absl::OkStatus();
  return DoElementwise(ElementwiseKind::kSigmoid, x, nullptr, y, 0.0f, n, stream);
}

absl::Status Backend::Argmax(const float* x, int32_t* ids, int64_t rows,
                             int64_t n, Stream stream) {
  RETURN_IF_ERROR(CheckDims("Argmax", {{"rows", rows}, {"n", n}}));
  if ((n == 0 && rows > 0) || n > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Argmax: row length ", n, " out of range"));
  }
  RETURN_IF_ERROR(CheckPtr("Argmax", "x", x, rows * n));
  RETURN_IF_ERROR(CheckPtr("Argmax", "ids", ids, rows));
  if (rows == 0) return absl::OkStatus();
  return DoArgmax(x, ids, rows, n, stream);
}

absl::Status Backend::LogSoftmax(const float* x, float* out, int64_t rows,
                                 int64_t n, Stream stream) {
  RETURN_IF_ERROR(CheckDims("LogSoftmax", {{"rows", rows}, {"n", n}}));
  if (n == 0 && rows > 0) {
    return absl::InvalidArgumentError("LogSoftmax: empty rows");
  }
  RETURN_IF_ERROR(CheckPtr("LogSoftmax", "x", x, rows * n));
  RETURN_IF_ERROR(CheckPtr("LogSoftmax", "out", out, rows * n));
  if (rows == 0) return absl::OkStatus();
  return DoLogSoftmax(x, out, rows, n, stream);
}

absl::Status Backend::TopK(const float* x, int32_t* ids, float* values,
                           int64_t rows, int64_t n, int64_t k, Stream stream) {
  RETURN_IF_ERROR(CheckDims("TopK", {{"rows", rows}, {"n", n}, {"k", k}}));
  if (k < 1 || k > n || n > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TopK: need 1 <= k (", k, ") <= n (", n, ")"));
  }
  RETURN_IF_ERROR(CheckPtr("TopK", "x", x, rows * n));
  RETURN_IF_ERROR(CheckPtr("TopK", "ids", ids, rows * k));
  RETURN_IF_ERROR(CheckPtr("TopK", "values", values, rows * k));
  if (rows == 0) return absl::OkStatus();
  return DoTopK(x, ids, values, rows, n, k, stream);
}

namespace {
std::atomic<int> g_cpu_threads{0};
}  // namespace

void SetCpuThreads(int n) { g_cpu_threads.store(std::max(0, n)); }

int CpuThreads() {
  if (int n = g_cpu_threads.load(); n > 0) return n;
  if (const char* env = std::getenv("MOE_CPU_THREADS"); env && *env) {
    if (int n = std::atoi(env); n > 0) return n;
  }
  return UsableCpus();
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(absl::string_view name) {
  if (name == "cpu") return std::unique_ptr<Backend>(new CpuBackend(CpuThreads()));
  if (name == "cuda") return CreateCudaBackend(/*device=*/0);
  if (name == "auto") {
    auto cuda = CreateCudaBackend(/*device=*/0);
    if (cuda.ok()) return cuda;
    MOE_LOG(INFO) << "using the CPU backend: " << cuda.status().message();
    return CreateBackend("cpu");
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown backend '", name, "' (expected cpu, cuda or auto)"));
}

Backend& DefaultBackend() {
  static Backend* backend = [] {
    auto created = CreateBackend("auto");
    MOE_CHECK(created.ok()) << created.status();
    return created->release();
  }();
  return *backend;
}

}  // namespace moe
