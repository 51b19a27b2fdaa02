#include "services/serving/prefix_cache.h"

#include <algorithm>
#include <utility>

#include "common/status_macros.h"

namespace moe::serving {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

PrefixCache::PrefixCache(int64_t max_bytes, int block_tokens)
    : max_bytes_(max_bytes), block_(std::max(1, block_tokens)) {}

uint64_t PrefixCache::ChainHash(uint64_t previous, absl::Span<const int32_t> block) {
  uint64_t h = Mix(previous ^ 0x5bd1e995ull);
  for (int32_t t : block) h = Mix(h ^ static_cast<uint32_t>(t));
  return h;
}

std::pair<PrefixCache::EntryList::iterator, int64_t> PrefixCache::Longest(
    absl::Span<const int32_t> tokens, int64_t max_blocks) {
  std::vector<uint64_t> chain;
  chain.reserve(static_cast<size_t>(max_blocks));
  uint64_t h = 0;
  for (int64_t k = 0; k < max_blocks; ++k) {
    h = ChainHash(h, tokens.subspan(static_cast<size_t>(k * block_), block_));
    chain.push_back(h);
  }
  // Deepest first; an entry's tokens are compared, never trusted to the hash.
  for (int64_t k = max_blocks; k >= 1; --k) {
    auto found = index_.find(chain[static_cast<size_t>(k - 1)]);
    if (found == index_.end()) continue;
    const std::vector<int32_t>& kept = found->second->tokens;
    const size_t n = static_cast<size_t>(k * block_);
    if (kept.size() >= n && std::equal(kept.begin(), kept.begin() + n, tokens.begin())) {
      return {found->second, k};
    }
  }
  return {entries_list_.end(), 0};
}

std::optional<PrefixCache::Hit> PrefixCache::Lookup(absl::Span<const int32_t> prompt) {
  if (!enabled() || prompt.size() < 2) return std::nullopt;
  // At least one prompt token is left to run.
  const int64_t max_blocks = static_cast<int64_t>(prompt.size() - 1) / block_;
  if (max_blocks == 0) return std::nullopt;
  auto [it, blocks] = Longest(prompt, max_blocks);
  if (blocks == 0) return std::nullopt;
  entries_list_.splice(entries_list_.begin(), entries_list_, it);  // most recently used
  return Hit{it->snapshot, blocks * block_};
}

void PrefixCache::Erase(EntryList::iterator it) {
  for (uint64_t key : it->keys) {
    auto found = index_.find(key);
    if (found != index_.end() && found->second == it) index_.erase(found);
  }
  bytes_ -= it->snapshot->bytes();
  entries_list_.erase(it);
  entries_ = static_cast<int64_t>(entries_list_.size());
}

absl::Status PrefixCache::Insert(absl::Span<const int32_t> tokens, const Session& session) {
  if (!enabled()) return absl::OkStatus();
  const int64_t ran = std::min<int64_t>(static_cast<int64_t>(tokens.size()), session.position());
  const int64_t blocks = ran / block_;
  if (blocks == 0) return absl::OkStatus();
  const int64_t positions = blocks * block_;
  const absl::Span<const int32_t> kept = tokens.first(static_cast<size_t>(positions));
  if (auto [it, have] = Longest(kept, blocks); have == blocks) {
    entries_list_.splice(entries_list_.begin(), entries_list_, it);
    return absl::OkStatus();  // already kept
  }
  const int64_t need = Session::KvCacheBytes(session.model(), positions);
  if (need > max_bytes_) return absl::OkStatus();  // would not fit alone
  while (!entries_list_.empty() && bytes_.load() + need > max_bytes_) {
    Erase(std::prev(entries_list_.end()));
  }
  ASSIGN_OR_RETURN(KvSnapshot snapshot, session.SaveKv(positions));
  entries_list_.push_front(Entry{});
  const EntryList::iterator entry = entries_list_.begin();
  entry->tokens.assign(kept.begin(), kept.end());
  entry->snapshot = std::make_shared<const KvSnapshot>(std::move(snapshot));
  bytes_ += entry->snapshot->bytes();
  uint64_t h = 0;
  for (int64_t k = 0; k < blocks; ++k) {
    h = ChainHash(h, kept.subspan(static_cast<size_t>(k * block_), block_));
    auto found = index_.find(h);
    if (found != index_.end()) {
      // The newer entry answers for these blocks; an older one that no
      // longer answers for any goes.
      EntryList::iterator old = found->second;
      if (old == entry) continue;  // two depths with one hash: keep the first
      old->keys.erase(std::remove(old->keys.begin(), old->keys.end(), h), old->keys.end());
      found->second = entry;
      if (old->keys.empty()) Erase(old);
    } else {
      index_.emplace(h, entry);
    }
    entry->keys.push_back(h);
  }
  entries_ = static_cast<int64_t>(entries_list_.size());
  return absl::OkStatus();
}

}  // namespace moe::serving
