// Normally distributed test data, reproducible by seed (the bf16 product
// tests: bf16_dot_test, amx_test).
#ifndef MOECACHE_TESTS_KERNELS_NORMAL_DATA_H_
#define MOECACHE_TESTS_KERNELS_NORMAL_DATA_H_

#include <cstdint>
#include <random>
#include <vector>

namespace moe {

// n draws of N(0, sd^2) from mt19937(seed).
inline std::vector<float> Normal(int64_t n, uint32_t seed, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace moe

#endif  // MOECACHE_TESTS_KERNELS_NORMAL_DATA_H_
