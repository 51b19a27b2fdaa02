// The config.json fields whose names, defaults or meaning differ between
// families (transformers' configuration_<family>.py), for ParseModelConfig,
// ValidateModelConfig and ModelConfigToJson (model_config.cc), which handle
// the fields every family shares. This file and model_family.cc are where
// the families are named; the rest of the code asks ModelConfig's
// predicates. Internal to common/.
#ifndef MOECACHE_COMMON_FAMILY_FIELDS_H_
#define MOECACHE_COMMON_FAMILY_FIELDS_H_

#include "absl/status/status.h"
#include "common/config_reader.h"
#include "common/model_config.h"
#include "nlohmann/json.hpp"

namespace moe::config_internal {

// Fills the fields of `c` that depend on c->family (expert count and
// widths, router, attention biases and norms, latent attention, sliding
// layers, YaRN, quantization_config "mxfp4"), with `d` the family's
// defaults. Errors go to r.status(). REQUIRES: the shared fields (sizes,
// rope_theta, rope_scaling_type) are read.
void ReadFamilyFields(FieldReader& r, const FamilyDefaults& d, ModelConfig* c);

// The scoring function / top-k method combinations the family's modeling
// code implements. REQUIRES: c.has_scored_router().
absl::Status CheckRouterVariant(const ModelConfig& c);

// The invariants of the per-layer attention kinds, the clamped SwiGLU and
// MXFP4 experts (layer_types has one entry per layer, the YaRN fields are
// in range, swiglu_limit positive, head_dim even, q/k/v biases present, and
// for MXFP4 hidden_size and intermediate_size whole 32-weight groups); OK
// for families without them.
absl::Status CheckFamilyFields(const ModelConfig& c);

// Writes the fields ReadFamilyFields reads, as the family's published
// config.json does.
void FamilyFieldsToJson(const ModelConfig& c, nlohmann::ordered_json& j);

}  // namespace moe::config_internal

#endif  // MOECACHE_COMMON_FAMILY_FIELDS_H_
