// moectl generate: streams one Generate request from a running moe-worker.
// Output matches `moectl run`: text mode writes the text to stdout as tokens
// arrive and a one-line summary to stderr; --json prints one object per
// token
//   {"token_id":..,"text":..,"logprob":..,"top_logprobs":[{"token_id":..,"logprob":..}]}
// then {"finish_reason":..,"text":..,"usage":{..moe.v1.Usage's fields..}}
// whose "text" is the whole generated text (the tokens' texts concatenated),
// so a script can read the last line alone.
//
// --prompts-file FILE sends one request per line of FILE, --concurrency at
// a time over one channel (a load generator, and batch inference from a
// file): one JSON line per request, in the file's order,
//   {"index":..,"finish_reason":..,"text":..,"usage":{..}} (or "error")
// then {"requests":..,"failed":..,"generated_tokens":..,"wall_seconds":..,
// "tokens_per_second":..}, wall time from the first request sent to the last
// one finished.
//
// Exit codes: 0 success, 2 bad flags or a request the worker refused as
// INVALID_ARGUMENT, 1 anything else (unreachable worker, busy, cancelled).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "moe/v1/inference.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "services/moectl/client_channel.h"
#include "services/moectl/commands.h"
#include "services/moectl/flags.h"
#include "services/moectl/sampling_flags.h"
#include "services/serving/request_proto.h"
#include "services/rpc/rpc_util.h"

namespace moe::moectl {
namespace {

using json = nlohmann::ordered_json;

void DeclareFlags(FlagSet& f) {
  f.String("target", "", "moe-worker address: unix:PATH or HOST:PORT (required)");
  f.String("prompt", "", "prompt text (the worker tokenizes it)");
  f.String("prompts-file", "",
           "one prompt per line: the requests go --concurrency at a time; JSON "
           "lines out (one per request, in order, then the totals)");
  f.Int("concurrency", 16, "requests in flight at once with --prompts-file");
  DeclareGenerationFlags(f);
  DeclareSamplingFlags(f);
  f.String("stop-ids", "", "comma-separated token ids that end generation");
  f.Double("timeout-s", 300, "deadline for the whole request, seconds");
  DeclareClientSecurityFlags(f);
}

absl::Status AddIds(const std::string& text, const char* what,
                    google::protobuf::RepeatedField<int32_t>* out) {
  ASSIGN_OR_RETURN(std::vector<int64_t> ids, ParseIntList(text));
  for (int64_t id : ids) {
    if (id < INT32_MIN || id > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " id ", id, " out of range"));
    }
    out->Add(static_cast<int32_t>(id));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::GenerateRequest> RequestFromFlags(const FlagSet& f) {
  RETURN_IF_ERROR(f.Require("target"));
  if (static_cast<int>(f.IsSet("prompt")) + f.IsSet("prompt-ids") + f.IsSet("prompts-file") != 1) {
    return absl::InvalidArgumentError(
        "exactly one of --prompt, --prompt-ids and --prompts-file is required");
  }
  if (!f.positional().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", f.positional()[0], "'"));
  }
  if (f.GetDouble("timeout-s") <= 0) {
    return absl::InvalidArgumentError("--timeout-s must be > 0");
  }
  // Ranges are the worker's to check: one source of truth.
  v1::GenerateRequest r;
  r.set_prompt(f.GetString("prompt"));
  if (f.IsSet("prompt-ids")) {
    RETURN_IF_ERROR(AddIds(f.GetString("prompt-ids"), "prompt token",
                           r.mutable_prompt_token_ids()));
    if (r.prompt_token_ids().empty()) {
      return absl::InvalidArgumentError("empty --prompt-ids");
    }
  }
  RETURN_IF_ERROR(
      AddIds(f.GetString("stop-ids"), "stop", r.mutable_stop_token_ids()));
  const int64_t n = f.GetInt("max-new-tokens");
  const int64_t top = f.GetInt("top-logprobs");
  if (n < INT32_MIN || n > INT32_MAX || top < INT32_MIN || top > INT32_MAX ||
      f.GetInt("top-k") < INT32_MIN || f.GetInt("top-k") > INT32_MAX) {
    return absl::InvalidArgumentError(
        "--max-new-tokens, --top-logprobs or --top-k out of range");
  }
  r.set_max_new_tokens(static_cast<int32_t>(n));
  r.set_top_logprobs(static_cast<int32_t>(top));
  // The sampler fields through serving::Request, so that unset flags send
  // the same defaults the worker would apply.
  serving::Request sampling;
  RETURN_IF_ERROR(SamplingFromFlags(f, &sampling));
  v1::GenerateRequest s;
  serving::ToProto(sampling, &s);
  r.set_temperature(s.temperature());
  r.set_top_k(s.top_k());
  r.set_top_p(s.top_p());
  r.set_min_p(s.min_p());
  r.set_repetition_penalty(s.repetition_penalty());
  r.set_presence_penalty(s.presence_penalty());
  r.set_frequency_penalty(s.frequency_penalty());
  *r.mutable_logit_bias() = s.logit_bias();
  if (s.has_seed()) r.set_seed(s.seed());
  r.set_ignore_eos(s.ignore_eos());
  return r;
}

void PrintJsonLine(const json& j) {
  std::string line = j.dump(-1, ' ', false, json::error_handler_t::replace);
  std::fprintf(stdout, "%s\n", line.c_str());
  std::fflush(stdout);
}

void PrintToken(const v1::GenerateResponse& r, bool as_json) {
  if (!as_json) {
    std::fwrite(r.text().data(), 1, r.text().size(), stdout);
    std::fflush(stdout);
    return;
  }
  json j;
  j["token_id"] = r.token_id();
  j["text"] = r.text();
  j["logprob"] = r.logprob();
  json alts = json::array();
  for (const v1::TokenLogprob& t : r.top_logprobs()) {
    alts.push_back(json{{"token_id", t.token_id()}, {"logprob", t.logprob()}});
  }
  j["top_logprobs"] = std::move(alts);
  PrintJsonLine(j);
}

// `text`: everything generated (the summary line of --json carries it).
void PrintSummary(const v1::GenerateResponse& last, const std::string& text, bool as_json) {
  const v1::Usage& u = last.usage();
  if (as_json) {
    json usage;
    usage["prompt_tokens"] = u.prompt_tokens();
    usage["generated_tokens"] = u.generated_tokens();
    usage["time_to_first_token_seconds"] = u.time_to_first_token_seconds();
    usage["time_per_output_token_seconds"] = u.time_per_output_token_seconds();
    usage["expert_hits"] = u.expert_hits();
    usage["expert_misses"] = u.expert_misses();
    usage["expert_stall_seconds"] = u.expert_stall_seconds();
    json j;
    j["finish_reason"] = last.finish_reason();
    j["text"] = text;
    j["usage"] = std::move(usage);
    PrintJsonLine(j);
    return;
  }
  std::fprintf(stdout, "\n");
  std::fflush(stdout);
  const double tpot = u.time_per_output_token_seconds();
  std::fprintf(stderr,
               "moectl generate: %d tokens (prompt %d), finish %s, TTFT %.1f "
               "ms, TPOT %.2f ms (%.1f tokens/s), experts %lld hit / %lld "
               "miss, stall %.1f ms\n",
               u.generated_tokens(), u.prompt_tokens(),
               last.finish_reason().c_str(),
               u.time_to_first_token_seconds() * 1e3, tpot * 1e3,
               tpot > 0 ? 1.0 / tpot : 0.0,
               static_cast<long long>(u.expert_hits()),
               static_cast<long long>(u.expert_misses()),
               u.expert_stall_seconds() * 1e3);
}

// Streams the request; the status the worker ended the call with.
absl::Status Stream(const FlagSet& f, const v1::GenerateRequest& request) {
  ASSIGN_OR_RETURN(auto channel,
                   DialService(f, f.GetString("target"), MoeService::kWorker, "--target"));
  auto stub = v1::Inference::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(
                       f.GetDouble("timeout-s") * 1e3)));
  const bool as_json = f.GetBool("json");
  auto reader = stub->Generate(&ctx, request);
  v1::GenerateResponse r;
  bool summarized = false;
  std::string text;
  while (reader->Read(&r)) {
    PrintToken(r, as_json);
    text += r.text();
    if (!r.finish_reason().empty()) {
      PrintSummary(r, text, as_json);
      summarized = true;
    }
  }
  RETURN_IF_ERROR(rpc::FromGrpcStatus(reader->Finish()));
  if (!summarized) {
    return absl::InternalError("the stream ended without a summary");
  }
  return absl::OkStatus();
}

// The most prompts a --prompts-file may hold, and its largest size.
constexpr size_t kMaxPrompts = 100000;
constexpr int64_t kMaxPromptsFileBytes = 64 << 20;

absl::StatusOr<std::vector<std::string>> ReadPrompts(const std::string& path) {
  absl::StatusOr<std::string> read = ReadFileToString(path, kMaxPromptsFileBytes);
  if (!read.ok()) {
    return absl::Status(read.status().code(),
                        absl::StrCat("--prompts-file: ", read.status().message()));
  }
  const std::string& text = *read;
  std::vector<std::string> prompts;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.empty()) prompts.emplace_back(line);
  }
  if (prompts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--prompts-file ", path, " has no prompt"));
  }
  if (prompts.size() > kMaxPrompts) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompts-file has ", prompts.size(), " prompts; at most ", kMaxPrompts));
  }
  return prompts;
}

// One request of --prompts-file: what came back.
struct ManyResult {
  absl::Status status;
  std::string text, finish;
  v1::Usage usage;
};

// --prompts-file's requests on gRPC's callback API: `concurrency` streams in
// flight, each read on gRPC's own threads, the next request started as one
// ends. (A thread per stream blocking in Read cost the client ~30 us of CPU
// a token, on the machine it shares with the worker in benchmarks.)
class ManyStreams {
 public:
  ManyStreams(v1::Inference::Stub* stub, const v1::GenerateRequest& base,
              const std::vector<std::string>& prompts, std::chrono::milliseconds timeout,
              std::vector<ManyResult>* results)
      : stub_(stub), base_(base), prompts_(prompts), timeout_(timeout), results_(results) {}

  // Returns when every request has ended.
  void Run(size_t concurrency) {
    const size_t first = std::min(concurrency, prompts_.size());
    {
      absl::MutexLock lock(&mu_);
      next_ = first;
      running_ = first;
    }
    for (size_t i = 0; i < first; ++i) Start(i);
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](size_t* running) { return *running == 0; }, &running_));
  }

 private:
  class Reader : public grpc::ClientReadReactor<v1::GenerateResponse> {
   public:
    Reader(ManyStreams* owner, size_t index) : owner_(owner), index_(index) {}
    void Go() {
      request_ = owner_->base_;
      request_.set_prompt(owner_->prompts_[index_]);
      ctx_.set_deadline(std::chrono::system_clock::now() + owner_->timeout_);
      owner_->stub_->async()->Generate(&ctx_, &request_, this);
      StartRead(&response_);
      StartCall();
    }
    void OnReadDone(bool ok) override {
      if (!ok) return;  // OnDone follows
      ManyResult& out = (*owner_->results_)[index_];
      out.text += response_.text();
      if (!response_.finish_reason().empty()) {
        out.finish = response_.finish_reason();
        out.usage = response_.usage();
      }
      StartRead(&response_);
    }
    void OnDone(const grpc::Status& status) override {
      (*owner_->results_)[index_].status = rpc::FromGrpcStatus(status);
      ManyStreams* owner = owner_;
      delete this;
      owner->Ended();
    }

   private:
    ManyStreams* const owner_;
    const size_t index_;
    grpc::ClientContext ctx_;
    v1::GenerateRequest request_;
    v1::GenerateResponse response_;
  };

  void Start(size_t index) { (new Reader(this, index))->Go(); }

  // A stream ended (on a gRPC thread): start the next request, if any.
  void Ended() {
    size_t index;
    {
      absl::MutexLock lock(&mu_);
      if (next_ >= prompts_.size()) {
        --running_;
        return;
      }
      index = next_++;
    }
    Start(index);
  }

  v1::Inference::Stub* const stub_;
  const v1::GenerateRequest& base_;
  const std::vector<std::string>& prompts_;
  const std::chrono::milliseconds timeout_;
  std::vector<ManyResult>* const results_;
  absl::Mutex mu_;
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;     // the next prompt to send
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;  // streams not yet ended
};

// --prompts-file: every prompt, --concurrency at a time; OK when all were.
absl::Status StreamMany(const FlagSet& f, const v1::GenerateRequest& base) {
  ASSIGN_OR_RETURN(std::vector<std::string> prompts, ReadPrompts(f.GetString("prompts-file")));
  const int64_t concurrency = f.GetInt("concurrency");
  if (concurrency < 1 || concurrency > 1024) {
    return absl::InvalidArgumentError("--concurrency must be in [1, 1024]");
  }
  ASSIGN_OR_RETURN(auto channel,
                   DialService(f, f.GetString("target"), MoeService::kWorker, "--target"));
  auto stub = v1::Inference::NewStub(channel);
  std::vector<ManyResult> results(prompts.size());
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(f.GetDouble("timeout-s") * 1e3));
  const auto start = std::chrono::steady_clock::now();
  {
    ManyStreams many(stub.get(), base, prompts, timeout, &results);
    many.Run(static_cast<size_t>(concurrency));
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int failed = 0;
  int64_t generated = 0;
  absl::Status first_error;
  for (size_t i = 0; i < results.size(); ++i) {
    const ManyResult& r = results[i];
    json j;
    j["index"] = i;
    if (!r.status.ok()) {
      ++failed;
      if (first_error.ok()) first_error = r.status;
      j["error"] = r.status.ToString();
    } else {
      generated += r.usage.generated_tokens();
      j["finish_reason"] = r.finish;
      j["text"] = r.text;
      j["usage"] = {{"prompt_tokens", r.usage.prompt_tokens()},
                    {"generated_tokens", r.usage.generated_tokens()},
                    {"time_to_first_token_seconds", r.usage.time_to_first_token_seconds()},
                    {"time_per_output_token_seconds", r.usage.time_per_output_token_seconds()},
                    {"cached_prompt_tokens", r.usage.cached_prompt_tokens()}};
    }
    PrintJsonLine(j);
  }
  PrintJsonLine({{"requests", results.size()},
                 {"failed", failed},
                 {"generated_tokens", generated},
                 {"wall_seconds", wall},
                 {"tokens_per_second", wall > 0 ? generated / wall : 0.0}});
  return first_error;
}

int RunGenerate(const Args& args) {
  FlagSet flags("generate",
                "--target ADDR (--prompt TEXT | --prompt-ids 1,2,3 | --prompts-file FILE) "
                "[--max-new-tokens N] [sampling flags] [--json]");
  DeclareFlags(flags);
  absl::Status parsed = flags.Parse(args);
  if (flags.help()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  absl::StatusOr<v1::GenerateRequest> request =
      parsed.ok() ? RequestFromFlags(flags) : parsed;
  absl::Status status = request.status();
  if (status.ok()) {
    status = flags.IsSet("prompts-file") ? StreamMany(flags, *request) : Stream(flags, *request);
  }
  if (status.ok()) return 0;
  std::string msg = absl::StrReplaceAll(status.ToString(), {{"\n", " "}});
  std::fprintf(stderr, "moectl generate: %s\n", msg.c_str());
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

const bool kRegistered = RegisterCommand(
    {"generate", "stream a generation from a running moe-worker",
     &RunGenerate});

}  // namespace
}  // namespace moe::moectl
