// Helpers shared by the common/ tests: a self-deleting temporary directory
// and small file writers.
#ifndef MOECACHE_TESTS_COMMON_TEST_UTIL_H_
#define MOECACHE_TESTS_COMMON_TEST_UTIL_H_

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace moe::testing {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/moe_common_test.XXXXXX";
    const char* p = ::mkdtemp(tmpl);
    path_ = p != nullptr ? p : "";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace moe::testing

#endif  // MOECACHE_TESTS_COMMON_TEST_UTIL_H_
