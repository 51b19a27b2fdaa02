// Engine benchmark: the whole forward pass (moe_engine on the CPU backend,
// experts in memory) on a mixtral-layout bf16 model larger than the CPU
// caches, against ceilings measured in the same run:
//   decode:  weight bytes read per second (dense weights + the experts each
//            decode token was routed to) / memcpy bandwidth (goal >= 0.6);
//   prefill: model FLOP/s / the CPU backend's MatMul on a large square
//            bf16 problem.
//
//   engine_bench [--size-mb=1024] [--hidden=2048] [--dir=DIR] [--reuse]
//                [--threads=N] [--reps=5] [--decode-tokens=32]
//                [--prefill-tokens=256]
//
// Each of --reps rounds measures the ceilings right before the engine runs
// they are compared with, and the ratios are computed per round (medians
// reported), so that load from other processes skews both sides alike.
// Then decode tokens/s with the experts held as bf16, q8 and q4 (issue 12),
// side by side; last, 16 sequences decoded one at a time against batches of
// 4 and 16 (issue 14; --batch-only runs just that). The model is written with MakeModel into --dir (default: a fresh temp
// directory, removed afterwards); --reuse loads an existing one instead.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/file_util.h"
#include "common/model_maker.h"
#include "common/quant.h"
#include "common/status_macros.h"
#include "common/threads.h"
#include "kernels/cpu_backend.h"
#include "services/engine/batch_step.h"
#include "services/engine/generator.h"
#include "services/engine/in_memory_provider.h"
#include "services/engine/moe_model.h"

namespace moe {
namespace {

struct Flags {
  int64_t size_mb = 1024;
  int64_t hidden = 2048;
  std::string dir;
  bool reuse = false;
  int threads = 0;
  int reps = 5;
  int decode_tokens = 32;
  int prefill_tokens = 256;
  bool batch_only = false;  // only the continuous-batching comparison
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    const std::string name = a.substr(0, eq);
    const std::string v = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (name == "--reuse" && v.empty()) {
      f->reuse = true;
    } else if (name == "--batch-only" && v.empty()) {
      f->batch_only = true;
    } else if (v.empty()) {
      std::fprintf(stderr, "engine_bench: bad flag %s\n", a.c_str());
      return false;
    } else if (name == "--size-mb") {
      f->size_mb = std::atoll(v.c_str());
    } else if (name == "--hidden") {
      f->hidden = std::atoll(v.c_str());
    } else if (name == "--dir") {
      f->dir = v;
    } else if (name == "--threads") {
      f->threads = std::atoi(v.c_str());
    } else if (name == "--reps") {
      f->reps = std::atoi(v.c_str());
    } else if (name == "--decode-tokens") {
      f->decode_tokens = std::atoi(v.c_str());
    } else if (name == "--prefill-tokens") {
      f->prefill_tokens = std::atoi(v.c_str());
    } else {
      std::fprintf(stderr, "engine_bench: unknown flag %s\n", a.c_str());
      return false;
    }
  }
  return f->size_mb > 0 && f->hidden >= 64 && f->hidden % 64 == 0 &&
         f->reps > 0 && f->decode_tokens > 1 && f->prefill_tokens > 0;
}

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds of `reps` runs after one warm-up run.
double MedianSeconds(int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double t0 = Now();
    fn();
    t.push_back(Now() - t0);
  }
  return Median(t);
}

// A mixtral layout with experts as wide as the hidden size; as many layers
// as make the checkpoint about `size_mb`.
MakeModelOptions BenchModel(const Flags& f) {
  MakeModelOptions o;
  o.arch = ModelFamily::kMixtral;
  o.hidden = f.hidden;
  o.heads = f.hidden / 128;
  o.kv_heads = std::max<int64_t>(1, o.heads / 4);
  o.experts = 8;
  o.top_k = 2;
  o.intermediate = f.hidden;
  o.vocab = 512;
  o.dtype = DType::kBF16;
  o.seed = 1;
  const double h = static_cast<double>(f.hidden);
  const double attn = 2.0 * h * h * (2.0 + 2.0 / 4.0);  // q,o + k,v (GQA 4)
  const double layer = attn + o.experts * 3.0 * h * h * 2.0;
  o.layers = std::max<int64_t>(
      1, static_cast<int64_t>(f.size_mb * 1048576.0 / layer + 0.5));
  return o;
}

// Bytes copied per second by a memcpy split over the pool's threads.
double MemcpyBandwidth(ThreadPool& pool, size_t bytes, int reps) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const int64_t parts = pool.size() * 4;
  const size_t chunk = (bytes + parts - 1) / parts;
  const double s = MedianSeconds(reps, [&] {
    pool.ParallelFor(parts, 1, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        const size_t off = size_t(p) * chunk;
        if (off < bytes) {
          std::memcpy(dst.data() + off, src.data() + off,
                      std::min(chunk, bytes - off));
        }
      }
    });
  });
  return bytes / s;
}

// Bytes read per second by a sum over the buffer split over the pool's
// threads: the read-only ceiling (memcpy also writes every byte).
double ReadBandwidth(ThreadPool& pool, size_t bytes, int reps) {
  std::vector<uint64_t> src(bytes / 8, 3);
  const int64_t parts = pool.size() * 4;
  const size_t chunk = (src.size() + parts - 1) / parts;
  std::vector<uint64_t> sink(parts);
  const double s = MedianSeconds(reps, [&] {
    pool.ParallelFor(parts, 1, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        const size_t lo = std::min(src.size(), size_t(p) * chunk);
        const size_t hi = std::min(src.size(), lo + chunk);
        uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        size_t i = lo;
        for (; i + 4 <= hi; i += 4) {
          a0 += src[i];
          a1 += src[i + 1];
          a2 += src[i + 2];
          a3 += src[i + 3];
        }
        for (; i < hi; ++i) a0 += src[i];
        sink[p] = a0 + a1 + a2 + a3;
      }
    });
  });
  if (sink[0] == 1) std::printf(" ");  // keeps the loads
  return bytes / s;
}

// FLOP/s of the backend's own MatMul on an n x n x n bf16 product.
double MatMulPeak(CpuBackend& be, int64_t n, int reps) {
  std::vector<uint16_t> w(n * n);
  std::vector<float> x(n * n), y(n * n);
  for (int64_t i = 0; i < n * n; ++i) {
    w[i] = FloatToBF16(static_cast<float>((i * 7919) % 2001 - 1000) * 1e-3f);
    x[i] = static_cast<float>((i * 104729) % 2001 - 1000) * 1e-3f;
  }
  const double s = MedianSeconds(reps, [&] {
    absl::Status st =
        be.MatMul(x.data(), w.data(), DType::kBF16, nullptr, y.data(), n, n, n);
    if (!st.ok()) std::fprintf(stderr, "%s\n", st.ToString().c_str());
  });
  return 2.0 * n * n * n / s;
}

// One request: timings and the routing each iteration used.
struct RunResult {
  GenerateSummary summary;
  // Per iteration, per MoE layer: distinct experts used.
  std::vector<std::vector<int>> distinct;
};

absl::StatusOr<RunResult> RunOnce(const MoeModel& model,
                                  InMemoryExpertProvider* experts,
                                  const std::vector<int32_t>& prompt,
                                  int new_tokens) {
  RunResult r;
  GenerateOptions o;
  o.prompt = prompt;
  o.max_new_tokens = new_tokens;
  o.stop_at_eos = false;
  auto observer = [&](int layer, int64_t, absl::Span<const int32_t> ids,
                      absl::Span<const float>) {
    if (layer == 0) r.distinct.emplace_back();
    r.distinct.back().push_back(
        static_cast<int>(std::set<int32_t>(ids.begin(), ids.end()).size()));
  };
  auto s = Generate(
      model, experts, o, [](const SampledToken&) { return true; }, observer);
  if (!s.ok()) return s.status();
  r.summary = *s;
  return r;
}

std::vector<int32_t> Prompt(int n, int64_t vocab) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i)
    p[i] = static_cast<int32_t>((i * 37 + 11) % vocab);
  return p;
}

// Model FLOPs of one prefill of `p` tokens: projections and router per
// token, top_k experts per token, causal attention, lm_head for the last
// token.
double PrefillFlops(const ModelConfig& c, double p) {
  const double h = c.hidden_size, inter = c.moe_intermediate_size;
  const double hd = c.head_dim, nh = c.num_attention_heads,
               nkv = c.num_key_value_heads;
  const double proj = h * hd * (2 * nh + 2 * nkv) + h * c.num_experts;
  return c.num_hidden_layers * (2 * p * proj + 2 * p * c.top_k * 3 * h * inter +
                                4 * nh * hd * p * (p + 1) / 2) +
         2.0 * h * c.vocab_size;
}

// One round: the ceilings measured right before the engine runs they are
// compared with, so that load from other processes hits both alike.
struct Round {
  double copy_bw = 0, read_bw = 0, peak = 0;  // ceilings
  double tpot = 0, bytes_per_token = 0;       // decode
  double ttft = 0;                            // prefill
};

absl::StatusOr<Round> MeasureRound(const Flags& f, CpuBackend& be,
                                   const MoeModel& model,
                                   InMemoryExpertProvider* experts) {
  const ModelConfig& c = model.config();
  const ModelDescription& d = model.description();
  Round r;
  r.copy_bw = MemcpyBandwidth(be.pool(), 512u << 20, 1);
  r.read_bw = ReadBandwidth(be.pool(), 512u << 20, 1);
  // Decode: weights read per token = dense weights (one embedding row) +
  // the experts each decode iteration was routed to.
  auto dec =
      RunOnce(model, experts, Prompt(16, c.vocab_size), f.decode_tokens + 1);
  if (!dec.ok()) return dec.status();
  const auto embed = d.Dense(TensorRole::kEmbed);
  const double dense_read = static_cast<double>(d.dense_bytes()) -
                            (embed.ok() ? embed->nbytes : 0) +
                            2.0 * c.hidden_size;
  double expert_reads = 0;
  for (size_t it = 1; it < dec->distinct.size(); ++it) {
    for (int n : dec->distinct[it]) expert_reads += n;
  }
  r.tpot = dec->summary.tpot_seconds;
  r.bytes_per_token = dense_read + expert_reads / (dec->distinct.size() - 1) *
                                       d.bytes_per_expert();
  r.peak = MatMulPeak(be, 2048, 1);
  // Prefill: time to first token of a long prompt.
  auto pre = RunOnce(model, experts, Prompt(f.prefill_tokens, c.vocab_size), 1);
  if (!pre.ok()) return pre.status();
  r.ttft = pre->summary.ttft_seconds;
  return r;
}

void Report(const Flags& f, const ModelConfig& c,
            const std::vector<Round>& rounds) {
  const double p = f.prefill_tokens, flops = PrefillFlops(c, p);
  auto med = [&](const std::function<double(const Round&)>& fn) {
    std::vector<double> v;
    for (const Round& r : rounds) v.push_back(fn(r));
    return Median(v);
  };
  for (size_t i = 0; i < rounds.size(); ++i) {
    const Round& r = rounds[i];
    const double dec_bw = r.bytes_per_token / r.tpot;
    std::printf(
        "round %zu: memcpy %5.2f GB/s, read %5.2f GB/s, decode %5.2f GB/s "
        "(ratio %.2f, vs read %.2f) | peak %5.1f GFLOP/s, prefill %5.1f "
        "GFLOP/s (ratio %.2f)\n",
        i + 1, r.copy_bw / 1e9, r.read_bw / 1e9, dec_bw / 1e9,
        dec_bw / r.copy_bw, dec_bw / r.read_bw, r.peak / 1e9,
        flops / r.ttft / 1e9, flops / r.ttft / r.peak);
  }
  const double tpot = med([](const Round& r) { return r.tpot; });
  const double ttft = med([](const Round& r) { return r.ttft; });
  const double bpt = med([](const Round& r) { return r.bytes_per_token; });
  const double dec_ratio = med(
      [](const Round& r) { return r.bytes_per_token / r.tpot / r.copy_bw; });
  const double read_ratio = med(
      [](const Round& r) { return r.bytes_per_token / r.tpot / r.read_bw; });
  const double pre_ratio =
      med([&](const Round& r) { return flops / r.ttft / r.peak; });
  std::printf("medians of %zu rounds:\n", rounds.size());
  std::printf(
      "  memcpy %.2f GB/s (bytes copied), read stream %.2f GB/s, "
      "matmul peak %.1f GFLOP/s (CPU MatMul 2048^3, bf16)\n",
      med([](const Round& r) { return r.copy_bw; }) / 1e9,
      med([](const Round& r) { return r.read_bw; }) / 1e9,
      med([](const Round& r) { return r.peak; }) / 1e9);
  std::printf(
      "  decode  %7.2f tokens/s  TPOT %7.2f ms  %6.1f MiB weights/token  "
      "%5.2f GB/s | ratio vs memcpy %.2f (goal >= 0.60), vs read %.2f\n",
      1.0 / tpot, tpot * 1e3, bpt / 1048576.0, bpt / tpot / 1e9, dec_ratio,
      read_ratio);
  std::printf(
      "  prefill %7.1f tokens/s  %d tokens in %.0f ms  %5.2f GFLOP/token  "
      "%5.1f GFLOP/s | ratio vs matmul peak %.2f\n",
      p / ttft, f.prefill_tokens, ttft * 1e3, flops / p / 1e9,
      flops / ttft / 1e9, pre_ratio);
  std::printf(
      "RESULT engine decode_ratio=%.2f decode_read_ratio=%.2f "
      "prefill_ratio=%.2f decode_tok_s=%.2f prefill_tok_s=%.1f\n",
      dec_ratio, read_ratio, pre_ratio, 1.0 / tpot, p / ttft);
}

// Decode tokens/s of the whole forward pass with the experts held in each
// format (InMemoryExpertProvider's conversion, as moe-cached
// --expert-format), side by side in one run: median TPOT of `reps` runs.
absl::Status ReportFormats(const Flags& f, const MoeModel& model) {
  const ModelConfig& c = model.config();
  std::printf("decode by expert format (whole forward pass, %d tokens, median of %d):\n",
              f.decode_tokens, f.reps);
  double bf16_tps = 0;
  for (DType format : {DType::kBF16, DType::kQ8, DType::kQ4}) {
    auto experts = InMemoryExpertProvider::Create(model, format);
    if (!experts.ok()) return experts.status();
    std::vector<double> tpot;
    for (int i = 0; i <= f.reps; ++i) {  // the first run warms up
      auto r = RunOnce(model, experts->get(), Prompt(16, c.vocab_size), f.decode_tokens + 1);
      if (!r.ok()) return r.status();
      if (i > 0) tpot.push_back(r->summary.tpot_seconds);
    }
    const double tps = 1.0 / Median(tpot);
    if (format == DType::kBF16) bf16_tps = tps;
    std::printf("  %-5s %8.2f tokens/s  %5.2fx bf16\n", ExpertFormatName(format).c_str(), tps,
                tps / bf16_tps);
    std::printf("RESULT engine expert_format=%s decode_tok_s=%.2f vs_bf16=%.2f\n",
                ExpertFormatName(format).c_str(), tps, tps / bf16_tps);
  }
  return absl::OkStatus();
}

// Issue 14, in process (no daemon, every expert in memory): 16 sequences
// decoded one at a time (Session::Forward, round robin) against BatchStep
// with batches of 4 and 16, greedy, same prompts; the logits of every mode
// must be bit-identical to one at a time.
absl::Status ReportBatching(const Flags& f, const MoeModel& model, ExpertProvider* experts) {
  constexpr int kSeqs = 16;
  const ModelConfig& c = model.config();
  std::printf("decode of %d sequences x %d tokens (whole forward pass, in process):\n", kSeqs,
              f.decode_tokens);
  double one_tps = 0;
  std::vector<std::vector<float>> reference;
  for (int b : {1, 4, 16}) {
    std::vector<std::unique_ptr<Session>> sessions;
    std::vector<int32_t> next(kSeqs);
    std::vector<std::vector<float>> last(kSeqs);
    auto take = [&](int i, absl::Span<const float> logits) {
      next[i] = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) -
                                     logits.begin());
      last[i].assign(logits.begin(), logits.end());
    };
    for (int i = 0; i < kSeqs; ++i) {
      sessions.push_back(std::make_unique<Session>(model, experts, 32 + f.decode_tokens));
      std::vector<int32_t> prompt = Prompt(8 + i, c.vocab_size);
      for (int32_t& t : prompt) t = static_cast<int32_t>((t + 7 * i) % c.vocab_size);
      auto l = sessions[i]->Forward(prompt, true);
      if (!l.ok()) return l.status();
      take(i, *l);
    }
    BatchStep step(model, experts);
    const double t0 = Now();
    for (int k = 0; k < f.decode_tokens; ++k) {
      for (int g = 0; g < kSeqs; g += b) {
        if (b == 1) {
          auto l = sessions[g]->Forward(absl::Span<const int32_t>(&next[g], 1), false);
          if (!l.ok()) return l.status();
          take(g, *l);
          continue;
        }
        std::vector<BatchStep::Entry> entries;
        for (int i = g; i < g + b; ++i) {
          BatchStep::Entry e;
          e.session = sessions[i].get();
          e.tokens = absl::Span<const int32_t>(&next[i], 1);
          e.request = static_cast<uint64_t>(i + 1);
          entries.push_back(e);
        }
        RETURN_IF_ERROR(step.Run(entries));
        for (int i = g; i < g + b; ++i) take(i, step.logits(static_cast<size_t>(i - g)));
      }
    }
    const double tps = kSeqs * f.decode_tokens / (Now() - t0);
    if (b == 1) {
      one_tps = tps;
      reference = last;
    }
    const bool same = last == reference;
    std::printf("  batch %2d %8.1f tokens/s  %5.2fx one at a time  logits %s\n", b, tps,
                tps / one_tps, same ? "bit-identical" : "DIFFER");
    std::printf("RESULT engine_batch batch=%d decode_tok_s=%.1f vs_one=%.2f identical=%d\n", b,
                tps, tps / one_tps, same ? 1 : 0);
    if (!same) return absl::InternalError("batched logits differ from one at a time");
  }
  return absl::OkStatus();
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "engine_bench: %s\n", s.ToString().c_str());
  return 1;
}

int Run(const Flags& f) {
  std::string dir = f.dir;
  bool remove_dir = false;
  if (dir.empty()) {
    char tmpl[] = "/tmp/engine_bench_XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return Fail(absl::InternalError("mkdtemp"));
    dir = tmpl;
    remove_dir = true;
  }
  if (!(f.reuse && IsRegularFile(dir + "/config.json"))) {
    const double t0 = Now();
    if (absl::Status made = MakeModel(BenchModel(f), dir); !made.ok()) {
      return Fail(made);
    }
    std::printf("made %s in %.1f s\n", dir.c_str(), Now() - t0);
  }
  CpuBackend be(f.threads);
  auto model = MoeModel::Load(dir, &be);
  if (!model.ok()) return Fail(model.status());
  auto experts = InMemoryExpertProvider::Create(**model);
  if (!experts.ok()) return Fail(experts.status());
  const ModelConfig& c = (*model)->config();
  std::printf(
      "== engine_bench: mixtral layout, %lld layers, hidden %lld, %lld "
      "experts (top-%lld, width %lld), bf16, %.0f MiB; cpu %d threads, %s\n",
      (long long)c.num_hidden_layers, (long long)c.hidden_size,
      (long long)c.num_experts, (long long)c.top_k,
      (long long)c.moe_intermediate_size,
      (*model)->description().total_bytes() / 1048576.0, be.pool().size(),
      be.Info().simd.c_str());
  if (f.batch_only) {
    absl::Status s = ReportBatching(f, **model, experts->get());
    experts->reset();
    model->reset();
    if (remove_dir) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
    return s.ok() ? 0 : Fail(s);
  }
  // Warm-up: a long prefill touches every expert's pages once.
  if (auto w = RunOnce(**model, experts->get(),
                       Prompt(f.prefill_tokens, c.vocab_size), 2);
      !w.ok()) {
    return Fail(w.status());
  }
  std::vector<Round> rounds;
  for (int i = 0; i < f.reps; ++i) {
    auto r = MeasureRound(f, be, **model, experts->get());
    if (!r.ok()) return Fail(r.status());
    rounds.push_back(*r);
  }
  Report(f, c, rounds);
  experts->reset();  // the provider refers to the model
  if (absl::Status fs = ReportFormats(f, **model); !fs.ok()) return Fail(fs);
  experts = InMemoryExpertProvider::Create(**model);
  if (!experts.ok()) return Fail(experts.status());
  if (absl::Status bs = ReportBatching(f, **model, experts->get()); !bs.ok()) return Fail(bs);
  experts->reset();
  model->reset();
  if (remove_dir) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  return 0;
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  moe::SkipLockOrderChecks();  // before any lock: they all pay for the checks
  moe::Flags flags;
  if (!moe::ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr,
                 "usage: engine_bench [--size-mb=1024] [--hidden=2048] "
                 "[--dir=DIR] [--reuse] [--threads=N] [--reps=5] "
                 "[--decode-tokens=32] [--prefill-tokens=256] [--batch-only]\n");
    return 2;
  }
  return moe::Run(flags);
}
