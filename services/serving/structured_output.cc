#include "services/serving/structured_output.h"

#include <string_view>
#include <utility>

namespace moe::serving {
namespace {

class JsonConstraint final : public TokenConstraint {
 public:
  JsonConstraint(std::shared_ptr<const JsonGrammar> grammar,
                 std::shared_ptr<const TokenVocabulary> vocabulary,
                 const std::vector<int32_t>& end_ids)
      : grammar_(std::move(grammar)),
        vocabulary_(std::move(vocabulary)),
        end_ids_(end_ids),
        matcher_(*grammar_) {}

  void Allowed(std::vector<uint8_t>* allowed) const override {
    matcher_.AllowedTokens(vocabulary_->trie(), allowed);
    if (!matcher_.IsComplete()) return;
    for (int32_t id : end_ids_) {
      if (id >= 0 && static_cast<size_t>(id) < allowed->size()) (*allowed)[id] = 1;
    }
  }

  void Accept(int32_t token) override {
    const std::vector<std::string>& bytes = vocabulary_->bytes();
    if (token < 0 || static_cast<size_t>(token) >= bytes.size()) return;
    // An end id is not text; any other token was allowed, so it advances.
    for (int32_t id : end_ids_) {
      if (id == token) return;
    }
    (void)matcher_.Advance(bytes[token]);
  }

  bool Done() const override { return matcher_.IsDone(); }

 private:
  const std::shared_ptr<const JsonGrammar> grammar_;  // before matcher_
  const std::shared_ptr<const TokenVocabulary> vocabulary_;
  const std::vector<int32_t> end_ids_;
  JsonMatcher matcher_;
};

class JsonConstraintFactory final : public TokenConstraintFactory {
 public:
  JsonConstraintFactory(std::shared_ptr<const JsonGrammar> grammar,
                        std::shared_ptr<const TokenVocabulary> vocabulary,
                        std::vector<int32_t> end_ids)
      : grammar_(std::move(grammar)),
        vocabulary_(std::move(vocabulary)),
        end_ids_(std::move(end_ids)) {}

  std::unique_ptr<TokenConstraint> Start() const override {
    return std::make_unique<JsonConstraint>(grammar_, vocabulary_, end_ids_);
  }

 private:
  std::shared_ptr<const JsonGrammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  std::vector<int32_t> end_ids_;
};

}  // namespace

std::vector<std::string> TokenBytes(const Tokenizer& tokenizer) {
  const int32_t n = tokenizer.vocab_size();
  std::vector<std::string> out(static_cast<size_t>(n));
  // A left context, so that a decoder's strip of a leading space at the
  // start of a text does not apply: the token as it reads mid-text.
  std::vector<int32_t> context = tokenizer.Encode("a", /*add_special=*/false);
  const std::string before = tokenizer.Decode(context);
  std::vector<int32_t> ids = context;
  ids.push_back(0);
  for (int32_t id = 0; id < n; ++id) {
    if (tokenizer.TokenText(id).empty() || tokenizer.IsSpecial(id)) continue;
    ids.back() = id;
    std::string text = tokenizer.Decode(ids);
    if (!context.empty() && std::string_view(text).substr(0, before.size()) == before) {
      out[id] = text.substr(before.size());
    } else {
      out[id] = tokenizer.Decode(std::vector<int32_t>{id});
    }
  }
  return out;
}

TokenVocabulary::TokenVocabulary(const Tokenizer& tokenizer)
    : TokenVocabulary(TokenBytes(tokenizer)) {}

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes)
    : bytes_(std::move(token_bytes)), trie_(bytes_) {}

std::shared_ptr<const TokenConstraintFactory> JsonTokenConstraint(
    std::shared_ptr<const JsonGrammar> grammar, std::shared_ptr<const TokenVocabulary> vocabulary,
    std::vector<int32_t> end_ids) {
  return std::make_shared<const JsonConstraintFactory>(std::move(grammar), std::move(vocabulary),
                                                       std::move(end_ids));
}

}  // namespace moe::serving
