#include "services/cache/eamc.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/logging.h"

namespace moe::cache {
namespace {

// Stored counts are bfloat16 (the top half of a float, rounded to nearest
// even): exact for counts up to 256, 0.4% relative error above, and half the
// bytes to stream per match, which is what a match costs.
uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

float FromBf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// y[0, n) += a * x[0, n) over bf16 x: the inner loop of dense matching,
// written with 8-wide vectors and built for AVX2 too (picked at load time),
// since the project compiles for baseline x86-64 at -O2, which does not
// vectorise it.
typedef float Float8 __attribute__((vector_size(32)));
typedef uint32_t U32x8 __attribute__((vector_size(32)));
typedef uint16_t U16x8 __attribute__((vector_size(16)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
void AxpyBf16(float a, const uint16_t* __restrict x, float* __restrict y, size_t n) {
  const Float8 av = {a, a, a, a, a, a, a, a};
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    U16x8 h0, h1;
    Float8 y0, y1;
    std::memcpy(&h0, x + i, 16);
    std::memcpy(&h1, x + i + 8, 16);
    const U32x8 u0 = __builtin_convertvector(h0, U32x8) << 16;
    const U32x8 u1 = __builtin_convertvector(h1, U32x8) << 16;
    std::memcpy(&y0, y + i, 32);
    std::memcpy(&y1, y + i + 8, 32);
    Float8 x0, x1;
    std::memcpy(&x0, &u0, 32);
    std::memcpy(&x1, &u1, 32);
    y0 += av * x0;
    y1 += av * x1;
    std::memcpy(y + i, &y0, 32);
    std::memcpy(y + i + 8, &y1, 32);
  }
  for (; i < n; ++i) y[i] += a * FromBf16(x[i]);
}

bool Better(const EamcMatch& a, const EamcMatch& b) {
  return a.cosine != b.cosine ? a.cosine > b.cosine : a.index < b.index;
}

std::vector<SparseEntry> PruneEntries(std::vector<SparseEntry> entries,
                                      int num_experts, int keep) {
  if (keep <= 0 || entries.empty()) return entries;
  std::sort(entries.begin(), entries.end(),
            [](const SparseEntry& a, const SparseEntry& b) {
              return a.index < b.index;
            });
  std::vector<SparseEntry> out;
  out.reserve(entries.size());
  size_t i = 0;
  while (i < entries.size()) {
    const uint32_t layer = entries[i].index / num_experts;
    size_t j = i;
    while (j < entries.size() && entries[j].index / num_experts == layer) ++j;
    if (static_cast<int>(j - i) > keep) {
      // Largest `keep` counts; ties by lower expert id (deterministic).
      std::partial_sort(
          entries.begin() + i, entries.begin() + i + keep, entries.begin() + j,
          [](const SparseEntry& a, const SparseEntry& b) {
            return a.value != b.value ? a.value > b.value : a.index < b.index;
          });
      out.insert(out.end(), entries.begin() + i, entries.begin() + i + keep);
    } else {
      out.insert(out.end(), entries.begin() + i, entries.begin() + j);
    }
    i = j;
  }
  return out;
}

}  // namespace

Eamc::Eamc(const EamcOptions& options)
    : options_(options), cells_(options.num_layers * options.num_experts) {
  MOE_CHECK(options.num_layers > 0 && options.num_experts > 0 &&
            options.capacity > 0 && options.capacity <= kMaxCapacity);
  for (Index& index : index_) {
    index.dense = !options.force_inverted && cells_ <= kDenseCells;
    if (index.dense) {
      index.cols.assign(static_cast<size_t>(options.capacity) * cells_, 0);
    } else {
      index.posts.resize(cells_);
    }
    index.norms.assign(options.capacity, 0.0);
  }
  acc_.reserve(options.capacity);
}

SparseEam Eamc::Prune(const Eam& eam) const {
  SparseEam full = SparseEam::FromDense(eam);
  if (options_.max_experts_per_layer <= 0) return full;
  return SparseEam::FromEntries(eam.num_layers(), eam.num_experts(),
                                PruneEntries(full.entries(), eam.num_experts(),
                                             options_.max_experts_per_layer));
}

void Eamc::IndexSet(Index& index, int slot, const SparseEam& eam) {
  index.norms[slot] = eam.norm();
  for (const auto& e : eam.entries()) {
    if (index.dense) {
      index.cols[static_cast<size_t>(e.index) * options_.capacity + slot] =
          ToBf16(e.value);
    } else {
      index.posts[e.index].push_back(
          {static_cast<uint16_t>(slot), ToBf16(e.value)});
    }
  }
}

void Eamc::IndexRemove(Index& index, int slot, const SparseEam& eam) {
  index.norms[slot] = 0;
  for (const auto& e : eam.entries()) {
    if (index.dense) {
      index.cols[static_cast<size_t>(e.index) * options_.capacity + slot] = 0;
      continue;
    }
    auto& posts = index.posts[e.index];
    for (size_t i = 0; i < posts.size(); ++i) {
      if (posts[i].record == slot) {
        posts[i] = posts.back();
        posts.pop_back();
        break;
      }
    }
  }
}

int Eamc::Add(const Eam& prefill, const Eam& decode) {
  return AddRecord(EamcRecord{Prune(prefill), Prune(decode)});
}

int Eamc::AddRecord(EamcRecord record) {
  if (record.prefill.empty() && record.decode.empty()) return -1;
  int slot;
  if (size() < options_.capacity) {
    slot = size();
    records_.emplace_back();
  } else {
    const bool by_decode = !record.decode.empty();
    auto best = FindBest(by_decode ? record.decode : record.prefill,
                         by_decode ? EamPhase::kDecode : EamPhase::kPrefill, 1);
    // Nothing similar at all: replace slot 0 (deterministic).
    slot = best.empty() ? 0 : best[0].index;
    IndexRemove(index_[0], slot, records_[slot].prefill);
    IndexRemove(index_[1], slot, records_[slot].decode);
  }
  IndexSet(index_[0], slot, record.prefill);
  IndexSet(index_[1], slot, record.decode);
  records_[slot] = std::move(record);
  return slot;
}

double Eamc::BuildQuery(const Eam& eam) const {
  // Bucket the non-zeros by layer (counting sort, no comparison sort), then
  // keep each layer's largest `max_experts_per_layer` counts.
  const int L = options_.num_layers, E = options_.num_experts;
  const int keep = options_.max_experts_per_layer;
  layer_start_.assign(L + 1, 0);
  for (uint32_t i : eam.nonzeros()) ++layer_start_[i / E + 1];
  for (int l = 0; l < L; ++l) layer_start_[l + 1] += layer_start_[l];
  query_.resize(layer_start_[L]);
  layer_fill_.assign(layer_start_.begin(), layer_start_.end() - 1);
  for (uint32_t i : eam.nonzeros())
    query_[layer_fill_[i / E]++] = {i, eam.values()[i]};
  size_t w = 0;
  for (int l = 0; l < L; ++l) {
    auto first = query_.begin() + layer_start_[l];
    auto last = query_.begin() + layer_start_[l + 1];
    if (keep > 0 && last - first > keep) {
      std::nth_element(first, first + keep - 1, last,
                       [](const SparseEntry& a, const SparseEntry& b) {
                         return a.value != b.value ? a.value > b.value
                                                   : a.index < b.index;
                       });
      last = first + keep;
    }
    std::sort(first, last, [](const SparseEntry& a, const SparseEntry& b) {
      return a.index < b.index;
    });
    for (auto it = first; it != last; ++it) {
      if (it->value != 0.0f) query_[w++] = *it;
    }
  }
  query_.resize(w);
  double sq = 0;
  for (const auto& e : query_) sq += static_cast<double>(e.value) * e.value;
  if (options_.query_mass < 1.0 && query_.size() > 1) {
    // Keep the largest cells holding `query_mass` of the squared norm: the
    // rest (stray tokens) barely moves a cosine but costs a column each.
    values_.clear();
    for (const auto& e : query_) values_.push_back(e.value);
    std::sort(values_.begin(), values_.end(), std::greater<float>());
    double kept = 0;
    float cut = values_.back();
    for (float v : values_) {
      kept += static_cast<double>(v) * v;
      cut = v;
      if (kept >= options_.query_mass * sq) break;
    }
    size_t w = 0;
    sq = 0;
    for (const auto& e : query_) {
      if (e.value < cut) continue;
      query_[w++] = e;
      sq += static_cast<double>(e.value) * e.value;
    }
    query_.resize(w);
  }
  return std::sqrt(sq);
}

void Eamc::Match(EamPhase phase, double query_norm, int k,
                 std::vector<EamcMatch>* out) const {
  out->clear();
  if (query_.empty() || records_.empty() || k <= 0 || query_norm == 0) return;
  const Index& index = index_[static_cast<int>(phase)];
  const size_t n = records_.size();
  acc_.assign(n, 0.0f);
  float* acc = acc_.data();
  for (const auto& q : query_) {
    if (index.dense) {
      AxpyBf16(q.value,
               &index.cols[static_cast<size_t>(q.index) * options_.capacity],
               acc, n);
    } else {
      for (const Posting& p : index.posts[q.index])
        acc[p.record] += q.value * FromBf16(p.value);
    }
  }
  // The k best, kept sorted in `out` (insertion: k is small).
  for (size_t r = 0; r < n; ++r) {
    if (acc[r] <= 0 || index.norms[r] == 0) continue;
    const EamcMatch m{static_cast<int>(r),
                      acc[r] / (query_norm * index.norms[r])};
    if (static_cast<int>(out->size()) == k && !Better(m, out->back())) continue;
    if (static_cast<int>(out->size()) == k) out->pop_back();
    auto pos = std::upper_bound(out->begin(), out->end(), m, Better);
    out->insert(pos, m);
  }
}

std::vector<EamcMatch> Eamc::FindBest(const Eam& query, EamPhase phase,
                                      int k) const {
  std::vector<EamcMatch> out;
  FindBest(query, phase, k, &out);
  return out;
}

void Eamc::FindBest(const Eam& query, EamPhase phase, int k,
                    std::vector<EamcMatch>* out) const {
  if (k > 0) out->reserve(k + 1);
  Match(phase, BuildQuery(query), k, out);
}

void Eamc::Prepare(const Eam& eam, PreparedQuery* out) const {
  out->norm = BuildQuery(eam);
  out->cells.assign(query_.begin(), query_.end());
}

void Eamc::FindBest(const PreparedQuery& query, EamPhase phase, int k,
                    std::vector<EamcMatch>* out) const {
  query_.assign(query.cells.begin(), query.cells.end());
  if (k > 0) out->reserve(k + 1);
  Match(phase, query.norm, k, out);
}

std::vector<EamcMatch> Eamc::FindBest(const SparseEam& query, EamPhase phase,
                                      int k) const {
  query_.assign(query.entries().begin(), query.entries().end());
  std::vector<EamcMatch> out;
  if (k > 0) out.reserve(k + 1);
  Match(phase, query.norm(), k, &out);
  return out;
}

void Eamc::Clear() {
  for (int r = 0; r < size(); ++r) {
    IndexRemove(index_[0], r, records_[r].prefill);
    IndexRemove(index_[1], r, records_[r].decode);
  }
  records_.clear();
}

}  // namespace moe::cache
