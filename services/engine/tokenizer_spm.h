// Internal: the SentencePiece-style vocabulary of a GGUF file
// (tokenizer.ggml.model "llama"): pieces with scores, merged by score as
// llama.cpp's SPM tokenizer does, with `<0xNN>` byte fallback. Used by
// tokenizer.cc; see Tokenizer::FromGguf for the contract.
#ifndef MOECACHE_SERVICES_ENGINE_TOKENIZER_SPM_H_
#define MOECACHE_SERVICES_ENGINE_TOKENIZER_SPM_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace moe {
class GgufMetadata;
}  // namespace moe

namespace moe::tok {

struct TokenizerSpec;

// llama.cpp's token types (tokenizer.ggml.token_type).
enum class SpmTokenType : int8_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

class SpmModel {
 public:
  struct Piece {
    std::string text;
    float score = 0;
    SpmTokenType type = SpmTokenType::kNormal;
    int16_t byte = -1;  // the byte a "<0xNN>" token stands for, else -1
  };

  // REQUIRES: unk_id, when set, indexes `pieces`.
  SpmModel(std::vector<Piece> pieces, std::optional<int32_t> unk_id, bool add_space_prefix);

  // Appends the ids of `text`, a stretch of input between special tokens.
  // `first`: the stretch starts the input (it gets the space prefix).
  void Encode(std::string_view text, bool first, std::vector<int32_t>* out) const;
  // The bytes of `ids`. REQUIRES: every id indexes the vocabulary.
  std::string Decode(absl::Span<const int32_t> ids) const;

 private:
  // The id of a piece that merging or a character lookup may produce.
  std::optional<int32_t> Find(std::string_view text) const;
  void Fallback(std::string_view symbol, std::vector<int32_t>* out) const;

  std::vector<Piece> pieces_;
  absl::flat_hash_map<std::string, int32_t> by_text_;  // first id of each text
  int32_t byte_ids_[256];                              // id of "<0xNN>", -1 if absent
  std::optional<int32_t> unk_id_;
  bool add_space_prefix_;
};

// The tokenizer spec of a GGUF file whose tokenizer.ggml.model is "llama",
// with its bos and eos ids.
struct GgufSpmVocab {
  std::unique_ptr<TokenizerSpec> spec;
  std::optional<int32_t> bos_id, eos_id;
};
absl::StatusOr<GgufSpmVocab> SpmVocabFromGguf(const GgufMetadata& metadata);

}  // namespace moe::tok

#endif  // MOECACHE_SERVICES_ENGINE_TOKENIZER_SPM_H_
