#include <cstdio>

#include "kernels/cuda_module.h"
#include "services/moectl/commands.h"
#include "services/rpc/build_info.h"

namespace moe::moectl {

namespace {

int RunInfo(const Args& args) {
  std::printf("%s\n", VersionLine("moecache").c_str());
  auto probe = ProbeCudaModule();
  if (!probe.ok()) {
    std::printf("cuda: unavailable (%s)\n",
                std::string(probe.status().message()).c_str());
    std::printf("backend: cpu\n");
    return 0;
  }
  std::printf("cuda module: %s\n", probe->path.c_str());
  std::printf("cuda devices: %d%s%s\n", probe->device_count,
              probe->device_name.empty() ? "" : " - ",
              probe->device_name.c_str());
  std::printf("backend: %s\n", probe->device_count > 0 ? "cuda" : "cpu");
  return 0;
}

const bool kRegistered = RegisterCommand(
    {"info", "show the build and the backends this machine offers", &RunInfo});

}  // namespace

}  // namespace moe::moectl
