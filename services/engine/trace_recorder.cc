#include "services/engine/trace_recorder.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model_desc.h"
#include "common/status_macros.h"

namespace moe {

trace::TraceHeader TraceHeaderFor(const MoeModel& model,
                                  const std::string& model_name) {
  const ModelConfig& c = model.config();
  trace::TraceHeader h;
  h.model = model_name;
  h.num_layers = c.num_moe_layers();
  h.num_experts = static_cast<int>(c.num_experts);
  h.top_k = static_cast<int>(c.top_k);
  h.expert_params = RoutedExpertParams(c);
  return h;
}

RequestRecording::RequestRecording(const trace::TraceHeader& header,
                                   std::string id)
    : header_(header), pending_hints_(std::max(header.num_layers, 0)) {
  request_.id = std::move(id);
}

RoutingObserver RequestRecording::Observer() {
  return RoutingObserver(
      [this](int moe_layer, int64_t tokens, absl::Span<const int32_t> experts,
             absl::Span<const float> weights) {
        Observe(moe_layer, tokens, experts, weights);
      },
      [this](absl::Span<const ExpertHint> hints) { ObserveHints(hints); });
}

void RequestRecording::ObserveHints(absl::Span<const ExpertHint> hints) {
  if (!error_.ok() || hints.empty()) return;
  const int layer = hints[0].layer;
  if (layer < next_layer_ || layer >= header_.num_layers) {
    error_ = absl::InternalError(absl::StrCat(
        "iteration ", iterations_, ": hints for MoE layer ", layer,
        " where layers ", next_layer_, "..", header_.num_layers - 1,
        " are still to be routed"));
    return;
  }
  std::vector<int32_t>& pending = pending_hints_[layer];
  for (const ExpertHint& h : hints) {
    if (h.layer != layer || h.expert < 0 ||
        h.expert >= header_.num_experts) {
      error_ = absl::InternalError(absl::StrCat(
          "hint (MoE layer ", h.layer, ", expert ", h.expert,
          ") among hints for layer ", layer, " of ", header_.num_experts,
          " experts"));
      return;
    }
    // Predictions for one layer from several distances: their union.
    if (std::find(pending.begin(), pending.end(), h.expert) == pending.end()) {
      pending.push_back(h.expert);
    }
  }
}

void RequestRecording::Observe(int moe_layer, int64_t tokens,
                               absl::Span<const int32_t> experts,
                               absl::Span<const float> weights) {
  if (!error_.ok()) return;
  const int L = header_.num_layers;
  const int k = header_.top_k;
  if (moe_layer != next_layer_) {
    error_ = absl::InternalError(
        absl::StrCat("iteration ", iterations_, ": routing of MoE layer ",
                     moe_layer, " where layer ", next_layer_, " was expected"));
    return;
  }
  const size_t want = static_cast<size_t>(tokens) * k;
  if (tokens <= 0 || experts.size() != want || weights.size() != want) {
    error_ = absl::InternalError(absl::StrCat(
        "MoE layer ", moe_layer, ": routing of ", experts.size(), " ids / ",
        weights.size(), " weights for ", tokens, " tokens x top_k ", k));
    return;
  }
  if (moe_layer == 0) {
    // A new iteration: the first is the prefill (with its further chunks,
    // ContinuePrefill), each later one a decode step of exactly one token.
    const bool more_prefill = continue_prefill_ && iterations_ == 1 &&
                              request_.phase.back() == trace::Phase::kPrefill;
    continue_prefill_ = false;
    if (iterations_ > 0 && tokens != 1 && !more_prefill) {
      error_ = absl::InternalError(absl::StrCat(
          "decode iteration ", iterations_, " has ", tokens, " tokens"));
      return;
    }
    const trace::Phase phase = iterations_ == 0 || more_prefill ? trace::Phase::kPrefill
                                                                : trace::Phase::kDecode;
    iter_start_ = request_.phase.size();
    iter_tokens_ = tokens;
    for (int64_t t = 0; t < tokens; ++t) {
      request_.phase.push_back(phase);
      request_.experts.emplace_back(L);
      request_.weights.emplace_back(L);
      hints_.emplace_back(L);
    }
    if (!more_prefill) ++iterations_;
  } else if (tokens != iter_tokens_) {
    error_ = absl::InternalError(
        absl::StrCat("MoE layer ", moe_layer, " routed ", tokens,
                     " tokens, layer 0 ", iter_tokens_));
    return;
  }
  for (int64_t t = 0; t < tokens; ++t) {
    auto& ids = request_.experts[iter_start_ + t][moe_layer];
    auto& ws = request_.weights[iter_start_ + t][moe_layer];
    ids.assign(experts.begin() + t * k, experts.begin() + (t + 1) * k);
    ws.assign(weights.begin() + t * k, weights.begin() + (t + 1) * k);
  }
  if (!pending_hints_[moe_layer].empty()) {
    hints_[iter_start_ + tokens - 1][moe_layer] =
        std::move(pending_hints_[moe_layer]);
    pending_hints_[moe_layer].clear();
    any_hints_ = true;
  }
  next_layer_ = (moe_layer + 1) % L;
}

absl::StatusOr<trace::TraceRequest> RequestRecording::Finish() const {
  RETURN_IF_ERROR(error_);
  if (iterations_ == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", request_.id, ": no routing recorded"));
  }
  if (next_layer_ != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "request ", request_.id, ": last iteration stopped after MoE layer ",
        next_layer_ - 1, " of ", header_.num_layers));
  }
  for (size_t m = 0; m < pending_hints_.size(); ++m) {
    if (pending_hints_[m].empty()) continue;
    return absl::FailedPreconditionError(
        absl::StrCat("request ", request_.id, ": hints for MoE layer ", m,
                     " were not followed by its routing"));
  }
  trace::TraceRequest request = request_;
  if (any_hints_) request.hints = hints_;
  return request;
}

absl::StatusOr<std::unique_ptr<TraceRecorder>> TraceRecorder::Open(
    const std::string& path, const trace::TraceHeader& header) {
  ASSIGN_OR_RETURN(auto writer, trace::TraceWriter::Open(path, header));
  return std::unique_ptr<TraceRecorder>(
      new TraceRecorder(std::move(writer), header));
}

absl::StatusOr<std::unique_ptr<TraceRecorder>> TraceRecorder::ToStream(
    std::ostream* out, const trace::TraceHeader& header) {
  RETURN_IF_ERROR(trace::ValidateHeader(header));
  return std::unique_ptr<TraceRecorder>(new TraceRecorder(
      std::make_unique<trace::TraceWriter>(out, header), header));
}

absl::Status TraceRecorder::Append(const trace::TraceRequest& request) {
  absl::MutexLock lock(&mu_);
  if (writer_ == nullptr) {
    return absl::FailedPreconditionError("trace recorder is closed");
  }
  RETURN_IF_ERROR(writer_->Write(request));
  ++requests_;
  return absl::OkStatus();
}

absl::Status TraceRecorder::Append(const RequestRecording& recording) {
  ASSIGN_OR_RETURN(trace::TraceRequest request, recording.Finish());
  return Append(request);
}

int64_t TraceRecorder::requests() const {
  absl::MutexLock lock(&mu_);
  return requests_;
}

absl::Status TraceRecorder::Close() {
  absl::MutexLock lock(&mu_);
  if (writer_ == nullptr) return absl::OkStatus();
  absl::Status s = writer_->Close();
  writer_.reset();
  return s;
}

}  // namespace moe
