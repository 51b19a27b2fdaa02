// A small driver for llama.cpp's prebuilt libllama (tests/bench/peer_bench.sh):
// greedy decoding for the token check, prompt and decode timing with a
// persistent ggml threadpool, and expert quantization. Built by the script
// with g++ against the libraries of node-llama-cpp's npm package (headers
// from the llama.cpp git bundle inside it); never part of the CMake build.
//
//   llama_driver gen      --model F --threads T --n-gen N --prompts FILE
//       FILE: one prompt per line, comma-separated token ids. Prints one
//       line per prompt: the N greedy token ids, comma-separated. The
//       context is cleared between prompts. --logits FILE: every step's
//       logits (n_vocab f32 each, in order) written to FILE, to compare
//       the engines' log-probs (tests/bench/peer/gguf_agreement.sh).
//   llama_driver bench    --model F --threads T --n-gen N --prompt-ids IDS
//       One prompt (IDS) in one batch, then N greedy tokens, timed as
//       `moectl run` times them: TTFT = prompt batch + first argmax; TPOT =
//       the N-1 later decode steps (decode + argmax) / (N-1). The prompt runs
//       twice: first as the process's first forward (cold TTFT, reported
//       apart), then from an empty context (TTFT) followed by the decode.
//       Prints one JSON line.
//   llama_driver ppl      --model F --threads T --token-ids FILE
//       Teacher-forced perplexity of the ids in FILE (comma- or
//       whitespace-separated, scored as given, no BOS added), one context,
//       fed one token at a time as `moectl perplexity` feeds them: the mean
//       NLL of every next token from a float64 log-softmax. Prints one JSON
//       line.
//   llama_driver quantize IN OUT TYPE [--threads T]
//       TYPE q4_k_m | q5_k_m | q6_k: llama.cpp's own file types (its mixture
//       of types per tensor and layer, as its llama-quantize writes them);
//       TYPE q8_0 | q4_0 | q4_1: routed experts (*_exps) in TYPE, every other
//       tensor as stored in IN (bf16 stays bf16; norms and routers F32).
//
// Common flags: --libs DIR (where libggml-cpu-*.so live; default: the
// directory of libllama, found from /proc/self/maps), --mmap (map the GGUF
// instead of reading it into memory at load), --kv f16|f32 (the KV cache's
// type; llama.cpp's default f16, f32 as ours keeps it), --fa auto|on|off
// (flash attention; llama.cpp's default auto turns it on for the CPU, and
// its CPU kernel rounds K and V to f16 whatever --kv says), --verbose
// (llama.cpp logs on stderr).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "llama.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "llama_driver: %s\n", msg.c_str());
  std::exit(1);
}

struct Args {
  std::string cmd, model, prompts, prompt_ids, token_ids, libs, logits, kv = "f16", fa = "auto";
  std::vector<std::string> positional;
  int threads = 1;
  int n_gen = 32;
  bool mmap = false;
  bool verbose = false;
};

Args Parse(int argc, char** argv) {
  if (argc < 2) {
    Die("usage: llama_driver gen|bench|ppl|quantize ... (see the source's header)");
  }
  Args a;
  a.cmd = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string s = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value for " + s);
      return argv[++i];
    };
    if (s == "--model") a.model = value();
    else if (s == "--prompts") a.prompts = value();
    else if (s == "--prompt-ids") a.prompt_ids = value();
    else if (s == "--token-ids") a.token_ids = value();
    else if (s == "--kv") a.kv = value();
    else if (s == "--fa") a.fa = value();
    else if (s == "--libs") a.libs = value();
    else if (s == "--logits") a.logits = value();
    else if (s == "--threads") a.threads = std::atoi(value().c_str());
    else if (s == "--n-gen") a.n_gen = std::atoi(value().c_str());
    else if (s == "--mmap") a.mmap = true;
    else if (s == "--verbose") a.verbose = true;
    else if (s.rfind("--", 0) == 0) Die("unknown flag " + s);
    else a.positional.push_back(s);
  }
  if (a.threads < 1) Die("--threads must be >= 1");
  if (a.n_gen < 2) Die("--n-gen must be >= 2");
  if (a.kv != "f16" && a.kv != "f32") Die("--kv must be f16 or f32");
  if (a.fa != "auto" && a.fa != "on" && a.fa != "off") Die("--fa must be auto, on or off");
  return a;
}

std::vector<llama_token> ParseIds(const std::string& s) {
  std::vector<llama_token> ids;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    ids.push_back(static_cast<llama_token>(std::atol(item.c_str())));
  }
  return ids;
}

void QuietLog(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

// The directory holding libllama (the CPU variants lie beside it).
std::string LibDir() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    size_t p = line.find('/');
    if (p == std::string::npos) continue;
    std::string path = line.substr(p);
    if (path.find("libllama") != std::string::npos) {
      return path.substr(0, path.rfind('/'));
    }
  }
  Die("cannot find libllama in /proc/self/maps (pass --libs DIR)");
}

using ThreadpoolNew = decltype(ggml_threadpool_new)*;
using ThreadpoolFree = decltype(ggml_threadpool_free)*;

struct Engine {
  llama_model* model = nullptr;
  llama_context* ctx = nullptr;
  ggml_threadpool* pool = nullptr;
  FILE* logits_out = nullptr;  // gen --logits
  ThreadpoolFree pool_free = nullptr;
  int n_vocab = 0;

  ~Engine() {
    if (ctx) llama_free(ctx);
    if (pool) pool_free(pool);
    if (model) llama_model_free(model);
  }
};

void LoadBackends(const Args& a) {
  if (!a.verbose) llama_log_set(QuietLog, nullptr);
  ggml_backend_load_all_from_path((a.libs.empty() ? LibDir() : a.libs).c_str());
  llama_backend_init();
}

void Open(const Args& a, int n_ctx, Engine* e) {
  if (a.model.empty()) Die("--model is required");
  LoadBackends(a);
  ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
  if (!cpu) Die("no CPU backend loaded (libggml-cpu-*.so beside libllama?)");
  ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(cpu);
  auto pool_new = reinterpret_cast<ThreadpoolNew>(
      ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_new"));
  e->pool_free = reinterpret_cast<ThreadpoolFree>(
      ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_free"));
  if (!pool_new || !e->pool_free) Die("the CPU backend has no ggml_threadpool_new");

  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  // Read the weights into memory at load (default), as `moectl run
  // --expert-format F` converts the experts into buffers: the timed passes
  // then take no page faults on the weights. --mmap maps the file instead.
  mp.load_mode = a.mmap ? LLAMA_LOAD_MODE_MMAP : LLAMA_LOAD_MODE_NONE;
  e->model = llama_model_load_from_file(a.model.c_str(), mp);
  if (!e->model) Die("cannot load " + a.model);
  e->n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(e->model));

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(n_ctx);
  cp.n_batch = cp.n_ubatch = static_cast<uint32_t>(n_ctx);
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = a.threads;
  cp.no_perf = true;
  cp.type_k = cp.type_v = a.kv == "f32" ? GGML_TYPE_F32 : GGML_TYPE_F16;
  cp.flash_attn_type = a.fa == "on"    ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                       : a.fa == "off" ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                       : LLAMA_FLASH_ATTN_TYPE_AUTO;
  e->ctx = llama_init_from_model(e->model, cp);
  if (!e->ctx) Die("cannot create a context");

  ggml_threadpool_params tpp = ggml_threadpool_params_default(a.threads);
  e->pool = pool_new(&tpp);
  if (!e->pool) Die("cannot create a threadpool of " + std::to_string(a.threads));
  llama_attach_threadpool(e->ctx, e->pool, nullptr);

  if (a.verbose) {
    std::fprintf(stderr, "llama_driver: CPU backend %s (%s), %d threads, vocab %d\n",
                 ggml_backend_reg_name(reg), ggml_backend_dev_description(cpu),
                 a.threads, e->n_vocab);
  }
}

// Decodes `tokens` (one batch) and returns the argmax of the last logits.
llama_token DecodeArgmax(Engine* e, std::vector<llama_token>& tokens) {
  llama_batch batch = llama_batch_get_one(tokens.data(), static_cast<int32_t>(tokens.size()));
  if (int rc = llama_decode(e->ctx, batch); rc != 0) {
    Die("llama_decode failed: " + std::to_string(rc));
  }
  const float* logits = llama_get_logits_ith(e->ctx, -1);
  if (!logits) Die("no logits");
  if (e->logits_out != nullptr &&
      std::fwrite(logits, sizeof(float), static_cast<size_t>(e->n_vocab), e->logits_out) !=
          static_cast<size_t>(e->n_vocab)) {
    Die("writing --logits failed");
  }
  int best = 0;
  for (int i = 1; i < e->n_vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

// Greedy: the prompt in one batch, then n-1 single-token steps. `first` is
// the time the first token was known.
std::vector<llama_token> Greedy(Engine* e, std::vector<llama_token> prompt, int n,
                                Clock::time_point* first) {
  std::vector<llama_token> out;
  llama_token t = DecodeArgmax(e, prompt);
  if (first) *first = Clock::now();
  out.push_back(t);
  std::vector<llama_token> one(1);
  while (static_cast<int>(out.size()) < n) {
    one[0] = t;
    t = DecodeArgmax(e, one);
    out.push_back(t);
  }
  return out;
}

int RunGen(const Args& a) {
  std::ifstream in(a.prompts);
  if (!in) Die("cannot read --prompts " + a.prompts);
  std::vector<std::vector<llama_token>> prompts;
  std::string line;
  size_t longest = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    prompts.push_back(ParseIds(line));
    longest = std::max(longest, prompts.back().size());
  }
  Engine e;
  Open(a, static_cast<int>(longest) + a.n_gen + 8, &e);
  if (!a.logits.empty()) {
    e.logits_out = std::fopen(a.logits.c_str(), "wb");
    if (e.logits_out == nullptr) Die("cannot write --logits " + a.logits);
  }
  for (const auto& p : prompts) {
    for (llama_token id : p) {
      if (id < 0 || id >= e.n_vocab) Die("prompt token " + std::to_string(id) + " out of range");
    }
    llama_memory_clear(llama_get_memory(e.ctx), true);
    std::vector<llama_token> out = Greedy(&e, p, a.n_gen, nullptr);
    for (size_t i = 0; i < out.size(); ++i) std::printf(i ? ",%d" : "%d", out[i]);
    std::printf("\n");
  }
  if (e.logits_out != nullptr && std::fclose(e.logits_out) != 0) Die("closing --logits failed");
  return 0;
}

int RunBench(const Args& a) {
  std::vector<llama_token> prompt = ParseIds(a.prompt_ids);
  if (prompt.empty()) Die("--prompt-ids is required");
  Engine e;
  Open(a, static_cast<int>(prompt.size()) + a.n_gen + 8, &e);
  // The prompt once as the process's first forward (cold: first touch of
  // the weights' pages, the threadpool's first wake-up), then again from an
  // empty context (warm, as llama-bench times it after its warm-up run).
  Clock::time_point first;
  Clock::time_point start = Clock::now();
  Greedy(&e, prompt, 1, &first);
  const double ttft_cold = Seconds(start, first);
  llama_memory_clear(llama_get_memory(e.ctx), true);
  start = Clock::now();
  std::vector<llama_token> out = Greedy(&e, prompt, a.n_gen, &first);
  const Clock::time_point end = Clock::now();
  const double ttft = Seconds(start, first);
  const double tpot = Seconds(first, end) / (a.n_gen - 1);
  std::printf("{\"prompt_tokens\":%zu,\"generated_tokens\":%d,\"threads\":%d,"
              "\"cold_time_to_first_token_seconds\":%.9f,"
              "\"time_to_first_token_seconds\":%.9f,\"time_per_output_token_seconds\":%.9f,"
              "\"prompt_tokens_per_second\":%.3f,\"decode_tokens_per_second\":%.3f,"
              "\"first_tokens\":\"",
              prompt.size(), a.n_gen, a.threads, ttft_cold, ttft, tpot,
              prompt.size() / ttft, 1.0 / tpot);
  for (size_t i = 0; i < out.size() && i < 8; ++i) std::printf(i ? ",%d" : "%d", out[i]);
  std::printf("\"}\n");
  return 0;
}

int RunPpl(const Args& a) {
  std::ifstream in(a.token_ids);
  if (!in) Die("cannot read --token-ids " + a.token_ids);
  std::stringstream text;
  text << in.rdbuf();
  std::string all = text.str();
  for (char& c : all) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') c = ',';
  }
  std::vector<llama_token> ids = ParseIds(all);
  if (ids.size() < 2) Die("--token-ids gives fewer than 2 tokens");
  Engine e;
  Open(a, static_cast<int>(ids.size()) + 8, &e);
  for (llama_token id : ids) {
    if (id < 0 || id >= e.n_vocab) Die("token " + std::to_string(id) + " out of range");
  }
  double nll = 0;
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    llama_batch batch = llama_batch_get_one(&ids[i], 1);
    if (int rc = llama_decode(e.ctx, batch); rc != 0) {
      Die("llama_decode failed: " + std::to_string(rc));
    }
    const float* logits = llama_get_logits_ith(e.ctx, -1);
    if (!logits) Die("no logits");
    double mx = -INFINITY;
    for (int v = 0; v < e.n_vocab; ++v) mx = std::max(mx, static_cast<double>(logits[v]));
    double sum = 0;
    for (int v = 0; v < e.n_vocab; ++v) sum += std::exp(static_cast<double>(logits[v]) - mx);
    nll -= static_cast<double>(logits[ids[i + 1]]) - (mx + std::log(sum));
  }
  const double n = static_cast<double>(ids.size() - 1);
  std::printf("{\"tokens_scored\":%zu,\"kv\":\"%s\",\"nll\":%.9f,\"perplexity\":%.6f}\n",
              ids.size() - 1, a.kv.c_str(), nll / n, std::exp(nll / n));
  return 0;
}

int RunQuantize(const Args& a) {
  if (a.positional.size() != 3) {
    Die("usage: llama_driver quantize IN OUT q8_0|q4_0|q4_1|q4_k_m|q5_k_m|q6_k");
  }
  const std::string& type = a.positional[2];
  llama_ftype ftype;
  ggml_type expert = GGML_TYPE_COUNT;  // COUNT: llama.cpp's own mixture for every tensor
  if (type == "q4_k_m") {
    ftype = LLAMA_FTYPE_MOSTLY_Q4_K_M;
  } else if (type == "q5_k_m") {
    ftype = LLAMA_FTYPE_MOSTLY_Q5_K_M;
  } else if (type == "q6_k") {
    ftype = LLAMA_FTYPE_MOSTLY_Q6_K;
  } else if (type == "q8_0") {
    ftype = LLAMA_FTYPE_MOSTLY_Q8_0;
    expert = GGML_TYPE_Q8_0;
  } else if (type == "q4_0") {
    ftype = LLAMA_FTYPE_MOSTLY_Q4_0;
    expert = GGML_TYPE_Q4_0;
  } else if (type == "q4_1") {
    ftype = LLAMA_FTYPE_MOSTLY_Q4_1;
    expert = GGML_TYPE_Q4_1;
  } else {
    Die("unknown type " + type + " (q8_0, q4_0, q4_1, q4_k_m, q5_k_m, q6_k)");
  }
  LoadBackends(a);
  // Experts in `expert`; everything else stays as it is in IN (the first
  // matching pattern wins; embeddings and output by their own fields).
  const llama_model_tensor_override overrides[] = {
      {"_exps\\.weight$", expert}, {".", GGML_TYPE_BF16}, {nullptr, GGML_TYPE_COUNT}};
  llama_model_quantize_params qp = llama_model_quantize_default_params();
  qp.nthread = a.threads;
  qp.ftype = ftype;
  if (expert != GGML_TYPE_COUNT) {
    qp.token_embedding_type = GGML_TYPE_BF16;
    qp.output_tensor_type = GGML_TYPE_BF16;
    qp.tt_overrides = overrides;
  }
  if (llama_model_quantize(a.positional[0].c_str(), a.positional[1].c_str(), &qp) != 0) {
    Die("llama_model_quantize failed for " + a.positional[0]);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a = Parse(argc, argv);
  if (a.cmd == "gen") return RunGen(a);
  if (a.cmd == "bench") return RunBench(a);
  if (a.cmd == "ppl") return RunPpl(a);
  if (a.cmd == "quantize") return RunQuantize(a);
  Die("unknown command " + a.cmd + " (gen, bench, ppl, quantize)");
}
