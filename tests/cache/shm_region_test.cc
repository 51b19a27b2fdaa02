#include "services/cache/shm_region.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace moe::cache {
namespace {

using ::absl::StatusCode;

std::string UniqueName(const char* tag) {
  return absl::StrCat("/moecache-test-", tag, "-", getpid());
}

TEST(ShmRegionTest, AnonymousRegionIsZeroedWritableAnd0600) {
  auto r = ShmRegion::Create("", 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->valid());
  EXPECT_TRUE(r->writable());
  EXPECT_EQ(r->size(), 1u << 20);
  EXPECT_TRUE(r->name().empty());
  for (uint64_t i = 0; i < r->size(); i += 4096) ASSERT_EQ(r->data()[i], 0);
  struct stat st;
  ASSERT_EQ(fstat(r->fd(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 1u << 20);
  // Sealed: the size cannot change under another process's mapping.
  EXPECT_NE(ftruncate(r->fd(), 4096), 0);
  EXPECT_NE(ftruncate(r->fd(), 2 << 20), 0);
  EXPECT_NE(fcntl(r->fd(), F_GETFD) & FD_CLOEXEC, 0);
}

// The kB `field` of /proc/self/smaps for the mapping that holds `start`,
// in bytes; -1 if none.
int64_t SmapsBytes(const void* start, const std::string& field) {
  long kb = 0;
  const std::string line = testing::SmapsLine(start, field);
  if (line.empty() || std::sscanf(line.c_str() + field.size(), " %ld kB", &kb) != 1) return -1;
  return int64_t{kb} * 1024;
}

// The resident bytes (pages with a page-table entry in this process).
int64_t MappedBytes(const void* start) { return SmapsBytes(start, "Rss:"); }

// The arena's page tables are filled at map time (the first request after
// start paid for faulting them in), unless a read-only open asks kOnTouch.
TEST(ShmRegionTest, MappingsArePopulatedUnlessAskedOnTouch) {
  constexpr uint64_t kBytes = 4 << 20;
  auto w = ShmRegion::Create("", kBytes);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(MappedBytes(w->data()), static_cast<int64_t>(kBytes));
  auto now = ShmRegion::OpenReadOnly(w->fd(), kBytes);
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(MappedBytes(now->data()), static_cast<int64_t>(kBytes));
  auto lazy = ShmRegion::OpenReadOnly(w->fd(), kBytes,
                                      ShmRegion::Pages::kOnTouch);
  ASSERT_TRUE(lazy.ok()) << lazy.status();
  EXPECT_EQ(MappedBytes(lazy->data()), 0);
  volatile uint8_t sink = lazy->data()[kBytes / 2];
  (void)sink;
  const int64_t touched = MappedBytes(lazy->data());
  EXPECT_GT(touched, 0);
  EXPECT_LT(touched, static_cast<int64_t>(kBytes));
}

// Bytes of the mapping that holds `start` mapped as whole huge pages.
int64_t PmdMappedBytes(const void* start) { return SmapsBytes(start, "ShmemPmdMapped:"); }

// Every mapping starts on a 2 MiB boundary, so a huge page can be mapped
// whole; CollapseToHugePages moves the memory onto huge pages, whatever
// shmem_enabled says short of "deny", and every mapping sees the same bytes.
TEST(ShmRegionTest, MappingsAreHugePageAlignedAndCollapse) {
  constexpr uint64_t kBytes = 8 << 20;
  auto w = ShmRegion::Create("", kBytes);
  ASSERT_TRUE(w.ok()) << w.status();
  auto ro = ShmRegion::OpenReadOnly(w->fd(), kBytes);
  ASSERT_TRUE(ro.ok()) << ro.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w->data()) % kHugePageBytes, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ro->data()) % kHugePageBytes, 0u);
  for (uint64_t i = 0; i < kBytes; i += 4096) w->mutable_data()[i] = static_cast<uint8_t>(i >> 12);
  // Not whole huge pages: nothing (the part past the first boundary).
  EXPECT_EQ(CollapseToHugePages(w->data() + 4096, kHugePageBytes), 0u);
  const uint64_t got = CollapseToHugePages(w->data(), kBytes);
  if (testing::KernelCollapsesSharedMemory(ShmemHugePageMode())) {
    EXPECT_EQ(got, kBytes);
  }
  for (uint64_t i = 0; i < kBytes; i += 4096) {
    ASSERT_EQ(w->data()[i], static_cast<uint8_t>(i >> 12)) << i;
    ASSERT_EQ(ro->data()[i], static_cast<uint8_t>(i >> 12)) << i;
  }
  if (got > 0) {
    EXPECT_EQ(PmdMappedBytes(w->data()), static_cast<int64_t>(kBytes));
    EXPECT_EQ(PmdMappedBytes(ro->data()), static_cast<int64_t>(kBytes));  // touched above
  }
  w->mutable_data()[kBytes - 1] = 0x5a;  // still one memory
  EXPECT_EQ(ro->data()[kBytes - 1], 0x5a);
}

TEST(ShmRegionTest, ShmemHugePageModeIsTheBracketedWord) {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string line;
  if (!std::getline(in, line)) {
    EXPECT_EQ(ShmemHugePageMode(), "");
    return;
  }
  const std::string mode = ShmemHugePageMode();
  ASSERT_FALSE(mode.empty()) << line;
  EXPECT_NE(line.find("[" + mode + "]"), std::string::npos) << line;
}

TEST(ShmRegionTest, SecondMappingOfFdSeesWritesReadOnly) {
  auto w = ShmRegion::Create("", 8192);
  ASSERT_TRUE(w.ok()) << w.status();
  auto ro = ShmRegion::OpenReadOnly(w->fd(), 8192);
  ASSERT_TRUE(ro.ok()) << ro.status();
  EXPECT_FALSE(ro->writable());
  EXPECT_EQ(ro->mutable_data(), nullptr);
  EXPECT_NE(ro->fd(), w->fd());  // duplicated
  std::memcpy(w->mutable_data() + 100, "expert", 6);
  EXPECT_EQ(std::memcmp(ro->data() + 100, "expert", 6), 0);
  // The read-only mapping survives the creator going away.
  w = absl::InternalError("dropped");
  EXPECT_EQ(std::memcmp(ro->data() + 100, "expert", 6), 0);
}

TEST(ShmRegionTest, ForkedChildSeesParentWrites) {
  auto w = ShmRegion::Create("", 4096);
  ASSERT_TRUE(w.ok()) << w.status();
  std::memcpy(w->mutable_data(), "before", 6);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: map the inherited fd read-only and check the bytes.
    auto ro = ShmRegion::OpenReadOnly(w->fd(), 4096);
    if (!ro.ok()) _exit(2);
    _exit(std::memcmp(ro->data(), "before", 6) == 0 ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(ShmRegionTest, ChildWritesAreSeenByParent) {
  auto w = ShmRegion::Create("", 4096);
  ASSERT_TRUE(w.ok()) << w.status();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::memcpy(w->mutable_data() + 10, "from child", 10);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_EQ(std::memcmp(w->data() + 10, "from child", 10), 0);
}

TEST(ShmRegionTest, NamedRegionOpenByNameAndUnlinkOnDestroy) {
  const std::string name = UniqueName("named");
  {
    auto w = ShmRegion::Create(name, 65536);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->name(), name);
    struct stat st;
    ASSERT_EQ(stat(absl::StrCat("/dev/shm", name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    // Exclusive create: a second daemon cannot take over the name.
    EXPECT_EQ(ShmRegion::Create(name, 65536).status().code(),
              StatusCode::kAlreadyExists);
    auto ro = ShmRegion::OpenReadOnlyByName(name, 65536);
    ASSERT_TRUE(ro.ok()) << ro.status();
    w->mutable_data()[65535] = 0x5a;
    EXPECT_EQ(ro->data()[65535], 0x5a);
    // Asking for more than the object holds is refused, not a SIGBUS later.
    EXPECT_EQ(ShmRegion::OpenReadOnlyByName(name, 65537).status().code(),
              StatusCode::kInvalidArgument);
    // Moving keeps ownership (and the unlink) with the new object.
    ShmRegion moved = std::move(*w);
    EXPECT_FALSE(w->valid());
    EXPECT_EQ(moved.name(), name);
  }
  EXPECT_EQ(ShmRegion::OpenReadOnlyByName(name, 1).status().code(),
            StatusCode::kNotFound);
}

TEST(ShmRegionTest, ClearErrors) {
  EXPECT_EQ(ShmRegion::Create("", 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRegion::Create("no-slash", 10).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRegion::Create("/a/b", 10).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRegion::Create(std::string(300, 'x').insert(0, "/"), 10)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRegion::OpenReadOnly(-1, 10).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRegion::OpenReadOnly(987654, 10).status().code(),
            StatusCode::kInvalidArgument);  // EBADF
  // Far more than any tmpfs holds: refused at Create, not a SIGBUS on touch.
  auto huge = ShmRegion::Create("", uint64_t{1} << 50);
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted)
      << huge.status();
  const std::string name = UniqueName("huge");
  EXPECT_EQ(ShmRegion::Create(name, uint64_t{1} << 50).status().code(),
            StatusCode::kResourceExhausted);
  // The failed named create left nothing behind.
  EXPECT_EQ(ShmRegion::OpenReadOnlyByName(name, 1).status().code(),
            StatusCode::kNotFound);
}

TEST(ShmRegionTest, WriteOnlyDescriptorIsPermissionDenied) {
  char path[] = "/tmp/moecache-shm-test-XXXXXX";
  const int tmp = mkstemp(path);
  ASSERT_GE(tmp, 0);
  ASSERT_EQ(ftruncate(tmp, 4096), 0);
  const int wo = open(path, O_WRONLY | O_CLOEXEC);
  ASSERT_GE(wo, 0);
  auto r = ShmRegion::OpenReadOnly(wo, 4096);
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status();
  EXPECT_NE(r.status().message().find("Permission denied"), std::string::npos);
  close(wo);
  close(tmp);
  unlink(path);
}

}  // namespace
}  // namespace moe::cache
