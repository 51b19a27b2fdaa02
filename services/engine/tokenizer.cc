#include "services/engine/tokenizer.h"

#include <cctype>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/file_util.h"
#include "common/gguf.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/engine/tokenizer_spec.h"
#include "services/engine/tokenizer_spm.h"
#include "services/engine/tokenizer_text.h"

namespace moe {
namespace {

using tok::DecStep;
using tok::PreStep;
using tok::PrependScheme;
using tok::TokenizerSpec;

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// Metaspace: spaces become the replacement, a replacement may be prepended,
// and with `split` the text is cut before each replacement.
void ApplyMetaspace(const PreStep& step, bool first, std::vector<std::string>* pieces) {
  std::vector<std::string> out;
  for (size_t i = 0; i < pieces->size(); ++i) {
    std::string s = absl::StrReplaceAll((*pieces)[i], {{" ", step.replacement}});
    const bool prepend = step.prepend == PrependScheme::kAlways ||
                         (step.prepend == PrependScheme::kFirst && first && i == 0);
    if (prepend && !StartsWith(s, step.replacement)) s = step.replacement + s;
    if (!step.split) {
      out.push_back(std::move(s));
      continue;
    }
    size_t start = 0;
    while (start < s.size()) {
      size_t next = s.find(step.replacement, start + 1);
      if (next == std::string::npos) next = s.size();
      out.push_back(s.substr(start, next - start));
      start = next;
    }
  }
  *pieces = std::move(out);
}

void ApplyPreTokenizer(const PreStep& step, bool first, std::vector<std::string>* pieces) {
  if (step.kind == PreStep::kMetaspace) {
    ApplyMetaspace(step, first, pieces);
    return;
  }
  std::vector<std::string> out;
  for (std::string& p : *pieces) {
    if (step.kind == PreStep::kByteLevel) {
      if (step.add_prefix_space && !StartsWith(p, " ")) p.insert(0, " ");
      if (!step.use_regex) {
        out.push_back(tok::BytesToByteLevel(p));
        continue;
      }
      for (std::string_view w : tok::SplitText(p, tok::SplitPattern::kGpt2)) {
        out.push_back(tok::BytesToByteLevel(w));
      }
    } else {  // kSplit
      for (std::string_view w : tok::SplitText(p, step.pattern)) out.emplace_back(w);
    }
  }
  *pieces = std::move(out);
}

// Normalizes, pre-tokenizes and BPE-encodes text between added tokens.
// `first`: the segment starts the input (Metaspace's "first" scheme).
void EncodeSegment(const TokenizerSpec& spec, std::string_view segment, bool first,
                   std::vector<int32_t>* ids) {
  if (segment.empty()) return;
  if (spec.spm != nullptr) {
    spec.spm->Encode(segment, first, ids);
    return;
  }
  std::string s(segment);
  for (const tok::NormStep& n : spec.normalizers) {
    if (n.kind == tok::NormStep::kPrepend) {
      s.insert(0, n.to);
    } else {
      s = absl::StrReplaceAll(s, {{n.from, n.to}});
    }
  }
  std::vector<std::string> pieces{std::move(s)};
  for (const PreStep& step : spec.pre_tokenizers) ApplyPreTokenizer(step, first, &pieces);
  for (const std::string& p : pieces) spec.bpe.EncodeWord(p, ids);
}

// Returns the longest added token starting at text[pos], or nullptr.
const tok::AddedToken* MatchAdded(const TokenizerSpec& spec, std::string_view text, size_t pos) {
  if (spec.added.empty()) return nullptr;
  for (int i : spec.added_by_first_byte[static_cast<uint8_t>(text[pos])]) {
    const tok::AddedToken& a = spec.added[i];
    if (text.compare(pos, a.content.size(), a.content) == 0) return &a;
  }
  return nullptr;
}

void ByteFallback(std::vector<std::string>* toks) {
  std::vector<std::string> out;
  std::string bytes;
  bool pending = false;
  for (const std::string& t : *toks) {
    unsigned v = 0;
    const bool is_byte = t.size() == 6 && StartsWith(t, "<0x") && t[5] == '>' &&
                         std::sscanf(t.c_str() + 3, "%2x", &v) == 1 &&
                         std::isxdigit(static_cast<unsigned char>(t[3])) &&
                         std::isxdigit(static_cast<unsigned char>(t[4]));
    if (is_byte) {
      bytes.push_back(static_cast<char>(v));
      pending = true;
      continue;
    }
    if (pending) out.push_back(std::exchange(bytes, {}));
    pending = false;
    out.push_back(t);
  }
  if (pending) out.push_back(std::move(bytes));
  *toks = std::move(out);
}

void Strip(const DecStep& step, std::vector<std::string>* toks) {
  const std::string& c = step.content;
  for (std::string& t : *toks) {
    for (int i = 0; i < step.start && !c.empty() && StartsWith(t, c); ++i) t.erase(0, c.size());
    for (int i = 0; i < step.stop && !c.empty() && t.size() >= c.size() &&
                    t.compare(t.size() - c.size(), c.size(), c) == 0;
         ++i) {
      t.erase(t.size() - c.size());
    }
  }
}

// As `tokenizers` does: every replacement becomes a space, except in the first
// token where (unless the scheme is "never") replacements are dropped.
void MetaspaceDecode(const DecStep& step, std::vector<std::string>* toks) {
  for (size_t i = 0; i < toks->size(); ++i) {
    const bool drop = i == 0 && step.prepend != PrependScheme::kNever;
    (*toks)[i] = absl::StrReplaceAll((*toks)[i], {{step.from, drop ? "" : " "}});
  }
}

void ApplyDecoder(const DecStep& step, std::vector<std::string>* toks) {
  switch (step.kind) {
    case DecStep::kByteLevel:
      *toks = {tok::ByteLevelToBytes(absl::StrJoin(*toks, ""))};
      break;
    case DecStep::kReplace:
      for (std::string& t : *toks) t = absl::StrReplaceAll(t, {{step.from, step.to}});
      break;
    case DecStep::kByteFallback:
      ByteFallback(toks);
      break;
    case DecStep::kFuse:
      *toks = {absl::StrJoin(*toks, "")};
      break;
    case DecStep::kStrip:
      Strip(step, toks);
      break;
    case DecStep::kMetaspace:
      MetaspaceDecode(step, toks);
      break;
  }
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  return ss.str();
}

// A tokenizer_config.json names special tokens as a string or {"content": s}.
std::optional<std::string> ConfigToken(const nlohmann::json& cfg, const char* key) {
  if (!cfg.contains(key)) return std::nullopt;
  const nlohmann::json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<tok::TokenizerSpec> spec) : spec_(std::move(spec)) {
  bos_id_ = spec_->template_bos;
  for (const char* name : {"</s>", "<|endoftext|>", "<|end_of_text|>"}) {
    const std::optional<int32_t> id = IdOf(name);
    if (id.has_value() && IsSpecial(*id)) {
      eos_id_ = id;
      break;
    }
  }
}

Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view json) {
  ASSIGN_OR_RETURN(std::unique_ptr<tok::TokenizerSpec> spec, tok::ParseTokenizerJson(json));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(spec)));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  auto tokenizer = FromJson(text);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat(path, ": ", tokenizer.status().message()));
  }
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  auto config_text = ReadFile(dir + "/tokenizer_config.json");
  if (config_text.ok()) {
    const auto cfg = nlohmann::json::parse(*config_text, nullptr, /*allow_exceptions=*/false);
    if (cfg.is_object()) {
      Tokenizer& t = **tokenizer;
      if (auto bos = ConfigToken(cfg, "bos_token")) t.bos_id_ = t.IdOf(*bos);
      if (auto eos = ConfigToken(cfg, "eos_token"); eos && t.IdOf(*eos)) t.eos_id_ = t.IdOf(*eos);
    }
  }
  return tokenizer;
}

namespace {

// llama.cpp's tokenizer.ggml.pre names and the split regexes they stand for
// (the Hugging Face tokenizer.json patterns tokenizer_text.cc recognizes).
absl::StatusOr<std::string> PreRegex(absl::string_view pre) {
  if (pre == "default" || pre == "gpt-2" || pre == "gpt2" || pre == "olmo") {
    return std::string(
        R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
  }
  if (pre == "qwen2") {
    return std::string(
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
  }
  if (pre == "llama-bpe" || pre == "llama3") {
    return std::string(
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
  }
  return absl::UnimplementedError(absl::StrCat(
      "GGUF tokenizer.ggml.pre '", pre, "' is not supported (default, gpt-2, qwen2, llama-bpe)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufMetadata& m) {
  if (!m.Has("tokenizer.ggml.model")) {
    return absl::NotFoundError("the GGUF file has no tokenizer (tokenizer.ggml.model)");
  }
  ASSIGN_OR_RETURN(absl::string_view model, m.GetString("tokenizer.ggml.model"));
  if (model == "none") {  // llama.cpp's "no vocabulary" (token ids only)
    return absl::NotFoundError("the GGUF file has no tokenizer (tokenizer.ggml.model 'none')");
  }
  if (model == "llama") {
    absl::StatusOr<tok::GgufSpmVocab> v = tok::SpmVocabFromGguf(m);
    if (!v.ok()) {
      return absl::Status(v.status().code(),
                          absl::StrCat("GGUF tokenizer: ", v.status().message()));
    }
    std::unique_ptr<Tokenizer> t(new Tokenizer(std::move(v->spec)));
    if (v->bos_id.has_value()) t->bos_id_ = v->bos_id;
    if (v->eos_id.has_value()) t->eos_id_ = v->eos_id;
    return t;
  }
  if (model != "gpt2") {
    return absl::UnimplementedError(absl::StrCat(
        "GGUF tokenizer.ggml.model '", model,
        "' is not read yet (only 'gpt2', byte-level BPE, and 'llama', SentencePiece)"));
  }
  absl::string_view pre = "default";
  if (m.Has("tokenizer.ggml.pre")) {
    ASSIGN_OR_RETURN(pre, m.GetString("tokenizer.ggml.pre"));
  }
  ASSIGN_OR_RETURN(std::string regex, PreRegex(pre));
  ASSIGN_OR_RETURN(std::vector<absl::string_view> tokens, m.GetStringArray("tokenizer.ggml.tokens"));
  std::vector<absl::string_view> merges;
  if (m.Has("tokenizer.ggml.merges")) {
    ASSIGN_OR_RETURN(merges, m.GetStringArray("tokenizer.ggml.merges"));
  }
  std::vector<int64_t> types;
  if (m.Has("tokenizer.ggml.token_type")) {
    ASSIGN_OR_RETURN(types, m.GetIntArray("tokenizer.ggml.token_type"));
    if (types.size() != tokens.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GGUF tokenizer.ggml.token_type has ", types.size(), " entries for ", tokens.size(),
          " tokens"));
    }
  }
  // As a tokenizer.json, parsed by the one parser.
  nlohmann::json vocab = nlohmann::json::object();
  nlohmann::json added = nlohmann::json::array();
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string t(tokens[id]);
    const int64_t type = types.empty() ? 1 : types[id];
    if (type == 3 || type == 4) {  // control, user defined: matched whole
      added.push_back({{"id", id}, {"content", t}, {"special", type == 3}});
    }
    if (!vocab.contains(t)) vocab[t] = id;
  }
  nlohmann::json merge_list = nlohmann::json::array();
  for (absl::string_view mg : merges) merge_list.push_back(std::string(mg));
  nlohmann::json j = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}},
      {"added_tokens", added},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", regex}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", false},
           {"use_regex", false}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"post_processor", nullptr}};
  std::optional<int64_t> bos, eos;
  if (m.Has("tokenizer.ggml.bos_token_id")) {
    ASSIGN_OR_RETURN(bos, m.GetInt("tokenizer.ggml.bos_token_id"));
  }
  if (m.Has("tokenizer.ggml.eos_token_id")) {
    ASSIGN_OR_RETURN(eos, m.GetInt("tokenizer.ggml.eos_token_id"));
  }
  for (const std::optional<int64_t>& id : {bos, eos}) {
    if (id.has_value() && (*id < 0 || *id >= static_cast<int64_t>(tokens.size()))) {
      return absl::InvalidArgumentError(absl::StrCat("GGUF bos/eos token id ", *id,
                                                     " outside the ", tokens.size(), " tokens"));
    }
  }
  bool add_bos = false;
  if (m.Has("tokenizer.ggml.add_bos_token")) {
    ASSIGN_OR_RETURN(add_bos, m.GetBool("tokenizer.ggml.add_bos_token"));
  }
  if (add_bos && bos.has_value()) {
    const std::string name(tokens[*bos]);
    j["post_processor"] = {
        {"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", name}, {"type_id", 0}}}},
                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"special_tokens", {{name, {{"id", name}, {"ids", {*bos}}, {"tokens", {name}}}}}}};
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = FromJson(j.dump());
  if (!t.ok()) {
    return absl::Status(t.status().code(),
                        absl::StrCat("GGUF tokenizer: ", t.status().message()));
  }
  if (bos.has_value()) (*t)->bos_id_ = static_cast<int32_t>(*bos);
  if (eos.has_value()) (*t)->eos_id_ = static_cast<int32_t>(*eos);
  return t;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::ForModel(const std::string& path) {
  if (absl::EndsWith(path, ".gguf") && IsRegularFile(path)) {
    ASSIGN_OR_RETURN(std::unique_ptr<GgufCheckpoint> gguf, GgufCheckpoint::Open(path));
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = FromGguf(gguf->metadata());
    if (!t.ok()) {
      return absl::Status(t.status().code(), absl::StrCat(path, ": ", t.status().message()));
    }
    return t;
  }
  const std::string file = JoinPath(path, "tokenizer.json");
  if (!IsRegularFile(file)) return absl::NotFoundError(absl::StrCat("no tokenizer.json in ", path));
  return FromFile(file);
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> ids;
  size_t seg_start = 0, pos = 0;
  while (pos < text.size()) {
    const tok::AddedToken* a = MatchAdded(*spec_, text, pos);
    if (a == nullptr) {
      ++pos;
      continue;
    }
    size_t seg_end = pos;
    if (a->lstrip) {
      while (seg_end > seg_start && IsAsciiSpace(text[seg_end - 1])) --seg_end;
    }
    EncodeSegment(*spec_, text.substr(seg_start, seg_end - seg_start), seg_start == 0, &ids);
    ids.push_back(a->id);
    pos += a->content.size();
    if (a->rstrip) {
      while (pos < text.size() && IsAsciiSpace(text[pos])) ++pos;
    }
    seg_start = pos;
  }
  EncodeSegment(*spec_, text.substr(seg_start), seg_start == 0, &ids);
  if (!add_special || spec_->single_template.empty()) return ids;
  std::vector<int32_t> out;
  for (int32_t item : spec_->single_template) {
    if (item < 0) {
      out.insert(out.end(), ids.begin(), ids.end());
    } else {
      out.push_back(item);
    }
  }
  return out;
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special) const {
  std::vector<int32_t> kept;
  kept.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || spec_->id_to_token[id].empty()) continue;
    if (skip_special && IsSpecial(id)) continue;
    kept.push_back(id);
  }
  if (spec_->spm != nullptr) return spec_->spm->Decode(kept);
  std::vector<std::string> toks;
  toks.reserve(kept.size());
  for (int32_t id : kept) toks.push_back(spec_->id_to_token[id]);
  if (!spec_->has_decoder) return absl::StrJoin(toks, " ");
  for (const DecStep& step : spec_->decoders) ApplyDecoder(step, &toks);
  return absl::StrJoin(toks, "");
}

std::string_view Tokenizer::TokenText(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return spec_->id_to_token[id];
}

std::optional<int32_t> Tokenizer::IdOf(std::string_view token) const {
  for (const tok::AddedToken& a : spec_->added) {
    if (a.content == token) return a.id;
  }
  auto it = spec_->bpe.vocab().find(std::string(token));
  if (it == spec_->bpe.vocab().end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  auto it = spec_->added_special.find(id);
  return it != spec_->added_special.end() && it->second;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(spec_->id_to_token.size()); }

Tokenizer::Kind Tokenizer::kind() const { return spec_->kind; }

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::Push(int32_t id) {
  ids_.push_back(id);
  const std::string text = tokenizer_.Decode(ids_, skip_special_);
  if (text.size() <= emitted_bytes_) return {};
  const std::string_view fresh = std::string_view(text).substr(emitted_bytes_);
  const size_t complete = tok::CompleteUtf8Prefix(fresh);
  std::string out = tok::ToValidUtf8(fresh.substr(0, complete));
  emitted_bytes_ += complete;
  if (emitted_bytes_ == text.size()) {
    // All emitted: keep only the last token with text as left context.
    for (size_t t = ids_.size(); t-- > 0;) {
      if (!tokenizer_.Decode({ids_[t]}, skip_special_).empty()) {
        ids_.erase(ids_.begin(), ids_.begin() + t);
        emitted_bytes_ = tokenizer_.Decode(ids_, skip_special_).size();
        break;
      }
    }
  }
  return out;
}

std::string StreamDecoder::Flush() {
  const std::string text = tokenizer_.Decode(ids_, skip_special_);
  if (text.size() <= emitted_bytes_) return {};
  std::string out = tok::ToValidUtf8(std::string_view(text).substr(emitted_bytes_));
  emitted_bytes_ = text.size();
  return out;
}

}  // namespace moe
