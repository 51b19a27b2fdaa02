#include "services/moe_worker/worker_flags.h"

#include <cmath>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log_level.h"
#include "common/status_macros.h"
#include "services/engine/session.h"

namespace moe::worker {
namespace {

absl::Status ParseInt(const std::string& flag, const std::string& value,
                      int* out) {
  if (!absl::SimpleAtoi(value, out)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": not an integer: '", value, "'"));
  }
  return absl::OkStatus();
}

absl::Status Apply(const std::string& name, const std::string& value,
                   WorkerFlags& flags) {
  WorkerOptions& o = flags.options;
  if (absl::Status s; rpc::ParseSecurityFlag(name, value, &o.security, &s)) {
    return s;
  }
  if (name == "port-file") {
    o.port_file = value;
  } else if (name == "model") {
    o.model_dir = value;
  } else if (name == "listen") {
    o.listen.push_back(value);
  } else if (name == "backend") {
    if (value != "cpu" && value != "cuda" && value != "auto") {
      return absl::InvalidArgumentError(
          absl::StrCat("--backend: want cpu, cuda or auto, got '", value, "'"));
    }
    o.backend = value;
  } else if (name == "cache") {
    o.cache = value;
  } else if (name == "cache-wait") {
    double seconds = 0;
    if (!absl::SimpleAtod(value, &seconds) || !(seconds >= 0) || seconds > 86400) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--cache-wait: want seconds in [0, 86400], got '", value, "'"));
    }
    o.cache_wait = absl::Seconds(seconds);
  } else if (name == "cache-model") {
    o.cache_model = value;
  } else if (name == "cache-auth-token-file") {
    o.cache_auth_token_file = value;
  } else if (name == "max-queue") {
    return ParseInt(name, value, &o.runner.max_queue);
  } else if (name == "max-prompt-tokens") {
    return ParseInt(name, value, &o.runner.max_prompt_tokens);
  } else if (name == "max-batch") {
    return ParseInt(name, value, &o.runner.max_batch);
  } else if (name == "prefill-chunk") {
    return ParseInt(name, value, &o.runner.prefill_chunk);
  } else if (name == "kv-budget-mb") {
    // MiB, fractions allowed (a small model's sequences hold kilobytes).
    double mb = 0;
    if (!absl::SimpleAtod(value, &mb) || !(mb >= 0) || mb > (1 << 30)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv-budget-mb wants a size in MiB in [0, 2^30], got '", value, "'"));
    }
    o.runner.kv_budget_bytes = static_cast<int64_t>(std::llround(mb * (1 << 20)));
    return absl::OkStatus();
  } else if (name == "kv-block-tokens") {
    return ParseInt(name, value, &o.runner.kv_block_tokens);
  } else if (name == "metrics-addr") {
    o.metrics_addr = value;
  } else if (name == "record-trace") {
    o.record_trace = value;
  } else if (name == "device-host-experts") {
    if (value != "on" && value != "off") {
      return absl::InvalidArgumentError(
          absl::StrCat("--device-host-experts: want on or off, got '", value, "'"));
    }
    o.device_host_experts = value == "on";
  } else if (name == "pregate-hints") {
    if (value != "on" && value != "off") {
      return absl::InvalidArgumentError(
          absl::StrCat("--pregate-hints: want on or off, got '", value, "'"));
    }
    o.runner.pregate_hints = value == "on";
  } else if (name == "pregate-distance") {
    int d = 0;
    if (!absl::SimpleAtoi(value, &d) || d < 1 || d > kMaxPregateDistance) {
      return absl::InvalidArgumentError(
          absl::StrCat("--pregate-distance: want an integer in [1, ",
                       kMaxPregateDistance, "], got '", value, "'"));
    }
    o.runner.pregate_distance = d;
  } else if (name == "http-listen") {
    o.http.listen = value;
  } else if (name == "http-max-body-bytes") {
    int64_t n = 0;
    if (!absl::SimpleAtoi(value, &n) || n < 1024) {
      return absl::InvalidArgumentError(
          absl::StrCat("--http-max-body-bytes: want an integer >= 1024, got '", value, "'"));
    }
    o.http.max_body_bytes = static_cast<size_t>(n);
  } else if (name == "http-request-timeout-s") {
    double seconds = 0;
    if (!absl::SimpleAtod(value, &seconds) || !(seconds >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--http-request-timeout-s: want seconds >= 0, got '", value, "'"));
    }
    o.http.request_timeout = absl::Seconds(seconds);
  } else if (name == "log-level") {
    absl::StatusOr<LogLevel> level = ParseLogLevel(value);
    if (!level.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--log-level: want debug, info, warning or error, got '", value, "'"));
    }
    flags.log_level = *level;
  } else if (name == "shutdown-grace-s") {
    int s = 0;
    if (!absl::SimpleAtoi(value, &s) || s < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--shutdown-grace-s: want seconds >= 0, got '", value,
                       "'"));
    }
    o.shutdown_grace = absl::Seconds(s);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<WorkerFlags> ParseWorkerFlags(
    const std::vector<std::string>& args) {
  WorkerFlags flags;
  std::set<std::string> seen;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      flags.help = true;
      continue;
    }
    if (arg == "--version") {
      flags.version = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2), value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " needs a value"));
    }
    if (name != "listen" && !seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " given more than once"));
    }
    if (absl::Status s = Apply(name, value, flags); !s.ok()) return s;
  }
  if (absl::Status s = rpc::ValidateSecurityOptions(flags.options.security);
      !s.ok()) {
    return s;
  }
  return flags;
}

std::string WorkerUsage() {
  return absl::StrCat(
      "usage: moe-worker --model DIR [flags]\n"
      "  --model DIR             Hugging Face checkpoint directory (required)\n"
      "  --listen ADDR           unix:PATH or HOST:PORT, repeatable (default ",
      kDefaultListen,
      ")\n"
      "  --backend B             cpu, cuda or auto (default auto)\n"
      "  --cache C               unix:PATH of moe-cached, or none: every expert\n"
      "                          in this process's memory (default none)\n"
      "  --cache-wait S          how long to wait for moe-cached at start,\n"
      "                          retrying with backoff (default 60; 0: once)\n"
      "  --cache-model NAME      the model's name at moe-cached (default: "
      "the model directory's basename)\n"
      "  --max-queue N           requests waiting beyond the running one "
      "(default 16)\n"
      "  --max-prompt-tokens N   longest prompt accepted (0: context window)\n"
      "  --max-batch N           sequences per forward step, continuous\n"
      "                          batching (1-64; default 1: one at a time)\n"
      "  --prefill-chunk N       with --max-batch > 1: prompt tokens a joining\n"
      "                          sequence runs per step (0: whole prompt)\n"
      "  --kv-budget-mb M        with --max-batch > 1: KV cache (MiB, 0.5 ok)\n"
      "                          the running sequences may hold (0: no\n"
      "                          limit); requests\n"
      "                          wait for room, when full the youngest give\n"
      "                          their blocks up and resume by recomputing;\n"
      "                          one too large alone is refused\n"
      "  --kv-block-tokens N     with --max-batch > 1: positions per KV cache\n"
      "                          block (default 64)\n"
      "  --metrics-addr A        /metrics HOST:PORT (default ",
      kDefaultMetricsAddr,
      "; \"\" disables)\n"
      "  --record-trace FILE     record routing as moe-trace/1\n"
      "  --device-host-experts on|off  a CUDA worker offers to run misses on\n"
      "                          its CPU from moe-cached's host copy (its\n"
      "                          --miss-mode host|auto then may answer so);\n"
      "                          default off (a CPU worker always does)\n"
      "  --pregate-hints on|off  send the next layer's router top-k to the\n"
      "                          daemon as prefetch hints (default off)\n"
      "  --pregate-distance D    with --pregate-hints on: after layer l, hint\n"
      "                          layer l+D (1-8, default 1)\n"
      "  --shutdown-grace-s S    time in-flight requests get on SIGTERM "
      "(default 10)\n"
      "  --port-file FILE        write the bound ports as JSON once serving\n"
      "  --http-listen ADDR      OpenAI-compatible HTTP API on PORT (loopback),\n"
      "                          HOST:PORT or [V6]:PORT (default off)\n"
      "  --http-max-body-bytes N largest HTTP request body (default 1048576)\n"
      "  --http-request-timeout-s S  deadline of each HTTP request (0: none)\n"
      "  --cache-auth-token-file FILE  bearer token for moe-cached\n"
      "  --log-level L           debug, info, warning or error, any case\n"
      "                          (default $MOE_LOG_LEVEL or info)\n"
      "  --version               print the build and whether CUDA loads\n",
      rpc::SecurityFlagsUsage());
}

}  // namespace moe::worker
