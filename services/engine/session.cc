#include "services/engine/session.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/engine/batch_step.h"

namespace moe {

Session::Session(const MoeModel& model, ExpertProvider* experts,
                 int64_t max_seq)
    : model_(model),
      be_(model.backend()),
      experts_(experts),
      max_seq_(std::min(max_seq, model.max_context())) {}

int64_t Session::KvCacheBytes(const MoeModel& model, int64_t max_seq) {
  const ModelConfig& c = model.config();
  const KvWidths w = KvWidthsFor(c);
  return c.num_hidden_layers * static_cast<int64_t>(sizeof(float)) *
         std::min(max_seq, model.max_context()) * (w.first + w.second);
}

Session::~Session() {
  for (void* p : kv_) be_.Free(p);
}

namespace {

// Positions held to have run `positions` of at most `max_seq`: whole
// blocks of `block` (all of max_seq without blocks).
int64_t BlockPositions(int64_t positions, int64_t block, int64_t max_seq) {
  if (block <= 0) return max_seq;
  const int64_t blocks = (std::max<int64_t>(positions, 1) + block - 1) / block;
  return std::min(max_seq, blocks * block);
}

}  // namespace

int64_t Session::KvBlockBytes(const MoeModel& model, int64_t positions, int64_t block_tokens,
                              int64_t max_seq) {
  return KvCacheBytes(model, BlockPositions(positions, block_tokens, max_seq));
}

int64_t Session::KvPositions(int64_t tokens) const {
  return BlockPositions(tokens, kv_block_, max_seq_);
}

int64_t Session::KvBytesAfter(int64_t tokens) const {
  return KvBlockBytes(model_, pos_ + tokens, kv_block_, max_seq_);
}

absl::Status Session::set_kv_block_tokens(int64_t tokens) {
  if (tokens < 0) return absl::InvalidArgumentError("KV block tokens must be >= 0");
  if (!kv_.empty()) {
    return absl::FailedPreconditionError("the KV layout is fixed at the first Forward");
  }
  kv_block_ = tokens;
  return absl::OkStatus();
}

absl::Status Session::ReserveKv(int64_t tokens) {
  const ModelConfig& c = model_.config();
  const KvWidths widths = KvWidthsFor(c);
  const int64_t positions = KvPositions(pos_ + tokens);
  if (positions <= kv_tokens_) return absl::OkStatus();
  std::vector<void*> grown;
  int64_t bytes_total = 0;
  for (int64_t i = 0; i < 2 * c.num_hidden_layers; ++i) {
    const int64_t width = i % 2 == 0 ? widths.first : widths.second;
    const size_t bytes = sizeof(float) * positions * width;
    absl::StatusOr<void*> p = be_.Alloc(bytes);
    absl::Status s = p.status();
    // The positions already run move over; the rest is written before it
    // is read (the cache append, then attention up to the new tokens).
    if (s.ok() && !kv_.empty() && pos_ > 0) {
      s = be_.CopyDeviceToDevice(*p, kv_[i], sizeof(float) * pos_ * width);
    }
    if (!s.ok()) {
      if (p.ok()) be_.Free(*p);
      for (void* q : grown) be_.Free(q);
      return s;
    }
    grown.push_back(*p);
    bytes_total += static_cast<int64_t>(bytes);
  }
  for (void* p : kv_) be_.Free(p);
  kv_ = std::move(grown);
  kv_tokens_ = positions;
  kv_allocated_ = bytes_total;
  return absl::OkStatus();
}

absl::StatusOr<KvSnapshot> Session::SaveKv(int64_t positions) const {
  if (positions <= 0 || positions > pos_) {
    return absl::InvalidArgumentError(absl::StrCat("cannot save ", positions,
                                                   " KV positions of a session at ", pos_));
  }
  const ModelConfig& c = model_.config();
  const KvWidths widths = KvWidthsFor(c);
  KvSnapshot snap;
  snap.positions = positions;
  snap.caches.resize(kv_.size());
  for (size_t i = 0; i < kv_.size(); ++i) {
    const int64_t width = i % 2 == 0 ? widths.first : widths.second;
    snap.caches[i].resize(static_cast<size_t>(positions * width));
    RETURN_IF_ERROR(be_.CopyToHost(snap.caches[i].data(), kv_[i],
                                   sizeof(float) * static_cast<size_t>(positions * width)));
  }
  return snap;
}

absl::Status Session::LoadKv(const KvSnapshot& snapshot, int64_t positions) {
  if (pos_ != 0 || !kv_.empty()) {
    return absl::FailedPreconditionError("KV positions load only into a fresh session");
  }
  if (positions <= 0 || positions > snapshot.positions || positions >= max_seq_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot load ", positions, " KV positions from a snapshot of ", snapshot.positions,
        " into a session of ", max_seq_));
  }
  const ModelConfig& c = model_.config();
  const KvWidths widths = KvWidthsFor(c);
  if (snapshot.caches.size() != 2 * static_cast<size_t>(c.num_hidden_layers)) {
    return absl::InvalidArgumentError("KV snapshot of another model");
  }
  for (size_t i = 0; i < snapshot.caches.size(); ++i) {
    const int64_t width = i % 2 == 0 ? widths.first : widths.second;
    if (static_cast<int64_t>(snapshot.caches[i].size()) != snapshot.positions * width) {
      return absl::InvalidArgumentError("KV snapshot of another model");
    }
  }
  RETURN_IF_ERROR(ReserveKv(positions));
  for (size_t i = 0; i < kv_.size(); ++i) {
    const int64_t width = i % 2 == 0 ? widths.first : widths.second;
    RETURN_IF_ERROR(be_.CopyToDevice(kv_[i], snapshot.caches[i].data(),
                                     sizeof(float) * static_cast<size_t>(positions * width)));
  }
  pos_ = positions;
  return absl::OkStatus();
}

absl::Status Session::CheckTokens(absl::Span<const int32_t> tokens) const {
  const ModelConfig& c = model_.config();
  const int64_t t = static_cast<int64_t>(tokens.size());
  if (t == 0) return absl::InvalidArgumentError("no tokens to process");
  for (int32_t id : tokens) {
    if (id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", id, " outside the vocabulary [0, ", c.vocab_size, ")"));
    }
  }
  if (pos_ + t > max_seq_) {
    return absl::OutOfRangeError(absl::StrCat(
        "sequence of ", pos_ + t, " tokens exceeds the context of ",
        max_seq_));
  }
  return absl::OkStatus();
}

LayerKv Session::layer_kv(int layer) const {
  LayerKv kv;
  kv.first = static_cast<float*>(kv_[2 * layer]);
  kv.second = static_cast<float*>(kv_[2 * layer + 1]);
  kv.capacity = kv_tokens_;
  return kv;
}

void Session::AddExpertUsage(const AcquireUsage& usage, double wait_seconds) {
  stats_.expert_hits += usage.hits;
  stats_.expert_misses += usage.misses;
  stats_.expert_stall_seconds += usage.stall_seconds();
  stats_.expert_wait_seconds += wait_seconds;
}

absl::StatusOr<absl::Span<const float>> Session::Forward(
    absl::Span<const int32_t> tokens, bool prefill) {
  if (step_ == nullptr) step_ = std::make_unique<BatchStep>(model_, experts_);
  const BatchStep::Entry entry{this, tokens, prefill, /*request=*/0};
  RETURN_IF_ERROR(step_->Run(absl::MakeConstSpan(&entry, 1)));
  return step_->logits(0);
}

absl::Status Session::set_pregate_distance(int distance) {
  if (distance < 1 || distance > kMaxPregateDistance) {
    return absl::InvalidArgumentError(
        absl::StrCat("pre-gating distance ", distance, " outside [1, ",
                     kMaxPregateDistance, "]"));
  }
  pregate_distance_ = distance;
  return absl::OkStatus();
}

}  // namespace moe
