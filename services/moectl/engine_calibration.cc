#include "services/moectl/engine_calibration.h"

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/model_maker.h"
#include "common/cpu_budget.h"
#include "common/model_presets.h"
#include "common/status_macros.h"
#include "kernels/backend.h"
#include "services/channel/shm_channel.h"
#include "services/engine/generator.h"
#include "services/engine/in_memory_provider.h"
#include "services/engine/moe_model.h"
#include "services/plan/plan.h"
#include "services/plan/predict.h"

namespace moe::moectl {
namespace {

constexpr int kTokens = 64;  // per run; the first (prefill) is not timed
constexpr int kRuns = 5;     // per model: the median TPOT
constexpr int kBatches = 9;  // of kBatch round trips: the median batch's mean
constexpr int kBatch = 200;

struct Point {
  double layers = 0;
  double bytes = 0;  // read per token
  double tpot_s = 0;
};

absl::StatusOr<Point> Measure(const std::string& dir, const std::string& preset,
                              ModelFamily family, Backend* backend) {
  ASSIGN_OR_RETURN(MakeModelOptions o, PresetOptions(preset, family));
  const std::string path = absl::StrCat(dir, "/", preset);
  RETURN_IF_ERROR(MakeModel(o, path));
  ASSIGN_OR_RETURN(std::unique_ptr<MoeModel> model, MoeModel::Load(path, backend));
  ASSIGN_OR_RETURN(std::unique_ptr<InMemoryExpertProvider> experts,
                   InMemoryExpertProvider::Create(*model, std::nullopt));
  const ModelConfig& c = model->config();
  ASSIGN_OR_RETURN(plan::ModelFigures m,
                   plan::ComputeFigures(c, plan::StoredFormatsFromConfig(c), std::nullopt));
  GenerateOptions g;
  g.prompt = {1, 2, 3};
  g.max_new_tokens = kTokens;
  g.stop_at_eos = false;
  std::vector<double> tpots;
  for (int run = 0; run < kRuns; ++run) {
    ASSIGN_OR_RETURN(GenerateSummary s,
                     Generate(*model, experts.get(), g, [](const SampledToken&) { return true; }));
    tpots.push_back(s.tpot_seconds);
  }
  std::sort(tpots.begin(), tpots.end());
  Point p;
  p.layers = m.num_moe_layers;
  p.bytes = m.num_moe_layers * plan::DecodeBytesPerLayer(c, m, 1);
  p.tpot_s = tpots[tpots.size() / 2];
  return p;
}

// A MoE layer's exchange between two threads, as a worker's cache client
// has it (services/client/cache_client.cc): an acquire and its reply, then
// the report of the layer's host runs and the release of its leases (no
// reply). The median over kBatches of each batch's mean (one descheduled
// batch does not count).
absl::StatusOr<double> HandoffMicros() {
  const size_t bytes = channel::ChannelBytes();
  std::unique_ptr<char[]> mem(new char[bytes]());
  channel::InitChannel(mem.get());
  channel::ChannelServer server(mem.get());
  channel::ChannelClient client(mem.get());
  absl::Status served;
  std::thread daemon([&] {
    channel::RequestMsg req;
    channel::ResponseMsg reply{};
    for (int i = 0; i < 3 * kBatches * kBatch; ++i) {
      absl::StatusOr<bool> got = server.Receive(&req, absl::Seconds(10));
      if (!got.ok() || !*got) {
        served = got.ok() ? absl::DeadlineExceededError("no request") : got.status();
        return;
      }
      if (req.type != static_cast<uint32_t>(channel::MsgType::kAcquire)) continue;
      reply.seq = req.seq;
      if (absl::Status s = server.Reply(reply); !s.ok()) {
        served = s;
        return;
      }
    }
  });
  // A CPU worker's pool takes every core it may use and spins between
  // ops: the daemon's thread then takes a core from it. So does this one.
  std::atomic<bool> stop{false};
  std::vector<std::thread> pool;
  for (int i = 1; i < UsableCpus(); ++i) {
    pool.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  }
  absl::Cleanup join_pool = [&] {
    stop = true;
    for (std::thread& t : pool) t.join();
  };
  absl::Status asked;
  auto request = std::make_unique<channel::RequestMsg>();
  auto reply = std::make_unique<channel::ResponseMsg>();
  std::vector<double> means;
  for (int b = 0; b < kBatches && asked.ok(); ++b) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kBatch && asked.ok(); ++i) {
      *request = channel::RequestMsg{};
      request->type = static_cast<uint32_t>(channel::MsgType::kAcquire);
      asked = client.Call(*request, reply.get(), absl::Seconds(10));
      for (channel::MsgType type : {channel::MsgType::kHostRuns, channel::MsgType::kRelease}) {
        if (!asked.ok()) break;
        *request = channel::RequestMsg{};
        request->type = static_cast<uint32_t>(type);
        if (type == channel::MsgType::kHostRuns) request->count = 1;
        asked = client.Post(*request, absl::Seconds(10));
      }
    }
    means.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / kBatch);
  }
  if (!asked.ok()) server.Close();
  daemon.join();
  RETURN_IF_ERROR(asked);
  RETURN_IF_ERROR(served);
  std::sort(means.begin(), means.end());
  return means[means.size() / 2] * 1e6;
}

}  // namespace

absl::StatusOr<EngineFigures> MeasureCpuEngine(ModelFamily family, bool with_daemon) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "moectl-calib.XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("cannot make a directory like ", tmpl));
  }
  absl::Cleanup remove = [&] {
    std::error_code ec;
    std::filesystem::remove_all(tmpl, ec);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend("cpu"));
  ASSIGN_OR_RETURN(Point a, Measure(tmpl, "tiny", family, backend.get()));
  ASSIGN_OR_RETURN(Point b, Measure(tmpl, "small", family, backend.get()));
  // TPOT = layers x layer_us + bytes / rate, through both points; where
  // noise makes that meaningless (a negative part), the larger model's
  // TPOT is all read time.
  EngineFigures f;
  const double det = a.layers * b.bytes - b.layers * a.bytes;
  double per_layer = 0, per_byte = 0;
  if (det != 0) {
    per_layer = (a.tpot_s * b.bytes - b.tpot_s * a.bytes) / det;
    per_byte = (a.layers * b.tpot_s - b.layers * a.tpot_s) / det;
  }
  if (!(per_layer >= 0 && per_byte > 0)) {
    per_layer = 0;
    per_byte = b.tpot_s / b.bytes;
  }
  f.layer_us = per_layer * 1e6;
  f.gbps = 1.0 / per_byte / 1e9;
  if (with_daemon) {
    ASSIGN_OR_RETURN(f.handoff_us, HandoffMicros());
  }
  return f;
}

}  // namespace moe::moectl
