#include "services/engine/batch_step.h"

#include <algorithm>
#include <chrono>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace moe {
namespace {

// Scratch buffers: rows are all entries' tokens concatenated. The
// attention block keeps its own (attention.h).
enum Buf : size_t {
  kX,       // [rows, hidden] residual stream
  kH,       // [rows, hidden] normed
  kOut,     // [rows, hidden] block output
  kRouter,  // [rows, experts]
  kTopIds,  // [rows, top_k] int32
  kTopW,    // [rows, top_k]
  kRows,    // [rows, top_k] int32: every expert's rows, one after another
  kRowW,    // [rows, top_k]
  kIds,     // [rows] int32
  kGate,    // [rows]
  kLast,    // [entries, hidden]
  kLogits,  // [entries, vocab]
  kPos,     // [rows] int32
  kNumBufs
};

}  // namespace

BatchStep::BatchStep(const MoeModel& model, ExpertProvider* experts)
    : model_(model),
      be_(model.backend()),
      experts_(experts),
      attention_(AttentionBlock::Create(model)) {}

BatchStep::~BatchStep() {
  for (void* p : bufs_) be_.Free(p);
}

absl::Status BatchStep::Reserve(int64_t rows, int64_t entries) {
  if (rows <= capacity_ && entries <= entry_capacity_) return absl::OkStatus();
  const ModelConfig& c = model_.config();
  const int64_t t = std::max(rows, capacity_);
  const int64_t b = std::max(entries, entry_capacity_);
  for (void* p : bufs_) be_.Free(p);
  bufs_.assign(kNumBufs, nullptr);
  capacity_ = 0;
  entry_capacity_ = 0;
  const int64_t sizes[kNumBufs] = {t * c.hidden_size,
                                   t * c.hidden_size,
                                   t * c.hidden_size,
                                   t * c.num_experts,
                                   t * c.top_k,
                                   t * c.top_k,
                                   t * c.top_k,
                                   t * c.top_k,
                                   t,
                                   t,
                                   b * c.hidden_size,
                                   b * model_.lm_head().rows,
                                   t};
  for (size_t i = 0; i < kNumBufs; ++i) {
    ASSIGN_OR_RETURN(bufs_[i], be_.Alloc(4 * sizes[i]));  // f32 or int32
  }
  capacity_ = t;
  entry_capacity_ = b;
  return absl::OkStatus();
}

absl::Status BatchStep::Begin(absl::Span<const Entry> entries) {
  if (entries.empty()) return absl::InvalidArgumentError("empty batch");
  absl::flat_hash_set<const Session*> seen;
  for (const Entry& e : entries) {
    if (e.session == nullptr || !seen.insert(e.session).second) {
      return absl::InvalidArgumentError(
          "each entry of a batch needs its own session");
    }
    if (&e.session->model() != &model_) {
      return absl::InvalidArgumentError("a session of another model");
    }
    RETURN_IF_ERROR(e.session->CheckTokens(e.tokens));
  }
  offsets_.clear();
  seqs_.clear();
  std::vector<int32_t> ids;
  std::vector<int32_t> positions;
  for (const Entry& e : entries) {
    const int64_t t = static_cast<int64_t>(e.tokens.size());
    RETURN_IF_ERROR(e.session->ReserveKv(t));
    const int64_t start = e.session->position();
    SequenceRows s;
    s.offset = static_cast<int64_t>(ids.size());
    s.tokens = t;
    s.start_pos = start;
    offsets_.push_back(s.offset);
    seqs_.push_back(s);
    ids.insert(ids.end(), e.tokens.begin(), e.tokens.end());
    for (int64_t i = 0; i < t; ++i) positions.push_back(static_cast<int32_t>(start + i));
  }
  rows_ = static_cast<int64_t>(ids.size());
  RETURN_IF_ERROR(Reserve(rows_, static_cast<int64_t>(entries.size())));
  RETURN_IF_ERROR(be_.CopyToDevice(Buf(kIds), ids.data(), 4 * rows_));
  return be_.CopyToDevice(Buf(kPos), positions.data(), 4 * rows_);
}

absl::Status BatchStep::Run(absl::Span<const Entry> entries) {
  RETURN_IF_ERROR(Begin(entries));
  const ModelConfig& c = model_.config();
  bool prefill = false;
  for (const Entry& e : entries) prefill = prefill || e.prefill;
  const Weight& embed = model_.embed();
  RETURN_IF_ERROR(be_.Embedding(embed.data, embed.dtype,
                                reinterpret_cast<int32_t*>(Buf(kIds)), Buf(kX),
                                rows_, embed.rows, c.hidden_size));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    RETURN_IF_ERROR(Layer(l, entries, prefill));
  }
  RETURN_IF_ERROR(Head(entries));
  for (const Entry& e : entries) {
    e.session->Advance(static_cast<int64_t>(e.tokens.size()));
  }
  return absl::OkStatus();
}

absl::Status BatchStep::Layer(int l, absl::Span<const Entry> entries,
                              bool prefill) {
  const ModelConfig& c = model_.config();
  const LayerWeights& w = model_.layer(l);
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int64_t n = rows_ * c.hidden_size;
  RETURN_IF_ERROR(
      be_.RmsNorm(Buf(kX), w.input_norm, Buf(kH), rows_, c.hidden_size, eps));
  for (size_t i = 0; i < entries.size(); ++i) {
    seqs_[i].kv = entries[i].session->layer_kv(l);
  }
  RETURN_IF_ERROR(attention_->Run(w, Buf(kH),
                                  reinterpret_cast<int32_t*>(Buf(kPos)), seqs_,
                                  rows_, Buf(kOut)));
  RETURN_IF_ERROR(be_.Add(Buf(kX), Buf(kOut), Buf(kX), n));
  RETURN_IF_ERROR(
      be_.RmsNorm(Buf(kX), w.post_norm, Buf(kH), rows_, c.hidden_size, eps));
  if (w.moe_index >= 0) {
    RETURN_IF_ERROR(MoeBlock(w, entries, prefill));
  } else {
    RETURN_IF_ERROR(moe::DenseMlp(be_, c, w, Mlp(), rows_));
  }
  RETURN_IF_ERROR(be_.Add(Buf(kX), Buf(kOut), Buf(kX), n));
  return Pregate(l, entries);
}

absl::Status BatchStep::Head(absl::Span<const Entry> entries) {
  const ModelConfig& c = model_.config();
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
                              c.hidden_size,
                              static_cast<float>(c.rms_norm_eps)));
  const Weight& head = model_.lm_head();
  RETURN_IF_ERROR(be_.MatMul(Buf(kLast), head.data, head.dtype, nullptr,
                             Buf(kLogits), b, head.rows, c.hidden_size));
  host_logits_.resize(b * head.rows);
  return be_.CopyToHost(host_logits_.data(), Buf(kLogits), 4 * b * head.rows);
}

absl::Span<const float> BatchStep::logits(size_t i) const {
  const size_t vocab = static_cast<size_t>(model_.lm_head().rows);
  MOE_CHECK((i + 1) * vocab <= host_logits_.size());
  return absl::Span<const float>(host_logits_.data() + i * vocab, vocab);
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
    const RoutingObserver& observer = entries[i].session->routing_observer();
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
  // ascending order: every row gets its experts summed in the same order
  // whatever the batch, so the bits do not depend on it.
  const ExpertRows er = GroupByExpert(host_ids_, host_weights_, t, k, c.num_experts);
  // The provider may answer the layer in parts (ExpertProvider::AcquireRest),
  // each a prefix of what is left, computed and released before the next.
  const absl::Span<const ExpertDemand> demands = er.demands;
  for (size_t first = 0; first < demands.size();) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<AcquiredExperts> acquired =
        first > 0 ? experts_->AcquireRest(w.moe_index, demands.subspan(first), prefill)
        : Lone(entries) ? experts_->Acquire(w.moe_index, demands, prefill)
                        : experts_->AcquireBatch(w.moe_index, demands, members, prefill);
    RETURN_IF_ERROR(acquired.status());
    AcquiredExperts& lease = *acquired;
    const size_t answered = lease.views.size();
    if (answered == 0 || answered > demands.size() - first) {
      experts_->Release(lease);
      return absl::InternalError(absl::StrCat("the expert provider answered ", answered, " of ",
                                              demands.size() - first, " experts"));
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (answered < demands.size()) PartTokens(members, demands.subspan(first, answered),
                                              &member_tokens);
    Attribute(entries, lease.usage, waited, member_tokens);
    const absl::Status status = RunRoutedExperts(be_, c, er, first, lease, b, t);
    experts_->Release(lease);
    RETURN_IF_ERROR(status);
    first += answered;
  }
  if (c.has_shared_expert()) RETURN_IF_ERROR(SharedExperts(be_, c, w, b, t));
  return absl::OkStatus();
}

void BatchStep::PartTokens(absl::Span<const MemberDemands> members,
                           absl::Span<const ExpertDemand> part, std::vector<int64_t>* tokens) {
  // The part is a run of the union's ascending ids.
  const int32_t lo = part.front().expert, hi = part.back().expert;
  for (size_t i = 0; i < members.size(); ++i) {
    int64_t n = 0;
    for (const ExpertDemand& d : members[i].demands) {
      if (d.expert >= lo && d.expert <= hi) n += d.tokens;
    }
    (*tokens)[i] = n;
  }
}

void BatchStep::Attribute(absl::Span<const Entry> entries,
                          const AcquireUsage& usage, double waited,
                          const std::vector<int64_t>& member_tokens) {
  if (entries.size() == 1) {
    entries[0].session->AddExpertUsage(usage, waited);
    return;
  }
  const std::vector<AcquireUsage> shares = SplitUsage(usage, member_tokens);
  double total = 0;
  for (const int64_t n : member_tokens) total += static_cast<double>(n);
  for (size_t i = 0; i < entries.size(); ++i) {
    entries[i].session->AddExpertUsage(
        shares[i], waited * static_cast<double>(member_tokens[i]) / total);
  }
}

absl::Status BatchStep::Pregate(int layer, absl::Span<const Entry> entries) {
  const ModelConfig& c = model_.config();
  for (size_t i = 0; i < entries.size(); ++i) {
    const Session& s = *entries[i].session;
    // Only layer l+D: also hinting the nearer layers (their hints come too
    // late to help) measured no better (docs/benchmarks.md, "Distance 2").
    const int target = layer + s.pregate_distance();
    if (!s.pregate_hints() || entries[i].prefill ||
        target >= c.num_hidden_layers || model_.layer(target).moe_index < 0) {
      continue;
    }
    const int64_t last =
        offsets_[i] + static_cast<int64_t>(entries[i].tokens.size()) - 1;
    RETURN_IF_ERROR(PregateHints(target, entries[i], last));
  }
  return absl::OkStatus();
}

absl::Status BatchStep::PregateHints(int target_layer, const Entry& e,
                                     int64_t last) {
  const ModelConfig& c = model_.config();
  const LayerWeights& next = model_.layer(target_layer);
  const int64_t k = c.top_k;
  // The target layer's router applied to this layer's output, normed as the
  // target layer would norm its MLP input: cheap (one [experts, hidden]
  // matvec) and far more accurate than history alone. kLast's first row is
  // free until the head.
  RETURN_IF_ERROR(be_.RmsNorm(Buf(kX) + last * c.hidden_size, next.post_norm,
                              Buf(kLast), 1, c.hidden_size,
                              static_cast<float>(c.rms_norm_eps)));
  RETURN_IF_ERROR(RouteRows(be_, model_, next, Buf(kLast), Mlp(), 1,
                            /*renormalize=*/false));
  std::vector<int32_t> hid(k);
  std::vector<float> hw(k);
  RETURN_IF_ERROR(be_.CopyToHost(hid.data(), Buf(kTopIds), 4 * k));
  RETURN_IF_ERROR(be_.CopyToHost(hw.data(), Buf(kTopW), 4 * k));
  std::vector<ExpertHint> hints;
  for (int64_t i = 0; i < k; ++i) {
    hints.push_back({next.moe_index, hid[i], hw[i], HintSource::kHint});
  }
  if (e.request == 0) {
    experts_->Hint(hints);
  } else {
    experts_->HintFor(e.request, hints);
  }
  e.session->routing_observer().Hints(hints);
  return absl::OkStatus();
}

}  // namespace moe
