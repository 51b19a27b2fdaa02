// Expert Activation Matrices (MoE-Infinity, arXiv 2401.14361): an L x E matrix
// of token counts. An iteration EAM (iEAM) counts one iteration; a request
// EAM (rEAM) sums a request's iterations. We keep one rEAM per phase
// (prefill, decode) because prefill spreads over many more experts.
//
// `Eam` is dense (cheap updates while a request runs); `SparseEam` is the
// compact, immutable form kept in the EAMC and used for matching.
//
// Thread-safety: plain values.
#ifndef MOECACHE_SERVICES_CACHE_EAM_H_
#define MOECACHE_SERVICES_CACHE_EAM_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moe::cache {

class Eam {
 public:
  Eam() = default;
  Eam(int num_layers, int num_experts);

  int num_layers() const { return num_layers_; }
  int num_experts() const { return num_experts_; }
  bool empty() const { return total_ == 0; }
  double total() const { return total_; }

  void Add(int layer, int expert, float count);
  float at(int layer, int expert) const {
    return values_[static_cast<size_t>(layer) * num_experts_ + expert];
  }
  const std::vector<float>& values() const { return values_; }
  // Flat indices (layer * E + expert) with a non-zero count, in insertion
  // order.
  const std::vector<uint32_t>& nonzeros() const { return nonzeros_; }
  void Clear();

 private:
  int num_layers_ = 0;
  int num_experts_ = 0;
  double total_ = 0;
  std::vector<float> values_;
  std::vector<uint32_t> nonzeros_;
};

struct SparseEntry {
  uint32_t index;  // layer * E + expert
  float value;
};

class SparseEam {
 public:
  SparseEam() = default;
  static SparseEam FromDense(const Eam& eam);
  // REQUIRES: indices unique and < L*E.
  static SparseEam FromEntries(int num_layers, int num_experts,
                               std::vector<SparseEntry> entries);

  int num_layers() const { return num_layers_; }
  int num_experts() const { return num_experts_; }
  const std::vector<SparseEntry>& entries() const { return entries_; }  // sorted
  double norm() const { return norm_; }
  bool empty() const { return entries_.empty(); }

  // Cosine similarity; 0 when either side is empty.
  double Cosine(const SparseEam& other) const;

 private:
  int num_layers_ = 0;
  int num_experts_ = 0;
  std::vector<SparseEntry> entries_;
  double norm_ = 0;
};

// Cosine similarity of a dense and a sparse EAM of the same shape.
double Cosine(const Eam& a, const SparseEam& b);

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_EAM_H_
