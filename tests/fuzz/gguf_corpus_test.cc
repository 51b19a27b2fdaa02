// Every malformed GGUF input in tests/fuzz/corpus/gguf must give a clear
// error (the substring listed in corpus/gguf/expected.txt) and never crash;
// every valid seed must open. Regenerate with tests/fuzz/make_gguf_corpus.py.
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moe {
namespace {

using ::testing::HasSubstr;

const std::string kCorpus =
    std::string(MOE_SOURCE_DIR) + "/tests/fuzz/corpus/gguf";

struct Entry {
  std::string path;      // relative to kCorpus
  std::string expected;  // "OK" or a substring of the error
};

std::vector<Entry> Manifest() {
  std::ifstream in(kCorpus + "/expected.txt");
  std::vector<Entry> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    size_t tab = line.find('\t');
    if (tab == std::string::npos) continue;
    out.push_back({line.substr(0, tab), line.substr(tab + 1)});
  }
  return out;
}

TEST(GgufCorpusTest, EveryEntryGivesItsError) {
  int malformed = 0;
  for (const Entry& e : Manifest()) {
    auto ckpt = GgufCheckpoint::Open(kCorpus + "/" + e.path);
    if (e.expected == "OK") {
      EXPECT_TRUE(ckpt.ok()) << e.path << ": " << ckpt.status();
      continue;
    }
    ++malformed;
    ASSERT_FALSE(ckpt.ok()) << e.path << " was accepted";
    const absl::Status& s = ckpt.status();
    // Bad content is INVALID_ARGUMENT; a missing part is NOT_FOUND.
    EXPECT_TRUE(s.code() == absl::StatusCode::kInvalidArgument ||
                s.code() == absl::StatusCode::kNotFound)
        << e.path << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(e.expected)) << e.path;
    EXPECT_EQ(std::string(s.message()).find('\n'), std::string::npos) << e.path;
  }
  EXPECT_GE(malformed, 40);
}

// Keeps the manifest honest: every file is listed, or is a later part of a
// split checkpoint whose first part is listed; no stale entries.
TEST(GgufCorpusTest, ManifestCoversTheCorpus) {
  std::set<std::string> listed, listed_dirs;
  for (const Entry& e : Manifest()) {
    listed.insert(e.path);
    auto slash = e.path.rfind('/');
    if (slash != std::string::npos) listed_dirs.insert(e.path.substr(0, slash));
  }
  std::set<std::string> present;
  for (const auto& f :
       std::filesystem::recursive_directory_iterator(kCorpus)) {
    if (!f.is_regular_file()) continue;
    std::string rel = std::filesystem::relative(f.path(), kCorpus).string();
    if (rel == "expected.txt") continue;
    auto slash = rel.rfind('/');
    if (slash != std::string::npos && listed_dirs.count(rel.substr(0, slash)) &&
        !listed.count(rel)) {
      continue;  // a later part
    }
    present.insert(rel);
  }
  EXPECT_EQ(listed, present);
}

}  // namespace
}  // namespace moe
