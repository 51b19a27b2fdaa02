// One request's output, token by token: stop tokens (the request's and the
// model's eos), stop strings matched across token boundaries, streaming
// detokenization, timing and usage, and the reasons a running request is
// interrupted. Written once for both runner paths (one at a time and
// batched): each sampled token goes through Push, which says what to send.
//
//   OutputStream out(options, model.config().eos_token_ids, tokenizer,
//                    stop_strings, submitted);
//   for each sampled token t:
//     Output o = out.Push(t, expert_counters_so_far);
//     sink.Write(o);
//     if (out.done()) break;   // o carried finish_reason and usage
//
// Thread-compatible: one per request, driven by the engine thread.
#ifndef MOECACHE_SERVICES_SERVING_OUTPUT_STREAM_H_
#define MOECACHE_SERVICES_SERVING_OUTPUT_STREAM_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "services/engine/generator.h"
#include "services/engine/sampler.h"
#include "services/engine/tokenizer.h"
#include "services/serving/metered_provider.h"
#include "services/serving/stop_strings.h"

namespace moe::serving {

// What a request cost, sent with its last token.
struct Usage {
  int prompt_tokens = 0;
  int generated_tokens = 0;
  double ttft_seconds = 0.0;  // from submission (queue time included)
  double tpot_seconds = 0.0;  // mean time per token after the first
  ExpertCounters experts;
  int cached_prompt_tokens = 0;  // of prompt_tokens, loaded from the prefix cache
};

// One generated token as the client sees it.
struct Output {
  int32_t token_id = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;  // descending
  // The decoded text this token adds; held back while a stop string could
  // still begin in it, so it may trail the token.
  std::string text;
  std::string finish_reason;  // "stop" or "length" on the last; else ""
  std::optional<Usage> usage;  // on the last
};

class OutputStream {
 public:
  // `tokenizer` may be null (then no text, and `stop_strings` must be
  // empty); not owned, must outlive the stream. TTFT counts from
  // `submitted`.
  OutputStream(const GenerateOptions& options, const std::vector<int64_t>& eos_token_ids,
               const Tokenizer* tokenizer, std::vector<std::string> stop_strings,
               absl::Time submitted);

  // The output for the next sampled token; `experts` is the request's
  // expert usage so far (reported with the last token).
  // REQUIRES: !done().
  Output Push(const SampledToken& token, const ExpertCounters& experts);

  // The last output went out: a stop token, the end of the request's
  // constraint (SampledToken::ends), a stop string or max_new_tokens.
  bool done() const { return !finish_.empty(); }
  // "stop" or "length" once done(); "" before.
  const std::string& finish_reason() const { return finish_; }
  // The decoded text reached a stop string (the engine does not know of
  // stop strings: the caller stops it).
  bool matched_stop_string() const { return stop_strings_.matched(); }
  int generated() const { return generated_; }
  double ttft_seconds() const { return ttft_; }
  double tpot_seconds() const { return tpot_; }
  // Prompt tokens the prefix cache supplied (reported in the last usage).
  void set_cached_prompt_tokens(int n) { cached_prompt_tokens_ = n; }
  int cached_prompt_tokens() const { return cached_prompt_tokens_; }

 private:
  using Clock = std::chrono::steady_clock;

  const int prompt_tokens_;
  const int max_new_tokens_;
  std::vector<int32_t> stops_;  // the request's stop ids and, unless ignored, eos
  std::unique_ptr<StreamDecoder> decoder_;
  const bool has_stop_strings_;
  StopStringMatcher stop_strings_;
  Clock::time_point start_;
  Clock::time_point first_;
  int generated_ = 0;
  double ttft_ = 0.0;
  double tpot_ = 0.0;
  int cached_prompt_tokens_ = 0;
  std::string finish_;
};

// Why a running request must stop now: the client went away
// (CANCELLED), its deadline passed (DEADLINE_EXCEEDED), or the worker's
// shutdown grace is over (UNAVAILABLE, at `shutdown_at`); OK otherwise.
absl::Status Interruption(bool cancelled, absl::Time deadline, absl::Time shutdown_at,
                          absl::Time now = absl::Now());

// Why a queued request never starts (cancelled or past its deadline while
// queued); OK otherwise.
absl::Status QueuedInterruption(bool cancelled, absl::Time deadline, absl::Time now = absl::Now());

}  // namespace moe::serving

#endif  // MOECACHE_SERVICES_SERVING_OUTPUT_STREAM_H_
