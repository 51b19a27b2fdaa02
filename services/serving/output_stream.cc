#include "services/serving/output_stream.h"

#include <algorithm>

namespace moe::serving {
namespace {

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

OutputStream::OutputStream(const GenerateOptions& options,
                           const std::vector<int64_t>& eos_token_ids, const Tokenizer* tokenizer,
                           std::vector<std::string> stop_strings, absl::Time submitted)
    : prompt_tokens_(static_cast<int>(options.prompt.size())),
      max_new_tokens_(options.max_new_tokens),
      stops_(StopTokens(options, eos_token_ids)),
      has_stop_strings_(!stop_strings.empty()),
      stop_strings_(std::move(stop_strings)),
      start_(Clock::now() - absl::ToChronoNanoseconds(absl::Now() - submitted)) {
  if (tokenizer != nullptr) {
    decoder_ = std::make_unique<StreamDecoder>(*tokenizer, /*skip_special=*/true);
  }
}

Output OutputStream::Push(const SampledToken& t, const ExpertCounters& experts) {
  const Clock::time_point now = Clock::now();
  if (generated_ == 0) first_ = now;
  ++generated_;
  ttft_ = Seconds(first_ - start_);
  if (generated_ > 1) tpot_ = Seconds(now - first_) / (generated_ - 1);
  Output out;
  out.token_id = t.token;
  out.logprob = t.logprob;
  out.top_logprobs = t.top_logprobs;
  // The engine stops after this token exactly when one of these holds, so
  // the last output can carry the summary as it streams.
  const bool stop_token =
      t.ends || std::find(stops_.begin(), stops_.end(), t.token) != stops_.end();
  bool last = stop_token || generated_ == max_new_tokens_;
  if (decoder_ != nullptr) {
    std::string text = decoder_->Push(t.token);
    if (last) text += decoder_->Flush();
    if (has_stop_strings_) {
      text = stop_strings_.Push(text);
      if (stop_strings_.matched()) {
        last = true;
      } else if (last) {
        text += stop_strings_.Flush();
      }
    }
    out.text = std::move(text);
  }
  if (last) {
    finish_ = stop_token || stop_strings_.matched() ? "stop" : "length";
    out.finish_reason = finish_;
    out.usage = Usage{prompt_tokens_, generated_, ttft_, tpot_, experts, cached_prompt_tokens_};
  }
  return out;
}

absl::Status Interruption(bool cancelled, absl::Time deadline, absl::Time shutdown_at,
                          absl::Time now) {
  if (cancelled) return absl::CancelledError("cancelled by the client");
  if (now >= deadline) return absl::DeadlineExceededError("deadline exceeded");
  if (now >= shutdown_at) {
    return absl::UnavailableError("worker is shutting down; request cancelled");
  }
  return absl::OkStatus();
}

absl::Status QueuedInterruption(bool cancelled, absl::Time deadline, absl::Time now) {
  if (cancelled) return absl::CancelledError("cancelled by the client while queued");
  if (now >= deadline) return absl::DeadlineExceededError("deadline passed while queued");
  return absl::OkStatus();
}

}  // namespace moe::serving
