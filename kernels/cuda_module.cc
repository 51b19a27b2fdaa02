#include "kernels/cuda_module.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "kernels/cuda/module_abi.h"

namespace moe {
namespace {

constexpr int kCudaErrorMemoryAllocation = 2;  // cudaErrorMemoryAllocation
constexpr int kCublasAllocFailed = 3;          // CUBLAS_STATUS_ALLOC_FAILED

std::string ExecutableDir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  buf[n] = '\0';
  std::string path(buf);
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

std::vector<std::string> Candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("MOE_CUDA_MODULE"); env && *env) {
    out.push_back(env);
    return out;  // an explicit choice is not second-guessed
  }
  std::string dir = ExecutableDir();
  if (!dir.empty()) {
    out.push_back(dir + "/" + MOE_CUDA_MODULE_NAME);
    out.push_back(dir + "/../lib/" + MOE_CUDA_MODULE_NAME);
  }
  out.push_back(MOE_CUDA_MODULE_NAME);
  return out;
}

struct Loaded {
  absl::Status status;
  const MoeCudaModuleApi* api = nullptr;
  std::string path;
};

Loaded LoadOnce() {
  Loaded result;
  std::string errors;
  void* handle = nullptr;
  for (const std::string& candidate : Candidates()) {
    handle = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      result.path = candidate;
      break;
    }
    const char* err = ::dlerror();
    absl::StrAppend(&errors, "\n  ", candidate, ": ", err ? err : "?");
  }
  if (handle == nullptr) {
    result.status = absl::NotFoundError(
        absl::StrCat("CUDA module not found; tried:", errors));
    return result;
  }
  using ApiFn = const MoeCudaModuleApi* (*)();
  auto fn = reinterpret_cast<ApiFn>(::dlsym(handle, "moe_cuda_module_api"));
  if (fn == nullptr) {
    result.status = absl::FailedPreconditionError(absl::StrCat(
        result.path, " does not export moe_cuda_module_api"));
    return result;
  }
  const MoeCudaModuleApi* api = fn();
  if (api == nullptr || api->abi_version != MOE_CUDA_MODULE_ABI_VERSION) {
    result.status = absl::FailedPreconditionError(absl::StrCat(
        result.path, " has ABI version ", api ? api->abi_version : -1,
        ", this binary needs ", MOE_CUDA_MODULE_ABI_VERSION));
    return result;
  }
  int count = api->device_count();
  if (count <= 0) {
    result.status = absl::UnavailableError(absl::StrCat(
        "no usable CUDA device (",
        count < 0 ? api->error_string(count) : "0 devices", ")"));
    result.api = api;  // still usable for error strings / probing
    return result;
  }
  result.api = api;
  return result;
}

const Loaded& GetLoaded() {
  static const Loaded* loaded = new Loaded(LoadOnce());
  return *loaded;
}

}  // namespace

absl::StatusOr<const MoeCudaModuleApi*> LoadCudaModule() {
  const Loaded& loaded = GetLoaded();
  if (!loaded.status.ok()) return loaded.status;
  return loaded.api;
}

absl::StatusOr<CudaModuleInfo> ProbeCudaModule() {
  const Loaded& loaded = GetLoaded();
  if (loaded.api == nullptr) return loaded.status;
  CudaModuleInfo info;
  info.path = loaded.path;
  int count = loaded.api->device_count();
  info.device_count = count > 0 ? count : 0;
  if (info.device_count > 0) {
    char name[256];
    if (loaded.api->device_name(0, name, sizeof(name)) == 0) {
      info.device_name = name;
    }
  }
  return info;
}

absl::Status CudaModuleStatus(const MoeCudaModuleApi* api, int code,
                              const char* what) {
  if (code == 0) return absl::OkStatus();
  std::string msg =
      absl::StrCat(what, ": ", api->error_string(code), " (code ", code, ")");
  if (code == kCudaErrorMemoryAllocation ||
      code == MOE_CUDA_CUBLAS_BASE + kCublasAllocFailed) {
    return absl::ResourceExhaustedError(msg);
  }
  if (code > MOE_CUDA_MODULE_BASE) return absl::InvalidArgumentError(msg);
  return absl::InternalError(msg);
}

}  // namespace moe
