// Every malformed input in tests/fuzz/corpus must give a clear error (the
// substring listed in corpus/expected.txt) and never crash; every valid seed
// must load. Regenerate the corpus with tests/fuzz/make_corpus.py.
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "common/model_config.h"
#include "common/model_desc.h"
#include "common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moe {
namespace {

using ::testing::HasSubstr;

const std::string kCorpus = std::string(MOE_SOURCE_DIR) + "/tests/fuzz/corpus";

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

absl::Status Load(const std::string& rel) {
  const std::string path = kCorpus + "/" + rel;
  if (rel.rfind("safetensors/", 0) == 0)
    return SafetensorsFile::Open(path).status();
  if (rel.rfind("config/", 0) == 0) {
    auto text = ReadFileToString(path);
    if (!text.ok()) return text.status();
    return ParseModelConfig(*text).status();
  }
  return ModelDescription::Open(path).status();
}

TEST(FuzzCorpusTest, EveryEntryGivesItsError) {
  std::vector<Entry> entries = Manifest();
  int malformed = 0;
  for (const Entry& e : entries) {
    absl::Status s = Load(e.path);
    if (e.expected == "OK") {
      EXPECT_TRUE(s.ok()) << e.path << ": " << s;
      continue;
    }
    ++malformed;
    // Bad content is INVALID_ARGUMENT; a file the model needs but lacks is
    // NOT_FOUND. Anything else (OK, INTERNAL, ...) is a bug.
    EXPECT_TRUE(s.code() == absl::StatusCode::kInvalidArgument ||
                s.code() == absl::StatusCode::kNotFound)
        << e.path << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(e.expected)) << e.path;
    EXPECT_EQ(std::string(s.message()).find('\n'), std::string::npos) << e.path;
  }
  EXPECT_GE(malformed, 15);
}

// Keeps the manifest honest: no unlisted inputs, no stale entries.
TEST(FuzzCorpusTest, ManifestCoversTheCorpus) {
  std::set<std::string> listed;
  for (const Entry& e : Manifest()) listed.insert(e.path);
  std::set<std::string> present;
  for (const char* kind : {"safetensors", "config"}) {
    for (const auto& f :
         std::filesystem::directory_iterator(kCorpus + "/" + kind)) {
      present.insert(std::string(kind) + "/" + f.path().filename().string());
    }
  }
  for (const auto& d :
       std::filesystem::directory_iterator(kCorpus + "/model")) {
    present.insert("model/" + d.path().filename().string());
  }
  EXPECT_EQ(listed, present);
}

}  // namespace
}  // namespace moe
