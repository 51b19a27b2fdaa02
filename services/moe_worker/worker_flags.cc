#include "services/moe_worker/worker_flags.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "common/status_macros.h"
#include "services/engine/session.h"
#include "services/flags/flag_groups.h"
#include "services/openai/chat_template.h"

namespace moe::worker {
namespace {

constexpr flags::IntRange kInt = {.min = std::numeric_limits<int>::min(),
                                  .max = std::numeric_limits<int>::max()};
constexpr flags::IntRange kNonNegativeInt = {.min = 0, .max = std::numeric_limits<int>::max()};

void DeclareRunnerFlags(flags::FlagSet& f, const RunnerOptions& d) {
  f.Group("requests and batching");
  f.Int("max-queue", d.max_queue, "requests waiting beyond the running one", kInt);
  f.Int("max-prompt-tokens", d.max_prompt_tokens, "longest prompt accepted (0: context window)",
        kInt);
  f.Int("max-batch", d.max_batch,
        "sequences per forward step, continuous batching (1-64; 1: one at a time; 0: auto, "
        "as many as the KV budget holds at 2048 positions each, at most 16; without "
        "--kv-budget-mb the budget is then 2 GiB)",
        kInt);
  f.Int("prefill-chunk", d.prefill_chunk,
        "with --max-batch > 1: prompt tokens a joining sequence runs per step (0: whole "
        "prompt)", kInt);
  f.Size("kv-budget-mb", d.kv_budget_bytes,
         "with --max-batch > 1: KV cache the running sequences may hold (a bare number is "
         "MiB, 0.5 ok; or 256K, 2G; 0: no limit); requests wait for room, when full the "
         "youngest give their blocks up and resume by recomputing; one too large alone is "
         "refused",
         {.unit = flags::kMiB, .max = flags::kMiB << 30});
  f.Size("prefix-cache-mb", d.prefix_cache_bytes,
         "host memory for the prefix cache: keys and values of finished requests, reused by "
         "prompts that begin with the same tokens (a bare number is MiB; 0: off; off with "
         "--record-trace)",
         {.unit = flags::kMiB, .max = flags::kMiB << 30});
  f.Int("kv-block-tokens", d.kv_block_tokens,
        "with --max-batch > 1: positions per KV cache block", kInt);
  f.Choice("pregate-hints", d.pregate_hints ? "on" : "off", {"on", "off"},
           "send the next layer's router top-k to the daemon as prefetch hints");
  f.Int("pregate-distance", d.pregate_distance,
        "with --pregate-hints on: after layer l, hint layer l+D",
        {.min = 1, .max = kMaxPregateDistance});
}

// Every flag of moe-worker, the shared groups from services/flags.
void DeclareWorkerFlags(flags::FlagSet& f) {
  const WorkerOptions d;
  flag_groups::DeclareModel(f, /*repeatable=*/false);
  flag_groups::DeclareExpertFormat(f);  // with --cache none only (Worker refuses it else)
  flag_groups::DeclareRecordTrace(f);
  flag_groups::DeclareDevice(f, d.backend, /*backend_alias=*/true);
  flag_groups::DeclareCpuThreads(f);
  f.Choice("device-host-experts", d.device_host_experts ? "on" : "off", {"on", "off"},
           "a CUDA worker offers to run misses on its CPU from moe-cached's host copy (its "
           "--miss-mode host|auto then may answer so); a CPU worker always does");
  f.Group("cache");
  f.String("cache", d.cache,
           "unix:PATH of moe-cached, or none: every expert held in this process's memory "
           "(as --expert-format; with moe-cached, its --expert-format)");
  f.Double("cache-wait", absl::ToDoubleSeconds(d.cache_wait),
           "seconds to wait for moe-cached at start, retrying with backoff (0: once)",
           {.min = 0, .max = 86400});
  flag_groups::DeclareLeasePart(f, d.lease_part);
  f.String("cache-model", d.cache_model,
           "the model's name at moe-cached (default: the model directory's basename)");
  f.String("cache-auth-token-file", d.cache_auth_token_file, "bearer token for moe-cached");
  DeclareRunnerFlags(f, d.runner);
  flag_groups::DeclareServing(f, /*repeatable_listen=*/true, d.metrics_addr);
  f.String("http-listen", d.http.listen,
           "OpenAI-compatible HTTP API on PORT (loopback), HOST:PORT or [V6]:PORT (default "
           "off)");
  f.StringList("served-model-name",
               "a name the HTTP API serves the model under, in /v1/models and as \"model\" "
               "(the first is the one answers carry; the directory's name always works)");
  f.Synonym("alias", "served-model-name");
  f.String("api-key-file", d.http.api_key_file,
           "the HTTP API's key (Authorization: Bearer KEY), one line in a file (default: "
           "--auth-token-file's token)");
  f.String("api-key-env", d.http.api_key_env,
           "the HTTP API's key from this environment variable instead of a file");
  f.Bool("allow-plaintext-auth", false,
         "accept an API key over plaintext HTTP on a non-loopback --http-listen (refused "
         "without this flag: the key would cross the network in the clear)");
  f.Size("http-max-body-bytes", static_cast<int64_t>(d.http.max_body_bytes),
         "largest HTTP request body, whatever its framing (413 beyond)", {.min = 1024});
  f.Size("http-max-header-bytes", static_cast<int64_t>(d.http.max_header_bytes),
         "largest HTTP header section, request line included (431 beyond)", {.min = 1024});
  f.Int("http-max-headers", d.http.max_headers, "most HTTP header fields in a request (431 "
        "beyond)", {.min = 1, .max = 10000});
  f.Double("http-read-timeout-s", absl::ToDoubleSeconds(d.http.read_timeout),
           "seconds a client has from a request's first byte to its last (408 after; 0: none)",
           {.min = 0});
  f.Double("http-request-timeout-s", absl::ToDoubleSeconds(d.http.request_timeout),
           "deadline of each HTTP request, seconds (0: none)", {.min = 0});
  f.Int("shutdown-grace-s", absl::ToInt64Seconds(d.shutdown_grace),
        "seconds in-flight requests get on SIGTERM", kNonNegativeInt);
  f.Int("warmup-tokens", d.warmup_tokens,
        "prompt tokens of a throwaway request run before serving, so that the first "
        "client's prompt is as fast as the next (0: none; capped by the context)",
        kNonNegativeInt);
  f.String("port-file", d.port_file, "write the bound ports as JSON once serving");
  flag_groups::DeclareChatTemplate(f, openai::BuiltinChatTemplateNames());
  f.Group("");
  f.Bool("version", false, "print the build and whether CUDA loads");
  flag_groups::DeclareDryRun(f);
  flag_groups::DeclareLogLevel(f);
  f.NoPositional();
  f.Notes(absl::StrCat("--listen defaults to ", kDefaultListen,
                       ". Sizes take K, M, G, T (powers of 1024: 2G = 2GiB).\n"));
}

void RunnerFromFlags(const flags::FlagSet& f, RunnerOptions& r) {
  r.max_queue = static_cast<int>(f.GetInt("max-queue"));
  r.max_prompt_tokens = static_cast<int>(f.GetInt("max-prompt-tokens"));
  r.max_batch = static_cast<int>(f.GetInt("max-batch"));
  r.prefill_chunk = static_cast<int>(f.GetInt("prefill-chunk"));
  r.kv_budget_bytes = f.GetSize("kv-budget-mb");
  r.kv_block_tokens = static_cast<int>(f.GetInt("kv-block-tokens"));
  r.prefix_cache_bytes = f.GetSize("prefix-cache-mb");
  r.pregate_hints = f.GetString("pregate-hints") == "on";
  r.pregate_distance = static_cast<int>(f.GetInt("pregate-distance"));
}

}  // namespace

absl::StatusOr<WorkerFlags> ParseWorkerFlags(const std::vector<std::string>& args) {
  flags::FlagSet f("moe-worker", "");
  DeclareWorkerFlags(f);
  RETURN_IF_ERROR(f.Parse(args));
  WorkerFlags flags;
  flags.help = f.help();
  flags.version = f.GetBool("version");
  flags.dry_run = f.GetBool("dry-run");
  flags.log_level = flag_groups::LogLevelFromFlags(f);
  WorkerOptions& o = flags.options;
  o.model_dir = f.GetString("model");
  o.backend = f.GetString("device");
  o.cpu_threads = flag_groups::CpuThreadsFromFlags(f);
  o.device_host_experts = f.GetString("device-host-experts") == "on";
  o.lease_part = flag_groups::LeasePartFromFlags(f);
  o.cache = f.GetString("cache");
  o.expert_format = flag_groups::ExpertFormatFromFlags(f);
  o.cache_wait = absl::Seconds(f.GetDouble("cache-wait"));
  o.cache_model = f.GetString("cache-model");
  o.cache_auth_token_file = f.GetString("cache-auth-token-file");
  RunnerFromFlags(f, o.runner);
  o.listen = f.GetList("listen");
  o.metrics_addr = f.GetString("metrics-addr");
  ASSIGN_OR_RETURN(o.security, flag_groups::SecurityFromFlags(f));
  o.http.listen = f.GetString("http-listen");
  o.http.max_body_bytes = static_cast<size_t>(f.GetSize("http-max-body-bytes"));
  o.http.served_model_names = f.GetList("served-model-name");
  o.http.api_key_file = f.GetString("api-key-file");
  o.http.api_key_env = f.GetString("api-key-env");
  o.http.allow_plaintext_auth = f.GetBool("allow-plaintext-auth");
  o.http.max_header_bytes = static_cast<size_t>(f.GetSize("http-max-header-bytes"));
  o.http.max_headers = static_cast<int>(f.GetInt("http-max-headers"));
  o.http.read_timeout = absl::Seconds(f.GetDouble("http-read-timeout-s"));
  o.http.request_timeout = absl::Seconds(f.GetDouble("http-request-timeout-s"));
  o.shutdown_grace = absl::Seconds(f.GetInt("shutdown-grace-s"));
  o.warmup_tokens = static_cast<int>(f.GetInt("warmup-tokens"));
  o.port_file = f.GetString("port-file");
  o.chat_template = f.GetString("chat-template");
  o.record_trace = f.GetString("record-trace");
  return flags;
}

std::string WorkerUsage() {
  flags::FlagSet f("moe-worker", "--model DIR [flags]");
  DeclareWorkerFlags(f);
  return f.Usage();
}

}  // namespace moe::worker
