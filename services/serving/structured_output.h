// Structured output, part 3: the JSON grammar (json_schema.h) and its token
// masks (json_constraint.h) as the engine's TokenConstraint, so that the
// one sampler chain (services/engine/sampler.h, step 0) constrains a
// request's output whatever its transport, batched or not.
//
//   TokenVocabulary vocab(tokenizer);                      // once per model
//   ASSIGN_OR_RETURN(auto grammar, GrammarFor(request));   // request.h
//   o.sampling.constraint = JsonTokenConstraint(grammar, vocab_ptr, ends);
//
// Semantics, per sequence:
// - a token may come next iff its bytes (TokenVocabulary) continue a value
//   the grammar accepts; special tokens and tokens of no bytes never do;
// - once the value is complete, the `end_ids` (the request's stop tokens
//   and the model's eos, unless ignored) are allowed too;
// - once nothing but whitespace could follow, the sequence ends with the
//   token that completed it (SampledToken::ends, finish reason "stop").
// A sequence cut short by max_new_tokens or a stop string ends with an
// incomplete value: finish reason "length" / "stop" says so.
//
// Thread-safety: TokenVocabulary and the factory are immutable (share them);
// each constraint is one sequence's.
#ifndef MOECACHE_SERVICES_SERVING_STRUCTURED_OUTPUT_H_
#define MOECACHE_SERVICES_SERVING_STRUCTURED_OUTPUT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "services/engine/sampler.h"
#include "services/engine/tokenizer.h"
#include "services/serving/json_constraint.h"
#include "services/serving/json_schema.h"

namespace moe::serving {

// What each token appends to the output, in bytes, and the trie over them.
class TokenVocabulary {
 public:
  explicit TokenVocabulary(const Tokenizer& tokenizer);
  // For tests: the bytes given.
  explicit TokenVocabulary(std::vector<std::string> token_bytes);

  const std::vector<std::string>& bytes() const { return bytes_; }
  const TokenTrie& trie() const { return trie_; }

 private:
  std::vector<std::string> bytes_;
  TokenTrie trie_;
};

// The bytes token `id` appends in the middle of a text (a decoder that
// strips a leading space at the start of a text does not here); "" for
// special tokens.
std::vector<std::string> TokenBytes(const Tokenizer& tokenizer);

std::shared_ptr<const TokenConstraintFactory> JsonTokenConstraint(
    std::shared_ptr<const JsonGrammar> grammar, std::shared_ptr<const TokenVocabulary> vocabulary,
    std::vector<int32_t> end_ids);

}  // namespace moe::serving

#endif  // MOECACHE_SERVICES_SERVING_STRUCTURED_OUTPUT_H_
