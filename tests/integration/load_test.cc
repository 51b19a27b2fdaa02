// Load (operations issue, item 3): 16 concurrent streaming Generate clients
// against the real moe-worker attached to the real moe-cached (a cache
// smaller than the model) for a bounded time (10 s; MOE_LONG_TESTS=1: 60 s).
// Every request must give the in-process greedy reference tokens. Before,
// during and after the load both processes are sampled from /proc (resident
// memory, open descriptors, threads) and the daemon for its leases: once
// the clients stop, descriptors, threads and leases return to their
// baseline and resident memory grows by less than a per-request leak would
// add.
#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "gtest/gtest.h"
#include "moe/v1/expert_cache.grpc.pb.h"
#include "services/engine/session.h"
#include "tests/moe_worker/worker_process.h"
#include "tests/moe_worker/worker_test_util.h"

namespace moe::worker {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitizerBuild = true;
#else
constexpr bool kSanitizerBuild = false;
#endif


using testing::CachedBinary;
using testing::WorkerProcess;

constexpr int kClients = 16;
constexpr int kNewTokens = 8;

std::vector<int32_t> PromptFor(int c) { return {11 + c, 22, 33 + 2 * c, 44, 55 + 3 * c}; }

bool LongTests() {
  const char* v = std::getenv("MOE_LONG_TESTS");
  return v != nullptr && std::string(v) == "1";
}

// The pid of this process's child whose /proc comm is `comm`; 0 if none.
int ChildPid(const std::string& comm) {
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return 0;
  int found = 0;
  while (const dirent* e = ::readdir(d)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    std::ifstream stat("/proc/" + std::string(e->d_name) + "/stat");
    std::string line;
    std::getline(stat, line);
    // "pid (comm) state ppid ..."
    const size_t open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string state;
    int ppid = 0;
    rest >> state >> ppid;
    if (ppid == ::getpid() && line.substr(open + 1, close - open - 1) == comm) found = pid;
  }
  ::closedir(d);
  return found;
}

struct ProcSample {
  int64_t rss_kb = -1;
  int fds = -1;
  int threads = -1;
  int own_threads = -1;  // named like the process: its own std::threads
};

ProcSample Sample(int pid) {
  ProcSample s;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view v = line;
    for (auto [key, out] : {std::pair<absl::string_view, int64_t*>{"VmRSS:", &s.rss_kb}}) {
      if (absl::StartsWith(v, key)) {
        std::string num(v.substr(key.size()));
        num.erase(std::remove_if(num.begin(), num.end(), [](char c) { return !isdigit(c); }),
                  num.end());
        (void)absl::SimpleAtoi(num, out);
      }
    }
    if (absl::StartsWith(v, "Threads:")) (void)absl::SimpleAtoi(v.substr(8), &s.threads);
  }
  std::string comm;
  std::getline(std::ifstream("/proc/" + std::to_string(pid) + "/comm"), comm);
  const std::string task = "/proc/" + std::to_string(pid) + "/task";
  if (DIR* t = ::opendir(task.c_str()); t != nullptr) {
    s.own_threads = 0;
    while (const dirent* e = ::readdir(t)) {
      if (e->d_name[0] == '.') continue;
      std::string name;
      std::getline(std::ifstream(task + "/" + e->d_name + "/comm"), name);
      s.own_threads += name == comm;
    }
    ::closedir(t);
  }
  DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (d != nullptr) {
    s.fds = 0;
    while (const dirent* e = ::readdir(d)) s.fds += e->d_name[0] != '.';
    ::closedir(d);
  }
  return s;
}

// "name xN, ..." of a process's threads, to tell pools from leaks.
std::string ThreadNames(int pid) {
  std::map<std::string, int> names;
  const std::string task = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(task.c_str());
  if (d == nullptr) return "";
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(task + "/" + e->d_name + "/comm");
    std::string name;
    std::getline(comm, name);
    ++names[name];
  }
  ::closedir(d);
  std::string out;
  for (const auto& [name, n] : names) {
    out += (out.empty() ? "" : ", ") + name + " x" + std::to_string(n);
  }
  return out;
}

struct Observed {
  ProcSample baseline, peak, after;
  void Peak(const ProcSample& s) {
    peak.rss_kb = std::max(peak.rss_kb, s.rss_kb);
    peak.fds = std::max(peak.fds, s.fds);
    peak.threads = std::max(peak.threads, s.threads);
    peak.own_threads = std::max(peak.own_threads, s.own_threads);
  }
  void Print(const char* who) const {
    std::printf(
        "%-10s RSS kB %lld / %lld / %lld   fds %d / %d / %d   threads %d / %d / %d "
        "(own %d / %d / %d)\n",
        who, static_cast<long long>(baseline.rss_kb), static_cast<long long>(peak.rss_kb),
        static_cast<long long>(after.rss_kb), baseline.fds, peak.fds, after.fds,
        baseline.threads, peak.threads, after.threads, baseline.own_threads, peak.own_threads,
        after.own_threads);
  }
};

struct ClientResult {
  int ok = 0;
  int wrong = 0;
  int failed = 0;
  std::vector<std::string> errors;  // the first few
};

// One streaming Generate; true when it finished OK with `expected`.
bool GenerateOnce(v1::Inference::Stub* stub, int c, const std::vector<int32_t>& expected,
                  ClientResult* out) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::GenerateRequest r;
  for (int32_t id : PromptFor(c)) r.add_prompt_token_ids(id);
  r.set_max_new_tokens(kNewTokens);
  r.set_ignore_eos(true);  // greedy: temperature left at its default 0
  auto reader = stub->Generate(&ctx, r);
  v1::GenerateResponse resp;
  std::vector<int32_t> tokens;
  while (reader->Read(&resp)) tokens.push_back(resp.token_id());
  grpc::Status s = reader->Finish();
  if (!s.ok()) {
    ++out->failed;
    if (out->errors.size() < 5) {
      out->errors.push_back(std::to_string(s.error_code()) + ": " + s.error_message());
    }
    return false;
  }
  if (tokens != expected) {
    ++out->wrong;
    return false;
  }
  ++out->ok;
  return true;
}

// Param: moe-worker's --max-batch (1: one at a time; 16: every client's
// stream in one continuous batch, issue 14) and whether its KV budget is
// tight: room for the KV of 4 of the 16 sequences, in blocks of 2
// positions, so sequences give their blocks up and recompute them all the
// time (preemption), every token still checked.
// `hog`: one busy loop per core runs beside the services for the whole test
// (issue 32: the per-layer hand-offs must not wait for a scheduler slice
// each, so every request still finishes within its deadline).
struct LoadParam {
  int max_batch = 1;
  bool tight_kv = false;
  bool hog = false;
};

void PrintTo(const LoadParam& p, std::ostream* os) {
  *os << "max_batch " << p.max_batch << (p.tight_kv ? ", tight KV" : "")
      << (p.hog ? ", busy loop per core" : "");
}

// One busy loop per online CPU in child processes, killed on destruction.
class CpuHogs {
 public:
  CpuHogs() {
    const long cpus = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
    for (long i = 0; i < cpus; ++i) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed test
        volatile uint64_t n = 0;
        for (;;) n = n + 1;
      }
      if (pid > 0) pids_.push_back(pid);
    }
  }
  ~CpuHogs() {
    for (pid_t pid : pids_) ::kill(pid, SIGKILL);
    for (pid_t pid : pids_) ::waitpid(pid, nullptr, 0);
  }
  CpuHogs(const CpuHogs&) = delete;
  CpuHogs& operator=(const CpuHogs&) = delete;
  size_t size() const { return pids_.size(); }

 private:
  std::vector<pid_t> pids_;
};

class LoadTest : public ::testing::TestWithParam<LoadParam> {
 protected:
  // The tiny model, moe-cached (12 of 32 experts), moe-worker on it, and
  // the in-process reference tokens of every client's prompt.
  void SetUp() override {
    const std::string model_dir = dir_.Sub("tiny");
    ASSERT_TRUE(moe::testing::MakeTinyModel(model_dir).ok());
    const std::string cache_sock = "unix:" + dir_.Sub("c.sock");
    const std::string worker_sock = "unix:" + dir_.Sub("w.sock");
    ASSERT_TRUE(daemon_.Spawn({"--model", "tiny=" + model_dir, "--listen", cache_sock,
                               "--metrics-addr", "", "--cache-experts", "12"},
                              dir_.Sub("cached.log"), CachedBinary()));
    ASSERT_TRUE(daemon_.WaitServing(cache_sock)) << daemon_.Log();
    std::vector<std::string> args = {"--model", model_dir, "--listen", worker_sock, "--cache",
                                     cache_sock, "--cache-model", "tiny", "--backend", "cpu",
                                     "--metrics-addr", "", "--max-queue", "32", "--max-batch",
                                     std::to_string(GetParam().max_batch), "--prefill-chunk", "3"};
    if (GetParam().tight_kv) {
      auto backend = CreateBackend("cpu");
      ASSERT_TRUE(backend.ok()) << backend.status();
      auto model = MoeModel::Load(model_dir, backend->get());
      ASSERT_TRUE(model.ok()) << model.status();
      const int64_t one = Session::KvCacheBytes(
          **model, static_cast<int64_t>(PromptFor(0).size()) + kNewTokens);
      char mb[64];
      std::snprintf(mb, sizeof(mb), "%.9f", 4.0 * static_cast<double>(one) / (1 << 20));
      args.insert(args.end(), {"--kv-budget-mb", mb, "--kv-block-tokens", "2"});
    }
    ASSERT_TRUE(worker_.Spawn(args, dir_.Sub("worker.log")));
    ASSERT_TRUE(worker_.WaitServing(worker_sock)) << worker_.Log();
    daemon_pid_ = ChildPid("moe-cached");
    worker_pid_ = ChildPid("moe-worker");
    ASSERT_GT(daemon_pid_, 0);
    ASSERT_GT(worker_pid_, 0);
    cache_stub_ =
        v1::ExpertCache::NewStub(rpc::MakeChannel(*rpc::ParseListenAddress(cache_sock)));
    auto channel = rpc::MakeChannel(*rpc::ParseListenAddress(worker_sock));
    for (int c = 0; c < kClients; ++c) stubs_.push_back(v1::Inference::NewStub(channel));
    results_.resize(kClients);

    for (int c = 0; c < kClients; ++c) {
      expected_[c] = testing::ReferenceTokensFromDir(model_dir, PromptFor(c), kNewTokens);
      ASSERT_EQ(expected_[c].size(), static_cast<size_t>(kNewTokens));
    }
  }

  uint64_t Leases() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::GetStatsRequest req;
    req.set_model("tiny");
    v1::GetStatsResponse stats;
    grpc::Status s = cache_stub_->GetStats(&ctx, req, &stats);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return s.ok() && stats.models_size() == 1 ? stats.models(0).leases_held() : ~0ull;
  }

  // Runs all clients back to back for `length`, calling `sample` every
  // 100 ms meanwhile.
  void RunLoad(std::chrono::steady_clock::duration length, const std::function<void()>& sample) {
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (int c = 0; c < kClients; ++c) {
      threads.emplace_back([&, c] {
        while (!stop.load()) GenerateOnce(stubs_[c].get(), c, expected_[c], &results_[c]);
      });
    }
    // The wait is the test's time budget, not a wait for an event.
    const auto end = std::chrono::steady_clock::now() + length;
    std::mutex mu;
    std::condition_variable never;
    std::unique_lock<std::mutex> lock(mu);
    while (std::chrono::steady_clock::now() < end) {
      never.wait_for(lock, std::chrono::milliseconds(100));
      sample();
    }
    stop = true;
    for (auto& t : threads) t.join();
  }

  int RequestsOk() const {
    int n = 0;
    for (const ClientResult& r : results_) n += r.ok;
    return n;
  }

  moe::testing::TempDir dir_;
  WorkerProcess daemon_, worker_;
  int daemon_pid_ = 0, worker_pid_ = 0;
  std::unique_ptr<v1::ExpertCache::Stub> cache_stub_;
  std::vector<std::unique_ptr<v1::Inference::Stub>> stubs_;
  std::map<int, std::vector<int32_t>> expected_;
  std::vector<ClientResult> results_;
};

TEST_P(LoadTest, SixteenStreamingClientsLeakNothing) {
  const auto duration = std::chrono::seconds(LongTests() ? 60 : 10);
  std::optional<CpuHogs> hogs;
  if (GetParam().hog) {
    hogs.emplace();
    std::printf("beside %zu busy loops\n", hogs->size());
  }
  // Warm-up under the same load, so the servers' thread pools, connections
  // and allocator arenas reach their working size before the baseline.
  RunLoad(std::chrono::seconds(2), [] {});
  Observed daemon_obs, worker_obs;
  ASSERT_EQ(Leases(), 0u);  // (also opens this test's connection to the daemon)
  daemon_obs.baseline = daemon_obs.peak = Sample(daemon_pid_);
  worker_obs.baseline = worker_obs.peak = Sample(worker_pid_);
  const int warmup_ok = RequestsOk();

  uint64_t peak_leases = 0;
  RunLoad(duration, [&] {
    daemon_obs.Peak(Sample(daemon_pid_));
    worker_obs.Peak(Sample(worker_pid_));
    peak_leases = std::max(peak_leases, Leases());
  });

  // Settle: poll until the daemon holds no leases and both processes are
  // back to their baseline descriptors and own threads (or 10 s pass).
  uint64_t leases = ~0ull;
  const auto settle_end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  const auto settle_start = std::chrono::steady_clock::now();
  do {
    leases = Leases();
    daemon_obs.after = Sample(daemon_pid_);
    worker_obs.after = Sample(worker_pid_);
    if (leases == 0 && daemon_obs.after.fds <= daemon_obs.baseline.fds &&
        worker_obs.after.fds <= worker_obs.baseline.fds &&
        daemon_obs.after.own_threads <= daemon_obs.baseline.own_threads &&
        worker_obs.after.own_threads <= worker_obs.baseline.own_threads) {
      break;
    }
  } while (std::chrono::steady_clock::now() < settle_end);
  const double settle_ms = std::chrono::duration<double, std::milli>(
                               std::chrono::steady_clock::now() - settle_start)
                               .count();

  int ok = 0, wrong = 0, failed_calls = 0;
  for (int c = 0; c < kClients; ++c) {
    SCOPED_TRACE(::testing::Message() << "client " << c);
    ok += results_[c].ok;
    wrong += results_[c].wrong;
    failed_calls += results_[c].failed;
    for (const std::string& e : results_[c].errors) ADD_FAILURE() << e;
    EXPECT_GT(results_[c].ok, 0);
  }
  ok -= warmup_ok;
  std::printf("%d clients, %lld s: %d requests ok, %d wrong tokens, %d failed; peak leases %llu; "
              "settled in %.0f ms\n",
              kClients, static_cast<long long>(duration.count()), ok, wrong, failed_calls,
              static_cast<unsigned long long>(peak_leases), settle_ms);
  std::printf("threads after: moe-cached: %s\n", ThreadNames(daemon_pid_).c_str());
  std::printf("threads after: moe-worker: %s\n", ThreadNames(worker_pid_).c_str());
  std::printf("(baseline / peak / after)\n");
  daemon_obs.Print("moe-cached");
  worker_obs.Print("moe-worker");
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(failed_calls, 0);
  EXPECT_EQ(leases, 0u);
  for (const Observed* o : {&daemon_obs, &worker_obs}) {
    EXPECT_LE(o->after.fds, o->baseline.fds + 2);
    // The processes' own threads come back exactly; gRPC's executor pool
    // may keep a few more idle threads (it grew 1 -> 4 on 2 cores), bounded
    // by gRPC, not by the number of requests.
    EXPECT_LE(o->after.own_threads, o->baseline.own_threads);
    EXPECT_LE(o->after.threads, o->baseline.threads + 4);
    // The default run serves 2500-3400 requests after the warm-up, and
    // resident memory grew by 0.0-0.25 MB when measured: a leak of 2 KiB
    // per request (one small buffer, a map entry with a string) breaks 4 MB.
    // Under AddressSanitizer freed memory sits in its quarantine (RSS grew
    // 75-313 MB in that build), so RSS says nothing; there LeakSanitizer
    // checks every allocation when the services exit, and a leak makes the
    // exit status below non-zero.
    if (!kSanitizerBuild) {
      EXPECT_LT(o->after.rss_kb - o->baseline.rss_kb, 4 * 1024);
    }
  }

  if (GetParam().tight_kv) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::GetMetricsResponse metrics;
    grpc::Status s = stubs_[0]->GetMetrics(&ctx, v1::GetMetricsRequest(), &metrics);
    ASSERT_TRUE(s.ok()) << s.error_message();
    const double preemptions =
        testing::MetricValue(metrics.text(), "moe_worker_kv_preemptions_total");
    std::printf("KV preemptions: %.0f\n", preemptions);
    EXPECT_GT(preemptions, 0) << "the tight KV budget never ran out";
  }
  worker_.Signal(SIGTERM);
  EXPECT_EQ(worker_.Wait(), 0) << worker_.Log();
  daemon_.Signal(SIGTERM);
  EXPECT_EQ(daemon_.Wait(), 0) << daemon_.Log();
}

INSTANTIATE_TEST_SUITE_P(MaxBatch, LoadTest,
                         ::testing::Values(LoadParam{1, false}, LoadParam{16, false},
                                           LoadParam{16, true}, LoadParam{1, false, true},
                                           LoadParam{16, false, true}),
                         [](const ::testing::TestParamInfo<LoadParam>& p) {
                           return "MaxBatch" + std::to_string(p.param.max_batch) +
                                  (p.param.tight_kv ? "TightKv" : "") +
                                  (p.param.hog ? "BesideBusyLoops" : "");
                         });

}  // namespace
}  // namespace moe::worker
