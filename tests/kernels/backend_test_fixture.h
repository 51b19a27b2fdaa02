// A test fixture parameterized by backend name ("cpu", "cuda"): creates the
// backend (a missing CUDA device skips, except under MOE_REQUIRE_CUDA=1, as
// scripts/gpu-check.sh sets, where a skip would hide a bug), uploads and
// downloads buffers, and frees every upload on tear-down. Shared by the op
// parity tests (backend_ops_test.cc, deepseek_ops_test.cc,
// gpt_oss_ops_test.cc), with their random inputs and error measure.
#ifndef MOECACHE_TESTS_KERNELS_BACKEND_TEST_FIXTURE_H_
#define MOECACHE_TESTS_KERNELS_BACKEND_TEST_FIXTURE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"

namespace moe {

// n values uniform in [lo, hi), reproducible from `seed`.
inline std::vector<float> RandomVec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Largest |a - b| against a float64 reference (infinity for a NaN in `a`).
inline double MaxAbsDiff(const std::vector<float>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isnan(a[i])) return INFINITY;
    worst = std::max(worst, std::fabs(a[i] - b[i]));
  }
  return worst;
}

class BackendParamTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto created = CreateBackend(GetParam());
    if (!created.ok()) {
      ASSERT_EQ(GetParam(), "cuda") << created.status();
      const char* require = std::getenv("MOE_REQUIRE_CUDA");
      ASSERT_FALSE(require != nullptr && *require == '1') << created.status();
      GTEST_SKIP() << "no CUDA device: " << created.status().message();
    }
    backend_ = std::move(*created);
  }
  void TearDown() override {
    for (void* p : allocations_) backend_->Free(p);
  }

  template <typename T>
  T* Upload(const std::vector<T>& host) {
    return static_cast<T*>(UploadBytes(host.data(), host.size() * sizeof(T)));
  }
  void* UploadBytes(const void* data, size_t bytes) {
    auto p = backend_->Alloc(std::max<size_t>(bytes, 1));
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return nullptr;
    allocations_.push_back(*p);
    EXPECT_TRUE(backend_->CopyToDevice(*p, data, bytes).ok());
    return *p;
  }
  template <typename T>
  std::vector<T> Download(const T* p, size_t n) {
    std::vector<T> out(n);
    absl::Status s = backend_->Synchronize();
    EXPECT_TRUE(s.ok()) << s;
    s = backend_->CopyToHost(out.data(), p, n * sizeof(T));
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }
  bool is_device() const { return backend_->Info().is_device; }

  std::unique_ptr<Backend> backend_;
  std::vector<void*> allocations_;
};

}  // namespace moe

#endif  // MOECACHE_TESTS_KERNELS_BACKEND_TEST_FIXTURE_H_
