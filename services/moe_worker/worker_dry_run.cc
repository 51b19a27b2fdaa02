// Worker::DryRun (worker.h): Start's checks and the plan, nothing loaded.
#include <filesystem>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/moe_worker/worker.h"
#include "services/plan/plan.h"
#include "services/rpc/build_info.h"
#include "services/rpc/startup_log.h"

namespace moe::worker {
namespace {

// The sessions' KV cache: per token, per sequence and at --max-batch.
std::string KvText(const plan::ModelFigures& m, const RunnerOptions& r) {
  const int64_t sequence = m.kv_bytes_per_token * m.max_context;
  std::string s = absl::StrCat(m.kv_bytes_per_token, " B per token (f32); ",
                               plan::HumanBytes(sequence), " per sequence of ", m.max_context,
                               " positions; --max-batch ", r.max_batch);
  if (r.kv_budget_bytes > 0) {
    absl::StrAppend(&s, ", --kv-budget-mb ", plan::HumanBytes(r.kv_budget_bytes));
  } else if (r.max_batch > 1) {
    absl::StrAppend(&s, ", up to ", plan::HumanBytes(sequence * r.max_batch), " (no --kv-budget-mb)");
  }
  return s;
}

}  // namespace

absl::StatusOr<std::string> Worker::DryRun(const WorkerOptions& options) {
  Worker w(options);
  ASSIGN_OR_RETURN(std::vector<rpc::ListenAddress> listen, w.ListenAddresses());
  RETURN_IF_ERROR(w.CheckOptions(listen));
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend(options.backend));
  ASSIGN_OR_RETURN(ModelDescription desc, ModelDescription::Open(options.model_dir));
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::ForModel(options.model_dir);
  if (!tokenizer.ok() && !absl::IsNotFound(tokenizer.status())) return tokenizer.status();
  const bool has_tokenizer = tokenizer.ok();
  if (!options.http.listen.empty()) {
    RETURN_IF_ERROR(openai::ChatTemplate::FromModelDir(options.model_dir).status());
  }
  const plan::StoredFormats stored = plan::StoredFormatsFromWeights(desc);
  ASSIGN_OR_RETURN(plan::ModelFigures m,
                   plan::ComputeFigures(desc.config(), stored, std::nullopt));
  const std::string name = w.ModelName();
  std::string experts;
  if (options.cache == "none") {
    ASSIGN_OR_RETURN(rpc::HeldExperts held, InProcessExperts(desc, options.expert_format));
    experts = absl::StrCat("in this process, ",
                           plan::HumanBytes(static_cast<int64_t>(held.total_bytes)), " as ",
                           held.format, " (--cache none)");
  } else {
    experts = absl::StrCat("moe-cached at ", options.cache, " (model '",
                           options.cache_model.empty() ? name : options.cache_model,
                           "'; not contacted)");
  }
  std::string listen_text;
  for (const std::string& a : options.listen.empty() ? std::vector<std::string>{kDefaultListen}
                                                    : options.listen) {
    absl::StrAppend(&listen_text, listen_text.empty() ? "" : ", ", a);
  }
  std::string out = "moe-worker --dry-run: every flag, path and the model check out; nothing loaded\n";
  absl::StrAppend(&out, "model:    ", name, " (", rpc::ModelSummary(desc), ") in ",
                  options.model_dir, "\n");
  absl::StrAppend(&out, "backend:  ", backend->Info().name, " (", backend->Info().device_name,
                  "); dense weights ", plan::HumanBytes(m.dense_bytes_device), "\n");
  absl::StrAppend(&out, "KV cache: ",
                  KvText(m, serving::ResolveAutoBatch(options.runner, m.kv_bytes_per_token,
                                                      m.max_context)),
                  options.runner.max_batch == 0 ? " (auto)" : "", "\n");
  absl::StrAppend(&out, "experts:  ", experts, "\n");
  const std::string tokenizer_from = absl::EndsWith(options.model_dir, ".gguf")
                                         ? options.model_dir
                                         : options.model_dir + "/tokenizer.json";
  absl::StrAppend(&out, "tokenizer: ",
                  has_tokenizer ? tokenizer_from : std::string("none (prompt_token_ids only)"),
                  "\n");
  absl::StrAppend(&out, "start:    ", VersionLine("moe-worker"), " serving model ", name,
                  " on ", listen_text, ", backend ", backend->Info().name, ", metrics ",
                  options.metrics_addr.empty() ? "off" : options.metrics_addr,
                  options.http.listen.empty() ? "" : absl::StrCat(", HTTP ", options.http.listen),
                  "; experts: ", experts, "\n");
  return out;
}

}  // namespace moe::worker
