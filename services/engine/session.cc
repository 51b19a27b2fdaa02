#include "services/engine/session.h"

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "services/engine/mlp_blocks.h"
#include "services/engine/mla_attention.h"

namespace moe {
namespace {

// Scratch buffers, each sized for `capacity_` tokens.
enum Buf : size_t {
  kX,          // [T, hidden] residual stream
  kH,          // [T, hidden] normed
  kQ,          // [T, heads*head_dim]
  kK,          // [T, kv_heads*head_dim]
  kV,          // [T, kv_heads*head_dim]
  kAttn,       // [T, heads*head_dim]
  kOut,        // [T, hidden] block output
  kRouter,     // [T, experts]
  kTopIds,     // [T, top_k] int32
  kTopW,       // [T, top_k]
  kRows,       // [T] int32
  kRowW,       // [T]
  kPositions,  // [T] int32
  kIds,        // [T] int32
  kLogits,     // [vocab]
  kGate,       // [T]
  kLast,       // [hidden]
  kNumBufs
};

}  // namespace

Session::Session(const MoeModel& model, ExpertProvider* experts,
                 int64_t max_seq)
    : model_(model),
      be_(model.backend()),
      experts_(experts),
      max_seq_(std::min(max_seq, model.max_context())) {}

int64_t Session::KvCacheBytes(const MoeModel& model, int64_t max_seq) {
  const ModelConfig& c = model.config();
  if (c.is_mla()) {
    return c.num_hidden_layers * static_cast<int64_t>(sizeof(float)) *
           std::min(max_seq, model.max_context()) *
           (c.mla.kv_lora_rank + c.mla.qk_rope_head_dim);
  }
  return 2 * c.num_hidden_layers * static_cast<int64_t>(sizeof(float)) *
         std::min(max_seq, model.max_context()) * c.num_key_value_heads * c.head_dim;
}

Session::~Session() {
  for (void* p : kv_) be_.Free(p);
  for (void* p : bufs_) be_.Free(p);
  for (void* p : mla_bufs_) be_.Free(p);
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

absl::Status Session::Reserve(int64_t tokens) {
  const ModelConfig& c = model_.config();
  // Per cache buffer, its f32 values per position: MLA keeps per layer
  // c_kv [positions, kv_lora_rank] and k_pe [positions, qk_rope]; the others
  // k and v [positions, kv_heads * head_dim].
  const int64_t positions = KvPositions(pos_ + tokens);
  if (positions > kv_tokens_) {
    std::vector<void*> grown;
    int64_t bytes_total = 0;
    for (int64_t i = 0; i < 2 * c.num_hidden_layers; ++i) {
      const int64_t width = c.is_mla() ? (i % 2 == 0 ? c.mla.kv_lora_rank : c.mla.qk_rope_head_dim)
                                       : c.num_key_value_heads * c.head_dim;
      const size_t bytes = sizeof(float) * positions * width;
      absl::StatusOr<void*> p = be_.Alloc(bytes);
      absl::Status s = p.status();
      // The positions already run move over; the rest is written before it
      // is read (KvCacheAppend, then attention up to the new tokens).
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
  }
  if (tokens <= capacity_) return absl::OkStatus();
  for (void* p : bufs_) be_.Free(p);
  bufs_.assign(kNumBufs, nullptr);
  const int64_t t = tokens;
  const int64_t q_width = c.num_attention_heads * c.head_dim;
  const int64_t kv_width = c.num_key_value_heads * c.head_dim;
  const int64_t sizes[kNumBufs] = {
      t * c.hidden_size, t * c.hidden_size, t * q_width, t * kv_width,
      t * kv_width,      t * q_width,       t * c.hidden_size,
      t * c.num_experts, t * c.top_k,       t * c.top_k,
      t,                 t,                 t,
      t,                 c.vocab_size,      t,
      c.hidden_size};
  for (size_t i = 0; i < kNumBufs; ++i) {
    ASSIGN_OR_RETURN(bufs_[i], be_.Alloc(4 * sizes[i]));  // f32 or int32
  }
  capacity_ = tokens;
  return absl::OkStatus();
}

absl::Status Session::BeginStep(absl::Span<const int32_t> tokens) {
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
  RETURN_IF_ERROR(Reserve(t));
  std::vector<int32_t> positions(t);
  for (int64_t i = 0; i < t; ++i) positions[i] = static_cast<int32_t>(pos_ + i);
  RETURN_IF_ERROR(be_.CopyToDevice(Buf(kIds), tokens.data(), 4 * t));
  return be_.CopyToDevice(Buf(kPositions), positions.data(), 4 * t);
}

float* Session::attention_input() { return Buf(kH); }
float* Session::attention_output() { return Buf(kOut); }
float* Session::residual() { return Buf(kX); }

absl::StatusOr<absl::Span<const float>> Session::Forward(
    absl::Span<const int32_t> tokens, bool prefill) {
  const ModelConfig& c = model_.config();
  const int64_t t = static_cast<int64_t>(tokens.size());
  RETURN_IF_ERROR(BeginStep(tokens));
  const Weight& embed = model_.embed();
  RETURN_IF_ERROR(be_.Embedding(embed.data, embed.dtype,
                                reinterpret_cast<int32_t*>(Buf(kIds)), Buf(kX),
                                t, embed.rows, c.hidden_size));
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int64_t n = t * c.hidden_size;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& w = model_.layer(l);
    RETURN_IF_ERROR(be_.RmsNorm(Buf(kX), w.input_norm, Buf(kH), t,
                                c.hidden_size, eps));
    RETURN_IF_ERROR(Attention(w, l, t));
    RETURN_IF_ERROR(be_.Add(Buf(kX), Buf(kOut), Buf(kX), n));
    RETURN_IF_ERROR(be_.RmsNorm(Buf(kX), w.post_norm, Buf(kH), t,
                                c.hidden_size, eps));
    if (w.moe_index >= 0) {
      RETURN_IF_ERROR(MoeBlock(w, t, prefill));
    } else {
      RETURN_IF_ERROR(DenseMlp(w, t));
    }
    RETURN_IF_ERROR(be_.Add(Buf(kX), Buf(kOut), Buf(kX), n));
    // Only layer l+D: also hinting the nearer layers (their hints come too
    // late to help) measured no better (docs/benchmarks.md, "Distance 2").
    const int target = l + pregate_distance_;
    if (pregate_ && !prefill && target < c.num_hidden_layers &&
        model_.layer(target).moe_index >= 0) {
      RETURN_IF_ERROR(PregateHints(target, t));
    }
  }
  RETURN_IF_ERROR(be_.RmsNorm(Buf(kX) + (t - 1) * c.hidden_size,
                              model_.final_norm(), Buf(kLast), 1,
                              c.hidden_size, eps));
  const Weight& head = model_.lm_head();
  RETURN_IF_ERROR(be_.MatMul(Buf(kLast), head.data, head.dtype, nullptr,
                             Buf(kLogits), 1, head.rows, c.hidden_size));
  host_logits_.resize(head.rows);
  RETURN_IF_ERROR(be_.CopyToHost(host_logits_.data(), Buf(kLogits),
                                 4 * head.rows));
  pos_ += t;
  return absl::Span<const float>(host_logits_);
}

absl::Status Session::Attention(const LayerWeights& w, int layer, int64_t t) {
  const ModelConfig& c = model_.config();
  if (c.is_mla()) {
    return MlaAttention(w, layer, t, Buf(kH), Buf(kQ),
                        reinterpret_cast<int32_t*>(Buf(kPositions)),
                        Buf(kOut));
  }
  return GroupedAttention(w, layer, t);
}

// Grouped-query attention, every variant the config asks for: q/k/v biases,
// q/k RMSNorm (per head or over the whole projection), rope (rotate-half, or
// from the model's table on head-permuted rows: YaRN, partial rotary),
// learned sinks and a sliding window, an o bias.
absl::Status Session::GroupedAttention(const LayerWeights& w, int layer,
                                       int64_t t) {
  const ModelConfig& c = model_.config();
  const int64_t hd = c.head_dim, nh = c.num_attention_heads,
                nkv = c.num_key_value_heads, hidden = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int32_t* positions = reinterpret_cast<int32_t*>(Buf(kPositions));
  RETURN_IF_ERROR(be_.MatMul(Buf(kH), w.q.data, w.q.dtype, w.q_bias, Buf(kQ),
                             t, nh * hd, hidden));
  RETURN_IF_ERROR(be_.MatMul(Buf(kH), w.k.data, w.k.dtype, w.k_bias, Buf(kK),
                             t, nkv * hd, hidden));
  RETURN_IF_ERROR(be_.MatMul(Buf(kH), w.v.data, w.v.dtype, w.v_bias, Buf(kV),
                             t, nkv * hd, hidden));
  if (c.qk_norm == QkNorm::kPerHead) {
    RETURN_IF_ERROR(be_.RmsNorm(Buf(kQ), w.q_norm, Buf(kQ), t * nh, hd, eps));
    RETURN_IF_ERROR(be_.RmsNorm(Buf(kK), w.k_norm, Buf(kK), t * nkv, hd, eps));
  } else if (c.qk_norm == QkNorm::kFull) {
    RETURN_IF_ERROR(be_.RmsNorm(Buf(kQ), w.q_norm, Buf(kQ), t, nh * hd, eps));
    RETURN_IF_ERROR(be_.RmsNorm(Buf(kK), w.k_norm, Buf(kK), t, nkv * hd, eps));
  }
  const MoeModel::RopeFrequencies& rope = model_.head_rope();
  float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  if (rope.inv_freq != nullptr) {
    // q/k rows are head-permuted at load (moe_model.h): interleaved rope
    // here is the published rotate-half rope over the first rotary_dim.
    const int64_t rd = c.rotary_dim;
    RETURN_IF_ERROR(be_.RopeInterleaved(Buf(kQ), positions, rope.inv_freq, t,
                                        nh, hd, 0, rd, rope.mscale));
    RETURN_IF_ERROR(be_.RopeInterleaved(Buf(kK), positions, rope.inv_freq, t,
                                        nkv, hd, 0, rd, rope.mscale));
    scale = rope.softmax_scale;
  } else {
    RETURN_IF_ERROR(be_.Rope(Buf(kQ), Buf(kK), positions, t, nh, nkv, hd,
                             static_cast<float>(c.rope_theta)));
  }
  const KvCaches kv = Kv(layer, t);
  RETURN_IF_ERROR(be_.KvCacheAppend(Buf(kK), Buf(kV), kv.k, kv.v, kv.shape));
  if (w.sinks != nullptr || w.sliding) {
    RETURN_IF_ERROR(be_.SinkAttention(Buf(kQ), kv.k, kv.v, w.sinks,
                                      Buf(kAttn), kv.shape, scale,
                                      w.sliding ? c.sliding_window : 0));
  } else {
    RETURN_IF_ERROR(
        be_.Attention(Buf(kQ), kv.k, kv.v, Buf(kAttn), kv.shape, scale));
  }
  return be_.MatMul(Buf(kAttn), w.o.data, w.o.dtype, w.o_bias, Buf(kOut), t,
                    hidden, nh * hd);
}

Session::KvCaches Session::Kv(int layer, int64_t t) const {
  const ModelConfig& c = model_.config();
  KvCaches kv;
  kv.shape.tokens = t;
  kv.shape.heads = c.num_attention_heads;
  kv.shape.kv_heads = c.num_key_value_heads;
  kv.shape.head_dim = c.head_dim;
  kv.shape.max_seq = kv_tokens_;
  kv.shape.start_pos = pos_;
  kv.k = static_cast<float*>(kv_[2 * layer]);
  kv.v = static_cast<float*>(kv_[2 * layer + 1]);
  return kv;
}

MlpBuffers Session::Mlp() {
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

absl::Status Session::MoeBlock(const LayerWeights& w, int64_t t,
                               bool prefill) {
  const ModelConfig& c = model_.config();
  const int64_t k = c.top_k;
  const MlpBuffers b = Mlp();
  RETURN_IF_ERROR(RouteRows(be_, model_, w, b.x, b, t, c.norm_topk_prob));
  host_ids_.resize(t * k);
  host_weights_.resize(t * k);
  RETURN_IF_ERROR(be_.CopyToHost(host_ids_.data(), b.top_ids, 4 * t * k));
  RETURN_IF_ERROR(be_.CopyToHost(host_weights_.data(), b.top_w, 4 * t * k));
  if (observer_) observer_(w.moe_index, t, host_ids_, host_weights_);

  // Group tokens by expert; ascending expert order keeps the sum's order
  // (and so the bits) independent of what the cache holds.
  const ExpertRows er = GroupByExpert(host_ids_, host_weights_, t, k, c.num_experts);
  auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(AcquiredExperts lease,
                   experts_->Acquire(w.moe_index, er.demands, prefill));
  stats_.expert_wait_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  stats_.expert_hits += lease.usage.hits;
  stats_.expert_misses += lease.usage.misses;
  stats_.expert_stall_seconds += lease.usage.stall_seconds();
  const absl::Status status = RunRoutedExperts(be_, c, er, lease, b, t);
  experts_->Release(lease);
  RETURN_IF_ERROR(status);
  if (c.has_shared_expert()) RETURN_IF_ERROR(SharedExperts(be_, c, w, b, t));
  return absl::OkStatus();
}

absl::Status Session::DenseMlp(const LayerWeights& w, int64_t t) {
  return moe::DenseMlp(be_, model_.config(), w, Mlp(), t);
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

absl::Status Session::PregateHints(int target_layer, int64_t t, uint64_t request) {
  const ModelConfig& c = model_.config();
  const LayerWeights& next = model_.layer(target_layer);
  const int64_t k = c.top_k;
  // The target layer's router applied to this layer's output, normed as the
  // target layer would norm its MLP input: cheap (one [experts, hidden]
  // matvec) and far more accurate than history alone.
  RETURN_IF_ERROR(be_.RmsNorm(Buf(kX) + (t - 1) * c.hidden_size,
                              next.post_norm, Buf(kLast), 1, c.hidden_size,
                              static_cast<float>(c.rms_norm_eps)));
  int32_t* ids = reinterpret_cast<int32_t*>(Buf(kTopIds));
  RETURN_IF_ERROR(RouteRows(be_, model_, next, Buf(kLast), Mlp(), 1, /*renormalize=*/false));
  std::vector<int32_t> hid(k);
  std::vector<float> hw(k);
  RETURN_IF_ERROR(be_.CopyToHost(hid.data(), ids, 4 * k));
  RETURN_IF_ERROR(be_.CopyToHost(hw.data(), Buf(kTopW), 4 * k));
  std::vector<ExpertHint> hints;
  for (int64_t i = 0; i < k; ++i) {
    hints.push_back({next.moe_index, hid[i], hw[i], HintSource::kHint});
  }
  if (request != 0) {
    experts_->HintFor(request, hints);
  } else {
    experts_->Hint(hints);
  }
  observer_.Hints(hints);
  return absl::OkStatus();
}

}  // namespace moe
