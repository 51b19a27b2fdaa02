#include "services/moe_cached/daemon_options.h"

#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log_level.h"
#include "common/quant.h"

namespace moe::cached {
namespace {

std::string Basename(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  size_t slash = dir.rfind('/');
  return slash == std::string::npos ? dir : dir.substr(slash + 1);
}

absl::Status BadValue(const std::string& flag, const std::string& value, const char* want) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, ": '", value, "' is not ", want));
}

absl::Status ParseModel(const std::string& value, DaemonOptions* o) {
  ModelSpec spec;
  size_t eq = value.find('=');
  if (eq != std::string::npos) {
    spec.name = value.substr(0, eq);
    spec.dir = value.substr(eq + 1);
  } else {
    spec.dir = value;
    spec.name = Basename(value);
  }
  if (spec.name.empty() || spec.dir.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--model: '", value, "' needs DIR or NAME=DIR"));
  }
  for (const ModelSpec& m : o->models) {
    if (m.name == spec.name) {
      return absl::InvalidArgumentError(absl::StrCat("--model: name '", spec.name,
                                                     "' given twice (use NAME=DIR)"));
    }
  }
  o->models.push_back(spec);
  return absl::OkStatus();
}

absl::Status SetFlag(const std::string& flag, const std::string& value, DaemonOptions* o) {
  auto positive_double = [&](double* out, bool allow_zero) -> absl::Status {
    double d;
    if (!absl::SimpleAtod(value, &d) || !std::isfinite(d) || d < 0 || (!allow_zero && d == 0)) {
      return BadValue(flag, value, allow_zero ? "a number >= 0" : "a number > 0");
    }
    *out = d;
    return absl::OkStatus();
  };
  if (flag == "model") return ParseModel(value, o);
  if (absl::Status s; rpc::ParseSecurityFlag(flag, value, &o->security, &s)) return s;
  if (flag == "listen") {
    o->listen = value;
  } else if (flag == "metrics-addr") {
    o->metrics_addr = value;
  } else if (flag == "cache-experts") {
    if (!absl::SimpleAtoi(value, &o->capacity.experts) || o->capacity.experts <= 0) {
      return BadValue(flag, value, "a positive integer");
    }
  } else if (flag == "cache-bytes") {
    if (!absl::SimpleAtoi(value, &o->capacity.bytes) || o->capacity.bytes == 0) {
      return BadValue(flag, value, "a positive integer");
    }
  } else if (flag == "cache-fraction") {
    if (!absl::SimpleAtod(value, &o->capacity.fraction) || !(o->capacity.fraction > 0) ||
        o->capacity.fraction > 1) {
      return BadValue(flag, value, "a fraction in (0, 1]");
    }
  } else if (flag == "policy") {
    o->policy = value;
  } else if (flag == "device") {
    if (value != "auto" && value != "cpu" && value != "cuda") {
      return BadValue(flag, value, "auto, cpu or cuda");
    }
    o->device = value;
  } else if (flag == "prefetch") {
    if (value != "on" && value != "off") return BadValue(flag, value, "on or off");
    o->prefetch = value == "on";
  } else if (flag == "link-gbps") {
    return positive_double(&o->link_gbps, true);
  } else if (flag == "miss-mode") {
    if (!ParseMissMode(value, &o->miss_mode).ok()) {
      return BadValue(flag, value, "fetch, host or auto");
    }
  } else if (flag == "host-gbps") {
    return positive_double(&o->host_gbps, true);
  } else if (flag == "host-gflops") {
    return positive_double(&o->host_gflops, false);
  } else if (flag == "expert-format") {
    absl::StatusOr<DType> format = ParseExpertFormat(value);
    if (!format.ok()) return BadValue(flag, value, "bf16, q8 or q4");
    o->expert_format = *format;
  } else if (flag == "state-dir") {
    o->state_dir = value;
  } else if (flag == "persist-seconds") {
    return positive_double(&o->persist_interval_seconds, false);
  } else if (flag == "drain-seconds") {
    return positive_double(&o->drain_seconds, true);
  } else if (flag == "log-level") {
    absl::StatusOr<LogLevel> level = ParseLogLevel(value);
    if (!level.ok()) return BadValue(flag, value, "debug, info, warning or error");
    o->log_level = *level;
  } else if (flag == "max-sessions") {
    if (!absl::SimpleAtoi(value, &o->max_sessions) || o->max_sessions <= 0) {
      return BadValue(flag, value, "a positive integer");
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown flag --", flag));
  }
  return absl::OkStatus();
}

}  // namespace

std::string DefaultListenAddress() {
  const char* runtime = std::getenv("RUNTIME_DIRECTORY");
  if (runtime != nullptr && runtime[0] != '\0') {
    std::string dir = runtime;
    dir = dir.substr(0, dir.find(':'));  // systemd may list several
    return absl::StrCat("unix:", dir, "/moe-cached.sock");
  }
  return "unix:/tmp/moe-cached.sock";
}

std::string DaemonUsage() {
  return "usage: moe-cached --model [NAME=]DIR [--model ...]\n"
         "  [--listen unix:PATH|HOST:PORT]  (default " + DefaultListenAddress() + ")\n"
         "  [--metrics-addr HOST:PORT|\"\"]    (default 127.0.0.1:9464; empty disables)\n"
         "  [--cache-experts N | --cache-bytes B | --cache-fraction F]  (default F=0.5)\n"
         "  [--device auto|cpu|cuda]  (default cpu; on cuda F is of free device memory)\n"
         "  [--policy NAME] [--prefetch on|off] [--link-gbps G]\n"
         "  [--miss-mode fetch|host|auto]  (default fetch: misses are copied; host/auto\n"
         "      answer misses of CPU workers 'run on host'; auto compares link and host)\n"
         "  [--host-gbps G]  (host read bandwidth; default 0: measured at start)\n"
         "  [--host-gflops F]  (host expert kernel, default 100)\n"
         "  [--expert-format bf16|q8|q4|mxfp4]  (default: as stored, q8 for FP8 and MXFP4 checkpoints; converted at load)\n"
         "  [--state-dir DIR] [--persist-seconds S] [--drain-seconds S]\n"
         "  [--max-sessions N]  (default 64 attached workers)\n"
         "  [--log-level debug|info|warning|error]  (any case; default $MOE_LOG_LEVEL or info)\n"
         "  [--version] [--help]\n" +
         rpc::SecurityFlagsUsage();
}

absl::StatusOr<DaemonOptions> ParseDaemonFlags(const std::vector<std::string>& args) {
  DaemonOptions o;
  int capacity_flags = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      o.help = true;
      continue;
    }
    if (arg == "--version") {
      o.version = true;
      continue;
    }
    if (!absl::StartsWith(arg, "--") || arg.size() == 2) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string flag = arg.substr(2), value;
    size_t eq = flag.find('=');
    if (eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, " needs a value"));
    }
    if (absl::StartsWith(flag, "cache-")) ++capacity_flags;
    absl::Status s = SetFlag(flag, value, &o);
    if (!s.ok()) return s;
  }
  if (o.help || o.version) return o;
  if (capacity_flags > 1) {
    return absl::InvalidArgumentError(
        "give only one of --cache-experts, --cache-bytes, --cache-fraction");
  }
  if (o.models.empty()) return absl::InvalidArgumentError("at least one --model is required");
  if (o.listen.empty()) o.listen = DefaultListenAddress();
  if (absl::Status s = rpc::ValidateSecurityOptions(o.security); !s.ok()) return s;
  return o;
}

absl::StatusOr<int> ComputeCapacity(const CapacitySpec& spec, const std::string& model,
                                    int num_layers, int num_experts, uint64_t block_bytes,
                                    uint64_t device_free_bytes) {
  const int64_t total = static_cast<int64_t>(num_layers) * num_experts;
  int64_t slots;
  std::string how;
  if (spec.experts > 0) {
    slots = spec.experts;
    how = absl::StrCat("--cache-experts ", spec.experts);
  } else if (spec.bytes > 0) {
    slots = block_bytes > 0 ? static_cast<int64_t>(spec.bytes / block_bytes) : 0;
    how = absl::StrCat("--cache-bytes ", spec.bytes, " (", block_bytes, " bytes per expert)");
  } else if (device_free_bytes > 0) {
    double f = spec.fraction > 0 ? spec.fraction : 0.5;
    const double bytes = std::floor(f * static_cast<double>(device_free_bytes));
    slots = block_bytes > 0 ? static_cast<int64_t>(bytes / static_cast<double>(block_bytes)) : 0;
    how = absl::StrCat("--cache-fraction ", f, " of ", device_free_bytes,
                       " free device bytes (", block_bytes, " bytes per expert)");
  } else {
    double f = spec.fraction > 0 ? spec.fraction : 0.5;
    slots = static_cast<int64_t>(std::floor(f * static_cast<double>(total)));
    how = absl::StrCat("--cache-fraction ", f, " of ", total, " experts");
  }
  if (slots < num_experts) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model ", model, ": ", how, " gives ", slots, " slots, fewer than one layer's ",
        num_experts, " experts; the cache needs at least ", num_experts));
  }
  return static_cast<int>(std::min(slots, total));
}

}  // namespace moe::cached
