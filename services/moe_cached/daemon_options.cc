#include "services/moe_cached/daemon_options.h"

#include <cmath>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/status_macros.h"
#include "services/flags/flag_groups.h"

namespace moe::cached {
namespace {

std::string Basename(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  size_t slash = dir.rfind('/');
  return slash == std::string::npos ? dir : dir.substr(slash + 1);
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

constexpr int64_t kIntMax = std::numeric_limits<int>::max();

// The daemon's own flags; the shared ones come from flag_groups.
void DeclareDaemonFlags(flags::FlagSet& f) {
  const DaemonOptions d;
  flag_groups::DeclareModel(f, /*repeatable=*/true);
  flag_groups::DeclareExpertFormat(f);
  flag_groups::DeclareDevice(f, d.device, /*backend_alias=*/false);
  flag_groups::DeclareCachePolicy(f, d.policy, d.prefetch);
  f.Int("cache-experts", -1, "arena slots per model (one of --cache-experts, --cache-bytes, "
        "--cache-fraction; default: half the experts on the CPU, what half the free "
        "memory holds on CUDA); below one layer's experts, "
        "down to 0, with --miss-mode host or auto", {.min = 0, .max = kIntMax});
  f.Size("cache-bytes", 0, "arena bytes per model, e.g. 24G", {.min = 1});
  f.Double("cache-fraction", 0,
           "arena as a fraction of the model's experts (on every device)",
           {.min = 0, .max = 1, .min_exclusive = true});
  flag_groups::DeclareLink(f, d.link_gbps);
  flag_groups::DeclareHostFigures(f, {.gbps = d.host_gbps, .gflops = d.host_gflops});
  flag_groups::DeclareServing(f, /*repeatable_listen=*/false, d.metrics_addr);
  f.Int("max-sessions", d.max_sessions, "attached workers at once", {.min = 1, .max = kIntMax});
  f.Double("drain-seconds", d.drain_seconds, "time running calls get at shutdown", {.min = 0});
  f.Group("state");
  f.String("state-dir", d.state_dir, "where the EAMC persists (default: not persisted)");
  f.Double("persist-seconds", d.persist_interval_seconds, "how often it is written",
           {.min = 0, .min_exclusive = true});
  flag_groups::DeclareLogLevel(f);
  f.Group("");
  f.Bool("version", false, "print the build and whether CUDA loads");
  flag_groups::DeclareDryRun(f);
  f.NoPositional();
  f.Notes(absl::StrCat("--listen defaults to ", DefaultListenAddress(),
                       " (unix:$RUNTIME_DIRECTORY/moe-cached.sock under systemd).\n"
                       "Sizes take K, M, G, T (powers of 1024: 24G = 24GiB).\n"));
}

// The capacity flags: at most one (each is positive when given).
absl::Status CapacityFromFlags(const flags::FlagSet& f, CapacitySpec* c) {
  int given = 0;
  for (const char* name : {"cache-experts", "cache-bytes", "cache-fraction"}) given += f.IsSet(name);
  if (given > 1) {
    return absl::InvalidArgumentError(
        "give only one of --cache-experts, --cache-bytes, --cache-fraction");
  }
  c->experts = f.IsSet("cache-experts") ? f.GetInt("cache-experts") : -1;
  c->bytes = static_cast<uint64_t>(f.GetSize("cache-bytes"));
  c->fraction = f.GetDouble("cache-fraction");
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
  flags::FlagSet f("moe-cached", "--model [NAME=]DIR [--model ...] [flags]");
  DeclareDaemonFlags(f);
  return f.Usage();
}

absl::StatusOr<DaemonOptions> ParseDaemonFlags(const std::vector<std::string>& args) {
  flags::FlagSet f("moe-cached", "");
  DeclareDaemonFlags(f);
  RETURN_IF_ERROR(f.Parse(args));
  DaemonOptions o;
  o.help = f.help();
  o.version = f.GetBool("version");
  o.dry_run = f.GetBool("dry-run");
  if (o.help || o.version) return o;
  for (const std::string& m : f.GetList("model")) RETURN_IF_ERROR(ParseModel(m, &o));
  if (o.models.empty()) return absl::InvalidArgumentError("at least one --model is required");
  RETURN_IF_ERROR(CapacityFromFlags(f, &o.capacity));
  o.expert_format = flag_groups::ExpertFormatFromFlags(f);
  o.device = f.GetString("device");
  o.policy = f.GetString("policy");
  o.prefetch = flag_groups::PrefetchFromFlags(f);
  o.link_gbps = f.GetDouble("link-gbps");
  o.miss_mode = flag_groups::MissModeFromFlags(f);
  o.host_gbps = f.GetDouble("host-gbps");
  o.host_gflops = f.GetDouble("host-gflops");  // 0: bandwidth only
  o.listen = f.GetString("listen");
  if (o.listen.empty()) o.listen = DefaultListenAddress();
  o.metrics_addr = f.GetString("metrics-addr");
  ASSIGN_OR_RETURN(o.security, flag_groups::SecurityFromFlags(f));
  o.max_sessions = static_cast<int>(f.GetInt("max-sessions"));
  o.drain_seconds = f.GetDouble("drain-seconds");
  o.state_dir = f.GetString("state-dir");
  o.persist_interval_seconds = f.GetDouble("persist-seconds");
  o.log_level = flag_groups::LogLevelFromFlags(f);
  return o;
}

absl::StatusOr<int> ComputeCapacity(const CapacitySpec& spec, const std::string& model,
                                    int num_layers, int num_experts, uint64_t block_bytes,
                                    uint64_t device_free_bytes, MissMode miss_mode) {
  const int64_t total = static_cast<int64_t>(num_layers) * num_experts;
  int64_t slots;
  std::string how;
  if (spec.experts >= 0) {
    slots = spec.experts;
    how = absl::StrCat("--cache-experts ", spec.experts);
  } else if (spec.bytes > 0) {
    slots = block_bytes > 0 ? static_cast<int64_t>(spec.bytes / block_bytes) : 0;
    how = absl::StrCat("--cache-bytes ", spec.bytes, " (", block_bytes, " bytes per expert)");
  } else if (spec.fraction <= 0 && device_free_bytes > 0) {
    const double bytes = std::floor(0.5 * static_cast<double>(device_free_bytes));
    slots = block_bytes > 0 ? static_cast<int64_t>(bytes / static_cast<double>(block_bytes)) : 0;
    how = absl::StrCat("the default, half of ", device_free_bytes, " free device bytes (",
                       block_bytes, " bytes per expert)");
  } else {
    double f = spec.fraction > 0 ? spec.fraction : 0.5;
    slots = static_cast<int64_t>(std::floor(f * static_cast<double>(total)));
    how = absl::StrCat("--cache-fraction ", f, " of ", total, " experts");
  }
  slots = std::min(slots, total);
  if (device_free_bytes > 0 && block_bytes > 0 &&
      static_cast<double>(slots) * static_cast<double>(block_bytes) >
          static_cast<double>(device_free_bytes)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model ", model, ": ", how, " gives ", slots, " slots of ", block_bytes,
        " bytes, more than the device's ", device_free_bytes,
        " free bytes; give fewer (--cache-experts, --cache-bytes or --cache-fraction)"));
  }
  if (slots < num_experts && miss_mode == MissMode::kFetch) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model ", model, ": ", how, " gives ", slots, " slots, fewer than one layer's ",
        num_experts, " experts; with --miss-mode fetch the cache needs at least ", num_experts,
        " (--miss-mode host or auto runs the misses that find no slot on the host)"));
  }
  return static_cast<int>(std::min(slots, total));
}

}  // namespace moe::cached
