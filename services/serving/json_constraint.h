// Structured output, part 2: JsonMatcher follows a JsonGrammar
// (json_schema.h) over the bytes a sequence has generated, and computes
// which tokens of the vocabulary may come next (the idea of outlines' and
// xgrammar's token masks).
//
//   TokenTrie trie(token_bytes);           // once per vocabulary
//   JsonMatcher m(grammar);                // once per sequence
//   each step:
//     m.AllowedTokens(trie, &mask);        // mask[id] = 1: id may be sampled
//     eos allowed iff m.IsComplete();      // the caller's business
//     sample id among them; m.Advance(token_bytes[id]);
//     stop when m.IsDone() (or on eos)
//
// Contract:
// - Advance(bytes) takes the bytes if the grammar allows every one of them
//   in turn, else returns false and leaves the state unchanged.
// - IsComplete(): what was taken is a whole value the grammar accepts (EOS
//   may be sampled now). IsDone(): complete, and nothing but whitespace may
//   follow (generation should stop).
// - AllowedTokens sets mask[id] = 1 exactly for the tokens whose whole byte
//   string Advance would take. Tokens with no bytes are never allowed.
// - Liveness (see json_schema.h): every state reached can be completed, so
//   until IsComplete() at least one byte is always allowed; whether a
//   vocabulary has a token for it is the vocabulary's matter (one with all
//   256 single bytes always does).
//
// Inside a string's plain text, the tokens made only of plain bytes that
// fit in the room left (maxLength) are marked from a list sorted by length,
// and the walk goes only down the subtrees that hold another byte: a large
// vocabulary costs a pass over its plain ids, not a walk of every node
// (measured in docs/benchmarks.md, "Structured output").
//
// Cost: the state is a few frames per live parse (one per open object,
// array, string or number, plus the top level), at most kJsonMaxDepth + 2
// frames of 24 bytes each; anyOf keeps one stack of frames per alternative
// still alive, identical stacks merged, at most kJsonMaxParses of them. If
// more would be alive at once, the later alternatives are dropped: the
// output stays valid, but a valid continuation may then be refused. A copy
// costs a couple of allocations and a memcpy. AllowedTokens walks the trie
// depth first with a copy of the state per level and prunes a subtree at
// the first refused byte: its cost scales with the allowed prefixes, not
// with vocabulary size times token length. Inside a string's plain text
// (most of a vocabulary is allowed there) it follows runs of plain ASCII
// bytes without copying the state.
//
// Lifecycle and thread-safety: the JsonGrammar must outlive its matchers.
// TokenTrie is immutable once built (share it among threads). JsonMatcher is
// thread-compatible: const methods may run concurrently, Advance may not.
#ifndef MOECACHE_SERVICES_SERVING_JSON_CONSTRAINT_H_
#define MOECACHE_SERVICES_SERVING_JSON_CONSTRAINT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "services/serving/json_schema.h"

namespace moe::serving {

// The most parses (anyOf alternatives) a matcher keeps alive at once.
inline constexpr int kJsonMaxParses = 32;

class TokenTrie {
 public:
  // token_bytes[id]: the bytes token `id` appends to the output.
  explicit TokenTrie(const std::vector<std::string>& token_bytes);

  int vocab_size() const { return vocab_size_; }
  int num_nodes() const { return static_cast<int>(nodes_.size()); }

 private:
  friend class JsonMatcher;
  // Preorder: a node's first child, when it has one, is the next node.
  struct Node {
    int32_t first_child = -1;
    int32_t next_sibling = -1;
    uint32_t ids_begin = 0, ids_end = 0;  // tokens that end here, in ids_
    // The tokens of the whole subtree (this node's and below): contiguous
    // in ids_, as the trie is laid out in preorder.
    uint32_t subtree_begin = 0, subtree_end = 0;
    uint32_t height = 0;       // the longest path below, in bytes
    bool plain_below = false;  // this byte and every byte below are plain
    uint8_t byte = 0;
  };
  std::vector<Node> nodes_;  // nodes_[0]: the root (no byte)
  std::vector<int32_t> ids_;
  // The tokens of plain bytes only, shortest first; plain_up_to_[n]: how
  // many of them have at most n bytes.
  std::vector<int32_t> plain_by_length_;
  std::vector<uint32_t> plain_up_to_;
  int vocab_size_ = 0;
  int max_length_ = 0;
};

class JsonMatcher {
 public:
  explicit JsonMatcher(const JsonGrammar& grammar);
  // The grammar must outlive the matcher: a temporary never does.
  explicit JsonMatcher(const JsonGrammar&& grammar) = delete;

  bool Advance(std::string_view bytes);
  bool CanAdvance(std::string_view bytes) const;
  bool IsComplete() const;
  bool IsDone() const;

  // Resizes *mask to trie.vocab_size(); 1 where the token may come next.
  void AllowedTokens(const TokenTrie& trie, std::vector<uint8_t>* mask) const;

  // Parses alive now (1 unless anyOf alternatives are still open).
  int num_parses() const { return static_cast<int>(stacks_.size()); }

 private:
  class Stepper;
  struct Frame {
    uint8_t kind = 0;
    uint8_t phase = 0;
    uint8_t flags = 0;
    uint8_t sub = 0;
    int32_t node = 0;
    uint64_t a = 0;
    uint64_t b = 0;
    bool operator==(const Frame&) const = default;
  };
  struct Stack {
    uint32_t begin = 0;  // in frames_
    uint8_t size = 0;
    uint8_t ws = 0;     // the whitespace run just taken (Stepper::Whitespace)
    uint8_t depth = 0;  // open objects and arrays
  };

  // The state after `byte` into *out (whose buffers are reused); false when
  // no parse takes it.
  bool StepInto(uint8_t byte, JsonMatcher* out) const;
  // Marks the allowed tokens below trie `node`; (*levels)[level] is the
  // state after the path to it.
  void Walk(const TokenTrie& trie, int32_t node, size_t level, std::vector<JsonMatcher>* levels,
            std::vector<uint8_t>* mask) const;
  // The same inside a string's plain text, where the state after the path
  // is (*levels)[base] with `extra` more code points (not materialized).
  // `listed`: the plain tokens from the root were marked from the list
  // already (only other bytes are looked for).
  void WalkPlain(const TokenTrie& trie, int32_t node, size_t base, size_t level, uint64_t extra,
                 uint64_t room, bool listed, std::vector<JsonMatcher>* levels,
                 std::vector<uint8_t>* mask) const;
  // Code points a single parse inside a string's plain text may still take;
  // -1 when the state is not that.
  int64_t PlainRoom() const;

  const JsonGrammar* grammar_;
  std::vector<Frame> frames_;  // all stacks, one after another
  std::vector<Stack> stacks_;
};

}  // namespace moe::serving

#endif  // MOECACHE_SERVICES_SERVING_JSON_CONSTRAINT_H_
