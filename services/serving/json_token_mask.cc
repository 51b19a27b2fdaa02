// The token masks of json_constraint.h: TokenTrie (the vocabulary as a
// trie, with what the mask needs precomputed) and JsonMatcher's walk of it
// (AllowedTokens). The matcher's byte-level states are json_constraint.cc's.
#include "services/serving/json_constraint.h"

#include <algorithm>
#include <string>
#include <vector>

namespace moe::serving {

void JsonMatcher::AllowedTokens(const TokenTrie& trie, std::vector<uint8_t>* mask) const {
  mask->assign(trie.vocab_size(), 0);
  // levels[d]: the state after the first d bytes of the current trie path;
  // their buffers are reused from one node to the next.
  std::vector<JsonMatcher> levels(trie.max_length_ + 1, *this);
  Walk(trie, 0, 0, &levels, mask);
}

void JsonMatcher::Walk(const TokenTrie& trie, int32_t node, size_t level,
                       std::vector<JsonMatcher>* levels, std::vector<uint8_t>* mask) const {
  const JsonMatcher& from = (*levels)[level];
  if (const int64_t room = from.PlainRoom(); room >= 0) {
    const bool listed = level == 0;
    if (listed) {
      // Every plain token that fits, from the list.
      const size_t n = trie.plain_up_to_[std::min<size_t>(static_cast<size_t>(room),
                                                          trie.plain_up_to_.size() - 1)];
      for (size_t i = 0; i < n; ++i) (*mask)[trie.plain_by_length_[i]] = 1;
    }
    return WalkPlain(trie, node, level, level, 0, static_cast<uint64_t>(room), listed, levels,
                     mask);
  }
  for (int32_t child = trie.nodes_[node].first_child; child >= 0;
       child = trie.nodes_[child].next_sibling) {
    const TokenTrie::Node& t = trie.nodes_[child];
    if (!from.StepInto(t.byte, &(*levels)[level + 1])) continue;  // prune the subtree
    for (uint32_t i = t.ids_begin; i < t.ids_end; ++i) (*mask)[trie.ids_[i]] = 1;
    if (t.first_child >= 0) Walk(trie, child, level + 1, levels, mask);
  }
}

// Most of a vocabulary is allowed inside a string: a plain byte (printable
// ASCII but " and \) only adds a code point, so the walk follows runs of
// them without a copy of the state per byte, and builds the state only
// where another byte comes.
void JsonMatcher::WalkPlain(const TokenTrie& trie, int32_t node, size_t base, size_t level,
                            uint64_t extra, uint64_t room, bool listed,
                            std::vector<JsonMatcher>* levels, std::vector<uint8_t>* mask) const {
  bool built = extra == 0;  // (*levels)[level] holds the state after the path
  for (int32_t child = trie.nodes_[node].first_child; child >= 0;
       child = trie.nodes_[child].next_sibling) {
    const TokenTrie::Node& t = trie.nodes_[child];
    const uint8_t b = t.byte;
    if (b >= 0x20 && b < 0x80 && b != '"' && b != '\\') {
      if (extra >= room) continue;  // past maxLength
      if (listed) {
        // Its plain tokens are marked; look only for other bytes below.
        if (!t.plain_below && t.first_child >= 0) {
          WalkPlain(trie, child, base, level + 1, extra + 1, room, listed, levels, mask);
        }
        continue;
      }
      if (t.plain_below && extra + 1 + t.height <= room) {
        // Every token below is plain and fits: all of them, no walk.
        for (uint32_t i = t.subtree_begin; i < t.subtree_end; ++i) (*mask)[trie.ids_[i]] = 1;
        continue;
      }
      for (uint32_t i = t.ids_begin; i < t.ids_end; ++i) (*mask)[trie.ids_[i]] = 1;
      if (t.first_child >= 0) {
        WalkPlain(trie, child, base, level + 1, extra + 1, room, listed, levels, mask);
      }
      continue;
    }
    if (!built) {
      JsonMatcher& here = (*levels)[level];
      here = (*levels)[base];
      here.frames_.back().a += extra;
      built = true;
    }
    if (!(*levels)[level].StepInto(b, &(*levels)[level + 1])) continue;
    for (uint32_t i = t.ids_begin; i < t.ids_end; ++i) (*mask)[trie.ids_[i]] = 1;
    if (t.first_child >= 0) Walk(trie, child, level + 1, levels, mask);
  }
}

TokenTrie::TokenTrie(const std::vector<std::string>& token_bytes)
    : vocab_size_(static_cast<int>(token_bytes.size())) {
  std::vector<int32_t> order;
  for (size_t id = 0; id < token_bytes.size(); ++id) {
    if (!token_bytes[id].empty()) order.push_back(static_cast<int32_t>(id));
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t x, int32_t y) { return token_bytes[x] < token_bytes[y]; });
  // Sorted insertion builds the trie in preorder, with each node's children
  // in byte order and equal strings' ids next to each other.
  nodes_.emplace_back();
  std::vector<int32_t> last_child(1, -1);
  std::vector<int32_t> path(1, 0);  // path[d]: the node at depth d of the previous token
  const std::string* previous = nullptr;
  for (int32_t id : order) {
    const std::string& s = token_bytes[id];
    size_t common = 0;
    if (previous != nullptr) {
      const size_t limit = std::min(s.size(), previous->size());
      while (common < limit && s[common] == (*previous)[common]) ++common;
    }
    path.resize(common + 1);
    for (size_t d = common; d < s.size(); ++d) {
      const int32_t parent = path[d];
      const int32_t x = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      nodes_[x].byte = static_cast<uint8_t>(s[d]);
      last_child.push_back(-1);
      if (last_child[parent] < 0) {
        nodes_[parent].first_child = x;
      } else {
        nodes_[last_child[parent]].next_sibling = x;
      }
      last_child[parent] = x;
      path.push_back(x);
    }
    Node& end = nodes_[path[s.size()]];
    if (end.ids_begin == end.ids_end) end.ids_begin = static_cast<uint32_t>(ids_.size());
    ids_.push_back(id);
    end.ids_end = static_cast<uint32_t>(ids_.size());
    max_length_ = std::max(max_length_, static_cast<int>(s.size()));
    previous = &s;
  }
  // The plain tokens by length.
  for (size_t id = 0; id < token_bytes.size(); ++id) {
    const std::string& t = token_bytes[id];
    const bool plain = !t.empty() && std::all_of(t.begin(), t.end(), [](char c) {
      const uint8_t b = static_cast<uint8_t>(c);
      return b >= 0x20 && b < 0x80 && b != '"' && b != '\\';
    });
    if (plain) plain_by_length_.push_back(static_cast<int32_t>(id));
  }
  std::stable_sort(plain_by_length_.begin(), plain_by_length_.end(), [&](int32_t x, int32_t y) {
    return token_bytes[x].size() < token_bytes[y].size();
  });
  plain_up_to_.assign(static_cast<size_t>(max_length_) + 1, 0);
  for (int32_t id : plain_by_length_) ++plain_up_to_[token_bytes[id].size()];
  for (size_t n = 1; n < plain_up_to_.size(); ++n) plain_up_to_[n] += plain_up_to_[n - 1];
  // Subtree facts, children before parents (a child's index is larger).
  for (size_t x = nodes_.size(); x-- > 0;) {
    Node& n = nodes_[x];
    const uint8_t b = n.byte;
    n.plain_below = x != 0 && b >= 0x20 && b < 0x80 && b != '"' && b != '\\';
    n.subtree_begin = n.ids_begin;
    n.subtree_end = n.ids_end;
    bool first = n.ids_begin == n.ids_end;  // no tokens end here
    for (int32_t c = n.first_child; c >= 0; c = nodes_[c].next_sibling) {
      const Node& child = nodes_[c];
      n.height = std::max<uint32_t>(n.height, child.height + 1);
      n.plain_below = n.plain_below && child.plain_below;
      if (first) {
        n.subtree_begin = child.subtree_begin;
        first = false;
      }
      n.subtree_end = child.subtree_end;
    }
  }
}

}  // namespace moe::serving
