// ShmRegion: a POSIX shared-memory mapping for the CPU expert arena.
//
// The daemon Create()s the region (read-write); a worker maps the same memory
// read-only with OpenReadOnly (from a file descriptor passed over a Unix
// socket, or inherited) or OpenReadOnlyByName (a shm_open name).
//
//  - Anonymous regions (empty name) use memfd_create(MFD_CLOEXEC |
//    MFD_ALLOW_SEALING); the size is then sealed (F_SEAL_GROW|F_SEAL_SHRINK)
//    so no process can truncate the region under another one's mapping.
//  - Named regions ("/moecache-arena") use shm_open(O_CREAT|O_EXCL, 0600)
//    and are shm_unlink'ed when the creating ShmRegion is destroyed.
//  - The file mode is set to 0600 explicitly (not left to the umask).
//  - A size above MemAvailable (or, for named regions, the free space of
//    /dev/shm) is refused at once with RESOURCE_EXHAUSTED; then the memory is
//    allocated up front (every page written through the mapping with
//    MADV_POPULATE_WRITE; posix_fallocate on kernels before 5.14), so a
//    shortage fails at Create instead of as SIGBUS on first touch.
//  - Every mapping starts on a 2 MiB boundary (MapSharedAligned) and is
//    advised MADV_HUGEPAGE. Whether shared memory gets huge pages when it
//    is allocated is the kernel's shmem_enabled (Debian's default `never`;
//    `advise` honours the advice, see docs/operations.md): a decode step
//    streams the arena, and 4 KiB pages cost it a TLB miss per page.
//    CollapseToHugePages moves memory already allocated onto huge pages
//    whatever shmem_enabled says, short of `deny` (moe-cached does it in
//    the background after start: HugePageCollapser).
//  - Page tables: Create fills them at once, and so do the read-only opens
//    unless told kOnTouch. The arena is written and read on every token:
//    faulting its pages in one at a time made the first request after start
//    1.3-1.4x slower than the next (the daemon's copies into fresh slots
//    2.5-4.4 ms of stall against 1 ms). A read-only mapping of every expert
//    (the host copy) may ask kOnTouch: its page tables grow with the whole
//    model and only host execution reads it.
//
// Errors: INVALID_ARGUMENT (bad name, zero size, size larger than the
// object), ALREADY_EXISTS (named region exists), NOT_FOUND (no such name),
// PERMISSION_DENIED (EACCES/EPERM), RESOURCE_EXHAUSTED (ENOMEM/ENOSPC/EMFILE/
// EFBIG), INTERNAL otherwise; messages carry the name and strerror.
//
// Thread-safety: a const ShmRegion may be used from any thread; the memory
// itself is unsynchronized (the residency protocol orders access).
#ifndef MOECACHE_SERVICES_CACHE_SHM_REGION_H_
#define MOECACHE_SERVICES_CACHE_SHM_REGION_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moe::cache {

class ShmRegion {
 public:
  // When the mapping's page tables are filled: at map time, or page by page
  // on first access.
  enum class Pages { kNow, kOnTouch };

  // An empty, unmapped region.
  ShmRegion() = default;
  ~ShmRegion();

  ShmRegion(ShmRegion&& other) noexcept;
  ShmRegion& operator=(ShmRegion&& other) noexcept;
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  // Creates and maps read-write a zero-filled region of `bytes` (> 0).
  // `name`: empty for an anonymous memfd, else a shm_open name ("/x", one
  // slash, at most 255 characters).
  static absl::StatusOr<ShmRegion> Create(absl::string_view name,
                                          uint64_t bytes);

  // Maps the first `bytes` (> 0) of the object behind `fd` read-only. The fd
  // is duplicated (the caller keeps ownership of `fd`).
  // INVALID_ARGUMENT if the object is smaller than `bytes`.
  static absl::StatusOr<ShmRegion> OpenReadOnly(int fd, uint64_t bytes,
                                                Pages pages = Pages::kNow);

  // Same for a named region created by another ShmRegion.
  static absl::StatusOr<ShmRegion> OpenReadOnlyByName(
      absl::string_view name, uint64_t bytes, Pages pages = Pages::kNow);

  bool valid() const { return data_ != nullptr; }
  // REQUIRES: writable() for mutable_data().
  uint8_t* mutable_data() const { return writable_ ? data_ : nullptr; }
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool writable() const { return writable_; }
  // The descriptor (owned by this object; CLOEXEC), e.g. to pass to a worker.
  int fd() const { return fd_; }
  // The shm_open name, empty for anonymous regions.
  const std::string& name() const { return name_; }

 private:
  void Reset();

  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  int fd_ = -1;
  bool writable_ = false;
  bool unlink_on_destroy_ = false;
  std::string name_;
};

inline constexpr uint64_t kHugePageBytes = uint64_t{2} << 20;

// mmap(MAP_SHARED) of the first `bytes` of `fd` at a 2 MiB-aligned address,
// so that the kernel can map its huge pages whole (PMD entries) in every
// process; where the alignment cannot be reserved, wherever mmap puts it.
// Returns MAP_FAILED with errno set on failure.
void* MapSharedAligned(int fd, uint64_t bytes, int prot);

// Moves the whole 2 MiB pages of [start, start + bytes), a shared-memory
// mapping of ours, onto transparent huge pages (MADV_COLLAPSE: the kernel
// copies each 2 MiB into one huge page and maps it in every process that
// maps the memory, contents unchanged, even while others read and write
// it). Works whatever shmem_enabled says but `deny` (Linux 6.1 on), slowly
// (a copy: ~3 ms per MiB on the Sapphire Rapids VM). Returns the bytes
// collapsed: 0 where the kernel refused (older kernel, `deny`, no free huge
// page), and the part past the first and last 2 MiB boundaries is left.
uint64_t CollapseToHugePages(const void* start, uint64_t bytes);

// The kernel's transparent huge page setting for shared memory (the
// bracketed word of /sys/kernel/mm/transparent_hugepage/shmem_enabled:
// "never", "advise", "always", ...); empty where the file is missing.
std::string ShmemHugePageMode();

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_SHM_REGION_H_
