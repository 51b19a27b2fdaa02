// moectl run: one generation request in one process, every expert in memory
// (InMemoryExpertProvider). Text mode streams the decoded text to stdout as
// tokens arrive and prints a one-line summary to stderr. --json prints one
// object per token with moe.v1.GenerateResponse's field names
//   {"token_id":..,"text":..,"logprob":..,"top_logprobs":[{"token_id":..,"logprob":..}]}
// then a summary object
//   {"finish_reason":..,"text":..,"usage":{..moe.v1.Usage's fields..}}
// whose "text" holds what the streaming decoder still held back (usually "").
//
// Exit codes: 0 success, 2 bad flags or request (ids, sizes, sampling),
// 1 anything else (model, backend, tokenizer, trace file, generation).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/quant.h"
#include "common/status_macros.h"
#include "kernels/backend.h"
#include "kernels/cpu_threads.h"
#include "nlohmann/json.hpp"
#include "services/engine/generator.h"
#include "services/engine/in_memory_provider.h"
#include "services/engine/moe_model.h"
#include "services/engine/tokenizer.h"
#include "services/engine/trace_recorder.h"
#include "services/flags/flag_groups.h"
#include "services/moectl/commands.h"
#include "services/engine/session.h"
#include "services/moectl/flags.h"
#include "services/moectl/sampling_flags.h"
#include "services/serving/request.h"

namespace moe::moectl {
namespace {

using json = nlohmann::ordered_json;

// A failure with the exit code it maps to.
struct Failure {
  int code;
  absl::Status status;
};

void DeclareFlags(FlagSet& f) {
  flag_groups::DeclareModel(f, /*repeatable=*/false);  // required here
  flag_groups::DeclareExpertFormat(f);
  flag_groups::DeclareRecordTrace(f);
  flag_groups::DeclareDevice(f, "auto", /*backend_alias=*/true);
  flag_groups::DeclareCpuThreads(f);
  f.Group("");
  f.String("prompt", "", "prompt text (encoded with the model's tokenizer)");
  DeclareGenerationFlags(f);
  DeclareSamplingFlags(f);
  f.Bool("verbose", false,
         "keep INFO logs on stderr (default: warnings and errors only, "
         "unless MOE_LOG_LEVEL is set)");
  f.Int("warmup", 0,
        "untimed forwards of the prompt before the request (as llama-bench's warm-up run: "
        "first-touch page faults, buffers and thread wake-ups stay out of the timings); "
        "0 to 8");
}

// Flag values that need no model: exclusive choices, and the bounds
// serving::ValidateParameters checks for every transport.
absl::StatusOr<serving::Request> RequestFromFlags(const FlagSet& f) {
  RETURN_IF_ERROR(f.Require("model"));
  if (f.IsSet("prompt") == f.IsSet("prompt-ids")) {
    return absl::InvalidArgumentError(
        "exactly one of --prompt and --prompt-ids is required");
  }
  if (!f.positional().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", f.positional()[0], "'"));
  }
  serving::Request r;
  r.transport = serving::Transport::kCli;
  r.max_new_tokens = f.GetInt("max-new-tokens");
  r.top_logprobs = f.GetInt("top-logprobs");
  RETURN_IF_ERROR(SamplingFromFlags(f, &r));
  RETURN_IF_ERROR(serving::ValidateParameters(r, serving::Limits{}));
  if (f.GetInt("warmup") < 0 || f.GetInt("warmup") > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("--warmup must be 0 to 8, not ", f.GetInt("warmup")));
  }
  if (f.IsSet("prompt-ids")) {
    ASSIGN_OR_RETURN(std::vector<int64_t> ids,
                     ParseIntList(f.GetString("prompt-ids")));
    for (int64_t id : ids) {
      if (id < 0 || id > INT32_MAX) {
        return absl::InvalidArgumentError(
            absl::StrCat("prompt token id ", id, " out of range"));
      }
      r.prompt_ids.push_back(static_cast<int32_t>(id));
    }
    if (r.prompt_ids.empty())
      return absl::InvalidArgumentError("empty --prompt-ids");
  } else {
    r.prompt_text = f.GetString("prompt");
  }
  return r;
}

std::string ModelName(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const size_t slash = dir.rfind('/');
  return slash == std::string::npos ? dir : dir.substr(slash + 1);
}

json TokenJson(const SampledToken& t, const std::string& text) {
  json j;
  j["token_id"] = t.token;
  j["text"] = text;
  j["logprob"] = t.logprob;
  json alts = json::array();
  for (const auto& [id, lp] : t.top_logprobs) {
    alts.push_back(json{{"token_id", id}, {"logprob", lp}});
  }
  j["top_logprobs"] = std::move(alts);
  return j;
}

void PrintJsonLine(const json& j) {
  std::string line = j.dump(-1, ' ', false, json::error_handler_t::replace);
  std::fprintf(stdout, "%s\n", line.c_str());
  std::fflush(stdout);
}

void PrintSummary(const GenerateSummary& s, const std::string& rest,
                  const std::string& backend, bool as_json) {
  if (as_json) {
    json usage;
    usage["prompt_tokens"] = s.prompt_tokens;
    usage["generated_tokens"] = s.generated_tokens;
    usage["time_to_first_token_seconds"] = s.ttft_seconds;
    usage["time_per_output_token_seconds"] = s.tpot_seconds;
    usage["expert_hits"] = s.stats.expert_hits;
    usage["expert_misses"] = s.stats.expert_misses;
    usage["expert_stall_seconds"] = s.stats.expert_stall_seconds;
    json j;
    j["finish_reason"] = s.finish_reason;
    j["text"] = rest;
    j["usage"] = std::move(usage);
    PrintJsonLine(j);
    return;
  }
  std::fprintf(stdout, "%s\n", rest.c_str());
  std::fflush(stdout);
  std::fprintf(stderr,
               "moectl run: %d tokens (prompt %d), finish %s, backend %s, "
               "TTFT %.1f ms, TPOT %.2f ms (%.1f tokens/s)\n",
               s.generated_tokens, s.prompt_tokens, s.finish_reason.c_str(),
               backend.c_str(), s.ttft_seconds * 1e3, s.tpot_seconds * 1e3,
               s.tpot_seconds > 0 ? 1.0 / s.tpot_seconds : 0.0);
}

// Loads everything, runs the request, prints as it goes.
std::optional<Failure> Run(const FlagSet& f, serving::Request request) {
  const std::string& dir = f.GetString("model");
  const bool as_json = f.GetBool("json");
  SetCpuThreads(flag_groups::CpuThreadsFromFlags(f));
  auto backend = CreateBackend(f.GetString("device"));
  if (!backend.ok()) return Failure{1, backend.status()};
  auto model = MoeModel::Load(dir, backend->get());
  if (!model.ok()) return Failure{1, model.status()};
  std::unique_ptr<Tokenizer> tokenizer;
  {
    auto t = Tokenizer::ForModel(dir);
    if (t.ok()) {
      tokenizer = std::move(*t);
    } else if (f.IsSet("prompt") || !absl::IsNotFound(t.status())) {
      return Failure{1, t.status()};
    }
  }
  if (f.IsSet("prompt")) {
    // Even an empty --prompt is encoded (special tokens), as always.
    request.prompt_ids = tokenizer->Encode(request.prompt_text, /*add_special=*/true);
  }
  if (absl::Status s = serving::Validate(
          request, serving::LimitsFor(**model, tokenizer != nullptr, /*max_prompt_tokens=*/0));
      !s.ok()) {
    return Failure{2, s};
  }
  const GenerateOptions opts = serving::ToGenerateOptions(request);
  auto experts =
      InMemoryExpertProvider::Create(**model, flag_groups::ExpertFormatFromFlags(f));
  if (!experts.ok()) return Failure{1, experts.status()};

  // Warm-up: the prompt's prefill in a session of its own, untimed and
  // unrecorded; the request then starts from an empty context as always.
  for (int64_t i = 0; i < f.GetInt("warmup"); ++i) {
    Session warm(**model, experts->get(), static_cast<int64_t>(request.prompt_ids.size()));
    auto logits = warm.Forward(request.prompt_ids, /*prefill=*/true);
    if (!logits.ok()) return Failure{1, logits.status()};
  }

  std::unique_ptr<TraceRecorder> recorder;
  std::optional<RequestRecording> recording;
  RoutingObserver observer;
  if (f.IsSet("record-trace")) {
    auto r = TraceRecorder::Open(f.GetString("record-trace"),
                                 TraceHeaderFor(**model, ModelName(dir)));
    if (!r.ok()) return Failure{1, r.status()};
    recorder = std::move(*r);
    recording.emplace(recorder->header(), "run-0");
    observer = recording->Observer();
  }

  std::optional<StreamDecoder> decoder;
  if (tokenizer) decoder.emplace(*tokenizer, /*skip_special=*/true);
  auto on_token = [&](const SampledToken& t) {
    std::string text = decoder ? decoder->Push(t.token) : std::string();
    if (as_json) {
      PrintJsonLine(TokenJson(t, text));
    } else {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  };
  auto summary =
      Generate(**model, experts->get(), opts, on_token, std::move(observer));
  if (!summary.ok()) return Failure{1, summary.status()};
  PrintSummary(*summary, decoder ? decoder->Flush() : std::string(),
               (*backend)->Info().name, as_json);
  if (recorder) {
    absl::Status s = recorder->Append(*recording);
    if (s.ok()) s = recorder->Close();
    if (!s.ok()) return Failure{1, s};
  }
  return std::nullopt;
}

int RunRun(const Args& args) {
  FlagSet flags("run",
                "--model DIR (--prompt TEXT | --prompt-ids 1,2,3) "
                "[--max-new-tokens N] [sampling flags] [--json]");
  DeclareFlags(flags);
  absl::Status parsed = flags.Parse(args);
  if (flags.help()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  if (!flags.GetBool("verbose") && std::getenv("MOE_LOG_LEVEL") == nullptr) {
    SetMinLogLevel(LogLevel::kWARNING);
  }
  absl::StatusOr<serving::Request> request =
      parsed.ok() ? RequestFromFlags(flags) : parsed;
  std::optional<Failure> failure;
  if (!request.ok()) {
    failure = Failure{2, request.status()};
  } else {
    failure = Run(flags, *std::move(request));
  }
  if (!failure) return 0;
  std::string msg =
      absl::StrReplaceAll(failure->status.message(), {{"\n", " "}});
  std::fprintf(stderr, "moectl run: %s\n", msg.c_str());
  return failure->code;
}

const bool kRegistered = RegisterCommand(
    {"run", "generate from a prompt in one process (experts in memory)",
     &RunRun});

}  // namespace
}  // namespace moe::moectl
