// Parsing of Hugging Face tokenizer.json into a TokenizerSpec.
#include <algorithm>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/engine/tokenizer_spec.h"

namespace moe::tok {
namespace {

using nlohmann::json;

// Real vocabularies have at most a few hundred thousand tokens; a larger id
// is a corrupt file, not a reason to allocate gigabytes.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

std::string TypeOf(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string()
             ? j["type"].get<std::string>()
             : std::string("<missing type>");
}

bool BoolOr(const json& j, const char* key, bool dflt) {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : dflt;
}

// A {"String": s} pattern; regex patterns are not supported here.
absl::StatusOr<std::string> LiteralPattern(const json& j, const char* where) {
  if (j.contains("pattern") && j["pattern"].contains("String")) {
    return j["pattern"]["String"].get<std::string>();
  }
  return absl::UnimplementedError(
      absl::StrCat(where, ": only literal {\"String\": ...} patterns are supported"));
}

absl::StatusOr<PrependScheme> ParsePrependScheme(const json& j) {
  if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
    const std::string s = j["prepend_scheme"];
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    return absl::InvalidArgumentError(absl::StrCat("Metaspace: unknown prepend_scheme ", s));
  }
  return BoolOr(j, "add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

absl::Status ParseNormalizer(const json& j, std::vector<NormStep>* out) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(j);
  if (type == "Sequence") {
    for (const json& n : j.at("normalizers")) RETURN_IF_ERROR(ParseNormalizer(n, out));
  } else if (type == "Prepend") {
    out->push_back({NormStep::kPrepend, "", j.at("prepend").get<std::string>()});
  } else if (type == "Replace") {
    ASSIGN_OR_RETURN(std::string from, LiteralPattern(j, "Replace normalizer"));
    if (from.empty()) return absl::InvalidArgumentError("Replace normalizer: empty pattern");
    out->push_back({NormStep::kReplace, from, j.at("content").get<std::string>()});
  } else if (type == "NFC") {
    // Treated as the identity: prompts are expected in NFC already, and
    // byte-level tokenizers round-trip any bytes regardless.
  } else {
    return absl::UnimplementedError(absl::StrCat("unsupported normalizer type ", type));
  }
  return absl::OkStatus();
}

absl::Status ParsePreTokenizer(const json& j, std::vector<PreStep>* out) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(j);
  PreStep step{};
  if (type == "Sequence") {
    for (const json& p : j.at("pretokenizers")) RETURN_IF_ERROR(ParsePreTokenizer(p, out));
    return absl::OkStatus();
  } else if (type == "ByteLevel") {
    step.kind = PreStep::kByteLevel;
    step.add_prefix_space = BoolOr(j, "add_prefix_space", false);
    step.use_regex = BoolOr(j, "use_regex", true);
  } else if (type == "Split") {
    step.kind = PreStep::kSplit;
    if (!j.contains("pattern") || !j["pattern"].contains("Regex")) {
      return absl::UnimplementedError("Split pre-tokenizer: only Regex patterns are supported");
    }
    ASSIGN_OR_RETURN(step.pattern,
                     SplitPatternFromRegex(j["pattern"]["Regex"].get<std::string>()));
    const std::string behavior = j.value("behavior", std::string("Isolated"));
    if (behavior != "Isolated" || BoolOr(j, "invert", false)) {
      return absl::UnimplementedError(absl::StrCat(
          "Split pre-tokenizer: only behavior Isolated without invert is supported, got ",
          behavior));
    }
  } else if (type == "Metaspace") {
    step.kind = PreStep::kMetaspace;
    step.replacement = j.value("replacement", std::string("\xE2\x96\x81"));
    ASSIGN_OR_RETURN(step.prepend, ParsePrependScheme(j));
    step.split = BoolOr(j, "split", true);
  } else {
    return absl::UnimplementedError(absl::StrCat("unsupported pre-tokenizer type ", type));
  }
  out->push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status ParseDecoder(const json& j, std::vector<DecStep>* out) {
  const std::string type = TypeOf(j);
  DecStep step{};
  if (type == "Sequence") {
    for (const json& d : j.at("decoders")) RETURN_IF_ERROR(ParseDecoder(d, out));
    return absl::OkStatus();
  } else if (type == "ByteLevel") {
    step.kind = DecStep::kByteLevel;
  } else if (type == "Replace") {
    step.kind = DecStep::kReplace;
    ASSIGN_OR_RETURN(step.from, LiteralPattern(j, "Replace decoder"));
    if (step.from.empty()) return absl::InvalidArgumentError("Replace decoder: empty pattern");
    step.to = j.at("content").get<std::string>();
  } else if (type == "ByteFallback") {
    step.kind = DecStep::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecStep::kFuse;
  } else if (type == "Strip") {
    step.kind = DecStep::kStrip;
    step.content = j.value("content", std::string(" "));
    step.start = j.value("start", 0);
    step.stop = j.value("stop", 0);
  } else if (type == "Metaspace") {
    step.kind = DecStep::kMetaspace;
    step.from = j.value("replacement", std::string("\xE2\x96\x81"));
    ASSIGN_OR_RETURN(step.prepend, ParsePrependScheme(j));
  } else {
    return absl::UnimplementedError(absl::StrCat("unsupported decoder type ", type));
  }
  out->push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status ParsePostProcessor(const json& j, TokenizerSpec* spec) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(j);
  if (type == "Sequence") {
    for (const json& p : j.at("processors")) RETURN_IF_ERROR(ParsePostProcessor(p, spec));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") return absl::OkStatus();  // only adjusts offsets
  if (type != "TemplateProcessing") {
    return absl::UnimplementedError(absl::StrCat("unsupported post-processor type ", type));
  }
  const json& specials = j.value("special_tokens", json::object());
  spec->single_template.clear();
  for (const json& item : j.at("single")) {
    if (item.contains("Sequence")) {
      spec->single_template.push_back(-1);
      continue;
    }
    const std::string name = item.at("SpecialToken").at("id").get<std::string>();
    if (!specials.contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("post-processor template names unknown special token ", name));
    }
    const json& ids = specials[name].at("ids");
    const bool first = spec->single_template.empty() && ids.size() == 1;
    for (const json& id : ids) {
      const int64_t v = id.get<int64_t>();
      if (v < 0 || v > kMaxTokenId) {
        return absl::InvalidArgumentError("post-processor template id out of range");
      }
      spec->single_template.push_back(static_cast<int32_t>(v));
    }
    if (first) spec->template_bos = spec->single_template.front();
  }
  return absl::OkStatus();
}

absl::Status ParseModel(const json& m, TokenizerSpec* spec) {
  const std::string type = m.contains("type") ? TypeOf(m) : std::string("BPE");
  if (type != "BPE") {
    return absl::UnimplementedError(absl::StrCat(
        "tokenizer model type ", type, " is not supported (only BPE tokenizers are)"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && m[key].is_string() && !m[key].get<std::string>().empty()) {
      return absl::UnimplementedError(absl::StrCat("BPE option ", key, " is not supported"));
    }
  }
  std::unordered_map<std::string, int32_t> vocab;
  for (const auto& [token, id] : m.at("vocab").items()) {
    const int64_t v = id.get<int64_t>();
    if (v < 0 || v > kMaxTokenId) {
      return absl::InvalidArgumentError(absl::StrCat("vocab id out of range for ", token));
    }
    vocab.emplace(token, static_cast<int32_t>(v));
  }
  std::vector<std::pair<std::string, std::string>> merges;
  for (const json& merge : m.value("merges", json::array())) {
    if (merge.is_array() && merge.size() == 2) {
      merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
      continue;
    }
    const std::string s = merge.get<std::string>();
    const size_t space = s.find(' ');
    if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("malformed merge \"", s, "\""));
    }
    merges.emplace_back(s.substr(0, space), s.substr(space + 1));
  }
  ASSIGN_OR_RETURN(spec->bpe, BpeModel::Build(std::move(vocab), merges));
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    auto it = spec->bpe.vocab().find(m["unk_token"].get<std::string>());
    if (it == spec->bpe.vocab().end()) {
      return absl::InvalidArgumentError("BPE unk_token is not in the vocabulary");
    }
    spec->bpe.unk_id = it->second;
  }
  spec->bpe.byte_fallback = BoolOr(m, "byte_fallback", false);
  spec->bpe.fuse_unk = BoolOr(m, "fuse_unk", false);
  spec->bpe.ignore_merges = BoolOr(m, "ignore_merges", false);
  return absl::OkStatus();
}

absl::Status ParseAddedTokens(const json& j, TokenizerSpec* spec) {
  for (const json& t : j) {
    AddedToken a;
    const int64_t id = t.at("id").get<int64_t>();
    a.content = t.at("content").get<std::string>();
    if (id < 0 || id > kMaxTokenId || a.content.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("added token \"", a.content, "\": id out of range or empty content"));
    }
    a.id = static_cast<int32_t>(id);
    a.special = BoolOr(t, "special", false);
    a.lstrip = BoolOr(t, "lstrip", false);
    a.rstrip = BoolOr(t, "rstrip", false);
    spec->added_special[a.id] = a.special;
    spec->added.push_back(std::move(a));
  }
  IndexAddedTokens(spec);
  return absl::OkStatus();
}

absl::Status ParseAll(const json& j, TokenizerSpec* spec) {
  if (!j.contains("model") || !j["model"].is_object()) {
    return absl::InvalidArgumentError("tokenizer.json has no \"model\" object");
  }
  RETURN_IF_ERROR(ParseModel(j["model"], spec));
  RETURN_IF_ERROR(ParseAddedTokens(j.value("added_tokens", json::array()), spec));
  RETURN_IF_ERROR(ParseNormalizer(j.value("normalizer", json()), &spec->normalizers));
  RETURN_IF_ERROR(ParsePreTokenizer(j.value("pre_tokenizer", json()), &spec->pre_tokenizers));
  const json decoder = j.value("decoder", json());
  spec->has_decoder = !decoder.is_null();
  if (spec->has_decoder) RETURN_IF_ERROR(ParseDecoder(decoder, &spec->decoders));
  RETURN_IF_ERROR(ParsePostProcessor(j.value("post_processor", json()), spec));

  int32_t size = 0;
  for (const auto& [token, id] : spec->bpe.vocab()) size = std::max(size, id + 1);
  for (const AddedToken& a : spec->added) size = std::max(size, a.id + 1);
  spec->id_to_token.assign(size, "");
  for (const auto& [token, id] : spec->bpe.vocab()) spec->id_to_token[id] = token;
  for (const AddedToken& a : spec->added) spec->id_to_token[a.id] = a.content;
  for (int32_t id : spec->single_template) {
    if (id >= size) {
      return absl::InvalidArgumentError(
          absl::StrCat("post-processor template names token id ", id, ", outside the vocabulary"));
    }
  }

  const bool byte_level =
      std::any_of(spec->pre_tokenizers.begin(), spec->pre_tokenizers.end(),
                  [](const PreStep& p) { return p.kind == PreStep::kByteLevel; });
  spec->kind = byte_level ? Tokenizer::Kind::kByteLevel : Tokenizer::Kind::kSentencePiece;
  return absl::OkStatus();
}

}  // namespace

void IndexAddedTokens(TokenizerSpec* spec) {
  std::stable_sort(spec->added.begin(), spec->added.end(),
                   [](const AddedToken& x, const AddedToken& y) {
                     return x.content.size() > y.content.size();
                   });
  spec->added_by_first_byte.assign(256, {});
  for (size_t i = 0; i < spec->added.size(); ++i) {
    const auto first = static_cast<uint8_t>(spec->added[i].content[0]);
    spec->added_by_first_byte[first].push_back(static_cast<int>(i));
  }
}

absl::StatusOr<std::unique_ptr<TokenizerSpec>> ParseTokenizerJson(std::string_view text) {
  const json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("tokenizer.json is not a valid JSON object");
  }
  auto spec = std::make_unique<TokenizerSpec>();
  // nlohmann throws on a field of the wrong type; report it as bad input.
  try {
    RETURN_IF_ERROR(ParseAll(j, spec.get()));
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json has an unexpected structure: ", e.what()));
  }
  return spec;
}

}  // namespace moe::tok
