// main() of every GoogleTest binary: gives each test process its own
// temporary directory (TEST_TMPDIR, which ::testing::TempDir() returns), so
// tests that ctest runs in parallel never share files, and removes it at the
// end.
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "gtest/gtest.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  char tmpl[] = "/tmp/moe_test.XXXXXX";
  const char* dir = ::mkdtemp(tmpl);
  if (dir != nullptr) ::setenv("TEST_TMPDIR", dir, 1);
  int rc = RUN_ALL_TESTS();
  if (dir != nullptr && ::getenv("MOE_KEEP_TEST_TMPDIR") == nullptr) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  return rc;
}
