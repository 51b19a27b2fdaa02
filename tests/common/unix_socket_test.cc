#include "common/unix_socket.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace moe {
namespace {

using ::testing::HasSubstr;

// A socket bound at `path`; listening when `listen` (a live service), else
// what a crashed process leaves behind once closed.
int BindAt(const std::string& path, bool listen) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  if (listen) {
    EXPECT_EQ(::listen(fd, 4), 0);
  }
  return fd;
}

TEST(UnixSocketTest, LiveSocketIsRefusedNamingThePid) {
  testing::TempDir dir;
  const std::string path = dir.Sub("live.sock");
  const int fd = BindAt(path, /*listen=*/true);
  const FileIdentity before = IdentifyFile(path);
  absl::Status s = ClaimUnixSocketPath(path, SOCK_STREAM);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(s.message(), HasSubstr("pid " + std::to_string(::getpid())));
  EXPECT_THAT(s.message(), HasSubstr(path));
  // A probe with another socket type still sees it live.
  EXPECT_EQ(CheckUnixSocketFree(path, SOCK_SEQPACKET).code(), absl::StatusCode::kAlreadyExists);
  const FileIdentity after = IdentifyFile(path);
  EXPECT_TRUE(after.valid);
  EXPECT_EQ(after.ino, before.ino);  // untouched
  ::close(fd);
}

TEST(UnixSocketTest, StaleSocketIsReplaced) {
  testing::TempDir dir;
  const std::string path = dir.Sub("stale.sock");
  ::close(BindAt(path, /*listen=*/false));
  EXPECT_TRUE(CheckUnixSocketFree(path, SOCK_STREAM).ok());
  EXPECT_TRUE(IdentifyFile(path).valid);  // a check removes nothing
  EXPECT_TRUE(ClaimUnixSocketPath(path, SOCK_STREAM).ok());
  EXPECT_FALSE(IdentifyFile(path).valid);
}

TEST(UnixSocketTest, BadPlacesAreRefusedBeforeBinding) {
  testing::TempDir dir;
  absl::Status missing = CheckUnixSocketFree("/nonexistent/dir/c.sock", SOCK_STREAM);
  EXPECT_EQ(missing.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.message(), HasSubstr("/nonexistent/dir does not exist"));
  testing::WriteText(dir.Sub("file"), "x");
  EXPECT_EQ(ClaimUnixSocketPath(dir.Sub("file"), SOCK_STREAM).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(IdentifyFile(dir.Sub("file")).valid);
  EXPECT_FALSE(CheckUnixSocketFree(std::string(200, 'x'), SOCK_STREAM).ok());
}

TEST(UnixSocketTest, UnlinkOnlyTheFileThatWasBound) {
  testing::TempDir dir;
  const std::string path = dir.Sub("s.sock");
  const int fd = BindAt(path, false);  // open, as a serving process's is
  const FileIdentity mine = IdentifyFile(path);
  // Another process replaced it since: left alone.
  ASSERT_EQ(::unlink(path.c_str()), 0);
  testing::WriteText(path, "theirs");
  UnlinkIfSameFile(path, mine);
  EXPECT_TRUE(IdentifyFile(path).valid);
  ::close(fd);
  UnlinkIfSameFile(path, IdentifyFile(path));
  EXPECT_FALSE(IdentifyFile(path).valid);
}

}  // namespace
}  // namespace moe
