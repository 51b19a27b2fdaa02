// moectl serve --model DIR: the quick start. Plans as `moectl plan` does
// (same flags), refuses a plan that does not fit (saying what would), then
// starts moe-cached (when the plan has one: with a GPU, or --daemon on) and
// moe-worker with the planned flags on private Unix sockets in a fresh 0700
// directory, the worker's OpenAI HTTP API on 127.0.0.1:--port, and says
// where to connect. SIGINT or SIGTERM stops the worker (it drains), then
// the daemon, each given 10 s before SIGKILL; if either exits by itself,
// the other is stopped and moectl exits with the child's status (its error
// is already on stderr, which both share). The children get SIGTERM if
// moectl dies (PR_SET_PDEATHSIG), so none is left behind. For a service,
// the systemd units remain the way (deploy/).
//
// Exit codes: 0 after a clean stop; 2 for a usage error; 1 when the plan
// does not fit or a binary is missing; a child's own exit status (or 128 +
// its signal) when it ends first.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_desc.h"
#include "nlohmann/json.hpp"
#include "services/moectl/commands.h"
#include "services/moectl/flags.h"
#include "services/moectl/plan_flags.h"
#include "services/plan/plan.h"

namespace moe::moectl {
namespace {

constexpr auto kStopGrace = std::chrono::seconds(10);

// The name the worker serves the model under: the directory's basename.
std::string ModelName(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return std::filesystem::path(dir).filename().string();
}

int Fail(const std::string& message, int code) {
  std::fprintf(stderr, "moectl serve: %s\n", message.c_str());
  return code;
}

// moe-cached and moe-worker: beside this moectl (a build's bin/, or an
// install's), else on PATH.
std::string Binary(const std::string& name, const std::string& dir_flag) {
  if (!dir_flag.empty()) return dir_flag + "/" + name;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path beside = self.parent_path() / name;
    if (::access(beside.c_str(), X_OK) == 0) return beside.string();
  }
  return name;  // execvp searches PATH
}

// Starts `program args` with the termination signals unblocked and SIGTERM
// on moectl's death; -1 (errno set) if fork fails. An exec failure exits
// the child with 127, after saying so.
pid_t Spawn(const std::string& program, const std::vector<std::string>& args) {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::_exit(1);  // moectl died before prctl
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(program.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execvp(program.c_str(), argv.data());
  std::fprintf(stderr, "moectl serve: cannot run %s: %s\n", program.c_str(), std::strerror(errno));
  ::_exit(127);
}

// The exit code a child's wait status stands for.
int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// SIGTERM, then SIGKILL after the grace; returns its exit code.
int Stop(pid_t pid, const char* name) {
  if (pid <= 0) return 0;
  ::kill(pid, SIGTERM);
  const auto end = std::chrono::steady_clock::now() + kStopGrace;
  int status = 0;
  while (true) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return ExitCodeOf(status);
    if (r < 0) return 0;  // already reaped
    if (std::chrono::steady_clock::now() >= end) {
      std::fprintf(stderr, "moectl serve: %s did not stop in %lld s: SIGKILL\n", name,
                   static_cast<long long>(kStopGrace.count()));
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return ExitCodeOf(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// The two children (-1 once reaped) and the signals that stop them.
struct Watch {
  pid_t cached = -1;
  pid_t worker = -1;
  sigset_t signals;
};

enum class Event { kNone, kSignal, kCachedExited, kWorkerExited };

// One look: a pending signal, or a child that exited (its status in
// *status). Waits up to `wait`.
Event Poll(Watch& w, std::chrono::milliseconds wait, int* status) {
  for (pid_t* p : {&w.cached, &w.worker}) {
    if (*p > 0 && ::waitpid(*p, status, WNOHANG) == *p) {
      const Event e = p == &w.cached ? Event::kCachedExited : Event::kWorkerExited;
      *p = -1;
      return e;
    }
  }
  timespec ts{0, static_cast<long>(wait.count()) * 1000000L};
  if (::sigtimedwait(&w.signals, nullptr, &ts) > 0) return Event::kSignal;
  return Event::kNone;
}

int RunServe(const Args& args) {
  FlagSet flags("serve", "--model DIR [--port 8080] [plan flags]");
  DeclarePlanFlags(flags);
  flags.Group("serve");
  flags.Int("port", 8080, "the OpenAI HTTP API's port on 127.0.0.1 (0: any free one)",
            {.min = 0, .max = 65535});
  flags.String("bin-dir", "",
               "where moe-cached and moe-worker are (default: beside moectl, else PATH)");
  flags.String("run-dir", "",
               "directory for the private sockets, created 0700 (default: a new one under "
               "$XDG_RUNTIME_DIR or /tmp, removed at exit)");
  flags.NoPositional();
  flags.Notes(absl::StrCat(
      "Plans as `moectl plan` (the same flags and notes), then starts what it planned\n"
      "(moe-worker, and moe-cached with a GPU or --daemon on); Ctrl-C (SIGINT) or\n"
      "SIGTERM stops them.\n",
      kPlanNotes));
  int code = 0;
  const std::optional<ModelConfig> config = ParsePlanCommand(flags, args, "serve", &code);
  if (!config.has_value()) return code;
  const std::string dir = flags.GetString("model");

  // The private directory for both sockets.
  std::string run_dir = flags.GetString("run-dir");
  bool remove_run_dir = false;
  if (run_dir.empty()) {
    const char* base = std::getenv("XDG_RUNTIME_DIR");
    std::string tmpl = absl::StrCat(base != nullptr && *base != '\0' ? base : "/tmp",
                                    "/moectl-serve.XXXXXX");
    if (::mkdtemp(tmpl.data()) == nullptr) {
      return Fail(absl::StrCat("cannot create ", tmpl, ": ", std::strerror(errno)), 1);
    }
    run_dir = tmpl;
    remove_run_dir = true;
  } else if (::mkdir(run_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Fail(absl::StrCat("--run-dir ", run_dir, ": ", std::strerror(errno)), 1);
  }
  ::chmod(run_dir.c_str(), 0700);
  struct Cleanup {
    std::string dir;
    bool remove;
    ~Cleanup() {
      if (!remove) return;
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{run_dir, remove_run_dir};

  bool from_weights = false;
  const plan::StoredFormats stored = StoredFormatsOf(dir, *config, &from_weights, "serve");
  plan::PlanOptions options = PlanOptionsFromFlags(flags, *config, /*quiet=*/false, "serve");
  options.daemon_socket = "unix:" + run_dir + "/moe-cached.sock";
  absl::StatusOr<plan::Plan> p = plan::MakePlan(*config, stored, options);
  if (!p.ok()) return Fail(std::string(p.status().message()), 2);
  std::fputs(PlanReport(dir, *config, from_weights, *p).c_str(), stderr);
  if (!p->fits) return Fail("the plan does not fit (above): nothing started", 1);

  const std::string worker_sock = "unix:" + run_dir + "/moe-worker.sock";
  const std::string ports = run_dir + "/worker-ports.json";
  std::vector<std::string> daemon_args = p->daemon_flags;
  daemon_args.insert(daemon_args.end(), {"--metrics-addr", ""});
  std::vector<std::string> worker_args = p->worker_flags;
  worker_args.insert(worker_args.end(),
                     {"--listen", worker_sock, "--http-listen",
                      absl::StrCat("127.0.0.1:", flags.GetInt("port")), "--metrics-addr",
                      "127.0.0.1:0", "--port-file", ports});
  // The daemon may take a while to load a large model.
  if (p->daemon) worker_args.insert(worker_args.end(), {"--cache-wait", "600"});
  const std::string bin_dir = flags.GetString("bin-dir");
  const std::string cached_bin = Binary("moe-cached", bin_dir);
  const std::string worker_bin = Binary("moe-worker", bin_dir);

  // The termination signals wait for sigtimedwait from here on (the
  // children unblock them).
  Watch w;
  sigemptyset(&w.signals);
  sigaddset(&w.signals, SIGINT);
  sigaddset(&w.signals, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &w.signals, nullptr);

  if (p->daemon) {
    std::fprintf(stderr, "moectl serve: %s\n", plan::ShellLine(cached_bin, daemon_args).c_str());
    w.cached = Spawn(cached_bin, daemon_args);
    if (w.cached < 0) return Fail(absl::StrCat("fork: ", std::strerror(errno)), 1);
  }
  std::fprintf(stderr, "moectl serve: %s\n", plan::ShellLine(worker_bin, worker_args).c_str());
  w.worker = Spawn(worker_bin, worker_args);
  if (w.worker < 0) {
    Stop(w.cached, "moe-cached");
    return Fail(absl::StrCat("fork: ", std::strerror(errno)), 1);
  }
  if (p->daemon) {
    std::fprintf(stderr, "moectl serve: moe-cached pid %d, moe-worker pid %d\n",
                 static_cast<int>(w.cached), static_cast<int>(w.worker));
  } else {
    std::fprintf(stderr, "moectl serve: moe-worker pid %d (every expert in it: no moe-cached)\n",
                 static_cast<int>(w.worker));
  }

  bool announced = false;
  int status = 0;
  code = 0;
  while (true) {
    const Event e = Poll(w, std::chrono::milliseconds(100), &status);
    if (e == Event::kSignal) {
      std::fprintf(stderr, "moectl serve: stopping\n");
      break;
    }
    if (e == Event::kCachedExited || e == Event::kWorkerExited) {
      code = ExitCodeOf(status);
      std::fprintf(stderr, "moectl serve: %s exited (status %d); stopping\n",
                   e == Event::kCachedExited ? "moe-cached" : "moe-worker", code);
      if (code == 0) code = 1;  // neither stops by itself
      break;
    }
    if (!announced) {
      std::ifstream in(ports);
      nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (!j.is_discarded() && j.is_object() && j.value("http_port", 0) > 0) {
        announced = true;
        std::printf(
            "serving %s\n"
            "  OpenAI API: http://127.0.0.1:%d/v1  (model \"%s\")\n"
            "  gRPC:       %s\n"
            "  metrics:    http://127.0.0.1:%d/metrics\n"
            "Ctrl-C stops %s.\n",
            dir.c_str(), j.value("http_port", 0), ModelName(dir).c_str(), worker_sock.c_str(),
            j.value("metrics_port", 0), p->daemon ? "both" : "it");
        std::fflush(stdout);
      }
    }
  }
  const int worker_code = Stop(w.worker, "moe-worker");
  const int cached_code = Stop(w.cached, "moe-cached");
  if (code == 0 && (worker_code != 0 || cached_code != 0)) {
    code = worker_code != 0 ? worker_code : cached_code;
  }
  std::fprintf(stderr, "moectl serve: stopped\n");
  return code;
}

const bool kRegistered = RegisterCommand(
    {"serve", "plan, then start moe-worker (and moe-cached) with the OpenAI API (quick start)",
     &RunServe});

}  // namespace
}  // namespace moe::moectl
