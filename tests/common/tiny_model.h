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

// A model whose every weight row is 256 wide, so that K-quant blocks
// (256 weights) fit when it is converted to GGUF: `family`'s tiny preset in
// F32 with 2 layers x 4 experts of [256, 256] (6 MB as F32, ~0.8 MB of
// Q4_K experts); Qwen3-MoE without dense layers, as llama.cpp writes it.
inline MakeModelOptions KQuantableModel(ModelFamily family, uint64_t seed) {
  MakeModelOptions o = TinyPreset(family);
  o.dtype = DType::kF32;
  o.layers = 2;
  o.hidden = 256;
  o.heads = 4;
  o.kv_heads = 2;
  o.head_dim = 64;
  o.experts = 4;
  o.top_k = 2;
  o.intermediate = 256;
  if (family == ModelFamily::kQwen3Moe) o.moe_intermediate = 256;
  o.mlp_only_layers.clear();
  o.seed = seed;
  return o;
}

}  // namespace moe::testing

#endif  // MOECACHE_TESTS_COMMON_TINY_MODEL_H_
