// moectl synth-trace: writes a synthetic moe-trace/1 file (see
// services/cache/synth_trace.h for the model behind each knob).
#include <cstdio>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "services/cache/synth_trace.h"
#include "services/moectl/commands.h"
#include "services/moectl/flags.h"

namespace moe::moectl {
namespace {

using flags::DoubleRange;
using flags::IntRange;

constexpr char kNotes[] =
    "--regime sets the knobs of a regime seen in real traces (mixtral-uniform,\n"
    "wide-256; see synth_trace.h); knobs given as flags override it.\n"
    "Token counts are means: each request draws in [mean/2, 3*mean/2].\n";

constexpr IntRange kCount = {.min = 0, .max = std::numeric_limits<int>::max()};
constexpr DoubleRange kProbability = {.min = 0, .max = 1};

// The knobs, with SynthOptions' defaults.
void DeclareFlags(FlagSet& f) {
  const trace::SynthOptions d;
  f.String("out", "", "output moe-trace/1 file (required)");
  f.String("regime", "", "mixtral-uniform|wide-256: start from that regime's knobs");
  f.String("model", d.model, "model name in the trace header");
  f.Int("seed", static_cast<int64_t>(d.seed), "random seed", {.min = 0});
  f.Group("knobs");
  f.Int("layers", d.num_layers, "MoE layers", kCount);
  f.Int("experts", d.num_experts, "experts per layer", kCount);
  f.Int("top-k", d.top_k, "experts per token", kCount);
  f.Int("requests", d.requests, "requests", kCount);
  f.Int("prefill-tokens", d.prefill_tokens, "prompt tokens per request (mean)", kCount);
  f.Int("decode-tokens", d.decode_tokens, "decode tokens per request (mean)", kCount);
  f.Int("groups", d.groups, "activation groups requests fall into", kCount);
  f.Int("working-set", d.working_set,
        "experts per layer a request reuses heavily (0: 25% of E for E <= 16, else 5%)", kCount);
  f.Double("in-set", d.in_set, "decode choice drawn from the working set", kProbability);
  f.Double("prefill-in-set", d.prefill_in_set, "same for prefill tokens", kProbability);
  f.Double("set-noise", d.set_noise, "per working-set member: swapped for a random expert",
           kProbability);
  f.Double("repeat", d.repeat, "repeat the previous token's first choice", kProbability);
  f.Double("layer-affinity", d.layer_affinity, "first choice at l+1 follows the choice at l",
           kProbability);
  f.Double("stickiness", d.stickiness,
           "next request keeps the group (else uniform: switches are unpredictable)",
           kProbability);
  f.Double("skew", d.popularity_skew, "Zipf exponent of per-layer expert popularity",
           {.min = 0});
  f.Double("hint-accuracy", d.hint_accuracy, "add \"hints\"; each routed expert hinted with P",
           kProbability);
  f.Notes(kNotes);
}

// SynthOptions from the regime (if any), then every knob given.
absl::StatusOr<trace::SynthOptions> OptionsFromFlags(const FlagSet& f) {
  trace::SynthOptions o;
  if (f.IsSet("regime")) {
    absl::StatusOr<trace::SynthOptions> r = trace::SynthRegime(f.GetString("regime"));
    if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat("--regime: ", r.status().message()));
    o = *r;
  }
  auto take_int = [&](const char* k, int* v) {
    if (f.IsSet(k)) *v = static_cast<int>(f.GetInt(k));
  };
  auto take_double = [&](const char* k, double* v) {
    if (f.IsSet(k)) *v = f.GetDouble(k);
  };
  if (f.IsSet("model")) o.model = f.GetString("model");
  if (f.IsSet("seed")) o.seed = static_cast<uint64_t>(f.GetInt("seed"));
  take_int("layers", &o.num_layers);
  take_int("experts", &o.num_experts);
  take_int("top-k", &o.top_k);
  take_int("requests", &o.requests);
  take_int("prefill-tokens", &o.prefill_tokens);
  take_int("decode-tokens", &o.decode_tokens);
  take_int("groups", &o.groups);
  take_int("working-set", &o.working_set);
  take_double("in-set", &o.in_set);
  take_double("prefill-in-set", &o.prefill_in_set);
  take_double("set-noise", &o.set_noise);
  take_double("repeat", &o.repeat);
  take_double("layer-affinity", &o.layer_affinity);
  take_double("stickiness", &o.stickiness);
  take_double("skew", &o.popularity_skew);
  take_double("hint-accuracy", &o.hint_accuracy);
  return o;
}

int RunSynthTrace(const Args& args) {
  FlagSet f("synth-trace", "--out FILE [--regime NAME] [knobs]");
  DeclareFlags(f);
  f.NoPositional();
  absl::Status parsed = f.Parse(args);
  if (f.help()) {
    std::fputs(f.Usage().c_str(), stdout);
    return 0;
  }
  absl::StatusOr<trace::SynthOptions> options =
      parsed.ok() ? OptionsFromFlags(f) : absl::StatusOr<trace::SynthOptions>(parsed);
  if (!options.ok()) {
    std::fprintf(stderr, "synth-trace: %s\n%s", std::string(options.status().message()).c_str(),
                 f.Usage().c_str());
    return 2;
  }
  const trace::SynthOptions& o = *options;
  const std::string& out = f.GetString("out");
  if (out.empty()) {
    std::fprintf(stderr, "synth-trace: --out FILE is required\n");
    return 2;
  }
  auto t = trace::GenerateSyntheticTrace(o);
  if (!t.ok()) {
    std::fprintf(stderr, "synth-trace: %s\n", std::string(t.status().message()).c_str());
    return 2;
  }
  if (auto s = trace::WriteTraceFile(out, *t); !s.ok()) {
    std::fprintf(stderr, "synth-trace: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf("wrote %s: %zu requests, %d layers x %d experts, top-%d\n", out.c_str(),
              t->requests.size(), o.num_layers, o.num_experts, o.top_k);
  return 0;
}

const bool kRegistered = RegisterCommand(
    {"synth-trace", "write a synthetic moe-trace/1 routing trace", &RunSynthTrace});

}  // namespace
}  // namespace moe::moectl
