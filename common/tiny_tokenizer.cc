#include "common/tiny_tokenizer.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace moe {
namespace {

// Plain English for learning merges; any text works, this one only has to
// be varied enough to fill a few hundred merges.
constexpr char kTrainingText[] =
    "The little library stood at the corner of the market square, and every "
    "morning the keeper opened its green doors before the bakers had finished "
    "their first loaves. People came in to read the news, to borrow a book for "
    "the week, or simply to sit by the window where the light was warm. The "
    "keeper knew most of them by name. She knew which of the children liked "
    "stories about the sea and which preferred the old maps of the mountains, "
    "and she kept a small notebook in which she wrote down what each of them "
    "had asked for, so that she could find it again when they returned.\n\n"
    "In the spring the river rose and the road to the next town was closed for "
    "three days. Nobody could bring new books, so the keeper started a game: "
    "each visitor would write one short page of a story and leave it on the "
    "table, and the next visitor would continue it. By the end of the week the "
    "story was forty pages long. It began with a fisherman who found a lamp in "
    "his net, and it ended, after many turns, with the whole town learning to "
    "sing the song that the lamp had been humming all along.\n\n"
    "Computers are very good at doing the same thing many times. A program "
    "that reads a file, counts the words, and prints the ten most common ones "
    "takes only a few lines, and it will give the same answer every time you "
    "run it. That is what makes them useful for measuring things: if the "
    "numbers change, something real has changed. When a result depends on the "
    "order in which threads finish, or on the time of day, it is much harder "
    "to trust, and much harder to test.\n\n"
    "A good cache keeps the things you will need next and forgets the things "
    "you will not. The simplest rule is to forget whatever was used the "
    "longest time ago. Another is to count how often each item is used and "
    "keep the most popular ones. Neither rule knows the future, but both can "
    "be compared with the best possible choice, which is easy to compute after "
    "the fact: when the cache is full, throw away the item whose next use is "
    "farthest away.\n\n"
    "The weather today is cold and clear. There is a light wind from the "
    "north, and the temperature will stay below ten degrees until the "
    "afternoon. Tomorrow there will be clouds in the morning and some rain in "
    "the evening. On Saturday and Sunday it should be dry and a little warmer, "
    "with twelve to fifteen degrees and plenty of sunshine.\n\n"
    "She said that she would come back on Monday. He didn't believe it, but "
    "he waited anyway, and when the bus stopped at the end of the street at "
    "half past nine, she was the first one to step down. They walked together "
    "to the station, talking about the trip, the people they had met, and the "
    "things they still wanted to do before the summer was over.\n\n"
    "Numbers: 1, 2, 3, 10, 20, 30, 100, 256, 1024, 2048, 4096. In 2024 the "
    "team measured 12 models on 4 machines and wrote the results into a table "
    "with 8 columns. The question was simple: how many tokens per second, and "
    "how much memory? The answer, as usual, was: it depends.\n";

bool IsSpace(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

int CharClass(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return 1;
  if (c >= '0' && c <= '9') return 2;
  if (IsSpace(c)) return 3;
  return 4;
}

size_t ContractionLength(absl::string_view t, size_t i) {
  if (t[i] != '\'') return 0;
  for (absl::string_view c : {"'s", "'t", "'m", "'d", "'re", "'ve", "'ll"}) {
    if (t.substr(i, c.size()) == c) return c.size();
  }
  return 0;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

std::vector<uint32_t> BuildByteToCodepoint() {
  std::vector<uint32_t> map(256, 0);
  std::vector<bool> printable(256, false);
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xa1; b <= 0xac; ++b) printable[b] = true;
  for (int b = 0xae; b <= 0xff; ++b) printable[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) map[b] = printable[b] ? b : next++;
  return map;
}

const std::vector<uint32_t>& ByteToCodepoint() {
  static const std::vector<uint32_t>* map =
      new std::vector<uint32_t>(BuildByteToCodepoint());
  return *map;
}

using Pair = std::pair<int32_t, int32_t>;

// Counts adjacent pairs over all words (weighted by word count).
std::map<Pair, int64_t> CountPairs(
    const std::vector<std::pair<std::vector<int32_t>, int64_t>>& words) {
  std::map<Pair, int64_t> counts;
  for (const auto& [ids, n] : words) {
    for (size_t i = 0; i + 1 < ids.size(); ++i)
      counts[{ids[i], ids[i + 1]}] += n;
  }
  return counts;
}

void ApplyMerge(const Pair& pair, int32_t merged,
                std::vector<std::pair<std::vector<int32_t>, int64_t>>* words) {
  for (auto& [ids, n] : *words) {
    std::vector<int32_t> out;
    out.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i + 1 < ids.size() && ids[i] == pair.first &&
          ids[i + 1] == pair.second) {
        out.push_back(merged);
        ++i;
      } else {
        out.push_back(ids[i]);
      }
    }
    ids = std::move(out);
  }
}

}  // namespace

std::string ByteToUnicode(uint8_t b) {
  std::string out;
  AppendUtf8(ByteToCodepoint()[b], &out);
  return out;
}

const std::vector<uint8_t>& ByteOrder() {
  static const std::vector<uint8_t>* order = [] {
    auto* v = new std::vector<uint8_t>();
    const auto& cp = ByteToCodepoint();
    for (int b = 0; b < 256; ++b) v->push_back(static_cast<uint8_t>(b));
    std::stable_sort(v->begin(), v->end(),
                     [&](uint8_t a, uint8_t b) { return cp[a] < cp[b]; });
    return v;
  }();
  return *order;
}

absl::string_view BuiltinTrainingText() { return kTrainingText; }

std::vector<std::string> PreTokenize(absl::string_view t) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < t.size()) {
    if (size_t n = ContractionLength(t, i); n > 0) {
      out.emplace_back(t.substr(i, n));
      i += n;
      continue;
    }
    size_t start = i;
    unsigned char c = static_cast<unsigned char>(t[i]);
    if (IsSpace(c)) {
      size_t end = i;
      while (end < t.size() && IsSpace(static_cast<unsigned char>(t[end])))
        ++end;
      if (end - i == 1 && c == ' ' && end < t.size()) {
        ++i;  // a single space joins the following word (" ?\p{L}+")
      } else {
        // Like `\s+(?!\S)`: leave the last whitespace before a word for
        // the next round.
        size_t j = (end < t.size() && end - i > 1) ? end - 1 : end;
        out.emplace_back(t.substr(i, j - i));
        i = j;
        continue;
      }
    }
    int cls = CharClass(static_cast<unsigned char>(t[i]));
    while (i < t.size() && CharClass(static_cast<unsigned char>(t[i])) == cls &&
           ContractionLength(t, i) == 0) {
      ++i;
    }
    out.emplace_back(t.substr(start, i - start));
  }
  return out;
}

namespace {

// The tokenizer.json of a byte-level BPE with `token_text` (ids in order),
// `merges` and `specials` after them; sets tok's special ids and size too.
void FillTokenizerJson(const std::vector<std::string>& token_text,
                       const std::vector<std::string>& merges,
                       const std::vector<std::string>& specials, TinyTokenizer* tok) {
  const int32_t num_specials = static_cast<int32_t>(specials.size());
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (size_t id = 0; id < token_text.size(); ++id) vocab[token_text[id]] = id;
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (const std::string& s : specials) {
    int32_t id =
        static_cast<int32_t>(token_text.size() + tok->special_tokens.size());
    tok->special_tokens.emplace_back(s, id);
    added.push_back({{"id", id},
                     {"content", s},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  tok->num_tokens = static_cast<int32_t>(token_text.size()) + num_specials;
  nlohmann::ordered_json byte_level = {{"type", "ByteLevel"},
                                       {"add_prefix_space", false},
                                       {"trim_offsets", true},
                                       {"use_regex", true}};
  nlohmann::ordered_json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = added;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = byte_level;
  j["post_processor"] = byte_level;
  j["decoder"] = byte_level;
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merges}};
  tok->json = j.dump(2) + "\n";
}

}  // namespace

absl::StatusOr<TinyTokenizer> MakeTinyTokenizer(
    int32_t max_vocab, const std::vector<std::string>& specials,
    absl::string_view text) {
  const int32_t num_specials = static_cast<int32_t>(specials.size());
  if (max_vocab < 256 + num_specials) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a byte-level BPE vocabulary needs at least ", 256 + num_specials,
        " tokens (256 bytes + ", num_specials, " special), got ", max_vocab));
  }
  std::vector<uint8_t> id_of_byte(256);
  std::vector<std::string> token_text;
  for (int32_t id = 0; id < 256; ++id) {
    uint8_t b = ByteOrder()[id];
    id_of_byte[b] = static_cast<uint8_t>(id);
    token_text.push_back(ByteToUnicode(b));
  }
  std::map<std::string, int64_t> word_counts;
  for (std::string& w : PreTokenize(text)) ++word_counts[std::move(w)];
  std::vector<std::pair<std::vector<int32_t>, int64_t>> words;
  for (const auto& [w, n] : word_counts) {
    std::vector<int32_t> ids;
    for (unsigned char b : w) ids.push_back(id_of_byte[b]);
    words.emplace_back(std::move(ids), n);
  }

  std::map<std::string, int32_t> id_of_text;
  for (int32_t id = 0; id < 256; ++id) id_of_text[token_text[id]] = id;
  std::vector<std::string> merges;
  while (static_cast<int32_t>(token_text.size()) + num_specials < max_vocab) {
    auto counts = CountPairs(words);
    const std::pair<const Pair, int64_t>* best = nullptr;
    for (const auto& entry : counts) {  // map order: ties go to the lowest pair
      if (best == nullptr || entry.second > best->second) best = &entry;
    }
    if (best == nullptr || best->second < 2) break;
    const Pair pair = best->first;
    std::string merged = token_text[pair.first] + token_text[pair.second];
    merges.push_back(
        absl::StrCat(token_text[pair.first], " ", token_text[pair.second]));
    auto [it, inserted] =
        id_of_text.emplace(merged, static_cast<int32_t>(token_text.size()));
    if (inserted) token_text.push_back(merged);
    ApplyMerge(pair, it->second, &words);
  }

  TinyTokenizer tok;
  tok.num_merges = static_cast<int32_t>(merges.size());
  FillTokenizerJson(token_text, merges, specials, &tok);
  return tok;
}

}  // namespace moe
