// "Will it fit, and how fast?": the memory plan of one model on one machine
// (a GPU budget, a host budget), made from config.json alone, before any
// weight is downloaded. moectl plan prints it; moe-cached and moe-worker
// --dry-run print the part they own.
//
//   ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
//   PlanOptions o;
//   o.gpu_bytes = 24 * flags::kGiB;
//   o.host_bytes = 128 * flags::kGiB;
//   ASSIGN_OR_RETURN(Plan p, MakePlan(config, StoredFormatsFromConfig(config), o));
//   std::fputs(PlanText(p).c_str(), stdout);
//
// The accounting mirrors what the services hold:
//  - moe-worker keeps every non-expert tensor on its device (matrices in the
//    checkpoint's dtype, FP8 ones widened to BF16; vectors also as F32:
//    MoeModel) and an F32 KV cache of every layer (MLA: the latent,
//    Session::KvCacheBytes);
//  - moe-cached keeps every routed expert in host memory in the held format
//    (--expert-format, else q8 for FP8 and MXFP4 checkpoints, else as
//    stored) and an arena of `cache_slots` experts on the device;
//  - moe-cached caches what does not fit where the worker computes: when
//    every expert fits there (always without a GPU, where the host is that
//    device; with one, beside the dense weights, the KV cache and the
//    reserve) no moe-cached is planned (PlanOptions::daemon) and the
//    worker holds every expert itself (--cache none), once;
//  - asked for a daemon anyway without a GPU (daemon true), the host holds
//    the daemon's store and its arena too (every expert when they fit
//    twice, else one layer at most).
// A reserve of kDeviceReservePercent of the device budget is left for
// activations and the CUDA context.
//
// Predictions run the trace simulator (services/cache/simulator.h) on a
// synthetic trace of the model's shape (layers, experts, top-k) with the
// daemon's default policy, the plan's slots and miss mode, and the link and
// host figures; a layer's compute time is the bytes the device reads per
// token (dense + the routed experts) over its bandwidth (without a GPU, the
// CPU engine's measured rate when given), plus a fixed cost per layer
// (layer_overhead_us). Below one layer of
// slots (where the simulator refuses) the same cost model is applied in
// closed form: every miss runs on the host. Prefill adds the FLOP bound of
// the prompt's tokens. These are estimates for sizing, not measurements.
//
// Thread-safety: pure functions.
#ifndef MOECACHE_SERVICES_PLAN_PLAN_H_
#define MOECACHE_SERVICES_PLAN_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/model_config.h"
#include "common/model_desc.h"
#include "nlohmann/json.hpp"
#include "services/exchange/expert_exchange.h"

namespace moe::plan {

inline constexpr int64_t kDeviceReservePercent = 5;

// The dtypes a checkpoint stores: from config.json (torch_dtype and
// quantization_config) or, when the weights are present, from them.
struct StoredFormats {
  DType experts = DType::kBF16;  // kF8E4M3, kMxfp4, or a float dtype
  DType dense = DType::kBF16;    // the non-expert matrices
  // From the weights of a GGUF file, whose experts are held as stored
  // without --expert-format (their blocks, mixed types included; `experts`
  // is then the widest, ModelDescription::expert_dtype): the held format in
  // words ("Q4_K+Q6_K"), the largest expert and all of them. Empty and 0:
  // computed from `experts`.
  std::string held_name;
  int64_t held_expert_bytes = 0;
  int64_t held_all_expert_bytes = 0;
};
StoredFormats StoredFormatsFromConfig(const ModelConfig& config);
// The same read from the weights themselves.
StoredFormats StoredFormatsFromWeights(const ModelDescription& desc);

// What a model is, in counts and bytes.
struct ModelFigures {
  int64_t params_total = 0;    // every weight (MXFP4: 2 per byte; no scales)
  int64_t params_active = 0;   // per token: non-expert + top_k experts per MoE layer
  int64_t params_dense = 0;    // every weight that is not a routed expert
  int64_t expert_params = 0;   // one routed expert (with its biases)
  int64_t experts_total = 0;   // routed experts over all MoE layers
  int num_moe_layers = 0;
  int64_t experts_per_layer = 0;
  int64_t top_k = 0;
  StoredFormats stored;
  DType held_format = DType::kBF16;  // as moe-cached holds the experts (the widest if mixed)
  std::string held_name;             // the same in words ("q8", "Q4_K+Q6_K")
  int64_t expert_bytes = 0;          // one expert held so (biases as F32); the largest
  int64_t all_expert_bytes = 0;      // every routed expert held so
  int64_t dense_bytes_device = 0;    // the non-expert tensors on the device
  int64_t kv_bytes_per_token = 0;    // all layers, F32 (MLA: the latent)
  int64_t max_context = 0;           // positions a session holds at most (MoeModel)
};

// INVALID_ARGUMENT when `format` cannot hold the experts (rows not whole
// blocks of it). `format` unset: DefaultHeldFormat(stored.experts).
// REQUIRES: `config` validated (ParseModelConfig).
absl::StatusOr<ModelFigures> ComputeFigures(const ModelConfig& config,
                                            const StoredFormats& stored,
                                            std::optional<DType> format);

struct PlanOptions {
  std::string model_dir;    // for the flags printed
  int64_t gpu_bytes = 0;    // 0: no GPU, the host computes
  int64_t host_bytes = 0;   // > 0
  int64_t context = 4096;   // tokens per sequence, > 0
  int max_batch = 1;        // sequences at once, >= 1
  std::optional<DType> expert_format;
  std::optional<MissMode> miss_mode;  // unset: chosen (see MakePlan)
  double link_gbps = 25;        // host -> device, GB/s
  double host_gbps = 20;        // host memory read, GB/s
  double host_gflops = 100;     // the host expert kernel
  double device_gbps = 900;     // device memory read, GB/s (GPU; the host's without)
  double device_gflops = 50000; // device FLOP rate (GPU; host_gflops without)
  // Without a GPU: the rate at which the CPU engine reads weights in a
  // decode step, GB/s (moectl measures it: engine_calibration.h); 0: host_gbps.
  double cpu_engine_gbps = 0;
  // A MoE layer's fixed cost per step beyond its bytes and FLOPs, us: op
  // dispatch, the worker -> daemon round trip (moectl measures it for a CPU
  // worker; 0: none counted).
  double layer_overhead_us = 0;
  // Whether moe-cached serves the experts; unset: only with a GPU that
  // cannot hold every expert beside the rest. Otherwise its arena would
  // hold what the worker's own copy does, and every MoE layer's acquire is
  // a hand-off between processes, which a busy machine makes cost a
  // scheduler slice (docs/benchmarks.md, "The daemon's hand-offs under
  // contention"). false with a GPU that cannot hold them is a plan that
  // does not fit; a miss mode without a daemon is INVALID_ARGUMENT.
  std::optional<bool> daemon;
  std::string daemon_socket = "unix:/tmp/moe-cached.sock";
};

struct Plan {
  ModelFigures model;
  PlanOptions options;
  int64_t context = 0;           // options.context, at most model.max_context
  int64_t kv_bytes = 0;          // context x max_batch
  int64_t device_reserve = 0;
  int64_t device_needed = 0;     // dense + KV + reserve (GPU, or host without one)
  bool daemon = true;            // moe-cached is started (else daemon_flags is empty)
  int64_t cache_slots = 0;       // the arena, in experts (no daemon: every expert)
  double cache_fraction = 0;     // cache_slots / experts_total
  int64_t host_bytes = 0;        // host memory needed: every expert (+ all else without a GPU)
  MissMode miss_mode = MissMode::kFetch;  // no daemon: kFetch (every expert is resident)
  bool fits = false;
  std::vector<std::string> problems;     // why it does not fit
  std::vector<std::string> suggestions;  // what does, when it does not
  double layer_ms = 0;                   // decode compute per MoE layer per step
  double predicted_decode_tokens_per_s = 0;
  double predicted_prefill_tokens_per_s = 0;
  std::vector<std::string> daemon_flags;  // moe-cached's arguments; empty without a daemon
  std::vector<std::string> worker_flags;  // moe-worker's arguments
};

// The miss mode, when not given: fetch when every expert has a slot, auto
// (the daemon's cost model per miss) when at least one layer's experts do,
// else host (the experts run where they are). Without a GPU and with a
// daemon the arena holds every expert (fetch) when the host can hold them
// twice, else at most one layer (host).
// INVALID_ARGUMENT for options out of range, and for a miss mode given
// when the plan has no daemon.
absl::StatusOr<Plan> MakePlan(const ModelConfig& config, const StoredFormats& stored,
                              const PlanOptions& options);

// The plan as a person reads it, and as one JSON object (params_total,
// experts_total, expert_bytes, dense_bytes_device, kv_bytes_per_token,
// cache_slots, host_bytes, fits, predicted_decode_tokens_per_s, daemon,
// daemon_flags, worker_flags, ...).
std::string PlanText(const Plan& plan);
nlohmann::ordered_json PlanJson(const Plan& plan);

// The rate the computing device reads weights at, GB/s: device_gbps with a
// GPU; without one the CPU engine's (cpu_engine_gbps), else host_gbps.
double DeviceReadGbps(const PlanOptions& options);

// "1.5 GiB" for messages.
std::string HumanBytes(int64_t bytes);
// Arguments as a shell line (each quoted when it needs it).
std::string ShellLine(const std::string& program, const std::vector<std::string>& args);

}  // namespace moe::plan

#endif  // MOECACHE_SERVICES_PLAN_PLAN_H_
