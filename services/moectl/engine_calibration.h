// What this machine's CPU engine costs per decode step, measured in a
// second or so, for `moectl plan` and `moectl serve` to predict a CPU
// worker's speed from config.json alone.
//
// A decode step of a CPU worker takes, per MoE layer, a fixed part (the
// ops' dispatch over the thread pool, the router, the sampler's share) and
// a part that grows with the weights it reads; served through moe-cached,
// each MoE layer adds one worker -> daemon round trip over the
// shared-memory channel. The first
// two are fitted on two models made here (the `tiny` and `small` presets of
// the model's family: common/model_presets.h), each run in-process for a
// few dozen greedy tokens:
//   TPOT = layers x layer_us + bytes read per token / gbps
// (bytes as plan::DecodeBytesPerToken counts them, so the plan applies the
// fit to its own count); the round trip is timed on an in-process channel
// (services/channel) between two threads. These are this machine's figures
// at this moment: a busy machine measures slower.
//
// Thread-safety: runs threads of its own; call from one thread.
#ifndef MOECACHE_SERVICES_MOECTL_ENGINE_CALIBRATION_H_
#define MOECACHE_SERVICES_MOECTL_ENGINE_CALIBRATION_H_

#include "absl/status/statusor.h"
#include "common/model_config.h"

namespace moe::moectl {

struct EngineFigures {
  double layer_us = 0;    // fixed time per MoE layer per decode step (>= 0)
  double gbps = 0;        // weight bytes per second a decode step reads (> 0)
  double handoff_us = 0;  // one worker -> daemon round trip on the shm channel
};

// Writes the two models under a temporary directory (removed after), runs
// them on the CPU backend with the threads this process may use; times the
// round trip only `with_daemon` (else handoff_us is 0). Errors: what failed
// (a model that does not write or load, a channel error).
absl::StatusOr<EngineFigures> MeasureCpuEngine(ModelFamily family, bool with_daemon);

}  // namespace moe::moectl

#endif  // MOECACHE_SERVICES_MOECTL_ENGINE_CALIBRATION_H_
