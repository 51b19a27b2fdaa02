#include "services/cache/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace moe::cache {
namespace {

absl::Status ErrnoStatus(int err, absl::string_view what) {
  std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case ENOMEM:
    case ENOSPC:
    case EMFILE:
    case ENFILE:
    case EFBIG:
      return absl::ResourceExhaustedError(msg);
    case ENOENT:
      return absl::NotFoundError(msg);
    case EEXIST:
      return absl::AlreadyExistsError(msg);
    case EINVAL:
    case EBADF:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status ValidateName(absl::string_view name) {
  if (name.size() < 2 || name.size() > 255 || name[0] != '/' ||
      name.find('/', 1) != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad shared memory name '", name,
        "': want '/name' with one slash, 2-255 characters"));
  }
  return absl::OkStatus();
}

absl::Status ValidateSize(uint64_t bytes) {
  if (bytes == 0) {
    return absl::InvalidArgumentError("shared memory region of 0 bytes");
  }
  if (bytes > static_cast<uint64_t>(std::numeric_limits<off_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory region of ", bytes, " bytes is too big"));
  }
  return absl::OkStatus();
}

// MemAvailable from /proc/meminfo; free RAM from sysinfo(2) if unreadable.
uint64_t AvailableMemoryBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  struct sysinfo si;
  if (sysinfo(&si) == 0) return uint64_t{si.freeram} * si.mem_unit;
  return std::numeric_limits<uint64_t>::max();
}

// Refuses a region the machine cannot back. posix_fallocate alone is not
// enough: memfd's internal tmpfs has no size limit, so reserving more than
// RAM would run the whole machine out of memory before failing.
absl::Status CheckBackable(uint64_t bytes, bool named) {
  const uint64_t avail = AvailableMemoryBytes();
  if (bytes > avail) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "shared memory region of ", bytes, " bytes exceeds the ", avail,
        " bytes of memory available"));
  }
  struct statvfs vfs;
  if (named && statvfs("/dev/shm", &vfs) == 0) {
    const uint64_t free_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
    if (bytes > free_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("shared memory region of ", bytes, " bytes exceeds the ",
                       free_bytes, " bytes free in /dev/shm"));
    }
  }
  return absl::OkStatus();
}

// A mapping and whether its page tables were filled.
struct Mapped {
  uint8_t* data = nullptr;
  bool filled = false;  // false: kOnTouch, or a kernel before 5.14
};

}  // namespace

void* MapSharedAligned(int fd, uint64_t bytes, int prot) {
  // Reserve room for a 2 MiB boundary, map the object there, give back
  // the rest. The kernel aligns shared memory itself only where
  // shmem_enabled offers huge pages.
  const uint64_t span = bytes + kHugePageBytes;
  void* reserve = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
  if (reserve == MAP_FAILED) return mmap(nullptr, bytes, prot, MAP_SHARED, fd, 0);
  const uintptr_t base = reinterpret_cast<uintptr_t>(reserve);
  const uintptr_t aligned = (base + kHugePageBytes - 1) & ~uintptr_t{kHugePageBytes - 1};
  void* p = mmap(reinterpret_cast<void*>(aligned), bytes, prot, MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    munmap(reserve, span);
    errno = err;
    return MAP_FAILED;
  }
  if (aligned > base) munmap(reserve, aligned - base);
  const uintptr_t end = aligned + bytes, reserve_end = base + span;
  if (reserve_end > end) munmap(reinterpret_cast<void*>(end), reserve_end - end);
  return p;
}

uint64_t CollapseToHugePages(const void* start, uint64_t bytes) {
  const uintptr_t first = (reinterpret_cast<uintptr_t>(start) + kHugePageBytes - 1) &
                          ~uintptr_t{kHugePageBytes - 1};
  const uintptr_t last = (reinterpret_cast<uintptr_t>(start) + bytes) &
                         ~uintptr_t{kHugePageBytes - 1};
  if (last <= first) return 0;
  // MADV_COLLAPSE: Linux 6.1; older kernels answer EINVAL.
  constexpr int kMadvCollapse = 25;
  if (madvise(reinterpret_cast<void*>(first), last - first, kMadvCollapse) != 0) return 0;
  return last - first;
}

namespace {

// Checks that `fd` is at least `bytes` long, then maps it at a 2 MiB
// boundary (MapSharedAligned), advised MADV_HUGEPAGE (shmem gives huge
// pages at allocation only where the kernel's shmem_enabled allows:
// `advise` takes the advice, `always` and `within_size` need none), and
// with kNow fills the page tables: readable, or writable, which allocates
// what is not yet there (through the advised mapping, so as huge pages
// where allowed).
absl::StatusOr<Mapped> MapFd(int fd, uint64_t bytes, bool writable,
                             ShmRegion::Pages pages, absl::string_view what) {
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoStatus(errno, absl::StrCat("fstat ", what));
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " holds ", st.st_size, " bytes, fewer than the ",
                     bytes, " requested"));
  }
  const int prot = writable ? (PROT_READ | PROT_WRITE) : PROT_READ;
  void* p = MapSharedAligned(fd, bytes, prot);
  if (p == MAP_FAILED) return ErrnoStatus(errno, absl::StrCat("mmap ", what));
  madvise(p, bytes, MADV_HUGEPAGE);  // best effort
  Mapped m{static_cast<uint8_t*>(p), false};
  if (pages == ShmRegion::Pages::kNow) {
    m.filled = madvise(p, bytes, writable ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) == 0;
    if (!m.filled && errno != EINVAL) {  // EINVAL: a kernel before 5.14
      const int err = errno == EFAULT ? ENOMEM : errno;
      munmap(p, bytes);
      return ErrnoStatus(err, absl::StrCat("fill the page tables of ", what));
    }
  }
  return m;
}

}  // namespace

ShmRegion::~ShmRegion() { Reset(); }

ShmRegion::ShmRegion(ShmRegion&& other) noexcept { *this = std::move(other); }

ShmRegion& ShmRegion::operator=(ShmRegion&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    fd_ = std::exchange(other.fd_, -1);
    writable_ = std::exchange(other.writable_, false);
    unlink_on_destroy_ = std::exchange(other.unlink_on_destroy_, false);
    name_ = std::move(other.name_);
    other.name_.clear();
  }
  return *this;
}

void ShmRegion::Reset() {
  if (data_ != nullptr) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
  if (unlink_on_destroy_) shm_unlink(name_.c_str());
  data_ = nullptr;
  size_ = 0;
  fd_ = -1;
  writable_ = false;
  unlink_on_destroy_ = false;
  name_.clear();
}

absl::StatusOr<ShmRegion> ShmRegion::Create(absl::string_view name,
                                            uint64_t bytes) {
  absl::Status s = ValidateSize(bytes);
  if (!s.ok()) return s;
  if (!name.empty()) {
    s = ValidateName(name);
    if (!s.ok()) return s;
  }
  s = CheckBackable(bytes, !name.empty());
  if (!s.ok()) return s;
  ShmRegion r;  // cleans up on every error path below
  std::string what;
  if (name.empty()) {
    what = "memfd arena";
    r.fd_ = memfd_create("moecache-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (r.fd_ < 0) return ErrnoStatus(errno, "memfd_create");
  } else {
    r.name_ = std::string(name);
    what = absl::StrCat("shared memory '", r.name_, "'");
    r.fd_ = shm_open(r.name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC,
                     0600);
    if (r.fd_ < 0) return ErrnoStatus(errno, absl::StrCat("create ", what));
    r.unlink_on_destroy_ = true;
  }
  if (fchmod(r.fd_, 0600) != 0) {
    return ErrnoStatus(errno, absl::StrCat("chmod ", what));
  }
  if (ftruncate(r.fd_, static_cast<off_t>(bytes)) != 0) {
    return ErrnoStatus(errno, absl::StrCat("size ", what, " to ", bytes));
  }
  if (name.empty() &&
      fcntl(r.fd_, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) !=
          0) {
    return ErrnoStatus(errno, absl::StrCat("seal ", what));
  }
  // Allocated now, so that a full tmpfs fails here, not as SIGBUS later:
  // by filling the page tables (huge pages where allowed), or where the
  // kernel cannot, posix_fallocate (small pages).
  absl::StatusOr<Mapped> mapped = MapFd(r.fd_, bytes, /*writable=*/true, Pages::kNow, what);
  if (!mapped.ok()) return mapped.status();
  r.data_ = mapped->data;
  r.size_ = bytes;
  if (!mapped->filled) {
    const int err = posix_fallocate(r.fd_, 0, static_cast<off_t>(bytes));
    if (err != 0) {
      return ErrnoStatus(err, absl::StrCat("reserve ", bytes, " bytes for ", what));
    }
  }
  r.writable_ = true;
  return r;
}

absl::StatusOr<ShmRegion> ShmRegion::OpenReadOnly(int fd, uint64_t bytes,
                                                  Pages pages) {
  absl::Status s = ValidateSize(bytes);
  if (!s.ok()) return s;
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad descriptor ", fd));
  }
  ShmRegion r;
  r.fd_ = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (r.fd_ < 0) return ErrnoStatus(errno, absl::StrCat("dup fd ", fd));
  absl::StatusOr<Mapped> mapped =
      MapFd(r.fd_, bytes, /*writable=*/false, pages,
            absl::StrCat("shared memory fd ", fd));
  if (!mapped.ok()) return mapped.status();
  r.data_ = mapped->data;
  r.size_ = bytes;
  return r;
}

absl::StatusOr<ShmRegion> ShmRegion::OpenReadOnlyByName(absl::string_view name,
                                                        uint64_t bytes,
                                                        Pages pages) {
  absl::Status s = ValidateSize(bytes);
  if (!s.ok()) return s;
  s = ValidateName(name);
  if (!s.ok()) return s;
  ShmRegion r;
  r.name_ = std::string(name);
  const std::string what = absl::StrCat("shared memory '", r.name_, "'");
  r.fd_ = shm_open(r.name_.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (r.fd_ < 0) return ErrnoStatus(errno, absl::StrCat("open ", what));
  absl::StatusOr<Mapped> mapped =
      MapFd(r.fd_, bytes, /*writable=*/false, pages, what);
  if (!mapped.ok()) return mapped.status();
  r.data_ = mapped->data;
  r.size_ = bytes;
  return r;
}

std::string ShmemHugePageMode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string line;
  std::getline(in, line);
  const size_t open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "";
  return line.substr(open + 1, close - open - 1);
}

}  // namespace moe::cache
