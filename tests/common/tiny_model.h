// The tiny model the process tests serve: the mixtral preset of
// common/model_presets (4 MoE layers x 8 experts, top-2, BF16, 48 KiB per
// expert), written into `dir` with `seed`. One definition for the daemon,
// worker, integration, fuzz and bench tests.
#ifndef MOECACHE_TESTS_COMMON_TINY_MODEL_H_
#define MOECACHE_TESTS_COMMON_TINY_MODEL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/model_maker.h"

namespace moe::testing {

inline absl::Status MakeTinyModel(const std::string& dir, uint64_t seed = 11) {
  MakeModelOptions o = TinyPreset(ModelFamily::kMixtral);
  o.seed = seed;
  return MakeModel(o, dir);
}

}  // namespace moe::testing

#endif  // MOECACHE_TESTS_COMMON_TINY_MODEL_H_
