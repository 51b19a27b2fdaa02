// splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
// generators", 2014): a tiny generator that is identical on every platform,
// so generated models, sampling seeds and fuzz inputs are reproducible.
#ifndef MOECACHE_COMMON_SPLITMIX64_H_
#define MOECACHE_COMMON_SPLITMIX64_H_

#include <cstdint>

namespace moe {

// Advances `state` and returns the next 64 random bits.
inline uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace moe

#endif  // MOECACHE_COMMON_SPLITMIX64_H_
