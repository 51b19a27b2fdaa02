// serving::PrefixCache: automatic prefix caching (the idea of vLLM's
// automatic prefix caching and llama-server's cache_prompt). When a
// sequence ends, the keys and values of the positions it ran (prompt, then
// output but the last token) are kept on the host as a KvSnapshot under the
// hashes of their whole blocks of `block_tokens` tokens; a later request
// whose prompt begins with the same blocks loads those positions
// (Session::LoadKv) and runs only the rest. A chat turn, which resends the
// conversation so far, runs only the new message.
//
//   PrefixCache cache(max_bytes, block_tokens);
//   if (std::optional<PrefixCache::Hit> hit = cache.Lookup(prompt)) {
//     session.LoadKv(*hit->snapshot, hit->positions);  // run prompt[positions:]
//   }
//   ... at the end ...
//   cache.Insert(tokens_the_session_ran, session);
//
// Invariants:
// - A hit's tokens equal the prompt's first `positions` tokens (compared,
//   not trusted to the hash), and positions < prompt size: at least one
//   prompt token runs, for its logits.
// - Outputs are bit-identical with and without the cache (Session::LoadKv).
// - Memory: the snapshots held never exceed max_bytes; the least recently
//   used go first. A sequence longer than max_bytes allows is not kept.
// - Hits are whole blocks: a prompt shares at most floor(n / block) blocks.
//
// Thread-compatible: the engine thread alone uses it (stats are atomics,
// readable from any thread).
#ifndef MOECACHE_SERVICES_SERVING_PREFIX_CACHE_H_
#define MOECACHE_SERVICES_SERVING_PREFIX_CACHE_H_

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "services/engine/session.h"

namespace moe::serving {

class PrefixCache {
 public:
  // max_bytes <= 0: off (Lookup never hits, Insert keeps nothing).
  // block_tokens >= 1.
  PrefixCache(int64_t max_bytes, int block_tokens);

  struct Hit {
    std::shared_ptr<const KvSnapshot> snapshot;  // holds it while in use
    int64_t positions = 0;                       // to load from it
  };
  // The longest cached run of whole blocks that begins `prompt` and leaves
  // at least one of its tokens to run; nullopt when none.
  std::optional<Hit> Lookup(absl::Span<const int32_t> prompt);

  // Keeps the first whole blocks of `tokens` (the tokens `session` ran, in
  // order: session.position() >= their number) unless they are already
  // kept, evicting the least recently used entries to stay under max_bytes.
  // A snapshot the session's backend cannot copy is not kept (the error is
  // returned; serving goes on).
  absl::Status Insert(absl::Span<const int32_t> tokens, const Session& session);

  bool enabled() const { return max_bytes_ > 0; }
  int block_tokens() const { return block_; }
  int64_t bytes() const { return bytes_.load(); }
  int64_t entries() const { return entries_.load(); }

 private:
  struct Entry {
    std::vector<int32_t> tokens;                 // whole blocks
    std::shared_ptr<const KvSnapshot> snapshot;  // tokens.size() positions
    std::vector<uint64_t> keys;                  // index keys that name it
  };
  using EntryList = std::list<Entry>;  // most recently used first

  // The hash of blocks [0, k] given blocks [0, k - 1]'s.
  static uint64_t ChainHash(uint64_t previous, absl::Span<const int32_t> block);
  // The longest indexed run of whole blocks beginning `tokens` (at most
  // max_blocks of them): its entry and block count; {end, 0} if none.
  std::pair<EntryList::iterator, int64_t> Longest(absl::Span<const int32_t> tokens,
                                                  int64_t max_blocks);
  void Erase(EntryList::iterator it);

  const int64_t max_bytes_;
  const int block_;
  EntryList entries_list_;
  // Chain hash of the first k blocks -> the entry that holds them.
  std::unordered_map<uint64_t, EntryList::iterator> index_;
  std::atomic<int64_t> bytes_{0};
  std::atomic<int64_t> entries_{0};
};

}  // namespace moe::serving

#endif  // MOECACHE_SERVICES_SERVING_PREFIX_CACHE_H_
