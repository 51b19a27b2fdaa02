#include "services/flags/flag_groups.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log_level.h"
#include "common/quant.h"
#include "common/status_macros.h"

namespace moe::flag_groups {
namespace {

absl::Status NotEmpty(const std::string& value) {
  if (value.empty()) return absl::InvalidArgumentError("needs a non-empty value");
  return absl::OkStatus();
}

}  // namespace

void DeclareModel(FlagSet& f, bool repeatable) {
  f.Group("model");
  if (repeatable) {
    f.StringList("model",
                 "[NAME=]DIR: a Hugging Face checkpoint directory, served as NAME "
                 "(default: the directory's basename)");
  } else {
    f.String("model", "", "a Hugging Face checkpoint directory");
  }
}

void DeclareExpertFormat(FlagSet& f, const std::string& default_format) {
  f.Group("model");
  std::string help = "bf16, q8, q4 or mxfp4: the experts' format, converted at load";
  if (default_format.empty()) help += " (unset: as stored; q8 for FP8 and MXFP4 checkpoints)";
  f.String("expert-format", default_format, std::move(help),
           [](const std::string& value) { return ParseExpertFormat(value).status(); });
}

void DeclareRecordTrace(FlagSet& f) {
  f.Group("model");
  f.String("record-trace", "",
           "record the routing of every request to this moe-trace/1 file (created or "
           "truncated)");
}

std::optional<DType> ExpertFormatFromFlags(const FlagSet& f) {
  const std::string& name = f.GetString("expert-format");
  if (name.empty()) return std::nullopt;
  absl::StatusOr<DType> format = ParseExpertFormat(name);
  MOE_CHECK(format.ok()) << format.status();  // validated while parsing
  return *format;
}

void DeclareDevice(FlagSet& f, const std::string& default_device, bool backend_alias) {
  f.Group("device");
  f.Choice("device", default_device, {"cpu", "cuda", "auto"},
           "where experts live and run: cpu, cuda, or auto (cuda when a GPU is usable)");
  if (backend_alias) f.Alias("backend", "device");
}

void DeclareDryRun(FlagSet& f) {
  f.Bool("dry-run", false,
         "check every flag and the model, print the plan and the start line, and exit "
         "without loading experts");
}

void DeclareCpuThreads(FlagSet& f) {
  f.Group("device");
  f.Int("cpu-threads", 0,
        "threads of the CPU backend: every op of a CPU worker, the host-expert runs of a "
        "device worker (0: $MOE_CPU_THREADS, else the CPUs this process may use: its "
        "affinity mask and cgroup CPU quota)",
        {.min = 0, .max = 4096});
}

int CpuThreadsFromFlags(const FlagSet& f) { return static_cast<int>(f.GetInt("cpu-threads")); }

void DeclareCachePolicy(FlagSet& f, const std::string& default_policy, bool default_prefetch) {
  f.Group("cache");
  f.String("policy", default_policy, "the cache's eviction policy (moectl simulate --help lists them)");
  f.Choice("prefetch", default_prefetch ? "on" : "off", {"on", "off"},
           "prefetch the experts the policy predicts");
}

bool PrefetchFromFlags(const FlagSet& f) { return f.GetString("prefetch") == "on"; }

void DeclareLeasePart(FlagSet& f, int default_part) {
  f.Int("lease-part", default_part,
        "lease each layer's routed experts from moe-cached in parts of at most this many "
        "misses (hits ride along), each computed and released before the next is answered "
        "(its copies overlapping the part before), so that a cache a few layers' unions "
        "large keeps more of the other layers; 0: whole layers",
        {.min = 0, .max = 4096});
}

int LeasePartFromFlags(const FlagSet& f) { return static_cast<int>(f.GetInt("lease-part")); }

void DeclareLink(FlagSet& f, double default_gbps) {
  f.Group("link");
  f.Double("link-gbps", default_gbps,
           "host-to-device link bandwidth, GB/s (1e9 bytes/s); moe-cached: 0 leaves "
           "copies unpaced",
           {.min = 0});
}

void DeclareHostFigures(FlagSet& f, HostDefaults defaults) {
  f.Group("host execution");
  f.Choice("miss-mode", "fetch", {"fetch", "host", "auto"},
           "where misses of workers that can run experts on the host are served: "
           "fetch copies them, host runs them there, auto compares link and host");
  f.Double("host-gbps", defaults.gbps,
           "host memory read bandwidth, GB/s; moe-cached: 0 measures it at start", {.min = 0});
  f.Double("host-gflops", defaults.gflops,
           "host expert kernel speed, GFLOP/s; 0: bandwidth only (a host run costs its "
           "weight read alone)",
           {.min = 0});
}

MissMode MissModeFromFlags(const FlagSet& f) {
  MissMode mode = MissMode::kFetch;
  absl::Status s = ParseMissMode(f.GetString("miss-mode"), &mode);
  MOE_CHECK(s.ok()) << s;  // the choices are the modes
  return mode;
}

void DeclareServing(FlagSet& f, bool repeatable_listen, const std::string& default_metrics) {
  f.Group("serving");
  const char* listen_help = "gRPC address: unix:PATH or HOST:PORT";
  if (repeatable_listen) {
    f.StringList("listen", listen_help);
  } else {
    f.String("listen", "", listen_help);
  }
  f.String("metrics-addr", default_metrics, "Prometheus /metrics HOST:PORT (\"\" disables)");
  f.String("socket-group", "", "Unix sockets mode 0660 and this group (default: 0600)",
           NotEmpty);
  f.String("tls-cert", "", "PEM certificate: TLS on TCP listeners (with --tls-key)", NotEmpty);
  f.String("tls-key", "", "PEM private key of --tls-cert", NotEmpty);
  f.String("tls-client-ca", "", "require client certificates from this CA (mTLS)", NotEmpty);
  f.String("auth-token-file", "",
           "require 'authorization: Bearer <token>' (file mode 0600; health checks stay open)",
           NotEmpty);
}

absl::StatusOr<rpc::SecurityOptions> SecurityFromFlags(const FlagSet& f) {
  rpc::SecurityOptions s;
  s.socket_group = f.GetString("socket-group");
  s.tls_cert = f.GetString("tls-cert");
  s.tls_key = f.GetString("tls-key");
  s.tls_client_ca = f.GetString("tls-client-ca");
  s.auth_token_file = f.GetString("auth-token-file");
  RETURN_IF_ERROR(rpc::ValidateSecurityOptions(s));
  return s;
}

void DeclareChatTemplate(FlagSet& f, const std::vector<std::string>& builtins) {
  f.Group("chat");
  f.String("chat-template", "",
           absl::StrCat("chat template: a Jinja FILE (or a JSON file with chat_template) or a "
                        "built-in NAME (",
                        absl::StrJoin(builtins, ", "),
                        "); default: the model's tokenizer_config.json, else chatml with a "
                        "warning"));
}

void DeclareLogLevel(FlagSet& f) {
  f.Group("logging");
  f.String("log-level", "",
           "debug, info, warning or error, any case (default: $MOE_LOG_LEVEL or info)",
           [](const std::string& value) {
             return ParseLogLevel(value).ok()
                        ? absl::OkStatus()
                        : absl::InvalidArgumentError(absl::StrCat(
                              "want debug, info, warning or error, got '", value, "'"));
           });
}

std::optional<LogLevel> LogLevelFromFlags(const FlagSet& f) {
  if (!f.IsSet("log-level")) return std::nullopt;
  absl::StatusOr<LogLevel> level = ParseLogLevel(f.GetString("log-level"));
  MOE_CHECK(level.ok()) << level.status();  // validated while parsing
  return *level;
}

}  // namespace moe::flag_groups
