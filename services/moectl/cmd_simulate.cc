// moectl simulate: replays a moe-trace/1 trace through the cache library on a
// virtual clock (services/cache/simulator.h) and reports per policy.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/model_config.h"
#include "common/quant.h"
#include "services/cache/policy.h"
#include "services/cache/simulator.h"
#include "services/cache/trace_stats.h"
#include "services/flags/flag_groups.h"
#include "services/moectl/commands.h"
#include "services/moectl/flags.h"
#include "services/moectl/plan_flags.h"
#include "services/plan/plan.h"

namespace moe::moectl {
namespace {

constexpr char kSynopsis[] =
    "--trace FILE.jsonl --policy NAME|all|A,B,... (--capacity N | --capacity-frac F)\n"
    "                       [flags]\n"
    "       moectl simulate --trace FILE --policy ... --sweep F1,F2,... --out PREFIX";

constexpr char kNotes[] =
    "policies: belady lru lfu lru-layer minvisit expertflow moe-infinity moe-infinity-paper\n"
    "          static-popular static-layers static-popular-oracle (for host execution)\n"
    "          oracle (Belady's eviction, and copies behind and prefetches of exactly\n"
    "          the experts used next: a perfect predictor's bound; with --prefetch on)\n"
    "          (moe-infinity options: moe-infinity:fair_share=0,lrfu=1,...)\n"
    "--prefetch defaults to off here, while moe-cached prefetches by default:\n"
    "pass --prefetch on to model a daemon as shipped.\n"
    "--passes K replays the trace K times and reports the last pass (warm EAMC).\n"
    "--batch N replays the requests N at a time (continuous batching: they join\n"
    "in arrival order; each step's layer is one acquire for the union of their\n"
    "experts); per-token figures divide by tokens, tpot_ms is per step.\n"
    "--batch-members off makes that acquire for the oldest member alone (its\n"
    "per-request state sees the union), default on: each member's own row.\n"
    "--hints off ignores the trace's pre-gating hints (default on: replayed in\n"
    "decode). A trace with hints also gets their recall and precision (a line\n"
    "before the table; \"hints\" in each --json row).\n"
    "--sweep writes PREFIX.csv and, when gnuplot is installed, PREFIX.png.\n"
    "--miss-mode: where misses are served (default fetch): copied into a slot,\n"
    "run on the host from host memory (--host-gbps, > 0 here; --host-gflops), or\n"
    "per miss by the daemon's cost model (auto). A layer then takes\n"
    "stall + max(T, its host runs); host runs and host ms per token are reported.\n"
    "--progress auto (the default) shows each run's progress on stderr when stderr\n"
    "is a terminal.\n"
    "Every flag, policy and capacity is checked before the first run.\n"
    "Expert size, first that applies: --expert-mb (a bf16 size); --model DIR\n"
    "(the checkpoint the trace is of: its config.json, and its weights'\n"
    "formats when present, sized as moe-cached holds them); the trace header's\n"
    "\"expert_params\" (moe-worker --record-trace writes it; as bf16); else the\n"
    "default. The table's first line, every --json row and a sweep's CSV say\n"
    "which. --expert-format q8|q4 sizes the experts in that format (x 17/32 for\n"
    "q8, x 9/32 for q4 of bf16: common/quant.h), as moe-cached --expert-format\n"
    "stores them.\n";

void DeclareFlags(FlagSet& f) {
  const cache::SimOptions d;
  f.String("trace", "", "moe-trace/1 file to replay (required)");
  f.Int("capacity", 0, "cache slots", {.min = 1, .max = std::numeric_limits<int>::max()});
  f.Double("capacity-frac", 0, "cache slots as a fraction of the model's experts",
           {.min = 0, .max = 1, .min_exclusive = true});
  f.String("sweep", "", "capacity fractions F1,F2,...: one run each (with --out)");
  f.String("out", "", "PREFIX of a sweep's .csv and .png");
  f.Int("passes", d.passes, "replay the trace this many times",
        {.min = 1, .max = std::numeric_limits<int>::max()});
  f.Int("batch", d.batch, "requests replayed together", {.min = 1, .max = cache::kMaxSimBatch});
  f.Choice("batch-members", "on", {"on", "off"}, "each member's own row in a batch's acquire");
  flag_groups::DeclareLeasePart(f, d.lease_part);
  f.Choice("hints", "on", {"on", "off"}, "replay the trace's pre-gating hints");
  f.Choice("progress", "auto", {"on", "off", "auto"}, "progress on stderr");
  f.Bool("json", false, "one JSON object per run");
  flag_groups::DeclareCachePolicy(f, "", d.prefetch);
  flag_groups::DeclareExpertFormat(f);
  flag_groups::DeclareLink(f, d.link.link_gbps);
  f.Double("expert-mb", d.link.expert_mb, "bytes per bf16 expert / 1e6",
           {.min = 0, .min_exclusive = true});
  f.String("model", "",
           "a Hugging Face checkpoint directory: the one the trace was recorded on (sizes its "
           "experts)");
  f.Double("layer-ms", d.link.layer_ms, "compute per MoE layer per iteration, ms", {.min = 0});
  f.Double("chunk-mb", d.link.chunk_mb, "transfer chunk, MB (preemption granularity)",
           {.min = 0, .min_exclusive = true});
  flag_groups::DeclareHostFigures(f, {.gbps = d.host_gbps, .gflops = d.host_gflops});
  f.Notes(kNotes);
}

std::vector<std::string> PolicyList(const std::string& spec) {
  if (spec != "all") {
    // "a,b:x=1,y=0" -> {"a", "b:x=1,y=0"}: option items stay with their policy.
    std::vector<std::string> out;
    for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
      const bool option = item.find('=') != absl::string_view::npos &&
                          item.find(':') == absl::string_view::npos;
      if (option && !out.empty()) {
        out.back() += "," + std::string(item);
      } else {
        out.emplace_back(item);
      }
    }
    return out;
  }
  std::vector<std::string> out = {"belady", "static-popular-oracle"};
  for (const auto& n : cache::OnlinePolicyNames()) out.push_back(n);
  return out;
}

// What the figures assume (the trace holds routing, not sizes), then the
// columns, each with its unit: slots, a ratio, counts, ms per token, a
// ratio, the prefill's hit rate, host runs per token.
// `assumption`: Assumption(plan).
void PrintTableHeader(const std::string& assumption) {
  std::printf("assuming %s\n", assumption.c_str());
  std::printf("%-22s %8s %8s %9s %8s %8s %10s %9s %9s %9s %7s %9s\n", "policy", "slots",
              "hit_rate", "misses", "pf_iss", "pf_used", "stall_ms/t", "tpot_ms", "floor_ms",
              "tpot/flr", "pfl_hit", "host_r/t");
}

void PrintRow(const nlohmann::json& j) {
  std::printf("%-22s %8d %8.4f %9llu %8llu %8llu %10.3f %9.3f %9.3f %9.3f %7.4f %9.3f\n",
              j["policy"].get<std::string>().c_str(), j["capacity"].get<int>(),
              j["hit_rate"].get<double>(), (unsigned long long)j["misses"].get<uint64_t>(),
              (unsigned long long)j["prefetches_issued"].get<uint64_t>(),
              (unsigned long long)j["prefetches_used"].get<uint64_t>(),
              j["stall_ms_per_token"].get<double>(), j["tpot_ms"].get<double>(),
              j["floor_tpot_ms"].get<double>(), j["tpot_over_floor"].get<double>(),
              j["prefill"]["hit_rate"].get<double>(), j["host_runs_per_token"].get<double>());
}

// The hint figures for the trace (null when it has none): printed once and
// added to every --json row, with whether the simulation replays them.
nlohmann::json HintReport(const trace::Trace& t, bool replay, bool json) {
  auto s = trace::ComputeHintStats(t);
  if (!s.ok() || s->hinted_pairs == 0) return nullptr;
  nlohmann::json j = trace::HintStatsJson(*s);
  j["replayed"] = replay;
  if (!json) {
    std::printf("hints: recall %.4f precision %.4f over %lld token-layers of %d requests (%s)\n",
                s->recall(), s->precision(), static_cast<long long>(s->hinted_pairs),
                s->requests_with_hints, replay ? "replayed" : "not replayed: --hints off");
  }
  return j;
}

// One line on stderr, rewritten in place, while the runs go on.
class Progress {
 public:
  Progress(bool on, int total_runs) : on_(on), total_(total_runs) {}
  ~Progress() {
    if (on_ && shown_) std::fputs("\r\033[K", stderr);
  }
  // The callback for run `name` (the next one).
  std::function<void(double)> Next(const std::string& name) {
    if (!on_) return nullptr;
    ++run_;
    last_percent_ = -1;
    return [this, name](double done) {
      const int percent = static_cast<int>(done * 100);
      if (percent == last_percent_) return;
      last_percent_ = percent;
      shown_ = true;
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      // All runs so far done alike: the rest at the same pace.
      const double all = (run_ - 1 + done) / std::max(1, total_);
      std::string eta = "";
      if (all > 0.01) eta = absl::StrFormat(", about %.0f s left", elapsed * (1 - all) / all);
      std::fprintf(stderr, "\rsimulate: run %d/%d (%s) %3d%%, %.0f s elapsed%s\033[K", run_,
                   total_, name.c_str(), percent, elapsed, eta.c_str());
      std::fflush(stderr);
    };
  }

 private:
  const bool on_;
  const int total_;
  int run_ = 0;
  int last_percent_ = -1;
  bool shown_ = false;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// Runs every policy at one capacity; returns the reports.
int RunAt(const trace::Trace& t, const std::vector<std::string>& policies,
          cache::SimOptions o, const std::string& expert_mb_from, bool json, bool print,
          std::vector<nlohmann::json>* out, const nlohmann::json& hints, Progress& progress) {
  const std::string at = absl::StrCat(" at ", o.capacity, " slots");
  o.progress = progress.Next("belady" + at);
  auto belady = cache::Simulate(t, "belady", o);
  if (!belady.ok()) {
    std::fprintf(stderr, "simulate: %s\n", std::string(belady.status().message()).c_str());
    return 2;
  }
  for (const auto& p : policies) {
    if (p != "belady") o.progress = progress.Next(p + at);
    absl::StatusOr<cache::SimResult> r = p == "belady" ? belady : cache::Simulate(t, p, o);
    if (!r.ok()) {
      std::fprintf(stderr, "simulate: %s\n", std::string(r.status().message()).c_str());
      return 2;
    }
    nlohmann::json j = cache::ReportJson(t.header, o, *r, *belady);
    j["expert_mb"] = o.link.expert_mb;
    j["expert_mb_from"] = expert_mb_from;
    j["link_gbps"] = o.link.link_gbps;
    j["layer_ms"] = o.link.layer_ms;
    if (!hints.is_null()) j["hints"] = hints;
    if (print) {
      if (json) {
        std::printf("%s\n", j.dump().c_str());
      } else {
        PrintRow(j);
      }
      std::fflush(stdout);
    }
    out->push_back(std::move(j));
  }
  return 0;
}

// `assumption`: the table's first line, the plot's title.
int WriteSweep(const std::string& prefix, const std::vector<nlohmann::json>& rows,
               const std::string& assumption) {
  const std::string csv = prefix + ".csv";
  std::ofstream f(csv);
  // The assumptions ride on every row (a CSV has no header comment that
  // every reader skips): expert MB and where it came from, link, layer time.
  f << "policy,capacity,hit_rate,tpot_ms,floor_tpot_ms,tpot_over_floor,stall_ms_per_token,"
       "expert_mb,expert_mb_from,link_gbps,layer_ms\n";
  for (const auto& j : rows) {
    f << j["policy"].get<std::string>() << ',' << j["capacity"].get<int>() << ','
      << j["hit_rate"].get<double>() << ',' << j["tpot_ms"].get<double>() << ','
      << j["floor_tpot_ms"].get<double>() << ',' << j["tpot_over_floor"].get<double>() << ','
      << j["stall_ms_per_token"].get<double>() << ',' << j["expert_mb"].get<double>() << ",\""
      << absl::StrReplaceAll(j["expert_mb_from"].get<std::string>(), {{"\"", "\"\""}})
      << "\"," << j["link_gbps"].get<double>() << ','
      << j["layer_ms"].get<double>() << '\n';
  }
  f.close();
  if (!f) {
    std::fprintf(stderr, "simulate: cannot write %s\n", csv.c_str());
    return 1;
  }
  std::printf("wrote %s\n", csv.c_str());
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    std::printf("note: gnuplot is not installed; no PNG written (plot %s yourself, e.g. with\n"
                "      scripts or `apt-get install gnuplot-nox` and rerun).\n",
                csv.c_str());
    return 0;
  }
  // One inline data block per policy (in report order), so each policy is
  // one connected line.
  std::vector<std::string> names;
  for (const auto& j : rows) {
    const std::string n = j["policy"].get<std::string>();
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  }
  const std::string gp = prefix + ".gp";
  std::ofstream g(gp);
  for (size_t i = 0; i < names.size(); ++i) {
    g << "$P" << i << " << EOD\n";
    for (const auto& j : rows) {
      if (j["policy"].get<std::string>() != names[i]) continue;
      g << j["capacity"].get<int>() << ' ' << j["hit_rate"].get<double>() << ' '
        << j["tpot_ms"].get<double>() << '\n';
    }
    g << "EOD\n";
  }
  g << "set terminal png size 1000,440\nset output '" << prefix << ".png'\n"
    << "set multiplot layout 1,2 title '"
    << absl::StrReplaceAll(assumption, {{"'", "''"}}) << "'\nset grid\n"
    << "set xlabel 'capacity (slots)'\n";
  for (int col : {2, 3}) {
    g << (col == 2 ? "set key bottom right\nset ylabel 'decode hit rate'\n"
                   : "set key top right\nset ylabel 'decode TPOT (ms)'\n")
      << "plot ";
    for (size_t i = 0; i < names.size(); ++i) {
      g << (i ? ", " : "") << "$P" << i << " using 1:" << col << " with linespoints title '"
        << names[i] << "'";
    }
    g << "\n";
  }
  g.close();
  if (std::system(("gnuplot " + gp).c_str()) == 0) {
    std::printf("wrote %s.png\n", prefix.c_str());
    std::remove(gp.c_str());
  } else {
    std::fprintf(stderr, "simulate: gnuplot failed on %s\n", gp.c_str());
  }
  return 0;
}

// Every flag of one `simulate` run, checked before anything runs.
struct SimulatePlan {
  std::string trace;
  std::string out;  // --out PREFIX (a sweep's files)
  bool sweep = false;
  bool replay_hints = true;
  cache::SimOptions options;
  std::vector<std::string> policies;
  std::vector<double> fracs;  // capacity fractions; empty: options.capacity
  bool progress = false;      // --progress (auto: stderr is a terminal)
  bool expert_mb_given = false;
  std::string model;                 // --model DIR ("" when not given)
  std::optional<DType> format;       // --expert-format
  std::string expert_mb_from;        // where options.link.expert_mb came from
};

// Fills `plan` from parsed `f`; false with a message (without the
// "simulate: " prefix) in `err`.
bool ParsePlan(const FlagSet& f, SimulatePlan* plan, std::string* err) {
  plan->trace = f.GetString("trace");
  if (plan->trace.empty() || f.GetString("policy").empty()) {
    *err = "--trace and --policy are required";
    return false;
  }
  cache::SimOptions& o = plan->options;
  o.prefetch = flag_groups::PrefetchFromFlags(f);
  plan->replay_hints = f.GetString("hints") == "on";
  o.link.expert_mb = f.GetDouble("expert-mb");
  plan->expert_mb_given = f.IsSet("expert-mb");
  o.link.link_gbps = f.GetDouble("link-gbps");
  o.link.layer_ms = f.GetDouble("layer-ms");
  o.link.chunk_mb = f.GetDouble("chunk-mb");
  o.miss_mode = flag_groups::MissModeFromFlags(f);
  o.host_gbps = f.GetDouble("host-gbps");
  o.host_gflops = f.GetDouble("host-gflops");  // 0: bandwidth only
  if (!(o.host_gbps > 0)) {
    *err = "--host-gbps takes a number > 0 here (there is no host to measure)";
    return false;
  }
  plan->model = f.GetString("model");
  plan->format = flag_groups::ExpertFormatFromFlags(f);
  o.passes = static_cast<int>(f.GetInt("passes"));
  o.batch = static_cast<int>(f.GetInt("batch"));
  o.batch_members = f.GetString("batch-members") == "on";
  o.lease_part = flag_groups::LeasePartFromFlags(f);
  const std::string& progress = f.GetString("progress");
  plan->progress = progress == "auto" ? ::isatty(STDERR_FILENO) != 0 : progress == "on";
  plan->policies = PolicyList(f.GetString("policy"));
  plan->out = f.GetString("out");
  if (f.IsSet("sweep")) {
    plan->sweep = true;
    for (absl::string_view v : absl::StrSplit(f.GetString("sweep"), ',', absl::SkipEmpty())) {
      double frac;
      if (!absl::SimpleAtod(v, &frac)) {
        *err = "--sweep takes fractions, e.g. 0.1,0.25,0.5";
        return false;
      }
      plan->fracs.push_back(frac);
    }
    if (plan->out.empty()) {
      *err = "--sweep needs --out PREFIX";
      return false;
    }
  } else if (f.IsSet("capacity")) {
    o.capacity = static_cast<int>(f.GetInt("capacity"));
  } else if (f.IsSet("capacity-frac")) {
    plan->fracs.push_back(f.GetDouble("capacity-frac"));
  } else {
    *err = "give --capacity N or --capacity-frac F";
    return false;
  }
  return true;
}

// Everything a run would refuse, for every capacity and policy, and a
// sweep's output directory: "" when all is well, else the first reason.
std::string CheckRuns(const trace::Trace& t, const SimulatePlan& plan,
                      const std::vector<int>& capacities) {
  cache::SimOptions o = plan.options;
  for (int capacity : capacities) {
    o.capacity = capacity;
    for (const std::string& p : plan.policies) {
      if (absl::Status s = cache::ValidateSimulation(t.header, p, o); !s.ok()) {
        return std::string(s.message());
      }
    }
  }
  if (plan.sweep) {
    std::string dir = std::filesystem::path(plan.out).parent_path().string();
    if (dir.empty()) dir = ".";
    if (::access(dir.c_str(), W_OK | X_OK) != 0) {
      return absl::StrCat("--out ", plan.out, ": cannot write in ", dir, ": ",
                          std::strerror(errno));
    }
  }
  return "";
}

// What the figures assume: "17.000 MB per expert (the default...), link 25
// GB/s, 0.3 ms per MoE layer".
std::string Assumption(const SimulatePlan& plan) {
  const cache::SimOptions& o = plan.options;
  return absl::StrFormat("%.3f MB per expert (%s), link %.3g GB/s, %.3g ms per MoE layer",
                         o.link.expert_mb, plan.expert_mb_from, o.link.link_gbps,
                         o.link.layer_ms);
}

// Bytes of `weights` weights held as `format` (bf16 when unset), in MB:
// whole blocks of 64, the group of every block format.
double HeldMb(double weights, std::optional<DType> format) {
  return weights * static_cast<double>(WeightBytes(format.value_or(DType::kBF16), 1, 64)) /
         64.0 / 1e6;
}

// Sets plan->options.link.expert_mb and plan->expert_mb_from from the first
// source that applies (kNotes); false with a message in `err`.
bool ResolveExpertSize(const trace::TraceHeader& h, SimulatePlan* plan, std::string* err) {
  double& mb = plan->options.link.expert_mb;
  const std::string as =
      plan->format ? absl::StrCat(" as ", ExpertFormatName(*plan->format)) : std::string();
  if (plan->expert_mb_given) {
    mb = HeldMb(mb * 1e6 / 2.0, plan->format);  // --expert-mb is a bf16 size
    plan->expert_mb_from = absl::StrCat("--expert-mb", as);
    return true;
  }
  if (!plan->model.empty()) {
    absl::StatusOr<ModelConfig> config = LoadModelConfig(plan->model);
    if (!config.ok()) {
      *err = absl::StrCat("--model: ", config.status().message());
      return false;
    }
    if (config->num_moe_layers() != h.num_layers || config->num_experts != h.num_experts ||
        config->top_k != h.top_k) {
      *err = absl::StrFormat(
          "--model %s has %d MoE layers x %d experts, top-%d; the trace has %d x %d, top-%d: "
          "give the checkpoint the trace was recorded on",
          plan->model, config->num_moe_layers(), config->num_experts, config->top_k,
          h.num_layers, h.num_experts, h.top_k);
      return false;
    }
    bool measured = false;
    const plan::StoredFormats stored =
        StoredFormatsOf(plan->model, *config, &measured, "simulate");
    absl::StatusOr<plan::ModelFigures> m = plan::ComputeFigures(*config, stored, plan->format);
    if (!m.ok()) {
      *err = absl::StrCat("--model: ", m.status().message());
      return false;
    }
    mb = static_cast<double>(m->expert_bytes) / 1e6;
    plan->expert_mb_from = absl::StrCat("--model ", plan->model, ", held as ",
                                        m->held_name);
    return true;
  }
  if (h.expert_params > 0) {
    mb = HeldMb(static_cast<double>(h.expert_params), plan->format);
    plan->expert_mb_from = absl::StrCat("the trace's header: ", h.expert_params, " weights",
                                        plan->format ? as : " as bf16");
    return true;
  }
  mb = HeldMb(mb * 1e6 / 2.0, plan->format);
  plan->expert_mb_from =
      absl::StrCat("the default", as, ": give --expert-mb or --model for your model");
  return true;
}

int RunSimulate(const Args& args) {
  FlagSet f("simulate", kSynopsis);
  DeclareFlags(f);
  f.NoPositional();
  absl::Status parsed = f.Parse(args);
  if (f.help()) {
    std::fputs(f.Usage().c_str(), stdout);
    return 0;
  }
  SimulatePlan plan;
  std::string err = std::string(parsed.message());
  if (!parsed.ok() || !ParsePlan(f, &plan, &err)) {
    std::fprintf(stderr, "simulate: %s\n%s", err.c_str(), f.Usage().c_str());
    return 2;
  }
  const bool json = f.GetBool("json");
  auto t = trace::ReadTraceFile(plan.trace);
  if (!t.ok()) {
    std::fprintf(stderr, "simulate: %s\n", std::string(t.status().message()).c_str());
    return 2;
  }
  if (!ResolveExpertSize(t->header, &plan, &err)) {
    std::fprintf(stderr, "simulate: %s\n", err.c_str());
    return 2;
  }
  // Every capacity is checked before the first run prints anything.
  std::vector<int> capacities;
  for (double frac : plan.fracs) {
    auto c = cache::CapacityFromFraction(t->header, frac);
    if (!c.ok()) {
      std::fprintf(stderr, "simulate: %s\n", std::string(c.status().message()).c_str());
      return 2;
    }
    capacities.push_back(*c);
  }
  if (capacities.empty()) capacities.push_back(plan.options.capacity);
  if (std::string err2 = CheckRuns(*t, plan, capacities); !err2.empty()) {
    std::fprintf(stderr, "simulate: %s\n", err2.c_str());
    return 2;
  }
  const nlohmann::json hints = HintReport(*t, plan.replay_hints, json);
  if (!plan.replay_hints) {
    for (trace::TraceRequest& r : t->requests) r.hints.clear();
  }
  std::vector<nlohmann::json> rows;
  const std::string assumption = Assumption(plan);
  if (!json) PrintTableHeader(assumption);
  cache::SimOptions o = plan.options;
  int runs = 0;
  for (const std::string& p : plan.policies) runs += p == "belady" ? 0 : 1;
  Progress progress(plan.progress, static_cast<int>(capacities.size()) * (runs + 1));
  for (int capacity : capacities) {
    o.capacity = capacity;
    if (int rc = RunAt(*t, plan.policies, o, plan.expert_mb_from, json, true, &rows, hints,
                       progress);
        rc != 0) {
      return rc;
    }
  }
  return plan.sweep ? WriteSweep(plan.out, rows, assumption) : 0;
}

const bool kRegistered = RegisterCommand(
    {"simulate", "replay a routing trace through the cache policies", &RunSimulate});

}  // namespace
}  // namespace moe::moectl
