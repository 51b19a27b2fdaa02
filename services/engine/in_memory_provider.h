// An ExpertProvider with every expert already in backend memory: copied
// once into host memory on huge pages (CPU; common/huge_page_arena.h,
// converted to `format` where asked) or uploaded once (device). Every
// acquire is a hit.
// Used by `moectl run` and as the reference the daemon-backed provider must
// match bit for bit.
//
// Thread-compatible.
#ifndef MOECACHE_SERVICES_ENGINE_IN_MEMORY_PROVIDER_H_
#define MOECACHE_SERVICES_ENGINE_IN_MEMORY_PROVIDER_H_

#include <memory>
#include <optional>
#include <vector>

#include "common/huge_page_arena.h"
#include "services/engine/expert_provider.h"
#include "services/engine/moe_model.h"

namespace moe {

class InMemoryExpertProvider : public ExpertProvider {
 public:
  // `model` must outlive the provider. With `format` (bf16, q8, q4; see
  // common/quant.h) the experts are converted into buffers of that format,
  // as moe-cached's --expert-format does; nullopt: the checkpoint's views.
  static absl::StatusOr<std::unique_ptr<InMemoryExpertProvider>> Create(
      const MoeModel& model, std::optional<DType> format = std::nullopt);
  ~InMemoryExpertProvider() override;

  absl::StatusOr<AcquiredExperts> Acquire(int moe_layer,
                                      absl::Span<const ExpertDemand> demands,
                                      bool prefill) override;
  void Release(AcquiredExperts& lease) override;

  int64_t acquires() const { return acquires_; }

 private:
  // Expert bias `which` (gate, up, down) as f32 in backend memory.
  absl::StatusOr<const float*> PlaceBias(int moe_layer, int expert, int which);
  explicit InMemoryExpertProvider(const MoeModel& model) : model_(model) {}
  const MoeModel& model_;
  std::vector<ExpertView> views_;  // [moe_layer * experts + expert]
  std::vector<void*> owned_;                        // device copies
  HugePageArena converted_;  // host: every expert (CPU) or the converted ones
  int64_t acquires_ = 0;
};

}  // namespace moe

#endif  // MOECACHE_SERVICES_ENGINE_IN_MEMORY_PROVIDER_H_
