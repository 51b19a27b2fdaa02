// moectl synth-trace: writes a synthetic moe-trace/1 file (see
// services/cache/synth_trace.h for the model behind each knob).
#include <cstdio>
#include <map>
#include <string>

#include "absl/strings/numbers.h"
#include "services/cache/synth_trace.h"
#include "services/moectl/commands.h"

namespace moe::moectl {
namespace {

constexpr char kHelp[] =
    "usage: moectl synth-trace --out FILE [--regime NAME] [knobs]\n"
    "  --regime mixtral-uniform|wide-256   knobs of a regime seen in real traces\n"
    "                            (see synth_trace.h); later knobs override them\n"
    "  --layers N (32)  --experts N (8)  --top-k N (2)  --requests N (40)\n"
    "  --prefill-tokens N (64)  --decode-tokens N (128)   means; each request draws\n"
    "                                                      in [mean/2, 3*mean/2]\n"
    "  --groups N (16)           activation groups requests fall into\n"
    "  --working-set N (auto)    experts per layer a request reuses heavily\n"
    "                            (auto: 25% of E for E <= 16, else 5%)\n"
    "  --in-set P (0.85)         decode choice drawn from the working set\n"
    "  --prefill-in-set P (0.6)  same for prefill tokens\n"
    "  --set-noise P (0.25)      per working-set member: swapped for a random expert\n"
    "  --repeat P (0.15)         repeat the previous token's first choice\n"
    "  --layer-affinity P (0.4)  first choice at l+1 follows the choice at l\n"
    "  --stickiness P (0.2)      next request keeps the group (else uniform: switches\n"
    "                            are unpredictable)\n"
    "  --skew S (0.8)            Zipf exponent of per-layer expert popularity\n"
    "  --hint-accuracy P (0)     add \"hints\"; each routed expert hinted with P\n"
    "  --seed N (1)  --model NAME\n";

int RunSynthTrace(const Args& args) {
  std::map<std::string, std::string> f;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kHelp, stdout);
      return 0;
    }
    if (a.rfind("--", 0) != 0) {
      std::fprintf(stderr, "synth-trace: unexpected argument '%s'\n%s", a.c_str(), kHelp);
      return 2;
    }
    const size_t eq = a.find('=');
    if (eq != std::string::npos) {
      f[a.substr(2, eq - 2)] = a.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      f[a.substr(2)] = args[++i];
    } else {
      std::fprintf(stderr, "synth-trace: %s needs a value\n", a.c_str());
      return 2;
    }
  }
  trace::SynthOptions o;
  if (auto it = f.find("regime"); it != f.end()) {
    absl::StatusOr<trace::SynthOptions> r = trace::SynthRegime(it->second);
    if (!r.ok()) {
      std::fprintf(stderr, "synth-trace: --regime: %s\n", std::string(r.status().message()).c_str());
      return 2;
    }
    o = *r;
    f.erase(it);
  }
  std::string out;
  bool ok = true;
  auto take_int = [&](const char* k, int* v) {
    if (auto it = f.find(k); it != f.end()) {
      ok &= absl::SimpleAtoi(it->second, v);
      f.erase(it);
    }
  };
  auto take_double = [&](const char* k, double* v) {
    if (auto it = f.find(k); it != f.end()) {
      ok &= absl::SimpleAtod(it->second, v);
      f.erase(it);
    }
  };
  if (auto it = f.find("out"); it != f.end()) out = it->second, f.erase(it);
  if (auto it = f.find("model"); it != f.end()) o.model = it->second, f.erase(it);
  if (auto it = f.find("seed"); it != f.end()) {
    ok &= absl::SimpleAtoi(it->second, &o.seed);
    f.erase(it);
  }
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
  if (!ok) {
    std::fprintf(stderr, "synth-trace: a flag value is not a number\n");
    return 2;
  }
  if (!f.empty()) {
    std::fprintf(stderr, "synth-trace: unknown flag --%s\n%s", f.begin()->first.c_str(), kHelp);
    return 2;
  }
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
