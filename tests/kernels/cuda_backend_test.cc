// Host-side CUDA backend pieces that run without a GPU: the mapping of the
// module's return codes to Status, and the factory's answer when no device
// is usable. (The ops themselves are covered by backend_ops_test.)
#include "kernels/cuda_backend.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace moe {
namespace {

const char* FakeErrorString(int code) {
  static thread_local std::string s;
  s = "fake error " + std::to_string(code);
  return s.c_str();
}

TEST(CudaBackendTest, ModuleCodesBecomeStatuses) {
  MoeCudaModuleApi api{};
  api.error_string = &FakeErrorString;
  EXPECT_TRUE(CudaModuleStatus(&api, 0, "op").ok());
  absl::Status oom = CudaModuleStatus(&api, 2, "cudaMalloc");
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(oom.message().find("cudaMalloc: fake error 2"), std::string::npos);
  EXPECT_EQ(CudaModuleStatus(&api, MOE_CUDA_CUBLAS_BASE + 3, "gemm").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CudaModuleStatus(&api, MOE_CUDA_CUBLAS_BASE + 7, "gemm").code(),
            absl::StatusCode::kInternal);
  absl::Status hd = CudaModuleStatus(
      &api, MOE_CUDA_MODULE_BASE + MOE_CUDA_ERR_HEAD_DIM, "Attention");
  EXPECT_EQ(hd.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaModuleStatus(&api, 700, "Sync").code(),
            absl::StatusCode::kInternal);  // e.g. an illegal address
}

TEST(CudaBackendTest, FactoryExplainsWhyThereIsNoDevice) {
  // An explicit $MOE_CUDA_MODULE (scripts/gpu-check.sh's bundle mode) wins.
  setenv("MOE_CUDA_MODULE",
         (std::string(MOE_BINARY_DIR) + "/lib/libmoe_cuda.so").c_str(), 0);
  const std::string module = std::getenv("MOE_CUDA_MODULE");
  auto backend = CreateCudaBackend(0);
  if (backend.ok()) {
    EXPECT_EQ((*backend)->Info().name, "cuda");
    EXPECT_TRUE((*backend)->Info().is_device);
    EXPECT_EQ(CreateCudaBackend(1 << 20).status().code(),
              absl::StatusCode::kInvalidArgument);
  } else {
    const char* require = std::getenv("MOE_REQUIRE_CUDA");
    EXPECT_FALSE(require != nullptr && *require == '1') << backend.status();
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(backend.status().message().find("CUDA"), std::string::npos);
  }
}

// ggml's block formats (kQ4_0 .. kQ6K) run in MatMul and the expert FFNs
// (module ABI v7; their parity with the CPU: cuda_gguf_ops_test).
TEST(CudaBackendTest, RunsGgufBlocks) {
  auto backend = CreateCudaBackend(0);
  if (!backend.ok()) GTEST_SKIP() << "no CUDA device: " << backend.status();
  Backend& be = **backend;
  EXPECT_TRUE(be.Info().supports_gguf_blocks);
  const int64_t k = 256, n = 2;
  auto x = be.Alloc(sizeof(float) * k);
  auto w = be.Alloc(static_cast<size_t>(WeightBytes(DType::kQ4K, n, k)));
  auto y = be.Alloc(sizeof(float) * n);
  ASSERT_TRUE(x.ok() && w.ok() && y.ok());
  ASSERT_TRUE(be.MemsetZero(*x, sizeof(float) * k).ok());
  ASSERT_TRUE(be.MemsetZero(*w, static_cast<size_t>(WeightBytes(DType::kQ4K, n, k))).ok());
  absl::Status s = be.MatMul(static_cast<const float*>(*x), *w, DType::kQ4K, nullptr,
                             static_cast<float*>(*y), 1, n, k);
  EXPECT_TRUE(s.ok()) << s;
  float host[n] = {1.0f, 1.0f};
  ASSERT_TRUE(be.CopyToHost(host, *y, sizeof(host)).ok());
  EXPECT_EQ(host[0], 0.0f);  // zero blocks, zero activations
  EXPECT_EQ(host[1], 0.0f);
  for (void* p : {*x, *w, *y}) be.Free(p);
}

}  // namespace
}  // namespace moe
