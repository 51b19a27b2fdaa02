#include "common/huge_page_arena.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace moe {
namespace {

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

}  // namespace

HugePageArena::HugePageArena(uint64_t block_bytes)
    : block_bytes_(RoundUp(block_bytes == 0 ? kHugePage : block_bytes, kHugePage)) {}

HugePageArena::~HugePageArena() { Release(); }

HugePageArena::HugePageArena(HugePageArena&& other) noexcept { *this = std::move(other); }

HugePageArena& HugePageArena::operator=(HugePageArena&& other) noexcept {
  if (this != &other) {
    Release();
    block_bytes_ = other.block_bytes_;
    blocks_ = std::exchange(other.blocks_, {});
    offset_ = std::exchange(other.offset_, 0);
    used_ = std::exchange(other.used_, 0);
  }
  return *this;
}

void HugePageArena::Release() {
  for (const Block& b : blocks_) ::munmap(b.base, b.size);
  blocks_.clear();
  offset_ = 0;
  used_ = 0;
}

bool HugePageArena::Holds(const void* p) const {
  const auto* b = static_cast<const uint8_t*>(p);
  for (const Block& block : blocks_) {
    if (b >= block.base && b < block.base + block.size) return true;
  }
  return false;
}

uint64_t HugePageArena::mapped_bytes() const {
  uint64_t n = 0;
  for (const Block& b : blocks_) n += b.size;
  return n;
}

absl::StatusOr<uint8_t*> HugePageArena::Allocate(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("HugePageArena: allocation of 0 bytes");
  const uint64_t align = bytes >= 4096 ? 4096 : 64;
  uint64_t at = RoundUp(offset_, align);
  if (blocks_.empty() || at > blocks_.back().size || bytes > blocks_.back().size - at) {
    // A fresh block, 2 MiB aligned: map 2 MiB more and trim both ends.
    const uint64_t size = bytes > block_bytes_ ? RoundUp(bytes, kHugePage) : block_bytes_;
    void* raw = ::mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot map ", size, " bytes of host memory for weights: ", std::strerror(errno)));
    }
    const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = RoundUp(start, kHugePage);
    if (aligned > start) ::munmap(raw, aligned - start);
    const uintptr_t end = start + size + kHugePage;
    if (end > aligned + size) ::munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
    uint8_t* base = reinterpret_cast<uint8_t*>(aligned);
    ::madvise(base, size, MADV_HUGEPAGE);  // best effort: the kernel may say no
    blocks_.push_back(Block{base, size});
    offset_ = 0;
    at = 0;
  }
  uint8_t* p = blocks_.back().base + at;
  used_ += at - offset_ + bytes;
  offset_ = at + bytes;
  return p;
}

}  // namespace moe
