// The Expert Activation Matrix Collection (EAMC): a bounded set of past
// requests' EAMs, one record per request with a prefill part and a decode
// part. When full, a new record replaces the most cosine-similar stored one
// (MoE-Infinity's rule: it keeps the collection diverse).
//
// Matching uses sparsity. Each stored part keeps, per layer, at most
// `max_experts_per_layer` largest counts (0 = all), and a query is pruned the
// same way, so similarity is the cosine of these pruned matrices. Stored
// parts are indexed by cell: small models (L*E <= kDenseCells) keep a dense
// column per cell ([cell][record], so a query cell adds one contiguous,
// vectorised AXPY into the per-record dot products); larger ones keep posting
// lists ([cell] -> (record, count)). Either way only the query's non-zero
// cells are visited, record norms are precomputed, and the scratch buffers
// are reused, so a match allocates nothing once warm (the returned vector
// aside). Indexed counts are stored as bfloat16 (exact up to 256).
//
// Thread-safety: not synchronised; the owning policy serialises access.
#ifndef MOECACHE_SERVICES_CACHE_EAMC_H_
#define MOECACHE_SERVICES_CACHE_EAMC_H_

#include <cstdint>
#include <vector>

#include "services/cache/eam.h"

namespace moe::cache {

enum class EamPhase : uint8_t { kPrefill = 0, kDecode = 1 };

struct EamcOptions {
  int num_layers = 0;
  int num_experts = 0;
  int capacity = 1000;
  int max_experts_per_layer = 0;  // 0 = keep every non-zero
  // Force the inverted index even for small models (tests compare both).
  bool force_inverted = false;
  // A query (after per-layer pruning) keeps its largest cells holding this
  // fraction of its squared norm (1 = all). Each cell dropped saves a column
  // or posting list; a cell with fraction f of the mass moves a cosine by at
  // most about sqrt(f).
  double query_mass = 1.0;
};

struct EamcRecord {
  SparseEam prefill;
  SparseEam decode;
};

struct EamcMatch {
  int index = -1;
  double cosine = 0;
};

class Eamc {
 public:
  static constexpr int kDenseCells = 4096;
  static constexpr int kMaxCapacity = 65535;

  // REQUIRES: num_layers, num_experts > 0; 0 < capacity <= kMaxCapacity.
  explicit Eamc(const EamcOptions& options);

  const EamcOptions& options() const { return options_; }
  int size() const { return static_cast<int>(records_.size()); }
  const EamcRecord& record(int i) const { return records_[i]; }
  const std::vector<EamcRecord>& records() const { return records_; }

  // Adds a finished request (prunes first). When full, replaces the record
  // most similar to it (decode part if both have one, else prefill) and
  // returns that index; else appends and returns the new index. A request
  // whose both parts are empty is ignored (returns -1).
  int Add(const Eam& prefill, const Eam& decode);
  // Adds an already pruned record as-is (loading from disk). Same rules.
  int AddRecord(EamcRecord record);

  // The `k` records most similar to `query` in `phase`, best first, cosine
  // > 0 only.
  std::vector<EamcMatch> FindBest(const Eam& query, EamPhase phase,
                                  int k) const;
  std::vector<EamcMatch> FindBest(const SparseEam& query, EamPhase phase,
                                  int k) const;
  // Same, into `out` (cleared first; reuse it to avoid allocating).
  void FindBest(const Eam& query, EamPhase phase, int k,
                std::vector<EamcMatch>* out) const;

  // A query taken from an EAM now and matched later: FindBest on it gives
  // what FindBest on the EAM gave when it was prepared, as long as the
  // EAMC has not changed in between (Add, AddRecord, Clear).
  struct PreparedQuery {
    std::vector<SparseEntry> cells;  // pruned, sorted by cell
    double norm = 0;
  };
  void Prepare(const Eam& eam, PreparedQuery* out) const;
  void FindBest(const PreparedQuery& query, EamPhase phase, int k,
                std::vector<EamcMatch>* out) const;

  // The query cells the last match visited (after pruning), for benchmarks
  // and tests.
  const std::vector<SparseEntry>& last_query() const { return query_; }

  // Prunes to the options' per-layer limit.
  SparseEam Prune(const Eam& eam) const;

  void Clear();

 private:
  struct Posting {
    uint16_t record;
    uint16_t value;  // bfloat16
  };
  // One phase's search structure.
  struct Index {
    bool dense = true;
    std::vector<uint16_t> cols;  // dense: [cells][capacity], bfloat16
    std::vector<std::vector<Posting>> posts;  // inverted: [cells]
    std::vector<double> norms;                // [capacity]
  };

  void IndexSet(Index& index, int slot, const SparseEam& eam);
  void IndexRemove(Index& index, int slot, const SparseEam& eam);
  // The pruned query into query_ (sorted by cell); returns its norm.
  double BuildQuery(const Eam& eam) const;
  // Dot products of query_ with every record into acc_, then the top k.
  void Match(EamPhase phase, double query_norm, int k,
             std::vector<EamcMatch>* out) const;

  EamcOptions options_;
  int cells_;
  std::vector<EamcRecord> records_;
  Index index_[2];
  // Scratch, reused across matches.
  mutable std::vector<SparseEntry> query_;
  mutable std::vector<float> acc_;
  mutable std::vector<float> values_;
  mutable std::vector<int> layer_start_;
  mutable std::vector<int> layer_fill_;
};

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_EAMC_H_
