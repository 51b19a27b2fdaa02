#include "kernels/cuda_module.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace moe {
namespace {

// The module loads (when built) and answers; with no GPU it must say so
// instead of crashing, and callers must see a non-OK LoadCudaModule().
TEST(CudaModuleTest, ProbeReportsModuleOrClearReason) {
  // An explicit $MOE_CUDA_MODULE (scripts/gpu-check.sh's bundle mode) wins.
  setenv("MOE_CUDA_MODULE",
         (std::string(MOE_BINARY_DIR) + "/lib/libmoe_cuda.so").c_str(), 0);
  const std::string module = std::getenv("MOE_CUDA_MODULE");
  auto probe = ProbeCudaModule();
#ifdef MOE_EXPECT_CUDA_MODULE
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_EQ(probe->path, module);
  auto api = LoadCudaModule();
  // scripts/gpu-check.sh sets MOE_REQUIRE_CUDA=1: there, no device is a bug.
  const char* require = std::getenv("MOE_REQUIRE_CUDA");
  if (require != nullptr && *require == '1') {
    EXPECT_GT(probe->device_count, 0) << api.status();
  }
  if (probe->device_count == 0) {
    EXPECT_EQ(api.status().code(), absl::StatusCode::kUnavailable);
  } else {
    ASSERT_TRUE(api.ok()) << api.status();
    EXPECT_FALSE(probe->device_name.empty());
  }
#else
  ASSERT_FALSE(probe.ok());
  EXPECT_EQ(probe.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(probe.status().message().find("libmoe_cuda.so"),
            std::string::npos);
#endif
}

}  // namespace
}  // namespace moe
