// Benchmarks EAMC matching: one request EAM against 1000 stored records, for
// a 32x8 (top-2) and a 40x256 (top-8) model, records from synthetic traces.
// Targets (issue 4): <= 20 us and <= 200 us per match.
#include <benchmark/benchmark.h>

#include "services/cache/eamc.h"
#include "services/cache/synth_trace.h"

namespace moe::cache {
namespace {

Eam DecodeEam(const trace::Trace& t, const trace::TraceRequest& r) {
  Eam e(t.header.num_layers, t.header.num_experts);
  for (int tok = r.num_prefill_tokens(); tok < r.num_tokens(); ++tok) {
    for (int l = 0; l < t.header.num_layers; ++l) {
      for (int32_t x : r.experts[tok][l]) e.Add(l, x, 1);
    }
  }
  return e;
}

void BM_EamcMatch(benchmark::State& state) {
  trace::SynthOptions o;
  o.num_layers = static_cast<int>(state.range(0));
  o.num_experts = static_cast<int>(state.range(1));
  o.top_k = static_cast<int>(state.range(2));
  o.requests = 1001;
  o.prefill_tokens = 0;
  o.decode_tokens = 64;
  auto t = trace::GenerateSyntheticTrace(o);
  // Same pruning the moe-infinity policy uses (all for E <= 16, else 2*top_k).
  Eamc eamc({o.num_layers, o.num_experts, 1000, o.num_experts <= 16 ? 0 : 2 * o.top_k, false});
  Eam empty(o.num_layers, o.num_experts);
  for (int i = 0; i < 1000; ++i) eamc.Add(empty, DecodeEam(*t, t->requests[i]));
  Eam query = DecodeEam(*t, t->requests[1000]);
  for (auto _ : state) {
    auto m = eamc.FindBest(query, EamPhase::kDecode, 4);
    benchmark::DoNotOptimize(m);
  }
  state.counters["records"] = eamc.size();
  // Work per match: pruned query cells, and stored entries in those cells.
  const SparseEam q = eamc.Prune(query);
  std::vector<int> in_cell(o.num_layers * o.num_experts, 0);
  for (const auto& r : eamc.records()) {
    for (const auto& e : r.decode.entries()) ++in_cell[e.index];
  }
  double postings = 0;
  for (const auto& e : q.entries()) postings += in_cell[e.index];
  state.counters["query_cells"] = q.entries().size();
  state.counters["postings"] = postings;
}
BENCHMARK(BM_EamcMatch)->Args({32, 8, 2})->Args({40, 256, 8})->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace moe::cache

BENCHMARK_MAIN();
