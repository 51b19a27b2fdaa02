#include "services/cache/eam.h"

#include <algorithm>
#include <cmath>

#include "common/logging.h"

namespace moe::cache {

Eam::Eam(int num_layers, int num_experts)
    : num_layers_(num_layers),
      num_experts_(num_experts),
      values_(static_cast<size_t>(num_layers) * num_experts, 0.0f) {}

void Eam::Add(int layer, int expert, float count) {
  MOE_CHECK(layer >= 0 && layer < num_layers_ && expert >= 0 && expert < num_experts_);
  const uint32_t i = static_cast<uint32_t>(layer) * num_experts_ + expert;
  if (values_[i] == 0.0f && count != 0.0f) nonzeros_.push_back(i);
  values_[i] += count;
  total_ += count;
}

void Eam::Clear() {
  for (uint32_t i : nonzeros_) values_[i] = 0.0f;
  nonzeros_.clear();
  total_ = 0;
}

SparseEam SparseEam::FromDense(const Eam& eam) {
  std::vector<SparseEntry> entries;
  entries.reserve(eam.nonzeros().size());
  for (uint32_t i : eam.nonzeros()) {
    if (eam.values()[i] != 0.0f) entries.push_back({i, eam.values()[i]});
  }
  return FromEntries(eam.num_layers(), eam.num_experts(), std::move(entries));
}

SparseEam SparseEam::FromEntries(int num_layers, int num_experts,
                                 std::vector<SparseEntry> entries) {
  SparseEam s;
  s.num_layers_ = num_layers;
  s.num_experts_ = num_experts;
  std::sort(entries.begin(), entries.end(),
            [](const SparseEntry& a, const SparseEntry& b) { return a.index < b.index; });
  double sq = 0;
  for (const auto& e : entries) sq += static_cast<double>(e.value) * e.value;
  s.entries_ = std::move(entries);
  s.norm_ = std::sqrt(sq);
  return s;
}

double SparseEam::Cosine(const SparseEam& other) const {
  if (norm_ == 0 || other.norm_ == 0) return 0;
  double dot = 0;
  size_t i = 0, j = 0;
  while (i < entries_.size() && j < other.entries_.size()) {
    if (entries_[i].index < other.entries_[j].index) {
      ++i;
    } else if (entries_[i].index > other.entries_[j].index) {
      ++j;
    } else {
      dot += static_cast<double>(entries_[i].value) * other.entries_[j].value;
      ++i, ++j;
    }
  }
  return dot / (norm_ * other.norm_);
}

double Cosine(const Eam& a, const SparseEam& b) {
  if (a.empty() || b.empty()) return 0;
  double dot = 0, sq = 0;
  for (uint32_t i : a.nonzeros()) sq += static_cast<double>(a.values()[i]) * a.values()[i];
  for (const auto& e : b.entries()) dot += static_cast<double>(a.values()[e.index]) * e.value;
  if (sq == 0) return 0;
  return dot / (std::sqrt(sq) * b.norm());
}

}  // namespace moe::cache
