#include "services/engine/batch_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace moe {
namespace {

// Scratch buffers: rows are all entries' tokens concatenated.
enum Buf : size_t {
  kX,       // [rows, hidden] residual stream
  kH,       // [rows, hidden] normed
  kOut,     // [rows, hidden] block output
  kRouter,  // [rows, experts]
  kTopIds,  // [rows, top_k] int32
  kTopW,    // [rows, top_k]
  kRows,    // [rows] int32
  kRowW,    // [rows]
  kIds,     // [rows] int32
  kGate,    // [rows]
  kLast,    // [entries, hidden]
  kLogits,  // [entries, vocab]
  kQ,       // [rows, heads*head_dim]
  kK,       // [rows, kv_heads*head_dim]
  kV,       // [rows, kv_heads*head_dim]
  kAttn,    // [rows, heads*head_dim]
  kPos,     // [rows] int32
  kNumBufs
};

}  // namespace

BatchStep::BatchStep(const MoeModel& model, ExpertProvider* experts)
    : model_(model), be_(model.backend()), experts_(experts) {}

BatchStep::~BatchStep() {
  for (void* p : bufs_) be_.Free(p);
}

absl::Status BatchStep::Reserve(int64_t rows, int64_t entries) {
  if (rows <= capacity_ && entries <= entry_capacity_) return absl::OkStatus();
  const ModelConfig& c = model_.config();
  const int64_t t = std::max(rows, capacity_);
  const int64_t b = std::max(entries, entry_capacity_);
  const int64_t q_width = c.num_attention_heads * c.head_dim;
  const int64_t kv_width = c.num_key_value_heads * c.head_dim;
  for (void* p : bufs_) be_.Free(p);
  bufs_.assign(kNumBufs, nullptr);
  const int64_t sizes[kNumBufs] = {t * c.hidden_size,
                                   t * c.hidden_size,
                                   t * c.hidden_size,
                                   t * c.num_experts,
                                   t * c.top_k,
                                   t * c.top_k,
                                   t,
                                   t,
                                   t,
                                   t,
                                   b * c.hidden_size,
                                   b * model_.lm_head().rows,
                                   t * q_width,
                                   t * kv_width,
                                   t * kv_width,
                                   t * q_width,
                                   t};
  for (size_t i = 0; i < kNumBufs; ++i) {
    ASSIGN_OR_RETURN(bufs_[i], be_.Alloc(4 * sizes[i]));  // f32 or int32
  }
  capacity_ = t;
  entry_capacity_ = b;
  return absl::OkStatus();
}

absl::Status BatchStep::Run(absl::Span<const Entry> entries) {
  if (entries.empty()) return absl::InvalidArgumentError("empty batch");
  const ModelConfig& c = model_.config();
  absl::flat_hash_set<const Session*> seen;
  offsets_.clear();
  int64_t rows = 0;
  bool prefill = false;
  for (const Entry& e : entries) {
    if (e.session == nullptr || !seen.insert(e.session).second) {
      return absl::InvalidArgumentError(
          "each entry of a batch needs its own session");
    }
    if (&e.session->model_ != &model_) {
      return absl::InvalidArgumentError("a session of another model");
    }
    RETURN_IF_ERROR(e.session->BeginStep(e.tokens));
    offsets_.push_back(rows);
    rows += static_cast<int64_t>(e.tokens.size());
    prefill = prefill || e.prefill;
  }
  rows_ = rows;
  RETURN_IF_ERROR(Reserve(rows, static_cast<int64_t>(entries.size())));
  std::vector<int32_t> ids;
  ids.reserve(rows);
  for (const Entry& e : entries)
    ids.insert(ids.end(), e.tokens.begin(), e.tokens.end());
  RETURN_IF_ERROR(be_.CopyToDevice(Buf(kIds), ids.data(), 4 * rows));
  std::vector<int32_t> positions;
  positions.reserve(rows);
  for (const Entry& e : entries) {
    for (size_t i = 0; i < e.tokens.size(); ++i) {
      positions.push_back(
          static_cast<int32_t>(e.session->pos_ + static_cast<int64_t>(i)));
    }
  }
  RETURN_IF_ERROR(be_.CopyToDevice(Buf(kPos), positions.data(), 4 * rows));
  // Batched: grouped attention with the plain rotate-half rope; the
  // others run per sequence inside the step (Session::Attention).
  const bool batched_attention = batched_projections_ && !c.is_mla() &&
                                 model_.head_rope().inv_freq == nullptr;
  const Weight& embed = model_.embed();
  RETURN_IF_ERROR(be_.Embedding(embed.data, embed.dtype,
                                reinterpret_cast<int32_t*>(Buf(kIds)), Buf(kX),
                                rows, embed.rows, c.hidden_size));
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int64_t n = rows * c.hidden_size;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& w = model_.layer(l);
    RETURN_IF_ERROR(
        be_.RmsNorm(Buf(kX), w.input_norm, Buf(kH), rows, c.hidden_size, eps));
    RETURN_IF_ERROR(batched_attention ? AttentionBatched(w, l, entries)
                                      : AttentionPerSequence(w, l, entries));
    RETURN_IF_ERROR(be_.Add(Buf(kX), Buf(kOut), Buf(kX), n));
    RETURN_IF_ERROR(
        be_.RmsNorm(Buf(kX), w.post_norm, Buf(kH), rows, c.hidden_size, eps));
    if (w.moe_index >= 0) {
      RETURN_IF_ERROR(MoeBlock(w, entries, prefill));
    } else {
      RETURN_IF_ERROR(moe::DenseMlp(be_, c, w, Mlp(), rows_));
    }
    RETURN_IF_ERROR(be_.Add(Buf(kX), Buf(kOut), Buf(kX), n));
    RETURN_IF_ERROR(Pregate(l, entries));
  }
  // The last row of each entry, normed, through lm_head as one product.
  const int64_t b = static_cast<int64_t>(entries.size());
  const size_t row_bytes = 4 * c.hidden_size;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t last =
        offsets_[i] + static_cast<int64_t>(entries[i].tokens.size()) - 1;
    RETURN_IF_ERROR(be_.CopyDeviceToDevice(Buf(kLast) + i * c.hidden_size,
                                           Buf(kX) + last * c.hidden_size,
                                           row_bytes));
  }
  RETURN_IF_ERROR(be_.RmsNorm(Buf(kLast), model_.final_norm(), Buf(kLast), b,
                              c.hidden_size, eps));
  const Weight& head = model_.lm_head();
  RETURN_IF_ERROR(be_.MatMul(Buf(kLast), head.data, head.dtype, nullptr,
                             Buf(kLogits), b, head.rows, c.hidden_size));
  host_logits_.resize(b * head.rows);
  RETURN_IF_ERROR(
      be_.CopyToHost(host_logits_.data(), Buf(kLogits), 4 * b * head.rows));
  for (const Entry& e : entries)
    e.session->pos_ += static_cast<int64_t>(e.tokens.size());
  return absl::OkStatus();
}

absl::Span<const float> BatchStep::logits(size_t i) const {
  const size_t vocab = static_cast<size_t>(model_.lm_head().rows);
  MOE_CHECK((i + 1) * vocab <= host_logits_.size());
  return absl::Span<const float>(host_logits_.data() + i * vocab, vocab);
}

absl::Status BatchStep::AttentionPerSequence(const LayerWeights& w, int layer,
                                             absl::Span<const Entry> entries) {
  const int64_t hidden = model_.config().hidden_size;
  for (size_t i = 0; i < entries.size(); ++i) {
    Session* s = entries[i].session;
    const int64_t t = static_cast<int64_t>(entries[i].tokens.size());
    const size_t bytes = 4 * t * hidden;
    RETURN_IF_ERROR(be_.CopyDeviceToDevice(
        s->attention_input(), Buf(kH) + offsets_[i] * hidden, bytes));
    RETURN_IF_ERROR(s->Attention(w, layer, t));
    RETURN_IF_ERROR(be_.CopyDeviceToDevice(Buf(kOut) + offsets_[i] * hidden,
                                           s->attention_output(), bytes));
  }
  return absl::OkStatus();
}

absl::Status BatchStep::AttentionBatched(const LayerWeights& w, int layer,
                                         absl::Span<const Entry> entries) {
  // Session::Attention's math over all rows; only the cache is per sequence.
  const ModelConfig& c = model_.config();
  const int64_t hd = c.head_dim, nh = c.num_attention_heads,
                nkv = c.num_key_value_heads, hidden = c.hidden_size;
  const int64_t t = rows_;
  const float eps = static_cast<float>(c.rms_norm_eps);
  RETURN_IF_ERROR(be_.MatMul(Buf(kH), w.q.data, w.q.dtype, w.q_bias, Buf(kQ), t,
                             nh * hd, hidden));
  RETURN_IF_ERROR(be_.MatMul(Buf(kH), w.k.data, w.k.dtype, w.k_bias, Buf(kK), t,
                             nkv * hd, hidden));
  RETURN_IF_ERROR(be_.MatMul(Buf(kH), w.v.data, w.v.dtype, w.v_bias, Buf(kV), t,
                             nkv * hd, hidden));
  if (c.qk_norm == QkNorm::kPerHead) {
    RETURN_IF_ERROR(be_.RmsNorm(Buf(kQ), w.q_norm, Buf(kQ), t * nh, hd, eps));
    RETURN_IF_ERROR(be_.RmsNorm(Buf(kK), w.k_norm, Buf(kK), t * nkv, hd, eps));
  } else if (c.qk_norm == QkNorm::kFull) {
    RETURN_IF_ERROR(be_.RmsNorm(Buf(kQ), w.q_norm, Buf(kQ), t, nh * hd, eps));
    RETURN_IF_ERROR(be_.RmsNorm(Buf(kK), w.k_norm, Buf(kK), t, nkv * hd, eps));
  }
  RETURN_IF_ERROR(be_.Rope(Buf(kQ), Buf(kK),
                           reinterpret_cast<int32_t*>(Buf(kPos)), t, nh, nkv,
                           hd, static_cast<float>(c.rope_theta)));
  for (size_t i = 0; i < entries.size(); ++i) {
    Session* s = entries[i].session;
    const Session::KvCaches kv =
        s->Kv(layer, static_cast<int64_t>(entries[i].tokens.size()));
    const AttentionShape& shape = kv.shape;
    float* kc = kv.k;
    float* vc = kv.v;
    const int64_t o = offsets_[i];
    RETURN_IF_ERROR(be_.KvCacheAppend(Buf(kK) + o * nkv * hd,
                                      Buf(kV) + o * nkv * hd, kc, vc, shape));
    RETURN_IF_ERROR(be_.Attention(Buf(kQ) + o * nh * hd, kc, vc,
                                  Buf(kAttn) + o * nh * hd, shape,
                                  1.0f / std::sqrt(static_cast<float>(hd))));
  }
  return be_.MatMul(Buf(kAttn), w.o.data, w.o.dtype, nullptr, Buf(kOut), t,
                    hidden, nh * hd);
}

MlpBuffers BatchStep::Mlp() {
  MlpBuffers b;
  b.x = Buf(kH);
  b.out = Buf(kOut);
  b.router = Buf(kRouter);
  b.top_ids = reinterpret_cast<int32_t*>(Buf(kTopIds));
  b.top_w = Buf(kTopW);
  b.rows = reinterpret_cast<int32_t*>(Buf(kRows));
  b.row_w = Buf(kRowW);
  b.gate = Buf(kGate);
  return b;
}

absl::Status BatchStep::MoeBlock(const LayerWeights& w,
                                 absl::Span<const Entry> entries,
                                 bool prefill) {
  const ModelConfig& c = model_.config();
  const int64_t k = c.top_k;
  const int64_t t = rows_;
  const MlpBuffers b = Mlp();
  RETURN_IF_ERROR(RouteRows(be_, model_, w, b.x, b, t, c.norm_topk_prob));
  host_ids_.resize(t * k);
  host_weights_.resize(t * k);
  RETURN_IF_ERROR(be_.CopyToHost(host_ids_.data(), b.top_ids, 4 * t * k));
  RETURN_IF_ERROR(be_.CopyToHost(host_weights_.data(), b.top_w, 4 * t * k));
  // Each sequence's own row of the layer's activation matrix (its experts in
  // ascending id with its tokens), so the cache can keep per-request state.
  std::vector<MemberDemands> members(entries.size());
  std::vector<int64_t> member_tokens(entries.size());
  std::vector<int32_t> count(c.num_experts);
  for (size_t i = 0; i < entries.size(); ++i) {
    const int64_t rows = static_cast<int64_t>(entries[i].tokens.size());
    const absl::Span<const int32_t> ids(host_ids_.data() + offsets_[i] * k,
                                        rows * k);
    const absl::Span<const float> wts(host_weights_.data() + offsets_[i] * k,
                                      rows * k);
    const RoutingObserver& observer = entries[i].session->observer_;
    if (observer) observer(w.moe_index, rows, ids, wts);
    std::fill(count.begin(), count.end(), 0);
    for (const int32_t e : ids) ++count[e];
    MemberDemands& m = members[i];
    m.request = entries[i].request;
    m.prefill = entries[i].prefill;
    for (int32_t e = 0; e < c.num_experts; ++e) {
      if (count[e] > 0) m.demands.push_back({e, count[e]});
    }
    member_tokens[i] = rows * k;
  }
  // Rows by expert, experts in ascending id and each expert's rows in
  // ascending order: every row gets its experts summed in the order a lone
  // session sums them, so the bits do not depend on the batch.
  const ExpertRows er = GroupByExpert(host_ids_, host_weights_, t, k, c.num_experts);
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(
      AcquiredExperts lease,
      experts_->AcquireBatch(w.moe_index, er.demands, members, prefill));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  const std::vector<AcquireUsage> shares = SplitUsage(lease.usage, member_tokens);
  for (size_t i = 0; i < entries.size(); ++i) {
    SessionStats& st = entries[i].session->stats_;
    st.expert_hits += shares[i].hits;
    st.expert_misses += shares[i].misses;
    st.expert_stall_seconds += shares[i].stall_seconds();
    st.expert_wait_seconds += waited * static_cast<double>(member_tokens[i]) /
                              static_cast<double>(t * k);
  }
  const absl::Status status = RunRoutedExperts(be_, c, er, lease, b, t);
  experts_->Release(lease);
  RETURN_IF_ERROR(status);
  if (c.has_shared_expert()) RETURN_IF_ERROR(SharedExperts(be_, c, w, b, t));
  return absl::OkStatus();
}

absl::Status BatchStep::Pregate(int layer, absl::Span<const Entry> entries) {
  const ModelConfig& c = model_.config();
  for (size_t i = 0; i < entries.size(); ++i) {
    Session* s = entries[i].session;
    const int target = layer + s->pregate_distance_;
    if (!s->pregate_ || entries[i].prefill || target >= c.num_hidden_layers ||
        model_.layer(target).moe_index < 0) {
      continue;
    }
    // Session::PregateHints reads its last row of the residual stream.
    const int64_t t = static_cast<int64_t>(entries[i].tokens.size());
    const int64_t last = offsets_[i] + t - 1;
    RETURN_IF_ERROR(be_.CopyDeviceToDevice(
        s->residual() + (t - 1) * c.hidden_size, Buf(kX) + last * c.hidden_size,
        4 * c.hidden_size));
    RETURN_IF_ERROR(s->PregateHints(target, t, entries[i].request));
  }
  return absl::OkStatus();
}

}  // namespace moe
