// Named shapes for `moectl make-model --preset`: small random models for
// tests and demos, and the shapes of published models at reduced depth, so
// that a cache can be sized (expert bytes, layer and expert counts, the
// simulator's --expert-mb) without downloading the real checkpoint.
//
//   ASSIGN_OR_RETURN(MakeModelOptions o, PresetOptions("mixtral-8x7b-2l",
//   std::nullopt));
#ifndef MOECACHE_COMMON_MODEL_PRESETS_H_
#define MOECACHE_COMMON_MODEL_PRESETS_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/model_maker.h"

namespace moe {

// "tiny, small, mixtral-8x7b-2l, ...": every preset name, for messages.
std::string PresetNames();

// The options of preset `name`. `tiny` and `small` take any family
// (`family`, mixtral when unset); a published model's shape fixes its
// family, and a different `family` is INVALID_ARGUMENT. Unknown names are
// INVALID_ARGUMENT listing the known ones.
absl::StatusOr<MakeModelOptions> PresetOptions(
    const std::string& name, std::optional<ModelFamily> family);

}  // namespace moe

#endif  // MOECACHE_COMMON_MODEL_PRESETS_H_
