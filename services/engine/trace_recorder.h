// Records the routing of live generation requests as a `moe-trace/1` file
// (services/cache/trace.h; design.md "Trace format").
//
//   ASSIGN_OR_RETURN(auto recorder,
//                    TraceRecorder::Open(path, TraceHeaderFor(model, name)));
//   RequestRecording rec(recorder->header(), "req-1");
//   ASSIGN_OR_RETURN(auto summary,
//                    Generate(model, experts, opts, on_token, rec.Observer()));
//   RETURN_IF_ERROR(recorder->Append(rec));
//
// A RequestRecording turns the engine's RoutingObserver calls into one trace
// request: the first iteration (all prompt tokens) is the prefill, every
// later iteration is one decode token. An iteration starts when MoE layer 0
// reports and must report every MoE layer once, in order. The trace holds
// the tokens that went through the model: the prompt and every generated
// token but the last (which is sampled and never fed back).
//
// With pre-gating on (GenerateOptions::pregate_hints), the observer also
// sees the hints the session gives the provider: the experts predicted for
// layer l+D from layer l's output (D = GenerateOptions::pregate_distance),
// for the iteration's last token. They are recorded as the trace's "hints"
// ([token][layer][experts]) under the layer they predict, whatever the
// distance: empty lists where nothing was predicted (prefill tokens, which
// the session does not hint, and the first D layers unless dense layers
// precede them). A request without any hint has no "hints" field.
//
// Thread-safety: TraceRecorder::Append may be called concurrently (a worker
// records concurrent requests); requests are written whole, one line each,
// in the order Append is called. A RequestRecording is thread-compatible:
// one per request, driven by that request's thread.
#ifndef MOECACHE_SERVICES_ENGINE_TRACE_RECORDER_H_
#define MOECACHE_SERVICES_ENGINE_TRACE_RECORDER_H_

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "services/cache/trace.h"
#include "services/engine/expert_provider.h"
#include "services/engine/moe_model.h"
#include "services/engine/session.h"

namespace moe {

// The header for `model`: MoE layers, routed experts, top_k, the weights
// of one routed expert.
trace::TraceHeader TraceHeaderFor(const MoeModel& model,
                                  const std::string& model_name);

class RequestRecording {
 public:
  RequestRecording(const trace::TraceHeader& header, std::string id);

  // An observer that appends to this recording (routing and hints); valid
  // while it lives.
  RoutingObserver Observer();

  // Records one MoE layer's routing of the current iteration: experts and
  // weights are [tokens, top_k]. Shape or order errors are remembered and
  // reported by Finish() (the observer has no way to fail).
  void Observe(int moe_layer, int64_t tokens, absl::Span<const int32_t> experts,
               absl::Span<const float> weights);

  // The next iteration is another chunk of the prompt (chunked prefill in a
  // batch): its tokens join the prefill, which the trace keeps as one
  // iteration, instead of starting a decode step.
  void ContinuePrefill() { continue_prefill_ = true; }

  // Records pre-gating hints (all for one MoE layer, one not yet routed in
  // this iteration; attached to the last token of the iteration when that
  // layer is routed). Several calls for one layer (predictions from several
  // distances) record their union, in first-seen order. Errors are
  // remembered like Observe's.
  void ObserveHints(absl::Span<const ExpertHint> hints);

  // The request as recorded. FAILED_PRECONDITION when nothing was recorded,
  // the last iteration is incomplete, or hints were not followed by their
  // layer's routing; INTERNAL for routing that did not
  // fit the header (the first such error).
  absl::StatusOr<trace::TraceRequest> Finish() const;

  int iterations() const { return iterations_; }

 private:
  trace::TraceHeader header_;
  trace::TraceRequest request_;
  int iterations_ = 0;
  bool continue_prefill_ = false;
  int next_layer_ = 0;       // MoE layer expected next in this iteration
  int64_t iter_tokens_ = 0;  // tokens of the current iteration
  size_t iter_start_ = 0;    // first token index of the current iteration
  trace::TokenLayerLists<int32_t> hints_;  // [token][layer], kept in step
  bool any_hints_ = false;
  // [moe layer]: hints seen in this iteration for a layer not yet routed.
  std::vector<std::vector<int32_t>> pending_hints_;
  absl::Status error_;
};

class TraceRecorder {
 public:
  // Creates/truncates `path` and writes the header line.
  static absl::StatusOr<std::unique_ptr<TraceRecorder>> Open(
      const std::string& path, const trace::TraceHeader& header);
  // Writes to a caller-owned stream that must outlive the recorder.
  static absl::StatusOr<std::unique_ptr<TraceRecorder>> ToStream(
      std::ostream* out, const trace::TraceHeader& header);

  const trace::TraceHeader& header() const { return header_; }

  // Validates and appends one request line (flushed). Thread-safe.
  absl::Status Append(const trace::TraceRequest& request);
  absl::Status Append(const RequestRecording& recording);
  // Requests appended so far.
  int64_t requests() const;
  absl::Status Close();

 private:
  TraceRecorder(std::unique_ptr<trace::TraceWriter> writer,
                const trace::TraceHeader& header)
      : header_(header), writer_(std::move(writer)) {}

  const trace::TraceHeader header_;
  mutable absl::Mutex mu_;
  std::unique_ptr<trace::TraceWriter> writer_ ABSL_GUARDED_BY(mu_);
  int64_t requests_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace moe

#endif  // MOECACHE_SERVICES_ENGINE_TRACE_RECORDER_H_
