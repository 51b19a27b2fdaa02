#include "kernels/cuda_module.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace moe {
namespace {

// The module loads (when built) and answers; with no GPU it must say so
// instead of crashing, and callers must see a non-OK LoadCudaModule().
TEST(CudaModuleTest, ProbeReportsModuleOrClearReason) {
  std::string module = std::string(MOE_BINARY_DIR) +
                       "/lib/libmoe_cuda.so";
  setenv("MOE_CUDA_MODULE", module.c_str(), 1);
  auto probe = ProbeCudaModule();
#ifdef MOE_EXPECT_CUDA_MODULE
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_EQ(probe->path, module);
  auto api = LoadCudaModule();
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
