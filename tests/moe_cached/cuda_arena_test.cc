// The daemon's CUDA side: device choice, pinning errors, the arena (fake
// module, always) and, on a GPU, an arena filled by the CudaCopyEngine and
// mapped through CUDA IPC in a child process (skipped without a device).
#include "services/moe_cached/cuda_arena.h"

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "kernels/device_memory.h"
#include "services/cache/cuda_copy_engine.h"
#include "common/model_desc.h"
#include "prometheus/registry.h"
#include "services/moe_cached/cached_model.h"
#include "services/moe_cached/daemon_options.h"
#include "services/moe_cached/expert_store.h"
#include "services/moe_cached/sessions.h"
#include "tests/cache/fake_cuda_module.h"
#include "tests/moe_cached/daemon_process.h"

extern char** environ;

namespace moe::cached {
namespace {

using ::absl::StatusCode;
using ::moe::testing::FakeCuda;

bool Contains(const absl::Status& s, const std::string& what) {
  return s.message().find(what) != absl::string_view::npos;
}

TEST(CudaArenaTest, ResolveDeviceChoices) {
  EXPECT_EQ(ResolveDevice("gpu").status().code(), StatusCode::kInvalidArgument);
  auto cpu = ResolveDevice("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_FALSE(cpu->is_cuda());
  auto automatic = ResolveDevice("auto");  // never an error
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  auto cuda = ResolveDevice("cuda");
  EXPECT_EQ(cuda.ok(), automatic->is_cuda());
  if (!cuda.ok()) {
    EXPECT_EQ(cuda.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Contains(cuda.status(), "no usable CUDA device")) << cuda.status();
  } else {
    EXPECT_GT(cuda->free_bytes, 0u);
  }
}

TEST(CudaArenaTest, DeviceFlagAndVramFractionCapacity) {
  auto o = ParseDaemonFlags({"--model", "/m", "--device", "cuda"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->device, "cuda");
  // The same default as moe-worker's --device (issue 28: the shipped
  // services connect on a GPU host).
  EXPECT_EQ(ParseDaemonFlags({"--model", "/m"})->device, "auto");
  EXPECT_EQ(ParseDaemonFlags({"--model", "/m", "--device=tpu"}).status().code(),
            StatusCode::kInvalidArgument);
  // --cache-fraction is of the experts on every device (issue 28); with no
  // size given a CUDA arena takes what half the free memory holds.
  CapacitySpec spec;
  spec.fraction = 0.25;
  EXPECT_EQ(*ComputeCapacity(spec, "m", 4, 8, 100, 4000), 8);  // 0.25 of 32 experts
  EXPECT_EQ(*ComputeCapacity(spec, "m", 4, 8, 100), 8);        // the same on the CPU
  // Default: half of 4000 free bytes / 100 bytes per expert = 20 slots.
  EXPECT_EQ(*ComputeCapacity({}, "m", 4, 8, 100, 4000), 20);
  EXPECT_EQ(*ComputeCapacity({}, "m", 4, 8, 100, 1 << 20), 32);  // capped
  auto few = ComputeCapacity({}, "m", 4, 8, 100, 1000);  // 5 < 8 slots
  EXPECT_EQ(few.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(few.status(), "free device bytes")) << few.status();
  auto over = ComputeCapacity(spec, "m", 4, 8, 100, 700);  // 8 slots need 800 bytes
  EXPECT_EQ(over.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(over.status(), "700 free bytes")) << over.status();
}

TEST(CudaArenaTest, PinFailureNamesBytesLimitAndFix) {
  FakeCuda::Get().Reset();
  FakeCuda::Get().host_register_error = 2;
  std::vector<uint8_t> buf(4096);
  absl::Status s = PinHostMemory(*FakeCuda::Memory(), buf.data(), buf.size());
  FakeCuda::Get().Reset();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  struct rlimit lim;
  ASSERT_EQ(::getrlimit(RLIMIT_MEMLOCK, &lim), 0);
  const std::string limit = lim.rlim_cur == RLIM_INFINITY
                                ? "unlimited"
                                : absl::StrCat(lim.rlim_cur, " bytes");
  for (const std::string& part :
       {std::string("4096 bytes"), std::string("fake cuda error 2"),
        "RLIMIT_MEMLOCK is " + limit, std::string("LimitMEMLOCK=infinity"),
        std::string("ulimit -l"), std::string("--device cpu")}) {
    EXPECT_TRUE(Contains(s, part)) << part << " missing from: " << s;
  }
  EXPECT_TRUE(PinHostMemory(*FakeCuda::Memory(), buf.data(), buf.size()).ok());
}

TEST(CudaArenaTest, PinnedStoreIsUnpinnedWhenDestroyed) {
  FakeCuda& fake = FakeCuda::Get();
  fake.Reset();
  moe::testing::TempDir dir;
  ASSERT_TRUE(moe::testing::MakeTinyModel(dir.Sub("m")).ok());
  auto desc = ModelDescription::Open(dir.Sub("m"));
  ASSERT_TRUE(desc.ok());
  {
    auto store = ExpertStore::Load("m", *desc, PinnedStoreOptions(FakeCuda::Memory()));
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ(fake.registers.load(), 1);
    EXPECT_EQ(fake.unregisters.load(), 0);
  }
  EXPECT_EQ(fake.unregisters.load(), 1);
  fake.host_register_error = 1;
  auto refused = ExpertStore::Load("m", *desc, PinnedStoreOptions(FakeCuda::Memory()));
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(fake.unregisters.load(), 1);  // never pinned: nothing to undo
  fake.Reset();
}

TEST(CudaArenaTest, ArenaOnFakeModule) {
  FakeCuda& fake = FakeCuda::Get();
  fake.Reset();
  {
    auto arena = CudaArena::Create(FakeCuda::Memory(), 8192);
    ASSERT_TRUE(arena.ok()) << arena.status();
    EXPECT_EQ((*arena)->size(), 8192u);
    ASSERT_EQ((*arena)->ipc_handle().size(), size_t{MOE_CUDA_IPC_HANDLE_BYTES});
    // The handle (here: the pointer) maps the same memory; closed when dropped.
    auto mapping = CudaArenaMapping::Open(FakeCuda::Memory(), (*arena)->ipc_handle(), 8192);
    ASSERT_TRUE(mapping.ok()) << mapping.status();
    EXPECT_EQ((*mapping)->device_ptr(), (*arena)->device_ptr());
    mapping->reset();
    EXPECT_EQ(fake.ipc_closes.load(), 1);
    void* in_handle = nullptr;
    std::memcpy(&in_handle, (*arena)->ipc_handle().data(), sizeof(in_handle));
    EXPECT_EQ(in_handle, (*arena)->device_ptr());
  }
  EXPECT_EQ(fake.frees.load(), 1);
  fake.malloc_error = 2;
  auto oom = CudaArena::Create(FakeCuda::Memory(), 1 << 30);
  EXPECT_EQ(oom.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(oom.status(), "1073741824 bytes")) << oom.status();
  EXPECT_EQ(CudaArenaMapping::Open(FakeCuda::Memory(), "short", 1).status().code(),
            StatusCode::kInvalidArgument);
  fake.Reset();
}

// The device is negotiated at attach (issue 28): a worker names the arena it
// can map, and a model whose arena is of the other kind refuses it before
// any channel or grant exists, naming both devices and the --device to
// change. The CUDA side runs on the fake module: no device call is made
// until a copy.
TEST(CudaArenaTest, AttachRefusesAWorkerOnTheOtherDevice) {
  FakeCuda& fake = FakeCuda::Get();
  fake.Reset();
  moe::testing::TempDir dir;
  ASSERT_TRUE(moe::testing::MakeTinyModel(dir.Sub("tiny")).ok());
  auto desc = ModelDescription::Open(dir.Sub("tiny"));
  ASSERT_TRUE(desc.ok()) << desc.status();
  prometheus::Registry registry;
  for (bool on_cuda : {true, false}) {
    SCOPED_TRACE(on_cuda ? "CUDA arena" : "host arena");
    auto store = ExpertStore::Load("tiny", *desc);
    ASSERT_TRUE(store.ok()) << store.status();
    CachedModelOptions o;
    o.name = on_cuda ? "on-cuda" : "on-host";
    o.cache.capacity = 8;
    o.cache.policy = "lru";
    if (on_cuda) o.cuda = FakeCuda::Memory();
    auto model = CachedModel::Create(std::move(*store), o, registry);
    ASSERT_TRUE(model.ok()) << model.status();
    SessionManager sessions({model->get()}, 4);
    const moe::v1::ArenaKind mine =
        on_cuda ? moe::v1::ARENA_KIND_CUDA_IPC : moe::v1::ARENA_KIND_HOST_SHM;
    const moe::v1::ArenaKind other =
        on_cuda ? moe::v1::ARENA_KIND_HOST_SHM : moe::v1::ARENA_KIND_CUDA_IPC;
    auto refused = sessions.Attach(o.name, "w", ::getpid(), false, other);
    EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Contains(refused.status(), on_cuda ? "in CUDA device memory but worker 'w' "
                                                     "computes on the CPU"
                                                   : "in host memory but worker 'w' computes "
                                                     "on a CUDA device"))
        << refused.status();
    EXPECT_TRUE(Contains(refused.status(), on_cuda ? "moe-cached --device cpu"
                                                   : "moe-cached --device cuda"))
        << refused.status();
    for (moe::v1::ArenaKind ok : {mine, moe::v1::ARENA_KIND_UNSPECIFIED}) {
      auto attached = sessions.Attach(o.name, "w", ::getpid(), false, ok);
      ASSERT_TRUE(attached.ok()) << attached.status();
      EXPECT_TRUE(sessions.Detach(attached->session_id).ok());
    }
    sessions.Stop();
  }
  fake.Reset();
}

// moe-cached --device: auto always serves (CPU when there is no GPU, saying
// why); cuda refuses to start without a GPU and serves from device memory
// with one.
TEST(CudaArenaTest, DaemonDeviceFlag) {
  setenv("MOE_CUDA_MODULE",
         (std::string(MOE_BINARY_DIR) + "/lib/libmoe_cuda.so").c_str(), 0);
  moe::testing::TempDir dir;
  ASSERT_TRUE(moe::testing::MakeTinyModel(dir.Sub("tiny")).ok());
  const bool gpu = ResolveDevice("cuda").ok();
  {
    moe::testing::DaemonProcess daemon(dir);
    absl::Status s = daemon.Start({{dir.Sub("tiny")}, {"--device", "auto"}});
    ASSERT_TRUE(s.ok()) << s;
    const std::string log = daemon.stderr_text();
    if (gpu) {
      EXPECT_NE(log.find("in CUDA device memory"), std::string::npos) << log;
    } else {
      EXPECT_NE(log.find("--device auto: using the CPU arena"), std::string::npos) << log;
      EXPECT_NE(log.find("arena on cpu"), std::string::npos) << log;
    }
  }
  moe::testing::DaemonProcess daemon(dir);
  absl::Status s = daemon.Start({{dir.Sub("tiny")}, {"--device", "cuda"}});
  if (gpu) {
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_NE(daemon.stderr_text().find("in CUDA device memory"), std::string::npos);
  } else {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(daemon.stderr_text().find("--device cuda: no usable CUDA device"),
              std::string::npos)
        << daemon.stderr_text();
  }
}

// ---- real device: arena + engine in this process, IPC mapping in a child ----

std::shared_ptr<DeviceMemory> GpuOrSkipReason(std::string* why) {
  setenv("MOE_CUDA_MODULE",
         (std::string(MOE_BINARY_DIR) + "/lib/libmoe_cuda.so").c_str(), 0);
  auto memory = CreateDeviceMemory("cuda");
  if (!memory.ok()) {
    *why = std::string(memory.status().message());
    return nullptr;
  }
  return std::move(*memory);
}

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

constexpr char kChildEnv[] = "MOE_CUDA_IPC_CHILD";  // "hexhandle:bytes:seed"

// The child of IpcHandleMapsTheSameBytesInAnotherProcess: when the binary is
// started with kChildEnv set, it maps the handle, compares the bytes and
// exits (0: equal) before any test is registered or run.
int RunIpcChild(const char* spec) {
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  uint64_t bytes = 0;
  uint32_t seed = 0;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[1], &bytes) ||
      !absl::SimpleAtoi(parts[2], &seed)) {
    std::fprintf(stderr, "ipc child: bad spec '%s'\n", spec);
    return 2;
  }
  std::string why;
  std::shared_ptr<DeviceMemory> memory = GpuOrSkipReason(&why);
  if (memory == nullptr) {
    std::fprintf(stderr, "ipc child: %s\n", why.c_str());
    return 3;
  }
  auto mapping = CudaArenaMapping::Open(memory, absl::HexStringToBytes(parts[0]), bytes);
  if (!mapping.ok()) {
    std::fprintf(stderr, "ipc child: %s\n", mapping.status().ToString().c_str());
    return 4;
  }
  std::vector<uint8_t> got(bytes);
  if (!memory->Copy(got.data(), (*mapping)->device_ptr(), bytes, CopyDirection::kDeviceToHost)
           .ok()) {
    return 5;
  }
  return got == Pattern(bytes, seed) ? 0 : 6;
}

[[maybe_unused]] const bool kIpcChildRan = [] {
  if (const char* spec = std::getenv(kChildEnv); spec != nullptr) std::_Exit(RunIpcChild(spec));
  return false;
}();

TEST(CudaArenaGpuTest, IpcHandleMapsTheSameBytesInAnotherProcess) {
  std::string why;
  std::shared_ptr<DeviceMemory> memory = GpuOrSkipReason(&why);
  if (memory == nullptr) {
    const char* require = std::getenv("MOE_REQUIRE_CUDA");
    ASSERT_FALSE(require != nullptr && *require == '1') << why;
    GTEST_SKIP() << "no CUDA device: " << why;
  }
  constexpr uint64_t kBytes = 5 << 20;
  constexpr uint32_t kSeed = 42;
  auto arena = CudaArena::Create(memory, kBytes);
  ASSERT_TRUE(arena.ok()) << arena.status();
  std::vector<uint8_t> host = Pattern(kBytes, kSeed);
  ASSERT_TRUE(PinHostMemory(*memory, host.data(), host.size()).ok());
  {
    cache::CudaCopyEngineOptions o;
    o.memory = memory;
    o.arena = (*arena)->device_ptr();
    o.arena_bytes = kBytes;
    o.chunk_bytes = 1 << 20;
    cache::CudaCopyEngine engine(o);
    ASSERT_TRUE(engine.Start().ok());
    std::mutex mu;
    std::condition_variable cv;
    bool finished = false;
    absl::Status result;
    cache::TransferRequest r;
    r.src = host.data();
    r.bytes = kBytes;
    ASSERT_TRUE(engine
                    .Submit(r,
                            [&](cache::TransferId, absl::Status s) {
                              std::lock_guard<std::mutex> lock(mu);
                              result = s;
                              finished = true;
                              cv.notify_all();
                            })
                    .ok());
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return finished; }));
    ASSERT_TRUE(result.ok()) << result;
  }
  // CUDA refuses to open a handle in the process that made it.
  EXPECT_FALSE(CudaArenaMapping::Open(memory, (*arena)->ipc_handle(), kBytes).ok());
  const std::string env = absl::StrCat(kChildEnv, "=",
                                       absl::BytesToHexString((*arena)->ipc_handle()), ":",
                                       kBytes, ":", kSeed);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(const_cast<char*>(env.c_str()));
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe";
  char* argv[] = {self.data(), nullptr};
  pid_t pid = 0;
  ASSERT_EQ(::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_TRUE(memory->UnpinHostMemory(host.data()).ok());
}

}  // namespace
}  // namespace moe::cached
