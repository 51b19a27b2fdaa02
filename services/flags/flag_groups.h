// The flags that more than one binary takes, declared once: moe-cached,
// moe-worker and the moectl commands call these, so a flag has the same
// name, type, help text and meaning everywhere (tests/common/
// flag_consistency_test.cc holds them to it). Only the defaults differ
// between binaries, and they are arguments here.
//
// Groups (each Declare* starts a help section of that name):
//   model:   --model, --expert-format, --record-trace
//   device:  --device cpu|cuda|auto (old spelling --backend, which warns),
//            --cpu-threads
//   cache:   --policy, --prefetch on|off
//   link:    --link-gbps
//   host:    --miss-mode fetch|host|auto, --host-gbps, --host-gflops
//            (--host-gflops 0 means "bandwidth only": the cost model
//            charges a host run its weight read alone, miss_planner.h)
//   serving: --listen, --metrics-addr, --socket-group, --tls-cert, --tls-key,
//            --tls-client-ca, --auth-token-file
//   chat:    --chat-template FILE|NAME
//   logging: --log-level
//
// Every From* reads a FlagSet that declared the group and parsed OK.
#ifndef MOECACHE_SERVICES_FLAGS_FLAG_GROUPS_H_
#define MOECACHE_SERVICES_FLAGS_FLAG_GROUPS_H_

#include <optional>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/flags.h"
#include "common/logging.h"
#include "services/exchange/expert_exchange.h"
#include "services/rpc/security.h"

namespace moe::flag_groups {

using flags::FlagSet;

// --model: one checkpoint directory (String), or with `repeatable` several
// [NAME=]DIR (StringList; moe-cached serves several models).
void DeclareModel(FlagSet& f, bool repeatable);

// --expert-format bf16|q8|q4|mxfp4: the format the experts are converted
// to at load. `default_format` "" : unset means the checkpoint's own format
// (q8 for FP8 and MXFP4 checkpoints).
void DeclareExpertFormat(FlagSet& f, const std::string& default_format = "");
std::optional<DType> ExpertFormatFromFlags(const FlagSet& f);

// --device cpu|cuda|auto, and --backend as its old spelling when
// `backend_alias` (moe-worker and moectl run spelled it so).
void DeclareDevice(FlagSet& f, const std::string& default_device, bool backend_alias);

// --cpu-threads N: the CPU backend's threads (a CPU worker's every op, a
// device worker's host-expert runs); 0: $MOE_CPU_THREADS, else the CPUs
// this process may use (affinity mask and cgroup quota). Apply with
// CpuThreadsFromFlags before the first backend is made.
void DeclareCpuThreads(FlagSet& f);
int CpuThreadsFromFlags(const FlagSet& f);

// --record-trace FILE: the routing of every request, as moe-trace/1.
void DeclareRecordTrace(FlagSet& f);

// --policy NAME and --prefetch on|off.
void DeclareCachePolicy(FlagSet& f, const std::string& default_policy, bool default_prefetch);
bool PrefetchFromFlags(const FlagSet& f);

// --lease-part N: a layer leased in parts of at most N misses (moe-worker;
// moectl simulate replays it), 0: whole layers.
void DeclareLeasePart(FlagSet& f, int default_part);
int LeasePartFromFlags(const FlagSet& f);

// --link-gbps G (GB/s, 1e9 bytes/s, >= 0).
void DeclareLink(FlagSet& f, double default_gbps);

struct HostDefaults {
  double gbps = 0;
  double gflops = 100;
};
// --miss-mode, --host-gbps, --host-gflops (both >= 0).
void DeclareHostFigures(FlagSet& f, HostDefaults defaults);
MissMode MissModeFromFlags(const FlagSet& f);

// --listen (repeatable when `repeatable`), --metrics-addr and the five
// server security flags of rpc/security.h.
void DeclareServing(FlagSet& f, bool repeatable_listen, const std::string& default_metrics);
// The security flags; INVALID_ARGUMENT for an empty value or a combination
// ValidateSecurityOptions refuses.
absl::StatusOr<rpc::SecurityOptions> SecurityFromFlags(const FlagSet& f);

// --chat-template FILE|NAME: the template chat requests are rendered with
// (`builtins` are the NAMEs, listed in the help); unset: the model's own,
// else ChatML (openai::ChatTemplate::Resolve).
void DeclareChatTemplate(FlagSet& f, const std::vector<std::string>& builtins);

// --dry-run: check every flag and the model, print the plan and the start
// line, exit 0 without loading any expert (moe-cached and moe-worker).
void DeclareDryRun(FlagSet& f);

// --log-level debug|info|warning|error, any case; unset: MOE_LOG_LEVEL or
// info.
void DeclareLogLevel(FlagSet& f);
std::optional<LogLevel> LogLevelFromFlags(const FlagSet& f);

}  // namespace moe::flag_groups

#endif  // MOECACHE_SERVICES_FLAGS_FLAG_GROUPS_H_
