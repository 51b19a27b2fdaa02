#include "services/moe_cached/fd_broker.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace moe::cached {
namespace {

// A memfd holding `text`.
UniqueFd MemfdWith(const std::string& text) {
  UniqueFd fd(memfd_create("fd_broker_test", MFD_CLOEXEC));
  EXPECT_GE(fd.get(), 0);
  EXPECT_EQ(write(fd.get(), text.data(), text.size()), static_cast<ssize_t>(text.size()));
  return fd;
}

std::string ReadAll(int fd) {
  char buf[256];
  ssize_t n = pread(fd, buf, sizeof(buf), 0);
  return n > 0 ? std::string(buf, n) : std::string();
}

class FdBrokerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = FdBroker::Start(dir_.Sub("broker.sock"));
    ASSERT_TRUE(b.ok()) << b.status();
    broker_ = std::move(*b);
  }
  moe::testing::TempDir dir_;
  std::unique_ptr<FdBroker> broker_;
};

TEST_F(FdBrokerTest, HandsTheDescriptorsToTheGrantedProcessOnce) {
  UniqueFd a = MemfdWith("arena"), c = MemfdWith("channel");
  auto token = broker_->Grant(getpid(), {a.get(), c.get()}, absl::Seconds(10));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(broker_->pending_grants(), 1);
  auto fds = FetchFds(broker_->path(), *token);
  ASSERT_TRUE(fds.ok()) << fds.status();
  ASSERT_EQ(fds->size(), 2u);
  EXPECT_EQ(ReadAll((*fds)[0].get()), "arena");
  EXPECT_EQ(ReadAll((*fds)[1].get()), "channel");
  EXPECT_NE((*fds)[0].get(), a.get());  // a new descriptor, same object
  EXPECT_TRUE(fcntl((*fds)[0].get(), F_GETFD) & FD_CLOEXEC);
  // Used up.
  EXPECT_EQ(broker_->pending_grants(), 0);
  auto again = FetchFds(broker_->path(), *token);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kPermissionDenied) << again.status();
  EXPECT_NE(again.status().message().find("unknown or expired"), std::string::npos);
}

TEST_F(FdBrokerTest, AnotherProcessCannotCollectTheGrant) {
  UniqueFd a = MemfdWith("secret");
  // Granted to our parent's pid: we are not that process.
  auto token = broker_->Grant(getppid(), {a.get()}, absl::Seconds(10));
  ASSERT_TRUE(token.ok());
  auto fds = FetchFds(broker_->path(), *token);
  EXPECT_EQ(fds.status().code(), absl::StatusCode::kPermissionDenied) << fds.status();
  EXPECT_NE(fds.status().message().find("another process"), std::string::npos);
  // A refused attempt does not use the grant up.
  EXPECT_EQ(broker_->pending_grants(), 1);
}

TEST_F(FdBrokerTest, ChildGrantedByPidGetsIt) {
  UniqueFd a = MemfdWith("for the child");
  int sync[2];
  ASSERT_EQ(pipe(sync), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(sync[1]);
    char token[33] = {0};
    if (read(sync[0], token, 32) != 32) _exit(3);
    auto fds = FetchFds(broker_->path(), token);
    if (!fds.ok() || fds->size() != 1) _exit(4);
    _exit(ReadAll((*fds)[0].get()) == "for the child" ? 0 : 5);
  }
  close(sync[0]);
  auto token = broker_->Grant(child, {a.get()}, absl::Seconds(10));
  ASSERT_TRUE(token.ok());
  ASSERT_EQ(write(sync[1], token->data(), 32), 32);
  close(sync[1]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(broker_->pending_grants(), 0);
}

TEST_F(FdBrokerTest, ExpiredRevokedAndMalformedAreRefused) {
  UniqueFd a = MemfdWith("x");
  auto expired = broker_->Grant(getpid(), {a.get()}, absl::ZeroDuration());
  ASSERT_TRUE(expired.ok());
  EXPECT_EQ(FetchFds(broker_->path(), *expired).status().code(),
            absl::StatusCode::kPermissionDenied);
  auto revoked = broker_->Grant(getpid(), {a.get()}, absl::Seconds(10));
  ASSERT_TRUE(revoked.ok());
  broker_->Revoke(*revoked);
  EXPECT_EQ(FetchFds(broker_->path(), *revoked).status().code(),
            absl::StatusCode::kPermissionDenied);
  for (std::string bad : {std::string("zz"), std::string(32, 'G'), std::string(40, 'a'),
                          std::string("\0\1\2\3", 4)}) {
    auto r = FetchFds(broker_->path(), bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
  }
  EXPECT_FALSE(broker_->Grant(getpid(), {}, absl::Seconds(1)).ok());
  EXPECT_FALSE(broker_->Grant(0, {a.get()}, absl::Seconds(1)).ok());
  EXPECT_FALSE(broker_->Grant(getpid(), {-1}, absl::Seconds(1)).ok());
}

TEST_F(FdBrokerTest, SilentPeerDoesNotBlockOthersForever) {
  // Connects and says nothing: the broker gives up on it after a second.
  int silent = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, broker_->path().c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(connect(silent, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  UniqueFd a = MemfdWith("after");
  auto token = broker_->Grant(getpid(), {a.get()}, absl::Seconds(10));
  ASSERT_TRUE(token.ok());
  auto fds = FetchFds(broker_->path(), *token, absl::Seconds(5));
  ASSERT_TRUE(fds.ok()) << fds.status();
  EXPECT_EQ(ReadAll((*fds)[0].get()), "after");
  close(silent);
}

TEST_F(FdBrokerTest, SocketIsPrivateAndASecondBrokerIsRefused) {
  struct stat st;
  ASSERT_EQ(stat(broker_->path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(FdBroker::Start(broker_->path()).status().code(), absl::StatusCode::kAlreadyExists);
  // The refusal left the live broker's socket in place: it still serves.
  UniqueFd kept = MemfdWith("kept");
  auto token = broker_->Grant(getpid(), {kept.get()}, absl::Seconds(10));
  ASSERT_TRUE(token.ok());
  EXPECT_TRUE(FetchFds(broker_->path(), *token).ok());
  const std::string path = broker_->path();
  broker_.reset();
  EXPECT_NE(access(path.c_str(), F_OK), 0);  // unlinked
  EXPECT_EQ(FetchFds(path, std::string(32, 'a')).status().code(),
            absl::StatusCode::kUnavailable);
  // A regular file in the way is not clobbered.
  moe::testing::WriteText(path, "not a socket");
  EXPECT_EQ(FdBroker::Start(path).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(FdBroker::Start("relative.sock").ok());
}

TEST(FdBrokerStaleTest, StaleSocketOfADeadBrokerIsReplaced) {
  moe::testing::TempDir dir;
  const std::string path = dir.Sub("stale.sock");
  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(s);  // bound, never listened, never unlinked: what a crash leaves
  auto b = FdBroker::Start(path);
  ASSERT_TRUE(b.ok()) << b.status();
  UniqueFd a = MemfdWith("fresh");
  auto token = (*b)->Grant(getpid(), {a.get()}, absl::Seconds(10));
  ASSERT_TRUE(token.ok());
  auto fds = FetchFds(path, *token);
  ASSERT_TRUE(fds.ok()) << fds.status();
  EXPECT_EQ(ReadAll((*fds)[0].get()), "fresh");
}

}  // namespace
}  // namespace moe::cached
