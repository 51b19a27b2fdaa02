// Memory read bandwidth probe for tests/bench/peer_bench.sh: T threads each
// sum their contiguous slice of a buffer far larger than the caches with
// 256-bit loads (no writes), as a decode matvec streams its weights.
//
//   read_bw [--mb 1024] [--threads 1,2] [--reps 7]
//
// The buffer sits on transparent huge pages where the kernel gives them
// (as the engine's experts do, common/huge_page_arena.h): on 4 KiB pages a
// TLB miss per page made this probe read 10-30% less than the memory can.
//
// Prints one line per thread count: "threads T read_gbps MEDIAN best BEST"
// (GB = 1e9 bytes). Built by the script with g++ -O2 -mavx2; not part of
// the CMake build (kernel_bench measures memcpy, i.e. read + write).
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

// Sum of n bytes (n a multiple of 128) as 64-bit lanes; 4 accumulators.
uint64_t SumSlice(const uint8_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

}  // namespace

int main(int argc, char** argv) {
  size_t mb = 1024;
  int reps = 7;
  std::vector<int> threads = {1, 2};
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "read_bw: missing value for %s\n", s.c_str());
      return 2;
    }
    std::string v = argv[++i];
    if (s == "--mb") {
      mb = std::strtoull(v.c_str(), nullptr, 10);
    } else if (s == "--reps") {
      reps = std::atoi(v.c_str());
    } else if (s == "--threads") {
      threads.clear();
      std::stringstream in(v);
      std::string t;
      while (std::getline(in, t, ',')) threads.push_back(std::atoi(t.c_str()));
    } else {
      std::fprintf(stderr, "usage: read_bw [--mb N] [--threads 1,2] [--reps N]\n");
      return 2;
    }
  }
  const size_t bytes = mb << 20;
  constexpr size_t kHuge = size_t{2} << 20;
  auto* buf = static_cast<uint8_t*>(std::aligned_alloc(kHuge, (bytes + kHuge - 1) / kHuge * kHuge));
  if (!buf) {
    std::fprintf(stderr, "read_bw: cannot allocate %zu MiB\n", mb);
    return 1;
  }
  ::madvise(buf, bytes, MADV_HUGEPAGE);  // best effort
  for (size_t i = 0; i < bytes; ++i) buf[i] = static_cast<uint8_t>(i * 131);
  volatile uint64_t sink = 0;
  for (int t : threads) {
    if (t < 1) continue;
    const size_t slice = bytes / t / 128 * 128;
    std::vector<double> gbps;
    for (int r = 0; r < reps + 1; ++r) {  // the first pass is a warm-up
      std::vector<uint64_t> sums(t);
      auto start = std::chrono::steady_clock::now();
      std::vector<std::thread> pool;
      for (int k = 1; k < t; ++k) {
        pool.emplace_back([&, k] { sums[k] = SumSlice(buf + k * slice, slice); });
      }
      sums[0] = SumSlice(buf, slice);
      for (auto& th : pool) th.join();
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      for (uint64_t x : sums) sink = sink + x;
      if (r > 0) gbps.push_back(slice * t / s / 1e9);
    }
    std::sort(gbps.begin(), gbps.end());
    std::printf("threads %d read_gbps %.2f best %.2f\n", t, gbps[gbps.size() / 2], gbps.back());
  }
  std::free(buf);
  return sink == 42 ? 3 : 0;
}
